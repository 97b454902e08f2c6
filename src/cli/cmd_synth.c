/* q3moe synth: write a random-weight Hugging Face checkpoint of a chosen
 * geometry (config.json, safetensors, optionally the tokenizer), for tests,
 * demos and benchmarks without downloading real weights; or, given -o
 * FILE.q3m, the packed and quantized file `q3moe convert` would make of it,
 * without the checkpoint in between. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "quant/convert.h"
#include "synth/config.h"
#include "synth/dir.h"
#include "synth/pack.h"
#include "synth/presets.h"
#include "synth/weights.h"
#include "synth/write.h"
#include "util/error.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: q3moe synth -o DIR [options]\n"
        "       q3moe synth -o FILE.q3m [--quant S | --ffn T --attn T --act A --head T] [options]\n\n"
        "Write a Hugging Face checkpoint (config.json, *.safetensors, tokenizer) with\n"
        "deterministic random weights. With an -o ending in .q3m, write instead the packed\n"
        "file `q3moe convert` would make of that checkpoint (byte for byte the same), tensor\n"
        "by tensor, without the checkpoint ever being on disk.\n\n"
        "  -o, --output DIR       output directory (created; must be empty unless --force)\n"
        "  -o, --output FILE.q3m  output file (must not exist unless --force)\n"
        "  --preset NAME          %s (default tiny)\n"
        "  --layers N --hidden H --heads Q --kv-heads K --head-dim D\n"
        "  --experts E --top-k K --moe-ffn F   (--experts 0: a dense Qwen3 model)\n"
        "  --ffn F                intermediate size of dense MLP layers\n"
        "  --mlp-only-layers L,.. layers with a dense MLP in a MoE model ('' for none)\n"
        "  --sparse-step S        decoder_sparse_step: layer l is sparse when (l+1) %% S == 0\n"
        "  --norm-topk 0|1 --tie 0|1 --vocab V --rope-theta T --max-pos P\n"
        "                         each overrides the preset's value\n"
        "  --dtype T              bf16 (default), f16, f32, or mixed (norms F32,\n"
        "                         attention projections F16, the rest BF16)\n"
        "  --seed S               random seed (default 0)\n"
        "  --shard-mb M           shard when the weights exceed M MiB (default 4096; DIR only)\n"
        "  --tokenizer DIR|none   copy DIR/tokenizer.json and tokenizer_config.json\n"
        "                         (default: the tokenizer/ folder next to q3moe, if any)\n"
        "  --force                write into a non-empty directory, replacing files synth\n"
        "                         writes and removing stale weight shards there; or\n"
        "                         replace an existing FILE.q3m\n"
        "  --dry-run              DIR: write config.json only; print the planned tensor\n"
        "                         count, bytes and shards as JSON on stdout. FILE.q3m: write\n"
        "                         nothing; print the tensor count, bytes and file size\n\n"
        "The quantization scheme of a .q3m output, as in q3moe convert (--ffn with a type\n"
        "name sets the MLP weights' type, with a number the dense intermediate size):\n"
        Q3_SCHEME_FLAGS_HELP,
        synth_preset_list());
}

static int fail(const char *fmt, ...) Q3_PRINTF(1, 2);
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("q3moe synth: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* Integer geometry flags, applied over the preset after parsing. */
static const struct {
    const char *flag;
    size_t off;
} int_flags[] = {
    {"--layers", offsetof(synth_geom, layers)},       {"--hidden", offsetof(synth_geom, hidden)},
    {"--heads", offsetof(synth_geom, heads)},         {"--kv-heads", offsetof(synth_geom, kv_heads)},
    {"--head-dim", offsetof(synth_geom, head_dim)},   {"--experts", offsetof(synth_geom, experts)},
    {"--top-k", offsetof(synth_geom, top_k)},         {"--moe-ffn", offsetof(synth_geom, moe_ffn)},
    {"--ffn", offsetof(synth_geom, ffn)},             {"--vocab", offsetof(synth_geom, vocab)},
    {"--sparse-step", offsetof(synth_geom, sparse_step)},
    {"--norm-topk", offsetof(synth_geom, norm_topk)}, {"--tie", offsetof(synth_geom, tie)},
    {"--max-pos", offsetof(synth_geom, max_pos)},
};
#define N_INT_FLAGS ((int)(sizeof int_flags / sizeof int_flags[0]))

typedef struct {
    const char *out, *preset, *dtype, *tokenizer, *mlp_only, *rope_theta;
    const char *int_vals[N_INT_FLAGS];
    long seed, shard_mb;
    int force, dry_run;
    int q3m;                   /* -o names a .q3m file */
    q3_quant_scheme scheme;    /* of a .q3m output */
    const char *scheme_flag;   /* the first scheme option given, for messages */
    int shard_set;
} options;

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* --ffn is both convert's FFN weight type and synth's dense intermediate
 * size; the value tells which (a type name is never a number), so that a
 * convert command line's scheme options work unchanged here. */
static int is_scheme_option(int argc, char **argv, int i) {
    q3_dtype t;
    if (strcmp(argv[i], "--ffn")) return q3_is_scheme_flag(argv[i]);
    return i + 1 < argc && q3_scheme_parse_dtype(argv[i + 1], &t) == 0;
}

static int parse_mlp_only(const char *s, synth_geom *g) {
    g->n_mlp_only = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT_MAX || (*end && *end != ','))
            return fail("--mlp-only-layers: expected a list like 0,3 (got '%s')", s);
        if (g->n_mlp_only == Q3_MAX_LAYERS) return fail("--mlp-only-layers: too many layers");
        g->mlp_only[g->n_mlp_only++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return 0;
}

/* 0 ok, 1 error, -1 help printed. */
static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->preset = "tiny";
    o->dtype = "bf16";
    o->shard_mb = 4096;
    o->scheme = (q3_quant_scheme){Q3_MXFP4, Q3_MXFP8, Q3_MXFP8, Q3_BF16};   /* W4A8, as convert */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--force")) { o->force = 1; continue; }
        if (!strcmp(a, "--dry-run")) { o->dry_run = 1; continue; }
        if (!strcmp(a, "--ffn") && i + 1 < argc && !is_scheme_option(argc, argv, i) &&
            !strchr("0123456789+-", argv[i + 1][0]))
            return fail("--ffn: '%s' is neither a dense intermediate size (a number) nor a weight type "
                        "(mxfp4, mxfp8, mxint8, bf16, bf16p)", argv[i + 1]);
        if (is_scheme_option(argc, argv, i)) {
            if (!(v = arg_value(argc, argv, &i))) return 1;
            if (q3_scheme_flag(a, v, &o->scheme)) return fail("%s", q3_errmsg());
            if (!o->scheme_flag) o->scheme_flag = a;
            continue;
        }
        int k = 0;
        while (k < N_INT_FLAGS && strcmp(a, int_flags[k].flag)) k++;
        const char **slot = k < N_INT_FLAGS ? &o->int_vals[k]
                          : !strcmp(a, "-o") || !strcmp(a, "--output") ? &o->out
                          : !strcmp(a, "--preset") ? &o->preset
                          : !strcmp(a, "--dtype") ? &o->dtype
                          : !strcmp(a, "--tokenizer") ? &o->tokenizer
                          : !strcmp(a, "--mlp-only-layers") ? &o->mlp_only
                          : !strcmp(a, "--rope-theta") ? &o->rope_theta
                          : NULL;
        if (slot) {
            if (!(v = arg_value(argc, argv, &i))) return 1;
            *slot = v;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_int(a, v, 0, LONG_MAX, &o->seed)) return 1;
        } else if (!strcmp(a, "--shard-mb")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_int(a, v, 1, 1L << 30, &o->shard_mb)) return 1;
            o->shard_set = 1;
        } else {
            arg_unknown("synth", a);
            return 1;
        }
    }
    if (!o->out) return fail("missing -o DIR or -o FILE.q3m (see q3moe synth --help)");
    if (!*o->out) return fail("-o: the output path is empty");
    o->q3m = ends_with(o->out, ".q3m");
    if (o->scheme_flag && !o->q3m)
        return fail("%s: a quantization scheme needs a .q3m output (-o FILE.q3m); -o %s is a checkpoint "
                    "directory", o->scheme_flag, o->out);
    if (o->shard_set && o->q3m) return fail("--shard-mb: a .q3m output is one file, never sharded");
    return 0;
}

static int build_geom(const options *o, synth_geom *g) {
    const synth_geom *p = synth_preset(o->preset);
    if (!p) return fail("--preset: unknown preset '%s' (choose from %s)", o->preset, synth_preset_list());
    *g = *p;
    for (int k = 0; k < N_INT_FLAGS; k++) {
        long v;
        if (!o->int_vals[k]) continue;
        if (arg_int(int_flags[k].flag, o->int_vals[k], INT_MIN, INT_MAX, &v)) return 1;
        *(int *)((char *)g + int_flags[k].off) = (int)v;
    }
    if (o->mlp_only && parse_mlp_only(o->mlp_only, g)) return 1;
    if (o->rope_theta && arg_float("--rope-theta", o->rope_theta, 1.0, 1e12, &g->rope_theta)) return 1;
    if (synth_geom_validate(g)) return fail("%s", q3_errmsg());
    return 0;
}

static int parse_dtype(const char *s, synth_dtype_mode *m, const char **torch_dtype) {
    static const struct { const char *name, *torch; synth_dtype_mode m; } t[] = {
        {"bf16", "bfloat16", SYNTH_BF16}, {"f16", "float16", SYNTH_F16},
        {"f32", "float32", SYNTH_F32},    {"mixed", "bfloat16", SYNTH_MIXED},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].name)) {
            *m = t[i].m;
            *torch_dtype = t[i].torch;
            return 0;
        }
    return fail("--dtype: unknown dtype '%s' (choose bf16, f16, f32 or mixed)", s);
}

/* The checkpoint directory. 0 or 1 (error printed). */
static int write_dir(const options *o, const synth_geom *g, const synth_plan *plan, const char *torch_dtype,
                     const char *tok_src) {
    uint64_t limit = (uint64_t)o->shard_mb << 20;
    char *config = q3_path_join(o->out, "config.json");
    int rc = synth_prepare_dir(o->out, o->force) ? fail("%s", q3_errmsg()) : 0;
    int prepared = rc == 0;   /* from here on, the directory's synth files are ours */
    if (rc == 0 && o->dry_run) {
        int *shard_of = q3_malloc((size_t)plan->n * sizeof *shard_of);
        printf("{\"tensors\": %d, \"total_bytes\": %llu, \"shards\": %d}\n", plan->n,
               (unsigned long long)plan->total_bytes, synth_assign_shards(plan, limit, shard_of));
        free(shard_of);
        if (fflush(stdout) != 0) rc = fail("cannot write to stdout");
    } else if (rc == 0) {
        if (synth_check_space(o->out, plan->total_bytes) ||
            synth_write_weights(o->out, plan, limit, (uint64_t)o->seed) ||
            (tok_src && synth_copy_tokenizer(tok_src, o->out)))
            rc = fail("%s", q3_errmsg());
    }
    /* config.json goes last, so a directory holding one is a complete
     * checkpoint; after a failure nothing half-written is left behind. */
    if (rc == 0 && synth_write_config(config, g, torch_dtype)) rc = fail("%s", q3_errmsg());
    if (rc != 0 && prepared) synth_remove_owned(o->out);
    if (rc == 0 && !o->dry_run)
        fprintf(stderr, "synth: wrote %s: %d tensors, %.3f GB%s\n", o->out, plan->n,
                plan->total_bytes / 1e9, tok_src ? ", tokenizer" : "");
    free(config);
    return rc;
}

/* The .q3m file (convert's writer prints progress and the summary; it
 * writes a temporary file and renames it, so a failure leaves nothing). */
static int write_q3m(const options *o, const synth_geom *g, const synth_plan *plan, const char *torch_dtype,
                     const char *tok_src) {
    char *config = synth_config_text(g, torch_dtype);
    if (!config) return fail("%s", q3_errmsg());
    int rc = 0;
    if (o->dry_run) {
        uint64_t size;
        if (synth_pack_size(plan, config, tok_src, o->scheme, &size)) rc = fail("%s", q3_errmsg());
        else {
            printf("{\"tensors\": %d, \"total_bytes\": %llu, \"file_bytes\": %llu}\n", plan->n,
                   (unsigned long long)plan->total_bytes, (unsigned long long)size);
            if (fflush(stdout) != 0) rc = fail("cannot write to stdout");
        }
    } else {
        q3_pack_opts po = {.dst = o->out, .scheme = o->scheme, .force = o->force, .tag = "synth"};
        q3_convert_stats st;
        if (synth_pack(plan, (uint64_t)o->seed, config, tok_src, &po, &st)) rc = fail("%s", q3_errmsg());
    }
    free(config);
    return rc;
}

int cmd_synth(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : 2;
    synth_geom g;
    synth_dtype_mode mode = SYNTH_BF16;
    const char *torch_dtype = "bfloat16";
    if (build_geom(&o, &g) || parse_dtype(o.dtype, &mode, &torch_dtype)) return 2;

    /* A .q3m's dry run reports the file size, which counts the tokenizer. */
    char *tok_src = NULL;
    if ((!o.dry_run || o.q3m) && synth_resolve_tokenizer(o.tokenizer, g.vocab, &tok_src)) {
        fail("%s", q3_errmsg());
        return 2;
    }

    synth_plan plan;
    synth_plan_build(&plan, &g, mode);
    rc = o.q3m ? write_q3m(&o, &g, &plan, torch_dtype, tok_src) : write_dir(&o, &g, &plan, torch_dtype, tok_src);
    free(tok_src);
    synth_plan_free(&plan);
    return rc ? 1 : 0;
}
