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
    int passes;         /* of each method */
    double best_gbs, median_gbs;   /* 1e9 bytes per second */
    const char *method; /* the read pass of the best figures: "avx2 sum", "avx2 sum, prefetch into L2", ... */
} bench_membw;

typedef struct {
    double gflops;      /* best of the runs, all threads */
    int chains;         /* independent FMA chains per thread */
    const char *method; /* "avx2+fma 256-bit" or "scalar mul+add" */
    double amx_gflops;  /* AMX bf16 tile peak, all threads (0: the kernels are not AMX's) */
} bench_fma;

/* A ceiling sampled beside the timed runs (between their repetitions), so
 * that on a shared host a ratio can be taken against what the machine
 * delivered in the same minutes, not only at the end. */
typedef struct {
    int n;               /* samples (0: none taken) */
    double best, worst;  /* GB/s or GFLOP/s */
} bench_beside;

void bench_beside_add(bench_beside *b, double v);

/* The machine's ceilings sampled between the timed repetitions (before
 * the first, between two, after the last): an FMA run beside prefill, when
 * fma is set, and read passes over [read_p, read_p + read_bytes) beside
 * decode, when read_p is set (the mapped weights: no memory of its own). */
typedef struct {
    int fma;
    const void *read_p;
    size_t read_bytes;
    bench_beside flops, read;
} bench_ceilings;

void bench_machine_info(bench_machine *m);
/* Stream-read a buffer of `bytes` (pages touched first) `passes` times with
 * every thread. Returns 0, or -1 with q3_err set when the buffer cannot be
 * allocated. */
int bench_measure_membw(size_t bytes, int passes, bench_membw *out);
/* The FMA peak; with the AMX kernels in force, also their tile peak. */
void bench_measure_fma(bench_fma *out);
/* One all-threads read pass over [p, p + bytes) (32-byte aligned, e.g. a
 * mapped model file, which it leaves unchanged): GB/s. prefetch: each line
 * is also prefetched ahead in software, as the GEMVs do (AVX2 only; on the
 * AMX Xeon of BENCHMARKS.md that read 9 % more than the plain pass). */
double bench_read_pass(const void *p, size_t bytes, int prefetch);
/* One all-threads FMA run of about 50 ms at the width bench_measure_fma
 * uses (calibrated on the first call): GFLOP/s. */
double bench_fma_pass(void);

#endif
