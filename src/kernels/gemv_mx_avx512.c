/* AVX-512 GEMV for MXFP8 and MXFP4 weights against fp32 inputs
 * (weight-only MX and the A8 linears of the float schemes) on CPUs without
 * AVX-512 BF16, and for the A8 linears of the AMX table: 64 E4M3 codes (two
 * blocks) or 128 E2M1 codes (four) decoded at a time, against an input
 * copy permuted to the order they leave the elements in (q3_mx_prep_copy
 * with 4 lanes). Rows of other lengths (MXFP8: K % 64 != 0, MXFP4: K % 128
 * != 0) take the AVX2 kernel and its copy.
 *
 * E4M3 (gemv_mx_avx2.c's decoder on 512-bit vectors): byte b moved to the
 * top of a 16-bit word, shifted right 4 (arithmetic) and masked holds the
 * sign at bit 15 and the 7 magnitude bits at 10..4; as the top half of an
 * fp32 that is the E4M3 value times 2^-120, subnormals included (the scale
 * table takes the 2^120 back); each 128-bit lane holds half a block. E2M1:
 * VPERMPS lookups of the 16 values by nibble (fp4x128). The 16-bit shifts
 * and byte shuffles need AVX512BW: q3_avx512bw_mx_kernels puts these in
 * the table where the CPU has it. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx2,fma")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

/* Four blocks of E2M1 codes (64 bytes) -> eight vectors of fp32: vector v,
 * lane j holds element 8 j + v (dword j's nibble v, block j / 4). VPERMPS
 * reads only the low 4 bits of each index, so the 16 values in one
 * register decode nibble 0 of every dword, and a shift brings nibble v
 * down: 8 lookups and 7 shifts per 128 elements, against 19 byte shuffles,
 * unpacks and masks that made bf16 bytes of it before. On the two vector
 * ports of an Intel core's 512-bit units that is 27 instead of 33 per 128
 * elements with the products: on the AMX Xeon of BENCHMARKS.md, 65536 x
 * 2048 MXFP4 rows from L3 ran 44.3 -> 55.5 G elements/s, from DRAM 34.2 ->
 * 38.2, old and new alternating in one process. */
INLINE void fp4x128(const uint8_t *p, __m512 lut, __m512 f[8]) {
    __m512i c = _mm512_loadu_si512(p);
    Q3_IN_REGISTER(c);
    f[0] = _mm512_permutexvar_ps(c, lut);
#pragma GCC unroll 7
    for (int v = 1; v < 8; v++) f[v] = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4 * v), lut);
}

/* E8M0 codes 1 .. 254 are 2^(code - 127): the code shifted into an fp32
 * exponent. Not 0 (2^-127, an fp32 subnormal: zero and tiny blocks) or 255
 * (NaN); rows with those take their factors from the table. */
INLINE int fp4_scales_plain(const uint8_t *sc, int nb) {
    const __m512i one = _mm512_set1_epi8(1), top = _mm512_set1_epi8((char)253);
    for (int b = 0; b < nb; b += 64) {
        const __mmask64 m = nb - b >= 64 ? ~0ull : (1ull << (nb - b)) - 1;
        if (_mm512_mask_cmpgt_epu8_mask(m, _mm512_sub_epi8(_mm512_maskz_loadu_epi8(m, sc + b), one), top)) return 0;
    }
    return 1;
}

/* The factors of two MXFP8 blocks (lanes 0-7, 8-15) / four MXFP4 blocks
 * (lanes 4 l .. 4 l + 3). */
INLINE __m512 fp8_factors(const uint8_t *sc, const float *tab) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(tab[sc[0]]), 0xFF00, _mm_set_ss(tab[sc[1]]));
}

/* plain: every code of the row in 1 .. 254 (fp4_scales_plain), each
 * factor the code shifted into an fp32 exponent (a byte shuffle and a
 * shift); otherwise from the table, which holds 2^(code - 128). */
INLINE __m512 fp4_factors(const uint8_t *sc, const float *tab, const int plain) {
    if (plain) {
        int32_t w;
        memcpy(&w, sc, 4);
        /* lane l's dwords: byte l of the broadcast codes, zero-extended */
        const __m512i ctl = _mm512_setr_epi32(-256, -256, -256, -256, -255, -255, -255, -255, -254, -254, -254, -254, -253, -253,
                                              -253, -253);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_shuffle_epi8(_mm512_set1_epi32(w), ctl), 23));
    }
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512 f = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_setr_ps(tab[sc[0]], tab[sc[1]], tab[sc[2]], tab[sc[3]])));
    return _mm512_add_ps(f, f);
}

/* 64 E4M3 codes -> four vectors of fp32 (times 2^-120), in the copy's order. */
INLINE void fp8x64(const uint8_t *p, __m512 f[4]) {
    const __m512i m = _mm512_set1_epi16((short)0x87F0), hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i b = _mm512_loadu_si512(p);
    Q3_IN_REGISTER(b);
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
                       const float *tab, __m512 lut, size_t pf, const int fp4, const int plain, const int TB, const int l2) {
    const int step = fp4 ? 4 : 2, nv = 2 * step;
    __m512 acc0[4], acc1[4];
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) acc0[t] = acc1[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += step) {
        q3_pf_line((const char *)el + (size_t)b * (fp4 ? 16 : 32) + pf, l2);
        __m512 f[8];
        if (fp4) fp4x128(el + (size_t)b * 16, lut, f);
        else fp8x64(el + (size_t)b * 32, f);
        const __m512 s = fp4 ? fp4_factors(sc + b, tab, plain) : fp8_factors(sc + b, tab);
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
    __m512 lut;
} mx_rows;

static mx_rows mx_rows_of(const q3_mat *W) {
    const int K = W->cols, nb = K / 32;
    const size_t eb = W->dtype == Q3_MXFP4 ? (size_t)K / 2 : (size_t)K;
    const mx_rows m = {W->data, W->scales, eb, Q3_PF_WEIGHTS, q3_pf_scales((size_t)nb), nb, q3_mx_copy_scale_table(W->dtype),
                       _mm512_loadu_ps(q3_e2m1_lut)};
    return m;
}

/* Rows r0 .. r1 against one token: the GEMV, a loop of its own (through the
 * tokens pass's dispatch, decode ran 2-3 % slower). */
INLINE void gemv_rows(float *out, const float *xb, const mx_rows *m, int r0, int r1, const int fp4, const int l2) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *s = m->sc + (size_t)r * m->nb;
        q3_pf_line((const char *)s + m->spf, l2);
        const uint8_t *e = m->el + (size_t)r * m->eb;
        if (!fp4) row_tokens(out + (r - r0), 0, e, s, m->nb, xb, 0, m->tab, m->lut, m->pf, 0, 0, 1, l2);
        else if (fp4_scales_plain(s, m->nb)) row_tokens(out + (r - r0), 0, e, s, m->nb, xb, 0, m->tab, m->lut, m->pf, 1, 1, 1, l2);
        else row_tokens(out + (r - r0), 0, e, s, m->nb, xb, 0, m->tab, m->lut, m->pf, 1, 0, 1, l2);
    }
}

void q3_avx512_gemv_mx(float *out, const void *xbv, const q3_mat *W, int r0, int r1) {
    if (!q3_mx_wide_fits(W->dtype, W->cols)) {
        q3_avx2_gemv_mx(out, xbv, W, r0, r1);
        return;
    }
    const mx_rows m = mx_rows_of(W);
    const int fp4 = W->dtype == Q3_MXFP4;
    if (q3_pf_to_l2 && fp4) gemv_rows(out, xbv, &m, r0, r1, 1, 1);
    else if (q3_pf_to_l2) gemv_rows(out, xbv, &m, r0, r1, 0, 1);
    else if (fp4) gemv_rows(out, xbv, &m, r0, r1, 1, 0);
    else gemv_rows(out, xbv, &m, r0, r1, 0, 0);
}

void q3_avx512_gemv_mx_tokens(float *out, size_t ldo, const void *xbv, size_t xs, int T, const q3_mat *W, int r0, int r1) {
    const int fp4 = W->dtype == Q3_MXFP4;
    const size_t xf = xs / sizeof(float);
    const mx_rows m = mx_rows_of(W);
    const int l2 = q3_pf_to_l2; /* a runtime test: 1-4 tokens share each prefetch */
    /* Token blocks outside: a block's copies (4 x 8 KiB for K = 2048) stay
     * in L1 while the rows pass, which after the first block come from
     * cache (rows outside ran 83 against 129 GFLOP/s at 8 tokens). */
    for (int t0 = 0; t0 < T; t0 += 4)
        for (int r = r0; r < r1; r++) {
            const uint8_t *e = m.el + (size_t)r * m.eb, *s = m.sc + (size_t)r * m.nb;
            q3_pf_line((const char *)s + m.spf, l2);
            const float *x0 = (const float *)xbv + (size_t)t0 * xf;
            float *o = out + (size_t)t0 * ldo + (r - r0);
#define ROW(FP4, PLAIN, TB) row_tokens(o, ldo, e, s, m.nb, x0, xf, m.tab, m.lut, m.pf, FP4, PLAIN, TB, l2)
            const int kind = !fp4 ? 2 : fp4_scales_plain(s, m.nb);
            switch ((T - t0 < 4 ? T - t0 : 4) + 4 * kind) {
            case 1: ROW(1, 0, 1); break;
            case 2: ROW(1, 0, 2); break;
            case 3: ROW(1, 0, 3); break;
            case 4: ROW(1, 0, 4); break;
            case 5: ROW(1, 1, 1); break;
            case 6: ROW(1, 1, 2); break;
            case 7: ROW(1, 1, 3); break;
            case 8: ROW(1, 1, 4); break;
            case 9: ROW(0, 0, 1); break;
            case 10: ROW(0, 0, 2); break;
            case 11: ROW(0, 0, 3); break;
            default: ROW(0, 0, 4); break;
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
        const __m512 lut = _mm512_loadu_ps(q3_e2m1_lut);
        for (int b = b0; b < b1; b += 4) {
            __m512 f[8];
            fp4x128(el + (size_t)b * 16, lut, f);
            const __m512 s = fp4_factors(sc + b, tab, 0);
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
