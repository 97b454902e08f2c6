#include "synth/weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* Value scales (N(m, s): mean m, standard deviation s; see normal_at).
 * The aim is a forward pass that is numerically healthy with well
 * separated logits, so that engine-vs-reference checks compare real
 * signal and greedy argmax is never a near tie:
 *  - projections ~ N(0, 1/sqrt(fan_in)) keep activations at unit scale;
 *  - every RMSNorm weight (input/post-attention, q_norm/k_norm, final) is
 *    ~ N(1, 0.1): close to one, but never all ones, which would hide a
 *    missing or misplaced norm;
 *  - router weights are 4x larger (router logits ~ N(0, 4)), so softmax
 *    routing is decisive rather than a blur over all experts;
 *  - lm_head ~ N(0, 3/sqrt(hidden)): logits ~ N(0, 3) spread well;
 *  - embeddings ~ N(0, 1); when tied they double as lm_head and take its
 *    scale instead. */
#define NORM_NOISE 0.1f
#define ROUTER_GAIN 4.0
#define LOGIT_GAIN 3.0

enum role { ROLE_NORM, ROLE_ATTN, ROLE_OTHER };

static q3_dtype dtype_for(synth_dtype_mode m, enum role r) {
    switch (m) {
    case SYNTH_F16: return Q3_F16;
    case SYNTH_F32: return Q3_F32;
    case SYNTH_MIXED: return r == ROLE_NORM ? Q3_F32 : r == ROLE_ATTN ? Q3_F16 : Q3_BF16;
    case SYNTH_BF16: break;
    }
    return Q3_BF16;
}

typedef struct {
    synth_plan *p;
    int cap;
    synth_dtype_mode mode;
} builder;

static synth_tensor *add(builder *b, enum role r, int64_t d0, int64_t d1, const char *fmt, ...)
    Q3_PRINTF(5, 6);

/* d1 == 0 makes a 1-D tensor. */
static synth_tensor *add(builder *b, enum role r, int64_t d0, int64_t d1, const char *fmt, ...) {
    synth_plan *p = b->p;
    if (p->n == b->cap) p->t = q3_realloc(p->t, (size_t)(b->cap = b->cap ? 2 * b->cap : 64) * sizeof *p->t);
    synth_tensor *t = &p->t[p->n++];
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    t->name = q3_strdup(name);
    t->dtype = dtype_for(b->mode, r);
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    if (r == ROLE_NORM) {
        t->mean = 1.0f;
        t->std = NORM_NOISE;
    } else {
        t->mean = 0.0f;
        t->std = (float)(1.0 / sqrt((double)d1));   /* fan_in is the last dim */
    }
    p->total_bytes += synth_tensor_nbytes(t);
    return t;
}

static void add_mlp(builder *b, const char *pre, int64_t ffn, int64_t h) {
    add(b, ROLE_OTHER, ffn, h, "%s.gate_proj.weight", pre);
    add(b, ROLE_OTHER, ffn, h, "%s.up_proj.weight", pre);
    add(b, ROLE_OTHER, h, ffn, "%s.down_proj.weight", pre);
}

void synth_plan_build(synth_plan *p, const synth_geom *g, synth_dtype_mode mode) {
    memset(p, 0, sizeof *p);
    builder b = {p, 0, mode};
    int64_t H = g->hidden, qd = (int64_t)g->heads * g->head_dim, kvd = (int64_t)g->kv_heads * g->head_dim;
    double logit_std = LOGIT_GAIN / sqrt((double)H);

    synth_tensor *emb = add(&b, ROLE_OTHER, g->vocab, H, "model.embed_tokens.weight");
    emb->std = g->tie ? (float)logit_std : 1.0f;
    for (int l = 0; l < g->layers; l++) {
        add(&b, ROLE_NORM, H, 0, "model.layers.%d.input_layernorm.weight", l);
        add(&b, ROLE_ATTN, qd, H, "model.layers.%d.self_attn.q_proj.weight", l);
        add(&b, ROLE_ATTN, kvd, H, "model.layers.%d.self_attn.k_proj.weight", l);
        add(&b, ROLE_ATTN, kvd, H, "model.layers.%d.self_attn.v_proj.weight", l);
        add(&b, ROLE_ATTN, H, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        add(&b, ROLE_NORM, g->head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        add(&b, ROLE_NORM, g->head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        add(&b, ROLE_NORM, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        char pre[128];
        if (synth_layer_is_sparse(g, l)) {
            synth_tensor *router = add(&b, ROLE_OTHER, g->experts, H, "model.layers.%d.mlp.gate.weight", l);
            router->std *= (float)ROUTER_GAIN;
            for (int e = 0; e < g->experts; e++) {
                snprintf(pre, sizeof pre, "model.layers.%d.mlp.experts.%d", l, e);
                add_mlp(&b, pre, g->moe_ffn, H);
            }
        } else {
            snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
            add_mlp(&b, pre, g->ffn, H);
        }
    }
    add(&b, ROLE_NORM, H, 0, "model.norm.weight");
    if (!g->tie) add(&b, ROLE_OTHER, g->vocab, H, "lm_head.weight")->std = (float)logit_std;
}

void synth_plan_free(synth_plan *p) {
    for (int i = 0; i < p->n; i++) free(p->t[i].name);
    free(p->t);
    memset(p, 0, sizeof *p);
}

uint64_t synth_tensor_numel(const synth_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

uint64_t synth_tensor_nbytes(const synth_tensor *t) {
    return synth_tensor_numel(t) * (t->dtype == Q3_F32 ? 4 : 2);
}

uint16_t synth_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);   /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Shift m right by s bits, rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, int s) {
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    return q + (rem > half || (rem == half && (q & 1u)));
}

uint16_t synth_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00;                /* NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00;               /* >= 65520 rounds to inf */
    if (ax >= 0x38800000u)                                     /* normal: >= 2^-14 */
        /* Rebias the exponent; a mantissa carry correctly bumps it. */
        return sign | (uint16_t)shift_rne(ax - ((127u - 15u) << 23), 13);
    if (ax <= 0x33000000u) return sign;                        /* <= 2^-25 rounds to 0 */
    /* Subnormal half: units of 2^-24. A float with biased exponent e and
     * implicit-one mantissa m is m * 2^(e - 150), i.e. m >> (126 - e) units;
     * rounding up to 0x400 yields the smallest normal, as it should. */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    return sign | (uint16_t)shift_rne(m, (int)(126 - e));
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ull

static uint64_t tensor_key(const char *name, uint64_t seed) {
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (const unsigned char *s = (const unsigned char *)name; *s; s++) h = (h ^ *s) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed + GOLDEN));
}

/* Approximately standard normal: the Irwin-Hall sum of four 16-bit
 * uniforms from one splitmix64 output, rescaled to unit variance. It is
 * bell shaped and bounded (|z| < 3.5), and about ten times cheaper than
 * Box-Muller, which matters when writing hundreds of GB. splitmix64 is
 * counter based, so element i is computed directly from its index. */
static float normal_at(uint64_t key, uint64_t i) {
    uint64_t r = mix64(key + (i + 1) * GOLDEN);
    uint32_t sum = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                   (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
    /* each uniform has variance 1/12, so the sum of four has 1/3 */
    return (float)(((double)sum * 0x1p-16 - 2.0) * 1.7320508075688772);
}

static void store(void *out, q3_dtype dt, size_t i, float v) {
    if (dt == Q3_F32) {
        memcpy((char *)out + 4 * i, &v, 4);
        return;
    }
    uint16_t h = dt == Q3_F16 ? synth_f32_to_f16(v) : synth_f32_to_bf16(v);
    /* safetensors is little-endian; write bytes explicitly. */
    unsigned char *o = (unsigned char *)out + 2 * i;
    o[0] = (unsigned char)h;
    o[1] = (unsigned char)(h >> 8);
}

void synth_fill(const synth_tensor *t, uint64_t seed, uint64_t first, size_t n, void *out) {
    uint64_t key = tensor_key(t->name, seed);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) store(out, t->dtype, i, t->mean + t->std * normal_at(key, first + i));
}
