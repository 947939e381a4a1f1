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
   or above and a histogram has at most AD_LANES_CELLS cells (the records of 8 lanes then take
   at most 4 MiB); elsewhere adaptive.c's pair loop. */
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
} ad_lanes;

/* rec[4 j .. 4 j + 4) = S1[j], C[j], S1[j + hpb], C[j + hpb] for each lane's cells j in
   [l W, l W + W - hpb) (lane l's prefix sums at C/S1[l W ..]): the operands of a threshold. */
void ad_records(const double *C, const double *S1, int64_t W, double *rec);

/* n_iter greedy steps of every lane over its records (nq levels; cells W - 1 a histogram, as
   adaptive.c's pair loop, lane parity its pair position). */
void ad_walk_lanes(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter, const double *rec,
                   int64_t W);

/* The short rows' exact search (adaptive_direct.c). */
PyObject *ck_adaptive_direct_ranges(PyObject *self, PyObject *args);

#endif
