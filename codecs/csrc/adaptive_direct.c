/* The adaptive range search of short segments with each candidate's exact error
   (adaptive_direct_ranges, the twin of adaptive._direct_ranges without fastmath: the same
   operations in the same order, float64 throughout, no contraction). */
#include <math.h>
#include <stdlib.h>
#include "adaptive.h"

/* Segments are searched LANES at a time, one in each lane of the loops below (independent
   chains: each segment's sums keep numba's order, a lane past a segment's end adds 0.0, which
   leaves a sum of squares unchanged); the lane loops vectorise. */
#define LANES 8

/* GCC keeps branches in these loops while floating-point operations may trap (its default):
   -fno-trapping-math for these functions lets them vectorise; it changes no value. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_TRAPS __attribute__((optimize("no-trapping-math")))
#else
#define NO_TRAPS
#endif

/* floor(x) in plain double arithmetic that vectorises (floor is a library call on baseline
   x86-64): (x + 2**52) - 2**52 rounds |x| < 2**52 to an integer (C without -ffast-math keeps
   both steps), one less where that rounded up; x itself where |x| >= 2**52, NaN or a zero. */
NO_TRAPS static inline __attribute__((always_inline)) double floor_exact(double x)
{
    double m = copysign(0x1p52, x), r = (x + m) - m;
    r = r > x ? r - 1.0 : r;
    return fabs(x) < 0x1p52 && x != 0.0 ? r : x;
}

/* ad_max and ad_min, inlined into these functions (of other optimisation options). */
NO_TRAPS static inline __attribute__((always_inline)) double max_(double a, double b)
{
    return b > a ? b : a;
}
NO_TRAPS static inline __attribute__((always_inline)) double min_(double a, double b)
{
    return b < a ? b : a;
}

/* The unmasked values of segment s in cells from lo0, exactly, into lane `lane` of u (LANES
   values a row); their count, or -1 where the range rg0 is not searched. *umax: the largest
   |u| (NaN where one is NaN). */
static Py_ssize_t cells(const ad_args *a, Py_ssize_t s, double lo0, double rg0, double *u,
                        int lane, double *umax)
{
    *umax = 0.0;
    if (!(rg0 > 0.0 && rg0 != INFINITY))
        return -1;
    Py_ssize_t a0, b0, m = 0;
    qk_segment(s, a->seg, a->n, &a0, &b0);
    const uint8_t *mask = a->mask->len ? (const uint8_t *)a->mask->buf : NULL;
    double f = (double)a->cells / rg0, top = 0.0;
    for (Py_ssize_t i = a0; i < b0; i++)
        if (!(mask && mask[i])) {
            double v = (qk_get(a->x, i) - lo0) * f;
            u[m++ * LANES + lane] = v;
            top = v != v ? v : (fabs(v) > top ? fabs(v) : top);  /* NaN stays */
        }
    *umax = top;
    return m;
}

/* Each lane's errors of the levels a + c * d (c = 0..qmax, d = (B - a - off) / qmax; off = H
   with B = H, a = 0 for the full range) over its values u[i * LANES + l], i < m[l] -- the
   candidates [A + hpb, B] (a = A + hpb, off = hpb) and [A, B - hpb] (a = A, off = hpb) of a
   greedy step at once. */
#define LANE_ERRORS(NAME, ATTR, FLOOR)                                                        \
    NO_TRAPS ATTR static void NAME(const double *restrict u, Py_ssize_t mmin, Py_ssize_t mmax, \
                                   const double *restrict m, const double *A,                 \
                                   const double *B, double qmax, int full, double *ex,        \
                                   double *ey)                                                \
    {                                                                                         \
        double d[LANES], inv[LANES], ax[LANES], sx[LANES], sy[LANES];                         \
        for (int l = 0; l < LANES; l++) {                                                     \
            d[l] = full ? B[l] / qmax : (B[l] - A[l] - AD_HPB) / qmax;                        \
            inv[l] = 1.0 / d[l];                                                              \
            ax[l] = full ? A[l] : A[l] + AD_HPB;                                              \
            sx[l] = sy[l] = 0.0;                                                              \
        }                                                                                     \
        for (Py_ssize_t i = 0; i < mmin; i++)                                                 \
            for (int l = 0; l < LANES; l++) {                                                 \
                double v = u[i * LANES + l];                                                  \
                double cx = min_(max_(FLOOR((v - ax[l]) * inv[l] + 0.5), 0.0), qmax);         \
                double cy = min_(max_(FLOOR((v - A[l]) * inv[l] + 0.5), 0.0), qmax);          \
                double rx = v - ax[l] - cx * d[l], ry = v - A[l] - cy * d[l];                 \
                sx[l] += rx * rx;                                                             \
                sy[l] += ry * ry;                                                             \
            }                                                                                 \
        for (Py_ssize_t i = mmin; i < mmax; i++)                                              \
            for (int l = 0; l < LANES; l++) {                                                 \
                double v = u[i * LANES + l];                                                  \
                double cx = min_(max_(FLOOR((v - ax[l]) * inv[l] + 0.5), 0.0), qmax);         \
                double cy = min_(max_(FLOOR((v - A[l]) * inv[l] + 0.5), 0.0), qmax);          \
                double rx = v - ax[l] - cx * d[l], ry = v - A[l] - cy * d[l];                 \
                int in = (double)i < m[l];                                                    \
                sx[l] += in ? rx * rx : 0.0;                                                  \
                sy[l] += in ? ry * ry : 0.0;                                                  \
            }                                                                                 \
        memcpy(ex, sx, sizeof sx);                                                            \
        memcpy(ey, sy, sizeof sy);                                                            \
    }
LANE_ERRORS(errors_plain, , floor_exact)
LANE_ERRORS(errors_avx2, QK_AVX2, floor)  /* AVX2 implies SSE4.1's vroundpd: floor inline */
/* x86-64-v4: the 8 lanes one vector, and 32 registers */
LANE_ERRORS(errors_avx512, CK_TARGET_AVX512, floor)

typedef void errors_fn(const double *, Py_ssize_t, Py_ssize_t, const double *,
                       const double *, const double *, double, int, double *, double *);

/* Each lane's clip error of [A, B] over its values u[i * LANES + l], i < m[l]: sum (A - u)^2
   over u < A and (u - B)^2 over u > B, the lower bound of the early end (adaptive.h). */
#define LANE_BOUNDS(NAME, ATTR)                                                               \
    NO_TRAPS ATTR static void NAME(const double *restrict u, Py_ssize_t mmin, Py_ssize_t mmax, \
                                   const double *restrict m, const double *A,                 \
                                   const double *B, double *lb)                               \
    {                                                                                         \
        double s[LANES];                                                                      \
        for (int l = 0; l < LANES; l++)                                                       \
            s[l] = 0.0;                                                                       \
        for (Py_ssize_t i = 0; i < mmin; i++)                                                 \
            for (int l = 0; l < LANES; l++) {                                                 \
                double v = u[i * LANES + l];                                                  \
                double below = max_(A[l] - v, 0.0), above = max_(v - B[l], 0.0);             \
                s[l] += below * below + above * above;                                        \
            }                                                                                 \
        for (Py_ssize_t i = mmin; i < mmax; i++)                                              \
            for (int l = 0; l < LANES; l++) {                                                 \
                double v = u[i * LANES + l];                                                  \
                double below = max_(A[l] - v, 0.0), above = max_(v - B[l], 0.0);             \
                int in = (double)i < m[l];                                                    \
                s[l] += in ? below * below + above * above : 0.0;                             \
            }                                                                                 \
        memcpy(lb, s, sizeof s);                                                              \
    }
LANE_BOUNDS(bounds_plain, )
LANE_BOUNDS(bounds_avx2, QK_AVX2)
LANE_BOUNDS(bounds_avx512, CK_TARGET_AVX512)

typedef void bounds_fn(const double *, Py_ssize_t, Py_ssize_t, const double *, const double *,
                       const double *, double *);

/* The greedy walks of LANES segments over u until every lane is settled (its clip error
   lb, less eps, not below its best: adaptive.h's early end): each lane's best [ba, bb] in
   cells; the steps walked. */
static Py_ssize_t walk(const double *u, Py_ssize_t mmin, Py_ssize_t mmax, const double *m,
                       const double *eps, const ad_args *a, errors_fn *errors,
                       bounds_fn *bounds, double *ba, double *bb)
{
    const double qmax = (double)a->nq - 1.0, H = (double)a->cells;
    double A[LANES], B[LANES], best[LANES], ex[LANES], ey[LANES], lb[LANES];
    for (int l = 0; l < LANES; l++)
        A[l] = 0.0, B[l] = H;
    errors(u, mmin, mmax, m, A, B, qmax, 1, best, ey);
    memcpy(ba, A, sizeof A);
    memcpy(bb, B, sizeof B);
    int may_end = 1;  /* no lane that never settles (eps +INFINITY): else no bound pass */
    for (int l = 0; l < LANES; l++)
        may_end &= eps[l] < INFINITY;
    Py_ssize_t i = 0;
    while (i < a->n_iter) {
        errors(u, mmin, mmax, m, A, B, qmax, 0, ex, ey);
        for (int l = 0; l < LANES; l++) {
            int tk = ex[l] < ey[l];
            double e = tk ? ex[l] : ey[l];
            A[l] = tk ? A[l] + AD_HPB : A[l];
            B[l] = tk ? B[l] : B[l] - AD_HPB;
            int bt = e < best[l];
            best[l] = bt ? e : best[l];
            ba[l] = bt ? A[l] : ba[l];
            bb[l] = bt ? B[l] : bb[l];
        }
        i++;
        if (!may_end)
            continue;
        bounds(u, mmin, mmax, m, A, B, lb);
        int all = 1;
        for (int l = 0; l < LANES; l++)
            all &= lb[l] - eps[l] >= best[l];
        if (all)
            break;
    }
    return i;
}

/* Segments s .. s + LANES - 1 (those < nseg): lo/hi of a searched range set. */
static Py_ssize_t search_lanes(ad_args *a, Py_ssize_t s, Py_ssize_t len, double *u,
                               errors_fn *errors, bounds_fn *bounds)
{
    double lo0[LANES], rg0[LANES], m[LANES], ba[LANES], bb[LANES], eps[LANES];
    Py_ssize_t mmin = len, mmax = 0;
    int any = 0;
    memset(u, 0, (size_t)len * LANES * sizeof *u);
    for (int l = 0; l < LANES; l++) {
        Py_ssize_t k = -1;
        double umax = 0.0;
        lo0[l] = rg0[l] = 0.0;
        if (s + l < a->nseg) {
            lo0[l] = qk_get(a->lo, s + l);
            rg0[l] = qk_get(a->hi, s + l) - lo0[l];
            k = cells(a, s + l, lo0[l], rg0[l], u, l, &umax);
        }
        /* the early end's margin, far above the rounding of k squares of values up to
           R = max(H, umax) cells summed (about (k + nq) k (R + 1)^2 2**-53); a lane not
           searched or of no values is settled from the start (-inf), one with a value that
           is not finite never (+inf) */
        double R = (double)a->cells > umax ? (double)a->cells : umax;
        eps[l] = k <= 0 ? -INFINITY
                 : !(umax < INFINITY) || !ad_early_end ? INFINITY
                 : ldexp(((double)a->nq + (double)k + 16.0) * ((double)k + 1.0) * (R + 1.0)
                         * (R + 1.0), -40);
        any |= k >= 0;
        m[l] = k > 0 ? (double)k : 0.0;
        mmax = k > mmax ? k : mmax;
        mmin = (Py_ssize_t)m[l] < mmin ? (Py_ssize_t)m[l] : mmin;
        rg0[l] = k >= 0 ? rg0[l] : 0.0;  /* 0: not searched */
    }
    if (!any)
        return 0;
    Py_ssize_t steps = walk(u, mmin, mmax, m, eps, a, errors, bounds, ba, bb);
    const double H = (double)a->cells;
    for (int l = 0; l < LANES; l++)
        if (rg0[l] != 0.0) {
            qk_set(a->lo, s + l, lo0[l] + ba[l] * (rg0[l] / H));
            qk_set(a->hi, s + l, lo0[l] + bb[l] * (rg0[l] / H));
        }
    return steps;
}

static Py_ssize_t search(ad_args *a, double *u, Py_ssize_t len)
{
    int level = CK_HAVE_BUILDS ? ck_vector() : CK_PORTABLE;
    errors_fn *errors = level >= CK_AVX512 ? errors_avx512
                        : level >= CK_AVX2 ? errors_avx2 : errors_plain;
    bounds_fn *bounds = level >= CK_AVX512 ? bounds_avx512
                        : level >= CK_AVX2 ? bounds_avx2 : bounds_plain;
    Py_ssize_t steps = 0;
    for (Py_ssize_t s = 0; s < a->nseg; s += LANES)
        steps += search_lanes(a, s, len, u, errors, bounds);
    return steps;
}

Py_ssize_t ad_direct_run(ad_args *a)
{
    Py_ssize_t len = a->seg < a->n ? a->seg : a->n;
    len = len > 1 ? len : 1;
    double *u = malloc((size_t)len * LANES * sizeof *u);
    Py_ssize_t steps = u ? search(a, u, len) : -1;
    free(u);
    return steps;
}

/* direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio): each segment's range refined in
   place by the exact search; the steps walked. */
PyObject *ck_adaptive_direct_ranges(PyObject *self, PyObject *args)
{
    return ad_call(args, 0, "direct_ranges", ad_direct_run);
}
