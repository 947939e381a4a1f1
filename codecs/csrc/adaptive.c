/* The adaptive range search over a histogram (adaptive_histogram_search, the twin of
   adaptive._histogram_search without fastmath: the same operations in the same order, float64
   throughout, no contraction), the family's argument checks and its method table. The exact
   search of short rows is in adaptive_direct.c. */
#include <math.h>
#include <stdlib.h>
#include "adaptive.h"

/* The greedy step count int(ratio * num_bins + 1e-9) - 1, checked: 0 where numba's kernel
   returns at once, -1 with a ValueError past the histogram's end or for a NaN ratio. */
static Py_ssize_t greedy_steps(double ratio, Py_ssize_t num_bins, int zero_width_ok,
                               const char *name)
{
    double t = ratio * (double)num_bins + 1e-9;
    if (ratio != ratio) {
        PyErr_Format(PyExc_ValueError, "%s: a ratio of NaN", name);
        return -1;
    }
    if (!(t >= 2.0))
        return 0;
    if (num_bins < 1 || num_bins > AD_MAX_CELLS / AD_HPB
        || t >= (double)num_bins + (zero_width_ok ? 2.0 : 1.0)) {
        ck_value_error("%s: %zd bins and a ratio of %g (num_bins 1..%d, ratio at most 1)", name,
                       num_bins, ratio, AD_MAX_CELLS / AD_HPB);
        return -1;
    }
    return (Py_ssize_t)t - 1;
}

/* 1 when a view holds int64 items (format q or l, of 8 bytes: ck_buffer checked). */
static int int64_format(const Py_buffer *v)
{
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return (f[0] == 'q' || f[0] == 'l') && f[1] == '\0';
}

/* 1 (after a ValueError) when an input shares memory with lo or hi, or lo with hi. */
static int overlaps(ad_args *a, const char *name)
{
    Py_buffer *in[3] = {a->x, a->mask, a->counts};
    for (int i = 0; i < 3; i++)
        if (in[i] && (ck_overlap(in[i], a->lo, name) || ck_overlap(in[i], a->hi, name)))
            return 1;
    return ck_overlap(a->lo, a->hi, name);
}

int ad_parse(PyObject *args, int with_counts, int zero_width_ok, ad_args *a, const char *name)
{
    const ck_want want[5] = {CK_IN(name, CK_FLOAT), CK_IN(name, 1), CK_OUT(name, CK_FLOAT),
                             CK_OUT(name, CK_FLOAT), CK_IN(name, 8)};
    PyObject *obj[5];  /* x, mask, lo, hi, counts */
    Py_ssize_t num_bins;
    double ratio;
    memset(a, 0, sizeof *a);
    if (with_counts ? !PyArg_ParseTuple(args, "OnOOOOnnd", &obj[0], &a->seg, &obj[1], &obj[4],
                                        &obj[2], &obj[3], &a->nq, &num_bins, &ratio)
                    : !PyArg_ParseTuple(args, "OnOOOnnd", &obj[0], &a->seg, &obj[1], &obj[2],
                                        &obj[3], &a->nq, &num_bins, &ratio))
        return -1;
    Py_buffer *v = a->v;
    if (ck_buffers(obj, want, with_counts ? 5 : 4, v) < 0)
        return -1;
    a->held = with_counts ? 5 : 4;
    a->x = &v[0], a->mask = &v[1], a->lo = &v[2], a->hi = &v[3];
    a->counts = with_counts ? &v[4] : NULL;
    a->n = ck_items(a->x);
    a->nseg = ck_items(a->lo);
    a->cells = num_bins * AD_HPB;
    int bad = 1;
    if (a->seg < 0)
        PyErr_Format(PyExc_ValueError, "%s: a segment length of %zd", name, a->seg);
    else if (ck_items(a->hi) != a->nseg)
        PyErr_Format(PyExc_ValueError, "%s: %zd lows for %zd highs", name, a->nseg,
                     ck_items(a->hi));
    else if (a->counts && !int64_format(a->counts))
        PyErr_Format(PyExc_ValueError, "%s: counts must be int64, not of format '%s'", name,
                     a->counts->format ? a->counts->format : "B");
    else if (!qk_bad_mask(a->mask, a->n, name) && !overlaps(a, name)
             && (a->n_iter = greedy_steps(ratio, num_bins, zero_width_ok, name)) >= 0)
        bad = 0;
    if (!bad && a->n_iter > 0 && a->nq >= 2 && a->counts && a->counts->len > 0
        && (ck_items(a->counts) % a->cells || ck_items(a->counts) / a->cells != a->nseg)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd counts for %zd segments of %zd cells", name,
                     ck_items(a->counts), a->nseg, a->cells);
        bad = 1;
    }
    if (bad || !(a->nq >= 2 && a->n_iter >= 1)) {
        ck_release(v, a->held);
        return bad ? -1 : 0;
    }
    return 1;
}

/* Segment [a0, b0)'s histogram in cells from lo0: cnt[j] counts the values whose cell index
   int((x - lo0) * f), clipped to [0, H - 1], is j; masked values go to the spare cell H.
   numba's int() is x86-64's cvttsd2si, INT64_MIN (so cell 0) for NaN and values beyond the
   int64 range: the clip is done in doubles first, then the cell truncated, in blocks that
   vectorise; cell j's count is cnt4[j * step] (step 1, or AD_LANES in the lanes' tables), in
   4 histograms `stride` apart (neighbouring values often share a cell; stride 0: one), summed
   after (integers: exact). */
#define BLOCK 1024
/* The cell of a value, as a double y = (x - lo0) f: y clipped to [0, top] where 0 <= y < 2**63,
   else cell 0 (NaN too), truncated. */
#define CELL_OF(y, top) ((y) >= 0.0 && (y) < 0x1p63 ? ((y) < (top) ? (y) : (top)) : 0.0)
#define CELLS_PLAIN(T)                                                                        \
    for (int i = 0; i < nb; i++) {                                                            \
        double y = ((double)x[i0 + i] - lo0) * f;                                             \
        idx[i] = (int32_t)CELL_OF(y, top) * step;                                             \
    }
#define COUNT_KERNEL(NAME, ATTR, T, CELLS)                                                    \
    ATTR static void NAME(const T *restrict x, Py_ssize_t m, const uint8_t *restrict mask,    \
                          double lo0, double f, int64_t H, int64_t *restrict cnt4,            \
                          int64_t stride, int32_t step)                                       \
    {                                                                                         \
        int32_t idx[BLOCK];                                                                   \
        const double top = (double)(H - 1);                                                   \
        for (Py_ssize_t i0 = 0; i0 < m; i0 += BLOCK) {                                        \
            int nb = (int)(m - i0 < BLOCK ? m - i0 : BLOCK);                                  \
            CELLS(T)                                                                          \
            if (mask)                                                                         \
                for (int i = 0; i < nb; i++)                                                  \
                    idx[i] = mask[i0 + i] ? (int32_t)H * step : idx[i];                       \
            int i = 0;                                                                        \
            for (; i + 4 <= nb; i += 4) {                                                     \
                cnt4[idx[i]]++;                                                               \
                cnt4[stride + idx[i + 1]]++;                                                  \
                cnt4[2 * stride + idx[i + 2]]++;                                              \
                cnt4[3 * stride + idx[i + 3]]++;                                              \
            }                                                                                 \
            for (; i < nb; i++)                                                               \
                cnt4[idx[i]]++;                                                               \
        }                                                                                     \
    }

COUNT_KERNEL(count_f32, , float, CELLS_PLAIN)
COUNT_KERNEL(count_f64, , double, CELLS_PLAIN)

#if QK_HAVE_AVX2
#include <immintrin.h>
/* Four values' cells (CELL_OF) times step, with AVX2: the same comparisons (ordered: false for
   NaN), min(y, top) where y < 2**63 is in range (its NaN case masked off), truncated. */
QK_AVX2 static inline __attribute__((always_inline)) __m128i
cells4(__m256d v, __m256d lo0, __m256d f, __m256d top, __m128i step)
{
    const __m256d big = _mm256_set1_pd(0x1p63);
    __m256d y = _mm256_mul_pd(_mm256_sub_pd(v, lo0), f);
    __m256d ok = _mm256_and_pd(_mm256_cmp_pd(y, _mm256_setzero_pd(), _CMP_GE_OQ),
                               _mm256_cmp_pd(y, big, _CMP_LT_OQ));
    __m256d c = _mm256_and_pd(ok, _mm256_min_pd(y, top));
    return _mm_mullo_epi32(_mm256_cvttpd_epi32(c), step);
}

#define CELLS_AVX2(T)                                                                         \
    {                                                                                         \
        const __m256d lo0v = _mm256_set1_pd(lo0), fv = _mm256_set1_pd(f);                     \
        const __m256d topv = _mm256_set1_pd(top);                                             \
        const __m128i stepv = _mm_set1_epi32(step);                                           \
        int i = 0;                                                                            \
        for (; i + 4 <= nb; i += 4)                                                           \
            _mm_storeu_si128((__m128i *)(idx + i),                                            \
                             cells4(LOAD4_##T(x + i0 + i), lo0v, fv, topv, stepv));           \
        for (; i < nb; i++) {                                                                 \
            double y = ((double)x[i0 + i] - lo0) * f;                                         \
            idx[i] = (int32_t)CELL_OF(y, top) * step;                                         \
        }                                                                                     \
    }
#define LOAD4_float(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
#define LOAD4_double(p) _mm256_loadu_pd(p)
COUNT_KERNEL(count_f32_avx2, QK_AVX2, float, CELLS_AVX2)
COUNT_KERNEL(count_f64_avx2, QK_AVX2, double, CELLS_AVX2)
#else
COUNT_KERNEL(count_f32_avx2, , float, CELLS_PLAIN)
COUNT_KERNEL(count_f64_avx2, , double, CELLS_PLAIN)
#endif

/* 1 when segment s is long enough to be counted into 4 histograms (4 W values or more). */
static int long_row(const ad_args *a, Py_ssize_t s)
{
    Py_ssize_t a0, b0;
    qk_segment(s, a->seg, a->n, &a0, &b0);
    return b0 - a0 >= 4 * (a->cells + 1);
}

/* Segment s's values (range rg > 0 and finite) counted into cnt: cell j at cnt[j * step]
   (cell H: the masked values), in 4 histograms `stride` items apart (0: one; the caller sums
   them). */
static void count_values(const ad_args *a, Py_ssize_t s, double lo0, double rg, int64_t *cnt,
                         int32_t step, int64_t stride)
{
    const int64_t H = a->cells;
    Py_ssize_t a0, b0;
    qk_segment(s, a->seg, a->n, &a0, &b0);
    const uint8_t *mask = a->mask->len ? (const uint8_t *)a->mask->buf + a0 : NULL;
    double f = (double)H / rg;
    int avx2 = qk_avx2();
    if (a->x->itemsize == 4)
        (avx2 ? count_f32_avx2 : count_f32)((const float *)a->x->buf + a0, b0 - a0, mask, lo0,
                                            f, H, cnt, stride, step);
    else
        (avx2 ? count_f64_avx2 : count_f64)((const double *)a->x->buf + a0, b0 - a0, mask,
                                            lo0, f, H, cnt, stride, step);
}

/* Segment s's cell counts into cnt[0..H] (zero when its range rg is not searched); cnt has
   4 * (H + 1) items. */
static void count_cells(const ad_args *a, Py_ssize_t s, double lo0, double rg, int64_t *cnt)
{
    int64_t H = a->cells, W = H + 1;
    int given = a->counts && a->counts->len, ok = rg > 0.0 && rg != INFINITY;
    int four = ok && !given && long_row(a, s);
    memset(cnt, 0, (size_t)(four ? 4 * W : W) * sizeof *cnt);
    if (!ok)
        return;
    if (given) {
        memcpy(cnt, (const int64_t *)a->counts->buf + s * H, (size_t)H * sizeof *cnt);
        return;
    }
    count_values(a, s, lo0, rg, cnt, 1, four ? W : 0);
    for (int64_t j = 0; four && j < W; j++)
        cnt[j] += cnt[W + j] + cnt[2 * W + j] + cnt[3 * W + j];
}

#if AD_HAVE_LANES
/* Lane l's counts of segment s (range rg > 0 and finite) added into the lanes' zeroed tables
   t (ad_prefix_lanes' layout); 1 where they went to 4 tables (a long row). */
static int count_lane(const ad_args *a, Py_ssize_t s, double lo0, double rg, int64_t *t, int l)
{
    const int64_t H = a->cells, W = H + 1;
    if (a->counts && a->counts->len) {
        const int64_t *given = (const int64_t *)a->counts->buf + s * H;
        for (int64_t j = 0; j < H; j++)
            t[j * AD_LANES + l] = given[j];
        return 0;
    }
    int four = long_row(a, s);
    count_values(a, s, lo0, rg, t + l, AD_LANES, four ? AD_LANES * W : 0);
    return four;
}
#endif

/* Prefix sums of count and value (at cell centres) at C/S1[0..H]: integer sums (wrapping as
   numba's int64 do), then converted; Q4[0..H / hpb] those of cnt[j] (2j + 1)^2 at the edges
   (the early end's: a walk stands on edges). 1 when all three are exact (counts from 0 to
   2**40, 16 T (2H + 1)^2 below 2**53); cnt is left alone. *any: whether a count is not zero
   (C[H] may be 0 where one is: negative counts, or a sum that wraps). */
static int prefix_sums(const int64_t *cnt, int64_t H, double *C, double *S1, double *Q4,
                       int *any)
{
    uint64_t c = 0, s1 = 0, q = 0, big = 0, nz = 0;
    C[0] = 0.0;
    S1[0] = 0.0;
    Q4[0] = 0.0;
    for (int64_t e = 0; e < H; e += AD_HPB) {  /* H is a multiple of hpb */
        for (int64_t j = e; j < e + AD_HPB; j++) {
            uint64_t n = (uint64_t)cnt[j], o = (uint64_t)(2 * j + 1);
            big |= n >> 40;  /* a negative count too */
            nz |= n;
            c += n;
            s1 += n * o;
            q += n * o * o;
            C[j + 1] = (double)(int64_t)c;
            S1[j + 1] = 0.5 * (double)(int64_t)s1;
        }
        Q4[e / AD_HPB + 1] = (double)(int64_t)q;
    }
    const double o = 2.0 * (double)H + 1.0;
    *any = nz != 0;
    return !big && 16.0 * (double)c * o * o < 0x1p53;
}

int ad_early_end = 1;

double ad_margin(int exact, Py_ssize_t nq, int64_t H, double T)
{
    if (!exact || !ad_early_end)
        return INFINITY;
    const double cells = (double)H + 1.0;
    return ldexp(((double)nq + 16.0) * cells * cells * (T + 1.0), -40);
}

/* The error of the full range [0, H] (adaptive._full_error with s2tot = 0). */
static double full_error(Py_ssize_t nq, const double *C, const double *S1, int64_t H)
{
    double d = (double)H / (double)(nq - 1), t = 0.0, u = 0.0;
    for (Py_ssize_t k = 0; k < nq - 1; k++) {
        double v = (double)k * d;
        int64_t j = ad_trunc(v + 0.5 * d + 0.5);
        j = H < j ? H : j;
        t += S1[j];
        u += C[j] * (2.0 * v + d);
    }
    return 0.0 - 2.0 * ((double)H * S1[H] - d * t) + ((double)(H * H) * C[H] - d * u);
}

/* One segment's greedy walk over its prefix sums: its best [ba, bb] in cells. */
typedef struct {
    const double *C, *S1;
    double A, B, best, ba, bb, CH, SH;
} walk;

static void walk_start(walk *w, const double *C, const double *S1, Py_ssize_t nq, int64_t H)
{
    w->C = C, w->S1 = S1;
    w->A = 0.0, w->B = (double)H;
    w->best = full_error(nq, C, S1, H);
    w->ba = w->A, w->bb = w->B;
    w->CH = C[H], w->SH = S1[H];
}

/* Both candidates' sums of two segments (w[0], w[1], their prefix sums at C/S1[0..W) and
   [W..2W)) in one loop, [A + hpb, B] (x) and [A, B - hpb] (y), into r[t] = {tx, ux, ty, uy,
   d}. Segment 1's thresholds are W + A + ... as numba's (the same roundings). A threshold
   (>= 0.5) is clipped to its histogram before it is truncated (never needed: the last lies
   below B - hpb + 1), so int64 truncation gives numba's uint64 one. */
static inline void sums2(const walk *w, Py_ssize_t nq, double inv, const double *restrict C,
                         const double *restrict S1, int64_t W, double r[2][5])
{
    const double hpb = AD_HPB;
    const double jmax0 = (double)(W - 1 - AD_HPB), jmax1 = jmax0 + (double)W;
    const double A0 = w[0].A, A1 = w[1].A;
    const double d0 = (w[0].B - A0 - hpb) * inv, d1 = (w[1].B - A1 - hpb) * inv;
    const double p0 = A0 + 0.5 * d0 + 0.5, p1 = (double)W + A1 + 0.5 * d1 + 0.5;
    double tx0 = 0.0, ty0 = 0.0, ux0 = 0.0, uy0 = 0.0;
    double tx1 = 0.0, ty1 = 0.0, ux1 = 0.0, uy1 = 0.0;
    double kd = 0.0;  /* (double)k, exactly */
    for (Py_ssize_t k = 0; k < nq - 1; k++, kd += 1.0) {
        double v0 = A0 + kd * d0, v1 = A1 + kd * d1;
        double t0 = p0 + kd * d0, t1 = p1 + kd * d1;
        int64_t j0 = (int64_t)(t0 < jmax0 ? t0 : jmax0);
        int64_t j1 = (int64_t)(t1 < jmax1 ? t1 : jmax1);
        ty0 += S1[j0];
        uy0 += C[j0] * (2.0 * v0 + d0);
        tx0 += S1[j0 + AD_HPB];
        ux0 += C[j0 + AD_HPB] * (2.0 * (v0 + hpb) + d0);
        ty1 += S1[j1];
        uy1 += C[j1] * (2.0 * v1 + d1);
        tx1 += S1[j1 + AD_HPB];
        ux1 += C[j1 + AD_HPB] * (2.0 * (v1 + hpb) + d1);
    }
    double out[2][5] = {{tx0, ux0, ty0, uy0, d0}, {tx1, ux1, ty1, uy1, d1}};
    memcpy(r, out, sizeof out);
}

/* A greedy step: the better candidate, and the best range so far. */
static inline void step(walk *w, double tx, double ux, double ty, double uy, double d)
{
    const double B = w->B, by = B - AD_HPB;
    double ex = -2.0 * (B * w->SH - d * tx) + (B * B * w->CH - d * ux);
    double ey = -2.0 * (by * w->SH - d * ty) + (by * by * w->CH - d * uy);
    int tk = ex < ey;
    double e = tk ? ex : ey;
    w->A = tk ? w->A + AD_HPB : w->A;
    w->B = tk ? B : by;
    int bt = e < w->best;
    w->best = bt ? e : w->best;
    w->ba = bt ? w->A : w->ba;
    w->bb = bt ? w->B : w->bb;
}

/* Segments s and s + 1 (when < nseg) searched side by side, until both are settled
   (ad_settled); lo/hi of a searched range set; the steps walked. */
static Py_ssize_t search_pair(ad_args *a, Py_ssize_t s, int64_t *cnt, double *C, double *S1,
                              double *Q)
{
    const int64_t H = a->cells, W = H + 1;
    double lo0[2] = {0.0, 0.0}, rg[2] = {0.0, 0.0};
    int ok[2] = {0, 0};
    for (int t = 0; t < 2 && s + t < a->nseg; t++) {
        lo0[t] = qk_get(a->lo, s + t);
        rg[t] = qk_get(a->hi, s + t) - lo0[t];
        ok[t] = rg[t] > 0.0 && rg[t] != INFINITY;
    }
    if (!(ok[0] || ok[1]))
        return 0;
    walk w[2];
    double eps[2];
    for (int t = 0; t < 2; t++) {
        count_cells(a, s + t, lo0[t], ok[t] ? rg[t] : 0.0, cnt);
        int any, exact = prefix_sums(cnt, H, C + t * W, S1 + t * W, Q + t * W, &any);
        walk_start(&w[t], C + t * W, S1 + t * W, a->nq, H);
        eps[t] = ok[t] && any ? ad_margin(exact, a->nq, H, C[t * W + H]) : -INFINITY;
    }
    const double inv = 1.0 / (double)(a->nq - 1);
    double r[2][5];
    Py_ssize_t i = 0;
    while (i < a->n_iter) {
        sums2(w, a->nq, inv, C, S1, W, r);
        step(&w[0], r[0][0], r[0][1], r[0][2], r[0][3], r[0][4]);
        step(&w[1], r[1][0], r[1][1], r[1][2], r[1][3], r[1][4]);
        i++;
        int done = 1;
        for (int t = 0; t < 2; t++)
            done &= ad_settled(C + t * W, S1 + t * W, Q + t * W, 1, 1, H, eps[t], w[t].A,
                               w[t].B, w[t].best);
        if (done)
            break;
    }
    for (int t = 0; t < 2; t++)
        if (ok[t]) {
            qk_set(a->lo, s + t, lo0[t] + w[t].ba * (rg[t] / (double)H));
            qk_set(a->hi, s + t, lo0[t] + w[t].bb * (rg[t] / (double)H));
        }
    return i;
}

#if AD_HAVE_LANES
/* The lanes' tables (ad_prefix_lanes' layout): counts (4 tables, zero between searches),
   prefix sums. */
struct ad_tables {
    Py_ssize_t cells;
    int64_t *cnt;
    double *CS, *Q;
};

/* Segments s .. s + AD_LANES - 1 (those < nseg) searched at once by ad_walk_lanes, each lane
   as search_pair searches it in its pair (the same counts, prefix sums, first error and walk);
   lo/hi of a searched range set. A pair neither of whose segments is searched is skipped, as
   search_pair skips it: its lanes walk over empty histograms and nothing is written. */
static Py_ssize_t search_lanes(ad_args *a, Py_ssize_t s, ad_tables *t)
{
    const int64_t H = a->cells, W = H + 1, L = AD_LANES;
    double lo0[AD_LANES], rg[AD_LANES];
    int ok[AD_LANES], exact[AD_LANES], nonzero[AD_LANES], any = 0, four = 0;
    for (int l = 0; l < AD_LANES; l++) {
        lo0[l] = rg[l] = 0.0;
        ok[l] = 0;
        if (s + l < a->nseg) {
            lo0[l] = qk_get(a->lo, s + l);
            rg[l] = qk_get(a->hi, s + l) - lo0[l];
            ok[l] = rg[l] > 0.0 && rg[l] != INFINITY;
        }
        any |= ok[l];
    }
    if (!any)
        return 0;
    for (int l = 0; l < AD_LANES; l++)
        if (ok[l])
            four |= count_lane(a, s + l, lo0[l], rg[l], t->cnt, l);
    int counted = !(a->counts && a->counts->len) && a->seg < AD_COUNTED_MAX;
    ad_prefix_lanes(t->cnt, four ? 4 : 1, counted, W, t->CS, t->Q, exact, nonzero);
    ad_lanes w;
    w.CS = t->CS, w.Q = t->Q;
    ad_full_errors(a->nq, t->CS, H, w.best);  /* full_error of each lane */
    for (int l = 0; l < AD_LANES; l++) {
        const double *Sl = t->CS + 2 * l, *Cl = Sl + 1;  /* index i at [2 L i] */
        w.eps[l] = ok[l] && nonzero[l] ? ad_margin(exact[l], a->nq, H, Cl[2 * L * H])
                                       : -INFINITY;
        w.A[l] = 0.0, w.B[l] = (double)H;
        w.ba[l] = w.A[l], w.bb[l] = w.B[l];
        w.CH[l] = Cl[2 * L * H], w.SH[l] = Sl[2 * L * H];
    }
    Py_ssize_t steps = ad_walk_lanes(&w, a->nq, a->n_iter, W);
    for (int l = 0; l < AD_LANES; l++)
        if (ok[l]) {
            qk_set(a->lo, s + l, lo0[l] + w.ba[l] * (rg[l] / (double)H));
            qk_set(a->hi, s + l, lo0[l] + w.bb[l] * (rg[l] / (double)H));
        }
    return steps;
}

void ad_tables_free(ad_tables *t)
{
    if (t) {
        free(t->cnt);
        free(t->CS);
        free(t->Q);
        free(t);
    }
}

ad_tables *ad_tables_new(Py_ssize_t cells)
{
    if (!qk_avx2() || cells < 1 || cells > AD_LANES_CELLS)
        return NULL;
    const size_t W = (size_t)cells + 1, L = AD_LANES;
    ad_tables *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->cells = cells;
    t->cnt = calloc(4 * L * W, sizeof *t->cnt);  /* zeroed: ad_prefix_lanes leaves it so */
    t->CS = malloc(2 * L * W * sizeof *t->CS);
    t->Q = malloc(L * W * sizeof *t->Q);
    if (!(t->cnt && t->CS && t->Q)) {
        ad_tables_free(t);
        return NULL;
    }
    return t;
}

/* All segments by search_lanes, in t (NULL: tables of its own); the steps walked, or -1 where
   its tables cannot be had (nothing done). */
static Py_ssize_t search_all_lanes(ad_args *a, ad_tables *t)
{
    int reuse = t && t->cells == a->cells;
    ad_tables *own = reuse ? NULL : ad_tables_new(a->cells), *use = reuse ? t : own;
    if (!use)
        return -1;
    Py_ssize_t steps = 0;
    for (Py_ssize_t s = 0; s < a->nseg; s += AD_LANES)
        steps += search_lanes(a, s, use);
    ad_tables_free(own);
    return steps;
}
#endif

/* The histogram search over a's segments (the lanes' tables in t where not NULL): the steps
   walked, or -1 out of memory (nothing done). No Python calls: runs without the GIL. */
static Py_ssize_t histogram_in(ad_args *a, ad_tables *t)
{
    const int64_t H = a->cells, W = H + 1;
#if AD_HAVE_LANES
    if (qk_avx2() && H <= AD_LANES_CELLS) {
        Py_ssize_t steps = search_all_lanes(a, t);
        if (steps >= 0)
            return steps;
    }
#endif
    int64_t *cnt = malloc((size_t)(4 * W) * sizeof *cnt);
    double *C = malloc((size_t)(2 * W) * sizeof *C), *S1 = malloc((size_t)(2 * W) * sizeof *S1);
    double *Q = malloc((size_t)(2 * W) * sizeof *Q);
    Py_ssize_t steps = -1;
    if (cnt && C && S1 && Q) {
        steps = 0;
        for (Py_ssize_t s = 0; s < a->nseg; s += 2)
            steps += search_pair(a, s, cnt, C, S1, Q);
    }
    free(cnt);
    free(C);
    free(S1);
    free(Q);
    return steps;
}

static Py_ssize_t histogram_run(ad_args *a)
{
    return histogram_in(a, NULL);
}

Py_ssize_t ad_greedy_steps(double ratio, Py_ssize_t num_bins, int zero_width_ok,
                           const char *name)
{
    return greedy_steps(ratio, num_bins, zero_width_ok, name);
}

Py_ssize_t ad_search_floats(const float *x, Py_ssize_t n, Py_ssize_t seg, double *lo, double *hi,
                            Py_ssize_t nseg, Py_ssize_t nq, Py_ssize_t num_bins,
                            Py_ssize_t n_iter, ad_tables *tables)
{
    ad_args a;
    memset(&a, 0, sizeof a);
    Py_buffer *v = a.v;  /* views of raw memory: no object behind them, never released */
    v[0].buf = (void *)x, v[0].len = n * 4, v[0].itemsize = 4;
    v[1].buf = NULL, v[1].len = 0, v[1].itemsize = 1;
    v[2].buf = lo, v[2].len = nseg * 8, v[2].itemsize = 8;
    v[3].buf = hi, v[3].len = nseg * 8, v[3].itemsize = 8;
    a.x = &v[0], a.mask = &v[1], a.lo = &v[2], a.hi = &v[3], a.counts = NULL;
    a.n = n, a.seg = seg, a.nseg = nseg, a.nq = nq, a.n_iter = n_iter;
    if (nq < 2 || n_iter < 1 || nseg < 1)
        return 0;
    a.cells = num_bins * AD_HPB;  /* n_iter >= 1: num_bins was checked (ad_greedy_steps) */
    return ad_use_direct(seg, nq) ? ad_direct_run(&a) : histogram_in(&a, tables);
}

PyObject *ad_call(PyObject *args, int with_counts, const char *name,
                  Py_ssize_t (*search)(ad_args *))
{
    ad_args a;
    int run = ad_parse(args, with_counts, with_counts, &a, name);
    if (run <= 0)
        return run < 0 ? NULL : PyLong_FromLong(0);
    Py_ssize_t steps;
    Py_BEGIN_ALLOW_THREADS
    steps = search(&a);
    Py_END_ALLOW_THREADS
    if (steps < 0)
        PyErr_NoMemory();
    return ck_done(a.v, a.held) < 0 ? NULL : PyLong_FromSsize_t(steps);
}

/* histogram_search(x, seg, mask, counts, lo, hi, nq, num_bins, ratio): each segment's range
   refined in place, its histogram counted from x or taken from counts (when it has rows); the
   steps walked. */
static PyObject *ck_adaptive_histogram_search(PyObject *self, PyObject *args)
{
    return ad_call(args, 1, "histogram_search", histogram_run);
}

/* adaptive_early_end(on): whether the searches end a walk early (adaptive.h), from now on in
   this process; returns the previous setting. The same ranges either way: for tests and
   benchmarks. */
static PyObject *ck_adaptive_early_end(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int before = ad_early_end;
    ad_early_end = on;
    return PyBool_FromLong(before);
}

PyMethodDef ck_adaptive_methods[] = {
    {"adaptive_early_end", ck_adaptive_early_end, METH_O,
     "adaptive_early_end(on) -> the previous setting: whether the searches end a greedy walk "
     "once no later candidate can win (the same ranges either way)."},
    {"adaptive_histogram_search", ck_adaptive_histogram_search, METH_VARARGS,
     "histogram_search(x, seg, mask, counts, lo, hi, nq, num_bins, ratio) -> steps walked: the "
     "greedy range search over each segment's histogram (from x, or counts when it has rows)."},
    {"adaptive_direct_ranges", ck_adaptive_direct_ranges, METH_VARARGS,
     "direct_ranges(x, seg, mask, lo, hi, nq, num_bins, ratio) -> steps walked: the greedy "
     "range search with each candidate's exact error (short segments)."},
    {NULL, NULL, 0, NULL},
};
