/* .q3m files (src/io/q3m.h): a small file built with q3m_layout reads back
 * through q3m_open; every kind of damage to the header, table or offsets is
 * refused with a message naming the file; FNV-1a test vectors; which tensors
 * a scheme quantizes (src/quant/convert.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/q3m.h"
#include "quant/convert.h"
#include "unit.h"
#include "util/error.h"

static char g_path[64];

/* The pristine file's bytes and the offsets of its records. */
static unsigned char *g_file;
static size_t g_size;
static size_t g_rec[3]; /* tensor record offsets */

static const char CONFIG[] = "{\"model_type\": \"qwen3_moe\"}";
static const char TOKENIZER[] = "{\"model\": {}}";

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void fix_checksum(unsigned char *f) {
    uint64_t tsize = get_u64(f + 64);
    uint64_t ck = q3m_fnv1a(Q3M_FNV_BASIS, f, 120);
    put_u64(f + 120, q3m_fnv1a(ck, f + 128, (size_t)tsize));
}

static void write_file(const unsigned char *b, size_t n) {
    FILE *fp = fopen(g_path, "wb");
    if (!fp) {
        perror(g_path);
        exit(1);
    }
    if (n) fwrite(b, 1, n, fp);
    fclose(fp);
}

static void build(void) {
    q3m_section_out secs[2] = {{Q3M_SEC_CONFIG, CONFIG, sizeof CONFIG - 1, 0}, {Q3M_SEC_TOKENIZER, TOKENIZER, sizeof TOKENIZER - 1, 0}};
    q3m_tensor_out ts[3] = {
        {.name = "a.weight", .dtype = Q3_F32, .ndim = 2, .shape = {2, 3}},
        {.name = "model.layers.0.mlp.experts.0.up_proj.weight", .dtype = Q3_MXFP4, .ndim = 2, .shape = {2, 64}},
        {.name = "c", .dtype = Q3_BF16, .ndim = 1, .shape = {5}},
    };
    unsigned char *head;
    size_t head_len;
    uint64_t fsize;
    q3_quant_scheme s = {Q3_MXFP4, Q3_MXFP8, Q3_MXFP8, Q3_MXFP8};
    CHECK(q3m_layout(secs, 2, ts, 3, s, &head, &head_len, &fsize) == 0);
    g_size = (size_t)fsize;
    g_file = calloc(1, g_size);
    memcpy(g_file, head, head_len);
    free(head);
    for (int i = 0; i < 2; i++) memcpy(g_file + secs[i].offset, secs[i].bytes, (size_t)secs[i].size);
    for (int i = 0; i < 3; i++) {
        CHECK(ts[i].data_offset % 64 == 0 && ts[i].scales_offset % 64 == 0);
        for (uint64_t k = 0; k < ts[i].data_size; k++) g_file[ts[i].data_offset + k] = (unsigned char)(i * 50 + k);
        for (uint64_t k = 0; k < ts[i].scales_size; k++) g_file[ts[i].scales_offset + k] = (unsigned char)(127 + k);
    }
    CHECK_EQ_INT(ts[0].data_size, 24);
    CHECK_EQ_INT(ts[1].data_size, 64);
    CHECK_EQ_INT(ts[1].scales_size, 4);
    CHECK_EQ_INT(ts[2].data_size, 10);
    CHECK_EQ_INT(ts[2].scales_size, 0);
    size_t p = 128 + 2 * Q3M_SECTION_RECORD;
    for (int i = 0; i < 3; i++) {
        g_rec[i] = p;
        p += Q3M_TENSOR_FIXED + (strlen(ts[i].name) + 7) / 8 * 8;
    }
    CHECK_EQ_INT(p, 128 + get_u64(g_file + 64));
}

static void test_roundtrip(void) {
    write_file(g_file, g_size);
    q3m_file f;
    int rc = q3m_open(&f, g_path);
    if (!CHECK(rc == 0)) {
        fprintf(stderr, "%s\n", q3_errmsg());
        return;
    }
    CHECK_EQ_INT(f.version, Q3M_VERSION);
    CHECK_EQ_STR(f.engine, Q3M_ENGINE_VERSION);
    CHECK_EQ_INT(f.scheme.ffn, Q3_MXFP4);
    CHECK_EQ_INT(f.scheme.attn, Q3_MXFP8);
    CHECK_EQ_INT(f.scheme.act, Q3_MXFP8);
    CHECK_EQ_INT(f.scheme.head, Q3_MXFP8);
    CHECK_EQ_STR(f.config_json, CONFIG);
    CHECK(f.tokenizer_json && f.tokenizer_len == sizeof TOKENIZER - 1 && !memcmp(f.tokenizer_json, TOKENIZER, f.tokenizer_len));
    CHECK(f.tokenizer_config_json == NULL);
    CHECK_EQ_INT(f.st.n_tensors, 3);
    const q3_st_tensor *t = q3_st_find(&f.st, "model.layers.0.mlp.experts.0.up_proj.weight");
    if (CHECK(t != NULL)) {
        CHECK_EQ_INT(t->dtype, Q3_MXFP4);
        CHECK_EQ_INT(t->ndim, 2);
        CHECK_EQ_INT(t->shape[1], 64);
        CHECK_EQ_INT(t->nbytes, 64);
        CHECK(((uintptr_t)t->data & 63) == 0 && t->scales && ((uintptr_t)t->scales & 63) == 0);
        CHECK_EQ_INT(((const unsigned char *)t->data)[5], 55);
        CHECK_EQ_INT(t->scales[3], 130);
    }
    t = q3_st_find(&f.st, "a.weight");
    CHECK(t && t->dtype == Q3_F32 && t->scales == NULL && t->nbytes == 24);
    CHECK(q3_st_find(&f.st, "nope") == NULL);
    q3m_close(&f);
    CHECK(q3m_is_q3m(g_path));
}

/* Apply `edit` to a copy, optionally re-compute the checksum, and expect
 * q3m_open to fail with a message containing the path and `want`. */
static void expect_refused(const char *what, void (*edit)(unsigned char *, size_t *), int fix, const char *want) {
    unsigned char *b = malloc(g_size + 64);
    size_t n = g_size;
    memcpy(b, g_file, g_size);
    edit(b, &n);
    if (fix) fix_checksum(b);
    write_file(b, n);
    free(b);
    q3m_file f;
    q3_err_clear();
    int rc = q3m_open(&f, g_path);
    const char *msg = q3_errmsg();
    int ok = rc != 0 && strstr(msg, g_path) && strstr(msg, want);
    if (!CHECK(ok)) fprintf(stderr, "  case %s: rc %d, message: %s (wanted \"%s\")\n", what, rc, msg, want);
    if (rc == 0) q3m_close(&f);
}

static void e_magic(unsigned char *b, size_t *n) { (void)n; b[7] = 'X'; }
static void e_version(unsigned char *b, size_t *n) { (void)n; b[8] = 2; }
static void e_trunc(unsigned char *b, size_t *n) { (void)b; *n -= 7; }
static void e_short(unsigned char *b, size_t *n) { (void)b; *n = 60; }
static void e_empty(unsigned char *b, size_t *n) { (void)b; *n = 0; }
static void e_trailing(unsigned char *b, size_t *n) { b[(*n)++] = 0; }
static void e_flip_name(unsigned char *b, size_t *n) { (void)n; b[g_rec[2] + Q3M_TENSOR_FIXED] ^= 1; }
static void e_flip_scheme(unsigned char *b, size_t *n) { (void)n; b[90] = 0; }
static void e_past_end(unsigned char *b, size_t *n) { put_u64(b + g_rec[0] + 40, (*n + 63) / 64 * 64 + 64); }
static void e_scales_past(unsigned char *b, size_t *n) { put_u64(b + g_rec[1] + 56, (*n + 63) / 64 * 64); }
static void e_before_data(unsigned char *b, size_t *n) { (void)n; put_u64(b + g_rec[0] + 40, 0); }
static void e_overlap(unsigned char *b, size_t *n) {
    (void)n;
    put_u64(b + g_rec[2] + 40, get_u64(b + g_rec[1] + 40)); /* c's data onto b's elements */
}
static void e_misaligned(unsigned char *b, size_t *n) { (void)n; put_u64(b + g_rec[2] + 40, get_u64(b + g_rec[2] + 40) + 2); }
static void e_size(unsigned char *b, size_t *n) { (void)n; put_u64(b + g_rec[0] + 48, 20); }
static void e_shape(unsigned char *b, size_t *n) { (void)n; put_u64(b + g_rec[1] + 16, 48); }
static void e_dtype(unsigned char *b, size_t *n) { (void)n; b[g_rec[0] + 2] = 7; }
static void e_ndim(unsigned char *b, size_t *n) { (void)n; b[g_rec[0] + 3] = 0; }
static void e_section_kind(unsigned char *b, size_t *n) { (void)n; b[128] = 9; }
static void e_config_bytes(unsigned char *b, size_t *n) {
    (void)n;
    b[get_u64(b + 128 + 8)] ^= 1;
}
static void e_no_config(unsigned char *b, size_t *n) { (void)n; b[128] = Q3M_SEC_TOKENIZER_CONFIG; }
static void e_counts(unsigned char *b, size_t *n) { (void)n; b[84] = 200; }

static void test_refusals(void) {
    expect_refused("bad magic", e_magic, 0, "bad magic");
    expect_refused("version", e_version, 1, "re-convert");
    expect_refused("truncated", e_trunc, 0, "truncated");
    expect_refused("short", e_short, 0, "truncated");
    expect_refused("empty", e_empty, 0, "not a q3moe model file");
    expect_refused("trailing", e_trailing, 0, "trailing");
    expect_refused("table checksum", e_flip_name, 0, "checksum mismatch");
    expect_refused("header checksum", e_flip_scheme, 0, "checksum mismatch");
    expect_refused("past end", e_past_end, 1, "outside the data region");
    expect_refused("scales past end", e_scales_past, 1, "outside the data region");
    expect_refused("inside the table", e_before_data, 1, "outside the data region");
    expect_refused("overlap", e_overlap, 1, "overlaps");
    expect_refused("misaligned", e_misaligned, 1, "multiple of 64");
    expect_refused("size", e_size, 1, "need");
    expect_refused("mx shape", e_shape, 1, "multiple of the MX block size");
    expect_refused("dtype", e_dtype, 1, "dtype code 7");
    expect_refused("ndim", e_ndim, 1, "dimensions");
    expect_refused("section kind", e_section_kind, 1, "unknown kind 9");
    expect_refused("config bytes", e_config_bytes, 0, "config.json is damaged");
    expect_refused("no config", e_no_config, 1, "no embedded config.json");
    expect_refused("counts", e_counts, 1, "damaged");
}

/* Two tensors of one name: build a file whose names collide. */
static void test_duplicate_names(void) {
    q3m_section_out sec = {Q3M_SEC_CONFIG, CONFIG, sizeof CONFIG - 1, 0};
    q3m_tensor_out ts[2] = {{.name = "x", .dtype = Q3_F32, .ndim = 1, .shape = {4}},
                            {.name = "x", .dtype = Q3_F16, .ndim = 1, .shape = {4}}};
    unsigned char *head;
    size_t head_len;
    uint64_t fsize;
    CHECK(q3m_layout(&sec, 1, ts, 2, (q3_quant_scheme){Q3_BF16, Q3_BF16, Q3_F32, Q3_BF16}, &head, &head_len, &fsize) == 0);
    unsigned char *b = calloc(1, (size_t)fsize);
    memcpy(b, head, head_len);
    memcpy(b + sec.offset, CONFIG, sizeof CONFIG - 1);
    free(head);
    write_file(b, (size_t)fsize);
    free(b);
    q3m_file f;
    int rc = q3m_open(&f, g_path);
    CHECK(rc != 0 && strstr(q3_errmsg(), "appears twice") && strstr(q3_errmsg(), g_path));
    if (rc == 0) q3m_close(&f);
}

static void test_fnv_and_sizes(void) {
    CHECK(q3m_fnv1a(Q3M_FNV_BASIS, "", 0) == 0xcbf29ce484222325ull);
    CHECK(q3m_fnv1a(Q3M_FNV_BASIS, "a", 1) == 0xaf63dc4c8601ec8cull);
    CHECK(q3m_fnv1a(Q3M_FNV_BASIS, "foobar", 6) == 0x85944171f73967e8ull);
    CHECK(q3m_fnv1a(q3m_fnv1a(Q3M_FNV_BASIS, "foo", 3), "bar", 3) == 0x85944171f73967e8ull);
    uint64_t d, s;
    int64_t sh[2] = {3, 96};
    CHECK(q3m_tensor_sizes(Q3_MXFP8, 2, sh, &d, &s) == 0 && d == 288 && s == 9);
    CHECK(q3m_tensor_sizes(Q3_MXFP4, 2, sh, &d, &s) == 0 && d == 144 && s == 9);
    CHECK(q3m_tensor_sizes(Q3_BF16, 2, sh, &d, &s) == 0 && d == 576 && s == 0);
    sh[1] = 48;
    CHECK(q3m_tensor_sizes(Q3_MXFP4, 2, sh, &d, &s) != 0);
    sh[1] = 0;
    CHECK(q3m_tensor_sizes(Q3_F32, 2, sh, &d, &s) != 0);
}

static void test_targets(void) {
    q3_quant_scheme s;
    CHECK(q3_scheme_from_name("w4a8", &s) == 0 && s.ffn == Q3_MXFP4 && s.attn == Q3_MXFP8 && s.act == Q3_MXFP8);
    CHECK(q3_scheme_from_name("w8a8", &s) == 0 && s.ffn == Q3_MXFP8 && s.attn == Q3_MXFP8 && s.act == Q3_MXFP8);
    CHECK(q3_scheme_from_name("w4", &s) == 0 && s.ffn == Q3_MXFP4 && s.attn == Q3_MXFP4 && s.act == Q3_F32);
    CHECK(q3_scheme_from_name("w8", &s) == 0 && s.ffn == Q3_MXFP8 && s.attn == Q3_MXFP8 && s.act == Q3_F32);
    CHECK(q3_scheme_from_name("bf16", &s) == 0 && s.ffn == Q3_BF16 && s.attn == Q3_BF16 && s.act == Q3_F32);
    CHECK(q3_scheme_from_name("w2", &s) != 0);
    q3_quant_scheme w = {Q3_MXFP4, Q3_MXFP8, Q3_MXFP8, Q3_BF16};
    static const struct {
        const char *name;
        q3_dtype want;
    } cases[] = {
        {"model.layers.0.self_attn.q_proj.weight", Q3_MXFP8},
        {"model.layers.12.self_attn.o_proj.weight", Q3_MXFP8},
        {"model.layers.0.self_attn.q_norm.weight", Q3_BF16},
        {"model.layers.3.mlp.experts.127.down_proj.weight", Q3_MXFP4},
        {"model.layers.3.mlp.gate_proj.weight", Q3_MXFP4},
        {"model.layers.3.mlp.gate.weight", Q3_BF16}, /* the router */
        {"model.embed_tokens.weight", Q3_BF16},
        {"lm_head.weight", Q3_BF16},
        {"model.norm.weight", Q3_BF16},
        {"model.layers.0.input_layernorm.weight", Q3_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ok = q3_convert_target(cases[i].name, &w) == cases[i].want;
        if (!CHECK(ok)) fprintf(stderr, "  target of %s\n", cases[i].name);
    }
    w.head = Q3_MXFP8; /* --head: lm_head only, never the (tied) embeddings */
    CHECK_EQ_INT(q3_convert_target("lm_head.weight", &w), Q3_MXFP8);
    CHECK_EQ_INT(q3_convert_target("model.embed_tokens.weight", &w), Q3_BF16);
    CHECK(q3_scheme_flag("--head", "mxfp4", &w) == 0 && w.head == Q3_MXFP4);
    CHECK(q3_scheme_flag("--head", "int4", &w) != 0);
}

int main(void) {
    snprintf(g_path, sizeof g_path, "/tmp/q3m_unit_%d.q3m", (int)getpid());
    build();
    test_roundtrip();
    test_refusals();
    test_duplicate_names();
    test_fnv_and_sizes();
    test_targets();
    unlink(g_path);
    free(g_file);
    UNIT_MAIN_END();
}
