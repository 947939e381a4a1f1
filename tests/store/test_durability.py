"""A commit to a local store is crash-consistent by default (issue 26 item 17): its data, then its
manifest, then its ref are each made durable -- files and the folders that name them -- before
the next is written; ``durable=False`` opts out (no chunk and no folder is fsynced). On the
file systems that take it, a commit's data is made durable at once (batched durability: one
``syncfs`` of its folder; the tests with ``Batched``).

The real ``os.fsync`` and ``os.link`` are wrapped to record, in order, which file or folder each
call made durable or created (observing the store's system calls, not replacing them). The
local store's compiled file-system steps make the same calls in C, out of sight of such
wrappers: here the store runs their Python twins (``fileops.native = False``); the compiled
steps' system calls, in order, are checked in tests/store/test_fileops.py."""

from __future__ import annotations

import os
import threading

import pytest
import torch

import ckptstore
from ckptstore.format.layout import TEMP_PREFIX
from ckptstore.commit.plan import EncodingOptions
from ckptstore.storage import fileops


class Calls:
    """The fsyncs (by the path of the file or folder synced) and links, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        real_fsync, real_link = os.fsync, os.link

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            real_fsync(fd)
            self._add("fsync", path)

        def link(src: str, dst: str, *args, **kwargs) -> None:
            real_link(src, dst, *args, **kwargs)
            self._add("link", os.path.abspath(dst))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "link", link)
        monkeypatch.setattr(fileops, "native", False)

    def _add(self, kind: str, path: str) -> None:
        with self._lock:
            self.events.append((kind, path))

    def first(self, kind: str, path: str) -> int:
        """Index of the first such event (a failure if there is none)."""
        hits = [i for i, e in enumerate(self.events) if e == (kind, path)]
        assert hits, f"no {kind} of {path}"
        return hits[0]

    def synced(self, path: str, after: int = -1) -> int:
        """Index of the first fsync of ``path`` after event ``after``."""
        hits = [i for i, e in enumerate(self.events) if e == ("fsync", path) and i > after]
        assert hits, f"{path} not fsynced after event {after}"
        return hits[0]


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(2048, 64, generator=g), "b": torch.randn(16, generator=g)}


def _tree(path: str) -> tuple[list[str], list[str]]:
    """(folders, files) under ``path``, itself included."""
    folders, files = [], []
    for d, _, fs in os.walk(path):
        folders.append(d)
        files += [os.path.join(d, f) for f in fs]
    return folders, files


@pytest.mark.parametrize("how", ["commit", "commit_async"])
def test_default_commit_makes_data_manifest_and_ref_durable_in_order(tmp_path, monkeypatch,
                                                                       how):
    root = os.path.realpath(tmp_path / "s")
    # the calls of this process (a persist process's are its own: test_persist_process.py)
    store = ckptstore.open(root, options=EncodingOptions(chunk_bytes=1 << 16),
                           background="thread")
    calls = Calls(monkeypatch)
    if how == "commit":
        commit_id = store.commit(_state()).id
    else:
        commit_id = store.commit_async(_state()).wait().id
    store.close()
    manifest = os.path.join(root, "commits", sorted(os.listdir(os.path.join(root, "commits")))[0])
    ref_dir = os.path.join(root, "refs", "heads", "main")
    ref = os.path.join(ref_dir, sorted(os.listdir(ref_dir))[0])
    manifest_at, ref_at = calls.first("link", manifest), calls.first("link", ref)
    assert manifest_at < ref_at

    # 1. every chunk file and every folder of the commit's data, and the folders above it,
    #    durable before the manifest is linked
    folders, files = _tree(os.path.join(root, "data", commit_id))
    assert len(files) > 4
    for path in files + folders + [os.path.join(root, "data"), root]:
        assert calls.synced(path) < manifest_at, path
    # 2. the manifest's bytes before its name; its folder after the name, before the ref
    tmp_syncs = [i for i, (k, p) in enumerate(calls.events) if k == "fsync" and
                 os.path.dirname(p) == os.path.dirname(manifest) and
                 os.path.basename(p).startswith(TEMP_PREFIX)]
    assert tmp_syncs and tmp_syncs[0] < manifest_at
    assert calls.synced(os.path.dirname(manifest), after=manifest_at) < ref_at
    # 3. the ref's folder after its name, and every folder made for it (the first commit made
    #    refs/heads/main): the folders that name them
    for path in (ref_dir, os.path.dirname(ref_dir), os.path.join(root, "refs"), root):
        calls.synced(path, after=ref_at)


class Batched:
    """The compiled steps' calls a batched commit makes, as the store makes them (wrapped in
    ``fileops``): each chunk file written and how, each ``sync_store`` and ``fsync_tree``, and
    the links that name the manifest and the ref, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sync_store_works: bool = True):
        self.events: list[tuple] = []
        self._lock = threading.Lock()
        real_write, real_sync = fileops.write_new, fileops.sync_store
        real_tree, real_link = fileops.fsync_tree, os.link

        def write_new(path, parts, fsync, *args, **kwargs):
            n = real_write(path, parts, fsync, *args, **kwargs)
            if n >= 0:
                self._add("write", path, int(fsync))
            return n

        def sync_store(path, root):
            done = real_sync(path, root) if sync_store_works else False
            self._add("sync_store", path, done)
            return done

        def fsync_tree(path, root, files=False):
            real_tree(path, root, files)
            self._add("fsync_tree", path, files)

        def link(src, dst, *args, **kwargs):
            real_link(src, dst, *args, **kwargs)
            self._add("link", os.path.abspath(dst), None)

        monkeypatch.setattr(fileops, "write_new", write_new)
        monkeypatch.setattr(fileops, "sync_store", sync_store)
        monkeypatch.setattr(fileops, "fsync_tree", fsync_tree)
        monkeypatch.setattr(os, "link", link)

    def _add(self, *event) -> None:
        with self._lock:
            self.events.append(event)

    def index(self, kind: str, path: str) -> int:
        hits = [i for i, e in enumerate(self.events) if e[:2] == (kind, path)]
        assert hits, f"no {kind} of {path}"
        return hits[0]


def _batch_here(path) -> bool:
    return fileops.batch_fs(str(path))


@pytest.mark.skipif(not fileops.native, reason="batched durability needs the compiled steps")
@pytest.mark.parametrize("how", ["commit", "commit_async"])
def test_a_batched_commit_syncs_its_data_once_before_its_manifest(tmp_path, monkeypatch, how):
    """On a file system that takes it, each chunk file's data is written out (SYNC_DATA), and
    the commit's data folder is synced once (syncfs) after the last chunk and before the
    manifest is linked; then the manifest and the ref as before."""
    if not _batch_here(tmp_path):
        pytest.skip("the temporary folder's file system does not take batched durability")
    root = os.path.realpath(tmp_path / "s")
    store = ckptstore.open(root, options=EncodingOptions(chunk_bytes=1 << 16),
                           background="thread")
    calls = Batched(monkeypatch)
    commit_id = (store.commit(_state()) if how == "commit"
                 else store.commit_async(_state()).wait()).id
    store.close()
    data = os.path.join(root, "data", commit_id)
    writes = [e for e in calls.events if e[0] == "write" and e[1].startswith(data + os.sep)]
    _, files = _tree(data)
    assert len(files) > 4 and sorted(e[1] for e in writes) == sorted(files)
    assert {e[2] for e in writes} == {fileops.SYNC_DATA}
    synced = calls.index("sync_store", data)
    assert calls.events[synced][2] is True
    assert max(calls.events.index(e) for e in writes) < synced
    assert not [e for e in calls.events if e[0] == "fsync_tree"]
    manifest = os.path.join(root, "commits", sorted(os.listdir(os.path.join(root, "commits")))[0])
    assert synced < calls.index("link", manifest)
    assert store.storage.durable and ckptstore.open(root).checkout("main")["w"].equal(
        _state()["w"])


@pytest.mark.skipif(not fileops.native, reason="batched durability needs the compiled steps")
def test_a_batched_commit_fsyncs_each_file_where_syncfs_cannot(tmp_path, monkeypatch):
    """The commit's folder on a file system that does not take it (a mount inside the store:
    sync_store says False): every chunk file and folder is fsynced there before the manifest."""
    if not _batch_here(tmp_path):
        pytest.skip("the temporary folder's file system does not take batched durability")
    root = os.path.realpath(tmp_path / "s")
    store = ckptstore.open(root, options=EncodingOptions(chunk_bytes=1 << 16),
                           background="thread")
    calls = Batched(monkeypatch, sync_store_works=False)
    commit_id = store.commit(_state()).id
    store.close()
    data = os.path.join(root, "data", commit_id)
    tree = calls.index("fsync_tree", data)
    assert calls.events[tree][2] is True  # files too
    assert calls.index("sync_store", data) < tree
    manifest = os.path.join(root, "commits", sorted(os.listdir(os.path.join(root, "commits")))[0])
    assert tree < calls.index("link", manifest)


def test_batched_durability_opt_out_fsyncs_each_file(tmp_path, monkeypatch):
    """``storage.batch_sync = False`` (or a file system without it, or no compiled steps): each
    chunk file fsynced as it is written, each folder by fsync_tree, no sync_store."""
    root = os.path.realpath(tmp_path / "s")
    store = ckptstore.open(root, options=EncodingOptions(chunk_bytes=1 << 16),
                           background="thread")
    store.storage.batch_sync = False
    calls = Batched(monkeypatch)
    commit_id = store.commit(_state()).id
    store.close()
    data = os.path.join(root, "data", commit_id)
    writes = [e for e in calls.events if e[0] == "write" and e[1].startswith(data + os.sep)]
    assert writes and {e[2] for e in writes} == {fileops.SYNC_FILE}
    assert not [e for e in calls.events if e[0] == "sync_store"]
    assert calls.events[calls.index("fsync_tree", data)][2] is False


def test_tags_and_branches_are_durable(tmp_path, monkeypatch):
    root = os.path.realpath(tmp_path / "s")
    store = ckptstore.open(root)
    store.commit(_state())
    calls = Calls(monkeypatch)
    store.tag("v1")
    store.branch("other")
    store.close()
    branch_ref = sorted(os.listdir(os.path.join(root, "refs", "heads", "other")))[0]
    for name in ("refs/tags/v1", f"refs/heads/other/{branch_ref}"):
        path = os.path.join(root, name)
        calls.synced(os.path.dirname(path), after=calls.first("link", path))


def test_opt_out_syncs_no_chunk_and_no_folder(tmp_path, monkeypatch):
    root = os.path.realpath(tmp_path / "s")
    store = ckptstore.open(root, durable=False)
    calls = Calls(monkeypatch)
    commit_id = store.commit(_state()).id
    got = store.checkout("main")
    store.close()
    assert all(torch.equal(got[k], v) for k, v in _state().items())
    synced = [p for k, p in calls.events if k == "fsync"]
    data = os.path.join(root, "data") + os.sep
    assert not [p for p in synced if p.startswith(data) or os.path.isdir(p)], synced
    assert os.path.isdir(os.path.join(root, "data", commit_id))


def test_the_cli_opens_stores_durable_unless_told(tmp_path):
    """``ckpt import`` commits, ``ckpt tag`` tags: durable too (``-o durable=false`` opts out)."""
    from ckptstore.cli import parse_storage_options
    from ckptstore.cli._open import open_existing

    ckptstore.open(tmp_path / "s").close()
    assert open_existing(str(tmp_path / "s"), {}).durable
    opt_out = parse_storage_options(["durable=false"])
    assert not open_existing(str(tmp_path / "s"), opt_out).durable


def test_the_environment_turns_batched_durability_off(tmp_path, monkeypatch):
    """``CKPTSTORE_DURABILITY=file`` (read when a store opens, so a persist process spawned
    with it does the same): each chunk file and folder fsynced."""
    from ckptstore.storage import LocalStorage
    from ckptstore.storage.local import DURABILITY_ENV

    monkeypatch.delenv(DURABILITY_ENV, raising=False)
    assert LocalStorage(str(tmp_path / "a"), durable=True).batch_sync
    monkeypatch.setenv(DURABILITY_ENV, "files")
    with pytest.raises(ckptstore.InvalidSetting, match="'batch'.*'file'"):
        ckptstore.open(tmp_path / "typo")
    monkeypatch.setenv(DURABILITY_ENV, "file")
    store = ckptstore.open(tmp_path / "b", background="thread")
    assert not store.storage.batch_sync
    calls = Batched(monkeypatch)
    store.commit(_state())
    store.close()
    assert not [e for e in calls.events if e[0] == "sync_store"]
    assert {e[2] for e in calls.events if e[0] == "write"} == {fileops.SYNC_FILE}


@pytest.mark.skipif(not fileops.native, reason="batched durability needs the compiled steps")
def test_a_chunk_written_out_is_synced_though_batching_was_turned_off_since(tmp_path,
                                                                           monkeypatch):
    """fsync_dir syncs chunk files written out only (SYNC_DATA) even where batching was turned
    off between their writes and it: their inodes are durable only once synced."""
    if not _batch_here(tmp_path):
        pytest.skip("the temporary folder's file system does not take batched durability")
    from ckptstore.storage import LocalStorage

    storage = LocalStorage(str(tmp_path / "s"), durable=True)
    calls = Batched(monkeypatch)
    storage.put_chunk("data/c1/a/c/0", [b"chunk" * 100])
    storage.batch_sync = False
    storage.fsync_dir("data/c1")
    path = storage.path("data/c1")
    assert calls.events[calls.index("sync_store", path)][2] is True
