/* Private layout of q3_tokenizer, shared by the tokenizer's source files.
 *
 * Everything is kept in raw-byte space: the GPT-2 byte-to-unicode mapping is
 * a bijection, so vocab strings are turned back into the bytes they stand for
 * at load time, and BPE runs on byte ids directly. That avoids building the
 * byte-level string for every piece during encode. */
#ifndef Q3_TOK_INTERNAL_H
#define Q3_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

/* Growable byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} tok_buf;

/* Growable id vector. */
typedef struct {
    int32_t *data;
    size_t len, cap;
} tok_ids;

void tok_buf_put(tok_buf *b, const void *p, size_t n);
void tok_ids_push(tok_ids *v, int32_t id);

/* Append the raw bytes a byte-level token string ("Ġthe") stands for. A
 * string with a character outside the byte alphabet is kept as its own
 * UTF-8, which is what HF's ByteLevel decoder falls back to. */
void tok_put_token_bytes(tok_buf *out, const char *s, size_t n);

/* Hash table: raw token bytes -> vocab id. Keys live in an external arena. */
typedef struct {
    uint32_t off, len;
    int32_t id;   /* -1: empty slot */
    uint32_t tag; /* high hash bits: most mismatches skip the memcmp */
} tok_str_slot;

typedef struct {
    tok_str_slot *slots;
    size_t cap, n; /* cap is a power of two */
} tok_str_map;

void tok_str_map_init(tok_str_map *m, size_t expected);
void tok_str_map_free(tok_str_map *m);
/* Insert key (already stored at arena+off); returns the id already present
 * for that key, or -1 when it was inserted. */
int32_t tok_str_map_put(tok_str_map *m, const char *arena, uint32_t off, uint32_t len, int32_t id);
int32_t tok_str_map_get(const tok_str_map *m, const char *arena, const void *key, size_t len);

/* Hash table: (left id, right id) -> (rank, merged id). */
typedef struct {
    uint64_t *keys; /* UINT64_MAX: empty */
    uint64_t *vals; /* rank << 32 | merged id */
    size_t cap, n;
} tok_pair_map;

void tok_pair_map_init(tok_pair_map *m, size_t expected);
void tok_pair_map_free(tok_pair_map *m);
/* Token ids a, b >= 0 (the pair (-1, -1) would be the empty-slot key). */
void tok_pair_map_put(tok_pair_map *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
/* Returns 1 and fills rank/merged when the pair is a merge (never for a
 * negative id). */
int tok_pair_map_get(const tok_pair_map *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged);

uint64_t tok_hash_bytes(const void *p, size_t n);

/* One entry of tokenizer.json's added_tokens. */
typedef struct {
    int32_t id;
    uint32_t off, len; /* content, in the tokenizer arena */
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Leftmost-longest matcher over a set of added tokens: candidates bucketed
 * by first byte, longest first within a bucket. */
typedef struct {
    uint32_t start[257]; /* bucket b is order[start[b] .. start[b+1]) */
    uint32_t *order;     /* indices into q3_tokenizer.added */
} tok_added_matcher;

#define TOK_MAX_SPLITS 4

#define TOK_F_PRESENT 1
#define TOK_F_ADDED 2
#define TOK_F_SPECIAL 4

struct q3_tokenizer {
    char *path;

    /* Per id: raw bytes in arena (NUL-terminated there too) and flags. */
    int32_t n_ids;
    uint32_t *tok_off, *tok_len;
    uint8_t *tok_flags;
    char *arena;
    size_t arena_len;

    /* Model (BPE) side. */
    tok_str_map vocab;  /* raw bytes -> model id */
    int32_t byte_id[256]; /* id of each single-byte token, -1 if absent */
    tok_pair_map merges;
    int ignore_merges;

    /* Added tokens: raw ones are matched on the input text, normalized ones
     * on the text after normalization (HF's AddedVocabulary does the same). */
    tok_added *added;
    size_t n_added;
    tok_added_matcher match_raw, match_norm;
    int has_raw, has_norm;

    /* Normalizer and pre-tokenizer. */
    int nfc;
    pcre2_code *split[TOK_MAX_SPLITS]; /* Split stages, "Isolated" */
    int n_split;
    /* The final ByteLevel stage: optional prefix space and GPT-2 regex. */
    int add_prefix_space;
    pcre2_code *bl_regex;
};

/* load_json.c: parse tokenizer.json (text of `size` bytes) into t. */
int tok_load_json(q3_tokenizer *t, const char *text, size_t size);

/* added.c */
void tok_added_matcher_build(tok_added_matcher *m, const q3_tokenizer *t, int normalized);
void tok_added_matcher_free(tok_added_matcher *m);
/* Find the leftmost-longest added token in s[from..n) honouring
 * single_word; on a hit returns the added index and stores the span
 * [*ms, *me) (lstrip/rstrip whitespace included, never before `floor`). */
long tok_added_find(const q3_tokenizer *t, const tok_added_matcher *m, const char *s, size_t n, size_t from,
                    size_t floor, size_t *ms, size_t *me);

/* bpe.c: scratch space reused across words of one encode call. */
typedef struct {
    int32_t *sym_id, *sym_prev, *sym_next;
    size_t sym_cap;
    void *heap;
    size_t heap_len, heap_cap;
    /* Word cache: piece bytes -> ids, for repeated words in one text. */
    struct tok_cache_slot *cache;
    size_t cache_cap, cache_n;
    tok_buf cache_keys;
    tok_ids cache_ids;
} tok_bpe_ctx;

void tok_bpe_ctx_free(tok_bpe_ctx *c);
/* BPE-encode one pre-tokenized piece (raw bytes), appending ids to out. */
void tok_bpe_piece(const q3_tokenizer *t, tok_bpe_ctx *c, const uint8_t *s, size_t n, tok_ids *out);

/* utf8.c */
/* Length of the UTF-8 sequence at s (n > 0 bytes available): > 0 for a
 * valid character (code point in *cp); 0 when s is a valid but truncated
 * prefix (all n bytes belong to it); -k for an invalid sequence whose
 * maximal subpart is k bytes (to become one U+FFFD, as Rust's and Python's
 * lossy decoders do). */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
/* 0 if s is valid UTF-8, else -1 with q3_err naming the byte offset. */
int tok_utf8_validate(const char *s, size_t n);
/* Append s to out with invalid sequences replaced by U+FFFD. */
void tok_utf8_lossy(tok_buf *out, const char *s, size_t n);
int tok_is_whitespace(uint32_t cp);
int tok_is_word_char(uint32_t cp);

#endif
