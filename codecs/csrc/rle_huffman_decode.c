/* RLEHuffman's decoder (the twin of ckptcodecs/_hkernels.py's decode_symbols): a lookup table
   of the next LUT_BITS bits (two values per lookup where both codes fit), canonical decoding
   of longer codes, runs expanded as they come. Every write is checked against the output's
   announced size; the tables are checked against each other before the loop. */
#include "native.h"

#define RUN_BASE 254
#define MAX_LEN 24
#define LUT_BITS 11
#define NTABLE (MAX_LEN + 2)

enum { ERR_BITS = -1, ERR_CODE = -2, ERR_RUN = -3, ERR_OVERFLOW = -4, ERR_SHORT = -5 };

typedef struct {
    const int64_t *lut, *first, *offset, *count, *sorted_syms;
    int maxlen;
} tables_t;

/* The symbol of the canonical code longer than LUT_BITS at the top of the nacc bits of acc,
   its length into *ln; -1 where none fits. */
static int64_t long_code(const tables_t *t, uint64_t acc, int nacc, int64_t *ln)
{
    for (int L = LUT_BITS + 1; L <= t->maxlen; L++) {
        if (L > nacc)
            break;
        int64_t c = (int64_t)((acc >> (nacc - L)) & ((UINT64_C(1) << L) - 1));
        if (t->count[L] > 0 && c - t->first[L] < t->count[L] && c >= t->first[L]) {
            *ln = L;
            return t->sorted_syms[t->offset[L] + c - t->first[L]];
        }
    }
    return -1;
}

static int64_t decode(const uint8_t *buf, Py_ssize_t nbuf, int64_t nsym, Py_ssize_t n,
                      const tables_t *t, uint8_t *out)
{
    uint64_t acc = 0;
    int nacc = 0;  /* valid bits in acc (right-aligned) */
    Py_ssize_t pos = 0, o = 0;
    int64_t last = -1, k = 0;
    const uint64_t lmask = (UINT64_C(1) << LUT_BITS) - 1;
    while (k < nsym) {
        if (nacc < t->maxlen) {
            if (pos + 8 <= nbuf) {  /* the bytes the loop below would add, in one load */
                int nb = (64 - nacc) >> 3;
                uint64_t word = __builtin_bswap64(ck_load64(buf + pos));
                acc = nb == 8 ? word : (acc << (8 * nb)) | (word >> (64 - 8 * nb));
                pos += nb;
                nacc += 8 * nb;
            }
            while (nacc <= 56 && pos < nbuf) {
                acc = (acc << 8) | buf[pos++];
                nacc += 8;
            }
        }
        int64_t peek = (int64_t)(nacc >= LUT_BITS ? (acc >> (nacc - LUT_BITS)) & lmask
                                                  : (acc << (LUT_BITS - nacc)) & lmask);
        int64_t e = t->lut[peek], ln = e & 0xFF, l2 = (e >> 24) & 0xFF;
        int64_t s = (e >> 8) & 0xFFFF;
        if (l2 > 0 && l2 <= nacc && k + 2 <= nsym && o + 2 <= n) {
            last = (e >> 32) & 0xFFFF;
            out[o] = (uint8_t)s;
            out[o + 1] = (uint8_t)last;
            o += 2;
            nacc -= (int)l2;
            k += 2;
            continue;
        }
        if (ln == 0) {
            s = long_code(t, acc, nacc, &ln);
            if (s < 0)
                return nacc >= t->maxlen ? ERR_CODE : ERR_BITS;
        }
        if (ln > nacc)
            return ERR_BITS;
        nacc -= (int)ln;
        k++;
        if (s < 256) {
            if (o >= n)
                return ERR_OVERFLOW;
            out[o++] = (uint8_t)s;
            last = s;
        } else {
            if (last < 0)
                return ERR_RUN;
            int64_t r = s - RUN_BASE - 1;  /* copies beyond the value already written */
            if (r > n - o)
                return ERR_OVERFLOW;
            memset(out + o, (uint8_t)last, (size_t)r);
            o += r;
        }
    }
    if (o != n)
        return ERR_SHORT;
    return (int64_t)pos * 8 - nacc;
}

/* 1 when every long code the tables can name indexes sorted_syms (nsorted items). */
static int tables_fit(const tables_t *t, Py_ssize_t nsorted)
{
    for (int L = LUT_BITS + 1; L <= t->maxlen; L++)
        if (t->count[L] > 0 && (t->offset[L] < 0 || t->offset[L] > nsorted
                                || t->count[L] > nsorted - t->offset[L]))
            return 0;
    return 1;
}

/* Buffers of decode_symbols' arguments. */
static const ck_want WANT[7] = {CK_IN("buf", 1),    CK_IN("lut", 8),   CK_IN("first", 8),
                                CK_IN("offset", 8), CK_IN("count", 8), CK_IN("sorted_syms", 8),
                                CK_OUT("out", 1)};

PyObject *ck_rle_decode_symbols(PyObject *self, PyObject *args)
{
    PyObject *obj[7];
    Py_ssize_t nsym, n, maxlen;
    Py_buffer v[7];
    if (!PyArg_ParseTuple(args, "OnnOOOOOnO", &obj[0], &nsym, &n, &obj[1], &obj[2], &obj[3],
                          &obj[4], &obj[5], &maxlen, &obj[6])
        || ck_buffers(obj, WANT, 7, v) < 0)
        return NULL;
    tables_t t = {v[1].buf, v[2].buf, v[3].buf, v[4].buf, v[5].buf, (int)maxlen};
    int64_t status = 0;
    if (nsym < 0 || n < 0 || v[6].len < n || maxlen < 1 || maxlen > MAX_LEN
        || ck_items(&v[1]) < (1 << LUT_BITS) || ck_items(&v[2]) < NTABLE
        || ck_items(&v[3]) < NTABLE || ck_items(&v[4]) < NTABLE)
        PyErr_Format(PyExc_ValueError, "decode_symbols: %zd symbols into %zd bytes (out holds "
                     "%zd), longest code %zd (1..%d), tables of %zd, %zd, %zd, %zd items "
                     "(%d, then %d each)", nsym, n, v[6].len, maxlen, MAX_LEN, ck_items(&v[1]),
                     ck_items(&v[2]), ck_items(&v[3]), ck_items(&v[4]), 1 << LUT_BITS, NTABLE);
    else if (!tables_fit(&t, ck_items(&v[5])))
        PyErr_SetString(PyExc_ValueError, "decode_symbols: offset and count name symbols "
                        "beyond sorted_syms");
    else if (ck_overlap(&v[0], &v[6], "decode_symbols"))
        ;
    else {
        CK_BEGIN_NOGIL(n)
        status = decode(v[0].buf, v[0].len, nsym, n, &t, v[6].buf);
        CK_END_NOGIL
    }
    return ck_done(v, 7) < 0 ? NULL : PyLong_FromLongLong(status);
}
