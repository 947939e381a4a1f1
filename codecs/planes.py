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

Encoded layout (little-endian), version 1 (a whole number of items) or 2 (a tail)::

    u8  version: 1 when n is a multiple of itemsize, else 2
    u8  itemsize (1, 2, 4 or 8)
    u8  flags: bit 0 = rotated
    u8  0
    u64 n: decoded bytes
    u32 block: Huffman block size in bytes
    per plane, lowest byte first (each plane holds n // itemsize bytes):
        u8  method: 0 raw, 1 Huffman, 2 zstd
        u64 size: bytes of the payload that follows
        payload
    version 2 only: the last n % itemsize bytes of the buffer, raw (1 to itemsize - 1 bytes)

Buffers of whole items are written as version 1, byte for byte as before version 2 existed;
version 2 takes any buffer (numcodecs' own test arrays include a 110-byte bool array).
"""

from __future__ import annotations

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray

from ._backend import CHOICE, native
from ._buffers import aligned_empty, as_input, check_bool, payload
from ._bytegroup import sample_rows, split_rows
from ._pkernels import HUFFMAN, RAW, ZSTD
from ._planes_decode import (_HEAD, _PLANE, _ZSTD, VERSION, VERSION_TAIL, _K, _check_config,
                             planes_decode, planes_decode_region)
from .errors import CodecError

__all__ = ["BytePlanes", "planes_decode", "planes_decode_region", "planes_encode"]

#: a plane is Huffman coded when its sampled entropy is below this share of its bytes: one that
#: would save under 2 % of itself stays raw, as its code costs about 40 % of a float32 chunk's
#: encode time for under 0.5 % of the chunk (0.985 until issue 28: the synthetic benchmark
#: state's lowest plane, at 0.9845, was coded for 1.4 % of it; zipnn leaves planes that save under
#: 5 % raw, which would lose 3 % on Adam moments with a tenth of zeros, at 0.955)
HUFFMAN_BELOW = 0.98
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


def _huffman_share(freq: np.ndarray) -> float:
    """Bytes a Huffman code of this histogram spends, as a share of the bytes counted (at least
    one bit a byte: a plane of long zero runs costs Huffman far more than its entropy)."""
    lens = np.empty(256, np.int64)  # code_lengths sets all 256 (np.zeros hands the GIL over)
    if freq.sum() == 0:
        return 0.0
    _K.code_lengths(freq, lens)
    return float((freq * lens).sum() / 8 / freq.sum())


def huffman_share(data: np.ndarray) -> float:
    """Bytes a Huffman code of the byte histogram of ``data`` (uint8, 1-d, not empty) spends,
    as a share of its bytes."""
    freq = np.empty((1, 256), np.int64)
    _K.plane_stats(data, data.size, freq)
    return _huffman_share(freq[0])


def _zstd_pays(row: np.ndarray, quick: bool) -> bool:
    """Whether zstd, on a contiguous sample from the middle of ``row``, beats the Huffman code
    of the sample's histogram by ``ZSTD_GAIN`` of its bytes (zstd runs at ~150 MB/s on an
    exponent plane: a quick look settles most of those)."""
    for size in (QUICK, SAMPLE) if quick else (SAMPLE,):
        start, length = (row.size - min(row.size, size)) // 2, min(row.size, size)
        sample, freq = row[start:start + length], np.empty((1, 256), np.int64)
        _K.plane_stats(sample, length, freq)
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
                               or len(z) < _K.huffman_size(row, block)):
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
    n, tail = divmod(src.size, itemsize)
    rotate = bool(rotate) and itemsize > 1
    stride, base = _PLANE.size + n, _HEAD.size + _PLANE.size
    out = aligned_empty(_HEAD.size + itemsize * stride + tail)  # every plane raw, at most
    version = VERSION_TAIL if tail else VERSION  # whole items: version 1, byte for byte
    _HEAD.pack_into(out, 0, version, itemsize, int(rotate), 0, src.size, block)
    step = start = length = 0  # small planes: no sampling, Huffman where it pays
    if n > SMALL:  # too small for sampling to pay
        length = min(n, NEAR)
        step = max(SPARSE, n // STRIDED)
        step += (1, 0, 3, 2, 1, 0)[step % 6]  # prime to 6: rows of 2**k * 3 numbers do not alias
        start = (n - length) // 2
    # filled by the layout (np.empty: np.zeros of more than 1 KB hands the GIL over)
    freq, near = np.empty((2, itemsize, 256), np.int64)
    repeats, methods = np.empty(itemsize, np.int64), np.empty(itemsize, np.int64)
    end, trials = _layout(src[:n * itemsize], itemsize, rotate, out, base, stride, step, start,
                          length, freq, near, repeats, methods, block, HUFFMAN_BELOW,
                          EXTRA_REPEATS)
    if end < 0:  # zstd tried where the samples say it may pay, then the planes laid out
        rows = [out[base + p * stride:base + p * stride + n] for p in range(itemsize)]
        zbuf, zoff = _zstd_trials(rows, freq, near, trials, methods, block)
        end = _K.pack_planes(out, base, n, itemsize, block, methods, zbuf, zoff)
    out[end:end + tail] = src[n * itemsize:]
    return out[:end + tail]


def _layout_steps(src: np.ndarray, itemsize: int, rotate: bool, out: np.ndarray, base: int,
                  stride: int, step: int, start: int, length: int, freq: np.ndarray,
                  near: np.ndarray, repeats: np.ndarray, methods: np.ndarray, block: int,
                  below: float, extra: float) -> tuple[int, int]:
    """The planes of ``src`` into ``out`` (plane ``p`` at ``base + p * stride``), the coding of
    each from samples of ``length`` bytes (none when 0: Huffman where it pays) into
    ``methods``, and, where no plane asks for a zstd trial (the bitmask ``trials``), the planes
    laid out: ``(end of the last plane, 0)``, else ``(-1, trials)``. The C kernel
    ``planes_encode_layout`` runs the same steps in one call."""
    split_rows(src, itemsize, rotate, out, base, stride)
    methods[:] = HUFFMAN
    trials = 0
    if length:
        freq[:] = 0
        near[:] = 0
        count = sample_rows(out, base, stride, stride - _PLANE.size, itemsize, step, start,
                            length, freq, near, repeats)
        trials = _K.choose_methods(freq, near, repeats, count, length, below, extra, methods)
    if trials:
        return -1, trials
    return _K.pack_planes(out, base, stride - _PLANE.size, itemsize, block, methods, _NO_ZSTD,
                          np.zeros(itemsize + 1, np.int64)), 0


#: BytePlanes' encode steps in one call where the kernels are C (one release of the GIL, not
#: four), else the steps one by one
_layout = native().planes_encode_layout if CHOICE == "c" else _layout_steps


class BytePlanes(Codec):
    """Lossless bytes codec for arrays of numbers: byte planes, each Huffman, zstd or raw.

    Parameters
    ----------
    itemsize
        Bytes per number (1, 2, 4 or 8); a buffer that ends in part of a number keeps that
        tail raw.
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
        """Encode the bytes of ``buf`` (``itemsize``-byte items and a raw tail, if any)."""
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
