"""Snapshot (state -> host buffers) and persist (host buffers -> chunks on the store).

``snapshot`` is the only step that must happen while training waits; ``persist`` finds changed
rows, encodes (lossless, quantized, code deltas) and writes chunks on a thread pool, at most
``max_inflight`` encoded chunks in memory at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .arrays import ChunkGrid, tensor_to_host, write_array
from .chunkcodec import BloscLossless, ChunkCodec, QuantizedLossy, encoded_size
from .incremental import changed_rows
from .layout import data_dir
from .plan import PACKED_ARRAY, CommitPlan, TensorPlan
from .storage import Storage

__all__ = ["GROUP_METADATA", "Persisted", "Snapshot", "bounded_submit", "persist", "snapshot"]

GROUP_METADATA = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()
_ROWS_CODEC = BloscLossless()


@dataclass
class Snapshot:
    """Host copies of everything a commit writes: one array per stored entry, plus the packed
    bytes of all small tensors."""

    arrays: dict[int, np.ndarray]  # id(plan entry) -> host array
    packed: np.ndarray | None
    events: list[Any] = field(default_factory=list)  # CUDA copies to wait for before reading

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + (
            self.packed.nbytes if self.packed is not None else 0)

    def ready(self) -> None:
        """Wait until asynchronous device-to-host copies have landed."""
        for e in self.events:
            e.synchronize()
        self.events.clear()


def snapshot(plan: CommitPlan, pool: Any = None) -> Snapshot:
    """Capture the bits of every stored tensor on the host.

    Without ``pool`` CPU tensors that are already contiguous are referenced, not copied (the
    synchronous commit path, where training waits anyway). With a
    :class:`~ckptstore.staging.StagingPool` every tensor is copied into a reusable buffer (pinned,
    asynchronously for CUDA tensors) so training may modify it as soon as this returns.
    """
    arrays: dict[int, np.ndarray] = {}
    events: list[Any] = []
    packed = None
    if plan.packed_nbytes:
        packed = (np.zeros(plan.packed_nbytes, dtype=np.uint8) if pool is None
                  else pool.packed(plan.packed_nbytes))
    for p in plan.stored():
        if p.layout == "packed":
            if p.nbytes:
                host = tensor_to_host(p.source)
                packed[p.offset: p.offset + p.nbytes] = host.reshape(-1).view(np.uint8)
            continue
        if pool is None:
            arrays[id(p)] = tensor_to_host(p.source)
            continue
        arrays[id(p)], event = pool.stage(p.array or p.path, p.source)
        if event is not None:
            events.append(event)
    return Snapshot(arrays, packed, events)


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


@dataclass
class Persisted:
    """What persist wrote, per plan entry: bytes, chain parts, rows, and codes kept for deltas."""

    sizes: dict[str, int] = field(default_factory=dict)
    parts: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    fractions: dict[int, float] = field(default_factory=dict)
    rows: dict[int, np.ndarray] = field(default_factory=dict)
    codes: dict[int, dict[int, tuple[np.ndarray, Any]]] = field(default_factory=dict)

    @property
    def stored_bytes(self) -> int:
        return sum(self.sizes.values())


class _CodesSink:
    """Keeps the codes of every chunk a quantized codec encodes (the base of the next delta)."""

    def __init__(self, codec: QuantizedLossy):
        self.codec = codec
        self.codes: dict[int, tuple[np.ndarray, Any]] = {}


def _write_chunks(storage: Storage, prefix: str, a: np.ndarray, grid: ChunkGrid,
                  encode: Callable[[int, np.ndarray], bytes], submit: Callable[..., Any],
                  metadata: bytes | None) -> list[Future]:
    """Queue one encoded chunk per grid row block (a custom per-chunk encoder)."""

    def put(key: str, i: int, lo: int, hi: int) -> int:
        part = a[lo:hi]
        if hi - lo < grid.chunks[0]:
            full = np.zeros(grid.chunks, dtype=a.dtype)
            full[: hi - lo] = part
            part = full
        data = encode(i, part)
        storage.put_chunk(f"{prefix}/{key}", data)
        return encoded_size(data)

    def put_meta() -> int:
        storage.put_chunk(f"{prefix}/zarr.json", metadata)
        return len(metadata)

    futures = [submit(put_meta)] if metadata else []
    futures += [submit(put, key, i, lo, hi) for i, key, lo, hi in grid]
    return futures


def _attrs(p: TensorPlan, **extra: Any) -> dict[str, Any]:
    return {"ckptstore": {"torch_dtype": p.dtype, "path": p.path, **extra}}


def persist(storage: Storage, commit_id: str, plan: CommitPlan, snap: Snapshot,
            executor: Executor, max_inflight: int = 8,
            chunk_bytes: int | None = None, progress: Any = None) -> Persisted:
    """Write the commit's zarr group; return what was written (the codes of quantized tensors
    planned with ``keep_codes`` included: the base of later code deltas).

    ``progress`` (a :class:`~ckptstore.pending.Progress`) counts bytes written as chunks land.
    """
    from .arrays import CHUNK_BYTES

    chunk_bytes = chunk_bytes or CHUNK_BYTES
    prefix = data_dir(commit_id)
    snap.ready()
    storage.put_chunk(f"{prefix}/zarr.json", GROUP_METADATA)
    submit = bounded_submit(executor, max_inflight)
    if progress is not None:
        submit = _counting(submit, progress)
    pending: dict[str, list[Future]] = {}
    out = Persisted()
    sinks: dict[int, _CodesSink] = {}

    for p in plan.stored():
        if p.layout == "packed":
            continue
        host = snap.arrays[id(p)]
        if p.layout == "array":
            if p.keep_codes and isinstance(p.codec, QuantizedLossy):
                sink = sinks[id(p)] = _CodesSink(p.codec)
                meta = _array_meta(p.grid, host.dtype, p.codec, _attrs(p))
                pending[p.array] = _write_chunks(
                    storage, f"{prefix}/{p.array}", host, p.grid,
                    lambda i, c, s=sink: _encode_keep(s, i, c), submit, meta)
            else:
                pending[p.array] = write_array(storage, f"{prefix}/{p.array}", host, p.grid,
                                               p.codec, _attrs(p), submit)
            continue
        # chain entries
        chain = p.chain
        if chain.kind == "delta":
            base = chain.shadow.codes
            sink = sinks[id(p)] = _CodesSink(p.codec)

            def enc(i: int, c: np.ndarray, s: _CodesSink = sink, base=base) -> bytes:
                data, codes, params = s.codec.encode_delta(c, *base[i])
                s.codes[i] = (codes, params)
                return data

            name = f"{p.array}.codes"
            pending[name] = _write_chunks(storage, f"{prefix}/{name}", host, p.grid, enc, submit,
                                          None)
            out.parts[id(p)] = {"codes": _blob(host.dtype, host.shape, commit_id, name,
                                               p.grid, {"id": "qdelta"})}
            out.fractions[id(p)] = 1.0
            continue
        if chain.tracked_rows is not None:
            rows = np.flatnonzero(chain.tracked_rows).astype(np.int64)
        else:
            rows = changed_rows(host, chain.shadow.values)
        values = host[rows]
        out.rows[id(p)] = rows
        nrows = max(host.shape[0], 1)
        out.fractions[id(p)] = len(rows) / nrows
        rgrid = ChunkGrid.for_array(rows.shape, 8, chunk_bytes)
        vgrid = ChunkGrid.for_array(values.shape, values.dtype.itemsize, chunk_bytes)
        for part, arr, grid, codec in (("rows", rows, rgrid, _ROWS_CODEC),
                                       ("values", values, vgrid, p.codec)):
            name = f"{p.array}.{part}"
            pending[name] = write_array(storage, f"{prefix}/{name}", arr, grid, codec,
                                        _attrs(p, part=part), submit)
            out.parts.setdefault(id(p), {})[part] = _blob(arr.dtype, arr.shape, commit_id, name,
                                                          grid, codec.config())

    if snap.packed is not None:
        attrs = {"ckptstore": {"packed": True}}
        pending[PACKED_ARRAY] = write_array(storage, f"{prefix}/{PACKED_ARRAY}", snap.packed,
                                            plan.packed_grid, plan.codec, attrs, submit)
    out.sizes = {name: sum(f.result() for f in futs) for name, futs in pending.items()}
    out.codes = {k: s.codes for k, s in sinks.items()}
    storage.fsync_dir(prefix)
    return out


def _counting(submit: Callable[..., Future], progress: Any) -> Callable[..., Future]:
    def counted(fn: Callable[..., int], *args: Any) -> Future:
        def run() -> int:
            n = fn(*args)
            progress.written += n
            return n
        return submit(run)
    return counted


def _encode_keep(sink: _CodesSink, index: int, chunk: np.ndarray) -> bytes:
    data, codes, params = sink.codec.encode_codes(chunk)
    sink.codes[index] = (codes, params)
    return data


def _array_meta(grid: ChunkGrid, dtype: np.dtype, codec: ChunkCodec,
                attrs: dict[str, Any]) -> bytes:
    from .arrays import array_metadata
    return array_metadata(grid, dtype, codec, attrs)


def _blob(dtype: np.dtype, shape: tuple[int, ...], commit: str, name: str, grid: ChunkGrid,
          codec: dict[str, Any]) -> dict[str, Any]:
    return {"dtype": np.dtype(dtype).name, "shape": list(shape), "commit": commit, "array": name,
            "chunks": list(grid.chunks), "codec": codec}
