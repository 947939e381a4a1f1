/* DynaQuant's weighted k-means of one segment (the twins of ckptcodecs/kmeans.py's _rand,
   _weighted_kmeans and _fit_segment): weighted k-means++ seeding from a splitmix64 stream,
   then weighted Lloyd iterations with a linear assignment sweep. Float operations in the
   reference's order; the centres sorted by numba's own quicksort (the order of equal keys,
   0.0 and -0.0, is then the reference's too). */
#include "kmeans.h"

#include <math.h>
#include <stdlib.h>

#define MAX_ITER 64
#define SMALL_QUICKSORT 15
#define MAX_STACK 100

/* splitmix64 step: the new state, and a uniform double in [0, 1) into *r. */
static uint64_t rand_step(uint64_t state, double *r)
{
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
    *r = (double)(z >> 11) / 9007199254740992.0;
    return state;
}

/* numba's order of floats: NaN last. */
static inline int lt(double a, double b) { return a < b || (isnan(b) && !isnan(a)); }

static inline void swap(double *a, Py_ssize_t i, Py_ssize_t j)
{
    double t = a[i];
    a[i] = a[j];
    a[j] = t;
}

static void insertion_sort(double *a, Py_ssize_t low, Py_ssize_t high)
{
    for (Py_ssize_t i = low + 1; i <= high; i++) {
        double v = a[i];
        Py_ssize_t j = i;
        while (j > low && lt(v, a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

static Py_ssize_t partition(double *a, Py_ssize_t low, Py_ssize_t high)
{
    Py_ssize_t mid = (low + high) >> 1;
    if (lt(a[mid], a[low]))
        swap(a, low, mid);
    if (lt(a[high], a[mid]))
        swap(a, high, mid);
    if (lt(a[mid], a[low]))
        swap(a, low, mid);
    double pivot = a[mid];
    swap(a, high, mid);
    Py_ssize_t i = low, j = high - 1;
    for (;;) {
        while (i < high && lt(a[i], pivot))
            i++;
        while (j >= low && lt(pivot, a[j]))
            j--;
        if (i >= j)
            break;
        swap(a, i, j);
        i++;
        j--;
    }
    swap(a, i, high);
    return i;
}

/* numba's quicksort of a float array (numba/misc/quicksort.py), step for step. */
static void nb_sort(double *a, Py_ssize_t n)
{
    Py_ssize_t stack[MAX_STACK][2];
    if (n < 2)
        return;
    stack[0][0] = 0;
    stack[0][1] = n - 1;
    int top = 1;
    while (top > 0) {
        top--;
        Py_ssize_t low = stack[top][0], high = stack[top][1];
        while (high - low >= SMALL_QUICKSORT && top < MAX_STACK) {
            Py_ssize_t i = partition(a, low, high);
            if (high - i > i - low) {
                if (high > i) {
                    stack[top][0] = i + 1;
                    stack[top++][1] = high;
                }
                high = i - 1;
            } else {
                if (i > low) {
                    stack[top][0] = low;
                    stack[top++][1] = i - 1;
                }
                low = i + 1;
            }
        }
        insertion_sort(a, low, high);
    }
}

/* The first index whose running sum (prefix[i]) exceeds target, else B - 1: the reference's
   draw, its running sums kept from the pass that made them (the same additions in the same
   order, so the same values) and scanned without the chain of additions. */
static Py_ssize_t draw(const double *restrict prefix, Py_ssize_t B, double target)
{
    for (Py_ssize_t i = 0; i < B; i++)
        if (prefix[i] > target)
            return i;
    return B - 1;
}

/* d2[i] = the squared distance of vals[i] to centre c when first (else the smaller of d2[i] and
   it, as numba's min), and the running sums of w[i] * d2[i] into prefix; their total. */
static double update_d2(const double *restrict vals, const double *restrict w, Py_ssize_t B,
                        double centre, int first, double *restrict d2, double *restrict prefix)
{
    double acc = 0.0;
    for (Py_ssize_t i = 0; i < B; i++) {
        double d = vals[i] - centre, dd = d * d;
        d2[i] = first || dd < d2[i] ? dd : d2[i];
        acc += w[i] * d2[i];
        prefix[i] = acc;
    }
    return acc;
}

/* Weighted k-means++: k seeds from vals (B > k), sorted. The total of w * d2 of centre c + 1
   is summed in the pass that updates d2 for centre c, in the reference's order. */
static void seed_centers(const double *restrict vals, const double *restrict w, Py_ssize_t B,
                         Py_ssize_t k, uint64_t state, ck_kmeans_scratch *s)
{
    double *restrict centers = s->centers, *restrict prefix = s->prefix;
    double tot = 0.0, r;
    for (Py_ssize_t i = 0; i < B; i++) {
        tot += w[i];
        prefix[i] = tot;
    }
    state = rand_step(state, &r);
    centers[0] = vals[draw(prefix, B, r * tot)];
    tot = update_d2(vals, w, B, centers[0], 1, s->d2, prefix);
    for (Py_ssize_t c = 1; c < k; c++) {
        if (tot <= 0.0) {  /* fewer distinct values than centres: duplicate the last one */
            centers[c] = centers[c - 1];
            continue;
        }
        state = rand_step(state, &r);
        centers[c] = vals[draw(prefix, B, r * tot)];
        tot = update_d2(vals, w, B, centers[c], 0, s->d2, prefix);
    }
    nb_sort(centers, k);
}

/* One Lloyd sweep: assignments and the weighted sums of each centre; 1 when one changed. A
   centre's values are one run of vals (c only grows), so its sums are kept in registers and
   stored when the run ends: the same additions in the same order as the reference's. */
static int assign_sweep(const double *restrict vals, const double *restrict w, Py_ssize_t B,
                        Py_ssize_t k, const double *restrict centers, int64_t *restrict assign,
                        double *restrict sw, double *restrict swx)
{
    int changed = 0;
    Py_ssize_t c = 0;
    double aw = 0.0, awx = 0.0;
    for (Py_ssize_t j = 0; j < k; j++)
        sw[j] = swx[j] = 0.0;
    for (Py_ssize_t i = 0; i < B; i++) {
        while (c + 1 < k && fabs(vals[i] - centers[c + 1]) <= fabs(vals[i] - centers[c])) {
            sw[c] = aw;
            swx[c] = awx;
            c++;
            aw = awx = 0.0;
        }
        if (assign[i] != c) {
            assign[i] = c;
            changed = 1;
        }
        aw += w[i];
        awx += w[i] * vals[i];
    }
    sw[c] = aw;
    swx[c] = awx;
    return changed;
}

/* The twin of _weighted_kmeans: k sorted centres of the ascending vals[0..B) of weights w. */
static void weighted_kmeans(const double *vals, const double *w, Py_ssize_t B, Py_ssize_t k,
                            uint64_t seed, ck_kmeans_scratch *s)
{
    double *centers = s->centers;
    if (B <= k) {
        for (Py_ssize_t i = 0; i < k; i++)
            centers[i] = vals[i < B - 1 ? i : B - 1];
        return;
    }
    seed_centers(vals, w, B, k, seed, s);
    for (Py_ssize_t i = 0; i < B; i++)
        s->assign[i] = -1;
    for (int it = 0; it < MAX_ITER; it++) {
        if (!assign_sweep(vals, w, B, k, centers, s->assign, s->sw, s->swx))
            break;
        for (Py_ssize_t c = 0; c < k; c++)
            if (s->sw[c] > 0.0)
                centers[c] = s->swx[c] / s->sw[c];
        nb_sort(centers, k);
    }
}

void ck_fit_segment(const int64_t *cnt, const double *sums, Py_ssize_t nt, Py_ssize_t k,
                    double lam, uint64_t seed, double *out, Py_ssize_t row,
                    ck_kmeans_scratch *s)
{
    if (nt == 0) {
        for (Py_ssize_t c = 0; c < row; c++)
            out[c] = 0.0;
        return;
    }
    double total = 0.0, mag = 0.0;
    for (Py_ssize_t i = 0; i < nt; i++) {
        s->vals[i] = sums[i] / (double)cnt[i];
        total += (double)cnt[i];
        mag += fabs(s->vals[i]);
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        double wf = (double)cnt[i] / total;
        double wm = mag > 0.0 ? fabs(s->vals[i]) / mag : 1.0 / (double)nt;
        s->w[i] = lam * wf + (1.0 - lam) * wm;
        if (s->w[i] <= 0.0)
            s->w[i] = 1e-300;
    }
    weighted_kmeans(s->vals, s->w, nt, k, seed, s);
    for (Py_ssize_t c = 0; c < k; c++)
        out[c] = s->centers[c];
}

int ck_kmeans_alloc(ck_kmeans_scratch *s, Py_ssize_t buckets, Py_ssize_t k)
{
    size_t b = (size_t)(buckets > 0 ? buckets : 1), kk = (size_t)k;
    memset(s, 0, sizeof *s);
    s->buckets = buckets;
    s->k = k;
    s->vals = malloc(b * sizeof(double));
    s->w = malloc(b * sizeof(double));
    s->d2 = malloc(b * sizeof(double));
    s->prefix = malloc(b * sizeof(double));
    s->assign = malloc(b * sizeof(int64_t));
    s->sw = malloc(kk * sizeof(double));
    s->swx = malloc(kk * sizeof(double));
    s->centers = malloc(kk * sizeof(double));
    if (s->vals && s->w && s->d2 && s->prefix && s->assign && s->sw && s->swx && s->centers)
        return 1;
    ck_kmeans_free(s);
    return 0;
}

void ck_kmeans_free(ck_kmeans_scratch *s)
{
    free(s->vals);
    free(s->w);
    free(s->d2);
    free(s->prefix);
    free(s->assign);
    free(s->sw);
    free(s->swx);
    free(s->centers);
    memset(s, 0, sizeof *s);
}
