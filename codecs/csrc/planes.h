/* BytePlanes' Huffman coder (the twins of ckptcodecs/_pkernels.py and _pdecode.py): what its
   C files share. The block layout is described in _pkernels.py. */
#ifndef CKPTCODECS_PLANES_H
#define CKPTCODECS_PLANES_H

#include "native.h"

#define PL_MAX_LEN 12
/* the GIL's measure of one histogram's code lengths (CK_BEGIN_NOGIL): 10-20 us, as long as a
   streaming kernel takes over this many bytes */
#define PL_LENGTHS_BYTES ((Py_ssize_t)32 << 10)
#define PL_PAIRS_MAX 64
#define PL_ERR_TRUNCATED (-1) /* a table or bit stream runs past the end of the payload */
#define PL_ERR_CODE (-2)      /* a code table that is no complete prefix code, or no code */
#define PL_ERR_SPACE (-3)     /* (C only) the output is too small for the code */
#define PL_RAW 0
#define PL_HUFFMAN 1
#define PL_ZSTD 2

/* The hot loops are built twice on x86-64: for the baseline, and with BMI2 (shifts by a
   variable count in one instruction: shrx, shlx), run where CKPTCODECS_SIMD's path is avx2
   and the CPU has BMI2 and MOVBE (what numba, compiling for the host CPU, uses). */
#if defined(__x86_64__) && defined(__GNUC__)
#define PL_HAVE_BMI2 1
#define PL_BMI2 __attribute__((target("bmi2,movbe")))
#else
#define PL_HAVE_BMI2 0
#define PL_BMI2
#endif
#define PL_INLINE static inline __attribute__((always_inline))
/* A compiler barrier: the loads above it are emitted before the stores below it. */
#if defined(__GNUC__)
#define PL_LOADS_FIRST() __asm__ volatile("" ::: "memory")
#else
#define PL_LOADS_FIRST() ((void)0)
#endif

/* 1 when the kernels run their BMI2 loops (read with the GIL held). */
static inline int pl_bmi2(void)
{
#if PL_HAVE_BMI2
    __builtin_cpu_init();
    return ck_vector() >= CK_AVX2 && __builtin_cpu_supports("bmi2")
           && __builtin_cpu_supports("movbe");
#else
    return 0;
#endif
}

/* Little-endian u16 at p, whatever the CPU. */
static inline uint32_t pl_load16le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

/* Little-endian u32 at p, whatever the CPU. */
static inline uint32_t pl_load32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The used symbols of lens (each 0..PL_MAX_LEN) in canonical order (by length, then symbol)
   into order; returns their count. */
int pl_canonical(const int lens[256], int order[256]);

#define PL_ERR_MEMORY (-4)    /* (C only) no memory for the pair table */

/* Byte histograms of each block of plane[0..n) into freq[nblocks][256] (planes_stats.c). */
void pl_stats(const uint8_t *plane, int64_t n, int64_t block, int64_t *freq, int bmi2);
/* Code lengths (at most PL_MAX_LEN) of the 256 frequencies freq into lens. */
void pl_code_lengths(const int64_t *freq, int64_t *lens);
/* Code lengths of each of nblocks histograms; returns the bound on the code's bytes. */
int64_t pl_lengths(const int64_t *freq, int64_t nblocks, int64_t *lens);
/* The bound of huffman_bound on the code of n bytes. */
int64_t pl_bound(int64_t n, int64_t block);
/* 1 when lens[0..count) all lie in 0..PL_MAX_LEN, else 0 after setting a ValueError. */
/* 1 when every count of freq[0..count) is a count of bytes (0 .. PL_MAX_FREQ), else 0 after a
   ValueError naming `what`: larger ones overflow the size sums (signed: undefined). */
#define PL_MAX_FREQ (INT64_C(1) << 47)
int pl_freq_ok(const int64_t *freq, int64_t count, const char *what);
int pl_lens_ok(const int64_t *lens, int64_t count, const char *what);
/* Encode plane[0..n) with lens[nblocks][256] into out (size bytes): the bytes written, or
   PL_ERR_SPACE / PL_ERR_MEMORY (planes_encode.c). */
int64_t pl_encode_lengths(const uint8_t *plane, int64_t n, int64_t block, const int64_t *lens,
                          uint8_t *out, int64_t size, int bmi2);

/* Decode the Huffman block at buf[pos..] (a plane's payload of size bytes) into out[0..len):
   the position after the block, or an error code (planes_decode.c). */
int64_t pl_huffman_block(const uint8_t *buf, int64_t size, int64_t pos, uint8_t *out,
                         int64_t len, int bmi2);

#define PL_PLANE_HEAD 9 /* a plane's head in the payload: u8 method, u64 size */

/* choose_methods and pack_planes without their checks (planes_pack.c). */
int64_t pl_choose(const int64_t *freq, const int64_t *near, const int64_t *repeats,
                  int64_t planes, int64_t count, int64_t length, double below, double extra,
                  int64_t *methods);
int64_t pl_pack(uint8_t *out, int64_t base, int64_t n, int64_t itemsize, int64_t block,
                int64_t *methods, const uint8_t *zbuf, const int64_t *zoff, int bmi2);

/* The kernels of the family's files, listed in planes.c's table. */
PyObject *ck_planes_encode_layout(PyObject *self, PyObject *args);
PyObject *ck_planes_huffman_decode(PyObject *self, PyObject *args);
PyObject *ck_planes_decode_into(PyObject *self, PyObject *args);
PyObject *ck_planes_huffman_encode_lengths(PyObject *self, PyObject *args);
PyObject *ck_planes_huffman_encode(PyObject *self, PyObject *args);
PyObject *ck_planes_huffman_bound(PyObject *self, PyObject *args);
PyObject *ck_planes_plane_stats(PyObject *self, PyObject *args);
PyObject *ck_planes_code_lengths(PyObject *self, PyObject *args);
PyObject *ck_planes_huffman_lengths(PyObject *self, PyObject *args);
PyObject *ck_planes_huffman_size(PyObject *self, PyObject *args);
PyObject *ck_planes_choose_methods(PyObject *self, PyObject *args);
PyObject *ck_planes_pack_planes(PyObject *self, PyObject *args);

#endif
