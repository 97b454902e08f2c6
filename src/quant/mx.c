/* MX block quantization of fp32 rows (the format is described in mx.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/mx.h"
#include "util/error.h"

/* Exponent of each element type's largest binade: the block's largest value
 * is scaled into it, which keeps it as precise as the format allows. */
static int emax_elem(q3_mx_type t) { return t == Q3_MXFP8 ? 8 : t == Q3_MXFP4 ? 2 : 0; }

int q3_mx_shared_exp(q3_mx_type t, float amax) {
    if (amax == 0) return -127;
    int e;
    frexpf(amax, &e); /* floor(log2 amax) = e - 1, exact for subnormals too */
    int s = e - 1 - emax_elem(t);
    return s < -127 ? -127 : s > 127 ? 127 : s;
}

size_t q3_mx_scale_bytes(size_t n) { return n / Q3_MX_BLOCK; }
size_t q3_mx_elem_bytes(q3_mx_type t, size_t n) { return t == Q3_MXFP4 ? n / 2 : n; }
size_t q3_mx_row_bytes(q3_mx_type t, size_t n) { return q3_mx_scale_bytes(n) + q3_mx_elem_bytes(t, n); }

/* Validate the whole row first so a failing call leaves its outputs alone. */
static int check_row(const float *x, size_t n) {
    if (n % Q3_MX_BLOCK)
        return q3_err("MX quantize: row length %zu is not a multiple of the block size %d", n, Q3_MX_BLOCK);
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) return q3_err("MX quantize: element %zu is NaN", i);
        if (isinf(x[i])) return q3_err("MX quantize: element %zu is %cinfinity", i, x[i] < 0 ? '-' : '+');
    }
    return 0;
}

static int block_exp(q3_mx_type t, const float *x) {
    float amax = 0;
    for (int i = 0; i < Q3_MX_BLOCK; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax; /* a NaN is skipped, as by fmaxf */
    return q3_mx_shared_exp(t, amax);
}

/* Element code of x / 2^e. ldexpf is exact unless the result falls below the
 * fp32 normals, and such a value is far under half the smallest element
 * subnormal, so it rounds to (signed) zero either way: one rounding only. */
static uint8_t encode(q3_mx_type t, float x, int e) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const int E = (int)(bits >> 23 & 0xFF);
    float v;
    if (E >= 1 && E - e >= 1 && E - e <= 254) { /* x and v normal: the scaling is an exponent subtraction */
        bits = (bits & 0x807FFFFFu) | (uint32_t)(E - e) << 23;
        memcpy(&v, &bits, sizeof v);
    } else v = ldexpf(x, -e);
    return t == Q3_MXFP8 ? q3_e4m3_from_f32(v) : t == Q3_MXFP4 ? q3_e2m1_from_f32(v) : q3_int8_from_f32(v);
}

static float decode(q3_mx_type t, uint8_t code) {
    return t == Q3_MXFP8 ? q3_e4m3_lut[code] : t == Q3_MXFP4 ? q3_e2m1_lut[code & 0xF] : q3_int8_to_f32(code);
}

int q3_mx_quantize_row(q3_mx_type t, const float *x, size_t n, uint8_t *scales, uint8_t *elems) {
    if (check_row(x, n)) return -1;
    for (size_t b = 0; b < n / Q3_MX_BLOCK; b++) {
        const float *xb = x + b * Q3_MX_BLOCK;
        int e = block_exp(t, xb);
        scales[b] = (uint8_t)(e + 127);
        if (t != Q3_MXFP4) {
            for (int i = 0; i < Q3_MX_BLOCK; i++) elems[b * Q3_MX_BLOCK + i] = encode(t, xb[i], e);
        } else {
            uint8_t *eb = elems + b * (Q3_MX_BLOCK / 2);
            for (int i = 0; i < Q3_MX_BLOCK; i += 2)
                eb[i / 2] = (uint8_t)(encode(t, xb[i], e) | encode(t, xb[i + 1], e) << 4);
        }
    }
    return 0;
}

void q3_mx_dequantize_row(q3_mx_type t, const uint8_t *scales, const uint8_t *elems, size_t n, float *y) {
    for (size_t b = 0; b < n / Q3_MX_BLOCK; b++) {
        float s = q3_e8m0_to_f32(scales[b]);
        float *yb = y + b * Q3_MX_BLOCK;
        for (int i = 0; i < Q3_MX_BLOCK; i++) {
            size_t j = b * Q3_MX_BLOCK + (size_t)i;
            uint8_t c = t != Q3_MXFP4 ? elems[j] : (uint8_t)(elems[j / 2] >> (j % 2 * 4));
            yb[i] = decode(t, c) * s; /* exact: both factors are short powers-of-two multiples */
        }
    }
}

static float f32_pow2(int e) { /* 2^e for a normal exponent */
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One block quantized and dequantized without leaving fp32: each element is
 * rounded to its quantum 2^q (q = max(floor(log2|x|), shared + emin) -
 * mbits) by adding and subtracting 2^(q+23), which the FPU rounds to nearest
 * even exactly once, then clamped to the largest element times 2^shared.
 * Equal to encode+decode bit for bit while every quantity stays a normal
 * fp32 number (no overflow of 2^(q+23)), i.e. for shared exponents in
 * [-100, 90]. INT8 is the same with 6 "mantissa" bits and emin 0 (every
 * element has the quantum 2^(shared-6)); its zeros are unsigned. */
static void fake_quant_block_fast(q3_mx_type t, const float *x, int shared, float *y) {
    const int mbits = t == Q3_MXFP8 ? 3 : t == Q3_MXFP4 ? 1 : 6, emin = t == Q3_MXFP8 ? -6 : 0;
    const float top = (t == Q3_MXFP8 ? Q3_E4M3_MAX : t == Q3_MXFP4 ? Q3_E2M1_MAX : 127.0f / 64.0f) * f32_pow2(shared);
    const uint32_t keep_sign = t == Q3_MXINT8 ? 0 : 0x80000000u;
    const int qmin = shared + emin - mbits;
    for (int i = 0; i < Q3_MX_BLOCK; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        const uint32_t sign = u & 0x80000000u;
        u &= 0x7fffffffu;
        float a;
        memcpy(&a, &u, 4);
        int q = (int)(u >> 23) - 127 - mbits;
        if (q < qmin) q = qmin;
        const float magic = f32_pow2(q + 23);
        float r = (a + magic) - magic;
        if (r > top) r = top;
        memcpy(&u, &r, 4);
        u |= u ? sign : sign & keep_sign;
        memcpy(&y[i], &u, 4);
    }
}

int q3_mx_fake_quant_row(q3_mx_type t, const float *x, size_t n, float *y) {
    if (check_row(x, n)) return -1;
    for (size_t b = 0; b < n / Q3_MX_BLOCK; b++) {
        const float *xb = x + b * Q3_MX_BLOCK;
        int e = block_exp(t, xb); /* taken before y (possibly == x) is written */
        if (e >= -100 && e <= 90) {
            fake_quant_block_fast(t, xb, e, y + b * Q3_MX_BLOCK);
            continue;
        }
        float s = q3_e8m0_to_f32((uint8_t)(e + 127));
        for (int i = 0; i < Q3_MX_BLOCK; i++) y[b * Q3_MX_BLOCK + i] = decode(t, encode(t, xb[i], e)) * s;
    }
    return 0;
}
