"""Whole-array dedup (``EncodingOptions(dedup=True)``): unchanged tensors are referenced, not
written again; gc keeps what a retained commit points into; digests are checked like any field.
Chunk-level dedup: tests/store/test_chunk_dedup.py."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bit_exact

import ckptstore
from ckptstore import EncodingOptions
from ckptstore.history.manifest import BASE_VERSION, CHUNK_DIGESTS_VERSION, TensorEntry


def _frozen(n: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}": torch.randn(128, 256, generator=g) for i in range(n)}


def test_a_fine_tune_of_one_percent_stores_about_one_copy(open_backend_store):
    store = open_backend_store(options=EncodingOptions(dedup=True))
    frozen = _frozen()
    adapter = torch.zeros(128, 3)  # ~1 % of the parameters train
    total = 0
    states = []
    for step in range(10):
        adapter += 0.01 * (step + 1)
        states.append({"frozen": frozen, "adapter": adapter.clone(), "step": step})
        info = store.commit(states[-1])
        total += info.stored_bytes
        if step == 0:
            one_copy = info.stored_bytes
    assert total <= 1.1 * one_copy
    first = store.log()[-1].id
    for e in store.manifest(store.log()[0].id).tensors:
        if e.path.startswith("frozen."):
            assert e.commit == first and len(e.chunk_digests) == 64 and e.digest is None
    assert_bit_exact(store.checkout("main"), states[-1])
    assert store.verify().ok


def test_gc_keeps_arrays_that_later_commits_reuse(open_backend_store):
    store = open_backend_store(options=EncodingOptions(dedup=True))
    frozen = _frozen(3)
    for step in range(4):
        store.commit({"frozen": frozen, "step": step})
    store.gc(keep_last=1, grace_period=0)
    assert len(store.log()) == 1
    assert_bit_exact(store.checkout("main"), {"frozen": frozen, "step": 3})
    assert store.verify().ok


def test_changed_bits_or_encoding_are_written(tmp_path):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(dedup=True))
    w = torch.randn(256, 256)
    a = store.commit({"w": w})
    w[3, 4] = float(w[3, 4]) + 1e-6  # one element: another digest
    b = store.commit({"w": w})
    assert store.manifest(b.id).tensors[0].commit == b.id and b.stored_bytes > 100_000
    other = ckptstore.open(tmp_path / "s", options=EncodingOptions(dedup=True,
                                                                   compression="none"))
    c = other.commit({"w": w})  # same bits, another codec: not the parent's array
    assert other.manifest(c.id).tensors[0].commit == c.id
    d = other.commit({"w": w})
    assert other.manifest(d.id).tensors[0].commit == c.id and d.stored_bytes < 1000
    assert store.manifest(a.id).format_version == CHUNK_DIGESTS_VERSION


def test_without_dedup_manifests_stay_format_1(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    info = store.commit({"w": torch.randn(256, 256)})
    m = store.manifest(info.id)
    assert m.format_version == BASE_VERSION and m.tensors[0].digest is None


@pytest.mark.parametrize("digest", ["sha256:xyz", "md5:" + "0" * 32, "sha256:" + "0" * 63])
def test_malformed_digests_are_refused(digest):
    with pytest.raises(ValueError):
        TensorEntry(path="w", dtype="float32", shape=[1], layout="array",
                    commit="0" * 32, array="w", codec={"id": "raw"}, chunks=[1], digest=digest)


def test_same_bits_under_another_path_get_an_array_of_their_own(tmp_path):
    """The whole-array reference is by path; the chunks are shared by content (links)."""
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(dedup=True))
    w = torch.randn(256, 256)
    store.commit({"a": w})
    info = store.commit({"b": w})
    entry = store.manifest(info.id).tensors[0]
    assert entry.commit == info.id and entry.array != "a"
    assert info.stored_bytes < 2000  # its zarr.json: the chunk is a link
    assert_bit_exact(store.checkout("main"), {"b": w})


def test_a_parent_with_only_a_whole_array_digest_is_still_reused(tmp_path):
    """A parent committed before format 6 recorded one sha256 of the whole array (``digest``)
    and no chunk digests: the next commit computes that digest to compare, and reuses."""
    from ckptstore.format.layout import manifest_key
    from ckptstore.history.manifest import XOR_VERSION, decode_manifest, encode_manifest

    root = tmp_path / "s"
    frozen = _frozen(2)
    first = ckptstore.open(root, options=EncodingOptions(dedup=True)).commit({"frozen": frozen})
    path = root / manifest_key(first.id)
    m = decode_manifest(path.read_bytes())
    from ckptstore.commit.dedup import content_digest
    old = [e.model_copy(update={"chunk_digests": None, "digest": content_digest(
        frozen[e.path.split(".")[1]].numpy())}) for e in m.tensors]
    path.write_bytes(encode_manifest(m.model_copy(update={"tensors": old,
                                                           "format_version": XOR_VERSION})))
    store = ckptstore.open(root, options=EncodingOptions(dedup=True))
    second = store.commit({"frozen": frozen})
    assert second.stored_bytes < 2048
    entries = store.manifest(second.id).tensors
    assert {e.commit for e in entries} == {first.id} and all(e.digest for e in entries)
    assert_bit_exact(store.checkout("main"), {"frozen": frozen})
