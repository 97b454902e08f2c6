/* Byte-pair merging of one pre-tokenized piece.
 *
 * Repeatedly merge the adjacent pair with the lowest merge rank, leftmost
 * first on ties, until no adjacent pair is a merge. A binary heap of
 * candidate pairs keeps this O(n log n) so that long runs (a page of "=====")
 * stay fast; stale heap entries are skipped when popped. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/error.h"

typedef struct {
    uint32_t rank, pos; /* pos: index of the left symbol */
    int32_t left, right, merged;
} cand;

static int cand_less(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tok_bpe_ctx *c, cand x) {
    if (c->heap_len == c->heap_cap) {
        c->heap_cap = c->heap_cap ? c->heap_cap * 2 : 64;
        c->heap = q3_realloc(c->heap, c->heap_cap * sizeof(cand));
    }
    cand *h = c->heap;
    size_t i = c->heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static cand heap_pop(tok_bpe_ctx *c) {
    cand *h = c->heap, top = h[0], x = h[--c->heap_len];
    size_t n = c->heap_len, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &x;
        if (l < n && cand_less(&h[l], best)) m = l, best = &h[l];
        if (r < n && cand_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (n) h[i] = x;
    return top;
}

static void consider(const q3_tokenizer *t, tok_bpe_ctx *c, int32_t pos) {
    int32_t nx = c->sym_next[pos];
    if (nx < 0) return;
    cand x = {.pos = (uint32_t)pos, .left = c->sym_id[pos], .right = c->sym_id[nx]};
    if (tok_pair_map_get(&t->merges, x.left, x.right, &x.rank, &x.merged)) heap_push(c, x);
}

static void bpe_merge(const q3_tokenizer *t, tok_bpe_ctx *c, const uint8_t *s, size_t n, tok_ids *out) {
    if (n > c->sym_cap) {
        c->sym_cap = n;
        c->sym_id = q3_realloc(c->sym_id, n * sizeof(int32_t));
        c->sym_prev = q3_realloc(c->sym_prev, n * sizeof(int32_t));
        c->sym_next = q3_realloc(c->sym_next, n * sizeof(int32_t));
    }
    /* Bytes without a token are dropped, as HF's BPE does without an
     * unk_token; a byte-level vocab has all 256. */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) c->sym_id[m++] = id;
    }
    for (int32_t i = 0; i < m; i++) {
        c->sym_prev[i] = i - 1;
        c->sym_next[i] = i + 1 < m ? i + 1 : -1;
    }
    c->heap_len = 0;
    for (int32_t i = 0; i + 1 < m; i++) consider(t, c, i);
    while (c->heap_len) {
        cand x = heap_pop(c);
        int32_t p = (int32_t)x.pos, nx = c->sym_next[p];
        /* Skip entries made stale by an earlier merge: a merged-away symbol
         * has id -1, and a changed neighbour has a different id. */
        if (c->sym_id[p] != x.left || nx < 0 || c->sym_id[nx] != x.right) continue;
        c->sym_id[p] = x.merged;
        c->sym_id[nx] = -1;
        int32_t nn = c->sym_next[nx];
        c->sym_next[p] = nn;
        if (nn >= 0) c->sym_prev[nn] = p;
        if (c->sym_prev[p] >= 0) consider(t, c, c->sym_prev[p]);
        consider(t, c, p);
    }
    for (int32_t i = m ? 0 : -1; i >= 0; i = c->sym_next[i]) tok_ids_push(out, c->sym_id[i]);
}

/* Word cache: only short pieces are cached, and the table stops growing at
 * a fixed size, so a huge text cannot make it balloon. */
#define CACHE_MAX_KEY 48
#define CACHE_MAX_SLOTS 16384

struct tok_cache_slot {
    uint32_t key_off, ids_off;
    uint8_t key_len, n_ids; /* key_len 0: empty (empty pieces never reach here) */
};

static struct tok_cache_slot *cache_find(tok_bpe_ctx *c, const uint8_t *s, size_t n) {
    size_t mask = c->cache_cap - 1, i = tok_hash_bytes(s, n) & mask;
    for (;; i = (i + 1) & mask) {
        struct tok_cache_slot *e = &c->cache[i];
        if (!e->key_len || (e->key_len == n && memcmp(c->cache_keys.data + e->key_off, s, n) == 0)) return e;
    }
}

static void cache_grow(tok_bpe_ctx *c) {
    struct tok_cache_slot *old = c->cache;
    size_t old_cap = c->cache_cap;
    c->cache_cap = old_cap ? old_cap * 2 : 256;
    c->cache = q3_calloc(c->cache_cap, sizeof *c->cache);
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key_len)
            *cache_find(c, (const uint8_t *)c->cache_keys.data + old[i].key_off, old[i].key_len) = old[i];
    free(old);
}

void tok_bpe_piece(const q3_tokenizer *t, tok_bpe_ctx *c, const uint8_t *s, size_t n, tok_ids *out) {
    if (n == 0) return;
    if (n == 1 || t->ignore_merges) {
        /* With ignore_merges a piece that is itself a token is used whole;
         * a single byte is always its own token. */
        int32_t id = n == 1 ? t->byte_id[s[0]] : tok_str_map_get(&t->vocab, t->arena, s, n);
        if (id >= 0 || n == 1) {
            if (id >= 0) tok_ids_push(out, id);
            return;
        }
    }
    if (n > CACHE_MAX_KEY) {
        bpe_merge(t, c, s, n, out);
        return;
    }
    if ((c->cache_n + 1) * 2 > c->cache_cap && c->cache_cap < CACHE_MAX_SLOTS) cache_grow(c);
    struct tok_cache_slot *e = cache_find(c, s, n);
    if (e->key_len) {
        for (uint32_t i = 0; i < e->n_ids; i++) tok_ids_push(out, c->cache_ids.data[e->ids_off + i]);
        return;
    }
    size_t before = out->len;
    bpe_merge(t, c, s, n, out);
    if ((c->cache_n + 1) * 2 > c->cache_cap) return; /* full */
    e->key_off = (uint32_t)c->cache_keys.len;
    e->key_len = (uint8_t)n;
    e->ids_off = (uint32_t)c->cache_ids.len;
    e->n_ids = (uint8_t)(out->len - before); /* <= n <= CACHE_MAX_KEY */
    tok_buf_put(&c->cache_keys, s, n);
    for (size_t i = before; i < out->len; i++) tok_ids_push(&c->cache_ids, out->data[i]);
    c->cache_n++;
}

void tok_bpe_ctx_free(tok_bpe_ctx *c) {
    free(c->sym_id);
    free(c->sym_prev);
    free(c->sym_next);
    free(c->heap);
    free(c->cache);
    free(c->cache_keys.data);
    free(c->cache_ids.data);
    memset(c, 0, sizeof *c);
}
