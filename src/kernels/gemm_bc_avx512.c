/* AVX-512 weights-broadcast GEMM for BF16, F16, F32 and MX weights (MX
 * rows widened by the MX GEMVs' decoders) and fp32 activations: the prefill
 * kernel for up to 128 tokens per weight matrix (each MoE expert sees
 * about T * top_k / num_experts; longer products run as passes).
 *
 * Why this shape: the classic panel GEMM transposes every weight panel
 * into a packed buffer, a cost paid per weight element that only pays off
 * over many tokens. Here the tokens sit in vector lanes instead (their
 * activations packed once per thread and pass as ap[K][16 * vectors]),
 * and each weight row is only widened to fp32 in its stored order; the
 * inner loop broadcasts one weight and does one FMA per token vector for
 * each of 8 rows. A few tokens past whole vectors take a reduction in the
 * lanes instead (rem_dot). Every output element is one lane, or one
 * reduction, accumulating over k in order, so the result does not depend
 * on the thread count. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/lane_rem.h"
#include "kernels/lane_store.h"
#include "kernels/scratch.h"
#include "quant/bf16p.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))

/* Remainder tokens (lane_rem.h's split): past whole vectors of 16 tokens,
 * up to REM_MAX tokens are computed with the reduction in the lanes (rem_dot),
 * against the same widened rows, instead of one more vector of lanes
 * mostly padding (an expert of 17 tokens wasted 47 % of its lanes). Past 6
 * a padded vector is faster. kernel_bench 768 2048 T on the Intel Xeon of
 * BENCHMARKS.md, GFLOP/s: T = 17 139.8 -> 160.8, 18 121 -> 168, 19 156 ->
 * 174, but 24 (8 left) 196 -> 141; moe-prefill gate+up 223 -> 229, down
 * 214 -> 226. */
enum { REM_MAX = 6 };

/* Widened weight rows and remainder token rows are K + PAD floats apart:
 * rows K floats apart (a multiple of 4 KiB for hidden-sized K) share L1
 * sets, and a step reads one line of each. */
enum { PAD = 16 };

/* Columns widened at a time (MX rows: see q3_avx512_gemm_bc): for one
 * chunk of tokens, 8 rows of 128 floats (4 KiB), so that they and the chunk's block of the
 * token panel (128 x 32 floats for 32 tokens) fit L1 together. With 512
 * (a 64 KiB block) the widening took 20 % of the kernel's samples, with
 * 128 13 %: kernel_bench 1536 2048 32 264 -> 276 GFLOP/s, moe-prefill
 * gate+up 237 -> 245 (Intel Xeon of BENCHMARKS.md). Several chunks reuse
 * each widened row, and there 512 stays a little faster (q30b8 BF16
 * prefill 4096, two pairs: matmuls 69.8 / 70.1 % of the peak against 69.3
 * / 69.0 with 128). */
enum { BLOCK = 128, BLOCK_CHUNKS = 512 };

/* Tokens per chunk: a product of up to Q3_BC_TOKENS_MAX tokens runs as
 * chunks of 3 token vectors (the tile's most) against each group of
 * widened rows, so those rows are read and widened once for all of them.
 * (As separate passes of 48 tokens, an expert of 65-128 tokens re-read
 * its weights from DRAM each pass, and a 512-token attention projection
 * widened every row 11 times.) */
enum { CHUNK = 48 };

/* The chunk size for T tokens: at most CHUNK, a multiple of 16, and the
 * chunks as even as that allows (64 tokens as 32 + 32: a lone vector of 16
 * runs the tile below its rate). */
static int chunk_of(int T) {
    const int n = (T + CHUNK - 1) / CHUNK;
    return ((T + n - 1) / n + 15) / 16 * 16;
}

/* Pairs: a product can also run as chunks of up to 3 vectors of 8 tokens,
 * each lane for one of two consecutive k (lane 2 t + j of vector v: token
 * 8 v + t, k = 2 kp + j), against the rows' weights broadcast two at a
 * time; the two halves of each token's sum are added at the end. That pads
 * to 8 tokens instead of 16 and needs no remainder reductions.
 * k_group() picks the layout with fewer lanes to compute, counting a
 * remainder token as 4 lanes and the 16-row tile of a lone vector (16
 * rows x 1 vector) 1.25x its lanes (each ran below the tiles' rate).
 * kernel_bench 768 2048 T, one thread, best of five, GFLOP/s (16 lanes ->
 * pairs): T = 12 108 -> 130, 16 141 ->
 * 172, 17 126 -> 134, 20 123 -> 154, 24 142 -> 199, 36 173 -> 183, 40 167
 * -> 202, 56 170 -> 185, 72 174 -> 198; the 16-lane layout kept: T = 25
 * 149 / 142, 32 197 / 186, 33 177 / 166, 41 179 / 170, 64 199 / 186, 80
 * 204 / 196. T = 9-11 (two pair vectors against the 16-row tile of one
 * 16-token vector), kernel_bench 768 / 1536 / 2048 rows, one thread: 9
 * 80 -> 96, 10 88 -> 107, 11 97 -> 118; below 9 gemm_small is faster
 * (one pair vector: T = 5-7 64-71 against 104-122, 8 100 against 109),
 * so plain weights never take the 16-row tile now (7 and 8 tokens take
 * quads, below), MX weights below 7 tokens still do (in the model, prefill
 * 128 and 512 with pairs from 9 against 12 tokens: experts within 1 %).
 * q30b8 BF16 prefill 512, both rules in one process, eight alternating
 * rounds: experts 1.1 % (median) faster than with pairs for T = 20-24
 * only, 2.6 % than with no pairs.
 * Each grouped chunk keeps its sums in its own part of the row group's pst. */
enum { PAIR_MIN = 9, GROUP_V = 3 };

/* Quads: the same with 4 k per token and 4 tokens per vector (lane 4 t + j
 * of vector v: token 4 v + t, k = 4 kq + j), against the rows' weights
 * broadcast four at a time, so a product pads to 4 tokens instead of 8 or
 * 16 (an expert of 9 tokens computed 16 lanes per row as pairs, now 12).
 * Their tiles run below the others' rate, so they only pay for 7-12
 * tokens (k_group).
 * Grouped layouts (pairs and quads) split a product into chunks of at most
 * 3 vectors, never leaving one vector alone where 2 + 2 will do (a tile of
 * one vector, 8 accumulators, waits on the FMA latency). */

/* Fewest tokens for quads: 7 and 8 as two vectors, where one vector of 16
 * wasted half its lanes (isa_avx512.c's bc_min_t: fewer go to gemm_small). */
enum { QUAD_MIN = 7 };

/* Vectors of 16 / kg tokens for tc tokens, grouped kg k to a token. */
static inline int group_vectors(int tc, int kg) { return (tc + 16 / kg - 1) / (16 / kg); }

/* Tokens of the chunk that starts with `left` tokens still to go. */
static inline int group_chunk(int left, int kg) {
    const int v = group_vectors(left, kg), take = v == 4 ? 2 : v < GROUP_V ? v : GROUP_V;
    return left < take * (16 / kg) ? left : take * (16 / kg);
}

/* Tokens of the next chunk, `left` still to go: chunks of cs tokens (16-token
 * vectors, kg 1), or as group_chunk says. */
static inline int next_chunk(int left, int kg, int cs) { return kg > 1 ? group_chunk(left, kg) : left < cs ? left : cs; }

/* Most chunks of a grouped product (quads: 128 tokens in chunks of 12). */
enum { GROUP_CHUNKS_MAX = Q3_BC_TOKENS_MAX / 12 + 2 };

/* The lanes each layout computes for T tokens, as k_group() weighs them. */
static int lanes_16(int T) {
    const int cs = chunk_of(T);
    int lanes = 0;
    for (int t0 = 0; t0 < T; t0 += cs) {
        int tv, rem;
        q3_split_tokens(T - t0 < cs ? T - t0 : cs, REM_MAX, &tv, &rem);
        lanes += 16 * tv + 4 * rem;
    }
    return T <= cs && lanes < 32 ? lanes * 5 / 4 : lanes;
}

static int lanes_grouped(int T, int kg) { return group_vectors(T, kg) * (16 / kg); }

/* k per token in a lane group for T tokens: 1 (16-token vectors), 2
 * (pairs) or 4 (quads), whichever computes the fewest lanes (ties go to
 * the fewer final reductions), quads' counted 5/4 times: their tiles run
 * below the others' rate (a broadcast of 4 floats is a shuffle; more,
 * shorter chunks), so they only pay where the others pad most. The
 * model's gate and up products of 16 experts (768 x 2048, from DRAM), 2
 * threads, the three layouts alternating in one process, GFLOP/s (16,
 * pairs, quads): T = 9 138 / 149 / 185, 12 183 / 195 / 238, 13 198 / 214 /
 * 169, 17 216 / 222 / 210, 20 211 / 263 / 247, 28 281 / 257 / 261, 36 278
 * / 291 / 290, 44 323 / 312 / 292. */
static int k_group(int T) {
    if (T < PAIR_MIN) return T >= QUAD_MIN ? 4 : 1;
    const int l1 = lanes_16(T), l2 = lanes_grouped(T, 2), l4 = lanes_grouped(T, 4) * 5 / 4;
    return l1 <= l2 && l1 <= l4 ? 1 : l2 <= l4 ? 2 : 4;
}

/* The lanes of the MX decoders that widen rows of dtype wt and K columns:
 * AVX-512's (gemv_mx_avx512.c, 4) where the CPU has AVX512BW and K fits
 * them, else AVX2's (2). 1.3x per element from cache. */
static int mx_lanes(q3_dtype wt, int K) {
    return __builtin_cpu_supports("avx512bw") && q3_mx_wide_fits(wt, K) ? 4 : 2;
}

/* For MXFP8 / MXFP4 weights (wt), whose rows widen in the MX GEMV
 * decoders' element order, the token rows permuted to that order
 * (q3_mx_prep_lanes, exact); other weights: x as it is. */
static const float *mx_permuted(const float *x, size_t *ldx, int T, int K, q3_dtype wt) {
    if (!q3_dtype_is_mxfp(wt)) return x;
    float *perm = q3_scratch(Q3_SCR_BC_PERM, (size_t)CHUNK * Q3_LANE_KMAX * sizeof(float)); /* CHUNK permuted rows */
    for (int t = 0; t < T; t++) q3_mx_prep_lanes(perm + (size_t)t * K, x + (size_t)t * *ldx, K, wt, mx_lanes(wt, K));
    *ldx = (size_t)K;
    return perm;
}

/* 16 x 16 floats, r[i] = row i -> r[j] = column j: pairs of rows
 * interleaved, then pairs of those as doubles (column 4 l + e of rows 4 g
 * .. 4 g + 3 in 128-bit lane l of vector 4 g + e), then the lanes of the
 * four groups gathered by two rounds of 128-bit shuffles. 64 shuffles per
 * 256 floats, against a gather (16 lines, one float each) per 16. */
INLINE void transpose16(__m512 r[16]) {
    __m512 s[16];
    for (int i = 0; i < 16; i += 2) s[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), s[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int g = 0; g < 16; g += 4) {
        const __m512d a = _mm512_castps_pd(s[g]), b = _mm512_castps_pd(s[g + 1]), c = _mm512_castps_pd(s[g + 2]),
                      d = _mm512_castps_pd(s[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c)), r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d)), r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int e = 0; e < 4; e++) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88), v0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xDD);
        const __m512 u1 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88), v1 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xDD);
        s[e] = _mm512_shuffle_f32x4(u0, u1, 0x88), s[8 + e] = _mm512_shuffle_f32x4(u0, u1, 0xDD);
        s[4 + e] = _mm512_shuffle_f32x4(v0, v1, 0x88), s[12 + e] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = s[i];
}

/* 8 x 8 doubles (float pairs), r[i] = row i -> r[j] = column j. */
INLINE void transpose8x2(__m512 r[8]) {
    __m512d t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        const __m512d a = _mm512_castps_pd(r[i]), b = _mm512_castps_pd(r[i + 1]);
        t[i] = _mm512_unpacklo_pd(a, b), t[i + 1] = _mm512_unpackhi_pd(a, b);
    }
    /* u[4 h + j]: columns j and j + 4 (j: 0, 2 from t[.], 1, 3 from t[. + 1]) of rows 4 h .. 4 h + 3 */
    for (int h = 0; h < 2; h++)
        for (int o = 0; o < 2; o++) {
            u[4 * h + 2 * o] = _mm512_shuffle_f64x2(t[4 * h + o], t[4 * h + 2 + o], 0x88);
            u[4 * h + 2 * o + 1] = _mm512_shuffle_f64x2(t[4 * h + o], t[4 * h + 2 + o], 0xDD);
        }
    /* u[0]: columns 0, 4; u[1]: 2, 6; u[2]: 1, 5; u[3]: 3, 7 */
    static const int col[4] = {0, 2, 1, 3};
    for (int i = 0; i < 4; i++) {
        r[col[i]] = _mm512_castpd_ps(_mm512_shuffle_f64x2(u[i], u[4 + i], 0x88));
        r[col[i] + 4] = _mm512_castpd_ps(_mm512_shuffle_f64x2(u[i], u[4 + i], 0xDD));
    }
}

/* Floats ahead on each token row that the packers prefetch: the rows
 * (an expert's gathered inputs, 32 MiB for a layer of a 512-token
 * prefill) come from L3 or DRAM, 8 or 16 streams at a time. Share of a
 * 512-token q30b8 BF16 prefill's samples (perf, 2 threads): gathers 3.2 %,
 * transposes 2.8 %, with this prefetch 2.0 % (512 floats ahead: 2.4 %).
 * With AP_AHEAD's change, against the gathers (`build/gemm_ab gemm-ab 512
 * SKEW 12` after `make gemm-ab AB_REV=806aad1`, ratios of medians, four
 * runs): 0.95-0.99. */
enum { PACK_AHEAD = 128 };

/* r[i] = 16 floats of row i at base (rows ldx floats apart) for i < n,
 * zero for n <= i < rows; each row prefetched PACK_AHEAD floats on. */
INLINE void load_rows(__m512 *r, const float *base, size_t ldx, int n, const int rows) {
    for (int i = 0; i < rows; i++) {
        if (i < n) _mm_prefetch((const char *)(base + (size_t)i * ldx + PACK_AHEAD), _MM_HINT_T0);
        r[i] = i < n ? _mm512_loadu_ps(base + (size_t)i * ldx) : _mm512_setzero_ps();
    }
}

/* One chunk of T <= CHUNK tokens at ap: the lane panel ap[k][t] = x[t][k]
 * for t < 16 * tv, 16 x 16 blocks transposed in registers (lanes past T
 * are zero), then the rem remainder tokens as rows of K floats, K + PAD
 * apart. */
static void pack_chunk(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt) {
    x = mx_permuted(x, &ldx, T, K, wt);
    int tv, rem;
    q3_split_tokens(T, REM_MAX, &tv, &rem);
    const int TP = 16 * tv;
    for (int j = 0; j < rem; j++) memcpy(ap + (size_t)K * TP + (size_t)j * (K + PAD), x + (size_t)(TP + j) * ldx, (size_t)K * sizeof *ap);
    for (int t0 = 0; t0 < TP; t0 += 16) {
        const int n = T - t0 < 16 ? T - t0 : 16; /* rows past T are zero lanes */
        for (int k = 0; k < K; k += 16) {
            __m512 r[16];
            load_rows(r, x + (size_t)t0 * ldx + k, ldx, n, 16);
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(ap + (size_t)(k + i) * TP + t0, r[i]);
        }
    }
}

/* 4 x 4 blocks of 4 floats, r[i] = row i -> r[j] = block column j. */
INLINE void transpose4x4(__m512 r[4]) {
    const __m512 t0 = _mm512_shuffle_f32x4(r[0], r[1], 0x44), t1 = _mm512_shuffle_f32x4(r[0], r[1], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(r[2], r[3], 0x44), t3 = _mm512_shuffle_f32x4(r[2], r[3], 0xEE);
    r[0] = _mm512_shuffle_f32x4(t0, t2, 0x88), r[1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
    r[2] = _mm512_shuffle_f32x4(t1, t3, 0x88), r[3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
}

/* The grouped panel of one chunk of T tokens: ap[kq][16 v + kg t + j] =
 * x[(16 / kg) v + t][kg kq + j] for v < group_vectors(T, kg) (zero past
 * T): the groups of 16 / kg token rows transposed as doubles (pairs) or
 * as blocks of 4 floats (quads). */
static void pack_groups(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt, int kg) {
    x = mx_permuted(x, &ldx, T, K, wt);
    const int NV = group_vectors(T, kg), TP = 16 * NV, per = 16 / kg;
    for (int v = 0; v < NV; v++) {
        const int n = T - per * v >= per ? per : T - per * v; /* tokens in this vector */
        const float *base = x + (size_t)(per * v) * ldx;
        for (int kq = 0; kq < K / kg; kq += per) {
            __m512 r[8];
            if (kg == 2) {
                load_rows(r, base + 2 * kq, ldx, n, 8);
                transpose8x2(r);
            } else {
                load_rows(r, base + 4 * kq, ldx, n, 4);
                transpose4x4(r);
            }
            for (int i = 0; i < per; i++) _mm512_storeu_ps(ap + (size_t)(kq + i) * TP + 16 * v, r[i]);
        }
    }
}

/* Chunks of chunk_of(T) tokens, the one from token t0 at ap + t0 * K: at
 * most T * K + REM_MAX * PAD floats in all, or (T rounded up to 16) * K
 * where the last chunk pads a vector; grouped products as group_chunk
 * says (pack_groups), (T rounded up to 16 / kg) * K floats. */
void q3_avx512_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt) {
    const int kg = k_group(T), cs = chunk_of(T);
    for (int t0 = 0, tc; t0 < T; t0 += tc) {
        tc = next_chunk(T - t0, kg, cs);
        if (kg > 1) pack_groups(ap + (size_t)t0 * K, x + (size_t)t0 * ldx, ldx, tc, K, wt, kg);
        else pack_chunk(ap + (size_t)t0 * K, x + (size_t)t0 * ldx, ldx, tc, K, wt);
    }
}

/* Row r of W widened to fp32 (contiguous rows, K % 16 == 0; MX rows: K %
 * 64 == 0, MXFP8 / MXFP4 in q3_mx_prep_lanes' element order for
 * mx_lanes, MXINT8 in stored order, block scales applied). */
INLINE void widen_row(float *dst, const q3_mat *W, int r, int k0, int n) {
    const int K = W->cols;
    const size_t rs = W->rs ? W->rs : (size_t)K;
    if (q3_dtype_is_mxfp(W->dtype)) {
        if (mx_lanes(W->dtype, K) == 4) q3_avx512_mx_row_slots(W, r, k0, n, dst);
        else q3_avx2_mx_row_slots(W, r, dst); /* whole rows only (its order spans them) */
        return;
    }
    if (q3_dtype_is_mx(W->dtype)) { /* MXINT8: k0, n multiples of 32 */
        q3_avx2_row_f32(W, r, k0, n, dst);
        return;
    }
    if (W->dtype == Q3_F32) {
        memcpy(dst, (const float *)W->data + (size_t)r * rs + k0, (size_t)n * sizeof(float));
        return;
    }
    if (W->dtype == Q3_BF16P) { /* k0, n multiples of 64 (blocks of 128 or 512 columns) */
        q3_bf16p_row_f32(W, r, k0, n, dst);
        return;
    }
    /* (the dtype tested once: the stores could alias *W, so GCC reloaded it every 16 elements) */
    const uint16_t *src = (const uint16_t *)W->data + (size_t)r * rs + k0;
    if (W->dtype == Q3_F16)
        for (int k = 0; k < n; k += 16) _mm512_storeu_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + k))));
    else
        for (int k = 0; k < n; k += 16) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(src + k));
            _mm512_storeu_ps(dst + k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
        }
}

/* Rows per tile: 8, and 16 where a product is one ungrouped token vector
 * (since quads start at 7 tokens: MX products of up to 6 tokens that no
 * tokens GEMV takes): 8 accumulators, one FMA each per k, left the FMA
 * latency exposed. (16 rows measured 30 % slower with 512-column blocks, whose
 * widened rows then overflowed L1.) kernel_bench 1536 2048 T: T = 8 106 ->
 * 119, 16 205 -> 243, 19 202 -> 230 GFLOP/s; q30b8 BF16 prefill 512, three
 * pairs: experts 224-226 -> 226-233 GFLOP/s. */
enum { ROWS = 8 };

/* Steps of k by which the tile prefetches its token panel ahead: the
 * panel streams from L2 (256 KB for 32 tokens of K = 2048) and each step
 * takes a line per token vector. kernel_bench 256 2048 T, one thread,
 * GFLOP/s (Intel Xeon): T = 32 145.7 -> 149.5, 48 156 -> 164, 24 110 ->
 * 113 with 8 steps. On the AMD EPYC (Zen 5) 2 steps: `build/gemm_ab`
 * (the expert products of a 512-token prefill, one thread, both builds
 * alternating in one process) ran 8 steps 1.05-1.07x as long with skew 2
 * and 1.01-1.02x with skew 1 (ratios of medians of 12, three runs each). */
enum { AP_AHEAD = 2 };

/* The next rows' weights, prefetched one line every `every` steps of the
 * loops that use the current rows: rows are a page or so each, so the
 * hardware prefetcher, which stops at page boundaries, would leave every
 * row's first lines to miss in DRAM. */
typedef struct {
    const char *p;
    size_t left; /* lines */
    int every, countdown;
} next_rows;

static inline next_rows next_rows_of(const char *p, size_t nbytes, int steps) {
    const size_t lines = (nbytes + 63) / 64;
    const int every = lines ? ((size_t)steps / lines > 0 ? (int)((size_t)steps / lines) : 1) : steps + 1;
    return (next_rows){p, lines, every, 1};
}

/* A counter, not a modulo: a division per step cost more than its FMAs. */
INLINE void next_rows_step(next_rows *nx) {
    if (--nx->countdown == 0) {
        nx->countdown = nx->every;
        if (nx->left) _mm_prefetch(nx->p, _MM_HINT_T0), nx->p += 64, nx->left--;
    }
}

/* The widening of the next block of BF16 rows, done 16 columns a step
 * inside the current block's tile: as a pass of its own between tiles
 * (load, widen, store, with no FMA to hide behind), it took 12 % of the
 * kernel's samples in a 512-token prefill. With the tile's k loop taken
 * two steps at a time (one widening step per pair, the panel walked by
 * pointer), kernel_bench 256 2048 T, one thread, GFLOP/s: T = 32 136 ->
 * 145, 40 127 -> 137, 24 103 -> 110. */
typedef struct {
    const uint16_t *row[2 * 8]; /* source rows at the block's first column */
    const uint16_t *src;        /* the next step's 16 elements, */
    float *dst;                 /* and where they go */
    int ws, n, rows;            /* rows of n columns, ws floats apart at dst */
    int r, c;                   /* the next step's row and column; r == rows: done */
} widen_job;

static inline widen_job widen_job_of(float *dst, int ws, int n, int rows) {
    return (widen_job){.dst = dst, .ws = ws, .n = n, .rows = rows};
}

INLINE void widen_step(widen_job *wj) {
    if (wj->r >= wj->rows) return;
    if (wj->c == 0) wj->src = wj->row[wj->r];
    const __m256i h = _mm256_loadu_si256((const __m256i *)wj->src);
    _mm512_storeu_ps(wj->dst, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    wj->src += 16, wj->dst += 16;
    if ((wj->c += 16) == wj->n) wj->c = 0, wj->r++, wj->dst += wj->ws - wj->n;
}

/* One panel row (KG k of TB token vectors at apk) against the NR widened
 * rows' columns kk .. kk + KG - 1 at wb[r * ws ..]. */
INLINE void tile_row(__m512 acc[][3], const float *apk, const float *wb, int ws, int kk, const int NR, const int TB,
                     const int KG) {
    const int TP = 16 * TB;
    __m512 a[3];
#pragma GCC unroll 3
    for (int tb = 0; tb < TB; tb++) _mm_prefetch((const char *)(apk + AP_AHEAD * TP + 16 * tb), _MM_HINT_T0);
#pragma GCC unroll 3
    for (int tb = 0; tb < TB; tb++) a[tb] = _mm512_loadu_ps(apk + 16 * tb);
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) {
        const float *wr = wb + (size_t)r * ws + kk;
        double w2; /* the pair (a load that broadcasts: from a register, each took a shuffle uop) */
        if (KG == 2) memcpy(&w2, wr, sizeof w2);
        const __m512 w = KG == 4   ? _mm512_broadcast_f32x4(_mm_loadu_ps(wr))
                         : KG == 2 ? _mm512_castpd_ps(_mm512_set1_pd(w2))
                                   : _mm512_set1_ps(*wr);
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) acc[r][tb] = _mm512_fmadd_ps(w, a[tb], acc[r][tb]);
    }
}

/* stage[r * ts + t] for r < NR, t < 16 * TB: columns k0 .. k0 + kc of
 * the products, from the NR widened rows' columns at wb[r * ws ..], added
 * to the stage's sums of the columns before k0. Grouped layouts (KG k to a
 * token): a panel row per KG k. */
INLINE void tile(float *stage, int ts, const float *ap, int k0, int kc, const float *wb, int ws, const int NR, const int TB,
                 const int KG, next_rows *nx, widen_job *wj) {
    const int TP = 16 * TB;
    __m512 acc[2 * ROWS][3];
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) acc[r][tb] = k0 ? _mm512_loadu_ps(stage + (size_t)r * ts + 16 * tb) : _mm512_setzero_ps();
    const float *apk = ap + (size_t)(k0 / KG) * TP;
    /* kc % 4 == 0; a widening step per two k and 8 rows, 2 or 4 k at a time */
    for (int k = 0; k < kc; k += KG == 4 ? 4 : 2) {
        next_rows_step(nx);
#pragma GCC unroll 2
        for (int i = 0; i < NR / ROWS; i++) widen_step(wj);
        if (KG == 4) {
            next_rows_step(nx);
            widen_step(wj); /* (quads: 8 rows) */
        }
        tile_row(acc, apk, wb, ws, k, NR, TB, KG);
        apk += TP;
        if (KG == 1) {
            tile_row(acc, apk, wb, ws, k + 1, NR, TB, KG);
            apk += TP;
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) _mm512_storeu_ps(stage + (size_t)r * ts + 16 * tb, acc[r][tb]);
}

/* part[r * REM_MAX + j] for r < ROWS, j < NT (<= 3): the 16-lane partial
 * dot products of the ROWS widened rows (columns k0 .. k0 + kc at
 * wb[r * ws ..]) with NT token rows xr[j * (K + PAD) ..], added to those
 * of the columns before k0; 16 k per step (24 accumulators; each token
 * vector loaded once for 8 rows, as in the tile). */
INLINE void rem_dot(__m512 *part, const float *wb, int ws, const float *xr, int K, int k0, int kc, const int NT,
                    next_rows *nxp) {
    next_rows nx = *nxp;
    __m512 acc[ROWS][3];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) acc[r][j] = k0 ? part[r * REM_MAX + j] : _mm512_setzero_ps();
    for (int k = 0; k < kc; k += 16) {
        next_rows_step(&nx);
        __m512 x[3];
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) x[j] = _mm512_loadu_ps(xr + (size_t)j * (K + PAD) + k0 + k);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            __m512 w = _mm512_loadu_ps(wb + (size_t)r * ws + k);
            /* One load per row into a register: GCC otherwise folds it into
             * each of the NT FMAs, and those indexed memory operands ran
             * the remainder at 2/3 of this rate (T = 12: 86 -> 123 GFLOP/s). */
            __asm__("" : "+v"(w));
#pragma GCC unroll 3
            for (int j = 0; j < NT; j++) acc[r][j] = _mm512_fmadd_ps(w, x[j], acc[r][j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) part[r * REM_MAX + j] = acc[r][j];
    *nxp = nx;
}

/* All rem token rows against the ROWS widened rows' columns k0 .. k0 + kc. */
static void rem_dots(__m512 *part, const float *wb, int ws, const float *xr, int rem, int K, int k0, int kc, next_rows *nx) {
    for (int j = 0; j < rem; j += 3) {
        const float *xj = xr + (size_t)j * (K + PAD);
        if (rem - j >= 3) rem_dot(part + j, wb, ws, xj, K, k0, kc, 3, nx);
        else if (rem - j == 2) rem_dot(part + j, wb, ws, xj, K, k0, kc, 2, nx);
        else rem_dot(part + j, wb, ws, xj, K, k0, kc, 1, nx);
    }
}

/* stage[r * ts + p v + t] for r < ROWS, v < nv, t < p = 16 / kg: each
 * token's kg partial sums (lanes kg t .. kg t + kg - 1 of pst[r * 16
 * GROUP_V + 16 v]) added, pairs first. */
static void group_sums(float *stage, int ts, const float *pst, int nv, int kg) {
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < nv; v++) {
            const __m512 x = _mm512_loadu_ps(pst + (size_t)r * 16 * GROUP_V + 16 * v);
            __m512 s = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
            float *dst = stage + (size_t)r * ts + (16 / kg) * v;
            if (kg == 2) _mm256_storeu_ps(dst, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, s)));
            else {
                s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));
                _mm_storeu_ps(dst, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, s)));
            }
        }
}

/* A grouped chunk's tile (nv vectors of KG k to a token) into pst. */
INLINE void group_tile(float *pst, const float *apc, int k0, int kc, const float *wb, int ws, int nv, const int KG,
                       next_rows *nx, widen_job *wj) {
    if (nv == 3) tile(pst, 16 * GROUP_V, apc, k0, kc, wb, ws, ROWS, 3, KG, nx, wj);
    else if (nv == 2) tile(pst, 16 * GROUP_V, apc, k0, kc, wb, ws, ROWS, 2, KG, nx, wj);
    else tile(pst, 16 * GROUP_V, apc, k0, kc, wb, ws, ROWS, 1, KG, nx, wj);
}

/* One chunk (tc tokens, packed at apc) against the G widened rows' columns
 * k0 .. k0 + kc (G = 16 only for one token vector), into stage columns
 * from st; the remainder's partial sums wait in part (8 rows at a time) and
 * are reduced into the stage after the last columns. Grouped products (kg
 * k to a token, G = 8) keep their sums in pst until then. */
INLINE void chunk_rows(float *st, int ts, const float *apc, int tc, int K, int k0, int kc, const float *wb, int ws,
                       const int G, int kg, float *pst, __m512 *part, next_rows *nx, widen_job *wj) {
    if (G == ROWS && kg > 1) {
        const int nv = group_vectors(tc, kg);
        if (kg == 4) group_tile(pst, apc, k0, kc, wb, ws, nv, 4, nx, wj);
        else group_tile(pst, apc, k0, kc, wb, ws, nv, 2, nx, wj);
        if (k0 + kc == K) group_sums(st, ts, pst, nv, kg);
        return;
    }
    int tv, rem;
    q3_split_tokens(tc, REM_MAX, &tv, &rem);
    if (G == 2 * ROWS) tile(st, ts, apc, k0, kc, wb, ws, 2 * ROWS, 1, 1, nx, wj); /* only for tv == 1 */
    else if (tv == 1) tile(st, ts, apc, k0, kc, wb, ws, ROWS, 1, 1, nx, wj);
    else if (tv == 2) tile(st, ts, apc, k0, kc, wb, ws, ROWS, 2, 1, nx, wj);
    else if (tv == 3) tile(st, ts, apc, k0, kc, wb, ws, ROWS, 3, 1, nx, wj);
    if (!rem) return;
    for (int h = 0; h < G / ROWS; h++) {
        __m512 *ph = part + h * ROWS * REM_MAX;
        float *sh = st + (size_t)h * ROWS * ts;
        rem_dots(ph, wb + (size_t)h * ROWS * ws, ws, apc + (size_t)K * 16 * tv, rem, K, k0, kc, nx);
        if (k0 + kc == K)
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < rem; j++) sh[(size_t)r * ts + 16 * tv + j] = _mm512_reduce_add_ps(ph[r * REM_MAX + j]);
    }
}

/* A product's shape, as q3_avx512_gemm_bc works it out for row_groups. */
typedef struct {
    const float *ap;
    int T, K, cs, ts, KB, ws, block, whole; /* whole: rows widened whole, ws = K + PAD */
    int kg;                                 /* k_group(T) */
    size_t rs;
    int steps;
} bc_shape;

/* Rows r0 .. r1 in groups of G (a constant after inlining, as every loop
 * bound inside the tiles must be). */
INLINE void row_groups(float *out, size_t ldo, const q3_mat *W, int r0, int r1, float *wbuf, const bc_shape *sh, const int G) {
    const float *ap = sh->ap;
    const int T = sh->T, K = sh->K, cs = sh->cs, ts = sh->ts, KB = sh->KB, ws = sh->ws, block = sh->block, whole = sh->whole;
    const size_t rs = sh->rs;
    /* BF16 rows in blocks: each block widened during the previous one's
     * tiles (widen_job), into the other half of wbuf. */
    const int piped = W->dtype == Q3_BF16 && !whole;
    const size_t wrs = W->rs ? W->rs : (size_t)K;
    float *wb = wbuf, *wnext = wbuf + (size_t)G * ws;
    widen_job wj = {.rows = 0};
    float stage[Q3_STAGE_ROWS * Q3_BC_TOKENS_MAX] __attribute__((aligned(64)));
    for (int rg = r0; rg < r1; rg += G) {
        const int R = r1 - rg < G ? r1 - rg : G, at = (rg - r0) % Q3_STAGE_ROWS;
        const int nrows = W->rows - (rg + G) < G ? W->rows - (rg + G) : G;
        next_rows nx = next_rows_of((const char *)W->data + (size_t)(rg + G) * rs, nrows > 0 ? (size_t)nrows * rs : 0, sh->steps);
        float *st = stage + (size_t)at * ts;
        __m512 part[2 * ROWS * REM_MAX];
        float pst[GROUP_CHUNKS_MAX * ROWS * 16 * GROUP_V] __attribute__((aligned(64)));
        for (int k0 = 0; k0 < K; k0 += KB) {
            const int kc = K - k0 < KB ? K - k0 : KB;
            if (piped) {
                if (rg == r0 && k0 == 0) /* the first block: nothing to hide it behind */
                    for (int r = 0; r < G; r++) widen_row(wb + (size_t)r * ws, W, rg + (r < R ? r : R - 1), 0, kc);
                else {
                    while (wj.r < wj.rows) widen_step(&wj); /* what the previous block's tiles left */
                    float *t = wb;
                    wb = wnext, wnext = t;
                }
                /* the next block: this group's next columns, or the next group's first */
                const int nk0 = k0 + kc < K ? k0 + kc : 0, nrg = nk0 ? rg : rg + G;
                wj = widen_job_of(wnext, ws, K - nk0 < KB ? K - nk0 : KB, nrg < r1 ? G : 0);
                const int nR = r1 - nrg < G ? r1 - nrg : G;
                for (int r = 0; r < wj.rows; r++) wj.row[r] = (const uint16_t *)W->data + (size_t)(nrg + (r < nR ? r : nR - 1)) * wrs + nk0;
            } else if (!whole || k0 == 0)
                for (int r = 0; r < G; r++) /* rows past R repeat the last one; their results are dropped */
                    widen_row(wbuf + (size_t)r * ws, W, rg + (r < R ? r : R - 1), k0, kc);
            for (int t0 = 0, ci = 0, tc; t0 < T; t0 += tc, ci++) {
                tc = next_chunk(T - t0, sh->kg, cs);
                float *pc = pst + (size_t)ci * ROWS * 16 * GROUP_V;
                if (whole) chunk_rows(st + t0, ts, ap + (size_t)t0 * K, tc, K, k0, kc, wb, ws, G, sh->kg, pc, part, &nx, &wj);
                else if (block == BLOCK)
                    chunk_rows(st + t0, ts, ap + (size_t)t0 * K, tc, K, k0, kc, wb, BLOCK + PAD, G, sh->kg, pc, part, &nx, &wj);
                else
                    chunk_rows(st + t0, ts, ap + (size_t)t0 * K, tc, K, k0, kc, wb, BLOCK_CHUNKS + PAD, G, sh->kg, pc, part, &nx,
                               &wj);
            }
        }
        if (at + G == Q3_STAGE_ROWS || rg + G >= r1) /* a full stage, or the last rows */
            q3_lane_store(out + (rg - r0 - at), ldo, stage, ts, T, at + R);
    }
}

void q3_avx512_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf) {
    const int K = W->cols;
    /* bytes of a row's elements (MX: without its scales), for the next rows' prefetch */
    const size_t rs = q3_dtype_is_mx(W->dtype)    ? q3_mx_elem_bytes(W->dtype, (size_t)K)
                      : W->dtype == Q3_BF16P ? q3_bf16p_row_bytes((size_t)K)
                                             : (W->rs ? W->rs : (size_t)K) * (W->dtype == Q3_F32 ? 4 : 2);
    /* Stage row: each chunk's tokens (the last one's padded lanes too). */
    int tv, rem, ts;
    /* cs: the first chunk's tokens (grouped products: chunks as group_chunk says) */
    const int kg = k_group(T), cs = kg > 1 ? group_chunk(T, kg) : chunk_of(T), last = (T - 1) / cs * cs;
    q3_split_tokens(T - last, REM_MAX, &tv, &rem);
    ts = kg > 1 ? lanes_grouped(T, kg) : last + 16 * tv + rem;
    /* Steps of k over which the next rows are prefetched: the first chunk's tile, or its remainder's. */
    q3_split_tokens(T < cs ? T : cs, REM_MAX, &tv, &rem);
    const int steps = tv || kg > 1 ? K / 2 : (K / 16) * ((rem + 2) / 3);
    /* Rows widen a block of columns at a time, so the 8 rows' block stays
     * in L1 for every chunk. MX rows too (the 512-bit decoders' order is a
     * permutation within 64 or 128 columns), MXFP4 ones 512 columns at a
     * time (a call per 128 ran T = 24-32 6 % slower), except the rows only
     * AVX2's decoders take, whose order spans the row: those widen whole.
     * kernel_bench mx 1536 2048 20 T, GFLOP/s, whole rows -> blocks: MXFP8
     * T = 16 149 -> 196, 32 220 -> 235; MXFP4 T = 16 156 -> 187, 32 the
     * same. q30b8 prefill 512: W4A8 216.4 / 215.7 -> 220.6 / 221.7 tok/s,
     * W8A8 207.9 -> 218.9. */
    const int whole = q3_dtype_is_mxfp(W->dtype) && mx_lanes(W->dtype, K) != 4,
              block = T > cs || W->dtype == Q3_MXFP4 ? BLOCK_CHUNKS : BLOCK;
    const int KB = whole ? K : block, ws = whole ? K + PAD : block + PAD;
    /* Rows per group: 16 where the products are one unpaired token vector
     * (8 accumulators would wait on the FMA latency), else 8. */
    const bc_shape sh = {ap, T, K, cs, ts, KB, ws, block, whole, kg, rs, steps};
    if (kg == 1 && T <= cs && tv == 1) row_groups(out, ldo, W, r0, r1, wbuf, &sh, 2 * ROWS);
    else row_groups(out, ldo, W, r0, r1, wbuf, &sh, ROWS);
}
#pragma GCC pop_options
