"""Compiled kernels of BytePlanes: plane split/merge and a block-adaptive byte Huffman coder.

Planes: element ``i`` of an ``itemsize``-byte integer view, rotated left by one bit when ``rotate``
(so the sign bit of a float leaves the exponent byte), puts its byte ``p`` at ``planes[p, i]``.

Huffman: a plane is cut into blocks of ``block`` bytes, each with its own canonical code of at most
``MAX_LEN`` bits, written least significant bit first (so the decoder peeks the low bits of its
buffer and one lookup in a ``2**MAX_LEN`` table decodes a symbol). Block layout::

    u8 lo, u8 hi          used symbols lie in lo..hi (a block of one symbol: lo == hi, no bits)
    ceil((hi-lo+1)/2) B   code lengths, 4 bits each, low nibble first (0: symbol unused)
    u32 nbytes            bytes of the bit stream that follows (absent when lo == hi)
    nbytes B              the bit stream

Every kernel checks what it reads against the buffer, so a corrupted payload yields an error code,
never a read or write out of bounds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["ERR_CODE", "ERR_TRUNCATED", "MAX_LEN", "huffman_decode", "huffman_encode",
           "huffman_bound", "merge_planes", "plane_stats", "split_planes"]

MAX_LEN = 12
ERR_TRUNCATED = -1  # a table or bit stream runs past the end of the payload
ERR_CODE = -2       # a code table that is no prefix code, or bits that are no code


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
def plane_stats(plane, block, freq):  # pragma: no cover - compiled
    """Byte histograms of each block of ``plane`` into ``freq[nblocks, 256]``."""
    n = plane.size
    h = np.zeros((4, 256), np.int64)  # four interleaved histograms: no store-to-load stalls
    for b in range((n + block - 1) // block):
        start = b * block
        stop = min(n, start + block)
        h[:] = 0
        i = start
        while i + 4 <= stop:
            h[0, plane[i]] += 1
            h[1, plane[i + 1]] += 1
            h[2, plane[i + 2]] += 1
            h[3, plane[i + 3]] += 1
            i += 4
        while i < stop:
            h[0, plane[i]] += 1
            i += 1
        for v in range(256):
            freq[b, v] = h[0, v] + h[1, v] + h[2, v] + h[3, v]


@njit(cache=True, nogil=True)
def _code_lengths(freq, lens):  # pragma: no cover - compiled
    """Huffman code lengths of the 256 byte frequencies into ``lens``, at most MAX_LEN bits
    (frequencies are halved until the longest code fits)."""
    f = freq.astype(np.int64).copy()
    while True:
        used = np.flatnonzero(f > 0)
        m = used.size
        lens[:] = 0
        if m == 1:
            lens[used[0]] = 1
            return
        order = used[np.argsort(f[used], kind="mergesort")]
        # two-queue Huffman on sorted weights: leaves then internal nodes, parents recorded
        w = np.empty(2 * m, np.int64)
        parent = np.zeros(2 * m, np.int64)
        for k in range(m):
            w[k] = f[order[k]]
        leaf, node, nxt = 0, m, m
        while nxt < 2 * m - 1:
            if leaf < m and (node >= nxt or w[leaf] <= w[node]):
                a = leaf
                leaf += 1
            else:
                a = node
                node += 1
            if leaf < m and (node >= nxt or w[leaf] <= w[node]):
                c = leaf
                leaf += 1
            else:
                c = node
                node += 1
            w[nxt] = w[a] + w[c]
            parent[a] = nxt
            parent[c] = nxt
            nxt += 1
        depth = np.zeros(2 * m, np.int64)
        for k in range(2 * m - 3, -1, -1):
            depth[k] = depth[parent[k]] + 1
        longest = 0
        for k in range(m):
            lens[order[k]] = depth[k]
            longest = max(longest, depth[k])
        if longest <= MAX_LEN:
            return
        for s in used:
            f[s] = (f[s] + 1) // 2


@njit(cache=True, nogil=True)
def _canonical(lens, codes):  # pragma: no cover - compiled
    """LSB-first (bit-reversed) canonical codes of ``lens`` into ``codes``."""
    code = 0
    for length in range(1, MAX_LEN + 1):
        for s in range(256):
            if lens[s] == length:
                rev = 0
                c = code
                for _ in range(length):
                    rev = (rev << 1) | (c & 1)
                    c >>= 1
                codes[s] = rev
                code += 1
        code <<= 1


@njit(cache=True, nogil=True)
def huffman_bound(n, block):  # pragma: no cover - compiled
    """Bytes :func:`huffman_encode` may write for ``n`` bytes (worst case, all tables full)."""
    nblocks = (n + block - 1) // block
    return nblocks * (2 + 128 + 4 + 8) + (n * MAX_LEN + 7) // 8


@njit(cache=True, nogil=True)
def huffman_encode(plane, block, freq, out):  # pragma: no cover - compiled
    """Encode ``plane`` with the block histograms ``freq`` (from :func:`plane_stats`) into
    ``out``; returns the bytes written."""
    n = plane.size
    pos = 0
    lens = np.zeros(256, np.uint64)
    lens64 = np.zeros(256, np.int64)
    codes = np.zeros(256, np.uint64)
    words = np.empty((block * MAX_LEN) // 32 + 2, np.uint32)
    table = np.zeros(256, np.uint64)
    low = np.uint64(0xFFFFFFFF)
    for b in range((n + block - 1) // block):
        start = b * block
        stop = min(n, start + block)
        _code_lengths(freq[b], lens64)
        lens[:] = lens64
        lo, hi = 0, 255
        while lens64[lo] == 0:
            lo += 1
        while lens64[hi] == 0:
            hi -= 1
        out[pos] = lo
        out[pos + 1] = hi
        pos += 2
        if lo == hi:
            continue
        for s in range(lo, hi + 1, 2):
            v = lens64[s]
            if s + 1 <= hi:
                v |= lens64[s + 1] << 4
            out[pos] = v
            pos += 1
        _canonical(lens64, codes)
        for v in range(256):  # one load per symbol: code | length << 32
            table[v] = codes[v] | (lens[v] << np.uint64(32))
        # the bits go to an aligned word buffer first: one 32-bit store per word
        nwords = 0
        acc = np.uint64(0)
        nbits = np.uint64(0)
        i = start
        while i < stop:  # two symbols (<= 24 bits) per flush: at most 55 bits in acc
            e = table[plane[i]]
            acc |= (e & low) << nbits
            nbits += e >> np.uint64(32)
            if i + 1 < stop:
                e = table[plane[i + 1]]
                acc |= (e & low) << nbits
                nbits += e >> np.uint64(32)
            i += 2
            words[nwords] = np.uint32(acc & np.uint64(0xFFFFFFFF))  # kept when 32 bits are full
            full = nbits >> np.uint64(5)
            nwords += full
            acc >>= full << np.uint64(5)
            nbits &= np.uint64(31)
        size = 4 * nwords + (np.int64(nbits) + 7) // 8
        for k in range(4):
            out[pos + k] = (size >> (8 * k)) & 0xFF
        pos += 4
        out[pos:pos + 4 * nwords] = words[:nwords].view(np.uint8)
        pos += 4 * nwords
        while nbits > 0:
            out[pos] = np.uint8(acc & np.uint64(0xFF))
            pos += 1
            acc >>= np.uint64(8)
            nbits = nbits - np.uint64(8) if nbits > 8 else np.uint64(0)
    return pos


@njit(cache=True, nogil=True)
def huffman_decode(buf, block, plane):  # pragma: no cover - compiled
    """Decode ``buf`` into ``plane`` (its size says how many bytes); returns the bytes of
    ``buf`` consumed, or an ``ERR_*`` code."""
    n = plane.size
    pos = 0
    size = buf.size
    lens = np.zeros(256, np.int64)
    codes = np.zeros(256, np.uint64)
    lut = np.zeros(1 << MAX_LEN, np.uint16)  # symbol | code length << 8
    mask = np.uint64((1 << MAX_LEN) - 1)
    for b in range((n + block - 1) // block):
        start = b * block
        stop = min(n, start + block)
        if pos + 2 > size:
            return ERR_TRUNCATED
        lo = np.int64(buf[pos])
        hi = np.int64(buf[pos + 1])
        pos += 2
        if lo > hi:
            return ERR_CODE
        if lo == hi:
            plane[start:stop] = lo
            continue
        ntab = (hi - lo + 2) // 2
        if pos + ntab + 4 > size:
            return ERR_TRUNCATED
        lens[:] = 0
        kraft = 0
        for s in range(lo, hi + 1):
            v = np.int64(buf[pos + (s - lo) // 2])
            length = (v >> 4) if (s - lo) % 2 else (v & 0xF)
            if length > MAX_LEN:
                return ERR_CODE
            lens[s] = length
            if length:
                kraft += 1 << (MAX_LEN - length)
        pos += ntab
        if kraft > (1 << MAX_LEN):
            return ERR_CODE
        nbytes = (np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8)
                  | (np.int64(buf[pos + 2]) << 16) | (np.int64(buf[pos + 3]) << 24))
        pos += 4
        if pos + nbytes > size:
            return ERR_TRUNCATED
        _canonical(lens, codes)
        lut[:] = 0
        for s in range(lo, hi + 1):
            length = lens[s]
            if length:
                for k in range(np.int64(codes[s]), 1 << MAX_LEN, 1 << length):
                    lut[k] = s | (length << 8)
        end = pos + nbytes
        acc = np.uint64(0)
        nbits = 0
        i = start
        while i < stop:
            if nbits < 2 * MAX_LEN:  # refill: 4 bytes at once, byte by byte at the end
                if pos + 4 <= end:
                    acc |= (np.uint64(buf[pos]) | (np.uint64(buf[pos + 1]) << np.uint64(8))
                            | (np.uint64(buf[pos + 2]) << np.uint64(16))
                            | (np.uint64(buf[pos + 3]) << np.uint64(24))) << np.uint64(nbits)
                    pos += 4
                    nbits += 32
                else:
                    while nbits <= 56 and pos < end:
                        acc |= np.uint64(buf[pos]) << np.uint64(nbits)
                        pos += 1
                        nbits += 8
            for _ in range(2):  # nbits >= 2 * MAX_LEN here, except at the end of the stream
                if i == stop:
                    break
                e = lut[acc & mask]
                length = np.int64(e >> 8)
                if length == 0 or length > nbits:
                    return ERR_CODE if length == 0 else ERR_TRUNCATED
                plane[i] = e & 0xFF
                i += 1
                acc >>= np.uint64(length)
                nbits -= length
        if nbits >= 8 or pos != end:
            return ERR_CODE  # bytes left over: the stream does not match the block
    return pos
