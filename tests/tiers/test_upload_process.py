"""A tiered store's upload process (ckptstore.tiers.offload): each commit is copied to the remote
by a process of the store's own, off training's interpreter; everything else stays."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

import ckptstore
from ckptstore.tiers import offload
from ckptstore.tiers.offload import UploadProcessWarning

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks"))
import upload_child  # noqa: E402
from upload_child import slow_uploads  # noqa: E402


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"a": torch.randn(256, 64, generator=g), "b": torch.randn(300, generator=g)}


def same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def remote_log(remote) -> list[str]:
    with ckptstore.open(remote, create=False, background="thread") as other:
        return [c.id for c in other.log()] if other.branches() else []


def test_commits_upload_from_a_process_of_the_store_s_own(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptstore.open(remote, local=local) as store:
        ids = [store.commit(state(i)).id for i in range(3)]
        store.push()
        up = store.tiers.uploader.offload
        pid = up.child.proc.pid
        assert pid != os.getpid() and up.failed is None
        # its progress reached the store's status: every byte of each commit
        assert [(u.state, u.sent) for u in store.uploads] == [
            ("uploaded", u.bytes) for u in store.uploads]
    assert up.child is None and not os.path.exists(f"/proc/{pid}")  # close ended it
    assert remote_log(remote) == ids[::-1]
    with ckptstore.open(remote, create=False, background="thread") as other:
        assert same(other.checkout(ids[0]), state(0))


def test_a_thread_store_keeps_its_uploads_on_the_thread(tmp_path):
    with ckptstore.open(tmp_path / "r", local=tmp_path / "l", background="thread") as store:
        assert store.tiers.uploader.offload is None
        store.commit(state(0))
        store.push()
    assert len(remote_log(tmp_path / "r")) == 1


def test_an_upload_process_that_died_is_replaced(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptstore.open(remote, local=local) as store:
        store.commit(state(0))
        store.push()
        first = store.tiers.uploader.offload.child.proc
        first.kill()
        first.wait()
        ids = [store.commit(state(i)).id for i in (1, 2)]
        store.push()
        assert store.tiers.uploader.offload.child.proc.pid != first.pid
    assert remote_log(remote)[:2] == ids[::-1]


def test_a_failed_upload_in_the_process_halts_the_queue_and_is_pushed_again(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    ckptstore.open(remote).close()
    (remote / "data").write_bytes(b"not a folder")  # every chunk upload fails
    with ckptstore.open(remote, local=local) as store:
        info = store.commit(state(0))
        with pytest.raises(ckptstore.UploadError, match="safe on the local tier"):
            store.push()
        assert [u.state for u in store.uploads] == ["failed"]
        assert remote_log(remote) == []
        (remote / "data").unlink()
        store.push()
    assert remote_log(remote) == [info.id]


def test_where_no_upload_process_starts_the_thread_uploads(tmp_path, monkeypatch):
    monkeypatch.setattr(offload, "UPLOAD_MODULE", "ckptstore.no_such_module")
    with ckptstore.open(tmp_path / "r", local=tmp_path / "l") as store:
        info = store.commit(state(0))
        with pytest.warns(UploadProcessWarning, match="upload thread"):
            store.push()
        assert store.tiers.uploader.offload.failed is not None
        store.commit(state(1))
        store.push()  # no second try, no second warning
    assert remote_log(tmp_path / "r")[-1] == info.id


def test_the_upload_process_ends_with_the_store_s_process(tmp_path):
    """Training killed: its upload process ends within a second or so (the copy under way is
    copied again by the next open), not left running beside a job that restarted."""
    code = textwrap.dedent(f"""
        import os, signal, torch, ckptstore
        store = ckptstore.open({str(tmp_path / 'r')!r}, local={str(tmp_path / 'l')!r})
        store.commit({{"w": torch.randn(64)}})
        store.push()
        print(store.tiers.uploader.offload.child.proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.s3
def test_an_s3_remote_uploads_from_the_process(tmp_path, s3_server):
    url = f"s3://ckpt-tests/upload-process-{uuid.uuid4().hex[:8]}"
    with ckptstore.open(url, local=tmp_path / "local", **s3_server) as store:
        pending = store.commit_async(state(0))
        info = pending.wait(uploaded=True)
        assert store.tiers.uploader.offload.child.alive()
        store.tag("best", info.id)
        store.push()
    with ckptstore.open(url, create=False, background="thread", **s3_server) as other:
        assert [c.id for c in other.log()] == [info.id] and other.tags() == {"best": info.id}
        assert same(other.checkout("best"), state(0))


def _nice_values(pid: int) -> list[int]:
    """The nice value of each thread of process ``pid``."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.append(int(f.read().rsplit(")", 1)[1].split()[16]))
    return out


def _uploaded(store: ckptstore.Store, timeout: float = 60.0) -> None:
    """Until every upload landed, without waiting through the store (no urgent copy)."""
    deadline = time.monotonic() + timeout
    while any(u.state != "uploaded" for u in store.uploads):
        assert time.monotonic() < deadline, store.uploads
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
@pytest.mark.parametrize("priority", ["low", "normal"])
def test_copies_run_at_the_background_priority_while_they_keep_up(tmp_path, priority):
    with ckptstore.open(tmp_path / "r", local=tmp_path / "l",
                        background_priority=priority) as store:
        store.commit(state(0))
        _uploaded(store)
        pid = store.tiers.uploader.offload.child.proc.pid
        lowered = [n for n in _nice_values(pid) if n >= ckptstore.priority.LOW_NICE]
        assert bool(lowered) == (priority == "low")


class _Recording(offload.UploadProcess):
    """The real upload process, its copies' urgency recorded."""

    urgent: list[bool] = []

    def copy_commit(self, *args, **kwargs):
        type(self).urgent.append(kwargs.get("urgent", args[5] if len(args) > 5 else False))
        return super().copy_commit(*args, **kwargs)


def test_a_copy_behind_the_commits_or_waited_for_is_urgent(tmp_path, monkeypatch):
    from ckptstore.tiers import tiered

    monkeypatch.setattr(tiered, "UploadProcess", _Recording)
    _Recording.urgent = []
    remote = tmp_path / "r"
    ckptstore.open(remote).close()
    (remote / "data").write_bytes(b"not a folder")  # uploads fail: the queue halts
    with ckptstore.open(remote, local=tmp_path / "l") as store:
        store.commit(state(0))
        deadline = time.monotonic() + 60
        while not any(u.state == "failed" for u in store.uploads):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _Recording.urgent == [False]  # alone in the queue, nobody waiting
        store.commit(state(1))  # queued behind the halted one
        (remote / "data").unlink()
        store.push()  # tried again (by the commit, by push): two queued, or waited for
        assert len(_Recording.urgent) >= 3 and all(_Recording.urgent[1:])
        store.commit(state(2))
        _uploaded(store)
        assert _Recording.urgent[-1] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_a_wait_hurries_the_copy_under_way(tmp_path):
    """push() called while a copy runs at the background priority: the rest of its keys are
    copied at normal priority (SIGUSR2 to the upload process)."""
    log = tmp_path / "writes"
    slow_uploads(0.15, str(log))
    try:
        with ckptstore.open(tmp_path / "r", local=tmp_path / "l") as store:
            store.commit({f"t{i}": torch.randn(20_000) for i in range(24)})
            deadline = time.monotonic() + 60
            while not log.exists() or len(log.read_text().split("\n")) < 4:
                assert time.monotonic() < deadline  # the copy is under way, nobody waits
                time.sleep(0.05)
            begun = time.monotonic()
            store.push()
        writes = [(float(t), int(n)) for t, n in (ln.split() for ln in log.read_text().split("\n")
                                                  if ln)]
    finally:
        offload.UPLOAD_MODULE = "ckptstore.tiers.upload_worker"
        os.environ.pop(upload_child.ARM, None)
    before = [n for t, n in writes if t < begun]
    after = [n for t, n in writes if t > begun + 0.5]
    assert before and all(n >= ckptstore.priority.LOW_NICE for n in before)
    assert after and all(n == 0 for n in after)


def test_where_the_upload_process_cannot_even_be_spawned_the_thread_uploads(tmp_path,
                                                                             monkeypatch):
    from ckptstore.commit import child

    monkeypatch.setattr(child.sys, "executable", str(tmp_path / "no-such-python"))
    with ckptstore.open(tmp_path / "r", local=tmp_path / "l") as store:
        info = store.commit(state(0))  # commit() on the caller's thread: no persist process
        with pytest.warns(UploadProcessWarning, match="no-such-python"):
            store.push()
    assert remote_log(tmp_path / "r") == [info.id]


def test_a_failed_copy_leaves_no_key_copy_running(tmp_path):
    """copy_folder raises only once every key copy of the attempt ended: none goes on writing
    (or reporting progress, which the next attempt would count) after the failure."""
    from concurrent.futures import ThreadPoolExecutor

    from ckptstore.storage import LocalStorage
    from ckptstore.tiers.copy import copy_folder

    class SlowRemote(LocalStorage):  # every key but the failing one takes a while
        def put_chunk(self, key, data):
            if not key.endswith("/k0"):
                time.sleep(0.3)
            super().put_chunk(key, data)

    local, remote = LocalStorage(str(tmp_path / "l")), SlowRemote(str(tmp_path / "r"))
    for i in range(6):
        local.put_chunk(f"data/c/k{i}", b"x" * 100)
    (tmp_path / "r" / "data" / "c" / "k0").mkdir(parents=True)  # k0 cannot be written
    sent: list[int] = []
    with ThreadPoolExecutor(8) as pool:
        with pytest.raises(OSError):
            copy_folder(local, remote, "data/c", pool, sent.append, lambda: False)
        at_raise = len(sent)
        time.sleep(0.5)
    assert len(sent) == at_raise == 5


def test_a_folder_copied_to_a_local_remote_is_made_durable_after_its_keys(tmp_path):
    """A remote that is a local folder gets the folder's files and entries made durable (its
    fsync_dir) once every key is copied, before the caller writes the manifest that names
    them; a folder already there whole, or an interrupted copy, does not."""
    from concurrent.futures import ThreadPoolExecutor

    from ckptstore.storage import LocalStorage
    from ckptstore.tiers.copy import copy_folder

    events: list[str] = []

    class Remote(LocalStorage):
        def put_chunk(self, key, data):
            super().put_chunk(key, data)
            events.append(key)

        def fsync_dir(self, key):
            super().fsync_dir(key)
            events.append("fsync_dir " + key)

    local, remote = LocalStorage(str(tmp_path / "l")), Remote(str(tmp_path / "r"), durable=True)
    for i in range(4):
        local.put_chunk(f"data/c/k{i}", b"x" * 100)
    with ThreadPoolExecutor(2) as pool:
        copy_folder(local, remote, "data/c", pool, lambda n: None, lambda: False)
        assert sorted(events[:4]) == [f"data/c/k{i}" for i in range(4)]
        assert events[4:] == ["fsync_dir data/c"]
        events.clear()
        copy_folder(local, remote, "data/c", pool, lambda n: None, lambda: False)
        assert events == []  # nothing missing: nothing copied, nothing to sync again
        local.put_chunk("data/d/k0", b"y")
        with pytest.raises(InterruptedError):
            copy_folder(local, remote, "data/d", pool, lambda n: None, lambda: True)
    assert events == []
    assert (tmp_path / "r" / "data" / "c" / "k3").read_bytes() == b"x" * 100


def test_a_file_a_killed_copy_left_short_on_a_local_remote_is_copied_again(tmp_path):
    """A local-disk remote's file of another size than the local one (a copy killed part way
    wrote it under its final name) is copied again, not taken as complete; a whole one is
    left alone."""
    from concurrent.futures import ThreadPoolExecutor

    from ckptstore.storage import LocalStorage
    from ckptstore.tiers.copy import copy_folder

    local, remote = LocalStorage(str(tmp_path / "l")), LocalStorage(str(tmp_path / "r"))
    local.put_chunk("data/c/k0", b"x" * 1000)
    local.put_chunk("data/c/k1", b"y" * 1000)
    assert local.link_chunk("data/c/k1", "data/c2/k1")  # a linked local file: its whole size
    remote.put_chunk("data/c/k0", b"x" * 300)  # short: a killed copy's
    remote.put_chunk("data/c/k1", b"y" * 1000)
    before = os.stat(tmp_path / "r" / "data" / "c" / "k1").st_ino
    sent: list[int] = []
    with ThreadPoolExecutor(2) as pool:
        copy_folder(local, remote, "data/c", pool, sent.append, lambda: False)
    assert (tmp_path / "r" / "data" / "c" / "k0").read_bytes() == b"x" * 1000
    assert sent == [1000]
    assert os.stat(tmp_path / "r" / "data" / "c" / "k1").st_ino == before
