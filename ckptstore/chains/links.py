"""The records chains are built from: a decided link (:class:`ChainLink`), what its write needs
(:class:`ChainStart`), what the store remembers of a tensor between commits (:class:`Shadow`,
seen by the decision as a :class:`Reference`), and the policy's answer for one tensor
(:class:`TensorDecision`). Plain values: the chain kinds (:mod:`ckptstore.chains.kinds`), the
chain memory and the commit planner all speak them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..chunkcodec import ChunkCodec
from ..format.grid import ChunkGrid
from ..history.manifest import Kind

if TYPE_CHECKING:  # ckptcodecs loads on first use, not with ckptstore
    import torch
    from ckptcodecs import QuantParams

    from ..policy import Want  # hints only: policy imports the walk, the walk the kinds

__all__ = ["FULL_LOSSLESS", "ChainLink", "ChainStart", "CodesBase", "Decide", "Reference",
           "Shadow", "TensorDecision"]

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


@dataclass(frozen=True)
class Reference:
    """What the store holds of a tensor's previous version on a branch (see chains.memory)."""

    commit: str
    has_values: bool
    has_codes: bool


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


@dataclass(frozen=True, eq=False)
class TensorDecision:
    """The policy's answer for one tensor: what it wanted (``full``, ``rows``, ``codes``), a
    codec other than the lossless default (None: lossless), and a chain entry to write instead of
    the full tensor (None: full)."""

    want: Want = "full"
    codec: ChunkCodec | None = None
    chain: ChainStart | None = None


Decide = Callable[[str, "torch.Tensor", ChunkGrid], TensorDecision]
FULL_LOSSLESS = TensorDecision()  # what a tensor gets when nobody decides otherwise
