/* Prefill attention products on AMX tiles: the two matmuls of each
 * attention.c tile (S = K Q^T, then O^T += V^T P^T per key block) as
 * TDPBF16PS, around the same online softmax (the table's att_softmax).
 *
 * Precision. Q, K, V and P are fp32; each is split into three bf16 parts
 * (hi + mid + lo = the value exactly, q3_bf16_part), and each product
 * a * b is summed as the six part products above 2^-24 of it: hi hi, hi
 * mid, hi lo, mid hi, mid mid, lo hi. What is left out (mid lo, lo mid,
 * lo lo) is below 2^-23 of |a b|, about one fp32 rounding, and every part
 * product is exact in fp32: the sums are fp32 sums of the fp32 products
 * to within that. Six tile products against one FMA per element leave
 * the tiles 2.5x ahead on paper (q3moe bench's tile and FMA peaks); the
 * Xeon of BENCHMARKS.md ran attention at 4096 positions 1.6x faster.
 *
 * Layouts: the KV head's keys as whole A tiles (pack_kv), packed once per
 * KV head per prefill, keys past n zero; the tile's query rows as B tiles
 * (q3_amx_pack_split, D as k); P as B tiles of key pairs per 16 rows,
 * [key chunk of 32][row tile][part] (pack_p). */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/amx.h"
#include "kernels/attention.h"
#include "kernels/isa.h"

/* The six part products of two A tiles at(i, a) (lda bytes between rows)
 * with two B tiles bt(i, b), into C tiles 0-3 = (A 0, B 0), (A 0, B 1),
 * (A 1, B 0), (A 1, B 1): each loaded tile serves two products, 18 loads
 * per 24 products (one A tile against four B tiles: 27). at and bt are
 * macros of the caller's. */
#define QUAD(b)                                                        \
    do {                                                               \
        _tile_loadd(6, bt(0, b), 64);                                  \
        _tile_loadd(7, bt(1, b), 64);                                  \
        _tile_dpbf16ps(0, 4, 6);                                       \
        _tile_dpbf16ps(1, 4, 7);                                       \
        _tile_dpbf16ps(2, 5, 6);                                       \
        _tile_dpbf16ps(3, 5, 7);                                       \
    } while (0)
#define SIX_PRODUCTS(lda)                                              \
    do {                                                               \
        _tile_loadd(4, at(0, 0), lda);                                 \
        _tile_loadd(5, at(1, 0), lda);                                 \
        QUAD(0);                                                       \
        QUAD(1);                                                       \
        QUAD(2);                                                       \
        _tile_loadd(4, at(0, 1), lda);                                 \
        _tile_loadd(5, at(1, 1), lda);                                 \
        QUAD(0);                                                       \
        QUAD(1);                                                       \
        _tile_loadd(4, at(0, 2), lda);                                 \
        _tile_loadd(5, at(1, 2), lda);                                 \
        QUAD(0);                                                       \
    } while (0)

/* Words of one A tile (16 rows x 32 bf16). */
enum { TILE_W = 512 };

/* Keys [j0, j1) (multiples of 32) of one KV head, each A tile whole (1
 * KiB) in the order the products read them: K as tiles [key tile][k
 * block][part] (16 keys x 32 dimensions), then V^T by 16 x 16 transposes
 * as tiles [dimension tile][key chunk][part] (16 dimensions x 32 keys).
 * (Rows of the whole key range, 8 KiB apart at 4096 keys, shared cache
 * sets and ran the products at a quarter of the tile rate.) */
static void pack_kv(uint16_t *kv, int npad, int D, const float *k, const float *v, size_t stride, int n, int j0, int j1) {
    const int nkb = D / 32, nkc = npad / 32;
    uint16_t *vt = kv + (size_t)3 * npad * D;
    for (int j = j0; j < j1; j++)
        for (int kb = 0; kb < nkb; kb++) {
            __m512 lo = _mm512_setzero_ps(), hi = lo;
            if (j < n) lo = _mm512_loadu_ps(k + (size_t)j * stride + 32 * kb), hi = _mm512_loadu_ps(k + (size_t)j * stride + 32 * kb + 16);
            uint16_t *dst = kv + ((size_t)(j / 16) * nkb + kb) * 3 * TILE_W + (j % 16) * 32;
#pragma GCC unroll 3
            for (int c = 0; c < 3; c++) _mm512_storeu_si512(dst + c * TILE_W, q3_bf16_part(&lo, &hi));
        }
    for (int c0 = j0; c0 < j1; c0 += 32)
        for (int d = 0; d < D; d += 16) {
            __m512i a[16], b[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                a[i] = c0 + i < n ? _mm512_loadu_si512(v + (size_t)(c0 + i) * stride + d) : _mm512_setzero_si512();
                b[i] = c0 + 16 + i < n ? _mm512_loadu_si512(v + (size_t)(c0 + 16 + i) * stride + d) : _mm512_setzero_si512();
            }
            q3_transpose16(a);
            q3_transpose16(b);
            uint16_t *dst = vt + ((size_t)(d / 16) * nkc + c0 / 32) * 3 * TILE_W;
            for (int i = 0; i < 16; i++) {
                __m512 lo = _mm512_castsi512_ps(a[i]), hi = _mm512_castsi512_ps(b[i]);
#pragma GCC unroll 3
                for (int c = 0; c < 3; c++) _mm512_storeu_si512(dst + c * TILE_W + 32 * i, q3_bf16_part(&lo, &hi));
            }
        }
}

static void pack_q(uint32_t *qp, const float *qr, int R, int D) { q3_amx_pack_split(qp, qr, (size_t)D, R, D); }

/* s[j][r] for the keys j0 + j, j < nk rounded up to 32 (R floats per
 * row): per pair of row tiles, pairs of 16-key tiles. */
static void scores(float *s, int R, const uint16_t *kv, int npad, int D, const uint32_t *qp, int j0, int nk) {
    q3_amx_tiles_on();
    (void)npad;
    const int nkb = D / 32;
    for (int rt = 0; rt < R / 16; rt += 2)
        for (int kt = 0; kt < (nk + 15) / 16; kt += 2) {
            const uint16_t *kt0 = kv + (size_t)((j0 / 16 + kt) * nkb) * 3 * TILE_W;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kb = 0; kb < nkb; kb++) {
#define at(i, a) (kt0 + ((size_t)((i) * nkb + kb) * 3 + (a)) * TILE_W)
#define bt(i, b) (qp + (((size_t)(rt + (i)) * nkb + kb) * 3 + (b)) * Q3_TILE_DW)
                SIX_PRODUCTS(64);
#undef at
#undef bt
            }
            float *c = s + (size_t)16 * kt * R + 16 * rt;
            _tile_stored(0, c, R * 4);
            _tile_stored(1, c + 16, R * 4);
            _tile_stored(2, c + (size_t)16 * R, R * 4);
            _tile_stored(3, c + (size_t)16 * R + 16, R * 4);
        }
}

/* P = the first nk rows of s (keys past them zero) as B tiles of key
 * pairs: pair i of a 32-key chunk, row r holds (P[2i][r], P[2i+1][r]). */
static void pack_p(uint32_t *pp, const float *s, int R, int nk) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i pairs = _mm512_loadu_si512(order);
    const int nrt = R / 16;
    for (int kc = 0; kc < (nk + 31) / 32; kc++)
        for (int rt = 0; rt < nrt; rt++) {
            uint32_t *dst = pp + ((size_t)kc * nrt + rt) * 3 * Q3_TILE_DW;
            for (int i = 0; i < 16; i++) {
                const int j = 32 * kc + 2 * i;
                __m512 lo = j < nk ? _mm512_loadu_ps(s + (size_t)j * R + 16 * rt) : _mm512_setzero_ps();
                __m512 hi = j + 1 < nk ? _mm512_loadu_ps(s + (size_t)(j + 1) * R + 16 * rt) : _mm512_setzero_ps();
#pragma GCC unroll 3
                for (int c = 0; c < 3; c++)
                    _mm512_storeu_si512(dst + c * Q3_TILE_DW + 16 * i, _mm512_permutexvar_epi16(pairs, q3_bf16_part(&lo, &hi)));
            }
        }
}

/* o[d][r] += sum over the nk keys from j0 of P[j][r] V[j0 + j][d]: per
 * pair of row tiles, pairs of 16-dimension tiles. */
static void pv(float *o, int R, const uint16_t *kv, int npad, int D, uint32_t *pp, const float *s, int j0, int nk) {
    pack_p(pp, s, R, nk);
    q3_amx_tiles_on();
    const int nkc = npad / 32;
    const uint16_t *vt = kv + (size_t)3 * npad * D;
    const int nrt = R / 16;
    for (int rt = 0; rt < nrt; rt += 2)
        for (int dt = 0; dt < D / 16; dt += 2) {
            float *c = o + (size_t)16 * dt * R + 16 * rt;
            _tile_loadd(0, c, R * 4);
            _tile_loadd(1, c + 16, R * 4);
            _tile_loadd(2, c + (size_t)16 * R, R * 4);
            _tile_loadd(3, c + (size_t)16 * R + 16, R * 4);
            for (int kc = 0; kc < (nk + 31) / 32; kc++) {
#define at(i, a) (vt + ((size_t)((dt + (i)) * nkc + j0 / 32 + kc) * 3 + (a)) * TILE_W)
#define bt(i, b) (pp + (((size_t)kc * nrt + rt + (i)) * 3 + (b)) * Q3_TILE_DW)
                SIX_PRODUCTS(64);
#undef at
#undef bt
            }
            _tile_stored(0, c, R * 4);
            _tile_stored(1, c + 16, R * 4);
            _tile_stored(2, c + (size_t)16 * R, R * 4);
            _tile_stored(3, c + (size_t)16 * R + 16, R * 4);
        }
}
#undef QUAD
#undef SIX_PRODUCTS

void q3_amx_attention_kernels(q3_isa_kernels *k) {
    k->att_pack_kv = pack_kv;
    k->att_pack_q = pack_q;
    k->att_scores = scores;
    k->att_pv = pv;
}
#pragma GCC pop_options
