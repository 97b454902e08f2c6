/* Byte-level BPE tokenizer driven by a Hugging Face tokenizer.json
 * (Qwen2/Qwen3 family): NFC normalizer, Split pre-tokenizer regex, GPT-2
 * byte-to-unicode mapping, merges by rank, added/special tokens matched
 * before BPE. */
#ifndef Q3_TOKENIZER_H
#define Q3_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct q3_tokenizer q3_tokenizer;

/* Load tokenizer.json from `path`. Returns NULL with q3_err set on failure. */
q3_tokenizer *q3_tok_load(const char *path);
/* The same from tokenizer.json bytes in memory (need not be NUL-terminated;
 * not referenced after the call). `name` stands for the file in messages. */
q3_tokenizer *q3_tok_load_buffer(const char *json, size_t len, const char *name);
void q3_tok_free(q3_tokenizer *t);

/* Number of ids the tokenizer can produce (max id + 1, added tokens included). */
int q3_tok_n_ids(const q3_tokenizer *t);

/* Encode UTF-8 text. Special/added tokens written in the text are recognised.
 * On success returns 0 and stores a heap array (caller frees) in *ids_out.
 * Invalid UTF-8 is an error (-1, q3_err set). */
int q3_tok_encode(const q3_tokenizer *t, const char *text, size_t len, int32_t **ids_out, size_t *n_out);

/* Raw bytes of one token (after byte-level decoding; added tokens give their
 * content). Returns NULL for an unknown id. *len_out gets the byte count. */
const char *q3_tok_token_bytes(const q3_tokenizer *t, int32_t id, size_t *len_out);

/* Id of a token given by its exact string form (e.g. "<|im_end|>"), or -1. */
int32_t q3_tok_lookup(const q3_tokenizer *t, const char *token);

/* Is id a special added token (special: true in tokenizer.json)? */
int q3_tok_is_special(const q3_tokenizer *t, int32_t id);

/* Streaming decoder: feeds token bytes, emits only complete UTF-8 characters,
 * holding back an incomplete trailing sequence until the next token
 * completes it (or flush emits it as U+FFFD). */
typedef struct {
    char pending[8];
    int n_pending;
} q3_utf8_stream;

void q3_utf8_stream_init(q3_utf8_stream *s);
/* Appends printable output to out (capacity cap, NUL-terminated); returns bytes written.
 * Output is at most 3 * n + 4 bytes (a bad byte becomes the 3-byte U+FFFD);
 * whole characters that do not fit in cap are dropped. */
size_t q3_utf8_stream_feed(q3_utf8_stream *s, const char *bytes, size_t n, char *out, size_t cap);
size_t q3_utf8_stream_flush(q3_utf8_stream *s, char *out, size_t cap);

/* Decode a whole id sequence into a heap string (invalid byte sequences
 * become U+FFFD, as HF's decode does). */
char *q3_tok_decode(const q3_tokenizer *t, const int32_t *ids, size_t n, size_t *len_out);

/* The GPT-2 byte-to-unicode table behind byte-level BPE: every byte maps to
 * one printable code point (printable Latin-1 bytes to themselves, the rest
 * to U+0100 upwards). q3_unicode_to_byte inverts it, -1 if cp is not in it. */
uint32_t q3_byte_to_unicode(unsigned char b);
int q3_unicode_to_byte(uint32_t cp);

#endif
