/* The histogram search's greedy walks with AVX2, AD_LANES segments at once (adaptive.c runs
   them where the CPU path is "avx2" or above): each segment in a lane of a vector, two vectors
   of 4 side by side, so a step of the walk costs a vector operation for 4 segments where the
   pair loop of adaptive.c costs one for each. Every lane keeps that loop's operations, in its
   order, for its segment (plain IEEE float64, no FMA: the same bits; the tests compare both
   with the numba twin on every CPU path).

   The loads: a threshold j of a candidate reads S1[j], C[j], S1[j + hpb] and C[j + hpb]. Here
   those four are one record, rec[j] (ad_records), so a lane's threshold costs one 32-byte load,
   and the four lanes' records are transposed into the four sums' operands: 4 loads and 8
   shuffles a step for 4 segments. Tried on this VM's CPU (AMD EPYC, AVX-512), 8-bit rows of
   64: GCC's vectorisation of a plain lane loop (16 loads and 16 inserts a step) ran at 1.4x
   the pair loop, hardware gathers at 1.1x, these records at 1.8x, with the thresholds' indices
   through memory instead of extracted (vpextrd) and k kept as a vector 2.1x. The walk is
   built for AVX2 and for x86-64-v4, where the same instructions have 32 registers instead of
   16 (the loop holds about 20 vectors). */
#include "adaptive.h"

#if AD_HAVE_LANES
#include <immintrin.h>

void ad_records(const double *C, const double *S1, int64_t W, double *rec)
{
    for (int64_t l = 0; l < AD_LANES; l++) {
        int64_t j = l * W, end = l * W + W - AD_HPB;
        for (; j + 2 <= end; j += 2) {  /* two records from four pairs (SSE2: x86-64) */
            __m128d s = _mm_loadu_pd(S1 + j), c = _mm_loadu_pd(C + j);
            __m128d sx = _mm_loadu_pd(S1 + j + AD_HPB), cx = _mm_loadu_pd(C + j + AD_HPB);
            _mm_storeu_pd(rec + 4 * j, _mm_unpacklo_pd(s, c));
            _mm_storeu_pd(rec + 4 * j + 2, _mm_unpacklo_pd(sx, cx));
            _mm_storeu_pd(rec + 4 * j + 4, _mm_unpackhi_pd(s, c));
            _mm_storeu_pd(rec + 4 * j + 6, _mm_unpackhi_pd(sx, cx));
        }
        for (; j < end; j++) {
            rec[4 * j] = S1[j];
            rec[4 * j + 1] = C[j];
            rec[4 * j + 2] = S1[j + AD_HPB];
            rec[4 * j + 3] = C[j + AD_HPB];
        }
    }
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
    /* lanes h0, h0 + 1 form a pair whose tables start at h0 * W, h0 + 2 and h0 + 3 at
       (h0 + 2) * W: an odd lane's thresholds already count its W */
    v.base = _mm_setr_epi32((int)(4 * h0 * W), (int)(4 * h0 * W), (int)(4 * (h0 + 2) * W),
                            (int)(4 * (h0 + 2) * W));
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

/* The records of the four lanes' thresholds j (record indices), transposed: S1[j], C[j],
   S1[j + hpb], C[j + hpb] of each lane. */
CK_TARGET_AVX2 static inline __attribute__((always_inline)) void
records4(const double *rec, __m128i j, __m256d *s1y, __m256d *cy, __m256d *s1x, __m256d *cx)
{
    volatile int32_t at_[4];  /* through memory: 4 loads where extracts took 7 operations */
    _mm_storeu_si128((__m128i *)at_, j);
    const int32_t at[4] = {at_[0], at_[1], at_[2], at_[3]};
    __m256d r0 = _mm256_loadu_pd(rec + at[0]), r1 = _mm256_loadu_pd(rec + at[1]);
    __m256d r2 = _mm256_loadu_pd(rec + at[2]), r3 = _mm256_loadu_pd(rec + at[3]);
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
threshold4(const lanes4 *v, __m256d kv, __m256d d, __m256d p, const double *rec, sums4 *s)
{
    const __m256d hpb = _mm256_set1_pd(AD_HPB), two = _mm256_set1_pd(2.0);
    __m256d kd = _mm256_mul_pd(kv, d), x = _mm256_add_pd(v->A, kd);
    __m128i j = _mm256_cvttpd_epi32(_mm256_min_pd(_mm256_add_pd(p, kd), v->jmax));
    __m256d s1y, cy, s1x, cx;
    records4(rec, _mm_add_epi32(_mm_slli_epi32(j, 2), v->base), &s1y, &cy, &s1x, &cx);
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
        all &= ad_settled(w->C + l * W, w->S1 + l * W, w->Q + l * W, W - 1, w->eps[l], A[q],
                          B[q], best[q]);
    }
    return all;
}

CK_TARGET_AVX2 static inline __attribute__((always_inline)) Py_ssize_t
walk_lanes(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter, const double *rec, int64_t W)
{
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
            threshold4(&v0, kv, d0, p0, rec, &s0);  /* lanes 0-3 */
            threshold4(&v1, kv, d1, p1, rec, &s1);  /* lanes 4-7 */
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
/* The walk built twice: for AVX2, and for x86-64-v4, where the same instructions may use 32
   vector registers instead of 16 (the loop holds about 20 vectors: with 16 some live on the
   stack). */
CK_TARGET_AVX2 static Py_ssize_t walk_avx2(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter,
                                           const double *rec, int64_t W)
{
    return walk_lanes(w, nq, n_iter, rec, W);
}

CK_TARGET_AVX512 static Py_ssize_t walk_avx512(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter,
                                               const double *rec, int64_t W)
{
    return walk_lanes(w, nq, n_iter, rec, W);
}

Py_ssize_t ad_walk_lanes(ad_lanes *w, Py_ssize_t nq, Py_ssize_t n_iter, const double *rec,
                         int64_t W)
{
    return (ck_vector() >= CK_AVX512 ? walk_avx512 : walk_avx2)(w, nq, n_iter, rec, W);
}
#endif
