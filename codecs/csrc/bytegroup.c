/* Byte grouping of BytePlanes (the twins of ckptcodecs/_bytegroup.py's numba kernels): split
   items into byte planes, merge planes back into items (whole arrays or blocks of rows and
   columns), and sample the planes for the choice of each plane's coding. */
#include "native.h"

static void split2(const uint8_t *restrict src, Py_ssize_t n, int rotate,
                   uint8_t *restrict p0, uint8_t *restrict p1)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t x = ck_load16(src + 2 * i);
        if (rotate)
            x = (uint16_t)((x << 1) | (x >> 15));
        p0[i] = (uint8_t)x;
        p1[i] = (uint8_t)(x >> 8);
    }
}

static void split4(const uint8_t *restrict src, Py_ssize_t n, int rotate, uint8_t *restrict p0,
                   uint8_t *restrict p1, uint8_t *restrict p2, uint8_t *restrict p3)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t x = ck_load32(src + 4 * i);
        if (rotate)
            x = (x << 1) | (x >> 31);
        p0[i] = (uint8_t)x;
        p1[i] = (uint8_t)(x >> 8);
        p2[i] = (uint8_t)(x >> 16);
        p3[i] = (uint8_t)(x >> 24);
    }
}

static void split8(const uint8_t *restrict src, Py_ssize_t n, int rotate,
                   uint8_t *const *planes)
{
    uint8_t *restrict p0 = planes[0], *restrict p1 = planes[1], *restrict p2 = planes[2];
    uint8_t *restrict p3 = planes[3], *restrict p4 = planes[4], *restrict p5 = planes[5];
    uint8_t *restrict p6 = planes[6], *restrict p7 = planes[7];
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = ck_load64(src + 8 * i);
        if (rotate)
            x = (x << 1) | (x >> 63);
        p0[i] = (uint8_t)x;
        p1[i] = (uint8_t)(x >> 8);
        p2[i] = (uint8_t)(x >> 16);
        p3[i] = (uint8_t)(x >> 24);
        p4[i] = (uint8_t)(x >> 32);
        p5[i] = (uint8_t)(x >> 40);
        p6[i] = (uint8_t)(x >> 48);
        p7[i] = (uint8_t)(x >> 56);
    }
}

/* Plane p of the n items of src at out + p * stride (stride >= n: the planes do not overlap,
   and src is another buffer than out): blocks of 16 items by vector code, the rest here. */
static void split_planes(const uint8_t *src, Py_ssize_t n, int itemsize, int rotate,
                         uint8_t *out, Py_ssize_t stride)
{
    uint8_t *p[8] = {0};
    if (itemsize == 1) {
        memmove(out, src, (size_t)n);
        return;
    }
    for (int k = 0; k < itemsize; k++)
        p[k] = out + k * stride;
    Py_ssize_t done = ck_split_blocks(src, n, itemsize, rotate, p);
    for (int k = 0; k < itemsize; k++)
        p[k] += done;
    src += done * itemsize;
    n -= done;
    if (itemsize == 2)
        split2(src, n, rotate, p[0], p[1]);
    else if (itemsize == 4)
        split4(src, n, rotate, p[0], p[1], p[2], p[3]);
    else
        split8(src, n, rotate, p);
}

static PyObject *ck_split_rows(PyObject *self, PyObject *args)
{
    static const ck_want want[2] = {CK_IN("split_rows src", 1), CK_OUT("split_rows out", 1)};
    PyObject *obj[2];
    Py_ssize_t itemsize, base, stride;
    int rotate;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnpOnn", &obj[0], &itemsize, &rotate, &obj[1], &base,
                          &stride))
        return NULL;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8)
        return PyErr_Format(PyExc_ValueError, "split_rows: itemsize must be 1, 2, 4 or 8, "
                            "not %zd", itemsize);
    if (ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].len / itemsize;
    if (v[0].len % itemsize) {
        PyErr_Format(PyExc_ValueError, "split_rows: %zd bytes are not whole %zd-byte items",
                     v[0].len, itemsize);
    } else if (itemsize > 1 && stride < n) {
        PyErr_Format(PyExc_ValueError, "split_rows: planes of %zd bytes every %zd bytes "
                     "overlap", n, stride);
    } else if (!ck_overlap(&v[0], &v[1], "split_rows")
               && ck_runs_fit(base, itemsize, stride, n, v[1].len, "split_rows out")) {
        const uint8_t *src = v[0].buf;
        uint8_t *out = (uint8_t *)v[1].buf + base;
        CK_BEGIN_NOGIL(v[0].len)
        split_planes(src, n, (int)itemsize, rotate && itemsize > 1, out, stride);
        CK_END_NOGIL
    }
    return ck_none(v, 2);
}

/* Runs of `length` items: run r from item src + r * src_pitch of the planes to item
   r * pitch of dst, each item `nplanes` bytes, lowest byte first, rotated right when asked. */
typedef struct {
    const uint8_t *planes[8];
    int nplanes, rotate;
    void *dst;
    Py_ssize_t rows, length, pitch, src, src_pitch;
} merge_job;

/* One run of each width: `length` items from item s of the planes into d. */
static void run2(const uint8_t *restrict p0, const uint8_t *restrict p1, Py_ssize_t s,
                 Py_ssize_t length, int rotate, uint16_t *restrict d)
{
    p0 += s, p1 += s;
    for (Py_ssize_t i = 0; i < length; i++) {
        uint16_t x = (uint16_t)(p0[i] | (p1[i] << 8));
        d[i] = rotate ? (uint16_t)((x >> 1) | (x << 15)) : x;
    }
}

static void run4(const uint8_t *const *planes, Py_ssize_t s, Py_ssize_t length, int rotate,
                 uint32_t *restrict d)
{
    const uint8_t *restrict p0 = planes[0] + s, *restrict p1 = planes[1] + s;
    const uint8_t *restrict p2 = planes[2] + s, *restrict p3 = planes[3] + s;
    for (Py_ssize_t i = 0; i < length; i++) {
        uint32_t x = (uint32_t)p0[i] | ((uint32_t)p1[i] << 8) | ((uint32_t)p2[i] << 16)
                     | ((uint32_t)p3[i] << 24);
        d[i] = rotate ? (x >> 1) | (x << 31) : x;
    }
}

static void run8(const uint8_t *const *planes, Py_ssize_t s, Py_ssize_t length, int rotate,
                 uint64_t *restrict d)
{
    const uint8_t *restrict p0 = planes[0] + s, *restrict p1 = planes[1] + s;
    const uint8_t *restrict p2 = planes[2] + s, *restrict p3 = planes[3] + s;
    const uint8_t *restrict p4 = planes[4] + s, *restrict p5 = planes[5] + s;
    const uint8_t *restrict p6 = planes[6] + s, *restrict p7 = planes[7] + s;
    for (Py_ssize_t i = 0; i < length; i++) {
        uint64_t x = (uint64_t)p0[i] | ((uint64_t)p1[i] << 8) | ((uint64_t)p2[i] << 16)
                     | ((uint64_t)p3[i] << 24) | ((uint64_t)p4[i] << 32)
                     | ((uint64_t)p5[i] << 40) | ((uint64_t)p6[i] << 48)
                     | ((uint64_t)p7[i] << 56);
        d[i] = rotate ? (x >> 1) | (x << 63) : x;
    }
}

void ck_merge_items(const uint8_t *const *planes, Py_ssize_t count, int itemsize, int rotate,
                    uint8_t *dst)
{
    Py_ssize_t done = ck_merge_blocks(planes, count, itemsize, rotate, dst);
    if (itemsize == 2)
        run2(planes[0], planes[1], done, count - done, rotate, (uint16_t *)dst + done);
    else if (itemsize == 4)
        run4(planes, done, count - done, rotate, (uint32_t *)dst + done);
    else
        run8(planes, done, count - done, rotate, (uint64_t *)dst + done);
}

/* dst is another buffer than the planes (checked by the caller: its runs may overlap each
   other when pitch < length, as in the reference, run after run). */
static void merge_runs(const merge_job *j)
{
    const int n = j->nplanes;
    const uint8_t *p[8];
    for (Py_ssize_t r = 0; r < j->rows; r++) {
        Py_ssize_t s = j->src + r * j->src_pitch, d = r * j->pitch;
        for (int k = 0; k < n; k++)
            p[k] = j->planes[k] + s;
        Py_ssize_t done = ck_merge_blocks(p, j->length, n, j->rotate, (uint8_t *)j->dst + d * n);
        s += done, d += done;
        if (n == 2)
            run2(j->planes[0], j->planes[1], s, j->length - done, j->rotate,
                 (uint16_t *)j->dst + d);
        else if (n == 4)
            run4(j->planes, s, j->length - done, j->rotate, (uint32_t *)j->dst + d);
        else
            run8(j->planes, s, j->length - done, j->rotate, (uint64_t *)j->dst + d);
    }
}

static PyObject *merge(PyObject *args, int nplanes, const char *name)
{
    merge_job job = {.nplanes = nplanes};
    Py_buffer v[9];
    int held = 0;
    PyObject *rest;
    if (PyTuple_GET_SIZE(args) != nplanes + 7)
        return PyErr_Format(PyExc_TypeError, "%s takes %d arguments", name, nplanes + 7);
    PyObject *dst_obj;
    rest = PyTuple_GetSlice(args, nplanes, nplanes + 7);
    if (rest == NULL)
        return NULL;
    int ok = PyArg_ParseTuple(rest, "pOnnnnn", &job.rotate, &dst_obj, &job.rows, &job.length,
                              &job.pitch, &job.src, &job.src_pitch);
    Py_DECREF(rest);
    if (!ok)
        return NULL;
    for (; held < nplanes; held++) {
        if (ck_buffer(PyTuple_GET_ITEM(args, held), &v[held], 0, 1, "merge plane") < 0)
            goto fail;
        if (!ck_runs_fit(job.src, job.rows, job.src_pitch, job.length, v[held].len,
                         "merge plane")) {
            held++;
            goto fail;
        }
        job.planes[held] = v[held].buf;
    }
    if (ck_buffer(dst_obj, &v[held], 1, nplanes, "merge dst") < 0)
        goto fail;
    held++;
    if (!ck_runs_fit(0, job.rows, job.pitch, job.length, ck_items(&v[nplanes]), "merge dst"))
        goto fail;
    for (int p = 0; p < nplanes; p++)
        if (ck_overlap(&v[p], &v[nplanes], name))
            goto fail;
    job.dst = v[nplanes].buf;
    CK_BEGIN_NOGIL(ck_work(ck_work(job.rows, job.length), nplanes))
    merge_runs(&job);
    CK_END_NOGIL
fail:
    return ck_none(v, held);
}

static PyObject *ck_merge2(PyObject *self, PyObject *args) { return merge(args, 2, "merge2"); }
static PyObject *ck_merge4(PyObject *self, PyObject *args) { return merge(args, 4, "merge4"); }
static PyObject *ck_merge8(PyObject *self, PyObject *args) { return merge(args, 8, "merge8"); }

/* The histograms and repeats of one plane (see sample_rows). */
static void sample_plane(const uint8_t *row, Py_ssize_t n, Py_ssize_t step, Py_ssize_t start,
                         Py_ssize_t length, int64_t *freq, int64_t *near, int64_t *repeats)
{
    int64_t lanes[4][256];
    int64_t same = 0;
    Py_ssize_t i = start, end = start + length;
    for (Py_ssize_t k = 0; k < n; k += step)
        freq[row[k]]++;
    memset(lanes, 0, sizeof lanes);
    for (; i + 4 <= end; i += 4) {  /* 4 counters a byte: a run does not wait on itself */
        lanes[0][row[i]]++;
        lanes[1][row[i + 1]]++;
        lanes[2][row[i + 2]]++;
        lanes[3][row[i + 3]]++;
    }
    for (; i < end; i++)
        lanes[0][row[i]]++;
    for (Py_ssize_t k = start; k + 1 < end; k++)
        same += row[k] == row[k + 1];
    for (int b = 0; b < 256; b++)
        near[b] += lanes[0][b] + lanes[1][b] + lanes[2][b] + lanes[3][b];
    *repeats = same;
}

static PyObject *ck_sample_rows(PyObject *self, PyObject *args)
{
    static const ck_want want[4] = {CK_IN("sample_rows out", 1), CK_OUT("sample_rows freq", 8),
                                    CK_OUT("sample_rows near", 8),
                                    CK_OUT("sample_rows repeats", 8)};
    PyObject *obj[4];
    Py_ssize_t base, stride, n, itemsize, step, start, length;
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OnnnnnnnOOO", &obj[0], &base, &stride, &n, &itemsize, &step,
                          &start, &length, &obj[1], &obj[2], &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    if (n < 0 || itemsize < 0 || step < 1 || start < 0 || length < 0 || start > n
        || length > n - start) {
        PyErr_Format(PyExc_ValueError, "sample_rows: n=%zd, itemsize=%zd, step=%zd and the "
                     "sample [%zd, +%zd) do not fit", n, itemsize, step, start, length);
    } else if (itemsize > ck_items(&v[1]) / 256 || itemsize > ck_items(&v[2]) / 256
               || itemsize > ck_items(&v[3])) {
        PyErr_Format(PyExc_ValueError, "sample_rows: freq, near (256 a plane) or repeats "
                     "too small for %zd planes", itemsize);
    } else if (ck_runs_fit(base, itemsize, stride, n, v[0].len, "sample_rows out")) {
        const uint8_t *out = (const uint8_t *)v[0].buf + base;
        int64_t *freq = v[1].buf, *near = v[2].buf, *rep = v[3].buf;
        CK_BEGIN_NOGIL(itemsize * (length + n / step))
        for (Py_ssize_t p = 0; p < itemsize; p++)
            sample_plane(out + p * stride, n, step, start, length, freq + 256 * p,
                         near + 256 * p, rep + p);
        CK_END_NOGIL
    }
    if (ck_done(v, 4) < 0)
        return NULL;
    return PyLong_FromSsize_t(itemsize > 0 && n > 0 ? (n - 1) / step + 1 : 0);
}

/* The planes' steps without their checks, for BytePlanes' one-call encode (planes_layout.c). */
void ck_split_planes(const uint8_t *src, Py_ssize_t n, int itemsize, int rotate, uint8_t *out,
                     Py_ssize_t stride)
{
    split_planes(src, n, itemsize, rotate, out, stride);
}

void ck_sample_planes(const uint8_t *out, Py_ssize_t stride, Py_ssize_t n, Py_ssize_t itemsize,
                      Py_ssize_t step, Py_ssize_t start, Py_ssize_t length, int64_t *freq,
                      int64_t *near, int64_t *repeats)
{
    for (Py_ssize_t p = 0; p < itemsize; p++)
        sample_plane(out + p * stride, n, step, start, length, freq + 256 * p, near + 256 * p,
                     repeats + p);
}

PyMethodDef ck_bytegroup_methods[] = {
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
    {NULL, NULL, 0, NULL},
};
