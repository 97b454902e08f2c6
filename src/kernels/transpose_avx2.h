/* 8 x 8 fp32 transpose in AVX2 registers, shared by the panel packers of
 * isa_avx2.c and the broadcast GEMM's token panel (gemm_bc_avx2.c).
 * Include after the file's AVX2 target pragma. */
#ifndef Q3_TRANSPOSE_AVX2_H
#define Q3_TRANSPOSE_AVX2_H

#include <immintrin.h>

/* r[i] = row i -> r[j] = column j. */
static inline __attribute__((always_inline)) void q3_avx2_transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

#endif
