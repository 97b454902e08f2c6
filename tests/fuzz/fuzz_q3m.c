/* A .q3m file of any content: q3_model_load must load it or refuse it
 * with a message, never crash, hang or run out of memory, and a model it
 * loads must run (fuzz_run_model). The harness
 * repairs the file size field and the checksums (header + table, and each
 * section's), so that mutations reach the table, section and tensor checks
 * and the embedded config instead of stopping at the first checksum. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "io/q3m.h"
#include "model/model.h"

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void repair(uint8_t *b, size_t n) {
    if (n < Q3M_HEADER_SIZE) return;
    const uint64_t size = n;
    memcpy(b + 48, &size, 8);
    const uint64_t toff = rd64(b + 56), tsize = rd64(b + 64);
    if (toff > n || tsize > n - toff) return;
    const uint32_t nsec = rd32(b + 80);
    for (uint64_t i = 0; i < nsec && (i + 1) * Q3M_SECTION_RECORD <= tsize; i++) {
        uint8_t *r = b + toff + i * Q3M_SECTION_RECORD;
        const uint64_t off = rd64(r + 8), len = rd64(r + 16);
        if (off > n || len > n - off) continue;
        const uint64_t h = q3m_fnv1a(Q3M_FNV_BASIS, b + off, len);
        memcpy(r + 24, &h, 8);
    }
    const uint64_t h = q3m_fnv1a(q3m_fnv1a(Q3M_FNV_BASIS, b, 120), b + toff, tsize);
    memcpy(b + 120, &h, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    uint8_t *b = malloc(n ? n : 1);
    if (!b) abort();
    memcpy(b, data, n);
    repair(b, n);
    const char *path = fuzz_write("model.q3m", b, n);
    free(b);
    q3_model m;
    const int rc = q3_model_load(&m, path);
    if (rc == 0) fuzz_run_model(&m), q3_model_free(&m);
    fuzz_done(rc);
    return 0;
}
