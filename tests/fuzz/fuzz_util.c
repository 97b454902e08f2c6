#include "fuzz_util.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "model/forward.h"
#include "model/model.h"
#include "util/error.h"

const char fuzz_micro_config[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"head_dim\": 32,"
    " \"hidden_size\": 64, \"intermediate_size\": 512, \"max_position_embeddings\": 40960,"
    " \"mlp_only_layers\": [], \"moe_intermediate_size\": 64, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 2, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 1,"
    " \"num_key_value_heads\": 1, \"decoder_sparse_step\": 1, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 64}";

static char g_dir[64];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_dir(void) {
    if (nftw(g_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS) != 0) fprintf(stderr, "fuzz: could not remove %s\n", g_dir);
}

const char *fuzz_dir(void) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/q3fuzz.XXXXXX");
        if (!mkdtemp(g_dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_dir);
    }
    return g_dir;
}

const char *fuzz_write(const char *name, const void *data, size_t n) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
    return path;
}

void fuzz_done(int rc) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "%s\n", rc == 0 ? "loaded" : q3_errmsg());
    q3_err_clear();
}

void fuzz_run_model(const void *model) {
    const q3_model *m = model;
    omp_set_num_threads(1);
    q3_state st;
    if (q3_state_init(&st, m, 8, 4)) {
        fprintf(stderr, "fuzz: no state for a loaded model: %s\n", q3_errmsg());
        abort();
    }
    const int V = m->cfg.vocab_size;
    const int32_t ids[3] = {1 % V, 2 % V, (V - 1) % V};
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!logits || q3_forward(m, &st, ids, 3, logits, 0) || q3_forward(m, &st, ids, 1, logits, 0)) {
        fprintf(stderr, "fuzz: a loaded model did not run: %s\n", q3_errmsg());
        abort();
    }
    free(logits);
    q3_state_free(&st);
}
