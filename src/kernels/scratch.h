/* Per-thread scratch of the prefill kernels: one buffer per slot and
 * thread, allocated on its first use, kept for the life of the thread (so
 * a decode step after warm-up allocates nothing) and freed when the thread
 * exits (a thread pool that shrinks gives its threads' buffers back). */
#ifndef Q3_SCRATCH_H
#define Q3_SCRATCH_H

#include <stddef.h>

typedef enum {
    Q3_SCR_A8_ACT,   /* the A8 GEMM's packed inputs, */
    Q3_SCR_A8_ROW,   /* a row being packed, */
    Q3_SCR_A8_W,     /* its decoded weight rows */
    Q3_SCR_TOKENS_X, /* the tokens GEMVs' input copies */
    Q3_SCR_I8_ACT,   /* the integer GEMM's packed inputs, */
    Q3_SCR_I8_FS,    /* their block factors, */
    Q3_SCR_I8_W,     /* its decoded weight rows */
    Q3_SCR_BC_ACT,   /* the broadcast GEMM's packed inputs, */
    Q3_SCR_BC_W,     /* its widened weight rows, */
    Q3_SCR_BC_PERM,  /* MX-ordered input rows (AVX-512) */
    Q3_SCR_GLU,      /* a merged gate/up product's gate and up rows */
    Q3_SCR_WO_ACT,   /* the weight-only MX tiles' packed inputs, */
    Q3_SCR_WO_ROWS,  /* the rows being packed */
    Q3_SCR_BF16P,    /* BF16P rows unpacked to BF16 */
    Q3_SCR_COUNT
} q3_scratch_slot;

/* This thread's buffer for slot, of at least bytes, 64-byte aligned: made
 * on the first call, and made anew (contents lost) when a call asks for
 * more than the slot holds. Never NULL: out of memory is fatal, as for
 * q3_malloc. (Aligned because a 64-byte row of an AMX tile read from an
 * unaligned buffer spans two cache lines: AMX GEMMs ran at half speed.) */
void *q3_scratch(q3_scratch_slot slot, size_t bytes);
/* Makes slot hold at least bytes on every thread of the OpenMP pool now. */
void q3_scratch_reserve(q3_scratch_slot slot, size_t bytes);

#endif
