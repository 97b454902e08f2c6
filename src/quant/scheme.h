/* A model's quantization scheme: the storage type of the FFN weights
 * (experts and dense MLPs), of the attention projections (q/k/v/o), and
 * whether the inputs of those quantized linears are dynamically quantized
 * per 32-block ("A8": to MXFP8, or to MXINT8 for the integer kernels).
 * Embeddings, norms and the router keep their checkpoint dtype; lm_head too
 * unless `head` asks for MX (then, under A8, its input is quantized as
 * well). W4A8 = {ffn MXFP4, attn MXFP8, act MXFP8}; W4A8i = {ffn MXFP4,
 * attn MXINT8, act MXINT8}. */
#ifndef Q3_QUANT_SCHEME_H
#define Q3_QUANT_SCHEME_H

#include "kernels/dtype.h"

typedef struct {
    q3_dtype ffn;   /* Q3_BF16 (as stored), Q3_MXFP8, Q3_MXFP4 or Q3_MXINT8 */
    q3_dtype attn;
    q3_dtype act;   /* inputs of MX linears: Q3_F32 (as computed), Q3_MXFP8 or Q3_MXINT8 */
    q3_dtype head;  /* lm_head: an MX dtype or Q3_BF16 (as stored) */
} q3_quant_scheme;

#endif
