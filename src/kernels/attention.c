#include "kernels/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/isa.h"

/* Running softmax state of one (query, head): max m, normaliser l, output o[D]. */
typedef struct {
    float m, l;
} sm_state;

/* Fold keys [j0, j1) into (st, o) for one query vector. */
static void fold_block(const q3_isa_kernels *K, const q3_attn_layer *L, const float *q, int kvh, int j0, int j1,
                       float scale, sm_state *st, float *o) {
    const int D = L->head_dim;
    float s[Q3_ATT_BLOCK];
    float mx = st->m;
    for (int j = j0; j < j1; j++) {
        s[j - j0] = K->dot(q, L->k + (size_t)j * L->kv_stride + (size_t)kvh * D, D) * scale;
        if (s[j - j0] > mx) mx = s[j - j0];
    }
    float corr = expf(st->m - mx); /* st->m = -inf on the first block gives 0 */
    if (st->l > 0) K->scale(o, corr, D);
    float l = st->l * corr;
    for (int j = j0; j < j1; j++) {
        float p = expf(s[j - j0] - mx);
        l += p;
        K->axpy(o, p, L->v + (size_t)j * L->kv_stride + (size_t)kvh * D, D);
    }
    st->m = mx;
    st->l = l;
}

size_t q3_attention_scratch(int n_heads, int head_dim, int ctx) {
    size_t blocks = ((size_t)ctx + Q3_ATT_BLOCK - 1) / Q3_ATT_BLOCK;
    return (size_t)n_heads * blocks * ((size_t)head_dim + 2);
}

static void prefill(const q3_isa_kernels *K, float *out, const float *q, int T, int pos0, const q3_attn_layer *L) {
    const int H = L->n_heads, D = L->head_dim, group = H / L->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *qv = q + ((size_t)t * H + h) * D;
            float *o = out + ((size_t)t * H + h) * D;
            sm_state st = {-INFINITY, 0};
            memset(o, 0, (size_t)D * sizeof(float));
            const int n = pos0 + t + 1;
            for (int j0 = 0; j0 < n; j0 += Q3_ATT_BLOCK)
                fold_block(K, L, qv, h / group, j0, j0 + Q3_ATT_BLOCK < n ? j0 + Q3_ATT_BLOCK : n, scale, &st, o);
            K->scale(o, 1.0f / st.l, D);
        }
}

static void decode(const q3_isa_kernels *K, float *out, const float *q, int pos, const q3_attn_layer *L, float *scratch) {
    const int H = L->n_heads, D = L->head_dim, group = H / L->n_kv_heads, n = pos + 1;
    const int nb = (n + Q3_ATT_BLOCK - 1) / Q3_ATT_BLOCK;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t rec = (size_t)D + 2; /* per (head, block): m, l, o[D] */
#pragma omp parallel for collapse(2) schedule(static) if (n > Q3_ATT_BLOCK)
    for (int h = 0; h < H; h++)
        for (int b = 0; b < nb; b++) {
            float *r = scratch + ((size_t)h * nb + b) * rec;
            sm_state st = {-INFINITY, 0};
            memset(r + 2, 0, (size_t)D * sizeof(float));
            int j0 = b * Q3_ATT_BLOCK, j1 = j0 + Q3_ATT_BLOCK < n ? j0 + Q3_ATT_BLOCK : n;
            fold_block(K, L, q + (size_t)h * D, h / group, j0, j1, scale, &st, r + 2);
            r[0] = st.m;
            r[1] = st.l;
        }
    for (int h = 0; h < H; h++) {
        const float *r = scratch + (size_t)h * nb * rec;
        float m = -INFINITY, l = 0;
        for (int b = 0; b < nb; b++) m = r[b * rec] > m ? r[b * rec] : m;
        float *o = out + (size_t)h * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int b = 0; b < nb; b++) {
            float w = expf(r[b * rec] - m);
            l += r[b * rec + 1] * w;
            K->axpy(o, w, r + b * rec + 2, D);
        }
        K->scale(o, 1.0f / l, D);
    }
}

void q3_attention(float *out, const float *q, int T, int pos0, const q3_attn_layer *L, float *scratch) {
    const q3_isa_kernels *K = q3_isa_current();
    if (T == 1) decode(K, out, q, pos0, L, scratch);
    else prefill(K, out, q, T, pos0, L);
}
