/* The packed, pre-quantized model file (.q3m) written by `q3moe convert`.
 *
 * One file holds everything a model command needs: the checkpoint's
 * config.json (verbatim), its tokenizer files (verbatim, when it has them),
 * the quantization scheme, and every tensor, already in its final storage
 * type (MX tensors quantized, the rest copied as stored). Loading is mmap
 * plus validation only: tensors point into the mapping, nothing is converted.
 *
 * ---- Layout (format version 1; every integer little-endian) ----
 *
 * Header, 128 bytes at offset 0:
 *     off  size  field
 *       0     8  magic "Q3MOE\0PK" (51 33 4D 4F 45 00 50 4B)
 *       8     4  u32 format version (Q3M_VERSION); readers refuse any other
 *      12     4  u32 header size (128)
 *      16    32  engine version that wrote the file, ASCII, NUL-padded
 *      48     8  u64 file size in bytes (a shorter file is truncated)
 *      56     8  u64 table offset (128)
 *      64     8  u64 table size in bytes
 *      72     8  u64 data offset: start of the data region, a multiple of 64,
 *                    >= table offset + table size
 *      80     4  u32 number of section records
 *      84     4  u32 number of tensor records
 *      88     1  u8  scheme: FFN weight dtype code (see below; BF16 = as stored)
 *      89     1  u8  scheme: attention projection dtype code
 *      90     1  u8  scheme: activations (0 = none, 1 = MXFP8, 2 = MXINT8)
 *      91     1  u8  scheme: lm_head (0 = as stored, else its MX dtype code)
 *      92    28  zero
 *     120     8  u64 checksum: FNV-1a 64 (offset basis 0xcbf29ce484222325,
 *                    prime 0x100000001b3) over header bytes [0, 120)
 *                    followed by the whole table
 *
 * Table, at the table offset, exactly table-size bytes:
 *   section records first, 32 bytes each:
 *       u32 kind (1 config.json, 2 tokenizer.json, 3 tokenizer_config.json)
 *       u32 zero
 *       u64 offset, u64 size   (absolute file offset of the bytes)
 *       u64 FNV-1a 64 of the section's bytes
 *     config.json is required; each kind appears at most once; unknown
 *     kinds are refused.
 *   then tensor records, 72 + round_up(name_len, 8) bytes each:
 *       u16 name_len (1..1023), u8 dtype code, u8 ndim (1..4), u32 zero
 *       i64 shape[4]             (entries past ndim are 0, the rest >= 1)
 *       u64 data offset, u64 data size
 *       u64 scales offset, u64 scales size   (both 0 for plain dtypes)
 *       name (UTF-8, no NUL), zero-padded to a multiple of 8 bytes
 *
 * Dtype codes: 0 F32, 1 F16, 2 BF16, 3 MXFP8, 4 MXFP4, 5 MXINT8, 6 BF16P.
 * Plain dtypes: data size = product(shape) * 4 or 2, row-major as in
 *   safetensors.
 * MX dtypes: the last dimension (cols) is a multiple of 32; rows = product
 *   of the other dimensions. Data holds the element codes row-major: MXFP8
 *   one E4M3 byte per element (rows * cols bytes), MXFP4 two E2M1 codes per
 *   byte, element 2i in the LOW nibble (rows * cols / 2 bytes), MXINT8 one
 *   two's-complement int8 per element (rows * cols bytes). Scales hold
 *   one E8M0 byte per 32 consecutive elements of a row, row-major
 *   (rows * cols / 32 bytes). The quantization is src/quant/mx.h's.
 * BF16P (src/quant/bf16p.h): cols a multiple of 64; data holds rows * cols
 *   / 64 groups of 100 bytes, row-major; scales hold the raw groups, 128
 *   bytes each, as many as the data's headers name (none: size and offset
 *   0), at most rows * cols / 64.
 *
 * Data region: [data offset, file size). Every section, tensor data and
 * tensor scales blob starts at an absolute offset that is a multiple of 64,
 * lies wholly inside the region, and overlaps no other blob. Gaps are zero.
 * The writer puts sections first, then each tensor's data followed by its
 * scales, in table order, and ends the file at the end of the last blob.
 *
 * A file of another format version is refused with a message saying to
 * re-convert; nothing is migrated. */
#ifndef Q3_Q3M_H
#define Q3_Q3M_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "quant/scheme.h"

#define Q3M_MAGIC "Q3MOE\0PK"
#define Q3M_VERSION 1u
#define Q3M_HEADER_SIZE 128u
#define Q3M_ALIGN 64u
#define Q3M_ENGINE_VERSION "q3moe 0.1"
#define Q3M_SECTION_RECORD 32u
#define Q3M_TENSOR_FIXED 72u
#define Q3M_NAME_MAX 1023

enum { Q3M_SEC_CONFIG = 1, Q3M_SEC_TOKENIZER = 2, Q3M_SEC_TOKENIZER_CONFIG = 3 };

#define Q3M_FNV_BASIS 0xcbf29ce484222325ull
uint64_t q3m_fnv1a(uint64_t h, const void *p, size_t n);

typedef struct {
    q3_st_archive st;          /* tensors by name (q3_st_find); st.files[0] is the mapping */
    const char *path;          /* = st.files[0].path */
    uint32_t version;
    char engine[33];           /* writer's engine version */
    q3_quant_scheme scheme;
    char *config_json;         /* embedded config.json, NUL-terminated heap copy */
    size_t config_len;
    const char *tokenizer_json;          /* into the mapping, NOT NUL-terminated; NULL if absent */
    size_t tokenizer_len;
    const char *tokenizer_config_json;   /* idem */
    size_t tokenizer_config_len;
} q3m_file;

/* mmap and validate a .q3m file. On failure returns -1 with a q3_err
 * message naming the file, and f is left closed. */
int q3m_open(q3m_file *f, const char *path);
void q3m_close(q3m_file *f);

/* Is `path` a regular file starting with the .q3m magic? (No validation.) */
int q3m_is_q3m(const char *path);

/* ---- Writing (used by src/quant/convert.c) ---- */

/* Bytes of a tensor's data and scales blobs for dtype and shape. -1 with a
 * q3_err message (not naming the tensor) when the shape does not fit the
 * dtype (MX with a last dimension not a multiple of 32, a zero dimension). */
int q3m_tensor_sizes(q3_dtype t, int ndim, const int64_t *shape, uint64_t *data_size, uint64_t *scales_size);

typedef struct {
    uint32_t kind;
    const void *bytes;
    uint64_t size;
    uint64_t offset;           /* filled by q3m_layout */
} q3m_section_out;

typedef struct {
    const char *name;
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS];
    uint64_t data_offset, data_size, scales_offset, scales_size; /* filled by q3m_layout */
} q3m_tensor_out;

/* Assign every blob its offset and build header + table (a heap buffer of
 * *head_len bytes, to be written at offset 0; the data region starts at
 * *head_len). *file_size gets the size of the finished file. */
int q3m_layout(q3m_section_out *secs, int n_secs, q3m_tensor_out *ts, int n_ts, q3_quant_scheme scheme,
               unsigned char **head, size_t *head_len, uint64_t *file_size);

#endif
