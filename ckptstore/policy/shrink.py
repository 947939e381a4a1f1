"""ExCP's weight-momentum joint shrinking (Li et al., ICML 2024): the full training state, lossy.

A weight paired with its Adam moments is stored as its *residual* against the previous commit's
rebuilt values, pruned and k-means quantized; its moments are pruned jointly and quantized:

- weight residual ``r = w - w_prev``, ``criterion="excp"``: keep
  ``|r| > median(|r|) * min(cap, alpha / sqrt(mean(v)))`` (ExCP's threshold, per tensor as in its
  code; ``alpha`` has the scale of ``sqrt(v)``, so it must be tuned per model: too small and
  nothing is pruned). ``criterion="fisher"``: keep the share ``keep`` of all paired values with the
  largest ``v * r**2`` (the loss a pruned value costs, with Adam's ``v`` as the Fisher diagonal),
  one threshold over the whole model -- values that had no gradient (``v == 0``: unused embedding
  rows, moved only by weight decay) are never stored. Either way what is pruned stays in the next
  residual, since residuals are taken against what a checkout rebuilds;
- first moment ``m``: keep ``|m| > beta * mean(|m|)`` where the residual is kept, else 0;
- second moment ``v``: kept where ``m`` is; elsewhere ``fill``: ``"zero"`` (ExCP's choice, the
  default: with ``m = 0`` there too, a resumed Adam's first steps there are ~0.8x lr, then up to
  ~1.7x lr while ``v`` refills early in training and up to ~6x lr late in training) or ``"mean"``
  (the mean of the pruned values: smaller steps there until ``v`` forgets the fill, ~1/(1-beta2)
  steps). On the MiniLM fine-tune of benchmarks/full_state.py ``"zero"`` resumes better;
- kept values: ``2**bits - 1`` k-means levels per chunk, pruned ones one code of their own that
  decodes to exact zeros, then RLE + Huffman.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

__all__ = ["SHRINKABLE", "Shrink", "fisher_threshold", "residual_mask", "shrink_moments"]

_SAMPLE = 1 << 20  # saliencies sampled for the model-wide threshold

SHRINKABLE = ("float32", "bfloat16", "float16")
"""Dtypes (torch names) of the weights and moments a :class:`Shrink` shrinks (16-bit floats'
residuals are taken in float32 and rounded back; see :mod:`ckptstore.format.floatbits`)."""


@dataclass(frozen=True)
class Shrink:
    """Which tensors shrink jointly and how hard (see the module docstring).

    ``pairs``: ``(weight path, first moment path, second moment path)`` as the flattened state
    names them; :meth:`of` builds them from a model and its optimizer. Only float tensors
    (:data:`SHRINKABLE`: float32, bfloat16, float16) of at least ``min_bytes`` shrink; the rest
    follow the rest of the :class:`Policy`. The defaults
    (Fisher ranking, 5 % of the values, 4-bit codes, zero fill) are the best measured on
    benchmarks/full_state.py; ``criterion="excp"`` with ``alpha``/``cap`` is ExCP's own rule.
    """

    pairs: tuple[tuple[str, str, str], ...]
    criterion: Literal["excp", "fisher"] = "fisher"
    keep: float = 0.05
    alpha: float = 5e-5
    beta: float = 2.0
    cap: float = 2.5
    bits: int = 4
    fill: Literal["mean", "zero"] = "zero"
    min_bytes: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 8:
            raise ValueError(f"Shrink.bits must be 2..8, not {self.bits}")
        if self.alpha < 0 or self.beta < 0 or self.cap < 0:
            raise ValueError("Shrink.alpha, beta and cap must be >= 0")
        if self.criterion not in ("excp", "fisher"):
            raise ValueError(f"Shrink.criterion must be 'excp' or 'fisher', not {self.criterion!r}")
        if not 0 < self.keep <= 1:
            raise ValueError(f"Shrink.keep must be in (0, 1], not {self.keep}")
        if self.fill not in ("mean", "zero"):
            raise ValueError(f"Shrink.fill must be 'mean' or 'zero', not {self.fill!r}")

    @classmethod
    def of(cls, model: Any, optimizer: Any, model_key: str = "model", optim_key: str = "optim",
           moments: tuple[str, str] = ("exp_avg", "exp_avg_sq"), **kw: Any) -> Shrink:
        """Pair every parameter of ``model`` with its moments in ``optimizer`` (by identity, in
        the order ``optimizer.state_dict()`` numbers them), for a state committed as
        ``{model_key: model, optim_key: optimizer, ...}``. Rebuild it after a resume: the
        pairs are paths, but they are found from these very objects."""
        names = {id(p): n for n, p in model.named_parameters()}
        pairs: list[tuple[str, str, str]] = []
        index = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                name = names.get(id(p))
                if name is not None:
                    state = f"{optim_key}.state.{index}"
                    pairs.append((f"{model_key}.{name}", f"{state}.{moments[0]}",
                                  f"{state}.{moments[1]}"))
                index += 1
        if not pairs:
            raise ValueError("no parameter of the model is in the optimizer: nothing to pair")
        return cls(tuple(pairs), **kw)

    @cached_property
    def roles(self) -> Mapping[str, str]:
        """``path -> "weight" | "moment"``."""
        out: dict[str, str] = {}
        for w, m, v in self.pairs:
            out[w] = "weight"
            out[m] = out[v] = "moment"
        return out


def residual_mask(residual: np.ndarray, second: np.ndarray, alpha: float, cap: float
                  ) -> np.ndarray:
    """ExCP's weight pruning: keep ``|r| > median(|r|) * min(cap, alpha / sqrt(mean(v)))``."""
    mag = np.abs(residual)
    mean_v = float(np.mean(second, dtype=np.float64)) if second.size else 0.0
    scale = cap if mean_v <= 0 else min(cap, alpha / math.sqrt(mean_v))
    return mag > np.median(mag) * scale if mag.size else np.zeros(mag.shape, bool)


def fisher_threshold(pairs: list[tuple[np.ndarray, np.ndarray]], keep: float) -> float:
    """The saliency ``v * r**2`` above which the share ``keep`` of all ``(residual, second
    moment)`` values lies, from an evenly strided sample of about a million values (each tensor
    in proportion to its size; no saliency array is built whole)."""
    total = sum(r.size for r, _ in pairs)
    if not total or keep >= 1:
        return -1.0
    stride = max(1, total // _SAMPLE)
    sample = np.concatenate([v.reshape(-1)[::stride] * np.square(r.reshape(-1)[::stride])
                             for r, v in pairs])
    return float(np.quantile(sample, 1.0 - keep))


def shrink_moments(first: np.ndarray, second: np.ndarray, keep_weight: np.ndarray | None,
                   beta: float, fill: str) -> tuple[np.ndarray, np.ndarray]:
    """ExCP's momentum pruning: ``(m, v)`` kept where ``|m| > beta * mean(|m|)`` and the weight's
    residual is kept; pruned ``m`` is 0, pruned ``v`` is ``fill`` (see the module docstring)."""
    mag = np.abs(first)
    keep = mag > beta * float(np.mean(mag, dtype=np.float64)) if mag.size else mag > 0
    if keep_weight is not None:
        keep &= keep_weight
    pruned = ~keep
    value = 0.0
    if fill == "mean" and pruned.any():
        value = float(np.mean(second[pruned], dtype=np.float64))
    zero = np.zeros((), first.dtype)
    return (np.where(keep, first, zero),
            np.where(keep, second, np.asarray(value, dtype=second.dtype)))
