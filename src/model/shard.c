/* Per-rank weight views (see shard.h). */
#include "model/shard.h"

#include <stdlib.h>
#include <string.h>

#include "quant/bf16p.h"
#include "util/error.h"

static size_t elem_bytes(q3_dtype t) { return t == Q3_F32 ? 4 : 2; }

/* MX: bytes of elements per row (E4M3, int8: 1 per element; E2M1: 2 per byte). */
static size_t mx_row_bytes(q3_dtype t, int cols) { return t == Q3_MXFP4 ? (size_t)cols / 2 : (size_t)cols; }

/* Rows [r0, r0 + n) of W. */
static void row_slice(q3_mat *W, int r0, int n) { *W = q3_mat_rows(W, r0, n); }

static void *own(q3_shard *sh, size_t bytes) {
    if (sh->n_owned == sh->cap_owned) {
        sh->cap_owned = sh->cap_owned ? 2 * sh->cap_owned : 64;
        sh->owned = q3_realloc(sh->owned, (size_t)sh->cap_owned * sizeof *sh->owned);
    }
    void *p = q3_malloc(bytes ? bytes : 1);
    sh->owned[sh->n_owned++] = p;
    return p;
}

/* Columns [c0, c0 + n) of W: a strided view for plain dtypes, a copy of the
 * slice (elements and scales) for MX ones; for BF16P a copy of the slice's
 * groups (their raw groups stay in the whole matrix's side table), or of
 * its BF16 values where the slice cuts groups. */
static int col_slice(q3_shard *sh, q3_mat *W, int c0, int n) {
    if (n == W->cols) return 0;
    if (W->dtype == Q3_BF16P && c0 % Q3_BF16P_GROUP == 0 && n % Q3_BF16P_GROUP == 0) {
        const size_t rb = q3_bf16p_row_bytes((size_t)W->cols), nb = q3_bf16p_row_bytes((size_t)n);
        uint8_t *el = own(sh, (size_t)W->rows * nb);
        for (int r = 0; r < W->rows; r++)
            memcpy(el + (size_t)r * nb, (const uint8_t *)W->data + (size_t)r * rb + q3_bf16p_row_bytes((size_t)c0), nb);
        W->data = el;
        W->cols = n;
        return 0;
    }
    if (W->dtype == Q3_BF16P) {
        uint16_t *el = own(sh, (size_t)W->rows * (size_t)n * sizeof *el), *row = q3_malloc((size_t)W->cols * sizeof *row);
        for (int r = 0; r < W->rows; r++) {
            q3_bf16p_unpack_row(q3_mat_rows(W, r, 1).data, (size_t)W->cols, W->scales, W->side_groups, row);
            memcpy(el + (size_t)r * n, row + c0, (size_t)n * sizeof *el);
        }
        free(row);
        *W = (q3_mat){.data = el, .dtype = Q3_BF16, .rows = W->rows, .cols = n};
        return 0;
    }
    if (q3_dtype_is_mx(W->dtype)) {
        if (c0 % 32 || n % 32)
            return q3_err("internal: MX column slice [%d, %d) is not aligned to the 32-element blocks", c0, c0 + n);
        const size_t rb = mx_row_bytes(W->dtype, W->cols), nb = mx_row_bytes(W->dtype, n);
        const size_t off = mx_row_bytes(W->dtype, c0);
        uint8_t *el = own(sh, (size_t)W->rows * nb), *sc = own(sh, (size_t)W->rows * (size_t)(n / 32));
        for (int r = 0; r < W->rows; r++) {
            memcpy(el + (size_t)r * nb, (const uint8_t *)W->data + (size_t)r * rb + off, nb);
            memcpy(sc + (size_t)r * (size_t)(n / 32), W->scales + (size_t)r * (size_t)(W->cols / 32) + c0 / 32,
                   (size_t)(n / 32));
        }
        W->data = el;
        W->scales = sc;
        W->rs = W->cs = 0;
    } else {
        size_t rs = W->rs ? W->rs : (size_t)W->cols;
        W->data = (const char *)W->data + (size_t)c0 * elem_bytes(W->dtype);
        W->rs = rs;
    }
    W->cols = n;
    return 0;
}

int q3_shard_apply(q3_model *m, const q3_plan *plan) {
    const q3_config *c = &m->cfg;
    if (!plan->validated) return q3_err("internal: q3_shard_apply needs a validated plan");
    q3_shard *sh = q3_calloc(1, sizeof *sh);
    sh->plan = *plan;
    q3_group *w = q3_comm_world();
    int rank = w ? q3_group_rank(w) : 0;
    q3_plan_rank(plan, rank, &sh->a);
    if (w && q3_plan_make_groups(plan, &sh->g)) {
        free(sh);
        return -1;
    }
    m->shard = sh;
    const q3_rank_assign *a = &sh->a;
    const int D = c->head_dim;
    sh->nq = a->q_hi - a->q_lo;
    sh->nkv = a->kv_hi - a->kv_lo;
    sh->dense_f = a->dense_hi - a->dense_lo;
    sh->moe_f = a->inter_hi - a->inter_lo;
    sh->vocab_n = a->vocab_hi - a->vocab_lo;
    if (plan->sp_prefill && plan->attn_tp_size > 1) sh->wo_full = q3_calloc((size_t)c->num_layers, sizeof *sh->wo_full);
    for (int l = 0; l < c->num_layers; l++) {
        q3_layer *L = &m->layers[l];
        if (sh->wo_full) sh->wo_full[l] = L->wo;   /* before the column slice: a view into the mapping */
        row_slice(&L->wq, a->q_lo * D, sh->nq * D);
        row_slice(&L->wk, a->kv_lo * D, sh->nkv * D);
        row_slice(&L->wv, a->kv_lo * D, sh->nkv * D);
        if (col_slice(sh, &L->wo, a->q_lo * D, sh->nq * D)) return -1;
        if (!L->sparse) {
            row_slice(&L->ffn_gate, a->dense_lo, sh->dense_f);
            row_slice(&L->ffn_up, a->dense_lo, sh->dense_f);
            if (col_slice(sh, &L->ffn_down, a->dense_lo, sh->dense_f)) return -1;
            continue;
        }
        for (int e = a->expert_lo; e < a->expert_hi; e++) {
            row_slice(&L->gate[e], a->inter_lo, sh->moe_f);
            row_slice(&L->up[e], a->inter_lo, sh->moe_f);
            if (col_slice(sh, &L->down[e], a->inter_lo, sh->moe_f)) return -1;
        }
    }
    row_slice(&m->lm_head, a->vocab_lo, sh->vocab_n);
    return 0;
}

void q3_shard_free(q3_model *m) {
    q3_shard *sh = m->shard;
    if (!sh) return;
    if (sh->g.world) q3_plan_free_groups(&sh->g);
    for (int i = 0; i < sh->n_owned; i++) free(sh->owned[i]);
    free(sh->owned);
    free(sh->wo_full);
    free(sh);
    m->shard = NULL;
}

void q3_shard_allreduce(q3_group *g, float *buf, size_t n) {
    if (g && q3_group_size(g) > 1) q3_comm_allreduce_sum(g, buf, n);
}
