"""Snapshot: the step of a commit that must happen while training waits -- the bits of every
stored tensor captured in host buffers (or, for tensors placed on their device, in device
buffers) that training may overwrite as soon as it returns. :func:`ckptstore.commit.persist.persist`
then encodes and writes them.

Each item is captured as its :class:`~ckptstore.commit.placement.Placement` says (chosen once,
before the capture). A :class:`Snapshot` is frozen: the later steps (:meth:`Snapshot.settle`,
:func:`~ckptstore.commit.shrinking.shrink_snapshot`,
:func:`~ckptstore.commit.sensitivity.score_snapshot`) return a new one. The buffers it names
belong to the commit that took it (the staging pool reuses them only for the next snapshot).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..device.rows import changed_rows_on_device
from ..format.arrays import tensor_to_host
from .placement import Capture, Placement
from .plan import ArrayItem, CommitPlan, PackedItem
from .staging import PACKED_KEY, StagingPool

__all__ = ["Captured", "Snapshot", "snapshot"]

Event = torch.cuda.Event


@dataclass(frozen=True, eq=False)
class Captured:
    """One array item's snapshot: its bits on the host (``host``: all of them, or the rows
    ``rows`` names, XOR-ed with their old bits when ``xored``) or on its device (``device``: to
    be quantized there when placed so, else moved to the host by :meth:`Snapshot.settle`).

    ``reference``: the host copy of a device reference the item is compared with on the host;
    ``next_reference``: this commit's values on their device, the chain's next reference;
    ``score``: one importance value per element ranking protect/prune (DynaQuant's
    sensitivity, :mod:`ckptstore.commit.sensitivity`)."""

    name: str                      # the item's array name (its staging key)
    placement: Placement
    host: np.ndarray | None = None
    device: torch.Tensor | None = None
    rows: np.ndarray | None = None
    xored: bool = False
    reference: np.ndarray | None = None
    next_reference: torch.Tensor | None = None
    score: np.ndarray | None = None

    @property
    def staged(self) -> np.ndarray | torch.Tensor:
        """What persist encodes: the device copy if one is kept, else the host bits."""
        return self.device if self.device is not None else self.host

    @property
    def nbytes(self) -> int:
        d = self.device
        return (self.host.nbytes if self.host is not None else 0) + (
            d.numel() * d.element_size() if d is not None else 0)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Everything a commit writes: one :class:`Captured` per stored array item (by index), the
    packed bytes of all small tensors and, until :meth:`settle`, the device copies to wait for
    (``events``) and the packed bytes of small CUDA tensors gathered on their device
    (``device_packed``, at the ``(offset, nbytes)`` of ``device_ranges``)."""

    items: Mapping[int, Captured]
    packed: np.ndarray | None
    events: tuple[Event, ...] = ()
    device_packed: torch.Tensor | None = None
    device_ranges: tuple[tuple[int, int], ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.items.values()) + (
            self.packed.nbytes if self.packed is not None else 0)

    @property
    def arrays(self) -> dict[int, np.ndarray]:
        """The host bits of every item that has them, by index."""
        return {i: c.host for i, c in self.items.items() if c.host is not None}

    def ready(self) -> None:
        """Wait until asynchronous device copies have landed."""
        for e in self.events:
            e.synchronize()

    def with_host(self, arrays: Mapping[int, np.ndarray]) -> Snapshot:
        """This snapshot with the host bits of the items of ``arrays`` replaced."""
        return self._with(lambda i, c: replace(c, host=arrays[i]) if i in arrays else c)

    def with_scores(self, scores: Mapping[int, np.ndarray]) -> Snapshot:
        """This snapshot with the items of ``scores`` scored."""
        return self._with(lambda i, c: replace(c, score=scores[i]) if i in scores else c)

    def _with(self, change: Callable[[int, Captured], Captured]) -> Snapshot:
        return replace(self, items={i: change(i, c) for i, c in self.items.items()})

    def settle(self, pool: StagingPool) -> Snapshot:
        """On the persist thread: the snapshot with what was staged on a device but is not
        quantized there copied to (pinned, reused) host buffers -- the device-to-host copies
        that the snapshot's device-to-device copies took off training's path (the packed bytes
        gathered on a device land in this commit's own packed buffer)."""
        self.ready()
        # what moves whole to the host moves in one batch of copies (the packed bytes too)
        whole = [i for i, c in self.items.items() if c.placement.against is None
                 and c.device is not None and c.placement.capture is not Capture.ENCODE]
        moves = [(self.items[i].name, self.items[i].device) for i in whole]
        if self.device_packed is not None:
            moves.append((PACKED_KEY, self.device_packed))
        hosts = pool.to_host_many(moves)
        moved = dict(zip(whole, hosts))
        items = {i: (replace(c, host=moved[i], device=None) if i in moved else _settled(c, pool))
                 for i, c in self.items.items()}
        if self.device_packed is not None:
            host = hosts[-1]
            for offset, n in self.device_ranges:
                self.packed[offset: offset + n] = host[offset: offset + n]
        return Snapshot(items, self.packed)


def _settled(c: Captured, pool: StagingPool) -> Captured:
    """One item settled: compared on its device (only the changed rows cross), or moved whole
    to the host with its reference (compared there), or left on the device to be quantized."""
    if c.placement.against is None:  # moved whole by settle, or left on its device
        return c
    reference, xor = c.placement.against
    current = c.device
    if current is not None and current.device == reference.device:
        try:  # only the changed rows cross to the host
            rows, values = changed_rows_on_device(current, reference, xor)
        except torch.cuda.OutOfMemoryError:
            pass  # compared on the host below
        else:
            return replace(c, host=values, rows=rows, xored=xor, device=None,
                           next_reference=current)
    if current is not None:  # the table comes over whole, to be compared on the host
        c = replace(c, host=pool.to_host(c.name, current), device=None, next_reference=current)
    return replace(c, reference=tensor_to_host(reference))


def snapshot(plan: CommitPlan, placements: Mapping[int, Placement],
             pool: StagingPool | None = None) -> Snapshot:
    """Capture the bits of every stored tensor as ``placements`` (:func:`~ckptstore.commit.
    placement.place`) say.

    Without ``pool`` CPU tensors that are already contiguous are referenced, not copied (the
    synchronous commit path, where training waits anyway), and so are the items kept on their
    device. With a :class:`~ckptstore.commit.staging.StagingPool` every tensor is copied into a
    reusable buffer (pinned, asynchronously for CUDA tensors; on its device for the device
    strategies, while the device has room, else on the host) so training may modify it as soon
    as this returns; :meth:`Snapshot.settle` later moves to the host what is not quantized on
    its device."""
    if pool is not None:
        pool.begin()
    packed = None
    if plan.packed_nbytes:
        packed = (np.zeros(plan.packed_nbytes, dtype=np.uint8) if pool is None
                  else pool.packed(plan.packed_nbytes))
    items: dict[int, Captured] = {}
    events: dict[Event, None] = {}  # in order, once each (a batch's copies share one)
    gather = _DevicePacker(pool, plan.packed_nbytes)
    # a pool's CUDA copies go in one batch: one stream wait and one event a device
    with pool.side.batch() if pool is not None else nullcontext():
        for p in plan.stored():
            where = placements[p.index]
            if isinstance(p, PackedItem):
                if p.nbytes and not (where.capture is Capture.STAGE and gather.add(p)):
                    host = tensor_to_host(p.source)
                    packed[p.offset: p.offset + p.nbytes] = host.reshape(-1).view(np.uint8)
                continue
            assert isinstance(p, ArrayItem)
            items[p.index], event = _CAPTURE[where.capture](p, where, pool)
            if event is not None:
                events[event] = None
        events.update(dict.fromkeys(gather.done()))
    if pool is not None:
        pool.release_unused()  # buffers of tensors that changed shape or left the state
    return Snapshot(items, packed, tuple(events), gather.buffer if gather.ranges else None,
                    tuple(gather.ranges))


Captures = tuple[Captured, Event | None]


def _on_host(p: ArrayItem, where: Placement, pool: StagingPool | None) -> Captures:
    """HOST: into a host buffer, or referenced (a synchronous commit: training waits until the
    copy is made, so a baseline kept as the next reference is the tensor itself)."""
    if pool is None:
        return Captured(p.array, where, tensor_to_host(p.source),
                        next_reference=p.source.detach() if where.keep else None), None
    host, event = pool.stage(p.array, p.source)
    return Captured(p.array, where, host), event


def _rows(p: ArrayItem, where: Placement, pool: StagingPool | None) -> Captures:
    """ROWS: only the rows the increment stores."""
    assert pool is not None and where.rows is not None
    host, event = pool.stage_rows(p.array, p.source, where.rows)
    return Captured(p.array, where, host, rows=where.rows), event


def _on_device(p: ArrayItem, where: Placement, pool: StagingPool | None) -> Captures:
    """ENCODE, STAGE, COMPARE: a copy on the item's device (on the host when it has no room),
    or, in a synchronous commit, the tensor itself with an event marking what training queued
    so far."""
    if pool is not None:
        staged = pool.stage_device(p.array, p.source, where.capture is Capture.STAGE)
        if staged is None:
            return _on_host(p, where, pool)
        t, event = staged
    else:
        t, event = p.source.detach(), None
        if t.device.type == "cuda":
            event = torch.cuda.Event(blocking=True)
            event.record(torch.cuda.current_stream(t.device))
    return Captured(p.array, where, device=t, next_reference=t if where.keep else None), event


_CAPTURE: dict[Capture, Callable[[ArrayItem, Placement, StagingPool | None], Captures]] = {
    Capture.HOST: _on_host, Capture.ROWS: _rows, Capture.ENCODE: _on_device,
    Capture.STAGE: _on_device, Capture.COMPARE: _on_device}


class _DevicePacker:
    """The packed bytes of small CUDA tensors, gathered in one buffer on the first such
    tensor's GPU (asked once a snapshot; those of other GPUs, or all when it has no room, are
    packed on the host)."""

    def __init__(self, pool: StagingPool | None, nbytes: int) -> None:
        self.pool, self.nbytes = pool, nbytes
        self.buffer: torch.Tensor | None = None
        self.no_room = False
        self.ranges: list[tuple[int, int]] = []
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (byte range, tensor)

    def add(self, p: PackedItem) -> bool:
        """Copy ``p``'s bits into the device buffer; False when it must be packed on the host."""
        if self.pool is None or self.no_room or (
                self.buffer is not None and self.buffer.device != p.source.device):
            return False
        if self.buffer is None:
            self.buffer = self.pool.packed_device(self.nbytes, p.source.device)
            self.no_room = self.buffer is None
            if self.buffer is None:
                return False
        self.copies.append((self.buffer[p.offset: p.offset + p.nbytes], p.source))
        self.ranges.append((p.offset, p.nbytes))
        return True

    def done(self) -> list[Event]:
        """Queue the gathering copies, all at once; the event after them (none when nothing
        was gathered)."""
        if self.buffer is None or not self.ranges:
            return []
        assert self.pool is not None
        return [self.pool.stage_bytes(self.copies)]
