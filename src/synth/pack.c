#include "synth/pack.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

typedef struct {
    q3_tensor_source src;
    q3_src_tensor *tensors;
    const synth_plan *plan;
    uint64_t seed;
    char *tok, *tokc;
} gen_source;

/* Generated into scratch: element i depends on (seed, name, i) only, so
 * the chunks the writer asks for give the bytes a safetensors file holds. */
static const void *gen_read(void *ctx, int i, uint64_t first, size_t n, void *scratch) {
    const gen_source *g = ctx;
    synth_fill(&g->plan->t[i], g->seed, first, n, scratch);
    return scratch;
}

static void gen_close(gen_source *g) {
    free(g->tensors);
    free(g->tok);
    free(g->tokc);
}

/* g must stay where it is while g->src is used (src.ctx points to it). */
static int gen_open(gen_source *g, const synth_plan *p, uint64_t seed, const char *config, const char *tok_dir) {
    memset(g, 0, sizeof *g);
    g->plan = p;
    g->seed = seed;
    g->tensors = q3_calloc((size_t)p->n + 1, sizeof *g->tensors);
    for (int i = 0; i < p->n; i++) {
        const synth_tensor *t = &p->t[i];
        g->tensors[i] = (q3_src_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                        .shape = {t->shape[0], t->shape[1]}};
    }
    /* Tensors in plan order: the order of the safetensors headers synth
     * writes, hence of a conversion of that directory. */
    g->src = (q3_tensor_source){.tensors = g->tensors, .n_tensors = p->n, .read = gen_read, .ctx = g,
                                .config = config, .config_len = strlen(config)};
    if (!tok_dir) return 0;
    /* The same files synth_copy_tokenizer copies into a directory. */
    char *json = q3_path_join(tok_dir, "tokenizer.json"), *cfg = q3_path_join(tok_dir, "tokenizer_config.json");
    int rc = 0;
    if (!(g->tok = q3_read_file(json, &g->src.tokenizer_len))) rc = -1;
    else if (q3_file_exists(cfg) && !(g->tokc = q3_read_file(cfg, &g->src.tokenizer_config_len))) rc = -1;
    g->src.tokenizer = g->tok;
    g->src.tokenizer_config = g->tokc;
    free(json);
    free(cfg);
    return rc;
}

int synth_pack(const synth_plan *p, uint64_t seed, const char *config, const char *tok_dir, const q3_pack_opts *o,
               q3_convert_stats *st) {
    gen_source g;
    int rc = gen_open(&g, p, seed, config, tok_dir);
    if (rc == 0) rc = q3_pack(&g.src, o, st);
    gen_close(&g);
    return rc;
}

int synth_pack_size(const synth_plan *p, const char *config, const char *tok_dir, q3_quant_scheme scheme,
                    uint64_t *file_size) {
    gen_source g;
    int rc = gen_open(&g, p, 0, config, tok_dir);
    if (rc == 0) rc = q3_pack_size(&g.src, scheme, file_size);
    gen_close(&g);
    return rc;
}
