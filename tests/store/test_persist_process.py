"""open(..., background="process"): persists in a process of the store's own, over shared memory
(ckptstore.commit.process, ckptstore.persist_worker)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from helpers import assert_bit_exact

import ckptstore
from ckptstore import (EveryN, GradientEMA, InvalidRefName, LatestN, PendingCommitError,
                       PersistProcessError, Policy, QuantSpec, RefExists)
from ckptstore.commit import wire
from ckptstore.errors import ConcurrentUpdateError
from ckptstore.policy.bitwidth import BitWidth
from ckptstore.policy.rebase import MaxChain
from ckptstore.policy.shrink import Shrink


def _state(seed: int = 0) -> dict:
    """Tied weights, views, a channels-last tensor, bf16, an expanded tensor, an empty one,
    numpy values and plain leaves."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(3000, 64, generator=g)
    return {
        "model": {"emb": emb, "head": emb, "rows": emb[5:50], "w": torch.randn(200, 300,
                                                                               generator=g)},
        "conv": torch.randn(2, 3, 8, 8, generator=g).to(memory_format=torch.channels_last),
        "bf": torch.randn(100, generator=g).bfloat16(),
        "expanded": torch.ones(3).expand(4, 3),
        "empty": torch.empty(0, 5),
        "counts": np.arange(17, dtype=np.int32),
        "scale": np.float32(1.5),
        "step": 7, "name": "run", "blob": b"\x00\x01",
    }


def _chunk_files(root) -> list[tuple[str, str]]:
    """Every data file's path below its commit folder and its sha256 (commit ids differ)."""
    out = []
    for folder, _, files in os.walk(os.path.join(root, "data")):
        for f in files:
            path = os.path.join(folder, f)
            with open(path, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            out.append((os.path.relpath(path, root).split(os.sep, 2)[-1], digest))
    return sorted(out)


def test_a_state_round_trips_with_its_aliases_views_and_values(tmp_path):
    state = _state()
    with ckptstore.open(tmp_path / "s", background="process") as store:
        first = store.commit(state, message="first", tags=["t1"])
        assert first.metadata == {"step": 7} and first.message == "first"
        second = store.commit_async(state).wait()
        assert second.parent == first.id
        assert [c.id for c in store.log()] == [second.id, first.id]  # this process sees them
        out = store.checkout("t1")
    expanded = state.pop("expanded")
    got = out.pop("expanded")
    assert torch.equal(got, expanded)  # stored as its values
    assert_bit_exact(out, state)
    m = out["model"]
    assert m["emb"].data_ptr() == m["head"].data_ptr()  # the tie survives the process
    assert m["rows"].untyped_storage().data_ptr() == m["emb"].untyped_storage().data_ptr()
    assert out["conv"].stride() == state["conv"].stride()
    assert type(out["scale"]) is np.float32 and type(out["counts"]) is np.ndarray


@pytest.mark.parametrize("policy", [
    Policy(),
    Policy(incremental="consecutive", min_rows=100),
    Policy(quantize=QuantSpec(bits=4), delta=True),
], ids=["lossless", "incremental", "quantized-delta"])
def test_a_persist_process_writes_the_bytes_a_thread_writes(tmp_path, policy):
    """The same pipeline in the other process: every chunk file the same, chains included
    (their memory lives in the persist process)."""
    files, checked = [], []
    for background in ("thread", "process"):
        state = _state()
        emb = state["model"]["emb"]
        with ckptstore.open(tmp_path / background, policy=policy, background=background) as s:
            for i in range(3):
                emb[i * 7:i * 7 + 5] += 1.0
                s.commit(state)
            checked.append(s.checkout())
        files.append(_chunk_files(tmp_path / background))
    assert files[0] == files[1] and len(files[0]) > 5
    assert_bit_exact(checked[0], checked[1])


def test_the_snapshot_is_taken_when_commit_async_returns(tmp_path):
    state = {"w": torch.randn(512, 512)}
    before = state["w"].clone()
    with ckptstore.open(tmp_path / "s", background="process") as store:
        pending = store.commit_async(state)
        state["w"] += 1.0  # training goes on
        info = pending.wait()
        assert pending.stall_seconds > 0 and pending.progress.written == info.stored_bytes
        assert store.staging_bytes >= before.numel() * 4
        assert torch.equal(store.checkout(info.id)["w"], before)


def test_chain_memory_lives_in_the_persist_process(tmp_path):
    policy = Policy(delta=True)
    with ckptstore.open(tmp_path / "s", policy=policy, background="process") as store:
        assert store.reference_bytes == (0, 0)
        state = {"w": torch.randn(256, 256)}
        store.commit(state)
        assert store.reference_bytes[0] >= 256 * 256 * 4  # the XOR reference, over there
        store.checkout(into=state)  # a load in place forgets them, there too
        assert store.reference_bytes == (0, 0)


def test_a_killed_persist_process_fails_its_commit_and_the_next_starts_another(tmp_path):
    state = {"w": torch.randn(64, 64)}
    with ckptstore.open(tmp_path / "s", background="process") as store:
        first = store.commit(state)
        worker = store.committer._worker
        os.kill(worker.proc.pid, signal.SIGSTOP)  # the next commit's frame waits in the pipe
        pending = store.commit_async(state)
        os.kill(worker.proc.pid, signal.SIGKILL)
        with pytest.raises(PersistProcessError, match="persist process ended"):
            pending.wait()
        assert store.resolve("main") == first.id  # nothing was published
        again = store.commit(state)
        assert again.parent == first.id and store.committer._worker.proc.pid != worker.proc.pid


def test_a_persist_process_ends_with_its_store(tmp_path):
    store = ckptstore.open(tmp_path / "s", background="process")
    store.commit({"w": torch.randn(8)})
    proc = store.committer._worker.proc
    assert not os.path.exists(store.committer._worker.mapped.path)  # unlinked once mapped
    store.close()
    assert proc.poll() == 0


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Popen(process_group=) is Python 3.11+")
def test_the_persist_process_is_in_training_s_session_in_a_group_of_its_own(tmp_path):
    """Linux shares the CPU between sessions first: in a session of its own the persist
    process was not scheduled as training's background work is (child.py's OWN_GROUP)."""
    with ckptstore.open(tmp_path / "s", background="process") as store:
        store.commit({"w": torch.randn(8)})
        pid = store.committer._worker.proc.pid
        assert os.getsid(pid) == os.getsid(0)
        assert os.getpgid(pid) == pid != os.getpgid(0)  # a terminal's Ctrl-C: not its group
        assert set(store.committer.call_stats()) == {"boosted", "starved", "storage"}


def test_a_process_forked_since_does_not_keep_the_persist_process_alive(tmp_path):
    """A DataLoader worker forked after the persist process started holds a copy of its pipe:
    the store's close still ends it at once (an end frame, not only the pipe's end)."""
    store = ckptstore.open(tmp_path / "s", background="process")
    store.commit({"w": torch.randn(8)})
    proc = store.committer._worker.proc
    child = os.fork()
    if child == 0:  # the forked worker: holds every descriptor a while, then leaves
        time.sleep(30)
        os._exit(0)
    try:
        t0 = time.monotonic()
        store.close()
        assert proc.poll() == 0 and time.monotonic() - t0 < 20
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_persist_process_outlives_no_training_process(tmp_path):
    """A store left open when its process dies: the persist process sees its pipe close and
    ends (after the commit in flight)."""
    script = textwrap.dedent(f"""
        import os, torch, ckptstore
        store = ckptstore.open({str(tmp_path / "s")!r}, background="process")
        store.commit({{"w": torch.randn(8)}})
        print(store.committer._worker.proc.pid, flush=True)
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{pid}/stat") as f:  # reparented: a zombie of init counts as gone
            if f.read().split(") ")[-1].startswith("Z"):
                break
        time.sleep(0.1)
    else:
        pytest.fail(f"persist process {pid} still runs after its store's process ended")
    with ckptstore.open(tmp_path / "s") as store:
        assert len(store.log()) == 1


def test_names_are_checked_before_anything_is_copied(tmp_path):
    with ckptstore.open(tmp_path / "s", background="process") as store:
        store.commit({"w": torch.randn(8)}, tags=["v1"])
        with pytest.raises(InvalidRefName):
            store.commit_async({"w": torch.randn(8)}, branch="a..b")
        with pytest.raises(RefExists):
            store.commit_async({"w": torch.randn(8)}, tags=["v1"])
        assert len(store.log()) == 1


def test_what_a_persist_process_cannot_take_is_refused(tmp_path):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(PersistProcessError, match="GradientEMA"):
        ckptstore.open(tmp_path / "a", background="process",
                       policy=Policy(quantize=QuantSpec(bits=4, protect=0.01),
                                     sensitivity=GradientEMA(model)))
    with pytest.raises(ValueError, match="memory://"):
        ckptstore.open("memory://ckpt-process", background="process")
    with pytest.raises(ValueError, match="memory://"):  # a tiered store over it too
        ckptstore.open("memory://ckpt-process-tier", background="process",
                       local=tmp_path / "local")
    with pytest.raises(ValueError, match="background"):
        ckptstore.open(tmp_path / "c", background="fork")
    with ckptstore.open(tmp_path / "d", background="process") as store:
        with pytest.raises(PersistProcessError, match="GradientEMA"):
            store.commit(model, policy=Policy(quantize=QuantSpec(bits=4, protect=0.01),
                                              sensitivity=GradientEMA(model)))
        assert store.branches() == {}
    assert issubclass(PersistProcessError, PendingCommitError)


def test_reserve_resolves_to_the_bytes_it_mapped(tmp_path):
    state = {"w": torch.randn(256, 256)}
    with ckptstore.open(tmp_path / "s", background="process") as store:
        assert store.reserve(state).result() >= 256 * 256 * 4  # a new shared file
        assert store.reserve(state).result() == 0  # it fits: nothing new
        assert torch.equal(store.checkout(store.commit_async(state).wait().id)["w"], state["w"])


def test_a_staging_budget_bounds_the_shared_snapshot(tmp_path):
    with ckptstore.open(tmp_path / "s", background="process", staging_budget=1000) as store:
        with pytest.raises(ckptstore.StagingBudgetError):
            store.commit_async({"w": torch.randn(1000)})
        store.commit({"w": torch.randn(10)})


def test_retention_and_options_reach_the_persist_process(tmp_path):
    options = ckptstore.EncodingOptions(compression="none")
    with ckptstore.open(tmp_path / "s", background="process", keep=LatestN(2),
                        options=options) as store:
        for i in range(4):
            store.commit({"w": torch.full((1000,), float(i))})
        assert len(store.log()) == 2  # the persist process applied keep=
        info = store.log()[0]
        assert info.stored_bytes >= 4000  # raw bits: nothing compressed


@pytest.mark.s3
def test_a_persist_process_commits_to_s3(s3_server):
    url = f"s3://ckpt-tests/process-{os.getpid()}-{time.monotonic_ns()}"
    state = {"w": torch.randn(300, 300), "step": 1}
    with ckptstore.open(url, background="process", **s3_server) as store:
        info = store.commit(state)
        assert_bit_exact(store.checkout(info.id), state)


# -- the wire ---------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [
    ckptstore.EncodingOptions(pack_below=4096, dedup=True),
    Policy(incremental="intermittent", quantize=QuantSpec(bits=4), max_chain=5,
           overrides=(("opt.*", None), ("emb.*", QuantSpec(bits=8))), lossless=("bias",)),
    Policy(incremental="intermittent", rebase=MaxChain(3), quantize=QuantSpec(bits=4),
           bitwidth=BitWidth(expected_restores=3)),
    Policy(shrink=Shrink(pairs=(("w", "m", "v"),))),
    LatestN(3) | EveryN(100, key="step"),
    ckptstore.Retry(attempts=2),
], ids=lambda c: type(c).__name__)
def test_configurations_cross_as_plain_data(config):
    import msgpack
    plain = msgpack.unpackb(msgpack.packb(wire.to_plain(config)), strict_map_key=False)
    assert wire.from_plain(plain) == config


def test_other_objects_and_forged_data_are_refused():
    with pytest.raises(PersistProcessError, match="object"):
        wire.to_plain(object(), "policy")
    for forged in ({"type": "os.system", "fields": {}}, {"type": "Policy", "fields": [1]},
                   {"tuple": 5}, [1, 2]):
        with pytest.raises(PersistProcessError):
            wire.from_plain(forged)


def test_errors_cross_by_name():
    back = wire.error_from_plain(wire.error_to_plain(
        ConcurrentUpdateError("moved", commit_id="abc", branch="main")))
    assert type(back) is ConcurrentUpdateError and str(back) == "moved"
    assert (back.commit_id, back.branch) == ("abc", "main")  # what recovery needs
    full = wire.error_from_plain(wire.error_to_plain(ckptstore.StorageFullError(
        "full", key="data/x", errno=28)))
    assert type(full) is ckptstore.StorageFullError and (full.key, full.errno) == ("data/x", 28)
    assert type(wire.error_from_plain(wire.error_to_plain(ValueError("v")))) is ValueError
    odd = wire.error_from_plain({"type": "ZeroDivisionError", "message": "x"})
    assert isinstance(odd, PersistProcessError) and "ZeroDivisionError: x" in str(odd)
    assert isinstance(wire.error_from_plain("junk"), PersistProcessError)


def test_frames_cross_a_pipe_and_a_closed_pipe_is_eof():
    r, w = os.pipe()
    try:
        wire.write_frame(w, {"op": "x", "blob": b"\x00" * 10, "n": [1, 2.5, None]})
        assert wire.read_frame(r) == {"op": "x", "blob": b"\x00" * 10, "n": [1, 2.5, None]}
        os.close(w)
        w = -1
        with pytest.raises(EOFError):
            wire.read_frame(r)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_a_part_planned_outside_the_collective_paths_is_refused_beside_a_persist_process(
        tmp_path):
    """A rank's part forked here would use a chain memory the persist process holds: refused
    (the collective paths send parts there, ``test_parts_in_process.py``)."""
    with ckptstore.open(tmp_path / "s", background="process") as store:
        with pytest.raises(TypeError, match="outside the collective paths"):
            store.committer.fork(0, [], Policy(), "main", None, None, "", "_packed",
                                 lambda path: (path, (), ()))


def test_a_wait_raises_the_persist_in_the_other_process(tmp_path):
    """Priority inheritance across the process boundary: wait() asks the persist process to
    run the commit in flight at normal priority (it was asked before it read the commit)."""
    import threading
    with ckptstore.open(tmp_path / "s", background="process") as store:
        state = {"w": torch.randn(1 << 20)}
        store.commit(state)  # the shared file is made and mapped: the next commit reuses it
        worker = store.committer._worker
        before = store.committer.call_stats()["boosted"]  # a commit() waits: raised too
        os.kill(worker.proc.pid, signal.SIGSTOP)
        pending = store.commit_async(state)
        waiter = threading.Thread(target=pending.wait)
        waiter.start()
        time.sleep(0.3)  # the wait has signalled the stopped process
        os.kill(worker.proc.pid, signal.SIGCONT)
        waiter.join(60)
        os.kill(worker.proc.pid, signal.SIGCONT)  # never left stopped, whatever failed
        assert pending.done() and store.committer.call_stats()["boosted"] == before + 1



def test_the_storage_switches_reach_the_persist_process_with_each_commit(tmp_path):
    """``store.storage.batch_sync`` and its siblings, set after opening: the persist process's
    storage takes them with the next commit, and again when they change (a tiered store's:
    its local tier's); a switch its storage does not have is refused there."""
    from ckptstore.storage.local import LocalStorage

    with ckptstore.open(tmp_path / "s", background="process") as store:
        state = {"w": torch.randn(4096)}
        store.commit(state)
        assert store.committer.call_stats()["storage"] == store.storage.tunables()
        store.storage.batch_sync, store.storage.direct_writes = False, False
        store.commit(state)
        got = store.committer.call_stats()["storage"]
        assert got == {"keep_written": False, "direct_writes": False, "batch_sync": False}
        store.storage.batch_sync = True
        store.commit_async(state).wait()
        assert store.committer.call_stats()["storage"]["batch_sync"] is True
        assert_bit_exact(store.checkout("main"), state)
    with ckptstore.open(tmp_path / "r", local=tmp_path / "l", background="process") as store:
        store.storage.local.batch_sync = False  # a tiered store: its local tier's switches
        store.commit(state)
        assert store.committer.call_stats()["storage"] == {
            "keep_written": True, "direct_writes": True, "batch_sync": False}
    storage = LocalStorage(tmp_path / "t")
    before = storage.tunables()
    for bad in ({"direct_writes": not before["direct_writes"], "fsync_everything": True},
                {"batch_sync": "yes"}):
        with pytest.raises(ValueError, match="has no switches"):
            storage.tune(bad)
    assert storage.tunables() == before  # refused whole: not one set


def _recsys(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(5000, 16, sparse=True),
                                 "head": torch.nn.Linear(16, 1)})
    return model, torch.optim.Adagrad(model.parameters(), lr=0.1)


def _train(model, opt, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, 5000, (64,), generator=g)
        loss = model["head"](model["emb"](idx)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_a_row_tracker_sends_its_rows_and_only_they_are_copied(tmp_path):
    """Check-N-Run's tracked increments through a persist process: the same chunk bytes as the
    thread's, and each commit after the first copies only the touched rows of the tracked table
    and its Adagrad state (the rest of their regions already hold them)."""
    policy = Policy(incremental="intermittent")
    files, outs = [], []
    for background in ("thread", "process"):
        model, opt = _recsys()
        with ckptstore.open(tmp_path / background, policy=policy, background=background) as s, \
                ckptstore.track(model, opt) as tracker:
            for step in range(4):
                _train(model, opt, 3, seed=step)
                s.commit({"model": model, "opt": opt}, tracker=tracker)
            if background == "process":
                assert s.committer._copied  # the regions hold copies: next, rows alone
            outs.append(s.checkout())
            live = {"model": model.state_dict(), "opt": opt.state_dict()}
            assert_bit_exact(outs[-1]["model"], live["model"])  # never a stale row
        files.append(_chunk_files(tmp_path / background))
    assert files[0] == files[1]
    assert_bit_exact(outs[0], outs[1])


def test_a_load_in_place_makes_the_next_copy_whole(tmp_path):
    """Loaded values change the live tables behind the tracker: the next snapshot copies them
    whole, so the persist process never commits a stale row."""
    model, opt = _recsys()
    with ckptstore.open(tmp_path / "s", policy=Policy(incremental="consecutive"),
                        background="process") as store, ckptstore.track(model, opt) as tracker:
        _train(model, opt, 2, seed=0)
        first = store.commit({"model": model, "opt": opt}, tracker=tracker)
        _train(model, opt, 2, seed=1)
        store.commit({"model": model, "opt": opt}, tracker=tracker)
        store.checkout(first.id, into={"model": model, "opt": opt})
        assert store.committer._copied == {}
        _train(model, opt, 1, seed=2)
        third = store.commit({"model": model, "opt": opt}, tracker=tracker)
        assert_bit_exact(store.checkout(third.id)["model"], model.state_dict())


def test_only_the_touched_rows_of_a_tracked_region_are_copied():
    from ckptstore.commit.shared import copy_in, layout, partial_rows
    from ckptstore.state.tree import Leaf
    table, tied = torch.arange(40.0).view(10, 4), torch.zeros(3)
    leaves = [Leaf("table", table), Leaf("a", tied), Leaf("b", tied)]
    shape, copies = layout(leaves)
    memory = torch.full((shape.nbytes,), 0xFF, dtype=torch.uint8)
    rows = {0: torch.tensor([2, 7]), 1: torch.tensor([0])}
    # only leaf 0: leaf 1 shares its storage's span with leaf 2; nothing copied before
    assert partial_rows(copies, rows, same=set()) == {}
    picked = partial_rows(copies, rows, same={0, 1, 2})
    assert list(picked) == [0]
    copy_in(shape, copies, memory, picked)
    start, nbytes = shape.groups[shape.slots[0][6]]
    got = memory[start:start + nbytes].view(torch.float32).view(10, 4)
    assert torch.equal(got[[2, 7]], table[[2, 7]])
    assert torch.isnan(got[[0, 1, 3]]).all()  # 0xFF bytes: left as they were


def _strided_state() -> dict:
    g = torch.Generator().manual_seed(3)
    base, y = torch.randn(64, 64, generator=g), torch.randn(4, generator=g)
    x = torch.randn(5, dtype=torch.complex64, generator=g)
    return {"cols": base[:, ::3], "t": base.t(), "col": torch.randn(32, 32, generator=g)[:, 0],
            "first": base[0], "last": base[-1], "y": y, "spread": y.expand(3, 4),
            "f": np.asfortranarray(np.arange(12.0).reshape(3, 4)), "x": x, "xc": x.conj(),
            "z": base[1], "zn": base[1]._neg_view()}


def test_views_strides_and_lazy_views_are_stored_as_a_thread_stores_them(tmp_path):
    """Views sharing a storage keep the span between them (copied once), a strided view alone
    only its values, numpy keeps its order, conjugate and negative views their values."""
    files, outs = [], []
    for background in ("thread", "process"):
        with ckptstore.open(tmp_path / background, background=background) as store:
            store.commit(_strided_state())
            outs.append(store.checkout())
        files.append(_chunk_files(tmp_path / background))
    assert files[0] == files[1]
    for k, want in _strided_state().items():
        a, b = outs[0][k], outs[1][k]
        if isinstance(want, torch.Tensor):
            want = want.resolve_conj().resolve_neg()
            assert torch.equal(b, want) and a.stride() == b.stride(), k
        else:
            assert a.strides == b.strides == want.strides and np.array_equal(b, want), k


def test_the_working_folder_is_not_the_persist_process_s_import_path(tmp_path, monkeypatch):
    """A training script's folder may hold modules named like the library's (a `ckptstore`
    checkout, a `numpy.py`): the persist process imports the store's own."""
    fake = tmp_path / "cwd" / "ckptstore"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the working folder was imported')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    with ckptstore.open(tmp_path / "s", background="process") as store:
        store.commit({"w": torch.randn(8)})
        store.close()
        store.close()  # twice: nothing more to do
