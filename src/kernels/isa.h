/* The per-ISA kernel table behind kernels.h. Each variant implements the
 * same two primitives; matmul.c drives them (blocking, threads). */
#ifndef Q3_ISA_H
#define Q3_ISA_H

#include "kernels/kernels.h"

/* GEMM blocking: panels of NR weight rows, K blocks of KC; token tiles of
 * `mr` rows (per ISA, at most Q3_MR_MAX). */
enum { Q3_NR = 16, Q3_KC = 256, Q3_MR = 6, Q3_MR_MAX = 14 };

typedef struct {
    int mr; /* token rows per micro tile */
    /* out[r - r0] = dot(x, W[r, :]) for r in [r0, r1): one token, weights streamed once. */
    void (*gemv)(float *out, const float *x, const q3_mat *W, int r0, int r1);
    /* C[t][j] (+)= sum_{k<kc} A[t][k] * Bp[k][j] for t < mt (<= mr), j < nt (<= NR);
     * Bp is a packed panel [kc][NR]; accumulate=0 overwrites C. */
    void (*micro)(const float *A, size_t lda, const float *Bp, int kc, float *C, size_t ldc, int mt, int nt,
                  int accumulate);
    /* Few tokens (T <= small_t): out[t][r] for r in [r0, r1), straight from the
     * stored rows (no packing), weights widened once per token block.
     * Plain dtypes with contiguous rows only; NULL: not available. */
    int small_t;
    void (*gemm_small)(float *out, size_t ldo, const float *x, size_t ldx, int T, const q3_mat *W, int r0, int r1);
    /* q3_pack_panel for contiguous rows (cs == 1); NULL: use the generic one. */
    void (*pack)(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc);
    /* Dense fp32 vector primitives for attention. */
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n); /* y += a * x */
    void (*scale)(float *y, float a, int n);                /* y *= a */
} q3_isa_kernels;

/* E8M0 scale code -> the fp32 factor the SIMD element decoders expect
 * (2^(c-127) times 2^120 for E4M3 bit-moved codes, times 1/2 for E2M1
 * codes decoded as 2x their value). */
const float *q3_mx_scale_table(q3_dtype t);

/* The kernels in force (after q3_kernels_init). */
const q3_isa_kernels *q3_isa_current(void);

extern const q3_isa_kernels q3_kernels_scalar;
extern const q3_isa_kernels q3_kernels_avx2;
extern const q3_isa_kernels q3_kernels_avx512;

/* Pack W[r0 .. r0+nr) x [k0 .. k0+kc) transposed into Bp[kc][NR] fp32, zero-padding rows >= nr. */
void q3_pack_panel(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc);

#endif
