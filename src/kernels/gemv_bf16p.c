/* The BF16P GEMVs (src/quant/bf16p.h): each 64-element group decoded in
 * registers to the BF16 words the BF16 GEMV of the same ISA would load, and
 * summed into the same accumulators in the same order, so a row's result
 * is that GEMV's bit for bit (tests/unit/test_bf16p.c checks it).
 *
 * Decoding a group: the nibbles (sign, code bits 1-3) go through a 16-byte
 * lookup (PSHUFB) to the high byte of each word, which byte unpacks join
 * to the L bytes (code bit 0, mantissa); one 16-bit add of the header then
 * puts each block's exponent offset in place (even words block A, odd
 * words block B), and a shift or a mask widens the even or the odd words
 * to fp32. On the AMX Xeon of BENCHMARKS.md (section "BF16P") a 1 GiB
 * matrix from DRAM, 2 threads, streamed 1.1-1.45x the BF16 GEMV's rate of
 * BF16 weights in most runs; in whole decode steps the AVX-512 GEMV gave
 * 1.15-1.33x, the AVX2 one (more instructions than BF16's per weight,
 * bound by its vector ports there) about 1x. On the Zen 4 (section
 * "llama.cpp on a Zen 4"), without software prefetch, both streamed their
 * packed bytes at the plain read (35 GB/s), 1.3x BF16's rate of BF16
 * weights; with it, 0.73-0.85x of that. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/prefetch.h"
#include "quant/bf16p.h"

#define INLINE static inline __attribute__((always_inline))

/* High byte of a word by nibble: sign to bit 7, code bits 1-3 to bits 0-2. */
#define NIB_HI(n) (char)((((n) & 8) << 4) | ((n) & 7))
#define NIB_TABLE                                                                                                      \
    NIB_HI(0), NIB_HI(1), NIB_HI(2), NIB_HI(3), NIB_HI(4), NIB_HI(5), NIB_HI(6), NIB_HI(7), NIB_HI(8), NIB_HI(9),      \
        NIB_HI(10), NIB_HI(11), NIB_HI(12), NIB_HI(13), NIB_HI(14), NIB_HI(15)

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_bw;
static void probe_bw(void) {
    __builtin_cpu_init();
    g_bw = __builtin_cpu_supports("avx512bw");
}
int q3_cpu_avx512bw(void) {
    pthread_once(&g_once, probe_bw);
    return g_bw;
}

INLINE int is_raw(const uint8_t *g) { return g[1] & 0x80; }

/* The raw group a header names, or NULL past the side table (a damaged
 * file: the row's result is then NaN). */
INLINE const uint16_t *raw_group(const uint8_t *g, const q3_mat *W) {
    const uint32_t h = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16 | (uint32_t)g[3] << 24;
    const size_t idx = (h & 0x7FFF) | (size_t)(h >> 16) << 15;
    return idx < W->side_groups ? (const uint16_t *)(W->scales + idx * Q3_BF16P_RAW_BYTES) : NULL;
}

__attribute__((target("avx2,fma"))) INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* AVX2: packed group g as four vectors of 16 words, u[0..3] = U0 words
 * 0-15 / 16-31 and U1 words 0-15 / 16-31 (bf16p.h). Their even words are
 * elements 0-7, 8-15, 16-23, 24-31 and the odd words 32-39, 40-47, 48-55,
 * 56-63. tab: NIB_TABLE in both lanes. */
__attribute__((target("avx2,fma"))) INLINE void group_words_avx2(const uint8_t *g, __m256i tab, __m256i u[4]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    int32_t hv;
    memcpy(&hv, g, 4);
    const __m256i h = _mm256_set1_epi32(hv);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)(g + 4)), l1 = _mm256_loadu_si256((const __m256i *)(g + 36));
    __m256i n = _mm256_loadu_si256((const __m256i *)(g + 68));
    /* each loaded once (GCC folded them into two instructions each: a
     * second load, from L2 where the prefetch put the lines) */
    Q3_IN_REGISTER(l0);
    Q3_IN_REGISTER(l1);
    Q3_IN_REGISTER(n);
    const __m256i t0 = _mm256_shuffle_epi8(tab, _mm256_and_si256(n, lo4));
    const __m256i t1 = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(n, 4), lo4));
    u[0] = _mm256_add_epi16(_mm256_unpacklo_epi8(l0, t0), h);
    u[1] = _mm256_add_epi16(_mm256_unpacklo_epi8(l1, t1), h);
    u[2] = _mm256_add_epi16(_mm256_unpackhi_epi8(l0, t0), h);
    u[3] = _mm256_add_epi16(_mm256_unpackhi_epi8(l1, t1), h);
}

/* The body of a BF16P GEMV (out, x, W, r0, r1, pf as the functions below
 * take them) for vectors V (zeroed by ZERO), a group summed into a
 * row's four accumulators by GROUP_FMA(g, x, W, tab, acc) and the row's
 * result by SUM4(acc). With pf (software prefetch pf bytes ahead) one row
 * at a time, one weight stream; without (pf 0) the two halves of each span
 * of Q3_GEMV_PAIR_SPAN rows side by side, row i with row half + i, for the
 * hardware prefetchers, as the BF16 GEMVs of isa_avx2.c and isa_avx512.c
 * (whose comments give the Zen 4 figures). Each row's sum is the one-row
 * loop's either way. */
#define BF16P_GEMV(V, ZERO, GROUP_FMA, SUM4, tab)                                                                      \
    do {                                                                                                               \
        const int K = W->cols;                                                                                         \
        const size_t rb = q3_bf16p_row_bytes((size_t)K), step = Q3_BF16P_GROUP_BYTES;                                  \
        const uint8_t *d = W->data;                                                                                    \
        int r = r0;                                                                                                    \
        for (int c0 = r0; !pf && r1 - c0 >= 2; c0 = r) {                                                               \
            const int half = q3_pair_half(c0, r1);                                                                     \
            for (; r < c0 + half; r++) {                                                                               \
                const uint8_t *ga = d + (size_t)r * rb, *gb = d + (size_t)(r + half) * rb;                             \
                V a[4] = {ZERO, ZERO, ZERO, ZERO}, b[4] = {ZERO, ZERO, ZERO, ZERO};                                    \
                for (int k = 0; k < K; k += 64, ga += step, gb += step) {                                              \
                    GROUP_FMA(ga, x + k, W, tab, a);                                                                   \
                    GROUP_FMA(gb, x + k, W, tab, b);                                                                   \
                }                                                                                                      \
                out[r - r0] = SUM4(a), out[r + half - r0] = SUM4(b);                                                   \
            }                                                                                                          \
            r = c0 + 2 * half;                                                                                         \
        }                                                                                                              \
        for (; r < r1; r++) {                                                                                          \
            const uint8_t *g = d + (size_t)r * rb;                                                                     \
            V a[4] = {ZERO, ZERO, ZERO, ZERO};                                                                         \
            for (int k = 0; k < K; k += 64, g += step) {                                                               \
                if (pf) q3_pf_lines(g, pf, 128);                                                                       \
                GROUP_FMA(g, x + k, W, tab, a);                                                                        \
            }                                                                                                          \
            out[r - r0] = SUM4(a);                                                                                     \
        }                                                                                                              \
    } while (0)

/* The AVX2 BF16 GEMV sums elements 8i .. 8i+7 into accumulator i in its
 * step at k and elements 32 + 8i .. in its step at k + 32: u[i]'s even,
 * then its odd words. A raw group past the side table makes the row NaN. */
__attribute__((target("avx2,fma"))) INLINE void group_fma_avx2(const uint8_t *g, const float *x, const q3_mat *W,
                                                              __m256i tab, __m256 a[4]) {
    const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256i u[4];
    if (__builtin_expect(is_raw(g), 0)) {
        const uint16_t *raw = raw_group(g, W);
        if (!raw) {
            a[0] = _mm256_set1_ps(__builtin_nanf(""));
            return;
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) u[i] = _mm256_loadu_si256((const __m256i *)(raw + 16 * i));
    } else {
        group_words_avx2(g, tab, u);
    }
#define EVEN(u) _mm256_castsi256_ps(_mm256_slli_epi32(u, 16))
#define ODD(u) _mm256_castsi256_ps(_mm256_and_si256(u, hi16))
    a[0] = _mm256_fmadd_ps(EVEN(u[0]), _mm256_loadu_ps(x), a[0]);
    a[1] = _mm256_fmadd_ps(EVEN(u[1]), _mm256_loadu_ps(x + 8), a[1]);
    a[2] = _mm256_fmadd_ps(EVEN(u[2]), _mm256_loadu_ps(x + 16), a[2]);
    a[3] = _mm256_fmadd_ps(EVEN(u[3]), _mm256_loadu_ps(x + 24), a[3]);
    a[0] = _mm256_fmadd_ps(ODD(u[0]), _mm256_loadu_ps(x + 32), a[0]);
    a[1] = _mm256_fmadd_ps(ODD(u[1]), _mm256_loadu_ps(x + 40), a[1]);
    a[2] = _mm256_fmadd_ps(ODD(u[2]), _mm256_loadu_ps(x + 48), a[2]);
    a[3] = _mm256_fmadd_ps(ODD(u[3]), _mm256_loadu_ps(x + 56), a[3]);
#undef EVEN
#undef ODD
}

__attribute__((target("avx2,fma"))) INLINE float sum4_avx2(const __m256 a[4]) {
    return hsum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
}

__attribute__((target("avx2,fma"))) void q3_gemv_bf16p_avx2(float *out, const float *x, const q3_mat *W, int r0, int r1,
                                                            size_t pf) {
    const __m256i tab = _mm256_setr_epi8(NIB_TABLE, NIB_TABLE);
    BF16P_GEMV(__m256, _mm256_setzero_ps(), group_fma_avx2, sum4_avx2, tab);
}

/* AVX-512 (BW): packed group g as U0 and U1 (bf16p.h), 32 words each. */
__attribute__((target("avx512f,avx512bw,avx2,fma"))) INLINE void group_words_avx512(const uint8_t *g, __m512i tab, __m512i lo4,
                                                                                    __m512i shifts, __m512i *u0, __m512i *u1) {
    int32_t hv;
    memcpy(&hv, g, 4);
    const __m512i h = _mm512_set1_epi32(hv);
    __m512i l = _mm512_loadu_si512(g + 4);
    Q3_IN_REGISTER(l);
    const __m512i n = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(g + 68)));
    const __m512i t = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srlv_epi16(n, shifts), lo4));
    *u0 = _mm512_add_epi16(_mm512_unpacklo_epi8(l, t), h);
    *u1 = _mm512_add_epi16(_mm512_unpackhi_epi8(l, t), h);
}

/* The group into the AVX-512 BF16 GEMV's accumulators 0-3: even words of
 * U0 / U1 are elements 0-15 / 16-31, odd words 32-47 / 48-63. The 32
 * nibble bytes are read into both halves of a vector and shifted by 0 or
 * 4 per half. */
__attribute__((target("avx512f,avx512bw,avx2,fma"))) INLINE void group_fma_avx512(const uint8_t *g, const float *x,
                                                                                  const q3_mat *W, __m512i tab, __m512 a[4]) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F), hi16 = _mm512_set1_epi32((int)0xFFFF0000u),
                  shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i u0, u1;
    if (__builtin_expect(is_raw(g), 0)) {
        const uint16_t *raw = raw_group(g, W);
        if (!raw) {
            a[0] = _mm512_set1_ps(__builtin_nanf(""));
            return;
        }
        u0 = _mm512_loadu_si512(raw), u1 = _mm512_loadu_si512(raw + 32);
    } else {
        group_words_avx512(g, tab, lo4, shifts, &u0, &u1);
    }
    a[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(u0, 16)), _mm512_loadu_ps(x), a[0]);
    a[1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(u1, 16)), _mm512_loadu_ps(x + 16), a[1]);
    a[2] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(u0, hi16)), _mm512_loadu_ps(x + 32), a[2]);
    a[3] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(u1, hi16)), _mm512_loadu_ps(x + 48), a[3]);
}

__attribute__((target("avx512f,avx512bw,avx2,fma"))) INLINE float sum4_avx512(const __m512 a[4]) {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

__attribute__((target("avx512f,avx512bw,avx2,fma"))) void q3_gemv_bf16p_avx512(float *out, const float *x, const q3_mat *W,
                                                                              int r0, int r1, size_t pf) {
    const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(NIB_TABLE));
    BF16P_GEMV(__m512, _mm512_setzero_ps(), group_fma_avx512, sum4_avx512, tab);
}

/* ---- whole rows back to BF16 (prefill runs the BF16 kernels on them) ---- */

__attribute__((target("avx2,fma"))) void q3_bf16p_unpack_rows_avx2(uint16_t *dst, size_t ds, const q3_mat *W, int r0, int n) {
    const int K = W->cols;
    const size_t rb = q3_bf16p_row_bytes((size_t)K);
    const __m256i tab = _mm256_setr_epi8(NIB_TABLE, NIB_TABLE);
    /* even words of a U vector (elements) then its odd words, each in order */
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2,
                                           3, 6, 7, 10, 11, 14, 15);
    for (int r = 0; r < n; r++) {
        const uint8_t *g = (const uint8_t *)W->data + (size_t)(r0 + r) * rb;
        uint16_t *d = dst + (size_t)r * ds;
        for (int k = 0; k < K; k += 64, g += Q3_BF16P_GROUP_BYTES, d += 64) {
            q3_pf_lines(g, Q3_PF_WEIGHTS, 128);
            if (is_raw(g)) {
                q3_bf16p_unpack_group(g, W->scales, W->side_groups, d);
                continue;
            }
            __m256i u[4];
            group_words_avx2(g, tab, u);
            for (int i = 0; i < 4; i++) { /* u[i]'s even words are elements 8i .. 8i+7, its odd ones 32 + 8i .. */
                const __m256i w = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(u[i], split), 0xD8);
                _mm_storeu_si128((__m128i *)(d + 8 * i), _mm256_castsi256_si128(w));
                _mm_storeu_si128((__m128i *)(d + 32 + 8 * i), _mm256_extracti128_si256(w, 1));
            }
        }
    }
}

/* ---- rows widened to fp32 (the broadcast GEMMs of AVX2 and AVX-512) ---- */

/* A raw group (stored in the side table) as 64 floats. */
static void raw_group_f32(const uint8_t *g, const q3_mat *W, float *dst) {
    uint16_t w[64];
    q3_bf16p_unpack_group(g, W->scales, W->side_groups, w);
    for (int i = 0; i < 64; i++) dst[i] = q3_bf16_to_f32(w[i]);
}

__attribute__((target("avx2,fma"))) static void row_f32_avx2(const q3_mat *W, int r, int k0, int n, float *dst) {
    const __m256i tab = _mm256_setr_epi8(NIB_TABLE, NIB_TABLE), hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
    const uint8_t *g = (const uint8_t *)q3_mat_rows(W, r, 1).data + (size_t)k0 / 64 * Q3_BF16P_GROUP_BYTES;
    for (int k = 0; k < n; k += 64, g += Q3_BF16P_GROUP_BYTES, dst += 64) {
        q3_pf_lines(g, Q3_PF_WEIGHTS, 128);
        __m256i u[4];
        if (__builtin_expect(is_raw(g), 0)) {
            raw_group_f32(g, W, dst);
            continue;
        }
        group_words_avx2(g, tab, u);
        for (int i = 0; i < 4; i++) { /* u[i]'s even words are elements 8i .. 8i+7, its odd ones 32 + 8i .. */
            _mm256_storeu_ps(dst + 8 * i, _mm256_castsi256_ps(_mm256_slli_epi32(u[i], 16)));
            _mm256_storeu_ps(dst + 32 + 8 * i, _mm256_castsi256_ps(_mm256_and_si256(u[i], hi16)));
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx2,fma"))) static void row_f32_avx512(const q3_mat *W, int r, int k0, int n,
                                                                                float *dst) {
    const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(NIB_TABLE)), lo4 = _mm512_set1_epi8(0x0F),
                  hi16 = _mm512_set1_epi32((int)0xFFFF0000u),
                  shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const uint8_t *g = (const uint8_t *)q3_mat_rows(W, r, 1).data + (size_t)k0 / 64 * Q3_BF16P_GROUP_BYTES;
    for (int k = 0; k < n; k += 64, g += Q3_BF16P_GROUP_BYTES, dst += 64) {
        q3_pf_lines(g, Q3_PF_WEIGHTS, 128);
        __m512i u0, u1;
        if (__builtin_expect(is_raw(g), 0)) {
            raw_group_f32(g, W, dst);
            continue;
        }
        group_words_avx512(g, tab, lo4, shifts, &u0, &u1);
        _mm512_storeu_ps(dst, _mm512_castsi512_ps(_mm512_slli_epi32(u0, 16)));
        _mm512_storeu_ps(dst + 16, _mm512_castsi512_ps(_mm512_slli_epi32(u1, 16)));
        _mm512_storeu_ps(dst + 32, _mm512_castsi512_ps(_mm512_and_si512(u0, hi16)));
        _mm512_storeu_ps(dst + 48, _mm512_castsi512_ps(_mm512_and_si512(u1, hi16)));
    }
}

void q3_bf16p_row_f32(const q3_mat *W, int r, int k0, int n, float *dst) {
    if (q3_cpu_avx512bw()) row_f32_avx512(W, r, k0, n, dst);
    else row_f32_avx2(W, r, k0, n, dst);
}
