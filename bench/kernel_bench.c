/* Kernel micro-benchmark: GEMV bandwidth (one token, BF16 weights) and GEMM
 * GFLOP/s per ISA. Usage: build/kernel_bench [rows cols tokens reps] */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 151936, K = argc > 2 ? atoi(argv[2]) : 2048;
    int T = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 10;
    uint16_t *w = malloc((size_t)M * K * 2);
    for (size_t i = 0; i < (size_t)M * K; i++) w[i] = q3_f32_to_bf16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    float *x = malloc((size_t)T * K * 4), *out = malloc((size_t)T * M * 4);
    for (int i = 0; i < T * K; i++) x[i] = (float)(i % 17) / 17.0f;
    q3_mat W = {.data = w, .dtype = Q3_BF16, .rows = M, .cols = K};
    for (int isa = Q3_ISA_SCALAR; isa <= Q3_ISA_AVX512; isa++) {
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
