"""Room on a device: whether a new buffer there leaves enough of its memory free for training.

The one rule every device buffer of the store follows (snapshot staging, the chain references
kept on a device): allocate only while :data:`DEVICE_FREE_FLOOR` of the device's memory stays
free, and treat an allocator's out-of-memory error as "no room" (the driver's free memory is
not the caching allocator's).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["DEVICE_FREE_FLOOR", "allocate_if_room", "has_room"]

#: Device buffers leave at least this share of the device's memory free; past it, the host
#: takes the work (staging in pinned host memory, references kept on the host).
DEVICE_FREE_FLOOR = 0.10


def has_room(device: torch.device, nbytes: int) -> bool:
    """Whether ``nbytes`` more on ``device`` leave :data:`DEVICE_FREE_FLOOR` of it free (always
    true off CUDA: CPU tensors take the device path only in tests and ``"always"``)."""
    if device.type != "cuda":
        return True
    free, total = torch.cuda.mem_get_info(device)
    return free - nbytes >= DEVICE_FREE_FLOOR * total


def allocate_if_room(device: torch.device, nbytes: int,
                     make: Callable[[], torch.Tensor]) -> torch.Tensor | None:
    """``make()`` when :func:`has_room` for ``nbytes`` on ``device``; None when there is no
    room or the allocation runs out of device memory."""
    if not has_room(device, nbytes):
        return None
    try:
        return make()
    except torch.cuda.OutOfMemoryError:
        return None
