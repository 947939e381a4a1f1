/* Quantization's C kernels (families "quant", "select", "adaptive"): what their files share --
   float buffers of either width and the bounds of segment s. */
#ifndef CKPTCODECS_QUANT_H
#define CKPTCODECS_QUANT_H

#include "native.h"

/* Item i of a float32/float64 view, as a double (exact), and a double stored into one
   (rounded to nearest for float32, as numpy's and numba's casts). */
static inline double qk_get(const Py_buffer *v, Py_ssize_t i)
{
    return v->itemsize == 4 ? (double)((const float *)v->buf)[i] : ((const double *)v->buf)[i];
}
static inline void qk_set(Py_buffer *v, Py_ssize_t i, double x)
{
    if (v->itemsize == 4)
        ((float *)v->buf)[i] = (float)x;
    else
        ((double *)v->buf)[i] = x;
}

/* Segment s of `seg` items of an array of n: [*a0, *b0), empty (n, n) past the end. */
static inline void qk_segment(Py_ssize_t s, Py_ssize_t seg, Py_ssize_t n, Py_ssize_t *a0,
                              Py_ssize_t *b0)
{
    if (seg <= 0 || n == 0 || s > (n - 1) / seg) {
        *a0 = *b0 = n;
        return;
    }
    *a0 = s * seg;
    *b0 = *a0 + (seg < n - *a0 ? seg : n - *a0);
}

/* 1 (after a ValueError) when a mask is neither empty nor of at least n items. */
int qk_bad_mask(const Py_buffer *mask, Py_ssize_t n, const char *name);

/* f16 rounding of v[0..n) into out (may be v): direction -1 down, 0 nearest-even, +1 up. */
void qk_f16_round(const double *v, Py_ssize_t n, Py_ssize_t direction, double *out);

/* QK_AVX2 before a function: also compiled for AVX2 (x86-64 with GCC or clang), run where
   the CPU path (ck_set_simd, CKPTCODECS_SIMD) is "avx2" or above; qk_avx2() says whether. Only
   the vector width differs: no FMA, no reordered sums, the same bytes. */
#if defined(__x86_64__) && defined(__GNUC__)
#define QK_HAVE_AVX2 1
#define QK_AVX2 __attribute__((target("avx2")))
#else
#define QK_HAVE_AVX2 0
#define QK_AVX2
#endif
static inline int qk_avx2(void) { return QK_HAVE_AVX2 && ck_vector() >= CK_AVX2; }

/* quant.c's per-segment steps, unchecked (mask NULL or of m items): the range of x[0..m) by
   numba's comparisons ((0, 0) when nothing counts), its largest magnitude, and the uniform
   codes of the segments of seg items (seg_minmax, seg_absmax and uniform_codes). */
void qk_range_f32(const float *restrict x, Py_ssize_t m, const uint8_t *restrict mask,
                  double *lo, double *hi);
double qk_absmax_f32(const float *restrict x, Py_ssize_t m, const uint8_t *restrict mask);
void qk_codes_f32(const float *restrict x, Py_ssize_t n, Py_ssize_t seg, const float *zero,
                  const float *inv, Py_ssize_t nseg, float fq, float half, float fzero,
                  uint8_t *restrict out);
/* The same three built for AVX2 (quant_chunk.c runs them where the CPU path is avx2 or above). */
void qk_range_f32_avx2(const float *restrict x, Py_ssize_t m, const uint8_t *restrict mask,
                       double *lo, double *hi);
double qk_absmax_f32_avx2(const float *restrict x, Py_ssize_t m, const uint8_t *restrict mask);
void qk_codes_f32_avx2(const float *restrict x, Py_ssize_t n, Py_ssize_t seg, const float *zero,
                       const float *inv, Py_ssize_t nseg, float fq, float half, float fzero,
                       uint8_t *restrict out);

/* The kernels kept in the family's other files, listed in quant.c's table. */
PyObject *ck_quant_dequant_uniform(PyObject *self, PyObject *args);
PyObject *ck_quant_dequant_codebook(PyObject *self, PyObject *args);
PyObject *ck_quant_f16_round(PyObject *self, PyObject *args);
PyObject *ck_quant_uniform_params_f16(PyObject *self, PyObject *args);
PyObject *ck_quant_encode_uniform(PyObject *self, PyObject *args);
PyObject *ck_quant_encode_adaptive(PyObject *self, PyObject *args);

#endif
