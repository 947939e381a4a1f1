"""BytePlanes' encode in one call (``planes_encode_layout``, C) against its twin, the same steps
one kernel call at a time (``ckptcodecs.planes._layout_steps``): the same planes, samples,
choices, layout and return values on every kind of plane, with and without zstd trials; hostile
arguments raise ValueError; the one call runs without the GIL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend
from ckptcodecs import planes as P
from helpers import spins_during

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

KINDS = ["normal", "runs", "zeros", "bytes"]


def _values(seed: int, n: int, itemsize: int, kind: str) -> np.ndarray:
    """``n`` items of ``itemsize`` bytes: weights, long runs (zstd trials), zeros, noise."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n * itemsize // 4 + 1).astype(np.float32) * 0.02
        return x.view(np.uint8)[:n * itemsize].copy()
    if kind == "runs":
        return np.repeat(rng.integers(0, 4, n * itemsize // 64 + 1, dtype=np.uint8),
                         64)[:n * itemsize].copy()
    if kind == "zeros":
        return np.zeros(n * itemsize, np.uint8)
    return rng.integers(0, 256, n * itemsize, dtype=np.uint8)


def _args(src: np.ndarray, itemsize: int, fill: int) -> dict:
    """The arguments planes_encode passes, every buffer filled with ``fill`` beforehand."""
    n = src.size // itemsize
    stride, base = P._PLANE.size + n, P._HEAD.size + P._PLANE.size
    step = start = length = 0
    if n > P.SMALL:
        length, step = min(n, P.NEAR), max(P.SPARSE, n // P.STRIDED)
        step += (1, 0, 3, 2, 1, 0)[step % 6]
        start = (n - length) // 2
    return dict(out=np.full(P._HEAD.size + itemsize * stride, fill, np.uint8), base=base,
                stride=stride, step=step, start=start, length=length,
                freq=np.full((itemsize, 256), fill, np.int64),
                near=np.full((itemsize, 256), fill, np.int64),
                repeats=np.full(itemsize, fill, np.int64),
                methods=np.full(itemsize, fill, np.int64))


def _run(fn, src: np.ndarray, itemsize: int, rotate: bool, block: int, a: dict):
    return fn(src, itemsize, rotate, a["out"], a["base"], a["stride"], a["step"], a["start"],
              a["length"], a["freq"], a["near"], a["repeats"], a["methods"], block,
              P.HUFFMAN_BELOW, P.EXTRA_REPEATS)


@settings(max_examples=60, deadline=None)
@given(n=st.one_of(st.integers(0, 50), st.integers(4000, 9000), st.sampled_from([1 << 16])),
       itemsize=st.sampled_from([1, 2, 4, 8]), kind=st.sampled_from(KINDS),
       rotate=st.booleans(), block=st.sampled_from([1024, 1 << 17]),
       seed=st.integers(0, 2**32 - 1))
def test_one_call_is_the_steps(n, itemsize, kind, rotate, block, seed):
    src = _values(seed, n, itemsize, kind)
    one, steps = _args(src, itemsize, 0x5A), _args(src, itemsize, 0x5A)
    got = _run(_backend.native().planes_encode_layout, src, itemsize, rotate, block, one)
    want = _run(P._layout_steps, src, itemsize, rotate, block, steps)
    assert got == want
    end = got[0] if got[0] >= 0 else None
    assert (one["out"][:end] == steps["out"][:end]).all()
    assert (one["methods"] == steps["methods"]).all()
    if one["length"]:  # sampled: the histograms the zstd trials read
        for name in ("freq", "near", "repeats"):
            assert (one[name] == steps[name]).all(), name


@pytest.mark.parametrize("kind", KINDS)
def test_encode_decodes_and_matches_the_steps(kind, monkeypatch):
    data = _values(7, 1 << 16, 4, kind)
    coded = P.planes_encode(data, 4)
    monkeypatch.setattr(P, "_layout", P._layout_steps)
    assert (P.planes_encode(data, 4) == coded).all()
    assert (np.frombuffer(P.planes_decode(coded), np.uint8) == data).all()


def _hostile(case: str):
    src = _values(1, 8192, 4, "normal")
    a = _args(src, 4, 0)
    c = _backend.native().planes_encode_layout
    changes = {
        "itemsize 3": dict(itemsize=3),
        "stride": dict(stride=a["stride"] + 1),
        "base below a plane's head": dict(base=3),
        "sample past the end": dict(start=8000, length=500),
        "sample of one": dict(length=1),
        "step 0": dict(step=0),
        "freq short": dict(freq=np.zeros((3, 256), np.int64)),
        "methods short": dict(methods=np.zeros(3, np.int64)),
        "out short": dict(out=np.zeros(100, np.uint8)),
        "freq is near": dict(near=a["freq"]),
        "block 0": dict(block=0),
        "freq int32": dict(freq=np.zeros((4, 256), np.int32)),
    }[case]
    args = dict(itemsize=4, rotate=True, block=1 << 17) | a | changes
    return lambda: c(src, args["itemsize"], args["rotate"], args["out"], args["base"],
                     args["stride"], args["step"], args["start"], args["length"],
                     args["freq"], args["near"], args["repeats"], args["methods"],
                     args["block"], P.HUFFMAN_BELOW, P.EXTRA_REPEATS)


@pytest.mark.parametrize("case", ["itemsize 3", "stride", "base below a plane's head",
                                  "sample past the end", "sample of one", "step 0",
                                  "freq short", "methods short", "out short", "freq is near",
                                  "block 0", "freq int32"])
def test_hostile_arguments_raise_value_error(case):
    with pytest.raises(ValueError):
        _hostile(case)()


def test_read_only_output_is_refused():
    src = _values(1, 8192, 4, "normal")
    a = _args(src, 4, 0)
    a["out"].flags.writeable = False
    with pytest.raises((ValueError, BufferError, TypeError)):
        _run(_backend.native().planes_encode_layout, src, 4, True, 1 << 17, a)


def test_the_one_call_runs_without_the_gil():
    src = _values(3, 1 << 23, 4, "normal")  # 32 MB: tens of milliseconds
    a = _args(src, 4, 0)
    assert spins_during(lambda: _run(_backend.native().planes_encode_layout, src, 4, True,
                                     1 << 17, a)) > 0
