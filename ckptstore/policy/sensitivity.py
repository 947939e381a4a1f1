"""What ``Policy(sensitivity=...)`` takes: moving averages of gradients by state path, and how
they score a value (:class:`ckptstore.GradientEMA` is the one the library gives)."""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["GradientAverages"]


class GradientAverages(Protocol):
    """Gradient statistics a commit ranks quantized values by (DynaQuant's sensitivity).

    Attributes
    ----------
    score
        ``"fisher"``: :meth:`average` is ``E[g**2]`` and a value's sensitivity ``w**2 * E[g**2]``;
        ``"taylor"``: ``E|g|`` and ``|w| * E|g|``.
    """

    score: str

    def average(self, path: str) -> torch.Tensor | None:
        """The average for a state path (``model.<parameter name>``), None where no gradient
        was seen (its values are then ranked by magnitude)."""
        ...
