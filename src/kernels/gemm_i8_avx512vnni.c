/* AVX-512 VNNI integer GEMM for MXINT8 inputs against MXFP4 and MXINT8
 * weights: the prefill kernel of the W4A8i experts and attention where the
 * CPU has AVX512_VNNI.
 *
 * The AVX2 kernel's layout and arithmetic (gemm_i8_avx2.c) in 16 lanes:
 * VPDPBUSD multiplies each token's four offset inputs by a row's four
 * codes and adds them to a 32-bit sum in one instruction, where AVX2 needs
 * a VPMADDUBSW, a 16-bit add and, every 16 k, a VPMADDWD for 8 lanes. The
 * block sums are exact in 32 bits either way ((a + 128) w: 32 * 255 * 12
 * < 2^17 per block) and are scaled by the same operations in the same
 * order, so the results equal the AVX2 kernel's bit for bit. MXINT8 rows
 * (which the AVX2 kernel does not take: its 16-bit pair sums would
 * saturate) are exact too: 32 * 255 * 128 < 2^24 per block.
 *
 * Tiles of 4 rows x 2 token vectors: 8 integer and 8 fp32 accumulators,
 * 2 token loads and 4 broadcast row codes per 8 VPDPBUSD. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni,avx2,fma")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/lane_store.h"

#define INLINE static inline __attribute__((always_inline))

enum { RT = 4 }; /* rows per tile */

static void pack_act(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K) {
    q3_i8_pack_lanes(ap, fs, x, ldx, T, K, (T + 15) & ~15);
}

/* Rows w[i] (decoded: int8 codes, block sums ws[i], block factors sc[i])
 * against NV (1 or 2) vectors of 16 tokens from token 16 * v0, into
 * o[i][v]: per block, the exact integer sums less 128 times the row's
 * block sum, converted, times the input factor times the weight factor. */
INLINE void tile(__m512 o[RT][2], const int8_t *const *w, const int32_t *const *ws, const float *const *sc,
                 const uint32_t *ap, const float *fs, int TP, int v0, int nb, const int NV) {
    for (int b = 0; b < nb; b++) {
        __m512i acc[RT][2];
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            const int k = b * 32 + q * 4;
            const uint32_t *a = ap + (size_t)(k / 4) * TP + (size_t)v0 * 16;
            __m512i av[2];
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) av[v] = _mm512_loadu_si512(a + 16 * v);
#pragma GCC unroll 4
            for (int i = 0; i < RT; i++) {
                int32_t codes;
                memcpy(&codes, w[i] + k, 4);
                const __m512i bw = _mm512_set1_epi32(codes);
#pragma GCC unroll 2
                for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbusd_epi32(acc[i][v], av[v], bw);
            }
        }
        __m512 f[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) f[v] = _mm512_loadu_ps(fs + (size_t)b * TP + (size_t)v0 * 16 + 16 * v);
#pragma GCC unroll 4
        for (int i = 0; i < RT; i++) {
            const __m512i c = _mm512_set1_epi32(128 * ws[i][b]);
            const __m512 g = _mm512_set1_ps(sc[i][b]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++)
                o[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][v], c)), _mm512_mul_ps(f[v], g), o[i][v]);
        }
    }
}

static void gemm_i8(float *out, size_t ldo, const uint32_t *ap, const float *fs, int T, const q3_mat *W, int r0, int r1,
                    void *wbuf) {
    const int K = W->cols, nb = K / 32, TP = (T + 15) & ~15, V = TP / 16, nr = r1 - r0;
    int8_t *wq = wbuf;                                          /* Q3_NR rows of K */
    int32_t *wsum = (int32_t *)(void *)(wq + (size_t)Q3_NR * K); /* Q3_NR rows of nb */
    float *wsc = (float *)(wsum + (size_t)Q3_NR * nb);
    float stage[Q3_STAGE_ROWS * Q3_BC_TOKENS_MAX] __attribute__((aligned(64)));
    void (*decode)(const q3_mat *, int, int8_t *, int32_t *, float *) =
        W->dtype == Q3_MXINT8 ? q3_i8_decode_row_int8 : q3_i8_decode_row;
    for (int r = 0; r < nr; r++) decode(W, r0 + r, wq + (size_t)r * K, wsum + (size_t)r * nb, wsc + (size_t)r * nb);
    for (int r = 0; r < nr; r += RT) {
        const int8_t *w[RT];
        const int32_t *ws[RT];
        const float *sc[RT];
        for (int i = 0; i < RT; i++) { /* rows past nr repeat the last one; their results are dropped */
            const int ri = r + i < nr ? r + i : nr - 1;
            w[i] = wq + (size_t)ri * K, ws[i] = wsum + (size_t)ri * nb, sc[i] = wsc + (size_t)ri * nb;
        }
        for (int v0 = 0; v0 < V; v0 += 2) {
            const int nv = V - v0 < 2 ? V - v0 : 2;
            __m512 o[RT][2];
            for (int i = 0; i < RT; i++) o[i][0] = o[i][1] = _mm512_setzero_ps();
            if (nv == 2) tile(o, w, ws, sc, ap, fs, TP, v0, nb, 2);
            else tile(o, w, ws, sc, ap, fs, TP, v0, nb, 1);
            for (int i = 0; i < RT && r + i < nr; i++)
                for (int v = 0; v < nv; v++) _mm512_store_ps(stage + (size_t)(r + i) * TP + 16 * (v0 + v), o[i][v]);
        }
    }
    q3_lane_store(out, ldo, stage, TP, T, nr);
}

void q3_avx512vnni_i8_kernels(q3_isa_kernels *k) {
    k->i8_pack_act = pack_act;
    k->gemm_i8 = gemm_i8;
    k->gemm_i8_int8 = 1;
    k->i8_prep = q3_avx512vnni_i8_prep;
    k->gemv_i8 = q3_avx512vnni_gemv_i8;
    k->i8_prep_tokens = q3_avx512vnni_i8_prep_tokens;
    k->gemv_i8_tokens = q3_avx512vnni_gemv_i8_tokens;
}
#pragma GCC pop_options
