"""Quantization with torch ops, on the tensor's own device: the codes and parameters
:func:`ckptcodecs.quantize` computes, bit for bit, for the encodings it reproduces exactly.

This is the device half of issue 11's GPU writer: a CUDA tensor is quantized where it lives, and
only its codes (1 byte a value, against 2-4) and per-segment parameters cross to the host, where
they are packed, entropy coded and written as the host path writes them -- the same chunks, so a
commit made from a GPU and one made from the CPU are interchangeable. The same functions run on
CPU tensors (the tests compare them with the host path there; CI has no GPU).

Exactness. Every step is an IEEE operation in the dtype the host path uses: segment minima and
maxima (exact), parameters from float64 rounded to float32, ``(x - zero) * inv + 0.5`` as three
separately rounded float32 operations (torch launches them as separate kernels, so nothing fuses
them into an FMA), clamped and truncated to uint8. A chunk holding a non-finite value takes the
host path (NaN and +-inf are protected values there, a variable-length list).

Check-N-Run's adaptive search (``adaptive-asymmetric``) is split where it is exact: the device
counts each segment's histogram (integers), the host runs its own compiled search on those
counts (:func:`ckptcodecs.adaptive.histogram_ranges_from_counts`, microseconds a row) and sends
the ranges back. Segments short enough for the host's value-by-value search (up to about twice the
number of levels: rows of <= 46 values at 4 bits, <= 524 at 8) stay on the host path.

DynaQuant's k-means likewise: the device makes each segment's buckets (the count and the float64
sum of the values sharing sign, exponent and 7 mantissa bits; such a sum is exact, so the order of
the device's atomic adds does not matter), the host fits the levels with its own compiled fit
(:func:`ckptcodecs.kmeans.fit_from_buckets`), and the device finds each value's nearest level --
for segments of at least :data:`KMEANS_MIN_SEGMENT` values, where the buckets are far fewer
bytes than the values.

``protect`` and ``prune`` select the largest and smallest magnitudes with a stable sort, ties to
the lowest indices as the host's selection breaks them; the selected values are left out of every
range, histogram and fit, and protected values are rounded to bfloat16 on the host.

Reproduced: ``uniform-asymmetric``, ``uniform-symmetric``, ``adaptive-asymmetric`` (histogram
search) and ``kmeans`` (long segments; not float64), any granularity, float32, float64, float16
and bfloat16 data, ``protect``/``prune`` in both protect modes, float32 or float16 parameters
(no sensitivity ``score``: it lives on the host). :func:`device_quantizable` says whether a codec's
configuration is one of those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from ..format.arrays import tensor_to_host
from .bits import PackedCodes, pack_on_device
from .streams import worker_stream
from ..chunkcodec import QuantizedLossy
from ..format.grid import ChunkGrid

__all__ = ["device_chunk_codes", "device_quantizable", "quantize_on_device"]

_METHODS = ("uniform-asymmetric", "uniform-symmetric", "adaptive-asymmetric", "kmeans")
_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
           torch.bfloat16: "bfloat16"}


def device_quantizable(quantize: Mapping[str, Any],
                       chunk_shape: tuple[int, ...] | None = None) -> bool:
    """True when :func:`quantize_on_device` reproduces ``ckptcodecs.quantize(**quantize)`` (on
    chunks of ``chunk_shape``: the adaptive search runs on the device only where the host
    searches a histogram, not the values themselves)."""
    if quantize.get("method") not in _METHODS:
        return False
    return chunk_shape is None or not _left_to_host(quantize, chunk_shape)


#: k-means runs on the device for segments of at least this many values: a segment's buckets
#: (at most 65,536 of 24 bytes) then cross PCIe instead of its values (a tensor-wide segment of
#: a chunk of 1 M fp32 values: ~0.2 MB of buckets against 4 MB).
KMEANS_MIN_SEGMENT = 1 << 16


def _left_to_host(quantize: Mapping[str, Any], chunk_shape: tuple[int, ...]) -> bool:
    """True for segments the host quantizes better: adaptive ones it searches value by value,
    k-means ones too short for their buckets to be smaller than their values."""
    from ckptcodecs.kernels import segment_length, use_direct

    method = quantize["method"]
    if method not in ("adaptive-asymmetric", "kmeans"):
        return False
    seg = segment_length(chunk_shape, quantize.get("granularity", "row"),
                         quantize.get("group_size"))
    if method == "kmeans":
        return seg < KMEANS_MIN_SEGMENT
    return use_direct(seg, 1 << int(quantize["bits"]))


def _segments(x: torch.Tensor, seg: int, fill: float | bool = 0) -> torch.Tensor:
    """``x`` (flat) as ``(nseg, seg)``, a short last segment padded with ``fill``."""
    n = x.numel()
    nseg = -(-n // seg)
    short = nseg * seg - n
    if short:
        x = torch.cat([x, torch.full((short,), fill, dtype=x.dtype, device=x.device)])
    return x.view(nseg, seg)


def _select(mag: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """Indices of the ``k`` largest (smallest) of ``mag``, ties to the lowest indices -- the
    host's :func:`ckptcodecs._select.select_magnitudes`."""
    order = torch.sort(-mag if largest else mag, stable=True).indices
    return order[:k]


def _partition(x: torch.Tensor, protect: float, prune: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted indices of the protected (largest magnitudes) and pruned (smallest of the rest)
    values of a chunk of finite values, as the host path chooses them."""
    n = x.numel()
    none = torch.zeros(0, dtype=torch.int64, device=x.device)
    mag = x.abs()
    n_prot = min(math.ceil(protect * n), n) if protect > 0 else 0
    prot = _select(mag, n_prot, largest=True) if n_prot else none
    n_prune = min(math.ceil(prune * n), n - prot.numel()) if prune > 0 else 0
    pruned = none
    if n_prune:
        mag = mag.clone()
        mag[prot] = float("inf")  # protected values are not pruned
        pruned = _select(mag, n_prune, largest=False)
    return torch.sort(prot).values, torch.sort(pruned).values


def quantize_on_device(chunk: torch.Tensor, quantize: Mapping[str, Any]
                       ) -> tuple[torch.Tensor, Any] | None:
    """``(codes, params)`` of one chunk as :func:`ckptcodecs.quantize` computes them, the codes
    a flat uint8 tensor on the chunk's device and the :class:`ckptcodecs.QuantParams` on the
    host; None when the chunk is left to the host (a non-finite value, a configuration
    :func:`device_quantizable` refuses, or one the host refuses with an error).

    ``chunk``: the chunk as stored (edge chunks already padded), any float dtype;
    ``quantize``: the codec's :class:`ckptcodecs.Quantize` keyword arguments.
    """
    from ckptcodecs import QuantParams
    from ckptcodecs.floats import to_bf16_bits
    from ckptcodecs.kernels import segment_length

    method, bits = quantize["method"], int(quantize["bits"])
    name = _DTYPES[chunk.dtype]
    seg = segment_length(tuple(chunk.shape), quantize.get("granularity", "row"),
                         quantize.get("group_size"))
    work = torch.float64 if name == "float64" else torch.float32
    x = chunk.detach().reshape(-1).to(work)
    n = x.numel()
    if not device_quantizable(quantize, tuple(chunk.shape)) or (
            method == "kmeans" and name == "float64") or not bool(torch.isfinite(x).all()):
        return None  # (float64 bucket sums are not exact)
    protect, prune = float(quantize.get("protect") or 0), float(quantize.get("prune") or 0)
    sparse = quantize.get("protect_mode", "level") == "sparse"
    has_protect, has_prune = not sparse and protect > 0, prune > 0
    nspecial = int(has_protect) + int(has_prune)
    nq = (1 << bits) - nspecial
    if method == "kmeans" and quantize.get("levels") is not None:
        nq = int(quantize["levels"])
    if nq < 1 or nq + nspecial > 1 << bits:
        return None  # the host raises the error that says why
    params = QuantParams(method, bits, nq, has_prune, has_protect, seg, n, name,
                         protect_mode="sparse" if sparse else "level")
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=chunk.device), params
    prot, pruned = _partition(x, protect, prune)
    valid = torch.ones(n, dtype=torch.bool, device=x.device)
    valid[prot] = False
    valid[pruned] = False
    if method == "kmeans":
        codes = _kmeans(x, valid, seg, params, quantize)
    else:
        codes = _uniform(x, valid, seg, params, quantize, work)
    if has_prune:
        codes[pruned] = params.prune_code
    if prot.numel():
        if not sparse:  # sparse: the code keeps its nearest level
            codes[prot] = params.protect_code
        params.protected = to_bf16_bits(x[prot].float().cpu().numpy())
        if sparse:
            params.protect_positions = prot.cpu().numpy()
    return codes, params


def _uniform(x: torch.Tensor, valid: torch.Tensor, seg: int, params: Any,
             quantize: Mapping[str, Any], work: torch.dtype) -> torch.Tensor:
    """Codes of the uniform methods (the adaptive one over the searched ranges); sets the
    parameters. Only ``valid`` values (not protected, pruned or padding) set the ranges."""
    n, nq, method = x.numel(), params.nq, params.method
    xs, vs = _segments(x, seg), _segments(valid, seg, False)
    if method == "uniform-symmetric":
        hi = torch.where(vs, xs.abs(), 0.0).amax(dim=1).double()
        lo = -hi
    else:
        lo = torch.where(vs, xs, float("inf")).amin(dim=1).double()
        hi = torch.where(vs, xs, float("-inf")).amax(dim=1).double()
        empty = lo > hi  # a segment without values
        lo, hi = torch.where(empty, 0.0, lo), torch.where(empty, 0.0, hi)
        if method == "adaptive-asymmetric":
            lo, hi = _adaptive_ranges(xs, vs, lo, hi, nq, quantize)
    zero, scale = _half_params(lo, hi, nq, params, work) if quantize.get(
        "param_dtype") == "float16" else (None, None)
    if zero is None:
        if nq == 1:
            zero = (lo / 2 + hi / 2).to(work)
            scale = torch.zeros_like(zero)
        else:
            zero = lo.to(work)  # divided by a tensor: CUDA takes a * (1 / b) for a number b
            scale = torch.div(hi - zero.double(), torch.full_like(hi, nq - 1.0)).to(work)
            scale = torch.where(torch.isfinite(scale), scale, torch.finfo(work).max)
    inv = torch.where(scale > 0, torch.div(torch.ones_like(scale), scale), torch.zeros_like(scale))
    if not bool(torch.isfinite(inv).all()):  # subnormal scales: 1/scale needs float64
        xs = xs.double()
        zero_w = zero.double()
        s64 = scale.double()
        inv = torch.where(s64 > 0, torch.div(torch.ones_like(s64), s64), torch.zeros_like(s64))
    else:
        zero_w = zero
    t = (xs - zero_w[:, None]) * inv[:, None] + 0.5
    params.zero = zero.cpu().numpy()
    params.scale = scale.cpu().numpy()
    return t.clamp_(0.0, float(nq - 1)).to(torch.uint8).reshape(-1)[:n]


def _half_params(lo: torch.Tensor, hi: torch.Tensor, nq: int, params: Any, work: torch.dtype
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``param_dtype="float16"``: zero points rounded down and scales up to float16 by the
    host's own kernel (per segment: small); ``(None, None)`` where one is beyond the float16
    range, and the chunk keeps float32 parameters, as on the host."""
    from ckptcodecs.kernels import uniform_params_f16

    zero, scale = np.empty(lo.numel()), np.empty(lo.numel())
    if not uniform_params_f16(lo.cpu().numpy(), hi.cpu().numpy(), nq, zero, scale):
        return None, None
    params.param_dtype = "float16"
    pdt = np.float64 if work == torch.float64 else np.float32
    return (torch.from_numpy(zero.astype(pdt)).to(lo.device),
            torch.from_numpy(scale.astype(pdt)).to(lo.device))


def _adaptive_ranges(xs: torch.Tensor, vs: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                     nq: int, quantize: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Check-N-Run's greedy range search: each segment's histogram is counted on the device
    (integers: exact), only the histograms and ranges cross to the host, where
    :func:`ckptcodecs.adaptive.histogram_ranges_from_counts` runs the host path's very search."""
    from ckptcodecs.kernels import (
        HIST_PER_BIN,
        default_num_bins,
        histogram_ranges_from_counts,
    )

    bins = int(quantize.get("num_bins") or default_num_bins(int(quantize["bits"])))
    cells = bins * HIST_PER_BIN
    nseg, seg = xs.shape
    rg = hi - lo
    ok = (rg > 0) & (rg != float("inf"))
    # cells / rg correctly rounded, as the host's search divides (torch computes a scalar / a
    # tensor as a product with the tensor's reciprocal, which the old fastmath search matched)
    f = torch.where(ok, torch.full_like(rg, cells) / torch.where(ok, rg, 1.0), 0.0)
    # the host's cell index: int((float64(v) - lo) * f) clipped to [0, cells - 1]
    cell = ((xs.double() - lo[:, None]) * f[:, None]).trunc_().clamp_(0, cells - 1).long()
    cell = torch.where(vs, cell, cells)  # masked values and padding: a spare cell
    cell += torch.arange(nseg, device=xs.device)[:, None] * (cells + 1)
    counts = torch.bincount(cell.reshape(-1), minlength=nseg * (cells + 1))
    narrow = torch.uint8 if seg < 256 else torch.int16 if seg < 32768 else torch.int32
    counts = counts.view(nseg, cells + 1)[:, :cells].to(narrow).cpu().numpy()
    lo_h, hi_h = lo.cpu().numpy(), hi.cpu().numpy()
    histogram_ranges_from_counts(counts, lo_h, hi_h, nq, bins,
                                 float(quantize.get("ratio", 1.0)))
    return torch.from_numpy(lo_h).to(xs.device), torch.from_numpy(hi_h).to(xs.device)


def _kmeans(x: torch.Tensor, valid: torch.Tensor, seg: int, params: Any,
            quantize: Mapping[str, Any]) -> torch.Tensor:
    """DynaQuant's k-means: each segment's buckets (count and float64 sum of the values of one
    sign, exponent and 7 mantissa bits: exact sums) made on the device, the levels fitted on
    the host by the host's own compiled fit (:func:`ckptcodecs.kmeans.fit_from_buckets`), the
    nearest level of every value found on the device (ties to the lower)."""
    from ckptcodecs.kernels import MANTISSA_BITS, fit_from_buckets

    n, nq = x.numel(), params.nq
    nseg = -(-n // seg)
    where = torch.nonzero(valid).reshape(-1)  # protected and pruned values are not fitted
    xv = x[where]
    bits = xv.view(torch.int32).long() & 0xFFFFFFFF  # float32 bit patterns as unsigned
    ordered = torch.where(bits >= 1 << 31, ~bits & 0xFFFFFFFF, bits | 1 << 31)
    keys = (where // seg << 16) | (ordered >> 23 - MANTISSA_BITS)
    uniq, inverse, counts = torch.unique(keys, sorted=True, return_inverse=True,
                                         return_counts=True)
    sums = torch.zeros(uniq.numel(), dtype=torch.float64, device=x.device)
    sums.index_add_(0, inverse, xv.double())
    owner = (uniq >> 16).cpu().numpy()
    offsets = np.searchsorted(owner, np.arange(nseg + 1))
    book = np.empty((nseg, nq))
    fit_from_buckets(counts.cpu().numpy(), sums.cpu().numpy(), offsets, nq,
                     float(quantize.get("lam", 1.0)), int(quantize.get("seed", 0)), book)
    params.codebook = book.astype(np.float32)
    if quantize.get("param_dtype") == "float16":
        with np.errstate(over="ignore"):
            half = book.astype(np.float16)
        if np.isfinite(half).all():  # else (a level beyond +-65504): float32 parameters
            params.codebook = half.astype(np.float32)
            params.param_dtype = "float16"
    if nq == 1:
        return torch.zeros(n, dtype=torch.uint8, device=x.device)
    levels = torch.from_numpy(params.codebook).to(x.device).double()
    midpoints = 0.5 * (levels[:, :-1] + levels[:, 1:])
    xs = _segments(x, seg).double()
    codes = torch.searchsorted(midpoints.contiguous(), xs.contiguous(), right=False)
    return codes.to(torch.uint8).reshape(-1)[:n]


ChunkCodes = Callable[[int, int, int], tuple[np.ndarray | PackedCodes, Any]]


def device_chunk_codes(staged: torch.Tensor, grid: ChunkGrid, codec: QuantizedLossy,
                       packed: bool = False) -> ChunkCodes:
    """``codes(chunk index, first row, end row) -> (codes, params)`` of the chunks of
    ``staged`` (a tensor on its device: a CUDA tensor, or a CPU tensor in tests), quantized
    there on a stream of their own (CUDA) so that training's stream never waits for them.
    With ``packed`` the codes are bit-packed there too and come as :class:`PackedCodes` (half
    a byte a value crosses at 4 bits). Called from the writer's worker threads; a chunk holding
    a non-finite value is quantized on the host from its bits, exactly as the host path does."""

    def codes(i: int, lo: int, hi: int) -> tuple[np.ndarray | PackedCodes, Any]:
        stream = worker_stream(staged.device)  # the worker's own: its syncs wait for its work only
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            chunk = _padded_chunk(staged, grid, lo, hi)
            got = quantize_on_device(chunk, codec.quantize)
            if got is None:
                return codec.quantize_chunk(tensor_to_host(chunk))
            c, params = got
            if packed:
                return PackedCodes(pack_on_device(c, params.bits).cpu().numpy(), params.count,
                                   params.bits), params
            return c.cpu().numpy(), params

    return codes


def _padded_chunk(t: torch.Tensor, grid: ChunkGrid, lo: int, hi: int) -> torch.Tensor:
    """Rows ``lo:hi`` of ``t``, zero-padded to the full chunk as zarr stores edge chunks."""
    if not grid.shape:
        return t.reshape(())
    part = t[lo:hi]
    if hi - lo < grid.chunks[0]:
        full = torch.zeros(grid.chunks, dtype=t.dtype, device=t.device)
        full[: hi - lo] = part
        return full
    return part
