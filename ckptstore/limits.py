"""What a reader lets a manifest claim before it allocates memory or walks a chunk grid.

A manifest is a claim; the chunks are what the store holds. A checksum proves only that the
manifest was not damaged, not that a writer made it, so a shape of ``[10**10]`` must not make
``verify`` walk 10**10 chunk keys nor ``checkout`` allocate 40 GB. Every array a reader reads
(full entries, chain parts and baselines, packed arrays, pieces of sharded tensors) passes
:func:`check_grid` (arithmetic, no I/O) and then :func:`missing_chunks` (one listing of its row
chunks), both before its buffer is allocated or its grid is iterated:

- the grid has at most :attr:`ReadLimits.max_chunks` chunks;
- one chunk decodes to at most :attr:`ReadLimits.max_chunk_bytes` bytes;
- the grid has at most :attr:`ReadLimits.max_missing` chunks more than the array's folder holds
  (a few missing chunks are damage, named one by one; more is a shape the store never held);

and checkout allocates an array only once every chunk of it is listed, so what an entry
declares is at most ``chunks stored x max_chunk_bytes``, and verify walks at most
``max_missing`` chunk keys more than are stored. What a process still cannot allocate within
that bound is an :class:`~ckptstore.errors.AllocationError` (:func:`allocate` for the arrays a
manifest sizes, :func:`memory_bound` around each chunk's read and decode for every other
buffer), not a raw ``MemoryError``; a chunk that decodes to less than its grid says is refused by its codec.
Every other entry is bounded by arrays: a chain entry has its full baseline's shape, a packed
one lies inside its packed array, a sharded tensor's volume is the sum of its pieces', a view
stays in its storage.

The limits are one module-level value, :data:`READ_LIMITS`; a store whose writer chose
``chunk_bytes`` above 4 GiB (or holds a single row larger than that) is read after
``ckptstore.limits.READ_LIMITS = ReadLimits(max_chunk_bytes=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import AllocationError, ManifestError

if TYPE_CHECKING:  # limits sits below storage: local files read READ_LIMITS
    from .storage import Storage

__all__ = ["METADATA_NESTING", "READ_LIMITS", "TREE_NESTING", "ReadLimits", "allocate",
           "check_grid", "copy_of", "memory_bound", "missing_chunks", "nesting"]

# state.flatten writes at most 200 levels, each at most 3 nestings ({"dict": [[key, node]]});
# deeper trees and metadata would make readers recurse past Python's limit
TREE_NESTING = 3 * 200 + 12  # (+ an OrderedDict's _metadata at the deepest level)
METADATA_NESTING = 32


@dataclass(frozen=True)
class ReadLimits:
    """Bounds a reader enforces on each stored array a manifest describes.

    Parameters
    ----------
    max_chunks
        Chunks of one array's grid (2**24: 128 TiB at the default 8 MiB chunks).
    max_chunk_bytes
        Decoded bytes of one chunk (writers make chunks of ``chunk_bytes``, 8 MiB by default,
        or of one row where a row is larger).
    max_missing
        Chunks of a grid its folder may lack and still be walked (``verify`` names each).
    """

    max_chunks: int = 2**24
    max_chunk_bytes: int = 2**32
    max_missing: int = 1024


READ_LIMITS = ReadLimits()


def check_grid(where: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype,
               limits: ReadLimits | None = None) -> None:
    """Refuse a chunk grid (rows only, as :meth:`ChunkGrid.checked` made it) with too many or
    too large chunks, with a :class:`ManifestError` naming the array at ``where``."""
    limits = limits or READ_LIMITS
    nchunks = math.ceil(shape[0] / chunks[0]) if shape else 1
    chunk_bytes = math.prod(chunks) * dtype.itemsize
    if nchunks > limits.max_chunks or chunk_bytes > limits.max_chunk_bytes:
        raise ManifestError(
            f"{where}: the manifest declares shape {list(shape)} in {nchunks} chunks of "
            f"{chunk_bytes} bytes, beyond what a reader accepts ({limits.max_chunks} chunks of "
            f"{limits.max_chunk_bytes} bytes): the manifest is damaged or hostile. If a "
            "trusted writer made it, raise ckptstore.limits.READ_LIMITS.")


def missing_chunks(storage: Storage, prefix: str, nchunks: int, ndim: int,
                   limits: ReadLimits | None = None) -> list[int]:
    """Row chunks ``0..nchunks-1`` of the array at ``prefix`` that its folder lacks, from one
    listing of ``<prefix>/c`` (a request per 1,000 chunks on object stores); a
    :class:`ManifestError` where it lacks more than ``max_missing``: nothing is walked then.
    A 0-d array's single chunk is left to the read."""
    limits = limits or READ_LIMITS
    if ndim == 0 or nchunks == 0:
        return []
    stored = set(storage.listdir(f"{prefix}/c"))
    if nchunks - len(stored) > limits.max_missing:
        raise ManifestError(
            f"{prefix}: the manifest declares {nchunks} chunks but the store holds "
            f"{len(stored)}: its shape or chunk grid is damaged or hostile, or the array's "
            "chunks were deleted; check out another commit.")
    return [i for i in range(nchunks) if str(i) not in stored]  # at most len(stored) + 1024


def allocate(shape: tuple[int, ...], dtype: np.dtype, where: str) -> np.ndarray:
    """``np.empty(shape, dtype)`` for the array at ``where``; an :class:`AllocationError`
    where this process cannot have that memory (or numpy cannot index it)."""
    try:
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError) as e:  # ValueError: "array is too big"
        nbytes = math.prod(shape) * dtype.itemsize
        raise AllocationError(
            f"{where}: the manifest declares shape {list(shape)} of {dtype} ({nbytes} bytes), "
            f"more than this process can allocate ({type(e).__name__}). Check out fewer tensors "
            "(paths=...) or on a machine with more memory; if the store is not yours, run "
            "verify: the manifest may be hostile.") from None


@contextmanager
def memory_bound(where: str) -> Iterator[None]:
    """Turn a raw ``MemoryError`` raised inside (a decoder's scratch buffer, a chunk decoded
    apart) into an :class:`AllocationError` naming ``where``: a read that runs out of memory
    says so in one line, whichever buffer it was."""
    try:
        yield
    except AllocationError:
        raise
    except MemoryError as e:
        raise AllocationError(
            f"{where}: reading it needs more memory than this process can allocate ({e}). Check "
            "out fewer tensors (paths=...), with fewer I/O threads, or on a machine with more "
            "memory.") from None


def copy_of(a: np.ndarray, where: str) -> np.ndarray:
    """A C-contiguous copy of ``a`` (an array the store sized) through :func:`allocate`."""
    out = allocate(a.shape, a.dtype, where)
    np.copyto(out, a)
    return out


def nesting(value: object) -> int:
    """How deeply maps and lists nest in ``value`` (iteratively: no recursion)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            todo += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            todo += [(v, depth + 1) for v in node]
    return deepest
