/* BytePlanes' Huffman coder: the canonical order its encoder and decoder share, and the
   family's method table ("planes_<kernel>", the twins of _pkernels.py's and _pdecode.py's). */
#include "planes.h"

int pl_canonical(const int lens[256], int order[256])
{
    int first[PL_MAX_LEN + 2] = {0};  /* counting sort by length */
    for (int s = 0; s < 256; s++)
        first[lens[s] + 1]++;
    first[1] = 0;  /* unused symbols (length 0) are left out */
    for (int length = 2; length < PL_MAX_LEN + 2; length++)
        first[length] += first[length - 1];
    for (int s = 0; s < 256; s++)
        if (lens[s])
            order[first[lens[s]]++] = s;
    return first[PL_MAX_LEN];
}

PyMethodDef ck_planes_methods[] = {
    {"planes_huffman_decode", ck_planes_huffman_decode, METH_VARARGS,
     "huffman_decode(buf, block, plane) -> bytes of buf consumed, or an ERR_* code."},
    {NULL, NULL, 0, NULL},
};
