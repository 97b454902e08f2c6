/* Error reporting in the style of sqlite3_errmsg: a failing function returns
 * non-zero (or NULL) after recording one human-readable message, which the
 * caller at the top (a CLI command) prints. Messages name the file, field or
 * argument at fault. */
#ifndef Q3_ERROR_H
#define Q3_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#if defined(__GNUC__)
#define Q3_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define Q3_PRINTF(a, b)
#endif

/* Record an error message (replacing any earlier one). Always returns -1 so
 * that `return q3_err(...)` reads naturally. */
int q3_err(const char *fmt, ...) Q3_PRINTF(1, 2);
/* Prefix the current message with context, e.g. the file being loaded. */
int q3_err_prefix(const char *fmt, ...) Q3_PRINTF(1, 2);
const char *q3_errmsg(void);
void q3_err_clear(void);

/* Allocation that never returns NULL: out-of-memory is fatal with a message. */
void *q3_malloc(size_t n);
void *q3_calloc(size_t n, size_t size);
void *q3_realloc(void *p, size_t n);
/* Zeroed, 64-byte aligned (a cache line, an AVX-512 vector); large ones are
 * still fresh pages only touched when used, as calloc's are. Free with
 * q3_free_aligned. */
void *q3_calloc_aligned(size_t n, size_t size);
void q3_free_aligned(void *p);
char *q3_strdup(const char *s);

/* Print "q3moe: error: ..." to stderr. */
void q3_print_error(void);
void q3_die(const char *fmt, ...) Q3_PRINTF(1, 2);

#endif
