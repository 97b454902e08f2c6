/* `q3moe perplexity`: perplexity of a model on a text, and with --base its
 * divergence from a reference model (e.g. the BF16 checkpoint a quantized
 * .q3m came from) on the same tokens.
 *
 * The text is tokenized and cut into chunks of --chunk tokens; each chunk
 * starts from an empty cache and goes through one prefill with logits for
 * every row. Row i predicts token i+1, so a chunk of n tokens scores n - 1
 * positions (a trailing 1-token chunk scores none). All per-position
 * arithmetic is in double: NLL = logsumexp(row) - row[next];
 * KL(base || model) = sum_v p_base(v) * (log p_base(v) - log p_model(v)). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "quant/cache.h"
#include "util/error.h"
#include "util/file.h"

#define DEFAULT_CHUNK 512

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe perplexity -m MODEL [--quant SCHEME] (-f TEXT | --ids LIST) [--base BASE]\n"
            "                        [--chunk N] [--ctx N] [-t THREADS] [--json FILE [--force]]\n\n"
            "Tokenizes TEXT, cuts it into chunks of N tokens and runs each chunk from an empty cache\n"
            "(one prefill, logits for every position). Every position after the first of a chunk is\n"
            "scored by the negative log-likelihood of its token; prints exp(mean NLL).\n"
            "With --base, BASE runs the same tokens too and the mean KL(base || model), the top-1\n"
            "agreement (argmax equal) and the largest |logit difference| are printed as well.\n\n"
            "  -m MODEL       checkpoint directory or .q3m file\n"
            "  --quant S      run MODEL (a directory) quantized: w4a8, w8a8, w4a8i, w8a8i, w4, w8, bf16 or bf16p;\n"
            "                 converted once into the cache (--base is always run as given)\n"
            "  -f TEXT        text file to score (read whole, as UTF-8)\n"
            "  --ids LIST     comma-separated token ids to score instead of a text\n"
            "  --base BASE    reference model with the same vocabulary (e.g. the BF16 checkpoint)\n"
            "  --chunk N      tokens per chunk, >= 2 (default min(context size, %d))\n"
            "  --ctx N        context size (default min(max_position_embeddings, 4096)); --chunk <= N\n"
            "  -t THREADS     worker threads (default: all cores)\n"
            "  --json FILE    also write the results as one JSON line to FILE\n"
            "  --force        overwrite an existing --json FILE\n",
            DEFAULT_CHUNK);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int fail(const char *fmt, ...) Q3_PRINTF(1, 2);
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("q3moe perplexity: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* logsumexp of a row (double), and its argmax (the lowest index wins ties). */
static double row_lse(const float *x, size_t V, size_t *argmax) {
    size_t am = 0;
    float mx = x[0];
    for (size_t i = 1; i < V; i++)
        if (x[i] > mx) {
            mx = x[i];
            am = i;
        }
    double s = 0.0;
    for (size_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
    *argmax = am;
    return mx + log(s);
}

/* Per scored position. */
typedef struct {
    double nll, base_nll, kl, max_d;
    int agree;
} pos_stats;

static void score_row(const float *m, const float *b, size_t V, int32_t next, pos_stats *ps) {
    size_t am, ab;
    double lm = row_lse(m, V, &am);
    ps->nll = lm - m[next];
    if (!b) return;
    double lb = row_lse(b, V, &ab);
    ps->base_nll = lb - b[next];
    ps->agree = am == ab;
    double kl = 0.0, md = 0.0;
    for (size_t i = 0; i < V; i++) {
        double lpb = b[i] - lb, lpm = m[i] - lm;
        kl += exp(lpb) * (lpb - lpm);
        double d = fabs((double)m[i] - b[i]);
        if (d > md || d != d) md = d;
    }
    ps->kl = kl;
    ps->max_d = md;
}

typedef struct {
    size_t tokens, scored, chunks;
    long chunk;
    double sum_nll, sum_base_nll, sum_kl, max_d;
    size_t agree;
} totals;

static int write_json(const char *path, int force, const char *model, const char *quant, const char *base,
                      const char *text, const totals *t) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "quant", quant ? json_string(quant) : json_null());
    json_object_set_new(o, "base", base ? json_string(base) : json_null());
    json_object_set_new(o, "text", text ? json_string(text) : json_null());
    json_object_set_new(o, "tokens", json_integer((json_int_t)t->tokens));
    json_object_set_new(o, "scored", json_integer((json_int_t)t->scored));
    json_object_set_new(o, "chunk", json_integer((json_int_t)t->chunk));
    json_object_set_new(o, "chunks", json_integer((json_int_t)t->chunks));
    json_object_set_new(o, "mean_nll", json_real(t->sum_nll / t->scored));
    json_object_set_new(o, "perplexity", json_real(exp(t->sum_nll / t->scored)));
    if (base) {
        json_object_set_new(o, "base_mean_nll", json_real(t->sum_base_nll / t->scored));
        json_object_set_new(o, "base_perplexity", json_real(exp(t->sum_base_nll / t->scored)));
        json_object_set_new(o, "kl_mean", json_real(t->sum_kl / t->scored));
        json_object_set_new(o, "top1_agree", json_integer((json_int_t)t->agree));
        json_object_set_new(o, "top1_pct", json_real(100.0 * t->agree / t->scored));
        json_object_set_new(o, "max_abs_dlogit", json_real(t->max_d));
    }
    int rc = 0, fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL), 0644);
    if (fd < 0) {
        rc = errno == EEXIST ? q3_err("--json: %s already exists (use --force to overwrite)", path)
                             : q3_err("--json: cannot create %s: %s", path, strerror(errno));
    } else {
        FILE *f = fdopen(fd, "w");
        if (!f) {
            close(fd);
            rc = q3_err("--json: cannot write %s", path);
        } else {
            if (json_dumpf(o, f, JSON_COMPACT | JSON_PRESERVE_ORDER) || fputc('\n', f) == EOF) rc = -1;
            if (fclose(f) != 0) rc = -1;
            if (rc) {
                q3_err("--json: error writing %s", path);
                q3_remove_partial(path);
            }
        }
    }
    json_decref(o);
    return rc;
}

/* Re-create a session's state with room for exactly one chunk: the chunks
 * never share a cache, so a longer one would only cost memory. */
static int size_state(q3_session *s, long chunk) {
    if (s->state.ctx == chunk) return 0;
    q3_state_free(&s->state);
    return q3_state_init(&s->state, &s->model, (int)chunk, 0);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model_path = NULL, *quant = NULL, *text_path = NULL, *ids_s = NULL, *base_path = NULL, *json_path = NULL;
    long chunk = 0, ctx = 0, threads = 0;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "-f") || !strcmp(a, "--base") || !strcmp(a, "--chunk") ||
                 !strcmp(a, "--ctx") || !strcmp(a, "-t") || !strcmp(a, "--json") || !strcmp(a, "--ids") ||
                 !strcmp(a, "--quant")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "-m")) model_path = v;
            else if (!strcmp(a, "-f")) text_path = v;
            else if (!strcmp(a, "--ids")) ids_s = v;
            else if (!strcmp(a, "--base")) base_path = v;
            else if (!strcmp(a, "--quant")) quant = v;
            else if (!strcmp(a, "--json")) json_path = v;
            else if (!strcmp(a, "--chunk") && arg_int(a, v, 2, 1l << 24, &chunk)) return 2;
            else if (!strcmp(a, "--ctx") && arg_int(a, v, 2, 1l << 24, &ctx)) return 2; /* 1 position scores nothing */
            else if (!strcmp(a, "-t") && arg_int(a, v, 1, 1024, &threads)) return 2;
        } else return arg_unknown("perplexity", a);
    }
    if (!model_path || !text_path == !ids_s) {
        fprintf(stderr, "q3moe perplexity: error: -m MODEL and one of -f TEXT or --ids LIST are required\n");
        usage(stderr);
        return 2;
    }
    if (chunk && ctx && chunk > ctx) return fail("--chunk %ld exceeds --ctx %ld", chunk, ctx);
    if (json_path && q3_check_output(json_path, force)) return fail("--json: %s", q3_errmsg());

    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0, text_len = 0;
    char *text = NULL;
    if (ids_s) {
        if (arg_id_list("--ids", ids_s, &ids, &n_ids)) return 2;
    } else if (!(text = q3_read_file(text_path, &text_len))) {
        q3_print_error();
        return 1;
    }
    float *lm = NULL, *lb = NULL;
    pos_stats *ps = NULL;
    char *load_path = NULL;
    q3_session s, b;
    int have_s = 0, have_b = 0;
    if (q3_resolve_model(model_path, quant, &load_path)) goto q3_error;
    /* A text without --base: the model must tokenize it; with --base either may. */
    if (session_open(&s, load_path, (int)ctx, (int)threads, text && !base_path)) goto q3_error;
    have_s = 1;
    if (base_path) {
        if (session_open(&b, base_path, (int)ctx, (int)threads, 0)) goto q3_error;
        have_b = 1;
        if (b.model.cfg.vocab_size != s.model.cfg.vocab_size) {
            fail("the vocabularies differ: %s has vocab_size %d, %s has %d", model_path, s.model.cfg.vocab_size, base_path,
                 b.model.cfg.vocab_size);
            goto done;
        }
    }
    if (text) {
        q3_tokenizer *tok = s.tok ? s.tok : have_b ? b.tok : NULL;
        if (!tok) {
            fail("neither %s nor %s has a usable tokenizer.json, which is needed to turn the text into tokens (use --ids)",
                 model_path, base_path ? base_path : "the base");
            goto done;
        }
        if (q3_tok_encode(tok, text, text_len, &ids, &n_ids)) goto q3_error;
    }
    if (n_ids < 2) {
        fail("%s gives %zu token%s; perplexity needs at least 2", text ? text_path : "--ids", n_ids, n_ids == 1 ? "" : "s");
        goto done;
    }

    if (!chunk) chunk = s.state.ctx < DEFAULT_CHUNK ? s.state.ctx : DEFAULT_CHUNK;
    if (chunk < 2) { /* a model whose max_position_embeddings is 1 */
        fail("the context holds %d token; perplexity needs at least 2 to score one", s.state.ctx);
        goto done;
    }
    if (chunk > s.state.ctx) {
        fail("--chunk %ld exceeds the context size %d (raise --ctx)", chunk, s.state.ctx);
        goto done;
    }
    if (chunk > (long)n_ids) chunk = (long)n_ids; /* the state need not be bigger than the text */
    if (size_state(&s, chunk) || (have_b && size_state(&b, chunk))) goto q3_error;

    const size_t V = (size_t)s.model.cfg.vocab_size;
    lm = q3_malloc((size_t)chunk * V * sizeof(float));
    if (have_b) lb = q3_malloc((size_t)chunk * V * sizeof(float));
    ps = q3_calloc((size_t)chunk, sizeof *ps);

    totals t = {.tokens = n_ids, .chunk = chunk};
    size_t n_chunks = (n_ids + (size_t)chunk - 1) / (size_t)chunk;
    for (size_t c = 0; c < n_chunks; c++) {
        const int32_t *cid = ids + c * (size_t)chunk;
        int n = (int)(n_ids - c * (size_t)chunk < (size_t)chunk ? n_ids - c * (size_t)chunk : (size_t)chunk);
        if (n < 2) {
            fprintf(stderr, "[q3moe] chunk %zu/%zu: 1 token, nothing to score\n", c + 1, n_chunks);
            continue;
        }
        double t0 = now_ms();
        q3_state_reset(&s.state);
        if (q3_forward(&s.model, &s.state, cid, n, lm, 1)) goto q3_error;
        if (have_b) {
            q3_state_reset(&b.state);
            if (q3_forward(&b.model, &b.state, cid, n, lb, 1)) goto q3_error;
        }
#pragma omp parallel for schedule(dynamic, 4)
        for (int r = 0; r < n - 1; r++)
            score_row(lm + (size_t)r * V, have_b ? lb + (size_t)r * V : NULL, V, cid[r + 1], &ps[r]);
        /* Summed in position order: the result does not depend on the thread count. */
        for (int r = 0; r < n - 1; r++) {
            if (!isfinite(ps[r].nll) || (have_b && (!isfinite(ps[r].base_nll) || !isfinite(ps[r].kl)))) {
                char what[128];
                snprintf(what, sizeof what, "non-finite logits at token %zu (chunk %zu, position %d)", c * (size_t)chunk + (size_t)r,
                         c + 1, r);
                session_explain_nan(isfinite(ps[r].nll) ? &b.model : &s.model, what);
                goto q3_error;
            }
            t.sum_nll += ps[r].nll;
            if (have_b) {
                t.sum_base_nll += ps[r].base_nll;
                t.sum_kl += ps[r].kl;
                t.agree += (size_t)ps[r].agree;
                if (ps[r].max_d > t.max_d) t.max_d = ps[r].max_d;
            }
        }
        t.scored += (size_t)n - 1;
        t.chunks++;
        fprintf(stderr, "[q3moe] chunk %zu/%zu: %d tokens, %.0f ms; perplexity so far %.4f", c + 1, n_chunks, n,
                now_ms() - t0, exp(t.sum_nll / t.scored));
        if (have_b)
            fprintf(stderr, ", KL %.6f, top-1 %.2f%%, max|dlogit| %.4g", t.sum_kl / t.scored, 100.0 * t.agree / t.scored,
                    t.max_d);
        fputc('\n', stderr);
    }

    printf("perplexity: %.6f (mean NLL %.6f) over %zu scored tokens (%zu tokens, %zu chunk%s of up to %ld)\n",
           exp(t.sum_nll / t.scored), t.sum_nll / t.scored, t.scored, t.tokens, t.chunks, t.chunks == 1 ? "" : "s", chunk);
    if (have_b) {
        printf("base perplexity: %.6f (mean NLL %.6f)\n", exp(t.sum_base_nll / t.scored), t.sum_base_nll / t.scored);
        printf("KL(base || model): %.6g mean over %zu positions\n", t.sum_kl / t.scored, t.scored);
        printf("top-1 agreement: %.2f%% (%zu / %zu)\n", 100.0 * t.agree / t.scored, t.agree, t.scored);
        printf("max |delta logit|: %.6g\n", t.max_d);
    }
    fflush(stdout);
    if (json_path && write_json(json_path, force, model_path, quant, base_path, text_path, &t)) goto q3_error;
    rc = 0;
    goto done;

q3_error:
    q3_print_error();
done:
    free(load_path);
    free(ps);
    free(lm);
    free(lb);
    free(ids);
    free(text);
    if (have_b) session_close(&b);
    if (have_s) session_close(&s);
    return rc;
}
