/* Quantize's dequantizers (the twins of ckptcodecs/_qkernels.py's dequant_uniform and
   dequant_codebook): a code below nq is a level of its segment, the protect code takes the
   next protected value (in position order), any other code is 0. Protected values beyond the
   given ones are an error (a corrupt chunk), not a read past them. */
#include "quant.h"

/* The protect code where it is not a level (codes below nq are levels), else -1: no match. */
static int protect_match(Py_ssize_t nq, Py_ssize_t protect_code)
{
    return protect_code >= nq && protect_code >= 0 && protect_code < 256 ? (int)protect_code
                                                                          : -1;
}

/* A level of a uniform segment: z + sc * c clamped to [-lim, lim] (NaN stays), as numba. */
static inline double level(double z, double sc, int c, double lim)
{
    double r = z + sc * (double)c;
    r = -lim > r ? -lim : r;
    return lim < r ? lim : r;
}

#define RUN 64  /* codes checked for the protect code at a time */

/* 1 when codes[0..m) hold code pc (a loop without a branch that vectorises). */
static inline int has_code(const uint8_t *codes, Py_ssize_t m, int pc)
{
    int any = 0;
    for (Py_ssize_t i = 0; i < m; i++)
        any |= codes[i] == pc;
    return any;
}

/* Both dequantizers, for an output of type T. A segment's level c (c < top) is LEVEL (an
   expression of c), computed at each code of a short segment, else once into lut[c]. -1 when
   the protected values run out. */
#define PROTECTED(T, o)                                                                       \
    do {                                                                                      \
        if (p >= ck_items(prot))                                                              \
            return -1;                                                                        \
        (o) = (T)qk_get(prot, p++);                                                           \
    } while (0)
#define SEGMENT(T, LEVEL)                                                                     \
    do {                                                                                      \
        if (b0 - a0 < top) { /* short: no table */                                            \
            for (Py_ssize_t i = a0; i < b0; i++) {                                            \
                int c = codes[i];                                                             \
                if (c < top)                                                                  \
                    out[i] = (T)(LEVEL);                                                      \
                else if (c == pc)                                                             \
                    PROTECTED(T, out[i]);                                                     \
                else                                                                          \
                    out[i] = 0;                                                               \
            }                                                                                 \
            break;                                                                            \
        }                                                                                     \
        for (int c = 0; c < top; c++)                                                         \
            lut[c] = (T)(LEVEL);                                                              \
        for (Py_ssize_t j0 = a0; j0 < b0; j0 += RUN) {                                        \
            Py_ssize_t j1 = b0 - j0 < RUN ? b0 : j0 + RUN;                                    \
            if (!has_code(codes + j0, j1 - j0, pc)) { /* the common run: no protect code */   \
                for (Py_ssize_t i = j0; i < j1; i++)                                          \
                    out[i] = lut[codes[i]];                                                   \
                continue;                                                                     \
            }                                                                                 \
            for (Py_ssize_t i = j0; i < j1; i++) {                                            \
                int c = codes[i];                                                             \
                if (c == pc)                                                                  \
                    PROTECTED(T, out[i]);                                                     \
                else                                                                          \
                    out[i] = lut[c];                                                          \
            }                                                                                 \
        }                                                                                     \
    } while (0)
#define DEQUANT_KERNEL(T, SUFFIX)                                                             \
    static int uniform_##SUFFIX(const uint8_t *restrict codes, Py_ssize_t n, Py_ssize_t seg,  \
                                const Py_buffer *zero, const Py_buffer *scale, Py_ssize_t nq, \
                                int pc, const Py_buffer *prot, double lim, T *restrict out)   \
    {                                                                                         \
        Py_ssize_t p = 0, a0, b0, nseg = ck_items(zero);                                      \
        int top = nq < 256 ? (int)nq : 256;                                                   \
        T lut[256] = {0}; /* codes from top on: 0 */                                          \
        for (Py_ssize_t s = 0; s < nseg; s++) {                                               \
            qk_segment(s, seg, n, &a0, &b0);                                                  \
            if (a0 == b0)                                                                     \
                break;                                                                        \
            double z = qk_get(zero, s), sc = qk_get(scale, s);                                \
            SEGMENT(T, level(z, sc, c, lim));                                                 \
        }                                                                                     \
        return 0;                                                                             \
    }                                                                                         \
    static int codebook_##SUFFIX(const uint8_t *restrict codes, Py_ssize_t n, Py_ssize_t seg, \
                                 const Py_buffer *book, Py_ssize_t ncol, Py_ssize_t nq,       \
                                 int pc, const Py_buffer *prot, T *restrict out)              \
    {                                                                                         \
        Py_ssize_t p = 0, a0, b0, nseg = ncol ? ck_items(book) / ncol : 0;                    \
        int top = nq < 256 ? (int)nq : 256;                                                   \
        T lut[256] = {0}; /* codes from top on: 0 */                                          \
        for (Py_ssize_t s = 0; s < nseg; s++) {                                               \
            qk_segment(s, seg, n, &a0, &b0);                                                  \
            if (a0 == b0)                                                                     \
                break;                                                                        \
            SEGMENT(T, qk_get(book, s * ncol + c));                                           \
        }                                                                                     \
        return 0;                                                                             \
    }

DEQUANT_KERNEL(float, f32)
DEQUANT_KERNEL(double, f64)

static PyObject *run_out_of_protected(const char *name)
{
    return PyErr_Format(PyExc_ValueError, "%s: more protect codes than protected values", name);
}

PyObject *ck_quant_dequant_uniform(PyObject *self, PyObject *args)
{
    const char *name = "dequant_uniform";
    const ck_want want[5] = {CK_IN(name, 1), CK_IN(name, CK_FLOAT), CK_IN(name, CK_FLOAT),
                             CK_IN(name, CK_FLOAT), CK_OUT(name, CK_FLOAT)};
    PyObject *obj[5];  /* codes, zero, scale, prot, out */
    Py_ssize_t seg, nq, prune_code, protect_code;
    double lim;
    Py_buffer v[5];
    if (!PyArg_ParseTuple(args, "OnOOnnnOdO", &obj[0], &seg, &obj[1], &obj[2], &nq,
                          &prune_code, &protect_code, &obj[3], &lim, &obj[4])
        || ck_buffers(obj, want, 5, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].len;
    if (seg < 0 || ck_items(&v[2]) < ck_items(&v[1]) || ck_items(&v[4]) < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd codes, segments of %zd, %zd zero points, %zd "
                     "scales, %zd outputs", name, n, seg, ck_items(&v[1]), ck_items(&v[2]),
                     ck_items(&v[4]));
    else if (!ck_overlap(&v[0], &v[4], name) && !ck_overlap(&v[1], &v[4], name)
             && !ck_overlap(&v[2], &v[4], name) && !ck_overlap(&v[3], &v[4], name)) {
        int pc = protect_match(nq, protect_code), rc;
        CK_BEGIN_NOGIL(n * v[4].itemsize)
        if (v[4].itemsize == 4)
            rc = uniform_f32(v[0].buf, n, seg, &v[1], &v[2], nq, pc, &v[3], lim, v[4].buf);
        else
            rc = uniform_f64(v[0].buf, n, seg, &v[1], &v[2], nq, pc, &v[3], lim, v[4].buf);
        CK_END_NOGIL
        if (rc != 0)
            run_out_of_protected(name);
    }
    return ck_none(v, 5);
}

PyObject *ck_quant_dequant_codebook(PyObject *self, PyObject *args)
{
    const char *name = "dequant_codebook";
    const ck_want want[4] = {CK_IN(name, 1), CK_IN(name, CK_FLOAT), CK_IN(name, CK_FLOAT),
                             CK_OUT(name, CK_FLOAT)};
    PyObject *obj[4];  /* codes, book, prot, out */
    Py_ssize_t seg, nq, prune_code, protect_code;
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OnOnnnOO", &obj[0], &seg, &obj[1], &nq, &prune_code,
                          &protect_code, &obj[2], &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].len, ncol = v[1].ndim == 2 ? v[1].shape[1] : -1;
    Py_ssize_t used = nq < 256 ? nq : 256;
    if (ncol < 0 || seg < 0 || ck_items(&v[3]) < n || (ck_items(&v[1]) > 0 && used > ncol))
        PyErr_Format(PyExc_ValueError, "%s: %zd codes, segments of %zd, a %d-d codebook of %zd "
                     "levels a row for nq=%zd, %zd outputs", name, n, seg, v[1].ndim, ncol, nq,
                     ck_items(&v[3]));
    else if (!ck_overlap(&v[0], &v[3], name) && !ck_overlap(&v[1], &v[3], name)
             && !ck_overlap(&v[2], &v[3], name)) {
        int pc = protect_match(nq, protect_code), rc;
        CK_BEGIN_NOGIL(n * v[3].itemsize)
        if (v[3].itemsize == 4)
            rc = codebook_f32(v[0].buf, n, seg, &v[1], ncol, nq, pc, &v[2], v[3].buf);
        else
            rc = codebook_f64(v[0].buf, n, seg, &v[1], ncol, nq, pc, &v[2], v[3].buf);
        CK_END_NOGIL
        if (rc != 0)
            run_out_of_protected(name);
    }
    return ck_none(v, 4);
}
