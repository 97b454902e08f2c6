#include "model/moe.h"

#include <string.h>

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

void q3_moe_forward(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer) {
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
