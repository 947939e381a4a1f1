"""A commit to a local store is crash-consistent by default (issue 26 item 17): its data, then its
manifest, then its ref are each made durable -- files and the folders that name them -- before
the next is written; ``durable=False`` opts out (no chunk and no folder is fsynced).

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
