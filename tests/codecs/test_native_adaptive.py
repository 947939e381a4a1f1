"""The adaptive range search's compiled kernels against their numba twins (issue 28).

``adaptive_histogram_search`` and ``adaptive_direct_ranges`` (``ckptcodecs.adaptive``) run on
the same segments as the numba reference -- float32 and float64 rows of 1..200 values with NaN,
+-inf, -0.0, huge values and subnormals, constant rows, masks empty, all set or random, 2..256
levels, 1..60 bins and ratios up to 1, histograms counted or given (counts near the int64
limits) -- and refine ``lo``/``hi`` to the same bits. The numba reference is compiled without
``fastmath`` (plain IEEE in source order), so these bits do not depend on the CPU. Arguments
that do not fit raise ValueError, never a read or a write out of bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend, adaptive, quantize

pytestmark = [pytest.mark.skipif(_backend.native() is None,
                                 reason="ckptcodecs' compiled kernels are not built"),
              pytest.mark.usefixtures("each_simd_path")]  # pairs, AVX2 and AVX-512 lanes

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 5e-324, 1e-310, 3.4e38, 1e300, -1.0]
KERNELS = ("histogram_search", "direct_ranges")
NO_MASK = np.zeros(0, np.uint8)


def _twins():
    return (_backend.implementation("adaptive", "c"),
            _backend.implementation("adaptive", "numba"))


def _rows(seed: int, seg: int, nseg: int, dtype, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = seg * nseg
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30)
    if kind == "specials" and n:
        at = rng.integers(0, n, max(1, n // 5))
        x[at] = rng.choice(SPECIALS, at.size)
    elif kind == "constant":
        x[:] = rng.standard_normal()
    elif kind == "ties":
        x = rng.choice([-2.0, 0.5, -0.5, 3.0], n)
    elif kind == "subnormal":
        x = x * 1e-310
    elif kind == "outliers" and n:  # the best range lies deep inside: a long walk
        at = rng.integers(0, n, max(1, n // 16))
        x[at] *= rng.choice([-300.0, 40.0, 1e4], at.size)
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _mask(seed: int, n: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    return {"none": NO_MASK, "all": np.ones(n, np.uint8), "clear": np.zeros(n, np.uint8),
            "some": (rng.random(n) < 0.3).astype(np.uint8)}[kind]


def _ranges(x, seg, mask, nseg, fixed: bool):
    """Each segment's min/max of its unmasked values as quantize finds them (float64), or a
    fixed finite range that the values may leave (then inf/NaN/huge ones are cell 0/H-1)."""
    if fixed:
        return np.full(nseg, -1.0), np.full(nseg, 1.5)
    lo, hi = np.empty(nseg, x.dtype), np.empty(nseg, x.dtype)
    _backend.implementation("quant", "numba").seg_minmax(x, seg, mask, lo, hi)
    return lo.astype(np.float64), hi.astype(np.float64)


def _run(k, name, x, seg, mask, lo, hi, nq, num_bins, ratio, counts=adaptive._NO_COUNTS):
    lo, hi = lo.copy(), hi.copy()
    if name == "histogram_search":
        k.histogram_search(x, seg, mask, counts, lo, hi, nq, num_bins, ratio)
    else:
        k.direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio)
    return lo.tobytes() + hi.tobytes()


@settings(max_examples=150, deadline=None)
@given(seg=st.integers(1, 200), nseg=st.integers(0, 9), dtype=st.sampled_from([np.float32,
                                                                                np.float64]),
       kind=st.sampled_from(["normal", "specials", "constant", "ties", "subnormal",
                             "outliers"]),
       mask_kind=st.sampled_from(["none", "all", "clear", "some"]), fixed=st.booleans(),
       nq=st.one_of(st.integers(2, 17), st.integers(2, 256)),
       num_bins=st.one_of(st.integers(1, 4), st.integers(1, 60), st.just(45)),
       ratio=st.sampled_from([1.0, 0.9, 0.5, 0.05, 0.0]), seed=st.integers(0, 2**32 - 1))
def test_searches(seg, nseg, dtype, kind, mask_kind, fixed, nq, num_bins, ratio, seed):
    """Both searches, on each CPU path (the lane loops are compiled plain and for AVX2)."""
    x = _rows(seed, seg, nseg, dtype, kind)
    mask = _mask(seed, x.size, mask_kind)
    lo, hi = _ranges(x, seg, mask, nseg, fixed)
    c, numba = _twins()
    before = _backend.native().simd()
    try:
        for name in KERNELS:
            want = _run(numba, name, x, seg, mask, lo, hi, nq, num_bins, ratio)
            for path in _backend.native().simd_paths():
                _backend.use_simd(path)
                got = _run(c, name, x, seg, mask, lo, hi, nq, num_bins, ratio)
                assert got == want, (name, path)
    finally:
        _backend.use_simd(before)


@settings(max_examples=60, deadline=None)
@given(nseg=st.integers(0, 9), num_bins=st.integers(1, 60), nq=st.integers(2, 256),
       kind=st.sampled_from(["small", "sparse", "huge"]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_search_from_given_counts(nseg, num_bins, nq, kind, dtype, seed):
    """Counts as a GPU gives them (ckptstore.device.quant), ranges of either float width."""
    rng = np.random.default_rng(seed)
    cells = adaptive.cell_counts_shape(nseg, num_bins)
    counts = {"small": lambda: rng.integers(0, 50, cells),
              "sparse": lambda: rng.integers(0, 2, cells) * rng.integers(0, 1 << 20, cells),
              "huge": lambda: rng.integers(-(1 << 62), 1 << 62, cells)}[kind]().astype(np.int64)
    lo = rng.standard_normal(nseg)
    hi = lo + rng.random(nseg) * rng.choice([0.0, 1e-300, 1.0, np.inf], nseg)
    lo, hi = lo.astype(dtype), hi.astype(dtype)
    c, numba = _twins()
    args = (adaptive._NO_VALUES, 1, adaptive._NO_MASK, lo, hi, nq, num_bins, 1.0, counts)
    assert _run(c, "histogram_search", *args) == _run(numba, "histogram_search", *args)


@pytest.mark.parametrize("nseg", [1, 2, 9])
def test_given_counts_that_sum_to_zero_walk_on(nseg):
    """Negative counts whose sum is 0 (C[H] == 0, though not every count is): the search walks
    on as numba's does, where it once took such a segment for one without counts."""
    rng = np.random.default_rng(nseg)
    cells = adaptive.cell_counts_shape(nseg, 3)
    for _ in range(200):
        counts = rng.integers(-3, 4, cells).astype(np.int64)
        counts[:, -1] -= counts.sum(axis=1)
        lo, hi = np.zeros(nseg), np.ones(nseg)
        c, numba = _twins()
        args = (adaptive._NO_VALUES, 1, adaptive._NO_MASK, lo, hi, 2, 3, 1.0, counts)
        assert _run(c, "histogram_search", *args) == _run(numba, "histogram_search", *args)


@pytest.mark.parametrize("seg, nseg", [(70001, 2), (1 << 16, 1), (4096, 33)])
def test_long_segments(seg, nseg):
    """Segments past 64 KiB, an odd number of them (the last searched alone)."""
    x = _rows(7, seg, nseg, np.float32, "specials")
    mask = _mask(7, x.size, "some")
    lo, hi = _ranges(x, seg, mask, nseg, False)
    c, numba = _twins()
    for name in KERNELS:
        args = (x, seg, mask, lo, hi, 16, 45, 1.0)
        assert _run(c, name, *args) == _run(numba, name, *args), name


@pytest.mark.parametrize("num_bins", [4095, 4096, 4097, 6000])
def test_histograms_past_the_lanes_cells(num_bins):
    """Histograms of more than 2**14 cells: the pair loop on every CPU path (the AVX2 lanes
    take up to 2**14), at the edge and past it, 11 segments (a group of 8 and a rest)."""
    x = _rows(11, 300, 11, np.float64, "normal")
    lo, hi = _ranges(x, 300, NO_MASK, 11, False)
    c, numba = _twins()
    args = (x, 300, NO_MASK, lo, hi, 7, num_bins, 0.01)
    want = _run(numba, "histogram_search", *args)
    before = _backend.native().simd()
    try:
        for path in _backend.native().simd_paths():
            _backend.use_simd(path)
            assert _run(c, "histogram_search", *args) == want, path
    finally:
        _backend.use_simd(before)


def _walk(name, x, seg, lo, hi, nq, num_bins, early_end: bool):
    """The C search with its early end on or off: the ranges' bytes and the steps walked."""
    native = _backend.native()
    before = native.adaptive_early_end(early_end)
    try:
        lo, hi = lo.copy(), hi.copy()
        k = _twins()[0]
        if name == "histogram_search":
            steps = k.histogram_search(x, seg, NO_MASK, adaptive._NO_COUNTS, lo, hi, nq,
                                       num_bins, 1.0)
        else:
            steps = k.direct_ranges(x, seg, NO_MASK, lo, hi, nq, num_bins, 1.0)
        return lo.tobytes() + hi.tobytes(), steps
    finally:
        native.adaptive_early_end(before)


@pytest.mark.parametrize("bits, seg, kind", [(8, 64, "normal"), (8, 1024, "normal"),
                                             (4, 64, "normal"), (4, 32, "normal"),
                                             (3, 300, "normal"), (2, 16, "normal"),
                                             (4, 64, "outliers"), (8, 1024, "outliers")])
def test_the_walk_ends_early_with_the_same_ranges(bits, seg, kind):
    """A walk ends once the clip error outside its range (less a margin) reaches its best error
    (adaptive.h): the same ranges as the whole walk and as the numba twin, on every CPU path,
    in fewer steps -- far fewer where the levels are many."""
    nq, nseg = 2 ** bits, 37
    x = _rows(13, seg, nseg, np.float32, kind)
    lo, hi = _ranges(x, seg, NO_MASK, nseg, False)
    name = "direct_ranges" if adaptive.use_direct(seg, nq) else "histogram_search"
    num_bins = adaptive.default_num_bins(bits)
    want = _run(_twins()[1], name, x, seg, NO_MASK, lo, hi, nq, num_bins, 1.0)
    before = _backend.native().simd()
    try:
        for path in _backend.native().simd_paths():
            _backend.use_simd(path)
            ended, steps = _walk(name, x, seg, lo, hi, nq, num_bins, True)
            whole, full = _walk(name, x, seg, lo, hi, nq, num_bins, False)
            assert ended == whole == want, path
            assert full > 0 and steps <= full, path
            if bits == 8 and kind == "normal":
                assert 8 * steps < full, (path, steps, full)
            if bits == 4 and kind == "normal":
                assert 2 * steps < full, (path, steps, full)
    finally:
        _backend.use_simd(before)


def test_a_segment_without_counts_does_not_hold_its_group():
    """A searched segment whose histogram is empty (all its values masked, or given zero
    counts) has errors of +0.0 only: it is settled from the start, and its group of segments
    ends when the others may (a review found it held the group to the end)."""
    rng = np.random.default_rng(9)
    nseg, num_bins, nq = 16, 45, 256
    x = rng.standard_normal(nseg * 1000).astype(np.float32)
    lo, hi = _ranges(x, 1000, NO_MASK, nseg, False)
    counts = np.zeros(adaptive.cell_counts_shape(nseg, num_bins), np.int64)
    H = counts.shape[1]
    for s in range(nseg):
        cell = ((x[s * 1000:(s + 1) * 1000].astype(np.float64) - lo[s]) * (H / (hi[s] - lo[s])))
        np.add.at(counts[s], np.clip(cell.astype(np.int64), 0, H - 1), 1)
    c, numba = _twins()
    steps = {}
    for zero in (False, True):
        cnt = counts.copy()
        if zero:
            cnt[3] = 0
        args = (adaptive._NO_VALUES, 1, NO_MASK, lo, hi, nq, num_bins, 1.0, cnt)
        assert _run(c, "histogram_search", *args) == _run(numba, "histogram_search", *args)
        steps[zero] = c.histogram_search(adaptive._NO_VALUES, 1, NO_MASK, cnt, lo.copy(),
                                         hi.copy(), nq, num_bins, 1.0)
    # the steps summed over groups: with 8 lanes a group the others set its length; with the
    # pair loop's pairs segment 3 leaves its partner to end alone, sooner
    assert steps[True] <= steps[False] < 2 * (num_bins - 1)


def test_counts_past_the_exact_sums_walk_to_the_end():
    """Given counts whose prefix sums are not exact in float64 (past 2**40 a cell): no early
    end (its bound needs exact sums), the twin's ranges."""
    nseg, num_bins, nq = 5, 45, 256
    counts = np.full(adaptive.cell_counts_shape(nseg, num_bins), 1 << 41, np.int64)
    lo, hi = np.zeros(nseg), np.ones(nseg)
    c, numba = _twins()
    args = (adaptive._NO_VALUES, 1, NO_MASK, lo, hi, nq, num_bins, 1.0, counts)
    assert _run(c, "histogram_search", *args) == _run(numba, "histogram_search", *args)
    l2, h2 = lo.copy(), hi.copy()
    steps = c.histogram_search(adaptive._NO_VALUES, 1, NO_MASK, counts, l2, h2, nq, num_bins,
                               1.0)
    _backend.native().adaptive_early_end(False)
    try:
        full = c.histogram_search(adaptive._NO_VALUES, 1, NO_MASK, counts, lo.copy(),
                                  hi.copy(), nq, num_bins, 1.0)
    finally:
        _backend.native().adaptive_early_end(True)
    assert steps == full > 0


@pytest.mark.parametrize("shape", [(64, 96), (40, 17)])
def test_quantize_the_same_under_either_kernels(monkeypatch, shape):
    """quantize's adaptive method (histogram rows of 96, direct rows of 17): the same codes
    and parameters whichever twin searches."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    got = []
    for k in _twins():
        monkeypatch.setattr(adaptive, "_ADAPTIVE", k)
        codes, p = quantize(x, "adaptive-asymmetric", 4)
        got.append((codes.tobytes(), p.zero.tobytes(), p.scale.tobytes()))
    assert got[0] == got[1]


def _f64(n: int) -> np.ndarray:
    return np.zeros(n, np.float64)


def _hostile():
    x, lo, hi, counts = _f64(100), _f64(10), _f64(10), np.zeros((10, 180), np.int64)
    both = {"negative seg": (x, -1, NO_MASK, lo, hi, 16, 45, 1.0),
            "lo and hi sizes": (x, 10, NO_MASK, lo, _f64(9), 16, 45, 1.0),
            "short mask": (x, 10, np.zeros(99, np.uint8), lo, hi, 16, 45, 1.0),
            "int x": (np.zeros(100, np.int64), 10, NO_MASK, lo, hi, 16, 45, 1.0),
            "float16 lo": (x, 10, NO_MASK, np.zeros(10, np.float16), hi, 16, 45, 1.0),
            "read-only hi": (x, 10, NO_MASK, lo, np.zeros(10).view(), 16, 45, 1.0),
            "lo is hi": (x, 10, NO_MASK, lo, lo, 16, 45, 1.0),
            "x overlaps lo": (x, 10, NO_MASK, x[90:], hi, 16, 45, 1.0),
            "NaN ratio": (x, 10, NO_MASK, lo, hi, 16, 45, float("nan")),
            "ratio past the range": (x, 10, NO_MASK, lo, hi, 16, 45, 1.2),
            "too many bins": (x, 10, NO_MASK, lo, hi, 16, 1 << 30, 1.0),
            "non-contiguous x": (_f64(200)[::2], 10, NO_MASK, lo, hi, 16, 45, 1.0)}
    both["read-only hi"][4].flags.writeable = False
    cases = {(f"{n}: {name}"): (n, a) for n in KERNELS for name, a in both.items()}
    counted = {"counts of another size": np.zeros((10, 179), np.int64),
               "float64 counts": np.zeros((10, 180)), "int32 counts": np.zeros((10, 180),
                                                                              np.int32),
               "counts overlap hi": hi.view(np.int64)}
    for name, cnt in counted.items():
        cases[f"histogram_search: {name}"] = ("histogram_search",
                                              (x, 10, NO_MASK, cnt, lo, hi, 16, 45, 1.0))
    return {k: (n, a if n == "direct_ranges" or len(a) == 9 else a[:3] + (counts,) + a[3:])
            for k, (n, a) in cases.items()}


HOSTILE = _hostile()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_arguments_raise_value_error(case):
    name, args = HOSTILE[case]
    with pytest.raises(ValueError):
        getattr(_twins()[0], name)(*args)


def test_a_ratio_of_one_bin_past_the_range_stays_in_the_histogram():
    """The histogram search accepts num_bins greedy steps (the last of width zero) as numba's
    does; the direct one refuses them (numba's divides by zero there)."""
    x = np.random.default_rng(5).standard_normal(400)
    lo, hi = _ranges(x, 100, NO_MASK, 4, False)
    c, numba = _twins()
    args = (x, 100, NO_MASK, lo, hi, 16, 10, 1.15)
    assert _run(c, "histogram_search", *args) == _run(numba, "histogram_search", *args)
    with pytest.raises(ValueError):
        c.direct_ranges(*args)
