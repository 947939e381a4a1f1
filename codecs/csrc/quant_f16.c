/* Float16 parameters of the uniform methods (the twins of ckptcodecs/_qkernels.py's f16_round
   and uniform_params_f16): float64 values rounded to float16 ones, down, to nearest-even or up,
   by a power-of-two scaling to the float16 spacing around each value (exact), rint/floor/ceil,
   and the scaling back. */
#include <math.h>
#include "quant.h"

/* GCC keeps branches in these loops while floating-point operations may trap (its default;
   clang's is not to): its -fno-trapping-math, for these functions only, lets them vectorise.
   It changes no value (no reassociation, no contraction, signed zeros and NaNs kept). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_TRAPS __attribute__((optimize("no-trapping-math")))
#else
#define NO_TRAPS
#endif

/* x rounded as f16_round does (dir: -1, 0 or +1), without branches: every path computed,
   then picked, in plain double arithmetic that vectorises (rint, floor and ceil would be
   library calls on baseline x86-64). The float16 spacing around |x|, 2**(exponent - 10)
   clamped to 2**-24 .. 2**5, comes from x's exponent bits; q = |x| / spacing (exact: a power
   of two) is below 2**11 where it is used (|x| < 65520), so (q + 2**52) - 2**52 is q rounded
   to nearest-even (np.rint's, under the default rounding mode; C without -ffast-math keeps
   both steps), and down or up from there. */
NO_TRAPS static inline __attribute__((always_inline)) double round_one(double x, int dir)
{
    double a = fabs(x), sp, inv;
    uint64_t bits;
    memcpy(&bits, &a, 8);
    bits &= UINT64_C(0x7FF0000000000000);  /* 2**exponent (0 for a subnormal |x|) */
    memcpy(&sp, &bits, 8);
    sp *= 0x1p-10;
    sp = sp < 0x1p-24 ? 0x1p-24 : sp;
    sp = sp > 0x1p5 ? 0x1p5 : sp;
    memcpy(&bits, &sp, 8);
    bits = (UINT64_C(2046) << 52) - bits;  /* 1 / sp, exactly */
    memcpy(&inv, &bits, 8);
    double q = a * inv;
    double r = (q + 0x1p52) - 0x1p52;
    /* rounding down a positive value or up a negative one goes towards zero */
    double down = r > q ? r - 1.0 : r, up = r < q ? r + 1.0 : r;
    double m = dir == 0 ? r : (dir < 0) == (x > 0) ? down : up;
    m = copysign(m * sp, x);
    int over = (a > 65504.0) & ((dir != 0) | (a >= 65520.0));
    m = over ? copysign(INFINITY, x) : m;
    return (!(a < INFINITY)) | (a == 0.0) ? x : m;
}

/* Values v[i:i + 8] (a line) rounded into out, with a prefetch hint for the line CK_AHEAD on
   (CK_PREFETCH: 32 MB of values streamed at 2.5 GB/s without it on this host). */
#define ROUND_LINE(dir)                                                                       \
    do {                                                                                      \
        CK_PREFETCH(v + i, CK_AHEAD);                                                         \
        for (int j = 0; j < 8; j++)                                                           \
            out[i + j] = round_one(v[i + j], dir);                                            \
    } while (0)

/* One loop per direction (a constant in each), compiled twice: plain and for AVX2. */
#define ROUND_ALL(NAME, ATTR)                                                                 \
    NO_TRAPS ATTR static void NAME(const double *v, Py_ssize_t n, Py_ssize_t direction,      \
                                   double *out)                                               \
    {                                                                                         \
        Py_ssize_t i = 0;                                                                     \
        if (direction == 0)                                                                   \
            for (; i + 8 <= n; i += 8)                                                        \
                ROUND_LINE(0);                                                                \
        else if (direction < 0)                                                               \
            for (; i + 8 <= n; i += 8)                                                        \
                ROUND_LINE(-1);                                                               \
        else                                                                                  \
            for (; i + 8 <= n; i += 8)                                                        \
                ROUND_LINE(1);                                                                \
        for (; i < n; i++)                                                                    \
            out[i] = round_one(v[i], direction == 0 ? 0 : direction < 0 ? -1 : 1);            \
    }
ROUND_ALL(round_plain, )
ROUND_ALL(round_avx2, QK_AVX2)

void qk_f16_round(const double *v, Py_ssize_t n, Py_ssize_t direction, double *out)
{
    (qk_avx2() ? round_avx2 : round_plain)(v, n, direction, out);
}

/* 1 (after a ValueError) when `what` is not a float64 buffer. */
static int not_f64(const Py_buffer *v, const char *what)
{
    if (v->itemsize == 8)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s must be float64", what);
    return 1;
}

PyObject *ck_quant_f16_round(PyObject *self, PyObject *args)
{
    const char *name = "f16_round";
    const ck_want want[2] = {CK_IN(name, CK_FLOAT), CK_OUT(name, CK_FLOAT)};
    PyObject *obj[2];
    Py_ssize_t direction;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnO", &obj[0], &direction, &obj[1])
        || ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]);
    if (not_f64(&v[0], "f16_round's values") || not_f64(&v[1], "f16_round's out"))
        ;
    else if (ck_items(&v[1]) < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd values into %zd", name, n, ck_items(&v[1]));
    else if (v[0].buf == v[1].buf || !ck_overlap(&v[0], &v[1], name)) {  /* in place, or apart */
        CK_BEGIN_NOGIL(v[0].len)
        qk_f16_round(v[0].buf, n, direction, v[1].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 2);
}

/* uniform_params_f16's work on checked arrays of n; 1 when every parameter is finite.
   Compiled twice, as the rounding. */
#define PARAMS(NAME, ROUND, ATTR)                                                             \
    ATTR static int NAME(const double *lo, const double *hi, Py_ssize_t n, Py_ssize_t nq,     \
                         double *zero, double *scale)                                         \
    {                                                                                         \
        if (nq == 1) {                                                                        \
            for (Py_ssize_t s = 0; s < n; s++) {                                              \
                zero[s] = lo[s] / 2 + hi[s] / 2;                                              \
                scale[s] = 0.0;                                                               \
            }                                                                                 \
            ROUND(zero, n, 0, zero);                                                          \
        } else {                                                                              \
            ROUND(lo, n, -1, zero);                                                           \
            for (Py_ssize_t s = 0; s < n; s++)                                                \
                scale[s] = (hi[s] - zero[s]) / (double)(nq - 1);                              \
            ROUND(scale, n, 1, scale);                                                        \
        }                                                                                     \
        int finite = 1;                                                                       \
        for (Py_ssize_t s = 0; s < n; s++)                                                    \
            finite &= fabs(zero[s]) < INFINITY && fabs(scale[s]) < INFINITY;                  \
        return finite;                                                                        \
    }
PARAMS(params_plain, round_plain, )
PARAMS(params_avx2, round_avx2, QK_AVX2)

PyObject *ck_quant_uniform_params_f16(PyObject *self, PyObject *args)
{
    const char *name = "uniform_params_f16";
    const ck_want want[4] = {CK_IN(name, CK_FLOAT), CK_IN(name, CK_FLOAT),
                             CK_OUT(name, CK_FLOAT), CK_OUT(name, CK_FLOAT)};
    PyObject *obj[4];  /* lo, hi, zero, scale */
    Py_ssize_t nq;
    Py_buffer v[4];
    int finite = 0;
    if (!PyArg_ParseTuple(args, "OOnOO", &obj[0], &obj[1], &nq, &obj[2], &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]);
    if (v[0].itemsize != 8 || v[1].itemsize != 8 || v[2].itemsize != 8 || v[3].itemsize != 8
        || ck_items(&v[1]) != n || ck_items(&v[2]) != n || ck_items(&v[3]) != n)
        PyErr_Format(PyExc_ValueError, "%s: lo, hi, zero and scale are float64 with one value "
                     "per segment", name);
    else if (!ck_overlap(&v[0], &v[2], name) && !ck_overlap(&v[0], &v[3], name)
             && !ck_overlap(&v[1], &v[2], name) && !ck_overlap(&v[1], &v[3], name)
             && !ck_overlap(&v[2], &v[3], name)) {
        CK_BEGIN_NOGIL(v[0].len)
        finite = (qk_avx2() ? params_avx2 : params_plain)(v[0].buf, v[1].buf, n, nq, v[2].buf,
                                                          v[3].buf);
        CK_END_NOGIL
    }
    return ck_done(v, 4) < 0 ? NULL : PyBool_FromLong(finite);
}
