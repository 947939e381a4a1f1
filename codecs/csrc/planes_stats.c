/* BytePlanes' block statistics and code lengths (the twins of ckptcodecs/_pkernels.py's
   plane_stats, _code_lengths, huffman_lengths and huffman_size): block histograms, and
   length-limited Huffman code lengths by the numba kernel's two-queue construction and tie
   rules (the same lengths, so the same code). */
#include "planes.h"

/* One block's histogram into freq[0..256): eight histograms, one a byte of a word (a run of
   one byte does not wait on its own counter). Each byte by its own load, as numba's: a load
   costs a load port, while a byte taken out of a 64-bit word costs two or three ALU
   instructions (mov, shr, movzbl), and the loop was bound by their issue. The eight bytes are
   all loaded before the first count (a compiler barrier between, as numba's code orders them):
   interleaved, each load waited behind the read-modify-write before it, 0.85x numba's speed on
   a float32 exponent plane. */
PL_INLINE void block_stats(const uint8_t *restrict plane, int64_t i, int64_t stop,
                           int64_t *restrict freq)
{
    uint32_t h[8][256];  /* 16 histograms measured slower (L1 pressure) */
    memset(h, 0, sizeof h);
    for (; i + 64 <= stop; i += 64) {  /* a line at a time, the one CK_AHEAD on asked for */
        CK_PREFETCH(plane + i, CK_AHEAD);
        for (int64_t j = i; j < i + 64; j += 8) {
            uint8_t b[8];
            for (int k = 0; k < 8; k++)
                b[k] = plane[j + k];
            PL_LOADS_FIRST();
            for (int k = 7; k >= 0; k--)
                h[k][b[k]]++;
        }
    }
    for (; i < stop; i++)
        h[0][plane[i]]++;
    for (int v = 0; v < 256; v++)
        freq[v] = (int64_t)h[0][v] + h[1][v] + h[2][v] + h[3][v] + h[4][v] + h[5][v] + h[6][v]
                  + h[7][v];
}

static void stats_base(const uint8_t *plane, int64_t i, int64_t stop, int64_t *freq)
{
    block_stats(plane, i, stop, freq);
}

PL_BMI2 static void stats_bmi2(const uint8_t *plane, int64_t i, int64_t stop, int64_t *freq)
{
    block_stats(plane, i, stop, freq);
}

void pl_stats(const uint8_t *plane, int64_t n, int64_t block, int64_t *freq, int bmi2)
{
    for (int64_t b = 0; b < (n + block - 1) / block; b++) {
        int64_t i = b * block, stop = n < i + block ? n : i + block;
        (bmi2 ? stats_bmi2 : stats_base)(plane, i, stop, freq + 256 * b);
    }
}

static int by_value(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Depths of the leaves of the two-queue Huffman tree of the m weights w[0..m) (ascending);
   returns the longest. */
static int64_t tree_depths(int64_t *w, int m, int64_t *parent, int64_t *depth)
{
    int leaf = 0, node = m;
    for (int nxt = m; nxt < 2 * m - 1; nxt++) {
        w[nxt] = 0;
        for (int t = 0; t < 2; t++) {
            int a;
            if (leaf < m && (node >= nxt || w[leaf] <= w[node]))
                a = leaf++;
            else
                a = node++;
            w[nxt] += w[a];
            parent[a] = nxt;
        }
    }
    int64_t longest = 0;
    depth[2 * m - 2] = 0;
    for (int k = 2 * m - 3; k >= 0; k--) {
        depth[k] = depth[parent[k]] + 1;
        longest = depth[k] > longest ? depth[k] : longest;
    }
    return longest;
}

void pl_code_lengths(const int64_t *freq, int64_t *lens)
{
    int64_t keys[256], w[512], parent[512], depth[512];  /* freq << 8 | symbol */
    int m = 0;
    for (int s = 0; s < 256; s++)
        if (freq[s] > 0)
            keys[m++] = (int64_t)((uint64_t)freq[s] << 8) | s;
    memset(lens, 0, 256 * sizeof *lens);
    if (m < 2) {
        if (m)
            lens[keys[0] & 0xFF] = 1;
        return;
    }
    qsort(keys, (size_t)m, sizeof keys[0], by_value);  /* halving keeps this order */
    for (int k = 0; k < m; k++)
        w[k] = keys[k] >> 8;
    while (tree_depths(w, m, parent, depth) > PL_MAX_LEN)
        for (int k = 0; k < m; k++)
            w[k] = (w[k] + 1) >> 1;
    for (int k = 0; k < m; k++)
        lens[keys[k] & 0xFF] = depth[k];
}

int64_t pl_lengths(const int64_t *freq, int64_t nblocks, int64_t *lens)
{
    int64_t size = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        const int64_t *f = freq + 256 * b;
        int64_t *l = lens + 256 * b;
        pl_code_lengths(f, l);
        int lo = 0, hi = 255;
        while (lo < 255 && l[lo] == 0)
            lo++;
        while (hi > 0 && l[hi] == 0)
            hi--;
        size += 2;
        if (lo < hi) {
            int64_t bits = 0;
            for (int s = lo; s <= hi; s++)
                bits += f[s] * l[s];
            size += (hi - lo + 2) / 2 + 16 + (bits + 4 * 7) / 8;
        }
    }
    return size;
}

int pl_freq_ok(const int64_t *freq, int64_t count, const char *what)
{
    for (int64_t k = 0; k < count; k++)
        if (freq[k] < 0 || freq[k] > PL_MAX_FREQ) {
            PyErr_Format(PyExc_ValueError, "%s: a count of %lld is not in 0..2**47", what,
                         (long long)freq[k]);
            return 0;
        }
    return 1;
}

int pl_lens_ok(const int64_t *lens, int64_t count, const char *what)
{
    for (int64_t k = 0; k < count; k++)
        if (lens[k] < 0 || lens[k] > PL_MAX_LEN) {
            PyErr_Format(PyExc_ValueError, "%s: code length %lld is not in 0..%d", what,
                         (long long)lens[k], PL_MAX_LEN);
            return 0;
        }
    return 1;
}

PyObject *ck_planes_plane_stats(PyObject *self, PyObject *args)
{
    static const ck_want want[2] = {CK_IN("plane", 1), CK_OUT("freq", 8)};
    PyObject *obj[2];
    Py_ssize_t block;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnO", &obj[0], &block, &obj[1]))
        return NULL;
    if (block < 1)
        return PyErr_Format(PyExc_ValueError, "plane_stats: block must be >= 1, not %zd", block);
    if (ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    int64_t nblocks = (v[0].len + block - 1) / block;
    if (ck_items(&v[1]) < 256 * nblocks)
        PyErr_Format(PyExc_ValueError, "plane_stats: freq holds %zd items, %lld blocks need "
                     "%lld", ck_items(&v[1]), (long long)nblocks, (long long)(256 * nblocks));
    else {
        int bmi2 = pl_bmi2();
        CK_BEGIN_NOGIL(v[0].len)
        pl_stats(v[0].buf, v[0].len, block, v[1].buf, bmi2);
        CK_END_NOGIL
    }
    return ck_none(v, 2);
}

/* (freq, lens) of code_lengths (one histogram) and huffman_lengths (rows of them). */
static PyObject *lengths(PyObject *args, int rows, const char *name)
{
    static const ck_want want[2] = {CK_IN("freq", 8), CK_OUT("lens", 8)};
    PyObject *obj[2];
    Py_buffer v[2];
    int64_t size = 0;
    if (!PyArg_ParseTuple(args, "OO", &obj[0], &obj[1]) || ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    Py_ssize_t nblocks = rows ? ck_items(&v[0]) / 256 : 1;
    if ((rows && ck_items(&v[0]) % 256) || ck_items(&v[0]) < 256 * nblocks
        || ck_items(&v[1]) < 256 * nblocks)
        PyErr_Format(PyExc_ValueError, "%s: freq of %zd items, lens of %zd (rows of 256)", name,
                     ck_items(&v[0]), ck_items(&v[1]));
    else if (!ck_overlap(&v[0], &v[1], name) && pl_freq_ok(v[0].buf, 256 * nblocks, name)) {
        CK_BEGIN_NOGIL(nblocks * PL_LENGTHS_BYTES)
        size = pl_lengths(v[0].buf, nblocks, v[1].buf);
        CK_END_NOGIL
    }
    if (ck_done(v, 2) < 0)
        return NULL;
    return rows ? PyLong_FromLongLong(size) : Py_NewRef(Py_None);
}

PyObject *ck_planes_code_lengths(PyObject *self, PyObject *args)
{
    return lengths(args, 0, "code_lengths");
}

PyObject *ck_planes_huffman_lengths(PyObject *self, PyObject *args)
{
    return lengths(args, 1, "huffman_lengths");
}

PyObject *ck_planes_huffman_size(PyObject *self, PyObject *args)
{
    PyObject *plane;
    Py_ssize_t block;
    Py_buffer v;
    int64_t size = 0, *tables = NULL;
    if (!PyArg_ParseTuple(args, "On", &plane, &block))
        return NULL;
    if (block < 1)
        return PyErr_Format(PyExc_ValueError, "huffman_size: block must be >= 1, not %zd",
                            block);
    if (ck_buffer(plane, &v, 0, 1, "plane") < 0)
        return NULL;
    int64_t nblocks = (v.len + block - 1) / block;
    if ((tables = malloc((size_t)(512 * nblocks + 1) * sizeof *tables)) == NULL)
        PyErr_NoMemory();
    else {
        int bmi2 = pl_bmi2();
        CK_BEGIN_NOGIL(v.len)
        pl_stats(v.buf, v.len, block, tables, bmi2);
        size = pl_lengths(tables, nblocks, tables + 256 * nblocks);
        CK_END_NOGIL
    }
    free(tables);
    return ck_done(&v, 1) < 0 ? NULL : PyLong_FromLongLong(size);
}
