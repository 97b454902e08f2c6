/* What both comm backends share: counters per (collective, phase), the
 * link-byte formulas (see comm.h), the timeout setting and the watchdog. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/comm_internal.h"
#include "quant/mx.h"
#include "util/error.h"

/* ------------------------------------------------------------ basics */

int64_t q3_comm__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int g_world_rank = 0, g_world_size = 1;

void q3_comm__set_world(int rank, int size) {
    g_world_rank = rank;
    g_world_size = size;
}
int q3_comm__world_rank(void) { return g_world_rank; }
int q3_comm__world_size(void) { return g_world_size; }

static const char *const coll_names[Q3_COLL_N] = {
    "allreduce_sum", "allgather", "reduce_scatter_sum", "alltoall", "alltoallv", "broadcast", "barrier",
};

const char *q3_coll_name(q3_coll kind) {
    return (unsigned)kind < Q3_COLL_N ? coll_names[kind] : "?";
}

void q3_comm_payload(q3_coll kind, int nranks, uint64_t bytes, int is_root, uint64_t *sent, uint64_t *recv) {
    uint64_t p = nranks > 1 ? (uint64_t)nranks : 1, s = 0, r = 0;
    if (p > 1) {
        switch (kind) {
        case Q3_COLL_ALLREDUCE: s = r = 2 * (p - 1) * bytes / p; break;
        case Q3_COLL_ALLGATHER:
        case Q3_COLL_REDUCE_SCATTER:
        case Q3_COLL_ALLTOALL: s = r = (p - 1) * bytes; break;
        case Q3_COLL_BROADCAST:
            if (is_root) s = bytes;
            else r = bytes;
            break;
        default: break;   /* alltoallv: per-peer counts; barrier: nothing */
        }
    }
    *sent = s;
    *recv = r;
}

/* ------------------------------------------------------------ timeout */

static double g_timeout_s = Q3_COMM_DEFAULT_TIMEOUT_S;

double q3_comm_timeout_s(void) { return g_timeout_s; }

int q3_comm__read_timeout(void) {
    const char *s = getenv("Q3MOE_COMM_TIMEOUT");
    g_timeout_s = Q3_COMM_DEFAULT_TIMEOUT_S;
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > 1e9)
        return q3_err("Q3MOE_COMM_TIMEOUT: expected a positive number of seconds (got '%s')", s);
    g_timeout_s = v;
    return 0;
}

/* ------------------------------------------------------------ counters */

static q3_comm_stat g_stats[Q3_COMM_MAX_PHASES][Q3_COLL_N];
static char g_phase_names[Q3_COMM_MAX_PHASES][Q3_COMM_PHASE_LEN] = {"other"};
static int g_nphases = 1;
static _Atomic int g_phase = 0;   /* read by the watchdog */

int q3_comm_set_phase(const char *phase) {
    if (!phase || !*phase) return q3_err("comm phase: empty name");
    if (strlen(phase) >= Q3_COMM_PHASE_LEN)
        return q3_err("comm phase '%s': longer than %d characters", phase, Q3_COMM_PHASE_LEN - 1);
    for (int i = 0; i < g_nphases; i++)
        if (!strcmp(g_phase_names[i], phase)) {
            atomic_store(&g_phase, i);
            return 0;
        }
    if (g_nphases == Q3_COMM_MAX_PHASES)
        return q3_err("comm phase '%s': more than %d distinct phases", phase, Q3_COMM_MAX_PHASES);
    strcpy(g_phase_names[g_nphases], phase);
    atomic_store(&g_phase, g_nphases++);
    return 0;
}

const char *q3_comm_phase(void) { return g_phase_names[atomic_load(&g_phase)]; }

q3_comm_stat q3_comm_stats_get(q3_coll kind, const char *phase) {
    q3_comm_stat z = {0};
    if ((unsigned)kind >= Q3_COLL_N || !phase) return z;
    for (int i = 0; i < g_nphases; i++)
        if (!strcmp(g_phase_names[i], phase)) return g_stats[i][kind];
    return z;
}

void q3_comm_stats_reset(void) { memset(g_stats, 0, sizeof g_stats); }

void q3_comm_stats_print(FILE *f) {
    fprintf(f, "comm stats, rank %d of %d (link bytes, see src/parallel/comm.h)\n", g_world_rank, g_world_size);
    fprintf(f, "  %-10s %-19s %8s %14s %14s %11s %10s\n", "phase", "collective", "calls", "bytes sent",
            "bytes recv", "total ms", "max ms");
    int any = 0;
    for (int ph = 0; ph < g_nphases; ph++)
        for (int k = 0; k < Q3_COLL_N; k++) {
            const q3_comm_stat *s = &g_stats[ph][k];
            if (!s->calls) continue;
            any = 1;
            fprintf(f, "  %-10s %-19s %8llu %14llu %14llu %11.3f %10.3f\n", g_phase_names[ph], coll_names[k],
                    (unsigned long long)s->calls, (unsigned long long)s->bytes_sent,
                    (unsigned long long)s->bytes_recv, s->seconds * 1e3, s->max_seconds * 1e3);
        }
    if (!any) fprintf(f, "  (no collectives)\n");
}

/* ------------------------------------------------------------ watchdog */

static _Atomic int64_t g_wd_t0 = 0;      /* start of the blocking call in flight; 0: none */
static _Atomic int g_wd_kind = 0;
static _Atomic(const char *) g_wd_group = NULL;
static _Atomic int g_watched = 1;        /* q3_comm_watch */

void q3_comm_watch(int on) { atomic_store(&g_watched, on); }

int64_t q3_comm__begin(q3_coll kind, const char *group_name) {
    int64_t t0 = q3_comm__now_ns();
    atomic_store(&g_wd_kind, (int)kind);
    atomic_store(&g_wd_group, group_name);
    if (atomic_load(&g_watched)) atomic_store(&g_wd_t0, t0 ? t0 : 1);
    return t0;
}

void q3_comm__end(q3_coll kind, int64_t t0, uint64_t sent, uint64_t recv) {
    int64_t t1 = q3_comm__now_ns();
    atomic_store(&g_wd_t0, 0);
    q3_comm_stat *s = &g_stats[atomic_load(&g_phase)][kind];
    double secs = (double)(t1 - t0) * 1e-9;
    s->calls++;
    s->bytes_sent += sent;
    s->bytes_recv += recv;
    s->seconds += secs;
    if (secs > s->max_seconds) s->max_seconds = secs;
}

static pthread_t g_wd_thread;
static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wd_cv;
static int g_wd_running = 0, g_wd_stop = 0;

static void *watchdog_main(void *arg) {
    (void)arg;
    double interval = g_timeout_s / 4;
    if (interval > 1.0) interval = 1.0;
    if (interval < 0.01) interval = 0.01;
    int64_t step_ns = (int64_t)(interval * 1e9), limit_ns = (int64_t)(g_timeout_s * 1e9);
    pthread_mutex_lock(&g_wd_mu);
    while (!g_wd_stop) {
        int64_t wake = q3_comm__now_ns() + step_ns;
        struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
        pthread_cond_timedwait(&g_wd_cv, &g_wd_mu, &ts);
        if (g_wd_stop) break;
        int64_t t0 = atomic_load(&g_wd_t0), now = q3_comm__now_ns();
        if (t0 && now - t0 > limit_ns) {
            pthread_mutex_unlock(&g_wd_mu);
            const char *group = atomic_load(&g_wd_group);
            char msg[512];
            snprintf(msg, sizeof msg,
                     "comm timeout: %s on group '%s' (phase '%s') has not completed after %.1f s "
                     "(Q3MOE_COMM_TIMEOUT=%g): another rank has probably died or is stuck; aborting the job",
                     q3_coll_name((q3_coll)atomic_load(&g_wd_kind)), group ? group : "?", q3_comm_phase(),
                     (double)(now - t0) * 1e-9, g_timeout_s);
            q3_comm_abort(msg);
        }
    }
    pthread_mutex_unlock(&g_wd_mu);
    return NULL;
}

int q3_comm__watchdog_start(void) {
    if (g_wd_running) return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_wd_cv, &ca);
    pthread_condattr_destroy(&ca);
    g_wd_stop = 0;
    int rc = pthread_create(&g_wd_thread, NULL, watchdog_main, NULL);
    if (rc) {
        pthread_cond_destroy(&g_wd_cv);
        return q3_err("comm: cannot start the watchdog thread: %s", strerror(rc));
    }
    g_wd_running = 1;
    return 0;
}

void q3_comm__watchdog_stop(void) {
    if (!g_wd_running) return;
    pthread_mutex_lock(&g_wd_mu);
    g_wd_stop = 1;
    pthread_cond_signal(&g_wd_cv);
    pthread_mutex_unlock(&g_wd_mu);
    pthread_join(g_wd_thread, NULL);
    pthread_cond_destroy(&g_wd_cv);
    g_wd_running = 0;
}

/* ------------------------------------------------------------ MXFP8 rows */

size_t q3_comm_wire_row_bytes(size_t n, size_t nq) {
    return nq ? nq + q3_mx_scale_bytes(nq) + (n - nq) * sizeof(float) : n * sizeof(float);
}

static void bad_payload(q3_group *g, const char *what, size_t n, size_t nq) {
    char msg[256];
    if (nq % Q3_MX_BLOCK || nq > n)
        snprintf(msg, sizeof msg, "%s on group '%s': %zu MXFP8 columns of %zu is not a whole number of 32-blocks",
                 what, q3_group_name(g), nq, n);
    else
        snprintf(msg, sizeof msg, "%s on group '%s' (comm_quant mxfp8): NaN or infinite activation, which MXFP8 "
                 "cannot encode", what, q3_group_name(g));
    q3_comm_abort(msg);
}

/* rows x n floats -> wire rows (elements, scales, raw tail). Rows are
 * checked for finite values first so that the codec never fails (its error
 * message is a global, not for concurrent threads). */
static void pack_rows(q3_group *g, const char *what, const float *x, size_t rows, size_t n, size_t nq, uint8_t *wire) {
    const size_t wb = q3_comm_wire_row_bytes(n, nq);
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * nq >= 16384)
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        uint8_t *w = wire + r * wb;
        int finite = 1;
        for (size_t i = 0; i < nq; i++) finite &= isfinite(xr[i]) != 0;
        if (!finite) {
            bad = 1;
            continue;
        }
        (void)q3_mx_quantize_row(Q3_MXFP8, xr, nq, w + nq, w);
        memcpy(w + nq + nq / Q3_MX_BLOCK, xr + nq, (n - nq) * sizeof(float));
    }
    if (bad) bad_payload(g, what, n, nq);
}

static void unpack_rows(const uint8_t *wire, size_t rows, size_t n, size_t nq, float *y) {
    const size_t wb = q3_comm_wire_row_bytes(n, nq);
#pragma omp parallel for schedule(static) if (rows * nq >= 16384)
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *w = wire + r * wb;
        q3_mx_dequantize_row(Q3_MXFP8, w + nq, w, nq, y + r * n);
        memcpy(y + r * n + nq, w + nq + nq / Q3_MX_BLOCK, (n - nq) * sizeof(float));
    }
}

static void check_nq(q3_group *g, const char *what, size_t n, size_t nq) {
    if (nq % Q3_MX_BLOCK || nq > n) bad_payload(g, what, n, nq);
}

void q3_comm_allgather_rows(q3_group *g, const float *send, size_t rows, size_t n, size_t nq, float *recv,
                            uint8_t *wire) {
    if (!nq) {
        q3_comm_allgather(g, send, rows * n, recv);
        return;
    }
    check_nq(g, "allgather", n, nq);
    const size_t P = (size_t)q3_group_size(g), blk = rows * q3_comm_wire_row_bytes(n, nq);
    /* Own block quantized straight into its slot: an in-place allgather. */
    pack_rows(g, "allgather", send, rows, n, nq, wire + (size_t)q3_group_rank(g) * blk);
    q3_comm_allgather_bytes(g, wire + (size_t)q3_group_rank(g) * blk, blk, wire);
    unpack_rows(wire, P * rows, n, nq, recv);
}

void q3_comm_alltoall_rows(q3_group *g, const float *send, float *recv, size_t rows, size_t n, size_t nq,
                           uint8_t *wire) {
    if (!nq) {
        q3_comm_alltoall(g, send, recv, rows * n);
        return;
    }
    check_nq(g, "alltoall", n, nq);
    const size_t P = (size_t)q3_group_size(g), blk = rows * q3_comm_wire_row_bytes(n, nq);
    pack_rows(g, "alltoall", send, P * rows, n, nq, wire);
    q3_comm_alltoall_bytes(g, wire, wire + P * blk, blk);
    unpack_rows(wire + P * blk, P * rows, n, nq, recv);
}

void q3_comm_alltoallv_rows(q3_group *g, const float *send, const size_t *send_rows, float *recv,
                            const size_t *recv_rows, size_t n, size_t nq, uint8_t *wire) {
    const int P = q3_group_size(g);
    if (!nq) {
        q3_comm__alltoallv_units(g, send, send_rows, recv, recv_rows, n * sizeof(float));
        return;
    }
    check_nq(g, "alltoallv", n, nq);
    size_t ns = 0, nr = 0;
    for (int j = 0; j < P; j++) ns += send_rows[j], nr += recv_rows[j];
    const size_t wb = q3_comm_wire_row_bytes(n, nq);
    pack_rows(g, "alltoallv", send, ns, n, nq, wire);
    q3_comm__alltoallv_units(g, wire, send_rows, wire + ns * wb, recv_rows, wb);
    unpack_rows(wire + ns * wb, nr, n, nq, recv);
}
