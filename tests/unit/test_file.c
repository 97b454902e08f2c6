/* Mapped files (src/util/file.h): a file just written, so cached in small
 * folios, reads back unchanged through q3_prefault, which may replace its
 * mapping to get 2 MiB page entries; where the kernel demonstrably caches
 * files in huge folios, most of it then is mapped with them. */
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

static void test_prefault_keeps_contents(void) {
    char path[] = "/tmp/q3moe_test_file_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    enum { CHUNK = 1 << 20 };
    uint64_t *buf = malloc(CHUNK);
    int wrote = 1;
    for (size_t off = 0; off < SIZE && wrote; off += CHUNK) {
        for (size_t i = 0; i < CHUNK / 8; i++) buf[i] = word_at(off / 8 + i);
        wrote = write(fd, buf, CHUNK) == CHUNK;
    }
    free(buf);
    close(fd);
    CHECK(wrote);
    const int huge_folios_seen = file_huge_kb() > 0;
    q3_mapped_file f;
    CHECK(q3_map_file(&f, path) == 0);
    const size_t pmd_before = q3_file_pmd_bytes();
    q3_prefault(&f);
    const size_t pmd_gain = q3_file_pmd_bytes() - pmd_before;
    const uint64_t *w = (const uint64_t *)f.data;
    size_t bad = 0;
    for (size_t i = 0; i < SIZE / 8; i++) bad += w[i] != word_at(i);
    CHECK_EQ_INT((long long)bad, 0);
    CHECK(f.size == SIZE);
    if (huge_folios_seen) CHECK(pmd_gain >= SIZE / 4);
    else printf("note: this kernel holds no file in huge folios; mapped with 2 MiB entries: %zu of %d bytes\n", pmd_gain, SIZE);
    q3_unmap_file(&f);
    unlink(path);
}

int main(void) {
    test_prefault_keeps_contents();
    UNIT_MAIN_END();
}
