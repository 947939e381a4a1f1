/* The histogram search with AVX2, AD_LANES segments at once (adaptive.c runs it where the CPU
   path is "avx2" or above): each segment in a lane of a vector, two vectors of 4 side by side,
   so a step costs a vector operation for 4 segments where the pair loop of adaptive.c costs
   one for each. Every lane keeps that loop's operations, in its order, for its segment (plain
   IEEE float64, no FMA: the same bits; the tests compare both with the numba twin on every CPU
   path).

   The tables: the lanes' counts, prefix sums and first errors are laid out lane by lane in each
   row (cell j of lane l at j * AD_LANES + l), so that the prefix sums of 4 lanes run in one
   vector (ad_prefix_lanes; in doubles, exactly, where the counts are a row's counted here), as
   do their first errors (ad_full_errors); on x86-64-v4 the prefix sums and the walk take all 8
   lanes in one 512-bit vector. Per row of 64 values at 4 bits this took the search from 606 to
   306 ns (the tenth slice's records pass and scalar sums before; issue 28's sixteenth slice).

   The walk's loads: a threshold j of a candidate reads S1[j], C[j], S1[j + hpb] and C[j +
   hpb]: two 16-byte loads of (S1, C) pairs (a lane's are side by side), and the four lanes'
   operands are transposed into the four sums': 8 loads and 8 shuffles a step for 4 segments.
   (A records pass that laid the four side by side, one 32-byte load, wrote 32 bytes a cell and
   lane: on rows of 64 values it cost more than the walk saved.) Tried on this VM's CPU (AMD
   EPYC, AVX-512), 8-bit rows of 64: GCC's vectorisation of a plain lane loop (16 loads and 16
   inserts a step) ran at 1.4x the pair loop, hardware gathers at 1.1x, records at 1.8x, with
   the thresholds' indices through memory instead of extracted (vpextrd) and k kept as a vector
   2.1x. */
#include "adaptive.h"

#if AD_HAVE_LANES
#include <immintrin.h>

/* x (int64 lanes) as doubles, rounded to nearest as cvtsi2sd rounds: the high 16 bits and
   the low 48 as the mantissas of two doubles, exact, whose sum is rounded once (AVX2 has no
   int64 conversion; the split is Mysticial's, Stack Overflow 41144668). */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) __m256d i64_to_f64(__m256i x)
{
    const __m256d k3_2p67 = _mm256_set1_pd(442721857769029238784.0);  /* 3 * 2**67 */
    const __m256d k3_2p67_2p52 = _mm256_set1_pd(442726361368656609280.0);  /* + 2**52 */
    __m256i hi = _mm256_blend_epi16(_mm256_srai_epi32(x, 16), _mm256_setzero_si256(), 0x33);
    hi = _mm256_add_epi64(hi, _mm256_castpd_si256(k3_2p67));
    __m256i lo = _mm256_blend_epi16(x, _mm256_castpd_si256(_mm256_set1_pd(0x1p52)), 0x88);
    __m256d f = _mm256_sub_pd(_mm256_castsi256_pd(hi), k3_2p67_2p52);
    return _mm256_add_pd(f, _mm256_castsi256_pd(lo));
}

/* n * m modulo 2**64 in every int64 lane, for m < 2**32. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) __m256i mul64(__m256i n, __m256i m)
{
    __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(n, 32), m);
    return _mm256_add_epi64(_mm256_mul_epu32(n, m), _mm256_slli_epi64(hi, 32));
}

/* Lanes off .. off + 3 of ad_prefix_lanes, the four in one vector; the counts zeroed. The
   integer sums of prefix_sums (wrapping), their conversions and its exactness test; or, where
   `counted` (a constant in each instance: the counts are a row's, counted here, of fewer than
   2**37 values), the sums in doubles: every sum is then an integer below 2**53 (2**37 (2H + 1),
   H <= AD_LANES_CELLS), so they are exact and equal the conversions of the integer sums; Q too,
   where it is read (its exactness test: C[H] (2H + 1)^2 below 2**49), and no count is big. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
prefix4(int64_t *cnt, int tables, const int counted, int64_t W, double *CS, double *Q, int off,
        int *exact, int *any)
{
    const int64_t H = W - 1, L = AD_LANES, T = L * W;
    const __m256i zero = _mm256_setzero_si256();
    const __m256d half = _mm256_set1_pd(0.5), two52 = _mm256_set1_pd(0x1p52);
    __m256i c = zero, s1 = zero, q = zero, big = zero, nz = zero;  /* integer sums */
    __m256d cd = _mm256_setzero_pd(), sd = cd, qd = cd;           /* their doubles */
    _mm256_storeu_pd(CS + 2 * off, cd);
    _mm256_storeu_pd(CS + 2 * off + 4, cd);
    _mm256_storeu_pd(Q + off, cd);
    for (int64_t e = 0; e < H; e += AD_HPB) {  /* H is a multiple of hpb */
        for (int64_t j = e; j < e + AD_HPB; j++) {
            int64_t *at = cnt + j * L + off;
            __m256i n = _mm256_loadu_si256((const __m256i *)at);
            _mm256_storeu_si256((__m256i *)at, zero);
            for (int u = 1; u < tables; u++) {
                n = _mm256_add_epi64(n, _mm256_loadu_si256((const __m256i *)(at + u * T)));
                _mm256_storeu_si256((__m256i *)(at + u * T), zero);
            }
            const int64_t o = 2 * j + 1;
            nz = _mm256_or_si256(nz, n);
            if (counted) {  /* n as a double: 0 <= n < 2**52 in the mantissa of 2**52 */
                __m256d nd = _mm256_sub_pd(
                    _mm256_castsi256_pd(_mm256_or_si256(n, _mm256_castpd_si256(two52))), two52);
                cd = _mm256_add_pd(cd, nd);
                sd = _mm256_add_pd(sd, _mm256_mul_pd(nd, _mm256_set1_pd((double)o)));
                qd = _mm256_add_pd(qd, _mm256_mul_pd(nd, _mm256_set1_pd((double)(o * o))));
            } else {
                big = _mm256_or_si256(big, _mm256_srli_epi64(n, 40));  /* a negative count too */
                c = _mm256_add_epi64(c, n);
                s1 = _mm256_add_epi64(s1, mul64(n, _mm256_set1_epi64x(o)));
                q = _mm256_add_epi64(q, mul64(n, _mm256_set1_epi64x(o * o)));
                cd = i64_to_f64(c), sd = i64_to_f64(s1);
            }
            __m256d hs = _mm256_mul_pd(half, sd);
            __m256d lo = _mm256_unpacklo_pd(hs, cd), hi = _mm256_unpackhi_pd(hs, cd);
            double *r = CS + 2 * ((j + 1) * L + off);  /* (S1, C) of each lane */
            _mm256_storeu_pd(r, _mm256_permute2f128_pd(lo, hi, 0x20));
            _mm256_storeu_pd(r + 4, _mm256_permute2f128_pd(lo, hi, 0x31));
        }
        _mm256_storeu_pd(Q + (e / AD_HPB + 1) * L + off, counted ? qd : i64_to_f64(q));
    }
    for (int u = 0; u < tables; u++)  /* the masked values' cell */
        _mm256_storeu_si256((__m256i *)(cnt + u * T + H * L + off), zero);
    int64_t b[4], z[4];
    _mm256_storeu_si256((__m256i *)b, big);
    _mm256_storeu_si256((__m256i *)z, nz);
    const double o = 2.0 * (double)H + 1.0;
    for (int l = 0; l < 4; l++) {  /* C[H] is the count, exactly, where no count is big */
        exact[off + l] = !b[l] && 16.0 * CS[2 * (H * L + off + l) + 1] * o * o < 0x1p53;
        any[off + l] = z[l] != 0;
    }
}

CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
prefix_lanes(int64_t *cnt, int tables, int counted, int64_t W, double *CS, double *Q,
             int *exact, int *any)
{
    for (int off = 0; off < AD_LANES; off += 4)
        if (counted)
            prefix4(cnt, tables, 1, W, CS, Q, off, exact, any);
        else
            prefix4(cnt, tables, 0, W, CS, Q, off, exact, any);
}

CK_TARGET_AVX2 static void prefix_avx2(int64_t *cnt, int tables, int counted, int64_t W,
                                       double *CS, double *Q, int *exact, int *any)
{
    prefix_lanes(cnt, tables, counted, W, CS, Q, exact, any);
}

/* prefix4 for all 8 lanes in one 512-bit vector (x86-64-v4: AVX-512 F and DQ): the same sums
   and conversions (vcvtqq2pd rounds as cvtsi2sd; vpmullq wraps as the integer products), the
   (S1, C) pairs interleaved by two permutes. */
CK_TARGET_AVX512 static inline __attribute__((always_inline)) void
prefix8(int64_t *cnt, int tables, const int counted, int64_t W, double *CS, double *Q,
        int *exact, int *any)
{
    const int64_t H = W - 1, L = AD_LANES, T = L * W;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i front = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    const __m512i back = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    const __m512d half = _mm512_set1_pd(0.5);
    __m512i c = zero, s1 = zero, q = zero, big = zero, nz = zero;
    __m512d cd = _mm512_setzero_pd(), sd = cd, qd = cd;
    _mm512_storeu_pd(CS, cd);
    _mm512_storeu_pd(CS + 8, cd);
    _mm512_storeu_pd(Q, cd);
    for (int64_t e = 0; e < H; e += AD_HPB) {
        for (int64_t j = e; j < e + AD_HPB; j++) {
            int64_t *at = cnt + j * L;
            __m512i n = _mm512_loadu_si512(at);
            _mm512_storeu_si512(at, zero);
            for (int u = 1; u < tables; u++) {
                n = _mm512_add_epi64(n, _mm512_loadu_si512(at + u * T));
                _mm512_storeu_si512(at + u * T, zero);
            }
            const int64_t o = 2 * j + 1;
            nz = _mm512_or_si512(nz, n);
            if (counted) {
                __m512d nd = _mm512_cvtepi64_pd(n);  /* exact: n < 2**37 */
                cd = _mm512_add_pd(cd, nd);
                sd = _mm512_add_pd(sd, _mm512_mul_pd(nd, _mm512_set1_pd((double)o)));
                qd = _mm512_add_pd(qd, _mm512_mul_pd(nd, _mm512_set1_pd((double)(o * o))));
            } else {
                big = _mm512_or_si512(big, _mm512_srli_epi64(n, 40));
                c = _mm512_add_epi64(c, n);
                s1 = _mm512_add_epi64(s1, _mm512_mullo_epi64(n, _mm512_set1_epi64(o)));
                q = _mm512_add_epi64(q, _mm512_mullo_epi64(n, _mm512_set1_epi64(o * o)));
                cd = _mm512_cvtepi64_pd(c), sd = _mm512_cvtepi64_pd(s1);
            }
            __m512d hs = _mm512_mul_pd(half, sd);
            double *r = CS + 2 * (j + 1) * L;
            _mm512_storeu_pd(r, _mm512_permutex2var_pd(hs, front, cd));
            _mm512_storeu_pd(r + 8, _mm512_permutex2var_pd(hs, back, cd));
        }
        _mm512_storeu_pd(Q + (e / AD_HPB + 1) * L, counted ? qd : _mm512_cvtepi64_pd(q));
    }
    for (int u = 0; u < tables; u++)
        _mm512_storeu_si512(cnt + u * T + H * L, zero);
    int64_t b[AD_LANES], z[AD_LANES];
    _mm512_storeu_si512(b, big);
    _mm512_storeu_si512(z, nz);
    const double o = 2.0 * (double)H + 1.0;
    for (int l = 0; l < AD_LANES; l++) {
        exact[l] = !b[l] && 16.0 * CS[2 * (H * L + l) + 1] * o * o < 0x1p53;
        any[l] = z[l] != 0;
    }
}

CK_TARGET_AVX512 static void prefix_avx512(int64_t *cnt, int tables, int counted, int64_t W,
                                           double *CS, double *Q, int *exact, int *any)
{
    if (counted)
        prefix8(cnt, tables, 1, W, CS, Q, exact, any);
    else
        prefix8(cnt, tables, 0, W, CS, Q, exact, any);
}

void ad_prefix_lanes(int64_t *cnt, int tables, int counted, int64_t W, double *CS, double *Q,
                     int *exact, int *any)
{
    (ck_vector() >= CK_AVX512 ? prefix_avx512 : prefix_avx2)(cnt, tables, counted, W, CS, Q,
                                                              exact, any);
}

/* Lanes off .. off + 3's first errors: full_error's sums, the thresholds (the same in every
   lane: the full range) read as (S1, C) pairs and split. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
full4(Py_ssize_t nq, const double *CS, int64_t H, int off, double *best)
{
    const int64_t L = AD_LANES;
    const double d = (double)H / (double)(nq - 1);
    __m256d t = _mm256_setzero_pd(), u = t, s1, c;
#define PAIRS4(j)                                                                             \
    {                                                                                         \
        const double *r_ = CS + 2 * ((j) * L + off);                                          \
        __m256d a_ = _mm256_loadu_pd(r_), b_ = _mm256_loadu_pd(r_ + 4);                       \
        __m256d p_ = _mm256_permute2f128_pd(a_, b_, 0x20);                                    \
        __m256d q_ = _mm256_permute2f128_pd(a_, b_, 0x31);                                    \
        s1 = _mm256_unpacklo_pd(p_, q_), c = _mm256_unpackhi_pd(p_, q_);                     \
    }
    for (Py_ssize_t k = 0; k < nq - 1; k++) {
        double v = (double)k * d;
        int64_t j = ad_trunc(v + 0.5 * d + 0.5);
        j = H < j ? H : j;
        PAIRS4(j)
        t = _mm256_add_pd(t, s1);
        u = _mm256_add_pd(u, _mm256_mul_pd(c, _mm256_set1_pd(2.0 * v + d)));
    }
    PAIRS4(H)
#undef PAIRS4
    const __m256d dv = _mm256_set1_pd(d), Hv = _mm256_set1_pd((double)H);
    __m256d e = _mm256_sub_pd(
        _mm256_setzero_pd(),
        _mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(_mm256_mul_pd(Hv, s1),
                                                         _mm256_mul_pd(dv, t))));
    e = _mm256_add_pd(e, _mm256_sub_pd(_mm256_mul_pd(_mm256_set1_pd((double)(H * H)), c),
                                       _mm256_mul_pd(dv, u)));
    _mm256_storeu_pd(best + off, e);
}

CK_TARGET_AVX2 void ad_full_errors(Py_ssize_t nq, const double *CS, int64_t H, double *best)
{
    full4(nq, CS, H, 0, best);
    full4(nq, CS, H, 4, best);
}

/* One vector of 4 lanes: its walks' state and its constants. */
typedef struct {
    __m256d A, B, best, ba, bb, CH, SH;
    __m256d off, jmax;  /* the thresholds' start (0 or W) and their clip */
    __m128i base;       /* 4 * the lane's pair's table start: the record index of threshold 0 */
} lanes4;

CK_TARGET_AVX2 static lanes4 load4(const ad_lanes *w, int h, int64_t W)
{
    const double odd = (double)W, jm = (double)(W - 1 - AD_HPB);
    const int h0 = 4 * h;
    lanes4 v;
    v.A = _mm256_loadu_pd(w->A + h0);
    v.B = _mm256_loadu_pd(w->B + h0);
    v.best = _mm256_loadu_pd(w->best + h0);
    v.ba = _mm256_loadu_pd(w->ba + h0);
    v.bb = _mm256_loadu_pd(w->bb + h0);
    v.CH = _mm256_loadu_pd(w->CH + h0);
    v.SH = _mm256_loadu_pd(w->SH + h0);
    v.off = _mm256_setr_pd(0.0, odd, 0.0, odd);
    v.jmax = _mm256_add_pd(_mm256_set1_pd(jm), v.off);  /* jm + 0.0 is jm */
    /* lane l's (S1, C) of threshold j at 2 (j L + l) (ad_prefix_lanes); an odd lane's
       thresholds count its pair's W (v.off) */
    const int w2 = (int)(2 * AD_LANES * W);
    v.base = _mm_setr_epi32(2 * h0, 2 * (h0 + 1) - w2, 2 * (h0 + 2), 2 * (h0 + 3) - w2);
    return v;
}

CK_TARGET_AVX2 static void store4(ad_lanes *w, int h, const lanes4 *v)
{
    const int h0 = 4 * h;
    _mm256_storeu_pd(w->A + h0, v->A);
    _mm256_storeu_pd(w->B + h0, v->B);
    _mm256_storeu_pd(w->best + h0, v->best);
    _mm256_storeu_pd(w->ba + h0, v->ba);
    _mm256_storeu_pd(w->bb + h0, v->bb);
}

/* The operands of the four lanes' thresholds (j: the index of each one's (S1, C) pair in CS),
   transposed: S1[j], C[j], S1[j + hpb], C[j + hpb] of each lane. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
records4(const double *CS, __m128i j, __m256d *s1y, __m256d *cy, __m256d *s1x, __m256d *cx)
{
    volatile int32_t at_[4];  /* through memory: 4 loads where extracts took 7 operations */
    _mm_storeu_si128((__m128i *)at_, j);
    const int32_t at[4] = {at_[0], at_[1], at_[2], at_[3]};
    const int x = 2 * AD_LANES * AD_HPB;  /* from threshold j to j + hpb */
    __m256d r0 = _mm256_loadu2_m128d(CS + at[0] + x, CS + at[0]);
    __m256d r1 = _mm256_loadu2_m128d(CS + at[1] + x, CS + at[1]);
    __m256d r2 = _mm256_loadu2_m128d(CS + at[2] + x, CS + at[2]);
    __m256d r3 = _mm256_loadu2_m128d(CS + at[3] + x, CS + at[3]);
    __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
    __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
    *s1y = _mm256_permute2f128_pd(t0, t2, 0x20);
    *s1x = _mm256_permute2f128_pd(t0, t2, 0x31);
    *cy = _mm256_permute2f128_pd(t1, t3, 0x20);
    *cx = _mm256_permute2f128_pd(t1, t3, 0x31);
}

/* The two candidates' sums of 4 lanes over their thresholds. */
typedef struct {
    __m256d tx, ux, ty, uy;
} sums4;

/* Threshold k (kv: k in every lane) of 4 lanes' two candidates of spacing d, the first at p,
   added into s: v = A + k d, t = p + k d, j = trunc(min(t, jmax)), then the pair loop's sums. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
threshold4(const lanes4 *v, __m256d kv, __m256d d, __m256d p, const double *CS, sums4 *s)
{
    const __m256d hpb = _mm256_set1_pd(AD_HPB), two = _mm256_set1_pd(2.0);
    __m256d kd = _mm256_mul_pd(kv, d), x = _mm256_add_pd(v->A, kd);
    __m128i j = _mm256_cvttpd_epi32(_mm256_min_pd(_mm256_add_pd(p, kd), v->jmax));
    __m256d s1y, cy, s1x, cx;
    records4(CS, _mm_add_epi32(_mm_slli_epi32(j, 4), v->base), &s1y, &cy, &s1x, &cx);
    s->ty = _mm256_add_pd(s->ty, s1y);
    s->uy = _mm256_add_pd(s->uy, _mm256_mul_pd(cy, _mm256_add_pd(_mm256_mul_pd(two, x), d)));
    s->tx = _mm256_add_pd(s->tx, s1x);
    s->ux = _mm256_add_pd(s->ux, _mm256_mul_pd(cx, _mm256_add_pd(
                                      _mm256_mul_pd(two, _mm256_add_pd(x, hpb)), d)));
}

/* A step's spacing d = (B - A - hpb) * inv and first threshold p = off + A + 0.5 * d + 0.5. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
spacing4(const lanes4 *v, __m256d inv, __m256d *d, __m256d *p)
{
    const __m256d hpb = _mm256_set1_pd(AD_HPB), half = _mm256_set1_pd(0.5);
    *d = _mm256_mul_pd(_mm256_sub_pd(_mm256_sub_pd(v->B, v->A), hpb), inv);
    *p = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(v->off, v->A), _mm256_mul_pd(half, *d)),
                       half);
}

/* A greedy step of 4 lanes from their sums: the better candidate, and the best so far. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
step4(lanes4 *v, __m256d d, __m256d tx, __m256d ux, __m256d ty, __m256d uy)
{
    const __m256d hpb = _mm256_set1_pd(AD_HPB), m2 = _mm256_set1_pd(-2.0);
    const __m256d B = v->B, by = _mm256_sub_pd(B, hpb);
    __m256d ex = _mm256_add_pd(
        _mm256_mul_pd(m2, _mm256_sub_pd(_mm256_mul_pd(B, v->SH), _mm256_mul_pd(d, tx))),
        _mm256_sub_pd(_mm256_mul_pd(_mm256_mul_pd(B, B), v->CH), _mm256_mul_pd(d, ux)));
    __m256d ey = _mm256_add_pd(
        _mm256_mul_pd(m2, _mm256_sub_pd(_mm256_mul_pd(by, v->SH), _mm256_mul_pd(d, ty))),
        _mm256_sub_pd(_mm256_mul_pd(_mm256_mul_pd(by, by), v->CH), _mm256_mul_pd(d, uy)));
    __m256d tk = _mm256_cmp_pd(ex, ey, _CMP_LT_OQ);  /* ex < ey: false where either is NaN */
    __m256d e = _mm256_blendv_pd(ey, ex, tk);
    v->A = _mm256_blendv_pd(v->A, _mm256_add_pd(v->A, hpb), tk);
    v->B = _mm256_blendv_pd(by, B, tk);
    __m256d bt = _mm256_cmp_pd(e, v->best, _CMP_LT_OQ);
    v->best = _mm256_blendv_pd(v->best, e, bt);
    v->ba = _mm256_blendv_pd(v->ba, v->A, bt);
    v->bb = _mm256_blendv_pd(v->bb, v->B, bt);
}

/* 1 when the 4 lanes of v (lanes 4 h ..; prefix sums W apart) are settled (ad_settled). */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) int
settled4(const ad_lanes *w, int h, const lanes4 *v, int64_t W)
{
    double A[4], B[4], best[4];
    _mm256_storeu_pd(A, v->A);
    _mm256_storeu_pd(B, v->B);
    _mm256_storeu_pd(best, v->best);
    int all = 1;
    for (int q = 0; q < 4; q++) {
        const int l = 4 * h + q;
        all &= ad_settled(w->CS + 2 * l + 1, w->CS + 2 * l, w->Q + l, 2 * AD_LANES, AD_LANES,
                          W - 1, w->eps[l], A[q], B[q], best[q]);
    }
    return all;
}

/* The walk with AVX2: lanes 0-3 and 4-7 in two vectors. */
CK_TARGET_AVX2 static Py_ssize_t walk_avx2(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter,
                                           int64_t W)
{
    const double *CS = w->CS;
    const __m256d inv = _mm256_set1_pd(1.0 / (double)(nq - 1)), one = _mm256_set1_pd(1.0);
    lanes4 v0 = load4(w, 0, W), v1 = load4(w, 1, W);
    Py_ssize_t i = 0;
    while (i < n_iter) {
        __m256d d0, p0, d1, p1;
        spacing4(&v0, inv, &d0, &p0);
        spacing4(&v1, inv, &d1, &p1);
        const __m256d zero = _mm256_setzero_pd();
        sums4 s0 = {zero, zero, zero, zero}, s1 = s0;
        __m256d kv = zero;  /* (double)k, exactly */
        for (Py_ssize_t k = 0; k < nq - 1; k++, kv = _mm256_add_pd(kv, one)) {
            threshold4(&v0, kv, d0, p0, CS, &s0);  /* lanes 0-3 */
            threshold4(&v1, kv, d1, p1, CS, &s1);  /* lanes 4-7 */
        }
        step4(&v0, d0, s0.tx, s0.ux, s0.ty, s0.uy);
        step4(&v1, d1, s1.tx, s1.ux, s1.ty, s1.uy);
        i++;
        if (settled4(w, 0, &v0, W) && settled4(w, 1, &v1, W))
            break;
    }
    store4(w, 0, &v0);
    store4(w, 1, &v1);
    return i;
}

/* The walk on x86-64-v4: all 8 lanes in one 512-bit vector, each lane's operations those of
   walk_avx2, in its order (the same bits). A threshold's operands: each lane's (S1, C) pair
   at j and at j + hpb inserted 128 bits at a time into four vectors of 4 lanes' pairs, split
   into S1 and C of the 8 lanes by two permutes each: 16 loads and inserts and 4 permutes
   where walk_avx2 takes 16 loads and 20 shuffles, and half its arithmetic. */
typedef struct {
    __m512d A, B, best, ba, bb, CH, SH, off, jmax;
    __m256i base;  /* lane l's (S1, C) of threshold j at 2 (j L + l), odd lanes' j counting W */
} lanes8;

/* Four lanes' 128-bit pairs (S1, C) at CS + at[0..3] + x, as one vector. */
CK_TARGET_AVX512 static inline __attribute__((always_inline)) __m512d
pairs4(const double *CS, const int32_t *at, int x)
{
    __m256d a = _mm256_loadu2_m128d(CS + at[1] + x, CS + at[0] + x);  /* two short chains */
    __m256d b = _mm256_loadu2_m128d(CS + at[3] + x, CS + at[2] + x);
    return _mm512_insertf64x4(_mm512_castpd256_pd512(a), b, 1);
}

CK_TARGET_AVX512 static Py_ssize_t walk_avx512(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter,
                                               int64_t W)
{
    const double *CS = w->CS;
    const double odd = (double)W, jm = (double)(W - 1 - AD_HPB);
    const int w2 = (int)(2 * AD_LANES * W), x = 2 * AD_LANES * AD_HPB;
    const __m512d inv = _mm512_set1_pd(1.0 / (double)(nq - 1)), one = _mm512_set1_pd(1.0);
    const __m512d hpb = _mm512_set1_pd(AD_HPB), two = _mm512_set1_pd(2.0);
    const __m512d half = _mm512_set1_pd(0.5), m2 = _mm512_set1_pd(-2.0);
    const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i oddi = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    lanes8 v;
    v.A = _mm512_loadu_pd(w->A), v.B = _mm512_loadu_pd(w->B);
    v.best = _mm512_loadu_pd(w->best), v.ba = _mm512_loadu_pd(w->ba);
    v.bb = _mm512_loadu_pd(w->bb), v.CH = _mm512_loadu_pd(w->CH), v.SH = _mm512_loadu_pd(w->SH);
    v.off = _mm512_setr_pd(0.0, odd, 0.0, odd, 0.0, odd, 0.0, odd);
    v.jmax = _mm512_add_pd(_mm512_set1_pd(jm), v.off);
    v.base = _mm256_setr_epi32(0, 2 - w2, 4, 6 - w2, 8, 10 - w2, 12, 14 - w2);
    Py_ssize_t i = 0;
    while (i < n_iter) {
        /* spacing4 */
        __m512d d = _mm512_mul_pd(_mm512_sub_pd(_mm512_sub_pd(v.B, v.A), hpb), inv);
        __m512d p = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(v.off, v.A),
                                                _mm512_mul_pd(half, d)), half);
        __m512d tx = _mm512_setzero_pd(), ux = tx, ty = tx, uy = tx, kv = tx;
        for (Py_ssize_t k = 0; k < nq - 1; k++, kv = _mm512_add_pd(kv, one)) {  /* threshold4 */
            __m512d kd = _mm512_mul_pd(kv, d), xv = _mm512_add_pd(v.A, kd);
            __m256i j = _mm512_cvttpd_epi32(_mm512_min_pd(_mm512_add_pd(p, kd), v.jmax));
            volatile int32_t at_[8];  /* through memory, as records4 */
            _mm256_storeu_si256((__m256i *)at_,
                                _mm256_add_epi32(_mm256_slli_epi32(j, 4), v.base));
            const int32_t at[8] = {at_[0], at_[1], at_[2], at_[3],
                                   at_[4], at_[5], at_[6], at_[7]};
            __m512d lo = pairs4(CS, at, 0), hi = pairs4(CS, at + 4, 0);
            __m512d lox = pairs4(CS, at, x), hix = pairs4(CS, at + 4, x);
            __m512d s1y = _mm512_permutex2var_pd(lo, even, hi);
            __m512d cy = _mm512_permutex2var_pd(lo, oddi, hi);
            __m512d s1x = _mm512_permutex2var_pd(lox, even, hix);
            __m512d cx = _mm512_permutex2var_pd(lox, oddi, hix);
            ty = _mm512_add_pd(ty, s1y);
            uy = _mm512_add_pd(uy, _mm512_mul_pd(cy, _mm512_add_pd(_mm512_mul_pd(two, xv), d)));
            tx = _mm512_add_pd(tx, s1x);
            ux = _mm512_add_pd(ux, _mm512_mul_pd(cx, _mm512_add_pd(
                                       _mm512_mul_pd(two, _mm512_add_pd(xv, hpb)), d)));
        }
        /* step4 */
        const __m512d B = v.B, by = _mm512_sub_pd(B, hpb);
        __m512d ex = _mm512_add_pd(
            _mm512_mul_pd(m2, _mm512_sub_pd(_mm512_mul_pd(B, v.SH), _mm512_mul_pd(d, tx))),
            _mm512_sub_pd(_mm512_mul_pd(_mm512_mul_pd(B, B), v.CH), _mm512_mul_pd(d, ux)));
        __m512d ey = _mm512_add_pd(
            _mm512_mul_pd(m2, _mm512_sub_pd(_mm512_mul_pd(by, v.SH), _mm512_mul_pd(d, ty))),
            _mm512_sub_pd(_mm512_mul_pd(_mm512_mul_pd(by, by), v.CH), _mm512_mul_pd(d, uy)));
        __mmask8 tk = _mm512_cmp_pd_mask(ex, ey, _CMP_LT_OQ);
        __m512d e = _mm512_mask_blend_pd(tk, ey, ex);
        v.A = _mm512_mask_blend_pd(tk, v.A, _mm512_add_pd(v.A, hpb));
        v.B = _mm512_mask_blend_pd(tk, by, B);
        __mmask8 bt = _mm512_cmp_pd_mask(e, v.best, _CMP_LT_OQ);
        v.best = _mm512_mask_blend_pd(bt, v.best, e);
        v.ba = _mm512_mask_blend_pd(bt, v.ba, v.A);
        v.bb = _mm512_mask_blend_pd(bt, v.bb, v.B);
        i++;
        double A[AD_LANES], Bs[AD_LANES], best[AD_LANES];  /* settled4, 8 lanes */
        _mm512_storeu_pd(A, v.A);
        _mm512_storeu_pd(Bs, v.B);
        _mm512_storeu_pd(best, v.best);
        int all = 1;
        for (int l = 0; l < AD_LANES; l++)
            all &= ad_settled(CS + 2 * l + 1, CS + 2 * l, w->Q + l, 2 * AD_LANES, AD_LANES,
                              W - 1, w->eps[l], A[l], Bs[l], best[l]);
        if (all)
            break;
    }
    _mm512_storeu_pd(w->A, v.A);
    _mm512_storeu_pd(w->B, v.B);
    _mm512_storeu_pd(w->best, v.best);
    _mm512_storeu_pd(w->ba, v.ba);
    _mm512_storeu_pd(w->bb, v.bb);
    return i;
}

Py_ssize_t ad_walk_lanes(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter, int64_t W)
{
    return (ck_vector() >= CK_AVX512 ? walk_avx512 : walk_avx2)(w, nq, n_iter, W);
}
#endif
