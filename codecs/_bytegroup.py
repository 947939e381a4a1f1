"""Compiled byte grouping and plane sampling of BytePlanes.

Element ``i`` of an ``itemsize``-byte integer view, rotated left by one bit when ``rotate`` (so
the sign bit of a float leaves the exponent byte), puts its byte ``p`` at row ``p``, column ``i``
of the planes: :func:`split_rows` writes the rows into one buffer, where the encoder lays them out
(a raw plane is then already in place); :func:`merge_planes` is the inverse, from a
``planes[itemsize, n]`` array; :func:`sample_rows` gathers, in one pass over strided samples,
what the choice of each plane's coding looks at."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["merge_planes", "sample_rows", "split_rows"]


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
def merge_planes(planes, itemsize, rotate, dst):  # pragma: no cover - compiled
    """Inverse of :func:`split_rows`: ``planes[itemsize, n]`` back into ``dst`` (uint8)."""
    n = dst.size // itemsize
    if itemsize == 4:
        u4 = dst.view(np.uint32)
        for i in range(n):
            x = (np.uint32(planes[0, i]) | (np.uint32(planes[1, i]) << np.uint32(8))
                 | (np.uint32(planes[2, i]) << np.uint32(16))
                 | (np.uint32(planes[3, i]) << np.uint32(24)))
            if rotate:
                x = (x >> np.uint32(1)) | (x << np.uint32(31))
            u4[i] = x
    elif itemsize == 2:
        u2 = dst.view(np.uint16)
        for i in range(n):
            x = np.uint16(planes[0, i]) | (np.uint16(planes[1, i]) << np.uint16(8))
            if rotate:
                x = (x >> np.uint16(1)) | (x << np.uint16(15))
            u2[i] = x
    else:
        u8 = dst.view(np.uint64)
        for i in range(n):
            x = np.uint64(0)
            for p in range(itemsize):
                x |= np.uint64(planes[p, i]) << np.uint64(8 * p)
            if rotate:
                x = (x >> np.uint64(1)) | (x << np.uint64(63))
            u8[i] = x


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
