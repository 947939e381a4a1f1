"""The numba kernels of Check-N-Run's adaptive range search (:mod:`ckptcodecs.adaptive` says
what they compute): the reference of the C twins ``adaptive_histogram_search`` and
``adaptive_direct_ranges`` of ``ckptcodecs._native``, compiled without ``fastmath`` -- plain
IEEE float64 in source order, no FMA contraction, no reordered sums -- so that both choose the
same ranges on every CPU."""

from __future__ import annotations

import numpy as np

from ._jit import njit

__all__ = ["HIST_PER_BIN", "direct_search", "histogram_search"]

#: Histogram cells per greedy step (candidate end points are cell edges in both searches).
HIST_PER_BIN = 4
_IDX_BLOCK = 1024


@njit(cache=True, nogil=True)
def _count_cells(x, a0, b0, mask, has_mask, lo0, rg, H, cnt, idx):  # pragma: no cover - compiled
    # histogram in cell units (values measured in cells from the minimum): cnt[j] counts the
    # values of x[a0:b0] in cell j; masked values go to the spare cell H
    cnt[:] = 0
    if rg > 0.0:
        f = H / rg
        # cell indices first (a loop that vectorises), then the increments
        for i0 in range(a0, b0, _IDX_BLOCK):
            i1 = min(i0 + _IDX_BLOCK, b0)
            for i in range(i0, i1):
                idx[i - i0] = min(max(int((np.float64(x[i]) - lo0) * f), 0), H - 1)
            if has_mask:
                for i in range(i0, i1):
                    if mask[i]:
                        idx[i - i0] = H
            for i in range(i1 - i0):
                cnt[idx[i]] += 1


@njit(cache=True, nogil=True)
def _prefix_sums(cnt, H, ics, C, S1, o):  # pragma: no cover - compiled
    # prefix sums of count and value at C/S1[o:o + H + 1]; a value counts at its cell centre.
    # The sum of squares is the same for every candidate, so it is left out (errors are
    # compared, never reported). Integer prefix sums (1-cycle adds), converted in a second,
    # dependency-free loop; S1 counts values at cell centres j + 1/2, kept doubled to stay
    # integral. ``cnt`` is overwritten.
    c = 0
    s1 = 0
    for j in range(H):
        c += cnt[j]
        s1 += cnt[j] * (2 * j + 1)
        cnt[j] = c
        ics[j] = s1
    C[o] = 0.0
    S1[o] = 0.0
    for j in range(H):
        C[o + j + 1] = cnt[j]
        S1[o + j + 1] = 0.5 * ics[j]


@njit(cache=True, nogil=True)
def _histogram_search(x, seg, mask, counts, lo, hi, nq, num_bins,
                      ratio):  # pragma: no cover - compiled
    """The search of :func:`histogram_ranges`: each segment's histogram is counted from ``x``,
    or copied from ``counts`` when it has rows.

    Segments are searched two at a time in one loop: a greedy iteration is a chain of dependent
    steps, and two independent chains keep the CPU's units busy.
    """
    given = counts.shape[0] > 0
    n = x.size
    nseg = lo.size
    H = num_bins * HIST_PER_BIN
    W = H + 1
    hpb = HIST_PER_BIN
    n_iter = int(ratio * num_bins + 1e-9) - 1
    if nq < 2 or n_iter < 1:
        return
    has_mask = mask.size > 0
    inv = 1.0 / (nq - 1)
    C = np.zeros(2 * W)
    S1 = np.zeros(2 * W)
    cnt = np.zeros(H + 1, np.int64)  # cell H collects masked values
    ics = np.zeros(H, np.int64)
    idx = np.zeros(_IDX_BLOCK, np.int64)
    for s in range(0, nseg, 2):
        lo0 = np.float64(lo[s])
        rg0 = np.float64(hi[s]) - lo0
        ok0 = rg0 > 0.0 and rg0 != np.inf
        lo1 = 0.0
        rg1 = 0.0
        ok1 = False
        if s + 1 < nseg:
            lo1 = np.float64(lo[s + 1])
            rg1 = np.float64(hi[s + 1]) - lo1
            ok1 = rg1 > 0.0 and rg1 != np.inf
        if not (ok0 or ok1):
            continue
        for t in range(2):
            ok = ok0 if t == 0 else ok1
            if given and ok:
                cnt[:H] = counts[s + t]
            elif given or not ok:
                cnt[:] = 0
            else:
                a0 = (s + t) * seg
                _count_cells(x, a0, min(a0 + seg, n), mask, has_mask, lo0 if t == 0 else lo1,
                             rg0 if t == 0 else rg1, H, cnt, idx)
            _prefix_sums(cnt, H, ics, C, S1, t * W)
        A0 = 0.0
        B0 = float(H)
        A1 = 0.0
        B1 = float(H)
        best0 = _full_error(nq, C, S1, 0, 0.0, H)
        best1 = _full_error(nq, C, S1, W, 0.0, H)
        ba0 = A0
        bb0 = B0
        ba1 = A1
        bb1 = B1
        CH0 = C[H]
        SH0 = S1[H]
        CH1 = C[W + H]
        SH1 = S1[W + H]
        for _ in range(n_iter):
            # both candidates of both segments: [A + hpb, B] ("x") and [A, B - hpb] ("y")
            d0 = (B0 - A0 - hpb) * inv
            d1 = (B1 - A1 - hpb) * inv
            p0 = A0 + 0.5 * d0 + 0.5
            p1 = W + A1 + 0.5 * d1 + 0.5
            tx0 = ty0 = ux0 = uy0 = 0.0
            tx1 = ty1 = ux1 = uy1 = 0.0
            for k in range(nq - 1):
                v0 = A0 + k * d0
                v1 = A1 + k * d1
                # unsigned indices: no negative-index wraparound test in the hot loop
                j0 = np.uint64(p0 + k * d0)
                j1 = np.uint64(p1 + k * d1)
                ty0 += S1[j0]
                uy0 += C[j0] * (2.0 * v0 + d0)
                tx0 += S1[j0 + np.uint64(hpb)]
                ux0 += C[j0 + np.uint64(hpb)] * (2.0 * (v0 + hpb) + d0)
                ty1 += S1[j1]
                uy1 += C[j1] * (2.0 * v1 + d1)
                tx1 += S1[j1 + np.uint64(hpb)]
                ux1 += C[j1 + np.uint64(hpb)] * (2.0 * (v1 + hpb) + d1)
            by0 = B0 - hpb
            by1 = B1 - hpb
            ex0 = -2.0 * (B0 * SH0 - d0 * tx0) + (B0 * B0 * CH0 - d0 * ux0)
            ey0 = -2.0 * (by0 * SH0 - d0 * ty0) + (by0 * by0 * CH0 - d0 * uy0)
            ex1 = -2.0 * (B1 * SH1 - d1 * tx1) + (B1 * B1 * CH1 - d1 * ux1)
            ey1 = -2.0 * (by1 * SH1 - d1 * ty1) + (by1 * by1 * CH1 - d1 * uy1)
            # branch-free moves: the comparisons are data dependent
            tk0 = ex0 < ey0
            e0 = ex0 if tk0 else ey0
            A0 = A0 + hpb if tk0 else A0
            B0 = B0 if tk0 else by0
            tk1 = ex1 < ey1
            e1 = ex1 if tk1 else ey1
            A1 = A1 + hpb if tk1 else A1
            B1 = B1 if tk1 else by1
            bt0 = e0 < best0
            best0 = e0 if bt0 else best0
            ba0 = A0 if bt0 else ba0
            bb0 = B0 if bt0 else bb0
            bt1 = e1 < best1
            best1 = e1 if bt1 else best1
            ba1 = A1 if bt1 else ba1
            bb1 = B1 if bt1 else bb1
        if ok0:
            lo[s] = lo0 + ba0 * (rg0 / H)
            hi[s] = lo0 + bb0 * (rg0 / H)
        if ok1:
            lo[s + 1] = lo1 + ba1 * (rg1 / H)
            hi[s + 1] = lo1 + bb1 * (rg1 / H)


@njit(cache=True, nogil=True)
def _direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio):  # pragma: no cover - compiled
    """The search of :func:`direct_ranges`: two segments side by side (each greedy step waits
    on the previous one).
    """
    n = x.size
    nseg = lo.size
    H = num_bins * HIST_PER_BIN
    n_iter = int(ratio * num_bins + 1e-9) - 1
    if nq < 2 or n_iter < 1:
        return
    qmax = nq - 1.0
    u0 = np.empty(max(seg, 1))
    u1 = np.empty(max(seg, 1))
    for s in range(0, nseg, 2):
        lo0 = np.float64(lo[s])
        rg0 = np.float64(hi[s]) - lo0
        m0 = _cells(x, s * seg, min(s * seg + seg, n), mask, lo0, rg0, H, u0)
        lo1 = 0.0
        rg1 = 0.0
        m1 = 0
        if s + 1 < nseg:
            lo1 = np.float64(lo[s + 1])
            rg1 = np.float64(hi[s + 1]) - lo1
            m1 = _cells(x, (s + 1) * seg, min((s + 1) * seg + seg, n), mask, lo1, rg1, H, u1)
        if m0 < 0 and m1 < 0:
            continue
        m0 = max(m0, 0)
        m1 = max(m1, 0)
        A0 = 0.0
        B0 = float(H)
        A1 = 0.0
        B1 = float(H)
        best0 = _direct_error(u0, m0, 0.0, H / qmax, qmax)
        best1 = _direct_error(u1, m1, 0.0, H / qmax, qmax)
        ba0 = A0
        bb0 = B0
        ba1 = A1
        bb1 = B1
        for _ in range(n_iter):
            # candidates [A + hpb, B] ("x") and [A, B - hpb] ("y"): the same spacing
            ex0, ey0 = _candidate_errors(u0, m0, A0, B0, qmax)
            ex1, ey1 = _candidate_errors(u1, m1, A1, B1, qmax)
            # branch-free moves: the comparisons are data dependent
            tk0 = ex0 < ey0
            e0 = ex0 if tk0 else ey0
            A0 = A0 + HIST_PER_BIN if tk0 else A0
            B0 = B0 if tk0 else B0 - HIST_PER_BIN
            tk1 = ex1 < ey1
            e1 = ex1 if tk1 else ey1
            A1 = A1 + HIST_PER_BIN if tk1 else A1
            B1 = B1 if tk1 else B1 - HIST_PER_BIN
            bt0 = e0 < best0
            best0 = e0 if bt0 else best0
            ba0 = A0 if bt0 else ba0
            bb0 = B0 if bt0 else bb0
            bt1 = e1 < best1
            best1 = e1 if bt1 else best1
            ba1 = A1 if bt1 else ba1
            bb1 = B1 if bt1 else bb1
        if rg0 > 0.0 and rg0 != np.inf:
            lo[s] = lo0 + ba0 * (rg0 / H)
            hi[s] = lo0 + bb0 * (rg0 / H)
        if rg1 > 0.0 and rg1 != np.inf:
            lo[s + 1] = lo1 + ba1 * (rg1 / H)
            hi[s + 1] = lo1 + bb1 * (rg1 / H)


@njit(cache=True, nogil=True, inline="always")
def _cells(x, a0, b0, mask, lo0, rg0, H, u):  # pragma: no cover - compiled
    # the unmasked values of x[a0:b0] in cells from the minimum, exactly; -1 if no search
    if not (rg0 > 0.0 and rg0 != np.inf):
        return -1
    f = H / rg0
    m = 0
    has_mask = mask.size > 0
    for i in range(a0, b0):
        if has_mask and mask[i]:
            continue
        u[m] = (np.float64(x[i]) - lo0) * f
        m += 1
    return m


@njit(cache=True, nogil=True, inline="always")
def _candidate_errors(u, m, A, B, qmax):  # pragma: no cover - compiled
    d = (B - A - HIST_PER_BIN) / qmax
    inv = 1.0 / d
    ax = A + HIST_PER_BIN
    ex = 0.0
    ey = 0.0
    for i in range(m):
        v = u[i]
        cx = min(max(np.floor((v - ax) * inv + 0.5), 0.0), qmax)
        cy = min(max(np.floor((v - A) * inv + 0.5), 0.0), qmax)
        rx = v - ax - cx * d
        ry = v - A - cy * d
        ex += rx * rx
        ey += ry * ry
    return ex, ey


@njit(cache=True, nogil=True)
def _direct_error(u, m, a, d, qmax):  # pragma: no cover - compiled
    inv = 1.0 / d
    e = 0.0
    for i in range(m):
        c = min(max(np.floor((u[i] - a) * inv + 0.5), 0.0), qmax)
        r = u[i] - a - c * d
        e += r * r
    return e


@njit(cache=True, nogil=True)
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


#: the two searches by the names of the family "adaptive" (ckptcodecs._backend)
histogram_search = _histogram_search
direct_search = _direct_ranges
