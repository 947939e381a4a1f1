"""The cold start of a new machine (issue 28): a fresh process's first commit and first checkout.

Usage::

    .venv/bin/python benchmarks/cold_start.py                  # 10 MB, 3 processes each
    .venv/bin/python benchmarks/cold_start.py --mb 10 --runs 5 --kernels c numba

What is measured, each in fresh processes with numba's cache empty (``NUMBA_CACHE_DIR`` a new
folder: what every new node, container or CI run starts with), under each
``CKPTCODECS_KERNELS`` of ``--kernels``:

* **commit on a fresh install**: the process imports torch (not timed: a training process has
  it), then times ``import ckptstore``, ``ckptstore.open`` of a new local store and
  ``store.commit`` of a ``--mb`` MB float32 state (async_writer.py's synthetic one, lossless
  default policy): the first commit; then every tensor changes and it commits again, twice:
  the commit of a warm process (the faster of the two).
* **commit on a warm install**: the same in a second fresh process, numba's cache now filled
  by the first (what a machine that ran ckptstore before pays). Goal: the first commit on a
  fresh install <= 1.2x the first on a warm one.
* **checkout**: a second fresh process (torch imported first, not timed) times ``import
  ckptstore`` + ``open`` + ``checkout`` of that store's last commit. Goal: <= 0.5 s.

Wall seconds, the median over ``--runs`` processes; the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

COMMIT = """
import json, sys, time
sys.path.insert(0, {here!r})
import torch
from async_writer import build_state
state = build_state({nbytes})
t0 = time.perf_counter()
import ckptstore
store = ckptstore.open({path!r})
store.commit(state)
first = time.perf_counter() - t0
warm = []
for step in (1, 2):
    for t in state.values():
        if isinstance(t, torch.Tensor):
            t.add_(0.001)
    state["step"] = step
    t1 = time.perf_counter()
    store.commit(state)
    warm.append(time.perf_counter() - t1)
store.close()
print(json.dumps({{"first": first, "warm": min(warm)}}))
"""

CHECKOUT = """
import json, time
import torch
t0 = time.perf_counter()
import ckptstore
store = ckptstore.open({path!r}, create=False)
state = store.checkout("main")
took = time.perf_counter() - t0
assert state["step"] == 2
print(json.dumps({{"checkout": took}}))
"""


def _child(code: str, kernels: str, cache: str) -> dict[str, float]:
    env = dict(os.environ, CKPTCODECS_KERNELS=kernels, NUMBA_CACHE_DIR=cache,
               OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=900)
    return json.loads(run.stdout.strip().splitlines()[-1])


def measure(kernels: str, nbytes: int) -> dict[str, float]:
    """One fresh-machine round: a first commit, warm commits, the same on a warm install, a
    fresh process's checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        cache, path = os.path.join(tmp, "numba-cache"), os.path.join(tmp, "store")
        result = _child(COMMIT.format(here=HERE, nbytes=nbytes, path=path), kernels, cache)
        again = _child(COMMIT.format(here=HERE, nbytes=nbytes, path=path + "-2"), kernels, cache)
        result["installed"] = again["first"]
        result.update(_child(CHECKOUT.format(path=path), kernels, cache))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kernels", nargs="+", default=["c", "numba"])
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = {k: [] for k in args.kernels}
    for _ in range(args.runs):  # interleaved: every implementation sees the same load
        for kernels in args.kernels:
            rows[kernels].append(measure(kernels, int(args.mb * 2**20)))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print(f"{args.mb:g} MB state, numba cache empty, median of {args.runs} fresh processes\n")
    print("| `CKPTCODECS_KERNELS` | first commit, fresh install s | first commit, warm install s "
          "| fresh / warm | commit in a warm process s | import + open + first checkout s |")
    print("|:--|--:|--:|--:|--:|--:|")
    for kernels, runs in rows.items():
        first, installed, warm, checkout = (statistics.median(r[key] for r in runs)
                                            for key in ("first", "installed", "warm", "checkout"))
        print(f"| {kernels} | {first:.2f} | {installed:.2f} | {first / installed:.2f}x "
              f"| {warm:.2f} | {checkout:.2f} |")


if __name__ == "__main__":
    main()
