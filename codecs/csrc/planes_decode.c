/* BytePlanes' Huffman decoder (the twin of ckptcodecs/_pdecode.py's huffman_decode): per block,
   tables indexed by the next MAX_LEN bits that decode up to three symbols a lookup, then the
   block's four streams decoded in step. Every read is checked against the payload's size and
   every write against the plane's: a corrupt payload gives an error code, never an access out
   of bounds. The order of the work (and so what a corrupt payload leaves in the plane) is the
   numba kernel's. */
#include "planes.h"

/* The decoding tables of the canonical code `order[0..m)` of `lens` (see _pdecode._tables). */
static void build_tables(const int lens[256], const int *order, int m, uint32_t *syms,
                         uint8_t *bits)
{
    int p1 = 0;
    for (int a = 0; a < m; a++) {
        int s1 = order[a], r1 = PL_MAX_LEN - lens[s1], p2 = p1;
        for (int b = 0; b < m; b++) {
            int s2 = order[b];
            if (lens[s2] > r1)
                break;
            int r2 = r1 - lens[s2], p3 = p2;
            for (int c = 0; c < m; c++) {
                int s3 = order[c];
                if (lens[s3] > r2)
                    break;
                int run = 1 << (r2 - lens[s3]);
                uint32_t e = (uint32_t)(s1 | s2 << 8 | s3 << 16) | 3u << 24;
                for (int k = p3; k < p3 + run; k++) {
                    syms[k] = e;
                    bits[k] = (uint8_t)(PL_MAX_LEN - r2 + lens[s3]);
                }
                p3 += run;
            }
            for (int k = p3; k < p2 + (1 << r2); k++) {
                syms[k] = (uint32_t)(s1 | s2 << 8) | 2u << 24;
                bits[k] = (uint8_t)(PL_MAX_LEN - r2);
            }
            p2 += 1 << r2;
        }
        for (int k = p2; k < p1 + (1 << r1); k++) {
            syms[k] = (uint32_t)s1 | 1u << 24;
            bits[k] = (uint8_t)(PL_MAX_LEN - r1);
        }
        p1 += 1 << r1;
    }
}

/* Python's a // b for b > 0. */
PL_INLINE int64_t floordiv(int64_t a, int64_t b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Rounds (a peek, four lookups) that surely fit a stream at plane[o] (ending at stop) and bit
   bp of a size-byte buffer (see _pdecode._steps). */
PL_INLINE int64_t steps(int64_t o, int64_t stop, int64_t bp, int64_t size)
{
    int64_t a = floordiv(stop - 13 - o, 12), b = floordiv(8 * (size - 8) - bp, 48);
    int64_t s = (a < b ? a : b) + 1;
    return s > 0 ? s : 0;
}

/* The decoding tables, together: one register addresses both. */
typedef struct {
    uint32_t syms[1 << PL_MAX_LEN];
    uint8_t bits[1 << PL_MAX_LEN];
} tables_t;

typedef struct {
    const uint8_t *buf;
    int64_t size;
    const tables_t *t;
    uint8_t *plane;
} dec_t;

PL_INLINE uint64_t peek(const uint8_t *buf, uint64_t bp)
{
    return __builtin_bswap64(ck_load64(buf + (bp >> 3))) << (bp & 7);
}

/* The (up to three) symbols of the top MAX_LEN bits of x at pointer o, one 4-byte store. */
#define GET3(x, bp, o)                                                   \
    do {                                                                 \
        uint64_t k_ = (x) >> (64 - PL_MAX_LEN);                          \
        uint32_t e_ = d.t->syms[k_];                                        \
        uint64_t n_ = d.t->bits[k_];                                        \
        memcpy((o), &e_, 4);                                             \
        (x) <<= n_;                                                      \
        (bp) += n_;                                                      \
        (o) += e_ >> 24;                                                 \
    } while (0)

/* Finish one stream (plane[o:stop] from bit bp), then check that it used exactly its nbytes
   bytes from byte first: 0 or an error code. */
PL_INLINE int64_t finish_stream(dec_t d, const int lens[256], uint64_t o, int64_t stop,
                                uint64_t bp, int64_t first, int64_t nbytes)
{
    int64_t r;
    while ((r = steps((int64_t)o, stop, (int64_t)bp, d.size)) != 0)
        for (int64_t i = 0; i < r; i++) {
            uint64_t x = peek(d.buf, bp);
            uint8_t *q = d.plane + o;
            GET3(x, bp, q);
            GET3(x, bp, q);
            GET3(x, bp, q);
            GET3(x, bp, q);
            o = (uint64_t)(q - d.plane);
        }
    int64_t so = (int64_t)o, sbp = (int64_t)bp;
    while (so < stop) {
        int64_t p = sbp >> 3, left = d.size - p;
        uint64_t x = 0;
        for (int64_t k = 0; k < (left < 8 ? left : 8); k++)
            x |= (uint64_t)d.buf[p + k] << (56 - 8 * k);
        int s = d.t->syms[(x << (sbp & 7)) >> (64 - PL_MAX_LEN)] & 0xFF;
        sbp += lens[s];
        if (sbp > 8 * d.size)
            return PL_ERR_TRUNCATED;
        d.plane[so++] = (uint8_t)s;
    }
    return floordiv(sbp - 8 * first + 7, 8) == nbytes ? 0 : PL_ERR_CODE;
}

/* The four streams of plane[start:stop], read from at[0..4] (checked to lie in the buffer). */
PL_INLINE int64_t streams_body(dec_t d, const int lens[256], int64_t start, int64_t stop,
                              const int64_t at[5])
{
    int64_t q = (stop - start + 3) / 4;
    int64_t e0 = start + q < stop ? start + q : stop;
    int64_t e1 = start + 2 * q < stop ? start + 2 * q : stop;
    int64_t e2 = start + 3 * q < stop ? start + 3 * q : stop;
    uint64_t o0 = start, o1 = e0, o2 = e1, o3 = e2;
    uint64_t b0 = 8 * at[0], b1 = 8 * at[1], b2 = 8 * at[2], b3 = 8 * at[3];
    for (;;) {
        int64_t r = steps(o0, e0, b0, d.size), t;
        if ((t = steps(o1, e1, b1, d.size)) < r)
            r = t;
        if ((t = steps(o2, e2, b2, d.size)) < r)
            r = t;
        if ((t = steps(o3, stop, b3, d.size)) < r)
            r = t;
        if (r == 0)
            break;
        uint8_t *q0 = d.plane + o0, *q1 = d.plane + o1;
        uint8_t *q2 = d.plane + o2, *q3 = d.plane + o3;
        for (int64_t i = 0; i < r; i++) {
            uint64_t x0 = peek(d.buf, b0), x1 = peek(d.buf, b1), x2 = peek(d.buf, b2),
                     x3 = peek(d.buf, b3);
            for (int k = 0; k < 4; k++) {
                GET3(x0, b0, q0);
                GET3(x1, b1, q1);
                GET3(x2, b2, q2);
                GET3(x3, b3, q3);
            }
        }
        o0 = (uint64_t)(q0 - d.plane), o1 = (uint64_t)(q1 - d.plane);
        o2 = (uint64_t)(q2 - d.plane), o3 = (uint64_t)(q3 - d.plane);
    }
    int64_t err[4] = {
        finish_stream(d, lens, o0, e0, b0, at[0], at[1] - at[0]),
        finish_stream(d, lens, o1, e1, b1, at[1], at[2] - at[1]),
        finish_stream(d, lens, o2, e2, b2, at[2], at[3] - at[2]),
        finish_stream(d, lens, o3, stop, b3, at[3], at[4] - at[3]),
    };
    int64_t worst = 0;
    for (int k = 0; k < 4; k++)
        worst = err[k] < worst ? err[k] : worst;
    return worst;
}

static int64_t streams_base(dec_t d, const int lens[256], int64_t start, int64_t stop,
                            const int64_t at[5])
{
    return streams_body(d, lens, start, stop, at);
}

PL_BMI2 static int64_t streams_bmi2(dec_t d, const int lens[256], int64_t start, int64_t stop,
                                    const int64_t at[5])
{
    return streams_body(d, lens, start, stop, at);
}

int64_t pl_huffman_block(const uint8_t *buf, int64_t size, int64_t pos, uint8_t *out,
                         int64_t len, int bmi2)
{
    int lens[256], order[256];
    tables_t t;  /* filled whole (the block's code is complete) before it is read */
    int64_t at[5];
    if (pos + 2 > size)
        return PL_ERR_TRUNCATED;
    int lo = buf[pos], hi = buf[pos + 1];
    pos += 2;
    if (lo > hi)
        return PL_ERR_CODE;
    if (lo == hi) {
        memset(out, lo, (size_t)len);
        return pos;
    }
    if (pos + (hi - lo + 2) / 2 + 16 > size)
        return PL_ERR_TRUNCATED;
    memset(lens, 0, sizeof lens);
    int64_t kraft = 0;
    for (int s = lo; s <= hi; s++) {
        lens[s] = (buf[pos + (s - lo) / 2] >> (4 * ((s - lo) % 2))) & 0xF;
        if (lens[s] > PL_MAX_LEN)
            return PL_ERR_CODE;
        kraft += lens[s] ? (int64_t)1 << (PL_MAX_LEN - lens[s]) : 0;
    }
    if (kraft != 1 << PL_MAX_LEN)
        return PL_ERR_CODE;
    pos += (hi - lo + 2) / 2;
    at[0] = pos + 16;
    for (int k = 0; k < 4; k++)
        at[k + 1] = at[k] + (int64_t)pl_load32le(buf + pos + 4 * k);
    if (at[4] > size)
        return PL_ERR_TRUNCATED;
    build_tables(lens, order, pl_canonical(lens, order), t.syms, t.bits);
    dec_t d = {buf, size, &t, out};
    int64_t err = (bmi2 ? streams_bmi2 : streams_base)(d, lens, 0, len, at);
    return err ? err : at[4];
}

/* Decode buf (size bytes) into plane (n bytes): the bytes consumed, or an error code. */
static int64_t huffman_decode(const uint8_t *buf, int64_t size, int64_t block, uint8_t *plane,
                              int64_t n, int bmi2)
{
    int64_t pos = 0;
    for (int64_t start = 0; start < n && pos >= 0; start += block)
        pos = pl_huffman_block(buf, size, pos, plane + start,
                               n - start < block ? n - start : block, bmi2);
    return pos;
}

PyObject *ck_planes_huffman_decode(PyObject *self, PyObject *args)
{
    PyObject *buf_obj, *plane_obj;
    Py_ssize_t block;
    Py_buffer v[2];
    int64_t status = 0;
    if (!PyArg_ParseTuple(args, "OnO", &buf_obj, &block, &plane_obj))
        return NULL;
    if (block < 1)
        return PyErr_Format(PyExc_ValueError, "huffman_decode: block must be >= 1, not %zd",
                            block);
    if (ck_buffer(buf_obj, &v[0], 0, 1, "buf") < 0)
        return NULL;
    if (ck_buffer(plane_obj, &v[1], 1, 1, "plane") < 0) {
        ck_release(v, 1);
        return NULL;
    }
    if (!ck_overlap(&v[0], &v[1], "huffman_decode")) {
        int bmi2 = pl_bmi2();
        CK_BEGIN_NOGIL(v[1].len)
        status = huffman_decode(v[0].buf, v[0].len, block, v[1].buf, v[1].len, bmi2);
        CK_END_NOGIL
    }
    ck_release(v, 2);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(status);
}
