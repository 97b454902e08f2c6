/* AVX-512 BF16 GEMM for BF16 weights and fp32 activations, tokens in
 * vector lanes: the prefill kernel of BF16 models on CPUs with VDPBF16PS.
 *
 * Why this beats widening the weights to fp32 (gemm_bc_avx512.c): the
 * widened copy cost a store and a reload per weight element, 11-35 % of a
 * BF16 prefill. VDPBF16PS multiplies bf16 pairs as they are stored, so each
 * weight pair is broadcast straight from the row and nothing is widened.
 *
 * Why the activations are split: rounding them to bf16 would lose 16 bits
 * of every input. Each x is instead hi + lo, hi = bf16(x) and lo =
 * bf16(x - hi) (x - hi is exact in fp32), so |x - hi - lo| <= 2^-18 |x|;
 * w * hi and w * lo are exact in fp32 (bf16 x bf16), and both are added to
 * fp32 accumulators. Two instructions per weight pair and 16 tokens: the
 * same count as fp32 FMA, without the widening. The only other departure
 * from fp32: VDPBF16PS takes bf16 subnormals (below 2^-126) as zero, which
 * touches only lo parts of inputs below about 2^-117.
 *
 * Every output element is one lane accumulating the pairs in order, so the
 * result does not depend on the thread count. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")
#include <immintrin.h>
#include <stdint.h>

#include "kernels/isa.h"
#include "kernels/lane_rem.h"
#include "kernels/lane_store.h"

#define INLINE static inline __attribute__((always_inline))

/* Remainder tokens (lane_rem.h) up to 9: two parts per input make the
 * lane kernel's padding as costly as the row reductions' overhead only
 * past that (kernel_bench: T = 24 gained, T = 28 lost). */
enum { REM_MAX = 9 };

/* hi[k / 2] and lo[k / 2]: x[0 .. K) as bf16 pairs, x = hi + lo. */
static void split_row(uint32_t *hi, uint32_t *lo, const float *x, int K) {
    for (int k = 0; k < K; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        const __m256bh h = _mm512_cvtneps_pbh(v);
        const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
        _mm256_storeu_si256((__m256i *)(hi + k / 2), (__m256i)h);
        _mm256_storeu_si256((__m256i *)(lo + k / 2), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf)));
    }
}

/* Lane part, TL = 16 * tv tokens: ap[i][0][t] = hi pair (x[t][2i],
 * x[t][2i+1]), ap[i][1][t] the lo pair (tokens past T zero). Then each
 * remainder token as a row: K / 2 hi pairs, K / 2 lo pairs. row: scratch
 * of K words (K % 16 == 0). */
void q3_avx512bf16_bf16_pack_act(uint32_t *ap, const float *x, size_t ldx, int T, int K, uint32_t *row) {
    int tv, rem;
    q3_split_tokens(T, REM_MAX, &tv, &rem);
    const int TL = 16 * tv, np = K / 2;
    for (int t = 0; t < TL; t++) {
        if (t < T) split_row(row, row + np, x + (size_t)t * ldx, K);
        for (int i = 0; i < np; i++) {
            ap[(size_t)i * 2 * TL + t] = t < T ? row[i] : 0;
            ap[(size_t)i * 2 * TL + TL + t] = t < T ? row[np + i] : 0;
        }
    }
    for (int j = 0; j < rem; j++) {
        uint32_t *dst = ap + (size_t)np * 2 * TL + (size_t)j * K;
        split_row(dst, dst + np, x + (size_t)(TL + j) * ldx, K);
    }
}

/* stage[r * ts + t] for r < ROWS, t < 16 * TB, from ROWS weight rows w32[r]
 * (bf16 pairs; rows past R repeat the last one). The hi and lo products go
 * to separate accumulators: summed into one, each accumulator is a chain of
 * two dependent instructions per pair, which measured up to 2x slower with
 * two or three token vectors. Meanwhile the next rows, nbytes at `next`, are
 * prefetched one line every `every` pairs: the hardware prefetcher stops at
 * page edges, and a row is a page or so. */
INLINE void tile(float *stage, int ts, const uint32_t *ap, int np, const uint32_t *const *w32, const int ROWS,
                 const int TB, const char *next, size_t nbytes) {
    const int TP = 16 * TB;
    const size_t lines = (nbytes + 63) / 64;
    const int every = lines ? ((size_t)np / lines > 0 ? (int)((size_t)np / lines) : 1) : np + 1;
    __m512 hacc[8][3], lacc[8][3];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) hacc[r][tb] = lacc[r][tb] = _mm512_setzero_ps();
    size_t line = 0;
    int countdown = 1;
    for (int i = 0; i < np; i++) {
        if (--countdown == 0) {
            countdown = every;
            if (line < lines) _mm_prefetch(next + line++ * 64, _MM_HINT_T0);
        }
        const uint32_t *a = ap + (size_t)i * 2 * TP;
        __m512bh h[3], l[3];
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) {
            h[tb] = (__m512bh)_mm512_loadu_si512(a + 16 * tb);
            l[tb] = (__m512bh)_mm512_loadu_si512(a + TP + 16 * tb);
        }
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)w32[r][i]);
#pragma GCC unroll 3
            for (int tb = 0; tb < TB; tb++) {
                hacc[r][tb] = _mm512_dpbf16_ps(hacc[r][tb], w, h[tb]);
                lacc[r][tb] = _mm512_dpbf16_ps(lacc[r][tb], w, l[tb]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) _mm512_storeu_ps(stage + (size_t)r * ts + 16 * tb, _mm512_add_ps(hacc[r][tb], lacc[r][tb]));
}

/* Rows per tile: 8 with at most one token vector, 4 with two or three (the
 * accumulators, 2 * ROWS * TB, must leave registers for the inputs). */
INLINE void gemm_tb(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, const int TB,
                    int rem) {
    const int ROWS = TB <= 1 ? 8 : 4, np = W->cols / 2, ts = 16 * TB + rem;
    const size_t rs = W->rs ? W->rs : (size_t)W->cols; /* elements; even, as the caller checks */
    const uint32_t *base = W->data, *xr = ap + (size_t)np * 2 * 16 * TB;
    float stage[Q3_STAGE_ROWS * 48] __attribute__((aligned(64)));
    for (int rg = r0; rg < r1; rg += ROWS) {
        const int R = r1 - rg < ROWS ? r1 - rg : ROWS, at = (rg - r0) % Q3_STAGE_ROWS;
        const uint32_t *w32[8];
        for (int r = 0; r < ROWS; r++) w32[r] = base + (size_t)(rg + (r < R ? r : R - 1)) * (rs / 2);
        const int nrows = W->rows - (rg + ROWS) < ROWS ? W->rows - (rg + ROWS) : ROWS;
        const char *next = (const char *)(base + (size_t)(rg + ROWS) * (rs / 2));
        const size_t nbytes = nrows > 0 ? ((size_t)(nrows - 1) * rs + (size_t)W->cols) * 2 : 0;
        float *st = stage + (size_t)at * ts;
        if (TB) tile(st, ts, ap, np, w32, ROWS, TB, next, nbytes);
        else _mm_prefetch(next, _MM_HINT_T0);
        for (int r = 0; r < ROWS; r += 4) q3_rem_dots(st + (size_t)r * ts + 16 * TB, ts, xr, rem, np, w32 + r, 2);
        if (at + ROWS == Q3_STAGE_ROWS || rg + ROWS >= r1) /* a full stage, or the last rows */
            q3_lane_store(out + (rg - r0 - at), ldo, stage, ts, T, at + R);
    }
}

void q3_avx512bf16_gemm_bf16(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1) {
    int tv, rem;
    q3_split_tokens(T, REM_MAX, &tv, &rem);
    if (tv == 0) gemm_tb(out, ldo, ap, T, W, r0, r1, 0, rem);
    else if (tv == 1) gemm_tb(out, ldo, ap, T, W, r0, r1, 1, rem);
    else if (tv == 2) gemm_tb(out, ldo, ap, T, W, r0, r1, 2, rem);
    else gemm_tb(out, ldo, ap, T, W, r0, r1, 3, rem);
}
#pragma GCC pop_options
