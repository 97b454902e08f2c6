/* Kernels against straightforward double-precision references. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/prefetch.h"
#include "quant/mx.h"
#include "unit.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0) * 2 - 1);
}

/* Exact value of an IEEE half via ldexp, independent of the bit tricks under test. */
static double f16_ref(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_f16_all_codes(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double r = f16_ref((uint16_t)h);
        float f = q3_f16_to_f32((uint16_t)h);
        if (isnan(r) ? !isnan(f) : (double)f != r || !signbit(f) != !signbit(r)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_bf16_rounding(void) {
    CHECK_EQ_INT(q3_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1+2^-7: ties to even (1.0). */
    CHECK_EQ_INT(q3_f32_to_bf16(1.0f + 0.00390625f), 0x3f80);
    CHECK_EQ_INT(q3_f32_to_bf16(1.0f + 3 * 0.00390625f), 0x3f82);
    CHECK(q3_bf16_to_f32(q3_f32_to_bf16(-2.5f)) == -2.5f);
    CHECK(isnan(q3_bf16_to_f32(q3_f32_to_bf16(NAN))));
}

/* Largest error of out = x * wf^T relative to the sum of |products| (a
 * product sum of exactly zero must come out as zero; NaN or Inf anywhere
 * is an infinite error). */
static double worst_rel_err(const float *out, const float *x, const float *wf, int T, int M, int K) {
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                ref += (double)x[t * K + k] * wf[(size_t)m * K + k];
                mag += fabs((double)x[t * K + k] * wf[(size_t)m * K + k]);
            }
            const double got = out[(size_t)t * M + m];
            if (!isfinite(got)) worst = INFINITY; /* (fmax would pass a NaN by) */
            else if (mag == 0) worst = got != 0 ? fmax(worst, 1) : worst;
            else worst = fmax(worst, fabs(got - ref) / mag);
        }
    return worst;
}

static void check_matmul(q3_dtype dt, int T, int M, int K) {
    size_t es = dt == Q3_F32 ? 4 : 2;
    unsigned char *w = malloc((size_t)M * K * es);
    float *wf = malloc((size_t)M * K * sizeof(float)), *x = malloc((size_t)T * K * sizeof(float));
    float *out = malloc((size_t)T * M * sizeof(float));
    for (int i = 0; i < M * K; i++) {
        float v = frand();
        if (dt == Q3_F32) ((float *)w)[i] = v;
        else if (dt == Q3_BF16) ((uint16_t *)w)[i] = q3_f32_to_bf16(v);
        else ((uint16_t *)w)[i] = (uint16_t)(rng & 0x3bff); /* finite halves of magnitude < 1 */
    }
    q3_to_f32(wf, w, dt, 0, (size_t)M * K);
    for (int i = 0; i < T * K; i++) x[i] = frand();
    q3_mat W = {.data = w, .dtype = dt, .rows = M, .cols = K};
    q3_matmul(out, x, T, &W);
    CHECK(worst_rel_err(out, x, wf, T, M, K) < 1e-5);
    free(w), free(wf), free(x), free(out);
}

/* A SIMD plain-dtype GEMV with and without its software prefetch (the
 * latter, two rows at a time, in force on Zen 4): the same bits, both near
 * the reference, over rows of every tail length, odd and even row counts,
 * more rows than the prefetch distance. */
static void check_gemv_prefetch(const q3_isa_kernels *sw, const q3_isa_kernels *hw, q3_dtype dt, int M, int K) {
    CHECK(hw->gemv != sw->gemv);
    const size_t es = dt == Q3_F32 ? 4 : 2;
    unsigned char *w = malloc((size_t)M * K * es);
    float *wf = malloc((size_t)M * K * sizeof(float)), *x = malloc((size_t)K * sizeof(float));
    float *o_sw = malloc((size_t)M * sizeof(float)), *o_hw = malloc((size_t)M * sizeof(float));
    for (int i = 0; i < M * K; i++) {
        const float v = frand();
        if (dt == Q3_F32) ((float *)w)[i] = v;
        else if (dt == Q3_BF16) ((uint16_t *)w)[i] = q3_f32_to_bf16(v);
        else ((uint16_t *)w)[i] = (uint16_t)(rng & 0x3bff);
    }
    q3_to_f32(wf, w, dt, 0, (size_t)M * K);
    for (int k = 0; k < K; k++) x[k] = frand();
    const q3_mat W = {.data = w, .dtype = dt, .rows = M, .cols = K};
    for (int r = 0; r < M; r++) o_sw[r] = o_hw[r] = NAN;
    sw->gemv(o_sw, x, &W, 0, M);
    hw->gemv(o_hw, x, &W, 0, M);
    CHECK(memcmp(o_sw, o_hw, (size_t)M * sizeof(float)) == 0);
    CHECK(worst_rel_err(o_hw, x, wf, 1, M, K) < 1e-5);
    free(w), free(wf), free(x), free(o_sw), free(o_hw);
}

static void test_gemv_prefetch_variants(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c")) return;
    q3_isa_kernels sw, hw;
    for (int t = 0; t < 2 && q3_gemv_prefetch_variants(t, &sw, &hw); t++) {
        check_gemv_prefetch(&sw, &hw, Q3_BF16, 300, 2048);
        check_gemv_prefetch(&sw, &hw, Q3_BF16, 7, 1000);
        check_gemv_prefetch(&sw, &hw, Q3_F16, 33, 272);
        check_gemv_prefetch(&sw, &hw, Q3_F32, 64, 1030);
        check_gemv_prefetch(&sw, &hw, Q3_BF16, 5, 15);
        check_gemv_prefetch(&sw, &hw, Q3_F16, 1, 40);
    }
}

/* Passes over several matrices run by any number of threads. One-token
 * passes: threads own runs of panels and take the back halves of each
 * other's (with more threads than cores they arrive late and get taken
 * from, and a stolen run can lie behind a thread's job cursor). Passes of
 * several tokens: chunks of panels from a shared counter, each job's share
 * as one kernel call. Every row must be computed (the output starts as
 * NaN), correctly, and the same bits whatever the thread count. */
static void check_pass_threads(int T) {
    enum { NJ = 5, K = 256 };
    const int rows[NJ] = {500, 17, 1130, 310, 800}; /* not all whole 16-row panels; takes of several panels span jobs */
    const int max_threads = omp_get_max_threads();
    float *x = malloc((size_t)T * K * sizeof *x), *wf[NJ], *out[NJ], *first[NJ];
    uint16_t *w[NJ];
    q3_mat W[NJ];
    q3_mm_job jobs[NJ];
    for (int k = 0; k < T * K; k++) x[k] = frand();
    for (int j = 0; j < NJ; j++) {
        w[j] = malloc((size_t)rows[j] * K * sizeof *w[j]);
        wf[j] = malloc((size_t)rows[j] * K * sizeof *wf[j]);
        out[j] = malloc((size_t)T * rows[j] * sizeof *out[j]);
        first[j] = malloc((size_t)T * rows[j] * sizeof *first[j]);
        for (int i = 0; i < rows[j] * K; i++) w[j][i] = q3_f32_to_bf16(frand());
        q3_to_f32(wf[j], w[j], Q3_BF16, 0, (size_t)rows[j] * K);
        W[j] = (q3_mat){.data = w[j], .dtype = Q3_BF16, .rows = rows[j], .cols = K};
        jobs[j] = (q3_mm_job){out[j], (size_t)rows[j], x, K, T, &W[j], NULL};
    }
    const int threads[] = {1, 2, 3, 7};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        omp_set_num_threads(threads[ti]);
        for (int rep = 0; rep < (T == 1 ? 20 : 4); rep++) {
            for (int j = 0; j < NJ; j++)
                for (int r = 0; r < T * rows[j]; r++) out[j][r] = NAN;
            q3_matmul_jobs(jobs, NJ);
            for (int j = 0; j < NJ; j++) {
                const size_t n = (size_t)T * rows[j] * sizeof *out[j];
                if (ti == 0 && rep == 0) {
                    if (!CHECK(worst_rel_err(out[j], x, wf[j], T, rows[j], K) < 1e-5))
                        fprintf(stderr, "  T %d, 1 thread: job %d wrong\n", T, j);
                    memcpy(first[j], out[j], n);
                } else if (!CHECK(memcmp(first[j], out[j], n) == 0)) {
                    fprintf(stderr, "  T %d, %d threads, rep %d: job %d differs from 1 thread\n", T, threads[ti], rep, j);
                }
            }
        }
    }
    omp_set_num_threads(max_threads);
    for (int j = 0; j < NJ; j++) free(w[j]), free(wf[j]), free(out[j]), free(first[j]);
    free(x);
}

/* One weight matrix of dtype dt (BF16, or MX with A8 inputs), rows x K,
 * random; MX storage in el / sc (freed by the caller). */
static q3_mat glu_mat(q3_dtype dt, int rows, int K, void **el, uint8_t **sc) {
    float *row = malloc((size_t)K * sizeof *row);
    *sc = NULL;
    if (dt == Q3_BF16) {
        uint16_t *w = malloc((size_t)rows * K * sizeof *w);
        for (int i = 0; i < rows * K; i++) w[i] = q3_f32_to_bf16(frand());
        *el = w;
    } else {
        const size_t eb = q3_mx_elem_bytes(dt, (size_t)K);
        uint8_t *e = malloc((size_t)rows * eb);
        *sc = malloc((size_t)rows * K / 32);
        for (int r = 0; r < rows; r++) {
            for (int k = 0; k < K; k++) row[k] = frand();
            CHECK(q3_mx_quantize_row(dt, row, (size_t)K, *sc + (size_t)r * K / 32, e + (size_t)r * eb) == 0);
        }
        *el = e;
    }
    free(row);
    return (q3_mat){.data = *el, .dtype = dt, .rows = rows, .cols = K, .scales = *sc, .a8 = dt != Q3_BF16};
}

/* Merged gate/up jobs (q3_mm_job.up, SwiGLU as each panel comes out): the
 * same bits as the gate and up products run as plain jobs followed by
 * q3_swiglu over whole rows, for every ISA, one token (the GEMVs' runs of
 * panels) and several (each kernel that prefill takes), row counts that
 * end in a partial panel, three experts in one pass, 1-3 threads. */
static void test_merged_glu(void) {
    enum { NE = 3, K = 256 };
    const q3_dtype dts[] = {Q3_BF16, Q3_MXFP4, Q3_MXFP8};
    const int tokens[] = {1, 3, 9, 20, 40, 100}, F = 200, max_threads = omp_get_max_threads();
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        void *el[2 * NE];
        uint8_t *sc[2 * NE];
        q3_mat W[2 * NE];
        for (int i = 0; i < 2 * NE; i++) W[i] = glu_mat(dts[di], F, K, &el[i], &sc[i]);
        for (size_t ti = 0; ti < sizeof tokens / sizeof *tokens; ti++) {
            const int T = tokens[ti];
            float *x = malloc((size_t)NE * T * K * sizeof *x), *sep = malloc((size_t)2 * NE * T * F * sizeof *sep);
            float *ref = malloc((size_t)NE * T * F * sizeof *ref), *got = malloc((size_t)NE * T * F * sizeof *got);
            for (int i = 0; i < NE * T * K; i++) x[i] = frand();
            for (int r = 0; dts[di] != Q3_BF16 && r < NE * T; r++)
                CHECK(q3_mx_fake_quant_row(Q3_MXFP8, x + (size_t)r * K, K, x + (size_t)r * K) == 0);
            q3_mm_job plain[2 * NE], merged[NE];
            for (int e = 0; e < NE; e++) {
                const float *xe = x + (size_t)e * T * K;
                plain[2 * e] = (q3_mm_job){sep + (size_t)2 * e * T * F, F, xe, K, T, &W[2 * e], NULL};
                plain[2 * e + 1] = (q3_mm_job){sep + (size_t)(2 * e + 1) * T * F, F, xe, K, T, &W[2 * e + 1], NULL};
                merged[e] = (q3_mm_job){got + (size_t)e * T * F, F, xe, K, T, &W[2 * e], &W[2 * e + 1]};
            }
            for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
                q3_kernels_force((q3_isa)isa);
                if ((int)q3_kernels_isa() != isa) continue;
                q3_matmul_jobs(plain, 2 * NE);
                for (int e = 0; e < NE; e++)
                    for (int t = 0; t < T; t++) {
                        const size_t o = ((size_t)e * T + t) * F;
                        q3_swiglu(ref + o, sep + (size_t)2 * e * T * F + (size_t)t * F, sep + (size_t)(2 * e + 1) * T * F + (size_t)t * F, F);
                    }
                for (int nt = 1; nt <= 3; nt++) {
                    omp_set_num_threads(nt);
                    for (int i = 0; i < NE * T * F; i++) got[i] = NAN;
                    q3_matmul_jobs(merged, NE);
                    if (!CHECK(memcmp(got, ref, (size_t)NE * T * F * sizeof *got) == 0))
                        fprintf(stderr, "  merged gate/up: dtype %d, %d tokens, %s, %d threads: differs\n", dts[di], T,
                                q3_isa_name((q3_isa)isa), nt);
                }
                omp_set_num_threads(max_threads);
            }
            q3_kernels_force(Q3_ISA_COUNT - 1);
            free(x), free(sep), free(ref), free(got);
        }
        for (int i = 0; i < 2 * NE; i++) free(el[i]), free(sc[i]);
    }
}

static void test_pass_threads(void) {
    const int tokens[] = {1, 3, 20, 40};
    for (size_t i = 0; i < sizeof tokens / sizeof *tokens; i++) check_pass_threads(tokens[i]);
}

static void test_matmul(void) {
    /* Every ISA this CPU has, each against the double-precision reference. */
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        check_matmul(Q3_F32, 1, 37, 64);
        check_matmul(Q3_BF16, 1, 131, 1000);
        check_matmul(Q3_F16, 1, 19, 48);
        check_matmul(Q3_BF16, 3, 128, 100);
        check_matmul(Q3_F16, 17, 33, 257);
        check_matmul(Q3_F32, 7, 16, 300);
        check_matmul(Q3_BF16, 5, 64, 256); /* few-token kernel, no packing */
        check_matmul(Q3_F16, 16, 34, 512);
        check_matmul(Q3_F32, 2, 18, 32);
        check_matmul(Q3_BF16, 13, 33, 64); /* odd row count: packed path */
        check_matmul(Q3_BF16, 40, 300, 512); /* big enough to run multi-threaded */
        check_matmul(Q3_BF16, 100, 50, 256);  /* tokens-in-lanes kernels: one pass, or several of 48 */
        check_matmul(Q3_BF16, 64, 40, 128);   /* two equal passes of 32 */
        check_matmul(Q3_F32, 49, 21, 96);
        check_matmul(Q3_F16, 33, 9, 160);
        check_matmul(Q3_BF16, 5, 10, 8448); /* K past the tokens-in-lanes limit: few-token kernel */
        check_matmul(Q3_F16, 13, 6, 8448);  /* ... in two token blocks (8 + 5) */
        check_matmul(Q3_F32, 8, 20, 272);   /* AVX-512: every product of 2-8 tokens, each dtype */
        check_matmul(Q3_F32, 3, 22, 64);    /* AVX-512 few-token kernel: 4 rows at a time, a last 2 */
        check_matmul(Q3_BF16, 6, 14, 96);
        check_matmul(Q3_F16, 2, 18, 48);
        /* Tokens-in-lanes BF16 kernels: 1, 2 and 3 token vectors, partial
         * tiles and stages, remainder tokens (with a reduction of 16 pairs
         * past the last 32), a hidden-sized reduction. */
        check_matmul(Q3_BF16, 2, 21, 64);
        check_matmul(Q3_BF16, 7, 22, 112);
        check_matmul(Q3_BF16, 12, 9, 48);
        check_matmul(Q3_BF16, 14, 9, 48);
        check_matmul(Q3_BF16, 20, 19, 112);
        check_matmul(Q3_BF16, 44, 11, 80);
        check_matmul(Q3_BF16, 16, 16, 96);
        check_matmul(Q3_BF16, 17, 37, 160);
        check_matmul(Q3_BF16, 33, 13, 128);
        check_matmul(Q3_BF16, 48, 29, 2048);
        /* AVX-512 fp32 lanes: remainders of 6 (two groups of 3) with no
         * whole vector, of 5 (3 + 2) and of 6 after two vectors with a
         * hidden-sized reduction. */
        check_matmul(Q3_F16, 6, 17, 96);
        check_matmul(Q3_F32, 21, 9, 768);
        check_matmul(Q3_BF16, 38, 19, 2048);
        /* AVX-512 fp32 lanes just past one vector (a padded second one),
         * with a partial last row group and k blocks with a short last one. */
        check_matmul(Q3_F16, 23, 18, 160);
        check_matmul(Q3_BF16, 24, 37, 272);
        /* AVX-512 fp32 lanes in chunks of 48 against the same widened rows:
         * two chunks (the second with a remainder of 3), three with a padded
         * last one, the most one call takes. */
        check_matmul(Q3_BF16, 51, 21, 768);
        check_matmul(Q3_F16, 111, 13, 96);
        check_matmul(Q3_F32, 128, 11, 160);
        /* AVX-512 paired lanes (8 tokens x 2 k per vector) in chunks of up
         * to 3 vectors: one chunk of two vectors, the second partial; 3 + 2
         * vectors; 3 + 2 + 2 with a partial last vector and row group; 3 +
         * 3 + 3 + 2 + 2. */
        check_matmul(Q3_F32, 13, 17, 64);
        check_matmul(Q3_BF16, 40, 24, 2048);
        check_matmul(Q3_F16, 53, 19, 96);
        check_matmul(Q3_BF16, 100, 9, 272);
        /* AVX-512 quads (4 tokens x 4 k per vector), 7-12 tokens: 2 or 3
         * vectors, the last partial (7, 9, 10, 11) or whole (8, 12), a
         * partial row group, a hidden-sized reduction, each dtype. */
        check_matmul(Q3_BF16, 7, 19, 2048);
        check_matmul(Q3_F16, 8, 33, 96);
        check_matmul(Q3_BF16, 9, 21, 64);
        check_matmul(Q3_F16, 10, 17, 160);
        check_matmul(Q3_F32, 11, 9, 96);
        check_matmul(Q3_BF16, 12, 37, 2048);
        /* The AVX2 weights-broadcast GEMM takes up to 128 tokens: odd and
         * even token-vector counts, K past one column block with a short
         * last block, the first size past its limit (panel GEMM). */
        check_matmul(Q3_BF16, 128, 45, 400);
        check_matmul(Q3_F16, 120, 17, 272);
        check_matmul(Q3_F32, 57, 23, 144);
        check_matmul(Q3_BF16, 129, 20, 144);
        /* ... its remainder tokens (T % 8 of them as rows): 2 with a short
         * last column block, 3 and 6 (3 + 3) past one and two vectors with
         * a partial last row group, 7 (3 + 3 + 1) with a hidden-sized
         * reduction. */
        check_matmul(Q3_BF16, 18, 21, 272);
        check_matmul(Q3_F32, 27, 13, 144);
        check_matmul(Q3_F16, 30, 19, 160);
        check_matmul(Q3_BF16, 31, 17, 2048);
        /* AVX2 few-token kernel: 4 rows x 2 tokens with a last 2 rows (18),
         * three even token blocks (15 as 5 + 5 + 5), an odd row count. */
        check_matmul(Q3_F16, 2, 18, 208);
        check_matmul(Q3_BF16, 15, 22, 96);
        check_matmul(Q3_F32, 7, 13, 48);
        /* Panel GEMM on packed token tiles: a short last tile, several k
         * blocks with a short last one, a short last panel; and on the rows
         * as stored (AVX2: the few-token kernel's odd last panel). */
        check_matmul(Q3_BF16, 131, 40, 600);
        check_matmul(Q3_F32, 200, 33, 520);
        check_matmul(Q3_BF16, 10, 33, 64);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

/* MX weights (every element format, tiny and zero blocks included) against
 * a double-precision product with the dequantized rows, for the GEMV (one
 * token) and packed GEMM paths of every ISA. act: the input as the model
 * leaves it (Q3_F32: as computed; Q3_MXFP8 / Q3_MXINT8: quantized, A8).
 * extremes 1: rows of tiny (scale code 0) and zero blocks, which the A8
 * GEMM hands back to the fp32 kernels; 2 (MXINT8 weights): only the codes
 * of largest magnitude (0x80 = -2, 0x81, 0x7F) against inputs at +-127/64,
 * the integer GEMV's limits; 3: inputs of about 2^-32, whose products with
 * E4M3 elements decoded as value * 2^-120 were fp32 subnormals, with a
 * fraction of the precision. */
static void check_mx_a8(q3_dtype dt, int T, int M, int K, q3_dtype act, int extremes) {
    const size_t eb = q3_mx_elem_bytes(dt, (size_t)K);
    uint8_t *el = malloc((size_t)M * eb), *sc = malloc((size_t)M * K / 32);
    float *row = malloc((size_t)K * sizeof(float)), *wf = malloc((size_t)M * K * sizeof(float));
    float *x = malloc((size_t)T * K * sizeof(float)), *out = malloc((size_t)T * M * sizeof(float));
    for (int r = 0; r < M; r++) {
        for (int k = 0; k < K; k++)
            row[k] = frand() * (extremes == 1 && r % 5 == 0 ? 1e-38f : extremes == 1 && r % 7 == 0 ? 0.0f : 3.0f);
        if (extremes == 1 && r % 11 == 3) /* one zero block (scale code 0) among ordinary ones, in a different place per row */
            for (int k = 0; k < 32; k++) row[(size_t)(r / 11 % (K / 32)) * 32 + k] = 0.0f;
        CHECK(q3_mx_quantize_row(dt, row, (size_t)K, sc + (size_t)r * K / 32, el + (size_t)r * eb) == 0);
        if (extremes == 2)
            for (size_t i = 0; i < eb; i++) el[(size_t)r * eb + i] = (uint8_t[]){0x80, 0x81, 0x7F}[(i * 7 + (size_t)r) % 3];
        q3_mx_dequantize_row(dt, sc + (size_t)r * K / 32, el + (size_t)r * eb, (size_t)K, wf + (size_t)r * K);
    }
    for (int i = 0; i < T * K; i++)
        x[i] = extremes == 2 ? (i % 3 ? -127.0f / 64 : 127.0f / 64)
                             : frand() * (i % 97 == 0 ? 300.0f : 1.0f) * (extremes == 3 ? 0x1p-32f : 1.0f);
    /* Input blocks of zeros and of fp32-subnormal size (the smallest shared
     * exponents), as well as ordinary ones. */
    for (int b = 0; extremes == 1 && b < T * K / 32; b++)
        for (int i = 0; i < 32; i++) x[b * 32 + i] *= b % 6 == 1 ? 0.0f : b % 6 == 4 ? 1e-39f : 1.0f;
    for (int t = 0; act != Q3_F32 && t < T; t++)
        CHECK(q3_mx_fake_quant_row(act, x + (size_t)t * K, (size_t)K, x + (size_t)t * K) == 0);
    q3_mat W = {.data = el, .dtype = dt, .rows = M, .cols = K, .scales = sc, .a8 = act != Q3_F32, .ai8 = act == Q3_MXINT8};
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        q3_matmul(out, x, T, &W);
        const double err = worst_rel_err(out, x, wf, T, M, K);
        if (err >= 1e-5)
            fprintf(stderr, "check_mx_a8: dtype %d, %d x %d, %d tokens, input %d, extremes %d, %s: relative error %g\n", dt, M, K, T,
                    act, extremes, q3_isa_name((q3_isa)isa), err);
        CHECK(err < 1e-5);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
    free(el), free(sc), free(row), free(wf), free(x), free(out);
}

/* The AMX table, forced, or NULL (the last table forced again) where the
 * CPU or the OS has no AMX tiles; what, to say when skipped. */
static const q3_isa_kernels *amx_table(const char *what) {
    q3_kernels_force(Q3_ISA_AMX);
    if (q3_kernels_isa() == Q3_ISA_AMX) return q3_isa_current();
    if (what) printf("  (no AMX on this CPU: the %s skipped)\n", what);
    q3_kernels_force(Q3_ISA_COUNT - 1);
    return NULL;
}

/* The AMX broadcast GEMM on BF16 weights splits each fp32 input into three
 * bf16 parts; all three must reach the sums. Rows with one nonzero weight,
 * a power of two, make each output one product, exact in fp32: only the
 * full split gives it bit for bit (two parts leave errors of 2^-17, which
 * the dense checks' tolerance lets through). Partial last panel, token
 * counts around the 16-token blocks and 4-block groups, K of one block and
 * past the weights prefetch distance. */
static void test_amx_bf16_exact(void) {
    const q3_isa_kernels *k = amx_table("AMX GEMM checks");
    if (!k) return;
    const int Ks[] = {32, 96, 2048}, Ts[] = {1, 5, 16, 17, 64, 65, 128};
    const int M = 37;
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            const int K = Ks[ki], T = Ts[ti];
            uint16_t *w = calloc((size_t)M * K, sizeof *w);
            float *x = malloc((size_t)T * K * sizeof *x), *out = malloc((size_t)T * M * sizeof *out);
            float *ap = malloc((size_t)(T + 15) / 16 * 16 * K * 6), *wbuf = malloc((size_t)Q3_NR * (K + 16) * sizeof(float)); /* 3 bf16 per input, tokens in blocks of 16 */
            int at[37];
            float wv[37];
            for (int r = 0; r < M; r++) {
                at[r] = (r * 7 + 3) % K;
                wv[r] = ldexpf(r % 2 ? -1.0f : 1.0f, r % 5 - 2);
                w[(size_t)r * K + at[r]] = q3_f32_to_bf16(wv[r]);
            }
            for (int i = 0; i < T * K; i++) x[i] = frand() * (i % 13 == 0 ? 1e4f : 1.0f);
            q3_mat W = {.data = w, .dtype = Q3_BF16, .rows = M, .cols = K};
            k->bc_pack_act(ap, x, (size_t)K, T, K, Q3_BF16);
            k->gemm_bc(out, (size_t)M, ap, T, &W, 0, M, wbuf);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int r = 0; r < M; r++) bad += out[(size_t)t * M + r] != wv[r] * x[(size_t)t * K + at[r]];
            if (bad) fprintf(stderr, "test_amx_bf16_exact: K %d, T %d: %d of %d outputs inexact\n", K, T, bad, T * M);
            CHECK_EQ_INT(bad, 0);
            free(w), free(x), free(out), free(ap), free(wbuf);
        }
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

/* The AMX weight-only MX GEMM splits each fp32 input into three bf16 parts
 * against rows decoded with their scales folded in. Inputs with one
 * nonzero per token against weights that are powers of two make each
 * output one exact product: only the full split gives it bit for bit.
 * Both MX element types (MXFP8 rows are decoded between the k blocks, past
 * the first 8 at K = 2048), token counts around the 16-token blocks, a
 * partial last panel; and a panel whose scales do not fold is handed back. */
static void test_amx_wo_exact(void) {
    const q3_isa_kernels *k = amx_table(NULL); /* (test_amx_bf16_exact says when skipped) */
    if (!k) return;
    enum { M = 37, K = 2048 };
    const q3_dtype wts[] = {Q3_MXFP4, Q3_MXFP8};
    const int Ts[] = {13, 16, 17, 64, 65, 128};
    for (size_t wi = 0; wi < 2; wi++) {
        const q3_dtype wt = wts[wi];
        const size_t eb = q3_mx_elem_bytes(wt, K);
        uint8_t *el = malloc(M * eb), *sc = malloc((size_t)M * K / 32);
        float *row = malloc(K * sizeof(float)), *wf = malloc((size_t)M * K * sizeof(float));
        for (int r = 0; r < M; r++) {
            for (int i = 0; i < K; i++) row[i] = ldexpf((rng >> 7 & 1) ? -1.0f : 1.0f, (int)(frand() * 1.5f + 1.5f) - 1 + r % 3), (void)frand();
            CHECK(q3_mx_quantize_row(wt, row, K, sc + (size_t)r * K / 32, el + (size_t)r * eb) == 0);
            q3_mx_dequantize_row(wt, sc + (size_t)r * K / 32, el + (size_t)r * eb, K, wf + (size_t)r * K);
        }
        q3_mat W = {.data = el, .dtype = wt, .rows = M, .cols = K, .scales = sc};
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            const int T = Ts[ti], TP = (T + 15) / 16 * 16;
            float *x = calloc((size_t)T * K, sizeof *x), *out = malloc((size_t)T * M * sizeof *out);
            uint32_t *ap = malloc((size_t)TP * K * 6);
            uint16_t *rows = malloc((size_t)51 * K * 2), *wbuf = malloc((size_t)Q3_MX_WBUF_WORDS * 2);
            int at[128];
            for (int t = 0; t < T; t++) {
                at[t] = (t * 131 + 7) % K;
                x[(size_t)t * K + at[t]] = frand() * 3.0f; /* a full 24-bit significand */
            }
            k->wo_pack_act(ap, x, K, T, K, wt, rows);
            CHECK(k->gemm_wo(out, M, ap, T, &W, 0, M, wbuf) == 1);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int r = 0; r < M; r++) bad += out[(size_t)t * M + r] != wf[(size_t)r * K + at[t]] * x[(size_t)t * K + at[t]];
            if (bad) fprintf(stderr, "test_amx_wo_exact: dtype %d, T %d: %d of %d outputs inexact\n", wt, T, bad, T * M);
            CHECK_EQ_INT(bad, 0);
            free(x), free(out), free(ap), free(rows), free(wbuf);
        }
        sc[3] = 0; /* row 0: a block of scale 2^-127, which folding cannot keep: the panel is handed back */
        float *x = calloc((size_t)16 * K, sizeof *x), *out = malloc((size_t)16 * M * sizeof *out);
        uint32_t *ap = malloc((size_t)16 * K * 6);
        uint16_t *rows = malloc((size_t)51 * K * 2), *wbuf = malloc((size_t)Q3_MX_WBUF_WORDS * 2);
        k->wo_pack_act(ap, x, K, 16, K, wt, rows);
        CHECK(k->gemm_wo(out, M, ap, 16, &W, 0, 16, wbuf) == 0);
        CHECK(k->gemm_wo(out, M, ap, 16, &W, 16, 32, wbuf) == 1);
        free(x), free(out), free(ap), free(rows), free(wbuf);
        free(el), free(sc), free(row), free(wf);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

/* M rows of K random values in [-1, 1) (every `every`-th times `peak`),
 * quantized to MX dtype wt: codes *el and scales *sc (the caller frees). */
static void random_mx_rows(q3_dtype wt, int M, int K, int every, float peak, uint8_t **el, uint8_t **sc) {
    const size_t eb = q3_mx_elem_bytes(wt, (size_t)K);
    float *row = malloc((size_t)K * sizeof *row);
    *el = malloc((size_t)M * eb), *sc = malloc((size_t)M * K / 32);
    for (int r = 0; r < M; r++) {
        for (int i = 0; i < K; i++) row[i] = frand() * (i % every == 0 ? peak : 1.0f);
        CHECK(q3_mx_quantize_row(wt, row, (size_t)K, *sc + (size_t)r * K / 32, *el + (size_t)r * eb) == 0);
    }
    free(row);
}

/* The AMX MX GEMMs given several panels at once (the table's mx_panels)
 * run them in chunks of k blocks, their sums stored and taken up again
 * between chunks, in groups of panels: bit for bit the results of one call
 * per panel, for A8 and weight-only inputs, 1 to 4 token blocks (more,
 * and weight-only inputs of 3 or more, take the panels whole), a last
 * chunk shorter than the others (K = 2176), a group and a panel cut short
 * (M = 200). */
static void test_amx_chunked_panels(void) {
    const q3_isa_kernels *k = amx_table(NULL); /* (test_amx_bf16_exact says when skipped) */
    if (!k) return;
    enum { M = 200 };
    const int Ks[] = {768, 2176}, Ts[] = {5, 16, 17, 33, 50, 64, 65, 100, 128};
    const q3_dtype wts[] = {Q3_MXFP4, Q3_MXFP8};
    uint16_t *wbuf = malloc((size_t)Q3_MX_WBUF_WORDS * 2);
    for (size_t wi = 0; wi < 2; wi++)
        for (size_t ki = 0; ki < 2; ki++) {
            const q3_dtype wt = wts[wi];
            const int K = Ks[ki];
            uint8_t *el, *sc;
            random_mx_rows(wt, M, K, 61, 8.0f, &el, &sc);
            const q3_mat W = {.data = el, .dtype = wt, .rows = M, .cols = K, .scales = sc};
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
                for (int wo = 0; wo < 2; wo++) {
                    const int T = Ts[ti], TP = (T + 15) / 16 * 16;
                    float *x = malloc((size_t)T * K * sizeof *x), *whole = malloc((size_t)T * M * sizeof *whole);
                    float *single = malloc((size_t)T * M * sizeof *single);
                    uint32_t *ap = malloc((size_t)TP * K * 6);
                    uint16_t *rows = malloc((size_t)51 * K * 2);
                    for (int i = 0; i < T * K; i++) x[i] = frand();
                    if (wo) k->wo_pack_act(ap, x, (size_t)K, T, K, wt, rows);
                    else {
                        for (int t = 0; t < T; t++) CHECK(q3_mx_fake_quant_row(Q3_MXFP8, x + (size_t)t * K, (size_t)K, x + (size_t)t * K) == 0);
                        k->a8_pack_act(ap, x, (size_t)K, T, K, wt, rows);
                    }
                    int (*gemm)(float *, size_t, const uint32_t *, int, const q3_mat *, int, int, uint16_t *) = wo ? k->gemm_wo : k->gemm_a8;
                    CHECK(gemm(whole, M, ap, T, &W, 0, M, wbuf) == 1);
                    for (int r = 0; r < M; r += 16) CHECK(gemm(single + r, M, ap, T, &W, r, r + 16 < M ? r + 16 : M, wbuf) == 1);
                    int bad = 0, nonzero = 0;
                    for (int i = 0; i < T * M; i++) {
                        bad += memcmp(&whole[i], &single[i], sizeof *whole) != 0;
                        nonzero += whole[i] != 0.0f;
                    }
                    if (bad) fprintf(stderr, "test_amx_chunked_panels: dtype %d, K %d, T %d, %s: %d of %d differ\n", wt, K, T, wo ? "wo" : "A8", bad, T * M);
                    CHECK_EQ_INT(bad, 0);
                    CHECK(nonzero > T * M / 2);
                    free(x), free(whole), free(single), free(ap), free(rows);
                }
            free(el), free(sc);
        }
    free(wbuf);
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

/* The AMX-INT8 integer GEMM (MXINT8 inputs; MXFP4 and MXINT8 weights)
 * gives the VNNI GEMM's results bit for bit: the same exact block sums
 * (signed inputs on the tiles, offset ones on VPDPBUSD less the
 * correction), scaled in the same order. Several panels in one call and a
 * short last one, 1 to 8 token blocks, inputs with zero and tiny blocks. */
static void test_amx_i8_matches_vnni(void) {
    q3_kernels_force(Q3_ISA_AVX512);
    const q3_isa_kernels kv = *q3_isa_current();
    const int have_vnni = q3_kernels_isa() == Q3_ISA_AVX512 && kv.gemm_i8;
    const q3_isa_kernels *ka = amx_table(NULL);
    if (!ka) return;
    if (!have_vnni || ka->gemm_i8 == kv.gemm_i8) { /* (no AMX-INT8 kernel on this CPU) */
        q3_kernels_force(Q3_ISA_COUNT - 1);
        return;
    }
    enum { M = 37 };
    const int Ks[] = {192, 2048}, Ts[] = {7, 16, 33, 100, 128};
    const q3_dtype wts[] = {Q3_MXFP4, Q3_MXINT8};
    void *wbuf = malloc((size_t)Q3_NR * (2048 + 2048 / 4) * 2);
    for (size_t wi = 0; wi < 2; wi++)
        for (size_t ki = 0; ki < 2; ki++) {
            const q3_dtype wt = wts[wi];
            const int K = Ks[ki];
            uint8_t *el, *sc;
            random_mx_rows(wt, M, K, 37, 6.0f, &el, &sc);
            const q3_mat W = {.data = el, .dtype = wt, .rows = M, .cols = K, .scales = sc, .a8 = 1, .ai8 = 1};
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                const int T = Ts[ti], TP = (T + 15) & ~15;
                float *x = malloc((size_t)T * K * sizeof *x), *fs = malloc((size_t)K / 32 * TP * sizeof *fs);
                float *o1 = malloc((size_t)T * M * sizeof *o1), *o2 = malloc((size_t)T * M * sizeof *o2);
                uint32_t *ap = malloc((size_t)K * TP);
                for (int i = 0; i < T * K; i++) x[i] = frand() * (i / 32 % 11 == 3 ? 0.0f : i / 32 % 11 == 5 ? 1e-30f : 1.0f);
                kv.i8_pack_act(ap, fs, x, (size_t)K, T, K);
                for (int r = 0; r < M; r += Q3_NR) kv.gemm_i8(o1 + r, M, ap, fs, T, &W, r, r + Q3_NR < M ? r + Q3_NR : M, wbuf);
                ka->i8_pack_act(ap, fs, x, (size_t)K, T, K);
                ka->gemm_i8(o2, M, ap, fs, T, &W, 0, M, wbuf);
                int bad = 0;
                for (int i = 0; i < T * M; i++) bad += memcmp(&o1[i], &o2[i], sizeof *o1) != 0;
                if (bad) fprintf(stderr, "test_amx_i8_matches_vnni: dtype %d, K %d, T %d: %d of %d differ\n", wt, K, T, bad, T * M);
                CHECK_EQ_INT(bad, 0);
                free(x), free(fs), free(o1), free(o2), free(ap);
            }
            free(el), free(sc);
        }
    free(wbuf);
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

/* A few tokens against MX weights in one pass (the AVX-512 kernels that
 * decode each row once for all of them: MXFP4 weights with MXINT8 and MXFP8
 * inputs, MXFP8 weights with MXFP8 inputs) give,
 * token by token, the one-token GEMV's results bit for bit: the same block
 * sums, scaled and added in the same order. Rows with a zero block (scale
 * code 0: the integer kernel's second, table-driven pass) and with tiny
 * scales, 2 .. 12 tokens (blocks of 4 and a remainder), a short last group
 * of blocks, several threads. */
static void test_mx_tokens_match_gemv(void) {
    enum { M = 70, TMAX = 12 };
    static const int Ks[] = {768, 2048};
    static const q3_dtype acts[] = {Q3_MXINT8, Q3_MXFP8, Q3_MXFP8}, wts[] = {Q3_MXFP4, Q3_MXFP4, Q3_MXFP8};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++) {
            const int K = Ks[ki];
            const q3_dtype wt = wts[ai];
            const size_t eb = q3_mx_elem_bytes(wt, (size_t)K);
            uint8_t *el = malloc(M * eb), *sc = malloc((size_t)M * K / 32);
            float *row = malloc((size_t)K * sizeof(float)), *x = malloc((size_t)TMAX * K * sizeof(float));
            float *ot = malloc((size_t)TMAX * M * sizeof(float)), *o1 = malloc((size_t)M * sizeof(float));
            for (int r = 0; r < M; r++) {
                for (int k = 0; k < K; k++) row[k] = frand() * (r % 9 == 2 ? 1e-38f : 2.0f);
                if (r % 5 == 1)
                    for (int k = 0; k < 32; k++) row[(size_t)(r % (K / 32)) * 32 + k] = 0.0f;
                CHECK(q3_mx_quantize_row(wt, row, (size_t)K, sc + (size_t)r * K / 32, el + (size_t)r * eb) == 0);
            }
            for (int t = 0; t < TMAX; t++) {
                for (int k = 0; k < K; k++) x[(size_t)t * K + k] = frand() * (k % 29 == 0 ? 40.0f : 1.0f);
                CHECK(q3_mx_fake_quant_row(acts[ai], x + (size_t)t * K, (size_t)K, x + (size_t)t * K) == 0);
            }
            q3_mat W = {.data = el, .dtype = wt, .rows = M, .cols = K, .scales = sc, .a8 = 1, .ai8 = acts[ai] == Q3_MXINT8};
            for (int isa = Q3_ISA_AVX2; isa < Q3_ISA_COUNT; isa++) {
                q3_kernels_force((q3_isa)isa);
                if ((int)q3_kernels_isa() != isa) continue;
                /* Past the per-token GEMVs (and below the integer GEMM's 7 tokens), only the one-pass kernels promise equality. */
                const q3_isa_kernels *kt = q3_isa_current();
                const int i8 = acts[ai] == Q3_MXINT8;
                int tmax; /* (MXINT8 inputs, MXFP4 weights: the integer kernels, never the A8 GEMM) */
                /* an A8 GEMV for one token only (AVX2): more tokens take the fp32 copies' tokens GEMV,
                 * which must equal that of one token on the same copy (the weight-only path) */
                const int a8_one = !i8 && kt->gemv_a8 && !kt->gemv_a8_tokens && !kt->gemm_a8 && kt->gemv_mx_tokens;
                q3_mat W1 = W;
                W1.a8 = !a8_one;
                if (i8) tmax = kt->gemv_i8_tokens ? kt->tokens_t : kt->i8_gemv_t < 6 ? kt->i8_gemv_t : 6;
                else if (kt->gemv_a8 && !a8_one) /* the A8 tokens GEMV, then the A8 GEMM */
                    tmax = kt->gemv_a8_tokens ? kt->a8_tokens_t : kt->gemm_a8 ? 1 : kt->mx_gemv_t;
                else tmax = kt->gemv_mx_tokens ? kt->tokens_t : kt->mx_gemv_t;
                for (int T = 2; T <= TMAX && T <= tmax; T++) {
                    q3_matmul(ot, x, T, &W);
                    int bad = 0;
                    for (int t = 0; t < T; t++) {
                        q3_matmul(o1, x + (size_t)t * K, 1, &W1);
                        bad += memcmp(o1, ot + (size_t)t * M, M * sizeof(float)) != 0;
                    }
                    if (bad)
                        fprintf(stderr, "test_mx_tokens_match_gemv: %s, K %d, weights %d, input %d, %d tokens: %d differ\n",
                                q3_isa_name((q3_isa)isa), K, wt, acts[ai], T, bad);
                    CHECK_EQ_INT(bad, 0);
                }
            }
            q3_kernels_force(Q3_ISA_COUNT - 1);
            free(el), free(sc), free(row), free(x), free(ot), free(o1);
        }
}

/* The integer GEMM's variants (AVX2; AVX-512 VNNI where the CPU has it)
 * do the same exact integer sums and the same scaling in the same order:
 * their outputs must agree bit for bit, for whole and partial token
 * vectors and row tails. */
static void test_i8_gemm_variants_agree(void) {
    enum { M = 23, K = 256, TMAX = 45 };
    const size_t eb = q3_mx_elem_bytes(Q3_MXFP4, K);
    uint8_t *el = malloc(M * eb), *sc = malloc(M * K / 32);
    float *row = malloc(K * sizeof(float)), *x = malloc((size_t)TMAX * K * sizeof(float));
    float *o2 = malloc((size_t)TMAX * M * sizeof(float)), *o5 = malloc((size_t)TMAX * M * sizeof(float));
    for (int r = 0; r < M; r++) {
        for (int k = 0; k < K; k++) row[k] = frand() * 2.0f;
        CHECK(q3_mx_quantize_row(Q3_MXFP4, row, K, sc + (size_t)r * K / 32, el + (size_t)r * eb) == 0);
    }
    for (int t = 0; t < TMAX; t++) {
        for (int k = 0; k < K; k++) x[(size_t)t * K + k] = frand() * (k % 31 == 0 ? 50.0f : 1.0f);
        CHECK(q3_mx_fake_quant_row(Q3_MXINT8, x + (size_t)t * K, K, x + (size_t)t * K) == 0);
    }
    q3_mat W = {.data = el, .dtype = Q3_MXFP4, .rows = M, .cols = K, .scales = sc, .a8 = 1, .ai8 = 1};
    static const int Ts[] = {7, 16, 17, 33, 45};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        q3_kernels_force(Q3_ISA_AVX2);
        if (q3_kernels_isa() != Q3_ISA_AVX2) break;
        q3_matmul(o2, x, Ts[i], &W);
        q3_kernels_force(Q3_ISA_AVX512);
        if (q3_kernels_isa() != Q3_ISA_AVX512) break;
        q3_matmul(o5, x, Ts[i], &W);
        CHECK(memcmp(o2, o5, (size_t)Ts[i] * M * sizeof(float)) == 0);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
    free(el), free(sc), free(row), free(x), free(o2), free(o5);
}

static void check_mx(q3_dtype dt, int T, int M, int K) {
    check_mx_a8(dt, T, M, K, Q3_F32, 1);
    check_mx_a8(dt, T, M, K, Q3_MXFP8, 1);
    check_mx_a8(dt, T, M, K, Q3_MXINT8, 1);
}

/* The integer GEMV's input copy (MXINT8 weights: the codes in stored
 * order, then one factor 2^(shared - 6) per block) against quant/mx.c,
 * over blocks of every size: zeros, fp32 subnormals (the smallest shared
 * exponents, where 2^(6 - shared) overflows fp32), huge ones, and values
 * that are not MXINT8 yet (the copy quantizes them by the same rule). */
static void test_i8_prep(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return;
    enum { K = 32 * 12 };
    const float mags[12] = {1.0f, 0.0f, 1e-39f, 3e-38f, 1e-30f, 7e37f, 1e-3f, 448.0f, 0.0f, 1e-45f, 2.0f, 5e-39f};
    float x[K];
    uint8_t sc[K / 32], el[K], xq[K + K / 32 * 4] __attribute__((aligned(64)));
    for (int i = 0; i < K; i++) x[i] = frand() * mags[i / 32];
    CHECK(q3_mx_quantize_row(Q3_MXINT8, x, K, sc, el) == 0);
    q3_avx2_i8_prep(xq, x, K, Q3_MXINT8);
    CHECK(!memcmp(xq, el, K));
    float fs[K / 32];
    memcpy(fs, xq + K, sizeof fs);
    int bad = 0;
    for (int b = 0; b < K / 32; b++) bad += fs[b] != ldexpf(1.0f, sc[b] - 127 - 6);
    CHECK_EQ_INT(bad, 0);
}

/* MXFP8 inputs against MXFP4 weights where a table sums the products in
 * integers (gemv_a8_avx2.c: |v| = 1024 hi + 4 lo + r per element, in E4M3
 * steps of 2^-9): every plane must reach the sums. Rows whose only nonzero
 * products come from inputs below 2^-6 (only r), or from one plane's bits
 * (only lo, only hi); a group of 8 blocks with r beside one without; a
 * tail of 2 steps (K = 384); scale codes 0 and 255 (the row taken a step at
 * a time). The same inputs as 17 tokens of a prefill product too. Every
 * table, against the double-precision reference. */
static void test_a8_planes(void) {
    static const int Ks[] = {512, 384};
    enum { M = 24 };
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
        const int K = Ks[ki], nb = K / 32;
        const size_t eb = (size_t)K / 2;
        uint8_t *el = malloc(M * eb), *sc = malloc((size_t)M * nb);
        float *wf = malloc((size_t)M * K * sizeof *wf), *x = malloc((size_t)K * sizeof *x), out[M];
        for (int r = 0; r < M; r++) {
            for (size_t i = 0; i < eb; i++) el[r * eb + i] = (uint8_t)(rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 0;
            for (int b = 0; b < nb; b++) {
                sc[r * nb + b] = (uint8_t)(120 + (r + 3 * b) % 15);
                el[r * eb + (size_t)b * 16] &= 0xF0; /* element 0 of each block: weight 0 */
            }
            if (r == 5) sc[r * nb + 3] = 0;
            if (r == 6) sc[r * nb + nb - 1] = 255;
            q3_mx_dequantize_row(Q3_MXFP4, sc + (size_t)r * nb, el + r * eb, (size_t)K, wf + (size_t)r * K);
        }
        /* Block b: element 0 is 448 * 2^s (the block's scale), the others
         * E4M3 values times 2^s of one kind: b % 4 == 0 subnormals of 1-3
         * steps (r only), 1 values in [2^-4, 2) (lo only), 2 in [2^4, 2^8)
         * (hi only), 3 any E4M3 value; one group only of kinds 1 and 2 (no
         * r): with K = 512 the second, with K = 384 the first, so that only
         * the tail has r. */
        for (int b = 0; b < nb; b++) {
            const int no_r = K == 512 ? b >= 8 && b < 16 : b < 8, s = b % 5 - 2, kind = no_r ? 1 + b % 2 : b % 4;
            x[b * 32] = ldexpf(448.0f, s);
            for (int i = 1; i < 32; i++) {
                const int sign = (i * 7 + b) % 3 == 0 ? -1 : 1, m = (i * 5 + b) % 8;
                const float e4 = kind == 0   ? ldexpf((float)(1 + i % 3), -9)
                                 : kind == 1 ? ldexpf(1.0f + m / 8.0f, -4 + (i + b) % 5)
                                 : kind == 2 ? ldexpf(1.0f + m / 8.0f, 4 + (i + b) % 4)
                                 : i % 4     ? ldexpf(1.0f + m / 8.0f, -6 + (i * 3 + b) % 14)
                                             : ldexpf((float)m, -9);
                x[b * 32 + i] = (float)sign * ldexpf(e4, s);
            }
        }
        /* The same blocks as the tokens of a prefill product (the A8 GEMMs,
         * or the fp32 ones on the MXFP8 values): each token the row scaled
         * by a power of two and signed its way (still MXFP8), some tokens'
         * blocks only of the kinds without r, one all zero. */
        enum { T = 17 };
        float *xs = malloc((size_t)T * K * sizeof *xs), *outs = malloc((size_t)T * M * sizeof *outs);
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                const int b = k / 32, plain = t >= 8 && t < 16, kind_r = b % 4 == 0 || b % 4 == 3;
                const float v = plain && kind_r && k % 32 ? 0.0f : x[k];
                xs[(size_t)t * K + k] = t == 5 ? 0.0f : (t % 2 ? -1.0f : 1.0f) * ldexpf(v, t % 3 - 1);
            }
        float *xq = malloc((size_t)T * K * sizeof *xq);
        CHECK(q3_mx_fake_quant_row(Q3_MXFP8, x, (size_t)K, xq) == 0);
        CHECK(!memcmp(xq, x, (size_t)K * sizeof *x)); /* the inputs are MXFP8 already */
        for (int t = 0; t < T; t++) CHECK(q3_mx_fake_quant_row(Q3_MXFP8, xs + (size_t)t * K, (size_t)K, xq + (size_t)t * K) == 0);
        CHECK(!memcmp(xq, xs, (size_t)T * K * sizeof *xs));
        q3_mat W = {.data = el, .dtype = Q3_MXFP4, .rows = M, .cols = K, .scales = sc, .a8 = 1};
        for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
            q3_kernels_force((q3_isa)isa);
            if ((int)q3_kernels_isa() != isa) continue;
            q3_matmul(out, x, 1, &W);
            q3_matmul(outs, xs, T, &W);
            CHECK(isnan(out[6]));
            out[6] = 0;
            for (int t = 0; t < T; t++) {
                CHECK(isnan(outs[(size_t)t * M + 6]) || t == 5);
                outs[(size_t)t * M + 6] = 0;
            }
            float wf6[512];
            memcpy(wf6, wf + 6 * K, sizeof wf6);
            memset(wf + 6 * K, 0, (size_t)K * sizeof *wf);
            const double err = worst_rel_err(out, x, wf, 1, M, K), errs = worst_rel_err(outs, xs, wf, T, M, K);
            memcpy(wf + 6 * K, wf6, (size_t)K * sizeof *wf);
            if (err >= 1e-6 || errs >= 1e-6)
                fprintf(stderr, "test_a8_planes: K %d, %s: relative error %g (one token), %g (%d)\n", K, q3_isa_name((q3_isa)isa),
                        err, errs, T);
            CHECK(err < 1e-6);
            CHECK(errs < 1e-6);
        }
        free(xs), free(outs), free(xq);
        q3_kernels_force(Q3_ISA_COUNT - 1);
        free(el), free(sc), free(wf), free(x);
    }
}

static void test_mx_matmul(void) {
    /* The A8 GEMV: runs of 16 blocks, shorter tails, every element format. */
    check_mx(Q3_MXFP4, 1, 33, 128);
    check_mx(Q3_MXFP8, 1, 33, 192);
    check_mx(Q3_MXINT8, 1, 33, 192);
    check_mx(Q3_MXFP4, 1, 50, 1152);
    check_mx(Q3_MXFP8, 1, 50, 1152);
    check_mx(Q3_MXINT8, 1, 50, 1152);
    check_mx(Q3_MXFP8, 1, 260, 2048); /* multi-threaded */
    check_mx(Q3_MXINT8, 1, 260, 2048);
    /* The AVX-512 VNNI integer GEMV (MXFP4 weights, K % 128 == 0): a group
     * of 16 blocks and a short one, several threads; K % 128 != 0 takes
     * the AVX2 kernel and its input copy. */
    check_mx(Q3_MXFP4, 1, 40, 768);
    check_mx(Q3_MXFP4, 1, 260, 2048);
    check_mx(Q3_MXFP4, 1, 33, 320);
    /* The A8 GEMM: 1, 2 and 3 vectors of tokens, paired tokens (22), row tails, several passes of 48 tokens;
     * AMX: one and two groups of 4 token blocks in one pass (71, 100), two passes (150). */
    const int gt[] = {2, 9, 17, 22, 33, 48, 71, 100, 150};
    for (size_t i = 0; i < sizeof gt / sizeof gt[0]; i++) {
        check_mx_a8(Q3_MXFP4, gt[i], 37, 256, Q3_MXFP8, 0);
        check_mx_a8(Q3_MXFP8, gt[i], 21, 192, Q3_MXFP8, 0);
        check_mx_a8(Q3_MXFP4, gt[i], 37, 256, Q3_MXINT8, 0);
        check_mx_a8(Q3_MXINT8, gt[i], 21, 192, Q3_MXINT8, 0);
    }
    check_mx_a8(Q3_MXFP4, 40, 300, 1024, Q3_MXFP8, 0); /* multi-threaded */
    /* The integer GEMM (MXINT8 inputs, MXFP4 weights): its largest size,
     * zero and tiny blocks on both sides, several threads. */
    check_mx_a8(Q3_MXFP4, 128, 21, 256, Q3_MXINT8, 1);
    check_mx_a8(Q3_MXFP4, 13, 40, 320, Q3_MXINT8, 1);
    check_mx_a8(Q3_MXFP4, 40, 300, 1024, Q3_MXINT8, 0);
    /* MXINT8 weights in the VNNI integer GEMM: the largest codes against
     * the largest inputs, zero and tiny blocks, several threads. */
    check_mx_a8(Q3_MXINT8, 20, 40, 256, Q3_MXINT8, 2);
    check_mx_a8(Q3_MXINT8, 33, 21, 192, Q3_MXINT8, 1);
    check_mx_a8(Q3_MXINT8, 128, 300, 512, Q3_MXINT8, 0);
    check_mx_a8(Q3_MXFP4, 64, 30, 256, Q3_MXFP8, 0);   /* two equal passes of 32 */
    check_mx_a8(Q3_MXFP8, 40, 37, 2048, Q3_MXFP8, 0); /* AMX: rows decoded between the k blocks, past the first ones */
    check_mx_a8(Q3_MXFP4, 40, 37, 2048, Q3_MXFP8, 0);
    check_mx_a8(Q3_MXFP8, 150, 21, 4096, Q3_MXFP8, 0);
    check_mx_a8(Q3_MXFP4, 40, 37, 2048, Q3_F32, 1); /* weight-only: AMX tiles, panels handed back to the broadcast GEMM */
    check_mx_a8(Q3_MXFP8, 150, 21, 2048, Q3_F32, 0);
    check_mx_a8(Q3_MXFP4, 20, 40, 256, Q3_MXFP8, 1);   /* panels falling back to fp32 */
    check_mx_a8(Q3_MXFP4, 11, 37, 256, Q3_F32, 0);     /* fp32 inputs in quads (the MX decoders' order) */
    check_mx_a8(Q3_MXFP8, 12, 21, 192, Q3_F32, 0);
    check_mx(Q3_MXFP8, 1, 37, 256);
    check_mx(Q3_MXFP4, 1, 37, 256);
    check_mx(Q3_MXFP8, 9, 40, 320);
    check_mx(Q3_MXFP8, 21, 40, 320); /* AVX-512: paired tokens, MX rows widened in blocks */
    check_mx(Q3_MXFP4, 24, 19, 1024);
    check_mx(Q3_MXFP4, 22, 19, 320); /* ... rows widened whole by the AVX2 decoders (K % 128 != 0) */
    /* AVX-512 MX products of 5-8 tokens that no tokens GEMV takes: remainder
     * tokens only (6), one vector against 16-row tiles (7, 8; MX only now). */
    check_mx(Q3_MXFP4, 6, 19, 320);
    check_mx(Q3_MXFP4, 8, 19, 320);
    check_mx(Q3_MXINT8, 7, 21, 192);
    check_mx(Q3_MXFP8, 5, 40, 320); /* a few tokens: one GEMV per token (AVX2) */
    check_mx(Q3_MXFP4, 8, 23, 256);
    check_mx(Q3_MXINT8, 5, 40, 320);
    check_mx(Q3_MXFP4, 9, 40, 320);
    check_mx(Q3_MXINT8, 9, 40, 320);
    check_mx(Q3_MXINT8, 130, 40, 320); /* more tokens than the broadcast GEMM takes: panels */
    check_mx(Q3_MXFP4, 1, 300, 2048); /* multi-threaded */
    check_mx(Q3_MXFP4, 1, 20, 96);    /* odd number of 32-blocks */
    check_mx(Q3_MXFP8, 1, 20, 96);
    check_mx(Q3_MXINT8, 1, 20, 96);
    /* The integer GEMV's limits: |weight| 128 (code 0x80) against |input| 127. */
    check_mx_a8(Q3_MXINT8, 1, 40, 256, Q3_MXINT8, 2);
    check_mx_a8(Q3_MXINT8, 3, 40, 256, Q3_MXINT8, 2);
    /* Tiny inputs against MXFP8 weights: the GEMV, the tokens GEMV, the broadcast GEMM (and on
     * AVX-512 BF16, the weight-only GEMV and the A8 kernels); rows of 3 blocks take the plain GEMV. */
    for (int i = 0; i < 3; i++) {
        check_mx_a8(Q3_MXFP8, (int[]){1, 4, 20}[i], 40, 256, Q3_F32, 3);
        check_mx_a8(Q3_MXFP8, (int[]){1, 4, 20}[i], 40, 256, Q3_MXFP8, 3);
    }
    check_mx_a8(Q3_MXFP8, 1, 40, 96, Q3_F32, 3);
}

/* A strided view (a transposed matrix) gives the same products as the contiguous one. */
static void test_strided(void) {
    enum { M = 20, K = 40, T = 3 };
    float w[M * K], wt[K * M], x[T * K], a[T * M], b[T * M];
    for (int i = 0; i < M * K; i++) w[i] = frand();
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++) wt[k * M + r] = w[r * K + k];
    for (int i = 0; i < T * K; i++) x[i] = frand();
    for (int t = 1; t <= T; t += 2) {
        q3_mat W = {.data = w, .dtype = Q3_F32, .rows = M, .cols = K};
        q3_mat Wt = {.data = wt, .dtype = Q3_F32, .rows = M, .cols = K, .rs = 1, .cs = M};
        q3_matmul(a, x, t, &W);
        q3_matmul(b, x, t, &Wt);
        double worst = 0;
        for (int i = 0; i < t * M; i++) worst = fmax(worst, fabs(a[i] - b[i]));
        CHECK(worst < 1e-5);
    }
    /* Rows a stride apart (a slice of wider rows), in every token kernel. */
    enum { KS = 64, KW = 80, MW = 24 };
    uint16_t wb[MW * KW], wc[MW * KS];
    float xw[40 * KS], c[40 * MW], d[40 * MW];
    for (int i = 0; i < MW * KW; i++) wb[i] = q3_f32_to_bf16(frand());
    for (int r = 0; r < MW; r++) memcpy(wc + r * KS, wb + r * KW, KS * sizeof *wc);
    for (int i = 0; i < 40 * KS; i++) xw[i] = frand();
    const int ts[] = {1, 5, 20, 40};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        q3_mat Ws = {.data = wb, .dtype = Q3_BF16, .rows = MW, .cols = KS, .rs = KW};
        q3_mat Wc = {.data = wc, .dtype = Q3_BF16, .rows = MW, .cols = KS};
        q3_matmul(c, xw, ts[i], &Ws);
        q3_matmul(d, xw, ts[i], &Wc);
        CHECK(memcmp(c, d, (size_t)ts[i] * MW * sizeof(float)) == 0);
    }
}

/* Attention against a direct softmax(q k^T / sqrt(D)) v in double, for
 * prefill (several tokens) and decode (one token, KV split in blocks). */
static void test_attention(void) {
    enum { H = 4, KVH = 2, D = 24, N = 300 };
    const size_t kvs = KVH * D;
    float *k = malloc(N * kvs * sizeof(float)), *v = malloc(N * kvs * sizeof(float));
    float *q = malloc((size_t)N * H * D * sizeof(float)), *out = malloc((size_t)N * H * D * sizeof(float));
    float *scratch = malloc(q3_attention_scratch(H, D, N) * sizeof(float));
    for (size_t i = 0; i < N * kvs; i++) k[i] = frand() * 3, v[i] = frand();
    for (size_t i = 0; i < (size_t)N * H * D; i++) q[i] = frand();
    const size_t ps = D, hs = (size_t)N * D; /* the engine's layout: head by head */
    q3_attn_layer L = {H, KVH, D, ps, hs, k, v};
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        double worst = 0;
        /* prefill rows 0..N-2 from position 0 (spans three key blocks), then the last as a decode step */
        q3_attention(out, q, N - 1, 0, &L, scratch);
        q3_attention(out + (size_t)(N - 1) * H * D, q + (size_t)(N - 1) * H * D, 1, N - 1, &L, scratch);
        static const int rows[] = {0, 1, 2, 3, 127, 128, 129, 200, N - 2, N - 1};
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            const int t = rows[ri];
            for (int h = 0; h < H; h++) {
                const float *qv = q + ((size_t)t * H + h) * D;
                double sc[N], mx = -1e300, z = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)qv[i] * k[j * ps + (h / 2) * hs + i];
                    sc[j] = d / sqrt(D);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= t; j++) z += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++) o += sc[j] / z * v[j * ps + (h / 2) * hs + i];
                    worst = fmax(worst, fabs(o - out[((size_t)t * H + h) * D + i]));
                }
            }
        }
        CHECK(worst < 1e-5);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
    free(k), free(v), free(q), free(out), free(scratch);
}

/* Decode (one query; the keys split into blocks across threads, merged in
 * a fixed order) against double precision, every ISA: head dims that take
 * the per-key path (24) and the GQA block kernels (16 to 256), a block
 * that ends mid-vector, one key, and a long context; groups of 1 to 16
 * heads (more than one att_decode call); both cache layouts (rows of all
 * KV heads interleaved, or head by head as the engine keeps them). */
static void check_decode(int H, int KVH, int D, int N, int head_major) {
    const size_t kvs = (size_t)KVH * D;
    float *k = malloc(N * kvs * sizeof(float)), *v = malloc(N * kvs * sizeof(float));
    float *q = malloc((size_t)H * D * sizeof(float)), *out = malloc((size_t)H * D * sizeof(float));
    float *scratch = malloc(q3_attention_scratch(H, D, N) * sizeof(float));
    double *sc = malloc(N * sizeof(double));
    for (size_t i = 0; i < N * kvs; i++) k[i] = frand() * 3, v[i] = frand();
    for (size_t i = 0; i < (size_t)H * D; i++) q[i] = frand();
    const size_t ps = head_major ? (size_t)D : kvs, hs = head_major ? (size_t)N * D : (size_t)D;
    const q3_attn_layer L = {H, KVH, D, ps, hs, k, v};
    const int g = H / KVH;
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        q3_attention(out, q, 1, N - 1, &L, scratch);
        double worst = 0;
        for (int h = 0; h < H; h++) {
            double mx = -1e300, z = 0;
            for (int j = 0; j < N; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)q[h * D + i] * k[j * ps + (h / g) * hs + i];
                sc[j] = d / sqrt(D);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < N; j++) z += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int j = 0; j < N; j++) o += sc[j] / z * v[j * ps + (h / g) * hs + i];
                worst = fmax(worst, fabs(o - out[h * D + i]));
            }
        }
        if (!CHECK(worst < 1e-5))
            fprintf(stderr, "  decode H %d KVH %d D %d N %d head_major %d (%s): %.3g\n", H, KVH, D, N, head_major,
                    q3_isa_name((q3_isa)isa), worst);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
    free(k), free(v), free(q), free(out), free(scratch), free(sc);
}

static void test_attention_decode(void) {
    static const int cases[][4] = {{4, 2, 24, 1100}, {32, 4, 128, 1100}, {32, 4, 128, 1}, {32, 4, 128, 141}, {8, 1, 64, 300},
                                   {6, 3, 48, 77},     {64, 4, 128, 300},  {40, 8, 128, 133}, {8, 8, 128, 200}, {12, 2, 256, 130},
                                   {12, 4, 16, 40}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int head_major = 0; head_major < 2; head_major++)
            check_decode(cases[i][0], cases[i][1], cases[i][2], cases[i][3], head_major);
}

/* Prefill tiles across shapes: head_dim 24/48/64/128, GQA ratios 1, 2, 8,
 * lengths that are not multiples of the tiles, and prefill continuing on a
 * filled cache (pos0 > 0). Every ISA against a double-precision reference
 * and against the scalar variant; the default ISA also 1 vs 2 threads,
 * bit for bit. */
static void test_attention_tiles(void) {
    static const int shapes[][3] = {{2, 2, 64}, {4, 2, 128}, {16, 2, 48}, {8, 1, 128}, {3, 3, 24}};
    static const int cases[][2] = {{2, 0}, {7, 0}, {65, 0}, {130, 0}, {300, 0}, {37, 200}, {129, 131}, {5, 290}, {1, 250}};
    enum { N = 300 };
    const int max_threads = omp_get_max_threads(), nthr = max_threads < 2 ? 2 : max_threads;
    omp_set_num_threads(nthr); /* the scratch is sized for the thread count in force */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int H = shapes[si][0], KVH = shapes[si][1], D = shapes[si][2], g = H / KVH;
        const size_t kvs = (size_t)KVH * D, qs = (size_t)H * D;
        float *k = malloc(N * kvs * sizeof(float)), *v = malloc(N * kvs * sizeof(float));
        float *q = malloc(N * qs * sizeof(float)), *out = malloc(N * qs * sizeof(float));
        float *ref = malloc(N * qs * sizeof(float)), *out2 = malloc(N * qs * sizeof(float));
        float *scratch = malloc(q3_attention_scratch(H, D, N) * sizeof(float));
        double *sc = malloc(N * sizeof(double)), *o = malloc((size_t)D * sizeof(double));
        for (size_t i = 0; i < N * kvs; i++) k[i] = frand() * 3, v[i] = frand();
        for (size_t i = 0; i < N * qs; i++) q[i] = frand();
        for (int ci2 = 0; ci2 < 2 * (int)(sizeof cases / sizeof cases[0]); ci2++) {
            const size_t ci = (size_t)ci2 / 2;
            const int head_major = ci2 % 2; /* both cache layouts, as in check_decode */
            const size_t ps = head_major ? (size_t)D : kvs, hs = head_major ? (size_t)N * D : (size_t)D;
            const q3_attn_layer L = {H, KVH, D, ps, hs, k, v};
            const int T = cases[ci][0], pos0 = cases[ci][1];
            double worst_ref = 0, worst_scalar = 0;
            for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
                q3_kernels_force((q3_isa)isa);
                if ((int)q3_kernels_isa() != isa) continue;
                q3_attention(out, q, T, pos0, &L, scratch);
                if (isa == Q3_ISA_SCALAR) memcpy(ref, out, (size_t)T * qs * sizeof(float));
                for (size_t i = 0; i < (size_t)T * qs; i++) worst_scalar = fmax(worst_scalar, fabs(out[i] - ref[i]));
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < H; h++) {
                        const float *qv = q + ((size_t)t * H + h) * D, *kv = k + (size_t)(h / g) * hs, *vv = v + (size_t)(h / g) * hs;
                        double mx = -1e300, z = 0;
                        for (int j = 0; j <= pos0 + t; j++) {
                            double d = 0;
                            for (int i = 0; i < D; i++) d += (double)qv[i] * kv[j * ps + i];
                            mx = fmax(mx, sc[j] = d / sqrt(D));
                        }
                        for (int i = 0; i < D; i++) o[i] = 0;
                        for (int j = 0; j <= pos0 + t; j++) {
                            z += sc[j] = exp(sc[j] - mx);
                            for (int i = 0; i < D; i++) o[i] += sc[j] * vv[j * ps + i];
                        }
                        for (int i = 0; i < D; i++)
                            worst_ref = fmax(worst_ref, fabs(o[i] / z - out[((size_t)t * H + h) * D + i]) / (1 + fabs(o[i] / z)));
                    }
            }
            if (!CHECK(worst_ref < 1e-5 && worst_scalar < 2e-6))
                fprintf(stderr, "  H %d KVH %d D %d T %d pos0 %d head_major %d: vs double %.3g, vs scalar %.3g\n", H, KVH, D,
                        T, pos0, head_major, worst_ref, worst_scalar);
            /* Same bits whatever the thread count (the default ISA is in force). */
            omp_set_num_threads(1);
            q3_attention(out, q, T, pos0, &L, scratch);
            omp_set_num_threads(nthr);
            q3_attention(out2, q, T, pos0, &L, scratch);
            CHECK(memcmp(out, out2, (size_t)T * qs * sizeof(float)) == 0);
        }
        free(k), free(v), free(q), free(out), free(ref), free(out2), free(scratch), free(sc), free(o);
    }
    omp_set_num_threads(max_threads);
}

/* The AMX tile products of prefill attention (attention_amx.c), which
 * take prompts of 512 keys or more and at least 4 tiles per KV head: GQA 8
 * (32-token tiles) and 2 (128-token tiles), head_dim 128 and 64, from
 * position 0 and on a filled cache with a partial last key chunk; against
 * the scalar kernels on every row and double precision on sampled rows,
 * and 1 against 2 threads bit for bit. */
static void test_attention_tile_products(void) {
    if (!amx_table("attention tile checks")) return;
    static const int cases[][5] = {/* H, KVH, D, T, pos0 */ {8, 1, 128, 600, 0}, {8, 1, 128, 197, 440}, {4, 2, 64, 530, 0}};
    enum { N = 640 };
    const int max_threads = omp_get_max_threads(), nthr = max_threads < 2 ? 2 : max_threads;
    omp_set_num_threads(nthr);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int H = cases[ci][0], KVH = cases[ci][1], D = cases[ci][2], T = cases[ci][3], pos0 = cases[ci][4], g = H / KVH;
        const size_t qs = (size_t)H * D, hs = (size_t)N * D;
        float *k = malloc(N * (size_t)KVH * D * sizeof(float)), *v = malloc(N * (size_t)KVH * D * sizeof(float));
        float *q = malloc((size_t)T * qs * sizeof(float)), *out = malloc((size_t)T * qs * sizeof(float));
        float *ref = malloc((size_t)T * qs * sizeof(float)), *out1 = malloc((size_t)T * qs * sizeof(float));
        float *scratch = malloc(q3_attention_scratch(H, D, N) * sizeof(float));
        double *sc = malloc(N * sizeof(double)), *o = malloc((size_t)D * sizeof(double));
        for (size_t i = 0; i < (size_t)N * KVH * D; i++) k[i] = frand() * 3, v[i] = frand();
        for (size_t i = 0; i < (size_t)T * qs; i++) q[i] = frand();
        const q3_attn_layer L = {H, KVH, D, (size_t)D, hs, k, v};
        q3_kernels_force(Q3_ISA_SCALAR);
        q3_attention(ref, q, T, pos0, &L, scratch);
        q3_kernels_force(Q3_ISA_AMX);
        q3_attention(out, q, T, pos0, &L, scratch);
        double worst_scalar = 0, worst_ref = 0;
        for (size_t i = 0; i < (size_t)T * qs; i++) worst_scalar = fmax(worst_scalar, fabs(out[i] - ref[i]));
        for (int t = 0; t < T; t += 37)
            for (int h = 0; h < H; h++) {
                const float *qv = q + ((size_t)t * H + h) * D, *kv = k + (size_t)(h / g) * hs, *vv = v + (size_t)(h / g) * hs;
                double mx = -1e300, z = 0;
                for (int j = 0; j <= pos0 + t; j++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)qv[i] * kv[(size_t)j * D + i];
                    mx = fmax(mx, sc[j] = d / sqrt(D));
                }
                for (int i = 0; i < D; i++) o[i] = 0;
                for (int j = 0; j <= pos0 + t; j++) {
                    z += sc[j] = exp(sc[j] - mx);
                    for (int i = 0; i < D; i++) o[i] += sc[j] * vv[(size_t)j * D + i];
                }
                for (int i = 0; i < D; i++)
                    worst_ref = fmax(worst_ref, fabs(o[i] / z - out[((size_t)t * H + h) * D + i]) / (1 + fabs(o[i] / z)));
            }
        if (!CHECK(worst_ref < 1e-5 && worst_scalar < 2e-6))
            fprintf(stderr, "  tiles H %d KVH %d D %d T %d pos0 %d: vs double %.3g, vs scalar %.3g\n", H, KVH, D, T, pos0, worst_ref,
                    worst_scalar);
        omp_set_num_threads(1);
        q3_attention(out1, q, T, pos0, &L, scratch);
        omp_set_num_threads(nthr);
        CHECK(memcmp(out, out1, (size_t)T * qs * sizeof(float)) == 0);
        free(k), free(v), free(q), free(out), free(ref), free(out1), free(scratch), free(sc), free(o);
    }
    omp_set_num_threads(max_threads);
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

static void test_rmsnorm_softmax_swiglu(void) {
    float x[5] = {1, -2, 3, -4, 5}, w[5] = {1, 0.5f, 2, 1, -1}, out[5];
    q3_rmsnorm(out, x, w, 5, 1e-6f);
    double ms = (1 + 4 + 9 + 16 + 25) / 5.0, inv = 1 / sqrt(ms + 1e-6);
    for (int i = 0; i < 5; i++) CHECK_NEAR(out[i], x[i] * inv * w[i], 1e-6);
    float p[4] = {1000, 1001, 999, -5};
    q3_softmax(p, 4);
    double z = exp(0) + exp(1) + exp(-1) + exp(-1005);
    CHECK_NEAR(p[1], exp(1) / z, 1e-6);
    CHECK_NEAR(p[0] + p[1] + p[2] + p[3], 1, 1e-6);
    float g[3] = {-3, 0, 2}, u[3] = {2, 5, -1}, s[3];
    q3_swiglu(s, g, u, 3);
    for (int i = 0; i < 3; i++) CHECK_NEAR(s[i], g[i] / (1 + exp(-g[i])) * u[i], 1e-6);
}

static void test_rope_rotate_half(void) {
    /* Rotate-half pairs element i with i + d/2 (not adjacent elements). */
    float v[4] = {1, 2, 3, 4}, c[2] = {cosf(0.3f), cosf(0.7f)}, s[2] = {sinf(0.3f), sinf(0.7f)};
    q3_rope(v, c, s, 4);
    CHECK_NEAR(v[0], 1 * cos(0.3) - 3 * sin(0.3), 1e-6);
    CHECK_NEAR(v[2], 3 * cos(0.3) + 1 * sin(0.3), 1e-6);
    CHECK_NEAR(v[1], 2 * cos(0.7) - 4 * sin(0.7), 1e-6);
    CHECK_NEAR(v[3], 4 * cos(0.7) + 2 * sin(0.7), 1e-6);
}

/* The fused add + RMSNorm + MXFP8 copy equals the unfused composition bit
 * for bit, with and without the add, with the copy in place or over delta. */
static void test_add_rmsnorm_mx8(void) {
    enum { N = 320 };
    float x0[N], d0[N], w[N], x1[N], x2[N], d2[N], out1[N], q1[N], out2[N], x3[N], q3[N];
    for (int i = 0; i < N; i++) x0[i] = frand() * (i < 32 ? 1e-3f : 4.0f), d0[i] = frand(), w[i] = 0.5f + frand();
    memcpy(x1, x0, sizeof x0), memcpy(x2, x0, sizeof x0), memcpy(d2, d0, sizeof d0), memcpy(x3, x0, sizeof x0);
    q3_add_rmsnorm(x1, d0, w, out1, N, 1e-6f);
    CHECK(q3_mx_fake_quant_row(Q3_MXFP8, out1, N, q1) == 0);
    q3_add_rmsnorm_mx(x2, d2, w, out2, d2, N, 1e-6f, Q3_MXFP8); /* the copy over delta, as mlp_block does */
    CHECK(!memcmp(x1, x2, sizeof x1) && !memcmp(out1, out2, sizeof out1) && !memcmp(q1, d2, sizeof q1));
    q3_rmsnorm(out1, x0, w, N, 1e-6f);
    CHECK(q3_mx_fake_quant_row(Q3_MXFP8, out1, N, q1) == 0);
    q3_add_rmsnorm_mx(x3, NULL, w, NULL, q3, N, 1e-6f, Q3_MXFP8);
    CHECK(!memcmp(x3, x0, sizeof x0) && !memcmp(q1, q3, sizeof q1));
    /* An infinite input: the norm scales everything else to zero and the
     * infinity itself to NaN, whose block is copied unquantized. */
    x3[70] = INFINITY;
    q3_add_rmsnorm_mx(x3, NULL, w, out1, q3, N, 1e-6f, Q3_MXFP8);
    int ok = isnan(q3[70]) && isnan(out1[70]);
    for (int i = 0; i < N; i++)
        if (i != 70) ok &= q3[i] == 0 && out1[i] == 0;
    CHECK(ok);
}

/* The activation helpers of every ISA: MXFP8 and MXINT8 fake quantization
 * bit for bit against quant/mx.c (blocks of every scale range: tiny ones
 * below the fast path's range, huge ones above it, zeros, subnormals,
 * values at the rounding ties of the element format and at its top,
 * negatives rounding to zero), and NaN/Inf rejected without a write;
 * swiglu against double precision, large and tiny gates included. */
static void test_activation_helpers(void) {
    enum { N = 32 * 40 };
    static float x[2][N], want[2][N], got[N];
    const q3_dtype acts[2] = {Q3_MXFP8, Q3_MXINT8};
    const float scales[] = {1.0f, 1e-35f, 3e37f, 0.0f, 1e-40f, 448.0f, 1e-3f, 7.5e30f};
    for (int a = 0; a < 2; a++) {
        for (int b = 0; b < N / 32; b++)
            for (int i = 0; i < 32; i++) {
                float v = frand() * scales[b % 8];
                if (b % 5 == 2) /* halfway between E4M3 codes / int8 codes (block max 1.x) */
                    v = a ? ((float)((int)(frand() * 64)) + 0.5f) / 64 : (float)((int)(frand() * 64)) * 0.0625f + 0.03125f;
                if (b % 7 == 3 && i == 5) v = a ? 127.5f / 64 : 464.0f; /* rounds up past the top: clamped */
                if (b % 9 == 4 && i == 7) v = -1e-3f * scales[b % 8];   /* rounds to zero */
                x[a][b * 32 + i] = v;
            }
        CHECK(q3_mx_fake_quant_row(acts[a], x[a], N, want[a]) == 0);
    }
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        for (int a = 0; a < 2; a++) {
            memset(got, 0, sizeof got);
            CHECK(q3_act_mx(acts[a], x[a], N, got) == 0);
            CHECK(!memcmp(got, want[a], sizeof got));
            memcpy(got, x[a], sizeof got);
            CHECK(q3_act_mx(acts[a], got, N, got) == 0); /* in place, as q3_act_quant runs it */
            CHECK(!memcmp(got, want[a], sizeof got));
            float bad[64];
            memcpy(bad, x[a], sizeof bad);
            bad[40] = NAN;
            memset(got, 0, sizeof bad);
            CHECK(q3_act_mx(acts[a], bad, 64, got) == -1);
            bad[40] = -INFINITY;
            CHECK(q3_act_mx(acts[a], bad, 64, got) == -1);
            float zero[64] = {0};
            CHECK(!memcmp(got, zero, sizeof zero));
        }
        enum { S = 203 };
        float g[S], u[S], s[S];
        for (int i = 0; i < S; i++) g[i] = frand() * (i % 4 == 0 ? 120.0f : i % 4 == 1 ? 1e-6f : 8.0f), u[i] = frand() * 3;
        q3_swiglu(s, g, u, S);
        double worst = 0;
        for (int i = 0; i < S; i++) {
            const double ref = g[i] / (1 + exp(-(double)g[i])) * u[i];
            worst = fmax(worst, fabs(s[i] - ref) / fmax(fabs(ref), 1e-30));
        }
        CHECK(worst < 2e-6);
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
}

/* The GEMVs keep a copy of their loops per prefetch level (prefetch.h),
 * and a CPU runs only the one its vendor gets: the matmul tests again with
 * the other. */
static void test_other_prefetch_level(void) {
    q3_kernels_init();
    q3_pf_to_l2 = !q3_pf_to_l2;
    test_matmul();
    test_mx_matmul();
    test_mx_tokens_match_gemv();
    q3_pf_to_l2 = !q3_pf_to_l2;
}

int main(void) {
    test_activation_helpers();
    test_add_rmsnorm_mx8();
    test_f16_all_codes();
    test_bf16_rounding();
    test_matmul();
    test_gemv_prefetch_variants();
    test_pass_threads();
    test_merged_glu();
    test_strided();
    test_i8_prep();
    test_mx_matmul();
    test_a8_planes();
    test_amx_bf16_exact();
    test_amx_wo_exact();
    test_amx_chunked_panels();
    test_amx_i8_matches_vnni();
    test_i8_gemm_variants_agree();
    test_mx_tokens_match_gemv();
    test_attention();
    test_attention_decode();
    test_attention_tiles();
    test_attention_tile_products();
    test_rmsnorm_softmax_swiglu();
    test_rope_rotate_half();
    test_other_prefetch_level();
    UNIT_MAIN_END();
}
