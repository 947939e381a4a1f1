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

static inline float ck_float_of(uint32_t bits) { float f; memcpy(&f, &bits, 4); return f; }
static inline uint32_t ck_bits_of(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* c ? a : b as a bit mask: the compiler keeps it a select (a ternary over float results may
   become a branch, which stops a loop's vectorization). */
static inline uint32_t ck_pick(int c, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

/* float16 bits of the float32 bits x, as numpy's cast: nearest, ties to even, beyond the range
   +-inf; NaN keeps its sign and its payload's high bits, never 0. Every case computed and
   selected (no branch, so that loops vectorize). A subnormal half is |x| * 2**24 rounded to an
   integer, ties to even: exact in float32 (a power of two), rounded by adding 2**23 (under
   the default rounding mode) -- the integer rounding of the reference, without its
   per-value shifts. */
static inline uint16_t ck_f16_of(uint32_t x)
{
    uint32_t a = x & 0x7FFFFFFFu;
    /* normal halves: rebias, round at bit 13, ties to the even one (wraps where unused) */
    uint32_t h = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    uint32_t sub = ck_bits_of(ck_float_of(a) * 0x1p24f + 0x1p23f) - 0x4B000000u;
    uint32_t nan = 0x7C00u | ((a >> 13) & 0x3FFu);
    nan = nan > 0x7C01u ? nan : 0x7C01u;
    h = ck_pick(a < 0x38800000u, sub, h);
    h = ck_pick(a >= 0x47800000u, 0x7C00u, h);
    h = ck_pick(a > 0x7F800000u, nan, h);
    return (uint16_t)(h | ((x >> 16) & 0x8000u));
}

/* float32 bits of the float16 bits h (exact; NaN payloads kept). A subnormal half m * 2**-24
   is the float32 (float)m * 2**-24, exactly: the bits the reference builds from m's top bit. */
static inline uint32_t ck_f32_of_f16(uint16_t h)
{
    uint32_t x = h, e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
    uint32_t r = ((e + 112u) << 23) | (m << 13);
    uint32_t sub = ck_bits_of((float)(int32_t)m * 0x1p-24f);  /* 0 for m == 0 */
    r = ck_pick(e == 31u, 0x7F800000u | (m << 13), r);
    r = ck_pick(e == 0u, sub, r);
    return r | ((x & 0x8000u) << 16);
}

#endif
