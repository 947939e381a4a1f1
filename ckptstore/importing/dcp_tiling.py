"""Whether the chunks of a DCP tensor tile it exactly, vectorised over chunks.

Exact: every chunk inside the tensor's bounds; identical duplicate chunks (a replicated shard)
count once; the rest cover every element exactly once -- their volumes add up to the tensor's
and no two overlap. Overlaps are found on the grid of cells the chunks' boundaries cut the tensor
into (a sharding grid: one cell per chunk): each chunk adds 1 to its box of cells through a
difference array (2^dims corner updates per chunk, then one cumulative sum per dimension). Where
that grid is too large (a crafted layout, or over 6 dimensions), a sweep along the dimension with
the most distinct offsets compares only chunks that start before another ends along it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .dcp_metadata import DcpTensor
from .source import ImportSourceError

__all__ = ["MAX_CELLS", "MAX_PAIRS", "tiling_chunks"]

MAX_CELLS = 1 << 24  # cells of the boundary grid counted, at most
MAX_PAIRS = 1 << 22  # chunk pairs the sweep compares, at most


def _cells_covered_once(o: np.ndarray, z: np.ndarray, size: tuple[int, ...]) -> bool | None:
    """Whether every cell of the chunks' boundary grid is covered exactly once; None when the
    grid is too large to count."""
    n, d = o.shape
    if d > 6:
        return None
    bounds = [np.unique(np.concatenate([[0, size[a]], o[:, a], o[:, a] + z[:, a]]))
              for a in range(d)]
    shape = [len(b) - 1 for b in bounds]
    if math.prod(shape) > MAX_CELLS:
        return None
    lo = [np.searchsorted(bounds[a], o[:, a]) for a in range(d)]
    hi = [np.searchsorted(bounds[a], o[:, a] + z[:, a]) for a in range(d)]
    diff = np.zeros([s + 1 for s in shape], np.int64)
    for corner in itertools.product((0, 1), repeat=d):  # 2^d updates of all chunks at once
        np.add.at(diff, tuple(hi[a] if c else lo[a] for a, c in enumerate(corner)),
                  -1 if sum(corner) % 2 else 1)
    for a in range(d):
        diff = np.cumsum(diff, axis=a)
    return bool((diff[tuple(slice(0, s) for s in shape)] == 1).all())


def _first_overlap(o: np.ndarray, z: np.ndarray, fqn: str) -> int | None:
    """Index (into ``o``) of a chunk that overlaps another, or None. Chunks are non-empty."""
    n, d = o.shape
    if n < 2:
        return None
    axis = int(np.argmax([len(np.unique(o[:, a])) for a in range(d)]))
    order = np.argsort(o[:, axis], kind="stable")
    o, z = o[order], z[order]
    start = o[:, axis]
    stop = np.searchsorted(start, start + z[:, axis], side="left")  # first j starting after i
    counts = np.maximum(stop - np.arange(n) - 1, 0)
    total = int(counts.sum())
    if total > MAX_PAIRS:
        raise ImportSourceError(f"DCP tensor {fqn!r}: {n} chunks in a layout too irregular to "
                                f"check ({total} candidate pairs, at most {MAX_PAIRS})")
    i = np.repeat(np.arange(n), counts)
    j = i + 1 + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    hit = (np.maximum(o[i], o[j]) < np.minimum(o[i] + z[i], o[j] + z[j])).all(axis=1)
    return int(order[i[np.argmax(hit)]]) if hit.any() else None


def tiling_chunks(t: DcpTensor, itemsize: int) -> np.ndarray:
    """Indices of the chunks of ``t`` to read (identical duplicates once), checked to tile the
    tensor exactly, each no larger than the stored bytes it reads.

    Raises
    ------
    ImportSourceError
        A chunk outside the tensor, larger than its stored bytes, chunks that overlap or leave
        a gap.
    """
    size = np.array(t.size, np.int64)
    n, d = t.offsets.shape
    end = t.offsets + t.sizes
    outside = (end > size).any(axis=1) if d else np.zeros(n, bool)
    if outside.any():
        k = int(np.argmax(outside))
        raise ImportSourceError(
            f"DCP tensor {t.fqn!r} of size {list(t.size)}: a chunk at {t.offsets[k].tolist()} of "
            f"size {t.sizes[k].tolist()} lies outside it; the checkpoint is damaged or crafted")
    lengths = np.array([s.length for s in t.storage], np.float64)
    too_big = np.prod(t.sizes.astype(np.float64), axis=1) * itemsize > lengths
    if too_big.any():
        k = int(np.argmax(too_big))
        raise ImportSourceError(
            f"DCP tensor {t.fqn!r}: its chunk of size {t.sizes[k].tolist()} declares "
            f"{math.prod(t.sizes[k].tolist()) * itemsize} bytes, but its storage holds only "
            f"{t.storage[k].length}; the checkpoint is damaged or crafted")
    if d == 0:
        if n == 0:
            raise ImportSourceError(f"DCP tensor {t.fqn!r}: a scalar with no chunk")
        return np.zeros(1, np.int64)
    _, first = np.unique(np.concatenate([t.offsets, t.sizes], axis=1), axis=0,
                         return_index=True)
    first = np.sort(first)
    nonempty = first[(t.sizes[first] > 0).all(axis=1)]
    covered = int(np.prod(t.sizes[nonempty], axis=1).sum()) if len(nonempty) else 0
    total = math.prod(t.size)
    if covered != total:
        how = "overlap" if covered > total else "do not cover it"
        raise ImportSourceError(
            f"DCP tensor {t.fqn!r} of size {list(t.size)}: its chunks {how} ({covered} elements "
            f"in chunks for {total}); the checkpoint is damaged or crafted")
    once = _cells_covered_once(t.offsets[nonempty], t.sizes[nonempty], t.size)
    if once is False:
        raise ImportSourceError(
            f"DCP tensor {t.fqn!r}: its chunks overlap (so some elements are never read); the "
            "checkpoint is damaged or crafted")
    k = None if once else _first_overlap(t.offsets[nonempty], t.sizes[nonempty], t.fqn)
    if k is not None:
        raise ImportSourceError(
            f"DCP tensor {t.fqn!r}: its chunk at {t.offsets[nonempty[k]].tolist()} overlaps "
            "another (so some elements are never read); the checkpoint is damaged or crafted")
    return nonempty
