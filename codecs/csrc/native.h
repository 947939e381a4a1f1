/* ckptcodecs._native: shared helpers of the compiled kernels (buffers and bounds). */
#ifndef CKPTCODECS_NATIVE_H
#define CKPTCODECS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Acquire a C-contiguous buffer of `itemsize`-byte items (writable when asked); on failure a
   Python exception is set and -1 returned, nothing held. */
int ck_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize,
              const char *name);

/* Release the first `count` views. */
void ck_release(Py_buffer *views, int count);

/* 1 when the runs [start + r * pitch, ... + length) for r < count all lie in [0, size);
   0 (after setting a ValueError naming `what`) when a value is negative or a run is outside. */
int ck_runs_fit(Py_ssize_t start, Py_ssize_t count, Py_ssize_t pitch, Py_ssize_t length,
                Py_ssize_t size, const char *what);

/* 1 (after setting a ValueError naming `what`) when the bytes of two views overlap. */
int ck_overlap(const Py_buffer *a, const Py_buffer *b, const char *what);

/* The items of a view. */
static inline Py_ssize_t ck_items(const Py_buffer *v) { return v->len / v->itemsize; }

/* Unaligned little-endian loads and stores (the buffers are any numpy slices). */
static inline uint16_t ck_load16(const uint8_t *p) { uint16_t x; memcpy(&x, p, 2); return x; }
static inline uint32_t ck_load32(const uint8_t *p) { uint32_t x; memcpy(&x, p, 4); return x; }
static inline uint64_t ck_load64(const uint8_t *p) { uint64_t x; memcpy(&x, p, 8); return x; }

/* The first items of `count` (a multiple of 16) split into planes / merged from planes by
   vector code (transpose.c); the callers' plain loops do the rest. */
Py_ssize_t ck_split_blocks(const uint8_t *src, Py_ssize_t count, int itemsize, int rotate,
                           uint8_t *const *planes);
Py_ssize_t ck_merge_blocks(const uint8_t *const *planes, Py_ssize_t count, int itemsize,
                           int rotate, uint8_t *dst);

/* The CPU path of the transposes: ck_set_simd("auto" | "portable" | "sse2" | "avx2") -> 0, or
   -1 with a ValueError where this build and CPU cannot run it; ck_simd() its name;
   ck_simd_paths() a new list of the names they can run. */
int ck_set_simd(const char *name);
const char *ck_simd(void);
PyObject *ck_simd_paths(void);

/* RLEHuffman's tables (rle_huffman_tables.c): Huffman code lengths (at most 24) of the positive
   freq[0..n) into lens, canonical codes of lens[0..n) (each 0..24) into codes; 0 when memory
   runs out. */
int ck_code_lengths(const int64_t *freq, Py_ssize_t n, int64_t *lens);
int ck_canonical_codes(const int64_t *lens, Py_ssize_t n, int64_t *codes);

/* RLEHuffman's kernels kept in its other files, listed in rle_huffman.c's table. */
PyObject *ck_rle_code_lengths(PyObject *self, PyObject *args);
PyObject *ck_rle_canonical_codes(PyObject *self, PyObject *args);
PyObject *ck_rle_decode_symbols(PyObject *self, PyObject *args);

/* The kernel families' method tables (each C file of a family ends with its table; module.c
   adds them all to the module). A kernel `name` of family `f` is listed as "f_name". */
extern PyMethodDef ck_bytegroup_methods[];
extern PyMethodDef ck_bitpack_methods[];
extern PyMethodDef ck_delta_methods[];
extern PyMethodDef ck_rle_huffman_methods[];
extern PyMethodDef ck_quant_methods[];
extern PyMethodDef ck_select_methods[];
extern PyMethodDef ck_adaptive_methods[];

#endif
