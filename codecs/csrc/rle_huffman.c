/* RLEHuffman's encoder (the twin of ckptcodecs/_hkernels.py's encode_stream): the runs are
   scanned twice -- once to count the symbols, once to write their codes MSB first -- around
   the code tables (rle_huffman_tables.c); no symbol stream is stored (each scan finds the
   runs of a chunk without a branch on the data, run_starts, then walks them). Symbols: a
   byte value v is index v, a run of r >= 2 (the value before it occurs r times) is index
   RUN_BASE + r. */
#include "native.h"
#include "planes.h"

#define ALPHABET (1 << 16)
#define RUN_BASE 254
#define MAX_RUN (ALPHABET - 1 - RUN_BASE)
#define MAX_LEN 24


/* The symbol index of a piece of a run: RUN_BASE + piece, or for a piece of one (it has no
   run symbol) NONE + lane, one of LANES slots past the alphabet that count in turn and write no
   bits. Without a branch: whether a run goes on is data (one run in five or fewer on the
   benchmarks' data: a branch on it mispredicts). */
#define NONE ALPHABET
#define LANES 8  /* a counter a run in 8 at most: a run of pieces of one waits on none */
#define SLOTS (ALPHABET + LANES)

/* -1 when piece > 1, else 0: a value gcc cannot see through (it turned the selects on it back
   into branches, threading them into the loop around). */
static inline Py_ssize_t run_many(Py_ssize_t piece)
{
    Py_ssize_t many = -(Py_ssize_t)(piece > 1);
#if defined(__GNUC__)
    __asm__("" : "+r"(many));
#endif
    return many;
}

static inline Py_ssize_t run_symbol(Py_ssize_t piece, Py_ssize_t many, Py_ssize_t lane)
{
    return (NONE + lane) ^ (((RUN_BASE + piece) ^ (NONE + lane)) & many);
}

/* Count the symbols of one piece of a run of v into vfreq's lanes and freq (SLOTS); the
   symbol count after them. */
static inline Py_ssize_t count_piece(int v, Py_ssize_t piece, Py_ssize_t m,
                                     int64_t (*vfreq)[256], int64_t *freq)
{
    Py_ssize_t many = run_many(piece);
    vfreq[m & (LANES - 1)][v]++;
    freq[run_symbol(piece, many, m & (LANES - 1))]++;
    return m + 1 + (many & 1);
}

/* Count the symbols of a run of `run` >= 1 copies of v (pieces of MAX_RUN, then the rest); the
   symbol count after them. */
static inline Py_ssize_t count_run(int v, Py_ssize_t run, Py_ssize_t m, int64_t (*vfreq)[256],
                                   int64_t *freq)
{
    for (; run > MAX_RUN; run -= MAX_RUN)
        m = count_piece(v, MAX_RUN, m, vfreq, freq);
    return count_piece(v, run, m, vfreq, freq);
}

/* Where runs begin in data[i0, i1) (1 <= i0, i1 - i0 <= RUN_CHUNK): the offsets from i0 of
   the bytes that differ from the one before them, in order, into starts (RUN_CHUNK + 8
   slots); how many. Eight bytes a step (each byte against the one before it): the mask of the bytes
   that differ picks from STARTS the offsets of its set bits (eight 16-bit lanes, the rest
   zero), which are stored whole at starts[m] with the step's offset added to each lane, and m
   advances by how many differ -- no branch on the data (where a run ends is data: a branch on
   it mispredicts about once a run) and two stores a step. STARTS[k] is
   [j for j in range(8) if k >> j & 1] padded with zeros, as two little-endian u64. */
#define HIGH UINT64_C(0x8080808080808080)
#define LOW7 UINT64_C(0x7f7f7f7f7f7f7f7f)
#define ONES UINT64_C(0x0101010101010101)
#define LANES16 UINT64_C(0x0001000100010001)
#define GATHER UINT64_C(0x0102040810204080)  /* bit 8k -> bit 56 + k */
#define RUN_CHUNK 8192
static const uint64_t STARTS[256][2] = {
    {0x0, 0x0}, {0x0, 0x0}, {0x1, 0x0}, {0x10000, 0x0}, {0x2, 0x0}, {0x20000, 0x0}, {0x20001, 0x0},
    {0x200010000, 0x0}, {0x3, 0x0}, {0x30000, 0x0}, {0x30001, 0x0}, {0x300010000, 0x0},
    {0x30002, 0x0}, {0x300020000, 0x0}, {0x300020001, 0x0}, {0x3000200010000, 0x0}, {0x4, 0x0},
    {0x40000, 0x0}, {0x40001, 0x0}, {0x400010000, 0x0}, {0x40002, 0x0}, {0x400020000, 0x0},
    {0x400020001, 0x0}, {0x4000200010000, 0x0}, {0x40003, 0x0}, {0x400030000, 0x0},
    {0x400030001, 0x0}, {0x4000300010000, 0x0}, {0x400030002, 0x0}, {0x4000300020000, 0x0},
    {0x4000300020001, 0x0}, {0x3000200010000, 0x4}, {0x5, 0x0}, {0x50000, 0x0}, {0x50001, 0x0},
    {0x500010000, 0x0}, {0x50002, 0x0}, {0x500020000, 0x0}, {0x500020001, 0x0},
    {0x5000200010000, 0x0}, {0x50003, 0x0}, {0x500030000, 0x0}, {0x500030001, 0x0},
    {0x5000300010000, 0x0}, {0x500030002, 0x0}, {0x5000300020000, 0x0}, {0x5000300020001, 0x0},
    {0x3000200010000, 0x5}, {0x50004, 0x0}, {0x500040000, 0x0}, {0x500040001, 0x0},
    {0x5000400010000, 0x0}, {0x500040002, 0x0}, {0x5000400020000, 0x0}, {0x5000400020001, 0x0},
    {0x4000200010000, 0x5}, {0x500040003, 0x0}, {0x5000400030000, 0x0}, {0x5000400030001, 0x0},
    {0x4000300010000, 0x5}, {0x5000400030002, 0x0}, {0x4000300020000, 0x5}, {0x4000300020001, 0x5},
    {0x3000200010000, 0x50004}, {0x6, 0x0}, {0x60000, 0x0}, {0x60001, 0x0}, {0x600010000, 0x0},
    {0x60002, 0x0}, {0x600020000, 0x0}, {0x600020001, 0x0}, {0x6000200010000, 0x0}, {0x60003, 0x0},
    {0x600030000, 0x0}, {0x600030001, 0x0}, {0x6000300010000, 0x0}, {0x600030002, 0x0},
    {0x6000300020000, 0x0}, {0x6000300020001, 0x0}, {0x3000200010000, 0x6}, {0x60004, 0x0},
    {0x600040000, 0x0}, {0x600040001, 0x0}, {0x6000400010000, 0x0}, {0x600040002, 0x0},
    {0x6000400020000, 0x0}, {0x6000400020001, 0x0}, {0x4000200010000, 0x6}, {0x600040003, 0x0},
    {0x6000400030000, 0x0}, {0x6000400030001, 0x0}, {0x4000300010000, 0x6}, {0x6000400030002, 0x0},
    {0x4000300020000, 0x6}, {0x4000300020001, 0x6}, {0x3000200010000, 0x60004}, {0x60005, 0x0},
    {0x600050000, 0x0}, {0x600050001, 0x0}, {0x6000500010000, 0x0}, {0x600050002, 0x0},
    {0x6000500020000, 0x0}, {0x6000500020001, 0x0}, {0x5000200010000, 0x6}, {0x600050003, 0x0},
    {0x6000500030000, 0x0}, {0x6000500030001, 0x0}, {0x5000300010000, 0x6}, {0x6000500030002, 0x0},
    {0x5000300020000, 0x6}, {0x5000300020001, 0x6}, {0x3000200010000, 0x60005}, {0x600050004, 0x0},
    {0x6000500040000, 0x0}, {0x6000500040001, 0x0}, {0x5000400010000, 0x6}, {0x6000500040002, 0x0},
    {0x5000400020000, 0x6}, {0x5000400020001, 0x6}, {0x4000200010000, 0x60005},
    {0x6000500040003, 0x0}, {0x5000400030000, 0x6}, {0x5000400030001, 0x6},
    {0x4000300010000, 0x60005}, {0x5000400030002, 0x6}, {0x4000300020000, 0x60005},
    {0x4000300020001, 0x60005}, {0x3000200010000, 0x600050004}, {0x7, 0x0}, {0x70000, 0x0},
    {0x70001, 0x0}, {0x700010000, 0x0}, {0x70002, 0x0}, {0x700020000, 0x0}, {0x700020001, 0x0},
    {0x7000200010000, 0x0}, {0x70003, 0x0}, {0x700030000, 0x0}, {0x700030001, 0x0},
    {0x7000300010000, 0x0}, {0x700030002, 0x0}, {0x7000300020000, 0x0}, {0x7000300020001, 0x0},
    {0x3000200010000, 0x7}, {0x70004, 0x0}, {0x700040000, 0x0}, {0x700040001, 0x0},
    {0x7000400010000, 0x0}, {0x700040002, 0x0}, {0x7000400020000, 0x0}, {0x7000400020001, 0x0},
    {0x4000200010000, 0x7}, {0x700040003, 0x0}, {0x7000400030000, 0x0}, {0x7000400030001, 0x0},
    {0x4000300010000, 0x7}, {0x7000400030002, 0x0}, {0x4000300020000, 0x7}, {0x4000300020001, 0x7},
    {0x3000200010000, 0x70004}, {0x70005, 0x0}, {0x700050000, 0x0}, {0x700050001, 0x0},
    {0x7000500010000, 0x0}, {0x700050002, 0x0}, {0x7000500020000, 0x0}, {0x7000500020001, 0x0},
    {0x5000200010000, 0x7}, {0x700050003, 0x0}, {0x7000500030000, 0x0}, {0x7000500030001, 0x0},
    {0x5000300010000, 0x7}, {0x7000500030002, 0x0}, {0x5000300020000, 0x7}, {0x5000300020001, 0x7},
    {0x3000200010000, 0x70005}, {0x700050004, 0x0}, {0x7000500040000, 0x0}, {0x7000500040001, 0x0},
    {0x5000400010000, 0x7}, {0x7000500040002, 0x0}, {0x5000400020000, 0x7}, {0x5000400020001, 0x7},
    {0x4000200010000, 0x70005}, {0x7000500040003, 0x0}, {0x5000400030000, 0x7},
    {0x5000400030001, 0x7}, {0x4000300010000, 0x70005}, {0x5000400030002, 0x7},
    {0x4000300020000, 0x70005}, {0x4000300020001, 0x70005}, {0x3000200010000, 0x700050004},
    {0x70006, 0x0}, {0x700060000, 0x0}, {0x700060001, 0x0}, {0x7000600010000, 0x0},
    {0x700060002, 0x0}, {0x7000600020000, 0x0}, {0x7000600020001, 0x0}, {0x6000200010000, 0x7},
    {0x700060003, 0x0}, {0x7000600030000, 0x0}, {0x7000600030001, 0x0}, {0x6000300010000, 0x7},
    {0x7000600030002, 0x0}, {0x6000300020000, 0x7}, {0x6000300020001, 0x7},
    {0x3000200010000, 0x70006}, {0x700060004, 0x0}, {0x7000600040000, 0x0}, {0x7000600040001, 0x0},
    {0x6000400010000, 0x7}, {0x7000600040002, 0x0}, {0x6000400020000, 0x7}, {0x6000400020001, 0x7},
    {0x4000200010000, 0x70006}, {0x7000600040003, 0x0}, {0x6000400030000, 0x7},
    {0x6000400030001, 0x7}, {0x4000300010000, 0x70006}, {0x6000400030002, 0x7},
    {0x4000300020000, 0x70006}, {0x4000300020001, 0x70006}, {0x3000200010000, 0x700060004},
    {0x700060005, 0x0}, {0x7000600050000, 0x0}, {0x7000600050001, 0x0}, {0x6000500010000, 0x7},
    {0x7000600050002, 0x0}, {0x6000500020000, 0x7}, {0x6000500020001, 0x7},
    {0x5000200010000, 0x70006}, {0x7000600050003, 0x0}, {0x6000500030000, 0x7},
    {0x6000500030001, 0x7}, {0x5000300010000, 0x70006}, {0x6000500030002, 0x7},
    {0x5000300020000, 0x70006}, {0x5000300020001, 0x70006}, {0x3000200010000, 0x700060005},
    {0x7000600050004, 0x0}, {0x6000500040000, 0x7}, {0x6000500040001, 0x7},
    {0x5000400010000, 0x70006}, {0x6000500040002, 0x7}, {0x5000400020000, 0x70006},
    {0x5000400020001, 0x70006}, {0x4000200010000, 0x700060005}, {0x6000500040003, 0x7},
    {0x5000400030000, 0x70006}, {0x5000400030001, 0x70006}, {0x4000300010000, 0x700060005},
    {0x5000400030002, 0x70006}, {0x4000300020000, 0x700060005}, {0x4000300020001, 0x700060005},
    {0x3000200010000, 0x7000600050004}
};

static inline int run_starts(const uint8_t *data, Py_ssize_t i0, Py_ssize_t i1,
                             uint16_t *starts)
{
    int m = 0;
    Py_ssize_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        uint64_t d = ck_load64(data + i) ^ ck_load64(data + i - 1);
        uint64_t e = ((((d & LOW7) + LOW7) | d) & HIGH) >> 7;  /* byte k: 1 if byte k differs */
        const uint64_t *offs = STARTS[(e * GATHER) >> 56];
        uint64_t at = (uint64_t)(i - i0) * LANES16;
        uint64_t lo = offs[0] + at, hi = offs[1] + at;
        memcpy(starts + m, &lo, 8);
        memcpy(starts + m + 4, &hi, 8);
        m += (int)((e * ONES) >> 56);
    }
    for (; i < i1; i++) {
        starts[m] = (uint16_t)(i - i0);
        m += data[i] != data[i - 1];
    }
    return m;
}

/* A chunk of `len` bytes with `starts` runs is dense when 7 in 8 or more of its runs are single
   bytes (quantized codes at 8 bits, noise): there a branch on two runs being single bytes
   predicts well and spares them the branchless path's work for absent run symbols (1.4x
   faster on 8-bit codes); at fewer (4-bit codes: 1 run in 7 repeats; residuals: 1 in 5) it
   would mispredict too often. */
#define DENSE(starts, len) (8 * (Py_ssize_t)(starts) >= 7 * (Py_ssize_t)(len))

/* For each run of equal bytes of data[0..n) (n >= 1), in order: BODY with `v` its value and
   `run` its length -- or, in a dense chunk, PAIR with `v0`, `v1` for two single bytes in a
   row and SINGLE with `v` for one. The runs' starts are found a chunk at a time
   (run_starts), then the bodies run over them in a loop of known length. */
#define FOR_EACH_RUN(data, n, PAIR, SINGLE, BODY)                                            \
    do {                                                                                     \
        uint16_t starts_[RUN_CHUNK + 8];                                                     \
        Py_ssize_t start_ = 0;                                                               \
        for (Py_ssize_t c_ = 1; c_ < (n); c_ += RUN_CHUNK) {                                 \
            Py_ssize_t c1_ = (n) - c_ < RUN_CHUNK ? (n) : c_ + RUN_CHUNK;                    \
            int m_ = run_starts((data), c_, c1_, starts_), j_ = 0;                           \
            if (DENSE(m_, c1_ - c_)) {                                                       \
                while (j_ + 1 < m_) {                                                        \
                    Py_ssize_t at_ = c_ + starts_[j_];                                       \
                    if (c_ + starts_[j_ + 1] - start_ == 2) {                                \
                        int v0 = (data)[start_], v1 = (data)[at_];                           \
                        PAIR;                                                                \
                        start_ = at_ + 1;                                                    \
                        j_ += 2;                                                             \
                        continue;                                                            \
                    }                                                                        \
                    int v = (data)[start_];                                                  \
                    Py_ssize_t run = at_ - start_;                                           \
                    if (run == 1)                                                            \
                        SINGLE;                                                              \
                    else                                                                     \
                        BODY;                                                                \
                    start_ = at_;                                                            \
                    j_++;                                                                    \
                }                                                                            \
            }                                                                                \
            for (; j_ < m_; j_++) {                                                          \
                Py_ssize_t at_ = c_ + starts_[j_];                                           \
                int v = (data)[start_];                                                      \
                Py_ssize_t run = at_ - start_;                                               \
                BODY;                                                                        \
                start_ = at_;                                                                \
            }                                                                                \
        }                                                                                    \
        {                                                                                    \
            int v = (data)[start_];                                                          \
            Py_ssize_t run = (n) - start_;                                                   \
            BODY;                                                                            \
        }                                                                                    \
    } while (0)

/* The symbol counts of data[0..n) added to freq (symbols are not stored: the writer scans
   the data again); the number of symbols. */
static Py_ssize_t rle_scan(const uint8_t *data, Py_ssize_t n, int64_t *freq)
{
    int64_t vfreq[LANES][256];  /* value counts in lanes, summed at the end */
    Py_ssize_t m = 0;
    memset(vfreq, 0, sizeof vfreq);
    FOR_EACH_RUN(data, n, (vfreq[m & (LANES - 1)][v0]++, vfreq[(m + 1) & (LANES - 1)][v1]++, m += 2),
                 vfreq[m++ & (LANES - 1)][v]++, m = count_run(v, run, m, vfreq, freq));
    for (int v = 0; v < 256; v++)
        for (int k = 0; k < LANES; k++)
            freq[v] += vfreq[k][v];
    return m;
}

/* The MSB-first bit writer: the pending bits (fewer than 8 between runs) at the top of acc;
   after each run the whole bytes are stored, eight at a time (the output has 8 bytes of slack
   past the stream), without a branch. */
typedef struct {
    uint64_t acc;
    int nbits;
    uint8_t *out;
} bits_t;

/* The codes of the symbols of a run of `run` copies of v: each piece's value code and run
   code (NONE: 0 bits) together, at most 2 * MAX_LEN bits. */
/* Store the whole bytes waiting (fewer than 8 bits wait after). */
static inline void flush(bits_t *b)
{
    uint64_t word = __builtin_bswap64(b->acc);
    memcpy(b->out, &word, 8);
    b->out += b->nbits >> 3;
    b->acc <<= b->nbits & ~7;
    b->nbits &= 7;
}

static inline void put_piece(bits_t *b, int v, Py_ssize_t piece, const uint32_t *codes,
                             const uint8_t *lens)
{
    Py_ssize_t r = run_symbol(piece, run_many(piece), 0);
    int ln = lens[v] + lens[r];
    uint64_t code = ((uint64_t)codes[v] << lens[r]) | codes[r];
    b->acc |= code << (64 - b->nbits - ln);
    b->nbits += ln;
    flush(b);
}

/* A single byte's code (`coded`: code << 6 | length, in a dense chunk): the whole bytes are
   stored only once more than 40 bits wait (a code has 24 at most), every few symbols. */
static inline void put_single(bits_t *b, uint64_t coded)
{
    int ln = (int)(coded & 63);
    if (b->nbits > 40)
        flush(b);
    b->acc |= (coded >> 6) << (64 - b->nbits - ln);
    b->nbits += ln;
}

/* Two single bytes' codes, then the whole bytes stored (at most 7 + 2 * 24 bits wait). */
static inline void put_pair(bits_t *b, uint64_t coded0, uint64_t coded1)
{
    int ln0 = (int)(coded0 & 63), ln1 = (int)(coded1 & 63);
    if (b->nbits > 7)  /* after put_single */
        flush(b);
    uint64_t code = (coded0 >> 6) << ln1 | coded1 >> 6;
    b->acc |= code << (64 - b->nbits - ln0 - ln1);
    b->nbits += ln0 + ln1;
    flush(b);
}

static inline void put_run(bits_t *b, int v, Py_ssize_t run, const uint32_t *codes,
                           const uint8_t *lens)
{
    if (b->nbits > 7)  /* after single bytes: a piece needs up to 48 bits of room */
        flush(b);
    for (; run > MAX_RUN; run -= MAX_RUN)
        put_piece(b, v, MAX_RUN, codes, lens);
    put_piece(b, v, run, codes, lens);
}

/* Huffman-code the symbols of data[0..n) (scanned as rle_scan does) MSB first into out (8
   bytes of slack past what is written); the bytes written. */
static Py_ssize_t write_bits(const uint8_t *data, Py_ssize_t n, const uint32_t *codes,
                             const uint8_t *lens, uint8_t *out)
{
    bits_t b = {0, 0, out};
    uint64_t single[256];  /* a single byte's code above its length (6 bits): one load */
    for (int v = 0; v < 256; v++)
        single[v] = (uint64_t)codes[v] << 6 | lens[v];
    FOR_EACH_RUN(data, n, put_pair(&b, single[v0], single[v1]), put_single(&b, single[v]),
                 put_run(&b, v, run, codes, lens));
    if (b.nbits > 0)
        *b.out++ = (uint8_t)(b.acc >> 56);
    return b.out - out;
}

/* The plan of one encoding: what encode_stream works out before the output is allocated. */
typedef struct {
    const uint8_t *data;
    Py_ssize_t n;
    int64_t *freq;   /* ALPHABET counts, then NONE's */
    int64_t *used;   /* the symbols that occur, then their counts, then their code lengths */
    Py_ssize_t nsym, nused;
    int64_t nbits;
} plan_t;

static int plan(const uint8_t *data, Py_ssize_t n, plan_t *p)
{
    p->data = data;
    p->n = n;
    p->freq = calloc(SLOTS, sizeof *p->freq);
    p->used = malloc(3 * (size_t)ALPHABET * sizeof *p->used);
    if (p->freq == NULL || p->used == NULL)
        return 0;
    p->nsym = rle_scan(data, n, p->freq);
    p->nused = 0;
    for (Py_ssize_t s = 0; s < ALPHABET; s++)
        if (p->freq[s])
            p->used[p->nused++] = s;
    int64_t *fu = p->used + ALPHABET, *lens = fu + ALPHABET;
    for (Py_ssize_t k = 0; k < p->nused; k++)
        fu[k] = p->freq[p->used[k]];
    if (!ck_code_lengths(fu, p->nused, lens))
        return 0;
    p->nbits = 0;
    for (Py_ssize_t k = 0; k < p->nused; k++)
        p->nbits += fu[k] * lens[k];
    return 1;
}

static void plan_free(plan_t *p)
{
    free(p->freq);
    free(p->used);
}

/* Canonical codes of the plan and its bit stream into out; the bytes written, -1 when memory
   runs out. */
static Py_ssize_t write_plan(const plan_t *p, uint8_t *out)
{
    const int64_t *lens = p->used + 2 * (size_t)ALPHABET;
    int64_t *codes = malloc((size_t)(p->nused ? p->nused : 1) * sizeof *codes);
    uint32_t *codes_full = calloc(SLOTS, sizeof *codes_full);
    uint8_t *lens_full = calloc(SLOTS, 1);
    Py_ssize_t end = -1;
    if (codes != NULL && codes_full != NULL && lens_full != NULL
        && ck_canonical_codes(lens, p->nused, codes)) {
        for (Py_ssize_t k = 0; k < p->nused; k++) {
            codes_full[p->used[k]] = (uint32_t)codes[k];
            lens_full[p->used[k]] = (uint8_t)lens[k];
        }
        end = write_bits(p->data, p->n, codes_full, lens_full, out);
    }
    free(codes);
    free(codes_full);
    free(lens_full);
    return end;
}

/* A new 1-d numpy array of `n` items of `dtype`, its bytes copied from `src` unless NULL. */
static PyObject *new_array(Py_ssize_t n, const char *dtype, const void *src)
{
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL)
        return NULL;
    PyObject *arr = PyObject_CallMethod(numpy, "empty", "ns", n, dtype);
    Py_DECREF(numpy);
    if (arr == NULL || src == NULL)
        return arr;
    Py_buffer v;
    if (PyObject_GetBuffer(arr, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    memcpy(v.buf, src, v.len);
    PyBuffer_Release(&v);
    return arr;
}

/* The arrays and values encode_stream returns, from a plan ready to write (NULL: failed). */
static PyObject *encode_result(const plan_t *p, Py_ssize_t head, Py_ssize_t n)
{
    Py_ssize_t hlen = head + 3 * p->nused + 4, nbytes = (Py_ssize_t)((p->nbits + 7) / 8);
    int raw = hlen + nbytes >= head + n;
    PyObject *used = new_array(p->nused, "int64", p->used);
    PyObject *lens = new_array(p->nused, "int64", p->used + 2 * (size_t)ALPHABET);
    PyObject *out = new_array(raw ? 0 : hlen + nbytes + 8, "uint8", NULL);
    Py_ssize_t end = -1;
    if (used != NULL && lens != NULL && out != NULL && !raw) {
        Py_buffer v;
        if (PyObject_GetBuffer(out, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) == 0) {
            CK_BEGIN_NOGIL(p->n)
            end = write_plan(p, (uint8_t *)v.buf + hlen);
            CK_END_NOGIL
            PyBuffer_Release(&v);
            if (end < 0)
                PyErr_NoMemory();
            else
                end += hlen;
        }
    }
    PyObject *result = NULL;
    if (!PyErr_Occurred() && used != NULL && lens != NULL && out != NULL)
        result = Py_BuildValue("(OnnOO)", out, end, p->nsym, used, lens);
    Py_XDECREF(used);
    Py_XDECREF(lens);
    Py_XDECREF(out);
    return result;
}

static PyObject *ck_rle_encode_stream(PyObject *self, PyObject *args)
{
    PyObject *data_obj, *result = NULL;
    Py_ssize_t head;
    Py_buffer v;
    plan_t p = {0};
    int ok;
    if (!PyArg_ParseTuple(args, "On", &data_obj, &head))
        return NULL;
    if (head < 0 || head > PY_SSIZE_T_MAX / 4)
        return PyErr_Format(PyExc_ValueError, "encode_stream: head %zd is out of range", head);
    if (ck_buffer(data_obj, &v, 0, 1, "encode_stream data") < 0)
        return NULL;
    if (v.len == 0 || v.len > PY_SSIZE_T_MAX / 4)
        PyErr_Format(PyExc_ValueError, "encode_stream: %zd bytes (1 or more)", v.len);
    else {
        CK_BEGIN_NOGIL(v.len)
        ok = plan(v.buf, v.len, &p);
        CK_END_NOGIL
        if (!ok)
            PyErr_NoMemory();
        else
            result = encode_result(&p, head, v.len);  /* NULL after an error */
    }
    plan_free(&p);
    PyBuffer_Release(&v);
    return result;
}

/* ---- The whole payload in one call (rle_huffman.py's rle_huffman_encode, issue 28) ---- */

#define RH_VERSION 1
#define RH_CODED_HEAD (CK_RH_HEAD + 12)  /* + u64 nsym, u32 nused */
#define SAMPLE_BLOCKS 16                 /* rle_huffman.py's SAMPLE_BLOCKS, SAMPLE_BLOCK */
#define SAMPLE_BLOCK 1024

/* zlib's CRC-32 of a header (a few hundred bytes: bit by bit). */
static uint32_t crc32_ieee(const uint8_t *p, Py_ssize_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

/* rle_huffman.py's pays_to_code: whether a sample of data (SAMPLE_BLOCKS evenly spaced blocks
   of SAMPLE_BLOCK bytes) says coding saves at least min_saving: yes under four samples' size,
   or where runs are common in it (fewer than 7/8 of its bytes differ from the one before),
   else where the Huffman code of its histogram (BytePlanes' code lengths) takes at most
   1 - min_saving of its bytes -- the same float64 arithmetic, the same verdicts. */
int ck_rh_pays(const uint8_t *data, Py_ssize_t n, double min_saving)
{
    if (n < 4 * SAMPLE_BLOCKS * SAMPLE_BLOCK)
        return 1;
    Py_ssize_t step = (n - SAMPLE_BLOCK) / (SAMPLE_BLOCKS - 1);
    int64_t changes = 0, freq[256] = {0}, lens[256], bits = 0;
    for (int b = 0; b < SAMPLE_BLOCKS; b++) {
        const uint8_t *s = data + b * step;
        for (int j = 1; j < SAMPLE_BLOCK; j++)
            changes += s[j] != s[j - 1];
    }
    if ((double)changes < 7.0 / 8.0 * (double)(SAMPLE_BLOCKS * SAMPLE_BLOCK - SAMPLE_BLOCKS))
        return 1;
    for (int b = 0; b < SAMPLE_BLOCKS; b++)
        for (int j = 0; j < SAMPLE_BLOCK; j++)
            freq[data[b * step + j]]++;
    pl_code_lengths(freq, lens);
    for (int v = 0; v < 256; v++)
        bits += freq[v] * lens[v];
    return (double)bits / 8.0 / (double)(SAMPLE_BLOCKS * SAMPLE_BLOCK) <= 1.0 - min_saving;
}

Py_ssize_t ck_rh_raw(const uint8_t *data, Py_ssize_t n, uint8_t *out)
{
    out[0] = RH_VERSION;
    out[1] = 0;
    ck_store64(out + 2, (uint64_t)n);
    if (out + CK_RH_HEAD != data && n)
        memcpy(out + CK_RH_HEAD, data, (size_t)n);
    return CK_RH_HEAD + n;
}

Py_ssize_t ck_rh_encode(const uint8_t *data, Py_ssize_t n, uint8_t *out)
{
    plan_t p = {0};
    Py_ssize_t written = 0;
    if (n > 0) {
        if (!plan(data, n, &p))
            written = -1;
        else {
            Py_ssize_t hlen = RH_CODED_HEAD + 3 * p.nused + 4;
            if (hlen + (Py_ssize_t)((p.nbits + 7) / 8) < RH_CODED_HEAD + n) {
                Py_ssize_t end = write_plan(&p, out + hlen);
                if (end < 0)
                    written = -1;
                else {
                    const int64_t *lens = p.used + 2 * (size_t)ALPHABET;
                    out[0] = RH_VERSION;
                    out[1] = 1;
                    ck_store64(out + 2, (uint64_t)n);
                    ck_store64(out + CK_RH_HEAD, (uint64_t)p.nsym);
                    ck_store32(out + CK_RH_HEAD + 8, (uint32_t)p.nused);
                    for (Py_ssize_t k = 0; k < p.nused; k++) {
                        ck_store16(out + RH_CODED_HEAD + 2 * k, (uint16_t)p.used[k]);
                        out[RH_CODED_HEAD + 2 * p.nused + k] = (uint8_t)lens[k];
                    }
                    ck_store32(out + hlen - 4, crc32_ieee(out, hlen - 4));
                    written = hlen + end;
                }
            }
        }
    }
    plan_free(&p);
    return written ? written : ck_rh_raw(data, n, out);
}

/* encode_all(data, min_saving) -> bytes: ck_rh_encode of any contiguous buffer. */
static PyObject *ck_rle_encode_all(PyObject *self, PyObject *args)
{
    PyObject *data_obj, *res = NULL;
    double min_saving;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "Od", &data_obj, &min_saving))
        return NULL;
    if (!(min_saving >= 0.0 && min_saving < 1.0))
        return PyErr_Format(PyExc_ValueError, "min_saving must be in [0, 1), not %R",
                            PyTuple_GetItem(args, 1));
    if (ck_buffer(data_obj, &v, 0, CK_ANY, "encode_all data") < 0)
        return NULL;
    if (v.len > PY_SSIZE_T_MAX / 4)
        PyErr_Format(PyExc_ValueError, "encode_all: %zd bytes is too many", v.len);
    else if ((res = PyBytes_FromStringAndSize(NULL, CK_RH_ROOM(v.len))) != NULL) {
        Py_ssize_t end;
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(res);
        CK_BEGIN_NOGIL(v.len)
        if (min_saving > 0 && !ck_rh_pays(v.buf, v.len, min_saving))
            end = ck_rh_raw(v.buf, v.len, out);
        else
            end = ck_rh_encode(v.buf, v.len, out);
        CK_END_NOGIL
        if (end < 0) {
            Py_CLEAR(res);
            PyErr_NoMemory();
        } else
            _PyBytes_Resize(&res, end);  /* NULL and an exception if it fails */
    }
    PyBuffer_Release(&v);
    return res;
}

PyMethodDef ck_rle_huffman_methods[] = {
    {"rle_huffman_encode_stream", ck_rle_encode_stream, METH_VARARGS,
     "encode_stream(data, head) -> (out, end, nsym, used, lens): RLE + Huffman in one call."},
    {"rle_huffman_encode_all", ck_rle_encode_all, METH_VARARGS,
     "encode_all(data, min_saving) -> bytes: the whole RLEHuffman payload (the gate, the code "
     "or the raw layout) in one call."},
    {"rle_huffman_code_lengths", ck_rle_code_lengths, METH_VARARGS,
     "code_lengths(freq, lens): length-limited Huffman code lengths (int64 tables)."},
    {"rle_huffman_canonical_codes", ck_rle_canonical_codes, METH_VARARGS,
     "canonical_codes(lens, codes): canonical codes of the code lengths."},
    {"rle_huffman_decode_symbols", ck_rle_decode_symbols, METH_VARARGS,
     "decode_symbols(buf, nsym, n, lut, first, offset, count, sorted_syms, maxlen, out)"
     " -> bits consumed, or a negative error code."},
    {NULL, NULL, 0, NULL},
};
