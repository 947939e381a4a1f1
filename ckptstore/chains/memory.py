"""Remembering chains: what a store keeps between its own commits to build the next chain entry.

Changed rows come from a :class:`~ckptstore.tracking.rows.RowTracker` when the commit is given one,
else from comparing the tensor's bits with a copy of the reference kept here after the last
commit (exact, costs one copy of each incremental tensor): on the tensor's device when its
snapshot was staged there (:mod:`ckptstore.device.rows`: only changed rows then cross to the host),
else in host memory. A tracked table keeps no copy, unless ``Policy(delta=True)`` asks for its
lossless changed rows as the XOR of their old bits: then it keeps a host copy as the compare mode
does. A process without that reference (after a restart) writes a full baseline instead of
guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch

from ..format.arrays import ChunkGrid, dtype_name
from ..chunkcodec import LOSSLESS_IDS, QuantizedLossy
from ..device.rows import device_reference
from ..history.manifest import Kind, Manifest
from ..commit.plan import FULL_LOSSLESS, ArrayItem, CommitPlan, Decide, TensorDecision
from ..policy import Policy
from ..tracking.rows import RowTracker
from .decide import ChainStart, CodesBase, Reference, commit_rebases, plan_chain

__all__ = ["ChainMemory", "Shadow"]


@dataclass
class Shadow:
    """What the store remembers of a tensor after committing it on a branch.

    ``commit`` is the commit the reference belongs to: the baseline (one-shot, intermittent) or
    the last commit (consecutive, delta, xor). Tracker rows are updated in place as commits land.
    """

    commit: str
    values: np.ndarray | None = None          # host bits of the reference (compare mode)
    device_values: torch.Tensor | None = None  # or the reference on the tensor's device
    since_base: np.ndarray | None = None      # bool rows changed since the baseline (tracker)
    unsaved: np.ndarray | None = None         # bool rows consumed from the tracker, not yet saved
    codes: CodesBase | None = None            # per chunk (codes, params): deltas
    grid_chunks: tuple[int, ...] | None = None
    exact: bool = False                       # the store rebuilds ``values`` bit for bit

    def reference(self) -> Reference:
        return Reference(self.commit,
                         self.values is not None or self.device_values is not None,
                         self.codes is not None)


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
                                   d.quant.prune_zeros) if d.quant is not None else None
            if d.want == "full":
                return TensorDecision("full", codec) if codec is not None else FULL_LOSSLESS
            if d.want == "rows" and policy.delta and codec is None:
                self._xor_rows.add((branch, path))
            else:
                self._xor_rows.discard((branch, path))
            shadow = self._shadows.get((branch, path))
            tracked = (tracker is not None and d.want == "rows"
                       and tracker.lookup(tensor) is not None)
            if tracked:
                self._consume_tracked(path, tracker, tensor)
            link = plan_chain(policy, d.want, d.quant is not None, tip, prev_by_path.get(path),
                              shadow.reference() if shadow is not None else None, tracked,
                              list(tensor.shape), dtype, rebase)
            if link is None:  # a full entry; a residual chain's baseline is lossless
                return TensorDecision(d.want, None if d.want == "residual" else codec)
            if link.kind == Kind.DELTA:
                if shadow.grid_chunks != tuple(grid.chunks):
                    return TensorDecision(d.want, codec)
                return TensorDecision(d.want, codec, ChainStart(link, base_codes=shadow.codes))
            if link.kind in (Kind.XOR, Kind.RESIDUAL):
                return TensorDecision(d.want, codec, ChainStart(link, reference=shadow.values))
            mask = None
            if tracked and shadow.unsaved is not None:
                mask = shadow.unsaved.copy()
                if link.kind == Kind.INCREMENTAL and shadow.since_base is not None:
                    mask |= shadow.since_base
            return TensorDecision(d.want, codec, ChainStart(
                link, tracked_rows=mask, reference=shadow.values,
                device_reference=shadow.device_values, exact=shadow.exact))

        return decide

    def commit_done(self, branch: str, commit_id: str, plan: CommitPlan,
                    host: dict[int, np.ndarray], codes: dict[int, CodesBase | None],
                    tracker: RowTracker | None,
                    rebuilt: dict[int, np.ndarray | None] | None = None,
                    on_device: dict[int, torch.Tensor] | None = None,
                    rows_only: Collection[int] = ()) -> None:
        """Update the references after ``commit_id`` became the tip of ``branch``; ``host``,
        ``codes`` and ``rebuilt`` are the snapshot's arrays, the kept codes and the values a
        checkout rebuilds of residual entries, by plan item index; ``on_device``: this commit's
        values of incremental tensors on their device (the next reference is kept there);
        ``rows_only``: items whose ``host`` array holds only their changed rows."""
        for p in plan.tensors:
            if not isinstance(p, ArrayItem) or p.want not in ("rows", "codes", "xor", "residual"):
                continue
            key = (branch, p.path)
            if p.want == "residual":  # the next residual is taken against what checkout rebuilds
                values = (rebuilt or {}).get(p.index) if p.kind == Kind.RESIDUAL else (
                    _host_copy(host[p.index], self._shadows.get(key))
                    if p.codec.codec_id in LOSSLESS_IDS else None)
                if values is None:
                    self._shadows.pop(key, None)
                else:
                    self._shadows[key] = Shadow(commit_id, values=values,
                                                exact=p.kind == Kind.FULL)
                continue
            if p.want == "xor":  # every commit is the reference of the next XOR
                if p.codec.codec_id in LOSSLESS_IDS:
                    self._shadows[key] = Shadow(commit_id, values=_host_copy(
                        host[p.index], self._shadows.get(key)), exact=True)
                else:
                    self._shadows.pop(key, None)
                continue
            if p.want == "codes":
                kept = codes.get(p.index)
                if kept:
                    self._shadows[key] = Shadow(commit_id, codes=kept,
                                                grid_chunks=tuple(p.grid.chunks))
                else:
                    self._shadows.pop(key, None)
                continue
            old = self._shadows.get(key)
            if p.kind == Kind.INCREMENTAL and old is not None:  # baseline stays the reference
                if old.since_base is not None and old.unsaved is not None:
                    old.since_base |= old.unsaved
                    old.unsaved[:] = False
                continue
            # full baseline or consecutive: this commit is the new reference, rebuilt exactly
            # when it is lossless and so is everything it builds on
            is_tracked = tracker is not None and tracker.lookup(p.source) is not None
            keep = not is_tracked or key in self._xor_rows  # old bits to compare or XOR with
            rows = p.shape[0]
            exact = p.codec.codec_id in LOSSLESS_IDS and (
                p.kind == Kind.FULL or (old is not None and old.exact))
            device = None if is_tracked else (on_device or {}).get(p.index)
            if device is not None:
                device = device_reference(device, old.device_values if old else None)
            if device is None and not is_tracked and p.index in rows_only:
                # no room on the device for the next reference, and the snapshot holds only the
                # changed rows: the next commit is a full baseline
                self._shadows.pop(key, None)
                continue
            self._shadows[key] = Shadow(
                commit_id,
                values=None if not keep or device is not None else _host_copy(host[p.index],
                                                                               old),
                device_values=device,
                since_base=np.zeros(rows, bool) if is_tracked else None,
                unsaved=np.zeros(rows, bool) if is_tracked else None, exact=exact)


def _host_copy(values: np.ndarray, old: Shadow | None) -> np.ndarray:
    """A host copy of a new reference: into the old reference's buffer when it fits (its commit
    is done with it; a fresh gigabyte costs its page faults on every commit), else a new one."""
    kept = old.values if old is not None else None
    if kept is not None and kept.shape == values.shape and kept.dtype == values.dtype:
        np.copyto(kept, values)
        return kept
    return np.array(values, copy=True)
