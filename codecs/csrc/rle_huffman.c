/* RLEHuffman's encoder (the twin of ckptcodecs/_hkernels.py's encode_stream): the runs are
   scanned twice -- once to count the symbols, once to write their codes MSB first -- around
   the code tables (rle_huffman_tables.c); no symbol stream is stored. Symbols: a byte value v
   is index v, a run of r >= 2 (the value before it occurs r times) is index RUN_BASE + r. */
#include "native.h"

#define ALPHABET (1 << 16)
#define RUN_BASE 254
#define MAX_RUN (ALPHABET - 1 - RUN_BASE)
#define MAX_LEN 24


/* The symbol index of a piece of a run: RUN_BASE + piece, or for a piece of one (it has no
   run symbol) NONE + lane, one of 4 slots past the alphabet that count in turn and write no
   bits. Without a branch: whether a run goes on is data. */
#define NONE ALPHABET
#define SLOTS (ALPHABET + 4)
static inline Py_ssize_t run_symbol(Py_ssize_t piece, Py_ssize_t lane)
{
    return piece > 1 ? RUN_BASE + piece : NONE + lane;
}

/* Count the symbols of a run of `run` copies of v (pieces of at most MAX_RUN) into vfreq's
   lanes and freq (SLOTS); the symbol count after them. */
static Py_ssize_t count_run(int v, Py_ssize_t run, Py_ssize_t m, int64_t (*vfreq)[256],
                            int64_t *freq)
{
    do {
        Py_ssize_t piece = run < MAX_RUN ? run : MAX_RUN;
        vfreq[m & 3][v]++;
        freq[run_symbol(piece, m & 3)]++;
        m += 1 + (piece > 1);
        run -= piece;
    } while (run > 0);
    return m;
}

/* For each run of equal bytes of data[0..n) (n >= 1), in order: BODY with `v` its value and
   `run` its length. Where a run ends is found eight bytes a step (each byte against the one
   before it; the set bits of a mask walked in order), so that the loop waits on no load. */
#define HIGH UINT64_C(0x8080808080808080)
#define LOW7 UINT64_C(0x7f7f7f7f7f7f7f7f)
#define FOR_EACH_RUN(data, n, BODY)                                                          \
    do {                                                                                     \
        Py_ssize_t start_ = 0, i_ = 1;                                                       \
        for (; i_ + 8 <= (n); i_ += 8) {                                                     \
            uint64_t d_ = ck_load64((data) + i_) ^ ck_load64((data) + i_ - 1);              \
            uint64_t ends_ = (((d_ & LOW7) + LOW7) | d_) & HIGH;  /* a byte that differs */  \
            while (ends_) {                                                                  \
                Py_ssize_t at_ = i_ + (__builtin_ctzll(ends_) >> 3);                         \
                int v = (data)[start_];                                                      \
                Py_ssize_t run = at_ - start_;                                               \
                BODY;                                                                        \
                start_ = at_;                                                                \
                ends_ &= ends_ - 1;                                                          \
            }                                                                                \
        }                                                                                    \
        for (; i_ <= (n); i_++)                                                              \
            if (i_ == (n) || (data)[i_] != (data)[i_ - 1]) {                                 \
                int v = (data)[start_];                                                      \
                Py_ssize_t run = i_ - start_;                                                \
                BODY;                                                                        \
                start_ = i_;                                                                 \
            }                                                                                \
    } while (0)

/* The symbol counts of data[0..n) added to freq (symbols are not stored: the writer scans
   the data again); the number of symbols. */
static Py_ssize_t rle_scan(const uint8_t *data, Py_ssize_t n, int64_t *freq)
{
    int64_t vfreq[4][256];  /* value counts in 4 lanes, summed at the end */
    Py_ssize_t m = 0;
    memset(vfreq, 0, sizeof vfreq);
    FOR_EACH_RUN(data, n, m = count_run(v, run, m, vfreq, freq));
    for (int v = 0; v < 256; v++)
        freq[v] += vfreq[0][v] + vfreq[1][v] + vfreq[2][v] + vfreq[3][v];
    return m;
}

/* The MSB-first bit writer: the pending bits (fewer than 8 between runs) at the top of acc;
   after each run the whole bytes are stored, eight at a time (the output has 8 bytes of slack
   past the stream), without a branch. */
typedef struct {
    uint64_t acc;
    int nbits;
    uint8_t *out;
} bits_t;

/* The codes of the symbols of a run of `run` copies of v: each piece's value code and run
   code (NONE: 0 bits) together, at most 2 * MAX_LEN bits. */
static inline void put_run(bits_t *b, int v, Py_ssize_t run, const uint32_t *codes,
                           const uint8_t *lens)
{
    do {
        Py_ssize_t piece = run < MAX_RUN ? run : MAX_RUN, r = run_symbol(piece, 0);
        int ln = lens[v] + lens[r];
        uint64_t code = ((uint64_t)codes[v] << lens[r]) | codes[r];
        b->acc |= code << (64 - b->nbits - ln);
        b->nbits += ln;
        uint64_t word = __builtin_bswap64(b->acc);
        memcpy(b->out, &word, 8);
        b->out += b->nbits >> 3;
        b->acc <<= b->nbits & ~7;
        b->nbits &= 7;
        run -= piece;
    } while (run > 0);
}

/* Huffman-code the symbols of data[0..n) (scanned as rle_scan does) MSB first into out (8
   bytes of slack past what is written); the bytes written. */
static Py_ssize_t write_bits(const uint8_t *data, Py_ssize_t n, const uint32_t *codes,
                             const uint8_t *lens, uint8_t *out)
{
    bits_t b = {0, 0, out};
    FOR_EACH_RUN(data, n, put_run(&b, v, run, codes, lens));
    if (b.nbits > 0)
        *b.out++ = (uint8_t)(b.acc >> 56);
    return b.out - out;
}

/* The plan of one encoding: what encode_stream works out before the output is allocated. */
typedef struct {
    const uint8_t *data;
    Py_ssize_t n;
    int64_t *freq;   /* ALPHABET counts, then NONE's */
    int64_t *used;   /* the symbols that occur, then their counts, then their code lengths */
    Py_ssize_t nsym, nused;
    int64_t nbits;
} plan_t;

static int plan(const uint8_t *data, Py_ssize_t n, plan_t *p)
{
    p->data = data;
    p->n = n;
    p->freq = calloc(SLOTS, sizeof *p->freq);
    p->used = malloc(3 * (size_t)ALPHABET * sizeof *p->used);
    if (p->freq == NULL || p->used == NULL)
        return 0;
    p->nsym = rle_scan(data, n, p->freq);
    p->nused = 0;
    for (Py_ssize_t s = 0; s < ALPHABET; s++)
        if (p->freq[s])
            p->used[p->nused++] = s;
    int64_t *fu = p->used + ALPHABET, *lens = fu + ALPHABET;
    for (Py_ssize_t k = 0; k < p->nused; k++)
        fu[k] = p->freq[p->used[k]];
    if (!ck_code_lengths(fu, p->nused, lens))
        return 0;
    p->nbits = 0;
    for (Py_ssize_t k = 0; k < p->nused; k++)
        p->nbits += fu[k] * lens[k];
    return 1;
}

static void plan_free(plan_t *p)
{
    free(p->freq);
    free(p->used);
}

/* Canonical codes of the plan and its bit stream into out; the bytes written, -1 when memory
   runs out. */
static Py_ssize_t write_plan(const plan_t *p, uint8_t *out)
{
    const int64_t *lens = p->used + 2 * (size_t)ALPHABET;
    int64_t *codes = malloc((size_t)(p->nused ? p->nused : 1) * sizeof *codes);
    uint32_t *codes_full = calloc(SLOTS, sizeof *codes_full);
    uint8_t *lens_full = calloc(SLOTS, 1);
    Py_ssize_t end = -1;
    if (codes != NULL && codes_full != NULL && lens_full != NULL
        && ck_canonical_codes(lens, p->nused, codes)) {
        for (Py_ssize_t k = 0; k < p->nused; k++) {
            codes_full[p->used[k]] = (uint32_t)codes[k];
            lens_full[p->used[k]] = (uint8_t)lens[k];
        }
        end = write_bits(p->data, p->n, codes_full, lens_full, out);
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

static PyObject *ck_rle_encode_stream(PyObject *self, PyObject *args)
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

PyMethodDef ck_rle_huffman_methods[] = {
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
