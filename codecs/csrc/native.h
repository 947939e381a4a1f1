/* ckptcodecs._native: shared helpers of the compiled kernels (buffers and bounds). */
#ifndef CKPTCODECS_NATIVE_H
#define CKPTCODECS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Item sizes of ck_buffer besides a count of bytes: CK_FLOAT, float32 or float64 items (by
   the format too); CK_FLOAT_KM, the same with the k-means kernels' message; CK_ANY, any size
   (and no format asked for). */
enum { CK_ANY = -1, CK_FLOAT = -2, CK_FLOAT_KM = -3 };

/* Acquire a C-contiguous buffer of `itemsize`-byte items (or as above; writable when asked);
   on failure a Python exception (a ValueError naming `name` for the items) is set and -1
   returned, nothing held. */
int ck_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize,
              const char *name);

/* Release the first `count` views. */
void ck_release(Py_buffer *views, int count);

/* A kernel's buffer argument: its name in errors, its item size (as ck_buffer's), written or
   not. A wrapper lists its buffers, parses their objects into an array, and then:
       if (ck_buffers(obj, want, n, v) < 0)   -- all n acquired in order, or none
           return NULL;
       ... checks (a Python exception each), the kernel between CK_BEGIN/END_NOGIL ...
       return ck_none(v, n);                  -- released; NULL where an exception is set */
typedef struct {
    const char *name;
    Py_ssize_t itemsize;
    int writable;
} ck_want;
#define CK_IN(name, itemsize) {(name), (itemsize), 0}
#define CK_OUT(name, itemsize) {(name), (itemsize), 1}

/* objs[i] acquired into views[i] as wants[i] asks, for i < n in order: 0 with all n held, or
   -1 with the exception of the first that failed set and none held. (Inline, as ck_done: a
   call of a small kernel costs no more than with the checks written out.) */
static inline int ck_buffers(PyObject *const *objs, const ck_want *wants, int n,
                             Py_buffer *views)
{
    for (int i = 0; i < n; i++)
        if (ck_buffer(objs[i], &views[i], wants[i].writable, wants[i].itemsize,
                      wants[i].name) < 0) {
            ck_release(views, i);
            return -1;
        }
    return 0;
}

/* A wrapper's tail: views[0..n) released, then -1 where a Python exception is set, else 0;
   ck_none returns the wrapper's NULL or None. */
static inline int ck_done(Py_buffer *views, int n)
{
    ck_release(views, n);
    return PyErr_Occurred() ? -1 : 0;
}
/* A ValueError of printf's format (PyErr_Format takes no %g: its floats), NULL. */
__attribute__((format(printf, 1, 2))) static inline PyObject *ck_value_error(const char *fmt,
                                                                             ...)
{
    char text[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    PyErr_SetString(PyExc_ValueError, text);
    return NULL;
}

static inline PyObject *ck_none(Py_buffer *views, int n)
{
    return ck_done(views, n) < 0 ? NULL : Py_NewRef(Py_None);
}

/* A kernel releases the GIL around its work only where it is at least ck_nogil_min bytes (or
   their equivalent): a thread that takes the GIL back beside one that keeps it busy waits up to
   the switch interval (5 ms) for it, and a short kernel is over before another thread could
   use what the release frees (numpy's NPY_BEGIN_THREADS_THRESHOLDED, for the same reason at a
   smaller size). CK_NOGIL_MIN, 128 KiB, is some 30-60 us of a streaming kernel; the
   histogram-sized calls of a persist (a sample's statistics, a code's lengths) stay under it.
   _native.nogil_min(bytes) sets it for the process (0: every call releases, as before). */
#define CK_NOGIL_MIN ((Py_ssize_t)1 << 17)
extern Py_ssize_t ck_nogil_min;
/* a * b for CK_BEGIN_NOGIL's measure, the largest Py_ssize_t where it would overflow (a, b >=
   0; SIZE_MAX / 2, as PY_SSIZE_T_MAX needs POSIX's SSIZE_MAX, which -std=c11 hides here) */
static inline Py_ssize_t ck_work(Py_ssize_t a, Py_ssize_t b)
{
    const Py_ssize_t most = (Py_ssize_t)(SIZE_MAX >> 1);
    return b != 0 && a > most / b ? most : a * b;
}
#define CK_BEGIN_NOGIL(bytes)                                                                  \
    {                                                                                          \
        PyThreadState *ck_save_ = (Py_ssize_t)(bytes) >= ck_nogil_min ? PyEval_SaveThread()   \
                                                                       : NULL;
#define CK_END_NOGIL                                                                           \
    if (ck_save_ != NULL)                                                                      \
        PyEval_RestoreThread(ck_save_);                                                        \
    }

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
/* Little-endian stores, whatever the CPU (headers written byte by byte). */
static inline void ck_store16(uint8_t *p, uint16_t x)
{
    p[0] = (uint8_t)x;
    p[1] = (uint8_t)(x >> 8);
}
static inline void ck_store32(uint8_t *p, uint32_t x)
{
    ck_store16(p, (uint16_t)x);
    ck_store16(p + 2, (uint16_t)(x >> 16));
}
static inline void ck_store64(uint8_t *p, uint64_t x)
{
    ck_store32(p, (uint32_t)x);
    ck_store32(p + 4, (uint32_t)(x >> 32));
}

/* The first items of `count` (a multiple of 16) split into planes / merged from planes by
   vector code (transpose.c); the callers' plain loops do the rest. */
Py_ssize_t ck_split_blocks(const uint8_t *src, Py_ssize_t count, int itemsize, int rotate,
                           uint8_t *const *planes);
Py_ssize_t ck_merge_blocks(const uint8_t *const *planes, Py_ssize_t count, int itemsize,
                           int rotate, uint8_t *dst);

/* All `count` items (of 2, 4 or 8 bytes, dst aligned to them) merged from their planes: the
   vector steps, then the plain loop for the rest (bytegroup.c). */
void ck_merge_items(const uint8_t *const *planes, Py_ssize_t count, int itemsize, int rotate,
                    uint8_t *dst);

/* The CPU path of the transposes: ck_set_simd("auto" | "portable" | "sse2" | "avx2") -> 0, or
   -1 with a ValueError where this build and CPU cannot run it; ck_simd() its name;
   ck_simd_paths() a new list of the names they can run. */
int ck_set_simd(const char *name);
const char *ck_simd(void);
PyObject *ck_simd_paths(void);

/* The CPU paths as levels (each runs what the ones below it run): ck_vector() is the path in
   use, ck_set_simd's. */
enum { CK_PORTABLE, CK_SSE2, CK_AVX2, CK_AVX512 };
int ck_vector(void);

/* Builds of one loop for each CPU path. CK_LOOP marks the loop's function (static, always
   inlined: it takes the instructions of the function it is inlined into); CK_BUILDS(name,
   (params), (args)) then makes `static void name(params)` run it compiled for the baseline
   CPU, for AVX2 (+BMI2) or for AVX-512 (x86-64-v4), chosen per call by ck_vector() -- so that
   CKPTCODECS_SIMD forces each copy and the tests run every one. The same source in every
   copy, and no contraction (C11: -ffp-contract=off): the same bits; only the instructions
   differ. Where the compiler has no such targets, the three are one. */
#define CK_LOOP static inline __attribute__((always_inline)) void
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define CK_HAVE_BUILDS 1
#define CK_TARGET_AVX2 __attribute__((target("avx2,bmi,bmi2")))
#define CK_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#else
#define CK_HAVE_BUILDS 0
#define CK_TARGET_AVX2
#define CK_TARGET_AVX512
#endif
#define CK_BUILDS(name, params, args)                                                        \
    static void name##_base params { name##_loop args; }                                     \
    CK_TARGET_AVX2 static void name##_avx2 params { name##_loop args; }                      \
    CK_TARGET_AVX512 static void name##_avx512 params { name##_loop args; }                  \
    static void name params                                                                  \
    {                                                                                        \
        int level_ = CK_HAVE_BUILDS ? ck_vector() : CK_PORTABLE;                             \
        if (level_ >= CK_AVX512)                                                             \
            name##_avx512 args;                                                              \
        else if (level_ >= CK_AVX2)                                                          \
            name##_avx2 args;                                                                \
        else                                                                                 \
            name##_base args;                                                                \
    }

/* A hint to read the line `ahead` bytes past p into the cache, for a loop that streams through
   memory (the address may lie past the buffer: a prefetch never faults, and is made from an
   integer). The hardware's prefetcher did not keep up on the machines measured: BytePlanes'
   encoder ran at 1.6 GB/s on a 32 MB plane and at 3.2 on one that fits in the cache; with a
   hint 2 KiB ahead once a 64-byte line, at 2.8. */
#define CK_AHEAD 2048
/* Bytes from which a streamed buffer is taken as out of the cache (a kernel that pays for its
   prefetching loop in the cache runs it only from here). */
#define CK_FAR ((int64_t)4 << 20)
#if defined(__GNUC__)
#define CK_PREFETCH(p, ahead) __builtin_prefetch((const void *)((uintptr_t)(p) + (ahead)))
#else
#define CK_PREFETCH(p, ahead) ((void)0)
#endif

/* BytePlanes' split and sampling steps, unchecked (bytegroup.c): plane p of the n items of src
   at out + p * stride; the strided histograms, contiguous histograms and repeats of each plane
   added into freq[p], near[p] and set in repeats[p] (sample_rows). */
void ck_split_planes(const uint8_t *src, Py_ssize_t n, int itemsize, int rotate, uint8_t *out,
                     Py_ssize_t stride);
void ck_sample_planes(const uint8_t *out, Py_ssize_t stride, Py_ssize_t n, Py_ssize_t itemsize,
                      Py_ssize_t step, Py_ssize_t start, Py_ssize_t length, int64_t *freq,
                      int64_t *near, int64_t *repeats);

/* `count` codes of `bits` (1..8) bits packed into out (bitpack.c: ckptcodecs.bitpack's
   layout), unchecked. */
void ck_pack_bits(const uint8_t *codes, Py_ssize_t count, int bits, uint8_t *out);

/* RLEHuffman's payload in one call (rle_huffman.c; no GIL needed), the bytes of
   rle_huffman.py's rle_huffman_encode: ck_rh_pays, its gate (pays_to_code: whether a sample of
   data[0..n) says coding saves at least min_saving); ck_rh_encode, data coded into out, or
   stored raw where coding would not make it smaller (data and out apart; -1 when memory runs
   out); ck_rh_raw, data stored raw (data may be out + CK_RH_HEAD: kept in place). out has room
   for CK_RH_ROOM(n) bytes; each returns the bytes written. */
#define CK_RH_HEAD 10
#define CK_RH_ROOM(n) ((n) + 32)
int ck_rh_pays(const uint8_t *data, Py_ssize_t n, double min_saving);
Py_ssize_t ck_rh_encode(const uint8_t *data, Py_ssize_t n, uint8_t *out);
Py_ssize_t ck_rh_raw(const uint8_t *data, Py_ssize_t n, uint8_t *out);

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
extern PyMethodDef ck_planes_methods[];
extern PyMethodDef ck_floats_methods[];
extern PyMethodDef ck_kmeans_methods[];
extern PyMethodDef ck_adaptive_methods[];

#endif
