/* AVX2 integer GEMV for MXINT8 inputs (the A8 input of the "i" schemes,
 * W4A8i / W8A8i) against MXINT8 or MXFP4 weights: the decode path of those
 * linears.
 *
 * Why integers: an int8 element times an int8 element, or times twice an
 * E2M1 value (an integer in [-12, 12]), is exact in 16 bits, and a block's
 * 32 products sum exactly in 32 bits. vpmaddubsw multiplies 32 byte pairs
 * and adds neighbours in one instruction, so a block costs about 8 vector
 * operations, scaling included, instead of about 15 for decoding to fp32
 * and FMAs (gemv_mx_avx2.c). The block's integer sum is then scaled once
 * by the product of the two E8M0 scales, in fp32, as the fp32 kernels
 * scale their block sums. (MXFP8 inputs do not fit: an E4M3 value needs
 * 18 bits as an integer.)
 *
 * MXFP4 rows take 8 blocks at a time: their sums leave the lanes together
 * and are converted and scaled once, by factors made from the 8 scale
 * codes at once (row_fp4_grouped). kernel_bench mx 768 2048, one thread,
 * from L3: 30.4 -> 35.3 G elements/s; kernel_bench moe (8 of 128 experts,
 * 2 threads, from DRAM): gate+up 27-28 -> 31-34 GB/s, down 24 -> 27-28
 * GB/s. The same factors for MXINT8 rows (whose block sums cannot share
 * lanes in 16 bits) were 5 % faster from L3 and no faster from DRAM: not
 * kept.
 *
 * vpmaddubsw takes one unsigned operand. For MXINT8 weights that is |w|
 * (up to 128: code 0x80, -2, is decoded exactly) with the weight's sign
 * moved onto the input: |w| * (a * sign(w)), |a| <= 127 by the quantizer.
 * For MXFP4 it is |a|, and the input's sign goes onto the weight before it
 * is decoded: one XOR of the E2M1 sign bits of the packed weight bytes
 * with a mask prepared with the input covers 64 elements. Either way a
 * pair sums to at most 2 * 128 * 127 < 2^15: no saturation.
 *
 * The input copy (i8_prep) re-quantizes x to MXINT8, which gives back x's
 * own elements exactly when x already is MXINT8 (q3_mat.ai8: the model
 * quantized it), and stores them in the order the weight decoding leaves
 * its lanes in. */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fp4_int_avx2.h"
#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))


/* Input copy layout, for K elements:
 *   MXINT8 weights: a[K] (int8, stored order), then fs[K/32] floats;
 *   MXFP4 weights:  ua[K] (|a|), sx[K/2] (sign masks), then fs[K/8] floats;
 * per 64 elements (two blocks, b and b+1) ua holds |a| of the even elements
 * of block b, the even ones of b+1, the odd ones of b, the odd ones of b+1
 * (the low and the high nibbles of the 32 weight bytes); sx byte j has bit
 * 3 / bit 7 set where the input element in weight byte j's low / high
 * nibble is negative; fs holds the two blocks' factors 4 times each (the
 * lanes of the block sums). fs = 2^(shared - 6), NaN for a block holding
 * NaN or infinity. For MXFP4, fs is followed by fg[K/32], the grouped
 * factors: per 8 blocks, the blocks' fs times the weight table's constant
 * factor in FP4_GROUP_ORDER, the order in which row_fp4_grouped's sums
 * leave their lanes. */
static float *fs_of(void *xq, int K, q3_dtype wt) {
    return (float *)((uint8_t *)xq + (wt == Q3_MXFP4 ? (size_t)K + (size_t)K / 2 : (size_t)K));
}

/* One block of x as MXINT8 codes (mx.h's rule: x / 2^shared rounded to
 * nearest even in units of 2^-6, saturating at +-127) in q[32]; returns the
 * factor 2^(shared - 6), or NaN (codes 0) when the block is not finite.
 * Scaling by a power of two is exact, and so are the rounding and the
 * clamp, so this equals q3_mx_quantize_row(Q3_MXINT8) code for code. */
float q3_avx2_i8_quant_block(const float *x, int8_t q[32]) {
    __m256 v[4], inv1, inv2;
    float amax;
    if (!block_amax(x, v, &amax)) {
        memset(q, 0, 32);
        return NAN;
    }
    const int e = q3_mx_shared_exp(Q3_MXINT8, amax);
    pow2_factors(6 - e, &inv1, &inv2); /* x * 2^(6 - e), exactly */
    const __m256 top = _mm256_set1_ps(127.0f);
    __m256i w[4];
    for (int i = 0; i < 4; i++) {
        const __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(v[i], inv1), inv2);
        __m256 r = _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_max_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), top)), top);
        w[i] = _mm256_cvtps_epi32(r);
    }
    /* 32 int32 -> 32 int8: the packs interleave 128-bit lanes; one permute puts them back. */
    const __m256i p16a = _mm256_packs_epi32(w[0], w[1]), p16b = _mm256_packs_epi32(w[2], w[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p8);
    return ldexpf(1.0f, e - 6);
}

void q3_avx2_i8_prep(void *xq, const float *x, int K, q3_dtype wt) {
    float *fs = fs_of(xq, K, wt);
    int8_t q[2][32];
    if (wt != Q3_MXFP4) {
        int8_t *a = xq;
        for (int b = 0; b < K / 32; b++) fs[b] = q3_avx2_i8_quant_block(x + (size_t)b * 32, a + (size_t)b * 32);
        return;
    }
    uint8_t *ua = xq, *sx = ua + K;
    for (int k = 0; k < K; k += 64) {
        for (int h = 0; h < 2; h++) {
            const float f = q3_avx2_i8_quant_block(x + k + 32 * h, q[h]);
            for (int i = 0; i < 4; i++) fs[k / 8 + 4 * h + i] = f;
        }
        for (int h = 0; h < 2; h++) { /* block b, then b+1 */
            const __m256i q8 = _mm256_loadu_si256((const __m256i *)q[h]);
            fp4_store_mags(ua + k, _mm256_abs_epi8(q8), h);
            fp4_store_signs(sx + k / 2, _mm256_cmpgt_epi8(_mm256_setzero_si256(), q8), h);
        }
    }
    /* The grouped factors: per 8 blocks, those of blocks 0, 2, 4, 6, 1, 3,
     * 5, 7 times the table's constant factor (E2M1 values are doubled). */
    float *fg = fs + K / 8;
    const float half = q3_mx_scale_table(Q3_MXFP4)[127];
    for (int g = 0; g + 8 <= K / 32; g += 8)
        for (int i = 0; i < 8; i++) fg[g + i] = fs[4 * (g + FP4_GROUP_ORDER[i])] * half;
}

/* 32 products of MXINT8 weights and inputs, summed in 4s into 8 int32 lanes,
 * as fp32. */
INLINE __m256 dot_i8(const uint8_t *w, const int8_t *a) {
    const __m256i wv = _mm256_loadu_si256((const __m256i *)w), av = _mm256_loadu_si256((const __m256i *)a);
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(av, wv));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

INLINE float row_i8(const uint8_t *el, const uint8_t *sc, int nb, const int8_t *a, const float *fs, const float *wtab,
                    size_t pf, const int l2) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (int b = 0; b < nb; b += 2) {
        q3_pf_line((const char *)el + (size_t)b * 32 + pf, l2);
        const __m256 d0 = dot_i8(el + (size_t)b * 32, a + (size_t)b * 32);
        const __m256 d1 = dot_i8(el + (size_t)b * 32 + 32, a + (size_t)b * 32 + 32);
        acc0 = _mm256_fmadd_ps(d0, _mm256_set1_ps(wtab[sc[b]] * fs[b]), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_set1_ps(wtab[sc[b + 1]] * fs[b + 1]), acc1);
    }
    return fp4_hsum(_mm256_add_ps(acc0, acc1));
}

/* Blocks b and b + 1: their sums in lanes 0-3 and 4-7, scaled into acc by
 * table lookups. */
INLINE __m256 step_fp4(__m256 acc, const uint8_t *el, const uint8_t *sc, int b, const uint8_t *ua, const uint8_t *sx,
                       const float *fs, const float *wtab, __m256i lut) {
    const size_t k = (size_t)b * 32;
    const __m256i p = fp4_pair(fp4_signed(el + k / 2, sx + k / 2), ua + k, lut);
    const __m256 d = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    const __m256 ws = _mm256_set_m128(_mm_set1_ps(wtab[sc[b + 1]]), _mm_set1_ps(wtab[sc[b]]));
    return _mm256_fmadd_ps(d, _mm256_mul_ps(ws, _mm256_loadu_ps(fs + k / 8)), acc);
}

/* A row of MXFP4 weights 8 blocks at a time (the tail 2 at a time, as
 * row_fp4): the 8 block sums leave their lanes together and are converted
 * and scaled once. Returns 0 (out unset) for a row with scale codes 0 or
 * 255, which row_fp4 then computes. */
INLINE int row_fp4_grouped(float *out, const uint8_t *el, const uint8_t *sc, int nb, const uint8_t *ua, const uint8_t *sx,
                           const float *fs, const float *fg, const float *wtab, size_t pf, const int l2) {
    const __m256i lut = fp4_lut();
    __m256 acc = _mm256_setzero_ps();
    __m128i lo = _mm_set1_epi8(-1), hi = _mm_setzero_si128(); /* the codes' range */
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        q3_pf_line((const char *)el + (size_t)b * 16 + pf, l2);
        q3_pf_line((const char *)el + (size_t)b * 16 + 64 + pf, l2);
        const uint8_t *e = el + (size_t)b * 16, *s = sx + (size_t)b * 16, *u = ua + (size_t)b * 32;
        const __m256i x0 = fp4_signed(e, s), x1 = fp4_signed(e + 32, s + 32);
        const __m256i x2 = fp4_signed(e + 64, s + 64), x3 = fp4_signed(e + 96, s + 96);
        const __m256i s01 = fp4_pair_sums(fp4_pair(x0, u, lut), fp4_pair(x1, u + 64, lut), 1);
        const __m256i s23 = fp4_pair_sums(fp4_pair(x2, u + 128, lut), fp4_pair(x3, u + 192, lut), 1);
        /* blocks 0, 2, 4, 6 | 1, 3, 5, 7 of the group: fg's order */
        const __m256i sums = fp4_group_sums(s01, s23);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), fp4_group_factors(sc + b, fg + b, &lo, &hi), acc);
    }
    if (!fp4_codes_normal(lo, hi)) return 0;
    for (; b < nb; b += 2) acc = step_fp4(acc, el, sc, b, ua, sx, fs, wtab, lut);
    *out = fp4_hsum(acc);
    return 1;
}

/* Four blocks per iteration into two accumulators (their FMA latencies
 * overlap), no branch inside. */
INLINE float row_fp4(const uint8_t *el, const uint8_t *sc, int nb, const uint8_t *ua, const uint8_t *sx, const float *fs,
                     const float *wtab, size_t pf, const int l2) {
    const __m256i lut = fp4_lut();
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        q3_pf_line((const char *)el + (size_t)b * 16 + pf, l2);
        acc0 = step_fp4(acc0, el, sc, b, ua, sx, fs, wtab, lut);
        acc1 = step_fp4(acc1, el, sc, b + 2, ua, sx, fs, wtab, lut);
    }
    if (b < nb) acc0 = step_fp4(acc0, el, sc, b, ua, sx, fs, wtab, lut);
    return fp4_hsum(_mm256_add_ps(acc0, acc1));
}

/* l2: the prefetch level (prefetch.h). */
INLINE void gemv_i8(float *out, const void *xq, const q3_mat *W, int r0, int r1, const int l2) {
    const int K = W->cols, nb = K / 32, fp4 = W->dtype == Q3_MXFP4;
    const size_t eb = q3_mx_elem_bytes(W->dtype, (size_t)K);
    const float *wtab = q3_mx_scale_table(W->dtype), *fs = fs_of((void *)xq, K, W->dtype);
    const uint8_t *el = W->data, *sc = W->scales;
    const size_t pf = Q3_PF_WEIGHTS, spf = q3_pf_scales((size_t)nb);
    for (int r = r0; r < r1; r++) {
        const uint8_t *e = el + (size_t)r * eb, *s = sc + (size_t)r * nb;
        q3_pf_line((const char *)s + spf, l2);
        if (fp4 && row_fp4_grouped(&out[r - r0], e, s, nb, xq, (const uint8_t *)xq + K, fs, fs + K / 8, wtab, pf, l2)) continue;
        out[r - r0] = fp4 ? row_fp4(e, s, nb, xq, (const uint8_t *)xq + K, fs, wtab, pf, l2) : row_i8(e, s, nb, xq, fs, wtab, pf, l2);
    }
}

void q3_avx2_gemv_i8(float *out, const void *xq, const q3_mat *W, int r0, int r1) {
    if (q3_pf_to_l2) gemv_i8(out, xq, W, r0, r1, 1);
    else gemv_i8(out, xq, W, r0, r1, 0);
}
#pragma GCC pop_options
