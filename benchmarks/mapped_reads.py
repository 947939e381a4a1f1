"""Loads from a local store: chunks read (the bounded reads of issue 26), mapped (before issue 26
item 10), read into reused per-thread buffers (tried, not kept), and raw chunks read straight into
their destination (today) -- side by side, same process, same store.

Usage::

    .venv/bin/python benchmarks/mapped_reads.py            # warm only (about 60 s)
    sudo .venv/bin/python benchmarks/mapped_reads.py --cold  # also with the page cache dropped

What is measured: one process commits ``--mb`` MB of float32 (four tensors, 64 wide) to a local
store once per encoding (the default ``entropy`` and raw bits, ``none``), then loads it
``--repeat`` times per mode into preallocated tensors (``dcp.load`` with
``ckptstore.dcp.StorageReader`` in one process: the chunks decode straight into them), the modes
alternating:

- *into* -- the library as it is: a raw chunk is read (``preadv``) straight into the slice of
  the tensor it covers and its crc32c checked there (``LocalStorage.read_chunk_into``,
  ``RawLossless.read_rows``); compressed chunks are read as in *read*;
- *read* -- every chunk read into a new ``bytes`` (``pread``, at most the size the file had when
  opened), then decoded (raw: crc32c, then a copy into the tensor): the code before *into*;
- *mapped* -- *read* with the former ``read_chunk``: chunks of at least 1 MiB mapped read-only
  (``MAP_POPULATE``). It is what a truncation under a reader turned into ``SIGBUS``;
- *reused* -- *read* with chunks of at least 256 KiB read with ``preadv`` into a per-thread
  buffer reused once the decode dropped it (what issue 26 suggested; a reusable buffer for
  compressed chunks is this).

Warm: the files are in the page cache (written just before). Cold (``--cold``, root only): the
page cache is dropped (``/proc/sys/vm/drop_caches``) before every timed load. Medians in seconds,
and each mode / into. Then one cached raw chunk file per size decoded into a preallocated array
in each mode (read + crc32c + copy; *into*: read into it + crc32c), mean of 200.
"""

from __future__ import annotations

import argparse
import io
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, load_average, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore.dcp import StorageReader  # noqa: E402
from ckptstore.commit.plan import EncodingOptions  # noqa: E402
from ckptstore.chunkcodec import RawLossless  # noqa: E402
from ckptstore.storage import LocalStorage, Storage  # noqa: E402
from ckptstore.storage.base import Buffer  # noqa: E402

MAP_MIN = 1 << 20  # the former threshold of mapped reads
REUSE_MIN = 1 << 18  # the tried reused buffers' threshold
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
MODES = ("into", "read", "mapped", "reused")
_local = threading.local()


def _mapped(storage: LocalStorage, key: str) -> Buffer:
    """The former ``read_chunk`` (warm path): large chunks mapped, smaller ones read."""
    fd = os.open(storage.path(key), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size >= MAP_MIN:
            return memoryview(mmap.mmap(fd, size, flags=_MAP_FLAGS, prot=mmap.PROT_READ))
        with io.FileIO(fd, closefd=False) as f:
            return f.readall()
    finally:
        os.close(fd)


def _reused(storage: LocalStorage, key: str) -> Buffer:
    """Chunks of at least ``REUSE_MIN`` bytes read into this thread's buffer, reused once
    nothing refers to it (a read-only view of it); smaller ones read."""
    fd = os.open(storage.path(key), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < REUSE_MIN:
            return os.pread(fd, size, 0)
        buf = _local.__dict__.get("buf")
        # referenced by the slot, ``buf`` and getrefcount's argument only: free to reuse
        if buf is None or len(buf) < size or sys.getrefcount(buf) > 3:
            buf = _local.buf = np.empty(size + (size >> 4), dtype=np.uint8)
        done = 0
        with memoryview(buf) as view:
            while done < size:
                n = os.preadv(fd, [view[done:size]], done)
                if not n:
                    break
                done += n
        return memoryview(buf)[:done].toreadonly()
    finally:
        os.close(fd)


def _use(storage: LocalStorage, mode: str) -> None:
    """Make ``storage``'s chunk reads the ones of ``mode`` (attributes of this object only):
    every mode but *into* reads raw chunks whole and copies them (``Storage``'s default
    ``read_chunk_into``, over this mode's ``read_chunk``)."""
    for name in ("read_chunk", "read_chunk_into"):
        if name in vars(storage):
            delattr(storage, name)
    if mode == "into":
        return
    storage.read_chunk_into = (  # type: ignore[method-assign]
        lambda key, parts: Storage.read_chunk_into(storage, key, parts))
    if mode != "read":
        fn: Callable[[LocalStorage, str], Buffer] = _mapped if mode == "mapped" else _reused
        storage.read_chunk = lambda key: fn(storage, key)  # type: ignore[method-assign]


def _drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _timed(root: str, mode: str, cold: bool, into: dict[str, torch.Tensor],
           want: torch.Tensor) -> float:
    """One ``dcp.load`` into the preallocated ``into`` (chunks decode straight into it: no
    allocation is timed, which this VM makes slow and erratic)."""
    store = ckptstore.open(root, create=False)
    _use(store.storage, mode)
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
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n"
          f"# load average before: {load_average()}\n")
    rows_each = args.mb * 10**6 // (4 * 64 * 4)
    g = torch.Generator().manual_seed(0)
    state = {f"t{i}": torch.randn(rows_each, 64, generator=g) for i in range(4)}
    into = {k: torch.empty_like(v) for k, v in state.items()}
    rows = []
    for compression in ("entropy", "none"):
        root = tempfile.mkdtemp(prefix="ckpt-mapped-", dir=args.dir)
        try:
            with ckptstore.open(root, options=EncodingOptions(compression=compression),
                                durable=False) as s:
                s.commit(state)
            os.sync()  # no writeback of the commit under the timed checkouts
            for cold in (False, True) if args.cold else (False,):
                times: dict[str, list[float]] = {m: [] for m in MODES}
                for mode in MODES:  # warm up each (compile, first buffers)
                    _timed(root, mode, False, into, state["t3"])
                for _ in range(args.repeat):
                    for mode in MODES:
                        times[mode].append(_timed(root, mode, cold, into, state["t3"]))
                med = {m: statistics.median(times[m]) for m in MODES}
                rows.append([compression, "cold" if cold else "warm",
                             *(f"{med[m]:.3f}" for m in MODES),
                             *(f"{med[m] / med['into']:.2f}" for m in MODES[1:])])
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(markdown_table(["encoding", "page cache", *(f"{m} s" for m in MODES),
                          *(f"{m} / into" for m in MODES[1:])], rows, "ll" + "r" * 7))
    print(f"\nOne raw chunk file, page cache warm: decoded into a preallocated array, mean of "
          f"200 (mapped from {MAP_MIN >> 10} KiB, reused from {REUSE_MIN >> 10} KiB)\n")
    print(markdown_table(["chunk KiB", *(f"{m} ms" for m in MODES)], _by_size(args.dir),
                         "r" * 5))
    print(f"\n# load average after: {load_average()}")
    return 0


class _Source:
    """One stored chunk as a codec reads it (``ckptstore.chunkcodec.ChunkSource``)."""

    def __init__(self, storage: LocalStorage, where: str):
        self.storage, self.where = storage, where

    def read(self) -> Buffer:
        return self.storage.read_chunk(self.where)

    def read_into(self, parts: list[memoryview]) -> int:
        return self.storage.read_chunk_into(self.where, parts)


def _by_size(where: str | None) -> list[list[str]]:
    """One cached raw chunk per size read and decoded into a preallocated array (what a load
    into place does with it), in each mode."""
    root = tempfile.mkdtemp(prefix="ckpt-mapped-", dir=where)
    rows, codec = [], RawLossless()
    try:
        storage = LocalStorage(root)
        for kib in (64, 256, 512, 1024, 2048, 4096):
            a = np.random.default_rng(kib).standard_normal(kib << 7)  # kib KiB of float64
            storage.put_chunk(f"c{kib}", codec.encode(a))
            out, source = np.empty_like(a), _Source(storage, f"c{kib}")
            ms: dict[str, float] = {}
            for mode in MODES * 2:  # each twice, the second kept
                _use(storage, mode)
                codec.read_rows(source, a.shape, a.dtype, None, out)
                assert np.array_equal(out, a)
                t0 = time.perf_counter()
                for _ in range(200):
                    codec.read_rows(source, a.shape, a.dtype, None, out)
                ms[mode] = (time.perf_counter() - t0) / 200 * 1e3
            rows.append([str(kib), *(f"{ms[m]:.3f}" for m in MODES)])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
