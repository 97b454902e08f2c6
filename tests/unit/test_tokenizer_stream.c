/* The streaming UTF-8 decoder, lossy UTF-8 conversion and the GPT-2
 * byte-to-unicode table (no tokenizer.json needed). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"
#include "unit.h"

#define FFFD "\xEF\xBF\xBD"

/* Feed `s` to a fresh stream in pieces cut at the given offsets, flush,
 * and return everything emitted (static buffer). */
static const char *stream_pieces(const char *s, size_t n, const size_t *cuts, int ncuts, size_t *out_len) {
    static char all[1024];
    char piece[256];
    size_t len = 0, at = 0;
    q3_utf8_stream st;
    q3_utf8_stream_init(&st);
    for (int i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        size_t k = q3_utf8_stream_feed(&st, s + at, end - at, piece, sizeof piece);
        memcpy(all + len, piece, k);
        len += k;
        at = end;
    }
    size_t k = q3_utf8_stream_flush(&st, piece, sizeof piece);
    memcpy(all + len, piece, k);
    len += k;
    all[len] = 0;
    *out_len = len;
    return all;
}

static void test_split_characters(void) {
    char out[64];
    q3_utf8_stream st;
    q3_utf8_stream_init(&st);
    /* 2 bytes: é = C3 A9 */
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "a\xC3", 2, out, sizeof out), 1);
    CHECK_EQ_STR(out, "a");
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xA9", 1, out, sizeof out), 2);
    CHECK_EQ_STR(out, "\xC3\xA9");
    /* 3 bytes: 中 = E4 B8 AD, one byte at a time */
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xE4", 1, out, sizeof out), 0);
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xB8", 1, out, sizeof out), 0);
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xAD!", 2, out, sizeof out), 4);
    CHECK_EQ_STR(out, "\xE4\xB8\xAD!");
    /* 4 bytes: U+1F600 = F0 9F 98 80, split 3 + 1 */
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xF0\x9F\x98", 3, out, sizeof out), 0);
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\x80", 1, out, sizeof out), 4);
    CHECK_EQ_STR(out, "\xF0\x9F\x98\x80");
    CHECK_EQ_INT(q3_utf8_stream_flush(&st, out, sizeof out), 0);
}

static void test_every_cut_point(void) {
    /* Mixed widths: every way of cutting it in two or three pieces must give
     * the same text back. */
    const char *s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80z";
    size_t n = strlen(s), len;
    int ok = 1;
    for (size_t i = 0; i <= n; i++)
        for (size_t j = i; j <= n; j++) {
            size_t cuts[2] = {i, j};
            const char *got = stream_pieces(s, n, cuts, 2, &len);
            ok &= len == n && memcmp(got, s, n) == 0;
        }
    CHECK(ok);
}

static void test_bad_bytes(void) {
    char out[64];
    q3_utf8_stream st;
    q3_utf8_stream_init(&st);
    /* An unfinished character at the end becomes one U+FFFD on flush. */
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "x\xE4\xB8", 3, out, sizeof out), 1);
    CHECK_EQ_INT(q3_utf8_stream_flush(&st, out, sizeof out), 3);
    CHECK_EQ_STR(out, FFFD);
    CHECK_EQ_INT(q3_utf8_stream_flush(&st, out, sizeof out), 0);
    /* A held prefix broken by an ASCII byte: U+FFFD, then the byte. */
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xF0\x9F", 2, out, sizeof out), 0);
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "A", 1, out, sizeof out), 4);
    CHECK_EQ_STR(out, FFFD "A");
    /* Bytes that can never start a character are replaced at once. */
    CHECK_EQ_INT(q3_utf8_stream_feed(&st, "\xFF\x80", 2, out, sizeof out), 6);
    CHECK_EQ_STR(out, FFFD FFFD);
    /* A too-small buffer drops whole characters, never overflows. */
    char tiny[4];
    memset(tiny, 'Q', sizeof tiny);
    size_t k = q3_utf8_stream_feed(&st, "ab\xC3\xA9", 4, tiny, sizeof tiny);
    CHECK_EQ_INT(k, 2);
    CHECK_EQ_STR(tiny, "ab");
}

static void check_lossy(const char *in, size_t n, const char *want) {
    tok_buf b = {0};
    tok_utf8_lossy(&b, in, n);
    CHECK_EQ_STR(b.data ? b.data : "", want);
    free(b.data);
}

static void test_lossy(void) {
    /* Same U+FFFD counts as Python's bytes.decode("utf-8", "replace"). */
    check_lossy("ok", 2, "ok");
    check_lossy("\xE4\xB8" "A", 3, FFFD "A");
    check_lossy("\xF0\x9F\x98", 3, FFFD);
    check_lossy("\xED\xA0\x80", 3, FFFD FFFD FFFD); /* surrogate */
    check_lossy("\xC0\xAF", 2, FFFD FFFD);          /* overlong */
    check_lossy("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);
    CHECK(tok_utf8_validate("\xE4\xB8\xAD", 3) == 0);
    CHECK(tok_utf8_validate("\xE4\xB8", 2) != 0);
    CHECK(tok_utf8_validate("\xFF", 1) != 0);
}

static void test_byte_table(void) {
    int seen[0x200] = {0}, ok = 1;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = q3_byte_to_unicode((unsigned char)b);
        ok &= cp < 0x200 && !seen[cp] && q3_unicode_to_byte(cp) == b;
        if (cp < 0x200) seen[cp] = 1;
    }
    CHECK(ok); /* a bijection with an exact inverse */
    CHECK_EQ_INT(q3_byte_to_unicode(' '), 0x120);  /* Ġ */
    CHECK_EQ_INT(q3_byte_to_unicode('\n'), 0x10A); /* Ċ */
    CHECK_EQ_INT(q3_byte_to_unicode('A'), 'A');
    CHECK_EQ_INT(q3_byte_to_unicode(0x7F), 0x121);
    CHECK_EQ_INT(q3_byte_to_unicode(0xAD), 0x143);
    CHECK_EQ_INT(q3_byte_to_unicode(0xE9), 0xE9);
    CHECK_EQ_INT(q3_unicode_to_byte(' '), -1);
    CHECK_EQ_INT(q3_unicode_to_byte(0x144), -1);
    CHECK_EQ_INT(q3_unicode_to_byte(0x4E2D), -1);
}

int main(void) {
    test_split_characters();
    test_every_cut_point();
    test_bad_bytes();
    test_lossy();
    test_byte_table();
    UNIT_MAIN_END();
}
