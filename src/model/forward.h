/* The forward pass and the per-sequence state it runs on (KV cache and
 * activation buffers, all sized once at creation: the decode step
 * allocates nothing). */
#ifndef Q3_FORWARD_H
#define Q3_FORWARD_H

#include <stdint.h>

#include "model/model.h"

/* Per-row work outside the matmuls (norms, RoPE, gating, gathers,
 * finalize) runs on all threads for a chunk of at least this many rows;
 * below it (decode) waking them costs more than the rows. Each row is
 * computed by one thread exactly as on one, so results do not depend on
 * the thread count. */
enum { Q3_PAR_ROWS = 16 };

typedef struct {
    int ctx;          /* KV cache capacity in tokens */
    int max_batch;    /* tokens per forward chunk (longer prompts are chunked) */
    int pos;          /* tokens already in the cache */
    int n_threads;
    /* [layers][kv_heads][ctx][head_dim], this rank's KV heads only: each
     * head's keys are one sequential stream for decode attention (rows of
     * all heads interleaved were 512-byte pieces 2 KiB apart, which the
     * hardware prefetchers barely followed: 5-8 GB/s from DRAM). */
    float *k_cache, *v_cache;
    float *rope_cos, *rope_sin;   /* [ctx][head_dim / 2] */
    /* activations for up to max_batch tokens */
    float *x, *xn, *q, *k, *v, *att, *proj;
    float *scores;                /* attention scratch (kernels/attention.h) */
    /* MoE routing */
    float *router;                /* [max_batch][num_experts] */
    int32_t *topk_id;             /* [max_batch * top_k] */
    float *topk_w;
    int32_t *expert_count, *expert_offset; /* [num_experts + 1] */
    int32_t *perm;                /* sorted index -> (token, slot) pair t*top_k+j */
    int32_t *perm_inv;            /* pair -> sorted index */
    float *xg, *h_gate, *h_out;   /* gathered rows per expert; h_gate: SwiGLU(gate, up) */
    q3_mm_job *moe_jobs;          /* [num_experts] */
    float *ffn_gate;              /* dense MLP: SwiGLU(gate, up) */
    /* lm_head TP (model/shard.h): this rank's vocab slice for up to lm_rows
     * tokens, and the gathered blocks; NULL without a vocab split. */
    int lm_rows;
    float *lm_local, *lm_gather;
    /* Set by the caller to sample distributed (sample/sampler.h): a call
     * asking for the last row only leaves this rank's slice of it in
     * lm_local[0..vocab_n) and gathers nothing (its logits argument must
     * still be non-NULL and is not written). */
    int lm_local_only;
    /* Set around an A8 MoE layer (forward.c's mlp_block): s->proj holds the
     * MXFP8 copy of the T normed rows of s->xn, for the experts. */
    int xq_in_proj;
    /* MoE EP over AlltoAll (model/moe.c; only when the plan asks for it). */
    float *a2a_send, *a2a_recv;
    int32_t *a2a_pos;             /* own (token, slot) pair -> packed dispatch row */
    size_t *a2a_counts;           /* [4 * moe_ep_size] */
    int32_t *a2a_ecount;          /* [2 * num_experts]: per-expert rows sent / received */
    /* Sequence-parallel prefill (forward.c, plan.sp_prefill): a chunk is
     * padded to rows = a multiple of attn_tp_size and split into sp_rows
     * tokens per rank; the per-token buffers above hold that many rows. */
    int sp_rows;                  /* max tokens per rank (0: no SP) */
    float *sp_att;                /* [sp_rows][num_heads * head_dim]: own tokens, all heads */
    float *sp_moe;                /* [sp_rows * attn_tp][H + 2 top_k]: rows + routing (MoE allgather) */
    float *sp_out;                /* [sp_rows][H]: reduce-scatter result */
    uint8_t *comm_wire;           /* MXFP8 payload scratch (comm_quant mxfp8), else NULL */
    /* Optional instrumentation (NULL unless the caller allocates it):
     * tokens routed to each expert, [layers][num_experts], accumulated:
     * every token of the chunk, except in a sequence-parallel prefill with
     * AlltoAll EP, where each rank counts its own rows. */
    uint64_t *expert_hits;
    /* Optional instrumentation (bench --comm-stats): called with layer -1
     * before the first layer of every chunk and with l after layer l, T the
     * chunk's tokens. NULL: not called. */
    void (*layer_hook)(void *ctx, int layer, int T);
    void *layer_hook_ctx;
} q3_state;

#define Q3_LM_ROWS 16

/* ctx <= 0 picks min(max_position_embeddings, 4096). */
int q3_state_init(q3_state *s, const q3_model *m, int ctx, int max_batch);
void q3_state_free(q3_state *s);
/* Forget the sequence (pos = 0); the cache is overwritten as it refills. */
void q3_state_reset(q3_state *s);
/* Keep the first pos tokens (0 <= pos <= s->pos), forgetting the rest. */
void q3_state_truncate(q3_state *s, int pos);

/* Run n tokens at positions [s->pos, s->pos + n) and append them to the
 * cache. logits (may be NULL): when all_rows, n rows of vocab_size floats,
 * one per token; otherwise only the last token's row. Errors (id out of
 * vocab, context exhausted) leave the state unchanged. */
int q3_forward(const q3_model *m, q3_state *s, const int32_t *ids, int n, float *logits, int all_rows);

/* Quantize `rows` input rows of linear W to MXFP8 in place when the model
 * runs with MX activations and W is an MX matrix (no-op otherwise). */
void q3_act_quant(const q3_model *m, const q3_mat *W, float *x, int rows, size_t ld);

/* Row-parallel helper (Q3_PAR_ROWS) for rows of n floats: x += d. */
void q3_add_rows(float *x, const float *d, int rows, int n);

#endif
