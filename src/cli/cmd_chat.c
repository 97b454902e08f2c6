/* `q3moe chat`: interactive multi-turn chat. The KV cache is kept between
 * turns: each turn feeds only the new tokens (closing the previous
 * assistant turn, then the new user turn), never the whole history. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/chat_format.h"
#include "cli/commands.h"
#include "cli/common_opts.h"
#include "cli/session.h"
#include "util/error.h"

static void usage(FILE *f) {
    fprintf(f, "usage: q3moe chat -m DIR [options]\n\n"
               "Reads one user message per line from stdin and streams the answers.\n"
               "Type /no_think or /think inside a message to switch reasoning for that turn;\n"
               "/reset clears the conversation, /exit (or end of input) quits.\n\n"
               "  --system S           system message\n"
               "  --no-think           answer without reasoning by default\n"
               "  -n N                 tokens per answer at most (default 2048)\n");
    common_opts_help(f);
}

static char *read_line(FILE *in) {
    size_t cap = 256, len = 0;
    char *buf = q3_malloc(cap);
    int ch;
    while ((ch = fgetc(in)) != EOF && ch != '\n') {
        if (len + 2 > cap) buf = q3_realloc(buf, cap *= 2);
        buf[len++] = (char)ch;
    }
    if (ch == EOF && len == 0) {
        free(buf);
        return NULL;
    }
    if (len && buf[len - 1] == '\r') len--;
    buf[len] = 0;
    return buf;
}

/* The tokens of one user turn: the previous assistant turn's last token
 * when it was sampled but not fed (unfed >= 0) and its end, then the turn
 * (with the system message when it is the first). */
static int turn_ids(q3_session *s, int turns, const char *system, const char *line, int no_think, int32_t unfed,
                    int32_t **ids, size_t *n) {
    char *turn = chat_format_turn(turns == 0 ? system : NULL, line, chat_wants_think(line, !no_think));
    char *text = q3_malloc(strlen(turn) + 16);
    sprintf(text, "%s%s", turns ? "<|im_end|>\n" : "", turn);
    int r = session_encode(s, text, ids, n);
    if (r == 0 && turns && unfed >= 0) {
        *ids = q3_realloc(*ids, (*n + 1) * sizeof **ids);
        memmove(*ids + 1, *ids, *n * sizeof **ids);
        (*ids)[0] = unfed;
        (*n)++;
    }
    free(text);
    free(turn);
    return r;
}

int cmd_chat(int argc, char **argv) {
    common_opts co;
    common_opts_init(&co);
    const char *system = NULL;
    long n_new = 2048;
    int no_think = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = common_opts_parse(&co, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-think")) no_think = 1;
        else if (!strcmp(a, "--system") || !strcmp(a, "-n")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--system")) system = v;
            else if (arg_int(a, v, 1, 1l << 24, &n_new)) return 2;
        } else return arg_unknown("chat", a);
    }
    if (!co.model_dir) {
        fprintf(stderr, "q3moe chat: error: -m DIR is required\n");
        usage(stderr);
        return 2;
    }
    common_opts_finish(&co);
    q3_session s;
    if (session_open(&s, co.model_dir, (int)co.ctx, (int)co.threads, 1)) {
        q3_print_error();
        return 1;
    }
    q3_sampler *smp = q3_sampler_new(&co.sp, s.model.cfg.vocab_size);
    /* One rank today (chat reads stdin); on a vocab-split model this would
     * pick distributed sampling as generate does. */
    if (!smp || session_sampling_setup(&s, &co.sp, 0)) {
        q3_print_error();
        session_close(&s);
        return 1;
    }
    const int interactive = isatty(STDIN_FILENO);
    int turns = 0, rc = 0;
    /* The last answer's final token when the answer did not end with an end
     * token (-n reached): sampled and printed but not yet in the cache. */
    int32_t unfed = -1;
    for (;;) {
        if (interactive) {
            fputs("\n> ", stdout);
            fflush(stdout);
        }
        char *line = read_line(stdin);
        if (!line || !strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset") || !*line) {
            if (*line) {
                q3_state_reset(&s.state);
                turns = 0;
                unfed = -1;
                fprintf(stderr, "[q3moe] conversation cleared\n");
            }
            free(line);
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        gen_stats st;
        gen_options o = {.max_new = (int)n_new, .out = stdout};
        int r = turn_ids(&s, turns, system, line, no_think, unfed, &ids, &n);
        if (r == 0 && turns && s.state.pos + (long)n > s.state.ctx) {
            /* No room for this message after the conversation so far: start
             * over with it, as when an answer fills the context. */
            fprintf(stderr, "[q3moe] context full: conversation cleared\n");
            q3_state_reset(&s.state);
            turns = 0;
            unfed = -1;
            free(ids);
            ids = NULL;
            r = turn_ids(&s, turns, system, line, no_think, unfed, &ids, &n);
        }
        if (r == 0) r = gen_run(&s, smp, ids, n, &o, &st);
        if (r) {
            q3_print_error();
            fprintf(stderr, "[q3moe] conversation cleared\n");
            q3_state_reset(&s.state);
            turns = 0;
            unfed = -1;
            rc = 1;
        } else {
            turns++;
            unfed = st.hit_eos ? -1 : st.last_token;
            fputc('\n', stdout);
            fflush(stdout);
            gen_print_stats(&st);
            if (st.hit_ctx) {
                fprintf(stderr, "[q3moe] context full: conversation cleared\n");
                q3_state_reset(&s.state);
                turns = 0;
                unfed = -1;
            }
        }
        free(ids);
        free(line);
    }
    q3_sampler_free(smp);
    session_close(&s);
    return rc;
}
