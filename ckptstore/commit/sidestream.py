"""The snapshot's side streams: the copies a commit makes of CUDA tensors while training waits,
queued after what training queued so far and before what it queues next -- an order kept on the
GPU, never by waiting on the CPU.

A snapshot's copies go in one :meth:`SideStreams.batch`: the side stream of each device waits
once for the training stream, every copy is queued on it, and at the end one event marks them
all and the training stream waits once for that. Outside a batch each copy pays for its own
stream waits and event, and each small tensor for a copy launch: on an H100 the batch took the
stall of a 576-tensor transformer state from 54-63 ms to 26-43 ms, where its device-to-device
copies take about 2 ms (issue 30; the rest is the Python of the commit call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["SideStreams"]


class SideStreams:
    """One side stream per CUDA device, and the batch of the snapshot a thread is taking."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # .batch: {device index: event} inside batch()

    def stream(self, device: torch.device) -> torch.cuda.Stream:
        """The side stream of ``device`` (``torch.cuda.stream(s)`` sets the current stream of
        ``s``'s own device only: a tensor on another GPU needs a stream there)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                stream = self._streams[index] = torch.cuda.Stream(device=index)
            return stream

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Queue every :meth:`enqueue` of this thread inside as one batch (on the training
        thread; batches do not nest). The side stream waits for the training stream once, at
        the batch's first copy: nothing queued on the training stream after that may be read by
        a later copy of the batch (each copy's own preparations run inside its ``work``, on the
        side stream). The events the copies return are recorded on leaving: none may be waited
        for inside."""
        if getattr(self._local, "batch", None) is not None:
            raise RuntimeError("a batch of side-stream copies is already open on this thread")
        self._local.batch = {}
        try:
            yield
        finally:
            batch, self._local.batch = self._local.batch, None
            for index, event in batch.items():
                stream = self._streams[index]
                event.record(stream)
                torch.cuda.current_stream(index).wait_stream(stream)

    def enqueue(self, t: torch.Tensor | Sequence[torch.Tensor], work: Callable[[], None]
                ) -> torch.cuda.Event:
        """Run ``work()`` (copies that read ``t``, a tensor or tensors of one device) on the
        side stream of that device, after what training queued so far; training's later kernels
        wait for it on the GPU. Returns the event that marks it done (in a batch, the batch's:
        recorded when the batch ends)."""
        read = [t] if isinstance(t, torch.Tensor) else list(t)
        device = read[0].device
        stream = self.stream(device)
        current = torch.cuda.current_stream(device)
        batch = getattr(self._local, "batch", None)
        event = batch.get(stream.device_index) if batch is not None else None
        if event is None:
            stream.wait_stream(current)  # copy what training computed so far
            event = torch.cuda.Event(blocking=True)  # waited for without spinning a core
            if batch is not None:
                batch[stream.device_index] = event
        try:
            with torch.cuda.stream(stream):
                work()
        finally:
            for x in read:  # their memory is not reused before the copies ran
                x.record_stream(stream)
            if batch is None:
                event.record(stream)
                current.wait_stream(stream)  # later kernels wait for the copy (on the GPU)
        return event
