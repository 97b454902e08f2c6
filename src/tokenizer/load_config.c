/* The small sections of tokenizer.json: model options, normalizer,
 * pre-tokenizer, decoder and added tokens. Only what byte-level BPE models
 * use is accepted; anything else is refused with the field at fault named,
 * rather than silently tokenizing differently. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_load.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int tok_bad(const q3_tokenizer *t, const char *field, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return q3_err("%s: field %s: %s", t->path, field, msg);
}

static const char *type_of(json_t *o) {
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

/* Optional boolean field; absent or null gives def. */
static int get_bool(const q3_tokenizer *t, json_t *o, const char *key, const char *field, int def, int *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return tok_bad(t, field, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

int tok_config_added(q3_tokenizer *t, json_t *root, tok_buf *arena, int32_t *max_id) {
    json_t *arr = json_object_get(root, "added_tokens");
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return tok_bad(t, "added_tokens", "must be an array");
    t->n_added = json_array_size(arr);
    t->added = q3_calloc(t->n_added ? t->n_added : 1, sizeof *t->added);
    for (size_t i = 0; i < t->n_added; i++) {
        json_t *o = json_array_get(arr, i);
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX)
            return tok_bad(t, field, "\"id\" must be a non-negative integer");
        if (!json_is_string(content) || json_string_length(content) == 0)
            return tok_bad(t, field, "\"content\" must be a non-empty string");
        tok_added *a = &t->added[i];
        a->id = (int32_t)json_integer_value(id);
        a->off = (uint32_t)arena->len;
        a->len = (uint32_t)json_string_length(content);
        tok_buf_put(arena, json_string_value(content), a->len);
        tok_buf_put(arena, "", 1);
        int sw = 0, ls = 0, rs = 0, norm = 0, sp = 0;
        if (get_bool(t, o, "single_word", field, 0, &sw) || get_bool(t, o, "lstrip", field, 0, &ls) ||
            get_bool(t, o, "rstrip", field, 0, &rs) || get_bool(t, o, "special", field, 0, &sp))
            return -1;
        /* HF's default: special tokens are matched on the raw text. */
        if (get_bool(t, o, "normalized", field, !sp, &norm)) return -1;
        a->single_word = (uint8_t)sw;
        a->lstrip = (uint8_t)ls;
        a->rstrip = (uint8_t)rs;
        a->normalized = (uint8_t)norm;
        a->special = (uint8_t)sp;
        if (a->id > *max_id) *max_id = a->id;
    }
    return 0;
}

int tok_config_model(q3_tokenizer *t, json_t *model) {
    if (!json_is_object(model)) return tok_bad(t, "model", "missing or not an object");
    const char *ty = type_of(model);
    /* No type at all is read as BPE, as HF does; vocab and merges are
     * checked for by the caller. */
    if (ty && strcmp(ty, "BPE") != 0)
        return tok_bad(t, "model.type", "unsupported model type \"%s\" (only BPE is supported)", ty);
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v)) return tok_bad(t, "model.dropout", "BPE dropout is not supported (must be null)");
    int fallback = 0;
    if (get_bool(t, model, "byte_fallback", "model.byte_fallback", 0, &fallback)) return -1;
    if (fallback) return tok_bad(t, "model.byte_fallback", "byte_fallback BPE is not supported");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
            char field[64];
            snprintf(field, sizeof field, "model.%s", affixes[i]);
            return tok_bad(t, field, "a non-empty %s is not supported", affixes[i]);
        }
    }
    return get_bool(t, model, "ignore_merges", "model.ignore_merges", 0, &t->ignore_merges);
}

static int load_normalizer(q3_tokenizer *t, json_t *root) {
    json_t *n = json_object_get(root, "normalizer");
    if (!n || json_is_null(n)) return 0;
    const char *ty = type_of(n);
    if (ty && strcmp(ty, "NFC") == 0) {
        t->nfc = 1;
        return 0;
    }
    if (ty && strcmp(ty, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        for (size_t i = 0; i < json_array_size(list); i++) {
            const char *sub = type_of(json_array_get(list, i));
            if (!sub || strcmp(sub, "NFC") != 0) {
                char field[64];
                snprintf(field, sizeof field, "normalizer.normalizers[%zu].type", i);
                return tok_bad(t, field, "unsupported normalizer \"%s\" (only NFC is supported)", sub ? sub : "?");
            }
            t->nfc = 1;
        }
        return 0;
    }
    return tok_bad(t, "normalizer.type", "unsupported normalizer \"%s\" (only NFC or none is supported)",
                   ty ? ty : "?");
}

/* HF compiles these patterns with Oniguruma, whose \s is exactly Unicode
 * White_Space. PCRE2's \s also takes U+180E (no longer whitespace since
 * Unicode 6.3), so spell \s and \S as the property to get HF's splits.
 * Returns a heap copy; \Q...\E quoted text is left alone. */
static char *onig_whitespace(const char *pat, size_t len, size_t *out_len) {
    tok_buf b = {0};
    for (size_t i = 0; i < len;) {
        if (pat[i] != '\\' || i + 1 == len) {
            tok_buf_put(&b, pat + i++, 1);
            continue;
        }
        char d = pat[i + 1];
        if (d == 's' || d == 'S') {
            tok_buf_put(&b, d == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15);
            i += 2;
        } else if (d == 'Q') {
            const char *e = memmem(pat + i + 2, len - i - 2, "\\E", 2);
            size_t stop = e ? (size_t)(e - pat) + 2 : len;
            tok_buf_put(&b, pat + i, stop - i);
            i = stop;
        } else {
            tok_buf_put(&b, pat + i, 2);
            i += 2;
        }
    }
    if (!b.data) tok_buf_put(&b, "", 0);
    *out_len = b.len;
    return b.data;
}

static pcre2_code *compile_or_explain(q3_tokenizer *t, const char *field, const char *pat, size_t len, uint32_t opts) {
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        tok_bad(t, field, "PCRE2 cannot compile the pattern (at offset %zu): %s", (size_t)off, (char *)msg);
    }
    return re;
}

static int compile_regex(q3_tokenizer *t, const char *field, const char *pat, size_t len, int literal,
                         pcre2_code **out) {
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    pcre2_code *re;
    if (literal) {
        re = compile_or_explain(t, field, pat, len, opts | PCRE2_LITERAL);
    } else {
        /* The pattern as written first, so errors point into it. */
        re = compile_or_explain(t, field, pat, len, opts);
        if (!re) return -1;
        pcre2_code_free(re);
        size_t n;
        char *fixed = onig_whitespace(pat, len, &n);
        re = compile_or_explain(t, field, fixed, n, opts);
        free(fixed);
    }
    if (!re) return -1;
    /* JIT is a speed-up only; the interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

static int load_split(q3_tokenizer *t, json_t *o, const char *field) {
    char f[128];
    if (t->n_split == TOK_MAX_SPLITS) return tok_bad(t, field, "more than %d Split pre-tokenizers", TOK_MAX_SPLITS);
    json_t *beh = json_object_get(o, "behavior");
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated") != 0) {
        snprintf(f, sizeof f, "%s.behavior", field);
        return tok_bad(t, f, "unsupported Split behavior \"%s\" (only Isolated is supported)",
                       json_is_string(beh) ? json_string_value(beh) : "?");
    }
    int invert = 0;
    snprintf(f, sizeof f, "%s.invert", field);
    if (get_bool(t, o, "invert", f, 0, &invert)) return -1;
    if (invert) return tok_bad(t, f, "inverted Split is not supported");
    json_t *pat = json_object_get(o, "pattern"), *re = json_object_get(pat, "Regex"),
           *str = json_object_get(pat, "String");
    json_t *p = json_is_string(re) ? re : str;
    snprintf(f, sizeof f, "%s.pattern.%s", field, p == re ? "Regex" : "String");
    if (!json_is_string(p)) return tok_bad(t, f, "Split needs a pattern {\"Regex\": ...} or {\"String\": ...}");
    return compile_regex(t, f, json_string_value(p), json_string_length(p), p == str, &t->split[t->n_split++]);
}

static int load_byte_level(q3_tokenizer *t, json_t *o, const char *field) {
    char f[128];
    snprintf(f, sizeof f, "%s.add_prefix_space", field);
    if (get_bool(t, o, "add_prefix_space", f, 0, &t->add_prefix_space)) return -1;
    int use_regex = 1;
    snprintf(f, sizeof f, "%s.use_regex", field);
    if (get_bool(t, o, "use_regex", f, 1, &use_regex)) return -1;
    if (use_regex) return compile_regex(t, f, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, &t->bl_regex);
    return 0;
}

static int load_pre_tokenizer(q3_tokenizer *t, json_t *root) {
    static const char shape[] = "byte-level BPE needs ByteLevel or Sequence[Split..., ByteLevel]";
    json_t *p = json_object_get(root, "pre_tokenizer");
    const char *ty = p ? type_of(p) : NULL;
    if (ty && strcmp(ty, "ByteLevel") == 0) return load_byte_level(t, p, "pre_tokenizer");
    if (!ty || strcmp(ty, "Sequence") != 0)
        return tok_bad(t, "pre_tokenizer.type", "unsupported pre-tokenizer \"%s\": %s", ty ? ty : "null", shape);
    json_t *list = json_object_get(p, "pretokenizers");
    size_t n = json_array_size(list);
    if (n == 0) return tok_bad(t, "pre_tokenizer.pretokenizers", "empty: %s", shape);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(list, i);
        const char *sub = type_of(o);
        char field[64];
        snprintf(field, sizeof field, "pre_tokenizer.pretokenizers[%zu]", i);
        int last = i + 1 == n;
        if (sub && strcmp(sub, last ? "ByteLevel" : "Split") == 0) {
            if ((last ? load_byte_level(t, o, field) : load_split(t, o, field)) != 0) return -1;
            continue;
        }
        return tok_bad(t, field, "unexpected pre-tokenizer \"%s\" here: %s", sub ? sub : "?", shape);
    }
    return 0;
}

static int check_decoder(q3_tokenizer *t, json_t *root) {
    const char *ty = type_of(json_object_get(root, "decoder"));
    if (!ty || strcmp(ty, "ByteLevel") != 0)
        return tok_bad(t, "decoder.type", "unsupported decoder \"%s\" (only ByteLevel is supported)", ty ? ty : "null");
    return 0;
}

int tok_config_pipeline(q3_tokenizer *t, json_t *root) {
    return load_normalizer(t, root) || load_pre_tokenizer(t, root) || check_decoder(t, root) ? -1 : 0;
}
