/* A minimal pull-style JSON reader over a text in memory.
 *
 * tokenizer.json is mostly two huge tables (model.vocab, model.merges:
 * ~150k entries each). Building a jansson tree for them costs a few hundred
 * milliseconds of allocation and hashing, so the loader walks the document
 * with this reader, reads those two tables straight into the tokenizer's own
 * structures, and hands every other (small) value to jansson. */
#ifndef Q3_JSON_SCAN_H
#define Q3_JSON_SCAN_H

#include <stddef.h>

#include "tokenizer/tok_internal.h"

typedef struct {
    const char *start, *p, *end;
    const char *path; /* for messages */
} json_scan;

/* Skip whitespace; returns the next byte, or 0 at the end of the text. */
char js_peek(json_scan *s);
/* Consume byte c (after whitespace) or fail with a message. */
int js_expect(json_scan *s, char c, const char *what);
/* Read a string into out (replacing its contents), escapes decoded. */
int js_string(json_scan *s, tok_buf *out);
/* Read an integer. */
int js_int(json_scan *s, long long *out);
/* Skip one value of any type, storing where it starts and ends. */
int js_skip(json_scan *s, const char **vstart, const char **vend);
/* After a member or element: consume ',' (returns 1) or `close` (returns 0). */
int js_next(json_scan *s, char close, const char *what);
/* Record a syntax error at the current position (line and column). */
int js_error(json_scan *s, const char *msg);

#endif
