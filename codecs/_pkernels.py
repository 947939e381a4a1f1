"""Compiled kernels of BytePlanes: a block-adaptive byte Huffman coder, and the choice and layout
of each plane's coding (the byte grouping is in :mod:`ckptcodecs._bytegroup`).

Huffman: a plane is cut into blocks of ``block`` bytes, each with its own canonical code of at most
``MAX_LEN`` bits: a complete prefix code, codes ordered by (length, symbol) and written most
significant bit first, so that each symbol owns one run of a ``2**MAX_LEN``-entry decoding table
indexed by the next MAX_LEN bits. A block's bytes are cut into four quarters of
``q = ceil(len / 4)`` bytes (the last one shorter), each coded as a bit stream of its own: the
decoder follows four independent chains of table lookups at once. Block layout::

    u8 lo, u8 hi          used symbols lie in lo..hi (a block of one symbol: lo == hi, no more)
    ceil((hi-lo+1)/2) B   code lengths, 4 bits each, low nibble first (0: symbol unused)
    4 x u32               bytes of each of the four bit streams
    the four bit streams, one after the other, each zero padded to a byte

Every kernel checks what it reads against the buffer, so a corrupted payload yields an error code,
never a read or write out of bounds.

Decoding is in :mod:`ckptcodecs._pdecode`. Encoding is split so that a plane's cost is known
before it is coded: :func:`plane_stats` (block
histograms), :func:`huffman_lengths` (each block's code lengths, and a bound on the bytes the code
takes), :func:`huffman_encode_lengths` (the bit streams). A block of at most ``PAIRS_MAX`` symbols
is coded two bytes per table lookup (a table of the codes of every pair of its symbols); the bits
are the same as one byte at a time.
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

__all__ = ["ERR_CODE", "ERR_TRUNCATED", "HUFFMAN", "MAX_LEN", "PAIRS_MAX", "RAW", "REFERENCE",
           "ZSTD",
           "choose_methods", "huffman_bound", "huffman_encode",
           "huffman_encode_lengths", "huffman_lengths", "huffman_size", "pack_planes",
           "plane_stats"]

RAW, HUFFMAN, ZSTD = 0, 1, 2  # how a plane of the BytePlanes layout is coded
_PLANE = 9  # bytes of a plane's head in that layout: u8 method, u64 size

MAX_LEN = 12
#: blocks of at most this many distinct bytes are coded a pair of bytes per lookup (filling the
#: pair table costs PAIRS_MAX**2 stores a block)
PAIRS_MAX = 64
ERR_TRUNCATED = -1  # a table or bit stream runs past the end of the payload
ERR_CODE = -2       # a code table that is no complete prefix code, or bits that are no code


# Hot loops index with uint64: numba then skips its negative-index wraparound code, and LLVM fuses
# the byte accesses of _load64/_store into one unaligned (byte-swapping) load or store.
_3, _4, _7, _BYTE = np.uint64(3), np.uint64(4), np.uint64(7), np.uint64(0xFF)
_PEEK = np.uint64(64 - MAX_LEN)  # x >> _PEEK: the next MAX_LEN bits of a left-aligned buffer


@njit(cache=True, nogil=True)
def _load64(buf, p):  # pragma: no cover - compiled
    """Big-endian u64 at byte ``p`` of ``buf`` (the caller checks ``p + 8 <= buf.size``)."""
    p, x = np.uint64(p), np.uint64(0)
    for k in range(8):
        x |= np.uint64(buf[p + np.uint64(k)]) << np.uint64(56 - 8 * k)
    return x


@njit(cache=True, nogil=True)
def _store(buf, p, x, nbytes, big):  # pragma: no cover - compiled
    """Store the low ``nbytes`` bytes of ``x`` at byte ``p`` of ``buf``, big- or little-endian."""
    p = np.uint64(p)
    for k in range(nbytes):
        buf[p + np.uint64(k)] = (x >> np.uint64(8 * (nbytes - 1 - k) if big else 8 * k)) & _BYTE


@njit(cache=True, nogil=True)
def plane_stats(plane, block, freq):  # pragma: no cover - compiled
    """Byte histograms of each block of ``plane`` into ``freq[nblocks, 256]``."""
    n = plane.size
    h = np.zeros((8, 256), np.uint32)  # one per byte of a word: fewer store-to-load stalls
    for b in range((n + block - 1) // block):
        stop = min(n, (b + 1) * block)
        h[:] = 0
        i = b * block
        while i + 8 <= stop:
            x = _load64(plane, i)
            for k in range(8):
                h[k, (x >> np.uint64(8 * k)) & _BYTE] += 1
            i += 8
        for k in range(i, stop):
            h[0, plane[k]] += 1
        for v in range(256):
            freq[b, v] = h[:, v].sum()


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
    if m < 2:
        if m:
            lens[keys[0] & 0xFF] = 1
        return
    keys = np.sort(keys[:m])  # halving keeps this order: one sort serves every round
    w = np.empty(2 * m, np.int64)  # weights of the m leaves, then of the nodes as they are made
    parent = np.empty(2 * m, np.int64)
    depth = np.zeros(2 * m, np.int64)
    for k in range(m):
        w[k] = keys[k] >> 8
    while True:  # two-queue Huffman: each node joins the two lightest of leaves and nodes left
        leaf, node = 0, m
        for nxt in range(m, 2 * m - 1):
            w[nxt] = 0
            for _ in range(2):
                if leaf < m and (node >= nxt or w[leaf] <= w[node]):
                    a, leaf = leaf, leaf + 1
                else:
                    a, node = node, node + 1
                w[nxt] += w[a]
                parent[a] = nxt
        longest = 0
        for k in range(2 * m - 3, -1, -1):  # the root, 2m - 2, has depth 0
            depth[k] = depth[parent[k]] + 1
            longest = max(longest, depth[k])
        if longest <= MAX_LEN:
            break
        for k in range(m):
            w[k] = (w[k] + 1) >> 1
    for k in range(m):
        lens[keys[k] & 0xFF] = depth[k]


@njit(cache=True, nogil=True)
def _canonical(lens, order):  # pragma: no cover - compiled
    """The used symbols in canonical order (by length, then symbol) into ``order``; returns their
    count. Each takes the next ``2**(MAX_LEN - length)`` values of a MAX_LEN-bit window."""
    first = np.zeros(MAX_LEN + 2, np.int64)  # counting sort by length
    for s in range(256):
        first[lens[s] + 1] += 1
    first[1] = 0  # unused symbols (length 0) are left out
    for length in range(2, MAX_LEN + 2):
        first[length] += first[length - 1]
    for s in range(256):
        if lens[s]:
            order[first[lens[s]]] = s
            first[lens[s]] += 1
    return first[MAX_LEN]


@njit(cache=True, nogil=True)
def _put(codes, lens, x, acc, nbits):  # pragma: no cover - compiled
    """Append the (left-aligned) code of byte ``x`` to the ``nbits`` bits of the bit buffer."""
    return acc | (codes[x] >> nbits), nbits + lens[x]


@njit(cache=True, nogil=True)
def _flush(buf, o, acc, nbits):  # pragma: no cover - compiled
    """Write the bit buffer at ``buf[o]`` with one 8-byte store (the bytes past its whole ones
    are rewritten by the next), keep the 0..7 bits left."""
    _store(buf, o, acc, 8, True)
    return o + (nbits >> _3), acc << (nbits & ~_7), nbits & _7


@njit(cache=True, nogil=True)
def _encode_stream(plane, i, stop, codes, lens, pcodes, plens, pairs, buf,
                   o):  # pragma: no cover - compiled
    """Code ``plane[i:stop]`` as one bit stream at ``buf[o]`` (four bytes, <= 48 bits, per flush);
    returns where it ends (up to 8 bytes past that are overwritten). With ``pairs``, two bytes
    per lookup of ``pcodes``/``plens`` (indexed by the little-endian u16 of the two bytes). One
    stream at a time runs faster than several interleaved: their state does not fit in
    registers."""
    i, o = np.uint64(i), np.uint64(o)
    acc = nbits = np.uint64(0)
    if pairs:
        for _ in range((stop - np.int64(i)) // 4):
            for k in range(2):
                x = (np.uint64(plane[i + np.uint64(2 * k)])
                     | (np.uint64(plane[i + np.uint64(2 * k + 1)]) << np.uint64(8)))
                acc |= pcodes[x] >> nbits
                nbits += np.uint64(plens[x])
            o, acc, nbits = _flush(buf, o, acc, nbits)
            i += _4
    else:
        for _ in range((stop - np.int64(i)) // 4):
            for k in range(4):
                acc, nbits = _put(codes, lens, plane[i + np.uint64(k)], acc, nbits)
            o, acc, nbits = _flush(buf, o, acc, nbits)
            i += _4
    for k in range(np.int64(i), stop):
        acc, nbits = _put(codes, lens, plane[k], acc, nbits)
        o, acc, nbits = _flush(buf, o, acc, nbits)
    _store(buf, o, acc, 8, True)
    return np.int64(o + ((nbits + _7) >> _3))


@njit(cache=True, nogil=True)
def _used_range(lens):  # pragma: no cover - compiled
    """(lo, hi): the lowest and highest symbol of nonzero length (lo > hi if none)."""
    lo, hi = 0, 255
    while lo < 255 and lens[lo] == 0:
        lo += 1
    while hi > 0 and lens[hi] == 0:
        hi -= 1
    return lo, hi


@njit(cache=True, nogil=True)
def huffman_lengths(freq, lens):  # pragma: no cover - compiled
    """Code lengths of each block histogram ``freq[b]`` (from :func:`plane_stats`) into
    ``lens[b]``; returns a bound on the bytes :func:`huffman_encode_lengths` writes with them (at
    most 3 bytes a block over: each of the four streams is rounded up to a byte on its own)."""
    size = 0
    for b in range(freq.shape[0]):
        _code_lengths(freq[b], lens[b])
        lo, hi = _used_range(lens[b])
        size += 2
        if lo < hi:
            bits = 0
            for s in range(lo, hi + 1):
                bits += freq[b, s] * lens[b, s]
            size += (hi - lo + 2) // 2 + 16 + (bits + 4 * 7) // 8
    return size


@njit(cache=True, nogil=True)
def huffman_size(plane, block):  # pragma: no cover - compiled
    """The bound of :func:`huffman_lengths` on the Huffman code of ``plane``."""
    nblocks = (plane.size + block - 1) // block
    freq, lens = np.empty((nblocks, 256), np.int64), np.empty((nblocks, 256), np.int64)
    plane_stats(plane, block, freq)
    return huffman_lengths(freq, lens)


@njit(cache=True, nogil=True)
def huffman_bound(n, block):  # pragma: no cover - compiled
    """Bytes :func:`huffman_encode` may write for ``n`` bytes (full tables, longest codes, and
    the 8-byte store that ends the last stream)."""
    nblocks = (n + block - 1) // block
    return nblocks * (2 + 128 + 16 + 4) + (n * MAX_LEN + 7) // 8 + 8


@njit(cache=True, nogil=True)
def huffman_encode_lengths(plane, block, lens, out):  # pragma: no cover - compiled
    """Encode ``plane`` with the code lengths ``lens[nblocks, 256]`` of
    :func:`huffman_lengths` into ``out`` (at least its bound + 8 bytes); returns the bytes
    written."""
    n, pos = plane.size, 0
    order = np.zeros(256, np.int64)
    codes, ulens = np.zeros(256, np.uint64), np.zeros(256, np.uint64)  # codes left-aligned
    pcodes, plens = np.empty(1 << 16, np.uint64), np.empty(1 << 16, np.uint8)
    for b in range((n + block - 1) // block):
        start, stop = b * block, min(n, (b + 1) * block)
        blens = lens[b]
        lo, hi = _used_range(blens)  # (an empty histogram gives lo > hi: a bad block)
        out[pos], out[pos + 1] = lo, hi
        pos += 2
        if lo >= hi:
            continue
        for s in range(lo, hi + 1, 2):
            out[pos] = blens[s] | (blens[s + 1] << 4 if s < hi else 0)
            pos += 1
        window = 0
        m = _canonical(blens, order)
        for k in range(m):
            s = order[k]
            codes[s] = np.uint64(window >> (MAX_LEN - blens[s])) << np.uint64(64 - blens[s])
            ulens[s] = blens[s]
            window += 1 << (MAX_LEN - blens[s])
        pairs = m <= PAIRS_MAX
        if pairs:  # only the entries of used pairs are written, and only they are read
            for a in range(m):
                s1 = order[a]
                for c in range(m):
                    s2 = order[c]
                    pcodes[s1 | (s2 << 8)] = codes[s1] | (codes[s2] >> ulens[s1])
                    plens[s1 | (s2 << 8)] = ulens[s1] + ulens[s2]
        q = (stop - start + 3) // 4
        end = pos + 16  # the streams follow each other: each starts where the last ended
        for k in range(4):
            begin = end
            end = _encode_stream(plane, min(stop, start + k * q), min(stop, start + k * q + q),
                                 codes, ulens, pcodes, plens, pairs, out, begin)
            _store(out, pos + 4 * k, end - begin, 4, False)
        pos = end
    return pos


@njit(cache=True, nogil=True)
def huffman_encode(plane, block, freq, out):  # pragma: no cover - compiled
    """Encode ``plane`` with the block histograms ``freq`` (from :func:`plane_stats`) into
    ``out`` (at least :func:`huffman_bound` bytes); returns the bytes written."""
    lens = np.zeros((freq.shape[0], 256), np.int64)
    huffman_lengths(freq, lens)
    return huffman_encode_lengths(plane, block, lens, out)


@njit(cache=True, nogil=True)
def _entropy(freq, count):  # pragma: no cover - compiled
    """(entropy in bits, sum of squared shares, largest share) of a histogram of ``count``."""
    entropy = same = most = 0.0
    for v in range(256):
        if freq[v]:
            share = freq[v] / count
            entropy -= share * np.log2(share)
            same += share * share
            most = max(most, share)
    return entropy, same, most


@njit(cache=True, nogil=True)
def choose_methods(freq, near, repeats, count, length, below, extra,
                   methods):  # pragma: no cover - compiled
    """What the samples of :func:`ckptcodecs._bytegroup.sample_rows` say of each plane:
    ``methods[p]`` is HUFFMAN when the entropy of the strided sample (``count`` bytes, histogram
    ``freq[p]``) is below ``below`` of a byte, else RAW. Returns the bitmask of the planes where
    zstd may beat both: in the contiguous sample (``length`` bytes, histogram ``near[p]``), more
    bytes equal their predecessor (``repeats[p]``) than its histogram predicts, by ``extra``,
    or one byte is more than half of them."""
    trials = 0
    for p in range(freq.shape[0]):
        methods[p] = HUFFMAN if _entropy(freq[p], count)[0] / 8 < below else RAW
        _, same, most = _entropy(near[p], length)
        if repeats[p] / (length - 1) > same + extra or most > 0.5:
            trials |= 1 << p
    return trials


@njit(cache=True, nogil=True)
def pack_planes(out, base, n, itemsize, block, methods, zbuf, zoff):  # pragma: no cover
    """Lay out the planes that :func:`ckptcodecs._bytegroup.split_rows` wrote at
    ``out[base + p * (9 + n)]`` as the planes of the BytePlanes layout, from ``base - 9`` on: u8
    method, u64 size, payload. ``methods[p]``: RAW; HUFFMAN, which stays RAW unless its code is
    smaller; ZSTD, payload ``zbuf[zoff[p]:zoff[p + 1]]`` (fewer than ``n`` bytes). Sets
    ``methods`` to what was written; returns where the last plane ends. Payloads only move
    towards lower addresses and end before the next plane's row."""
    stride, pos = _PLANE + n, base - _PLANE
    nblocks = (n + block - 1) // block
    freq, lens = np.empty((nblocks, 256), np.int64), np.empty((nblocks, 256), np.int64)
    scratch = np.empty(0, np.uint8)  # the code of a plane would overwrite its own row
    for p in range(itemsize):
        row, method, size = base + p * stride, methods[p], n
        at = pos + _PLANE
        if method == ZSTD:
            size = zoff[p + 1] - zoff[p]
            out[at:at + size] = zbuf[zoff[p]:zoff[p + 1]]
        elif method == HUFFMAN:
            plane = out[row:row + n]
            plane_stats(plane, block, freq)
            bound = huffman_lengths(freq, lens)
            if bound - 3 * nblocks < n:  # the code may be smaller than the plane
                if scratch.size < bound + 8:
                    scratch = np.empty(bound + 8, np.uint8)
                size = huffman_encode_lengths(plane, block, lens, scratch)
                if size < n:
                    out[at:at + size] = scratch[:size]
                else:
                    method, size = RAW, n
            else:
                method = RAW
        if method == RAW and at != row:
            for k in range(n):  # to a lower address: a forward copy is safe
                out[at + k] = out[row + k]
        out[pos] = method
        _store(out, pos + 1, size, 8, False)
        methods[p] = method
        pos = at + size
    return pos


#: the encoder side's numba kernels by the names of the family "planes" (ckptcodecs._backend),
#: the reference of their C twins
REFERENCE = dict(plane_stats=plane_stats, code_lengths=_code_lengths,
                 huffman_lengths=huffman_lengths, huffman_size=huffman_size,
                 huffman_bound=huffman_bound, huffman_encode_lengths=huffman_encode_lengths,
                 huffman_encode=huffman_encode, choose_methods=choose_methods,
                 pack_planes=pack_planes)
