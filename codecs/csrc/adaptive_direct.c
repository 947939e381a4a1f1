/* The adaptive range search of short segments with each candidate's exact error
   (adaptive_direct_ranges, the twin of adaptive._direct_ranges without fastmath: the same
   operations in the same order, float64 throughout, no contraction). */
#include <math.h>
#include <stdlib.h>
#include "adaptive.h"

/* The unmasked values of segment s in cells from lo0, exactly, into u; their count, or -1
   where the range rg0 is not searched. */
static Py_ssize_t cells(const ad_args *a, Py_ssize_t s, double lo0, double rg0, double *u)
{
    if (!(rg0 > 0.0 && rg0 != INFINITY))
        return -1;
    Py_ssize_t a0, b0, m = 0;
    qk_segment(s, a->seg, a->n, &a0, &b0);
    const uint8_t *mask = a->mask->len ? (const uint8_t *)a->mask->buf : NULL;
    double f = (double)a->cells / rg0;
    for (Py_ssize_t i = a0; i < b0; i++)
        if (!(mask && mask[i]))
            u[m++] = (qk_get(a->x, i) - lo0) * f;
    return m;
}

/* The error of the levels a + c * d, c = 0..qmax, over u[0..m). */
static double direct_error(const double *restrict u, Py_ssize_t m, double a, double d,
                           double qmax)
{
    double inv = 1.0 / d, e = 0.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        double c = ad_min(ad_max(floor((u[i] - a) * inv + 0.5), 0.0), qmax);
        double r = u[i] - a - c * d;
        e += r * r;
    }
    return e;
}

/* The errors of both candidates of a greedy step, [A + hpb, B] (ex) and [A, B - hpb] (ey). */
static void candidate_errors(const double *restrict u, Py_ssize_t m, double A, double B,
                             double qmax, double *ex, double *ey)
{
    double d = (B - A - AD_HPB) / qmax, inv = 1.0 / d, ax = A + AD_HPB, sx = 0.0, sy = 0.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        double v = u[i];
        double cx = ad_min(ad_max(floor((v - ax) * inv + 0.5), 0.0), qmax);
        double cy = ad_min(ad_max(floor((v - A) * inv + 0.5), 0.0), qmax);
        double rx = v - ax - cx * d, ry = v - A - cy * d;
        sx += rx * rx;
        sy += ry * ry;
    }
    *ex = sx, *ey = sy;
}

/* One segment's greedy walk: the best [ba, bb] in cells over its values u[0..m). */
static void walk(const double *u, Py_ssize_t m, const ad_args *a, double *ba, double *bb)
{
    const double qmax = (double)a->nq - 1.0, H = (double)a->cells;
    double A = 0.0, B = H, best = direct_error(u, m, 0.0, H / qmax, qmax), ex, ey;
    *ba = A, *bb = B;
    for (Py_ssize_t i = 0; i < a->n_iter; i++) {
        candidate_errors(u, m, A, B, qmax, &ex, &ey);
        int tk = ex < ey;
        double e = tk ? ex : ey;
        A = tk ? A + AD_HPB : A;
        B = tk ? B : B - AD_HPB;
        int bt = e < best;
        best = bt ? e : best;
        *ba = bt ? A : *ba;
        *bb = bt ? B : *bb;
    }
}

static void search(ad_args *a, double *u)
{
    const double H = (double)a->cells;
    for (Py_ssize_t s = 0; s < a->nseg; s++) {
        double lo0 = qk_get(a->lo, s), rg0 = qk_get(a->hi, s) - lo0, ba, bb;
        Py_ssize_t m = cells(a, s, lo0, rg0, u);
        if (m < 0)
            continue;
        walk(u, m, a, &ba, &bb);
        qk_set(a->lo, s, lo0 + ba * (rg0 / H));
        qk_set(a->hi, s, lo0 + bb * (rg0 / H));
    }
}

/* direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio): each segment's range refined in
   place by the exact search. */
PyObject *ck_adaptive_direct_ranges(PyObject *self, PyObject *args)
{
    ad_args a;
    int run = ad_parse(args, 0, 0, &a, "direct_ranges");
    if (run <= 0) {
        if (run == 0)
            ad_done(&a);
        return run < 0 ? NULL : Py_NewRef(Py_None);
    }
    Py_ssize_t len = a.seg < a.n ? a.seg : a.n;
    double *u = malloc((size_t)(len > 1 ? len : 1) * sizeof *u);
    int ok = u != NULL;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        search(&a, u);
        Py_END_ALLOW_THREADS
    }
    ad_done(&a);
    free(u);
    return ok ? Py_NewRef(Py_None) : PyErr_NoMemory();
}
