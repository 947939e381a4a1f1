"""Replaying chains: which rows changed and the XOR of two versions (write side), and rebuilding a
tensor from its chain (read side: rows applied in order onto the baseline, XORs or residuals
applied onto it, or code deltas applied per chunk and dequantized once)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, wait
from typing import TYPE_CHECKING

import numpy as np

from ..format.arrays import ChunkGrid
from ..chunkcodec import QuantizedLossy, codec_from_config
from ..errors import CorruptedChunkError, ManifestError
from ..format.floatbits import add_residual
from ..format.layout import array_dir, chunk_key
from ..limits import allocate, copy_of
from ..history.manifest import Blob, Kind, Layout, TensorEntry
from ..policy.shrink import SHRINKABLE
from ..storage import Buffer

if TYPE_CHECKING:
    from ckptcodecs import QuantParams

__all__ = ["ReadBlocks", "apply_residuals", "apply_rows", "apply_xors", "chain_codes",
           "changed_rows", "replay_code_deltas", "xor_bits"]

# reads a chain part block by block: ``put(first row, block)`` for each (in the I/O threads)
ReadBlocks = Callable[[Blob, Callable[[int, np.ndarray], None]], None]
# a chunk key -> its codes and parameters, and the stored chunk they were decoded from last
ChunkCodesOf = Callable[[str], tuple[np.ndarray, "QuantParams", str]]


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bits as unsigned integers of its item size (bytes for other sizes)."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(a.dtype.itemsize)
    return a.view(width) if width else a.view(np.uint8)


#: elements :func:`changed_rows` compares at once
_COMPARE_STEP = 1 << 20


def changed_rows(current: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Indices (int64) of rows whose bits differ; NaNs compare by bits, so nothing is missed."""
    if current.shape != reference.shape:
        raise ValueError("shape changed: a chain needs a full commit")
    a, b = _bits(current), _bits(reference)
    rows = a.shape[0]
    cols = int(np.prod(a.shape[1:], dtype=np.int64))
    a, b = a.reshape(rows, cols), b.reshape(rows, cols)
    diff = np.empty(rows, bool)
    step = max(1, _COMPARE_STEP // max(1, a.shape[1]))  # a bounded mask, in cache
    for lo in range(0, rows, step):
        np.not_equal(a[lo:lo + step], b[lo:lo + step]).any(axis=1, out=diff[lo:lo + step])
    return np.flatnonzero(diff).astype(np.int64)


def xor_bits(current: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The bits of ``current`` XOR ``reference``, as an array of ``current``'s dtype (bits that
    did not change are zeros: a float's sign and exponent bytes, mostly, for a small update)."""
    if current.shape != reference.shape or current.dtype != reference.dtype:
        raise ValueError("shape or dtype changed: a chain needs a full commit")
    return np.bitwise_xor(_bits(current), _bits(reference)).view(current.dtype)


def apply_xors(out: np.ndarray, links: list[TensorEntry], read_blocks: ReadBlocks
                ) -> np.ndarray:
    """XOR the bits of each link, oldest first, onto the baseline ``out`` (in place where it is
    writable), a chunk of the stored XOR at a time."""
    out = _writable(out, links)
    acc = _bits(out)
    for link in links:
        x = (link.parts or {}).get("xor")
        if link.kind != Kind.XOR or x is None:
            raise ManifestError(f"xor chain of {link.path!r} mixes kinds")
        if tuple(x.shape) != out.shape or np.dtype(x.dtype).itemsize != out.dtype.itemsize:
            raise ManifestError(f"xor of {link.path!r} in {x.commit} does not fit the tensor")

        def xor(row: int, part: np.ndarray) -> None:
            rows = _rows(acc, row, part)
            np.bitwise_xor(rows, _bits(part), out=rows)

        read_blocks(x, xor)
    return out


def apply_residuals(out: np.ndarray, links: list[TensorEntry], read_blocks: ReadBlocks
                    ) -> np.ndarray:
    """Add the dequantized residual of each link, oldest first, onto the baseline ``out`` (in
    place where it is writable; in its dtype, in the order the writer added them: the same
    values, bit for bit; 16-bit floats through float32, see
    :func:`~ckptstore.format.floatbits.add_residual`), a chunk of the stored residual at a time."""
    out = _writable(out, links)
    for link in links:
        r = (link.parts or {}).get("residual")
        if link.kind != Kind.RESIDUAL or r is None:
            raise ManifestError(f"residual chain of {link.path!r} mixes kinds")
        if tuple(r.shape) != out.shape or np.dtype(r.dtype) != out.dtype or (
                link.dtype not in SHRINKABLE):
            raise ManifestError(f"residual of {link.path!r} in {r.commit} does not fit the "
                                "tensor")

        def add(row: int, part: np.ndarray, dtype: str = link.dtype) -> None:
            rows = _rows(out, row, part)
            add_residual(rows, part, dtype, out=rows)

        read_blocks(r, add)
    return out


def _rows(out: np.ndarray, row: int, part: np.ndarray) -> np.ndarray:
    """The rows of ``out`` a block of a chain part read from ``row`` on covers."""
    return out[row: row + part.shape[0]] if out.ndim else out


def _writable(out: np.ndarray, links: list[TensorEntry]) -> np.ndarray:
    """``out``, or a copy of it (:func:`~ckptstore.limits.copy_of`) where it is read-only."""
    if out.flags.writeable and out.flags.c_contiguous:
        return out
    return copy_of(out, f"the chain of {links[0].path!r}" if links else "a chain's baseline")


def apply_rows(out: np.ndarray, increments: list[TensorEntry],
               read_blob: Callable[[Blob], np.ndarray]) -> np.ndarray:
    """Apply the changed rows of each increment, oldest first, onto the baseline ``out``
    (``xvalues``: the new bits are the old ones XOR the stored ones), in place where it is
    writable."""
    out = _writable(out, increments)
    for inc in increments:
        rows = read_blob(inc.parts["rows"])
        xor = "xvalues" in inc.parts
        values = read_blob(inc.parts["xvalues" if xor else "values"])
        if rows.ndim != 1 or values.shape != (len(rows), *out.shape[1:]) or (
                rows.size and (rows.min() < 0 or rows.max() >= out.shape[0])) or (
                xor and values.dtype.itemsize != out.dtype.itemsize):
            raise ManifestError(f"increment of {inc.path!r} in {inc.parts['rows'].commit} "
                                "does not fit the tensor")
        if xor:
            _bits(out)[rows] = np.bitwise_xor(_bits(out)[rows], _bits(values))
        else:
            out[rows] = values
    return out


def chain_codes(chain: list[TensorEntry], read: Callable[[str], Buffer]
                ) -> tuple[QuantizedLossy, ChunkGrid, ChunkCodesOf]:
    """``(codec, grid, codes_of)`` of a quantized full baseline and its code deltas:
    ``codes_of(chunk key) -> (codes, params, where)`` rebuilds one chunk's codes of the last
    version from the baseline's, delta by delta."""
    base = chain[0]
    codec = codec_from_config(base.codec)
    if base.layout != Layout.ARRAY or not isinstance(codec, QuantizedLossy):
        raise ManifestError(f"code deltas of {base.path!r} need a quantized full baseline")
    grid = ChunkGrid.checked(base.shape, base.chunks)
    for d in chain[1:]:
        if d.kind != Kind.DELTA or list(grid.chunks) != d.chunks:
            raise ManifestError(f"delta chain of {base.path!r} mixes kinds or chunk grids")

    def codes_of(key: str) -> tuple[np.ndarray, QuantParams, str]:
        where = chunk_key(array_dir(base.commit, base.array), key)
        codes, params = codec.decode_codes(read(where), where)
        for d in chain[1:]:
            blob = d.parts["codes"]
            where = chunk_key(array_dir(blob.commit, blob.array), key)
            codes, params = codec.decode_delta(read(where), codes, params, where)
        return codes, params, where

    return codec, grid, codes_of


def replay_code_deltas(chain: list[TensorEntry], dtype: np.dtype, read: Callable[[str], Buffer],
                       executor: Executor, out: np.ndarray | None = None) -> np.ndarray:
    """Rebuild a tensor from a quantized full baseline and its code deltas, chunk by chunk in
    parallel: codes of each version from the previous one's, then one dequantization (into
    ``out``, an array of the baseline's shape and ``dtype``, where given)."""
    from ckptcodecs import dequantize

    _, grid, codes_of = chain_codes(chain, read)
    if out is None:
        out = allocate(tuple(chain[0].shape), dtype, f"the code deltas of {chain[0].path!r}")
    elif out.shape != tuple(chain[0].shape) or out.dtype != dtype:
        raise ManifestError(f"code deltas of {chain[0].path!r} do not fit the tensor")

    def one(key: str, lo: int, hi: int) -> None:
        codes, params, where = codes_of(key)
        values = dequantize(codes, params)
        full = values.view(dtype) if values.dtype != dtype else values
        if full.size != int(np.prod(grid.chunks)):
            raise CorruptedChunkError(f"chunk {where} has the wrong size", where)
        out[lo:hi] = full.reshape(grid.chunks)[: hi - lo]

    futures = [executor.submit(one, key, lo, hi) for _, key, lo, hi in grid]
    wait(futures)  # none still writes into ``out`` when an error is raised
    for f in futures:
        f.result()
    return out
