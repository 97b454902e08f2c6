/* Results of `q3moe bench`, printed as an aligned table and written as JSON. */
#ifndef Q3_BENCH_REPORT_H
#define Q3_BENCH_REPORT_H

#include <stdio.h>

#include "cli/bench_comm.h"
#include "cli/bench_machine.h"
#include "cli/bench_model.h"
#include "cli/bench_ttft.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "sample/sampler.h"

typedef struct {
    int tokens, reps;
    double ms_median, ms_min, ms_max;
    double tok_s;       /* tokens / median time */
    double flops;       /* per prefill, see bench_prefill_flops */
    double gflops;      /* flops / median time */
    double mm_flops;    /* flops of the matmuls of one prefill */
    double mm_gflops;   /* matmul flops / time inside matmuls, all reps */
    double mm_share;    /* fraction of the prefill time spent in matmuls */
    double part_ms[Q3_MM_PARTS];     /* per prefill, inside each part's matmuls (mean over reps) */
    double part_gflops[Q3_MM_PARTS]; /* each part's matmul flops / its time there */
    double att_ms;                   /* per prefill, in attention over the KV cache (mean over reps) */
    double att_gflops;               /* its QK^T and PV flops / that time */
    int has_load;                    /* MoE, with every token's routing counted on this rank */
    uint64_t load[BENCH_LOAD_BUCKETS]; /* bench_expert_load of the first rep */
} bench_prefill_result;

typedef struct {
    int ran;
    int depth, steps, reps;
    double p50, p90, p99;           /* ms per token over steps * reps */
    double mean;                    /* the same steps' mean, what llama-bench reports */
    double tok_s;                   /* 1000 / p50 */
    double fixed_bytes;             /* per token, independent of routing */
    double expert_bytes;            /* per token, mean over the timed steps */
    double weight_bytes;            /* fixed + expert */
    double expert_hits_per_token;   /* experts read per token, all layers */
    double kv_bytes;                /* K/V cache read per token, mean over the timed steps */
    double gbs;                     /* weight_bytes / p50 */
    double mm_ms;                   /* mean time per step inside matmuls */
    double mm_share;                /* mm_ms / mean step time */
    double part_ms[Q3_MM_PARTS];    /* of mm_ms, per model part (q3_mm_part) */
    double part_bytes[Q3_MM_PARTS]; /* weight bytes those matmuls read per step */
    double att_ms;                  /* mean time per step in attention over the KV cache */
    double att_share;               /* att_ms / mean step time */
} bench_decode_result;

typedef struct {
    /* model (has_model = 0: machine measurements only) */
    int has_model;
    const char *dir;
    char name[256];
    q3_config cfg;
    double params, bytes, active_params;
    const char *dtype;
    int ctx;
    /* machine */
    bench_machine machine;
    bench_fma fma;
    bench_membw membw;
    /* the same ceilings sampled between the timed repetitions (one rank;
     * read_p is cleared once the model is closed); percentages are of the
     * best of these and the above */
    bench_ceilings beside;
    /* runs */
    int n_prefill;
    bench_prefill_result *prefill;
    bench_decode_result decode;
    bench_ttft ttft;
    long rss_kb;                    /* bench process peak RSS after the model runs */
    int hugepages;                  /* --hugepages: the model was copied into anonymous memory */
    size_t huge_bytes;              /* of which in transparent huge pages (AnonHugePages) */
    size_t file_pmd_bytes;          /* mapped: file bytes mapped with 2 MiB entries (FilePmdMapped) */
    /* ranks and sampling (every step ends with a sampled token) */
    int world;
    q3_sampler_params sp;
    /* --comm-stats: per prefill length (prefill_comm[n_prefill]) and decode */
    int comm_stats;
    bench_comm *prefill_comm, decode_comm;
} bench_results;

void bench_print_table(FILE *f, const bench_results *r);
/* Write the JSON report; refuses an existing file unless force. */
int bench_write_json(const char *path, int force, const bench_results *r);

#endif
