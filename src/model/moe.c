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

void q3_moe_forward(const q3_config *c, const q3_layer *L, q3_state *s, int T, int layer) {
    const int E = c->num_experts, K = c->num_experts_per_tok, H = c->hidden_size, F = c->moe_intermediate_size;
    gating(c, L, s, T);
    init_routing(c, s, T);
    if (s->expert_hits)
        for (int e = 0; e < E; e++) s->expert_hits[(size_t)layer * E + e] += (uint64_t)s->expert_count[e];
    for (int e = 0; e < E; e++) {
        const int n = s->expert_count[e], off = s->expert_offset[e];
        if (!n) continue;
        float *xg = s->xg + (size_t)off * H, *g = s->h_gate + (size_t)off * F, *u = s->h_up + (size_t)off * F;
        float *o = s->h_out + (size_t)off * H;
        for (int i = 0; i < n; i++) memcpy(xg + (size_t)i * H, s->xn + (size_t)(s->perm[off + i] / K) * H, (size_t)H * sizeof(float));
        q3_matmul(g, xg, n, &L->gate[e]);
        q3_matmul(u, xg, n, &L->up[e]);
        q3_swiglu(g, g, u, n * F);
        q3_matmul(o, g, n, &L->down[e]);
    }
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
