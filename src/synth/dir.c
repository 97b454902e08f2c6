#include "synth/dir.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

/* Ids the real Qwen3 tokenizer produces (added tokens included); a smaller
 * vocabulary cannot embed them, so the tokenizer is not copied. */
#define QWEN3_TOKENIZER_IDS 151669

/* Files synth writes. Only these are ever deleted, and only under --force
 * or after a failure of the run that created them. */
static const char *const owned_patterns[] = {
    "config.json", "model.safetensors", "model-[0-9]*-of-[0-9]*.safetensors",
    "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
};

static int is_owned(const char *name) {
    for (size_t i = 0; i < sizeof owned_patterns / sizeof owned_patterns[0]; i++)
        if (fnmatch(owned_patterns[i], name, 0) == 0) return 1;
    return 0;
}

/* Count the entries of dir, deleting those synth owns when `remove` is
 * set. -1 when the directory cannot be read or cleared. */
static int scan_dir(const char *dir, int remove) {
    DIR *d = opendir(dir);
    if (!d) return q3_err("cannot read directory %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while (n >= 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        n++;
        if (remove && is_owned(e->d_name)) {
            char *path = q3_path_join(dir, e->d_name);
            if (unlink(path) != 0) n = q3_err("cannot remove %s: %s", path, strerror(errno));
            free(path);
        }
    }
    closedir(d);
    return n;
}

int synth_prepare_dir(const char *dir, int force) {
    struct stat st;
    if (stat(dir, &st) != 0) return q3_mkdir_p(dir);
    if (!S_ISDIR(st.st_mode)) return q3_err("%s exists and is not a directory", dir);
    int n = scan_dir(dir, force);
    if (n < 0) return -1;
    if (n > 0 && !force)
        return q3_err("%s is not empty; refusing to write into it (pass --force to replace "
                      "a previous synth output there)", dir);
    return 0;
}

void synth_remove_owned(const char *dir) { scan_dir(dir, 1); }

int synth_check_space(const char *dir, uint64_t need) {
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) return 0;   /* unknown: let the writes decide */
    uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    if (avail < need)
        return q3_err("the checkpoint needs %.2f GB but only %.2f GB is free in %s", need / 1e9,
                      avail / 1e9, dir);
    return 0;
}

int synth_resolve_tokenizer(const char *spec, int vocab, char **src) {
    *src = NULL;
    if (spec && !strcmp(spec, "none")) return 0;
    char *dir = NULL;
    if (spec) {
        dir = q3_strdup(spec);
    } else {
        char *exe = q3_exe_dir();
        if (exe) dir = q3_path_join(exe, "tokenizer");
        free(exe);
    }
    char *json = dir ? q3_path_join(dir, "tokenizer.json") : NULL;
    int found = json && q3_file_exists(json);
    free(json);
    int rc = 0;
    if (!found && spec) {
        rc = q3_err("--tokenizer: no tokenizer.json in %s", spec);
    } else if (!found) {
        fprintf(stderr, "synth: note: no tokenizer found next to q3moe; writing none "
                        "(pass --tokenizer DIR)\n");
    } else if (vocab < QWEN3_TOKENIZER_IDS) {
        fprintf(stderr, "synth: note: vocab %d is smaller than the %d ids of the Qwen3 "
                        "tokenizer; not copying it\n", vocab, QWEN3_TOKENIZER_IDS);
    } else {
        *src = dir;
        dir = NULL;
    }
    free(dir);
    return rc;
}

static int copy_file(const char *src, const char *dst) {
    size_t len;
    char *data = q3_read_file(src, &len);
    if (!data) return -1;
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    int e = errno;
    if (f && fclose(f) != 0) {
        ok = 0;
        e = errno;
    }
    free(data);
    if (!ok) return q3_err("cannot write %s: %s", dst, strerror(e));
    return 0;
}

int synth_copy_tokenizer(const char *src, const char *dir) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char *from = q3_path_join(src, files[i]), *to = q3_path_join(dir, files[i]);
        /* tokenizer_config.json is optional: it only carries the chat template. */
        int rc = (i == 0 || q3_file_exists(from)) ? copy_file(from, to) : 0;
        free(from);
        free(to);
        if (rc) return -1;
    }
    return 0;
}
