/* Time to first token from process start, for `q3moe bench`: the running
 * executable is spawned as `q3moe generate --ids ... -n 1 --temp 0
 * --print-ids`, cold (checkpoint files evicted from the page cache with
 * posix_fadvise DONTNEED first) and warm. */
#ifndef Q3_BENCH_TTFT_H
#define Q3_BENCH_TTFT_H

#include <stdint.h>

typedef struct {
    int ran;
    int prompt_tokens;
    /* fork -> the first generated id arrives on the child's stdout */
    double cold_ms, warm_ms;
    /* fork -> the child has exited (includes teardown) */
    double cold_exit_ms, warm_exit_ms;
    long cold_rss_kb, warm_rss_kb;   /* child peak RSS (wait4 rusage) */
    int evicted_files;
    double evicted_bytes;
    double resident_after_evict;     /* fraction of those bytes still cached right after eviction */
} bench_ttft;

/* Evict the checkpoint's *.safetensors / *.json / *.txt files in `dir` from
 * the page cache (fdatasync, then posix_fadvise DONTNEED), then measure with
 * mincore how much of them is still resident. */
int bench_evict_dir(const char *dir, int *n_files, double *bytes, double *resident_frac);

/* threads_arg / ctx_arg: passed as -t / --ctx when > 0. */
int bench_measure_ttft(const char *dir, const int32_t *ids, int n, int threads_arg, int ctx_arg, bench_ttft *out);

#endif
