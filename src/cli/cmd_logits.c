/* `q3moe logits`: the correctness hook. The first K ids go through one
 * prefill call, every later id through a single-token decode step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/par.h"
#include "cli/session.h"
#include "quant/cache.h"
#include "util/error.h"
#include "util/file.h"
#include "parallel/comm.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe logits -m DIR --ids 1,2,3,... -o FILE [--quant SCHEME] [--prefill K] [--ctx N] [-t THREADS] [--force]\n\n"
            "Writes little-endian float32 logits, row-major [n_ids, vocab_size], one row per position.\n"
            "The first K ids (default: all) go through one prefill call; each later id through one\n"
            "single-token decode step on the KV cache.\n\n"
            "  -m DIR         Hugging Face checkpoint directory, or a .q3m file (q3moe convert)\n"
            "  --quant S      run DIR quantized (w4a8, w8a8, w4a8i, w8a8i, w4, w8, bf16, bf16p), converted once into the cache\n"
            "  --ids LIST     comma-separated token ids\n"
            "  -o FILE        output file (refuses to overwrite an existing file unless --force)\n"
            "  --prefill K    ids in the prefill call, 1..n (default n)\n"
            "  --ctx N        KV cache size in tokens (default min(max_position_embeddings, 4096))\n"
            "  -t THREADS     worker threads (default: all cores)\n"
            "  --comm-stats   print this rank's communication counters (rank 0, stderr) at the end\n\n"
            "Under mpirun -np P the model is split over the P ranks as the plan says; only rank 0\n"
            "writes FILE.\n");
    par_opts_help(f);
}

int cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *ids_s = NULL, *quant = NULL;
    long prefill = -1, ctx = 0, threads = 0;
    int force = 0, comm_stats = 0;
    par_opts po;
    par_opts_init(&po, argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int pr = par_opts_parse(&po, "logits", &i);
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (po.rank == 0) usage(stdout);
            return 0;
        } else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--comm-stats")) comm_stats = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "-o") || !strcmp(a, "--ids") || !strcmp(a, "--prefill") ||
                 !strcmp(a, "--ctx") || !strcmp(a, "-t") || !strcmp(a, "--quant")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "-m")) dir = v;
            else if (!strcmp(a, "-o")) out = v;
            else if (!strcmp(a, "--ids")) ids_s = v;
            else if (!strcmp(a, "--quant")) quant = v;
            else if (!strcmp(a, "--prefill") && arg_int(a, v, 1, 1l << 24, &prefill)) return 2;
            else if (!strcmp(a, "--ctx") && arg_int(a, v, 1, 1l << 24, &ctx)) return 2;
            else if (!strcmp(a, "-t") && arg_int(a, v, 1, 1024, &threads)) return 2;
        } else return arg_unknown("logits", a);
    }
    if ((!dir && !po.config) || !out || !ids_s) {
        if (po.rank == 0) {
            fprintf(stderr, "q3moe logits: error: -m DIR, --ids LIST and -o FILE are required\n");
            usage(stderr);
        }
        return 2;
    }
    int32_t *ids;
    size_t n;
    if (arg_id_list("--ids", ids_s, &ids, &n)) return 2;
    if (prefill > (long)n) {
        fprintf(stderr, "q3moe logits: error: --prefill %ld exceeds the number of ids (%zu)\n", prefill, n);
        free(ids);
        return 2;
    }
    if (prefill < 0) prefill = (long)n;
    /* Only rank 0 writes the file, so only rank 0 checks it. */
    if (po.rank == 0 && q3_check_output(out, force)) {
        q3_err_prefix("-o");
        par_fail(&po, "logits");
        free(ids);
        return 1;
    }
    int prc = par_setup(&po, "logits", &dir, &quant);
    if (prc) {
        free(ids);
        return prc;
    }
    char *path;
    if (q3_resolve_model(dir, quant, &path)) {
        q3_print_error();
        free(ids);
        return 1;
    }
    q3_session s;
    int open_rc = session_open_plan(&s, path, (int)ctx, (int)threads, 0, par_plan(&po));
    free(path);
    if (open_rc) {
        par_fail(&po, "logits");
        free(ids);
        return 1;
    }
    const size_t V = (size_t)s.model.cfg.vocab_size;
    float *rows = q3_malloc(n * V * sizeof(float));
    int rc = q3_forward(&s.model, &s.state, ids, (int)prefill, rows, 1);
    for (size_t i = (size_t)prefill; rc == 0 && i < n; i++) rc = q3_forward(&s.model, &s.state, ids + i, 1, rows + i * V, 0);
    if (rc && po.world > 1) par_fail(&po, "logits");
    if (rc == 0 && comm_stats && po.rank == 0) q3_comm_stats_print(stderr);
    if (rc == 0 && po.rank == 0) {
        FILE *f = fopen(out, "wb");
        if (!f) rc = q3_err("cannot create %s: %s", out, strerror(errno));
        else {
            /* Written as stored: the machines we target are little-endian. */
            size_t w = fwrite(rows, sizeof(float), n * V, f);
            if (fclose(f) != 0 || w != n * V) {
                rc = q3_err("error writing %s", out);
                q3_remove_partial(out);
            }
        }
    }
    if (rc) q3_print_error();
    free(rows);
    free(ids);
    session_close(&s);
    return rc ? 1 : 0;
}
