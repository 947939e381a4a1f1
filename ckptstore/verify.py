"""Check that every chunk of a set of commits exists and passes its checksum."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import ChunkGrid, storage_dtype, torch_dtype
from .chunkcodec import check_crc, codec_from_config
from .errors import CkptStoreError, CorruptedChunkError
from .info import VerifyReport
from .layout import data_dir
from .plan import PACKED_ARRAY

if TYPE_CHECKING:
    from .store import Store

__all__ = ["verify"]

_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"}


def _arrays(store: Store, commit_id: str) -> list[tuple[str, ChunkGrid, np.dtype, dict]]:
    """(prefix, shape, dtype, codec config) of every array a commit reads."""
    m = store.manifest(commit_id)
    out = []
    for e in m.tensors:
        for b in (e.parts or {}).values():
            out.append((f"{data_dir(b.commit)}/{b.array}", ChunkGrid.checked(b.shape, b.chunks),
                        np.dtype(b.dtype) if b.dtype in _DTYPES else np.dtype(np.uint8), b.codec))
    for e in (*m.tensors, *m.storages):
        if e.layout == "array":
            out.append((f"{data_dir(e.commit)}/{e.array}", ChunkGrid.checked(e.shape, e.chunks),
                        storage_dtype(torch_dtype(e.dtype)), e.codec))
    if m.packed is not None:
        out.append((f"{data_dir(m.id)}/{PACKED_ARRAY}",
                    ChunkGrid.checked([m.packed.nbytes], m.packed.chunks), np.dtype(np.uint8),
                    m.packed.codec))
    return out


def verify(store: Store, ref: str | None = None, progress: bool = False) -> VerifyReport:
    """Read every chunk of ``ref``'s commit (or of all commits reachable from refs) and report
    missing, unreadable or corrupted ones by path."""
    report = VerifyReport()
    commits = [store.resolve(ref)] if ref is not None else store.reachable()
    arrays: dict[str, Any] = {}
    for c in commits:
        try:
            for prefix, grid, dtype, codec in _arrays(store, c):
                arrays[prefix] = (grid, dtype, codec)
        except CkptStoreError as e:
            report.problems.append(f"commit {c}: {e}")
        report.commits_checked += 1

    jobs = []
    for prefix, (grid, dtype, codec_cfg) in arrays.items():
        if codec_cfg.get("id") == "qdelta":  # code deltas: checksum only (no zarr metadata)
            jobs += [(f"{prefix}/{key}", grid, dtype, None) for _, key, _, _ in grid]
            continue
        try:
            meta = json.loads(store.storage.read(f"{prefix}/zarr.json"))
            if meta.get("shape") != list(grid.shape) or meta.get("data_type") != dtype.name:
                report.problems.append(f"{prefix}/zarr.json: does not match the manifest")
        except (FileNotFoundError, ValueError) as e:
            report.problems.append(f"{prefix}/zarr.json: missing or unreadable ({e})")
        codec = codec_from_config(codec_cfg)
        for _, key, _, _ in grid:
            jobs.append((f"{prefix}/{key}", grid, dtype, codec))

    def check(job: tuple[str, ChunkGrid, np.dtype, Any]) -> tuple[int, str | None]:
        where, grid, dtype, codec = job
        try:
            data = store.storage.read(where)
            if codec is None:
                check_crc(data, where)
            else:
                codec.decode(data, np.empty(grid.chunks, dtype=dtype), where)
        except FileNotFoundError:
            return 0, f"{where}: missing"
        except CorruptedChunkError as e:  # "chunk <where> failed ..." -> "<where>: failed ..."
            reason = str(e).removeprefix(f"chunk {where} ")
            return len(data), f"{where}: {reason}"
        return len(data), None

    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(jobs), unit="chunk", desc="verify")
    for nbytes, problem in store._executor.map(check, jobs):
        report.chunks_checked += 1
        report.bytes_checked += nbytes
        if problem:
            report.problems.append(problem)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return report
