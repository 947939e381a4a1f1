"""Rebuild tensors of a commit from the store (the read half of ``checkout``).

Full entries are read chunk by chunk straight into their output buffers; chain entries are
replayed from their full baseline (rows applied in order, or code deltas applied per chunk and
dequantized once at the end).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

import numpy as np
import torch

from .arrays import (ChunkGrid, host_to_tensor, read_array, start_read_array, storage_dtype,
                     torch_dtype)
from .chunkcodec import QuantizedLossy, codec_from_config
from .errors import CorruptedChunkError, ManifestError
from .chains.walk import chain_of, needed_entries
from .layout import data_dir
from .manifest import Blob, Manifest, TensorEntry
from .plan import PACKED_ARRAY
from .storage import Storage

__all__ = ["Reader"]

_BLOB_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"}


def _np_dtype(e: TensorEntry) -> np.dtype:
    return storage_dtype(torch_dtype(e.dtype))


def _to_container(arr: np.ndarray, e: TensorEntry, map_location: Any) -> Any:
    if e.container == "numpy":
        return arr
    if e.container == "numpy-scalar":
        return arr.reshape(())[()]
    t = host_to_tensor(arr, e.dtype)
    return t.to(map_location) if map_location is not None else t


class Reader:
    """Reads entries of commits; caches each commit's packed array for one checkout."""

    def __init__(self, storage: Storage, manifest_of: Callable[[str], Manifest],
                 executor: Executor):
        self.storage = storage
        self.manifest_of = manifest_of
        self.executor = executor
        self._packed: dict[str, np.ndarray] = {}

    # -- one entry -------------------------------------------------------------------------
    def host(self, e: TensorEntry) -> np.ndarray:
        """The bits of a full or chain entry as a host array of its storage dtype."""
        if e.layout == "array":
            return read_array(self.storage, f"{data_dir(e.commit)}/{e.array}",
                              ChunkGrid.checked(e.shape, e.chunks), _np_dtype(e),
                              codec_from_config(e.codec), self.executor)
        if e.layout == "packed":
            return self._from_packed(e)
        if e.layout == "chain":
            chain = chain_of(self.manifest_of, e)
            if e.kind == "delta":
                return self._replay_deltas(chain)
            out = self.host(chain[0])
            if not out.flags.writeable:
                out = out.copy()
            for inc in chain[1:]:
                rows = self.blob(inc.parts["rows"])
                values = self.blob(inc.parts["values"])
                if rows.ndim != 1 or values.shape != (len(rows), *out.shape[1:]) or (
                        rows.size and (rows.min() < 0 or rows.max() >= out.shape[0])):
                    raise ManifestError(f"increment of {e.path!r} in {inc.parts['rows'].commit} "
                                        "does not fit the tensor")
                out[rows] = values
            return out
        raise ManifestError(f"entry {e.path!r} with layout {e.layout!r} has no bits of its own")

    def blob(self, b: Blob) -> np.ndarray:
        if b.dtype not in _BLOB_DTYPES:
            raise ManifestError(f"blob {b.array!r} has unsupported dtype {b.dtype!r}")
        return read_array(self.storage, f"{data_dir(b.commit)}/{b.array}",
                          ChunkGrid.checked(b.shape, b.chunks), np.dtype(b.dtype),
                          codec_from_config(b.codec), self.executor)

    def _replay_deltas(self, chain: list[TensorEntry]) -> np.ndarray:
        from ckptcodecs import dequantize

        base = chain[0]
        codec = codec_from_config(base.codec)
        if base.layout != "array" or not isinstance(codec, QuantizedLossy):
            raise ManifestError(f"code deltas of {base.path!r} need a quantized full baseline")
        grid = ChunkGrid.checked(base.shape, base.chunks)
        for d in chain[1:]:
            if d.kind != "delta" or list(grid.chunks) != d.chunks:
                raise ManifestError(f"delta chain of {base.path!r} mixes kinds or chunk grids")
        dtype = _np_dtype(base)
        out = np.empty(base.shape, dtype=dtype)

        def one(i: int, key: str, lo: int, hi: int) -> None:
            where = f"{data_dir(base.commit)}/{base.array}/{key}"
            codes, params = codec.decode_codes(self._read(where), where)
            for d in chain[1:]:
                blob = d.parts["codes"]
                where = f"{data_dir(blob.commit)}/{blob.array}/{key}"
                codes, params = codec.decode_delta(self._read(where), codes, params, where)
            values = dequantize(codes, params)
            full = values.view(dtype) if values.dtype != dtype else values
            if full.size != int(np.prod(grid.chunks)):
                raise CorruptedChunkError(f"chunk {where} has the wrong size", where)
            out[lo:hi] = full.reshape(grid.chunks)[: hi - lo]

        for f in [self.executor.submit(one, *c) for c in grid]:
            f.result()
        return out

    def _read(self, where: str) -> bytes:
        try:
            return self.storage.read(where)
        except FileNotFoundError:
            raise CorruptedChunkError(f"chunk {where} is missing from the store", where) from None

    def _from_packed(self, e: TensorEntry) -> np.ndarray:
        dt = _np_dtype(e)
        count = int(np.prod(e.shape, dtype=np.int64))
        if count * dt.itemsize != e.nbytes:
            raise ManifestError(f"tensor {e.path!r}: {e.nbytes} packed bytes for shape {e.shape}")
        if not e.nbytes:
            return np.empty(e.shape, dtype=dt)
        buf = self._packed.get(e.commit)
        if buf is None:
            m = self.manifest_of(e.commit)
            if m.packed is None or e.offset + e.nbytes > m.packed.nbytes:
                raise ManifestError(f"tensor {e.path!r} lies outside the packed array")
            grid = ChunkGrid.checked([m.packed.nbytes], m.packed.chunks)
            buf = read_array(self.storage, f"{data_dir(e.commit)}/{PACKED_ARRAY}", grid,
                             np.dtype(np.uint8), codec_from_config(m.packed.codec), self.executor)
            self._packed[e.commit] = buf
        return buf[e.offset: e.offset + e.nbytes].view(dt).reshape(e.shape).copy()

    # -- a whole selection -----------------------------------------------------------------
    def read_tensors(self, m: Manifest, wanted: Iterable[int],
                     map_location: Any = None) -> dict[int, Any]:
        """``{tensor index: tensor}`` for the wanted tensors (and what they share storage with)."""
        t_idx, s_idx = needed_entries(m, wanted)
        # whole arrays are queued together, so workers never idle between arrays
        pending: dict[int, np.ndarray] = {}
        futures: list[Any] = []
        for i in sorted(t_idx):
            e = m.tensors[i]
            if e.layout == "array":
                pending[i], fs = start_read_array(
                    self.storage, f"{data_dir(e.commit)}/{e.array}",
                    ChunkGrid.checked(e.shape, e.chunks), _np_dtype(e),
                    codec_from_config(e.codec), self.executor)
                futures += fs
        bases = {i: _to_container(self.host(m.storages[i]), m.storages[i], map_location)
                 for i in sorted(s_idx)}
        for f in futures:
            f.result()
        out: dict[int, Any] = {}
        for i in sorted(t_idx):
            e = m.tensors[i]
            if e.layout in ("array", "packed", "chain"):
                host = pending[i] if i in pending else self.host(e)
                out[i] = _to_container(host, e, map_location)
        for i in sorted(t_idx):
            e = m.tensors[i]
            if e.layout == "alias":
                out[i] = out[e.base]
            elif e.layout == "view":
                base = bases[e.base]
                if base.dtype != torch_dtype(e.dtype):
                    raise ManifestError(f"tensor {e.path!r} views a storage of another dtype")
                reach = e.storage_offset + sum((s - 1) * st for s, st in zip(e.shape, e.stride)
                                               if s > 0)
                if len(e.stride) != len(e.shape) or min(e.stride, default=0) < 0 or (
                        math.prod(e.shape) and reach >= base.numel()):
                    raise ManifestError(f"view {e.path!r} reaches outside its storage")
                out[i] = torch.as_strided(base, e.shape, e.stride, e.storage_offset)
        return out
