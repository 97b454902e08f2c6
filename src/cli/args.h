/* Argument parsing helpers shared by the sub-commands: each failure prints
 * "q3moe: error: OPTION: ..." naming the argument and returns non-zero. */
#ifndef Q3_ARGS_H
#define Q3_ARGS_H

#include <stddef.h>
#include <stdint.h>

/* Fetch the value following option argv[*i]; advances *i. NULL (with a
 * message printed) when missing. */
const char *arg_value(int argc, char **argv, int *i);
/* Parse a whole-string integer / float in [lo, hi]; 0 on success. */
int arg_int(const char *opt, const char *s, long lo, long hi, long *out);
int arg_float(const char *opt, const char *s, double lo, double hi, double *out);
/* Parse "1,2,3" into a heap array of int32 (caller frees). */
int arg_id_list(const char *opt, const char *s, int32_t **ids, size_t *n);
/* Report an unknown option or stray argument. */
int arg_unknown(const char *cmd, const char *arg);

#endif
