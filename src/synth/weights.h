/* The tensors of a synthesized checkpoint (Hugging Face names and shapes)
 * and their deterministic random contents. */
#ifndef Q3_SYNTH_WEIGHTS_H
#define Q3_SYNTH_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "synth/presets.h"
#include "io/safetensors.h"

/* SYNTH_MIXED stores norms as F32, attention projections as F16 and the
 * rest as BF16, so that one checkpoint exercises every dtype. */
typedef enum { SYNTH_BF16, SYNTH_F16, SYNTH_F32, SYNTH_MIXED } synth_dtype_mode;

typedef struct {
    char *name;
    q3_dtype dtype;
    int ndim;
    int64_t shape[2];
    float mean, std;   /* values are mean + std * N(0, 1) */
} synth_tensor;

typedef struct {
    synth_tensor *t;
    int n;
    uint64_t total_bytes;
} synth_plan;

/* List every tensor of geometry g, in checkpoint order. */
void synth_plan_build(synth_plan *p, const synth_geom *g, synth_dtype_mode mode);
void synth_plan_free(synth_plan *p);

uint64_t synth_tensor_numel(const synth_tensor *t);
uint64_t synth_tensor_nbytes(const synth_tensor *t);

/* Write elements [first, first + n) of tensor t, in its dtype, to out.
 * Element i depends only on (seed, name, i), never on how a tensor is cut
 * into chunks or on the thread count. */
void synth_fill(const synth_tensor *t, uint64_t seed, uint64_t first, size_t n, void *out);

/* Round-to-nearest-even conversions (exposed for tests). */
uint16_t synth_f32_to_bf16(float f);
uint16_t synth_f32_to_f16(float f);

#endif
