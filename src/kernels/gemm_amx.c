/* AMX tile GEMMs for prefill (Intel AMX-TILE + AMX-BF16: Sapphire Rapids
 * and later). One TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16
 * one into 16 x 16 fp32 sums: 8192 multiply-adds, where an AVX-512 FMA
 * does 16. On the Xeon of BENCHMARKS.md one core ran them at 3.2 TFLOP/s
 * on operands already in the tiles and 1.7 with a B tile loaded from L2
 * per product, against 234 GFLOP/s of FMAs.
 *
 * Operands. A = 16 weight rows x 32 k as bf16, read in place from BF16
 * weights, or from rows decoded with their block scales folded in (MX
 * weights, under A8 or weight-only; the AVX-512 BF16 A8 GEMM's decoder
 * and element order).
 * B = 32 k x 16 tokens, packed once per pass the way the instruction
 * reads it: word pair p of token t, (x[t][2p], x[t][2p+1]), at B[p][t].
 * C = 16 rows x 16 tokens, transposed into the output rows at the end.
 * The sums run over all of K in the tile registers.
 *
 * Exactness. BF16 weights against fp32 activations: each activation is
 * split into three bf16 parts, x = hi + mid + lo, each the rounded rest
 * of the one before: 24 significant bits in all, so x exactly (unless a
 * part falls below 2^-126, where the instructions flush it). Each of the
 * three products is exact in fp32 and all are summed in fp32: the fp32
 * product up to the order and rounding of the sums, at a third of the
 * tile rate; the same for weight-only MX rows (decoded elements are bf16
 * numbers). Under A8 the activations are MXFP8 values, bf16 numbers
 * already: one part.
 *
 * Linux gives the 8 KiB of tile registers only to a process that asks
 * (arch_prctl, Linux 5.16 on); each thread loads the tile shapes once. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,avx2,fma,amx-tile,amx-bf16")
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/amx.h"
#include "kernels/isa.h"
#include "quant/bf16p.h"

#define INLINE static inline __attribute__((always_inline))

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* (First called under the kernel tables' pthread_once.) */
int q3_amx_usable(void) {
    static int known = -1;
    if (known >= 0) return known;
    unsigned a, b, c, d;
    known = 0;
    /* CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE */
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1))
        known = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return known;
}

/* Tiles 0-3: C (up to four token blocks); 4 and 5: A (alternating k
 * blocks); 6 and 7: B. All 16 rows of 64 bytes. */
static const q3_tile_config g_tile_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static _Thread_local const q3_tile_config *t_loaded;

void q3_amx_tiles_load(const q3_tile_config *cfg) {
    if (t_loaded == cfg) return;
    _tile_loadconfig(cfg);
    t_loaded = cfg;
}

void q3_amx_tiles_on(void) { q3_amx_tiles_load(&g_tile_config); }

/* q3_amx_tile_flops's operands (bf16 ones and halves) and per-thread results. */
static const uint16_t g_bench_operand[16 * 32] = {[0 ... 16 * 32 - 1] = 0x3f00};
static float g_bench_sink[64][256];

/* Token blocks per group: tiles 0-3 hold their sums. */
enum { GROUP_MAX = 4 };

/* Packed inputs: bp[((tb * nkb + kb) * parts + c) * Q3_TILE_DW + p * 16 + t]
 * for token block tb, k block kb (32 k), part c, pair p, token t; tokens
 * past T are zero. */
static inline size_t block_dwords(int K, int parts) { return (size_t)(K / 32) * parts * Q3_TILE_DW; }

/* fp32 rows as three bf16 parts each: token by token the parts (each the
 * rounded rest of the one before) go to stage[c][t], then each part's 16
 * tokens are transposed into its tile. */
void q3_amx_pack_split(uint32_t *bp, const float *x, size_t ldx, int T, int K) {
    const int nkb = K / 32, ntb = (T + 15) / 16;
    __m512i stage[3][16];
    for (int tb = 0; tb < ntb; tb++)
        for (int kb = 0; kb < nkb; kb++) {
            for (int t = 0; t < 16; t++) {
                const int tok = 16 * tb + t;
                __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
                if (tok < T) lo = _mm512_loadu_ps(x + (size_t)tok * ldx + 32 * kb), hi = _mm512_loadu_ps(x + (size_t)tok * ldx + 32 * kb + 16);
#pragma GCC unroll 3
                for (int c = 0; c < 3; c++) stage[c][t] = q3_bf16_part(&lo, &hi);
            }
            uint32_t *dst = bp + ((size_t)tb * nkb + kb) * 3 * Q3_TILE_DW;
            for (int c = 0; c < 3; c++) q3_put_tile(dst + c * Q3_TILE_DW, stage[c]);
        }
}

/* An MXFP8 panel's rows decoded between its k blocks, so the decoding
 * (vector ports) runs while the tiles multiply. A step of the decoder is
 * 64 elements, two k blocks; unit u (one per k block) is the half u % 2
 * of step u / 2: 8 of the 16 rows. Unit kb + SIDE_LEAD is decoded before
 * k block kb, the first SIDE_LEAD before the panel, so a step's second
 * half lands SIDE_LEAD - 1 blocks before its tiles are loaded. (MXFP4
 * panels measured slower this way and decode row by row; so did the
 * chunked panels' next chunk, decoded in such units.) */
typedef struct {
    const q3_mat *W;
    uint16_t *wb;
    size_t ws; /* words between decoded rows */
    int rg, rlast, nunits;
} side_decode;

enum { SIDE_LEAD = 8 };

INLINE void side_unit(const side_decode *sd, int u) {
    if (u >= sd->nunits) return;
    const int half = u % 2, k = u / 2 * 64;
    q3_a8_decode_span(sd->wb + (size_t)half * 8 * sd->ws + k, sd->ws, sd->W, sd->rg + half * 8, 8, sd->rlast, k, k + 64);
}

/* One k block: A (16 rows x 32 k) into tile TA, then for each part c
 * the token blocks' B tiles (through tiles 6 and 7) into sums 0 .. n-1;
 * with pf, a k block's share of the next panel (pfl lines) is fetched into
 * L2 first. */
#define KBLOCK(TA)                                                     \
    do {                                                               \
        if (pf)                                                        \
            for (int l = 0; l < pfl; l++) _mm_prefetch(pf + ((size_t)(kb - kb0) * pfl + l) * 64, _MM_HINT_T1); \
        _tile_loadd(TA, A + 32 * (kb - kb0), lda);                     \
        const uint32_t *b = bp + (size_t)kb * parts * Q3_TILE_DW;         \
        for (int c = 0; c < parts; c++, b += Q3_TILE_DW) {                \
            _tile_loadd(6, b, 64);                                     \
            _tile_dpbf16ps(0, TA, 6);                                  \
            if (n > 1) {                                               \
                _tile_loadd(7, b + bs, 64);                            \
                _tile_dpbf16ps(1, TA, 7);                              \
            }                                                          \
            if (n > 2) {                                               \
                _tile_loadd(6, b + 2 * bs, 64);                        \
                _tile_dpbf16ps(2, TA, 6);                              \
            }                                                          \
            if (n > 3) {                                               \
                _tile_loadd(7, b + 3 * bs, 64);                        \
                _tile_dpbf16ps(3, TA, 7);                              \
            }                                                          \
        }                                                              \
    } while (0)

/* The 16 x 16 sums of token blocks 0 .. n-1 of bp (blocks bs dwords apart)
 * against 16 rows of A over k blocks kb0 .. kb1-1 (A: 32 (kb1 - kb0) bf16
 * per row from k block kb0, lda bytes apart) into st[i * 256 + r * 16 +
 * t]; resume: added to the sums st holds (else from zero: fp32 sums
 * stored and loaded again, so a product split over k is bit for bit the
 * same). A alternates between tiles 4 and 5, so the next k block's rows
 * load while the last one's products run. sd: A is being decoded (NULL:
 * it is there; only with kb0 = 0); pf: the next panel, pfl lines per k
 * block (NULL: none). */
INLINE void tiles_group(float *st, const uint16_t *A, size_t lda, const uint32_t *bp, size_t bs, int kb0, int kb1,
                        const int parts, const int n, const side_decode *sd, const char *pf, int pfl, int resume) {
    if (resume) {
        _tile_loadd(0, st, 64);
        if (n > 1) _tile_loadd(1, st + 256, 64);
        if (n > 2) _tile_loadd(2, st + 512, 64);
        if (n > 3) _tile_loadd(3, st + 768, 64);
    } else {
        _tile_zero(0);
        if (n > 1) _tile_zero(1);
        if (n > 2) _tile_zero(2);
        if (n > 3) _tile_zero(3);
    }
    int kb = kb0;
    for (; kb + 1 < kb1; kb += 2) {
        if (sd) side_unit(sd, kb + SIDE_LEAD);
        KBLOCK(4);
        kb++;
        if (sd) side_unit(sd, kb + SIDE_LEAD);
        KBLOCK(5);
        kb--;
    }
    if (kb < kb1) {
        if (sd) side_unit(sd, kb + SIDE_LEAD);
        KBLOCK(4);
    }
    _tile_stored(0, st, 64);
    if (n > 1) _tile_stored(1, st + 256, 64);
    if (n > 2) _tile_stored(2, st + 512, 64);
    if (n > 3) _tile_stored(3, st + 768, 64);
}
#undef KBLOCK

/* tiles_group for parts 1 or 3 and n 1 .. GROUP_MAX, each pair compiled
 * with them as constants. */
INLINE void tiles_group_of(float *st, const uint16_t *A, size_t lda, const uint32_t *bp, size_t bs, int kb0, int kb1, int parts,
                           int n, const side_decode *sd, const char *pf, int pfl, int resume) {
#define CASE(P, N) tiles_group(st, A, lda, bp, bs, kb0, kb1, P, N, sd, pf, pfl, resume)
    if (parts == 3) {
        if (n == 1) CASE(3, 1);
        else if (n == 2) CASE(3, 2);
        else if (n == 3) CASE(3, 3);
        else CASE(3, 4);
    } else {
        if (n == 1) CASE(1, 1);
        else if (n == 2) CASE(1, 2);
        else if (n == 3) CASE(1, 3);
        else CASE(1, 4);
    }
#undef CASE
}

/* out[t * ldo + r] = st[r * 16 + t] for t < nt, r < nr. */
INLINE void store_tokens(float *out, size_t ldo, const float *st, int nt, int nr) {
    const __m512i rows = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const __mmask16 m = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(out + (size_t)t * ldo, m, _mm512_i32gather_ps(rows, st + t, 4));
}

/* out[t][r - r0] for t < T of the 16 rows at A (nr of them wanted); sd:
 * A's decoding, finished during the first group of token blocks, as is
 * the prefetch of the next panel pf (pfl lines per k block). */
static void panel(float *out, size_t ldo, const uint16_t *A, size_t lda, int nr, const uint32_t *bp, int T, int K, int parts,
                  const side_decode *sd, const char *pf, int pfl) {
    float st[GROUP_MAX * 256] __attribute__((aligned(64)));
    const int nkb = K / 32, ntb = (T + 15) / 16;
    const size_t bs = block_dwords(K, parts);
    for (int tb = 0; tb < ntb; tb += GROUP_MAX) {
        const int n = ntb - tb < GROUP_MAX ? ntb - tb : GROUP_MAX;
        const uint32_t *b = bp + (size_t)tb * bs;
        tiles_group_of(st, A, lda, b, bs, 0, nkb, parts, n, tb == 0 ? sd : NULL, tb == 0 ? pf : NULL, pfl, 0);
        for (int i = 0; i < n; i++) {
            const int t0 = 16 * (tb + i), nt = T - t0 < 16 ? T - t0 : 16;
            store_tokens(out + (size_t)t0 * ldo, ldo, st + 256 * i, nt, nr);
        }
    }
}

/* BF16 weights whose rows the tiles take (K in whole k blocks); BF16P
 * rows are unpacked to BF16 first. */
static inline int amx_bf16(q3_dtype wt, int K) { return (wt == Q3_BF16 || wt == Q3_BF16P) && K % 32 == 0; }

/* BF16P rows, 16 at a time unpacked to BF16 into wbuf (a line more than K
 * apart) while the next panel's packed rows come into L2 during the tiles,
 * as mx_tiles does for MX codes. matmul.c's way for other tables (64 rows
 * unpacked, from DRAM, then the BF16 kernels) ran q30b8 BF16P prefill 512
 * at 208-209 tok/s against 302-314 this way, alternating (BF16 about 350
 * in that window); prefill 128 even (132-139). */
static void bf16p_panels(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf) {
    const int K = W->cols;
    const size_t ws = (size_t)K + 32, rb = q3_bf16p_row_bytes((size_t)K);
    for (int rg = r0; rg < r1; rg += 16) {
        const int nr = r1 - rg < 16 ? r1 - rg : 16;
        q3_bf16p_unpack_rows_avx2(wbuf, ws, W, rg, nr);
        for (int r = nr; r < 16; r++) memcpy(wbuf + (size_t)r * ws, wbuf + (size_t)(nr - 1) * ws, (size_t)K * 2); /* dropped */
        const int next = rg + 16 < W->rows;
        const char *pf = next ? (const char *)W->data + (size_t)(rg + 16) * rb : NULL;
        panel(out + (rg - r0), ldo, wbuf, ws * 2, nr, ap, T, K, 3, NULL, pf, (int)(16 * rb / 64 / (size_t)(K / 32)));
    }
}

static void amx_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt) {
    if (amx_bf16(wt, K)) q3_amx_pack_split((uint32_t *)ap, x, ldx, T, K);
    else q3_avx512_bc_pack_act(ap, x, ldx, T, K, wt);
}

static void amx_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf) {
    const int K = W->cols;
    if (!amx_bf16(W->dtype, K)) {
        q3_avx512_gemm_bc(out, ldo, ap, T, W, r0, r1, wbuf);
        return;
    }
    q3_amx_tiles_on();
    if (W->dtype == Q3_BF16P) {
        bf16p_panels(out, ldo, (const uint32_t *)ap, T, W, r0, r1, (uint16_t *)wbuf);
        return;
    }
    const size_t rs = W->rs ? W->rs : (size_t)K;
    const uint16_t *w = W->data;
    /* Rows of 4 KiB or more (K >= 2048) are streams the hardware prefetcher
     * follows; shorter rows, adjacent, are fetched a panel ahead. From DRAM,
     * 2 threads, GFLOP/s with and without: 2048 x 768, T = 32 418 / 364,
     * T = 64 523 / 409; but 1536 x 2048, T = 32 445 / 637, T = 64 617 / 814,
     * and q30b8 prefill 512 with every panel fetched ahead, two pairs:
     * 403.5 / 402.4 -> 364.9 / 354.1 tok/s (a 64 KiB panel in L2 beside the
     * 0.75-1.5 MiB of packed inputs; the A8 GEMM's MXFP4 panels are 16 KiB). */
    const int pf_next = rs == (size_t)K && K * 2 < 4096;
    for (int rg = r0; rg < r1; rg += 16) {
        const int nr = r1 - rg < 16 ? r1 - rg : 16;
        if (nr == 16) {
            const uint16_t *A = w + (size_t)rg * rs;
            panel(out + (rg - r0), ldo, A, rs * 2, 16, (const uint32_t *)ap, T, K, 3, NULL,
                  pf_next ? (const char *)(A + 16 * rs) : NULL, 16);
            continue;
        }
        /* the last rows of the matrix: a tile's worth, zero-padded (the tiles read 16 rows) */
        uint16_t *rows = (uint16_t *)wbuf;
        for (int r = 0; r < 16; r++)
            if (r < nr) memcpy(rows + (size_t)r * K, w + (size_t)(rg + r) * rs, (size_t)K * sizeof *rows);
            else memset(rows + (size_t)r * K, 0, (size_t)K * sizeof *rows);
        panel(out + (rg - r0), ldo, rows, (size_t)K * 2, nr, (const uint32_t *)ap, T, K, 3, NULL, NULL, 0);
    }
}

/* A8: each token's bf16 copy in the A8 decoders' order (the table's
 * a8_prep), 16 tokens at a time into rows (16 K words), their pairs
 * transposed into the tiles. */
static void amx_a8_pack_act(uint32_t *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt, uint16_t *rows) {
    const int nkb = K / 32, ntb = (T + 15) / 16;
    for (int tb = 0; tb < ntb; tb++) {
        for (int t = 0; t < 16; t++) {
            uint16_t *row = rows + (size_t)t * K;
            if (16 * tb + t < T) q3_avx512bf16_a8_prep(row, x + (size_t)(16 * tb + t) * ldx, K, wt);
            else memset(row, 0, (size_t)K * sizeof *row);
        }
        for (int kb = 0; kb < nkb; kb++) {
            __m512i h[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) h[t] = _mm512_loadu_si512(rows + (size_t)t * K + 32 * kb);
            q3_put_tile(ap + ((size_t)tb * nkb + kb) * Q3_TILE_DW, h);
        }
    }
}

/* Weight-only MX: each token's fp32 input as three bf16 parts (as
 * q3_amx_pack_split makes them, in stored order), each part's words put in the A8
 * decoders' order, 16 tokens at a time into rows (3 * 16 * K words, then
 * 3 * K for one token's parts), their pairs transposed into the tiles. */
static void amx_wo_pack_act(uint32_t *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt, uint16_t *rows) {
    const int nkb = K / 32, ntb = (T + 15) / 16;
    uint16_t *part = rows + (size_t)48 * K;
    for (int tb = 0; tb < ntb; tb++) {
        for (int t = 0; t < 16; t++) {
            const int tok = 16 * tb + t;
            for (int k = 0; k < K; k += 32) {
                __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
                if (tok < T) lo = _mm512_loadu_ps(x + (size_t)tok * ldx + k), hi = _mm512_loadu_ps(x + (size_t)tok * ldx + k + 16);
                for (int c = 0; c < 3; c++) _mm512_storeu_si512(part + (size_t)c * K + k, q3_bf16_part(&lo, &hi));
            }
            for (int c = 0; c < 3; c++) q3_a8_permute_words(rows + ((size_t)c * 16 + t) * K, part + (size_t)c * K, K, wt);
        }
        for (int kb = 0; kb < nkb; kb++)
            for (int c = 0; c < 3; c++) {
                __m512i h[16];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) h[t] = _mm512_loadu_si512(rows + ((size_t)c * 16 + t) * K + 32 * kb);
                q3_put_tile(ap + (((size_t)tb * nkb + kb) * 3 + c) * Q3_TILE_DW, h);
            }
    }
}

/* k blocks per chunk, 8 or 4 (a multiple of the decoders' step, 4 k
 * blocks): the larger whose two decoded A chunks and B tiles (1 KiB per
 * k block each) stay within 40 KiB of L1; 0 for none. kernel_bench mx
 * 1536 2048, AMX Xeon, 2 threads, MXFP4 / MXFP8 A8 GFLOP/s by k blocks
 * per chunk (0: not chunked), T = 32: 0 949 / 789, 4 1143 / 940, 8 1133 /
 * 1042, 12 1052 / 961, 16 908 / 733; T = 64: 0 1313 / 1188, 4 1425 /
 * 1359, 8 1378 / 1295, 12 1167 / 972. */
static int chunk_kb(int ntb, int parts) {
    /* (8 blocks at 4 k blocks a chunk, in groups of 4: q30b8 W4A8
     * prefill 4096, attention matmuls 858-877 -> 941-964 ms, experts
     * even, o_proj's groups one panel) */
    if (ntb > GROUP_MAX) return 0;
    for (int ck = 8; ck >= 4; ck -= 4)
        if (ck * (2 + ntb * parts) <= 40) return ck;
    return 0;
}

/* K-chunked panels, for products of up to GROUP_MAX token blocks over
 * several panels: for each chunk of k blocks, panel after panel, 16 rows'
 * chunk decoded into L1, their sums taken up from memory (resume) and
 * stored again. Per panel over all of K the B tiles (a token block's are
 * 2 K bytes of it) came from L2 for one product each; a chunk's stay in
 * L1 for all the panels of a group. The sums are each product's over k
 * in the same order: the same bits as panel(). q30b8 W4A8, two pairs
 * alternating: experts at prefill 128 252 / 254 -> 207 / 214 ms, at 512
 * 410 / 412 -> 355 / 364. (BF16 rows chunked the same way, read in place
 * in groups of 128-512 KiB, two pairs: q30b8 BF16 prefill 512, experts
 * 639-651 -> 848-1136 ms, slower the larger the group.) */
static void chunked(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf,
                    int parts, int ck) {
    const int K = W->cols, nkb = K / 32, ntb = (T + 15) / 16;
    const size_t eb = W->dtype == Q3_MXFP4 ? (size_t)K / 2 : (size_t)K, bs = block_dwords(K, parts), nb = (size_t)K / 32;
    /* a chunk's decoded rows a line more than its k apart (L1 sets); two
     * buffers: the next chunk is decoded while this one's tiles run */
    const size_t aw = (size_t)ck * 32 + 32;
    uint16_t *abuf[2] = {wbuf, wbuf + 16 * aw};
    float *sums = (float *)(void *)(wbuf + 32 * aw);
    /* Panels per group: their codes (at most 64 KiB) stay in L2 from chunk
     * to chunk, while the next group's are fetched into L2, spread over
     * the group's tiles (the first group's at the start). Without that the
     * first chunk waited on DRAM (q30b8 W4A8 prefill 512: experts as slow
     * as unchunked); groups of 32 KiB ran as fast, 128 KiB 3-5 % slower.
     * The sums of a group's panels fill the rest of wbuf. */
    const int fit = (int)(((size_t)Q3_MX_WBUF_WORDS - 32 * aw) * 2 / ((size_t)ntb * 1024));
    int gp = (int)(((size_t)64 << 10) / (16 * eb));
    gp = gp < 1 ? 1 : gp > fit ? fit : gp;
    {
        const size_t first = (size_t)((r1 - r0 < 16 * gp ? r1 - r0 : 16 * gp)) * eb;
        for (size_t l = 0; l < first; l += 64) _mm_prefetch((const char *)W->data + (size_t)r0 * eb + l, _MM_HINT_T1);
    }
    for (int g0 = r0; g0 < r1; g0 += 16 * gp) {
        const int g1 = r1 - g0 < 16 * gp ? r1 : g0 + 16 * gp, np = (g1 - g0 + 15) / 16, items = (nkb + ck - 1) / ck * np;
        const int n1 = r1 - g1 < 16 * gp ? r1 : g1 + 16 * gp; /* the next group's rows end */
        const char *next = (const char *)W->data + (size_t)g1 * eb;
        const size_t next_lines = (size_t)(n1 - g1) * eb / 64, item_lines = (next_lines + (size_t)items - 1) / (size_t)items;
        for (size_t l = 0; l < (size_t)(n1 - g1) * nb; l += 64) _mm_prefetch((const char *)W->scales + (size_t)g1 * nb + l, _MM_HINT_T1);
        /* item i: panel i % np of chunk i / np, decoded into abuf[i & 1]
         * after item i - 1's tiles were issued (they run meanwhile) */
        q3_a8_decode_span(abuf[0], aw, W, g0, 16, (g1 - g0 < 16 ? g1 : g0 + 16) - 1, 0, 32 * (ck < nkb ? ck : nkb));
        for (int i = 0; i < items; i++) {
            const int kb0 = i / np * ck, kb1 = nkb - kb0 < ck ? nkb : kb0 + ck, p = i % np;
            float *st = sums + (size_t)p * ntb * 256;
            const char *pf = (size_t)i * item_lines < next_lines ? next + (size_t)i * item_lines * 64 : NULL;
            const int pfl = (int)((item_lines + (size_t)(kb1 - kb0) - 1) / (size_t)(kb1 - kb0));
            tiles_group_of(st, abuf[i & 1], aw * 2, ap, bs, kb0, kb1, parts, ntb, NULL, pf, pfl, kb0 > 0);
            if (i + 1 < items) {
                const int nk0 = (i + 1) / np * ck, nrg = g0 + 16 * ((i + 1) % np);
                q3_a8_decode_span(abuf[(i + 1) & 1], aw, W, nrg, 16, (g1 - nrg < 16 ? g1 : nrg + 16) - 1, 32 * nk0,
                                  32 * (nkb - nk0 < ck ? nkb : nk0 + ck));
            }
        }
        for (int p = 0; p < np; p++) {
            const int rg = g0 + 16 * p, nr = g1 - rg < 16 ? g1 - rg : 16;
            for (int i = 0; i < ntb; i++) {
                const int t0 = 16 * i, nt = T - t0 < 16 ? T - t0 : 16;
                store_tokens(out + (size_t)t0 * ldo + (rg - r0), ldo, sums + ((size_t)p * ntb + i) * 256, nt, nr);
            }
        }
    }
}

/* MX rows decoded to bf16 with their scales folded in against inputs of
 * `parts` bf16 parts (A8: 1; weight-only: 3); 0, computing nothing, where
 * a scale of these rows does not fold exactly. */
static int mx_tiles(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf,
                    int parts) {
    if (!q3_a8_scales_foldable(W, r0, r1)) return 0;
    q3_amx_tiles_on();
    const int ck = r1 - r0 > 16 ? chunk_kb((T + 15) / 16, parts) : 0;
    if (ck) {
        chunked(out, ldo, ap, T, W, r0, r1, wbuf, parts, ck);
        return 1;
    }
    const int K = W->cols, nkb = K / 32, fp4 = W->dtype == Q3_MXFP4;
    const size_t eb = fp4 ? (size_t)K / 2 : (size_t)K, nb = (size_t)K / 32;
    /* rows a line more than K apart: K words apart, 16 rows of a tile shared L1 sets */
    const size_t ws = (size_t)K + 32;
    for (int rg = r0; rg < r1; rg += 16) {
        const int nr = r1 - rg < 16 ? r1 - rg : 16;
        /* The next panel's codes (usually this thread's call after next:
         * gate and up alternate) go to L2 during the tiles, its scales now:
         * decoding waited on memory. q30b8 W4A8 prefill 512, two pairs:
         * experts 575 / 471 -> 449 / 430 ms. */
        const int next = rg + 16 < W->rows;
        const char *pf = next ? (const char *)W->data + (size_t)(rg + 16) * eb : NULL;
        if (next)
            for (size_t l = 0; l < 16 * nb; l += 64) _mm_prefetch((const char *)W->scales + (size_t)(rg + 16) * nb + l, _MM_HINT_T1);
        const int pfl = (int)(16 * eb / 64 / (size_t)nkb);
        /* rows past nr repeat the last one; their results are dropped */
        const side_decode sd = {W, wbuf, ws, rg, rg + nr - 1, nkb};
        if (fp4) {
            for (int r = 0; r < 16; r++) q3_a8_decode_row(wbuf + (size_t)r * ws, W, rg + (r < nr ? r : nr - 1));
            panel(out + (rg - r0), ldo, wbuf, ws * 2, nr, ap, T, K, parts, NULL, pf, pfl);
            continue;
        }
        for (int u = 0; u < SIDE_LEAD; u++) side_unit(&sd, u);
        panel(out + (rg - r0), ldo, wbuf, ws * 2, nr, ap, T, K, parts, &sd, pf, pfl);
    }
    return 1;
}

static int amx_gemm_a8(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf) {
    return mx_tiles(out, ldo, ap, T, W, r0, r1, wbuf, 1);
}

static int amx_gemm_wo(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf) {
    return mx_tiles(out, ldo, ap, T, W, r0, r1, wbuf, 3);
}

double q3_amx_tile_flops(long n) {
    q3_amx_tiles_on();
    _tile_zero(0); /* (tile numbers are immediates: no loop) */
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, g_bench_operand, 64);
    _tile_loadd(5, g_bench_operand, 64);
    _tile_loadd(6, g_bench_operand, 64);
    _tile_loadd(7, g_bench_operand, 64);
    for (long i = 0; i < n; i += 4) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, g_bench_sink[omp_get_thread_num() % 64], 64);
    return (double)((n + 3) / 4 * 4) * 16 * 16 * 32 * 2;
}

/* The A8 GEMVs of the AMX table are the fp32 MX GEMVs of the AVX-512 table
 * (the weights decoded by VPERMPS lookups or shifts, FMAs on a permuted
 * fp32 copy of the input), for MXFP4 and MXFP8 rows: on the AMX Xeon of
 * BENCHMARKS.md VDPBF16PS issues about once per 2.2 cycles, and the bf16
 * GEMV ran slower. q30b8 W4A8 decode, experts per token: 7.47 / 7.53 ms
 * with the fp32 GEMV, 7.58 / 7.65 with the bf16 one; MXFP8 rows (its
 * attention and lm_head), one thread from L2: 22-23 against 19-20 G
 * elements/s, whole decode steps 2-3 % faster in 12 of 14 alternating
 * pairs. An exact integer GEMV on AMX-INT8 tiles ran slower than either. */
void q3_amx_kernels(q3_isa_kernels *k) {
    if (k->mx_prep && k->gemv_mx && k->gemv_mx_tokens) { /* the input copy, the GEMV and the tokens GEMV go together */
        k->a8_prep = k->mx_prep;
        k->gemv_a8 = k->gemv_mx;
        k->gemv_a8_tokens = k->gemv_mx_tokens;
    }
    k->bc_pack_act = amx_bc_pack_act;
    k->tile_parts = 3;
    /* BF16 products of 2-6 tokens too (AVX-512 sends them to gemm_small):
     * from DRAM, 1536 x 2048, 2 threads, 19.2-19.6 -> 24.0-24.5 GB/s at 4
     * and 6 tokens, even at 2 and 8; q30b8 prefill 128, two pairs: experts
     * 463 / 452 -> 454 / 445 ms. */
    k->bc_min_t = 2;
    k->gemm_bc = amx_gemm_bc;
    k->bc_bf16p = 1;
    k->a8_pack_act = amx_a8_pack_act;
    k->gemm_a8 = amx_gemm_a8;
    k->mx_panels = 1;
    /* Tiles from 5 tokens on (kernel_bench mx 1536 2048 20 T, MXFP4 GFLOP/s,
     * tiles against the tokens GEMV: T = 3 109 / 140, 4 144 / 150, 6 216 /
     * ~150, 12 425 / 156). */
    k->a8_tokens_t = 4;
    k->a8_max_t = Q3_BC_TOKENS_MAX;
    k->wo_pack_act = amx_wo_pack_act;
    k->gemm_wo = amx_gemm_wo;
    q3_amx_i8_kernels(k);
    q3_amx_attention_kernels(k);
}
#pragma GCC pop_options
