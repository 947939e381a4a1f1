/* The protect/prune selection's passes (the twins of ckptcodecs/_select.py's _keys_hist and
   _collect): each finite value's magnitude bits, cut to a bucket key (>> shift), counted; then
   the indices of the values beyond bucket b and inside it. Values are float32 or float64 bit
   patterns (uint32 / uint64 items); excluded and non-finite ones (|bits| >= inf_bits) never
   count. */
#include "native.h"

#define BLOCK 512  /* indices collected at a time */

/* Each kernel for one width of bits: W the unsigned type. */
#define SELECT_KERNELS(W, SUFFIX)                                                             \
    /* Excluded values skipped eight at a time where none of the eight is (1% excluded: a   \
       branch right 92% of the time, and no test of each value's byte; one branch on both    \
       tests of each value ran at 0.92x numba). */                                            \
    static void hist_##SUFFIX(const W *restrict xb, Py_ssize_t n, const uint8_t *restrict excl, \
                              int shift, W inf_bits, int64_t *restrict counts)                \
    {                                                                                         \
        const W mag = (W) ~((W)1 << (sizeof(W) * 8 - 1));                                     \
        if (excl) {                                                                           \
            Py_ssize_t i = 0;                                                                 \
            for (; i + 8 <= n; i += 8) { /* eight values at once where none is excluded */    \
                if (ck_load64(excl + i) == 0) {                                               \
                    for (int k = 0; k < 8; k++) {                                             \
                        W u = xb[i + k] & mag;                                                \
                        if (u < inf_bits)                                                     \
                            counts[u >> shift]++;                                             \
                    }                                                                         \
                    continue;                                                                 \
                }                                                                             \
                for (int k = 0; k < 8; k++) {                                                 \
                    W u = xb[i + k] & mag;                                                    \
                    if (!excl[i + k] && u < inf_bits)                                         \
                        counts[u >> shift]++;                                                 \
                }                                                                             \
            }                                                                                 \
            for (; i < n; i++) {                                                              \
                W u = xb[i] & mag;                                                            \
                if (!excl[i] && u < inf_bits)                                                 \
                    counts[u >> shift]++;                                                     \
            }                                                                                 \
        } else {                                                                              \
            const Py_ssize_t line = 64 / sizeof(W);                                           \
            Py_ssize_t i = 0;                                                                 \
            for (; i + line <= n; i += line) { /* a line at a time (CK_PREFETCH) */           \
                CK_PREFETCH(xb + i, CK_AHEAD);                                                \
                _Pragma("GCC unroll 4")                                                       \
                for (Py_ssize_t j = i; j < i + line; j++) {                                   \
                    W u = xb[j] & mag;                                                        \
                    if (u < inf_bits)                                                         \
                        counts[u >> shift]++;                                                 \
                }                                                                             \
            }                                                                                 \
            for (; i < n; i++) {                                                              \
                W u = xb[i] & mag;                                                            \
                if (u < inf_bits)                                                             \
                    counts[u >> shift]++;                                                     \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* 0, or -1 when sure or cand would overflow (sizes that do not match the counts). A     \
       block of indices at a time into local lists without a branch (which side a value       \
       falls is data), then copied out after a check of the room left. */                     \
    static int collect_##SUFFIX(const W *restrict xb, Py_ssize_t n, const uint8_t *restrict excl, \
                                int shift, W inf_bits, int64_t b, int top, int64_t *sure,     \
                                Py_ssize_t nsure, int64_t *cand, Py_ssize_t ncand,            \
                                Py_ssize_t *ns, Py_ssize_t *nc)                               \
    {                                                                                         \
        const W mag = (W) ~((W)1 << (sizeof(W) * 8 - 1));                                     \
        int64_t sbuf[BLOCK], cbuf[BLOCK];                                                     \
        Py_ssize_t s = 0, c = 0;                                                              \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += BLOCK) {                                        \
            Py_ssize_t i1 = n - i0 < BLOCK ? n : i0 + BLOCK, bs = 0, bc = 0;                  \
            for (Py_ssize_t i = i0; i < i1; i++) {                                            \
                W u = xb[i] & mag;                                                            \
                int64_t key = (int64_t)(u >> shift);                                          \
                int counted = !(excl && excl[i]) & (u < inf_bits);                            \
                int inside = counted & (key == b);                                            \
                int beyond = counted & (key != b) & ((key > b) == top);                       \
                cbuf[bc] = i;                                                                 \
                bc += inside;                                                                 \
                sbuf[bs] = i;                                                                 \
                bs += beyond;                                                                 \
            }                                                                                 \
            if (bs > nsure - s || bc > ncand - c)                                             \
                return -1;                                                                    \
            memcpy(sure + s, sbuf, bs * sizeof(int64_t));                                     \
            memcpy(cand + c, cbuf, bc * sizeof(int64_t));                                     \
            s += bs;                                                                          \
            c += bc;                                                                          \
        }                                                                                     \
        *ns = s;                                                                              \
        *nc = c;                                                                              \
        return 0;                                                                             \
    }

SELECT_KERNELS(uint32_t, u32)
SELECT_KERNELS(uint64_t, u64)

/* PyArg_ParseTuple's "O&" converter of a non-negative integer (numpy's unsigned scalars
   included) to an unsigned long long. */
static int as_ull(PyObject *obj, void *out)
{
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *(unsigned long long *)out = v;
    return 1;
}

/* The common arguments (xb, excl, shift, inf_bits) checked: 0, or -1 with a ValueError. */
static int check_keys(const Py_buffer *xb, const Py_buffer *excl, unsigned long long shift,
                      unsigned long long inf_bits, const char *name)
{
    int bits = (int)xb->itemsize * 8;
    if (xb->itemsize != 4 && xb->itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "%s: bit patterns of 4 or 8 bytes, not %zd", name,
                     xb->itemsize);
        return -1;
    }
    if (excl->len != 0 && excl->len < ck_items(xb)) {
        PyErr_Format(PyExc_ValueError, "%s: an exclusion mask of %zd bytes for %zd values",
                     name, excl->len, ck_items(xb));
        return -1;
    }
    if (shift >= (unsigned long long)bits || (bits == 32 && inf_bits > UINT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "%s: shift %llu and limit %llu for %d-bit patterns",
                     name, shift, inf_bits, bits);
        return -1;
    }
    return 0;
}

/* The largest key a counted value can have (values below inf_bits, without the sign bit). */
static unsigned long long top_key(Py_ssize_t itemsize, unsigned long long shift,
                                  unsigned long long inf_bits)
{
    unsigned long long sign = 1ULL << (itemsize * 8 - 1), below = inf_bits < sign ? inf_bits
                                                                                  : sign;
    return below ? (below - 1) >> shift : 0;
}

static PyObject *ck_select_keys_hist(PyObject *self, PyObject *args)
{
    const char *name = "keys_hist";
    const ck_want want[3] = {CK_IN(name, CK_ANY), CK_IN(name, 1), CK_OUT(name, 8)};
    PyObject *obj[3];  /* xb, excl, counts */
    unsigned long long shift, inf_bits;
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OOO&O&O", &obj[0], &obj[1], as_ull, &shift, as_ull,
                          &inf_bits, &obj[2])
        || ck_buffers(obj, want, 3, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]);
    if (check_keys(&v[0], &v[1], shift, inf_bits, name) < 0)
        ;
    else if (inf_bits && top_key(v[0].itemsize, shift, inf_bits)
                             >= (unsigned long long)ck_items(&v[2]))
        PyErr_Format(PyExc_ValueError, "%s: keys up to %llu for %zd counts", name,
                     top_key(v[0].itemsize, shift, inf_bits), ck_items(&v[2]));
    else if (!ck_overlap(&v[0], &v[2], name) && !ck_overlap(&v[1], &v[2], name)) {
        const uint8_t *excl = v[1].len ? v[1].buf : NULL;
        CK_BEGIN_NOGIL(v[0].len)
        if (v[0].itemsize == 4)
            hist_u32(v[0].buf, n, excl, (int)shift, (uint32_t)inf_bits, v[2].buf);
        else
            hist_u64(v[0].buf, n, excl, (int)shift, inf_bits, v[2].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 3);
}

static PyObject *ck_select_collect(PyObject *self, PyObject *args)
{
    const char *name = "collect";
    const ck_want want[4] = {CK_IN(name, CK_ANY), CK_IN(name, 1), CK_OUT(name, 8),
                             CK_OUT(name, 8)};
    PyObject *obj[4];  /* xb, excl, sure, cand */
    unsigned long long shift, inf_bits;
    long long b;
    int top, rc;
    Py_ssize_t ns = 0, nc = 0;
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OOO&O&LpOO", &obj[0], &obj[1], as_ull, &shift, as_ull,
                          &inf_bits, &b, &top, &obj[2], &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]);
    if (check_keys(&v[0], &v[1], shift, inf_bits, name) == 0
        && !ck_overlap(&v[0], &v[2], name) && !ck_overlap(&v[0], &v[3], name)
        && !ck_overlap(&v[1], &v[2], name) && !ck_overlap(&v[1], &v[3], name)
        && !ck_overlap(&v[2], &v[3], name)) {
        const uint8_t *excl = v[1].len ? v[1].buf : NULL;
        CK_BEGIN_NOGIL(v[0].len)
        if (v[0].itemsize == 4)
            rc = collect_u32(v[0].buf, n, excl, (int)shift, (uint32_t)inf_bits, b, top,
                             v[2].buf, ck_items(&v[2]), v[3].buf, ck_items(&v[3]), &ns, &nc);
        else
            rc = collect_u64(v[0].buf, n, excl, (int)shift, inf_bits, b, top, v[2].buf,
                             ck_items(&v[2]), v[3].buf, ck_items(&v[3]), &ns, &nc);
        CK_END_NOGIL
        if (rc < 0)
            PyErr_Format(PyExc_ValueError, "%s: more values beyond or inside bucket %lld than "
                         "the %zd + %zd places given", name, b, ck_items(&v[2]),
                         ck_items(&v[3]));
    }
    return ck_done(v, 4) < 0 ? NULL : Py_BuildValue("nn", ns, nc);
}

PyMethodDef ck_select_methods[] = {
    {"select_keys_hist", ck_select_keys_hist, METH_VARARGS,
     "keys_hist(xb, excl, shift, inf_bits, counts): count each finite magnitude's bucket."},
    {"select_collect", ck_select_collect, METH_VARARGS,
     "collect(xb, excl, shift, inf_bits, b, top, sure, cand) -> (ns, nc): the indices beyond "
     "bucket b (above it if top, else below) and inside it."},
    {NULL, NULL, 0, NULL},
};
