/* Software prefetch of the weight streams every GEMV reads once, straight
 * from DRAM. The hardware prefetchers stop at every 4 KiB page edge, and on
 * some cores (the Intel Xeon measured in BENCHMARKS.md) they keep too few
 * lines in flight for one core's share of the bandwidth: each step asks
 * for the line Q3_PF_WEIGHTS bytes ahead of the one it reads, and each row
 * for its scales Q3_PF_ROWS rows (at least Q3_SC_PF_BYTES) ahead.
 *
 * The weight distance is fixed, not a number of rows: on the AMD EPYC
 * (Zen 5) of BENCHMARKS.md, decode steps of q30b8 alternating in one
 * process between two distances, 100 steps each, ran the MXFP8 lm_head
 * 7.4-7.8 -> 6.4-6.7 ms and the whole W4A8 step 5-10 % faster with 3.5 KiB
 * than with 4 rows (8 KiB for its 2 KiB rows), and the BF16 step 2-4 %
 * (16 KiB before). Distances of 3-3.75, 5, 6 and 9 KiB all did about as
 * well; 4 and 8 KiB, 2 and 2.5 KiB did not. (The Intel Xeon was tuned with
 * 4 rows and not measured again.) The scale floor is for short rows: the
 * down projection's 24 bytes of scales per row were requested 1.5 lines
 * ahead, now 4 (kernel_bench moe, four rounds: down pass 36.0-38.5 ->
 * 42.2-45.4 GB/s). Q3_PF_BYTES is the distance of the AVX2 GEMMs' weight
 * prefetch. Include after the file's target pragma. */
#ifndef Q3_PREFETCH_H
#define Q3_PREFETCH_H

#include <immintrin.h>
#include <stddef.h>

enum { Q3_PF_WEIGHTS = 3584, Q3_PF_BYTES = 4096, Q3_PF_ROWS = 4, Q3_SC_PF_BYTES = 256 };

/* The plain GEMVs without software prefetch read two rows side by side,
 * row i and row half + i of each span of this many rows (isa_avx512.c's
 * gemv_hw says why; halves far apart, as whole per-thread shares of a
 * large matrix, ran slower than one stream). */
#ifndef Q3_GEMV_PAIR_SPAN
#define Q3_GEMV_PAIR_SPAN 128
#endif

/* Rows apart of the pairs in the span of rows from c (r1 - c >= 2): half
 * of the span, the last one's odd row left over. */
static inline int q3_pair_half(int c, int r1) { return (r1 - c < Q3_GEMV_PAIR_SPAN ? r1 - c : Q3_GEMV_PAIR_SPAN) / 2; }

/* How far ahead of the scale stream (nb scale bytes per row). */
static inline size_t q3_pf_scales(size_t nb) {
    return Q3_PF_ROWS * nb > Q3_SC_PF_BYTES ? Q3_PF_ROWS * nb : Q3_SC_PF_BYTES;
}

/* Which cache the GEMVs' prefetches fill: L2 (PREFETCHT1) where set, else
 * L1 (PREFETCHT0). Set once by q3_kernels_init (isa_select.c), before any
 * kernel runs: L2 on Intel CPUs, L1 on others, Q3MOE_PREFETCH_TO=l1|l2
 * decides instead. On the AMX Xeon of BENCHMARKS.md, decode steps of
 * q30b8 alternating between the two ran W4A8 3-11 %, BF16 7-18 %, w4a8i
 * 12-18 % faster into L2 (why was not measured: the VM has no PMU
 * counters; a prefetch into L1 likely holds one of the core's few L1 miss
 * buffers until its line arrives from DRAM). AMD documents T0-T2 as alike
 * up to Zen 3 and T1 as into L2 from Zen 4; AMD cores were not measured
 * with it, so they keep L1. */
extern int q3_pf_to_l2;

/* One line at p, into L2 (to_l2) or L1. The GEMVs whose vector ports
 * bound them take to_l2 as a constant: each has a copy of its loops per
 * level, chosen once per call from q3_pf_to_l2, so that no flag is tested
 * in their loops (a build that did ran W4A8 decode 1-4 % slower than a
 * fixed hint). */
static inline __attribute__((always_inline)) void q3_pf_line(const void *p, const int to_l2) {
    if (to_l2) _mm_prefetch((const char *)p, _MM_HINT_T1);
    else _mm_prefetch((const char *)p, _MM_HINT_T0);
}

/* Keeps v (a vector just loaded from a weight stream) in a register: GCC
 * may otherwise fold the load again into each instruction that uses v, and
 * when the stream is prefetched into L2 only, each of those loads misses
 * L1 (the MXFP4 GEMV of the AMX table ran 10 % slower so, 2 threads from
 * DRAM). */
#define Q3_IN_REGISTER(v) __asm__("" : "+v"(v))

/* Prefetches every 64-byte line of [p + dist, p + dist + bytes). */
static inline __attribute__((always_inline)) void q3_pf_lines(const void *p, size_t dist, size_t bytes) {
    const int l2 = q3_pf_to_l2;
    for (size_t o = 0; o < bytes; o += 64) q3_pf_line((const char *)p + dist + o, l2);
}

#endif
