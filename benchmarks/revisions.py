"""Two revisions of the library side by side in one run: is the new code as fast as the old?

Usage::

    .venv/bin/python benchmarks/revisions.py --base 5eb7ba0              # base vs working tree
    .venv/bin/python benchmarks/revisions.py --base 5eb7ba0 --rounds 2 --scale 0.1 --quick
    .venv/bin/python benchmarks/revisions.py --base 9f87563 --head 9f87563 --cases sharded \
        --rounds 1 --repeat 1 --quick                 # smoke run: one revision twice, ratio ~1

How it works
------------
* Each revision's library (``ckptstore/`` and ``codecs/``) is materialised with ``git archive``
  into a temporary folder, next to a folder of two symlinks (``ckptstore`` and ``ckptcodecs``)
  that goes first on ``PYTHONPATH``; the working tree is used in place for ``--head`` (default).
  ``git archive`` takes the folders whole, packages and all, so a revision with another module
  layout materialises alike. The benchmark code is the working tree's (``store_io.py``,
  ``async_writer.py``, ``sharded.py``) for both, so only the imported library differs; it uses
  only API both revisions have (``ckptstore.open``, ``Policy``, ``ckptstore.dcp`` ...), never a
  module path. Each measurement runs in a fresh subprocess that prints which library files it
  imported, and those of each of its ranks for ``sharded``; a process that imported another
  revision's code, or no ckptstore at all, stops the run.
* Before the timed rounds every case runs once, untimed, on each revision (``--repeat 1``): the
  freshly archived library has no numba cache (``cache=True`` kernels compile on first use, then
  load from ``__pycache__``) and no bytecode yet, and the working tree's may be stale; without
  this the first case of one revision would pay the compiles (``train`` has no warm-up of its own).
* Rounds alternate the revisions (A B, then B A, ...) so drift of a shared machine's load hits
  both alike. Every case reports medians over its repeats; the table gives the median over rounds
  of each revision, the ratio head/base, and the spread of that ratio across rounds (min-max).
* Cases: ``store_io`` -- commit and checkout of the ~257 MB store_io model (lz4 and no
  compression), times as in store_io.py (os.sync before each, checkout touches every tensor);
  ``stall`` -- ``commit_async`` of a 256 MB state: stall / bare copy and persist time
  (async_writer.py's stall case, lossless and intermittent+q4); ``train`` -- the training loop of
  async_writer.py with ``commit_async`` every 100 steps: slowdown against no checkpoints;
  ``sharded`` -- sharded.py's rank worker on 2 gloo ranks, ckptstore only: ``dcp.save`` of
  4 x 200 000 x 64 float32 tables (``Shard(0)``) + a replicated MLP (209 MB) through
  ``ckptstore.dcp.StorageWriter`` (sharded commit) and ``dcp.load`` into ``Shard(1)`` tables
  through ``StorageReader`` (resharded load), after one untimed round; ``--scale`` scales the
  rows, ``--quick`` divides them by 10 more; ``persist`` -- the CPU seconds (all threads) a
  ``commit`` of a 256 MB synthetic state takes under lossless, 8-bit and 4-bit; ``kernels`` --
  the CPU time of BytePlanes' statistics and encoder on planes in and past the cache, of the
  selection's histogram, and of a whole BytePlanes encode of a chunk (compiled kernels only).
* A revision with compiled kernels (a ``setup.py``) is built in its archive first
  (``build_ext --inplace``, its own sources and flags): about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import command_line, load_average, machine_description, markdown_table  # noqa: E402
from common import write_text  # noqa: E402

CASES = ("store_io", "stall", "train", "sharded", "persist", "kernels")


# -- inside a subprocess: one case against whatever ckptstore is importable ---------------------
def _worker(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """``{"results": {metric: value}, "imported": [files of this process, of each rank...]}``."""
    import ckptcodecs  # noqa: F401
    import ckptstore  # noqa: F401
    from sharded import library_files

    out: dict[str, float] = {}
    ranks: list[list[str]] = []
    root = tempfile.mkdtemp(prefix="ckpt-rev-")
    try:
        if case == "store_io":
            import store_io as S

            model = S.build_model(0, args.scale)
            template = {k: v.detach().clone() for k, v in model.state_dict().items()}
            for compression, label in (("lz4", "lz4"), ("none", "raw")):
                tool = S.ckptstore_tool(compression, None)
                folder = os.path.join(root, label)
                S.run_once(tool, model, template, folder, check=True, record=False)  # warm-up
                for _ in range(args.repeat):
                    S.run_once(tool, model, template, folder, check=False, record=True)
                out[f"commit {label} (s)"] = statistics.median(tool.save_s)
                out[f"checkout {label} (s)"] = statistics.median(tool.load_s)
        elif case == "stall":
            import async_writer as A

            size = max(1, int(256 * args.scale))
            for policy in ("lossless", "intermittent+q4"):
                r = A.stall_case(size, policy, args.repeat, 1, root, 0)
                out[f"stall/bare {policy}"] = statistics.median(r.ratios)
                out[f"persist {policy} (s)"] = statistics.median(r.persist)
        elif case == "train":
            import async_writer as A
            import torch

            torch.set_num_threads(1)
            trainer = A.Trainer(max(1024, int(1_000_000 * args.scale)), 0)
            steps = 100 if args.quick else 300
            none = [A.train_run(trainer, "none", None, steps, root).rate]
            run = A.train_run(trainer, "async", 100, steps, root).rate
            none.append(A.train_run(trainer, "none", None, steps, root).rate)
            out["train slowdown, commit_async every 100 steps (%)"] = (
                100 * (statistics.mean(none) / run - 1))
        elif case == "persist":
            out.update(_persist_cpu(root, args))
        elif case == "kernels":
            out.update(_kernels_cpu(args))
        elif case == "sharded":
            import sharded as D

            rows = max(1000, int(200_000 * args.scale / (10 if args.quick else 1)))
            r = D.run(2, D.parse_args([
                "--rows", str(rows), "--repeat", str(args.repeat), "--warmup", "1",
                "--tools", "ckptstore", "--loads", "load", "--no-intervals", "--dir", root]))
            out["sharded commit, 2 ranks (s)"] = statistics.median(r["commit"]["ckptstore"])
            out["resharded load, 2 ranks (s)"] = statistics.median(r["load"]["ckptstore"])
            ranks = r["imported"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"results": out, "imported": [library_files(), *ranks]}


def _persist_cpu(root: str, args: argparse.Namespace) -> dict[str, float]:
    """CPU seconds of this process (every thread) a ``commit`` of async_writer.py's synthetic
    state, 256 MB x ``--scale``, under lossless, 8-bit and 4-bit: a persist's cost, which a
    training loop beside busy cores pays a share of (cpu_proxy.py)."""
    import async_writer as A
    import torch

    import ckptstore
    from ckptstore import Policy, QuantSpec

    torch.set_num_threads(1)
    state = A.build_state(max(1, int(256 * args.scale)) << 20)
    out = {}
    for label, policy in (("lossless", Policy()), ("8-bit", Policy(quantize=QuantSpec(bits=8))),
                          ("4-bit", Policy(quantize=QuantSpec(bits=4)))):
        store = ckptstore.open(os.path.join(root, label), policy=policy)
        store.commit(state)  # warm: buffers, first-use imports
        cpu = []
        for _ in range(args.repeat):
            t0 = time.process_time()
            store.commit(state)
            cpu.append(time.process_time() - t0)
        store.close()
        out[f"persist CPU {label} (s)"] = statistics.median(cpu)
    return out


def _kernels_cpu(args: argparse.Namespace) -> dict[str, float]:
    """CPU milliseconds of the streaming kernels on planes in the cache (2 MB: a float32
    plane of an 8 MB chunk) and past it (32 MB), of the selection's histogram, and of a whole
    BytePlanes encode of one chunk: the compiled kernels (revisions from issue 28's third slice
    on), median of 5 x ``--repeat`` calls after one."""
    import numpy as np
    import torch

    import ckptcodecs
    from ckptcodecs import _backend

    planes, select = _backend.implementation("planes", "c"), _backend.implementation("select", "c")
    rng, block, out = np.random.default_rng(0), 1 << 17, {}

    def cpu_ms(label: str, call) -> None:
        call()
        times = []
        for _ in range(5 * args.repeat):
            t0 = time.process_time()
            call()
            times.append(time.process_time() - t0)
        out[f"{label} (ms)"] = 1e3 * statistics.median(times)

    for mb in (2, 32):
        w = rng.standard_normal(mb << 18).astype(np.float32) * 0.02
        for name, plane in (("float32 exponent", (w.view(np.uint32) >> 23).astype(np.uint8)),
                            ("float16 high byte",
                             (w.astype(np.float16).view(np.uint16) >> 8).astype(np.uint8))):
            plane = np.tile(plane, 4)  # mb MB
            freq = np.zeros(((plane.size + block - 1) // block, 256), np.int64)
            code = np.empty(planes.huffman_bound(plane.size, block), np.uint8)
            cpu_ms(f"plane_stats, {name}, {mb} MB",
                   lambda p=plane, f=freq: planes.plane_stats(p, block, f))
            cpu_ms(f"huffman_encode, {name}, {mb} MB",
                   lambda p=plane, f=freq, c=code: planes.huffman_encode(p, block, f, c))
        bits = rng.standard_normal(mb << 18).astype(np.float32).view(np.uint32)
        cpu_ms(f"keys_hist, float32, {mb} MB",
               lambda b=bits: select.keys_hist(b, np.zeros(0, np.uint8), np.uint32(16),
                                               np.uint32(0x7F800000), np.zeros(1 << 15, np.int64)))
    for dtype, itemsize in ((torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)):
        x = (torch.randn((8 << 20) // itemsize) * 0.02).to(dtype)
        data = x.view(torch.int32 if itemsize == 4 else torch.int16).numpy()
        cpu_ms(f"planes_encode, {str(dtype)[6:]}, an 8 MB chunk",
               lambda d=data, i=itemsize: ckptcodecs.planes_encode(d, i))
    return out


# -- the driver ----------------------------------------------------------------------------------
@dataclass
class Revision:
    """A revision's library, importable from ``path`` (a folder put first on PYTHONPATH)."""

    name: str
    source: str  # folder holding ckptstore/ and codecs/
    path: str    # folder with the symlinks ckptstore -> source/ckptstore, ckptcodecs -> codecs
    results: dict[str, list[float]] = field(default_factory=dict)


def _git(*argv: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def materialise(rev: str | None, tmp: str, build: bool = True) -> Revision:
    """The library of git revision ``rev`` (None: the working tree) as an import folder, its C
    extensions built in place where it has them (``build``)."""
    if rev is None:
        name, source = "working tree", ROOT
    else:
        sha = _git("rev-parse", "--short", f"{rev}^{{commit}}")
        name = f"{rev} ({sha})" if rev != sha else sha
        source = tempfile.mkdtemp(prefix=f"src-{sha}-", dir=tmp)  # base and head may be equal
        compiled = _has(sha, "setup.py")  # a revision with compiled kernels: built in place
        files = ["ckptstore", "codecs"] + (["setup.py", "pyproject.toml"] if compiled else [])
        archive = subprocess.run(["git", "-C", ROOT, "archive", sha, *files],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
        if compiled and build:
            _build(source, tempfile.mkdtemp(prefix="build-", dir=tmp), name)
    path = tempfile.mkdtemp(prefix="imp-", dir=tmp)
    os.symlink(os.path.join(source, "ckptstore"), os.path.join(path, "ckptstore"))
    os.symlink(os.path.join(source, "codecs"), os.path.join(path, "ckptcodecs"))
    return Revision(name, source, path)


def _has(sha: str, path: str) -> bool:
    return subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{sha}:{path}"],
                          capture_output=True).returncode == 0


def _build(source: str, temp: str, name: str) -> None:
    """A revision's C extensions compiled into its archive (``build_ext --inplace``: its
    setup.py, its compiler flags; objects in ``temp``): without them its ckptcodecs would run
    the numba kernels, or none."""
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace",
                           "--build-temp", temp], cwd=source, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: its extensions did not build:\n{proc.stderr[-3000:]}")
    print(f"built   {name}", file=sys.stderr, flush=True)


def check_imported(rev: Revision, imported: list[list[str]]) -> None:
    """Stop the run unless every process (the worker, then its ranks) imported ckptstore and
    ckptcodecs, and every library file it imported is ``rev``'s."""
    want = {"ckptstore": os.path.realpath(os.path.join(rev.source, "ckptstore")) + os.sep,
            "ckptcodecs": os.path.realpath(os.path.join(rev.source, "codecs")) + os.sep}
    for i, files in enumerate(imported):
        who = "the worker" if i == 0 else f"rank {i - 1}"
        stray = [f for f in files if not f.startswith(tuple(want.values()))]
        missing = [n for n, w in want.items() if not any(f.startswith(w) for f in files)]
        if stray or missing:
            raise SystemExit(f"{rev.name}: {who} imported {stray[:3] or 'no ' + missing[0]}, "
                             f"not only the library under {rev.source}")


def run_case(rev: Revision, case: str, args: argparse.Namespace,
             repeat: int | None = None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([rev.path, HERE]))
    argv = [sys.executable, os.path.abspath(__file__), "--worker", case, "--repeat",
            str(repeat or args.repeat), "--scale", str(args.scale)]
    proc = subprocess.run(argv + (["--quick"] if args.quick else []), env=env,
                          capture_output=True, text=True, cwd=HERE)
    if proc.returncode != 0:
        raise SystemExit(f"{case} on {rev.name} failed:\n{proc.stderr[-3000:]}")
    got = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    check_imported(rev, got["imported"])
    return got["results"]


def report(base: Revision, head: Revision, args: argparse.Namespace, argv: Sequence[str] | None
           ) -> str:
    rows = []
    for metric in head.results:
        b, h = base.results.get(metric), head.results[metric]
        if not b:
            continue
        mb, mh = statistics.median(b), statistics.median(h)
        if metric.endswith("(%)"):  # a percentage near 0: compare by difference, in points
            diffs = [y - x for x, y in zip(b, h)]
            change, spread = f"{mh - mb:+.1f} pts", f"{min(diffs):+.1f} to {max(diffs):+.1f} pts"
        else:
            ratios = [y / x for x, y in zip(b, h) if x]
            change = f"{mh / mb:.3f}" if mb else "-"
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        rows.append([metric, f"{mb:.4g}", f"{mh:.4g}", change, spread])
    return "\n".join([
        f"Command: `{command_line('benchmarks/revisions.py', argv)}`  ",
        f"Machine: {machine_description()}; load before: {args.load_before}, after: "
        f"{load_average()}  ",
        f"base = {base.name}, head = {head.name}; {args.rounds} rounds alternating A/B, "
        f"{args.repeat} repeats per case and round (medians).",
        "",
        markdown_table(["metric", "base", "head", "head/base", "spread across rounds"],
                       rows),
        "",
        "Ratios near 1.00 (or 0 points) are no change; the spread shows the machine's noise. "
        "Lower is better for every metric (times, stall ratios, slowdown).",
    ])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="git revision to compare against (default "
                   "HEAD: the last commit vs uncommitted changes)")
    p.add_argument("--head", default=None, help="git revision (default: the working tree)")
    p.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (default 3)")
    p.add_argument("--repeat", type=int, default=3, help="repeats per case and round")
    p.add_argument("--scale", type=float, default=1.0, help="state sizes (0.1: quick smoke run)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: shorter training runs, 10x smaller sharded tables")
    p.add_argument("--markdown-out", default=None, help="also write the report here")
    p.add_argument("--json-out", default=None, help="write every measurement as JSON here")
    p.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args)), flush=True)
        return 0
    args.load_before = load_average()
    cases = [c for c in args.cases.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="ckpt-revisions-") as tmp:
        base, head = materialise(args.base, tmp), materialise(args.head, tmp)
        for case in cases:  # untimed: compiles and caches each revision's kernels
            for rev in (base, head):
                run_case(rev, case, args, repeat=1)
                print(f"warm    {case:8s} {rev.name}", file=sys.stderr, flush=True)
        for r in range(args.rounds):
            order = (base, head) if r % 2 == 0 else (head, base)
            for case in cases:
                for rev in order:
                    got = run_case(rev, case, args)
                    for k, v in got.items():
                        rev.results.setdefault(k, []).append(v)
                    print(f"round {r} {case:8s} {rev.name}: "
                          + ", ".join(f"{k} {v:.4g}" for k, v in got.items()),
                          file=sys.stderr, flush=True)
        text = report(base, head, args, argv)
    print(text)
    if args.markdown_out:
        write_text(args.markdown_out, text + "\n")
    if args.json_out:
        write_text(args.json_out, json.dumps({"base": base.name, "head": head.name,
                                              "base_results": base.results,
                                              "head_results": head.results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
