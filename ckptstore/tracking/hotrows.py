"""Row access statistics of embedding tables: CPR's prioritised saving and hot-row predictions.

- :class:`AccessCounts` -- one counter per row (CPR-MFU: save the ``r * N`` most used rows of a
  table, then clear their counters; an 8-byte counter a row -- CPR uses 4 bytes, but a hot row
  of a long run passes 2^31 lookups). From the
  same counters, the access probability ``p_e`` of each row gives the expected number of
  distinct rows a window of ``n`` lookups touches, ``sum_e 1 - (1 - p_e)^n`` (stochastic
  communication avoidance): :meth:`AccessCounts.expected_touched`, the size of the next
  consecutive increment; and the smoothed Good-Toulmin estimate of the rows not yet seen that
  more lookups add, :meth:`AccessCounts.expected_new`, for the next one-shot increment.
- :class:`SampledRows` -- CPR-SSU: a bounded list of rows seen in a sub-sample of the accesses,
  random eviction when full (memory: the list, ``capacity`` rows of 8 bytes, independent of the
  table's size).
- :class:`HotRowRebase` -- a rebase predictor for ``Policy(incremental="intermittent")`` that
  applies Check-N-Run's rule to one-shot increment sizes predicted from the access statistics
  instead of the lower bound ``S_{i+1} >= S_i``.

Everything is vectorised torch (``index_add_``, ``topk``, ``isin``); counters live on the tables'
device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = ["AccessCounts", "HotRowRebase", "SampledRows"]


class AccessCounts:
    """Per-row access counters of named tables (``{name: rows}``)."""

    def __init__(self, tables: Mapping[str, int], device: torch.device | str = "cpu"):
        self.counts = {name: torch.zeros(rows, dtype=torch.int64, device=device)
                       for name, rows in tables.items()}
        self.lookups = {name: 0 for name in tables}  # accesses recorded since the start

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.counts.values())

    def record(self, table: str, indices: torch.Tensor) -> None:
        """Count one access of every index (repeats count again)."""
        idx = indices.reshape(-1).to(self.counts[table].device, torch.int64)
        self.counts[table].index_add_(0, idx, torch.ones_like(idx))
        self.lookups[table] += idx.numel()

    def most_used(self, table: str, k: int) -> torch.Tensor:
        """The ``k`` rows with the highest counts (only rows counted at least once), sorted."""
        c = self.counts[table]
        k = min(k, int((c > 0).sum()))
        return torch.topk(c, k, sorted=False).indices.sort().values if k else c.new_empty(0)

    def clear(self, table: str, rows: torch.Tensor | None = None) -> None:
        """Zero the counters of ``rows`` (CPR-MFU after saving them), or of the whole table and
        its lookup count (at a new baseline, for :class:`HotRowRebase`)."""
        if rows is None:
            self.counts[table].zero_()
            self.lookups[table] = 0
        else:
            self.counts[table][rows.to(self.counts[table].device)] = 0

    def seen(self, table: str) -> int:
        """Rows counted at least once."""
        return int((self.counts[table] > 0).sum())

    def expected_new(self, table: str, lookups: int) -> float:
        """Rows not seen yet that ``lookups`` more lookups are expected to touch.

        The smoothed Good-Toulmin estimator (Orlitsky, Suresh and Wu, PNAS 2016) from the
        counts of counts ``f_i`` of the ``n`` lookups recorded: ``sum_i -(-t)^i P(L >= i) f_i``
        with ``t = lookups / n`` and ``L ~ Binomial(k, 2 / (t + 2))`` for ``t > 1`` (no
        smoothing, ``P = 1``, for ``t <= 1``); reliable up to ``t`` of about ``log n``. Unlike
        plugging counted frequencies into :meth:`expected_touched` it accounts for the rows the
        counters have not met. The answer never decreases with ``lookups`` (the largest estimate
        over a fixed grid of smaller ``t``) and never exceeds the rows not seen yet."""
        n = self.lookups[table]
        c = self.counts[table]
        unseen = int((c == 0).sum())
        if n <= 0 or lookups <= 0 or unseen == 0:
            return 0.0
        values, freq = torch.unique(c[c > 0], return_counts=True)  # counts of counts
        i, f = values.double(), freq.double()
        t = lookups / n
        grid = [2.0 ** (j / 4) for j in range(-24, 4 * math.ceil(math.log2(t)) + 1)
                if 2.0 ** (j / 4) < t]
        best = max((_good_toulmin(i, f, x, n) for x in (*grid, t)), default=0.0)
        return min(max(best, 0.0), float(unseen))

    def probabilities(self, table: str) -> torch.Tensor:
        """``p_e``: the share of the table's recorded lookups that hit row ``e``."""
        c = self.counts[table].double()
        total = c.sum()
        return c / total if total > 0 else c

    def expected_touched(self, table: str, lookups: int) -> float:
        """Expected distinct rows of ``table`` among ``lookups`` independent lookups,
        ``sum_e 1 - (1 - p_e)^lookups`` with the counted ``p_e`` (``lookups = k * B * d`` for
        ``k`` batches of ``B`` samples with ``d`` lookups of the table each): the size of the
        next consecutive increment. Rows the counters never met count as ``p_e = 0``; for the
        rows a one-shot increment adds, :meth:`expected_new` accounts for them."""
        p = self.probabilities(table)
        if lookups <= 0 or not bool((p > 0).any()):
            return 0.0
        # (1 - p)^n as exp(n * log1p(-p)): exact for tiny p, 0 for p = 1
        return float((-torch.expm1(lookups * torch.log1p(-p.clamp(max=1.0))))
                     .nan_to_num(1.0).sum())


class SampledRows:
    """CPR-SSU: rows seen in a ``rate`` sub-sample of accesses, at most ``capacity`` per table.

    When the list is full a new row replaces a random one. :meth:`take` hands the list over (the
    rows to save) and empties it.
    """

    def __init__(self, tables: Sequence[str], capacity: int, rate: float = 0.01,
                 seed: int = 0, device: torch.device | str = "cpu"):
        if capacity < 1 or not 0 < rate <= 1:
            raise ValueError("SampledRows needs capacity >= 1 and 0 < rate <= 1")
        self.capacity, self.rate = capacity, rate
        self.rows = {t: torch.empty(0, dtype=torch.int64, device=device) for t in tables}
        self._gen = torch.Generator(device=device).manual_seed(seed)

    @property
    def nbytes(self) -> int:
        return len(self.rows) * self.capacity * 8

    def record(self, table: str, indices: torch.Tensor) -> None:
        idx = indices.reshape(-1).to(self.rows[table].device, torch.int64)
        keep = torch.rand(idx.numel(), generator=self._gen, device=idx.device) < self.rate
        new = idx[keep].unique()
        cur = self.rows[table]
        new = new[~torch.isin(new, cur)]
        room = self.capacity - cur.numel()
        if new.numel() <= room:
            self.rows[table] = torch.cat([cur, new])
            return
        cur = torch.cat([cur, new[:room]])
        rest = new[room:]
        if rest.numel() > self.capacity:  # more new rows than slots: a random subset of them
            rest = rest[torch.randperm(rest.numel(), generator=self._gen,
                                       device=rest.device)[: self.capacity]]
        slots = torch.randperm(self.capacity, generator=self._gen, device=cur.device)[
            : rest.numel()]
        cur[slots] = rest
        self.rows[table] = cur

    def take(self, table: str) -> torch.Tensor:
        rows = self.rows[table].sort().values
        self.rows[table] = rows.new_empty(0)
        return rows


def _good_toulmin(i: torch.Tensor, f: torch.Tensor, t: float, n: int) -> float:
    """One smoothed Good-Toulmin estimate: ``f[j]`` rows were seen ``i[j]`` times in ``n``."""
    if t <= 1:
        weight = torch.ones_like(i)
    else:
        k = max(1, int(0.5 * math.log2(n * t * t / (t - 1))))
        q = 2.0 / (t + 2.0)
        j = torch.arange(0, k + 1, dtype=torch.float64)  # P(L >= i) for L ~ Binomial(k, q)
        logpmf = (math.lgamma(k + 1.0) - torch.lgamma(j + 1) - torch.lgamma(k - j + 1)
                  + j * math.log(q) + (k - j) * math.log1p(-q))
        tail = torch.flip(torch.cumsum(torch.flip(logpmf.exp(), [0]), 0), [0])
        keep = i <= k
        i, f = i[keep], f[keep]
        weight = tail[i.long()]
    return float((-((-t) ** i) * weight * f).sum())


@dataclass(frozen=True)
class HotRowRebase:
    """Check-N-Run's rebase rule with the future increments predicted from access counts.

    Check-N-Run rebases when ``Fc = 1 + S1 + ... + Si <= Ic = (i + 1) * Si``: ``Ic`` bounds the
    next ``i + 1`` one-shot increments by the last one (they never shrink). This predictor
    forecasts them instead: ``S(i + j)`` = (rows seen since the baseline + the rows the next
    ``j`` intervals are expected to add, :meth:`AccessCounts.expected_new`) / all rows, and
    rebases iff ``Fc <= S(i+1) + ... + S(2i+1)``. The counters must cover the intervals since
    the baseline (``counts.clear(table)`` for every table at each full commit).
    """

    counts: AccessCounts

    def predicted(self, ahead: int, intervals: int) -> float:
        """``S`` after ``ahead`` more intervals, the counters having seen ``intervals`` of them
        since the baseline; a fraction of all tables' rows."""
        rows = sum(c.numel() for c in self.counts.counts.values())
        touched = 0.0
        for t in self.counts.counts:
            per_interval = self.counts.lookups[t] / max(intervals, 1)
            touched += self.counts.seen(t) + self.counts.expected_new(
                t, round(ahead * per_interval))
        return min(touched / max(rows, 1), 1.0)

    def should_rebase(self, fractions: Sequence[float]) -> bool:
        i = len(fractions)
        if i == 0:
            return False
        keep_going = sum(self.predicted(j, i) for j in range(1, i + 2))
        return 1.0 + sum(fractions) <= keep_going
