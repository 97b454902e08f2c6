/* Scalar codecs for the MX element and scale types. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/mx.h"

/* Decode tables written as exact products, so the compiler folds them to the
 * right bit patterns and the tests can compare them against an independent
 * ldexp() decode. A row is one exponent field: value = (8 + m) * 2^(field - 10)
 * for normals, m * 2^-9 for the subnormal row. */
#define Q3_SUB8(s) 0 * (s), 1 * (s), 2 * (s), 3 * (s), 4 * (s), 5 * (s), 6 * (s), 7 * (s)
#define Q3_NORM8(s) 8 * (s), 9 * (s), 10 * (s), 11 * (s), 12 * (s), 13 * (s), 14 * (s), 15 * (s)
#define Q3_E4M3_HALF(sg)                                                                                     \
    Q3_SUB8(sg 0x1p-9f), Q3_NORM8(sg 0x1p-9f), Q3_NORM8(sg 0x1p-8f), Q3_NORM8(sg 0x1p-7f),                   \
        Q3_NORM8(sg 0x1p-6f), Q3_NORM8(sg 0x1p-5f), Q3_NORM8(sg 0x1p-4f), Q3_NORM8(sg 0x1p-3f),              \
        Q3_NORM8(sg 0x1p-2f), Q3_NORM8(sg 0x1p-1f), Q3_NORM8(sg 0x1p0f), Q3_NORM8(sg 0x1p1f),                \
        Q3_NORM8(sg 0x1p2f), Q3_NORM8(sg 0x1p3f), Q3_NORM8(sg 0x1p4f), /* field 15: m = 7 is NaN */          \
        8 * (sg 0x1p5f), 9 * (sg 0x1p5f), 10 * (sg 0x1p5f), 11 * (sg 0x1p5f), 12 * (sg 0x1p5f),              \
        13 * (sg 0x1p5f), 14 * (sg 0x1p5f), sg NAN

const float q3_e4m3_lut[256] = {Q3_E4M3_HALF(+), Q3_E4M3_HALF(-)};

const float q3_e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

const int8_t q3_e2m1_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* a (finite, >= 0) rounded to the nearest integer, ties to even. Written out
 * rather than rintf() so the result does not depend on the rounding mode. */
static unsigned round_half_even(float a) {
    float f = floorf(a), frac = a - f; /* exact: f and a share a's quantum */
    unsigned m = (unsigned)f;
    if (frac > 0.5f || (frac == 0.5f && (m & 1))) m++;
    return m;
}

/* Sign-less code of a (>= 0, may be +inf) in a binary minifloat with `mbits`
 * mantissa bits whose smallest normal exponent is emin; max / maxcode is the
 * largest finite value. Everything below 2^emin shares the subnormal quantum
 * 2^(emin - mbits), so clamping the exponent there makes one formula cover
 * both ranges: code = (e - emin) << mbits + m, where m counts quanta. A
 * mantissa carry (m = 2^(mbits+1)) then lands on the next binade's code by
 * itself, and m < 2^mbits at e = emin is the subnormal encoding. */
static unsigned encode_mag(float a, int mbits, int emin, float max, unsigned maxcode) {
    if (!(a < max)) return maxcode; /* below max, rounding cannot exceed it (max has an even mantissa) */
    if (a == 0) return 0;
    uint32_t bits;
    memcpy(&bits, &a, sizeof bits);
    if (bits >> 23) {
        /* Normal a = sig * 2^(E - 150): the same formula in integers (about
         * 4x faster than frexpf/ldexpf/floorf, which made conversion slow).
         * m = sig / 2^shift rounded half to even, shift >= 23 - mbits > 0. */
        const int E = (int)(bits >> 23), e = E - 127 < emin ? emin : E - 127, shift = e - mbits + 150 - E;
        const uint32_t sig = (bits & 0x7FFFFFu) | 0x800000u;
        if (shift > 24) return ((unsigned)(e - emin) << mbits); /* a < 2^-1 quanta: rounds to 0 */
        uint32_t m = sig >> shift;
        const uint32_t rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (m & 1))) m++;
        return ((unsigned)(e - emin) << mbits) + m;
    }
    int e;
    frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1), also for fp32 subnormals */
    e -= 1;        /* floor(log2 a) */
    if (e < emin) e = emin;
    unsigned m = round_half_even(ldexpf(a, mbits - e)); /* exact scaling: < 2^(mbits+1), no bits lost */
    return ((unsigned)(e - emin) << mbits) + m;
}

uint8_t q3_e4m3_from_f32(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7F;
    return sign | (uint8_t)encode_mag(fabsf(x), 3, -6, Q3_E4M3_MAX, 0x7E);
}

float q3_e4m3_to_f32(uint8_t code) { return q3_e4m3_lut[code]; }

uint8_t q3_e2m1_from_f32(float x) {
    if (isnan(x)) return 0;
    uint8_t sign = signbit(x) ? 0x8 : 0;
    return sign | (uint8_t)encode_mag(fabsf(x), 1, 0, Q3_E2M1_MAX, 0x7);
}

float q3_e2m1_to_f32(uint8_t code) { return q3_e2m1_lut[code & 0xF]; }

uint8_t q3_int8_from_f32(float x) {
    if (isnan(x)) return 0;
    const float a = fabsf(x) * 64.0f; /* exact: a power-of-two scaling (no input is near FLT_MAX / 64 here) */
    const unsigned m = !(a < 127.0f) ? 127 : round_half_even(a);
    return (uint8_t)(signbit(x) ? (256 - m) & 0xFF : m);
}

float q3_int8_to_f32(uint8_t code) { return (float)(int8_t)code * 0x1p-6f; }

float q3_e8m0_to_f32(uint8_t code) {
    if (code == Q3_E8M0_NAN) return NAN;
    /* Code 0 is 2^-127, below the fp32 normals: build it as a subnormal. */
    return code ? ldexpf(1.0f, (int)code - 127) : 0x1p-127f;
}
