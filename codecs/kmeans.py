"""DynaQuant's approximate k-means over a histogram (section 4.3 and appendix A.2).

Values are first grouped into log-spaced buckets -- the order-preserving float32 bit pattern cut
to sign, exponent and ``MANTISSA_BITS`` mantissa bits, the integer form of DDSketch's log-space
projection (relative bucket width ``2**-MANTISSA_BITS``). Each non-empty bucket is one weighted
sample at the mean of its values, with weight

    w = lam * count / sum(count) + (1 - lam) * |mean| / sum(|mean|)

so ``lam=1`` is plain k-means on the value distribution and smaller ``lam`` moves resolution to
large-magnitude values. Centres are seeded with weighted k-means++ (next centre drawn with
probability proportional to ``w * D**2``; deterministic generator seeded per segment) and refined
with weighted Lloyd iterations; in 1-D the assignment is a linear sweep over sorted buckets.
Any number of levels works. All segments are fitted in one compiled call.
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

from ._backend import kernels

__all__ = ["MANTISSA_BITS", "fit_codebooks", "fit_from_buckets", "nearest_codes"]

MANTISSA_BITS = 7
_NKEYS = 1 << (9 + MANTISSA_BITS)
_MAX_ITER = 64
_GRID = 4096


@njit(cache=True, nogil=True)
def _rand(state):  # pragma: no cover - compiled; splitmix64 step -> (new state, uniform [0, 1))
    state = (state + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = state
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = z ^ (z >> np.uint64(31))
    return state, np.float64(z >> np.uint64(11)) / 9007199254740992.0


@njit(cache=True, nogil=True)
def _weighted_kmeans(vals, w, k, seed, centers):  # pragma: no cover - compiled
    # vals sorted ascending (bucket means), w > 0; writes k sorted centres into `centers`
    B = vals.size
    if B <= k:
        for i in range(k):
            centers[i] = vals[min(i, B - 1)]
        return
    state = np.uint64(seed)
    # weighted k-means++
    d2 = np.empty(B)
    tot = w.sum()
    state, r = _rand(state)
    target = r * tot
    acc = 0.0
    pick = B - 1
    for i in range(B):
        acc += w[i]
        if acc > target:
            pick = i
            break
    centers[0] = vals[pick]
    for i in range(B):
        d = vals[i] - centers[0]
        d2[i] = d * d
    for c in range(1, k):
        tot = 0.0
        for i in range(B):
            tot += w[i] * d2[i]
        if tot <= 0.0:
            # fewer distinct values than centres: duplicate the last centre
            centers[c] = centers[c - 1]
            continue
        state, r = _rand(state)
        target = r * tot
        acc = 0.0
        pick = B - 1
        for i in range(B):
            acc += w[i] * d2[i]
            if acc > target:
                pick = i
                break
        centers[c] = vals[pick]
        for i in range(B):
            d = vals[i] - centers[c]
            d2[i] = min(d2[i], d * d)
    centers[:k].sort()
    # weighted Lloyd with a linear assignment sweep
    assign = np.full(B, -1, np.int64)
    sw = np.empty(k)
    swx = np.empty(k)
    for _ in range(_MAX_ITER):
        changed = False
        c = 0
        sw[:] = 0.0
        swx[:] = 0.0
        for i in range(B):
            while c + 1 < k and abs(vals[i] - centers[c + 1]) <= abs(vals[i] - centers[c]):
                c += 1
            if assign[i] != c:
                assign[i] = c
                changed = True
            sw[c] += w[i]
            swx[c] += w[i] * vals[i]
        if not changed:
            break
        for c in range(k):
            if sw[c] > 0.0:
                centers[c] = swx[c] / sw[c]
        centers[:k].sort()


@njit(cache=True, nogil=True)
def _fit_codebooks(x, xbits, seg, mask, k, lam, seed, out):  # pragma: no cover - compiled
    """Fit ``k`` levels per segment of ``x`` into ``out[nseg, k]`` (ascending).

    ``xbits``: the uint32 bit patterns of ``x`` cast to float32 (the bucket keys).

    ``mask``: uint8 of x.size (nonzero = excluded) or of size 0. A segment without values gets
    all-zero levels.
    """
    n = x.size
    nseg = out.shape[0]
    has_mask = mask.size > 0
    cnt = np.zeros(_NKEYS, np.int64)
    sums = np.zeros(_NKEYS)
    touched = np.empty(min(n, _NKEYS) if n > 0 else 1, np.int64)
    shift = np.uint32(23 - MANTISSA_BITS)
    for s in range(nseg):
        a0 = s * seg
        b0 = min(a0 + seg, n)
        nt = 0
        for i in range(a0, b0):
            if has_mask and mask[i]:
                continue
            v = x[i]
            bits = xbits[i]
            if bits & np.uint32(0x80000000):
                o = ~bits
            else:
                o = bits | np.uint32(0x80000000)
            key = np.int64(o >> shift)
            if cnt[key] == 0:
                touched[nt] = key
                nt += 1
            cnt[key] += 1
            sums[key] += v
        keys = np.sort(touched[:nt])
        kc = np.empty(nt, np.int64)
        ks = np.empty(nt)
        for i in range(nt):
            kc[i] = cnt[keys[i]]
            ks[i] = sums[keys[i]]
            cnt[keys[i]] = 0
            sums[keys[i]] = 0.0
        _fit_segment(kc, ks, k, lam, seed + s, out[s])


@njit(cache=True, nogil=True)
def _fit_from_buckets(counts, sums, offsets, k, lam, seed, out):  # pragma: no cover - compiled
    """:func:`_fit_codebooks` from the segments' buckets instead of their values: segment ``s``
    has the buckets ``offsets[s]:offsets[s + 1]`` of ``counts``/``sums`` (the number and the
    float64 sum of its unmasked values in each non-empty bucket, buckets in ascending key
    order). The same fit, so the same levels: the buckets may be counted elsewhere (a GPU,
    ``ckptstore.device.quant``; a bucket's sum is exact in float64 whatever the order of its terms,
    its values sharing one exponent)."""
    for s in range(out.shape[0]):
        a, b = offsets[s], offsets[s + 1]
        _fit_segment(counts[a:b], sums[a:b], k, lam, seed + s, out[s])


@njit(cache=True, nogil=True)
def _fit_segment(cnt, sums, k, lam, seed, out):  # pragma: no cover - compiled
    # the k levels of one segment from its non-empty buckets (ascending keys)
    nt = cnt.size
    if nt == 0:
        out[:] = 0.0
        return
    vals = np.empty(nt)
    w = np.empty(nt)
    total = 0.0
    mag = 0.0
    for i in range(nt):
        vals[i] = sums[i] / cnt[i]
        total += cnt[i]
        mag += abs(vals[i])
    for i in range(nt):
        wf = cnt[i] / total
        wm = abs(vals[i]) / mag if mag > 0.0 else 1.0 / nt
        w[i] = lam * wf + (1.0 - lam) * wm
        if w[i] <= 0.0:
            w[i] = 1e-300
    centers = np.empty(k)
    _weighted_kmeans(vals, w, k, seed, centers)
    for c in range(k):
        out[c] = centers[c]


@njit(cache=True, nogil=True)
def _nearest_codes(x, seg, codebooks, out):  # pragma: no cover - compiled
    """Index of the nearest level (ties to the lower) for every value; NaN -> 0.

    The index is the number of midpoints below the value: counted threshold by threshold over
    blocks of values that stay in L1 for up to 4 levels, else looked up in a table over a uniform
    grid of the midpoint range and corrected by a short linear climb.
    """
    n = x.size
    nseg, k = codebooks.shape
    thr = np.full(max(k - 1, 1), np.inf)
    grid = np.zeros(_GRID + 1, np.int64)
    blk = 4096
    for s in range(nseg):
        for c in range(k - 1):
            thr[c] = 0.5 * (np.float64(codebooks[s, c]) + np.float64(codebooks[s, c + 1]))
        a0 = s * seg
        b0 = min(a0 + seg, n)
        if k <= 4:
            for i0 in range(a0, b0, blk):
                i1 = min(i0 + blk, b0)
                out[i0:i1] = 0
                for c in range(k - 1):
                    t = thr[c]
                    for i in range(i0, i1):
                        out[i] += np.uint8(t < x[i])
        else:
            # a table over a uniform grid of the threshold range gives a lower bound of the
            # count; a short climb (usually none) makes it exact
            t0 = thr[0]
            span = thr[k - 2] - t0
            g = _GRID / span if span > 0.0 else 0.0
            c = 0
            for q in range(_GRID + 1):
                start = t0 + q / g if g > 0.0 else t0
                while c < k - 1 and thr[c] < start:
                    c += 1
                grid[q] = c
            for i in range(a0, b0):
                v = np.float64(x[i])
                if not v > t0:  # also NaN
                    out[i] = 0
                    continue
                q = min(int((v - t0) * g), _GRID + 1) - 1
                code = grid[q] if q >= 0 else 0
                while code < k - 1 and thr[code] < v:
                    code += 1
                out[i] = code


# The implementation this process runs (ckptcodecs._backend): C, or the numba kernels above.
_K = kernels("kmeans", fit_codebooks=_fit_codebooks, fit_from_buckets=_fit_from_buckets,
             nearest_codes=_nearest_codes)


def fit_codebooks(x: np.ndarray, xbits: np.ndarray, seg: int, mask: np.ndarray, k: int,
                  lam: float, seed: int, out: np.ndarray) -> None:
    """Fit ``k`` levels per segment of ``x`` (float32 or float64, flat) into ``out[nseg, k]``
    (float64, ascending), in one compiled call that releases the GIL.

    ``xbits``: the uint32 bit patterns of ``x`` cast to float32 (the bucket keys). ``mask``:
    uint8 of x.size (nonzero = excluded) or of size 0. A segment without values gets all-zero
    levels. Segment ``s`` is fitted with the seed ``seed + s``.
    """
    _K.fit_codebooks(x, xbits, seg, mask, k, lam, seed, out)


def fit_from_buckets(counts: np.ndarray, sums: np.ndarray, offsets: np.ndarray, k: int,
                     lam: float, seed: int, out: np.ndarray) -> None:
    """:func:`fit_codebooks` from the segments' buckets instead of their values: segment ``s``
    has the buckets ``offsets[s]:offsets[s + 1]`` of ``counts``/``sums`` (int64 counts and
    float64 sums of its unmasked values in each non-empty bucket, buckets in ascending key
    order); the same fit, so the same levels (see ``_fit_from_buckets``)."""
    _K.fit_from_buckets(counts, sums, offsets, k, lam, seed, out)


def nearest_codes(x: np.ndarray, seg: int, codebooks: np.ndarray, out: np.ndarray) -> None:
    """Index of the nearest level (ties to the lower) of every value of ``x`` (float32 or
    float64) among its segment's row of ``codebooks`` (2-D, float32 or float64) into ``out``
    (uint8); NaN -> 0. See ``_nearest_codes`` for the method."""
    _K.nearest_codes(x, seg, codebooks, out)
