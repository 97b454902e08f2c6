/* Options shared by `generate` and `chat`: model, context, threads and sampling. */
#ifndef Q3_COMMON_OPTS_H
#define Q3_COMMON_OPTS_H

#include <stdio.h>

#include "sample/sampler.h"

typedef struct {
    const char *model_dir;   /* after common_opts_finish: the path to load (the cached .q3m with --quant) */
    const char *quant;       /* --quant SCHEME, or NULL */
    long ctx, threads;
    int seed_given;
    q3_sampler_params sp;
} common_opts;

void common_opts_init(common_opts *o);
/* Try to consume argv[*i] (and its value). Returns 1 if consumed, 0 if not
 * one of ours, -1 on a bad value (message printed). */
int common_opts_parse(common_opts *o, int argc, char **argv, int *i);
void common_opts_help(FILE *f);
/* Seed from the clock when none was given, and resolve -m / --quant
 * (q3_resolve_model: may convert into the cache). A failure to resolve
 * prints the error and exits with status 1 (nothing is held yet). */
void common_opts_finish(common_opts *o);

#endif
