"""The shrink step of a commit (ExCP, :class:`~ckptstore.policy.Shrink`): between snapshot and
persist, each residual entry's snapshot becomes its pruned residual and each shrinking pair's
moments are pruned jointly. It runs where persist runs (off the training thread for
``commit_async``) and returns a new snapshot with those arrays replaced; it never writes into
them (a synchronous snapshot references the live tensors)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..chunkcodec import QuantizedLossy
from ..format.floatbits import float_values, from_values, residual_values
from .plan import ArrayItem, CommitPlan, ResidualItem
from ..policy.shrink import Shrink, fisher_threshold, residual_mask, shrink_moments
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


Arrays = dict[int, np.ndarray]  # the snapshot's host arrays, by item index


def _values(arrays: Arrays, p: ArrayItem | None) -> np.ndarray | None:
    return float_values(arrays[p.index], p.dtype) if p is not None else None


def _pair(arrays: Arrays, pw: ArrayItem | None, pm: ArrayItem | None, pv: ArrayItem | None
          ) -> tuple:
    """``(pw, pm, pv, second moment, residual)`` of one weight and its moments, as float values
    (float32 for 16-bit floats; the first moment is taken pair by pair later, to bound the
    temporaries). Where there is no second moment to rank it, the weight's snapshot becomes its
    whole residual, in the weight's dtype, and the residual returned is None (the caller stores
    the pruned one otherwise)."""
    second = _values(arrays, pv)
    residual = None
    if isinstance(pw, ResidualItem):
        residual = residual_values(_values(arrays, pw), float_values(pw.start.reference, pw.dtype),
                                   pw.dtype)
        if second is None or second.shape != residual.shape:
            arrays[pw.index] = from_values(residual, pw.dtype)
            residual = None  # no second moment (before the first step): kept whole
    return pw, pm, pv, second, residual


def _blocks(plan: CommitPlan, policy_path: Callable[[str], str] | None
            ) -> dict[str, dict[str, ArrayItem]]:
    """The plan's array items by the path the policy sees, then by what the item's own path adds
    to it: ``""`` for a whole tensor, ``"@<offsets>"`` for a block of a sharded one."""
    out: dict[str, dict[str, ArrayItem]] = {}
    for p in plan.tensors:
        if isinstance(p, ArrayItem):
            seen = policy_path(p.path) if policy_path else p.path
            if not p.path.startswith(seen):
                seen = p.path
            out.setdefault(seen, {})[p.path[len(seen):]] = p
    return out


def shrink_snapshot(plan: CommitPlan, snap: Snapshot, shrink: Shrink,
                    policy_path: Callable[[str], str] | None = None
                    ) -> tuple[Snapshot, ShrinkStats]:
    """``snap`` with residual entries replaced by their pruned residuals and shrinking moments
    by their pruned values, and how much was kept.

    ``policy_path`` maps an item's path to the one ``shrink.pairs`` names (a rank's block of a
    sharded tensor, ``<fqn>@<offsets>``, to ``<fqn>``): a weight's block pairs with the blocks of
    its moments at the same offsets, and the Fisher threshold is the rank's own (over the
    blocks it holds)."""
    snap.ready()
    arrays = snap.arrays
    blocks = _blocks(plan, policy_path)
    stats = ShrinkStats()
    found = []
    for w, m, v in shrink.pairs:
        bw, bm, bv = blocks.get(w, {}), blocks.get(m, {}), blocks.get(v, {})
        for suffix in dict.fromkeys([*bw, *bm, *bv]):
            found.append(_pair(arrays, bw.get(suffix), bm.get(suffix), bv.get(suffix)))
    if shrink.criterion == "fisher":
        cut = fisher_threshold([(r, v) for *_, v, r in found if r is not None], shrink.keep)
    for i, (pw, pm, pv, second, residual) in enumerate(found):
        found[i] = None  # its float temporaries go with this pair
        keep = None
        if residual is not None:
            with np.errstate(over="ignore"):  # a huge residual's saliency is inf: kept
                keep = (second * np.square(residual) > cut if shrink.criterion == "fisher" else
                        residual_mask(residual, second, shrink.alpha, shrink.cap))
            residual[~keep] = 0
            arrays[pw.index] = from_values(residual, pw.dtype)  # itself for float32
            stats.weights += keep.size
            stats.weights_kept += int(np.count_nonzero(keep))
        first = _values(arrays, pm) if _shrinks(pm) and _shrinks(pv) else None
        if first is not None and first.shape == second.shape:
            first, second = shrink_moments(first, second, keep if keep is not None and
                                           keep.shape == first.shape else None,
                                           shrink.beta, shrink.fill)
            arrays[pm.index] = from_values(first, pm.dtype)
            arrays[pv.index] = from_values(second, pv.dtype)
            stats.moments += first.size
            stats.moments_kept += int(np.count_nonzero(first))
    return snap.with_host(arrays), stats
