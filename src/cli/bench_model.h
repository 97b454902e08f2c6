/* Model-side measurements for `q3moe bench`: prefill and decode timing
 * loops over q3_forward, FLOP counts and the weight bytes a decode token
 * reads, from the loaded model's own tensor views. */
#ifndef Q3_BENCH_MODEL_H
#define Q3_BENCH_MODEL_H

#include <stdint.h>

#include "cli/bench_machine.h"
#include "cli/session.h"
#include "util/error.h"

/* "[bench] ..." progress lines on stderr, unless switched off (the ranks
 * other than 0 of a multi-rank bench). */
void bench_log(const char *fmt, ...) Q3_PRINTF(1, 2);
void bench_log_enable(int on);

/* Deterministic pseudo-random token ids in [0, vocab). */
void bench_fill_ids(int32_t *ids, int n, int vocab, uint64_t seed);

/* Weight parameters one token multiplies by (attention q/k/v/o, router and
 * top_k experts' gate/up/down per sparse layer, the dense MLP otherwise),
 * without lm_head and embedding. */
double bench_active_params(const q3_config *c);
/* FLOPs of a P-token prefill that asks for the last row of logits:
 * 2 * active params * P + per layer 4 * head_dim * heads * P(P+1)/2 for the
 * causal QK^T and AV products + 2 * vocab * hidden for the lm_head row. */
double bench_prefill_flops(const q3_config *c, int P);
/* FLOPs of attention over the KV cache (the causal QK^T and AV products,
 * every layer) for T query rows at positions pos0 .. pos0 + T - 1. */
double bench_attention_flops(const q3_config *c, int pos0, int T);
/* Total parameters and bytes of every tensor of the checkpoint, and the
 * dtype they share ("mixed" when they differ). */
void bench_checkpoint_size(const q3_model *m, double *params, double *bytes, const char **dtype);

/* Bytes every decode token reads whatever the routing: per layer q/k/v/o,
 * norms (their fp32 copies), router or dense MLP; lm_head, final norm and
 * one embedding row. */
double bench_decode_fixed_bytes(const q3_model *m);
/* Expert weight bytes read for the routing counts `hits` ([layers][experts]
 * tokens per expert): each hit reads that expert's gate, up and down. */
double bench_expert_bytes(const q3_model *m, const uint64_t *hits);
/* K and V cache bytes attention reads for a token at position pos. */
double bench_kv_bytes(const q3_config *c, int pos);

/* The expert load of a prefill: how many (sparse layer, expert) pairs got
 * how many of its tokens, in buckets of 0, 1-8 (the few-token kernels),
 * 9-16, 17-32, 33-64, 65-128 and more tokens (a prompt longer than a
 * forward chunk: its chunks summed). The deep layers of a random-weight
 * checkpoint route far less evenly than the first, which moves the
 * experts' GFLOP/s. */
enum { BENCH_LOAD_BUCKETS = 7 };
const char *bench_load_label(int bucket);
/* load[b] += the pairs whose count (after - before, [layers][experts]) falls in bucket b. */
void bench_expert_load(const q3_model *m, const uint64_t *after, const uint64_t *before, uint64_t load[BENCH_LOAD_BUCKETS]);

/* Times reps prefills of P tokens, each after q3_state_reset and ending
 * with the first token sampled by smp (as generate does); ms[reps]. *mm:
 * their matmul time and flops; *att_s: their seconds in attention over the
 * KV cache (q3_attention). cl: NULL, or ceilings to sample beside.
 * load: NULL, or the expert load of the first repetition (zeroed here;
 * needs state.expert_hits). */
int bench_run_prefill(q3_session *se, q3_sampler *smp, const int32_t *ids, int P, int reps, double *ms,
                      q3_matmul_stats *mm, double *att_s, bench_ceilings *cl, uint64_t load[BENCH_LOAD_BUCKETS]);
/* reps x (reset, untimed prefill of `depth` ids, n timed single-token steps,
 * each a forward pass and a sample); ms[reps * n]. The steps feed ids, not
 * the sampled tokens, so every run sees the same tokens. hits_delta
 * ([layers][experts], zeroed here) receives the experts routed to during
 * the timed steps only. state.expert_hits must be allocated for MoE models.
 * mm, att_s: the matmul time and flops and the attention seconds of the
 * timed steps. cl: as for prefill. */
int bench_run_decode(q3_session *se, q3_sampler *smp, const int32_t *ids, int depth, int n, int reps, double *ms,
                     uint64_t *hits_delta, q3_matmul_stats *mm, double *att_s, bench_ceilings *cl);

/* Linear-interpolated percentile (0..100) of n values (sorted in place). */
double bench_percentile(double *v, int n, double pct);

#endif
