"""Quantization parameters: the names of the methods and options, their validation, and
:class:`QuantParams` (everything needed to turn codes back into values).

Shared by the functional core (:mod:`ckptcodecs.quantization`), the chunk layout
(:mod:`ckptcodecs._qformat`) and the numcodecs codec (:mod:`ckptcodecs.quantize`); it imports none
of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._buffers import check_int, check_real
from .errors import CodecError, CodecTypeError

__all__ = [
    "GRANULARITIES",
    "METHODS",
    "PARAM_DTYPES",
    "PROTECT_MODES",
    "QuantParams",
    "check_parameters",
    "segment_length",
]

METHODS = ("uniform-symmetric", "uniform-asymmetric", "adaptive-asymmetric", "kmeans")
GRANULARITIES = ("row", "group", "tensor")
PROTECT_MODES = ("level", "sparse")
#: How zero points, scales and codebooks are stored: ``'float32'`` (float64 for float64 data) or
#: ``'float16'``.
PARAM_DTYPES = ("float32", "float16")


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


def check_parameters(method, bits, granularity, group_size, protect, prune, levels, num_bins,
                      ratio, lam, protect_mode="level", param_dtype="float32") -> None:
    """Raise for parameters no encoding can use (shared by quantize and Quantize):
    :class:`CodecTypeError` for a parameter of the wrong type, :class:`CodecError` for a value out
    of range -- including a level count that cannot fit ``bits`` next to the special levels that
    ``protect``/``prune`` always add (non-finite data can add a protect level at encode time)."""
    for name, value in (("method", method), ("granularity", granularity),
                        ("protect_mode", protect_mode), ("param_dtype", param_dtype)):
        if not isinstance(value, str):
            raise CodecTypeError(f"{name} must be a string, got {value!r} "
                                 f"({type(value).__name__})")
    bits = check_int("bits", bits)
    group_size = check_int("group_size", group_size, optional=True)
    levels = check_int("levels", levels, optional=True)
    num_bins = check_int("num_bins", num_bins, optional=True)
    protect, prune = check_real("protect", protect), check_real("prune", prune)
    ratio, lam = check_real("ratio", ratio), check_real("lam", lam)
    if method not in METHODS:
        raise CodecError(f"method must be one of {METHODS}, got {method!r}")
    if not 1 <= bits <= 8:
        raise CodecError(f"bits must be in 1..8, got {bits}")
    if granularity not in GRANULARITIES:
        raise CodecError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if granularity == "group" and group_size is None:
        raise CodecError("granularity='group' needs group_size >= 1")
    if group_size is not None and group_size < 1:
        raise CodecError(f"group_size must be >= 1, got {group_size}")
    if not (0.0 <= protect < 1.0 and 0.0 <= prune < 1.0 and protect + prune < 1.0):
        raise CodecError("protect and prune are fractions in [0, 1) with protect + prune < 1")
    if levels is not None and not 1 <= levels <= 256:
        raise CodecError(f"levels must be in 1..256, got {levels}")
    if num_bins is not None and num_bins < 2:
        raise CodecError(f"num_bins must be >= 2, got {num_bins}")
    if not 0.0 < ratio <= 1.0:
        raise CodecError(f"ratio must be in (0, 1], got {ratio}")
    if not 0.0 <= lam <= 1.0:
        raise CodecError(f"lam must be in [0, 1], got {lam}")
    if protect_mode not in PROTECT_MODES:
        raise CodecError(f"protect_mode must be one of {PROTECT_MODES}, got {protect_mode!r}")
    if param_dtype not in PARAM_DTYPES:
        raise CodecError(f"param_dtype must be one of {PARAM_DTYPES}, got {param_dtype!r}")
    # special levels every encoding has (quantize() adds a protect level for non-finite data too)
    nspecial = int(prune > 0) + int(protect > 0 and protect_mode == "level")
    nq = levels if method == "kmeans" and levels is not None else (1 << bits) - nspecial
    if nq < 1 or nq + nspecial > 1 << bits:
        raise CodecError(f"{nq} quantization level(s) plus {nspecial} special level(s) "
                         f"(protect/prune) do not fit in {bits} bit(s)")
