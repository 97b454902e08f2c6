/* `q3moe bench --comm-stats`: the comm layer's counters (src/parallel/comm.h)
 * per collective kind over the timed runs of one phase, and per-layer
 * compute and comm time from a layer hook on the forward pass. */
#ifndef Q3_BENCH_COMM_H
#define Q3_BENCH_COMM_H

#include <stdint.h>

#include "model/forward.h"
#include "parallel/comm.h"

typedef struct {
    int ran;
    const char *phase;              /* "prefill" or "decode" (the comm layer's phase) */
    double units;                   /* prompts or decode tokens measured */
    q3_comm_stat coll[Q3_COLL_N];   /* per kind, summed over the units (max_seconds: unused) */
    int layers;
    double *layer_s, *layer_comm_s; /* [layers] wall and comm seconds, summed over the units */
    double step_s;                  /* wall of the timed calls (forward + sampling), summed */
} bench_comm;

/* Start measuring `phase` on state s: snapshot the counters and install
 * the layer hook, which counts chunks of more than one token (prefill) or
 * of one (decode) only, so a decode run's untimed prefill is left out.
 * Allocates the per-layer arrays (freed by bench_comm_free). */
void bench_comm_begin(bench_comm *b, q3_state *s, const char *phase, int layers);
/* Stop: counters since begin, hook removed; step_s and units are the
 * caller's (timed wall seconds, prompts or tokens). */
void bench_comm_end(bench_comm *b, q3_state *s, double step_s, double units);
void bench_comm_free(bench_comm *b);

/* Link bytes sent per unit over all kinds, and comm seconds per unit. */
double bench_comm_bytes_per_unit(const bench_comm *b);
double bench_comm_seconds_per_unit(const bench_comm *b);

#endif
