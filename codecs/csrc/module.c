/* ckptcodecs._native: the module table, buffer acquisition (ck_buffer; ck_buffers and the
   wrappers' tail ck_done are inline in native.h) and bounds checks. Every kernel checks its
   buffers against the sizes it is given (a ValueError, never a read or write out of bounds)
   and releases the GIL around its loops where they are long enough to pay (CK_BEGIN_NOGIL,
   native.h). */
#include "native.h"

/* 1 when a view's items are float32 or float64 by its format and item size. */
static int float_format(const Py_buffer *view)
{
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return ((f[0] == 'f' && view->itemsize == 4) || (f[0] == 'd' && view->itemsize == 8))
           && f[1] == '\0';
}

int ck_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize,
              const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | (itemsize != CK_ANY ? PyBUF_FORMAT : 0)
                | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *format = view->format ? view->format : "B";
    if (itemsize == CK_ANY || (itemsize > 0 && view->itemsize == itemsize)
        || (itemsize <= CK_FLOAT && float_format(view)))
        return 0;
    if (itemsize == CK_FLOAT)
        PyErr_Format(PyExc_ValueError, "%s must be float32 or float64, not of format '%s'",
                     name, format);
    else if (itemsize == CK_FLOAT_KM)
        PyErr_Format(PyExc_ValueError, "%s: expected float32 or float64 values, not format %s",
                     name, format);
    else
        PyErr_Format(PyExc_ValueError, "%s must hold %zd-byte items, not %zd-byte ones",
                     name, itemsize, view->itemsize);
    PyBuffer_Release(view);
    return -1;
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

Py_ssize_t ck_nogil_min = CK_NOGIL_MIN;

/* nogil_min(bytes): the work below which kernels keep the GIL (native.h), from now on in this
   process; returns the previous one. */
static PyObject *nogil_min(PyObject *self, PyObject *arg)
{
    Py_ssize_t bytes = PyLong_AsSsize_t(arg);
    if (bytes == -1 && PyErr_Occurred())
        return NULL;
    if (bytes < 0)
        return PyErr_Format(PyExc_ValueError, "nogil_min: %zd bytes (0 or more)", bytes);
    Py_ssize_t before = ck_nogil_min;
    ck_nogil_min = bytes;
    return PyLong_FromSsize_t(before);
}

static PyObject *set_simd(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || ck_set_simd(name) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *simd(PyObject *self, PyObject *unused) { return PyUnicode_FromString(ck_simd()); }

static PyObject *simd_paths(PyObject *self, PyObject *unused) { return ck_simd_paths(); }

static PyMethodDef methods[] = {
    {"set_simd", set_simd, METH_O,
     "set_simd(name): the CPU path of the compiled kernels, 'auto' (the best this CPU runs), "
     "'portable' (plain loops), 'sse2', 'avx2' or 'avx512'; ValueError where it cannot run."},
    {"simd", simd, METH_NOARGS, "simd() -> the name of the CPU path in use."},
    {"simd_paths", simd_paths, METH_NOARGS, "simd_paths() -> the paths this build and CPU run."},
    {"nogil_min", nogil_min, METH_O,
     "nogil_min(bytes) -> the previous setting: kernels release the GIL only around work of at "
     "least this many bytes (0: always)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ckptcodecs._native",
    "ckptcodecs' compiled kernels (chosen by ckptcodecs._backend; numba twins are the reference).",
    -1, methods, NULL, NULL, NULL, NULL,
};

/* Each kernel family's table (its C file ends with it); a new family adds its line here and
   its declaration in native.h. */
static PyMethodDef *const families[] = {
    ck_bytegroup_methods, ck_bitpack_methods, ck_delta_methods, ck_rle_huffman_methods,
    ck_quant_methods, ck_select_methods,
    ck_planes_methods,
    ck_floats_methods, ck_kmeans_methods,
    ck_adaptive_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    if (ck_set_simd("auto") < 0)  /* until ckptcodecs._backend sets CKPTCODECS_SIMD's */
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (PyModule_AddFunctions(m, families[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
