/* The compile cache (see cache.h). */
#include "quant/cache.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/q3m.h"
#include "quant/convert.h"
#include "util/error.h"
#include "util/file.h"

static char *cache_root(void) {
    const char *e = getenv("Q3MOE_CACHE_DIR");
    if (e && *e) return q3_strdup(e);
    e = getenv("XDG_CACHE_HOME");
    if (e && *e == '/') return q3_path_join(e, "q3moe");
    e = getenv("HOME");
    if (!e || !*e) {
        q3_err("no cache directory: set Q3MOE_CACHE_DIR (or HOME / XDG_CACHE_HOME)");
        return NULL;
    }
    char *c = q3_path_join(e, ".cache");
    char *r = q3_path_join(c, "q3moe");
    free(c);
    return r;
}

char *q3_cache_dir(void) {
    char *d = cache_root();
    if (d && q3_mkdir_p(d)) {
        q3_err_prefix("%s", "the cache directory");
        free(d);
        return NULL;
    }
    return d;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_identity_file(const char *n) {
    return !strcmp(n, "config.json") || !strcmp(n, "model.safetensors.index.json") || !strcmp(n, "tokenizer.json") ||
           !strcmp(n, "tokenizer_config.json") || ends_with(n, ".safetensors");
}

/* FNV-1a 64 of the checkpoint identity (see cache.h). */
static int identity_hash(const char *abs, const char *quant, uint64_t *out) {
    DIR *d = opendir(abs);
    if (!d) return q3_err("cannot list %s: %s", abs, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (is_identity_file(e->d_name)) {
            names = q3_realloc(names, (n + 1) * sizeof *names);
            names[n++] = q3_strdup(e->d_name);
        }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, str_cmp); /* qsort(NULL, 0) is undefined */
    uint64_t h = q3m_fnv1a(Q3M_FNV_BASIS, abs, strlen(abs) + 1);
    int rc = 0, have_config = 0;
    for (size_t i = 0; i < n; i++) {
        char *p = q3_path_join(abs, names[i]);
        struct stat st;
        if (stat(p, &st) != 0) rc = q3_err("cannot stat %s: %s", p, strerror(errno));
        else if (S_ISREG(st.st_mode)) {
            char buf[96];
            int len = snprintf(buf, sizeof buf, "|%lld|%lld.%09ld|", (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                               (long)st.st_mtim.tv_nsec);
            h = q3m_fnv1a(h, names[i], strlen(names[i]) + 1);
            h = q3m_fnv1a(h, buf, (size_t)len);
            have_config |= !strcmp(names[i], "config.json");
        }
        free(p);
        free(names[i]);
        if (rc) {
            for (size_t j = i + 1; j < n; j++) free(names[j]);
            break;
        }
    }
    free(names);
    if (rc) return rc;
    if (!have_config) return q3_err("%s has no config.json: not a Hugging Face checkpoint directory", abs);
    char tail[64];
    int len = snprintf(tail, sizeof tail, "scheme=%s|q3m=%u", quant, Q3M_VERSION);
    *out = q3m_fnv1a(h, tail, (size_t)len);
    return 0;
}

/* NAME-SCHEME-SLOT- prefix and the full file name. */
static void names_for(const char *abs, const char *quant, uint64_t key, char *prefix, size_t pcap, char *file, size_t fcap) {
    const char *base = strrchr(abs, '/');
    base = base && base[1] ? base + 1 : abs;
    char nm[65];
    size_t k = 0;
    for (; k < 64 && base[k]; k++) {
        char c = base[k];
        nm[k] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ? c : '_';
    }
    nm[k] = 0;
    if (k == 0 || nm[0] == '.') nm[0] = '_';
    uint64_t slot = q3m_fnv1a(q3m_fnv1a(Q3M_FNV_BASIS, abs, strlen(abs) + 1), quant, strlen(quant));
    snprintf(prefix, pcap, "%s-%s-%08x-", nm, quant, (unsigned)(slot ^ (slot >> 32)));
    snprintf(file, fcap, "%s%016llx.q3m", prefix, (unsigned long long)key);
}

static char *cache_path_in(const char *cdir, const char *dir, const char *quant, char *prefix, size_t pcap) {
    q3_quant_scheme s;
    if (q3_scheme_from_name(quant, &s)) {
        q3_err("--quant: '%s' is not one of %s", quant, Q3_SCHEME_NAMES);
        return NULL;
    }
    if (!q3_is_dir(dir)) {
        if (q3_file_exists(dir) && q3m_is_q3m(dir))
            q3_err("--quant converts a checkpoint directory, but %s is already a .q3m file (drop --quant)", dir);
        else q3_err("--quant needs -m to be a Hugging Face checkpoint directory; %s is not a directory", dir);
        return NULL;
    }
    char abs[PATH_MAX];
    if (!realpath(dir, abs)) {
        q3_err("cannot resolve %s: %s", dir, strerror(errno));
        return NULL;
    }
    uint64_t key = 0;
    if (identity_hash(abs, quant, &key)) return NULL;
    char file[256];
    names_for(abs, quant, key, prefix, pcap, file, sizeof file);
    return q3_path_join(cdir, file);
}

char *q3_cache_path(const char *dir, const char *quant) {
    char *cdir = cache_root();
    if (!cdir) return NULL;
    char prefix[160];
    char *p = cache_path_in(cdir, dir, quant, prefix, sizeof prefix);
    free(cdir);
    return p;
}

/* Delete the other cached files of the same checkpoint and scheme (older
 * identities): they can never be used again. Best effort. */
static void remove_stale(const char *cdir, const char *prefix, const char *keep) {
    DIR *d = opendir(cdir);
    if (!d) return;
    struct dirent *e;
    size_t pl = strlen(prefix);
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, prefix, pl) || !ends_with(n, ".q3m") || strlen(n) != pl + 16 + 4) continue;
        char *p = q3_path_join(cdir, n);
        if (strcmp(p, keep) && unlink(p) == 0) fprintf(stderr, "[q3moe] removed stale cache file %s\n", p);
        free(p);
    }
    closedir(d);
}

int q3_resolve_model(const char *m, const char *quant, char **path_out) {
    *path_out = NULL;
    if (!quant) {
        *path_out = q3_strdup(m);
        return 0;
    }
    q3_quant_scheme s;
    if (q3_scheme_from_name(quant, &s)) return q3_err("--quant: '%s' is not one of %s", quant, Q3_SCHEME_NAMES);
    char *cdir = q3_cache_dir();
    if (!cdir) return -1;
    char prefix[160];
    char *path = cache_path_in(cdir, m, quant, prefix, sizeof prefix);
    if (!path) {
        free(cdir);
        return -1;
    }
    if (q3_file_exists(path)) {
        q3m_file f;
        if (q3m_open(&f, path) == 0) {
            q3m_close(&f);
            fprintf(stderr, "[q3moe] using cached %s (%s, --quant %s)\n", path, m, quant);
            free(cdir);
            *path_out = path;
            return 0;
        }
        fprintf(stderr, "[q3moe] the cached file does not load (%s); converting again\n", q3_errmsg());
    }
    fprintf(stderr, "[q3moe] converting %s to %s (first use): %s\n", m, quant, path);
    q3_convert_opts o = {.src = m, .dst = path, .scheme = s, .force = 1};
    q3_convert_stats st;
    int rc = q3_convert(&o, &st);
    if (rc == 0) remove_stale(cdir, prefix, path);
    free(cdir);
    if (rc) {
        q3_err_prefix("converting %s for --quant %s", m, quant);
        free(path);
        return -1;
    }
    *path_out = path;
    return 0;
}
