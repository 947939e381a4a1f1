/* Byte transposes of blocks of 16 items with SSE2 (every x86-64 CPU has it): items of 2, 4 or
   8 bytes to their byte planes and back. Seen as an address of bits [vector | lane], a round
   of unpacks (vector j with vector j + n/2, low and high halves) rotates the address left by one
   bit; the 16 lanes are 4 bits, so items -> planes takes 4 rounds and planes -> items log2(n).
   Elsewhere these return 0 items done and the callers' plain loops do all the work. */
#include "native.h"

/* Built with -DCKPTCODECS_PORTABLE (what a test does), the plain loops do everything. */
#if defined(__SSE2__) && !defined(CKPTCODECS_PORTABLE)
#include <emmintrin.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

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

ALWAYS_INLINE Py_ssize_t split_n(const uint8_t *src, Py_ssize_t count, const int n, int rotate,
                                 uint8_t *const *planes)
{
    __m128i v[8];
    Py_ssize_t i = 0;
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

ALWAYS_INLINE Py_ssize_t merge_n(const uint8_t *const *planes, Py_ssize_t count, const int n,
                                 int rotate, uint8_t *dst)
{
    const int rounds = n == 2 ? 1 : n == 4 ? 2 : 3;
    __m128i v[8];
    Py_ssize_t i = 0;
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

Py_ssize_t ck_split_blocks(const uint8_t *src, Py_ssize_t count, int itemsize, int rotate,
                           uint8_t *const *planes)
{
    if (itemsize == 2)
        return split_n(src, count, 2, rotate, planes);
    if (itemsize == 4)
        return split_n(src, count, 4, rotate, planes);
    return itemsize == 8 ? split_n(src, count, 8, rotate, planes) : 0;
}

Py_ssize_t ck_merge_blocks(const uint8_t *const *planes, Py_ssize_t count, int itemsize,
                           int rotate, uint8_t *dst)
{
    if (itemsize == 2)
        return merge_n(planes, count, 2, rotate, dst);
    if (itemsize == 4)
        return merge_n(planes, count, 4, rotate, dst);
    return itemsize == 8 ? merge_n(planes, count, 8, rotate, dst) : 0;
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
