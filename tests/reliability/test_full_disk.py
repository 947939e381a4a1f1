"""A disk that fills up during a commit (``fulldisk.py``: the real local filesystem, wrapped).

The commit fails with :class:`ckptstore.StorageFullError` (an ``OSError`` with ``errno
ENOSPC``) that says to free space; the store stays valid (branch unchanged, verify clean, nothing
half-visible); gc removes the partial data; once space is freed the next commit works.
"""

from __future__ import annotations

import errno

import pytest
from checks import check_store
from checks import commit_seed as _commit_seed
from fulldisk import FullDiskStorage
from workers import build_state

import ckptstore
from ckptstore.format.layout import MARKER
from ckptstore.history.manifest import encode_marker
from ckptstore.storage.retry import Retry, storage_error


CHUNK_BYTES = 16 * 1024  # the small profile's 96 KiB tensor: 6 chunks


def commit_seed(store: ckptstore.Store, seed: int, **kwargs: object) -> ckptstore.CommitInfo:
    return _commit_seed(store, seed, "small", **kwargs)


def _open(root: str, **limits: int | None) -> ckptstore.Store:
    storage = FullDiskStorage(root, **limits)
    storage.put_if_absent(MARKER, encode_marker())
    return ckptstore.Store(storage, ckptstore.EncodingOptions(chunk_bytes=CHUNK_BYTES))


def _writes_of_a_commit(root: str) -> int:
    store = _open(root)
    before = store.storage.writes
    commit_seed(store, 0)
    store.close()
    return store.storage.writes - before


def test_disk_fills_up_during_the_data(tmp_path):
    store = _open(str(tmp_path / "s"))
    first = commit_seed(store, 1).id
    store.storage.capacity = store.storage.used() * 4 // 3  # a third of the next commit
    with pytest.raises(ckptstore.StorageFullError, match="free space") as err:
        commit_seed(store, 2)
    assert err.value.errno == errno.ENOSPC and isinstance(err.value, OSError)
    assert "nothing was made visible" in str(err.value) and first[:12] in str(err.value)
    assert store.resolve("main") == first
    assert len(store.storage.listdir("data")) == 2  # the partial commit, invisible
    store.storage.capacity = None  # space freed
    second = commit_seed(store, 3).id
    check_store(store, [first, second])
    store.close()


def test_gc_frees_the_space_a_failed_commit_took(tmp_path):
    store = _open(str(tmp_path / "s"))
    first = commit_seed(store, 1).id
    used = store.storage.used()  # about one commit
    store.storage.capacity = used * 4 // 3
    with pytest.raises(ckptstore.StorageFullError):
        commit_seed(store, 2)
    store.storage.capacity = used + int(used * 1.1)  # one commit fits, not with the leftovers
    with pytest.raises(ckptstore.StorageFullError):
        commit_seed(store, 2)
    store.gc(grace_period=0)  # removes the partial data: now it fits
    second = commit_seed(store, 3).id
    check_store(store, [first, second])
    store.close()


def _full_at(tmp_path, points: str) -> None:
    n = _writes_of_a_commit(str(tmp_path / "calibrate"))
    assert n >= 10  # chunks and metadata, then the manifest, then the ref
    for k in range(1, n + 1) if points == "all" else (1, n // 2, n - 1, n):
        store = _open(str(tmp_path / f"s{k}"))
        first = commit_seed(store, 1).id
        store.storage.writes, store.storage.fail_at = 0, k
        with pytest.raises(ckptstore.StorageFullError, match="unchanged"):
            commit_seed(store, 2, tags=["t2"])
        assert store.resolve("main") == first and store.tags() == {}
        store.storage.fail_at = None
        second = commit_seed(store, 3).id
        check_store(store, [first, second])
        store.close()


def test_disk_full_at_the_first_a_middle_the_manifest_and_the_ref_write(tmp_path):
    _full_at(tmp_path, "some")


@pytest.mark.slow
def test_disk_full_at_every_write_of_a_commit(tmp_path):
    _full_at(tmp_path, "all")


def test_async_commit_on_a_full_disk(tmp_path):
    store = _open(str(tmp_path / "s"))
    first = commit_seed(store, 1).id
    store.storage.capacity = store.storage.used() * 5 // 4
    pending = store.commit_async(build_state(2, "small"), message="seed 2",
                                 metadata={"seed": 2, "profile": "small"})
    with pytest.raises(ckptstore.StorageFullError):
        pending.wait()
    store.storage.capacity = None
    second = commit_seed(store, 3).id
    check_store(store, [first, second])
    store.close()


def test_a_full_disk_is_not_retried():
    calls = []

    def full(attempt: int) -> None:
        calls.append(attempt)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(ckptstore.StorageFullError, match="no space left to write k"):
        Retry(attempts=5, backoff=0).call(full, "write", "k")
    assert calls == [1]
    assert isinstance(storage_error(OSError(errno.EDQUOT, "quota"), "write", "k", 1),
                      ckptstore.StorageFullError)


@pytest.mark.parametrize("verb", ["tag", "branch", "reset_branch", "delete_branch"])
def test_refs_on_a_full_disk(tmp_path, verb):
    """tag() and branch() raised a raw OSError [Errno 28] (issue 26 item 9); they say
    StorageFullError as commits do, and change nothing."""
    store = _open(str(tmp_path / "s"))
    first = commit_seed(store, 1).id
    second = commit_seed(store, 2).id
    store.branch("side", first)
    refs = (store.branches(), store.tags())
    store.storage.capacity = store.storage.used()  # not one more byte
    call = {"tag": lambda: store.tag("v1", first), "branch": lambda: store.branch("b", first),
            "reset_branch": lambda: store.reset_branch("main", first),
            "delete_branch": lambda: store.delete_branch("side")}[verb]
    with pytest.raises(ckptstore.StorageFullError, match="free space") as err:
        call()
    assert err.value.errno == errno.ENOSPC and "Nothing was changed" in str(err.value)
    assert (store.branches(), store.tags()) == refs and store.resolve("main") == second
    store.storage.capacity = None
    call()
    store.close()
