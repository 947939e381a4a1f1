"""Byte layout of one Quantize chunk (little-endian), version 1::

    u8  version (1)
    u8  method: 0 uniform-symmetric, 1 uniform-asymmetric, 2 adaptive-asymmetric, 3 kmeans
    u8  bits (1..8): width of one packed code
    u8  flags: bit 0 = prune level present, bit 1 = protect level present
    u8  dtype: 0 float32, 1 float64, 2 float16, 3 bfloat16 (decoded as its uint16 view)
    u16 nq: number of quantization levels (special levels come after them)
    u64 count: number of values
    u64 seg_len: values per segment (row / group / tensor); nseg = ceil(count / seg_len)
    u64 nprot: number of protected values
    params: uniform methods: nseg zero points, then nseg scales;
            kmeans: nseg x nq levels -- float64 when dtype is float64, float32 otherwise
    nprot x u16: protected values as bfloat16 bits, in position order
    packed codes: ceil(count * bits / 8) bytes (see ckptcodecs.bitpack)

Decoding: code ``c < nq`` -> ``zero + scale * c`` evaluated in float64 and clamped to the finite
range of the dtype (uniform), or ``codebook[c]``; ``prune_code`` -> 0; ``protect_code`` -> the next protected value; then cast to
the dtype. Every size is checked against the buffer before anything is allocated; the total must
match exactly.
"""

from __future__ import annotations

import struct

import numpy as np

from ._floats import DTYPE_CODES, dtype_code
from .bitpack import pack_bits, packed_size, unpack_bits
from .errors import CodecError
from .quantize import METHODS, QuantParams

__all__ = ["HEADER_SIZE", "VERSION", "decode_chunk", "encode_chunk"]

VERSION = 1
_HEAD = struct.Struct("<BBBBBHQQQ")
#: Bytes of the fixed header before the parameters.
HEADER_SIZE = _HEAD.size


def encode_chunk(codes: np.ndarray, p: QuantParams) -> bytes:
    """Serialise codes and their parameters into one self-contained chunk."""
    flags = int(p.has_prune) | (int(p.has_protect) << 1)
    head = _HEAD.pack(VERSION, METHODS.index(p.method), p.bits, flags, dtype_code(p.dtype), p.nq,
                      p.count, p.seg_len, p.protected.size)
    pdt = "<f8" if p.dtype == "float64" else "<f4"
    if p.method == "kmeans":
        params = p.codebook.astype(pdt).tobytes()
    else:
        params = p.zero.astype(pdt).tobytes() + p.scale.astype(pdt).tobytes()
    return b"".join([head, params, p.protected.astype("<u2").tobytes(),
                     pack_bits(codes, p.bits).tobytes()])


def decode_chunk(buf: np.ndarray) -> tuple[np.ndarray, QuantParams]:
    """Parse a chunk into ``(codes, params)``; raise CodecError on any inconsistency."""
    b = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    if b.size < _HEAD.size:
        raise CodecError(f"Quantize chunk truncated: {b.size} bytes, header needs {_HEAD.size}")
    version, method, bits, flags, dcode, nq, count, seg_len, nprot = _HEAD.unpack_from(b)
    if version != VERSION:
        raise CodecError(f"Quantize format version {version} is not supported (expected "
                         f"{VERSION}); was it written by a newer ckptcodecs?")
    if method >= len(METHODS) or not 1 <= bits <= 8 or flags > 3 or dcode not in DTYPE_CODES:
        raise CodecError("Quantize chunk header corrupted (method, bits, flags or dtype invalid)")
    has_prune, has_protect = bool(flags & 1), bool(flags & 2)
    levels = nq + has_prune + has_protect
    if nq < 1 or levels > 1 << bits:
        raise CodecError(f"Quantize chunk header corrupted: {nq} levels do not fit {bits} bits")
    if count and not 1 <= seg_len <= 1 << 48 or nprot > count or (nprot and not has_protect):
        raise CodecError("Quantize chunk header corrupted (segment length or protected count)")
    # every size below is bounded by the buffer size before allocation
    if count > 8 * b.size:
        raise CodecError(f"Quantize chunk truncated: {count} values cannot fit {b.size} bytes")
    nseg = -(-count // seg_len) if count else 0
    name = DTYPE_CODES[dcode]
    isz = 8 if name == "float64" else 4
    nparam = nseg * nq if METHODS[method] == "kmeans" else 2 * nseg
    expected = _HEAD.size + nparam * isz + 2 * nprot + packed_size(count, bits)
    if expected != b.size:
        raise CodecError(f"Quantize chunk has {b.size} bytes, its header implies {expected} "
                         "(truncated or corrupted)")
    pos = _HEAD.size
    pdt = "<f8" if isz == 8 else "<f4"
    params = b[pos:pos + nparam * isz].copy().view(pdt).astype(pdt[1:])
    pos += nparam * isz
    p = QuantParams(METHODS[method], bits, nq, has_prune, has_protect, seg_len, count, name)
    if p.method == "kmeans":
        p.codebook = params.reshape(nseg, nq)
    else:
        p.zero, p.scale = params[:nseg], params[nseg:]
    p.protected = b[pos:pos + 2 * nprot].copy().view("<u2").astype(np.uint16)
    pos += 2 * nprot
    codes = unpack_bits(b[pos:], bits, count)
    if count:
        if int(codes.max()) >= levels:
            raise CodecError("Quantize chunk corrupted: a code is outside the level range")
        if has_protect and np.count_nonzero(codes == p.protect_code) != nprot:
            raise CodecError("Quantize chunk corrupted: protected codes and values disagree")
    return codes, p
