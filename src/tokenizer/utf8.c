/* UTF-8 checking, lossy conversion and the GPT-2 byte-to-unicode table. */
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"
#include "util/error.h"

/* Bytes that stand for themselves in the byte-level alphabet: '!'..'~',
 * U+00A1..U+00AC and U+00AE..U+00FF. */
static int self_mapped(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

/* The other 68 bytes (0x00-0x20, 0x7F-0xA0, 0xAD) are numbered from U+0100
 * in byte order. */
uint32_t q3_byte_to_unicode(unsigned char b) {
    if (self_mapped(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
    return 0x100 + 67; /* 0xAD */
}

int q3_unicode_to_byte(uint32_t cp) {
    if (cp < 0x100) return self_mapped(cp) ? (int)cp : -1;
    uint32_t k = cp - 0x100;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(0x7F + k - 33);
    return k == 67 ? 0xAD : -1;
}

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;      /* no overlongs */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return -1;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return 0;
        unsigned b = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return -k;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need + 1;
}

int tok_utf8_validate(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tok_utf8_next(p + i, n - i, &cp);
        if (k <= 0)
            return q3_err("input is not valid UTF-8: %s at byte offset %zu (byte 0x%02X)",
                          k == 0 ? "truncated sequence" : "invalid sequence", i, p[i]);
        i += (size_t)k;
    }
    return 0;
}

void tok_utf8_lossy(tok_buf *out, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    while (i < n) {
        uint32_t cp;
        int k = p[i] < 0x80 ? 1 : tok_utf8_next(p + i, n - i, &cp);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        tok_buf_put(out, s + run, i - run);
        tok_buf_put(out, "\xEF\xBF\xBD", 3);
        i += k == 0 ? n - i : (size_t)-k;
        run = i;
    }
    tok_buf_put(out, s + run, i - run);
}

int tok_is_whitespace(uint32_t cp) {
    /* Unicode White_Space, which is what Rust's char::is_whitespace tests. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

int tok_is_word_char(uint32_t cp) {
    if (cp == '_') return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

void tok_buf_put(tok_buf *b, const void *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        b->data = q3_realloc(b->data, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void tok_ids_push(tok_ids *v, int32_t id) {
    if (v->len == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->data = q3_realloc(v->data, v->cap * sizeof *v->data);
    }
    v->data[v->len++] = id;
}
