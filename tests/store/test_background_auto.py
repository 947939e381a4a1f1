"""open(..., background="auto"), the default: commit_async persists in a persist process where one
can take the commits, on a thread where it cannot (ckptstore.commit.auto)."""

from __future__ import annotations

import os
import signal
from concurrent import futures
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from helpers import assert_bit_exact

import ckptstore
from ckptstore import EncodingOptions, GradientEMA, Policy, QuantSpec
from ckptstore.commit import auto, child, process
from ckptstore.commit.auto import AutoCommitter, PersistProcessWarning
from ckptstore.commit.committer import Committer
from ckptstore.errors import RefNotFound


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(2000, 32, generator=g), "w": torch.randn(64, 64, generator=g),
            "step": seed}


def _entry_kinds(store: ckptstore.Store, commit_id: str) -> dict[str, str]:
    return {e.path: str(e.kind.value) for e in store.manifest(commit_id).tensors}


def _in_process(store: ckptstore.Store) -> None:
    """The store moved to its persist process (reserve() waits for the process to start)."""
    store.reserve(_state()).result()
    assert store.committer.way == "process"


def test_the_default_commits_on_a_thread_until_its_persist_process_runs(tmp_path):
    """The first commit_async starts the process in the background and persists on the
    thread (its stall is the thread's, not the start's); once the process runs, the next commit
    moves there, and every one after it."""
    with ckptstore.open(tmp_path / "s") as store:
        committer = store.committer
        assert isinstance(committer, AutoCommitter) and committer.way == "thread"
        first = store.commit(_state(0))
        assert committer.way == "thread" and committer._worker is None  # no process started
        pending = store.commit_async(_state(1))
        assert committer.way == "thread" and committer._starting is not None
        second = pending.wait()
        assert committer.staging_nbytes > 0  # the thread's staging buffers
        committer._starting.result()  # the process runs
        third = store.commit(_state(2))
        assert committer.way == "process" and committer._worker.alive()
        assert committer.staging.nbytes == 0  # the thread's buffers are given back
        fourth = store.commit_async(_state(3)).wait()
        assert committer.way == "process"
        assert [c.id for c in store.log()] == [fourth.id, third.id, second.id, first.id]
        for info, seed in ((first, 0), (second, 1), (third, 2), (fourth, 3)):
            assert_bit_exact(store.checkout(info.id), _state(seed))


def test_a_store_closed_while_its_process_starts_ends_it(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    info = store.commit_async(_state()).wait()
    starting = store.committer._starting
    store.close()  # killed if it still starts: nothing was sent to it
    assert starting.done() and store.committer.booting.poll() is not None
    with ckptstore.open(tmp_path / "s", background="thread") as again:
        assert_bit_exact(again.checkout(info.id), _state())


def test_a_start_that_does_not_end_does_not_hold_close(tmp_path, monkeypatch):
    """A persist process whose open does not answer (an endpoint that never replies; here a
    boot that sleeps) is killed by close(), not waited for: commits stayed on the thread."""
    monkeypatch.setattr(child, "BOOT", "import time; time.sleep(600); " + child.BOOT)
    store = ckptstore.open(tmp_path / "s")
    info = store.commit_async(_state()).wait()
    starting = store.committer._starting
    futures.wait([starting], timeout=0.5)
    assert not starting.done()
    t0 = time.monotonic()
    store.close()
    assert time.monotonic() - t0 < 60  # not the 600 s the boot sleeps
    assert starting.done() and store.committer.booting.poll() is not None
    with ckptstore.open(tmp_path / "s", background="thread") as again:
        assert_bit_exact(again.checkout(info.id), _state())


def test_auto_writes_the_bytes_a_thread_writes(tmp_path):
    """All commits asynchronous from the first: one chain, the thread's bytes, increments
    included (their memory in the persist process)."""
    policy = Policy(incremental="consecutive", delta=True)
    kinds = []
    for background in ("thread", "auto"):
        state = _state()
        with ckptstore.open(tmp_path / background, policy=policy, background=background) as s:
            if background == "auto":
                _in_process(s)
            ids = []
            for i in range(3):
                state["emb"][i * 7:i * 7 + 5] += 1.0
                ids.append(s.commit_async(state).wait().id)
            assert_bit_exact(s.checkout(), state)
            kinds.append([_entry_kinds(s, i) for i in ids])
    assert kinds[0] == kinds[1]
    assert any(k != "full" for k in kinds[0][-1].values())  # a chain, not only baselines


def test_a_change_of_way_starts_the_chains_anew(tmp_path):
    policy = Policy(delta=True)
    with ckptstore.open(tmp_path / "s", policy=policy) as store:
        state = _state()
        store.commit(state)  # a thread's commit: a baseline
        state["w"] += 1.0
        assert any(k != "full" for k in _entry_kinds(store, store.commit(state).id).values())
        state["w"] += 1.0
        # the first commit_async persists on the thread (its chain goes on) while the process
        # starts in the background
        started = store.commit_async(state).wait()
        assert any(k != "full" for k in _entry_kinds(store, started.id).values())
        store.committer._starting.result()
        state["w"] += 1.0
        switched = store.commit_async(state).wait()  # the process: its chains start here
        assert store.committer.way == "process"
        assert set(_entry_kinds(store, switched.id).values()) == {"full"}
        assert store.committer.reference_bytes()[0] > 0  # its references, over there
        state["w"] += 1.0
        assert any(k != "full" for k in _entry_kinds(store, store.commit(state).id).values())
        assert_bit_exact(store.checkout(), state)


def test_a_policy_the_process_cannot_take_moves_the_store_to_a_thread(tmp_path):
    model = torch.nn.Linear(4, 4)
    odd = Policy(quantize=QuantSpec(bits=4, protect=0.01), sensitivity=GradientEMA(model))
    with ckptstore.open(tmp_path / "s") as store:
        _in_process(store)
        store.commit_async(_state(0)).wait()
        worker = store.committer._worker
        assert store.committer.way == "process"
        store.commit_async(model, policy=odd).wait()
        assert store.committer.way == "thread" and store.committer.thread_for_good
        assert store.committer._worker is None and worker.proc.poll() is not None
        info = store.commit_async(_state(1)).wait()  # a thread for good
        assert store.committer.way == "thread"
        assert_bit_exact(store.checkout(info.id), _state(1))
        assert len(store.log()) == 3


def test_a_commit_the_process_cannot_take_while_it_starts_ends_it(tmp_path):
    model = torch.nn.Linear(4, 4)
    odd = Policy(quantize=QuantSpec(bits=4, protect=0.01), sensitivity=GradientEMA(model))
    with ckptstore.open(tmp_path / "s") as store:
        store.commit_async(_state(0)).wait()  # the process starts in the background
        starting = store.committer._starting
        store.commit_async(model, policy=odd).wait()
        assert store.committer.way == "thread" and store.committer.thread_for_good
        worker = starting.result()
        store.committer._exchange.submit(lambda: None).result()  # the end queued after it
        assert store.committer._worker is None and worker.proc.poll() is not None
        info = store.commit_async(_state(1)).wait()
        assert_bit_exact(store.checkout(info.id), _state(1))


@pytest.mark.parametrize("how", ["memory", "tiered over memory", "device_encode", "policy",
                                 "s3 client", "budget"])
def test_stores_a_process_cannot_take_get_a_thread(tmp_path, how, request):
    model = torch.nn.Linear(4, 4)
    opening = {
        "memory": lambda: ckptstore.open("memory://ckpt-auto-thread"),
        # the persist process would open a memory:// remote of its own
        "tiered over memory": lambda: ckptstore.open(f"memory://ckpt-auto-{tmp_path.name}",
                                                     local=tmp_path / "local"),
        "device_encode": lambda: ckptstore.open(
            tmp_path / "d", options=EncodingOptions(device_encode="always")),
        "policy": lambda: ckptstore.open(tmp_path / "p", policy=Policy(
            quantize=QuantSpec(bits=4, protect=0.01), sensitivity=GradientEMA(model))),
        # storage options a process cannot receive (the client's session object)
        "s3 client": lambda: ckptstore.open(
            f"s3://ckpt-tests/auto-{tmp_path.name}",
            **_with_session(request.getfixturevalue("s3_server"))),
        # a process needs a shared copy of every commit: commit() and staged=True ones too
        "budget": lambda: ckptstore.open(tmp_path / "b", staging_budget=1 << 20),
    }
    with opening[how]() as store:
        assert type(store.committer) is Committer


def _with_session(options: dict) -> dict:
    from aiobotocore.session import AioSession

    return {**options, "session": AioSession()}


@pytest.mark.s3
def test_an_object_store_persists_in_a_process(s3_server, tmp_path):
    """An S3 store's commit_async persists in a persist process too (its uploads off
    training's interpreter); training's store and an independent client see every commit."""
    url = f"s3://ckpt-tests/auto-process-{tmp_path.name}"
    with ckptstore.open(url, **s3_server) as store:
        assert isinstance(store.committer, AutoCommitter)
        first = store.commit(_state(0))  # the caller's thread
        assert store.committer.way == "thread" and store.committer._worker is None
        second = store.commit_async(_state(1)).wait()  # the thread; the process starts
        store.committer._starting.result()
        store.tag("v1", second.id)  # a ref written by training's process meanwhile
        third = store.commit_async(_state(2), tags=["v2"]).wait()
        assert store.committer.way == "process" and store.committer._worker.alive()
        assert [c.id for c in store.log()] == [third.id, second.id, first.id]
        assert_bit_exact(store.checkout("v1"), _state(1))
        with ckptstore.open(url, create=False, background="thread", **s3_server) as other:
            assert [c.id for c in other.log()] == [third.id, second.id, first.id]
            assert_bit_exact(other.checkout("v2"), _state(2))
        fourth = store.commit_async(_state(3)).wait()  # after the other client's reads
        assert store.log()[0].id == fourth.id
    with ckptstore.open(url, create=False, background="thread", **s3_server) as reopened:
        for info, seed in ((first, 0), (second, 1), (third, 2), (fourth, 3)):
            assert_bit_exact(reopened.checkout(info.id), _state(seed))


@pytest.mark.s3
def test_a_caching_url_keeps_a_thread(s3_server, tmp_path):
    """simplecache::s3://... keeps what it read in training's process: a persist process's
    commits would be invisible to it (its log stale), so auto keeps the thread."""
    url = f"simplecache::s3://ckpt-tests/auto-cached-{tmp_path.name}"
    with ckptstore.open(url, s3=s3_server) as store:
        assert type(store.committer) is Committer
        for seed in range(3):
            info = store.commit_async(_state(seed)).wait()
            assert store.log()[0].id == info.id
    with pytest.raises(ValueError, match="caching URL"):
        ckptstore.open(url, s3=s3_server, background="process")


@pytest.mark.s3
def test_fsspec_config_set_in_code_reaches_the_persist_process(s3_server, tmp_path,
                                                               monkeypatch):
    """Options set in training's code (fsspec.config.conf, as for a MinIO endpoint) reach the
    persist process with the filesystem's own: it commits where training reads."""
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3_server))
    url = f"s3://ckpt-tests/auto-conf-{tmp_path.name}"
    with ckptstore.open(url) as store:
        assert store.committer.spec.kwargs["client_kwargs"] == s3_server["client_kwargs"]
        store.reserve(_state()).result()
        info = store.commit_async(_state(1)).wait()
        assert store.committer.way == "process" and store.log()[0].id == info.id
        assert_bit_exact(store.checkout(), _state(1))


def test_a_local_store_goes_by_its_absolute_root(tmp_path, monkeypatch):
    """A relative path, file:// URL or ~ is resolved as training's process resolved it when it
    opened the store: a later change of working folder sends no commit elsewhere."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for url, root in (("st", tmp_path / "a" / "st"), ("file://fst", tmp_path / "a" / "fst"),
                      ("~/hst", tmp_path / "home" / "hst")):
        ckptstore.open(tmp_path / "b" / os.path.basename(str(root))).close()  # a decoy there
        with ckptstore.open(url) as store:
            assert store.committer.spec.url == str(root)
            monkeypatch.chdir(tmp_path / "b")
            store.reserve(_state()).result()
            infos = [store.commit_async(_state(seed)).wait() for seed in range(2)]
            assert store.committer.way == "process"
            assert [c.id for c in store.log()] == [i.id for i in reversed(infos)]
            monkeypatch.chdir(tmp_path / "a")
        with ckptstore.open(root, create=False) as again:
            assert_bit_exact(again.checkout(), _state(1))
        with ckptstore.open(tmp_path / "b" / root.name, create=False) as decoy:
            with pytest.raises(RefNotFound):  # no commit went there
                decoy.log()


@pytest.mark.parametrize("error", [OSError(24, "Too many open files"),
                                   ValueError("an open that failed over there")])
def test_a_process_that_cannot_start_leaves_a_thread(tmp_path, monkeypatch, error):
    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(process._Worker, "__init__", refuse)
    with ckptstore.open(tmp_path / "s") as store:
        # the first persists on the thread while the start fails; the failure is told once the
        # start ended (the first call or the next)
        with pytest.warns(PersistProcessWarning, match=str(error.args[-1])) as told:
            first = store.commit_async(_state()).wait()
            futures.wait([store.committer._starting])
            info = store.commit_async(_state(1)).wait()
            store.commit_async(_state(2)).wait()  # no second try, no second warning
        assert len([w for w in told if w.category is PersistProcessWarning]) == 1
        assert store.committer.way == "thread" and store.committer.thread_for_good
        assert_bit_exact(store.checkout(first.id), _state())
        assert_bit_exact(store.checkout(info.id), _state(1))


def test_tensors_off_the_cpu_stay_on_a_thread():
    assert auto._on_cpu({"a": torch.zeros(3), "b": [1, "x"]})
    assert not auto._on_cpu({"a": torch.zeros(3), "b": torch.empty(2, device="meta")})


def test_a_collective_commit_moves_the_store_to_a_thread(tmp_path):
    with ckptstore.open(tmp_path / "s") as store:
        _in_process(store)
        store.commit_async(_state()).wait()
        store.committer.fork(0, [], Policy(), "main", None, None, "", "_packed",
                             lambda path: (path, (), ()))  # a rank's part: an empty one
        assert store.committer.way == "thread" and store.committer._worker is None


@pytest.mark.parametrize("collective", [True, False])
def test_a_store_under_a_process_group_takes_a_persist_process(tmp_path, monkeypatch,
                                                               collective):
    """Under a process group a collective store's ranks send their parts to their persist
    processes (``parts_in_process``), as a store of one rank sends its commits."""
    monkeypatch.setattr(auto, "process_group", lambda: True)
    with ckptstore.open(tmp_path / "s", collective=collective) as store:
        store.reserve(_state()).result()
        assert store.committer.way == "process" and store.committer._worker is not None
        assert store.committer.parts_in_process(_state(), Policy(), None, asynchronous=False)


def test_a_tiered_collective_store_under_a_process_group_keeps_a_thread(tmp_path,
                                                                         monkeypatch):
    """Each rank of a tiered store journals its parts: its commits stay on a thread."""
    monkeypatch.setattr(auto, "process_group", lambda: True)
    with ckptstore.open(tmp_path / "remote", local=tmp_path / "local") as store:
        store.reserve(_state()).result()
        assert store.committer.way == "thread" and store.committer._worker is None
        assert not store.committer.parts_in_process(_state(), Policy(), None, True)


def test_a_tracked_part_moves_the_store_to_a_thread(tmp_path):
    """A row tracker stays in training's process: a part it sees runs on a thread, for
    good."""
    with ckptstore.open(tmp_path / "s") as store:
        _in_process(store)
        tracker = ckptstore.track(torch.nn.Embedding(4, 2))
        assert not store.committer.parts_in_process(_state(), Policy(), tracker, False)
        assert store.committer.way == "thread" and store.committer.thread_for_good


def test_a_persist_process_that_died_is_replaced_whatever_sigpipe_does(tmp_path):
    """A training script that sets SIGPIPE to its default (as many CLIs do): the end frame to a
    dead persist process must not kill training; the next commit starts another."""
    script = textwrap.dedent(f"""
        import os, signal, time, torch, ckptstore
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        store = ckptstore.open({str(tmp_path / "s")!r})
        store.reserve({{"w": torch.randn(64)}}).result()
        store.commit_async({{"w": torch.randn(64)}}).wait()
        proc = store.committer._worker.proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        info = store.commit_async({{"w": torch.ones(64)}}).wait()
        assert torch.equal(store.checkout(info.id)["w"], torch.ones(64))
        store.close()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_persist_process_ignores_sigttou(tmp_path):
    """In a background process group of the terminal's session, a write to a terminal set to
    tostop would stop it: SIGTTOU is ignored before anything runs there."""
    with ckptstore.open(tmp_path / "s") as store:
        _in_process(store)
        with open(f"/proc/{store.committer._worker.proc.pid}/status") as f:
            ignored = int(next(line.split()[1] for line in f if line.startswith("SigIgn")), 16)
        assert ignored >> (signal.SIGTTOU - 1) & 1
