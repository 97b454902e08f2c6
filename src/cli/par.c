#include "cli/par.h"

#include <stdlib.h>
#include <string.h>

#include "io/q3m.h"
#include "model/model.h"
#include "quant/cache.h"
#include "quant/convert.h"
#include "util/error.h"
#include "util/file.h"

void par_opts_init(par_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->argc = argc;
    o->argv = argv;
    const q3_group *w = q3_comm_world();
    o->world = w ? q3_group_size(w) : 1;
    o->rank = w ? q3_group_rank(w) : 0;
    q3_plan_init(&o->plan);
}

static const char *const plan_flags[] = {"--attn-tp", "--moe-tp", "--moe-ep", "--lmhead-tp", "--moe-ep-comm", "--comm-quant"};

int par_opts_parse(par_opts *o, const char *cmd, int *i) {
    const char *a = o->argv[*i];
    if (!strcmp(a, "--config")) {
        if (*i + 1 >= o->argc) {
            if (o->rank == 0) fprintf(stderr, "q3moe %s: error: option --config needs a value\n", cmd);
            return -1;
        }
        o->config = o->argv[++*i];
        return 1;
    }
    for (size_t k = 0; k < sizeof plan_flags / sizeof plan_flags[0]; k++) {
        if (strcmp(a, plan_flags[k])) continue;
        /* Checked now (value present and well-formed), applied after the YAML. */
        q3_plan scratch;
        q3_plan_init(&scratch);
        int at = *i;
        if (q3_plan_parse_arg(&scratch, o->argc, o->argv, i) < 0) {
            if (o->rank == 0) fprintf(stderr, "q3moe %s: error: %s\n", cmd, q3_errmsg());
            return -1;
        }
        if (o->n_flags == PAR_MAX_FLAGS) {
            if (o->rank == 0) fprintf(stderr, "q3moe %s: error: too many parallel options\n", cmd);
            return -1;
        }
        o->flag_at[o->n_flags++] = at;
        return 1;
    }
    return 0;
}

void par_opts_help(FILE *f) {
    fprintf(f, "  --config FILE          YAML parallel plan (model_path, parallel_config: attn_tp_size,\n"
               "                         moe_tp_size, moe_ep_size, lmhead_tp_size, ...); run under\n"
               "                         mpirun -np P for P ranks\n");
    q3_plan_flags_help(f);
}

/* The model's config and whether its weights are MX-quantized: reads
 * config.json, or a .q3m's header and table (no weight data). */
static int probe(const char *path, q3_config *c, int *mx) {
    *mx = 0;
    if (q3_is_dir(path) || !q3_file_exists(path)) return q3_model_load_config(c, path);
    q3m_file f;
    if (q3m_open(&f, path)) return -1;
    *mx = q3_dtype_is_mx(f.scheme.ffn) || q3_dtype_is_mx(f.scheme.attn);
    q3m_close(&f);
    return q3_model_load_config(c, path);
}

/* The .q3m that --quant resolved to on several ranks (freed at exit). */
static char *g_resolved;

static void free_resolved(void) { free(g_resolved); }

/* --quant on several ranks: rank 0 finds or makes the cache file first,
 * while the others wait, so that they do not all convert into it at once;
 * then the others take the same file. A rank on another machine, without
 * rank 0's cache, converts into its own (conversions write a temporary file
 * and rename it, so ranks sharing that machine only repeat the work). On
 * success *model_path is the .q3m and *quant NULL. */
static int resolve_quant_ranked(const par_opts *o, const char **model_path, const char **quant) {
    char *path = NULL;
    int ok = o->rank != 0 || q3_resolve_model(*model_path, *quant, &path) == 0;
    q3_comm_watch(0); /* the others wait for the whole conversion */
    q3_comm_broadcast_bytes(q3_comm_world(), &ok, sizeof ok, 0);
    q3_comm_watch(1);
    if (!ok) {
        free(path);
        return o->rank == 0 ? -1 : q3_err("rank 0 could not prepare the --quant %s cache file", *quant);
    }
    if (o->rank != 0) {
        path = q3_cache_path(*model_path, *quant);
        if (!path || !q3_file_exists(path)) {
            free(path);
            path = NULL;
            if (q3_resolve_model(*model_path, *quant, &path)) q3_comm_abort(q3_errmsg()); /* this rank alone */
        }
    }
    free(g_resolved);
    if (!g_resolved) atexit(free_resolved);
    g_resolved = path;
    *model_path = path;
    *quant = NULL;
    return 0;
}

int par_setup(par_opts *o, const char *cmd, const char **model_path, const char **quant) {
    const int multi = o->world > 1, asked = o->config || o->n_flags;
    if (multi && q3_hugepages_get()) {
        /* Each rank would copy the whole file; ranks map it and touch their slices. */
        q3_hugepages_set(0);
        if (o->rank == 0)
            fprintf(stderr, "q3moe %s: note: --hugepages is for one process; the %d ranks map the model\n", cmd, o->world);
    }
    /* Plan from the YAML and flags: the same text on every rank, so every
     * rank fails the same way; rank 0 says why. */
    int rc = 0;
    if (o->config) rc = q3_plan_load_yaml(&o->plan, o->config);
    for (int k = 0; rc == 0 && k < o->n_flags; k++) {
        int i = o->flag_at[k];
        rc = q3_plan_parse_arg(&o->plan, o->argc, o->argv, &i) < 0 ? -1 : 0;
    }
    if (rc == 0 && !*model_path && o->plan.model_path[0]) *model_path = o->plan.model_path;
    if (rc == 0 && !*model_path) rc = q3_err("-m MODEL is required (or model_path in --config FILE)");
    if (rc) {
        if (o->rank == 0) fprintf(stderr, "q3moe %s: error: %s\n", cmd, q3_errmsg());
        return o->config && !*model_path ? 2 : 1;
    }
    if (!multi && !asked) return 0;
    q3_config c;
    int mx;
    if (probe(*model_path, &c, &mx)) {
        if (multi) q3_comm_abort(q3_errmsg()); /* a file one rank cannot read */
        fprintf(stderr, "q3moe %s: error: %s\n", cmd, q3_errmsg());
        return 1;
    }
    q3_quant_scheme qs; /* --quant: the plan is checked for the weights the conversion will make */
    if (*quant && q3_scheme_from_name(*quant, &qs) == 0) mx = q3_dtype_is_mx(qs.ffn) || q3_dtype_is_mx(qs.attn);
    if (q3_plan_validate(&o->plan, o->world, &c, mx)) {
        if (o->rank == 0) fprintf(stderr, "q3moe %s: error: parallel plan: %s\n", cmd, q3_errmsg());
        return 1;
    }
    if (o->rank == 0) q3_plan_print(stderr, &o->plan);   /* with the SP note when SP prefill is off */
    if (multi && *quant && resolve_quant_ranked(o, model_path, quant)) { /* every rank, as rank 0 failed */
        if (o->rank == 0) fprintf(stderr, "q3moe %s: error: %s\n", cmd, q3_errmsg());
        return 1;
    }
    if (multi) q3_prefault_disable();
    return 0;
}

void par_fail(const par_opts *o, const char *cmd) {
    if (o->world > 1) {
        char msg[1200];
        snprintf(msg, sizeof msg, "q3moe %s: %s", cmd, q3_errmsg());
        q3_comm_abort(msg);
    }
    fprintf(stderr, "q3moe %s: error: %s\n", cmd, q3_errmsg());
}

const q3_plan *par_plan(const par_opts *o) { return o->world > 1 && o->plan.validated ? &o->plan : NULL; }
