"""The shrink step of a commit (ExCP, :class:`~ckptstore.policy.Shrink`): between snapshot and
persist, each residual entry's snapshot becomes its pruned residual and each shrinking pair's
moments are pruned jointly. It runs where persist runs (off the training thread for
``commit_async``) and replaces snapshot arrays; it never writes into them (a synchronous
snapshot references the live tensors)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .chunkcodec import QuantizedLossy
from .plan import ArrayItem, CommitPlan, ResidualItem
from .policy.shrink import Shrink, fisher_threshold, residual_mask, shrink_moments
from .snapshot import Snapshot

__all__ = ["ShrinkStats", "shrink_snapshot"]


@dataclass
class ShrinkStats:
    """Values kept by one commit's shrink step (of the tensors it shrank)."""

    weights: int = 0
    weights_kept: int = 0
    moments: int = 0
    moments_kept: int = 0


def _shrinks(p: ArrayItem | None) -> bool:
    """A moment the policy gave to the shrink (not one a ``lossless`` pattern kept exact)."""
    return (isinstance(p, ArrayItem) and isinstance(p.codec, QuantizedLossy)
            and p.codec.prune_zeros)


def shrink_snapshot(plan: CommitPlan, snap: Snapshot, shrink: Shrink) -> ShrinkStats:
    """Replace, in ``snap``, residual entries by their pruned residuals and shrinking moments by
    their pruned values; return how much was kept."""
    snap.ready()
    items = {p.path: p for p in plan.tensors if isinstance(p, ArrayItem)}
    stats = ShrinkStats()
    found = []
    for w, m, v in shrink.pairs:
        pw, pm, pv = items.get(w), items.get(m), items.get(v)
        first = snap.arrays[pm.index] if pm is not None else None
        second = snap.arrays[pv.index] if pv is not None else None
        residual = None
        if isinstance(pw, ResidualItem):
            residual = snap.arrays[pw.index] - pw.start.reference
            snap.arrays[pw.index] = residual
            if second is None or second.shape != residual.shape:
                residual = None  # no second moment (before the first step): kept whole
        found.append((pm, pv, first, second, residual))
    if shrink.criterion == "fisher":
        cut = fisher_threshold([(r, v) for *_, v, r in found if r is not None], shrink.keep)
    for pm, pv, first, second, residual in found:
        keep = None
        if residual is not None:
            keep = (second * np.square(residual) > cut if shrink.criterion == "fisher" else
                    residual_mask(residual, second, shrink.alpha, shrink.cap))
            residual[~keep] = 0
            stats.weights += keep.size
            stats.weights_kept += int(np.count_nonzero(keep))
        if _shrinks(pm) and _shrinks(pv) and first.shape == second.shape:
            first, second = shrink_moments(first, second, keep if keep is not None and
                                           keep.shape == first.shape else None,
                                           shrink.beta, shrink.fill)
            snap.arrays[pm.index], snap.arrays[pv.index] = first, second
            stats.moments += first.size
            stats.moments_kept += int(np.count_nonzero(first))
    return stats
