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

typedef int (*table_kernel)(const int64_t *, Py_ssize_t, int64_t *);

/* Parse (a, b) as two int64 buffers of one size n (1..ALPHABET), b writable; a's items must lie
   in [lo, hi] (else a ValueError "name: what"); then `kernel` (0: out of memory) without the
   GIL. */
static PyObject *tables(PyObject *args, const char *name, int64_t lo, int64_t hi,
                        const char *what, table_kernel kernel)
{
    const ck_want want[2] = {CK_IN(name, 8), CK_OUT(name, 8)};
    PyObject *obj[2];
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OO", &obj[0], &obj[1]) || ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    const int64_t *a = v[0].buf;
    Py_ssize_t n = ck_items(&v[0]);
    int ok = 1;
    if (n < 1 || n > ALPHABET || ck_items(&v[1]) != n || ck_overlap(&v[0], &v[1], name)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s: %zd and %zd items (equal, 1..%d)", name, n,
                         ck_items(&v[1]), ALPHABET);
        return ck_none(v, 2);
    }
    for (Py_ssize_t k = 0; k < n; k++)
        ok &= a[k] >= lo && a[k] <= hi;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: %s", name, what);
    } else {
        CK_BEGIN_NOGIL(v[0].len)
        ok = kernel(a, n, v[1].buf);
        CK_END_NOGIL
        if (!ok)
            PyErr_NoMemory();
    }
    return ck_none(v, 2);
}

PyObject *ck_rle_code_lengths(PyObject *self, PyObject *args)
{
    return tables(args, "code_lengths", 1, INT64_MAX >> 17, "frequencies must be positive",
                  ck_code_lengths);
}

PyObject *ck_rle_canonical_codes(PyObject *self, PyObject *args)
{
    return tables(args, "canonical_codes", 0, MAX_LEN,
                  "code lengths must be in 0.." Py_STRINGIFY(MAX_LEN), ck_canonical_codes);
}
