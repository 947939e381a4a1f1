"""Stall of ``commit_async`` for an embedding table whose changed rows a tracker knows: only those
rows are staged (issue 11's staging bounds, Check-N-Run's incremental checkpoints).

Usage::

    .venv/bin/python benchmarks/tracked_rows.py                  # 1 GB table, 5 % rows
    .venv/bin/python benchmarks/tracked_rows.py --rows 1000000 --touch 0.01 --rounds 3

What is measured, side by side in each round (medians over ``--rounds``):

* ``commit_async`` with a ``RowTracker`` and ``Policy(incremental="consecutive")``: the snapshot
  gathers the tracked rows into a reused row buffer;
* ``commit_async`` of the same increments without a tracker (rows found by comparing against a
  host copy of the table): the whole table is staged, as tracked tables were before;
* the same without a tracker, the rows found on the table's device against a reference kept
  there (:mod:`ckptstore.device.rows`; ``device_encode="always"`` on the CPU, where the CPU stands in
  for the device, ``"auto"`` with ``--device cuda``): the table is staged on its device and only
  the changed rows cross to the host;
* the bare copies the two stand for: ``torch.index_select`` of the touched rows, and ``copy_`` of
  the whole table into a preallocated buffer.

Before each commit the loop touches ``--touch`` of the rows (a sparse SGD step). Also the time
each persist takes after the stall (to ``wait()``), and the bytes the store's staging buffers
hold.
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
from common import command_line, human_bytes, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore import EncodingOptions, Policy  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--touch", type=float, default=0.05, help="share of rows touched per step")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="where the table lives (cpu or cuda)")
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    torch.manual_seed(0)
    emb = torch.nn.Embedding(args.rows, args.dim, sparse=True, device=args.device)
    model = torch.nn.ModuleDict({"emb": emb})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = ckptstore.track(model, opt)
    root = tempfile.mkdtemp(prefix="tracked-rows-")
    policy = Policy(incremental="consecutive", max_chain=10_000)
    on_device = EncodingOptions(device_encode="auto" if args.device.startswith("cuda")
                                else "always")
    stores = {name: ckptstore.open(os.path.join(root, name), policy=policy, options=options,
                                   background="thread")  # the persist thread's snapshot
              for name, options in (("tracked", None), ("compared", None),
                                    ("on device", on_device))}
    labels = {"tracked": "commit_async, tracker (rows gathered)",
              "compared": "commit_async, no tracker (table staged, compared on the host)",
              "on device": "commit_async, no tracker (compared on the device)"}
    table = emb.weight.detach()
    full = torch.empty_like(table)
    times: dict[str, list[float]] = {k: [] for k in (
        *labels.values(), "index_select of the touched rows", "copy_ of the whole table")}
    persist: dict[str, list[float]] = {k: [] for k in labels.values()}
    staging: dict[str, int] = {}
    n_touch = int(args.touch * args.rows)
    try:
        for name, store in stores.items():  # baselines (untimed)
            store.commit_async({"model": model}, tracker=tracker if name == "tracked" else None
                               ).wait()
        for r in range(args.rounds + 1):
            idx = torch.randperm(args.rows)[:n_touch]
            emb(idx).sum().backward()
            opt.step()
            opt.zero_grad()
            for name, store in stores.items():
                t0 = time.perf_counter()
                pending = store.commit_async({"model": model},
                                             tracker=tracker if name == "tracked" else None)
                stall = time.perf_counter() - t0
                pending.wait()
                done = time.perf_counter() - t0 - stall
                staging[name] = store.staging_bytes + store.staging_device_bytes
                if r:  # round 0 grows the row buffer
                    times[labels[name]].append(stall)
                    persist[labels[name]].append(done)
            t0 = time.perf_counter()
            table.index_select(0, torch.sort(idx).values.to(table.device))
            _sync(table.device)
            t1 = time.perf_counter()
            full.copy_(table)
            _sync(table.device)
            t2 = time.perf_counter()
            if r:
                times["index_select of the touched rows"].append(t1 - t0)
                times["copy_ of the whole table"].append(t2 - t1)
    finally:
        for store in stores.values():
            store.close()
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["copy_ of the whole table"])
    rows = [[k, f"{1e3 * statistics.median(v):.1f}", f"{base / statistics.median(v):.1f}×",
             f"{1e3 * statistics.median(persist[k]):.0f}" if k in persist else "–"]
            for k, v in times.items()]
    held = ", ".join(f"{name} {human_bytes(n)}" for name, n in staging.items())
    print(f"table {human_bytes(table.numel() * 4)} on {args.device}, {n_touch} rows touched per "
          f"step ({100 * args.touch:g} %); staging held (host + device): {held}\n")
    print(markdown_table(["stall", "ms", "faster than copying the table", "persist ms"], rows,
                         "lrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
