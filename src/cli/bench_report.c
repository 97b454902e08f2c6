#include "cli/bench_report.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "util/error.h"
#include "util/file.h"

static double pct(double x, double of) { return of > 0 ? 100.0 * x / of : 0; }

/* What "% peak" and "% membw" are of: the best the machine showed in the
 * whole run, at the end or beside the timed repetitions (0: no bandwidth). */
static double peak_gflops(const bench_results *r) {
    return r->beside.flops.n && r->beside.flops.best > r->fma.gflops ? r->beside.flops.best : r->fma.gflops;
}

static double read_gbs(const bench_results *r) {
    if (!r->membw.ran) return 0;
    return r->beside.read.n && r->beside.read.best > r->membw.best_gbs ? r->beside.read.best : r->membw.best_gbs;
}

/* One phase's counters per unit (prompt or token), one line per kind used. */
static void print_comm_rows(FILE *f, const bench_comm *b, const char *label) {
    int any = 0;
    for (int k = 0; k < Q3_COLL_N; k++) {
        const q3_comm_stat *s = &b->coll[k];
        if (!s->calls) continue;
        any = 1;
        fprintf(f, "  %-16s %-19s %9.2f %14.1f %14.1f %10.3f\n", label, q3_coll_name((q3_coll)k), s->calls / b->units,
                s->bytes_sent / b->units, s->bytes_recv / b->units, s->seconds * 1e3 / b->units);
    }
    if (!any) fprintf(f, "  %-16s %-19s %9.2f %14.1f %14.1f %10.3f\n", label, "(none)", 0.0, 0.0, 0.0, 0.0);
}

/* Per layer: wall, compute (wall - comm) and comm ms per unit; then what
 * runs outside the layers (embedding, final norm, lm_head, sampling). */
static void print_layers(FILE *f, const bench_comm *b, const char *label) {
    double lw = 0, lc = 0, all_comm = 0;
    for (int k = 0; k < Q3_COLL_N; k++) all_comm += b->coll[k].seconds;
    for (int l = 0; l < b->layers; l++) {
        double w = b->layer_s[l] / b->units, c = b->layer_comm_s[l] / b->units;
        lw += w, lc += c;
        fprintf(f, "  %-16s %5d %11.3f %11.3f %11.3f\n", label, l, w * 1e3, (w - c) * 1e3, c * 1e3);
    }
    double ow = b->step_s / b->units - lw, oc = all_comm / b->units - lc;
    fprintf(f, "  %-16s %5s %11.3f %11.3f %11.3f   (embedding, lm_head, sampling)\n", label, "rest", ow * 1e3,
            (ow - oc) * 1e3, oc * 1e3);
}

static void print_comm(FILE *f, const bench_results *r) {
    fprintf(f, "\ncommunication (rank 0 of %d; link bytes per rank as src/parallel/comm.h counts them; time inside\n"
               "the collectives, waiting for peers included)%s\n",
            r->world, r->world > 1 ? "" : ": one rank, nothing crosses a link, all zero");
    fprintf(f, "  %-16s %-19s %9s %14s %14s %10s\n", "phase, per", "collective", "calls", "bytes sent", "bytes recv", "ms");
    char label[48];
    for (int i = 0; i < r->n_prefill; i++) {
        snprintf(label, sizeof label, "prefill %d-tok", r->prefill[i].tokens);
        print_comm_rows(f, &r->prefill_comm[i], label);
    }
    if (r->decode.ran) print_comm_rows(f, &r->decode_comm, "decode token");
    fprintf(f, "\nper layer (ms per prompt / per token; compute = wall - comm)\n");
    fprintf(f, "  %-16s %5s %11s %11s %11s\n", "phase, per", "layer", "wall ms", "compute ms", "comm ms");
    for (int i = 0; i < r->n_prefill; i++) {
        snprintf(label, sizeof label, "prefill %d-tok", r->prefill[i].tokens);
        print_layers(f, &r->prefill_comm[i], label);
    }
    if (r->decode.ran) print_layers(f, &r->decode_comm, "decode token");
}

void bench_print_table(FILE *f, const bench_results *r) {
    const bench_machine *mc = &r->machine;
    if (r->has_model) {
        const q3_config *c = &r->cfg;
        fprintf(f, "model      %s (%s): %d layers, hidden %d, %d/%d heads x %d", r->name, c->is_moe ? "qwen3_moe" : "qwen3",
                c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim);
        if (c->is_moe) fprintf(f, ", %d experts top-%d (ffn %d)", c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size);
        fprintf(f, ", vocab %d\n", c->vocab_size);
        fprintf(f, "weights    %s, %.3f B params, %.2f GB; %.3f B active params/token (without embedding and lm_head)\n",
                r->dtype, r->params / 1e9, r->bytes / 1e9, r->active_params / 1e9);
    }
    fprintf(f, "machine    %s, %d logical cores, %d thread%s", mc->cpu, mc->cores, mc->threads, mc->threads == 1 ? "" : "s");
    if (mc->loadavg >= 0) fprintf(f, ", load average %.2f at start", mc->loadavg);
    fprintf(f, "; kernels %s", q3_kernels_desc());
    fprintf(f, "\n");
    if (r->has_model) {
        fprintf(f, "context    %d tokens (KV cache)\n", r->ctx);
        fprintf(f, "sampling   every step samples a token: temperature %g, top-k %d, top-p %g; %d rank%s\n",
                (double)r->sp.temperature, r->sp.top_k, (double)r->sp.top_p, r->world, r->world == 1 ? "" : "s");
    }
    fprintf(f, "FMA peak   %.1f GFLOP/s (%s, %d independent chains per thread, all threads)\n", r->fma.gflops,
            r->fma.method, r->fma.chains);
    if (r->fma.amx_gflops > 0)
        fprintf(f,
                "AMX peak   %.1f GFLOP/s (bf16 tile products, all threads); an fp32 product on BF16 weights takes\n"
                "           three of them (%.1f), an A8 product one; %% peak below is of the FMA peak\n",
                r->fma.amx_gflops, r->fma.amx_gflops / 3);
    if (r->membw.ran)
        fprintf(f, "mem read   best %.2f GB/s, median %.2f GB/s (%zu MiB buffer, %d passes, %s, all threads)\n",
                r->membw.best_gbs, r->membw.median_gbs, r->membw.bytes >> 20, r->membw.passes, r->membw.method);
    else fprintf(f, "mem read   not measured (--no-membw)\n");
    if (!r->has_model) return;
    const bench_beside *fb = &r->beside.flops, *rb = &r->beside.read;
    if (fb->n)
        fprintf(f, "           beside prefill: FMA %.1f to %.1f GFLOP/s over %d runs between the repetitions\n", fb->worst,
                fb->best, fb->n);
    if (rb->n)
        fprintf(f, "           beside decode: read %.2f to %.2f GB/s over %d passes over the model's first %zu MiB (its\n"
                   "           mapped weights) between the repetitions\n",
                rb->worst, rb->best, rb->n, r->beside.read_bytes >> 20);
    else if (r->membw.ran && r->decode.ran && r->world == 1)
        fprintf(f, "           beside decode: no reads (the model's largest file is smaller than the %zu MiB buffer)\n",
                r->membw.bytes >> 20);
    if (fb->n || rb->n) fprintf(f, "           %% peak and %% membw below are of the best the run saw, at the end or beside\n");

    if (r->n_prefill) {
        fprintf(f, "\nprefill (last-row logits and the first token sampled; %d reps each)\n", r->prefill[0].reps);
        fprintf(f, "  %8s %11s %11s %11s %10s %10s %8s | %12s %8s %8s\n", "tokens", "median ms", "min ms", "max ms", "tok/s",
                "GFLOP/s", "% peak", "matmul GF/s", "% peak", "% time");
        for (int i = 0; i < r->n_prefill; i++) {
            const bench_prefill_result *p = &r->prefill[i];
            fprintf(f, "  %8d %11.2f %11.2f %11.2f %10.1f %10.2f %8.1f | %12.2f %8.1f %8.1f\n", p->tokens, p->ms_median,
                    p->ms_min, p->ms_max, p->tok_s, p->gflops, pct(p->gflops, peak_gflops(r)), p->mm_gflops,
                    pct(p->mm_gflops, peak_gflops(r)), 100.0 * p->mm_share);
        }
        fprintf(f, "  (matmul: flops of the linear layers over the time inside them, every rep; %% time: their share)\n");
        for (int i = 0; i < r->n_prefill; i++) {
            const bench_prefill_result *p = &r->prefill[i];
            fprintf(f, "  %d tokens, matmuls by part (ms, GFLOP/s, %% peak):", p->tokens);
            for (int q = 0; q < Q3_MM_PARTS; q++)
                if (p->part_ms[q] > 0)
                    fprintf(f, " %s %.1f, %.1f, %.1f;", q3_mm_part_name((q3_mm_part)q), p->part_ms[q], p->part_gflops[q],
                            pct(p->part_gflops[q], peak_gflops(r)));
            fprintf(f, "\n  %d tokens, attention over the KV cache (QK^T, softmax, PV): %.1f ms, %.1f GFLOP/s, %.1f %% peak\n",
                    p->tokens, p->att_ms, p->att_gflops, pct(p->att_gflops, peak_gflops(r)));
        }
        for (int i = 0; i < r->n_prefill; i++) {
            const bench_prefill_result *p = &r->prefill[i];
            if (!p->has_load) continue;
            fprintf(f, "  %d tokens, experts by tokens routed to them (sparse layers x experts, first rep):", p->tokens);
            for (int b = 0; b < BENCH_LOAD_BUCKETS; b++)
                fprintf(f, " %s: %llu%s", bench_load_label(b), (unsigned long long)p->load[b], b + 1 < BENCH_LOAD_BUCKETS ? "," : "");
            fprintf(f, "\n");
        }
    }
    const bench_decode_result *d = &r->decode;
    if (d->ran) {
        fprintf(f, "\ndecode (1 token per step, logits and a sampled token every step; after a %d-token prefill; %d steps x %d reps)\n",
                d->depth, d->steps, d->reps);
        fprintf(f, "  %8s %8s %8s %8s %8s %12s %9s %8s\n", "p50 ms", "p90 ms", "p99 ms", "mean ms", "tok/s", "weight MB/tok",
                "GB/s", "% membw");
        char pm[16];
        if (r->membw.ran) snprintf(pm, sizeof pm, "%.1f", pct(d->gbs, read_gbs(r)));
        else snprintf(pm, sizeof pm, "-");
        fprintf(f, "  %8.2f %8.2f %8.2f %8.2f %8.2f %12.2f %9.2f %8s\n", d->p50, d->p90, d->p99, d->mean, d->tok_s,
                d->weight_bytes / 1e6, d->gbs, pm);
        if (r->cfg.is_moe)
            fprintf(f, "  weight bytes/token: %.2f MB fixed (attention, norms, router/dense MLP, lm_head, 1 embedding row)\n"
                       "                     + %.2f MB experts (%.1f expert reads/token over all layers)\n",
                    d->fixed_bytes / 1e6, d->expert_bytes / 1e6, d->expert_hits_per_token);
        else
            fprintf(f, "  weight bytes/token: %.2f MB (attention, norms, MLP, lm_head, 1 embedding row)\n", d->fixed_bytes / 1e6);
        fprintf(f, "  KV cache read: %.2f MB/token on average (not included above)\n", d->kv_bytes / 1e6);
        fprintf(f, "  attention over the KV cache: %.2f ms/token on average, %.1f %% of the step; K/V at %.2f GB/s\n", d->att_ms,
                100.0 * d->att_share, d->att_ms > 0 ? d->kv_bytes / (d->att_ms * 1e6) : 0);
        fprintf(f, "  matmuls: %.2f ms/token on average, %.1f %% of the step; the weights at %.2f GB/s inside them\n", d->mm_ms,
                100.0 * d->mm_share, d->mm_ms > 0 ? d->weight_bytes / (d->mm_ms * 1e6) : 0);
        fprintf(f, "  by part (ms/token, MB/token, GB/s):");
        for (int p = 0; p < Q3_MM_PARTS; p++)
            if (d->part_ms[p] > 0)
                fprintf(f, " %s %.2f, %.1f, %.1f;", q3_mm_part_name((q3_mm_part)p), d->part_ms[p], d->part_bytes[p] / 1e6,
                        d->part_bytes[p] / (d->part_ms[p] * 1e6));
        fprintf(f, "\n");
    }
    const bench_ttft *t = &r->ttft;
    if (t->ran) {
        fprintf(f, "\ntime to first token (fresh `q3moe generate` process, %d-token prompt by --ids, -n 1, greedy)\n",
                t->prompt_tokens);
        fprintf(f, "  cold %10.1f ms  (process exit %.1f ms, peak RSS %.1f MiB); cold = %d checkpoint files evicted from\n"
                   "                     the page cache with posix_fadvise(DONTNEED), %.1f%% of their bytes still resident after\n",
                t->cold_ms, t->cold_exit_ms, t->cold_rss_kb / 1024.0, t->evicted_files, 100 * t->resident_after_evict);
        fprintf(f, "  warm %10.1f ms  (process exit %.1f ms, peak RSS %.1f MiB); second of two runs after the cold one\n",
                t->warm_ms, t->warm_exit_ms, t->warm_rss_kb / 1024.0);
    }
    if (r->comm_stats) print_comm(f, r);
    if (r->hugepages)
        fprintf(f, "\nweights    --hugepages: copied into anonymous memory, %.2f GB of it in 2 MiB pages\n", r->huge_bytes / 1e9);
    else
        fprintf(f,
                "\nweights    mapped: %.2f GB of %.2f GB under 2 MiB page entries (FilePmdMapped; the rest under 4 KiB ones,\n"
                "           or never touched)\n",
                r->file_pmd_bytes / 1e9, r->bytes / 1e9);
    fprintf(f, "\npeak RSS   bench process %.1f MiB (model runs)", r->rss_kb / 1024.0);
    if (t->ran) fprintf(f, ", TTFT child %.1f MiB", (t->cold_rss_kb > t->warm_rss_kb ? t->cold_rss_kb : t->warm_rss_kb) / 1024.0);
    fprintf(f, "\n");
}

static void set_num(json_t *o, const char *k, double v) { json_object_set_new(o, k, json_real(v)); }
static void set_int(json_t *o, const char *k, long long v) { json_object_set_new(o, k, json_integer((json_int_t)v)); }
static void set_str(json_t *o, const char *k, const char *v) { json_object_set_new(o, k, json_string(v)); }

/* "beside": {"best_<unit>", "worst_<unit>", "<count>"[, "bytes"]}, or null
 * when nothing was sampled. */
static void set_beside(json_t *o, const bench_beside *b, const char *unit, const char *count, size_t bytes) {
    if (!b->n) {
        json_object_set_new(o, "beside", json_null());
        return;
    }
    json_t *s = json_object();
    char k[32];
    snprintf(k, sizeof k, "best_%s", unit);
    set_num(s, k, b->best);
    snprintf(k, sizeof k, "worst_%s", unit);
    set_num(s, k, b->worst);
    set_int(s, count, b->n);
    if (bytes) set_int(s, "bytes", (long long)bytes);
    json_object_set_new(o, "beside", s);
}

/* A new empty object at o[k]. */
static json_t *add_object(json_t *o, const char *k) {
    json_t *e = json_object();
    json_object_set_new(o, k, e);
    return e;
}

/* One phase of --comm-stats, everything per unit (prompt or token). */
static json_t *comm_json(const bench_comm *b, const char *per) {
    json_t *o = json_object(), *kinds = json_object(), *layers = json_array();
    const double u = b->units;
    set_str(o, "per", per);
    set_num(o, "units_measured", u);
    double comm = 0;
    for (int k = 0; k < Q3_COLL_N; k++) {
        const q3_comm_stat *s = &b->coll[k];
        comm += s->seconds;
        if (!s->calls) continue;
        json_t *j = json_object();
        set_num(j, "calls", s->calls / u);
        set_num(j, "bytes_sent", s->bytes_sent / u);
        set_num(j, "bytes_recv", s->bytes_recv / u);
        set_num(j, "ms", s->seconds * 1e3 / u);
        json_object_set_new(kinds, q3_coll_name((q3_coll)k), j);
    }
    json_object_set_new(o, "collectives", kinds);
    set_num(o, "bytes_sent", bench_comm_bytes_per_unit(b));
    set_num(o, "comm_ms", comm * 1e3 / u);
    set_num(o, "wall_ms", b->step_s * 1e3 / u);
    double lw = 0, lc = 0;
    for (int l = 0; l < b->layers; l++) {
        json_t *j = json_object();
        double w = b->layer_s[l] / u, c = b->layer_comm_s[l] / u;
        lw += w, lc += c;
        set_int(j, "layer", l);
        set_num(j, "wall_ms", w * 1e3);
        set_num(j, "compute_ms", (w - c) * 1e3);
        set_num(j, "comm_ms", c * 1e3);
        json_array_append_new(layers, j);
    }
    json_object_set_new(o, "layers", layers);
    json_t *rest = json_object();
    set_num(rest, "wall_ms", (b->step_s / u - lw) * 1e3);
    set_num(rest, "comm_ms", (comm / u - lc) * 1e3);
    json_object_set_new(o, "outside_layers", rest);
    return o;
}

int bench_write_json(const char *path, int force, const bench_results *r) {
    json_t *root = json_object(), *o;
    set_int(root, "q3moe_bench_version", 1);
    const bench_machine *mc = &r->machine;
    json_object_set_new(root, "machine", o = json_object());
    set_str(o, "cpu", mc->cpu);
    set_int(o, "cores", mc->cores);
    set_int(o, "threads", mc->threads);
    set_str(o, "kernels", q3_kernels_desc());
    if (mc->loadavg >= 0) set_num(o, "loadavg_1m", mc->loadavg);
    else json_object_set_new(o, "loadavg_1m", json_null());
    json_object_set_new(root, "fma_peak", o = json_object());
    set_num(o, "gflops", r->fma.gflops);
    set_str(o, "method", r->fma.method);
    set_int(o, "chains_per_thread", r->fma.chains);
    if (r->fma.amx_gflops > 0) set_num(o, "amx_gflops", r->fma.amx_gflops);
    set_num(o, "ceiling_gflops", peak_gflops(r));
    set_beside(o, &r->beside.flops, "gflops", "runs", 0);
    if (r->membw.ran) {
        json_object_set_new(root, "membw", o = json_object());
        set_num(o, "best_gbs", r->membw.best_gbs);
        set_num(o, "median_gbs", r->membw.median_gbs);
        set_int(o, "buffer_bytes", (long long)r->membw.bytes);
        set_int(o, "passes", r->membw.passes);
        set_str(o, "method", r->membw.method);
        set_num(o, "ceiling_gbs", read_gbs(r));
        set_beside(o, &r->beside.read, "gbs", "passes", r->beside.read_bytes);
    } else json_object_set_new(root, "membw", json_null());
    if (r->has_model) {
        const q3_config *c = &r->cfg;
        json_object_set_new(root, "model", o = json_object());
        set_str(o, "dir", r->dir);
        set_str(o, "name", r->name);
        set_str(o, "model_type", c->is_moe ? "qwen3_moe" : "qwen3");
        set_int(o, "layers", c->num_layers);
        set_int(o, "hidden_size", c->hidden_size);
        set_int(o, "num_heads", c->num_heads);
        set_int(o, "num_kv_heads", c->num_kv_heads);
        set_int(o, "head_dim", c->head_dim);
        set_int(o, "num_experts", c->num_experts);
        set_int(o, "top_k", c->num_experts_per_tok);
        set_int(o, "moe_intermediate_size", c->moe_intermediate_size);
        set_int(o, "intermediate_size", c->intermediate_size);
        set_int(o, "vocab_size", c->vocab_size);
        set_str(o, "dtype", r->dtype);
        set_num(o, "params", r->params);
        set_num(o, "bytes", r->bytes);
        set_num(o, "active_params_per_token", r->active_params);
        set_int(root, "ctx", r->ctx);
        json_t *pa = json_array();
        for (int i = 0; i < r->n_prefill; i++) {
            const bench_prefill_result *p = &r->prefill[i];
            json_array_append_new(pa, o = json_object());
            set_int(o, "tokens", p->tokens);
            set_int(o, "reps", p->reps);
            set_num(o, "ms_median", p->ms_median);
            set_num(o, "ms_min", p->ms_min);
            set_num(o, "ms_max", p->ms_max);
            set_num(o, "tokens_per_s", p->tok_s);
            set_num(o, "flops", p->flops);
            set_num(o, "gflops", p->gflops);
            set_num(o, "pct_fma_peak", pct(p->gflops, peak_gflops(r)));
            set_num(o, "matmul_flops", p->mm_flops);
            set_num(o, "matmul_gflops", p->mm_gflops);
            set_num(o, "matmul_pct_fma_peak", pct(p->mm_gflops, peak_gflops(r)));
            set_num(o, "matmul_time_share", p->mm_share);
            set_num(o, "attention_ms", p->att_ms);
            set_num(o, "attention_gflops", p->att_gflops);
            json_t *parts = add_object(o, "matmul_parts");
            for (int q = 0; q < Q3_MM_PARTS; q++) {
                if (p->part_ms[q] <= 0) continue;
                json_t *e = add_object(parts, q3_mm_part_name((q3_mm_part)q));
                set_num(e, "ms", p->part_ms[q]);
                set_num(e, "gflops", p->part_gflops[q]);
            }
            if (p->has_load) {
                json_t *ld = add_object(o, "expert_load");
                for (int b = 0; b < BENCH_LOAD_BUCKETS; b++) set_int(ld, bench_load_label(b), (long long)p->load[b]);
            }
        }
        json_object_set_new(root, "prefill", pa);
        const bench_decode_result *d = &r->decode;
        if (d->ran) {
            json_object_set_new(root, "decode", o = json_object());
            set_int(o, "depth", d->depth);
            set_int(o, "steps", d->steps);
            set_int(o, "reps", d->reps);
            set_num(o, "ms_p50", d->p50);
            set_num(o, "ms_p90", d->p90);
            set_num(o, "ms_p99", d->p99);
            set_num(o, "ms_mean", d->mean);
            set_num(o, "tokens_per_s", d->tok_s);
            set_num(o, "weight_bytes_per_token", d->weight_bytes);
            set_num(o, "fixed_bytes_per_token", d->fixed_bytes);
            set_num(o, "expert_bytes_per_token", d->expert_bytes);
            set_num(o, "expert_reads_per_token", d->expert_hits_per_token);
            set_num(o, "kv_bytes_per_token", d->kv_bytes);
            set_num(o, "gbs", d->gbs);
            set_num(o, "matmul_ms_per_token", d->mm_ms);
            set_num(o, "matmul_time_share", d->mm_share);
            set_num(o, "attention_ms_per_token", d->att_ms);
            set_num(o, "attention_time_share", d->att_share);
            json_t *parts = add_object(o, "matmul_parts");
            for (int p = 0; p < Q3_MM_PARTS; p++) {
                if (d->part_ms[p] <= 0) continue;
                json_t *q = add_object(parts, q3_mm_part_name((q3_mm_part)p));
                set_num(q, "ms_per_token", d->part_ms[p]);
                set_num(q, "weight_bytes_per_token", d->part_bytes[p]);
                set_num(q, "gbs", d->part_bytes[p] / (d->part_ms[p] * 1e6));
            }
            if (r->membw.ran) set_num(o, "pct_membw", pct(d->gbs, read_gbs(r)));
            else json_object_set_new(o, "pct_membw", json_null());
        } else json_object_set_new(root, "decode", json_null());
        const bench_ttft *t = &r->ttft;
        if (t->ran) {
            json_object_set_new(root, "ttft", o = json_object());
            set_int(o, "prompt_tokens", t->prompt_tokens);
            set_num(o, "cold_ms", t->cold_ms);
            set_num(o, "warm_ms", t->warm_ms);
            set_num(o, "cold_exit_ms", t->cold_exit_ms);
            set_num(o, "warm_exit_ms", t->warm_exit_ms);
            set_int(o, "cold_peak_rss_bytes", (long long)t->cold_rss_kb * 1024);
            set_int(o, "warm_peak_rss_bytes", (long long)t->warm_rss_kb * 1024);
            set_str(o, "cold_method", "posix_fadvise(POSIX_FADV_DONTNEED) on the checkpoint files");
            set_int(o, "evicted_files", t->evicted_files);
            set_num(o, "evicted_bytes", t->evicted_bytes);
            set_num(o, "resident_fraction_after_evict", t->resident_after_evict);
        } else json_object_set_new(root, "ttft", json_null());
        set_int(root, "peak_rss_bytes", (long long)r->rss_kb * 1024);
        json_object_set_new(root, "hugepages", json_boolean(r->hugepages));
        set_num(root, "huge_page_bytes", (double)r->huge_bytes);
        set_num(root, "file_pmd_mapped_bytes", (double)r->file_pmd_bytes);
        json_object_set_new(root, "sampling", o = json_object());
        set_num(o, "temperature", r->sp.temperature);
        set_int(o, "top_k", r->sp.top_k);
        set_num(o, "top_p", r->sp.top_p);
        set_int(root, "ranks", r->world);
        if (r->comm_stats) {
            json_t *cs = json_object(), *pa = json_array();
            set_int(cs, "rank", 0);
            for (int i = 0; i < r->n_prefill; i++) {
                json_t *j = comm_json(&r->prefill_comm[i], "prompt");
                set_int(j, "tokens", r->prefill[i].tokens);
                json_array_append_new(pa, j);
            }
            json_object_set_new(cs, "prefill", pa);
            json_object_set_new(cs, "decode", r->decode.ran ? comm_json(&r->decode_comm, "token") : json_null());
            json_object_set_new(root, "comm_stats", cs);
        }
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL), 0644);
    if (fd < 0) {
        json_decref(root);
        if (errno == EEXIST) return q3_err("--json: %s already exists (use --force to overwrite)", path);
        return q3_err("--json: cannot create %s: %s", path, strerror(errno));
    }
    FILE *f = fdopen(fd, "w");
    int rc = 0;
    if (!f) {
        close(fd);
        rc = q3_err("--json: %s: %s", path, strerror(errno));
    } else {
        if (json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) || fputc('\n', f) == EOF) rc = -1;
        if (fclose(f) || rc) {
            rc = q3_err("--json: writing %s failed", path);
            q3_remove_partial(path);
        }
    }
    json_decref(root);
    return rc;
}
