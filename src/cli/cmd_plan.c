/* `q3moe plan`: the parallel plan of a model over N ranks (who holds what),
 * and a prediction of per-rank memory traffic, communication and latency
 * per decode token and per prompt. Reads config.json only, never weights.
 *
 * Model (every rank does the same work: the plan's rules make all splits
 * even). Memory: the weights a step touches, read once per step, plus the
 * fp32 KV cache; time = bytes / membw (and, with --gflops, the larger of
 * that and flops / gflops). Experts, uniform routing: a decode token's
 * top_k experts fall on this EP rank top_k / ep times on average; a prompt
 * of S tokens touches (E/ep) (1 - (1 - top_k/E)^S) of the rank's experts.
 * Communication: per collective call, the link bytes of the comm layer's
 * convention (q3_comm_payload, src/parallel/comm.h), time = bytes / link +
 * latency. Nothing overlaps. Which collectives run:
 *   decode (one token, replicated on every rank)
 *     attention, dense MLP   allreduce_sum  attn_tp  H fp32
 *     MoE                    allreduce_sum  world    H fp32 (every rank
 *                            holds a share of the token's experts); with
 *                            moe_ep_comm alltoall, moe_alltoall_rows (two
 *                            alltoallv over moe_ep, expected bytes; the
 *                            shares' moe_tp sum and allgather)
 *     lm_head                allgather      lmhead   the sampling candidates: K (id,
 *                            logit) pairs of 8 bytes for top-k K (1 when greedy;
 *                            q3_sampler_cands_per_rank), or V/L fp32 logits when
 *                            --top-k 0 (top-k off: whole rows, as `logits` does)
 *   prefill, S tokens, without sequence parallelism: as decode with S
 *     rows (alltoall: S tokens shared), lm_head on the last token only.
 *   prefill with SP (attn_tp == moe_ep = A; s = ceil(S / A) rows per rank;
 *   forward.c and moe.c run exactly these)
 *     attention              allgather (s rows of H, comm_quant) attn_tp
 *                            + alltoall (s rows of Q/A * head_dim per peer, comm_quant)
 *     dense MLP              allgather (s H, comm_quant) + reduce_scatter_sum (s H fp32)
 *     MoE, allgather mode    allgather (s rows of H (comm_quant) + 2 top_k fp32: ids and
 *                            weights) + reduce_scatter_sum (s H fp32)  moe_ep
 *     MoE, alltoall mode     alltoall of per-expert counts (E/ep int32 per peer)
 *                            + alltoallv dispatch (here: uniform routing, ceil(s top_k / ep)
 *                            rows per peer, comm_quant) + alltoallv combine (same rows, fp32)
 *     MoE, moe_tp > 1        allreduce_sum (s H fp32)  moe_tp
 *     last token             broadcast (H fp32) attn_tp from its owner, then lm_head
 *                            allgather (as decode)
 * comm_quant mxfp8 moves n + n/32 bytes per quantized row of n instead of 4 n
 * (q3_comm_wire_row_bytes). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/config.h"
#include "parallel/comm.h"
#include "parallel/plan.h"
#include "sample/sampler.h"
#include "io/q3m.h"
#include "quant/convert.h"
#include "model/model.h"
#include "util/error.h"
#include "util/file.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe plan -m MODEL --ranks N [options]\n\n"
            "Prints how MODEL is split over N ranks (groups, heads, KV heads, experts, vocab\n"
            "slices) and predicts per-rank memory traffic, communication and time per decode\n"
            "token and per prompt. Reads MODEL's config.json only (no weights needed).\n\n"
            "  -m MODEL               checkpoint directory holding config.json, or a .q3m file\n"
            "                         (its scheme is the default --quant; default: the --config\n"
            "                         file's model_path)\n"
            "  --ranks N              number of ranks (MPI world size)\n"
            "  --config FILE          YAML plan: model_path, parallel_config {attn_tp_size,\n"
            "                         moe_tp_size, moe_ep_size, lmhead_tp_size, moe_ep_comm,\n"
            "                         comm_quant}\n");
    q3_plan_flags_help(f);
    fprintf(f,
            "  --quant SCHEME         weight storage: bf16 (the default for a directory), bf16p,\n"
            "                         w8a8, w4a8, w8a8i, w4a8i, w8, w4 (w4*: experts/MLP MXFP4;\n"
            "                         attention MXFP8 except w4, MXINT8 in the i schemes: the\n"
            "                         same bytes; bf16p: all but the embeddings in 12.5 bits);\n"
            "                         a .q3m's default is its own scheme\n"
            "  --prompt P             prompt length in tokens (default 512); decode is timed at\n"
            "                         context P\n"
            "  --membw-gbps M         memory read bandwidth per rank, GB/s (default 100)\n"
            "  --link-gbps G          link bandwidth per rank, GB/s = 1e9 bytes/s (default 25)\n"
            "  --link-latency-us U    fixed cost per collective call, microseconds (default 5)\n"
            "  --top-k K              sampling of generate/bench: each lm_head rank sends its K best\n"
            "                         (id, logit) pairs per sampled token (default 20, generate's;\n"
            "                         1 = greedy; 0 = top-k off: whole logits rows are gathered)\n"
            "  --gflops F             compute per rank, GFLOP/s: time = max(bytes/membw,\n"
            "                         flops/F) (default: memory only)\n"
            "  --json FILE            also write the prediction as JSON (an existing FILE is\n"
            "                         refused unless --force)\n"
            "  --force                overwrite the --json FILE\n");
}

static int fail(int code, const char *fmt, ...) Q3_PRINTF(2, 3);
static int fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("q3moe plan: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* ------------------------------------------------------------ model */

typedef struct {
    const char *name;
    double attn, ffn;   /* bytes per weight element */
    int mx;             /* MX-quantized weights (the slicing rules of q3_plan_validate) */
    double head;        /* lm_head bytes per element where not tied to the embeddings (0: OTHER_B) */
} scheme;

#define MXFP8_B (33.0 / 32.0)   /* one byte + one E8M0 scale per 32 */
#define MXFP4_B (17.0 / 32.0)   /* half a byte + one scale per 32 */
#define BF16P_B (12.5 / 8.0)    /* 12.5 bits, its few raw groups aside */
static const scheme schemes[] = {
    {"bf16", 2, 2, 0, 0},           {"w8a8", MXFP8_B, MXFP8_B, 1, 0}, {"w4a8", MXFP8_B, MXFP4_B, 1, 0},
    {"w8a8i", MXFP8_B, MXFP8_B, 1, 0}, {"w4a8i", MXFP8_B, MXFP4_B, 1, 0}, /* MXINT8: 1 byte + scale, as MXFP8 */
    {"w8", MXFP8_B, MXFP8_B, 1, 0}, {"w4", MXFP4_B, MXFP4_B, 1, 0},    {"bf16p", BF16P_B, BF16P_B, 0, BF16P_B},
};
#define OTHER_B 2.0   /* embeddings, norms, router, lm_head (unless the scheme says): BF16 */
#define ACT_B 4u      /* fp32 activations */
#define KV_B 4.0      /* fp32 KV cache */

typedef struct {
    const char *phase, *where, *group;
    q3_coll kind;
    int gsize;
    double calls;
    uint64_t sent, recv;   /* per call */
    double ms;             /* all calls */
} comm_row;

#define MAX_ROWS 32
typedef struct {
    double attn, kv, router, experts, dense, other;   /* bytes */
    double flops;
    double mem_ms, compute_ms, comm_ms, total_ms;
    comm_row rows[MAX_ROWS];
    int n_rows;
} phase_model;

typedef struct {
    double link_Bps, lat_s, membw_Bps, flops_ps;
} machine;

/* A row of calls whose link bytes per call are sent / recv. */
static void add_comm_bytes(phase_model *m, const machine *mc, const char *phase, const char *where, q3_coll kind,
                           const char *group, int gsize, double calls, uint64_t sent, uint64_t recv) {
    if (gsize <= 1 || calls <= 0 || m->n_rows == MAX_ROWS) return;
    comm_row *r = &m->rows[m->n_rows++];
    *r = (comm_row){.phase = phase, .where = where, .group = group, .kind = kind, .gsize = gsize, .calls = calls,
                    .sent = sent, .recv = recv};
    const double b = (double)(sent > recv ? sent : recv);
    r->ms = calls * (b / mc->link_Bps + mc->lat_s) * 1e3;
    m->comm_ms += r->ms;
}

/* A row of calls of `bytes` each, in the comm layer's convention (q3_comm_payload). */
static void add_comm(phase_model *m, const machine *mc, const char *phase, const char *where, q3_coll kind,
                     const char *group, int gsize, double calls, uint64_t bytes, int is_root) {
    uint64_t sent, recv;
    q3_comm_payload(kind, gsize, bytes, is_root, &sent, &recv);
    add_comm_bytes(m, mc, phase, where, kind, group, gsize, calls, sent, recv);
}

static void finish(phase_model *m, const machine *mc) {
    double bytes = m->attn + m->kv + m->router + m->experts + m->dense + m->other;
    m->mem_ms = bytes / mc->membw_Bps * 1e3;
    m->compute_ms = m->mem_ms;
    if (mc->flops_ps > 0 && m->flops / mc->flops_ps * 1e3 > m->compute_ms) m->compute_ms = m->flops / mc->flops_ps * 1e3;
    m->total_ms = m->compute_ms + m->comm_ms;
}

/* Bytes on the wire of one row of n floats whose first nq are MXFP8 under
 * comm_quant (the comm layer's own formula). */
static uint64_t wire_row(const q3_plan *p, int n, int nq) {
    return q3_comm_wire_row_bytes((size_t)n, p->comm_quant == Q3_COMM_QUANT_MXFP8 ? (size_t)nq : 0);
}

typedef struct {
    int valid;                 /* SP prefill with an EP exchange */
    uint64_t allgather, alltoall;   /* link bytes per rank per MoE layer */
    uint64_t a2a_rows;         /* rows per peer, alltoall dispatch */
} ep_alt;

static uint64_t sent_of(q3_coll kind, int n, uint64_t bytes) {
    uint64_t s, r;
    q3_comm_payload(kind, n, bytes, 0, &s, &r);
    return s > r ? s : r;
}

typedef struct {
    double weights, kv;   /* bytes held per rank: weights, KV cache at the prompt's length */
} resident;

/* AlltoAll EP with the T tokens on every rank (decode, and prefill without
 * SP; moe.c's moe_forward_alltoall), as rank 0 counts it: the EP ranks take
 * shares of the tokens (rank i: [i T / ep, (i + 1) T / ep)), send each
 * pair's row to its expert's rank and get the outputs back (alltoallv:
 * rows to peers only; uniform routing: a pair's expert is on a given rank
 * 1 / ep of the time, so these are expected bytes), sum the moe_tp
 * partials of their share, and allgather the shares (ceil(T / ep) rows
 * each). */
static void moe_alltoall_rows(phase_model *m, const machine *mc, const char *phase, const q3_plan *p, long T, int layers) {
    const int E = p->moe_ep_size, Hn = p->hidden;
    const double own = (double)(T / E), others = (double)T - own, pairs_out = own * p->top_k * (E - 1) / E,
                 pairs_in = others * p->top_k / E;
    const uint64_t row_in = wire_row(p, Hn, Hn), row_out = (uint64_t)Hn * ACT_B;
    add_comm_bytes(m, mc, phase, "MoE dispatch", Q3_COLL_ALLTOALLV, "moe_ep", E, layers, (uint64_t)llround(pairs_out * row_in),
                   (uint64_t)llround(pairs_in * row_in));
    add_comm_bytes(m, mc, phase, "MoE combine", Q3_COLL_ALLTOALLV, "moe_ep", E, layers, (uint64_t)llround(pairs_in * row_out),
                   (uint64_t)llround(pairs_out * row_out));
    if (own > 0) add_comm(m, mc, phase, "MoE tp sum", Q3_COLL_ALLREDUCE, "moe_tp", p->moe_tp_size, layers, (uint64_t)own * row_out, 0);
    add_comm(m, mc, phase, "MoE shares", Q3_COLL_ALLGATHER, "moe_ep", E, layers, (uint64_t)((T + E - 1) / E) * row_out, 0);
}

static void predict(const q3_plan *p, const q3_config *c, const scheme *sc, long S, long top_k, const machine *mc,
                    phase_model *dec, phase_model *pre, ep_alt *alt, double *hit_out, resident *res) {
    int W = p->world_size, A = p->attn_tp_size, E = p->moe_ep_size, T = p->moe_tp_size, L = p->lmhead_tp_size;
    q3_rank_assign a;
    q3_plan_rank(p, 0, &a);
    double H = p->hidden, D = p->head_dim, Qr = a.q_hi - a.q_lo, KVr = a.kv_hi - a.kv_lo;
    double N = p->num_experts, K = p->top_k, V = p->vocab, Sd = (double)S;
    int layers = p->num_layers, n_sparse = 0;
    for (int l = 0; l < layers; l++) n_sparse += p->is_moe && c->layer_is_sparse[l];
    int n_dense = layers - n_sparse;

    double attn_elems = 2 * Qr * D * H + 2 * KVr * D * H;          /* q, o; k, v */
    double attn_bytes = layers * (attn_elems * sc->attn + (2 * H + 2 * D) * OTHER_B);
    double expert_elems = p->is_moe ? 3.0 * (p->moe_intermediate / T) * H : 0;
    double dense_elems = n_dense ? 3.0 * (p->intermediate / A) * H : 0;
    double router_bytes = n_sparse * N * H * OTHER_B;
    const double head_b = c->tie_word_embeddings || sc->head == 0 ? OTHER_B : sc->head;
    double lm_bytes = (V / L) * H * head_b + H * OTHER_B;          /* lm_head slice, final norm */
    double per_tok_experts = p->is_moe ? K / E : 0;                /* expected local experts per token */
    double hit = p->is_moe ? (N / E) * (1 - pow(1 - K / N, Sd)) : 0;
    *hit_out = hit;
    res->weights = attn_bytes + router_bytes + n_sparse * (N / E) * expert_elems * sc->ffn +
                   n_dense * dense_elems * sc->ffn + V * H * OTHER_B + H * OTHER_B +
                   (c->tie_word_embeddings ? 0 : (V / L) * H * head_b);
    res->kv = layers * 2 * KVr * D * Sd * KV_B;

    memset(dec, 0, sizeof *dec);
    dec->attn = attn_bytes;
    dec->kv = layers * 2 * KVr * D * (Sd + 1) * KV_B;
    dec->router = router_bytes;
    dec->experts = n_sparse * per_tok_experts * expert_elems * sc->ffn;
    dec->dense = n_dense * dense_elems * sc->ffn;
    dec->other = lm_bytes + H * OTHER_B;
    dec->flops = 2 * (layers * attn_elems + n_sparse * (N * H + per_tok_experts * expert_elems) + n_dense * dense_elems +
                      (V / L) * H) + layers * 4 * Qr * D * (Sd + 1);

    int sp = p->sp_prefill && A > 1;
    uint64_t s_rows = sp ? (uint64_t)((S + A - 1) / A) : (uint64_t)S;
    memset(pre, 0, sizeof *pre);
    pre->attn = attn_bytes;
    pre->kv = layers * 2 * KVr * D * Sd * KV_B;
    pre->router = router_bytes;
    pre->experts = n_sparse * hit * expert_elems * sc->ffn;
    pre->dense = n_dense * dense_elems * sc->ffn;
    pre->other = lm_bytes + Sd * H * OTHER_B;
    pre->flops = 2 * (layers * attn_elems * Sd + n_sparse * ((double)s_rows * N * H + Sd * per_tok_experts * expert_elems) +
                      n_dense * dense_elems * Sd + (V / L) * H) + layers * 2 * Qr * D * Sd * Sd;

    uint64_t hb = (uint64_t)p->hidden * ACT_B, logits = (uint64_t)(p->vocab / L) * ACT_B;
    const int a2a = p->is_moe && E > 1 && p->ep_comm == Q3_EP_COMM_ALLTOALL;
    /* The sampled token's lm_head gather: candidates, or whole rows (the
     * rule generate applies, sample/sampler.h). */
    q3_sampler_params smp;
    q3_sampler_defaults(&smp);
    smp.temperature = top_k == 1 ? 0.0f : 0.6f;
    smp.top_k = (int)top_k;
    int cands = q3_sampler_cands_per_rank(&smp, p->vocab, p->vocab / L);
    if (cands) logits = (uint64_t)cands * sizeof(q3_sample_cand);
    add_comm(dec, mc, "decode", "attention", Q3_COLL_ALLREDUCE, "attn_tp", A, layers, hb, 0);
    add_comm(dec, mc, "decode", "dense MLP", Q3_COLL_ALLREDUCE, "attn_tp", A, n_dense, hb, 0);
    if (a2a) moe_alltoall_rows(dec, mc, "decode", p, 1, n_sparse);
    else add_comm(dec, mc, "decode", "MoE", Q3_COLL_ALLREDUCE, "world", W, n_sparse, hb, 0);
    add_comm(dec, mc, "decode", "lm_head", Q3_COLL_ALLGATHER, "lmhead", L, 1, logits, 0);

    memset(alt, 0, sizeof *alt);
    if (!sp) {
        uint64_t Sb = (uint64_t)S * hb;
        add_comm(pre, mc, "prefill", "attention", Q3_COLL_ALLREDUCE, "attn_tp", A, layers, Sb, 0);
        add_comm(pre, mc, "prefill", "dense MLP", Q3_COLL_ALLREDUCE, "attn_tp", A, n_dense, Sb, 0);
        if (a2a) moe_alltoall_rows(pre, mc, "prefill", p, S, n_sparse);
        else add_comm(pre, mc, "prefill", "MoE", Q3_COLL_ALLREDUCE, "world", W, n_sparse, Sb, 0);
    } else {
        const int Hn = p->hidden, QDr = p->num_heads / A * p->head_dim, K2 = 2 * p->top_k;
        uint64_t in = s_rows * wire_row(p, Hn, Hn), out = s_rows * hb;
        add_comm(pre, mc, "prefill", "attention in", Q3_COLL_ALLGATHER, "attn_tp", A, layers, in, 0);
        add_comm(pre, mc, "prefill", "attention out", Q3_COLL_ALLTOALL, "attn_tp", A, layers,
                 s_rows * wire_row(p, QDr, QDr), 0);
        add_comm(pre, mc, "prefill", "dense MLP in", Q3_COLL_ALLGATHER, "attn_tp", A, n_dense, in, 0);
        add_comm(pre, mc, "prefill", "dense MLP out", Q3_COLL_REDUCE_SCATTER, "attn_tp", A, n_dense, out, 0);
        uint64_t rows = (s_rows * (uint64_t)p->top_k + (uint64_t)E - 1) / (uint64_t)E;
        uint64_t moe_in = s_rows * wire_row(p, Hn + K2, Hn), counts = (uint64_t)(p->num_experts / E) * 4;
        if (p->is_moe && E > 1) {
            alt->valid = 1;
            alt->a2a_rows = rows;
            alt->allgather = sent_of(Q3_COLL_ALLGATHER, E, moe_in) + sent_of(Q3_COLL_REDUCE_SCATTER, E, out);
            alt->alltoall = sent_of(Q3_COLL_ALLTOALL, E, counts) + sent_of(Q3_COLL_ALLTOALL, E, rows * wire_row(p, Hn, Hn)) +
                            sent_of(Q3_COLL_ALLTOALL, E, rows * hb);
        }
        if (p->ep_comm == Q3_EP_COMM_ALLTOALL) {
            add_comm(pre, mc, "prefill", "MoE counts", Q3_COLL_ALLTOALL, "moe_ep", E, n_sparse, counts, 0);
            /* (alltoallv in the engine: rows per peer as uniform routing has them) */
            const uint64_t disp = sent_of(Q3_COLL_ALLTOALL, E, rows * wire_row(p, Hn, Hn)), comb = sent_of(Q3_COLL_ALLTOALL, E, rows * hb);
            add_comm_bytes(pre, mc, "prefill", "MoE dispatch", Q3_COLL_ALLTOALLV, "moe_ep", E, n_sparse, disp, disp);
            add_comm_bytes(pre, mc, "prefill", "MoE combine", Q3_COLL_ALLTOALLV, "moe_ep", E, n_sparse, comb, comb);
        } else {
            add_comm(pre, mc, "prefill", "MoE in", Q3_COLL_ALLGATHER, "moe_ep", E, n_sparse, moe_in, 0);
            add_comm(pre, mc, "prefill", "MoE out", Q3_COLL_REDUCE_SCATTER, "moe_ep", E, n_sparse, out, 0);
        }
        add_comm(pre, mc, "prefill", "MoE tp sum", Q3_COLL_ALLREDUCE, "moe_tp", T, n_sparse, out, 0);
        add_comm(pre, mc, "prefill", "last token", Q3_COLL_BROADCAST, "attn_tp", A, 1, hb, 0);
    }
    add_comm(pre, mc, "prefill", "lm_head", Q3_COLL_ALLGATHER, "lmhead", L, 1, logits, 0);
    finish(dec, mc);
    finish(pre, mc);
}

/* ------------------------------------------------------------ output */

static double mb(double b) { return b / 1e6; }

static void print_mem(FILE *f, const char *what, double d, double p) {
    fprintf(f, "  %-28s %14.3f MB %16.3f MB\n", what, mb(d), mb(p));
}

static void print_rows(FILE *f, const phase_model *m) {
    for (int i = 0; i < m->n_rows; i++) {
        const comm_row *r = &m->rows[i];
        uint64_t b = r->sent > r->recv ? r->sent : r->recv;
        fprintf(f, "  %-8s %-14s %-19s %-8s %5d %7.0f %14llu %12.3f %10.3f\n", r->phase, r->where, q3_coll_name(r->kind),
                r->group, r->gsize, r->calls, (unsigned long long)b, mb(r->calls * (double)b), r->ms);
    }
}

static double comm_bytes(const phase_model *m) {
    double t = 0;
    for (int i = 0; i < m->n_rows; i++)
        t += m->rows[i].calls * (double)(m->rows[i].sent > m->rows[i].recv ? m->rows[i].sent : m->rows[i].recv);
    return t;
}

static json_t *phase_json(const phase_model *m) {
    json_t *o = json_object(), *mem = json_object(), *rows = json_array();
    json_object_set_new(mem, "attention", json_real(m->attn));
    json_object_set_new(mem, "kv_cache", json_real(m->kv));
    json_object_set_new(mem, "router", json_real(m->router));
    json_object_set_new(mem, "experts", json_real(m->experts));
    json_object_set_new(mem, "dense_mlp", json_real(m->dense));
    json_object_set_new(mem, "embedding_lm_head_norms", json_real(m->other));
    json_object_set_new(mem, "total", json_real(m->attn + m->kv + m->router + m->experts + m->dense + m->other));
    json_object_set_new(o, "memory_bytes_per_rank", mem);
    json_object_set_new(o, "flops_per_rank", json_real(m->flops));
    for (int i = 0; i < m->n_rows; i++) {
        const comm_row *r = &m->rows[i];
        json_t *j = json_object();
        json_object_set_new(j, "where", json_string(r->where));
        json_object_set_new(j, "collective", json_string(q3_coll_name(r->kind)));
        json_object_set_new(j, "group", json_string(r->group));
        json_object_set_new(j, "group_size", json_integer(r->gsize));
        json_object_set_new(j, "calls", json_real(r->calls));
        json_object_set_new(j, "bytes_sent_per_call", json_integer((json_int_t)r->sent));
        json_object_set_new(j, "bytes_recv_per_call", json_integer((json_int_t)r->recv));
        json_object_set_new(j, "ms", json_real(r->ms));
        json_array_append_new(rows, j);
    }
    json_object_set_new(o, "comm", rows);
    json_object_set_new(o, "comm_bytes_per_rank", json_real(comm_bytes(m)));
    json_object_set_new(o, "memory_ms", json_real(m->mem_ms));
    json_object_set_new(o, "compute_ms", json_real(m->compute_ms));
    json_object_set_new(o, "comm_ms", json_real(m->comm_ms));
    json_object_set_new(o, "total_ms", json_real(m->total_ms));
    return o;
}

static int write_json(const char *path, int force, const q3_plan *p, const char *quant, long S, long top_k, const machine *mc,
                      const phase_model *dec, const phase_model *pre, const ep_alt *alt, const resident *res) {
    json_t *root = json_object(), *plan = json_object(), *mach = json_object();
    json_object_set_new(root, "ranks", json_integer(p->world_size));
    json_object_set_new(root, "quant", json_string(quant));
    json_object_set_new(root, "prompt_tokens", json_integer(S));
    json_object_set_new(root, "sampling_top_k", json_integer(top_k));
    json_object_set_new(mach, "membw_gbps", json_real(mc->membw_Bps / 1e9));
    json_object_set_new(mach, "link_gbps", json_real(mc->link_Bps / 1e9));
    json_object_set_new(mach, "link_latency_us", json_real(mc->lat_s * 1e6));
    json_object_set_new(mach, "gflops", json_real(mc->flops_ps / 1e9));
    json_object_set_new(root, "machine", mach);
    json_object_set_new(plan, "attn_tp_size", json_integer(p->attn_tp_size));
    json_object_set_new(plan, "moe_tp_size", json_integer(p->moe_tp_size));
    json_object_set_new(plan, "moe_ep_size", json_integer(p->moe_ep_size));
    json_object_set_new(plan, "lmhead_tp_size", json_integer(p->lmhead_tp_size));
    json_object_set_new(plan, "moe_ep_comm", json_string(q3_ep_comm_name(p->ep_comm)));
    json_object_set_new(plan, "moe_ep_comm_reason", json_string(p->ep_comm_reason));
    json_object_set_new(plan, "comm_quant", json_string(q3_comm_quant_name(p->comm_quant)));
    json_object_set_new(plan, "sp_prefill", json_boolean(p->sp_prefill));
    json_object_set_new(root, "plan", plan);
    if (alt->valid) {
        json_t *e = json_object();
        json_object_set_new(e, "allgather_bytes_per_layer", json_integer((json_int_t)alt->allgather));
        json_object_set_new(e, "alltoall_bytes_per_layer", json_integer((json_int_t)alt->alltoall));
        json_object_set_new(root, "prefill_ep_alternatives", e);
    }
    json_object_set_new(root, "weights_bytes_per_rank", json_real(res->weights));
    json_object_set_new(root, "kv_cache_bytes_per_rank", json_real(res->kv));
    json_object_set_new(root, "decode", phase_json(dec));
    json_object_set_new(root, "prefill", phase_json(pre));
    FILE *f = fopen(path, force ? "w" : "wx");
    int rc = 0;
    if (!f) {
        rc = errno == EEXIST ? fail(1, "--json: %s exists (use --force to overwrite)", path)
                             : fail(1, "--json: cannot write %s: %s", path, strerror(errno));
    } else {
        if (json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) || fputc('\n', f) == EOF) rc = 1;
        if (fclose(f) || rc) {
            rc = fail(1, "--json: cannot write %s", path);
            q3_remove_partial(path);
        }
    }
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------ command */

/* Bytes per element of a weight stored as t (BF16 as stored: the plan's BF16). */
static double stored_bytes(q3_dtype t) {
    return t == Q3_MXFP4 ? MXFP4_B : q3_dtype_is_mx(t) ? MXFP8_B : t == Q3_BF16P ? BF16P_B : t == Q3_F32 ? 4.0 : 2.0;
}

/* The scheme of a .q3m's weights: a named one where the file's is exactly
 * that, else the file's own (name: its description, in buf). */
static int q3m_plan_scheme(const char *path, scheme *out, char *buf, unsigned cap) {
    q3m_file f;
    if (q3m_open(&f, path)) return -1;
    q3_quant_scheme q = f.scheme;
    /* (the header names the lm_head's type only when it is MX: a BF16P one shows in its tensor) */
    const q3_st_tensor *head = q3_st_find(&f.st, "lm_head.weight");
    if (head && head->dtype == Q3_BF16P) q.head = Q3_BF16P;
    q3m_close(&f);
    for (size_t k = 0; k < sizeof schemes / sizeof schemes[0]; k++) {
        q3_quant_scheme named;
        if (q3_scheme_from_name(schemes[k].name, &named) == 0 && !memcmp(&named, &q, sizeof q)) {
            *out = schemes[k];
            return 0;
        }
    }
    /* (MX weights anywhere bring the MX slicing rules, as the engine's check has them) */
    *out = (scheme){q3_scheme_describe(&q, buf, cap), stored_bytes(q.attn), stored_bytes(q.ffn),
                    q3_dtype_is_mx(q.ffn) || q3_dtype_is_mx(q.attn), q.head == Q3_BF16 ? 0 : stored_bytes(q.head)};
    return 0;
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *yaml = NULL, *quant = NULL, *json_path = NULL;
    long ranks = 0, prompt = 512, top_k = 20;
    double membw = 100, link = 25, lat_us = 5, gflops = 0;
    int force = 0;
    q3_plan flags;   /* flags are applied over the YAML: collect them, then replay */
    q3_plan_init(&flags);
    const char *flag_args[64];
    int n_flag_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--force")) {
            force = 1;
            continue;
        }
        int start = i, r = q3_plan_parse_arg(&flags, argc, argv, &i);
        if (r < 0) return fail(2, "%s", q3_errmsg());
        if (r > 0) {
            if (n_flag_args + 2 > (int)(sizeof flag_args / sizeof flag_args[0])) return fail(2, "too many plan flags");
            flag_args[n_flag_args++] = argv[start];
            flag_args[n_flag_args++] = argv[i];
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--config") || !strcmp(a, "--quant") || !strcmp(a, "--json")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "-m")) model = v;
            else if (!strcmp(a, "--config")) yaml = v;
            else if (!strcmp(a, "--quant")) quant = v;
            else json_path = v;
        } else if (!strcmp(a, "--ranks")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_int(a, v, 1, 1 << 20, &ranks)) return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_int(a, v, 0, 1 << 24, &top_k)) return 2;
        } else if (!strcmp(a, "--prompt")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_int(a, v, 1, 1 << 24, &prompt)) return 2;
        } else if (!strcmp(a, "--membw-gbps")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_float(a, v, 1e-3, 1e6, &membw)) return 2;
        } else if (!strcmp(a, "--link-gbps")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_float(a, v, 1e-3, 1e6, &link)) return 2;
        } else if (!strcmp(a, "--link-latency-us")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_float(a, v, 0, 1e7, &lat_us)) return 2;
        } else if (!strcmp(a, "--gflops")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_float(a, v, 0, 1e9, &gflops)) return 2;
        } else {
            return arg_unknown("plan", a);
        }
    }
    if (!ranks) return fail(2, "missing --ranks N (see q3moe plan --help)");
    if (json_path && q3_check_output(json_path, force)) return fail(1, "--json: %s", q3_errmsg());
    const scheme *sc = NULL;
    for (size_t k = 0; quant && k < sizeof schemes / sizeof schemes[0]; k++)
        if (!strcmp(schemes[k].name, quant)) sc = &schemes[k];
    if (quant && !sc) return fail(2, "--quant: unknown scheme '%s' (choose bf16, bf16p, w8a8, w4a8, w8a8i, w4a8i, w8 or w4)", quant);

    q3_plan p;
    q3_plan_init(&p);
    if (yaml && q3_plan_load_yaml(&p, yaml)) return fail(1, "%s", q3_errmsg());
    for (int k = 0; k < n_flag_args; k += 2) {
        int j = 0;
        char *pair[2] = {(char *)flag_args[k], (char *)flag_args[k + 1]};
        if (q3_plan_parse_arg(&p, 2, pair, &j) < 0) return fail(2, "%s", q3_errmsg());
    }
    if (!model) model = p.model_path[0] ? p.model_path : NULL;
    if (!model) return fail(2, "missing -m MODEL (or model_path in --config FILE)");

    q3_config c;
    if (q3_model_load_config(&c, model)) return fail(1, "%s", q3_errmsg());
    scheme stored;
    char stored_name[160];
    if (!quant && q3_is_dir(model)) sc = &schemes[0]; /* a directory: BF16 unless --quant */
    else if (!quant) { /* a .q3m: its own scheme */
        if (q3m_plan_scheme(model, &stored, stored_name, sizeof stored_name)) return fail(1, "%s", q3_errmsg());
        sc = &stored;
    }
    if (q3_plan_validate(&p, (int)ranks, &c, sc->mx)) return fail(1, "%s", q3_errmsg());

    machine mc = {.link_Bps = link * 1e9, .lat_s = lat_us * 1e-6, .membw_Bps = membw * 1e9, .flops_ps = gflops * 1e9};
    phase_model dec, pre;
    ep_alt alt;
    double hit;
    resident res;
    predict(&p, &c, sc, prompt, top_k, &mc, &dec, &pre, &alt, &hit, &res);

    int n_sparse = 0;
    for (int l = 0; l < c.num_layers; l++) n_sparse += p.is_moe && c.layer_is_sparse[l];
    FILE *f = stdout;
    fprintf(f, "model: %s: %s, %d layers (%d MoE, %d dense), hidden %d, %d query / %d KV heads x %d",
 model, c.is_moe ? "qwen3_moe" : "qwen3", c.num_layers, n_sparse, c.num_layers - n_sparse,
            c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim);
    if (p.is_moe) fprintf(f, ", %d experts top-%d x %d", c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size);
    fprintf(f, ", vocab %d\n", c.vocab_size);
    fprintf(f, "assumed: weights %s (embeddings, norms, router%s BF16), fp32 activations and KV cache,\n"
               "         memory %g GB/s, link %g GB/s + %g us per collective%s, prompt %ld tokens,\n"
               "         sampling top-k %ld%s\n\n",
            sc->name, sc->head && !c.tie_word_embeddings ? "" : ", lm_head", membw, link, lat_us,
            gflops > 0 ? "" : ", memory-bound compute", prompt, top_k,
            top_k == 0 ? " (off: whole logits rows gathered)" : top_k == 1 ? " (greedy)" : "");
    q3_plan_print(f, &p);

    fprintf(f, "\nheld per rank: weights %.3f GB (embedding replicated%s), KV cache %.3f GB at %ld tokens\n",
            res.weights / 1e9, c.tie_word_embeddings ? ", tied lm_head" : ", lm_head slice", res.kv / 1e9, prompt);
    fprintf(f, "\nmemory read per rank              decode (1 token)  prefill (%ld tokens)\n", prompt);
    print_mem(f, "attention weights", dec.attn, pre.attn);
    print_mem(f, "KV cache (fp32)", dec.kv, pre.kv);
    if (p.is_moe) {
        print_mem(f, "router", dec.router, pre.router);
        char what[64];
        snprintf(what, sizeof what, "experts (%.2f | %.2f of %d)", (double)p.top_k / p.moe_ep_size, hit,
                 p.num_experts / p.moe_ep_size);
        print_mem(f, what, dec.experts, pre.experts);
    }
    if (dec.dense > 0) print_mem(f, "dense MLP weights", dec.dense, pre.dense);
    print_mem(f, "embedding, lm_head, norms", dec.other, pre.other);
    double dt = dec.attn + dec.kv + dec.router + dec.experts + dec.dense + dec.other;
    double pt = pre.attn + pre.kv + pre.router + pre.experts + pre.dense + pre.other;
    print_mem(f, "total", dt, pt);
    fprintf(f, "  %-28s %14.3f ms %16.3f ms\n", "memory time", dec.mem_ms, pre.mem_ms);
    if (gflops > 0)
        fprintf(f, "  %-28s %11.3f GFLOP %13.3f GFLOP  (%.3f | %.3f ms)\n", "compute", dec.flops / 1e9, pre.flops / 1e9,
                dec.flops / mc.flops_ps * 1e3, pre.flops / mc.flops_ps * 1e3);
    if (p.is_moe)
        fprintf(f, "  (experts: expected local experts touched per MoE layer, uniform routing: top_k/ep per token,\n"
                   "   (E/ep)(1 - (1 - top_k/E)^S) per prompt)\n");

    fprintf(f, "\ncommunication per rank (link bytes per call, src/parallel/comm.h convention)\n");
    fprintf(f, "  %-8s %-14s %-19s %-8s %5s %7s %14s %12s %10s\n", "phase", "where", "collective", "group", "size",
            "calls", "bytes/call", "total MB", "ms");
    print_rows(f, &dec);
    print_rows(f, &pre);
    if (!dec.n_rows && !pre.n_rows) fprintf(f, "  (none: one rank)\n");
    if (alt.valid)
        fprintf(f, "  prefill EP exchange per MoE layer per rank: allgather %llu B, alltoall %llu B (%llu rows per peer)"
                   " -> %s\n", (unsigned long long)alt.allgather, (unsigned long long)alt.alltoall,
                (unsigned long long)alt.a2a_rows, q3_ep_comm_name(p.ep_comm));

    fprintf(f, "\nprediction per rank\n");
    fprintf(f, "  decode   %10.3f ms/token = compute %.3f + comm %.3f (%.3f MB)  -> %.1f tokens/s\n", dec.total_ms,
            dec.compute_ms, dec.comm_ms, mb(comm_bytes(&dec)), 1e3 / dec.total_ms);
    fprintf(f, "  prefill  %10.3f ms for %ld tokens = compute %.3f + comm %.3f (%.3f MB)\n", pre.total_ms, prompt,
            pre.compute_ms, pre.comm_ms, mb(comm_bytes(&pre)));
    int rc = fflush(f) ? fail(1, "cannot write to stdout") : 0;
    if (rc == 0 && json_path) rc = write_json(json_path, force, &p, sc->name, prompt, top_k, &mc, &dec, &pre, &alt, &res);
    return rc;
}
