/* Model hyper-parameters, read from a Hugging Face config.json
 * (Qwen3MoeForCausalLM or Qwen3ForCausalLM) and validated. */
#ifndef Q3_CONFIG_H
#define Q3_CONFIG_H

#include <stdint.h>

#define Q3_MAX_LAYERS 256

typedef struct {
    int is_moe;              /* model_type qwen3_moe */
    int vocab_size;
    int hidden_size;
    int intermediate_size;   /* dense MLP layers */
    int moe_intermediate_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int num_experts;
    int num_experts_per_tok;
    int norm_topk_prob;
    int decoder_sparse_step;
    int tie_word_embeddings;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    uint8_t layer_is_sparse[Q3_MAX_LAYERS];
    int bos_token_id;        /* -1 when absent */
    int eos_token_id;        /* -1 when absent */
    long long eos_past_vocab; /* an eos_token_id past the vocabulary, ignored (-1: none) */
} q3_config;

/* Parse and validate config.json at `path`. Unsupported options
 * (attention_bias, sliding window, rope_scaling) are refused. */
int q3_config_load(q3_config *c, const char *path);
/* The same from config.json text (NUL-terminated) held in memory, e.g. the
 * copy embedded in a .q3m file; `name` stands for the file in messages. */
int q3_config_parse(q3_config *c, const char *json_text, const char *name);

#endif
