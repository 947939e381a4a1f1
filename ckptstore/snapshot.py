"""Snapshot: the step of a commit that must happen while training waits -- the bits of every
stored tensor captured in host buffers (or, for tensors quantized on their device, in device
buffers) that training may overwrite as soon as it returns. :func:`ckptstore.writer.persist`
then encodes and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .arrays import tensor_to_host
from .plan import ArrayItem, CommitPlan, PackedItem
from .staging import StagingPool

__all__ = ["Snapshot", "snapshot"]


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
    # per item, a copy on its own device (or the tensor itself in a synchronous commit), to be
    # quantized there (:mod:`ckptstore.devquant`); such items are not in ``arrays``
    device: dict[int, torch.Tensor] = field(default_factory=dict)

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


def snapshot(plan: CommitPlan, pool: StagingPool | None = None,
             on_device: frozenset[int] = frozenset()) -> Snapshot:
    """Capture the bits of every stored tensor on the host.

    Without ``pool`` CPU tensors that are already contiguous are referenced, not copied (the
    synchronous commit path, where training waits anyway). With a
    :class:`~ckptstore.staging.StagingPool` every tensor is copied into a reusable buffer (pinned,
    asynchronously for CUDA tensors) so training may modify it as soon as this returns.
    The items of ``on_device`` (:func:`ckptstore.devquant.device_items`) stay on their device
    instead -- referenced without a pool, copied into a device buffer with one while the
    device has room -- to be quantized there by :func:`persist`.
    """
    arrays: dict[int, np.ndarray] = {}
    device: dict[int, torch.Tensor] = {}
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
        if p.index in on_device:
            staged = _stage_on_device(p, pool)
            if staged is not None:
                device[p.index], event = staged
                if event is not None:
                    events.append(event)
                continue
        if pool is None:
            arrays[p.index] = tensor_to_host(p.source)
            continue
        arrays[p.index], event = pool.stage(p.array, p.source)
        if event is not None:
            events.append(event)
    if pool is not None:
        pool.release_unused()  # buffers of tensors that changed shape or left the state
    return Snapshot(arrays, packed, events, device=device)


def _stage_on_device(p: ArrayItem, pool: StagingPool | None
                     ) -> tuple[torch.Tensor, torch.cuda.Event | None] | None:
    """A copy of the item's tensor on its device (None: no room there), or, in a synchronous
    commit, the tensor itself with an event marking what training queued so far."""
    if pool is not None:
        return pool.stage_device(p.array, p.source)
    t = p.source.detach()
    if t.device.type != "cuda":
        return t, None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(t.device))
    return t, event
