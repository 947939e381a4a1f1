"""How often to commit (CheckFreq section 4.3.2, and CPR's optimum for full recovery).

:class:`Frequency` profiles the iteration time and the cost of commits while training runs, and
picks the interval ``k`` (in iterations) so that the time training waits for checkpoints stays under
``max_overhead`` of the training time::

    k >= cost / (max_overhead * t_iter)         a commit's cost is amortised
    k >= persist / t_busy                       the next commit never waits for the previous one

where ``cost`` is the stall (the wait for the previous persist included) plus the time lost by
iterations that ran slower while a persist shared the machine: ``persist / t_busy * (t_busy -
t_iter)``. ``t_iter`` is timed only on iterations with no persist running, ``t_busy`` on the others,
so interference never makes the interval shorter.

With a mean time between failures the interval is at least CPR's optimum
``T_save = sqrt(2 * O_save * T_fail)`` (``O_save``: the stall). Measurements are smoothed, and the
interval is recomputed after every commit, so it follows storage that slows down or speeds up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Frequency", "cpr_interval"]


def cpr_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """CPR's optimal time between checkpoints for full recovery: ``sqrt(2 * O_save * T_fail)``.

    >>> round(cpr_interval(2.0, 3600.0))
    120
    """
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


@dataclass
class Frequency:
    """Adaptive checkpoint interval.

    Usage::

        freq = Frequency(max_overhead=0.05)
        for step in range(steps):
            train_step()
            if freq.should_commit(step):
                freq.record(store.commit_async(state))

    Parameters
    ----------
    max_overhead
        Fraction of training time that checkpoint stalls may take.
    warmup
        Iterations timed before the first commit (the first commit measures the commit cost).
    mtbf
        Mean time between failures in seconds: the interval is at least CPR's optimum.
    min_interval, max_interval
        Bounds of the interval in iterations.
    smoothing
        Weight of a new measurement in the running averages.
    """

    max_overhead: float = 0.05
    warmup: int = 10
    mtbf: float | None = None
    min_interval: int = 1
    max_interval: int = 1_000_000
    smoothing: float = 0.3
    interval: int | None = field(default=None, init=False)
    t_iter: float | None = field(default=None, init=False)
    t_busy: float | None = field(default=None, init=False)
    stall: float | None = field(default=None, init=False)
    persist: float | None = field(default=None, init=False)
    _last_tick: float | None = field(default=None, init=False, repr=False)
    _ticks: int = field(default=0, init=False, repr=False)
    _last_commit_step: int | None = field(default=None, init=False, repr=False)
    _pending: Any = field(default=None, init=False, repr=False)
    _in_commit: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.max_overhead < 1:
            raise ValueError("max_overhead is a fraction in (0, 1)")

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def should_commit(self, step: int) -> bool:
        """Call once per iteration, after it; True when a commit is due at ``step``."""
        now = time.perf_counter()
        if self._last_tick is not None and not self._in_commit:
            busy = self._pending is not None and not self._pending.done()
            if busy:
                self.t_busy = self._avg(self.t_busy, now - self._last_tick)
            else:
                self.t_iter = self._avg(self.t_iter, now - self._last_tick)
            self._update()
        self._last_tick = now
        self._in_commit = False
        self._ticks += 1
        self._observe_pending()
        if self.interval is None:
            due = self._ticks > self.warmup  # first commit: measures what a commit costs
        else:
            due = step - (self._last_commit_step or 0) >= self.interval
        if due:
            self._last_commit_step = step
            self._in_commit = True  # the commit's stall is not an iteration
        return due

    def record(self, pending: Any) -> Any:
        """Hand over the commit just made (a :class:`PendingCommit`, or a stall in seconds)."""
        if isinstance(pending, (int, float)):
            self.stall = self._avg(self.stall, float(pending))
            self._update()
            return pending
        self.stall = self._avg(self.stall, pending.stall_seconds)
        self._pending = pending
        self._update()
        return pending

    def _observe_pending(self) -> None:
        p = self._pending
        if p is not None and p.done():
            if p.persist_seconds is not None:
                self.persist = self._avg(self.persist, p.persist_seconds)
            self._pending = None
            self._update()

    def _update(self) -> None:
        t_iter = self.t_iter or self.t_busy
        if not t_iter or self.stall is None:
            return
        cost = self.stall
        if self.persist is not None:
            t_busy = max(self.t_busy or t_iter, t_iter)
            cost += self.persist / t_busy * (t_busy - t_iter)  # slowed-down iterations
        k = cost / (self.max_overhead * t_iter)
        if self.persist is not None:
            k = max(k, self.persist / max(self.t_busy or t_iter, t_iter))
        if self.mtbf is not None:
            k = max(k, cpr_interval(self.stall, self.mtbf) / self.t_iter)
        self.interval = int(min(max(math.ceil(k), self.min_interval), self.max_interval))
