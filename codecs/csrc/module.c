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
     "set_simd(name): the CPU path of the byte transposes, 'auto' (the best this CPU runs), "
     "'portable' (plain loops), 'sse2' or 'avx2'; ValueError where it cannot run."},
    {"simd", simd, METH_NOARGS, "simd() -> the name of the CPU path in use."},
    {"simd_paths", simd_paths, METH_NOARGS, "simd_paths() -> the paths this build and CPU run."},
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
    {"rle_huffman_encode_stream", ck_rle_encode_stream, METH_VARARGS,
     "encode_stream(data, head) -> (out, end, nsym, used, lens): RLE + Huffman in one call."},
    {"rle_huffman_code_lengths", ck_rle_code_lengths, METH_VARARGS,
     "code_lengths(freq, lens): length-limited Huffman code lengths (int64 tables)."},
    {"rle_huffman_canonical_codes", ck_rle_canonical_codes, METH_VARARGS,
     "canonical_codes(lens, codes): canonical codes of the code lengths."},
    {"rle_huffman_decode_symbols", ck_rle_decode_symbols, METH_VARARGS,
     "decode_symbols(buf, nsym, n, lut, first, offset, count, sorted_syms, maxlen, out)"
     " -> bits consumed, or a negative error code."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ckptcodecs._native",
    "ckptcodecs' compiled kernels (chosen by ckptcodecs._backend; numba twins are the reference).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    if (ck_set_simd("auto") < 0)  /* until ckptcodecs._backend sets CKPTCODECS_SIMD's */
        return NULL;
    return PyModule_Create(&module);
}
