/* Remainder tokens of the tokens-in-lanes AVX-512 BF16 GEMMs
 * (gemm_bf16_avx512bf16.c, and the A8 GEMM of isa_avx512bf16.c): the
 * tokens left over after whole vectors of 16 are computed with the
 * reduction in the lanes instead. That runs slower per token than a full
 * lane but pads nothing, where one more vector of 16 lanes would (a
 * 17-token expert wasted 47 % of its lanes; 20 % of a 512-token prefill's
 * expert lanes were padding). Past rem_max tokens (per kernel, measured
 * with kernel_bench at T = 17 .. 28) a padded vector is faster. Include
 * after the file's AVX-512 BF16 target pragma. */
#ifndef Q3_LANE_REM_H
#define Q3_LANE_REM_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Token vectors (tv) and remainder tokens (rem) for T tokens. */
static inline void q3_split_tokens(int T, int rem_max, int *tv, int *rem) {
    *tv = T / 16, *rem = T % 16;
    if (*rem > rem_max) ++*tv, *rem = 0;
}

/* stage[r * ts + j] for r < 4, j < NT: the dot products of 4 weight rows
 * w32[r] (np bf16 pairs) with NT token rows at xr, each PARTS * np pairs
 * (the input as PARTS bf16 terms, one after the other); 16 pairs per step,
 * a masked tail when np % 16 != 0. Each term has its own accumulators:
 * summed into one, each is a chain of PARTS dependent instructions. */
static inline __attribute__((always_inline)) void q3_rem_dot(float *stage, int ts, const uint32_t *xr, int np,
                                                             const uint32_t *const *w32, const int NT, const int PARTS) {
    __m512 acc[4][3][2];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
    for (int i = 0; i < np; i += 16) {
        const __mmask16 m = np - i >= 16 ? 0xFFFF : (__mmask16)((1u << (np - i)) - 1);
        __m512bh x[3][2];
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++)
#pragma GCC unroll 2
            for (int p = 0; p < PARTS; p++)
                x[j][p] = (__m512bh)_mm512_maskz_loadu_epi32(m, xr + ((size_t)j * PARTS + p) * np + i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512bh w = (__m512bh)_mm512_maskz_loadu_epi32(m, w32[r] + i);
#pragma GCC unroll 3
            for (int j = 0; j < NT; j++)
#pragma GCC unroll 2
                for (int p = 0; p < PARTS; p++) acc[r][j][p] = _mm512_dpbf16_ps(acc[r][j][p], w, x[j][p]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++)
            stage[(size_t)r * ts + j] = _mm512_reduce_add_ps(PARTS == 2 ? _mm512_add_ps(acc[r][j][0], acc[r][j][1]) : acc[r][j][0]);
}

/* All rem token rows at xr against 4 weight rows, into stage[r * ts + j]. */
static inline __attribute__((always_inline)) void q3_rem_dots(float *stage, int ts, const uint32_t *xr, int rem, int np,
                                                              const uint32_t *const *w32, const int PARTS) {
    for (int j = 0; j < rem; j += 3) {
        const uint32_t *xj = xr + (size_t)j * PARTS * np;
        if (rem - j >= 3) q3_rem_dot(stage + j, ts, xj, np, w32, 3, PARTS);
        else if (rem - j == 2) q3_rem_dot(stage + j, ts, xj, np, w32, 2, PARTS);
        else q3_rem_dot(stage + j, ts, xj, np, w32, 1, PARTS);
    }
}

#endif
