/* AVX2 weights-broadcast GEMM: the prefill kernel for the few dozen tokens
 * each MoE expert sees (about T * top_k / num_experts), any weight dtype
 * the AVX2 table widens (BF16, F16, F32, MXFP8, MXFP4, MXINT8).
 *
 * Why: the panel GEMM (isa_avx2.c micro) transposes every weight panel
 * before use, which at 32 tokens per expert took 30 % of the expert GEMM
 * time. Here the activations are transposed instead, once per thread and
 * pass (ap[K][TP], TP = T rounded up to 8, padding zero; rows ap_stride
 * floats apart), and the weights
 * are only widened to fp32, the panel's 16 rows whole (one sequential
 * stream from memory, which measured faster than widening column blocks),
 * MX rows by gemv_mx_avx2.c's decoders in their element order, which the
 * activations then follow. The inner loop loads the token vectors of one k
 * and broadcasts each row's weight: R x V accumulators over KC-column
 * blocks. Every output element is one lane summing over k in order, so
 * results do not depend on the thread count. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/bcast_tile_avx2.h"
#include "kernels/isa.h"

#define INLINE static inline __attribute__((always_inline))

enum { KC = 128, TMAX = Q3_BC_TOKENS_MAX };

/* Floats between rows k of ap: TP, and 8 more where TP is a multiple of
 * 64. Rows 512 bytes apart put the 128 rows of k a tile reads into 8 of
 * L1's 64 sets, 16 lines each against 12 ways on the Zen 5 measured:
 * kernel_bench 384 2048 T, one thread, ran T = 128 at 71.5 GFLOP/s against
 * 97-98 for T = 96 and 112. Rows 256 bytes apart (T = 57-64) give 8 lines
 * per set, as many as Zen 3's L1 has ways (not measured there; on Zen 5
 * the padding left T = 64 at 97-100). */
static int ap_stride(int T) {
    const int TP = (T + 7) & ~7;
    return TP % 64 ? TP : TP + 8;
}

void q3_avx2_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt) {
    static _Thread_local float row[Q3_LANE_KMAX];
    const int TP = (T + 7) & ~7, S = ap_stride(T);
    for (int t = 0; t < TP; t++) {
        if (t >= T) {
            for (int k = 0; k < K; k++) ap[(size_t)k * S + t] = 0.0f;
            continue;
        }
        const float *xr = x + (size_t)t * ldx;
        if (q3_dtype_is_mxfp(wt)) { /* the order the MX rows are widened in */
            q3_mx_prep_lanes(row, xr, K, wt, 2);
            xr = row;
        }
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

void q3_avx2_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf) {
    const int TP = (T + 7) & ~7, V = TP / 8, S = ap_stride(T), K = W->cols, nr = r1 - r0;
    const int ws = K + 16; /* rows K floats apart would share L1 sets */
    float st[Q3_NR * TMAX] __attribute__((aligned(32)));
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
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < nr; r++) out[(size_t)t * ldo + r] = st[r * TMAX + t];
}
#pragma GCC pop_options
