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

Encoding makes one pass that writes the planes where the layout below puts raw planes, then
looks at two samples of each plane: the byte histogram of a strided one, and of a contiguous one
how often a byte equals the next. A plane of high entropy stays where it is, untouched; a skewed
one is counted block by block, so that its code's size is known before the code is written, and
the code replaces it only if smaller; zstd is tried, on a sample first, only where the contiguous
sample shows runs or one dominant byte, and kept only if smaller than the Huffman code.

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
import threading

import numpy as np
from numcodecs import Zstd
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray

from . import _pkernels as PK
from ._buffers import as_input, check_bool, check_int, out_array, payload
from ._bytegroup import merge2, merge4, merge8, sample_rows, split_rows
from ._pdecode import huffman_decode
from ._pkernels import HUFFMAN, RAW, ZSTD
from .errors import CodecError

__all__ = ["BytePlanes", "planes_decode", "planes_decode_region", "planes_encode"]

VERSION = 1
_HEAD = struct.Struct("<BBBBQI")
_PLANE = struct.Struct("<BQ")
assert _PLANE.size == PK._PLANE
_ITEMSIZES = (1, 2, 4, 8)
_ZSTD = Zstd(level=1)
#: zstd expands at most ~32768x (an RLE block of 128 KiB in 4 bytes)
_ZSTD_MAX_RATIO = 1 << 15
#: a plane is Huffman coded when its sampled entropy is below this share of its bytes
HUFFMAN_BELOW = 0.985
#: zstd replaces Huffman when, on a contiguous sample, it beats Huffman's size by this share
ZSTD_GAIN = 0.01
#: zstd is tried when this share of the contiguous sample more than its histogram predicts equal
#: their neighbour
EXTRA_REPEATS = 0.01
#: bytes of the strided sample of each plane whose entropy says whether Huffman pays
STRIDED = 1 << 14
#: bytes of the contiguous sample of each plane whose repeated neighbours say whether to try zstd
NEAR = 1 << 14
#: the strided sample holds at most one byte in this many of a plane
SPARSE = 32
#: bytes of the contiguous samples zstd is tried on: a quick look, and the decisive sample when
#: the quick look misses the ``ZSTD_GAIN`` by less than ``CLOSE`` (or at once, on a plane that
#: one byte dominates: there zstd's matches are long, and a short sample undersells them)
QUICK, SAMPLE, CLOSE = 1 << 14, 1 << 16, 0.02
#: planes of at most this many bytes skip the sampling (Huffman if it pays, else raw)
SMALL = 4096
_NO_ZSTD = np.zeros(0, np.uint8)


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


def _zstd_pays(row: np.ndarray, quick: bool) -> bool:
    """Whether zstd, on a contiguous sample from the middle of ``row``, beats the Huffman code
    of the sample's histogram by ``ZSTD_GAIN`` of its bytes (zstd runs at ~150 MB/s on an
    exponent plane: a quick look settles most of those)."""
    for size in (QUICK, SAMPLE) if quick else (SAMPLE,):
        start, length = (row.size - min(row.size, size)) // 2, min(row.size, size)
        sample, freq = row[start:start + length], np.empty((1, 256), np.int64)
        PK.plane_stats(sample, length, freq)
        share = min(_huffman_share(freq[0]), 1.0)
        coded = len(_ZSTD.encode(sample))
        if coded < (share - ZSTD_GAIN) * length:
            return True
        if coded >= (share - ZSTD_GAIN + CLOSE) * length or length == row.size:
            return False
    return False


def _zstd_trials(rows: list[np.ndarray], freq: np.ndarray, near: np.ndarray, trials: int,
                 methods: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """zstd for the planes in the bitmask ``trials`` where it beats Huffman on a sample, and on
    the whole plane both the plane and its Huffman code (counted only when zstd is not below 3/4
    of the size the strided sample's histogram ``freq[p]`` predicts): sets ``methods[p] = ZSTD``;
    returns the payloads, one after the other, and their offsets (``zoff[p]:zoff[p + 1]``,
    empty for the others). ``near[p]``: the histogram of the contiguous sample, which says
    whether one byte dominates."""
    parts, zoff = [], np.zeros(len(rows) + 1, np.int64)
    for p, row in enumerate(rows):
        z, n = b"", row.size
        if trials >> p & 1 and _zstd_pays(row, quick=2 * near[p].max() <= near[p].sum()):
            z = _ZSTD.encode(row)
            # a close call is settled by the size of the Huffman code (counted, not written)
            if len(z) < n and (len(z) < 0.75 * _huffman_share(freq[p]) * n
                               or len(z) < PK.huffman_size(row, block)):
                methods[p] = ZSTD
            else:
                z = b""
        parts.append(z)
        zoff[p + 1] = zoff[p] + len(z)
    return np.frombuffer(b"".join(parts), np.uint8), zoff


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
    stride, base = _PLANE.size + n, _HEAD.size + _PLANE.size
    out = np.empty(_HEAD.size + itemsize * stride, np.uint8)  # every plane raw, at most
    _HEAD.pack_into(out, 0, VERSION, itemsize, int(rotate), 0, src.size, block)
    split_rows(src, itemsize, rotate, out, base, stride)
    methods, zbuf, zoff = _choose(out, base, stride, n, itemsize, block)
    return out[:PK.pack_planes(out, base, n, itemsize, block, methods, zbuf, zoff)]


def _choose(out: np.ndarray, base: int, stride: int, n: int, itemsize: int,
            block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The coding of each plane of ``out`` (:func:`ckptcodecs._pkernels.pack_planes` settles
    HUFFMAN against RAW), with the payloads of the zstd planes and their offsets."""
    methods = np.full(itemsize, HUFFMAN, np.int64)  # small planes: Huffman where it pays
    zbuf, zoff = _NO_ZSTD, np.zeros(itemsize + 1, np.int64)
    if n > SMALL:  # too small for sampling to pay
        freq, near = np.zeros((2, itemsize, 256), np.int64)
        repeats, length = np.zeros(itemsize, np.int64), min(n, NEAR)
        step = max(SPARSE, n // STRIDED)
        step += (1, 0, 3, 2, 1, 0)[step % 6]  # prime to 6: rows of 2**k * 3 numbers do not alias
        count = sample_rows(out, base, stride, n, itemsize, step, (n - length) // 2, length,
                            freq, near, repeats)
        trials = PK.choose_methods(freq, near, repeats, count, length, HUFFMAN_BELOW,
                                   EXTRA_REPEATS, methods)
        if trials:
            rows = [out[base + p * stride:base + p * stride + n] for p in range(itemsize)]
            zbuf, zoff = _zstd_trials(rows, freq, near, trials, methods, block)
    return methods, zbuf, zoff


def planes_decode(buf, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a BytePlanes payload to uint8 (into ``out``'s bytes when given); raise
    :class:`CodecError` when it is malformed."""
    b, itemsize, rotate, n, block, spans = _parse(buf)
    if out is None:
        dst = np.empty(n * itemsize, np.uint8)
    else:
        dst = out_array(out, n * itemsize, "BytePlanes")
        if not (dst.flags.c_contiguous or dst.flags.f_contiguous):
            raise CodecError("BytePlanes decodes into a contiguous out buffer only")
        dst = dst.reshape(-1, order="A").view(np.uint8)
    if itemsize == 1:
        _decode_plane(*spans[0], b, block, dst, 0)
    else:
        _merge(_sources(b, itemsize, n, block, spans), itemsize, rotate,
               dst.view(_UINT[itemsize]), 1, n, n, 0, n)
    return dst


def planes_decode_region(buf, shape: tuple[int, ...], rows: tuple[int, int],
                         cols: tuple[int, int], out: np.ndarray) -> None:
    """Decode into ``out`` only the block ``[rows[0]:rows[1], cols[0]:cols[1]]`` (whole in every
    later dimension) of the payload of an array of ``shape``: the planes are decoded, and only
    the block's items are put together, straight into ``out`` (of the block's shape and
    ``itemsize``-byte items, any strides; 1-d arrays take ``cols=(0, 1)``)."""
    b, itemsize, rotate, n, block, spans = _parse(buf)
    shape = tuple(int(d) for d in shape) or (1,)
    nrows, ncols = shape[0], shape[1] if len(shape) > 1 else 1
    depth = int(np.prod(shape[2:], dtype=np.int64))
    h, length = rows[1] - rows[0], (cols[1] - cols[0]) * depth
    if nrows * ncols * depth != n:
        raise CodecError(f"BytePlanes payload holds {n} items, not an array of shape {shape}")
    if not (0 <= rows[0] <= rows[1] <= nrows and 0 <= cols[0] <= cols[1] <= ncols):
        raise ValueError(f"block rows {rows}, columns {cols} outside an array of shape {shape}")
    if out.dtype.itemsize != itemsize or not out.flags.writeable or out.size != h * length:
        raise ValueError(f"out must be a writable block of {h * length} items of {itemsize} "
                         f"bytes")
    sources = _sources(b, itemsize, n, block, spans)
    src, src_pitch = (rows[0] * ncols + cols[0]) * depth, ncols * depth
    flat, pitch = _run_view(out.view(_UINT[itemsize]), h, length)
    if flat is None:  # runs that are not one block of memory each: through a buffer
        tmp = np.empty((h, length), out.dtype)
        planes_decode_region(buf, shape, rows, cols, tmp)
        out[...] = tmp.reshape(out.shape)
    elif itemsize == 1:
        whole = sources[0]
        for r in range(h) if h * length else ():
            flat[r * pitch:r * pitch + length] = whole[src + r * src_pitch:][:length]
    else:
        _merge(sources, itemsize, rotate, flat, h, length, pitch, src, src_pitch)


def _run_view(dst: np.ndarray, h: int, length: int) -> tuple[np.ndarray | None, int]:
    """``dst`` (``h * length`` items) as one 1-d contiguous array spanning its memory and the
    item pitch of its runs of ``length`` items, or ``(None, 0)`` when its runs are not
    contiguous."""
    if h == 0 or length == 0:
        return np.zeros(0, dst.dtype), 0
    runs = dst.view()
    try:
        runs.shape = (h, length)  # a view of any strides, never a copy
    except AttributeError:
        return None, 0
    step, item = runs.strides[0], dst.itemsize
    if runs.strides[1] != item and length > 1 or step % item or step < 0 or (
            h > 1 and step < length * item):
        return None, 0
    pitch = step // item if h > 1 else length
    span = (h - 1) * pitch + length
    return np.lib.stride_tricks.as_strided(runs, (span,), (item,), writeable=True), pitch


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SCRATCH = threading.local()
#: decoded planes of chunks up to this size reuse a buffer per thread (no page faults)
_SCRATCH_MAX = 1 << 24


def _parse(buf) -> tuple[np.ndarray, int, bool, int, int, list[tuple[int, int, int]]]:
    """The payload's bytes, itemsize, rotation, items, Huffman block and plane spans, every
    field checked before anything is allocated."""
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
    spans = _plane_spans(b, itemsize, n, block)
    pos = spans[-1][2] if spans else _HEAD.size
    if pos != b.size:
        raise CodecError(f"BytePlanes payload has {b.size - pos} bytes of trailing garbage")
    return b, itemsize, bool(flags & 1), n, block, spans


def _sources(b: np.ndarray, itemsize: int, n: int, block: int,
             spans: list[tuple[int, int, int]]) -> list[np.ndarray]:
    """Each plane's ``n`` bytes: a raw plane where the payload holds it, a coded one decoded
    into this thread's scratch buffer (valid until the thread's next decode)."""
    coded = sum(method != RAW for method, _, _ in spans)
    scratch = _scratch(coded * n)
    out, k = [], 0
    for p, (method, start, stop) in enumerate(spans):
        if method == RAW:
            if stop - start != n:
                raise CodecError(f"BytePlanes raw plane {p} holds {stop - start} bytes, "
                                 f"expected {n}")
            out.append(b[start:stop])
        else:
            plane = scratch[k * n:(k + 1) * n]
            _decode_plane(method, start, stop, b, block, plane, p)
            out.append(plane)
            k += 1
    return out


def _scratch(nbytes: int) -> np.ndarray:
    if nbytes > _SCRATCH_MAX:
        return np.empty(nbytes, np.uint8)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < nbytes:
        buf = _SCRATCH.buf = np.empty(max(nbytes, 1 << 20), np.uint8)
    return buf


def _merge(sources: list[np.ndarray], itemsize: int, rotate: bool, *runs: int) -> None:
    """Put the planes' items together into ``runs`` (see :func:`merge2`)."""
    if itemsize == 2:
        merge2(sources[0], sources[1], rotate, *runs)
    elif itemsize == 4:
        merge4(*sources, rotate, *runs)
    else:
        merge8(np.stack(sources), rotate, *runs)


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


def _decode_plane(method: int, start: int, stop: int, b: np.ndarray, block: int,
                  plane: np.ndarray, p: int) -> None:
    """Decode plane ``p`` (``b[start:stop]``, coded with ``method``) into ``plane``."""
    payload = b[start:stop]
    if method == RAW:
        if payload.size != plane.size:
            raise CodecError(f"BytePlanes raw plane {p} holds {payload.size} bytes, expected "
                             f"{plane.size}")
        plane[...] = payload
    elif method == HUFFMAN:
        used = huffman_decode(payload, block, plane)
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
