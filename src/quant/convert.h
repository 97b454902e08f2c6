/* Packing a model into a .q3m file (src/io/q3m.h), quantizing the FFN and
 * attention projections to MX formats per a q3_quant_scheme.
 *
 * One writer, two sources: q3_convert feeds it a Hugging Face checkpoint
 * directory, `q3moe synth` its random-weight generator (src/synth/pack.h).
 *
 * Streaming: tensors are fetched chunk by chunk (from the mmapped
 * safetensors, or generated), converted row by row and written through a
 * fixed buffer, so memory use does not grow with the model. The output is
 * written to a temporary file next to the target and renamed into place only
 * once complete and re-validated. */
#ifndef Q3_QUANT_CONVERT_H
#define Q3_QUANT_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "quant/scheme.h"

/* One tensor of a source, in its stored dtype (F32, F16 or BF16). */
typedef struct {
    const char *name;
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS];
} q3_src_tensor;

/* What the .q3m writer packs. Tensors are written in array order. */
typedef struct {
    const q3_src_tensor *tensors;
    int n_tensors;
    /* Elements [first, first + n) of tensor i as stored: a pointer into the
     * source, or `scratch` (room for n elements) once filled. Never fails;
     * called from one thread. */
    const void *(*read)(void *ctx, int i, uint64_t first, size_t n, void *scratch);
    /* Tensor i is written and its memory may go; NULL when nothing to do. */
    void (*release)(void *ctx, int i);
    /* The file tensor i is read from, for messages; NULL: no file (synth). */
    const char *(*origin)(void *ctx, int i);
    void *ctx;
    /* Files embedded verbatim: config.json is required; a tokenizer file
     * with NULL bytes is left out. */
    const char *config, *tokenizer, *tokenizer_config;
    size_t config_len, tokenizer_len, tokenizer_config_len;
} q3_tensor_source;

typedef struct {
    const char *dst;        /* .q3m path to write */
    q3_quant_scheme scheme;
    int force;              /* replace an existing dst */
    int quiet;              /* no progress and no summary on stderr */
    const char *tag;        /* progress/summary prefix: "convert" (NULL) or "synth" */
} q3_pack_opts;

typedef struct {
    int n_tensors, n_quantized;
    uint64_t bytes_in, bytes_out;
    double seconds;
} q3_convert_stats;

/* Write src into o->dst. -1 with q3_err set (nothing is left at dst, and no
 * temporary file). */
int q3_pack(const q3_tensor_source *src, const q3_pack_opts *o, q3_convert_stats *st);
/* The size q3_pack would give the file, without writing anything (BF16P
 * tensors without their raw groups, a few per mille of them, which only
 * q3_pack's pass over the weights counts). */
int q3_pack_size(const q3_tensor_source *src, q3_quant_scheme scheme, uint64_t *file_size);

typedef struct {
    const char *src;        /* checkpoint directory */
    const char *dst;        /* .q3m path to write */
    q3_quant_scheme scheme;
    int force;              /* replace an existing dst */
    int quiet;              /* no progress and no summary on stderr */
} q3_convert_opts;

/* Checkpoint directory o->src -> .q3m o->dst (q3_pack over its tensors). */
int q3_convert(const q3_convert_opts *o, q3_convert_stats *st);

/* Which weights a scheme quantizes: Q3_MXFP4 / Q3_MXFP8 for the FFN
 * projections (expert and dense gate/up/down_proj) and attention
 * projections (q/k/v/o_proj), Q3_BF16 ("as stored") for everything else
 * and for a scheme entry of Q3_BF16. */
q3_dtype q3_convert_target(const char *tensor_name, const q3_quant_scheme *s);

/* "mxfp4" | "mxfp8" | "mxint8" | "bf16" (as stored) -> dtype; -1 otherwise. */
int q3_scheme_parse_dtype(const char *s, q3_dtype *out);
/* Named schemes: w4a8 (ffn mxfp4, attn mxfp8, act mxfp8), w8a8 (all mxfp8),
 * w4a8i (ffn mxfp4, attn mxint8, act mxint8: the integer kernels), w8a8i
 * (all mxint8), w4 (ffn+attn mxfp4, act none), w8 (ffn+attn mxfp8, act
 * none), bf16. */
int q3_scheme_from_name(const char *name, q3_quant_scheme *out);
#define Q3_SCHEME_NAMES "w4a8, w8a8, w4a8i, w8a8i, w4, w8, bf16, bf16p"
/* The scheme options `convert` and `synth` share: --quant NAME sets the
 * whole scheme, --ffn T / --attn T / --act A one part of it.
 * q3_scheme_flag applies one (0), or returns -1 with q3_err naming the flag
 * and the accepted values. */
int q3_is_scheme_flag(const char *flag);
int q3_scheme_flag(const char *flag, const char *value, q3_quant_scheme *s);
#define Q3_SCHEME_FLAGS_HELP \
    "  --quant S     the whole scheme: w4a8 (default: ffn mxfp4, attn mxfp8, act mxfp8),\n" \
    "                w8a8, w4a8i (ffn mxfp4, attn mxint8, act mxint8: integer kernels),\n" \
    "                w8a8i (all mxint8), w4 (ffn+attn mxfp4), w8 (ffn+attn mxfp8),\n" \
    "                bf16 (as stored), bf16p (ffn, attn and lm_head as BF16P: the BF16 values\n" \
    "                losslessly in 12.5 bits each; decode faster, prefill slower)\n" \
    "  --ffn T       expert and dense MLP gate/up/down_proj: mxfp4, mxfp8, mxint8, bf16 (as stored),\n" \
    "                bf16p\n" \
    "  --attn T      attention q/k/v/o_proj: mxfp8, mxfp4, mxint8, bf16 (as stored), bf16p\n" \
    "  --act A       inputs of the MX linears at run time: mxfp8, mxint8 or none (fp32)\n" \
    "  --head T      lm_head: bf16 (as stored, the default), mxfp8, mxfp4, mxint8, bf16p (untied\n" \
    "                models; under --act its input is quantized too)\n" \
    "                (applied in the order given: --quant w4a8 --ffn mxfp8 is w8a8)\n"
/* "ffn MXFP4, attn MXFP8, act MXFP8" into buf. */
const char *q3_scheme_describe(const q3_quant_scheme *s, char *buf, unsigned cap);

#endif
