"""Loads from a local store with chunks mapped (the default) and read (``map_reads=False``).

Usage::

    .venv/bin/python benchmarks/mapped_reads.py            # warm only (about 30 s)
    sudo .venv/bin/python benchmarks/mapped_reads.py --cold  # also with the page cache dropped

What is measured: one process commits ``--mb`` MB of float32 (four tensors, 64 wide) to a local
store once per encoding (the default ``entropy`` and raw bits), then loads it ``--repeat`` times
per mode into preallocated tensors (``dcp.load`` with ``ckptstore.dcp.StorageReader`` in one
process: the chunks decode straight into them), the modes alternating: *mapped*
(``LocalStorage.read_chunk`` maps cached chunk files of at least 1 MiB) and *read*
(``store.storage.map_reads = False``: one ``read`` per chunk). Warm: the files are in the page
cache (written just before). Cold (``--cold``, root only): the page cache is dropped
(``/proc/sys/vm/drop_caches``) before every timed load. Medians in seconds, and mapped / read.
Then one cached chunk file per size, ``read_chunk`` + crc32c mapped and read (mean of 200).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore.dcp import StorageReader  # noqa: E402
from ckptstore.plan import EncodingOptions  # noqa: E402
from ckptstore.storage import local as local_storage  # noqa: E402
from ckptstore.storage.local import MAP_MIN  # noqa: E402


def _drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _timed(root: str, mapped: bool, cold: bool, into: dict[str, torch.Tensor],
           want: torch.Tensor) -> float:
    """One ``dcp.load`` into the preallocated ``into`` (chunks decode straight into it: no
    allocation is timed, which this VM makes slow and erratic)."""
    store = ckptstore.open(root, create=False)
    store.storage.map_reads = mapped
    for t in into.values():
        t.zero_()
    if cold:
        _drop_caches()
    t0 = time.perf_counter()
    dcp.load(into, storage_reader=StorageReader(store, "main"))
    dt = time.perf_counter() - t0
    assert torch.equal(into["t3"], want), "the load differs from the commit"
    store.close()
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="MB of float32 committed")
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--cold", action="store_true", help="also drop the page cache (root)")
    ap.add_argument("--dir", default=None, help="where the store goes (default /tmp)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")  # one process
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows_each = args.mb * 10**6 // (4 * 64 * 4)
    g = torch.Generator().manual_seed(0)
    state = {f"t{i}": torch.randn(rows_each, 64, generator=g) for i in range(4)}
    into = {k: torch.empty_like(v) for k, v in state.items()}
    rows = []
    for compression in ("entropy", "none"):
        root = tempfile.mkdtemp(prefix="ckpt-mapped-", dir=args.dir)
        try:
            with ckptstore.open(root, options=EncodingOptions(compression=compression)) as s:
                s.commit(state)
            os.sync()  # no writeback of the commit under the timed checkouts
            for cold in (False, True) if args.cold else (False,):
                times: dict[bool, list[float]] = {True: [], False: []}
                _timed(root, True, False, into, state["t3"])  # compile and warm up
                for _ in range(args.repeat):
                    for mapped in (True, False):
                        times[mapped].append(_timed(root, mapped, cold, into,
                                                    state["t3"]))
                m, r = (statistics.median(times[k]) for k in (True, False))
                rows.append([compression, "cold" if cold else "warm", f"{m:.3f}", f"{r:.3f}",
                             f"{m / r:.2f}"])
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(markdown_table(["encoding", "page cache", "mapped s", "read s", "mapped / read"], rows,
                         "llrrr"))
    print("\nOne chunk file, page cache warm: `read_chunk` + crc32c, mean of 200 (why MAP_MIN is "
          f"{MAP_MIN >> 10} KiB)\n")
    print(markdown_table(["chunk KiB", "mapped ms", "read ms"], _by_size(args.dir), "rrr"))
    return 0


def _by_size(where: str | None) -> list[list[str]]:
    """Mapped and read ``read_chunk`` + crc32c of one cached file per size, whatever MAP_MIN."""
    from ckptstore.chunkcodec.base import _crc32c
    from ckptstore.storage import LocalStorage

    root = tempfile.mkdtemp(prefix="ckpt-mapped-", dir=where)
    rows = []
    try:
        storage = LocalStorage(root)
        for kib in (256, 512, 1024, 2048, 4096):
            storage.put_chunk(f"c{kib}", os.urandom(kib << 10))
            ms = {}
            for mapped in (True, False, True, False):
                with _map_min(0 if mapped else 1 << 62):
                    _crc32c(storage.read_chunk(f"c{kib}"))
                    t0 = time.perf_counter()
                    for _ in range(200):
                        _crc32c(storage.read_chunk(f"c{kib}"))
                    ms[mapped] = (time.perf_counter() - t0) / 200 * 1e3
            rows.append([str(kib), f"{ms[True]:.3f}", f"{ms[False]:.3f}"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


@contextlib.contextmanager
def _map_min(value: int):
    before = local_storage.MAP_MIN
    local_storage.MAP_MIN = value
    try:
        yield
    finally:
        local_storage.MAP_MIN = before


if __name__ == "__main__":
    raise SystemExit(main())
