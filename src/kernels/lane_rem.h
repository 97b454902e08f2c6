/* Remainder tokens of the tokens-in-lanes AVX-512 BF16 GEMM (the A8 GEMM
 * of isa_avx512bf16.c): the tokens left over after whole vectors of 16 are computed with the
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
 * w32[r] (np bf16 pairs) with NT token rows of np pairs at xr; 16 pairs
 * per step, a masked tail when np % 16 != 0. */
static inline __attribute__((always_inline)) void q3_rem_dot(float *stage, int ts, const uint32_t *xr, int np,
                                                             const uint32_t *const *w32, const int NT) {
    __m512 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) acc[r][j] = _mm512_setzero_ps();
    for (int i = 0; i < np; i += 16) {
        const __mmask16 m = np - i >= 16 ? 0xFFFF : (__mmask16)((1u << (np - i)) - 1);
        __m512bh x[3];
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) x[j] = (__m512bh)_mm512_maskz_loadu_epi32(m, xr + (size_t)j * np + i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512bh w = (__m512bh)_mm512_maskz_loadu_epi32(m, w32[r] + i);
#pragma GCC unroll 3
            for (int j = 0; j < NT; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], w, x[j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) stage[(size_t)r * ts + j] = _mm512_reduce_add_ps(acc[r][j]);
}

/* All rem token rows at xr against 4 weight rows, into stage[r * ts + j]. */
static inline __attribute__((always_inline)) void q3_rem_dots(float *stage, int ts, const uint32_t *xr, int rem, int np,
                                                              const uint32_t *const *w32) {
    for (int j = 0; j < rem; j += 3) {
        const uint32_t *xj = xr + (size_t)j * np;
        if (rem - j >= 3) q3_rem_dot(stage + j, ts, xj, np, w32, 3);
        else if (rem - j == 2) q3_rem_dot(stage + j, ts, xj, np, w32, 2);
        else q3_rem_dot(stage + j, ts, xj, np, w32, 1);
    }
}

#endif
