/* .q3m reader and layout builder (the format is described in q3m.h). */
#include "io/q3m.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/bf16p.h"
#include "quant/mx.h"
#include "util/error.h"
#include "util/file.h"

uint64_t q3m_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- little-endian fields ---- */

static uint64_t rd_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t rd_u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t rd_u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void wr_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void wr_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static const char *sec_name(uint32_t kind) {
    switch (kind) {
    case Q3M_SEC_CONFIG: return "config.json";
    case Q3M_SEC_TOKENIZER: return "tokenizer.json";
    case Q3M_SEC_TOKENIZER_CONFIG: return "tokenizer_config.json";
    }
    return NULL;
}

/* File dtype codes are fixed by the format, whatever q3_dtype's values. */
static int dtype_from_code(unsigned c, q3_dtype *out) {
    static const q3_dtype map[] = {Q3_F32, Q3_F16, Q3_BF16, Q3_MXFP8, Q3_MXFP4, Q3_MXINT8, Q3_BF16P};
    if (c >= sizeof map / sizeof map[0]) return -1;
    *out = map[c];
    return 0;
}
static unsigned dtype_code(q3_dtype t) {
    switch (t) {
    case Q3_F32: return 0;
    case Q3_F16: return 1;
    case Q3_BF16: return 2;
    case Q3_MXFP8: return 3;
    case Q3_MXFP4: return 4;
    case Q3_MXINT8: return 5;
    case Q3_BF16P: return 6;
    }
    return 255;
}

int q3m_tensor_sizes(q3_dtype t, int ndim, const int64_t *shape, uint64_t *data_size, uint64_t *scales_size) {
    if (ndim < 1 || ndim > Q3_MAX_DIMS) return q3_err("%d dimensions (1 to %d supported)", ndim, Q3_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || shape[d] > (1ll << 40)) return q3_err("dimension %d is %lld", d, (long long)shape[d]);
        numel *= (uint64_t)shape[d];
        if (numel > (1ull << 48)) return q3_err("too many elements");
    }
    if (t == Q3_BF16P) { /* scales: the side table's largest size (every group raw) */
        const uint64_t cols = (uint64_t)shape[ndim - 1];
        if (cols % Q3_BF16P_GROUP)
            return q3_err("last dimension %llu is not a multiple of the BF16P group size %d", (unsigned long long)cols,
                          Q3_BF16P_GROUP);
        *data_size = numel / Q3_BF16P_GROUP * Q3_BF16P_GROUP_BYTES;
        *scales_size = numel / Q3_BF16P_GROUP * Q3_BF16P_RAW_BYTES;
        return 0;
    }
    if (!q3_dtype_is_mx(t)) {
        *data_size = numel * q3_dtype_size(t);
        *scales_size = 0;
        return 0;
    }
    uint64_t cols = (uint64_t)shape[ndim - 1];
    if (cols % Q3_MX_BLOCK)
        return q3_err("last dimension %llu is not a multiple of the MX block size %d", (unsigned long long)cols, Q3_MX_BLOCK);
    *data_size = q3_mx_elem_bytes(t, numel);
    *scales_size = numel / Q3_MX_BLOCK;
    return 0;
}

/* ---- writing ---- */

static uint64_t tensor_record_size(size_t name_len) { return Q3M_TENSOR_FIXED + round_up(name_len, 8); }

int q3m_layout(q3m_section_out *secs, int n_secs, q3m_tensor_out *ts, int n_ts, q3_quant_scheme scheme,
               unsigned char **head, size_t *head_len, uint64_t *file_size) {
    uint64_t table_size = (uint64_t)n_secs * Q3M_SECTION_RECORD;
    for (int i = 0; i < n_ts; i++) {
        size_t nl = strlen(ts[i].name);
        if (nl == 0 || nl > Q3M_NAME_MAX) return q3_err("tensor name \"%s\" is empty or longer than %d bytes", ts[i].name, Q3M_NAME_MAX);
        const uint64_t side = ts[i].scales_size;
        if (q3m_tensor_sizes(ts[i].dtype, ts[i].ndim, ts[i].shape, &ts[i].data_size, &ts[i].scales_size))
            return q3_err_prefix("tensor %s (%s)", ts[i].name, q3_dtype_name(ts[i].dtype));
        if (ts[i].dtype == Q3_BF16P) { /* the caller counted the raw groups */
            if (side > ts[i].scales_size || side % Q3_BF16P_RAW_BYTES)
                return q3_err("tensor %s: a BF16P side table of %llu bytes", ts[i].name, (unsigned long long)side);
            ts[i].scales_size = side;
        }
        table_size += tensor_record_size(nl);
    }
    uint64_t data_off = round_up(Q3M_HEADER_SIZE + table_size, Q3M_ALIGN), pos = data_off;
    for (int i = 0; i < n_secs; i++) {
        secs[i].offset = pos;
        pos = round_up(pos + secs[i].size, Q3M_ALIGN);
    }
    uint64_t end = pos;
    for (int i = 0; i < n_ts; i++) {
        ts[i].data_offset = pos;
        end = pos + ts[i].data_size;
        pos = round_up(end, Q3M_ALIGN);
        if (ts[i].scales_size) {
            ts[i].scales_offset = pos;
            end = pos + ts[i].scales_size;
            pos = round_up(end, Q3M_ALIGN);
        } else ts[i].scales_offset = 0;
    }
    if (n_ts == 0 && n_secs) end = secs[n_secs - 1].offset + secs[n_secs - 1].size;
    if (n_ts == 0 && !n_secs) end = data_off;

    unsigned char *h = q3_calloc(1, (size_t)data_off);
    memcpy(h, Q3M_MAGIC, 8);
    wr_u32(h + 8, Q3M_VERSION);
    wr_u32(h + 12, Q3M_HEADER_SIZE);
    strncpy((char *)h + 16, Q3M_ENGINE_VERSION, 32);
    wr_u64(h + 48, end);
    wr_u64(h + 56, Q3M_HEADER_SIZE);
    wr_u64(h + 64, table_size);
    wr_u64(h + 72, data_off);
    wr_u32(h + 80, (uint32_t)n_secs);
    wr_u32(h + 84, (uint32_t)n_ts);
    h[88] = (unsigned char)dtype_code(scheme.ffn);
    h[89] = (unsigned char)dtype_code(scheme.attn);
    h[90] = scheme.act == Q3_MXFP8 ? 1 : scheme.act == Q3_MXINT8 ? 2 : 0;
    h[91] = q3_dtype_is_mx(scheme.head) ? (unsigned char)dtype_code(scheme.head) : 0;
    unsigned char *p = h + Q3M_HEADER_SIZE;
    for (int i = 0; i < n_secs; i++, p += Q3M_SECTION_RECORD) {
        wr_u32(p, secs[i].kind);
        wr_u64(p + 8, secs[i].offset);
        wr_u64(p + 16, secs[i].size);
        wr_u64(p + 24, q3m_fnv1a(Q3M_FNV_BASIS, secs[i].bytes, (size_t)secs[i].size));
    }
    for (int i = 0; i < n_ts; i++) {
        const q3m_tensor_out *t = &ts[i];
        size_t nl = strlen(t->name);
        wr_u16(p, (uint16_t)nl);
        p[2] = (unsigned char)dtype_code(t->dtype);
        p[3] = (unsigned char)t->ndim;
        for (int d = 0; d < t->ndim; d++) wr_u64(p + 8 + 8 * d, (uint64_t)t->shape[d]);
        wr_u64(p + 40, t->data_offset);
        wr_u64(p + 48, t->data_size);
        wr_u64(p + 56, t->scales_offset);
        wr_u64(p + 64, t->scales_size);
        memcpy(p + Q3M_TENSOR_FIXED, t->name, nl);
        p += tensor_record_size(nl);
    }
    uint64_t ck = q3m_fnv1a(Q3M_FNV_BASIS, h, 120);
    ck = q3m_fnv1a(ck, h + Q3M_HEADER_SIZE, (size_t)table_size);
    wr_u64(h + 120, ck);
    *head = h;
    *head_len = (size_t)data_off;
    *file_size = end;
    return 0;
}

/* ---- reading ---- */

int q3m_is_q3m(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    char m[8];
    int ok = fread(m, 1, 8, fp) == 8 && !memcmp(m, Q3M_MAGIC, 8);
    fclose(fp);
    return ok;
}

/* One blob of the data region, for the overlap check. */
typedef struct {
    uint64_t begin, end;
    const char *what; /* section name or tensor name */
    const char *part; /* "data", "scales", "section" */
} blob;

static int blob_cmp(const void *a, const void *b) {
    const blob *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

typedef struct {
    const char *path;
    uint64_t file_size, data_off;
    blob *blobs;
    size_t n_blobs;
} checker;

static int check_blob(checker *c, uint64_t off, uint64_t size, const char *what, const char *part) {
    if (off % Q3M_ALIGN)
        return q3_err("%s: %s %s: offset %llu is not a multiple of %u: damaged file", c->path, what, part,
                      (unsigned long long)off, Q3M_ALIGN);
    if (off < c->data_off || off > c->file_size || size > c->file_size - off)
        return q3_err("%s: %s %s: bytes [%llu, +%llu) lie outside the data region [%llu, %llu): damaged or truncated file",
                      c->path, what, part, (unsigned long long)off, (unsigned long long)size,
                      (unsigned long long)c->data_off, (unsigned long long)c->file_size);
    c->blobs[c->n_blobs++] = (blob){off, off + size, what, part};
    return 0;
}

static int fail(q3m_file *f) {
    q3m_close(f);
    return -1;
}

static char *fmt_shape(const int64_t *shape, int nd, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < nd && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static int parse(q3m_file *f) {
    const q3_mapped_file *mf = &f->st.files[0];
    const char *path = mf->path;
    const unsigned char *d = mf->data;
    const uint64_t size = mf->size;
    if (size < 8)
        return q3_err("%s: not a q3moe model file (only %llu bytes; expected a .q3m written by `q3moe convert`, or a checkpoint directory)",
                      path, (unsigned long long)size);
    if (memcmp(d, Q3M_MAGIC, 8))
        return q3_err("%s: not a q3moe model file (bad magic; expected a .q3m written by `q3moe convert`, or a checkpoint directory)", path);
    if (size < Q3M_HEADER_SIZE)
        return q3_err("%s: truncated: %llu bytes, shorter than the %u-byte .q3m header", path, (unsigned long long)size, Q3M_HEADER_SIZE);
    f->version = rd_u32(d + 8);
    memcpy(f->engine, d + 16, 32);
    f->engine[32] = 0;
    for (char *e = f->engine; *e; e++)
        if (*e < 0x20 || *e > 0x7e) *e = '?';
    if (f->version != Q3M_VERSION)
        return q3_err("%s: .q3m format version %u (written by \"%s\"), but this q3moe reads version %u: re-convert the "
                      "checkpoint with `q3moe convert`",
                      path, f->version, f->engine, Q3M_VERSION);
    const uint32_t hsize = rd_u32(d + 12);
    const uint64_t fsize = rd_u64(d + 48), toff = rd_u64(d + 56), tsize = rd_u64(d + 64), doff = rd_u64(d + 72);
    const uint32_t n_secs = rd_u32(d + 80), n_ts = rd_u32(d + 84);
    if (hsize != Q3M_HEADER_SIZE) return q3_err("%s: header size %u, expected %u: damaged file", path, hsize, Q3M_HEADER_SIZE);
    if (fsize > size)
        return q3_err("%s: truncated: the header says %llu bytes but the file has %llu (re-convert or re-copy it)", path,
                      (unsigned long long)fsize, (unsigned long long)size);
    if (fsize < size)
        return q3_err("%s: %llu bytes but the header says %llu: trailing data, damaged file", path, (unsigned long long)size,
                      (unsigned long long)fsize);
    if (toff != Q3M_HEADER_SIZE || tsize > size - toff || doff % Q3M_ALIGN || doff < toff + tsize || doff > size)
        return q3_err("%s: header table/data offsets (table %llu + %llu, data %llu) do not fit the %llu-byte file: damaged file",
                      path, (unsigned long long)toff, (unsigned long long)tsize, (unsigned long long)doff,
                      (unsigned long long)size);
    uint64_t ck = q3m_fnv1a(Q3M_FNV_BASIS, d, 120);
    ck = q3m_fnv1a(ck, d + toff, (size_t)tsize);
    if (ck != rd_u64(d + 120)) return q3_err("%s: header checksum mismatch: the header or tensor table is damaged", path);
    for (int i = 92; i < 120; i++)
        if (d[i]) return q3_err("%s: reserved header byte %d is not zero: damaged file", path, i);
    if (dtype_from_code(d[88], &f->scheme.ffn) || dtype_from_code(d[89], &f->scheme.attn) || d[90] > 2)
        return q3_err("%s: unknown quantization scheme codes (%u, %u, %u) in the header", path, d[88], d[89], d[90]);
    f->scheme.act = d[90] == 1 ? Q3_MXFP8 : d[90] == 2 ? Q3_MXINT8 : Q3_F32;
    f->scheme.head = Q3_BF16; /* as stored */
    if (d[91] && (dtype_from_code(d[91], &f->scheme.head) || !q3_dtype_is_mx(f->scheme.head)))
        return q3_err("%s: unknown lm_head quantization code %u in the header", path, d[91]);
    if ((uint64_t)n_secs * Q3M_SECTION_RECORD > tsize || n_ts > tsize / Q3M_TENSOR_FIXED)
        return q3_err("%s: %u sections and %u tensors cannot fit a %llu-byte table: damaged file", path, n_secs, n_ts,
                      (unsigned long long)tsize);

    checker c = {path, size, doff, q3_malloc(((size_t)n_secs + 2 * (size_t)n_ts + 1) * sizeof(blob)), 0};
    int rc = 0;
    const unsigned char *p = d + toff, *tend = d + toff + tsize;
    const unsigned char *sec_ptr[4] = {0};
    uint64_t sec_len[4] = {0};
    for (uint32_t i = 0; rc == 0 && i < n_secs; i++, p += Q3M_SECTION_RECORD) {
        uint32_t kind = rd_u32(p);
        uint64_t off = rd_u64(p + 8), len = rd_u64(p + 16);
        const char *name = sec_name(kind);
        if (!name) rc = q3_err("%s: section %u has unknown kind %u: damaged file or a newer format", path, i, kind);
        else if (rd_u32(p + 4)) rc = q3_err("%s: section %s: reserved field is not zero: damaged file", path, name);
        else if (sec_ptr[kind]) rc = q3_err("%s: section %s appears twice: damaged file", path, name);
        else if ((rc = check_blob(&c, off, len, name, "section")) == 0) {
            if (q3m_fnv1a(Q3M_FNV_BASIS, d + off, (size_t)len) != rd_u64(p + 24))
                rc = q3_err("%s: embedded %s is damaged (checksum mismatch)", path, name);
            sec_ptr[kind] = d + off;
            sec_len[kind] = len;
        }
    }
    if (rc == 0 && !sec_ptr[Q3M_SEC_CONFIG]) rc = q3_err("%s: no embedded config.json section: damaged file", path);

    q3_st_archive *a = &f->st;
    a->tensors = q3_calloc(n_ts ? n_ts : 1, sizeof *a->tensors);
    for (uint32_t i = 0; rc == 0 && i < n_ts; i++) {
        if ((size_t)(tend - p) < Q3M_TENSOR_FIXED) {
            rc = q3_err("%s: tensor record %u runs past the end of the table: damaged file", path, i);
            break;
        }
        unsigned nl = rd_u16(p), code = p[2], nd = p[3];
        uint64_t rec = tensor_record_size(nl);
        if (nl == 0 || nl > Q3M_NAME_MAX || rec > (uint64_t)(tend - p)) {
            rc = q3_err("%s: tensor record %u has a bad name length %u: damaged file", path, i, nl);
            break;
        }
        const char *nm = (const char *)p + Q3M_TENSOR_FIXED;
        if (memchr(nm, 0, nl)) {
            rc = q3_err("%s: tensor record %u: name contains a NUL byte: damaged file", path, i);
            break;
        }
        q3_st_tensor *t = &a->tensors[a->n_tensors];
        t->name = q3_malloc(nl + 1);
        memcpy(t->name, nm, nl);
        t->name[nl] = 0;
        a->n_tensors++;
        if (dtype_from_code(code, &t->dtype)) {
            rc = q3_err("%s: tensor %s: unknown dtype code %u: damaged file", path, t->name, code);
            break;
        }
        if (nd < 1 || nd > Q3_MAX_DIMS || rd_u32(p + 4)) {
            rc = q3_err("%s: tensor %s: %u dimensions (1 to %d supported) or reserved bits set: damaged file", path, t->name, nd, Q3_MAX_DIMS);
            break;
        }
        t->ndim = (int)nd;
        int bad_pad = 0;
        for (unsigned k = 0; k < Q3_MAX_DIMS; k++) {
            uint64_t v = rd_u64(p + 8 + 8 * k);
            if (k < nd) t->shape[k] = v > (1ull << 40) ? -1 : (int64_t)v;
            else bad_pad |= v != 0;
        }
        for (uint64_t k = Q3M_TENSOR_FIXED + nl; k < rec; k++) bad_pad |= p[k] != 0;
        uint64_t want_d, want_s, doff_t = rd_u64(p + 40), dlen = rd_u64(p + 48), soff = rd_u64(p + 56), slen = rd_u64(p + 64);
        char shp[128];
        if (bad_pad) rc = q3_err("%s: tensor %s: non-zero padding in its table record: damaged file", path, t->name);
        else if (q3m_tensor_sizes(t->dtype, t->ndim, t->shape, &want_d, &want_s))
            rc = q3_err_prefix("%s: tensor %s: shape %s does not fit dtype %s", path, t->name,
                               fmt_shape(t->shape, t->ndim, shp, sizeof shp), q3_dtype_name(t->dtype));
        else if (dlen != want_d || (t->dtype == Q3_BF16P ? slen > want_s || slen % Q3_BF16P_RAW_BYTES : slen != want_s))
            rc = q3_err("%s: tensor %s: %llu data + %llu scale bytes, but shape %s and dtype %s need %llu + %llu: damaged file",
                        path, t->name, (unsigned long long)dlen, (unsigned long long)slen,
                        fmt_shape(t->shape, t->ndim, shp, sizeof shp), q3_dtype_name(t->dtype),
                        (unsigned long long)want_d, (unsigned long long)want_s);
        else if (!slen && soff) rc = q3_err("%s: tensor %s: a %s tensor with a scales offset: damaged file", path, t->name, q3_dtype_name(t->dtype));
        else if ((rc = check_blob(&c, doff_t, dlen, t->name, "data")) == 0 && slen)
            rc = check_blob(&c, soff, slen, t->name, "scales");
        if (rc) break;
        t->data = d + doff_t;
        t->nbytes = (size_t)dlen;
        t->scales = slen ? d + soff : NULL;
        t->scales_nbytes = (size_t)slen;
        t->file = 0;
        p += rec;
    }
    if (rc == 0 && p != tend)
        rc = q3_err("%s: %llu bytes of the tensor table are left over after %u records: damaged file", path,
                    (unsigned long long)(tend - p), n_ts);
    if (rc == 0) {
        qsort(c.blobs, c.n_blobs, sizeof *c.blobs, blob_cmp);
        for (size_t i = 1; rc == 0 && i < c.n_blobs; i++)
            if (c.blobs[i].begin < c.blobs[i - 1].end)
                rc = q3_err("%s: %s %s overlaps %s %s in the data region: damaged file", path, c.blobs[i].what, c.blobs[i].part,
                            c.blobs[i - 1].what, c.blobs[i - 1].part);
    }
    if (rc == 0 && q3_st_build_index(a)) rc = q3_err_prefix("%s", path);
    free(c.blobs);
    if (rc) return -1;
    f->config_len = (size_t)sec_len[Q3M_SEC_CONFIG];
    f->config_json = q3_malloc(f->config_len + 1);
    memcpy(f->config_json, sec_ptr[Q3M_SEC_CONFIG], f->config_len);
    f->config_json[f->config_len] = 0;
    f->tokenizer_json = (const char *)sec_ptr[Q3M_SEC_TOKENIZER];
    f->tokenizer_len = (size_t)sec_len[Q3M_SEC_TOKENIZER];
    f->tokenizer_config_json = (const char *)sec_ptr[Q3M_SEC_TOKENIZER_CONFIG];
    f->tokenizer_config_len = (size_t)sec_len[Q3M_SEC_TOKENIZER_CONFIG];
    return 0;
}

int q3m_open(q3m_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->st.files = q3_calloc(1, sizeof *f->st.files);
    if (q3_map_file(&f->st.files[0], path)) return fail(f);
    f->st.n_files = 1;
    f->path = f->st.files[0].path;
    if (parse(f)) return fail(f);
    return 0;
}

void q3m_close(q3m_file *f) {
    q3_st_close(&f->st);
    free(f->config_json);
    memset(f, 0, sizeof *f);
}
