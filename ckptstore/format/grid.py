"""The chunk grid of a stored array: regular chunks along the first dimension (no torch)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ManifestError

__all__ = ["CHUNK_BYTES", "ChunkGrid", "allocatable", "boxes_overlap"]

CHUNK_BYTES = 8 * 2**20
_MAX_BYTES = int(np.iinfo(np.intp).max)


def allocatable(shape: Sequence[int], itemsize: int) -> bool:
    """Whether numpy can make an array of ``shape`` (of ``itemsize``-byte items): it refuses
    one whose non-zero dimensions span more bytes than an index holds, even when another
    dimension is 0 (``torch.empty(0, 2**62)`` exists, its numpy array does not).

    >>> allocatable([0, 2**62], 4), allocatable([0, 2**30], 4)
    (False, True)
    """
    return itemsize * math.prod(d for d in shape if d) <= _MAX_BYTES


@functools.lru_cache(maxsize=4096)  # a commit asks per tensor; states repeat their shapes
def _grid_for(cls: type[ChunkGrid], shape: tuple[int, ...], itemsize: int,
              target_bytes: int) -> ChunkGrid:
    if len(shape) == 0:
        return cls((), ())
    rows = max(shape[0], 1)
    row_bytes = max(itemsize * math.prod(shape[1:]), 1)
    n = max(1, math.ceil(rows * row_bytes / target_bytes))
    per = math.ceil(rows / n)
    if rows % per:  # a few more chunks that split the rows evenly: no padded edge chunk
        even = next((m for m in range(n + 1, min(2 * n, n + 64) + 1) if rows % m == 0), None)
        if even is not None:
            per = rows // even
    return cls(shape, (per, *(max(s, 1) for s in shape[1:])))


@dataclass(frozen=True)
class ChunkGrid:
    """Regular chunking along the first dimension."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]

    @classmethod
    def for_array(cls, shape: tuple[int, ...], itemsize: int,
                  target_bytes: int = CHUNK_BYTES) -> ChunkGrid:
        return _grid_for(cls, tuple(shape), itemsize, target_bytes)

    @classmethod
    def checked(cls, shape: list[int], chunks: list[int] | None) -> ChunkGrid:
        """A grid read from a manifest; raises ManifestError unless it chunks rows only."""
        if chunks is None or len(chunks) != len(shape) or any(c < 1 for c in chunks) or list(
                chunks[1:]) != [max(s, 1) for s in shape[1:]] or (
                shape and chunks[0] > max(shape[0], 1)):
            raise ManifestError(f"invalid chunk shape {chunks} for an array of shape {shape}")
        return cls(tuple(shape), tuple(chunks))

    @property
    def nchunks(self) -> int:
        if not self.shape:
            return 1
        return math.ceil(self.shape[0] / self.chunks[0]) if self.shape[0] else 0

    def key(self, i: int) -> str:
        return "c" if not self.shape else "c/" + "/".join([str(i)] + ["0"] * (len(self.shape) - 1))

    def rows(self, i: int) -> tuple[int, int]:
        if not self.shape:
            return 0, 1
        lo = i * self.chunks[0]
        return lo, min(lo + self.chunks[0], self.shape[0])

    def __iter__(self) -> Iterator[tuple[int, str, int, int]]:
        for i in range(self.nchunks):
            yield (i, self.key(i), *self.rows(i))


def boxes_overlap(boxes: list[tuple[list[int], list[int]]], block: int = 1024) -> bool:
    """Whether two non-empty boxes ``(offsets, shape)`` intersect (pairwise, vectorised in
    blocks: with equal total volume, no overlap means an exact cover)."""
    kept = [(o, s) for o, s in boxes if math.prod(s)]
    if len(kept) < 2:
        return False
    lo = np.array([o for o, _ in kept], dtype=np.int64)
    hi = lo + np.array([s for _, s in kept], dtype=np.int64)
    n = len(kept)
    for a in range(0, n, block):
        meets = np.all((lo[a:a + block, None, :] < hi[None, :, :])
                       & (lo[None, :, :] < hi[a:a + block, None, :]), axis=2)
        rows = np.arange(a, min(a + block, n))
        meets[rows - a, rows] = False  # a box meets itself
        if meets.any():
            return True
    return False
