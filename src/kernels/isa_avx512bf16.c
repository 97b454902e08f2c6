/* AVX-512 BF16 kernels for A8 linears (MX weights whose input the model has
 * quantized to MXFP8, q3_mat.a8).
 *
 * Why bf16 is exact here: an MXFP8 activation is an E4M3 value times a
 * power of two, an MX weight element an E4M3 or E2M1 value; both have at
 * most 4 significant bits, so they are bf16 numbers, and the product of two
 * bf16 numbers is exact in fp32. VDPBF16PS therefore computes exactly the
 * MXFP8 x MX products with fp32 accumulation, two per lane per instruction
 * (twice the rate of fp32 FMA), straight from 4- or 8-bit weight codes.
 * The one departure: the instruction treats bf16 subnormal inputs (below
 * 2^-126, i.e. activation blocks with a scale near 2^-127) as zero.
 *
 * Layout: a GEMV step decodes 128 MXFP4 or 64 MXFP8 elements into vectors
 * of 32 bf16 pairs, in a fixed order (unpack-friendly, not the stored one)
 * that keeps each 32-block in its own group of dword lanes; a8_prep writes
 * the activations in the same order, once per matmul pass. The block scales
 * are applied in fp32, one FMA per step, so no weight is rescaled in bf16. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "kernels/const_tokens.h"
#include "kernels/isa.h"
#include "kernels/lane_rem.h"
#include "kernels/lane_store.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

/* The A8 GEMV prefetches as prefetch.h says (measured here: about 9 %
 * faster decode of W4A8 with an MXFP8 lm_head). */
#define INLINE static inline __attribute__((always_inline))

/* Most tokens gemv_a8_tokens takes in one pass (2 accumulators each must
 * stay in registers beside the decoded step). */
enum { A8_TOKENS_MAX = Q3_CONST_TOKENS_MAX };

/* Decode tables: E2M1 code -> bf16 word (32 entries, the 16 codes twice:
 * VPERMW reads 5 index bits), E4M3 magnitude (7 bits) -> bf16 high and low
 * byte; and the activation orders. */
static uint16_t g_fp4_w[32];
static uint8_t g_fp8_hi[128], g_fp8_lo[128];
static uint16_t g_fp8_perm[64]; /* word w of a 64-group <- element g_fp8_perm[w] */
static uint16_t g_fp4_perm[4][32]; /* word j of vector i of a 128-step <- element (4j + i) mod 64 */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* unpacklo/hi_epi8 interleave inside 128-bit lanes: the low/high 8 bytes of
 * each lane of the two decoded byte planes become 8 bf16 words.
 * MXFP8, 64 elements per step: decoder lane l holds elements 16l .. 16l+15,
 * so word w (vector w / 32) holds element 16l + 8v + j, l = (w % 32) / 8,
 * j = w % 8, v = w / 32.
 * MXFP4, 128 elements (64 bytes, 4 blocks) per step: word j of the loaded
 * bytes holds the codes of elements 4j .. 4j+3 (low nibble first); vector i
 * is that word shifted right by 4i and looked up by VPERMW, so its word j is
 * element 4j + i. Block l stays in 128-bit lane l (words 8l .. 8l+7). Four
 * shuffles per 64 bytes, half of what byte lookups and unpacks take. */
static int fp8_elem(int w) { return 16 * ((w % 32) / 8) + 8 * (w / 32) + w % 8; }

static void init_tables(void) {
    for (int c = 0; c < 32; c++) g_fp4_w[c] = q3_f32_to_bf16(q3_e2m1_lut[c & 15]);
    for (int c = 0; c < 128; c++) {
        const uint16_t b = q3_f32_to_bf16(q3_e4m3_lut[c]); /* exact: <= 4 significant bits; 0x7F is NaN */
        g_fp8_hi[c] = (uint8_t)(b >> 8), g_fp8_lo[c] = (uint8_t)b;
    }
    for (int w = 0; w < 64; w++) g_fp8_perm[w] = (uint16_t)fp8_elem(w);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 32; j++) g_fp4_perm[i][j] = (uint16_t)((4 * j + i) % 64);
}

/* 32 floats -> 32 bf16 (cvtne2ps_pbh(a, b) puts b in the low half). */
INLINE __m512i bf16x32(const float *x) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

/* One step of bf16 words (n[0..3]: 128 elements of an MXFP4 row's step,
 * n[0..1]: 64 of an MXFP8 one, in stored order) to the decoders' order.
 * MXFP4: vector i word j <- element 4j + i, words 0..15 from the step's
 * first 64 elements, words 16..31 from the last 64. */
INLINE void perm_fp4(uint16_t *dst, const __m512i n[4]) {
    for (int i = 0; i < 4; i++) {
        const __m512i P = _mm512_loadu_si512(g_fp4_perm[i]);
        _mm512_storeu_si512(dst + 32 * i, _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_permutex2var_epi16(n[0], P, n[1]),
                                                                  _mm512_permutex2var_epi16(n[2], P, n[3])));
    }
}

INLINE void perm_fp8(uint16_t *dst, const __m512i n[2]) {
    _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(n[0], _mm512_loadu_si512(g_fp8_perm), n[1]));
    _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(n[0], _mm512_loadu_si512(g_fp8_perm + 32), n[1]));
}

/* K inputs in the decoders' order (K a multiple of 64 for MXFP8, 128 for
 * MXFP4): fp32 ones rounded to bf16 (f32), or bf16 words as they are. */
INLINE void to_decoder_order(uint16_t *dst, const void *src, int K, q3_dtype wt, const int f32) {
    pthread_once(&g_once, init_tables);
    const int step = wt == Q3_MXFP4 ? 128 : 64;
    for (int k = 0; k < K; k += step) {
        __m512i n[4];
        for (int v = 0; v < step / 32; v++)
            n[v] = f32 ? bf16x32((const float *)src + k + 32 * v) : _mm512_loadu_si512((const uint16_t *)src + k + 32 * v);
        if (wt == Q3_MXFP4) perm_fp4(dst + k, n);
        else perm_fp8(dst + k, n);
    }
}

static void a8_prep(void *xb, const float *x, int K, q3_dtype wt) { to_decoder_order(xb, x, K, wt, 1); }

void q3_a8_permute_words(uint16_t *dst, const uint16_t *src, int K, q3_dtype wt) { to_decoder_order(dst, src, K, wt, 0); }

/* Sixteen E8M0 codes -> 2^(c-127) as fp32 (code 0 is the subnormal 2^-127,
 * 0xFF NaN), exactly as q3_e8m0_to_f32. */
INLINE __m512 e8m0x16(__m128i codes) {
    const __m512i c = _mm512_cvtepu8_epi32(codes);
    const __m512 v = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_cvtepi32_ps(_mm512_sub_epi32(c, _mm512_set1_epi32(127))));
    return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0xFF)), _mm512_set1_ps(NAN));
}

/* 128 E2M1 codes (64 bytes, 4 blocks) -> four vectors of 32 bf16 in the
 * a8_prep order. */
INLINE void fp4x128(const uint8_t *p, __m512i lut, __m512i w[4]) {
    __m512i b = _mm512_loadu_si512(p);
    Q3_IN_REGISTER(b);
    w[0] = _mm512_permutexvar_epi16(b, lut);
    w[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), lut);
    w[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 8), lut);
    w[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 12), lut);
}

/* 64 E4M3 codes -> two vectors of 32 bf16 in elem_of_word order. The
 * 128-entry lookups ignore bit 7 of the code, the sign, put back after. */
INLINE void fp8x64(const uint8_t *p, const __m512i t[4], __m512i *w0, __m512i *w1) {
    __m512i b = _mm512_loadu_si512(p);
    Q3_IN_REGISTER(b);
    const __m512i h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t[0], b, t[1]), b, _mm512_set1_epi8((char)0x80),
                                                0xF8); /* h | (b & 0x80) */
    const __m512i l = _mm512_permutex2var_epi8(t[2], b, t[3]);
    *w0 = _mm512_unpacklo_epi8(l, h);
    *w1 = _mm512_unpackhi_epi8(l, h);
}

/* Lanes 16/n * i .. 16/n * (i+1) - 1 get s16[n*j + i] (n = 2 or 4 blocks per step). */
INLINE __m512 step_scale(__m512 s16, int n, int j) {
    __m512i idx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), n == 4 ? 2 : 3);
    return _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(n * j)), s16);
}

/* The scales of the next min(n, 16) blocks: a masked load, so the tail of
 * a row reads nothing past it. The missing ones read as code 127 (1.0),
 * not 0: 2^-127 is an fp32 subnormal, and making one took a microcode
 * assist on the AMX Xeon of BENCHMARKS.md at every row whose block count
 * is not a multiple of 16 (MXFP4 A8 GEMV, 2048 rows of K = 768, 2
 * threads: 15.5 G elements/s, against 50.4 at K = 1024). */
INLINE __m512 scales16(const uint8_t *sc, int n) {
    return e8m0x16(_mm_mask_loadu_epi8(_mm_set1_epi8(127), n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1), sc));
}

/* One row of an MX matrix against T bf16 activation copies (xs words
 * apart), out[t * ldo] for token t: each step's codes are decoded once for
 * all of them, and per token the operations are the one-token GEMV's in
 * its order, so each result is bit for bit gemv_a8's. Per token, a step's
 * four dot products form one chain, scaled into one of two accumulators by
 * one FMA (two chains and two FMAs ran 73-75 against 75-78 G elements/s,
 * one thread from L2), and the row's tail scales come from a masked load:
 * short rows (an expert's down projection has 6 steps) were bound by
 * latency and by a tail copy through the stack before. */
INLINE void row_fp4(float *out, size_t ldo, const uint8_t *el, const uint8_t *sc, int nb, const uint16_t *xb, size_t xs,
                    __m512i lut, size_t pf, const int T, const int l2) {
    __m512 acc[A8_TOKENS_MAX][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 16) {
        const __m512 s16 = scales16(sc + b, nb - b);
        const int steps = nb - b < 16 ? (nb - b) / 4 : 4;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            if (j >= steps) break;
            const uint8_t *p = el + (size_t)(b + 4 * j) * 16;
            q3_pf_line((const char *)p + pf, l2);
            __m512i w[4];
            fp4x128(p, lut, w);
            const __m512 sj = step_scale(s16, 4, j);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const uint16_t *x = xb + (size_t)t * xs + (size_t)(b + 4 * j) * 32;
                __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w[0], (__m512bh)_mm512_loadu_si512(x));
                d = _mm512_dpbf16_ps(d, (__m512bh)w[1], (__m512bh)_mm512_loadu_si512(x + 32));
                d = _mm512_dpbf16_ps(d, (__m512bh)w[2], (__m512bh)_mm512_loadu_si512(x + 64));
                d = _mm512_dpbf16_ps(d, (__m512bh)w[3], (__m512bh)_mm512_loadu_si512(x + 96));
                acc[t][j & 1] = _mm512_fmadd_ps(d, sj, acc[t][j & 1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out[(size_t)t * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

INLINE void row_fp8(float *out, size_t ldo, const uint8_t *el, const uint8_t *sc, int nb, const uint16_t *xb, size_t xs,
                    const __m512i t8[4], size_t pf, const int T, const int l2) {
    __m512 acc[A8_TOKENS_MAX][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 16) {
        const __m512 s16 = scales16(sc + b, nb - b);
        const int steps = nb - b < 16 ? (nb - b) / 2 : 8;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            if (j >= steps) break;
            const uint8_t *p = el + (size_t)(b + 2 * j) * 32;
            q3_pf_line((const char *)p + pf, l2);
            __m512i w0, w1;
            fp8x64(p, t8, &w0, &w1);
            const __m512 sj = step_scale(s16, 2, j);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const uint16_t *x = xb + (size_t)t * xs + (size_t)(b + 2 * j) * 32;
                __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w0, (__m512bh)_mm512_loadu_si512(x));
                d = _mm512_dpbf16_ps(d, (__m512bh)w1, (__m512bh)_mm512_loadu_si512(x + 32));
                acc[t][j & 1] = _mm512_fmadd_ps(d, sj, acc[t][j & 1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out[(size_t)t * ldo] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

/* Rows r0 .. r1 of W against T copies (xs words apart; T constant), l2
 * the prefetch level (prefetch.h). */
INLINE void gemv_a8_t(float *out, size_t ldo, const uint16_t *xb, size_t xs, const q3_mat *W, int r0, int r1, const int T,
                      const int l2) {
    pthread_once(&g_once, init_tables);
    const int K = W->cols, nb = K / 32;
    const uint8_t *el = W->data, *sc = W->scales;
    const size_t eb = W->dtype == Q3_MXFP4 ? (size_t)K / 2 : (size_t)K;
    const size_t pf = Q3_PF_WEIGHTS, spf = q3_pf_scales((size_t)nb);
    if (W->dtype == Q3_MXFP4) {
        const __m512i lut = _mm512_loadu_si512(g_fp4_w);
        for (int r = r0; r < r1; r++) {
            q3_pf_line((const char *)(sc + (size_t)r * nb + spf), l2);
            row_fp4(out + r - r0, ldo, el + r * eb, sc + (size_t)r * nb, nb, xb, xs, lut, pf, T, l2);
        }
        return;
    }
    const __m512i t8[4] = {_mm512_loadu_si512(g_fp8_hi), _mm512_loadu_si512(g_fp8_hi + 64), _mm512_loadu_si512(g_fp8_lo),
                           _mm512_loadu_si512(g_fp8_lo + 64)};
    for (int r = r0; r < r1; r++) {
        q3_pf_line((const char *)(sc + (size_t)r * nb + spf), l2);
        row_fp8(out + r - r0, ldo, el + r * eb, sc + (size_t)r * nb, nb, xb, xs, t8, pf, T, l2);
    }
}

static void gemv_a8(float *out, const void *xb, const q3_mat *W, int r0, int r1) {
    if (q3_pf_to_l2) gemv_a8_t(out, 0, xb, 0, W, r0, r1, 1, 1);
    else gemv_a8_t(out, 0, xb, 0, W, r0, r1, 1, 0);
}

/* Tokens in groups of at most A8_TOKENS_MAX, one pass over the rows each. */
static void gemv_a8_tokens(float *out, size_t ldo, const void *xb, size_t xs, int T, const q3_mat *W, int r0, int r1) {
    const size_t w = xs / sizeof(uint16_t);
    for (int t0 = 0; t0 < T; t0 += A8_TOKENS_MAX) {
        float *o = out + (size_t)t0 * ldo;
        const uint16_t *x = (const uint16_t *)xb + (size_t)t0 * w;
        const int n = T - t0 < A8_TOKENS_MAX ? T - t0 : A8_TOKENS_MAX;
#define GROUP(N) gemv_a8_t(o, ldo, x, w, W, r0, r1, N, q3_pf_to_l2) /* 2-8 tokens share each prefetch */
        Q3_CONST_TOKENS(n, GROUP);
#undef GROUP
    }
}

/* ---- A8 GEMM: tokens in vector lanes, weight pairs broadcast ----
 * Each weight row is decoded once per panel into bf16 with its block scale
 * folded in (an exponent add on the nonzero elements: exact while the
 * result stays a normal bf16, which the scale range check guarantees), so
 * the inner loop is one broadcast and TB dot products per weight pair. */

/* Remainder tokens (lane_rem.h) up to 3: with one part per input the row
 * reductions beat padding only for a few tokens (kernel_bench mx: T = 17
 * gained 14 %, T = 20 was even, T = 24 lost 15 %). */
enum { A8_REM_MAX = 3 };

/* Lane part ap[K/2][TL] (TL = 16 token vectors, lanes past T zero), then
 * the remainder tokens (lane_rem.h) as rows of K/2 pairs. */
static void a8_pack_act(uint32_t *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt, uint16_t *row) {
    int tv, rem;
    q3_split_tokens(T, A8_REM_MAX, &tv, &rem);
    const int TL = 16 * tv, np = K / 2;
    const uint32_t *r32 = (const uint32_t *)row;
    for (int t = 0; t < TL; t++) {
        if (t < T) a8_prep(row, x + (size_t)t * ldx, K, wt);
        for (int i = 0; i < np; i++) ap[(size_t)i * TL + t] = t < T ? r32[i] : 0;
    }
    for (int j = 0; j < rem; j++) a8_prep((uint16_t *)(ap + (size_t)np * TL + (size_t)j * np), x + (size_t)(TL + j) * ldx, K, wt);
}

/* Scale codes whose folded elements stay normal bf16 numbers: E2M1 values
 * have exponents 2^-1 .. 2^2, E4M3 values 2^-9 .. 2^8. */
int q3_a8_scales_foldable(const q3_mat *W, int r0, int r1) {
    const int fp4 = W->dtype == Q3_MXFP4, lo = fp4 ? 2 : 10, hi = fp4 ? 252 : 246;
    const size_t nb = (size_t)W->cols / 32, end = (size_t)r1 * nb;
    size_t i = (size_t)r0 * nb;
    /* 64 codes per compare: a scalar loop here was 6 % of W4A8 prefill on AMX */
    const __m512i vlo = _mm512_set1_epi8((char)lo), vhi = _mm512_set1_epi8((char)hi);
    for (; i + 64 <= end; i += 64) {
        const __m512i c = _mm512_loadu_si512(W->scales + i);
        if (_mm512_cmplt_epu8_mask(c, vlo) | _mm512_cmpgt_epu8_mask(c, vhi)) return 0;
    }
    for (; i < end; i++)
        if (W->scales[i] < lo || W->scales[i] > hi) return 0;
    return 1;
}

/* Exponent increments for a step's blocks: 128-bit lane l of the result
 * holds (code[l * n / 4] - 127) << 7 in every 16-bit word (n = blocks per step). */
INLINE __m512i fold_add(const uint8_t *codes, int n) {
    const __m128i c = n == 4 ? _mm_cvtsi32_si128(*(const int32_t *)(const void *)codes)
                             : _mm_cvtsi32_si128(codes[0] | codes[1] << 8);
    __m128i e = _mm_slli_epi32(_mm_sub_epi32(_mm_cvtepu8_epi32(c), _mm_set1_epi32(127)), 7);
    e = _mm_and_si128(e, _mm_set1_epi32(0xffff));
    e = _mm_or_si128(e, _mm_slli_epi32(e, 16));
    const __m512i idx = n == 4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                               : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_epi32(idx, _mm512_castsi128_si512(e));
}

INLINE __m512i fold(__m512i w, __m512i add) {
    return _mm512_mask_add_epi16(w, _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x7fff)), w, add);
}

/* One step of an MX row decoded into scaled bf16 words in a8_prep order:
 * 128 MXFP4 elements (64 bytes at el, 4 scale codes at sc) or 64 MXFP8
 * ones (2 codes). */
INLINE void fp4_step(uint16_t *dst, const uint8_t *el, const uint8_t *sc, __m512i lut) {
    __m512i w[4];
    fp4x128(el, lut, w);
    const __m512i add = fold_add(sc, 4);
    for (int v = 0; v < 4; v++) _mm512_storeu_si512(dst + 32 * v, fold(w[v], add));
}

INLINE void fp8_step(uint16_t *dst, const uint8_t *el, const uint8_t *sc, const __m512i t8[4]) {
    __m512i w0, w1;
    fp8x64(el, t8, &w0, &w1);
    const __m512i add = fold_add(sc, 2);
    _mm512_storeu_si512(dst, fold(w0, add));
    _mm512_storeu_si512(dst + 32, fold(w1, add));
}

INLINE void fp8_tables(__m512i t8[4]) {
    t8[0] = _mm512_loadu_si512(g_fp8_hi), t8[1] = _mm512_loadu_si512(g_fp8_hi + 64);
    t8[2] = _mm512_loadu_si512(g_fp8_lo), t8[3] = _mm512_loadu_si512(g_fp8_lo + 64);
}

/* Row r of W as K scaled bf16 words in a8_prep order. Not inlined: in
 * gemm_a8 its decode tables stayed in 4 registers across the tile, so the
 * 3-vector tile (24 accumulators) spilled one of them to the stack every
 * step. kernel_bench mx 1536 2048, one thread, MXFP4 A8, best of three,
 * GFLOP/s: T = 36 191 -> 258, 40 218 -> 293, 48 254 -> 343; q30b8 W4A8
 * prefill 512: attention matmuls 401-410 -> 320-351 ms. */
static __attribute__((noinline)) void decode_row(uint16_t *dst, const q3_mat *W, int r) {
    const int K = W->cols, nb = K / 32;
    const uint8_t *sc = W->scales + (size_t)r * nb;
    if (W->dtype == Q3_MXFP4) {
        const __m512i lut = _mm512_loadu_si512(g_fp4_w);
        const uint8_t *el = (const uint8_t *)W->data + (size_t)r * (K / 2);
        for (int b = 0; b < nb; b += 4) fp4_step(dst + (size_t)b * 32, el + (size_t)b * 16, sc + b, lut);
        return;
    }
    __m512i t8[4];
    fp8_tables(t8);
    const uint8_t *el = (const uint8_t *)W->data + (size_t)r * K;
    for (int b = 0; b < nb; b += 2) fp8_step(dst + (size_t)b * 32, el + (size_t)b * 32, sc + b, t8);
}

/* stage[r * ts + t] for r < 8, t < 16 * TB, from 8 decoded rows wb[r * K ..]. */
INLINE void tile8(float *stage, int ts, const uint32_t *ap, int K, const uint16_t *wb, int TB) {
    const int TP = 16 * TB, np = K / 2;
    const uint32_t *w32 = (const uint32_t *)wb;
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < 3; tb++) acc[r][tb] = _mm512_setzero_ps();
    for (int i = 0; i < np; i++) {
        __m512bh a[3];
#pragma GCC unroll 3
        for (int tb = 0; tb < 3; tb++)
            if (tb < TB) a[tb] = (__m512bh)_mm512_loadu_si512(ap + (size_t)i * TP + 16 * tb);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)w32[(size_t)r * np + i]);
#pragma GCC unroll 3
            for (int tb = 0; tb < 3; tb++)
                if (tb < TB) acc[r][tb] = _mm512_dpbf16_ps(acc[r][tb], w, a[tb]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int tb = 0; tb < 3; tb++)
            if (tb < TB) _mm512_storeu_ps(stage + (size_t)r * ts + 16 * tb, acc[r][tb]);
}

static int gemm_a8(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf) {
    pthread_once(&g_once, init_tables);
    if (!q3_a8_scales_foldable(W, r0, r1)) return 0;
    int TB, rem;
    q3_split_tokens(T, A8_REM_MAX, &TB, &rem);
    const int K = W->cols, np = K / 2, ts = 16 * TB + rem;
    const uint32_t *xr = ap + (size_t)np * 16 * TB, *w32 = (const uint32_t *)wbuf;
    const uint32_t *rows[8] = {w32, w32 + np, w32 + 2 * np, w32 + 3 * np, w32 + 4 * np, w32 + 5 * np, w32 + 6 * np, w32 + 7 * np};
    float stage[Q3_STAGE_ROWS * 48] __attribute__((aligned(64)));
    for (int rg = r0; rg < r1; rg += 8) {
        const int R = r1 - rg < 8 ? r1 - rg : 8, at = (rg - r0) % Q3_STAGE_ROWS;
        for (int r = 0; r < 8; r++) /* rows past R repeat the last one; their results are dropped */
            decode_row(wbuf + (size_t)r * K, W, rg + (r < R ? r : R - 1));
        float *st = stage + (size_t)at * ts;
        if (TB == 1) tile8(st, ts, ap, K, wbuf, 1);
        else if (TB == 2) tile8(st, ts, ap, K, wbuf, 2);
        else if (TB == 3) tile8(st, ts, ap, K, wbuf, 3);
        for (int r = 0; r < 8; r += 4) q3_rem_dots(st + (size_t)r * ts + 16 * TB, ts, xr, rem, np, rows + r);
        if (at + 8 == Q3_STAGE_ROWS || rg + 8 >= r1) /* a full stage, or the last rows */
            q3_lane_store(out + (rg - r0 - at), ldo, stage, ts, T, at + R);
    }
    return 1;
}

void q3_a8_decode_row(uint16_t *dst, const q3_mat *W, int r) {
    pthread_once(&g_once, init_tables);
    decode_row(dst, W, r);
}

void q3_a8_decode_span(uint16_t *dst, size_t ds, const q3_mat *W, int r, int n, int rlast, int k0, int k1) {
    pthread_once(&g_once, init_tables);
    const int K = W->cols, nb = K / 32, b0 = k0 / 32, b1 = k1 / 32;
    if (W->dtype == Q3_MXFP4) {
        const __m512i lut = _mm512_loadu_si512(g_fp4_w);
        for (int i = 0; i < n; i++) {
            const size_t row = (size_t)(r + i < rlast ? r + i : rlast);
            const uint8_t *el = (const uint8_t *)W->data + row * (K / 2), *sc = W->scales + row * nb;
            for (int b = b0; b < b1; b += 4) fp4_step(dst + i * ds + (size_t)(b - b0) * 32, el + (size_t)b * 16, sc + b, lut);
        }
        return;
    }
    __m512i t8[4];
    fp8_tables(t8);
    for (int i = 0; i < n; i++) {
        const size_t row = (size_t)(r + i < rlast ? r + i : rlast);
        const uint8_t *el = (const uint8_t *)W->data + row * K, *sc = W->scales + row * nb;
        for (int b = b0; b < b1; b += 2) fp8_step(dst + i * ds + (size_t)(b - b0) * 32, el + (size_t)b * 32, sc + b, t8);
    }
}

void q3_avx512bf16_a8_prep(void *xb, const float *x, int K, q3_dtype wt) { a8_prep(xb, x, K, wt); }

void q3_avx512bf16_a8_kernels(q3_isa_kernels *k) {
    k->a8_prep = a8_prep;
    k->gemv_a8 = gemv_a8;
    k->gemv_a8_tokens = gemv_a8_tokens;
    /* Up to 12 tokens (two passes past 8) before the A8 GEMM: kernel_bench mx 1536 2048, one
     * thread, MXFP4 GFLOP/s, this against the GEMM: T = 10 179 / 132, 12 179 / 157-164, but
     * 14 173 / 185, 16 171 / 210. */
    k->a8_tokens_t = 12;
    k->a8_pack_act = a8_pack_act;
    k->gemm_a8 = gemm_a8;
}
#pragma GCC pop_options
