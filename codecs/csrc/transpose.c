/* Byte transposes of blocks of items of 2, 4 or 8 bytes to their byte planes and back, with
   SSE2 (16 items a step; every x86-64 CPU has it) or AVX2 (32 items a step), chosen at run
   time (ck_set_simd). Seen as an address of bits [vector | lane], a round of unpacks (vector j
   with vector j + n/2, low and high halves) rotates the address left by one bit; the 16 lanes
   are 4 bits, so items -> planes takes 4 rounds and planes -> items log2(n). AVX2 runs the
   same rounds in each 128-bit half, on items 0..15 and 16..31. The AVX-512 path narrows and
   widens items of 2 and 4 bytes instead (vpmovdb/vpmovwb, vpmovzxbd/vpmovzxbw: 64 or 128
   items a step), and runs AVX2's rounds for 8-byte items. The "portable" path, and every
   CPU without SSE2, does no vector code here: the callers' plain loops do all the work. */
#include "native.h"

enum { PORTABLE = CK_PORTABLE, SSE2 = CK_SSE2, AVX2 = CK_AVX2, AVX512 = CK_AVX512 };
static const char *const PATH_NAMES[] = {"portable", "sse2", "avx2", "avx512"};
static int path = PORTABLE;  /* set once at import by ckptcodecs._backend (ck_set_simd) */

#if defined(__SSE2__)
#include <immintrin.h>
#define HAVE_SSE2 1
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))

ALWAYS_INLINE void unpack_round(__m128i *v, const int n)
{
    __m128i t[8];
    for (int j = 0; j < n / 2; j++) {
        t[2 * j] = _mm_unpacklo_epi8(v[j], v[j + n / 2]);
        t[2 * j + 1] = _mm_unpackhi_epi8(v[j], v[j + n / 2]);
    }
    for (int j = 0; j < n; j++)
        v[j] = t[j];
}

/* Each `n`-byte lane of x rotated by one bit: left when `left`, else right. */
ALWAYS_INLINE __m128i rotate1(__m128i x, const int n, const int left)
{
    if (n == 2)
        return left ? _mm_or_si128(_mm_slli_epi16(x, 1), _mm_srli_epi16(x, 15))
                    : _mm_or_si128(_mm_srli_epi16(x, 1), _mm_slli_epi16(x, 15));
    if (n == 4)
        return left ? _mm_or_si128(_mm_slli_epi32(x, 1), _mm_srli_epi32(x, 31))
                    : _mm_or_si128(_mm_srli_epi32(x, 1), _mm_slli_epi32(x, 31));
    return left ? _mm_or_si128(_mm_slli_epi64(x, 1), _mm_srli_epi64(x, 63))
                : _mm_or_si128(_mm_srli_epi64(x, 1), _mm_slli_epi64(x, 63));
}

ALWAYS_INLINE Py_ssize_t split_sse2(const uint8_t *src, Py_ssize_t i, Py_ssize_t count,
                                    const int n, int rotate, uint8_t *const *planes)
{
    __m128i v[8];
    for (; i + 16 <= count; i += 16) {
        for (int j = 0; j < n; j++) {
            v[j] = _mm_loadu_si128((const __m128i *)(src + i * n + 16 * j));
            if (rotate)
                v[j] = rotate1(v[j], n, 1);
        }
        for (int r = 0; r < 4; r++)
            unpack_round(v, n);
        for (int j = 0; j < n; j++)
            _mm_storeu_si128((__m128i *)(planes[j] + i), v[j]);
    }
    return i;
}

ALWAYS_INLINE Py_ssize_t merge_sse2(const uint8_t *const *planes, Py_ssize_t i,
                                    Py_ssize_t count, const int n, int rotate, uint8_t *dst)
{
    const int rounds = n == 2 ? 1 : n == 4 ? 2 : 3;
    __m128i v[8];
    for (; i + 16 <= count; i += 16) {
        for (int j = 0; j < n; j++)
            v[j] = _mm_loadu_si128((const __m128i *)(planes[j] + i));
        for (int r = 0; r < rounds; r++)
            unpack_round(v, n);
        for (int j = 0; j < n; j++)
            _mm_storeu_si128((__m128i *)(dst + i * n + 16 * j), rotate ? rotate1(v[j], n, 0)
                                                                      : v[j]);
    }
    return i;
}

AVX2_INLINE void unpack_round256(__m256i *v, const int n)
{
    __m256i t[8];
    for (int j = 0; j < n / 2; j++) {
        t[2 * j] = _mm256_unpacklo_epi8(v[j], v[j + n / 2]);
        t[2 * j + 1] = _mm256_unpackhi_epi8(v[j], v[j + n / 2]);
    }
    for (int j = 0; j < n; j++)
        v[j] = t[j];
}

AVX2_INLINE __m256i rotate256(__m256i x, const int n, const int left)
{
    if (n == 2)
        return left ? _mm256_or_si256(_mm256_slli_epi16(x, 1), _mm256_srli_epi16(x, 15))
                    : _mm256_or_si256(_mm256_srli_epi16(x, 1), _mm256_slli_epi16(x, 15));
    if (n == 4)
        return left ? _mm256_or_si256(_mm256_slli_epi32(x, 1), _mm256_srli_epi32(x, 31))
                    : _mm256_or_si256(_mm256_srli_epi32(x, 1), _mm256_slli_epi32(x, 31));
    return left ? _mm256_or_si256(_mm256_slli_epi64(x, 1), _mm256_srli_epi64(x, 63))
                : _mm256_or_si256(_mm256_srli_epi64(x, 1), _mm256_slli_epi64(x, 63));
}

/* 16 bytes at lo in the low half, 16 at hi in the high half. */
AVX2_INLINE __m256i load_halves(const uint8_t *lo, const uint8_t *hi)
{
    return _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
        _mm_loadu_si128((const __m128i *)hi), 1);
}

AVX2_INLINE Py_ssize_t split_avx2(const uint8_t *src, Py_ssize_t count, const int n,
                                  int rotate, uint8_t *const *planes)
{
    __m256i v[8];
    Py_ssize_t i = 0;
    for (; i + 32 <= count; i += 32) {  /* items i..i+15 in the low halves, i+16.. high */
        for (int j = 0; j < n; j++) {
            v[j] = load_halves(src + i * n + 16 * j, src + (i + 16) * n + 16 * j);
            if (rotate)
                v[j] = rotate256(v[j], n, 1);
        }
        for (int r = 0; r < 4; r++)
            unpack_round256(v, n);
        for (int j = 0; j < n; j++)
            _mm256_storeu_si256((__m256i *)(planes[j] + i), v[j]);
    }
    return i;
}

AVX2_INLINE Py_ssize_t merge_avx2(const uint8_t *const *planes, Py_ssize_t count, const int n,
                                  int rotate, uint8_t *dst)
{
    const int rounds = n == 2 ? 1 : n == 4 ? 2 : 3;
    __m256i v[8];
    Py_ssize_t i = 0;
    for (; i + 32 <= count; i += 32) {
        for (int j = 0; j < n; j++)
            v[j] = _mm256_loadu_si256((const __m256i *)(planes[j] + i));
        for (int r = 0; r < rounds; r++)
            unpack_round256(v, n);
        for (int j = 0; j < n; j++) {
            __m256i x = rotate ? rotate256(v[j], n, 0) : v[j];
            _mm_storeu_si128((__m128i *)(dst + i * n + 16 * j), _mm256_castsi256_si128(x));
            _mm_storeu_si128((__m128i *)(dst + (i + 16) * n + 16 * j),
                             _mm256_extracti128_si256(x, 1));
        }
    }
    return i;
}

__attribute__((target("avx2")))
static Py_ssize_t split_avx2_any(const uint8_t *src, Py_ssize_t count, int n, int rotate,
                                 uint8_t *const *planes)
{
    if (n == 2)
        return split_sse2(src, split_avx2(src, count, 2, rotate, planes), count, 2, rotate,
                          planes);
    if (n == 4)
        return split_sse2(src, split_avx2(src, count, 4, rotate, planes), count, 4, rotate,
                          planes);
    return split_sse2(src, split_avx2(src, count, 8, rotate, planes), count, 8, rotate, planes);
}

__attribute__((target("avx2")))
static Py_ssize_t merge_avx2_any(const uint8_t *const *planes, Py_ssize_t count, int n,
                                 int rotate, uint8_t *dst)
{
    if (n == 2)
        return merge_sse2(planes, merge_avx2(planes, count, 2, rotate, dst), count, 2, rotate,
                          dst);
    if (n == 4)
        return merge_sse2(planes, merge_avx2(planes, count, 4, rotate, dst), count, 4, rotate,
                          dst);
    return merge_sse2(planes, merge_avx2(planes, count, 8, rotate, dst), count, 8, rotate, dst);
}

/* AVX-512 (x86-64-v4) for items of 2 and 4 bytes, 64 items a step: each vector of items is
   narrowed to its bytes (vpmovdb / vpmovwb: plane k is the items shifted right by 8k, each
   truncated to a byte), and the planes widened back (vpmovzxbd / vpmovzxbw) and shifted into
   place -- what numba's LLVM makes of the plain loops on this CPU (AMD EPYC, AVX-512), where
   the unpack rounds above ran at 0.86-0.91x its speed. Each plane's bytes of a step are
   stored (or loaded) together, whole 64-byte lines, as numba's loops do. */
#define AVX512_FN static CK_TARGET_AVX512  /* x86-64-v4, as CK_BUILDS' copies */

AVX512_FN Py_ssize_t split_avx512(const uint8_t *src, Py_ssize_t count, int n, int rotate,
                                  uint8_t *const *planes)
{
    uint8_t *p0 = planes[0], *p1 = planes[1], *p2 = planes[2], *p3 = planes[3];
    Py_ssize_t i = 0;
    if (n == 4) {
        for (; i + 64 <= count; i += 64) {  /* 64 bytes of each plane stored together */
            __m512i x[4];
            for (int j = 0; j < 4; j++) {
                x[j] = _mm512_loadu_si512((const void *)(src + 4 * (i + 16 * j)));
                if (rotate)
                    x[j] = _mm512_rol_epi32(x[j], 1);
            }
            for (int j = 0; j < 4; j++)
                _mm_storeu_si128((__m128i *)(p0 + i + 16 * j), _mm512_cvtepi32_epi8(x[j]));
            for (int j = 0; j < 4; j++)
                _mm_storeu_si128((__m128i *)(p1 + i + 16 * j),
                                 _mm512_cvtepi32_epi8(_mm512_srli_epi32(x[j], 8)));
            for (int j = 0; j < 4; j++)
                _mm_storeu_si128((__m128i *)(p2 + i + 16 * j),
                                 _mm512_cvtepi32_epi8(_mm512_srli_epi32(x[j], 16)));
            for (int j = 0; j < 4; j++)
                _mm_storeu_si128((__m128i *)(p3 + i + 16 * j),
                                 _mm512_cvtepi32_epi8(_mm512_srli_epi32(x[j], 24)));
        }
    } else if (n == 2) {
        for (; i + 128 <= count; i += 128) {  /* two lines of each plane stored together */
            __m512i x[4], lo[4], hi[4];
            for (int j = 0; j < 4; j++) {
                x[j] = _mm512_loadu_si512((const void *)(src + 2 * (i + 32 * j)));
                /* rotated: the low byte of (x << 1 | x >> 15), the high byte x >> 7's */
                lo[j] = rotate ? _mm512_or_si512(_mm512_slli_epi16(x[j], 1),
                                                 _mm512_srli_epi16(x[j], 15))
                               : x[j];
                hi[j] = _mm512_srli_epi16(x[j], rotate ? 7 : 8);
            }
            for (int j = 0; j < 4; j++)
                _mm256_storeu_si256((__m256i *)(p0 + i + 32 * j), _mm512_cvtepi16_epi8(lo[j]));
            for (int j = 0; j < 4; j++)
                _mm256_storeu_si256((__m256i *)(p1 + i + 32 * j), _mm512_cvtepi16_epi8(hi[j]));
        }
    }
    return i;
}

AVX512_FN Py_ssize_t merge_avx512(const uint8_t *const *planes, Py_ssize_t count, int n,
                                  int rotate, uint8_t *dst)
{
    const uint8_t *p0 = planes[0], *p1 = planes[1], *p2 = planes[2], *p3 = planes[3];
    Py_ssize_t i = 0;
    if (n == 4) {
        for (; i + 64 <= count; i += 64) {  /* a line of each plane, four lines of items */
            __m512i x[4];
            for (int j = 0; j < 4; j++)
                x[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p0 + i + 16 * j)));
            for (int j = 0; j < 4; j++)
                x[j] = _mm512_or_si512(x[j], _mm512_slli_epi32(_mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(p1 + i + 16 * j))), 8));
            for (int j = 0; j < 4; j++)
                x[j] = _mm512_or_si512(x[j], _mm512_slli_epi32(_mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(p2 + i + 16 * j))), 16));
            for (int j = 0; j < 4; j++)
                x[j] = _mm512_or_si512(x[j], _mm512_slli_epi32(_mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(p3 + i + 16 * j))), 24));
            for (int j = 0; j < 4; j++)
                _mm512_storeu_si512((void *)(dst + 4 * (i + 16 * j)),
                                    rotate ? _mm512_ror_epi32(x[j], 1) : x[j]);
        }
    } else if (n == 2) {
        for (; i + 64 <= count; i += 64)
            for (int j = 0; j < 2; j++) {
                Py_ssize_t at = i + 32 * j;
                __m512i b0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p0 + at)));
                __m512i b1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p1 + at)));
                __m512i x = _mm512_or_si512(b0, _mm512_slli_epi16(b1, 8));
                if (rotate)
                    x = _mm512_or_si512(_mm512_srli_epi16(x, 1), _mm512_slli_epi16(x, 15));
                _mm512_storeu_si512((void *)(dst + 2 * at), x);
            }
    }
    return i;
}

/* The items left after the AVX-512 steps, 16 at a time (SSE2). */
static Py_ssize_t split_sse2_from(const uint8_t *src, Py_ssize_t i, Py_ssize_t count, int n,
                                  int rotate, uint8_t *const *planes)
{
    return n == 2 ? split_sse2(src, i, count, 2, rotate, planes)
                  : split_sse2(src, i, count, 4, rotate, planes);
}

static Py_ssize_t merge_sse2_from(const uint8_t *const *planes, Py_ssize_t i, Py_ssize_t count,
                                  int n, int rotate, uint8_t *dst)
{
    return n == 2 ? merge_sse2(planes, i, count, 2, rotate, dst)
                  : merge_sse2(planes, i, count, 4, rotate, dst);
}

Py_ssize_t ck_split_blocks(const uint8_t *src, Py_ssize_t count, int itemsize, int rotate,
                           uint8_t *const *planes)
{
    if (path >= AVX512 && itemsize <= 4)
        return split_sse2_from(src, split_avx512(src, count, itemsize, rotate, planes), count,
                               itemsize, rotate, planes);
    if (path >= AVX2)  /* 8-byte items have no AVX-512 code: AVX2 there */
        return split_avx2_any(src, count, itemsize, rotate, planes);
    if (path == PORTABLE)
        return 0;
    if (itemsize == 2)
        return split_sse2(src, 0, count, 2, rotate, planes);
    if (itemsize == 4)
        return split_sse2(src, 0, count, 4, rotate, planes);
    return split_sse2(src, 0, count, 8, rotate, planes);
}

Py_ssize_t ck_merge_blocks(const uint8_t *const *planes, Py_ssize_t count, int itemsize,
                           int rotate, uint8_t *dst)
{
    if (path >= AVX512 && itemsize <= 4)
        return merge_sse2_from(planes, merge_avx512(planes, count, itemsize, rotate, dst), count,
                               itemsize, rotate, dst);
    if (path >= AVX2)  /* 8-byte items have no AVX-512 code: AVX2 there */
        return merge_avx2_any(planes, count, itemsize, rotate, dst);
    if (path == PORTABLE)
        return 0;
    if (itemsize == 2)
        return merge_sse2(planes, 0, count, 2, rotate, dst);
    if (itemsize == 4)
        return merge_sse2(planes, 0, count, 4, rotate, dst);
    return merge_sse2(planes, 0, count, 8, rotate, dst);
}

#else

Py_ssize_t ck_split_blocks(const uint8_t *src, Py_ssize_t count, int itemsize, int rotate,
                           uint8_t *const *planes)
{
    return 0;
}

Py_ssize_t ck_merge_blocks(const uint8_t *const *planes, Py_ssize_t count, int itemsize,
                           int rotate, uint8_t *dst)
{
    return 0;
}

#endif

/* 1 when this build and CPU can run path p. */
static int supported(int p)
{
#if defined(HAVE_SSE2)
    __builtin_cpu_init();
    /* what CK_TARGET_AVX2 compiles for (native.h): AVX2 with BMI1 and BMI2 */
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi")
               && __builtin_cpu_supports("bmi2");
    if (p == AVX2)
        return avx2;
    if (p == AVX512)  /* x86-64-v4: what CK_BUILDS' AVX-512 copies are compiled for */
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
               && __builtin_cpu_supports("avx512cd") && avx2;
    return 1;
#else
    return p == PORTABLE;
#endif
}

int ck_set_simd(const char *name)
{
    int best = PORTABLE;
    for (int p = PORTABLE; p <= AVX512; p++)
        best = supported(p) ? p : best;
    if (strcmp(name, "auto") == 0) {
        path = best;
        return 0;
    }
    for (int p = PORTABLE; p <= AVX512; p++)
        if (strcmp(name, PATH_NAMES[p]) == 0 && supported(p)) {
            path = p;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "SIMD path %s is not one this build and CPU run "
                 "(see simd_paths())", name);
    return -1;
}

const char *ck_simd(void) { return PATH_NAMES[path]; }

int ck_vector(void) { return path; }

PyObject *ck_simd_paths(void)
{
    PyObject *paths = PyList_New(0);
    for (int p = PORTABLE; paths != NULL && p <= AVX512; p++) {
        if (!supported(p))
            continue;
        PyObject *name = PyUnicode_FromString(PATH_NAMES[p]);
        if (name == NULL || PyList_Append(paths, name) < 0)
            Py_CLEAR(paths);
        Py_XDECREF(name);
    }
    return paths;
}
