/* BF16P packing and the scalar decoder (see bf16p.h). */
#include "quant/bf16p.h"

#include <string.h>

static int exp_of(uint16_t h) { return (h >> 7) & 0xFF; }

/* The exponent field code 0 stands for in the block of 32 at b: the window
 * [off, off + 15] ends at the block's largest exponent. */
static int block_off(const uint16_t *b) {
    int emax = 0;
    for (int i = 0; i < 32; i++)
        if (exp_of(b[i]) > emax) emax = exp_of(b[i]);
    return emax > 15 ? emax - 15 : 0;
}

static int block_fits(const uint16_t *b, int off) {
    for (int i = 0; i < 32; i++)
        if (exp_of(b[i]) < off) return 0;
    return 1;
}

int q3_bf16p_group_fits(const uint16_t *src) {
    return block_fits(src, block_off(src)) && block_fits(src + 32, block_off(src + 32));
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Packs the group at src into g, or (not fitting) writes the raw group to
 * side[idx] (when side) and the index into g. Returns 1 for a raw group. */
static int pack_group(const uint16_t *src, uint8_t *g, uint8_t *side, size_t idx) {
    const int off[2] = {block_off(src), block_off(src + 32)};
    if (!block_fits(src, off[0]) || !block_fits(src + 32, off[1])) {
        memset(g, 0, Q3_BF16P_GROUP_BYTES);
        put_u32(g, 0x8000u | (uint32_t)(idx & 0x7FFF) | (uint32_t)(idx >> 15) << 16);
        if (side) {
            uint8_t *r = side + idx * Q3_BF16P_RAW_BYTES;
            for (int i = 0; i < 64; i++) {
                const uint16_t h = src[q3_bf16p_raw_elem(i)];
                r[2 * i] = (uint8_t)h, r[2 * i + 1] = (uint8_t)(h >> 8);
            }
        }
        return 1;
    }
    put_u32(g, (uint32_t)off[0] << 7 | (uint32_t)off[1] << 23);
    uint8_t nib[64];
    for (int p = 0; p < 64; p++) {
        const int e = q3_bf16p_elem_of(p);
        const uint16_t h = src[e];
        const int code = exp_of(h) - off[e / 32];
        g[4 + p] = (uint8_t)((code & 1) << 7 | (h & 0x7F));
        nib[p] = (uint8_t)((h >> 15) << 3 | code >> 1);
    }
    for (int q = 0; q < 32; q++) g[68 + q] = (uint8_t)(nib[q] | nib[q + 32] << 4);
    return 0;
}

size_t q3_bf16p_pack_row(const uint16_t *src, size_t cols, uint8_t *dst, uint8_t *side, size_t side_first) {
    size_t raw = 0;
    for (size_t c = 0; c < cols; c += Q3_BF16P_GROUP, dst += Q3_BF16P_GROUP_BYTES)
        raw += (size_t)pack_group(src + c, dst, side, side_first + raw);
    return raw;
}

size_t q3_bf16p_count_row(const uint16_t *src, size_t cols) {
    size_t raw = 0;
    for (size_t c = 0; c < cols; c += Q3_BF16P_GROUP) raw += !q3_bf16p_group_fits(src + c);
    return raw;
}

void q3_bf16p_unpack_row(const uint8_t *row, size_t cols, const uint8_t *side, size_t side_groups, uint16_t *dst) {
    for (size_t c = 0; c < cols; c += Q3_BF16P_GROUP, row += Q3_BF16P_GROUP_BYTES)
        q3_bf16p_unpack_group(row, side, side_groups, dst + c);
}

void q3_bf16p_unpack_group(const uint8_t *g, const uint8_t *side, size_t side_groups, uint16_t *dst) {
    const uint32_t hdr = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16 | (uint32_t)g[3] << 24;
    if (hdr & 0x8000u) {
        const size_t idx = (hdr & 0x7FFF) | (size_t)(hdr >> 16) << 15;
        const uint8_t *r = idx < side_groups ? side + idx * Q3_BF16P_RAW_BYTES : NULL;
        for (int i = 0; i < 64; i++) dst[q3_bf16p_raw_elem(i)] = r ? (uint16_t)(r[2 * i] | r[2 * i + 1] << 8) : 0x7FC0;
        return;
    }
    const unsigned off[2] = {(hdr >> 7) & 0xFF, (hdr >> 23) & 0xFF};
    for (int p = 0; p < 64; p++) {
        const int e = q3_bf16p_elem_of(p);
        const unsigned nib = (g[68 + p % 32] >> (p >= 32 ? 4 : 0)) & 15, l = g[4 + p];
        const unsigned code = (nib & 7) << 1 | l >> 7;
        dst[e] = (uint16_t)((nib >> 3) << 15 | ((code + off[e / 32]) & 0xFF) << 7 | (l & 0x7F));
    }
}
