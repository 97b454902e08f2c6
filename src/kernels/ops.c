/* Element-wise and per-vector operations (cheap next to the matmuls). */
#include "kernels/kernels.h"

#include <math.h>
#include <stdint.h>

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
