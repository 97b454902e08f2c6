#include "kernels/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

void q3_to_f32(float *dst, const void *src, q3_dtype t, size_t off, size_t n) {
    switch (t) {
    case Q3_F32: memcpy(dst, (const float *)src + off, n * sizeof(float)); break;
    case Q3_BF16: {
        const uint16_t *s = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++) dst[i] = q3_bf16_to_f32(s[i]);
        break;
    }
    case Q3_F16: {
        const uint16_t *s = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++) dst[i] = q3_f16_to_f32(s[i]);
        break;
    }
    }
}

/* Eight independent partial sums so the compiler can keep them in one vector register. */
static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

enum { ROW_BLOCK = 8, TOK_BLOCK = 16 };

void q3_matmul_rows(float *out, size_t ld_out, const float *x, int T, const q3_mat *W, int r0, int r1) {
    const int K = W->cols;
    /* Widen a block of weight rows once, then reuse it for every token. */
    float *wbuf = malloc((size_t)ROW_BLOCK * K * sizeof(float));
    if (!wbuf) abort();
    for (int rb = r0; rb < r1; rb += ROW_BLOCK) {
        int nr = r1 - rb < ROW_BLOCK ? r1 - rb : ROW_BLOCK;
        for (int r = 0; r < nr; r++) q3_to_f32(wbuf + (size_t)r * K, W->data, W->dtype, (size_t)(rb + r) * K, K);
        for (int tb = 0; tb < T; tb += TOK_BLOCK) {
            int nt = T - tb < TOK_BLOCK ? T - tb : TOK_BLOCK;
            for (int t = tb; t < tb + nt; t++)
                for (int r = 0; r < nr; r++) out[(size_t)t * ld_out + rb + r] = dot(x + (size_t)t * K, wbuf + (size_t)r * K, K);
        }
    }
    free(wbuf);
}

void q3_matmul(float *out, const float *x, int T, const q3_mat *W) {
    const int M = W->rows;
    /* Chunks of whole row blocks; each thread owns disjoint output columns. */
    int nthreads = omp_get_max_threads();
    if ((size_t)M * W->cols < 32768) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int blocks = (M + ROW_BLOCK - 1) / ROW_BLOCK;
        int b0 = (int)((long)blocks * id / nt), b1 = (int)((long)blocks * (id + 1) / nt);
        int r0 = b0 * ROW_BLOCK, r1 = b1 * ROW_BLOCK < M ? b1 * ROW_BLOCK : M;
        if (r0 < r1) q3_matmul_rows(out, (size_t)M, x, T, W, r0, r1);
    }
}

void q3_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

void q3_swiglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void q3_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int i = 0; i < n; i++) sum += (x[i] = expf(x[i] - mx));
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void q3_rope(float *v, const float *cos_t, const float *sin_t, int d) {
    int h = d / 2;
    for (int i = 0; i < h; i++) {
        float a = v[i], b = v[i + h];
        v[i] = a * cos_t[i] - b * sin_t[i];
        v[i + h] = b * cos_t[i] + a * sin_t[i];
    }
}
