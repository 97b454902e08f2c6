/* q3_find_non_finite: the first NaN or infinity of an archive's tensors,
 * planted at known places in each dtype, with the largest finite values
 * and unaligned data around it that must not count. */
#include <stdint.h>
#include <stdlib.h>

#include "io/tensor_check.h"
#include "unit.h"

enum { ROWS = 3, COLS = 2800 }; /* 8400 elements: several 4096-element chunks and 256-blocks */

static uint8_t g_buf[1 << 16];

/* One tensor of dtype t at byte offset off of g_buf (odd: unaligned), every
 * element the largest finite value, negated on odd elements. */
static q3_st_tensor float_tensor(q3_dtype t, size_t off) {
    const size_t es = q3_dtype_size(t), n = (size_t)ROWS * COLS;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = t == Q3_F32 ? 0x7F7FFFFFu : t == Q3_F16 ? 0x7BFFu : 0x7F7Fu;
        if (i & 1) v |= t == Q3_F32 ? 0x80000000u : 0x8000u;
        memcpy(g_buf + off + i * es, &v, es); /* little-endian: the low bytes */
    }
    return (q3_st_tensor){.name = "w", .dtype = t, .ndim = 2, .shape = {ROWS, COLS}, .data = g_buf + off, .nbytes = n * es};
}

/* Element i of a float_tensor (its data lies in g_buf, so it may be written). */
static void put(const q3_st_tensor *t, size_t i, uint32_t v) {
    const size_t es = q3_dtype_size(t->dtype);
    memcpy(g_buf + ((const uint8_t *)t->data - g_buf) + i * es, &v, es);
}

static int find(q3_st_tensor *ts, int n, q3_bad_element *e) {
    q3_mapped_file f = {.path = "ck/model.safetensors"};
    q3_st_archive a = {.files = &f, .n_files = 1, .tensors = ts, .n_tensors = n};
    return q3_find_non_finite(&a, e);
}

static void test_float_dtypes(void) {
    const q3_dtype types[] = {Q3_F32, Q3_F16, Q3_BF16};
    /* per dtype: quiet NaN, a NaN with only the lowest mantissa bit, +inf, -inf */
    const uint32_t codes[3][4] = {{0x7FC00000u, 0xFF800001u, 0x7F800000u, 0xFF800000u},
                                  {0x7E00u, 0xFC01u, 0x7C00u, 0xFC00u},
                                  {0x7FC0u, 0xFF81u, 0x7F80u, 0xFF80u}};
    const char *what[4] = {"NaN", "NaN", "+infinity", "-infinity"};
    const size_t at[] = {0, 255, 256, 4095, 4096, 5000, (size_t)ROWS * COLS - 1};
    for (int ti = 0; ti < 3; ti++) {
        q3_st_tensor t = float_tensor(types[ti], 3);
        q3_bad_element e;
        CHECK_EQ_INT(find(&t, 1, &e), 0); /* the largest finite values are finite */
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++)
            for (int c = 0; c < 4; c++) {
                t = float_tensor(types[ti], 3);
                put(&t, at[k], codes[ti][c]);
                if (at[k] + 7 < (size_t)ROWS * COLS) put(&t, at[k] + 7, codes[ti][(c + 1) % 4]); /* a later one is not named */
                const int ok = find(&t, 1, &e) == 1 && e.index == at[k] && !strcmp(e.what, what[c]) && e.tensor == &t;
                if (!ok) fprintf(stderr, "dtype %d, element %zu, code %#x: not found where planted\n", ti, at[k], codes[ti][c]);
                CHECK(ok);
            }
    }
}

static void test_mx(void) {
    enum { R = 2, C = 64 };
    uint8_t el[R * C], sc[R * C / 32];
    for (int i = 0; i < R * C; i++) el[i] = i & 1 ? 0xFE : 0x7E; /* -448, 448 */
    memset(sc, 0xFE, sizeof sc);                                 /* the largest scale that is not NaN */
    q3_st_tensor t = {.name = "x", .dtype = Q3_MXFP8, .ndim = 2, .shape = {R, C}, .data = el, .nbytes = sizeof el, .scales = sc};
    q3_bad_element e;
    CHECK_EQ_INT(find(&t, 1, &e), 0);
    el[77] = 0xFF;
    CHECK(find(&t, 1, &e) == 1 && e.index == 77 && !strcmp(e.what, "NaN"));
    el[77] = 0x7F;
    CHECK(find(&t, 1, &e) == 1 && e.index == 77 && !strcmp(e.what, "NaN"));
    el[77] = 0x7E;
    sc[3] = 0xFF; /* row 1, block 1 */
    CHECK(find(&t, 1, &e) == 1 && e.index == 96 && !strcmp(e.what, "a NaN scale"));
    /* MXFP4: every byte is two finite elements; only a scale can be NaN */
    uint8_t el4[R * C / 2];
    memset(el4, 0xFF, sizeof el4);
    memset(sc, 0xFE, sizeof sc);
    q3_st_tensor t4 = {.name = "y", .dtype = Q3_MXFP4, .ndim = 2, .shape = {R, C}, .data = el4, .nbytes = sizeof el4, .scales = sc};
    CHECK_EQ_INT(find(&t4, 1, &e), 0);
    sc[2] = 0xFF;
    CHECK(find(&t4, 1, &e) == 1 && e.index == 64 && !strcmp(e.what, "a NaN scale"));
}

/* The first bad tensor in archive order is named, with its file and its
 * element as indices in every dimension. */
static void test_order_and_description(void) {
    uint16_t a[6] = {0}, b[24] = {0};
    b[1 * 12 + 2 * 4 + 3] = 0xFF80;
    a[5] = 0x7FC0;
    q3_st_tensor ts[2] = {
        {.name = "model.b", .dtype = Q3_BF16, .ndim = 3, .shape = {2, 3, 4}, .data = b, .nbytes = sizeof b},
        {.name = "model.a", .dtype = Q3_BF16, .ndim = 2, .shape = {2, 3}, .data = a, .nbytes = sizeof a},
    };
    q3_bad_element e;
    CHECK(find(ts, 2, &e) == 1 && e.tensor == &ts[0]);
    char s[256];
    q3_bad_element_describe(&e, s, sizeof s);
    CHECK_EQ_STR(s, "tensor model.b in ck/model.safetensors holds -infinity at [1, 2, 3]");
    b[1 * 12 + 2 * 4 + 3] = 0;
    CHECK(find(ts, 2, &e) == 1 && e.tensor == &ts[1]);
    q3_bad_element_describe(&e, s, sizeof s);
    CHECK_EQ_STR(s, "tensor model.a in ck/model.safetensors holds NaN at [1, 2]");
    char tiny[16];
    q3_bad_element_describe(&e, tiny, sizeof tiny); /* cut, terminated */
    CHECK_EQ_INT((int)strlen(tiny), 15);
}

int main(void) {
    test_float_dtypes();
    test_mx();
    test_order_and_description();
    UNIT_MAIN_END();
}
