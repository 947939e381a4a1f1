/* Dense bit packing of 1..8-bit codes (the twins of ckptcodecs/bitpack.py's numba kernels):
   code i at bits [i * bits, (i + 1) * bits) of a little-endian bit stream. As in the reference,
   a code's bits above `bits` are not masked on packing (they reach the next codes' bits). */
#include "native.h"

static int check_bits(Py_ssize_t bits, const char *name)
{
    if (bits >= 1 && bits <= 8)
        return 1;
    PyErr_Format(PyExc_ValueError, "%s: bits must be in 1..8, not %zd", name, bits);
    return 0;
}

/* Bytes that `count` codes of `bits` bits fill (count is the size of a real buffer: no
   overflow in count * bits). */
static Py_ssize_t packed_bytes(Py_ssize_t count, Py_ssize_t bits)
{
    return (Py_ssize_t)(((size_t)count * (size_t)bits + 7) / 8);
}

/* The reference's loop, code by code, from the state it has at a multiple of 8 codes. */
static void pack_tail(const uint8_t *codes, Py_ssize_t count, int bits, uint64_t acc,
                      uint8_t *out)
{
    int nacc = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        acc |= (uint64_t)codes[i] << nacc;
        nacc += bits;
        if (nacc >= 8) {
            *out++ = (uint8_t)acc;
            acc >>= 8;
            nacc -= 8;
        }
    }
    if (nacc > 0)
        *out = (uint8_t)acc;
}

/* 8 codes fill exactly `bits` bytes; bits a code holds above its width reach the next codes
   (as in the reference), at most 8 - bits of them past the 8th: the carry. `bits` is a constant
   in each instance (see pack). */
static inline __attribute__((always_inline)) void pack_n(const uint8_t *codes, Py_ssize_t count,
                                                         const int bits, uint8_t *out)
{
    uint64_t carry = 0;
    Py_ssize_t groups = count / 8;
    for (Py_ssize_t g = 0; g < groups; g++, codes += 8, out += bits) {
        uint64_t acc = carry;
        for (int j = 0; j < 8; j++)
            acc |= (uint64_t)codes[j] << (j * bits);
        for (int j = 0; j < bits; j++)
            out[j] = (uint8_t)(acc >> (8 * j));
        carry = bits < 8 ? acc >> (8 * bits) : 0;
    }
    pack_tail(codes, count - 8 * groups, bits, carry, out);
}

/* pack_n for a width that divides 8 (2 or 4): where every code is below 2**bits (no carry),
   byte i holds codes i per .. i per + per - 1, the first lowest: the same bytes, in a loop
   that vectorises. 0 where a code is not below 2**bits (out then holds nothing usable). */
static inline __attribute__((always_inline)) int pack_whole(const uint8_t *restrict codes,
                                                            Py_ssize_t count, const int bits,
                                                            uint8_t *restrict out)
{
    const int per = 8 / bits;
    Py_ssize_t whole = count / per;
    uint8_t seen = 0;
    for (Py_ssize_t i = 0; i < whole; i++) {
        uint8_t b = 0;
        for (int j = 0; j < per; j++) {
            b |= (uint8_t)(codes[i * per + j] << (j * bits));
            seen |= codes[i * per + j];
        }
        out[i] = b;
    }
    if (count > whole * per) {  /* the last byte, part filled */
        uint8_t b = 0;
        for (Py_ssize_t j = 0; j < count - whole * per; j++) {
            b |= (uint8_t)(codes[whole * per + j] << (j * bits));
            seen |= codes[whole * per + j];
        }
        out[whole] = b;
    }
    return seen < (1 << bits);
}

void ck_pack_bits(const uint8_t *codes, Py_ssize_t count, int bits, uint8_t *out)
{
    /* pack_whole writes before it knows every code fits: only where out is not codes (pack_n
       packs in place, reading ahead of what it writes) */
    const uint8_t *end = out + (count * bits + 7) / 8;
    int apart = end <= codes || codes + count <= out;
    if (apart && ((bits == 4 && pack_whole(codes, count, 4, out))
                  || (bits == 2 && pack_whole(codes, count, 2, out))))
        return;
    switch (bits) {
    case 1: pack_n(codes, count, 1, out); break;
    case 2: pack_n(codes, count, 2, out); break;
    case 3: pack_n(codes, count, 3, out); break;
    case 4: pack_n(codes, count, 4, out); break;
    case 5: pack_n(codes, count, 5, out); break;
    case 6: pack_n(codes, count, 6, out); break;
    case 7: pack_n(codes, count, 7, out); break;
    default: pack_n(codes, count, 8, out); break;
    }
}

static void unpack_tail(const uint8_t *buf, int bits, Py_ssize_t count, uint8_t *out)
{
    const uint64_t mask = (1u << bits) - 1;
    uint64_t acc = 0;
    int nacc = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (nacc < bits) {
            acc |= (uint64_t)*buf++ << nacc;
            nacc += 8;
        }
        out[i] = (uint8_t)(acc & mask);
        acc >>= bits;
        nacc -= bits;
    }
}

/* 8 codes from each `bits` bytes, then the reference's loop for the rest. */
static inline __attribute__((always_inline)) void unpack_n(const uint8_t *buf, const int bits,
                                                           Py_ssize_t count, uint8_t *out)
{
    const uint64_t mask = (1u << bits) - 1;
    Py_ssize_t groups = count / 8;
    for (Py_ssize_t g = 0; g < groups; g++, buf += bits, out += 8) {
        uint64_t acc = 0;
        for (int j = 0; j < bits; j++)
            acc |= (uint64_t)buf[j] << (8 * j);
        for (int j = 0; j < 8; j++)
            out[j] = (uint8_t)((acc >> (j * bits)) & mask);
    }
    unpack_tail(buf, bits, count - 8 * groups, out);
}

/* unpack_n for a width that divides 8 (1, 2 or 4): byte i holds codes i per .. i per + per - 1,
   the first lowest, in a loop that vectorises (4 bits: 1.7 -> ~7 GB/s of codes). */
static inline __attribute__((always_inline)) void unpack_whole(const uint8_t *restrict buf,
                                                               Py_ssize_t count, const int bits,
                                                               uint8_t *restrict out)
{
    const int per = 8 / bits;
    const uint8_t mask = (uint8_t)((1u << bits) - 1);
    Py_ssize_t whole = count / per;
    for (Py_ssize_t i = 0; i < whole; i++) {
        uint8_t b = buf[i];
        for (int j = 0; j < per; j++)
            out[i * per + j] = (uint8_t)(b >> (j * bits)) & mask;
    }
    for (Py_ssize_t j = 0; j < count - whole * per; j++)  /* the last byte, part filled */
        out[whole * per + j] = (uint8_t)(buf[whole] >> (j * bits)) & mask;
}

static void unpack(const uint8_t *buf, int bits, Py_ssize_t count, uint8_t *out)
{
    switch (bits) {
    case 1: unpack_whole(buf, count, 1, out); return;
    case 2: unpack_whole(buf, count, 2, out); return;
    case 4: unpack_whole(buf, count, 4, out); return;
    }
    switch (bits) {
    case 1: unpack_n(buf, 1, count, out); break;
    case 2: unpack_n(buf, 2, count, out); break;
    case 3: unpack_n(buf, 3, count, out); break;
    case 4: unpack_n(buf, 4, count, out); break;
    case 5: unpack_n(buf, 5, count, out); break;
    case 6: unpack_n(buf, 6, count, out); break;
    case 7: unpack_n(buf, 7, count, out); break;
    default: unpack_n(buf, 8, count, out); break;
    }
}

static PyObject *ck_pack(PyObject *self, PyObject *args)
{
    static const ck_want want[2] = {CK_IN("pack codes", 1), CK_OUT("pack out", 1)};
    PyObject *obj[2];
    Py_ssize_t bits;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnO", &obj[0], &bits, &obj[1]) || !check_bits(bits, "pack")
        || ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    Py_ssize_t need = packed_bytes(v[0].len, bits);
    if (v[1].len < need)
        PyErr_Format(PyExc_ValueError, "pack: %zd codes of %zd bits need %zd bytes, out holds "
                     "%zd", v[0].len, bits, need, v[1].len);
    else {
        CK_BEGIN_NOGIL(v[0].len)
        ck_pack_bits(v[0].buf, v[0].len, (int)bits, v[1].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 2);
}

static PyObject *ck_unpack(PyObject *self, PyObject *args)
{
    static const ck_want want[2] = {CK_IN("unpack buf", 1), CK_OUT("unpack out", 1)};
    PyObject *obj[2];
    Py_ssize_t bits, count;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnnO", &obj[0], &bits, &count, &obj[1])
        || !check_bits(bits, "unpack"))
        return NULL;
    if (count < 0)
        return PyErr_Format(PyExc_ValueError, "unpack: count %zd is negative", count);
    if (ck_buffers(obj, want, 2, v) < 0)
        return NULL;
    if (v[1].len < count || v[0].len < packed_bytes(count, bits))
        PyErr_Format(PyExc_ValueError, "unpack: %zd codes of %zd bits need %zd bytes and room "
                     "for %zd codes; got %zd bytes and room for %zd", count, bits,
                     packed_bytes(count, bits), count, v[0].len, v[1].len);
    else if (!ck_overlap(&v[0], &v[1], "unpack")) {  /* (the buffers' loops differ) */
        CK_BEGIN_NOGIL(count)
        unpack(v[0].buf, (int)bits, count, v[1].buf);
        CK_END_NOGIL
    }
    return ck_none(v, 2);
}

PyMethodDef ck_bitpack_methods[] = {
    {"bitpack_pack", ck_pack, METH_VARARGS, "pack(codes, bits, out): dense bit packing."},
    {"bitpack_unpack", ck_unpack, METH_VARARGS, "unpack(buf, bits, count, out)."},
    {NULL, NULL, 0, NULL},
};
