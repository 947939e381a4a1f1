/* ckptcodecs._native: the module table, buffer acquisition and bounds checks. Every kernel
   checks its buffers against the sizes it is given (a ValueError, never a read or write out of
   bounds) and releases the GIL around its loops. */
#include "native.h"

int ck_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize,
              const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd-byte items, not %zd-byte ones",
                     name, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

void ck_release(Py_buffer *views, int count)
{
    for (int i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
}

int ck_runs_fit(Py_ssize_t start, Py_ssize_t count, Py_ssize_t pitch, Py_ssize_t length,
                Py_ssize_t size, const char *what)
{
    int ok;
    if (start < 0 || count < 0 || pitch < 0 || length < 0)
        ok = 0;
    else if (count == 0 || length == 0)
        ok = 1;
    else if (start > size || length > size - start)
        ok = 0;
    else  /* (count - 1) * pitch <= size - start - length, without overflow */
        ok = count == 1 || pitch == 0 || (count - 1) <= (size - start - length) / pitch;
    if (!ok)
        PyErr_Format(PyExc_ValueError,
                     "%s: %zd runs of %zd items every %zd from item %zd do not fit in %zd "
                     "items", what, count, length, pitch, start, size);
    return ok;
}

int ck_overlap(const Py_buffer *a, const Py_buffer *b, const char *what)
{
    const char *a0 = a->buf, *b0 = b->buf;
    if (a->len == 0 || b->len == 0 || a0 + a->len <= b0 || b0 + b->len <= a0)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: the input and the output share memory", what);
    return 1;
}

static PyMethodDef methods[] = {
    {"bytegroup_split_rows", ck_split_rows, METH_VARARGS,
     "split_rows(src, itemsize, rotate, out, base, stride): byte planes of src into out."},
    {"bytegroup_merge2", ck_merge2, METH_VARARGS,
     "merge2(p0, p1, rotate, dst, rows, length, pitch, src, src_pitch): 2-byte items."},
    {"bytegroup_merge4", ck_merge4, METH_VARARGS,
     "merge4(p0, .., p3, rotate, dst, rows, length, pitch, src, src_pitch): 4-byte items."},
    {"bytegroup_merge8", ck_merge8, METH_VARARGS,
     "merge8(p0, .., p7, rotate, dst, rows, length, pitch, src, src_pitch): 8-byte items."},
    {"bytegroup_sample_rows", ck_sample_rows, METH_VARARGS,
     "sample_rows(out, base, stride, n, itemsize, step, start, length, freq, near, repeats)"
     " -> size of the strided sample."},
    {"bitpack_pack", ck_pack, METH_VARARGS, "pack(codes, bits, out): dense bit packing."},
    {"bitpack_unpack", ck_unpack, METH_VARARGS, "unpack(buf, bits, count, out)."},
    {"delta_encode", ck_delta_encode, METH_VARARGS,
     "encode(new, base, k, out): residuals mod k in base-bucket order."},
    {"delta_decode", ck_delta_decode, METH_VARARGS, "decode(res, base, k, out)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ckptcodecs._native",
    "ckptcodecs' compiled kernels (chosen by ckptcodecs._backend; numba twins are the reference).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SIMD", "portable") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
