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
 * factor in GROUP_ORDER, the order in which row_fp4_grouped's sums leave
 * their lanes. */
static const int GROUP_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static float *fs_of(void *xq, int K, q3_dtype wt) {
    return (float *)((uint8_t *)xq + (wt == Q3_MXFP4 ? (size_t)K + (size_t)K / 2 : (size_t)K));
}

/* One block of x as MXINT8 codes (mx.h's rule: x / 2^shared rounded to
 * nearest even in units of 2^-6, saturating at +-127) in q[32]; returns the
 * factor 2^(shared - 6), or NaN (codes 0) when the block is not finite.
 * Scaling by a power of two is exact, and so are the rounding and the
 * clamp, so this equals q3_mx_quantize_row(Q3_MXINT8) code for code. */
float q3_avx2_i8_quant_block(const float *x, int8_t q[32]) {
    __m256 v[4], amax = _mm256_setzero_ps(), bad = amax;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v[i], v[i]), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    }
    if (_mm256_movemask_ps(bad)) {
        memset(q, 0, 32);
        return NAN;
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const int e = q3_mx_shared_exp(Q3_MXINT8, _mm_cvtss_f32(m));
    /* x * 2^(6 - e) as two exact power-of-two scalings: 2^(6 - e) itself
     * overflows fp32 for the smallest shared exponents (e < -121). */
    const int s1 = 6 - e < 127 ? 6 - e : 127;
    const __m256 inv1 = _mm256_set1_ps(ldexpf(1.0f, s1)), inv2 = _mm256_set1_ps(ldexpf(1.0f, 6 - e - s1));
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
        const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for (int h = 0; h < 2; h++) { /* block b, then b+1 */
            const __m128i s0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)q[h]), split);
            const __m128i s1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q[h] + 16)), split);
            const __m128i even = _mm_unpacklo_epi64(s0, s1), odd = _mm_unpackhi_epi64(s0, s1);
            _mm_storeu_si128((__m128i *)(ua + k + 16 * h), _mm_abs_epi8(even));
            _mm_storeu_si128((__m128i *)(ua + k + 32 + 16 * h), _mm_abs_epi8(odd));
            const __m128i neg_e = _mm_cmpgt_epi8(_mm_setzero_si128(), even), neg_o = _mm_cmpgt_epi8(_mm_setzero_si128(), odd);
            _mm_storeu_si128((__m128i *)(sx + k / 2 + 16 * h),
                             _mm_or_si128(_mm_and_si128(neg_e, _mm_set1_epi8(0x08)), _mm_and_si128(neg_o, _mm_set1_epi8((char)0x80))));
        }
    }
    /* The grouped factors: per 8 blocks, those of blocks 0, 2, 4, 6, 1, 3,
     * 5, 7 times the table's constant factor (E2M1 values are doubled). */
    float *fg = fs + K / 8;
    const float half = q3_mx_scale_table(Q3_MXFP4)[127];
    for (int g = 0; g + 8 <= K / 32; g += 8)
        for (int i = 0; i < 8; i++) fg[g + i] = fs[4 * (g + GROUP_ORDER[i])] * half;
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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
    return hsum(_mm256_add_ps(acc0, acc1));
}

/* The factors of 8 MXFP4 blocks in GROUP_ORDER: 2^(code - 127) from the
 * scale codes as exponent fields, times fg (the input factors times the
 * table's constant), 8 at once. *lo and *hi keep the least and the
 * greatest code seen in bytes 0-7: rows with codes 0 or 255 (not normal
 * floats) take the table instead. The products equal wtab[code] * fs
 * (powers of two, one rounding). */
INLINE __m256 group_factors(const uint8_t *sc, const float *fg, __m128i *lo, __m128i *hi) {
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m128i raw = _mm_loadl_epi64((const __m128i *)sc), codes = _mm_shuffle_epi8(raw, order);
    *lo = _mm_min_epu8(*lo, raw), *hi = _mm_max_epu8(*hi, raw);
    const __m256 ws = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(codes), 23));
    return _mm256_mul_ps(ws, _mm256_loadu_ps(fg));
}

/* Two MXFP4 blocks (the 32 weight bytes at e) with the input's signs: the
 * weight bytes XOR the input's sign masks (at s). */
INLINE __m256i fp4_signed(const uint8_t *e, const uint8_t *s) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)e), _mm256_loadu_si256((const __m256i *)s));
}

/* Their products with |a| (at u): the low nibbles of x index a table of
 * twice the E2M1 values, as do the high ones. The 16-bit partial sums:
 * lanes 0-7 block b, 8-15 block b + 1, each at most 4 * 12 * 127. */
INLINE __m256i fp4_pair(__m256i x, const uint8_t *u, __m256i lut) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
    return _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)u), lo),
                            _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(u + 32)), hi));
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

/* Two steps' partial sums interleaved in 16-bit pairs and added (at most
 * 8 * 12 * 127), then each pair widened and summed: in each 128-bit half,
 * lanes 0 and 2 hold p's block, 1 and 3 q's. */
INLINE __m256i pair_sums(__m256i p, __m256i q) {
    const __m256i t = _mm256_add_epi16(_mm256_unpacklo_epi32(p, q), _mm256_unpackhi_epi32(p, q));
    return _mm256_madd_epi16(t, _mm256_set1_epi16(1));
}

/* A row of MXFP4 weights 8 blocks at a time (the tail 2 at a time, as
 * row_fp4): the 8 block sums leave their lanes together and are converted
 * and scaled once. Returns 0 (out unset) for a row with scale codes 0 or
 * 255, which row_fp4 then computes. */
INLINE int row_fp4_grouped(float *out, const uint8_t *el, const uint8_t *sc, int nb, const uint8_t *ua, const uint8_t *sx,
                           const float *fs, const float *fg, const float *wtab, size_t pf, const int l2) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q3_e2m1_x2));
    __m256 acc = _mm256_setzero_ps();
    __m128i lo = _mm_set1_epi8(-1), hi = _mm_setzero_si128(); /* the codes' range */
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        q3_pf_line((const char *)el + (size_t)b * 16 + pf, l2);
        q3_pf_line((const char *)el + (size_t)b * 16 + 64 + pf, l2);
        const uint8_t *e = el + (size_t)b * 16, *s = sx + (size_t)b * 16, *u = ua + (size_t)b * 32;
        const __m256i x0 = fp4_signed(e, s), x1 = fp4_signed(e + 32, s + 32);
        const __m256i x2 = fp4_signed(e + 64, s + 64), x3 = fp4_signed(e + 96, s + 96);
        const __m256i s01 = pair_sums(fp4_pair(x0, u, lut), fp4_pair(x1, u + 64, lut));
        const __m256i s23 = pair_sums(fp4_pair(x2, u + 128, lut), fp4_pair(x3, u + 192, lut));
        /* blocks 0, 2, 4, 6 | 1, 3, 5, 7 of the group: fg's order */
        const __m256i sums = _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), group_factors(sc + b, fg + b, &lo, &hi), acc);
    }
    const __m128i odd = _mm_or_si128(_mm_cmpeq_epi8(lo, _mm_setzero_si128()), _mm_cmpeq_epi8(hi, _mm_set1_epi8(-1)));
    if (_mm_movemask_epi8(odd) & 0xff) return 0; /* (bytes 8-15 of the codes loaded are zeros) */
    for (; b < nb; b += 2) acc = step_fp4(acc, el, sc, b, ua, sx, fs, wtab, lut);
    *out = hsum(acc);
    return 1;
}

/* Four blocks per iteration into two accumulators (their FMA latencies
 * overlap), no branch inside. */
INLINE float row_fp4(const uint8_t *el, const uint8_t *sc, int nb, const uint8_t *ua, const uint8_t *sx, const float *fs,
                     const float *wtab, size_t pf, const int l2) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q3_e2m1_x2));
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        q3_pf_line((const char *)el + (size_t)b * 16 + pf, l2);
        acc0 = step_fp4(acc0, el, sc, b, ua, sx, fs, wtab, lut);
        acc1 = step_fp4(acc1, el, sc, b + 2, ua, sx, fs, wtab, lut);
    }
    if (b < nb) acc0 = step_fp4(acc0, el, sc, b, ua, sx, fs, wtab, lut);
    return hsum(_mm256_add_ps(acc0, acc1));
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
