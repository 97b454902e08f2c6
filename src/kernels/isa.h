/* The per-ISA kernel table behind kernels.h. Each variant implements the
 * same two primitives; matmul.c drives them (blocking, threads). */
#ifndef Q3_ISA_H
#define Q3_ISA_H

#include "kernels/kernels.h"

/* GEMM blocking: panels of NR weight rows, K blocks of KC; token tiles of
 * `mr` rows (per ISA, at most Q3_MR_MAX). */
enum { Q3_NR = 16, Q3_KC = 256, Q3_MR = 6, Q3_MR_MAX = 14 };
/* Kernels with tokens in vector lanes (the A8 and weights-broadcast GEMMs):
 * tokens per activation panel, longest reduction. Longer products run as
 * several passes of Q3_LANE_TOKENS tokens (of bc_max_t where gemm_bc is
 * the only lane kernel). */
enum { Q3_LANE_TOKENS = 48, Q3_LANE_KMAX = 8192 };
/* Words of the decoded-weights scratch (wbuf) gemm_a8 and gemm_wo take. */
enum { Q3_MX_WBUF_WORDS = 16 * (Q3_LANE_KMAX + 32) };
/* Most tokens any ISA's gemm_bc takes in one pass (bc_max_t). */
enum { Q3_BC_TOKENS_MAX = 128 };

/* Query rows of a prefill attention tile are a multiple of this (the widest
 * row chunk a variant's att_mm processes at once). */
enum { Q3_ATT_ROWS = 64 };
/* Most query heads and longest head one att_decode call takes. */
enum { Q3_DEC_GROUP = 8, Q3_DEC_DMAX = 256 };

typedef struct {
    int mr; /* token rows per micro tile */
    /* out[r - r0] = dot(x, W[r, :]) for r in [r0, r1): one token, weights streamed once. */
    void (*gemv)(float *out, const float *x, const q3_mat *W, int r0, int r1);
    /* C[t][j] (+)= sum_{k<kc} A[t * lda + k * ska] * Bp[k][j] for t < mt (<= mr), j < nt (<= NR):
     * the token rows as stored (lda = their stride, ska = 1) or packed by
     * matmul.c into a tile (lda = 1, ska = mr); Bp is a packed panel
     * [kc][NR]; accumulate=0 overwrites C. */
    void (*micro)(const float *A, size_t lda, size_t ska, const float *Bp, int kc, float *C, size_t ldc, int mt, int nt,
                  int accumulate);
    /* Few tokens (T <= small_t): out[t][r] for r in [r0, r1), straight from the
     * stored rows (no packing), weights widened once per token block.
     * Plain dtypes with contiguous rows only; NULL: not available. */
    int small_t;
    void (*gemm_small)(float *out, size_t ldo, const float *x, size_t ldx, int T, const q3_mat *W, int r0, int r1);
    /* q3_pack_panel for contiguous rows (cs == 1); NULL: use the generic one. */
    void (*pack)(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc);
    /* Dense fp32 vector primitives for attention. */
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n); /* y += a * x */
    void (*scale)(float *y, float a, int n);                /* y *= a */
    /* Prefill attention tiles (attention.c drives them). The R query rows of
     * a tile (R a multiple of Q3_ATT_ROWS) sit in vector lanes, so both
     * products and the softmax bookkeeping are vertical, lane-per-row.
     * att_mm: C[i][r] (+)= sum_{k<nk} A[i*si + k*sk] * B[k][r] for i < ni,
     * r < R (B and C rows R floats long; accumulate=0 overwrites C); every
     * element sums over k in order. */
    void (*att_mm)(float *C, const float *A, size_t si, size_t sk, const float *B, int R, int ni, int nk, int accumulate);
    /* att_softmax: one key block of online softmax on S[nk][R] raw scores:
     * s = S * scale, -inf where lim && j > lim[r]; m[r] = max(m[r], s);
     * S = exp(s - m); l = l * corr + sum_j S; O[d][r] *= corr for d < D,
     * with corr = exp(m_old - m) (0 while m_old = -inf). */
    void (*att_softmax)(float *S, int nk, int R, float scale, const float *lim, float *m, float *l, float *O, int D);
    /* Decode attention for the G (<= Q3_DEC_GROUP) query heads sharing one
     * KV head, q[h * D ...], over nk (<= Q3_ATT_BLOCK) keys: key j at
     * k + j * stride, value j at v + j * stride. Folds them into each
     * head's running softmax state at st + h * sts: [0] = m (max score),
     * [1] = l (normaliser), [2 ..] = o[D] (unnormalised output), which start
     * as -inf, 0, 0. D % 16 == 0, D <= Q3_DEC_DMAX; NULL: not available
     * (attention.c then goes key by key with dot and axpy). */
    void (*att_decode)(const float *q, int G, const float *k, const float *v, size_t stride, int nk, int D, float scale,
                       float *st, size_t sts);
    /* The two products of prefill_tile on AMX tiles (NULL: att_mm), for
     * head_dim D % 32 == 0 (R is a multiple of Q3_ATT_ROWS): each fp32
     * operand as three bf16 parts, each product as the six part products
     * above 2^-24 of it (attention_amx.c). att_pack_kv writes keys [j0, j1)
     * (multiples of 32) of one KV head (key j at k + j * stride, its value
     * at v + j * stride; keys from n on as zeros) into kv (q3_att_kv_floats),
     * as whole A tiles. att_pack_q writes a tile's query
     * rows qr[R][D] into qp (3 R D / 2 dwords). att_scores: s[j][r] = sum_d
     * K[j0 + j][d] q[r][d] for j < nk rounded up to 32. att_pv: o[d][r] +=
     * sum_{j < nk} s[j][r] V[j0 + j][d] (pp: 3 Q3_ATT_BLOCK R / 2 dwords of
     * scratch). */
    void (*att_pack_kv)(uint16_t *kv, int npad, int D, const float *k, const float *v, size_t stride, int n, int j0, int j1);
    void (*att_pack_q)(uint32_t *qp, const float *qr, int R, int D);
    void (*att_scores)(float *s, int R, const uint16_t *kv, int npad, int D, const uint32_t *qp, int j0, int nk);
    void (*att_pv)(float *o, int R, const uint16_t *kv, int npad, int D, uint32_t *pp, const float *s, int j0, int nk);
    /* Element-wise activation helpers (NULL: the scalar code in ops.c and
     * quant/mx.c). mx8_fake_quant: q3_mx_fake_quant_row(Q3_MXFP8, ...) bit
     * for bit (n % 32 == 0; -1, writing nothing, when x holds NaN/Inf);
     * mxi8_fake_quant the same for Q3_MXINT8.
     * swiglu: out = silu(gate) * up, within a few ulp of the scalar expf. */
    int (*mx8_fake_quant)(const float *x, size_t n, float *y);
    int (*mxi8_fake_quant)(const float *x, size_t n, float *y);
    void (*swiglu)(float *out, const float *gate, const float *up, int n);
    /* MX GEMV on a prepared input (MXFP8 / MXFP4 weights, cols % 64 == 0
     * for MXFP8, % 128 for MXFP4; NULL: not available): mx_prep writes
     * x[0..K) in the order gemv_mx reads for weights of dtype wt (an fp32
     * permutation, scaled by a power of two, at most 4 * K bytes: exact
     * for any input); gemv_mx is gemv on that copy. */
    void (*mx_prep)(void *xb, const float *x, int K, q3_dtype wt);
    void (*gemv_mx)(float *out, const void *xb, const q3_mat *W, int r0, int r1);
    /* gemv_mx for T tokens in one pass over the MXFP4 / MXFP8 weights
     * q3_mx_wide_fits takes (NULL: one gemv_mx per token): the T copies
     * mx_prep wrote at xb, xs bytes apart; out[t * ldo + r - r0], each bit
     * for bit gemv_mx's. */
    void (*gemv_mx_tokens)(float *out, size_t ldo, const void *xb, size_t xs, int T, const q3_mat *W, int r0, int r1);
    /* The same GEMV for A8 linears (W->a8: MXFP8 or MXINT8 inputs) where
     * the table has a faster one for them (NULL: gemv_mx serves them too):
     * on AVX-512 BF16 a8_prep writes the input as bf16, exact only for such
     * inputs. */
    void (*a8_prep)(void *xb, const float *x, int K, q3_dtype wt);
    void (*gemv_a8)(float *out, const void *xb, const q3_mat *W, int r0, int r1);
    /* gemv_a8 for T tokens, one pass over the weights per a8_tokens_t of
     * them (the T copies a8_prep wrote, xs bytes apart; out[t * ldo + r -
     * r0], each bit for bit gemv_a8's); where present it takes products of
     * 2 .. a8_tokens_t tokens before the A8 GEMM. */
    void (*gemv_a8_tokens)(float *out, size_t ldo, const void *xb, size_t xs, int T, const q3_mat *W, int r0, int r1);
    int a8_tokens_t;
    int a8_max_t; /* <= Q3_BC_TOKENS_MAX */
    /* Weight-only MXFP4 / MXFP8 products (fp32 inputs; NULL: not
     * available), bc_min_t .. bc_max_t tokens, the shapes gemm_a8 takes:
     * wo_pack_act writes the T input rows as tile_parts * K/2 * TP words
     * (rows: scratch of 17 * tile_parts * K words), gemm_wo computes
     * out[t][r] from them (wbuf as gemm_a8's), or returns 0, computing
     * nothing, where a scale of these rows does not fold exactly (the
     * broadcast GEMM then takes the rows). */
    void (*wo_pack_act)(uint32_t *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt, uint16_t *rows);
    int (*gemm_wo)(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf);
    /* A8 GEMM for 2 .. Q3_LANE_TOKENS tokens (a8_max_t where set; K <= Q3_LANE_KMAX):
     * a8_pack_act writes the T input rows as bf16 pairs in gemv_a8's
     * element order, at most K/2 * TP words (TP = T rounded up to 16): a
     * lane panel for whole vectors of 16 tokens and rows for the rest
     * (lane_rem.h; row: scratch of K words); gemm_a8 computes
     * out[t][r] for r in [r0, r1), t < T, from it, with the block scales
     * folded into the bf16 weights (wbuf: scratch of Q3_MX_WBUF_WORDS words). It
     * returns 0, computing nothing, when a scale of these rows is outside
     * the range that folding keeps exact; the caller then uses the fp32
     * kernels. */
    void (*a8_pack_act)(uint32_t *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt, uint16_t *row);
    int (*gemm_a8)(float *out, size_t ldo, const uint32_t *ap, int T, const q3_mat *W, int r0, int r1, uint16_t *wbuf);
    /* gemm_a8 and gemm_wo are given all the consecutive panels of a job
     * that a thread takes in prefill at once (else one panel per call). */
    int mx_panels;
    /* Weights-broadcast GEMM (plain dtypes, MX too where bc_mx; cs == 1,
     * K % 16 == 0, 2 .. bc_max_t tokens, K <= Q3_LANE_KMAX; NULL: not
     * available): bc_pack_act writes the T rows of x as ap[K][TP] (TP = T
     * rounded up to 16, padding zero; its k order may depend on the
     * weights' dtype wt; on AVX-512 chunks of 48 tokens, each one's last
     * few tokens as rows; on AVX2 TP = T rounded down to 8 (up below 8
     * tokens), the T % 8 tokens past it as rows, and rows of k may be TP + 8
     * apart: at most (Q3_BC_TOKENS_MAX + 8) * K + 16 * 16 floats in all);
     * gemm_bc computes out[t][r], r in [r0, r1), t < T, widening each
     * weight row once (wbuf: Q3_NR * (K + 16) floats of scratch). */
    void (*bc_pack_act)(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt);
    /* bc_mx: gemm_bc also takes MX weights (cols % 64 == 0); bc_bf16p:
     * BF16P weights, as BF16 (else matmul.c unpacks their rows to BF16 for
     * the BF16 kernels). lane_split: longer products run as several passes
     * of the lane GEMMs (else they take the panel GEMM). */
    int bc_mx, bc_bf16p, lane_split;
    /* Most tokens gemm_bc takes (<= Q3_BC_TOKENS_MAX; 0: Q3_LANE_TOKENS);
     * fewest it takes for plain dtypes (fewer go to gemm_small). */
    int bc_max_t, bc_min_t;
    /* Where nonzero, the fp32 inputs of the tile GEMMs (gemm_bc on BF16
     * weights, gemm_wo) are packed as this many bf16 parts each (the AMX
     * table: 3), not as fp32. */
    int tile_parts;
    /* MX products of at most this many tokens run as one GEMV per token
     * (gemv_a8 or gemv_mx, where it takes the weights): decoding a row once per
     * token beats the GEMMs' lanes left empty. i8_gemv_t: the same with
     * MXINT8 inputs, one gemv_i8 per token (below the integer GEMM's
     * fewest tokens). tokens_t: where gemv_mx_tokens / gemv_i8_tokens take
     * the weights, products of up to this many tokens run as one pass of
     * those instead (and not in the integer GEMM). */
    int mx_gemv_t, i8_gemv_t, tokens_t;
    void (*gemm_bc)(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf);
    /* Integer GEMV for MXINT8 inputs (W->ai8) against MXINT8 or MXFP4
     * weights (cols % 64 == 0, <= 32768; NULL: not available): i8_prep
     * writes x[0..K) as MXINT8 elements and block factors in the order
     * gemv_i8 reads for weights of dtype wt, at most 2.125 * K bytes (exact
     * when x is MXINT8-quantized, as W->ai8 promises); gemv_i8 is gemv on
     * that copy, each block an exact integer sum scaled once. */
    void (*i8_prep)(void *xq, const float *x, int K, q3_dtype wt);
    void (*gemv_i8)(float *out, const void *xq, const q3_mat *W, int r0, int r1);
    /* The same for T tokens in one pass over MXFP4 weights of K % 128 == 0
     * (NULL: one gemv_i8 per token): i8_prep_tokens writes each token's
     * copy (at most 2.125 * K bytes), gemv_i8_tokens reads the T copies at
     * xq, xs bytes apart, and writes out[t * ldo + r - r0] for r in
     * [r0, r1), each bit for bit gemv_i8's result. */
    void (*i8_prep_tokens)(void *xq, const float *x, int K);
    void (*gemv_i8_tokens)(float *out, size_t ldo, const void *xq, size_t xs, int T, const q3_mat *W, int r0, int r1);
    /* Integer GEMM for MXINT8 inputs against MXFP4 weights (MXINT8 ones too
     * where gemm_i8_int8), up to Q3_BC_TOKENS_MAX tokens (cols % 64 == 0,
     * <= Q3_LANE_KMAX; NULL: not available): i8_pack_act writes the T input
     * rows quantized to MXINT8 as ap (K * TP bytes, TP = T rounded up to 8)
     * and fs (K/32 * TP block factors); gemm_i8 computes out[t][r], r in
     * [r0, r1), t < T (wbuf: Q3_NR * (K + K/4) bytes of scratch). */
    void (*i8_pack_act)(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K);
    void (*gemm_i8)(float *out, size_t ldo, const uint32_t *ap, const float *fs, int T, const q3_mat *W, int r0, int r1,
                    void *wbuf);
    int gemm_i8_int8;
} q3_isa_kernels;

/* E8M0 scale code -> the fp32 factor the SIMD element decoders expect
 * (2^(c-127) times 2^120 for E4M3 bit-moved codes, times 1/2 for E2M1
 * codes decoded as 2x their value). */
const float *q3_mx_scale_table(q3_dtype t);

/* The kernel table in force (isa_select.c; initialises it on first use,
 * and follows q3_kernels_force): what the matmul driver and the other
 * kernels run, and what tests ask when they must know a product's paths. */
const q3_isa_kernels *q3_isa_current(void);

extern const q3_isa_kernels q3_kernels_scalar;
extern const q3_isa_kernels q3_kernels_avx2;
extern const q3_isa_kernels q3_kernels_avx512;
/* Put the GEMV for plain dtypes that leaves the weight stream to the
 * hardware prefetchers (two rows at a time, no software prefetch) into
 * table k: the AVX-512 one (isa_avx512.c), the AVX2 one (isa_avx2.c). */
void q3_avx512_hw_prefetch_kernels(q3_isa_kernels *k);
void q3_avx2_hw_prefetch_kernels(q3_isa_kernels *k);
/* For tests and benchmarks that compare the two: the AVX2 (t = 0) or
 * AVX-512 (t = 1) table as built, whose GEMV prefetches in software, into
 * *sw, and the same with the hardware-prefetch GEMV into *hw. Returns 0
 * (writing nothing) where this CPU lacks the table's ISA. */
int q3_gemv_prefetch_variants(int t, q3_isa_kernels *sw, q3_isa_kernels *hw);
/* gemm_bc_avx512.c */
void q3_avx512_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt);
void q3_avx512_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf);
/* isa_avx2.c: W[r, k0 .. k0+n) of a plain-dtype or MXINT8 W widened to fp32
 * (n % 8 == 0; MXINT8: k0 and n multiples of 32). */
void q3_avx2_row_f32(const q3_mat *W, int r, int k0, int n, float *dst);
/* gemm_bc_avx2.c: as gemm_bc_avx512.c, TP = T rounded up to 8; for MX
 * weights ap's k order is gemv_mx_avx2.c's (q3_mx_prep_lanes, 2 lanes). */
void q3_avx2_bc_pack_act(float *ap, const float *x, size_t ldx, int T, int K, q3_dtype wt);
void q3_avx2_gemm_bc(float *out, size_t ldo, const float *ap, int T, const q3_mat *W, int r0, int r1, float *wbuf);
/* gemv_i8_avx2.c */
void q3_avx2_i8_prep(void *xq, const float *x, int K, q3_dtype wt);
void q3_avx2_gemv_i8(float *out, const void *xq, const q3_mat *W, int r0, int r1);
/* gemv_a8_avx2.c: the A8 GEMV (MXFP8 inputs; MXFP4 weights in integers, MXFP8 ones as gemv_mx) */
void q3_avx2_a8_prep(void *xb, const float *x, int K, q3_dtype wt);
void q3_avx2_gemv_a8(float *out, const void *xb, const q3_mat *W, int r0, int r1);
/* 32 inputs as MXINT8 codes; returns the block factor 2^(shared - 6), NaN
 * (codes 0) for a non-finite block. */
float q3_avx2_i8_quant_block(const float *x, int8_t q[32]);
/* gemm_i8_avx2.c (the pack and the row decoder, shared with the VNNI GEMM) */
void q3_i8_pack_lanes(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K, int TP);
void q3_i8_decode_row(const q3_mat *W, int r, int8_t *wq, int32_t *wsum, float *wsc);
/* The same for an MXINT8 row: its codes, their block sums, the factors. */
void q3_i8_decode_row_int8(const q3_mat *W, int r, int8_t *wq, int32_t *wsum, float *wsc);
void q3_avx2_i8_pack_act(uint32_t *ap, float *fs, const float *x, size_t ldx, int T, int K);
void q3_avx2_gemm_i8(float *out, size_t ldo, const uint32_t *ap, const float *fs, int T, const q3_mat *W, int r0, int r1,
                     void *wbuf);
/* gemv_mx_avx2.c: the GEMV's input copy (q3_mx_prep_copy, 2 lanes) */
void q3_avx2_mx_prep(void *xb, const float *x, int K, q3_dtype wt);
void q3_avx2_gemv_mx(float *out, const void *xb, const q3_mat *W, int r0, int r1);
void q3_avx2_gemv_mx_tokens(float *out, size_t ldo, const void *xb, size_t xs, int T, const q3_mat *W, int r0, int r1);
/* Row r of MX matrix W, block scales applied, in q3_mx_prep_lanes' 2-lane order. */
void q3_avx2_mx_row_slots(const q3_mat *W, int r, float *dst);
/* gemv_bf16p.c: GEMVs on BF16P weights (the _avx512 one needs AVX-512
 * BW, which q3_cpu_avx512bw tells), each a row's sum bit for bit as the
 * same ISA's BF16 GEMV sums the unpacked row. pf: the software prefetch
 * distance in bytes, or 0 for none (two rows at a time, as the tables'
 * hardware-prefetch GEMVs). */
void q3_gemv_bf16p_avx2(float *out, const float *x, const q3_mat *W, int r0, int r1, size_t pf);
void q3_gemv_bf16p_avx512(float *out, const float *x, const q3_mat *W, int r0, int r1, size_t pf);
int q3_cpu_avx512bw(void);
/* Elements [k0, k0 + n) (multiples of 64) of row r of BF16P W as fp32. */
void q3_bf16p_row_f32(const q3_mat *W, int r, int k0, int n, float *dst);
/* Rows [r0, r0 + n) of BF16P W as BF16 words, ds words apart. */
void q3_bf16p_unpack_rows_avx2(uint16_t *dst, size_t ds, const q3_mat *W, int r0, int n);
/* Fills in the A8 entries of an AVX-512 table (isa_avx512bf16.c). */
void q3_avx512bf16_a8_kernels(q3_isa_kernels *k);
/* isa_avx512bf16.c's pieces the AMX A8 GEMM shares: the table's a8_prep;
 * whether rows r0 .. r1 of MX weights W have block scales that folding
 * into bf16 keeps exact; row r of W as K bf16 words, scales folded in, in
 * a8_prep's order. */
void q3_avx512bf16_a8_prep(void *xb, const float *x, int K, q3_dtype wt);
int q3_a8_scales_foldable(const q3_mat *W, int r0, int r1);
/* K bf16 words in stored order -> a8_prep's order for weights of dtype wt
 * (a8_prep(x) is this applied to x rounded to bf16). */
void q3_a8_permute_words(uint16_t *dst, const uint16_t *src, int K, q3_dtype wt);
void q3_a8_decode_row(uint16_t *dst, const q3_mat *W, int r);
/* Elements [k0, k1) of rows r .. r+n-1 of MX W (rows past rlast: rlast's
 * again), as q3_a8_decode_row decodes them, into dst + i * ds + (k - k0);
 * k0 and k1 whole decoder steps (MXFP4 128 elements, MXFP8 64). */
void q3_a8_decode_span(uint16_t *dst, size_t ds, const q3_mat *W, int r, int n, int rlast, int k0, int k1);
/* gemm_amx.c: whether this CPU and OS run AMX-BF16 tiles (asks Linux for
 * the tile state once); the AMX GEMMs into an AVX-512 BF16 table: BF16
 * weights' broadcast GEMM (others keep AVX-512's) and the A8 GEMM. Their
 * packed inputs: the A8 GEMM's K/2 * TP words as before; the broadcast
 * GEMM's, for BF16 weights, 3 * K/2 * TP words (three bf16 parts). The
 * AMX A8 pack's row scratch: 16 * K words. */
int q3_amx_usable(void);
void q3_amx_kernels(q3_isa_kernels *k);
/* Floats of one KV head packed for the tile products (att_pack_kv), npad keys. */
static inline size_t q3_att_kv_floats(int npad, int D) { return (size_t)3 * D * (size_t)npad; }
/* gemm_amx_i8.c: the AMX table's integer GEMM (i8_pack_act, gemm_i8) where
 * the CPU has AMX-INT8 and k the VNNI one, whose packing it extends. */
void q3_amx_i8_kernels(q3_isa_kernels *k);
/* attention_amx.c: the att_pack_kv, att_pack_q, att_scores and att_pv of the AMX table. */
void q3_amx_attention_kernels(q3_isa_kernels *k);
/* n tile products (TDPBF16PS, operands in the tile registers: no memory
 * traffic) on the calling thread, for bench's AMX peak; returns their
 * flops (16 * 16 * 32 multiply-adds each). */
double q3_amx_tile_flops(long n);
/* Fills in the integer GEMM and GEMV entries of an AVX-512 table with the
 * VNNI kernels (gemm_i8_avx512vnni.c, gemv_i8_avx512vnni.c; CPUs with
 * AVX512_VNNI, AVX512BW and AVX512VL only). */
void q3_avx512vnni_i8_kernels(q3_isa_kernels *k);
/* gemv_mx_avx512.c: the MX GEMV on a prepared input for MXFP8 weights of
 * K % 64 == 0 (others: the AVX2 one), and its input copy; fills them into
 * an AVX-512 table (CPUs with AVX512BW only). */
void q3_avx512_mx_prep(void *xb, const float *x, int K, q3_dtype wt);
/* Rows the 512-bit MX decoders take: MXFP8 K % 64 == 0, MXFP4 K % 128 == 0. */
static inline int q3_mx_wide_fits(q3_dtype wt, int K) {
    return wt == Q3_MXFP8 ? K % 64 == 0 : wt == Q3_MXFP4 && K % 128 == 0;
}
/* The MX decoders' input order for vectors of `lanes` 128-bit lanes
 * (gemv_mx_avx2.c: 2; gemv_mx_avx512.c: 4): x permuted, exactly. */
void q3_mx_prep_lanes(float *xb, const float *x, int K, q3_dtype wt, int lanes);
/* The MX GEMVs' input copy (a8_prep of the AVX2 and AVX-512 tables): in
 * that order, and for MXFP8 weights times 2^Q3_FP8_COPY_EXP. Why: the E4M3
 * decoders leave each element times 2^-120, so its products with ordinary
 * inputs (below 2^-6) fell under 2^-126, and on Intel every FMA that
 * rounds to a subnormal takes a microcode assist: W8A8 decode ran 58.7
 * against 42.7 ms/token with subnormals flushed (the Xeon of
 * BENCHMARKS.md). The factor keeps the products normal down to |element x
 * input| of 2^-54, is exact (a power of two) for inputs below 2^80, and
 * the GEMVs' scale table (q3_mx_copy_scale_table) takes it back. */
enum { Q3_FP8_COPY_EXP = 48 };
void q3_mx_prep_copy(float *xb, const float *x, int K, q3_dtype wt, int lanes);
/* The block factors for the GEMVs' copies: q3_mx_scale_table(t), times
 * 2^-Q3_FP8_COPY_EXP for MXFP8. */
const float *q3_mx_copy_scale_table(q3_dtype t);
void q3_avx512_gemv_mx(float *out, const void *xb, const q3_mat *W, int r0, int r1);
void q3_avx512_gemv_mx_tokens(float *out, size_t ldo, const void *xb, size_t xs, int T, const q3_mat *W, int r0, int r1);
void q3_avx512bw_mx_kernels(q3_isa_kernels *k);
/* Columns k0 .. k0 + n of row r of MXFP8 (K % 64 == 0) / MXFP4 (K % 128 ==
 * 0) weights widened to fp32 in q3_mx_prep_lanes' 4-lane order (a
 * permutation within each 64 / 128 columns, so k0 and n multiples of 128
 * keep to it), block scales applied (AVX512BW). */
void q3_avx512_mx_row_slots(const q3_mat *W, int r, int k0, int n, float *dst);
/* gemv_i8_avx512vnni.c: the integer GEMV for MXFP4 weights of K % 128 == 0
 * and MXINT8 ones of K % 256 == 0 (others: the AVX2 one), and its input
 * copy. */
void q3_avx512vnni_i8_prep(void *xq, const float *x, int K, q3_dtype wt);
void q3_avx512vnni_gemv_i8(float *out, const void *xq, const q3_mat *W, int r0, int r1);
void q3_avx512vnni_i8_prep_tokens(void *xq, const float *x, int K);
void q3_avx512vnni_gemv_i8_tokens(float *out, size_t ldo, const void *xq, size_t xs, int T, const q3_mat *W, int r0, int r1);

/* Pack W[r0 .. r0+nr) x [k0 .. k0+kc) transposed into Bp[kc][NR] fp32, zero-padding rows >= nr. */
void q3_pack_panel(float *Bp, const q3_mat *W, int r0, int nr, int k0, int kc);

#endif
