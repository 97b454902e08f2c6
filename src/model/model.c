#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/shard.h"
#include "quant/bf16p.h"
#include "util/error.h"

static const q3_st_tensor *need(const q3_model *m, const char *name, int64_t d0, int64_t d1) {
    const q3_st_tensor *t = q3_st_find(&m->st, name);
    if (!t) {
        q3_err("missing tensor %s in %s", name, m->dir);
        return NULL;
    }
    int want_nd = d1 ? 2 : 1;
    if (t->ndim != want_nd || t->shape[0] != d0 || (want_nd == 2 && t->shape[1] != d1)) {
        char got[96] = "[", buf[32];
        for (int i = 0; i < t->ndim; i++) {
            snprintf(buf, sizeof buf, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
            strncat(got, buf, sizeof got - strlen(got) - 2);
        }
        strcat(got, "]");
        if (want_nd == 2)
            q3_err("tensor %s has shape %s but config.json implies [%lld, %lld]", name, got, (long long)d0, (long long)d1);
        else
            q3_err("tensor %s has shape %s but config.json implies [%lld]", name, got, (long long)d0);
        return NULL;
    }
    return t;
}

/* Any dtype, MX included (a .q3m's quantized projections). */
static int get_mat(const q3_model *m, q3_mat *out, const char *name, int rows, int cols) {
    const q3_st_tensor *t = need(m, name, rows, cols);
    if (!t) return -1;
    *out = (q3_mat){.data = t->data, .dtype = t->dtype, .rows = rows, .cols = cols, .scales = t->scales,
                    .a8 = q3_dtype_is_mx(m->scheme.act) && q3_dtype_is_mx(t->dtype),
                    .ai8 = m->scheme.act == Q3_MXINT8 && q3_dtype_is_mx(t->dtype),
                    .side_groups = t->dtype == Q3_BF16P ? t->scales_nbytes / Q3_BF16P_RAW_BYTES : 0};
    return 0;
}

/* Tensors read element by element (norm vectors, embedding rows) must be in
 * a plain dtype. */
static int need_plain(const q3_model *m, const q3_st_tensor *t) {
    if (t && !q3_dtype_is_plain(t->dtype))
        return q3_err("tensor %s in %s has dtype %s; it must be F32, F16 or BF16", t->name, m->dir, q3_dtype_name(t->dtype));
    return t ? 0 : -1;
}

static int get_vec(const q3_model *m, float **out, const char *name, int n) {
    const q3_st_tensor *t = need(m, name, n, 0);
    if (need_plain(m, t)) return -1;
    *out = q3_malloc((size_t)n * sizeof(float));
    q3_to_f32(*out, t->data, t->dtype, 0, (size_t)n);
    return 0;
}

static int load_layer(q3_model *m, int l) {
    const q3_config *c = &m->cfg;
    q3_layer *L = &m->layers[l];
    char n[256];
    const int H = c->hidden_size, D = c->head_dim;
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if (get_vec(m, &L->attn_norm, NAME("model.layers.%d.input_layernorm.weight", l), H) ||
        get_vec(m, &L->mlp_norm, NAME("model.layers.%d.post_attention_layernorm.weight", l), H) ||
        get_mat(m, &L->wq, NAME("model.layers.%d.self_attn.q_proj.weight", l), c->num_heads * D, H) ||
        get_mat(m, &L->wk, NAME("model.layers.%d.self_attn.k_proj.weight", l), c->num_kv_heads * D, H) ||
        get_mat(m, &L->wv, NAME("model.layers.%d.self_attn.v_proj.weight", l), c->num_kv_heads * D, H) ||
        get_mat(m, &L->wo, NAME("model.layers.%d.self_attn.o_proj.weight", l), H, c->num_heads * D) ||
        get_vec(m, &L->q_norm, NAME("model.layers.%d.self_attn.q_norm.weight", l), D) ||
        get_vec(m, &L->k_norm, NAME("model.layers.%d.self_attn.k_norm.weight", l), D))
        return -1;
    L->sparse = c->layer_is_sparse[l];
    if (!L->sparse) {
        const int F = c->intermediate_size;
        return get_mat(m, &L->ffn_gate, NAME("model.layers.%d.mlp.gate_proj.weight", l), F, H) ||
                       get_mat(m, &L->ffn_up, NAME("model.layers.%d.mlp.up_proj.weight", l), F, H) ||
                       get_mat(m, &L->ffn_down, NAME("model.layers.%d.mlp.down_proj.weight", l), H, F)
                   ? -1
                   : 0;
    }
    const int E = c->num_experts, F = c->moe_intermediate_size;
    if (get_mat(m, &L->router, NAME("model.layers.%d.mlp.gate.weight", l), E, H)) return -1;
    L->gate = q3_calloc((size_t)E, sizeof(q3_mat));
    L->up = q3_calloc((size_t)E, sizeof(q3_mat));
    L->down = q3_calloc((size_t)E, sizeof(q3_mat));
    for (int e = 0; e < E; e++)
        if (get_mat(m, &L->gate[e], NAME("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e), F, H) ||
            get_mat(m, &L->up[e], NAME("model.layers.%d.mlp.experts.%d.up_proj.weight", l, e), F, H) ||
            get_mat(m, &L->down[e], NAME("model.layers.%d.mlp.experts.%d.down_proj.weight", l, e), H, F))
            return -1;
#undef NAME
    return 0;
}

/* The model stored in a .q3m file: config from its embedded config.json,
 * tensors from its table (views into its mapping). */
static int open_q3m(q3_model *m, const char *path) {
    m->q3m = q3_malloc(sizeof *m->q3m);
    if (q3m_open(m->q3m, path)) {
        free(m->q3m);
        m->q3m = NULL;
        return -1;
    }
    char *name = q3_malloc(strlen(path) + 32);
    sprintf(name, "%s (embedded config.json)", path);
    int rc = q3_config_parse(&m->cfg, m->q3m->config_json, name);
    free(name);
    if (rc) return -1;
    m->st = m->q3m->st;
    m->scheme = m->q3m->scheme;
    /* As for safetensors: map a file that fits comfortably in memory in full
     * up front, so decode never stalls on a first-touch page fault. */
    if (m->q3m->st.files[0].size < q3_mem_available() / 4 * 3) q3_prefault(&m->q3m->st.files[0]);
    return 0;
}

static int open_dir(q3_model *m, const char *dir) {
    char *cfg_path = q3_path_join(dir, "config.json");
    int rc = 0;
    if (!q3_file_exists(cfg_path)) rc = q3_err("%s has no config.json: not a Hugging Face checkpoint directory", dir);
    else rc = q3_config_load(&m->cfg, cfg_path);
    free(cfg_path);
    if (rc == 0) rc = q3_st_open_dir(&m->st, dir);
    m->scheme = (q3_quant_scheme){Q3_BF16, Q3_BF16, Q3_F32, Q3_BF16};
    return rc;
}

int q3_model_load_config(q3_config *c, const char *path) {
    if (q3_is_dir(path)) {
        char *cfg_path = q3_path_join(path, "config.json");
        int rc = q3_file_exists(cfg_path) ? q3_config_load(c, cfg_path)
                                          : q3_err("%s has no config.json: not a Hugging Face checkpoint directory", path);
        free(cfg_path);
        return rc;
    }
    if (!q3_file_exists(path)) return q3_err("%s does not exist (expected a checkpoint directory or a .q3m file)", path);
    q3m_file f;
    if (q3m_open(&f, path)) return -1;
    char *name = q3_malloc(strlen(path) + 32);
    sprintf(name, "%s (embedded config.json)", path);
    int rc = q3_config_parse(c, f.config_json, name);
    free(name);
    q3m_close(&f);
    return rc;
}

int q3_model_load(q3_model *m, const char *path) {
    memset(m, 0, sizeof *m);
    int rc;
    if (q3_is_dir(path)) {
        m->dir = q3_strdup(path);
        rc = open_dir(m, path);
    } else if (q3_file_exists(path)) {
        m->dir = q3_strdup(path);
        rc = open_q3m(m, path);
    } else {
        return q3_err("%s does not exist (expected a checkpoint directory or a .q3m file)", path);
    }
    if (rc) {
        q3_model_free(m);
        return -1;
    }
    const q3_config *c = &m->cfg;
    m->layers = q3_calloc((size_t)c->num_layers, sizeof(q3_layer));
    rc = get_mat(m, &m->embed, "model.embed_tokens.weight", c->vocab_size, c->hidden_size) ||
         need_plain(m, q3_st_find(&m->st, "model.embed_tokens.weight")) ||
         get_vec(m, &m->final_norm, "model.norm.weight", c->hidden_size);
    if (rc == 0) {
        if (c->tie_word_embeddings) m->lm_head = m->embed;
        else rc = get_mat(m, &m->lm_head, "lm_head.weight", c->vocab_size, c->hidden_size);
    }
    for (int l = 0; rc == 0 && l < c->num_layers; l++) rc = load_layer(m, l);
    if (rc) {
        q3_model_free(m);
        return -1;
    }
    return 0;
}

void q3_model_free(q3_model *m) {
    q3_shard_free(m);
    if (m->layers)
        for (int l = 0; l < m->cfg.num_layers; l++) {
            q3_layer *L = &m->layers[l];
            free(L->q_norm);
            free(L->k_norm);
            free(L->attn_norm);
            free(L->mlp_norm);
            free(L->gate);
            free(L->up);
            free(L->down);
        }
    free(m->layers);
    free(m->final_norm);
    free(m->dir);
    if (m->q3m) {
        q3m_close(m->q3m); /* m->st is a view of m->q3m->st */
        free(m->q3m);
    } else q3_st_close(&m->st);
    memset(m, 0, sizeof *m);
}
