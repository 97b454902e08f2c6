/* `q3moe chat`: interactive multi-turn chat. The KV cache is kept between
 * turns: each turn feeds only the new tokens (closing the previous
 * assistant turn, then the new user turn), never the whole history; the
 * last answer is fed again only where the template writes it otherwise
 * (chat_conv). */
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
               "Type /no_think or /think in a message, as a word, to switch reasoning for that turn;\n"
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

/* The conversation as the KV cache holds it. Each turn feeds only what is
 * new, except where Qwen3's template renders the last answer otherwise in
 * the history (without its reasoning, or without the empty think block a
 * turn without thinking opens with): the cache is cut back to where that
 * answer starts and the answer fed again as the template writes it. */
typedef struct {
    q3_session *s;
    q3_sampler *smp;
    int turns;
    int32_t *log;     /* the tokens in the cache, in order (context size) */
    int32_t *sampled; /* the last answer's sampled tokens (tokens per answer) */
    int n_sampled;    /* ... without the end token that closed it */
    int unfed;        /* its last token when sampled but not in the cache (-1: none) */
    int asst_pos;     /* where it starts in the cache: after "<|im_start|>assistant", */
    int asst_nl;      /* ... before the header's "\n" (1), or after it (0: a tokenizer that merged it) */
    int think;        /* whether its turn had thinking on */
    int32_t *block;   /* the empty think block's tokens */
    size_t n_block;
    int32_t *nl;      /* "\n" alone */
    size_t n_nl;
} chat_conv;

static void conv_clear(chat_conv *c) {
    q3_state_reset(&c->s->state);
    q3_sampler_forget(c->smp);
    c->turns = 0;
}

static int append_ids(chat_conv *c, int32_t **ids, size_t *n, const char *text) {
    int32_t *more = NULL;
    size_t m = 0;
    if (session_encode(c->s, text, &more, &m)) return -1;
    *ids = q3_realloc(*ids, (*n + m + 1) * sizeof **ids); /* + 1: never a size of 0 */
    memcpy(*ids + *n, more, m * sizeof *more);
    *n += m;
    free(more);
    return 0;
}

/* The tokens of the next user turn and the cache position they go at: the
 * end of the last answer (after its unfed token, when there is one), or
 * that answer again as the template renders it, from where it starts. */
static int turn_ids(chat_conv *c, const char *system, const char *line, int think, int32_t **ids, size_t *n, int *at) {
    *ids = NULL, *n = 0, *at = c->s->state.pos;
    int r = 0;
    if (c->turns) {
        int k = 0; /* ids the tokenizer lacks (a vocabulary's padding) have no text, as when printed */
        for (int i = 0; i < c->n_sampled; i++) {
            size_t len;
            if (q3_tok_token_bytes(c->s->tok, c->sampled[i], &len)) c->sampled[k++] = c->sampled[i];
        }
        char *answer = q3_tok_decode(c->s->tok, c->sampled, (size_t)k, NULL);
        if (!answer) return -1;
        const char *content = chat_answer_content(answer);
        if (!c->think || content != answer) {
            /* from the header's "\n" on, which the answer's first characters may join ("\n \nSure") */
            *at = c->asst_pos;
            char *text = q3_malloc(strlen(content) + 16);
            sprintf(text, "%s%s<|im_end|>\n", c->asst_nl ? "\n" : "", content);
            r = append_ids(c, ids, n, text);
            free(text);
        } else {
            if (c->unfed >= 0) *ids = q3_malloc(sizeof **ids), (*ids)[(*n)++] = c->unfed;
            r = append_ids(c, ids, n, "<|im_end|>\n");
        }
        free(answer);
    }
    char *turn = chat_format_turn(c->turns ? NULL : system, line, 1); /* ends with the assistant header */
    if (!r) r = append_ids(c, ids, n, turn);
    free(turn);
    c->asst_nl = !r && *n >= c->n_nl && !memcmp(*ids + *n - c->n_nl, c->nl, c->n_nl * sizeof *c->nl);
    c->asst_pos = *at + (int)*n - (c->asst_nl ? (int)c->n_nl : 0);
    if (!r && !think) {
        *ids = q3_realloc(*ids, (*n + c->n_block) * sizeof **ids);
        memcpy(*ids + *n, c->block, c->n_block * sizeof *c->block);
        *n += c->n_block;
    }
    return r;
}

/* Cuts the cache back to `at` and sets the repetition penalty's history to
 * what it then holds (the prompt gen_run feeds follows, as in `generate`). */
static void conv_rewind(chat_conv *c, int at) {
    q3_state_truncate(&c->s->state, at);
    q3_sampler_forget(c->smp);
    for (int i = 0; i < at; i++) q3_sampler_accept(c->smp, c->log[i]);
}

/* One user message: feed its turn, stream the answer. */
static int chat_turn(chat_conv *c, const char *system, const char *line, int no_think, long n_new) {
    const int think = chat_wants_think(line, !no_think);
    int32_t *ids = NULL;
    size_t n = 0;
    int at, r = turn_ids(c, system, line, think, &ids, &n, &at);
    if (r == 0 && c->turns && at + (long)n > c->s->state.ctx) {
        /* No room for this message after the conversation so far: start
         * over with it, as when an answer fills the context. */
        fprintf(stderr, "[q3moe] context full: conversation cleared\n");
        conv_clear(c);
        free(ids);
        r = turn_ids(c, system, line, think, &ids, &n, &at);
    }
    gen_stats st;
    gen_options o = {.max_new = (int)n_new, .out = stdout, .sampled = c->sampled};
    if (r == 0) {
        conv_rewind(c, at);
        r = gen_run(c->s, c->smp, ids, n, &o, &st);
    }
    if (r) {
        free(ids);
        return r;
    }
    memcpy(c->log + at, ids, n * sizeof *ids);
    memcpy(c->log + at + n, c->sampled, (size_t)st.decode_steps * sizeof *ids); /* the fed ones */
    free(ids);
    c->turns++;
    c->think = think;
    c->n_sampled = st.generated - st.hit_eos;
    c->unfed = st.hit_eos ? -1 : st.last_token;
    fputc('\n', stdout);
    fflush(stdout);
    gen_print_stats(&st);
    if (st.hit_ctx) {
        fprintf(stderr, "[q3moe] context full: conversation cleared\n");
        conv_clear(c);
    }
    return 0;
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
    int rc = 0;
    chat_conv c = {.s = &s, .smp = smp, .unfed = -1};
    c.log = q3_malloc((size_t)s.state.ctx * sizeof *c.log);
    c.sampled = q3_malloc((size_t)n_new * sizeof *c.sampled);
    if (session_encode(&s, "<think>\n\n</think>\n\n", &c.block, &c.n_block) || session_encode(&s, "\n", &c.nl, &c.n_nl)) {
        q3_print_error();
        rc = 1;
        goto done;
    }
    const int interactive = isatty(STDIN_FILENO);
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
        if (!strcmp(line, "/reset")) {
            conv_clear(&c);
            fprintf(stderr, "[q3moe] conversation cleared\n");
        } else if (*line && chat_turn(&c, system, line, no_think, n_new)) {
            q3_print_error();
            fprintf(stderr, "[q3moe] conversation cleared\n");
            conv_clear(&c);
            rc = 1;
        }
        free(line);
    }
done:
    free(c.block);
    free(c.nl);
    free(c.sampled);
    free(c.log);
    q3_sampler_free(smp);
    session_close(&s);
    return rc;
}
