/* AVX2 integer GEMV for MXFP8 inputs against MXFP4 weights: the decode
 * path of the W4A8 scheme's expert and MLP linears in the AVX2 table.
 *
 * Why integers, and why exactly: an MXFP8 block is 32 E4M3 values times
 * 2^s, and every E4M3 value is a multiple of 2^-9 below 2^9. So each
 * element is v * 2^(s - 9) with v an integer, |v| < 2^18, and v splits
 * into two bytes and two bits: |v| = 1024 hi + 4 lo + r. Against twice the
 * E2M1 weights (integers, at most 12 in magnitude), each part is a
 * VPMADDUBSW product as for MXINT8 inputs (fp4_int_avx2.h), and 1024 hi +
 * 4 lo + r summed over a block is exact in 32 bits (at most 32 * 12 * 2^18
 * < 2^27). The block sum of the MXFP8 x MXFP4 products is therefore exact,
 * rounded once when converted to fp32 and scaled by the two blocks' powers
 * of two, as the integer GEMV for MXINT8 inputs scales its sums. The fp32
 * kernel it replaces (gemv_mx_avx2.c) decodes each weight to fp32 and
 * spends an FMA per product: about 27 vector operations per 64 weights
 * against 20 here, 5 of them integer multiplies. On the Zen 4 of
 * BENCHMARKS.md, kernel_bench mx, 2 threads, against that kernel in the
 * same run: 1536 x 2048 from L2 29.6-40.5 -> 53.9-62.4 G elements/s,
 * 65536 x 2048 from DRAM 34.3-41.7 -> 61.2-62.9; q30b8 W4A8 decode with
 * Q3MOE_ISA=avx2 22.3-23.7 -> 20.7-20.9 ms.
 *
 * r is nonzero only for elements below 2^-4 in E4M3 units, at least 2^12
 * times smaller than the block's largest (256 to 448): a group of 8
 * blocks without one skips that plane, and a copy without any uses a loop
 * without it. (In q30b8's decode, 5 % of the gate/up inputs' groups hold
 * some r, 48 % of the down projections': SwiGLU outputs have many near
 * zero.)
 *
 * Inputs that are not MXFP8 (the model quantizes every A8 linear's input;
 * the table's contract, isa.h) are rounded to the nearest such integer: 18
 * bits, finer than MXFP8 itself. */
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

/* The input copy for K elements (K % 64 == 0), in this order: the three
 * planes hi, lo and r (K bytes each, fp4_int_avx2.h's order), the sign
 * masks (K / 2 bytes), fs (K / 32 floats: 2^(s - 9) per block, NaN where
 * the block holds NaN or infinity), fg (K / 32 floats: per 8 blocks, fs
 * times the weight table's constant in FP4_GROUP_ORDER), one byte per 256
 * elements (nonzero where r is) and one for the whole copy. 3.75 K + K /
 * 256 + 2 bytes, within the 4 K of an fp32 copy. */
typedef struct {
    uint8_t *hi, *lo, *r, *sx, *group_r, *any_r;
    float *fs, *fg;
} a8_copy;

static a8_copy copy_of(void *xb, int K) {
    uint8_t *p = xb;
    const size_t k = (size_t)K, groups = (k + 255) / 256;
    uint8_t *f = p + 3 * k + k / 2;
    const a8_copy c = {p, p + k, p + 2 * k, p + 3 * k, f + k / 4, f + k / 4 + groups, (float *)f, (float *)(f + k / 8)};
    return c;
}

/* 32 int32 in [0, 255] -> 32 bytes in order (the packs interleave 128-bit
 * lanes; one permute puts them back). */
INLINE __m256i bytes_of(const __m256i w[4]) {
    const __m256i p16a = _mm256_packus_epi32(w[0], w[1]), p16b = _mm256_packus_epi32(w[2], w[3]);
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One input block: the planes of |v| (hi, lo, r) and the sign bytes, in
 * stored order; returns 2^(s - 9), or NaN (planes zero) where the block
 * holds NaN or infinity. s is the MXFP8 shared exponent of the block
 * (mx.h's rule), so an MXFP8 block gives back its own E4M3 values. */
static float quant_block(const float *x, __m256i plane[3], __m256i *neg) {
    __m256 v[4], f1, f2;
    float amax;
    if (!block_amax(x, v, &amax)) {
        plane[0] = plane[1] = plane[2] = *neg = _mm256_setzero_si256();
        return NAN;
    }
    const int s = q3_mx_shared_exp(Q3_MXFP8, amax);
    pow2_factors(9 - s, &f1, &f2); /* |x| * 2^(9 - s), exactly */
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 top = _mm256_set1_ps(262143.0f); /* 2^18 - 1: a rounded non-MXFP8 maximum stays in the planes */
    __m256i w[3][4], n[4];
    for (int i = 0; i < 4; i++) {
        const __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_and_ps(v[i], abs_mask), f1), f2);
        const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), top));
        w[0][i] = _mm256_srli_epi32(q, 10);
        w[1][i] = _mm256_and_si256(_mm256_srli_epi32(q, 2), _mm256_set1_epi32(255));
        w[2][i] = _mm256_and_si256(q, _mm256_set1_epi32(3));
        n[i] = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v[i], _mm256_setzero_ps(), _CMP_LT_OQ)), _mm256_set1_epi32(255));
    }
    for (int p = 0; p < 3; p++) plane[p] = bytes_of(w[p]);
    *neg = bytes_of(n);
    return ldexpf(1.0f, s - 9);
}

void q3_avx2_a8_prep(void *xb, const float *x, int K, q3_dtype wt) {
    if (wt != Q3_MXFP4) {
        q3_avx2_mx_prep(xb, x, K, wt);
        return;
    }
    const a8_copy c = copy_of(xb, K);
    __m256i any = _mm256_setzero_si256();
    *c.any_r = 0;
    for (int k = 0; k < K; k += 64) {
        for (int h = 0; h < 2; h++) {
            __m256i plane[3], neg;
            c.fs[k / 32 + h] = quant_block(x + k + 32 * h, plane, &neg);
            fp4_store_mags(c.hi + k, plane[0], h);
            fp4_store_mags(c.lo + k, plane[1], h);
            fp4_store_mags(c.r + k, plane[2], h);
            fp4_store_signs(c.sx + k / 2, neg, h);
            any = _mm256_or_si256(any, plane[2]);
        }
        if (k % 256 == 192 || k + 64 == K) {
            c.group_r[k / 256] = !_mm256_testz_si256(any, any);
            *c.any_r |= c.group_r[k / 256];
            any = _mm256_setzero_si256();
        }
    }
    const float half = q3_mx_scale_table(Q3_MXFP4)[127];
    for (int g = 0; g + 8 <= K / 32; g += 8)
        for (int i = 0; i < 8; i++) c.fg[g + i] = c.fs[g + FP4_GROUP_ORDER[i]] * half;
}

/* Blocks b and b + 1 (the weight bytes at e, those blocks' step of the
 * copy at offset k = 32 b): their sums of 8 products (lanes 0-3 block b,
 * 4-7 block b + 1) as int32, the r plane where R. */
INLINE __m256i step_sums(const uint8_t *e, const a8_copy *c, size_t k, __m256i lut, const int R) {
    __m256i lo, hi;
    fp4_decode(fp4_signed(e, c->sx + k / 2), lut, &lo, &hi);
    __m256i d = _mm256_add_epi32(_mm256_madd_epi16(fp4_products(lo, hi, c->hi + k), _mm256_set1_epi16(1024)),
                                 _mm256_madd_epi16(fp4_products(lo, hi, c->lo + k), _mm256_set1_epi16(4)));
    if (R) d = _mm256_add_epi32(d, _mm256_madd_epi16(fp4_products(lo, hi, c->r + k), _mm256_set1_epi16(1)));
    return d;
}

/* A whole row a step (2 blocks) at a time, each block's factor from the
 * table (codes 0 and 255 included). */
INLINE float row_steps(const uint8_t *el, const uint8_t *sc, int nb, const a8_copy *c, const float *wtab, __m256i lut,
                       size_t pf, const int R, const int l2) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (int b = 0; b < nb; b += 2) {
        if (!(b & 3)) q3_pf_line((const char *)el + (size_t)b * 16 + pf, l2);
        const __m256 d = _mm256_cvtepi32_ps(step_sums(el + (size_t)b * 16, c, (size_t)b * 32, lut, R));
        const __m256 f = _mm256_set_m128(_mm_set1_ps(wtab[sc[b + 1]] * c->fs[b + 1]), _mm_set1_ps(wtab[sc[b]] * c->fs[b]));
        if (b & 2) acc1 = _mm256_fmadd_ps(d, f, acc1);
        else acc0 = _mm256_fmadd_ps(d, f, acc0);
    }
    return fp4_hsum(_mm256_add_ps(acc0, acc1));
}

/* A row 8 blocks at a time (the tail a step at a time): the group's 8
 * block sums leave their lanes together and are converted and scaled once
 * (as gemv_i8_avx2.c's row_fp4_grouped). R: the copy has an r plane,
 * added where the group uses it. Returns 0 (out unset) for a row with
 * scale codes 0 or 255, which row_steps then computes. */
INLINE int row_grouped(float *out, const uint8_t *el, const uint8_t *sc, int nb, const a8_copy *c, const float *wtab,
                       __m256i lut, size_t pf, const int R, const int l2) {
    __m256 acc = _mm256_setzero_ps();
    __m128i lo_code = _mm_set1_epi8(-1), hi_code = _mm_setzero_si128();
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *e = el + (size_t)b * 16;
        q3_pf_line((const char *)e + pf, l2);
        q3_pf_line((const char *)e + 64 + pf, l2);
        const size_t k = (size_t)b * 32;
        __m256i lo[4], hi[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) fp4_decode(fp4_signed(e + 32 * i, c->sx + k / 2 + 32 * i), lut, &lo[i], &hi[i]);
/* steps I and I + 1 of plane P, times F */
#define PAIR(P, I, F)                                                                        \
    fp4_pair_sums(fp4_products(lo[I], hi[I], c->P + k + 64 * (I)),                          \
                  fp4_products(lo[I + 1], hi[I + 1], c->P + k + 64 * (I + 1)), F)
        __m256i s01 = _mm256_add_epi32(PAIR(hi, 0, 1024), PAIR(lo, 0, 4));
        __m256i s23 = _mm256_add_epi32(PAIR(hi, 2, 1024), PAIR(lo, 2, 4));
        if (R && c->group_r[b / 8]) s01 = _mm256_add_epi32(s01, PAIR(r, 0, 1)), s23 = _mm256_add_epi32(s23, PAIR(r, 2, 1));
#undef PAIR
        const __m256 f = fp4_group_factors(sc + b, c->fg + b, &lo_code, &hi_code);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fp4_group_sums(s01, s23)), f, acc);
    }
    if (!fp4_codes_normal(lo_code, hi_code)) return 0;
    for (; b < nb; b += 2) {
        const __m256 d = _mm256_cvtepi32_ps(step_sums(el + (size_t)b * 16, c, (size_t)b * 32, lut, R));
        const __m256 f = _mm256_set_m128(_mm_set1_ps(wtab[sc[b + 1]] * c->fs[b + 1]), _mm_set1_ps(wtab[sc[b]] * c->fs[b]));
        acc = _mm256_fmadd_ps(d, f, acc);
    }
    *out = fp4_hsum(acc);
    return 1;
}

INLINE void gemv_rows(float *out, const a8_copy *c, const q3_mat *W, int r0, int r1, const int R, const int l2) {
    const int K = W->cols, nb = K / 32;
    const size_t eb = (size_t)K / 2, pf = Q3_PF_WEIGHTS, spf = q3_pf_scales((size_t)nb);
    const float *wtab = q3_mx_scale_table(Q3_MXFP4);
    const __m256i lut = fp4_lut();
    for (int r = r0; r < r1; r++) {
        const uint8_t *e = (const uint8_t *)W->data + (size_t)r * eb, *s = W->scales + (size_t)r * nb;
        q3_pf_line((const char *)s + spf, l2);
        if (!row_grouped(&out[r - r0], e, s, nb, c, wtab, lut, pf, R, l2)) out[r - r0] = row_steps(e, s, nb, c, wtab, lut, pf, R, l2);
    }
}

void q3_avx2_gemv_a8(float *out, const void *xb, const q3_mat *W, int r0, int r1) {
    if (W->dtype != Q3_MXFP4) {
        q3_avx2_gemv_mx(out, xb, W, r0, r1);
        return;
    }
    const a8_copy c = copy_of((void *)xb, W->cols);
    const int R = *c.any_r != 0;
    if (q3_pf_to_l2 && R) gemv_rows(out, &c, W, r0, r1, 1, 1);
    else if (q3_pf_to_l2) gemv_rows(out, &c, W, r0, r1, 0, 1);
    else if (R) gemv_rows(out, &c, W, r0, r1, 1, 0);
    else gemv_rows(out, &c, W, r0, r1, 0, 0);
}
#pragma GCC pop_options
