/* The nearest level of every value (the twin of ckptcodecs/kmeans.py's nearest_codes): the
   number of midpoints below the value (ties to the lower level, NaN -> 0), counted threshold by
   threshold over blocks for up to 4 levels, else looked up in a table over a uniform grid of
   the midpoint range and corrected by a short climb. */
#include "kmeans.h"

#include <stdlib.h>

#define GRID 4096
#define BLOCK 4096

/* out[i] = the number of thr[0..nthr) below x[i], for nthr <= 3. */
CK_LOOP count_below_f32_loop(const float *restrict x, Py_ssize_t n, const double *thr,
                                      Py_ssize_t nthr, uint8_t *restrict out)
{
    for (Py_ssize_t i0 = 0; i0 < n; i0 += BLOCK) {
        Py_ssize_t i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
        memset(out + i0, 0, (size_t)(i1 - i0));
        for (Py_ssize_t c = 0; c < nthr; c++) {
            double t = thr[c];
            for (Py_ssize_t i = i0; i < i1; i++)
                out[i] += (uint8_t)(t < (double)x[i]);
        }
    }
}
CK_BUILDS(count_below_f32, (const float *restrict x, Py_ssize_t n, const double *thr,
          Py_ssize_t nthr, uint8_t *restrict out),
          (x, n, thr, nthr, out))

CK_LOOP count_below_f64_loop(const double *restrict x, Py_ssize_t n, const double *thr,
                                      Py_ssize_t nthr, uint8_t *restrict out)
{
    for (Py_ssize_t i0 = 0; i0 < n; i0 += BLOCK) {
        Py_ssize_t i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
        memset(out + i0, 0, (size_t)(i1 - i0));
        for (Py_ssize_t c = 0; c < nthr; c++) {
            double t = thr[c];
            for (Py_ssize_t i = i0; i < i1; i++)
                out[i] += (uint8_t)(t < x[i]);
        }
    }
}
CK_BUILDS(count_below_f64, (const double *restrict x, Py_ssize_t n, const double *thr,
          Py_ssize_t nthr, uint8_t *restrict out),
          (x, n, thr, nthr, out))

/* The grid of a segment's nthr >= 1 thresholds: grid[q] = how many lie below t0 + q / g;
   returns g (0 when the range is empty or not finite). */
static double fill_grid(const double *thr, Py_ssize_t nthr, int64_t *grid)
{
    double t0 = thr[0], span = thr[nthr - 1] - t0;
    double g = span > 0.0 ? GRID / span : 0.0;
    Py_ssize_t c = 0;
    for (int q = 0; q <= GRID; q++) {
        double start = g > 0.0 ? t0 + (double)q / g : t0;
        while (c < nthr && thr[c] < start)
            c++;
        grid[q] = c;
    }
    return g;
}

/* The code of v from the grid and a climb (nthr >= 1); grid[-1] is 0 (v just above t0). */
static inline uint8_t grid_code(double v, const double *restrict thr, Py_ssize_t nthr,
                                const int64_t *restrict grid, double g)
{
    double t0 = thr[0];
    if (!(v > t0))  /* also NaN */
        return 0;
    double f = (v - t0) * g;
    f = f < GRID + 1.0 ? f : GRID + 1.0;  /* min(int(f), GRID + 1), also for inf and NaN */
    int64_t code = grid[(int64_t)f - 1];
    while (code < nthr && thr[code] < v)
        code++;
    return (uint8_t)code;
}

CK_LOOP grid_codes_f32_loop(const float *restrict x, Py_ssize_t n,
                                     const double *restrict thr, Py_ssize_t nthr,
                                     const int64_t *restrict grid, double g,
                                     uint8_t *restrict out)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = grid_code((double)x[i], thr, nthr, grid, g);
}
CK_BUILDS(grid_codes_f32, (const float *restrict x, Py_ssize_t n, const double *restrict thr,
          Py_ssize_t nthr, const int64_t *restrict grid, double g, uint8_t *restrict out),
          (x, n, thr, nthr, grid, g, out))

CK_LOOP grid_codes_f64_loop(const double *restrict x, Py_ssize_t n,
                                     const double *restrict thr, Py_ssize_t nthr,
                                     const int64_t *restrict grid, double g,
                                     uint8_t *restrict out)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = grid_code(x[i], thr, nthr, grid, g);
}
CK_BUILDS(grid_codes_f64, (const double *restrict x, Py_ssize_t n, const double *restrict thr,
          Py_ssize_t nthr, const int64_t *restrict grid, double g, uint8_t *restrict out),
          (x, n, thr, nthr, grid, g, out))

typedef struct {
    const void *x;
    int x64, book64;
    const void *book;
    Py_ssize_t n, seg, nseg, k;
    uint8_t *out;
} codes_args;

static void codes_segment(const codes_args *a, Py_ssize_t a0, Py_ssize_t b0, const double *thr,
                          int64_t *grid)
{
    Py_ssize_t nthr = a->k - 1;
    if (a->k <= 4) {
        if (a->x64)
            count_below_f64((const double *)a->x + a0, b0 - a0, thr, nthr, a->out + a0);
        else
            count_below_f32((const float *)a->x + a0, b0 - a0, thr, nthr, a->out + a0);
        return;
    }
    double g = fill_grid(thr, nthr, grid);
    if (a->x64)
        grid_codes_f64((const double *)a->x + a0, b0 - a0, thr, nthr, grid, g, a->out + a0);
    else
        grid_codes_f32((const float *)a->x + a0, b0 - a0, thr, nthr, grid, g, a->out + a0);
}

/* 0 when memory runs out. */
static int nearest_codes(const codes_args *a)
{
    double *thr = malloc((size_t)(a->k > 1 ? a->k - 1 : 1) * sizeof(double));
    int64_t *grid = malloc((GRID + 2) * sizeof(int64_t));  /* grid[-1] = 0, then the grid */
    if (thr == NULL || grid == NULL) {
        free(thr);
        free(grid);
        return 0;
    }
    grid[0] = 0;
    for (Py_ssize_t s = 0; s < a->nseg; s++) {
        for (Py_ssize_t c = 0; c + 1 < a->k; c++) {
            Py_ssize_t j = s * a->k + c;
            double lo = a->book64 ? ((const double *)a->book)[j] : ((const float *)a->book)[j];
            double hi = a->book64 ? ((const double *)a->book)[j + 1]
                                  : ((const float *)a->book)[j + 1];
            thr[c] = 0.5 * (lo + hi);
        }
        if (a->n == 0 || s > (a->n - 1) / a->seg)
            continue;
        Py_ssize_t a0 = s * a->seg, b0 = a->seg > a->n - a0 ? a->n : a0 + a->seg;
        codes_segment(a, a0, b0, thr, grid + 1);
    }
    free(thr);
    free(grid);
    return 1;
}

/* nearest_codes(x, seg, codebooks, out) */
PyObject *ck_kmeans_nearest_codes(PyObject *self, PyObject *args)
{
    const char *name = "kmeans nearest_codes";
    const ck_want want[3] = {CK_IN(name, CK_FLOAT_KM), CK_IN(name, CK_FLOAT_KM),
                             CK_OUT(name, 1)};
    PyObject *obj[3];  /* x, codebooks, out */
    codes_args a;
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OnOO", &obj[0], &a.seg, &obj[1], &obj[2]))
        return NULL;
    if (a.seg < 1)
        return PyErr_Format(PyExc_ValueError, "%s: seg (%zd) must be >= 1", name, a.seg);
    if (ck_buffers(obj, want, 3, v) < 0)
        return NULL;
    a.x = v[0].buf;
    a.x64 = v[0].itemsize == 8;
    a.n = ck_items(&v[0]);
    a.book = v[1].buf;
    a.book64 = v[1].itemsize == 8;
    a.out = v[2].buf;
    if (v[1].ndim != 2)
        PyErr_Format(PyExc_ValueError, "%s: codebooks must be 2-D (segments, levels)", name);
    else if (ck_items(&v[2]) < a.n)
        PyErr_Format(PyExc_ValueError, "%s: %zd values into %zd codes", name, a.n,
                     ck_items(&v[2]));
    else if (!ck_overlap(&v[0], &v[2], name) && !ck_overlap(&v[1], &v[2], name)) {
        int ok;
        a.nseg = v[1].shape[0];
        a.k = v[1].shape[1];
        Py_BEGIN_ALLOW_THREADS
        ok = nearest_codes(&a);
        Py_END_ALLOW_THREADS
        if (!ok)
            PyErr_NoMemory();
    }
    return ck_none(v, 3);
}
