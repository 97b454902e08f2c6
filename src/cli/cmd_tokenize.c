/* `q3moe tokenize`: text -> ids (and ids -> text) with a checkpoint's
 * tokenizer.json. The --jsonl modes exist so tests can run many strings
 * through one load of the (large) tokenizer. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/q3m.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe tokenize -m DIR (-p TEXT | -f FILE) [--jsonl] [-v]\n"
            "       q3moe tokenize -m DIR --decode (--ids 1,2,3 | --jsonl -f FILE) [-v]\n\n"
            "Encodes text with DIR/tokenizer.json and prints the ids as a JSON array on one line.\n"
            "Special tokens written in the text (e.g. <|im_start|>) become their ids.\n\n"
            "  -m DIR      checkpoint directory holding tokenizer.json (or that file, or a .q3m model file)\n"
            "  -p TEXT     text to encode\n"
            "  -f FILE     encode the whole content of FILE (UTF-8)\n"
            "  --jsonl     FILE has one JSON string per line; print one id array per line\n"
            "              (with --decode: one id array per line in, one JSON string per line out)\n"
            "  --decode    ids -> text instead; with --ids the raw bytes go to stdout, no newline\n"
            "  --ids LIST  comma-separated ids to decode\n"
            "  -v          report the tokenizer load time on stderr\n");
}

static void print_ids(const int32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    fputs("]\n", stdout);
}

/* Calls fn on every non-blank line of path; line numbers for messages. */
typedef int (*line_fn)(const q3_tokenizer *t, const char *line, size_t len);

static int for_each_line(const q3_tokenizer *t, const char *path, line_fn fn) {
    size_t size;
    char *text = q3_read_file(path, &size);
    if (!text) {
        q3_print_error();
        return 1;
    }
    int rc = 0;
    size_t lineno = 0;
    for (char *p = text, *end = text + size; rc == 0 && p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl : end) - p);
        lineno++;
        size_t k = 0;
        while (k < len && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
        if (k < len && fn(t, p, len) != 0) {
            q3_err_prefix("%s:%zu", path, lineno);
            q3_print_error();
            rc = 1;
        }
        p += len + 1;
    }
    free(text);
    return rc;
}

static int encode_line(const q3_tokenizer *t, const char *line, size_t len) {
    json_error_t je;
    json_t *s = json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!json_is_string(s)) {
        json_decref(s);
        return q3_err("expected one JSON string per line%s%s", s ? "" : ": ", s ? "" : je.text);
    }
    int32_t *ids;
    size_t n;
    int rc = q3_tok_encode(t, json_string_value(s), json_string_length(s), &ids, &n);
    json_decref(s);
    if (rc) return -1;
    print_ids(ids, n);
    free(ids);
    return 0;
}

static int decode_line(const q3_tokenizer *t, const char *line, size_t len) {
    json_error_t je;
    json_t *a = json_loadb(line, len, 0, &je);
    if (!json_is_array(a)) {
        json_decref(a);
        return q3_err("expected one JSON array of token ids per line%s%s", a ? "" : ": ", a ? "" : je.text);
    }
    size_t n = json_array_size(a);
    int32_t *ids = q3_malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            free(ids);
            json_decref(a);
            return q3_err("element %zu is not a token id", i);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(a);
    size_t tl;
    char *text = q3_tok_decode(t, ids, n, &tl);
    free(ids);
    if (!text) return -1;
    json_t *js = json_stringn(text, tl);
    free(text);
    char *out = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
    json_decref(js);
    if (!out) return q3_err("cannot JSON-encode the decoded text");
    puts(out);
    free(out);
    return 0;
}

/* The tokenizer.json embedded in a .q3m file. */
static q3_tokenizer *load_q3m(const char *path) {
    q3m_file f;
    if (q3m_open(&f, path)) return NULL;
    q3_tokenizer *t = NULL;
    char *name = q3_malloc(strlen(path) + 32);
    sprintf(name, "%s (embedded tokenizer.json)", path);
    if (!f.tokenizer_json) q3_err("%s has no embedded tokenizer.json (its checkpoint had none)", path);
    else t = q3_tok_load_buffer(f.tokenizer_json, f.tokenizer_len, name);
    free(name);
    q3m_close(&f);
    return t;
}

static q3_tokenizer *load(const char *dir, int verbose) {
    int packed = !q3_is_dir(dir) && q3m_is_q3m(dir);
    char *path = q3_is_dir(dir) ? q3_path_join(dir, "tokenizer.json") : q3_strdup(dir);
    if (!packed && !q3_file_exists(path)) {
        q3_err("%s not found (-m wants a checkpoint directory containing tokenizer.json)", path);
        free(path);
        return NULL;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    q3_tokenizer *t = packed ? load_q3m(path) : q3_tok_load(path);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (t && verbose)
        fprintf(stderr, "[q3moe] loaded %s in %.1f ms\n", path,
                (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    free(path);
    return t;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *file = NULL, *ids_s = NULL;
    int jsonl = 0, decode = 0, verbose = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--jsonl")) jsonl = 1;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "-v")) verbose = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "-p") || !strcmp(a, "-f") || !strcmp(a, "--ids")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "-m")) dir = v;
            else if (!strcmp(a, "-p")) text = v;
            else if (!strcmp(a, "-f")) file = v;
            else ids_s = v;
        } else return arg_unknown("tokenize", a);
    }
    const char *problem = NULL;
    if (!dir) problem = "-m DIR is required";
    else if (decode && !(ids_s ? !file && !text && !jsonl : file && jsonl && !text))
        problem = "--decode takes either --ids LIST or --jsonl -f FILE";
    else if (!decode && (ids_s || !text == !file)) problem = "give exactly one of -p TEXT or -f FILE";
    else if (!decode && jsonl && !file) problem = "--jsonl needs -f FILE";
    if (problem) {
        fprintf(stderr, "q3moe tokenize: error: %s\n", problem);
        usage(stderr);
        return 2;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (ids_s && arg_id_list("--ids", ids_s, &ids, &n)) return 2;

    q3_tokenizer *t = load(dir, verbose);
    if (!t) {
        free(ids);
        q3_print_error();
        return 1;
    }
    int rc = 0;
    if (jsonl) {
        rc = for_each_line(t, file, decode ? decode_line : encode_line);
    } else if (decode) {
        size_t len;
        char *out = q3_tok_decode(t, ids, n, &len);
        if (out) fwrite(out, 1, len, stdout);
        else rc = 1, q3_print_error();
        free(out);
    } else {
        size_t len = text ? strlen(text) : 0;
        char *buf = file ? q3_read_file(file, &len) : NULL;
        if (file && !buf) rc = 1, q3_print_error();
        else if (q3_tok_encode(t, file ? buf : text, len, &ids, &n) != 0) {
            if (file) q3_err_prefix("%s", file);
            q3_print_error();
            rc = 1;
        } else print_ids(ids, n);
        free(buf);
    }
    free(ids);
    q3_tok_free(t);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "q3moe tokenize: error: writing to stdout failed\n");
        return 1;
    }
    return rc;
}
