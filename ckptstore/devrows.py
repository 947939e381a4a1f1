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

from .arrays import storage_dtype
from .devstream import worker_stream
from .staging import DEVICE_FREE_FLOOR

__all__ = ["changed_rows_on_device", "device_reference"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: elements compared at once (bounds the temporary mask on the device)
_STEP = 1 << 24


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its element size (NaNs compare by bits)."""
    return t.view(_BITS[t.element_size()]) if t.dtype != _BITS[t.element_size()] else t


def changed_rows_on_device(current: torch.Tensor, reference: torch.Tensor, xor: bool
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, values)`` on the host: the indices (int64) of the rows of ``current`` whose
    bits differ from ``reference``'s, and those rows' values (their bits XOR the reference's
    with ``xor``), as the host path stores them. Runs on the calling thread's own stream."""
    if current.shape != reference.shape or current.dtype != reference.dtype:
        raise ValueError("shape or dtype changed: a chain needs a full commit")
    if reference.device != current.device:  # the tensor moved to another device
        reference = reference.to(current.device)
    stream = worker_stream(current.device)  # both complete: the snapshot's copies were waited for
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        a, b = _bits(current), _bits(reference)
        n = a.shape[0]
        changed = torch.empty(n, dtype=torch.bool, device=a.device)
        step = max(1, _STEP // max(1, a[0].numel())) if n else 1
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            changed[lo:hi] = (a[lo:hi] != b[lo:hi]).reshape(hi - lo, -1).any(dim=1)
        rows = changed.nonzero().reshape(-1)
        values = a.index_select(0, rows)
        if xor:
            values.bitwise_xor_(b.index_select(0, rows))
        host_rows, host_values = rows.cpu().numpy(), values.cpu().numpy()
    return host_rows.astype(np.int64, copy=False), host_values.view(storage_dtype(current.dtype))


def device_reference(t: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor | None:
    """A copy of ``t`` (complete on its device) to compare the next commit with, complete on
    return: into ``into`` (the old reference, done with) when it fits, else a new tensor; None
    when the device lacks room for one (it would leave less than
    :data:`~ckptstore.staging.DEVICE_FREE_FLOOR` of its memory free)."""
    t = t.detach()
    fits = into is not None and (into.shape, into.dtype, into.device) == (t.shape, t.dtype,
                                                                          t.device)
    stream = worker_stream(t.device)
    if stream is None:
        return into.copy_(t) if fits else t.clone()
    if not fits:
        free, total = torch.cuda.mem_get_info(t.device)
        if free - t.numel() * t.element_size() < DEVICE_FREE_FLOOR * total:
            return None
    try:
        with torch.cuda.stream(stream):
            copy = into.copy_(t) if fits else t.clone()
    except torch.cuda.OutOfMemoryError:
        return None
    stream.synchronize()
    return copy
