"""Lossy quantization of float tensors to 1..8-bit codes (functional core of :class:`Quantize`).

Methods (per segment: a row, a group of ``group_size`` values, or the whole tensor):

``uniform-symmetric``
    levels spread evenly over ``[-max|x|, max|x|]``.
``uniform-asymmetric``
    levels over ``[min x, max x]``: ``scale = (xmax - xmin) / (nq - 1)``, zero point ``xmin``,
    ``code = round((x - xmin) / scale)``, ``x' = xmin + code * scale`` (Check-N-Run, section 5.2).
``adaptive-asymmetric``
    as uniform-asymmetric over the clipping range found by Check-N-Run's greedy search
    (:mod:`ckptcodecs.adaptive`).
``kmeans``
    non-uniform levels from DynaQuant's histogram-weighted k-means (:mod:`ckptcodecs.kmeans`);
    any number of levels.

Special levels. ``prune`` (a fraction) sets the smallest-magnitude finite values to zero (a code
of its own after the ``nq`` quantization levels: ``prune_code = nq``) and ``protect`` keeps the
largest-magnitude ones in bfloat16. Non-finite values (NaN, +-inf) are always protected --
bfloat16 holds them exactly -- so they never poison the range of a segment. Protected values are
kept in position order and are left out of the fit of every segment. Where their positions go
depends on ``protect_mode``:

``'level'`` (default)
    a code of its own, ``protect_code = nq + has_prune``; the positions of protected values are
    the positions of ``protect_code`` in the codes.
``'sparse'``
    no code: all ``2**bits`` codes (less the prune code) are quantization levels, the sorted
    positions are stored next to the values (``QuantParams.protect_positions``), and the code at a
    protected position is the nearest level (decoding overwrites it). ``protect_code`` is -1.

Selection is per encoded array (per chunk in zarr). For uniform methods ``nq = 2**bits -
(number of special levels)``; for k-means ``nq = levels`` if given. A segment with a constant
value gets scale 0 (no division by zero); a segment without unmasked values decodes to its
specials only.
"""


from __future__ import annotations

import math

import numpy as np

from ._backend import CHOICE, native
from ._qkernels import QUANT as _Q
from ._floats import as_float, from_bf16_bits, from_float, to_bf16_bits
from ._select import select_magnitudes
from .adaptive import adaptive_ranges, default_num_bins
from .errors import CodecError
from .kmeans import fit_codebooks, nearest_codes
from .qparams import QuantParams, check_parameters, segment_length

__all__ = ["dequantize", "quantize"]

_EMPTY_MASK = np.zeros(0, np.uint8)
_FINITE_LIMIT = {"float16": np.float16}  # decoded levels are clamped to the finite range


def _partition(xf: np.ndarray, protect: float, prune: float, score: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Indices of protected and pruned values, sorted. Protected: the largest magnitudes plus
    all non-finite values; pruned: the smallest magnitudes. With ``score`` (DynaQuant's
    sensitivity, one non-negative value per element): protected are the share ``protect`` of
    largest magnitudes *and* of largest scores (the union), pruned the smallest scores."""
    finite = np.isfinite(xf)
    all_finite = bool(finite.all())
    nonfinite = np.zeros(0, np.intp) if all_finite else np.flatnonzero(~finite)
    none = np.zeros(0, np.intp)
    if protect <= 0 and prune <= 0:
        return nonfinite, none
    nfin = xf.size - nonfinite.size
    n_prot = min(math.ceil(protect * nfin), nfin) if protect > 0 else 0
    prot = select_magnitudes(xf, n_prot, largest=True)
    rank = xf
    if score is not None:
        rank = _ranks(score, finite, all_finite)
        if n_prot:
            prot = np.union1d(prot, select_magnitudes(rank, n_prot, largest=True))
    n_prune = min(math.ceil(prune * nfin), nfin - prot.size) if prune > 0 else 0
    pruned = none
    if n_prune:
        excl = None
        if prot.size:
            excl = np.zeros(xf.size, np.uint8)
            excl[prot] = 1
        pruned = select_magnitudes(rank, n_prune, largest=False, exclude=excl)
    return _ascending(np.concatenate([prot, nonfinite]), xf.size), _ascending(pruned, xf.size)


def _ascending(idx: np.ndarray, n: int) -> np.ndarray:
    """The distinct indices ``idx`` (of ``n`` positions) in ascending order: sorted when few,
    else read off a mask in one pass (a prune set holds most of a tensor: sorting 4 M indices
    took ~0.1 s a chunk)."""
    if idx.size * 16 < n:
        return np.sort(idx)
    mask = np.zeros(n, np.bool_)
    mask[idx] = True
    return np.flatnonzero(mask)


def _ranks(score: np.ndarray, finite: np.ndarray, all_finite: bool) -> np.ndarray:
    """``|score|`` as float32 for ranking: non-finite scores rank highest, and the positions of
    non-finite values (protected anyway) do not count."""
    s = np.abs(np.asarray(score, dtype=np.float32).reshape(-1))
    top = np.finfo(np.float32).max
    s = np.nan_to_num(s, nan=top, posinf=top)
    if not all_finite:
        s[~finite] = np.nan
    return s


def quantize(
    x: np.ndarray,
    method: str = "uniform-asymmetric",
    bits: int = 4,
    *,
    granularity: str = "row",
    group_size: int | None = None,
    protect: float = 0.0,
    prune: float = 0.0,
    levels: int | None = None,
    num_bins: int | None = None,
    ratio: float = 1.0,
    lam: float = 1.0,
    dtype: str | None = None,
    seed: int = 0,
    protect_mode: str = "level",
    param_dtype: str = "float32",
    score: np.ndarray | None = None,
) -> tuple[np.ndarray, QuantParams]:
    """Quantize a float array to codes.

    Parameters
    ----------
    x : ndarray
        float16/32/64 data, or the uint16 view of bfloat16 data (with ``dtype='bfloat16'``).
    method, bits, granularity, group_size, protect, prune, levels, num_bins, ratio, lam
    protect_mode, param_dtype
        See :class:`ckptcodecs.Quantize`.
    dtype : str, optional
        ``'bfloat16'`` to read a uint16 array as bfloat16 bits; otherwise the array's own dtype.
    seed : int
        Seed of the k-means++ initialisation (results are deterministic).
    score : ndarray, optional
        One importance value per element (DynaQuant's sensitivity ``|w * g|``): ``protect``
        then also keeps the largest scores and ``prune`` drops the smallest scores instead of
        the smallest magnitudes. The stored format is the same.

    Returns
    -------
    codes : ndarray of uint8, flat (C order), values ``< params.levels``.
    params : QuantParams
    """
    check_parameters(method, bits, granularity, group_size, protect, prune, levels, num_bins,
                      ratio, lam, protect_mode, param_dtype)
    sparse = protect_mode == "sparse"
    arr = np.asarray(x)
    seg = segment_length(arr.shape, granularity, group_size)
    xf, name = as_float(np.ascontiguousarray(arr).reshape(-1), dtype)
    n = xf.size
    if score is not None and np.size(score) != n:
        raise CodecError(f"score has {np.size(score)} values for {n} elements")
    prot_idx, prune_idx = _partition(xf, protect, prune, score)
    has_protect = not sparse and (protect > 0 or prot_idx.size > 0)
    has_prune = prune > 0
    nspecial = int(has_protect) + int(has_prune)
    if method == "kmeans" and levels is not None:
        nq = int(levels)
        if nq < 1 or nq + nspecial > 1 << bits:
            raise CodecError(f"levels={levels} plus {nspecial} special level(s) do not fit "
                             f"in {bits} bits")
    else:
        nq = (1 << bits) - nspecial
    if nq < 1:
        raise CodecError(f"{bits} bit(s) leave no quantization level next to the protect/prune "
                         "levels; use more bits")
    p = QuantParams(method, bits, nq, has_prune, has_protect, seg, n, name,
                    protect_mode=protect_mode)
    nseg = p.nseg
    mask = _EMPTY_MASK
    if prot_idx.size or prune_idx.size:
        mask = np.zeros(n, np.uint8)
        mask[prot_idx] = 1
        mask[prune_idx] = 1
    codes = np.empty(n, np.uint8)
    if method == "kmeans":
        _kmeans_codes(xf, seg, mask, p, float(lam), int(seed), param_dtype, codes)
    else:
        _uniform_path(xf, seg, mask, p, num_bins, ratio, param_dtype, codes)
    if has_prune:
        codes[prune_idx] = p.prune_code
    if prot_idx.size:
        if not sparse:  # sparse: the code keeps its nearest level
            codes[prot_idx] = p.protect_code
        p.protected = to_bf16_bits(xf[prot_idx])
        if sparse:
            p.protect_positions = prot_idx.astype(np.int64)
    return codes, p


def _kmeans_codes(xf: np.ndarray, seg: int, mask: np.ndarray, p: QuantParams, lam: float,
                  seed: int, param_dtype: str, codes: np.ndarray) -> None:
    """DynaQuant's k-means: each segment's codebook into ``p``, each value's nearest level."""
    book = np.empty((p.nseg, p.nq))
    with np.errstate(over="ignore"):
        bits32 = xf.astype(np.float32, copy=False).view(np.uint32)
    fit_codebooks(xf, bits32, seg, mask, p.nq, lam, seed, book)
    p.codebook = book.astype(_param_dtype(p.dtype))
    if param_dtype == "float16":
        with np.errstate(over="ignore"):
            b16 = book.astype(np.float16)
        if np.isfinite(b16).all():  # else (a level beyond +-65504): native parameters
            p.codebook = b16.astype(_param_dtype(p.dtype))
            p.param_dtype = "float16"
    # codes of the levels as stored: each value gets its nearest stored level
    nearest_codes(xf, seg, p.codebook, codes)


def _uniform_path(xf: np.ndarray, seg: int, mask: np.ndarray, p: QuantParams, num_bins,
                  ratio: float, param_dtype: str, codes: np.ndarray) -> None:
    """Uniform quantization: zero points and scales into ``p``, the codes into ``codes`` --
    the common case (no range search, float32 parameters) in one kernel call."""
    nseg, symmetric = p.nseg, p.method == "uniform-symmetric"
    if p.method != "adaptive-asymmetric" and param_dtype == "float32":
        zero, scale = np.empty(nseg, xf.dtype), np.empty(nseg, xf.dtype)
        if not _uniform(xf, seg, mask, p.nq, symmetric, zero, scale, codes):
            p.zero, p.scale = zero, scale
            return
    zero, scale, p.param_dtype = _uniform_params(xf, seg, mask, nseg, p.nq, p.method, p.bits,
                                                 num_bins, ratio, param_dtype)
    p.zero, p.scale = zero, scale
    inv = _inverse(scale, xf.dtype)
    xw = xf
    if not np.isfinite(inv).all():  # subnormal scales: 1/scale needs float64
        xw = xf.astype(np.float64)
        inv = _inverse(scale.astype(np.float64), np.float64)
    _uniform_codes(xw, seg, zero.astype(xw.dtype), inv, p.nq, codes)


def _inverse(scale: np.ndarray, dtype) -> np.ndarray:
    """``1 / scale`` in ``dtype`` where the scale is positive, else 0 (inf where it overflows)."""
    with np.errstate(over="ignore"):
        return np.divide(1.0, scale, out=np.zeros(scale.size, dtype), where=scale > 0)


def _uniform_codes(x: np.ndarray, seg: int, zero: np.ndarray, inv: np.ndarray, nq: int,
                   codes: np.ndarray) -> None:
    """Codes of ``x`` from its segments' zero points and inverse scales, in x's float type."""
    t = np.dtype(x.dtype).type
    _Q.uniform_codes(x, seg, zero, inv, t(nq - 1), t(0.5), t(0.0), codes)


def _uniform_steps(xf: np.ndarray, seg: int, mask: np.ndarray, nq: int, symmetric: bool,
                   zero: np.ndarray, scale: np.ndarray, codes: np.ndarray) -> int:
    """The uniform path of :func:`quantize` with float32 parameters of x's type, a kernel call
    a step: zero points and scales into ``zero``/``scale``, the codes into ``codes``; 1 (codes
    untouched) where an inverse scale is not finite (subnormal: the float64 steps). The twin of
    the C kernel ``quant_uniform_all``, which runs them in one call."""
    method = "uniform-symmetric" if symmetric else "uniform-asymmetric"
    zero[...], scale[...], _ = _uniform_params(xf, seg, mask, zero.size, nq, method, 8, None,
                                               1.0)
    inv = _inverse(scale, xf.dtype)
    if not np.isfinite(inv).all():
        return 1
    _uniform_codes(xf, seg, zero, inv, nq, codes)
    return 0


_native = native()
#: the uniform path in one call that releases the GIL once (C), or its steps (numba)
_uniform = _native.quant_uniform_all if CHOICE == "c" and _native is not None \
    else _uniform_steps


def _param_dtype(name: str) -> type:
    """Parameters are float32, float64 for float64 data."""
    return np.float64 if name == "float64" else np.float32


def _uniform_params(xf, seg, mask, nseg, nq, method, bits, num_bins, ratio,
                    param_dtype="float32"):
    """``(zero, scale, param_dtype used)``: float16 falls back to the native parameters for
    a chunk where a zero point or scale is beyond the float16 range."""
    lo = np.empty(nseg, xf.dtype)
    hi = np.empty(nseg, xf.dtype)
    if method == "uniform-symmetric":
        _Q.seg_absmax(xf, seg, mask, hi)
        lo = -hi
    else:
        _Q.seg_minmax(xf, seg, mask, lo, hi)
        if method == "adaptive-asymmetric":
            nb = int(num_bins) if num_bins else default_num_bins(bits)
            lo = lo.astype(np.float64)
            hi = hi.astype(np.float64)
            adaptive_ranges(xf, seg, mask, lo, hi, nq, nb, float(ratio))
    pdt = _param_dtype(xf.dtype.name)
    lo = lo.astype(np.float64)
    hi = hi.astype(np.float64)
    if param_dtype == "float16":
        # zero point rounded down, scale up (computed from the rounded zero point), so that
        # [zero, zero + scale * (nq - 1)] still covers [lo, hi]; any parameter beyond +-65504:
        # the chunk keeps float32 parameters
        zero = np.empty(nseg)
        scale = np.empty(nseg)
        if _Q.uniform_params_f16(lo, hi, nq, zero, scale):
            return zero.astype(pdt), scale.astype(pdt), "float16"
    if nq == 1:
        zero = (lo / 2 + hi / 2).astype(pdt)
        return zero, np.zeros(nseg, pdt), "float32"
    zero = lo.astype(pdt)
    with np.errstate(over="ignore", invalid="ignore"):
        scale = ((hi - zero) / (nq - 1)).astype(pdt)
    scale[~np.isfinite(scale)] = np.finfo(pdt).max  # range wider than the float type
    return zero, scale, "float32"


def dequantize(codes: np.ndarray, params: QuantParams) -> np.ndarray:
    """Values of ``codes`` (flat) in the original dtype (bfloat16 as uint16 bits)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    p = params
    if codes.size != p.count:
        raise CodecError(f"got {codes.size} codes for parameters of {p.count} values")
    work = np.float64 if p.dtype == "float64" else np.float32
    out = np.empty(p.count, work)
    prot = from_bf16_bits(p.protected).astype(work)
    if p.sparse:
        if p.protect_positions.size != prot.size or p.has_protect:
            raise CodecError("sparse protection needs one position per protected value and no "
                             "protect level")
        sparse_vals, prot = prot, prot[:0]
    try:
        if p.method == "kmeans":
            _Q.dequant_codebook(codes, p.seg_len, p.codebook, p.nq, p.prune_code,
                                p.protect_code, prot, out)
        else:
            lim = float(np.finfo(_FINITE_LIMIT.get(p.dtype, work)).max)
            _Q.dequant_uniform(codes, p.seg_len, p.zero, p.scale, p.nq, p.prune_code,
                               p.protect_code, prot, lim, out)
    except ValueError as err:  # the C kernels' checks: a chunk that does not fit its params
        raise CodecError(f"quantized chunk: {err}") from err
    if p.sparse:
        out[p.protect_positions] = sparse_vals
    return from_float(out, p.dtype)
