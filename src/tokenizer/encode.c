/* Text -> ids: added tokens first, then per segment NFC, the pre-tokenizer
 * regex splits, and BPE on each piece's bytes. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"
#include "util/error.h"

typedef struct {
    const q3_tokenizer *t;
    tok_bpe_ctx bpe;
    pcre2_match_data *md;
    tok_buf tmp; /* prefix-space copies */
    tok_ids out;
} enc_ctx;

static int pieces(enc_ctx *c, int stage, const char *s, size_t n);

/* Split s with re in "Isolated" mode: every match is a piece and so is
 * every gap between matches; each piece goes on to the next stage. */
static int split_isolated(enc_ctx *c, pcre2_code *re, int next_stage, const char *s, size_t n) {
    size_t done = 0, at = 0; /* done: end of the last emitted piece */
    while (at < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, c->md, NULL);
        /* The JIT's fixed stack can run out on odd input; the interpreter
         * uses the heap and gives the same answer. */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return q3_err("pre-tokenizer regex failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: it splits nothing, step one character */
            at = ms + 1;
            while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (ms > done && pieces(c, next_stage, s + done, ms - done)) return -1;
        if (pieces(c, next_stage, s + ms, me - ms)) return -1;
        done = at = me;
    }
    return done < n ? pieces(c, next_stage, s + done, n - done) : 0;
}

/* Stages 0..n_split-1 are the Split regexes; stage n_split is ByteLevel
 * (prefix space, its own regex), then BPE. */
static int pieces(enc_ctx *c, int stage, const char *s, size_t n) {
    const q3_tokenizer *t = c->t;
    if (n == 0) return 0;
    if (stage < t->n_split) return split_isolated(c, t->split[stage], stage + 1, s, n);
    if (stage == t->n_split) {
        if (t->add_prefix_space && s[0] != ' ') {
            /* Nothing below this stage uses c->tmp, so it can hold the copy. */
            c->tmp.len = 0;
            tok_buf_put(&c->tmp, " ", 1);
            tok_buf_put(&c->tmp, s, n);
            s = c->tmp.data;
            n = c->tmp.len;
        }
        if (t->bl_regex) return split_isolated(c, t->bl_regex, stage + 1, s, n);
    }
    tok_bpe_piece(t, &c->bpe, (const uint8_t *)s, n, &c->out);
    return 0;
}

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* A normalized segment, with the normalized added tokens split out. */
static int normalized_segment(enc_ctx *c, const char *s, size_t n) {
    const q3_tokenizer *t = c->t;
    size_t at = 0, ms, me;
    while (t->has_norm && at < n) {
        long k = tok_added_find(t, &t->match_norm, s, n, at, at, &ms, &me);
        if (k < 0) break;
        if (pieces(c, 0, s + at, ms - at)) return -1;
        tok_ids_push(&c->out, t->added[k].id);
        at = me;
    }
    return pieces(c, 0, s + at, n - at);
}

static int raw_segment(enc_ctx *c, const char *s, size_t n) {
    if (n == 0) return 0;
    /* ASCII text is already in NFC. */
    if (!c->t->nfc || is_ascii(s, n)) return normalized_segment(c, s, n);
    utf8proc_uint8_t *norm = NULL;
    utf8proc_ssize_t len =
        utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (len < 0) {
        free(norm);
        return q3_err("NFC normalization failed: %s", utf8proc_errmsg(len));
    }
    int rc = normalized_segment(c, (const char *)norm, (size_t)len);
    free(norm);
    return rc;
}

int q3_tok_encode(const q3_tokenizer *t, const char *text, size_t len, int32_t **ids_out, size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    if (tok_utf8_validate(text, len)) return -1;
    enc_ctx c = {.t = t};
    c.md = pcre2_match_data_create(4, NULL);
    if (!c.md) return q3_err("out of memory creating PCRE2 match data");
    int rc = 0;
    size_t at = 0, ms, me;
    while (rc == 0 && t->has_raw && at < len) {
        long k = tok_added_find(t, &t->match_raw, text, len, at, at, &ms, &me);
        if (k < 0) break;
        rc = raw_segment(&c, text + at, ms - at);
        tok_ids_push(&c.out, t->added[k].id);
        at = me;
    }
    if (rc == 0) rc = raw_segment(&c, text + at, len - at);
    pcre2_match_data_free(c.md);
    tok_bpe_ctx_free(&c.bpe);
    free(c.tmp.data);
    if (rc) {
        free(c.out.data);
        return -1;
    }
    *ids_out = c.out.data ? c.out.data : q3_malloc(sizeof(int32_t));
    *n_out = c.out.len;
    return 0;
}
