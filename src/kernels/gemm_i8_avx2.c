/* AVX2 integer GEMM for MXINT8 inputs against MXFP4 weights: the prefill
 * kernel of the W4A8i experts (7 .. Q3_BC_TOKENS_MAX tokens each).
 *
 * Why: this Zen 3 core issues one integer multiply per cycle but each
 * VPMADDUBSW does 32 multiply-adds, against 16 for the two fp32 FMAs per
 * cycle; the fp32 broadcast GEMM (gemm_bc_avx2.c) also has to widen every
 * weight to fp32 first.
 *
 * Exactness: with the input offset to unsigned (a + 128, 1 .. 255) and the
 * weights as twice their E2M1 value (-12 .. 12), a byte pair sums to at
 * most 6120, so four VPMADDUBSW results add up in 16 bits (24480) and
 * VPMADDWD widens them to 32; sum (a + 128) w = sum a w + 128 sum w, and
 * the block's sum of w is subtracted exactly. Each block's integer sum is
 * scaled once by the two E8M0 factors, as the GEMV does.
 *
 * Layout: tokens in lanes. ap[(k/4) * TP + t] holds token t's four offset
 * inputs k .. k+3 (TP = T rounded up to 8); fs[(k/32) * TP + t] the
 * token's block factor 2^(shared - 6) (NaN for a non-finite block). Each
 * weight row's 4 codes at k are broadcast to all lanes, so VPMADDUBSW
 * gives every token its two pair sums and VPMADDWD their total. Two rows x
 * two token vectors per tile; every output is one lane summing its blocks
 * in order, so results do not depend on the thread count. */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))

/* The layout above for TP lanes (T rounded up to the kernel's vector;
 * the AVX-512 VNNI GEMM uses it with 16). */
void q3_i8_pack_lanes(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K, int TP) {
    int8_t q[32];
    for (int t = 0; t < TP; t++) {
        uint8_t *a = (uint8_t *)ap;
        for (int b = 0; b < K / 32; b++) {
            float f = 0;
            if (t < T) f = q3_avx2_i8_quant_block(x + (size_t)t * ldx + (size_t)b * 32, q);
            else memset(q, 0, sizeof q);
            fs[(size_t)b * TP + t] = f;
            for (int k = 0; k < 32; k += 4)
                for (int i = 0; i < 4; i++) a[(((size_t)b * 8 + (size_t)k / 4) * TP + (size_t)t) * 4 + (size_t)i] = (uint8_t)(q[k + i] + 128);
        }
    }
}

void q3_avx2_i8_pack_act(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K) {
    q3_i8_pack_lanes(ap, fs, x, ldx, T, K, (T + 7) & ~7);
}

/* One MXFP4 row as twice its E2M1 values (int8, stored order), each block's
 * sum of them, and each block's factor (q3_mx_scale_table(Q3_MXFP4)). */
void q3_i8_decode_row(const q3_mat *W, int r, int8_t *wq, int32_t *wsum, float *wsc) {
    const int K = W->cols, nb = K / 32;
    const uint8_t *el = (const uint8_t *)W->data + (size_t)r * (size_t)(K / 2), *sc = W->scales + (size_t)r * nb;
    const float *tab = q3_mx_scale_table(Q3_MXFP4);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q3_e2m1_x2));
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b += 2) { /* 32 bytes: blocks b and b+1 */
        if (b % 4 == 0) _mm_prefetch((const char *)el + (size_t)b * 16 + Q3_PF_BYTES, _MM_HINT_T0);
        const __m256i x = _mm256_loadu_si256((const __m256i *)(el + (size_t)b * 16));
        const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4));
        const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
        /* interleave per 128-bit lane, then put the lanes back in order */
        const __m256i u0 = _mm256_unpacklo_epi8(lo, hi), u1 = _mm256_unpackhi_epi8(lo, hi);
        const __m256i w0 = _mm256_permute2x128_si256(u0, u1, 0x20), w1 = _mm256_permute2x128_si256(u0, u1, 0x31);
        _mm256_storeu_si256((__m256i *)(wq + (size_t)b * 32), w0);
        _mm256_storeu_si256((__m256i *)(wq + (size_t)b * 32 + 32), w1);
        /* The block sums: 128-bit lane 0 of lo and hi holds block b, lane 1
         * block b+1; two horizontal adds leave each lane's total in its
         * first element. */
        const __m256i s = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(ones8, lo), _mm256_maddubs_epi16(ones8, hi)), ones16);
        const __m256i h = _mm256_hadd_epi32(s, s), h2 = _mm256_hadd_epi32(h, h);
        wsum[b] = _mm256_extract_epi32(h2, 0), wsum[b + 1] = _mm256_extract_epi32(h2, 4);
        wsc[b] = tab[sc[b]], wsc[b + 1] = tab[sc[b + 1]];
    }
}

/* For the VNNI GEMM (VPDPBUSD sums 4 products of at most 255 * 128 in 32
 * bits; VPMADDUBSW's 16-bit pairs would saturate on MXINT8 weights). The
 * block sums as sums of the codes offset to unsigned (SAD against zero,
 * 8 bytes at a time) less 32 * 128. */
void q3_i8_decode_row_int8(const q3_mat *W, int r, int8_t *wq, int32_t *wsum, float *wsc) {
    const int K = W->cols, nb = K / 32;
    const uint8_t *el = (const uint8_t *)W->data + (size_t)r * (size_t)K, *sc = W->scales + (size_t)r * nb;
    const float *tab = q3_mx_scale_table(Q3_MXINT8);
    for (int b = 0; b < nb; b++) {
        if (b % 2 == 0) _mm_prefetch((const char *)el + (size_t)b * 32 + Q3_PF_BYTES, _MM_HINT_T0);
        const __m256i x = _mm256_loadu_si256((const __m256i *)(el + (size_t)b * 32));
        _mm256_storeu_si256((__m256i *)(wq + (size_t)b * 32), x);
        const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(x, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
        const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        wsum[b] = (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
        wsc[b] = tab[sc[b]];
    }
}

/* Four k of rows w0/w1 against one token vector: the pair sums added into
 * the 16-bit sums s0/s1. */
#define STEP4(s0, s1, av, b0, b1)                               \
    do {                                                        \
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(av, b0)); \
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(av, b1)); \
        __asm__("" : "+x"(s0), "+x"(s1)); /* keep the chain: a reassociated tree spills */ \
    } while (0)

/* Rows w0/w1 (decoded) against NV (1 or 2) token vectors starting at
 * token 8 * v0: o[row * 2 + vector] accumulates the scaled block sums.
 * The 16- and 32-bit sums live in named registers (an array of vectors
 * ends up on the stack). */
INLINE void tile(__m256 o[4], const int8_t *w0, const int8_t *w1, const int32_t *ws0, const int32_t *ws1,
                 const float *sc0, const float *sc1, const uint32_t *ap, const float *fs, int TP, int v0, int nb, const int NV) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b++) {
        __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00; /* 32-bit block sums */
        for (int h = 0; h < 2; h++) {
            __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const int k = b * 32 + h * 16 + q * 4;
                int32_t x0, x1;
                memcpy(&x0, w0 + k, 4);
                memcpy(&x1, w1 + k, 4);
                const __m256i b0 = _mm256_set1_epi32(x0), b1 = _mm256_set1_epi32(x1);
                const uint32_t *a = ap + (size_t)(k / 4) * TP + (size_t)v0 * 8;
                const __m256i av0 = _mm256_loadu_si256((const __m256i *)a);
                STEP4(s00, s10, av0, b0, b1);
                if (NV == 2) {
                    const __m256i av1 = _mm256_loadu_si256((const __m256i *)(a + 8));
                    STEP4(s01, s11, av1, b0, b1);
                }
            }
            a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(s00, ones16));
            a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(s10, ones16));
            if (NV == 2) {
                a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(s01, ones16));
                a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(s11, ones16));
            }
        }
        const __m256i c0 = _mm256_set1_epi32(128 * ws0[b]), c1 = _mm256_set1_epi32(128 * ws1[b]);
        const __m256 g0 = _mm256_set1_ps(sc0[b]), g1 = _mm256_set1_ps(sc1[b]);
        const __m256 f0 = _mm256_loadu_ps(fs + (size_t)b * TP + (size_t)v0 * 8);
        o[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a00, c0)), _mm256_mul_ps(f0, g0), o[0]);
        o[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a10, c1)), _mm256_mul_ps(f0, g1), o[2]);
        if (NV == 2) {
            const __m256 f1 = _mm256_loadu_ps(fs + (size_t)b * TP + (size_t)v0 * 8 + 8);
            o[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a01, c0)), _mm256_mul_ps(f1, g0), o[1]);
            o[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a11, c1)), _mm256_mul_ps(f1, g1), o[3]);
        }
    }
}

void q3_avx2_gemm_i8(float *out, size_t ldo, const uint32_t *ap, const float *fs, int T, const q3_mat *W, int r0, int r1,
                     void *wbuf) {
    const int K = W->cols, nb = K / 32, TP = (T + 7) & ~7, V = TP / 8, nr = r1 - r0;
    int8_t *wq = wbuf;                                          /* Q3_NR rows of K */
    int32_t *wsum = (int32_t *)(void *)(wq + (size_t)Q3_NR * K); /* Q3_NR rows of nb */
    float *wsc = (float *)(wsum + (size_t)Q3_NR * nb);
    for (int r = 0; r < nr; r++) q3_i8_decode_row(W, r0 + r, wq + (size_t)r * K, wsum + (size_t)r * nb, wsc + (size_t)r * nb);
    for (int r = 0; r < nr; r += 2) {
        const int r1_ = r + 1 < nr ? r + 1 : r; /* an odd last row pairs with itself */
        for (int v0 = 0; v0 < V; v0 += 2) {
            const int nv = V - v0 < 2 ? V - v0 : 2;
            __m256 oacc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            const int8_t *wa = wq + (size_t)r * K, *wb = wq + (size_t)r1_ * K;
            const int32_t *sa = wsum + (size_t)r * nb, *sb = wsum + (size_t)r1_ * nb;
            const float *ga = wsc + (size_t)r * nb, *gb = wsc + (size_t)r1_ * nb;
            if (nv == 2) tile(oacc, wa, wb, sa, sb, ga, gb, ap, fs, TP, v0, nb, 2);
            else tile(oacc, wa, wb, sa, sb, ga, gb, ap, fs, TP, v0, nb, 1);
            for (int v = 0; v < nv; v++) {
                float o[2][8];
                _mm256_storeu_ps(o[0], oacc[v]);
                _mm256_storeu_ps(o[1], oacc[2 + v]);
                for (int i = 0; i < 8; i++) {
                    const int t = (v0 + v) * 8 + i;
                    if (t >= T) break;
                    out[(size_t)t * ldo + r] = o[0][i];
                    if (r + 1 < nr) out[(size_t)t * ldo + r + 1] = o[1][i];
                }
            }
        }
    }
}
#pragma GCC pop_options
