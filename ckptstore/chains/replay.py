"""Replaying chains, the helpers every kind shares: which rows changed and the XOR of two versions
(write side), a tensor's bits as unsigned integers, the rows a block of a chain part covers and a
writable baseline (read side). Each kind's replay lives in its module
(:mod:`ckptstore.chains.kinds`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..history.manifest import Blob, TensorEntry
from ..limits import copy_of

if TYPE_CHECKING:
    from ckptcodecs import QuantParams

__all__ = ["ChunkCodesOf", "ReadBlocks", "bits_of", "block_rows", "changed_rows", "writable",
           "xor_bits"]

# reads a chain part block by block: ``put(first row, block)`` for each (in the I/O threads)
ReadBlocks = Callable[[Blob, Callable[[int, np.ndarray], None]], None]
# a chunk key -> its codes and parameters, and the stored chunk they were decoded from last
ChunkCodesOf = Callable[[str], tuple[np.ndarray, "QuantParams", str]]


def bits_of(a: np.ndarray) -> np.ndarray:
    """``a``'s bits as unsigned integers of its item size (bytes for other sizes)."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(a.dtype.itemsize)
    return a.view(width) if width else a.view(np.uint8)


#: elements :func:`changed_rows` compares at once
_COMPARE_STEP = 1 << 20


def changed_rows(current: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Indices (int64) of rows whose bits differ; NaNs compare by bits, so nothing is missed."""
    if current.shape != reference.shape:
        raise ValueError("shape changed: a chain needs a full commit")
    a, b = bits_of(current), bits_of(reference)
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
    return np.bitwise_xor(bits_of(current), bits_of(reference)).view(current.dtype)


def block_rows(out: np.ndarray, row: int, part: np.ndarray) -> np.ndarray:
    """The rows of ``out`` a block of a chain part read from ``row`` on covers."""
    return out[row: row + part.shape[0]] if out.ndim else out


def writable(out: np.ndarray, links: list[TensorEntry]) -> np.ndarray:
    """``out``, or a copy of it (:func:`~ckptstore.limits.copy_of`) where it is read-only."""
    if out.flags.writeable and out.flags.c_contiguous:
        return out
    return copy_of(out, f"the chain of {links[0].path!r}" if links else "a chain's baseline")
