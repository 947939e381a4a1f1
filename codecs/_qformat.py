"""Byte layout of one Quantize chunk (little-endian), versions 1 and 2.

Version 1 (``protect_mode='level'``; every chunk written before version 2 existed)::

    u8  version (1)
    u8  method: 0 uniform-symmetric, 1 uniform-asymmetric, 2 adaptive-asymmetric, 3 kmeans
    u8  bits (1..8): width of one packed code
    u8  flags: bit 0 = prune level present, bit 1 = protect level present,
               bit 2 = parameters stored as float16 (``param_dtype='float16'``)
    u8  dtype: 0 float32, 1 float64, 2 float16, 3 bfloat16 (decoded as its uint16 view)
    u16 nq: number of quantization levels (special levels come after them)
    u64 count: number of values
    u64 seg_len: values per segment (row / group / tensor); nseg = ceil(count / seg_len)
    u64 nprot: number of protected values
    params: uniform methods: nseg zero points, then nseg scales;
            kmeans: nseg x nq levels -- float16 when flag bit 2 is set, else float64 when
            dtype is float64, float32 otherwise
    nprot x u16: protected values as bfloat16 bits, in position order
    packed codes: ceil(count * bits / 8) bytes (see ckptcodecs.bitpack)

Version 2 (``protect_mode='sparse'``): protected values take no code; their positions are a list::

    u8  version (2)
    u8  method, u8 bits    -- as in version 1
    u8  flags: bit 0 = prune level present, bit 2 = float16 parameters; bit 1 may not be set
               (there is no protect level)
    u8  dtype, u16 nq, u64 count, u64 seg_len, u64 nprot    -- as in version 1
    u64 npos: bytes of the position list
    params: as in version 1
    npos bytes: the strictly increasing positions of the protected values as LEB128 varints
                (7 bits a byte, low group first, high bit = more bytes follow; at most 7 bytes
                each) of their gaps: the first position, then position[i] - position[i-1]
    nprot x u16: protected values as bfloat16 bits, in position order
    packed codes: ceil(count * bits / 8) bytes

The header is the version-1 header (same field order, 31 bytes) followed by ``npos`` (39 bytes).
In both versions the packed codes are the last bytes of a chunk, so ``chunk[:-packed_size]`` is a
parameter block that ``block + pack_bits(codes)`` turns back into a chunk (code deltas,
:mod:`ckptcodecs.qdelta`, rely on it).

Flag bit 2 (float16 parameters) was added after both versions: chunks without it are byte for
byte what they were, and a decoder older than the bit rejects such a chunk as corrupted rather
than misreading it. Decoded float16 parameters are widened (exactly) to float32 (float64 for
float64 data), the values the encoder computed the codes with.

Decoding: code ``c < nq`` -> ``zero + scale * c`` evaluated in float64 and clamped to the finite
range of the dtype (uniform), or ``codebook[c]``; ``prune_code`` -> 0; version 1:
``protect_code`` -> the next protected value; version 2: the value at each listed position is
replaced by its protected value; then cast to the dtype. Every size is checked against the buffer
before anything is allocated; the total must match exactly; version 2 positions must be strictly
increasing and below ``count``.
"""

from __future__ import annotations

import struct

import numpy as np

from ._floats import DTYPE_CODES, dtype_code
from .bitpack import pack_bits, packed_size, unpack_bits
from .errors import CodecError
from .qparams import METHODS, PARAM_DTYPES, QuantParams

__all__ = ["HEADER_SIZE", "HEADER_SIZE_V2", "VERSION", "VERSION_SPARSE", "decode_chunk",
           "decode_chunk_packed", "encode_chunk", "varint_decode", "varint_encode"]

#: Version of level-mode chunks (``protect_mode='level'``).
VERSION = 1
#: Version of sparse-protection chunks (``protect_mode='sparse'``).
VERSION_SPARSE = 2
_HEAD = struct.Struct("<BBBBBHQQQ")
_NPOS = struct.Struct("<Q")
#: Bytes of the fixed header before the parameters (version 1).
HEADER_SIZE = _HEAD.size
#: Bytes of the fixed header before the parameters (version 2: version-1 header + u64 npos).
HEADER_SIZE_V2 = _HEAD.size + _NPOS.size
_F16_FLAG = 4
_MAX_VARINT = 7  # 49 bits: more than any count a buffer can hold (count <= 8 * buffer size)


def varint_encode(values: np.ndarray) -> bytes:
    """LEB128 bytes of non-negative integers below ``2**49`` (vectorised)."""
    v = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
    if v.size == 0:
        return b""
    if int(v.max()) >> (7 * _MAX_VARINT):
        raise CodecError(f"varint value {int(v.max())} needs more than {_MAX_VARINT} bytes")
    nbytes = np.ones(v.size, np.int64)
    for k in range(1, _MAX_VARINT):
        nbytes += v >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    owner = np.repeat(np.arange(v.size), nbytes)
    k = np.arange(int(ends[-1])) - starts[owner]  # byte index within its varint
    out = ((v[owner] >> (7 * k).astype(np.uint64)) & np.uint64(0x7F)).astype(np.uint8)
    out[k < nbytes[owner] - 1] |= 0x80
    return out.tobytes()


def varint_decode(b: np.ndarray, n: int) -> np.ndarray:
    """``n`` LEB128 integers (uint64) from exactly the bytes of ``b``; CodecError otherwise."""
    b = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1)
    if b.size == 0:
        if n:
            raise CodecError(f"position list is empty, {n} positions expected")
        return np.zeros(0, np.uint64)
    last = (b & 0x80) == 0
    if not last[-1] or int(np.count_nonzero(last)) != n:
        raise CodecError("Quantize chunk corrupted: the position list does not hold "
                         f"{n} varints")
    ends = np.flatnonzero(last) + 1
    starts = np.concatenate([[0], ends[:-1]])
    if int((ends - starts).max()) > _MAX_VARINT:
        raise CodecError("Quantize chunk corrupted: a position varint is too long")
    owner = np.repeat(np.arange(n), ends - starts)
    k = (np.arange(b.size) - starts[owner]).astype(np.uint64)
    parts = (b & 0x7F).astype(np.uint64) << (np.uint64(7) * k)
    return np.add.reduceat(parts, starts)


def encode_chunk(codes: np.ndarray | None, p: QuantParams,
                 packed: np.ndarray | None = None) -> bytes:
    """Serialise codes and their parameters into one self-contained chunk (codes last).

    ``packed``: the codes already packed (:func:`ckptcodecs.pack_bits`'s layout, e.g. packed
    on a GPU), in place of ``codes``."""
    if packed is not None:
        packed = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
        if packed.size != packed_size(p.count, p.bits):
            raise CodecError(f"{packed.size} packed bytes for {p.count} codes of {p.bits} bits")
    nprot = p.protected.size
    if p.param_dtype not in PARAM_DTYPES:
        raise CodecError(f"param_dtype must be one of {PARAM_DTYPES}, got {p.param_dtype!r}")
    f16 = p.param_dtype == "float16"
    f16flag = _F16_FLAG if f16 else 0
    if p.sparse:
        if p.has_protect or p.protect_positions.size != nprot:
            raise CodecError("sparse protection needs one position per protected value and no "
                             "protect level")
        pos = np.asarray(p.protect_positions, np.int64)
        if nprot and (pos[0] < 0 or pos[-1] >= p.count or np.any(pos[1:] <= pos[:-1])):
            raise CodecError("protected positions must be strictly increasing and below count")
        gaps = np.diff(pos, prepend=0)
        posbytes = varint_encode(gaps)
        head = _HEAD.pack(VERSION_SPARSE, METHODS.index(p.method), p.bits,
                          int(p.has_prune) | f16flag, dtype_code(p.dtype), p.nq, p.count,
                          p.seg_len, nprot)
        head += _NPOS.pack(len(posbytes))
    else:
        flags = int(p.has_prune) | (int(p.has_protect) << 1) | f16flag
        head = _HEAD.pack(VERSION, METHODS.index(p.method), p.bits, flags, dtype_code(p.dtype),
                          p.nq, p.count, p.seg_len, nprot)
        posbytes = b""
    pdt = "<f2" if f16 else "<f8" if p.dtype == "float64" else "<f4"
    arrays = [p.codebook] if p.method == "kmeans" else [p.zero, p.scale]
    arrays = [np.asarray(a) for a in arrays]
    stored = [a.astype(pdt) for a in arrays]
    if f16 and not all(np.array_equal(s.astype(a.dtype), a, equal_nan=True)
                       for s, a in zip(stored, arrays)):
        raise CodecError("param_dtype='float16' needs parameters exactly representable in "
                         "float16 (quantize() rounds them before computing the codes)")
    params = b"".join(s.tobytes() for s in stored)
    body = pack_bits(codes, p.bits) if packed is None else packed
    return b"".join([head, params, posbytes, p.protected.astype("<u2").tobytes(),
                     body.tobytes()])


def decode_chunk(buf: np.ndarray) -> tuple[np.ndarray, QuantParams]:
    """Parse a chunk (version 1 or 2) into ``(codes, params)``; CodecError on any inconsistency."""
    packed, p = decode_chunk_packed(buf)
    codes = unpack_bits(packed, p.bits, p.count)
    if p.count:
        if int(codes.max()) >= p.levels:
            raise CodecError("Quantize chunk corrupted: a code is outside the level range")
        if p.has_protect and np.count_nonzero(codes == p.protect_code) != p.protected.size:
            raise CodecError("Quantize chunk corrupted: protected codes and values disagree")
    return codes, p


def decode_chunk_packed(buf: np.ndarray) -> tuple[np.ndarray, QuantParams]:
    """:func:`decode_chunk` without unpacking the codes: ``(packed codes, params)``, every size
    and parameter checked but not the codes themselves -- the caller unpacks them (on a GPU,
    say) and must check that each is below ``params.levels`` and that the protect codes are as
    many as ``params.protected``, as :func:`decode_chunk` does. The packed codes are a view of
    ``buf``."""
    b = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    if b.size < _HEAD.size:
        raise CodecError(f"Quantize chunk truncated: {b.size} bytes, header needs {_HEAD.size}")
    version, method, bits, flags, dcode, nq, count, seg_len, nprot = _HEAD.unpack_from(b)
    if version not in (VERSION, VERSION_SPARSE):
        raise CodecError(f"Quantize format version {version} is not supported (expected "
                         f"{VERSION} or {VERSION_SPARSE}); was it written by a newer ckptcodecs?")
    sparse = version == VERSION_SPARSE
    if flags & ~(_F16_FLAG | (1 if sparse else 3)):
        raise CodecError(f"Quantize chunk header has unknown flags {flags:#04x} (corrupted, or "
                         "written by a newer ckptcodecs)")
    if method >= len(METHODS) or not 1 <= bits <= 8 or dcode not in DTYPE_CODES:
        raise CodecError("Quantize chunk header corrupted (method, bits, flags or dtype invalid)")
    has_prune, has_protect = bool(flags & 1), bool(flags & 2)
    f16 = bool(flags & _F16_FLAG)
    levels = nq + has_prune + has_protect
    if nq < 1 or levels > 1 << bits:
        raise CodecError(f"Quantize chunk header corrupted: {nq} levels do not fit {bits} bits")
    if (count and not 1 <= seg_len <= 1 << 48 or nprot > count
            or (nprot and not (has_protect or sparse))):
        raise CodecError("Quantize chunk header corrupted (segment length or protected count)")
    head = _HEAD.size
    npos = 0
    if sparse:
        if b.size < HEADER_SIZE_V2:
            raise CodecError(f"Quantize chunk truncated: {b.size} bytes, header needs "
                             f"{HEADER_SIZE_V2}")
        (npos,) = _NPOS.unpack_from(b, _HEAD.size)
        head = HEADER_SIZE_V2
        if not nprot <= npos <= _MAX_VARINT * nprot:
            raise CodecError(f"Quantize chunk header corrupted: {npos} position bytes for "
                             f"{nprot} protected values")
    # every size below is bounded by the buffer size before allocation
    if count > 8 * b.size or npos > b.size:
        raise CodecError(f"Quantize chunk truncated: {count} values cannot fit {b.size} bytes")
    nseg = -(-count // seg_len) if count else 0
    name = DTYPE_CODES[dcode]
    isz = 2 if f16 else 8 if name == "float64" else 4
    nparam = nseg * nq if METHODS[method] == "kmeans" else 2 * nseg
    expected = head + nparam * isz + npos + 2 * nprot + packed_size(count, bits)
    if expected != b.size:
        raise CodecError(f"Quantize chunk has {b.size} bytes, its header implies {expected} "
                         "(truncated or corrupted)")
    pos = head
    pdt = {2: "<f2", 4: "<f4", 8: "<f8"}[isz]
    work = np.float64 if name == "float64" else np.float32  # float16 widens exactly
    params = b[pos:pos + nparam * isz].copy().view(pdt).astype(work)
    pos += nparam * isz
    p = QuantParams(METHODS[method], bits, nq, has_prune, has_protect, seg_len, count, name,
                    protect_mode="sparse" if sparse else "level",
                    param_dtype="float16" if f16 else "float32")
    if p.method == "kmeans":
        p.codebook = params.reshape(nseg, nq)
    else:
        p.zero, p.scale = params[:nseg], params[nseg:]
    if sparse:
        gaps = varint_decode(b[pos:pos + npos], nprot)
        pos += npos
        if nprot:
            # each gap is below 2**49, so a wrap-around of the sum shows as a decrease
            positions = np.cumsum(gaps, dtype=np.uint64)
            if (int(positions[-1]) >= count or np.any(gaps[1:] == 0)
                    or np.any(positions[1:] <= positions[:-1])):
                raise CodecError("Quantize chunk corrupted: protected positions are not strictly "
                                 "increasing below the value count")
            p.protect_positions = positions.astype(np.int64)
    p.protected = b[pos:pos + 2 * nprot].copy().view("<u2").astype(np.uint16)
    pos += 2 * nprot
    return b[pos:], p
