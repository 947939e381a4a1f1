"""What a durable local store's chunk files cost in CPU written past the page cache (``O_DIRECT``,
the default) against through it (buffered, fsynced, then ``POSIX_FADV_DONTNEED``: before).

Usage::

    .venv/bin/python benchmarks/direct_writes.py                    # ~3 minutes
    .venv/bin/python benchmarks/direct_writes.py --rounds 3 --only lossless

What is measured
----------------
A child process commits ``--size`` MB (async_writer.py's synthetic state) with ``commit_async``
once to warm up, then ``--commits`` times; per commit, the CPU seconds of the whole process
(user and system apart: the snapshot copy, the encode, the writes) and the wall seconds until
the commit is durable, medians over the commits. The two ways alternate, one child each, for
``--rounds`` rounds per configuration (the machine's speed drifts: ratios within a round are
the figure to read); the table gives the medians over the rounds and the median of the
per-round ratios (direct / cached). The store lives under ``--root`` (a disk that takes
O_DIRECT: ext4, xfs; where the file system refuses it both ways write through the cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

CONFIGS = {
    "lossless (default)": "options=EncodingOptions()",
    "raw bits": "options=EncodingOptions(compression='none')",
    "8-bit": "options=EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=8))",
}

CHILD = r"""
import os, resource, shutil, statistics, sys, tempfile, time
sys.path.insert(0, {bench!r})
from async_writer import build_state
import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
state = build_state({size} << 20)
folder = tempfile.mkdtemp(dir={root!r})
store = ckptstore.open(folder, {config}, background='thread')  # this process's CPU
store.storage.direct_writes = {direct}
store.commit_async(state).wait()
rows = []
for _ in range({commits}):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    store.commit_async(state).wait()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rows.append((r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime,
                 time.perf_counter() - t0))
store.close()
shutil.rmtree(folder, ignore_errors=True)
print(*(statistics.median(c) for c in zip(*rows)))
"""


def measure(config: str, direct: bool, size: int, commits: int, root: str
            ) -> tuple[float, float, float]:
    """Median (user CPU-s, system CPU-s, wall s) per commit in a fresh child process."""
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), size=size,
                        root=root, config=config, direct=direct, commits=commits)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    user, system, wall = map(float, out.split())
    return user, system, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256, help="state size in MB")
    ap.add_argument("--commits", type=int, default=6, help="commits timed, after a warm one")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per configuration")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   os.pardir, "bench-out", "stores"),
                    help="where the stores go (removed after each child)")
    ap.add_argument("--only", nargs="*", help="configurations whose names contain one of these")
    args = ap.parse_args(argv)
    os.makedirs(args.root, exist_ok=True)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = []
    for name, config in CONFIGS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for direct in (False, True):
                runs[direct].append(measure(config, direct, args.size, args.commits,
                                            args.root))
        ratios = [sum(d[:2]) / sum(c[:2]) for d, c in zip(runs[True], runs[False])]
        for direct in (False, True):
            user, system, wall = (statistics.median(col) for col in zip(*runs[direct]))
            way = "direct (O_DIRECT)" if direct else "cached (before)"
            rows.append([name, way, f"{user:.3f}", f"{system:.3f}", f"{user + system:.3f}",
                         f"{1e3 * wall:.0f}",
                         f"{statistics.median(ratios):.2f}x" if direct else ""])
    print(markdown_table(["configuration", "chunk files", "user CPU-s a commit",
                          "system CPU-s", "CPU-s", "commit ms",
                          "CPU direct / cached (median of rounds)"], rows, "llrrrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
