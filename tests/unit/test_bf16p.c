/* BF16P (src/quant/bf16p.h): the layout against hand-computed bytes, every
 * BF16 value back bit for bit through packing, and each ISA's BF16P GEMV
 * and row unpack against the same ISA's BF16 GEMV on the unpacked rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "quant/bf16p.h"
#include "unit.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
/* About normal with standard deviation sd, as BF16 (a sum of uniforms). */
static uint16_t normal_bf16(float sd) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)next32() / 4294967296.0f - 0.5f;
    return q3_f32_to_bf16(s * 1.7320508f * sd);
}

static int roundtrip(const uint16_t *src, size_t cols, size_t *raw_out) {
    const size_t groups = cols / 64;
    uint8_t *row = malloc(q3_bf16p_row_bytes(cols)), *side = malloc(groups * Q3_BF16P_RAW_BYTES);
    const size_t raw = q3_bf16p_pack_row(src, cols, row, side, 0);
    int bad = raw != q3_bf16p_count_row(src, cols);
    uint16_t g[64];
    for (size_t i = 0; i < groups; i++) {
        q3_bf16p_unpack_group(row + i * Q3_BF16P_GROUP_BYTES, side, raw, g);
        bad += memcmp(g, src + 64 * i, sizeof g) != 0;
    }
    free(row);
    free(side);
    if (raw_out) *raw_out = raw;
    return bad;
}

/* The documented layout, by hand: block A's largest value 1.0 (exponent
 * 127, so offset 112: code = exponent - 112), block B all 0.5 but element
 * 63 = -0.75 (exponent 126, offset 111). */
static void test_layout(void) {
    uint16_t v[64];
    for (int i = 0; i < 32; i++) v[i] = 0x3F00; /* 0.5: exponent 126, code 14 */
    v[0] = 0x3F80;                              /* 1.0: exponent 127, code 15 */
    v[5] = 0x3E20;                              /* 0.15625: exponent 124, mantissa 0x20, code 12 */
    for (int i = 32; i < 64; i++) v[i] = 0x3F00;
    v[63] = 0xBF40; /* -0.75: sign, exponent 126, mantissa 0x40 */
    uint8_t g[Q3_BF16P_GROUP_BYTES];
    CHECK_EQ_INT((long long)q3_bf16p_pack_row(v, 64, g, NULL, 0), 0);
    CHECK_EQ_INT(g[0] | g[1] << 8, 112 << 7);
    CHECK_EQ_INT(g[2] | g[3] << 8, 111 << 7);
    /* Element 0 is U0 word 0, from L byte 0; element 5 is U0 word 10, and
     * U0 word w comes from byte 16 (w / 8) + w % 8 = 18. */
    CHECK_EQ_INT(q3_bf16p_elem_of(0), 0);
    CHECK_EQ_INT(q3_bf16p_elem_of(18), 5);
    CHECK_EQ_INT(g[4 + 0], 0x80 | 0x00);       /* code 15: bit 0 set; mantissa 0 */
    CHECK_EQ_INT(g[4 + 18], 0x00 | 0x20);      /* code 12: bit 0 clear; mantissa 0x20 */
    CHECK_EQ_INT(g[68 + 0] & 15, 7);           /* sign 0, code 15 >> 1 */
    CHECK_EQ_INT(g[68 + 18] & 15, 6);          /* code 12 >> 1 */
    /* Element 63 is U1 word 31 (odd: 48 + 15): byte 16 * 3 + 8 + 7 = 63,
     * its nibble the high one of N byte 31. Code 126 - 111 = 15. */
    CHECK_EQ_INT(q3_bf16p_elem_of(63), 63);
    CHECK_EQ_INT(g[4 + 63], 0x80 | 0x40);
    CHECK_EQ_INT(g[68 + 31] >> 4, 8 | 7);
    int seen[64] = {0}, dup = 0;
    for (int p = 0; p < 64; p++) dup += seen[q3_bf16p_elem_of(p)]++ != 0;
    for (int i = 0; i < 64; i++) dup += seen[q3_bf16p_raw_elem(i)]-- != 1;
    CHECK_EQ_INT(dup, 0);
}

/* Every BF16 code (64 consecutive codes per group: NaNs, infinities,
 * subnormals and zeros of both signs included), then shuffled. */
static void test_all_codes(void) {
    uint16_t *v = malloc(65536 * sizeof *v);
    for (uint32_t i = 0; i < 65536; i++) v[i] = (uint16_t)i;
    CHECK_EQ_INT(roundtrip(v, 65536, NULL), 0);
    for (uint32_t i = 65535; i > 0; i--) {
        uint32_t j = next32() % (i + 1);
        uint16_t t = v[i];
        v[i] = v[j], v[j] = t;
    }
    size_t raw;
    CHECK_EQ_INT(roundtrip(v, 65536, &raw), 0);
    CHECK(raw > 0); /* values of every size side by side do not fit the window */
    free(v);
}

/* Weight-like rows: most groups packed, a few raw, zeros and subnormals. */
static void test_weight_rows(void) {
    enum { COLS = 4096 };
    uint16_t v[COLS];
    size_t raw_total = 0;
    int bad = 0;
    for (int r = 0; r < 64; r++) {
        for (int i = 0; i < COLS; i++) v[i] = normal_bf16(0.02f);
        if (r % 8 == 1) v[next32() % COLS] = 0x0000;              /* a zero: its group goes raw */
        if (r % 8 == 2) v[next32() % COLS] = 0x8001;              /* a negative subnormal */
        if (r % 8 == 3) memset(v + 64 * (r % 64), 0, 64 * 2);     /* an all-zero group fits (offset 0) */
        size_t raw;
        bad += roundtrip(v, COLS, &raw);
        raw_total += raw;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(raw_total > 0 && raw_total < 64 * COLS / 64 / 20);
}

/* A row's GEMV by each table: the BF16P matrix against the same table's
 * BF16 GEMV on the unpacked matrix, bit for bit. */
static void test_gemv(void) {
    enum { ROWS = 37, COLS = 1024 };
    const size_t rb = q3_bf16p_row_bytes(COLS);
    uint16_t *v = malloc((size_t)ROWS * COLS * 2), *back = malloc((size_t)ROWS * COLS * 2);
    uint8_t *p = malloc(ROWS * rb), *side = malloc((size_t)ROWS * COLS / 64 * Q3_BF16P_RAW_BYTES);
    float x[COLS], a[ROWS], b[ROWS];
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++) v[i] = normal_bf16(0.05f);
    for (int r = 0; r < ROWS; r += 5) v[(size_t)r * COLS + next32() % COLS] = 0; /* raw groups */
    for (int k = 0; k < COLS; k++) x[k] = (float)(int)(next32() % 2001 - 1000) / 512.0f;
    size_t raw = 0;
    for (int r = 0; r < ROWS; r++) raw += q3_bf16p_pack_row(v + (size_t)r * COLS, COLS, p + r * rb, side, raw);
    CHECK(raw >= ROWS / 5);
    const q3_mat wp = {.data = p, .dtype = Q3_BF16P, .rows = ROWS, .cols = COLS, .scales = side, .side_groups = raw};
    const q3_mat wb = {.data = v, .dtype = Q3_BF16, .rows = ROWS, .cols = COLS};
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        const q3_isa_kernels *k = q3_isa_current();
        k->gemv(a, x, &wp, 3, ROWS);
        k->gemv(b, x, &wb, 3, ROWS);
        CHECK(memcmp(a, b, (ROWS - 3) * sizeof *a) == 0);
        /* q3_matmul on several tokens: rows unpacked for the BF16 kernels
         * (2), the broadcast GEMMs widening packed rows (40, 150: passes) */
        static float xt[150 * COLS], y[150 * ROWS], z[150 * ROWS];
        for (int i = 0; i < 150 * COLS; i++) xt[i] = x[i % COLS] * (float)(1 + i / COLS % 7);
        static const int tokens[] = {2, 40, 150};
        for (int i = 0; i < 3; i++) {
            q3_matmul(y, xt, tokens[i], &wp);
            q3_matmul(z, xt, tokens[i], &wb);
            CHECK(memcmp(y, z, (size_t)tokens[i] * ROWS * sizeof *y) == 0);
        }
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
    /* the AVX2 and AVX-512 tables' GEMVs with software prefetch (one row at
     * a time) and without (rows paired; 37 rows leave one over) */
    q3_isa_kernels sw, hw;
    for (int t = 0; t < 2 && q3_gemv_prefetch_variants(t, &sw, &hw); t++) {
        const q3_isa_kernels *k2[2] = {&sw, &hw};
        for (int v = 0; v < 2; v++)
            for (int r0 = 0; r0 < 4; r0 += 3) {
                for (int r = 0; r < ROWS; r++) a[r] = b[r] = NAN;
                k2[v]->gemv(a, x, &wp, r0, ROWS);
                sw.gemv(b, x, &wb, r0, ROWS);
                CHECK(memcmp(a, b, (size_t)(ROWS - r0) * sizeof *a) == 0);
            }
    }
    /* rows unpacked whole, and pieces of rows */
    if (q3_kernels_isa() >= Q3_ISA_AVX2) {
        q3_bf16p_unpack_rows_avx2(back, COLS, &wp, 0, ROWS);
        CHECK(memcmp(back, v, (size_t)ROWS * COLS * 2) == 0);
    }
    float f[128];
    q3_mat_row_f32(&wp, 7, 33, 100, f);
    int bad = 0;
    for (int k = 0; k < 100; k++) bad += f[k] != q3_bf16_to_f32(v[7 * COLS + 33 + k]);
    CHECK_EQ_INT(bad, 0);
    if (q3_kernels_isa() >= Q3_ISA_AVX2) /* the broadcast GEMMs' widening: row 0 has a raw group */
        for (int r = 0; r < 2; r++)
            for (int k0 = 0; k0 < COLS; k0 += 128) {
                q3_bf16p_row_f32(&wp, r, k0, 128, f);
                for (int k = 0; k < 128; k++) bad += f[k] != q3_bf16_to_f32(v[r * COLS + k0 + k]);
            }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT((long long)q3_mat_bytes(&wp), (long long)(ROWS * rb));
    /* a raw group's index past the side table (a damaged file): NaN, no read past it */
    const q3_mat short_side = {.data = p, .dtype = Q3_BF16P, .rows = ROWS, .cols = COLS, .scales = side, .side_groups = 0};
    q3_isa_current()->gemv(a, x, &short_side, 0, 1);
    CHECK(isnan(a[0]));
    free(v);
    free(back);
    free(p);
    free(side);
}

int main(void) {
    test_layout();
    test_all_codes();
    test_weight_rows();
    test_gemv();
    UNIT_MAIN_END();
}
