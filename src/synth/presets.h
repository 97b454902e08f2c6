/* Model geometries for `q3moe synth`: named presets, the rule deciding
 * which layers are sparse, and validation with messages naming the flag a
 * user would change. */
#ifndef Q3_SYNTH_PRESETS_H
#define Q3_SYNTH_PRESETS_H

#include <stdint.h>

#include "model/config.h"

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim;
    int experts, top_k, moe_ffn;   /* experts == 0: a dense Qwen3 model */
    int ffn;                       /* intermediate_size of dense MLP layers */
    int vocab, max_pos;
    int sparse_step, norm_topk, tie;
    double rope_theta;
    int n_mlp_only;
    int mlp_only[Q3_MAX_LAYERS];
} synth_geom;

/* The preset called `name`, or NULL. */
const synth_geom *synth_preset(const char *name);
/* Comma-separated preset names, for help and error messages. */
const char *synth_preset_list(void);

/* Layer l has a mixture-of-experts MLP (the transformers Qwen3-MoE rule). */
int synth_layer_is_sparse(const synth_geom *g, int l);

/* Check a geometry; -1 with q3_err naming the offending flag. */
int synth_geom_validate(const synth_geom *g);

#endif
