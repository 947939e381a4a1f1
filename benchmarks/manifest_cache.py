"""What the manifest cache keeps alive in a training process (issue 28: commits must not slow
the loop, and a full garbage collection pauses every Python thread).

Usage::

    .venv/bin/python benchmarks/manifest_cache.py            # ~2 minutes
    .venv/bin/python benchmarks/manifest_cache.py --commits 100 --tensors 300

What is measured
----------------
A process commits ``--commits`` times a state of ``--tensors`` small tensors (one entry each in
the manifest), synchronously, to a local store, with the manifest cache bounded by manifests
only (512, as before) and by entries (``CACHED_ENTRIES``, the default now), one after the
other in the same process. After the commits: the decoded manifests alive, the memory the
store's caches hold (tracemalloc: the growth from the first commit to the last), Python objects
tracked by the garbage collector, and how long one full collection (``gc.collect()``) takes --
what a training thread waits when the collector runs a full pass, which the growth of
long-lived objects triggers.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore.history import repository  # noqa: E402
from ckptstore.history.manifest import Manifest  # noqa: E402


def run(budget: int, commits: int, tensors: int) -> list[str]:
    saved = repository.CACHED_ENTRIES
    repository.CACHED_ENTRIES = budget
    g = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.w": torch.randn(64, generator=g) for i in range(tensors)}
    try:
        with tempfile.TemporaryDirectory() as root, ckptstore.open(root) as store:
            store.commit(state)
            gc.collect()
            tracemalloc.start()
            t0 = time.perf_counter()
            for step in range(commits - 1):
                state["layers.0.w"][0] = step
                store.commit(state)
            per_commit = (time.perf_counter() - t0) / (commits - 1)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            alive = sum(isinstance(o, Manifest) for o in gc.get_objects())
            objects = len(gc.get_objects())
            pauses = []
            for _ in range(5):
                t0 = time.perf_counter()
                gc.collect()
                pauses.append(time.perf_counter() - t0)
            log_s = time.perf_counter()
            store.log()
            log_s = time.perf_counter() - log_s
    finally:
        repository.CACHED_ENTRIES = saved
    label = "512 manifests (before)" if budget > commits * (tensors + 1) else \
        f"{budget} entries (now)"
    return [label, str(alive), f"{held / 2**20:.0f}", f"{objects:,}",
            f"{1e3 * min(pauses):.0f}", f"{1e3 * per_commit:.1f}", f"{1e3 * log_s:.0f}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--tensors", type=int, default=300)
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = [run(1 << 40, args.commits, args.tensors),
            run(repository.CACHED_ENTRIES, args.commits, args.tensors)]
    print(markdown_table(["manifest cache bound", "manifests alive", "MB held after",
                          "objects tracked", "full gc ms", "ms a commit", "log() ms"],
                         rows, "lrrrrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
