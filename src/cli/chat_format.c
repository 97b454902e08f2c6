#include "cli/chat_format.h"

#include <stdio.h>
#include <string.h>

#include "util/error.h"

char *chat_format_turn(const char *system, const char *user, int think) {
    size_t n = strlen(user) + (system ? strlen(system) : 0) + 128;
    char *p = q3_malloc(n);
    int k = 0;
    if (system) k += snprintf(p + k, n - k, "<|im_start|>system\n%s<|im_end|>\n", system);
    k += snprintf(p + k, n - k, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
    if (!think) snprintf(p + k, n - k, "<think>\n\n</think>\n\n");
    return p;
}

static const char *last_of(const char *s, const char *word) {
    const char *last = NULL;
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word)) last = p;
    return last;
}

int chat_wants_think(const char *user, int dflt) {
    const char *no = last_of(user, "/no_think"), *yes = last_of(user, "/think");
    if (no && yes) return no > yes ? 0 : 1; /* the last switch wins */
    if (no) return 0;
    if (yes) return 1;
    return dflt;
}
