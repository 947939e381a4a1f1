"""A store is untrusted input: every kind of damage gives a clear ckptstore error, and bad
arguments are refused before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import ckptstore
from ckptstore.errors import (
    AmbiguousRef,
    CorruptedChunkError,
    FormatVersionError,
    InvalidRefName,
    ManifestError,
    NotAStoreError,
    RefNotFound,
    UnsupportedLeafError,
)
from ckptstore.format.layout import manifest_key


@pytest.fixture
def local(tmp_path):
    """A local store with one commit. Local only: the tests that take it damage or compare the
    store's files in place with pathlib; the errors they check are raised above
    ``Storage.read``, whose contract every back-end passes (tests/contract/test_storage.py)."""
    store = ckptstore.open(tmp_path / "s")
    info = store.commit({"w": torch.randn(300_000), "b": torch.ones(4)}, message="ok")
    return store, info, tmp_path / "s"


@pytest.fixture
def committed(backend_store):
    """A store with one commit, on each back-end."""
    info = backend_store.commit({"w": torch.randn(300_000), "b": torch.ones(4)}, message="ok")
    return backend_store, info


def _reopen(root: Path):
    return ckptstore.open(root, create=False)


def test_truncated_manifest(local):
    store, info, root = local
    path = root / manifest_key(info.id)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ManifestError, match="truncated or corrupted"):
        _reopen(root).checkout("main")


def test_manifest_that_is_not_one(local):
    store, info, root = local
    (root / manifest_key(info.id)).write_bytes(b"\x00" * 3)
    with pytest.raises(ManifestError, match="not a ckptstore manifest"):
        _reopen(root).log()


def test_newer_manifest_format(local):
    store, info, root = local
    path = root / manifest_key(info.id)
    data = bytearray(path.read_bytes())
    data[4] = 99
    path.write_bytes(bytes(data))
    with pytest.raises(FormatVersionError, match="upgrade ckptstore"):
        _reopen(root).checkout(info.id)


def test_newer_store_format(local):
    _, _, root = local
    (root / "ckptstore.json").write_text(json.dumps({"format": "ckptstore", "version": 99}))
    with pytest.raises(FormatVersionError, match="upgrade"):
        _reopen(root)


def test_garbage_ref_file(local):
    _, _, root = local
    ref = next((root / "refs/heads/main").iterdir())
    ref.write_bytes(b"not a commit id\n")
    with pytest.raises(ManifestError, match="garbage"):
        _reopen(root).checkout("main")


def test_corrupted_chunk_is_named(local):
    store, info, root = local
    chunk = root / f"data/{info.id}/w/c/0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    fresh = _reopen(root)
    with pytest.raises(CorruptedChunkError, match="crc32c") as err:
        fresh.checkout("main")
    assert err.value.path == f"data/{info.id}/w/c/0"
    report = fresh.verify()
    assert not report.ok and any(f"data/{info.id}/w/c/0" in p for p in report.problems)


def test_missing_chunk_is_named(local):
    store, info, root = local
    os.unlink(root / f"data/{info.id}/w/c/0")
    report = _reopen(root).verify()
    assert report.problems == [f"data/{info.id}/w/c/0: missing"]
    with pytest.raises(CorruptedChunkError, match="missing"):
        _reopen(root).checkout("main")


@pytest.mark.parametrize("name", ["..", "a/../b", "../x", "a/b", "-x", ".hidden", "x.lock",
                                  "a b", "main~1", "x^", "", "a:b", "a\\b", "x" * 300])
def test_bad_ref_names_write_nothing(local, name):
    store, info, root = local
    before = sorted(p for p in root.rglob("*"))
    with pytest.raises(InvalidRefName):
        store.tag(name, "main")
    with pytest.raises(InvalidRefName):
        store.branch(name, "main")
    with pytest.raises(InvalidRefName):
        store.commit({"x": torch.ones(1)}, branch=name)
    with pytest.raises(InvalidRefName):
        store.commit({"x": torch.ones(1)}, tags=[name])
    assert sorted(p for p in root.rglob("*")) == before


def test_unknown_refs(committed):
    store, _ = committed
    with pytest.raises(RefNotFound, match="no branch, tag or commit"):
        store.resolve("nope")
    with pytest.raises(RefNotFound, match="past the first commit"):
        store.resolve("main~5")
    with pytest.raises(KeyError):  # RefNotFound is a KeyError too
        store.checkout("0000")


def test_ambiguous_prefix(open_backend_store):
    store = open_backend_store()
    ids = [store.commit({"i": i}).id for i in range(40)]
    prefix = next(a[:1] for a in ids if sum(b.startswith(a[:1]) for b in ids) > 1)
    with pytest.raises(RefNotFound):
        store.resolve(prefix)  # one hex digit is never taken as a prefix
    four = next((a[:4] for a in ids if sum(b.startswith(a[:4]) for b in ids) > 1), None)
    if four is not None:
        with pytest.raises(AmbiguousRef):
            store.resolve(four)


def test_not_a_store(tmp_path):
    """Local only: the foreign content is put there with pathlib."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hi")
    with pytest.raises(NotAStoreError, match="not empty"):
        ckptstore.open(tmp_path / "other")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ckptstore.json").write_text("{oops")
    with pytest.raises(NotAStoreError):
        ckptstore.open(tmp_path / "bad")


def test_manifest_with_invalid_fields(local):
    """A well-framed manifest whose content is wrong is still refused (pydantic)."""
    import hashlib

    import msgpack
    store, info, root = local
    path = root / manifest_key(info.id)
    raw = msgpack.unpackb(path.read_bytes()[37:], strict_map_key=False)
    raw["tensors"][0]["array"] = "../../etc"
    payload = msgpack.packb(raw, use_bin_type=True)
    path.write_bytes(b"CKPT\x01" + hashlib.sha256(payload).digest() + payload)
    with pytest.raises(ManifestError, match="bad array name"):
        _reopen(root).checkout("main")


@pytest.mark.parametrize("kw", [
    {"state": {"\ud800": torch.zeros(2)}},        # a key with a lone surrogate
    {"state": {"a": "x\udc80"}},                  # a value (e.g. os.fsdecode of bad bytes)
    {"state": {"a": [{"\udfff": 1}]}},
    {"state": {"a": 1}, "message": "m\ud800"},
    {"state": {"a": 1}, "metadata": {"run": "\ud800"}},
])
def test_strings_that_are_not_text_are_refused_before_anything_is_written(tmp_path, kw):
    store = ckptstore.open(tmp_path / "s")
    with pytest.raises(UnsupportedLeafError, match="not valid Unicode text"):
        store.commit(**kw)
    assert sorted(os.listdir(tmp_path / "s")) == ["ckptstore.json"]
    store.commit({"a": "x\udc80".encode("utf-8", "surrogateescape")})  # as bytes it is stored
    assert store.checkout("main")["a"] == b"x\x80"
