"""Hypothesis fuzzing (NaN, +-inf, constant rows, empty arrays, huge and tiny magnitudes) and
corrupted or truncated payloads, which must raise CodecError -- never crash, hang or
allocate without bound."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import (
    CodecError,
    Quantize,
    RLEHuffman,
    delta_decode,
    delta_encode,
    rle_huffman_decode,
    rle_huffman_encode,
)
from common import fixture_cases
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, -0.0, 1e-38, -1e-45, 3.4e38, -3.4e38, 1e30, 1.0]),
)
ARRAYS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=40),
                    elements=FLOATS)
CODECS = st.builds(
    Quantize,
    method=st.sampled_from(["uniform-symmetric", "uniform-asymmetric", "adaptive-asymmetric",
                            "kmeans"]),
    bits=st.integers(2, 8),
    granularity=st.sampled_from(["row", "tensor", "group"]),
    group_size=st.just(7),
    protect=st.sampled_from([0.0, 0.05]),
    prune=st.sampled_from([0.0, 0.1]),
    protect_mode=st.sampled_from(["level", "sparse"]),
    param_dtype=st.sampled_from(["float32", "float16"]),
)


@settings(max_examples=150, deadline=None)
@given(ARRAYS, CODECS)
def test_quantize_fuzz(x, codec):
    dec = np.asarray(codec.decode(codec.encode(x)))
    assert dec.shape == (x.size,) and dec.dtype == np.float32
    flat = x.reshape(-1)
    nan = np.isnan(flat)
    assert np.array_equal(np.isnan(dec), nan)  # NaN restored, never created
    inf = np.isinf(flat)
    assert np.array_equal(dec[inf], flat[inf])
    fin = ~(nan | inf)
    if fin.any():
        # decoded finite values stay within the finite input range (up to bfloat16 rounding;
        # symmetric levels span [-max|x|, max|x|]; pruned values are 0)
        lo, hi = np.float64(flat[fin].min()), np.float64(flat[fin].max())
        if codec.method == "uniform-symmetric":
            lo, hi = -max(-lo, hi), max(-lo, hi)
        if codec.prune:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        d = dec[fin].astype(np.float64)
        tol = 1e-6 * (hi - lo) + 1e-30  # float32 parameters
        if codec.param_dtype == "float16":
            # zero point rounded down (11 significant bits, or to a multiple of 2**-24), scale
            # rounded up: the top level may pass the maximum by (levels - 1) ulps of the scale
            tol = 2.0 ** -10 * (hi - lo + abs(lo) + abs(hi)) + 256 * 2.0 ** -24
        assert np.all(d >= lo - 0.01 * abs(lo) - tol)
        assert np.all(d <= hi + 0.01 * abs(hi) + tol)
    # constant rows decode exactly (symmetric levels need not contain the constant; protected
    # values are rounded to bfloat16)
    if (x.ndim == 2 and x.shape[1] and codec.granularity == "row" and not codec.prune
            and not codec.protect and codec.method != "uniform-symmetric"):
        for i, row in enumerate(x):
            if np.all(row == row[0]) and np.isfinite(row[0]):
                c = np.float64(row[0])
                if codec.param_dtype == "float16" and not (abs(c) <= 65504
                                                           and np.float16(c) == c):
                    # within half a (float16, rounded up) scale of the constant
                    err = np.abs(dec.reshape(x.shape)[i] - c)
                    assert np.all(err <= 2.0 ** -11 * abs(c) + 2.0 ** -24)
                else:
                    assert np.all(dec.reshape(x.shape)[i] == row[0])


@settings(max_examples=150, deadline=None)
@given(st.one_of(
    st.binary(max_size=2000),
    st.lists(st.tuples(st.integers(0, 4), st.integers(1, 500)), max_size=50).map(
        lambda runs: bytes(b for v, n in runs for b in [v] * n))))
def test_rle_huffman_fuzz(data):
    assert rle_huffman_decode(rle_huffman_encode(data)).tobytes() == data


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_bucket_delta_fuzz(data):
    n = data.draw(st.integers(0, 300))
    k0 = data.draw(st.integers(1, 256))
    k1 = data.draw(st.integers(1, 256))
    base = np.array(data.draw(st.lists(st.integers(0, k0 - 1), min_size=n, max_size=n)), np.uint8)
    new = np.array(data.draw(st.lists(st.integers(0, k1 - 1), min_size=n, max_size=n)), np.uint8)
    res = delta_encode(new, base, (k0, k1))
    np.testing.assert_array_equal(delta_decode(res, base, (k0, k1)), new)


def _payloads():
    rng = np.random.default_rng(1)
    out = []
    for name, codec, arr in fixture_cases():
        out.append((name, codec, bytes(memoryview(codec.encode(arr)).cast("B"))))
    x = rng.standard_normal((64, 64)).astype(np.float32)
    out.append(("kmeans-big", Quantize("kmeans", 4, protect=0.01, granularity="tensor"),
                Quantize("kmeans", 4, protect=0.01, granularity="tensor").encode(x)))
    sparse = Quantize("kmeans", 4, protect=0.01, granularity="tensor", protect_mode="sparse")
    out.append(("kmeans-big-sparse", sparse, sparse.encode(x)))
    runs = np.repeat(rng.integers(0, 9, 500), rng.integers(1, 60, 500)).astype(np.uint8)
    out.append(("rle-big", RLEHuffman(), RLEHuffman().encode(runs)))
    return out


PAYLOADS = _payloads()


@pytest.mark.parametrize("name,codec,enc", PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_truncated_payloads_raise(name, codec, enc):
    for cut in sorted(set(range(0, len(enc), max(1, len(enc) // 60))) | {len(enc) - 1}):
        if cut >= len(enc):
            continue
        with pytest.raises(CodecError):
            codec.decode(enc[:cut])
    with pytest.raises(CodecError):
        codec.decode(enc + b"\x00")


@pytest.mark.parametrize("name,codec,enc", PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_corrupted_payloads_never_crash(name, codec, enc):
    rng = np.random.default_rng(len(enc))
    for trial in range(150):
        buf = bytearray(enc)
        if not buf:
            break
        for _ in range(rng.integers(1, 4)):
            pos = int(rng.integers(0, min(len(buf), 64))) if trial % 2 else int(
                rng.integers(0, len(buf)))
            buf[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            dec = codec.decode(bytes(buf))
        except CodecError:
            continue
        assert np.asarray(dec).nbytes <= 64 * len(enc) + (1 << 20)  # no runaway allocation


def test_huge_claimed_sizes_are_refused_before_allocation():
    import struct

    enc = bytearray(Quantize().encode(np.zeros((4, 4), np.float32)))
    struct.pack_into("<Q", enc, 7, 1 << 60)  # count
    with pytest.raises(CodecError):
        Quantize().decode(bytes(enc))
    raw = bytearray(rle_huffman_encode(b"abc"))
    struct.pack_into("<Q", raw, 2, 1 << 60)
    with pytest.raises(CodecError):
        rle_huffman_decode(bytes(raw))
    coded = bytearray(rle_huffman_encode(bytes(100_000)))
    struct.pack_into("<Q", coded, 2, 1 << 40)
    with pytest.raises(CodecError, match="checksum"):
        rle_huffman_decode(bytes(coded))
