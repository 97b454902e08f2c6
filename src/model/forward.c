/* Qwen3-MoE forward pass, top to bottom: embed; per layer attention
 * (q/k/v projections, per-head q/k RMSNorm, RoPE, causal GQA attention over
 * the KV cache, o_proj) and MLP (dense SwiGLU or routed experts) with
 * residuals; final norm; lm_head. On one rank of a multi-rank job
 * (m->shard, model/shard.h) the same pass runs on the rank's heads, columns,
 * experts and vocab rows, with the collectives that complete each sum. */
#include "model/forward.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/scratch.h"
#include "model/moe.h"
#include "model/shard.h"
#include "parallel/comm.h"
#include "quant/mx.h"
#include "util/error.h"

/* Aligned: calloc's large blocks start 16 bytes into a page, so every
 * 64-byte vector load or store of an activation row straddled two lines. */
#define FALLOC(n) ((float *)q3_calloc_aligned((size_t)(n), sizeof(float)))

/* Heads and columns this rank holds (everything without a shard). */
static int local_heads(const q3_model *m) { return m->shard ? m->shard->nq : m->cfg.num_heads; }
static int local_kv_heads(const q3_model *m) { return m->shard ? m->shard->nkv : m->cfg.num_kv_heads; }
static int local_dense_f(const q3_model *m) { return m->shard ? m->shard->dense_f : m->cfg.intermediate_size; }
static int local_moe_f(const q3_model *m) {
    return !m->cfg.is_moe ? 0 : m->shard ? m->shard->moe_f : m->cfg.moe_intermediate_size;
}

/* Ranks a prefill chunk's tokens are split over (1: no SP prefill). */
static int sp_ranks(const q3_model *m) {
    return m->shard && m->shard->wo_full ? m->shard->plan.attn_tp_size : 1;
}

/* MXFP8 wire scratch for the largest payload a chunk of `rows` (padded)
 * tokens sends; see the q3_comm_*_rows calls below and in moe.c. */
static size_t wire_bytes(const q3_model *m, int rows) {
    const q3_config *c = &m->cfg;
    const q3_plan *p = &m->shard->plan;
    const size_t H = (size_t)c->hidden_size, QD = (size_t)local_heads(m) * (size_t)c->head_dim;
    const size_t K = c->is_moe ? (size_t)c->num_experts_per_tok : 0, R = (size_t)rows;
    size_t w = 0;
    const int A = sp_ranks(m);
    if (A > 1) {
        const size_t sl = R / (size_t)A;
        size_t x = ((size_t)A + 1) * sl * q3_comm_wire_row_bytes(H, H);          /* hidden allgather */
        size_t y = 2 * R * q3_comm_wire_row_bytes(QD, QD);                       /* attention alltoall */
        size_t z = ((size_t)A + 1) * sl * q3_comm_wire_row_bytes(H + 2 * K, H);  /* MoE allgather */
        w = x > y ? x : y;
        w = w > z ? w : z;
    }
    if (p->ep_comm == Q3_EP_COMM_ALLTOALL && p->moe_ep_size > 1) {   /* dispatch: own pairs out, pairs in */
        size_t d = 2 * R * K * q3_comm_wire_row_bytes(H, H);
        w = w > d ? w : d;
    }
    return w ? w : 1;
}

int q3_state_init(q3_state *s, const q3_model *m, int ctx, int max_batch) {
    const q3_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    if (ctx <= 0) ctx = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (ctx > c->max_position_embeddings)
        return q3_err("--ctx %d exceeds the model's max_position_embeddings (%d)", ctx, c->max_position_embeddings);
    /* Long chunks let each expert see many tokens, amortising its weight reads. */
    if (max_batch <= 0) max_batch = 1024;
    if (max_batch > ctx) max_batch = ctx;
    s->ctx = ctx;
    s->max_batch = max_batch;
    s->n_threads = omp_get_max_threads();
    /* SP prefill pads a chunk to a multiple of attn_tp_size tokens. */
    const int sp_p = sp_ranks(m), rows = sp_p > 1 ? (max_batch + sp_p - 1) / sp_p * sp_p : max_batch;
    const int H = c->hidden_size, D = c->head_dim, KVD = local_kv_heads(m) * D, QD = local_heads(m) * D;
    size_t kv = (size_t)c->num_layers * ctx * KVD;
    s->k_cache = FALLOC(kv);
    s->v_cache = FALLOC(kv);
    s->rope_cos = FALLOC((size_t)ctx * D / 2);
    s->rope_sin = FALLOC((size_t)ctx * D / 2);
    /* Angles in double: pos * theta^(-2i/D), then rounded once to fp32. */
    for (int p = 0; p < ctx; p++)
        for (int i = 0; i < D / 2; i++) {
            double a = p * pow((double)c->rope_theta, -2.0 * i / D);
            s->rope_cos[(size_t)p * D / 2 + i] = (float)cos(a);
            s->rope_sin[(size_t)p * D / 2 + i] = (float)sin(a);
        }
    s->x = FALLOC((size_t)rows * H);
    s->xn = FALLOC((size_t)rows * H);
    s->proj = FALLOC((size_t)rows * H);
    s->q = FALLOC((size_t)rows * QD);
    s->att = FALLOC((size_t)rows * QD);
    s->k = FALLOC((size_t)rows * KVD);
    s->v = FALLOC((size_t)rows * KVD);
    s->scores = FALLOC(q3_attention_scratch(local_heads(m), D, ctx));
    if (c->intermediate_size > 0) s->ffn_gate = FALLOC((size_t)rows * local_dense_f(m));
    if (m->shard && m->shard->vocab_n < c->vocab_size) {
        s->lm_rows = max_batch < Q3_LM_ROWS ? max_batch : Q3_LM_ROWS;
        s->lm_local = FALLOC((size_t)s->lm_rows * m->shard->vocab_n);
        s->lm_gather = FALLOC((size_t)s->lm_rows * c->vocab_size);
    }
    if (c->is_moe) {
        const int E = c->num_experts, K = c->num_experts_per_tok;
        const int F = local_moe_f(m);
        size_t pairs = (size_t)rows * K;
        s->router = FALLOC((size_t)rows * E);
        s->topk_id = q3_calloc(pairs, sizeof(int32_t));
        s->topk_w = FALLOC(pairs);
        s->expert_count = q3_calloc((size_t)E + 1, sizeof(int32_t));
        s->expert_offset = q3_calloc((size_t)E + 1, sizeof(int32_t));
        s->perm = q3_calloc(pairs, sizeof(int32_t));
        s->perm_inv = q3_calloc(pairs, sizeof(int32_t));
        s->xg = FALLOC(pairs * H);
        s->h_out = FALLOC(pairs * H);
        s->h_gate = FALLOC(pairs * F);
        s->moe_jobs = q3_calloc((size_t)E, sizeof(q3_mm_job));
        if (m->shard && m->shard->plan.ep_comm == Q3_EP_COMM_ALLTOALL && m->shard->plan.moe_ep_size > 1) {
            const int EP = m->shard->plan.moe_ep_size;
            size_t a = pairs * (size_t)H, b = ((size_t)rows + (size_t)EP) * H;
            s->a2a_send = FALLOC(a > b ? a : b);
            s->a2a_recv = FALLOC(a > b ? a : b);
            s->a2a_pos = q3_calloc(pairs, sizeof(int32_t));
            s->a2a_counts = q3_calloc(4 * (size_t)EP, sizeof(size_t));
            s->a2a_ecount = q3_calloc(2 * (size_t)E, sizeof(int32_t));
        }
    }
    if (sp_p > 1) {
        const int K = c->is_moe ? c->num_experts_per_tok : 0;
        s->sp_rows = rows / sp_p;
        s->sp_att = FALLOC((size_t)s->sp_rows * c->num_heads * D);
        s->sp_out = FALLOC((size_t)s->sp_rows * H);
        if (c->is_moe) s->sp_moe = FALLOC((size_t)rows * (H + 2 * K));
    }
    if (m->shard && m->shard->plan.comm_quant == Q3_COMM_QUANT_MXFP8) s->comm_wire = q3_malloc(wire_bytes(m, rows));
    /* Every thread's merged gate/up rows of one token, made now: a decode
     * step would make them in a thread's first take of such rows, or in a
     * take longer than any before (the threads' takes vary with how
     * stealing goes; test_static_decode saw 2 allocations under load). */
    const int glu_rows = local_moe_f(m) > local_dense_f(m) ? local_moe_f(m) : local_dense_f(m);
    q3_scratch_reserve(Q3_SCR_GLU, 2 * (size_t)glu_rows * sizeof(float));
    return 0;
}

void q3_state_free(q3_state *s) {
    float *f[] = {s->k_cache, s->v_cache, s->rope_cos, s->rope_sin, s->x, s->xn, s->proj, s->q, s->att, s->k, s->v,
                  s->scores, s->ffn_gate, s->router, s->topk_w, s->xg, s->h_out, s->h_gate,
                  s->lm_local, s->lm_gather, s->a2a_send, s->a2a_recv, s->sp_att, s->sp_moe, s->sp_out};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) q3_free_aligned(f[i]);
    free(s->topk_id);
    free(s->expert_count);
    free(s->expert_offset);
    free(s->perm);
    free(s->perm_inv);
    free(s->moe_jobs);
    free(s->a2a_pos);
    free(s->a2a_counts);
    free(s->a2a_ecount);
    free(s->comm_wire);
    memset(s, 0, sizeof *s);
}

void q3_state_reset(q3_state *s) { s->pos = 0; }

void q3_state_truncate(q3_state *s, int pos) {
    if (pos >= 0 && pos < s->pos) s->pos = pos;
}

/* The format an A8 linear's input is quantized to. */
static q3_dtype act_of(const q3_mat *W) { return W->ai8 ? Q3_MXINT8 : Q3_MXFP8; }

void q3_add_rows(float *x, const float *d, int rows, int n) {
#pragma omp parallel for schedule(static) if (rows >= Q3_PAR_ROWS)
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) x[(size_t)r * n + i] += d[(size_t)r * n + i];
}

/* A8: the input rows of an MX linear are quantized to MXFP8 or MXINT8 in
 * place (the dequantized values, so the fp32 kernels then compute exactly
 * the MXFP8/MXINT8 x MX products). A row holding NaN/Inf is left as it is. */
void q3_act_quant(const q3_model *m, const q3_mat *W, float *x, int rows, size_t ld) {
    (void)m;
    if (!W->a8) return;
    const q3_dtype act = act_of(W);
#pragma omp parallel for schedule(static) if (rows >= Q3_PAR_ROWS)
    for (int r = 0; r < rows; r++) (void)q3_act_mx(act, x + (size_t)r * ld, (size_t)W->cols, x + (size_t)r * ld);
}

/* This rank's heads over the T normed rows in s->xn: merged QKV, per-head
 * q/k norm and RoPE, K/V into the cache at [pos0, pos0 + T), causal
 * attention into s->att (T rows of local_heads * head_dim). */
/* xn_a8: the caller's norm already left xn as the A8 input of q/k/v. */
static void attention_heads(const q3_model *m, q3_state *s, int l, int pos0, int T, int xn_a8) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const int H = c->hidden_size, D = c->head_dim, NQ = local_heads(m), NKV = local_kv_heads(m);
    const int KVD = NKV * D, QD = NQ * D;
    if (!xn_a8) q3_act_quant(m, &L->wq, s->xn, T, (size_t)H);
    /* Merged QKV: one parallel pass over the rows of all three projections. */
    const q3_mm_job qkv[3] = {{s->q, (size_t)QD, s->xn, (size_t)H, T, &L->wq, NULL},
                              {s->k, (size_t)KVD, s->xn, (size_t)H, T, &L->wk, NULL},
                              {s->v, (size_t)KVD, s->xn, (size_t)H, T, &L->wv, NULL}};
    q3_matmul_part(Q3_MM_ATTN);
    q3_matmul_jobs(qkv, 3);
#pragma omp parallel for schedule(static) if (T >= Q3_PAR_ROWS)
    for (int t = 0; t < T; t++) {
        const float *cs = s->rope_cos + (size_t)(pos0 + t) * D / 2, *sn = s->rope_sin + (size_t)(pos0 + t) * D / 2;
        for (int h = 0; h < NQ; h++) {
            float *q = s->q + (size_t)t * QD + (size_t)h * D;
            q3_rmsnorm(q, q, L->q_norm, D, c->rms_norm_eps);
            q3_rope(q, cs, sn, D);
        }
        for (int h = 0; h < NKV; h++) {
            float *k = s->k + (size_t)t * KVD + (size_t)h * D;
            q3_rmsnorm(k, k, L->k_norm, D, c->rms_norm_eps);
            q3_rope(k, cs, sn, D);
        }
        for (int h = 0; h < NKV; h++) {
            const size_t slot = (((size_t)l * NKV + h) * s->ctx + pos0 + t) * D;
            memcpy(s->k_cache + slot, s->k + (size_t)t * KVD + (size_t)h * D, (size_t)D * sizeof(float));
            memcpy(s->v_cache + slot, s->v + (size_t)t * KVD + (size_t)h * D, (size_t)D * sizeof(float));
        }
    }
    const q3_attn_layer al = {NQ, NKV, D, (size_t)D, (size_t)s->ctx * D, s->k_cache + (size_t)l * s->ctx * KVD,
                              s->v_cache + (size_t)l * s->ctx * KVD};
    q3_attention(s->att, s->q, T, pos0, &al, s->scores);
}

static void attention_block(const q3_model *m, q3_state *s, int l, int pos0, int T) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const int H = c->hidden_size, QD = local_heads(m) * c->head_dim;
    /* RMSNorm + (A8) MX quantization in one pass: q/k/v only need the quantized rows. */
#pragma omp parallel for schedule(static) if (T >= Q3_PAR_ROWS)
    for (int t = 0; t < T; t++) {
        float *xn = s->xn + (size_t)t * H, *x = s->x + (size_t)t * H;
        if (L->wq.a8) q3_add_rmsnorm_mx(x, NULL, L->attn_norm, NULL, xn, H, c->rms_norm_eps, act_of(&L->wq));
        else q3_rmsnorm(xn, x, L->attn_norm, H, c->rms_norm_eps);
    }
    attention_heads(m, s, l, pos0, T, L->wq.a8);
    q3_act_quant(m, &L->wo, s->att, T, (size_t)QD);
    q3_matmul_part(Q3_MM_ATTN);
    q3_matmul(s->proj, s->att, T, &L->wo); /* added to x by mlp_block's fused add + norm */
    /* Attention TP: each rank's o_proj saw only its heads' columns; the
     * partial products sum to the full projection. */
    if (m->shard) q3_shard_allreduce(m->shard->g.attn_tp, s->proj, (size_t)T * H);
}

/* This rank's columns of the dense MLP over the T normed rows in s->xn,
 * into s->proj (a partial sum when the columns are split). */
static void dense_mlp_rows(const q3_model *m, const q3_layer *L, q3_state *s, int T) {
    const q3_config *c = &m->cfg;
    const int H = c->hidden_size, F = local_dense_f(m);
    q3_act_quant(m, &L->ffn_gate, s->xn, T, (size_t)H);
    const q3_mm_job w13 = {s->ffn_gate, (size_t)F, s->xn, (size_t)H, T, &L->ffn_gate, &L->ffn_up}; /* SwiGLU merged in */
    q3_matmul_part(Q3_MM_MLP);
    q3_matmul_jobs(&w13, 1);
    q3_act_quant(m, &L->ffn_down, s->ffn_gate, T, (size_t)F);
    q3_matmul(s->proj, s->ffn_gate, T, &L->ffn_down);
}

static void dense_mlp(const q3_model *m, const q3_layer *L, q3_state *s, int T) {
    const int H = m->cfg.hidden_size;
    dense_mlp_rows(m, L, s, T);
    /* Dense MLP split over the attn_tp group: rows of gate/up, columns of down. */
    if (m->shard) q3_shard_allreduce(m->shard->g.attn_tp, s->proj, (size_t)T * H);
    q3_add_rows(s->x, s->proj, T, H);
}

static void mlp_block(const q3_model *m, q3_state *s, int l, int T) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const int H = c->hidden_size;
    /* A8 experts: the add + norm also writes each token's MX copy, into
     * proj (consumed by the add in the same pass), for the experts; the
     * router reads the fp32 rows in xn. */
    const int a8 = L->sparse && L->gate[0].a8 && !(m->shard && s->a2a_send);
#pragma omp parallel for schedule(static) if (T >= Q3_PAR_ROWS)
    for (int t = 0; t < T; t++) {
        float *x = s->x + (size_t)t * H, *d = s->proj + (size_t)t * H, *xn = s->xn + (size_t)t * H;
        if (a8) q3_add_rmsnorm_mx(x, d, L->mlp_norm, xn, d, H, c->rms_norm_eps, act_of(&L->gate[0]));
        else q3_add_rmsnorm(x, d, L->mlp_norm, xn, H, c->rms_norm_eps);
    }
    s->xq_in_proj = a8;
    if (L->sparse) q3_moe_forward(m, L, s, T, l);
    else dense_mlp(m, L, s, T);
    s->xq_in_proj = 0;
}

/* ------------------------------------------------------------ SP prefill
 *
 * Sequence-parallel prefill (plan.sp_prefill: the attn_tp group is the
 * moe_ep group). A chunk of T tokens is padded to P sl rows (P =
 * attn_tp_size, sl = ceil(T / P)); rank a owns rows [a sl, (a + 1) sl), the
 * real ones being those below T. Buffers keep the chunk's row numbering, so
 * a rank's own rows of the residual stream s->x sit at a sl. Per layer:
 *   attention  norm the own rows, allgather them (MXFP8 with comm_quant),
 *              this rank's heads over all T rows with K/V written to the
 *              cache exactly as decode's attention TP reads it, alltoall of
 *              the attention output (MXFP8 with comm_quant) so that each
 *              rank holds all heads of its own rows, o_proj with the whole
 *              (replicated) weight on those rows;
 *   MoE        EP over the same group on the own rows (moe.c);
 *   dense MLP  allgather the normed rows, this rank's columns over all T
 *              rows, reduce-scatter (fp32) back to the own rows.
 * At the end the rows lm_head needs reach every rank in fp32: the last one
 * by a broadcast from its owner, all of them by an allgather. Padding rows
 * are zeros; they never enter the cache or the experts. */

static size_t comm_mx_cols(const q3_model *m, int n) {
    return m->shard->plan.comm_quant == Q3_COMM_QUANT_MXFP8 ? (size_t)n : 0;
}

static void sp_attention(const q3_model *m, q3_state *s, int l, int pos0, int T) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const q3_shard *sh = m->shard;
    const int H = c->hidden_size, QD = local_heads(m) * c->head_dim, QDF = c->num_heads * c->head_dim;
    const int P = sh->plan.attn_tp_size, sl = (T + P - 1) / P, lo = sh->a.attn_rank * sl;
    const int nr = T - lo < 0 ? 0 : T - lo < sl ? T - lo : sl;
    for (int t = lo; t < lo + nr; t++)
        q3_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, L->attn_norm, H, c->rms_norm_eps);
    memset(s->xn + (size_t)(lo + nr) * H, 0, (size_t)(sl - nr) * H * sizeof(float));
    q3_comm_allgather_rows(sh->g.attn_tp, s->xn + (size_t)lo * H, (size_t)sl, (size_t)H, comm_mx_cols(m, H), s->xn,
                           s->comm_wire);
    attention_heads(m, s, l, pos0, T, 0);
    memset(s->att + (size_t)T * QD, 0, (size_t)(P * sl - T) * QD * sizeof(float));
    /* s->q is free again: block i receives rank i's heads of my rows. */
    q3_comm_alltoall_rows(sh->g.attn_tp, s->att, s->q, (size_t)sl, (size_t)QD, comm_mx_cols(m, QD), s->comm_wire);
    for (int i = 0; i < P; i++)   /* rank i holds query heads [i Q/P, (i+1) Q/P): columns i QD of the row */
        for (int t = 0; t < nr; t++)
            memcpy(s->sp_att + (size_t)t * QDF + (size_t)i * QD, s->q + ((size_t)i * sl + t) * QD, (size_t)QD * sizeof(float));
    if (!nr) return;
    const q3_mat *wo = &sh->wo_full[l];
    q3_act_quant(m, wo, s->sp_att, nr, (size_t)QDF);
    q3_matmul_part(Q3_MM_ATTN);
    q3_matmul(s->proj + (size_t)lo * H, s->sp_att, nr, wo);
}

static void sp_mlp(const q3_model *m, q3_state *s, int l, int T) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const q3_shard *sh = m->shard;
    const int H = c->hidden_size, P = sh->plan.attn_tp_size, sl = (T + P - 1) / P, lo = sh->a.attn_rank * sl;
    const int nr = T - lo < 0 ? 0 : T - lo < sl ? T - lo : sl;
    for (int t = lo; t < lo + nr; t++)
        q3_add_rmsnorm(s->x + (size_t)t * H, s->proj + (size_t)t * H, L->mlp_norm, s->xn + (size_t)t * H, H, c->rms_norm_eps);
    if (L->sparse) {
        q3_moe_forward_sp(m, L, s, T, l);
        return;
    }
    memset(s->xn + (size_t)(lo + nr) * H, 0, (size_t)(sl - nr) * H * sizeof(float));
    q3_comm_allgather_rows(sh->g.attn_tp, s->xn + (size_t)lo * H, (size_t)sl, (size_t)H, comm_mx_cols(m, H), s->xn,
                           s->comm_wire);
    dense_mlp_rows(m, L, s, T);
    memset(s->proj + (size_t)T * H, 0, (size_t)(P * sl - T) * H * sizeof(float));
    q3_comm_reduce_scatter_sum(sh->g.attn_tp, s->proj, s->sp_out, (size_t)sl * H);
    q3_add_rows(s->x + (size_t)lo * H, s->sp_out, nr, H);
}

/* The layers of one SP chunk; then rows [need, T) of s->x hold the final
 * hidden states on every rank (need == T: none). */
static void sp_layers(const q3_model *m, q3_state *s, const int32_t *ids, int T, int need) {
    const q3_config *c = &m->cfg;
    const q3_shard *sh = m->shard;
    const int H = c->hidden_size, P = sh->plan.attn_tp_size, sl = (T + P - 1) / P, lo = sh->a.attn_rank * sl;
    const int nr = T - lo < 0 ? 0 : T - lo < sl ? T - lo : sl;
    for (int t = lo; t < lo + nr; t++) q3_to_f32(s->x + (size_t)t * H, m->embed.data, m->embed.dtype, (size_t)ids[t] * H, H);
    memset(s->x + (size_t)(lo + nr) * H, 0, (size_t)(sl - nr) * H * sizeof(float));
    if (s->layer_hook) s->layer_hook(s->layer_hook_ctx, -1, T);
    for (int l = 0; l < c->num_layers; l++) {
        sp_attention(m, s, l, s->pos, T);
        sp_mlp(m, s, l, T);
        if (s->layer_hook) s->layer_hook(s->layer_hook_ctx, l, T);
    }
    if (need == T - 1) q3_comm_broadcast(sh->g.attn_tp, s->x + (size_t)(T - 1) * H, (size_t)H, (T - 1) / sl);
    else if (need < T) q3_comm_allgather(sh->g.attn_tp, s->x + (size_t)lo * H, (size_t)sl * H, s->x);
}

/* One chunk of at most max_batch tokens. */
static void forward_chunk(const q3_model *m, q3_state *s, const int32_t *ids, int T, float *logits, int all_rows) {
    const q3_config *c = &m->cfg;
    const int H = c->hidden_size, pos0 = s->pos;
    if (s->sp_rows && T > 1) {
        sp_layers(m, s, ids, T, !logits ? T : all_rows ? 0 : T - 1);
    } else {
#pragma omp parallel for schedule(static) if (T >= Q3_PAR_ROWS)
        for (int t = 0; t < T; t++) q3_to_f32(s->x + (size_t)t * H, m->embed.data, m->embed.dtype, (size_t)ids[t] * H, H);
        if (s->layer_hook) s->layer_hook(s->layer_hook_ctx, -1, T);
        for (int l = 0; l < c->num_layers; l++) {
            attention_block(m, s, l, pos0, T);
            mlp_block(m, s, l, T);
            if (s->layer_hook) s->layer_hook(s->layer_hook_ctx, l, T);
        }
    }
    s->pos += T;
    if (!logits) return;
    /* Only the rows somebody asked for go through the final norm and lm_head. */
    int first = all_rows ? 0 : T - 1;
    for (int t = first; t < T; t++) q3_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, m->final_norm, H, c->rms_norm_eps);
    q3_act_quant(m, &m->lm_head, s->xn + (size_t)first * H, T - first, (size_t)H); /* an MX lm_head under A8 */
    if (!s->lm_local) {
        q3_matmul_part(Q3_MM_LM_HEAD);
        q3_matmul(logits, s->xn + (size_t)first * H, T - first, &m->lm_head);
        return;
    }
    /* lm_head TP: this rank's vocab rows for up to lm_rows tokens at a time,
     * then an allgather over the lmhead group: block l of the result holds
     * rank l's rows x its slice, transposed here into whole rows. */
    const int V = c->vocab_size, Vl = m->shard->vocab_n, Lg = V / Vl;
    for (int t0 = first; t0 < T; t0 += s->lm_rows) {
        const int R = T - t0 < s->lm_rows ? T - t0 : s->lm_rows;
        float *out = logits + (size_t)(t0 - first) * V;
        q3_matmul_part(Q3_MM_LM_HEAD);
        q3_matmul(s->lm_local, s->xn + (size_t)t0 * H, R, &m->lm_head);
        if (R == 1 && s->lm_local_only && !all_rows) continue; /* the caller samples from the slice */
        if (R == 1) {
            q3_comm_allgather(m->shard->g.lmhead, s->lm_local, (size_t)Vl, out);
            continue;
        }
        q3_comm_allgather(m->shard->g.lmhead, s->lm_local, (size_t)R * Vl, s->lm_gather);
        for (int l = 0; l < Lg; l++)
            for (int r = 0; r < R; r++)
                memcpy(out + (size_t)r * V + (size_t)l * Vl, s->lm_gather + ((size_t)l * R + r) * Vl, (size_t)Vl * sizeof(float));
    }
}

int q3_forward(const q3_model *m, q3_state *s, const int32_t *ids, int n, float *logits, int all_rows) {
    const q3_config *c = &m->cfg;
    if (n <= 0) return q3_err("nothing to evaluate (0 tokens)");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return q3_err("token id %d at position %d is out of range: vocab_size is %d", ids[i], s->pos + i, c->vocab_size);
    if (s->pos + n > s->ctx)
        return q3_err("context full: %d tokens in the cache + %d new exceed the context size %d (raise --ctx)", s->pos, n,
                      s->ctx);
    for (int done = 0; done < n;) {
        int T = n - done < s->max_batch ? n - done : s->max_batch;
        int last = done + T == n;
        float *out = NULL;
        if (logits && all_rows) out = logits + (size_t)done * c->vocab_size;
        else if (logits && last) out = logits;
        if (m->shard) (void)q3_comm_set_phase(T > 1 ? "prefill" : "decode");
        forward_chunk(m, s, ids + done, T, out, all_rows);
        done += T;
    }
    return 0;
}
