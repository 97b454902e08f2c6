/* Streaming writer for one safetensors file. The header (names, dtypes,
 * shapes, offsets) is written up front from a list of descriptors; tensor
 * data then follows in the same order through any number of append calls,
 * so a checkpoint far larger than RAM can be written with a small buffer. */
#ifndef Q3_SAFETENSORS_WRITER_H
#define Q3_SAFETENSORS_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

typedef struct {
    const char *name;
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS];
} q3_stw_desc;

typedef struct q3_st_writer q3_st_writer;

/* Bytes of data a descriptor stands for (product(shape) * dtype size). */
uint64_t q3_stw_nbytes(const q3_stw_desc *d);

/* Create (truncate) `path` and write the header for desc[0..n). NULL with
 * q3_err set on failure. `desc` need not outlive the call. */
q3_st_writer *q3_stw_create(const char *path, const q3_stw_desc *desc, int n);
/* Append the next `nbytes` of data; tensors are laid back to back in the
 * order given to q3_stw_create. Writing past the declared total fails. */
int q3_stw_write(q3_st_writer *w, const void *data, size_t nbytes);
/* Check that every declared byte was written, flush and close; frees w
 * whatever the outcome (a failed file is removed). */
int q3_stw_close(q3_st_writer *w);
/* Give up on a file: close it, delete it, free w. */
void q3_stw_abort(q3_st_writer *w);

#endif
