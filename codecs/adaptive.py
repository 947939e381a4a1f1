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
per candidate instead of ``O(segment length)``. Candidate end points fall on
cell edges, so the errors are those of the values moved to their cell centres -- 4 cells per step,
180 across the range for 45 bins: the search sees the row at about 7.5-bit resolution. The final
codes are computed from the exact values.

The error formula: values are measured in cells from the segment minimum, ``C``/``S1`` are prefix
sums of count and value over the cells. Level ``k`` of a candidate ``[a, b]`` is ``v_k = a + k d``
and takes the cells below the edge ``j_k`` nearest to the threshold ``a + (k + 1/2) d``. Summing
``S2 - 2 v S1 + v^2 C`` over the levels telescopes to sums over thresholds of prefix sums::

    err = S2 - 2 (b S1[H] - d sum_k S1[j_k]) + (b^2 C[H] - d sum_k C[j_k] (2 v_k + d))

``S2`` is the same for all candidates and dropped. The two candidates of an iteration have the
same spacing ``d`` and thresholds ``HIST_PER_BIN`` cells apart, so one index serves both. All
segments (rows) are searched in one compiled call, two side by side -- the per-row loop runs in
machine code, not in Python.

Short rows. The histogram costs ``O(levels)`` per candidate whatever the row length, so a row of
16 values at 8 bits paid for 255 thresholds (0.1 M rows/s). Segments of at most
``2 * (nq - 1) + 16`` values (:func:`use_direct`) are searched instead with the *exact* error of
each candidate, ``sum (x - a - d * clip(round((x - a) / d)))**2`` over the row's values, in
``O(row length)``: the same candidates (cell edges), the same greedy walk and tie rule, two rows
side by side. Its errors are exact rather than measured at cell centres, so its choice is at
least as good by the true L2 error (measured: 0.0-0.3 % lower mean L2 per row than the
histogram search on rows of 16-64).

The early end. Every candidate the walk reaches after a step lies inside the range ``[A, B]``
it stands on, so the error of each is at least the clip error of the values outside ``[A, B]``
(each costs at least its distance to ``A`` or ``B`` squared). Once that bound, less a margin far
above the rounding of the computed errors, is not below the best error so far, no later
candidate can become the best (the walk keeps the first of equal errors) and the compiled
kernels end the walk: the same ranges, in fewer steps -- 1-3 of 44 at 8 bits, 10-20 at 4 bits
on bell-curve rows (``benchmarks/early_end.py``). The histogram search reads the bound off its
prefix sums and one more (of squares, at the edges), exact integers in float64 (where counts
are too large for that, it walks to the end); the exact search sums it over the row's values
each step. The numba kernels walk to the end: the tests compare both.

Kernels: the numba ones (``_akernels.py``) are the reference, compiled without ``fastmath`` --
plain IEEE float64 in source order, no FMA contraction, no reordered sums -- so the ranges (and
the bytes quantize writes) do not depend on the CPU. Callers run ``_ADAPTIVE``, the kernels
:mod:`ckptcodecs._backend` chose: by default the C twins ``adaptive_histogram_search`` and
``adaptive_direct_ranges`` of ``ckptcodecs._native`` (the same bits; ValueError on arguments
that do not fit).
"""

from __future__ import annotations

import numpy as np

from ._akernels import HIST_PER_BIN, direct_search, histogram_search
from ._backend import kernels

__all__ = ["DIRECT_SLACK", "HIST_PER_BIN", "adaptive_ranges", "cell_counts_shape",
           "default_num_bins", "direct_ranges", "histogram_ranges",
           "histogram_ranges_from_counts", "use_direct"]

#: Segments of up to ``2 * (nq - 1) + DIRECT_SLACK`` values use the exact search.
DIRECT_SLACK = 16


def default_num_bins(bits: int) -> int:
    """Check-N-Run's choice: 25 bins for bit widths up to 3, 45 for 4 bits (and wider)."""
    return 25 if bits <= 3 else 45


def cell_counts_shape(nseg: int, num_bins: int) -> tuple[int, int]:
    """Shape of the histograms :func:`histogram_ranges_from_counts` takes: one row of
    ``num_bins * HIST_PER_BIN`` cells per segment."""
    return nseg, num_bins * HIST_PER_BIN


def use_direct(seg: int, nq: int) -> bool:
    """True when the exact per-value search is the faster one: segments up to about twice the
    number of levels (measured crossover: 24 values at 2 bits, 32 at 3, 48 at 4, > 256 at 8)."""
    return seg <= 2 * (nq - 1) + DIRECT_SLACK


def adaptive_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio) -> None:
    """Refine ``lo``/``hi`` (float64, per-segment min/max of the unmasked values) in place.

    ``x``: flat float array; ``seg``: segment length; ``mask``: uint8 array of x.size (nonzero =
    value excluded) or of size 0; ``nq``: number of uniform levels. Short segments
    (:func:`use_direct`) are searched with exact errors (:func:`direct_ranges`), others over a
    histogram (:func:`histogram_ranges`); both walk the same candidates.
    """
    fn = direct_ranges if use_direct(seg, nq) else histogram_ranges
    fn(x, seg, mask, lo, hi, nq, num_bins, ratio)


def histogram_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio) -> None:
    """Refine ``lo``/``hi`` (per-segment min/max of the unmasked values) in place.

    ``x``: flat float array; ``seg``: segment length; ``mask``: uint8 array of x.size (nonzero =
    value excluded) or of size 0; ``nq``: number of uniform levels.
    """
    _ADAPTIVE.histogram_search(x, seg, mask, _NO_COUNTS, lo, hi, nq, num_bins, ratio)


def histogram_ranges_from_counts(counts, lo, hi, nq, num_bins, ratio) -> None:
    """:func:`histogram_ranges` from the segments' cell counts instead of their values:
    ``counts[s, j]`` is the number of unmasked values ``v`` of segment ``s`` with
    ``min(max(int((float64(v) - lo[s]) * (H / (hi[s] - lo[s]))), 0), H - 1) == j``, ``H`` the
    row length (:func:`cell_counts_shape`). The same search, so the same ranges: the counts may
    come from elsewhere (a GPU, :mod:`ckptstore.device.quant`)."""
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if counts.shape != cell_counts_shape(lo.size, num_bins):
        raise ValueError(f"counts of shape {counts.shape}, expected "
                         f"{cell_counts_shape(lo.size, num_bins)}")
    _ADAPTIVE.histogram_search(_NO_VALUES, 1, _NO_MASK, counts, lo, hi, nq, num_bins, ratio)


def direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio) -> None:
    """As :func:`histogram_ranges`, with the exact error of each candidate: ``O(row length)``
    per candidate instead of ``O(levels)``, no histogram -- faster on rows shorter than about
    twice the number of levels. The candidates (cell edges) and the greedy walk are the same."""
    _ADAPTIVE.direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio)


_NO_COUNTS = np.zeros((0, 0), np.int64)
_NO_VALUES = np.zeros(0, np.float64)
_NO_MASK = np.zeros(0, np.uint8)


#: the kernels this process runs (:mod:`ckptcodecs._backend`: the C twins ``adaptive_*`` of
#: ``ckptcodecs._native`` by default, the same bytes; the numba ones of _akernels.py are the
#: reference)
_ADAPTIVE = kernels("adaptive", histogram_search=histogram_search, direct_ranges=direct_search)
