"""The first ``commit_async`` against the next ones, with and without ``Store.reserve`` (issue 11:
no first-commit cliff).

Usage::

    .venv/bin/python benchmarks/first_commit.py
    .venv/bin/python benchmarks/first_commit.py --sizes 256 --rounds 3
    # issue 28: open()'s default, its persist process started in the background or waited for
    .venv/bin/python benchmarks/first_commit.py --sizes 256 --configs all

What is measured
----------------
* The state: async_writer.py's synthetic state of ``--sizes`` MB (two embedding-like tables, a
  dense matrix, 300 small tensors), float32, on the CPU.
* Each round opens a fresh store (in a fresh process state for the store: new staging pool) and
  times the stall of 4 ``commit_async`` calls (each waited for before the next): the first one
  allocates and faults in its staging buffers, the next ones reuse them. With ``reserve``,
  ``store.reserve(state)`` runs first and is waited for (what happens when it is called as
  training starts, seconds before the first checkpoint).
* ``--configs``: the stores above open with ``background="thread"`` (their staging buffers);
  ``all`` adds ``background="auto"`` (open's default since issue 28): the first
  ``commit_async`` starts the persist process in the background and persists on the thread,
  the next ones go to the process once it runs; and the same with the start waited for by the
  first ``commit_async``, as before its eighteenth slice.
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
from collections.abc import Iterator
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_writer import build_state  # noqa: E402
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore.commit.auto import AutoCommitter  # noqa: E402

#: name: (open's background, reserve first, the persist process's start waited for)
CONFIGS = {"none": ("thread", False, False),
           "store.reserve(state) first": ("thread", True, False),
           "background='auto' (the default)": ("auto", False, False),
           "background='auto', its start waited for (before)": ("auto", False, True)}


@contextmanager
def start_waited_for(on: bool) -> Iterator[None]:
    """The first commit_async waits for the persist process to start, as before issue 28's
    eighteenth slice (its way chosen blocking)."""
    if not on:
        yield
        return
    moves = AutoCommitter._to_process
    AutoCommitter._to_process = lambda self, block=True: moves(self, True)
    try:
        yield
    finally:
        AutoCommitter._to_process = moves


def one_round(state: dict, config: str, root: str) -> tuple[float, list[float], float]:
    """(first stall, steady stalls, seconds the reservation took)."""
    background, reserve, waited = CONFIGS[config]
    store = ckptstore.open(tempfile.mkdtemp(dir=root), background=background)
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
    ap.add_argument("--configs", choices=["thread", "all"], default="thread",
                    help="thread: the first two configurations (background='thread'); all: "
                         "background='auto' too")
    args = ap.parse_args(argv)
    names = list(CONFIGS)[:2] if args.configs == "thread" else list(CONFIGS)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = []
    root = tempfile.mkdtemp(prefix="first-commit-")
    try:
        for size in args.sizes:
            state = build_state(size << 20)
            one_round(state, "none", root)  # warm: thread pools, codec kernels
            got: dict[str, tuple[list[float], list[float], list[float]]] = {
                name: ([], [], []) for name in names}
            for r in range(args.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    with start_waited_for(CONFIGS[name][2]):
                        first, steady, reserved = one_round(state, name, root)
                    got[name][0].append(first)
                    got[name][1].append(statistics.median(steady))
                    got[name][2].append(reserved)
                    print(f"{size} MB {name}: first {first * 1e3:.0f} ms, steady "
                          f"{statistics.median(steady) * 1e3:.0f} ms", file=sys.stderr, flush=True)
            for name, (firsts, steadies, reserves) in got.items():
                first, steady = statistics.median(firsts), statistics.median(steadies)
                rows.append([f"{size} MB", name,
                             f"{first * 1e3:.0f}", f"{steady * 1e3:.0f}", f"{first / steady:.2f}×",
                             "yes" if first <= 2 * steady else "no",
                             f"{statistics.median(reserves) * 1e3:.0f}" if CONFIGS[name][1]
                             else "–"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(markdown_table(["state", "configuration", "first stall ms", "steady stall ms",
                          "first / steady", "≤ 2×", "reserve took ms (background)"], rows,
                         "llrrrlr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
