#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

/* Integer field: missing -> default (or an error when required). */
static int get_int(const char *path, json_t *root, const char *key, int required, long dflt, long lo, long hi, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return q3_err("%s: missing required field \"%s\"", path, key);
        *out = (int)dflt;
        return 0;
    }
    if (!json_is_integer(v)) return q3_err("%s: field \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return q3_err("%s: field \"%s\" = %lld is out of range [%ld, %ld]", path, key, (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

static int get_num(const char *path, json_t *root, const char *key, double dflt, double lo, double hi, float *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = (float)dflt;
        return 0;
    }
    if (!json_is_number(v)) return q3_err("%s: field \"%s\" must be a number", path, key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return q3_err("%s: field \"%s\" = %g is out of range [%g, %g]", path, key, x, lo, hi);
    *out = (float)x;
    return 0;
}

static int get_bool(const char *path, json_t *root, const char *key, int dflt, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return q3_err("%s: field \"%s\" must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

/* Options the engine does not implement must be refused, never ignored. */
static int refuse_unsupported(const char *path, json_t *root) {
    int b;
    if (get_bool(path, root, "attention_bias", 0, &b)) return -1;
    if (b) return q3_err("%s: \"attention_bias\": true is not supported (Qwen3 has no attention bias)", path);
    if (get_bool(path, root, "use_sliding_window", 0, &b)) return -1;
    if (b) return q3_err("%s: \"use_sliding_window\": true is not supported", path);
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) return q3_err("%s: \"rope_scaling\" is set; RoPE scaling (YaRN etc.) is not supported", path);
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return q3_err("%s: \"hidden_act\" must be \"silu\"", path);
    return 0;
}

/* "eos_token_id": absent or null (-1), a token id, or a non-empty list of
 * them (the first is kept: the tokenizer names the chat's end tokens). An
 * id past the vocabulary can never be sampled: it is ignored, and kept in
 * *past for the caller to mention (synth wrote Qwen3's 151645 into small
 * random vocabularies until 2026-12-08, and those checkpoints still load). */
static int get_eos(const char *path, json_t *root, int vocab, int *out, long long *past) {
    json_t *v = json_object_get(root, "eos_token_id");
    *out = -1, *past = -1;
    if (!v || json_is_null(v)) return 0;
    const size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n == 0) return q3_err("%s: field \"eos_token_id\" is an empty list", path);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return q3_err("%s: field \"eos_token_id\" must be a token id or a non-empty list of them", path);
        if (i == 0 && json_integer_value(e) < vocab) *out = (int)json_integer_value(e);
        else if (i == 0) *past = (long long)json_integer_value(e);
    }
    return 0;
}

static int parse(q3_config *c, const char *path, json_t *root) {
    const long BIG = 1l << 20;
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) return q3_err("%s: missing \"model_type\" (expected \"qwen3_moe\" or \"qwen3\")", path);
    const char *type = json_string_value(mt);
    if (!strcmp(type, "qwen3_moe")) c->is_moe = 1;
    else if (!strcmp(type, "qwen3")) c->is_moe = 0;
    else return q3_err("%s: \"model_type\" is \"%s\"; only \"qwen3_moe\" and \"qwen3\" are supported", path, type);
    if (refuse_unsupported(path, root)) return -1;

    if (get_int(path, root, "vocab_size", 1, 0, 1, 1l << 24, &c->vocab_size) ||
        get_int(path, root, "hidden_size", 1, 0, 1, BIG, &c->hidden_size) ||
        get_int(path, root, "num_hidden_layers", 1, 0, 1, Q3_MAX_LAYERS, &c->num_layers) ||
        get_int(path, root, "num_attention_heads", 1, 0, 1, 4096, &c->num_heads) ||
        get_int(path, root, "num_key_value_heads", 0, c->num_heads, 1, 4096, &c->num_kv_heads) ||
        get_int(path, root, "head_dim", 0, c->hidden_size / c->num_heads, 2, 4096, &c->head_dim) ||
        get_int(path, root, "max_position_embeddings", 0, 32768, 1, 1l << 24, &c->max_position_embeddings) ||
        get_bool(path, root, "tie_word_embeddings", 0, &c->tie_word_embeddings) ||
        get_num(path, root, "rms_norm_eps", 1e-6, 0, 1, &c->rms_norm_eps) ||
        get_num(path, root, "rope_theta", 10000, 1, 1e12, &c->rope_theta) ||
        get_int(path, root, "bos_token_id", 0, -1, -1, 1l << 24, &c->bos_token_id))
        return -1;
    if (get_eos(path, root, c->vocab_size, &c->eos_token_id, &c->eos_past_vocab)) return -1;
    if (c->num_heads % c->num_kv_heads)
        return q3_err("%s: \"num_attention_heads\" (%d) must be a multiple of \"num_key_value_heads\" (%d)", path,
                      c->num_heads, c->num_kv_heads);
    if (c->head_dim > 512) return q3_err("%s: \"head_dim\" (%d) is larger than the supported 512", path, c->head_dim);
    if (c->head_dim % 2) return q3_err("%s: \"head_dim\" (%d) must be even for RoPE", path, c->head_dim);

    /* Dense MLP layers exist in dense models and in MoE models with mlp_only_layers. */
    if (get_int(path, root, "intermediate_size", !c->is_moe, 0, 1, BIG, &c->intermediate_size)) return -1;
    memset(c->layer_is_sparse, 0, sizeof c->layer_is_sparse);
    if (!c->is_moe) return 0;

    if (get_int(path, root, "num_experts", 1, 0, 1, 1 << 16, &c->num_experts) ||
        get_int(path, root, "num_experts_per_tok", 1, 0, 1, 1 << 16, &c->num_experts_per_tok) ||
        get_int(path, root, "moe_intermediate_size", 1, 0, 1, BIG, &c->moe_intermediate_size) ||
        get_int(path, root, "decoder_sparse_step", 0, 1, 1, Q3_MAX_LAYERS, &c->decoder_sparse_step) ||
        get_bool(path, root, "norm_topk_prob", 0, &c->norm_topk_prob))
        return -1;
    if (c->num_experts_per_tok > c->num_experts)
        return q3_err("%s: \"num_experts_per_tok\" (%d) exceeds \"num_experts\" (%d)", path, c->num_experts_per_tok,
                      c->num_experts);
    uint8_t mlp_only[Q3_MAX_LAYERS] = {0};
    json_t *mo = json_object_get(root, "mlp_only_layers");
    if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo)) return q3_err("%s: \"mlp_only_layers\" must be a list of layer indices", path);
        size_t i;
        json_t *x;
        json_array_foreach(mo, i, x) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->num_layers)
                return q3_err("%s: \"mlp_only_layers\"[%zu] is not a layer index in [0, %d)", path, i, c->num_layers);
            mlp_only[json_integer_value(x)] = 1;
        }
    }
    int any_dense = 0;
    for (int l = 0; l < c->num_layers; l++) {
        c->layer_is_sparse[l] = !mlp_only[l] && (l + 1) % c->decoder_sparse_step == 0;
        any_dense |= !c->layer_is_sparse[l];
    }
    if (any_dense && c->intermediate_size <= 0)
        return q3_err("%s: \"intermediate_size\" is required because some layers are dense (mlp_only_layers / decoder_sparse_step)", path);
    return 0;
}

int q3_config_parse(q3_config *c, const char *json_text, const char *name) {
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    if (!root) return q3_err("%s: not valid JSON: %s (line %d, column %d)", name, jerr.text, jerr.line, jerr.column);
    int rc = json_is_object(root) ? parse(c, name, root) : q3_err("%s: not a JSON object", name);
    json_decref(root);
    return rc;
}

int q3_config_load(q3_config *c, const char *path) {
    memset(c, 0, sizeof *c);
    size_t len;
    char *text = q3_read_file(path, &len);
    if (!text) return -1; /* "cannot open PATH: reason" */
    int rc = strlen(text) != len ? q3_err("%s: not valid JSON: contains a NUL byte", path) : q3_config_parse(c, text, path);
    free(text);
    return rc;
}
