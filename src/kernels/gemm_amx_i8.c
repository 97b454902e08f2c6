/* The AMX table's integer GEMM for MXINT8 inputs (the prefill of the
 * `w4a8i` and `w8a8i` schemes) on AMX-INT8 tiles: the VNNI GEMM's
 * operands and arithmetic (gemm_i8_avx512vnni.c), with the block sums
 * from TDPBSSD: A = 16 decoded weight rows x one 32-code block, B = the 8
 * groups of 4 input codes of that block for 16 tokens (a lane pass's
 * rows, TP words apart), C = their 16 x 16 exact 32-bit sums. The inputs
 * are packed as for VNNI, then their offset of 128 taken off again
 * (VPDPBUSD multiplies unsigned by signed bytes, the tiles signed by
 * signed), so the sums need no correction: each is the VNNI kernel's
 * offset sum less 128 times the row's block sum, exactly. Per block, each
 * row's sums are converted and added times the input factor times the
 * row factor, in block order: the VNNI kernel's operations on the same
 * integers, so its results bit for bit. The tiles take their own shapes
 * (A 32 bytes wide, B 8 rows), loaded where the thread's tiles hold
 * other ones. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16,amx-int8")
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

#include "kernels/amx.h"
#include "kernels/isa.h"
#include "kernels/lane_store.h"

static const q3_tile_config g_i8_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 32, 32, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 8, 8},
};

static void (*g_vnni_pack_i8)(uint32_t *, float *, const float *, size_t, int, int);

static void amx_i8_pack_act(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K) {
    g_vnni_pack_i8(ap, fs, x, ldx, T, K);
    const size_t n = (size_t)K / 4 * (size_t)((T + 15) & ~15); /* words: K/4 groups x TP tokens */
    const __m512i off = _mm512_set1_epi8((char)0x80);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_si512(ap + i, _mm512_xor_si512(_mm512_loadu_si512(ap + i), off));
    for (; i < n; i++) ap[i] ^= 0x80808080u;
}

/* The 16 rows from rg (nr of them wanted): codes wq (K apart), block sums
 * and factors decoded into wbuf, against the packed inputs. */
static void i8_panel(float *out, size_t ldo, const uint32_t *ap, const float *fs, int T, const q3_mat *W, int rg, int nr,
                     void *wbuf) {
    const int K = W->cols, nb = K / 32, TP = (T + 15) & ~15;
    int8_t *wq = wbuf;                                          /* Q3_NR rows of K */
    int32_t *wsum = (int32_t *)(void *)(wq + (size_t)Q3_NR * K); /* Q3_NR rows of nb (the decoder's; unused here) */
    float *wsc = (float *)(wsum + (size_t)Q3_NR * nb);
    void (*decode)(const q3_mat *, int, int8_t *, int32_t *, float *) =
        W->dtype == Q3_MXINT8 ? q3_i8_decode_row_int8 : q3_i8_decode_row;
    for (int r = 0; r < Q3_NR; r++) /* rows past nr repeat the last one; their results are dropped */
        decode(W, rg + (r < nr ? r : nr - 1), wq + (size_t)r * K, wsum + (size_t)r * nb, wsc + (size_t)r * nb);
    float stage[Q3_STAGE_ROWS * Q3_BC_TOKENS_MAX] __attribute__((aligned(64)));
    float st[4 * 256] __attribute__((aligned(64))); /* two pairs of blocks' sums */
    for (int v = 0; v < TP / 16; v++) {
        __m512 o[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) o[r] = _mm512_setzero_ps();
        /* pairs of blocks (K % 64 == 0), alternately in C tiles 0-1 and
         * 2-3: a pair's sums are taken up while the next pair's products
         * and stores run (one block at a time ran as slow as VNNI) */
        for (int b = 0; b <= nb; b += 2) {
            if (b < nb) {
                float *sb = st + (b & 2) * 256;
                _tile_loadd(4, wq + 32 * b, K);
                _tile_loadd(6, ap + (size_t)8 * b * TP + 16 * v, TP * 4);
                _tile_loadd(5, wq + 32 * (b + 1), K);
                _tile_loadd(7, ap + (size_t)8 * (b + 1) * TP + 16 * v, TP * 4);
/* (tile numbers are immediates) */
#define PAIR(C0, C1)                 \
    do {                             \
        _tile_zero(C0);              \
        _tile_dpbssd(C0, 4, 6);      \
        _tile_zero(C1);              \
        _tile_dpbssd(C1, 5, 7);      \
        _tile_stored(C0, sb, 64);    \
        _tile_stored(C1, sb + 256, 64); \
    } while (0)
                if (b & 2) PAIR(2, 3);
                else PAIR(0, 1);
#undef PAIR
            }
            if (b == 0) continue;
            const int pb = b - 2; /* the pair before */
            const float *sp = st + (pb & 2) * 256;
            for (int i = 0; i < 2; i++) {
                const __m512 f = _mm512_loadu_ps(fs + (size_t)(pb + i) * TP + 16 * v);
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) {
                    const __m512 g = _mm512_set1_ps(wsc[(size_t)r * nb + pb + i]);
                    const __m512i acc = _mm512_load_si512(sp + i * 256 + r * 16);
                    o[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(f, g), o[r]);
                }
            }
        }
        for (int r = 0; r < nr; r++) _mm512_store_ps(stage + (size_t)r * TP + 16 * v, o[r]);
    }
    q3_lane_store(out, ldo, stage, TP, T, nr);
}

static void amx_gemm_i8(float *out, size_t ldo, const uint32_t *ap, const float *fs, int T, const q3_mat *W, int r0, int r1,
                        void *wbuf) {
    q3_amx_tiles_load(&g_i8_config);
    for (int rg = r0; rg < r1; rg += Q3_NR)
        i8_panel(out + (rg - r0), ldo, ap, fs, T, W, rg, r1 - rg < Q3_NR ? r1 - rg : Q3_NR, wbuf);
}

/* AMX-INT8: CPUID.(7,0):EDX bit 25 (the tile state itself: q3_amx_usable). */
static int amx_int8(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 25 & 1);
}

void q3_amx_i8_kernels(q3_isa_kernels *k) {
    /* The integer GEMM on AMX-INT8 where the table has the VNNI one (whose
     * packing it extends). kernel_bench mx 1536 2048, MXFP4 A8i GFLOP/s,
     * VNNI against tiles: T = 16 427 / 520, 32 544 / 670, 64 583 / 681, 128
     * 677 / 852; q30b8 w4a8i prefill 512, two pairs: 395.0 / 390.9 ->
     * 452.9 / 461.1 tok/s (experts 779 / 737 -> 604 / 597 ms). */
    if (k->gemm_i8 && amx_int8()) {
        g_vnni_pack_i8 = k->i8_pack_act;
        k->i8_pack_act = amx_i8_pack_act;
        k->gemm_i8 = amx_gemm_i8;
    }
}
#pragma GCC pop_options
