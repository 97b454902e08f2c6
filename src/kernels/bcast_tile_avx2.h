/* The AVX2 register tile of every kernel that broadcasts one operand
 * against vectors of the other: the weights-broadcast GEMM (rows of weights
 * against tokens in the lanes) and decode attention's o += P V (attention
 * probabilities against value dims in the lanes). Include after the file's
 * AVX2 target pragma. */
#ifndef Q3_BCAST_TILE_AVX2_H
#define Q3_BCAST_TILE_AVX2_H

#include <immintrin.h>
#include <stddef.h>

/* acc[i][v] = c[i * ldc + 8 v] (or 0 when fresh) + sum_{k < kc} w[i * ws + k]
 * * a[k * as + 8 v .. + 8] for i < R (<= 8), v < V (<= 3), stored back to c.
 * Every output lane sums over k in order. Called with constant shapes, so
 * the accumulators are registers and the guards fold away. */
static inline __attribute__((always_inline)) void q3_avx2_bcast_tile(float *c, size_t ldc, const float *w, size_t ws,
                                                                     const float *a, size_t as, int kc, int R, int V,
                                                                     int fresh) {
    __m256 acc[8][3];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++)
            if (i < R && v < V) acc[i][v] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc + 8 * v);
    for (int k = 0; k < kc; k++) {
        __m256 x[3];
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++)
            if (v < V) x[v] = _mm256_loadu_ps(a + (size_t)k * as + 8 * v);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            if (i < R) {
                const __m256 b = _mm256_broadcast_ss(w + i * ws + k);
#pragma GCC unroll 3
                for (int v = 0; v < 3; v++)
                    if (v < V) acc[i][v] = _mm256_fmadd_ps(b, x[v], acc[i][v]);
            }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++)
            if (i < R && v < V) _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]);
}

#endif
