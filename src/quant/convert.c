/* Checkpoint -> .q3m conversion (see convert.h). */
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
#include "quant/mx.h"
#include "util/error.h"
#include "util/file.h"

/* ---- schemes ---- */

int q3_scheme_parse_dtype(const char *s, q3_dtype *out) {
    if (!strcmp(s, "mxfp4")) *out = Q3_MXFP4;
    else if (!strcmp(s, "mxfp8")) *out = Q3_MXFP8;
    else if (!strcmp(s, "bf16")) *out = Q3_BF16;
    else return -1;
    return 0;
}

int q3_scheme_from_name(const char *name, q3_quant_scheme *out) {
    static const struct {
        const char *name;
        q3_quant_scheme s;
    } tab[] = {
        {"w4a8", {Q3_MXFP4, Q3_MXFP8, 1}}, {"w8a8", {Q3_MXFP8, Q3_MXFP8, 1}}, {"w4", {Q3_MXFP4, Q3_MXFP4, 0}},
        {"w8", {Q3_MXFP8, Q3_MXFP8, 0}},   {"bf16", {Q3_BF16, Q3_BF16, 0}},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(name, tab[i].name)) {
            *out = tab[i].s;
            return 0;
        }
    return -1;
}

static const char *scheme_dtype_name(q3_dtype t) { return t == Q3_BF16 ? "as stored" : q3_dtype_name(t); }

const char *q3_scheme_describe(const q3_quant_scheme *s, char *buf, unsigned cap) {
    snprintf(buf, cap, "ffn %s, attn %s, act %s", scheme_dtype_name(s->ffn), scheme_dtype_name(s->attn),
             s->act_mxfp8 ? "MXFP8" : "fp32");
    return buf;
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
        fprintf(stderr, "\r[convert] [%s] %5.1f%%  %.2f / %.2f GB  %.0f s", bar, 100 * frac, p->done / 1e9, p->total / 1e9, el);
        if (final) fputc('\n', stderr);
    } else {
        /* A line per 10%, from the first second on (a small model just gets the summary). */
        int tenth = (int)(frac * 10);
        if (final || el < 1.0 || tenth <= p->last_shown || tenth == 10) return;
        p->last_shown = tenth;
        fprintf(stderr, "[convert] %3d%%  %.2f / %.2f GB  %.0f s\n", tenth * 10, p->done / 1e9, p->total / 1e9, el);
    }
    fflush(stderr);
}

/* ---- tensors ---- */

static uint64_t numel_of(const q3_st_tensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

/* Let the pages of a source tensor go once converted: the resident set then
 * stays at about one tensor, whatever the model size. */
static void drop_source(const q3_st_tensor *t) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)t->data + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t e = ((uintptr_t)t->data + t->nbytes) & ~((uintptr_t)pg - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

/* Quantize one tensor row by row into the writer: elements now, scales
 * (kept for the whole tensor: 1/32 of the elements) after them. */
static int write_quantized(writer *w, const q3_st_tensor *t, const q3m_tensor_out *o, progress *pr) {
    const size_t cols = (size_t)t->shape[t->ndim - 1], rows = (size_t)(numel_of(t) / cols);
    const size_t row_el = q3_mx_elem_bytes(o->dtype, cols), row_sc = cols / Q3_MX_BLOCK;
    const size_t in_row = cols * q3_dtype_size(t->dtype);
    uint8_t *scales = q3_malloc(rows * row_sc);
    size_t chunk = WBUF_SIZE / row_el;
    if (chunk < 1) chunk = 1;
    if (row_el > WBUF_SIZE) {
        free(scales);
        return q3_err("tensor %s: rows of %zu columns are too long to convert", t->name, cols);
    }
    int rc = 0;
    for (size_t r0 = 0; rc == 0 && r0 < rows; r0 += chunk) {
        size_t nr = rows - r0 < chunk ? rows - r0 : chunk;
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
                size_t r = r0 + (size_t)i;
                q3_to_f32(x, t->data, t->dtype, r * cols, cols);
                int finite = 1;
                for (size_t k = 0; k < cols; k++) finite &= isfinite(x[k]) != 0;
                if (!finite) {
#pragma omp critical(q3_convert_bad)
                    if (bad < 0 || i < bad) bad = i;
                    continue;
                }
                /* Cannot fail: the row is finite and cols % 32 == 0. */
                q3_mx_quantize_row(o->dtype, x, cols, scales + r * row_sc, out + (size_t)i * row_el);
            }
            free(x);
        }
        if (bad >= 0) {
            size_t r = r0 + (size_t)bad;
            float *x = q3_malloc(cols * sizeof(float));
            q3_to_f32(x, t->data, t->dtype, r * cols, cols);
            size_t k = 0;
            while (k < cols && isfinite(x[k])) k++;
            rc = q3_err("tensor %s: element [%zu, %zu] is %s; a weight must be finite to be quantized", t->name, r, k,
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

static int write_copy(writer *w, const q3_st_tensor *t, progress *pr) {
    const unsigned char *p = t->data;
    for (uint64_t off = 0; off < t->nbytes;) {
        uint64_t k = t->nbytes - off < WBUF_SIZE ? t->nbytes - off : WBUF_SIZE;
        if (w_put(w, p + off, k)) return -1;
        off += k;
        pr->done += k;
        progress_show(pr, 0);
    }
    return 0;
}

/* ---- the conversion ---- */

static char *dir_of(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) return q3_strdup(".");
    if (sl == path) return q3_strdup("/");
    char *d = q3_malloc((size_t)(sl - path) + 1);
    memcpy(d, path, (size_t)(sl - path));
    d[sl - path] = 0;
    return d;
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

static int check_target(const char *dst, int force) {
    struct stat st;
    if (stat(dst, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return q3_err("-o %s is a directory; give the path of the .q3m file to write", dst);
        if (!force) return q3_err("%s exists; pass --force to overwrite it", dst);
    }
    return 0;
}

int q3_convert(const q3_convert_opts *o, q3_convert_stats *st) {
    memset(st, 0, sizeof *st);
    const double t0 = now_s();
    if (!q3_is_dir(o->src)) {
        if (q3_file_exists(o->src) && q3m_is_q3m(o->src))
            return q3_err("%s is already a converted .q3m file; convert reads a Hugging Face checkpoint directory", o->src);
        return q3_err("%s is not a checkpoint directory", o->src);
    }
    if (check_target(o->dst, o->force)) return -1;
    if (o->scheme.ffn == Q3_F32 || o->scheme.ffn == Q3_F16 || o->scheme.attn == Q3_F32 || o->scheme.attn == Q3_F16)
        return q3_err("a scheme's weight types are MXFP4, MXFP8 or BF16 (as stored)");

    /* Loading validates config.json and every tensor's presence and shape. */
    q3_model m;
    /* Conversion streams tensor by tensor: mapping the whole source up front
     * would only inflate the resident set. */
    int prefault_was = q3_prefault_set(0);
    int load_rc = q3_model_load(&m, o->src);
    q3_prefault_set(prefault_was);
    if (load_rc) return -1;
    const q3_st_archive *a = &m.st;

    blob_file cfg = {0}, tok = {0}, tokc = {0};
    int rc = read_optional(o->src, "config.json", &cfg);
    if (rc == 0) rc = read_optional(o->src, "tokenizer.json", &tok);
    if (rc == 0) rc = read_optional(o->src, "tokenizer_config.json", &tokc);
    q3m_section_out secs[3];
    int n_secs = 0;
    if (rc == 0) {
        secs[n_secs++] = (q3m_section_out){Q3M_SEC_CONFIG, cfg.bytes, cfg.len, 0};
        if (tok.bytes) secs[n_secs++] = (q3m_section_out){Q3M_SEC_TOKENIZER, tok.bytes, tok.len, 0};
        if (tokc.bytes) secs[n_secs++] = (q3m_section_out){Q3M_SEC_TOKENIZER_CONFIG, tokc.bytes, tokc.len, 0};
    }

    q3m_tensor_out *outs = q3_calloc((size_t)a->n_tensors + 1, sizeof *outs);
    uint64_t total_in = 0;
    for (int i = 0; rc == 0 && i < a->n_tensors; i++) {
        const q3_st_tensor *t = &a->tensors[i];
        q3m_tensor_out *u = &outs[i];
        u->name = t->name;
        u->ndim = t->ndim;
        memcpy(u->shape, t->shape, sizeof u->shape);
        q3_dtype target = q3_convert_target(t->name, &o->scheme);
        u->dtype = q3_dtype_is_mx(target) ? target : t->dtype;
        if (q3_dtype_is_mx(target) && t->shape[t->ndim - 1] % Q3_MX_BLOCK)
            rc = q3_err("tensor %s: its input dimension (%lld) is not a multiple of %d, so it cannot be quantized to %s "
                        "(use --%s bf16 to keep it as stored)",
                        t->name, (long long)t->shape[t->ndim - 1], Q3_MX_BLOCK, q3_dtype_name(target),
                        target == o->scheme.attn && strstr(t->name, ".self_attn.") ? "attn" : "ffn");
        if (q3_dtype_is_mx(target)) st->n_quantized++;
        total_in += t->nbytes;
    }
    unsigned char *head = NULL;
    size_t head_len = 0;
    uint64_t file_size = 0;
    if (rc == 0) rc = q3m_layout(secs, n_secs, outs, a->n_tensors, o->scheme, &head, &head_len, &file_size);

    char *dir = dir_of(o->dst);
    struct statvfs vfs;
    if (rc == 0 && statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < file_size)
        rc = q3_err("not enough space in %s: the .q3m needs %.2f GB, %.2f GB are free", dir, file_size / 1e9,
                    (double)vfs.f_bavail * vfs.f_frsize / 1e9);

    char *tmp = q3_malloc(strlen(o->dst) + 16);
    sprintf(tmp, "%s.tmp.XXXXXX", o->dst);
    writer w = {.fd = -1, .path = tmp};
    if (rc == 0) {
        w.fd = mkstemp(tmp);
        if (w.fd < 0) rc = q3_err("cannot create a temporary file next to %s: %s", o->dst, strerror(errno));
    }
    if (w.fd >= 0) {
        guard_tmp(tmp);
        mode_t um = umask(0);
        umask(um);
        fchmod(w.fd, 0666 & ~um);
        w.buf = q3_malloc(WBUF_SIZE);
    }
    progress pr = {.quiet = o->quiet, .tty = isatty(2), .total = total_in, .last_shown = isatty(2) ? -1 : 0, .t0 = t0};
    if (rc == 0) rc = w_put(&w, head, head_len);
    for (int i = 0; rc == 0 && i < n_secs; i++)
        if ((rc = w_pad_to(&w, secs[i].offset)) == 0) rc = w_put(&w, secs[i].bytes, secs[i].size);
    for (int i = 0; rc == 0 && i < a->n_tensors; i++) {
        const q3_st_tensor *t = &a->tensors[i];
        rc = w_pad_to(&w, outs[i].data_offset);
        if (rc == 0) rc = q3_dtype_is_mx(outs[i].dtype) && outs[i].dtype != t->dtype ? write_quantized(&w, t, &outs[i], &pr)
                                                                                  : write_copy(&w, t, &pr);
        drop_source(t);
    }
    if (rc == 0 && (rc = w_flush(&w)) == 0 && w.pos != file_size)
        rc = q3_err("internal error: wrote %llu bytes, planned %llu", (unsigned long long)w.pos, (unsigned long long)file_size);
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
        st->n_tensors = a->n_tensors;
        st->bytes_in = total_in;
        st->bytes_out = file_size;
        st->seconds = now_s() - t0;
        if (!o->quiet) {
            char sd[96];
            fprintf(stderr, "[convert] wrote %s: %d tensors (%d quantized; %s), %.3f GB in, %.3f GB out, %.1f s\n", o->dst,
                    st->n_tensors, st->n_quantized, q3_scheme_describe(&o->scheme, sd, sizeof sd), total_in / 1e9,
                    file_size / 1e9, st->seconds);
        }
    }
    free(w.buf);
    free(tmp);
    free(dir);
    free(head);
    free(outs);
    free(cfg.bytes);
    free(tok.bytes);
    free(tokc.bytes);
    q3_model_free(&m);
    return rc;
}
