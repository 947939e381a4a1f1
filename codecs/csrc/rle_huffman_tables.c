/* RLEHuffman's code tables (the twins of ckptcodecs/_hkernels.py's code_lengths and
   canonical_codes): length-limited Huffman code lengths built as the numba kernel builds them
   (a stable order of the weights, leaves before nodes on ties), and canonical codes. */
#include "native.h"

#define ALPHABET (1 << 16)
#define MAX_LEN 24

/* Indices 0..n) ordered by key, ties by index (numpy's stable argsort): a bottom-up merge
   sort through tmp. */
static void stable_argsort(const int64_t *key, Py_ssize_t n, int64_t *order, int64_t *tmp)
{
    for (Py_ssize_t i = 0; i < n; i++)
        order[i] = i;
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n, a = lo, b = mid, k = lo;
            while (a < mid && b < hi)
                tmp[k++] = key[order[b]] < key[order[a]] ? order[b++] : order[a++];
            while (a < mid)
                tmp[k++] = order[a++];
            while (b < hi)
                tmp[k++] = order[b++];
        }
        memcpy(order, tmp, n * sizeof *order);
    }
}

/* One tree of the weights f: the depth of each leaf into depth[0..n); the longest. */
static int64_t build_tree(const int64_t *f, Py_ssize_t n, const int64_t *order, int64_t *w,
                          int64_t *parent, int64_t *depth)
{
    Py_ssize_t leaf = 0, node = n;
    int64_t longest = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        w[k] = f[order[k]];
    for (Py_ssize_t nxt = n; nxt < 2 * n - 1; nxt++) {
        int64_t total = 0;
        for (int pick = 0; pick < 2; pick++) {
            Py_ssize_t a;
            if (leaf < n && (node >= nxt || w[leaf] <= w[node])) {
                a = order[leaf++];
                total += f[a];
            } else {
                a = node++;
                total += w[a];
            }
            parent[a] = nxt;
        }
        w[nxt] = total;
    }
    depth[2 * n - 2] = 0;
    for (Py_ssize_t k = 2 * n - 3; k >= 0; k--) {
        depth[k] = depth[parent[k]] + 1;
        if (k < n && depth[k] > longest)
            longest = depth[k];
    }
    return longest;
}

/* Huffman code lengths (at most MAX_LEN) of the positive freq[0..n) into lens: the two
   lightest of the leaves and nodes left join, ties to the leaf, then the lower index; where
   the longest code is too long the frequencies are halved, rounding up, and it is built
   again. 0 when memory runs out. */
int ck_code_lengths(const int64_t *freq, Py_ssize_t n, int64_t *lens)
{
    if (n == 1) {
        lens[0] = 1;
        return 1;
    }
    int64_t *mem = malloc((size_t)(n * 4 + (2 * n - 1) * 3) * sizeof *mem);
    if (mem == NULL)
        return 0;
    int64_t *f = mem, *order = f + n, *tmp = order + n, *w = tmp + n;
    int64_t *parent = w + 2 * n - 1, *depth = parent + 2 * n - 1;
    memcpy(f, freq, n * sizeof *f);
    for (;;) {
        stable_argsort(f, n, order, tmp);
        if (build_tree(f, n, order, w, parent, depth) <= MAX_LEN)
            break;
        for (Py_ssize_t k = 0; k < n; k++)
            f[k] = (f[k] + 1) / 2;
    }
    memcpy(lens, depth, n * sizeof *lens);
    free(mem);
    return 1;
}

/* Canonical codes of lens[0..n) (each in 0..MAX_LEN) into codes: by length, then symbol.
   0 when memory runs out. */
int ck_canonical_codes(const int64_t *lens, Py_ssize_t n, int64_t *codes)
{
    int64_t *order = malloc((size_t)(2 * n) * sizeof *order);
    if (order == NULL)
        return 0;
    stable_argsort(lens, n, order, order + n);
    int64_t code = 0, prev = lens[order[0]];
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t i = order[k];
        if (k)
            code = (code + 1) << (lens[i] - prev);
        prev = lens[i];
        codes[i] = code;
    }
    free(order);
    return 1;
}

/* Parse (a, b) as two int64 buffers of one size n (1..ALPHABET), b writable. */
static int two_tables(PyObject *args, Py_buffer *v, const char *name)
{
    PyObject *a_obj, *b_obj;
    if (!PyArg_ParseTuple(args, "OO", &a_obj, &b_obj) || ck_buffer(a_obj, &v[0], 0, 8, name) < 0)
        return 0;
    if (ck_buffer(b_obj, &v[1], 1, 8, name) < 0) {
        ck_release(v, 1);
        return 0;
    }
    Py_ssize_t n = ck_items(&v[0]);
    if (n < 1 || n > ALPHABET || ck_items(&v[1]) != n || ck_overlap(&v[0], &v[1], name)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s: %zd and %zd items (equal, 1..%d)", name, n,
                         ck_items(&v[1]), ALPHABET);
        ck_release(v, 2);
        return 0;
    }
    return 1;
}

PyObject *ck_rle_code_lengths(PyObject *self, PyObject *args)
{
    Py_buffer v[2];
    int ok = 1;
    if (!two_tables(args, v, "code_lengths"))
        return NULL;
    const int64_t *freq = v[0].buf;
    Py_ssize_t n = ck_items(&v[0]);
    for (Py_ssize_t k = 0; k < n; k++)
        ok &= freq[k] >= 1 && freq[k] <= (INT64_MAX >> 17);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "code_lengths: frequencies must be positive");
    } else {
        Py_BEGIN_ALLOW_THREADS
        ok = ck_code_lengths(freq, n, v[1].buf);
        Py_END_ALLOW_THREADS
        if (!ok)
            PyErr_NoMemory();
    }
    ck_release(v, 2);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *ck_rle_canonical_codes(PyObject *self, PyObject *args)
{
    Py_buffer v[2];
    int ok = 1;
    if (!two_tables(args, v, "canonical_codes"))
        return NULL;
    const int64_t *lens = v[0].buf;
    Py_ssize_t n = ck_items(&v[0]);
    for (Py_ssize_t k = 0; k < n; k++)
        ok &= lens[k] >= 0 && lens[k] <= MAX_LEN;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "canonical_codes: code lengths must be in 0..%d",
                     MAX_LEN);
    } else {
        Py_BEGIN_ALLOW_THREADS
        ok = ck_canonical_codes(lens, n, v[1].buf);
        Py_END_ALLOW_THREADS
        if (!ok)
            PyErr_NoMemory();
    }
    ck_release(v, 2);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}
