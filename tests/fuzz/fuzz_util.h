/* Shared by the libFuzzer targets (README.md, "Fuzzing"): inputs reach the
 * loaders as files, as they would from a user, in a private temp folder. */
#ifndef Q3_FUZZ_UTIL_H
#define Q3_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* config.json of the micro model tests/fuzz/seeds.sh makes (1 layer,
 * hidden 64, 2 heads of 32, 4 experts of 64, vocab 64). */
extern const char fuzz_micro_config[];

/* The process's temp folder (made once; removed at exit). */
const char *fuzz_dir(void);
/* Write n bytes to fuzz_dir()/name; returns the path (static storage,
 * overwritten by the next call), or aborts when the write fails (a broken
 * harness, not a finding). */
const char *fuzz_write(const char *name, const void *data, size_t n);

/* A model that loads must also run: a 3-token prefill and one decode step
 * on one thread (any logits, NaN included; no crash). model is a
 * q3_model (void so that this header needs none of the model's). */
void fuzz_run_model(const void *model);

/* Ends one input: with FUZZ_VERBOSE set, prints how the loader answered
 * (the refusal message, or "loaded"); clears the error either way. */
void fuzz_done(int rc);

#endif
