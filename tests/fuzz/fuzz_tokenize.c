/* Prompt text of any bytes through the real Qwen3 tokenizer
 * (build/tokenizer/tokenizer.json, or $Q3_FUZZ_TOKENIZER): encoding must
 * succeed or refuse invalid UTF-8 with a message; the ids it gives must be
 * in range and decode to exactly the NFC form of the text (byte-level BPE
 * loses nothing), whole and token by token through the streaming decoder. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

static q3_tokenizer *g_tok;

static void load(void) {
    const char *path = getenv("Q3_FUZZ_TOKENIZER");
    g_tok = q3_tok_load(path ? path : "build/tokenizer/tokenizer.json");
    if (!g_tok) {
        fprintf(stderr, "fuzz_tokenize: %s (set Q3_FUZZ_TOKENIZER)\n", q3_errmsg());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!g_tok) load();
    int32_t *ids = NULL;
    size_t nid = 0;
    const int rc = q3_tok_encode(g_tok, (const char *)data, n, &ids, &nid);
    if (rc == 0) {
        const int n_ids = q3_tok_n_ids(g_tok);
        for (size_t i = 0; i < nid; i++)
            if (ids[i] < 0 || ids[i] >= n_ids) abort();
        utf8proc_uint8_t *nfc = NULL;
        const utf8proc_ssize_t nn =
            utf8proc_map(data, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nn < 0) abort(); /* encode accepted text utf8proc calls invalid */
        size_t len = 0;
        char *text = q3_tok_decode(g_tok, ids, nid, &len);
        if (!text || len != (size_t)nn || memcmp(text, nfc, len)) {
            fprintf(stderr, "fuzz_tokenize: decode(encode(s)) != NFC(s) (%zu vs %zd bytes)\n", len, nn);
            abort();
        }
        /* The streaming decoder, token by token, gives the same bytes. */
        char *streamed = malloc(3 * len + 64), out[1024];
        size_t at = 0;
        q3_utf8_stream s;
        q3_utf8_stream_init(&s);
        for (size_t i = 0; i < nid; i++) {
            size_t tl = 0;
            const char *tb = q3_tok_token_bytes(g_tok, ids[i], &tl);
            if (!tb || 3 * tl + 4 >= sizeof out) abort(); /* Qwen3 tokens: at most 128 bytes */
            const size_t k = q3_utf8_stream_feed(&s, tb, tl, out, sizeof out);
            memcpy(streamed + at, out, k), at += k;
        }
        const size_t k = q3_utf8_stream_flush(&s, out, sizeof out);
        memcpy(streamed + at, out, k), at += k;
        if (at != len || memcmp(streamed, text, len)) {
            fprintf(stderr, "fuzz_tokenize: the streamed decode differs from the whole one\n");
            abort();
        }
        free(streamed), free(text), free(nfc);
    }
    free(ids);
    fuzz_done(rc);
    return 0;
}
