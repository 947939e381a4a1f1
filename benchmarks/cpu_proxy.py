"""CPU proxy of GPU training under asynchronous checkpoints (issue 11): how much a background
persist slows a Python-bound loop.

Usage::

    .venv/bin/python benchmarks/cpu_proxy.py                   # ~2 minutes
    .venv/bin/python benchmarks/cpu_proxy.py --seconds 4 --repeat 2

What is measured
----------------
* The loop stands for a GPU training loop as the CPU sees it: a Python thread launching many
  small kernels. Here: one torch thread, each step 24 small torch ops on 32 x 32 tensors (a few
  microseconds each, so the loop is bound by Python and the GIL, like kernel launches).
* The state: ``--size`` MB of float32 (async_writer.py's synthetic state: two embedding-like
  tables, a dense matrix, 300 small tensors). Every ``--interval`` seconds of loop time the loop
  calls ``store.commit_async(state)``; the persist runs in the background while the loop goes
  on. Configurations: no checkpoint; the lossless default (byte planes); raw bits
  (``compression="none"``); ``Policy(quantize=QuantSpec(bits=8))`` (``method="auto"``: plain
  uniform asymmetric at 8 bits, as Check-N-Run) and the same with Check-N-Run's adaptive range
  search forced (``"adaptive-asymmetric"``, the default before); each at the
  ``background_priority`` values of ``--priority`` (default: the store's default, ``idle``).
* Steps per second over ``--seconds`` of loop time (after one untimed warm-up commit), each
  configuration ``--repeat`` times, interleaved; the slowdown is relative to the median rate
  without checkpoints. Goals (issue 11): lossless <= 15 %, 8-bit <= 20 % on the 2-core VM,
  and every policy <= 1.1x the slowdown of a bare copy of the state into preallocated buffers
  on the loop's thread at the same interval (its own configuration).
* ``--gil``: instead, what one persist takes from a thread that only wants the GIL: the main
  thread spins on ``time.perf_counter()`` while one ``commit_async`` persists, and every pause
  of more than 0.2 ms between two of its reads counts as time the persist's threads held the
  GIL (or the OS took the core); persist wall time and those pauses, medians of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_writer import build_state  # noqa: E402
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore import EncodingOptions, Policy, QuantSpec  # noqa: E402

CONFIGS = {
    "no checkpoint": None,
    "commit_async, lossless (default)": (EncodingOptions(), Policy()),
    "commit_async, raw bits": (EncodingOptions(compression="none"), Policy()),
    "commit_async, 8-bit": (EncodingOptions(), Policy(quantize=QuantSpec(bits=8))),
    "commit_async, 8-bit adaptive search": (
        EncodingOptions(), Policy(quantize=QuantSpec("adaptive-asymmetric", bits=8))),
}
#: the issue's yardstick: each tensor copied into a preallocated buffer on the loop's thread
#: (the stall a snapshot cannot avoid), nothing persisted
BARE = "bare copy into preallocated buffers"


def run(config: tuple | None, state: dict, seconds: float, interval: float, root: str,
        io_workers: int | None = None, priority: str = "idle") -> tuple[float, int]:
    """Steps per second of the loop, and the commits it made."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g) * 0.1
    store = None
    folder = tempfile.mkdtemp(dir=root)
    tensors = [t for t in state.values() if isinstance(t, torch.Tensor)]
    buffers = [torch.empty_like(t) for t in tensors] if config == BARE else []
    if config is not None and config != BARE:
        options, policy = config
        store = ckptstore.open(folder, options=options, policy=policy,
                               io_workers=io_workers, background_priority=priority)
        store.commit_async(state).wait()  # warm: staging buffers, compiled kernels
    steps, commits = 0, 0
    t0 = last = time.perf_counter()
    while True:
        for _ in range(6):  # 24 small ops
            x = torch.tanh(x @ w)
            x = x * 0.5 + 0.1
            x = x.clamp(-1, 1)
        steps += 1
        now = time.perf_counter()
        if config is not None and now - last >= interval:
            if store is not None:
                store.commit_async(state)
            for buf, t in zip(buffers, tensors):
                buf.copy_(t)
            commits += 1
            last = now
        if now - t0 >= seconds:
            break
    rate = steps / (time.perf_counter() - t0)
    if store is not None:
        store.close()  # waits for the last persist (not timed)
    shutil.rmtree(folder, ignore_errors=True)  # ~1 GB a run: the disk would fill
    return rate, commits


def gil_hold(config: tuple, state: dict, root: str, priority: str = "idle"
             ) -> tuple[float, int, float]:
    """One persist of ``state`` while this thread spins: its wall seconds, and the number and
    total seconds of this thread's pauses longer than 0.2 ms."""
    options, policy = config
    folder = tempfile.mkdtemp(dir=root)
    store = ckptstore.open(folder, options=options, policy=policy, background_priority=priority)
    store.commit_async(state).wait()  # warm
    pending = store.commit_async(state)
    t0 = last = time.perf_counter()
    pauses: list[float] = []
    while not pending.done():
        now = time.perf_counter()
        if now - last > 2e-4:
            pauses.append(now - last)
        last = now
    wall = time.perf_counter() - t0
    store.close()
    shutil.rmtree(folder, ignore_errors=True)
    return wall, len(pauses), sum(pauses)


def gil_table(state: dict, repeat: int) -> list[list[str]]:
    root = tempfile.mkdtemp(prefix="cpu-proxy-")
    rows = []
    try:
        runs = {name: [gil_hold(c, state, root) for _ in range(repeat)]
                for name, c in CONFIGS.items() if c}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, r in runs.items():
        rows.append([name, f"{1e3 * statistics.median(x[0] for x in r):.0f}",
                     f"{statistics.median(x[1] for x in r):.0f}",
                     f"{1e3 * statistics.median(x[2] for x in r):.0f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256, help="state size in MB")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed loop per run")
    ap.add_argument("--interval", type=float, default=1.3, help="seconds between commits")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--io-workers", type=int, nargs="+", default=[0],
                    help="store worker threads to compare (0: the store's default)")
    ap.add_argument("--priority", nargs="+", default=["idle"],
                    choices=["idle", "low", "normal"],
                    help="background_priority values to compare (default: the store's default)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="run only the checkpoint configurations whose names contain one of these")
    ap.add_argument("--gil", action="store_true",
                    help="measure what one persist takes from a thread that wants the GIL")
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    state = build_state(args.size << 20)
    if args.gil:
        print(markdown_table(["configuration", "persist ms", "pauses > 0.2 ms", "paused ms"],
                             gil_table(state, args.repeat), "lrrr"))
        return 0
    root = tempfile.mkdtemp(prefix="cpu-proxy-")
    configs = {"no checkpoint": (None, None, "idle"), BARE: (BARE, None, "idle")}
    for workers in args.io_workers:
        for priority in args.priority:
            suffix = "" if len(args.io_workers) == 1 else (
                ", default workers" if not workers else f", {workers} worker(s)")
            suffix += "" if len(args.priority) == 1 else f", {priority} priority"
            configs |= {name + suffix: (c, workers or None, priority)
                        for name, c in CONFIGS.items()
                        if c and (not args.only or any(o in name for o in args.only))}
    rates: dict[str, list[float]] = {k: [] for k in configs}
    commits: dict[str, list[int]] = {k: [] for k in configs}
    try:
        for r in range(args.repeat):
            for name, (config, workers, priority) in (configs.items() if r % 2 == 0
                                                      else reversed(list(configs.items()))):
                rate, n = run(config, state, args.seconds, args.interval, root, workers,
                              priority)
                rates[name].append(rate)
                commits[name].append(n)
                print(f"round {r + 1}: {name}: {rate:.0f} steps/s, {n} commits",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(rates["no checkpoint"])
    rows = [[name, f"{statistics.median(v):.0f}",
             "–" if name == "no checkpoint" else f"{100 * (1 - statistics.median(v) / base):+.1f} %",
             f"{statistics.median(commits[name]):.0f}"] for name, v in rates.items()]
    print(markdown_table(["configuration", "steps/s", "slowdown", "commits"], rows, "lrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
