/* The k-means kernels' shared pieces (kmeans.c, kmeans_fit.c, kmeans_codes.c): the fit of one
   segment's levels from its buckets, and the scratch memory it works in. */
#ifndef CKPTCODECS_KMEANS_H
#define CKPTCODECS_KMEANS_H

#include "native.h"

/* log-spaced buckets: sign, exponent and 7 mantissa bits of the ordered float32 bits */
#define CK_KM_MANTISSA_BITS 7
#define CK_KM_NKEYS (1 << (9 + CK_KM_MANTISSA_BITS))

/* Room for one segment of up to `buckets` buckets and `k` levels. */
typedef struct {
    Py_ssize_t buckets, k;
    double *vals, *w, *d2, *prefix, *sw, *swx, *centers;
    int64_t *assign;
} ck_kmeans_scratch;

/* 0 when memory runs out (nothing held then). */
int ck_kmeans_alloc(ck_kmeans_scratch *s, Py_ssize_t buckets, Py_ssize_t k);
void ck_kmeans_free(ck_kmeans_scratch *s);

/* The twin of kmeans.py's _fit_segment: the k levels of one segment from its nt non-empty
   buckets (ascending keys; nt <= s->buckets) into out[0..k); a segment without buckets zeroes
   out[0..row). */
void ck_fit_segment(const int64_t *cnt, const double *sums, Py_ssize_t nt, Py_ssize_t k,
                    double lam, uint64_t seed, double *out, Py_ssize_t row,
                    ck_kmeans_scratch *s);

/* kmeans_codes.c's kernel, listed in kmeans_fit.c's table. */
PyObject *ck_kmeans_nearest_codes(PyObject *self, PyObject *args);

#endif
