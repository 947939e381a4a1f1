"""Compiled kernels of RLEHuffman: run scanning, canonical Huffman bit writing and reading.

Symbols use one alphabet of ``ALPHABET`` indices: a value ``v`` (a byte, the paper's ``-v <= 0``)
is index ``v``; a run length ``r >= 2`` (the paper's ``r > 0``: the value before it occurs ``r``
times in all) is index ``RUN_BASE + r``. Longer runs are split into pieces of at most ``MAX_RUN``.
Codes are written most significant bit first.
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

__all__ = [
    "ALPHABET",
    "LUT_BITS",
    "MAX_LEN",
    "MAX_RUN",
    "RUN_BASE",
    "canonical_codes",
    "code_lengths",
    "decode_symbols",
    "encode_stream",
    "rle_scan",
    "write_bits",
]

ALPHABET = 1 << 16
RUN_BASE = 254
MAX_RUN = ALPHABET - 1 - RUN_BASE
MAX_LEN = 24
LUT_BITS = 11

# error codes of decode_symbols (it returns the bits consumed otherwise)
ERR_BITS = -1  # bit stream ended early
ERR_CODE = -2  # bit pattern that is no code
ERR_RUN = -3  # run before any value
ERR_OVERFLOW = -4  # more output than announced
ERR_SHORT = -5  # less output than announced


@njit(cache=True, nogil=True, inline="always")
def _emit(v, run, syms, m, vfreq, freq, lane):  # pragma: no cover - compiled
    while run > 0:
        piece = min(run, MAX_RUN)
        syms[m] = v
        vfreq[lane, v] += 1
        m += 1
        if piece > 1:
            r = RUN_BASE + piece
            syms[m] = r
            freq[r] += 1
            m += 1
        run -= piece
    return m


@njit(cache=True, nogil=True)
def rle_scan(data, syms, freq):  # pragma: no cover - compiled
    """Write the symbol stream of ``data`` into ``syms`` (uint16, size >= data.size), count
    symbol frequencies into ``freq`` (int64[ALPHABET]); return the number of symbols."""
    n = data.size
    if n == 0:
        return 0
    # value counts in 4 lanes: consecutive increments of one counter would wait on each other
    vfreq = np.zeros((4, 256), np.int64)
    m = 0
    prev = data[0]
    run = 1
    for i in range(1, n):
        v = data[i]
        if v == prev:
            run += 1
        else:
            m = _emit(prev, run, syms, m, vfreq, freq, m & 3)
            prev = v
            run = 1
    m = _emit(prev, run, syms, m, vfreq, freq, m & 3)
    for v in range(256):
        freq[v] += vfreq[0, v] + vfreq[1, v] + vfreq[2, v] + vfreq[3, v]
    return m


@njit(cache=True, nogil=True)
def write_bits(syms, nsym, codes, lens, out):  # pragma: no cover - compiled
    """Huffman-code ``syms[:nsym]`` into ``out``; return the number of bytes written."""
    acc = np.uint64(0)
    nbits = 0
    j = 0
    for i in range(nsym):
        s = syms[i]
        ln = lens[s]
        acc = (acc << np.uint64(ln)) | np.uint64(codes[s])
        nbits += ln
        if nbits >= 32:
            nbits -= 32
            w = acc >> np.uint64(nbits)
            out[j] = (w >> np.uint64(24)) & np.uint64(0xFF)
            out[j + 1] = (w >> np.uint64(16)) & np.uint64(0xFF)
            out[j + 2] = (w >> np.uint64(8)) & np.uint64(0xFF)
            out[j + 3] = w & np.uint64(0xFF)
            j += 4
    while nbits >= 8:
        nbits -= 8
        out[j] = (acc >> np.uint64(nbits)) & np.uint64(0xFF)
        j += 1
    if nbits > 0:
        out[j] = (acc << np.uint64(8 - nbits)) & np.uint64(0xFF)
        j += 1
    return j


@njit(cache=True, nogil=True)
def code_lengths(freq, lens):  # pragma: no cover - compiled
    """Huffman code lengths (at most MAX_LEN) of the positive frequencies ``freq`` into
    ``lens``: each node joins the two lightest of the leaves and nodes left, ties going to the
    leaf and then to the lower index (a binary heap of ``(weight, index)`` pairs, nodes numbered
    after the leaves as they are made); where the longest code is too long the frequencies are
    halved, rounding up, and the tree is built again."""
    n = freq.size
    if n == 1:
        lens[0] = 1
        return
    f = freq.copy()
    w = np.empty(2 * n - 1, np.int64)  # weights of the leaves in sorted order, then the nodes
    parent = np.empty(2 * n - 1, np.int64)  # of each leaf (by index) and node
    depth = np.zeros(2 * n - 1, np.int64)
    while True:
        order = np.argsort(f, kind="mergesort")  # by weight, ties by index
        for k in range(n):
            w[k] = f[order[k]]
        leaf, node = 0, n
        for nxt in range(n, 2 * n - 1):
            total = 0
            for _ in range(2):
                if leaf < n and (node >= nxt or w[leaf] <= w[node]):
                    a, leaf = order[leaf], leaf + 1
                    total += f[a]
                else:
                    a, node = node, node + 1
                    total += w[a]
                parent[a] = nxt
            w[nxt] = total
        longest = 0
        for k in range(2 * n - 3, -1, -1):  # the root, 2n - 2, has depth 0
            depth[k] = depth[parent[k]] + 1
            if k < n:
                longest = max(longest, depth[k])
        if longest <= MAX_LEN:
            break
        for k in range(n):
            f[k] = (f[k] + 1) // 2
    for k in range(n):
        lens[k] = depth[k]


@njit(cache=True, nogil=True)
def canonical_codes(lens, codes):  # pragma: no cover - compiled
    """Canonical codes of symbols in increasing order with code lengths ``lens`` into
    ``codes``: by length, then symbol, each code one more than the last, shifted left by the
    difference in length."""
    order = np.argsort(lens, kind="mergesort")
    code = 0
    prev = lens[order[0]]
    for k in range(order.size):
        i = order[k]
        if k:
            code = (code + 1) << (lens[i] - prev)
        prev = lens[i]
        codes[i] = code


@njit(cache=True, nogil=True)
def encode_stream(data, head):  # pragma: no cover - compiled
    """RLE + Huffman code ``data`` in one call: ``(out, end, nsym, used, lens)``, the bit
    stream at ``out[hlen:end]`` where ``hlen = head + 3 * used.size + 4`` leaves room for the
    header; ``end`` is -1 (and ``out`` empty) where the code would not be smaller than ``data``
    stored raw behind a ``head``-byte header (:func:`rle_scan`, :func:`code_lengths`,
    :func:`canonical_codes`, :func:`write_bits`)."""
    n = data.size
    syms = np.empty(max(n, 1), np.uint16)
    freq = np.zeros(ALPHABET, np.int64)
    nsym = rle_scan(data, syms, freq)
    used = np.flatnonzero(freq)
    fu = freq[used]
    lens = np.empty(used.size, np.int64)
    code_lengths(fu, lens)
    nbits = 0
    for k in range(used.size):
        nbits += fu[k] * lens[k]
    hlen = head + 3 * used.size + 4
    nbytes = (nbits + 7) // 8
    if hlen + nbytes >= head + n:  # coding would not make it smaller: stored raw
        return np.empty(0, np.uint8), -1, nsym, used, lens
    codes = np.empty(used.size, np.int64)
    canonical_codes(lens, codes)
    codes_full = np.zeros(ALPHABET, np.int64)
    lens_full = np.zeros(ALPHABET, np.int64)
    for k in range(used.size):
        codes_full[used[k]] = codes[k]
        lens_full[used[k]] = lens[k]
    out = np.empty(hlen + nbytes + 8, np.uint8)  # header, bit stream, slack for flushes
    end = hlen + write_bits(syms, nsym, codes_full, lens_full, out[hlen:])
    return out, end, nsym, used, lens


@njit(cache=True, nogil=True)
def decode_symbols(buf, nsym, n, lut, first, offset, count, sorted_syms, maxlen,
                   out):  # pragma: no cover - compiled
    """Decode ``nsym`` symbols from ``buf`` and expand runs into ``out`` (size ``n``).

    ``lut`` has ``2**LUT_BITS`` entries for the next LUT_BITS bits of the stream: bits 0-7 the
    length of the first code (0: longer than LUT_BITS, or no code), 8-23 its symbol, 24-31 the
    length of the first two codes and 32-47 the second symbol when both are values whose codes fit
    (0 otherwise) -- two symbols per lookup on dense data. ``first/offset/count[len]``: canonical
    decoding of longer codes. Returns the number of bits consumed, or a negative ``ERR_*``.
    """
    nbuf = buf.size
    acc = np.uint64(0)
    nacc = 0  # valid bits in acc (right-aligned)
    pos = 0  # next byte of buf
    o = 0
    last = -1
    k = 0
    lmask = np.uint64((1 << LUT_BITS) - 1)
    while k < nsym:
        if nacc < maxlen:
            while nacc <= 56 and pos < nbuf:
                acc = (acc << np.uint64(8)) | np.uint64(buf[pos])
                pos += 1
                nacc += 8
        # peek LUT_BITS (zero padded past the end)
        if nacc >= LUT_BITS:
            peek = np.int64((acc >> np.uint64(nacc - LUT_BITS)) & lmask)
        else:
            peek = np.int64((acc << np.uint64(LUT_BITS - nacc)) & lmask)
        e = lut[peek]
        ln = e & 0xFF
        l2 = (e >> 24) & 0xFF
        if l2 > 0 and l2 <= nacc and k + 2 <= nsym and o + 2 <= n:
            s = (e >> 8) & 0xFFFF
            last = (e >> 32) & 0xFFFF
            out[o] = s
            out[o + 1] = last
            o += 2
            nacc -= l2
            k += 2
            continue
        s = (e >> 8) & 0xFFFF
        if ln == 0:
            s = -1
            for L in range(LUT_BITS + 1, maxlen + 1):
                if L > nacc:
                    break
                c = np.int64((acc >> np.uint64(nacc - L)) & np.uint64((1 << L) - 1))
                if count[L] > 0 and c - first[L] < count[L] and c >= first[L]:
                    s = sorted_syms[offset[L] + c - first[L]]
                    ln = L
                    break
            if s < 0:
                return ERR_CODE if nacc >= maxlen else ERR_BITS
        if ln > nacc:
            return ERR_BITS
        nacc -= ln
        k += 1
        if s < 256:
            if o >= n:
                return ERR_OVERFLOW
            out[o] = s
            o += 1
            last = s
        else:
            if last < 0:
                return ERR_RUN
            r = s - RUN_BASE - 1  # copies beyond the value already written
            if o + r > n:
                return ERR_OVERFLOW
            out[o:o + r] = last
            o += r
    if o != n:
        return ERR_SHORT
    return pos * 8 - nacc
