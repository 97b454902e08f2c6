/* A loaded Qwen3-MoE / Qwen3 model: config plus weight views into the
 * mmapped safetensors (big matrices are never copied; the small norm
 * vectors are widened to fp32 at load). */
#ifndef Q3_MODEL_H
#define Q3_MODEL_H

#include "io/q3m.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "quant/scheme.h"

struct q3_shard; /* model/shard.h */

typedef struct {
    q3_mat wq, wk, wv, wo;
    float *q_norm, *k_norm;       /* [head_dim] */
    float *attn_norm, *mlp_norm;  /* [hidden] */
    int sparse;
    q3_mat router;                /* [num_experts, hidden] */
    q3_mat *gate, *up, *down;     /* [num_experts] each */
    q3_mat ffn_gate, ffn_up, ffn_down; /* dense layers */
} q3_layer;

typedef struct {
    q3_config cfg;
    q3_st_archive st;             /* for a .q3m: a view of q3m->st (owned there) */
    q3_mat embed, lm_head;
    float *final_norm;
    q3_layer *layers;
    char *dir;                    /* the path given: checkpoint directory or .q3m file */
    /* How the weights are stored and whether MX linears quantize their
     * inputs ({BF16, BF16, 0} for a Hugging Face directory). */
    q3_quant_scheme scheme;
    q3m_file *q3m;                /* the packed file, when loaded from one (else NULL) */
    /* This rank's share in a multi-rank job (model/shard.h); NULL: one rank
     * holding the whole model. */
    struct q3_shard *shard;
} q3_model;

/* Load a model from `path`: a Hugging Face checkpoint directory (config.json
 * + safetensors) or a .q3m file written by `q3moe convert` (config and
 * tokenizer embedded, tensors possibly MX-quantized). Checks every expected
 * tensor's presence, rank and shape. */
int q3_model_load(q3_model *m, const char *path);
/* Only the config of a checkpoint directory or .q3m file. */
int q3_model_load_config(q3_config *c, const char *path);
void q3_model_free(q3_model *m);

#endif
