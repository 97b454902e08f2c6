#include "util/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_msg[2048];

int q3_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return -1;
}

int q3_err_prefix(const char *fmt, ...) {
    char prefix[1024], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    memcpy(g_msg + n, ": ", 2);
    size_t rest = strlen(old), room = sizeof g_msg - n - 3;
    if (rest > room) rest = room;
    memcpy(g_msg + n + 2, old, rest);
    g_msg[n + 2 + rest] = 0;
    return -1;
}

const char *q3_errmsg(void) { return g_msg[0] ? g_msg : "unknown error"; }
void q3_err_clear(void) { g_msg[0] = 0; }

void q3_print_error(void) { fprintf(stderr, "q3moe: error: %s\n", q3_errmsg()); }

void q3_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("q3moe: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *oom(size_t n) {
    q3_die("out of memory allocating %zu bytes", n);
    return NULL;
}

void *q3_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    return p ? p : oom(n);
}

void *q3_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    return p ? p : oom(n * size);
}

/* The block from calloc, whose address is kept in the word before the
 * aligned one. */
enum { ALIGN = 64 };

void *q3_calloc_aligned(size_t n, size_t size) {
    if (size && n > (SIZE_MAX - ALIGN - sizeof(void *)) / size) return oom(SIZE_MAX);
    char *p = calloc(n * size + ALIGN + sizeof(void *), 1);
    if (!p) return oom(n * size);
    char *a = (char *)(((uintptr_t)p + sizeof(void *) + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
    memcpy(a - sizeof(void *), &p, sizeof p);
    return a;
}

void q3_free_aligned(void *a) {
    if (!a) return;
    void *p;
    memcpy(&p, (char *)a - sizeof p, sizeof p);
    free(p);
}

void *q3_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    return q ? q : oom(n);
}

char *q3_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = q3_malloc(n);
    memcpy(p, s, n);
    return p;
}
