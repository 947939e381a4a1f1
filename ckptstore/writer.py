"""Snapshot (state -> host buffers) and persist (host buffers -> chunks on the store).

``snapshot`` is the only step that must happen while training waits; ``persist`` encodes and writes
chunks on a thread pool, at most ``max_inflight`` encoded chunks in memory at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import tensor_to_host, write_array
from .fs import Storage
from .layout import data_dir
from .plan import PACKED_ARRAY, CommitPlan

__all__ = ["Snapshot", "snapshot", "persist", "bounded_submit", "GROUP_METADATA"]

GROUP_METADATA = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


@dataclass
class Snapshot:
    """Host copies of everything a commit writes: one array per stored entry, plus the packed
    bytes of all small tensors."""

    arrays: dict[int, np.ndarray]  # id(plan entry) -> host array
    packed: np.ndarray | None


def snapshot(plan: CommitPlan, copy: bool = False) -> Snapshot:
    """Capture the bits of every stored tensor on the host.

    With ``copy=False`` CPU tensors that are already contiguous are referenced, not copied (the
    synchronous commit path, where training waits anyway).
    """
    arrays: dict[int, np.ndarray] = {}
    packed = np.zeros(plan.packed_nbytes, dtype=np.uint8) if plan.packed_nbytes else None
    for p in plan.stored():
        host = tensor_to_host(p.source)
        if p.layout == "packed":
            if p.nbytes:
                packed[p.offset: p.offset + p.nbytes] = host.reshape(-1).view(np.uint8)
            continue
        if copy:
            host = host.copy()
        arrays[id(p)] = host
    return Snapshot(arrays, packed)


def bounded_submit(executor: Executor, max_inflight: int) -> Callable[..., Future]:
    """``executor.submit`` that blocks while ``max_inflight`` tasks are queued or running."""
    slots = threading.BoundedSemaphore(max_inflight)

    def submit(fn: Callable[..., Any], *args: Any) -> Future:
        slots.acquire()

        def run() -> Any:
            try:
                return fn(*args)
            finally:
                slots.release()

        try:
            return executor.submit(run)
        except BaseException:
            slots.release()
            raise

    return submit


def persist(storage: Storage, commit_id: str, plan: CommitPlan, snap: Snapshot,
            executor: Executor, max_inflight: int = 8) -> dict[str, int]:
    """Write the commit's zarr group; return ``{array name: stored bytes}``."""
    prefix = data_dir(commit_id)
    storage.put_chunk(f"{prefix}/zarr.json", GROUP_METADATA)
    submit = bounded_submit(executor, max_inflight)
    pending: dict[str, list[Future]] = {}
    for p in plan.stored():
        if p.layout != "array":
            continue
        attrs = {"ckptstore": {"torch_dtype": p.dtype, "path": p.path}}
        pending[p.array] = write_array(storage, f"{prefix}/{p.array}", snap.arrays[id(p)],
                                       p.grid, plan.codec, attrs, submit)
    if snap.packed is not None:
        attrs = {"ckptstore": {"packed": True}}
        pending[PACKED_ARRAY] = write_array(storage, f"{prefix}/{PACKED_ARRAY}", snap.packed,
                                            plan.packed_grid, plan.codec, attrs, submit)
    sizes = {name: sum(f.result() for f in futs) for name, futs in pending.items()}
    storage.fsync_dir(prefix)
    return sizes
