/* Token sampling: repetition penalty, temperature, top-k, top-p, min-p, then
 * a draw from a seeded xorshift RNG. temperature <= 0 means greedy (argmax,
 * lowest id wins ties). All scratch space is allocated at creation so that
 * sampling during decode allocates nothing. */
#ifndef Q3_SAMPLER_H
#define Q3_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temperature;     /* default 0.7; <= 0: greedy */
    int top_k;             /* default 20; <= 0: off */
    float top_p;           /* default 0.8; >= 1: off */
    float min_p;           /* default 0.0; <= 0: off */
    float repeat_penalty;  /* default 1.0 (off); llama.cpp semantics: logit>0 divided, <0 multiplied */
    int repeat_last_n;     /* default 64: window of recent tokens the penalty applies to */
    uint64_t seed;         /* default: time-based when the CLI gets none */
} q3_sampler_params;

void q3_sampler_defaults(q3_sampler_params *p);

typedef struct q3_sampler q3_sampler;

q3_sampler *q3_sampler_new(const q3_sampler_params *p, int vocab_size);
void q3_sampler_free(q3_sampler *s);
/* Record a token as seen (prompt and generated), for the repetition penalty. */
void q3_sampler_accept(q3_sampler *s, int32_t token);
/* Forget the accepted tokens (a new conversation, or one rewritten). */
void q3_sampler_forget(q3_sampler *s);
/* Returned by the samplers when every logit is NaN: nothing can be chosen
 * (the model's weights or activations hold a NaN or an infinity). */
#define Q3_SAMPLE_NONE (-1)

/* Pick the next token from logits[vocab_size], or Q3_SAMPLE_NONE. logits
 * may be modified in place. */
int32_t q3_sampler_sample(q3_sampler *s, float *logits);

/* Distributed sampling over a vocab-parallel lm_head: each of the ranks
 * holds the logits of a slice [lo, lo + n) of the vocab (the same history
 * and seed on every rank). q3_sampler_local writes the rank's k candidates
 * (its argmax when greedy, else its top_k best), the ranks allgather them,
 * and q3_sampler_pick draws from the union. Every rank then draws the token
 * q3_sampler_sample draws from the full row, bit for bit: the repetition
 * penalty is per element, the global top-k lies inside the union of the
 * local ones, and candidates are ordered by a strict total order (value,
 * then lower id). */
typedef struct {
    float v;
    int32_t id;   /* < 0: padding (a slice with fewer than k non-NaN logits) */
} q3_sample_cand;

/* Candidates per rank for these settings and a slice of slice_n ids: 1
 * when greedy, top_k when top-k is on, and 0 (gather whole rows and use
 * q3_sampler_sample) when top-k is off or the candidates would not be
 * smaller than the slice's logits. */
int q3_sampler_cands_per_rank(const q3_sampler_params *p, int vocab, int slice_n);
/* Penalise slice[0..n) (ids lo + i) in place and write k candidates
 * (k = q3_sampler_cands_per_rank, > 0) to out, best first. No allocation. */
void q3_sampler_local(q3_sampler *s, float *slice, int lo, int n, q3_sample_cand *out, int k);
/* The token drawn from the gathered candidates of all ranks (any order),
 * or Q3_SAMPLE_NONE.
 * Advances the RNG exactly as q3_sampler_sample does. No allocation. */
int32_t q3_sampler_pick(q3_sampler *s, const q3_sample_cand *all, size_t n);

#endif
