"""Checkout straight to the device: quantized chunks are dequantized where the tensor goes.

``checkout(..., map_location="cuda")`` of a quantized array reads each chunk, undoes its entropy
coding and bit packing on the host (:meth:`QuantizedLossy.decode_codes`), and uploads only the
codes -- one byte a value, against 2-4 for the floats, so a 4-bit commit moves 4x fewer bytes over
PCIe than its fp32 values -- and the per-segment parameters; the values are computed on the
device with torch ops, the very values the host path computes (issue 11):

* uniform methods: ``zero + scale * code`` in float64, clamped to the dtype's finite range, then
  rounded to the dtype (two separately rounded float64 operations, as the host kernel does);
* k-means: the segment's codebook level;
* pruned codes: 0; protected values: the host path's own conversion of the stored bfloat16
  values, written into place in the output dtype (NaN payloads and all).

The same code runs on CPU tensors in the tests (CI has no GPU).
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..format.arrays import read_chunk, torch_dtype
from ..chains.replay import ChunkCodesOf
from ..chunkcodec import QuantizedLossy
from .bits import PackedCodes, unpack_on_device
from .streams import worker_stream
from ..errors import CorruptedChunkError
from ..format.grid import ChunkGrid
from ..format.layout import chunk_key
from ..storage import Storage

if TYPE_CHECKING:
    from ckptcodecs import QuantParams

__all__ = ["dequantize_on_device", "start_read_to_device", "stored_codes", "wants_device_decode"]

_WORK = {"float64": torch.float64}
_BF16_MAX = float(torch.finfo(torch.bfloat16).max)
_FINITE_LIMIT = {"float16": float(np.finfo(np.float16).max)}


def wants_device_decode(map_location: torch.device | str | None) -> bool:
    """True when checkout dequantizes on ``map_location`` (an accelerator) rather than on the
    host."""
    return map_location is not None and torch.device(map_location).type != "cpu"


def dequantize_on_device(codes: np.ndarray | PackedCodes, p: QuantParams,
                         device: torch.device | str,
                         checks: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The values of a chunk's ``codes`` (flat uint8, or still packed: unpacked on the device)
    as a flat tensor of the chunk's dtype on ``device``, bit for bit those of
    :func:`ckptcodecs.dequantize`; ValueError for codes the parameters do not allow. With
    ``checks``, the level check is appended there as a device flag (true: a code is out of
    range) for the caller to read once its stream is done, instead of a sync here."""
    from ckptcodecs.floats import from_bf16_bits, from_float

    work = _WORK.get(p.dtype, torch.float32)
    if isinstance(codes, PackedCodes):
        if (codes.bits, codes.count) != (p.bits, p.count):
            raise ValueError(f"{codes.count} codes of {codes.bits} bits for parameters of "
                             f"{p.count} of {p.bits}")
        data = _upload(codes.data, device)
        c = data[: p.count].long() if p.bits == 8 else unpack_on_device(data, p.bits, p.count)
    else:
        c = _upload(np.asarray(codes, dtype=np.uint8), device).long()
    if c.numel() != p.count:
        raise ValueError(f"got {c.numel()} codes for parameters of {p.count} values")
    if p.count:
        bad = c.max() >= p.levels  # on the device: no sync unless the caller has no list
        if checks is not None:
            checks.append(bad)
        elif bool(bad):
            raise ValueError(LEVEL_RANGE)
    length = min(max(p.seg_len, 1), max(p.count, 1))  # one segment when it spans the chunk
    nseg = -(-p.count // length)
    level = c < p.nq  # int64: nq may be 256
    ci = torch.where(level, c, 0)
    if p.method == "kmeans":
        book = torch.from_numpy(np.ascontiguousarray(p.codebook)).to(device)
        if book.numel() and (book.dim() != 2 or book.shape[0] < nseg or book.shape[1] < p.nq):
            raise ValueError(f"a codebook of shape {list(book.shape)} for {nseg} segments of "
                             f"{p.nq} levels")
        seg = torch.arange(p.count, device=device) // length
        vals = book[seg, ci].to(work) if book.numel() else torch.zeros(p.count, dtype=work,
                                                                        device=device)
    else:
        lim = _FINITE_LIMIT.get(p.dtype, float(torch.finfo(work).max))
        z, s = (np.asarray(v, np.float64).reshape(-1) for v in (p.zero, p.scale))
        if min(z.size, s.size) < nseg:
            raise ValueError(f"{min(z.size, s.size)} segment parameters for {nseg} segments")
        # each segment's values at once (zero + scale * code, the host's two float64 steps)
        z = torch.from_numpy(z[:nseg]).to(device)[:, None]
        s = torch.from_numpy(s[:nseg]).to(device)[:, None]
        grid = torch.nn.functional.pad(ci, (0, nseg * length - p.count)).view(nseg, length)
        vals = (z + s * grid.double()).clamp_(-lim, lim).reshape(-1)[: p.count].to(work)
    vals = torch.where(level, vals, torch.zeros((), dtype=work, device=device))
    out = _cast(vals, p.dtype)
    if p.protected.size:
        prot = from_float(from_bf16_bits(p.protected).astype(
            np.float64 if p.dtype == "float64" else np.float32), p.dtype)
        where = (torch.from_numpy(np.asarray(p.protect_positions, np.int64)).to(device)
                 if p.sparse else torch.nonzero(c == p.protect_code).reshape(-1))
        if where.numel() != prot.size:
            raise ValueError(f"{prot.size} protected values for {where.numel()} positions")
        dtype = torch_dtype(p.dtype)
        out[where] = torch.from_numpy(prot).view(dtype).to(device) if p.dtype == "bfloat16" \
            else torch.from_numpy(prot).to(device)
    return out


#: the error of codes at or above the parameters' level count
LEVEL_RANGE = "a code is outside the level range"


def _upload(data: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """Host uint8 bytes as a tensor on ``device`` (from pageable memory, so the copy waits for
    the current stream on the CPU; a CPU device shares the array)."""
    return torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8)).to(device)


def _cast(vals: torch.Tensor, name: str) -> torch.Tensor:
    """float32/64 values to the dtype ``name`` as the host rounds them; bfloat16 saturates
    finite values beyond its range at its largest value, as ``to_bf16_bits`` does."""
    if name == "bfloat16":
        finite = vals.clamp(-_BF16_MAX, _BF16_MAX)
        return torch.where(torch.isinf(vals), vals, finite).to(torch.bfloat16)
    return vals.to(torch_dtype(name))


def start_read_to_device(grid: ChunkGrid, dtype: str, codes_of: ChunkCodesOf,
                         executor: Executor, device: torch.device | str
                         ) -> tuple[torch.Tensor, list[Future]]:
    """Queue the reads of a quantized array into a new tensor of dtype ``dtype`` on ``device``:
    each worker gets a chunk's codes on the host (``codes_of(chunk key)``: a stored chunk
    decoded, or a chain of code deltas replayed) and dequantizes them on the device (on a stream
    of its own for CUDA). The tensor is complete once every future is."""
    out = torch.empty(grid.shape, dtype=torch_dtype(dtype), device=device)
    # ``out``'s memory may come from blocks the caller's stream's queued kernels still use
    caller = torch.cuda.current_stream(out.device) if out.is_cuda else None
    size = int(np.prod(grid.chunks, dtype=np.int64)) if grid.shape else 1

    def get_chunk(key: str, lo: int, hi: int) -> None:
        codes, params, where = codes_of(key)
        if params.dtype != dtype:
            raise CorruptedChunkError(
                f"chunk {where} holds {params.dtype} values, its tensor is {dtype}", where)
        if params.count != size:
            raise CorruptedChunkError(
                f"chunk {where} holds {params.count} values, expected {size}", where)
        stream = worker_stream(out.device)  # the worker's own: it waits for its chunks only
        if stream is not None:
            stream.wait_stream(caller)
        checks: list[torch.Tensor] = []
        with _on(stream):
            try:
                vals = dequantize_on_device(codes, params, device, checks)
            except ValueError as e:
                raise CorruptedChunkError(f"chunk {where} does not decode: {e}", where) from e
            if grid.shape:
                out[lo:hi] = vals.view(grid.chunks)[: hi - lo]
            else:
                out.copy_(vals.reshape(()))
            bad = _flag_to_host(checks, stream)
            if stream is not None:  # waited for without spinning a core
                done = torch.cuda.Event(blocking=True)
                done.record(stream)
                done.synchronize()
        if bad is not None and bool(bad):  # read once the stream is done: no extra sync
            raise CorruptedChunkError(f"chunk {where} does not decode: {LEVEL_RANGE}", where)

    futures = [executor.submit(get_chunk, key, lo, hi) for _, key, lo, hi in grid] \
        if out.numel() else []
    return out, futures


def stored_codes(storage: Storage, prefix: str, codec: QuantizedLossy) -> ChunkCodesOf:
    """``codes_of`` of :func:`start_read_to_device` for a quantized array stored whole: the
    codes stay packed (half a byte a value crosses at 4 bits), checked on the device."""

    def codes_of(key: str) -> tuple[PackedCodes, QuantParams, str]:
        where = chunk_key(prefix, key)
        packed, params = codec.decode_packed(read_chunk(storage, where), where)
        return PackedCodes(packed, params.count, params.bits), params, where

    return codes_of


def _flag_to_host(flags: list[torch.Tensor], stream: torch.cuda.Stream | None
                  ) -> torch.Tensor | None:
    """Whether any of ``flags`` (device bools) is set, as a host tensor that holds the answer
    once ``stream`` is done: copied on that stream into pinned memory, so reading it then takes
    no sync of its own (on the CPU, the flag itself)."""
    if not flags:
        return None
    any_set = torch.stack(flags).any() if len(flags) > 1 else flags[0]
    if stream is None:
        return any_set
    host = torch.empty((), dtype=torch.bool, pin_memory=True)
    host.copy_(any_set, non_blocking=True)
    return host


def _on(stream: torch.cuda.Stream | None) -> AbstractContextManager:
    return torch.cuda.stream(stream) if stream is not None else nullcontext()
