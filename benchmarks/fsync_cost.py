"""What crash-consistent commits cost: ckptstore's default (``durable=True``, batched where the
file system takes it) against the same with each chunk file and folder fsynced (the default
before batched durability), its opt-out (``durable=False``) and DCP's
``FileSystemWriter(sync_files=True)`` / ``False``, side by side.

Usage::

    .venv/bin/python benchmarks/fsync_cost.py             # 256 MB, 5 rounds (about a minute)
    .venv/bin/python benchmarks/fsync_cost.py --mb 64 --repeat 3 --dir /path/on/the/disk
    .venv/bin/python benchmarks/fsync_cost.py --state minilm   # a real state: 310 tensors

What is measured: one process builds one state (``--mb`` MB of float32 in four tensors, 64 wide,
or with ``--state minilm`` MiniLM's weights and AdamW moments, cpu_proxy.py's: 271 MB in 310
tensors, about 250 chunk files and 360 folders a commit) and writes it ``--repeat`` rounds, each
round once per writer in turn, every write into a fresh folder:
``ckptstore.open(folder, durable=...).commit(state)`` with the default encoding and with raw
bits (``compression="none"``), and ``dcp.save(state, storage_writer=FileSystemWriter(folder,
sync_files=...))`` (one process, no process group). ``os.sync()`` runs before every timed write
(no writeback of the previous one under it). Medians of the seconds, of this process's CPU
seconds (user + system, its threads) and of the machine's (every CPU's busy time in
``/proc/stat``: the kernel's threads that write back and commit the journal too); each durable
writer against its own opt-out and against DCP with ``sync_files=True``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, load_average, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore.commit.plan import EncodingOptions  # noqa: E402

Writer = Callable[[str, dict[str, torch.Tensor]], None]


def _ckptstore(durable: bool, compression: str, batched: bool = True) -> Writer:
    def write(folder: str, state: dict[str, torch.Tensor]) -> None:
        with ckptstore.open(folder, durable=durable,
                            options=EncodingOptions(compression=compression)) as store:
            store.storage.batch_sync = batched  # False: each chunk file and folder fsynced
            store.commit(state)
    return write


def _dcp(sync_files: bool) -> Writer:
    def write(folder: str, state: dict[str, torch.Tensor]) -> None:
        dcp.save(state, storage_writer=FileSystemWriter(folder, sync_files=sync_files))
    return write


WRITERS: dict[str, Writer] = {
    "ckptstore durable (default)": _ckptstore(True, "entropy"),
    "ckptstore durable, each file fsynced (before)": _ckptstore(True, "entropy", batched=False),
    "ckptstore durable=False": _ckptstore(False, "entropy"),
    "ckptstore raw, durable": _ckptstore(True, "none"),
    "ckptstore raw, durable, each file fsynced (before)": _ckptstore(True, "none",
                                                                     batched=False),
    "ckptstore raw, durable=False": _ckptstore(False, "none"),
    "dcp sync_files=True": _dcp(True),
    "dcp sync_files=False": _dcp(False),
}
AGAINST = {  # each durable writer: its opt-out
    "ckptstore durable (default)": "ckptstore durable=False",
    "ckptstore durable, each file fsynced (before)": "ckptstore durable=False",
    "ckptstore raw, durable": "ckptstore raw, durable=False",
    "ckptstore raw, durable, each file fsynced (before)": "ckptstore raw, durable=False",
    "dcp sync_files=True": "dcp sync_files=False",
}


def machine_busy() -> float:
    """Seconds every CPU of the machine has been busy (``/proc/stat``: all but idle and
    iowait); 0 where there is no such file."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="MB of float32 written")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the folders go (default /tmp)")
    ap.add_argument("--state", choices=["synthetic", "minilm"], default="synthetic",
                    help="synthetic: --mb MB in four tensors; minilm: MiniLM's weights and "
                         "AdamW moments (271 MB, 310 tensors)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")
    warnings.filterwarnings("ignore", message=".*process group.*")
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n"
          f"# load average before: {load_average()}\n")
    if args.state == "minilm":
        from cpu_proxy import minilm_state
        state = {k: v for k, v in minilm_state().items() if isinstance(v, torch.Tensor)}
    else:
        rows_each = args.mb * 10**6 // (4 * 64 * 4)
        g = torch.Generator().manual_seed(0)
        state = {f"t{i}": torch.randn(rows_each, 64, generator=g) for i in range(4)}
    base = tempfile.mkdtemp(prefix="ckpt-fsync-", dir=args.dir)
    times: dict[str, list[float]] = {name: [] for name in WRITERS}
    cpu: dict[str, list[float]] = {name: [] for name in WRITERS}
    busy: dict[str, list[float]] = {name: [] for name in WRITERS}
    try:
        for name, write in WRITERS.items():  # warm up each (imports, compiled kernels)
            write(os.path.join(base, "warm"), state)
            shutil.rmtree(os.path.join(base, "warm"))
        for r in range(args.repeat):
            for i, (name, write) in enumerate(WRITERS.items()):
                folder = os.path.join(base, f"{r}-{i}")
                os.sync()
                c0, b0, t0 = sum(os.times()[:2]), machine_busy(), time.perf_counter()
                write(folder, state)
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(sum(os.times()[:2]) - c0)
                busy[name].append(machine_busy() - b0)
                shutil.rmtree(folder)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    synced = med["dcp sync_files=True"]
    rows = []
    for name in WRITERS:
        opt_out = AGAINST.get(name)
        rows.append([name, f"{med[name]:.3f}", f"{min(times[name]):.3f}",
                     f"{statistics.median(cpu[name]):.3f}",
                     f"{statistics.median(busy[name]):.3f}",
                     f"{med[name] / med[opt_out]:.2f}x" if opt_out else "",
                     f"{med[name] / synced:.2f}x"])
    print(markdown_table(["writer", "median s", "best s", "process CPU-s", "machine CPU-s",
                          "vs its opt-out", "vs dcp synced"], rows, "lrrrrrr"))
    what = f"{args.mb} MB" if args.state == "synthetic" else "MiniLM + AdamW (271 MB)"
    print(f"\n# {what}, {args.repeat} rounds; load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
