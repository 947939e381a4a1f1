/* A whole uniform or adaptive Quantize chunk in one call (issue 28): quantize's uniform path
   (or its adaptive one: the ranges refined by Check-N-Run's search first), the chunk
   layout of _qformat.encode_chunk and, optionally, the RLEHuffman payload -- one release of
   the GIL where the steps took about fifteen (numpy's checks and copies, the gate's sample,
   the coder's two calls), each of which a background persist paid for with a wait for the
   GIL beside a training loop. The bytes are those of
       rle_huffman_encode(encode_chunk(*quantize(x, method, bits, ...)), min_saving)
   for float32, float16 or bfloat16 values without protected or pruned ones and float32
   parameters; a segment at a time (16-bit values widened into a scratch first): its values
   checked finite (float32 ones a group of rows at a time, group_of: a call a short row cost
   more than its check), its range, zero point and scale, its codes, while it is in cache. Where a
   value is not finite (quantize protects it) or an inverse scale is not (a subnormal scale:
   quantize's float64 steps), nothing is returned: the caller's steps run. */
#include "quant.h"
#include "adaptive.h"
#include "floats.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>

#define QC_HEAD 31  /* _qformat's version-1 header: <BBBBBHQQQ */
/* values a group of segments holds (group_of): 32 KiB of float32 for the adaptive steps, 8 KiB
   for the uniform ones' finiteness check (its range and codes passes then find a row in L1) */
#define GROUP 8192
#define UNIFORM_GROUP 2048
enum { QC_F32 = 0, QC_F16 = 2, QC_BF16 = 3 };  /* _floats.DTYPE_CODES */

/* float32 values of m 16-bit floats (bfloat16 or float16 bits), exact, into out: what
   _floats.as_float gives quantize. */
static void widen(const uint16_t *restrict h, Py_ssize_t m, int dtype, float *restrict out)
{
    if (dtype == QC_BF16)
        for (Py_ssize_t i = 0; i < m; i++)
            out[i] = ck_float_of((uint32_t)h[i] << 16);
    else
        for (Py_ssize_t i = 0; i < m; i++)
            out[i] = ck_float_of(ck_f32_of_f16(h[i]));
}

/* 1 when every value of x[0..m) is finite (its exponent bits not all set). */
#define ALL_FINITE(NAME, ATTR)                                                                \
    ATTR static int NAME(const float *restrict x, Py_ssize_t m)                              \
    {                                                                                         \
        uint32_t bad = 0;                                                                     \
        for (Py_ssize_t i = 0; i < m; i++) {                                                  \
            uint32_t u;                                                                       \
            memcpy(&u, &x[i], 4);                                                             \
            bad |= ((u & 0x7F800000u) == 0x7F800000u);                                        \
        }                                                                                     \
        return !bad;                                                                          \
    }
ALL_FINITE(all_finite, )
ALL_FINITE(all_finite_avx2, CK_TARGET_AVX2)

/* A segment's steps, built for the baseline CPU or for AVX2 (the same bits). */
typedef struct {
    int (*finite)(const float *restrict, Py_ssize_t);
    void (*range)(const float *restrict, Py_ssize_t, const uint8_t *restrict, double *,
                  double *);
    double (*absmax)(const float *restrict, Py_ssize_t, const uint8_t *restrict);
    void (*codes)(const float *restrict, Py_ssize_t, Py_ssize_t, const float *, const float *,
                  Py_ssize_t, float, float, float, uint8_t *restrict);
} steps_t;
static const steps_t STEPS_BASE = {all_finite, qk_range_f32, qk_absmax_f32, qk_codes_f32};
static const steps_t STEPS_AVX2 = {all_finite_avx2, qk_range_f32_avx2, qk_absmax_f32_avx2,
                                   qk_codes_f32_avx2};

static void putf32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    ck_store32(p, u);
}

/* Segment s's zero point and scale from its range [lo, hi] (as quantize's _uniform_params
   with float32 parameters), into the chunk's tables, and its codes into out; 1 where the
   inverse scale is not finite (quantize's float64 steps). */
static int segment_codes(const steps_t *k, const float *xs, Py_ssize_t m, double lo, double hi,
                         Py_ssize_t nq, uint8_t *zeros, uint8_t *scales, Py_ssize_t s,
                         uint8_t *out)
{
    float zero = (float)lo, scale = (float)((hi - (double)zero) / (double)(nq - 1));
    scale = isfinite(scale) ? scale : FLT_MAX;
    float inv = scale > 0 ? 1.0f / scale : 0.0f;
    if (!isfinite(inv))
        return 1;
    putf32(zeros + 4 * s, zero);
    putf32(scales + 4 * s, scale);
    k->codes(xs, m, m, &zero, &inv, 1, (float)(nq - 1), 0.5f, 0.0f, out);
    return 0;
}

/* Segments a chunk's steps take at a time while their values are in cache (a finiteness check
   a group: a call a short segment cost more than its check): an even number (the adaptive
   search pairs segments by their parity) of about `values` values. */
static Py_ssize_t group_of(Py_ssize_t seg, Py_ssize_t values)
{
    return seg >= values ? 2 : 2 * ((values / seg + 1) / 2);
}

/* The end (a value index) of the group of segments from segment s (s seg < n). */
static Py_ssize_t group_end(Py_ssize_t s, Py_ssize_t group, Py_ssize_t seg, Py_ssize_t n)
{
    Py_ssize_t at = s * seg;
    return (n - at) / seg < group ? n : at + group * seg;
}

/* The packed codes and _qformat's version-1 header of a chunk of n values. */
static void finish_chunk(uint8_t *body, const uint8_t *codes, Py_ssize_t n, Py_ssize_t seg,
                         int bits, int method, int dtype)
{
    Py_ssize_t nseg = n / seg + (n % seg != 0);
    if (bits < 8)
        ck_pack_bits(codes, n, bits, body + QC_HEAD + 8 * nseg);
    body[0] = 1;                           /* version */
    body[1] = (uint8_t)method;             /* METHODS.index */
    body[2] = (uint8_t)bits;
    body[3] = 0;                           /* flags: no prune, no protect, float32 params */
    body[4] = (uint8_t)dtype;
    ck_store16(body + 5, (uint16_t)(1 << bits));
    ck_store64(body + 7, (uint64_t)n);
    ck_store64(body + 15, (uint64_t)seg);
    ck_store64(body + 23, 0);                   /* nprot */
}

/* The uniform chunk of the n (>= 1) values at x (float32, or 16-bit floats of `dtype` widened a
   segment at a time into wide: seg floats of scratch) into body (QC_HEAD + 8 * nseg + packed
   bytes); codes: n bytes of scratch where bits < 8 (else the codes go straight into body). 0,
   or 1 where quantize's own steps must run (nothing usable written). */
static int uniform_chunk(const steps_t *k, const void *x, int dtype, Py_ssize_t n,
                         Py_ssize_t seg, int bits, int symmetric, uint8_t *body, uint8_t *codes,
                         float *wide)
{
    Py_ssize_t nseg = n / seg + (n % seg != 0), nq = (Py_ssize_t)1 << bits, a0, b0;
    uint8_t *zeros = body + QC_HEAD, *scales = zeros + 4 * nseg;
    uint8_t *out = bits == 8 ? scales + 4 * nseg : codes;
    Py_ssize_t group = group_of(seg, UNIFORM_GROUP);
    for (Py_ssize_t s = 0; s < nseg; s++) {
        qk_segment(s, seg, n, &a0, &b0);
        Py_ssize_t m = b0 - a0;
        const float *xs = (const float *)x + a0;
        if (dtype != QC_F32) {
            widen((const uint16_t *)x + a0, m, dtype, wide);
            xs = wide;
            if (!k->finite(xs, m))
                return 1;
        } else if (s % group == 0 && !k->finite(xs, group_end(s, group, seg, n) - a0))
            return 1;
        double lo, hi;  /* as quant.c's uniform_f32, mask-free, nq >= 2 */
        if (symmetric) {
            hi = k->absmax(xs, m, NULL);
            lo = -hi;
        } else
            k->range(xs, m, NULL, &lo, &hi);
        if (segment_codes(k, xs, m, lo, hi, nq, zeros, scales, s, out + a0))
            return 1;
    }
    finish_chunk(body, codes, n, seg, bits, symmetric ? 0 : 1, dtype);
    return 0;
}

/* The adaptive-asymmetric chunk (quantize's adaptive path: each segment's min/max refined by
   Check-N-Run's search, ad_search_floats, then uniform codes): as uniform_chunk, with every
   segment's range before the search; 16-bit values widened all at once into wide (n floats:
   the search reads them all). lo/hi: nseg doubles of scratch. 0, 1 (quantize's steps), or -1
   out of memory. */
static int adaptive_chunk(const steps_t *k, const void *x, int dtype, Py_ssize_t n,
                          Py_ssize_t seg, int bits, Py_ssize_t num_bins, Py_ssize_t n_iter,
                          uint8_t *body, uint8_t *codes, float *wide, double *lo, double *hi)
{
    Py_ssize_t nseg = n / seg + (n % seg != 0), nq = (Py_ssize_t)1 << bits, a0, b0;
    uint8_t *zeros = body + QC_HEAD, *scales = zeros + 4 * nseg;
    uint8_t *out = bits == 8 ? scales + 4 * nseg : codes;
    const float *xf = (const float *)x;
    if (dtype != QC_F32) {
        widen((const uint16_t *)x, n, dtype, wide);
        xf = wide;
    }
    /* the steps a group of segments at a time (group_of), while its values are in cache; the
       search's tables made once */
    Py_ssize_t group = group_of(seg, GROUP);
    ad_tables *tables = ad_use_direct(seg, nq) ? NULL : ad_tables_new(num_bins * AD_HPB);
    int status = 0;
    for (Py_ssize_t g0 = 0; g0 < nseg && !status; g0 += group) {
        Py_ssize_t g1 = g0 + group < nseg ? g0 + group : nseg, c0 = g0 * seg;
        Py_ssize_t c1 = group_end(g0, group, seg, n);
        if (!k->finite(xf + c0, c1 - c0)) {
            status = 1;
            break;
        }
        for (Py_ssize_t s = g0; s < g1; s++) {
            qk_segment(s, seg, n, &a0, &b0);
            k->range(xf + a0, b0 - a0, NULL, &lo[s], &hi[s]);
        }
        if (ad_search_floats(xf + c0, c1 - c0, seg, lo + g0, hi + g0, g1 - g0, nq, num_bins,
                             n_iter, tables) < 0) {
            status = -1;
            break;
        }
        for (Py_ssize_t s = g0; s < g1 && !status; s++) {
            qk_segment(s, seg, n, &a0, &b0);
            status = segment_codes(k, xf + a0, b0 - a0, lo[s], hi[s], nq, zeros, scales, s,
                                   out + a0);
        }
    }
    ad_tables_free(tables);
    if (status)
        return status;
    finish_chunk(body, codes, n, seg, bits, 2, dtype);
    return 0;
}

/* The chunk of a one-call encoder in bytes (RLEHuffman coded with `entropy`), or None where
   quantize's steps must run; method 0 uniform-symmetric, 1 uniform-asymmetric, 2
   adaptive-asymmetric (num_bins, n_iter: its search). */
static PyObject *encode_call(const char *name, PyObject *x_obj, Py_ssize_t seg, Py_ssize_t bits,
                             int method, Py_ssize_t num_bins, Py_ssize_t n_iter, int entropy,
                             double min_saving, int dtype)
{
    PyObject *res = NULL;
    int status = 0;
    Py_buffer x;
    if (dtype != QC_F32 && dtype != QC_F16 && dtype != QC_BF16)
        return PyErr_Format(PyExc_ValueError, "%s: dtype code %d (0 float32, 2 float16, 3 "
                            "bfloat16)", name, dtype);
    if (ck_buffer(x_obj, &x, 0, dtype == QC_F32 ? CK_FLOAT : 2, name) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&x), nseg = seg > 0 ? n / seg + (n % seg != 0) : 0;
    if (dtype == QC_F32 && x.itemsize != 4)
        PyErr_Format(PyExc_ValueError, "%s: float32 values, not %zd-byte ones", name,
                     x.itemsize);
    else if (seg < 1 || bits < 1 || bits > 8)
        PyErr_Format(PyExc_ValueError, "%s: segments of %zd values, %zd bits (1..8)", name,
                     seg, bits);
    else if (!(min_saving >= 0.0 && min_saving < 1.0))
        ck_value_error("%s: min_saving %g is not in [0, 1)", name, min_saving);
    else if (n == 0 || n > PY_SSIZE_T_MAX / 16)
        status = 1;  /* an empty chunk: quantize's steps */
    else {
        Py_ssize_t qsize = QC_HEAD + 8 * nseg + (Py_ssize_t)(((size_t)n * (size_t)bits + 7) / 8);
        Py_ssize_t room = entropy ? CK_RH_ROOM(qsize) : qsize, at = entropy ? CK_RH_HEAD : 0;
        res = PyBytes_FromStringAndSize(NULL, room);
        uint8_t *codes = NULL, *copy = NULL;
        float *wide = NULL;
        double *lo = NULL, *hi = NULL;
        Py_ssize_t end = qsize;
        if (res != NULL) {
            uint8_t *out = (uint8_t *)PyBytes_AS_STRING(res), *body = out + at;
            const steps_t *k = CK_HAVE_BUILDS && ck_vector() >= CK_AVX2 ? &STEPS_AVX2
                                                                        : &STEPS_BASE;
            Py_ssize_t nwide = method == 2 ? n : (seg < n ? seg : n);
            CK_BEGIN_NOGIL(x.len)
            if ((bits < 8 && (codes = malloc((size_t)n)) == NULL)
                || (dtype != QC_F32 && (wide = malloc(sizeof *wide * (size_t)nwide)) == NULL)
                || (method == 2 && ((lo = malloc(sizeof *lo * (size_t)nseg)) == NULL
                                    || (hi = malloc(sizeof *hi * (size_t)nseg)) == NULL)))
                end = -1;
            else {
                status = method == 2 ? adaptive_chunk(k, x.buf, dtype, n, seg, (int)bits,
                                                      num_bins, n_iter, body, codes, wide, lo,
                                                      hi)
                                     : uniform_chunk(k, x.buf, dtype, n, seg, (int)bits,
                                                     method == 0, body, codes, wide);
                if (status < 0)
                    end = -1, status = 0;
                else if (status == 0 && entropy) {
                    if (min_saving > 0 && !ck_rh_pays(body, qsize, min_saving))
                        end = ck_rh_raw(body, qsize, out);  /* in place */
                    else if ((copy = malloc((size_t)qsize)) == NULL)
                        end = -1;
                    else {  /* the coder writes where the chunk lies: it reads a copy */
                        memcpy(copy, body, (size_t)qsize);
                        end = ck_rh_encode(copy, qsize, out);
                    }
                }
            }
            CK_END_NOGIL
            free(codes);
            free(copy);
            free(wide);
            free(lo);
            free(hi);
            if (end < 0)
                PyErr_NoMemory();
            else if (!status)
                _PyBytes_Resize(&res, end);  /* NULL and an exception where it fails */
        }
    }
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) {
        Py_XDECREF(res);
        return NULL;
    }
    if (status) {
        Py_XDECREF(res);
        Py_RETURN_NONE;
    }
    return res;
}

/* encode_uniform(x, seg, bits, symmetric, entropy, min_saving, dtype) -> bytes, or None where
   quantize's steps must run (see above); x: C-contiguous float32 values (dtype 0), or the bits
   of float16 (2) or bfloat16 (3) values. */
PyObject *ck_quant_encode_uniform(PyObject *self, PyObject *args)
{
    PyObject *x_obj;
    Py_ssize_t seg, bits;
    int symmetric, entropy, dtype;
    double min_saving;
    if (!PyArg_ParseTuple(args, "Onnppdi", &x_obj, &seg, &bits, &symmetric, &entropy,
                          &min_saving, &dtype))
        return NULL;
    return encode_call("encode_uniform", x_obj, seg, bits, symmetric ? 0 : 1, 0, 0, entropy,
                       min_saving, dtype);
}

/* encode_adaptive(x, seg, bits, num_bins, ratio, entropy, min_saving, dtype) -> bytes, or None:
   as encode_uniform for quantize's adaptive-asymmetric method (its range search of num_bins
   bins over ratio of the range; ValueError where the search takes neither). */
PyObject *ck_quant_encode_adaptive(PyObject *self, PyObject *args)
{
    const char *name = "encode_adaptive";
    PyObject *x_obj;
    Py_ssize_t seg, bits, num_bins;
    int entropy, dtype;
    double ratio, min_saving;
    if (!PyArg_ParseTuple(args, "Onnndpdi", &x_obj, &seg, &bits, &num_bins, &ratio, &entropy,
                          &min_saving, &dtype))
        return NULL;
    /* the check of the search the segments get (adaptive.adaptive_ranges' choice) */
    int zero_width_ok = !(bits >= 1 && bits <= 8 && ad_use_direct(seg, (Py_ssize_t)1 << bits));
    Py_ssize_t n_iter = ad_greedy_steps(ratio, num_bins, zero_width_ok, name);
    if (n_iter < 0)
        return NULL;
    return encode_call(name, x_obj, seg, bits, 2, num_bins, n_iter, entropy, min_saving, dtype);
}
