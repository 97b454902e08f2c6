/* Machine measurements for `q3moe bench`: CPU description, multi-threaded
 * memory read bandwidth and FMA compute peak, both measured at run time
 * with the OpenMP thread count in force. */
#ifndef Q3_BENCH_MACHINE_H
#define Q3_BENCH_MACHINE_H

#include <stddef.h>

typedef struct {
    char cpu[128];      /* "model name" from /proc/cpuinfo, or "unknown" */
    int cores;          /* online logical CPUs */
    int threads;        /* OpenMP threads in force */
    double loadavg;     /* 1-minute load average when the bench started (-1: unknown) */
} bench_machine;

typedef struct {
    int ran;
    size_t bytes;       /* buffer size */
    int passes;
    double best_gbs, median_gbs;   /* 1e9 bytes per second */
    const char *method; /* "avx2" or "scalar" */
} bench_membw;

typedef struct {
    double gflops;      /* best of the runs, all threads */
    int chains;         /* independent FMA chains per thread */
    const char *method; /* "avx2+fma 256-bit" or "scalar mul+add" */
} bench_fma;

void bench_machine_info(bench_machine *m);
/* Stream-read a buffer of `bytes` (pages touched first) `passes` times with
 * every thread. Returns 0, or -1 with q3_err set when the buffer cannot be
 * allocated. */
int bench_measure_membw(size_t bytes, int passes, bench_membw *out);
void bench_measure_fma(bench_fma *out);

#endif
