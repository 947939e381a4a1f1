"""numcodecs buffer conventions shared by the codecs: inputs, ``out=`` and parameter types.

A numcodecs codec encodes any object exporting the buffer protocol (bytes, bytearray,
memoryview, array.array, numpy arrays), refuses object arrays with a ``TypeError``, and decodes
into a caller's ``out`` buffer when given one -- which must be writeable and hold exactly the
decoded bytes.
"""

from __future__ import annotations

import numbers

import numpy as np
from numcodecs.compat import (
    ensure_contiguous_ndarray,
    ensure_ndarray,
    ensure_ndarray_like,
    ndarray_copy,
)

from .errors import CodecError, CodecTypeError

__all__ = ["aligned_empty", "as_input", "check_bool", "check_int", "check_real", "copy_out",
           "out_array", "payload"]


#: where encoded outputs start: a page, so a store writing them past the page cache
#: (``O_DIRECT``) writes them in place instead of through a copy
OUT_ALIGN = 4096


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data starts on an ``OUT_ALIGN`` boundary
    (a view into an array ``OUT_ALIGN - 1`` bytes longer)."""
    raw = np.empty(nbytes + OUT_ALIGN - 1, np.uint8)
    start = -raw.ctypes.data % OUT_ALIGN
    return raw[start:start + nbytes]


def _as_array(buf, role: str) -> np.ndarray:
    try:
        arr = ensure_ndarray(buf)
    except TypeError as e:  # array.array of unicode, or no buffer protocol at all
        raise CodecTypeError(f"{role} must support the buffer protocol: {e}") from e
    if arr.dtype == object:
        raise CodecTypeError(f"{role} cannot be an object array (it holds pointers, not data)")
    return arr


def as_input(buf, role: str = "the buffer to encode") -> np.ndarray:
    """``buf`` as a numpy array (no copy); :class:`CodecTypeError` for object arrays."""
    return _as_array(buf, role)


def payload(buf) -> np.ndarray:
    """An encoded payload (any contiguous buffer) as flat uint8, no copy; object arrays:
    :class:`CodecTypeError`."""
    arr = _as_array(buf, "the payload to decode")
    return ensure_contiguous_ndarray(arr).reshape(-1).view(np.uint8)


def out_array(out, nbytes: int, what: str) -> np.ndarray:
    """``out`` as a writeable numpy array of exactly ``nbytes`` bytes, or a clear error:
    :class:`CodecTypeError` for an object array, :class:`CodecError` for a read-only buffer or
    one of another size."""
    dst = _as_array(out, "out")
    if not dst.flags.writeable:
        raise CodecError(f"out must be writeable; got a read-only {type(out).__name__}")
    if dst.nbytes != nbytes:
        raise CodecError(f"{what} payload decodes to {nbytes} bytes, out holds {dst.nbytes}")
    return dst


def copy_out(dec: np.ndarray, out, what: str):
    """Return ``dec``, or copy its bytes into ``out`` (checked by :func:`out_array`) and return
    ``out``; the bytes land in ``out``'s memory order, as with numcodecs' ``ndarray_copy``."""
    if out is None:
        return dec
    dst = out_array(out, dec.nbytes, what)
    ndarray_copy(ensure_ndarray_like(dec), dst)
    return out


def check_int(name: str, value, *, optional: bool = False) -> int | None:
    """``value`` as an int; :class:`CodecTypeError` for anything but an integer (bool included)."""
    if value is None and optional:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise CodecTypeError(f"{name} must be an integer, got {value!r} "
                             f"({type(value).__name__})")
    return int(value)


def check_real(name: str, value) -> float:
    """``value`` as a float; :class:`CodecTypeError` for anything but a real number."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise CodecTypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_bool(name: str, value) -> bool:
    """``value`` as a bool; :class:`CodecTypeError` for anything but True/False."""
    if not isinstance(value, bool | np.bool_):
        raise CodecTypeError(f"{name} must be True or False, got {value!r} "
                             f"({type(value).__name__})")
    return bool(value)
