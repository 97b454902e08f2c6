/* AVX-512 weights-broadcast GEMM for plain-dtype weights (BF16, F16, F32)
 * and fp32 activations: the prefill kernel for few to a few dozen tokens
 * per weight matrix (each MoE expert sees about T * top_k / num_experts).
 *
 * Why this shape: the classic panel GEMM transposes every weight panel
 * into a packed buffer, a cost paid per weight element that only pays off
 * over many tokens. Here the tokens sit in vector lanes instead (their
 * activations packed once per thread and pass as ap[K][TP], TP = T rounded
 * up to 16), and each weight row is only widened to fp32 in its stored
 * order; the inner loop broadcasts one weight and does TB = TP / 16 FMAs
 * for each of 8 rows. Every output element is one lane accumulating over k
 * in order, so the result does not depend on the thread count. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/lane_store.h"

#define INLINE static inline __attribute__((always_inline))

/* ap[k][t] = x[t][k]: one gather per 16 tokens and k (lanes past T are
 * zero). The scalar transposition took 6 % of prefill. */
void q3_avx512_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt) {
    (void)wt; /* plain dtypes only: stored order */
    const int TP = (T + 15) & ~15;
    if (ldx > (size_t)INT32_MAX / 16) { /* gather offsets are 32-bit */
        for (int k = 0; k < K; k++)
            for (int t = 0; t < TP; t++) ap[(size_t)k * TP + t] = t < T ? x[(size_t)t * ldx + k] : 0.0f;
        return;
    }
    for (int t0 = 0; t0 < TP; t0 += 16) {
        const __mmask16 m = T - t0 >= 16 ? 0xFFFF : (__mmask16)((1u << (T - t0)) - 1);
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)ldx));
        const float *base = x + (size_t)t0 * ldx;
        for (int k = 0; k < K; k++)
            _mm512_storeu_ps(ap + (size_t)k * TP + t0, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, base + k, 4));
    }
}

/* Row r of W widened to fp32 (contiguous rows, K % 16 == 0). */
static void widen_row(float *dst, const q3_mat *W, int r) {
    const int K = W->cols;
    const size_t rs = W->rs ? W->rs : (size_t)K;
    if (W->dtype == Q3_F32) {
        memcpy(dst, (const float *)W->data + (size_t)r * rs, (size_t)K * sizeof(float));
        return;
    }
    const uint16_t *src = (const uint16_t *)W->data + (size_t)r * rs;
    for (int k = 0; k < K; k += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(src + k));
        const __m512 v = W->dtype == Q3_F16 ? _mm512_cvtph_ps(h)
                                            : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm512_storeu_ps(dst + k, v);
    }
}

/* Rows per tile: 8 widened rows (8 * K floats) stay close to L1; 16 rows
 * for one token vector measured 30 % slower. */
enum { ROWS = 8 };

/* stage[r * 16 * TB + t] for r < ROWS, t < 16 * TB, from ROWS widened rows wb[r * K ..].
 * Meanwhile the next rows' weights, nbytes at `next`, are prefetched, one
 * line every `every` steps of k: rows are a page or so each, so the
 * hardware prefetcher, which stops at page boundaries, would leave every
 * row's first lines to miss in DRAM. */
INLINE void tile(float *stage, const float *ap, int K, const float *wb, const int TB, const char *next, size_t nbytes) {
    const size_t lines = (nbytes + 63) / 64;
    const int every = lines ? (int)((size_t)K / lines > 0 ? (size_t)K / lines : 1) : K + 1;
    const int TP = 16 * TB;
    __m512 acc[ROWS][3];
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) acc[r][tb] = _mm512_setzero_ps();
    size_t line = 0;
    int countdown = 1;
    for (int k = 0; k < K; k++) {
        if (--countdown == 0) { /* a counter, not k % every: a division per step cost more than its FMAs */
            countdown = every;
            if (line < lines) _mm_prefetch(next + line++ * 64, _MM_HINT_T0);
        }
        __m512 a[3];
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) a[tb] = _mm512_loadu_ps(ap + (size_t)k * TP + 16 * tb);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            const __m512 w = _mm512_set1_ps(wb[(size_t)r * K + k]);
#pragma GCC unroll 3
            for (int tb = 0; tb < TB; tb++) acc[r][tb] = _mm512_fmadd_ps(w, a[tb], acc[r][tb]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < TB; tb++) _mm512_storeu_ps(stage + (size_t)r * TP + 16 * tb, acc[r][tb]);
}

INLINE void gemm_tb(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf,
                    const int TB) {
    const int K = W->cols;
    const size_t es = W->dtype == Q3_F32 ? 4 : 2, rs = (W->rs ? W->rs : (size_t)K) * es;
    float stage[Q3_STAGE_ROWS * 48] __attribute__((aligned(64)));
    for (int rg = r0; rg < r1; rg += ROWS) {
        const int R = r1 - rg < ROWS ? r1 - rg : ROWS, at = (rg - r0) % Q3_STAGE_ROWS;
        for (int r = 0; r < ROWS; r++) /* rows past R repeat the last one; their results are dropped */
            widen_row(wbuf + (size_t)r * K, W, rg + (r < R ? r : R - 1));
        const int nrows = W->rows - (rg + ROWS) < ROWS ? W->rows - (rg + ROWS) : ROWS;
        const char *next = (const char *)W->data + (size_t)(rg + ROWS) * rs;
        const size_t nbytes = nrows > 0 ? (size_t)(nrows - 1) * rs + (size_t)K * es : 0;
        tile(stage + (size_t)at * 16 * TB, ap, K, wbuf, TB, next, nbytes);
        if (at + ROWS == Q3_STAGE_ROWS || rg + ROWS >= r1) /* a full stage, or the last rows */
            q3_lane_store(out + (rg - r0 - at), ldo, stage, 16 * TB, T, at + R);
    }
}

void q3_avx512_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf) {
    const int TB = (T + 15) / 16;
    if (TB == 1) gemm_tb(out, ldo, ap, T, W, r0, r1, wbuf, 1);
    else if (TB == 2) gemm_tb(out, ldo, ap, T, W, r0, r1, wbuf, 2);
    else gemm_tb(out, ldo, ap, T, W, r0, r1, wbuf, 3);
}
#pragma GCC pop_options
