"""The CUDA stream each thread uses for its work on a device (device quantization, device
checkout): a worker's host syncs then wait for its own kernels only, never for another
worker's or for training's stream."""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["worker_stream"]

_STREAMS = threading.local()  # each thread's CUDA stream per device


def worker_stream(device: torch.device) -> Any:
    """The calling thread's CUDA stream on ``device`` (None for a CPU device)."""
    if device.type != "cuda":
        return None
    streams = _STREAMS.__dict__.setdefault("by_device", {})
    if device not in streams:
        streams[device] = torch.cuda.Stream(device=device)
    return streams[device]
