/* Element types of weights as stored in checkpoints, and exact conversions
 * to fp32 (compute is always fp32). */
#ifndef Q3_DTYPE_H
#define Q3_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* MXFP8 / MXFP4 / MXINT8 are OCP Microscaling block formats (src/quant/mx.h):
 * the elements (E4M3 bytes, E2M1 nibbles two per byte with element 2i in
 * the low nibble, or int8 bytes) plus one E8M0 scale byte per 32 consecutive
 * elements of a row. BF16P holds BF16 values losslessly in groups of 64,
 * 12.5 bits each, with a side table of raw groups (src/quant/bf16p.h). */
typedef enum { Q3_F32 = 0, Q3_F16 = 1, Q3_BF16 = 2, Q3_MXFP8 = 3, Q3_MXFP4 = 4, Q3_MXINT8 = 5, Q3_BF16P = 6 } q3_dtype;

/* Element types read element by element from a flat array (q3_to_f32). */
static inline int q3_dtype_is_plain(q3_dtype t) { return t == Q3_F32 || t == Q3_F16 || t == Q3_BF16; }

static inline int q3_dtype_is_mx(q3_dtype t) { return t == Q3_MXFP8 || t == Q3_MXFP4 || t == Q3_MXINT8; }
/* The MX formats with minifloat elements (the float decoders' domain). */
static inline int q3_dtype_is_mxfp(q3_dtype t) { return t == Q3_MXFP8 || t == Q3_MXFP4; }

static inline float q3_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float q3_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);  /* inf / nan */
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else { /* subnormal: renormalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even fp32 -> bf16 (NaN kept quiet). */
static inline uint16_t q3_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Convert n elements starting at element `off` of a typed array to fp32
 * (plain dtypes only: MX and BF16P rows need q3_mat_row_f32). */
void q3_to_f32(float *dst, const void *src, q3_dtype t, size_t off, size_t n);

#endif
