#include "io/tensor_check.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Index of the first element whose exponent bits (mask) are all ones, or
 * n. Blocks of 256 are tested branch-free so the scan runs at memory speed;
 * only a block that holds one is searched element by element. */
#define FIRST_ALL_ONES(NAME, T)                                                \
    static size_t NAME(const T *x, size_t n, T mask) {                         \
        size_t i = 0;                                                          \
        for (; i + 256 <= n; i += 256) {                                       \
            int any = 0;                                                       \
            for (size_t j = 0; j < 256; j++) any |= (x[i + j] & mask) == mask; \
            if (any) break;                                                    \
        }                                                                      \
        for (; i < n; i++)                                                     \
            if ((x[i] & mask) == mask) return i;                               \
        return n;                                                              \
    }
FIRST_ALL_ONES(first_ones16, uint16_t)
FIRST_ALL_ONES(first_ones32, uint32_t)
#undef FIRST_ALL_ONES

static const char *kind(int nan, int negative) { return nan ? "NaN" : negative ? "-infinity" : "+infinity"; }

/* Float elements: safetensors data need not be aligned to the element
 * size, hence the copies into an aligned chunk. */
static size_t first_bad_float(const q3_st_tensor *t, const char **what) {
    const uint8_t *p = t->data;
    const size_t es = q3_dtype_size(t->dtype), n = t->nbytes / es;
    enum { CHUNK = 4096 };
    union {
        uint16_t h[CHUNK];
        uint32_t w[CHUNK];
    } buf;
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        const size_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        memcpy(&buf, p + i0 * es, m * es);
        if (t->dtype == Q3_F32) {
            const size_t k = first_ones32(buf.w, m, 0x7F800000u);
            if (k < m) return *what = kind((buf.w[k] & 0x7FFFFFu) != 0, buf.w[k] >> 31), i0 + k;
        } else {
            const uint16_t exp = t->dtype == Q3_F16 ? 0x7C00 : 0x7F80, man = (uint16_t)(0x7FFF & ~exp);
            const size_t k = first_ones16(buf.h, m, exp);
            if (k < m) return *what = kind((buf.h[k] & man) != 0, buf.h[k] >> 15), i0 + k;
        }
    }
    return SIZE_MAX;
}

/* MX: an E8M0 scale of 0xFF is NaN (the block's first element is named),
 * and so is the E4M3 code S.1111.111. */
static size_t first_bad_mx(const q3_st_tensor *t, const char **what) {
    const uint8_t *p = t->data;
    if (t->ndim < 1 || !t->scales || t->shape[t->ndim - 1] < 32) return SIZE_MAX; /* not a loaded MX matrix */
    const size_t cols = (size_t)t->shape[t->ndim - 1], nblk = t->nbytes / (t->dtype == Q3_MXFP4 ? cols / 2 : cols) * (cols / 32);
    for (size_t b = 0; b < nblk; b++)
        if (t->scales[b] == 0xFF) return *what = "a NaN scale", b * 32;
    if (t->dtype == Q3_MXFP8)
        for (size_t i = 0; i < t->nbytes; i++)
            if ((p[i] & 0x7F) == 0x7F) return *what = "NaN", i;
    return SIZE_MAX;
}

int q3_find_non_finite(const q3_st_archive *a, q3_bad_element *out) {
    for (int ti = 0; ti < a->n_tensors; ti++) {
        const q3_st_tensor *t = &a->tensors[ti];
        const char *what = NULL;
        const size_t i = q3_dtype_is_mx(t->dtype) ? first_bad_mx(t, &what) : first_bad_float(t, &what);
        if (i != SIZE_MAX) {
            *out = (q3_bad_element){t, a->files[t->file].path, i, what};
            return 1;
        }
    }
    return 0;
}

void q3_bad_element_describe(const q3_bad_element *e, char *buf, size_t n) {
    const q3_st_tensor *t = e->tensor;
    size_t idx[Q3_MAX_DIMS] = {0}, rest = e->index;
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = rest % (size_t)t->shape[d];
        rest /= (size_t)t->shape[d];
    }
    int w = snprintf(buf, n, "tensor %s in %s holds %s at [", t->name, e->file, e->what);
    for (int d = 0; d < t->ndim && w >= 0 && (size_t)w < n; d++) w += snprintf(buf + w, n - (size_t)w, "%s%zu", d ? ", " : "", idx[d]);
    if (w >= 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, "]");
}
