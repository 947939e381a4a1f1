"""Check-N-Run's adaptive asymmetric range search (NSDI'22, section 5.2).

For every segment (row, group or whole tensor) a greedy search shrinks the clipping range
``[xmin, xmax]`` of uniform asymmetric quantization. With ``step = (Xmax - Xmin) / num_bins`` each
iteration evaluates two candidates, ``[xmin + step, xmax]`` and ``[xmin, xmax - step]``, keeps the
one with the lower L2 error, and the range of lowest error seen over all iterations wins. The search
covers ``ratio`` of the original range (``ratio=1.0``: the whole range, as in the paper and in
FBGEMM's ``param_search_greedy``), i.e. it stops once ``xmax - xmin`` would fall below
``(1 - ratio) * (Xmax - Xmin)`` or below one step.

Speed: each candidate's error is computed from prefix sums over a fine histogram of the segment
(``HIST_PER_BIN`` cells per search step; a value counts at its cell centre), in ``O(levels)``
per candidate instead of ``O(segment length)`` (see ``_pair_error``). Candidate end points fall on
cell edges, so the errors are those of the values moved to their cell centres -- 4 cells per step,
180 across the range for 45 bins: the search sees the row at about 7.5-bit resolution. The final
codes are computed from the exact values. All segments (rows) are searched
in one compiled call -- the per-row loop runs in machine code, not in Python.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["default_num_bins", "adaptive_ranges", "HIST_PER_BIN"]

#: Histogram cells per greedy step.
HIST_PER_BIN = 4


def default_num_bins(bits: int) -> int:
    """Check-N-Run's choice: 25 bins for bit widths up to 3, 45 for 4 bits (and wider)."""
    return 25 if bits <= 3 else 45


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _pair_error(A, B, nq, inv, C, S1, o, s2tot, H):  # pragma: no cover - compiled
    """Squared errors (cell units) of the candidates ``[A + HPB, B]`` and ``[A, B - HPB]``.

    Values are measured in histogram cells from the segment minimum; ``C``/``S1`` are prefix
    sums of count and value over the cells. Level ``k`` of a candidate ``[a, b]`` is
    ``v_k = a + k d`` and takes the cells below the edge ``j_k`` nearest to the threshold
    ``a + (k + 1/2) d``. Summing ``S2 - 2 v S1 + v^2 C`` over the levels telescopes to sums over
    thresholds of prefix sums::

        err = S2 - 2 (b S1[H] - d sum_k S1[j_k]) + (b^2 C[H] - d sum_k C[j_k] (2 v_k + d))

    Both candidates have the same spacing ``d`` and thresholds ``HPB`` cells apart, so one index
    serves both.
    """
    hpb = HIST_PER_BIN
    d = (B - A - hpb) * inv
    t1 = 0.0
    t2 = 0.0
    u1 = 0.0
    u2 = 0.0
    for k in range(nq - 1):
        v = A + k * d
        # unsigned index: no negative-index wraparound test in the hot loop (v >= 0 here)
        j = np.uint64(o + v + 0.5 * d + 0.5)
        t2 += S1[j]
        u2 += C[j] * (2.0 * v + d)
        t1 += S1[j + np.uint64(hpb)]
        u1 += C[j + np.uint64(hpb)] * (2.0 * (v + hpb) + d)
    b1 = B
    b2 = B - hpb
    e1 = s2tot - 2.0 * (b1 * S1[o + H] - d * t1) + (b1 * b1 * C[o + H] - d * u1)
    e2 = s2tot - 2.0 * (b2 * S1[o + H] - d * t2) + (b2 * b2 * C[o + H] - d * u2)
    return e1, e2


@njit(cache=True, nogil=True)
def adaptive_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio):  # pragma: no cover - compiled
    """Refine ``lo``/``hi`` (per-segment min/max of the unmasked values) in place.

    ``x``: flat float array; ``seg``: segment length; ``mask``: uint8 array of x.size (nonzero =
    value excluded) or of size 0; ``nq``: number of uniform levels.
    """
    n = x.size
    H = num_bins * HIST_PER_BIN
    n_iter = int(ratio * num_bins + 1e-9) - 1
    if nq < 2 or n_iter < 1:
        return
    has_mask = mask.size > 0
    inv = 1.0 / (nq - 1)
    C = np.zeros(H + 1)
    S1 = np.zeros(H + 1)
    cnt = np.zeros(H, np.int64)
    for s in range(lo.size):
        lo0 = np.float64(lo[s])
        rg = np.float64(hi[s]) - lo0
        if not (rg > 0.0) or rg == np.inf:
            continue
        # histogram in cell units (values measured in cells from the minimum); a value counts
        # at its cell centre. Prefix sums of count and value; the sum of squares is the same
        # for every candidate, so it is left out (errors are compared, never reported).
        cnt[:] = 0
        f = H / rg
        a0 = s * seg
        b0 = min(a0 + seg, n)
        if has_mask:
            for i in range(a0, b0):
                if mask[i] == 0:
                    cnt[min(max(int((np.float64(x[i]) - lo0) * f), 0), H - 1)] += 1
        else:
            for i in range(a0, b0):
                cnt[min(max(int((np.float64(x[i]) - lo0) * f), 0), H - 1)] += 1
        for j in range(H):
            C[j + 1] = C[j] + cnt[j]
            S1[j + 1] = S1[j] + cnt[j] * (j + 0.5)
        s2tot = 0.0
        # greedy search over [A, B] (cells), starting from the full range
        A = 0.0
        B = float(H)
        best = _full_error(nq, C, S1, 0, s2tot, H)
        ba = 0.0
        bb = float(H)
        for _ in range(n_iter):
            e1, e2 = _pair_error(A, B, nq, inv, C, S1, 0, s2tot, H)
            if e1 < e2:
                A += HIST_PER_BIN
                e = e1
            else:
                B -= HIST_PER_BIN
                e = e2
            if e < best:
                best = e
                ba = A
                bb = B
        w = rg / H
        lo[s] = lo0 + ba * w
        hi[s] = lo0 + bb * w


@njit(cache=True, nogil=True, fastmath=True)
def _full_error(nq, C, S1, o, s2tot, H):  # pragma: no cover - compiled
    # error of the full range [0, H]
    d = H / (nq - 1)
    t = 0.0
    u = 0.0
    for k in range(nq - 1):
        v = k * d
        j = o + min(int(v + 0.5 * d + 0.5), H)
        t += S1[j]
        u += C[j] * (2.0 * v + d)
    return s2tot - 2.0 * (H * S1[o + H] - d * t) + (H * H * C[o + H] - d * u)
