/* Tokenizer lifetime and id -> bytes queries. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/error.h"
#include "util/file.h"

q3_tokenizer *q3_tok_load_buffer(const char *json, size_t len, const char *name) {
    /* (An empty file maps to no memory at all: json may be NULL.) */
    if (len == 0) {
        q3_err("%s: empty file (expected a Hugging Face tokenizer.json)", name);
        return NULL;
    }
    q3_tokenizer *t = q3_calloc(1, sizeof *t);
    t->path = q3_strdup(name);
    if (tok_load_json(t, json, len)) {
        q3_tok_free(t);
        return NULL;
    }
    return t;
}

q3_tokenizer *q3_tok_load(const char *path) {
    q3_mapped_file f;
    if (q3_map_file(&f, path)) return NULL;
    q3_tokenizer *t = q3_tok_load_buffer((const char *)f.data, f.size, path);
    q3_unmap_file(&f);
    return t;
}

void q3_tok_free(q3_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_split; i++) pcre2_code_free(t->split[i]);
    pcre2_code_free(t->bl_regex);
    tok_added_matcher_free(&t->match_raw);
    tok_added_matcher_free(&t->match_norm);
    tok_str_map_free(&t->vocab);
    tok_pair_map_free(&t->merges);
    free(t->added);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_flags);
    free(t->arena);
    free(t->path);
    free(t);
}

int q3_tok_n_ids(const q3_tokenizer *t) { return t->n_ids; }

const char *q3_tok_token_bytes(const q3_tokenizer *t, int32_t id, size_t *len_out) {
    if (id < 0 || id >= t->n_ids || !(t->tok_flags[id] & TOK_F_PRESENT)) return NULL;
    if (len_out) *len_out = t->tok_len[id];
    return t->arena + t->tok_off[id];
}

int q3_tok_is_special(const q3_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->tok_flags[id] & TOK_F_SPECIAL) != 0;
}

int32_t q3_tok_lookup(const q3_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->arena + t->added[i].off, token, n) == 0) return t->added[i].id;
    /* A vocab token is written in the byte-level alphabet ("Ġthe"); turn it
     * back into bytes. A string outside that alphabet is tried as-is. */
    tok_buf raw = {0};
    tok_put_token_bytes(&raw, token, n);
    int32_t id = n ? tok_str_map_get(&t->vocab, t->arena, raw.data, raw.len) : -1;
    free(raw.data);
    return id;
}

char *q3_tok_decode(const q3_tokenizer *t, const int32_t *ids, size_t n, size_t *len_out) {
    tok_buf bytes = {0}, text = {0};
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *b = q3_tok_token_bytes(t, ids[i], &len);
        if (!b) {
            free(bytes.data);
            q3_err("cannot decode token id %d: not in the tokenizer (ids 0..%d)", ids[i], t->n_ids - 1);
            return NULL;
        }
        tok_buf_put(&bytes, b, len);
    }
    tok_utf8_lossy(&text, bytes.data ? bytes.data : "", bytes.len);
    free(bytes.data);
    if (!text.data) tok_buf_put(&text, "", 0);
    if (len_out) *len_out = text.len;
    return text.data;
}
