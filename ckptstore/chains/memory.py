"""Remembering chains: what a store keeps between its own commits to build the next chain entry.

One :class:`~ckptstore.chains.links.Shadow` per (branch, tensor path) whose policy wants a chain:
the decider hands it to the kind the policy wants (``link``, ``start``), and once the branch
moved each item's kind says what to keep of its commit (``remember``): the host or device copy
of a reference, a tracker's unsaved rows, the kept codes (:mod:`ckptstore.chains.kinds`). A
process without that reference (after a restart) writes a full baseline instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol, cast

import numpy as np
import torch

from ..chunkcodec import QuantizedLossy
from ..format.arrays import ChunkGrid, dtype_name
from ..history.manifest import Layout, Manifest
from ..policy import Policy, Want
from ..tracking.rows import RowTracker
from .decide import commit_rebases, plan_chain
from .kinds import Kept, Remembered, kind_for_want
from .links import FULL_LOSSLESS, CodesBase, Decide, Shadow, TensorDecision

__all__ = ["ChainMemory", "PlannedItem", "PlannedItems", "Shadow"]

_OWN_ARRAYS = (Layout.ARRAY, Layout.CHAIN)


class PlannedItem(Protocol):
    """A planned item as the memory first sees it (``commit.plan.PlanItem``); an ``array`` or
    ``chain`` one is a :class:`~ckptstore.chains.kinds.Remembered` array item."""

    @property
    def index(self) -> int: ...

    @property
    def want(self) -> Want: ...

    @property
    def layout(self) -> Layout: ...


class PlannedItems(Protocol):
    """A commit's plan as the memory reads it (``commit.plan.CommitPlan``)."""

    @property
    def tensors(self) -> Sequence[PlannedItem]: ...


class ChainMemory:
    """The references chains are built on: one :class:`Shadow` per (branch, tensor path), kept
    only for tensors the policy wants as chains. :meth:`decider` answers the planner;
    :meth:`commit_done` updates the shadows once the branch moved (a failed commit changes
    nothing, and rows consumed from a tracker stay unsaved)."""

    def __init__(self) -> None:
        self._shadows: dict[tuple[str, str], Shadow] = {}
        # (branch, path) of lossless row tables whose policy wants deltas: a tracked one keeps
        # its old bits too, so its changed rows are stored XOR-ed (set by the last decider)
        self._xor_rows: set[tuple[str, str]] = set()

    def nbytes(self) -> tuple[int, int]:
        """``(host, device)`` bytes of the references kept (codes of code deltas count as host
        bytes)."""
        host = device = 0
        for s in self._shadows.values():
            host += s.values.nbytes if s.values is not None else 0
            host += sum(c.nbytes for c, _ in (s.codes or {}).values())
            if s.device_values is not None:
                device += s.device_values.numel() * s.device_values.element_size()
        return host, device

    def forget(self, branch: str | None = None) -> None:
        """Drop references (all, or one branch's): the next commits are full baselines."""
        self._shadows = {k: v for k, v in self._shadows.items()
                         if branch is not None and k[0] != branch}

    def _consume_tracked(self, path: str, tracker: RowTracker, tensor: torch.Tensor) -> None:
        """The store clears the tracker once the snapshot is taken, for every branch: each
        branch's reference of this table keeps the rows as unsaved until it stores them."""
        touched = tracker.touched_rows(tensor).cpu().numpy()
        rows = tensor.shape[0]
        for (_, p), other in self._shadows.items():
            if p == path and other.unsaved is not None and len(other.unsaved) == rows:
                other.unsaved[touched] = True

    def decider(self, policy: Policy, branch: str, tip: Manifest | None,
                tracker: RowTracker | None = None,
                policy_path: Callable[[str], str] | None = None) -> Decide:
        """The planner's ``decide``: the policy's wish, then a chain entry where a base exists.

        ``policy_path`` maps an entry's path to the one the policy's patterns see (a shard's
        entry ``emb@1024,0`` is ``emb`` to the policy)."""
        prev_by_path = ({e.path: e for e in (*tip.tensors, *tip.shards)} if tip is not None
                        else {})
        rebase = commit_rebases(policy, tip)

        def decide(path: str, tensor: torch.Tensor, grid: ChunkGrid) -> TensorDecision:
            d = policy.decide(policy_path(path) if policy_path else path, tensor)
            dtype = dtype_name(tensor.dtype)
            codec = QuantizedLossy(d.quant.codec_kwargs(dtype), d.quant.entropy,
                                   d.quant.prune_zeros, d.quant.entropy_min_saving
                                   ) if d.quant is not None else None
            if d.want == "full":
                return TensorDecision("full", codec) if codec is not None else FULL_LOSSLESS
            kind = kind_for_want(d.want)
            if kind is not None and kind.keeps_bits(policy, d.quant is not None):
                self._xor_rows.add((branch, path))
            else:
                self._xor_rows.discard((branch, path))
            shadow = self._shadows.get((branch, path))
            if kind is None:
                return TensorDecision(d.want, codec)
            tracked = (tracker is not None and kind.tracks_rows
                       and tracker.lookup(tensor) is not None)
            if tracked:
                self._consume_tracked(path, tracker, tensor)
            link = plan_chain(policy, d.want, d.quant is not None, tip, prev_by_path.get(path),
                              shadow.reference() if shadow is not None else None, tracked,
                              list(tensor.shape), dtype, rebase)
            start = kind.start(link, shadow, tracked, grid) if link is not None else None
            if start is None:  # a full entry (its baseline codec: a residual's is lossless)
                return TensorDecision(d.want, kind.baseline_codec(codec) if link is None
                                      else codec)
            return TensorDecision(d.want, codec, start)

        return decide

    def commit_done(self, branch: str, commit_id: str, plan: PlannedItems,
                    host: dict[int, np.ndarray], codes: dict[int, CodesBase | None],
                    tracker: RowTracker | None,
                    rebuilt: dict[int, np.ndarray | None] | None = None,
                    on_device: dict[int, torch.Tensor] | None = None,
                    rows_only: Collection[int] = ()) -> None:
        """Update the references after ``commit_id`` became the tip of ``branch``; ``host``,
        ``codes`` and ``rebuilt`` are the snapshot's arrays, the kept codes and the values a
        checkout rebuilds of residual entries, by plan item index; ``on_device``: this commit's
        values of incremental tensors on their device (the next reference is kept there);
        ``rows_only``: items whose ``host`` array holds only their changed rows. Each item's
        chain kind says what it keeps (:meth:`~ckptstore.chains.kinds.ChainKind.remember`)."""
        for p in plan.tensors:
            kind = kind_for_want(p.want)
            if kind is None or not kind.remembers or p.layout not in _OWN_ARRAYS:
                continue  # no chain wanted, or not an array of its own (packed, alias, view)
            item = cast(Remembered, p)
            i, key = p.index, (branch, item.path)
            kept = Kept(host.get(i), codes.get(i), (rebuilt or {}).get(i),
                        (on_device or {}).get(i), i in rows_only, tracker,
                        key in self._xor_rows)
            shadow = kind.remember(item, commit_id, kept, self._shadows.get(key))
            if shadow is None:
                self._shadows.pop(key, None)
            else:
                self._shadows[key] = shadow
