#include "synth/presets.h"

#include <string.h>

#include "util/error.h"

typedef struct {
    const char *name;
    synth_geom g;
} preset;

/* tiny / tiny-dense: small enough for tests and the demo, dims multiples of
 * 32, head_dim != hidden / heads and GQA so that the common shortcuts are
 * wrong, and the full Qwen3 vocabulary so the real tokenizer fits. The big
 * presets copy the published configs of Qwen3-30B-A3B and Qwen3-235B-A22B. */
static const preset presets[] = {
    {"tiny", {.layers = 4, .hidden = 256, .heads = 8, .kv_heads = 4, .head_dim = 64,
              .experts = 16, .top_k = 4, .moe_ffn = 128, .ffn = 512, .vocab = 151936,
              .max_pos = 40960, .sparse_step = 1, .norm_topk = 1, .tie = 0,
              .rope_theta = 1e6}},
    {"tiny-dense", {.layers = 4, .hidden = 256, .heads = 8, .kv_heads = 4, .head_dim = 64,
                    .experts = 0, .top_k = 0, .moe_ffn = 0, .ffn = 512, .vocab = 151936,
                    .max_pos = 40960, .sparse_step = 1, .norm_topk = 0, .tie = 1,
                    .rope_theta = 1e6}},
    {"qwen3-30b-a3b", {.layers = 48, .hidden = 2048, .heads = 32, .kv_heads = 4, .head_dim = 128,
                       .experts = 128, .top_k = 8, .moe_ffn = 768, .ffn = 6144, .vocab = 151936,
                       .max_pos = 40960, .sparse_step = 1, .norm_topk = 1, .tie = 0,
                       .rope_theta = 1e6}},
    {"qwen3-235b-a22b", {.layers = 94, .hidden = 4096, .heads = 64, .kv_heads = 4, .head_dim = 128,
                         .experts = 128, .top_k = 8, .moe_ffn = 1536, .ffn = 12288,
                         .vocab = 151936, .max_pos = 40960, .sparse_step = 1, .norm_topk = 1,
                         .tie = 0, .rope_theta = 1e6}},
};

#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const synth_geom *synth_preset(const char *name) {
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i].g;
    return NULL;
}

const char *synth_preset_list(void) { return "tiny, tiny-dense, qwen3-30b-a3b, qwen3-235b-a22b"; }

int synth_layer_is_sparse(const synth_geom *g, int l) {
    if (g->experts <= 0) return 0;
    for (int i = 0; i < g->n_mlp_only; i++)
        if (g->mlp_only[i] == l) return 0;
    return (l + 1) % g->sparse_step == 0;
}

/* Upper bound for any one dimension: keeps every size product well inside
 * 64 bits and every element count inside an int64 shape. */
#define DIM_MAX (1 << 20)

static int check_dim(const char *flag, int v, int lo) {
    if (v < lo || v > DIM_MAX) return q3_err("%s must be in [%d, %d] (got %d)", flag, lo, DIM_MAX, v);
    return 0;
}

int synth_geom_validate(const synth_geom *g) {
    if (g->layers < 1 || g->layers > Q3_MAX_LAYERS)
        return q3_err("--layers must be in [1, %d] (got %d)", Q3_MAX_LAYERS, g->layers);
    if (check_dim("--hidden", g->hidden, 1) || check_dim("--heads", g->heads, 1) ||
        check_dim("--kv-heads", g->kv_heads, 1) || check_dim("--head-dim", g->head_dim, 2) ||
        check_dim("--vocab", g->vocab, 1) || check_dim("--experts", g->experts, 0) ||
        check_dim("--sparse-step", g->sparse_step, 1))
        return -1;
    if (g->heads % g->kv_heads)
        return q3_err("--heads (%d) must be a multiple of --kv-heads (%d)", g->heads, g->kv_heads);
    if (g->head_dim % 2) return q3_err("--head-dim must be even for RoPE (got %d)", g->head_dim);
    if (g->norm_topk != 0 && g->norm_topk != 1) return q3_err("--norm-topk must be 0 or 1");
    if (g->tie != 0 && g->tie != 1) return q3_err("--tie must be 0 or 1");
    /* Positive even when every layer is sparse: config.json's
     * intermediate_size must be, for the loader as in Qwen3's configs. */
    if (check_dim("--ffn", g->ffn, 1)) return -1;
    if (g->experts > 0) {
        if (check_dim("--moe-ffn", g->moe_ffn, 1)) return -1;
        if (g->top_k < 1 || g->top_k > g->experts)
            return q3_err("--top-k must be in [1, --experts = %d] (got %d)", g->experts, g->top_k);
    } else if (g->n_mlp_only > 0) {
        return q3_err("--mlp-only-layers needs a mixture-of-experts model (--experts > 0)");
    }
    for (int i = 0; i < g->n_mlp_only; i++) {
        if (g->mlp_only[i] < 0 || g->mlp_only[i] >= g->layers)
            return q3_err("--mlp-only-layers: layer %d is not in [0, %d)", g->mlp_only[i], g->layers);
        for (int j = 0; j < i; j++)
            if (g->mlp_only[j] == g->mlp_only[i])
                return q3_err("--mlp-only-layers: layer %d listed twice", g->mlp_only[i]);
    }
    if (g->max_pos < 1) return q3_err("--max-pos must be positive (got %d)", g->max_pos);
    if (!(g->rope_theta > 1.0)) return q3_err("--rope-theta must be > 1 (got %g)", g->rope_theta);
    return 0;
}
