#include "cli/bench_machine.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#define BENCH_X86 1
#include <immintrin.h>
#else
#define BENCH_X86 0
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void bench_machine_info(bench_machine *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->cpu, sizeof m->cpu, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10)) continue;
            char *p = strchr(line, ':');
            if (!p) continue;
            p++;
            while (*p == ' ' || *p == '\t') p++;
            size_t n = strcspn(p, "\n");
            while (n && p[n - 1] == ' ') n--;
            if (n >= sizeof m->cpu) n = sizeof m->cpu - 1;
            memcpy(m->cpu, p, n);
            m->cpu[n] = 0;
            break;
        }
        fclose(f);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    m->cores = n > 0 ? (int)n : 1;
    m->threads = omp_get_max_threads();
    double la[1];
    m->loadavg = getloadavg(la, 1) == 1 ? la[0] : -1;
}

/* ---- memory read bandwidth ---- */

/* Sum of 64-bit words in [p, p + n); n a multiple of 32. */
static uint64_t sum_scalar(const uint64_t *p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = 0; i < n; i += 8) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
        a4 += p[i + 4];
        a5 += p[i + 5];
        a6 += p[i + 6];
        a7 += p[i + 7];
    }
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

#if BENCH_X86
#pragma GCC push_options
#pragma GCC target("avx2")
#include "kernels/prefetch.h"

/* pf: 0, or every line also prefetched Q3_PF_WEIGHTS bytes ahead into L1
 * (1) or L2 (2), as the GEMVs stream their weights. */
static inline __attribute__((always_inline)) uint64_t sum_avx2_pf(const uint64_t *p, size_t n, const int pf) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m256i *v = (const __m256i *)p;
    for (size_t i = 0; i < n / 4; i += 8) {
        if (pf)
            for (int l = 0; l < 4; l++) q3_pf_line((const char *)(v + i) + Q3_PF_WEIGHTS + 64 * l, pf == 2);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
        a4 = _mm256_add_epi64(a4, _mm256_load_si256(v + i + 4));
        a5 = _mm256_add_epi64(a5, _mm256_load_si256(v + i + 5));
        a6 = _mm256_add_epi64(a6, _mm256_load_si256(v + i + 6));
        a7 = _mm256_add_epi64(a7, _mm256_load_si256(v + i + 7));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)),
                          _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7)));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

static uint64_t sum_avx2(const uint64_t *p, size_t n, int prefetch) {
    if (!prefetch) return sum_avx2_pf(p, n, 0);
    return q3_pf_to_l2 ? sum_avx2_pf(p, n, 2) : sum_avx2_pf(p, n, 1);
}
#pragma GCC pop_options
#endif

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static volatile uint64_t bench_sink_u64;
static volatile float bench_sink_f32;

void bench_beside_add(bench_beside *b, double v) {
    if (b->n == 0 || v > b->best) b->best = v;
    if (b->n == 0 || v < b->worst) b->worst = v;
    b->n++;
}

static int read_method(void) {
#if BENCH_X86
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* Whole 256-byte blocks per thread: every slice is 32-byte aligned and a
 * multiple of the 8 x 32-byte unrolled step. */
enum { READ_BLOCK = 256 };

double bench_read_pass(const void *p, size_t bytes, int prefetch) {
    q3_kernels_init(); /* sets the prefetch level */
    const int T = omp_get_max_threads(), use_avx2 = read_method();
    const size_t per = bytes / READ_BLOCK / (size_t)T, words_per = per * READ_BLOCK / 8;
    if (per == 0) return 0;
    uint64_t sum = 0;
    const double t0 = now_s();
#pragma omp parallel num_threads(T) reduction(+ : sum)
    {
        const uint64_t *w = (const uint64_t *)p + (size_t)omp_get_thread_num() * words_per;
#if BENCH_X86
        if (use_avx2) sum += sum_avx2(w, words_per, prefetch);
        else
#endif
            sum += sum_scalar(w, words_per);
    }
    const double dt = now_s() - t0;
    bench_sink_u64 += sum;
    return (double)(per * (size_t)T * READ_BLOCK) / dt / 1e9;
}

int bench_measure_membw(size_t bytes, int passes, bench_membw *out) {
    memset(out, 0, sizeof *out);
    const int T = omp_get_max_threads();
    const size_t per = bytes / READ_BLOCK / (size_t)T;
    if (per == 0) return q3_err("--membw-mb: buffer too small for %d threads", T);
    bytes = per * (size_t)T * READ_BLOCK;
    void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return q3_err("cannot allocate a %zu MiB buffer for the bandwidth test", bytes >> 20);
#ifdef MADV_HUGEPAGE
    madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    uint64_t *w = buf;
    const size_t words_per = per * READ_BLOCK / 8;
    const int methods = read_method() ? 2 : 1; /* with the AVX2 sum, plain and prefetching passes */
    /* Touch every page from the thread that will read it (first touch places
     * the page on that thread's NUMA node). */
#pragma omp parallel num_threads(T)
    {
        uint64_t *p = w + (size_t)omp_get_thread_num() * words_per;
        for (size_t i = 0; i < words_per; i++) p[i] = i;
    }
    /* The methods' passes alternate (the machine's state drifts); the one
     * with the best pass gives the figures. */
    double *gbs = q3_malloc((size_t)methods * passes * sizeof *gbs);
    for (int pass = 0; pass < passes; pass++)
        for (int m = 0; m < methods; m++) gbs[(size_t)m * passes + pass] = bench_read_pass(buf, bytes, m);
    int best = 0;
    for (int m = 0; m < methods; m++) {
        double *g = gbs + (size_t)m * passes;
        qsort(g, (size_t)passes, sizeof *g, cmp_double);
        if (m == 0 || g[passes - 1] > out->best_gbs) {
            best = m;
            out->best_gbs = g[passes - 1];
            out->median_gbs = passes % 2 ? g[passes / 2] : 0.5 * (g[passes / 2 - 1] + g[passes / 2]);
        }
    }
    out->method = !read_method() ? "scalar sum"
                  : !best        ? "avx2 sum"
                  : q3_pf_to_l2  ? "avx2 sum, prefetch into L2"
                                 : "avx2 sum, prefetch into L1";
    out->ran = 1;
    out->bytes = bytes;
    out->passes = passes;
    free(gbs);
    munmap(buf, bytes);
    return 0;
}

/* ---- FMA peak ---- */

#define FMA_CHAINS 12

#if BENCH_X86
__attribute__((target("avx2,fma"))) static float fma_avx2(long iters, float seed) {
    __m256 a[FMA_CHAINS];
    const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm256_set1_ps(seed + (float)i);
    for (long it = 0; it < iters; it++) {
        a[0] = _mm256_fmadd_ps(a[0], b, c);
        a[1] = _mm256_fmadd_ps(a[1], b, c);
        a[2] = _mm256_fmadd_ps(a[2], b, c);
        a[3] = _mm256_fmadd_ps(a[3], b, c);
        a[4] = _mm256_fmadd_ps(a[4], b, c);
        a[5] = _mm256_fmadd_ps(a[5], b, c);
        a[6] = _mm256_fmadd_ps(a[6], b, c);
        a[7] = _mm256_fmadd_ps(a[7], b, c);
        a[8] = _mm256_fmadd_ps(a[8], b, c);
        a[9] = _mm256_fmadd_ps(a[9], b, c);
        a[10] = _mm256_fmadd_ps(a[10], b, c);
        a[11] = _mm256_fmadd_ps(a[11], b, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < FMA_CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    float l[8];
    _mm256_storeu_ps(l, s);
    return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

/* The same chains on 512-bit vectors: the peak the AVX-512 kernels can reach. */
__attribute__((target("avx512f"))) static float fma_avx512(long iters, float seed) {
    __m512 a[FMA_CHAINS];
    const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < FMA_CHAINS; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (long it = 0; it < iters; it++) {
        a[0] = _mm512_fmadd_ps(a[0], b, c);
        a[1] = _mm512_fmadd_ps(a[1], b, c);
        a[2] = _mm512_fmadd_ps(a[2], b, c);
        a[3] = _mm512_fmadd_ps(a[3], b, c);
        a[4] = _mm512_fmadd_ps(a[4], b, c);
        a[5] = _mm512_fmadd_ps(a[5], b, c);
        a[6] = _mm512_fmadd_ps(a[6], b, c);
        a[7] = _mm512_fmadd_ps(a[7], b, c);
        a[8] = _mm512_fmadd_ps(a[8], b, c);
        a[9] = _mm512_fmadd_ps(a[9], b, c);
        a[10] = _mm512_fmadd_ps(a[10], b, c);
        a[11] = _mm512_fmadd_ps(a[11], b, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < FMA_CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
#endif

/* 8 independent scalar multiply-add chains (2 flops each). */
static float fma_scalar(long iters, float seed) {
    float a[8];
    for (int i = 0; i < 8; i++) a[i] = seed + (float)i;
    const float b = 0.9999999f, c = 1e-7f;
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 8; i++) a[i] = a[i] * b + c;
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

/* The FMA loop bench_measure_fma and bench_fma_pass run: its width (the
 * kernels' own: Q3MOE_ISA=avx2 on an AVX-512 CPU gets the 256-bit one, so
 * that % of peak says how close they come to their own ceiling) and an
 * iteration count calibrated on one thread to about 50 ms per run. */
static struct {
    int ready, use_fma; /* use_fma 1: AVX2 256-bit, 2: AVX-512 */
    long iters;
    double flops_per_iter;
} g_fma;

static float fma_run(long iters, float seed) {
#if BENCH_X86
    if (g_fma.use_fma == 2) return fma_avx512(iters, seed);
    if (g_fma.use_fma) return fma_avx2(iters, seed);
#endif
    return fma_scalar(iters, seed);
}

static void fma_calibrate(void) {
    if (g_fma.ready) return;
#if BENCH_X86
    const q3_isa isa = q3_kernels_isa();
    g_fma.use_fma = isa >= Q3_ISA_AVX512 ? 2 : isa == Q3_ISA_AVX2;
#endif
    g_fma.flops_per_iter = g_fma.use_fma ? FMA_CHAINS * (g_fma.use_fma == 2 ? 16 : 8) * 2.0 : 8 * 2.0;
    long iters = 1 << 16;
    for (;;) {
        double t0 = now_s();
        bench_sink_f32 = fma_run(iters, 1.0f);
        double dt = now_s() - t0;
        if (dt > 0.02 || iters > (1l << 34)) {
            iters = (long)(iters * (0.05 / (dt > 1e-6 ? dt : 1e-6)));
            if (iters < 1) iters = 1;
            break;
        }
        iters *= 4;
    }
    g_fma.iters = iters;
    g_fma.ready = 1;
}

double bench_fma_pass(void) {
    fma_calibrate();
    const int T = omp_get_max_threads();
    float sum = 0;
    const double t0 = now_s();
#pragma omp parallel num_threads(T) reduction(+ : sum)
    sum += fma_run(g_fma.iters, 1.0f + (float)omp_get_thread_num());
    const double dt = now_s() - t0;
    bench_sink_f32 = sum;
    return g_fma.flops_per_iter * (double)g_fma.iters * T / dt / 1e9;
}

/* All threads running tile products, about 40 ms: GFLOP/s. */
static double amx_pass(void) {
    enum { PRODUCTS = 1 << 22 };
    double flops = 0;
    const double t0 = now_s();
#pragma omp parallel reduction(+ : flops)
    flops += q3_amx_tile_flops(PRODUCTS);
    return flops / (now_s() - t0) / 1e9;
}

void bench_measure_fma(bench_fma *out) {
    memset(out, 0, sizeof *out);
    fma_calibrate();
    out->method = g_fma.use_fma == 2 ? "avx512f 512-bit" : g_fma.use_fma ? "avx2+fma 256-bit" : "scalar mul+add";
    out->chains = g_fma.use_fma ? FMA_CHAINS : 8;
    double best = 0;
    for (int run = 0; run < 5; run++) {
        const double g = bench_fma_pass();
        if (g > best) best = g;
    }
    out->gflops = best;
#if BENCH_X86
    if (q3_kernels_isa() == Q3_ISA_AMX)
        for (int run = 0; run < 3; run++) {
            const double g = amx_pass();
            if (g > out->amx_gflops) out->amx_gflops = g;
        }
#endif
}
