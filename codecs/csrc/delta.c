/* BucketDelta's residuals (the twins of ckptcodecs/delta.py's numba kernels): residuals
   (new - base) mod k, laid out bucket by bucket of the base codes (stable within a bucket). */
#include "native.h"

/* Start of each base code's bucket into pos[0..k); 0 when a base code is >= k. Four
   histograms, summed at the end: a run of one code does not wait on its own counter. */
static int bucket_offsets(const uint8_t *base, Py_ssize_t n, int k, int64_t *pos)
{
    int64_t cnt[4][256];
    Py_ssize_t i = 0;
    memset(cnt, 0, sizeof cnt);
    for (; i + 4 <= n; i += 4) {
        cnt[0][base[i]]++;
        cnt[1][base[i + 1]]++;
        cnt[2][base[i + 2]]++;
        cnt[3][base[i + 3]]++;
    }
    for (; i < n; i++)
        cnt[0][base[i]]++;
    for (int b = 0; b < 256; b++)
        cnt[0][b] += cnt[1][b] + cnt[2][b] + cnt[3][b];
    for (int b = k; b < 256; b++)
        if (cnt[0][b])
            return 0;
    int64_t at = 0;
    for (int b = 0; b < k; b++) {
        pos[b] = at;
        at += cnt[0][b];
    }
    return 1;
}

static int encode(const uint8_t *new, const uint8_t *base, Py_ssize_t n, int k, uint8_t *out)
{
    int64_t pos[256];
    uint8_t *next[256];  /* each bucket's next residual */
    if (!bucket_offsets(base, n, k, pos))
        return 0;
    for (int b = 0; b < k; b++)
        next[b] = out + pos[b];
    for (Py_ssize_t i = 0; i < n; i++) {
        int b = base[i];
        int d = (int)new[i] - b;
        *next[b]++ = (uint8_t)(d + (k & -(d < 0)));  /* no branch: d < 0 is data */
    }
    return 1;
}

static int decode(const uint8_t *res, const uint8_t *base, Py_ssize_t n, int k, uint8_t *out)
{
    int64_t pos[256];  /* each bucket's next residual */
    if (!bucket_offsets(base, n, k, pos))
        return 0;
    /* Four values a step, as numba's loop (gcc did not unroll it: 0.85-0.95x numba). */
#pragma GCC unroll 4
    for (Py_ssize_t i = 0; i < n; i++) {
        int b = base[i];
        int v = b + res[pos[b]++];
        out[i] = (uint8_t)(v - (k & -(v >= k)));  /* no branch: v >= k is data */
    }
    return 1;
}

typedef int (*delta_kernel)(const uint8_t *, const uint8_t *, Py_ssize_t, int, uint8_t *);

/* Parse (first, base, k, out), check sizes, run `kernel` without the GIL. */
static PyObject *run(PyObject *args, delta_kernel kernel, const char *name)
{
    const ck_want want[3] = {CK_IN(name, 1), CK_IN(name, 1), CK_OUT(name, 1)};
    PyObject *obj[3];
    Py_ssize_t k;
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OOnO", &obj[0], &obj[1], &k, &obj[2]))
        return NULL;
    if (k < 1 || k > 256)
        return PyErr_Format(PyExc_ValueError, "%s: k must be in 1..256, not %zd", name, k);
    if (ck_buffers(obj, want, 3, v) < 0)
        return NULL;
    Py_ssize_t n = v[1].len;
    if (v[0].len != n || v[2].len < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd codes against %zd base codes into %zd bytes",
                     name, v[0].len, n, v[2].len);
    else if (ck_overlap(&v[0], &v[2], name) || ck_overlap(&v[1], &v[2], name))
        ;  /* the buckets are read while out is written: out may share no byte with them */
    else {
        int ok;
        CK_BEGIN_NOGIL(n)
        ok = kernel(v[0].buf, v[1].buf, n, (int)k, v[2].buf);
        CK_END_NOGIL
        if (!ok)
            PyErr_Format(PyExc_ValueError, "%s: a base code is not below k=%zd", name, k);
    }
    return ck_none(v, 3);
}

static PyObject *ck_delta_encode(PyObject *self, PyObject *args)
{
    return run(args, encode, "delta encode");
}

static PyObject *ck_delta_decode(PyObject *self, PyObject *args)
{
    return run(args, decode, "delta decode");
}

PyMethodDef ck_delta_methods[] = {
    {"delta_encode", ck_delta_encode, METH_VARARGS,
     "encode(new, base, k, out): residuals mod k in base-bucket order."},
    {"delta_decode", ck_delta_decode, METH_VARARGS, "decode(res, base, k, out)."},
    {NULL, NULL, 0, NULL},
};
