/* The 16-bit float casts on bits (the twins of ckptcodecs/_floats.py's _bf16_of, _f16_of and
   _f32_of_f16), shared by floats.c and the k-means kernels: unsigned integers and selects
   only, so that loops over them vectorize. */
#ifndef CKPTCODECS_FLOATS_H
#define CKPTCODECS_FLOATS_H

#include <stdint.h>
#include <string.h>

/* bfloat16 bits of the float32 bits x: nearest, ties to even; NaN quiet with its sign and high
   payload; a finite value rounded to infinity saturates at the largest finite bfloat16. */
static inline uint16_t ck_bf16_of(uint32_t x)
{
    uint32_t a = x & 0x7FFFFFFFu;
    uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    if (a > 0x7F800000u)
        r = (x >> 16) | 0x40u;
    else if (a < 0x7F800000u && (r & 0x7FFFu) == 0x7F80u)
        r = (r & 0x8000u) | 0x7F7Fu;
    return (uint16_t)r;
}

/* float16 bits of the float32 bits x, as numpy's cast: nearest, ties to even, beyond the range
   +-inf; NaN keeps its sign and its payload's high bits, never 0. */
static inline uint16_t ck_f16_of(uint32_t x)
{
    uint32_t a = x & 0x7FFFFFFFu;
    /* normal halves: rebias, round at bit 13, ties to the even one (wraps where unused) */
    uint32_t h = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    if (a < 0x38800000u) {  /* subnormal halves: m * 2**-24 rounded, ties to the even one */
        uint32_t e = a >> 23 < 112u ? a >> 23 : 112u;
        uint32_t s = 126u - e < 31u ? 126u - e : 31u;  /* 14..31 */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t q = m >> s, rest = m & ((1u << s) - 1u), half = 1u << (s - 1u);
        h = q + (uint32_t)((rest > half) | ((rest == half) & ((q & 1u) == 1u)));
    }
    if (a >= 0x47800000u)
        h = 0x7C00u;
    if (a > 0x7F800000u) {
        uint32_t nan = 0x7C00u | ((a >> 13) & 0x3FFu);
        h = nan > 0x7C01u ? nan : 0x7C01u;
    }
    return (uint16_t)(h | ((x >> 16) & 0x8000u));
}

/* float32 bits of the float16 bits h (exact; NaN payloads kept). */
static inline uint32_t ck_f32_of_f16(uint16_t h)
{
    uint32_t x = h, e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
    uint32_t r = ((e + 112u) << 23) | (m << 13);
    if (e == 31u)
        r = 0x7F800000u | (m << 13);
    if (e == 0u) {  /* zero or m * 2**-24: m's top bit sets the exponent */
        uint64_t z = (uint64_t)__builtin_clzll((uint64_t)(m | 1u));  /* top bit: 63 - z */
        r = (uint32_t)(((166u - z) << 23) | (((uint64_t)m << (z - 40u)) & 0x7FFFFFu));
        if (m == 0u)
            r = 0u;
    }
    return r | ((x & 0x8000u) << 16);
}

static inline float ck_float_of(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
static inline uint32_t ck_bits_of(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

#endif
