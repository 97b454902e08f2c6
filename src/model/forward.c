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
#include "model/moe.h"
#include "model/shard.h"
#include "parallel/comm.h"
#include "quant/mx.h"
#include "util/error.h"

#define FALLOC(n) ((float *)q3_calloc((size_t)(n), sizeof(float)))

/* Heads and columns this rank holds (everything without a shard). */
static int local_heads(const q3_model *m) { return m->shard ? m->shard->nq : m->cfg.num_heads; }
static int local_kv_heads(const q3_model *m) { return m->shard ? m->shard->nkv : m->cfg.num_kv_heads; }
static int local_dense_f(const q3_model *m) { return m->shard ? m->shard->dense_f : m->cfg.intermediate_size; }

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
    s->x = FALLOC((size_t)max_batch * H);
    s->xn = FALLOC((size_t)max_batch * H);
    s->proj = FALLOC((size_t)max_batch * H);
    s->q = FALLOC((size_t)max_batch * QD);
    s->att = FALLOC((size_t)max_batch * QD);
    s->k = FALLOC((size_t)max_batch * KVD);
    s->v = FALLOC((size_t)max_batch * KVD);
    s->scores = FALLOC(q3_attention_scratch(local_heads(m), D, ctx));
    if (c->intermediate_size > 0) {
        s->ffn_gate = FALLOC((size_t)max_batch * local_dense_f(m));
        s->ffn_up = FALLOC((size_t)max_batch * local_dense_f(m));
    }
    if (m->shard && m->shard->vocab_n < c->vocab_size) {
        s->lm_rows = max_batch < Q3_LM_ROWS ? max_batch : Q3_LM_ROWS;
        s->lm_local = FALLOC((size_t)s->lm_rows * m->shard->vocab_n);
        s->lm_gather = FALLOC((size_t)s->lm_rows * c->vocab_size);
    }
    if (c->is_moe) {
        const int E = c->num_experts, K = c->num_experts_per_tok;
        const int F = m->shard ? m->shard->moe_f : c->moe_intermediate_size;
        size_t pairs = (size_t)max_batch * K;
        s->router = FALLOC((size_t)max_batch * E);
        s->topk_id = q3_calloc(pairs, sizeof(int32_t));
        s->topk_w = FALLOC(pairs);
        s->expert_count = q3_calloc((size_t)E + 1, sizeof(int32_t));
        s->expert_offset = q3_calloc((size_t)E + 1, sizeof(int32_t));
        s->perm = q3_calloc(pairs, sizeof(int32_t));
        s->perm_inv = q3_calloc(pairs, sizeof(int32_t));
        s->xg = FALLOC(pairs * H);
        s->h_out = FALLOC(pairs * H);
        s->h_gate = FALLOC(pairs * F);
        s->h_up = FALLOC(pairs * F);
        s->moe_jobs = q3_calloc(2 * (size_t)E, sizeof(q3_mm_job));
        if (m->shard && m->shard->plan.ep_comm == Q3_EP_COMM_ALLTOALL && m->shard->plan.moe_ep_size > 1) {
            const int EP = m->shard->plan.moe_ep_size;
            size_t a = pairs * (size_t)(H + 1), b = ((size_t)max_batch + (size_t)EP) * H;
            s->a2a_send = FALLOC(a > b ? a : b);
            s->a2a_recv = FALLOC(a > b ? a : b);
            s->a2a_pos = q3_calloc(pairs, sizeof(int32_t));
            s->a2a_expert = q3_calloc(pairs, sizeof(int32_t));
            s->a2a_counts = q3_calloc(4 * (size_t)EP, sizeof(size_t));
        }
    }
    return 0;
}

void q3_state_free(q3_state *s) {
    float *f[] = {s->k_cache, s->v_cache, s->rope_cos, s->rope_sin, s->x, s->xn, s->proj, s->q, s->att, s->k, s->v,
                  s->scores, s->ffn_gate, s->ffn_up, s->router, s->topk_w, s->xg, s->h_out, s->h_gate, s->h_up,
                  s->lm_local, s->lm_gather, s->a2a_send, s->a2a_recv};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(s->topk_id);
    free(s->expert_count);
    free(s->expert_offset);
    free(s->perm);
    free(s->perm_inv);
    free(s->moe_jobs);
    free(s->a2a_pos);
    free(s->a2a_expert);
    free(s->a2a_counts);
    memset(s, 0, sizeof *s);
}

void q3_state_reset(q3_state *s) { s->pos = 0; }

/* A8: the input rows of an MX linear are quantized to MXFP8 in place (the
 * dequantized values, so the fp32 kernels then compute exactly the
 * MXFP8 x MX products). A row holding NaN/Inf is left as it is. */
void q3_act_quant(const q3_model *m, const q3_mat *W, float *x, int rows, size_t ld) {
    if (!m->scheme.act_mxfp8 || !q3_dtype_is_mx(W->dtype)) return;
    for (int r = 0; r < rows; r++) (void)q3_mx_fake_quant_row(Q3_MXFP8, x + (size_t)r * ld, (size_t)W->cols, x + (size_t)r * ld);
}

static void attention_block(const q3_model *m, q3_state *s, int l, int pos0, int T) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const int H = c->hidden_size, D = c->head_dim, NQ = local_heads(m), NKV = local_kv_heads(m);
    const int KVD = NKV * D, QD = NQ * D;
    for (int t = 0; t < T; t++) q3_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, L->attn_norm, H, c->rms_norm_eps);
    q3_act_quant(m, &L->wq, s->xn, T, (size_t)H);
    /* Merged QKV: one parallel pass over the rows of all three projections. */
    const q3_mm_job qkv[3] = {{s->q, (size_t)QD, s->xn, (size_t)H, T, &L->wq},
                              {s->k, (size_t)KVD, s->xn, (size_t)H, T, &L->wk},
                              {s->v, (size_t)KVD, s->xn, (size_t)H, T, &L->wv}};
    q3_matmul_jobs(qkv, 3);
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
        size_t slot = ((size_t)l * s->ctx + pos0 + t) * KVD;
        memcpy(s->k_cache + slot, s->k + (size_t)t * KVD, (size_t)KVD * sizeof(float));
        memcpy(s->v_cache + slot, s->v + (size_t)t * KVD, (size_t)KVD * sizeof(float));
    }
    const q3_attn_layer al = {NQ, NKV, D, (size_t)KVD, s->k_cache + (size_t)l * s->ctx * KVD,
                              s->v_cache + (size_t)l * s->ctx * KVD};
    q3_attention(s->att, s->q, T, pos0, &al, s->scores);
    q3_act_quant(m, &L->wo, s->att, T, (size_t)QD);
    q3_matmul(s->proj, s->att, T, &L->wo); /* added to x by mlp_block's fused add + norm */
    /* Attention TP: each rank's o_proj saw only its heads' columns; the
     * partial products sum to the full projection. */
    if (m->shard) q3_shard_allreduce(m->shard->g.attn_tp, s->proj, (size_t)T * H);
}

static void dense_mlp(const q3_model *m, const q3_layer *L, q3_state *s, int T) {
    const q3_config *c = &m->cfg;
    const int H = c->hidden_size, F = local_dense_f(m);
    q3_act_quant(m, &L->ffn_gate, s->xn, T, (size_t)H);
    const q3_mm_job w13[2] = {{s->ffn_gate, (size_t)F, s->xn, (size_t)H, T, &L->ffn_gate},
                              {s->ffn_up, (size_t)F, s->xn, (size_t)H, T, &L->ffn_up}};
    q3_matmul_jobs(w13, 2);
    q3_swiglu(s->ffn_gate, s->ffn_gate, s->ffn_up, T * F);
    q3_act_quant(m, &L->ffn_down, s->ffn_gate, T, (size_t)F);
    q3_matmul(s->proj, s->ffn_gate, T, &L->ffn_down);
    /* Dense MLP split over the attn_tp group: rows of gate/up, columns of down. */
    if (m->shard) q3_shard_allreduce(m->shard->g.attn_tp, s->proj, (size_t)T * H);
    for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->proj[i];
}

static void mlp_block(const q3_model *m, q3_state *s, int l, int T) {
    const q3_config *c = &m->cfg;
    const q3_layer *L = &m->layers[l];
    const int H = c->hidden_size;
    for (int t = 0; t < T; t++)
        q3_add_rmsnorm(s->x + (size_t)t * H, s->proj + (size_t)t * H, L->mlp_norm, s->xn + (size_t)t * H, H, c->rms_norm_eps);
    if (L->sparse) q3_moe_forward(m, L, s, T, l);
    else dense_mlp(m, L, s, T);
}

/* One chunk of at most max_batch tokens. */
static void forward_chunk(const q3_model *m, q3_state *s, const int32_t *ids, int T, float *logits, int all_rows) {
    const q3_config *c = &m->cfg;
    const int H = c->hidden_size, pos0 = s->pos;
    for (int t = 0; t < T; t++) q3_to_f32(s->x + (size_t)t * H, m->embed.data, m->embed.dtype, (size_t)ids[t] * H, H);
    for (int l = 0; l < c->num_layers; l++) {
        attention_block(m, s, l, pos0, T);
        mlp_block(m, s, l, T);
    }
    s->pos += T;
    if (!logits) return;
    /* Only the rows somebody asked for go through the final norm and lm_head. */
    int first = all_rows ? 0 : T - 1;
    for (int t = first; t < T; t++) q3_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, m->final_norm, H, c->rms_norm_eps);
    if (!s->lm_local) {
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
        q3_matmul(s->lm_local, s->xn + (size_t)t0 * H, R, &m->lm_head);
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
