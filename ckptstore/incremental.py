"""Chains of commits: which rows changed, when to rebase, and how a chain is replayed.

Kinds of a tensor entry (Check-N-Run section 5.1, DynaQuant section 6):

- ``full``: the whole tensor (a baseline).
- ``incremental`` (one-shot): the rows changed since the baseline; restore reads the baseline and
  this commit.
- ``consecutive``: the rows changed since the previous commit; restore replays the chain.
- ``delta``: quantization codes of a dense tensor as cyclic deltas against the previous commit's
  codes, rearranged by base bucket (restore replays code deltas, then dequantizes once).

Changed rows come from a :class:`~ckptstore.tracking.RowTracker` when the commit is given one,
else from comparing the tensor's bits with a host copy of the reference kept by the store after
its last commit (exact, costs one copy of each incremental tensor in host memory). A process
without that reference (after a restart) writes a full baseline instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .manifest import Manifest, TensorEntry
from .policy import Policy, QuantSpec

__all__ = ["ChainMemory", "ChainPlan", "Shadow", "changed_rows",
           "commit_rebases", "plan_chain"]


@dataclass
class Shadow:
    """What the store remembers of a tensor after committing it on a branch.

    ``commit`` is the commit the reference belongs to: the baseline (one-shot, intermittent) or
    the last commit (consecutive, delta).
    """

    commit: str
    values: np.ndarray | None = None          # host bits of the reference (compare mode)
    since_base: np.ndarray | None = None      # bool rows changed since the baseline (tracker)
    unsaved: np.ndarray | None = None         # bool rows consumed from the tracker, not yet saved
    codes: dict[int, tuple[np.ndarray, Any]] | None = None  # per chunk (codes, params): deltas
    grid_chunks: tuple[int, ...] | None = None


@dataclass
class ChainPlan:
    """A chain entry to write: its kind, base, and how to find the changed rows or base codes."""

    kind: str                      # incremental | consecutive | delta
    base_commit: str
    chain: int                     # increments since the full baseline, this one included
    fractions: list[float] = field(default_factory=list)  # S1..S(i-1) of the chain so far
    shadow: Shadow | None = None
    tracked_rows: np.ndarray | None = None   # bool mask of rows to store (tracker mode)
    quant: QuantSpec | None = None


def changed_rows(current: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Indices (int64) of rows whose bits differ; NaNs compare by bits, so nothing is missed."""
    if current.shape != reference.shape:
        raise ValueError("shape changed: a chain needs a full commit")
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(current.dtype.itemsize)
    a = current.view(width) if width else current.view(np.uint8)
    b = reference.view(width) if width else reference.view(np.uint8)
    rows = a.shape[0]
    diff = np.not_equal(a.reshape(rows, -1), b.reshape(rows, -1)).any(axis=1)
    return np.flatnonzero(diff).astype(np.int64)


def commit_rebases(policy: Policy, tip: Manifest | None) -> bool:
    """Whether this commit takes a new baseline of every one-shot chain (Check-N-Run decides per
    checkpoint, so all tables rebase together and the old baseline is freed as a whole).

    The predictor sees ``S1..Si`` of the whole checkpoint: each increment's size as a fraction of
    the rows, averaged over the incremental tensors weighted by their bytes. Chains of different
    lengths (a tensor that joined later) are aligned by rebasing.
    """
    if tip is None or policy.incremental not in ("one-shot", "intermittent"):
        return False
    inc = [e for e in tip.tensors if e.kind == "incremental"]
    if not inc:
        return False
    lengths = {len(e.fractions or []) for e in inc}
    if len(lengths) > 1:
        return True
    n = lengths.pop()
    if n >= policy.max_chain:
        return True
    if policy.incremental != "intermittent":
        return False
    weights = [max(e.nbytes or 0, 1) for e in inc]
    total = sum(weights)
    fractions = [sum(w * e.fractions[k] for w, e in zip(weights, inc)) / total for k in range(n)]
    return policy.rebase.should_rebase(fractions)


def plan_chain(policy: Policy, decision_want: str, quant: QuantSpec | None, path: str,
               tip: Manifest | None, prev: TensorEntry | None, shadow: Shadow | None,
               tracked: bool, shape: list[int], dtype: str,
               rebase: bool = False) -> ChainPlan | None:
    """The chain entry a tensor gets, or None for a full commit.

    A chain needs a compatible previous entry on the branch, a reference the store still holds
    for it, a chain within ``policy.max_chain``, and no rebase of the commit (``rebase``, from
    :func:`commit_rebases`).
    """
    if tip is None or prev is None or prev.shape != shape or prev.dtype != dtype:
        return None
    if prev.layout not in ("array", "chain"):
        return None
    if decision_want == "rows":
        mode = policy.incremental
        if mode in ("one-shot", "intermittent"):
            baseline = tip.id if prev.kind == "full" else prev.base_commit
            if prev.kind not in ("full", "incremental"):
                return None
            fractions = list(prev.fractions or []) if prev.kind == "incremental" else []
            if rebase or len(fractions) >= policy.max_chain:
                return None
            if shadow is None or shadow.commit != baseline or (
                    shadow.values is None and not tracked):
                return None
            return ChainPlan("incremental", baseline, len(fractions) + 1, fractions, shadow,
                             quant=quant)
        if mode == "consecutive":
            if prev.kind not in ("full", "consecutive") or prev.chain + 1 > policy.max_chain:
                return None
            if shadow is None or shadow.commit != tip.id or (shadow.values is None and not tracked):
                return None
            return ChainPlan("consecutive", tip.id, prev.chain + 1, [], shadow, quant=quant)
        return None
    if decision_want == "codes" and quant is not None:
        if prev.kind not in ("full", "delta") or prev.chain + 1 > policy.max_chain:
            return None
        if prev.codec is None and prev.kind == "full":
            return None
        if shadow is None or shadow.commit != tip.id or shadow.codes is None:
            return None
        return ChainPlan("delta", tip.id, prev.chain + 1, [], shadow, quant=quant)
    return None


class ChainMemory:
    """What a store remembers between its own commits: the references chains are built on.

    One :class:`Shadow` per (branch, tensor path), kept only for tensors the policy wants as
    chains. ``decider`` answers the planner; ``commit_done`` updates the shadows once the branch
    moved (a failed commit changes nothing, and rows consumed from a tracker stay unsaved).
    """

    def __init__(self) -> None:
        self._shadows: dict[tuple[str, str], Shadow] = {}

    def forget(self, branch: str | None = None) -> None:
        """Drop references (all, or one branch's): the next commits are full baselines."""
        self._shadows = {k: v for k, v in self._shadows.items()
                         if branch is not None and k[0] != branch}

    def decider(self, policy: Policy, branch: str, tip: Manifest | None, tracker: Any = None
                ) -> Callable[[str, Any, Any], tuple[Any, ChainPlan | None, str]]:
        from .arrays import dtype_name
        from .chunkcodec import QuantizedLossy

        prev_by_path = {e.path: e for e in tip.tensors} if tip is not None else {}
        rebase = commit_rebases(policy, tip)

        def decide(path: str, tensor: Any, grid: Any) -> tuple[Any, ChainPlan | None, str]:
            d = policy.decide(path, tensor)
            dtype = dtype_name(tensor.dtype)
            codec = QuantizedLossy(d.quant.codec_kwargs(dtype), d.quant.entropy) \
                if d.quant is not None else None
            if d.want == "full":
                return codec, None, "full"
            shadow = self._shadows.get((branch, path))
            table = tracker.lookup(tensor) if tracker is not None and d.want == "rows" else None
            if table is not None:  # the store clears the tracker once the snapshot is taken
                touched = tracker.touched_rows(tensor).cpu().numpy()
                rows = tensor.shape[0]
                # the tracker is cleared for every branch: each branch's reference of this
                # table keeps the rows as unsaved until a commit of that branch stores them
                for (_, p), other in self._shadows.items():
                    if p == path and other.unsaved is not None and len(other.unsaved) == rows:
                        other.unsaved[touched] = True
            chain = plan_chain(policy, d.want, d.quant, path, tip, prev_by_path.get(path), shadow,
                               table is not None, list(tensor.shape), dtype, rebase)
            if chain is not None and chain.kind == "delta" and (
                    shadow.grid_chunks != tuple(grid.chunks)):
                chain = None
            if chain is not None and table is not None and shadow.unsaved is not None:
                mask = shadow.unsaved.copy()
                if chain.kind == "incremental" and shadow.since_base is not None:
                    mask |= shadow.since_base
                chain.tracked_rows = mask
            return codec, chain, d.want

        return decide

    def commit_done(self, branch: str, commit_id: str, plan: Any, snap: Any, persisted: Any,
                    tracked: Callable[[Any], bool]) -> None:
        """Update the references after ``commit_id`` became the tip of ``branch``."""
        for p in plan.tensors:
            if p.want not in ("rows", "codes") or p.layout not in ("array", "chain"):
                continue
            key = (branch, p.path)
            host = snap.arrays.get(id(p))
            is_tracked = tracked(p.source)
            old = self._shadows.get(key)
            if p.want == "codes":
                codes = persisted.codes.get(id(p))
                self._shadows[key] = Shadow(commit_id, codes=codes,
                                            grid_chunks=tuple(p.grid.chunks)) if codes else None
                continue
            rows = p.shape[0]
            if p.kind == "incremental" and old is not None:  # baseline stays the reference
                if old.since_base is not None and old.unsaved is not None:
                    old.since_base |= old.unsaved
                    old.unsaved[:] = False
                continue
            # full baseline or consecutive: this commit is the new reference
            self._shadows[key] = Shadow(
                commit_id,
                values=None if is_tracked else np.array(host, copy=True),
                since_base=np.zeros(rows, bool) if is_tracked else None,
                unsaved=np.zeros(rows, bool) if is_tracked else None)
        self._shadows = {k: v for k, v in self._shadows.items() if v is not None}
