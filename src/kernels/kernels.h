/* Compute kernels of the forward pass. Activations are fp32, row-major.
 * Weights are read in place from the checkpoint mapping in their stored
 * dtype and widened to fp32 inside the kernels. Matmuls split output rows
 * across OpenMP threads, so results do not depend on the thread count. */
#ifndef Q3_KERNELS_H
#define Q3_KERNELS_H

#include <stddef.h>

#include "kernels/dtype.h"

/* A 2-D weight matrix [rows, cols] (nn.Linear layout: out_features x in_features). */
typedef struct {
    const void *data;
    q3_dtype dtype;
    int rows, cols;
} q3_mat;

/* out[t, r] = sum_k x[t, k] * W[r, k] for t < T, r < W.rows; x has W.cols columns.
 * Rows [r0, r1) of W only, written to out columns [r0, r1) (ld_out = stride of out). */
void q3_matmul_rows(float *out, size_t ld_out, const float *x, int T, const q3_mat *W, int r0, int r1);
/* Whole matrix, parallel over rows. */
void q3_matmul(float *out, const float *x, int T, const q3_mat *W);

/* out = x * rsqrt(mean(x^2) + eps) * w, for n-element vectors (out may alias x). */
void q3_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* out[i] = silu(gate[i]) * up[i] */
void q3_swiglu(float *out, const float *gate, const float *up, int n);
/* In-place softmax over n values. */
void q3_softmax(float *x, int n);
/* Rotate-half RoPE on one head vector of dimension d, with cos/sin tables of d/2 entries. */
void q3_rope(float *v, const float *cos_t, const float *sin_t, int d);

#endif
