/* The 16-bit float casts over arrays (the twins of ckptcodecs/_floats.py's numba kernels
   _bf16_bits, _f16_bits, _f32_bits and _add16): one pass over the bits, each loop built for
   AVX-512, AVX2 and the baseline CPU (CK_BUILDS in native.h: the CPU path picks). */
#include "native.h"
#include "floats.h"

CK_LOOP bf16_bits_loop(const void *src, Py_ssize_t n, void *dst)
{
    const uint32_t *restrict u = src;
    uint16_t *restrict out = dst;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = ck_bf16_of(u[i]);
}
CK_BUILDS(bf16_bits, (const void *src, Py_ssize_t n, void *dst),
          (src, n, dst))

CK_LOOP f16_bits_loop(const void *src, Py_ssize_t n, void *dst)
{
    const uint32_t *restrict u = src;
    uint16_t *restrict out = dst;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = ck_f16_of(u[i]);
}
CK_BUILDS(f16_bits, (const void *src, Py_ssize_t n, void *dst),
          (src, n, dst))

CK_LOOP f32_bits_loop(const void *src, Py_ssize_t n, void *dst)
{
    const uint16_t *restrict h = src;
    uint32_t *restrict out = dst;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = ck_f32_of_f16(h[i]);
}
CK_BUILDS(f32_bits, (const void *src, Py_ssize_t n, void *dst),
          (src, n, dst))

/* base + residual of 16-bit float bits (float16 if half, else bfloat16), summed in float32; a
   sum of finite values beyond +-top saturates at it; rounded once. Selects, no branches. */
static inline uint16_t add16_one(uint16_t base, uint16_t residual, int half, float top)
{
    uint32_t bb = half ? ck_f32_of_f16(base) : (uint32_t)base << 16;
    uint32_t rb = half ? ck_f32_of_f16(residual) : (uint32_t)residual << 16;
    float b = ck_float_of(bb), r = ck_float_of(rb);
    /* a NaN base wins over a NaN residual, as x86's add in the reference's operand order (the
       compiler may swap the operands of b + r) */
    int b_nan = (bb & 0x7FFFFFFFu) > 0x7F800000u;
    int finite = ((bb & 0x7F800000u) != 0x7F800000u) & ((rb & 0x7F800000u) != 0x7F800000u);
    uint32_t t = ck_pick(b_nan, bb | 0x400000u, ck_bits_of(b + r));
    uint32_t beyond = (t & 0x7FFFFFFFu) > ck_bits_of(top);  /* |t| > top, or NaN */
    t = ck_pick(beyond & finite, (t & 0x80000000u) | ck_bits_of(top), t);
    return half ? ck_f16_of(t) : ck_bf16_of(t);
}

/* out may be base or residual (item by item), so no restrict. */
CK_LOOP add16_f16_loop(const uint16_t *base, const uint16_t *residual, Py_ssize_t n,
                                float top, uint16_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = add16_one(base[i], residual[i], 1, top);
}
CK_BUILDS(add16_f16, (const uint16_t *base, const uint16_t *residual, Py_ssize_t n, float top,
          uint16_t *out),
          (base, residual, n, top, out))

CK_LOOP add16_bf16_loop(const uint16_t *base, const uint16_t *residual, Py_ssize_t n,
                                 float top, uint16_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = add16_one(base[i], residual[i], 0, top);
}
CK_BUILDS(add16_bf16, (const uint16_t *base, const uint16_t *residual, Py_ssize_t n, float top,
          uint16_t *out),
          (base, residual, n, top, out))

typedef void (*cast_kernel)(const void *, Py_ssize_t, void *);

/* Parse (src, out), check that out holds src's items and shares none of its bytes, run
   `kernel` without the GIL. */
static PyObject *cast(PyObject *args, Py_ssize_t in_size, Py_ssize_t out_size,
                      cast_kernel kernel, const char *name)
{
    const ck_want want[2] = {CK_IN(name, in_size), CK_OUT(name, out_size)};
    PyObject *obj[2];
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OO", &obj[0], &obj[1]) || ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]);
    if (ck_items(&v[1]) < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd values into room for %zd", name, n,
                     ck_items(&v[1]));
    else if (!ck_overlap(&v[0], &v[1], name)) {
        CK_BEGIN_NOGIL(v[0].len)
        kernel(v[0].buf, n, v[1].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 2);
}

static PyObject *ck_floats_bf16_bits(PyObject *self, PyObject *args)
{
    return cast(args, 4, 2, bf16_bits, "floats bf16_bits");
}

static PyObject *ck_floats_f16_bits(PyObject *self, PyObject *args)
{
    return cast(args, 4, 2, f16_bits, "floats f16_bits");
}

static PyObject *ck_floats_f32_bits(PyObject *self, PyObject *args)
{
    return cast(args, 2, 4, f32_bits, "floats f32_bits");
}

/* out may be base or residual exactly (item by item in place), not a shifted copy of them. */
static int shifted(const Py_buffer *in, const Py_buffer *out, const char *name)
{
    return in->buf != out->buf && ck_overlap(in, out, name);
}

/* add16(base, residual, half, top, out) */
static PyObject *ck_floats_add16(PyObject *self, PyObject *args)
{
    const char *name = "floats add16";
    const ck_want want[3] = {CK_IN(name, 2), CK_IN(name, 2), CK_OUT(name, 2)};
    PyObject *obj[3];
    int half;
    float top;
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OOpfO", &obj[0], &obj[1], &half, &top, &obj[2])
        || ck_buffers(obj, want, 3, v) < 0)
        return NULL;
    Py_ssize_t n = ck_items(&v[0]);
    if (ck_items(&v[1]) != n || ck_items(&v[2]) < n)
        PyErr_Format(PyExc_ValueError, "%s: %zd base values and %zd residuals into room for "
                     "%zd", name, n, ck_items(&v[1]), ck_items(&v[2]));
    else if (!shifted(&v[0], &v[2], name) && !shifted(&v[1], &v[2], name)) {
        CK_BEGIN_NOGIL(v[0].len)
        (half ? add16_f16 : add16_bf16)(v[0].buf, v[1].buf, n, top, v[2].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 3);
}

PyMethodDef ck_floats_methods[] = {
    {"floats_bf16_bits", ck_floats_bf16_bits, METH_VARARGS,
     "bf16_bits(u32, out16): bfloat16 bits of float32 bits."},
    {"floats_f16_bits", ck_floats_f16_bits, METH_VARARGS,
     "f16_bits(u32, out16): float16 bits of float32 bits (numpy's cast)."},
    {"floats_f32_bits", ck_floats_f32_bits, METH_VARARGS,
     "f32_bits(h16, out32): float32 bits of float16 bits (exact)."},
    {"floats_add16", ck_floats_add16, METH_VARARGS,
     "add16(base, residual, half, top, out): 16-bit float sums rounded once."},
    {NULL, NULL, 0, NULL},
};
