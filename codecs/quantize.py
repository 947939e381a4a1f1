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
from dataclasses import dataclass, field

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ensure_ndarray, ndarray_copy

from . import _qkernels as K
from ._floats import as_float, from_bf16_bits, from_float, to_bf16_bits
from ._select import select_magnitudes
from .adaptive import adaptive_ranges, default_num_bins
from .errors import CodecError
from .kmeans import fit_codebooks, nearest_codes

__all__ = [
    "GRANULARITIES",
    "METHODS",
    "PARAM_DTYPES",
    "PROTECT_MODES",
    "QuantParams",
    "Quantize",
    "dequantize",
    "quantize",
    "segment_length",
]

METHODS = ("uniform-symmetric", "uniform-asymmetric", "adaptive-asymmetric", "kmeans")
GRANULARITIES = ("row", "group", "tensor")
PROTECT_MODES = ("level", "sparse")
#: How zero points, scales and codebooks are stored: ``'float32'`` (float64 for float64 data) or
#: ``'float16'``.
PARAM_DTYPES = ("float32", "float16")
_EMPTY_MASK = np.zeros(0, np.uint8)
_FINITE_LIMIT = {"float16": np.float16}  # decoded levels are clamped to the finite range


@dataclass
class QuantParams:
    """Everything needed to turn codes back into values.

    ``zero``/``scale`` (uniform methods, one per segment) or ``codebook`` (k-means, shape
    ``(nseg, nq)``) are float32 (float64 for float64 data). ``param_dtype`` says how a chunk stores
    them: ``'float32'`` (as they are) or ``'float16'`` (the values are then exactly representable
    in float16, so that what is decoded is what was used to compute the codes). ``protected``
    holds the bfloat16 bits of protected values in position order. ``has_protect`` means a
    protect *level* (``protect_mode='level'``); with ``protect_mode='sparse'`` it is False and
    ``protect_positions`` (int64, strictly increasing) says where the protected values go.
    """

    method: str
    bits: int
    nq: int
    has_prune: bool
    has_protect: bool
    seg_len: int
    count: int
    dtype: str
    zero: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    scale: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    codebook: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    protected: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint16))
    protect_mode: str = "level"
    protect_positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    param_dtype: str = "float32"

    @property
    def nseg(self) -> int:
        return -(-self.count // self.seg_len) if self.count else 0

    @property
    def levels(self) -> int:
        """Total number of codes in use, special levels included (K of BucketDelta)."""
        return self.nq + int(self.has_prune) + int(self.has_protect)

    @property
    def sparse(self) -> bool:
        """True when protected values are a sorted position list rather than a code."""
        return self.protect_mode == "sparse"

    @property
    def prune_code(self) -> int:
        return self.nq if self.has_prune else -1

    @property
    def protect_code(self) -> int:
        return self.nq + int(self.has_prune) if self.has_protect else -1


def segment_length(shape: tuple[int, ...], granularity: str, group_size: int | None) -> int:
    """Length of one quantization segment for an array of ``shape``."""
    count = math.prod(shape)
    if granularity == "tensor":
        return max(count, 1)
    if granularity == "row":
        return max(shape[-1] if len(shape) >= 2 else count, 1)
    if granularity == "group":
        if not group_size or group_size < 1:
            raise CodecError("granularity='group' needs group_size >= 1")
        return int(group_size)
    raise CodecError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


def _partition(xf: np.ndarray, protect: float, prune: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of protected (largest magnitudes, plus all non-finite) and pruned values, sorted."""
    finite = np.isfinite(xf)
    all_finite = bool(finite.all())
    nonfinite = np.zeros(0, np.intp) if all_finite else np.flatnonzero(~finite)
    none = np.zeros(0, np.intp)
    if protect <= 0 and prune <= 0:
        return nonfinite, none
    nfin = xf.size - nonfinite.size
    n_prot = min(math.ceil(protect * nfin), nfin) if protect > 0 else 0
    n_prune = min(math.ceil(prune * nfin), nfin - n_prot) if prune > 0 else 0
    prot = select_magnitudes(xf, n_prot, largest=True)
    pruned = none
    if n_prune:
        excl = None
        if n_prot:
            excl = np.zeros(xf.size, np.uint8)
            excl[prot] = 1
        pruned = select_magnitudes(xf, n_prune, largest=False, exclude=excl)
    return np.sort(np.concatenate([prot, nonfinite])), np.sort(pruned)


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

    Returns
    -------
    codes : ndarray of uint8, flat (C order), values ``< params.levels``.
    params : QuantParams
    """
    _check_parameters(method, bits, granularity, group_size, protect, prune, levels, num_bins,
                      ratio, lam, protect_mode, param_dtype)
    sparse = protect_mode == "sparse"
    arr = np.asarray(x)
    seg = segment_length(arr.shape, granularity, group_size)
    xf, name = as_float(np.ascontiguousarray(arr).reshape(-1), dtype)
    n = xf.size
    prot_idx, prune_idx = _partition(xf, protect, prune)
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
        book = np.empty((nseg, nq))
        with np.errstate(over="ignore"):
            bits32 = xf.astype(np.float32, copy=False).view(np.uint32)
        fit_codebooks(xf, bits32, seg, mask, nq, float(lam), int(seed), book)
        p.codebook = book.astype(_param_dtype(name))
        if param_dtype == "float16":
            with np.errstate(over="ignore"):
                b16 = book.astype(np.float16)
            if np.isfinite(b16).all():  # else (a level beyond +-65504): native parameters
                p.codebook = b16.astype(_param_dtype(name))
                p.param_dtype = "float16"
        # codes of the levels as stored: each value gets its nearest stored level
        nearest_codes(xf, seg, p.codebook, codes)
    else:
        zero, scale, p.param_dtype = _uniform_params(xf, seg, mask, nseg, nq, method, bits,
                                                     num_bins, ratio, param_dtype)
        p.zero, p.scale = zero, scale
        with np.errstate(over="ignore"):
            inv = np.divide(1.0, scale, out=np.zeros(nseg, xf.dtype), where=scale > 0)
        xw = xf
        if not np.isfinite(inv).all():  # subnormal scales: 1/scale needs float64
            xw = xf.astype(np.float64)
            inv = np.divide(1.0, scale.astype(np.float64), out=np.zeros(nseg), where=scale > 0)
        t = np.dtype(xw.dtype).type
        K.uniform_codes(xw, seg, zero.astype(xw.dtype), inv, t(nq - 1), t(0.5), t(0.0), codes)
    if has_prune:
        codes[prune_idx] = p.prune_code
    if prot_idx.size:
        if not sparse:  # sparse: the code keeps its nearest level
            codes[prot_idx] = p.protect_code
        p.protected = to_bf16_bits(xf[prot_idx])
        if sparse:
            p.protect_positions = prot_idx.astype(np.int64)
    return codes, p


def _check_parameters(method, bits, granularity, group_size, protect, prune, levels, num_bins,
                      ratio, lam, protect_mode="level", param_dtype="float32") -> None:
    """Raise CodecError for parameters no encoding can use (shared by quantize and Quantize)."""
    if method not in METHODS:
        raise CodecError(f"method must be one of {METHODS}, got {method!r}")
    if not 1 <= int(bits) <= 8:
        raise CodecError(f"bits must be in 1..8, got {bits}")
    if granularity not in GRANULARITIES:
        raise CodecError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if granularity == "group" and (group_size is None or int(group_size) < 1):
        raise CodecError("granularity='group' needs group_size >= 1")
    if not (0.0 <= protect < 1.0 and 0.0 <= prune < 1.0 and protect + prune < 1.0):
        raise CodecError("protect and prune are fractions in [0, 1) with protect + prune < 1")
    if levels is not None and not 1 <= int(levels) <= 256:
        raise CodecError(f"levels must be in 1..256, got {levels}")
    if num_bins is not None and int(num_bins) < 2:
        raise CodecError(f"num_bins must be >= 2, got {num_bins}")
    if not 0.0 < ratio <= 1.0:
        raise CodecError(f"ratio must be in (0, 1], got {ratio}")
    if not 0.0 <= lam <= 1.0:
        raise CodecError(f"lam must be in [0, 1], got {lam}")
    if protect_mode not in PROTECT_MODES:
        raise CodecError(f"protect_mode must be one of {PROTECT_MODES}, got {protect_mode!r}")
    if param_dtype not in PARAM_DTYPES:
        raise CodecError(f"param_dtype must be one of {PARAM_DTYPES}, got {param_dtype!r}")


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
        K.seg_absmax(xf, seg, mask, hi)
        lo = -hi
    else:
        K.seg_minmax(xf, seg, mask, lo, hi)
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
        if K.uniform_params_f16(lo, hi, nq, zero, scale):
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
    if p.method == "kmeans":
        K.dequant_codebook(codes, p.seg_len, p.codebook, p.nq, p.prune_code, p.protect_code,
                           prot, out)
    else:
        K.dequant_uniform(codes, p.seg_len, p.zero, p.scale, p.nq, p.prune_code, p.protect_code,
                          prot, float(np.finfo(_FINITE_LIMIT.get(p.dtype, work)).max), out)
    if p.sparse:
        out[p.protect_positions] = sparse_vals
    return from_float(out, p.dtype)


class Quantize(Codec):
    """Lossy numcodecs codec: float arrays -> self-contained chunks of packed 1..8-bit codes.

    Parameters
    ----------
    method : str
        ``'uniform-symmetric'``, ``'uniform-asymmetric'`` (default), ``'adaptive-asymmetric'``
        (Check-N-Run greedy range search) or ``'kmeans'`` (DynaQuant histogram k-means).
    bits : int
        Width of one code, 1..8.
    granularity : str
        ``'row'`` (one set of parameters per row along the last axis; default), ``'group'``
        (per ``group_size`` consecutive values) or ``'tensor'``.
    group_size : int, optional
        Values per group with ``granularity='group'``.
    protect : float
        Fraction of largest-magnitude values kept in bfloat16 (NaN and +-inf always are).
    prune : float
        Fraction of smallest-magnitude values set to zero (a level of its own).
    levels : int, optional
        k-means only: number of quantization levels (any number up to what ``bits`` holds next
        to the special levels; default: all of them).
    num_bins : int, optional
        adaptive only: greedy steps over the range (default 25 for <= 3 bits, else 45).
    ratio : float
        adaptive only: fraction of the range the greedy search may cut (default 1.0).
    lam : float
        k-means only: weight of frequency versus magnitude of a histogram bucket (1.0 = plain
        frequency-weighted k-means, the lowest L2 error).
    dtype : str, optional
        ``'bfloat16'`` to treat uint16 input as bfloat16 bits; else the input's float dtype.
    protect_mode : str
        ``'level'`` (default): protected values take a code of their own, so ``nq`` is one less;
        ``'sparse'``: every code is a quantization level and the chunk stores the sorted
        positions of the protected values (format version 2). The config carries
        ``protect_mode`` only when it is not the default, so level-mode configs are unchanged.
    param_dtype : str
        ``'float32'`` (default; float64 for float64 data) or ``'float16'``: how zero points,
        scales and k-means levels are stored. float16 halves the parameter bytes (they dominate
        narrow rows: 8 of 12 bytes for 16 values at 2 bits). Zero points are rounded down and
        scales up to float16 *before* the codes are computed, so the error bound still holds
        with the stored scale; a chunk whose parameters exceed the float16 range (+-65504) keeps
        float32 parameters (the chunk header says which). In the config only when float16.

    Notes
    -----
    The decoded array has the input's dtype (bfloat16 as uint16 bits); a chunk carries its count,
    parameters and protected values (see :mod:`ckptcodecs._qformat`), so ``decode`` returns a
    flat array unless ``out`` gives the shape. NaN and +-inf are protected, hence restored exactly.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.linspace(-1, 1, 64, dtype="float32").reshape(4, 16)
    >>> codec = Quantize(method="uniform-asymmetric", bits=4)
    >>> y = codec.decode(codec.encode(x)).reshape(x.shape)
    >>> bool(np.abs(x - y).max() <= (2 / 3) / 15 / 2 + 1e-6)
    True
    """

    codec_id = "ckpt.quantize"

    def __init__(self, method: str = "uniform-asymmetric", bits: int = 4, granularity: str = "row",
                 group_size: int | None = None, protect: float = 0.0, prune: float = 0.0,
                 levels: int | None = None, num_bins: int | None = None, ratio: float = 1.0,
                 lam: float = 1.0, dtype: str | None = None, protect_mode: str = "level",
                 param_dtype: str = "float32"):
        _check_parameters(method, bits, granularity, group_size, protect, prune, levels,
                          num_bins, ratio, lam, protect_mode, param_dtype)
        if dtype not in (None, "float16", "float32", "float64", "bfloat16"):
            raise CodecError(f"dtype must be a float dtype name or 'bfloat16', got {dtype!r}")
        self.method = method
        self.bits = int(bits)
        self.granularity = granularity
        self.group_size = None if group_size is None else int(group_size)
        self.protect = float(protect)
        self.prune = float(prune)
        self.levels = None if levels is None else int(levels)
        self.num_bins = None if num_bins is None else int(num_bins)
        self.ratio = float(ratio)
        self.lam = float(lam)
        self.dtype = dtype
        self.protect_mode = protect_mode
        self.param_dtype = param_dtype

    def get_config(self) -> dict:
        config = super().get_config()
        if config["protect_mode"] == "level":  # configs written before the option stay as they were
            del config["protect_mode"]
        if config["param_dtype"] == "float32":  # likewise
            del config["param_dtype"]
        return config

    def encode(self, buf) -> bytes:
        from ._qformat import encode_chunk

        arr = ensure_ndarray(buf)
        codes, params = quantize(
            arr, self.method, self.bits, granularity=self.granularity,
            group_size=self.group_size, protect=self.protect, prune=self.prune,
            levels=self.levels, num_bins=self.num_bins, ratio=self.ratio, lam=self.lam,
            dtype=self.dtype, protect_mode=self.protect_mode, param_dtype=self.param_dtype)
        return encode_chunk(codes, params)

    def decode(self, buf, out=None):
        from ._qformat import decode_chunk

        codes, params = decode_chunk(ensure_contiguous_ndarray(buf))
        return ndarray_copy(dequantize(codes, params), out)

    def __repr__(self) -> str:
        cfg = self.get_config()
        cfg.pop("id")
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        return f"Quantize({args})"
