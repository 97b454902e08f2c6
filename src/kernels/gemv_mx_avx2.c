/* AVX2 GEMV for MX weights (MXFP8 / MXFP4 elements, E8M0 block scales)
 * against fp32 inputs: the decode path of MX linears (on CPUs with
 * AVX-512 BF16, of the weight-only ones).
 *
 * Why a separate input copy: the cheapest AVX2 decoders of 32 codes into
 * four vectors of fp32 leave the elements in an unpack-friendly order, not
 * the stored one. Reordering the input to match costs one pass over K
 * floats per matmul pass (mx_prep, cached per thread), instead of shuffles
 * on every weight. The copy is a permutation, so it is exact for any input:
 * weight-only MX linears use it as well as A8 ones.
 *
 * Decoders, per 32-element block:
 * - E4M3: byte b moved to the top of a 16-bit word, shifted right 4
 *   (arithmetic) and masked keeps the sign at bit 15 and puts the 7
 *   magnitude bits at 10..4; that word as the top half of an fp32 is the
 *   E4M3 value times 2^-120, subnormals included (the scale table takes the
 *   2^120 back). 9 shifts and masks for 32 elements, against about 24 to
 *   widen each byte to 32 bits first (the fp32 kernel in isa_avx2.c).
 * - E2M1: the nibbles become byte indices of two 16-entry lookups giving
 *   the high and low byte of twice the element's value as bf16 (exact: at
 *   most 2 significant bits), interleaved to bf16 words, then to fp32 as
 *   for E4M3.
 * Every product is an fp32 FMA of an exactly decoded element and the input;
 * the block sum is scaled once by 2^(code-127) (E8M0 code 0xFF is NaN).
 * The same decoders widen MX rows for the AVX2 broadcast GEMM
 * (q3_avx2_mx_row_slots). */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "kernels/const_tokens.h"
#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))


/* E8M0 code -> the block factor, shared with isa_avx2.c's decoders (times
 * 2^120 for E4M3, 1/2 for E2M1 decoded as twice its value); g_copy8 for
 * E4M3 against the GEMV's scaled copy (q3_mx_prep_copy). */
static const float *g_scale8, *g_scale4, *g_copy8;
/* bf16 high and low byte of twice the 16 E2M1 values, twice (one per lane). */
static uint8_t g_fp4_hi[32], g_fp4_lo[32];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    for (int c = 0; c < 32; c++) {
        const uint16_t w = q3_f32_to_bf16(2.0f * q3_e2m1_lut[c & 15]); /* exact: at most 2 significant bits */
        g_fp4_hi[c] = (uint8_t)(w >> 8), g_fp4_lo[c] = (uint8_t)w;
    }
    g_scale8 = q3_mx_scale_table(Q3_MXFP8);
    g_copy8 = q3_mx_copy_scale_table(Q3_MXFP8);
    g_scale4 = q3_mx_scale_table(Q3_MXFP4);
}

/* Input order for vectors of `lanes` 128-bit lanes (2 here, 4 in
 * gemv_mx_avx512.c): MXFP8 per 16 * lanes elements, slot 4 lanes v + 4l + j
 * of the copy (vector v, lane l, dword j) holds element 16l + 4j +
 * fp8_off[v]; MXFP4 with 2 lanes per 64 elements (lane l from block l),
 * slot 8v + 4l + j holds element 32l + 4j + fp4_off[v]; MXFP4 with 4 lanes
 * per 128 elements, slot 16v + j holds element 8j + v (gemv_mx_avx512.c
 * decodes nibble v of each dword of codes into vector v). */
static const int fp8_off[4] = {0, 2, 1, 3}, fp4_off[8] = {0, 2, 16, 18, 1, 3, 17, 19};

static void prep(float *xb, const float *x, int K, q3_dtype wt, int lanes, float f) {
    const int fp4 = wt == Q3_MXFP4, nv = fp4 ? 8 : 4, span = fp4 ? 32 : 16;
    if (fp4 && lanes == 4) {
        for (int k = 0; k < K; k += 128)
            for (int v = 0; v < 8; v++)
                for (int j = 0; j < 16; j++) xb[k + 16 * v + j] = f * x[k + 8 * j + v];
        return;
    }
    for (int k = 0; k < K; k += span * lanes)
        for (int v = 0; v < nv; v++)
            for (int l = 0; l < lanes; l++)
                for (int j = 0; j < 4; j++)
                    xb[k + 4 * lanes * v + 4 * l + j] = f * x[k + span * l + 4 * j + (fp4 ? fp4_off[v] : fp8_off[v])];
}

void q3_mx_prep_lanes(float *xb, const float *x, int K, q3_dtype wt, int lanes) { prep(xb, x, K, wt, lanes, 1.0f); }

void q3_mx_prep_copy(float *xb, const float *x, int K, q3_dtype wt, int lanes) {
    prep(xb, x, K, wt, lanes, wt == Q3_MXFP8 ? ldexpf(1.0f, Q3_FP8_COPY_EXP) : 1.0f);
}

void q3_avx2_mx_prep(void *xbv, const float *x, int K, q3_dtype wt) { q3_mx_prep_copy(xbv, x, K, wt, 2); }

/* bf16 words (or E4M3 words shaped like them) -> fp32: each word becomes
 * the top half of a dword, by masks and shifts rather than unpacks (which
 * compete with the lookups for the two shuffle pipes). */
INLINE void words_to_f32(__m256i w0, __m256i w1, __m256 f[4]) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    f[0] = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
    f[1] = _mm256_castsi256_ps(_mm256_and_si256(w0, hi));
    f[2] = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
    f[3] = _mm256_castsi256_ps(_mm256_and_si256(w1, hi));
}

INLINE void fp8x32(const uint8_t *p, __m256 f[4]) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)p), m = _mm256_set1_epi16((short)0x87F0);
    const __m256i w0 = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 4), m);
    const __m256i w1 = _mm256_and_si256(_mm256_srai_epi16(b, 4), m);
    words_to_f32(w0, w1, f);
}

/* Two blocks of E2M1 codes (32 bytes; lane l holds block l) -> eight
 * vectors of fp32. lut_hi/lut_lo: bf16 bytes of the 16 codes in both
 * lanes; the low nibbles (even elements) give f[0..3], the high ones
 * f[4..7]. */
INLINE void fp4x64(const uint8_t *p, __m256i lut_hi, __m256i lut_lo, __m256 f[8]) {
    const __m256i b = _mm256_loadu_si256((const __m256i *)p), m4 = _mm256_set1_epi8(0x0f);
    const __m256i i0 = _mm256_and_si256(b, m4), i1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    __m256i h = _mm256_shuffle_epi8(lut_hi, i0), l = _mm256_shuffle_epi8(lut_lo, i0);
    words_to_f32(_mm256_unpacklo_epi8(l, h), _mm256_unpackhi_epi8(l, h), f);
    h = _mm256_shuffle_epi8(lut_hi, i1), l = _mm256_shuffle_epi8(lut_lo, i1);
    words_to_f32(_mm256_unpacklo_epi8(l, h), _mm256_unpackhi_epi8(l, h), f + 4);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Most tokens per pass of the tokens GEMV (their accumulators beside the
 * decoded block; past 4 the compiler keeps some in L1). */
enum { TOKENS_MAX = Q3_CONST_TOKENS_MAX };

/* One row against T input copies (xs floats apart), out[t * ldo] for
 * token t: per block (pair of blocks for MXFP4), decoded once, two short
 * product chains per token, then the scaled sum into one of two
 * accumulators (their FMA latency overlaps). Per token the operations and
 * their order do not depend on T, so every token's result is bit for bit
 * the one-token GEMV's. */
INLINE void row_fp8(float *out, size_t ldo, const uint8_t *el, const uint8_t *sc, int nb, const float *xb, size_t xs,
                    size_t pf, const int T, const int l2) {
    __m256 acc[TOKENS_MAX][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (b & 1) q3_pf_line((const char *)el + (size_t)b * 32 + pf, l2);
        __m256 f[4];
        fp8x32(el + (size_t)b * 32, f);
        const __m256 s = _mm256_broadcast_ss(g_copy8 + sc[b]);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float *x = xb + (size_t)t * xs + (size_t)b * 32;
            __m256 d0 = _mm256_mul_ps(f[0], _mm256_load_ps(x)), d1 = _mm256_mul_ps(f[1], _mm256_load_ps(x + 8));
            d0 = _mm256_fmadd_ps(f[2], _mm256_load_ps(x + 16), d0);
            d1 = _mm256_fmadd_ps(f[3], _mm256_load_ps(x + 24), d1);
            if (b & 1) acc[t][1] = _mm256_fmadd_ps(_mm256_add_ps(d0, d1), s, acc[t][1]);
            else acc[t][0] = _mm256_fmadd_ps(_mm256_add_ps(d0, d1), s, acc[t][0]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out[(size_t)t * ldo] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

INLINE void row_fp4(float *out, size_t ldo, const uint8_t *el, const uint8_t *sc, int nb, const float *xb, size_t xs,
                    __m256i lut_hi, __m256i lut_lo, size_t pf, const int T, const int l2) {
    __m256 acc[TOKENS_MAX][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        if (b & 2) q3_pf_line((const char *)el + (size_t)b * 16 + pf, l2);
        __m256 f[8];
        fp4x64(el + (size_t)b * 16, lut_hi, lut_lo, f);
        const __m256 s = _mm256_set_m128(_mm_broadcast_ss(g_scale4 + sc[b + 1]), _mm_broadcast_ss(g_scale4 + sc[b]));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float *x = xb + (size_t)t * xs + (size_t)b * 32;
            __m256 d0 = _mm256_mul_ps(f[0], _mm256_load_ps(x)), d1 = _mm256_mul_ps(f[1], _mm256_load_ps(x + 8));
            for (int v = 2; v < 8; v += 2) {
                d0 = _mm256_fmadd_ps(f[v], _mm256_load_ps(x + 8 * v), d0);
                d1 = _mm256_fmadd_ps(f[v + 1], _mm256_load_ps(x + 8 * v + 8), d1);
            }
            if (b & 2) acc[t][1] = _mm256_fmadd_ps(_mm256_add_ps(d0, d1), s, acc[t][1]);
            else acc[t][0] = _mm256_fmadd_ps(_mm256_add_ps(d0, d1), s, acc[t][0]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out[(size_t)t * ldo] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

void q3_avx2_mx_row_slots(const q3_mat *W, int r, float *dst) {
    pthread_once(&g_once, init_tables);
    const int nb = W->cols / 32;
    const uint8_t *sc = W->scales + (size_t)r * nb;
    if (W->dtype == Q3_MXFP4) {
        const uint8_t *el = (const uint8_t *)W->data + (size_t)r * (W->cols / 2);
        const __m256i lut_hi = _mm256_loadu_si256((const __m256i *)g_fp4_hi),
                      lut_lo = _mm256_loadu_si256((const __m256i *)g_fp4_lo);
        for (int b = 0; b < nb; b += 2) {
            __m256 f[8];
            fp4x64(el + (size_t)b * 16, lut_hi, lut_lo, f);
            const __m256 s = _mm256_set_m128(_mm_broadcast_ss(g_scale4 + sc[b + 1]), _mm_broadcast_ss(g_scale4 + sc[b]));
            for (int v = 0; v < 8; v++) _mm256_storeu_ps(dst + (size_t)b * 32 + 8 * v, _mm256_mul_ps(f[v], s));
        }
        return;
    }
    const uint8_t *el = (const uint8_t *)W->data + (size_t)r * W->cols;
    for (int b = 0; b < nb; b++) {
        __m256 f[4];
        fp8x32(el + (size_t)b * 32, f);
        const __m256 s = _mm256_broadcast_ss(g_scale8 + sc[b]);
        for (int v = 0; v < 4; v++) _mm256_storeu_ps(dst + (size_t)b * 32 + 8 * v, _mm256_mul_ps(f[v], s));
    }
}

/* Rows r0 .. r1 against T copies xs floats apart (T constant), l2 the
 * prefetch level (prefetch.h). */
INLINE void gemv_t(float *out, size_t ldo, const float *xb, size_t xs, const q3_mat *W, int r0, int r1, const int T,
                   const int l2) {
    pthread_once(&g_once, init_tables);
    const int K = W->cols, nb = K / 32, fp4 = W->dtype == Q3_MXFP4;
    const size_t eb = fp4 ? (size_t)K / 2 : (size_t)K;
    const uint8_t *el = W->data, *sc = W->scales;
    const size_t pf = Q3_PF_WEIGHTS, spf = q3_pf_scales((size_t)nb);
    const __m256i lut_hi = _mm256_loadu_si256((const __m256i *)g_fp4_hi),
                  lut_lo = _mm256_loadu_si256((const __m256i *)g_fp4_lo);
    for (int r = r0; r < r1; r++) {
        const uint8_t *e = el + (size_t)r * eb, *s = sc + (size_t)r * nb;
        q3_pf_line((const char *)s + spf, l2);
        if (fp4) row_fp4(out + r - r0, ldo, e, s, nb, xb, xs, lut_hi, lut_lo, pf, T, l2);
        else row_fp8(out + r - r0, ldo, e, s, nb, xb, xs, pf, T, l2);
    }
}

void q3_avx2_gemv_mx(float *out, const void *xb, const q3_mat *W, int r0, int r1) {
    if (q3_pf_to_l2) gemv_t(out, 0, xb, 0, W, r0, r1, 1, 1);
    else gemv_t(out, 0, xb, 0, W, r0, r1, 1, 0);
}

void q3_avx2_gemv_mx_tokens(float *out, size_t ldo, const void *xb, size_t xs, int T, const q3_mat *W, int r0, int r1) {
    const size_t w = xs / sizeof(float);
    for (int t0 = 0; t0 < T; t0 += TOKENS_MAX) {
        float *o = out + (size_t)t0 * ldo;
        const float *x = (const float *)xb + (size_t)t0 * w;
        const int n = T - t0 < TOKENS_MAX ? T - t0 : TOKENS_MAX;
#define GROUP(N) gemv_t(o, ldo, x, w, W, r0, r1, N, q3_pf_to_l2) /* 2-8 tokens share each prefetch */
        Q3_CONST_TOKENS(n, GROUP);
#undef GROUP
    }
}
#pragma GCC pop_options
