"""When an incremental chain should start over with a full baseline (Check-N-Run section 5.1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Intermittent", "MaxChain", "RebasePredictor"]


@runtime_checkable
class RebasePredictor(Protocol):
    """Decides, before an incremental commit, whether to write a full baseline instead.

    ``fractions`` are the sizes ``S1..Si`` of the incremental commits since the last full one, as
    fractions of a full commit.
    """

    def should_rebase(self, fractions: Sequence[float]) -> bool: ...


@dataclass(frozen=True)
class Intermittent:
    """Check-N-Run's predictor: a full baseline when ``Fc = 1 + S1 + ... + Si <= Ic = (i+1)*Si``.

    ``Fc`` estimates the cumulative size of the next ``i+1`` commits after a rebase (like the last
    ``i+1``), ``Ic`` a lower bound of the same without one (increments never shrink).

    >>> Intermittent().should_rebase([0.25, 0.3, 0.35])   # 1.9 <= 4 * 0.35
    True
    >>> Intermittent().should_rebase([0.1, 0.12])         # 1.22 > 3 * 0.12
    False
    """

    def should_rebase(self, fractions: Sequence[float]) -> bool:
        i = len(fractions)
        if i == 0:
            return False
        return 1.0 + sum(fractions) <= (i + 1) * fractions[-1]


@dataclass(frozen=True)
class MaxChain:
    """Rebase once a chain has ``length`` increments (bounds restore time); never otherwise."""

    length: int = 8

    def should_rebase(self, fractions: Sequence[float]) -> bool:
        return len(fractions) >= self.length
