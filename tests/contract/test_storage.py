"""The storage contract: every guarantee of ``ckptstore.storage.base.Storage``, checked on every
back-end (``BACKENDS`` in tests/conftest.py: local directory, memory://, S3 on a moto server).

A new back-end passes this suite before anything else; dulwich's ``ObjectStoreTests`` and zarr's
``StoreTests`` are the model.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pytest

from ckptstore.storage import FsspecStorage, LocalStorage, MemoryStorage, Storage, open_storage
from ckptstore.storage import fileops

T = TypeVar("T")
EXPECTED_CLASS = {"local": LocalStorage, "memory": MemoryStorage, "s3": FsspecStorage}


def _run_together(n: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` in ``n`` threads released at once; their results, in order."""
    barrier = threading.Barrier(n)

    def run(i: int) -> T:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


@pytest.fixture
def fast_switching():
    """Switch threads often, so races interleave inside the primitives."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


# -- what open_storage gives -----------------------------------------------------------------
def test_implementation_and_capabilities(backend_storage, store_url, request):
    backend = request.node.callspec.params["store_url"]
    assert type(backend_storage) is EXPECTED_CLASS[backend]
    assert isinstance(backend_storage, Storage)
    assert backend_storage.local_disk is (backend == "local")
    assert backend_storage.io_threads >= (1 if backend_storage.local_disk else 16)
    assert backend_storage.url == store_url[0] and not backend_storage.durable
    assert repr(backend_storage) == f"{type(backend_storage).__name__}({store_url[0]!r})"


def test_path_names_the_key(backend_storage):
    assert backend_storage.path("") == backend_storage.root
    assert backend_storage.path("a/b/c").replace(os.sep, "/").endswith("/a/b/c")
    if backend_storage.local_disk:
        backend_storage.put("a/b/c", b"x")
        with open(backend_storage.path("a/b/c"), "rb") as f:  # an OS path open() takes
            assert f.read() == b"x"


# -- reads -----------------------------------------------------------------------------------
def test_missing_key(backend_storage):
    with pytest.raises(FileNotFoundError):
        backend_storage.read("nope/missing")
    with pytest.raises(FileNotFoundError):
        backend_storage.size("missing")
    assert not backend_storage.exists("missing")
    assert backend_storage.mtime("missing") is None


def test_put_read_exists_size(backend_storage):
    backend_storage.put("deep/er/key", b"hello")
    assert backend_storage.read("deep/er/key") == b"hello"
    assert backend_storage.exists("deep/er/key")
    assert backend_storage.size("deep/er/key") == 5
    backend_storage.put("empty", b"")
    assert backend_storage.read("empty") == b"" and backend_storage.size("empty") == 0


def test_mtime_only_on_local_disks(backend_storage):
    backend_storage.put("k", b"x")
    mtime = backend_storage.mtime("k")
    if backend_storage.local_disk:
        assert mtime is not None and abs(mtime - time.time()) < 60
    else:
        assert mtime is None


def test_listdir(backend_storage):
    assert backend_storage.listdir("missing") == []
    assert backend_storage.listdir("") == []
    for key in ("d/b", "d/a", "d/sub/x", "d/sub/y/z", "dd/q", "e"):
        backend_storage.put(key, b"1")
    assert backend_storage.listdir("d") == ["a", "b", "sub"]  # names, sorted, one level
    assert backend_storage.listdir("d/sub") == ["x", "y"]
    assert backend_storage.listdir("") == ["d", "dd", "e"]
    backend_storage.delete("d/a")
    assert backend_storage.listdir("d") == ["b", "sub"]  # no stale listing


def test_walk_sizes(backend_storage):
    assert backend_storage.walk_sizes("missing") == {}
    backend_storage.put("w/a", b"12345")
    backend_storage.put_chunk("w/x/y/z", [b"ab", b"c"])
    backend_storage.put("w2/other", b"1")
    assert backend_storage.walk_sizes("w") == {"w/a": 5, "w/x/y/z": 3}
    assert backend_storage.walk_sizes("w/x") == {"w/x/y/z": 3}
    assert backend_storage.walk_sizes("") == {"w/a": 5, "w/x/y/z": 3, "w2/other": 1}


# -- writes ----------------------------------------------------------------------------------
def test_put_overwrites(backend_storage):
    backend_storage.put("r/k", b"old value")
    backend_storage.put("r/k", b"new")
    assert backend_storage.read("r/k") == b"new"
    assert backend_storage.listdir("r") == ["k"]  # no temporary file left behind


def test_put_overwrite_is_atomic_for_readers(backend_storage, fast_switching):
    old, new = b"a" * 300_000, b"b" * 200_000
    backend_storage.put("k", old)
    done = threading.Event()

    def work(i: int) -> set[bytes]:
        if i == 0:
            for n in range(20):
                backend_storage.put("k", new if n % 2 == 0 else old)
            done.set()
            return set()
        seen = set()
        while not done.is_set():
            seen.add(backend_storage.read("k"))
        return seen

    for seen in _run_together(3, work):
        assert seen <= {old, new}, "a reader saw a torn or empty value"


@pytest.mark.parametrize("parts", [
    b"one piece", bytearray(b"a bytearray"), memoryview(b"a memoryview"),
    [b"several ", bytearray(b"parts "), memoryview(b"of buffers"), b""],
    [b"just one"], [b""]], ids=["bytes", "bytearray", "memoryview", "parts", "one-part", "empty"])
def test_put_chunk_writes_the_concatenation(backend_storage, parts):
    backend_storage.put_chunk("data/c/0", parts)
    whole = bytes(parts) if isinstance(parts, (bytes, bytearray, memoryview)) \
        else b"".join(parts)
    assert backend_storage.read("data/c/0") == whole
    backend_storage.put_chunk("data/c/0", [b"x", b"y"])  # overwrites, truncating
    assert backend_storage.read("data/c/0") == b"xy"


@pytest.mark.parametrize("size", [0, 100, (1 << 20) + 3], ids=["empty", "small", "large"])
def test_read_chunk_is_read(backend_storage, size):
    data = os.urandom(size)
    backend_storage.put_chunk("data/c/1", data)
    got = backend_storage.read_chunk("data/c/1")
    assert bytes(got) == data == backend_storage.read("data/c/1")
    with pytest.raises(FileNotFoundError):
        backend_storage.read_chunk("data/c/none")


@pytest.mark.parametrize("size", [0, 100, (1 << 20) + 3], ids=["empty", "small", "large"])
def test_read_chunk_into_fills_the_buffers_in_order(backend_storage, size):
    """``read_chunk_into`` scatters a chunk's bytes over writable buffers (a numpy array's
    memory, a bytearray) and returns the bytes the key holds."""
    data = os.urandom(size)
    backend_storage.put_chunk("data/c/1", [data[:7], data[7:]])
    head, crc = np.zeros(min(size, 10), np.uint8), bytearray(min(4, size - min(size, 10)))
    body = np.zeros(size - len(head) - len(crc), np.uint8)
    parts = [memoryview(head), memoryview(body), memoryview(crc)]
    assert backend_storage.read_chunk_into("data/c/1", parts) == size
    assert head.tobytes() + body.tobytes() + bytes(crc) == data
    with pytest.raises(FileNotFoundError):
        backend_storage.read_chunk_into("data/c/none", [memoryview(bytearray(4))])


def test_read_chunk_into_tells_a_size_that_is_not_the_buffers(backend_storage):
    """A chunk shorter or longer than the buffers (truncated, or not this array's): the size it
    holds comes back, and what the buffers hold is no answer."""
    backend_storage.put_chunk("data/c/1", b"x" * 100)
    assert backend_storage.read_chunk_into("data/c/1", [memoryview(bytearray(101))]) == 100
    assert backend_storage.read_chunk_into("data/c/1", [memoryview(bytearray(60)),
                                                        memoryview(bytearray(39))]) == 100
    assert backend_storage.read_chunk_into("data/c/1", []) == 100


def test_read_chunk_sees_one_version_while_rewritten(backend_storage):
    old, new = os.urandom((1 << 20) + 1), os.urandom(1 << 21)
    backend_storage.put_chunk("data/c/2", old)
    got = backend_storage.read_chunk("data/c/2")
    backend_storage.put_chunk("data/c/2", [new[:7], new[7:]])  # a rewrite, then a delete
    assert bytes(got) == old
    backend_storage.delete("data/c/2")
    assert bytes(got) == old


def test_put_chunk_race_on_one_key(backend_storage, fast_switching):
    """Ranks writing the same key (a commit's group metadata) at once: none fails, the key
    ends whole, as one of them wrote it."""
    values = [bytes([i]) * 4096 for i in range(6)]
    _run_together(6, lambda i: backend_storage.put_chunk("data/g/zarr.json", values[i]))
    assert backend_storage.read("data/g/zarr.json") in values


def test_put_chunk_durable(backend_storage):
    backend_storage.durable = True
    backend_storage.put_chunk("c/0", [b"abc", b"def"])
    assert backend_storage.read("c/0") == b"abcdef"


def test_put_if_absent(backend_storage):
    assert backend_storage.put_if_absent("refs/t", b"first") is True
    assert backend_storage.put_if_absent("refs/t", b"second") is False
    assert backend_storage.read("refs/t") == b"first"
    assert backend_storage.listdir("refs") == ["t"]  # no temporary file left behind
    backend_storage.delete("refs/t")
    assert backend_storage.put_if_absent("refs/t", b"again") is True


def test_put_if_absent_race_has_one_winner(backend_storage, store_url, fast_switching):
    """Threads on one storage object and on a second one opened at the same URL race for each
    key: exactly one creates it, and the key holds the winner's bytes."""
    url, opts = store_url
    other = open_storage(url, **opts)
    for round_ in range(24):
        key = f"refs/heads/main/{round_}"
        wins = _run_together(8, lambda i, key=key: (
            other if i % 2 else backend_storage).put_if_absent(key, f"writer {i}".encode()))
        assert sum(wins) == 1, wins
        assert backend_storage.read(key) == f"writer {wins.index(True)}".encode()


def test_delete(backend_storage):
    backend_storage.delete("missing")  # fine
    backend_storage.put("x/k", b"1")
    backend_storage.delete("x/k")
    assert not backend_storage.exists("x/k")
    with pytest.raises(FileNotFoundError):
        backend_storage.read("x/k")


def test_delete_tree(backend_storage):
    backend_storage.delete_tree("missing")  # fine
    for key in ("data/ab/c/0", "data/ab/zarr.json", "data/abc/c/0"):
        backend_storage.put_chunk(key, b"1")
    backend_storage.delete_tree("data/ab")
    assert backend_storage.walk_sizes("data") == {"data/abc/c/0": 1}  # a sibling prefix stays
    assert backend_storage.listdir("data") == ["abc"]
    backend_storage.put_chunk("data/ab/c/1", b"2")  # the folder is made again
    assert backend_storage.read("data/ab/c/1") == b"2"


def test_fsync_dir(backend_storage):
    backend_storage.fsync_dir("missing")  # fine
    backend_storage.put_if_absent("refs/heads/main/1", b"x")
    backend_storage.fsync_dir("refs/heads/main")
    backend_storage.fsync_dir("")


def test_roots_are_isolated_and_shared_by_url(backend_storage, store_url):
    url, opts = store_url
    backend_storage.put("k", b"mine")
    assert open_storage(url, **opts).read("k") == b"mine"  # same URL: same keys
    sibling = open_storage(url.rstrip("/") + f"-{uuid.uuid4().hex[:6]}", **opts)
    assert not sibling.exists("k") and sibling.listdir("") == []


# -- the local implementation's system calls (they are tuned: keep them) ---------------------
def test_local_chunk_is_one_writev_and_fsynced_only_when_durable(tmp_path, monkeypatch):
    # the Python steps, observed through os (the compiled twin's system calls:
    # tests/store/test_fileops.py)
    monkeypatch.setattr(fileops, "native", False)
    storage = open_storage(tmp_path / "s")
    calls: list[str] = []
    for name in ("writev", "write", "fsync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _n=name, _r=real: (calls.append(_n), _r(*a))[1])
    storage.put_chunk("c/0", [b"a" * 1000, memoryview(b"b" * 10), b"c"])
    assert calls == ["writev"]
    storage.durable = True
    calls.clear()
    storage.put_chunk("c/1", b"d" * 100)
    assert calls == ["writev", "fsync"]
    calls.clear()
    assert storage.put_if_absent("r/1", b"ref")  # temp file synced before it is linked
    assert "fsync" in calls and sorted(os.listdir(tmp_path / "s" / "r")) == ["1"]


# The local large-chunk reads (reused buffers, never mapped): tests/store/test_mapped_reads.py.


@pytest.mark.s3
def test_an_s3_chunk_names_its_crc32c(s3_server):
    """A chunk PUT to S3 carries its CRC32C: S3 keeps it with the object and refuses a body that
    does not match it (moto keeps it, without checking), and botocore sends no CRC-32 of its own
    (zlib's, about 4x the time)."""
    import base64

    import boto3
    import crc32c

    storage = open_storage(f"s3://ckpt-tests/crc-{uuid.uuid4().hex}", **s3_server)
    body = np.random.default_rng(0).integers(0, 256, (1 << 20) + 3, np.uint8).tobytes()
    storage.put_chunk("data/c/0", [body[:1000], body[1000:]])
    client = boto3.client("s3", endpoint_url=s3_server["client_kwargs"]["endpoint_url"],
                          region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    bucket, key = storage.path("data/c/0").split("/", 1)
    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == base64.b64encode(
        crc32c.crc32c(body).to_bytes(4, "big")).decode()
    assert "ChecksumCRC32" not in head
    assert storage.read("data/c/0") == body
