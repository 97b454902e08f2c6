#include "synth/write.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "synth/config.h"
#include "io/safetensors_writer.h"
#include "util/error.h"
#include "util/file.h"

/* Elements generated per write: 16 MiB of F32 at most. Chunks are the only
 * memory synth needs, whatever the checkpoint size. */
#define CHUNK_ELEMS ((size_t)4 << 20)

/* Below this size a non-terminal stderr gets no progress lines at all (the
 * test suite writes many small checkpoints). */
#define QUIET_BELOW ((uint64_t)256 << 20)

typedef struct {
    uint64_t total, done;
    int tty;
    int last;   /* last permille (tty) or decile (log) reported */
} progress;

static void progress_update(progress *pr) {
    if (pr->total == 0) return;
    if (pr->tty) {
        int pm = (int)(pr->done * 1000 / pr->total);
        if (pm == pr->last) return;
        pr->last = pm;
        fprintf(stderr, "\rsynth: %5.1f%%  %.2f / %.2f GB", pm / 10.0, pr->done / 1e9, pr->total / 1e9);
        if (pr->done == pr->total) fputc('\n', stderr);
    } else {
        if (pr->total < QUIET_BELOW) return;
        int dec = (int)(pr->done * 10 / pr->total);
        if (dec == pr->last) return;
        pr->last = dec;
        fprintf(stderr, "synth: %d%% (%.2f of %.2f GB)\n", dec * 10, pr->done / 1e9, pr->total / 1e9);
    }
    fflush(stderr);
}

int synth_assign_shards(const synth_plan *p, uint64_t limit, int *shard_of) {
    int shard = 0;
    uint64_t used = 0;
    for (int i = 0; i < p->n; i++) {
        uint64_t b = synth_tensor_nbytes(&p->t[i]);
        if (used > 0 && used + b > limit) {
            shard++;
            used = 0;
        }
        shard_of[i] = shard;
        used += b;
    }
    return p->n ? shard + 1 : 0;
}

static char *shard_name(int s, int n) {
    char buf[64];
    if (n == 1) snprintf(buf, sizeof buf, "model.safetensors");
    else snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", s + 1, n);
    return q3_strdup(buf);
}

/* Write tensors [lo, hi) of the plan into one file. */
static int write_file(const char *path, const synth_plan *p, int lo, int hi, uint64_t seed,
                      void *buf, progress *pr) {
    q3_stw_desc *desc = q3_calloc((size_t)(hi - lo), sizeof *desc);
    for (int i = lo; i < hi; i++) {
        const synth_tensor *t = &p->t[i];
        desc[i - lo] = (q3_stw_desc){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                     .shape = {t->shape[0], t->shape[1]}};
    }
    q3_st_writer *w = q3_stw_create(path, desc, hi - lo);
    free(desc);
    if (!w) return -1;
    for (int i = lo; i < hi; i++) {
        const synth_tensor *t = &p->t[i];
        uint64_t numel = synth_tensor_numel(t), esize = t->dtype == Q3_F32 ? 4 : 2;
        for (uint64_t off = 0; off < numel; off += CHUNK_ELEMS) {
            size_t n = (size_t)(numel - off < CHUNK_ELEMS ? numel - off : CHUNK_ELEMS);
            synth_fill(t, seed, off, n, buf);
            if (q3_stw_write(w, buf, n * esize) != 0) {
                q3_stw_abort(w);
                return -1;
            }
            pr->done += n * esize;
            progress_update(pr);
        }
    }
    return q3_stw_close(w);
}

static int write_index(const char *dir, const synth_plan *p, const int *shard_of, int n_shards) {
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)p->total_bytes));
    json_object_set_new(root, "metadata", meta);
    for (int i = 0; i < p->n; i++) {
        char *f = shard_name(shard_of[i], n_shards);
        json_object_set_new(map, p->t[i].name, json_string(f));
        free(f);
    }
    json_object_set_new(root, "weight_map", map);
    char *path = q3_path_join(dir, "model.safetensors.index.json");
    int rc = synth_dump_json(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    free(path);
    json_decref(root);
    return rc;
}

int synth_write_weights(const char *dir, const synth_plan *p, uint64_t shard_limit, uint64_t seed) {
    int *shard_of = q3_malloc((size_t)p->n * sizeof *shard_of);
    int n_shards = synth_assign_shards(p, shard_limit, shard_of);
    void *buf = q3_malloc(CHUNK_ELEMS * 4);
    progress pr = {.total = p->total_bytes, .tty = isatty(STDERR_FILENO), .last = -1};
    int rc = 0;
    for (int lo = 0, s = 0; rc == 0 && lo < p->n; s++) {
        int hi = lo;
        while (hi < p->n && shard_of[hi] == s) hi++;
        char *name = shard_name(s, n_shards), *path = q3_path_join(dir, name);
        rc = write_file(path, p, lo, hi, seed, buf, &pr);
        free(name);
        free(path);
        lo = hi;
    }
    if (rc == 0 && n_shards > 1) rc = write_index(dir, p, shard_of, n_shards);
    if (rc != 0 && pr.tty) fputc('\n', stderr);   /* end the in-place progress line */
    free(buf);
    free(shard_of);
    return rc;
}
