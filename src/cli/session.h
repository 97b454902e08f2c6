/* What every model command holds: the model, one sequence state and the
 * tokenizer (when the checkpoint has one), plus the streaming generation
 * loop shared by `generate` and `chat`. */
#ifndef Q3_SESSION_H
#define Q3_SESSION_H

#include <stdint.h>
#include <stdio.h>

#include "model/forward.h"
#include "parallel/plan.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    q3_model model;
    q3_state state;
    q3_tokenizer *tok;   /* NULL when the checkpoint has no usable tokenizer.json */
    char tok_why[512];   /* then why not (a message naming it) */
    float *logits;       /* [vocab_size], last row */
    int32_t eos_ids[4];  /* tokens that end a turn */
    int n_eos;
    /* Distributed sampling (session_sampling_setup): candidates per rank,
     * 0 when sampling from whole gathered rows in logits. */
    int cand_k;
    q3_sample_cand *cand_send, *cand_recv;   /* [cand_k], [cand_k * lmhead ranks] */
} q3_session;

/* need_tokenizer: fail when tokenizer.json is absent or does not fit the vocab. */
int session_open(q3_session *s, const char *dir, int ctx, int n_threads, int need_tokenizer);
/* The same for one rank of a multi-rank job: plan (validated, or NULL for
 * one rank) gives this rank's share of the weights (model/shard.h). */
int session_open_plan(q3_session *s, const char *dir, int ctx, int n_threads, int need_tokenizer, const q3_plan *plan);
void session_close(q3_session *s);
/* Choose how tokens are sampled with settings p: on a vocab-split lm_head
 * with settings a few candidates decide (q3_sampler_cands_per_rank), each
 * rank keeps its logits slice and only the candidates are gathered;
 * otherwise whole rows are gathered. Sizes the buffers once and says
 * which on rank 0's stderr (when verbose). 0, or -1 with q3_err. */
int session_sampling_setup(q3_session *s, const q3_sampler_params *p, int verbose);
/* The next token from the last forward call's last row (every rank of the
 * job gets the same). No allocation. */
int32_t session_sample(q3_session *s, q3_sampler *smp);
/* The error for NaN logits (logits_what says which): scans the model's
 * weights for the first NaN or infinity and names it, or says an
 * activation overflowed. Always returns -1 with q3_err set. */
int session_explain_nan(const q3_model *m, const char *logits_what);
/* Encode text (len bytes, NUL bytes included) with the checkpoint's
 * tokenizer (error when it has none). */
int session_encode_n(q3_session *s, const char *text, size_t len, int32_t **ids, size_t *n);
/* The same for a NUL-terminated text. */
int session_encode(q3_session *s, const char *text, int32_t **ids, size_t *n);

typedef struct {
    int max_new;              /* tokens to generate at most */
    int ignore_eos;
    int print_ids;            /* print generated ids as a JSON array instead of text */
    const char **stops;       /* stop strings (not printed) */
    int n_stops;
    FILE *out;
    int32_t *sampled;         /* when set: receives the sampled tokens (room for max_new) */
} gen_options;

typedef struct {
    int prompt_tokens, generated, decode_steps;
    double prefill_ms, decode_ms;
    int32_t last_token;       /* last sampled token (an end-of-turn token when ended by the model) */
    int hit_eos, hit_stop, hit_ctx;
} gen_stats;

/* Feed `prompt` (appending to whatever is in the cache), then sample and
 * stream up to max_new tokens. The last sampled token is NOT fed back. */
int gen_run(q3_session *s, q3_sampler *smp, const int32_t *prompt, size_t n_prompt, const gen_options *o, gen_stats *st);
void gen_print_stats(const gen_stats *st);

#endif
