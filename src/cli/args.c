#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "util/error.h"

/* An argument error, said once: every rank of an MPI job parses the same
 * arguments, so only rank 0 speaks. */
static void arg_err(const char *fmt, ...) Q3_PRINTF(1, 2);
static void arg_err(const char *fmt, ...) {
    const q3_group *w = q3_comm_world();
    if (w && q3_group_rank(w) != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

const char *arg_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        arg_err("q3moe: error: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int arg_int(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        arg_err("q3moe: error: %s: '%s' is not an integer\n", opt, s);
        return -1;
    }
    if (v < lo || v > hi) {
        arg_err("q3moe: error: %s: %ld is out of range [%ld, %ld]\n", opt, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int arg_float(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        arg_err("q3moe: error: %s: '%s' is not a number\n", opt, s);
        return -1;
    }
    if (v < lo || v > hi) {
        arg_err("q3moe: error: %s: %g is out of range [%g, %g]\n", opt, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int arg_id_list(const char *opt, const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, len = 0;
    int32_t *v = q3_malloc(cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        const int digits = end != p;
        while (*end == ' ' || *end == '\t') end++; /* as strtol skips them before a number */
        if (errno || !digits || x < 0 || x > INT32_MAX || (*end && *end != ',') || (*end == ',' && !end[1])) {
            arg_err("q3moe: error: %s: bad token id list at '%s' (expected e.g. 1,2,3)\n", opt, p);
            free(v);
            return -1;
        }
        if (len == cap) v = q3_realloc(v, (cap *= 2) * sizeof *v);
        v[len++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (len == 0) {
        arg_err("q3moe: error: %s: empty token id list\n", opt);
        free(v);
        return -1;
    }
    *ids = v;
    *n = len;
    return 0;
}

int arg_unknown(const char *cmd, const char *arg) {
    arg_err("q3moe %s: error: unknown argument '%s' (see q3moe %s --help)\n", cmd, arg, cmd);
    return 2;
}
