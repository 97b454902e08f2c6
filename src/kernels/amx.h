/* What the AMX kernels share (gemm_amx.c, attention_amx.c): the tile
 * shapes, B tiles made by register transposes, and fp32 split into bf16
 * parts. Every tile is 16 rows of 64 bytes: as A, 16 rows x 32 bf16; as
 * B, 16 word pairs x 16 columns (pair p of column t, (x[t][2p],
 * x[t][2p+1]), at dword 16 p + t); as C, 16 x 16 fp32. Include after a
 * target pragma with avx512bf16 and amx-bf16. */
#ifndef Q3_AMX_H
#define Q3_AMX_H

#include <immintrin.h>
#include <stdint.h>

/* Dwords of one tile. */
enum { Q3_TILE_DW = 256 };

/* A tile configuration (LDTILECFG's 64 bytes). Keep each in a static
 * object: GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes,
 * so stores to a stack copy could be dropped (a #GP). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) q3_tile_config;

/* Loads cfg into the calling thread's tile registers unless it is the one
 * they hold (Linux grants the tile state per process; each thread loads
 * its shapes). */
void q3_amx_tiles_load(const q3_tile_config *cfg);

/* The shapes of the bf16 GEMMs and attention: every tile 16 rows of 64 bytes. */
void q3_amx_tiles_on(void);

/* T rows of K fp32 (ldx apart) as B tiles of three bf16 parts each:
 * bp[((tb * K/32 + kb) * 3 + c) * Q3_TILE_DW + p * 16 + t] holds part c
 * of the pair p of k block kb of row 16 tb + t (rows past T zero). */
void q3_amx_pack_split(uint32_t *bp, const float *x, size_t ldx, int T, int K);

/* r[p] lane t <- r[t] lane p (16 x 16 dwords): two unpack stages within
 * 128-bit lanes, two stages of 128-bit lane shuffles. */
static inline __attribute__((always_inline)) void q3_transpose16(__m512i r[16]) {
    __m512i a[16], b[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) { /* b[i + e], 128-bit lane L: dword e of lane L of rows i .. i+3 */
        b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]), b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]), b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        const __m512i v = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x88), w = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xDD);
        const __m512i v2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x88), w2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xDD);
        r[e] = _mm512_shuffle_i32x4(v, v2, 0x88), r[8 + e] = _mm512_shuffle_i32x4(v, v2, 0xDD);
        r[4 + e] = _mm512_shuffle_i32x4(w, w2, 0x88), r[12 + e] = _mm512_shuffle_i32x4(w, w2, 0xDD);
    }
}

/* A B tile from 16 columns' pairs (h[t]: column t's 16 pairs), one store per pair. */
static inline __attribute__((always_inline)) void q3_put_tile(uint32_t *tile, __m512i h[16]) {
    q3_transpose16(h);
#pragma GCC unroll 16
    for (int p = 0; p < 16; p++) _mm512_storeu_si512(tile + 16 * p, h[p]);
}

static inline __attribute__((always_inline)) __m512 q3_widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One bf16 part of 32 fp32 values (lo: the first 16, hi: the rest): their
 * rounding to bf16 as 32 words in order, each vector left holding the
 * exact rest. Three parts in a row hold 24 significant bits, so the value
 * exactly (unless a part falls below 2^-126, where the tile products flush
 * it to zero). */
static inline __attribute__((always_inline)) __m512i q3_bf16_part(__m512 *lo, __m512 *hi) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(*hi, *lo);
    *lo = _mm512_sub_ps(*lo, q3_widen_bf16(_mm512_castsi512_si256(h)));
    *hi = _mm512_sub_ps(*hi, q3_widen_bf16(_mm512_extracti64x4_epi64(h, 1)));
    return h;
}

#endif
