#include "model/moe.h"

#include <string.h>

#include "model/shard.h"

void q3_topk(const float *probs, int n, int k, int32_t *id, float *w) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= id[i] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        id[j] = best;
        w[j] = probs[best];
    }
}

/* Router, softmax and top-k of the normed rows [t0, t0 + n) of s->xn. */
static void gating(const q3_config *c, const q3_layer *L, q3_state *s, int t0, int n) {
    const int E = c->num_experts, K = c->num_experts_per_tok;
    if (n <= 0) return;
    q3_matmul_part(Q3_MM_ROUTER);
    q3_matmul(s->router + (size_t)t0 * E, s->xn + (size_t)t0 * c->hidden_size, n, &L->router);
#pragma omp parallel for schedule(static) if (n >= Q3_PAR_ROWS)
    for (int t = t0; t < t0 + n; t++) {
        float *p = s->router + (size_t)t * E;
        q3_softmax(p, E);
        int32_t *id = s->topk_id + (size_t)t * K;
        float *w = s->topk_w + (size_t)t * K;
        q3_topk(p, E, K, id, w);
        if (c->norm_topk_prob) {
            float sum = 0;
            for (int j = 0; j < K; j++) sum += w[j];
            for (int j = 0; j < K; j++) w[j] /= sum;
        }
    }
}

/* Instrumentation (s->expert_hits): the tokens [t0, t1) routed to each
 * expert of this layer, from their top-k ids. */
static void count_hits(const q3_config *c, q3_state *s, int layer, int t0, int t1) {
    if (!s->expert_hits) return;
    const int E = c->num_experts, K = c->num_experts_per_tok;
    for (int i = t0 * K; i < t1 * K; i++) s->expert_hits[(size_t)layer * E + s->topk_id[i]]++;
}

/* Counting sort of the T*K (token, slot) pairs by expert id. */
static void init_routing(const q3_config *c, q3_state *s, int T) {
    const int E = c->num_experts, P = T * c->num_experts_per_tok;
    memset(s->expert_count, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < P; i++) s->expert_count[s->topk_id[i]]++;
    s->expert_offset[0] = 0;
    for (int e = 0; e < E; e++) s->expert_offset[e + 1] = s->expert_offset[e] + s->expert_count[e];
    memset(s->expert_count, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < P; i++) {
        int e = s->topk_id[i];
        int at = s->expert_offset[e] + s->expert_count[e]++;
        s->perm[at] = i;
        s->perm_inv[i] = at;
    }
}

/* The experts [elo, ehi) over their gathered rows in s->xg (rows
 * expert_offset[elo] .. expert_offset[ehi]): gate and up of every expert
 * merged, SwiGLU applied panel by panel as they come out (q3_mm_job.up),
 * in one parallel pass; the MXFP8 input quantization for MX weights; then
 * down in a second pass, into s->h_out. */
static void run_local_experts(const q3_model *m, const q3_layer *L, q3_state *s, int elo, int ehi, int rows_quantized) {
    if (ehi <= elo) return;
    const int H = m->cfg.hidden_size, F = L->gate[elo].rows;
    const int p0 = s->expert_offset[elo], p1 = s->expert_offset[ehi];
    q3_mm_job *jobs = s->moe_jobs;
    int nj = 0;
    if (p1 > p0 && !rows_quantized) q3_act_quant(m, &L->gate[elo], s->xg + (size_t)p0 * H, p1 - p0, (size_t)H);
    q3_matmul_part(Q3_MM_EXPERTS);
    for (int e = elo; e < ehi; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (!n) continue;
        jobs[nj++] =
            (q3_mm_job){s->h_gate + (size_t)off * F, (size_t)F, s->xg + (size_t)off * H, (size_t)H, n, &L->gate[e], &L->up[e]};
    }
    q3_matmul_jobs(jobs, nj);
    if (p1 > p0) q3_act_quant(m, &L->down[elo], s->h_gate + (size_t)p0 * F, p1 - p0, (size_t)F);
    nj = 0;
    for (int e = elo; e < ehi; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (n)
            jobs[nj++] =
                (q3_mm_job){s->h_out + (size_t)off * H, (size_t)H, s->h_gate + (size_t)off * F, (size_t)F, n, &L->down[e], NULL};
    }
    q3_matmul_jobs(jobs, nj);
}

/* This rank's partial MoE output for the T tokens whose normed rows are in
 * s->xn and routing in s->topk_id / s->topk_w: its experts' (token, slot)
 * pairs on its columns, finalized in slot order into s->proj (T rows). */
static void local_partial(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
    const q3_config *c = &m->cfg;
    const q3_shard *sh = m->shard;
    const int K = c->num_experts_per_tok, H = c->hidden_size;
    const int elo = sh->a.expert_lo, ehi = sh->a.expert_hi;
    init_routing(c, s, T);
    count_hits(c, s, layer, 0, T);
    const int p0 = s->expert_offset[elo], p1 = s->expert_offset[ehi];
    /* The experts' input rows: xn itself, or (A8) each token's MXFP8 copy,
     * quantized once per token rather than once per (token, slot). s->proj
     * is free here: the fused add+norm before the MLP consumed it. */
    const float *src = s->xq_in_proj ? s->proj : s->xn;
    if (p1 > p0 && !s->xq_in_proj && L->gate[elo].a8) {
        memcpy(s->proj, s->xn, (size_t)T * H * sizeof(float));
        q3_act_quant(m, &L->gate[elo], s->proj, T, (size_t)H);
        src = s->proj;
    }
#pragma omp parallel for schedule(static) if (p1 - p0 >= Q3_PAR_ROWS)
    for (int p = p0; p < p1; p++) memcpy(s->xg + (size_t)p * H, src + (size_t)(s->perm[p] / K) * H, (size_t)H * sizeof(float));
    run_local_experts(m, L, s, elo, ehi, 1);
    /* Partial finalize (local pairs in slot order) into proj, sum, add. */
#pragma omp parallel for schedule(static) if (T >= Q3_PAR_ROWS)
    for (int t = 0; t < T; t++) {
        float *y = s->proj + (size_t)t * H;
        memset(y, 0, (size_t)H * sizeof(float));
        for (int j = 0; j < K; j++) {
            const int pair = t * K + j, at = s->perm_inv[pair];
            if (at < p0 || at >= p1) continue;
            const float w = s->topk_w[pair], *o = s->h_out + (size_t)at * H;
            q3_axpy(y, w, o, H);
        }
    }
}

/* Many ranks, tokens replicated on every rank. Every rank computes the
 * router for all tokens (replicated and identical), runs only the (token,
 * slot) pairs routed to its experts [expert_lo, expert_hi), on its columns
 * [inter_lo, inter_hi) of each (moe_tp), and finalizes its partial sum; the
 * partial sums over the whole world (moe_ep x moe_tp ranks) give the MoE
 * output. This is the AllGather + ReduceScatter EP scheme specialised to
 * replicated tokens: the gather is free (every rank already holds every
 * token) and the reduce-scatter becomes an allreduce since every rank
 * needs every row. */
static void moe_forward_shard(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
    const int H = m->cfg.hidden_size;
    gating(&m->cfg, L, s, 0, T);
    local_partial(m, L, s, T, layer);
    q3_shard_allreduce(m->shard->g.world, s->proj, (size_t)T * H);
    q3_add_rows(s->x, s->proj, T, H);
}

static int range_lo(int i, int n, int parts) { return (int)((long)i * n / parts); }

static size_t comm_mx_cols(const q3_model *m, int n) {
    return m->shard->plan.comm_quant == Q3_COMM_QUANT_MXFP8 ? (size_t)n : 0;
}

/* EP over AlltoAll (moe_ep_comm: alltoall) for this rank's tokens [t_lo,
 * t_hi), whose normed rows are in s->xn and routing in s->topk_id/w
 * (double routing). Init routing: the own (token, slot) pairs sorted by
 * expert, hence grouped by the rank holding it. Each rank learns how many
 * rows of each of its experts every peer sends: computed locally when the
 * routing is replicated (`replicated`: every rank routed all T tokens and
 * rank r owns the share [r T/EP, (r+1) T/EP)), else by an alltoall of the
 * per-expert counts. Dispatch (alltoallv, MXFP8 with comm_quant), regroup
 * the received rows by local expert, grouped matmuls, combine (alltoallv,
 * fp32) back in the order received, finalize each own token's top_k
 * outputs in slot order, sum the moe_tp column partials. Returns the own
 * tokens' outputs: t_hi - t_lo rows of H in s->a2a_send. */
static float *alltoall_exchange(const q3_model *m, const q3_layer *L, q3_state *s, int t_lo, int t_hi, int T,
                                int replicated) {
    const q3_config *c = &m->cfg;
    const q3_shard *sh = m->shard;
    const int K = c->num_experts_per_tok, H = c->hidden_size, N = c->num_experts;
    const int EP = sh->plan.moe_ep_size, per = N / EP;
    const int elo = sh->a.expert_lo, ehi = sh->a.expert_hi;
    size_t *send_n = s->a2a_counts, *recv_n = send_n + EP;
    int32_t *cnt_send = s->a2a_ecount, *cnt_recv = cnt_send + N; /* [N] by expert; [EP][per] by source */
    int32_t *at = s->expert_offset;                                /* dispatch row cursor per expert */
    memset(cnt_send, 0, (size_t)N * sizeof(int32_t));
    for (int i = t_lo * K; i < t_hi * K; i++) cnt_send[s->topk_id[i]]++;
    at[0] = 0;
    for (int e = 0; e < N; e++) at[e + 1] = at[e] + cnt_send[e];
    for (int d = 0; d < EP; d++) send_n[d] = (size_t)(at[(d + 1) * per] - at[d * per]);
    for (int i = t_lo * K; i < t_hi * K; i++) {
        const int row = at[s->topk_id[i]]++;
        memcpy(s->a2a_send + (size_t)row * H, s->xn + (size_t)(i / K) * H, (size_t)H * sizeof(float));
        s->a2a_pos[i] = row;
    }
    if (replicated) {
        memset(cnt_recv, 0, (size_t)N * sizeof(int32_t));
        for (int src = 0; src < EP; src++)
            for (int i = range_lo(src, T, EP) * K; i < range_lo(src + 1, T, EP) * K; i++)
                if (s->topk_id[i] >= elo && s->topk_id[i] < ehi) cnt_recv[src * per + s->topk_id[i] - elo]++;
    } else {
        q3_comm_alltoall_bytes(sh->g.moe_ep, cnt_send, cnt_recv, (size_t)per * sizeof(int32_t));
    }
    size_t n_recv = 0;
    for (int src = 0; src < EP; src++) {
        recv_n[src] = 0;
        for (int k = 0; k < per; k++) recv_n[src] += (size_t)cnt_recv[src * per + k];
        n_recv += recv_n[src];
    }
    q3_comm_alltoallv_rows(sh->g.moe_ep, s->a2a_send, send_n, s->a2a_recv, recv_n, (size_t)H, comm_mx_cols(m, H),
                           s->comm_wire);
    /* Rows arrive by source, then expert: regroup them by expert. */
    memset(s->expert_count, 0, (size_t)(N + 1) * sizeof(int32_t));
    for (int src = 0; src < EP; src++)
        for (int k = 0; k < per; k++) s->expert_count[elo + k] += cnt_recv[src * per + k];
    s->expert_offset[0] = 0;
    for (int e = 0; e < N; e++) s->expert_offset[e + 1] = s->expert_offset[e] + s->expert_count[e];
    memset(s->expert_count, 0, (size_t)(N + 1) * sizeof(int32_t));
    size_t i = 0;
    for (int src = 0; src < EP; src++)
        for (int k = 0; k < per; k++)
            for (int r = 0; r < cnt_recv[src * per + k]; r++, i++) {
                const int e = elo + k, p = s->expert_offset[e] + s->expert_count[e]++;
                s->perm[p] = (int32_t)i;
                memcpy(s->xg + (size_t)p * H, s->a2a_recv + i * H, (size_t)H * sizeof(float));
            }
    run_local_experts(m, L, s, elo, ehi, 0);
    for (size_t p = 0; p < n_recv; p++)
        memcpy(s->a2a_send + (size_t)s->perm[p] * H, s->h_out + p * H, (size_t)H * sizeof(float));
    q3_comm_alltoallv_rows(sh->g.moe_ep, s->a2a_send, recv_n, s->a2a_recv, send_n, (size_t)H, 0, NULL);
    float *y = s->a2a_send;
#pragma omp parallel for schedule(static) if (t_hi - t_lo >= Q3_PAR_ROWS)
    for (int t = t_lo; t < t_hi; t++) {
        float *yt = y + (size_t)(t - t_lo) * H;
        memset(yt, 0, (size_t)H * sizeof(float));
        for (int j = 0; j < K; j++) {
            const float w = s->topk_w[t * K + j], *o = s->a2a_recv + (size_t)s->a2a_pos[t * K + j] * H;
            q3_axpy(yt, w, o, H);
        }
    }
    /* moe_tp peers hold the same EP rank, hence the same tokens: they skip together. */
    if (t_hi > t_lo) q3_shard_allreduce(sh->g.moe_tp, y, (size_t)(t_hi - t_lo) * H);
    return y;
}

/* AlltoAll EP with the tokens replicated (decode, or prefill without SP):
 * the EP ranks take equal shares of the tokens, exchange, and allgather the
 * shares' outputs so that every rank again holds every token. */
static void moe_forward_alltoall(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
    const int H = m->cfg.hidden_size, EP = m->shard->plan.moe_ep_size, me = m->shard->a.ep_rank;
    gating(&m->cfg, L, s, 0, T);
    count_hits(&m->cfg, s, layer, 0, T);
    const int t_lo = range_lo(me, T, EP), t_hi = range_lo(me + 1, T, EP), blk = (T + EP - 1) / EP;
    float *mine = alltoall_exchange(m, L, s, t_lo, t_hi, T, 1);
    memset(mine + (size_t)(t_hi - t_lo) * H, 0, (size_t)(blk - (t_hi - t_lo)) * H * sizeof(float));
    q3_comm_allgather(m->shard->g.moe_ep, mine, (size_t)blk * H, s->a2a_recv);
    for (int src = 0; src < EP; src++) {
        const int a = range_lo(src, T, EP), b = range_lo(src + 1, T, EP);
        q3_add_rows(s->x + (size_t)a * H, s->a2a_recv + (size_t)src * blk * H, b - a, H);
    }
}

/* Sequence-parallel prefill (forward.c): this rank owns the rows [lo, lo +
 * sl) of a chunk of T tokens padded to EP sl (the moe_ep group is the
 * attn_tp group), the real ones being those below T. Gating on the own
 * rows; then either AlltoAll EP on them, or the AllGather scheme: gather
 * every rank's normed rows (MXFP8 with comm_quant) with their top-k ids
 * and weights (fp32, so that routing is decided once, on fp32 inputs),
 * run this rank's experts' pairs over the whole chunk, reduce-scatter the
 * partial sums (fp32) back to the owners, sum the moe_tp partials. */
void q3_moe_forward_sp(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
    const q3_config *c = &m->cfg;
    const q3_shard *sh = m->shard;
    const int H = c->hidden_size, K = c->num_experts_per_tok, W = H + 2 * K, EP = sh->plan.moe_ep_size;
    const int sl = (T + EP - 1) / EP, lo = sh->a.ep_rank * sl;
    const int nr = T - lo < 0 ? 0 : T - lo < sl ? T - lo : sl;
    gating(c, L, s, lo, nr);
    if (s->a2a_send) {
        count_hits(c, s, layer, lo, lo + nr); /* this rank's rows: the others' routing never reaches it */
        const float *y = alltoall_exchange(m, L, s, lo, lo + nr, T, 0);
        q3_add_rows(s->x + (size_t)lo * H, y, nr, H);
        return;
    }
    for (int t = lo; t < lo + sl; t++) {   /* row: hidden, K ids (exact in fp32), K weights */
        float *row = s->sp_moe + (size_t)t * W;
        if (t >= lo + nr) {
            memset(row, 0, (size_t)W * sizeof(float));
            continue;
        }
        memcpy(row, s->xn + (size_t)t * H, (size_t)H * sizeof(float));
        for (int j = 0; j < K; j++) {
            row[H + j] = (float)s->topk_id[t * K + j];
            row[H + K + j] = s->topk_w[t * K + j];
        }
    }
    q3_comm_allgather_rows(sh->g.moe_ep, s->sp_moe + (size_t)lo * W, (size_t)sl, (size_t)W, comm_mx_cols(m, H),
                           s->sp_moe, s->comm_wire);
    for (int t = 0; t < T; t++) {
        const float *row = s->sp_moe + (size_t)t * W;
        memcpy(s->xn + (size_t)t * H, row, (size_t)H * sizeof(float));
        for (int j = 0; j < K; j++) {
            s->topk_id[t * K + j] = (int32_t)row[H + j];
            s->topk_w[t * K + j] = row[H + K + j];
        }
    }
    local_partial(m, L, s, T, layer);
    memset(s->proj + (size_t)T * H, 0, (size_t)(EP * sl - T) * H * sizeof(float));
    q3_comm_reduce_scatter_sum(sh->g.moe_ep, s->proj, s->sp_out, (size_t)sl * H);
    q3_shard_allreduce(sh->g.moe_tp, s->sp_out, (size_t)sl * H);
    q3_add_rows(s->x + (size_t)lo * H, s->sp_out, nr, H);
}

void q3_moe_forward(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
    if (m->shard && s->a2a_send) {
        moe_forward_alltoall(m, L, s, T, layer);
        return;
    }
    if (m->shard) {
        moe_forward_shard(m, L, s, T, layer);
        return;
    }
    const q3_config *c = &m->cfg;
    const int E = c->num_experts, K = c->num_experts_per_tok, H = c->hidden_size;
    gating(c, L, s, 0, T);
    init_routing(c, s, T);
    count_hits(c, s, layer, 0, T);
    /* Gather each expert's rows, then its passes (run_local_experts). The
     * router read xn in fp32; the experts read the MXFP8 copy (A8). */
    const float *src = s->xq_in_proj ? s->proj : s->xn;
#pragma omp parallel for schedule(static) if (T * K >= Q3_PAR_ROWS)
    for (int p = 0; p < T * K; p++) memcpy(s->xg + (size_t)p * H, src + (size_t)(s->perm[p] / K) * H, (size_t)H * sizeof(float));
    run_local_experts(m, L, s, 0, E, s->xq_in_proj);
    /* Finalize: each token sums its k expert outputs in slot order, so the
     * result does not depend on how pairs were grouped. */
#pragma omp parallel for schedule(static) if (T >= Q3_PAR_ROWS)
    for (int t = 0; t < T; t++) {
        float *x = s->x + (size_t)t * H;
        for (int j = 0; j < K; j++) {
            const int pair = t * K + j;
            const float w = s->topk_w[pair], *o = s->h_out + (size_t)s->perm_inv[pair] * H;
            q3_axpy(x, w, o, H);
        }
    }
}
