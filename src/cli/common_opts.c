#include "cli/common_opts.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "quant/cache.h"
#include "util/error.h"
#include "util/file.h"

/* The resolved model path (a global so it stays reachable until exit). */
static char *g_model_path;

void common_opts_init(common_opts *o) {
    memset(o, 0, sizeof *o);
    q3_sampler_defaults(&o->sp);
    /* Qwen3's recommended settings for thinking mode. */
    o->sp.temperature = 0.6f;
    o->sp.top_k = 20;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.0f;
}

void common_opts_help(FILE *f) {
    fprintf(f, "  -m DIR               Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json),\n"
               "                       or a .q3m file written by q3moe convert\n"
               "  --quant SCHEME       run DIR quantized: w4a8, w8a8, w4a8i, w8a8i, w4, w8, bf16 or bf16p; converted once into the cache\n"
               "                       ($Q3MOE_CACHE_DIR, else $XDG_CACHE_HOME/q3moe or ~/.cache/q3moe)\n"
               "  --ctx N              context size in tokens (default min(max_position_embeddings, 4096))\n"
               "  -t THREADS           worker threads (default: all cores)\n"
               "  --temp T             temperature, 0 = greedy (default 0.6)\n"
               "  --top-k K            keep the K most likely tokens, 0 = off (default 20)\n"
               "  --top-p P            nucleus sampling mass, 1 = off (default 0.95)\n"
               "  --min-p P            drop tokens below P x the top probability, 0 = off (default 0)\n"
               "  --repeat-penalty R   penalty for the last 64 tokens, 1 = off (default 1)\n"
               "  --seed S             RNG seed (default: from the clock)\n"
               "  --mlock              lock the model's files in RAM (never paged out; needs ulimit -l)\n"
               "  --hugepages          copy the model into transparent huge pages instead of mapping it: faster\n"
               "                       decode (experts are scattered over the file), a copy at start-up, one process\n");
}

int common_opts_parse(common_opts *o, int argc, char **argv, int *i) {
    static const char *opts[] = {"-m", "--ctx", "-t", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed", "--quant"};
    const char *a = argv[*i];
    if (!strcmp(a, "--mlock")) {
        q3_mlock_set(1);
        return 1;
    }
    if (!strcmp(a, "--hugepages")) {
        q3_hugepages_set(1);
        return 1;
    }
    size_t k = 0;
    while (k < sizeof opts / sizeof opts[0] && strcmp(a, opts[k])) k++;
    if (k == sizeof opts / sizeof opts[0]) return 0;
    const char *v = arg_value(argc, argv, i);
    if (!v) return -1;
    long l;
    double d;
    switch (k) {
    case 0: o->model_dir = v; return 1;
    case 1: return arg_int(a, v, 1, 1l << 24, &o->ctx) ? -1 : 1;
    case 2: return arg_int(a, v, 1, 1024, &o->threads) ? -1 : 1;
    case 3: if (arg_float(a, v, 0, 100, &d)) return -1; o->sp.temperature = (float)d; return 1;
    case 4: if (arg_int(a, v, 0, 1l << 24, &l)) return -1; o->sp.top_k = (int)l; return 1;
    case 5: if (arg_float(a, v, 0, 1, &d)) return -1; o->sp.top_p = (float)d; return 1;
    case 6: if (arg_float(a, v, 0, 1, &d)) return -1; o->sp.min_p = (float)d; return 1;
    case 7: if (arg_float(a, v, 0.01, 100, &d)) return -1; o->sp.repeat_penalty = (float)d; return 1;
    case 8: if (arg_int(a, v, 0, 0x7fffffffffffffffl, &l)) return -1; o->sp.seed = (uint64_t)l; o->seed_given = 1; return 1;
    case 9: o->quant = v; return 1;
    }
    return 0;
}

void common_opts_finish(common_opts *o) {
    if (!o->seed_given) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o->sp.seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
    }
    if (o->model_dir && o->quant) {
        free(g_model_path);
        if (q3_resolve_model(o->model_dir, o->quant, &g_model_path)) {
            q3_print_error();
            exit(1);
        }
        o->model_dir = g_model_path;
    }
}
