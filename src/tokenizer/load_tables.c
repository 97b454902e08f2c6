/* model.vocab and model.merges: ~150k entries each, read straight from the
 * text into the tokenizer's tables (see json_scan.h for why not jansson). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_load.h"

void tok_put_token_bytes(tok_buf *out, const char *s, size_t n) {
    size_t start = out->len;
    tok_buf_put(out, s, n); /* reserves room: the bytes are never longer */
    unsigned char *w = (unsigned char *)out->data + start;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = p[i] < 0x80 ? (cp = p[i], 1) : tok_utf8_next(p + i, n - i, &cp);
        int b = k > 0 ? q3_unicode_to_byte(cp) : -1;
        if (b < 0) return; /* keep the string's own UTF-8, already copied */
        *w++ = (unsigned char)b;
        i += (size_t)k;
    }
    out->len = (size_t)((char *)w - out->data);
    out->data[out->len] = 0;
}

int tok_read_vocab(q3_tokenizer *t, json_scan *s, tok_buf *arena, tok_vocab_entry **out, size_t *n_out,
                   int32_t *max_id) {
    size_t cap = 1024, n = 0;
    tok_vocab_entry *v = q3_malloc(cap * sizeof *v);
    tok_buf key = {0};
    int rc = js_expect(s, '{', "model.vocab must be an object of token -> id");
    if (rc == 0 && js_peek(s) == '}') s->p++;
    else
        for (int more = rc == 0; more > 0;) {
            long long id;
            if (js_string(s, &key) || js_expect(s, ':', "expected ':'") || js_int(s, &id)) {
                rc = -1;
                break;
            }
            if (id < 0 || id >= INT32_MAX) {
                rc = tok_bad(t, "model.vocab", "token \"%s\" has id %lld, outside [0, %d)", key.data, id, INT32_MAX);
                break;
            }
            if (n == cap) v = q3_realloc(v, (cap *= 2) * sizeof *v);
            v[n].id = (int32_t)id;
            v[n].off = (uint32_t)arena->len;
            tok_put_token_bytes(arena, key.data, key.len);
            v[n].len = (uint32_t)(arena->len - v[n].off);
            tok_buf_put(arena, "", 1); /* NUL after each token, for callers that print them */
            if (v[n].id > *max_id) *max_id = v[n].id;
            n++;
            more = js_next(s, '}', "expected ',' or '}' in model.vocab");
            if (more < 0) rc = -1;
        }
    free(key.data);
    if (rc == 0 && n == 0) rc = tok_bad(t, "model.vocab", "is empty");
    if (rc) {
        free(v);
        return -1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* Vocab id of a byte-level token string, or -1. */
static int32_t vocab_id(const q3_tokenizer *t, const tok_buf *str, tok_buf *bytes) {
    bytes->len = 0;
    tok_put_token_bytes(bytes, str->data, str->len);
    return tok_str_map_get(&t->vocab, t->arena, bytes->data, bytes->len);
}

/* One merge: "left right" (older files) or ["left", "right"]. */
static int read_pair(q3_tokenizer *t, json_scan *s, uint32_t rank, tok_buf *l, tok_buf *r) {
    if (js_peek(s) == '[') {
        s->p++;
        if (js_string(s, l) || js_expect(s, ',', "expected ','") || js_string(s, r) ||
            js_expect(s, ']', "a merge has exactly two tokens"))
            return -1;
        return 0;
    }
    if (js_string(s, l)) return -1;
    char *sp = l->data ? memchr(l->data, ' ', l->len) : NULL;
    if (!sp || memchr(sp + 1, ' ', l->len - (size_t)(sp + 1 - l->data))) {
        char field[64];
        snprintf(field, sizeof field, "model.merges[%u]", rank);
        return tok_bad(t, field, "\"%s\" is not two tokens separated by one space", l->data ? l->data : "");
    }
    r->len = 0;
    tok_buf_put(r, sp + 1, l->len - (size_t)(sp + 1 - l->data));
    l->len = (size_t)(sp - l->data);
    l->data[l->len] = 0;
    return 0;
}

int tok_read_merges(q3_tokenizer *t, json_scan *s) {
    tok_buf l = {0}, r = {0}, lb = {0}, rb = {0};
    tok_pair_map_init(&t->merges, t->vocab.n); /* BPE has about one merge per token */
    int rc = js_expect(s, '[', "model.merges must be an array");
    if (rc == 0 && js_peek(s) == ']') s->p++;
    else
        for (uint32_t rank = 0, more = rc == 0; more; rank++) {
            char field[64];
            if (read_pair(t, s, rank, &l, &r)) {
                rc = -1;
                break;
            }
            int32_t left = vocab_id(t, &l, &lb), right = vocab_id(t, &r, &rb);
            if (left < 0 || right < 0) {
                snprintf(field, sizeof field, "model.merges[%u]", rank);
                rc = tok_bad(t, field, "token \"%s\" is not in model.vocab", left < 0 ? l.data : r.data);
                break;
            }
            tok_buf_put(&lb, rb.data, rb.len);
            int32_t merged = tok_str_map_get(&t->vocab, t->arena, lb.data, lb.len);
            if (merged < 0) {
                snprintf(field, sizeof field, "model.merges[%u]", rank);
                rc = tok_bad(t, field, "the merged token \"%s%s\" is not in model.vocab", l.data, r.data);
                break;
            }
            tok_pair_map_put(&t->merges, left, right, rank, merged);
            int k = js_next(s, ']', "expected ',' or ']' in model.merges");
            if (k < 0) rc = -1;
            more = k > 0;
        }
    free(l.data);
    free(r.data);
    free(lb.data);
    free(rb.data);
    return rc;
}
