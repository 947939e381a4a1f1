"""Hostile stores: manifests with valid checksums that lie. A reader bounds what they make it
allocate or walk by what the store holds (ckptstore.limits), refuses names that are not one
safe path component, and verify compares the zarr metadata plain zarr reads with the manifest.
Each test checks the error type, that nothing huge was walked, and that the store is unchanged."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import torch

import ckptstore
from ckptstore.errors import CorruptedChunkError, InvalidRefName, ManifestError
from ckptstore.layout import ZARR_JSON, array_dir, check_ref_name, data_dir, manifest_key
from ckptstore.limits import READ_LIMITS
from ckptstore.manifest import Manifest, encode_manifest
from ckptstore.storage import Storage

Raw = dict[str, Any]


def _contents(storage: Storage) -> dict[str, bytes]:
    return {k: storage.read(k) for k in storage.walk_sizes("")}


def _entry(raw: Raw, path: str) -> Raw:
    return next(e for e in raw["tensors"] if e["path"] == path)


def _rewrite(storage: Storage, commit: str, change: Callable[[Raw], None], validate: bool = True
             ) -> None:
    """Store a changed manifest of ``commit`` with a valid checksum: through the model and
    ``encode_manifest`` where it still validates, else framed by hand (names the model refuses)."""
    key = manifest_key(commit)
    data = storage.read(key)
    raw = msgpack.unpackb(data[37:], strict_map_key=False)
    change(raw)
    if validate:
        storage.put(key, encode_manifest(Manifest.model_validate(raw)))
    else:
        payload = msgpack.packb(raw, use_bin_type=True)
        storage.put(key, data[:5] + hashlib.sha256(payload).digest() + payload)


@pytest.fixture
def hostile(open_backend_store):
    """``(open, commit id)``: a store holding ``w`` (300,000 floats, 1 chunk of 8 MiB at most),
    ``m`` (1000 x 300) and a packed ``b``; ``open()`` opens it again (no cached manifests)."""
    store = open_backend_store()
    info = store.commit({"w": torch.randn(300_000), "m": torch.randn(1000, 300),
                         "b": torch.ones(4)}, message="ok")
    return open_backend_store, info.id


def _both_refuse(open_: Callable[[], ckptstore.Store], commit: str, text: str) -> None:
    """checkout raises ManifestError, verify reports the same without walking the grid."""
    store = open_()
    with pytest.raises(ManifestError, match=re.escape(text)):
        store.checkout(commit)
    report = store.verify(commit)
    assert not report.ok and any(text in p for p in report.problems), report.problems
    assert report.chunks_checked <= 5 and len(report.problems) <= 3  # nothing was walked


@pytest.mark.parametrize("chunks", [None, [1]], ids=["stored-chunk-size", "one-row-chunks"])
def test_a_huge_shape_is_refused_before_allocating_or_walking(hostile, chunks):
    open_, commit = hostile
    storage = open_().storage

    def huge(raw: Raw) -> None:
        w = _entry(raw, "w")
        w["shape"] = [10**10]  # 37 GiB of float32 whose chunks the store does not hold
        w["chunks"] = chunks or w["chunks"]

    _rewrite(storage, commit, huge)
    before = _contents(storage)
    text = "declares 33334 chunks but the store holds 1" if chunks is None else \
        f"beyond what a reader accepts ({READ_LIMITS.max_chunks} chunks"
    _both_refuse(open_, commit, text)
    assert _contents(storage) == before


def test_a_few_chunks_beyond_the_store_are_named_as_missing(hostile):
    """A grid a few chunks larger than stored is damage: each missing chunk is named, and
    checkout fails before allocating the array."""
    open_, commit = hostile
    storage = open_().storage

    def grow(raw: Raw) -> None:
        w = _entry(raw, "w")
        w["shape"] = [3 * w["chunks"][0]]

    _rewrite(storage, commit, grow)
    before = _contents(storage)
    store = open_()
    w = array_dir(commit, "w")
    with pytest.raises(CorruptedChunkError, match="is missing") as err:
        store.checkout(commit)
    assert err.value.path == f"{w}/c/1"
    problems = store.verify(commit).problems
    assert [p for p in problems if "missing" in p] == [f"{w}/c/1: missing", f"{w}/c/2: missing"]
    assert any(p.startswith(f"{w}/{ZARR_JSON}: does not match the manifest (shape")
               for p in problems)
    assert _contents(storage) == before


def test_one_huge_chunk_is_refused(hostile):
    open_, commit = hostile
    storage = open_().storage

    def one_chunk(raw: Raw) -> None:
        _entry(raw, "w").update(shape=[10**10], chunks=[10**10])  # 1 chunk "stored", 40 GB

    _rewrite(storage, commit, one_chunk)
    before = _contents(storage)
    _both_refuse(open_, commit, "chunks of 40000000000 bytes")
    assert _contents(storage) == before


def test_a_huge_packed_array_is_refused(hostile):
    open_, commit = hostile
    storage = open_().storage
    _rewrite(storage, commit, lambda raw: raw["packed"].update(nbytes=10**12))
    before = _contents(storage)
    _both_refuse(open_, commit, "declares")
    assert _contents(storage) == before


def test_other_dimensions_are_a_clear_error(tmp_path):
    """One more or one fewer dimension than stored: chunk keys meet folders or files."""
    root = tmp_path / "s"
    store = ckptstore.open(root)
    commit = store.commit({"w": torch.randn(30000), "m": torch.randn(1000, 30)}).id

    def reshape(raw: Raw) -> None:
        _entry(raw, "m").update(shape=[30000], chunks=[30000])      # c/0 is a folder
        _entry(raw, "w").update(shape=[30000, 1], chunks=[30000, 1])  # c/0 is a file

    _rewrite(store.storage, commit, reshape)
    before = _contents(store.storage)
    reopened = ckptstore.open(root, create=False)
    with pytest.raises(CorruptedChunkError, match="manifest's dimensions disagree"):
        reopened.checkout(commit)
    problems = reopened.verify(commit).problems
    for name in ("m", "w"):
        assert any(p.startswith(f"{array_dir(commit, name)}/{ZARR_JSON}: does not match")
                   and "shape" in p for p in problems), problems
        assert any(p.startswith(f"{array_dir(commit, name)}/c/0") and "not a chunk" in p
                   for p in problems), problems
    assert _contents(store.storage) == before


@pytest.mark.parametrize("name", ["a\\b", "..\\..\\evil", "a\0b", "C:evil", "a\nb", "..", "a/b",
                                  "__x", "é"])
@pytest.mark.parametrize("where", ["tensor", "packed"])
def test_array_names_that_are_not_one_safe_path_component(hostile, name, where):
    open_, commit = hostile
    storage = open_().storage

    def rename(raw: Raw) -> None:
        if where == "tensor":
            _entry(raw, "w")["array"] = name
        else:
            raw["packed"]["array"] = name

    _rewrite(storage, commit, rename, validate=False)
    before = _contents(storage)
    store = open_()
    with pytest.raises(ManifestError, match="bad (packed )?array name"):
        store.checkout(commit)
    report = store.verify(commit)
    assert len(report.problems) == 1 and "bad" in report.problems[0]
    assert _contents(storage) == before


def test_array_keys_refuse_unsafe_names():
    good = "0123456789abcdef0123456789abcdef"
    assert array_dir(good, "r0.model.emb~3.xvalues") == f"data/{good}/r0.model.emb~3.xvalues"
    for commit, name in [(good, "a\\b"), (good, "x\0"), (good, ".."), (good + "\n", "w"),
                         ("../" + good[3:], "w")]:
        with pytest.raises(ManifestError, match="not a name ckptstore writes"):
            array_dir(commit, name)


def test_ref_names_are_matched_whole(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    commit = store.commit({"w": torch.ones(3)}).id
    for name in ("main\n", "x\0", "a\\b"):
        with pytest.raises(InvalidRefName):
            check_ref_name(name)
        with pytest.raises(InvalidRefName):
            store.branch(name, commit)
    assert sorted(p.name for p in (tmp_path / "s" / "refs" / "heads").iterdir()) == ["main"]


def test_a_ref_file_of_other_unicode_digits_is_not_a_move(tmp_path):
    """int() reads full-width digits; a ref file so named is not one of the branch's moves."""
    store = ckptstore.open(tmp_path / "s")
    commit = store.commit({"w": torch.ones(3)}).id
    store.storage.put("refs/heads/main/" + "\uff10" * 11 + "\uff11", (commit + "\n").encode())
    reopened = ckptstore.open(tmp_path / "s", create=False)
    assert reopened.repo.refs.tip("main") == (0, commit)
    assert torch.equal(reopened.checkout("main")["w"], torch.ones(3))


def _edit_json(storage: Storage, key: str, change: Callable[[dict], None]) -> None:
    doc = json.loads(storage.read(key))
    change(doc)
    storage.put(key, json.dumps(doc).encode())


@pytest.mark.parametrize("field,value", [
    ("shape", [300001]),
    ("data_type", "float64"),
    ("chunk_grid", {"name": "regular", "configuration": {"chunk_shape": [1000]}}),
    ("codecs", [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]),
    ("node_type", "group"),
])
def test_verify_compares_array_metadata_with_the_manifest(hostile, field, value):
    """What plain zarr reads must be what the manifest says: a flipped digit is a problem."""
    open_, commit = hostile
    storage = open_().storage
    where = f"{array_dir(commit, 'w')}/{ZARR_JSON}"
    _edit_json(storage, where, lambda doc: doc.update({field: value}))
    report = open_().verify(commit)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(f"{where}: does not match the manifest ({field} ")


@pytest.mark.parametrize("damage", ["node_type", "missing", "garbage"])
def test_verify_checks_the_group_metadata(hostile, damage):
    open_, commit = hostile
    storage = open_().storage
    where = f"{data_dir(commit)}/{ZARR_JSON}"
    if damage == "node_type":
        _edit_json(storage, where, lambda doc: doc.update(node_type="array"))
    elif damage == "missing":
        storage.delete(where)
    else:
        storage.put(where, b"\xff[")
    report = open_().verify(commit)
    assert report.problems == [p for p in report.problems if p.startswith(f"{where}: ")]
    assert len(report.problems) == 1


def test_an_honest_store_passes_every_check(hostile):
    open_, commit = hostile
    report = open_().verify(commit)
    assert report.ok and report.chunks_checked >= 3, report.problems
