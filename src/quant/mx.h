/* OCP Microscaling (MX v1.0) formats: MXFP8 (E4M3 elements), MXFP4 (E2M1
 * elements) and MXINT8 (int8 elements with an implicit scale of 2^-6), each
 * block of Q3_MX_BLOCK consecutive values along a row (the reduction
 * dimension of a matmul) sharing one E8M0 power-of-two scale.
 *
 * This is the bit-exact scalar definition; faster kernels are tested against
 * it, and tools/mx_ref.py reimplements it independently in numpy.
 *
 * Quantizing one block of 32 values v:
 *   shared = floor(log2(max|v|)) - emax, clamped to [-127, 127]
 *            (emax = 8 for E4M3, 2 for E2M1, 0 for INT8; an all-zero block
 *            gets -127);
 *   scale code = shared + 127;
 *   element i = v[i] / 2^shared rounded to nearest, ties to even, in the
 *               element format (its subnormals included), saturating at the
 *               largest finite value (448 / 6 / 127/64). The sign of zero is
 *               kept, so -0 and negatives that round to zero give the
 *               negative-zero code (MXINT8 has none: they give code 0).
 * MXINT8 saturates symmetrically at +-127/64, as the OCP reference code
 * does: code 0x80 (-2) is never produced, though it decodes as -2. That
 * keeps |element| <= 127, which the integer kernels rely on for inputs.
 * NaN or infinite inputs are rejected. */
#ifndef Q3_QUANT_MX_H
#define Q3_QUANT_MX_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

#define Q3_MX_BLOCK 32

/* Q3_MXFP8 / Q3_MXFP4 / Q3_MXINT8, the MX members of q3_dtype. */
typedef q3_dtype q3_mx_type;

/* ---- Scalar element codecs (src/quant/minifloat.c) ---- */

/* FP8 E4M3 (sign, 4 exponent bits with bias 7, 3 mantissa bits): no
 * infinities, S.1111.111 is NaN, largest finite 448, subnormals m * 2^-9. */
#define Q3_E4M3_MAX 448.0f
/* FP4 E2M1 (sign, 2 exponent bits with bias 1, 1 mantissa bit), held in the
 * low nibble of a byte: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; no NaN, no infinity. */
#define Q3_E2M1_MAX 6.0f
/* E8M0 scale: 2^(code - 127); 0xFF is NaN. Code 0 (2^-127) is an fp32
 * subnormal, still exact. */
#define Q3_E8M0_NAN 0xFF

/* Decode tables, indexed by code (E2M1: by the 4-bit code). Entries for NaN
 * codes (0x7F, 0xFF) are NaN. */
extern const float q3_e4m3_lut[256];
extern const float q3_e2m1_lut[16];
/* Twice the E2M1 values by code, as int8 (exact: at most 2 significant
 * bits): the byte lookup table of the SIMD MXFP4 decoders. */
extern const int8_t q3_e2m1_x2[16];

/* Round to nearest, ties to even; finite values beyond the range and
 * infinities saturate to +-448. NaN gives a NaN code (0x7F, sign kept). */
uint8_t q3_e4m3_from_f32(float x);
float q3_e4m3_to_f32(uint8_t code);
/* Round to nearest, ties to even, saturating to +-6. E2M1 cannot encode NaN:
 * NaN gives code 0, so callers must reject it first (the row quantizer does). */
uint8_t q3_e2m1_from_f32(float x);
float q3_e2m1_to_f32(uint8_t code); /* only the low nibble is read */
/* INT8 with an implicit scale of 2^-6 (two's complement code): x * 64
 * rounded to nearest, ties to even, saturating to +-127 (code 0x81 / 0x7F);
 * zeros and NaN give code 0, so callers must reject NaN first. */
uint8_t q3_int8_from_f32(float x);
float q3_int8_to_f32(uint8_t code); /* (int8_t)code / 64 */
float q3_e8m0_to_f32(uint8_t code);

/* ---- Rows of blocks (src/quant/mx.c) ---- */

/* Shared block exponent (unbiased, in [-127, 127]) for a block whose largest
 * magnitude is amax (finite, >= 0). The scale code is this plus 127. */
int q3_mx_shared_exp(q3_mx_type t, float amax);

/* Storage of a row of n values (n a multiple of Q3_MX_BLOCK): n / 32 scale
 * bytes, and elements of one byte each (MXFP8, MXINT8) or two per byte (MXFP4:
 * element 2i in the LOW nibble, element 2i+1 in the high nibble). */
size_t q3_mx_scale_bytes(size_t n);
size_t q3_mx_elem_bytes(q3_mx_type t, size_t n);
size_t q3_mx_row_bytes(q3_mx_type t, size_t n); /* scales + elements */

/* Quantize x[0..n) into scales[n/32] and elems[q3_mx_elem_bytes(t, n)].
 * Returns -1 with a q3_err message (and writes nothing) if n is not a
 * multiple of 32 or any x[i] is NaN or infinite; 0 otherwise. */
int q3_mx_quantize_row(q3_mx_type t, const float *x, size_t n, uint8_t *scales, uint8_t *elems);

/* y[i] = element * scale, exact in fp32 except where it overflows to
 * infinity (only scale codes quantization never produces) or a NaN code is
 * read. n must be a multiple of 32 (a trailing partial block is ignored). */
void q3_mx_dequantize_row(q3_mx_type t, const uint8_t *scales, const uint8_t *elems, size_t n, float *y);

/* y = dequantize(quantize(x)) without the intermediate buffers: how
 * activations or weights see MX precision in an fp32 pipeline. y may equal x.
 * Same errors as q3_mx_quantize_row (y untouched then). */
int q3_mx_fake_quant_row(q3_mx_type t, const float *x, size_t n, float *y);

#endif
