/* Token sampler. Candidates are (value, id) pairs ordered by value, then by
 * lower id, so every selection is deterministic even with tied logits.
 * Cost per call for vocab V: O(V) for the penalty, softmax and min-p cutoff;
 * O(V log k) for top-k; top-p without top-k never sorts: a cutoff drops the
 * tokens too unlikely to matter, then a quickselect on cumulative mass finds
 * the top-p set in expected linear time. */
#include "sample/sampler.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* The ring buffer of recent tokens is sized by repeat_last_n; refuse sizes
 * that could only be a typo. */
#define MAX_REPEAT_LAST_N (1 << 20)

/* v: the logit, later the unnormalised probability; id < 0: padding. */
typedef q3_sample_cand cand;

struct q3_sampler {
    q3_sampler_params p;
    int vocab;
    cand *c;             /* [vocab] candidates */
    uint8_t *mark;       /* [vocab] dedup of the penalty window, kept all-zero between calls */
    int32_t *hist;       /* [repeat_last_n] ring buffer of accepted tokens */
    int hist_len, hist_pos;
    uint64_t rng;
};

void q3_sampler_defaults(q3_sampler_params *p) {
    p->temperature = 0.7f;
    p->top_k = 20;
    p->top_p = 0.8f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0; /* the CLI substitutes a time-based seed when given none */
}

/* splitmix64 spreads any seed (0 included) into a non-zero xorshift state. */
static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t xorshift64star(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t *s) { return (double)(xorshift64star(s) >> 11) * (1.0 / 9007199254740992.0); }

q3_sampler *q3_sampler_new(const q3_sampler_params *p, int vocab_size) {
    if (vocab_size <= 0) {
        q3_err("sampler: vocab_size %d must be positive", vocab_size);
        return NULL;
    }
    if (!isfinite(p->temperature)) {
        q3_err("sampler: temperature %g must be a finite number", (double)p->temperature);
        return NULL;
    }
    if (isnan(p->top_p)) {
        q3_err("sampler: top_p is NaN");
        return NULL;
    }
    if (isnan(p->min_p) || p->min_p > 1.0f) {
        q3_err("sampler: min_p %g must be in [0, 1]", (double)p->min_p);
        return NULL;
    }
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty)) {
        q3_err("sampler: repeat_penalty %g must be a positive number", (double)p->repeat_penalty);
        return NULL;
    }
    if (p->repeat_last_n < 0 || p->repeat_last_n > MAX_REPEAT_LAST_N) {
        q3_err("sampler: repeat_last_n %d must be in [0, %d]", p->repeat_last_n, MAX_REPEAT_LAST_N);
        return NULL;
    }
    q3_sampler *s = q3_calloc(1, sizeof *s);
    s->p = *p;
    s->vocab = vocab_size;
    s->c = q3_malloc((size_t)vocab_size * sizeof *s->c);
    s->mark = q3_calloc((size_t)vocab_size, 1);
    s->hist = q3_malloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1) * sizeof *s->hist);
    s->rng = splitmix64(p->seed);
    if (s->rng == 0) s->rng = 0x9E3779B97F4A7C15ull; /* xorshift state must be non-zero */
    return s;
}

void q3_sampler_free(q3_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->mark);
    free(s->hist);
    free(s);
}

void q3_sampler_forget(q3_sampler *s) { s->hist_len = s->hist_pos = 0; }

void q3_sampler_accept(q3_sampler *s, int32_t token) {
    int n = s->p.repeat_last_n;
    if (n <= 0 || token < 0 || token >= s->vocab) return;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % n;
    if (s->hist_len < n) s->hist_len++;
}

/* Each distinct token of the window is penalised once, as in llama.cpp.
 * slice holds the logits of ids [lo, lo + n) (the whole vocab on one rank):
 * a rank of a vocab-split lm_head penalises the tokens of its own slice,
 * element for element what one rank does to the full row. */
static void apply_repeat_penalty(q3_sampler *s, float *slice, int lo, int n) {
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || s->hist_len == 0) return;
    for (int i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        if (s->mark[t] || t < lo || t >= lo + n) continue;
        s->mark[t] = 1;
        float *x = &slice[t - lo];
        *x = *x > 0.0f ? *x / pen : *x * pen;
    }
    for (int i = 0; i < s->hist_len; i++) s->mark[s->hist[i]] = 0;
}

/* NaN logits are never chosen; when everything is NaN there is no answer. */
static int32_t argmax(const float *x, int n) {
    int32_t best = Q3_SAMPLE_NONE;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
}

/* Strict total order: higher value first, then lower id. */
static inline int better(const cand *a, const cand *b) { return a->v > b->v || (a->v == b->v && a->id < b->id); }

static inline void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Heap with the *worst* element at the root: a bounded top-k selector, and a
 * heap sort that leaves the array best-first. */
static void sift_down(cand *a, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        if (l < n && better(&a[w], &a[l])) w = l;
        if (l + 1 < n && better(&a[w], &a[l + 1])) w = l + 1;
        if (w == i) return;
        swap_cand(&a[i], &a[w]);
        i = w;
    }
}

static void sort_best_first(cand *a, size_t n) {
    if (n < 2) return;
    for (size_t i = n / 2; i-- > 0;) sift_down(a, n, i);
    for (size_t end = n - 1; end > 0; end--) {
        swap_cand(&a[0], &a[end]);
        sift_down(a, end, 0);
    }
}

/* Median of a[lo], a[mid], a[last] moved to a[last], to serve as pivot. */
static void pivot_to_end(cand *a, size_t lo, size_t last) {
    size_t mid = lo + (last - lo) / 2;
    if (better(&a[mid], &a[lo])) swap_cand(&a[mid], &a[lo]);
    if (better(&a[last], &a[lo])) swap_cand(&a[last], &a[lo]);
    if (better(&a[last], &a[mid])) swap_cand(&a[last], &a[mid]);
    swap_cand(&a[mid], &a[last]);
}

/* Length k of the smallest best-first prefix with mass >= target, found by a
 * quickselect on cumulative mass: a[0..k) ends up holding exactly that
 * prefix, unordered, with no full sort. Invariant: the best lo elements sit
 * in a[0..lo) with mass acc < target, and the answer lies in (lo, hi]. */
static size_t mass_prefix_unsorted(cand *a, size_t n, double target) {
    size_t lo = 0, hi = n;
    double acc = 0.0;
    while (hi - lo > 1) {
        size_t last = hi - 1, store = lo;
        pivot_to_end(a, lo, last);
        const cand pivot = a[last];
        double left = 0.0; /* mass strictly better than the pivot */
        for (size_t i = lo; i < last; i++) {
            /* branch-free Lomuto: the unconditional swap only moves a worse
             * element within the worse region when x is not better */
            cand x = a[i];
            int b = better(&x, &pivot);
            a[i] = a[store];
            a[store] = x;
            store += (size_t)b;
            left += b ? x.v : 0.0f;
        }
        swap_cand(&a[store], &a[last]);
        if (acc + left >= target) {
            hi = store;
        } else if (acc + left + a[store].v >= target) {
            return store + 1;
        } else {
            acc += left + a[store].v;
            lo = store + 1;
        }
    }
    return hi;
}

/* Bounded top-k selector: offer x to the heap h of n (at most k) kept
 * candidates, whose root is the worst of them. */
static void heap_offer(cand *h, size_t *n, size_t k, cand x) {
    if (*n < k) {
        size_t j = (*n)++; /* sift up: the root must stay the worst kept candidate */
        h[j] = x;
        while (j > 0 && better(&h[(j - 1) / 2], &h[j])) {
            swap_cand(&h[(j - 1) / 2], &h[j]);
            j = (j - 1) / 2;
        }
    } else if (better(&x, &h[0])) {
        h[0] = x;
        sift_down(h, *n, 0);
    }
}

/* Keep the k best of logits[0..n) (ids lo + i) in h[0..), best first;
 * returns how many (fewer than k only when the slice has fewer non-NaN). */
static size_t top_k_of(cand *h, const float *logits, int lo, int n, size_t k) {
    size_t m = 0;
    int i = 0;
    if (k == 0) return 0; /* no heap root to compare against below */
    for (; i < n && m < k; i++)
        if (!isnan(logits[i])) heap_offer(h, &m, k, (cand){logits[i], lo + i});
    /* Full heap: a later id wins a tie with no kept candidate, so only a
     * strictly larger logit can enter (a NaN fails the test too). One
     * compare per logit instead of a call: the scan was most of a 0.3 ms
     * sample over a 151936-word vocabulary. */
    for (; i + 16 <= n; i += 16) { /* blocks of 16 tested at once (the compiler's vectors) */
        const float t = h[0].v;
        int any = 0;
        for (int j = 0; j < 16; j++) any |= logits[i + j] > t;
        if (any)
            for (int j = i; j < i + 16; j++)
                if (logits[j] > h[0].v) heap_offer(h, &m, k, (cand){logits[j], lo + j});
    }
    for (; i < n; i++)
        if (logits[i] > h[0].v) heap_offer(h, &m, k, (cand){logits[i], lo + i});
    sort_best_first(h, m);
    return m;
}

static size_t gather_all(q3_sampler *s, const float *logits) {
    size_t n = 0;
    for (int i = 0; i < s->vocab; i++)
        if (!isnan(logits[i])) s->c[n++] = (cand){logits[i], i};
    return n;
}

/* Smallest best-first prefix whose probability mass reaches top_p; at least
 * one token is always kept. */
static size_t top_p_prefix(cand *c, size_t n, int sorted, double z, double top_p) {
    if (top_p <= 0.0 || n == 1) {
        if (!sorted)
            for (size_t i = 1; i < n; i++)
                if (better(&c[i], &c[0])) swap_cand(&c[i], &c[0]);
        return 1;
    }
    double target = top_p * z;
    if (!sorted) return mass_prefix_unsorted(c, n, target);
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].v;
        if (cum >= target) return i + 1;
    }
    return n;
}

/* Compact c to the elements with v >= t, order kept. Branch-free because
 * about half the branches would mispredict on flat distributions. */
static size_t keep_at_least(cand *c, size_t n, float t) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        c[m] = c[i];
        m += c[i].v >= t;
    }
    return m;
}

/* Softmax with temperature over the n candidates in s->c (best first when
 * sorted), min-p, top-p, then one draw. */
static int32_t draw(q3_sampler *s, size_t n, int sorted) {
    const q3_sampler_params *p = &s->p;
    if (n == 0) return Q3_SAMPLE_NONE;
    cand *c = s->c;

    float max = c[0].v;
    for (size_t i = 1; i < n; i++)
        if (c[i].v > max) max = c[i].v;
    /* max == -inf: every logit is -inf, treat them as equally likely. The
     * equality test also keeps +inf logits from producing inf - inf. */
    float inv_t = 1.0f / p->temperature;
    double z = 0.0;
    for (size_t i = 0; i < n; i++) {
        float e = c[i].v == max ? 1.0f : expf((c[i].v - max) * inv_t);
        c[i].v = e;
        z += e;
    }

    /* min-p and top-p each keep a best-first prefix, so they commute; min-p
     * goes first because it is a cheap O(n) cut that shrinks what top-p scans.
     * The max probability is 1/z, so prob < min_p * max  <=>  e < min_p. */
    size_t n_all = n;
    if (p->min_p > 0.0f) {
        n = keep_at_least(c, n, p->min_p); /* the max itself (e == 1) always survives */
    }
    if (p->top_p < 1.0f) {
        /* Cutoff before sorting: all tokens with e < t hold less than
         * n_all*t/z of the mass, under 1 - top_p, so the tokens with e >= t
         * (a best-first prefix) hold more than top_p and the top-p prefix
         * lies inside them. */
        if (!sorted && p->top_p > 0.0f) {
            n = keep_at_least(c, n, (float)(0.999 * (1.0 - p->top_p) * z / (double)n_all));
        }
        n = top_p_prefix(c, n, sorted, z, p->top_p);
    }

    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += c[i].v;
    double r = rng_uniform(&s->rng) * total;
    for (size_t i = 0; i < n; i++) {
        r -= c[i].v;
        if (r < 0.0) return c[i].id;
    }
    /* rounding left r >= 0: take the last token with non-zero weight */
    for (size_t i = n; i-- > 0;)
        if (c[i].v > 0.0f) return c[i].id;
    return c[0].id;
}

static int top_k_on(const q3_sampler_params *p, int vocab) { return p->top_k > 0 && p->top_k < vocab; }

int32_t q3_sampler_sample(q3_sampler *s, float *logits) {
    apply_repeat_penalty(s, logits, 0, s->vocab);
    if (s->p.temperature <= 0.0f) return argmax(logits, s->vocab);
    if (top_k_on(&s->p, s->vocab)) return draw(s, top_k_of(s->c, logits, 0, s->vocab, (size_t)s->p.top_k), 1);
    return draw(s, gather_all(s, logits), 0);
}

/* ------------------------------------------------ vocab-parallel sampling */

/* Why a fallback rather than a bounded candidate count when top-k is off:
 * the tokens top-p / min-p keep (or, with neither, every token) depend on
 * the whole distribution and can number up to the vocab on a flat one; a
 * fixed bound would silently cut the distribution drawn from, and an exact
 * variable-size exchange needs the global max and normaliser first (two
 * more rounds and an allgatherv per token). The settings generate is run
 * with (greedy, Qwen3's top-k 20) take the candidate path. */
int q3_sampler_cands_per_rank(const q3_sampler_params *p, int vocab, int slice_n) {
    int k = p->temperature <= 0.0f ? 1 : top_k_on(p, vocab) ? p->top_k : 0;
    /* k candidates of 8 bytes must be smaller than slice_n logits of 4 */
    return (long)k * (long)sizeof(q3_sample_cand) < (long)slice_n * (long)sizeof(float) ? k : 0;
}

void q3_sampler_local(q3_sampler *s, float *slice, int lo, int n, q3_sample_cand *out, int k) {
    apply_repeat_penalty(s, slice, lo, n);
    size_t m;
    if (s->p.temperature <= 0.0f) {
        int32_t b = -1; /* argmax's rule: the first of the largest non-NaN values */
        for (int i = 0; i < n; i++)
            if (!isnan(slice[i]) && (b < 0 || slice[i] > slice[b])) b = i;
        m = b >= 0;
        if (m) out[0] = (cand){slice[b], lo + b};
    } else {
        m = top_k_of(out, slice, lo, n, (size_t)k);
    }
    for (size_t i = m; i < (size_t)k; i++) out[i] = (cand){NAN, -1};
}

int32_t q3_sampler_pick(q3_sampler *s, const q3_sample_cand *all, size_t n) {
    if (s->p.temperature <= 0.0f) {
        const cand *b = NULL;
        for (size_t i = 0; i < n; i++)
            if (all[i].id >= 0 && !isnan(all[i].v) && (!b || better(&all[i], b))) b = &all[i];
        return b ? b->id : Q3_SAMPLE_NONE; /* all NaN, as argmax */
    }
    /* The global top-k lies in the union of the ranks' top-k: select it
     * again with the same order, then the same draw as one rank. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (all[i].id >= 0 && !isnan(all[i].v)) heap_offer(s->c, &m, (size_t)s->p.top_k, all[i]);
    sort_best_first(s->c, m);
    return draw(s, m, 1);
}
