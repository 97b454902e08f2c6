/* The fuzz targets without libFuzzer, for `make test` (gcc, ASan+UBSan):
 * runs LLVMFuzzerTestOneInput on each file given (folders: each file in
 * them) and, with --mutations N, on N mutants of each (bytes flipped, set
 * to boundary values, runs of bytes overwritten, the file cut short),
 * drawn from a fixed seed so that every run tries the same inputs. A crash
 * or sanitizer report ends the run; the input that caused it is written
 * to replay-crash.bin in the working folder first. Half the mutations
 * fall in the first 4 KiB, where the model files keep their headers and
 * tables (the rest is mostly tensor data, which the loaders only map). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_rand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

/* The input about to run, kept where a crash leaves it for a rerun. */
static void keep(const uint8_t *b, size_t n) {
    FILE *f = fopen("replay-crash.bin", "wb");
    if (!f) return;
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

static void run(const uint8_t *b, size_t n) {
    keep(b, n);
    LLVMFuzzerTestOneInput(b, n);
}

static void mutate(uint8_t *b, size_t *n) {
    static const uint8_t edge[] = {0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF, '"', '{', ':', '0', '9', '-', '\n'};
    if (*n == 0) return;
    const int kind = (int)(next_rand() % 4);
    const size_t span = next_rand() % 2 && *n > 4096 ? 4096 : *n, at = (size_t)(next_rand() % span);
    if (kind == 0) b[at] ^= (uint8_t)(1u << (next_rand() % 8));
    else if (kind == 1) b[at] = edge[next_rand() % sizeof edge];
    else if (kind == 2) {
        const size_t len = 1 + (size_t)(next_rand() % 8);
        for (size_t i = at; i < *n && i < at + len; i++) b[i] = (uint8_t)next_rand();
    } else
        *n = at;
}

static int replay_file(const char *path, int mutations) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0) return fclose(f), -1;
    const long len = ftell(f);
    rewind(f);
    uint8_t *orig = malloc(len > 0 ? (size_t)len : 1), *b = malloc(len > 0 ? (size_t)len : 1);
    if (!orig || !b || (len > 0 && fread(orig, 1, (size_t)len, f) != (size_t)len)) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f), free(orig), free(b);
        return -1;
    }
    fclose(f);
    run(orig, (size_t)len);
    for (int m = 0; m < mutations; m++) {
        size_t n = (size_t)len;
        memcpy(b, orig, n);
        const int rounds = 1 + (int)(next_rand() % 3);
        for (int r = 0; r < rounds; r++) mutate(b, &n);
        run(b, n);
    }
    free(orig), free(b);
    return 1 + mutations;
}

int main(int argc, char **argv) {
    int mutations = 0, total = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mutations") && i + 1 < argc) {
            mutations = atoi(argv[++i]);
            continue;
        }
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 2;
        }
        if (!S_ISDIR(st.st_mode)) {
            const int k = replay_file(argv[i], mutations);
            if (k < 0) return 2;
            total += k, files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 2;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            const int k = replay_file(p, mutations);
            if (k < 0) return closedir(d), 2;
            total += k, files++;
        }
        closedir(d);
    }
    remove("replay-crash.bin");
    printf("replay: %d inputs from %d files, none crashed\n", total, files);
    return files ? 0 : 2;
}
