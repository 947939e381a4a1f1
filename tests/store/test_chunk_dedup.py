"""Chunk-level dedup (``EncodingOptions(dedup=True)``, manifest format 6): a chunk whose bits,
dtype, chunk shape and codec equal a chunk of the parent commit is linked, not encoded and sent;
every commit stays a plain zarr group; gc frees a shared chunk with its last user."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from helpers import assert_bit_exact, assert_older_reader_refuses

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.errors import ManifestError
from ckptstore.history.manifest import CHUNK_DIGESTS_VERSION, TensorEntry, decode_manifest, encode_manifest

CHUNK = 64 << 10  # 256 rows of 64 float32 a chunk: the table below has 16


def _table(seed: int = 0) -> torch.Tensor:
    return torch.randn(4096, 64, generator=torch.Generator().manual_seed(seed))


def _chunk_files(root: Path, commit: str) -> list[Path]:
    return [f for f in (root / "data" / commit).rglob("c/*/*") if f.is_file()]


@pytest.mark.every_backend
def test_a_table_with_two_changed_chunks_sends_two_per_copy(open_backend_store):
    """(Chunks are shared with the parent commit, not within a commit: the twin's two changed
    chunks are sent too.)"""
    store = open_backend_store(options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    emb = _table()
    first = store.commit({"emb": emb})
    emb[300:310] += 1.0      # chunk 1
    emb[4000] -= 1.0         # chunk 15
    second = store.commit({"emb": emb, "twin": emb.clone()})  # twin: all 16 chunks shared
    per_chunk = first.stored_bytes / 16
    assert second.stored_bytes < 4.5 * per_chunk
    entries = {e.path: e for e in store.manifest(second.id).tensors}
    assert entries["emb"].commit == second.id and len(entries["emb"].chunk_digests) == 16 * 64
    assert entries["twin"].chunk_digests == entries["emb"].chunk_digests
    assert store.manifest(second.id).format_version == CHUNK_DIGESTS_VERSION
    assert_bit_exact(store.checkout("main"), {"emb": emb, "twin": emb})
    assert_bit_exact(store.checkout(first.id), {"emb": _table()})
    assert store.verify().ok


def test_linked_chunks_are_hard_links_that_plain_zarr_reads_and_gc_keeps(tmp_path):
    root = tmp_path / "s"
    store = ckptstore.open(root, options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    emb = _table()
    first = store.commit({"emb": emb})
    emb[0] += 1.0
    second = store.commit({"emb": emb})
    links = [f.stat().st_nlink for f in _chunk_files(root, second.id)]
    assert sorted(links) == [1] + [2] * 15
    group = zarr.open_group(str(root / "data" / second.id), mode="r")
    assert np.array_equal(group[store.manifest(second.id).tensors[0].array][...], emb.numpy())
    store.gc(keep_last=1, grace_period=0)
    assert not (root / "data" / first.id).exists()
    assert {f.stat().st_nlink for f in _chunk_files(root, second.id)} == {1}
    assert_bit_exact(store.checkout("main"), {"emb": emb})
    assert store.verify().ok


def test_a_new_process_dedups_against_the_manifest_and_quantized_chunks_too(tmp_path):
    """The digests are in the manifest (nothing kept in memory); quantized full arrays encode a
    chunk to the same bytes whatever its neighbours, so they share chunks too."""
    policy = Policy(quantize=QuantSpec(bits=4), min_quant_bytes=1)
    emb = _table()
    stores = {}
    for name, dedup in (("dedup", True), ("plain", False)):
        opts = EncodingOptions(dedup=dedup, chunk_bytes=CHUNK)
        ckptstore.open(tmp_path / name, options=opts, policy=policy).commit({"emb": emb})
        again = ckptstore.open(tmp_path / name, options=opts, policy=policy)  # "restarted"
        changed = emb.clone()
        changed[1000] += 1.0
        stores[name] = (again, again.commit({"emb": changed}))
    (dedup_store, small), (plain_store, full) = stores["dedup"], stores["plain"]
    assert small.stored_bytes < full.stored_bytes / 8
    assert torch.equal(dedup_store.checkout("main")["emb"], plain_store.checkout("main")["emb"])


def test_a_vanished_source_chunk_is_written_instead(tmp_path):
    root = tmp_path / "s"
    store = ckptstore.open(root, options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    emb = _table()
    first = store.commit({"emb": emb})
    for f in _chunk_files(root, first.id):  # as if a concurrent gc had removed it
        f.unlink()
    emb[0] += 1.0
    second = store.commit({"emb": emb})
    assert second.stored_bytes > 0.9 * first.stored_bytes
    assert_bit_exact(store.checkout("main"), {"emb": emb})


def test_a_rewritten_chunk_never_changes_a_file_it_shares(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    storage = store.storage
    storage.put_chunk("data/a/c/0", b"old bytes")
    assert storage.link_chunk("data/a/c/0", "data/b/c/0")
    storage.put_chunk("data/b/c/0", b"new bytes")  # a retried write of the linked chunk
    assert storage.read("data/a/c/0") == b"old bytes"
    assert storage.read("data/b/c/0") == b"new bytes"
    assert not storage.link_chunk("data/gone/c/0", "data/c/c/0")


def test_older_readers_refuse_and_hostile_digests_are_manifest_errors(tmp_path):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    m = store.manifest(store.commit({"emb": _table()}).id)
    assert_older_reader_refuses(m, CHUNK_DIGESTS_VERSION - 1)
    entry = m.tensors[0].model_dump()
    digests = entry["chunk_digests"]
    for bad in (digests[:-64], digests + "0" * 64, digests[:-1] + "g", digests.upper()):
        with pytest.raises(ValueError, match="chunk_digests"):
            TensorEntry.model_validate({**entry, "chunk_digests": bad})
    with pytest.raises(ValueError, match="chunk_digests"):
        TensorEntry.model_validate({"path": "p", "dtype": "float32", "shape": [4],
                                    "layout": "packed", "commit": m.id, "offset": 0,
                                    "nbytes": 16, "chunk_digests": "0" * 64})
    forged = m.model_copy(update={"tensors": [m.tensors[0].model_copy(
        update={"chunk_digests": digests[:64]})]})  # model_copy skips validation
    with pytest.raises(ManifestError, match="chunk_digests"):
        decode_manifest(encode_manifest(forged))


def test_without_dedup_no_chunk_digests(tmp_path):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(chunk_bytes=CHUNK))
    m = store.manifest(store.commit({"emb": _table()}).id)
    assert m.tensors[0].chunk_digests is None and m.format_version < CHUNK_DIGESTS_VERSION
    assert os.path.isdir(tmp_path / "s" / "data" / m.id)


def test_du_counts_a_shared_chunk_once(tmp_path):
    from ckptstore.maintenance.usage import disk_usage

    root = tmp_path / "s"
    store = ckptstore.open(root, options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    emb = _table()
    for step in range(3):
        emb[step] += 1.0  # chunk 0 changes, 15 are shared by all three commits
        store.commit({"emb": emb})
    used = sum(f.stat().st_size for f in {os.stat(p).st_ino: p for p in root.rglob("*")
                                          if p.is_file()}.values())
    report = disk_usage(store.repo)
    assert abs(report.store_bytes - used) < 64  # rounding of the shares
    full = store.log()[-1].stored_bytes  # the first commit: all 16 chunks
    assert report.store_bytes < 1.3 * full  # three commits: 16 + 2 chunks, manifests, refs


def test_verify_finds_a_linked_chunk_with_other_bits(tmp_path):
    """A chunk that decodes and passes its checksum but holds another chunk's bits (what a
    wrong link would leave) is reported; a quantized array's digests (of the bits before
    quantizing) are not held against its decoded values."""
    root = tmp_path / "s"
    store = ckptstore.open(root, options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    emb = _table()
    store.commit({"emb": emb, "q": _table(1)}, policy=Policy(overrides=(
        ("q", QuantSpec(bits=8)),)))
    emb[0] += 1.0
    second = store.commit({"emb": emb})
    assert store.verify().ok
    chunks = {f.relative_to(root).as_posix(): f for f in _chunk_files(root, second.id)}
    wrong, linked = sorted(k for k in chunks if "/emb/" in k)[1:3]
    other = chunks[linked].with_suffix(".tmp")
    other.write_bytes(chunks[wrong].read_bytes())
    os.replace(other, chunks[linked])  # a new file: the first commit's link is untouched
    problems = store.verify(second.id).problems
    assert len(problems) == 1 and linked in problems[0] and "chunk_digests" in problems[0]


def test_a_rank_indexes_only_the_chunks_of_its_own_blocks(tmp_path):
    """Dedup.against(parent, paths): the chunk index of a sharded commit's rank holds its own
    blocks' chunks, not every rank's (a thousand ranks' manifests hold millions of chunks)."""
    from ckptstore.commit.dedup import Dedup

    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(dedup=True, chunk_bytes=CHUNK))
    m = store.manifest(store.commit({"a": _table(0), "b": _table(1)}).id)
    assert len(Dedup.against(m).chunks) == 32
    only_a = Dedup.against(m, {"a"})
    assert len(only_a.chunks) == 16 and set(only_a.previous) == {"a", "b"}
