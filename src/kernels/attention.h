/* Causal GQA attention over a KV cache with online softmax (flash
 * attention): keys are visited in fixed blocks of Q3_ATT_BLOCK, so results
 * do not depend on the thread count. Prefill works on tiles of query tokens
 * x the query heads of one KV head, each a pair of small register-tiled
 * matmuls per key block (S = Q K^T, O += P V) around the softmax update,
 * masked only on the diagonal blocks; the threads share out the tiles (on
 * CPUs with AMX the two matmuls run on tiles: attention_amx.c). A
 * single decode token splits the KV length into blocks across threads and
 * merges the partial softmax states in block order. */
#ifndef Q3_ATTENTION_H
#define Q3_ATTENTION_H

#include <stddef.h>

enum { Q3_ATT_BLOCK = 128, Q3_MAX_HEAD_DIM = 512 };

typedef struct {
    int n_heads, n_kv_heads, head_dim;
    size_t kv_stride;          /* floats between consecutive positions of one KV head */
    size_t head_stride;        /* floats between the KV heads' position-0 rows */
    const float *k, *v;        /* this layer's cache, KV head 0 at position 0 */
} q3_attn_layer;

/* Floats of scratch q3_attention needs for a context of ctx tokens, with
 * per-thread prefill tiles for the OpenMP thread count in force
 * (omp_get_max_threads()): size it after setting the thread count. */
size_t q3_attention_scratch(int n_heads, int head_dim, int ctx);

/* out[t][h*D ..] for T query rows at positions pos0 .. pos0+T-1 (q and out
 * rows are n_heads*head_dim floats apart). */
void q3_attention(float *out, const float *q, int T, int pos0, const q3_attn_layer *L, float *scratch);

/* Wall time of the calling thread's q3_attention calls since its last
 * reset: the part of a step spent over the KV cache, for q3moe bench. */
void q3_attention_seconds_reset(void);
double q3_attention_seconds(void);

#endif
