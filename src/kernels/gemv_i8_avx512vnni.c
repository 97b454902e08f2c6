/* AVX-512 VNNI integer GEMV for MXINT8 inputs against MXFP4 and MXINT8
 * weights: the decode path of the W4A8i linears where the CPU has
 * AVX512_VNNI. Rows of other lengths (MXFP4: K % 128 != 0, MXINT8: K % 256
 * != 0) take the AVX2 kernel (gemv_i8_avx2.c), whose arithmetic this one
 * shares: exact integer block sums, one fp32 factor per block; for MXFP4
 * the input's signs XORed onto the packed E2M1 weights and a table of twice
 * the E2M1 values.
 *
 * Why: from DRAM one thread decoded at 11.8 GB/s against a 14.9 GB/s read,
 * and its arithmetic alone ran at 19.9 GB/s from L2: the loads and the
 * arithmetic overlap only in part, so the arithmetic's time shows. Here
 * one VPDPBUSD multiplies 64 input bytes by 64 weight codes and adds them
 * in fours to 16 int32 sums, where AVX2 needs a VPMADDUBSW, a 16-bit add
 * and a VPMADDWD for half as many; and 16 blocks' sums leave their lanes
 * together (two levels of unpacks) to be converted and scaled once.
 *
 * MXFP4: a group is 4 blocks, 64 weight bytes: block i's 16 bytes in
 * 128-bit lane i, its 16 even elements in the low nibbles. MXINT8: VPDPBUSD
 * wants one unsigned operand, and AVX-512 has no VPSIGNB to move the
 * weight's sign onto the input as AVX2 does; so the weight codes are offset
 * by 128 (an XOR) and the sum over (w + 128) a is corrected by 128 times the
 * input block's sum, made with the input copy: exact, as
 * 32 * 255 * 127 < 2^24. A group is 8 blocks, 4 vectors of 2. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")
#include <immintrin.h>
#include <stdint.h>

#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))

/* Input copy layout for K elements. For MXFP4 weights (K % 128 == 0):
 *   ua[K]: per group (128 elements) |a| of the 4 blocks' even elements
 *          (block i's at 16 i), then of their odd ones;
 *   sx[K/2]: sign masks as the AVX2 copy's: byte j has bit 3 / bit 7 set
 *          where the input element in weight byte j's low / high nibble is
 *          negative;
 *   fg[nb rounded up to 16] floats: per 16 blocks, the blocks' factors
 *          2^(shared - 6) times the table's constant, in the order their
 *          sums leave the lanes (lane 4 i + m: block 4 m + i), 0 past the
 *          last block.
 * At most 1.5 K + 4 (K / 32 + 15) bytes. For MXINT8 weights (K % 256 == 0):
 *   a[K]: the input codes, stored order;
 *   fg[K/16] floats: per 8 blocks, 16 lanes: the factors times the table's
 *          constant for blocks 0, 2, 4, 6, then 4 zeros, blocks 1, 3, 5, 7,
 *          4 zeros (row_int8's lane order);
 *   corr[K/16] floats: 128 times the blocks' sums of codes, in that order.
 * 1.5 K bytes. */
static int fits(int K, q3_dtype wt) { return wt == Q3_MXFP4 ? K % 128 == 0 : wt == Q3_MXINT8 && K % 256 == 0; }

static float *fg_of(const void *xq, int K, q3_dtype wt) {
    return (float *)((uint8_t *)xq + (size_t)K + (wt == Q3_MXFP4 ? (size_t)K / 2 : 0));
}

/* The lane of row_int8's sums holding block j (0 .. 7) of its group. */
static int int8_lane(int j) { return j % 2 * 8 + j / 2; }

static void prep_int8(void *xq, const float *x, int K) {
    int8_t *a = xq;
    float *fg = fg_of(xq, K, Q3_MXINT8), *corr = fg + K / 16;
    const float c = q3_mx_scale_table(Q3_MXINT8)[127];
    for (int g = 0; g < K / 256; g++)
        for (int i = 0; i < 16; i++) fg[16 * g + i] = corr[16 * g + i] = 0.0f;
    for (int b = 0; b < K / 32; b++) {
        const float f = q3_avx2_i8_quant_block(x + (size_t)b * 32, a + (size_t)b * 32);
        int sum = 0;
        for (int i = 0; i < 32; i++) sum += a[(size_t)b * 32 + i];
        const int at = b / 8 * 16 + int8_lane(b % 8);
        fg[at] = f * c, corr[at] = 128.0f * (float)sum;
    }
}

/* The MXFP4 copy: |a| and the sign masks (ua, sx above), or (offset) a +
 * 128 as unsigned bytes in ua's place and no sign masks, for
 * q3_avx512vnni_gemv_i8_tokens; fg the same in both. */
static void prep_fp4(void *xq, const float *x, int K, int offset) {
    uint8_t *ua = xq, *sx = ua + K;
    float *fg = fg_of(xq, K, Q3_MXFP4);
    const int nb = K / 32, nbr = (nb + 15) / 16 * 16;
    const float half = q3_mx_scale_table(Q3_MXFP4)[127];
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), flip = _mm_set1_epi8((char)0x80);
    for (int b = 0; b < nbr; b++) {
        float f = 0.0f;
        if (b < nb) {
            int8_t q[32];
            f = q3_avx2_i8_quant_block(x + (size_t)b * 32, q) * half;
            const __m128i s0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)q), split);
            const __m128i s1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 16)), split);
            const __m128i even = _mm_unpacklo_epi64(s0, s1), odd = _mm_unpackhi_epi64(s0, s1);
            uint8_t *u = ua + (size_t)(b / 4) * 128 + (size_t)(b % 4) * 16;
            if (offset) { /* a + 128: the sign bit flipped */
                _mm_storeu_si128((__m128i *)u, _mm_xor_si128(even, flip));
                _mm_storeu_si128((__m128i *)(u + 64), _mm_xor_si128(odd, flip));
            } else {
                _mm_storeu_si128((__m128i *)u, _mm_abs_epi8(even));
                _mm_storeu_si128((__m128i *)(u + 64), _mm_abs_epi8(odd));
                const __m128i neg_e = _mm_cmpgt_epi8(_mm_setzero_si128(), even), neg_o = _mm_cmpgt_epi8(_mm_setzero_si128(), odd);
                _mm_storeu_si128((__m128i *)(sx + (size_t)b * 16), _mm_or_si128(_mm_and_si128(neg_e, _mm_set1_epi8(0x08)),
                                                                                _mm_and_si128(neg_o, _mm_set1_epi8((char)0x80))));
            }
        }
        const int s = b / 16 * 16, m = (b - s) / 4, i = (b - s) % 4;
        fg[s + 4 * i + m] = f;
    }
}

void q3_avx512vnni_i8_prep(void *xq, const float *x, int K, q3_dtype wt) {
    if (!fits(K, wt)) q3_avx2_i8_prep(xq, x, K, wt);
    else if (wt == Q3_MXINT8) prep_int8(xq, x, K);
    else prep_fp4(xq, x, K, 0);
}

void q3_avx512vnni_i8_prep_tokens(void *xq, const float *x, int K) { prep_fp4(xq, x, K, 1); }

/* One group: 16 int32 sums, 4 per block (lane 4 i + j: block i), of the
 * products of the weight bytes at e (signs XORed with sx's) with |a|. */
INLINE __m512i group_dot(const uint8_t *e, const uint8_t *s, const uint8_t *u, __m512i lut) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i x = _mm512_xor_si512(_mm512_loadu_si512(e), _mm512_loadu_si512(s));
    const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(x, m4));
    const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
    const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(u), lo);
    return _mm512_dpbusd_epi32(d, _mm512_loadu_si512(u + 64), hi);
}

/* Four groups' sums (16 blocks) reduced to one per block, lane 4 i + m
 * holding block 4 m + i, as fp32 (exact: at most 32 * 12 * 127 each). */
INLINE __m512 block_sums(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    const __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
    return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b)));
}

/* The scale codes of up to 16 blocks at sc (n of them; 127 past n) in the
 * sums' lane order. */
INLINE __m128i codes_of(const uint8_t *sc, int n) {
    const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __mmask16 m = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
    return _mm_shuffle_epi8(_mm_mask_loadu_epi8(_mm_set1_epi8(127), m, sc), order);
}

/* The weight factors of 16 lanes from their scale codes: 2^(code - 127)
 * as exponent fields times fg (codes 1 .. 254), or (exact_codes) the
 * table's entries times fg over the table's constant. */
INLINE __m512 weight_factors(__m128i codes, const float *fg, const float *wtab, const int exact_codes) {
    const __m512i c32 = _mm512_cvtepu8_epi32(codes);
    if (exact_codes)
        return _mm512_mul_ps(_mm512_i32gather_ps(c32, wtab, 4), _mm512_mul_ps(_mm512_loadu_ps(fg), _mm512_set1_ps(1.0f / wtab[127])));
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(c32, 23)), _mm512_loadu_ps(fg));
}

/* Rows with codes 0 or 255 seen in the bytes lo / hi cover (n of them). */
INLINE int odd_codes(__m128i lo, __m128i hi, int n) {
    const __m128i odd = _mm_or_si128(_mm_cmpeq_epi8(lo, _mm_setzero_si128()), _mm_cmpeq_epi8(hi, _mm_set1_epi8(-1)));
    return _mm_movemask_epi8(odd) & ((1 << n) - 1);
}

/* A row: 16 blocks at a time (fewer at its end, the missing groups zero).
 * exact_codes 0: the weight factors 2^(code - 127) from the codes as
 * exponent fields, which holds for codes 1 .. 254; the row's least and
 * greatest code go to *lo / *hi. 1: the factors from the table (codes 0
 * and 255 too). */
INLINE float row_fp4(const uint8_t *el, const uint8_t *sc, int nb, const uint8_t *ua, const uint8_t *sx, const float *fg,
                     const float *wtab, size_t pf, __m128i *lo, __m128i *hi, const int exact_codes, const int l2) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q3_e2m1_x2));
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 16) {
        const int ng = nb - b >= 16 ? 4 : (nb - b) / 4;
        __m512i v[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const size_t k = (size_t)(b + 4 * g) * 32; /* the group's first element */
            if (g < ng) {
                if (!exact_codes) q3_pf_line((const char *)el + k / 2 + pf, l2);
                v[g] = group_dot(el + k / 2, sx + k / 2, ua + k, lut);
            } else {
                v[g] = _mm512_setzero_si512();
            }
        }
        const __m128i codes = codes_of(sc + b, nb - b);
        if (!exact_codes) *lo = _mm_min_epu8(*lo, codes), *hi = _mm_max_epu8(*hi, codes);
        acc = _mm512_fmadd_ps(block_sums(v[0], v[1], v[2], v[3]), weight_factors(codes, fg + b, wtab, exact_codes), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* An MXINT8 row, 8 blocks (4 vectors) at a time: per vector the sums of
 * (w + 128) a in 4s, 8 lanes per block; the 4 vectors' lanes reduced as in
 * block_sums, then the two halves of each block (128-bit lanes 2 j and
 * 2 j + 1) added: lane int8_lane(j) holds block j, lanes 4-7 and 12-15
 * copies (their factors are zero). */
INLINE float row_int8(const uint8_t *el, const uint8_t *sc, int nb, const int8_t *a, const float *fg, const float *corr,
                      const float *wtab, size_t pf, __m128i *lo, __m128i *hi, const int exact_codes, const int l2) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, -1, -1, -1, -1, 1, 3, 5, 7, -1, -1, -1, -1);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 8) {
        __m512i v[4];
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            const size_t k = (size_t)(b + 2 * m) * 32;
            if (!exact_codes) q3_pf_line((const char *)el + k + pf, l2);
            v[m] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(_mm512_loadu_si512(el + k), flip),
                                       _mm512_loadu_si512(a + k));
        }
        const __m512i p = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
        const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
        const __m512i r = _mm512_add_epi32(_mm512_unpacklo_epi64(p, q), _mm512_unpackhi_epi64(p, q));
        const __m512i t = _mm512_add_epi32(r, _mm512_shuffle_i32x4(r, r, _MM_SHUFFLE(2, 3, 0, 1)));
        const __m512 sums = _mm512_sub_ps(_mm512_cvtepi32_ps(t), _mm512_loadu_ps(corr + 2 * b));
        const __m128i raw = _mm_loadl_epi64((const __m128i *)(sc + b));
        if (!exact_codes) *lo = _mm_min_epu8(*lo, raw), *hi = _mm_max_epu8(*hi, raw);
        acc = _mm512_fmadd_ps(sums, weight_factors(_mm_shuffle_epi8(raw, order), fg + 2 * b, wtab, exact_codes), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* An MXFP4 row against TB (1 .. 4) tokens' offset copies (xq, xs bytes
 * apart), the row's codes decoded once for all of them: VPDPBUSD wants an
 * unsigned operand, so each token's bytes are a + 128, and each lane
 * starts from minus 128 times its weights' sum, which leaves the sum of
 * a * w exact: the same integer block sums as row_fp4's, scaled and added
 * in the same order, so each token's result is bit for bit the GEMV's.
 * out[t * ldo] for t < TB. (The one-token GEMV keeps row_fp4: its sign XOR
 * is one operation per group, where this form adds two VPDPBUSD and a
 * subtraction, worth it only when several tokens share them.) */
INLINE void row_fp4_tokens(float *out, size_t ldo, const uint8_t *el, const uint8_t *sc, int nb, const uint8_t *xq, size_t xs,
                           const float *wtab, size_t pf, __m128i *lo, __m128i *hi, const int TB, const int exact_codes,
                           const int l2) {
    const int K = nb * 32;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q3_e2m1_x2));
    const __m512i m4 = _mm512_set1_epi8(0x0f), c128 = _mm512_set1_epi8((char)0x80);
    __m512 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 16) {
        const int ng = nb - b >= 16 ? 4 : (nb - b) / 4;
        __m512i v[4][4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const size_t k = (size_t)(b + 4 * g) * 32;
            if (g < ng) {
                if (!exact_codes) q3_pf_line((const char *)el + k / 2 + pf, l2);
                const __m512i x = _mm512_loadu_si512(el + k / 2);
                const __m512i wl = _mm512_shuffle_epi8(lut, _mm512_and_si512(x, m4));
                const __m512i wh = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
                const __m512i w128 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, wl), c128, wh);
                const __m512i base = _mm512_sub_epi32(_mm512_setzero_si512(), w128);
#pragma GCC unroll 4
                for (int t = 0; t < TB; t++) {
                    const uint8_t *u = xq + (size_t)t * xs + k;
                    v[t][g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(base, _mm512_loadu_si512(u), wl), _mm512_loadu_si512(u + 64), wh);
                }
            } else {
#pragma GCC unroll 4
                for (int t = 0; t < TB; t++) v[t][g] = _mm512_setzero_si512();
            }
        }
        const __m128i codes = codes_of(sc + b, nb - b);
        if (!exact_codes) *lo = _mm_min_epu8(*lo, codes), *hi = _mm_max_epu8(*hi, codes);
#pragma GCC unroll 4
        for (int t = 0; t < TB; t++) {
            const float *fg = fg_of(xq + (size_t)t * xs, K, Q3_MXFP4);
            acc[t] = _mm512_fmadd_ps(block_sums(v[t][0], v[t][1], v[t][2], v[t][3]), weight_factors(codes, fg + b, wtab, exact_codes),
                                     acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) out[(size_t)t * ldo] = _mm512_reduce_add_ps(acc[t]);
}

INLINE void row_tokens(float *out, size_t ldo, const uint8_t *e, const uint8_t *s, int nb, const uint8_t *xq, size_t xs,
                       const float *wtab, size_t pf, const int TB, const int l2) {
    __m128i lo = _mm_set1_epi8(-1), hi = _mm_setzero_si128();
    row_fp4_tokens(out, ldo, e, s, nb, xq, xs, wtab, pf, &lo, &hi, TB, 0, l2);
    if (odd_codes(lo, hi, 16)) row_fp4_tokens(out, ldo, e, s, nb, xq, xs, wtab, pf, &lo, &hi, TB, 1, l2);
}

void q3_avx512vnni_gemv_i8_tokens(float *out, size_t ldo, const void *xq, size_t xs, int T, const q3_mat *W, int r0, int r1) {
    const int K = W->cols, nb = K / 32;
    const size_t eb = q3_mx_elem_bytes(Q3_MXFP4, (size_t)K), pf = Q3_PF_WEIGHTS, spf = q3_pf_scales((size_t)nb);
    const float *wtab = q3_mx_scale_table(Q3_MXFP4);
    const uint8_t *el = W->data, *sc = W->scales;
    const int l2 = q3_pf_to_l2; /* a runtime test: 1-4 tokens share each prefetch */
    /* Token blocks outside, as gemv_mx_avx512.c's: a block's copies stay in L1 while the rows pass. */
    for (int t0 = 0; t0 < T; t0 += 4)
        for (int r = r0; r < r1; r++) {
            const uint8_t *e = el + (size_t)r * eb, *s = sc + (size_t)r * nb;
            q3_pf_line((const char *)s + spf, l2);
            const uint8_t *x0 = (const uint8_t *)xq + (size_t)t0 * xs;
            float *o = out + (size_t)t0 * ldo + (r - r0);
            switch (T - t0 < 4 ? T - t0 : 4) {
            case 1: row_tokens(o, ldo, e, s, nb, x0, xs, wtab, pf, 1, l2); break;
            case 2: row_tokens(o, ldo, e, s, nb, x0, xs, wtab, pf, 2, l2); break;
            case 3: row_tokens(o, ldo, e, s, nb, x0, xs, wtab, pf, 3, l2); break;
            default: row_tokens(o, ldo, e, s, nb, x0, xs, wtab, pf, 4, l2); break;
            }
        }
}

/* l2: the prefetch level (prefetch.h). */
INLINE void gemv_i8(float *out, const void *xq, const q3_mat *W, int r0, int r1, const int l2) {
    const int K = W->cols, nb = K / 32, fp4 = W->dtype == Q3_MXFP4;
    const size_t eb = q3_mx_elem_bytes(W->dtype, (size_t)K);
    const float *wtab = q3_mx_scale_table(W->dtype), *fg = fg_of(xq, K, W->dtype);
    const uint8_t *el = W->data, *sc = W->scales, *ua = xq, *sx = ua + K;
    const size_t pf = Q3_PF_WEIGHTS, spf = q3_pf_scales((size_t)nb);
    for (int r = r0; r < r1; r++) {
        const uint8_t *e = el + (size_t)r * eb, *s = sc + (size_t)r * nb;
        q3_pf_line((const char *)s + spf, l2);
        __m128i lo = _mm_set1_epi8(-1), hi = _mm_setzero_si128();
        /* a second pass for codes 0 and 255 (not normal floats), as the table has them */
        if (fp4) {
            out[r - r0] = row_fp4(e, s, nb, ua, sx, fg, wtab, pf, &lo, &hi, 0, l2);
            if (odd_codes(lo, hi, 16)) out[r - r0] = row_fp4(e, s, nb, ua, sx, fg, wtab, pf, &lo, &hi, 1, l2);
        } else {
            const int8_t *a = xq;
            const float *corr = fg + K / 16;
            out[r - r0] = row_int8(e, s, nb, a, fg, corr, wtab, pf, &lo, &hi, 0, l2);
            if (odd_codes(lo, hi, 8)) out[r - r0] = row_int8(e, s, nb, a, fg, corr, wtab, pf, &lo, &hi, 1, l2);
        }
    }
}

void q3_avx512vnni_gemv_i8(float *out, const void *xq, const q3_mat *W, int r0, int r1) {
    if (!fits(W->cols, W->dtype)) q3_avx2_gemv_i8(out, xq, W, r0, r1);
    else if (q3_pf_to_l2) gemv_i8(out, xq, W, r0, r1, 1);
    else gemv_i8(out, xq, W, r0, r1, 0);
}
#pragma GCC pop_options
