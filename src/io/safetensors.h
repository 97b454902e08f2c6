/* Reader for Hugging Face safetensors checkpoints (one file or a sharded set
 * with model.safetensors.index.json). Files are mmapped; tensors point into
 * the mapping, nothing is copied. Every header field is validated: offsets
 * inside the file, no overlaps, byte size == product(shape) * dtype size. */
#ifndef Q3_SAFETENSORS_H
#define Q3_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "util/file.h"

const char *q3_dtype_name(q3_dtype t);
size_t q3_dtype_size(q3_dtype t);

#define Q3_MAX_DIMS 4

typedef struct {
    char *name;
    q3_dtype dtype;
    int ndim;
    int64_t shape[Q3_MAX_DIMS];
    const void *data;
    size_t nbytes;       /* bytes at data (elements only for MX dtypes) */
    const uint8_t *scales; /* MX dtypes: E8M0 scales, shape[last]/32 per row; BF16P: its raw groups */
    size_t scales_nbytes;  /* bytes at scales */
    int file;            /* index into archive files */
} q3_st_tensor;

typedef struct {
    q3_mapped_file *files;
    int n_files;
    q3_st_tensor *tensors;
    int n_tensors;
    /* open-addressing hash of tensor names -> index */
    int *table;
    size_t table_size;
} q3_st_archive;

/* Open every safetensors file of a checkpoint directory. */
int q3_st_open_dir(q3_st_archive *a, const char *dir);
/* Open a single .safetensors file. */
int q3_st_open_file(q3_st_archive *a, const char *path);
const q3_st_tensor *q3_st_find(const q3_st_archive *a, const char *name);
/* Build the name index of an archive whose files and tensors were filled by
 * another reader (the .q3m loader). A name appearing twice is an error. */
int q3_st_build_index(q3_st_archive *a);
void q3_st_close(q3_st_archive *a);

#endif
