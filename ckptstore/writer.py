"""Snapshot (state -> host buffers) and persist (host buffers -> chunks on the store).

``snapshot`` is the only step that must happen while training waits; ``persist`` finds changed
rows, encodes (lossless, quantized, code deltas) and writes chunks on a thread pool, at most
``max_inflight`` encoded chunks in memory at once. Both key what they produce by the plan item's
``index`` (:class:`Snapshot.arrays`, :class:`Persisted.results`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass, field

import numpy as np
import torch

from .arrays import ChunkGrid, tensor_to_host, write_array
from .chains.decide import CodesBase
from .chains.replay import changed_rows, xor_bits
from .chunkcodec import LOSSLESS_IDS, BloscLossless, CodeDelta, Encoded, PlanesLossless, \
    QuantizedLossy
from .dedup import Dedup, Reused, content_digest
from .layout import PACKED_ARRAY, ZARR_JSON, array_dir, data_dir, part_array
from .manifest import Blob
from .pending import Progress
from .plan import ArrayItem, CodesItem, CommitPlan, PackedItem, PlanItem, ResidualItem, RowsItem, \
    XorItem
from .staging import StagingPool
from .storage import Storage

__all__ = ["GROUP_METADATA", "Persisted", "Snapshot", "WriteResult", "bounded_submit", "persist",
           "snapshot"]

GROUP_METADATA = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()
_ROWS_CODEC = BloscLossless()
Submit = Callable[..., Future]


@dataclass
class Snapshot:
    """Host copies of everything a commit writes: one array per stored item (by index), plus the
    packed bytes of all small tensors."""

    arrays: dict[int, np.ndarray]
    packed: np.ndarray | None
    events: list[torch.cuda.Event] = field(default_factory=list)  # CUDA copies to wait for
    # per item, one importance value per element ranking protect/prune of quantized arrays
    # (DynaQuant's sensitivity, :mod:`ckptstore.sensitivity`); shaped like the item's array
    scores: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + (
            self.packed.nbytes if self.packed is not None else 0)

    def ready(self) -> None:
        """Wait until asynchronous device-to-host copies have landed."""
        for e in self.events:
            e.synchronize()
        self.events.clear()


def snapshot(plan: CommitPlan, pool: StagingPool | None = None) -> Snapshot:
    """Capture the bits of every stored tensor on the host.

    Without ``pool`` CPU tensors that are already contiguous are referenced, not copied (the
    synchronous commit path, where training waits anyway). With a
    :class:`~ckptstore.staging.StagingPool` every tensor is copied into a reusable buffer (pinned,
    asynchronously for CUDA tensors) so training may modify it as soon as this returns.
    """
    arrays: dict[int, np.ndarray] = {}
    events: list[torch.cuda.Event] = []
    packed = None
    if pool is not None:
        pool.begin()
    if plan.packed_nbytes:
        packed = (np.zeros(plan.packed_nbytes, dtype=np.uint8) if pool is None
                  else pool.packed(plan.packed_nbytes))
    for p in plan.stored():
        if isinstance(p, PackedItem):
            if p.nbytes:
                host = tensor_to_host(p.source)
                packed[p.offset: p.offset + p.nbytes] = host.reshape(-1).view(np.uint8)
            continue
        assert isinstance(p, ArrayItem)
        if pool is None:
            arrays[p.index] = tensor_to_host(p.source)
            continue
        arrays[p.index], event = pool.stage(p.array, p.source)
        if event is not None:
            events.append(event)
    if pool is not None:
        pool.release_unused()  # buffers of tensors that changed shape or left the state
    return Snapshot(arrays, packed, events)


def bounded_submit(executor: Executor, max_inflight: int) -> Submit:
    """``executor.submit`` that blocks while ``max_inflight`` tasks are queued or running."""
    slots = threading.BoundedSemaphore(max_inflight)

    def submit(fn: Callable[..., object], *args: object) -> Future:
        slots.acquire()

        def run() -> object:
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


@dataclass(frozen=True, eq=False)
class WriteResult:
    """What persist wrote for one plan item (``index``): stored bytes, the parts of a chain entry,
    the fraction of rows an increment stored, and kept codes (the next delta's base)."""

    index: int
    stored_bytes: int
    parts: Mapping[str, Blob] = field(default_factory=dict)
    fraction: float | None = None
    codes: CodesBase | None = None
    digest: str | None = None     # sha256 of the bits (dedup)
    reused: Reused | None = None  # the bits were already stored there: nothing written
    rebuilt: np.ndarray | None = None  # residual: the values a checkout rebuilds


@dataclass(frozen=True, eq=False)
class Persisted:
    """Every item's :class:`WriteResult` by index, and the stored bytes of the packed array."""

    results: Mapping[int, WriteResult]
    packed_bytes: int = 0

    @property
    def stored_bytes(self) -> int:
        return self.packed_bytes + sum(r.stored_bytes for r in self.results.values())


@dataclass
class _Pending:
    """An item whose chunks are queued: the futures, then what its result will say."""

    index: int
    futures: list[Future]
    parts: dict[str, Blob] = field(default_factory=dict)
    fraction: float | None = None
    codes: CodesBase | None = None
    digest: str | None = None
    reused: Reused | None = None
    rebuilt: np.ndarray | None = None

    def result(self) -> WriteResult:
        return WriteResult(self.index, sum(f.result() for f in self.futures), self.parts,
                           self.fraction, self.codes, self.digest, self.reused, self.rebuilt)


# the ``attributes`` of the zarr.json of the packed array of small tensors
PACKED_ATTRIBUTES: dict[str, dict[str, object]] = {"ckptstore": {"packed": True}}


def array_attributes(dtype: str, path: str, part: str | None = None
                     ) -> dict[str, dict[str, object]]:
    """The ``attributes`` of an array's zarr.json: the tensor's dtype and path, and for a part
    of a chain link its key (``verify`` rebuilds them from the manifest)."""
    own: dict[str, object] = {"torch_dtype": dtype, "path": path}
    return {"ckptstore": own if part is None else {**own, "part": part}}


def _attrs(p: PlanItem, part: str | None = None) -> dict[str, dict[str, object]]:
    return array_attributes(p.dtype, p.path, part)


def _blob(a: np.ndarray, commit: str, name: str, grid: ChunkGrid, codec: dict[str, object]
          ) -> Blob:
    return Blob(dtype=a.dtype.name, shape=list(a.shape), commit=commit, array=name,
                chunks=list(grid.chunks), codec=codec)


def _score_chunk(score: np.ndarray | None, grid: ChunkGrid, i: int) -> np.ndarray | None:
    """Chunk ``i`` of a score array, padded as the stored edge chunk is (zeros)."""
    if score is None:
        return None
    lo, hi = grid.rows(i)
    part = score[lo:hi]
    if grid.shape and hi - lo < grid.chunks[0]:
        full = np.zeros(grid.chunks, dtype=score.dtype)
        full[: hi - lo] = part
        return full
    return part


def _write_full(storage: Storage, commit_id: str, p: ArrayItem, host: np.ndarray,
                submit: Submit, dedup: Dedup | None, score: np.ndarray | None = None
                ) -> _Pending:
    prefix = array_dir(commit_id, p.array)
    scored = score is not None and isinstance(p.codec, QuantizedLossy)
    if not (p.keep_codes and isinstance(p.codec, QuantizedLossy)) and not scored:
        if dedup is None:
            return _Pending(p.index, write_array(storage, prefix, host, p.grid, p.codec,
                                                 _attrs(p), submit))
        digest = content_digest(host)
        reused = dedup.find(p, digest)
        futures = [] if reused else write_array(storage, prefix, host, p.grid, p.codec,
                                                _attrs(p), submit)
        return _Pending(p.index, futures, digest=digest, reused=reused)
    codes: CodesBase = {}
    codec = p.codec

    def encode(i: int, chunk: np.ndarray) -> Encoded:
        data, chunk_codes, params = codec.encode_codes(chunk, _score_chunk(score, p.grid, i))
        if p.keep_codes:
            codes[i] = (chunk_codes, params)
        return data

    futures = write_array(storage, prefix, host, p.grid, codec, _attrs(p), submit, encode)
    return _Pending(p.index, futures, codes=codes if p.keep_codes else None)


def _write_code_deltas(storage: Storage, commit_id: str, p: CodesItem, host: np.ndarray,
                       submit: Submit, score: np.ndarray | None = None) -> _Pending:
    base = p.start.base_codes
    codec = p.codec
    assert isinstance(codec, QuantizedLossy) and base is not None
    codes: CodesBase = {}

    def encode(i: int, chunk: np.ndarray) -> Encoded:
        data, new_codes, params = codec.encode_delta(chunk, *base[i],
                                                     _score_chunk(score, p.grid, i))
        codes[i] = (new_codes, params)
        return data

    name = part_array(p.array, "codes")
    futures = write_array(storage, array_dir(commit_id, name), host, p.grid, codec, None, submit,
                          encode)
    parts = {"codes": _blob(host, commit_id, name, p.grid, CodeDelta().config())}
    return _Pending(p.index, futures, parts, fraction=1.0, codes=codes)


def _write_xor(storage: Storage, commit_id: str, p: XorItem, host: np.ndarray,
               submit: Submit) -> _Pending:
    reference = p.start.reference
    assert reference is not None and reference.shape == host.shape
    bits = xor_bits(host, reference)
    name = part_array(p.array, "xor")
    codec = PlanesLossless()
    futures = write_array(storage, array_dir(commit_id, name), bits, p.grid, codec,
                          _attrs(p, part="xor"), submit)
    return _Pending(p.index, futures, {"xor": _blob(bits, commit_id, name, p.grid,
                                                    codec.config())}, fraction=1.0)


def _write_residual(storage: Storage, commit_id: str, p: ResidualItem, residual: np.ndarray,
                    submit: Submit) -> _Pending:
    """Quantize the pruned residual chunk by chunk; rebuild ``reference + dequantized`` as a
    checkout will (the next residual's reference)."""
    from ckptcodecs import dequantize

    reference = p.start.reference
    codec = p.codec
    assert reference is not None and reference.shape == residual.shape
    assert isinstance(codec, QuantizedLossy) and residual.dtype == reference.dtype
    rebuilt = np.empty_like(reference)

    def encode(i: int, chunk: np.ndarray) -> Encoded:
        data, codes, params = codec.encode_codes(chunk)
        lo, hi = p.grid.rows(i)
        n = reference[lo:hi].size
        values = dequantize(codes, params).reshape(-1)[:n].reshape(reference[lo:hi].shape)
        np.add(reference[lo:hi], values, out=rebuilt[lo:hi])
        return data

    name = part_array(p.array, "residual")
    futures = write_array(storage, array_dir(commit_id, name), residual, p.grid, codec,
                          _attrs(p, part="residual"), submit, encode)
    parts = {"residual": _blob(residual, commit_id, name, p.grid, codec.config())}
    return _Pending(p.index, futures, parts, fraction=1.0, rebuilt=rebuilt)


def _write_rows(storage: Storage, commit_id: str, p: RowsItem, host: np.ndarray,
                submit: Submit, chunk_bytes: int) -> _Pending:
    start = p.start
    if start.tracked_rows is not None:
        rows = np.flatnonzero(start.tracked_rows).astype(np.int64)
    else:
        rows = changed_rows(host, start.reference)
    values, part, codec = host[rows], "values", p.codec
    if start.reference is not None and start.exact and codec.codec_id in LOSSLESS_IDS:
        # lossless rows whose old values are at hand: store what changed in their bits
        values, part, codec = xor_bits(values, start.reference[rows]), "xvalues", PlanesLossless()
    pending = _Pending(p.index, [], fraction=len(rows) / max(host.shape[0], 1))
    rgrid = ChunkGrid.for_array(rows.shape, 8, chunk_bytes)
    vgrid = ChunkGrid.for_array(values.shape, values.dtype.itemsize, chunk_bytes)
    for part, arr, grid, codec in (("rows", rows, rgrid, _ROWS_CODEC),
                                   (part, values, vgrid, codec)):
        name = part_array(p.array, part)
        pending.futures += write_array(storage, array_dir(commit_id, name), arr, grid, codec,
                                       _attrs(p, part=part), submit)
        pending.parts[part] = _blob(arr, commit_id, name, grid, codec.config())
    return pending


def persist(storage: Storage, commit_id: str, plan: CommitPlan, snap: Snapshot,
            executor: Executor, max_inflight: int, chunk_bytes: int,
            progress: Progress | None = None, packed_name: str = PACKED_ARRAY,
            dedup: Dedup | None = None) -> Persisted:
    """Write the commit's zarr group; return what was written, per plan item.

    ``progress`` counts bytes written as chunks land; ``packed_name`` names the array of small
    tensors (each rank of a sharded commit writes its own); ``dedup`` (with the parent's
    entries) digests every full array and skips those the parent already stores.
    """
    prefix = data_dir(commit_id)
    snap.ready()
    storage.put_chunk(f"{prefix}/{ZARR_JSON}", GROUP_METADATA)
    submit = bounded_submit(executor, max_inflight)
    if progress is not None:
        submit = _counting(submit, progress)
    pending: list[_Pending] = []
    for p in plan.stored():
        if isinstance(p, PackedItem):
            continue
        host = snap.arrays[p.index]
        if isinstance(p, CodesItem):
            pending.append(_write_code_deltas(storage, commit_id, p, host, submit,
                                              snap.scores.get(p.index)))
        elif isinstance(p, XorItem):
            pending.append(_write_xor(storage, commit_id, p, host, submit))
        elif isinstance(p, ResidualItem):
            pending.append(_write_residual(storage, commit_id, p, host, submit))
        elif isinstance(p, RowsItem):
            pending.append(_write_rows(storage, commit_id, p, host, submit, chunk_bytes))
        else:
            assert isinstance(p, ArrayItem)
            pending.append(_write_full(storage, commit_id, p, host, submit, dedup,
                                       snap.scores.get(p.index)))
    packed: list[Future] = []
    if snap.packed is not None:
        packed = write_array(storage, array_dir(commit_id, packed_name), snap.packed,
                             plan.packed_grid, plan.codec, PACKED_ATTRIBUTES, submit)
    try:
        out = Persisted({w.index: w.result() for w in pending}, sum(f.result() for f in packed))
    except BaseException:  # let the other writes end first: none outlives a failed commit
        wait([f for w in pending for f in w.futures] + packed)
        raise
    storage.fsync_dir(prefix)
    return out


def _counting(submit: Submit, progress: Progress) -> Submit:
    def counted(fn: Callable[..., int], *args: object) -> Future:
        def run() -> int:
            n = fn(*args)
            progress.written += n
            return n
        return submit(run)
    return counted
