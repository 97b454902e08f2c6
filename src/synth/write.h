/* Streams the tensors of a synth plan into safetensors files: one
 * model.safetensors, or model-0000i-of-0000N.safetensors shards plus
 * model.safetensors.index.json when the total exceeds the shard limit. */
#ifndef Q3_SYNTH_WRITE_H
#define Q3_SYNTH_WRITE_H

#include <stdint.h>

#include "synth/weights.h"

/* Assign tensors to shards in order, starting a new shard before a tensor
 * that would push the current one past `limit` bytes (a tensor larger
 * than the limit gets a shard to itself). Fills shard_of[p->n]; returns
 * the shard count. */
int synth_assign_shards(const synth_plan *p, uint64_t limit, int *shard_of);

/* Write every tensor of p into dir. Progress goes to stderr. -1 with
 * q3_err set on failure (the file being written is removed). */
int synth_write_weights(const char *dir, const synth_plan *p, uint64_t shard_limit, uint64_t seed);

#endif
