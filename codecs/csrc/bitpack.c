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

static void pack(const uint8_t *codes, Py_ssize_t count, int bits, uint8_t *out)
{
    uint64_t acc = 0;
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

static void unpack(const uint8_t *buf, int bits, Py_ssize_t count, uint8_t *out)
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

PyObject *ck_pack(PyObject *self, PyObject *args)
{
    PyObject *codes_obj, *out_obj;
    Py_ssize_t bits;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnO", &codes_obj, &bits, &out_obj) || !check_bits(bits, "pack"))
        return NULL;
    if (ck_buffer(codes_obj, &v[0], 0, 1, "pack codes") < 0)
        return NULL;
    if (ck_buffer(out_obj, &v[1], 1, 1, "pack out") < 0) {
        ck_release(v, 1);
        return NULL;
    }
    Py_ssize_t need = packed_bytes(v[0].len, bits);
    if (v[1].len < need) {
        PyErr_Format(PyExc_ValueError, "pack: %zd codes of %zd bits need %zd bytes, out holds "
                     "%zd", v[0].len, bits, need, v[1].len);
        ck_release(v, 2);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pack(v[0].buf, v[0].len, (int)bits, v[1].buf);
    Py_END_ALLOW_THREADS
    ck_release(v, 2);
    Py_RETURN_NONE;
}

PyObject *ck_unpack(PyObject *self, PyObject *args)
{
    PyObject *buf_obj, *out_obj;
    Py_ssize_t bits, count;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnnO", &buf_obj, &bits, &count, &out_obj)
        || !check_bits(bits, "unpack"))
        return NULL;
    if (count < 0)
        return PyErr_Format(PyExc_ValueError, "unpack: count %zd is negative", count);
    if (ck_buffer(buf_obj, &v[0], 0, 1, "unpack buf") < 0)
        return NULL;
    if (ck_buffer(out_obj, &v[1], 1, 1, "unpack out") < 0) {
        ck_release(v, 1);
        return NULL;
    }
    if (v[1].len < count || v[0].len < packed_bytes(count, bits)) {
        PyErr_Format(PyExc_ValueError, "unpack: %zd codes of %zd bits need %zd bytes and room "
                     "for %zd codes; got %zd bytes and room for %zd", count, bits,
                     packed_bytes(count, bits), count, v[0].len, v[1].len);
        ck_release(v, 2);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    unpack(v[0].buf, (int)bits, count, v[1].buf);
    Py_END_ALLOW_THREADS
    ck_release(v, 2);
    Py_RETURN_NONE;
}
