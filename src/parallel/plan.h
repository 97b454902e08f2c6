/* The parallel plan: how a model is split over the ranks of one job.
 *
 * Sources, later ones overriding earlier ones: the defaults below, a YAML
 * file (q3_plan_load_yaml), command-line flags (q3_plan_parse_arg):
 *
 *     model_path: /models/Qwen3-30B-A3B
 *     parallel_config:
 *       attn_tp_size: 4      # --attn-tp N    default: world size
 *       moe_tp_size: 1       # --moe-tp N     default: world / moe_ep_size
 *       moe_ep_size: 4       # --moe-ep N     default: world / moe_tp_size
 *                            #                (the world when neither is set)
 *       lmhead_tp_size: 4    # --lmhead-tp N  default: world size
 *       moe_ep_comm: auto    # --moe-ep-comm auto|allgather|alltoall
 *       comm_quant: mxfp8    # --comm-quant none|mxfp8
 *
 * q3_plan_validate resolves the defaults against a world size and a model
 * config, checks every rule (messages name the key and the rule) and picks
 * the EP communication. The assignment is a pure function of the validated
 * plan and a rank (q3_plan_rank); the groups are built from the same
 * colors (q3_plan_group_color, q3_plan_make_groups).
 *
 * Layout of the world's ranks r = 0 .. W-1 (A = attn_tp_size, E =
 * moe_ep_size, T = moe_tp_size, L = lmhead_tp_size):
 *   attn_tp group   ranks [g A, (g+1) A), attention rank r % A; W / A
 *                   groups compute the same attention (replicas).
 *   moe_ep group    ranks [g E, (g+1) E), EP rank r % E: experts
 *                   [e N/E, (e+1) N/E) of the N experts.
 *   moe_tp group    ranks {r' : r' % E == r % E}, TP rank r / E: columns
 *                   [t I/T, (t+1) I/T) of every local expert's
 *                   moe_intermediate_size I.
 *   lmhead group    ranks [g L, (g+1) L), vocab rows [l V/L, (l+1) V/L).
 *   Query heads of attention rank a: [a Q/A, (a+1) Q/A); its KV heads are
 *   the ones those query heads read: K/A of them when A <= K, else the
 *   single head (a Q/A) / (Q/K), replicated on A/K ranks. Dense MLP layers
 *   (if any) split their intermediate_size over the attn_tp group.
 * Sequence-parallel (SP) prefill shards the prompt's tokens over the
 * attn_tp group and hands the shards to the EP group without regathering;
 * that needs the two groups to coincide (attn_tp_size == moe_ep_size).
 * With comm_quant mxfp8 it also needs each rank's attention output
 * (num_heads / attn_tp_size * head_dim) to be whole 32-blocks. */
#ifndef Q3_PARALLEL_PLAN_H
#define Q3_PARALLEL_PLAN_H

#include <stdio.h>

#include "model/config.h"
#include "parallel/comm.h"

typedef enum { Q3_EP_COMM_AUTO = 0, Q3_EP_COMM_ALLGATHER, Q3_EP_COMM_ALLTOALL } q3_ep_comm;
typedef enum { Q3_COMM_QUANT_NONE = 0, Q3_COMM_QUANT_MXFP8 } q3_comm_quant;

typedef enum { Q3_GROUP_ATTN_TP = 0, Q3_GROUP_MOE_EP, Q3_GROUP_MOE_TP, Q3_GROUP_LMHEAD, Q3_GROUP_N } q3_group_kind;

typedef struct {
    char model_path[1024];      /* "" unless set by YAML */
    /* requested (0: default, resolved by q3_plan_validate) */
    int attn_tp_size, moe_tp_size, moe_ep_size, lmhead_tp_size;
    q3_ep_comm moe_ep_comm;     /* as requested (may be AUTO) */
    q3_comm_quant comm_quant;

    /* ---- set by q3_plan_validate ---- */
    int validated;
    int world_size;
    q3_ep_comm ep_comm;         /* resolved: ALLGATHER or ALLTOALL */
    char ep_comm_reason[256];
    int sp_prefill;             /* 1: sequence-parallel prefill possible */
    char sp_note[256];          /* why not, when sp_prefill == 0 */
    int mx_weights;
    /* the model geometry the assignment needs */
    int is_moe, has_dense, hidden, num_layers, num_heads, num_kv_heads, head_dim;
    int num_experts, top_k, moe_intermediate, intermediate, vocab;
} q3_plan;

/* What one rank holds. Ranges are half-open [lo, hi). */
typedef struct {
    int rank;
    int attn_group, attn_rank;      /* attn_tp group index, rank in it */
    int q_lo, q_hi;                 /* query heads */
    int kv_lo, kv_hi;               /* KV heads */
    int kv_replicas;                /* ranks of the group holding each of those KV heads */
    int dense_lo, dense_hi;         /* dense-MLP intermediate columns (0, 0 when none) */
    int ep_group, ep_rank;          /* moe_ep group index (= TP rank), rank in it */
    int expert_lo, expert_hi;
    int tp_group, tp_rank;          /* moe_tp group index (= EP rank), rank in it */
    int inter_lo, inter_hi;         /* moe_intermediate columns of each local expert */
    int lmhead_group, lmhead_rank;
    int vocab_lo, vocab_hi;
} q3_rank_assign;

void q3_plan_init(q3_plan *p);
/* Read a plan file (keys above; unknown keys, duplicates, wrong types are
 * errors naming the key and line). 0, or -1 with q3_err. */
int q3_plan_load_yaml(q3_plan *p, const char *path);
/* Set one parallel_config key from text (the YAML loader and the flags
 * share it). `where` prefixes the message (e.g. "run.yaml:3" or
 * "--attn-tp"). 0, or -1 with q3_err. */
int q3_plan_set(q3_plan *p, const char *key, const char *value, const char *where);
/* Try to consume argv[*i] (and its value) as one of --attn-tp --moe-tp
 * --moe-ep --lmhead-tp --moe-ep-comm --comm-quant: 1 consumed, 0 not ours,
 * -1 bad (q3_err holds the message). */
int q3_plan_parse_arg(q3_plan *p, int argc, char **argv, int *i);
/* Help text for those flags. */
void q3_plan_flags_help(FILE *f);

/* Resolve defaults, check every rule against world_size and the model,
 * pick the EP communication. mx_weights: the FFN weights are MX-quantized
 * (blocks of 32 along moe_intermediate). 0, or -1 with q3_err. */
int q3_plan_validate(q3_plan *p, int world_size, const q3_config *c, int mx_weights);
/* The assignment of `rank` (validated plan). */
void q3_plan_rank(const q3_plan *p, int rank, q3_rank_assign *a);
/* MPI_Comm_split color and key of `rank` for a group kind. */
void q3_plan_group_color(const q3_plan *p, q3_group_kind kind, int rank, int *color, int *key);
const char *q3_group_kind_name(q3_group_kind kind);

typedef struct {
    q3_group *world, *attn_tp, *moe_ep, *moe_tp, *lmhead;
} q3_plan_groups;
/* Collective over the world: split it into this rank's groups. The world
 * size must equal the plan's. 0, or -1 with q3_err. */
int q3_plan_make_groups(const q3_plan *p, q3_plan_groups *g);
void q3_plan_free_groups(q3_plan_groups *g);

const char *q3_ep_comm_name(q3_ep_comm c);
const char *q3_comm_quant_name(q3_comm_quant q);
/* Sizes, EP choice and reason, SP note, the groups and one line per rank. */
void q3_plan_print(FILE *f, const q3_plan *p);
/* The SP note, printed once per process (nothing when SP is on). */
void q3_plan_note_once(FILE *f, const q3_plan *p);

#endif
