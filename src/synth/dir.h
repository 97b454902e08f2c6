/* The output directory of `q3moe synth`: creating it, refusing to write
 * into one that holds anything unless forced, cleaning up after a failure,
 * and bringing the tokenizer along. Functions return -1 with q3_err set. */
#ifndef Q3_SYNTH_DIR_H
#define Q3_SYNTH_DIR_H

#include <stdint.h>

/* Create dir (with parents), or check that it is empty. With force, a
 * non-empty dir is accepted and the files synth writes are removed from it
 * first, so that no stale shard from an earlier run survives. */
int synth_prepare_dir(const char *dir, int force);
/* Remove the files synth writes from dir (after a failed run). */
void synth_remove_owned(const char *dir);
/* Fail early when the file system lacks `need` free bytes. */
int synth_check_space(const char *dir, uint64_t need);

/* Where the tokenizer comes from: spec is a directory, "none", or NULL for
 * the tokenizer/ folder next to the executable. *src is set to a heap
 * directory, or NULL when none is copied (a note on stderr says why). */
int synth_resolve_tokenizer(const char *spec, int vocab, char **src);
/* Copy tokenizer.json (and tokenizer_config.json if present) into dir. */
int synth_copy_tokenizer(const char *src, const char *dir);

#endif
