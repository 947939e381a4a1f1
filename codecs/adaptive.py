"""Check-N-Run's adaptive asymmetric range search (NSDI'22, section 5.2).

For every segment (row, group or whole tensor) a greedy search shrinks the clipping range
``[xmin, xmax]`` of uniform asymmetric quantization. With ``step = (Xmax - Xmin) / num_bins`` each
iteration evaluates two candidates, ``[xmin + step, xmax]`` and ``[xmin, xmax - step]``, keeps the
one with the lower L2 error, and the range of lowest error seen over all iterations wins. The search
covers ``ratio`` of the original range (``ratio=1.0``: the whole range, as in the paper and in
FBGEMM's ``param_search_greedy``), i.e. it stops once ``xmax - xmin`` would fall below
``(1 - ratio) * (Xmax - Xmin)`` or below one step.

Speed: each candidate's error is computed from prefix sums over a fine histogram of the segment
(``HIST_PER_BIN`` histogram cells per search step, holding count and sum; the sum of squares is one total), in
``O(levels)`` per candidate instead of ``O(segment length)`` (see ``_cand_error``). Candidate end points fall on cell
edges, so clipped values are accounted exactly; the error of values inside the range is exact up to
the cell a decision threshold falls in. All segments are processed in one compiled call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["default_num_bins", "adaptive_ranges", "HIST_PER_BIN"]

#: Histogram cells per greedy step.
HIST_PER_BIN = 4
_BLOCK = 16


def default_num_bins(bits: int) -> int:
    """Check-N-Run's choice: 25 bins for bit widths up to 3, 45 for 4 bits (and wider)."""
    return 25 if bits <= 3 else 45


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _cand_error(a, b, f, inv_nq1, nq, H, C, S1, o, s2tot):  # pragma: no cover - compiled
    # Squared error of quantizing the histogram to nq uniform levels v_k = a + k*d on [a, b]
    # (values relative to the segment minimum; f = cells per unit). Level k takes the cells in
    # [j_{k-1}, j_k) with j_k the cell edge nearest to the threshold a + (k + 1/2) d. Summing
    # S2 - 2 v S1 + v^2 C per level telescopes to a sum over thresholds of prefix sums:
    #   err = S2tot - 2 (b S1[H] - d sum_k S1[j_k]) + (b^2 C[H] - d sum_k C[j_k] (2 v_k + d)).
    d = (b - a) * inv_nq1
    df = d * f
    base = a * f + 0.5 * df + 0.5
    acc1 = 0.0
    acc2 = 0.0
    for k in range(nq - 1):
        jk = o + min(int(base + k * df), H)
        acc1 += S1[jk]
        acc2 += C[jk] * (2.0 * (a + k * d) + d)
    return s2tot - 2.0 * (b * S1[o + H] - d * acc1) + (b * b * C[o + H] - d * acc2)


@njit(cache=True, nogil=True, fastmath=True)
def adaptive_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio):  # pragma: no cover - compiled
    """Refine ``lo``/``hi`` (per-segment min/max of the unmasked values) in place.

    ``x``: flat float array; ``seg``: segment length; ``mask``: uint8 array of x.size (nonzero =
    value excluded) or of size 0; ``nq``: number of uniform levels.

    Segments are searched ``_BLOCK`` at a time with the iterations outermost: one greedy step is a
    chain of dependent operations, and interleaving independent segments hides its latency.
    """
    n = x.size
    nseg = lo.size
    H = num_bins * HIST_PER_BIN
    n_iter = int(ratio * num_bins + 1e-9) - 1
    if nq < 2 or n_iter < 1:
        return
    inv_nq1 = 1.0 / (nq - 1)
    has_mask = mask.size > 0
    W = H + 1
    C = np.zeros(_BLOCK * W)  # block of prefix-sum rows, row r at offset r * W
    S1 = np.zeros(_BLOCK * W)
    s2 = np.zeros(_BLOCK)
    rng = np.zeros(_BLOCK)
    ca = np.zeros(_BLOCK)
    cb = np.zeros(_BLOCK)
    best = np.zeros(_BLOCK)
    fr = np.zeros(_BLOCK)
    step_ = np.zeros(_BLOCK)
    dd = np.zeros(_BLOCK)
    df = np.zeros(_BLOCK)
    base1 = np.zeros(_BLOCK)
    base2 = np.zeros(_BLOCK)
    acc11 = np.zeros(_BLOCK)
    acc12 = np.zeros(_BLOCK)
    acc21 = np.zeros(_BLOCK)
    acc22 = np.zeros(_BLOCK)
    ba = np.zeros(_BLOCK)
    bb = np.zeros(_BLOCK)
    for s0 in range(0, nseg, _BLOCK):
        nb = min(_BLOCK, nseg - s0)
        for r in range(nb):
            s = s0 + r
            lo0 = np.float64(lo[s])
            rg = np.float64(hi[s]) - lo0
            if not (rg > 0.0):
                rg = 0.0
            rng[r] = rg
            o = r * W
            C[o:o + W] = 0.0
            S1[o:o + W] = 0.0
            acc2 = 0.0
            if rg > 0.0:
                f = H / rg
                a0 = s * seg
                b0 = min(a0 + seg, n)
                for i in range(a0, b0):
                    if has_mask and mask[i]:
                        continue
                    v = np.float64(x[i]) - lo0
                    j = min(max(int(v * f), 0), H - 1)
                    C[o + j + 1] += 1.0
                    S1[o + j + 1] += v
                    acc2 += v * v
                for j in range(o + 1, o + W):
                    C[j] += C[j - 1]
                    S1[j] += S1[j - 1]
            s2[r] = acc2
            fr[r] = H / rg if rg > 0.0 else 0.0
            step_[r] = rg / num_bins
            ca[r] = 0.0  # candidate range relative to lo0
            cb[r] = rg
            ba[r] = 0.0
            bb[r] = rg
            best[r] = _cand_error(0.0, rg, H / rg if rg > 0.0 else 0.0, inv_nq1, nq, H, C, S1, o,
                                  acc2)
        for _ in range(n_iter):
            # both candidates of every segment of the block, thresholds outermost so that the
            # inner loop over segments vectorises (gathers from the prefix sums)
            for r in range(nb):
                rg = rng[r]
                step = rg / num_bins
                d = (cb[r] - ca[r] - step) * inv_nq1  # same level spacing for both candidates
                dd[r] = d
                df[r] = d * fr[r]
                base1[r] = (ca[r] + step) * fr[r] + 0.5 * df[r] + 0.5 + r * W
                base2[r] = ca[r] * fr[r] + 0.5 * df[r] + 0.5 + r * W
                acc11[r] = 0.0
                acc12[r] = 0.0
                acc21[r] = 0.0
                acc22[r] = 0.0
            for k in range(nq - 1):
                for r in range(nb):
                    lim = r * W + H
                    j1 = min(int(base1[r] + k * df[r]), lim)
                    j2 = min(int(base2[r] + k * df[r]), lim)
                    v1 = 2.0 * (ca[r] + step_[r] + k * dd[r]) + dd[r]
                    v2 = 2.0 * (ca[r] + k * dd[r]) + dd[r]
                    acc11[r] += S1[j1]
                    acc12[r] += C[j1] * v1
                    acc21[r] += S1[j2]
                    acc22[r] += C[j2] * v2
            for r in range(nb):
                if rng[r] == 0.0:
                    continue
                o = r * W + H
                b1 = cb[r]
                b2 = cb[r] - step_[r]
                d = dd[r]
                e1 = s2[r] - 2.0 * (b1 * S1[o] - d * acc11[r]) + (b1 * b1 * C[o] - d * acc12[r])
                e2 = s2[r] - 2.0 * (b2 * S1[o] - d * acc21[r]) + (b2 * b2 * C[o] - d * acc22[r])
                if e1 < e2:
                    ca[r] += step_[r]
                    e = e1
                else:
                    cb[r] = b2
                    e = e2
                if e < best[r]:
                    best[r] = e
                    ba[r] = ca[r]
                    bb[r] = cb[r]
        for r in range(nb):
            if rng[r] > 0.0:
                s = s0 + r
                lo0 = np.float64(lo[s])
                lo[s] = lo0 + ba[r]
                hi[s] = lo0 + bb[r]
