"""The adaptive range search with its early end (the default) against the whole greedy walk
(before): kernel speed, steps walked, and the CPU a quantized commit costs (issue 28).

Usage::

    .venv/bin/python benchmarks/early_end.py                      # ~3 minutes
    .venv/bin/python benchmarks/early_end.py --rounds 2 --no-commits

What is measured
----------------
A greedy walk may end once the clip error of the values outside its range, less a margin,
reaches its best error: no later candidate can win (``codecs/csrc/adaptive.h``). The ranges are
the same bits either way; ``ckptcodecs._native.adaptive_early_end`` switches it.

Kernels: for rows of normal float32 values (``--mb`` MB of them) at each width and bit count,
the search ``ckptcodecs.adaptive.adaptive_ranges`` runs (the histogram search, or the exact one
for short rows), with the early end off and on, alternately, ``--repeat`` times each in one
process (best GB/s of each; the ranges compared every time), and the greedy steps walked per
group of segments walked together.

Commits: a child process commits ``--size`` MB (async_writer.py's synthetic state: rows of 64,
of 128 and of ~32 K values) with ``commit_async`` once to warm up, then ``--commits`` times;
the median CPU seconds per commit of the whole process (snapshot copy, search, quantize,
entropy gate, writes). The two settings alternate, one child each, for ``--rounds`` rounds; the
table gives the medians over the rounds and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

from ckptcodecs import _backend, adaptive  # noqa: E402

#: (row length, bits): Check-N-Run's embedding rows of 64 and 128, transformer rows of 384,
#: wide rows; 2 and 3 bits where the paper's 25 bins apply
KERNEL_ROWS = [(64, 4), (64, 8), (128, 4), (384, 4), (384, 8), (1024, 4), (1024, 8),
               (32, 4), (16, 2), (128, 3)]

CONFIGS = {
    "4-bit (QuantSpec(bits=4): the adaptive search)":
        "policy=Policy(quantize=QuantSpec(bits=4))",
    "8-bit adaptive search": "policy=Policy(quantize=QuantSpec('adaptive-asymmetric', bits=8))",
    "8-bit (uniform: no search)": "policy=Policy(quantize=QuantSpec(bits=8))",
}

CHILD = r"""
import os, resource, shutil, statistics, sys, tempfile
sys.path.insert(0, {bench!r})
from async_writer import build_state
from ckptcodecs import _backend
import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
_backend.native().adaptive_early_end({early})
state = build_state({size} << 20)
folder = tempfile.mkdtemp(dir={root!r})
store = ckptstore.open(folder, {config}, background='thread')  # this process's CPU
store.commit_async(state).wait()
cpu = []
for _ in range({commits}):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    store.commit_async(state).wait()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
store.close()
shutil.rmtree(folder, ignore_errors=True)
print(statistics.median(cpu))
"""


def search_once(x: np.ndarray, seg: int, lo: np.ndarray, hi: np.ndarray, nq: int,
                num_bins: int, early: bool) -> tuple[float, int, bytes]:
    """One search of all rows: (seconds, steps walked, the ranges' bytes)."""
    native = _backend.native()
    before = native.adaptive_early_end(early)
    try:
        l, h = lo.copy(), hi.copy()
        k = _backend.implementation("adaptive", "c")
        t0 = time.perf_counter()
        if adaptive.use_direct(seg, nq):
            steps = k.direct_ranges(x, seg, adaptive._NO_MASK, l, h, nq, num_bins, 1.0)
        else:
            steps = k.histogram_search(x, seg, adaptive._NO_MASK, adaptive._NO_COUNTS, l, h,
                                       nq, num_bins, 1.0)
        return time.perf_counter() - t0, steps, l.tobytes() + h.tobytes()
    finally:
        native.adaptive_early_end(before)


def kernel_rows(mb: int, repeat: int) -> list[list[str]]:
    rng = np.random.default_rng(0)
    rows = []
    for seg, bits in KERNEL_ROWS:
        nq, num_bins = 2 ** bits, adaptive.default_num_bins(bits)
        nseg = (mb << 20) // (4 * seg)
        x = rng.standard_normal(seg * nseg).astype(np.float32)
        lo = x.reshape(nseg, seg).min(1).astype(np.float64)
        hi = x.reshape(nseg, seg).max(1).astype(np.float64)
        best = {False: float("inf"), True: float("inf")}
        steps = {}
        for _ in range(repeat):
            got = {}
            for early in (False, True):
                t, steps[early], got[early] = search_once(x, seg, lo, hi, nq, num_bins, early)
                best[early] = min(best[early], t)
            if got[True] != got[False]:
                raise SystemExit(f"rows of {seg}, {bits} bits: the early end changed a range")
        groups = -(-nseg // 8)  # both searches walk 8 segments together (AVX2 and above)
        search = "exact" if adaptive.use_direct(seg, nq) else "histogram"
        rows.append([f"rows of {seg}, {bits} bits ({search})",
                     f"{steps[False] / groups:.1f}", f"{steps[True] / groups:.1f}",
                     f"{x.nbytes / best[False] / 1e9:.3f}", f"{x.nbytes / best[True] / 1e9:.3f}",
                     f"{best[False] / best[True]:.2f}x"])
    return rows


def commit_cpu(config: str, early: bool, size: int, commits: int, root: str) -> float:
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), early=early,
                        size=size, root=root, config=config, commits=commits)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return float(out.split()[-1])


def commit_rows(size: int, commits: int, rounds: int, root: str) -> list[list[str]]:
    rows = []
    for name, config in CONFIGS.items():
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for early in (False, True):
                runs[early].append(commit_cpu(config, early, size, commits, root))
        ratios = [a / b for a, b in zip(runs[True], runs[False])]
        rows.append([name, f"{statistics.median(runs[False]):.3f}",
                     f"{statistics.median(runs[True]):.3f}",
                     f"{statistics.median(ratios):.2f}x"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=16, help="MB of rows per kernel row")
    ap.add_argument("--repeat", type=int, default=5, help="kernel runs per setting")
    ap.add_argument("--size", type=int, default=256, help="state size in MB (commits)")
    ap.add_argument("--commits", type=int, default=6, help="commits timed, after a warm one")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per configuration")
    ap.add_argument("--no-commits", action="store_true", help="the kernel table only")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   os.pardir, "bench-out", "stores"),
                    help="where the stores go (removed after each child)")
    args = ap.parse_args(argv)
    if _backend.native() is None:
        raise SystemExit("ckptcodecs' compiled kernels are not built")
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    print(markdown_table(["rows (search)", "steps a group, whole walk", "with the early end",
                          "GB/s, whole walk (before)", "GB/s, early end", "speedup"],
                         kernel_rows(args.mb, args.repeat), "lrrrrr"))
    if not args.no_commits:
        os.makedirs(args.root, exist_ok=True)
        print()
        print(markdown_table(["configuration", "CPU-s a commit, whole walk (before)",
                              "with the early end", "ratio (median of rounds)"],
                             commit_rows(args.size, args.commits, args.rounds, args.root),
                             "lrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
