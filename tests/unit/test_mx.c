/* MX formats (src/quant): element codecs against values computed here from
 * the bit fields with ldexp, hand-worked rounding and block cases, and
 * round-trip properties on random rows checked against a brute-force
 * nearest-value search. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/mx.h"
#include "unit.h"
#include "util/error.h"

/* ---- Independent decoders, straight from the field layouts ---- */

static double e4m3_ref(int c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

static double e2m1_ref(int c) {
    int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    double v = e == 0 ? ldexp(m, -1) : ldexp(2 + m, e - 2);
    return s ? -v : v;
}

static int same_value(double ref, float got) {
    if (isnan(ref)) return isnan(got);
    return (double)got == ref && !signbit(got) == !signbit(ref);
}

/* Code of the finite value nearest to v, ties to the even code (whose last
 * mantissa bit is 0); beyond the range the largest value is nearest, which is
 * saturation. The sign is taken from v so that zero keeps it. */
static int nearest_code(q3_mx_type t, double v) {
    if (t == Q3_MXINT8) { /* m / 64 for m in [-127, 127]; ties to the even m; zero has no sign */
        int best = 0;
        double best_d = INFINITY;
        for (int m = -127; m <= 127; m++) {
            double d = fabs(m / 64.0 - v);
            if (d < best_d || (d == best_d && !(m & 1))) best_d = d, best = m;
        }
        return best & 0xFF;
    }
    int ncodes = t == Q3_MXFP8 ? 127 : 8; /* non-negative finite codes */
    double a = fabs(v), best_d = INFINITY;
    int best = 0;
    for (int c = 0; c < ncodes; c++) {
        double d = fabs((t == Q3_MXFP8 ? e4m3_ref(c) : e2m1_ref(c)) - a);
        if (d < best_d || (d == best_d && !(c & 1))) best_d = d, best = c;
    }
    return signbit(v) ? best | (t == Q3_MXFP8 ? 0x80 : 0x8) : best;
}

/* ---- Element codecs ---- */

static void test_decode_all_codes(void) {
    int twice = 0; /* the SIMD decoders' int8 table of 2 * E2M1 */
    for (int c = 0; c < 16; c++) twice += (double)q3_e2m1_x2[c] != 2 * e2m1_ref(c);
    CHECK_EQ_INT(twice, 0);
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        double r = e4m3_ref(c);
        bad += !same_value(r, q3_e4m3_to_f32((uint8_t)c)) || !same_value(r, q3_e4m3_lut[c]);
    }
    CHECK_EQ_INT(bad, 0);
    bad = 0;
    for (int c = 0; c < 16; c++) {
        double r = e2m1_ref(c);
        bad += !same_value(r, q3_e2m1_to_f32((uint8_t)c)) || !same_value(r, q3_e2m1_lut[c]);
        bad += !same_value(r, q3_e2m1_to_f32((uint8_t)(c | 0xA0))); /* high nibble ignored */
    }
    CHECK_EQ_INT(bad, 0);
    /* Landmarks, spelled out. */
    CHECK(q3_e4m3_to_f32(0x7E) == 448.0f);
    CHECK(q3_e4m3_to_f32(0xFE) == -448.0f);
    CHECK(isnan(q3_e4m3_to_f32(0x7F)) && isnan(q3_e4m3_to_f32(0xFF)));
    CHECK(q3_e4m3_to_f32(0x01) == 0x1p-9f && q3_e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    CHECK(q3_e4m3_to_f32(0x08) == 0x1p-6f && q3_e4m3_to_f32(0x38) == 1.0f);
    CHECK(q3_e4m3_to_f32(0x80) == 0 && signbit(q3_e4m3_to_f32(0x80)));
    CHECK(q3_e2m1_to_f32(0x7) == 6.0f && q3_e2m1_to_f32(0x1) == 0.5f && q3_e2m1_to_f32(0xF) == -6.0f);
    CHECK(signbit(q3_e2m1_to_f32(0x8)));
}

static void test_e8m0(void) {
    int bad = 0;
    for (int c = 0; c < 255; c++) bad += q3_e8m0_to_f32((uint8_t)c) != (float)ldexp(1.0, c - 127);
    CHECK_EQ_INT(bad, 0);
    CHECK(q3_e8m0_to_f32(127) == 1.0f);
    CHECK(q3_e8m0_to_f32(0) > 0 && q3_e8m0_to_f32(0) * 0x1p127f == 1.0f);
    CHECK(isnan(q3_e8m0_to_f32(0xFF)));
}

static void test_encode_roundtrip_codes(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7F) != 0x7F) bad += q3_e4m3_from_f32(q3_e4m3_to_f32((uint8_t)c)) != c;
    for (int c = 0; c < 16; c++) bad += q3_e2m1_from_f32(q3_e2m1_to_f32((uint8_t)c)) != c;
    CHECK_EQ_INT(bad, 0);
}

static void test_e2m1_rounding(void) {
    static const struct { float in, out; } v[] = {
        {0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f}, {2.5f, 2.0f}, {3.5f, 4.0f},
        {5.0f, 4.0f},  {0.26f, 0.5f}, {0.24f, 0.0f}, {5.01f, 6.0f}, {6.9f, 6.0f}, {7.0f, 6.0f},
        {1e6f, 6.0f},  {FLT_MAX, 6.0f}, {INFINITY, 6.0f}, {0x1p-149f, 0.0f},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        CHECK(q3_e2m1_to_f32(q3_e2m1_from_f32(v[i].in)) == v[i].out);
        CHECK(q3_e2m1_to_f32(q3_e2m1_from_f32(-v[i].in)) == -v[i].out);
    }
    CHECK_EQ_INT(q3_e2m1_from_f32(-0.0f), 0x8);
    CHECK_EQ_INT(q3_e2m1_from_f32(-0.1f), 0x8); /* rounds to zero, sign kept */
    CHECK_EQ_INT(q3_e2m1_from_f32(-1e6f), 0xF);
}

static void test_e4m3_rounding(void) {
    static const struct { float in; int code; } v[] = {
        {1.0625f, 0x38},        /* midway 1 (m=0) and 1.125 (m=1): even */
        {1.1875f, 0x3A},        /* midway 1.125 and 1.25: up to m=2 */
        {1.0625001f, 0x39},     /* just past the midpoint */
        {1.9375f, 0x40},        /* midway 1.875 (m=7) and 2: carries into the next binade */
        {1.9374999f, 0x3F},
        {0.5f * 0x1p-9f, 0x00}, /* subnormal ties */
        {1.5f * 0x1p-9f, 0x02},
        {2.5f * 0x1p-9f, 0x02},
        {7.5f * 0x1p-9f, 0x08}, /* largest subnormal rounds up to the smallest normal */
        {0x1p-12f, 0x00},
        {0.51f * 0x1p-9f, 0x01},
        {432.0f, 0x7E}, /* midway 416 (m=5) and 448 (m=6) */
        {431.9f, 0x7D},
        {449.0f, 0x7E}, /* beyond the range: saturate, never NaN */
        {464.0f, 0x7E},
        {500.0f, 0x7E},
        {1e6f, 0x7E},
        {FLT_MAX, 0x7E},
        {INFINITY, 0x7E},
        {0x1p-149f, 0x00},
        {0.0f, 0x00},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        CHECK_EQ_INT(q3_e4m3_from_f32(v[i].in), v[i].code);
        CHECK_EQ_INT(q3_e4m3_from_f32(-v[i].in), v[i].code | 0x80);
    }
    CHECK_EQ_INT(q3_e4m3_from_f32(NAN) & 0x7F, 0x7F);
}

/* Encoders against the brute-force search, on random floats of all scales and
 * on every midpoint between neighbouring codes (and its float neighbours). */
static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_u64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static double unit_rand(void) { return (next_u64() >> 11) * 0x1p-53; }

static void test_encode_vs_search(void) {
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)ldexp(unit_rand() * 2 - 1, (int)(next_u64() % 40) - 20);
        bad += q3_e4m3_from_f32(x) != nearest_code(Q3_MXFP8, x);
        bad += q3_e2m1_from_f32(x) != nearest_code(Q3_MXFP4, x);
    }
    for (int c = 0; c < 126; c++) {
        float mid = (float)((e4m3_ref(c) + e4m3_ref(c + 1)) / 2);
        float around[3] = {nextafterf(mid, 0), mid, nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++) bad += q3_e4m3_from_f32(around[k]) != nearest_code(Q3_MXFP8, around[k]);
    }
    for (int c = 0; c < 7; c++) {
        float mid = (float)((e2m1_ref(c) + e2m1_ref(c + 1)) / 2);
        float around[3] = {nextafterf(mid, 0), mid, nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++) bad += q3_e2m1_from_f32(around[k]) != nearest_code(Q3_MXFP4, around[k]);
    }
    CHECK_EQ_INT(bad, 0);
}

/* ---- Blocks and rows ---- */

static void test_sizes(void) {
    CHECK_EQ_INT(q3_mx_scale_bytes(64), 2);
    CHECK_EQ_INT(q3_mx_elem_bytes(Q3_MXFP8, 64), 64);
    CHECK_EQ_INT(q3_mx_elem_bytes(Q3_MXFP4, 64), 32);
    CHECK_EQ_INT(q3_mx_row_bytes(Q3_MXFP8, 64), 66);
    CHECK_EQ_INT(q3_mx_row_bytes(Q3_MXFP4, 64), 34);
}

static uint8_t elem_code(q3_mx_type t, const uint8_t *elems, int i) {
    return t != Q3_MXFP4 ? elems[i] : (uint8_t)((elems[i / 2] >> (i % 2 * 4)) & 0xF);
}

/* Quantize one block whose only non-zero entries are given; check its scale
 * code and the codes of those entries. */
static void check_block(q3_mx_type t, int n_set, const float *vals, int scale, const int *codes) {
    float x[Q3_MX_BLOCK] = {0};
    uint8_t s = 0xAA, el[Q3_MX_BLOCK];
    for (int i = 0; i < n_set; i++) x[i] = vals[i];
    if (!CHECK(q3_mx_quantize_row(t, x, Q3_MX_BLOCK, &s, el) == 0)) return;
    CHECK_EQ_INT(s, scale);
    int bad = 0;
    for (int i = 0; i < Q3_MX_BLOCK; i++) bad += elem_code(t, el, i) != (i < n_set ? codes[i] : 0);
    CHECK_EQ_INT(bad, 0);
}

static void test_blocks(void) {
    /* All zero: scale 2^-127, zero elements. */
    check_block(Q3_MXFP8, 0, NULL, 0, NULL);
    check_block(Q3_MXFP4, 0, NULL, 0, NULL);

    /* Max exactly a power of two: 1.0 = 2^0, shared exponent 0 - 8 = -8 (code 119),
     * so 1.0 becomes 256 = 1.000 x 2^8 (field 15, code 0x78), and 0.5 -> 128 (0x70);
     * E2M1: exponent -2 (code 125), 1.0 -> 4 (0x6), 0.5 -> 2 (0x4). */
    check_block(Q3_MXFP8, 2, (float[]){1.0f, -0.5f}, 119, (int[]){0x78, 0xF0});
    check_block(Q3_MXFP4, 2, (float[]){1.0f, -0.5f}, 125, (int[]){0x6, 0xC});

    /* Max 3: floor(log2 3) = 1, exponent -1 for E2M1 (code 126): scaled values
     * 6, -1.4, 0.6, 2.5 -> 6, -1.5, 0.5, 2 (tie to even). For E4M3 the exponent
     * is -7 (code 120): 3 -> 384 = 1.5 x 2^8 (field 15, m 4: 0x7C),
     * -0.7 -> -89.6 -> -88 = -1.375 x 2^6 (0xEB), 0.3 -> 38.4 -> 40 =
     * 1.25 x 2^5 (0x62), 1.25 -> 160 = 1.25 x 2^7 (0x72). */
    check_block(Q3_MXFP4, 4, (float[]){3.0f, -0.7f, 0.3f, 1.25f}, 126, (int[]){0x7, 0xB, 0x1, 0x4});
    check_block(Q3_MXFP8, 4, (float[]){3.0f, -0.7f, 0.3f, 1.25f}, 120, (int[]){0x7C, 0xEB, 0x62, 0x72});

    /* Low clamp. Max 1.5 * 2^-130 (an fp32 subnormal): -130 - 8 = -138 -> -127
     * (code 0); elements are scaled by 2^127: 1.5 * 2^-3 = 0.1875 (0x24), and
     * 2^-140 -> 2^-13, under half the smallest subnormal -> 0. */
    check_block(Q3_MXFP8, 2, (float[]){1.5f * 0x1p-130f, 0x1p-140f}, 0, (int[]){0x24, 0x00});
    /* Max 2^-140: clamped too, and everything rounds to zero. */
    check_block(Q3_MXFP8, 1, (float[]){0x1p-140f}, 0, (int[]){0x00});
    check_block(Q3_MXFP4, 1, (float[]){0x1p-149f}, 0, (int[]){0x0});
    /* E2M1, max 1.5 * 2^-126: -126 - 2 = -128 -> -127, so the max becomes 3
     * (0x5), not 6 as it would unclamped. */
    check_block(Q3_MXFP4, 1, (float[]){1.5f * 0x1p-126f}, 0, (int[]){0x5});

    /* Top of fp32: max 1.5 * 2^127 -> exponent 125 (code 252): elements 6, -2. */
    check_block(Q3_MXFP4, 2, (float[]){1.5f * 0x1p127f, -0x1p126f}, 252, (int[]){0x7, 0xC});
    /* FLT_MAX = (2 - 2^-23) * 2^127: E4M3 exponent 119 (code 246), scaled
     * 511.99.. saturates to 448; E2M1 scaled 7.99.. saturates to 6. */
    check_block(Q3_MXFP8, 2, (float[]){FLT_MAX, -FLT_MAX}, 246, (int[]){0x7E, 0xFE});
    check_block(Q3_MXFP4, 2, (float[]){FLT_MAX, -FLT_MAX}, 252, (int[]){0x7, 0xF});
    /* Block max 1.9375 * 2^k scales to 496 / 7.75, which saturates. */
    check_block(Q3_MXFP8, 1, (float[]){1.9375f * 0x1p-20f}, 127 - 28, (int[]){0x7E});
    check_block(Q3_MXFP4, 1, (float[]){1.9375f * 0x1p40f}, 127 + 38, (int[]){0x7});

    /* Negative zero keeps its sign; a negative rounding to zero does too. */
    check_block(Q3_MXFP4, 3, (float[]){4.0f, -0.0f, -0.1f}, 127, (int[]){0x6, 0x8, 0x8});
}

/* MXINT8: elements m / 64 for int8 m; worked by hand. */
static void test_mxint8(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) bad += q3_int8_to_f32((uint8_t)c) != (float)ldexp(c < 128 ? c : c - 256, -6);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(q3_int8_from_f32(1.0f), 0x40);
    CHECK_EQ_INT(q3_int8_from_f32(-1.0f), 0xC0);
    CHECK_EQ_INT(q3_int8_from_f32(127.0f / 64), 0x7F);
    CHECK_EQ_INT(q3_int8_from_f32(1.999f), 0x7F);  /* 127.94 saturates */
    CHECK_EQ_INT(q3_int8_from_f32(-2.0f), 0x81);   /* symmetric: never 0x80 */
    CHECK_EQ_INT(q3_int8_from_f32(0.5f / 64), 0x00); /* ties to even */
    CHECK_EQ_INT(q3_int8_from_f32(1.5f / 64), 0x02);
    CHECK_EQ_INT(q3_int8_from_f32(2.5f / 64), 0x02);
    CHECK_EQ_INT(q3_int8_from_f32(-2.5f / 64), 0xFE);
    CHECK_EQ_INT(q3_int8_from_f32(nextafterf(2.5f / 64, 1.0f)), 0x03);
    CHECK_EQ_INT(q3_int8_from_f32(-0.0f), 0x00);
    CHECK_EQ_INT(q3_int8_from_f32(-1e-5f), 0x00);
    CHECK(!signbit(q3_int8_to_f32(0)));
    CHECK_EQ_INT(q3_mx_elem_bytes(Q3_MXINT8, 64), 64);
    CHECK_EQ_INT(q3_mx_row_bytes(Q3_MXINT8, 64), 66);

    check_block(Q3_MXINT8, 0, NULL, 0, NULL);
    /* Max 1.0: shared exponent 0 (code 127): 1.0 -> 64, -0.5 -> -32. */
    check_block(Q3_MXINT8, 2, (float[]){1.0f, -0.5f}, 127, (int[]){0x40, 0xE0});
    /* Max 3: exponent 1 (code 128), elements x / 2 * 64: 96, -22.4 -> -22,
     * 9.6 -> 10, 40. */
    check_block(Q3_MXINT8, 4, (float[]){3.0f, -0.7f, 0.3f, 1.25f}, 128, (int[]){0x60, 0xEA, 0x0A, 0x28});
    /* FLT_MAX: exponent 127 (code 254), 127.99 saturates to 127. */
    check_block(Q3_MXINT8, 2, (float[]){FLT_MAX, -FLT_MAX}, 254, (int[]){0x7F, 0x81});
    /* Low clamp: max 1.5 * 2^-130 -> exponent -127 (code 0): 1.5 * 2^-3 * 64 = 12. */
    check_block(Q3_MXINT8, 1, (float[]){1.5f * 0x1p-130f}, 0, (int[]){0x0C});
    /* Zeros of either sign and negatives rounding to zero: code 0. */
    check_block(Q3_MXINT8, 3, (float[]){1.0f, -0.0f, -0.001f}, 127, (int[]){0x40, 0x00, 0x00});
}

static void test_packing(void) {
    float x[32] = {0};
    uint8_t s, el[16];
    x[0] = 6, x[1] = -0.5f, x[2] = 1, x[31] = -6;
    CHECK(q3_mx_quantize_row(Q3_MXFP4, x, 32, &s, el) == 0);
    CHECK_EQ_INT(s, 127);
    CHECK_EQ_INT(el[0], 0x97); /* element 0 in the low nibble */
    CHECK_EQ_INT(el[1], 0x02);
    CHECK_EQ_INT(el[15], 0xF0);
}

static void test_errors(void) {
    float x[64] = {0};
    uint8_t s[2] = {0xAA, 0xAA}, el[64];
    memset(el, 0xAA, sizeof el);
    x[37] = NAN;
    q3_err_clear();
    CHECK(q3_mx_quantize_row(Q3_MXFP8, x, 64, s, el) == -1);
    CHECK(strstr(q3_errmsg(), "element 37") && strstr(q3_errmsg(), "NaN"));
    CHECK(s[0] == 0xAA && s[1] == 0xAA && el[0] == 0xAA); /* nothing written */
    x[37] = -INFINITY;
    CHECK(q3_mx_quantize_row(Q3_MXFP4, x, 64, s, el) == -1);
    CHECK(strstr(q3_errmsg(), "element 37") && strstr(q3_errmsg(), "infinity"));
    x[37] = 0;
    CHECK(q3_mx_fake_quant_row(Q3_MXFP8, x, 48, x) == -1);
    CHECK(strstr(q3_errmsg(), "48") && strstr(q3_errmsg(), "multiple of the block size 32"));
    CHECK(q3_mx_quantize_row(Q3_MXFP4, x, 33, s, el) == -1);
    CHECK(q3_mx_quantize_row(Q3_MXFP8, x, 0, s, el) == 0); /* an empty row is fine */
}

/* ---- Random rows: properties ---- */

enum { ROW = 256, ROWS = 400 };

/* Blocks of widely varying magnitude, with zeros, negative zeros, subnormals. */
static void random_row(float *x) {
    for (int b = 0; b < ROW / Q3_MX_BLOCK; b++) {
        int kind = (int)(next_u64() % 8), e0 = (int)(next_u64() % 290) - 160;
        for (int i = 0; i < Q3_MX_BLOCK; i++) {
            float *v = &x[b * Q3_MX_BLOCK + i];
            if (kind == 0) *v = (next_u64() & 1) ? -0.0f : 0.0f;
            else if (kind == 1 && i % 3) *v = 0;
            else *v = (float)ldexp(unit_rand() * 2 - 1, e0 - (kind == 2 ? (int)(next_u64() % 30) : 0));
            if (!isfinite(*v)) *v = 0; /* e0 near 127 with the mantissa rounded up */
        }
    }
}

static double ulp_at(q3_mx_type t, double a) {
    if (t == Q3_MXINT8) return 0x1p-6;
    int mbits = t == Q3_MXFP8 ? 3 : 1, emin = t == Q3_MXFP8 ? -6 : 0;
    int e = a > 0 ? ilogb(a) : emin;
    return ldexp(1.0, (e < emin ? emin : e) - mbits);
}

static void test_random_rows(q3_mx_type t) {
    float x[ROW], y[ROW], z[ROW];
    uint8_t s[ROW / 32], el[ROW], s2[ROW / 32], el2[ROW];
    size_t eb = q3_mx_elem_bytes(t, ROW);
    double maxv = t == Q3_MXFP8 ? 448 : t == Q3_MXFP4 ? 6 : 127.0 / 64;
    int fail_q = 0, idem = 0, err = 0, nearest = 0, fake = 0;
    for (int r = 0; r < ROWS; r++) {
        random_row(x);
        fail_q += q3_mx_quantize_row(t, x, ROW, s, el) != 0;
        q3_mx_dequantize_row(t, s, el, ROW, y);
        fail_q += q3_mx_quantize_row(t, y, ROW, s2, el2) != 0;
        idem += memcmp(s, s2, sizeof s) != 0 || memcmp(el, el2, eb) != 0;
        fail_q += q3_mx_fake_quant_row(t, x, ROW, z) != 0;
        fake += memcmp(y, z, sizeof y) != 0;
        memcpy(z, x, sizeof z); /* in place */
        fail_q += q3_mx_fake_quant_row(t, z, ROW, z) != 0;
        fake += memcmp(y, z, sizeof y) != 0;
        for (int i = 0; i < ROW; i++) {
            int e = s[i / 32] - 127;
            double v = ldexp(x[i], -e), q = ldexp(y[i], -e);
            if (fabs(v) > maxv) err += q != copysign(maxv, v);
            else if (t == Q3_MXINT8 && q == 0) err += signbit(y[i]) != 0; /* integers have no -0 */
            else err += fabs(v - q) > ulp_at(t, fabs(v)) / 2;
            nearest += elem_code(t, el, i) != nearest_code(t, v);
        }
    }
    CHECK_EQ_INT(fail_q, 0);
    CHECK_EQ_INT(idem, 0);
    CHECK_EQ_INT(err, 0);
    CHECK_EQ_INT(nearest, 0);
    CHECK_EQ_INT(fake, 0);
}

/* Rows built from codes, with each block's largest magnitude in the top binade
 * so the shared exponent is the one chosen: quantizing gives the codes back. */
static void test_representable_exact(q3_mx_type t) {
    float x[ROW];
    uint8_t want_s[ROW / 32], want[ROW], s[ROW / 32], el[ROW];
    int bad = 0;
    for (int r = 0; r < ROWS; r++) {
        for (int b = 0; b < ROW / 32; b++) {
            want_s[b] = (uint8_t)(1 + next_u64() % 240); /* keeps every value a finite fp32 */
            for (int i = 0; i < 32; i++) {
                int c = t == Q3_MXFP8 ? (int)(next_u64() % 256) : (int)(next_u64() % 16);
                if (i == 0) c = t == Q3_MXFP8 ? 0x78 | (c & 0x87) : 0x6 | (c & 0x9); /* top binade */
                if (t == Q3_MXFP8 && (c & 0x7F) == 0x7F) c ^= 1; /* not NaN */
                want[b * 32 + i] = (uint8_t)c;
                float ev = t == Q3_MXFP8 ? q3_e4m3_lut[c] : q3_e2m1_lut[c];
                x[b * 32 + i] = (float)ldexp(ev, want_s[b] - 127);
            }
        }
        bad += q3_mx_quantize_row(t, x, ROW, s, el) != 0 || memcmp(s, want_s, sizeof s) != 0;
        for (int i = 0; i < ROW; i++) bad += elem_code(t, el, i) != want[i];
    }
    CHECK_EQ_INT(bad, 0);
}

int main(void) {
    test_decode_all_codes();
    test_e8m0();
    test_encode_roundtrip_codes();
    test_e2m1_rounding();
    test_e4m3_rounding();
    test_encode_vs_search();
    test_sizes();
    test_blocks();
    test_packing();
    test_errors();
    test_random_rows(Q3_MXFP8);
    test_random_rows(Q3_MXFP4);
    test_random_rows(Q3_MXINT8);
    test_mxint8();
    test_representable_exact(Q3_MXFP8);
    test_representable_exact(Q3_MXFP4);
    UNIT_MAIN_END();
}
