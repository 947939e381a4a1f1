"""Async writer (issue 5): how long ``commit_async`` stalls the caller, what checkpointing costs a
training loop, and how much host memory a commit needs.

Usage::

    .venv/bin/python benchmarks/async_writer.py                  # everything, ~5 minutes
    .venv/bin/python benchmarks/async_writer.py --quick          # small states, ~1 minute
    .venv/bin/python benchmarks/async_writer.py stall --sizes 64,256 --repeat 7
    .venv/bin/python benchmarks/async_writer.py train rss --markdown-out /tmp/async.md

Parts (positional, default all): ``stall``, ``train``, ``rss``, ``gpu``.

What is measured
----------------
* **stall** -- the synthetic state of ``--sizes`` MB (float32: two embedding-like tables of 64 and
  128 columns, a dense 512-row matrix, 300 small tensors of 256 B to 64 KiB, and a step counter).
  Each round first "trains" (untimed: 1 % of the embedding rows and the whole dense matrix
  change), then times a *bare copy* of every tensor into preallocated, already-touched numpy
  buffers (``np.copyto``) and the wall time ``store.commit_async(state)`` blocks the caller (the
  previous persist has finished, so it never waits for one). Rounds alternate which of the two
  goes first; ``os.sync()`` runs untimed before each. ``--warmup`` commits come first (staging
  buffers allocated; the incremental policy gets its baseline), then ``--repeat`` timed rounds:
  medians are reported, and the ratio is the median of the per-round ratios. Two policies: the
  lossless default and ``Policy(incremental="intermittent", quantize=QuantSpec(bits=4))``.
  Persist time (``PendingCommit.persist_seconds``) and the logical bytes it stored per second are
  reported for context. The store is a local temporary folder.
* **train** -- a CPU training loop (``torch.set_num_threads(--threads)``, default 1): an
  ``EmbeddingBag`` (sparse gradients) of ``--rows`` x 64 float32 and an MLP 64-512-512-1, SGD,
  batch 512 of 8 ids, pre-generated synthetic batches. Steps/s over ``--steps`` steps, with (i) no
  checkpointing, (ii) ``commit_async`` every k steps, (iii) ``store.commit`` every k steps, (iv)
  ``torch.save`` to a new file every k steps, for each k of ``--k``; then (v) ``Frequency(
  max_overhead=0.05)`` decides when to ``commit_async``. Every run starts with 10 untimed steps
  and one untimed commit (steady state: staging buffers exist), and does not include waiting for
  the last asynchronous persist at the end. ``--train-repeat`` rounds run every config once,
  with (i) first and last in the round; a config's overhead in a round is relative to the mean
  rate of the round's two (i) runs, and medians over rounds are reported. Also reported: the
  wall time spent inside the checkpoint calls (for ``commit_async``: and waiting in it for the
  previous persist) as a share of the training time without checkpointing.
* **rss** -- each commit variant runs in a fresh subprocess. It reads ``VmRSS`` from
  ``/proc/self/status`` after building the state, resets the peak (``/proc/self/clear_refs``,
  falls back to ``ru_maxrss`` without a reset), commits, waits until everything is persisted and
  reads the peak (``VmHWM``). Reported: (peak - after build) / state size. ``commit_async`` is
  measured at its first commit (staging allocated) and at a steady-state commit (peak reset
  again before it).
* **gpu** -- the stall benchmark with the state on ``cuda:0``: the bare copy is ``copy_`` into
  preallocated pinned buffers plus ``torch.cuda.synchronize()``; the stall is the time
  ``commit_async`` blocks (its copies are asynchronous) and the time until
  ``torch.cuda.synchronize()`` after it returns. Skipped without a CUDA device.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (MB, fmt_ratio, human_bytes, load_average, machine_description,  # noqa: E402
                    markdown_table, write_text)

import ckptstore  # noqa: E402
from ckptstore import Frequency, Policy, QuantSpec  # noqa: E402

SECTION = "## Async writer (stall, throughput, memory)"
MiB = 2**20

POLICIES: dict[str, Callable[[], Policy]] = {
    "lossless": Policy,
    "intermittent+q4": lambda: Policy(incremental="intermittent", quantize=QuantSpec(bits=4)),
}

_SMALL_SHAPES = [(64,), (256,), (1024,), (64, 64), (4096,), (128, 64)]  # 256 B .. 32 KiB
N_SMALL = 300


# -- the state -------------------------------------------------------------------------------------
def build_state(nbytes: int, seed: int = 0, device: str = "cpu") -> dict[str, Any]:
    """About ``nbytes`` of float32: two embedding-like tables (2-D, >= 1024 rows), a dense
    512-row matrix, 300 small tensors and a step counter. Deterministic for a seed."""
    g = torch.Generator().manual_seed(seed)
    small = {f"layers.{i // 6}.p{i % 6}": _SMALL_SHAPES[i % 6] for i in range(N_SMALL)}
    small_bytes = sum(4 * int(np.prod(s)) for s in small.values())
    rest = max(nbytes - small_bytes, 4 * MiB)
    shapes = {"emb_a.weight": (max(1024, int(rest * 0.45) // (64 * 4)), 64),
              "emb_b.weight": (max(1024, int(rest * 0.30) // (128 * 4)), 128),
              "dense.weight": (512, max(1, int(rest * 0.25) // (512 * 4))),
              **small}
    state: dict[str, Any] = {}
    for name, shape in shapes.items():
        t = torch.empty(shape, dtype=torch.float32)
        t.normal_(0.0, 0.05, generator=g)
        state[name] = t.to(device) if device != "cpu" else t
    state["step"] = 0
    return state


def tensors_of(state: dict[str, Any]) -> list[torch.Tensor]:
    return [v for v in state.values() if isinstance(v, torch.Tensor)]


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(state))


#: the encoding of the stall and train stores (``--compression``)
OPTIONS: list = [None]


def train_a_bit(state: dict[str, Any], round_: int, frac: float = 0.01) -> None:
    """What happens between two commits: 1 % of the embedding rows and every dense weight
    change (deterministic for a round)."""
    g = torch.Generator().manual_seed(1000 + round_)
    with torch.no_grad():
        for name in ("emb_a.weight", "emb_b.weight"):
            t = state[name]
            rows = torch.randint(0, t.shape[0], (max(1, int(t.shape[0] * frac)),), generator=g)
            t[rows.to(t.device)] += 1e-3
        state["dense.weight"].mul_(0.999)
    state["step"] = round_


def sync_fs() -> None:
    if hasattr(os, "sync"):
        os.sync()


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ms(x: float) -> str:
    return f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}"


# -- 1. stall --------------------------------------------------------------------------------------
@dataclass
class StallResult:
    size: int
    policy: str
    ntensors: int
    bare: list[float] = field(default_factory=list)
    stall: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    cpu_ratios: list[float] = field(default_factory=list)
    first_stall: float = float("nan")
    persist: list[float] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    pool_bytes: int = 0


def staging_bytes(store: Any) -> int:
    """Bytes of the store's staging buffers (``Store.staging_bytes``; older releases kept them
    in ``Store._staging``, so benchmarks/revisions.py can run this file against them)."""
    if hasattr(store, "staging_bytes"):
        return store.staging_bytes
    return store._staging.nbytes


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of the calling thread, result)."""
    c0, t0 = time.thread_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.thread_time() - c0, out


def stall_case(size_mb: int, policy: str, repeat: int, warmup: int, root: str,
               seed: int) -> StallResult:
    state = build_state(size_mb * MB, seed)
    tensors = tensors_of(state)
    sources = [t.numpy() for t in tensors]
    buffers = [np.empty_like(a) for a in sources]

    def bare_copy() -> None:
        for dst, src in zip(buffers, sources, strict=True):
            np.copyto(dst, src)

    bare_copy()  # warm: buffers allocated and touched
    res = StallResult(state_bytes(state), policy, len(tensors))
    folder = tempfile.mkdtemp(prefix=f"stall-{size_mb}-", dir=root)
    # the persist thread, open's default before issue 28's seventeenth slice
    store = ckptstore.open(folder, policy=POLICIES[policy](), options=OPTIONS[0],
                           background="thread")
    try:
        for r in range(warmup + repeat):
            train_a_bit(state, r + 1)
            sync_fs()
            bare1, bare1_cpu, _ = _timed(bare_copy)
            stall, stall_cpu, pending = _timed(
                lambda message=f"round {r}": store.commit_async(state, message=message))
            info = pending.wait()
            sync_fs()
            bare2, bare2_cpu, _ = _timed(bare_copy)
            if r == 0:
                res.first_stall = stall
            if r < warmup:
                continue
            bare = (bare1 + bare2) / 2
            res.bare.append(bare)
            res.stall.append(stall)
            res.ratios.append(stall / bare)
            res.cpu_ratios.append(stall_cpu / max((bare1_cpu + bare2_cpu) / 2, 1e-9))
            res.persist.append(pending.persist_seconds)
            res.stored.append(info.stored_bytes)
        res.pool_bytes = staging_bytes(store)
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    return res


def run_stall(args: argparse.Namespace, root: str) -> str:
    results = []
    for size in args.sizes:
        for policy in POLICIES:
            repeat = args.repeat if size < 1000 else max(1, min(args.repeat, args.repeat_large))
            r = stall_case(size, policy, repeat, args.warmup, root, args.seed)
            print(f"  stall {human_bytes(r.size)} {policy}: bare {ms(median(r.bare))} ms, "
                  f"stall {ms(median(r.stall))} ms, ratio {median(r.ratios):.2f} "
                  f"(cpu {median(r.cpu_ratios):.2f}), load {load_average()}",
                  file=sys.stderr, flush=True)
            results.append(r)
            gc.collect()
    rows = []
    for r in results:
        persist = median(r.persist)
        ratio = median(r.ratios)
        rows.append([human_bytes(r.size), r.policy, len(r.stall),
                     ms(median(r.bare)), ms(median(r.stall)),
                     ms(median([s - b for s, b in zip(r.stall, r.bare, strict=True)])),
                     fmt_ratio(ratio), fmt_ratio(median(r.cpu_ratios)),
                     "yes" if ratio <= 1.5 else "**no**", ms(r.first_stall),
                     f"{persist:.2f}", human_bytes(median(r.stored)),
                     f"{r.size / persist / MB:.0f}"])
    return (f"{results[0].ntensors if results else 0} tensors per state. Ratios are medians of "
            "per-round ratios; the bare copy of a round is the mean of one taken just before and "
            "one just after the commit. CPU: the same ratio from the CPU time of the calling "
            "thread (insensitive to being descheduled by other processes). The staging pool holds "
            "exactly one copy of the tensors (state size).\n\n"
            + markdown_table(
                ["state", "policy", "rounds", "bare copy ms", "commit_async stall ms",
                 "median (stall − bare) ms", "stall / bare", "stall / bare (CPU)", "≤ 1.5×",
                 "first-commit stall ms", "persist s", "stored / commit",
                 "persist MB/s (logical)"], rows))


# -- 2. training loop ------------------------------------------------------------------------------
class RecMLP(nn.Module):
    def __init__(self, rows: int, dim: int = 64, hidden: int = 512):
        super().__init__()
        self.emb = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(ids)).squeeze(-1)


class Trainer:
    def __init__(self, rows: int, seed: int, batch: int = 512, bag: int = 8, nbatches: int = 32):
        torch.manual_seed(seed)
        self.model = RecMLP(rows)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(seed + 1)
        self.batches = [(torch.randint(0, rows, (batch, bag), generator=g),
                         torch.randn(batch, generator=g)) for _ in range(nbatches)]
        self.step_no = 0

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.state_dict().values())

    def step(self) -> None:
        ids, y = self.batches[self.step_no % len(self.batches)]
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(ids), y)
        loss.backward()
        self.opt.step()
        self.step_no += 1

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.opt, "step": self.step_no}

    def torch_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "step": self.step_no}


@dataclass
class TrainRun:
    seconds: float
    steps: int
    commits: int
    intervals: list[int] = field(default_factory=list)
    blocked: float = 0.0  # wall time inside the checkpoint calls
    waited: float = 0.0   # of which commit_async waited for the previous persist

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def train_run(trainer: Trainer, mode: str, k: int | None, steps: int, root: str) -> TrainRun:
    """One timed run of ``steps`` steps; ``mode`` in none|async|sync|torch.save|frequency."""
    folder = tempfile.mkdtemp(prefix=f"train-{mode}-", dir=root)
    store = ckptstore.open(os.path.join(folder, "store"), options=OPTIONS[0],
                           background="thread") if mode in ("async", "sync", "frequency") else None
    saves = 0

    blocked = [0.0, 0.0]

    def save() -> Any:
        nonlocal saves
        saves += 1
        if mode == "torch.save":
            torch.save(trainer.torch_state(), os.path.join(folder, f"ckpt-{saves}.pt"))
            return None
        if mode == "sync":
            return store.commit(trainer.state())
        return store.commit_async(trainer.state())

    def checkpoint() -> Any:
        t0 = time.perf_counter()
        out = save()
        dt = time.perf_counter() - t0
        blocked[0] += dt
        if hasattr(out, "stall_seconds"):  # stall_seconds excludes waiting for the previous one
            blocked[1] += max(0.0, dt - out.stall_seconds)
        return out

    try:
        for _ in range(10):
            trainer.step()
        if mode != "none":  # steady state: staging buffers exist, files were created once
            p = save()
            if p is not None and hasattr(p, "wait"):
                p.wait()
        sync_fs()
        freq = Frequency(max_overhead=0.05) if mode == "frequency" else None
        commits, intervals = 0, []
        t0 = time.perf_counter()
        for s in range(1, steps + 1):
            trainer.step()
            if freq is not None:
                if freq.should_commit(s):
                    freq.record(checkpoint())
                    commits += 1
                    intervals.append(freq.interval)
            elif k is not None and s % k == 0:
                checkpoint()
                commits += 1
        seconds = time.perf_counter() - t0
        return TrainRun(seconds, steps, commits, intervals, blocked[0], blocked[1])
    finally:
        if store is not None:
            store.close()  # waits for the last persist (not timed)
        shutil.rmtree(folder, ignore_errors=True)


def run_train(args: argparse.Namespace, root: str) -> str:
    torch.set_num_threads(args.threads)
    trainer = Trainer(args.rows, args.seed)
    configs: list[tuple[str, int | None]] = []
    for k in args.k:
        configs += [("async", k), ("sync", k), ("torch.save", k)]
    configs.append(("frequency", None))
    runs: dict[tuple[str, int | None], list[TrainRun]] = {("none", None): []}
    runs.update({c: [] for c in configs})
    overheads: dict[tuple[str, int | None], list[float]] = {c: [] for c in configs}
    for rep in range(args.train_repeat):
        # (i) runs first and last in every round: each config is compared with the mean rate of
        # the two runs of its own round (the load of a shared machine drifts between rounds)
        round_runs = {}
        for mode, k in [("none", None), *configs, ("none", None)]:
            run = train_run(trainer, mode, k, args.steps, root)
            runs[(mode, k)].append(run)
            round_runs.setdefault((mode, k), []).append(run)
            print(f"  train rep {rep} {mode:10s} k={k}: {run.rate:.1f} steps/s, {run.commits} "
                  f"commits, blocked {run.blocked:.2f} s (waited {run.waited:.2f}), "
                  f"intervals {run.intervals}, load {load_average()}",
                  file=sys.stderr, flush=True)
        base_rate = statistics.mean(r.rate for r in round_runs[("none", None)])
        for c in configs:
            overheads[c].append(base_rate / round_runs[c][0].rate - 1)
    base = median([r.rate for r in runs[("none", None)]])
    clean = args.steps / base  # seconds of the same steps without checkpointing
    labels = {"none": "(i) no checkpointing", "async": "(ii) `commit_async`",
              "sync": "(iii) `store.commit`", "torch.save": "(iv) `torch.save`",
              "frequency": "(v) `Frequency(0.05)` + `commit_async`"}
    rows = []
    for (mode, k), rs in runs.items():
        rate = median([r.rate for r in rs])
        every = "–" if mode == "none" else str(k)
        if mode == "frequency":
            final = [r.intervals[-1] for r in rs if r.intervals]
            seen = [i for r in rs for i in r.intervals]
            every = (f"chosen: {median(final):.0f} at the end (range {min(seen)}–{max(seen)})"
                     if seen else "chosen: none")
        if mode == "none":
            overhead = blocked = waited = "–"
        else:
            overhead = f"{median(overheads[(mode, k)]) * 100:+.0f} %"
            blocked = f"{median([r.blocked for r in rs]) / clean * 100:.1f} %"
            waited = f"{median([r.waited for r in rs]) / clean * 100:.1f} %" \
                if mode in ("async", "frequency") else "–"
        rows.append([labels[mode], every, f"{median([r.commits for r in rs]):.0f}",
                     f"{rate:.1f}", overhead, blocked, waited])
    table = markdown_table(["checkpointing", "every k steps", "commits", "steps/s",
                            "overhead vs (i)", "blocked in the call", "… waiting for previous"],
                           rows)
    return (f"Model state {human_bytes(trainer.nbytes)} ({args.rows} x 64 embedding + MLP), "
            f"{args.steps} timed steps per run, {args.train_repeat} rounds, torch threads "
            f"{args.threads}, {clean / args.steps * 1e3:.1f} ms per step without checkpointing "
            f"(median). Overhead: median over rounds of (rate of (i) in the round / rate of the "
            f"row − 1), where (i) runs first and last in every round; wall clock, so it includes "
            f"the slowdown of training steps while a background persist competes for the cores. "
            f"Blocked: median wall time spent inside the checkpoint calls, as a share of the time "
            f"of the same steps in (i); for `commit_async` the part spent waiting for the "
            f"previous persist is shown separately.\n\n{table}")


# -- 3. peak RSS -----------------------------------------------------------------------------------
def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM in bytes."""
    try:
        with open("/proc/self/status") as f:
            text = f.read()
        return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) * 1024
                for k in ("VmRSS", "VmHWM")}
    except (OSError, AttributeError):
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"VmRSS": peak, "VmHWM": peak}


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_child(variant: str, size_mb: int, seed: int, root: str) -> dict[str, Any]:
    """Runs in a fresh process: the extra memory of one commit variant."""
    out: dict[str, Any] = {"variant": variant, "start": _proc_status()["VmRSS"]}
    folder = tempfile.mkdtemp(prefix=f"rss-{variant}-", dir=root)
    # one-time costs first (thread pools, codec JIT, allocator arenas): a tiny commit elsewhere
    tiny = {"w": torch.randn(4096, 64), "b": torch.randn(64), "step": 0}
    if variant == "torch.save":
        torch.save(tiny, os.path.join(folder, "tiny.pt"))
    else:
        policy = POLICIES["intermittent+q4" if variant == "async-q4" else "lossless"]()
        with ckptstore.open(os.path.join(folder, "tiny"), policy=policy,
                            background="thread") as warm:
            if variant == "sync":
                warm.commit(tiny)
            else:
                warm.commit_async(tiny).wait()
                tiny["w"].add_(1.0)
                warm.commit_async(tiny).wait()
    gc.collect()
    out["before_build"] = _proc_status()["VmRSS"]
    state = build_state(size_mb * MB, seed)
    out["state_bytes"] = state_bytes(state)
    gc.collect()
    out["after_build"] = _proc_status()["VmRSS"]
    out["reset"] = _reset_peak()
    try:
        if variant == "torch.save":
            torch.save(state, os.path.join(folder, "ckpt.pt"))
            out["peak"] = _proc_status()["VmHWM"]
        elif variant == "sync":
            store = ckptstore.open(os.path.join(folder, "store"))
            store.commit(state)
            out["peak"] = _proc_status()["VmHWM"]
            store.close()
        else:
            policy = POLICIES["intermittent+q4" if variant == "async-q4" else "lossless"]()
            store = ckptstore.open(os.path.join(folder, "store"), policy=policy,
                                   background="thread")  # this process's peak memory
            store.commit_async(state).wait()
            out["peak"] = _proc_status()["VmHWM"]
            out["after_first"] = _proc_status()["VmRSS"]
            peaks = []
            for r in range(2):
                train_a_bit(state, r + 1)
                gc.collect()
                out["reset"] &= _reset_peak()
                store.commit_async(state).wait()
                peaks.append(_proc_status()["VmHWM"])
            out["peak_steady"] = max(peaks)
            out["pool"] = staging_bytes(store)
            store.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def run_rss(args: argparse.Namespace, root: str) -> str:
    cases = [(v, s) for s in args.rss_sizes for v in ("async", "sync", "torch.save")]
    cases += [("async-q4", s) for s in args.rss_q_sizes]
    results = []
    for variant, size in cases:
        cmd = [sys.executable, os.path.abspath(__file__), "_rss-child", "--variant", variant,
               "--size", str(size), "--seed", str(args.seed), "--dir", root]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"rss child {variant} {size} MB failed:\n{proc.stderr}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"  rss {variant} {size} MB: extra {(r['peak'] - r['after_build']) / MiB:.0f} MiB, "
              f"load {load_average()}", file=sys.stderr, flush=True)
    labels = {"async": "`commit_async` (lossless)", "sync": "`store.commit` (lossless)",
              "torch.save": "`torch.save`", "async-q4": "`commit_async` (intermittent+q4)"}
    rows = []
    for r in results:
        size = r["state_bytes"]
        extra = r["peak"] - r["after_build"]
        steady = r.get("peak_steady")
        ok = ""
        if r["variant"].startswith("async"):
            worst = max(extra, steady - r["after_build"]) / size
            ok = "yes" if worst <= 1.3 else "**no**"
        held = r.get("after_first")
        rows.append([labels[r["variant"]], human_bytes(size),
                     human_bytes(r["before_build"] - r["start"]),
                     human_bytes(extra), fmt_ratio(extra / size),
                     "–" if steady is None else fmt_ratio((steady - r["after_build"]) / size),
                     "–" if held is None else fmt_ratio((held - r["after_build"]) / size),
                     "–" if "pool" not in r else human_bytes(r["pool"]), ok or "–"])
    method = "VmHWM reset with /proc/self/clear_refs" if all(r["reset"] for r in results) \
        else "ru_maxrss (peak could not be reset)"
    return ("Each row runs in a fresh process. Peak measured as " + method
            + "; extra = peak − RSS after building the state. "
            "One-time init: RSS growth of a tiny commit of the same kind made before the state "
            "is built (thread pools, codec JIT, allocator arenas), not counted in extra. Held: "
            "RSS after the first commit finished − after build (staging buffers, references "
            "kept for incremental commits).\n\n"
            + markdown_table(["commit", "state", "one-time init", "extra (first commit)",
                              "extra / state", "extra / state (steady)", "held / state",
                              "staging pool", "≤ 1.3×"], rows))


# -- 4. GPU stall ----------------------------------------------------------------------------------
def gpu_case(size_mb: int, policy: str, args: argparse.Namespace, root: str) -> list[Any]:
    """One row of the GPU stall table."""
    state = build_state(size_mb * MB, args.seed, device="cuda:0")
    tensors = tensors_of(state)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

    def bare_copy() -> None:
        for dst, src in zip(pinned, tensors, strict=True):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    bare_copy()  # warm: pinned buffers allocated and touched
    folder = tempfile.mkdtemp(prefix=f"gpu-{size_mb}-", dir=root)
    store = ckptstore.open(folder, policy=POLICIES[policy]())
    bare, stall, synced, ratios = [], [], [], []
    try:
        for r in range(args.warmup + args.repeat):
            train_a_bit(state, r + 1)
            torch.cuda.synchronize()
            sync_fs()
            t0 = time.perf_counter()
            bare_copy()
            tb = time.perf_counter() - t0
            t0 = time.perf_counter()
            pending = store.commit_async(state)
            ts = time.perf_counter() - t0
            torch.cuda.synchronize()  # the staging copies run on a side stream
            tsync = time.perf_counter() - t0
            pending.wait()
            if r >= args.warmup:
                bare.append(tb)
                stall.append(ts)
                synced.append(tsync)
                ratios.append(ts / tb)
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    return [human_bytes(state_bytes(state)), policy, ms(median(bare)), ms(median(stall)),
            ms(median(synced)), fmt_ratio(median(ratios))]


def run_gpu(args: argparse.Namespace, root: str) -> str:
    if not torch.cuda.is_available():
        line = "skipped: no CUDA device (torch.cuda.is_available() is False)"
        print(line, file=sys.stderr)
        return line
    rows = []
    for size in args.sizes:
        for policy in POLICIES:
            rows.append(gpu_case(size, policy, args, root))
            gc.collect()
            torch.cuda.empty_cache()
    return (f"Device: {torch.cuda.get_device_name(0)}.\n\n"
            + markdown_table(["state", "policy", "bare D2H copy ms (pinned, synced)",
                              "commit_async returns ms", "… + cuda.synchronize ms",
                              "stall / bare"], rows))


# -- driver ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parts", nargs="*", default=[],
                   help="stall, train, rss, gpu (default: all); _rss-child is internal")
    p.add_argument("--quick", action="store_true", help="small states, fewer repeats (~1 min)")
    p.add_argument("--sizes", default=None, help="stall state sizes in MB (default 64,256,1024)")
    p.add_argument("--repeat", type=int, default=None, help="timed stall rounds (default 7)")
    p.add_argument("--repeat-large", type=int, default=3,
                   help="timed stall rounds for states of 1000 MB and more (default 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first commits (default 1)")
    p.add_argument("--rows", type=int, default=None,
                   help="embedding rows of the training model (default 500000: 128 MB)")
    p.add_argument("--steps", type=int, default=None, help="timed training steps (default 200)")
    p.add_argument("--k", default=None, help="commit intervals in steps (default 25,100)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for training")
    p.add_argument("--train-repeat", type=int, default=None,
                   help="rounds over all configs (default 5)")
    p.add_argument("--rss-sizes", default=None, help="RSS state sizes in MB (default 64,256,1024)")
    p.add_argument("--rss-q-sizes", default=None,
                   help="RSS sizes for the quantized incremental policy (default 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compression", default=None,
                   help="EncodingOptions.compression of the stall and train stores "
                        "(default: the store's default)")
    p.add_argument("--dir", default=None, help="folder for temporary stores (default: /tmp)")
    p.add_argument("--markdown-out", default=None, help="also write the markdown report here")
    # internal: one RSS measurement in this (fresh) process
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick

    def ints(text: str | None, default: str, quick: str) -> list[int]:
        return [int(x) for x in (text or (quick if q else default)).split(",") if x]

    args.sizes = ints(args.sizes, "64,256,1024", "16,64")
    args.k = ints(args.k, "25,100", "10,40")
    args.rss_sizes = ints(args.rss_sizes, "64,256,1024", "64")
    args.rss_q_sizes = ints(args.rss_q_sizes, "256", "64") if args.rss_q_sizes != "" else []
    args.repeat = args.repeat or (3 if q else 7)
    args.warmup = args.warmup if args.warmup is not None else 1
    args.rows = args.rows or (125_000 if q else 500_000)
    args.steps = args.steps or (80 if q else 200)
    args.train_repeat = args.train_repeat or (1 if q else 5)
    known = {"stall", "train", "rss", "gpu", "_rss-child"}
    bad = [x for x in args.parts if x not in known]
    if bad:
        p.error(f"unknown part(s) {bad}: choose from stall, train, rss, gpu")
    args.parts = args.parts or ["stall", "train", "rss", "gpu"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compression:
        OPTIONS[0] = ckptstore.EncodingOptions(compression=args.compression)
    if args.parts == ["_rss-child"]:
        print(json.dumps(rss_child(args.variant, args.size, args.seed, args.dir or "/tmp")))
        return 0
    root = tempfile.mkdtemp(prefix="ckpt-async-bench-", dir=args.dir)
    runners = {"stall": ("Async writer: stall of `commit_async` vs a bare copy (CPU)", run_stall),
               "train": ("Async writer: training-loop throughput, checkpoint every k steps",
                         run_train),
               "rss": ("Async writer: peak host memory of a commit", run_rss),
               "gpu": ("Async writer: GPU stall (state on CUDA)", run_gpu)}
    t_start = time.perf_counter()
    load0, machine = load_average(), machine_description()
    parts = []
    try:
        for name in args.parts:
            title, fn = runners[name]
            print(f"{name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            body = fn(args, root)
            parts.append(f"### {title}\n\n{body}\n\n_{name}: {time.perf_counter() - t0:.0f} s, "
                         f"1-min load average at the end {load_average()}_")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    command = f".venv/bin/python benchmarks/async_writer.py {argv_text}".rstrip()
    header = (f"Command: `{command}`"
              + f"  \nMachine: {machine}; load average {load0} at the start. "
              f"Total {time.perf_counter() - t_start:.0f} s.")
    report = header + "\n\n" + "\n\n".join(parts)
    print(report)
    if args.markdown_out:
        write_text(args.markdown_out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
