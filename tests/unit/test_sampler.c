/* Sampler: greedy ties, top-k/top-p/min-p exclusions, seeding, the repeat
 * penalty, and empirical frequencies against softmax(logits / T). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sampler.h"
#include "unit.h"
#include "util/error.h"

#define QWEN_VOCAB 151936

static q3_sampler_params params(float temp, int top_k, float top_p, float min_p, uint64_t seed) {
    q3_sampler_params p;
    q3_sampler_defaults(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    return p;
}

/* The sampler may modify logits, so each draw gets a fresh copy. */
static int32_t draw(q3_sampler *s, const float *logits, float *scratch, int n) {
    memcpy(scratch, logits, (size_t)n * sizeof *scratch);
    return q3_sampler_sample(s, scratch);
}

/* Test-local RNG for building logits (independent of the sampler's). */
static uint64_t g_rng = 88172645463325252ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

static void test_greedy(void) {
    q3_sampler_params p = params(0.0f, 20, 0.8f, 0.0f, 1);
    q3_sampler *s = q3_sampler_new(&p, 6);
    float ties[6] = {1.0f, 3.0f, -2.0f, 3.0f, 2.9f, 3.0f};
    float tmp[6];
    CHECK_EQ_INT(draw(s, ties, tmp, 6), 1);
    float neg[6] = {-5.0f, -4.0f, -1.5f, -1.5f, -9.0f, -2.0f};
    CHECK_EQ_INT(draw(s, neg, tmp, 6), 2);
    float nan_first[6] = {NAN, -1.0f, 0.5f, NAN, 0.25f, 0.5f};
    CHECK_EQ_INT(draw(s, nan_first, tmp, 6), 2);
    q3_sampler_free(s);

    p.temperature = -1.0f; /* any temperature <= 0 is greedy */
    s = q3_sampler_new(&p, QWEN_VOCAB);
    float *big = malloc(QWEN_VOCAB * sizeof *big);
    CHECK(big != NULL);
    for (int i = 0; i < QWEN_VOCAB; i++) big[i] = (float)(urand() * 10.0 - 5.0);
    big[123456] = 7.0f;
    big[150000] = 7.0f;
    CHECK_EQ_INT(q3_sampler_sample(s, big), 123456);
    free(big);
    q3_sampler_free(s);
}

/* top_k = 1 keeps only the argmax, whatever the temperature. */
static void test_top_k_1_is_greedy(void) {
    enum { V = 1000 };
    static float logits[V], tmp[V];
    const float temps[] = {0.3f, 1.0f, 5.0f, 100.0f};
    int mismatches = 0;
    for (int t = 0; t < 4; t++) {
        q3_sampler_params p = params(temps[t], 1, 1.0f, 0.0f, 42 + t);
        q3_sampler *s = q3_sampler_new(&p, V);
        for (int trial = 0; trial < 50; trial++) {
            for (int i = 0; i < V; i++) logits[i] = (float)(urand() * 4.0);
            logits[(trial * 37) % V] = 4.0f; /* ties with the planted max go to the lower id */
            logits[(trial * 37 + 500) % V] = 4.0f;
            int32_t want = (trial * 37) % V < (trial * 37 + 500) % V ? (trial * 37) % V : (trial * 37 + 500) % V;
            for (int d = 0; d < 5; d++) mismatches += draw(s, logits, tmp, V) != want;
        }
        q3_sampler_free(s);
    }
    CHECK_EQ_INT(mismatches, 0);
}

static void sequence(uint64_t seed, int32_t *out, int n) {
    enum { V = 100 };
    float logits[V], tmp[V];
    for (int i = 0; i < V; i++) logits[i] = (float)(i % 7) * 0.1f;
    q3_sampler_params p = params(1.0f, 0, 1.0f, 0.0f, seed);
    q3_sampler *s = q3_sampler_new(&p, V);
    for (int i = 0; i < n; i++) out[i] = draw(s, logits, tmp, V);
    q3_sampler_free(s);
}

static void test_seeding(void) {
    enum { N = 64 };
    int32_t a[N], b[N], c[N], z[N];
    sequence(1234, a, N);
    sequence(1234, b, N);
    sequence(1235, c, N);
    sequence(0, z, N);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    CHECK(memcmp(a, z, sizeof a) != 0);
    int distinct = 0; /* seed 0 must still give a working RNG */
    for (int i = 1; i < N; i++) distinct += z[i] != z[0];
    CHECK(distinct > 0);
}

/* Counts over n draws vs expected probabilities: every cell within 5 sigma
 * of its binomial mean, and tokens with probability 0 never drawn. */
static void check_frequencies(q3_sampler *s, const float *logits, int v, const double *want, int n) {
    float tmp[16];
    int count[16] = {0};
    int out_of_range = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = draw(s, logits, tmp, v);
        if (t >= 0 && t < v)
            count[t]++;
        else
            out_of_range++;
    }
    CHECK_EQ_INT(out_of_range, 0);
    for (int i = 0; i < v; i++) {
        double mean = n * want[i], sigma = sqrt(n * want[i] * (1.0 - want[i]));
        if (want[i] == 0.0)
            CHECK_EQ_INT(count[i], 0);
        else
            CHECK_NEAR(count[i], mean, 5.0 * sigma + 1.0);
    }
}

/* Expected distribution: softmax(logits / t) restricted to keep[], renormalised. */
static void softmax_keep(const float *logits, int v, double t, const int *keep, double *out) {
    double max = -INFINITY, z = 0.0;
    for (int i = 0; i < v; i++)
        if (keep[i] && logits[i] > max) max = logits[i];
    for (int i = 0; i < v; i++) z += out[i] = keep[i] ? exp((logits[i] - max) / t) : 0.0;
    for (int i = 0; i < v; i++) out[i] /= z;
}

static void test_frequencies(void) {
    const float logits[5] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    const int all[5] = {1, 1, 1, 1, 1};
    const float temps[] = {0.8f, 1.0f, 2.0f};
    double want[5];
    for (int t = 0; t < 3; t++) {
        q3_sampler_params p = params(temps[t], 0, 1.0f, 0.0f, 7 + t);
        q3_sampler *s = q3_sampler_new(&p, 5);
        softmax_keep(logits, 5, temps[t], all, want);
        check_frequencies(s, logits, 5, want, 20000);
        q3_sampler_free(s);
    }
    /* top_k = 3 keeps ids 1, 4, 0 and renormalises over them */
    const int top3[5] = {1, 1, 0, 0, 1};
    q3_sampler_params p = params(1.0f, 3, 1.0f, 0.0f, 99);
    q3_sampler *s = q3_sampler_new(&p, 5);
    softmax_keep(logits, 5, 1.0, top3, want);
    check_frequencies(s, logits, 5, want, 20000);
    q3_sampler_free(s);
}

/* Probabilities 0.5, 0.3, 0.15, 0.05, 0 at T = 1. The -inf token lets
 * top_k = 4 < vocab take the top-k (pre-sorted) path without changing the
 * distribution. */
static const float k_probs_logits[5] = {-0.693147f, -1.203973f, -1.897120f, -2.995732f, -INFINITY};

static void test_top_p(void) {
    double want[5];
    const float *l = k_probs_logits;
    struct {
        float top_p;
        int keep[5];
    } cases[] = {
        {0.75f, {1, 1, 0, 0}}, /* 0.5 < 0.75 <= 0.8 */
        {0.85f, {1, 1, 1, 0}},
        {0.4f, {1, 0, 0, 0}},
        {0.0f, {1, 0, 0, 0}}, /* always keep at least one */
        {0.99f, {1, 1, 1, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int top_k = 0; top_k <= 4; top_k += 4) { /* unsorted path, then the top-k path */
            q3_sampler_params p = params(1.0f, top_k, cases[c].top_p, 0.0f, 5 + c);
            q3_sampler *s = q3_sampler_new(&p, 5);
            softmax_keep(l, 5, 1.0, cases[c].keep, want);
            check_frequencies(s, l, 5, want, 5000);
            q3_sampler_free(s);
        }
    }
}

static void test_min_p(void) {
    double want[5];
    const float *l = k_probs_logits;
    struct {
        float min_p;
        int keep[5];
    } cases[] = {
        {0.2f, {1, 1, 1, 0}}, /* cut at 0.1 */
        {0.5f, {1, 1, 0, 0}}, /* cut at 0.25 */
        {0.9f, {1, 0, 0, 0}},
        {0.05f, {1, 1, 1, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        q3_sampler_params p = params(1.0f, 0, 1.0f, cases[c].min_p, 11 + c);
        q3_sampler *s = q3_sampler_new(&p, 5);
        softmax_keep(l, 5, 1.0, cases[c].keep, want);
        check_frequencies(s, l, 5, want, 5000);
        q3_sampler_free(s);
    }
    /* min-p and top-p together: the smaller of the two prefixes wins */
    q3_sampler_params p = params(1.0f, 0, 0.85f, 0.5f, 3);
    q3_sampler *s = q3_sampler_new(&p, 5);
    const int keep[5] = {1, 1, 0, 0, 0};
    softmax_keep(l, 5, 1.0, keep, want);
    check_frequencies(s, l, 5, want, 5000);
    q3_sampler_free(s);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Full-size vocab: every draw lies in the exact top-k / top-p set computed
 * here by a full sort. Flat-ish logits make the top-p set hundreds of tokens
 * long, which exercises the chunked partial sort. */
static void test_large_vocab_sets(void) {
    float *logits = malloc(QWEN_VOCAB * sizeof *logits), *tmp = malloc(QWEN_VOCAB * sizeof *tmp);
    float *sorted = malloc(QWEN_VOCAB * sizeof *sorted);
    if (!CHECK(logits && tmp && sorted)) return;
    for (int i = 0; i < QWEN_VOCAB; i++) logits[i] = (float)(urand() * 12.0);
    memcpy(sorted, logits, QWEN_VOCAB * sizeof *sorted);
    qsort(sorted, QWEN_VOCAB, sizeof *sorted, cmp_desc);

    /* top-k 20: draws have logit >= the 20th largest */
    q3_sampler_params p = params(1.0f, 20, 1.0f, 0.0f, 21);
    q3_sampler *s = q3_sampler_new(&p, QWEN_VOCAB);
    int bad = 0;
    for (int i = 0; i < 500; i++) bad += logits[draw(s, logits, tmp, QWEN_VOCAB)] < sorted[19];
    CHECK_EQ_INT(bad, 0);
    q3_sampler_free(s);

    /* top-p 0.9 without top-k at T = 1: compute the prefix length */
    double max = sorted[0], z = 0.0, cum = 0.0;
    for (int i = 0; i < QWEN_VOCAB; i++) z += exp(sorted[i] - max);
    int np = 0;
    while (np < QWEN_VOCAB && cum < 0.9) cum += exp(sorted[np++] - max) / z;
    CHECK(np > 200); /* the chunked path must go past its first chunk */
    p = params(1.0f, 0, 0.9f, 0.0f, 22);
    s = q3_sampler_new(&p, QWEN_VOCAB);
    bad = 0;
    int hit_tail = 0; /* some draws should land deep in the kept set */
    for (int i = 0; i < 400; i++) {
        float lv = logits[draw(s, logits, tmp, QWEN_VOCAB)];
        bad += lv < sorted[np - 1];
        hit_tail += lv < sorted[np / 2];
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(hit_tail > 0);
    q3_sampler_free(s);

    /* defaults (T 0.7, top-k 20, top-p 0.8) stay inside the top 20 */
    q3_sampler_defaults(&p);
    p.seed = 23;
    s = q3_sampler_new(&p, QWEN_VOCAB);
    bad = 0;
    for (int i = 0; i < 200; i++) bad += logits[draw(s, logits, tmp, QWEN_VOCAB)] < sorted[19];
    CHECK_EQ_INT(bad, 0);
    q3_sampler_free(s);

    free(logits);
    free(tmp);
    free(sorted);
}

/* The top-k set over a full vocabulary is exactly the k best, ties going
 * to the lowest ids: 25 tokens share the top logit (the 20 lowest ids must
 * be kept), NaNs and near-misses are scattered through; at a flat
 * temperature every kept token gets drawn and nothing else does. */
static void test_top_k_exact_set(void) {
    float *logits = malloc(QWEN_VOCAB * sizeof *logits), *tmp = malloc(QWEN_VOCAB * sizeof *tmp);
    int *hits = calloc(QWEN_VOCAB, sizeof *hits);
    if (!CHECK(logits && tmp && hits)) return;
    for (int i = 0; i < QWEN_VOCAB; i++) logits[i] = (float)(urand() * 4.0);
    int top[25];
    for (int j = 0; j < 25; j++) top[j] = 3000 + j * 5987; /* increasing ids */
    for (int j = 0; j < 25; j++) logits[top[j]] = 5.0f;
    for (int i = 7; i < QWEN_VOCAB; i += 9973) logits[i] = NAN;
    for (int i = 11; i < QWEN_VOCAB; i += 7919) logits[i] = nextafterf(5.0f, 0.0f);
    q3_sampler_params p = params(1000.0f, 20, 1.0f, 0.0f, 31);
    q3_sampler *s = q3_sampler_new(&p, QWEN_VOCAB);
    for (int i = 0; i < 2000; i++) hits[draw(s, logits, tmp, QWEN_VOCAB)]++;
    int kept = 0, outside = 0;
    for (int j = 0; j < 20; j++) kept += hits[top[j]] > 0;
    for (int i = 0; i < QWEN_VOCAB; i++) outside += hits[i];
    for (int j = 0; j < 20; j++) outside -= hits[top[j]];
    CHECK_EQ_INT(kept, 20);
    CHECK_EQ_INT(outside, 0);
    q3_sampler_free(s);
    free(logits), free(tmp), free(hits);
}

/* A top-p set made mostly of tied tail tokens, each only a little above the
 * pre-sort cutoff: one token of probability 0.4 plus 999 of 0.6/999. top_p
 * 0.5 needs the head and 167 tail tokens, the lowest ids among the ties. */
static void test_top_p_tied_tail(void) {
    enum { V = 1000, N = 2000 };
    static float logits[V], tmp[V];
    logits[0] = logf(0.4f);
    for (int i = 1; i < V; i++) logits[i] = logf(0.6f / 999.0f);
    q3_sampler_params p = params(1.0f, 0, 0.5f, 0.0f, 31);
    q3_sampler *s = q3_sampler_new(&p, V);
    int tail = 0, beyond = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = draw(s, logits, tmp, V);
        tail += t != 0;
        beyond += t > 168; /* one token of slack for float rounding of the sum */
    }
    CHECK_EQ_INT(beyond, 0);
    /* kept mass 0.4 + 167 * 0.6/999 ~ 0.5003, so the tail gets ~20% */
    double want = 1.0 - 0.4 / (0.4 + 167 * 0.6 / 999);
    CHECK_NEAR(tail, N * want, 5.0 * sqrt(N * want * (1.0 - want)));
    q3_sampler_free(s);
}

static void test_repeat_penalty(void) {
    float tmp[4];
    q3_sampler_params p = params(0.0f, 0, 1.0f, 0.0f, 1);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 2;

    /* positive logit divided: 2.0 / 1.5 = 1.33 < 1.9 */
    const float pos[4] = {2.0f, 1.9f, -1.0f, -1.05f};
    q3_sampler *s = q3_sampler_new(&p, 4);
    CHECK_EQ_INT(draw(s, pos, tmp, 4), 0);
    q3_sampler_accept(s, 0);
    CHECK_EQ_INT(draw(s, pos, tmp, 4), 1);
    /* the window is 2 tokens: after two others, 0 is no longer penalised */
    q3_sampler_accept(s, 2);
    q3_sampler_accept(s, 3);
    CHECK_EQ_INT(draw(s, pos, tmp, 4), 0);
    q3_sampler_free(s);

    /* negative logit multiplied: -1.0 * 1.5 = -1.5 < -1.2 */
    const float neg[4] = {-1.0f, -1.2f, -3.0f, -4.0f};
    s = q3_sampler_new(&p, 4);
    q3_sampler_accept(s, 0);
    CHECK_EQ_INT(draw(s, neg, tmp, 4), 1);
    q3_sampler_free(s);

    /* a token repeated in the window is penalised once: 2.0 / 1.5 > 1.0 */
    const float once[4] = {2.0f, 1.0f, 0.0f, 0.0f};
    s = q3_sampler_new(&p, 4);
    q3_sampler_accept(s, 0);
    q3_sampler_accept(s, 0);
    CHECK_EQ_INT(draw(s, once, tmp, 4), 0);
    CHECK_NEAR(tmp[0], 2.0f / 1.5f, 1e-6);
    q3_sampler_free(s);

    /* penalty 1.0 changes nothing; out-of-range ids are ignored */
    p.repeat_penalty = 1.0f;
    s = q3_sampler_new(&p, 4);
    q3_sampler_accept(s, 0);
    q3_sampler_accept(s, -1);
    q3_sampler_accept(s, 4);
    CHECK_EQ_INT(draw(s, pos, tmp, 4), 0);
    q3_sampler_free(s);
}

static void test_bad_params(void) {
    q3_sampler_params p;
    q3_sampler_defaults(&p);
    CHECK(q3_sampler_new(&p, 0) == NULL);
    CHECK(strstr(q3_errmsg(), "vocab") != NULL);
    p.repeat_penalty = 0.0f;
    CHECK(q3_sampler_new(&p, 10) == NULL);
    CHECK(strstr(q3_errmsg(), "repeat_penalty") != NULL);
    q3_sampler_defaults(&p);
    p.temperature = NAN;
    CHECK(q3_sampler_new(&p, 10) == NULL);
    CHECK(strstr(q3_errmsg(), "temperature") != NULL);
    q3_sampler_defaults(&p);
    p.repeat_last_n = -1;
    CHECK(q3_sampler_new(&p, 10) == NULL);
    CHECK(strstr(q3_errmsg(), "repeat_last_n") != NULL);
    q3_sampler_free(NULL);
}

/* NaN logits are never drawn; all -inf but one still works. */
static void test_non_finite(void) {
    const float l[5] = {NAN, 1.0f, NAN, 1.0f, -INFINITY};
    const double want[5] = {0, 0.5, 0, 0.5, 0};
    q3_sampler_params p = params(1.0f, 0, 1.0f, 0.0f, 8);
    q3_sampler *s = q3_sampler_new(&p, 5);
    check_frequencies(s, l, 5, want, 2000);
    q3_sampler_free(s);
    const float inf[3] = {-INFINITY, INFINITY, 0.0f};
    const double want_inf[3] = {0, 1, 0};
    s = q3_sampler_new(&p, 3);
    check_frequencies(s, inf, 3, want_inf, 100);
    q3_sampler_free(s);
}

/* Every logit NaN: no token, for greedy, top-k, top-p-only (every token
 * gathered) and the vocab-parallel pick, never a made-up id. */
static void test_all_nan(void) {
    enum { V = 100 };
    float row[V], tmp[V];
    for (int i = 0; i < V; i++) row[i] = NAN;
    const q3_sampler_params sets[] = {params(0.0f, 20, 1.0f, 0.0f, 1), params(0.8f, 20, 0.9f, 0.0f, 2),
                                      params(0.8f, 0, 0.9f, 0.05f, 3)};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        q3_sampler *s = q3_sampler_new(&sets[si], V);
        memcpy(tmp, row, sizeof row);
        CHECK_EQ_INT(q3_sampler_sample(s, tmp), Q3_SAMPLE_NONE);
        const int k = q3_sampler_cands_per_rank(&sets[si], V, V / 2);
        if (k > 0) {
            q3_sample_cand all[2 * 20];
            memcpy(tmp, row, sizeof row);
            for (int r = 0; r < 2; r++) q3_sampler_local(s, tmp + r * (V / 2), r * (V / 2), V / 2, all + r * k, k);
            CHECK_EQ_INT(q3_sampler_pick(s, all, (size_t)(2 * k)), Q3_SAMPLE_NONE);
        }
        /* one finite logit is enough */
        memcpy(tmp, row, sizeof row);
        tmp[37] = -3.0f;
        CHECK_EQ_INT(q3_sampler_sample(s, tmp), 37);
        q3_sampler_free(s);
    }
}

/* Vocab-parallel sampling: slices' candidates, gathered and picked, give
 * the token one rank draws from the whole row, draw after draw (same seed,
 * same history), for greedy and seeded top-k/top-p/min-p/temperature with
 * the repetition penalty, over tied, NaN and -inf logits and uneven slices. */
static void test_distributed_matches_one_rank(void) {
    enum { V = 1000, DRAWS = 300, MAX_L = 4, MAX_K = 32 };
    const q3_sampler_params sets[] = {
        params(0.0f, 20, 0.95f, 0.0f, 3),   params(0.8f, 20, 0.9f, 0.05f, 4), params(1.5f, 5, 1.0f, 0.0f, 5),
        params(0.7f, 1, 0.95f, 0.0f, 6),    params(1.0f, 32, 0.5f, 0.2f, 7),
    };
    float *row = malloc(V * sizeof *row), *one = malloc(V * sizeof *one), *part = malloc(V * sizeof *part);
    q3_sample_cand *all = malloc(MAX_L * MAX_K * sizeof *all);
    CHECK(row && one && part && all);
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++)
        for (int L = 1; L <= MAX_L; L++) {
            q3_sampler_params p = sets[si];
            p.repeat_penalty = si % 2 ? 1.3f : 1.0f;
            p.repeat_last_n = 16;
            q3_sampler *ref = q3_sampler_new(&p, V), *dist = q3_sampler_new(&p, V);
            const int k = q3_sampler_cands_per_rank(&p, V, V / MAX_L);
            int same = k > 0;
            for (int d = 0; same && d < DRAWS; d++) {
                for (int i = 0; i < V; i++) row[i] = (float)((int)(urand() * 40.0) - 20) * 0.25f; /* many ties */
                row[(d * 7) % V] = NAN;
                row[(d * 13 + 1) % V] = -INFINITY;
                memcpy(one, row, V * sizeof *one);
                int32_t want = q3_sampler_sample(ref, one);
                /* uneven slices: rank r holds [r V / L, (r+1) V / L) */
                memcpy(part, row, V * sizeof *part);
                for (int r = 0; r < L; r++) {
                    int lo = r * V / L, hi = (r + 1) * V / L;
                    q3_sampler_local(dist, part + lo, lo, hi - lo, all + (size_t)r * k, k);
                }
                int32_t got = q3_sampler_pick(dist, all, (size_t)k * L);
                same = got == want;
                q3_sampler_accept(ref, want);
                q3_sampler_accept(dist, got);
            }
            if (!same) fprintf(stderr, "distributed sampling differs: parameter set %zu, %d slices\n", si, L);
            CHECK(same);
            q3_sampler_free(ref);
            q3_sampler_free(dist);
        }
    free(row), free(one), free(part), free(all);

    /* Candidates per rank: 1 greedy, top_k with top-k on, 0 (whole rows)
     * with top-k off or when k candidates are not smaller than the slice. */
    q3_sampler_params p = params(0.0f, 0, 1.0f, 0.0f, 1);
    CHECK_EQ_INT(q3_sampler_cands_per_rank(&p, QWEN_VOCAB, QWEN_VOCAB / 2), 1);
    p = params(0.6f, 20, 0.95f, 0.0f, 1);
    CHECK_EQ_INT(q3_sampler_cands_per_rank(&p, QWEN_VOCAB, QWEN_VOCAB / 4), 20);
    p.top_k = 0;
    CHECK_EQ_INT(q3_sampler_cands_per_rank(&p, QWEN_VOCAB, QWEN_VOCAB / 4), 0);
    p.top_k = QWEN_VOCAB;
    CHECK_EQ_INT(q3_sampler_cands_per_rank(&p, QWEN_VOCAB, QWEN_VOCAB / 4), 0);
    p.top_k = 500;
    CHECK_EQ_INT(q3_sampler_cands_per_rank(&p, 1024, 1000), 500 * 8 < 1000 * 4 ? 500 : 0);
}

int main(void) {
    test_greedy();
    test_top_k_1_is_greedy();
    test_seeding();
    test_frequencies();
    test_top_p();
    test_min_p();
    test_large_vocab_sets();
    test_top_k_exact_set();
    test_top_p_tied_tail();
    test_repeat_penalty();
    test_bad_params();
    test_non_finite();
    test_all_nan();
    test_distributed_matches_one_rank();
    UNIT_MAIN_END();
}
