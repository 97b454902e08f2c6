#include "io/safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

const char *q3_dtype_name(q3_dtype t) {
    switch (t) {
    case Q3_F32: return "F32";
    case Q3_F16: return "F16";
    case Q3_BF16: return "BF16";
    case Q3_MXFP8: return "MXFP8";
    case Q3_MXFP4: return "MXFP4";
    case Q3_MXINT8: return "MXINT8";
    case Q3_BF16P: return "BF16P";
    }
    return "?";
}

/* Bytes per element of the plain dtypes (MX sizes: q3_mat_bytes). */
size_t q3_dtype_size(q3_dtype t) { return t == Q3_F32 ? 4 : 2; }

static int parse_dtype(const char *s, q3_dtype *out) {
    if (!strcmp(s, "F32")) *out = Q3_F32;
    else if (!strcmp(s, "F16")) *out = Q3_F16;
    else if (!strcmp(s, "BF16")) *out = Q3_BF16;
    else return -1;
    return 0;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Half-open byte range of one tensor inside its file's data region, for the overlap check. */
typedef struct {
    uint64_t begin, end;
    int tensor;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parse one file's header, appending its tensors to the archive. */
static int parse_file(q3_st_archive *a, int file_idx) {
    const q3_mapped_file *f = &a->files[file_idx];
    const char *path = f->path;
    if (f->size < 8) return q3_err("%s: truncated safetensors file (%zu bytes, need at least 8)", path, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->data[i];
    if (hlen > f->size - 8)
        return q3_err("%s: header length %llu runs past the end of the file (%zu bytes): truncated or not a safetensors file",
                      path, (unsigned long long)hlen, f->size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->data + 8, hlen, 0, &jerr);
    if (!root) return q3_err("%s: header is not valid JSON: %s (at byte %d)", path, jerr.text, jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return q3_err("%s: header is not a JSON object", path);
    }
    const unsigned char *base = f->data + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    size_t n_new = json_object_size(root);
    a->tensors = q3_realloc(a->tensors, (a->n_tensors + n_new) * sizeof *a->tensors);
    span *spans = q3_malloc(n_new * sizeof *spans);
    size_t n_spans = 0;
    int rc = 0;
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            rc = q3_err("%s: tensor %s: header entry needs dtype, shape and data_offsets [begin, end]", path, name);
            break;
        }
        q3_st_tensor *t = &a->tensors[a->n_tensors];
        memset(t, 0, sizeof *t);
        if (parse_dtype(json_string_value(jd), &t->dtype)) {
            rc = q3_err("%s: tensor %s: unsupported dtype %s (supported: F32, F16, BF16)", path, name, json_string_value(jd));
            break;
        }
        size_t nd = json_array_size(js);
        if (nd > Q3_MAX_DIMS) {
            rc = q3_err("%s: tensor %s: %zu dimensions (at most %d supported)", path, name, nd, Q3_MAX_DIMS);
            break;
        }
        uint64_t numel = 1;
        int bad = 0;
        for (size_t d = 0; d < nd; d++) {
            json_t *x = json_array_get(js, d);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1ll << 40)) bad = 1;
            else {
                t->shape[d] = json_integer_value(x);
                numel *= (uint64_t)t->shape[d];
                if (numel > (1ull << 48)) bad = 1;
            }
        }
        json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
        if (bad || !json_is_integer(b) || !json_is_integer(e)) {
            rc = q3_err("%s: tensor %s: malformed shape or data_offsets", path, name);
            break;
        }
        json_int_t begin = json_integer_value(b), end = json_integer_value(e);
        if (begin < 0 || end < begin || (uint64_t)end > data_size) {
            rc = q3_err("%s: tensor %s: data_offsets [%lld, %lld] out of range (data region is %llu bytes)", path, name,
                        (long long)begin, (long long)end, (unsigned long long)data_size);
            break;
        }
        uint64_t want = numel * q3_dtype_size(t->dtype);
        if ((uint64_t)(end - begin) != want) {
            rc = q3_err("%s: tensor %s: %lld bytes in data_offsets but shape and dtype %s need %llu", path, name,
                        (long long)(end - begin), q3_dtype_name(t->dtype), (unsigned long long)want);
            break;
        }
        if ((uintptr_t)(base + begin) % q3_dtype_size(t->dtype)) {
            rc = q3_err("%s: tensor %s: data is not aligned to its %zu-byte element size", path, name, q3_dtype_size(t->dtype));
            break;
        }
        t->name = q3_strdup(name);
        t->ndim = (int)nd;
        t->data = base + begin;
        t->nbytes = (size_t)want;
        t->file = file_idx;
        spans[n_spans++] = (span){(uint64_t)begin, (uint64_t)end, a->n_tensors};
        a->n_tensors++;
    }
    if (rc == 0) {
        qsort(spans, n_spans, sizeof *spans, span_cmp);
        for (size_t i = 1; i < n_spans; i++)
            if (spans[i].begin < spans[i - 1].end) {
                rc = q3_err("%s: tensor %s overlaps tensor %s in the data region", path, a->tensors[spans[i].tensor].name,
                            a->tensors[spans[i - 1].tensor].name);
                break;
            }
    }
    free(spans);
    json_decref(root);
    return rc;
}

static int build_table(q3_st_archive *a) {
    size_t size = 16;
    while (size < (size_t)a->n_tensors * 2) size *= 2;
    a->table_size = size;
    a->table = q3_malloc(size * sizeof *a->table);
    for (size_t i = 0; i < size; i++) a->table[i] = -1;
    for (int t = 0; t < a->n_tensors; t++) {
        size_t h = hash_str(a->tensors[t].name) & (size - 1);
        while (a->table[h] >= 0) {
            if (!strcmp(a->tensors[a->table[h]].name, a->tensors[t].name))
                return q3_err("tensor %s appears twice (in %s and %s)", a->tensors[t].name,
                              a->files[a->tensors[a->table[h]].file].path, a->files[a->tensors[t].file].path);
            h = (h + 1) & (size - 1);
        }
        a->table[h] = t;
    }
    return 0;
}

int q3_st_build_index(q3_st_archive *a) { return build_table(a); }

const q3_st_tensor *q3_st_find(const q3_st_archive *a, const char *name) {
    if (!a->table) return NULL;
    size_t h = hash_str(name) & (a->table_size - 1);
    while (a->table[h] >= 0) {
        if (!strcmp(a->tensors[a->table[h]].name, name)) return &a->tensors[a->table[h]];
        h = (h + 1) & (a->table_size - 1);
    }
    return NULL;
}

static int add_file(q3_st_archive *a, const char *path) {
    a->files = q3_realloc(a->files, (a->n_files + 1) * sizeof *a->files);
    if (q3_map_file(&a->files[a->n_files], path)) return -1;
    a->n_files++;
    return parse_file(a, a->n_files - 1);
}

int q3_st_open_file(q3_st_archive *a, const char *path) {
    memset(a, 0, sizeof *a);
    if (add_file(a, path) || build_table(a)) {
        q3_st_close(a);
        return -1;
    }
    return 0;
}

static int name_cmp(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* The shard list from model.safetensors.index.json (unique file names, sorted). */
static int index_files(const char *index_path, char ***names_out, size_t *n_out) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, 0, &jerr);
    if (!root) return q3_err("%s: not valid JSON: %s (line %d)", index_path, jerr.text, jerr.line);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return q3_err("%s: missing \"weight_map\" object", index_path);
    }
    char **names = NULL;
    size_t n = 0;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(map, key, v) {
        const char *fn = json_string_value(v);
        if (!fn || strchr(fn, '/') || !strcmp(fn, "..")) {
            rc = q3_err("%s: weight_map entry for %s is not a plain file name", index_path, key);
            break;
        }
        size_t i = 0;
        while (i < n && strcmp(names[i], fn)) i++;
        if (i == n) {
            names = q3_realloc(names, (n + 1) * sizeof *names);
            names[n++] = q3_strdup(fn);
        }
    }
    json_decref(root);
    if (rc == 0 && n == 0) rc = q3_err("%s: weight_map is empty", index_path);
    if (rc) {
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        return rc;
    }
    qsort(names, n, sizeof *names, name_cmp);
    *names_out = names;
    *n_out = n;
    return 0;
}

int q3_st_open_dir(q3_st_archive *a, const char *dir) {
    memset(a, 0, sizeof *a);
    if (!q3_is_dir(dir)) return q3_err("%s is not a directory", dir);
    char *index = q3_path_join(dir, "model.safetensors.index.json");
    char *single = q3_path_join(dir, "model.safetensors");
    int rc = 0;
    if (q3_file_exists(index)) {
        char **names;
        size_t n;
        rc = index_files(index, &names, &n);
        if (rc == 0) {
            for (size_t i = 0; i < n && rc == 0; i++) {
                char *p = q3_path_join(dir, names[i]);
                if (!*names[i]) rc = q3_err("%s lists a shard with an empty name", index);
                else if (q3_is_dir(p)) rc = q3_err("shard %s listed in %s is a directory, not a file", p, index);
                else if (!q3_file_exists(p)) rc = q3_err("shard %s listed in %s does not exist", p, index);
                else rc = add_file(a, p);
                free(p);
            }
            for (size_t i = 0; i < n; i++) free(names[i]);
            free(names);
        }
    } else if (q3_file_exists(single)) {
        rc = add_file(a, single);
    } else {
        rc = q3_err("%s has no model.safetensors or model.safetensors.index.json: not a Hugging Face checkpoint", dir);
    }
    free(index);
    free(single);
    if (rc == 0) rc = build_table(a);
    if (rc) {
        q3_st_close(a);
        return rc;
    }
    /* A checkpoint that fits comfortably in memory is mapped in full up
     * front: decode then never stalls on a page fault when it first touches
     * an expert. Larger ones are left to demand paging. */
    size_t total = 0;
    for (int i = 0; i < a->n_files; i++) total += a->files[i].size;
    if (total < q3_mem_available() / 4 * 3)
        for (int i = 0; i < a->n_files; i++) q3_prefault(&a->files[i]);
    return 0;
}

void q3_st_close(q3_st_archive *a) {
    for (int i = 0; i < a->n_tensors; i++) free(a->tensors[i].name);
    free(a->tensors);
    for (int i = 0; i < a->n_files; i++) q3_unmap_file(&a->files[i]);
    free(a->files);
    free(a->table);
    memset(a, 0, sizeof *a);
}
