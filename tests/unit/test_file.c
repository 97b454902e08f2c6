/* Mapped files (src/util/file.h): a file just written, so cached in small
 * folios, reads back unchanged through q3_prefault, which may replace its
 * mapping to get 2 MiB page entries; where the kernel demonstrably caches
 * files in huge folios, most of it then is mapped with them. A file renamed
 * over the mapped one's path meanwhile is not mapped in its place. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unit.h"
#include "util/error.h"
#include "util/file.h"

enum { SIZE = 320 << 20 }; /* past the size q3_prefault re-reads from */

static uint64_t word_at(size_t i) { return (uint64_t)i * 0x9E3779B97F4A7C15u ^ 0x5bd1e995u; }

/* FileHugePages of /proc/meminfo, in kB (0 when absent). */
static size_t file_huge_kb(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    size_t kb = 0;
    char line[256];
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "FileHugePages: %zu kB", &kb) == 1) break;
    if (fp) fclose(fp);
    return kb;
}

/* Writes SIZE bytes of words word_at(i) ^ salt to a new file at path (a
 * mkstemp template); returns 0 on success. */
static int write_file(char *path, uint64_t salt) {
    const int fd = mkstemp(path);
    if (fd < 0) return -1;
    enum { CHUNK = 1 << 20 };
    uint64_t *buf = malloc(CHUNK);
    int ok = buf != NULL;
    for (size_t off = 0; off < SIZE && ok; off += CHUNK) {
        for (size_t i = 0; i < CHUNK / 8; i++) buf[i] = word_at(off / 8 + i) ^ salt;
        ok = write(fd, buf, CHUNK) == CHUNK;
    }
    free(buf);
    close(fd);
    return ok ? 0 : -1;
}

/* Words of f that differ from word_at(i) ^ salt. */
static size_t bad_words(const q3_mapped_file *f, uint64_t salt) {
    const uint64_t *w = (const uint64_t *)f->data;
    size_t bad = 0;
    for (size_t i = 0; i < SIZE / 8; i++) bad += w[i] != (word_at(i) ^ salt);
    return bad;
}

static void test_prefault_keeps_contents(void) {
    char path[] = "/tmp/q3moe_test_file_XXXXXX";
    CHECK(write_file(path, 0) == 0);
    const int huge_folios_seen = file_huge_kb() > 0;
    q3_mapped_file f;
    CHECK(q3_map_file(&f, path) == 0);
    const size_t pmd_before = q3_file_pmd_bytes();
    q3_prefault(&f);
    const size_t pmd_gain = q3_file_pmd_bytes() - pmd_before;
    CHECK_EQ_INT((long long)bad_words(&f, 0), 0);
    CHECK(f.size == SIZE);
    if (huge_folios_seen) CHECK(pmd_gain >= SIZE / 4);
    else printf("note: this kernel holds no file in huge folios; mapped with 2 MiB entries: %zu of %d bytes\n", pmd_gain, SIZE);
    q3_unmap_file(&f);
    unlink(path);
}

static void test_prefault_after_rename(void) {
    char path[] = "/tmp/q3moe_test_file_XXXXXX", other[] = "/tmp/q3moe_test_file_XXXXXX";
    CHECK(write_file(path, 0) == 0);
    q3_mapped_file f;
    CHECK(q3_map_file(&f, path) == 0);
    CHECK(write_file(other, 0xA5A5A5A5A5A5A5A5u) == 0);
    CHECK(rename(other, path) == 0);
    q3_prefault(&f);
    CHECK_EQ_INT((long long)bad_words(&f, 0), 0);
    q3_unmap_file(&f);
    unlink(path);
}

int main(void) {
    test_prefault_keeps_contents();
    test_prefault_after_rename();
    UNIT_MAIN_END();
}
