"""Compiled byte grouping and plane sampling of BytePlanes.

Element ``i`` of an ``itemsize``-byte integer view, rotated left by one bit when ``rotate`` (so
the sign bit of a float leaves the exponent byte), puts its byte ``p`` at row ``p``, column ``i``
of the planes: :func:`split_rows` writes the rows into one buffer, where the encoder lays them out
(a raw plane is then already in place); :func:`merge2`, :func:`merge4` and :func:`merge8` are
the inverse, into the whole array or a block of its rows and columns; :func:`sample_rows`
gathers, in one pass over strided samples, what the choice of each plane's coding looks at."""

from __future__ import annotations

import numpy as np
from ._jit import njit

from ._backend import kernels

__all__ = ["merge2", "merge4", "merge8", "sample_rows", "split_rows"]


@njit(cache=True, nogil=True)
def _split2(u2, rotate, p0, p1):  # pragma: no cover - compiled
    for i in range(u2.size):  # one row per argument: LLVM vectorizes the loop
        x = u2[i]
        if rotate:
            x = (x << np.uint16(1)) | (x >> np.uint16(15))
        p0[i] = x & 0xFF
        p1[i] = x >> np.uint16(8)


@njit(cache=True, nogil=True)
def _split4(u4, rotate, p0, p1, p2, p3):  # pragma: no cover - compiled
    for i in range(u4.size):
        x = u4[i]
        if rotate:
            x = (x << np.uint32(1)) | (x >> np.uint32(31))
        p0[i] = x & 0xFF
        p1[i] = (x >> np.uint32(8)) & 0xFF
        p2[i] = (x >> np.uint32(16)) & 0xFF
        p3[i] = x >> np.uint32(24)


@njit(cache=True, nogil=True)
def split_rows(src, itemsize, rotate, out, base, stride):  # pragma: no cover - compiled
    """Byte planes of ``src`` (uint8, a multiple of ``itemsize`` bytes) into ``out``: plane
    ``p`` at ``out[base + p * stride:][:n]`` (``stride >= n``)."""
    n = src.size // itemsize
    if itemsize == 1:
        out[base:base + n] = src
    elif itemsize == 2:
        _split2(src.view(np.uint16), rotate, out[base:base + n],
                out[base + stride:base + stride + n])
    elif itemsize == 4:
        _split4(src.view(np.uint32), rotate, out[base:base + n],
                out[base + stride:base + stride + n], out[base + 2 * stride:base + 2 * stride + n],
                out[base + 3 * stride:base + 3 * stride + n])
    else:
        u8 = src.view(np.uint64)
        for i in range(n):
            x = u8[i]
            if rotate:
                x = (x << np.uint64(1)) | (x >> np.uint64(63))
            for p in range(itemsize):
                out[base + p * stride + i] = (x >> np.uint64(8 * p)) & np.uint64(0xFF)


@njit(cache=True, nogil=True)
def merge2(p0, p1, rotate, dst, rows, length, pitch, src, src_pitch):  # pragma: no cover
    """Inverse of :func:`split_rows` for 2-byte items, run by run: ``rows`` runs of ``length``
    items, run ``r`` from item ``src + r * src_pitch`` of the planes ``p0``, ``p1`` (each its own
    buffer: raw planes are read where they are stored) to ``dst[r * pitch:]`` (uint16). Unsigned
    indices: LLVM vectorizes the runs."""
    for r in range(np.uint64(rows)):
        d, s = r * np.uint64(pitch), np.uint64(src) + r * np.uint64(src_pitch)
        for j in range(np.uint64(length)):
            x = np.uint16(p0[s + j]) | (np.uint16(p1[s + j]) << np.uint16(8))
            if rotate:
                x = (x >> np.uint16(1)) | (x << np.uint16(15))
            dst[d + j] = x


@njit(cache=True, nogil=True)
def _word(p0, p1, p2, p3, i):  # pragma: no cover - compiled
    """The 32-bit word whose bytes, lowest first, are ``p0[i]`` .. ``p3[i]``."""
    return (np.uint32(p0[i]) | (np.uint32(p1[i]) << np.uint32(8))
            | (np.uint32(p2[i]) << np.uint32(16)) | (np.uint32(p3[i]) << np.uint32(24)))


@njit(cache=True, nogil=True)
def merge4(p0, p1, p2, p3, rotate, dst, rows, length, pitch, src,
           src_pitch):  # pragma: no cover - compiled
    """:func:`merge2` for 4-byte items (``dst`` uint32)."""
    for r in range(np.uint64(rows)):
        d, s = r * np.uint64(pitch), np.uint64(src) + r * np.uint64(src_pitch)
        for j in range(np.uint64(length)):
            x = _word(p0, p1, p2, p3, s + j)
            if rotate:
                x = (x >> np.uint32(1)) | (x << np.uint32(31))
            dst[d + j] = x


@njit(cache=True, nogil=True)
def merge8(p0, p1, p2, p3, p4, p5, p6, p7, rotate, dst, rows, length, pitch, src,
           src_pitch):  # pragma: no cover - compiled
    """:func:`merge2` for 8-byte items (``dst`` uint64)."""
    for r in range(np.uint64(rows)):
        d, s = r * np.uint64(pitch), np.uint64(src) + r * np.uint64(src_pitch)
        for j in range(np.uint64(length)):
            x = (np.uint64(_word(p0, p1, p2, p3, s + j))
                 | (np.uint64(_word(p4, p5, p6, p7, s + j)) << np.uint64(32)))
            if rotate:
                x = (x >> np.uint64(1)) | (x << np.uint64(63))
            dst[d + j] = x


@njit(cache=True, nogil=True)
def sample_rows(out, base, stride, n, itemsize, step, start, length, freq, near,
                repeats):  # pragma: no cover - compiled
    """What the choice of each plane's coding looks at, for the planes that :func:`split_rows`
    wrote: the histogram of the strided sample ``plane[::step]`` into ``freq[p]``; the histogram
    of the contiguous sample ``plane[start:start + length]`` into ``near[p]``, and how many of its
    bytes equal their predecessor into ``repeats[p]``. Returns the size of the strided sample."""
    count = 0
    lanes = np.zeros((4, 256), np.int64)  # 4 counters a byte: a run does not wait on itself
    for p in range(itemsize):
        row = out[base + p * stride:base + p * stride + n]
        h = freq[p]
        count = same = 0
        for i in range(0, n, step):
            h[row[i]] += 1
            count += 1
        lanes[:] = 0
        i = start
        while i + 4 <= start + length:
            a, b, c, d = row[i], row[i + 1], row[i + 2], row[i + 3]
            lanes[0, a] += 1
            lanes[1, b] += 1
            lanes[2, c] += 1
            lanes[3, d] += 1
            same += (a == b) + (b == c) + (c == d)
            if i + 4 < start + length:
                same += d == row[i + 4]
            i += 4
        for k in range(i, start + length):
            lanes[0, row[k]] += 1
            if k + 1 < start + length:
                same += row[k] == row[k + 1]
        for v in range(256):
            near[p, v] += lanes[0, v] + lanes[1, v] + lanes[2, v] + lanes[3, v]
        repeats[p] = same
    return count


# The implementation this process runs (ckptcodecs._backend): C, or the numba kernels above.
_K = kernels("bytegroup", split_rows=split_rows, merge2=merge2, merge4=merge4, merge8=merge8,
             sample_rows=sample_rows)
split_rows, merge2, merge4, merge8, sample_rows = (
    _K.split_rows, _K.merge2, _K.merge4, _K.merge8, _K.sample_rows)
