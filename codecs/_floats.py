"""Float dtypes the codecs accept, and bfloat16 carried as its uint16 bit pattern."""

from __future__ import annotations

import math

import numpy as np

from ._backend import kernels
from ._jit import njit, on_compile
from .errors import CodecError

__all__ = ["DTYPE_CODES", "add_rounded", "add_rounded_numpy", "as_float", "bf16_bits_numpy",
           "dtype_code", "float16_values", "from_bf16_bits", "from_float", "to_bf16_bits",
           "to_float16"]

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


@on_compile
def _intrinsics() -> dict[str, object]:
    """The numba intrinsics the reference kernels below call (numba imported only for them)."""
    from llvmlite import ir
    from numba import types
    from numba.cpython.unsafe.numbers import leading_zeros
    from numba.extending import intrinsic

    @intrinsic
    def _float32_of(typingctx, x):
        """The float32 whose bits are the low 32 bits of the integer ``x``."""
        if not isinstance(x, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            bits = args[0]
            if bits.type.width != 32:
                bits = builder.trunc(bits, ir.IntType(32))
            return builder.bitcast(bits, ir.FloatType())
        return types.float32(x), codegen

    @intrinsic
    def _bits_of(typingctx, x):
        """The bits of the float32 ``x``, as a uint32."""
        if x != types.float32:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.uint32(x), codegen

    return {"_float32_of": _float32_of, "_bits_of": _bits_of, "leading_zeros": leading_zeros}


@njit(cache=True, nogil=True)
def _bf16_of(x):  # pragma: no cover - compiled
    """bfloat16 bits of the float32 bits ``x`` (see :func:`to_bf16_bits`)."""
    a = x & _U(0x7FFFFFFF)
    r = (x + _U(0x7FFF) + ((x >> _U(16)) & _U(1))) >> _U(16)
    if a > _U(0x7F800000):  # NaN: quiet, sign and high payload kept
        r = (x >> _U(16)) | _U(0x40)
    elif a < _U(0x7F800000) and (r & _U(0x7FFF)) == _U(0x7F80):  # finite rounded to inf
        r = (r & _U(0x8000)) | _U(0x7F7F)
    return np.uint16(r)


@njit(cache=True, nogil=True)
def _f16_of(x):  # pragma: no cover - compiled
    """float16 bits of the float32 bits ``x``: nearest, ties to even, as numpy's cast (beyond
    the range +-inf; NaN keeps its sign and its payload's high bits, never 0)."""
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
    return np.uint16(h | ((x >> _U(16)) & _U(0x8000)))


@njit(cache=True, nogil=True)
def _f32_of_f16(h):  # pragma: no cover - compiled
    """float32 bits of the float16 bits ``h`` (exact; NaN payloads kept)."""
    x = _U(h)
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
    return _U(r | ((x & _U(0x8000)) << _U(16)))


@njit(cache=True, nogil=True)
def _bf16_bits(u, out):  # pragma: no cover - compiled
    for i in range(np.uint64(u.size)):
        out[i] = _bf16_of(u[i])


@njit(cache=True, nogil=True)
def _f16_bits(u, out):  # pragma: no cover - compiled
    for i in range(np.uint64(u.size)):
        out[i] = _f16_of(u[i])


@njit(cache=True, nogil=True)
def _f32_bits(h16, out):  # pragma: no cover - compiled
    for i in range(np.uint64(h16.size)):
        out[i] = _f32_of_f16(h16[i])


@njit(cache=True, nogil=True)
def _add16(base, residual, half, top, out):  # pragma: no cover - compiled
    """``base + residual`` of 16-bit float bits (float16 if ``half``, else bfloat16) into
    ``out``: summed in float32, a sum of finite values beyond ``+-top`` saturates at it, rounded
    once."""
    for i in range(np.uint64(base.size)):
        if half:
            b, r = _float32_of(_f32_of_f16(base[i])), _float32_of(_f32_of_f16(residual[i]))
        else:
            b = _float32_of(_U(base[i]) << _U(16))
            r = _float32_of(_U(residual[i]) << _U(16))
        t = np.float32(b + r)
        if not abs(t) <= top and math.isfinite(b) and math.isfinite(r):
            t = np.float32(math.copysign(top, t))
        out[i] = _f16_of(_bits_of(t)) if half else _bf16_of(_bits_of(t))


# The implementation this process runs (ckptcodecs._backend): C, or the numba kernels above.
_K = kernels("floats", bf16_bits=_bf16_bits, f16_bits=_f16_bits, f32_bits=_f32_bits,
             add16=_add16)


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
    return _map_bits(_K.bf16_bits, x, np.float32, np.uint16)


def bf16_bits_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`to_bf16_bits` written with numpy (several passes, ~8x slower; the code it had
    before it was compiled): the rule the compiled kernel is checked and benchmarked against."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
           >> np.uint32(16)).astype(np.uint16)
    over = ((out & np.uint16(0x7FFF)) == np.uint16(0x7F80)) & np.isfinite(f)
    if over.any():
        out[over] = (out[over] & np.uint16(0x8000)) | np.uint16(0x7F7F)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def to_float16(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float16)``: the same bits, ~3.5x faster from float32 (other dtypes go
    through numpy, which rounds them once)."""
    if np.asarray(x).dtype != np.float32:
        return np.asarray(x).astype(np.float16)
    return _map_bits(_K.f16_bits, x, np.float32, np.float16)


def float16_values(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` of float16 values (exact), ~3.5x faster than numpy's cast."""
    if np.asarray(h).dtype.kind != "f" or np.asarray(h).dtype.itemsize != 2:
        raise CodecError(f"float16_values takes float16 values, not {np.asarray(h).dtype}")
    return _map_bits(_K.f32_bits, h, np.float16, np.float32)


#: the largest finite value of each 16-bit float dtype
_LARGEST = {"bfloat16": 3.3895313892515355e38, "float16": 65504.0}
_HOST = {"bfloat16": np.uint16, "float16": np.float16}  # how each holds its bits


def add_rounded(base: np.ndarray, residual: np.ndarray, dtype: str,
                out: np.ndarray | None = None) -> np.ndarray:
    """``base + residual`` of two arrays of ``dtype`` (``"bfloat16"`` as uint16 bits, or
    ``"float16"``) in one pass: added in float32, a sum of finite values beyond the dtype's largest
    finite value saturated at it, rounded once (nearest, ties to even); into ``out`` if given
    (numpy's assignment rules; ``out`` may be ``base``). The same bits as those steps done with
    numpy, without their float32 temporaries."""
    b, r = np.asarray(base), np.asarray(residual)
    if dtype not in _HOST or b.dtype.itemsize != 2 or r.dtype.itemsize != 2 or b.shape != r.shape:
        raise ValueError(f"add_rounded adds two arrays of one shape of bfloat16 or float16 bits, "
                         f"not {b.dtype}{b.shape} and {r.dtype}{r.shape} as {dtype!r}")
    if out is not None and not out.flags.writeable:
        raise ValueError("add_rounded: out is read-only")
    host = np.dtype(_HOST[dtype])
    direct = (out is not None and out.dtype == host and out.shape == b.shape
              and out.flags.c_contiguous)
    total = out if direct else np.empty(b.shape, host)
    _K.add16(_native_bits(b), _native_bits(r), dtype == "float16",
             np.float32(_LARGEST[dtype]), total.reshape(-1).view(np.uint16))
    if out is None or direct:
        return total
    out[...] = total
    return out


def _native_bits(x: np.ndarray) -> np.ndarray:
    """The flat uint16 bits of a 2-byte array, in native byte order and contiguous."""
    return np.ascontiguousarray(x, x.dtype.newbyteorder("=")).reshape(-1).view(np.uint16)


def add_rounded_numpy(base: np.ndarray, residual: np.ndarray, dtype: str) -> np.ndarray:
    """:func:`add_rounded` as numpy steps (float32 temporaries; the finite mask only when the
    largest magnitudes say a sum may overflow): what the compiled pass is checked and
    benchmarked against."""
    if dtype == "bfloat16":
        b, r = from_bf16_bits(base), from_bf16_bits(residual)
    else:
        b, r = np.asarray(base).astype(np.float32), np.asarray(residual).astype(np.float32)
    top = _LARGEST[dtype]
    with np.errstate(all="ignore"):
        t = np.add(b, r)
        largest = [max(float(x.max()), -float(x.min())) if x.size else 0.0 for x in (b, r)]
        if not largest[0] + largest[1] <= top:  # NaN too
            cut = ~(np.abs(t) <= top) & np.isfinite(b) & np.isfinite(r)
            t[cut] = np.copysign(top, t[cut])
        return bf16_bits_numpy(t) if dtype == "bfloat16" else t.astype(np.float16)


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
