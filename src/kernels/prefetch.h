/* Software prefetch of the weight streams every GEMV reads once, straight
 * from DRAM. The hardware prefetchers stop at every 4 KiB page edge, and on
 * some cores (the Intel Xeon measured in BENCHMARKS.md) they keep too few
 * lines in flight for one core's share of the bandwidth: each step asks
 * for the line Q3_PF_ROWS rows (at least Q3_PF_BYTES) ahead of the one it
 * reads, and each row for its scales Q3_PF_ROWS rows (at least
 * Q3_SC_PF_BYTES) ahead. The scale floor is for short rows: the down
 * projection's 24 bytes of scales per row were requested 1.5 lines ahead,
 * now 4 (kernel_bench moe, four rounds: down pass 36.0-38.5 -> 42.2-45.4
 * GB/s). Include after the file's target pragma. */
#ifndef Q3_PREFETCH_H
#define Q3_PREFETCH_H

#include <immintrin.h>
#include <stddef.h>

enum { Q3_PF_BYTES = 4096, Q3_PF_ROWS = 4, Q3_SC_PF_BYTES = 256 };

/* How far ahead of the element stream (rows of row_bytes) to prefetch. */
static inline size_t q3_pf_weights(size_t row_bytes) {
    return Q3_PF_ROWS * row_bytes > Q3_PF_BYTES ? Q3_PF_ROWS * row_bytes : Q3_PF_BYTES;
}

/* How far ahead of the scale stream (nb scale bytes per row). */
static inline size_t q3_pf_scales(size_t nb) {
    return Q3_PF_ROWS * nb > Q3_SC_PF_BYTES ? Q3_PF_ROWS * nb : Q3_SC_PF_BYTES;
}

/* Prefetches every 64-byte line of [p + dist, p + dist + bytes). */
static inline __attribute__((always_inline)) void q3_pf_lines(const void *p, size_t dist, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + dist + o, _MM_HINT_T0);
}

#endif
