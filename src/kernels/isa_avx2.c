/* AVX2 + FMA kernels (F16C for half weights). Compiled for those ISAs
 * regardless of the build flags; only called after a CPUID check. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>

#include "kernels/isa.h"

#define INLINE static inline __attribute__((always_inline))

/* Eight weights starting at element idx, widened to fp32. */
INLINE __m256 load8(const void *base, size_t idx, q3_dtype dt) {
    if (dt == Q3_F32) return _mm256_loadu_ps((const float *)base + idx);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx));
    if (dt == Q3_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One row: two accumulators over 16-element steps, then the tail in order.
 * Rows computed in groups below follow exactly this arithmetic, so a row's
 * result does not depend on which group it fell in. */
INLINE float row_finish(__m256 a0, __m256 a1, const float *x, const q3_mat *W, size_t row_off, int k16) {
    float s = hsum(_mm256_add_ps(a0, a1));
    for (int k = k16; k < W->cols; k++) {
        float w;
        q3_to_f32(&w, W->data, W->dtype, row_off + (size_t)k, 1);
        s += x[k] * w;
    }
    return s;
}

INLINE void gemv_t(float *out, const float *x, const q3_mat *W, int r0, int r1, q3_dtype dt) {
    const int K = W->cols, k16 = K & ~15;
    const size_t rs = W->rs ? W->rs : (size_t)K;
    const void *d = W->data;
    int r = r0;
    for (; r + 4 <= r1; r += 4) {
        __m256 a[4][2];
        for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
        const size_t o = (size_t)r * rs;
        for (int k = 0; k < k16; k += 16) {
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            for (int i = 0; i < 4; i++) {
                a[i][0] = _mm256_fmadd_ps(load8(d, o + i * rs + k, dt), x0, a[i][0]);
                a[i][1] = _mm256_fmadd_ps(load8(d, o + i * rs + k + 8, dt), x1, a[i][1]);
            }
        }
        for (int i = 0; i < 4; i++) out[r + i - r0] = row_finish(a[i][0], a[i][1], x, W, o + i * rs, k16);
    }
    for (; r < r1; r++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        const size_t o = (size_t)r * rs;
        for (int k = 0; k < k16; k += 16) {
            a0 = _mm256_fmadd_ps(load8(d, o + k, dt), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(load8(d, o + k + 8, dt), _mm256_loadu_ps(x + k + 8), a1);
        }
        out[r - r0] = row_finish(a0, a1, x, W, o, k16);
    }
}

static void gemv(float *out, const float *x, const q3_mat *W, int r0, int r1) {
    if (W->cs > 1) {
        q3_kernels_scalar.gemv(out, x, W, r0, r1);
        return;
    }
    switch (W->dtype) {
    case Q3_BF16: gemv_t(out, x, W, r0, r1, Q3_BF16); break;
    case Q3_F16: gemv_t(out, x, W, r0, r1, Q3_F16); break;
    case Q3_F32: gemv_t(out, x, W, r0, r1, Q3_F32); break;
    }
}

static void micro(const float *A, size_t lda, const float *Bp, int kc, float *C, size_t ldc, int mt, int nt, int accumulate) {
    __m256 c[Q3_MR][2];
    float tmp[Q3_NR];
    for (int t = 0; t < Q3_MR; t++) {
        c[t][0] = c[t][1] = _mm256_setzero_ps();
        if (accumulate && t < mt) {
            const float *src = C + t * ldc;
            if (nt < Q3_NR) {
                for (int j = 0; j < Q3_NR; j++) tmp[j] = j < nt ? src[j] : 0.0f;
                src = tmp;
            }
            c[t][0] = _mm256_loadu_ps(src);
            c[t][1] = _mm256_loadu_ps(src + 8);
        }
    }
    if (mt == Q3_MR) {
        for (int k = 0; k < kc; k++) {
            __m256 b0 = _mm256_load_ps(Bp + k * Q3_NR), b1 = _mm256_load_ps(Bp + k * Q3_NR + 8);
            for (int t = 0; t < Q3_MR; t++) {
                __m256 a = _mm256_broadcast_ss(A + t * lda + k);
                c[t][0] = _mm256_fmadd_ps(a, b0, c[t][0]);
                c[t][1] = _mm256_fmadd_ps(a, b1, c[t][1]);
            }
        }
    } else {
        for (int k = 0; k < kc; k++) {
            __m256 b0 = _mm256_load_ps(Bp + k * Q3_NR), b1 = _mm256_load_ps(Bp + k * Q3_NR + 8);
            for (int t = 0; t < mt; t++) {
                __m256 a = _mm256_broadcast_ss(A + t * lda + k);
                c[t][0] = _mm256_fmadd_ps(a, b0, c[t][0]);
                c[t][1] = _mm256_fmadd_ps(a, b1, c[t][1]);
            }
        }
    }
    for (int t = 0; t < mt; t++) {
        float *dst = C + t * ldc;
        if (nt == Q3_NR) {
            _mm256_storeu_ps(dst, c[t][0]);
            _mm256_storeu_ps(dst + 8, c[t][1]);
        } else {
            _mm256_storeu_ps(tmp, c[t][0]);
            _mm256_storeu_ps(tmp + 8, c[t][1]);
            for (int j = 0; j < nt; j++) dst[j] = tmp[j];
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void scale(float *y, float a, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}

const q3_isa_kernels q3_kernels_avx2 = {gemv, micro, dot, axpy, scale};
#pragma GCC pop_options
