/* A model's quantization scheme: the storage type of the FFN weights
 * (experts and dense MLPs), of the attention projections (q/k/v/o), and
 * whether the inputs of those quantized linears are dynamically quantized
 * to MXFP8 ("A8"). Embeddings, norms and the router keep their checkpoint
 * dtype; lm_head too unless `head` asks for MX (then, under A8, its input
 * is quantized to MXFP8 as well). W4A8 = {ffn MXFP4, attn MXFP8, act MXFP8}. */
#ifndef Q3_QUANT_SCHEME_H
#define Q3_QUANT_SCHEME_H

#include "kernels/dtype.h"

typedef struct {
    q3_dtype ffn;   /* Q3_BF16 (as stored), Q3_MXFP8 or Q3_MXFP4 */
    q3_dtype attn;
    int act_mxfp8;  /* 1: quantize inputs of MX linears to MXFP8 per 32-block */
    q3_dtype head;  /* lm_head: Q3_MXFP8, Q3_MXFP4 or Q3_BF16 (as stored) */
} q3_quant_scheme;

#endif
