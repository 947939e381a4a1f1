"""Row access statistics of embedding tables: CPR's prioritised saving and hot-row predictions.

- :class:`AccessCounts` -- one counter per row (CPR-MFU: save the ``r * N`` most used rows of a
  table, then clear their counters; 4 bytes a row, the memory CPR reports for MFU). From the
  same counters, the access probability ``p_e`` of each row gives the expected number of
  distinct rows a window of ``n`` lookups touches, ``sum_e 1 - (1 - p_e)^n`` (stochastic
  communication avoidance): :meth:`AccessCounts.expected_touched`.
- :class:`SampledRows` -- CPR-SSU: a bounded list of rows seen in a sub-sample of the accesses,
  random eviction when full (memory: the list, ``capacity`` rows of 8 bytes, independent of the
  table's size).
- :class:`HotRowRebase` -- a rebase predictor for ``Policy(incremental="intermittent")`` that
  applies Check-N-Run's rule to increment sizes predicted from the access statistics instead of
  the lower bound ``S_{i+1} >= S_i``.

Everything is vectorised torch (``index_add_``, ``topk``, ``isin``); counters live on the tables'
device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
        """Zero the counters of ``rows`` (all rows when None): CPR-MFU after saving them."""
        if rows is None:
            self.counts[table].zero_()
        else:
            self.counts[table][rows.to(self.counts[table].device)] = 0

    def probabilities(self, table: str) -> torch.Tensor:
        """``p_e``: the share of the table's recorded lookups that hit row ``e``."""
        c = self.counts[table].double()
        total = c.sum()
        return c / total if total > 0 else c

    def expected_touched(self, table: str, lookups: int) -> float:
        """Expected distinct rows of ``table`` among ``lookups`` independent lookups,
        ``sum_e 1 - (1 - p_e)^lookups`` (``lookups = k * B * d`` for ``k`` batches of ``B``
        samples with ``d`` lookups of the table each)."""
        p = self.probabilities(table)
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


@dataclass(frozen=True)
class HotRowRebase:
    """Check-N-Run's rebase rule on predicted increment sizes.

    Check-N-Run rebases when ``1 + S1 + ... + Si <= (i + 1) * Si``: the right side bounds the next
    ``i + 1`` increments by the last one. This predictor evaluates the same comparison with
    sizes predicted from the access counters: ``S(n)`` = expected rows touched in ``n`` intervals
    of ``lookups_per_interval[table]`` lookups, over all tables' rows. Rebase iff
    ``1 + S(1) + ... + S(i) <= S(i+1) + ... + S(2i+1)``.
    """

    counts: AccessCounts
    lookups_per_interval: Mapping[str, int] = field(default_factory=dict)

    def predicted(self, intervals: int) -> float:
        """``S(intervals)``: the predicted one-shot increment after that many intervals, as a
        fraction of all tables' rows."""
        rows = sum(c.numel() for c in self.counts.counts.values())
        touched = sum(self.counts.expected_touched(t, intervals * n)
                      for t, n in self.lookups_per_interval.items())
        return touched / max(rows, 1)

    def should_rebase(self, fractions: Sequence[float]) -> bool:
        i = len(fractions)
        if i == 0:
            return False
        keep_going = sum(self.predicted(j) for j in range(i + 1, 2 * i + 2))
        rebase = 1.0 + sum(self.predicted(j) for j in range(1, i + 1))
        return rebase <= keep_going and math.isfinite(keep_going)
