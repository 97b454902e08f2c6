/* Kernel micro-benchmark: GEMV bandwidth (one token, BF16 weights) and GEMM
 * GFLOP/s per ISA. Usage: build/kernel_bench [rows cols tokens reps]
 * MX GEMV (MXFP4 / MXFP8 / MXINT8 weights; fp32, MXFP8 (A8) and MXINT8
 * (A8i) inputs) and a GEMM of
 * `tokens` (default 32, at most 128) per ISA:
 *   build/kernel_bench mx [rows cols reps tokens]
 * Decode MoE passes (8 of E MXFP4 experts per token, gate+up then down;
 * MXFP8 then MXINT8 inputs):
 *   build/kernel_bench moe [experts hidden ffn tokens]
 * Prefill MoE passes of a P-token prompt (8 of E experts per token, BF16,
 * or MXFP4 / MXFP8 with MXFP8 inputs: scheme bf16, w4a8 or w8a8; skew > 1
 * draws expert u^skew * E for uniform u, so that some experts get few
 * tokens and some many, as in the deeper layers of a model, and prints how
 * many experts got how many tokens; repetition r runs layer r % layers of
 * as many sets of experts, so that MX weights, which fit a large L3, are
 * read from DRAM as in a model):
 *   build/kernel_bench moe-prefill [experts hidden ffn P reps skew scheme layers]
 * This build's AVX-512 broadcast GEMM against another git revision's, the
 * two alternating in one process over the expert products of a P-token
 * prefill (one thread; `make gemm-ab AB_REV=REV` builds build/gemm_ab;
 * with AB_ISA=avx2 the AVX2 one, run with Q3MOE_ISA=avx2):
 *   build/gemm_ab gemm-ab [P skew reps]
 * Causal prefill attention of one layer, then decode steps at its end,
 * the ISAs alternating rep by rep, best and median of the reps (default:
 * Qwen3-30B-A3B heads; Q3MOE_ISA=NAME runs only that ISA;
 * Q3_BENCH_DECODE_ONLY=1 skips the prefill; decode visits `layers` caches
 * in turn, so that more than the last-level cache is streamed as in a model):
 *   build/kernel_bench attn [positions heads kv_heads head_dim reps layers]
 * The BF16 GEMV with its software prefetch and without (two rows at a
 * time; in force on Zen 4), each beside a plain read of its bytes,
 * alternating in one process, for the AVX-512 and the AVX2 tables where the
 * CPU has them (rows split evenly over the threads; transparent huge pages):
 *   build/kernel_bench prefetch [rows cols pairs]
 * The BF16P GEMV against the BF16 one on the same values (normal weights,
 * sd 0.02), alternating in one process, per table (AVX2, AVX-512 BW), with
 * and without software prefetch, GEMVs in GB/s of BF16 bytes (what a BF16
 * GEMV of that speed would read), best of each round, beside a plain read
 * of the packed bytes:
 *   build/kernel_bench bf16p [rows cols rounds] */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_machine.h"
#include "kernels/attention.h"
#include "io/safetensors.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "quant/bf16p.h"
#include "quant/mx.h"

#include <sys/mman.h>
/* Weight buffers aligned as the engine's .q3m data is (malloc's 16-byte
 * offset splits every 64-byte load in two and halves the MXFP8 rate), in
 * 4 KiB pages, or transparent huge pages with Q3_BENCH_THP=1. */
static void *big_alloc(size_t n) {
    const size_t huge = (size_t)2 << 20;
    void *p = aligned_alloc(huge, (n + huge - 1) / huge * huge);
    if (p && getenv("Q3_BENCH_THP") && atoi(getenv("Q3_BENCH_THP"))) madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
    return p;
}

/* Seconds to read n bytes at p with all threads (best of reps), by `q3moe
 * bench`'s read pass (each thread a contiguous share, AVX2 sums; plain and
 * prefetching in turn): the streaming limit a GEMV over the same buffer is
 * compared with. (A scalar
 * XOR loop here before topped out near 28 GB/s on a Zen 4 whose memory gave
 * 60, below the GEMVs it was the yardstick for.) */
static double read_time(const void *p, size_t n, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double gbs = bench_read_pass(p, n, r & 1);
        if (gbs > 0 && n / (gbs * 1e9) < best) best = n / (gbs * 1e9);
    }
    return best;
}

static int mx_bench(int M, int K, int reps, int T) {
    if (T < 1 || T > 128) T = 32;
    float *row = malloc((size_t)K * 4), *x0 = malloc((size_t)K * 4), *x = malloc((size_t)K * 4), *out = malloc((size_t)M * T * 4);
    for (int k = 0; k < K; k++) x0[k] = (float)((k * 40503u) % 1000) / 500.0f - 1.0f;
    float *xs = malloc((size_t)T * K * 4);
    static const char *act_name[] = {"   ", " A8", " A8i"};
    const q3_dtype dts[] = {Q3_MXFP4, Q3_MXFP8, Q3_MXINT8};
    for (int f = 0; f < 3; f++) {
        const q3_dtype dt = dts[f];
        const size_t eb = q3_mx_elem_bytes(dt, (size_t)K), sb = (size_t)K / 32;
        uint8_t *el = big_alloc((size_t)M * eb), *sc = big_alloc((size_t)M * sb);
        for (int r = 0; r < M; r++) {
            for (int k = 0; k < K; k++) row[k] = (float)(((size_t)r * K + k) * 2654435761u % 1000) / 1000.0f - 0.5f;
            if (q3_mx_quantize_row(dt, row, (size_t)K, sc + (size_t)r * sb, el + (size_t)r * eb)) return 1;
        }
        for (int isa = Q3_ISA_SCALAR + 1; isa < Q3_ISA_COUNT; isa++) {
            q3_kernels_force((q3_isa)isa);
            if ((int)q3_kernels_isa() != isa) continue;
            for (int act = 0; act < 3; act++) { /* inputs: fp32, MXFP8, MXINT8 */
                if (act == 1 && dt == Q3_MXINT8) continue; /* no scheme pairs these */
                memcpy(x, x0, (size_t)K * 4);
                if (act && q3_mx_fake_quant_row(act == 1 ? Q3_MXFP8 : Q3_MXINT8, x, (size_t)K, x)) return 1;
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < K; k++) xs[(size_t)t * K + k] = x[(k + 32 * t) % K];
                q3_mat W = {.data = el, .dtype = dt, .rows = M, .cols = K, .scales = sc, .a8 = act > 0, .ai8 = act == 2};
                double best = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t0 = omp_get_wtime();
                    q3_matmul(out, x, 1, &W);
                    double t1 = omp_get_wtime();
                    if (t1 - t0 < best) best = t1 - t0;
                }
                const double rd = read_time(el, (size_t)M * eb, reps) + read_time(sc, (size_t)M * sb, reps);
                printf("%-10s %s%-4s gemv %dx%d: %.2f ms, %.1f G elements/s, %.1f GB/s (%.0f %% of a plain read of the "
                       "same bytes)\n",
                       q3_isa_name(q3_kernels_isa()), q3_dtype_name(dt), act_name[act], M, K, best * 1e3,
                       (double)M * K / best / 1e9, (double)M * (eb + sb) / best / 1e9, 100 * rd / best);
                /* An expert-sized GEMM: T tokens over the first rows. */
                const int Mg = M < 1536 ? M : 1536;
                q3_mat Wg = W;
                Wg.rows = Mg;
                best = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t0 = omp_get_wtime();
                    q3_matmul(out, xs, T, &Wg);
                    double t1 = omp_get_wtime();
                    if (t1 - t0 < best) best = t1 - t0;
                }
                printf("%-10s %s%-4s gemm T=%d %dx%d: %.1f GFLOP/s\n", q3_isa_name(q3_kernels_isa()), q3_dtype_name(dt),
                       act_name[act], T, Mg, K, 2.0 * T * Mg * K / best / 1e9);
            }
        }
        free(el), free(sc);
    }
    free(row), free(x0), free(x), free(xs), free(out);
    return 0;
}

/* Decode MoE passes as q3_forward runs them: 8 of E experts per token, gate
 * and up (F x H) in one matmul pass, down (H x F) in the next, MXFP4 A8,
 * weights spread over E experts so that every token reads them from DRAM. */
static int moe_bench(int E, int H, int F, int tokens) {
    const q3_dtype dt = Q3_MXFP4;
    q3_mat *mats = calloc((size_t)3 * E, sizeof *mats);
    float *row = malloc((size_t)(H > F ? H : F) * 4), *x = malloc((size_t)H * 4), *h = malloc((size_t)2 * 8 * F * 4);
    float *y = malloc((size_t)8 * H * 4);
    if (!mats || !row || !x || !h || !y) return 1;
    for (int i = 0; i < 3 * E; i++) {
        const int R = i % 3 == 2 ? H : F, K = i % 3 == 2 ? F : H;
        const size_t eb = q3_mx_elem_bytes(dt, (size_t)K), sb = (size_t)K / 32;
        uint8_t *el = big_alloc((size_t)R * eb), *sc = big_alloc((size_t)R * sb);
        if (!el || !sc) return 1;
        for (int r = 0; r < R; r++) {
            for (int k = 0; k < K; k++) row[k] = (float)(((size_t)(i * 7 + r) * K + k) * 2654435761u % 1000) / 1000.0f - 0.5f;
            if (q3_mx_quantize_row(dt, row, (size_t)K, sc + (size_t)r * sb, el + (size_t)r * eb)) return 1;
        }
        mats[i] = (q3_mat){.data = el, .dtype = dt, .rows = R, .cols = K, .scales = sc, .a8 = 1};
    }
    const double w13_bytes = 8.0 * 2 * F * (q3_mx_elem_bytes(dt, (size_t)H) + H / 32);
    const double down_bytes = 8.0 * H * (q3_mx_elem_bytes(dt, (size_t)F) + F / 32);
    for (int run = 0; run < 2 * Q3_ISA_COUNT; run++) { /* every ISA with MXFP8 (A8), then MXINT8 (A8i) inputs */
        const int isa = run % Q3_ISA_COUNT, i8 = run >= Q3_ISA_COUNT;
        if (isa == Q3_ISA_SCALAR) continue;
        const q3_dtype act = i8 ? Q3_MXINT8 : Q3_MXFP8;
        for (int i = 0; i < 3 * E; i++) mats[i].ai8 = i8;
        for (int k = 0; k < H; k++) x[k] = (float)((k * 40503u) % 1000) / 500.0f - 1.0f;
        if (q3_mx_fake_quant_row(act, x, (size_t)H, x)) return 1;
        for (int k = 0; k < 8 * F; k++) h[k] = (float)((k * 40503u) % 1000) / 5000.0f - 0.1f;
        if (q3_mx_fake_quant_row(act, h, (size_t)8 * F, h)) return 1;
        q3_kernels_force((q3_isa)isa);
        const char *only = getenv("Q3MOE_ISA");
        if ((int)q3_kernels_isa() != isa || (only && strcmp(only, q3_isa_name((q3_isa)isa)))) continue;
        double t13 = 0, tdn = 0;
        unsigned seed = 12345;
        for (int t = 0; t < tokens; t++) {
            q3_mm_job jobs[8];
            int ex[8];
            for (int i = 0; i < 8; i++) { /* gate and up merged, as the model runs them */
                seed = seed * 1103515245u + 12345u;
                ex[i] = (int)((seed >> 8) % (unsigned)E);
                jobs[i] = (q3_mm_job){h + (size_t)(8 + i) * F, (size_t)F, x, (size_t)H, 1, &mats[3 * ex[i]], &mats[3 * ex[i] + 1]};
            }
            double t0 = omp_get_wtime();
            q3_matmul_jobs(jobs, 8);
            double t1 = omp_get_wtime();
            for (int i = 0; i < 8; i++)
                jobs[i] = (q3_mm_job){y + (size_t)i * H, (size_t)H, h + (size_t)i * F, (size_t)F, 1, &mats[3 * ex[i] + 2], NULL};
            q3_matmul_jobs(jobs, 8);
            double t2 = omp_get_wtime();
            if (t >= 4) t13 += t1 - t0, tdn += t2 - t1; /* the first tokens warm up */
        }
        const int n = tokens - 4;
        printf("%-10s MoE decode, 8 of %d experts, H %d F %d, MXFP4 %s: gate+up pass %.1f us (%.1f GB/s), down pass %.1f us "
               "(%.1f GB/s)  (threads %d)\n",
               q3_isa_name(q3_kernels_isa()), E, H, F, i8 ? "A8i" : "A8", t13 / n * 1e6, w13_bytes * n / t13 / 1e9, tdn / n * 1e6,
               down_bytes * n / tdn / 1e9, omp_get_max_threads());
    }
    return 0;
}

/* Prefill MoE passes as q3_forward runs them for a prompt of P tokens:
 * each token routed to 8 of E BF16 experts (a fixed pseudo-random draw, so
 * expert token counts vary as a router's would), gate and up of every
 * expert in one matmul pass, down in the next; weights streamed from DRAM. */
/* cnt[e]: the tokens of a P-token prompt routed to expert e, 8 distinct
 * experts per token, drawn as u^skew * E for uniform u (skew 1: uniform). */
static void draw_experts(int *cnt, int E, int P, double skew) {
    unsigned seed = 12345;
    for (int t = 0; t < P; t++) {
        int chosen[8];
        for (int k = 0; k < 8 && k < E;) {
            seed = seed * 1103515245u + 12345u;
            const double u = (double)((seed >> 8) % 1000000u) / 1e6;
            const int e = skew == 1.0 ? (int)((seed >> 8) % (unsigned)E) : (int)(E * pow(u, skew)) % E;
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= chosen[j] == e;
            if (!dup) chosen[k++] = e, cnt[e]++;
        }
    }
}

/* Random MX codes for a bench's weights (quantizing gigabytes of rows took
 * minutes): any E2M1 code, E4M3 codes but NaN, block scales 2^-6 .. 2^1
 * (codes 121-128, inside what the A8 kernels fold into bf16). */
static void fill_mx(uint8_t *el, size_t nel, uint8_t *sc, size_t nsc, q3_dtype dt) {
    uint64_t z = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nel; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        uint8_t c = (uint8_t)(z >> 56);
        if (dt == Q3_MXFP8 && (c & 0x7F) == 0x7F) c ^= 1;
        el[i] = c;
    }
    for (size_t i = 0; i < nsc; i++) sc[i] = (uint8_t)(121 + (i * 2654435761u >> 7) % 8);
}

static int moe_prefill_bench(int E, int H, int F, int P, int reps, double skew, const char *scheme, int layers) {
    if (E < 8 || H < 1 || F < 1 || P < 1 || reps < 1 || layers < 1 || !(skew > 0.0 && skew <= 16.0)) {
        fprintf(stderr, "kernel_bench moe-prefill: need experts >= 8, positive sizes, reps and layers, 0 < skew <= 16\n");
        return 2;
    }
    const q3_dtype dt = !strcmp(scheme, "bf16") ? Q3_BF16 : !strcmp(scheme, "w4a8") ? Q3_MXFP4 : !strcmp(scheme, "w8a8") ? Q3_MXFP8 : Q3_F32;
    if (dt == Q3_F32) {
        fprintf(stderr, "kernel_bench moe-prefill: scheme '%s': expected bf16, w4a8 or w8a8\n", scheme);
        return 2;
    }
    const int mx = dt != Q3_BF16;
    if (mx && (H % 128 || F % 128)) {
        fprintf(stderr, "kernel_bench moe-prefill: MX experts need hidden and ffn multiples of 128\n");
        return 2;
    }
    const size_t nmat = (size_t)layers * E * 3, per = (size_t)F * H; /* elements per matrix */
    const size_t eb = mx ? q3_mx_elem_bytes(dt, per) : per * 2, sb = mx ? per / 32 : 0;
    uint8_t *w = big_alloc(nmat * eb), *sc = mx ? big_alloc(nmat * sb) : NULL;
    int *cnt = calloc((size_t)E, sizeof *cnt);
    if (!w || (mx && !sc) || !cnt) return 1;
    if (mx) fill_mx(w, nmat * eb, sc, nmat * sb, dt);
    else
        for (size_t i = 0; i < nmat * per; i++) ((uint16_t *)w)[i] = q3_f32_to_bf16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    draw_experts(cnt, E, P, skew);
    float *x = malloc((size_t)P * 8 * H * 4), *h = malloc((size_t)P * 8 * 2 * F * 4), *y = malloc((size_t)P * 8 * H * 4);
    if (!x || !h || !y) return 1;
    for (size_t i = 0; i < (size_t)P * 8 * H; i++) x[i] = (float)((i * 40503u) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; i < (size_t)P * 8 * 2 * F; i++) h[i] = (float)((i * 40503u) % 1000) / 5000.0f - 0.1f;
    if (mx) { /* A8: the inputs as MXFP8 values */
        for (size_t t = 0; t < (size_t)P * 8; t++)
            if (q3_mx_fake_quant_row(Q3_MXFP8, x + t * H, (size_t)H, x + t * H) ||
                q3_mx_fake_quant_row(Q3_MXFP8, h + t * F, (size_t)F, h + t * F))
                return 1;
    }
    q3_mat *mats = calloc(nmat, sizeof *mats);
    q3_mm_job *jobs = calloc((size_t)2 * E, sizeof *jobs);
    if (!mats || !jobs) return 1;
    for (size_t i = 0; i < nmat; i++) {
        const int m = (int)(i % 3);
        mats[i] = (q3_mat){.data = w + i * eb, .dtype = dt, .rows = m < 2 ? F : H, .cols = m < 2 ? H : F,
                           .scales = mx ? sc + i * sb : NULL, .a8 = mx};
    }
    if (skew != 1.0) {
        static const int upto[] = {0, 8, 16, 22, 32, 38, 48, INT32_MAX};
        int n[8] = {0};
        for (int e = 0; e < E; e++) {
            int b = 0;
            while (cnt[e] > upto[b]) b++;
            n[b]++;
        }
        printf("experts by tokens (skew %.2f): 0: %d, 1-8: %d, 9-16: %d, 17-22: %d, 23-32: %d, 33-38: %d, 39-48: %d, more: %d\n",
               skew, n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]);
    }
    double f13 = 0, fdn = 0, bytes = 0;
    for (int e = 0; e < E; e++) f13 += 2.0 * cnt[e] * 2 * F * H, fdn += 2.0 * cnt[e] * F * H, bytes += cnt[e] ? 3.0 * (eb + sb) : 0;
    double b13 = 1e30, bdn = 1e30;
    for (int r = 0; r < reps; r++) {
        const q3_mat *lm = mats + (size_t)(r % layers) * E * 3; /* layer by layer, as a model streams them */
        int n = 0;
        size_t off = 0;
        for (int e = 0; e < E; e++) {
            if (!cnt[e]) continue;
            jobs[n++] = (q3_mm_job){h + off * F, (size_t)F, x + off * H, (size_t)H, cnt[e], &lm[3 * e], &lm[3 * e + 1]};
            off += (size_t)cnt[e];
        }
        double t0 = omp_get_wtime();
        q3_matmul_jobs(jobs, n);
        double t1 = omp_get_wtime();
        n = 0, off = 0;
        for (int e = 0; e < E; e++) {
            if (!cnt[e]) continue;
            jobs[n++] = (q3_mm_job){y + off * H, (size_t)H, h + off * F, (size_t)F, cnt[e], &lm[3 * e + 2], NULL};
            off += (size_t)cnt[e];
        }
        q3_matmul_jobs(jobs, n);
        double t2 = omp_get_wtime();
        if (t1 - t0 < b13) b13 = t1 - t0;
        if (t2 - t1 < bdn) bdn = t2 - t1;
    }
    printf("%-10s MoE prefill, %d tokens x 8 of %d %s experts, H %d F %d, %d layer%s: gate+up %.1f ms (%.1f GFLOP/s), down %.1f ms "
           "(%.1f GFLOP/s); weights %.2f GB/s over both  (threads %d)\n",
           q3_isa_name(q3_kernels_isa()), P, E, scheme, H, F, layers, layers > 1 ? "s" : "", b13 * 1e3, f13 / b13 / 1e9, bdn * 1e3,
           fdn / bdn / 1e9, bytes / (b13 + bdn) / 1e9, omp_get_max_threads());
    free(w), free(sc), free(cnt), free(x), free(h), free(y), free(mats), free(jobs);
    return 0;
}

/* Causal prefill attention of one layer over P positions, fed in chunks of
 * 1024 tokens as q3_forward does, per ISA (scalar skipped: too slow). */
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Query rows per attention call in prefill: q3_forward's chunk. */
enum { ATT_CHUNK = 1024 };

/* Seconds of the causal prefill of P positions, in chunks of ATT_CHUNK as
 * q3_forward feeds them, with the kernels in force. */
static double attn_prefill_time(float *out, const float *q, int P, const q3_attn_layer *L, float *scratch) {
    const double t0 = omp_get_wtime();
    for (int c0 = 0; c0 < P; c0 += ATT_CHUNK) q3_attention(out, q, P - c0 < ATT_CHUNK ? P - c0 : ATT_CHUNK, c0, L, scratch);
    return omp_get_wtime() - t0;
}

/* Seconds per layer and token of decode steps at the last 64 positions,
 * each over every layer's K/V (from memory when they exceed the caches). */
static double attn_decode_time(float *out, const float *q, int P, int layers, const q3_attn_layer *L, size_t per,
                               float *scratch) {
    const double t0 = omp_get_wtime();
    for (int pos = P - 64; pos < P; pos++)
        for (int l = 0; l < layers; l++) {
            q3_attn_layer Ll = *L;
            Ll.k += (size_t)l * per, Ll.v += (size_t)l * per;
            q3_attention(out, q, 1, pos, &Ll, scratch);
        }
    return (omp_get_wtime() - t0) / 64 / layers;
}

/* Prefill and decode attention per ISA (scalar skipped: too slow), the
 * ISAs alternating rep by rep so that a noisy host slows them alike; best
 * and median of the reps, and each median against the first ISA's. */
static int attn_bench(int P, int H, int KVH, int D, int reps, int layers) {
    enum { MAX_REPS = 64 };
    if (P < 65 || H < 1 || KVH < 1 || H % KVH || D < 1 || D > Q3_MAX_HEAD_DIM || reps < 1 || reps > MAX_REPS || layers < 1) {
        fprintf(stderr, "kernel_bench attn: need positions > 64, heads a multiple of kv_heads, head_dim <= %d, 1 <= reps <= %d, "
                        "layers >= 1\n", Q3_MAX_HEAD_DIM, MAX_REPS);
        return 2;
    }
    const size_t kvs = (size_t)KVH * D, qs = (size_t)H * D;
    const size_t per = (size_t)P * kvs; /* floats of one layer's K (or V) */
    /* Aligned as the engine's KV cache is: from malloc (16 bytes past a
     * page) every 64-byte load of the AVX-512 kernel split across two
     * lines, which made it look 1.3-1.4x slower than it runs in the model. */
    float *k = big_alloc((size_t)layers * per * 4), *v = big_alloc((size_t)layers * per * 4);
    float *q = malloc(ATT_CHUNK * qs * 4), *out = malloc(ATT_CHUNK * qs * 4);
    float *scratch = malloc(q3_attention_scratch(H, D, P) * sizeof(float));
    if (!k || !v || !q || !out || !scratch) return 1;
    for (size_t i = 0; i < (size_t)layers * per; i++) k[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f, v[i] = k[i] * 0.5f;
    for (size_t i = 0; i < ATT_CHUNK * qs; i++) q[i] = (float)((i * 40503u) % 1000) / 500.0f - 1.0f;
    const q3_attn_layer L = {H, KVH, D, (size_t)D, (size_t)P * D, k, v}; /* the engine's layout: head by head */
    const double flops = 4.0 * D * H * ((double)P * (P + 1) / 2); /* QK^T and PV, causal */
    const int prefill = !getenv("Q3_BENCH_DECODE_ONLY");
    const char *only = getenv("Q3MOE_ISA"); /* one ISA when set */
    int isas[Q3_ISA_COUNT], n = 0;
    for (int isa = Q3_ISA_SCALAR + 1; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() == isa && (!only || !strcmp(only, q3_isa_name((q3_isa)isa)))) isas[n++] = isa;
    }
    static double tp[Q3_ISA_COUNT][MAX_REPS], td[Q3_ISA_COUNT][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n; i++) {
            const int j = (i + r) % n; /* each ISA takes every place in the order */
            q3_kernels_force((q3_isa)isas[j]);
            tp[j][r] = prefill ? attn_prefill_time(out, q, P, &L, scratch) : 0;
            td[j][r] = attn_decode_time(out, q, P, layers, &L, per, scratch);
        }
    double med_p0 = 0, med_d0 = 0;
    for (int i = 0; i < n; i++) {
        qsort(tp[i], (size_t)reps, sizeof(double), cmp_double);
        qsort(td[i], (size_t)reps, sizeof(double), cmp_double);
        const double mp = tp[i][reps / 2], md = td[i][reps / 2];
        if (i == 0) med_p0 = mp, med_d0 = md;
        const char *name = q3_isa_name((q3_isa)isas[i]);
        if (prefill)
            printf("%-10s attention prefill P=%d heads %d/%d dim %d: best %.1f ms per layer (%.1f GFLOP/s), median %.1f (x%.3f "
                   "of %s's)  (threads %d)\n",
                   name, P, H, KVH, D, tp[i][0] * 1e3, flops / tp[i][0] / 1e9, mp * 1e3, mp / med_p0, q3_isa_name((q3_isa)isas[0]),
                   omp_get_max_threads());
        printf("%-10s attention decode at position %d (%d layers): best %.1f us per layer and token (%.1f GB/s of K/V), median "
               "%.1f (x%.3f of %s's)\n",
               name, P - 32, layers, td[i][0] * 1e6, 2.0 * (P - 32) * kvs * 4 / td[i][0] / 1e9, md * 1e6, md / med_d0,
               q3_isa_name((q3_isa)isas[0]));
    }
    q3_kernels_force(Q3_ISA_COUNT - 1);
    free(k), free(v), free(q), free(out), free(scratch);
    return 0;
}

#ifdef Q3_GEMM_AB

/* The broadcast GEMM (Q3_GEMM_AB_ISA: AVX-512's or AVX2's) of another
 * revision (make gemm-ab AB_REV=... AB_ISA=...) and of this tree, each its
 * own object with its symbols renamed. */
void ab_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt);
void ab_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf);
void ab_this_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt);
void ab_this_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf);

/* This build's broadcast GEMM against AB_REV's over the expert products of
 * a P-token prefill (Qwen3-30B-A3B shapes, gate and down, the experts with
 * at least bc_min_t tokens, in 16-row panels as matmul.c calls it), on one
 * thread, the two builds alternating rep by rep in this process, so that a
 * noisy machine slows both alike. */
static int gemm_ab_bench(int P, double skew, int reps) {
    enum { E = 128, H = 2048, F = 768, MAX_REPS = 256 };
    if (P < 1 || reps < 1 || reps > MAX_REPS || !(skew > 0.0 && skew <= 16.0)) {
        fprintf(stderr, "gemm_ab: need P >= 1, 1 <= reps <= %d, 0 < skew <= 16\n", MAX_REPS);
        return 2;
    }
    q3_kernels_init();
    const q3_isa_kernels *kt = q3_isa_current();
    if (kt->gemm_bc != Q3_GEMM_AB_ISA) {
        fprintf(stderr, "gemm_ab: the kernels in use (%s) do not run the broadcast GEMM it was built for (%s; Q3MOE_ISA picks the kernels)\n",
                q3_isa_name(q3_kernels_isa()), Q3_GEMM_AB_ISA == q3_avx2_gemm_bc ? "avx2" : "avx512");
        return 2;
    }
    int cnt[E] = {0};
    draw_experts(cnt, E, P, skew);
    const size_t per = (size_t)F * H;
    uint16_t *w = big_alloc(2 * E * per * 2);
    float *x = malloc((size_t)P * 8 * H * 4), *out = malloc((size_t)P * 8 * H * 4);
    float *ap = aligned_alloc(64, ((size_t)(Q3_BC_TOKENS_MAX + 8) * Q3_LANE_KMAX + 256) * 4);
    float *wbuf = aligned_alloc(64, (size_t)Q3_NR * (Q3_LANE_KMAX + 16) * 4);
    if (!w || !x || !out || !ap || !wbuf) return 1;
    madvise(w, 2 * E * per * 2, MADV_HUGEPAGE); /* as the model's mapping has */
    for (size_t i = 0; i < 2 * E * per; i++) w[i] = q3_f32_to_bf16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    for (size_t i = 0; i < (size_t)P * 8 * H; i++) x[i] = (float)((i * 40503u) % 1000) / 500.0f - 1.0f;
    void (*pack[2])(float *, const float *, size_t, int, int, q3_dtype) = {ab_bc_pack_act, ab_this_bc_pack_act};
    void (*gemm[2])(float *, size_t, const float *, int, const q3_mat *, int, int, float *) = {ab_gemm_bc, ab_this_gemm_bc};
    double t[2][MAX_REPS], flops = 0;
    for (int e = 0; e < E; e++)
        if (cnt[e] >= kt->bc_min_t) flops += 2.0 * 2 * cnt[e] * per;
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < 2; i++) {
            const int v = r % 2 ? 1 - i : i;
            const double t0 = omp_get_wtime();
            for (int m = 0; m < 2; m++) { /* gate (F x H), then down (H x F) */
                const int rows = m ? H : F, K = m ? F : H;
                size_t off = 0;
                for (int e = 0; e < E; off += (size_t)cnt[e], e++) {
                    if (cnt[e] < kt->bc_min_t) continue;
                    const q3_mat W = {.data = w + (2 * (size_t)e + m) * per, .dtype = Q3_BF16, .rows = rows, .cols = K};
                    for (int t0k = 0; t0k < cnt[e]; t0k += Q3_BC_TOKENS_MAX) {
                        const int T = cnt[e] - t0k < Q3_BC_TOKENS_MAX ? cnt[e] - t0k : Q3_BC_TOKENS_MAX;
                        pack[v](ap, x + (off + (size_t)t0k) * K, (size_t)K, T, K, Q3_BF16);
                        for (int r0 = 0; r0 < rows; r0 += Q3_NR)
                            gemm[v](out + (off + (size_t)t0k) * rows, (size_t)rows, ap, T, &W, r0, r0 + Q3_NR, wbuf);
                    }
                }
            }
            t[v][r] = omp_get_wtime() - t0;
        }
    qsort(t[0], (size_t)reps, sizeof(double), cmp_double);
    qsort(t[1], (size_t)reps, sizeof(double), cmp_double);
    const double m0 = t[0][reps / 2], m1 = t[1][reps / 2];
    printf("gemm_ab, %d tokens (skew %.2f), experts of %d+ tokens, one thread, %d reps each: AB_REV median %.1f ms (%.1f "
           "GFLOP/s), min %.1f; this build median %.1f ms (%.1f GFLOP/s), min %.1f; this / AB_REV: median %.4f, min %.4f\n",
           P, skew, kt->bc_min_t, reps, m0 * 1e3, flops / m0 / 1e9, t[0][0] * 1e3, m1 * 1e3, flops / m1 / 1e9, t[1][0] * 1e3,
           m1 / m0, t[1][0] / t[0][0]);
    free(w), free(x), free(out), free(ap), free(wbuf);
    return 0;
}
#endif

/* Seconds for one GEMV of W with table k's kernel, rows split evenly. */
static double gemv_time(const q3_isa_kernels *k, float *out, const float *x, const q3_mat *W) {
    const double t0 = omp_get_wtime();
#pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int r0 = (int)((long)W->rows * t / nt), r1 = (int)((long)W->rows * (t + 1) / nt);
        k->gemv(out + r0, x, W, r0, r1);
    }
    return omp_get_wtime() - t0;
}

static int prefetch_bench(int M, int K, int pairs) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) {
        fprintf(stderr, "kernel_bench prefetch: this CPU has no AVX2+FMA+F16C\n");
        return 2;
    }
    if (M < 1 || K < 16 || pairs < 1 || pairs > 1000) {
        fprintf(stderr, "kernel_bench prefetch: rows >= 1, cols >= 16, 1 <= pairs <= 1000\n");
        return 2;
    }
    const size_t n = (size_t)M * K * 2, huge = (size_t)2 << 20;
    uint16_t *w = aligned_alloc(huge, (n + huge - 1) / huge * huge);
    float *x = malloc((size_t)K * 4), *out = malloc((size_t)M * 4);
    double *ratio = malloc(2 * (size_t)pairs * sizeof *ratio);
    if (!w || !x || !out || !ratio) {
        fprintf(stderr, "kernel_bench prefetch: out of memory for %zu MiB\n", n >> 20);
        return 1;
    }
    madvise(w, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
    for (size_t i = 0; i < (size_t)M * K; i++) w[i] = q3_f32_to_bf16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    for (int k = 0; k < K; k++) x[k] = (float)(k % 17) / 17.0f;
    const q3_mat W = {.data = w, .dtype = Q3_BF16, .rows = M, .cols = K};
    q3_isa_kernels sw, hw;
    for (int t = 1; t >= 0; t--) { /* AVX-512 first, where the CPU has it */
        if (!q3_gemv_prefetch_variants(t, &sw, &hw)) continue;
        const q3_isa_kernels *tables[2] = {&sw, &hw};
        printf("%s BF16 GEMV %dx%d (%.0f MiB), %d threads, GB/s (ratio to a plain read just before)\n", t ? "avx512" : "avx2",
               M, K, n / 1048576.0, omp_get_max_threads());
        for (int p = 0; p < pairs; p++) {
            printf("pair %2d:", p + 1);
            for (int v = 0; v < 2; v++) {
                const double rd = read_time(w, n, 1), g = gemv_time(tables[v], out, x, &W);
                ratio[v * pairs + p] = rd / g;
                printf("  %s read %5.1f gemv %5.1f (%.2f)", v ? "hw" : "sw", n / rd / 1e9, n / g / 1e9, rd / g);
            }
            printf("\n");
        }
        qsort(ratio, pairs, sizeof *ratio, cmp_double);
        qsort(ratio + pairs, pairs, sizeof *ratio, cmp_double);
        printf("median ratio to the read: software prefetch %.2f, hardware only (two rows) %.2f\n", ratio[pairs / 2],
               ratio[pairs + pairs / 2]);
    }
    free(w), free(x), free(out), free(ratio);
    return 0;
}

static int bf16p_bench(int M, int K, int rounds) {
    if (M < 1 || K < 64 || K % 64 || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "kernel_bench bf16p: rows >= 1, cols a multiple of 64, 1 <= rounds <= 1000\n");
        return 2;
    }
    const size_t n = (size_t)M * K, rb = q3_bf16p_row_bytes((size_t)K);
    uint16_t *w = big_alloc(n * 2);
    uint8_t *p = big_alloc((size_t)M * rb), *side = malloc((size_t)M * K / 64 * Q3_BF16P_RAW_BYTES);
    float *x = malloc((size_t)K * 4), *out = malloc((size_t)M * 4);
    if (!w || !p || !side || !x || !out) {
        fprintf(stderr, "kernel_bench bf16p: out of memory for %zu MiB\n", n * 2 >> 20);
        return 1;
    }
    uint64_t st = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) { /* about normal: a sum of four uniforms */
        float s = 0;
        for (int j = 0; j < 4; j++) st ^= st << 13, st ^= st >> 7, st ^= st << 17, s += (float)(st >> 40) / 16777216.0f - 0.5f;
        w[i] = q3_f32_to_bf16(s * 1.7320508f * 0.02f);
    }
    size_t raw = 0;
    for (int r = 0; r < M; r++) raw += q3_bf16p_pack_row(w + (size_t)r * K, (size_t)K, p + (size_t)r * rb, side, raw);
    for (int k = 0; k < K; k++) x[k] = (float)(k % 17) / 17.0f - 0.5f;
    const q3_mat Wb = {.data = w, .dtype = Q3_BF16, .rows = M, .cols = K};
    const q3_mat Wp = {.data = p, .dtype = Q3_BF16P, .rows = M, .cols = K, .scales = side, .side_groups = raw};
    printf("BF16P GEMV %dx%d: %.0f MiB as BF16, %.0f MiB packed (%.3f %% of groups raw), %d threads; GB/s of BF16 bytes\n", M, K,
           n * 2 / 1048576.0, M * rb / 1048576.0, 100.0 * raw / (n / 64), omp_get_max_threads());
    /* each table's GEMVs as shipped (software prefetch) and without it (two
     * rows at a time, what Zen 4 runs), beside a plain read of the packed bytes */
    q3_isa_kernels sw, hw;
    for (int t = 0; t < 2 && q3_gemv_prefetch_variants(t, &sw, &hw); t++) {
        printf("%s, GB/s of BF16 bytes (BF16P's packed bytes at 0.78 of these; read: GB/s of a plain read of them):\n",
               t ? "avx512" : "avx2");
        for (int r = 0; r < rounds; r++) {
            double tb[2] = {1e30, 1e30}, tp[2] = {1e30, 1e30}, rd = 1e30;
            for (int i = 0; i < 3; i++)
                for (int v = 0; v < 2; v++) {
                    const q3_isa_kernels *k = v ? &hw : &sw;
                    const double a = gemv_time(k, out, x, &Wb), b = gemv_time(k, out, x, &Wp), c = read_time(p, (size_t)M * rb, 1);
                    tb[v] = a < tb[v] ? a : tb[v], tp[v] = b < tp[v] ? b : tp[v], rd = c < rd ? c : rd;
                }
            printf("  sw: bf16 %5.1f bf16p %5.1f   hw: bf16 %5.1f bf16p %5.1f   read %5.1f\n", n * 2 / tb[0] / 1e9,
                   n * 2 / tp[0] / 1e9, n * 2 / tb[1] / 1e9, n * 2 / tp[1] / 1e9, (double)M * rb / rd / 1e9);
        }
    }
    /* prefill's unpack to BF16, 64 rows at a time into a per-thread buffer (an AVX2 kernel) */
    if (__builtin_cpu_supports("avx2")) printf("unpack to BF16 (rows of 64 into a per-thread buffer), GB/s of BF16 bytes:");
    for (int r = 0; r < rounds && __builtin_cpu_supports("avx2"); r++) {
        const double t0 = omp_get_wtime();
#pragma omp parallel
        {
            const int nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int r0 = (int)((long)M * t / nt), r1 = (int)((long)M * (t + 1) / nt);
            uint16_t *buf = aligned_alloc(64, (size_t)64 * K * 2);
            if (!buf) abort();
            for (int q = r0; q < r1; q += 64) q3_bf16p_unpack_rows_avx2(buf, (size_t)K, &Wp, q, r1 - q < 64 ? r1 - q : 64);
            free(buf);
        }
        printf("  %.1f", n * 2 / (omp_get_wtime() - t0) / 1e9);
    }
    if (__builtin_cpu_supports("avx2")) printf("\n");
    free(w), free(p), free(side), free(x), free(out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "bf16p"))
        return bf16p_bench(argc > 2 ? atoi(argv[2]) : 262144, argc > 3 ? atoi(argv[3]) : 2048, argc > 4 ? atoi(argv[4]) : 3);
    if (argc > 1 && !strcmp(argv[1], "prefetch"))
        return prefetch_bench(argc > 2 ? atoi(argv[2]) : 262144, argc > 3 ? atoi(argv[3]) : 2048, argc > 4 ? atoi(argv[4]) : 10);
    if (argc > 1 && !strcmp(argv[1], "gemm-ab")) {
#ifdef Q3_GEMM_AB
        return gemm_ab_bench(argc > 2 ? atoi(argv[2]) : 512, argc > 3 ? atof(argv[3]) : 2.0, argc > 4 ? atoi(argv[4]) : 16);
#else
        fprintf(stderr, "kernel_bench gemm-ab: build it with `make gemm-ab AB_REV=<git revision>` and run build/gemm_ab\n");
        return 2;
#endif
    }
    if (argc > 1 && !strcmp(argv[1], "attn"))
        return attn_bench(argc > 2 ? atoi(argv[2]) : 4096, argc > 3 ? atoi(argv[3]) : 32, argc > 4 ? atoi(argv[4]) : 4,
                          argc > 5 ? atoi(argv[5]) : 128, argc > 6 ? atoi(argv[6]) : 3, argc > 7 ? atoi(argv[7]) : 1);
    if (argc > 1 && !strcmp(argv[1], "moe-prefill"))
        return moe_prefill_bench(argc > 2 ? atoi(argv[2]) : 128, argc > 3 ? atoi(argv[3]) : 2048, argc > 4 ? atoi(argv[4]) : 768,
                                 argc > 5 ? atoi(argv[5]) : 512, argc > 6 ? atoi(argv[6]) : 3, argc > 7 ? atof(argv[7]) : 1.0,
                                 argc > 8 ? argv[8] : "bf16", argc > 9 ? atoi(argv[9]) : 1);
    if (argc > 1 && !strcmp(argv[1], "moe"))
        return moe_bench(argc > 2 ? atoi(argv[2]) : 128, argc > 3 ? atoi(argv[3]) : 2048, argc > 4 ? atoi(argv[4]) : 768,
                         argc > 5 ? atoi(argv[5]) : 200);
    if (argc > 1 && !strcmp(argv[1], "mx"))
        return mx_bench(argc > 2 ? atoi(argv[2]) : 65536, argc > 3 ? atoi(argv[3]) : 2048, argc > 4 ? atoi(argv[4]) : 10,
                        argc > 5 ? atoi(argv[5]) : 32);
    int M = argc > 1 ? atoi(argv[1]) : 151936, K = argc > 2 ? atoi(argv[2]) : 2048;
    int T = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 10;
    uint16_t *w = malloc((size_t)M * K * 2);
    for (size_t i = 0; i < (size_t)M * K; i++) w[i] = q3_f32_to_bf16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    float *x = malloc((size_t)T * K * 4), *out = malloc((size_t)T * M * 4);
    for (int i = 0; i < T * K; i++) x[i] = (float)(i % 17) / 17.0f;
    q3_mat W = {.data = w, .dtype = Q3_BF16, .rows = M, .cols = K};
    for (int isa = Q3_ISA_SCALAR; isa < Q3_ISA_COUNT; isa++) {
        q3_kernels_force((q3_isa)isa);
        if ((int)q3_kernels_isa() != isa) continue;
        double best1 = 1e30, bestT = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = omp_get_wtime();
            q3_matmul(out, x, 1, &W);
            double t1 = omp_get_wtime();
            if (t1 - t0 < best1) best1 = t1 - t0;
        }
        int gemm_M = M > 8192 ? 8192 : M;
        q3_mat Wg = {.data = w, .dtype = Q3_BF16, .rows = gemm_M, .cols = K};
        for (int r = 0; r < (isa ? reps : 1); r++) {
            double t0 = omp_get_wtime();
            q3_matmul(out, x, T, &Wg);
            double t1 = omp_get_wtime();
            if (t1 - t0 < bestT) bestT = t1 - t0;
        }
        printf("%-7s gemv %dx%d: %.2f ms, %.1f GB/s | gemm T=%d %dx%d: %.1f GFLOP/s  (threads %d)\n", q3_isa_name(q3_kernels_isa()),
               M, K, best1 * 1e3, (double)M * K * 2 / best1 / 1e9, T, gemm_M, K, 2.0 * T * gemm_M * K / bestT / 1e9,
               omp_get_max_threads());
    }
    free(w), free(x), free(out);
    return 0;
}
