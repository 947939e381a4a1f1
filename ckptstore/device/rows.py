"""Changed rows of an increment found on the tensor's device (issue 11): the reference (the
baseline, or the previous commit) is kept on the device, the snapshot's copy is compared with it
there, and only the changed rows -- XOR-ed with their old bits when the chain is exact and
lossless -- cross to the host. The host path (:func:`ckptstore.chains.replay.changed_rows`)
gives the same rows and bytes; CPU tensors take this path under ``device_encode="always"``.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from ..format.arrays import storage_dtype
from .memory import has_room
from .streams import worker_stream

__all__ = ["changed_rows_on_device", "compared_on_device", "device_reference"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: elements compared at once: the temporary device memory (a mask, the changed rows of a block)
_STEP = 1 << 22


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its element size (NaNs compare by bits)."""
    return t.view(_BITS[t.element_size()]) if t.dtype != _BITS[t.element_size()] else t


def changed_rows_on_device(current: torch.Tensor, reference: torch.Tensor, xor: bool
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, values)`` on the host: the indices (int64) of the rows of ``current`` whose
    bits differ from ``reference``'s, and those rows' values (their bits XOR the reference's
    with ``xor``), as the host path stores them. Both on one device and complete there; runs on
    the calling thread's own stream, block of rows by block (the device memory it takes is a
    block's, whatever share of the rows changed)."""
    if current.shape != reference.shape or current.dtype != reference.dtype:
        raise ValueError("shape or dtype changed: a chain needs a full commit")
    if current.device != reference.device or current.element_size() not in _BITS:
        raise ValueError("an increment compared on its device needs its reference there")
    stream = worker_stream(current.device)
    rows: list[np.ndarray] = []
    values: list[np.ndarray] = []
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        a, b = _bits(current), _bits(reference)
        n = a.shape[0]
        width = a[0].numel() if n else 0
        step = max(1, _STEP // max(1, width))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            changed = (a[lo:hi] != b[lo:hi]).reshape(hi - lo, width).any(dim=1)
            idx = changed.nonzero().reshape(-1)
            block = a[lo:hi].index_select(0, idx)
            if xor:
                block.bitwise_xor_(b[lo:hi].index_select(0, idx))
            rows.append(idx.cpu().numpy() + lo)
            values.append(block.cpu().numpy())
    dtype = storage_dtype(current.dtype)
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, *current.shape[1:]), dtype)
    return (np.concatenate(rows).astype(np.int64, copy=False),
            np.concatenate(values).view(dtype))


def compared_on_device(t: torch.Tensor) -> bool:
    """Whether an increment of ``t`` can be compared on its device (items of at most 8 bytes:
    complex128 tables are compared on the host)."""
    return t.element_size() in _BITS


def device_reference(t: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor | None:
    """A copy of ``t`` (complete on its device) to compare the next commit with, complete on
    return: into ``into`` (the old reference, done with) when it fits, else a new tensor; None
    when the device lacks room for one (it would leave less than
    :data:`~ckptstore.device.memory.DEVICE_FREE_FLOOR` of its memory free)."""
    t = t.detach()
    fits = into is not None and (into.shape, into.dtype, into.device) == (t.shape, t.dtype,
                                                                          t.device)
    stream = worker_stream(t.device)
    if stream is None:
        return into.copy_(t) if fits else t.clone()
    if not fits and not has_room(t.device, t.numel() * t.element_size()):
        return None
    try:
        with torch.cuda.stream(stream):
            copy = into.copy_(t) if fits else t.clone()
    except torch.cuda.OutOfMemoryError:
        return None
    stream.synchronize()
    return copy
