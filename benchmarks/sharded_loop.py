"""Issue 28's loop on gloo ranks: a Python-bound training step on every rank, a collective
``commit_async`` of the ranks' shards every ``--interval`` seconds, the part each rank writes
persisted on a thread or in the store's persist process.

Usage::

    .venv/bin/python benchmarks/sharded_loop.py                       # 2 ranks, 3 rounds
    .venv/bin/python benchmarks/sharded_loop.py --rows 20000 --seconds 3 --repeat 1   # smoke run

What is measured
----------------
* The state: benchmarks/sharded.py's (four embedding tables of ``--rows`` x 64 float32 sharded
  by rows over the ranks, a replicated MLP of 4 x 512 x 512): 4 x 125 000 x 64 x 4 B = 128 MB
  of tables by default, 64 MB a rank on 2 ranks.
* Each step: cpu_proxy.py's 18 small torch ops on 32 x 32 tensors (one torch thread); every
  ``--sync-every`` steps an all-reduce of 1026 floats over the training group, as data parallel
  training syncs its gradients (after accumulating them: a gloo all-reduce takes about a
  millisecond here, twenty steps); the ranks run in lockstep. Rank 0 sets a flag in the
  all-reduced tensor once ``--interval`` seconds passed since the last commit, so every rank
  commits at the same step (a collective), and another once ``--seconds`` passed, so every
  rank stops there. ``--device-wait`` ms of sleep before each all-reduce stand for a GPU rank,
  whose Python thread waits for its device part of each step: the cores then have room for
  the persists, and what is left is the interpreter lock (a GPU node has many cores a rank).
* Configurations, each on freshly spawned ranks, alternating round by round: no checkpoint;
  the bare copy (each rank copies its local shards into preallocated buffers); a collective
  ``commit_async`` with ``background="thread"`` (the rank's part encoded and written on DCP's
  save thread, beside training's interpreter); with ``background="auto"``, the default (the
  rank's shards copied into the persist process's shared file, the part written there:
  ``store.reserve(state)`` first). Each store commits once, waited for, before the timed loop.
* ``--remote s3``: the stores on a moto S3 server in a process of its own (cpu_proxy.py's; at
  ``--server-nice``), its HTTP client's work in the rank or its persist process.
* Printed: steps a second on rank 0 (all ranks run in lockstep), the slowdown against no
  checkpoint, the median over the rounds of each round's step time against the same round's
  bare copy ("paired"), the median stall of ``commit_async`` on rank 0, the commits, and the
  loop thread's sleeps a commit (seconds it neither ran nor waited for a core: waiting for the
  interpreter lock, or for the other rank in the all-reduce), and the CPU rank 0's process
  spent a commit off the loop's thread during the loop (the persist thread, DCP's save thread,
  the I/O pool: what shares the rank's interpreter; a persist process's own is not counted).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spawn_ranks  # noqa: E402
from cpu_proxy import Remote, thread_clock  # noqa: E402
from sharded import sharded_state  # noqa: E402

CONFIGS = {"no checkpoint": None, "bare copy into preallocated buffers": "bare",
           "commit_async, background='thread'": "thread",
           "commit_async, background='auto' (the default: a persist process)": "auto"}


def _rank(rank: int, world: int, args: argparse.Namespace, config: str | None,
          where: tuple[str, dict], root: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import ckptstore
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    state = sharded_state(world, args.rows, "rows")
    local = [v.to_local() if isinstance(v, DTensor) else v for v in state.values()]
    buffers = [torch.empty_like(t) for t in local] if config == "bare" else []
    store = None
    if config in ("thread", "auto"):
        store = ckptstore.open(where[0], background=config, **where[1])
        if config == "auto":
            store.reserve(state).result()
        store.commit_async(state).wait()  # warm: the persist's first commit, DCP's first plan
    g = torch.Generator().manual_seed(rank)
    x, w = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g) * 0.1
    sync = torch.zeros(1026)
    steps, commits, stalls = 0, 0, []
    dist.barrier()
    before, cpu0 = thread_clock(), time.process_time()
    t0 = last = time.perf_counter()
    while True:
        for _ in range(6):
            x = torch.tanh(x @ w)
            x = x * 0.5 + 0.1
            x = x.clamp(-1, 1)
        steps += 1
        if steps % args.sync_every:
            continue
        if args.device_wait:
            time.sleep(args.device_wait / 1e3)  # the Python thread waits for the device
        now = time.perf_counter()
        sync[:1024] = x.reshape(-1)
        sync[1024] = float(rank == 0 and config is not None and now - last >= args.interval)
        sync[1025] = float(rank == 0 and now - t0 >= args.seconds)
        dist.all_reduce(sync)
        if sync[1024] > 0:
            s0 = time.perf_counter()
            if store is not None:
                store.commit_async(state)
            for buf, t in zip(buffers, local):
                buf.copy_(t)
            stalls.append(time.perf_counter() - s0)
            commits += 1
            last = now
        if sync[1025] > 0:
            break
    wall = time.perf_counter() - t0
    after, cpu1 = thread_clock(), time.process_time()
    slept = wall - (after[0] - before[0]) - (after[1] - before[1])
    beside = cpu1 - cpu0 - (after[0] - before[0])  # this process's CPU off the loop's thread
    if store is not None:
        store.close()  # the last commit's persist (not timed)
    dist.barrier()
    if rank == 0:
        Path(root, "result.json").write_text(json.dumps({
            "rate": steps / wall, "commits": commits, "slept": slept, "beside": beside,
            "stall": statistics.median(stalls) if stalls else 0.0}))
    dist.destroy_process_group()


def run(world: int, args: argparse.Namespace, config: str | None,
        remote: Remote | None) -> dict:
    root = tempfile.mkdtemp(prefix="ckpt-sharded-loop-", dir=args.dir)
    where = (f"{root}/store", {}) if remote is None else (remote.url(root), remote.options)
    try:
        return spawn_ranks(_rank, world, (args, config, where), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if remote is not None and config in ("thread", "auto"):
            remote.remove(root)


def table(runs: dict[str, list[dict]]) -> list[str]:
    names = list(runs)
    base = runs[names[0]]
    bare = runs.get("bare copy into preallocated buffers")
    lines = ["| configuration | steps/s | slowdown | step time / bare copy's (paired) | "
             "stall ms (median) | loop slept ms a commit | rank's CPU-s a commit off its loop | "
             "commits |",
             "|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for name in names:
        r = runs[name]
        rate = statistics.median(x["rate"] for x in r)
        slow = 1 - rate / statistics.median(x["rate"] for x in base)
        paired = (f"{statistics.median(b['rate'] / x['rate'] for x, b in zip(r, bare)):.2f}x"
                  if bare is not None and name not in names[:2] else "–")
        commits = statistics.median(x["commits"] for x in r)
        slept = (f"{1e3 * statistics.median(x['slept'] / max(x['commits'], 1) for x in r):.0f}"
                 if commits else "–")
        stall = f"{1e3 * statistics.median(x['stall'] for x in r):.1f}" if commits else "–"
        beside = (f"{statistics.median(x['beside'] / x['commits'] for x in r):.3f}"
                  if commits else "–")
        lines.append(f"| {name} | {rate:.0f} | "
                     f"{'–' if name == names[0] else f'{100 * slow:+.1f} %'} | {paired} | "
                     f"{stall} | {slept} | {beside} | {commits:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rows", type=int, default=125_000, help="rows of each of 4 tables")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed loop per run")
    ap.add_argument("--interval", type=float, default=1.3, help="seconds between commits")
    ap.add_argument("--repeat", type=int, default=3, help="rounds")
    ap.add_argument("--sync-every", type=int, default=50,
                    help="steps between all-reduces (gradient accumulation)")
    ap.add_argument("--device-wait", type=float, default=0.0,
                    help="ms the loop sleeps before each all-reduce, as a GPU rank's Python "
                         "thread waits for its device (spare cores for the persists)")
    ap.add_argument("--dir", default=None, help="where the stores go (default /tmp)")
    ap.add_argument("--remote", choices=["local", "s3"], default="local",
                    help="s3: every store on a moto S3 server in a process of its own "
                         "(cpu_proxy.py's)")
    ap.add_argument("--server-nice", type=int, default=0, help="--remote s3: the server's nice")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    remote = Remote(args.server_nice) if args.remote == "s3" else None
    try:
        for r in range(args.repeat):
            order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                runs[name].append(run(args.ranks, args, CONFIGS[name], remote))
                print(f"round {r + 1}: {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    finally:
        if remote is not None:
            remote.close()
    print(f"{args.ranks} gloo ranks, {4 * args.rows * 64 * 4 >> 20} MB of tables, a commit "
          f"every {args.interval} s, {args.seconds} s loops, {args.repeat} rounds, stores "
          f"{'on a moto S3 server' if remote else 'in a local folder'}, "
          f"{args.device_wait} ms device wait every {args.sync_every} steps\n")
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
