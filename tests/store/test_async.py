"""Two-phase commits: capture now, persist in the background; frequency; resumable data order."""

from __future__ import annotations

import json
import math
import os
import signal
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem
from helpers import assert_bit_exact
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

import ckptstore
from ckptstore import (Frequency, PendingCommitError, Policy, ResumableLoader, ResumableSampler,
                       RNGState)
from ckptstore.policy import cpr_interval


class FlakyMemoryFS(MemoryFileSystem):
    """memory:// whose chunk writes fail while ``failing`` is set (a disk that fills up)."""

    protocol = "flaky"
    failing = False
    gate: threading.Event | None = None

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if FlakyMemoryFS.gate is not None:
            FlakyMemoryFS.gate.wait(10)
        if FlakyMemoryFS.failing and "/data/" in path:
            raise OSError(28, "No space left on device")
        return super().pipe_file(path, value, mode=mode, **kwargs)


@pytest.fixture
def flaky():
    """memory:// only: the failures are injected by a MemoryFileSystem subclass."""
    import fsspec
    fsspec.register_implementation("flaky", FlakyMemoryFS, clobber=True)
    FlakyMemoryFS.failing, FlakyMemoryFS.gate = False, None
    store = ckptstore.open(f"flaky://{uuid.uuid4().hex}")
    yield store
    FlakyMemoryFS.failing, FlakyMemoryFS.gate = False, None
    store.close()  # its threads end: tests that read thread priorities see only their own


@pytest.mark.every_backend
def test_captured_state_is_what_is_stored(store):
    w = torch.randn(300_000, 8)
    opt_state = {"m": torch.zeros(300_000, 8)}
    expected = {"w": w.clone(), "opt": {"m": opt_state["m"].clone()}, "step": 7}
    pending = store.commit_async({"w": w, "opt": opt_state, "step": 7})
    w.add_(1.0)  # training goes on at once
    opt_state["m"].fill_(3.0)
    info = pending.wait()
    assert pending.done() and info.step == 7
    assert pending.progress.written > 0 and pending.progress.total >= w.numel() * 4
    assert_bit_exact(store.checkout(info.id), expected)


@pytest.mark.every_backend
def test_staging_buffers_are_reused(store):
    w = torch.randn(200_000, 4)
    store.commit_async({"w": w}).wait()
    held = store.staging_bytes
    for _ in range(3):
        w.add_(1)
        store.commit_async({"w": w}).wait()
    assert store.staging_bytes == held == w.numel() * 4


def test_staging_holds_only_the_latest_state(store):
    store.commit_async({"w": torch.randn(1000, 8), "gone": torch.randn(5000)}).wait()
    assert store.staging_bytes == (8000 + 5000) * 4
    store.commit_async({"w": torch.randn(2000, 8)}).wait()  # w grew, "gone" left
    assert store.staging_bytes == 16000 * 4
    for n in range(3000, 3005):  # a tensor whose shape changes every commit
        store.commit_async({"w": torch.randn(n, 8)}).wait()
        assert store.staging_bytes == n * 8 * 4


def test_staging_budget_refuses_a_commit_before_copying(tmp_path):
    from ckptstore.errors import StagingBudgetError
    # the persist thread's staging buffers (a persist process maps one shared file instead)
    store = ckptstore.open(tmp_path / "s", staging_budget=100_000, background="thread")
    small = {"w": torch.randn(20_000)}  # 80 KB
    store.commit_async(small).wait()
    with pytest.raises(StagingBudgetError, match="staging_budget=100000"):
        store.commit_async({"w": torch.randn(30_000)})  # 120 KB
    assert store.staging_bytes == 80_000 and len(store.log()) == 1
    store.commit({"w": torch.randn(30_000)})  # a synchronous commit stages nothing
    store.commit_async({"w": torch.randn(30_000)}, staged=True).wait()  # nor a staged one
    assert len(store.log()) == 3
    with pytest.raises(ValueError, match="staging_budget"):
        ckptstore.open(tmp_path / "t", staging_budget=-1)


def test_staging_copies_every_dtype_and_layout_bit_exactly(store):
    from tests.store.test_roundtrip import DTYPES, _random_tensor
    state = {}
    for i, dtype in enumerate(DTYPES):
        state[str(dtype)] = {  # each its own storage: staged one by one, not as a shared span
            "c": _random_tensor(dtype, (40, 30), i),
            "t": _random_tensor(dtype, (40, 30), i + 100).t(),
            "step": _random_tensor(dtype, (40, 90), i + 200)[:, ::3],
            "0d": _random_tensor(dtype, (), i + 300)}
    state["conj"] = torch.randn(20, 3, dtype=torch.complex64).conj()
    state["neg"] = torch.randn(20, 3, dtype=torch.complex64).conj().imag
    expected = {k: ({n: t.clone() for n, t in v.items()} if isinstance(v, dict) else v.clone())
                for k, v in state.items()}
    pending = store.commit_async(state)
    for v in state.values():  # training goes on at once
        for t in (v.values() if isinstance(v, dict) else [v]):
            if t.dtype != torch.bool and not t.is_conj():
                t.add_(1)
    assert_bit_exact(store.checkout(pending.wait().id), expected)


def test_reserve_allocates_the_buffers_the_first_commit_uses(tmp_path):
    store = ckptstore.open(tmp_path / "s", background="thread")  # the thread's buffers
    state = {"w": torch.randn(200_000, 4), "b": torch.randn(3, 5, dtype=torch.bfloat16).t(),
             "small": [torch.randn(7) for _ in range(20)], "step": 3}
    reserved = store.reserve(state)
    pending = store.commit_async(state)  # waits for the reservation first
    assert reserved.done() and reserved.result() == store.staging_bytes
    info = pending.wait()
    assert store.staging_bytes == reserved.result()  # the commit allocated nothing more
    assert_bit_exact(store.checkout(info.id), state)
    assert store.reserve(state).result() == 0  # everything is there already
    grown = {**state, "w": torch.randn(300_000, 4)}  # a new shape: a buffer of its own later
    assert store.reserve(grown).result() == 300_000 * 4 * 4  # float32
    assert_bit_exact(store.checkout(store.commit_async(grown).wait().id), grown)
    store.close()


@pytest.mark.every_backend
def test_staged_snapshot_is_taken_as_is(store_url):
    url, opts = store_url
    store = ckptstore.open(url, background="thread", **opts)  # a persist process copies it
    snap = {"w": torch.randn(100_000)}
    pending = store.commit_async(snap, staged=True)
    info = pending.wait()
    assert_bit_exact(store.checkout(info.id), snap)
    assert store.staging_bytes == 0
    store.close()


def test_at_most_one_commit_in_flight(flaky):
    FlakyMemoryFS.gate = threading.Event()  # hold the first persist
    first = flaky.commit_async({"w": torch.randn(100_000)})
    assert not first.done()
    threading.Timer(0.3, FlakyMemoryFS.gate.set).start()
    second = flaky.commit_async({"w": torch.randn(100_000)})  # waits for the first
    assert first.done()
    second.wait()
    assert [c.id for c in flaky.log()] == [second.wait().id, first.wait().id]


def test_persist_error_surfaces_on_wait(flaky):
    flaky.commit({"w": torch.ones(100_000)})
    FlakyMemoryFS.failing = True
    pending = flaky.commit_async({"w": torch.zeros(100_000)})
    with pytest.raises(OSError, match="No space"):
        pending.wait()
    FlakyMemoryFS.failing = False
    assert len(flaky.log()) == 1  # the branch did not move
    flaky.commit({"w": torch.zeros(100_000)})  # observed: the next commit goes ahead


def test_unobserved_error_raises_on_next_commit_and_close(flaky):
    FlakyMemoryFS.failing = True
    pending = flaky.commit_async({"w": torch.zeros(100_000)})
    while not pending.done():
        time.sleep(0.01)
    FlakyMemoryFS.failing = False
    with pytest.raises(PendingCommitError, match="nobody called wait"):
        flaky.commit({"w": torch.zeros(10)})
    flaky.commit({"w": torch.zeros(10)})  # raised once; now it goes ahead
    FlakyMemoryFS.failing = True
    pending = flaky.commit_async({"w": torch.zeros(100_000)})
    with pytest.raises(PendingCommitError):
        flaky.close()


def test_close_waits_for_the_commit_in_flight(open_backend_store):
    with open_backend_store() as store:
        pending = store.commit_async({"w": torch.randn(500_000)})
    assert pending.done() and not pending.failed
    assert open_backend_store().log()[0].id == pending.wait().id


@pytest.mark.every_backend
def test_async_incremental_chain(store):
    store.policy = ckptstore.Policy(incremental="one-shot")
    emb = torch.randn(5000, 16)
    infos = []
    for i in range(3):
        emb[i * 10: i * 10 + 10] += 1
        infos.append((store.commit_async({"emb": emb}).wait(), emb.clone()))
    assert [store.manifest(i.id).tensors[0].kind for i, _ in infos] == ["full", "incremental",
                                                                       "incremental"]
    for info, value in infos:
        assert torch.equal(store.checkout(info.id)["emb"], value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_snapshot_is_captured(store):
    w = torch.randn(1_000_000, device="cuda")
    expected = w.cpu()
    pending = store.commit_async({"w": w})
    w.add_(1.0)  # queued after the copy on the training stream
    info = pending.wait()
    assert torch.equal(store.checkout(info.id)["w"], expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_reserve_pins_the_buffers_ahead(store):
    """The pinned host buffer and, the GPU having room, the device snapshot's buffer."""
    w = torch.randn(1_000_000, device="cuda")
    assert store.reserve({"w": w}).result() == 2 * w.numel() * 4
    assert (store.staging_bytes, store.staging_device_bytes) == (w.numel() * 4, w.numel() * 4)
    held = store.staging_bytes
    expected = w.cpu()
    info = store.commit_async({"w": w}).wait()
    assert store.staging_bytes == held
    assert torch.equal(store.checkout(info.id)["w"], expected)


def test_frequency_interval_from_overhead():
    freq = Frequency(max_overhead=0.05, warmup=3)
    due = []
    for step in range(1, 8):
        time.sleep(0.005)
        if freq.should_commit(step):
            due.append(step)
            freq.record(0.01)  # a 10 ms stall
    assert due[0] == 4  # after the warm-up
    assert 0.004 <= freq.t_iter < 0.5
    assert freq.interval == math.ceil(0.01 / (0.05 * freq.t_iter))  # stall / (overhead * t_iter)
    before = freq.interval
    freq.record(0.04)  # storage got slower: the smoothed stall and the interval grow
    assert freq.interval == math.ceil(freq.stall / (0.05 * freq.t_iter)) > before
    assert round(cpr_interval(2.0, 3600.0)) == 120
    with_mtbf = Frequency(max_overhead=0.5, mtbf=3600.0)
    with_mtbf.t_iter = 0.1
    with_mtbf.record(2.0)
    assert with_mtbf.interval == 1200  # CPR: sqrt(2 * 2 * 3600) s / 0.1 s


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 60), batch=st.integers(1, 8), stop=st.integers(0, 200),
       seed=st.integers(0, 5))
def test_sampler_resumes_mid_epoch_exactly(n, batch, stop, seed):
    """Interrupt after any number of batches: every index is seen exactly once per epoch."""
    data = TensorDataset(torch.arange(n))
    sampler = ResumableSampler(n, seed=seed)
    loader = ResumableLoader(DataLoader(data, batch_size=batch, sampler=sampler))
    seen: list[int] = []
    steps = 0
    state = None
    for epoch in range(3):
        for (x,) in loader:
            seen += x.tolist()
            steps += 1
            if steps == stop:
                state = loader.state_dict()
                break
        if state is not None:
            break
    if state is None:
        return
    resumed = ResumableLoader(DataLoader(data, batch_size=batch, sampler=ResumableSampler(n)))
    resumed.load_state_dict(state)
    for (x,) in resumed:  # finish the interrupted epoch
        seen += x.tolist()
    epochs = len(seen) // n
    assert len(seen) == epochs * n
    for e in range(epochs):
        assert sorted(seen[e * n:(e + 1) * n]) == list(range(n))
        assert seen[e * n:(e + 1) * n] == ResumableSampler(n, seed=seed).order(e).tolist()


def test_loader_with_workers_counts_what_training_received():
    data = TensorDataset(torch.arange(100))
    loader = ResumableLoader(DataLoader(data, batch_size=10, num_workers=2,
                                        sampler=ResumableSampler(100, seed=1)))
    it = iter(loader)
    first = [next(it)[0] for _ in range(3)]
    assert loader.state_dict()["position"] == 30  # workers have prefetched more than that
    resumed = ResumableLoader(DataLoader(data, batch_size=10, sampler=ResumableSampler(100)))
    resumed.load_state_dict(loader.state_dict())
    rest = [b[0] for b in resumed]
    assert sorted(torch.cat(first + rest).tolist()) == list(range(100))


@pytest.mark.every_backend
def test_rng_state_roundtrip(store):
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    store.commit({"rng": RNGState()})
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(10)
    np.random.rand(10)
    random.random()
    store.checkout("main", into={"rng": RNGState()})
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]


def test_frequency_counts_slowdown_during_persist():
    freq = Frequency(max_overhead=0.1)
    freq.t_iter, freq.t_busy = 0.010, 0.020  # iterations run twice as slow while persisting
    freq.record(0.005)
    assert freq.interval == 5  # stall only: 0.005 / (0.1 * 0.01)
    freq.persist = 0.2  # 10 slowed iterations lose 0.1 s: cost 0.105 s
    freq._update()
    assert freq.interval in (105, 106)  # 0.105 / (0.1 * 0.010), up to float rounding


def test_tracked_increments_stage_only_their_rows(tmp_path):
    """commit_async with a tracker copies only the rows the increment stores (5 % of the table
    here), not the table, into a row buffer reused and grown across commits; the commits equal
    synchronous ones."""
    rows, dim = 20_000, 32
    results = {}
    for mode in ("async", "sync"):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(rows, dim, sparse=True)
        model = torch.nn.ModuleDict({"emb": emb})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        tracker = ckptstore.track(model, opt)
        store = ckptstore.open(tmp_path / mode, policy=Policy(incremental="one-shot"),
                               background="thread")  # the thread's staging buffers
        store.commit({"model": model}, tracker=tracker)  # the baseline
        staged = []
        for step in range(3):
            idx = torch.randint(0, rows, (1000 * (step + 1),))
            emb(idx).sum().backward()
            opt.step()
            opt.zero_grad()
            if mode == "async":
                info = store.commit_async({"model": model}, tracker=tracker).wait()
                stored_rows = store.manifest(info.id).tensors[0].parts["rows"].shape[0]
                staged.append((store.staging_bytes, stored_rows * dim * 4))
            else:
                store.commit({"model": model}, tracker=tracker)
        entry = store.manifest(store.resolve("main")).tensors[0]
        assert entry.kind == "incremental"
        results[mode] = (store.checkout("main")["model"]["emb.weight"], staged,
                         entry.parts["rows"].shape)
    table = rows * dim * 4
    got, staged, shape = results["async"]
    assert torch.equal(got, results["sync"][0]) and shape == results["sync"][2]
    assert torch.equal(got, emb.weight.detach())
    # one-shot increments store the rows changed since the baseline: the buffer holds them
    # (grown by at least a quarter when it must grow), never the 2.6 MB table
    assert all(rows_bytes <= s <= 1.25 * rows_bytes + 4096 for s, rows_bytes in staged), staged
    assert all(s < table / 3 for s, _ in staged)


def thread_priorities(store: ckptstore.Store, prefix: str) -> set[tuple[int, int]]:
    """(scheduling policy, nice value) of ``store``'s background threads named ``prefix``...
    (only its own: stores other tests left open in this process keep theirs)."""
    mine = store._committer.background.thread_ids
    return {(os.sched_getscheduler(t.native_id), os.getpriority(os.PRIO_PROCESS, t.native_id))
            for t in threading.enumerate() if t.name.startswith(prefix) and t.native_id in mine}


LINUX_PRIORITIES = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"),
                                      reason="per-thread priorities are Linux-only")


@LINUX_PRIORITIES
def test_background_persist_runs_at_low_priority(tmp_path, neighbours):
    """commit_async's persist thread and the I/O threads that write its chunks run at nice +10
    by default (a fair share of a busy core), SCHED_IDLE only when asked; synchronous work keeps
    the store's normal pool; "normal" persists on that pool; a wrong value is refused before
    anything is created."""
    state = {"w": torch.randn(300, 300)}
    normal = os.getpriority(os.PRIO_PROCESS, 0)
    low = {(os.SCHED_OTHER, min(19, normal + ckptstore.priority.LOW_NICE))}
    with ckptstore.open(tmp_path / "low", background="thread") as store:
        store.commit(state)
        store.commit_async(state).wait()
        assert thread_priorities(store, "ckptstore-persist") == low
        assert thread_priorities(store, "ckptstore-bg-io") == low
        assert {(os.sched_getscheduler(t.native_id), os.getpriority(os.PRIO_PROCESS, t.native_id))
                for t in store.repo.executor._threads} == {(os.SCHED_OTHER, normal)}
    with ckptstore.open(tmp_path / "normal", background_priority="normal",
                        background="thread") as store:
        store.commit_async(state).wait()
        assert thread_priorities(store, "ckptstore-persist") == {(os.SCHED_OTHER, normal)}
        assert store._committer._background_io is None
    with ckptstore.open(tmp_path / "idle", background_priority="idle",
                        background="thread") as store:
        store.commit_async(state).wait()
        assert {p for p, _ in thread_priorities(store, "ckptstore-persist")} == {os.SCHED_IDLE}
    with pytest.raises(ValueError, match="background_priority"):
        ckptstore.open(tmp_path / "bad", background_priority="high")
    assert not (tmp_path / "bad").exists()


def raising_refused() -> bool:
    """Whether this process may not raise a thread's priority again once lowered."""
    def probe(out: list) -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + 1)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) - 1)
        except PermissionError:
            out.append(True)

    out: list = []
    t = threading.Thread(target=probe, args=(out,))
    t.start()
    t.join()
    return bool(out)


@LINUX_PRIORITIES
@pytest.mark.parametrize("level", ["low", "idle"])
def test_waiting_for_a_persist_runs_it_at_normal_priority(flaky, level, neighbours):
    """Priority inheritance: while the caller waits for the commit in flight, the persist's
    threads run at the caller's priority (busy cores cannot starve the wait), and go back to
    their low priority after."""
    if raising_refused():
        pytest.skip("this process may not raise a priority (see the unprivileged test)")
    flaky = ckptstore.open(f"flaky://{uuid.uuid4().hex}", background_priority=level)
    normal = {(os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, 0))}
    FlakyMemoryFS.gate = threading.Event()  # hold the persist
    pending = flaky.commit_async({"w": torch.randn(100_000)})
    deadline = time.monotonic() + 30  # the persist thread, started by that submit, lowers itself
    while thread_priorities(flaky, "ckptstore-persist") in (set(), normal) \
            and time.monotonic() < deadline:
        time.sleep(0.001)
    before = thread_priorities(flaky, "ckptstore-persist")
    waiter = threading.Thread(target=pending.wait)
    waiter.start()
    deadline = time.monotonic() + 30
    while thread_priorities(flaky, "ckptstore-persist") != normal and time.monotonic() < deadline:
        time.sleep(0.01)
    during = thread_priorities(flaky, "ckptstore-persist")
    FlakyMemoryFS.gate.set()
    waiter.join()
    assert before != normal and during == normal
    assert thread_priorities(flaky, "ckptstore-persist") == before  # lowered again after the wait
    assert pending.wait().id == flaky.log()[0].id
    flaky.close()


UNPRIVILEGED_SCRIPT = """
import json, os, threading, uuid
import fsspec, torch
from fsspec.implementations.memory import MemoryFileSystem
import ckptstore

class Gated(MemoryFileSystem):
    protocol = "gated"
    gate = threading.Event()
    writers = []
    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        Gated.gate.wait(30)
        Gated.writers.append(threading.current_thread().name)
        return super().pipe_file(path, value, mode=mode, **kwargs)

fsspec.register_implementation("gated", Gated, clobber=True)
Gated.gate.set()  # open while the store is made and warmed
store = ckptstore.open(f"gated://{uuid.uuid4().hex}", io_workers=2,
                       options=ckptstore.EncodingOptions(chunk_bytes=1 << 16))
store.commit_async({"w": torch.randn(100_000)})  # warm: the background pool exists
store._committer.wait()
Gated.writers.clear()
Gated.gate.clear()  # hold the next persist
pending = store.commit_async({"w": torch.randn(100_000)})
waiter = threading.Thread(target=pending.wait)
waiter.start()
background = store._committer.background
for _ in range(3000):
    if background.refused:
        break
    threading.Event().wait(0.01)
refused = background.refused
Gated.gate.set()
waiter.join()
print(json.dumps({"refused": refused, "writers": sorted(set(Gated.writers)),
                  "landed": store.log()[0].id == pending.wait().id}))
"""


@LINUX_PRIORITIES
def test_unprivileged_wait_moves_the_chunks_to_the_normal_pool():
    """Where the system refuses to raise a priority again (no CAP_SYS_NICE, ``ulimit -e`` 0),
    the chunks of a persist someone waits for are encoded and written on the store's
    normal-priority pool instead, and the commit lands."""
    command = [sys.executable, "-c", UNPRIVILEGED_SCRIPT]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: cannot drop CAP_SYS_NICE to test the refusal")
        command = ["setpriv", "--bounding-set", "-sys_nice"] + command
    elif not raising_refused():
        pytest.skip("this process may raise priorities (ulimit -e): nothing is refused")
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["refused"] and result["landed"]
    assert "ckptstore-io" in {w.rsplit("_", 1)[0] for w in result["writers"]}


def test_the_store_pool_keeps_normal_priority_when_background_threads_use_it_first(tmp_path):
    """Linux threads inherit the creator's scheduling policy: the store's I/O threads all start
    when it opens, so none is first started by an idle-priority persist thread."""
    before = {t.ident for t in threading.enumerate()}
    with ckptstore.open(tmp_path / "s", io_workers=3) as store:
        mine = [t for t in threading.enumerate()
                if t.ident not in before and t.name.startswith("ckptstore-io")]
        assert len(mine) == 3
        store.commit_async({"w": torch.randn(300, 300)}).wait()  # first use: in the background
        store.commit({"w": torch.randn(300, 300)})
        assert {os.sched_getscheduler(t.native_id) for t in mine} == {os.SCHED_OTHER}
        assert all(os.getpriority(os.PRIO_PROCESS, t.native_id) ==
                   os.getpriority(os.PRIO_PROCESS, 0) for t in mine)


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/status"), reason="reads Linux /proc")
def test_ckptstore_threads_leave_ctrl_c_to_the_main_thread(tmp_path):
    """Every thread of the store's pools blocks SIGINT, so the kernel delivers Ctrl-C to a
    thread that handles it (Python's main thread) and a wait there ends at once."""
    store = ckptstore.open(tmp_path / "s")
    store.commit_async({"w": torch.randn(300, 300)}).wait()
    store.commit({"v": torch.randn(300, 300)})

    def blocked() -> bool:
        line = next(x for x in open("/proc/thread-self/status") if x.startswith("SigBlk:"))
        return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)

    pools = [store.committer._persister, store.repo.executor]
    assert all(pool.submit(blocked).result() for pool in pools)
    assert not blocked()  # the caller's thread is left alone
    store.close()
