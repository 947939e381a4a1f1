"""Quantize: error bounds per method, special values, dtypes, config and repr."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import CodecError, Quantize, dequantize, quantize
from ckptcodecs._floats import from_bf16_bits, to_bf16_bits
from ckptcodecs._qformat import decode_chunk
from common import check_config, check_encode_decode, check_repr

RNG = np.random.default_rng(7)
ROWS = RNG.standard_normal((50, 96)).astype(np.float32)
HEAVY = (RNG.standard_t(2.5, size=(40, 128)) * 0.05).astype(np.float32)


def _uniform_bound(codec):
    """|x - x'| <= scale/2 inside the segment's range, plus the clipping distance outside."""

    def check(arr, dec):
        codes, p = decode_chunk(np.frombuffer(codec.encode(arr), np.uint8))
        x = arr.reshape(-1).astype(np.float64)
        y = dec.reshape(-1).astype(np.float64)
        seg = np.arange(x.size) // p.seg_len
        lo = p.zero[seg].astype(np.float64)
        sc = p.scale[seg].astype(np.float64)
        hi = lo + sc * (p.nq - 1)
        clip = np.maximum(0, np.maximum(lo - x, x - hi))
        tol = sc / 2 + clip + 1e-5 * (np.abs(x) + np.abs(lo) + 1e-30)
        normal = codes < p.nq
        assert np.all(np.abs(x - y)[normal] <= tol[normal])

    return check


@pytest.mark.parametrize("method", ["uniform-symmetric", "uniform-asymmetric",
                                    "adaptive-asymmetric"])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("granularity", ["row", "group", "tensor"])
def test_uniform_methods_error_bound(method, bits, granularity):
    codec = Quantize(method, bits, granularity=granularity,
                     group_size=37 if granularity == "group" else None)
    check_encode_decode(ROWS, codec, _uniform_bound(codec))
    check_encode_decode(HEAVY, codec, _uniform_bound(codec))


def test_uniform_asymmetric_matches_definition():
    x = ROWS[:3]
    codes, p = quantize(x, "uniform-asymmetric", 4)
    lo, hi = x.min(axis=1), x.max(axis=1)
    scale = ((hi.astype(np.float64) - lo) / 15).astype(np.float32)
    np.testing.assert_array_equal(p.zero, lo)
    np.testing.assert_allclose(p.scale, scale, rtol=1e-6)
    expect = np.clip(np.floor((x - lo[:, None]) / scale[:, None] + 0.5), 0, 15)
    assert np.mean(codes.reshape(x.shape) == expect) > 0.999  # ties may round either way
    assert codes.reshape(x.shape).min(axis=1).tolist() == [0, 0, 0]
    assert codes.reshape(x.shape).max(axis=1).tolist() == [15, 15, 15]


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_adaptive_beats_uniform_asymmetric(bits):
    def err(method):
        c, p = quantize(HEAVY, method, bits)
        return np.linalg.norm(HEAVY - dequantize(c, p).reshape(HEAVY.shape), axis=1).mean()

    assert err("adaptive-asymmetric") < err("uniform-asymmetric")


def test_adaptive_ratio_limits_the_search():
    _, p_full = quantize(HEAVY, "adaptive-asymmetric", 2)
    _, p_none = quantize(HEAVY, "adaptive-asymmetric", 2, ratio=1 / 25)  # no iteration
    _, p_u = quantize(HEAVY, "uniform-asymmetric", 2)
    np.testing.assert_array_equal(p_none.zero, p_u.zero)
    assert not np.array_equal(p_full.zero, p_u.zero)


@pytest.mark.parametrize("levels", [None, 3, 5, 6])
@pytest.mark.parametrize("granularity", ["tensor", "group", "row"])
def test_kmeans_nearest_level(levels, granularity):
    codec = Quantize("kmeans", 3, granularity=granularity, levels=levels,
                     group_size=1000 if granularity == "group" else None)

    def check(arr, dec):
        _, p = decode_chunk(np.frombuffer(codec.encode(arr), np.uint8))
        assert p.nq == (levels or 8)
        x = arr.reshape(-1)
        seg = np.arange(x.size) // p.seg_len
        dist = np.abs(x[:, None] - p.codebook[seg].astype(np.float64))
        np.testing.assert_allclose(np.abs(x - dec.reshape(-1)), dist.min(axis=1), atol=1e-6)
        assert np.all(np.diff(p.codebook, axis=1) >= 0)

    check_encode_decode(HEAVY, codec, check)


def test_kmeans_lambda_moves_levels_outwards():
    _, p1 = quantize(HEAVY, "kmeans", 2, granularity="tensor", lam=1.0)
    _, p0 = quantize(HEAVY, "kmeans", 2, granularity="tensor", lam=0.0)
    assert np.abs(p0.codebook).max() > np.abs(p1.codebook).max()


def test_kmeans_is_deterministic_and_close_to_lloyd():
    from sklearn.cluster import KMeans

    x = HEAVY.reshape(-1)
    c, p = quantize(x, "kmeans", 3, granularity="tensor")
    ours = np.mean((x - dequantize(c, p)) ** 2)
    km = KMeans(8, n_init=3, random_state=0).fit(x[:, None].astype(np.float64))
    ref = km.inertia_ / x.size
    assert ours <= ref * 1.15
    _, p2 = quantize(x, "kmeans", 3, granularity="tensor")
    np.testing.assert_array_equal(p.codebook, p2.codebook)


def test_protect_and_prune_levels():
    x = HEAVY.reshape(-1)
    codec = Quantize("uniform-asymmetric", 4, granularity="tensor", protect=0.01, prune=0.2)
    codes, p = decode_chunk(np.frombuffer(codec.encode(x), np.uint8))
    assert (p.nq, p.prune_code, p.protect_code, p.levels) == (14, 14, 15, 16)
    dec = codec.decode(codec.encode(x))
    mag = np.abs(x)
    n_prot, n_prune = int(np.ceil(0.01 * x.size)), int(np.ceil(0.2 * x.size))
    prot = codes == p.protect_code
    assert prot.sum() == n_prot and (codes == p.prune_code).sum() == n_prune
    assert mag[prot].min() >= np.sort(mag)[-n_prot]
    np.testing.assert_array_equal(dec[prot], from_bf16_bits(to_bf16_bits(x[prot])))
    assert np.all(dec[codes == p.prune_code] == 0)
    assert mag[codes == p.prune_code].max() <= np.sort(mag)[n_prune - 1]


def test_non_finite_values_are_protected_exactly():
    x = ROWS.copy()
    x[0, 0], x[0, 5], x[3, 7] = np.nan, np.inf, -np.inf
    x[4, :] = 2.5  # constant row
    codec = Quantize("adaptive-asymmetric", 3)
    dec = codec.decode(codec.encode(x)).reshape(x.shape)
    assert np.isnan(dec[0, 0]) and dec[0, 5] == np.inf and dec[3, 7] == -np.inf
    assert np.all(dec[4] == 2.5)
    finite = np.isfinite(x)
    assert np.all(np.isfinite(dec[finite]))
    assert np.abs(dec[1:3] - x[1:3]).max() < 1.0  # other rows unaffected


@pytest.mark.parametrize("method", ["uniform-symmetric", "uniform-asymmetric",
                                    "adaptive-asymmetric", "kmeans"])
def test_constant_empty_and_all_nan(method):
    for x in (np.zeros((3, 5), np.float32), np.full(7, -3.25, np.float32),
              np.zeros((0, 8), np.float32), np.full(4, np.nan, np.float32),
              np.array([1e-30, -1e-30, 3e38, -3e38], np.float32)):
        codec = Quantize(method, 2)
        dec = np.asarray(codec.decode(codec.encode(x)))
        assert dec.shape == (x.size,) and dec.dtype == x.dtype
        same = np.isnan(x.reshape(-1)) | (np.abs(dec - x.reshape(-1)) <= 1e-6 * np.abs(x.reshape(-1)))
        if x.size and (x == x.reshape(-1)[0]).all() or np.isnan(x).all():
            assert same.all()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_dtypes_roundtrip(dtype):
    x = ROWS.astype(dtype)
    codec = Quantize("uniform-asymmetric", 8)
    dec = codec.decode(codec.encode(x))
    assert dec.dtype == np.dtype(dtype)
    np.testing.assert_allclose(dec.reshape(x.shape), x, atol=0.02)


def test_bfloat16_via_uint16_view():
    bits = to_bf16_bits(HEAVY)
    codec = Quantize("kmeans", 4, granularity="tensor", protect=0.01, dtype="bfloat16")
    dec = codec.decode(codec.encode(bits))
    assert dec.dtype == np.uint16
    err = np.abs(from_bf16_bits(dec) - from_bf16_bits(bits).reshape(-1))
    assert err.max() < np.abs(HEAVY).max() / 4
    with pytest.raises(CodecError):
        Quantize(dtype="float32").encode(bits)
    with pytest.raises(CodecError, match="bfloat16"):
        Quantize().encode(bits)  # uint16 is bfloat16 only when said so


def test_codes_are_packed_densely():
    x = RNG.standard_normal(8000).astype(np.float32)
    for bits in range(1, 9):
        enc = Quantize(bits=bits, granularity="tensor").encode(x)
        assert len(enc) == 31 + 8 + (8000 * bits + 7) // 8  # header + zero + scale + codes


def test_invalid_parameters():
    for kwargs in ({"method": "nope"}, {"bits": 0}, {"bits": 9}, {"granularity": "col"},
                   {"granularity": "group"}, {"protect": 0.6, "prune": 0.5}, {"lam": 2.0},
                   {"dtype": "int8"}, {"ratio": 0.0}, {"ratio": 1.5}, {"num_bins": 1},
                   {"levels": 0}, {"levels": 300}):
        with pytest.raises(CodecError):
            Quantize(**kwargs)
    with pytest.raises(CodecError):
        Quantize("uniform-asymmetric", 1, protect=0.1, prune=0.1).encode(ROWS)
    with pytest.raises(CodecError):
        Quantize("kmeans", 2, levels=4, protect=0.1).encode(ROWS)
    with pytest.raises(CodecError):
        Quantize().encode(np.arange(10))
    with pytest.raises(CodecError):
        quantize(ROWS, "uniform-asymmetric", 4, protect=1.5)


def test_config_and_repr():
    for codec in (Quantize(), Quantize("kmeans", 3, granularity="tensor", protect=0.001,
                                       prune=0.2, levels=5, lam=0.8),
                  Quantize("adaptive-asymmetric", 2, num_bins=30, ratio=0.6),
                  Quantize(granularity="group", group_size=64, dtype="bfloat16")):
        check_config(codec)
    check_repr("Quantize(method='kmeans', bits=3, granularity='tensor', group_size=None, "
               "protect=0.001, prune=0.0, levels=None, num_bins=None, ratio=1.0, lam=1.0, "
               "dtype=None)")


@pytest.mark.parametrize("k", [1, 2, 4, 5, 15, 16, 100, 256])
def test_nearest_codes_counts_midpoints_below(k):
    from ckptcodecs.kmeans import nearest_codes

    book = np.sort(RNG.standard_normal((2, k)), axis=1).astype(np.float32)
    if k > 3:
        book[:, 3] = book[:, 2]  # duplicate level
    x = RNG.standard_normal(4000).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, book[0, 0], book[0, -1]]
    x[2000:2010] = (book[1, :2].astype(np.float64).mean() if k > 1 else 0.0)  # on a midpoint
    out = np.empty(x.size, np.uint8)
    nearest_codes(x, 2000, book, out)
    for s in range(2):
        thr = (book[s, :-1].astype(np.float64) + book[s, 1:]) / 2
        seg = x[s * 2000:(s + 1) * 2000].astype(np.float64)
        expect = np.array([np.count_nonzero(thr < v) for v in seg])
        np.testing.assert_array_equal(out[s * 2000:(s + 1) * 2000], expect)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_protect_and_prune_sets_with_ties_are_disjoint(dtype):
    from ckptcodecs._select import select_magnitudes

    x = np.ones(1000, dtype)
    x[::7] = -1.0
    codes, p = quantize(x, "uniform-asymmetric", 3, granularity="tensor", protect=0.1, prune=0.2)
    assert np.count_nonzero(codes == p.protect_code) == 100
    assert np.count_nonzero(codes == p.prune_code) == 200
    y = RNG.standard_normal(5000).astype(dtype)
    y[:3] = [np.nan, np.inf, 1e300 if dtype == np.float64 else 3e38]
    top = select_magnitudes(y, 50, largest=True)
    assert 2 in top and 0 not in top and 1 not in top
    assert np.abs(y[top]).min() >= np.sort(np.abs(y[np.isfinite(y)]))[-50]
