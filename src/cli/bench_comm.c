#include "cli/bench_comm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds spent in collectives of `phase` so far, all kinds. */
static double comm_seconds(const char *phase) {
    double t = 0;
    for (int k = 0; k < Q3_COLL_N; k++) t += q3_comm_stats_get((q3_coll)k, phase).seconds;
    return t;
}

/* The hook's state: where the last layer ended (wall and comm clock). One
 * bench measures one phase at a time on one thread, so a static is enough. */
static struct {
    bench_comm *b;
    int prefill;
    double t, comm;
} g_probe;

static void layer_hook(void *ctx, int layer, int T) {
    (void)ctx;
    bench_comm *b = g_probe.b;
    if ((T > 1) != g_probe.prefill) return;
    const double t = now_s(), comm = comm_seconds(b->phase);
    if (layer >= 0 && layer < b->layers) {
        b->layer_s[layer] += t - g_probe.t;
        b->layer_comm_s[layer] += comm - g_probe.comm;
    }
    g_probe.t = t;
    g_probe.comm = comm;
}

void bench_comm_begin(bench_comm *b, q3_state *s, const char *phase, int layers) {
    memset(b, 0, sizeof *b);
    b->phase = phase;
    b->layers = layers;
    b->layer_s = q3_calloc((size_t)layers, sizeof *b->layer_s);
    b->layer_comm_s = q3_calloc((size_t)layers, sizeof *b->layer_comm_s);
    /* counters before: subtracted at the end */
    for (int k = 0; k < Q3_COLL_N; k++) b->coll[k] = q3_comm_stats_get((q3_coll)k, phase);
    g_probe.b = b;
    g_probe.prefill = !strcmp(phase, "prefill");
    s->layer_hook = layer_hook;
    s->layer_hook_ctx = NULL;
}

void bench_comm_end(bench_comm *b, q3_state *s, double step_s, double units) {
    s->layer_hook = NULL;
    g_probe.b = NULL;
    for (int k = 0; k < Q3_COLL_N; k++) {
        q3_comm_stat now = q3_comm_stats_get((q3_coll)k, b->phase), *d = &b->coll[k];
        d->calls = now.calls - d->calls;
        d->bytes_sent = now.bytes_sent - d->bytes_sent;
        d->bytes_recv = now.bytes_recv - d->bytes_recv;
        d->seconds = now.seconds - d->seconds;
        d->max_seconds = 0;
    }
    b->step_s = step_s;
    b->units = units;
    b->ran = 1;
}

void bench_comm_free(bench_comm *b) {
    free(b->layer_s);
    free(b->layer_comm_s);
    b->layer_s = b->layer_comm_s = NULL;
}

double bench_comm_bytes_per_unit(const bench_comm *b) {
    double t = 0;
    for (int k = 0; k < Q3_COLL_N; k++) t += (double)b->coll[k].bytes_sent;
    return b->units > 0 ? t / b->units : 0;
}

double bench_comm_seconds_per_unit(const bench_comm *b) {
    double t = 0;
    for (int k = 0; k < Q3_COLL_N; k++) t += b->coll[k].seconds;
    return b->units > 0 ? t / b->units : 0;
}
