"""quantize's uniform path in one call (``quant_uniform_all``, C) against its twin, the same
steps one kernel call at a time (``ckptcodecs.quantization._uniform_steps``): the same zero
points, scales, codes and status on every kind of value (NaN, infinities, subnormal and huge
ranges, masks, one level); hostile arguments raise ValueError; the one call runs without the
GIL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend, quantize
from ckptcodecs import quantization as Q
from helpers import spins_during

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

KINDS = ["normal", "specials", "subnormal", "huge", "constant"]
NO_MASK = np.zeros(0, np.uint8)


def _values(seed: int, n: int, dtype, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 0.05
    if kind == "specials" and n:  # NaN, infinities and signed zeros sprinkled in
        for v in (np.nan, np.inf, -np.inf, 0.0, -0.0):
            x[rng.integers(0, n, max(1, n // 50))] = v
    elif kind == "subnormal":  # ranges whose scale is subnormal: the float64 fallback
        x = x * (1e-42 if dtype == np.float32 else 1e-310)
    elif kind == "huge":  # ranges wider than the type: a scale of the type's max
        x = np.where(x > 0, 0.9, -0.9) * float(np.finfo(dtype).max)
    elif kind == "constant":
        x = np.full(n, rng.standard_normal())
    return x.astype(dtype)


def _both(x: np.ndarray, seg: int, mask: np.ndarray, nq: int, symmetric: bool):
    nseg = -(-x.size // seg) if x.size else 0
    outs = []
    for fn in (_backend.native().quant_uniform_all, Q._uniform_steps):
        zero, scale = np.full(nseg, 7, x.dtype), np.full(nseg, 7, x.dtype)
        codes = np.full(x.size, 0xA5, np.uint8)
        status = fn(x, seg, mask, nq, symmetric, zero, scale, codes)
        outs.append((status, zero, scale, codes))
    return outs


@settings(max_examples=80, deadline=None)
@given(n=st.one_of(st.integers(0, 40), st.integers(1000, 5000)),
       seg=st.sampled_from([1, 7, 64, 1000, 1 << 20]),
       dtype=st.sampled_from([np.float32, np.float64]), kind=st.sampled_from(KINDS),
       nq=st.sampled_from([1, 2, 3, 15, 16, 255, 256]), symmetric=st.booleans(),
       masked=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_one_call_is_the_steps(n, seg, dtype, kind, nq, symmetric, masked, seed):
    x = _values(seed, n, dtype, kind)
    mask = NO_MASK
    if masked and n:
        mask = (np.random.default_rng(seed).random(n) < 0.1).astype(np.uint8)
    (s1, z1, sc1, c1), (s2, z2, sc2, c2) = _both(x, seg, mask, nq, symmetric)
    assert s1 == s2
    if s1 == 0:  # else the caller recomputes everything in float64
        assert z1.tobytes() == z2.tobytes() and sc1.tobytes() == sc2.tobytes()
        assert (c1 == c2).all()


@pytest.mark.parametrize("method", ["uniform-asymmetric", "uniform-symmetric"])
@pytest.mark.parametrize("kind", KINDS)
def test_quantize_gives_the_same_chunk_either_way(method, kind, monkeypatch):
    x = _values(3, 1 << 14, np.float32, kind)
    fast = quantize(x, method, 4, protect=0.01)
    monkeypatch.setattr(Q, "_uniform", Q._uniform_steps)
    steps = quantize(x, method, 4, protect=0.01)
    assert (fast[0] == steps[0]).all()
    for name in ("zero", "scale", "protected"):
        assert getattr(fast[1], name).tobytes() == getattr(steps[1], name).tobytes(), name
    assert fast[1].param_dtype == steps[1].param_dtype


def _hostile(case: str):
    x = _values(1, 4096, np.float32, "normal")
    zero, scale = np.zeros(64, np.float32), np.zeros(64, np.float32)
    codes = np.zeros(4096, np.uint8)
    args = dict(x=x, seg=64, mask=NO_MASK, nq=16, symmetric=False, zero=zero, scale=scale,
                codes=codes) | {
        "x int32": dict(x=x.view(np.int32)),
        "zero float64": dict(zero=np.zeros(64)),
        "scale short": dict(scale=np.zeros(63, np.float32)),
        "codes short": dict(codes=np.zeros(4095, np.uint8)),
        "mask short": dict(mask=np.zeros(10, np.uint8)),
        "nq 0": dict(nq=0),
        "nq 257": dict(nq=257),
        "seg negative": dict(seg=-1),
        "zero is scale": dict(scale=zero),
        "codes inside x": dict(codes=x.view(np.uint8)),
    }[case]
    c = _backend.native().quant_uniform_all
    return lambda: c(args["x"], args["seg"], args["mask"], args["nq"], args["symmetric"],
                     args["zero"], args["scale"], args["codes"])


@pytest.mark.parametrize("case", ["x int32", "zero float64", "scale short", "codes short",
                                  "mask short", "nq 0", "nq 257", "seg negative",
                                  "zero is scale", "codes inside x"])
def test_hostile_arguments_raise_value_error(case):
    with pytest.raises(ValueError):
        _hostile(case)()


def test_the_one_call_runs_without_the_gil():
    x = _values(3, 1 << 23, np.float32, "normal")  # 32 MB: tens of milliseconds
    zero, scale = np.empty(1 << 17, np.float32), np.empty(1 << 17, np.float32)
    codes = np.empty(x.size, np.uint8)
    c = _backend.native().quant_uniform_all
    assert spins_during(lambda: c(x, 64, NO_MASK, 255, False, zero, scale, codes)) > 0
