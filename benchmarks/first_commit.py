"""The first ``commit_async`` against the next ones, with and without ``Store.reserve`` (issue 11:
no first-commit cliff).

Usage::

    .venv/bin/python benchmarks/first_commit.py
    .venv/bin/python benchmarks/first_commit.py --sizes 256 --rounds 3

What is measured
----------------
* The state: async_writer.py's synthetic state of ``--sizes`` MB (two embedding-like tables, a
  dense matrix, 300 small tensors), float32, on the CPU.
* Each round opens a fresh store (in a fresh process state for the store: new staging pool) and
  times the stall of 4 ``commit_async`` calls (each waited for before the next): the first one
  allocates and faults in its staging buffers, the next ones reuse them. With ``reserve``,
  ``store.reserve(state)`` runs first and is waited for (what happens when it is called as
  training starts, seconds before the first checkpoint).
* Printed: the median first stall, the median steady stall (commits 2-4) and their ratio, per
  configuration; goal ≤ 2x (issue 11). Configurations alternate round by round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_writer import build_state  # noqa: E402
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402


def one_round(state: dict, reserve: bool, root: str) -> tuple[float, list[float], float]:
    """(first stall, steady stalls, seconds the reservation took)."""
    store = ckptstore.open(tempfile.mkdtemp(dir=root), background="thread")  # its buffers
    reserved = 0.0
    try:
        if reserve:
            t0 = time.perf_counter()
            store.reserve(state).result()
            reserved = time.perf_counter() - t0
        stalls = []
        for i in range(4):
            t0 = time.perf_counter()
            pending = store.commit_async(state, message=f"commit {i}")
            stalls.append(time.perf_counter() - t0)
            pending.wait()
    finally:
        store.close()
    return stalls[0], stalls[1:], reserved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024], help="MB")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = []
    root = tempfile.mkdtemp(prefix="first-commit-")
    try:
        for size in args.sizes:
            state = build_state(size << 20)
            one_round(state, False, root)  # warm: thread pools, codec kernels
            got: dict[bool, tuple[list[float], list[float], list[float]]] = {
                False: ([], [], []), True: ([], [], [])}
            for r in range(args.rounds):
                for reserve in ((False, True) if r % 2 == 0 else (True, False)):
                    first, steady, reserved = one_round(state, reserve, root)
                    got[reserve][0].append(first)
                    got[reserve][1].append(statistics.median(steady))
                    got[reserve][2].append(reserved)
                    print(f"{size} MB reserve={reserve}: first {first * 1e3:.0f} ms, steady "
                          f"{statistics.median(steady) * 1e3:.0f} ms", file=sys.stderr, flush=True)
            for reserve, (firsts, steadies, reserves) in got.items():
                first, steady = statistics.median(firsts), statistics.median(steadies)
                rows.append([f"{size} MB", "store.reserve(state) first" if reserve else "none",
                             f"{first * 1e3:.0f}", f"{steady * 1e3:.0f}", f"{first / steady:.2f}×",
                             "yes" if first <= 2 * steady else "no",
                             f"{statistics.median(reserves) * 1e3:.0f}" if reserve else "–"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(markdown_table(["state", "reservation", "first stall ms", "steady stall ms",
                          "first / steady", "≤ 2×", "reserve took ms (background)"], rows,
                         "llrrrlr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
