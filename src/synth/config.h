/* config.json for a synthesized checkpoint, laid out the way transformers
 * writes Qwen3MoeForCausalLM / Qwen3ForCausalLM configs (sorted keys,
 * indent 2), so that real loaders accept it unchanged. */
#ifndef Q3_SYNTH_CONFIG_H
#define Q3_SYNTH_CONFIG_H

#include <jansson.h>

#include "synth/presets.h"

/* torch_dtype is the checkpoint's dominant dtype name ("bfloat16", ...).
 * -1 with q3_err set on failure. */
int synth_write_config(const char *path, const synth_geom *g, const char *torch_dtype);
/* The same bytes as a heap string (for embedding in a .q3m); NULL with
 * q3_err set on failure. */
char *synth_config_text(const synth_geom *g, const char *torch_dtype);

/* json_dumps plus the trailing newline Python's writers add, as a heap
 * string; NULL with q3_err set on failure. */
char *synth_json_text(json_t *root, size_t flags);

/* json_dump_file plus the trailing newline Python's writers add. */
int synth_dump_json(json_t *root, const char *path, size_t flags);

#endif
