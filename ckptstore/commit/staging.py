"""Reusable host staging buffers for two-phase commits (snapshot now, persist later).

A snapshot copies each tensor's bits into a buffer kept from the previous commit of the same
shape and dtype, so steady-state commits allocate nothing. CUDA tensors are copied into pinned
buffers with non-blocking copies on a side stream; the training stream then waits for those
copies on the GPU (not on the CPU), so the caller returns at once and later kernels cannot modify
a tensor before it was copied. The persist thread waits for the copies' event before reading.

Tensors the writer quantizes on their device (:mod:`ckptstore.device.quant`) are staged on that
device instead, while it has room (a device-to-device copy), so that only their codes ever cross
to the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..device.memory import DEVICE_FREE_FLOOR, allocate_if_room
from ..format.arrays import bit_view_dtype, is_bit_view, storage_dtype, tensor_to_host
from .sidestream import SideStreams

__all__ = ["DEVICE_FREE_FLOOR", "PACKED_KEY", "Buffer", "StagingPool"]

#: :meth:`StagingPool.to_host`'s key of the packed small tensors gathered on a device (no array
#: is named so: array names start with a letter or digit).
PACKED_KEY = "\0packed"

# host numpy buffer, pinned torch buffer for CUDA tensors, or a device buffer (device encoding)
Buffer = np.ndarray | torch.Tensor


def _nbytes(b: Buffer) -> int:
    return b.nbytes if isinstance(b, np.ndarray) else b.numel() * b.element_size()


def _on_device(b: Buffer) -> bool:
    return isinstance(b, torch.Tensor) and b.device.type != "cpu"


class StagingPool:
    """Host buffers keyed by (path, shape, dtype), reused across commits.

    Each snapshot keeps only the buffers it used (:meth:`begin` / :meth:`release_unused`): a
    tensor that changes shape, or leaves the state, does not leave its old buffer behind, so the
    pool holds at most one copy of the latest committed state (plus what :meth:`reserve` added
    for the next one)."""

    def __init__(self, budget: int | None = None) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"staging_budget must be >= 0 bytes, not {budget!r}")
        self.budget = budget  # bytes of buffers a snapshot may hold (None: no bound)
        self._buffers: dict[tuple[object, ...], Buffer] = {}
        self._used: set[tuple[object, ...]] = set()
        self._lock = threading.Lock()
        self.side = SideStreams()           # the snapshot's side stream of each device
        self._d2h = SideStreams()           # the persist thread's device-to-host copy streams

    def begin(self) -> None:
        """A snapshot starts: count the buffers it uses."""
        with self._lock:
            self._used.clear()

    def release_unused(self) -> int:
        """A snapshot ended: drop the buffers it did not use; returns the bytes released."""
        with self._lock:
            stale = [k for k in self._buffers if k not in self._used]
            freed = sum(_nbytes(self._buffers.pop(k)) for k in stale)
        return freed

    @property
    def nbytes(self) -> int:
        """Host bytes held by the pool (pinned buffers included)."""
        return sum(_nbytes(b) for b in self._buffers.values() if not _on_device(b))

    @property
    def device_nbytes(self) -> int:
        """Accelerator bytes held by the pool (device staging, :meth:`stage_device`)."""
        return sum(_nbytes(b) for b in self._buffers.values() if _on_device(b))

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()

    def reserve(self, key: str, t: torch.Tensor) -> int:
        """Allocate (and fault in) the buffer :meth:`stage` will use for ``t``, ahead of the
        first commit; returns the bytes newly allocated (0 if it exists)."""
        t = t.detach()
        dtype = storage_dtype(t.dtype)
        if t.device.type == "cuda":
            k = ("cuda", key, tuple(t.shape), t.dtype)
            make: Callable[[], Buffer] = lambda: torch.empty(  # noqa: E731
                t.shape, dtype=t.dtype, pin_memory=True)  # pinning faults every page in
        else:
            k = ("cpu", key, tuple(t.shape), dtype.str)

            def make() -> Buffer:
                buf = np.empty(t.shape, dtype)
                buf.reshape(-1).view(np.uint8)[::4096] = 0  # one write per page: faulted in
                return buf
        with self._lock:
            if k in self._buffers:
                return 0
        buf = make()  # outside the lock: a commit meanwhile makes its own and keeps it
        with self._lock:
            if k in self._buffers:
                return 0
            self._buffers[k] = buf
        return t.numel() * t.element_size()

    def stage(self, key: str, t: torch.Tensor) -> tuple[np.ndarray, torch.cuda.Event | None]:
        """Copy ``t``'s bits into its staging buffer; return ``(host array, event or None)``.

        The host array must not be read before ``event.synchronize()`` when an event is given.
        """
        t = t.detach()
        if t.device.type == "cuda":
            return self._stage_cuda(key, t)
        if t.device.type == "cpu" and t.layout == torch.strided and not (t.is_conj() or t.is_neg()):
            # torch's copy_ runs on its intra-op threads and reads any strides: one pass into
            # the C-ordered buffer (np.copyto is one thread, and strided sources needed a copy)
            shape, dtype = tuple(t.shape), storage_dtype(t.dtype)
            buf = self._buffer(("cpu", key, shape, dtype.str), lambda: np.empty(shape, dtype))
            dst = torch.from_numpy(buf)
            (dst.view(t.dtype) if is_bit_view(t.dtype) else dst).copy_(t)
            return buf, None
        src = tensor_to_host(t)
        buf = self._buffer(("cpu", key, src.shape, src.dtype.str),
                           lambda: np.empty(src.shape, src.dtype))
        np.copyto(buf, src)
        return buf, None

    def stage_device(self, key: str, t: torch.Tensor, to_host: bool = False
                     ) -> tuple[torch.Tensor, torch.cuda.Event | None] | None:
        """Copy ``t`` into a buffer on its own device, to be quantized there
        (:mod:`ckptstore.device.quant`) or, with ``to_host``, moved to the host later by
        :meth:`to_host` (whose host buffer is then this snapshot's too); None when the device
        lacks room: the copy would leave less than :data:`DEVICE_FREE_FLOOR` of its memory
        free. A device-to-device copy on the side stream (~TB/s on a GPU); CPU tensors
        (``device_encode="always"``) get a torch buffer."""
        t = t.detach()
        if to_host:
            with self._lock:
                self._used.add(self._host_key(key, t))
        buf = self._device_buffer(key, t)
        if buf is None:
            return None
        k = ("device", key, tuple(t.shape), t.dtype, t.device)
        with self._lock:
            self._used.add(k)
            buf = self._buffers.setdefault(k, buf)
        if t.device.type != "cuda":
            buf.copy_(t)
            return buf, None
        return buf, self.side.enqueue(t, lambda: buf.copy_(t, non_blocking=True))

    def reserve_device(self, key: str, t: torch.Tensor) -> int:
        """Allocate ahead of the first commit the device buffer :meth:`stage_device` copies
        ``t`` into, if the device has room; returns the bytes newly allocated."""
        k = ("device", key, tuple(t.shape), t.dtype, t.device)
        with self._lock:
            if k in self._buffers:
                return 0
        buf = self._device_buffer(key, t)
        if buf is None:
            return 0
        with self._lock:
            if k in self._buffers:
                return 0
            self._buffers[k] = buf
        return t.numel() * t.element_size()

    def _device_buffer(self, key: str, t: torch.Tensor) -> torch.Tensor | None:
        """The existing device buffer for ``t``, else a new one if the device keeps
        :data:`DEVICE_FREE_FLOOR` of its memory free with it (not yet in the pool); None: no
        room."""
        k = ("device", key, tuple(t.shape), t.dtype, t.device)
        with self._lock:
            have = self._buffers.get(k)
        if have is not None:
            return have
        # (an out-of-memory error too: free memory is the driver's) no room: staged on the host
        return allocate_if_room(t.device, t.numel() * t.element_size(),
                                lambda: torch.empty(t.shape, dtype=t.dtype, device=t.device))

    def stage_rows(self, key: str, t: torch.Tensor, rows: np.ndarray
                   ) -> tuple[np.ndarray, torch.cuda.Event | None]:
        """Copy rows ``rows`` of ``t`` (a tracker's changed rows of a table) into a host buffer
        kept for the table, grown as needed and reused; return ``(those rows, event or
        None)`` like :meth:`stage`. A table whose 5 % rows changed stages 5 % of its bytes."""
        t = t.detach()
        n, row_shape = int(rows.size), tuple(t.shape[1:])
        cuda = t.device.type == "cuda"
        k = ("rows", key, row_shape, t.dtype, cuda)
        dtype = storage_dtype(t.dtype)
        with self._lock:
            self._used.add(k)
            buf = self._buffers.get(k)
        if buf is None or buf.shape[0] < n:  # grown by a quarter at least: few regrowths
            cap = max(n, int(1.25 * buf.shape[0]) if buf is not None else n)
            if cuda:
                buf = torch.empty((cap, *row_shape), dtype=t.dtype, pin_memory=True)
            else:
                buf = torch.from_numpy(np.empty((cap, *row_shape), dtype))
                buf = buf.view(t.dtype) if is_bit_view(t.dtype) else buf
            with self._lock:
                self._buffers[k] = buf
        dst = buf[:n]
        index = torch.from_numpy(rows.astype(np.int64, copy=False))
        event = None
        if cuda:
            # pinned: its upload does not wait on the CPU (torch keeps the block until it ran)
            pinned = index.pin_memory()

            def gather() -> None:  # on the side stream, the index's upload too
                on_device = pinned.to(t.device, non_blocking=True)
                dst.copy_(t.index_select(0, on_device), non_blocking=True)

            event = self.side.enqueue(t, gather)
        else:
            torch.index_select(t, 0, index, out=dst)
        return _host_bits(dst), event

    def packed_device(self, nbytes: int, device: torch.device) -> torch.Tensor | None:
        """A zeroed byte buffer on ``device`` for the packed small tensors that live there
        (:meth:`stage_bytes`), zeroed on the side stream; None when the device lacks room."""
        k = ("packed-device", nbytes, device)
        with self._lock:
            have = k in self._buffers
            self._used.add(("cuda", PACKED_KEY, (nbytes,), torch.uint8))  # to_host's buffer
        if not have:
            new = allocate_if_room(device, nbytes,
                                   lambda: torch.empty(nbytes, dtype=torch.uint8, device=device))
            if new is None:
                return None
            buf = self._buffer(k, lambda: new)
        else:
            buf = self._buffer(k, lambda: torch.empty(nbytes, dtype=torch.uint8, device=device))
        self.side.enqueue(buf, buf.zero_)
        return buf

    def stage_bytes(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor]]
                    ) -> torch.cuda.Event:
        """Copy the bits of CUDA tensors (C order) into byte ranges of a :meth:`packed_device`
        buffer, ``(range, tensor)`` pairs of one device (at least one), in one multi-tensor copy
        on the side stream (a launch for all: a transformer has hundreds of biases and norms);
        training's stream waits for it on the GPU. Returns the copies' event."""
        sources = [t.detach() for _, t in copies]
        dsts = [dst for dst, _ in copies]

        def gather() -> None:  # on the side stream, the views' own copies (if any) too
            flat = [t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
                    for t in sources]
            copy_all = getattr(torch, "_foreach_copy_", None)  # a private name: kept optional
            if copy_all is not None:
                copy_all(dsts, flat)
            else:
                for dst, src in zip(dsts, flat):
                    dst.copy_(src)

        return self.side.enqueue(sources, gather)

    def to_host(self, key: str, t: torch.Tensor) -> np.ndarray:
        """On the persist thread: the bits of ``t`` (a device staging buffer) copied into a
        reused host buffer (pinned for CUDA) on a stream of its own that training's stream never
        waits for; returns once the copy has landed."""
        return self.to_host_many([(key, t)])[0]

    def to_host_many(self, staged: Sequence[tuple[str, torch.Tensor]]) -> list[np.ndarray]:
        """:meth:`to_host` of each ``(key, tensor)``, the copies of a device queued together
        and waited for once (one event a device, not one a tensor: each wait hands the GIL
        back and forth with training's thread)."""
        out: list[np.ndarray | None] = [None] * len(staged)
        by_stream: dict[Any, list[int]] = {}
        for i, (key, t) in enumerate(staged):
            if t.device.type != "cuda":
                buf = self._buffer(self._host_key(key, t),
                                   lambda t=t: np.empty(t.shape, storage_dtype(t.dtype)))
                dst = torch.from_numpy(buf)
                (dst.view(t.dtype) if is_bit_view(t.dtype) else dst).copy_(t)
                out[i] = buf
            else:
                by_stream.setdefault(self._d2h.stream(t.device), []).append(i)
        landed = []
        for stream, members in by_stream.items():
            with torch.cuda.stream(stream):  # the current stream of its device, not device 0's
                for i in members:
                    key, t = staged[i]
                    pinned = self._buffer(self._host_key(key, t), lambda t=t: torch.empty(
                        t.shape, dtype=t.dtype, pin_memory=True))
                    pinned.copy_(t, non_blocking=True)
                    out[i] = _host_bits(pinned)
                event = torch.cuda.Event(blocking=True)  # waited for without spinning a core
                event.record(stream)
            landed.append(event)
        for event in landed:
            event.synchronize()
        return out  # type: ignore[return-value]

    @staticmethod
    def _host_key(key: str, t: torch.Tensor) -> tuple[object, ...]:
        """The key of the host buffer of ``t``: pinned for CUDA tensors, as :meth:`stage`."""
        if t.device.type == "cuda":
            return ("cuda", key, tuple(t.shape), t.dtype)
        return ("cpu", key, tuple(t.shape), storage_dtype(t.dtype).str)

    def reserve_packed(self, nbytes: int) -> int:
        """Allocate the packed buffer of :meth:`packed` ahead of time (pages faulted in)."""
        def make() -> np.ndarray:
            buf = np.empty(nbytes, np.uint8)
            buf[::4096] = 0
            return buf
        with self._lock:
            if ("packed", nbytes) in self._buffers:
                return 0
            self._buffers[("packed", nbytes)] = make()
        return nbytes

    def packed(self, nbytes: int) -> np.ndarray:
        """The zeroed byte buffer of a commit's packed small tensors (reused)."""
        buf = self._buffer(("packed", nbytes), lambda: np.zeros(nbytes, np.uint8))
        buf[...] = 0  # alignment padding between tensors stays zero
        return buf

    def _buffer(self, k: tuple[object, ...], make: Callable[[], Buffer]) -> Buffer:
        with self._lock:
            self._used.add(k)
            buf = self._buffers.get(k)
            if buf is None:
                buf = self._buffers[k] = make()
            return buf

    def _stage_cuda(self, key: str, t: torch.Tensor) -> tuple[np.ndarray, torch.cuda.Event]:
        storage_dtype(t.dtype)
        pinned = self._buffer(("cuda", key, tuple(t.shape), t.dtype),
                              lambda: torch.empty(t.shape, dtype=t.dtype, pin_memory=True))
        event = self.side.enqueue(t, lambda: pinned.copy_(t, non_blocking=True))
        return _host_bits(pinned), event


def _host_bits(t: torch.Tensor) -> np.ndarray:
    """A host tensor's bits as numpy (bfloat16 and the like as their unsigned integers)."""
    return (t.view(bit_view_dtype(t.dtype)) if is_bit_view(t.dtype) else t).numpy()
