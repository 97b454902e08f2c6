/* Which kernel table runs: the CPU's best (AMX, AVX-512 with BF16,
 * AVX-512, AVX2+FMA, scalar) unless Q3MOE_ISA says, the tables completed
 * once for what this CPU has (VNNI, the AVX-512 BW MX kernels, BF16, AMX),
 * and the GEMV prefetch choices (Q3MOE_GEMV_PREFETCH, Q3MOE_PREFETCH_TO). */
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/isa.h"
#include "kernels/prefetch.h"

static const q3_isa_kernels *g_k = &q3_kernels_scalar;
static q3_isa g_isa = Q3_ISA_SCALAR;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static q3_isa_kernels g_avx512;     /* the AVX-512 table, plus the VNNI integer kernels where the CPU has them */
static int g_vnni;                  /* it has */
static q3_isa_kernels g_avx512bf16; /* that plus the A8 kernels */
static q3_isa_kernels g_amx;        /* that with the AMX GEMMs */
static q3_isa_kernels g_avx2;       /* the AVX2 table */
static int g_hw_prefetch;           /* the plain GEMVs leave their streams to the hardware prefetchers */
static char g_desc[Q3_ISA_COUNT][32]; /* q3_kernels_desc's names, per table */

const char *q3_isa_name(q3_isa isa) {
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};
    return names[isa];
}

static q3_isa best_supported(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return !(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16"))
                   ? Q3_ISA_AVX512
               : q3_amx_usable() ? Q3_ISA_AMX
                                 : Q3_ISA_AVX512BF16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Q3_ISA_AVX2;
    return Q3_ISA_SCALAR;
}

static void set_isa(q3_isa isa) {
    q3_isa best = best_supported();
    if (isa > best) isa = best;
    g_isa = isa;
    g_k = isa == Q3_ISA_AMX          ? &g_amx
          : isa == Q3_ISA_AVX512BF16 ? &g_avx512bf16
          : isa == Q3_ISA_AVX512   ? &g_avx512
          : isa == Q3_ISA_AVX2     ? &g_avx2
                                   : &q3_kernels_scalar;
}

int q3_gemv_prefetch_variants(int t, q3_isa_kernels *sw, q3_isa_kernels *hw) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || (t && !__builtin_cpu_supports("avx512f")))
        return 0;
    *sw = *hw = t ? q3_kernels_avx512 : q3_kernels_avx2;
    (t ? q3_avx512_hw_prefetch_kernels : q3_avx2_hw_prefetch_kernels)(hw);
    return 1;
}

static int cpu_vendor_is(unsigned ebx) {
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == ebx;
}

/* Zen 4: AMD family 19h (Zen 3 and Zen 4) with AVX-512 (Zen 4 only). */
static int amd_zen4(void) {
    unsigned a, b, c, d;
    if (!cpu_vendor_is(0x68747541u /* "Auth"enticAMD */) || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    return family == 0x19 && __builtin_cpu_supports("avx512f");
}

/* Whether the plain-dtype GEMVs should go without their software prefetch
 * (isa_avx512.c's gemv_hw says why): on Zen 4 by default, where that
 * measured faster with either table; Q3MOE_GEMV_PREFETCH=sw|hw decides
 * instead (Zen 3 was not measured without it since the prefetch came in). */
static int use_hw_prefetch(void) {
    const char *env = getenv("Q3MOE_GEMV_PREFETCH");
    if (env && !strcmp(env, "sw")) return 0;
    if (env && !strcmp(env, "hw")) return 1;
    if (env && *env) fprintf(stderr, "q3moe: ignoring Q3MOE_GEMV_PREFETCH=%s (expected sw or hw)\n", env);
    return amd_zen4();
}

int q3_pf_to_l2;

/* Where the GEMVs prefetch to (prefetch.h says why): L2 on Intel CPUs,
 * unless Q3MOE_PREFETCH_TO=l1|l2 says. */
static int prefetch_to_l2(void) {
    const char *env = getenv("Q3MOE_PREFETCH_TO");
    if (env && !strcmp(env, "l1")) return 0;
    if (env && !strcmp(env, "l2")) return 1;
    if (env && *env) fprintf(stderr, "q3moe: ignoring Q3MOE_PREFETCH_TO=%s (expected l1 or l2)\n", env);
    return cpu_vendor_is(0x756e6547u /* "Genu"ineIntel */);
}

static void init_once(void) {
    q3_pf_to_l2 = prefetch_to_l2();
    g_avx512 = q3_kernels_avx512;
    g_avx2 = q3_kernels_avx2;
    g_hw_prefetch = use_hw_prefetch();
    if (g_hw_prefetch) q3_avx512_hw_prefetch_kernels(&g_avx512), q3_avx2_hw_prefetch_kernels(&g_avx2);
    g_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) q3_avx512bw_mx_kernels(&g_avx512);
    if (g_vnni) q3_avx512vnni_i8_kernels(&g_avx512);
    g_avx512bf16 = g_avx512;
    q3_avx512bf16_a8_kernels(&g_avx512bf16);
    g_amx = g_avx512bf16;
    q3_amx_kernels(&g_amx);
    const q3_isa best = best_supported();
    q3_isa isa = best;
    const char *env = getenv("Q3MOE_ISA");
    if (env && *env) {
        int i = 0;
        while (i < Q3_ISA_COUNT && strcmp(env, q3_isa_name((q3_isa)i))) i++;
        if (i == Q3_ISA_COUNT)
            fprintf(stderr, "q3moe: ignoring Q3MOE_ISA=%s (expected scalar, avx2, avx512, avx512bf16 or amx)\n", env);
        else if (i > (int)best)
            fprintf(stderr, "q3moe: Q3MOE_ISA=%s: this CPU lacks it; using %s\n", env, q3_isa_name(best));
        else isa = (q3_isa)i;
    }
    set_isa(isa);
    for (int i = 0; i < Q3_ISA_COUNT; i++)
        snprintf(g_desc[i], sizeof g_desc[i], "%s%s%s%s", q3_isa_name((q3_isa)i), g_vnni && i >= Q3_ISA_AVX512 ? "+vnni" : "",
                 g_hw_prefetch && i >= Q3_ISA_AVX2 ? "+hwpf" : "", q3_pf_to_l2 && i >= Q3_ISA_AVX2 ? "+pfl2" : "");
}

void q3_kernels_init(void) { pthread_once(&g_once, init_once); }

const char *q3_kernels_desc(void) {
    q3_kernels_init();
    return g_desc[g_isa];
}

void q3_kernels_force(q3_isa isa) {
    q3_kernels_init();
    set_isa(isa);
}

const q3_isa_kernels *q3_isa_current(void) {
    q3_kernels_init();
    return g_k;
}

q3_isa q3_kernels_isa(void) {
    q3_kernels_init();
    return g_isa;
}
