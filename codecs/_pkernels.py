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


# Hot loops index with uint64: numba then skips its negative-index wraparound code, and LLVM fuses
# the eight byte accesses of _load64/_store64 into one unaligned 8-byte load or store.
_3, _7, _8, _56, _63 = np.uint64(3), np.uint64(7), np.uint64(8), np.uint64(56), np.uint64(63)
_BYTE = np.uint64(0xFF)
_MASK = np.uint64((1 << MAX_LEN) - 1)


@njit(cache=True, nogil=True)
def _load64(buf, p):  # pragma: no cover - compiled
    """Little-endian u64 at byte ``p`` of ``buf`` (the caller checks ``p + 8 <= buf.size``)."""
    p = np.uint64(p)
    x = np.uint64(0)
    for k in range(8):  # unrolled and fused by LLVM
        x |= np.uint64(buf[p + np.uint64(k)]) << np.uint64(8 * k)
    return x


@njit(cache=True, nogil=True)
def _store64(buf, p, x):  # pragma: no cover - compiled
    """Store ``x`` little-endian at byte ``p`` of ``buf`` (``p + 8 <= buf.size``)."""
    p = np.uint64(p)
    for k in range(8):
        buf[p + np.uint64(k)] = (x >> np.uint64(8 * k)) & _BYTE


@njit(cache=True, nogil=True)
def plane_stats(plane, block, freq):  # pragma: no cover - compiled
    """Byte histograms of each block of ``plane`` into ``freq[nblocks, 256]``."""
    n = plane.size
    h = np.zeros((4, 256), np.uint32)  # four interleaved histograms: no store-to-load stalls
    for b in range((n + block - 1) // block):
        start = b * block
        stop = min(n, start + block)
        h[:] = 0
        i = start
        while i + 8 <= stop:  # one 8-byte load, its bytes spread over the four histograms
            x = _load64(plane, i)
            h[0, x & _BYTE] += 1
            h[1, (x >> np.uint64(8)) & _BYTE] += 1
            h[2, (x >> np.uint64(16)) & _BYTE] += 1
            h[3, (x >> np.uint64(24)) & _BYTE] += 1
            h[0, (x >> np.uint64(32)) & _BYTE] += 1
            h[1, (x >> np.uint64(40)) & _BYTE] += 1
            h[2, (x >> np.uint64(48)) & _BYTE] += 1
            h[3, x >> _56] += 1
            i += 8
        while i < stop:
            h[0, plane[i]] += 1
            i += 1
        for v in range(256):
            freq[b, v] = h[0, v] + h[1, v] + h[2, v] + h[3, v]


@njit(cache=True, nogil=True)
def _code_lengths(freq, lens):  # pragma: no cover - compiled
    """Huffman code lengths of the 256 byte frequencies into ``lens``, at most MAX_LEN bits
    (frequencies are halved until the longest code fits)."""
    keys = np.empty(256, np.int64)  # frequency << 8 | symbol: sorts by frequency, then symbol
    m = 0
    for s in range(256):
        if freq[s] > 0:
            keys[m] = (np.int64(freq[s]) << 8) | s
            m += 1
    lens[:] = 0
    if m <= 1:
        if m == 1:
            lens[keys[0] & 0xFF] = 1
        return
    keys = np.sort(keys[:m])  # halving keeps this order, so one sort serves every round
    w = np.empty(2 * m, np.int64)
    parent = np.empty(2 * m, np.int64)
    depth = np.zeros(2 * m, np.int64)
    for k in range(m):
        w[k] = keys[k] >> 8
    while True:
        # two-queue Huffman on sorted weights: leaves then internal nodes, parents recorded
        leaf, node = 0, m
        for nxt in range(m, 2 * m - 1):
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
        longest = 0
        for k in range(2 * m - 3, -1, -1):
            depth[k] = depth[parent[k]] + 1
            longest = max(longest, depth[k])
        if longest <= MAX_LEN:
            break
        for k in range(m):
            w[k] = (w[k] + 1) >> 1
    for k in range(m):
        lens[keys[k] & 0xFF] = depth[k]


@njit(cache=True, nogil=True)
def _canonical(lens, codes):  # pragma: no cover - compiled
    """LSB-first (bit-reversed) canonical codes of ``lens`` (all <= MAX_LEN) into ``codes``:
    shorter codes first, equal lengths in symbol order."""
    nxt = np.zeros(MAX_LEN + 1, np.int64)
    for s in range(256):
        nxt[lens[s]] += 1
    code, count = 0, 0
    for length in range(1, MAX_LEN + 1):  # first code of each length, as in deflate
        code = (code + count) << 1
        count = nxt[length]
        nxt[length] = code
    for s in range(256):
        length = lens[s]
        if length:
            c = nxt[length]
            nxt[length] += 1
            rev = 0
            for _ in range(length):
                rev = (rev << 1) | (c & 1)
                c >>= 1
            codes[s] = rev


@njit(cache=True, nogil=True)
def huffman_bound(n, block):  # pragma: no cover - compiled
    """Bytes :func:`huffman_encode` may write for ``n`` bytes (worst case, all tables full)."""
    nblocks = (n + block - 1) // block
    return nblocks * (2 + 128 + 16 + 4) + (n * MAX_LEN + 7) // 8


@njit(cache=True, nogil=True)
def _put(table, x, acc, nbits):  # pragma: no cover - compiled
    """Append the code of byte ``x`` (``table[x]``: code << 8 | length) to the bit buffer."""
    e = table[x]
    return acc | ((e >> _8) << nbits), nbits + (e & _BYTE)


@njit(cache=True, nogil=True)
def _flush(buf, o, acc, nbits):  # pragma: no cover - compiled
    """Write the whole bytes of the bit buffer at ``buf[o]`` (one 8-byte store, the bytes past the
    whole ones are rewritten by the next flush); keeps the 0..7 bits left over."""
    _store64(buf, o, acc)
    return o + (nbits >> _3), acc >> (nbits & ~_7), nbits & _7


@njit(cache=True, nogil=True)
def _encode_stream(plane, i, stop, table, buf, o, acc, nbits):  # pragma: no cover - compiled
    """Finish one stream: bytes ``plane[i:stop]`` after the bit buffer, then its last bits;
    returns where the stream ends in ``buf``."""
    while i < stop:
        acc, nbits = _put(table, plane[i], acc, nbits)
        o, acc, nbits = _flush(buf, o, acc, nbits)
        i += 1
    _store64(buf, o, acc)
    return o + ((nbits + _7) >> _3)


@njit(cache=True, nogil=True)
def huffman_encode(plane, block, freq, out):  # pragma: no cover - compiled
    """Encode ``plane`` with the block histograms ``freq`` (from :func:`plane_stats`) into
    ``out``; returns the bytes written."""
    n = plane.size
    pos = 0
    lens = np.zeros(256, np.int64)
    codes = np.zeros(256, np.uint64)
    table = np.zeros(256, np.uint64)
    cap = ((block + 3) // 4 * MAX_LEN) // 8 + 16  # bytes of one stream, with room to flush
    buf = np.empty(4 * cap, np.uint8)  # the four streams, before they go to out
    ends = np.zeros(4, np.int64)
    for b in range((n + block - 1) // block):
        start = b * block
        stop = min(n, start + block)
        _code_lengths(freq[b], lens)
        lo, hi = 0, 255
        while lens[lo] == 0:
            lo += 1
        while lens[hi] == 0:
            hi -= 1
        out[pos] = lo
        out[pos + 1] = hi
        pos += 2
        if lo == hi:
            continue
        for s in range(lo, hi + 1, 2):
            v = lens[s]
            if s + 1 <= hi:
                v |= lens[s + 1] << 4
            out[pos] = v
            pos += 1
        _canonical(lens, codes)
        for v in range(256):
            table[v] = (codes[v] << _8) | np.uint64(lens[v])
        q = (stop - start + 3) // 4
        i0, i1, i2, i3 = start, start + q, start + 2 * q, min(stop, start + 3 * q)
        o0, o1, o2, o3 = np.uint64(0), np.uint64(cap), np.uint64(2 * cap), np.uint64(3 * cap)
        a0 = a1 = a2 = a3 = n0 = n1 = n2 = n3 = np.uint64(0)
        while i3 + 4 <= stop:  # the four streams in step, four bytes each (< 56 bits) per flush
            for k in range(4):
                a0, n0 = _put(table, plane[i0 + k], a0, n0)
                a1, n1 = _put(table, plane[i1 + k], a1, n1)
                a2, n2 = _put(table, plane[i2 + k], a2, n2)
                a3, n3 = _put(table, plane[i3 + k], a3, n3)
            o0, a0, n0 = _flush(buf, o0, a0, n0)
            o1, a1, n1 = _flush(buf, o1, a1, n1)
            o2, a2, n2 = _flush(buf, o2, a2, n2)
            o3, a3, n3 = _flush(buf, o3, a3, n3)
            i0, i1, i2, i3 = i0 + 4, i1 + 4, i2 + 4, i3 + 4
        ends[0] = _encode_stream(plane, i0, min(stop, start + q), table, buf, o0, a0, n0)
        ends[1] = _encode_stream(plane, i1, min(stop, start + 2 * q), table, buf, o1, a1, n1)
        ends[2] = _encode_stream(plane, i2, min(stop, start + 3 * q), table, buf, o2, a2, n2)
        ends[3] = _encode_stream(plane, i3, stop, table, buf, o3, a3, n3)
        body = pos + 16
        for k in range(4):
            size = ends[k] - k * cap
            for t in range(4):
                out[pos + 4 * k + t] = (size >> (8 * t)) & 0xFF
            out[body:body + size] = buf[k * cap:ends[k]]
            body += size
        pos = body
    return pos


@njit(cache=True, nogil=True)
def _refill(buf, acc, nbits, p):  # pragma: no cover - compiled
    """Top the bit buffer up to 56..63 bits with one 8-byte load at ``p`` (``p + 8 <= buf.size``).
    ``8 * p - nbits`` stays the bits consumed; the buffer may hold a few more bits above ``nbits``:
    those of byte ``p``, ORed in again by the next refill."""
    acc |= _load64(buf, p) << nbits
    return acc, nbits | _56, p + ((_63 - nbits) >> _3)


@njit(cache=True, nogil=True)
def _get(lut, acc, nbits, plane, i):  # pragma: no cover - compiled
    """Decode one symbol (``lut``: symbol | length << 8) into ``plane[i]``."""
    e = lut[acc & _MASK]
    plane[np.uint64(i)] = e
    length = np.uint64(e >> 8)
    return acc >> length, nbits - length


@njit(cache=True, nogil=True)
def _decode_stream(buf, lut, plane, i, stop, acc, nbits, p, first, nbytes):  # pragma: no cover
    """Finish one stream (``plane[i:stop]``) with checked byte-wise refills, then check that it
    used exactly its ``nbytes`` bytes from ``first``; returns 0 or an ``ERR_*`` code."""
    size = np.uint64(buf.size)
    while i < stop:
        if nbits < MAX_LEN:
            while nbits <= _56 and p < size:
                acc |= np.uint64(buf[p]) << nbits
                p += np.uint64(1)
                nbits += _8
        if (lut[acc & _MASK] >> 8) > nbits:
            return ERR_TRUNCATED
        acc, nbits = _get(lut, acc, nbits, plane, i)
        i += 1
    used = np.int64(_8 * p - nbits) - 8 * first  # bits consumed
    return 0 if (used + 7) // 8 == nbytes else ERR_CODE


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
    nb = np.zeros(5, np.int64)  # start of each stream in buf, then the end of the last
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
        if pos + ntab + 16 > size:
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
        if kraft != 1 << MAX_LEN:  # a complete code: every table entry decodes a symbol
            return ERR_CODE
        nb[0] = pos + 16
        for k in range(4):
            nb[k + 1] = nb[k] + (np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8)
                                 | (np.int64(buf[pos + 2]) << 16) | (np.int64(buf[pos + 3]) << 24))
            pos += 4
        if nb[4] > size:
            return ERR_TRUNCATED
        _canonical(lens, codes)
        for s in range(lo, hi + 1):
            length = lens[s]
            if length:
                for k in range(np.int64(codes[s]), 1 << MAX_LEN, 1 << length):
                    lut[k] = s | (length << 8)
        q = (stop - start + 3) // 4
        i0, i1, i2, i3 = start, start + q, start + 2 * q, min(stop, start + 3 * q)
        p0, p1, p2, p3 = np.uint64(nb[0]), np.uint64(nb[1]), np.uint64(nb[2]), np.uint64(nb[3])
        a0 = a1 = a2 = a3 = n0 = n1 = n2 = n3 = np.uint64(0)
        last = np.uint64(max(size - 8, 0))  # an 8-byte load may start at or before this
        fits = size >= 8
        while i3 + 4 <= stop and fits:  # four symbols (<= 48 bits) per stream and refill
            if p0 > last or p1 > last or p2 > last or p3 > last:
                break
            a0, n0, p0 = _refill(buf, a0, n0, p0)
            a1, n1, p1 = _refill(buf, a1, n1, p1)
            a2, n2, p2 = _refill(buf, a2, n2, p2)
            a3, n3, p3 = _refill(buf, a3, n3, p3)
            for k in range(4):
                a0, n0 = _get(lut, a0, n0, plane, i0 + k)
                a1, n1 = _get(lut, a1, n1, plane, i1 + k)
                a2, n2 = _get(lut, a2, n2, plane, i2 + k)
                a3, n3 = _get(lut, a3, n3, plane, i3 + k)
            i0, i1, i2, i3 = i0 + 4, i1 + 4, i2 + 4, i3 + 4
        err = min(
            _decode_stream(buf, lut, plane, i0, min(stop, start + q), a0, n0, p0, nb[0], nb[1] - nb[0]),
            _decode_stream(buf, lut, plane, i1, min(stop, start + 2 * q), a1, n1, p1, nb[1], nb[2] - nb[1]),
            _decode_stream(buf, lut, plane, i2, min(stop, start + 3 * q), a2, n2, p2, nb[2], nb[3] - nb[2]),
            _decode_stream(buf, lut, plane, i3, stop, a3, n3, p3, nb[3], nb[4] - nb[3]))
        if err:
            return err
        pos = nb[4]
    return pos
