"""The compiled k-means kernels against their numba twins, and on hostile arguments (issue 28).

The C kernels of the ``kmeans`` family (``fit_codebooks``, ``fit_from_buckets``,
``nearest_codes``) run on the same inputs as the numba ones -- tiny and empty segments, more
levels than distinct values, all-equal values, signed zeros, masks, ``lam`` 0, between and 1,
several seeds, float32 and float64 -- and write the same bytes (the same float order, random
stream, tie-breaking and iteration limit). Bad sizes, dtypes and overlapping buffers are a
``ValueError``, never a crash.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend
from ckptcodecs.kmeans import MANTISSA_BITS

pytestmark = [pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built"),
              pytest.mark.usefixtures("each_simd_path")]  # every CPU path

SIZES = st.one_of(st.integers(0, 40), st.integers(0, 3000), st.sampled_from([1 << 16,
                                                                            (1 << 16) + 5]))
KINDS = ["normal", "heavy", "equal", "few", "zeros", "wide"]
NO_MASK = np.zeros(0, np.uint8)


def _twins():
    return _backend.implementation("kmeans", "c"), _backend.implementation("kmeans", "numba")


def _values(seed: int, n: int, kind: str, dtype) -> np.ndarray:
    """``n`` finite values: normal, heavy-tailed, all equal, a few distinct ones, signed zeros
    with a few others, or spread over many exponents."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "heavy":
        x = rng.standard_t(2, n) * 0.05
    elif kind == "equal":
        x = np.full(n, rng.standard_normal())
    elif kind == "few":
        x = rng.choice(rng.standard_normal(5), n)
    elif kind == "zeros":
        x = rng.choice([0.0, -0.0, 0.0, -0.0, 1e-3, -2.0], n)
    else:
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)
    return x.astype(dtype)


def _fit_both(x, seg, mask, k, lam, seed, extra=0):
    """fit_codebooks' output under C and numba (out rows ``extra`` columns wider than k)."""
    bits = x.astype(np.float32).view(np.uint32)
    nseg = max(-(-x.size // seg), 1) + 1  # one segment beyond the values: all zero
    outs = []
    for kernels in _twins():
        out = np.full((nseg, k + extra), 7.5)
        kernels.fit_codebooks(x, bits, seg, mask, k, lam, seed, out)
        outs.append(out)
    return outs


@settings(max_examples=60, deadline=None)
@given(n=SIZES, kind=st.sampled_from(KINDS), seg=st.sampled_from([1, 3, 50, 1000, 1 << 16]),
       k=st.sampled_from([1, 2, 3, 4, 7, 16, 40, 256]), lam=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(-2**40, 2**40), masked=st.booleans(), f64=st.booleans(),
       extra=st.sampled_from([0, 2]))
def test_fit_codebooks(n, kind, seg, k, lam, seed, masked, f64, extra):
    x = _values(seed & 0xFFFF, n, kind, np.float64 if f64 else np.float32)
    mask = (np.random.default_rng(n).random(n) < 0.3).astype(np.uint8) if masked else NO_MASK
    c, ref = _fit_both(x, seg, mask, k, lam, seed, extra)
    assert c.tobytes() == ref.tobytes()


def _buckets(x: np.ndarray, seg: int):
    """Each segment's buckets (counts, float64 sums, offsets), as a GPU would count them."""
    bits = x.astype(np.float32).view(np.uint32)
    ordered = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(1 << 31))
    keys = ((np.arange(x.size) // seg << 16)
            | (ordered >> (23 - MANTISSA_BITS)).astype(np.int64))
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.zeros(uniq.size)
    np.add.at(sums, inverse, x.astype(np.float64))
    nseg = -(-x.size // seg)
    return counts.astype(np.int64), sums, np.searchsorted(uniq >> 16, np.arange(nseg + 1))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), kind=st.sampled_from(KINDS), seg=st.sampled_from([7, 500, 5000]),
       k=st.sampled_from([1, 2, 5, 16, 255]), lam=st.sampled_from([0.0, 0.5, 1.0]),
       seed=st.integers(0, 2**32))
def test_fit_from_buckets(n, kind, seg, k, lam, seed):
    counts, sums, offsets = _buckets(_values(seed, n, kind, np.float32), seg)
    outs = []
    for kernels in _twins():
        out = np.full((offsets.size - 1, k), 7.5)
        kernels.fit_from_buckets(counts, sums, offsets, k, lam, seed, out)
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()


@settings(max_examples=60, deadline=None)
@given(n=SIZES, kind=st.sampled_from(KINDS), seg=st.sampled_from([1, 5, 700, 1 << 16]),
       k=st.sampled_from([0, 1, 2, 3, 4, 5, 6, 16, 100, 256, 300]), seed=st.integers(0, 999),
       f64=st.booleans(), book64=st.booleans(), odd=st.booleans())
def test_nearest_codes(n, kind, seg, k, seed, f64, book64, odd):
    rng = np.random.default_rng(seed)
    x = _values(seed, n, kind, np.float64 if f64 else np.float32)
    if n and odd:  # NaN, infinities, huge values and values on the levels
        at = rng.integers(0, n, min(n, 8))
        x[at] = rng.choice([np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0], at.size)
    nseg = -(-n // seg) + 1
    book = np.sort(rng.standard_normal((nseg, k)) * rng.choice([1e-6, 1.0, 1e6]), axis=1)
    if k > 3:
        book[:, 2] = book[:, 1]  # a repeated level
    book = book.astype(np.float64 if book64 else np.float32)
    outs = []
    for kernels in _twins():
        out = np.full(n + 3, 0xA5, np.uint8)
        kernels.nearest_codes(x, seg, book, out)
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()


def _hostile():
    x, bits = np.zeros(100, np.float32), np.zeros(100, np.uint32)
    book, out8 = np.zeros((2, 4)), np.zeros(100, np.uint8)
    counts, sums = np.ones(4, np.int64), np.ones(4)
    fit = "fit_codebooks"
    return {
        "fit seg 0": (fit, (x, bits, 0, NO_MASK, 4, 1.0, 0, book)),
        "fit k 0": (fit, (x, bits, 50, NO_MASK, 0, 1.0, 0, np.zeros((2, 0)))),
        "fit short bits": (fit, (x, bits[:99], 50, NO_MASK, 4, 1.0, 0, book)),
        "fit short mask": (fit, (x, bits, 50, np.zeros(99, np.uint8), 4, 1.0, 0, book)),
        "fit narrow out": (fit, (x, bits, 50, NO_MASK, 5, 1.0, 0, book)),
        "fit 1-D out": (fit, (x, bits, 50, NO_MASK, 4, 1.0, 0, np.zeros(8))),
        "fit float32 out": (fit, (x, bits, 50, NO_MASK, 4, 1.0, 0, book.astype(np.float32))),
        "fit int values": (fit, (bits, bits, 50, NO_MASK, 4, 1.0, 0, book)),
        "fit overlap": (fit, (book.reshape(-1), bits, 50, NO_MASK, 4, 1.0, 0, book)),
        "buckets offsets beyond": ("fit_from_buckets", (counts, sums, np.array([0, 2, 5]), 4,
                                                        1.0, 0, book)),
        "buckets offsets descend": ("fit_from_buckets", (counts, sums, np.array([0, 3, 2]), 4,
                                                         1.0, 0, book)),
        "buckets negative offset": ("fit_from_buckets", (counts, sums, np.array([-1, 2, 4]), 4,
                                                         1.0, 0, book)),
        "buckets offsets count": ("fit_from_buckets", (counts, sums, np.array([0, 4]), 4, 1.0,
                                                       0, book)),
        "buckets sums size": ("fit_from_buckets", (counts, sums[:3], np.array([0, 2, 4]), 4,
                                                   1.0, 0, book)),
        "codes seg 0": ("nearest_codes", (x, 0, book, out8)),
        "codes short out": ("nearest_codes", (x, 50, book, out8[:99])),
        "codes 1-D book": ("nearest_codes", (x, 50, book.reshape(-1), out8)),
        "codes int book": ("nearest_codes", (x, 50, book.astype(np.int64), out8)),
        "codes overlap": ("nearest_codes", (x, 50, book, x.view(np.uint8))),
    }


@pytest.mark.parametrize("case", sorted(_hostile()))
def test_hostile_arguments_raise_value_error(case):
    name, args = _hostile()[case]
    with pytest.raises(ValueError):
        getattr(_twins()[0], name)(*args)
