"""Float dtypes the codecs accept, and bfloat16 carried as its uint16 bit pattern."""

from __future__ import annotations

import numpy as np

from .errors import CodecError

__all__ = ["DTYPE_CODES", "as_float", "dtype_code", "from_bf16_bits", "from_float", "to_bf16_bits"]

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


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (nearest, ties to even) and return the uint16 bits.

    NaN stays NaN (quiet, sign kept); +-inf stay infinite; finite values beyond the bfloat16
    range saturate to the largest finite bfloat16 instead of becoming infinite.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    over = ((out & np.uint16(0x7FFF)) == np.uint16(0x7F80)) & np.isfinite(f)
    if over.any():
        out[over] = (out[over] & np.uint16(0x8000)) | np.uint16(0x7F7F)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


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
    if name in ("float32", "float16"):
        return x.astype(np.float32, copy=False), name
    raise CodecError(f"Quantize encodes float arrays; got dtype {x.dtype}")


def from_float(values: np.ndarray, name: str) -> np.ndarray:
    """Cast decoded float32/float64 values back to the dtype ``name`` (bfloat16 -> uint16 bits)."""
    if name == "bfloat16":
        return to_bf16_bits(values)
    return values.astype(name, copy=False)
