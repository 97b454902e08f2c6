/* Checks of the comm layer under mpirun, driven by tests/test_comm.py.
 *
 * Every rank runs each collective on small, rank-dependent payloads with
 * odd sizes, checks the results element for element, and prints its
 * counters as JSON lines ("COUNTER {...}") so that the driver can compare
 * them with the byte formulas it computes itself. The sizes below are
 * mirrored in tests/test_comm.py; change both together.
 *
 * Phases: "prefill"  allreduce_sum (7), allgather (5, then 5 in place),
 *                    reduce_scatter_sum (3 per rank), alltoall (2 per peer)
 *         "decode"   alltoallv (counts (r + j) % 3 + 1 from r to j),
 *                    broadcast (6, root P-1), allgather_bytes (33),
 *                    alltoall_bytes (4 per peer), alltoallv_bytes (counts
 *                    (2r + j) % 4 + 1), broadcast_bytes (9, root 0), barrier
 *         "quant"    rows collectives (q3_comm_*_rows): allgather of 3 rows of
 *                    40 (32 MXFP8 + 8 fp32), alltoall of 2 rows of 64 (all
 *                    MXFP8) per peer, alltoallv of ((r + j) % 2 + 1) rows of
 *                    32 MXFP8 from r to j, alltoallv of ((r + 2j) % 3) rows
 *                    of 5 fp32 (nq 0); results against q3_mx_fake_quant_row
 *         "split"    allreduce_sum (1) on the even / odd ranks
 *         "plan"     allreduce_sum (1) on each group of a q3_plan
 *                    (attn_tp = moe_ep = max(P/2, 1), lmhead_tp = P)
 *
 * Failure drills (environment):
 *   Q3_COMM_CHECK_ABORT_RANK=r  rank r calls q3_comm_abort while the others
 *                               wait in the first allreduce
 *   Q3_COMM_CHECK_EXIT_RANK=r   rank r exits (status 0) without finalizing
 *   Q3_COMM_CHECK_STALL_RANK=r  rank r sleeps 600 s: the others' watchdog
 *                               (Q3MOE_COMM_TIMEOUT) must end the job
 *   Q3_COMM_CHECK_LONG_WAIT=s   rank 0 sleeps s seconds before a broadcast
 *                               the others wait in unwatched (q3_comm_watch):
 *                               the job must go on past the timeout
 * Exit status 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "parallel/comm.h"
#include "parallel/plan.h"
#include "quant/mx.h"
#include "util/error.h"

static int g_rank, g_checks, g_failures;

static void check(int ok, const char *what, long i, double got, double want) {
    g_checks++;
    if (ok) return;
    if (g_failures++ < 20)
        fprintf(stderr, "comm_check: rank %d: %s[%ld] = %g, expected %g\n", g_rank, what, i, got, want);
}

static void check_f(const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++) check(got[i] == want[i], what, (long)i, got[i], want[i]);
}

static void check_b(const char *what, const unsigned char *got, const unsigned char *want, size_t n) {
    for (size_t i = 0; i < n; i++) check(got[i] == want[i], what, (long)i, got[i], want[i]);
}

/* A varied, rank-dependent value (magnitudes over several binades, so that
 * MXFP8 blocks get different scales and elements get rounded). */
static float val(int r, int row, int i) {
    return (float)((r * 7 + row * 3 + i) % 17 - 8) * 0.173f * (float)(1 + i % 5) * (row % 2 ? 1e-3f : 1.0f);
}

/* n values of (rank r, row) with the first nq through MXFP8, as every rank
 * must see them after a rows collective. */
static void expect_row(int r, int row, size_t n, size_t nq, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = val(r, row, (int)i);
    if (nq && q3_mx_fake_quant_row(Q3_MXFP8, y, nq, y)) q3_comm_abort(q3_errmsg());
}

static int env_rank(const char *name) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : -1;
}

static void phase(const char *name) {
    if (q3_comm_set_phase(name)) {
        fprintf(stderr, "comm_check: %s\n", q3_errmsg());
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (q3_comm_init(&argc, &argv)) {
        fprintf(stderr, "comm_check: %s\n", q3_errmsg());
        return 1;
    }
    q3_group *w = q3_comm_world();
    int r = q3_group_rank(w), P = q3_group_size(w);
    g_rank = r;
    if (P > 64) q3_comm_abort("comm_check: at most 64 ranks");
    phase("prefill");

    if (env_rank("Q3_COMM_CHECK_ABORT_RANK") == r)
        q3_comm_abort("simulated failure (Q3_COMM_CHECK_ABORT_RANK)");
    if (env_rank("Q3_COMM_CHECK_EXIT_RANK") == r) {
        fprintf(stderr, "comm_check: rank %d exits early (Q3_COMM_CHECK_EXIT_RANK)\n", r);
        fflush(stderr);
        _exit(0);
    }
    if (env_rank("Q3_COMM_CHECK_STALL_RANK") == r) {
        fprintf(stderr, "comm_check: rank %d stalls (Q3_COMM_CHECK_STALL_RANK)\n", r);
        fflush(stderr);
        sleep(600);
    }

    const char *long_wait = getenv("Q3_COMM_CHECK_LONG_WAIT");
    if (long_wait && *long_wait) { /* as the ranks wait while rank 0 converts --quant's cache */
        int token = r == 0 ? 42 : 0;
        if (r == 0) usleep((useconds_t)(atof(long_wait) * 1e6));
        q3_comm_watch(0);
        q3_comm_broadcast_bytes(w, &token, sizeof token, 0);
        q3_comm_watch(1);
        if (token != 42) q3_comm_abort("comm_check: the unwatched broadcast lost its value");
    }

    float *a = q3_malloc(16384 * sizeof *a), *b = q3_malloc(16384 * sizeof *b), *e = q3_malloc(16384 * sizeof *e);
    unsigned char *ba = q3_malloc(4096), *bb = q3_malloc(4096), *be = q3_malloc(4096);
    size_t sc[64], rc[64];

    /* ---- prefill ---- */
    for (int i = 0; i < 7; i++) a[i] = (float)r + 0.5f * (float)i, e[i] = (float)(P * (P - 1) / 2) + 0.5f * (float)(P * i);
    q3_comm_allreduce_sum(w, a, 7);
    check_f("allreduce_sum", a, e, 7);

    for (int i = 0; i < 5; i++) a[i] = (float)(100 * r + i);
    for (int j = 0; j < P; j++)
        for (int i = 0; i < 5; i++) e[j * 5 + i] = (float)(100 * j + i);
    q3_comm_allgather(w, a, 5, b);
    check_f("allgather", b, e, 5 * (size_t)P);
    memset(b, 0, 5 * (size_t)P * sizeof *b);
    for (int i = 0; i < 5; i++) b[r * 5 + i] = (float)(100 * r + i);
    q3_comm_allgather(w, b + r * 5, 5, b);   /* in place */
    check_f("allgather in place", b, e, 5 * (size_t)P);

    for (int j = 0; j < P; j++)
        for (int i = 0; i < 3; i++) a[j * 3 + i] = (float)(10 * r + j + i);
    for (int i = 0; i < 3; i++) e[i] = (float)(10 * P * (P - 1) / 2 + P * (r + i));
    q3_comm_reduce_scatter_sum(w, a, b, 3);
    check_f("reduce_scatter_sum", b, e, 3);

    for (int j = 0; j < P; j++)
        for (int i = 0; i < 2; i++) a[j * 2 + i] = (float)(1000 * r + 10 * j + i), e[j * 2 + i] = (float)(1000 * j + 10 * r + i);
    q3_comm_alltoall(w, a, b, 2);
    check_f("alltoall", b, e, 2 * (size_t)P);

    /* ---- decode ---- */
    phase("decode");
    size_t off = 0, eoff = 0;
    for (int j = 0; j < P; j++) {
        sc[j] = (size_t)((r + j) % 3 + 1);
        rc[j] = (size_t)((j + r) % 3 + 1);
        for (size_t k = 0; k < sc[j]; k++) a[off++] = (float)(1000 * r + 10 * j + (int)k);
        for (size_t k = 0; k < rc[j]; k++) e[eoff++] = (float)(1000 * j + 10 * r + (int)k);
    }
    q3_comm_alltoallv(w, a, sc, b, rc);
    check_f("alltoallv", b, e, eoff);

    for (int i = 0; i < 6; i++) a[i] = r == P - 1 ? (float)(7 * i + 1) : -1.0f, e[i] = (float)(7 * i + 1);
    q3_comm_broadcast(w, a, 6, P - 1);
    check_f("broadcast", a, e, 6);

    for (int i = 0; i < 33; i++) ba[i] = (unsigned char)(r * 33 + i);
    for (int j = 0; j < P; j++)
        for (int i = 0; i < 33; i++) be[j * 33 + i] = (unsigned char)(j * 33 + i);
    q3_comm_allgather_bytes(w, ba, 33, bb);
    check_b("allgather_bytes", bb, be, 33 * (size_t)P);

    for (int j = 0; j < P; j++)
        for (int i = 0; i < 4; i++) ba[j * 4 + i] = (unsigned char)(64 * r + 8 * j + i), be[j * 4 + i] = (unsigned char)(64 * j + 8 * r + i);
    q3_comm_alltoall_bytes(w, ba, bb, 4);
    check_b("alltoall_bytes", bb, be, 4 * (size_t)P);

    off = eoff = 0;
    for (int j = 0; j < P; j++) {
        sc[j] = (size_t)((2 * r + j) % 4 + 1);
        rc[j] = (size_t)((2 * j + r) % 4 + 1);
        for (size_t k = 0; k < sc[j]; k++) ba[off++] = (unsigned char)(64 * r + 8 * j + (int)k);
        for (size_t k = 0; k < rc[j]; k++) be[eoff++] = (unsigned char)(64 * j + 8 * r + (int)k);
    }
    q3_comm_alltoallv_bytes(w, ba, sc, bb, rc);
    check_b("alltoallv_bytes", bb, be, eoff);

    for (int i = 0; i < 9; i++) ba[i] = r == 0 ? (unsigned char)(200 + i) : 0, be[i] = (unsigned char)(200 + i);
    q3_comm_broadcast_bytes(w, ba, 9, 0);
    check_b("broadcast_bytes", ba, be, 9);

    q3_comm_barrier(w);

    /* ---- quant: rows collectives, MXFP8 on the wire ---- */
    phase("quant");
    uint8_t *wire = q3_malloc(1 << 16);
    for (int row = 0; row < 3; row++)
        for (int i = 0; i < 40; i++) a[row * 40 + i] = val(r, row, i);
    q3_comm_allgather_rows(w, a, 3, 40, 32, b, wire);
    for (int j = 0; j < P; j++)
        for (int row = 0; row < 3; row++) expect_row(j, row, 40, 32, e + ((size_t)j * 3 + (size_t)row) * 40);
    check_f("allgather_rows", b, e, (size_t)P * 3 * 40);

    for (int j = 0; j < P; j++)   /* to peer j: rows 10 j + {0, 1} of mine */
        for (int row = 0; row < 2; row++)
            for (int i = 0; i < 64; i++) a[((size_t)j * 2 + (size_t)row) * 64 + (size_t)i] = val(r, 10 * j + row, i);
    q3_comm_alltoall_rows(w, a, b, 2, 64, 64, wire);
    for (int j = 0; j < P; j++)
        for (int row = 0; row < 2; row++) expect_row(j, 10 * r + row, 64, 64, e + ((size_t)j * 2 + (size_t)row) * 64);
    check_f("alltoall_rows", b, e, (size_t)P * 2 * 64);

    size_t nrow = 0, erow = 0;
    for (int j = 0; j < P; j++) {
        sc[j] = (size_t)((r + j) % 2 + 1);
        rc[j] = (size_t)((j + r) % 2 + 1);
        for (size_t k = 0; k < sc[j]; k++, nrow++)
            for (int i = 0; i < 32; i++) a[nrow * 32 + (size_t)i] = val(r, 10 * j + (int)k, i);
        for (size_t k = 0; k < rc[j]; k++, erow++) expect_row(j, 10 * r + (int)k, 32, 32, e + erow * 32);
    }
    q3_comm_alltoallv_rows(w, a, sc, b, rc, 32, 32, wire);
    check_f("alltoallv_rows", b, e, erow * 32);

    nrow = erow = 0;
    for (int j = 0; j < P; j++) {
        sc[j] = (size_t)((r + 2 * j) % 3);
        rc[j] = (size_t)((j + 2 * r) % 3);
        for (size_t k = 0; k < sc[j]; k++, nrow++)
            for (int i = 0; i < 5; i++) a[nrow * 5 + (size_t)i] = val(r, 10 * j + (int)k, i);
        for (size_t k = 0; k < rc[j]; k++, erow++) expect_row(j, 10 * r + (int)k, 5, 0, e + erow * 5);
    }
    q3_comm_alltoallv_rows(w, a, sc, b, rc, 5, 0, NULL);
    check_f("alltoallv_rows fp32", b, e, erow * 5);
    free(wire);

    /* ---- split: even / odd ranks ---- */
    phase("split");
    q3_group *half = q3_group_split(w, r % 2, r, "parity");
    float want = 0;
    int members = 0;
    for (int j = r % 2; j < P; j += 2) want += (float)j, members++;
    check(q3_group_size(half) == members, "parity size", 0, q3_group_size(half), members);
    check(q3_group_rank(half) == r / 2, "parity rank", 0, q3_group_rank(half), r / 2);
    a[0] = (float)r;
    q3_comm_allreduce_sum(half, a, 1);
    check(a[0] == want, "parity allreduce", 0, a[0], want);
    q3_group_free(half);

    /* ---- plan groups ---- */
    phase("plan");
    q3_config c;
    memset(&c, 0, sizeof c);
    c.is_moe = 1;
    c.vocab_size = 64;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 64;
    c.num_layers = 1;
    c.layer_is_sparse[0] = 1;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    q3_plan plan;
    q3_plan_init(&plan);
    int half_p = P / 2 > 0 ? P / 2 : 1;
    plan.attn_tp_size = half_p;
    plan.moe_ep_size = half_p;
    plan.lmhead_tp_size = P;
    q3_plan_groups groups;
    if (q3_plan_validate(&plan, P, &c, 0) || q3_plan_make_groups(&plan, &groups)) {
        fprintf(stderr, "comm_check: rank %d: plan: %s\n", r, q3_errmsg());
        q3_comm_abort("plan groups");
    }
    q3_group *gs[Q3_GROUP_N] = {groups.attn_tp, groups.moe_ep, groups.moe_tp, groups.lmhead};
    for (int k = 0; k < Q3_GROUP_N; k++) {
        int color, key, n = 0;
        float sum = 0;
        q3_plan_group_color(&plan, (q3_group_kind)k, r, &color, &key);
        for (int j = 0; j < P; j++) {
            int cj, kj;
            q3_plan_group_color(&plan, (q3_group_kind)k, j, &cj, &kj);
            if (cj == color) sum += (float)j, n++;
        }
        check(q3_group_size(gs[k]) == n, q3_group_kind_name((q3_group_kind)k), 0, q3_group_size(gs[k]), n);
        check(q3_group_rank(gs[k]) == key, q3_group_kind_name((q3_group_kind)k), 1, q3_group_rank(gs[k]), key);
        a[0] = (float)r;
        q3_comm_allreduce_sum(gs[k], a, 1);
        check(a[0] == sum, q3_group_kind_name((q3_group_kind)k), 2, a[0], sum);
    }
    printf("GROUPS {\"rank\": %d, \"attn_tp\": %d, \"moe_ep\": %d, \"moe_tp\": %d, \"lmhead\": %d}\n", r,
           q3_group_size(groups.attn_tp), q3_group_size(groups.moe_ep), q3_group_size(groups.moe_tp),
           q3_group_size(groups.lmhead));
    q3_plan_free_groups(&groups);

    /* ---- report ---- */
    static const char *phases[] = {"prefill", "decode", "quant", "split", "plan"};
    for (size_t ph = 0; ph < sizeof phases / sizeof phases[0]; ph++)
        for (int k = 0; k < Q3_COLL_N; k++) {
            q3_comm_stat s = q3_comm_stats_get((q3_coll)k, phases[ph]);
            if (!s.calls) continue;
            check(s.seconds >= 0 && s.max_seconds <= s.seconds + 1e-12, "stat time", k, s.seconds, s.max_seconds);
            printf("COUNTER {\"rank\": %d, \"size\": %d, \"phase\": \"%s\", \"kind\": \"%s\", \"calls\": %llu, "
                   "\"sent\": %llu, \"recv\": %llu}\n",
                   r, P, phases[ph], q3_coll_name((q3_coll)k), (unsigned long long)s.calls,
                   (unsigned long long)s.bytes_sent, (unsigned long long)s.bytes_recv);
        }
    printf("CHECKS {\"rank\": %d, \"checks\": %d, \"failures\": %d, \"mpi\": %d}\n", r, g_checks, g_failures,
           q3_comm_have_mpi());
    fflush(stdout);
    if (r == 0) q3_comm_stats_print(stderr);
    free(a);
    free(b);
    free(e);
    free(ba);
    free(bb);
    free(be);
    q3_comm_finalize();
    return g_failures ? 1 : 0;
}
