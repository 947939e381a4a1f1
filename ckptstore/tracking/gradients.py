"""``GradientEMA``: a training hook that keeps a moving average of each parameter's gradients,
from which ``Policy(sensitivity=...)`` ranks the values a quantized commit protects or prunes
(DynaQuant; :mod:`ckptstore.commit.sensitivity` turns it into scores).

The moving average lives beside each parameter (same device, float32) and is updated by a
post-accumulate-grad hook: one multiply-add per element and step. DynaQuant records it only for
the ~50 batches before a checkpoint: :meth:`GradientEMA.pause` / :meth:`~GradientEMA.resume`
bound the cost the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["GradientEMA"]


class GradientEMA:
    """``e <- beta * e + (1 - beta) * grad**2`` (``score="fisher"``) or ``|grad|``
    (``"taylor"``) for every trainable float parameter of ``model``, for a state committed as
    ``{model_key: model, ...}`` (paths ``model_key.<parameter name>``).

    Sparse gradients (``nn.Embedding(sparse=True)``) add only their rows; every row decays.
    """

    def __init__(self, model: torch.nn.Module, beta: float = 0.9, model_key: str = "model",
                 score: str = "fisher"):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), not {beta!r}")
        if score not in ("fisher", "taylor"):
            raise ValueError(f"score must be 'fisher' or 'taylor', not {score!r}")
        self.beta = float(beta)
        self.score = score
        self.enabled = True
        self._ema: dict[str, torch.Tensor] = {}
        self._handles = []
        for name, p in model.named_parameters():
            if p.requires_grad and p.dtype.is_floating_point:
                path = f"{model_key}.{name}"
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda param, path=path: self._update(path, param)))

    def _update(self, path: str, param: torch.Tensor) -> None:
        g = param.grad
        if not self.enabled or g is None:
            return
        with torch.no_grad():
            ema = self._ema.get(path)
            if ema is None:  # a DTensor's average is a DTensor of the same placement
                ema = self._ema[path] = torch.zeros_like(param, dtype=torch.float32)
            ema.mul_(self.beta)
            if g.is_sparse:
                g = g.coalesce()
                ema.index_add_(0, g.indices()[0], self._stat(g.values()) * (1.0 - self.beta))
            else:
                ema.add_(self._stat(g), alpha=1.0 - self.beta)

    def _stat(self, g: torch.Tensor) -> torch.Tensor:
        g = g.to(torch.float32)
        return g.abs() if self.score == "taylor" else g * g

    def pause(self) -> None:
        """Stop updating (the averages are kept)."""
        self.enabled = False

    def resume(self) -> None:
        """Update again from the next backward pass."""
        self.enabled = True

    @contextmanager
    def paused(self) -> Iterator[GradientEMA]:
        self.pause()
        try:
            yield self
        finally:
            self.resume()

    def reset(self) -> None:
        """Forget every average (e.g. after a resume)."""
        self._ema.clear()

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def average(self, path: str) -> torch.Tensor | None:
        """The moving average of ``grad**2`` (``score="fisher"``) or ``|grad|`` (``"taylor"``)
        for a state path (None before any gradient)."""
        return self._ema.get(path)

    def __repr__(self) -> str:
        return f"GradientEMA(beta={self.beta}, tensors={len(self._ema)}, enabled={self.enabled})"
