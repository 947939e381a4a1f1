/* A whole BytePlanes payload decoded in one call (planes_decode_into), for the layouts the
   store writes: items of 2, 4 or 8 bytes whose planes are raw or Huffman coded. Block by
   block, each coded plane's Huffman block is decoded into a scratch buffer that stays in the
   core's cache, and the block's items are put together at once from it and from the raw
   planes where the payload holds them: one pass over the output, no plane-sized scratch, no
   Python between the steps. Anything else -- a zstd plane, one-byte items, a payload that
   does not decode, an output of another size -- is left to ckptcodecs._planes_decode, which
   decodes it or raises the error that names what is wrong: this function only says which.
   The scratch is the caller's (Python's per-thread buffer, freed with its thread). */
#include "planes.h"

#define WHOLE_DONE 0
#define WHOLE_OTHER 1 /* not a layout this decoder takes, or a malformed one: Python decides */
#define HEAD 16       /* u8 version, u8 itemsize, u8 flags, u8 0, u64 bytes, u32 block */

static uint64_t load64le(const uint8_t *p)
{
    return (uint64_t)pl_load32le(p) | (uint64_t)pl_load32le(p + 4) << 32;
}

/* Where each plane's payload starts (raw or Huffman), checked as _planes_decode._parse does;
   0, or WHOLE_OTHER for anything it would refuse or this decoder does not take. */
static int spans(const uint8_t *b, int64_t size, int itemsize, int64_t n, int64_t block,
                 int64_t tail, const uint8_t **at, int64_t *len, int *coded)
{
    int64_t pos = HEAD;
    for (int p = 0; p < itemsize; p++) {
        if (pos + PL_PLANE_HEAD > size)
            return WHOLE_OTHER;
        int method = b[pos];
        uint64_t bytes = load64le(b + pos + 1);
        pos += PL_PLANE_HEAD;
        if (bytes > (uint64_t)(size - pos))
            return WHOLE_OTHER;
        if (method == PL_RAW ? (int64_t)bytes != n
                             : method != PL_HUFFMAN || n > (int64_t)(bytes / 2) * block)
            return WHOLE_OTHER;
        at[p] = b + pos, len[p] = (int64_t)bytes, coded[p] = method == PL_HUFFMAN;
        pos += (int64_t)bytes;
    }
    return pos + tail == size ? 0 : WHOLE_OTHER;
}

/* The planes' blocks of items decoded and merged into out; scratch holds one block of each
   coded plane. 0, or WHOLE_OTHER where a Huffman plane does not decode. */
static int blocks(const uint8_t *const *at, const int64_t *len, const int *coded,
                  int itemsize, int rotate, int64_t n, int64_t block, uint8_t *scratch,
                  uint8_t *out, int bmi2)
{
    int64_t pos[8] = {0};
    const uint8_t *src[8];
    for (int64_t start = 0; start < n; start += block) {
        int64_t count = n - start < block ? n - start : block;
        for (int p = 0; p < itemsize; p++) {
            if (!coded[p]) {
                src[p] = at[p] + start;
                continue;
            }
            uint8_t *plane = scratch + p * (n < block ? n : block);
            pos[p] = pl_huffman_block(at[p], len[p], pos[p], plane, count, bmi2);
            if (pos[p] < 0)
                return WHOLE_OTHER;
            src[p] = plane;
        }
        ck_merge_items(src, count, itemsize, rotate, out + start * itemsize);
    }
    for (int p = 0; p < itemsize; p++)
        if (coded[p] && pos[p] != len[p])  /* every byte of a Huffman plane used */
            return WHOLE_OTHER;
    return 0;
}

/* Decode payload b (size bytes) into out (out_len bytes, aligned to its items), with
   scratch_len bytes of scratch: WHOLE_DONE, WHOLE_OTHER, or the scratch it needs (> 1) when
   that is more. */
static int64_t whole(const uint8_t *b, int64_t size, uint8_t *out, int64_t out_len,
                     uint8_t *scratch, int64_t scratch_len, int bmi2)
{
    if (size < HEAD)
        return WHOLE_OTHER;
    int version = b[0], itemsize = b[1], flags = b[2];
    uint64_t nbytes = load64le(b + 4);
    int64_t block = pl_load32le(b + 12);
    if ((version != 1 && version != 2) || flags > 1 || block < 1024 || block > 1 << 24
        || (itemsize != 2 && itemsize != 4 && itemsize != 8) || nbytes != (uint64_t)out_len
        || (uintptr_t)out % (uintptr_t)itemsize)
        return WHOLE_OTHER;
    int64_t n = out_len / itemsize, tail = out_len % itemsize;
    if ((tail != 0) != (version == 2))
        return WHOLE_OTHER;
    const uint8_t *at[8];
    int64_t len[8];
    int coded[8], any = 0;
    if (spans(b, size, itemsize, n, block, tail, at, len, coded))
        return WHOLE_OTHER;
    for (int p = 0; p < itemsize; p++)
        any |= coded[p];
    int64_t need = any ? itemsize * (n < block ? n : block) : 0;
    if (need > scratch_len)
        return need;  /* > 1: itemsize >= 2 and n >= 1 */
    if (blocks(at, len, coded, itemsize, flags & 1, n, block, scratch, out, bmi2))
        return WHOLE_OTHER;
    memcpy(out + n * itemsize, b + size - tail, (size_t)tail);
    return WHOLE_DONE;
}

/* 1 when the byte ranges of two views are apart. */
static int apart(const Py_buffer *a, const Py_buffer *b)
{
    const char *p = a->buf, *q = b->buf;
    return p + a->len <= q || q + b->len <= p;
}

PyObject *ck_planes_decode_into(PyObject *self, PyObject *args)
{
    static const ck_want want[3] = {CK_IN("buf", 1), CK_OUT("out", 1), CK_OUT("scratch", 1)};
    PyObject *obj[3];
    Py_buffer v[3];
    int64_t status = WHOLE_OTHER;
    if (!PyArg_ParseTuple(args, "OOO", &obj[0], &obj[1], &obj[2])
        || ck_buffers(obj, want, 3, v) < 0)
        return NULL;
    /* overlapping buffers: left to the steps (which refuse or decode them as before) */
    if (apart(&v[0], &v[1]) && apart(&v[2], &v[0]) && apart(&v[2], &v[1])) {
        int bmi2 = pl_bmi2();
        CK_BEGIN_NOGIL(v[1].len)
        status = whole(v[0].buf, v[0].len, v[1].buf, v[1].len, v[2].buf, v[2].len, bmi2);
        CK_END_NOGIL
    }
    if (ck_done(v, 3) < 0)
        return NULL;
    return PyLong_FromLongLong(status);
}
