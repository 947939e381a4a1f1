"""The "same bytes" guard: what each encoding policy writes, as a fingerprint two revisions share.

For every scenario (a policy, or the 2-rank sharded commit) a deterministic 7-commit sequence of a
small seeded training state is committed into a fresh local store through PUBLIC API only
(``ckptstore.open``, ``Store.commit``, ``ckptstore.EncodingOptions`` / ``Policy`` / ``QuantSpec``,
``ckptstore.policy.Shrink``, ``ckptstore.dcp.StorageWriter``), then the store's files are read
back raw:

* every file under ``data/<commit>/`` becomes ``chunks[array][chunk]`` = sha256 of its bytes, the
  commit id replaced by its ordinal in the sequence (``zarr.json`` documents are hashed with the
  ids in their text replaced the same way: none are today);
* every manifest is unframed (``CKPT`` | format version | sha256 | msgpack) and decoded by hand
  (no ckptstore code, so the guard survives moving ``manifest.py``), ids replaced by ordinals
  (``@0`` .. ``@6``), and only the fields listed in :data:`RUN_DEPENDENT` dropped;
* ref files and the store marker are kept too (ids replaced).

:func:`digest` condenses a fingerprint for ``tests/data/same_bytes.json`` (one hash per array and
per manifest entry, so a failure still names the array or tensor); :func:`compare` lists the
differences. Used by ``tests/compat/test_same_bytes.py`` and ``benchmarks/same_bytes_revisions.py``.

The state is made with NumPy's generator (``default_rng``: the same numbers on every platform)
and updated with float32 elementwise arithmetic, so the tensors themselves never depend on the
machine, the thread count or the torch build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

import ckptstore

__all__ = ["COMMITS", "RUN_DEPENDENT", "SCENARIOS", "compare", "digest", "fingerprint",
           "load", "dump", "state_at"]

COMMITS = 7
SEED = 27
ROWS, DIM = 2048, 32
#: manifest fields that differ between two runs of the same code on the same machine (found by
#: fingerprinting twice, see test_same_bytes.py): ``time`` (the wall clock of the commit). The
#: commit ids (``id``, ``parent``, ``commit``, ``base_commit`` ...) are not dropped but replaced
#: by their ordinal, wherever they occur (the sha256 in the manifest's frame covers ``time``, so
#: it is dropped with it; the payload it covers is compared field by field instead).
RUN_DEPENDENT = ("time",)
_ID = re.compile(r"[0-9a-f]{32}")

Fingerprint = dict[str, list[dict[str, Any]]]


# -- the training state ------------------------------------------------------------------------
def state_at(step: int) -> dict[str, Any]:
    """The state of commit ``step`` (0..6): a model (an embedding table with a few rows changed
    per step, dense layers, one of them frozen, a bf16 tensor), Adam-like moments, plain leaves.
    """
    rng = np.random.default_rng(SEED)
    f32 = np.float32
    emb = rng.standard_normal((ROWS, DIM), dtype=f32)
    fc1 = rng.standard_normal((256, 128), dtype=f32) * f32(0.05)
    fc2 = rng.standard_normal((128, 128), dtype=f32) * f32(0.05)
    b1 = rng.standard_normal(128, dtype=f32)
    norm = rng.standard_normal((256, 128), dtype=f32)
    m = [np.zeros_like(emb), np.zeros_like(fc1)]
    v = [np.zeros_like(emb), np.zeros_like(fc1)]
    for k in range(1, step + 1):
        rows = rng.choice(ROWS, 8, replace=False)
        g_emb = np.zeros_like(emb)
        g_emb[rows] = rng.standard_normal((8, DIM), dtype=f32)
        g_fc1 = rng.standard_normal(fc1.shape, dtype=f32)
        emb[rows] -= f32(0.01) * g_emb[rows]
        fc1 -= f32(0.001) * g_fc1
        if k % 3 == 0:  # a bias that moves now and then: dedup and zero deltas in between
            b1 += f32(0.01)
        if k % 2 == 0:
            norm += f32(0.01) * rng.standard_normal(norm.shape, dtype=f32)
        for i, g in enumerate((g_emb, g_fc1)):
            m[i] = f32(0.9) * m[i] + f32(0.1) * g
            v[i] = f32(0.999) * v[i] + f32(0.001) * (g * g)
    t = torch.from_numpy
    return {
        "model": {"emb.weight": t(emb.copy()), "fc1.weight": t(fc1.copy()),
                  "fc1.bias": t(b1.copy()), "fc2.weight": t(fc2.copy()),
                  "norm.weight": t(norm.copy()).to(torch.bfloat16)},
        "optim": {"state": {i: {"step": torch.tensor(float(step)), "exp_avg": t(m[i].copy()),
                                "exp_avg_sq": t(v[i].copy())} for i in range(2)},
                  "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}]},
        "step": step,
        "note": f"commit {step}",
    }


# -- the scenarios -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """One 7-commit sequence: store options, the policy, and which path commits (``commit``,
    ``commit_async`` or ``sharded``: two ranks through ``ckptstore.dcp.StorageWriter``)."""

    options: dict[str, Any]
    policy: Callable[[], Any]
    via: str = "commit"


def _q(**kw: Any) -> Any:
    return ckptstore.QuantSpec(**kw)


def _shrink() -> Any:
    from ckptstore.policy import Shrink
    return Shrink(pairs=(("model.emb.weight", "optim.state.0.exp_avg", "optim.state.0.exp_avg_sq"),
                         ("model.fc1.weight", "optim.state.1.exp_avg", "optim.state.1.exp_avg_sq")))


P = lambda **kw: (lambda: ckptstore.Policy(**kw))  # noqa: E731
SCENARIOS: dict[str, Scenario] = {
    "lossless": Scenario({}, P()),
    "lossless-lz4": Scenario({"compression": "lz4"}, P()),
    "quant-uniform8": Scenario({}, P(quantize=_q(bits=8))),
    "quant-adaptive4": Scenario({}, P(quantize=_q(bits=4))),
    "quant-kmeans3": Scenario({}, P(quantize=_q(method="kmeans", bits=3))),
    "rows-one-shot": Scenario({}, P(incremental="one-shot", max_chain=4)),
    "rows-consecutive": Scenario({}, P(incremental="consecutive", max_chain=4)),
    "rows-consecutive-q8": Scenario({}, P(incremental="consecutive", quantize=_q(bits=8))),
    "codes": Scenario({}, P(quantize=_q(bits=8), delta=True, max_chain=4)),
    "xor": Scenario({}, P(delta=True, max_chain=4)),
    "shrink": Scenario({}, P(shrink=_shrink())),
    "dedup": Scenario({"dedup": True}, P()),
    "quant-device8": Scenario({"device_encode": "always"}, P(quantize=_q(bits=8))),
    "codes-device": Scenario({"device_encode": "always"},
                             P(quantize=_q(bits=8), delta=True, max_chain=4)),
    "xor-async": Scenario({}, P(delta=True, max_chain=4), via="commit_async"),
    "rows-async-q8": Scenario({}, P(incremental="consecutive", quantize=_q(bits=8)),
                              via="commit_async"),
    "sharded-2-ranks": Scenario({}, P(incremental="one-shot", min_rows=512), via="sharded"),
}
_BASE_OPTIONS = {"chunk_bytes": 64 * 1024}  # several chunks per table: chunk indices matter


# -- committing --------------------------------------------------------------------------------
def _commit_sharded(store: Any, state: dict[str, Any], policy: Any, message: str) -> str:
    """Commit ``state`` as two ranks would through DCP (``ckptstore.dcp.StorageWriter``), in one
    process: the table split by rows between the ranks, other tensors each written by one rank,
    the plain leaves by rank 0."""
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import (SavePlan, TensorWriteData, WriteItem,
                                                      WriteItemType)

    from ckptstore.dcp import StorageWriter

    flat = {f"model.{k}": v for k, v in state["model"].items()}
    flat.update({f"optim.{i}.{k}": v for i, s in state["optim"]["state"].items()
                 for k, v in s.items()})
    values = {"step": state["step"], "note": state["note"]}
    blocks: list[dict[tuple[str, tuple[int, ...]], torch.Tensor]] = [{}, {}]
    md: dict[str, Any] = {}
    for n, (fqn, t) in enumerate(flat.items()):
        if fqn == "model.emb.weight":
            half = t.shape[0] // 2
            parts = [(0, (0, 0), t[:half]), (1, (half, 0), t[half:])]
        else:  # written by one rank, alternately
            parts = [(n % 2, (0,) * t.dim(), t)]
        for r, off, x in parts:
            blocks[r][(fqn, off)] = x
        md[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=t.dtype), torch.Size(t.shape),
            [ChunkStorageMetadata(torch.Size(off), x.shape) for _, off, x in parts])
    md.update({k: BytesStorageMetadata() for k in values})

    class _Planner:  # what StorageWriter.write_data asks of DCP's planner
        def __init__(self, tensors: Mapping[tuple[str, tuple[int, ...]], torch.Tensor]):
            self.tensors = tensors

        def resolve_data(self, item: WriteItem) -> torch.Tensor:
            return self.tensors[(item.index.fqn, tuple(item.index.offset))]

        def lookup_object(self, index: MetadataIndex) -> Any:
            return values[index.fqn]

    def items(r: int) -> list[WriteItem]:
        out = [WriteItem(index=MetadataIndex(f, torch.Size(o)), type=WriteItemType.SHARD,
                         tensor_data=TensorWriteData(ChunkStorageMetadata(torch.Size(o), x.shape),
                                                     TensorProperties(dtype=x.dtype),
                                                     torch.Size(flat[f].shape)))
               for (f, o), x in blocks[r].items()]
        if r == 0:
            out += [WriteItem(index=MetadataIndex(k), type=WriteItemType.BYTE_IO) for k in values]
        return out

    writers = [StorageWriter(store, message=message, policy=policy) for _ in range(2)]
    for r, w in enumerate(writers):
        w.set_up_storage_writer(r == 0, rank=r)
    plans = writers[0].prepare_global_plan(
        [w.prepare_local_plan(SavePlan(items(r))) for r, w in enumerate(writers)])
    results = [w.write_data(p, _Planner(blocks[r])).wait()  # type: ignore[arg-type]
               for r, (w, p) in enumerate(zip(writers, plans))]
    writers[0].finish(Metadata(state_dict_metadata=md), results)
    assert writers[0].last_commit is not None
    return writers[0].last_commit.id


def run(name: str, root: str, io_workers: int | None = None) -> list[str]:
    """Commit scenario ``name``'s sequence into a new store at ``root``; the commit ids."""
    sc = SCENARIOS[name]
    options = ckptstore.EncodingOptions(**{**_BASE_OPTIONS, **sc.options})
    policy = sc.policy()
    ids = []
    with ckptstore.open(root, options=options, policy=policy, io_workers=io_workers,
                        durable=False) as store:  # fsync changes no byte
        for step in range(COMMITS):
            state, message = state_at(step), f"{name} {step}"
            if sc.via == "sharded":
                ids.append(_commit_sharded(store, state, policy, message))
            elif sc.via == "commit_async":
                ids.append(store.commit_async(state, message=message).wait().id)
            else:
                ids.append(store.commit(state, message=message).id)
    return ids


# -- reading a store back raw ------------------------------------------------------------------
def _normalise(value: Any, ordinals: Mapping[str, str]) -> Any:
    """JSON-able ``value`` with commit ids replaced by ``@<ordinal>``."""
    if isinstance(value, str):
        return _ID.sub(lambda m: ordinals.get(m.group(0), m.group(0)), value)
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, Mapping):
        return {str(_normalise(k, ordinals)): _normalise(v, ordinals) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, ordinals) for v in value]
    return value


def _manifest(raw: bytes, ordinals: Mapping[str, str]) -> dict[str, Any]:
    if raw[:4] != b"CKPT":
        raise ValueError("not a framed manifest")
    payload = msgpack.unpackb(raw[37:], raw=False, strict_map_key=False)
    out = {k: _normalise(v, ordinals) for k, v in payload.items() if k not in RUN_DEPENDENT}
    out["frame_version"] = raw[4]
    return out


def read_store(root: str, ids: Sequence[str]) -> list[dict[str, Any]]:
    """Each commit's normalised chunk map and manifest, from the files of the store at ``root``."""
    ordinals = {cid: f"@{i}" for i, cid in enumerate(ids)}
    commits: list[dict[str, Any]] = []
    for cid in ids:
        chunks: dict[str, dict[str, str]] = {}
        data = os.path.join(root, "data", cid)
        for folder, _, files in os.walk(data):
            for f in files:
                rel = os.path.relpath(os.path.join(folder, f), data).replace(os.sep, "/")
                with open(os.path.join(folder, f), "rb") as fh:
                    raw = fh.read()
                if f == "zarr.json":  # text: ids (if any) replaced
                    array, chunk = rel[:-len("zarr.json")].rstrip("/") or ".", "zarr.json"
                    raw = _normalise(raw.decode(), ordinals).encode()
                else:
                    array, _, index = rel.partition("/c/")
                    array, chunk = (array, index.replace("/", ".")) if index else (".", rel)
                chunks.setdefault(array, {})[chunk] = hashlib.sha256(raw).hexdigest()
        with open(os.path.join(root, "commits", f"{cid}.msgpack"), "rb") as fh:
            manifest = _manifest(fh.read(), ordinals)
        commits.append({"chunks": {a: dict(sorted(c.items())) for a, c in sorted(chunks.items())},
                        "manifest": manifest})
    others = {}
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        if rel.split("/")[0] in ("data", "commits"):
            continue
        for f in files:
            with open(os.path.join(folder, f), "rb") as fh:
                others[_normalise(f"{rel}/{f}", ordinals)] = _normalise(
                    fh.read().decode(errors="replace"), ordinals)
    commits[-1]["store_files"] = dict(sorted(others.items()))
    return commits


def fingerprint(names: Iterable[str] | None = None, io_workers: int | None = None,
                tmp: str | None = None) -> Fingerprint:
    """Run each scenario (default: all) in a temporary store and read it back."""
    out: Fingerprint = {}
    base = tempfile.mkdtemp(prefix="same-bytes-", dir=tmp)
    try:
        for name in names or SCENARIOS:
            root = os.path.join(base, name)
            out[name] = read_store(root, run(name, root, io_workers))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


# -- condensing and comparing ------------------------------------------------------------------
def _h(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _condense_manifest(m: Mapping[str, Any]) -> dict[str, Any]:
    """Scalars kept, entry lists hashed per entry (``tensors[path]``), other structures hashed."""
    out: dict[str, Any] = {}
    for k, v in m.items():
        if isinstance(v, list) and v and all(isinstance(e, dict) and "path" in e for e in v):
            for i, e in enumerate(v):
                out[f"{k}[{e['path']}]" + (f"#{i}" if f"{k}[{e['path']}]" in out else "")] = _h(e)
        elif isinstance(v, (dict, list)):
            out[k] = _h(v)
        else:
            out[k] = v
    return out


def digest(fp: Fingerprint) -> Fingerprint:
    """``fp`` condensed: one hash per array (over its chunk names and hashes) and per manifest
    entry; what ``tests/data/same_bytes.json`` holds. Idempotent."""
    out: Fingerprint = {}
    for name, commits in fp.items():
        out[name] = []
        for c in commits:
            if "chunks" not in c:  # already condensed
                out[name].append(c)
                continue
            d = {"arrays": {a: _h(ch) for a, ch in c["chunks"].items()},
                 "manifest": _condense_manifest(c["manifest"])}
            if "store_files" in c:
                d["store_files"] = _h(c["store_files"])
            out[name].append(d)
    return out


def _diff_maps(where: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out = []
    for k in sorted(set(a) | set(b), key=str):
        if k not in b:
            out.append(f"{where} {k}: missing (expected {a[k]!r})")
        elif k not in a:
            out.append(f"{where} {k}: unexpected (got {b[k]!r})")
        elif a[k] != b[k]:
            out.append(f"{where} {k}: expected {a[k]!r}, got {b[k]!r}")
    return out


def compare(expected: Fingerprint, got: Fingerprint, detail: bool = True) -> list[str]:
    """The differences, one line each, naming scenario, commit ordinal and array or manifest
    entry. With two full fingerprints and ``detail``, differing arrays list their chunks."""
    lines: list[str] = []
    de, dg = digest(expected), digest(got)
    for name in sorted(set(de) & set(dg)):
        if len(de[name]) != len(dg[name]):
            lines.append(f"{name}: {len(de[name])} commits expected, {len(dg[name])} made")
        for i, (a, b) in enumerate(zip(de[name], dg[name])):
            where = f"{name} commit {i}"
            lines += _diff_maps(f"{where} array", a["arrays"], b["arrays"])
            lines += _diff_maps(f"{where} manifest", a["manifest"], b["manifest"])
            if a.get("store_files") != b.get("store_files"):
                lines.append(f"{where}: refs or store marker differ")
            full = detail and "chunks" in expected[name][i] and "chunks" in got[name][i]
            for arr in sorted(set(a["arrays"]) & set(b["arrays"])) if full else ():
                if a["arrays"][arr] != b["arrays"][arr]:
                    lines += _diff_maps(f"{where} array {arr} chunk",
                                        expected[name][i]["chunks"][arr],
                                        got[name][i]["chunks"][arr])
    for name in sorted(set(de) ^ set(dg)):
        lines.append(f"{name}: only in {'expected' if name in de else 'got'}")
    return lines


def dump(fp: Fingerprint, path: str, meta: Mapping[str, Any]) -> None:
    """Write ``digest(fp)`` with ``meta`` (what made it) as JSON."""
    with open(path, "w") as f:
        json.dump({"meta": dict(meta), "scenarios": digest(fp)}, f, indent=0, sort_keys=True)
        f.write("\n")


def load(path: str) -> tuple[dict[str, Any], Fingerprint]:
    """``(meta, condensed fingerprint)`` from a file written by :func:`dump`."""
    with open(path) as f:
        data = json.load(f)
    return data["meta"], data["scenarios"]
