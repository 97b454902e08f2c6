/* AVX2 weights-broadcast GEMM: the prefill kernel for the few dozen tokens
 * each MoE expert sees (about T * top_k / num_experts), any weight dtype
 * the AVX2 table widens (BF16, F16, F32, MXFP8, MXFP4, MXINT8).
 *
 * Why: the panel GEMM (isa_avx2.c micro) transposes every weight panel
 * before use, which at 32 tokens per expert took 30 % of the expert GEMM
 * time. Here the activations are transposed instead, once per thread and
 * pass (ap[K][TP], TP = T rounded down to 8, or up with zero padding below
 * 8 tokens; rows ap_stride floats apart; the tokens past TP as rows after
 * them), and the weights are only widened to fp32, the panel's 16 rows
 * whole (one sequential stream from memory, which measured faster than
 * widening column blocks), MX rows by gemv_mx_avx2.c's decoders in their
 * element order, which the activations then follow. The inner loop loads
 * the token vectors of one k and broadcasts each row's weight: R x V
 * accumulators over KC-column blocks. Every output element is one lane
 * summing over k in order (a remainder token's: 8 lanes, then their sum in
 * a fixed order), so results do not depend on the thread count. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/bcast_tile_avx2.h"
#include "kernels/isa.h"
#include "kernels/transpose_avx2.h"

#define INLINE static inline __attribute__((always_inline))

enum { KC = 128, TMAX = Q3_BC_TOKENS_MAX };

/* Floats between rows k of ap: TP, and 8 more where TP is a multiple of
 * 64. Rows 512 bytes apart put the 128 rows of k a tile reads into 8 of
 * L1's 64 sets, 16 lines each against 12 ways on the Zen 5 measured:
 * kernel_bench 384 2048 T, one thread, ran T = 128 at 71.5 GFLOP/s against
 * 97-98 for T = 96 and 112. Rows 256 bytes apart (TP = 64) give 8 lines
 * per set, as many as Zen 3's L1 has ways (not measured there; on Zen 5
 * the padding left T = 64 at 97-100). */
static int ap_stride(int TP) { return TP % 64 ? TP : TP + 8; }

/* Remainder tokens: past whole vectors of 8, the T % 8 tokens left are
 * packed as rows of K floats (RPAD more apart: rows 8 KiB apart would share
 * L1 sets) and computed as dot products, 8-lane partial sums reduced once
 * per row (rem_tile), instead of in one more vector of 8 lanes partly
 * padding. `build/gemm_ab gemm-ab 512 SKEW 12` (the expert products of a
 * 512-token prefill, one thread, this against the padded kernel in one
 * process) on the AMD EPYC (Zen 5) of BENCHMARKS.md, ratios of medians at
 * skew 2 / 1: remainders of up to 3 tokens 0.95 / 0.93, up to 5 0.92 /
 * 0.92, all (up to 7) 0.92 / 0.90. Fewer than 8 tokens pad one vector. */
enum { REM_MAX = 7, RPAD = 16 };

/* Tokens in lanes (TP, a multiple of 8) and as remainder rows (rem) for T tokens. */
static void split_tokens(int T, int *TP, int *rem) {
    *rem = T >= 8 ? T % 8 : 0;
    *TP = (T - *rem + 7) & ~7;
}

/* Floats ahead on each token row that the transposing pack prefetches (an
 * expert's gathered inputs come from L3 or DRAM, 8 rows at a time). */
enum { PACK_AHEAD = 128 };

void q3_avx2_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt) {
    static _Thread_local float row[Q3_LANE_KMAX];
    int TP, rem;
    split_tokens(T, &TP, &rem);
    const int S = ap_stride(TP);
    if (!q3_dtype_is_mxfp(wt)) { /* the stored k order: 8 x 8 blocks transposed in registers */
        for (int t0 = 0; t0 < TP; t0 += 8) {
            const int n = T - t0 < 8 ? T - t0 : 8; /* rows past T are zero lanes */
            const float *xb = x + (size_t)t0 * ldx;
            for (int k = 0; k < K; k += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) {
                    if (i < n) _mm_prefetch((const char *)(xb + (size_t)i * ldx + k + PACK_AHEAD), _MM_HINT_T0);
                    r[i] = i < n ? _mm256_loadu_ps(xb + (size_t)i * ldx + k) : _mm256_setzero_ps();
                }
                q3_avx2_transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(ap + (size_t)(k + i) * S + t0, r[i]);
            }
        }
        for (int j = 0; j < rem; j++)
            memcpy(ap + (size_t)K * S + (size_t)j * (K + RPAD), x + (size_t)(TP + j) * ldx, (size_t)K * sizeof *ap);
        return;
    }
    for (int t = 0; t < TP + rem; t++) {
        if (t >= T) {
            for (int k = 0; k < K; k++) ap[(size_t)k * S + t] = 0.0f;
            continue;
        }
        const float *xr = x + (size_t)t * ldx;
        if (q3_dtype_is_mxfp(wt)) { /* the order the MX rows are widened in */
            q3_mx_prep_lanes(row, xr, K, wt, 2);
            xr = row;
        }
        if (t >= TP) memcpy(ap + (size_t)K * S + (size_t)(t - TP) * (K + RPAD), xr, (size_t)K * sizeof *xr);
        else
            for (int k = 0; k < K; k++) ap[(size_t)k * S + t] = xr[k];
    }
}

/* Tiles of 6 rows x 2 token vectors: 12 accumulators, the two inputs and
 * a broadcast fill 15 of the 16 registers, and each k takes 8 loads for 12
 * FMAs. An odd count of vectors starts with 4 rows x 3 (7 loads for 12
 * FMAs; a lone vector 8 rows at a time took 9 for 8). Constant shapes, so
 * every accumulator is a register. */
#define TILE(R, V) q3_avx2_bcast_tile(st + r * TMAX + 8 * v0, TMAX, wb + (size_t)r * ws, ws, ap + 8 * v0, S, kc, R, V, fresh)
INLINE void rows_tiles(float *st, const float *wb, int ws, const float *ap, int S, int kc, int nr, int v0, int V,
                       int fresh) {
    int r = 0;
    if (V == 2) {
        for (; r + 6 <= nr; r += 6) TILE(6, 2);
        for (; r + 4 <= nr; r += 4) TILE(4, 2);
        for (; r < nr; r++) TILE(1, 2);
    } else if (V == 3) {
        for (; r + 4 <= nr; r += 4) TILE(4, 3);
        for (; r < nr; r++) TILE(1, 3);
    } else {
        for (; r + 8 <= nr; r += 8) TILE(8, 1);
        for (; r + 4 <= nr; r += 4) TILE(4, 1);
        for (; r < nr; r++) TILE(1, 1);
    }
}
#undef TILE

/* part[r * REM_MAX + j] (+)= 8-lane partial dot products of R widened rows'
 * columns (w, rows ws apart) with NT remainder token rows' (xr, xs apart),
 * kc columns; 4 x 3 of them fill 12 registers, the inputs 3 and a weight
 * row's vector the last, so each k step of 8 takes 7 loads for 12 FMAs as
 * the 4 x 3 tile does. */
INLINE void rem_tile(__m256 *part, const float *w, int ws, const float *xr, int xs, int kc, const int R, const int NT,
                     int fresh) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++)
            if (r < R && j < NT) acc[r][j] = fresh ? _mm256_setzero_ps() : part[r * REM_MAX + j];
    for (int k = 0; k < kc; k += 8) {
        __m256 x[3];
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++)
            if (j < NT) x[j] = _mm256_loadu_ps(xr + (size_t)j * xs + k);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            if (r < R) {
                __m256 wv = _mm256_loadu_ps(w + (size_t)r * ws + k);
                /* one load per row: GCC otherwise folds it into each FMA */
                __asm__("" : "+x"(wv));
#pragma GCC unroll 3
                for (int j = 0; j < 3; j++)
                    if (j < NT) acc[r][j] = _mm256_fmadd_ps(wv, x[j], acc[r][j]);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++)
            if (r < R && j < NT) part[r * REM_MAX + j] = acc[r][j];
}

/* The nr rows' remainder sums over columns k0 .. k0 + kc, NT tokens. */
INLINE void rows_rem(__m256 *part, const float *wb, int ws, const float *xr, int xs, int kc, int nr, const int NT,
                     int fresh) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) rem_tile(part + r * REM_MAX, wb + (size_t)r * ws, ws, xr, xs, kc, 4, NT, fresh);
    for (; r < nr; r++) rem_tile(part + r * REM_MAX, wb + (size_t)r * ws, ws, xr, xs, kc, 1, NT, fresh);
}

static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

void q3_avx2_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf) {
    int TP, rem;
    split_tokens(T, &TP, &rem);
    const int V = TP / 8, S = ap_stride(TP), K = W->cols, nr = r1 - r0;
    const int ws = K + 16; /* rows K floats apart would share L1 sets */
    const float *xr = ap + (size_t)K * S; /* the remainder rows */
    float st[Q3_NR * TMAX] __attribute__((aligned(32)));
    __m256 part[Q3_NR * REM_MAX];
    for (int r = 0; r < nr; r++) {
        if (q3_dtype_is_mxfp(W->dtype)) q3_avx2_mx_row_slots(W, r0 + r, wbuf + (size_t)r * ws);
        else q3_avx2_row_f32(W, r0 + r, 0, K, wbuf + (size_t)r * ws);
    }
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int kc = K - k0 < KC ? K - k0 : KC;
        for (int v0 = 0; v0 < V;) {
            const int g = V - v0 == 1 ? 1 : (V - v0) % 2 ? 3 : 2;
            rows_tiles(st, wbuf + k0, ws, ap + (size_t)k0 * S, S, kc, nr, v0, g, k0 == 0);
            v0 += g;
        }
        /* the block's columns again for the remainder rows, while they are in L1, 3 at a time */
        for (int j = 0; j < rem; j += 3) {
            __m256 *pj = part + j;
            const float *xj = xr + (size_t)j * (K + RPAD) + k0;
            if (rem - j >= 3) rows_rem(pj, wbuf + k0, ws, xj, K + RPAD, kc, nr, 3, k0 == 0);
            else if (rem - j == 2) rows_rem(pj, wbuf + k0, ws, xj, K + RPAD, kc, nr, 2, k0 == 0);
            else rows_rem(pj, wbuf + k0, ws, xj, K + RPAD, kc, nr, 1, k0 == 0);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < rem; j++) st[r * TMAX + TP + j] = hsum8(part[r * REM_MAX + j]);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < nr; r++) out[(size_t)t * ldo + r] = st[r * TMAX + t];
}
#pragma GCC pop_options
