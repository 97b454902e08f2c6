/* Open-addressing hash tables for the vocab (bytes -> id) and the merge
 * ranks ((id, id) -> rank, merged id). Both are filled once at load time and
 * only read afterwards, so there is no deletion. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/error.h"

uint64_t tok_hash_bytes(const void *p, size_t n) {
    /* FNV-1a, then a final mix so that the low bits are usable as an index. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Load factor stays <= 0.7: linear probing is still short there, and the
 * tables are a quarter smaller than at 0.5 (fewer page faults at load). */
static int over_full(size_t n, size_t cap) { return n * 10 > cap * 7; }

static size_t pow2_for(size_t expected) {
    size_t cap = 16;
    while (over_full(expected, cap)) cap *= 2;
    return cap;
}

void tok_str_map_init(tok_str_map *m, size_t expected) {
    m->cap = pow2_for(expected);
    m->n = 0;
    m->slots = q3_malloc(m->cap * sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].id = -1;
}

void tok_str_map_free(tok_str_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static void str_map_grow(tok_str_map *m, const char *arena) {
    tok_str_map big;
    tok_str_map_init(&big, m->cap);
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].id >= 0) tok_str_map_put(&big, arena, m->slots[i].off, m->slots[i].len, m->slots[i].id);

    free(m->slots);
    *m = big;
}

int32_t tok_str_map_put(tok_str_map *m, const char *arena, uint32_t off, uint32_t len, int32_t id) {
    if (over_full(m->n + 1, m->cap)) str_map_grow(m, arena);
    uint64_t h = tok_hash_bytes(arena + off, len);
    size_t mask = m->cap - 1, i = h & mask;
    for (;; i = (i + 1) & mask) {
        tok_str_slot *s = &m->slots[i];
        if (s->id < 0) {
            *s = (tok_str_slot){off, len, id, (uint32_t)(h >> 32)};
            m->n++;
            return -1;
        }
        if (s->tag == (uint32_t)(h >> 32) && s->len == len && memcmp(arena + s->off, arena + off, len) == 0)
            return s->id;
    }
}

int32_t tok_str_map_get(const tok_str_map *m, const char *arena, const void *key, size_t len) {
    if (!m->cap) return -1;
    uint64_t h = tok_hash_bytes(key, len);
    size_t mask = m->cap - 1, i = h & mask;
    for (;; i = (i + 1) & mask) {
        const tok_str_slot *s = &m->slots[i];
        if (s->id < 0) return -1;
        if (s->tag == (uint32_t)(h >> 32) && s->len == len && memcmp(arena + s->off, key, len) == 0) return s->id;
    }
}

void tok_pair_map_init(tok_pair_map *m, size_t expected) {
    m->cap = pow2_for(expected);
    m->n = 0;
    m->keys = q3_malloc(m->cap * sizeof *m->keys);
    m->vals = q3_malloc(m->cap * sizeof *m->vals);
    memset(m->keys, 0xFF, m->cap * sizeof *m->keys);
}

void tok_pair_map_free(tok_pair_map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

void tok_pair_map_put(tok_pair_map *m, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    if (over_full(m->n + 1, m->cap)) {
        tok_pair_map big;
        tok_pair_map_init(&big, m->cap);
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i] != UINT64_MAX)
                tok_pair_map_put(&big, (int32_t)(m->keys[i] >> 32), (int32_t)(uint32_t)m->keys[i],
                                 (uint32_t)(m->vals[i] >> 32), (int32_t)(uint32_t)m->vals[i]);
        tok_pair_map_free(m);
        *m = big;
    }
    uint64_t key = pair_key(a, b);
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & mask;
    if (m->keys[i] == UINT64_MAX) m->n++;
    /* A repeated merge keeps the later rank, as a map built from the list does in HF. */
    m->keys[i] = key;
    m->vals[i] = (uint64_t)rank << 32 | (uint32_t)merged;
}

int tok_pair_map_get(const tok_pair_map *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    if (a < 0 || b < 0) return 0;
    uint64_t key = pair_key(a, b);
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    for (;; i = (i + 1) & mask) {
        if (m->keys[i] == key) {
            *rank = (uint32_t)(m->vals[i] >> 32);
            *merged = (int32_t)(uint32_t)m->vals[i];
            return 1;
        }
        if (m->keys[i] == UINT64_MAX) return 0;
    }
}
