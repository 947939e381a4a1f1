/* BytePlanes' choice and layout of the planes (the twins of ckptcodecs/_pkernels.py's
   choose_methods, with _entropy, and pack_planes): each plane raw, Huffman or zstd from the
   samples' histograms, then the planes moved into the payload's layout, each Huffman plane
   coded where its code is smaller. The float operations are the numba kernel's, in its order. */
#include <math.h>

#include "planes.h"

#define PLANE_HEAD 9  /* u8 method, u64 size */

/* Entropy in bits, sum of squared shares and largest share of a histogram of `count`. */
static void entropy(const int64_t *freq, int64_t count, double out[3])
{
    double h = 0.0, same = 0.0, most = 0.0;
    for (int v = 0; v < 256; v++)
        if (freq[v]) {
            double share = (double)freq[v] / (double)count;
            h -= share * log2(share);
            same += share * share;
            most = share > most ? share : most;
        }
    out[0] = h, out[1] = same, out[2] = most;
}

static int64_t choose(const int64_t *freq, const int64_t *near, const int64_t *repeats,
                      int64_t planes, int64_t count, int64_t length, double below, double extra,
                      int64_t *methods)
{
    int64_t trials = 0;
    for (int64_t p = 0; p < planes; p++) {
        double f[3], c[3];
        entropy(freq + 256 * p, count, f);
        methods[p] = f[0] / 8 < below ? PL_HUFFMAN : PL_RAW;
        entropy(near + 256 * p, length, c);
        if ((double)repeats[p] / (double)(length - 1) > c[1] + extra || c[2] > 0.5)
            trials |= (int64_t)1 << p;
    }
    return trials;
}

PyObject *ck_planes_choose_methods(PyObject *self, PyObject *args)
{
    static const ck_want want[4] = {CK_IN("freq", 8), CK_IN("near", 8), CK_IN("repeats", 8),
                                    CK_OUT("methods", 8)};
    PyObject *obj[4];
    Py_ssize_t count, length;
    double below, extra;
    Py_buffer v[4];
    int64_t trials = 0;
    if (!PyArg_ParseTuple(args, "OOOnnddO", &obj[0], &obj[1], &obj[2], &count, &length, &below,
                          &extra, &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    Py_ssize_t planes = ck_items(&v[0]) / 256;
    if (ck_items(&v[0]) % 256 || planes > 63 || ck_items(&v[1]) < 256 * planes
        || ck_items(&v[2]) < planes || ck_items(&v[3]) < planes || count < 1 || length < 2)
        PyErr_Format(PyExc_ValueError, "choose_methods: %zd histogram items (at most 63 rows "
                     "of 256), near %zd, repeats %zd, methods %zd, count %zd (>= 1), length %zd"
                     " (>= 2)", ck_items(&v[0]), ck_items(&v[1]), ck_items(&v[2]),
                     ck_items(&v[3]), count, length);
    else if (!ck_overlap(&v[3], &v[0], "choose_methods")
             && !ck_overlap(&v[3], &v[1], "choose_methods")
             && !ck_overlap(&v[3], &v[2], "choose_methods")) {
        CK_BEGIN_NOGIL(v[0].len)
        trials = choose(v[0].buf, v[1].buf, v[2].buf, planes, count, length, below, extra,
                        v[3].buf);
        CK_END_NOGIL
    }
    return ck_done(v, 4) < 0 ? NULL : PyLong_FromLongLong(trials);
}

typedef struct {
    uint8_t *out;
    int64_t base, n, itemsize, block;
    int64_t *methods;
    const uint8_t *zbuf;
    const int64_t *zoff;
    int bmi2;
} pack_t;

/* Code plane `row` of p's Huffman plane into out[at] where smaller: its size, or n (RAW), or a
   PL_ERR_* code. */
static int64_t huffman_plane(const pack_t *k, int64_t row, int64_t at, int64_t *tables,
                             uint8_t **scratch, int64_t *room)
{
    int64_t nblocks = (k->n + k->block - 1) / k->block, *lens = tables + 256 * nblocks;
    pl_stats(k->out + row, k->n, k->block, tables, k->bmi2);
    int64_t bound = pl_lengths(tables, nblocks, lens);
    if (bound - 3 * nblocks >= k->n)
        return k->n;
    if (*room < bound + 8) {  /* the code of a plane would overwrite its own row */
        free(*scratch);
        *room = bound + 8;
        if ((*scratch = malloc((size_t)*room)) == NULL)
            return PL_ERR_MEMORY;
    }
    int64_t size = pl_encode_lengths(k->out + row, k->n, k->block, lens, *scratch, *room,
                                     k->bmi2);
    if (size >= 0 && size < k->n)
        memcpy(k->out + at, *scratch, (size_t)size);
    return size < 0 || size < k->n ? size : k->n;
}

static int64_t pack(const pack_t *k)
{
    int64_t stride = PLANE_HEAD + k->n, pos = k->base - PLANE_HEAD, room = 0, status = 0;
    int64_t nblocks = (k->n + k->block - 1) / k->block;
    int64_t *tables = malloc((size_t)(512 * nblocks + 1) * sizeof *tables);
    uint8_t *scratch = NULL;
    if (tables == NULL)
        return PL_ERR_MEMORY;
    for (int64_t p = 0; p < k->itemsize && status >= 0; p++) {
        int64_t row = k->base + p * stride, method = k->methods[p], size = k->n;
        int64_t at = pos + PLANE_HEAD;
        if (method == PL_ZSTD) {
            size = k->zoff[p + 1] - k->zoff[p];
            memmove(k->out + at, k->zbuf + k->zoff[p], (size_t)size);
        } else if (method == PL_HUFFMAN) {
            size = status = huffman_plane(k, row, at, tables, &scratch, &room);
            if (status < 0)
                break;
            if (size == k->n)
                method = PL_RAW;
        }
        if (method == PL_RAW && at != row)  /* to a lower address */
            memmove(k->out + at, k->out + row, (size_t)k->n);
        k->out[pos] = (uint8_t)method;
        for (int t = 0; t < 8; t++)
            k->out[pos + 1 + t] = (uint8_t)((uint64_t)size >> (8 * t));
        k->methods[p] = method;
        pos = at + size;
    }
    free(tables);
    free(scratch);
    return status < 0 ? status : pos;
}

/* 1 when the arguments of pack_planes fit their buffers, else 0 after a ValueError. */
static int pack_fits(const pack_t *k, const Py_buffer v[4])
{
    if (k->n < 0 || k->itemsize < 1 || k->itemsize > 64 || k->block < 1
        || k->base < PLANE_HEAD || ck_items(&v[1]) < k->itemsize
        || ck_items(&v[3]) < k->itemsize + 1) {
        PyErr_Format(PyExc_ValueError, "pack_planes: %lld planes of %lld bytes from %lld in "
                     "blocks of %lld, %zd methods, %zd offsets", (long long)k->itemsize,
                     (long long)k->n, (long long)k->base, (long long)k->block,
                     ck_items(&v[1]), ck_items(&v[3]));
        return 0;
    }
    /* each plane with its head before it (a plane of 0 bytes still has its head) */
    if (!ck_runs_fit(k->base - PLANE_HEAD, k->itemsize, PLANE_HEAD + k->n, PLANE_HEAD + k->n,
                     v[0].len, "pack_planes"))
        return 0;
    for (int64_t p = 0; p < k->itemsize; p++)
        if (k->methods[p] == PL_ZSTD
            && !(0 <= k->zoff[p] && k->zoff[p] <= k->zoff[p + 1] && k->zoff[p + 1] <= v[2].len
                 && k->zoff[p + 1] - k->zoff[p] <= k->n)) {
            PyErr_Format(PyExc_ValueError, "pack_planes: zstd payload %lld..%lld of a buffer "
                         "of %zd bytes, more than the plane's %lld", (long long)k->zoff[p],
                         (long long)k->zoff[p + 1], v[2].len, (long long)k->n);
            return 0;
        }
    return !ck_overlap(&v[0], &v[2], "pack_planes");
}

PyObject *ck_planes_pack_planes(PyObject *self, PyObject *args)
{
    static const ck_want want[4] = {CK_OUT("out", 1), CK_OUT("methods", 8), CK_IN("zbuf", 1),
                                    CK_IN("zoff", 8)};
    PyObject *obj[4];
    Py_ssize_t base, n, itemsize, block;
    Py_buffer v[4];
    int64_t pos = 0;
    if (!PyArg_ParseTuple(args, "OnnnnOOO", &obj[0], &base, &n, &itemsize, &block, &obj[1],
                          &obj[2], &obj[3])
        || ck_buffers(obj, want, 4, v) < 0)
        return NULL;
    pack_t k = {v[0].buf, base, n, itemsize, block, v[1].buf, v[2].buf, v[3].buf, pl_bmi2()};
    if (pack_fits(&k, v)) {
        CK_BEGIN_NOGIL(n * itemsize)
        pos = pack(&k);
        CK_END_NOGIL
        if (pos == PL_ERR_MEMORY)
            PyErr_NoMemory();
        else if (pos < 0)
            PyErr_SetString(PyExc_ValueError, "pack_planes: a Huffman code outgrew its bound");
    }
    return ck_done(v, 4) < 0 ? NULL : PyLong_FromLongLong(pos);
}

/* choose and pack without their checks, for BytePlanes' one-call encode (planes_layout.c). */
int64_t pl_choose(const int64_t *freq, const int64_t *near, const int64_t *repeats,
                  int64_t planes, int64_t count, int64_t length, double below, double extra,
                  int64_t *methods)
{
    return choose(freq, near, repeats, planes, count, length, below, extra, methods);
}

int64_t pl_pack(uint8_t *out, int64_t base, int64_t n, int64_t itemsize, int64_t block,
                int64_t *methods, const uint8_t *zbuf, const int64_t *zoff, int bmi2)
{
    pack_t k = {out, base, n, itemsize, block, methods, zbuf, zoff, bmi2};
    return pack(&k);
}
