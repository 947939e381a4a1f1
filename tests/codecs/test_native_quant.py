"""Quantize's compiled kernels against their numba twins, and on hostile arguments (issue 28).

The C kernels of the ``quant`` family (``ckptcodecs._qkernels``: segment ranges, uniform codes,
both dequantizers, float16 rounding and parameters) run on the same inputs as the numba ones --
NaN, +-inf, -0.0, subnormals, constant and empty segments, masks all set and all clear, huge and
tiny ranges, arrays from empty to beyond 64 KiB -- and write the same bytes, including what they
leave alone. Bad sizes, dtypes and overlapping buffers raise ValueError, never crash.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import CodecError, _backend, quantization
from ckptcodecs import _qkernels  # noqa: F401  (registers the family)

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

SIZES = st.one_of(st.integers(0, 40), st.integers(0, 3000), st.sampled_from([1 << 16, 70001]))
SEGS = st.sampled_from([1, 3, 16, 64, 1000, 4096, 1 << 17])
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 5e-324, 1e-310,
                     3.4e38, -3.4e38, 1e300, 65504.0, 65520.0, 6e-8])


def _twins():
    return (_backend.implementation("quant", "c"), _backend.implementation("quant", "numba"))


def _values(seed: int, n: int, dtype, kind: str) -> np.ndarray:
    """``n`` values: normal, of huge or tiny scale, with specials sprinkled in, constant runs,
    or mostly zeros of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    if kind == "scaled":
        x *= 10.0 ** rng.integers(-40, 39, n)
    elif kind == "specials" and n:
        at = rng.integers(0, n, max(1, n // 7))
        x[at] = rng.choice(SPECIALS, at.size)
    elif kind == "constant":
        x = np.repeat(rng.standard_normal(n // 50 + 1), 50)[:n]
    elif kind == "zeros":
        x = np.where(rng.random(n) < 0.5, 0.0, -0.0) + (rng.random(n) < 0.02) * x
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _mask(seed: int, n: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    if kind == "none":
        return np.zeros(0, np.uint8)
    if kind == "all":
        return np.ones(n, np.uint8)
    if kind == "clear":
        return np.zeros(n, np.uint8)
    return (rng.random(n) < 0.3).astype(np.uint8)


VALUES = dict(n=SIZES, dtype=st.sampled_from([np.float32, np.float64]), seg=SEGS,
              kind=st.sampled_from(["normal", "scaled", "specials", "constant", "zeros"]),
              seed=st.integers(0, 2**32 - 1))


@settings(max_examples=120, deadline=None)
@given(mask_kind=st.sampled_from(["none", "all", "clear", "some"]), extra=st.integers(0, 3),
       **VALUES)
def test_segment_ranges(n, dtype, seg, kind, seed, mask_kind, extra):
    x, mask = _values(seed, n, dtype, kind), _mask(seed, n, mask_kind)
    nseg = -(-n // seg) + extra  # segments past the end too: written as empty ones
    got = []
    for k in _twins():
        lo, hi, am = (np.full(nseg, 7, dtype) for _ in range(3))
        k.seg_minmax(x, seg, mask, lo, hi)
        k.seg_absmax(x, seg, mask, am)
        got.append((lo.tobytes(), hi.tobytes(), am.tobytes()))
    assert got[0] == got[1]


@settings(max_examples=120, deadline=None)
@given(nq=st.sampled_from([1, 2, 15, 16, 255]), scale_kind=st.sampled_from(["normal", "tiny",
                                                                            "huge", "zero"]),
       **VALUES)
def test_uniform_codes(n, dtype, seg, kind, seed, nq, scale_kind):
    x = _values(seed, n, dtype, kind)
    rng = np.random.default_rng(seed)
    nseg = -(-n // seg)
    zero = rng.standard_normal(nseg).astype(dtype)
    inv = {"normal": rng.random(nseg) * 10, "tiny": rng.random(nseg) * 1e-30,
           "huge": rng.random(nseg) * 1e30, "zero": np.zeros(nseg)}[scale_kind].astype(dtype)
    t = np.dtype(dtype).type
    got = []
    for k in _twins():
        out = np.full(n + 5, 200, np.uint8)
        k.uniform_codes(x, seg, zero, inv, t(nq - 1), t(0.5), t(0.0), out)
        got.append(out.tobytes())
    assert got[0] == got[1]


@settings(max_examples=120, deadline=None)
@given(n=SIZES, seg=SEGS, out_dtype=st.sampled_from([np.float32, np.float64]),
       param_dtype=st.sampled_from([np.float32, np.float64]), nq=st.integers(1, 256),
       specials=st.sampled_from([(None, None), (-1, None), (0, 1)]),
       lim=st.sampled_from([3.4028234663852886e38, 65504.0, 1.7976931348623157e308, 1.0]),
       seed=st.integers(0, 2**32 - 1))
def test_dequantizers(n, seg, out_dtype, param_dtype, nq, specials, lim, seed):
    rng = np.random.default_rng(seed)
    nseg = -(-n // seg)
    # prune/protect codes after the levels (as a chunk has them), or a protect code of -1
    prune, protect = (nq + s if s is not None and s >= 0 else s for s in specials)
    prune = nq if prune is None else prune
    protect = -1 if protect is None else protect
    codes = rng.integers(0, min(nq + 3, 256), n).astype(np.uint8)
    nprot = int(np.count_nonzero(codes == protect)) if protect >= 0 else 0
    prot = _values(seed, nprot + 2, out_dtype, "specials")
    zero = _values(seed + 1, nseg, param_dtype, "scaled")
    scale = _values(seed + 2, nseg, param_dtype, "specials")
    book = _values(seed + 3, nseg * nq, param_dtype, "specials").reshape(nseg, nq)
    got = []
    for k in _twins():
        out = np.full(n + 3, 7, out_dtype)
        k.dequant_uniform(codes, seg, zero, scale, nq, prune, protect, prot, lim, out)
        out2 = np.full(n + 3, 7, out_dtype)
        k.dequant_codebook(codes, seg, book, nq, prune, protect, prot, out2)
        got.append((out.tobytes(), out2.tobytes()))
    assert got[0] == got[1]


@settings(max_examples=100, deadline=None)
@given(n=SIZES, kind=st.sampled_from(["normal", "scaled", "specials", "zeros", "f16"]),
       direction=st.sampled_from([-1, 0, 1, -5, 7]), in_place=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_f16_round(n, kind, direction, in_place, seed):
    if kind == "f16":  # float16 values, the midpoints between them and their neighbours
        h = np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16)
        v = h.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            v = v + np.where(np.arange(n) % 3 == 0, 0.0, np.spacing(v.astype(np.float16))
                             .astype(np.float64) * (np.arange(n) % 3 - 1.5) / 3)
    else:
        v = _values(seed, n, np.float64, kind)
    got = []
    for k in _twins():
        src = v.copy()
        out = src if in_place else np.full(n, 9.0)
        k.f16_round(src, direction, out)
        got.append(out.tobytes())
    assert got[0] == got[1]
    if direction == 0:  # nearest-even: numpy's own cast
        with np.errstate(over="ignore", invalid="ignore"):
            ref = v.astype(np.float16).astype(np.float64)
        assert np.array_equal(np.frombuffer(got[0]), ref, equal_nan=True)


@pytest.mark.parametrize("path", _backend.native().simd_paths() if _backend.native() else [])
def test_f16_round_every_float16_neighbourhood(path):
    """Every finite float16 value, the doubles just around it and the midpoints to the next,
    on each CPU path (the rounding loops are compiled plain and for AVX2)."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float64)
    v = np.concatenate([h, np.nextafter(h, np.inf), np.nextafter(h, -np.inf),
                        (h[:-1] + h[1:]) / 2, [1e-300, 7e4, -7e4, 65519.99, 65520.0]])
    lo, hi = np.minimum(v, v[::-1]), np.maximum(v, v[::-1])
    before = _backend.native().simd()
    try:
        _backend.use_simd(path)
        for direction in (-1, 0, 1):
            c, ref = (np.empty_like(v) for _ in range(2))
            _twins()[0].f16_round(v, direction, c)
            _twins()[1].f16_round(v, direction, ref)
            assert c.tobytes() == ref.tobytes()
        for nq in (1, 16):
            got = []
            for k in _twins():
                zero, scale = np.empty_like(v), np.empty_like(v)
                got.append((k.uniform_params_f16(lo, hi, nq, zero, scale), zero.tobytes(),
                            scale.tobytes()))
            assert got[0] == got[1]
    finally:
        _backend.use_simd(before)


@settings(max_examples=100, deadline=None)
@given(n=SIZES, nq=st.sampled_from([0, 1, 2, 15, 255]),
       kind=st.sampled_from(["normal", "scaled", "specials", "constant", "zeros"]),
       seed=st.integers(0, 2**32 - 1))
def test_uniform_params_f16(n, nq, kind, seed):
    lo = _values(seed, n, np.float64, kind)
    with np.errstate(invalid="ignore"):
        hi = lo + np.abs(_values(seed + 1, n, np.float64, kind))
    got = []
    for k in _twins():
        zero, scale = np.full(n, 5.0), np.full(n, 5.0)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = k.uniform_params_f16(lo, hi, nq, zero, scale)
        got.append((bool(ok), zero.tobytes(), scale.tobytes()))
    assert got[0] == got[1]


def _c():
    return _twins()[0]


def _f(n, dtype=np.float32):
    return np.zeros(n, dtype)


E = np.zeros(0, np.uint8)
HOSTILE = {
    "minmax negative seg": lambda k: k.seg_minmax(_f(8), -1, E, _f(2), _f(2)),
    "minmax short mask": lambda k: k.seg_minmax(_f(8), 4, np.zeros(3, np.uint8), _f(2), _f(2)),
    "minmax lo/hi sizes": lambda k: k.seg_minmax(_f(8), 4, E, _f(2), _f(3)),
    "minmax int values": lambda k: k.seg_minmax(np.zeros(8, np.int32), 4, E, _f(2), _f(2)),
    "minmax overlap": lambda k: (lambda a: k.seg_minmax(a, 4, E, a[:2], _f(2)))(_f(8)),
    "absmax read-only out": lambda k: k.seg_absmax(_f(8), 4, E, np.broadcast_to(_f(1), (2,))),
    "codes short out": lambda k: k.uniform_codes(_f(8), 4, _f(2), _f(2), 15, .5, 0,
                                                 np.zeros(7, np.uint8)),
    "codes short inv": lambda k: k.uniform_codes(_f(8), 4, _f(2), _f(1), 15, .5, 0,
                                                 np.zeros(8, np.uint8)),
    "codes mixed floats": lambda k: k.uniform_codes(_f(8), 4, _f(2, np.float64), _f(2), 15,
                                                    .5, 0, np.zeros(8, np.uint8)),
    "codes qmax 300": lambda k: k.uniform_codes(_f(8), 4, _f(2), _f(2), 300, .5, 0,
                                                np.zeros(8, np.uint8)),
    "codes in place": lambda k: (lambda a: k.uniform_codes(a, 4, _f(2), _f(2), 15, .5, 0,
                                                           a.view(np.uint8)))(_f(8)),
    "dequant short out": lambda k: k.dequant_uniform(np.zeros(8, np.uint8), 4, _f(2), _f(2),
                                                     15, 15, 16, _f(0), 1.0, _f(7)),
    "dequant short scale": lambda k: k.dequant_uniform(np.zeros(8, np.uint8), 4, _f(2),
                                                       _f(1), 15, 15, 16, _f(0), 1.0, _f(8)),
    "dequant protected run out": lambda k: k.dequant_uniform(np.full(8, 16, np.uint8), 4,
                                                             _f(2), _f(2), 15, 15, 16, _f(3),
                                                             1.0, _f(8)),
    "codebook protected run out": lambda k: k.dequant_codebook(
        np.full(8, 16, np.uint8), 4, np.zeros((2, 15)), 15, 15, 16, _f(1), _f(8)),
    "codebook short rows": lambda k: k.dequant_codebook(np.zeros(8, np.uint8), 4,
                                                        np.zeros((2, 4)), 15, 15, 16, _f(0),
                                                        _f(8)),
    "codebook flat": lambda k: k.dequant_codebook(np.zeros(8, np.uint8), 4, np.zeros(30), 15,
                                                  15, 16, _f(0), _f(8)),
    "f16 float32": lambda k: k.f16_round(_f(4), 0, _f(4)),
    "f16 short out": lambda k: k.f16_round(_f(4, np.float64), 0, _f(3, np.float64)),
    "f16 shifted overlap": lambda k: (lambda a: k.f16_round(a[:4], 0, a[1:]))(
        _f(5, np.float64)),
    "params sizes": lambda k: k.uniform_params_f16(*(_f(3, np.float64),) * 2, 15,
                                                   _f(2, np.float64), _f(3, np.float64)),
    "params overlap": lambda k: (lambda a: k.uniform_params_f16(a, a, 15, a, _f(3, np.float64)))(
        _f(3, np.float64)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_arguments_raise_value_error(case):
    with pytest.raises((ValueError, TypeError)):
        HOSTILE[case](_c())


@pytest.mark.skipif(_backend.CHOICE != "c", reason="numba's kernel does not check (it reads on)")
def test_a_chunk_with_too_many_protect_codes_is_a_codec_error():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    codes, params = quantization.quantize(x, bits=4, protect=0.01)
    codes[:50] = params.protect_code  # more protect codes than protected values
    with pytest.raises(CodecError):
        quantization.dequantize(codes, params)


def test_round_trip_through_the_chosen_kernels():
    """quantize/dequantize under this process's kernels give the numba kernels' bytes."""
    x = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    x[3, 5], x[7, 9] = np.nan, -np.inf
    for kw in ({"method": "uniform-asymmetric"}, {"method": "uniform-symmetric"},
               {"param_dtype": "float16", "prune": 0.05, "protect": 0.01}):
        codes, params = quantization.quantize(x, bits=4, granularity="row", **kw)
        y = quantization.dequantize(codes, params)
        assert y.shape == (x.size,) and codes.dtype == np.uint8
