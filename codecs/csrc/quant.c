/* Quantize's per-segment kernels (the twins of ckptcodecs/_qkernels.py): segment ranges
   (seg_minmax, seg_absmax) and uniform codes; the family's helpers and method table. The
   dequantizers are in quant_dequant.c, the float16 parameters in quant_f16.c. Reductions keep
   numba's results exactly: min/max are order-free but for the sign of a zero, fixed after. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include "quant.h"

#define LANES 8
/* Kernels kept out of line: inlined into uniform_all's loop, gcc lost their restrict pointers
   and did not vectorise them (1.8x slower). */
#define QK_NOINLINE __attribute__((noinline))

int qk_bad_mask(const Py_buffer *mask, Py_ssize_t n, const char *name)
{
    if (mask->len == 0 || mask->len >= n)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: a mask of %zd bytes for %zd values (0 or all)", name,
                 mask->len, n);
    return 1;
}

/* min/max of the unmasked, non-NaN x[0..m) as numba's sequential `v < mn` / `v > mx` find
   them, in LANES lanes (a masked value is +-inf: it never wins); (0, 0) when there is none.
   A zero result takes the sign of the first zero, as the sequential loop does. ABSMAX: the
   largest |x| from 0.0. */
#define RANGE_KERNELS(T, SUFFIX, ATTR)                                                        \
    static T first_zero_##SUFFIX(const T *x, Py_ssize_t m, const uint8_t *mask)               \
    {                                                                                         \
        for (Py_ssize_t i = 0; i < m; i++)                                                    \
            if (x[i] == 0 && !(mask && mask[i]))                                              \
                return x[i];                                                                  \
        return 0;                                                                             \
    }                                                                                         \
    QK_NOINLINE ATTR void qk_range_##SUFFIX(const T *restrict x, Py_ssize_t m,                \
                               const uint8_t *restrict mask, double *lo, double *hi)          \
    {                                                                                         \
        T mn[LANES], mx[LANES];                                                               \
        for (int l = 0; l < LANES; l++) {                                                     \
            mn[l] = INFINITY;                                                                 \
            mx[l] = -INFINITY;                                                                \
        }                                                                                     \
        Py_ssize_t i = 0;                                                                     \
        if (mask) {                                                                           \
            for (; i + LANES <= m; i += LANES)                                                \
                for (int l = 0; l < LANES; l++) {                                             \
                    T a = mask[i + l] ? INFINITY : x[i + l];                                  \
                    T b = mask[i + l] ? -INFINITY : x[i + l];                                 \
                    mn[l] = a < mn[l] ? a : mn[l];                                            \
                    mx[l] = b > mx[l] ? b : mx[l];                                            \
                }                                                                             \
            for (; i < m; i++)                                                                \
                if (!mask[i]) {                                                               \
                    mn[0] = x[i] < mn[0] ? x[i] : mn[0];                                      \
                    mx[0] = x[i] > mx[0] ? x[i] : mx[0];                                      \
                }                                                                             \
        } else {                                                                              \
            for (; i + LANES <= m; i += LANES)                                                \
                for (int l = 0; l < LANES; l++) {                                             \
                    mn[l] = x[i + l] < mn[l] ? x[i + l] : mn[l];                              \
                    mx[l] = x[i + l] > mx[l] ? x[i + l] : mx[l];                              \
                }                                                                             \
            for (; i < m; i++) {                                                              \
                mn[0] = x[i] < mn[0] ? x[i] : mn[0];                                          \
                mx[0] = x[i] > mx[0] ? x[i] : mx[0];                                          \
            }                                                                                 \
        }                                                                                     \
        T a = mn[0], b = mx[0];                                                               \
        for (int l = 1; l < LANES; l++) {                                                     \
            a = mn[l] < a ? mn[l] : a;                                                        \
            b = mx[l] > b ? mx[l] : b;                                                        \
        }                                                                                     \
        if (a > b)                                                                            \
            a = b = 0;                                                                        \
        else {                                                                                \
            if (a == 0)                                                                       \
                a = first_zero_##SUFFIX(x, m, mask);                                          \
            if (b == 0)                                                                       \
                b = first_zero_##SUFFIX(x, m, mask);                                          \
        }                                                                                     \
        *lo = a;                                                                              \
        *hi = b;                                                                              \
    }                                                                                         \
    ATTR double qk_absmax_##SUFFIX(const T *restrict x, Py_ssize_t m,                         \
                                  const uint8_t *restrict mask)                               \
    {                                                                                         \
        T mx[LANES] = {0};                                                                    \
        Py_ssize_t i = 0;                                                                     \
        for (; i + LANES <= m; i += LANES)                                                    \
            for (int l = 0; l < LANES; l++) {                                                 \
                T a = (mask && mask[i + l]) ? 0 : (T)fabs(x[i + l]);                          \
                mx[l] = a > mx[l] ? a : mx[l];                                                \
            }                                                                                 \
        for (; i < m; i++) {                                                                  \
            T a = (mask && mask[i]) ? 0 : (T)fabs(x[i]);                                      \
            mx[0] = a > mx[0] ? a : mx[0];                                                    \
        }                                                                                     \
        T b = mx[0];                                                                          \
        for (int l = 1; l < LANES; l++)                                                       \
            b = mx[l] > b ? mx[l] : b;                                                        \
        return b;                                                                             \
    }

RANGE_KERNELS(float, f32, )
RANGE_KERNELS(double, f64, )
/* for quant_chunk.c's one call: the same loops built for AVX2 (the same bits) */
RANGE_KERNELS(float, f32_avx2, CK_TARGET_AVX2)

/* Each segment's range (lo and hi given) or largest magnitude (lo NULL, into hi). */
static void seg_ranges(const Py_buffer *x, Py_ssize_t seg, const uint8_t *mask, Py_buffer *lo,
                       Py_buffer *hi, Py_ssize_t nseg)
{
    Py_ssize_t n = ck_items(x), a0, b0;
    for (Py_ssize_t s = 0; s < nseg; s++) {
        qk_segment(s, seg, n, &a0, &b0);
        const uint8_t *m = mask ? mask + a0 : NULL;
        double mn, mx;
        if (x->itemsize == 4 && lo)
            qk_range_f32((const float *)x->buf + a0, b0 - a0, m, &mn, &mx);
        else if (lo)
            qk_range_f64((const double *)x->buf + a0, b0 - a0, m, &mn, &mx);
        else if (x->itemsize == 4)
            mx = qk_absmax_f32((const float *)x->buf + a0, b0 - a0, m);
        else
            mx = qk_absmax_f64((const double *)x->buf + a0, b0 - a0, m);
        if (lo)
            qk_set(lo, s, mn);
        qk_set(hi, s, mx);
    }
}

/* seg_minmax(x, seg, mask, lo, hi) / seg_absmax(x, seg, mask, out): `absmax` picks. */
static PyObject *ranges(PyObject *args, int absmax)
{
    const char *name = absmax ? "seg_absmax" : "seg_minmax";
    const ck_want want[4] = {CK_IN(name, CK_FLOAT), CK_IN(name, 1), CK_OUT(name, CK_FLOAT),
                             CK_OUT(name, CK_FLOAT)};
    PyObject *obj[4];  /* x, mask, hi, lo */
    Py_ssize_t seg;
    Py_buffer v[4];
    int nbuf = absmax ? 3 : 4;
    if (absmax ? !PyArg_ParseTuple(args, "OnOO", &obj[0], &seg, &obj[1], &obj[2])
               : !PyArg_ParseTuple(args, "OnOOO", &obj[0], &seg, &obj[1], &obj[3], &obj[2]))
        return NULL;
    if (ck_buffers(obj, want, nbuf, v) < 0)
        return NULL;
    Py_buffer *lo = absmax ? NULL : &v[3];
    Py_ssize_t n = ck_items(&v[0]), nseg = ck_items(&v[2]);
    if (seg < 0)
        PyErr_Format(PyExc_ValueError, "%s: a segment length of %zd", name, seg);
    else if (lo && ck_items(lo) != nseg)
        PyErr_Format(PyExc_ValueError, "%s: %zd lows for %zd highs", name, ck_items(lo), nseg);
    else if (!qk_bad_mask(&v[1], n, name) && !ck_overlap(&v[0], &v[2], name)
             && !(lo && (ck_overlap(&v[0], lo, name) || ck_overlap(lo, &v[2], name)))) {
        const uint8_t *mask = v[1].len ? v[1].buf : NULL;
        CK_BEGIN_NOGIL(v[0].len)
        seg_ranges(&v[0], seg, mask, lo, &v[2], nseg);
        CK_END_NOGIL
    }
    return ck_none(v, nbuf);
}

static PyObject *ck_quant_seg_minmax(PyObject *self, PyObject *args) { return ranges(args, 0); }

static PyObject *ck_quant_seg_absmax(PyObject *self, PyObject *args) { return ranges(args, 1); }

/* out[i] = clip((x - zero) * inv + half, fzero, fq) truncated; NaN -> 0, in x's own float
   type (numba's: the scalars are of the working type). */
#define CODES_KERNEL(T, SUFFIX, ATTR)                                                         \
    QK_NOINLINE ATTR void qk_codes_##SUFFIX(const T *restrict x, Py_ssize_t n, Py_ssize_t seg, \
                               const T *zero, const T *inv, Py_ssize_t nseg, T fq, T half,    \
                               T fzero, uint8_t *restrict out)                                \
    {                                                                                         \
        Py_ssize_t a0, b0;                                                                    \
        for (Py_ssize_t s = 0; s < nseg; s++) {                                               \
            qk_segment(s, seg, n, &a0, &b0);                                                  \
            T z = zero[s], iv = inv[s];                                                       \
            for (Py_ssize_t i = a0; i < b0; i++) {                                            \
                T t = (x[i] - z) * iv + half;                                                 \
                t = fzero > t ? fzero : t;                                                    \
                t = fq < t ? fq : t;                                                          \
                t = t == t ? t : 0;                                                           \
                out[i] = (uint8_t)(int32_t)t;                                                 \
            }                                                                                 \
        }                                                                                     \
    }

CODES_KERNEL(float, f32, )
CODES_KERNEL(double, f64, )
CODES_KERNEL(float, f32_avx2, CK_TARGET_AVX2)

static PyObject *ck_quant_uniform_codes(PyObject *self, PyObject *args)
{
    const char *name = "uniform_codes";
    const ck_want want[4] = {CK_IN(name, CK_FLOAT), CK_IN(name, CK_FLOAT),
                             CK_IN(name, CK_FLOAT), CK_OUT(name, 1)};
    PyObject *obj[4];  /* x, zero, inv, out */
    Py_ssize_t seg;
    double fq, half, fzero;
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OnOOdddO", &obj[0], &seg, &obj[1], &obj[2], &fq, &half,
                          &fzero, &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]), nseg = ck_items(&v[1]);
    if (v[1].itemsize != v[0].itemsize || v[2].itemsize != v[0].itemsize)
        PyErr_Format(PyExc_ValueError, "%s: zero points and inverse scales of x's float type",
                     name);
    else if (seg < 0 || ck_items(&v[2]) < nseg || v[3].len < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd values, segments of %zd, %zd zero points, %zd "
                     "inverse scales, %zd codes", name, n, seg, nseg, ck_items(&v[2]), v[3].len);
    else if (!(fzero >= 0 && fzero <= fq && fq <= 255))
        ck_value_error("%s: codes from %g to %g (0 <= from <= to <= 255)", name, fzero, fq);
    else if (!ck_overlap(&v[0], &v[3], name) && !ck_overlap(&v[1], &v[3], name)
             && !ck_overlap(&v[2], &v[3], name)) {
        CK_BEGIN_NOGIL(v[0].len)
        if (v[0].itemsize == 4)
            qk_codes_f32(v[0].buf, n, seg, v[1].buf, v[2].buf, nseg, (float)fq, (float)half,
                      (float)fzero, v[3].buf);
        else
            qk_codes_f64(v[0].buf, n, seg, v[1].buf, v[2].buf, nseg, fq, half, fzero, v[3].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 4);
}

/* quantize's uniform path in one call (the twin of quantization._uniform_steps): each
   segment's range (or largest magnitude), its zero point and scale as numpy computes them
   (float64 arithmetic, then x's float type), the inverse scales in x's type, then the codes --
   one release of the GIL where the steps took a dozen. 0, or 1 where an inverse scale is not
   finite (a subnormal scale: the caller's float64 steps), the codes then untouched. */
#define UNIFORM_KERNEL(T, SUFFIX, TMAX)                                                       \
    static int uniform_##SUFFIX(const T *x, Py_ssize_t n, Py_ssize_t seg,                     \
                                const uint8_t *mask, int symmetric, Py_ssize_t nq, T *zero,   \
                                T *scale, T *inv, Py_ssize_t nseg, uint8_t *codes)            \
    {                                                                                         \
        Py_ssize_t a0, b0;                                                                    \
        for (Py_ssize_t s = 0; s < nseg; s++) {                                               \
            qk_segment(s, seg, n, &a0, &b0);                                                  \
            const uint8_t *m = mask ? mask + a0 : NULL;                                       \
            double lo, hi;                                                                    \
            if (symmetric) {                                                                  \
                hi = qk_absmax_##SUFFIX(x + a0, b0 - a0, m);                                  \
                lo = -hi;                                                                     \
            } else                                                                            \
                qk_range_##SUFFIX(x + a0, b0 - a0, m, &lo, &hi);                              \
            if (nq == 1) {                                                                    \
                zero[s] = (T)(lo / 2 + hi / 2);                                               \
                scale[s] = 0;                                                                 \
            } else {                                                                          \
                zero[s] = (T)lo;                                                              \
                T sc = (T)((hi - (double)zero[s]) / (double)(nq - 1));                        \
                scale[s] = isfinite(sc) ? sc : TMAX;                                          \
            }                                                                                 \
            inv[s] = scale[s] > 0 ? (T)1 / scale[s] : 0;                                      \
            if (!isfinite(inv[s]))                                                            \
                return 1;                                                                     \
        }                                                                                     \
        qk_codes_##SUFFIX(x, n, seg, zero, inv, nseg, (T)(nq - 1), (T)0.5, (T)0, codes);      \
        return 0;                                                                             \
    }

UNIFORM_KERNEL(float, f32, FLT_MAX)
UNIFORM_KERNEL(double, f64, DBL_MAX)

/* uniform_all(x, seg, mask, nq, symmetric, zero, scale, codes) -> 0 or 1 (see above). */
static PyObject *ck_quant_uniform_all(PyObject *self, PyObject *args)
{
    const char *name = "uniform_all";
    const ck_want want[5] = {CK_IN(name, CK_FLOAT), CK_IN(name, 1), CK_OUT(name, CK_FLOAT),
                             CK_OUT(name, CK_FLOAT), CK_OUT(name, 1)};
    PyObject *obj[5];  /* x, mask, zero, scale, codes */
    Py_ssize_t seg, nq;
    int symmetric, status = 0;
    Py_buffer v[5];
    if (!PyArg_ParseTuple(args, "OnOnpOOO", &obj[0], &seg, &obj[1], &nq, &symmetric, &obj[2],
                          &obj[3], &obj[4])
        || ck_buffers(obj, want, 5, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]), nseg = ck_items(&v[2]);
    void *inv = NULL;
    if (v[2].itemsize != v[0].itemsize || v[3].itemsize != v[0].itemsize)
        PyErr_Format(PyExc_ValueError, "%s: zero points and scales of x's float type", name);
    else if (seg < 0 || nq < 1 || nq > 256 || ck_items(&v[3]) != nseg || v[4].len < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd values, segments of %zd, %zd levels, %zd zero "
                     "points, %zd scales, %zd codes", name, n, seg, nq, nseg, ck_items(&v[3]),
                     v[4].len);
    else if (!qk_bad_mask(&v[1], n, name) && !ck_overlap(&v[0], &v[2], name)
             && !ck_overlap(&v[0], &v[3], name) && !ck_overlap(&v[2], &v[3], name)
             && !ck_overlap(&v[0], &v[4], name) && !ck_overlap(&v[2], &v[4], name)
             && !ck_overlap(&v[3], &v[4], name)) {
        inv = malloc((size_t)(nseg ? nseg : 1) * (size_t)v[0].itemsize);
        if (inv == NULL)
            PyErr_NoMemory();
        else {
            const uint8_t *mask = v[1].len ? v[1].buf : NULL;
            CK_BEGIN_NOGIL(v[0].len)
            if (v[0].itemsize == 4)
                status = uniform_f32(v[0].buf, n, seg, mask, symmetric, nq, v[2].buf, v[3].buf,
                                     inv, nseg, v[4].buf);
            else
                status = uniform_f64(v[0].buf, n, seg, mask, symmetric, nq, v[2].buf, v[3].buf,
                                     inv, nseg, v[4].buf);
            CK_END_NOGIL
            free(inv);
        }
    }
    if (ck_done(v, 5) < 0)
        return NULL;
    return PyLong_FromLong(status);
}

PyMethodDef ck_quant_methods[] = {
    {"quant_seg_minmax", ck_quant_seg_minmax, METH_VARARGS,
     "seg_minmax(x, seg, mask, lo, hi): each segment's min and max of the unmasked values."},
    {"quant_seg_absmax", ck_quant_seg_absmax, METH_VARARGS,
     "seg_absmax(x, seg, mask, out): each segment's largest unmasked magnitude."},
    {"quant_uniform_all", ck_quant_uniform_all, METH_VARARGS,
     "uniform_all(x, seg, mask, nq, symmetric, zero, scale, codes) -> 0, or 1 (subnormal "
     "scale: nothing coded): quantize's uniform path in one call."},
    {"quant_encode_uniform", ck_quant_encode_uniform, METH_VARARGS,
     "encode_uniform(x, seg, bits, symmetric, entropy, min_saving) -> bytes, or None: a uniform "
     "Quantize chunk (RLEHuffman coded with entropy) in one call (quant_chunk.c)."},
    {"quant_encode_adaptive", ck_quant_encode_adaptive, METH_VARARGS,
     "encode_adaptive(x, seg, bits, num_bins, ratio, entropy, min_saving, dtype) -> bytes, or "
     "None: an adaptive-asymmetric Quantize chunk in one call, its range search included."},
    {"quant_uniform_codes", ck_quant_uniform_codes, METH_VARARGS,
     "uniform_codes(x, seg, zero, inv, fq, half, fzero, out): uniform codes, NaN -> 0."},
    {"quant_dequant_uniform", ck_quant_dequant_uniform, METH_VARARGS,
     "dequant_uniform(codes, seg, zero, scale, nq, prune_code, protect_code, prot, lim, out)."},
    {"quant_dequant_codebook", ck_quant_dequant_codebook, METH_VARARGS,
     "dequant_codebook(codes, seg, book, nq, prune_code, protect_code, prot, out)."},
    {"quant_f16_round", ck_quant_f16_round, METH_VARARGS,
     "f16_round(v, direction, out): float64 values rounded to float16 ones (out may be v)."},
    {"quant_uniform_params_f16", ck_quant_uniform_params_f16, METH_VARARGS,
     "uniform_params_f16(lo, hi, nq, zero, scale) -> bool: float16 zero points and scales."},
    {NULL, NULL, 0, NULL},
};
