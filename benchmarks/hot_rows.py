"""Predicting the next incremental commit's size: hot-row statistics against Check-N-Run.

Usage::

    .venv/bin/python benchmarks/hot_rows.py            # the DLRM benchmark's tables and stream
    .venv/bin/python benchmarks/hot_rows.py --quick

What is measured
----------------
The DLRM benchmark's access stream (benchmarks/dlrm.py: 4 tables of 400k/300k/200k/100k rows,
Zipf exponents 1.05-1.2, batches of 2048, 40 batches per interval, 12 intervals; one lookup per
table per sample). A full baseline is written at interval 0; a one-shot increment after ``n``
intervals stores every row touched since, ``S(n)`` as a fraction of all rows (the rows of the
tables are all 16 floats, so rows and bytes give the same fraction). Before interval ``n + 1``
each predictor forecasts ``S(n + 1)`` from what it has seen:

* Check-N-Run: its rebase rule assumes ``S(n + 1) >= S(n)`` and uses ``S(n)`` as the forecast;
* hot rows: the rows the counters of intervals ``1..n`` have seen, plus the smoothed
  Good-Toulmin estimate of the unseen rows one more interval adds, from the counts of counts
  (:class:`ckptstore.tracking.hotrows.HotRowRebase`, :meth:`~ckptstore.tracking.hotrows.AccessCounts.expected_new`).

For consecutive increments (the rows of the next interval alone) the table compares the last
interval's size with stochastic communication avoidance's ``sum_e 1 - (1 - p_e)^(k B d)``
from the counted ``p_e`` (:meth:`~ckptstore.tracking.hotrows.AccessCounts.expected_touched`).

The table prints forecasts and the actual ``S(n + 1)``, the absolute and relative errors, their
means.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlrm import QUICK, ClickData, Config  # noqa: E402

from ckptstore.tracking.hotrows import AccessCounts, HotRowRebase  # noqa: E402
from ckptstore.policy import Intermittent  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cfg = Config()
    if args.quick:
        cfg = replace(cfg, **QUICK)
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    gen = ClickData(cfg)
    n_tables = len(cfg.rows)
    names = [str(i) for i in range(n_tables)]
    counts = AccessCounts(dict(zip(names, cfg.rows)))
    touched = [torch.zeros(r, dtype=torch.bool) for r in cfg.rows]
    total_rows = sum(cfg.rows)
    per_interval = cfg.steps * cfg.batch
    rows_out = []
    sizes: list[float] = []
    last_window = 0.0
    t_predict = 0.0
    for n in range(cfg.intervals):
        cats = gen.draw(per_interval, stream=100 + n)["cats"]
        forecast = None
        if n > 0:
            t0 = time.perf_counter()
            forecast = HotRowRebase(counts).predicted(1, n)
            window = sum(counts.expected_touched(t, per_interval) for t in names) / total_rows
            t_predict += time.perf_counter() - t0
        for i, t in enumerate(names):
            counts.record(t, cats[:, i])
            touched[i][cats[:, i]] = True
        actual = sum(int(x.sum()) for x in touched) / total_rows
        this = sum(int(cats[:, i].unique().numel()) for i in range(n_tables)) / total_rows
        if forecast is not None:
            rows_out.append((n + 1, sizes[-1], forecast, actual, last_window, window, this))
        last_window = this
        sizes.append(actual)
    print(f"\nDLRM stream: tables {cfg.rows}, {cfg.intervals} intervals of {cfg.steps} x "
          f"{cfg.batch} samples; S(n) = rows touched since the baseline / {total_rows:,} rows\n")
    print("One-shot increment (rows since the baseline):\n")
    print("| interval n+1 | actual S(n+1) | Check-N-Run forecast S(n) | error | hot-row forecast | "
          "error |")
    print("|---|---|---|---|---|---|")
    err_c, err_h, err_cw, err_hw = [], [], [], []
    for n1, c, h, a, lw, w, this in rows_out:
        err_c.append(abs(c - a) / a)
        err_h.append(abs(h - a) / a)
        err_cw.append(abs(lw - this) / this)
        err_hw.append(abs(w - this) / this)
        print(f"| {n1} | {a:.4f} | {c:.4f} | {c - a:+.4f} ({err_c[-1]:.1%}) | {h:.4f} | "
              f"{h - a:+.4f} ({err_h[-1]:.1%}) |")
    print("\nConsecutive increment (rows of the next interval alone): the last interval's size "
          "against sum_e 1 - (1 - p_e)^(k B d) with counted p_e:\n")
    print("| interval n+1 | actual | last interval | error | hot-row window | error |")
    print("|---|---|---|---|---|---|")
    for (n1, *_, lw, w, this), ec, eh in zip(rows_out, err_cw, err_hw):
        print(f"| {n1} | {this:.4f} | {lw:.4f} | {ec:.1%} | {w:.4f} | {eh:.1%} |")
    mean = lambda e: sum(e) / len(e)  # noqa: E731
    print(f"\nmean relative error, one-shot: Check-N-Run {mean(err_c):.1%}, hot rows "
          f"{mean(err_h):.1%}; consecutive: last interval {mean(err_cw):.1%}, hot-row window "
          f"{mean(err_hw):.1%}. Forecasts took {t_predict * 1e3:.0f} ms in all "
          f"({counts.nbytes / 1e6:.1f} MB of counters)")
    ckr = next((i for i in range(1, len(sizes)) if Intermittent().should_rebase(sizes[1: i + 1])),
               None)
    print(f"first rebase Check-N-Run's rule takes (on the actual sizes): after increment {ckr}")


if __name__ == "__main__":
    main()
