/* RLEHuffman's coder (the twins of ckptcodecs/_hkernels.py's numba kernels): run scanning,
   length-limited Huffman code lengths, canonical codes, MSB-first bit writing and the
   table-driven decoder that expands runs. Symbols: a byte value v is index v, a run of r >= 2
   (the value before it occurs r times) is index RUN_BASE + r. */
#include "native.h"

#define ALPHABET (1 << 16)
#define RUN_BASE 254
#define MAX_RUN (ALPHABET - 1 - RUN_BASE)
#define MAX_LEN 24
#define LUT_BITS 11
#define NTABLE (MAX_LEN + 2)

/* decode_symbols' error codes (the bits consumed otherwise) */
enum { ERR_BITS = -1, ERR_CODE = -2, ERR_RUN = -3, ERR_OVERFLOW = -4, ERR_SHORT = -5 };

/* ---- encoding ---- */

static Py_ssize_t emit(int v, Py_ssize_t run, uint16_t *syms, Py_ssize_t m,
                       int64_t (*vfreq)[256], int64_t *freq, int lane)
{
    while (run > 0) {
        Py_ssize_t piece = run < MAX_RUN ? run : MAX_RUN;
        syms[m++] = (uint16_t)v;
        vfreq[lane][v]++;
        if (piece > 1) {
            syms[m++] = (uint16_t)(RUN_BASE + piece);
            freq[RUN_BASE + piece]++;
        }
        run -= piece;
    }
    return m;
}

/* The symbol stream of data[0..n) into syms, their counts added to freq; the symbol count. */
static Py_ssize_t rle_scan(const uint8_t *data, Py_ssize_t n, uint16_t *syms, int64_t *freq)
{
    int64_t vfreq[4][256];  /* value counts in 4 lanes, summed at the end */
    Py_ssize_t m = 0, run = 1;
    if (n == 0)
        return 0;
    memset(vfreq, 0, sizeof vfreq);
    int prev = data[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (data[i] == prev) {
            run++;
        } else {
            m = emit(prev, run, syms, m, vfreq, freq, (int)(m & 3));
            prev = data[i];
            run = 1;
        }
    }
    m = emit(prev, run, syms, m, vfreq, freq, (int)(m & 3));
    for (int v = 0; v < 256; v++)
        freq[v] += vfreq[0][v] + vfreq[1][v] + vfreq[2][v] + vfreq[3][v];
    return m;
}

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
static int code_lengths(const int64_t *freq, Py_ssize_t n, int64_t *lens)
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
static int canonical_codes(const int64_t *lens, Py_ssize_t n, int64_t *codes)
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

/* Huffman-code syms[0..nsym) MSB first into out; the bytes written. */
static Py_ssize_t write_bits(const uint16_t *syms, Py_ssize_t nsym, const uint32_t *codes,
                             const uint8_t *lens, uint8_t *out)
{
    uint64_t acc = 0;
    int nbits = 0;
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < nsym; i++) {
        int s = syms[i], ln = lens[s];
        acc = (acc << ln) | codes[s];
        nbits += ln;
        if (nbits >= 32) {
            nbits -= 32;
            uint32_t w = (uint32_t)(acc >> nbits);
            out[j] = (uint8_t)(w >> 24);
            out[j + 1] = (uint8_t)(w >> 16);
            out[j + 2] = (uint8_t)(w >> 8);
            out[j + 3] = (uint8_t)w;
            j += 4;
        }
    }
    while (nbits >= 8) {
        nbits -= 8;
        out[j++] = (uint8_t)(acc >> nbits);
    }
    if (nbits > 0)
        out[j++] = (uint8_t)(acc << (8 - nbits));
    return j;
}

/* The plan of one encoding: what encode_stream works out before the output is allocated. */
typedef struct {
    uint16_t *syms;
    int64_t *freq;   /* ALPHABET counts */
    int64_t *used;   /* the symbols that occur, then their counts, then their code lengths */
    Py_ssize_t nsym, nused;
    int64_t nbits;
} plan_t;

static int plan(const uint8_t *data, Py_ssize_t n, plan_t *p)
{
    p->syms = malloc((size_t)n * sizeof *p->syms);
    p->freq = calloc(ALPHABET, sizeof *p->freq);
    p->used = malloc(3 * (size_t)ALPHABET * sizeof *p->used);
    if (p->syms == NULL || p->freq == NULL || p->used == NULL)
        return 0;
    p->nsym = rle_scan(data, n, p->syms, p->freq);
    p->nused = 0;
    for (Py_ssize_t s = 0; s < ALPHABET; s++)
        if (p->freq[s])
            p->used[p->nused++] = s;
    int64_t *fu = p->used + ALPHABET, *lens = fu + ALPHABET;
    for (Py_ssize_t k = 0; k < p->nused; k++)
        fu[k] = p->freq[p->used[k]];
    if (!code_lengths(fu, p->nused, lens))
        return 0;
    p->nbits = 0;
    for (Py_ssize_t k = 0; k < p->nused; k++)
        p->nbits += fu[k] * lens[k];
    return 1;
}

static void plan_free(plan_t *p)
{
    free(p->syms);
    free(p->freq);
    free(p->used);
}

/* Canonical codes of the plan and its bit stream into out; the bytes written, -1 when memory
   runs out. */
static Py_ssize_t write_plan(const plan_t *p, uint8_t *out)
{
    const int64_t *lens = p->used + 2 * (size_t)ALPHABET;
    int64_t *codes = malloc((size_t)(p->nused ? p->nused : 1) * sizeof *codes);
    uint32_t *codes_full = calloc(ALPHABET, sizeof *codes_full);
    uint8_t *lens_full = calloc(ALPHABET, 1);
    Py_ssize_t end = -1;
    if (codes != NULL && codes_full != NULL && lens_full != NULL
        && canonical_codes(lens, p->nused, codes)) {
        for (Py_ssize_t k = 0; k < p->nused; k++) {
            codes_full[p->used[k]] = (uint32_t)codes[k];
            lens_full[p->used[k]] = (uint8_t)lens[k];
        }
        end = write_bits(p->syms, p->nsym, codes_full, lens_full, out);
    }
    free(codes);
    free(codes_full);
    free(lens_full);
    return end;
}

/* A new 1-d numpy array of `n` items of `dtype`, its bytes copied from `src` unless NULL. */
static PyObject *new_array(Py_ssize_t n, const char *dtype, const void *src)
{
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL)
        return NULL;
    PyObject *arr = PyObject_CallMethod(numpy, "empty", "ns", n, dtype);
    Py_DECREF(numpy);
    if (arr == NULL || src == NULL)
        return arr;
    Py_buffer v;
    if (PyObject_GetBuffer(arr, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    memcpy(v.buf, src, v.len);
    PyBuffer_Release(&v);
    return arr;
}

/* The arrays and values encode_stream returns, from a plan ready to write (NULL: failed). */
static PyObject *encode_result(const plan_t *p, Py_ssize_t head, Py_ssize_t n)
{
    Py_ssize_t hlen = head + 3 * p->nused + 4, nbytes = (Py_ssize_t)((p->nbits + 7) / 8);
    int raw = hlen + nbytes >= head + n;
    PyObject *used = new_array(p->nused, "int64", p->used);
    PyObject *lens = new_array(p->nused, "int64", p->used + 2 * (size_t)ALPHABET);
    PyObject *out = new_array(raw ? 0 : hlen + nbytes + 8, "uint8", NULL);
    Py_ssize_t end = -1;
    if (used != NULL && lens != NULL && out != NULL && !raw) {
        Py_buffer v;
        if (PyObject_GetBuffer(out, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) == 0) {
            Py_BEGIN_ALLOW_THREADS
            end = write_plan(p, (uint8_t *)v.buf + hlen);
            Py_END_ALLOW_THREADS
            PyBuffer_Release(&v);
            if (end < 0)
                PyErr_NoMemory();
            else
                end += hlen;
        }
    }
    PyObject *result = NULL;
    if (!PyErr_Occurred() && used != NULL && lens != NULL && out != NULL)
        result = Py_BuildValue("(OnnOO)", out, end, p->nsym, used, lens);
    Py_XDECREF(used);
    Py_XDECREF(lens);
    Py_XDECREF(out);
    return result;
}

PyObject *ck_rle_encode_stream(PyObject *self, PyObject *args)
{
    PyObject *data_obj, *result = NULL;
    Py_ssize_t head;
    Py_buffer v;
    plan_t p = {0};
    int ok;
    if (!PyArg_ParseTuple(args, "On", &data_obj, &head))
        return NULL;
    if (head < 0 || head > PY_SSIZE_T_MAX / 4)
        return PyErr_Format(PyExc_ValueError, "encode_stream: head %zd is out of range", head);
    if (ck_buffer(data_obj, &v, 0, 1, "encode_stream data") < 0)
        return NULL;
    if (v.len == 0 || v.len > PY_SSIZE_T_MAX / 4) {
        PyErr_Format(PyExc_ValueError, "encode_stream: %zd bytes (1 or more)", v.len);
        PyBuffer_Release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = plan(v.buf, v.len, &p);
    Py_END_ALLOW_THREADS
    if (!ok)
        PyErr_NoMemory();
    else
        result = encode_result(&p, head, v.len);
    plan_free(&p);
    PyBuffer_Release(&v);
    return result;
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
        ok = code_lengths(freq, n, v[1].buf);
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
        ok = canonical_codes(lens, n, v[1].buf);
        Py_END_ALLOW_THREADS
        if (!ok)
            PyErr_NoMemory();
    }
    ck_release(v, 2);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}
