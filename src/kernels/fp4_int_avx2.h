/* Integer products of MXFP4 weights with unsigned byte inputs (AVX2),
 * shared by the GEMVs for MXINT8 inputs (gemv_i8_avx2.c) and for MXFP8
 * inputs (gemv_a8_avx2.c). Include after the file's target pragma.
 *
 * The input copies hold magnitudes |a| <= 255 as bytes and the inputs'
 * signs as masks over the weight bytes, per 64 elements (blocks b and
 * b + 1): |a| of the even elements of block b, the even ones of b + 1, the
 * odd ones of b, the odd ones of b + 1 (the low and the high nibbles of the
 * 32 weight bytes); sign byte j has bit 3 / bit 7 set where the input
 * element in weight byte j's low / high nibble is negative. VPMADDUBSW
 * then multiplies |a| by twice the E2M1 value with the input's sign
 * (q3_e2m1_x2, at most 12 in magnitude), each pair at most 2 * 255 * 12 <
 * 2^15: no saturation. */
#ifndef Q3_FP4_INT_AVX2_H
#define Q3_FP4_INT_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "quant/mx.h"

/* The order in which a group's 8 block sums leave their lanes
 * (fp4_group_sums): blocks 0, 2, 4, 6, 1, 3, 5, 7. */
static const int FP4_GROUP_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static inline __attribute__((always_inline)) __m256i fp4_lut(void) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q3_e2m1_x2));
}

/* Two MXFP4 blocks (the 32 weight bytes at e) with the input's signs: the
 * weight bytes XOR the input's sign masks (at s). */
static inline __attribute__((always_inline)) __m256i fp4_signed(const uint8_t *e, const uint8_t *s) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)e), _mm256_loadu_si256((const __m256i *)s));
}

/* The signed weights of the low nibbles (*lo) and of the high ones (*hi). */
static inline __attribute__((always_inline)) void fp4_decode(__m256i x, __m256i lut, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    *lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4));
    *hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
}

/* Their products with the 64 magnitudes at u, as 16-bit partial sums:
 * lanes 0-7 block b, 8-15 block b + 1, each at most 4 * 12 * 255. */
static inline __attribute__((always_inline)) __m256i fp4_products(__m256i lo, __m256i hi, const uint8_t *u) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)u), lo),
                            _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(u + 32)), hi));
}

static inline __attribute__((always_inline)) __m256i fp4_pair(__m256i x, const uint8_t *u, __m256i lut) {
    __m256i lo, hi;
    fp4_decode(x, lut, &lo, &hi);
    return fp4_products(lo, hi, u);
}

/* Two steps' partial sums interleaved in 16-bit pairs and added (at most
 * 8 * 12 * 255 < 2^15), then each pair widened and summed, times the
 * 16-bit factor f: in each 128-bit half, lanes 0 and 2 hold p's block, 1
 * and 3 q's. */
static inline __attribute__((always_inline)) __m256i fp4_pair_sums(__m256i p, __m256i q, short f) {
    const __m256i t = _mm256_add_epi16(_mm256_unpacklo_epi32(p, q), _mm256_unpackhi_epi32(p, q));
    return _mm256_madd_epi16(t, _mm256_set1_epi16(f));
}

/* The 8 block sums of a group from the pair sums of its steps 0-1 and 2-3,
 * in FP4_GROUP_ORDER. */
static inline __attribute__((always_inline)) __m256i fp4_group_sums(__m256i s01, __m256i s23) {
    return _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
}

/* The factors of 8 MXFP4 blocks in FP4_GROUP_ORDER: 2^(code - 127) from
 * the scale codes as exponent fields, times fg (the input factors times
 * the weight table's constant), 8 at once. *lo and *hi keep the least and
 * the greatest code seen in bytes 0-7: rows with codes 0 or 255 (not
 * normal floats) take the table instead (fp4_codes_normal). The products
 * equal the table's factor times the input's (powers of two, one
 * rounding). */
static inline __attribute__((always_inline)) __m256 fp4_group_factors(const uint8_t *sc, const float *fg, __m128i *lo,
                                                                      __m128i *hi) {
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m128i raw = _mm_loadl_epi64((const __m128i *)sc), codes = _mm_shuffle_epi8(raw, order);
    *lo = _mm_min_epu8(*lo, raw), *hi = _mm_max_epu8(*hi, raw);
    const __m256 ws = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(codes), 23));
    return _mm256_mul_ps(ws, _mm256_loadu_ps(fg));
}

/* Whether the codes fp4_group_factors saw (starting from lo = 0xFF..,
 * hi = 0) were all normal: 1 .. 254. */
static inline __attribute__((always_inline)) int fp4_codes_normal(__m128i lo, __m128i hi) {
    const __m128i odd = _mm_or_si128(_mm_cmpeq_epi8(lo, _mm_setzero_si128()), _mm_cmpeq_epi8(hi, _mm_set1_epi8(-1)));
    return !(_mm_movemask_epi8(odd) & 0xff); /* (bytes 8-15 of the codes loaded are zeros) */
}

static inline __attribute__((always_inline)) float fp4_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 bytes q of one block (stored order) -> its even and its odd
 * elements. */
static inline __attribute__((always_inline)) void fp4_split(__m256i q, __m128i *even, __m128i *odd) {
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i s0 = _mm_shuffle_epi8(_mm256_castsi256_si128(q), split);
    const __m128i s1 = _mm_shuffle_epi8(_mm256_extracti128_si256(q, 1), split);
    *even = _mm_unpacklo_epi64(s0, s1), *odd = _mm_unpackhi_epi64(s0, s1);
}

/* Block h (0: b, 1: b + 1) of a pair into the copy: its magnitudes mag
 * (stored order) among the pair's 64 at u, its signs (neg: 0xFF where the
 * input is negative, stored order) among the pair's 32 sign bytes at s. */
static inline __attribute__((always_inline)) void fp4_store_mags(uint8_t *u, __m256i mag, int h) {
    __m128i even, odd;
    fp4_split(mag, &even, &odd);
    _mm_storeu_si128((__m128i *)(u + 16 * h), even);
    _mm_storeu_si128((__m128i *)(u + 32 + 16 * h), odd);
}

static inline __attribute__((always_inline)) void fp4_store_signs(uint8_t *s, __m256i neg, int h) {
    __m128i even, odd;
    fp4_split(neg, &even, &odd);
    _mm_storeu_si128((__m128i *)(s + 16 * h),
                     _mm_or_si128(_mm_and_si128(even, _mm_set1_epi8(0x08)), _mm_and_si128(odd, _mm_set1_epi8((char)0x80))));
}

/* Loads a block of 32 inputs into v; returns 0 where one is NaN or
 * infinite, else 1 with the largest magnitude in *amax (the byte copies
 * quantize blocks by it). */
static inline __attribute__((always_inline)) int block_amax(const float *x, __m256 v[4], float *amax) {
    __m256 a = _mm256_setzero_ps(), bad = a;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        a = _mm256_max_ps(a, _mm256_and_ps(v[i], abs_mask));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v[i], v[i]), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    }
    if (_mm256_movemask_ps(bad)) return 0;
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    *amax = _mm_cvtss_f32(m);
    return 1;
}

/* 2^t as two factors whose product it is exactly: 2^t itself overflows
 * fp32 for the t of the smallest shared exponents. */
static inline __attribute__((always_inline)) void pow2_factors(int t, __m256 *f1, __m256 *f2) {
    const int t1 = t < 127 ? t : 127;
    *f1 = _mm256_set1_ps(ldexpf(1.0f, t1)), *f2 = _mm256_set1_ps(ldexpf(1.0f, t - t1));
}

#endif
