/* BytePlanes' encode in one call: split_rows, sample_rows, choose_methods and, where no plane
   asks for a zstd trial, pack_planes, with one release of the GIL instead of four (each time a
   background thread takes the GIL back beside a busy training loop it waits up to the switch
   interval: docs/lab/notebook.md, "A persist that asks for the GIL less"). The same steps in
   the same order as ckptcodecs/planes.py's _layout_steps, its twin; the same checks as the four
   kernels. */
#include "planes.h"

static const ck_want want[6] = {CK_IN("src", 1),     CK_OUT("out", 1),
                                CK_OUT("freq", 8),    CK_OUT("near", 8),
                                CK_OUT("repeats", 8), CK_OUT("methods", 8)};

/* 1 when the arguments fit their buffers, else 0 after a ValueError. */
static int layout_fits(const Py_buffer v[6], Py_ssize_t itemsize, Py_ssize_t base,
                       Py_ssize_t stride, Py_ssize_t step, Py_ssize_t start, Py_ssize_t length,
                       Py_ssize_t block)
{
    Py_ssize_t n = itemsize ? v[0].len / itemsize : 0;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "encode_layout: itemsize must be 1, 2, 4 or 8, not %zd",
                     itemsize);
        return 0;
    }
    if (v[0].len % itemsize || stride != PL_PLANE_HEAD + n || base < PL_PLANE_HEAD
        || block < 1) {
        PyErr_Format(PyExc_ValueError, "encode_layout: %zd bytes of %zd-byte items, planes "
                     "every %zd bytes from %zd (a plane's head and n bytes each), blocks of %zd",
                     v[0].len, itemsize, stride, base, block);
        return 0;
    }
    if (length && (step < 1 || start < 0 || length < 2 || start > n || length > n - start)) {
        PyErr_Format(PyExc_ValueError, "encode_layout: n=%zd, step=%zd and the sample [%zd, "
                     "+%zd) do not fit", n, step, start, length);
        return 0;
    }
    if (ck_items(&v[2]) < 256 * itemsize || ck_items(&v[3]) < 256 * itemsize
        || ck_items(&v[4]) < itemsize || ck_items(&v[5]) < itemsize) {
        PyErr_Format(PyExc_ValueError, "encode_layout: freq, near (256 a plane), repeats or "
                     "methods too small for %zd planes", itemsize);
        return 0;
    }
    if (!ck_runs_fit(base, itemsize, stride, n, v[1].len, "encode_layout out"))
        return 0;
    for (int a = 0; a < 6; a++)
        for (int b = a + 1; b < 6; b++)
            if (ck_overlap(&v[a], &v[b], "encode_layout"))
                return 0;
    return 1;
}

PyObject *ck_planes_encode_layout(PyObject *self, PyObject *args)
{
    PyObject *obj[6];
    Py_ssize_t itemsize, base, stride, step, start, length, block;
    int rotate;
    double below, extra;
    Py_buffer v[6];
    int64_t end = -1, trials = 0;
    if (!PyArg_ParseTuple(args, "OnpOnnnnnOOOOndd", &obj[0], &itemsize, &rotate, &obj[1],
                          &base, &stride, &step, &start, &length, &obj[2], &obj[3], &obj[4],
                          &obj[5], &block, &below, &extra)
        || ck_buffers(obj, want, 6, v) < 0)
        return NULL;
    if (layout_fits(v, itemsize, base, stride, step, start, length, block)) {
        Py_ssize_t n = v[0].len / itemsize;
        const uint8_t *src = v[0].buf;
        uint8_t *out = v[1].buf;
        int64_t *freq = v[2].buf, *near = v[3].buf, *repeats = v[4].buf, *methods = v[5].buf;
        int bmi2 = pl_bmi2();
        CK_BEGIN_NOGIL(v[0].len)
        ck_split_planes(src, n, (int)itemsize, rotate && itemsize > 1, out + base, stride);
        for (Py_ssize_t p = 0; p < itemsize; p++)
            methods[p] = PL_HUFFMAN;
        if (length) {
            memset(freq, 0, (size_t)(256 * itemsize) * sizeof *freq);
            memset(near, 0, (size_t)(256 * itemsize) * sizeof *near);
            ck_sample_planes(out + base, stride, n, itemsize, step, start, length, freq, near,
                             repeats);
            trials = pl_choose(freq, near, repeats, itemsize, (n - 1) / step + 1, length, below,
                               extra, methods);
        }
        if (!trials) {
            static const uint8_t none[1] = {0};
            int64_t zoff[9] = {0};
            end = pl_pack(out, base, n, itemsize, block, methods, none, zoff, bmi2);
        }
        CK_END_NOGIL
        if (end == PL_ERR_MEMORY)
            PyErr_NoMemory();
        else if (end < -1)
            PyErr_SetString(PyExc_ValueError, "encode_layout: a Huffman code outgrew its bound");
    }
    return ck_done(v, 6) < 0 ? NULL : Py_BuildValue("LL", (long long)end, (long long)trials);
}
