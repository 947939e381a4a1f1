"""Deciding chains: whether a commit rebases, and which chain link a tensor gets.

The generic part of the decision lives here (a compatible previous entry, a shape and dtype
unchanged); what each kind requires of its base is its own (:mod:`ckptstore.chains.kinds`:
``full``, ``incremental``/``consecutive`` rows, ``delta`` codes, ``xor``, ``residual``).
"""

from __future__ import annotations

from ..history.manifest import Layout, Manifest, TensorEntry
from ..policy import Policy, Want
from .kinds import chain_kinds, kind_for_want
from .links import FULL_LOSSLESS, ChainLink, ChainStart, CodesBase, Decide, Reference, \
    TensorDecision

__all__ = ["FULL_LOSSLESS", "ChainLink", "ChainStart", "CodesBase", "Decide", "Reference",
           "TensorDecision", "commit_rebases", "plan_chain"]


def commit_rebases(policy: Policy, tip: Manifest | None) -> bool:
    """Whether this commit takes a new baseline of every one-shot chain (Check-N-Run decides per
    checkpoint, so all tables rebase together and the old baseline is freed as a whole): asked
    of every chain kind (:meth:`~ckptstore.chains.kinds.ChainKind.rebases`)."""
    return tip is not None and any(k.rebases(policy, tip) for k in chain_kinds())


def plan_chain(policy: Policy, want: Want, quantized: bool, tip: Manifest | None,
               prev: TensorEntry | None, ref: Reference | None, tracked: bool,
               shape: list[int], dtype: str, rebase: bool = False) -> ChainLink | None:
    """The chain link a tensor gets, or None for a full commit.

    A chain needs a compatible previous entry on the branch, a reference the store still holds
    for it, a chain within ``policy.max_chain``, and no rebase of the commit (``rebase``, from
    :func:`commit_rebases`); the kind the policy wants says the rest.
    """
    if tip is None or prev is None or prev.shape != shape or prev.dtype != dtype:
        return None
    if prev.layout not in (Layout.ARRAY, Layout.CHAIN):
        return None
    kind = kind_for_want(want)
    return kind.link(policy, quantized, tip, prev, ref, tracked, rebase) if kind else None
