""""verify ok" means "checkout will succeed" (git's fsck habit): every hostile manifest crafted
here (a valid checksum, a lie inside) goes through both, and whenever checkout raises, verify
reports a problem. Neither ever raises anything but a ckptstore error, and log never hangs."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hostile import Raw, _entry, _rewrite

import ckptstore
from ckptstore import EncodingOptions, Policy
from ckptstore.errors import CkptStoreError, ManifestError
from ckptstore.chunkcodec import codec_from_config
from ckptstore.format.grid import ChunkGrid
from ckptstore.format.layout import array_dir, chunk_key
from ckptstore.dcp.shards import LocalTensor, commit_shards

OPTIONS = EncodingOptions(chunk_bytes=4096, pack_below=256)
OTHER = "0123456789abcdef0123456789abcdef"  # a commit the store does not hold


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
    emb[torch.randperm(1024, generator=g)[:64]] = torch.randn(64, 8, generator=g)
    base = torch.randn(16, 8, generator=g)
    tied = torch.randn(80, generator=g)
    return {"w": torch.randn(3000, generator=g), "m": torch.randn(64, 32, generator=g),
            "b": torch.ones(4) * seed, "s": np.float32(seed), "emb": emb,
            "tied": {"a": tied, "b": tied}, "views": {"base": base, "half": base[::2, 1:]}}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A local store: ``full`` (every layout), ``rows`` (``emb`` a row chain), ``xor`` (xor
    chains of the arrays)."""
    root = tmp_path_factory.mktemp("fsck") / "store"
    ids = {}
    with ckptstore.open(root, options=OPTIONS) as store:
        rows = Policy(incremental="consecutive", min_rows=512, min_quant_bytes=1024)
        xor = Policy(delta=True, min_quant_bytes=1024)
        ids["full"] = store.commit(_state(1), policy=rows).id
        ids["rows"] = store.commit(_state(2), policy=rows).id
        store.commit(_state(3), policy=xor)
        ids["xor"] = store.commit(_state(4), policy=xor).id
        g, sb = torch.randn(64, 8), torch.randn(8)  # two ranks' halves of two tensors
        ids["sharded"] = commit_shards(store, [
            [LocalTensor("g", (32 * r, 0), (64, 8), g[32 * r: 32 * r + 32]),
             LocalTensor("sb", (4 * r,), (8,), sb[4 * r: 4 * r + 4])] for r in range(2)]).id
    return root, ids


def _tree_add(node: Raw) -> Callable[[Raw, dict[str, str]], None]:
    return lambda raw, ids: raw["tree"]["dict"].append(["x", node])


def _set(path: str, **fields: Any) -> Callable[[Raw, dict[str, str]], None]:
    return lambda raw, ids: _entry(raw, path).update(fields)


def _part(path: str, part: str, **fields: Any) -> Callable[[Raw, dict[str, str]], None]:
    def change(raw: Raw, ids: dict[str, str]) -> None:
        parts = _entry(raw, path)["parts"]
        parts[part if part in parts else "x" + part].update(fields)  # values or xvalues
    return change


def _shard(path: str, **fields: Any) -> Callable[[Raw, dict[str, str]], None]:
    return lambda raw, ids: next(e for e in raw["shards"] if e["path"] == path).update(fields)


def _base(path: str, which: str) -> Callable[[Raw, dict[str, str]], None]:
    return lambda raw, ids: _entry(raw, path).update(base_commit=ids.get(which, which))


def _as_kind(path: str, kind: str, part: str) -> Callable[[Raw, dict[str, str]], None]:
    def change(raw: Raw, ids: dict[str, str]) -> None:
        e = _entry(raw, path)
        e["kind"], e["parts"] = kind, {part: next(iter(e["parts"].values()))}
    return change


# (commit changed, change) -- each a lie a checksum does not catch
CASES: dict[str, tuple[str, Callable[[Raw, dict[str, str]], None]]] = {
    "packed-shape-1e12": ("full", _set("b", shape=[10**12])),  # issue 26 item 8
    "packed-shape-overflow": ("full", _set("b", shape=[0, 2**62])),
    "packed-empty-overflow": ("full", _set("b", shape=[0, 2**62], nbytes=0)),
    "packed-bytes-mismatch": ("full", _set("b", shape=[5])),
    "packed-in-other-commit": ("full", _set("b", commit=OTHER)),
    "array-dim-overflow": ("full", _set("m", shape=[64, 2**62], chunks=[64, 2**62])),
    "array-empty-overflow": ("full", _set("m", shape=[0, 2**61], chunks=[1, 2**61])),
    "array-bad-chunks": ("full", _set("m", chunks=[0, 32])),
    "array-bad-codec": ("full", _set("m", codec={"id": "nope"})),
    "unknown-dtype": ("full", _set("w", dtype="float128")),
    "other-dtype-same-size": ("full", _set("w", dtype="int32")),
    "scalar-of-four": ("full", _set("b", container="numpy-scalar")),
    "scalar-of-empty-overflow": ("full", _set("s", shape=[0, 2**62], nbytes=0)),
    "tree-missing-tensor": ("full", _tree_add({"tensor": 99})),
    "tree-bad-node": ("full", _tree_add({"bogus": 1})),
    "tree-bad-index": ("full", _tree_add({"tensor": "0"})),
    "view-negative-stride": ("full", _set("views.half", stride=[-16, 1])),
    "view-reaches-outside": ("full", _set("views.half", storage_offset=10**6)),
    "view-wrong-rank": ("full", _set("views.half", stride=[16])),
    "view-other-dtype": ("full", _set("views.half", dtype="float64")),
    "view-of-numpy": ("full", lambda raw, ids: raw["storages"][0].update(container="numpy")),
    "view-empty-overflow": ("full", _set("views.half", shape=[0, 2**62])),
    "alias-of-other-shape": ("full", lambda raw, ids: _entry(raw, "tied.b").update(
        base=next(i for i, e in enumerate(raw["tensors"]) if e["path"] == "b"))),
    "chain-self-base": ("rows", _base("emb", "rows")),
    "chain-missing-base": ("rows", _base("emb", OTHER)),
    "chain-base-without-path": ("xor", lambda raw, ids: _entry(raw, "w").update(
        path="w2", base_commit=ids["full"])),
    "chain-shape-change": ("rows", _set("emb", shape=[1024, 9], chunks=[1024, 9])),
    "rows-values-shape": ("rows", _part("emb", "values", shape=[4, 9], chunks=[4, 9])),
    "rows-two-dim-rows": ("rows", _part("emb", "rows", shape=[4, 1], chunks=[4, 1])),
    "rows-of-floats": ("rows", _part("emb", "rows", dtype="float64")),
    "rows-as-xor": ("rows", _as_kind("emb", "xor", "xor")),
    "xor-blob-shape": ("xor", _part("w", "xor", shape=[2999])),
    "xor-blob-itemsize": ("xor", _part("w", "xor", dtype="float64")),
    "xor-as-residual": ("xor", _as_kind("w", "residual", "residual")),
    "xor-as-delta": ("xor", _as_kind("w", "delta", "codes")),
    "xor-on-rows": ("xor", _base("emb", "rows")),
    "shard-packed-bytes": ("sharded", _shard("sb@4", nbytes=8)),
    "shard-bad-chunks": ("sharded", _shard("g@32,0", chunks=[0, 8])),
    "shard-empty-overflow": ("sharded", _shard("sb@4", shape=[0, 2**62], nbytes=0)),
    "shard-of-other-commit": ("sharded", lambda raw, ids: raw["tensors"][0].update(
        commit=ids["full"])),
}
# lies checkout cannot see (it rebuilds other values); verify reports them from zarr.json
QUIET = {"other-dtype-same-size", "xor-as-residual"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_reports_whatever_checkout_refuses(template, tmp_path, case):
    root, ids = template
    copy = tmp_path / "store"
    shutil.copytree(root, copy)
    which, change = CASES[case]
    with ckptstore.open(copy, create=False) as store:
        _rewrite(store.storage, ids[which], lambda raw: change(raw, ids), validate=False)
    with ckptstore.open(copy, create=False) as store:
        try:
            store.checkout(ids[which])
            refused = None
        except CkptStoreError as e:  # anything else is a raw error: the test fails
            refused = e
        try:  # in place: the same checks, never a raw error
            store.checkout(ids[which], into=_state(9))
        except CkptStoreError:
            pass
        report = store.verify(ids[which])
        # every case is reported: what checkout refuses, and the quiet lies zarr.json shows
        assert not report.ok, f"checkout raised {refused!r}, verify said ok"
        assert refused is not None or case in QUIET, "not hostile enough"
        try:
            store.log(ids[which])
        except CkptStoreError:
            pass


def test_an_honest_template_checks_out_and_verifies(template, tmp_path):
    root, ids = template
    with ckptstore.open(root, create=False) as store:
        for c in ids.values():
            store.checkout(c)
        assert store.verify().ok


def test_verify_reads_the_row_indices_checkout_refuses(template, tmp_path):
    """An increment's ``rows`` chunks rewritten by a hostile hand, checksum and codec right:
    only the indices themselves (10**6 >= 1024 rows) tell."""
    root, ids = template
    shutil.copytree(root, tmp_path / "store")
    with ckptstore.open(tmp_path / "store", create=False) as store:
        rows = next(e for e in store.manifest(ids["rows"]).tensors if e.path == "emb").parts[
            "rows"]
        codec = codec_from_config(rows.codec)
        for _, key, _, _ in ChunkGrid.checked(rows.shape, rows.chunks):
            body, crc = codec.encode(np.full(rows.chunks, 10**6, dtype=np.dtype(rows.dtype)))
            store.storage.put(chunk_key(array_dir(rows.commit, rows.array), key),
                              bytes(body) + bytes(crc))
    with ckptstore.open(tmp_path / "store", create=False) as store:
        with pytest.raises(ManifestError, match="does not fit"):
            store.checkout(ids["rows"])
        problems = store.verify(ids["rows"]).problems
        assert problems and all("row indices outside the tensor's 1024 rows" in p
                                for p in problems), problems
