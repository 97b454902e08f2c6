/* Pieces of the tokenizer.json loader (private to src/tokenizer). */
#ifndef Q3_TOK_LOAD_H
#define Q3_TOK_LOAD_H

#include <jansson.h>

#include "tokenizer/json_scan.h"
#include "tokenizer/tok_internal.h"
#include "util/error.h"

/* Record "PATH: field FIELD: message"; returns -1. */
int tok_bad(const q3_tokenizer *t, const char *field, const char *fmt, ...) Q3_PRINTF(3, 4);

/* load_config.c: the small sections, as jansson values. */
int tok_config_model(q3_tokenizer *t, json_t *model);
int tok_config_pipeline(q3_tokenizer *t, json_t *root); /* normalizer, pre_tokenizer, decoder */
int tok_config_added(q3_tokenizer *t, json_t *root, tok_buf *arena, int32_t *max_id);

/* load_tables.c: model.vocab and model.merges, read with json_scan. */
typedef struct {
    int32_t id;
    uint32_t off, len;
} tok_vocab_entry;

int tok_read_vocab(q3_tokenizer *t, json_scan *s, tok_buf *arena, tok_vocab_entry **out, size_t *n_out,
                   int32_t *max_id);
/* Needs t->vocab filled. */
int tok_read_merges(q3_tokenizer *t, json_scan *s);

#endif
