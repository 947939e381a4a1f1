"""Dense bit packing of small unsigned codes (1..8 bits per code).

Code ``i`` occupies bits ``[i*bits, (i+1)*bits)`` of a little-endian bit stream: the first code is
in the lowest bits of the first byte. A 3-bit code takes exactly 3 bits; the last byte is padded
with zero bits.
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

from ._backend import kernels
from .errors import CodecError

__all__ = ["pack_bits", "packed_size", "unpack_bits"]


def packed_size(count: int, bits: int) -> int:
    """Number of bytes that ``count`` codes of ``bits`` bits occupy once packed."""
    return (int(count) * int(bits) + 7) // 8


@njit(cache=True, nogil=True)
def _pack(codes, bits, out):  # pragma: no cover - compiled
    acc = 0
    nacc = 0
    j = 0
    for i in range(codes.size):
        acc |= np.int64(codes[i]) << nacc
        nacc += bits
        if nacc >= 8:
            out[j] = acc & 0xFF
            acc >>= 8
            nacc -= 8
            j += 1
    if nacc > 0:
        out[j] = acc & 0xFF


@njit(cache=True, nogil=True)
def _unpack(buf, bits, count, out):  # pragma: no cover - compiled
    mask = (1 << bits) - 1
    acc = 0
    nacc = 0
    j = 0
    for i in range(count):
        if nacc < bits:
            acc |= np.int64(buf[j]) << nacc
            j += 1
            nacc += 8
        out[i] = acc & mask
        acc >>= bits
        nacc -= bits


# The implementation this process runs (ckptcodecs._backend): C, or the numba kernels above.
_K = kernels("bitpack", pack=_pack, unpack=_unpack)


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``codes`` (any unsigned integer array, values < 2**bits) into a uint8 array.

    Parameters
    ----------
    codes : ndarray
        Codes to pack; flattened in C order. Values must be below ``2**bits`` (not checked: a
        higher bit is ORed into the next code's bits).
    bits : int
        Width of one code, 1..8.

    Returns
    -------
    ndarray of uint8, ``packed_size(codes.size, bits)`` bytes.
    """
    if not 1 <= bits <= 8:
        raise CodecError(f"bits must be in 1..8, got {bits}")
    codes = np.ascontiguousarray(codes).reshape(-1).astype(np.uint8, copy=False)
    if bits == 8:
        return codes.copy()
    out = np.empty(packed_size(codes.size, bits), dtype=np.uint8)
    if codes.size:
        _K.pack(codes, bits, out)
    return out


def unpack_bits(buf: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` codes of ``bits`` bits as a uint8 array."""
    if not 1 <= bits <= 8:
        raise CodecError(f"bits must be in 1..8, got {bits}")
    if count < 0:
        raise CodecError(f"a count of codes cannot be negative, got {count}")
    buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    if buf.size < packed_size(count, bits):
        raise CodecError(
            f"packed codes truncated: {count} codes of {bits} bits need "
            f"{packed_size(count, bits)} bytes, got {buf.size}"
        )
    if bits == 8:
        return buf[:count].copy()
    out = np.empty(count, dtype=np.uint8)
    if count:
        _K.unpack(buf, bits, count, out)
    return out
