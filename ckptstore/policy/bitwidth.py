"""Bit-width from the expected number of restores (Check-N-Run section 6.2.1).

Each restore from a quantized checkpoint adds quantization error to training; the fewer restores
a job expects, the fewer bits its checkpoints need. Check-N-Run's thresholds keep accuracy within
its budget: 2 bits for 1 restore, 3 bits up to 3, 4 bits up to 20, 8 bits beyond. Once the actual
number of restores exceeds the estimate, commits fall back to the safe width.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BitWidth"]


@dataclass(frozen=True)
class BitWidth:
    """Pick the bits of quantized commits from the restore budget.

    Parameters
    ----------
    expected_restores
        How many times the job is expected to resume from a checkpoint.
    thresholds
        ``(max restores, bits)`` pairs in increasing order.
    fallback
        Bits once the restores exceed the estimate or the last threshold.

    >>> BitWidth(expected_restores=1).bits(restores_so_far=0)
    2
    >>> BitWidth(expected_restores=10).bits(restores_so_far=3)
    4
    >>> BitWidth(expected_restores=1).bits(restores_so_far=2)   # more than expected
    8
    """

    expected_restores: int = 1
    thresholds: tuple[tuple[int, int], ...] = ((1, 2), (3, 3), (20, 4))
    fallback: int = 8

    def __post_init__(self) -> None:
        if self.expected_restores < 0:
            raise ValueError("expected_restores must be >= 0")
        if any(not 1 <= b <= 8 for _, b in self.thresholds) or not 1 <= self.fallback <= 8:
            raise ValueError("bits must be in 1..8")

    def bits(self, restores_so_far: int = 0) -> int:
        if restores_so_far > self.expected_restores:
            return self.fallback
        for limit, bits in self.thresholds:
            if self.expected_restores <= limit:
                return bits
        return self.fallback
