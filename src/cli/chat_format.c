#include "cli/chat_format.h"

#include <ctype.h>
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

/* Whether word starts at p as a word of its own: not inside a word, a path
 * or a tag ("/thinking", "</think>", "a.com/think" are not switches), but
 * after text without spaces such as Chinese ("你好/no_think" is one). */
static int joins(unsigned char c, const char *also) { return c && (isalnum(c) || strchr(also, c)); }

static int switch_at(const char *s, const char *p, size_t n) {
    return !(p > s && joins((unsigned char)p[-1], "_-/.<:")) && !joins((unsigned char)p[n], "_-/");
}

static const char *last_switch(const char *s, const char *word) {
    const char *last = NULL;
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word))
        if (switch_at(s, p, strlen(word))) last = p;
    return last;
}

int chat_wants_think(const char *user, int dflt) {
    const char *no = last_switch(user, "/no_think"), *yes = last_switch(user, "/think");
    if (no && yes) return no > yes ? 0 : 1; /* the last switch wins */
    if (no) return 0;
    if (yes) return 1;
    return dflt;
}

const char *chat_answer_content(const char *answer) {
    const char *end = NULL;
    for (const char *p = strstr(answer, "</think>"); p; p = strstr(p + 1, "</think>")) end = p + 8;
    if (!end) return answer;
    while (*end == '\n') end++;
    return end;
}
