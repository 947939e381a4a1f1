"""RLEHuffman's compiled coder against its numba twin, and on hostile input (issue 28).

The C kernels of the ``rle_huffman`` family (``encode_stream``, ``code_lengths``,
``canonical_codes``, ``decode_symbols``) run on the same inputs as the numba ones -- every size
class, runs longer than a run symbol holds, skewed and flat bytes, frequencies that force the
length limit -- and write the same bytes. The decoder meets streams that are truncated, flipped,
padded, tables whose code lengths do not fit, and headers whose declared sizes lie: a
``CodecError`` (through the codec) or a ``ValueError`` (the kernel's own checks), the same
status as numba's where numba has one, never a crash.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import CodecError, _backend
from ckptcodecs import _hkernels as HK
from ckptcodecs import rle_huffman as RH

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

SIZES = st.one_of(st.integers(1, 40), st.integers(1, 5000),
                  st.sampled_from([1 << 16, (1 << 17) + 3, 2 * HK.MAX_RUN + 7]))


def _twins():
    return (_backend.implementation("rle_huffman", "c"),
            _backend.implementation("rle_huffman", "numba"))


def _data(seed: int, n: int, kind: str) -> np.ndarray:
    """``n`` bytes: flat random, skewed (few values, geometric), in runs (some very long), or
    dense: 8-bit codes of a bell curve (codes of many lengths, almost every run a single byte:
    the encoder's pairs path) with a few runs dropped in, some across its 8 KiB chunks."""
    rng = np.random.default_rng(seed)
    if kind == "flat":
        return rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "dense":
        x = np.clip(np.rint(rng.standard_normal(n) * 30 + 128), 0, 255).astype(np.uint8)
        for at in rng.integers(0, n, max(1, n // 3000)):
            x[at:at + int(rng.choice([2, 3, 9, 8200]))] = x[at]
        return x
    if kind == "skewed":
        return np.minimum(rng.geometric(0.4, n) - 1, 255).astype(np.uint8)
    lengths = rng.choice([1, 2, 3, 40, HK.MAX_RUN + 5], n // 4 + 1, p=[.4, .3, .2, .09, .01])
    return np.repeat(rng.integers(0, 6, lengths.size, dtype=np.uint8), lengths)[:n].copy()


def _encode_with(kernels, data: np.ndarray, head: int):
    out, end, nsym, used, lens = kernels.encode_stream(data, head)
    hlen = head + 3 * used.size + 4
    stream = out[hlen:end].tobytes() if end >= 0 else b""
    return stream, end, out.size, nsym, used.dtype, used.tobytes(), lens.dtype, lens.tobytes()


@settings(max_examples=150, deadline=None)
@given(n=SIZES, kind=st.sampled_from(["flat", "skewed", "runs", "dense"]),
       head=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_encode_stream(n, kind, head, seed):
    c, ref = _twins()
    data = _data(seed, n, kind)
    assert _encode_with(c, data, head) == _encode_with(ref, data, head)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 3000), fib=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_code_lengths_and_canonical_codes(n, fib, seed):
    """Random frequencies, and Fibonacci-like ones whose tree is deeper than MAX_LEN (halved
    and rebuilt)."""
    c, ref = _twins()
    rng = np.random.default_rng(seed)
    if fib:
        a, b, freq = 1, 1, []
        for _ in range(min(n, 60)):
            freq.append(a)
            a, b = b, a + b
        freq = np.array(freq, np.int64)
    else:
        freq = rng.integers(1, rng.choice([2, 100, 1 << 40]), n).astype(np.int64)
    lens = [np.zeros(freq.size, np.int64) for _ in range(2)]
    c.code_lengths(freq, lens[0])
    ref.code_lengths(freq, lens[1])
    assert lens[0].tobytes() == lens[1].tobytes()
    codes = [np.zeros(freq.size, np.int64) for _ in range(2)]
    c.canonical_codes(lens[0], codes[0])
    ref.canonical_codes(lens[0], codes[1])
    assert codes[0].tobytes() == codes[1].tobytes()


def _decode_both(stream, nsym, n, tables):
    results = []
    for kernels in _twins():
        out = np.full(n + 3, 7, np.uint8)
        status = kernels.decode_symbols(stream, nsym, n, *tables, out[:n])
        results.append((status, out.tobytes() if status >= 0 else None))
    return results


@settings(max_examples=150, deadline=None)
@given(n=SIZES, kind=st.sampled_from(["flat", "skewed", "runs", "dense"]),
       seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 64), flip=st.integers(0, 10**9),
       lie=st.integers(-3, 3))
def test_decode_symbols_on_good_and_hostile_streams(n, kind, seed, cut, flip, lie):
    """The whole stream, then truncated, with a bit flipped, and with a symbol count or a size
    that lies: the same status and bytes in both."""
    payload = RH.rle_huffman_encode(_data(seed, n, kind))
    if payload[1] != 1:
        return  # stored raw: no bit stream
    stream, nsym, size, tables = RH.coded_parts(payload)
    c, ref = _decode_both(stream, nsym, size, tables)
    assert c == ref and c[0] >= 0
    flipped = stream.copy()
    if flipped.size:
        flipped[flip % flipped.size] ^= 1 << (flip % 8)
    for args in ((stream[:max(0, stream.size - cut)], nsym, size),
                 (flipped, nsym, size),
                 (stream, max(0, nsym + lie), size),
                 (stream, nsym, max(0, size + lie))):
        c, ref = _decode_both(*args, tables)
        assert c == ref


def _mode1(n: int, nsym: int, syms: list[int], lens: list[int], stream: bytes) -> bytes:
    header = (struct.pack("<BBQQI", RH.VERSION, 1, n, nsym, len(syms))
              + np.array(syms, "<u2").tobytes() + bytes(lens))
    return header + struct.pack("<I", zlib.crc32(header)) + stream


HOSTILE_PAYLOADS = {
    "stream truncated": _mode1(64, 64, [0, 1], [1, 1], b"\x00" * 4),
    "more bytes than announced": _mode1(4, 8, [0, 1], [1, 1], b"\x55"),
    "run before any value": _mode1(5, 1, [0, HK.RUN_BASE + 5], [1, 1], b"\xff"),
    "run past the end": _mode1(3, 2, [0, HK.RUN_BASE + 5], [1, 1], b"\x40"),
    "code length 0": _mode1(8, 8, [0, 1], [0, 1], b"\x00"),
    "code length 25": _mode1(8, 8, [0, 1], [25, 1], b"\x00"),
    "lengths break Kraft": _mode1(8, 8, [0, 1, 2], [1, 1, 1], b"\x00"),
    "no code for a pattern": _mode1(8, 8, [0, 1], [2, 2], b"\xff"),
    "symbols not increasing": _mode1(8, 8, [1, 0], [1, 1], b"\x00"),
    "declared size lies high": _mode1(1 << 40, 8, [0, 1], [1, 1], b"\x00"),
    "symbol count lies high": _mode1(8, 1 << 40, [0, 1], [1, 1], b"\x00"),
    "trailing garbage": _mode1(8, 8, [0, 1], [1, 1], b"\x00\x00"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PAYLOADS))
def test_hostile_payloads_are_codec_errors(case):
    with pytest.raises(CodecError):
        RH.rle_huffman_decode(HOSTILE_PAYLOADS[case])


def _tables():
    return RH.decode_tables(np.array([0, 1], np.int64), np.array([1, 1], np.int64))


def _hostile_decode_args():
    lut, first, offset, count, syms, maxlen = _tables()
    bad_offset, bad_count = offset.copy(), count.copy()
    bad_offset[HK.LUT_BITS + 2], bad_count[HK.LUT_BITS + 2] = 5, 1
    buf, out = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    good = (lut, first, offset, count, syms)
    return {
        "out too small": (buf, 8, 9, *good, maxlen, out),
        "negative size": (buf, 8, -1, *good, maxlen, out),
        "negative symbol count": (buf, -1, 8, *good, maxlen, out),
        "maxlen 0": (buf, 8, 8, *good, 0, out),
        "maxlen 25": (buf, 8, 8, *good, 25, out),
        "lut too short": (buf, 8, 8, lut[:100], first, offset, count, syms, maxlen, out),
        "tables too short": (buf, 8, 8, lut, first[:5], offset, count, syms, maxlen, out),
        "offset past sorted_syms": (buf, 8, 8, lut, first, bad_offset, bad_count, syms, 13,
                                    out),
        "lut of 4-byte items": (buf, 8, 8, lut.astype(np.int32), first, offset, count, syms,
                                maxlen, out),
        "read-only out": (buf, 8, 8, *good, maxlen, _read_only(8)),
        "out is buf": (buf, 8, 8, *good, maxlen, buf),
    }


def _read_only(n: int) -> np.ndarray:
    a = np.zeros(n, np.uint8)
    a.flags.writeable = False
    return a


HOSTILE_ARGS = sorted(_hostile_decode_args())


@pytest.mark.parametrize("case", HOSTILE_ARGS)
def test_decode_symbols_checks_its_arguments(case):
    c, _ = _twins()
    with pytest.raises(ValueError):
        c.decode_symbols(*_hostile_decode_args()[case])


@pytest.mark.parametrize("name, args", [
    ("encode_stream", (np.zeros(0, np.uint8), 10)),
    ("encode_stream", (np.zeros(8, np.uint8), -1)),
    ("code_lengths", (np.array([3, 0, 1], np.int64), np.zeros(3, np.int64))),
    ("code_lengths", (np.ones(3, np.int64), np.zeros(2, np.int64))),
    ("code_lengths", (np.ones(0, np.int64), np.zeros(0, np.int64))),
    ("canonical_codes", (np.array([1, 25], np.int64), np.zeros(2, np.int64))),
    ("canonical_codes", (np.array([1, -1], np.int64), np.zeros(2, np.int64))),
])
def test_table_kernels_check_their_arguments(name, args):
    c, _ = _twins()
    with pytest.raises(ValueError):
        getattr(c, name)(*args)
