/* The diagnosis of NaN logits: the first element of a checkpoint's tensors
 * that is NaN or infinite. Weights are mmapped as stored and not checked at
 * load (that would read every byte before the first token); q3moe convert
 * checks the ones it quantizes. */
#ifndef Q3_TENSOR_CHECK_H
#define Q3_TENSOR_CHECK_H

#include <stddef.h>

#include "io/safetensors.h"

typedef struct {
    const q3_st_tensor *tensor;
    const char *file;    /* the file holding it */
    size_t index;        /* element index, row-major */
    const char *what;    /* "NaN", "+infinity", "-infinity", "a NaN scale" */
} q3_bad_element;

/* 1 and *out filled when some tensor of a holds a non-finite element (the
 * first in the archive's order), else 0. F32, F16 and BF16 elements, MXFP8
 * NaN codes and E8M0 NaN scales (reported at the block's first element)
 * count; MXFP4 and MXINT8 elements are finite by construction. */
int q3_find_non_finite(const q3_st_archive *a, q3_bad_element *out);

/* "tensor NAME in FILE holds WHAT at [i, j]" into buf. */
void q3_bad_element_describe(const q3_bad_element *e, char *buf, size_t n);

#endif
