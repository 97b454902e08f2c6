#include "kernels/attention.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels/isa.h"

/* Running softmax state of one (query, head): max m, normaliser l, output o[D]. */
typedef struct {
    float m, l;
} sm_state;

/* Fold keys [j0, j1) into (st, o) for one query vector (decode's blocks). */
static void fold_block(const q3_isa_kernels *K, const q3_attn_layer *L, const float *q, int kvh, int j0, int j1,
                       float scale, sm_state *st, float *o) {
    const int D = L->head_dim;
    float s[Q3_ATT_BLOCK];
    float mx = st->m;
    for (int j = j0; j < j1; j++) {
        s[j - j0] = K->dot(q, L->k + (size_t)j * L->kv_stride + (size_t)kvh * L->head_stride, D) * scale;
        if (s[j - j0] > mx) mx = s[j - j0];
    }
    float corr = expf(st->m - mx); /* st->m = -inf on the first block gives 0 */
    if (st->l > 0) K->scale(o, corr, D);
    float l = st->l * corr;
    for (int j = j0; j < j1; j++) {
        float p = expf(s[j - j0] - mx);
        l += p;
        K->axpy(o, p, L->v + (size_t)j * L->kv_stride + (size_t)kvh * L->head_stride, D);
    }
    st->m = mx;
    st->l = l;
}

/* Query rows of a tile for the AMX products (att_scores): every K and V
 * tile they load from L2 then serves more rows (kernel_bench attn,
 * Qwen3-30B-A3B heads, 4096 positions: see BENCHMARKS.md). */
enum { TILE_PRODUCT_ROWS = 256 };

/* Prefill tiles: BQ consecutive query tokens x the g query heads of one KV
 * head (GQA), so every K/V block loaded serves g * BQ query rows; rows are
 * padded to a multiple of Q3_ATT_ROWS (the lanes of the ISA's tile kernels).
 * 64 rows measured faster than 128: less masked work on the diagonal and the
 * tile's Q^T / scores stay in L1/L2. */
static int tile_tokens(int g, int tiles) {
    const int rows = tiles ? TILE_PRODUCT_ROWS : Q3_ATT_ROWS;
    return g >= rows ? 1 : rows / g;
}
static int tile_rows(int g, int tiles) { return (g * tile_tokens(g, tiles) + Q3_ATT_ROWS - 1) / Q3_ATT_ROWS * Q3_ATT_ROWS; }
/* Per-thread tile workspace: Q^T and O^T [D][R] (on tiles Q as rows
 * [R][D]), scores [BLOCK][R], m, l and two limit rows; on tiles also the
 * packed Q and P, 3 R (D + BLOCK) / 2 dwords. */
static size_t tile_floats(int R, int D, int tiles) {
    return (size_t)R * (2 * (size_t)D + Q3_ATT_BLOCK + 4) + (tiles ? (size_t)3 * R * ((size_t)D + Q3_ATT_BLOCK) / 2 : 0);
}
/* Keys the packed K and V of the tile products hold: n rounded up to 32. */
static int tile_keys(int n) { return (n + 31) / 32 * 32; }
/* The tile products where the table has them and they pay: at least 512
 * keys and 4 tiles per KV head (the heads go one at a time, and each
 * packs its keys first). kernel_bench attn, Qwen3-30B-A3B heads, per
 * layer, FMAs against tiles: 128 positions 0.9 / 1.2 ms, 256 2.9 / 3.0,
 * 512 9.3 / 8.0, 4096 537 / 329. Not the thread count: results must not
 * depend on it. */
static int use_tiles(const q3_isa_kernels *K, int D, int g, int T, int pos0) {
    const int bq = tile_tokens(g, 1);
    return K->att_scores && D % 32 == 0 && pos0 + T >= 512 && (T + bq - 1) / bq >= 4;
}

size_t q3_attention_scratch(int n_heads, int head_dim, int ctx) {
    size_t blocks = ((size_t)ctx + Q3_ATT_BLOCK - 1) / Q3_ATT_BLOCK;
    size_t dec = (size_t)n_heads * blocks * ((size_t)head_dim + 2);
    /* tile_rows grows with g, and g <= n_heads. Decode and prefill never run
     * at once, so they share the space. */
    const size_t threads = (size_t)omp_get_max_threads();
    size_t pre = threads * tile_floats(tile_rows(n_heads, 0), head_dim, 0);
    /* Room for the tile products wherever the CPU has them (a table may be
     * forced later): one KV head's packed K and V before the per-thread
     * space, from the first 64-byte boundary. */
    q3_isa_current();
    if (q3_amx_usable() && head_dim % 32 == 0) {
        const size_t amx = 16 + q3_att_kv_floats(tile_keys(ctx), head_dim) + threads * tile_floats(tile_rows(n_heads, 1), head_dim, 1);
        pre = amx > pre ? amx : pre;
    }
    return dec > pre ? dec : pre;
}

/* One tile: query tokens [t0, t0 + BQ) x heads [kvh * g, (kvh + 1) * g), over
 * key blocks [j0, j0 + BLOCK) up to the tile's last position. Rows sit in
 * vector lanes (Q^T, S^T, O^T layouts), so S = K Q^T and O^T += V^T P^T are
 * both att_mm calls and the softmax bookkeeping is one lane per row. On
 * AMX the two products are att_scores and att_pv instead, on the KV head
 * packed into bf16 parts at kv (npad keys; NULL: att_mm), and a tile has
 * TILE_PRODUCT_ROWS rows. */
static void prefill_tile(const q3_isa_kernels *K, float *out, const float *q, int T, int pos0, const q3_attn_layer *L,
                         int kvh, int t0, float *w, const uint16_t *kv, int npad) {
    const int H = L->n_heads, D = L->head_dim, g = H / L->n_kv_heads, R = tile_rows(g, kv != NULL), bq = tile_tokens(g, kv != NULL);
    const int nt = T - t0 < bq ? T - t0 : bq, rows = nt * g;
    const float scale = 1.0f / sqrtf((float)D);
    float *qt = w, *o = qt + (size_t)D * R, *s = o + (size_t)D * R, *m = s + (size_t)Q3_ATT_BLOCK * R;
    float *l = m + R, *lim = l + R, *rel = lim + R;
    uint32_t *qp = (uint32_t *)(rel + R), *pp = qp + (size_t)3 * R * D / 2;
    /* Q^T for att_mm, Q rows for the tile products */
    const size_t qr = kv ? (size_t)D : 1, qd = kv ? 1 : (size_t)R;
    for (int r = 0; r < R; r++) {
        /* Row r: token t0 + r / g, head kvh * g + r % g. Padding rows get
         * q = 0 and see every key of the tile, so they stay finite. */
        const int tr = r < rows ? r / g : nt - 1;
        const float *src = q + ((size_t)(t0 + tr) * H + (size_t)kvh * g + r % g) * D;
        for (int d = 0; d < D; d++) qt[(size_t)d * qd + (size_t)r * qr] = r < rows ? src[d] : 0.0f;
        m[r] = -INFINITY, l[r] = 0;
        lim[r] = (float)(pos0 + t0 + tr); /* last key the row may see (exact: positions < 2^24) */
    }
    if (kv) K->att_pack_q(qp, qt, R, D);
    memset(o, 0, (size_t)D * R * sizeof(float));
    const int last = pos0 + t0 + nt - 1;
    for (int j0 = 0; j0 <= last; j0 += Q3_ATT_BLOCK) {
        const int nk = last + 1 - j0 < Q3_ATT_BLOCK ? last + 1 - j0 : Q3_ATT_BLOCK;
        const size_t off = (size_t)j0 * L->kv_stride + (size_t)kvh * L->head_stride;
        if (kv) K->att_scores(s, R, kv, npad, D, qp, j0, nk);
        else K->att_mm(s, L->k + off, L->kv_stride, 1, qt, R, nk, D, 0);
        /* The causal mask matters only where the block passes the tile's first position. */
        const int diag = j0 + nk - 1 > pos0 + t0;
        if (diag)
            for (int r = 0; r < R; r++) rel[r] = lim[r] - (float)j0;
        K->att_softmax(s, nk, R, scale, diag ? rel : NULL, m, l, o, D);
        if (kv) K->att_pv(o, R, kv, npad, D, pp, s, j0, nk);
        else K->att_mm(o, L->v + off, 1, L->kv_stride, s, R, D, nk, 1);
    }
    for (int r = 0; r < rows; r++) {
        float *dst = out + ((size_t)(t0 + r / g) * H + (size_t)kvh * g + r % g) * D;
        const float inv = 1.0f / l[r];
        for (int d = 0; d < D; d++) dst[d] = o[(size_t)d * R + r] * inv;
    }
}

static void prefill(const q3_isa_kernels *K, float *out, const float *q, int T, int pos0, const q3_attn_layer *L,
                    float *scratch) {
    const int KVH = L->n_kv_heads, g = L->n_heads / KVH, tiles = use_tiles(K, L->head_dim, g, T, pos0);
    const int bq = tile_tokens(g, tiles), nqb = (T + bq - 1) / bq;
    if (tiles) {
        /* One KV head at a time: its keys packed by all threads, then its tiles. */
        const int D = L->head_dim, npad = tile_keys(pos0 + T);
        /* Tiles on 64-byte lines: an unaligned one spans 17 (the products ran at half speed). */
        uint16_t *kv = (uint16_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
        float *work = (float *)kv + q3_att_kv_floats(npad, D);
        const size_t ws = tile_floats(tile_rows(g, 1), D, 1);
        for (int kvh = 0; kvh < KVH; kvh++) {
            const size_t off = (size_t)kvh * L->head_stride;
#pragma omp parallel for schedule(static)
            for (int c = 0; c < npad / 32; c++)
                K->att_pack_kv(kv, npad, D, L->k + off, L->v + off, L->kv_stride, pos0 + T, 32 * c, 32 * c + 32);
#pragma omp parallel for schedule(dynamic, 1)
            for (int it = 0; it < nqb; it++)
                prefill_tile(K, out, q, T, pos0, L, kvh, (nqb - 1 - it) * bq, work + (size_t)omp_get_thread_num() * ws, kv,
                             npad);
        }
        return;
    }
    const size_t ws = tile_floats(tile_rows(g, 0), L->head_dim, 0);
    /* Latest query blocks (the most keys) first, one tile at a time: the
     * causal triangle balances over the threads. Each tile is computed by one
     * thread in a fixed order, so the result does not depend on the count. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int it = 0; it < nqb * KVH; it++)
        prefill_tile(K, out, q, T, pos0, L, it % KVH, (nqb - 1 - it / KVH) * bq,
                     scratch + (size_t)omp_get_thread_num() * ws, NULL, 0);
}

/* Decode attention with an att_decode kernel: the g query heads of KV head
 * kvh over key block b, at most Q3_DEC_GROUP heads per call, so each K and
 * V row is read once for all of them. */
static void decode_group(const q3_isa_kernels *K, const float *q, const q3_attn_layer *L, int n, int kvh, int b, int nb,
                         float scale, float *scratch) {
    const int D = L->head_dim, g = L->n_heads / L->n_kv_heads;
    const size_t rec = (size_t)D + 2, stride = L->kv_stride;
    const int j0 = b * Q3_ATT_BLOCK, nk = n - j0 < Q3_ATT_BLOCK ? n - j0 : Q3_ATT_BLOCK;
    const size_t off = (size_t)j0 * stride + (size_t)kvh * L->head_stride;
    const float *k = L->k + off, *v = L->v + off;
    float *st = scratch + ((size_t)kvh * g * nb + b) * rec; /* head kvh * g + h at st + h * nb * rec */
    for (int h = 0; h < g; h++) {
        float *r = st + (size_t)h * nb * rec;
        r[0] = -INFINITY, r[1] = 0;
        memset(r + 2, 0, (size_t)D * sizeof(float));
    }
    for (int h0 = 0; h0 < g; h0 += Q3_DEC_GROUP)
        K->att_decode(q + ((size_t)kvh * g + h0) * D, g - h0 < Q3_DEC_GROUP ? g - h0 : Q3_DEC_GROUP, k, v, stride, nk, D,
                      scale, st + (size_t)h0 * nb * rec, (size_t)nb * rec);
}

static void decode(const q3_isa_kernels *K, float *out, const float *q, int pos, const q3_attn_layer *L, float *scratch) {
    const int H = L->n_heads, D = L->head_dim, group = H / L->n_kv_heads, n = pos + 1;
    const int nb = (n + Q3_ATT_BLOCK - 1) / Q3_ATT_BLOCK;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t rec = (size_t)D + 2; /* per (head, block): m, l, o[D] */
    if (K->att_decode && D % 16 == 0 && D <= Q3_DEC_DMAX) {
        const int KVH = L->n_kv_heads;
#pragma omp parallel for collapse(2) schedule(static) if (n > Q3_ATT_BLOCK)
        for (int kvh = 0; kvh < KVH; kvh++)
            for (int b = 0; b < nb; b++) decode_group(K, q, L, n, kvh, b, nb, scale, scratch);
    } else
#pragma omp parallel for collapse(2) schedule(static) if (n > Q3_ATT_BLOCK)
    for (int h = 0; h < H; h++)
        for (int b = 0; b < nb; b++) {
            float *r = scratch + ((size_t)h * nb + b) * rec;
            sm_state st = {-INFINITY, 0};
            memset(r + 2, 0, (size_t)D * sizeof(float));
            int j0 = b * Q3_ATT_BLOCK, j1 = j0 + Q3_ATT_BLOCK < n ? j0 + Q3_ATT_BLOCK : n;
            fold_block(K, L, q + (size_t)h * D, h / group, j0, j1, scale, &st, r + 2);
            r[0] = st.m;
            r[1] = st.l;
        }
    for (int h = 0; h < H; h++) {
        const float *r = scratch + (size_t)h * nb * rec;
        float m = -INFINITY, l = 0;
        for (int b = 0; b < nb; b++) m = r[b * rec] > m ? r[b * rec] : m;
        float *o = out + (size_t)h * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int b = 0; b < nb; b++) {
            float w = expf(r[b * rec] - m);
            l += r[b * rec + 1] * w;
            K->axpy(o, w, r + b * rec + 2, D);
        }
        K->scale(o, 1.0f / l, D);
    }
}

static _Thread_local double g_seconds;

void q3_attention_seconds_reset(void) { g_seconds = 0; }
double q3_attention_seconds(void) { return g_seconds; }

void q3_attention(float *out, const float *q, int T, int pos0, const q3_attn_layer *L, float *scratch) {
    const q3_isa_kernels *K = q3_isa_current();
    const double t0 = omp_get_wtime();
    if (T == 1) decode(K, out, q, pos0, L, scratch);
    else prefill(K, out, q, T, pos0, L, scratch);
    g_seconds += omp_get_wtime() - t0;
}
