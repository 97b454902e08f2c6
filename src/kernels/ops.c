/* Element-wise and per-vector operations (cheap next to the matmuls). */
#include "kernels/kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/isa.h"
#include "quant/bf16p.h"
#include "quant/mx.h"

void q3_to_f32(float *dst, const void *src, q3_dtype t, size_t off, size_t n) {
    switch (t) {
    case Q3_MXFP8:
    case Q3_MXFP4:
    case Q3_MXINT8:
    case Q3_BF16P: abort(); /* needs scales or groups: q3_mat_row_f32 */
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

/* Sum of squares in double, in 8 interleaved partial sums: one running sum
 * was a chain of dependent adds (4 cycles per element; a 2048-wide norm
 * took 6 us), and the fixed order keeps every result reproducible. */
static double sumsq(const float *x, int n) {
    double s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += (double)x[i + j] * x[i + j];
    for (; i < n; i++) s[0] += (double)x[i] * x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void q3_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float inv = (float)(1.0 / sqrt(sumsq(x, n) / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

void q3_add_rmsnorm(float *x, const float *delta, const float *w, float *out, int n, float eps) {
    for (int i = 0; i < n; i++) x[i] += delta[i];
    float inv = (float)(1.0 / sqrt(sumsq(x, n) / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

void q3_add_rmsnorm_mx(float *x, const float *delta, const float *w, float *out, float *out_q, int n, float eps,
                       q3_dtype act) {
    if (delta)
        for (int i = 0; i < n; i++) x[i] += delta[i];
    float inv = (float)(1.0 / sqrt(sumsq(x, n) / n + eps));
    /* delta is consumed, so out_q may now be written even where it aliases it. */
    for (int i = 0; i < n; i++) out_q[i] = x[i] * inv * w[i];
    if (out && out != out_q) memcpy(out, out_q, (size_t)n * sizeof(float));
    if (q3_act_mx(act, out_q, (size_t)n, out_q) == 0) return;
    for (int b = 0; b < n; b += Q3_MX_BLOCK) /* a NaN/Inf somewhere: the other blocks one by one */
        (void)q3_act_mx(act, out_q + b, Q3_MX_BLOCK, out_q + b);
}

int q3_act_mx(q3_dtype act, const float *x, size_t n, float *y) {
    const q3_isa_kernels *k = q3_isa_current();
    if (act == Q3_MXFP8 && k->mx8_fake_quant) return k->mx8_fake_quant(x, n, y);
    if (act == Q3_MXINT8 && k->mxi8_fake_quant) return k->mxi8_fake_quant(x, n, y);
    return q3_mx_fake_quant_row(act, x, n, y);
}

void q3_axpy(float *y, float a, const float *x, int n) { q3_isa_current()->axpy(y, a, x, n); }

void q3_swiglu(float *out, const float *gate, const float *up, int n) {
    const q3_isa_kernels *k = q3_isa_current();
    if (k->swiglu) {
        k->swiglu(out, gate, up, n);
        return;
    }
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

q3_mat q3_mat_rows(const q3_mat *W, int r0, int n) {
    q3_mat v = *W;
    if (q3_dtype_is_mx(W->dtype)) {
        v.data = (const uint8_t *)W->data + (size_t)r0 * q3_mx_elem_bytes(W->dtype, (size_t)W->cols);
        v.scales = W->scales + (size_t)r0 * (size_t)(W->cols / Q3_MX_BLOCK);
    } else if (W->dtype == Q3_BF16P) { /* the side table is the whole matrix's */
        v.data = (const uint8_t *)W->data + (size_t)r0 * q3_bf16p_row_bytes((size_t)W->cols);
    } else {
        const size_t rs = W->rs ? W->rs : (size_t)W->cols;
        v.data = (const char *)W->data + (size_t)r0 * rs * (W->dtype == Q3_F32 ? 4 : 2);
    }
    v.rows = n;
    return v;
}

size_t q3_mat_bytes(const q3_mat *W) {
    size_t n = (size_t)W->rows * (size_t)W->cols;
    switch (W->dtype) {
    case Q3_F32: return n * 4;
    case Q3_F16:
    case Q3_BF16: return n * 2;
    case Q3_MXFP8:
    case Q3_MXINT8: return n + n / Q3_MX_BLOCK;
    case Q3_MXFP4: return n / 2 + n / Q3_MX_BLOCK;
    case Q3_BF16P: return (size_t)W->rows * q3_bf16p_row_bytes((size_t)W->cols); /* raw groups: a few per mille more */
    }
    return 0;
}

void q3_mat_row_f32(const q3_mat *W, int r, int k0, int n, float *dst) {
    const size_t rs = W->rs ? W->rs : (size_t)W->cols, cs = W->cs ? W->cs : 1;
    const size_t base = (size_t)r * rs + (size_t)k0 * cs;
    if (W->dtype == Q3_BF16P) { /* contiguous rows; k0 and n need not be group-aligned */
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * q3_bf16p_row_bytes((size_t)W->cols);
        uint16_t g[Q3_BF16P_GROUP];
        for (int k = 0; k < n;) {
            const int col = k0 + k, gi = col / Q3_BF16P_GROUP, end = (gi + 1) * Q3_BF16P_GROUP - k0;
            q3_bf16p_unpack_group(row + (size_t)gi * Q3_BF16P_GROUP_BYTES, W->scales, W->side_groups, g);
            for (; k < n && k < end; k++) dst[k] = q3_bf16_to_f32(g[(k0 + k) % Q3_BF16P_GROUP]);
        }
        return;
    }
    if (!q3_dtype_is_mx(W->dtype)) {
        if (cs == 1) q3_to_f32(dst, W->data, W->dtype, base, (size_t)n);
        else
            for (int k = 0; k < n; k++) q3_to_f32(dst + k, W->data, W->dtype, base + (size_t)k * cs, 1);
        return;
    }
    /* MX: one scale per 32-block; k0 and n need not be block-aligned. */
    const uint8_t *el = W->data, *sc = W->scales + (size_t)r * (W->cols / Q3_MX_BLOCK);
    const q3_dtype t = W->dtype;
    for (int k = 0; k < n;) {
        const int col = k0 + k, blk = col / Q3_MX_BLOCK, end = (blk + 1) * Q3_MX_BLOCK - k0;
        const int stop = end < n ? end : n;
        const float scale = q3_e8m0_to_f32(sc[blk]);
        for (; k < stop; k++) {
            const size_t i = base + (size_t)k;
            const float e = t == Q3_MXFP4   ? q3_e2m1_lut[(el[i / 2] >> ((i & 1) * 4)) & 15]
                            : t == Q3_MXFP8 ? q3_e4m3_lut[el[i]]
                                            : q3_int8_to_f32(el[i]);
            dst[k] = e * scale;
        }
    }
}
