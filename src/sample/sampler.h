/* Token sampling: repetition penalty, temperature, top-k, top-p, min-p, then
 * a draw from a seeded xorshift RNG. temperature <= 0 means greedy (argmax,
 * lowest id wins ties). All scratch space is allocated at creation so that
 * sampling during decode allocates nothing. */
#ifndef Q3_SAMPLER_H
#define Q3_SAMPLER_H

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
/* Pick the next token from logits[vocab_size]. logits may be modified in place. */
int32_t q3_sampler_sample(q3_sampler *s, float *logits);

#endif
