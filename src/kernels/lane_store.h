/* Output of the tokens-in-lanes GEMMs (gemm_bc_avx512.c and the AVX-512
 * BF16 kernels): a tile's accumulators hold one weight row for 16 tokens,
 * but out is token-major. Writing each lane where it belongs scattered
 * 8 * T scalar stores per tile across T lines ldo floats apart; with ldo a
 * multiple of 1 KiB (hidden 2048: every token row in one L1 set) those lines
 * evicted each other between tiles, and the stores ran the GEMM at half its
 * rate. So tiles store their vectors row-major into a small stage, and the
 * panel goes out once, one masked vector store per token. Include after the
 * file's AVX-512 target pragma. */
#ifndef Q3_LANE_STORE_H
#define Q3_LANE_STORE_H

#include <immintrin.h>
#include <stddef.h>

/* Rows per stage: one matmul panel (Q3_NR). */
enum { Q3_STAGE_ROWS = 16 };

/* out[t][r] = stage[r * TP + t] for r < nr (<= Q3_STAGE_ROWS), t < T. */
static inline __attribute__((always_inline)) void q3_lane_store(float *out, size_t ldo, const float *stage, int TP, int T,
                                                                int nr) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(TP));
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(out + (size_t)t * ldo, m, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, stage + t, 4));
}

#endif
