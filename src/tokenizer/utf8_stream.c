/* Streaming UTF-8 for token-by-token output: a character split across two
 * tokens (common for CJK and emoji in byte-level BPE) is held back until
 * its last byte arrives, so a terminal never sees half a character. */
#include <string.h>

#include "tokenizer/tok_internal.h"

void q3_utf8_stream_init(q3_utf8_stream *s) { memset(s, 0, sizeof *s); }

typedef struct {
    char *out;
    size_t cap, len;
    int full;
} sink;

static void emit(sink *k, const void *p, size_t n) {
    if (k->full || k->len + n + 1 > k->cap) { /* keep whole characters only */
        k->full = 1;
        return;
    }
    memcpy(k->out + k->len, p, n);
    k->len += n;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

/* Output can be up to 3 bytes per input byte (each bad byte becomes
 * U+FFFD) plus the held-back bytes; if cap is smaller the rest is dropped. */
size_t q3_utf8_stream_feed(q3_utf8_stream *s, const char *bytes, size_t n, char *out, size_t cap) {
    sink k = {out, cap, 0, 0};
    const unsigned char *in = (const unsigned char *)bytes;
    size_t i = 0;
    if (s->n_pending) {
        /* Finish the held-back character with the first few new bytes. */
        unsigned char buf[8];
        size_t np = (size_t)s->n_pending, take = n < 4 ? n : 4;
        memcpy(buf, s->pending, np);
        memcpy(buf + np, in, take);
        uint32_t cp;
        int r = tok_utf8_next(buf, np + take, &cp);
        if (r == 0) { /* still incomplete: everything so far is held */
            memcpy(s->pending, buf, np + take);
            s->n_pending = (int)(np + take);
            if (cap) out[0] = 0;
            return 0;
        }
        if (r > 0) emit(&k, buf, (size_t)r);
        else emit(&k, REPLACEMENT, 3);
        /* The held bytes were a valid prefix, so a bad sequence always
         * ends at or after them: r covers all of pending. */
        i = (size_t)(r > 0 ? r : -r) - np;
        s->n_pending = 0;
    }
    while (i < n) {
        uint32_t cp;
        int r = in[i] < 0x80 ? 1 : tok_utf8_next(in + i, n - i, &cp);
        if (r == 0) {
            memcpy(s->pending, in + i, n - i);
            s->n_pending = (int)(n - i);
            break;
        }
        if (r > 0) emit(&k, in + i, (size_t)r);
        else emit(&k, REPLACEMENT, 3);
        i += (size_t)(r > 0 ? r : -r);
    }
    if (cap) out[k.len] = 0;
    return k.len;
}

size_t q3_utf8_stream_flush(q3_utf8_stream *s, char *out, size_t cap) {
    sink k = {out, cap, 0, 0};
    /* An unfinished character at the end is one replacement character, the
     * way a lossy decoder treats a truncated sequence. */
    if (s->n_pending) emit(&k, REPLACEMENT, 3);
    s->n_pending = 0;
    if (cap) out[k.len] = 0;
    return k.len;
}
