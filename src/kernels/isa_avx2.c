/* AVX2 + FMA kernels (F16C for half weights). Compiled for those ISAs
 * regardless of the build flags; only called after a CPUID check. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/bcast_tile_avx2.h"
#include "kernels/transpose_avx2.h"
#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))

/* Eight weights starting at element idx, widened to fp32. */
INLINE __m256 load8(const void *base, size_t idx, q3_dtype dt) {
    if (dt == Q3_F32) return _mm256_loadu_ps((const float *)base + idx);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx));
    if (dt == Q3_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Row o's sum past k (the 8-wide steps, then one element at a time) added
 * to the four accumulators' reduction. */
INLINE float row_rest(const void *d, size_t o, const float *x, const q3_mat *W, int k, q3_dtype dt, __m256 a0, __m256 a1,
                      __m256 a2, __m256 a3) {
    const int K = W->cols, k8 = K & ~7;
    for (; k < k8; k += 8) a0 = _mm256_fmadd_ps(load8(d, o + k, dt), _mm256_loadu_ps(x + k), a0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; k++) {
        float w;
        q3_to_f32(&w, d, W->dtype, o + (size_t)k, 1);
        s += x[k] * w;
    }
    return s;
}

/* One row at a time: consecutive rows are contiguous, so the weights form a
 * single sequential stream, which the hardware prefetcher follows best
 * (with the software prefetch, several rows in flight measured slower),
 * with software prefetch past its page edges (prefetch.h). Four
 * accumulators hide the FMA latency. With pf 0 (no software prefetch;
 * isa_avx512.c's gemv_hw says where that pays) two streams instead, as
 * isa_avx512.c's gemv_t pairs them, each row's sum still the one-row
 * loop's, bit for bit. */
INLINE void gemv_t(float *out, const float *x, const q3_mat *W, int r0, int r1, q3_dtype dt, const size_t pf) {
    const int K = W->cols, k32 = K & ~31;
    const size_t rs = W->rs ? W->rs : (size_t)K, es = dt == Q3_F32 ? 4 : 2;
    const void *d = W->data;
    int r = r0;
    for (int c0 = r0; !pf && r1 - c0 >= 2; c0 = r) {
        const int half = q3_pair_half(c0, r1);
        for (; r < c0 + half; r++) {
            const size_t oa = (size_t)r * rs, ob = (size_t)(r + half) * rs;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            int k = 0;
            for (; k < k32; k += 32) {
                const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8), x2 = _mm256_loadu_ps(x + k + 16),
                             x3 = _mm256_loadu_ps(x + k + 24);
                a0 = _mm256_fmadd_ps(load8(d, oa + k, dt), x0, a0);
                a1 = _mm256_fmadd_ps(load8(d, oa + k + 8, dt), x1, a1);
                a2 = _mm256_fmadd_ps(load8(d, oa + k + 16, dt), x2, a2);
                a3 = _mm256_fmadd_ps(load8(d, oa + k + 24, dt), x3, a3);
                b0 = _mm256_fmadd_ps(load8(d, ob + k, dt), x0, b0);
                b1 = _mm256_fmadd_ps(load8(d, ob + k + 8, dt), x1, b1);
                b2 = _mm256_fmadd_ps(load8(d, ob + k + 16, dt), x2, b2);
                b3 = _mm256_fmadd_ps(load8(d, ob + k + 24, dt), x3, b3);
            }
            out[r - r0] = row_rest(d, oa, x, W, k, dt, a0, a1, a2, a3);
            out[r + half - r0] = row_rest(d, ob, x, W, k, dt, b0, b1, b2, b3);
        }
        r = c0 + 2 * half;
    }
    for (; r < r1; r++) {
        const size_t o = (size_t)r * rs;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int k = 0;
        for (; k < k32; k += 32) {
            if (pf) q3_pf_lines((const char *)d + (o + k) * es, pf, 32 * es);
            a0 = _mm256_fmadd_ps(load8(d, o + k, dt), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(load8(d, o + k + 8, dt), _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(load8(d, o + k + 16, dt), _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(load8(d, o + k + 24, dt), _mm256_loadu_ps(x + k + 24), a3);
        }
        out[r - r0] = row_rest(d, o, x, W, k, dt, a0, a1, a2, a3);
    }
}

/* ---- MX weights: elements decoded arithmetically, one scale per 32. ---- */

/* 2^(code-127) times the factor the element decoders leave out. */
static float g_fp8_scale[256], g_fp4_scale[256], g_int8_scale[256], g_fp8_copy_scale[256];
static pthread_once_t g_mx_once = PTHREAD_ONCE_INIT;

static void mx_tables(void) {
    for (int c = 0; c < 256; c++) {
        g_fp8_scale[c] = c == 255 ? NAN : ldexpf(1.0f, c - 127 + 120); /* e4m3x8 returns value * 2^-120 */
        g_fp8_copy_scale[c] = c == 255 ? NAN : ldexpf(1.0f, c - 127 + 120 - Q3_FP8_COPY_EXP);
        g_fp4_scale[c] = c == 255 ? NAN : ldexpf(1.0f, c - 127 - 1);   /* e2m1 codes decode to 2 * value */
        g_int8_scale[c] = c == 255 ? NAN : ldexpf(1.0f, c - 127 - 6);  /* int8 codes are 64 * value */
    }
}

/* 32 MXINT8 codes -> 64 * value, exactly. */
INLINE void int8x32(const uint8_t *p, __m256 out[4]) {
    for (int i = 0; i < 4; i++)
        out[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i))));
}

/* 32 elements of an MX row (block b) as fp32 times the factor of
 * q3_mx_scale_table(t). */
INLINE void mx_block(const uint8_t *el, int b, q3_dtype t, __m256 e[4]);

/* Eight E4M3 codes -> value * 2^-120: the 7 magnitude bits moved to the top
 * of an fp32 exponent/mantissa give exactly that, subnormals included. */
INLINE __m256 e4m3x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i mag = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f)), 20);
    __m256i sgn = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    return _mm256_castsi256_ps(_mm256_or_si256(mag, sgn));
}

/* 32 E2M1 codes (16 bytes, element 2i in the low nibble) -> 2 * value as int8. */
INLINE void e2m1x32(const uint8_t *p, __m256 out[4]) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)q3_e2m1_x2);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8)));
}

const float *q3_mx_scale_table(q3_dtype t) {
    pthread_once(&g_mx_once, mx_tables);
    return t == Q3_MXFP4 ? g_fp4_scale : t == Q3_MXINT8 ? g_int8_scale : g_fp8_scale;
}

const float *q3_mx_copy_scale_table(q3_dtype t) {
    pthread_once(&g_mx_once, mx_tables);
    return t == Q3_MXFP8 ? g_fp8_copy_scale : q3_mx_scale_table(t);
}

INLINE void mx_block(const uint8_t *el, int b, q3_dtype t, __m256 e[4]) {
    if (t == Q3_MXFP4) e2m1x32(el + (size_t)b * 16, e);
    else if (t == Q3_MXINT8) int8x32(el + (size_t)b * 32, e);
    else {
        const uint8_t *p = el + (size_t)b * 32;
        e[0] = e4m3x8(p), e[1] = e4m3x8(p + 8), e[2] = e4m3x8(p + 16), e[3] = e4m3x8(p + 24);
    }
}

static void gemv_mx(float *out, const float *x, const q3_mat *W, int r0, int r1) {
    pthread_once(&g_mx_once, mx_tables);
    const int K = W->cols, nb = K / 32;
    const q3_dtype t = W->dtype;
    /* E4M3 elements times 2^(Q3_FP8_COPY_EXP - 120), not 2^-120: products
     * with small inputs stay normal fp32 (q3_mx_prep_copy). */
    const int fp8 = t == Q3_MXFP8;
    const __m256 lift = _mm256_set1_ps(ldexpf(1.0f, Q3_FP8_COPY_EXP));
    const float *stab = q3_mx_copy_scale_table(t);
    const size_t row_bytes = q3_mx_elem_bytes(t, (size_t)K);
    for (int r = r0; r < r1; r++) {
        const uint8_t *el = (const uint8_t *)W->data + (size_t)r * row_bytes, *sc = W->scales + (size_t)r * nb;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + b * 32;
            __m256 e[4];
            mx_block(el, b, t, e);
            if (fp8)
                for (int i = 0; i < 4; i++) e[i] = _mm256_mul_ps(e[i], lift);
            __m256 s0 = _mm256_mul_ps(e[0], _mm256_loadu_ps(xb)), s1 = _mm256_mul_ps(e[1], _mm256_loadu_ps(xb + 8));
            s0 = _mm256_fmadd_ps(e[2], _mm256_loadu_ps(xb + 16), s0);
            s1 = _mm256_fmadd_ps(e[3], _mm256_loadu_ps(xb + 24), s1);
            const __m256 scale = _mm256_set1_ps(stab[sc[b]]);
            if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), scale, acc1);
            else acc0 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), scale, acc0);
        }
        out[r - r0] = hsum(_mm256_add_ps(acc0, acc1));
    }
}

/* W[r, k0 .. k0+n) of an MX matrix to fp32; k0 and n multiples of 32. */
static void mx_row_f32(const q3_mat *W, int r, int k0, int n, float *dst) {
    pthread_once(&g_mx_once, mx_tables);
    const int nb = W->cols / 32;
    const float *stab = q3_mx_scale_table(W->dtype);
    const uint8_t *el = (const uint8_t *)W->data + (size_t)r * q3_mx_elem_bytes(W->dtype, (size_t)W->cols);
    const uint8_t *sc = W->scales + (size_t)r * nb;
    for (int k = 0; k < n; k += 32) {
        const int b = (k0 + k) / 32;
        const __m256 scale = _mm256_set1_ps(stab[sc[b]]);
        __m256 e[4];
        mx_block(el, b, W->dtype, e);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + k + 8 * i, _mm256_mul_ps(e[i], scale));
    }
}

void q3_avx2_row_f32(const q3_mat *W, int r, int k0, int n, float *dst) {
    const size_t o = (size_t)r * (W->rs ? W->rs : (size_t)W->cols) + (size_t)k0;
    switch (W->dtype) {
    case Q3_BF16:
        /* A prefetch 4 KiB ahead (the hardware prefetcher stops at page
         * edges): the broadcast GEMM widens each BF16 expert row from DRAM
         * just before use. q30b8 prefill 512: 133-134 -> 136-138 tok/s;
         * 8 and 16 KiB measured the same. */
        for (int k = 0; k < n; k += 8) {
            if (k % 32 == 0) _mm_prefetch((const char *)W->data + (o + k) * 2 + Q3_PF_BYTES, _MM_HINT_T0);
            _mm256_storeu_ps(dst + k, load8(W->data, o + k, Q3_BF16));
        }
        break;
    case Q3_F16:
        for (int k = 0; k < n; k += 8) _mm256_storeu_ps(dst + k, load8(W->data, o + k, Q3_F16));
        break;
    case Q3_MXINT8: mx_row_f32(W, r, k0, n, dst); break; /* k0, n multiples of 32 */
    case Q3_BF16P: q3_bf16p_row_f32(W, r, k0, n, dst); break; /* k0, n multiples of 64 */
    default: memcpy(dst, (const float *)W->data + o, (size_t)n * sizeof(float)); break;
    }
}

INLINE void gemv_pf(float *out, const float *x, const q3_mat *W, int r0, int r1, const size_t pf) {
    if (W->dtype == Q3_BF16P) {
        q3_gemv_bf16p_avx2(out, x, W, r0, r1, pf);
        return;
    }
    if (q3_dtype_is_mx(W->dtype) && W->cs <= 1 && W->cols % 32 == 0) {
        gemv_mx(out, x, W, r0, r1);
        return;
    }
    if (W->cs > 1 || q3_dtype_is_mx(W->dtype)) {
        q3_kernels_scalar.gemv(out, x, W, r0, r1);
        return;
    }
    switch (W->dtype) {
    case Q3_BF16: gemv_t(out, x, W, r0, r1, Q3_BF16, pf); break;
    case Q3_F16: gemv_t(out, x, W, r0, r1, Q3_F16, pf); break;
    case Q3_F32: gemv_t(out, x, W, r0, r1, Q3_F32, pf); break;
    default: break;
    }
}

static void gemv(float *out, const float *x, const q3_mat *W, int r0, int r1) { gemv_pf(out, x, W, r0, r1, Q3_PF_WEIGHTS); }

/* Without software prefetch, two rows at a time (isa_avx512.c's gemv_hw).
 * On the Zen 4 of BENCHMARKS.md with this table forced, one row at a time,
 * reads of 61-66 GB/s: 59-62 GB/s without the prefetch, 42-43 with it. */
static void gemv_hw(float *out, const float *x, const q3_mat *W, int r0, int r1) { gemv_pf(out, x, W, r0, r1, 0); }

void q3_avx2_hw_prefetch_kernels(q3_isa_kernels *k) { k->gemv = gemv_hw; }

/* Few tokens: R (2 or 4) weight rows x up to 6 tokens of accumulators,
 * each weight vector widened once, in a register, for all the tokens;
 * every (row, token) result is an 8-lane accumulation over k in order and
 * one reduction, whatever the block. The first token block prefetches the
 * next R rows into L2 as one stream, spread over these rows' steps (as
 * isa_avx512.c's few-token kernel, where two row streams a row apart had
 * run at half the rate of one). */
INLINE void small_block(float *out, size_t ldo, const float *x, size_t ldx, const q3_mat *W, int r, int t0, const int TB,
                        const int R, q3_dtype dt) {
    const int K = W->cols;
    const size_t rs = W->rs ? W->rs : (size_t)K, es = dt == Q3_F32 ? 4 : 2, o0 = (size_t)r * rs;
    const char *d = W->data, *next = d + (o0 + (size_t)R * rs) * es;
    __m256 acc[4][6];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 6
        for (int t = 0; t < TB; t++) acc[i][t] = _mm256_setzero_ps();
    for (int k = 0; k < K; k += 8) {
        if (t0 == 0 && (k * R * es) % 64 == 0) _mm_prefetch(next + (size_t)k * R * es, _MM_HINT_T1);
        __m256 w[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) w[i] = load8(d, o0 + (size_t)i * rs + k, dt);
#pragma GCC unroll 6
        for (int t = 0; t < TB; t++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)(t0 + t) * ldx + k);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[i][t] = _mm256_fmadd_ps(w[i], xv, acc[i][t]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < TB; t++)
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) out[(size_t)(t0 + t) * ldo + r + i] = hsum(acc[i][t]);
}

/* Rows r .. r + R - 1 against tb tokens from t0 (R == 4: tb <= 2, else <= 6). */
INLINE void small_rows(float *out, size_t ldo, const float *x, size_t ldx, const q3_mat *W, int r, int t0, int tb, const int R,
                       q3_dtype dt) {
    switch (tb) {
    case 1: small_block(out, ldo, x, ldx, W, r, t0, 1, R, dt); break;
    case 2: small_block(out, ldo, x, ldx, W, r, t0, 2, R, dt); break;
    case 3: if (R == 2) small_block(out, ldo, x, ldx, W, r, t0, 3, 2, dt); break;
    case 4: if (R == 2) small_block(out, ldo, x, ldx, W, r, t0, 4, 2, dt); break;
    case 5: if (R == 2) small_block(out, ldo, x, ldx, W, r, t0, 5, 2, dt); break;
    default: if (R == 2) small_block(out, ldo, x, ldx, W, r, t0, 6, 2, dt); break;
    }
}

/* 4 rows at a time for 2 tokens (8 accumulators, where 2 rows left the FMA
 * latency exposed), else 2 rows against token blocks of at most 6, as even
 * as that allows (7 tokens as 4 + 3, not 6 + 1). */
INLINE void small_t(float *out, size_t ldo, const float *x, size_t ldx, int T, const q3_mat *W, int r0, int r1, q3_dtype dt) {
    const int nb = (T + 5) / 6, tbs = (T + nb - 1) / nb;
    for (int r = r0, R; r < r1; r += R) {
        R = T <= 2 && r1 - r >= 4 ? 4 : 2;
        for (int t0 = 0; t0 < T; t0 += tbs) {
            const int tb = T - t0 < tbs ? T - t0 : tbs;
            if (R == 4) small_rows(out, ldo, x, ldx, W, r, t0, tb, 4, dt);
            else small_rows(out, ldo, x, ldx, W, r, t0, tb, 2, dt);
        }
    }
}

static void gemm_small(float *out, size_t ldo, const float *x, size_t ldx, int T, const q3_mat *W, int r0, int r1) {
    switch (W->dtype) {
    case Q3_BF16: small_t(out, ldo, x, ldx, T, W, r0, r1, Q3_BF16); break;
    case Q3_F16: small_t(out, ldo, x, ldx, T, W, r0, r1, Q3_F16); break;
    case Q3_F32: small_t(out, ldo, x, ldx, T, W, r0, r1, Q3_F32); break;
    default: break;
    }
}

/* Widen and transpose 16 full rows x kc (a multiple of 8) in 8x8 tiles. */
INLINE void pack_t(float *Bp, const q3_mat *W, int r0, int k0, int kc, q3_dtype dt) {
    const size_t rs = W->rs ? W->rs : (size_t)W->cols;
    for (int jb = 0; jb < Q3_NR; jb += 8)
        for (int k = 0; k < kc; k += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = load8(W->data, (size_t)(r0 + jb + j) * rs + (size_t)(k0 + k), dt);
            q3_avx2_transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_store_ps(Bp + (size_t)(k + i) * Q3_NR + jb, r[i]);
        }
}

/* MX panels: decode each row's segment, then transpose like the others. */
static void pack_mx(float *Bp, const q3_mat *W, int r0, int k0, int kc) {
    float rows[8][Q3_KC] __attribute__((aligned(32)));
    for (int jb = 0; jb < Q3_NR; jb += 8) {
        for (int j = 0; j < 8; j++) mx_row_f32(W, r0 + jb + j, k0, kc, rows[j]);
        for (int k = 0; k < kc; k += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = _mm256_load_ps(rows[j] + k);
            q3_avx2_transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_store_ps(Bp + (size_t)(k + i) * Q3_NR + jb, r[i]);
        }
    }
}

static void pack(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc) {
    if (q3_dtype_is_mx(W->dtype)) {
        if (W->cols % 32 == 0 && k0 % 32 == 0 && kc % 32 == 0) pack_mx(Bp, W, r0, k0, kc);
        else q3_pack_panel(Bp, W, r0, nr, k0, kc);
        return;
    }
    switch (W->dtype) {
    case Q3_BF16: pack_t(Bp, W, r0, k0, kc, Q3_BF16); break;
    case Q3_F16: pack_t(Bp, W, r0, k0, kc, Q3_F16); break;
    case Q3_F32: pack_t(Bp, W, r0, k0, kc, Q3_F32); break;
    default: q3_pack_panel(Bp, W, r0, nr, k0, kc); break;
    }
}

/* Full 6x16 tile with every accumulator in a named register (GCC does not
 * keep an array of vectors in registers reliably). */
INLINE void micro_full(const float *A, size_t lda, size_t ska, const float *Bp, int kc, __m256 c[Q3_MR][2]) {
    __m256 c00 = c[0][0], c01 = c[0][1], c10 = c[1][0], c11 = c[1][1], c20 = c[2][0], c21 = c[2][1];
    __m256 c30 = c[3][0], c31 = c[3][1], c40 = c[4][0], c41 = c[4][1], c50 = c[5][0], c51 = c[5][1];
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda, *a4 = A + 4 * lda, *a5 = A + 5 * lda;
    for (int k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(Bp + k * Q3_NR), b1 = _mm256_load_ps(Bp + k * Q3_NR + 8);
        const size_t ak = (size_t)k * ska;
        __m256 a;
#define ROW(i)                                   \
    a = _mm256_broadcast_ss(a##i + ak);          \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);   \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
    }
    c[0][0] = c00, c[0][1] = c01, c[1][0] = c10, c[1][1] = c11, c[2][0] = c20, c[2][1] = c21;
    c[3][0] = c30, c[3][1] = c31, c[4][0] = c40, c[4][1] = c41, c[5][0] = c50, c[5][1] = c51;
}

static void micro(const float *A, size_t lda, size_t ska, const float *Bp, int kc, float *C, size_t ldc, int mt, int nt,
                  int accumulate) {
    __m256 c[Q3_MR][2];
    float tmp[Q3_NR];
    for (int t = 0; t < Q3_MR; t++) {
        c[t][0] = c[t][1] = _mm256_setzero_ps();
        if (accumulate && t < mt) {
            const float *src = C + t * ldc;
            if (nt < Q3_NR) {
                for (int j = 0; j < Q3_NR; j++) tmp[j] = j < nt ? src[j] : 0.0f;
                src = tmp;
            }
            c[t][0] = _mm256_loadu_ps(src);
            c[t][1] = _mm256_loadu_ps(src + 8);
        }
    }
    if (mt == Q3_MR) {
        micro_full(A, lda, ska, Bp, kc, c);
    } else {
        /* Tail tiles: same per-element FMA sequence as the full tile, with the
         * rows interleaved so their FMA chains overlap. */
        for (int k = 0; k < kc; k++) {
            const __m256 b0 = _mm256_load_ps(Bp + k * Q3_NR), b1 = _mm256_load_ps(Bp + k * Q3_NR + 8);
#pragma GCC unroll 6
            for (int t = 0; t < Q3_MR; t++)
                if (t < mt) {
                    const __m256 a = _mm256_broadcast_ss(A + t * lda + (size_t)k * ska);
                    c[t][0] = _mm256_fmadd_ps(a, b0, c[t][0]);
                    c[t][1] = _mm256_fmadd_ps(a, b1, c[t][1]);
                }
        }
    }
    for (int t = 0; t < mt; t++) {
        float *dst = C + t * ldc;
        if (nt == Q3_NR) {
            _mm256_storeu_ps(dst, c[t][0]);
            _mm256_storeu_ps(dst + 8, c[t][1]);
        } else {
            _mm256_storeu_ps(tmp, c[t][0]);
            _mm256_storeu_ps(tmp + 8, c[t][1]);
            for (int j = 0; j < nt; j++) dst[j] = tmp[j];
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void scale(float *y, float a, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}

/* ---- Prefill attention tiles (isa.h): query rows in the 8 lanes. ---- */

/* exp(x) for x <= 0 as 2^n * e^r, n = round(x / ln 2), |r| <= ln(2) / 2, e^r
 * by its degree-7 Taylor polynomial (truncation 5e-9, so about 2 ulp from
 * rounding). Below -87.3 (the causal mask's -inf included) it returns 0
 * instead of a subnormal, so 2^n stays a normal float; NaN stays NaN. */
INLINE __m256 exp_neg8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x); /* x second: a NaN passes through */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2 in two steps: 0.693359375 has few bits, so n * it is exact. */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* ni (<= 6) rows of C x 16 lanes: 12 accumulators, 2 loads of B and up to 6
 * broadcasts of A per k. Called with ni = 6 for full blocks, so the row
 * guards fold away there. */
INLINE void att_block(float *C, const float *A, size_t si, size_t sk, const float *B, int R, int ni, int nk, int accumulate) {
    __m256 c[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        c[i][0] = c[i][1] = _mm256_setzero_ps();
        if (i < ni && accumulate) c[i][0] = _mm256_loadu_ps(C + (size_t)i * R), c[i][1] = _mm256_loadu_ps(C + (size_t)i * R + 8);
    }
    for (int k = 0; k < nk; k++) {
        const __m256 b0 = _mm256_loadu_ps(B + (size_t)k * R), b1 = _mm256_loadu_ps(B + (size_t)k * R + 8);
        const float *a = A + k * sk;
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++)
            if (i < ni) {
                const __m256 av = _mm256_broadcast_ss(a + i * si);
                c[i][0] = _mm256_fmadd_ps(av, b0, c[i][0]);
                c[i][1] = _mm256_fmadd_ps(av, b1, c[i][1]);
            }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
        if (i < ni) _mm256_storeu_ps(C + (size_t)i * R, c[i][0]), _mm256_storeu_ps(C + (size_t)i * R + 8, c[i][1]);
}

/* Lane chunks outer: the chunk's slice of B (nk x 16 floats) stays in L1
 * while the rows of A stream past it. */
static void att_mm(float *C, const float *A, size_t si, size_t sk, const float *B, int R, int ni, int nk, int accumulate) {
    for (int r0 = 0; r0 < R; r0 += 16)
        for (int i0 = 0; i0 < ni; i0 += 6) {
            float *c = C + (size_t)i0 * R + r0;
            if (ni - i0 >= 6) att_block(c, A + i0 * si, si, sk, B + r0, R, 6, nk, accumulate);
            else att_block(c, A + i0 * si, si, sk, B + r0, R, ni - i0, nk, accumulate);
        }
}

static void att_softmax(float *S, int nk, int R, float scale, const float *lim, float *m, float *l, float *O, int D) {
    const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    for (int r = 0; r < R; r += 8) {
        const __m256 m0 = _mm256_loadu_ps(m + r), lv = lim ? _mm256_loadu_ps(lim + r) : ninf;
        __m256 mx = m0, sum = _mm256_setzero_ps();
        for (int j = 0; j < nk; j++) {
            float *s = S + (size_t)j * R + r;
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s), vs);
            if (lim) v = _mm256_blendv_ps(v, ninf, _mm256_cmp_ps(_mm256_set1_ps((float)j), lv, _CMP_GT_OQ));
            _mm256_storeu_ps(s, v);
            mx = _mm256_max_ps(mx, v);
        }
        const __m256 corr = exp_neg8(_mm256_sub_ps(m0, mx)); /* m0 = -inf on the first block gives 0 */
        for (int j = 0; j < nk; j++) {
            float *s = S + (size_t)j * R + r;
            const __m256 p = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s), mx));
            _mm256_storeu_ps(s, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_storeu_ps(l + r, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(l + r), corr), sum));
        _mm256_storeu_ps(m + r, mx);
        for (int d = 0; d < D; d++) _mm256_storeu_ps(O + (size_t)d * R + r, _mm256_mul_ps(_mm256_loadu_ps(O + (size_t)d * R + r), corr));
    }
}

/* ---- Decode attention (isa.h att_decode) ---- */

/* Raw scores of keys k_i = k + i * stride, i < ni (<= 12), for the heads
 * in the lanes of qt[D][8] into s[i][8]: 12 accumulators, one load of qt
 * and 12 broadcasts of K per element for full tiles. */
INLINE void score_block(float *s, const float *k, size_t stride, const float *qt, int D, int ni) {
    __m256 c[12];
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++)
        if (i < ni) c[i] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
        const __m256 b = _mm256_load_ps(qt + 8 * d);
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            if (i < ni) c[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(k + i * stride + d), b, c[i]);
    }
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++)
        if (i < ni) _mm256_store_ps(s + 8 * i, c[i]);
}

/* Rows r[h] (h < G, zero above) <-> columns: 8 x 8 at column d0 of rows
 * `ld` floats apart. */
INLINE void load_rows8(__m256 r[8], const float *src, size_t ld, int G, int d0) {
    for (int h = 0; h < 8; h++) r[h] = h < G ? _mm256_loadu_ps(src + h * ld + d0) : _mm256_setzero_ps();
}

/* Prefetch key rows [j0, j1) of D floats, `stride` apart from base, into L1
 * (l1) or L2. The rows may lie past the cache's end (a prefetch never
 * faults), so the address is computed as an integer. */
INLINE void prefetch_rows(const float *base, size_t stride, int j0, int j1, int D, int l1) {
    for (int j = j0; j < j1; j++)
        for (int d = 0; d < D; d += 16) {
            const char *a = (const char *)((uintptr_t)base + ((size_t)j * stride + (size_t)d) * sizeof(float));
            if (l1) _mm_prefetch(a, _MM_HINT_T0);
            else _mm_prefetch(a, _MM_HINT_T1);
        }
}

/* o_h += sum_j p[h][j] v_j for h < G (o_h at o + h * sts, p rows
 * Q3_ATT_BLOCK floats apart): tiles of 4 heads x 3 vectors of output dims,
 * 3 loads of v_j and 4 broadcasts of p per key for 12 FMAs. Before each
 * tile, a share of the next block's K rows (at `next`) is prefetched into
 * L2, so the memory system keeps streaming while this pass works from L2
 * (kernel_bench attn, 8 layers at 4064 positions: 4-6 % faster). */
#define PV(HT, VT) q3_avx2_bcast_tile(o + h0 * sts + d0, sts, p + h0 * Q3_ATT_BLOCK, Q3_ATT_BLOCK, v + d0, stride, nk, HT, VT, 0)
static void pv_heads(float *o, size_t sts, const float *v, size_t stride, const float *p, int nk, int G, int D,
                     const float *next) {
    const int ntiles = (D + 23) / 24 * ((G + 3) / 4), per = (Q3_ATT_BLOCK + ntiles - 1) / ntiles;
    int pk = 0;
    for (int d0 = 0; d0 < D;) {
        const int vt = D - d0 >= 24 ? 3 : 1;
        for (int h0 = 0; h0 < G; h0 += 4) {
            const int ht = G - h0 < 4 ? G - h0 : 4;
            prefetch_rows(next, stride, pk, pk + per, D, 0);
            pk += per;
            if (vt == 3) {
                if (ht == 4) PV(4, 3);
                else if (ht == 3) PV(3, 3);
                else if (ht == 2) PV(2, 3);
                else PV(1, 3);
            } else {
                if (ht == 4) PV(4, 1);
                else if (ht == 3) PV(3, 1);
                else if (ht == 2) PV(2, 1);
                else PV(1, 1);
            }
        }
        d0 += 8 * vt;
    }
}
#undef PV

/* The G (<= 8) heads of one KV group at once, so each K and V row is read
 * once for all of them, straight from the cache: scores with the heads in
 * the lanes (S^T = K Q^T), the softmax one lane per head, then o += P V
 * with the output dims in the lanes. Measured (kernel_bench attn, one
 * thread, cache-resident): 1.6-1.7x faster than one head at a time. */
static void att_decode(const float *q, int G, const float *k, const float *v, size_t stride, int nk, int D, float scale,
                       float *st, size_t sts) {
    float qt[Q3_DEC_DMAX * 8] __attribute__((aligned(32)));
    float s[Q3_ATT_BLOCK * 8] __attribute__((aligned(32)));
    __m256 r[8], mold, lold;
    {
        float m8[8], l8[8];
        for (int h = 0; h < 8; h++) m8[h] = h < G ? st[h * sts] : -INFINITY, l8[h] = h < G ? st[h * sts + 1] : 0.0f;
        mold = _mm256_loadu_ps(m8), lold = _mm256_loadu_ps(l8);
    }
    for (int d0 = 0; d0 < D; d0 += 8) { /* Q^T; padding lanes 0, so their scores stay finite */
        load_rows8(r, q, (size_t)D, G, d0);
        q3_avx2_transpose8(r);
        for (int i = 0; i < 8; i++) _mm256_store_ps(qt + (size_t)(d0 + i) * 8, r[i]);
    }
    /* Scores 12 keys at a time. The K rows two tiles ahead are prefetched,
     * past the block's end too (a head's keys are contiguous in the cache
     * and a thread's next block is mostly the following one; a prefetch
     * never faults), and the tile's V rows into L2 for the o += P V pass. */
    for (int j = 0; j < nk; j += 12) {
        const int n = nk - j < 12 ? nk - j : 12;
        prefetch_rows(k, stride, j + 24, j + 24 + n, D, 1);
        prefetch_rows(v, stride, j, j + n, D, 0);
        int i = 0; /* constant tile shapes: 12, then 4s and 1s at the block's end */
        if (n == 12) score_block(s + 8 * j, k + (size_t)j * stride, stride, qt, D, 12), i = 12;
        for (; i + 4 <= n; i += 4) score_block(s + 8 * (j + i), k + (size_t)(j + i) * stride, stride, qt, D, 4);
        for (; i < n; i++) score_block(s + 8 * (j + i), k + (size_t)(j + i) * stride, stride, qt, D, 1);
    }
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 mx = mold, sum = _mm256_setzero_ps();
    for (int j = 0; j < nk; j++) {
        const __m256 x = _mm256_mul_ps(_mm256_load_ps(s + 8 * j), vs);
        _mm256_store_ps(s + 8 * j, x);
        mx = _mm256_max_ps(mx, x);
    }
    const __m256 corr = exp_neg8(_mm256_sub_ps(mold, mx)); /* -inf at first: 0 */
    for (int j = 0; j < nk; j++) {
        const __m256 p = exp_neg8(_mm256_sub_ps(_mm256_load_ps(s + 8 * j), mx));
        _mm256_store_ps(s + 8 * j, p);
        sum = _mm256_add_ps(sum, p);
    }
    for (int j = nk; j < ((nk + 7) & ~7); j++) _mm256_store_ps(s + 8 * j, _mm256_setzero_ps());
    float p[8 * Q3_ATT_BLOCK] __attribute__((aligned(32))); /* P[h][j] */
    for (int j0 = 0; j0 < nk; j0 += 8) {
        for (int i = 0; i < 8; i++) r[i] = _mm256_load_ps(s + 8 * (j0 + i));
        q3_avx2_transpose8(r);
        for (int h = 0; h < 8; h++) _mm256_store_ps(p + h * Q3_ATT_BLOCK + j0, r[h]);
    }
    float m8[8], l8[8], c8[8];
    _mm256_storeu_ps(m8, mx);
    _mm256_storeu_ps(l8, _mm256_fmadd_ps(lold, corr, sum));
    _mm256_storeu_ps(c8, corr);
    for (int h = 0; h < G; h++)
        for (int d = 0; d < D; d += 8) {
            float *oh = st + h * sts + 2 + d;
            _mm256_storeu_ps(oh, _mm256_mul_ps(_mm256_loadu_ps(oh), _mm256_set1_ps(c8[h])));
        }
    pv_heads(st + 2, sts, v, stride, p, nk, G, D, k + (size_t)nk * stride); /* at most one past the end */
    for (int h = 0; h < G; h++) st[h * sts] = m8[h], st[h * sts + 1] = l8[h];
}

/* ---- Element-wise activation helpers (isa.h) ---- */

/* isa_avx512.c's mx8_fake_quant with 8 lanes: quant/mx.c's fast path (each
 * element rounded to its quantum 2^q by adding and subtracting 2^(q+23),
 * clamped to the largest element times 2^e), blocks outside its exponent
 * range through quant/mx.c itself. MXFP8 and MXINT8 (6 "mantissa" bits,
 * one quantum per block, unsigned zeros). */
INLINE int fake_quant(q3_dtype t, const float *x, size_t n, float *y) {
    const __m256i expo = _mm256_set1_epi32(0x7f800000), absm = _mm256_set1_epi32(0x7fffffff);
    const int i8 = t == Q3_MXINT8, mbits = i8 ? 6 : 3, emin = i8 ? 0 : -6;
    const float emax_val = i8 ? 127.0f / 64 : 448.0f;
    if (n % 32) return q3_mx_fake_quant_row(t, x, n, y);
    int bad = 0;
    for (size_t i = 0; i < n; i += 8)
        bad |= _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), expo), expo));
    if (bad) return q3_mx_fake_quant_row(t, x, n, y); /* the error, naming the element */
    for (size_t b = 0; b < n; b += 32) {
        __m256i u[4], a[4];
        for (int h = 0; h < 4; h++) {
            u[h] = _mm256_loadu_si256((const __m256i *)(x + b + 8 * h));
            a[h] = _mm256_and_si256(u[h], absm);
        }
        __m256i mx = _mm256_max_epu32(_mm256_max_epu32(a[0], a[1]), _mm256_max_epu32(a[2], a[3])); /* |x| orders as its bits */
        __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
        m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
        m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
        const uint32_t abits = (uint32_t)_mm_cvtsi128_si32(m4);
        float amax;
        memcpy(&amax, &abits, 4);
        const int e = q3_mx_shared_exp(t, amax);
        if (e < -100 || e > 90) {
            if (q3_mx_fake_quant_row(t, x + b, 32, y + b)) return -1;
            continue;
        }
        const __m256i qmin = _mm256_set1_epi32(e + emin - mbits);
        const __m256 top = _mm256_set1_ps(emax_val * q3_e8m0_to_f32((uint8_t)(e + 127)));
        for (int h = 0; h < 4; h++) {
            const __m256i q = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(a[h], 23), _mm256_set1_epi32(127 + mbits)), qmin);
            const __m256 magic = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(150)), 23));
            const __m256 av = _mm256_castsi256_ps(a[h]);
            const __m256 r = _mm256_min_ps(_mm256_sub_ps(_mm256_add_ps(av, magic), magic), top);
            __m256i sign = _mm256_andnot_si256(absm, u[h]);
            if (i8) /* integers have no -0 */
                sign = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(r, _mm256_setzero_ps(), _CMP_EQ_OQ)), sign);
            _mm256_storeu_si256((__m256i *)(y + b + 8 * h), _mm256_or_si256(_mm256_castps_si256(r), sign));
        }
    }
    return 0;
}

static int mx8_fake_quant(const float *x, size_t n, float *y) { return fake_quant(Q3_MXFP8, x, n, y); }
static int mxi8_fake_quant(const float *x, size_t n, float *y) { return fake_quant(Q3_MXINT8, x, n, y); }

/* silu(g) = g / (1 + e^-g), with e^-|g| from exp_neg8: for g < 0 it is
 * g e^g / (1 + e^g), so the exponential never overflows. */
static void swiglu(float *out, const float *gate, const float *up, int n) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        const __m256 t = exp_neg8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_and_ps(g, absm)));
        const __m256 num = _mm256_blendv_ps(g, _mm256_mul_ps(g, t), _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, t)), u));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

const q3_isa_kernels q3_kernels_avx2 = {.mr = Q3_MR, .gemv = gemv, .micro = micro, .small_t = 16, .gemm_small = gemm_small,
    .pack = pack, .dot = dot, .axpy = axpy, .scale = scale, .att_mm = att_mm, .att_softmax = att_softmax,
    .att_decode = att_decode, .mx8_fake_quant = mx8_fake_quant, .mxi8_fake_quant = mxi8_fake_quant, .swiglu = swiglu,
    .mx_prep = q3_avx2_mx_prep, .gemv_mx = q3_avx2_gemv_mx, .gemv_mx_tokens = q3_avx2_gemv_mx_tokens, .tokens_t = 8, .bc_pack_act = q3_avx2_bc_pack_act,
    .gemm_bc = q3_avx2_gemm_bc, .bc_mx = 1, .bc_bf16p = 1, .bc_max_t = Q3_BC_TOKENS_MAX,
    /* longer products as passes of gemm_bc, not the panel GEMM, whose packed input of a 1024-token
     * chunk (16 MiB for o_proj) streams from DRAM: q30b8 prefill 4096 on the Zen 5 of BENCHMARKS.md,
     * attention projections 9271 / 10781 -> 7223 / 7111 ms; prefill 512 unchanged */
    .lane_split = 1,
    /* the crossovers: kernel_bench 8192x2048 for the MX GEMVs; 768 x 2048 expert products from DRAM, one
     * thread, for gemm_small (13-15 tokens 74-78 GFLOP/s against the broadcast GEMM's 60-76, 16 on par) */
    .bc_min_t = 16, .mx_gemv_t = 8, .i8_gemv_t = 8,
    .i8_prep = q3_avx2_i8_prep, .gemv_i8 = q3_avx2_gemv_i8, .i8_pack_act = q3_avx2_i8_pack_act,
    .gemm_i8 = q3_avx2_gemm_i8,
    /* one token's MXFP8 inputs against MXFP4 weights in integers (more take gemv_mx_tokens) */
    .a8_prep = q3_avx2_a8_prep, .gemv_a8 = q3_avx2_gemv_a8};
#pragma GCC pop_options
