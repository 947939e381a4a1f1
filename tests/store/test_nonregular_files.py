"""A local store's files replaced by what is not a regular file inside its root (issue 26 item 6):
a link to ``/dev/zero``, a FIFO, a socket, a link loop, a link out of the root, a folder linked
out of the root. Each is refused with :class:`UnsafeFileError` at once -- never a hang, never a
read or a write through the link -- and a root that is itself a link works as before.

What could hang (a FIFO, ``/dev/zero``) runs in a forked child with a deadline."""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import socket
import tempfile
import traceback

import pytest
import torch

import ckptstore
from ckptstore.errors import CkptStoreError, StorageError, UnsafeFileError
from ckptstore.commit.plan import EncodingOptions
from ckptstore.storage import LocalStorage, fileops

DEADLINE = 20.0  # seconds; the reads below take milliseconds once they cannot hang


@pytest.fixture(autouse=True, params=[True, False], ids=["compiled-steps", "python-steps"])
def file_steps(request, monkeypatch):
    """Every test with the compiled file-system steps and with their Python twins."""
    if request.param and not fileops.native:
        pytest.skip("ckptstore.storage._files is not built here (not POSIX)")
    monkeypatch.setattr(fileops, "native", request.param)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"big": torch.randn(4 * 4096, 64, generator=g), "small": torch.randn(7, generator=g)}


def _store(root: str, compression: str = "entropy") -> tuple[ckptstore.Store, str]:
    store = ckptstore.open(root, options=EncodingOptions(chunk_bytes=1 << 19,
                                                         compression=compression))
    return store, store.commit(_state(), message="one").id


def _largest_chunk(root: str) -> str:
    files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "data"))
             for f in fs if f != "zarr.json"]
    return max(files, key=os.path.getsize)


def _in_child(fn, *args) -> str:
    """``fn(*args)`` in a forked child: ``"ok"``, ``"<ErrorType>: message"``, ``"hang"`` or
    ``"signal N"``."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def run() -> None:
        try:
            _cap_memory()
            fn(*args)
            child.send("ok")
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            name = "UnsafeFileError" if isinstance(e, UnsafeFileError) else type(e).__name__
            child.send(f"{name}: {e}\n{traceback.format_exc()}")

    p = ctx.Process(target=run, daemon=True)
    p.start()
    got = parent.recv() if parent.poll(DEADLINE) else "hang"
    if got == "hang":
        p.kill()
    p.join(5)
    if p.exitcode is not None and p.exitcode < 0 and got == "hang":
        return f"signal {-p.exitcode}"
    return got


def _cap_memory() -> None:
    """At most 1 GiB more heap for this process (a read of ``/dev/zero`` then fails fast)."""
    try:
        with open("/proc/self/status") as f:
            data = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmData:"))
    except (OSError, StopIteration):  # not Linux: the deadline alone bounds it
        return
    resource.setrlimit(resource.RLIMIT_DATA, (data + (1 << 30), data + (1 << 30)))


def _make_hostile(path: str, kind: str, outside: str) -> None:
    """Put ``kind`` in the place of the file ``path``."""
    if kind == "outside":  # the same bytes, out of the root: still refused
        shutil.copy(path, os.path.join(outside, "copy"))
    os.unlink(path)
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        os.mkdir(path)
    elif kind == "huge":  # sparse: no disk used, 5 GiB to read
        with open(path, "wb") as f:
            f.truncate(5 << 30)
    elif kind == "loop":
        os.symlink(os.path.basename(path), path)
    elif kind == "outside":
        os.symlink(os.path.join(outside, "copy"), path)
    elif kind == "socket":
        short = os.path.join(tempfile.mkdtemp(), "s")  # AF_UNIX paths are short: bind, move
        s = socket.socket(socket.AF_UNIX)
        s.bind(short)
        s.close()
        os.rename(short, path)


def _checkout(root: str) -> None:
    with ckptstore.open(root, create=False) as store:
        store.checkout("main")


def _log(root: str) -> None:
    with ckptstore.open(root, create=False) as store:
        store.log("main")


@pytest.mark.parametrize("compression", ["entropy", "none"])  # none: read into place
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "loop", "outside", "socket", "huge"])
def test_hostile_chunk_is_refused_at_once(tmp_path, kind, compression):
    root = str(tmp_path / "s")
    (tmp_path / "out").mkdir()
    store, _ = _store(root, compression)
    store.close()
    chunk = _largest_chunk(root)
    _make_hostile(chunk, kind, str(tmp_path / "out"))
    got = _in_child(_checkout, root)
    assert got.startswith("UnsafeFileError: "), got
    assert os.path.relpath(chunk, root).replace(os.sep, "/") in got  # it names the key


@pytest.mark.parametrize("which", ["ref", "manifest"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_hostile_ref_or_manifest_is_refused_at_once(tmp_path, which, kind):
    root = str(tmp_path / "s")
    store, commit_id = _store(root)
    store.close()
    folder = os.path.join(root, "refs", "heads", "main") if which == "ref" else \
        os.path.join(root, "commits")
    name = sorted(os.listdir(folder))[0]
    _make_hostile(os.path.join(folder, name), kind, str(tmp_path))
    got = _in_child(_log, root)
    assert got.startswith("UnsafeFileError: ") and name in got, got


def test_tag_branch_and_commit_never_write_through_a_linked_folder(tmp_path):
    root, outside = str(tmp_path / "s"), tmp_path / "out"
    outside.mkdir()
    store, commit_id = _store(root)
    os.makedirs(os.path.join(root, "refs", "tags"))
    for folder in ("refs/tags", "refs/heads", "data"):
        path = os.path.join(root, folder)
        os.rename(path, path + ".aside")
        os.symlink(outside, path)
        with pytest.raises(StorageError, match="out of the store"):  # a commit: it says so
            if folder == "refs/tags":
                store.tag("v1", commit_id)
            elif folder == "refs/heads":
                store.branch("other", commit_id)
            else:
                store.commit({"x": torch.ones(3)}, message="two")
        assert os.listdir(outside) == [], folder  # nothing written there
        os.unlink(path)
        os.rename(path + ".aside", path)
    assert store.log("main")[0].id == commit_id
    store.close()


def test_gc_never_deletes_through_a_linked_folder(tmp_path):
    root, outside = str(tmp_path / "s"), str(tmp_path / "out")
    store, first = _store(root)
    store.commit({"x": torch.ones(3)}, message="two")
    shutil.move(os.path.join(root, "data"), outside)  # the data folder: a link out of the root
    os.symlink(outside, os.path.join(root, "data"))
    with pytest.raises(UnsafeFileError, match="out of the store"):
        store.gc(keep_last=1, grace_period=0)
    assert os.path.isdir(os.path.join(outside, first))  # the first commit's data is still there
    store.close()


def test_a_root_that_is_a_link_and_links_inside_it_work(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    store, commit_id = _store(str(tmp_path / "link"))
    store.tag("v1", commit_id)
    got = store.checkout("v1")
    assert all(torch.equal(got[k], v) for k, v in _state().items())
    store.close()
    storage = LocalStorage(tmp_path / "link")
    storage.put("k/a", b"bytes")
    os.symlink("a", os.path.join(real, "k", "b"))  # a link that stays inside the root
    assert storage.read("k/b") == b"bytes"


def test_storage_reads_refuse_devices_and_folders(tmp_path):
    storage = LocalStorage(tmp_path / "s")
    storage.put("k/file", b"x")
    os.symlink("/dev/null", os.path.join(storage.root, "k", "null"))
    with pytest.raises(UnsafeFileError, match="character device") as e:
        storage.read_chunk("k/null")
    assert isinstance(e.value, (CkptStoreError, OSError)) and e.value.key == "k/null"
    with pytest.raises(UnsafeFileError, match="character device"):
        storage.read_chunk_into("k/null", [memoryview(bytearray(8))])
    with pytest.raises(UnsafeFileError, match="a folder where a file belongs") as e:
        storage.read("k")
    assert isinstance(e.value, IsADirectoryError)  # what a chunk read maps to CorruptedChunkError
    with pytest.raises(IsADirectoryError):
        storage.read_chunk_into("k", [memoryview(bytearray(8))])
    with pytest.raises(FileNotFoundError):
        storage.read("k/none")
    with pytest.raises(FileNotFoundError):
        storage.read_chunk_into("k/none", [memoryview(bytearray(8))])
