/* The k-means fits of all segments in one call (the twins of ckptcodecs/kmeans.py's
   fit_codebooks and fit_from_buckets): values counted into log-spaced buckets, or buckets
   counted elsewhere, then each segment's levels (kmeans.c). */
#include "kmeans.h"

#include <stdlib.h>

/* The bucket of the float32 bits: sign, exponent and 7 mantissa bits, in value order. */
static inline int64_t bucket_key(uint32_t bits)
{
    uint32_t o = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return (int64_t)(o >> (23 - CK_KM_MANTISSA_BITS));
}

static int cmp_key(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The touched keys in ascending order: sorted, or read off the counts when many. */
static void sort_keys(int64_t *touched, Py_ssize_t nt, const int64_t *cnt)
{
    if (nt < 4096) {
        qsort(touched, (size_t)nt, sizeof *touched, cmp_key);
        return;
    }
    Py_ssize_t j = 0;
    for (int64_t key = 0; key < CK_KM_NKEYS; key++)
        if (cnt[key])
            touched[j++] = key;
}

typedef struct {
    const void *x;
    int f64;
    const uint32_t *bits;
    const uint8_t *mask;  /* NULL: none */
    Py_ssize_t n, seg, nseg, k, row;
    double lam;
    uint64_t seed;
    double *out;
} fit_args;

/* The buckets of values [a0, b0) into keys/kc/ks (cnt and sums left all zero); their number. */
static Py_ssize_t count_buckets(const fit_args *a, Py_ssize_t a0, Py_ssize_t b0, int64_t *cnt,
                                double *sums, int64_t *keys, int64_t *kc, double *ks)
{
    Py_ssize_t nt = 0;
    for (Py_ssize_t i = a0; i < b0; i++) {
        if (a->mask && a->mask[i])
            continue;
        double v = a->f64 ? ((const double *)a->x)[i] : (double)((const float *)a->x)[i];
        int64_t key = bucket_key(a->bits[i]);
        if (cnt[key] == 0)
            keys[nt++] = key;
        cnt[key] += 1;
        sums[key] += v;
    }
    sort_keys(keys, nt, cnt);
    for (Py_ssize_t i = 0; i < nt; i++) {
        kc[i] = cnt[keys[i]];
        ks[i] = sums[keys[i]];
        cnt[keys[i]] = 0;
        sums[keys[i]] = 0.0;
    }
    return nt;
}

/* All segments; 0 when memory runs out. */
static int fit_codebooks(const fit_args *a)
{
    Py_ssize_t room = a->n < CK_KM_NKEYS ? a->n : CK_KM_NKEYS;
    size_t r = (size_t)(room > 0 ? room : 1);
    int64_t *cnt = calloc(CK_KM_NKEYS, sizeof(int64_t));
    double *sums = calloc(CK_KM_NKEYS, sizeof(double));
    int64_t *keys = malloc(r * sizeof(int64_t)), *kc = malloc(r * sizeof(int64_t));
    double *ks = malloc(r * sizeof(double));
    ck_kmeans_scratch s;
    int ok = cnt && sums && keys && kc && ks && ck_kmeans_alloc(&s, room, a->k);
    for (Py_ssize_t g = 0; ok && g < a->nseg; g++) {
        Py_ssize_t nt = 0;
        if (a->n > 0 && g <= (a->n - 1) / a->seg) {
            Py_ssize_t a0 = g * a->seg;
            Py_ssize_t b0 = a->seg > a->n - a0 ? a->n : a0 + a->seg;
            nt = count_buckets(a, a0, b0, cnt, sums, keys, kc, ks);
        }
        ck_fit_segment(kc, ks, nt, a->k, a->lam, a->seed + (uint64_t)g, a->out + g * a->row,
                       a->row, &s);
    }
    if (ok)
        ck_kmeans_free(&s);
    free(cnt);
    free(sums);
    free(keys);
    free(kc);
    free(ks);
    return ok;
}

/* A 2-D float64 output of at least k columns: its rows and columns, or 0 with a ValueError. */
static int rows_of(const Py_buffer *out, Py_ssize_t k, const char *name, Py_ssize_t *nseg,
                   Py_ssize_t *row)
{
    if (out->ndim != 2 || out->shape[1] < k) {
        PyErr_Format(PyExc_ValueError, "%s: out must be 2-D with at least k=%zd columns", name,
                     k);
        return 0;
    }
    *nseg = out->shape[0];
    *row = out->shape[1];
    return 1;
}

/* fit_codebooks(x, xbits, seg, mask, k, lam, seed, out) */
static PyObject *ck_kmeans_fit_codebooks(PyObject *self, PyObject *args)
{
    const char *name = "kmeans fit_codebooks";
    const ck_want want[4] = {CK_IN(name, CK_FLOAT_KM), CK_IN(name, 4), CK_IN(name, 1),
                             CK_OUT(name, CK_FLOAT_KM)};
    PyObject *obj[4];  /* x, xbits, mask, out */
    long long seed;
    fit_args a;
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OOnOndLO", &obj[0], &obj[1], &a.seg, &obj[2], &a.k, &a.lam,
                          &seed, &obj[3]))
        return NULL;
    if (a.seg < 1 || a.k < 1)
        return PyErr_Format(PyExc_ValueError, "%s: seg (%zd) and k (%zd) must be >= 1", name,
                            a.seg, a.k);
    if (ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    a.x = v[0].buf;
    a.f64 = v[0].itemsize == 8;
    a.n = ck_items(&v[0]);
    a.bits = v[1].buf;
    a.mask = v[2].len ? v[2].buf : NULL;
    a.seed = (uint64_t)seed;
    a.out = v[3].buf;
    if (v[3].itemsize != 8)
        PyErr_Format(PyExc_ValueError, "%s: out must be float64", name);
    else if (ck_items(&v[1]) < a.n || (v[2].len && v[2].len < a.n))
        PyErr_Format(PyExc_ValueError, "%s: %zd values, %zd bit patterns, a mask of %zd", name,
                     a.n, ck_items(&v[1]), v[2].len);
    else if (rows_of(&v[3], a.k, name, &a.nseg, &a.row)
             && !ck_overlap(&v[0], &v[3], name) && !ck_overlap(&v[1], &v[3], name)
             && !ck_overlap(&v[2], &v[3], name)) {
        int ok;
        Py_BEGIN_ALLOW_THREADS
        ok = fit_codebooks(&a);
        Py_END_ALLOW_THREADS
        if (!ok)
            PyErr_NoMemory();
    }
    return ck_none(v, 4);
}

/* The most buckets of a segment, or -1 with a ValueError when offsets do not ascend within
   0..nb. */
static Py_ssize_t most_buckets(const int64_t *offsets, Py_ssize_t nseg, Py_ssize_t nb,
                               const char *name)
{
    Py_ssize_t most = 0;
    for (Py_ssize_t g = 0; g < nseg; g++) {
        int64_t a = offsets[g], b = offsets[g + 1];
        if (a < 0 || b < a || b > nb) {
            PyErr_Format(PyExc_ValueError, "%s: offsets must ascend within 0..%zd", name, nb);
            return -1;
        }
        if (b - a > most)
            most = (Py_ssize_t)(b - a);
    }
    return most;
}

static int fit_buckets(const int64_t *counts, const double *sums, const int64_t *offsets,
                       const fit_args *a, Py_ssize_t most)
{
    ck_kmeans_scratch s;
    if (!ck_kmeans_alloc(&s, most, a->k))
        return 0;
    for (Py_ssize_t g = 0; g < a->nseg; g++) {
        int64_t b0 = offsets[g], b1 = offsets[g + 1];
        ck_fit_segment(counts + b0, sums + b0, (Py_ssize_t)(b1 - b0), a->k, a->lam,
                       a->seed + (uint64_t)g, a->out + g * a->row, a->row, &s);
    }
    ck_kmeans_free(&s);
    return 1;
}

/* fit_from_buckets(counts, sums, offsets, k, lam, seed, out) */
static PyObject *ck_kmeans_fit_from_buckets(PyObject *self, PyObject *args)
{
    const char *name = "kmeans fit_from_buckets";
    const ck_want want[4] = {CK_IN(name, 8), CK_IN(name, CK_FLOAT_KM), CK_IN(name, 8),
                             CK_OUT(name, CK_FLOAT_KM)};
    PyObject *obj[4];  /* counts, sums, offsets, out */
    long long seed;
    fit_args a;
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OOOndLO", &obj[0], &obj[1], &obj[2], &a.k, &a.lam, &seed,
                          &obj[3]))
        return NULL;
    if (a.k < 1)
        return PyErr_Format(PyExc_ValueError, "%s: k (%zd) must be >= 1", name, a.k);
    if (ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    a.seed = (uint64_t)seed;
    a.out = v[3].buf;
    Py_ssize_t nb = ck_items(&v[0]), most = -1;
    if (v[1].itemsize != 8 || v[3].itemsize != 8)
        PyErr_Format(PyExc_ValueError, "%s: sums and out must be float64", name);
    else if (ck_items(&v[1]) != nb)
        PyErr_Format(PyExc_ValueError, "%s: %zd counts and %zd sums", name, nb,
                     ck_items(&v[1]));
    else if (rows_of(&v[3], a.k, name, &a.nseg, &a.row) && ck_items(&v[2]) != a.nseg + 1)
        PyErr_Format(PyExc_ValueError, "%s: %zd offsets for %zd segments", name,
                     ck_items(&v[2]), a.nseg);
    else if (!PyErr_Occurred() && !ck_overlap(&v[0], &v[3], name)
             && !ck_overlap(&v[1], &v[3], name) && !ck_overlap(&v[2], &v[3], name)
             && (most = most_buckets(v[2].buf, a.nseg, nb, name)) >= 0) {
        int ok;
        Py_BEGIN_ALLOW_THREADS
        ok = fit_buckets(v[0].buf, v[1].buf, v[2].buf, &a, most);
        Py_END_ALLOW_THREADS
        if (!ok)
            PyErr_NoMemory();
    }
    return ck_none(v, 4);
}

PyMethodDef ck_kmeans_methods[] = {
    {"kmeans_fit_codebooks", ck_kmeans_fit_codebooks, METH_VARARGS,
     "fit_codebooks(x, xbits, seg, mask, k, lam, seed, out): k levels per segment."},
    {"kmeans_fit_from_buckets", ck_kmeans_fit_from_buckets, METH_VARARGS,
     "fit_from_buckets(counts, sums, offsets, k, lam, seed, out): the fit from buckets."},
    {"kmeans_nearest_codes", ck_kmeans_nearest_codes, METH_VARARGS,
     "nearest_codes(x, seg, codebooks, out): the nearest level of each value."},
    {NULL, NULL, 0, NULL},
};
