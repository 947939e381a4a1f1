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
    {"planes_decode_into", ck_planes_decode_into, METH_VARARGS,
     "decode_into(buf, out, scratch) -> 0 when a BytePlanes payload of raw and Huffman planes"
     " (items of 2, 4 or 8 bytes) is decoded into out, 1 when _planes_decode is to decode it,"
     " or the scratch bytes it needs (> 1) when scratch is smaller."},
    {"planes_plane_stats", ck_planes_plane_stats, METH_VARARGS,
     "plane_stats(plane, block, freq): byte histograms of each block (int64 rows of 256)."},
    {"planes_code_lengths", ck_planes_code_lengths, METH_VARARGS,
     "code_lengths(freq, lens): code lengths (<= 12 bits) of one histogram."},
    {"planes_huffman_lengths", ck_planes_huffman_lengths, METH_VARARGS,
     "huffman_lengths(freq, lens) -> a bound on the code's bytes."},
    {"planes_huffman_size", ck_planes_huffman_size, METH_VARARGS,
     "huffman_size(plane, block) -> the bound of huffman_lengths on the plane's code."},
    {"planes_huffman_bound", ck_planes_huffman_bound, METH_VARARGS,
     "huffman_bound(n, block) -> bytes huffman_encode may write for n bytes."},
    {"planes_huffman_encode_lengths", ck_planes_huffman_encode_lengths, METH_VARARGS,
     "huffman_encode_lengths(plane, block, lens, out) -> bytes written."},
    {"planes_huffman_encode", ck_planes_huffman_encode, METH_VARARGS,
     "huffman_encode(plane, block, freq, out) -> bytes written."},
    {"planes_choose_methods", ck_planes_choose_methods, METH_VARARGS,
     "choose_methods(freq, near, repeats, count, length, below, extra, methods) -> the planes"
     " where zstd may pay (a bitmask)."},
    {"planes_encode_layout", ck_planes_encode_layout, METH_VARARGS,
     "encode_layout(src, itemsize, rotate, out, base, stride, step, start, length, freq, near,"
     " repeats, methods, block, below, extra) -> (end, trials): split_rows, sample_rows,"
     " choose_methods and (no zstd trial) pack_planes in one call; end -1: trials to run."},
    {"planes_pack_planes", ck_planes_pack_planes, METH_VARARGS,
     "pack_planes(out, base, n, itemsize, block, methods, zbuf, zoff) -> where the last plane"
     " ends."},
    {NULL, NULL, 0, NULL},
};
