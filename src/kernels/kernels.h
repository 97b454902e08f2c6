/* Compute kernels of the forward pass. Activations are fp32, row-major.
 * Weights are read in place (from the checkpoint mapping) in their stored
 * dtype and widened to fp32 inside the kernels.
 *
 * Every kernel has a scalar reference and SIMD variants (AVX2+FMA,
 * AVX-512, AMX tiles), chosen at run time from the CPU's features
 * (Q3MOE_ISA=scalar|avx2|avx512|avx512bf16|amx forces one, for tests and
 * comparisons). Work is split across
 * the OpenMP threads by output rows and fixed-size blocks, so results are
 * bit-identical whatever the thread count. */
#ifndef Q3_KERNELS_H
#define Q3_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

/* A 2-D matrix [rows, cols] (nn.Linear layout: out_features x in_features).
 * Element (r, c) is at data[r * rs + c * cs] (in elements); rs = cs = 0
 * means contiguous rows (rs = cols, cs = 1). Strided views serve attention
 * (keys and values inside the KV cache). */
typedef struct {
    const void *data;
    q3_dtype dtype;
    int rows, cols;
    size_t rs, cs;
    /* MX dtypes: E8M0 scales, cols/32 per row, rows contiguous (rs = cols,
     * cs = 1 only); data holds the elements. */
    const uint8_t *scales;
    /* A8: the model quantizes this linear's input per 32-block before
     * every product, to MXFP8 or (ai8) MXINT8, so kernels may take the
     * input as exact bf16 values, and under ai8 as int8 elements with
     * E8M0 scales (the integer kernels). */
    int a8, ai8;
    /* BF16P: rows contiguous (rs = 0, cs = 1), scales points to the side
     * table of this many raw groups (src/quant/bf16p.h). */
    size_t side_groups;
} q3_mat;

/* Bytes of weight data (elements + scales) the matrix occupies. */
size_t q3_mat_bytes(const q3_mat *W);
/* Rows [r0, r0 + n) of W, as a matrix of n rows over the same storage. */
q3_mat q3_mat_rows(const q3_mat *W, int r0, int n);
/* W[r, k0 .. k0+n) widened to fp32 (any dtype, any stride). */
void q3_mat_row_f32(const q3_mat *W, int r, int k0, int n, float *dst);

/* Each level has every kernel of the one below; AVX512BF16 adds the A8
 * kernels (MXFP8 activations x MX weights on bf16 dot products), AMX the
 * prefill GEMMs on AMX-BF16 tiles (BF16 weights, A8 products). */
typedef enum {
    Q3_ISA_SCALAR = 0,
    Q3_ISA_AVX2 = 1,
    Q3_ISA_AVX512 = 2,
    Q3_ISA_AVX512BF16 = 3,
    Q3_ISA_AMX = 4,
    Q3_ISA_COUNT
} q3_isa;

/* Pick the kernels for this CPU (idempotent; called by the first matmul). */
void q3_kernels_init(void);
q3_isa q3_kernels_isa(void);
const char *q3_isa_name(q3_isa isa);
/* The kernels in use, for reports: the ISA's name, "+vnni" where the
 * integer GEMM runs on AVX-512 VNNI (e.g. "avx512+vnni"). */
const char *q3_kernels_desc(void);
/* Force an ISA (falls back to the best supported one below it); for tests. */
void q3_kernels_force(q3_isa isa);

/* One product: out[t, r] = sum_k x[t, k] * W[r, k], t < T, r < W->rows.
 * x rows are ldx floats apart, out rows ldo floats apart. With up (the
 * merged gate/up of a SwiGLU MLP, same shape and dtype as W):
 * out[t, r] = silu(sum_k x[t, k] W[r, k]) * sum_k x[t, k] up[r, k], both
 * products of each panel of rows computed by one thread and combined
 * while they are in its cache. */
typedef struct {
    float *out;
    size_t ldo;
    const float *x;
    size_t ldx;
    int T;
    const q3_mat *W;
    const q3_mat *up;
} q3_mm_job;

/* Run several independent products in one parallel pass (merged QKV,
 * gate+up of every selected expert, ...): the threads split the union of
 * their output rows, balanced by cost. */
void q3_matmul_jobs(const q3_mm_job *jobs, int n);
/* out[T, W.rows] = x[T, W.cols] * W^T, contiguous. */
void q3_matmul(float *out, const float *x, int T, const q3_mat *W);
/* The part of the model a matmul call serves, for q3_matmul_stats: the
 * forward pass names it before its calls (q3_matmul_part, the calling
 * thread's; Q3_MM_OTHER until named). */
typedef enum { Q3_MM_OTHER, Q3_MM_ATTN, Q3_MM_MLP, Q3_MM_ROUTER, Q3_MM_EXPERTS, Q3_MM_LM_HEAD, Q3_MM_PARTS } q3_mm_part;
void q3_matmul_part(q3_mm_part part);
const char *q3_mm_part_name(q3_mm_part part);
/* Wall time and useful flops (2 * T * rows * cols per job) of the calling
 * thread's q3_matmul_jobs calls since its last reset: how fast prefill runs
 * inside its matmuls, for q3moe bench; and per part, the time, flops and
 * weight bytes of those calls (q3_mat_bytes of each job's matrix, once per
 * call): where a decode step's memory traffic runs slow. */
typedef struct {
    double seconds, flops;
    double part_seconds[Q3_MM_PARTS], part_bytes[Q3_MM_PARTS], part_flops[Q3_MM_PARTS];
} q3_matmul_stats;
void q3_matmul_stats_reset(void);
q3_matmul_stats q3_matmul_stats_get(void);
/* acc += st, part by part. */
void q3_matmul_stats_add(q3_matmul_stats *acc, const q3_matmul_stats *st);

/* out = x * rsqrt(mean(x^2) + eps) * w, for n-element vectors (out may alias x). */
void q3_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* Residual add fused with the next norm: x += delta; out = rmsnorm(x) * w. */
void q3_add_rmsnorm(float *x, const float *delta, const float *w, float *out, int n, float eps);
/* The same (no add when delta is NULL), also writing out's copy quantized
 * to act (Q3_MXFP8 or Q3_MXINT8: the A8 input of the next linears,
 * dequantized values, per 32-block) to out_q in the same pass. out may be
 * NULL (only the copy is wanted); out_q may alias out or delta. n % 32 ==
 * 0. A block holding NaN/Inf is copied as is. */
void q3_add_rmsnorm_mx(float *x, const float *delta, const float *w, float *out, float *out_q, int n, float eps,
                       q3_dtype act);
/* y = x quantized to act (Q3_MXFP8 or Q3_MXINT8) and back, per 32-block
 * (q3_mx_fake_quant_row, bit for bit, by the fastest kernel): the A8 input
 * of a quantized linear. -1, writing nothing, when x holds NaN/Inf. */
int q3_act_mx(q3_dtype act, const float *x, size_t n, float *y);
/* y[i] += a * x[i] (the fastest kernel: fused multiply-adds where the CPU has them). */
void q3_axpy(float *y, float a, const float *x, int n);
/* out[i] = silu(gate[i]) * up[i] */
void q3_swiglu(float *out, const float *gate, const float *up, int n);
/* In-place softmax over n values. */
void q3_softmax(float *x, int n);
/* Rotate-half RoPE on one head vector of dimension d, with cos/sin tables of d/2 entries. */
void q3_rope(float *v, const float *cos_t, const float *sin_t, int d);

#endif
