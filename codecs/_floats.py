"""Float dtypes the codecs accept, and bfloat16 carried as its uint16 bit pattern."""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import leading_zeros

from .errors import CodecError

__all__ = ["DTYPE_CODES", "as_float", "bf16_bits_numpy", "dtype_code", "float16_values",
           "from_bf16_bits", "from_float", "to_bf16_bits", "to_float16"]

#: header code -> dtype name; "bfloat16" arrays travel as their uint16 view.
DTYPE_CODES = {0: "float32", 1: "float64", 2: "float16", 3: "bfloat16"}
_NAME_TO_CODE = {v: k for k, v in DTYPE_CODES.items()}


def dtype_code(name: str) -> int:
    try:
        return _NAME_TO_CODE[name]
    except KeyError:
        raise CodecError(
            f"unsupported dtype {name!r}; expected one of {sorted(_NAME_TO_CODE)} "
            "(pass dtype='bfloat16' for a uint16 view of bfloat16 data)"
        ) from None


# One pass over the bits, unsigned integers and selects only: LLVM vectorizes each loop (numpy's
# float16 casts and the many passes of a numpy bfloat16 rounding took 3.5-8.5x longer).
_U = np.uint32


@njit(cache=True, nogil=True)
def _bf16_bits(u, out):  # pragma: no cover - compiled
    """bfloat16 bits of the float32 bits ``u`` into ``out`` (see :func:`to_bf16_bits`)."""
    for i in range(np.uint64(u.size)):
        x = u[i]
        a = x & _U(0x7FFFFFFF)
        r = (x + _U(0x7FFF) + ((x >> _U(16)) & _U(1))) >> _U(16)
        if a > _U(0x7F800000):  # NaN: quiet, sign and high payload kept
            r = (x >> _U(16)) | _U(0x40)
        elif a < _U(0x7F800000) and (r & _U(0x7FFF)) == _U(0x7F80):  # finite rounded to inf
            r = (r & _U(0x8000)) | _U(0x7F7F)
        out[i] = np.uint16(r)


@njit(cache=True, nogil=True)
def _f16_bits(u, out):  # pragma: no cover - compiled
    """float16 bits of the float32 bits ``u`` into ``out``: nearest, ties to even, as numpy's
    cast (beyond the range +-inf; NaN keeps its sign and its payload's high bits, never 0)."""
    for i in range(np.uint64(u.size)):
        x = u[i]
        a = x & _U(0x7FFFFFFF)
        # normal halves (2**-14 <= |x| < 65536): rebias, round at bit 13, ties to the even one
        h = (a - _U(112 << 23) + _U(0xFFF) + ((a >> _U(13)) & _U(1))) >> _U(13)
        if a < _U(0x38800000):  # subnormal halves: m * 2**-24 rounded, ties to the even one
            s = min(_U(126) - min(a >> _U(23), _U(112)), _U(31))  # 14..31
            m = (a & _U(0x7FFFFF)) | _U(0x800000)
            q, rest, half = m >> s, m & ((_U(1) << s) - _U(1)), _U(1) << (s - _U(1))
            h = q + _U((rest > half) | ((rest == half) & ((q & _U(1)) == _U(1))))
        if a >= _U(0x47800000):
            h = _U(0x7C00)
        if a > _U(0x7F800000):
            h = max(_U(0x7C00) | ((a >> _U(13)) & _U(0x3FF)), _U(0x7C01))
        out[i] = np.uint16(h | ((x >> _U(16)) & _U(0x8000)))


@njit(cache=True, nogil=True)
def _f32_bits(h16, out):  # pragma: no cover - compiled
    """float32 bits of the float16 bits ``h16`` into ``out`` (exact; NaN payloads kept)."""
    for i in range(np.uint64(h16.size)):
        x = _U(h16[i])
        e, m = (x >> _U(10)) & _U(0x1F), x & _U(0x3FF)
        r = ((e + _U(112)) << _U(23)) | (m << _U(13))
        if e == _U(31):
            r = _U(0x7F800000) | (m << _U(13))
        if e == _U(0):  # zero or m * 2**-24: m's top bit sets the exponent
            z = np.uint64(leading_zeros(np.uint64(m | _U(1))))  # the top bit is bit 63 - z
            r = ((np.uint64(166) - z) << np.uint64(23)) | ((m << (z - np.uint64(40)))
                                                          & _U(0x7FFFFF))
            if m == _U(0):
                r = _U(0)
        out[i] = r | ((x & _U(0x8000)) << _U(16))


def _map_bits(kernel, x: np.ndarray, src, dtype) -> np.ndarray:
    """``kernel`` from the bits of ``x`` (as the dtype ``src``) to a new array of ``dtype`` and
    ``x``'s shape."""
    out = np.empty(np.shape(x), dtype)
    flat = np.ascontiguousarray(x, dtype=src).reshape(-1)
    kernel(flat.view(_BITS[flat.itemsize]), out.reshape(-1).view(_BITS[out.itemsize]))
    return out


_BITS = {2: np.uint16, 4: np.uint32}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (nearest, ties to even) and return the uint16 bits.

    NaN stays NaN (quiet, sign kept); +-inf stay infinite; finite values beyond the bfloat16
    range saturate to the largest finite bfloat16 instead of becoming infinite.
    """
    return _map_bits(_bf16_bits, x, np.float32, np.uint16)


def bf16_bits_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`to_bf16_bits` written with numpy (several passes, ~8x slower): the rule the
    compiled kernel is checked and benchmarked against."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
           >> np.uint32(16)).astype(np.uint16)
    over = ((out & np.uint16(0x7FFF)) == np.uint16(0x7F80)) & np.isfinite(f)
    out[over] = (out[over] & np.uint16(0x8000)) | np.uint16(0x7F7F)
    nan = np.isnan(f)
    out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def to_float16(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float16)``: the same bits, ~3.5x faster from float32 (other dtypes go
    through numpy, which rounds them once)."""
    if np.asarray(x).dtype != np.float32:
        return np.asarray(x).astype(np.float16)
    return _map_bits(_f16_bits, x, np.float32, np.float16)


def float16_values(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` of float16 values (exact), ~3.5x faster than numpy's cast."""
    return _map_bits(_f32_bits, h, np.float16, np.float32)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact)."""
    b = np.ascontiguousarray(bits).view(np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def as_float(x: np.ndarray, dtype: str | None) -> tuple[np.ndarray, str]:
    """Return ``(values as float32/float64, dtype name)`` for an input chunk.

    ``dtype='bfloat16'`` reads a uint16 (or raw 2-byte) array as bfloat16 bits.
    """
    if dtype is None and x.dtype == np.uint16:
        raise CodecError("got a uint16 array: pass dtype='bfloat16' if it holds bfloat16 bits")
    if dtype == "bfloat16":
        if x.dtype.itemsize != 2:
            raise CodecError(f"bfloat16 data must be given as a uint16 view, got dtype {x.dtype}")
        return from_bf16_bits(x.view(np.uint16)), "bfloat16"
    name = np.dtype(x.dtype).name
    if dtype is not None and name != dtype:
        raise CodecError(f"codec configured for dtype {dtype!r} but got an array of {name}")
    if name == "float64":
        return x, name
    if name == "float16":
        return float16_values(x), name
    if name == "float32":
        return x.astype(np.float32, copy=False), name
    raise CodecError(f"Quantize encodes float arrays; got dtype {x.dtype}")


def from_float(values: np.ndarray, name: str) -> np.ndarray:
    """Cast decoded float32/float64 values back to the dtype ``name`` (bfloat16 -> uint16 bits)."""
    if name == "bfloat16":
        return to_bf16_bits(values)
    if name == "float16":
        return to_float16(values)
    return values.astype(name, copy=False)
