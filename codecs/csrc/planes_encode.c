/* BytePlanes' Huffman encoder (the twins of ckptcodecs/_pkernels.py's huffman_encode_lengths,
   huffman_encode and huffman_bound): per block its canonical code, then four bit streams, two
   bytes a lookup where the block uses at most PL_PAIRS_MAX symbols. The bits are the numba
   kernel's; every 8-byte store is checked against the output's size (in batches that surely
   fit, then byte by byte), so an output too small gives PL_ERR_SPACE, never a write past it. */
#include <stdatomic.h>

#include "planes.h"

/* The pair tables of one call: 576 KiB, zeroed once, then kept for the next call (a call
   takes them, or makes new ones when another thread holds them). Their entries only ever hold
   a code and its length (<= 24 bits), so whatever an earlier call left is safe to read. */
typedef struct {
    uint64_t codes[1 << 16];
    uint8_t lens[1 << 16];
} pairs_t;

static _Atomic(pairs_t *) spare_pairs;

static pairs_t *take_pairs(void)
{
    pairs_t *p = atomic_exchange(&spare_pairs, NULL);
    return p != NULL ? p : calloc(1, sizeof *p);
}

static void give_pairs(pairs_t *p)
{
    pairs_t *none = NULL;
    if (p != NULL && !atomic_compare_exchange_strong(&spare_pairs, &none, p))
        free(p);
}

typedef struct {
    uint64_t codes[256];  /* left-aligned; kept from block to block, as numba's */
    uint64_t ulens[256];
    uint64_t *pcodes;     /* codes of the pairs of symbols (lo | hi << 8) */
    uint8_t *plens;
    int pairs, maxl;      /* maxl: the longest length in ulens */
    int bmi2;             /* run the BMI2 build of the stream loop */
    int far;              /* a plane of CK_FAR bytes or more: prefetch (stream_body) */
} code_t;

static inline void store_be64(uint8_t *p, uint64_t x)
{
    x = __builtin_bswap64(x);
    memcpy(p, &x, 8);
}

/* Code plane[i:stop] as one stream at out[o] (size bytes); returns where it ends. `far`: a
   plane too large for the cache, read a line at a time with a prefetch hint (CK_PREFETCH;
   1.6 -> 2.9 GB/s on a 32 MB float32 exponent plane); a plane in the cache runs the plain
   loop, one pass of the lines' loop (which cost it 5-8 %). */
PL_INLINE int64_t stream_body(const uint8_t *restrict plane, int64_t i, int64_t stop,
                             const code_t *restrict c, uint8_t *restrict out, int64_t o,
                             int64_t size, const int far)
{
    const uint64_t *restrict codes = c->codes, *restrict ulens = c->ulens;
    uint64_t acc = 0, nbits = 0;
    while (stop - i >= 4) {  /* batches of groups of 4 bytes whose stores surely fit */
        int64_t room = (size - 8 - o) * 8 - 7;
        int64_t groups = room > 0 ? room / (4 * c->maxl) : 0;
        if (groups > (stop - i) / 4)
            groups = (stop - i) / 4;
        if (groups == 0)
            break;
        uint8_t *restrict w = out + o;
        const uint64_t *restrict pcodes = c->pcodes;
        const uint8_t *restrict plens = c->plens;
        if (c->pairs) {  /* both codes placed from nbits: a shorter chain of dependences */
            const uint8_t *restrict x = plane + i, *end = x + 4 * groups;
            while (x < end) {  /* a line of the plane at a time where far */
                const uint8_t *line = far && end - x > 64 ? x + 64 : end;
                if (far)
                    CK_PREFETCH(x, CK_AHEAD);
                for (; x < line; x += 4) {
                    uint32_t x0 = pl_load16le(x), x1 = pl_load16le(x + 2);
                    uint64_t n1 = nbits + plens[x0];
                    acc |= (pcodes[x0] >> nbits) | (pcodes[x1] >> n1);
                    nbits = n1 + plens[x1];
                    store_be64(w, acc);
                    w += nbits >> 3;
                    acc <<= nbits & ~(uint64_t)7;
                    nbits &= 7;
                }
            }
        } else {
            const uint8_t *restrict x = plane + i, *end = x + 4 * groups;
            while (x < end) {
                const uint8_t *line = far && end - x > 64 ? x + 64 : end;
                if (far)
                    CK_PREFETCH(x, CK_AHEAD);
                for (; x < line; x += 4) {
                    uint64_t n1 = nbits + ulens[x[0]], n2 = n1 + ulens[x[1]];
                    uint64_t n3 = n2 + ulens[x[2]];
                    acc |= (codes[x[0]] >> nbits) | (codes[x[1]] >> n1) | (codes[x[2]] >> n2)
                           | (codes[x[3]] >> n3);
                    nbits = n3 + ulens[x[3]];
                    store_be64(w, acc);
                    w += nbits >> 3;
                    acc <<= nbits & ~(uint64_t)7;
                    nbits &= 7;
                }
            }
        }
        i += 4 * groups;
        o = w - out;
    }
    for (; i < stop; i++) {  /* a byte at a time, each store checked */
        acc |= codes[plane[i]] >> nbits;
        nbits += ulens[plane[i]];
        if (o + 8 > size)
            return PL_ERR_SPACE;
        store_be64(out + o, acc);
        o += nbits >> 3;
        acc <<= nbits & ~(uint64_t)7;
        nbits &= 7;
    }
    if (o + 8 > size)
        return PL_ERR_SPACE;
    store_be64(out + o, acc);
    return o + (int64_t)((nbits + 7) >> 3);
}

static int64_t stream_base(const uint8_t *plane, int64_t i, int64_t stop, const code_t *c,
                           uint8_t *out, int64_t o, int64_t size)
{
    return stream_body(plane, i, stop, c, out, o, size, c->far);
}

PL_BMI2 static int64_t stream_bmi2(const uint8_t *plane, int64_t i, int64_t stop,
                                   const code_t *c, uint8_t *out, int64_t o, int64_t size)
{
    return stream_body(plane, i, stop, c, out, o, size, c->far);
}

/* The block's canonical code from its lengths blens (see _pkernels.huffman_encode_lengths). */
static void block_code(const int64_t *blens, code_t *c)
{
    int lens[256], order[256];
    for (int s = 0; s < 256; s++)
        lens[s] = (int)blens[s];
    int m = pl_canonical(lens, order);
    int64_t window = 0;
    for (int k = 0; k < m; k++) {
        int s = order[k];
        c->codes[s] = (uint64_t)(window >> (PL_MAX_LEN - lens[s])) << (64 - lens[s]);
        c->ulens[s] = (uint64_t)lens[s];
        window += (int64_t)1 << (PL_MAX_LEN - lens[s]);
    }
    c->maxl = 1;
    for (int s = 0; s < 256; s++)
        c->maxl = (int)c->ulens[s] > c->maxl ? (int)c->ulens[s] : c->maxl;
    c->pairs = m <= PL_PAIRS_MAX;
    if (c->pairs)  /* only the entries of used pairs are written, and only they are read */
        for (int a = 0; a < m; a++) {
            int s1 = order[a];
            for (int b = 0; b < m; b++) {
                int s2 = order[b];
                c->pcodes[s1 | s2 << 8] = c->codes[s1] | (c->codes[s2] >> c->ulens[s1]);
                c->plens[s1 | s2 << 8] = (uint8_t)(c->ulens[s1] + c->ulens[s2]);
            }
        }
}

/* One block: its head (lo, hi, lengths, stream sizes) and four streams at out[pos]. */
static int64_t encode_block(const uint8_t *plane, int64_t start, int64_t stop,
                            const int64_t *blens, code_t *c, uint8_t *out, int64_t pos,
                            int64_t size)
{
    int lo = 0, hi = 255;
    while (lo < 255 && blens[lo] == 0)
        lo++;
    while (hi > 0 && blens[hi] == 0)
        hi--;
    if (pos + 2 > size)
        return PL_ERR_SPACE;
    out[pos] = (uint8_t)lo;
    out[pos + 1] = (uint8_t)hi;
    pos += 2;
    if (lo >= hi)
        return pos;
    if (pos + (hi - lo + 2) / 2 + 16 > size)
        return PL_ERR_SPACE;
    for (int s = lo; s <= hi; s += 2)
        out[pos++] = (uint8_t)(blens[s] | (s < hi ? blens[s + 1] << 4 : 0));
    block_code(blens, c);
    int64_t q = (stop - start + 3) / 4, end = pos + 16;
    for (int k = 0; k < 4; k++) {
        int64_t begin = end, a = start + k * q, b = start + k * q + q;
        end = (c->bmi2 ? stream_bmi2 : stream_base)(plane, a < stop ? a : stop,
                                                    b < stop ? b : stop, c, out, begin, size);
        if (end < 0)
            return end;
        uint64_t len = (uint64_t)(end - begin);
        for (int t = 0; t < 4; t++)
            out[pos + 4 * k + t] = (uint8_t)(len >> (8 * t));
    }
    return end;
}

int64_t pl_encode_lengths(const uint8_t *plane, int64_t n, int64_t block, const int64_t *lens,
                          uint8_t *out, int64_t size, int bmi2)
{
    code_t c;
    c.bmi2 = bmi2;
    c.far = n >= CK_FAR;
    memset(c.codes, 0, sizeof c.codes);
    memset(c.ulens, 0, sizeof c.ulens);
    pairs_t *pairs = take_pairs();
    int64_t pos = pairs != NULL ? 0 : PL_ERR_MEMORY;
    if (pairs != NULL)
        c.pcodes = pairs->codes, c.plens = pairs->lens;
    for (int64_t b = 0; pos >= 0 && b < (n + block - 1) / block; b++) {
        int64_t start = b * block, stop = n < start + block ? n : start + block;
        pos = encode_block(plane, start, stop, lens + 256 * b, &c, out, pos, size);
    }
    give_pairs(pairs);
    return pos;
}

int64_t pl_bound(int64_t n, int64_t block)
{
    int64_t nblocks = (n + block - 1) / block;
    return nblocks * (2 + 128 + 16 + 4) + (n * PL_MAX_LEN + 7) / 8 + 8;
}

/* Set the Python error of an encoder status < 0; returns NULL. */
static PyObject *encode_error(int64_t status, const char *name)
{
    if (status == PL_ERR_MEMORY)
        return PyErr_NoMemory();
    return PyErr_Format(PyExc_ValueError, "%s: out is too small for the code", name);
}

/* (plane, block, table, out) of huffman_encode[_lengths]: the table's blocks must cover the
   plane's; then encode (from the histograms when `from_freq`) without the GIL. */
static PyObject *encode(PyObject *args, int from_freq, const char *name)
{
    const ck_want want[3] = {CK_IN("plane", 1), CK_IN(from_freq ? "freq" : "lens", 8),
                             CK_OUT("out", 1)};
    PyObject *obj[3];
    Py_ssize_t block;
    Py_buffer v[3];
    int64_t status = 0, *lens = NULL;
    if (!PyArg_ParseTuple(args, "OnOO", &obj[0], &block, &obj[1], &obj[2]))
        return NULL;
    if (block < 1)
        return PyErr_Format(PyExc_ValueError, "%s: block must be >= 1, not %zd", name, block);
    if (ck_buffers(obj, want, 3, v) < 0)
        return NULL;
    int64_t n = v[0].len, nblocks = (n + block - 1) / block, rows = ck_items(&v[1]) / 256;
    if (ck_items(&v[1]) % 256 || rows < nblocks)
        PyErr_Format(PyExc_ValueError, "%s: %zd table items for %lld blocks of 256", name,
                     ck_items(&v[1]), (long long)nblocks);
    else if (ck_overlap(&v[0], &v[2], name))
        ;
    else if (!from_freq && !pl_lens_ok(v[1].buf, 256 * nblocks, name))
        ;
    else if (from_freq && !pl_freq_ok(v[1].buf, 256 * rows, name))
        ;
    else if (from_freq && (lens = calloc((size_t)(256 * rows), sizeof *lens)) == NULL)
        PyErr_NoMemory();
    else {
        int bmi2 = pl_bmi2();
        CK_BEGIN_NOGIL(n)
        if (from_freq)
            pl_lengths(v[1].buf, rows, lens);
        status = pl_encode_lengths(v[0].buf, n, block, from_freq ? lens : v[1].buf, v[2].buf,
                                   v[2].len, bmi2);
        CK_END_NOGIL
        if (status < 0)
            encode_error(status, name);
    }
    free(lens);
    return ck_done(v, 3) < 0 ? NULL : PyLong_FromLongLong(status);
}

PyObject *ck_planes_huffman_encode_lengths(PyObject *self, PyObject *args)
{
    return encode(args, 0, "huffman_encode_lengths");
}

PyObject *ck_planes_huffman_encode(PyObject *self, PyObject *args)
{
    return encode(args, 1, "huffman_encode");
}

PyObject *ck_planes_huffman_bound(PyObject *self, PyObject *args)
{
    Py_ssize_t n, block;
    if (!PyArg_ParseTuple(args, "nn", &n, &block))
        return NULL;
    if (n < 0 || block < 1 || n > (INT64_MAX - 4096) / PL_MAX_LEN)
        return PyErr_Format(PyExc_ValueError, "huffman_bound: %zd bytes in blocks of %zd", n,
                            block);
    return PyLong_FromLongLong(pl_bound(n, block));
}
