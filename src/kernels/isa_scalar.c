/* Scalar reference kernels: the ground truth the SIMD variants are tested
 * against, and the fallback on CPUs without AVX2. */
#include <math.h>

#include "kernels/isa.h"

static void gemv(float *out, const float *x, const q3_mat *W, int r0, int r1) {
    enum { CHUNK = 256 };
    float w[CHUNK];
    for (int r = r0; r < r1; r++) {
        float acc[8] = {0}, s = 0;
        for (int c0 = 0; c0 < W->cols; c0 += CHUNK) {
            const int n = W->cols - c0 < CHUNK ? W->cols - c0 : CHUNK;
            q3_mat_row_f32(W, r, c0, n, w);
            int k = 0;
            for (; k + 8 <= n; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += x[c0 + k + j] * w[k + j];
            for (; k < n; k++) s += x[c0 + k] * w[k];
        }
        out[r - r0] = s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
}

static void micro(const float *A, size_t lda, size_t ska, const float *Bp, int kc, float *C, size_t ldc, int mt, int nt,
                  int accumulate) {
    for (int t = 0; t < mt; t++)
        for (int j = 0; j < nt; j++) {
            float s = accumulate ? C[t * ldc + j] : 0.0f;
            for (int k = 0; k < kc; k++) s += A[t * lda + k * ska] * Bp[k * Q3_NR + j];
            C[t * ldc + j] = s;
        }
}

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

/* Loop order i, k, r: each C element still sums over k in order. */
static void att_mm(float *C, const float *A, size_t si, size_t sk, const float *B, int R, int ni, int nk, int accumulate) {
    for (int i = 0; i < ni; i++) {
        float *c = C + (size_t)i * R;
        if (!accumulate)
            for (int r = 0; r < R; r++) c[r] = 0;
        for (int k = 0; k < nk; k++) {
            const float a = A[i * si + k * sk], *b = B + (size_t)k * R;
            for (int r = 0; r < R; r++) c[r] += a * b[r];
        }
    }
}

static void att_softmax(float *S, int nk, int R, float scale, const float *lim, float *m, float *l, float *O, int D) {
    for (int r = 0; r < R; r++) {
        float mx = m[r], sum = 0;
        for (int j = 0; j < nk; j++) {
            float *s = S + (size_t)j * R + r;
            *s = lim && j > lim[r] ? -INFINITY : *s * scale;
            if (*s > mx) mx = *s;
        }
        const float corr = expf(m[r] - mx); /* m = -inf on the first block gives 0 */
        for (int j = 0; j < nk; j++) {
            float *s = S + (size_t)j * R + r;
            *s = expf(*s - mx);
            sum += *s;
        }
        l[r] = l[r] * corr + sum;
        m[r] = mx;
        for (int d = 0; d < D; d++) O[(size_t)d * R + r] *= corr;
    }
}

const q3_isa_kernels q3_kernels_scalar = {.mr = Q3_MR, .gemv = gemv, .micro = micro, .small_t = 0,
    .dot = dot, .axpy = axpy, .scale = scale, .att_mm = att_mm, .att_softmax = att_softmax};
