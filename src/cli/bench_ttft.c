#include "cli/bench_ttft.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Pages of an open file that are in the page cache. */
static double resident_bytes(int fd, size_t size) {
    if (size == 0) return 0;
    void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return 0;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (size + page - 1) / page;
    unsigned char *vec = q3_malloc(n);
    double r = 0;
    if (mincore(p, size, vec) == 0)
        for (size_t i = 0; i < n; i++) r += (vec[i] & 1) ? (double)page : 0;
    free(vec);
    munmap(p, size);
    return r > (double)size ? (double)size : r;
}

int bench_evict_dir(const char *dir, int *n_files, double *bytes, double *resident_frac) {
    *n_files = 0;
    *bytes = 0;
    *resident_frac = 0;
    /* A .q3m model is one file: evict just that. */
    const int single = !q3_is_dir(dir) && q3_file_exists(dir);
    DIR *d = single ? NULL : opendir(dir);
    if (!d && !single) return q3_err("cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    double resident = 0;
    int rc = 0, done_single = 0;
    while (rc == 0 && (single ? !done_single++ : (e = readdir(d)) != NULL)) {
        const char *n = single ? dir : e->d_name;
        if (!single && !ends_with(n, ".safetensors") && !ends_with(n, ".json") && !ends_with(n, ".txt")) continue;
        char *path = single ? q3_strdup(dir) : q3_path_join(dir, n);
        struct stat st;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
            if (fd >= 0) close(fd);
            free(path);
            continue;
        }
        /* Dirty pages cannot be dropped: write them back first. */
        fdatasync(fd);
        int err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        if (err) rc = q3_err("posix_fadvise(DONTNEED) on %s: %s", path, strerror(err));
        else {
            (*n_files)++;
            *bytes += (double)st.st_size;
            resident += resident_bytes(fd, (size_t)st.st_size);
        }
        close(fd);
        free(path);
    }
    if (d) closedir(d);
    if (rc == 0 && *n_files == 0) rc = q3_err("no checkpoint files to evict in %s", dir);
    if (*bytes > 0) *resident_frac = resident / *bytes;
    return rc;
}

static char *self_exe(void) {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) {
        q3_err("cannot find the running executable (readlink /proc/self/exe: %s)", strerror(errno));
        return NULL;
    }
    buf[n] = 0;
    return q3_strdup(buf);
}

/* Last part of a file (the child's stderr), for error messages. */
static void tail_of(FILE *f, char *out, size_t cap) {
    out[0] = 0;
    long end;
    if (fseek(f, 0, SEEK_END) || (end = ftell(f)) <= 0) return;
    long from = end > (long)cap - 1 ? end - ((long)cap - 1) : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    while (n && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = 0;
}

static int run_child(char *const *argv, double *first_ms, double *exit_ms, long *rss_kb) {
    int pfd[2];
    FILE *errf = tmpfile();
    if (!errf) return q3_err("tmpfile: %s", strerror(errno));
    if (pipe(pfd)) {
        fclose(errf);
        return q3_err("pipe: %s", strerror(errno));
    }
    fflush(NULL);
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        fclose(errf);
        return q3_err("fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(fileno(errf), 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    char buf[4096];
    double first = -1;
    for (;;) {
        ssize_t n = read(pfd[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (first < 0)
            for (ssize_t i = 0; i < n; i++)
                if (buf[i] >= '0' && buf[i] <= '9') {
                    first = now_ms() - t0;
                    break;
                }
    }
    close(pfd[0]);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0)
        if (errno != EINTR) {
            fclose(errf);
            return q3_err("wait4: %s", strerror(errno));
        }
    *exit_ms = now_ms() - t0;
    *rss_kb = ru.ru_maxrss;
    int rc = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        char tail[600];
        tail_of(errf, tail, sizeof tail);
        if (WIFEXITED(status))
            rc = q3_err("the TTFT run (%s generate) failed with exit status %d%s%s", argv[0], WEXITSTATUS(status),
                        tail[0] ? ": " : "", tail);
        else
            rc = q3_err("the TTFT run (%s generate) was killed by signal %d", argv[0], WTERMSIG(status));
    } else if (first < 0) {
        rc = q3_err("the TTFT run (%s generate) printed no token id", argv[0]);
    }
    *first_ms = first;
    fclose(errf);
    return rc;
}

int bench_measure_ttft(const char *dir, const int32_t *ids, int n, int threads_arg, int ctx_arg, bench_ttft *out) {
    memset(out, 0, sizeof *out);
    out->prompt_tokens = n;
    char *exe = self_exe();
    if (!exe) return -1;
    size_t cap = (size_t)n * 12 + 1, len = 0;
    char *list = q3_malloc(cap);
    list[0] = 0;
    for (int i = 0; i < n; i++) len += (size_t)snprintf(list + len, cap - len, "%s%d", i ? "," : "", ids[i]);
    char tbuf[32], cbuf[32];
    char *argv[20];
    int a = 0;
    argv[a++] = exe;
    argv[a++] = "generate";
    argv[a++] = "-m";
    argv[a++] = (char *)dir;
    argv[a++] = "--ids";
    argv[a++] = list;
    argv[a++] = "-n";
    argv[a++] = "1";
    argv[a++] = "--temp";
    argv[a++] = "0";
    argv[a++] = "--print-ids";
    if (q3_hugepages_get()) argv[a++] = "--hugepages";
    if (threads_arg > 0) {
        snprintf(tbuf, sizeof tbuf, "%d", threads_arg);
        argv[a++] = "-t";
        argv[a++] = tbuf;
    }
    if (ctx_arg > 0) {
        snprintf(cbuf, sizeof cbuf, "%d", ctx_arg);
        argv[a++] = "--ctx";
        argv[a++] = cbuf;
    }
    argv[a] = NULL;

    int rc = bench_evict_dir(dir, &out->evicted_files, &out->evicted_bytes, &out->resident_after_evict);
    if (rc == 0) {
        fprintf(stderr, "[bench] ttft: cold run (%d files, %.0f MiB evicted, %.1f%% still resident)\n", out->evicted_files,
                out->evicted_bytes / 1048576.0, 100 * out->resident_after_evict);
        rc = run_child(argv, &out->cold_ms, &out->cold_exit_ms, &out->cold_rss_kb);
    }
    /* Warm: run twice, keep the second. */
    for (int i = 0; rc == 0 && i < 2; i++) {
        fprintf(stderr, "[bench] ttft: warm run %d/2\n", i + 1);
        rc = run_child(argv, &out->warm_ms, &out->warm_exit_ms, &out->warm_rss_kb);
    }
    if (rc == 0) {
        out->ran = 1;
        fprintf(stderr, "[bench] ttft: cold %.1f ms, warm %.1f ms\n", out->cold_ms, out->warm_ms);
    }
    free(list);
    free(exe);
    return rc;
}
