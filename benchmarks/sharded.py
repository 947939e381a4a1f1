"""Sharded checkpoints on gloo ranks: ckptstore's DCP storage against DCP's FileSystemWriter.

Usage::

    .venv/bin/python benchmarks/sharded.py                      # 2 and 4 ranks, 3 repeats
    .venv/bin/python benchmarks/sharded.py --ranks 2 --rows 50000 --repeat 1   # smoke run
    .venv/bin/python benchmarks/sharded.py --tools ckptstore --loads load --no-intervals

The rank worker (``_rank`` through :func:`run`) is shared with benchmarks/revisions.py's
``sharded`` case, which runs it under another revision of the library: it uses only public API
(``ckptstore.open``, ``ckptstore.dcp``, ``ckptstore.Policy`` ...), and every rank leaves the
library files it imported (:func:`library_files`) in the result.

What is measured
----------------
* The state: four embedding tables of ``--rows`` x 64 float32 (DTensor ``Shard(0)`` over the
  ranks) and a replicated MLP (4 x 512 x 512 + biases): 4 x 200 000 x 64 x 4 B = 205 MB of
  tables + 4.2 MB of MLP by default. Every rank holds its rows of every table and a copy of the
  MLP; both tools write the MLP once (DCP's planner dedups replicated tensors).
* Commit: ``dcp.save(state, storage_writer=...)`` on every rank, timed on rank 0 from a barrier
  before to a barrier after. DCP's writer is ``FileSystemWriter(path, sync_files=False)``
  (ckptstore's local store does not fsync either unless ``durable=True``); ckptstore's is
  ``ckptstore.dcp.StorageWriter(store)`` with the default lossless encoding (``entropy``:
  byte planes, each Huffman, zstd or raw, + crc32c per chunk), each save a new commit on
  ``main``.
* Resharded load: the same ranks load into tables sharded by columns (``Shard(1)``) instead of
  rows, so every rank reads a slice of every stored shard. Timed the same way.
* Same-placement load: the same ranks load into tables sharded by rows as they were saved (a
  restart on the same topology), timed the same way.
* Stored bytes: the size of the checkpoint folder / of the commit's data.
* Intervals: 4 more saves after touching 5 % of the rows of every table each time; DCP writes
  every interval in full, ckptstore with ``Policy(incremental="intermittent",
  quantize=QuantSpec(bits=4))`` writes the changed rows of each shard, 4-bit.
* ckptstore twice: the default encoding, and ``EncodingOptions(compression="none")`` (raw bits
  + crc32c per chunk, as DCP's raw bits).
* Tools alternate round by round; medians of ``--repeat`` rounds are printed, with ratios
  (``--warmup`` untimed rounds first: imports, compiled kernels, DCP's first plan).
  ``os.sync()`` runs untimed before every timed save and load, so no tool is throttled by the
  kernel writing back the dirty pages of the one before it.
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


TOOLS = ("dcp", "ckptstore", "ckptstore-raw")
LOADS = {"load": "cols", "same": "rows"}  # resharded (by columns), same placement (by rows)


def library_files() -> list[str]:
    """The real paths of every ckptstore and ckptcodecs module this process imported."""
    mods = [m for name, m in list(sys.modules.items())
            if name.split(".")[0] in ("ckptstore", "ckptcodecs")]
    return sorted({os.path.realpath(f) for m in mods if (f := getattr(m, "__file__", None))})


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def sharded_state(world: int, rows: int, placement: str, zeros: bool = False,
                  bump: int = 0) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    place = [Shard(0)] if placement == "rows" else [Shard(1)]
    sd: dict = {}
    for t in range(4):
        full = torch.zeros(rows, 64) if zeros else torch.randn(rows, 64, generator=g)
        if bump and not zeros:  # 5 % of the rows touched per interval
            touched = torch.randperm(rows, generator=torch.Generator().manual_seed(bump * 10 + t))
            full[touched[: rows // 20]] += 0.01 * bump
        sd[f"emb{t}"] = distribute_tensor(full, mesh, place)
    for layer in range(4):
        w = torch.zeros(512, 512) if zeros else torch.randn(512, 512, generator=g)
        sd[f"mlp{layer}.weight"] = distribute_tensor(w, mesh, [Replicate()])
        sd[f"mlp{layer}.bias"] = torch.zeros(512)
    return sd


def _rank(rank: int, world: int, args: argparse.Namespace, root: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckptstore
    from ckptstore.dcp import StorageReader, StorageWriter
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    out: dict = {k: {t: [] for t in args.tools} for k in ("commit", *args.loads)}

    def timed(fn) -> float:
        if rank == 0:
            os.sync()  # untimed: no tool pays for the writeback of the one before it
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    state = sharded_state(world, args.rows, "rows")
    workers = {"io_workers": args.io_workers} if args.io_workers else {}
    stores = {"ckptstore": lambda: ckptstore.open(f"{root}/store", **workers),
              "ckptstore-raw": lambda: ckptstore.open(
                  f"{root}/raw", options=ckptstore.EncodingOptions(compression="none"),
                  **workers)}
    stores = {t: make() for t, make in stores.items() if t in args.tools}
    for r in range(-args.warmup, args.repeat):  # r < 0: untimed warm-up rounds
        path = f"{root}/dcp{max(r, 0)}"
        writers = {"dcp": lambda: dcp.FileSystemWriter(path, sync_files=False),
                   **{t: (lambda s=s: StorageWriter(s, message=f"round {r}"))
                      for t, s in stores.items()}}
        readers = {"dcp": lambda: dcp.FileSystemReader(path),
                   **{t: (lambda s=s: StorageReader(s, "main")) for t, s in stores.items()}}
        for tool in args.tools:
            took = timed(lambda: dcp.save(state, storage_writer=writers[tool]()))
            if r >= 0:
                out["commit"][tool].append(took)
        for kind in args.loads:
            for tool in args.tools:
                loaded = sharded_state(world, args.rows, LOADS[kind], zeros=True)
                took = timed(lambda: dcp.load(loaded, storage_reader=readers[tool]()))
                if r >= 0:
                    out[kind][tool].append(took)
                if r == -args.warmup:  # every tool loaded what was saved
                    for k, v in state.items():
                        assert torch.equal(_whole(loaded[k]), _whole(v)), (tool, kind, k)
    if rank == 0:
        sizes = {"dcp": lambda: _du(Path(f"{root}/dcp0")),
                 **{t: (lambda s=s: s.manifest(s.resolve("main")).stored_bytes)
                    for t, s in stores.items()}}
        out["bytes"] = {t: sizes[t]() for t in args.tools}
    if args.intervals:  # full DCP saves against incremental 4-bit commits
        policy = ckptstore.Policy(incremental="intermittent",
                                  quantize=ckptstore.QuantSpec(bits=4))
        inc = ckptstore.open(f"{root}/inc")
        out["intervals"] = {"dcp": [], "ckptstore": []}
        for i in range(5):
            sd = sharded_state(world, args.rows, "rows", bump=i)
            path = f"{root}/int{i}"
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, sync_files=False))
            w = StorageWriter(inc, message=f"interval {i}", policy=policy)
            dcp.save(sd, storage_writer=w)
            dist.barrier()
            if rank == 0:
                out["intervals"]["dcp"].append(_du(Path(path)))
                out["intervals"]["ckptstore"].append(w.last_commit.stored_bytes)
        inc.close()
    for s in stores.values():
        s.close()
    Path(root, f"imported-{rank}.json").write_text(json.dumps(library_files()))
    dist.barrier()
    if rank == 0:
        out["imported"] = [json.loads(Path(root, f"imported-{i}.json").read_text())
                           for i in range(world)]
        Path(root, "result.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def run(world: int, args: argparse.Namespace) -> dict:
    root = tempfile.mkdtemp(prefix="ckpt-sharded-", dir=args.dir)
    try:
        return spawn_ranks(_rank, world, (args,), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds (at least 1)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed rounds before them")
    ap.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    ap.add_argument("--loads", nargs="+", choices=list(LOADS), default=list(LOADS),
                    help="load: resharded (by columns); same: the saved placement (by rows)")
    ap.add_argument("--no-intervals", dest="intervals", action="store_false",
                    help="skip the incremental 4-bit intervals")
    ap.add_argument("--io-workers", type=int, default=None,
                    help="ckptstore's I/O threads per rank (default: the store's choice)")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default /tmp)")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"tables: 4 x {args.rows} x 64 float32 = {4 * args.rows * 64 * 4 / 1e6:.0f} MB, "
          f"MLP 4.2 MB replicated; {os.cpu_count()} CPUs\n")
    kinds = {"commit": "commit", "load": "resharded load", "same": "same-placement load"}
    kinds = {k: v for k, v in kinds.items() if k == "commit" or k in args.loads}
    cols = [f"{v} s" for v in kinds.values()] + ["stored MB"]
    if "dcp" in args.tools:
        cols = [c for col in cols for c in (col, "vs DCP")]
    print("| ranks | tool | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    intervals = {}
    for world in args.ranks:
        r = run(world, args)
        med = {k: {t: statistics.median(v) for t, v in r[k].items()} for k in kinds}
        med["bytes"] = {t: b / 1e6 for t, b in r["bytes"].items()}
        for tool in args.tools:
            cells = [f"{m[tool]:.3f}" for m in med.values()]
            if "dcp" in args.tools:  # DCP's over this tool's: above 1 is better than DCP
                cells = [c for m, x in zip(med.values(), cells)
                         for c in (x, f"{m['dcp'] / m[tool]:.2f}x")]
            print(f"| {world} | {tool} | " + " | ".join(cells) + " |")
        if args.intervals:
            intervals[world] = r["intervals"]
    if not intervals:
        return
    print("\nbytes per interval (interval 0 is the baseline; then 5 % of rows touched each)\n")
    print("| ranks | interval | DCP MB | ckptstore incremental 4-bit MB | ratio |")
    print("|---|---|---|---|---|")
    for world, iv in intervals.items():
        for i, (d, c) in enumerate(zip(iv["dcp"], iv["ckptstore"])):
            print(f"| {world} | {i} | {d / 1e6:.1f} | {c / 1e6:.2f} | {d / c:.1f}x |")


if __name__ == "__main__":
    main()
