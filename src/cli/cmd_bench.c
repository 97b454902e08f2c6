/* `q3moe bench`: prefill and decode speed, decode memory traffic, time to
 * first token and peak memory of a checkpoint, next to the machine's
 * measured memory read bandwidth and FMA peak (llama-bench in spirit). */
#include <errno.h>
#include <stdarg.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/bench_comm.h"
#include "cli/bench_machine.h"
#include "cli/bench_model.h"
#include "cli/bench_report.h"
#include "cli/bench_ttft.h"
#include "cli/commands.h"
#include "cli/par.h"
#include "cli/session.h"
#include "parallel/comm.h"
#include "quant/cache.h"
#include "util/error.h"
#include "util/file.h"

#define MAX_PROMPTS 64

/* The model path to load (-m, or the cached .q3m for --quant); global so it
 * stays reachable until exit. */
static char *g_model_path;
#define MEMBW_PASSES 10

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe bench -m DIR [options]\n"
            "       q3moe bench --membw [-t THREADS] [--membw-mb MB]   (machine measurements only)\n\n"
            "Measures prefill and single-batch decode speed, the weight bytes each decode token\n"
            "reads (and per model part, the GB/s its matmuls stream them at; for prefill, their\n"
            "GFLOP/s, and how many experts got how many of the prompt's tokens), time to first\n"
            "token of a fresh process (cold and warm page cache), peak RSS and how much of a\n"
            "mapped model has 2 MiB page entries, next to this machine's measured memory read\n"
            "bandwidth and FMA peak (measured at the end and again between the timed\n"
            "repetitions; percentages are of the best seen; with the AMX kernels also their\n"
            "tile peak), naming the kernels in use\n"
            "(Q3MOE_ISA=scalar|avx2|avx512|avx512bf16|amx forces a table; Q3MOE_GEMV_PREFETCH=sw|hw\n"
            "whether the BF16/F16/F32 GEMV prefetches its weights in software, +hwpf when not;\n"
            "Q3MOE_PREFETCH_TO=l1|l2 which cache the GEMVs prefetch into, +pfl2 for L2, the\n"
            "default on Intel CPUs).\n"
            "The table goes to stdout, progress to stderr. See BENCHMARKS.md for what each number\n"
            "means.\n\n"
            "  -m DIR            Hugging Face checkpoint directory, or a .q3m file (q3moe convert)\n"
            "  --quant SCHEME    bench DIR quantized (w4a8, w8a8, w4a8i, w8a8i, w4, w8, bf16, bf16p), converted once into the cache\n"
            "  -p LIST           prompt lengths for prefill, comma-separated (default 128,512,4096;\n"
            "                    0 = no prefill test)\n"
            "  -n N              decode steps per repetition (default 64; 0 = no decode test)\n"
            "  -r R              repetitions (default 5)\n"
            "  -t THREADS        worker threads (default: all cores)\n"
            "  --depth D         tokens prefilled before the timed decode steps (default 128)\n"
            "  --ctx N           KV cache size (default: the largest length the runs need)\n"
            "  --json FILE       also write the results as JSON (an existing FILE is refused)\n"
            "  --force           overwrite the --json FILE\n"
            "  --membw           without -m: measure only the machine (bandwidth and FMA peak)\n"
            "  --no-membw        skip the memory bandwidth test (no %% of bandwidth reported)\n"
            "  --membw-mb MB     bandwidth test buffer size in MiB (default 1024); as many bytes of the\n"
            "                    mapped model are read between decode repetitions, if its file is that large\n"
            "  --no-ttft         skip the time-to-first-token runs\n"
            "  --mlock           lock the model's files in RAM (never paged out; needs ulimit -l)\n"
            "  --hugepages       copy the model into transparent huge pages instead of mapping it\n"
            "                    (the time-to-first-token runs get it too)\n"
            "  --ttft-p N        prompt length of the time-to-first-token runs (default: the\n"
            "                    first -p length, or 128)\n"
            "  --temp T          sampling temperature of every prefill and decode step (default 0.6,\n"
            "                    generate's; 0 = greedy)\n"
            "  --top-k K         top-k of that sampling (default 20, generate's; 0 = off, which\n"
            "                    gathers whole logits rows on a vocab-split lm_head)\n"
            "  --comm-stats      per phase (prefill per prompt, decode per token) and collective:\n"
            "                    calls, link bytes and time, and per layer compute vs comm time\n"
            "                    (rank 0's; all zero on one rank)\n\n"
            "Under mpirun -np P with --config FILE (or the plan flags) the model is split as in\n"
            "generate; every rank runs the same steps, rank 0 prints and writes --json, and the\n"
            "time-to-first-token runs are skipped.\n");
    par_opts_help(f);
}

/* Set while the arguments are checked on a rank other than 0: every rank
 * parses the same ones, so rank 0 alone reports them. */
static int g_quiet;

static int fail(const char *fmt, ...) Q3_PRINTF(1, 2);
static int fail(const char *fmt, ...) {
    if (g_quiet) return 2;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "q3moe bench: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) return fail("%s: '%s' is not an integer", opt, s);
    if (v < lo || v > hi) return fail("%s: %ld is out of range [%ld, %ld]", opt, v, lo, hi);
    *out = v;
    return 0;
}

static int parse_lengths(const char *opt, const char *s, int *out, int *n) {
    *n = 0;
    const char *p = s;
    if (!*p) return fail("%s: empty list", opt);
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || (*end && *end != ',')) return fail("%s: bad list at '%s' (expected e.g. 128,512)", opt, p);
        if (v < 0 || v > (1l << 24)) return fail("%s: length %ld is out of range [0, %ld]", opt, v, 1l << 24);
        if (*n == MAX_PROMPTS) return fail("%s: at most %d lengths", opt, MAX_PROMPTS);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    /* -p 0 alone: no prefill test. */
    if (*n == 1 && out[0] == 0) *n = 0;
    for (int i = 0; i < *n; i++)
        if (out[i] == 0) return fail("%s: 0 is only allowed alone (-p 0 = no prefill test)", opt);
    return 0;
}

static const char *base_name(const char *dir, char *buf, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    size_t len = n - b < cap - 1 ? n - b : cap - 1;
    memcpy(buf, dir + b, len);
    buf[len] = 0;
    return buf;
}

static double sum_ms(const double *ms, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) t += ms[i];
    return t;
}

static long peak_rss_kb(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : ru.ru_maxrss;
}

/* Ceilings to sample beside the timed runs (one rank only: ranks sharing a
 * machine would sample each other's traffic): the FMA run, and when the
 * bandwidth is measured, read passes over the first read_bytes of the
 * model's largest file, if it has that many (the bytes are read where
 * decode reads its weights, and a smaller file could sit in the caches). */
static bench_ceilings ceilings_for(const q3_model *m, int world, size_t read_bytes) {
    bench_ceilings cl = {.fma = world == 1};
    const q3_mapped_file *big = NULL;
    for (int i = 0; i < m->st.n_files; i++)
        if (!big || m->st.files[i].size > big->size) big = &m->st.files[i];
    if (world == 1 && read_bytes && big && big->size >= read_bytes) cl.read_p = big->data, cl.read_bytes = read_bytes;
    return cl;
}

/* Everything that needs the loaded model. Every step ends with a token
 * sampled as generate does (sp), distributed on a vocab-split lm_head. */
static int run_model(bench_results *r, q3_session *s, const int *plen, int np, long n_dec, long reps, long depth,
                     const int32_t *ids, const q3_sampler_params *sp, int rank, size_t read_bytes) {
    const q3_model *m = &s->model;
    const q3_config *c = &m->cfg;
    bench_checkpoint_size(m, &r->params, &r->bytes, &r->dtype);
    r->active_params = bench_active_params(c);
    const size_t nh = c->is_moe ? (size_t)c->num_layers * c->num_experts : 0;
    uint64_t *delta = nh ? q3_calloc(nh, sizeof *delta) : NULL;
    if (nh) s->state.expert_hits = q3_calloc(nh, sizeof(uint64_t));
    double *ms = q3_malloc((size_t)reps * (size_t)(n_dec > 1 ? n_dec : 1) * sizeof *ms);
    q3_sampler *smp = q3_sampler_new(sp, c->vocab_size);
    int rc = smp ? session_sampling_setup(s, sp, rank == 0) : -1;
    if (r->comm_stats) r->prefill_comm = q3_calloc((size_t)(np ? np : 1), sizeof *r->prefill_comm);
    r->beside = ceilings_for(m, r->world, read_bytes);

    /* One untimed run faults the weights in and starts the thread pool. */
    int warm = np ? plen[0] : (n_dec > 0 && depth > 0 ? (int)depth : 1);
    bench_log("warm-up: untimed prefill of %d tokens\n", warm);
    q3_state_reset(&s->state);
    if (rc == 0) rc = q3_forward(m, &s->state, ids, warm, s->logits, 0);

    r->prefill = q3_calloc((size_t)(np ? np : 1), sizeof *r->prefill);
    for (int i = 0; rc == 0 && i < np; i++) {
        const int P = plen[i];
        if (r->comm_stats) bench_comm_begin(&r->prefill_comm[i], &s->state, "prefill", c->num_layers);
        q3_matmul_stats mm;
        double att_s = 0;
        uint64_t load[BENCH_LOAD_BUCKETS];
        rc = bench_run_prefill(s, smp, ids, P, (int)reps, ms, &mm, &att_s, &r->beside, nh ? load : NULL);
        if (r->comm_stats) bench_comm_end(&r->prefill_comm[i], &s->state, rc ? 0 : sum_ms(ms, (int)reps) / 1e3, (double)reps);
        if (rc) break;
        bench_prefill_result *p = &r->prefill[r->n_prefill++];
        p->tokens = P;
        p->reps = (int)reps;
        p->ms_min = bench_percentile(ms, (int)reps, 0);
        p->ms_max = bench_percentile(ms, (int)reps, 100);
        p->ms_median = bench_percentile(ms, (int)reps, 50);
        p->tok_s = P * 1e3 / p->ms_median;
        p->flops = bench_prefill_flops(c, P);
        p->gflops = p->flops / (p->ms_median * 1e6);
        p->mm_flops = mm.flops / (double)reps;
        p->mm_gflops = mm.seconds > 0 ? mm.flops / mm.seconds / 1e9 : 0;
        p->mm_share = mm.seconds * 1e3 / sum_ms(ms, (int)reps);
        p->att_ms = att_s * 1e3 / (double)reps;
        p->att_gflops = att_s > 0 ? bench_attention_flops(c, 0, P) * (double)reps / att_s / 1e9 : 0;
        for (int q = 0; q < Q3_MM_PARTS; q++) {
            p->part_ms[q] = mm.part_seconds[q] * 1e3 / (double)reps;
            p->part_gflops[q] = mm.part_seconds[q] > 0 ? mm.part_flops[q] / mm.part_seconds[q] / 1e9 : 0;
        }
        /* A sequence-parallel prefill with AlltoAll EP counts only this rank's rows. */
        p->has_load = nh && !(P > 1 && s->state.sp_rows && s->state.a2a_send);
        if (p->has_load) memcpy(p->load, load, sizeof load);
    }

    if (rc == 0 && n_dec > 0) {
        bench_decode_result *d = &r->decode;
        if (r->comm_stats) bench_comm_begin(&r->decode_comm, &s->state, "decode", c->num_layers);
        q3_matmul_stats mm;
        double att_s = 0;
        rc = bench_run_decode(s, smp, ids, (int)depth, (int)n_dec, (int)reps, ms, delta, &mm, &att_s, &r->beside);
        const int total = (int)(n_dec * reps);
        if (r->comm_stats) bench_comm_end(&r->decode_comm, &s->state, rc ? 0 : sum_ms(ms, total) / 1e3, (double)total);
        if (rc == 0) {
            d->ran = 1;
            d->depth = (int)depth;
            d->steps = (int)n_dec;
            d->reps = (int)reps;
            d->p50 = bench_percentile(ms, total, 50);
            d->p90 = bench_percentile(ms, total, 90);
            d->p99 = bench_percentile(ms, total, 99);
            d->mean = sum_ms(ms, total) / total;
            d->tok_s = 1e3 / d->p50;
            d->fixed_bytes = bench_decode_fixed_bytes(m);
            d->expert_bytes = nh ? bench_expert_bytes(m, delta) / total : 0;
            d->weight_bytes = d->fixed_bytes + d->expert_bytes;
            uint64_t hits = 0;
            for (size_t k = 0; k < nh; k++) hits += delta[k];
            d->expert_hits_per_token = (double)hits / total;
            double kv = 0;
            for (int i = 0; i < n_dec; i++) kv += bench_kv_bytes(c, (int)depth + i);
            d->kv_bytes = kv / (double)n_dec;
            d->gbs = d->weight_bytes / (d->p50 * 1e6);
            d->mm_ms = mm.seconds * 1e3 / total;
            d->mm_share = mm.seconds * 1e3 / sum_ms(ms, total);
            d->att_ms = att_s * 1e3 / total;
            d->att_share = att_s * 1e3 / sum_ms(ms, total);
            for (int p = 0; p < Q3_MM_PARTS; p++) {
                d->part_ms[p] = mm.part_seconds[p] * 1e3 / total;
                d->part_bytes[p] = mm.part_bytes[p] / total;
            }
        }
    }
    r->beside.read_p = NULL; /* the mapping goes with the session */
    r->rss_kb = peak_rss_kb();
    r->hugepages = q3_hugepages_get();
    r->huge_bytes = q3_anon_huge_bytes();
    r->file_pmd_bytes = q3_file_pmd_bytes();
    free(s->state.expert_hits);
    s->state.expert_hits = NULL;
    free(delta);
    free(ms);
    q3_sampler_free(smp);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL, *json_path = NULL, *plist = "128,512,4096", *quant = NULL;
    long n_dec = 64, reps = 5, threads = 0, depth = 128, ctx_arg = 0, membw_mb = 1024, ttft_p = 0;
    int force = 0, membw_flag = 0, no_membw = 0, no_ttft = 0, comm_stats = 0;
    q3_sampler_params sp;
    q3_sampler_defaults(&sp);
    sp.temperature = 0.6f; /* generate's defaults */
    sp.top_k = 20;
    sp.top_p = 0.95f;
    sp.seed = 0x5eed;
    par_opts po;
    par_opts_init(&po, argc, argv);
    g_quiet = po.rank != 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int pr = par_opts_parse(&po, "bench", &i);
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (po.rank == 0) usage(stdout);
            return 0;
        } else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--comm-stats")) comm_stats = 1;
        else if (!strcmp(a, "--membw")) membw_flag = 1;
        else if (!strcmp(a, "--no-membw")) no_membw = 1;
        else if (!strcmp(a, "--no-ttft")) no_ttft = 1;
        else if (!strcmp(a, "--mlock")) q3_mlock_set(1);
        else if (!strcmp(a, "--hugepages")) q3_hugepages_set(1);
        else if (!strcmp(a, "-m") || !strcmp(a, "-p") || !strcmp(a, "-n") || !strcmp(a, "-r") || !strcmp(a, "-t") ||
                 !strcmp(a, "--depth") || !strcmp(a, "--ctx") || !strcmp(a, "--json") || !strcmp(a, "--membw-mb") ||
                 !strcmp(a, "--ttft-p") || !strcmp(a, "--quant") || !strcmp(a, "--temp") || !strcmp(a, "--top-k")) {
            if (i + 1 >= argc) return fail("option %s needs a value", a);
            const char *v = argv[++i];
            int bad = 0;
            if (!strcmp(a, "-m")) model_dir = v;
            else if (!strcmp(a, "-p")) plist = v;
            else if (!strcmp(a, "--json")) json_path = v;
            else if (!strcmp(a, "--quant")) quant = v;
            else if (!strcmp(a, "-n")) bad = parse_long(a, v, 0, 1l << 20, &n_dec);
            else if (!strcmp(a, "-r")) bad = parse_long(a, v, 1, 100000, &reps);
            else if (!strcmp(a, "-t")) bad = parse_long(a, v, 1, 1024, &threads);
            else if (!strcmp(a, "--depth")) bad = parse_long(a, v, 0, 1l << 24, &depth);
            else if (!strcmp(a, "--ctx")) bad = parse_long(a, v, 1, 1l << 24, &ctx_arg);
            else if (!strcmp(a, "--membw-mb")) bad = parse_long(a, v, 1, 1l << 20, &membw_mb);
            else if (!strcmp(a, "--ttft-p")) bad = parse_long(a, v, 1, 1l << 24, &ttft_p);
            else if (!strcmp(a, "--top-k")) {
                long k = 0;
                bad = parse_long(a, v, 0, 1l << 24, &k);
                sp.top_k = (int)k;
            } else if (!strcmp(a, "--temp")) {
                char *end;
                errno = 0;
                double d = strtod(v, &end);
                if (errno || end == v || *end || !(d >= 0 && d <= 100)) bad = fail("--temp: '%s' is not a number in [0, 100]", v);
                sp.temperature = (float)d;
            }
            if (bad) return 2;
        } else {
            fail("unknown argument '%s' (see q3moe bench --help)", a);
            return 2;
        }
    }
    int plen[MAX_PROMPTS], np = 0;
    if (parse_lengths("-p", plist, plen, &np)) return 2;
    if (membw_flag && no_membw) return fail("--membw and --no-membw contradict each other");
    if (!model_dir && !membw_flag && !po.config) {
        fail("need -m DIR (or --membw alone to measure only the machine)");
        if (!g_quiet) usage(stderr);
        return 2;
    }
    if (!model_dir && !po.config && po.world > 1) {
        return fail("--membw alone measures this machine on one rank; run it without mpirun (launched as %d ranks)", po.world);
    }
    /* Only rank 0 writes the file, so only rank 0 checks it (before any work). */
    if (po.rank == 0 && json_path && q3_check_output(json_path, force)) {
        q3_err_prefix("--json");
        par_fail(&po, "bench");
        return 1;
    }
    g_quiet = 0; /* past the arguments: what fails now may fail on one rank alone */
    if (threads > 0) omp_set_num_threads((int)threads);
    /* The plan (--config / flags, or the world size under mpirun), checked
     * before any weight is read; -m may come from the YAML's model_path. */
    if (model_dir || po.config || po.world > 1) {
        int prc = par_setup(&po, "bench", &model_dir, &quant);
        if (prc) return prc;
    }
    const int multi = po.world > 1, rank0 = po.rank == 0;
    bench_log_enable(rank0);

    bench_results r;
    memset(&r, 0, sizeof r);
    r.comm_stats = comm_stats;
    r.world = po.world;
    r.sp = sp;
    bench_machine_info(&r.machine);
    int need_tok = 0, ttft_ctx = 0;
    if (model_dir) {
        /* -m DIR --quant S: bench the cached .q3m (converted on first use). */
        if (q3_resolve_model(model_dir, quant, &g_model_path) || q3_model_load_config(&r.cfg, g_model_path)) {
            fail("%s", q3_errmsg());
            return 1;
        }
        const int max_pos = r.cfg.max_position_embeddings;
        if (!ttft_p) ttft_p = np ? plen[0] : 128;
        if (multi && !no_ttft && rank0)
            bench_log("%d ranks: no time-to-first-token runs (a fresh single process)\n", po.world);
        if (no_ttft || multi) ttft_p = 0;
        int need = (int)(n_dec > 0 ? depth + n_dec : 0);
        for (int i = 0; i < np; i++) need = plen[i] > need ? plen[i] : need;
        if (need == 0) need = 1;
        if (ctx_arg > max_pos) return fail("--ctx %ld exceeds the model's max_position_embeddings (%d)", ctx_arg, max_pos);
        const long ctx = ctx_arg ? ctx_arg : max_pos;
        const char *what = ctx_arg ? "the context size" : "the model's max_position_embeddings";
        const char *hint = ctx_arg ? " (--ctx)" : "";
        for (int i = 0; i < np; i++)
            if (plen[i] > ctx) return fail("-p: prompt length %d exceeds %s %ld%s", plen[i], what, ctx, hint);
        if (n_dec > 0 && depth + n_dec > ctx)
            return fail("--depth %ld + -n %ld = %ld tokens exceed %s %ld%s", depth, n_dec, depth + n_dec, what, ctx, hint);
        if (ttft_p > max_pos) return fail("--ttft-p: %ld exceeds the model's max_position_embeddings (%d)", ttft_p, max_pos);
        r.ctx = ctx_arg ? (int)ctx_arg : need;
        /* generate's default context is min(max_position_embeddings, 4096). */
        int gen_ctx = max_pos < 4096 ? max_pos : 4096;
        if (ctx_arg) ttft_ctx = (int)(ttft_p > ctx_arg ? ttft_p : ctx_arg);
        else if (ttft_p > gen_ctx) ttft_ctx = (int)ttft_p;
        need_tok = need > ttft_p ? need : (int)ttft_p;
        r.has_model = 1;
        r.dir = model_dir;
        base_name(model_dir, r.name, sizeof r.name);
        model_dir = g_model_path;
    }
    bench_log("%s, %d threads\n", r.machine.cpu, r.machine.threads);
    if (r.machine.loadavg > r.machine.cores - r.machine.threads + 0.5)
        bench_log("warning: load average %.2f on %d cores: other processes compete for the CPUs, timings will be noisy\n",
                r.machine.loadavg, r.machine.cores);

    int rc = 0;
    int32_t *ids = NULL;
    if (r.has_model) {
        ids = q3_malloc((size_t)need_tok * sizeof *ids);
        bench_fill_ids(ids, need_tok, r.cfg.vocab_size, 0x5eed);
        /* TTFT first: the cold run needs the checkpoint unmapped here. */
        if (ttft_p > 0) rc = bench_measure_ttft(model_dir, ids, (int)ttft_p, (int)threads, ttft_ctx, &r.ttft);
        if (rc == 0) {
            bench_log("loading %s (ctx %d)\n", model_dir, r.ctx);
            q3_session s;
            rc = session_open_plan(&s, model_dir, r.ctx, (int)threads, 0, par_plan(&po));
            if (rc == 0) {
                r.cfg = s.model.cfg;
                rc = run_model(&r, &s, plen, np, n_dec, reps, depth, ids, &sp, po.rank, no_membw ? 0 : (size_t)membw_mb << 20);
                session_close(&s);
            }
            /* a rank that fails mid-run would leave its peers waiting */
            if (rc && multi) par_fail(&po, "bench");
        }
    }
    if (rc == 0) {
        bench_log("measuring the FMA peak\n");
        bench_measure_fma(&r.fma);
        if (!no_membw) {
            bench_log("measuring memory read bandwidth (%ld MiB buffer)\n", membw_mb);
            rc = bench_measure_membw((size_t)membw_mb << 20, MEMBW_PASSES, &r.membw);
        }
    }
    if (rc == 0 && rank0) {
        bench_print_table(stdout, &r);
        fflush(stdout);
        if (json_path) rc = bench_write_json(json_path, force, &r);
    }
    if (rc) fprintf(stderr, "q3moe bench: error: %s\n", q3_errmsg());
    free(ids);
    free(r.prefill);
    for (int i = 0; r.prefill_comm && i < np; i++) bench_comm_free(&r.prefill_comm[i]);
    free(r.prefill_comm);
    bench_comm_free(&r.decode_comm);
    return rc ? 1 : 0;
}
