/* The .q3m writer and checkpoint -> .q3m conversion (see convert.h). */
#include "quant/convert.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "io/q3m.h"
#include "model/model.h"
#include "quant/bf16p.h"
#include "quant/mx.h"
#include "util/error.h"
#include "util/file.h"

/* ---- schemes ---- */

int q3_scheme_parse_dtype(const char *s, q3_dtype *out) {
    if (!strcmp(s, "mxfp4")) *out = Q3_MXFP4;
    else if (!strcmp(s, "mxfp8")) *out = Q3_MXFP8;
    else if (!strcmp(s, "mxint8")) *out = Q3_MXINT8;
    else if (!strcmp(s, "bf16")) *out = Q3_BF16;
    else if (!strcmp(s, "bf16p")) *out = Q3_BF16P;
    else return -1;
    return 0;
}

int q3_scheme_from_name(const char *name, q3_quant_scheme *out) {
    static const struct {
        const char *name;
        q3_quant_scheme s;
    } tab[] = {
        {"w4a8", {Q3_MXFP4, Q3_MXFP8, Q3_MXFP8, Q3_BF16}},
        {"w8a8", {Q3_MXFP8, Q3_MXFP8, Q3_MXFP8, Q3_BF16}},
        {"w4a8i", {Q3_MXFP4, Q3_MXINT8, Q3_MXINT8, Q3_BF16}},
        {"w8a8i", {Q3_MXINT8, Q3_MXINT8, Q3_MXINT8, Q3_BF16}},
        {"w4", {Q3_MXFP4, Q3_MXFP4, Q3_F32, Q3_BF16}},
        {"w8", {Q3_MXFP8, Q3_MXFP8, Q3_F32, Q3_BF16}},
        {"bf16", {Q3_BF16, Q3_BF16, Q3_F32, Q3_BF16}},
        {"bf16p", {Q3_BF16P, Q3_BF16P, Q3_F32, Q3_BF16P}},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(name, tab[i].name)) {
            *out = tab[i].s;
            return 0;
        }
    return -1;
}

static const char *scheme_dtype_name(q3_dtype t) { return t == Q3_BF16 ? "as stored" : q3_dtype_name(t); }

/* Whether a target dtype changes the stored weights (MX, or BF16P). */
static int converts(q3_dtype t) { return q3_dtype_is_mx(t) || t == Q3_BF16P; }

const char *q3_scheme_describe(const q3_quant_scheme *s, char *buf, unsigned cap) {
    snprintf(buf, cap, "ffn %s, attn %s, act %s%s%s", scheme_dtype_name(s->ffn), scheme_dtype_name(s->attn),
             q3_dtype_is_mx(s->act) ? q3_dtype_name(s->act) : "fp32", converts(s->head) ? ", lm_head " : "",
             converts(s->head) ? scheme_dtype_name(s->head) : "");
    return buf;
}

int q3_is_scheme_flag(const char *flag) {
    return !strcmp(flag, "--quant") || !strcmp(flag, "--ffn") || !strcmp(flag, "--attn") || !strcmp(flag, "--act") ||
           !strcmp(flag, "--head");
}

int q3_scheme_flag(const char *flag, const char *value, q3_quant_scheme *s) {
    if (!strcmp(flag, "--quant")) {
        if (q3_scheme_from_name(value, s)) return q3_err("--quant: unknown scheme '%s' (choose from %s)", value, Q3_SCHEME_NAMES);
    } else if (!strcmp(flag, "--act")) {
        if (!strcmp(value, "none")) s->act = Q3_F32;
        else if (q3_scheme_parse_dtype(value, &s->act) || !(s->act == Q3_MXFP8 || s->act == Q3_MXINT8))
            return q3_err("--act: '%s' is not one of mxfp8, mxint8, none", value);
    } else if (!strcmp(flag, "--head")) {
        if (q3_scheme_parse_dtype(value, &s->head))
            return q3_err("--head: '%s' is not one of mxfp8, mxfp4, mxint8, bf16, bf16p", value);
    } else if (q3_scheme_parse_dtype(value, !strcmp(flag, "--ffn") ? &s->ffn : &s->attn)) {
        return q3_err("%s: '%s' is not one of mxfp4, mxfp8, mxint8, bf16, bf16p", flag, value);
    }
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

q3_dtype q3_convert_target(const char *name, const q3_quant_scheme *s) {
    static const char *const attn[] = {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                                       ".self_attn.o_proj.weight"};
    static const char *const ffn[] = {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"};
    for (int i = 0; i < 4; i++)
        if (ends_with(name, attn[i])) return s->attn;
    if (!strcmp(name, "lm_head.weight")) return converts(s->head) ? s->head : Q3_BF16;
    /* model.layers.L.mlp.{gate,up,down}_proj and model.layers.L.mlp.experts.E.*_proj
     * (not the router, model.layers.L.mlp.gate.weight). */
    if (strstr(name, ".mlp."))
        for (int i = 0; i < 3; i++)
            if (ends_with(name, ffn[i])) return s->ffn;
    return Q3_BF16;
}

/* ---- output: a temporary file written through one buffer ---- */

#define WBUF_SIZE (8u << 20)
#define SYNC_WINDOW (256ull << 20)

typedef struct {
    int fd;
    const char *path;
    unsigned char *buf;
    size_t len;
    uint64_t pos;          /* file offset of buf[0] + len */
    uint64_t synced;       /* bytes handed to writeback */
    uint64_t dropped;      /* bytes written back and dropped from the page cache */
} writer;

static int w_flush(writer *w) {
    size_t off = 0;
    while (off < w->len) {
        ssize_t n = write(w->fd, w->buf + off, w->len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return q3_err("error writing %s: %s", w->path, n < 0 ? strerror(errno) : "short write");
        off += (size_t)n;
    }
    w->len = 0;
    /* Keep the dirty page cache bounded on huge outputs: start writeback of
     * each new window, then wait for the one before and drop it. */
    if (w->pos - w->synced >= SYNC_WINDOW) {
        sync_file_range(w->fd, (off64_t)w->synced, (off64_t)(w->pos - w->synced), SYNC_FILE_RANGE_WRITE);
        if (w->synced > w->dropped) {
            sync_file_range(w->fd, (off64_t)w->dropped, (off64_t)(w->synced - w->dropped),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
            posix_fadvise(w->fd, (off_t)w->dropped, (off_t)(w->synced - w->dropped), POSIX_FADV_DONTNEED);
            w->dropped = w->synced;
        }
        w->synced = w->pos;
    }
    return 0;
}

/* Room for n bytes at the end of the buffer (n <= WBUF_SIZE). */
static unsigned char *w_reserve(writer *w, size_t n) {
    if (w->len + n > WBUF_SIZE && w_flush(w)) return NULL;
    unsigned char *p = w->buf + w->len;
    w->len += n;
    w->pos += n;
    return p;
}

static int w_put(writer *w, const void *src, uint64_t n) {
    const unsigned char *s = src;
    while (n) {
        size_t k = n < WBUF_SIZE ? (size_t)n : WBUF_SIZE;
        unsigned char *p = w_reserve(w, k);
        if (!p) return -1;
        memcpy(p, s, k);
        s += k;
        n -= k;
    }
    return 0;
}

/* Zero padding up to file offset `to` (the planned offset of the next blob). */
static int w_pad_to(writer *w, uint64_t to) {
    if (to < w->pos) return q3_err("internal error: writer at %llu is past the planned offset %llu", (unsigned long long)w->pos,
                                   (unsigned long long)to);
    while (w->pos < to) {
        size_t k = to - w->pos < WBUF_SIZE ? (size_t)(to - w->pos) : WBUF_SIZE;
        unsigned char *p = w_reserve(w, k);
        if (!p) return -1;
        memset(p, 0, k);
    }
    return 0;
}

/* ---- cleanup of the temporary file on a signal ---- */

static char g_tmp_path[4096];
static volatile sig_atomic_t g_tmp_live;
static const int g_signals[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_old_sa[3];

static void on_signal(int sig) {
    if (g_tmp_live) unlink(g_tmp_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void guard_tmp(const char *path) {
    snprintf(g_tmp_path, sizeof g_tmp_path, "%s", path);
    g_tmp_live = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaction(g_signals[i], &sa, &g_old_sa[i]);
}

static void unguard_tmp(void) {
    g_tmp_live = 0;
    for (int i = 0; i < 3; i++) sigaction(g_signals[i], &g_old_sa[i], NULL);
}

/* ---- progress ---- */

typedef struct {
    int quiet, tty;
    const char *tag;
    uint64_t total, done;
    int last_shown; /* per mille on a terminal, tenths otherwise */
    double t0, last_t;
} progress;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void progress_show(progress *p, int final) {
    if (p->quiet || !p->total) return;
    double frac = (double)p->done / (double)p->total;
    double el = now_s() - p->t0;
    if (p->tty) {
        int pm = (int)(frac * 1000);
        if (!final && (pm == p->last_shown || el - p->last_t < 0.1)) return; /* at most 10 updates a second */
        p->last_shown = pm;
        p->last_t = el;
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] [%s] %5.1f%%  %.2f / %.2f GB  %.0f s", p->tag, bar, 100 * frac, p->done / 1e9, p->total / 1e9, el);
        if (final) fputc('\n', stderr);
    } else {
        /* A line per 10%, from the first second on (a small model just gets the summary). */
        int tenth = (int)(frac * 10);
        if (final || el < 1.0 || tenth <= p->last_shown || tenth == 10) return;
        p->last_shown = tenth;
        fprintf(stderr, "[%s] %3d%%  %.2f / %.2f GB  %.0f s\n", p->tag, tenth * 10, p->done / 1e9, p->total / 1e9, el);
    }
    fflush(stderr);
}

/* ---- tensors ---- */

/* Source elements fetched per read: 4x the write buffer, so that BF16 ->
 * MXFP4 (4 bytes in per byte out) fills the buffer in one go. */
#define SCRATCH_SIZE (4 * (size_t)WBUF_SIZE)

static uint64_t numel_of(const q3_src_tensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static uint64_t nbytes_of(const q3_src_tensor *t) { return numel_of(t) * q3_dtype_size(t->dtype); }

/* Quantize tensor ti row by row into the writer: elements now, scales
 * (kept for the whole tensor: 1/32 of the elements) after them. */
static int write_quantized(writer *w, const q3_tensor_source *s, int ti, const q3m_tensor_out *o, void *scratch,
                           progress *pr) {
    const q3_src_tensor *t = &s->tensors[ti];
    const size_t cols = (size_t)t->shape[t->ndim - 1], rows = (size_t)(numel_of(t) / cols);
    const size_t row_el = q3_mx_elem_bytes(o->dtype, cols), row_sc = cols / Q3_MX_BLOCK;
    const size_t in_row = cols * q3_dtype_size(t->dtype);
    if (row_el > WBUF_SIZE || in_row > SCRATCH_SIZE)
        return q3_err("tensor %s: rows of %zu columns are too long to convert", t->name, cols);
    size_t chunk = WBUF_SIZE / row_el < SCRATCH_SIZE / in_row ? WBUF_SIZE / row_el : SCRATCH_SIZE / in_row;
    uint8_t *scales = q3_malloc(rows * row_sc);
    int rc = 0;
    for (size_t r0 = 0; rc == 0 && r0 < rows; r0 += chunk) {
        size_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        const void *src = s->read(s->ctx, ti, (uint64_t)r0 * cols, nr * cols, scratch);
        uint8_t *out = w_reserve(w, nr * row_el);
        if (!out) {
            rc = -1;
            break;
        }
        long bad = -1;
#pragma omp parallel
        {
            float *x = q3_malloc(cols * sizeof(float));
#pragma omp for schedule(static)
            for (long i = 0; i < (long)nr; i++) {
                q3_to_f32(x, src, t->dtype, (size_t)i * cols, cols);
                int finite = 1;
                for (size_t k = 0; k < cols; k++) finite &= isfinite(x[k]) != 0;
                if (!finite) {
#pragma omp critical(q3_convert_bad)
                    if (bad < 0 || i < bad) bad = i;
                    continue;
                }
                /* Cannot fail: the row is finite and cols % 32 == 0. */
                q3_mx_quantize_row(o->dtype, x, cols, scales + (r0 + (size_t)i) * row_sc, out + (size_t)i * row_el);
            }
            free(x);
        }
        if (bad >= 0) {
            float *x = q3_malloc(cols * sizeof(float));
            q3_to_f32(x, src, t->dtype, (size_t)bad * cols, cols);
            size_t k = 0;
            while (k < cols && isfinite(x[k])) k++;
            rc = q3_err("%s%stensor %s: element [%zu, %zu] is %s; a weight must be finite to be quantized",
                        s->origin ? s->origin(s->ctx, ti) : "", s->origin ? ": " : "", t->name, r0 + (size_t)bad, k,
                        isnan(x[k]) ? "NaN" : x[k] > 0 ? "+infinity" : "-infinity");
            free(x);
            break;
        }
        pr->done += nr * in_row;
        progress_show(pr, 0);
    }
    if (rc == 0) rc = w_pad_to(w, o->scales_offset);
    if (rc == 0) rc = w_put(w, scales, rows * row_sc);
    free(scales);
    return rc;
}

static int write_copy(writer *w, const q3_tensor_source *s, int ti, void *scratch, progress *pr) {
    const q3_src_tensor *t = &s->tensors[ti];
    const size_t esize = q3_dtype_size(t->dtype), step = SCRATCH_SIZE / esize;
    const uint64_t numel = numel_of(t);
    for (uint64_t off = 0; off < numel; off += step) {
        size_t n = numel - off < step ? (size_t)(numel - off) : step;
        if (w_put(w, s->read(s->ctx, ti, off, n, scratch), (uint64_t)n * esize)) return -1;
        pr->done += (uint64_t)n * esize;
        progress_show(pr, 0);
    }
    return 0;
}

/* BF16P: rows of tensor ti per read, and bytes of a source / packed row. */
static size_t bf16p_chunk(const q3_src_tensor *t, size_t *cols, size_t *rows) {
    *cols = (size_t)t->shape[t->ndim - 1];
    *rows = (size_t)(numel_of(t) / *cols);
    const size_t in_row = *cols * 2, out_row = q3_bf16p_row_bytes(*cols);
    const size_t a = SCRATCH_SIZE / in_row, b = WBUF_SIZE / out_row;
    return a < b ? a : b;
}

/* Raw groups per row of a chunk (cnt[i], in parallel), and their sum. */
static size_t count_chunk(const uint16_t *src, size_t nr, size_t cols, size_t *cnt) {
    size_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (long i = 0; i < (long)nr; i++) sum += cnt[i] = q3_bf16p_count_row(src + (size_t)i * cols, cols);
    return sum;
}

/* The side table's size for tensor ti (a pass over its elements: the .q3m
 * layout is planned before the first byte is written). */
static int count_raw_groups(const q3_tensor_source *s, int ti, uint64_t *side_bytes) {
    size_t cols, rows, chunk = bf16p_chunk(&s->tensors[ti], &cols, &rows);
    if (!chunk) return q3_err("tensor %s: rows of %zu columns are too long to pack", s->tensors[ti].name, cols);
    void *scratch = q3_malloc(SCRATCH_SIZE);
    size_t *cnt = q3_malloc(chunk * sizeof *cnt), raw = 0;
    for (size_t r0 = 0; r0 < rows; r0 += chunk) {
        const size_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        raw += count_chunk(s->read(s->ctx, ti, (uint64_t)r0 * cols, nr * cols, scratch), nr, cols, cnt);
    }
    free(cnt);
    free(scratch);
    if (raw > Q3_BF16P_RAW_MAX)
        return q3_err("tensor %s: %zu of its groups of 64 do not fit BF16P (at most %u can be kept raw); use bf16", s->tensors[ti].name,
                      raw, (unsigned)Q3_BF16P_RAW_MAX);
    *side_bytes = (uint64_t)raw * Q3_BF16P_RAW_BYTES;
    return 0;
}

/* Pack tensor ti into the writer: the groups now, the raw groups (kept for
 * the whole tensor: a few per mille of it) after them. */
static int write_bf16p(writer *w, const q3_tensor_source *s, int ti, const q3m_tensor_out *o, void *scratch, progress *pr) {
    size_t cols, rows, chunk = bf16p_chunk(&s->tensors[ti], &cols, &rows);
    const size_t out_row = q3_bf16p_row_bytes(cols), planned = (size_t)(o->scales_size / Q3_BF16P_RAW_BYTES);
    uint8_t *side = q3_malloc(o->scales_size ? (size_t)o->scales_size : 1);
    size_t *cnt = q3_malloc(chunk * sizeof *cnt), *first = q3_malloc(chunk * sizeof *first), raw = 0;
    int rc = 0;
    for (size_t r0 = 0; rc == 0 && r0 < rows; r0 += chunk) {
        const size_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        const uint16_t *src = s->read(s->ctx, ti, (uint64_t)r0 * cols, nr * cols, scratch);
        size_t n = count_chunk(src, nr, cols, cnt);
        if (raw + n > planned) { /* the source changed since it was counted */
            rc = q3_err("tensor %s changed while it was converted", s->tensors[ti].name);
            break;
        }
        for (size_t i = 0, at = raw; i < nr; at += cnt[i++]) first[i] = at;
        uint8_t *out = w_reserve(w, nr * out_row);
        if (!out) {
            rc = -1;
            break;
        }
#pragma omp parallel for schedule(static)
        for (long i = 0; i < (long)nr; i++)
            q3_bf16p_pack_row(src + (size_t)i * cols, cols, out + (size_t)i * out_row, side, first[i]);
        raw += n;
        pr->done += nr * cols * 2;
        progress_show(pr, 0);
    }
    if (rc == 0 && raw != planned) rc = q3_err("tensor %s changed while it was converted", s->tensors[ti].name);
    if (rc == 0 && raw) rc = w_pad_to(w, o->scales_offset);
    if (rc == 0) rc = w_put(w, side, o->scales_size);
    free(first);
    free(cnt);
    free(side);
    return rc;
}

/* ---- the writer ---- */

static int check_target(const char *dst, int force) {
    if (q3_check_output(dst, force)) return q3_err_prefix("-o");
    return 0;
}

/* Everything decided before the first byte is written: the output dtype and
 * offsets of every tensor and section, and the header + table. */
typedef struct {
    q3m_section_out secs[3];
    int n_secs;
    q3m_tensor_out *outs;
    int n_quantized;
    uint64_t bytes_in, file_size;
    unsigned char *head;
    size_t head_len;
} layout;

static void layout_free(layout *l) {
    free(l->outs);
    free(l->head);
}

static int plan_layout(const q3_tensor_source *src, q3_quant_scheme scheme, layout *l, int count) {
    memset(l, 0, sizeof *l);
    if (scheme.ffn == Q3_F32 || scheme.ffn == Q3_F16 || scheme.attn == Q3_F32 || scheme.attn == Q3_F16)
        return q3_err("a scheme's weight types are MXFP4, MXFP8, MXINT8, BF16P or BF16 (as stored)");
    l->secs[l->n_secs++] = (q3m_section_out){Q3M_SEC_CONFIG, src->config, src->config_len, 0};
    if (src->tokenizer)
        l->secs[l->n_secs++] = (q3m_section_out){Q3M_SEC_TOKENIZER, src->tokenizer, src->tokenizer_len, 0};
    if (src->tokenizer_config)
        l->secs[l->n_secs++] =
            (q3m_section_out){Q3M_SEC_TOKENIZER_CONFIG, src->tokenizer_config, src->tokenizer_config_len, 0};
    l->outs = q3_calloc((size_t)src->n_tensors + 1, sizeof *l->outs);
    int has_head = 0;
    for (int i = 0; i < src->n_tensors; i++) {
        const q3_src_tensor *t = &src->tensors[i];
        q3m_tensor_out *u = &l->outs[i];
        u->name = t->name;
        u->ndim = t->ndim;
        memcpy(u->shape, t->shape, sizeof u->shape);
        q3_dtype target = q3_convert_target(t->name, &scheme);
        u->dtype = converts(target) ? target : t->dtype;
        const char *flag = !strcmp(t->name, "lm_head.weight")                       ? "head"
                           : target == scheme.attn && strstr(t->name, ".self_attn.") ? "attn"
                                                                                      : "ffn";
        const int block = target == Q3_BF16P ? Q3_BF16P_GROUP : Q3_MX_BLOCK;
        if (converts(target) && t->shape[t->ndim - 1] % block)
            return q3_err("tensor %s: its input dimension (%lld) is not a multiple of %d, so it cannot be %s to %s "
                          "(use --%s bf16 to keep it as stored)",
                          t->name, (long long)t->shape[t->ndim - 1], block, target == Q3_BF16P ? "packed" : "quantized",
                          q3_dtype_name(target), flag);
        if (target == Q3_BF16P && t->dtype != Q3_BF16)
            return q3_err("tensor %s is stored as %s; bf16p packs BF16 weights without changing them, so it takes only "
                          "BF16 (use --%s bf16 to keep it as stored)",
                          t->name, q3_dtype_name(t->dtype), flag);
        if (target == Q3_BF16P && count && count_raw_groups(src, i, &u->scales_size)) return -1;
        if (converts(target)) l->n_quantized++;
        if (!strcmp(t->name, "lm_head.weight")) has_head = 1;
        l->bytes_in += nbytes_of(t);
    }
    /* A tied lm_head is the embedding table, which must stay readable row by row. (The bf16p
     * scheme packs every weight it can, losslessly: on a tied model the table stays as stored,
     * with the same values; a --head asked for alone is refused.) */
    const int all_bf16p = scheme.head == Q3_BF16P && scheme.ffn == Q3_BF16P && scheme.attn == Q3_BF16P;
    if (converts(scheme.head) && !has_head && !all_bf16p)
        return q3_err("--head %s: this model has no separate lm_head.weight (tie_word_embeddings: lm_head is the embedding "
                      "table, which stays as stored)",
                      q3_dtype_name(scheme.head));
    return q3m_layout(l->secs, l->n_secs, l->outs, src->n_tensors, scheme, &l->head, &l->head_len, &l->file_size);
}

int q3_pack_size(const q3_tensor_source *src, q3_quant_scheme scheme, uint64_t *file_size) {
    layout l;
    int rc = plan_layout(src, scheme, &l, 0);
    *file_size = l.file_size;
    layout_free(&l);
    return rc;
}

int q3_pack(const q3_tensor_source *src, const q3_pack_opts *o, q3_convert_stats *st) {
    memset(st, 0, sizeof *st);
    const double t0 = now_s();
    const char *tag = o->tag ? o->tag : "convert";
    if (check_target(o->dst, o->force)) return -1;
    layout l;
    int rc = plan_layout(src, o->scheme, &l, 1);

    char *dir = q3_path_dir(o->dst);
    struct statvfs vfs;
    if (rc == 0 && statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < l.file_size)
        rc = q3_err("not enough space in %s: the .q3m needs %.2f GB, %.2f GB are free", dir, l.file_size / 1e9,
                    (double)vfs.f_bavail * vfs.f_frsize / 1e9);

    char *tmp = q3_malloc(strlen(o->dst) + 16);
    sprintf(tmp, "%s.tmp.XXXXXX", o->dst);
    writer w = {.fd = -1, .path = tmp};
    if (rc == 0) {
        w.fd = mkstemp(tmp);
        if (w.fd < 0) rc = q3_err("cannot create a temporary file next to %s: %s", o->dst, strerror(errno));
    }
    void *scratch = NULL;
    if (w.fd >= 0) {
        guard_tmp(tmp);
        mode_t um = umask(0);
        umask(um);
        fchmod(w.fd, 0666 & ~um);
        w.buf = q3_malloc(WBUF_SIZE);
        scratch = q3_malloc(SCRATCH_SIZE);
    }
    progress pr = {.quiet = o->quiet, .tty = isatty(2), .tag = tag, .total = l.bytes_in,
                   .last_shown = isatty(2) ? -1 : 0, .t0 = t0};
    if (rc == 0) rc = w_put(&w, l.head, l.head_len);
    for (int i = 0; rc == 0 && i < l.n_secs; i++)
        if ((rc = w_pad_to(&w, l.secs[i].offset)) == 0) rc = w_put(&w, l.secs[i].bytes, l.secs[i].size);
    for (int i = 0; rc == 0 && i < src->n_tensors; i++) {
        rc = w_pad_to(&w, l.outs[i].data_offset);
        if (rc == 0)
            rc = l.outs[i].dtype == Q3_BF16P                ? write_bf16p(&w, src, i, &l.outs[i], scratch, &pr)
                 : l.outs[i].dtype != src->tensors[i].dtype ? write_quantized(&w, src, i, &l.outs[i], scratch, &pr)
                                                            : write_copy(&w, src, i, scratch, &pr);
        if (src->release) src->release(src->ctx, i);
    }
    if (rc == 0 && (rc = w_flush(&w)) == 0 && w.pos != l.file_size)
        rc = q3_err("internal error: wrote %llu bytes, planned %llu", (unsigned long long)w.pos,
                    (unsigned long long)l.file_size);
    if (rc == 0 && fsync(w.fd) != 0) rc = q3_err("cannot flush %s to disk: %s", tmp, strerror(errno));
    if (w.fd >= 0 && close(w.fd) != 0 && rc == 0) rc = q3_err("error closing %s: %s", tmp, strerror(errno));
    if (rc == 0) {
        /* Read back what was written: header, table, sections, offsets. */
        q3m_file chk;
        if (q3m_open(&chk, tmp)) rc = q3_err_prefix("the file just written does not validate");
        else q3m_close(&chk);
    }
    if (rc == 0 && check_target(o->dst, o->force)) rc = -1; /* appeared meanwhile */
    if (rc == 0 && rename(tmp, o->dst) != 0) rc = q3_err("cannot rename %s to %s: %s", tmp, o->dst, strerror(errno));
    if (rc == 0) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    if (w.fd >= 0) {
        if (rc) unlink(tmp);
        unguard_tmp();
    }
    if (rc && pr.tty && !pr.quiet && pr.last_shown >= 0) fputc('\n', stderr); /* end the progress bar's line */
    if (rc == 0) {
        pr.done = pr.total;
        progress_show(&pr, 1);
        st->n_tensors = src->n_tensors;
        st->n_quantized = l.n_quantized;
        st->bytes_in = l.bytes_in;
        st->bytes_out = l.file_size;
        st->seconds = now_s() - t0;
        if (!o->quiet) {
            char sd[96];
            fprintf(stderr, "[%s] wrote %s: %d tensors (%d quantized; %s), %.3f GB in, %.3f GB out, %.1f s\n", tag, o->dst,
                    st->n_tensors, st->n_quantized, q3_scheme_describe(&o->scheme, sd, sizeof sd), l.bytes_in / 1e9,
                    l.file_size / 1e9, st->seconds);
        }
    }
    free(scratch);
    free(w.buf);
    free(tmp);
    free(dir);
    layout_free(&l);
    return rc;
}

/* ---- a checkpoint directory as a source ---- */

/* The tensors point into the mmapped safetensors: no copy. */
static const void *st_read(void *ctx, int i, uint64_t first, size_t n, void *scratch) {
    (void)n;
    (void)scratch;
    const q3_st_tensor *t = &((const q3_st_archive *)ctx)->tensors[i];
    return (const unsigned char *)t->data + first * q3_dtype_size(t->dtype);
}

static const char *st_origin(void *ctx, int i) {
    const q3_st_archive *a = ctx;
    return a->files[a->tensors[i].file].path;
}

/* Let the pages of a source tensor go once converted: the resident set then
 * stays at about one tensor, whatever the model size. */
static void st_release(void *ctx, int i) {
    const q3_st_tensor *t = &((const q3_st_archive *)ctx)->tensors[i];
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)t->data + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t e = ((uintptr_t)t->data + t->nbytes) & ~((uintptr_t)pg - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

typedef struct {
    char *bytes;
    size_t len;
} blob_file;

/* Read DIR/name if it exists (empty blob otherwise); -1 on a read error. */
static int read_optional(const char *dir, const char *name, blob_file *b) {
    char *p = q3_path_join(dir, name);
    b->bytes = NULL;
    b->len = 0;
    int rc = 0;
    if (q3_file_exists(p) && !(b->bytes = q3_read_file(p, &b->len))) rc = -1;
    free(p);
    return rc;
}

/* Whether dst names a file of the checkpoint at src (a shard or one of
 * the JSON files convert reads): --force must not let the output replace
 * its own input. */
static int is_source_file(const q3_st_archive *a, const char *src, const char *dst) {
    struct stat d;
    if (stat(dst, &d) != 0) return 0;
    for (int i = 0; i < a->n_files; i++)
        if (a->files[i].dev == (unsigned long long)d.st_dev && a->files[i].ino == (unsigned long long)d.st_ino) return 1;
    static const char *const names[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"};
    int hit = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names && !hit; i++) {
        char *p = q3_path_join(src, names[i]);
        struct stat f;
        hit = stat(p, &f) == 0 && f.st_dev == d.st_dev && f.st_ino == d.st_ino;
        free(p);
    }
    return hit;
}

int q3_convert(const q3_convert_opts *o, q3_convert_stats *st) {
    memset(st, 0, sizeof *st);
    if (!q3_is_dir(o->src)) {
        if (q3_file_exists(o->src) && q3m_is_q3m(o->src))
            return q3_err("%s is already a converted .q3m file; convert reads a Hugging Face checkpoint directory", o->src);
        return q3_err("%s is not a checkpoint directory", o->src);
    }
    if (check_target(o->dst, o->force)) return -1;

    /* Loading validates config.json and every tensor's presence and shape. */
    q3_model m;
    /* Conversion streams tensor by tensor: mapping the whole source up front
     * would only inflate the resident set. */
    int prefault_was = q3_prefault_set(0);
    int load_rc = q3_model_load(&m, o->src);
    q3_prefault_set(prefault_was);
    if (load_rc) return -1;
    q3_st_archive *a = &m.st;
    if (is_source_file(a, o->src, o->dst)) {
        q3_model_free(&m);
        return q3_err("-o %s is a file of the checkpoint %s being converted; write the .q3m elsewhere", o->dst, o->src);
    }

    blob_file cfg = {0}, tok = {0}, tokc = {0};
    int rc = read_optional(o->src, "config.json", &cfg);
    if (rc == 0) rc = read_optional(o->src, "tokenizer.json", &tok);
    if (rc == 0) rc = read_optional(o->src, "tokenizer_config.json", &tokc);
    q3_src_tensor *ts = q3_calloc((size_t)a->n_tensors + 1, sizeof *ts);
    for (int i = 0; i < a->n_tensors; i++) {
        const q3_st_tensor *t = &a->tensors[i];
        ts[i] = (q3_src_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(ts[i].shape, t->shape, sizeof ts[i].shape);
    }
    q3_tensor_source src = {
        .tensors = ts, .n_tensors = a->n_tensors, .read = st_read, .release = st_release, .origin = st_origin, .ctx = a,
        .config = cfg.bytes, .config_len = cfg.len, .tokenizer = tok.bytes, .tokenizer_len = tok.len,
        .tokenizer_config = tokc.bytes, .tokenizer_config_len = tokc.len,
    };
    q3_pack_opts po = {.dst = o->dst, .scheme = o->scheme, .force = o->force, .quiet = o->quiet, .tag = "convert"};
    if (rc == 0) rc = q3_pack(&src, &po, st);
    free(ts);
    free(cfg.bytes);
    free(tok.bytes);
    free(tokc.bytes);
    q3_model_free(&m);
    return rc;
}
