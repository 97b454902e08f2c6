/* One rank's share of a model in a multi-rank job (src/parallel/plan.h).
 *
 * q3_shard_apply rewrites the q3_mat views of a loaded model, once, into
 * this rank's slices (the plan's assignment, q3_plan_rank):
 *   q/k/v_proj   rows of the rank's query heads / KV heads
 *   o_proj       columns of its query heads (a view with rs = the full row)
 *   dense MLP    rows [dense_lo, dense_hi) of gate/up, those columns of down
 *   experts      for its experts [expert_lo, expert_hi): rows
 *                [inter_lo, inter_hi) of gate/up, those columns of down
 *   lm_head      rows [vocab_lo, vocab_hi)
 * The router, norms and embeddings stay whole (replicated). Views of plain
 * dtypes point into the mapping; a column slice of an MX matrix (whose
 * scales cannot be strided) is copied once into memory owned by the shard
 * (only the rank's slice). Weights outside the rank's slices are never read.
 *
 * With sequence-parallel prefill (plan.sp_prefill) each rank also keeps a
 * view of the whole o_proj (wo_full): prefill runs o_proj on the rank's own
 * tokens with all heads (forward.c), decode on its heads' columns.
 *
 * The forward pass (forward.c, moe.c) reads m->shard: NULL means one rank
 * holding everything, and the code paths are exactly the single-process
 * ones. Decode tokens are replicated on every rank; prefill chunks are split
 * by tokens over the attn_tp group when plan.sp_prefill. */
#ifndef Q3_SHARD_H
#define Q3_SHARD_H

#include "model/model.h"
#include "parallel/plan.h"

typedef struct q3_shard q3_shard;

struct q3_shard {
    q3_plan plan;          /* validated */
    q3_rank_assign a;      /* this rank's assignment */
    q3_plan_groups g;      /* this rank's groups */
    int nq, nkv;           /* local query heads, local KV heads */
    int dense_f;           /* local dense-MLP intermediate columns */
    int moe_f;             /* local moe_intermediate columns per expert */
    int vocab_n;           /* local vocab rows */
    q3_mat *wo_full;       /* [num_layers] whole o_proj (SP prefill), else NULL */
    void **owned;          /* copied MX slices */
    int n_owned, cap_owned;
};

/* Validate nothing (the plan is validated by the caller before loading);
 * build the groups (collective over the world), rewrite m's views and set
 * m->shard. 0, or -1 with q3_err. */
int q3_shard_apply(q3_model *m, const q3_plan *plan);
/* Free the shard of m (its groups and copies); m->shard becomes NULL. */
void q3_shard_free(q3_model *m);

/* Sum buf[0..n) over a group; no-op when the group is absent or of size 1. */
void q3_shard_allreduce(q3_group *g, float *buf, size_t n);

#endif
