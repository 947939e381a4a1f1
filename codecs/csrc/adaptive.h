/* The adaptive range search's C kernels (family "adaptive": the twins of the numba kernels of
   ckptcodecs/adaptive.py, plain IEEE in source order): the arguments both searches take. */
#ifndef CKPTCODECS_ADAPTIVE_H
#define CKPTCODECS_ADAPTIVE_H

#include "quant.h"

/* Histogram cells per greedy step (adaptive.HIST_PER_BIN). */
#define AD_HPB 4
/* The most cells a segment's histogram may have (num_bins * AD_HPB). */
#define AD_MAX_CELLS (1 << 24)

/* A search's arguments, checked: x (float32/float64), mask (bytes, empty or >= n), counts
   (int64, empty or nseg * cells; the histogram search only), lo and hi (float32/float64, nseg
   each, written). */
typedef struct {
    Py_buffer v[5];
    int held;
    Py_buffer *x, *mask, *counts, *lo, *hi;
    Py_ssize_t n, seg, nseg, nq, cells, n_iter;
} ad_args;

/* Parse and check `args` (with a counts argument when `with_counts`): 1 when there is a search
   to run, its views a->v[0..a->held) held (the caller releases them: ck_none); 0 when numba's
   kernel returns at once (nq < 2 or no greedy step), -1 with a ValueError, none held then. A
   ratio above 1 that takes more than num_bins greedy steps (num_bins - 1 without
   `zero_width_ok`: the direct search divides by a zero spacing there, numba's raises
   ZeroDivisionError) is a ValueError: the candidates would leave the histogram. */
int ad_parse(PyObject *args, int with_counts, int zero_width_ok, ad_args *a, const char *name);

/* A search's Python wrapper: its arguments parsed and checked (ad_parse, with a counts
   argument and num_bins greedy steps allowed when with_counts), `search` run without the GIL
   (-1: out of memory), the views released; NULL where an exception is set, else the greedy
   steps walked (summed over the groups of segments walked together: the early end's
   measure). */
PyObject *ad_call(PyObject *args, int with_counts, const char *name,
                  Py_ssize_t (*search)(ad_args *));

/* The walk's early end. Every candidate a greedy walk reaches after a step lies inside the
   range [A, B] it stands on, so each of its values outside [A, B] costs at least its distance
   to A or B squared: the error of the rest of the walk is at least that clip error, LB(A, B).
   Where LB(A, B), less a margin eps for the rounding of the computed errors, is not below the
   best error so far, no later candidate can become the best (the walk keeps the first of equal
   errors), and the walk may end: the same ranges, fewer steps. */

/* For a histogram's prefix sums C (count) and S1 (values at cell centres j + 1/2) of the
   cells below each cell, and Q (sum of cnt[j] (2j + 1)^2) of those below each edge (Q[i]:
   below edge i hpb), exact (integers and halves below 2**53, which the search checks before
   it ends a walk early), 4 LB(A, B) - Q[H / hpb] is
       Q[A / hpb] - 8 A S1[A] + 4 A^2 C[A] - Q[B / hpb] - 8 B (S1[H] - S1[B])
       + 4 B^2 (C[H] - C[B])
   ((2j + 1 - 2A)^2 summed over the cells below A, (2j + 1 - 2B)^2 over those from B; Q[H] / 4
   is the constant the computed errors leave out), exact too. 1 when a walk standing on [A, B]
   (edges, in cells) with its best computed error `best` may end: that / 4 - eps >= best (eps
   a margin far above the computed errors' rounding; false for a NaN best). The sums of index
   i at C/S1[i * step] and Q[i * qstep] (1: tables of their own; ad_prefix_lanes': a lane's). */
static inline int ad_settled(const double *C, const double *S1, const double *Q, int64_t step,
                             int64_t qstep, int64_t H, double eps, double A, double B,
                             double best)
{
    int64_t a = (int64_t)A * step, b = (int64_t)B * step, h = H * step;
    int64_t qa = (int64_t)A / AD_HPB * qstep, qb = (int64_t)B / AD_HPB * qstep;
    double lb4 = (Q[qa] - 8.0 * A * S1[a] + 4.0 * A * A * C[a])
                 + ((4.0 * B * B * (C[h] - C[b]) - 8.0 * B * (S1[h] - S1[b])) - Q[qb]);
    return lb4 * 0.25 - eps >= best;
}

/* The early end's margin for a histogram of T values (nq levels, H cells), or INFINITY (never
   end early) where the prefix sums are not exact: about 2**13 times the rounding of the
   computed errors, (nq + 16) (H + 1)^2 (T + 1) 2**-40. */
double ad_margin(int exact, Py_ssize_t nq, int64_t H, double T);

/* 0 turns the early end off (adaptive_early_end: tests and benchmarks); ad_margin is then
   INFINITY. */
extern int ad_early_end;

/* numba's int(v) of a float64 on x86-64 (cvttsd2si): v truncated, INT64_MIN where v is NaN or
   beyond the int64 range. */
static inline int64_t ad_trunc(double v)
{
    return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? (int64_t)v : INT64_MIN;
}

/* Python's max(a, b) and min(a, b) of two floats as numba compiles them: b where b > a (b < a),
   else a -- NaN and signed zeros as the numba kernels see them. */
static inline double ad_max(double a, double b) { return b > a ? b : a; }
static inline double ad_min(double a, double b) { return b < a ? b : a; }

/* The histogram search's walks with AVX2, AD_LANES segments at once (adaptive_lanes.c; x86-64
   with GCC or clang): their state, lane l for segment s + l. Run where the CPU path is "avx2"
   or above and a histogram has at most AD_LANES_CELLS cells (the tables of 8 lanes then take
   about 7 MiB at most); elsewhere adaptive.c's pair loop. */
#define AD_LANES 8
#define AD_LANES_CELLS (1 << 14)
#if defined(__x86_64__) && defined(__GNUC__)
#define AD_HAVE_LANES 1
#else
#define AD_HAVE_LANES 0
#endif
typedef struct {
    double A[AD_LANES], B[AD_LANES], best[AD_LANES], ba[AD_LANES], bb[AD_LANES];
    double CH[AD_LANES], SH[AD_LANES];
    /* the lanes' prefix sums (ad_prefix_lanes' CS and Q), lane l's margin eps (-INFINITY: a
       lane nothing is read from, or of no counts -- every error of it is +0.0 -- settled from
       the start) */
    const double *CS, *Q;
    double eps[AD_LANES];
} ad_lanes;

/* The lanes' histograms into their prefix sums, a vector for 4 lanes. cnt holds `tables` (1,
   or 4 where a row was counted into 4 histograms) tables of W rows of AD_LANES counts (cell j
   of lane l at j * AD_LANES + l, W = H + 1: cell H the masked values'), summed; left zeroed.
   Out, the sums of adaptive.c's prefix_sums, the same bits: lane l's S1[i] and C[i] (i in
   [0, W)) side by side at CS[2 (i AD_LANES + l)] (a threshold's operands S1[j], C[j], S1[j +
   hpb], C[j + hpb]: two 16-byte loads), Q[i] (i in [0, H / hpb]) at Q[i AD_LANES + l];
   exact[l]: prefix_sums' return value; any[l]: whether a count of lane l is not zero.
   `counted`: the counts are rows' counted by the search, each of fewer than AD_COUNTED_MAX
   values (the sums then run in doubles, exactly). */
#define AD_COUNTED_MAX ((Py_ssize_t)1 << 37)
void ad_prefix_lanes(int64_t *cnt, int tables, int counted, int64_t W, double *CS, double *Q,
                     int *exact, int *any);

/* best[l]: adaptive.c's full_error (the first range's error) of each lane over its prefix
   sums CS (ad_prefix_lanes'), 4 lanes a vector: the same operations, so the same bits. */
void ad_full_errors(Py_ssize_t nq, const double *CS, int64_t H, double *best);

/* Up to n_iter greedy steps of every lane over its prefix sums w->CS (nq levels; cells W - 1 a
   histogram, as adaptive.c's pair loop, lane parity its pair position), until every lane is
   settled (ad_settled); the steps walked. */
Py_ssize_t ad_walk_lanes(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter, int64_t W);

/* The short rows' exact search (adaptive_direct.c): its Python wrapper, and the search over
   a's segments (steps walked, -1 out of memory; no Python calls: runs without the GIL). */
PyObject *ck_adaptive_direct_ranges(PyObject *self, PyObject *args);
Py_ssize_t ad_direct_run(ad_args *a);

/* adaptive.use_direct: segments of at most 2 (nq - 1) + 16 values get the exact search. */
static inline int ad_use_direct(Py_ssize_t seg, Py_ssize_t nq)
{
    return seg <= 2 * (nq - 1) + 16;
}

/* The greedy step count of num_bins and ratio, checked (0: no search; -1 with a ValueError:
   the Python wrappers' check; call it with the GIL). */
Py_ssize_t ad_greedy_steps(double ratio, Py_ssize_t num_bins, int zero_width_ok,
                           const char *name);

/* The histogram search's tables for histograms of `cells` cells, for ad_search_floats to reuse
   across calls (a chunk's groups of rows: no allocation and zeroing a call); NULL where the
   8-lane search does not run (no AVX2, more than AD_LANES_CELLS cells) or out of memory. */
typedef struct ad_tables ad_tables;
ad_tables *ad_tables_new(Py_ssize_t cells);
void ad_tables_free(ad_tables *t);

/* adaptive.adaptive_ranges on raw arrays (quant_chunk.c's one call): x the n float32 values,
   no mask, lo/hi the nseg segments' float64 min/max refined in place, by the search
   ad_use_direct picks, n_iter greedy steps (ad_greedy_steps); `tables` NULL or from
   ad_tables_new(num_bins * AD_HPB). The steps walked, or -1 out of memory; no Python calls. */
Py_ssize_t ad_search_floats(const float *x, Py_ssize_t n, Py_ssize_t seg, double *lo, double *hi,
                            Py_ssize_t nseg, Py_ssize_t nq, Py_ssize_t num_bins,
                            Py_ssize_t n_iter, ad_tables *tables);

#endif
