"""Compiled Huffman decoder of BytePlanes planes (the block layout is described in
:mod:`ckptcodecs._pkernels`): per block, decoding tables indexed by the next ``MAX_LEN`` bits,
then four independent chains of table lookups at once, one per quarter of the block. Every read
is checked against the buffer: a corrupted payload yields an error code, never a read or write
out of bounds.
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

from ._pkernels import _PEEK, ERR_CODE, ERR_TRUNCATED, MAX_LEN, _3, _7, _canonical, _load64, _store

__all__ = ["huffman_decode"]


@njit(cache=True, nogil=True)
def _fill(a, start, stop, v):  # pragma: no cover - compiled
    """``a[start:stop] = v`` (an unsigned loop, which LLVM vectorizes)."""
    for k in range(np.uint64(start), np.uint64(stop)):
        a[k] = v


@njit(cache=True, nogil=True)
def _tables(lens, order, m, syms, bits):  # pragma: no cover - compiled
    """Decoding tables indexed by the next MAX_LEN bits of a stream: ``syms`` holds the (up to
    three) symbols whose codes fit whole in them, in bytes 0..2, and their count in byte 3;
    ``bits`` their total code length. As codes are canonical, each first symbol owns a run of
    entries, split into runs per second symbol that fits, then per third."""
    p1 = 0
    for a in range(m):
        s1 = order[a]
        r1 = MAX_LEN - lens[s1]  # bits left after the first code
        p2 = p1
        for b in range(m):
            s2 = order[b]
            if lens[s2] > r1:
                break  # and so are all codes after it
            r2 = r1 - lens[s2]
            p3 = p2
            for c in range(m):
                s3 = order[c]
                if lens[s3] > r2:
                    break
                run = 1 << (r2 - lens[s3])
                _fill(syms, p3, p3 + run, s1 | (s2 << 8) | (s3 << 16) | (3 << 24))
                _fill(bits, p3, p3 + run, MAX_LEN - r2 + lens[s3])
                p3 += run
            _fill(syms, p3, p2 + (1 << r2), s1 | (s2 << 8) | (2 << 24))
            _fill(bits, p3, p2 + (1 << r2), MAX_LEN - r2)
            p2 += 1 << r2
        _fill(syms, p2, p1 + (1 << r1), s1 | (1 << 24))
        _fill(bits, p2, p1 + (1 << r1), MAX_LEN - r1)
        p1 += 1 << r1


@njit(cache=True, nogil=True)
def _peek(buf, bp):  # pragma: no cover - compiled
    """57+ bits of ``buf`` from bit ``bp`` on, left-aligned (needs ``bp // 8 + 8 <= buf.size``)."""
    return _load64(buf, bp >> _3) << (bp & _7)


@njit(cache=True, nogil=True)
def _get3(syms, bits, x, bp, plane, o):  # pragma: no cover - compiled
    """Decode the (up to three) symbols of the top MAX_LEN bits of ``x`` into ``plane[o:]`` with
    one 4-byte store (the bytes past the symbols are rewritten later); move ``x``, ``bp``, ``o``."""
    k = x >> _PEEK
    e = syms[k]
    n = np.uint64(bits[k])
    _store(plane, o, e, 4, False)
    return x << n, bp + n, o + (e >> np.uint64(24))


@njit(cache=True, nogil=True)
def _steps(o, stop, bp, size):  # pragma: no cover - compiled
    """Rounds (a :func:`_peek`, four :func:`_get3`) that surely fit a stream at ``plane[o]``
    (ending at ``stop``) and bit ``bp`` of a ``size``-byte buffer: a round writes up to 13 bytes
    from ``o`` and moves it by <= 12, reads 8 bytes at ``bp // 8`` and moves ``bp`` by <= 48."""
    o, bp = np.int64(o), np.int64(bp)
    return max(0, min((stop - 13 - o) // 12, (8 * (size - 8) - bp) // 48) + 1)


@njit(cache=True, nogil=True)
def _decode_stream(buf, syms, bits, lens, plane, o, stop, bp, first, nbytes):  # pragma: no cover
    """Finish one stream (``plane[o:stop]``, from bit ``bp`` of ``buf``): rounds of four lookups
    while they fit, then a symbol at a time; then check that it used exactly its ``nbytes`` bytes
    from ``first``. Returns 0 or an ``ERR_*`` code."""
    size = buf.size
    while _steps(o, stop, bp, size):
        for _ in range(_steps(o, stop, bp, size)):
            x = _peek(buf, bp)
            for _ in range(4):
                x, bp, o = _get3(syms, bits, x, bp, plane, o)
    o, bp = np.int64(o), np.int64(bp)
    while o < stop:
        p = bp >> 3
        x = np.uint64(0)
        for k in range(min(8, size - p)):  # the bytes left, zeros past the end
            x |= np.uint64(buf[p + k]) << np.uint64(56 - 8 * k)
        s = syms[(x << np.uint64(bp & 7)) >> _PEEK] & 0xFF
        bp += lens[s]
        if bp > 8 * size:
            return ERR_TRUNCATED
        plane[o] = s
        o += 1
    return 0 if (bp - 8 * first + 7) // 8 == nbytes else ERR_CODE


@njit(cache=True, nogil=True)
def huffman_decode(buf, block, plane):  # pragma: no cover - compiled
    """Decode ``buf`` into ``plane`` (its size says how many bytes); returns the bytes of
    ``buf`` consumed, or an ``ERR_*`` code."""
    n, size, pos = plane.size, buf.size, 0
    lens, order = np.zeros(256, np.int64), np.zeros(256, np.int64)
    syms, bits = np.zeros(1 << MAX_LEN, np.uint32), np.zeros(1 << MAX_LEN, np.uint8)
    at = np.zeros(5, np.int64)  # where each stream starts in buf, then where the last ends
    for b in range((n + block - 1) // block):
        start, stop = b * block, min(n, (b + 1) * block)
        if pos + 2 > size:
            return ERR_TRUNCATED
        lo, hi = np.int64(buf[pos]), np.int64(buf[pos + 1])
        pos += 2
        if lo > hi:
            return ERR_CODE
        if lo == hi:
            plane[start:stop] = lo
            continue
        if pos + (hi - lo + 2) // 2 + 16 > size:
            return ERR_TRUNCATED
        lens[:] = 0
        kraft = 0
        for s in range(lo, hi + 1):
            lens[s] = (buf[pos + (s - lo) // 2] >> (4 * ((s - lo) % 2))) & 0xF
            if lens[s] > MAX_LEN:
                return ERR_CODE
            kraft += (1 << (MAX_LEN - lens[s])) if lens[s] else 0
        if kraft != 1 << MAX_LEN:  # a complete code: every table entry decodes a symbol
            return ERR_CODE
        pos += (hi - lo + 2) // 2
        at[0] = pos + 16
        for k in range(4):
            at[k + 1] = at[k]
            for t in range(4):
                at[k + 1] += np.int64(buf[pos + 4 * k + t]) << (8 * t)
        if at[4] > size:
            return ERR_TRUNCATED
        _tables(lens, order, _canonical(lens, order), syms, bits)
        q = (stop - start + 3) // 4
        e0, e1, e2 = min(stop, start + q), min(stop, start + 2 * q), min(stop, start + 3 * q)
        # stream k: its next byte ok of plane (up to ek), its next bit bk of buf
        o0, o1, o2, o3 = np.uint64(start), np.uint64(e0), np.uint64(e1), np.uint64(e2)
        b0, b1, b2, b3 = (np.uint64(8 * at[0]), np.uint64(8 * at[1]), np.uint64(8 * at[2]),
                          np.uint64(8 * at[3]))
        while True:  # the four streams in step while all have room, no checks within a batch
            steps = min(_steps(o0, e0, b0, size), _steps(o1, e1, b1, size),
                        _steps(o2, e2, b2, size), _steps(o3, stop, b3, size))
            if steps == 0:
                break
            for _ in range(steps):  # the lookups of the four interleaved: the CPU overlaps them
                x0, x1, x2, x3 = _peek(buf, b0), _peek(buf, b1), _peek(buf, b2), _peek(buf, b3)
                for _ in range(4):
                    x0, b0, o0 = _get3(syms, bits, x0, b0, plane, o0)
                    x1, b1, o1 = _get3(syms, bits, x1, b1, plane, o1)
                    x2, b2, o2 = _get3(syms, bits, x2, b2, plane, o2)
                    x3, b3, o3 = _get3(syms, bits, x3, b3, plane, o3)
        err = min(_decode_stream(buf, syms, bits, lens, plane, o0, e0, b0, at[0], at[1] - at[0]),
                  _decode_stream(buf, syms, bits, lens, plane, o1, e1, b1, at[1], at[2] - at[1]),
                  _decode_stream(buf, syms, bits, lens, plane, o2, e2, b2, at[2], at[3] - at[2]),
                  _decode_stream(buf, syms, bits, lens, plane, o3, stop, b3, at[3], at[4] - at[3]))
        if err:
            return err
        pos = at[4]
    return pos
