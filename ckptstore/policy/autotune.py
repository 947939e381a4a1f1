"""Check-N-Run's auto-tuning of quantization (sections 5.2 and 6.1), from a sample of rows.

Adaptive asymmetric quantization searches each row's range greedily in ``num_bins`` steps over a
``ratio`` of it; more bins and a wider ratio cost time and gain less and less (the paper's
figures 10-13). :func:`autotune` profiles a random sample of each table's rows and picks, per
table, the fewest bits whose relative L2 error stays within ``max_error``, and for those bits the
cheapest search (fewest iterations, ``num_bins * ratio``) within ``tolerance`` of the best error
any searched setting reaches. The result turns into a :class:`~ckptstore.policy.Policy` whose
overrides give each table its own :class:`QuantSpec`.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from .encoding import Policy, QuantSpec

__all__ = ["TableChoice", "Tuning", "autotune", "relative_error"]


def _rows(x: Any) -> np.ndarray:
    a = x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else np.asarray(
        x, dtype=np.float32)
    return a.reshape(a.shape[0], -1) if a.ndim >= 2 else a.reshape(1, -1)


def relative_error(rows: np.ndarray, spec: QuantSpec) -> float:
    """``||x - dequantize(quantize(x))|| / ||x||`` of float rows under ``spec``."""
    from ckptcodecs import dequantize, quantize

    kw = spec.codec_kwargs("float32")
    codes, params = quantize(rows, **{k: v for k, v in kw.items() if k != "dtype"})
    back = dequantize(codes, params).reshape(rows.shape)
    norm = float(np.linalg.norm(rows))
    return float(np.linalg.norm(rows - back)) / norm if norm else 0.0


@dataclass(frozen=True)
class TableChoice:
    """What :func:`autotune` chose for one table, and what it saw on the sample."""

    path: str
    spec: QuantSpec
    error: float            # relative L2 error of ``spec`` on the sample
    plain_error: float      # uniform asymmetric quantization at the same bits (no search)
    best_error: float       # the lowest error any searched setting reached at those bits
    evaluated: int          # settings quantized on the sample


@dataclass(frozen=True)
class Tuning:
    """Per-table choices and the time the profiling took."""

    choices: Mapping[str, TableChoice]
    seconds: float
    sample_rows: int

    def overrides(self) -> tuple[tuple[str, QuantSpec], ...]:
        """``Policy.overrides`` giving each tuned table its spec (paths matched literally)."""
        return tuple((glob.escape(p), c.spec) for p, c in self.choices.items())

    def policy(self, **policy_kwargs: Any) -> Policy:
        """A policy quantizing every tuned table with its own spec (other keyword arguments go
        to :class:`Policy`; their ``overrides`` come after the tuned ones)."""
        extra = tuple(policy_kwargs.pop("overrides", ()))
        return Policy(overrides=self.overrides() + extra, **policy_kwargs)


def autotune(tables: Mapping[str, Any], bits: Sequence[int] = (2, 3, 4, 8),
             max_error: float = 0.1, num_bins: Sequence[int] = (5, 10, 15, 20, 25, 30, 35,
                                                                 40, 45, 50),
             ratios: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0), tolerance: float = 0.01,
             sample_rows: int = 1024, base: QuantSpec | None = None, seed: int = 0) -> Tuning:
    """Choose bits, ``num_bins`` and ``ratio`` per table from ``sample_rows`` random rows.

    Parameters
    ----------
    tables
        Path -> 2-D float tensor or array (embedding tables: one row per embedding).
    bits
        Candidate widths, tried from the fewest: the first whose best error on the sample is at
        most ``max_error`` wins (the widest when none does).
    num_bins, ratios
        The grid of search settings profiled at each width.
    tolerance
        A setting within this share of the best error counts as good as the best; the cheapest
        of those is chosen (Check-N-Run trades the last percent of error for search time).
    base
        The spec the choices start from (method ``adaptive-asymmetric``, row granularity).
    """
    base = base or QuantSpec(method="adaptive-asymmetric")
    rng = np.random.default_rng(seed)
    widths = sorted(set(int(b) for b in bits))
    grid = sorted({(int(n), float(r)) for n in num_bins for r in ratios},
                  key=lambda s: (s[0] * s[1], s[0]))
    t0 = time.perf_counter()
    choices: dict[str, TableChoice] = {}
    for path, table in tables.items():
        rows = _rows(table)
        if rows.shape[0] > sample_rows:
            rows = rows[np.sort(rng.choice(rows.shape[0], sample_rows, replace=False))]
        choice = None
        for b in widths:
            errors = [relative_error(rows, replace(base, bits=b, num_bins=n, ratio=r))
                      for n, r in grid]
            best = min(errors)
            k = next(i for i, e in enumerate(errors) if e <= best * (1 + tolerance))
            n, r = grid[k]
            plain = relative_error(rows, replace(base, method="uniform-asymmetric", bits=b))
            choice = TableChoice(path, replace(base, bits=b, num_bins=n, ratio=r), errors[k],
                                 plain, best, len(grid) + 1)
            if best <= max_error:
                break
        choices[path] = choice
    return Tuning(choices, time.perf_counter() - t0, sample_rows)
