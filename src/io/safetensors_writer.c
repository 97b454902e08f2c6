#include "io/safetensors_writer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

struct q3_st_writer {
    FILE *fp;
    char *path;
    uint64_t expected;   /* total data bytes declared in the header */
    uint64_t written;
};

/* The writer keeps its own dtype table so that it does not depend on the
 * reader's spelling of names. */
static const char *dtype_tag(q3_dtype t) {
    switch (t) {
    case Q3_F32: return "F32";
    case Q3_F16: return "F16";
    case Q3_BF16: return "BF16";
    case Q3_MXFP8:
    case Q3_MXFP4:
    case Q3_MXINT8:
    case Q3_BF16P: return NULL; /* not a safetensors dtype */
    }
    return NULL;
}

static unsigned dtype_bytes(q3_dtype t) { return t == Q3_F32 ? 4 : 2; }

uint64_t q3_stw_nbytes(const q3_stw_desc *d) {
    uint64_t n = dtype_bytes(d->dtype);
    for (int i = 0; i < d->ndim; i++) n *= (uint64_t)d->shape[i];
    return n;
}

/* Build the JSON header; returns the serialized text (heap) and the total
 * data size, or NULL with q3_err set. */
static char *build_header(const q3_stw_desc *desc, int n, uint64_t *total) {
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const q3_stw_desc *d = &desc[i];
        if (!dtype_tag(d->dtype) || d->ndim < 0 || d->ndim > Q3_MAX_DIMS) {
            json_decref(root);
            q3_err("tensor %s: bad dtype or rank", d->name);
            return NULL;
        }
        if (json_object_get(root, d->name)) {
            json_decref(root);
            q3_err("tensor %s: duplicate name", d->name);
            return NULL;
        }
        json_t *shape = json_array();
        for (int k = 0; k < d->ndim; k++) json_array_append_new(shape, json_integer(d->shape[k]));
        uint64_t end = off + q3_stw_nbytes(d);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)end));
        json_t *t = json_object();
        json_object_set_new(t, "dtype", json_string(dtype_tag(d->dtype)));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets", offs);
        json_object_set_new(root, d->name, t);
        off = end;
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) q3_err("cannot serialize safetensors header");
    *total = off;
    return text;
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

q3_st_writer *q3_stw_create(const char *path, const q3_stw_desc *desc, int n) {
    uint64_t total = 0;
    char *text = build_header(desc, n, &total);
    if (!text) return NULL;
    /* Pad with spaces so that tensor data starts 8-byte aligned, as the
     * reference implementation does; readers may then map data in place. */
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    unsigned char lenbuf[8];
    put_le64(lenbuf, padded);

    FILE *fp = fopen(path, "wb");
    if (!fp) {
        q3_err("cannot create %s: %s", path, strerror(errno));
        free(text);
        return NULL;
    }
    static const char spaces[8] = "        ";
    int ok = fwrite(lenbuf, 1, 8, fp) == 8 && fwrite(text, 1, len, fp) == len &&
             fwrite(spaces, 1, padded - len, fp) == padded - len;
    free(text);
    q3_st_writer *w = q3_calloc(1, sizeof *w);
    w->fp = fp;
    w->path = q3_strdup(path);
    w->expected = total;
    if (!ok) {
        q3_err("cannot write %s: %s", path, strerror(errno));
        q3_stw_abort(w);
        return NULL;
    }
    return w;
}

int q3_stw_write(q3_st_writer *w, const void *data, size_t nbytes) {
    if (w->written + nbytes > w->expected)
        return q3_err("%s: writing %zu bytes past the %llu declared in the header", w->path,
                      nbytes, (unsigned long long)w->expected);
    if (fwrite(data, 1, nbytes, w->fp) != nbytes)
        return q3_err("cannot write %s: %s", w->path, strerror(errno));
    w->written += nbytes;
    return 0;
}

static void writer_free(q3_st_writer *w) {
    free(w->path);
    free(w);
}

int q3_stw_close(q3_st_writer *w) {
    if (w->written != w->expected) {
        q3_err("%s: %llu of %llu data bytes written", w->path,
               (unsigned long long)w->written, (unsigned long long)w->expected);
        q3_stw_abort(w);
        return -1;
    }
    /* fclose reports deferred write errors (e.g. a full disk on the final
     * flush), so its result decides whether the file is good. */
    int bad = fflush(w->fp) != 0 || ferror(w->fp);
    int e = errno;
    if (fclose(w->fp) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        q3_err("cannot write %s: %s", w->path, strerror(e));
        unlink(w->path);
    }
    writer_free(w);
    return bad ? -1 : 0;
}

void q3_stw_abort(q3_st_writer *w) {
    if (!w) return;
    fclose(w->fp);
    unlink(w->path);
    writer_free(w);
}
