/* AVX-512 GEMV for MXFP8 and MXFP4 weights against fp32 inputs
 * (weight-only MX and the A8 linears of the float schemes) on CPUs without
 * AVX-512 BF16: gemv_mx_avx2.c's decoders on whole 512-bit vectors, 64
 * E4M3 codes (two blocks) or 128 E2M1 codes (four) at a time, with the
 * input copy permuted to the order they leave the elements in
 * (q3_mx_prep_copy with 4 lanes). Rows of other lengths (MXFP8: K % 64 !=
 * 0, MXFP4: K % 128 != 0) take the AVX2 kernel and its copy.
 *
 * E4M3: byte b moved to the top of a 16-bit word, shifted right 4
 * (arithmetic) and masked holds the sign at bit 15 and the 7 magnitude bits
 * at 10..4; as the top half of an fp32 that is the E4M3 value times 2^-120,
 * subnormals included (the scale table takes the 2^120 back). E2M1: the
 * nibbles index lookups of the bf16 bytes of twice each value. Either way
 * each 128-bit lane of the decoded vectors holds one block's elements
 * (MXFP8: two lanes per block). The 16-bit shifts and byte shuffles need
 * AVX512BW: q3_avx512bw_mx_kernels puts these in the table where the CPU
 * has it. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx2,fma")
#include <immintrin.h>
#include <stdint.h>

#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))

void q3_avx512_mx_prep(void *xbv, const float *x, int K, q3_dtype wt) {
    if (!q3_mx_wide_fits(wt, K)) {
        q3_avx2_mx_prep(xbv, x, K, wt);
        return;
    }
    q3_mx_prep_copy(xbv, x, K, wt, 4);
}

/* bf16 words -> fp32, each word the top half of a dword. */
INLINE void words_to_f32(__m512i w0, __m512i w1, __m512 f[4]) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    f[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
    f[1] = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
    f[2] = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    f[3] = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
}

/* gemv_mx_avx2.c's E2M1 byte tables in all four 128-bit lanes. */
INLINE void fp4_luts(__m512i *hi, __m512i *lo) {
    *hi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q3_avx2_fp4_bf16_bytes(1)));
    *lo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q3_avx2_fp4_bf16_bytes(0)));
}

/* Four blocks of E2M1 codes (64 bytes; 128-bit lane l holds block l) ->
 * eight vectors of fp32 (twice the values), as gemv_mx_avx2.c's fp4x64
 * does for two: the nibbles index lookups of the bf16 bytes. */
INLINE void fp4x128(const uint8_t *p, __m512i lut_hi, __m512i lut_lo, __m512 f[8]) {
    const __m512i b = _mm512_loadu_si512(p), m4 = _mm512_set1_epi8(0x0f);
    const __m512i i0 = _mm512_and_si512(b, m4), i1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
    __m512i h = _mm512_shuffle_epi8(lut_hi, i0), l = _mm512_shuffle_epi8(lut_lo, i0);
    words_to_f32(_mm512_unpacklo_epi8(l, h), _mm512_unpackhi_epi8(l, h), f);
    h = _mm512_shuffle_epi8(lut_hi, i1), l = _mm512_shuffle_epi8(lut_lo, i1);
    words_to_f32(_mm512_unpacklo_epi8(l, h), _mm512_unpackhi_epi8(l, h), f + 4);
}

/* The factors of two MXFP8 blocks (lanes 0-7, 8-15) / four MXFP4 blocks
 * (lanes 4 l .. 4 l + 3). */
INLINE __m512 fp8_factors(const uint8_t *sc, const float *tab) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(tab[sc[0]]), 0xFF00, _mm_set_ss(tab[sc[1]]));
}

INLINE __m512 fp4_factors(const uint8_t *sc, const float *tab) {
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_setr_ps(tab[sc[0]], tab[sc[1]], tab[sc[2]], tab[sc[3]])));
}

/* 64 E4M3 codes -> four vectors of fp32 (times 2^-120), in the copy's order. */
INLINE void fp8x64(const uint8_t *p, __m512 f[4]) {
    const __m512i b = _mm512_loadu_si512(p), m = _mm512_set1_epi16((short)0x87F0), hi = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i w0 = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(b, 8), 4), m);
    const __m512i w1 = _mm512_and_si512(_mm512_srai_epi16(b, 4), m);
    f[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
    f[1] = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
    f[2] = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    f[3] = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
}

/* A row against TB (1 .. 4) tokens' copies (xb, xs floats apart): per
 * step, MXFP4 four blocks / MXFP8 two, decoded once for all the tokens;
 * per token two short product chains, then their sum times the blocks'
 * factors into one of two accumulators (alternate steps). The GEMV is TB
 * = 1, so each token's result is bit for bit the GEMV's. out[t * ldo]. */
INLINE void row_tokens(float *out, size_t ldo, const uint8_t *el, const uint8_t *sc, int nb, const float *xb, size_t xs,
                       const float *tab, __m512i lut_hi, __m512i lut_lo, size_t pf, const int fp4, const int TB) {
    const int step = fp4 ? 4 : 2, nv = 2 * step;
    __m512 acc0[4], acc1[4];
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) acc0[t] = acc1[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += step) {
        _mm_prefetch((const char *)el + (size_t)b * (fp4 ? 16 : 32) + pf, _MM_HINT_T0);
        __m512 f[8];
        if (fp4) fp4x128(el + (size_t)b * 16, lut_hi, lut_lo, f);
        else fp8x64(el + (size_t)b * 32, f);
        const __m512 s = fp4 ? fp4_factors(sc + b, tab) : fp8_factors(sc + b, tab);
#pragma GCC unroll 4
        for (int t = 0; t < TB; t++) {
            const float *x = xb + (size_t)t * xs + (size_t)b * 32;
            __m512 d0 = _mm512_mul_ps(f[0], _mm512_loadu_ps(x)), d1 = _mm512_mul_ps(f[1], _mm512_loadu_ps(x + 16));
#pragma GCC unroll 3
            for (int v = 2; v < nv; v += 2) {
                d0 = _mm512_fmadd_ps(f[v], _mm512_loadu_ps(x + 16 * v), d0);
                d1 = _mm512_fmadd_ps(f[v + 1], _mm512_loadu_ps(x + 16 * v + 16), d1);
            }
            if (b & step) acc1[t] = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), s, acc1[t]);
            else acc0[t] = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), s, acc0[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) out[(size_t)t * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
}

/* What every row of W needs: its elements and scales, prefetch distances,
 * the scale table and the E2M1 lookups. */
typedef struct {
    const uint8_t *el, *sc;
    size_t eb, pf, spf;
    int nb;
    const float *tab;
    __m512i lut_hi, lut_lo;
} mx_rows;

static mx_rows mx_rows_of(const q3_mat *W) {
    const int K = W->cols, nb = K / 32;
    const size_t eb = W->dtype == Q3_MXFP4 ? (size_t)K / 2 : (size_t)K;
    mx_rows m = {W->data, W->scales, eb, Q3_PF_WEIGHTS, q3_pf_scales((size_t)nb), nb, q3_mx_copy_scale_table(W->dtype), {0}, {0}};
    fp4_luts(&m.lut_hi, &m.lut_lo);
    return m;
}

/* Rows r0 .. r1 against one token: the GEMV, a loop of its own (through the
 * tokens pass's dispatch, decode ran 2-3 % slower). */
INLINE void gemv_rows(float *out, const float *xb, const mx_rows *m, int r0, int r1, const int fp4) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *s = m->sc + (size_t)r * m->nb;
        _mm_prefetch((const char *)s + m->spf, _MM_HINT_T0);
        row_tokens(out + (r - r0), 0, m->el + (size_t)r * m->eb, s, m->nb, xb, 0, m->tab, m->lut_hi, m->lut_lo, m->pf, fp4, 1);
    }
}

void q3_avx512_gemv_mx(float *out, const void *xbv, const q3_mat *W, int r0, int r1) {
    if (!q3_mx_wide_fits(W->dtype, W->cols)) {
        q3_avx2_gemv_mx(out, xbv, W, r0, r1);
        return;
    }
    const mx_rows m = mx_rows_of(W);
    if (W->dtype == Q3_MXFP4) gemv_rows(out, xbv, &m, r0, r1, 1);
    else gemv_rows(out, xbv, &m, r0, r1, 0);
}

void q3_avx512_gemv_mx_tokens(float *out, size_t ldo, const void *xbv, size_t xs, int T, const q3_mat *W, int r0, int r1) {
    const int fp4 = W->dtype == Q3_MXFP4;
    const size_t xf = xs / sizeof(float);
    const mx_rows m = mx_rows_of(W);
    /* Token blocks outside: a block's copies (4 x 8 KiB for K = 2048) stay
     * in L1 while the rows pass, which after the first block come from
     * cache (rows outside ran 83 against 129 GFLOP/s at 8 tokens). */
    for (int t0 = 0; t0 < T; t0 += 4)
        for (int r = r0; r < r1; r++) {
            const uint8_t *e = m.el + (size_t)r * m.eb, *s = m.sc + (size_t)r * m.nb;
            _mm_prefetch((const char *)s + m.spf, _MM_HINT_T0);
            const float *x0 = (const float *)xbv + (size_t)t0 * xf;
            float *o = out + (size_t)t0 * ldo + (r - r0);
#define ROW(FP4, TB) row_tokens(o, ldo, e, s, m.nb, x0, xf, m.tab, m.lut_hi, m.lut_lo, m.pf, FP4, TB)
            switch ((T - t0 < 4 ? T - t0 : 4) + (fp4 ? 0 : 4)) {
            case 1: ROW(1, 1); break;
            case 2: ROW(1, 2); break;
            case 3: ROW(1, 3); break;
            case 4: ROW(1, 4); break;
            case 5: ROW(0, 1); break;
            case 6: ROW(0, 2); break;
            case 7: ROW(0, 3); break;
            default: ROW(0, 4); break;
            }
#undef ROW
        }
}

void q3_avx512_mx_row_slots(const q3_mat *W, int r, int k0, int n, float *dst) {
    const int K = W->cols, nb = K / 32, b0 = k0 / 32, b1 = (k0 + n) / 32;
    const uint8_t *sc = W->scales + (size_t)r * nb;
    const float *tab = q3_mx_scale_table(W->dtype);
    dst -= k0;
    if (W->dtype == Q3_MXFP4) {
        const uint8_t *el = (const uint8_t *)W->data + (size_t)r * (K / 2);
        __m512i lut_hi, lut_lo;
        fp4_luts(&lut_hi, &lut_lo);
        for (int b = b0; b < b1; b += 4) {
            __m512 f[8];
            fp4x128(el + (size_t)b * 16, lut_hi, lut_lo, f);
            const __m512 s = fp4_factors(sc + b, tab);
            for (int v = 0; v < 8; v++) _mm512_storeu_ps(dst + (size_t)b * 32 + 16 * v, _mm512_mul_ps(f[v], s));
        }
        return;
    }
    const uint8_t *el = (const uint8_t *)W->data + (size_t)r * K;
    for (int b = b0; b < b1; b += 2) {
        __m512 f[4];
        fp8x64(el + (size_t)b * 32, f);
        const __m512 s = fp8_factors(sc + b, tab);
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(dst + (size_t)b * 32 + 16 * v, _mm512_mul_ps(f[v], s));
    }
}

void q3_avx512bw_mx_kernels(q3_isa_kernels *k) {
    k->mx_prep = q3_avx512_mx_prep;
    k->gemv_mx = q3_avx512_gemv_mx;
    k->gemv_mx_tokens = q3_avx512_gemv_mx_tokens;
}
#pragma GCC pop_options
