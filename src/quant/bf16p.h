/* BF16P: BF16 weights packed losslessly in 12.5 bits per element.
 *
 * Decode of a memory-bound model reads every weight once per token, so
 * fewer bytes per weight is the one lever left once the GEMV streams at the
 * memory's rate. In trained (and random normal) weights the 32 values of a
 * block span few binades: the exponent fields of a block fit a window of 16
 * values below the block's largest, so 4 bits name each element's exponent,
 * and sign + 7 mantissa bits make the rest. Every BF16 value the window
 * holds comes back bit for bit; a group with a value outside (a tiny
 * element next to a large one) is kept whole, raw, in a side table.
 *
 * Groups of Q3_BF16P_GROUP = 64 consecutive elements of a row (blocks A =
 * elements 0-31 and B = 32-63), Q3_BF16P_GROUP_BYTES = 100 bytes each, a
 * row cols / 64 groups back to back:
 *   hdr  u32 (little-endian): packed group: low half offA << 7, high half
 *        offB << 7, where off is the exponent field the block's code 0
 *        stands for (bit 15 clear: off <= 240). Raw group: bit 15 set,
 *        side-table index = (hdr & 0x7FFF) | (hdr >> 16) << 15.
 *   L[64]   byte p: bit 7 = bit 0 of the element's code, bits 0-6 = its
 *           mantissa.
 *   N[32]   byte q: low nibble for L byte q, high nibble for L byte q + 32;
 *           a nibble = sign << 3 | code >> 1.
 * An element's exponent field = code + off of its block, so its BF16 word =
 * sign << 15 | (code + off) << 7 | mantissa. Which element L byte p holds is
 * q3_bf16p_elem_of(p): the order in which byte unpacks (16 bytes to a
 * 128-bit lane) give 16-bit words whose even words are elements 0-15 /
 * 16-31 and odd words 32-47 / 48-63, so that the SIMD decoders add each
 * word's block offset with one broadcast and widen with one shift or mask
 * (src/kernels/gemv_bf16p.c).
 * The side table (the tensor's "scales" blob in a .q3m) holds raw groups of
 * 64 BF16 words, 128 bytes each, in the decoders' word order: U0 words
 * 0-31 then U1 words 0-31, U0 word w = element 32 (w % 2) + w / 2, U1 word
 * w = element 16 + 32 (w % 2) + w / 2. */
#ifndef Q3_QUANT_BF16P_H
#define Q3_QUANT_BF16P_H

#include <stddef.h>
#include <stdint.h>

enum { Q3_BF16P_GROUP = 64, Q3_BF16P_GROUP_BYTES = 100, Q3_BF16P_RAW_BYTES = 128 };
/* Most raw groups a tensor can have (the header's 31-bit index). */
#define Q3_BF16P_RAW_MAX 0x7FFFFFFFu

/* Bytes of one packed row of cols (a multiple of 64) elements. */
static inline size_t q3_bf16p_row_bytes(size_t cols) { return cols / Q3_BF16P_GROUP * Q3_BF16P_GROUP_BYTES; }

/* The element (0-63) L byte p of a group holds. */
static inline int q3_bf16p_elem_of(int p) {
    const int lane = p / 16, i = p % 16, u = i >= 8, w = 8 * lane + i % 8;
    return 16 * u + 32 * (w % 2) + w / 2;
}
/* The element raw word i (0-63) of a side-table group holds. */
static inline int q3_bf16p_raw_elem(int i) { return (i >= 32 ? 16 : 0) + 32 * (i % 2) + (i % 32) / 2; }

/* Whether the 64 BF16 words fit a packed group. */
int q3_bf16p_group_fits(const uint16_t *src);
/* Packs one row of cols (a multiple of 64) BF16 words into dst
 * (q3_bf16p_row_bytes(cols)). Groups that do not fit become raw groups
 * with side-table indices from side_first on, written to side (128 bytes
 * each) unless side is NULL. Returns how many raw groups the row has. */
size_t q3_bf16p_pack_row(const uint16_t *src, size_t cols, uint8_t *dst, uint8_t *side, size_t side_first);
/* Raw groups a row would have. */
size_t q3_bf16p_count_row(const uint16_t *src, size_t cols);
/* The 64 BF16 words of packed group g in element order. A raw group's index
 * at or past side_groups (a damaged file) gives NaNs. */
void q3_bf16p_unpack_group(const uint8_t *g, const uint8_t *side, size_t side_groups, uint16_t *dst);
/* A packed row of cols elements as BF16 words (the scalar decoder). */
void q3_bf16p_unpack_row(const uint8_t *row, size_t cols, const uint8_t *side, size_t side_groups, uint16_t *dst);

#endif
