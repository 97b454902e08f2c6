#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

static int g_mlock = 0;

void q3_mlock_set(int on) { g_mlock = on; }

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
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return q3_err("cannot mmap %s: %s", path, strerror(e));
        }
        if (g_mlock && mlock(p, f->size) != 0) {
            int e = errno;
            munmap(p, f->size);
            close(fd);
            return q3_err("--mlock: cannot lock %s (%.2f GB) in memory: %s (raise the locked-memory limit, ulimit -l, "
                          "or run without --mlock)",
                          path, f->size / 1e9, strerror(e));
        }
        f->data = p;
    }
    close(fd);
    f->path = q3_strdup(path);
    return 0;
}

void q3_unmap_file(q3_mapped_file *f) {
    if (f->data && f->size) munmap((void *)f->data, f->size);
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

void q3_prefault(const q3_mapped_file *f) {
    if (g_prefault_off || !f->data || !f->size) return;
    if (madvise((void *)f->data, f->size, MADV_POPULATE_READ) != 0) /* kernels before 5.14 */
        (void)madvise((void *)f->data, f->size, MADV_WILLNEED);
}

size_t q3_mem_available(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(fp);
    return kb * 1024;
}

char *q3_read_file(const char *path, size_t *len_out) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        q3_err("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = q3_malloc(cap);
    for (;;) {
        if (len + 1 >= cap) buf = q3_realloc(buf, cap *= 2);
        size_t n = fread(buf + len, 1, cap - len - 1, fp);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        q3_err("error reading %s", path);
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
