/* `q3moe synth -o FILE.q3m`: the random-weight generator as a source of
 * convert's .q3m writer (quant/convert.h), so that a model too big to exist
 * as a BF16 directory on this disk can still be made: tensors are generated
 * chunk by chunk, quantized and written, never stored unquantized. The file
 * is byte for byte the one synth to a directory + `q3moe convert` gives. */
#ifndef Q3_SYNTH_PACK_H
#define Q3_SYNTH_PACK_H

#include <stdint.h>

#include "quant/convert.h"
#include "synth/weights.h"

/* config is the config.json text; tok_dir the directory holding
 * tokenizer.json (and optionally tokenizer_config.json) to embed, or NULL.
 * -1 with q3_err set on failure. */
int synth_pack(const synth_plan *p, uint64_t seed, const char *config, const char *tok_dir, const q3_pack_opts *o,
               q3_convert_stats *st);
/* The size synth_pack would give the file, without writing it. */
int synth_pack_size(const synth_plan *p, const char *config, const char *tok_dir, q3_quant_scheme scheme,
                    uint64_t *file_size);

#endif
