"""BytePlanes: lossless coding of numbers by byte plane (the idea of ZipNN, Hershcovitch et al.).

The bytes of ``itemsize``-byte numbers are regrouped into planes (all first bytes, all second
bytes, ...), after a one-bit left rotation that moves a float's sign bit from its exponent byte to
its lowest mantissa byte. Each plane is then coded on its own with what pays for it:

* **Huffman** (block-adaptive, see :mod:`ckptcodecs._pkernels`): planes whose byte histogram is
  skewed -- a float's exponent byte (~2.6 of 8 bits on trained weights), the high bytes of small
  integers, the planes of an XOR delta between versions;
* **zstd** (level 1): planes with more repeated neighbours than their histogram predicts (runs of
  zero rows, repeated values) or dominated by one byte (an XOR of two close versions), where it
  beats Huffman on a sample;
* **raw**: planes that neither shrinks (a float's low mantissa bytes).

Encoded layout (little-endian), version 1::

    u8  version (1)
    u8  itemsize (1, 2, 4 or 8)
    u8  flags: bit 0 = rotated
    u8  0
    u64 n: decoded bytes (a multiple of itemsize)
    u32 block: Huffman block size in bytes
    per plane, lowest byte first:
        u8  method: 0 raw, 1 Huffman, 2 zstd
        u64 size: bytes of the payload that follows
        payload
"""

from __future__ import annotations

import struct

import numpy as np
from numcodecs import Zstd
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray

from . import _pkernels as PK
from ._buffers import as_input, check_bool, check_int, out_array, payload
from ._bytegroup import merge_planes, sample_plane, split_planes
from .errors import CodecError

__all__ = ["BytePlanes", "planes_decode", "planes_encode"]

VERSION = 1
RAW, HUFFMAN, ZSTD = 0, 1, 2
_HEAD = struct.Struct("<BBBBQI")
_PLANE = struct.Struct("<BQ")
_ITEMSIZES = (1, 2, 4, 8)
_ZSTD = Zstd(level=1)
#: zstd expands at most ~32768x (an RLE block of 128 KiB in 4 bytes)
_ZSTD_MAX_RATIO = 1 << 15
#: a plane is Huffman coded when its sampled entropy is below this share of its bytes
HUFFMAN_BELOW = 0.985
#: zstd replaces Huffman when, on a contiguous sample, it beats Huffman's size by this share
ZSTD_GAIN = 0.01
#: zstd is tried when this share of a sample's bytes more than its histogram predicts equal their
#: neighbour
EXTRA_REPEATS = 0.01
#: bytes of each sample the choice is made on
SAMPLE = 1 << 16
#: planes of at most this many bytes skip the sampling (Huffman, else raw)
SMALL = 4096


def _check_config(itemsize: int, block: int) -> None:
    """Refuse an itemsize or block no payload can have (wrong types: CodecTypeError)."""
    itemsize, block = check_int("itemsize", itemsize), check_int("block", block)
    if itemsize not in _ITEMSIZES:
        raise CodecError(f"itemsize must be one of {_ITEMSIZES}, not {itemsize!r}")
    if not 1024 <= block <= 1 << 24:
        raise CodecError(f"block must be between 1024 and 2**24 bytes, not {block!r}")


def _huffman_share(freq: np.ndarray) -> float:
    """Bytes a Huffman code of this histogram spends, as a share of the bytes counted (at least
    one bit a byte: a plane of long zero runs costs Huffman far more than its entropy)."""
    lens = np.zeros(256, np.int64)
    if freq.sum() == 0:
        return 0.0
    PK._code_lengths(freq, lens)
    return float((freq * lens).sum() / 8 / freq.sum())


def _encode_plane(plane: np.ndarray, block: int, out: np.ndarray) -> tuple[int, int]:
    """Write the cheapest of raw, Huffman and zstd for one plane into ``out``; returns
    (method, bytes written). The choice is made on samples, so that a plane that stays raw
    costs almost nothing: the entropy of a strided sample says whether Huffman pays; where a
    contiguous sample shows what order-0 Huffman misses (more equal neighbours than the histogram
    predicts, or one byte so common that Huffman's one bit a byte is most of the cost), zstd on
    the sample says whether it beats Huffman's size by more than ``ZSTD_GAIN``."""
    n = plane.size
    if n <= SMALL:  # too small for sampling to pay: Huffman it, or keep it raw
        return _huffman_or_raw(plane, block, out)
    start, length = (n - min(n, SAMPLE)) // 2, min(n, SAMPLE)
    freq = np.zeros(256, np.int64)
    strided, repeats = sample_plane(plane, max(1, n // SAMPLE), start, length, freq)
    piece = plane[start:start + length]
    p = freq / length
    if length >= 64 and (repeats / (length - 1) > float(p @ p) + EXTRA_REPEATS or p.max() > 0.5):
        z = _ZSTD.encode(piece)
        huff = _huffman_share(freq)
        if len(z) < (min(huff, 1.0) - ZSTD_GAIN) * piece.size:
            z = _ZSTD.encode(plane) if piece.size < n else z
            if len(z) < n:
                out[:len(z)] = np.frombuffer(z, np.uint8)
                return ZSTD, len(z)
    return _huffman_or_raw(plane, block, out) if strided < HUFFMAN_BELOW else _raw(plane, out)


def _huffman_or_raw(plane: np.ndarray, block: int, out: np.ndarray) -> tuple[int, int]:
    n = plane.size
    freq = np.zeros(((n + block - 1) // block, 256), np.int64)
    PK.plane_stats(plane, block, freq)
    size = PK.huffman_encode(plane, block, freq, out)
    return (HUFFMAN, size) if size < n else _raw(plane, out)


def _raw(plane: np.ndarray, out: np.ndarray) -> tuple[int, int]:
    out[:plane.size] = plane
    return RAW, plane.size


def planes_encode(data, itemsize: int = 4, rotate: bool = True,
                  block: int = 1 << 17) -> np.ndarray:
    """Encode a buffer of ``itemsize``-byte numbers to the BytePlanes layout (a uint8 array)."""
    _check_config(itemsize, block)
    src = ensure_contiguous_ndarray(as_input(data)).reshape(-1).view(np.uint8)
    if src.size % itemsize:
        raise CodecError(f"BytePlanes: {src.size} bytes are not a whole number of "
                         f"{itemsize}-byte items")
    n = src.size // itemsize
    rotate = bool(rotate) and itemsize > 1
    if itemsize == 1:
        planes = src.reshape(1, -1)
    else:
        planes = np.empty((itemsize, n), np.uint8)
        split_planes(src, itemsize, rotate, planes)
    out = np.empty(_HEAD.size + itemsize * (_PLANE.size + PK.huffman_bound(n, block)), np.uint8)
    _HEAD.pack_into(out, 0, VERSION, itemsize, int(rotate), 0, src.size, block)
    pos = _HEAD.size
    for p in range(itemsize):
        method, size = _encode_plane(planes[p], block, out[pos + _PLANE.size:])
        _PLANE.pack_into(out, pos, method, size)
        pos += _PLANE.size + size
    return out[:pos]


def planes_decode(buf, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a BytePlanes payload to uint8 (into ``out``'s bytes when given); raise
    :class:`CodecError` when it is malformed."""
    b = payload(buf)
    if b.size < _HEAD.size:
        raise CodecError(f"BytePlanes payload truncated: {b.size} bytes, header needs "
                         f"{_HEAD.size}")
    version, itemsize, flags, _, nbytes, block = _HEAD.unpack_from(b)
    if version != VERSION:
        raise CodecError(f"BytePlanes format version {version} is not supported (expected "
                         f"{VERSION}); was it written by a newer ckptcodecs?")
    _check_config(itemsize, block)
    if nbytes % itemsize or flags > 1:
        raise CodecError(f"BytePlanes header corrupted: {nbytes} bytes of {itemsize}-byte "
                         f"items, flags {flags}")
    n = nbytes // itemsize
    spans = _plane_spans(b, itemsize, n, block)  # checked before anything is allocated
    if out is None:
        dst = np.empty(nbytes, np.uint8)
    else:
        dst = out_array(out, nbytes, "BytePlanes")
        if not (dst.flags.c_contiguous or dst.flags.f_contiguous):
            raise CodecError("BytePlanes decodes into a contiguous out buffer only")
        dst = dst.reshape(-1, order="A").view(np.uint8)
    planes = dst.reshape(1, -1) if itemsize == 1 else np.empty((itemsize, n), np.uint8)
    for p, (method, start, stop) in enumerate(spans):
        _decode_plane(method, b[start:stop], block, planes[p], p)
    pos = spans[-1][2] if spans else _HEAD.size
    if pos != b.size:
        raise CodecError(f"BytePlanes payload has {b.size - pos} bytes of trailing garbage")
    if itemsize > 1:
        merge_planes(planes, itemsize, bool(flags & 1), dst)
    return dst


def _plane_spans(b: np.ndarray, itemsize: int, n: int,
                 block: int) -> list[tuple[int, int, int]]:
    """(method, start, stop) of each plane's payload; refuses a plane that cannot decode to ``n``
    bytes (a corrupted size must not make the decoder allocate without bound)."""
    pos, spans = _HEAD.size, []
    for p in range(itemsize):
        if pos + _PLANE.size > b.size:
            raise CodecError(f"BytePlanes payload truncated before plane {p}")
        method, size = _PLANE.unpack_from(b, pos)
        pos += _PLANE.size
        if size > b.size - pos:
            raise CodecError(f"BytePlanes plane {p} claims {size} bytes, "
                             f"{b.size - pos} remain")
        most = {RAW: size, HUFFMAN: (size // 2) * block, ZSTD: _ZSTD_MAX_RATIO * size}.get(method)
        if most is None:
            raise CodecError(f"BytePlanes plane {p} has unknown method {method}")
        if n > most:
            raise CodecError(f"BytePlanes header corrupted: plane {p} of {size} bytes cannot "
                             f"decode to {n} bytes")
        spans.append((method, pos, pos + size))
        pos += size
    return spans


def _decode_plane(method: int, payload: np.ndarray, block: int, plane: np.ndarray,
                  p: int) -> None:
    if method == RAW:
        if payload.size != plane.size:
            raise CodecError(f"BytePlanes raw plane {p} holds {payload.size} bytes, expected "
                             f"{plane.size}")
        plane[...] = payload
    elif method == HUFFMAN:
        used = PK.huffman_decode(payload, block, plane)
        if used != payload.size:
            raise CodecError(f"BytePlanes Huffman plane {p} is corrupted "
                             f"({'bad code' if used == PK.ERR_CODE else 'truncated'})")
    elif method == ZSTD:
        if _zstd_content_size(payload) != plane.size:
            raise CodecError(f"BytePlanes zstd plane {p} is not one zstd frame of "
                             f"{plane.size} bytes")
        try:
            _ZSTD.decode(payload, out=plane)
        except Exception as e:  # numcodecs raises RuntimeError / ValueError on bad frames
            raise CodecError(f"BytePlanes zstd plane {p} does not decode: {e}") from e


def _zstd_content_size(frame: np.ndarray) -> int:
    """The content size a zstd frame header declares (-1 when absent or not a frame)."""
    if frame.size < 6 or bytes(frame[:4]) != b"\x28\xb5\x2f\xfd":
        return -1
    fhd = int(frame[4])
    single, fcs_flag, did_flag = (fhd >> 5) & 1, fhd >> 6, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or pos + width > frame.size:
        return -1
    size = int.from_bytes(bytes(frame[pos:pos + width]), "little")
    return size + 256 if width == 2 else size


class BytePlanes(Codec):
    """Lossless bytes codec for arrays of numbers: byte planes, each Huffman, zstd or raw.

    Parameters
    ----------
    itemsize
        Bytes per number (1, 2, 4 or 8); the buffer must hold whole numbers.
    rotate
        Rotate each number left by one bit first (moves a float's sign out of its exponent
        byte; harmless for integers).
    block
        Bytes per Huffman block; each block adapts its code to its own histogram.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    >>> codec = BytePlanes(itemsize=4)
    >>> enc = codec.encode(x)
    >>> len(enc) < x.nbytes / 1.15
    True
    >>> bool((codec.decode(enc).view(np.float32) == x).all())
    True
    """

    codec_id = "ckpt.byte_planes"

    def __init__(self, itemsize: int = 4, rotate: bool = True, block: int = 1 << 17):
        _check_config(itemsize, block)
        self.itemsize, self.block = int(itemsize), int(block)
        self.rotate = check_bool("rotate", rotate)

    def encode(self, buf) -> np.ndarray:
        """Encode the bytes of ``buf`` (a whole number of ``itemsize``-byte items)."""
        return planes_encode(buf, self.itemsize, self.rotate, self.block)

    def decode(self, buf, out=None):
        """Decode ``buf``; pass ``out`` (of the size expected) when the payload is untrusted:
        without it the decoder allocates what the header claims, up to ``block / 2`` times the
        payload (a Huffman block of one byte value is two bytes)."""
        if out is None:
            return planes_decode(buf)
        planes_decode(buf, out)  # straight into out's bytes
        return out

    def __repr__(self) -> str:
        return f"BytePlanes(itemsize={self.itemsize}, rotate={self.rotate}, block={self.block})"
