/* Matching added tokens (<|im_start|>, <think>, ...) in text, the way HF's
 * AddedVocabulary splits: leftmost match first, longest on ties, then
 * single_word / lstrip / rstrip applied to the match. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/error.h"

static int by_first_byte_then_longest(const void *a, const void *b, void *ctx) {
    const q3_tokenizer *t = ctx;
    const tok_added *x = &t->added[*(const uint32_t *)a], *y = &t->added[*(const uint32_t *)b];
    unsigned char fx = (unsigned char)t->arena[x->off], fy = (unsigned char)t->arena[y->off];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void tok_added_matcher_build(tok_added_matcher *m, const q3_tokenizer *t, int normalized) {
    memset(m, 0, sizeof *m);
    m->order = q3_malloc((t->n_added ? t->n_added : 1) * sizeof *m->order);
    uint32_t n = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len && !!t->added[i].normalized == !!normalized) m->order[n++] = (uint32_t)i;
    qsort_r(m->order, n, sizeof *m->order, by_first_byte_then_longest, (void *)t);
    uint32_t counts[256] = {0};
    for (uint32_t i = 0; i < n; i++) counts[(unsigned char)t->arena[t->added[m->order[i]].off]]++;
    m->start[0] = 0;
    for (int b = 0; b < 256; b++) m->start[b + 1] = m->start[b] + counts[b];
}

void tok_added_matcher_free(tok_added_matcher *m) {
    free(m->order);
    m->order = NULL;
}

/* Code point ending just before s[end] (s valid UTF-8, end > 0). */
static uint32_t cp_before(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    uint32_t cp = 0;
    tok_utf8_next((const unsigned char *)s + i, end - i, &cp);
    *start = i;
    return cp;
}

static uint32_t cp_at(const char *s, size_t n, size_t i, int *len) {
    uint32_t cp = 0;
    int k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
    *len = k > 0 ? k : 1;
    return cp;
}

long tok_added_find(const q3_tokenizer *t, const tok_added_matcher *m, const char *s, size_t n, size_t from,
                    size_t floor, size_t *ms, size_t *me) {
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        long hit = -1;
        for (uint32_t k = m->start[b]; k < m->start[b + 1]; k++) {
            const tok_added *a = &t->added[m->order[k]];
            if (a->len <= n - i && memcmp(s + i, t->arena + a->off, a->len) == 0) {
                hit = (long)m->order[k];
                break; /* longest first within the bucket */
            }
        }
        if (hit < 0) continue;
        const tok_added *a = &t->added[hit];
        size_t start = i, stop = i + a->len, p;
        int len;
        if (a->single_word) {
            /* Only a whole word: no word character touching either end. */
            if ((start > 0 && tok_is_word_char(cp_before(s, start, &p))) ||
                (stop < n && tok_is_word_char(cp_at(s, n, stop, &len)))) {
                i = stop - 1; /* HF's matcher resumes after a rejected match */
                continue;
            }
        }
        if (a->lstrip)
            while (start > floor && tok_is_whitespace(cp_before(s, start, &p))) start = p;
        if (a->rstrip)
            while (stop < n && tok_is_whitespace(cp_at(s, n, stop, &len))) stop += (size_t)len;
        *ms = start;
        *me = stop;
        return hit;
    }
    return -1;
}
