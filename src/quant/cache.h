/* The compile cache behind `-m DIR --quant SCHEME`: a checkpoint directory is
 * converted to a .q3m once (src/quant/convert.h) and later runs mmap the
 * cached file.
 *
 * Where: $Q3MOE_CACHE_DIR if set, else $XDG_CACHE_HOME/q3moe, else
 * ~/.cache/q3moe. File name: NAME-SCHEME-SLOT-KEY.q3m, where NAME is the
 * checkpoint directory's base name (for people), SLOT 8 hex digits of a hash
 * of (absolute path, scheme), and KEY 16 hex digits of an FNV-1a 64 hash of
 * the checkpoint's identity: its absolute path; the name, size and mtime
 * (ns) of config.json, model.safetensors.index.json, every *.safetensors,
 * tokenizer.json and tokenizer_config.json; the scheme; and the .q3m format
 * version. Any change to those gives a new KEY, so a stale file is never
 * used; after a conversion the files of the same SLOT with another KEY are
 * deleted. */
#ifndef Q3_QUANT_CACHE_H
#define Q3_QUANT_CACHE_H

/* Resolve a command's model argument. With quant NULL, *path_out is a copy
 * of m (a checkpoint directory or .q3m file, loaded as given). With a scheme
 * name (Q3_SCHEME_NAMES), m must be a checkpoint directory: the
 * cached .q3m is found or made (one stderr line says which) and its path
 * returned. *path_out is a heap string the caller frees. -1 with q3_err set
 * on failure. */
int q3_resolve_model(const char *m, const char *quant, char **path_out);

/* The cache directory (heap string), created if missing; NULL with q3_err. */
char *q3_cache_dir(void);

/* The cache path for (dir, scheme name) without creating anything; NULL with
 * q3_err when dir is not a readable checkpoint directory or the scheme is
 * unknown. */
char *q3_cache_path(const char *dir, const char *quant);

#endif
