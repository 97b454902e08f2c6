/* Walking tokenizer.json: model.vocab and model.merges are only located
 * here (read later by load_tables.c); every other value becomes a jansson
 * value for load_config.c. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_load.h"

typedef struct {
    json_t *root;                      /* every small value, as jansson */
    const char *vocab, *merges;        /* where the two big tables start */
} doc;

static int small_value(json_scan *s, json_t *obj, const char *key) {
    const char *a, *b;
    if (js_skip(s, &a, &b)) return -1;
    json_error_t je;
    json_t *v = json_loadb(a, (size_t)(b - a), JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) {
        s->p = a + je.position;
        return js_error(s, je.text);
    }
    json_object_set_new(obj, key, v);
    return 0;
}

static int walk_object(json_scan *s, json_t *obj, doc *d, int in_model) {
    if (js_expect(s, '{', "expected an object")) return -1;
    if (js_peek(s) == '}') {
        s->p++;
        return 0;
    }
    tok_buf key = {0};
    int more = 1;
    while (more > 0) {
        if (js_string(s, &key) || js_expect(s, ':', "expected ':'")) break;
        char c = js_peek(s);
        const char *a, *b;
        if (!in_model && !strcmp(key.data, "model") && c == '{') {
            json_t *m = json_object();
            json_object_set_new(obj, "model", m);
            if (walk_object(s, m, d, 1)) break;
        } else if (in_model && !strcmp(key.data, "vocab") && c == '{') {
            d->vocab = s->p;
            if (js_skip(s, &a, &b)) break;
        } else if (in_model && !strcmp(key.data, "merges") && c == '[') {
            d->merges = s->p;
            if (js_skip(s, &a, &b)) break;
        } else if (small_value(s, obj, key.data)) {
            break;
        }
        more = js_next(s, '}', "expected ',' or '}'");
    }
    free(key.data);
    return more == 0 ? 0 : -1;
}

/* Per-id tables: vocab entries first, added tokens over them. */
static int fill_ids(q3_tokenizer *t, const tok_vocab_entry *v, size_t nv, int32_t max_id) {
    t->n_ids = max_id + 1;
    t->tok_off = q3_calloc((size_t)t->n_ids, sizeof *t->tok_off);
    t->tok_len = q3_calloc((size_t)t->n_ids, sizeof *t->tok_len);
    t->tok_flags = q3_calloc((size_t)t->n_ids, sizeof *t->tok_flags);
    tok_str_map_init(&t->vocab, nv);
    for (size_t i = 0; i < nv; i++) {
        int32_t id = v[i].id;
        if (t->tok_flags[id])
            return tok_bad(t, "model.vocab", "id %d is used by two tokens (\"%s\" and \"%s\")", id,
                           t->arena + v[i].off, t->arena + t->tok_off[id]);
        t->tok_off[id] = v[i].off;
        t->tok_len[id] = v[i].len;
        t->tok_flags[id] = TOK_F_PRESENT;
        /* Two strings with the same bytes can only happen with tokens outside
         * the byte alphabet; the first one wins for encoding. */
        (void)tok_str_map_put(&t->vocab, t->arena, v[i].off, v[i].len, id);
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        t->tok_off[a->id] = a->off;
        t->tok_len[a->id] = a->len;
        t->tok_flags[a->id] = TOK_F_PRESENT | TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0);
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = tok_str_map_get(&t->vocab, t->arena, &c, 1);
    }
    return 0;
}

static int build(q3_tokenizer *t, json_scan *s, const doc *d) {
    json_t *model = json_object_get(d->root, "model");
    if (tok_config_model(t, model) || tok_config_pipeline(t, d->root)) return -1;
    if (!d->vocab) return tok_bad(t, "model.vocab", "missing (expected an object of token -> id)");
    if (!d->merges) return tok_bad(t, "model.merges", "missing (expected an array of merges)");
    tok_buf arena = {0};
    tok_vocab_entry *v = NULL;
    size_t nv = 0;
    int32_t max_id = -1;
    s->p = d->vocab;
    int rc = tok_read_vocab(t, s, &arena, &v, &nv, &max_id);
    if (rc == 0) rc = tok_config_added(t, d->root, &arena, &max_id);
    /* The arena no longer grows: publish it. */
    t->arena = arena.data;
    t->arena_len = arena.len;
    if (rc == 0) rc = fill_ids(t, v, nv, max_id);
    free(v);
    s->p = d->merges;
    if (rc == 0) rc = tok_read_merges(t, s);
    if (rc) return rc;
    tok_added_matcher_build(&t->match_raw, t, 0);
    tok_added_matcher_build(&t->match_norm, t, 1);
    t->has_raw = t->match_raw.start[256] > 0;
    t->has_norm = t->match_norm.start[256] > 0;
    return 0;
}

int tok_load_json(q3_tokenizer *t, const char *text, size_t size) {
    json_scan s = {text, text, text + size, t->path};
    doc d = {json_object(), NULL, NULL};
    int rc = walk_object(&s, d.root, &d, 0);
    if (rc == 0 && js_peek(&s)) rc = js_error(&s, "unexpected text after the top-level object");
    if (rc == 0) rc = build(t, &s, &d);
    json_decref(d.root);
    return rc;
}
