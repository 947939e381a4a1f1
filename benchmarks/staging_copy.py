"""The stall of ``commit_async`` on the CPU against torch's own ``copy_`` into preallocated
buffers (issue 11: ≤ 1.2×).

Usage::

    .venv/bin/python benchmarks/staging_copy.py
    .venv/bin/python benchmarks/staging_copy.py --sizes 256 --rounds 5 --threads 1

What is measured
----------------
* The state: ``16`` float32 tensors of ``size / 16`` MB each, plus their transposes' worth of
  strided tensors when ``--strided`` is given.
* Side by side in every round: torch's ``copy_`` of every tensor into preallocated tensors (what
  a hand-written snapshot costs), ``np.copyto`` into preallocated arrays (one thread), and the
  stall of ``store.commit_async(state)`` (raw bits; steady state: the staging buffers exist),
  each persist waited for before the next round. Medians of ``--rounds``.
* torch runs ``--threads`` intra-op threads (default: torch's default, the CPU count).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402


def measure(size_mb: int, rounds: int, strided: bool) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    n = (size_mb << 20) // 16 // 4
    state = {f"t{i}": torch.randn(n, generator=g) for i in range(16)}
    if strided:
        side = int(n ** 0.5)
        state = {k: v[: side * side].view(side, side).t() for k, v in state.items()}
    dst = {k: torch.empty(v.shape) for k, v in state.items()}
    host = {k: np.empty(v.shape, np.float32) for k, v in state.items()}

    def torch_copy() -> None:
        for k, v in state.items():
            dst[k].copy_(v)

    def numpy_copy() -> None:
        for k, v in state.items():
            np.copyto(host[k], v.numpy())

    folder = tempfile.mkdtemp(prefix="staging-")
    store = ckptstore.open(folder, options=ckptstore.EncodingOptions(compression="none"),
                           background="thread")  # the persist thread's staging buffers
    store.commit_async(state).wait()
    torch_copy()
    numpy_copy()
    out: dict[str, list[float]] = {"torch copy_": [], "np.copyto": [], "commit_async stall": []}
    try:
        for _ in range(rounds):
            for name, fn in (("torch copy_", torch_copy), ("np.copyto", numpy_copy)):
                t0 = time.perf_counter()
                fn()
                out[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pending = store.commit_async(state)
            out["commit_async stall"].append(time.perf_counter() - t0)
            pending.wait()
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)  # a GB per size and round otherwise
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024], help="MB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--strided", action="store_true", help="transposed (non-contiguous) tensors")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = []
    for size in args.sizes:
        m = measure(size, args.rounds, args.strided)
        ratio = m["commit_async stall"] / m["torch copy_"]
        rows.append([f"{size} MB", f"{m['torch copy_'] * 1e3:.1f}", f"{m['np.copyto'] * 1e3:.1f}",
                     f"{m['commit_async stall'] * 1e3:.1f}", f"{ratio:.2f}×",
                     "yes" if ratio <= 1.2 else "no"])
    print(markdown_table(["state", "torch copy_ ms", "np.copyto ms", "commit_async stall ms",
                          "stall / torch copy_", "≤ 1.2×"], rows, "lrrrrl"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
