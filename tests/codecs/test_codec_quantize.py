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


def _greedy_reference(vals, nq, num_bins, ratio=1.0):
    """Check-N-Run's greedy search with exact errors, in plain numpy (one segment)."""
    lo0, hi0 = float(vals.min()), float(vals.max())
    H = num_bins * 4
    rg = hi0 - lo0
    if rg <= 0:
        return lo0, hi0
    u = (vals.astype(np.float64) - lo0) * (H / rg)

    def err(a, b):
        d = (b - a) / (nq - 1)
        c = np.clip(np.floor((u - a) / d + 0.5), 0, nq - 1)
        return float(((u - a - c * d) ** 2).sum())

    A, B = 0.0, float(H)
    best, ba, bb = err(A, B), A, B
    for _ in range(int(ratio * num_bins + 1e-9) - 1):
        ex, ey = err(A + 4, B), err(A, B - 4)
        if ex < ey:
            A, e = A + 4, ex
        else:
            B, e = B - 4, ey
        if e < best:
            best, ba, bb = e, A, B
    return lo0 + ba * (rg / H), lo0 + bb * (rg / H)


@pytest.mark.parametrize("bits,dim", [(2, 16), (3, 24), (4, 40), (8, 16), (8, 100)])
def test_adaptive_short_rows_search_exactly(bits, dim):
    from ckptcodecs.adaptive import (
        default_num_bins,
        direct_ranges,
        histogram_ranges,
        use_direct,
    )

    nq = 1 << bits
    assert use_direct(dim, nq) and not use_direct(2 * (nq - 1) + 17, nq)
    x = (RNG.standard_t(3, size=(61, dim)) * 0.05).astype(np.float32)  # odd row count: pairs
    x[3] = 0.25  # constant row
    x[4, :dim // 2] = np.nan  # masked values (protected): left out of the search
    x[5, 1:] = np.nan  # a single value
    flat = x.reshape(-1)
    mask = (~np.isfinite(flat)).astype(np.uint8)
    fin = np.where(mask.reshape(x.shape) == 0, x, np.nan)
    lo0 = np.nanmin(fin, axis=1).astype(np.float64)
    hi0 = np.nanmax(fin, axis=1).astype(np.float64)
    nb = default_num_bins(bits)
    lo, hi = lo0.copy(), hi0.copy()
    direct_ranges(flat, dim, mask, lo, hi, nq, nb, 1.0)
    ref = np.array([_greedy_reference(r[np.isfinite(r)], nq, nb) for r in fin])
    same = np.isclose(lo, ref[:, 0], rtol=1e-12, atol=0) & np.isclose(hi, ref[:, 1], rtol=1e-12,
                                                                       atol=0)
    assert same.mean() >= 0.95  # float ties may break differently
    assert (lo[3], hi[3], lo[5], hi[5]) == (0.25, 0.25, lo0[5], hi0[5])
    # the histogram search walks the same candidates with approximate errors: close results
    lh, hh = lo0.copy(), hi0.copy()
    histogram_ranges(flat, dim, mask, lh, hh, nq, nb, 1.0)

    def l2(lo_, hi_):
        d = np.where(hi_ > lo_, (hi_ - lo_) / (nq - 1), 1.0)[:, None]
        c = np.clip(np.floor((fin - lo_[:, None]) / d + 0.5), 0, nq - 1)
        return np.nansum((fin - lo_[:, None] - c * d) ** 2)

    assert l2(lo, hi) <= l2(lh, hh) * (1 + 1e-9)
    # and quantize() takes the exact search for these rows (sparse: NaN takes no level)
    _, p = quantize(x, "adaptive-asymmetric", bits, protect_mode="sparse")
    assert p.nq == nq
    np.testing.assert_allclose(p.zero, lo.astype(np.float32), rtol=1e-6, atol=1e-12)


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


@pytest.mark.parametrize("protect, prune", [(0.001, 0.01), (0.01, 0.95), (0.3, 0.6)])
def test_protect_and_prune_sets_ascend_whether_sorted_or_read_off_a_mask(protect, prune):
    from ckptcodecs.quantization import _partition

    x = HEAVY.reshape(-1).copy()
    x[::97] = np.nan  # non-finite values join the protected set
    prot, pruned = _partition(x, protect, prune)
    for got in (prot, pruned):
        assert got.dtype == np.int64 and np.all(np.diff(got) > 0)
    mag = np.where(np.isfinite(x), np.abs(x), np.inf)
    n_fin = int(np.isfinite(x).sum())
    assert prot.size == int(np.ceil(protect * n_fin)) + x[::97].size
    assert np.isnan(x[prot]).sum() == x[::97].size
    assert pruned.size == int(np.ceil(prune * n_fin)) and not np.isin(pruned, prot).any()
    assert mag[pruned].max() <= np.sort(mag)[pruned.size - 1]


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


# ---------------------------------------------------------------- protect_mode="sparse"

@pytest.mark.parametrize("method", ["uniform-symmetric", "uniform-asymmetric",
                                    "adaptive-asymmetric", "kmeans"])
@pytest.mark.parametrize("bits,prune", [(1, 0.0), (2, 0.0), (2, 0.1), (3, 0.2), (8, 0.0)])
def test_sparse_protection_uses_every_code(method, bits, prune):
    x = HEAVY.reshape(-1).copy()
    x[[5, 77, 300]] = [np.nan, np.inf, -np.inf]
    codec = Quantize(method, bits, granularity="tensor", protect=0.01, prune=prune,
                     protect_mode="sparse")
    enc = codec.encode(x)
    codes, p = decode_chunk(np.frombuffer(enc, np.uint8))
    assert enc[0] == 2 and p.sparse and not p.has_protect and p.protect_code == -1
    assert p.nq == (1 << bits) - (prune > 0) and p.levels == 1 << bits
    fin = np.isfinite(x)
    n_prot = int(np.ceil(0.01 * fin.sum()))
    pos = p.protect_positions
    assert pos.size == p.protected.size == n_prot + 3
    assert np.all(np.diff(pos) > 0) and {5, 77, 300} <= set(pos.tolist())
    top = np.sort(np.abs(x[fin]))[-n_prot]
    assert np.abs(x[pos][np.isfinite(x[pos])]).min() >= top
    dec = codec.decode(enc)
    np.testing.assert_array_equal(dec[pos], from_bf16_bits(to_bf16_bits(x[pos])))
    if prune:
        assert np.all(dec[codes == p.prune_code] == 0)
        assert not np.any(np.isin(np.flatnonzero(codes == p.prune_code), pos))
    rest = np.ones(x.size, bool)
    rest[pos] = False
    rest &= codes != p.prune_code
    if method == "kmeans":  # every other value decodes to its nearest level
        dist = np.abs(x[rest, None] - p.codebook[0].astype(np.float64))
        np.testing.assert_allclose(np.abs(x[rest] - dec[rest]), dist.min(axis=1), atol=1e-6)
    else:  # within the range of the unprotected values
        assert dec[rest].min() >= -np.abs(x[rest]).max() * 1.0001
        assert dec[rest].max() <= np.abs(x[rest]).max() * 1.0001


def test_sparse_matches_level_fit_with_one_level_more():
    x = HEAVY.reshape(-1)
    # the same values are fitted (protected ones excluded); sparse k-means has all 4 levels
    c_sp, p_sp = quantize(x, "kmeans", 2, granularity="tensor", protect=0.01,
                          protect_mode="sparse")
    _, p_lv = quantize(x, "kmeans", 2, granularity="tensor", protect=0.01, levels=4,
                          protect_mode="sparse")
    np.testing.assert_array_equal(p_sp.codebook, p_lv.codebook)
    _, p_3 = quantize(x, "kmeans", 2, granularity="tensor", protect=0.01)
    assert (p_3.nq, p_sp.nq) == (3, 4)
    np.testing.assert_array_equal(p_sp.protected, p_3.protected)  # same values, same order
    # codes at protected positions hold the nearest level, not a special code
    assert c_sp.max() < 4 and np.all(c_sp[p_sp.protect_positions] <= 3)
    with pytest.raises(CodecError):
        quantize(x, "kmeans", 2, levels=4, protect=0.01)  # level mode: no room for it


def test_sparse_parameter_block_rebuilds_the_chunk():
    from ckptcodecs import delta_decode, delta_encode, encode_chunk, pack_bits, packed_size

    # what ckptcodecs.qdelta does: chunk minus packed codes, then block + pack_bits(new codes)
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((64, 32)).astype(np.float32)
    x1 = x0 + 0.05 * rng.standard_normal(x0.shape).astype(np.float32)
    c0, p0 = quantize(x0, "kmeans", 3, granularity="tensor", protect=0.01, protect_mode="sparse")
    c1, p1 = quantize(x1, "kmeans", 3, granularity="tensor", protect=0.01, protect_mode="sparse")
    full = encode_chunk(c1, p1)
    block = full[:len(full) - packed_size(p1.count, p1.bits)]
    res = delta_encode(c1, c0, (p1.levels, p0.levels))
    codes = delta_decode(res, c0, (p1.levels, p0.levels))
    c2, p2 = decode_chunk(np.frombuffer(block + pack_bits(codes, p1.bits).tobytes(), np.uint8))
    np.testing.assert_array_equal(c2, c1)
    np.testing.assert_array_equal(p2.protect_positions, p1.protect_positions)
    np.testing.assert_array_equal(dequantize(c2, p2), dequantize(c1, p1))
    assert encode_chunk(c2, p2) == full


def _sparse_chunk():
    x = ROWS.reshape(-1)[:120].copy()
    codec = Quantize("uniform-asymmetric", 4, granularity="tensor", protect=0.05,
                     protect_mode="sparse")
    enc = bytearray(codec.encode(x))
    _, p = decode_chunk(np.frombuffer(bytes(enc), np.uint8))
    return codec, enc, p


def test_sparse_positions_are_validated():
    import struct

    from ckptcodecs._qformat import HEADER_SIZE_V2

    codec, enc, p = _sparse_chunk()
    assert p.protected.size == 6
    start = HEADER_SIZE_V2 + 8  # after zero and scale
    gaps = np.diff(p.protect_positions, prepend=0)
    assert gaps.max() < 128  # one byte each
    for i, value in [(1, 0), (0, 0x7F), (5, 0x7F)]:  # repeated position; beyond count
        bad = bytearray(enc)
        bad[start + i] = value
        with pytest.raises(CodecError, match="strictly increasing"):
            codec.decode(bytes(bad))
    bad = bytearray(enc)
    bad[start + 2] |= 0x80  # a varint runs into the next: one varint too few
    with pytest.raises(CodecError, match="varints"):
        codec.decode(bytes(bad))
    for npos in (5, 7, 43, 1 << 60):  # fewer bytes than values, wrong, > 7 each, absurd
        bad = bytearray(enc)
        struct.pack_into("<Q", bad, 31, npos)
        with pytest.raises(CodecError):
            codec.decode(bytes(bad))
    bad = bytearray(enc)
    bad[3] = 2  # a protect-level flag in a sparse chunk
    with pytest.raises(CodecError, match="flags"):
        codec.decode(bytes(bad))
    with pytest.raises(CodecError, match="truncated"):
        codec.decode(bytes(enc[:35]))


def test_varints_roundtrip_and_reject_overlong():
    from ckptcodecs._qformat import varint_decode, varint_encode

    v = np.array([0, 1, 127, 128, 16383, 16384, 2**49 - 1, 12345678901], np.uint64)
    enc = varint_encode(v)
    assert varint_encode([0, 1, 127, 128, 300]) == bytes.fromhex("00017f8001ac02")
    np.testing.assert_array_equal(varint_decode(np.frombuffer(enc, np.uint8), v.size), v)
    with pytest.raises(CodecError):
        varint_encode([2**49])
    with pytest.raises(CodecError, match="too long"):
        varint_decode(np.frombuffer(b"\x80" * 7 + b"\x01", np.uint8), 1)
    with pytest.raises(CodecError):
        varint_decode(np.frombuffer(b"\x80", np.uint8), 1)


def test_protect_mode_config():
    sparse = Quantize("kmeans", 2, granularity="tensor", protect=0.001, protect_mode="sparse")
    check_config(sparse)
    assert sparse.get_config()["protect_mode"] == "sparse"
    assert "protect_mode" not in Quantize(protect=0.01).get_config()  # old configs unchanged
    assert Quantize(protect_mode="level") == Quantize()
    check_repr("Quantize(method='kmeans', bits=2, granularity='tensor', group_size=None, "
               "protect=0.001, prune=0.0, levels=None, num_bins=None, ratio=1.0, lam=1.0, "
               "dtype=None, protect_mode='sparse')")
    with pytest.raises(CodecError, match="protect_mode"):
        Quantize(protect_mode="list")
    with pytest.raises(CodecError, match="protect_mode"):
        quantize(ROWS, protect_mode="nope")
    # level mode still writes format version 1
    assert Quantize(protect=0.01).encode(ROWS)[0] == 1


def test_sparse_without_protection_and_dtypes():
    for dtype in ("float16", "float64"):
        x = ROWS.astype(dtype)
        codec = Quantize("adaptive-asymmetric", 3, protect_mode="sparse")
        _, p = decode_chunk(np.frombuffer(codec.encode(x), np.uint8))
        assert p.protected.size == 0 and p.nq == 8
        dec = codec.decode(codec.encode(x))
        assert dec.dtype == np.dtype(dtype)
        ref = Quantize("adaptive-asymmetric", 3).decode(Quantize("adaptive-asymmetric", 3)
                                                        .encode(x))
        np.testing.assert_array_equal(dec, ref)  # no protected values: same as level mode


# ---------------------------------------------------------------- param_dtype="float16"

NARROW = (RNG.standard_normal((300, 16)) * 0.02).astype(np.float32)


def _is_f16(a):
    a = np.asarray(a, np.float64)
    return np.array_equal(a.astype(np.float16).astype(np.float64), a)


@pytest.mark.parametrize("method", ["uniform-symmetric", "uniform-asymmetric",
                                    "adaptive-asymmetric"])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_float16_params_error_bound(method, bits):
    codec = Quantize(method, bits, param_dtype="float16")
    for x in (NARROW, HEAVY, ROWS.astype(np.float64)):
        check_encode_decode(x, codec, _uniform_bound(codec))
        codes, p = decode_chunk(np.frombuffer(codec.encode(x), np.uint8))
        assert p.param_dtype == "float16" and _is_f16(p.zero) and _is_f16(p.scale)
        assert p.zero.dtype == (np.float64 if x.dtype == np.float64 else np.float32)
        if method != "adaptive-asymmetric":  # zero rounded down, scale up: nothing is clipped
            xr = x.reshape(-1, p.seg_len).astype(np.float64)
            hi = p.zero.astype(np.float64) + p.scale * (p.nq - 1.0)
            assert np.all(xr.min(axis=1) >= p.zero) and np.all(xr.max(axis=1) <= hi)
            dec = codec.decode(codec.encode(x)).reshape(xr.shape).astype(np.float64)
            assert np.all(np.abs(dec - xr) <= p.scale[:, None] / 2 * (1 + 1e-6) + 1e-12)


@pytest.mark.parametrize("method", METHODS_ALL := ["uniform-symmetric", "uniform-asymmetric",
                                                   "adaptive-asymmetric", "kmeans"])
def test_float16_codes_use_the_rounded_params(method):
    codes, p = quantize(NARROW, method, 3, param_dtype="float16")
    x = NARROW.astype(np.float64)
    if method == "kmeans":
        assert _is_f16(p.codebook) and np.all(np.diff(p.codebook, axis=1) >= 0)
        dist = np.abs(x.reshape(-1, 16)[:, :, None] - p.codebook[:, None, :])
        best = np.take_along_axis(dist, codes.reshape(-1, 16, 1).astype(np.intp), 2)[..., 0]
        np.testing.assert_array_equal(best, dist.min(axis=2))  # nearest stored level
    else:
        t = (x - p.zero[:, None]) / p.scale[:, None]
        expect = np.clip(np.floor(t + 0.5), 0, p.nq - 1)
        near_tie = np.abs(t - np.floor(t) - 0.5) < 1e-4
        assert np.all((codes.reshape(x.shape) == expect) | near_tie)
    # decoding uses exactly the stored parameters: the in-memory ones give the same values
    enc = Quantize(method, 3, param_dtype="float16").encode(NARROW)
    c2, p2 = decode_chunk(np.frombuffer(enc, np.uint8))
    np.testing.assert_array_equal(c2, codes)
    np.testing.assert_array_equal(dequantize(c2, p2), dequantize(codes, p))


@pytest.mark.parametrize("method", METHODS_ALL)
def test_float16_params_halve_the_parameter_bytes(method):
    for protect_mode in ("level", "sparse"):
        kw = dict(protect=0.01, protect_mode=protect_mode)
        e32 = Quantize(method, 2, **kw).encode(NARROW)
        e16 = Quantize(method, 2, param_dtype="float16", **kw).encode(NARROW)
        nparam = 300 * (4 if method == "kmeans" and protect_mode == "sparse" else
                        3 if method == "kmeans" else 2)
        assert len(e32) - len(e16) == 2 * nparam
        assert e16[3] & 4 and not e32[3] & 4 and e16[0] == e32[0]
        c32, _ = decode_chunk(np.frombuffer(e32, np.uint8))
        c16, p16 = decode_chunk(np.frombuffer(e16, np.uint8))
        assert p16.param_dtype == "float16" and c16.size == c32.size
        # the parameter block is all but the packed codes (ckptcodecs.qdelta relies on it)
        from ckptcodecs import encode_chunk, pack_bits, packed_size

        block = e16[:len(e16) - packed_size(p16.count, p16.bits)]
        assert block + pack_bits(c16, p16.bits).tobytes() == e16
        assert encode_chunk(c16, p16) == e16
    # float16 barely changes the error of embedding-like rows
    err = {pd: np.linalg.norm(NARROW - Quantize(method, 2, param_dtype=pd).decode(
        Quantize(method, 2, param_dtype=pd).encode(NARROW)).reshape(NARROW.shape), axis=1).mean()
        for pd in ("float32", "float16")}
    assert err["float16"] <= err["float32"] * 1.02


def test_float16_default_is_float32_and_bit_identical():
    for x in (ROWS, HEAVY, ROWS.astype(np.float64), to_bf16_bits(HEAVY)):
        kw = {"dtype": "bfloat16"} if x.dtype == np.uint16 else {}
        a = Quantize("adaptive-asymmetric", 3, **kw).encode(x)
        assert Quantize("adaptive-asymmetric", 3, param_dtype="float32", **kw).encode(x) == a
        assert not a[3] & 4
    # float64 data keeps float64 parameters unless float16 is asked
    assert len(Quantize(bits=8).encode(ROWS.astype(np.float64))) == 31 + 50 * 16 + 50 * 96
    assert (len(Quantize(bits=8, param_dtype="float16").encode(ROWS.astype(np.float64)))
            == 31 + 50 * 4 + 50 * 96)


@pytest.mark.parametrize("method", METHODS_ALL)
def test_float16_overflow_keeps_float32_params_for_the_chunk(method):
    x = NARROW.copy()
    x[7] *= 1e7  # values beyond +-65504
    c16 = Quantize(method, 3, param_dtype="float16")
    enc = c16.encode(x)
    _, p = decode_chunk(np.frombuffer(enc, np.uint8))
    assert p.param_dtype == "float32" and not enc[3] & 4
    assert enc == Quantize(method, 3).encode(x)  # the whole chunk as without the option
    # a scale beyond the float16 range (values inside it) falls back as well
    wide = np.array([[-60000.0, 60000.0, 0.0, 1.0]], np.float32)
    _, p = quantize(wide, "uniform-asymmetric", 1, param_dtype="float16")
    assert p.param_dtype == "float32"
    _, p = quantize(wide, "uniform-asymmetric", 4, param_dtype="float16")
    assert p.param_dtype == "float16" and p.scale[0] * 15 + p.zero[0] >= 60000
    # float16 data: the largest values are representable
    h = np.array([[-65504.0, 65504.0, 3.0]], np.float16)
    dec = Quantize("kmeans", 2, param_dtype="float16").decode(
        Quantize("kmeans", 2, param_dtype="float16").encode(h))
    np.testing.assert_array_equal(dec, h.reshape(-1))


def test_float16_tiny_constant_and_special_rows():
    x = np.zeros((6, 16), np.float32)
    x[0] = 0.1  # constant, not a float16 value
    x[1] = np.linspace(0, 1e-6, 16)  # scale below the smallest normal float16 (subnormal)
    x[2] = np.linspace(1e-30, 2e-30, 16)  # scale below the smallest float16: rounded up
    x[3, :3] = [np.nan, np.inf, -np.inf]
    x[4] = 2.5  # constant and a float16 value: exact
    for method in ("uniform-asymmetric", "adaptive-asymmetric", "uniform-symmetric"):
        codec = Quantize(method, 4, param_dtype="float16")
        codes, p = decode_chunk(np.frombuffer(codec.encode(x), np.uint8))
        dec = codec.decode(codec.encode(x)).reshape(x.shape)
        assert np.isnan(dec[3, 0]) and dec[3, 1] == np.inf and dec[3, 2] == -np.inf
        fin = np.isfinite(x)
        tol = p.scale[np.nonzero(fin)[0]] / 2 * (1 + 1e-6)
        assert np.all(np.abs(dec[fin] - x[fin]) <= tol)
        if method != "uniform-symmetric":  # the scale absorbs the rounding of the zero point
            assert np.all(np.abs(dec[0] - 0.1) < 1e-6)
            assert np.all(dec[4] == 2.5) and np.all(dec[5] == 0)


def test_float16_chunks_validated():
    codec = Quantize(bits=2, param_dtype="float16")
    enc = codec.encode(NARROW[:10])
    assert len(enc) == 31 + 10 * 4 + 40
    for cut in (0, 30, 31, 50, len(enc) - 1):
        with pytest.raises(CodecError, match="truncated|bytes"):
            codec.decode(enc[:cut])
    bad = bytearray(enc)
    bad[3] &= ~4  # float16 parameters read as float32: the size no longer matches
    with pytest.raises(CodecError, match="implies"):
        codec.decode(bytes(bad))
    e32 = bytearray(Quantize(bits=2).encode(NARROW[:10]))
    e32[3] |= 4
    with pytest.raises(CodecError, match="implies"):
        codec.decode(bytes(e32))
    for flag in (8, 0x80):
        bad = bytearray(enc)
        bad[3] |= flag
        with pytest.raises(CodecError, match="flags"):
            codec.decode(bytes(bad))
    # hand-built parameters must be float16 values for a float16 chunk
    from ckptcodecs import encode_chunk

    codes, p = quantize(NARROW[:10], "uniform-asymmetric", 2, param_dtype="float16")
    p.scale = p.scale + np.float32(1e-7)
    with pytest.raises(CodecError, match="float16"):
        encode_chunk(codes, p)
    p.param_dtype = "bfloat16"
    with pytest.raises(CodecError, match="param_dtype"):
        encode_chunk(codes, p)


def test_param_dtype_config():
    f16 = Quantize("kmeans", 2, param_dtype="float16")
    check_config(f16)
    assert f16.get_config()["param_dtype"] == "float16"
    assert "param_dtype" not in Quantize().get_config()  # float32 configs unchanged
    assert Quantize(param_dtype="float32") == Quantize()
    check_repr("Quantize(method='kmeans', bits=2, granularity='row', group_size=None, "
               "protect=0.0, prune=0.0, levels=None, num_bins=None, ratio=1.0, lam=1.0, "
               "dtype=None, param_dtype='float16')")
    for bad in ("float64", "bfloat16", None):
        with pytest.raises(CodecError, match="param_dtype"):
            Quantize(param_dtype=bad)
        with pytest.raises(CodecError, match="param_dtype"):
            quantize(ROWS, param_dtype=bad)


def test_float16_directed_rounding_against_every_float16():
    from ckptcodecs._qkernels import uniform_params_f16

    grid = np.unique(np.arange(1 << 16, dtype=np.uint16).view(np.float16)[
        np.isfinite(np.arange(1 << 16, dtype=np.uint16).view(np.float16))].astype(np.float64))
    mids = (grid[1:] + grid[:-1]) / 2
    rng = np.random.default_rng(11)
    v = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-12, 7, 20000), grid,
                        mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        [0.0, 65504.0, 65519.0, 65520.0, 70000.0, 1e300, 5e-324, 2.0 ** -25]])
    v = np.concatenate([v, -v])
    i = np.searchsorted(grid, v, side="right") - 1
    down = np.where((i >= 0) & (np.abs(v) <= 65504), grid[np.maximum(i, 0)], -np.inf)
    # lo = hi = v, nq = 2: zero = down(v), scale = up(v - zero); False once some |v| > 65504
    zero, scale = np.empty(v.size), np.empty(v.size)
    assert not uniform_params_f16(v, v, 2, zero, scale)
    fin = np.abs(v) <= 65504
    zero, scale = np.empty(fin.sum()), np.empty(fin.sum())
    assert uniform_params_f16(v[fin], v[fin], 2, zero, scale)
    np.testing.assert_array_equal(zero, down[fin])
    gap = v[fin] - zero  # >= 0: the float64 difference the kernel divides by nq - 1 = 1
    j = np.searchsorted(grid, gap, side="left")
    np.testing.assert_array_equal(scale, grid[j])
    # nq == 1: the midpoint to nearest (ties to even), as numpy's float16 conversion
    inside = np.abs(v) < 65520
    zero1, scale1 = np.empty(inside.sum()), np.empty(inside.sum())
    assert uniform_params_f16(v[inside], v[inside], 1, zero1, scale1)
    np.testing.assert_array_equal(zero1, v[inside].astype(np.float16).astype(np.float64))
    assert not scale1.any()


def test_float16_large_offset_rows_fall_back():
    # values beyond +-65504 with a small spread: a float16 zero point cannot be near them
    x = np.full((2, 16), 90000.0, np.float32)
    x[:, ::2] += 1.0
    codec = Quantize("uniform-asymmetric", 4, param_dtype="float16")
    _, p = decode_chunk(np.frombuffer(codec.encode(x), np.uint8))
    assert p.param_dtype == "float32"
    np.testing.assert_allclose(codec.decode(codec.encode(x)).reshape(x.shape), x, atol=0.05)


@pytest.mark.parametrize("bits,dim,ratio", [(4, 200, 1.0), (3, 1000, 0.5), (8, 3000, 1.0)])
def test_adaptive_search_from_counts_equals_the_search_of_values(bits, dim, ratio):
    """The histogram search fed with cell counts made elsewhere (a GPU counts them,
    ckptstore.device.quant) finds exactly the ranges it finds from the values."""
    from ckptcodecs.adaptive import (
        HIST_PER_BIN,
        default_num_bins,
        histogram_ranges,
        histogram_ranges_from_counts,
    )

    nq = 1 << bits
    x = (RNG.standard_t(3, size=(41, dim)) * 0.05).astype(np.float32)
    x[3] = 0.25  # constant row: no search
    flat = x.reshape(-1)
    lo0 = x.min(axis=1).astype(np.float64)
    hi0 = x.max(axis=1).astype(np.float64)
    nb = default_num_bins(bits)
    cells = nb * HIST_PER_BIN
    rg = hi0 - lo0
    f = np.where(rg > 0, cells / np.where(rg > 0, rg, 1.0), 0.0)
    idx = np.clip(((x.astype(np.float64) - lo0[:, None]) * f[:, None]).astype(np.int64), 0,
                  cells - 1)
    counts = np.stack([np.bincount(r, minlength=cells) for r in idx]).astype(np.int32)
    lo, hi = lo0.copy(), hi0.copy()
    histogram_ranges(flat, dim, np.zeros(0, np.uint8), lo, hi, nq, nb, ratio)
    lc, hc = lo0.copy(), hi0.copy()
    histogram_ranges_from_counts(counts, lc, hc, nq, nb, ratio)
    assert np.array_equal(lo, lc) and np.array_equal(hi, hc)
    assert (lo != lo0).any()  # the search moved ranges
    with pytest.raises(ValueError, match="counts of shape"):
        histogram_ranges_from_counts(counts[:, 1:], lc, hc, nq, nb, ratio)


@pytest.mark.parametrize("k,lam", [(4, 1.0), (16, 0.3), (255, 0.1)])
def test_kmeans_fit_from_buckets_equals_the_fit_of_values(k, lam):
    """The k-means fit fed with bucket counts and sums made elsewhere (a GPU makes them,
    ckptstore.device.quant) gives exactly the levels it fits from the values."""
    from ckptcodecs.kmeans import MANTISSA_BITS, fit_codebooks, fit_from_buckets

    seg = 3000
    x = (RNG.standard_t(3, size=4 * seg) * 0.05).astype(np.float32)
    x[seg: 2 * seg] = 0.5  # a constant segment: one bucket
    bits = x.view(np.uint32)
    want = np.empty((4, k))
    fit_codebooks(x, bits, seg, np.zeros(0, np.uint8), k, lam, 7, want)
    ordered = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(1 << 31))
    keys = (np.arange(x.size) // seg << 16) | (ordered >> (23 - MANTISSA_BITS)).astype(np.int64)
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.zeros(uniq.size)
    np.add.at(sums, inverse, x.astype(np.float64))
    offsets = np.searchsorted(uniq >> 16, np.arange(5))
    got = np.empty((4, k))
    fit_from_buckets(counts, sums, offsets, k, lam, 7, got)
    assert np.array_equal(got, want)
    assert len(np.unique(got[1])) == 1  # the constant segment
