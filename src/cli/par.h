/* The parallel options of the model commands (logits, generate): --config
 * FILE and the plan flags (--attn-tp, --moe-tp, --moe-ep, --lmhead-tp,
 * --moe-ep-comm, --comm-quant), resolved into a plan validated against the
 * job's world size and the model's config BEFORE any weight is read. */
#ifndef Q3_CLI_PAR_H
#define Q3_CLI_PAR_H

#include <stdio.h>

#include "parallel/plan.h"

#define PAR_MAX_FLAGS 32

typedef struct {
    const char *config;              /* --config FILE, or NULL */
    int flag_at[PAR_MAX_FLAGS];      /* argv index of each plan flag, replayed after the YAML */
    int n_flags;
    int argc;
    char **argv;
    q3_plan plan;                    /* after par_setup: validated */
    int world, rank;
} par_opts;

void par_opts_init(par_opts *o, int argc, char **argv);
/* Try to consume argv[*i] (and its value): 1 consumed, 0 not ours, -1 bad
 * (message printed on rank 0). */
int par_opts_parse(par_opts *o, const char *cmd, int *i);
void par_opts_help(FILE *f);
/* Build the plan (defaults, then --config, then the flags), read the
 * model's config (*model_path may come from the YAML's model_path when
 * NULL), validate, print the plan on rank 0 when running on several ranks
 * or when a plan was asked for, and switch off prefaulting on several
 * ranks. *quant: the --quant value, or NULL; on several ranks it is
 * resolved here (rank 0 fills the cache first, src/quant/cache.h), leaving
 * *model_path the cached .q3m and *quant NULL. Returns 0, or an exit status
 * after printing the error on rank 0; an error that could differ between
 * ranks takes the whole job down (q3_comm_abort). */
int par_setup(par_opts *o, const char *cmd, const char **model_path, const char **quant);
/* Errors after start-up on several ranks: the ranks could disagree, so
 * take the job down with the message; on one rank print it. */
void par_fail(const par_opts *o, const char *cmd);
/* The plan to hand to session_open (NULL on one rank). */
const q3_plan *par_plan(const par_opts *o);

#endif
