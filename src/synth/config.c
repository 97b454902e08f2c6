#include "synth/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

char *synth_json_text(json_t *root, size_t flags) {
    char *text = json_dumps(root, flags);
    if (!text) {
        q3_err("cannot serialize JSON");
        return NULL;
    }
    /* Python's writers end the file with a newline; json_dumps does not. */
    size_t n = strlen(text);
    char *out = q3_malloc(n + 2);
    memcpy(out, text, n);
    out[n] = '\n';
    out[n + 1] = 0;
    free(text);
    return out;
}

int synth_dump_json(json_t *root, const char *path, size_t flags) {
    char *text = synth_json_text(root, flags);
    if (!text) return q3_err_prefix("%s", path);
    FILE *f = fopen(path, "wb");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    free(text);
    if (!ok) return q3_err("cannot write %s: %s", path, strerror(errno));
    return 0;
}

static void set_int(json_t *o, const char *k, long long v) { json_object_set_new(o, k, json_integer(v)); }
static void set_real(json_t *o, const char *k, double v) { json_object_set_new(o, k, json_real(v)); }
static void set_bool(json_t *o, const char *k, int v) { json_object_set_new(o, k, json_boolean(v)); }
static void set_str(json_t *o, const char *k, const char *v) { json_object_set_new(o, k, json_string(v)); }

static json_t *config_object(const synth_geom *g, const char *torch_dtype) {
    int moe = g->experts > 0;
    json_t *c = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string(moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
    json_object_set_new(c, "architectures", arch);
    set_str(c, "model_type", moe ? "qwen3_moe" : "qwen3");
    set_int(c, "vocab_size", g->vocab);
    set_int(c, "hidden_size", g->hidden);
    set_int(c, "intermediate_size", g->ffn);
    set_int(c, "num_hidden_layers", g->layers);
    set_int(c, "num_attention_heads", g->heads);
    set_int(c, "num_key_value_heads", g->kv_heads);
    set_int(c, "head_dim", g->head_dim);
    set_str(c, "hidden_act", "silu");
    set_int(c, "max_position_embeddings", g->max_pos);
    set_real(c, "rms_norm_eps", 1e-6);
    set_real(c, "rope_theta", g->rope_theta);
    json_object_set_new(c, "rope_scaling", json_null());
    set_bool(c, "attention_bias", 0);
    set_real(c, "attention_dropout", 0.0);
    set_bool(c, "use_sliding_window", 0);
    json_object_set_new(c, "sliding_window", json_null());
    set_int(c, "max_window_layers", g->layers);
    set_bool(c, "tie_word_embeddings", g->tie);
    set_str(c, "torch_dtype", torch_dtype);
    /* Qwen3's ids where the vocabulary holds them (a smaller random one has no such tokens) */
    json_object_set_new(c, "bos_token_id", g->vocab > 151643 ? json_integer(151643) : json_null());
    json_object_set_new(c, "eos_token_id", g->vocab > 151645 ? json_integer(151645) : json_null());
    set_real(c, "initializer_range", 0.02);
    set_bool(c, "use_cache", 1);
    set_str(c, "transformers_version", "4.51.0");
    if (moe) {
        set_int(c, "moe_intermediate_size", g->moe_ffn);
        set_int(c, "decoder_sparse_step", g->sparse_step);
        set_int(c, "num_experts", g->experts);
        set_int(c, "num_experts_per_tok", g->top_k);
        set_bool(c, "norm_topk_prob", g->norm_topk);
        json_t *mlp_only = json_array();
        for (int i = 0; i < g->n_mlp_only; i++) json_array_append_new(mlp_only, json_integer(g->mlp_only[i]));
        json_object_set_new(c, "mlp_only_layers", mlp_only);
        set_bool(c, "output_router_logits", 0);
        set_real(c, "router_aux_loss_coef", 0.001);
    }
    return c;
}

/* Precision 15 prints 1e-6 as "1e-06" and 0.02 as "0.02", as Python does,
 * instead of the 17-digit expansions. */
#define CONFIG_FLAGS (JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15))

char *synth_config_text(const synth_geom *g, const char *torch_dtype) {
    json_t *c = config_object(g, torch_dtype);
    char *text = synth_json_text(c, CONFIG_FLAGS);
    json_decref(c);
    return text;
}

int synth_write_config(const char *path, const synth_geom *g, const char *torch_dtype) {
    json_t *c = config_object(g, torch_dtype);
    int rc = synth_dump_json(c, path, CONFIG_FLAGS);
    json_decref(c);
    return rc;
}
