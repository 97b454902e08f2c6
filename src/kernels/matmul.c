/* Matmul driver: picks the kernel of the table in force (isa_select.c)
 * for each product, splits output rows across threads, and runs a GEMV
 * (one token, weights streamed once) or a GEMM (several tokens: each
 * weight panel is widened or decoded once and reused for every token
 * tile). */
#include <omp.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "kernels/scratch.h"
#include "quant/bf16p.h"
#include "util/error.h"

/* Counts matmul passes: an A8 input widened to bf16 by a thread stays
 * valid for the rest of the pass (inputs do not change within one). */
static unsigned long long g_pass;

/* The kernel table in force (isa_select.c). */
static inline const q3_isa_kernels *kt(void) { return q3_isa_current(); }

static inline size_t cs_of(const q3_mat *W) { return W->cs ? W->cs : 1; }

void q3_pack_panel(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc) {
    float row[Q3_KC];
    for (int j = 0; j < Q3_NR; j++) {
        if (j >= nr) {
            for (int k = 0; k < kc; k++) Bp[k * Q3_NR + j] = 0;
            continue;
        }
        q3_mat_row_f32(W, r0 + j, k0, kc, row);
        for (int k = 0; k < kc; k++) Bp[k * Q3_NR + j] = row[k];
    }
}

/* Longest input the GEMVs on a prepared copy take (longer ones use the
 * plain fp32 GEMV). */
enum { A8_KMAX = 32768 };

/* The float MX kernels (gemv_mx, gemv_a8, gemm_a8): MXFP8 / MXFP4 weights. */
static int mx_shape_ok(const q3_mat *W, int kmax) {
    return q3_dtype_is_mxfp(W->dtype) && W->cs <= 1 && W->cols % (W->dtype == Q3_MXFP4 ? 128 : 64) == 0 && W->cols <= kmax;
}

/* The integer GEMV: MXINT8 inputs against MXINT8 or MXFP4 weights. */
static int gemv_i8_ok(const q3_mat *W) {
    return kt()->gemv_i8 && W->ai8 && (W->dtype == Q3_MXINT8 || W->dtype == Q3_MXFP4) && W->cs <= 1 && W->cols % 64 == 0 &&
           W->cols <= A8_KMAX;
}

static int a8_shape_ok(const q3_mat *W, int kmax) { return W->a8 && mx_shape_ok(W, kmax); }

/* The GEMVs on a prepared input copy: none, the float MX one (any input),
 * the A8 one (MXFP8 / MXINT8 inputs, where the table has one) or the
 * integer one (MXINT8 inputs). */
typedef enum { PG_NONE, PG_MX, PG_A8, PG_I8 } prep_gemv;

static prep_gemv prepared_gemv(const q3_mat *W, int T) {
    if (gemv_i8_ok(W)) return PG_I8;
    /* (an A8 GEMV without a tokens pass serves one token: more share each decoded row in gemv_mx_tokens) */
    if (kt()->gemv_a8 && a8_shape_ok(W, A8_KMAX) && (T == 1 || kt()->gemv_a8_tokens)) return PG_A8;
    return kt()->gemv_mx && mx_shape_ok(W, A8_KMAX) ? PG_MX : PG_NONE;
}

static void prep_input(prep_gemv pg, void *xc, const float *x, const q3_mat *W) {
    if (pg == PG_I8) kt()->i8_prep(xc, x, W->cols, W->dtype);
    else if (pg == PG_A8) kt()->a8_prep(xc, x, W->cols, W->dtype);
    else kt()->mx_prep(xc, x, W->cols, W->dtype);
}

static void gemv_prepared(prep_gemv pg, float *out, const void *xc, const q3_mat *W, int r0, int nr) {
    if (pg == PG_I8) kt()->gemv_i8(out, xc, W, r0, r0 + nr);
    else if (pg == PG_A8) kt()->gemv_a8(out, xc, W, r0, r0 + nr);
    else kt()->gemv_mx(out, xc, W, r0, r0 + nr);
}

/* MX GEMV on a prepared input copy, made once per thread and pass, keyed
 * by the weights' dtype and the kernel too (the copy's layout depends on
 * them). */
static void run_gemv_prepared(const q3_mm_job *jb, int r0, int nr, prep_gemv pg) {
    static _Thread_local float xb[A8_KMAX] __attribute__((aligned(64)));
    static _Thread_local const float *have_x;
    static _Thread_local unsigned long long have_pass;
    static _Thread_local q3_dtype have_dt;
    static _Thread_local prep_gemv have_pg;
    const q3_mat *W = jb->W;
    if (have_x != jb->x || have_pass != g_pass || have_dt != W->dtype || have_pg != pg) {
        prep_input(pg, xb, jb->x, W);
        have_x = jb->x, have_pass = g_pass, have_dt = W->dtype, have_pg = pg;
    }
    gemv_prepared(pg, jb->out + r0, xb, W, r0, nr);
}

/* Most tokens of the per-token MX GEMV path (its input copies). */
enum { MX_GEMV_TOKENS = 12 };

/* The A8 GEMM takes W's products of 2 .. Q3_LANE_TOKENS tokens; but
 * MXINT8 inputs against MXFP4 weights go to the integer kernels where the
 * table has them: kernel_bench mx 1536 2048, one thread, on the AMD EPYC
 * with VNNI and BF16, the integer ones ran 212-409 GFLOP/s at T = 2-48,
 * the bf16 GEMM 55-330. */
static int a8_gemm_takes(const q3_mat *W) {
    return kt()->gemm_a8 && a8_shape_ok(W, Q3_LANE_KMAX) && !(W->ai8 && W->dtype == Q3_MXFP4 && kt()->gemm_i8);
}

/* Most tokens the A8 GEMM takes. */
static int a8_most(void) { return kt()->a8_max_t ? kt()->a8_max_t : Q3_LANE_TOKENS; }

static int a8_gemm_ok(const q3_mm_job *jb) { return jb->T > 1 && jb->T <= a8_most() && a8_gemm_takes(jb->W); }

/* Tokens-in-lanes GEMMs: the input rows are packed once per thread and
 * pass (inputs do not change within a pass), into the thread's scratch
 * (kernels/scratch.h; prefill only: decode takes the GEMV paths). */
typedef struct {
    const float *x;
    unsigned long long pass;
    q3_dtype dt;
    int T, a8, ai8; /* the packing may depend on the weights' dtype and the input format */
} act_key;

static int act_stale(act_key *k, const q3_mm_job *jb) {
    const q3_mat *W = jb->W;
    if (k->x == jb->x && k->pass == g_pass && k->dt == W->dtype && k->T == jb->T && k->a8 == W->a8 && k->ai8 == W->ai8)
        return 0;
    *k = (act_key){jb->x, g_pass, W->dtype, jb->T, W->a8, W->ai8};
    return 1;
}

static int run_gemm_a8(const q3_mm_job *jb, int r0, int nr) {
    static _Thread_local act_key have;
    const q3_mat *W = jb->W;
    uint32_t *ap = q3_scratch(Q3_SCR_A8_ACT, (size_t)a8_most() * (Q3_LANE_KMAX / 2) * sizeof *ap);
    uint16_t *row = q3_scratch(Q3_SCR_A8_ROW, (size_t)16 * Q3_LANE_KMAX * sizeof *row); /* a row; AMX 16 */
    uint16_t *wbuf = q3_scratch(Q3_SCR_A8_W, (size_t)Q3_MX_WBUF_WORDS * sizeof *wbuf);
    if (act_stale(&have, jb)) kt()->a8_pack_act(ap, jb->x, jb->ldx, jb->T, W->cols, W->dtype, row);
    return kt()->gemm_a8(jb->out + r0, jb->ldo, ap, jb->T, W, r0, r0 + nr, wbuf);
}

/* The GEMV that decodes MX rows once for several tokens takes W (with
 * MXINT8 inputs: gemv_i8_tokens, MXFP4 weights; on fp32 copies:
 * gemv_mx_tokens, MXFP4 and MXFP8 weights; on the A8 copies:
 * gemv_a8_tokens, the shapes gemv_a8 takes). */
static int tokens_ok(const q3_mat *W, prep_gemv pg) {
    return pg == PG_I8   ? kt()->gemv_i8_tokens && W->dtype == Q3_MXFP4 && W->cols % 128 == 0
           : pg == PG_MX ? kt()->gemv_mx_tokens && q3_mx_wide_fits(W->dtype, W->cols)
                         : pg == PG_A8 && kt()->gemv_a8_tokens;
}

/* A few tokens against MX weights: one pass of the tokens GEMV where it
 * takes W, else one GEMV per token (the integer one where it applies), on
 * prepared input copies (made once per thread and pass; copies are at most
 * 4 * K bytes). */
static void run_gemv_mx_tokens(const q3_mm_job *jb, int r0, int nr, prep_gemv pg) {
    static _Thread_local act_key have;
    const q3_mat *W = jb->W;
    float *xt = q3_scratch(Q3_SCR_TOKENS_X, (size_t)MX_GEMV_TOKENS * A8_KMAX * sizeof *xt);
    const int together = tokens_ok(W, pg), i8 = pg == PG_I8;
    if (act_stale(&have, jb))
        for (int t = 0; t < jb->T; t++) {
            float *xc = xt + (size_t)t * W->cols;
            if (together && i8) kt()->i8_prep_tokens(xc, jb->x + (size_t)t * jb->ldx, W->cols); /* (not gemv_i8's layout) */
            else prep_input(pg, xc, jb->x + (size_t)t * jb->ldx, W);
        }
    if (together) {
        const size_t xs = (size_t)W->cols * sizeof *xt;
        if (i8) kt()->gemv_i8_tokens(jb->out + r0, jb->ldo, xt, xs, jb->T, W, r0, r0 + nr);
        else if (pg == PG_A8) kt()->gemv_a8_tokens(jb->out + r0, jb->ldo, xt, xs, jb->T, W, r0, r0 + nr);
        else kt()->gemv_mx_tokens(jb->out + r0, jb->ldo, xt, xs, jb->T, W, r0, r0 + nr);
        return;
    }
    for (int t = 0; t < jb->T; t++) gemv_prepared(pg, jb->out + (size_t)t * jb->ldo + r0, xt + (size_t)t * W->cols, W, r0, nr);
}

static int bc_shape_ok(const q3_mat *W) {
    const int mx = q3_dtype_is_mx(W->dtype);
    return kt()->gemm_bc && (!mx || (kt()->bc_mx && W->cols % 64 == 0)) && (W->dtype != Q3_BF16P || kt()->bc_bf16p) &&
           cs_of(W) == 1 && W->cols % 16 == 0 && W->cols <= Q3_LANE_KMAX;
}

/* The integer GEMM: MXINT8 inputs against MXFP4 weights (the W4A8i
 * experts) from I8_GEMM_MIN_T tokens on; fewer take one integer GEMV per
 * token (kernel_bench mx 1536 2048, AVX2: the GEMM 110-122 against 76-93
 * GFLOP/s at 7-8 tokens, even at 6, slower below). */
enum { I8_GEMM_MIN_T = 7 };

static int gemm_i8_ok(const q3_mm_job *jb) {
    const q3_mat *W = jb->W;
    return kt()->gemm_i8 && W->ai8 && (W->dtype == Q3_MXFP4 || (W->dtype == Q3_MXINT8 && kt()->gemm_i8_int8)) && W->cs <= 1 &&
           W->cols % 64 == 0 && W->cols <= Q3_LANE_KMAX && jb->T >= I8_GEMM_MIN_T && jb->T <= Q3_BC_TOKENS_MAX &&
           !(jb->T <= kt()->tokens_t && tokens_ok(W, PG_I8));
}

static void run_gemm_i8(const q3_mm_job *jb, int r0, int nr) {
    static _Thread_local act_key have;
    uint32_t *ap = q3_scratch(Q3_SCR_I8_ACT, (size_t)Q3_BC_TOKENS_MAX * Q3_LANE_KMAX);
    float *fs = q3_scratch(Q3_SCR_I8_FS, (size_t)Q3_BC_TOKENS_MAX * (Q3_LANE_KMAX / 32) * sizeof *fs);
    void *wbuf = q3_scratch(Q3_SCR_I8_W, (size_t)Q3_NR * (Q3_LANE_KMAX + Q3_LANE_KMAX / 4));
    if (act_stale(&have, jb)) kt()->i8_pack_act(ap, fs, jb->x, jb->ldx, jb->T, jb->W->cols);
    kt()->gemm_i8(jb->out + r0, jb->ldo, ap, fs, jb->T, jb->W, r0, r0 + nr, wbuf);
}

/* Weight-only MXFP4 / MXFP8 products on the table's gemm_wo (AMX tiles). */
static int wo_takes(const q3_mat *W) { return kt()->gemm_wo && !W->a8 && mx_shape_ok(W, Q3_LANE_KMAX); }

/* Most tokens the lane GEMMs (gemm_bc, gemm_wo) take in one pass. */
static int lane_most(void) { return kt()->bc_max_t ? kt()->bc_max_t : Q3_LANE_TOKENS; }

/* The weight-only tile GEMM takes this job's products. */
static int wo_gemm_ok(const q3_mm_job *jb) { return wo_takes(jb->W) && jb->T >= kt()->bc_min_t && jb->T <= lane_most(); }

/* Bytes of the lane GEMMs' packed fp32 input per token for W: fp32 lanes
 * (gemm_bc), or bf16 parts (BF16 weights on the AMX tiles, and gemm_wo). */
static size_t bc_token_bytes(const q3_mat *W) {
    const int parts = (W->dtype == Q3_BF16 || W->dtype == Q3_BF16P || wo_takes(W)) ? kt()->tile_parts : 0;
    return (size_t)W->cols * (parts ? 2 * (size_t)parts : 4);
}

static int run_gemm_wo(const q3_mm_job *jb, int r0, int nr) {
    static _Thread_local act_key have;
    const q3_mat *W = jb->W;
    const size_t parts = (size_t)kt()->tile_parts;
    uint32_t *ap = q3_scratch(Q3_SCR_WO_ACT, (size_t)Q3_BC_TOKENS_MAX * (Q3_LANE_KMAX / 2) * parts * sizeof *ap);
    uint16_t *rows = q3_scratch(Q3_SCR_WO_ROWS, 17 * parts * Q3_LANE_KMAX * sizeof *rows);
    uint16_t *wbuf = q3_scratch(Q3_SCR_A8_W, (size_t)Q3_MX_WBUF_WORDS * sizeof *wbuf);
    if (act_stale(&have, jb)) kt()->wo_pack_act(ap, jb->x, jb->ldx, jb->T, W->cols, W->dtype, rows);
    return kt()->gemm_wo(jb->out + r0, jb->ldo, ap, jb->T, W, r0, r0 + nr, wbuf);
}

static void run_gemm_bc(const q3_mm_job *jb, int r0, int nr) {
    static _Thread_local act_key have;
    /* fp32 lanes and rows, or bf16 parts (AMX: 3 per input) */
    const size_t f32 = ((size_t)(Q3_BC_TOKENS_MAX + 8) * Q3_LANE_KMAX + 16 * 16) * sizeof(float),
                 parts = (size_t)Q3_BC_TOKENS_MAX * Q3_LANE_KMAX * 2 * (size_t)kt()->tile_parts;
    float *ap = q3_scratch(Q3_SCR_BC_ACT, f32 > parts ? f32 : parts);
    float *wbuf = q3_scratch(Q3_SCR_BC_W, (size_t)Q3_NR * (Q3_LANE_KMAX + 16) * sizeof *wbuf);
    if (act_stale(&have, jb)) kt()->bc_pack_act(ap, jb->x, jb->ldx, jb->T, jb->W->cols, jb->W->dtype);
    kt()->gemm_bc(jb->out + r0, jb->ldo, ap, jb->T, jb->W, r0, r0 + nr, wbuf);
}

/* The broadcast GEMM takes this job's products. */
static int bc_takes(const q3_mm_job *jb) {
    return jb->T <= lane_most() && (jb->T >= kt()->bc_min_t || q3_dtype_is_mx(jb->W->dtype)) && bc_shape_ok(jb->W);
}

/* Several tokens on BF16P weights where the broadcast GEMM does not take
 * them (the scalar table; fewer tokens than it takes, or more without
 * passes): rows unpacked to BF16, this many at a time, for the BF16
 * kernels. */
enum { BF16P_ROWS = 64 };

static void run_rows_any(const q3_mm_job *jb, const float *tiles, int r0, int nr);

static void run_bf16p_unpacked(const q3_mm_job *jb, int r0, int nr) {
    const q3_mat *W = jb->W;
    const int K = W->cols;
    uint16_t *buf = q3_scratch(Q3_SCR_BF16P, (size_t)BF16P_ROWS * (size_t)K * sizeof *buf);
    for (int q = r0; q < r0 + nr; q += BF16P_ROWS) {
        const int n = r0 + nr - q < BF16P_ROWS ? r0 + nr - q : BF16P_ROWS;
        if (q3_kernels_isa() >= Q3_ISA_AVX2) q3_bf16p_unpack_rows_avx2(buf, (size_t)K, W, q, n);
        else
            for (int r = 0; r < n; r++)
                q3_bf16p_unpack_row(q3_mat_rows(W, q + r, 1).data, (size_t)K, W->scales, W->side_groups, buf + (size_t)r * K);
        const q3_mat v = {.data = buf, .dtype = Q3_BF16, .rows = n, .cols = K};
        const q3_mm_job sub = {jb->out + q, jb->ldo, jb->x, jb->ldx, jb->T, &v, NULL};
        run_rows_any(&sub, NULL, 0, n);
    }
}

/* The kernels other than the panel GEMM, in order of preference, for the
 * panel of nr rows at r0: with run, runs the first that takes it and says
 * whether one did; without, only says whether one would (counting the A8
 * GEMM as taking it: it may hand a panel back at run time). */
static int other_kernel(const q3_mm_job *jb, int r0, int nr, int run) {
    const q3_mat *W = jb->W;
#define TAKE(call)         \
    do {                   \
        if (run) call;     \
        return 1;          \
    } while (0)
    if (W->dtype == Q3_BF16P && jb->T > 1 && !bc_takes(jb)) TAKE(run_bf16p_unpacked(jb, r0, nr));
    const prep_gemv pg = prepared_gemv(W, jb->T); /* a GEMV on an input copy applies (one token or a few) */
    if (jb->T == 1 && pg != PG_NONE) TAKE(run_gemv_prepared(jb, r0, nr, pg));
    if (pg == PG_A8 && jb->T <= kt()->a8_tokens_t && tokens_ok(W, pg)) TAKE(run_gemv_mx_tokens(jb, r0, nr, pg));
    if (a8_gemm_ok(jb) && (!run || run_gemm_a8(jb, r0, nr))) return 1;
    if (jb->T == 1) TAKE(kt()->gemv(jb->out + r0, jb->x, W, r0, r0 + nr));
    if (gemm_i8_ok(jb)) TAKE(run_gemm_i8(jb, r0, nr));
    /* The tokens GEMV takes products up to tokens_t (MXFP8 ones had run slower there in the model
     * than in the broadcast GEMM while their products were subnormals: q3_mx_prep_copy). */
    const int most = !tokens_ok(W, pg) ? (pg == PG_I8 ? kt()->i8_gemv_t : kt()->mx_gemv_t)
                     : pg == PG_A8      ? kt()->a8_tokens_t
                                        : kt()->tokens_t;
    if (jb->T <= most && jb->T <= MX_GEMV_TOKENS && pg != PG_NONE) TAKE(run_gemv_mx_tokens(jb, r0, nr, pg));
    /* weight-only MX on the tiles; rows whose scales do not fold go on to the broadcast GEMM */
    if (wo_gemm_ok(jb) && (!run || run_gemm_wo(jb, r0, nr))) return 1;
    if (bc_takes(jb)) TAKE(run_gemm_bc(jb, r0, nr));
    if (jb->T <= kt()->small_t && kt()->gemm_small && q3_dtype_is_plain(W->dtype) && cs_of(W) == 1 && W->cols % 16 == 0 &&
        nr % 2 == 0)
        TAKE(kt()->gemm_small(jb->out, jb->ldo, jb->x, jb->ldx, jb->T, W, r0, r0 + nr));
#undef TAKE
    return 0;
}

/* Jobs whose panels all go to the panel GEMM get their input packed for
 * it (pack_tiles) once per pass, shared by the threads. */
static int takes_panel_gemm(const q3_mm_job *jb) {
    return jb->T > 1 && !other_kernel(jb, 0, jb->W->rows < Q3_NR ? jb->W->rows : Q3_NR, 0);
}

/* Tile t0 / mr of a job's input for the panel GEMM: the mr token rows from
 * t0 as [K][mr] (element k of row i at k * mr + i, rows past T zero), so
 * the micro kernel broadcasts from one sequential stream instead of mr
 * rows K floats apart (which share L1 sets when K * 4 is a multiple of 4
 * KiB). kernel_bench M K 512 (AVX2, 2 threads, medians of five): 4096 x
 * 2048 149.6 -> 155.9, 2048 x 4096 140.6 -> 157.1 GFLOP/s. */
static void pack_tile(float *tiles, const q3_mm_job *jb, int mr, int t0) {
    const int K = jb->W->cols;
    float *dst = tiles + (size_t)t0 * K;
    for (int i = 0; i < mr; i++) {
        const float *xr = t0 + i < jb->T ? jb->x + (size_t)(t0 + i) * jb->ldx : NULL;
        for (int k = 0; k < K; k++) dst[(size_t)k * mr + i] = xr ? xr[k] : 0.0f;
    }
}

/* One panel of up to NR output rows of one job; tiles: the job's packed
 * input (pack_tile) or NULL (the micro kernel then reads the rows as stored). */
static void run_panel(const q3_mm_job *jb, const float *tiles, int r0) {
    static _Thread_local float Bp[Q3_KC * Q3_NR] __attribute__((aligned(64)));
    const q3_mat *W = jb->W;
    const int nr = W->rows - r0 < Q3_NR ? W->rows - r0 : Q3_NR, K = W->cols, mr = kt()->mr;
    if (other_kernel(jb, r0, nr, 1)) return;
    for (int k0 = 0; k0 < K; k0 += Q3_KC) {
        const int kc = K - k0 < Q3_KC ? K - k0 : Q3_KC;
        if (kt()->pack && cs_of(W) == 1 && nr == Q3_NR && kc % 8 == 0) kt()->pack(Bp, W, r0, nr, k0, kc);
        else q3_pack_panel(Bp, W, r0, nr, k0, kc);
        for (int t = 0; t < jb->T; t += mr) {
            const int mt = jb->T - t < mr ? jb->T - t : mr;
            float *c = jb->out + (size_t)t * jb->ldo + r0;
            if (tiles) kt()->micro(tiles + (size_t)t * K + (size_t)k0 * mr, 1, (size_t)mr, Bp, kc, c, jb->ldo, mt, nr, k0 > 0);
            else kt()->micro(jb->x + (size_t)t * jb->ldx + k0, jb->ldx, 1, Bp, kc, c, jb->ldo, mt, nr, k0 > 0);
        }
    }
}

/* The first lines of row r of W and of its scales: where a stream starts
 * that the kernels' own prefetch (ahead within a stream) cannot see coming. */
static void prefetch_rows_at(const q3_mat *W, int r) {
    const q3_mat v = q3_mat_rows(W, r, 1);
    q3_pf_lines(v.data, 0, Q3_PF_WEIGHTS);
    if (v.scales) q3_pf_lines(v.scales, 0, Q3_SC_PF_BYTES);
}

/* Rows [r0, r0 + nr) of a job (panels, or the rows of one-token jobs):
 * more than a panel by the kernel other_kernel picks, in one call, else
 * (or where that hands them back) panel by panel, run_panel trying
 * other_kernel first and then the panel GEMM (with the job's packed input
 * tiles, or NULL: the rows as stored). */
static void run_rows_any(const q3_mm_job *jb, const float *tiles, int r0, int nr) {
    if (nr > Q3_NR && other_kernel(jb, r0, nr, 1)) return;
    for (int q = r0; q < r0 + nr; q += Q3_NR) run_panel(jb, tiles, q);
}

/* Rows [r0, r0 + nr) of a merged gate/up job (jb->up): the gate and the up
 * products of those rows into the thread's scratch (run_rows_any), then
 * out = silu(gate) * up (the values a separate pass over whole rows would
 * give: SwiGLU is elementwise). */
static void run_glu(const q3_mm_job *jb, const float *tiles, int r0, int nr) {
    float *g = q3_scratch(Q3_SCR_GLU, (size_t)2 * jb->T * nr * sizeof *g), *u = g + (size_t)jb->T * nr;
    /* rows from r0 to the matrices' end, so the kernels' prefetch of next rows still sees them */
    const q3_mat gw = q3_mat_rows(jb->W, r0, jb->W->rows - r0), uw = q3_mat_rows(jb->up, r0, jb->up->rows - r0);
    const q3_mm_job gj = {g, (size_t)nr, jb->x, jb->ldx, jb->T, &gw, NULL}, uj = {u, (size_t)nr, jb->x, jb->ldx, jb->T, &uw, NULL};
    /* A thread switches between the gate and the up rows at every call
     * (a panel or a job's panels in prefill, a take of its run in decode):
     * the up rows' start is fetched while the gate rows stream, the gate
     * rows after these (usually the thread's next) while the up rows do.
     * Without, W4A8 decode's experts ran about 1.5 % and its prefill's 2 %
     * slower than as plain jobs. */
    prefetch_rows_at(&uw, 0);
    run_rows_any(&gj, tiles, 0, nr);
    if (nr < gw.rows) prefetch_rows_at(&gw, nr);
    run_rows_any(&uj, tiles, 0, nr);
    q3_swiglu(g, g, u, jb->T * nr); /* one call for all tokens: per token, the dispatch cost as much as 16 values */
    for (int t = 0; t < jb->T; t++) memcpy(jb->out + (size_t)t * jb->ldo + r0, g + (size_t)t * nr, (size_t)nr * sizeof *g);
}

/* Panels [q0, q1) of a job, merged gate/up or plain: one at a time, or
 * all in one call where the table's MX tile GEMMs take them so
 * (mx_panels). */
static void run_job_panels(const q3_mm_job *jb, const float *tiles, int q0, int q1) {
    const int rows = jb->W->rows, r1 = q1 * Q3_NR < rows ? q1 * Q3_NR : rows;
    if (kt()->mx_panels && q1 - q0 > 1 && (a8_gemm_ok(jb) || wo_gemm_ok(jb))) {
        if (jb->up) run_glu(jb, tiles, q0 * Q3_NR, r1 - q0 * Q3_NR);
        else run_rows_any(jb, tiles, q0 * Q3_NR, r1 - q0 * Q3_NR);
        return;
    }
    for (int q = q0; q < q1; q++) {
        const int r0 = q * Q3_NR;
        if (jb->up) run_glu(jb, tiles, r0, rows - r0 < Q3_NR ? rows - r0 : Q3_NR);
        else run_panel(jb, tiles, r0);
    }
}

static inline int panels_of(const q3_mm_job *jb) { return jb->T > 0 ? (jb->W->rows + Q3_NR - 1) / Q3_NR : 0; }

/* Threads take chunks of consecutive panels from a shared counter, so a
 * thread slowed by the memory system or by the other tenant of its core
 * takes fewer chunks instead of holding everyone at the join. Each output
 * row is still computed by one thread with the same kernel, so results do
 * not depend on the schedule. Chunk indices only grow, so each thread walks
 * the jobs forward with a cursor. tiles: each job's packed input (NULL for
 * none), or NULL when no job has one. guided: chunks of at most 1/guided of
 * the panels left (0: always chunk). */
static void run_chunks(const q3_mm_job *jobs, float *const *tiles, int npanels, int chunk, int guided, atomic_int *next) {
    int j = 0, base = 0;
    for (;;) {
        int p0 = atomic_load_explicit(next, memory_order_relaxed), n;
        do {
            if (p0 >= npanels) return;
            n = guided ? (npanels - p0) / guided : chunk;
            n = n < 1 ? 1 : n > chunk ? chunk : n;
        } while (!atomic_compare_exchange_weak_explicit(next, &p0, p0 + n, memory_order_relaxed, memory_order_relaxed));
        const int p1 = p0 + n < npanels ? p0 + n : npanels;
        for (int p = p0; p < p1;) {
            while (p >= base + panels_of(&jobs[j])) base += panels_of(&jobs[j]), j++;
            const int end = base + panels_of(&jobs[j]) < p1 ? base + panels_of(&jobs[j]) : p1;
            run_job_panels(&jobs[j], tiles ? tiles[j] : NULL, p - base, end - base);
            p = end;
        }
    }
}

/* Decode passes (one token: streaming weights, no reuse): each thread owns
 * an equal run of consecutive panels and walks it forward, one stream for
 * the prefetchers from start to end; a thread that runs out takes the back
 * half of what is left of the largest run, which becomes its own run (and
 * can be split again). The threads finish within about a panel of each
 * other, and each starts only a few streams per pass. A run is [lo, hi)
 * packed into one word, so taking from either end is one compare-and-swap.
 * Against chunks of an eighth of a thread's share from a shared counter
 * (run_chunks), decode steps alternating in one process, 2 threads: q30b8
 * BF16 4.7-5.5 %, W4A8 2.7-3.0 %, W4A8i 4.4 %, tiny 7.4 % faster. */
typedef struct {
    _Alignas(64) _Atomic uint64_t lohi;
} panel_run;

enum { MAX_RUNS = 256 };
static panel_run g_runs[MAX_RUNS];

static inline uint64_t run_pack(uint32_t lo, uint32_t hi) { return (uint64_t)hi << 32 | lo; }

/* Takes up to most panels from the front of run r (fewer near its end,
 * so what is left to steal stays fine-grained): the first, with their
 * count in *n; -1 if the run is empty. */
static int run_take_front(panel_run *r, int most, int *n) {
    uint64_t v = atomic_load_explicit(&r->lohi, memory_order_relaxed);
    for (;;) {
        const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo >= hi) return -1;
        uint32_t take = (hi - lo) / 4;
        take = take < 1 ? 1 : take > (uint32_t)most ? (uint32_t)most : take;
        if (atomic_compare_exchange_weak_explicit(&r->lohi, &v, run_pack(lo + take, hi), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *n = (int)take;
            return (int)lo;
        }
    }
}

/* Moves the back half of the largest other run into run me; 0 if none is left. */
static int run_steal(int me, int nt) {
    for (;;) {
        int victim = -1;
        uint32_t most = 0;
        uint64_t seen = 0;
        for (int i = 0; i < nt; i++) {
            if (i == me) continue;
            const uint64_t v = atomic_load_explicit(&g_runs[i].lohi, memory_order_relaxed);
            const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
            if (hi > lo && hi - lo > most) most = hi - lo, victim = i, seen = v;
        }
        if (victim < 0) return 0;
        const uint32_t lo = (uint32_t)seen, hi = (uint32_t)(seen >> 32), mid = hi - (most + 1) / 2;
        if (atomic_compare_exchange_strong_explicit(&g_runs[victim].lohi, &seen, run_pack(lo, mid), memory_order_relaxed,
                                                    memory_order_relaxed)) {
            atomic_store_explicit(&g_runs[me].lohi, run_pack(mid, hi), memory_order_relaxed);
            return 1;
        }
    }
}

/* Most panels a thread takes at once: each take is a locked instruction
 * and a kernel call. Decode steps alternating in one process, 2 threads:
 * 4 against 1 panel, q30b8 W4A8 2.5 %, BF16 1.4 %, tiny 3.4 % faster; 16
 * against 4, W4A8 1.7-2.0 %, BF16 1.4 %; 64 no clearer. */
enum { TAKE_MOST = 16 };

/* Panels [q0, q1) of a one-token job as one GEMV call: the GEMVs take any
 * row range, row by row, so results are those of panel by panel. (The
 * GEMMs of several tokens take one panel at a time: their scratch holds
 * Q3_NR rows. Calling them with a job's share at once, where they would
 * take it, measured within 1 % in a 512-token prefill.) */
static void run_rows(const q3_mm_job *jb, int q0, int q1) {
    const int r0 = q0 * Q3_NR, r1 = q1 * Q3_NR < jb->W->rows ? q1 * Q3_NR : jb->W->rows;
    if (jb->up) run_glu(jb, NULL, r0, r1 - r0);
    else run_rows_any(jb, NULL, r0, r1 - r0);
}

/* One-token jobs only (run_rows). */
static void run_stealing(const q3_mm_job *jobs, int me, int nt) {
    int j = 0, base = 0, n;
    for (;;) {
        int p = run_take_front(&g_runs[me], TAKE_MOST, &n);
        if (p < 0) {
            if (!run_steal(me, nt)) return;
            continue;
        }
        if (p < base) j = 0, base = 0; /* a stolen run may lie behind the cursor */
        for (const int end = p + n; p < end;) {
            while (p >= base + panels_of(&jobs[j])) base += panels_of(&jobs[j]), j++;
            const int upto = base + panels_of(&jobs[j]) < end ? base + panels_of(&jobs[j]) : end;
            run_rows(&jobs[j], p - base, upto - base);
            p = upto;
        }
    }
}

static void run_pass(const q3_mm_job *jobs, int n);

/* Tokens per lane pass (a multiple of 16) for W: what the lane GEMM
 * takes, as long as the pass's packed activations fit in 1 MiB, about half
 * a core's L2 on the AVX-512 machine measured. The A8 GEMM's are 2 K bytes
 * per token (bf16), gemm_bc's 4 K (fp32), or 6 K (AMX tiles: three bf16
 * parts, for BF16 weights and weight-only MX). On AVX-512 without AMX the fp32 passes are at least two of
 * Q3_LANE_TOKENS, else Q3_LANE_TOKENS. kernel_bench (AVX-512, T = 512),
 * passes of 128 tokens against 48: K = 2048 247-288 -> 286-312 GFLOP/s,
 * but K = 4096 259-285 -> 217-220 (2 MiB of activations, out of L2), and
 * as 64-token passes 219-253. AMX BF16, 1536 x 2048 from DRAM, 2 threads:
 * one pass of 80 tokens 883, 96 819, 112 553 GFLOP/s. */
static int lane_pass_tokens(const q3_mat *W) {
    if (a8_gemm_takes(W)) { /* bf16 inputs, 2 K bytes per token */
        const int fit = (int)((1u << 20) / (2u * (unsigned)W->cols)) / 16 * 16;
        return fit < Q3_LANE_TOKENS ? Q3_LANE_TOKENS : fit < a8_most() ? fit : a8_most();
    }
    if (!kt()->bc_max_t) return Q3_LANE_TOKENS;
    const int fit = (int)((1u << 20) / bc_token_bytes(W)) / 16 * 16;
    if ((W->dtype == Q3_BF16 || W->dtype == Q3_BF16P || wo_takes(W)) && kt()->tile_parts) return fit < 16 ? 16 : fit < kt()->bc_max_t ? fit : kt()->bc_max_t;
    return fit < 2 * Q3_LANE_TOKENS ? Q3_LANE_TOKENS : fit < kt()->bc_max_t ? fit : kt()->bc_max_t;
}

/* Products of more tokens than the tokens-in-lanes GEMMs take run as
 * several passes (when every job can use one). Each job's tokens are split
 * into equal shares of at most lane_pass_tokens, rounded up to whole
 * vectors of 16: with passes of 48, an expert of 64 tokens (about what
 * each sees in a 1024-token chunk) runs as 32 + 32, not 48 + 16, so no
 * pass streams all the weights for a few tokens. Measured
 * (kernel_bench moe-prefill, P = 1024): gate+up the same, down 2-4 %
 * faster. */
static int run_lane_chunked(const q3_mm_job *jobs, int n) {
    enum { MAX_JOBS = 512 };
    int npass = 0, share[MAX_JOBS];
    if (n > MAX_JOBS || !kt()->lane_split) return 0;
    for (int j = 0; j < n; j++) {
        if (!a8_gemm_takes(jobs[j].W) && !bc_shape_ok(jobs[j].W)) return 0;
        const int lim = lane_pass_tokens(jobs[j].W), np = (jobs[j].T + lim - 1) / lim;
        share[j] = np ? ((jobs[j].T + np - 1) / np + 15) / 16 * 16 : 0; /* <= lim, a multiple of 16 */
        if (np > npass) npass = np;
    }
    if (npass <= 1) return 0;
    q3_mm_job sub[MAX_JOBS];
    for (int p = 0; p < npass; p++) {
        for (int j = 0; j < n; j++) {
            const int t0 = p * share[j], left = jobs[j].T - t0;
            sub[j] = jobs[j];
            sub[j].T = left <= 0 ? 0 : left < share[j] ? left : share[j];
            if (left > 0) sub[j].x += (size_t)t0 * jobs[j].ldx, sub[j].out += (size_t)t0 * jobs[j].ldo;
        }
        run_pass(sub, n);
    }
    return 1;
}

static _Thread_local q3_matmul_stats g_stats;
static _Thread_local q3_mm_part g_part;

void q3_matmul_stats_reset(void) { g_stats = (q3_matmul_stats){0}; }
q3_matmul_stats q3_matmul_stats_get(void) { return g_stats; }
void q3_matmul_part(q3_mm_part part) { g_part = part >= 0 && part < Q3_MM_PARTS ? part : Q3_MM_OTHER; }

const char *q3_mm_part_name(q3_mm_part part) {
    static const char *const names[Q3_MM_PARTS] = {"other", "attention", "mlp", "router", "experts", "lm_head"};
    return part >= 0 && part < Q3_MM_PARTS ? names[part] : "other";
}

void q3_matmul_stats_add(q3_matmul_stats *acc, const q3_matmul_stats *st) {
    acc->seconds += st->seconds, acc->flops += st->flops;
    for (int p = 0; p < Q3_MM_PARTS; p++) {
        acc->part_seconds[p] += st->part_seconds[p], acc->part_bytes[p] += st->part_bytes[p];
        acc->part_flops[p] += st->part_flops[p];
    }
}

void q3_matmul_jobs(const q3_mm_job *jobs, int n) {
    q3_kernels_init();
    const double t0 = omp_get_wtime();
    if (!run_lane_chunked(jobs, n)) run_pass(jobs, n);
    const double dt = omp_get_wtime() - t0;
    g_stats.seconds += dt;
    g_stats.part_seconds[g_part] += dt;
    for (int j = 0; j < n; j++) {
        const int nm = jobs[j].up ? 2 : 1; /* a merged gate/up job is two products */
        const double flops = 2.0 * nm * jobs[j].T * jobs[j].W->rows * jobs[j].W->cols;
        g_stats.flops += flops, g_stats.part_flops[g_part] += flops;
        if (jobs[j].T > 0) g_stats.part_bytes[g_part] += (double)nm * q3_mat_bytes(jobs[j].W);
    }
}

/* The packed inputs of the current pass (pack_tile), shared by its
 * threads: grown to the largest pass seen and kept (prefill only: one
 * token never takes the panel GEMM). At most a prefill chunk's rows times
 * the longest reduction of a linear layer: 16 MiB for 1024 tokens of
 * Qwen3-30B-A3B's o_proj (K = 4096). */
static float *g_tiles;
static size_t g_tiles_cap;

/* Tiles [t0, t1) of the pass's flattened list (job by job, first[j] the
 * first tile of job j, first[n] the count). */
static void pack_tiles(const q3_mm_job *jobs, float *const *tiles, const int *first, int t0, int t1) {
    const int mr = kt()->mr;
    for (int i = t0, j = 0; i < t1; i++) {
        while (i >= first[j + 1]) j++;
        pack_tile(tiles[j], &jobs[j], mr, (i - first[j]) * mr);
    }
}

enum { MAX_PACKED_JOBS = 512 };

/* Lays out a pass's packed inputs in g_tiles: tiles[j] for job j (NULL:
 * not packed), first[j] its first tile in the flattened list. Returns the
 * tile count (0 for passes of more than MAX_PACKED_JOBS jobs: none packed). */
static int plan_tiles(const q3_mm_job *jobs, int n, float **tiles, int *first) {
    const int mr = kt()->mr;
    first[0] = 0;
    if (n > MAX_PACKED_JOBS) return 0;
    size_t need = 0;
    for (int j = 0; j < n; j++) {
        const int tj = takes_panel_gemm(&jobs[j]) ? (jobs[j].T + mr - 1) / mr : 0;
        first[j + 1] = first[j] + tj;
        need += (size_t)tj * mr * jobs[j].W->cols;
    }
    if (need > g_tiles_cap) {
        free(g_tiles);
        g_tiles = q3_malloc(need * sizeof *g_tiles);
        g_tiles_cap = need;
    }
    size_t off = 0;
    for (int j = 0; j < n; j++) {
        tiles[j] = first[j + 1] > first[j] ? g_tiles + off : NULL;
        off += (size_t)(first[j + 1] - first[j]) * mr * jobs[j].W->cols;
    }
    return first[n];
}

static void run_pass(const q3_mm_job *jobs, int n) {
    g_pass++;
    double total = 0;
    int npanels = 0, several = 0;
    for (int j = 0; j < n; j++) {
        several |= jobs[j].T > 1;
        if (jobs[j].T > 0) total += (double)jobs[j].W->rows * jobs[j].W->cols * (jobs[j].T + 1) * (jobs[j].up ? 2 : 1);
        npanels += panels_of(&jobs[j]);
    }
    if (npanels == 0) return;
    float *tiles_of[MAX_PACKED_JOBS];
    int first[MAX_PACKED_JOBS + 1];
    const int ntiles = plan_tiles(jobs, n, tiles_of, first);
    float *const *tiles = n <= MAX_PACKED_JOBS ? tiles_of : NULL;
    /* Small products are not worth waking the other threads for. */
    const int nt = omp_get_max_threads();
    atomic_int next = 0;
    if (total < 65536.0 || nt == 1) {
        pack_tiles(jobs, tiles, first, 0, ntiles);
        run_chunks(jobs, tiles, npanels, npanels, 0, &next);
        return;
    }
    /* Passes of several tokens take chunks of at most a 2 nt-th of the
     * panels left, so the threads finish together (fixed chunks of an
     * eighth of a thread's share left one waiting up to a chunk at the
     * end). q30b8 BF16 prefill 512, three pairs: matmuls 68.5 / 68.9 /
     * 67.9 -> 70.5 / 69.3 / 71.1 % of the FMA peak. The runs decode
     * takes (run_stealing) measured 1-3 % slower there (W4A8 and BF16
     * prefill 128 and 512, both in one process). */
    const int chunk = npanels / (8 * nt) > 1 ? npanels / (8 * nt) : 1, guided = several ? 2 * nt : 0;
    const int steal = !several && nt <= MAX_RUNS;
    /* (set before the threads start; a run whose thread does not come is taken by the others) */
    if (steal)
        for (int i = 0; i < nt; i++)
            atomic_store_explicit(&g_runs[i].lohi,
                                  run_pack((uint32_t)((long)npanels * i / nt), (uint32_t)((long)npanels * (i + 1) / nt)),
                                  memory_order_relaxed);
#pragma omp parallel
    {
        if (ntiles) { /* the threads pack the tiles between them, then all wait for them */
            const int me = omp_get_thread_num(), all = omp_get_num_threads();
            pack_tiles(jobs, tiles, first, (int)((long)ntiles * me / all), (int)((long)ntiles * (me + 1) / all));
#pragma omp barrier
        }
        if (steal) run_stealing(jobs, omp_get_thread_num(), nt);
        else run_chunks(jobs, tiles, npanels, chunk, guided, &next);
    }
}

void q3_matmul(float *out, const float *x, int T, const q3_mat *W) {
    q3_mm_job jb = {out, (size_t)W->rows, x, (size_t)W->cols, T, W, NULL};
    q3_matmul_jobs(&jb, 1);
}
