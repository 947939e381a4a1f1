"""Deciding chains: whether a commit rebases, and which chain entry a tensor gets.

Kinds of a tensor entry (Check-N-Run section 5.1, DynaQuant section 6):

- ``full``: the whole tensor (a baseline).
- ``incremental`` (one-shot): the rows changed since the baseline; restore reads the baseline and
  this commit.
- ``consecutive``: the rows changed since the previous commit; restore replays the chain.
- ``delta``: quantization codes of a dense tensor as cyclic deltas against the previous commit's
  codes, rearranged by base bucket (restore replays code deltas, then dequantizes once).
- ``xor``: the bits of a lossless dense tensor XOR the previous commit's bits, byte-plane coded
  (sign, exponent and high mantissa bytes of a slowly moving tensor XOR to mostly zeros; restore
  XORs the chain onto the baseline).
- ``residual``: a pruned, k-means quantized residual against the previous commit's rebuilt values
  (ExCP, :class:`~ckptstore.policy.Shrink`; restore adds the chain onto a lossless baseline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..chunkcodec import LOSSLESS_IDS
from ..history.manifest import Kind, Layout, Manifest, TensorEntry
from ..policy import Policy, Want

if TYPE_CHECKING:  # ckptcodecs (and numba) load on first use, not with ckptstore
    import torch
    from ckptcodecs import QuantParams

__all__ = ["ChainLink", "ChainStart", "CodesBase", "Reference", "commit_rebases", "plan_chain"]

CodesBase = dict[int, tuple[np.ndarray, "QuantParams"]]  # chunk index -> (codes, params)


@dataclass(frozen=True)
class ChainLink:
    """Where a chain entry sits: its kind, the commit it applies to, its length so far, and
    (one-shot) the changed-row fractions S1..S(i-1) of the chain before it."""

    kind: Kind
    base_commit: str
    chain: int
    fractions: tuple[float, ...] = ()


@dataclass(frozen=True, eq=False)
class ChainStart:
    """A decided chain entry and what its write needs: the changed rows (a tracker's mask, or
    the reference to compare against, on the host or on the tensor's device) or the base codes
    of each chunk (code deltas)."""

    link: ChainLink
    tracked_rows: np.ndarray | None = None   # bool mask of rows to store (tracker mode)
    reference: np.ndarray | None = None      # host bits of the reference (compare mode)
    # compare mode on the device: the reference kept on the tensor's device instead
    device_reference: torch.Tensor | None = None
    base_codes: CodesBase | None = None      # code deltas: the previous version's codes
    # a checkout of the reference rebuilds exactly ``reference`` (no lossy link in its chain):
    # only then may changed rows be stored as the XOR of their old bits
    exact: bool = False


def commit_rebases(policy: Policy, tip: Manifest | None) -> bool:
    """Whether this commit takes a new baseline of every one-shot chain (Check-N-Run decides per
    checkpoint, so all tables rebase together and the old baseline is freed as a whole).

    The predictor sees ``S1..Si`` of the whole checkpoint: each increment's size as a fraction of
    the rows, averaged over the incremental tensors weighted by their bytes. Chains of different
    lengths (a tensor that joined later) are aligned by rebasing.
    """
    if tip is None or policy.incremental not in ("one-shot", "intermittent"):
        return False
    inc = [e for e in (*tip.tensors, *tip.shards) if e.kind == Kind.INCREMENTAL]
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


@dataclass(frozen=True)
class Reference:
    """What the store holds of a tensor's previous version on a branch (see chains.memory)."""

    commit: str
    has_values: bool
    has_codes: bool


def plan_chain(policy: Policy, want: Want, quantized: bool, tip: Manifest | None,
               prev: TensorEntry | None, ref: Reference | None, tracked: bool,
               shape: list[int], dtype: str, rebase: bool = False) -> ChainLink | None:
    """The chain link a tensor gets, or None for a full commit.

    A chain needs a compatible previous entry on the branch, a reference the store still holds
    for it, a chain within ``policy.max_chain``, and no rebase of the commit (``rebase``, from
    :func:`commit_rebases`).
    """
    if tip is None or prev is None or prev.shape != shape or prev.dtype != dtype:
        return None
    if prev.layout not in (Layout.ARRAY, Layout.CHAIN):
        return None
    if want == "rows":
        mode = policy.incremental
        if mode in ("one-shot", "intermittent"):
            baseline = tip.id if prev.kind == Kind.FULL else prev.base_commit
            if prev.kind not in (Kind.FULL, Kind.INCREMENTAL):
                return None
            fractions = tuple(prev.fractions or []) if prev.kind == Kind.INCREMENTAL else ()
            if rebase or len(fractions) >= policy.max_chain:
                return None
            if ref is None or ref.commit != baseline or (not ref.has_values and not tracked):
                return None
            return ChainLink(Kind.INCREMENTAL, baseline, len(fractions) + 1, fractions)
        if mode == "consecutive":
            if prev.kind not in (Kind.FULL, Kind.CONSECUTIVE) or prev.chain + 1 > policy.max_chain:
                return None
            if ref is None or ref.commit != tip.id or (not ref.has_values and not tracked):
                return None
            return ChainLink(Kind.CONSECUTIVE, tip.id, prev.chain + 1)
        return None
    if want == "xor" and not quantized:
        if prev.kind not in (Kind.FULL, Kind.XOR) or prev.chain + 1 > policy.max_chain:
            return None
        if (prev.codec or {}).get("id") not in LOSSLESS_IDS:
            return None
        if ref is None or ref.commit != tip.id or not ref.has_values:
            return None
        return ChainLink(Kind.XOR, tip.id, prev.chain + 1)
    if want == "residual":
        if prev.kind not in (Kind.FULL, Kind.RESIDUAL) or prev.chain + 1 > policy.max_chain:
            return None
        if prev.kind == Kind.FULL and (prev.codec or {}).get("id") not in LOSSLESS_IDS:
            return None
        if ref is None or ref.commit != tip.id or not ref.has_values:
            return None
        return ChainLink(Kind.RESIDUAL, tip.id, prev.chain + 1)
    if want == "codes" and quantized:
        if prev.kind not in (Kind.FULL, Kind.DELTA) or prev.chain + 1 > policy.max_chain:
            return None
        if prev.codec is None and prev.kind == Kind.FULL:
            return None
        if ref is None or ref.commit != tip.id or not ref.has_codes:
            return None
        return ChainLink(Kind.DELTA, tip.id, prev.chain + 1)
    return None
