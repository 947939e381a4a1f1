"""Persist: a commit's snapshot (:mod:`ckptstore.commit.snapshot`) -> chunks on the store.

``persist`` encodes full arrays (lossless, quantized) and has each
chain entry's kind write its parts (:meth:`~ckptstore.chains.kinds.ChainKind.write`: changed
rows, code deltas, XORs, residuals); chunks are written on a thread pool, at most
``max_inflight`` encoded chunks in memory at once. Snapshot and persist key what they produce by
the plan item's ``index`` (:attr:`Snapshot.items`, :class:`Persisted.results`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..format.arrays import ChunkGrid, chunk_view, storage_dtype, write_array, write_chunks
from ..chains.links import CodesBase
from ..chains.kinds import chain_kind
from ..chunkcodec import ChunkCodec, Encoded, QuantizedLossy
from .dedup import Dedup, Reused, chunk_digest, content_digest
from ..device.bits import PackedCodes
from ..device.quant import ChunkCodes, device_chunk_codes
from ..format.layout import PACKED_ARRAY, ZARR_JSON, array_dir, data_dir, part_array
from ..format.zarrjson import GROUP_METADATA, PACKED_ATTRIBUTES, array_attributes
from ..history.manifest import Blob
from .pending import Progress
from .plan import ArrayItem, ChainItem, CommitPlan, PackedItem, PlanItem
from .snapshot import Captured, Snapshot
from ..storage import Storage

if TYPE_CHECKING:
    from ckptcodecs import QuantParams

__all__ = ["Persisted", "WriteResult", "bounded_submit", "persist"]

Submit = Callable[..., Future]
Staged = np.ndarray | torch.Tensor  # an item's snapshot: host bits, or a tensor on its device


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
    chunk_digests: str | None = None  # each chunk's hex sha256, back to back (dedup)


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
    chunk_digests: str | None = None

    def result(self) -> WriteResult:
        return WriteResult(self.index, sum(f.result() for f in self.futures), self.parts,
                           self.fraction, self.codes, self.digest, self.reused, self.rebuilt,
                           self.chunk_digests)


def _attrs(p: PlanItem, part: str | None = None) -> dict[str, dict[str, object]]:
    return array_attributes(p.dtype, p.path, part)


def _blob(a: np.ndarray, commit: str, name: str, grid: ChunkGrid, codec: dict[str, object],
          dtype: np.dtype | None = None) -> Blob:
    """The manifest record of array ``name`` holding ``a`` (``dtype``: of a staged tensor's
    host bits, when ``a`` is not on the host)."""
    return Blob(dtype=(dtype or a.dtype).name, shape=list(grid.shape), commit=commit, array=name,
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


def _quantized_chunks(p: ArrayItem, staged: Staged, score: np.ndarray | None,
                      packed: bool = False) -> ChunkCodes:
    """``codes(chunk index, first row, end row) -> (codes, params)`` of a quantized item,
    computed on its device (``staged`` a tensor there; ``packed``: bit-packed there too, as
    :class:`~ckptstore.device.bits.PackedCodes`) or on the host."""
    codec = p.codec
    assert isinstance(codec, QuantizedLossy)
    if isinstance(staged, torch.Tensor):
        return device_chunk_codes(staged, p.grid, codec, packed)

    def codes(i: int, lo: int, hi: int) -> tuple[np.ndarray, QuantParams]:
        return codec.quantize_chunk(chunk_view(staged, p.grid, lo, hi),
                                    _score_chunk(score, p.grid, i))

    return codes


def _host_dtype(staged: Staged) -> np.dtype:
    return staged.dtype if isinstance(staged, np.ndarray) else storage_dtype(staged.dtype)


def _chunk_digests(host: np.ndarray, grid: ChunkGrid, submit: Submit) -> list[str]:
    """The hex sha256 of each chunk of ``host`` as the grid cuts it (edge chunks padded as
    stored), hashed by the workers: one parallel pass decides whole-array reuse and which chunks
    are linked."""
    digests = [""] * grid.nchunks

    def digest(i: int, lo: int, hi: int) -> int:
        digests[i] = chunk_digest(chunk_view(host, grid, lo, hi))
        return 0

    for f in [submit(digest, i, lo, hi) for i, _, lo, hi in grid]:
        f.result()
    return digests


def _write_full(storage: Storage, commit_id: str, p: ArrayItem, host: Staged,
                submit: Submit, dedup: Dedup | None, score: np.ndarray | None = None
                ) -> _Pending:
    prefix = array_dir(commit_id, p.array)
    scored = score is not None and isinstance(p.codec, QuantizedLossy)
    if not (p.keep_codes and isinstance(p.codec, QuantizedLossy)) and not scored and not \
            isinstance(host, torch.Tensor):
        if dedup is None:
            return _Pending(p.index, write_array(storage, prefix, host, p.grid, p.codec,
                                                 _attrs(p), submit))
        digests = _chunk_digests(host, p.grid, submit)
        joined = "".join(digests)
        reused = dedup.find(p, joined)
        if reused:
            return _Pending(p.index, [], reused=reused, chunk_digests=joined)
        digest = content_digest(host) if dedup.needs_digest(p) else None  # a parent before v6
        reused = dedup.find_digest(p, digest) if digest is not None else None
        if reused:
            return _Pending(p.index, [], digest=digest, reused=reused, chunk_digests=joined)
        stored = dedup.chunk_sources(p)
        futures = write_array(storage, prefix, host, p.grid, p.codec, _attrs(p), submit,
                              source=lambda i: stored(digests[i]))
        return _Pending(p.index, futures, chunk_digests=joined)
    codes: CodesBase = {}
    codec = p.codec
    assert isinstance(codec, QuantizedLossy)
    quantized = _quantized_chunks(p, host, score, packed=not p.keep_codes)

    def encoded(i: int, lo: int, hi: int) -> Encoded:
        chunk_codes, params = quantized(i, lo, hi)
        if isinstance(chunk_codes, PackedCodes):
            return codec.pack(None, params, chunk_codes.data)
        if p.keep_codes:
            codes[i] = (chunk_codes, params)
        return codec.pack(chunk_codes, params)

    futures = write_chunks(storage, prefix, p.grid, _host_dtype(host), codec, _attrs(p), submit,
                           encoded)
    return _Pending(p.index, futures, codes=codes if p.keep_codes else None)


class _LinkParts:
    """A chain item's :class:`~ckptstore.chains.kinds.LinkSink`: each part queued as an array
    ``<array>.<part>`` of the commit, its futures and manifest record kept in ``pending``."""

    def __init__(self, storage: Storage, commit_id: str, p: ChainItem, item: Captured,
                 submit: Submit, chunk_bytes: int):
        self.storage, self.commit_id, self.p, self.item = storage, commit_id, p, item
        self.submit, self.chunk_bytes = submit, chunk_bytes
        self.host_dtype = _host_dtype(item.staged)
        self.pending = _Pending(p.index, [])

    def array(self, part: str, values: np.ndarray, grid: ChunkGrid, codec: ChunkCodec,
              encode: Callable[[int, np.ndarray], Encoded] | None = None) -> None:
        name = part_array(self.p.array, part)
        self.pending.futures += write_array(self.storage, array_dir(self.commit_id, name),
                                            values, grid, codec, _attrs(self.p, part=part),
                                            self.submit, encode)
        self.pending.parts[part] = _blob(values, self.commit_id, name, grid, codec.config())

    def chunks(self, part: str, grid: ChunkGrid, dtype: np.dtype, codec: ChunkCodec,
               encoded: Callable[[int, int, int], Encoded]) -> None:
        name = part_array(self.p.array, part)
        self.pending.futures += write_chunks(self.storage, array_dir(self.commit_id, name),
                                             grid, dtype, codec, _attrs(self.p, part=part),
                                             self.submit, encoded)
        self.pending.parts[part] = Blob(dtype=dtype.name, shape=list(grid.shape),
                                        commit=self.commit_id, array=name,
                                        chunks=list(grid.chunks), codec=codec.config())

    def quantized(self) -> ChunkCodes:
        return _quantized_chunks(self.p, self.item.staged, self.item.score)


def _write_link(storage: Storage, commit_id: str, p: ChainItem, item: Captured,
                submit: Submit, chunk_bytes: int) -> _Pending:
    """A chain entry's parts, written by its kind (:meth:`ChainKind.write`)."""
    sink = _LinkParts(storage, commit_id, p, item, submit, chunk_bytes)
    done = chain_kind(p.kind).write(p, item, sink)
    pending = sink.pending
    pending.fraction, pending.codes, pending.rebuilt = done.fraction, done.codes, done.rebuilt
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
        item = snap.items[p.index]
        host = item.staged
        if isinstance(p, ChainItem):  # a chain entry: its kind writes its parts
            pending.append(_write_link(storage, commit_id, p, item, submit, chunk_bytes))
        else:
            assert isinstance(p, ArrayItem)
            pending.append(_write_full(storage, commit_id, p, host, submit, dedup, item.score))
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
