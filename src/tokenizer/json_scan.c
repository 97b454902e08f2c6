/* See json_scan.h. Strict about what it decodes (strings, integers), loose
 * about what it skips: skipped values are re-parsed by jansson anyway. */
#include "tokenizer/json_scan.h"

#include <string.h>

#include "util/error.h"

int js_error(json_scan *s, const char *msg) {
    size_t line = 1, col = 1;
    for (const char *q = s->start; q < s->p && q < s->end; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    return q3_err("%s: invalid JSON at line %zu, column %zu: %s", s->path, line, col, msg);
}

char js_peek(json_scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
    return s->p < s->end ? *s->p : 0;
}

int js_expect(json_scan *s, char c, const char *what) {
    if (js_peek(s) != c) return js_error(s, what);
    s->p++;
    return 0;
}

int js_next(json_scan *s, char close, const char *what) {
    char c = js_peek(s);
    if (c == ',' || c == close) {
        s->p++;
        return c == ',';
    }
    return js_error(s, what);
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15) return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

static void put_utf8(tok_buf *out, unsigned cp) {
    unsigned char b[4];
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    for (size_t i = n - 1; i > 0; i--, cp >>= 6) b[i] = (unsigned char)(0x80 | (cp & 0x3F));
    b[0] = (unsigned char)(lead[n] | cp);
    tok_buf_put(out, b, n);
}

int js_string(json_scan *s, tok_buf *out) {
    out->len = 0;
    if (js_expect(s, '"', "expected a string")) return -1;
    const char *p = s->p, *e = s->end;
    for (;;) {
        /* Copy the plain stretch in one go. */
        const char *q = p;
        while (q < e && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
        tok_buf_put(out, p, (size_t)(q - p));
        p = q;
        if (p >= e || (unsigned char)*p < 0x20) {
            s->p = p;
            return js_error(s, p >= e ? "unterminated string" : "control character in string");
        }
        if (*p == '"') break;
        /* Backslash escape. */
        if (p + 1 >= e) {
            s->p = p;
            return js_error(s, "unterminated string");
        }
        char c = p[1];
        const char *simple = strchr("\"\\/bfnrt", c);
        if (c && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            tok_buf_put(out, &map[simple - "\"\\/bfnrt"], 1);
            p += 2;
            continue;
        }
        unsigned cp, lo;
        if (c != 'u' || e - p < 6 || hex4(p + 2, &cp)) {
            s->p = p;
            return js_error(s, "bad escape in string");
        }
        p += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair spells one character */
            if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                s->p = p;
                return js_error(s, "unpaired surrogate escape in string");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            s->p = p;
            return js_error(s, "unpaired surrogate escape in string");
        }
        put_utf8(out, cp);
    }
    s->p = p + 1;
    if (tok_utf8_validate(out->data ? out->data : "", out->len)) return js_error(s, "string is not valid UTF-8");
    return 0;
}

int js_int(json_scan *s, long long *out) {
    js_peek(s);
    const char *p = s->p;
    int neg = p < s->end && *p == '-';
    p += neg;
    long long v = 0;
    const char *digits = p;
    while (p < s->end && *p >= '0' && *p <= '9' && p - digits < 18) v = v * 10 + (*p++ - '0');
    if (p == digits || (p < s->end && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9'))))
        return js_error(s, "expected an integer");
    s->p = p;
    *out = neg ? -v : v;
    return 0;
}

int js_skip(json_scan *s, const char **vstart, const char **vend) {
    js_peek(s);
    *vstart = s->p;
    int depth = 0;
    while (s->p < s->end) {
        char c = *s->p;
        if (c == '"') {
            for (s->p++; s->p < s->end && *s->p != '"'; s->p++)
                if (*s->p == '\\') s->p++;
            if (s->p >= s->end) return js_error(s, "unterminated string");
            s->p++;
        } else if (c == '{' || c == '[') {
            depth++;
            s->p++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) break; /* the enclosing container's end */
            depth--;
            s->p++;
        } else if (c == ',' && depth == 0) {
            break;
        } else {
            s->p++;
        }
        if (depth == 0 && (c == '"' || c == '}' || c == ']')) break;
    }
    /* Trim trailing whitespace from a bare scalar. */
    const char *e = s->p;
    while (e > *vstart && (e[-1] == ' ' || e[-1] == '\n' || e[-1] == '\r' || e[-1] == '\t')) e--;
    *vend = e;
    if (depth) return js_error(s, "unterminated object or array");
    if (e == *vstart) return js_error(s, "expected a value");
    return 0;
}
