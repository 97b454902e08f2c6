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

#define INLINE static inline __attribute__((always_inline))

void q3_avx512_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K) {
    const int TP = (T + 15) & ~15;
    for (int k = 0; k < K; k++) {
        float *dst = ap + (size_t)k * TP;
        for (int t = 0; t < TP; t++) dst[t] = t < T ? x[(size_t)t * ldx + k] : 0.0f;
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

/* out[t][r] for r < R (<= 8), t < T, from 8 widened rows wb[r * K ..].
 * Meanwhile the next rows' weights, nbytes at `next`, are prefetched: rows
 * are a page or so each, so the hardware prefetcher, which stops at page
 * boundaries, would leave every row's first lines to miss in DRAM. */
INLINE void tile8(float *out, size_t ldo, const float *ap, int T, int K, const float *wb, int R, int TB,
                  const char *next, size_t nbytes) {
    const size_t lines = (nbytes + 63) / 64;
    const int every = lines ? (int)((size_t)K / lines > 0 ? (size_t)K / lines : 1) : K + 1;
    const int TP = 16 * TB;
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < 3; tb++) acc[r][tb] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        if (k % every == 0 && (size_t)(k / every) < lines) _mm_prefetch(next + (size_t)(k / every) * 64, _MM_HINT_T0);
        __m512 a[3];
#pragma GCC unroll 3
        for (int tb = 0; tb < 3; tb++)
            if (tb < TB) a[tb] = _mm512_loadu_ps(ap + (size_t)k * TP + 16 * tb);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m512 w = _mm512_set1_ps(wb[(size_t)r * K + k]);
#pragma GCC unroll 3
            for (int tb = 0; tb < 3; tb++)
                if (tb < TB) acc[r][tb] = _mm512_fmadd_ps(w, a[tb], acc[r][tb]);
        }
    }
    float lanes[16];
    for (int r = 0; r < R; r++)
        for (int tb = 0; tb < TB; tb++) {
            _mm512_storeu_ps(lanes, acc[r][tb]);
            for (int j = 0; j < 16 && 16 * tb + j < T; j++) out[(size_t)(16 * tb + j) * ldo + r] = lanes[j];
        }
}

void q3_avx512_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf) {
    const int K = W->cols, TB = (T + 15) / 16;
    const size_t es = W->dtype == Q3_F32 ? 4 : 2, rs = (W->rs ? W->rs : (size_t)K) * es;
    for (int rg = r0; rg < r1; rg += 8) {
        const int R = r1 - rg < 8 ? r1 - rg : 8;
        for (int r = 0; r < 8; r++) /* rows past R repeat the last one; their results are dropped */
            widen_row(wbuf + (size_t)r * K, W, rg + (r < R ? r : R - 1));
        const int nrows = W->rows - (rg + 8) < 8 ? W->rows - (rg + 8) : 8;
        const char *next = (const char *)W->data + (size_t)(rg + 8) * rs;
        const size_t nbytes = nrows > 0 ? (size_t)(nrows - 1) * rs + (size_t)K * es : 0;
        if (TB == 1) tile8(out + (rg - r0), ldo, ap, T, K, wbuf, R, 1, next, nbytes);
        else if (TB == 2) tile8(out + (rg - r0), ldo, ap, T, K, wbuf, R, 2, next, nbytes);
        else tile8(out + (rg - r0), ldo, ap, T, K, wbuf, R, 3, next, nbytes);
    }
}
#pragma GCC pop_options
