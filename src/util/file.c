#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdint.h>

#include "util/error.h"

static int g_mlock = 0, g_hugepages = 0;

void q3_mlock_set(int on) { g_mlock = on; }
void q3_hugepages_set(int on) { g_hugepages = on; }
int q3_hugepages_get(void) { return g_hugepages; }

enum { HUGE_PAGE = 2 << 20 };

/* The number a line of a /proc file gives in kB (fmt: "Key: %zu kB"), or 0. */
static size_t proc_kb(const char *path, const char *fmt) {
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, fmt, &kb) == 1) break;
    fclose(fp);
    return kb;
}

/* The file's bytes in a 2 MiB-aligned anonymous mapping advised for huge
 * pages, read-only once filled. */
static int copy_to_huge_pages(q3_mapped_file *f, int fd, const char *path) {
    const size_t avail = q3_mem_available();
    if (avail && f->size > avail)
        return q3_err("--hugepages: %s (%.2f GB) does not fit in the available memory (%.2f GB); run without --hugepages "
                      "to map it instead",
                      path, f->size / 1e9, avail / 1e9);
    const size_t len = (f->size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    unsigned char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return q3_err("--hugepages: cannot allocate %.2f GB for %s: %s", len / 1e9, path, strerror(errno));
    /* Keep only the aligned part, so that every 2 MiB of it can be one page. */
    unsigned char *p = raw + (HUGE_PAGE - (uintptr_t)raw % HUGE_PAGE) % HUGE_PAGE;
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (p + len < raw + len + HUGE_PAGE) munmap(p + len, (size_t)(raw + len + HUGE_PAGE - (p + len)));
    (void)madvise(p, len, MADV_HUGEPAGE); /* best effort: without THP it is still a copy */
    for (size_t off = 0; off < f->size;) {
        const size_t want = f->size - off < ((size_t)1 << 30) ? f->size - off : ((size_t)1 << 30);
        const ssize_t got = pread(fd, p + off, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            const int e = got < 0 ? errno : 0;
            munmap(p, len);
            return q3_err("--hugepages: cannot read %s at byte %zu: %s", path, off, e ? strerror(e) : "unexpected end of file");
        }
        off += (size_t)got;
    }
    if (mprotect(p, len, PROT_READ) != 0) {
        const int e = errno;
        munmap(p, len);
        return q3_err("--hugepages: cannot make the copy of %s read-only: %s", path, strerror(e));
    }
    f->data = p;
    f->anon_len = len;
    return 0;
}

size_t q3_anon_huge_bytes(void) { return proc_kb("/proc/self/smaps_rollup", "AnonHugePages: %zu kB") * 1024; }
size_t q3_file_pmd_bytes(void) { return proc_kb("/proc/self/smaps_rollup", "FilePmdMapped: %zu kB") * 1024; }

/* Bytes to munmap: an anonymous copy is rounded up to whole huge pages. */
static size_t mapped_len(const q3_mapped_file *f) { return f->anon_len ? f->anon_len : f->size; }

int q3_map_file(q3_mapped_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return q3_err("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return q3_err("cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return q3_err("%s is not a regular file", path);
    }
    f->size = (size_t)st.st_size;
    f->dev = (unsigned long long)st.st_dev, f->ino = (unsigned long long)st.st_ino;
    if (f->size > 0 && g_hugepages) {
        if (copy_to_huge_pages(f, fd, path)) {
            close(fd);
            return -1;
        }
    } else if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return q3_err("cannot mmap %s: %s", path, strerror(e));
        }
        /* Where the filesystem keeps the file in large folios (ext4 and XFS on
         * recent kernels), this lets the kernel map them with 2 MiB entries:
         * fewer page walks at no start-up cost. Best effort. */
        (void)madvise(p, f->size, MADV_HUGEPAGE);
        f->data = p;
    }
    if (f->data && g_mlock && mlock(f->data, f->size) != 0) {
        int e = errno;
        munmap((void *)f->data, mapped_len(f));
        close(fd);
        memset(f, 0, sizeof *f);
        return q3_err("--mlock: cannot lock %s (%.2f GB) in memory: %s (raise the locked-memory limit, ulimit -l, "
                      "or run without --mlock)",
                      path, f->size / 1e9, strerror(e));
    }
    close(fd);
    f->path = q3_strdup(path);
    return 0;
}

void q3_unmap_file(q3_mapped_file *f) {
    if (f->data && f->size) munmap((void *)f->data, mapped_len(f));
    free(f->path);
    memset(f, 0, sizeof *f);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static int g_prefault_off = 0;

void q3_prefault_disable(void) { g_prefault_off = 1; }

int q3_prefault_set(int enabled) {
    int was = !g_prefault_off;
    g_prefault_off = !enabled;
    return was;
}

static void populate(const q3_mapped_file *f) {
    if (madvise((void *)f->data, f->size, MADV_POPULATE_READ) != 0) /* kernels before 5.14 */
        (void)madvise((void *)f->data, f->size, MADV_WILLNEED);
}

/* Files smaller than this are not worth a second read for their page size. */
enum { REREAD_MIN = 256 << 20 };

/* A file the page cache holds in small folios (pages that entered it
 * through write(): a fresh download, copy or synth) is mapped with 4 KiB
 * entries whatever MADV_HUGEPAGE says, and stays so as long as it is
 * cached. Read back after dropping them, through a mapping advised for huge
 * pages, it comes in 2 MiB folios. Measured on a VM without nested paging
 * (AMD EPYC, BENCHMARKS.md): q30b8 BF16 decode 99 -> 36 ms/token, prefill 4x.
 * Only where the kernel already holds some file in huge folios (else its
 * filesystem may not make them, and every start would pay the read); the
 * drop spares pages other processes map. The mapping is replaced in place
 * (MAP_FIXED), so f->data stays valid (not under --mlock: the lock would
 * go with it). */
static void reread_in_huge_folios(const q3_mapped_file *f) {
    if (f->size < REREAD_MIN || !proc_kb("/proc/meminfo", "FileHugePages: %zu kB")) return;
    const int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || (unsigned long long)st.st_dev != f->dev || (unsigned long long)st.st_ino != f->ino ||
        (size_t)st.st_size != f->size) { /* the path names another file now (replaced by a rename) */
        close(fd);
        return;
    }
    void *p = mmap((void *)f->data, f->size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) { /* the old mapping is still in place */
        close(fd);
        return;
    }
    /* Pages still dirty (a file written moments ago, a busy disk) are not
     * dropped, and would come back in their small folios. */
    (void)fdatasync(fd);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    (void)madvise(p, f->size, MADV_HUGEPAGE);
    close(fd);
    populate(f);
}

void q3_prefault(const q3_mapped_file *f) {
    if (g_prefault_off || !f->data || !f->size) return;
    const size_t pmd_before = q3_file_pmd_bytes();
    populate(f);
    if (!f->anon_len && !g_mlock && q3_file_pmd_bytes() < pmd_before + f->size / 2) reread_in_huge_folios(f);
}

size_t q3_mem_available(void) { return proc_kb("/proc/meminfo", "MemAvailable: %zu kB") * 1024; }

char *q3_read_file(const char *path, size_t *len_out) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        q3_err("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = q3_malloc(cap);
    int err = 0;
    for (;;) {
        if (len + 1 >= cap) buf = q3_realloc(buf, cap *= 2);
        errno = 0;
        size_t n = fread(buf + len, 1, cap - len - 1, fp);
        len += n;
        if (n == 0) {
            err = errno;
            break;
        }
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        q3_err("error reading %s: %s", path, strerror(err ? err : EIO));
        return NULL;
    }
    buf[len] = 0;
    if (len_out) *len_out = len;
    return buf;
}

int q3_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *q3_path_dir(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) return q3_strdup(".");
    if (sl == path) return q3_strdup("/");
    char *d = q3_malloc((size_t)(sl - path) + 1);
    memcpy(d, path, (size_t)(sl - path));
    d[sl - path] = 0;
    return d;
}

void q3_remove_partial(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) remove(path);
}

int q3_mkdir_p(const char *path) {
    if (!*path) return q3_err("the directory path is empty");
    char *p = q3_strdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) { /* from p + 1: a leading '/' is the root, not a parent to make */
        const int last = *s == 0;
        if (*s != '/' && !last) continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            rc = q3_err("cannot create %s: %s", p, strerror(errno));
            break;
        }
        if (last) break;
        *s = '/';
    }
    free(p);
    if (rc == 0 && !q3_is_dir(path)) rc = q3_err("%s exists and is not a directory", path);
    return rc;
}

int q3_check_output(const char *path, int force) {
    if (!*path) return q3_err("the output path is empty");
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return q3_err("%s is a directory; give the path of the file to write", path);
        if (!force) return q3_err("%s already exists (use --force to overwrite)", path);
    }
    char *dir = q3_path_dir(path);
    int rc = 0;
    if (stat(dir, &st) != 0) rc = q3_err("cannot create %s: %s: %s", path, dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode)) rc = q3_err("cannot create %s: %s is not a directory", path, dir);
    else if (access(dir, W_OK | X_OK) != 0) rc = q3_err("cannot create %s: %s: %s", path, dir, strerror(errno));
    free(dir);
    return rc;
}

int q3_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

char *q3_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = q3_malloc(a + b + 2);
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

char *q3_exe_dir(void) {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return NULL;
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash) return NULL;
    *slash = 0;
    return q3_strdup(buf);
}
