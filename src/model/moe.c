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

static void gating(const q3_config *c, const q3_layer *L, q3_state *s, int T) {
    const int E = c->num_experts, K = c->num_experts_per_tok;
    q3_matmul(s->router, s->xn, T, &L->router);
    for (int t = 0; t < T; t++) {
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
 * expert_offset[elo] .. expert_offset[ehi]): gate+up of every expert in one
 * parallel pass, SwiGLU (and MXFP8 input quantization for MX weights), then
 * down in a second pass, into s->h_out. */
static void run_local_experts(const q3_model *m, const q3_layer *L, q3_state *s, int elo, int ehi, int rows_quantized) {
    if (ehi <= elo) return;
    const int H = m->cfg.hidden_size, F = L->gate[elo].rows;
    const int p0 = s->expert_offset[elo], p1 = s->expert_offset[ehi];
    q3_mm_job *jobs = s->moe_jobs;
    int nj = 0;
    if (p1 > p0 && !rows_quantized) q3_act_quant(m, &L->gate[elo], s->xg + (size_t)p0 * H, p1 - p0, (size_t)H);
    for (int e = elo; e < ehi; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (!n) continue;
        jobs[nj++] = (q3_mm_job){s->h_gate + (size_t)off * F, (size_t)F, s->xg + (size_t)off * H, (size_t)H, n, &L->gate[e]};
        jobs[nj++] = (q3_mm_job){s->h_up + (size_t)off * F, (size_t)F, s->xg + (size_t)off * H, (size_t)H, n, &L->up[e]};
    }
    q3_matmul_jobs(jobs, nj);
    q3_swiglu(s->h_gate + (size_t)p0 * F, s->h_gate + (size_t)p0 * F, s->h_up + (size_t)p0 * F, (p1 - p0) * F);
    if (p1 > p0) q3_act_quant(m, &L->down[elo], s->h_gate + (size_t)p0 * F, p1 - p0, (size_t)F);
    nj = 0;
    for (int e = elo; e < ehi; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (n) jobs[nj++] = (q3_mm_job){s->h_out + (size_t)off * H, (size_t)H, s->h_gate + (size_t)off * F, (size_t)F, n, &L->down[e]};
    }
    q3_matmul_jobs(jobs, nj);
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
    const q3_config *c = &m->cfg;
    const q3_shard *sh = m->shard;
    const int E = c->num_experts, K = c->num_experts_per_tok, H = c->hidden_size;
    const int elo = sh->a.expert_lo, ehi = sh->a.expert_hi;
    gating(c, L, s, T);
    init_routing(c, s, T);
    if (s->expert_hits)
        for (int e = 0; e < E; e++) s->expert_hits[(size_t)layer * E + e] += (uint64_t)s->expert_count[e];
    const int p0 = s->expert_offset[elo], p1 = s->expert_offset[ehi];
    /* The experts' input rows: xn itself, or (A8) each token's MXFP8 copy,
     * quantized once per token rather than once per (token, slot). s->proj
     * is free here: the fused add+norm before the MLP consumed it. */
    const float *src = s->xn;
    if (p1 > p0 && m->scheme.act_mxfp8 && q3_dtype_is_mx(L->gate[elo].dtype)) {
        memcpy(s->proj, s->xn, (size_t)T * H * sizeof(float));
        q3_act_quant(m, &L->gate[elo], s->proj, T, (size_t)H);
        src = s->proj;
    }
    for (int p = p0; p < p1; p++) memcpy(s->xg + (size_t)p * H, src + (size_t)(s->perm[p] / K) * H, (size_t)H * sizeof(float));
    run_local_experts(m, L, s, elo, ehi, 1);
    /* Partial finalize (local pairs in slot order) into proj, sum, add. */
    memset(s->proj, 0, (size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *y = s->proj + (size_t)t * H;
        for (int j = 0; j < K; j++) {
            const int pair = t * K + j, at = s->perm_inv[pair];
            if (at < p0 || at >= p1) continue;
            const float w = s->topk_w[pair], *o = s->h_out + (size_t)at * H;
            for (int h = 0; h < H; h++) y[h] += w * o[h];
        }
    }
    q3_shard_allreduce(sh->g.world, s->proj, (size_t)T * H);
    for (size_t i = 0; i < (size_t)T * H; i++) s->x[i] += s->proj[i];
}

/* EP over AlltoAll (moe_ep_comm: alltoall), tokens replicated. The EP
 * group's ranks take equal shares of the tokens [t_lo, t_hi); each rank
 * dispatches its tokens' (token, slot) rows to the ranks holding the chosen
 * experts (alltoallv), runs the rows it received through its experts,
 * returns the outputs in the order received (alltoallv), sums each of its
 * tokens' top_k outputs in slot order, sums the moe_tp column partials
 * (allreduce over moe_tp) and allgathers the token shares over the EP group
 * so that every rank again holds every token. The routing is replicated, so
 * every rank knows every count without exchanging them. Each dispatched row
 * carries its expert id as one extra float (exact below 2^24). */
static int range_lo(int i, int n, int parts) { return (int)((long)i * n / parts); }

static void moe_forward_alltoall(const q3_model *m, const q3_layer *L, q3_state *s, int T) {
    const q3_config *c = &m->cfg;
    const q3_shard *sh = m->shard;
    const int K = c->num_experts_per_tok, H = c->hidden_size, N = c->num_experts;
    const int EP = sh->plan.moe_ep_size, me = sh->a.ep_rank, per = N / EP;
    const int elo = sh->a.expert_lo, ehi = sh->a.expert_hi;
    size_t *send_n = s->a2a_counts, *recv_n = send_n + EP, *send_c = recv_n + EP, *recv_c = send_c + EP;
    gating(c, L, s, T);
    /* Dispatch: my tokens' pairs, grouped by destination rank, (token, slot) order inside. */
    const int t_lo = range_lo(me, T, EP), t_hi = range_lo(me + 1, T, EP);
    for (int d = 0; d < EP; d++) send_n[d] = recv_n[d] = 0;
    for (int t = t_lo; t < t_hi; t++)
        for (int j = 0; j < K; j++) send_n[s->topk_id[t * K + j] / per]++;
    for (int src = 0; src < EP; src++)
        for (int t = range_lo(src, T, EP); t < range_lo(src + 1, T, EP); t++)
            for (int j = 0; j < K; j++) recv_n[src] += s->topk_id[t * K + j] / per == me;
    size_t *at = send_c, n_sent = 0, n_recv = 0; /* send_c is filled after packing */
    for (int d = 0; d < EP; d++) {
        at[d] = n_sent;
        n_sent += send_n[d];
        n_recv += recv_n[d];
    }
    for (int t = t_lo; t < t_hi; t++)
        for (int j = 0; j < K; j++) {
            const int e = s->topk_id[t * K + j];
            const size_t row = at[e / per]++;
            float *dst = s->a2a_send + row * (size_t)(H + 1);
            memcpy(dst, s->xn + (size_t)t * H, (size_t)H * sizeof(float));
            dst[H] = (float)e;
            s->a2a_pos[t * K + j] = (int32_t)row;
        }
    for (int d = 0; d < EP; d++) {
        send_c[d] = send_n[d] * (size_t)(H + 1);
        recv_c[d] = recv_n[d] * (size_t)(H + 1);
    }
    q3_comm_alltoallv(sh->g.moe_ep, s->a2a_send, send_c, s->a2a_recv, recv_c);
    /* Group the received rows by expert (counting sort), run the experts. */
    memset(s->expert_count, 0, (size_t)(N + 1) * sizeof(int32_t));
    for (size_t i = 0; i < n_recv; i++) {
        const int e = (int)s->a2a_recv[i * (size_t)(H + 1) + (size_t)H];
        s->a2a_expert[i] = e;
        s->expert_count[e]++;
    }
    s->expert_offset[0] = 0;
    for (int e = 0; e < N; e++) s->expert_offset[e + 1] = s->expert_offset[e] + (e >= elo && e < ehi ? s->expert_count[e] : 0);
    memset(s->expert_count, 0, (size_t)(N + 1) * sizeof(int32_t));
    for (size_t i = 0; i < n_recv; i++) {
        const int e = s->a2a_expert[i], p = s->expert_offset[e] + s->expert_count[e]++;
        s->perm[p] = (int32_t)i;
        memcpy(s->xg + (size_t)p * H, s->a2a_recv + i * (size_t)(H + 1), (size_t)H * sizeof(float));
    }
    const int R = (int)n_recv;
    run_local_experts(m, L, s, elo, ehi, 0);
    /* Combine: outputs back in the order received. */
    for (int p = 0; p < R; p++)
        memcpy(s->a2a_send + (size_t)s->perm[p] * H, s->h_out + (size_t)p * H, (size_t)H * sizeof(float));
    for (int d = 0; d < EP; d++) {
        send_c[d] = recv_n[d] * (size_t)H;
        recv_c[d] = send_n[d] * (size_t)H;
    }
    q3_comm_alltoallv(sh->g.moe_ep, s->a2a_send, send_c, s->a2a_recv, recv_c);
    /* My tokens: top_k outputs in slot order, into the allgather block. */
    const int blk = (T + EP - 1) / EP;
    float *mine = s->a2a_send;
    memset(mine, 0, (size_t)blk * H * sizeof(float));
    for (int t = t_lo; t < t_hi; t++) {
        float *y = mine + (size_t)(t - t_lo) * H;
        for (int j = 0; j < K; j++) {
            const float w = s->topk_w[t * K + j], *o = s->a2a_recv + (size_t)s->a2a_pos[t * K + j] * H;
            for (int h = 0; h < H; h++) y[h] += w * o[h];
        }
    }
    q3_shard_allreduce(sh->g.moe_tp, mine, (size_t)blk * H);
    q3_comm_allgather(sh->g.moe_ep, mine, (size_t)blk * H, s->a2a_recv);
    for (int src = 0; src < EP; src++) {
        const int a = range_lo(src, T, EP), b = range_lo(src + 1, T, EP);
        for (int t = a; t < b; t++) {
            const float *y = s->a2a_recv + ((size_t)src * blk + (size_t)(t - a)) * H;
            float *x = s->x + (size_t)t * H;
            for (int h = 0; h < H; h++) x[h] += y[h];
        }
    }
}

void q3_moe_forward(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
    if (m->shard && s->a2a_send) {
        moe_forward_alltoall(m, L, s, T);
        return;
    }
    if (m->shard) {
        moe_forward_shard(m, L, s, T, layer);
        return;
    }
    const q3_config *c = &m->cfg;
    const int E = c->num_experts, K = c->num_experts_per_tok, H = c->hidden_size, F = c->moe_intermediate_size;
    gating(c, L, s, T);
    init_routing(c, s, T);
    if (s->expert_hits)
        for (int e = 0; e < E; e++) s->expert_hits[(size_t)layer * E + e] += (uint64_t)s->expert_count[e];
    /* Gather each expert's rows, then gate+up of every active expert in one
     * parallel pass, SwiGLU over all pairs at once, and down in a second pass. */
    q3_mm_job *jobs = s->moe_jobs;
    int nj = 0;
    for (int p = 0; p < T * K; p++) memcpy(s->xg + (size_t)p * H, s->xn + (size_t)(s->perm[p] / K) * H, (size_t)H * sizeof(float));
    /* The router read xn in fp32; only the experts' copies are quantized. */
    q3_act_quant(m, &L->gate[0], s->xg, T * K, (size_t)H);
    for (int e = 0; e < E; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (!n) continue;
        jobs[nj++] = (q3_mm_job){s->h_gate + (size_t)off * F, (size_t)F, s->xg + (size_t)off * H, (size_t)H, n, &L->gate[e]};
        jobs[nj++] = (q3_mm_job){s->h_up + (size_t)off * F, (size_t)F, s->xg + (size_t)off * H, (size_t)H, n, &L->up[e]};
    }
    q3_matmul_jobs(jobs, nj);
    q3_swiglu(s->h_gate, s->h_gate, s->h_up, T * K * F);
    q3_act_quant(m, &L->down[0], s->h_gate, T * K, (size_t)F);
    nj = 0;
    for (int e = 0; e < E; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (n) jobs[nj++] = (q3_mm_job){s->h_out + (size_t)off * H, (size_t)H, s->h_gate + (size_t)off * F, (size_t)F, n, &L->down[e]};
    }
    q3_matmul_jobs(jobs, nj);
    /* Finalize: each token sums its k expert outputs in slot order, so the
     * result does not depend on how pairs were grouped. */
    for (int t = 0; t < T; t++) {
        float *x = s->x + (size_t)t * H;
        for (int j = 0; j < K; j++) {
            const int pair = t * K + j;
            const float w = s->topk_w[pair], *o = s->h_out + (size_t)s->perm_inv[pair] * H;
            for (int h = 0; h < H; h++) x[h] += w * o[h];
        }
    }
}
