#include "cli/session.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/tensor_check.h"
#include "model/shard.h"
#include "parallel/comm.h"
#include "util/error.h"
#include "util/file.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int session_open(q3_session *s, const char *dir, int ctx, int n_threads, int need_tokenizer) {
    return session_open_plan(s, dir, ctx, n_threads, need_tokenizer, NULL);
}

int session_open_plan(q3_session *s, const char *dir, int ctx, int n_threads, int need_tokenizer, const q3_plan *plan) {
    memset(s, 0, sizeof *s);
    if (n_threads > 0) omp_set_num_threads(n_threads);
    if (q3_model_load(&s->model, dir)) return -1;
    if (plan && q3_shard_apply(&s->model, plan)) {
        q3_model_free(&s->model);
        return -1;
    }
    const q3_config *c = &s->model.cfg;
    const q3m_file *pk = s->model.q3m;
    char *tp = pk ? q3_malloc(strlen(dir) + 32) : q3_path_join(dir, "tokenizer.json");
    if (pk) sprintf(tp, "%s (embedded tokenizer.json)", dir);
    int rc = 0;
    if (pk ? pk->tokenizer_json != NULL : q3_file_exists(tp)) {
        s->tok = pk ? q3_tok_load_buffer(pk->tokenizer_json, pk->tokenizer_len, tp) : q3_tok_load(tp);
        if (!s->tok) rc = -1;
        else if (q3_tok_n_ids(s->tok) > c->vocab_size) {
            snprintf(s->tok_why, sizeof s->tok_why, "%s produces ids up to %d but the model's vocab_size is %d", tp,
                     q3_tok_n_ids(s->tok) - 1, c->vocab_size);
            if (need_tokenizer) rc = q3_err("%s", s->tok_why);
            q3_tok_free(s->tok);
            s->tok = NULL;
        }
    } else {
        snprintf(s->tok_why, sizeof s->tok_why, pk ? "%s has no embedded tokenizer.json (its checkpoint had none)" : "%s has no tokenizer.json",
                 dir);
        if (need_tokenizer) rc = q3_err("%s, which is needed to turn text into tokens (use --ids)", s->tok_why);
    }
    free(tp);
    if (rc == 0) rc = q3_state_init(&s->state, &s->model, ctx, 0);
    if (rc) {
        session_close(s);
        return -1;
    }
    s->logits = q3_malloc((size_t)c->vocab_size * sizeof(float));
    if (s->tok) {
        const char *names[] = {"<|im_end|>", "<|endoftext|>"};
        for (int i = 0; i < 2; i++) {
            int32_t id = q3_tok_lookup(s->tok, names[i]);
            if (id >= 0) s->eos_ids[s->n_eos++] = id;
        }
    }
    const q3_group *w = q3_comm_world();
    if (c->eos_past_vocab >= 0 && (!w || q3_group_rank(w) == 0))
        fprintf(stderr, "q3moe: note: %s: eos_token_id %lld is past the vocabulary (%d tokens); ignored\n", dir,
                c->eos_past_vocab, c->vocab_size);
    if (c->eos_token_id >= 0 && s->n_eos < 4) {
        int dup = 0;
        for (int i = 0; i < s->n_eos; i++) dup |= s->eos_ids[i] == c->eos_token_id;
        if (!dup) s->eos_ids[s->n_eos++] = c->eos_token_id;
    }
    return 0;
}

void session_close(q3_session *s) {
    q3_state_free(&s->state);
    q3_model_free(&s->model);
    if (s->tok) q3_tok_free(s->tok);
    free(s->logits);
    free(s->cand_send);
    free(s->cand_recv);
    memset(s, 0, sizeof *s);
}

int session_sampling_setup(q3_session *s, const q3_sampler_params *p, int verbose) {
    const q3_shard *sh = s->model.shard;
    free(s->cand_send);
    free(s->cand_recv);
    s->cand_send = s->cand_recv = NULL;
    s->cand_k = 0;
    s->state.lm_local_only = 0;
    if (!sh || !s->state.lm_local) return 0; /* whole rows on this rank already */
    const int V = s->model.cfg.vocab_size, Vl = sh->vocab_n, L = q3_group_size(sh->g.lmhead);
    const int k = q3_sampler_cands_per_rank(p, V, Vl);
    const int rank0 = q3_group_rank(q3_comm_world()) == 0;
    if (k == 0) {
        if (verbose && rank0)
            fprintf(stderr, "  sampling: whole logits rows gathered (%d floats per rank per token): %s\n", Vl,
                    p->top_k > 0 ? "top_k is not below a slice's candidates' size" : "top_k is off (top-p/min-p need every token)");
        return 0;
    }
    if (verbose && rank0)
        fprintf(stderr, "  sampling: distributed over the %d lm_head ranks, %d candidate%s per rank (%zu bytes) "
                        "instead of %d logits (%zu bytes)\n",
                L, k, k == 1 ? "" : "s", (size_t)k * sizeof(q3_sample_cand), Vl, (size_t)Vl * sizeof(float));
    s->cand_k = k;
    s->cand_send = q3_malloc((size_t)k * sizeof *s->cand_send);
    s->cand_recv = q3_malloc((size_t)k * (size_t)L * sizeof *s->cand_recv);
    s->state.lm_local_only = 1;
    return 0;
}

int32_t session_sample(q3_session *s, q3_sampler *smp) {
    if (!s->cand_k) return q3_sampler_sample(smp, s->logits);
    const q3_shard *sh = s->model.shard;
    const size_t k = (size_t)s->cand_k, L = (size_t)q3_group_size(sh->g.lmhead);
    q3_sampler_local(smp, s->state.lm_local, sh->a.vocab_lo, sh->vocab_n, s->cand_send, s->cand_k);
    q3_comm_allgather_bytes(sh->g.lmhead, s->cand_send, k * sizeof *s->cand_send, s->cand_recv);
    return q3_sampler_pick(smp, s->cand_recv, k * L);
}

int session_explain_nan(const q3_model *m, const char *logits_what) {
    /* Every rank of a job maps the same files and finds the same element. */
    size_t bytes = 0;
    for (int f = 0; f < m->st.n_files; f++) bytes += m->st.files[f].size;
    const q3_group *w = q3_comm_world();
    if (bytes >= 1000000000 && (!w || q3_group_rank(w) == 0)) /* a scan that takes a while */
        fprintf(stderr, "[q3moe] %s; looking for a NaN or infinite weight in %s (%.2f GB)\n", logits_what, m->dir, bytes / 1e9);
    q3_bad_element e;
    if (!q3_find_non_finite(&m->st, &e))
        return q3_err("%s: %s, but no weight is NaN or infinite: an activation overflowed", m->dir, logits_what);
    char where[1024];
    q3_bad_element_describe(&e, where, sizeof where);
    return q3_err("%s: %s: %s", m->dir, logits_what, where);
}

int session_encode_n(q3_session *s, const char *text, size_t len, int32_t **ids, size_t *n) {
    if (!s->tok) return q3_err("%s", s->tok_why);
    return q3_tok_encode(s->tok, text, len, ids, n);
}

int session_encode(q3_session *s, const char *text, int32_t **ids, size_t *n) {
    return session_encode_n(s, text, strlen(text), ids, n);
}

static int is_eos(const q3_session *s, int32_t id) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos_ids[i] == id) return 1;
    return 0;
}

/* Text produced so far in this call, to find stop strings; output lags by
 * the longest tail that could still become a stop string. */
typedef struct {
    char *buf;
    size_t len, cap, printed;
} text_acc;

static void acc_add(text_acc *a, const char *p, size_t n) {
    if (a->len + n + 1 > a->cap) {
        a->cap = (a->len + n + 1) * 2;
        a->buf = q3_realloc(a->buf, a->cap);
    }
    memcpy(a->buf + a->len, p, n);
    a->len += n;
    a->buf[a->len] = 0;
}

/* Returns 1 when a stop string was found (text up to it is printed). */
static int acc_flush(text_acc *a, const gen_options *o, int final) {
    size_t safe = a->len;
    const char *first = NULL; /* the earliest match of any stop string */
    for (int i = 0; i < o->n_stops; i++) {
        const char *hit = strstr(a->buf + a->printed, o->stops[i]);
        if (hit && (!first || hit < first)) first = hit;
    }
    if (first) {
        fwrite(a->buf + a->printed, 1, (size_t)(first - (a->buf + a->printed)), o->out);
        a->printed = a->len;
        return 1;
    }
    if (!final)
        for (int i = 0; i < o->n_stops; i++) {
            size_t sl = strlen(o->stops[i]);
            for (size_t k = sl - 1; k > 0; k--)
                if (k <= a->len - a->printed && !memcmp(a->buf + a->len - k, o->stops[i], k)) {
                    if (a->len - k < safe) safe = a->len - k;
                    break;
                }
        }
    fwrite(a->buf + a->printed, 1, safe - a->printed, o->out);
    a->printed = safe;
    return 0;
}

int gen_run(q3_session *s, q3_sampler *smp, const int32_t *prompt, size_t n_prompt, const gen_options *o, gen_stats *st) {
    memset(st, 0, sizeof *st);
    st->prompt_tokens = (int)n_prompt;
    if (s->state.pos + (long)n_prompt > s->state.ctx)
        return q3_err("prompt of %zu tokens does not fit: %d already in the cache, context size is %d (raise --ctx)", n_prompt,
                      s->state.pos, s->state.ctx);
    for (size_t i = 0; i < n_prompt; i++) q3_sampler_accept(smp, prompt[i]);
    double t0 = now_ms();
    if (q3_forward(&s->model, &s->state, prompt, (int)n_prompt, s->logits, 0)) return -1;
    st->prefill_ms = now_ms() - t0;
    t0 = now_ms();
    q3_utf8_stream us;
    q3_utf8_stream_init(&us);
    text_acc acc = {0};
    char piece[512];
    if (o->print_ids) fputc('[', o->out);
    for (int i = 0; i < o->max_new; i++) {
        int32_t tok = session_sample(s, smp);
        if (tok == Q3_SAMPLE_NONE) {
            char what[96];
            if (i == 0) snprintf(what, sizeof what, "every logit after the %zu-token prompt is NaN", n_prompt);
            else snprintf(what, sizeof what, "every logit is NaN after %d generated tokens", i);
            free(acc.buf);
            return session_explain_nan(&s->model, what);
        }
        st->last_token = tok;
        if (o->sampled) o->sampled[st->generated] = tok;
        st->generated++;
        if (!o->ignore_eos && is_eos(s, tok)) {
            st->hit_eos = 1;
            break;
        }
        q3_sampler_accept(smp, tok);
        if (o->print_ids) {
            fprintf(o->out, "%s%d", i ? "," : "", tok);
        } else if (s->tok) {
            size_t len;
            const char *bytes = q3_tok_token_bytes(s->tok, tok, &len);
            if (bytes) {
                size_t n = q3_utf8_stream_feed(&us, bytes, len, piece, sizeof piece);
                acc_add(&acc, piece, n);
                if (acc_flush(&acc, o, 0)) {
                    st->hit_stop = 1;
                    break;
                }
            }
        }
        fflush(o->out);
        if (i + 1 == o->max_new) break;
        if (s->state.pos >= s->state.ctx) {
            st->hit_ctx = 1;
            break;
        }
        if (q3_forward(&s->model, &s->state, &tok, 1, s->logits, 0)) {
            free(acc.buf);
            return -1;
        }
        st->decode_steps++;
    }
    if (o->print_ids) fputs("]\n", o->out);
    else if (!st->hit_stop) {
        size_t n = q3_utf8_stream_flush(&us, piece, sizeof piece);
        acc_add(&acc, piece, n);
        acc_flush(&acc, o, 1);
    }
    fflush(o->out);
    free(acc.buf);
    st->decode_ms = now_ms() - t0;
    return 0;
}

void gen_print_stats(const gen_stats *st) {
    double per = st->decode_steps ? st->decode_ms / st->decode_steps : 0.0;
    fprintf(stderr, "\n[q3moe] prompt tokens: %d, prefill: %.1f ms (%.1f tok/s), generated tokens: %d, %.2f ms/token (%.1f tok/s)%s\n",
            st->prompt_tokens, st->prefill_ms, st->prefill_ms > 0 ? st->prompt_tokens * 1e3 / st->prefill_ms : 0.0,
            st->generated, per, per > 0 ? 1e3 / per : 0.0,
            st->hit_ctx ? " [stopped: context full]" : "");
}
