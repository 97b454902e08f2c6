/* The decode step is static: after warm-up, 100 single-token forward steps
 * perform no heap allocation and create no thread. malloc/calloc/realloc
 * and pthread_create are interposed by this binary and counted. Greedy
 * decoding, and the prefill of a prompt long enough for its per-row work
 * to run on all threads, are also bit-identical with 1 and 2 threads. */
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "quant/convert.h"
#include "synth/config.h"
#include "synth/dir.h"
#include "synth/presets.h"
#include "synth/weights.h"
#include "synth/write.h"
#include "unit.h"
#include "util/file.h"

static volatile long n_alloc, n_threads;
#if defined(__SANITIZE_ADDRESS__)
#define COUNTING 0 /* ASan owns malloc and pthread_create; counting runs in the plain build */
#else
#define COUNTING 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
void *malloc(size_t n) {
    __atomic_add_fetch(&n_alloc, 1, __ATOMIC_RELAXED);
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t s) {
    __atomic_add_fetch(&n_alloc, 1, __ATOMIC_RELAXED);
    return __libc_calloc(n, s);
}
void *realloc(void *p, size_t n) {
    __atomic_add_fetch(&n_alloc, 1, __ATOMIC_RELAXED);
    return __libc_realloc(p, n);
}
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
    __atomic_add_fetch(&n_threads, 1, __ATOMIC_RELAXED);
    return real(t, a, fn, arg);
}
#endif

static int make_checkpoint(char *dir) {
    synth_geom g = *synth_preset("tiny");
    g.layers = 2;
    g.vocab = 512;
    synth_plan plan;
    synth_plan_build(&plan, &g, SYNTH_BF16);
    char *cfg = q3_path_join(dir, "config.json");
    int rc = synth_write_weights(dir, &plan, 1ull << 40, 7) || synth_write_config(cfg, &g, "bfloat16");
    free(cfg);
    synth_plan_free(&plan);
    return rc;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy decode of `steps` tokens; fills ids[]. Returns allocations and
 * thread creations seen during the steps after the first 3 (warm-up). */
static void greedy(const q3_model *m, int threads, int steps, int32_t *ids, float *first_logits, long *allocs, long *spawns) {
    omp_set_num_threads(threads);
    q3_state s;
    CHECK(q3_state_init(&s, m, 256, 0) == 0);
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    /* A prompt past Q3_PAR_ROWS: its norms, RoPE, gating, gathers and
     * finalize run on all threads, and must give the 1-thread bits. */
    enum { PROMPT = 2 * Q3_PAR_ROWS + 3 };
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)(1 + 37 * i % (m->cfg.vocab_size - 1));
    CHECK(q3_forward(m, &s, prompt, PROMPT, logits, 0) == 0);
    memcpy(first_logits, logits, (size_t)m->cfg.vocab_size * sizeof(float));
    long a0 = 0, t0 = 0;
    for (int i = 0; i < steps; i++) {
        if (i == 3 && COUNTING) a0 = n_alloc, t0 = n_threads;
        ids[i] = argmax(logits, m->cfg.vocab_size);
        if (q3_forward(m, &s, &ids[i], 1, logits, 0)) break;
    }
    *allocs = COUNTING ? n_alloc - a0 : 0;
    *spawns = COUNTING ? n_threads - t0 : 0;
    free(logits);
    q3_state_free(&s);
}

/* Greedy decode with 2 and 1 threads: no allocation or thread creation in
 * the steps, and the same tokens and logits either way. */
static void check_model(const char *path) {
    q3_model m;
    if (!CHECK(q3_model_load(&m, path) == 0)) return;
    enum { STEPS = 103 };
    int32_t ids1[STEPS], ids2[STEPS];
    float *l1 = malloc((size_t)m.cfg.vocab_size * sizeof(float)), *l2 = malloc((size_t)m.cfg.vocab_size * sizeof(float));
    long a1, s1, a2, s2;
    greedy(&m, 2, STEPS, ids2, l2, &a2, &s2);
    greedy(&m, 1, STEPS, ids1, l1, &a1, &s1);
    if (COUNTING) {
        printf("%s: 100 decode steps: %ld allocations, %ld threads created (2 threads); %ld, %ld (1 thread)\n", path, a2,
               s2, a1, s1);
        CHECK_EQ_INT(a2, 0);
        CHECK_EQ_INT(s2, 0);
        CHECK_EQ_INT(a1, 0);
        CHECK_EQ_INT(s1, 0);
    }
    CHECK(memcmp(ids1, ids2, sizeof ids1) == 0);
    CHECK(memcmp(l1, l2, (size_t)m.cfg.vocab_size * sizeof(float)) == 0);
    free(l1), free(l2);
    q3_model_free(&m);
}

int main(void) {
    char dir[] = "/tmp/q3moe-static-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK(make_checkpoint(dir) == 0);
    check_model(dir);
    /* The quantized decode paths: MXFP8 (A8) and MXINT8 (integer) inputs, MX heads. */
    static const q3_quant_scheme schemes[] = {{Q3_MXFP4, Q3_MXFP8, Q3_MXFP8, Q3_MXFP8},
                                              {Q3_MXFP4, Q3_MXINT8, Q3_MXINT8, Q3_MXINT8}};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        char *q = q3_path_join(dir, i ? "w4a8i.q3m" : "w4a8.q3m");
        q3_convert_opts o = {.src = dir, .dst = q, .scheme = schemes[i], .quiet = 1};
        q3_convert_stats st;
        if (CHECK(q3_convert(&o, &st) == 0)) check_model(q);
        unlink(q);
        free(q);
    }
    synth_remove_owned(dir);
    rmdir(dir);
    UNIT_MAIN_END();
}
