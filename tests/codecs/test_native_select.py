"""The protect/prune selection's compiled passes against their numba twins (issue 28).

``select_keys_hist`` and ``select_collect`` (``ckptcodecs._select``) run on the same bit
patterns as the numba ones -- float32 and float64 with NaN, +-inf, -0.0 and subnormals,
exclusion masks empty, all set, all clear or random, every bucket boundary -- and give the same
counts, indices and return values; sizes that do not fit raise ValueError, never a write out of
bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend
from ckptcodecs._select import select_magnitudes

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

SIZES = st.one_of(st.integers(0, 40), st.integers(0, 3000), st.sampled_from([1 << 16, 70001]))
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 5e-324, 1e-310, 3.4e38, 1.0, -1.0]
#: (float dtype, bit pattern dtype, shift, inf_bits, buckets), as select_magnitudes uses them
WIDTHS = {np.float32: (np.uint32, np.uint32(16), np.uint32(0x7F800000), 1 << 15),
          np.float64: (np.uint64, np.uint64(45), np.uint64(0x7FF0000000000000), 1 << 18)}


def _twins():
    return (_backend.implementation("select", "c"), _backend.implementation("select", "numba"))


def _case(seed, n, dtype, kind, mask_kind):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * (10.0 ** rng.integers(-30, 30, n) if kind == "scaled" else 1)
    if kind == "specials" and n:
        at = rng.integers(0, n, max(1, n // 5))
        x[at] = rng.choice(SPECIALS, at.size)
    elif kind == "ties":
        x = rng.choice([-2.0, 0.5, -0.5, 3.0], n)
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    excl = {"none": np.zeros(0, np.uint8), "all": np.ones(n, np.uint8),
            "clear": np.zeros(n, np.uint8),
            "some": (rng.random(n) < 0.3).astype(np.uint8)}[mask_kind]
    return x, excl


@settings(max_examples=120, deadline=None)
@given(n=SIZES, dtype=st.sampled_from([np.float32, np.float64]),
       kind=st.sampled_from(["normal", "scaled", "specials", "ties"]),
       mask_kind=st.sampled_from(["none", "all", "clear", "some"]), pick=st.floats(0, 1),
       top=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_passes(n, dtype, kind, mask_kind, pick, top, seed):
    x, excl = _case(seed, n, dtype, kind, mask_kind)
    U, shift, inf, nkeys = WIDTHS[dtype]
    xb = x.view(U)
    counts = []
    for k in _twins():
        cnt = np.zeros(nkeys, np.int64)
        k.keys_hist(xb, excl, shift, inf, cnt)
        counts.append(cnt)
    assert counts[0].tobytes() == counts[1].tobytes()
    cnt = counts[0]
    used = np.flatnonzero(cnt)
    b = int(used[int(pick * (used.size - 1))]) if used.size else int(pick * (nkeys - 1))
    nsure = int(cnt[b + 1:].sum() if top else cnt[:b].sum())
    got = []
    for k in _twins():
        sure, cand = np.full(nsure + 2, -7, np.int64), np.full(int(cnt[b]) + 2, -7, np.int64)
        ns, nc = k.collect(xb, excl, shift, inf, b, top, sure, cand)
        got.append((int(ns), int(nc), sure.tobytes(), cand.tobytes()))
    assert got[0] == got[1]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), dtype=st.sampled_from([np.float32, np.float64]),
       kind=st.sampled_from(["normal", "scaled", "specials", "ties"]), frac=st.floats(0, 1),
       largest=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_select_magnitudes_picks_the_right_set(n, dtype, kind, frac, largest, seed):
    """The selection as a whole (through this process's kernels): exactly k indices, every
    one finite, none beaten by one left out."""
    x, _ = _case(seed, n, dtype, kind, "none")
    finite = np.flatnonzero(np.isfinite(x))
    k = int(frac * finite.size)
    got = select_magnitudes(x, k, largest)
    assert got.size == k == np.unique(got).size and np.isfinite(x[got]).all()
    rest = np.setdiff1d(finite, got)
    if k and rest.size:
        mag, other = np.abs(x[got].astype(np.float64)), np.abs(x[rest].astype(np.float64))
        assert (mag.min() >= other.max()) if largest else (mag.max() <= other.min())


X32 = np.arange(100, dtype=np.float32).view(np.uint32)
E = np.zeros(0, np.uint8)
SH, INF = np.uint32(16), np.uint32(0x7F800000)
HOSTILE = {
    "hist few counts": lambda k: k.keys_hist(X32, E, SH, INF, np.zeros(100, np.int64)),
    "hist shift 32": lambda k: k.keys_hist(X32, E, 32, INF, np.zeros(1 << 15, np.int64)),
    "hist 2-byte patterns": lambda k: k.keys_hist(np.zeros(4, np.uint16), E, 1, 10,
                                                  np.zeros(1 << 15, np.int64)),
    "hist short mask": lambda k: k.keys_hist(X32, np.zeros(5, np.uint8), SH, INF,
                                             np.zeros(1 << 15, np.int64)),
    "hist int32 counts": lambda k: k.keys_hist(X32, E, SH, INF, np.zeros(1 << 15, np.int32)),
    "hist negative shift": lambda k: k.keys_hist(X32, E, -1, INF, np.zeros(1 << 15, np.int64)),
    "collect no room": lambda k: k.collect(X32, E, SH, INF, 0, True, np.zeros(3, np.int64),
                                           np.zeros(0, np.int64)),
    "collect overlap": lambda k: (lambda a: k.collect(X32, E, SH, INF, 0, True, a, a))(
        np.zeros(200, np.int64)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_arguments_raise(case):
    with pytest.raises((ValueError, OverflowError, TypeError)):
        HOSTILE[case](_twins()[0])
