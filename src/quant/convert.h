/* Hugging Face checkpoint directory -> .q3m file (src/io/q3m.h), quantizing
 * the FFN and attention projections to MX formats per a q3_quant_scheme.
 *
 * Streaming: tensors are read from the mmapped safetensors, converted row
 * by row and written through a fixed buffer, so memory use does not grow
 * with the model. The output is written to a temporary file next to the
 * target and renamed into place only once complete and re-validated. */
#ifndef Q3_QUANT_CONVERT_H
#define Q3_QUANT_CONVERT_H

#include <stdint.h>

#include "quant/scheme.h"

typedef struct {
    const char *src;        /* checkpoint directory */
    const char *dst;        /* .q3m path to write */
    q3_quant_scheme scheme;
    int force;              /* replace an existing dst */
    int quiet;              /* no progress and no summary on stderr */
} q3_convert_opts;

typedef struct {
    int n_tensors, n_quantized;
    uint64_t bytes_in, bytes_out;
    double seconds;
} q3_convert_stats;

int q3_convert(const q3_convert_opts *o, q3_convert_stats *st);

/* Which weights a scheme quantizes: Q3_MXFP4 / Q3_MXFP8 for the FFN
 * projections (expert and dense gate/up/down_proj) and attention
 * projections (q/k/v/o_proj), Q3_BF16 ("as stored") for everything else
 * and for a scheme entry of Q3_BF16. */
q3_dtype q3_convert_target(const char *tensor_name, const q3_quant_scheme *s);

/* "mxfp4" | "mxfp8" | "bf16" (as stored) -> dtype; -1 otherwise. */
int q3_scheme_parse_dtype(const char *s, q3_dtype *out);
/* Named schemes: w4a8 (ffn mxfp4, attn mxfp8, act mxfp8), w8a8 (all mxfp8),
 * w4 (ffn+attn mxfp4, act none), w8 (ffn+attn mxfp8, act none), bf16. */
int q3_scheme_from_name(const char *name, q3_quant_scheme *out);
#define Q3_SCHEME_NAMES "w4a8, w8a8, w4, w8, bf16"
/* "ffn MXFP4, attn MXFP8, act MXFP8" into buf. */
const char *q3_scheme_describe(const q3_quant_scheme *s, char *buf, unsigned cap);

#endif
