/* AVX-512F kernels: 16-lane GEMV for plain dtypes and a 14x16 GEMM tile
 * (one zmm per token row, 14 accumulators), and 64-row prefill attention
 * tiles. Products of 2-8 tokens go to gemm_small here, more to
 * gemm_bc_avx512.c; MX weights, packing and the attention vector
 * primitives reuse the AVX2 versions. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"

#define INLINE static inline __attribute__((always_inline))
#define MR512 14

INLINE __m512 load16(const void *base, size_t idx, q3_dtype dt) {
    if (dt == Q3_F32) return _mm512_loadu_ps((const float *)base + idx);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + idx));
    if (dt == Q3_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Row o's sum past k (the 16-wide steps, then one element at a time)
 * added to the four accumulators' reduction. */
INLINE float row_rest(const void *d, size_t o, const float *x, const q3_mat *W, int k, q3_dtype dt, __m512 a0, __m512 a1,
                      __m512 a2, __m512 a3) {
    const int K = W->cols, k16 = K & ~15;
    for (; k < k16; k += 16) a0 = _mm512_fmadd_ps(load16(d, o + k, dt), _mm512_loadu_ps(x + k), a0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; k < K; k++) {
        float w;
        q3_to_f32(&w, d, W->dtype, o + (size_t)k, 1);
        s += x[k] * w;
    }
    return s;
}

/* One row at a time (a single sequential weight stream, prefetched pf
 * bytes ahead as prefetch.h says), four accumulators. With pf 0 (no
 * software prefetch) two streams instead, for the hardware prefetchers:
 * the two halves of each span of Q3_GEMV_PAIR_SPAN rows side by side, row
 * i with row half + i (an odd last row alone); each row's sum is still the
 * one-row loop's, bit for bit. */
INLINE void gemv_t(float *out, const float *x, const q3_mat *W, int r0, int r1, q3_dtype dt, const size_t pf) {
    const int K = W->cols, k64 = K & ~63;
    const size_t rs = W->rs ? W->rs : (size_t)K, es = dt == Q3_F32 ? 4 : 2;
    const void *d = W->data;
    int r = r0;
    for (int c0 = r0; !pf && r1 - c0 >= 2; c0 = r) {
        const int half = q3_pair_half(c0, r1);
        for (; r < c0 + half; r++) {
            const size_t oa = (size_t)r * rs, ob = (size_t)(r + half) * rs;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            int k = 0;
            for (; k < k64; k += 64) {
                const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16), x2 = _mm512_loadu_ps(x + k + 32),
                             x3 = _mm512_loadu_ps(x + k + 48);
                a0 = _mm512_fmadd_ps(load16(d, oa + k, dt), x0, a0);
                a1 = _mm512_fmadd_ps(load16(d, oa + k + 16, dt), x1, a1);
                a2 = _mm512_fmadd_ps(load16(d, oa + k + 32, dt), x2, a2);
                a3 = _mm512_fmadd_ps(load16(d, oa + k + 48, dt), x3, a3);
                b0 = _mm512_fmadd_ps(load16(d, ob + k, dt), x0, b0);
                b1 = _mm512_fmadd_ps(load16(d, ob + k + 16, dt), x1, b1);
                b2 = _mm512_fmadd_ps(load16(d, ob + k + 32, dt), x2, b2);
                b3 = _mm512_fmadd_ps(load16(d, ob + k + 48, dt), x3, b3);
            }
            out[r - r0] = row_rest(d, oa, x, W, k, dt, a0, a1, a2, a3);
            out[r + half - r0] = row_rest(d, ob, x, W, k, dt, b0, b1, b2, b3);
        }
        r = c0 + 2 * half;
    }
    for (; r < r1; r++) {
        const size_t o = (size_t)r * rs;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int k = 0;
        for (; k < k64; k += 64) {
            if (pf) q3_pf_lines((const char *)d + (o + k) * es, pf, 64 * es);
            a0 = _mm512_fmadd_ps(load16(d, o + k, dt), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(load16(d, o + k + 16, dt), _mm512_loadu_ps(x + k + 16), a1);
            a2 = _mm512_fmadd_ps(load16(d, o + k + 32, dt), _mm512_loadu_ps(x + k + 32), a2);
            a3 = _mm512_fmadd_ps(load16(d, o + k + 48, dt), _mm512_loadu_ps(x + k + 48), a3);
        }
        out[r - r0] = row_rest(d, o, x, W, k, dt, a0, a1, a2, a3);
    }
}

INLINE void gemv_pf(float *out, const float *x, const q3_mat *W, int r0, int r1, const size_t pf) {
    if (W->dtype == Q3_BF16P) {
        if (q3_cpu_avx512bw()) q3_gemv_bf16p_avx512(out, x, W, r0, r1, pf);
        else q3_gemv_bf16p_avx2(out, x, W, r0, r1, pf);
        return;
    }
    /* MX weights (the shapes the prepared GEMV does not take) and column
     * slices: AVX2's GEMV. */
    if (W->cs > 1 || q3_dtype_is_mx(W->dtype)) {
        q3_kernels_avx2.gemv(out, x, W, r0, r1);
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

/* The same without software prefetch, two rows at a time. On the AMD EPYC
 * (Zen 4) of BENCHMARKS.md, a 1 GiB BF16 GEMV (2 threads) alternating with
 * a plain read of its bytes in one process ran at 0.93 of the read (median
 * of 6 pairs, 59-62 GB/s) without the prefetches and at 0.69 with them
 * (43-45 GB/s); one thread, prefetched, streamed 15.5 GB/s where a plain
 * read got 35, so the prefetches, not the loads, cap what is in flight.
 * Prefetching only the first lines of each 4 KiB page ahead, 0.78-0.90.
 * Two streams per call against one, no prefetch, in one process with reads
 * at 59-62 GB/s: 1 GiB 47.2 -> 59.9 GB/s, q30b8's QKV-sized matrices 45.0
 * -> 51.6, its experts' gate-sized 45.8 -> 53.2; four streams no better
 * than two; the halves of a whole per-thread share, far apart, slower than
 * one stream (hence Q3_GEMV_PAIR_SPAN). The MX GEMVs there do better with
 * their prefetch (MXFP4 A8 42-46 against 30-39 GB/s), so they keep it. */
static void gemv_hw(float *out, const float *x, const q3_mat *W, int r0, int r1) { gemv_pf(out, x, W, r0, r1, 0); }

void q3_avx512_hw_prefetch_kernels(q3_isa_kernels *k) { k->gemv = gemv_hw; }

/* Few tokens: R (2 or 4) weight rows x up to 8 tokens of accumulators.
 * Each weight vector is widened once, in a register, for all the tokens.
 * Every (row, token) result is a 16-lane accumulation over k in order and
 * one reduction, whatever the block. (K % 16 == 0.)
 * The next R rows are prefetched into L2 as one stream, spread over
 * these rows' steps: a fixed distance ahead of each row's own stream, as
 * the GEMV prefetches, reached a pair's second row only from its first,
 * and DRAM serves two streams a row apart at half the rate of one (a
 * microbenchmark: 31 against 59-63 GB/s). The model's experts of 2-8
 * tokens of a 512-token q30b8 prefill (q3_matmul_jobs, huge pages), GEMV
 * distance -> this, 2 threads: 105-112 -> 116-118 GFLOP/s; one thread 56-57
 * -> 61-62 (into L1 instead: 54-60; 2, 4 or 8 rows ahead per row: 53-58).
 * 4 rows load each token's inputs half as often per FMA (8 tokens of
 * inputs, 64 KiB for K = 2048, do not stay in L1): the gate and up
 * products of 32 experts (768 x 2048, from DRAM), 2 threads, both in one
 * process, 2 -> 4 rows: T = 2 0.93-0.99 of the time (once 1.08), 3 0.91-0.97,
 * 4 0.93-0.95, 5 0.84-0.86, 6 0.78-0.84; down (2048 x 768) T = 6 0.77. */
INLINE void small_block(float *out, size_t ldo, const float *x, size_t ldx, const q3_mat *W, int r, int t0, const int TB,
                        const int R, q3_dtype dt) {
    const int K = W->cols;
    const size_t rs = W->rs ? W->rs : (size_t)K, es = dt == Q3_F32 ? 4 : 2;
    const size_t o0 = (size_t)r * rs;
    const char *d = W->data, *next = d + (o0 + R * rs) * es;
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) acc[i][t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        for (size_t o = 0; o < R * 16 * es; o += 64) _mm_prefetch(next + (size_t)k * R * es + o, _MM_HINT_T1);
        __m512 w[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) w[i] = load16(d, o0 + (size_t)i * rs + k, dt);
#pragma GCC unroll 8
        for (int t = 0; t < TB; t++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)(t0 + t) * ldx + k);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[i][t] = _mm512_fmadd_ps(w[i], xv, acc[i][t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TB; t++)
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) out[(size_t)(t0 + t) * ldo + r + i] = _mm512_reduce_add_ps(acc[i][t]);
}

/* Rows r .. r + R - 1 against tb <= 8 tokens from t0 (R == 4: tb <= 6). */
INLINE void small_rows(float *out, size_t ldo, const float *x, size_t ldx, const q3_mat *W, int r, int t0, int tb, const int R,
                       q3_dtype dt) {
    switch (tb) {
    case 1: small_block(out, ldo, x, ldx, W, r, t0, 1, R, dt); break;
    case 2: small_block(out, ldo, x, ldx, W, r, t0, 2, R, dt); break;
    case 3: small_block(out, ldo, x, ldx, W, r, t0, 3, R, dt); break;
    case 4: small_block(out, ldo, x, ldx, W, r, t0, 4, R, dt); break;
    case 5: small_block(out, ldo, x, ldx, W, r, t0, 5, R, dt); break;
    case 6: small_block(out, ldo, x, ldx, W, r, t0, 6, R, dt); break;
    case 7: if (R == 2) small_block(out, ldo, x, ldx, W, r, t0, 7, 2, dt); break;
    default: if (R == 2) small_block(out, ldo, x, ldx, W, r, t0, 8, 2, dt); break;
    }
}

/* 4 rows at a time for up to 6 tokens (24 accumulators; a last 2 where
 * the rows are 2 short of a multiple of 4), else 2. */
INLINE void small_t(float *out, size_t ldo, const float *x, size_t ldx, int T, const q3_mat *W, int r0, int r1, q3_dtype dt) {
    for (int r = r0, R; r < r1; r += R) {
        R = T <= 6 && r1 - r >= 4 ? 4 : 2;
        for (int t0 = 0; t0 < T; t0 += 8) {
            const int tb = T - t0 < 8 ? T - t0 : 8;
            if (R == 4) small_rows(out, ldo, x, ldx, W, r, t0, tb, 4, dt);
            else small_rows(out, ldo, x, ldx, W, r, t0, tb, 2, dt);
        }
    }
}

/* Products of 2 .. bc_min_t - 1 tokens, and up to 16 where K is past the
 * tokens-in-lanes GEMM's limit (Q3_LANE_KMAX); no packing. */
static void gemm_small(float *out, size_t ldo, const float *x, size_t ldx, int T, const q3_mat *W, int r0, int r1) {
    switch (W->dtype) {
    case Q3_BF16: small_t(out, ldo, x, ldx, T, W, r0, r1, Q3_BF16); break;
    case Q3_F16: small_t(out, ldo, x, ldx, T, W, r0, r1, Q3_F16); break;
    case Q3_F32: small_t(out, ldo, x, ldx, T, W, r0, r1, Q3_F32); break;
    default: break;
    }
}

/* Full 14-row tile, accumulators in named registers. */
INLINE void micro_full(const float *A, size_t lda, size_t ska, const float *Bp, int kc, __m512 *c) {
#define DECL(i) __m512 c##i = c[i]; const float *a##i = A + (i) * lda;
    DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5) DECL(6) DECL(7) DECL(8) DECL(9) DECL(10) DECL(11) DECL(12) DECL(13)
#undef DECL
    for (int k = 0; k < kc; k++) {
        const __m512 b = _mm512_load_ps(Bp + k * Q3_NR);
#define ROW(i) c##i = _mm512_fmadd_ps(_mm512_set1_ps(a##i[(size_t)k * ska]), b, c##i);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) ROW(12) ROW(13)
#undef ROW
    }
#define OUT(i) c[i] = c##i;
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5) OUT(6) OUT(7) OUT(8) OUT(9) OUT(10) OUT(11) OUT(12) OUT(13)
#undef OUT
}

static void micro(const float *A, size_t lda, size_t ska, const float *Bp, int kc, float *C, size_t ldc, int mt, int nt,
                  int accumulate) {
    __m512 c[MR512];
    const __mmask16 m = (__mmask16)((1u << nt) - 1);
    for (int t = 0; t < MR512; t++)
        c[t] = accumulate && t < mt ? _mm512_maskz_loadu_ps(m, C + t * ldc) : _mm512_setzero_ps();
    if (mt == MR512) {
        micro_full(A, lda, ska, Bp, kc, c);
    } else {
        /* Tail tiles: the same per-element FMA sequence as the full tile, with
         * the rows interleaved so their FMA chains overlap. */
        for (int k = 0; k < kc; k++) {
            const __m512 b = _mm512_load_ps(Bp + k * Q3_NR);
#pragma GCC unroll 14
            for (int t = 0; t < MR512; t++)
                if (t < mt) c[t] = _mm512_fmadd_ps(_mm512_set1_ps(A[t * lda + (size_t)k * ska]), b, c[t]);
        }
    }
    for (int t = 0; t < mt; t++) _mm512_mask_storeu_ps(C + t * ldc, m, c[t]);
}

static void pack(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc) { q3_kernels_avx2.pack(Bp, W, r0, nr, k0, kc); }
static float dot(const float *a, const float *b, int n) { return q3_kernels_avx2.dot(a, b, n); }
static void axpy(float *y, float a, const float *x, int n) { q3_kernels_avx2.axpy(y, a, x, n); }
static void scale(float *y, float a, int n) { q3_kernels_avx2.scale(y, a, n); }

/* ---- Prefill attention tiles (isa.h): query rows in the 16 lanes. ---- */

/* exp(x) for x <= 0, the same steps as isa_avx2.c's exp_neg8 (2^n * degree-7
 * Taylor e^r, 0 below -87.3, NaN kept), so the two variants agree bit for bit. */
INLINE __m512 exp_neg16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}

/* ni (<= 6) rows of C x 64 lanes: 24 accumulators, 4 loads of B and up to 6
 * broadcasts of A per k. */
INLINE void att_block(float *C, const float *A, size_t si, size_t sk, const float *B, int R, int ni, int nk, int accumulate) {
    __m512 c[6][4];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            c[i][v] = i < ni && accumulate ? _mm512_loadu_ps(C + (size_t)i * R + 16 * v) : _mm512_setzero_ps();
    for (int k = 0; k < nk; k++) {
        const float *b = B + (size_t)k * R, *a = A + k * sk;
        const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32),
                     b3 = _mm512_loadu_ps(b + 48);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++)
            if (i < ni) {
                const __m512 av = _mm512_set1_ps(a[i * si]);
                c[i][0] = _mm512_fmadd_ps(av, b0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(av, b1, c[i][1]);
                c[i][2] = _mm512_fmadd_ps(av, b2, c[i][2]);
                c[i][3] = _mm512_fmadd_ps(av, b3, c[i][3]);
            }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
        if (i < ni)
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) _mm512_storeu_ps(C + (size_t)i * R + 16 * v, c[i][v]);
}

static void att_mm(float *C, const float *A, size_t si, size_t sk, const float *B, int R, int ni, int nk, int accumulate) {
    for (int r0 = 0; r0 < R; r0 += 64)
        for (int i0 = 0; i0 < ni; i0 += 6) {
            float *c = C + (size_t)i0 * R + r0;
            if (ni - i0 >= 6) att_block(c, A + i0 * si, si, sk, B + r0, R, 6, nk, accumulate);
            else att_block(c, A + i0 * si, si, sk, B + r0, R, ni - i0, nk, accumulate);
        }
}

static void att_softmax(float *S, int nk, int R, float scale, const float *lim, float *m, float *l, float *O, int D) {
    const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int r = 0; r < R; r += 16) {
        const __m512 m0 = _mm512_loadu_ps(m + r), lv = lim ? _mm512_loadu_ps(lim + r) : ninf;
        __m512 mx = m0, sum = _mm512_setzero_ps();
        for (int j = 0; j < nk; j++) {
            float *s = S + (size_t)j * R + r;
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s), vs);
            if (lim) v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(_mm512_set1_ps((float)j), lv, _CMP_GT_OQ), ninf);
            _mm512_storeu_ps(s, v);
            mx = _mm512_max_ps(mx, v);
        }
        const __m512 corr = exp_neg16(_mm512_sub_ps(m0, mx)); /* m0 = -inf on the first block gives 0 */
        for (int j = 0; j < nk; j++) {
            float *s = S + (size_t)j * R + r;
            const __m512 p = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s), mx));
            _mm512_storeu_ps(s, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_storeu_ps(l + r, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + r), corr), sum));
        _mm512_storeu_ps(m + r, mx);
        /* Where no row's maximum moved, corr is exp_neg16(0) = 1 exactly;
         * past the first blocks that is most of them. */
        if (_mm512_cmp_ps_mask(mx, m0, _CMP_NEQ_UQ))
            for (int d = 0; d < D; d++) _mm512_storeu_ps(O + (size_t)d * R + r, _mm512_mul_ps(_mm512_loadu_ps(O + (size_t)d * R + r), corr));
    }
}

/* ---- Decode attention (isa.h att_decode) ---- */

/* Lane i of the result: the sum of the 16 lanes of a[(i % 4) * 4 + i / 4]
 * (a transposed tree of adds: 15 shuffle pairs for 16 dot products instead
 * of a full reduction each). */
INLINE __m512 hsum16(const __m512 *a) {
    __m512 b[8], c[4];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    const __m512 e01 = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    const __m512 e23 = _mm512_add_ps(_mm512_unpacklo_ps(c[2], c[3]), _mm512_unpackhi_ps(c[2], c[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(e01, e23, 0x44), _mm512_shuffle_ps(e01, e23, 0xEE));
}

/* One head: scores of 16 keys at a time (the query in NV registers, 16
 * independent dot products, one transposed reduction), the block's softmax
 * with exp_neg16, then o += p_j * v_j with o in registers (two sets of
 * accumulators for even and odd keys). */
INLINE void att_decode_head(const float *q, const float *k, const float *v, size_t stride, int nk, float scale, float *st,
                            const int NV) {
    float s[Q3_ATT_BLOCK] __attribute__((aligned(64)));
    __m512 qv[16];
#pragma GCC unroll 16
    for (int d = 0; d < 16; d++) qv[d] = d < NV ? _mm512_loadu_ps(q + 16 * d) : _mm512_setzero_ps(); /* see o0 below */
    __m512 mx = _mm512_set1_ps(st[0]);
    for (int j0 = 0; j0 < nk; j0 += 16) {
        const int n = nk - j0 < 16 ? nk - j0 : 16;
        __m512 a[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            const float *kj = k + (size_t)(j0 + (j < n ? j : n - 1)) * stride; /* past nk: masked below */
            __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
#pragma GCC unroll 16
            for (int d = 1; d < NV; d++) acc = _mm512_fmadd_ps(qv[d], _mm512_loadu_ps(kj + 16 * d), acc);
            a[(j & 3) * 4 + (j >> 2)] = acc;
        }
        const __mmask16 valid = (__mmask16)((1u << n) - 1);
        const __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, _mm512_mul_ps(hsum16(a), _mm512_set1_ps(scale)));
        _mm512_store_ps(s + j0, sv);
        mx = _mm512_max_ps(mx, sv);
    }
    const float m = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(m);
    const float corr = _mm512_cvtss_f32(exp_neg16(_mm512_sub_ps(_mm512_set1_ps(st[0]), mv))); /* -inf at first: 0 */
    __m512 sum = _mm512_setzero_ps();
    for (int j0 = 0; j0 < nk; j0 += 16) {
        const __m512 p = exp_neg16(_mm512_sub_ps(_mm512_load_ps(s + j0), mv));
        _mm512_store_ps(s + j0, p);
        sum = _mm512_add_ps(sum, p);
    }
    st[1] = st[1] * corr + _mm512_reduce_add_ps(sum);
    st[0] = m;
    __m512 o0[16], o1[16];
    const __m512 cv = _mm512_set1_ps(corr);
#pragma GCC unroll 16
    for (int d = 0; d < 16; d++) /* all 16 set: with a run-time NV the compiler cannot see which are used */
        o0[d] = d < NV ? _mm512_mul_ps(_mm512_loadu_ps(st + 2 + 16 * d), cv) : _mm512_setzero_ps(), o1[d] = _mm512_setzero_ps();
    int j = 0;
    for (; j + 1 < nk; j += 2) {
        const float *v0 = v + (size_t)j * stride, *v1 = v0 + stride;
        const __m512 p0 = _mm512_set1_ps(s[j]), p1 = _mm512_set1_ps(s[j + 1]);
#pragma GCC unroll 16
        for (int d = 0; d < NV; d++) {
            o0[d] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * d), o0[d]);
            o1[d] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * d), o1[d]);
        }
    }
    if (j < nk) {
        const __m512 p0 = _mm512_set1_ps(s[j]);
#pragma GCC unroll 16
        for (int d = 0; d < NV; d++) o0[d] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v + (size_t)j * stride + 16 * d), o0[d]);
    }
#pragma GCC unroll 16
    for (int d = 0; d < NV; d++) _mm512_storeu_ps(st + 2 + 16 * d, _mm512_add_ps(o0[d], o1[d]));
}

static void att_decode_one(const float *q, const float *k, const float *v, size_t stride, int nk, int D, float scale, float *st) {
    if (D == 128) att_decode_head(q, k, v, stride, nk, scale, st, 8);
    else if (D == 64) att_decode_head(q, k, v, stride, nk, scale, st, 4);
    else att_decode_head(q, k, v, stride, nk, scale, st, D / 16);
}

/* Head by head over sub-blocks of DEC_SUB keys, read in place: a
 * sub-block's K and V rows (32 KiB for Qwen3-30B-A3B) stay in L1/L2 while
 * every head of the group reads them. Each head prefetches a share of the
 * next sub-block's rows, which would otherwise wait on DRAM row by row.
 * Copying each sub-block out first (for a cache that interleaved the KV
 * heads' rows) measured slower on the Intel Xeon of BENCHMARKS.md once the
 * cache was laid out head by head: kernel_bench attn 4096 32 4 128 (8
 * layers, decode only), 1024-1068 -> 865-892 us per layer and token. */
enum { DEC_SUB = 32 };

static void att_decode(const float *q, int G, const float *k, const float *v, size_t stride, int nk, int D, float scale,
                       float *st, size_t sts) {
    const int per = (DEC_SUB + G - 1) / G;
    for (int s0 = 0; s0 < nk; s0 += DEC_SUB) {
        const int ns = nk - s0 < DEC_SUB ? nk - s0 : DEC_SUB;
        for (int h = 0; h < G; h++) {
            for (int j = s0 + DEC_SUB + h * per; j < s0 + DEC_SUB + (h + 1) * per && j < nk; j++)
                for (int d = 0; d < D; d += 16) {
                    __builtin_prefetch(k + (size_t)j * stride + d, 0, 2);
                    __builtin_prefetch(v + (size_t)j * stride + d, 0, 2);
                }
            att_decode_one(q + (size_t)h * D, k + (size_t)s0 * stride, v + (size_t)s0 * stride, stride, ns, D, scale,
                           st + (size_t)h * sts);
        }
    }
}

/* ---- Element-wise activation helpers (isa.h) ---- */

/* quant/mx.c's fast fake quantization, 16 lanes at a time: each element
 * rounded to its quantum 2^q by adding and subtracting 2^(q+23), clamped to
 * 448 * 2^e. Blocks whose shared exponent e leaves that path's range go
 * through quant/mx.c itself. */
static int mx8_fake_quant(const float *x, size_t n, float *y) {
    const __m512i expo = _mm512_set1_epi32(0x7f800000), absm = _mm512_set1_epi32(0x7fffffff);
    if (n % 32) return q3_mx_fake_quant_row(Q3_MXFP8, x, n, y);
    __mmask16 bad = 0;
    for (size_t i = 0; i < n; i += 16)
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i), expo), expo);
    if (bad) return q3_mx_fake_quant_row(Q3_MXFP8, x, n, y); /* the error, naming the element */
    for (size_t b = 0; b < n; b += 32) {
        const __m512i u0 = _mm512_loadu_si512(x + b), u1 = _mm512_loadu_si512(x + b + 16);
        const __m512i a0 = _mm512_and_si512(u0, absm), a1 = _mm512_and_si512(u1, absm);
        const uint32_t abits = (uint32_t)_mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1)); /* |x| orders as its bits */
        float amax;
        memcpy(&amax, &abits, 4);
        const int e = q3_mx_shared_exp(Q3_MXFP8, amax);
        if (e < -100 || e > 90) {
            if (q3_mx_fake_quant_row(Q3_MXFP8, x + b, 32, y + b)) return -1;
            continue;
        }
        const __m512i qmin = _mm512_set1_epi32(e - 6 - 3);
        const __m512 top = _mm512_set1_ps(448.0f * q3_e8m0_to_f32((uint8_t)(e + 127)));
        const __m512i ab[2] = {a0, a1}, ub[2] = {u0, u1};
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(ab[h], 23), _mm512_set1_epi32(130)), qmin);
            const __m512 magic = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(150)), 23));
            const __m512 a = _mm512_castsi512_ps(ab[h]);
            const __m512 r = _mm512_min_ps(_mm512_sub_ps(_mm512_add_ps(a, magic), magic), top);
            const __m512i sign = _mm512_andnot_si512(absm, ub[h]);
            _mm512_storeu_si512(y + b + 16 * h, _mm512_or_si512(_mm512_castps_si512(r), sign));
        }
    }
    return 0;
}

/* silu(g) = g / (1 + e^-g), with e^-|g| from exp_neg16: for g < 0 it is
 * g e^g / (1 + e^g), so the exponential never overflows. */
static void swiglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 t = exp_neg16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
        const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), t);
        const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 num = _mm512_mask_mul_ps(g, neg, g, t);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(num, d), u));
    }
}

const q3_isa_kernels q3_kernels_avx512 = {.mr = MR512, .gemv = gemv, .micro = micro, .small_t = 16, .gemm_small = gemm_small,
    .pack = pack, .dot = dot, .axpy = axpy, .scale = scale, .att_mm = att_mm, .att_softmax = att_softmax,
    .att_decode = att_decode, .mx8_fake_quant = mx8_fake_quant, .swiglu = swiglu, .bc_pack_act = q3_avx512_bc_pack_act, .gemm_bc = q3_avx512_gemm_bc,
    .bc_mx = 1, .bc_bf16p = 1, .lane_split = 1, .bc_max_t = Q3_BC_TOKENS_MAX,
    /* Plain products of 2-8 tokens in gemm_small: with padded lanes the broadcast GEMM ran them at 61-125
     * GFLOP/s (kernel_bench 1536 2048 T, T = 2-8), gemm_small at 121-166, and it prefetches its rows.
     * q30b8 BF16 prefill, two pairs: 32 tokens 78.0 / 79.0 -> 99.1 / 93.8 tok/s, 128 151.5 / 151.8 ->
     * 160.3 / 164.4, 512 237.0 / 240.0 -> 244.7 / 241.3. (AVX2's 256-bit kernel, without prefetch, had
     * measured 10 % slower in the model.) From 7 tokens the broadcast GEMM's quads (4 tokens x 4 k per
     * vector) pad nothing: the model's gate and up products of 32 experts, 2 threads, both in one
     * process, GFLOP/s: T = 6 153 / 142 (gemm_small / quads), 7 151 / 165, 8 149 / 189. */
    .bc_min_t = 7,
    /* A few tokens as one GEMV each rather than widening every MX row to fp32 for the broadcast GEMM:
     * kernel_bench mx 1536 2048 20 T, Intel Xeon, GFLOP/s: MXFP4 A8 T = 2 33 -> 69, T = 4 30 -> 55, but
     * T = 6 65 -> 53; MXINT8 inputs (VNNI GEMV) T = 2 33 -> 194, T = 4 30 -> 150, T = 6 64 -> 144. */
    .mx_gemv_t = 4, .i8_gemv_t = 8,
    /* MX rows decoded once for up to 12 tokens (gemv_mx_tokens with AVX512BW, gemv_i8_tokens with
     * VNNI), rather than once per token, in the broadcast GEMM's padded lanes or in the integer GEMM:
     * kernel_bench mx 1536 2048 20 T, GFLOP/s: MXINT8 inputs T = 4 197 -> 306, 8 174 -> 319, 10 214 ->
     * 301, 12 252 -> 296, but 14 291 -> 256; MXFP8 inputs T = 2 86 -> 118, 4 85 -> 134, 6 82 -> 125,
     * 8 82 -> 129, 12 119 -> 130, but 14 138 -> about 130. */
    .tokens_t = 12,
    /* MX GEMV on a prepared input: AVX2's shift/mask decoders (kernel_bench mx 768 2048, one thread, Intel
     * Xeon: MXFP8 17.2 against 10.5-12.3 G elements/s for gemv_mx here, MXFP4 17.4 against 16.1); for
     * MXFP8, the same decoder in 512 bits where the CPU has AVX512BW (gemv_mx_avx512.c, 21.9). */
    .mx_prep = q3_avx2_mx_prep, .gemv_mx = q3_avx2_gemv_mx,
    /* MXINT8 inputs: AVX2's integer GEMV (256-bit; memory-bound on the Intel Xeon measured) and GEMM
     * (replaced by the VNNI one where the CPU has it). */
    .i8_prep = q3_avx2_i8_prep, .gemv_i8 = q3_avx2_gemv_i8, .i8_pack_act = q3_avx2_i8_pack_act, .gemm_i8 = q3_avx2_gemm_i8};
#pragma GCC pop_options
