/* BytePlanes' Huffman coder (the twins of ckptcodecs/_pkernels.py and _pdecode.py): what its
   C files share. The block layout is described in _pkernels.py. */
#ifndef CKPTCODECS_PLANES_H
#define CKPTCODECS_PLANES_H

#include "native.h"

#define PL_MAX_LEN 12
#define PL_PAIRS_MAX 64
#define PL_ERR_TRUNCATED (-1) /* a table or bit stream runs past the end of the payload */
#define PL_ERR_CODE (-2)      /* a code table that is no complete prefix code, or no code */
#define PL_ERR_SPACE (-3)     /* (C only) the output is too small for the code */
#define PL_RAW 0
#define PL_HUFFMAN 1
#define PL_ZSTD 2

/* Little-endian u32 at p, whatever the CPU. */
static inline uint32_t pl_load32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The used symbols of lens (each 0..PL_MAX_LEN) in canonical order (by length, then symbol)
   into order; returns their count. */
int pl_canonical(const int lens[256], int order[256]);

/* The kernels of planes_decode.c and planes_encode.c, listed in planes.c's table. */
PyObject *ck_planes_huffman_decode(PyObject *self, PyObject *args);

#endif
