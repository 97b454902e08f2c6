#include "cli/bench_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/attention.h"
#include "util/error.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int g_log = 1;

void bench_log_enable(int on) { g_log = on; }

void bench_log(const char *fmt, ...) {
    if (!g_log) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("[bench] ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

void bench_fill_ids(int32_t *ids, int n, int vocab, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        /* splitmix64 */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        ids[i] = (int32_t)(z % (uint64_t)vocab);
    }
}

double bench_active_params(const q3_config *c) {
    const double H = c->hidden_size, QD = (double)c->num_heads * c->head_dim, KVD = (double)c->num_kv_heads * c->head_dim;
    double p = 0;
    for (int l = 0; l < c->num_layers; l++) {
        p += QD * H + 2 * KVD * H + H * QD;
        if (c->layer_is_sparse[l])
            p += (double)c->num_experts * H + (double)c->num_experts_per_tok * 3.0 * c->moe_intermediate_size * H;
        else p += 3.0 * c->intermediate_size * H;
    }
    return p;
}

double bench_attention_flops(const q3_config *c, int pos0, int T) {
    const double keys = (double)T * pos0 + (double)T * (T + 1) / 2; /* row t sees pos0 + t + 1 keys */
    return 4.0 * c->head_dim * c->num_heads * keys * c->num_layers;
}

double bench_prefill_flops(const q3_config *c, int P) {
    return 2.0 * bench_active_params(c) * P + bench_attention_flops(c, 0, P) + 2.0 * c->vocab_size * (double)c->hidden_size;
}

void bench_checkpoint_size(const q3_model *m, double *params, double *bytes, const char **dtype) {
    *params = *bytes = 0;
    *dtype = "none";
    for (int i = 0; i < m->st.n_tensors; i++) {
        const q3_st_tensor *t = &m->st.tensors[i];
        double numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (double)t->shape[d];
        *bytes += (double)t->nbytes + (double)t->scales_nbytes;
        *params += numel;
        if (i == 0) *dtype = q3_dtype_name(t->dtype);
        else if (strcmp(*dtype, q3_dtype_name(t->dtype))) *dtype = "mixed";
    }
}

static double mat_bytes(const q3_mat *w) { return (double)q3_mat_bytes(w); }

double bench_decode_fixed_bytes(const q3_model *m) {
    const q3_config *c = &m->cfg;
    const double F32 = sizeof(float);
    double b = 0;
    for (int l = 0; l < c->num_layers; l++) {
        const q3_layer *L = &m->layers[l];
        b += mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo);
        b += F32 * (2.0 * c->hidden_size + 2.0 * c->head_dim); /* attn/mlp norm, q/k norm */
        if (L->sparse) b += mat_bytes(&L->router);
        else b += mat_bytes(&L->ffn_gate) + mat_bytes(&L->ffn_up) + mat_bytes(&L->ffn_down);
    }
    b += mat_bytes(&m->lm_head) + F32 * c->hidden_size;
    b += (double)c->hidden_size * (double)q3_dtype_size(m->embed.dtype);
    return b;
}

double bench_expert_bytes(const q3_model *m, const uint64_t *hits) {
    const q3_config *c = &m->cfg;
    double b = 0;
    if (!c->is_moe) return 0;
    for (int l = 0; l < c->num_layers; l++) {
        const q3_layer *L = &m->layers[l];
        if (!L->sparse) continue;
        for (int e = 0; e < c->num_experts; e++) {
            uint64_t h = hits[(size_t)l * c->num_experts + e];
            if (h) b += (double)h * (mat_bytes(&L->gate[e]) + mat_bytes(&L->up[e]) + mat_bytes(&L->down[e]));
        }
    }
    return b;
}

double bench_kv_bytes(const q3_config *c, int pos) {
    return 2.0 * c->num_layers * (double)(pos + 1) * c->num_kv_heads * c->head_dim * sizeof(float);
}

/* Read passes per sample beside decode, plain and prefetching in turn
 * (bench_read_pass): one pass is easily caught by a neighbour's burst. */
enum { READS_PER_SAMPLE = 4 };

static void sample_fma(bench_ceilings *cl) {
    if (cl && cl->fma) bench_beside_add(&cl->flops, bench_fma_pass());
}

static void sample_read(bench_ceilings *cl) {
    if (!cl || !cl->read_p) return;
    if (!cl->read.n) (void)bench_read_pass(cl->read_p, cl->read_bytes, 0); /* untimed: maps any page not mapped yet */
    for (int i = 0; i < READS_PER_SAMPLE; i++) bench_beside_add(&cl->read, bench_read_pass(cl->read_p, cl->read_bytes, i & 1));
}

const char *bench_load_label(int bucket) {
    static const char *const labels[BENCH_LOAD_BUCKETS] = {"0", "1-8", "9-16", "17-32", "33-64", "65-128", "129+"};
    return bucket >= 0 && bucket < BENCH_LOAD_BUCKETS ? labels[bucket] : "?";
}

void bench_expert_load(const q3_model *m, const uint64_t *after, const uint64_t *before, uint64_t load[BENCH_LOAD_BUCKETS]) {
    static const uint64_t top[BENCH_LOAD_BUCKETS - 1] = {0, 8, 16, 32, 64, 128}; /* each bucket's largest count */
    const int E = m->cfg.num_experts;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        if (!m->layers[l].sparse) continue;
        for (int e = 0; e < E; e++) {
            const uint64_t n = after[(size_t)l * E + e] - before[(size_t)l * E + e];
            int b = 0;
            while (b < BENCH_LOAD_BUCKETS - 1 && n > top[b]) b++;
            load[b]++;
        }
    }
}

int bench_run_prefill(q3_session *se, q3_sampler *smp, const int32_t *ids, int P, int reps, double *ms,
                      q3_matmul_stats *mm, double *att_s, bench_ceilings *cl, uint64_t load[BENCH_LOAD_BUCKETS]) {
    const q3_config *c = &se->model.cfg;
    const size_t nh = load && se->state.expert_hits ? (size_t)c->num_layers * c->num_experts : 0;
    uint64_t *before = nh ? q3_malloc(nh * sizeof *before) : NULL;
    if (load) memset(load, 0, BENCH_LOAD_BUCKETS * sizeof *load);
    int rc = 0;
    q3_matmul_stats_reset();
    q3_attention_seconds_reset();
    for (int r = 0; rc == 0 && r < reps; r++) {
        sample_fma(cl);
        q3_state_reset(&se->state);
        if (r == 0 && nh) memcpy(before, se->state.expert_hits, nh * sizeof *before);
        double t0 = now_ms();
        if (q3_forward(&se->model, &se->state, ids, P, se->logits, 0)) {
            rc = -1;
            break;
        }
        const int32_t tok = session_sample(se, smp);
        ms[r] = now_ms() - t0;
        if (r == 0 && tok == Q3_SAMPLE_NONE) /* the timings stand; what the model says does not */
            bench_log("warning: every logit of the prefill is NaN (a NaN or infinite weight or an activation overflow; "
                      "`q3moe generate` names the weight)\n");
        if (r == 0 && nh) bench_expert_load(&se->model, se->state.expert_hits, before, load);
        bench_log("prefill %d tokens, rep %d/%d: %.2f ms\n", P, r + 1, reps, ms[r]);
    }
    free(before);
    if (rc) return rc;
    *mm = q3_matmul_stats_get();
    *att_s = q3_attention_seconds();
    sample_fma(cl);
    return 0;
}

int bench_run_decode(q3_session *se, q3_sampler *smp, const int32_t *ids, int depth, int n, int reps, double *ms,
                     uint64_t *hits_delta, q3_matmul_stats *mm, double *att_s, bench_ceilings *cl) {
    const q3_model *m = &se->model;
    q3_state *s = &se->state;
    const q3_config *c = &m->cfg;
    const size_t nh = c->is_moe ? (size_t)c->num_layers * c->num_experts : 0;
    uint64_t *before = nh ? q3_malloc(nh * sizeof *before) : NULL;
    if (nh) memset(hits_delta, 0, nh * sizeof *hits_delta);
    int rc = 0;
    *mm = (q3_matmul_stats){0};
    *att_s = 0;
    for (int r = 0; rc == 0 && r < reps; r++) {
        sample_read(cl); /* before the untimed prefill, which warms the caches again */
        q3_state_reset(s);
        if (depth > 0 && q3_forward(m, s, ids, depth, NULL, 0)) rc = -1;
        q3_matmul_stats_reset();
        q3_attention_seconds_reset();
        if (nh && s->expert_hits) memcpy(before, s->expert_hits, nh * sizeof *before);
        double sum = 0;
        for (int i = 0; rc == 0 && i < n; i++) {
            double t0 = now_ms();
            if (q3_forward(m, s, ids + depth + i, 1, se->logits, 0)) rc = -1;
            else (void)session_sample(se, smp);
            ms[(size_t)r * n + i] = now_ms() - t0;
            sum += ms[(size_t)r * n + i];
        }
        const q3_matmul_stats st = q3_matmul_stats_get();
        q3_matmul_stats_add(mm, &st);
        *att_s += q3_attention_seconds();
        if (rc == 0 && nh && s->expert_hits)
            for (size_t k = 0; k < nh; k++) hits_delta[k] += s->expert_hits[k] - before[k];
        if (rc == 0) bench_log("decode at depth %d, rep %d/%d: %d steps, mean %.2f ms/token\n", depth, r + 1, reps, n, sum / n);
    }
    if (rc == 0) sample_read(cl);
    free(before);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_percentile(double *v, int n, double pct) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = pct / 100.0 * (n - 1);
    int i = (int)pos;
    if (i >= n - 1) return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}
