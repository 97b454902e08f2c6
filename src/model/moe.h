/* Routed-expert MLP: gating (router matmul, fp32 softmax over all experts,
 * top-k, optional renormalisation), init routing (counting sort of the
 * (token, slot) pairs by expert), per-expert SwiGLU over the gathered rows,
 * finalize routing (weighted scatter-add back into the residual stream). */
#ifndef Q3_MOE_H
#define Q3_MOE_H

#include "model/forward.h"

/* Pick the top-k of probs[n] (ties: lower index first) into id/w. */
void q3_topk(const float *probs, int n, int k, int32_t *id, float *w);
/* Adds the MoE output for the T normed rows in s->xn into s->x. */
void q3_moe_forward(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer);
/* Sequence-parallel prefill on several ranks (forward.c): adds the MoE
 * output of this rank's own rows of the chunk (T tokens padded to a
 * multiple of moe_ep_size, normed rows in s->xn) into s->x. */
void q3_moe_forward_sp(const q3_model *m, const q3_layer *L, q3_state *s, int T, int layer);

#endif
