"""Snapshot: the step of a commit that must happen while training waits -- the bits of every
stored tensor captured in host buffers (or, for tensors quantized on their device, in device
buffers) that training may overwrite as soon as it returns. :func:`ckptstore.commit.persist.persist`
then encodes and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..format.arrays import tensor_to_host
from ..chunkcodec import LOSSLESS_IDS
from ..device.rows import changed_rows_on_device, compared_on_device
from .plan import ArrayItem, CommitPlan, PackedItem, RowsItem
from .staging import PACKED_KEY, StagingPool

__all__ = ["Snapshot", "snapshot", "tracked_rows"]


@dataclass
class Snapshot:
    """Host copies of everything a commit writes: one array per stored item (by index), plus the
    packed bytes of all small tensors."""

    arrays: dict[int, np.ndarray]
    packed: np.ndarray | None
    events: list[torch.cuda.Event] = field(default_factory=list)  # CUDA copies to wait for
    # per item, one importance value per element ranking protect/prune of quantized arrays
    # (DynaQuant's sensitivity, :mod:`ckptstore.commit.sensitivity`); shaped like the item's array
    scores: dict[int, np.ndarray] = field(default_factory=dict)
    # per item, a copy on its own device (or the tensor itself in a synchronous commit): to be
    # quantized there (:mod:`ckptstore.device.quant`) if in ``encode``, else to be moved to the host
    # by :meth:`settle`; such items are not in ``arrays``
    device: dict[int, torch.Tensor] = field(default_factory=dict)
    encode: frozenset[int] = frozenset()
    names: dict[int, str] = field(default_factory=dict)  # array names of ``device`` items
    # the packed bytes of small CUDA tensors, gathered on their device, and their
    # ``(offset, nbytes)`` in ``packed``
    device_packed: torch.Tensor | None = None
    device_ranges: list[tuple[int, int]] = field(default_factory=list)
    # per item, the rows ``arrays`` holds when it holds only them (a tracker's changed rows, or
    # those found on the device); ``xored``: items whose rows are already XOR-ed with their old bits
    gathered: dict[int, np.ndarray] = field(default_factory=dict)
    xored: set[int] = field(default_factory=set)
    # increments compared with a reference on their device: (reference, XOR the changed rows);
    # :meth:`settle` finds the rows there, or, for those staged on the host, copies the reference
    # to the host into ``references`` for the writer to compare with
    compare: dict[int, tuple[torch.Tensor, bool]] = field(default_factory=dict)
    references: dict[int, np.ndarray] = field(default_factory=dict)
    # per incremental item, this commit's values on their device: the next reference, kept there
    next_references: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + (
            self.packed.nbytes if self.packed is not None else 0) + sum(
            t.numel() * t.element_size() for t in self.device.values())

    def ready(self) -> None:
        """Wait until asynchronous device-to-host copies have landed."""
        for e in self.events:
            e.synchronize()
        self.events.clear()

    def settle(self, pool: StagingPool) -> None:
        """On the persist thread: copy what was staged on a device but is not quantized there
        to (pinned, reused) host buffers -- the device-to-host copies that the snapshot's
        device-to-device copies took off training's path."""
        self.ready()
        for i, (reference, xor) in self.compare.items():
            current = self.device.pop(i, None)
            if current is not None and current.device == reference.device:
                try:  # only the changed rows cross to the host
                    self.gathered[i], self.arrays[i] = changed_rows_on_device(current, reference,
                                                                              xor)
                except torch.cuda.OutOfMemoryError:
                    pass  # compared on the host below
                else:
                    if xor:
                        self.xored.add(i)
                    self.next_references[i] = current
                    continue
            if current is not None:  # the table comes over whole, to be compared on the host
                self.arrays[i] = pool.to_host(self.names[i], current)
                self.next_references[i] = current
            self.references[i] = tensor_to_host(reference)
        for i in [i for i in self.device if i not in self.encode]:
            self.arrays[i] = pool.to_host(self.names[i], self.device.pop(i))
        if self.device_packed is not None:
            host = pool.to_host(PACKED_KEY, self.device_packed)
            for offset, n in self.device_ranges:
                self.packed[offset: offset + n] = host[offset: offset + n]
            self.device_packed = None


def snapshot(plan: CommitPlan, pool: StagingPool | None = None,
             encode: frozenset[int] = frozenset(), stage: frozenset[int] = frozenset()
             ) -> Snapshot:
    """Capture the bits of every stored tensor on the host.

    Without ``pool`` CPU tensors that are already contiguous are referenced, not copied (the
    synchronous commit path, where training waits anyway). With a
    :class:`~ckptstore.commit.staging.StagingPool` every tensor is copied into a reusable buffer (pinned,
    asynchronously for CUDA tensors) so training may modify it as soon as this returns.

    The items of ``encode`` (:func:`ckptstore.device.quant.device_items`) stay on their device, to
    be quantized there by :func:`~ckptstore.commit.persist.persist`: referenced without a pool, copied
    into a device buffer with one while the device has room. With a pool, the items of
    ``stage`` (every CUDA tensor, :func:`ckptstore.device.quant.staged_items`) are copied into
    device buffers too (but increments whose rows a tracker named: only those rows are staged,
    :attr:`Snapshot.gathered`), and small CUDA tensors into one device buffer of packed bytes: the
    snapshot is then device-to-device copies only, and :meth:`Snapshot.settle` moves what is not
    quantized there to the host on the persist thread. Increments compared with a reference
    kept on their device (:mod:`ckptstore.device.rows`) are staged there too (referenced as they are
    in a synchronous commit): :meth:`Snapshot.settle` moves only their changed rows; a baseline
    of an increment staged there is kept as :attr:`Snapshot.next_references`.
    """
    arrays: dict[int, np.ndarray] = {}
    device: dict[int, torch.Tensor] = {}
    names: dict[int, str] = {}
    gathered: dict[int, np.ndarray] = {}
    compare: dict[int, tuple[torch.Tensor, bool]] = {}
    next_references: dict[int, torch.Tensor] = {}
    events: list[torch.cuda.Event] = []
    packed = None
    dev_packed: torch.Tensor | None = None  # the small CUDA tensors of one GPU, packed
    no_room = False
    ranges: list[tuple[int, int]] = []
    if pool is not None:
        pool.begin()
    if plan.packed_nbytes:
        packed = (np.zeros(plan.packed_nbytes, dtype=np.uint8) if pool is None
                  else pool.packed(plan.packed_nbytes))
    for p in plan.stored():
        if isinstance(p, PackedItem):
            if not p.nbytes:
                continue
            if (pool is not None and stage and p.source.device.type == "cuda" and not no_room
                    and (dev_packed is None or dev_packed.device == p.source.device)):
                if dev_packed is None:  # asked once a snapshot, on the first such tensor's GPU
                    dev_packed = pool.packed_device(plan.packed_nbytes, p.source.device)
                    no_room = dev_packed is None
                if dev_packed is not None:
                    pool.stage_bytes(dev_packed[p.offset: p.offset + p.nbytes], p.source)
                    ranges.append((p.offset, p.nbytes))
                    continue
            host = tensor_to_host(p.source)
            packed[p.offset: p.offset + p.nbytes] = host.reshape(-1).view(np.uint8)
            continue
        assert isinstance(p, ArrayItem)
        rows = tracked_rows(p) if pool is not None else None
        if rows is not None:  # only the rows the increment stores
            arrays[p.index], event = pool.stage_rows(p.array, p.source, rows)
            gathered[p.index] = rows
            if event is not None:
                events.append(event)
            continue
        against = _device_compare(p)
        if against is not None:
            compare[p.index] = against
        # a baseline of an increment staged on its device: the next reference is kept there
        keep = (p.want == "rows" and against is None and p.index in stage
                and compared_on_device(p.source))
        if p.index in encode or (p.index in stage and (pool is not None or against is not None)):
            staged = _stage_on_device(p, pool, to_host=p.index not in encode and against is None)
            if staged is not None:
                device[p.index], event = staged
                names[p.index] = p.array
                if event is not None:
                    events.append(event)
                if keep:
                    next_references[p.index] = device[p.index]
                continue
        if pool is None:
            arrays[p.index] = tensor_to_host(p.source)
            if keep:  # a synchronous commit: training waits until the copy is made
                next_references[p.index] = p.source.detach()
            continue
        arrays[p.index], event = pool.stage(p.array, p.source)
        if event is not None:
            events.append(event)
    if dev_packed is not None and ranges:
        events.append(pool.record_side_stream(dev_packed.device))
    if pool is not None:
        pool.release_unused()  # buffers of tensors that changed shape or left the state
    return Snapshot(arrays, packed, events, device=device,
                    encode=frozenset(i for i in encode if i in device),
                    names=names, device_packed=dev_packed if ranges else None,
                    device_ranges=ranges, gathered=gathered, compare=compare,
                    next_references=next_references)


def _device_compare(p: ArrayItem) -> tuple[torch.Tensor, bool] | None:
    """An increment compared with a reference on its device: that reference, and whether its
    changed rows are stored as the XOR of their old bits (an exact, lossless chain)."""
    if not isinstance(p, RowsItem) or p.start.tracked_rows is not None or (
            p.start.device_reference is None):
        return None
    return p.start.device_reference, p.start.exact and p.codec.codec_id in LOSSLESS_IDS


def tracked_rows(p: ArrayItem) -> np.ndarray | None:
    """The rows an increment stores, when a tracker named them and nothing else of the table
    is needed (no reference to XOR the old rows against)."""
    if not isinstance(p, RowsItem) or p.start.tracked_rows is None or (
            p.start.reference is not None):
        return None
    return np.flatnonzero(p.start.tracked_rows).astype(np.int64)


def _stage_on_device(p: ArrayItem, pool: StagingPool | None, to_host: bool
                     ) -> tuple[torch.Tensor, torch.cuda.Event | None] | None:
    """A copy of the item's tensor on its device (None: no room there; ``to_host``: it goes
    to the host later), or, in a synchronous commit, the tensor itself with an event marking
    what training queued so far."""
    if pool is not None:
        return pool.stage_device(p.array, p.source, to_host)
    t = p.source.detach()
    if t.device.type != "cuda":
        return t, None
    event = torch.cuda.Event(blocking=True)
    event.record(torch.cuda.current_stream(t.device))
    return t, event
