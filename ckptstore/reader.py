"""Rebuild tensors of a commit from the store (the read half of ``checkout``)."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

import numpy as np
import torch

from .arrays import ChunkGrid, host_to_tensor, read_array, storage_dtype, torch_dtype
from .chunkcodec import codec_from_config
from .errors import ManifestError
from .fs import Storage
from .layout import data_dir
from .manifest import Manifest, TensorEntry
from .plan import PACKED_ARRAY

__all__ = ["read_tensors", "needed_entries"]


def needed_entries(m: Manifest, wanted: Iterable[int]) -> tuple[set[int], set[int]]:
    """Tensor and storage indices that must be read to rebuild ``wanted`` tensors."""
    tensors: set[int] = set()
    storages: set[int] = set()
    for i in wanted:
        e = m.tensors[i]
        tensors.add(i)
        if e.layout == "alias":
            tensors.add(e.base)
        elif e.layout == "view":
            storages.add(e.base)
    return tensors, storages


def _np_dtype(e: TensorEntry) -> np.dtype:
    return storage_dtype(torch_dtype(e.dtype))


def _to_container(arr: np.ndarray, e: TensorEntry, map_location: Any) -> Any:
    if e.container == "numpy":
        return arr
    if e.container == "numpy-scalar":
        return arr.reshape(())[()]
    t = host_to_tensor(arr, e.dtype)
    return t.to(map_location) if map_location is not None else t


def read_tensors(storage: Storage, m: Manifest, wanted: Iterable[int], executor: Executor,
                 map_location: Any = None) -> dict[int, Any]:
    """``{tensor index: tensor}`` for the wanted tensors (plus what they share storage with)."""
    t_idx, s_idx = needed_entries(m, wanted)
    entries = [("t", i, m.tensors[i]) for i in sorted(t_idx)] + \
              [("s", i, m.storages[i]) for i in sorted(s_idx)]
    packed_bytes = _read_packed(storage, m, [e for _, _, e in entries
                                             if e.layout == "packed" and e.nbytes], executor)
    raw: dict[tuple[str, int], np.ndarray] = {}
    for kind, i, e in entries:
        if e.layout == "packed":
            raw[kind, i] = _from_packed(packed_bytes, e)
        elif e.layout == "array":
            codec = codec_from_config(e.codec)
            raw[kind, i] = read_array(storage, f"{data_dir(e.commit)}/{e.array}",
                                      ChunkGrid.checked(e.shape, e.chunks), _np_dtype(e), codec,
                                      executor)
    out: dict[int, Any] = {}
    bases: dict[int, torch.Tensor] = {}
    for kind, i, e in entries:
        if kind == "s":
            bases[i] = _to_container(raw[kind, i], e, map_location)
    for kind, i, e in entries:  # direct entries first, then aliases and views refer to them
        if kind == "t" and e.layout in ("array", "packed"):
            out[i] = _to_container(raw[kind, i], e, map_location)
    for kind, i, e in entries:
        if kind != "t":
            continue
        if e.layout == "alias":
            out[i] = out[e.base]
        elif e.layout == "view":
            base = bases[e.base]
            if base.dtype != torch_dtype(e.dtype):
                raise ManifestError(f"tensor {e.path!r} views a storage of another dtype")
            out[i] = torch.as_strided(base, e.shape, e.stride, e.storage_offset)
    return out


def _read_packed(storage: Storage, m: Manifest, entries: list[TensorEntry],
                 executor: Executor) -> tuple[int, np.ndarray] | None:
    if not entries:
        return None
    lo = min(e.offset for e in entries)
    hi = max(e.offset + e.nbytes for e in entries)
    codec = codec_from_config(m.packed.codec)
    grid = ChunkGrid.checked([m.packed.nbytes], m.packed.chunks)
    buf = read_array(storage, f"{data_dir(m.id)}/{PACKED_ARRAY}", grid, np.dtype(np.uint8),
                     codec, executor, rows=(lo, hi))
    return lo, buf


def _from_packed(packed: tuple[int, np.ndarray], e: TensorEntry) -> np.ndarray:
    dt = _np_dtype(e)
    count = int(np.prod(e.shape, dtype=np.int64))
    if count * dt.itemsize != e.nbytes:
        raise ManifestError(f"tensor {e.path!r}: {e.nbytes} packed bytes for shape {e.shape}")
    if not e.nbytes:
        return np.empty(e.shape, dtype=dt)
    lo, buf = packed
    part = buf[e.offset - lo: e.offset - lo + e.nbytes]
    return part.view(dt).reshape(e.shape).copy()
