"""Compiled byte grouping and plane sampling of BytePlanes.

Element ``i`` of an ``itemsize``-byte integer view, rotated left by one bit when ``rotate`` (so
the sign bit of a float leaves the exponent byte), puts its byte ``p`` at ``planes[p, i]``;
:func:`merge_planes` is the inverse; :func:`sample_plane` gathers what the choice of a plane's
coding looks at."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["merge_planes", "sample_plane", "split_planes"]


@njit(cache=True, nogil=True)
def split_planes(src, itemsize, rotate, planes):  # pragma: no cover - compiled
    """Byte planes of ``src`` (uint8, a multiple of ``itemsize`` bytes) into ``planes``."""
    n = src.size // itemsize
    bits = 8 * itemsize
    if itemsize == 4:
        u4 = src.view(np.uint32)
        for i in range(n):
            x = u4[i]
            if rotate:
                x = (x << np.uint32(1)) | (x >> np.uint32(31))
            planes[0, i] = x & 0xFF
            planes[1, i] = (x >> np.uint32(8)) & 0xFF
            planes[2, i] = (x >> np.uint32(16)) & 0xFF
            planes[3, i] = x >> np.uint32(24)
    elif itemsize == 2:
        u2 = src.view(np.uint16)
        for i in range(n):
            x = u2[i]
            if rotate:
                x = (x << np.uint16(1)) | (x >> np.uint16(15))
            planes[0, i] = x & 0xFF
            planes[1, i] = x >> np.uint16(8)
    else:
        u8 = src.view(np.uint64)
        for i in range(n):
            x = u8[i]
            if rotate:
                x = (x << np.uint64(1)) | (x >> np.uint64(bits - 1))
            for p in range(itemsize):
                planes[p, i] = (x >> np.uint64(8 * p)) & np.uint64(0xFF)


@njit(cache=True, nogil=True)
def merge_planes(planes, itemsize, rotate, dst):  # pragma: no cover - compiled
    """Inverse of :func:`split_planes`: ``planes`` back into ``dst`` (uint8)."""
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
def sample_plane(plane, step, start, length, piece):  # pragma: no cover - compiled
    """What the choice of a plane's coding looks at, in one pass: the order-0 entropy (a share
    of a byte) of the strided sample ``plane[::step]``; the histogram of the contiguous sample
    ``plane[start:start + length]`` (into ``piece``) and how many of its bytes equal their
    predecessor. Returns (entropy share, repeats)."""
    strided = np.zeros(256, np.int64)
    count = 0
    for i in range(0, plane.size, step):
        strided[plane[i]] += 1
        count += 1
    entropy = 0.0
    for v in range(256):
        if strided[v]:
            p = strided[v] / count
            entropy -= p * np.log2(p)
    repeats = 0
    prev = -1
    for i in range(start, start + length):
        v = plane[i]
        piece[v] += 1
        repeats += v == prev
        prev = v
    return entropy / 8.0, repeats
