"""DynaQuant's sensitivity: which values of a quantized tensor to protect and which to prune,
ranked by what zeroing each value costs the loss, estimated from gradients seen in training.

With ``Policy(sensitivity=GradientEMA(model))`` a quantized tensor's ``protect`` share keeps its
largest magnitudes *and* its largest sensitivities (the union, DynaQuant section 4.2), and
``prune`` drops its smallest sensitivities instead of its smallest magnitudes. The sensitivity
is ``w**2 * E[g**2]`` by default (``score="fisher"``: the second-order loss of zeroing ``w``, the
gradients' second moment standing for the Hessian's diagonal) or DynaQuant's first-order
``|w| * E|g|`` (``score="taylor"``); ``E`` is an exponential moving average. The stored format
does not change (a reader needs nothing of this); a parameter that has seen no gradient is
ranked by magnitude. ``benchmarks/sensitivity.py`` measures both against magnitude: in
DynaQuant's range (prune 20-40 %) quality is the same or better and the commit 2-11 % smaller
(pruned values cluster where gradients never reach); past 50 % magnitude ranking keeps far
more accuracy once training has converged.

Two steps of the commit pipeline: :func:`capture_gradients` (with the snapshot) and
:func:`score_snapshot` (on the persist thread). The training hook that keeps the averages is
:class:`~ckptstore.tracking.gradients.GradientEMA`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..chunkcodec import QuantizedLossy
from ..policy.sensitivity import GradientAverages
from .plan import ArrayItem, CodesItem, CommitPlan
from .snapshot import Snapshot

__all__ = ["Gradients", "capture_gradients", "score_snapshot"]


def _scored(p: Any) -> bool:
    return (isinstance(p, (ArrayItem, CodesItem)) and isinstance(p.codec, QuantizedLossy)
            and not p.codec.prune_zeros and (p.codec.quantize.get("protect", 0) > 0
                                             or p.codec.quantize.get("prune", 0) > 0))


@dataclass(frozen=True)
class Gradients:
    """Host copies of a :class:`~ckptstore.GradientEMA`'s averages, by plan item, and how to
    score them."""

    averages: dict[int, np.ndarray]
    score: str


# where a plan item's values sit in the state's tensor: (path, offsets, global shape)
Block = tuple[str, tuple[int, ...], tuple[int, ...]]


def _local_block(g: torch.Tensor, offsets: tuple[int, ...], shape: tuple[int, ...],
                 global_shape: tuple[int, ...]) -> torch.Tensor | None:
    """The part of average ``g`` at ``offsets`` of size ``shape`` (a rank's block of a sharded
    tensor): a DTensor's local shard if it is that block, a slice of a whole tensor; None where
    this rank does not hold it (no collective: the block is then ranked by magnitude)."""
    from torch.distributed.tensor import DTensor

    if isinstance(g, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local, offset = compute_local_shape_and_global_offset(g.shape, g.device_mesh,
                                                              g.placements)
        ok = tuple(local) == shape and tuple(offset) == offsets
        return g.to_local() if ok else None
    if tuple(g.shape) != global_shape:
        return None
    return g[tuple(slice(o, o + n) for o, n in zip(offsets, shape))]


def capture_gradients(plan: CommitPlan, ema: GradientAverages,
                      block_of: Callable[[str], Block] | None = None) -> Gradients:
    """Host copies of the averages of the plan's quantized tensors that protect or prune
    (taken with the snapshot: training may go on updating them). ``block_of`` maps an item's
    path to the state path, offsets and global shape of its values (a rank's block of a sharded
    tensor, ``<fqn>@<offsets>``)."""
    out: dict[int, np.ndarray] = {}
    for p in plan.tensors:
        if not _scored(p):
            continue
        path, offsets, whole = (block_of(p.path) if block_of is not None
                                else (p.path, (0,) * len(p.shape), tuple(p.shape)))
        g = ema.average(path)
        if g is not None:
            g = _local_block(g.detach(), tuple(offsets), tuple(p.shape), tuple(whole))
        if g is not None and tuple(g.shape) == tuple(p.shape):
            out[p.index] = g.to("cpu", copy=True).numpy()
    return Gradients(out, ema.score)


def score_snapshot(snap: Snapshot, gradients: Gradients) -> Snapshot:
    """``snap`` with each scored item's score: ``w**2 * E[g**2]`` (``fisher``: the loss that
    zeroing a value costs to second order, the Fisher diagonal standing for the Hessian) or
    ``|w| * E|g|`` (``taylor``: DynaQuant's first-order sensitivity), on the persist thread."""
    snap.ready()
    arrays, scores = snap.arrays, {}
    for i, g in gradients.averages.items():
        w = arrays[i]
        if w.shape == g.shape and w.dtype.kind == "f":
            if gradients.score == "taylor":
                scores[i] = np.abs(w, dtype=np.float32) * g
            else:
                scores[i] = np.square(w, dtype=np.float32) * g
    return snap.with_scores(scores)
