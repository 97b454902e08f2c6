/* The parallel plan: YAML / flags, validation, assignment, groups, print.
 * See plan.h for the layout of ranks. */
#include "parallel/plan.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "util/error.h"
#include "util/file.h"

#define MAX_SIZE (1 << 20)

void q3_plan_init(q3_plan *p) { memset(p, 0, sizeof *p); }

const char *q3_ep_comm_name(q3_ep_comm c) {
    return c == Q3_EP_COMM_ALLGATHER ? "allgather" : c == Q3_EP_COMM_ALLTOALL ? "alltoall" : "auto";
}
const char *q3_comm_quant_name(q3_comm_quant q) { return q == Q3_COMM_QUANT_MXFP8 ? "mxfp8" : "none"; }

static const char *const group_names[Q3_GROUP_N] = {"attn_tp", "moe_ep", "moe_tp", "lmhead"};
const char *q3_group_kind_name(q3_group_kind kind) {
    return (unsigned)kind < Q3_GROUP_N ? group_names[kind] : "?";
}

/* ------------------------------------------------------------ keys */

static const struct {
    const char *key, *flag;
    size_t off;   /* int field, or (size_t)-1 for the enum keys */
} keys[] = {
    {"attn_tp_size", "--attn-tp", offsetof(q3_plan, attn_tp_size)},
    {"moe_tp_size", "--moe-tp", offsetof(q3_plan, moe_tp_size)},
    {"moe_ep_size", "--moe-ep", offsetof(q3_plan, moe_ep_size)},
    {"lmhead_tp_size", "--lmhead-tp", offsetof(q3_plan, lmhead_tp_size)},
    {"moe_ep_comm", "--moe-ep-comm", (size_t)-1},
    {"comm_quant", "--comm-quant", (size_t)-1},
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))
#define KNOWN_KEYS "attn_tp_size, moe_tp_size, moe_ep_size, lmhead_tp_size, moe_ep_comm, comm_quant"

static int find_key(const char *key) {
    for (int k = 0; k < N_KEYS; k++)
        if (!strcmp(keys[k].key, key)) return k;
    return -1;
}

int q3_plan_set(q3_plan *p, const char *key, const char *value, const char *where) {
    int k = find_key(key);
    if (k < 0) return q3_err("%s: unknown key 'parallel_config.%s' (known: %s)", where, key, KNOWN_KEYS);
    if (keys[k].off != (size_t)-1) {
        char *end;
        errno = 0;
        long v = strtol(value, &end, 10);
        if (errno || end == value || *end || v < 1 || v > MAX_SIZE)
            return q3_err("%s: parallel_config.%s: expected a positive integer, got '%s'", where, key, value);
        *(int *)((char *)p + keys[k].off) = (int)v;
        return 0;
    }
    if (!strcmp(key, "moe_ep_comm")) {
        if (!strcmp(value, "auto")) p->moe_ep_comm = Q3_EP_COMM_AUTO;
        else if (!strcmp(value, "allgather")) p->moe_ep_comm = Q3_EP_COMM_ALLGATHER;
        else if (!strcmp(value, "alltoall")) p->moe_ep_comm = Q3_EP_COMM_ALLTOALL;
        else return q3_err("%s: parallel_config.moe_ep_comm: expected auto, allgather or alltoall, got '%s'", where, value);
        return 0;
    }
    if (!strcmp(value, "none")) p->comm_quant = Q3_COMM_QUANT_NONE;
    else if (!strcmp(value, "mxfp8")) p->comm_quant = Q3_COMM_QUANT_MXFP8;
    else return q3_err("%s: parallel_config.comm_quant: expected none or mxfp8, got '%s'", where, value);
    return 0;
}

int q3_plan_parse_arg(q3_plan *p, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    for (int k = 0; k < N_KEYS; k++) {
        if (strcmp(a, keys[k].flag)) continue;
        if (*i + 1 >= argc) return q3_err("option %s needs a value", a);
        const char *v = argv[++*i];
        return q3_plan_set(p, keys[k].key, v, a) ? -1 : 1;
    }
    return 0;
}

void q3_plan_flags_help(FILE *f) {
    fprintf(f, "  --attn-tp N            attention tensor-parallel size (default: all ranks)\n"
               "  --moe-ep N             expert-parallel size (default: ranks / --moe-tp, else all)\n"
               "  --moe-tp N             expert tensor-parallel size (default: ranks / --moe-ep)\n"
               "  --lmhead-tp N          lm_head vocab-parallel size (default: all ranks)\n"
               "  --moe-ep-comm X        auto (default), allgather or alltoall\n"
               "  --comm-quant X         none (default) or mxfp8\n"
               "                         (each overrides the same key of --config FILE)\n");
}

/* ------------------------------------------------------------ YAML */

typedef struct {
    yaml_parser_t parser;
    yaml_event_t ev;
    int have;
    const char *path;
} yreader;

static int line_of(const yreader *r) { return (int)r->ev.start_mark.line + 1; }

static int ynext(yreader *r) {
    if (r->have) yaml_event_delete(&r->ev);
    r->have = 0;
    if (!yaml_parser_parse(&r->parser, &r->ev)) {
        const yaml_parser_t *y = &r->parser;
        return q3_err("%s:%d:%d: YAML syntax error: %s%s%s", r->path, (int)y->problem_mark.line + 1,
                      (int)y->problem_mark.column + 1, y->problem ? y->problem : "unknown problem",
                      y->context ? " " : "", y->context ? y->context : "");
    }
    r->have = 1;
    return 0;
}

static const char *scalar(const yreader *r) { return (const char *)r->ev.data.scalar.value; }
static int is_plain(const yreader *r) { return r->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE; }

static const char *event_what(const yreader *r) {
    switch (r->ev.type) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_ALIAS_EVENT: return "an alias";
    case YAML_SCALAR_EVENT: return "a scalar";
    default: return "something else";
    }
}

static int load_parallel_config(q3_plan *p, yreader *r) {
    unsigned seen = 0;
    for (;;) {
        if (ynext(r)) return -1;
        if (r->ev.type == YAML_MAPPING_END_EVENT) return 0;
        if (r->ev.type != YAML_SCALAR_EVENT)
            return q3_err("%s:%d: parallel_config: keys must be plain names, got %s", r->path, line_of(r), event_what(r));
        char key[64];
        snprintf(key, sizeof key, "%s", scalar(r));
        int line = line_of(r), k = find_key(key);
        if (k < 0)
            return q3_err("%s:%d: unknown key 'parallel_config.%s' (known: %s)", r->path, line, key, KNOWN_KEYS);
        if (seen & (1u << k)) return q3_err("%s:%d: parallel_config.%s is given twice", r->path, line, key);
        seen |= 1u << k;
        if (ynext(r)) return -1;
        line = line_of(r);
        if (r->ev.type != YAML_SCALAR_EVENT)
            return q3_err("%s:%d: parallel_config.%s: expected a %s, got %s", r->path, line, key,
                          keys[k].off != (size_t)-1 ? "positive integer" : "name", event_what(r));
        if (keys[k].off != (size_t)-1 && !is_plain(r))
            return q3_err("%s:%d: parallel_config.%s: expected a positive integer, got the quoted string '%s'",
                          r->path, line, key, scalar(r));
        char where[1100];
        snprintf(where, sizeof where, "%s:%d", r->path, line);
        if (q3_plan_set(p, key, scalar(r), where)) return -1;
    }
}

static int load_top(q3_plan *p, yreader *r) {
    if (ynext(r)) return -1;   /* stream start */
    if (ynext(r)) return -1;
    if (r->ev.type == YAML_STREAM_END_EVENT) return q3_err("%s: empty plan file (expected model_path / parallel_config)", r->path);
    if (ynext(r)) return -1;   /* after document start */
    if (r->ev.type != YAML_MAPPING_START_EVENT)
        return q3_err("%s:%d: expected a mapping with the keys model_path and parallel_config at the top level, got %s",
                      r->path, line_of(r), event_what(r));
    unsigned seen = 0;
    for (;;) {
        if (ynext(r)) return -1;
        if (r->ev.type == YAML_MAPPING_END_EVENT) break;
        if (r->ev.type != YAML_SCALAR_EVENT)
            return q3_err("%s:%d: keys must be plain names, got %s", r->path, line_of(r), event_what(r));
        int line = line_of(r);
        unsigned bit;
        if (!strcmp(scalar(r), "model_path")) bit = 1;
        else if (!strcmp(scalar(r), "parallel_config")) bit = 2;
        else return q3_err("%s:%d: unknown key '%s' (known: model_path, parallel_config)", r->path, line, scalar(r));
        if (seen & bit) return q3_err("%s:%d: %s is given twice", r->path, line, scalar(r));
        seen |= bit;
        if (ynext(r)) return -1;
        line = line_of(r);
        if (bit == 1) {
            if (r->ev.type != YAML_SCALAR_EVENT || !*scalar(r))
                return q3_err("%s:%d: model_path: expected a path, got %s", r->path, line,
                              r->ev.type == YAML_SCALAR_EVENT ? "nothing" : event_what(r));
            if (strlen(scalar(r)) >= sizeof p->model_path)
                return q3_err("%s:%d: model_path: longer than %zu characters", r->path, line, sizeof p->model_path - 1);
            strcpy(p->model_path, scalar(r));
        } else {
            if (r->ev.type != YAML_MAPPING_START_EVENT)
                return q3_err("%s:%d: parallel_config: expected a mapping of keys (%s), got %s", r->path, line,
                              KNOWN_KEYS, event_what(r));
            if (load_parallel_config(p, r)) return -1;
        }
    }
    if (ynext(r)) return -1;   /* document end */
    if (ynext(r)) return -1;
    if (r->ev.type != YAML_STREAM_END_EVENT)
        return q3_err("%s:%d: more than one YAML document", r->path, line_of(r));
    return 0;
}

int q3_plan_load_yaml(q3_plan *p, const char *path) {
    if (q3_is_dir(path)) return q3_err("%s: is a directory, not a YAML file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return q3_err("%s: cannot open: %s", path, strerror(errno));
    yreader r = {.path = path};
    if (!yaml_parser_initialize(&r.parser)) {
        fclose(f);
        return q3_err("%s: cannot initialise the YAML parser", path);
    }
    yaml_parser_set_input_file(&r.parser, f);
    q3_plan tmp = *p;   /* only a fully read file changes the plan */
    int rc = load_top(&tmp, &r);
    if (r.have) yaml_event_delete(&r.ev);
    yaml_parser_delete(&r.parser);
    fclose(f);
    if (rc == 0) *p = tmp;
    return rc;
}

/* ------------------------------------------------------------ validate */

int q3_plan_validate(q3_plan *p, int W, const q3_config *c, int mx_weights) {
    p->validated = 0;
    if (W < 1 || W > MAX_SIZE) return q3_err("world size %d is out of range [1, %d]", W, MAX_SIZE);
    if (c->num_layers < 1 || c->num_layers > Q3_MAX_LAYERS || c->hidden_size < 1 || c->num_heads < 1 ||
        c->num_kv_heads < 1 || c->head_dim < 1 || c->vocab_size < 1 || c->num_heads % c->num_kv_heads ||
        (c->is_moe && c->num_experts > 0 &&
         (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts || c->moe_intermediate_size < 1)))
        return q3_err("parallel plan: the model config is incomplete or inconsistent (layers %d, hidden %d, heads %d/%d, "
                      "vocab %d)", c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->vocab_size);
    p->world_size = W;
    p->mx_weights = mx_weights;
    p->is_moe = c->is_moe && c->num_experts > 0;
    p->has_dense = 0;
    for (int l = 0; l < c->num_layers && l < Q3_MAX_LAYERS; l++) p->has_dense |= !(p->is_moe && c->layer_is_sparse[l]);
    p->hidden = c->hidden_size;
    p->num_layers = c->num_layers;
    p->num_heads = c->num_heads;
    p->num_kv_heads = c->num_kv_heads;
    p->head_dim = c->head_dim;
    p->num_experts = p->is_moe ? c->num_experts : 0;
    p->top_k = p->is_moe ? c->num_experts_per_tok : 0;
    p->moe_intermediate = p->is_moe ? c->moe_intermediate_size : 0;
    p->intermediate = c->intermediate_size;
    p->vocab = c->vocab_size;

    int A = p->attn_tp_size ? p->attn_tp_size : W;
    int L = p->lmhead_tp_size ? p->lmhead_tp_size : W;
    int Q = p->num_heads, K = p->num_kv_heads;
    if (W % A)
        return q3_err("attn_tp_size = %d: the world size %d is not a multiple of it (rule: world_size %% attn_tp_size == 0)", A, W);
    if (Q % A)
        return q3_err("attn_tp_size = %d: num_attention_heads = %d is not a multiple of it "
                      "(rule: num_attention_heads %% attn_tp_size == 0)", A, Q);
    if (K % A && A % K)
        return q3_err("attn_tp_size = %d: num_key_value_heads = %d must be a multiple or a divisor of it "
                      "(rule: num_key_value_heads %% attn_tp_size == 0 or attn_tp_size %% num_key_value_heads == 0)", A, K);
    if (mx_weights && ((long)(Q / A) * p->head_dim) % 32)
        return q3_err("attn_tp_size = %d: with MX weights each rank's o_proj input slice (%d heads x head_dim %d) "
                      "must be a multiple of 32 (rule: (num_attention_heads / attn_tp_size * head_dim) %% 32 == 0)",
                      A, Q / A, p->head_dim);
    if (p->has_dense) {
        if (p->intermediate % A)
            return q3_err("attn_tp_size = %d: the dense MLP's intermediate_size = %d is not a multiple of it "
                          "(rule: intermediate_size %% attn_tp_size == 0; dense layers split over the attn_tp group)",
                          A, p->intermediate);
        if (mx_weights && (p->intermediate / A) % 32)
            return q3_err("attn_tp_size = %d: with MX weights intermediate_size / attn_tp_size = %d must be a multiple of 32 "
                          "(rule: (intermediate_size / attn_tp_size) %% 32 == 0)", A, p->intermediate / A);
    }

    int E = p->moe_ep_size, T = p->moe_tp_size;
    if (p->is_moe) {
        if (!E && !T) E = W, T = 1;
        else if (E && !T) {
            if (W % E)
                return q3_err("moe_ep_size = %d: the world size %d is not a multiple of it (rule: world_size %% moe_ep_size == 0)", E, W);
            T = W / E;
        } else if (T && !E) {
            if (W % T)
                return q3_err("moe_tp_size = %d: the world size %d is not a multiple of it "
                              "(rule: moe_tp_size * moe_ep_size == world_size)", T, W);
            E = W / T;
        }
        if (W % E)
            return q3_err("moe_ep_size = %d: the world size %d is not a multiple of it (rule: world_size %% moe_ep_size == 0)", E, W);
        if ((long)T * E != W)
            return q3_err("moe_tp_size = %d, moe_ep_size = %d: their product %ld is not the world size %d "
                          "(rule: moe_tp_size * moe_ep_size == world_size)", T, E, (long)T * E, W);
        if (p->num_experts % E)
            return q3_err("moe_ep_size = %d: num_experts = %d is not a multiple of it (rule: num_experts %% moe_ep_size == 0)",
                          E, p->num_experts);
        if (p->moe_intermediate % T)
            return q3_err("moe_tp_size = %d: moe_intermediate_size = %d is not a multiple of it "
                          "(rule: moe_intermediate_size %% moe_tp_size == 0)", T, p->moe_intermediate);
        if (mx_weights && (p->moe_intermediate / T) % 32)
            return q3_err("moe_tp_size = %d: with MX weights moe_intermediate_size / moe_tp_size = %d must be a multiple of 32 "
                          "(rule: (moe_intermediate_size / moe_tp_size) %% 32 == 0)", T, p->moe_intermediate / T);
    } else {
        E = T = 1;   /* dense model: no MoE layers, the keys do not apply */
    }
    if (W % L)
        return q3_err("lmhead_tp_size = %d: the world size %d is not a multiple of it (rule: world_size %% lmhead_tp_size == 0)", L, W);
    if (p->vocab % L)
        return q3_err("lmhead_tp_size = %d: vocab_size = %d is not a multiple of it, so the vocab slices "
                      "(gathered in equal blocks) would differ (rule: vocab_size %% lmhead_tp_size == 0)", L, p->vocab);
    if (p->comm_quant == Q3_COMM_QUANT_MXFP8 && p->hidden % 32)
        return q3_err("comm_quant = mxfp8: hidden_size = %d is not a multiple of the MX block size 32 "
                      "(rule: hidden_size %% 32 == 0)", p->hidden);

    p->attn_tp_size = A;
    p->moe_ep_size = E;
    p->moe_tp_size = T;
    p->lmhead_tp_size = L;

    /* EP communication. Per MoE layer with B*S tokens sharded over the EP
     * group, AllGather moves (B*S, H) elements twice (gather the tokens,
     * reduce-scatter the outputs), AlltoAll (B*S*top_k/ep, H) twice
     * (dispatch each token's top_k rows to their experts' ranks, combine). */
    if (!p->is_moe || E == 1) {
        p->ep_comm = Q3_EP_COMM_ALLGATHER;
        snprintf(p->ep_comm_reason, sizeof p->ep_comm_reason, "%s",
                 p->is_moe ? "moe_ep_size 1: no expert-parallel exchange" : "dense model: no MoE layers");
    } else if (p->moe_ep_comm != Q3_EP_COMM_AUTO) {
        p->ep_comm = p->moe_ep_comm;
        snprintf(p->ep_comm_reason, sizeof p->ep_comm_reason, "set by moe_ep_comm (auto would pick %s: top_k %d %s moe_ep_size %d)",
                 p->top_k >= E ? "allgather" : "alltoall", p->top_k, p->top_k > E ? ">" : p->top_k == E ? "==" : "<", E);
    } else if (p->top_k > E) {
        p->ep_comm = Q3_EP_COMM_ALLGATHER;
        snprintf(p->ep_comm_reason, sizeof p->ep_comm_reason,
                 "auto: top_k %d > moe_ep_size %d: AllGather moves (B*S, H)x2 elements per MoE layer, "
                 "AlltoAll (B*S*top_k/ep, H)x2 = %.3g times more", p->top_k, E, (double)p->top_k / E);
    } else if (p->top_k == E) {
        p->ep_comm = Q3_EP_COMM_ALLGATHER;
        snprintf(p->ep_comm_reason, sizeof p->ep_comm_reason,
                 "auto: top_k %d == moe_ep_size %d: equal volume (B*S, H)x2 either way; AllGather is not "
                 "skewed by routing imbalance", p->top_k, E);
    } else {
        p->ep_comm = Q3_EP_COMM_ALLTOALL;
        snprintf(p->ep_comm_reason, sizeof p->ep_comm_reason,
                 "auto: top_k %d < moe_ep_size %d: AlltoAll moves (B*S*top_k/ep, H)x2 elements per MoE layer, "
                 "%.3g of AllGather's (B*S, H)x2", p->top_k, E, (double)p->top_k / E);
    }

    p->sp_note[0] = 0;
    if (A == 1) p->sp_prefill = 0;
    else if (!p->is_moe || A == E) p->sp_prefill = 1;
    else {
        p->sp_prefill = 0;
        snprintf(p->sp_note, sizeof p->sp_note,
                 "note: no sequence-parallel prefill: it needs attn_tp_size == moe_ep_size (here %d and %d); "
                 "prefill keeps the prompt replicated and allreduces after attention and MoE", A, E);
    }
    /* auto's pick of AlltoAll assumes tokens sharded over the EP group (SP
     * prefill); with the prompt replicated on every rank the allreduce
     * scheme moves less, so there AlltoAll runs only when asked for by name. */
    if (p->ep_comm == Q3_EP_COMM_ALLTOALL && p->moe_ep_comm == Q3_EP_COMM_AUTO && !p->sp_prefill) {
        char why[sizeof p->ep_comm_reason];
        snprintf(why, sizeof why, "%s", p->ep_comm_reason);
        p->ep_comm = Q3_EP_COMM_ALLGATHER;
        snprintf(p->ep_comm_reason, sizeof p->ep_comm_reason,
                 "replicated tokens (no sequence-parallel prefill): AlltoAll only when set by name; %.150s", why);
    }
    /* SP prefill sends each rank's attention output (its heads' columns) as
     * MXFP8 blocks of 32 along the row. */
    if (p->sp_prefill && p->comm_quant == Q3_COMM_QUANT_MXFP8 && ((long)(Q / A) * p->head_dim) % 32)
        return q3_err("comm_quant = mxfp8: with sequence-parallel prefill each rank's attention output slice "
                      "(%d heads x head_dim %d) must be a multiple of the MX block size 32 "
                      "(rule: (num_attention_heads / attn_tp_size * head_dim) %% 32 == 0)", Q / A, p->head_dim);
    p->validated = 1;
    return 0;
}

/* ------------------------------------------------------------ assignment */

static int range_lo(int i, int n, int parts) { return (int)((long)i * n / parts); }

void q3_plan_rank(const q3_plan *p, int r, q3_rank_assign *a) {
    int A = p->attn_tp_size, E = p->moe_ep_size, T = p->moe_tp_size, L = p->lmhead_tp_size;
    int Q = p->num_heads, K = p->num_kv_heads;
    memset(a, 0, sizeof *a);
    a->rank = r;
    a->attn_group = r / A;
    a->attn_rank = r % A;
    a->q_lo = range_lo(a->attn_rank, Q, A);
    a->q_hi = range_lo(a->attn_rank + 1, Q, A);
    if (A <= K) {
        a->kv_lo = range_lo(a->attn_rank, K, A);
        a->kv_hi = range_lo(a->attn_rank + 1, K, A);
        a->kv_replicas = 1;
    } else {
        a->kv_lo = a->q_lo / (Q / K);
        a->kv_hi = a->kv_lo + 1;
        a->kv_replicas = A / K;
    }
    if (p->has_dense) {
        a->dense_lo = range_lo(a->attn_rank, p->intermediate, A);
        a->dense_hi = range_lo(a->attn_rank + 1, p->intermediate, A);
    }
    a->ep_group = r / E;
    a->ep_rank = r % E;
    a->tp_group = r % E;
    a->tp_rank = r / E;
    if (p->is_moe) {
        a->expert_lo = range_lo(a->ep_rank, p->num_experts, E);
        a->expert_hi = range_lo(a->ep_rank + 1, p->num_experts, E);
        a->inter_lo = range_lo(a->tp_rank, p->moe_intermediate, T);
        a->inter_hi = range_lo(a->tp_rank + 1, p->moe_intermediate, T);
    }
    a->lmhead_group = r / L;
    a->lmhead_rank = r % L;
    a->vocab_lo = range_lo(a->lmhead_rank, p->vocab, L);
    a->vocab_hi = range_lo(a->lmhead_rank + 1, p->vocab, L);
}

void q3_plan_group_color(const q3_plan *p, q3_group_kind kind, int r, int *color, int *key) {
    int A = p->attn_tp_size, E = p->moe_ep_size, L = p->lmhead_tp_size;
    switch (kind) {
    case Q3_GROUP_ATTN_TP: *color = r / A; *key = r % A; break;
    case Q3_GROUP_MOE_EP: *color = r / E; *key = r % E; break;
    case Q3_GROUP_MOE_TP: *color = r % E; *key = r / E; break;
    default: *color = r / L; *key = r % L; break;
    }
}

int q3_plan_make_groups(const q3_plan *p, q3_plan_groups *g) {
    memset(g, 0, sizeof *g);
    if (!p->validated) return q3_err("parallel plan: not validated");
    q3_group *w = q3_comm_world();
    if (!w) return q3_err("parallel plan: the comm layer is not initialised");
    if (q3_group_size(w) != p->world_size)
        return q3_err("parallel plan: made for %d ranks, but the job has %d", p->world_size, q3_group_size(w));
    g->world = w;
    q3_group **slot[Q3_GROUP_N] = {&g->attn_tp, &g->moe_ep, &g->moe_tp, &g->lmhead};
    int r = q3_group_rank(w);
    for (int k = 0; k < Q3_GROUP_N; k++) {
        int color, key;
        q3_plan_group_color(p, (q3_group_kind)k, r, &color, &key);
        *slot[k] = q3_group_split(w, color, key, group_names[k]);
    }
    return 0;
}

void q3_plan_free_groups(q3_plan_groups *g) {
    q3_group_free(g->attn_tp);
    q3_group_free(g->moe_ep);
    q3_group_free(g->moe_tp);
    q3_group_free(g->lmhead);
    memset(g, 0, sizeof *g);
}

/* ------------------------------------------------------------ print */

static void print_groups(FILE *f, const q3_plan *p, q3_group_kind kind, int size) {
    int W = p->world_size, ngroups = W / size;
    fprintf(f, "    %-8s %d group%s of %d:", group_names[kind], ngroups, ngroups == 1 ? "" : "s", size);
    const int max_groups = 16, max_members = 16;
    for (int gi = 0; gi < ngroups && gi < max_groups; gi++) {
        fputs(" {", f);
        int n = 0;
        for (int r = 0; r < W; r++) {
            int color, key;
            q3_plan_group_color(p, kind, r, &color, &key);
            if (color != gi) continue;
            if (n < max_members) fprintf(f, "%s%d", n ? "," : "", r);
            else if (n == max_members) fputs(",...", f);
            n++;
        }
        fputc('}', f);
    }
    if (ngroups > max_groups) fprintf(f, " ... (%d more)", ngroups - max_groups);
    fputc('\n', f);
}

void q3_plan_print(FILE *f, const q3_plan *p) {
    if (!p->validated) {
        fprintf(f, "parallel plan: (not validated)\n");
        return;
    }
    int W = p->world_size, A = p->attn_tp_size, E = p->moe_ep_size, T = p->moe_tp_size, L = p->lmhead_tp_size;
    fprintf(f, "parallel plan: %d rank%s\n", W, W == 1 ? "" : "s");
    if (p->model_path[0]) fprintf(f, "  model_path       %s\n", p->model_path);
    fprintf(f, "  attn_tp_size     %-4d %d query heads per rank, ", A, p->num_heads / A);
    if (A <= p->num_kv_heads) fprintf(f, "%d KV head%s per rank\n", p->num_kv_heads / A, p->num_kv_heads / A == 1 ? "" : "s");
    else fprintf(f, "1 KV head per rank, each KV head replicated on %d ranks\n", A / p->num_kv_heads);
    if (p->is_moe) {
        fprintf(f, "  moe_ep_size      %-4d %d of %d experts per rank (top_k %d)\n", E, p->num_experts / E, p->num_experts, p->top_k);
        fprintf(f, "  moe_tp_size      %-4d %d of %d moe_intermediate columns per expert per rank\n", T,
                p->moe_intermediate / T, p->moe_intermediate);
    } else {
        fprintf(f, "  moe              dense model, no MoE layers\n");
    }
    if (p->has_dense)
        fprintf(f, "  dense MLP        %d of %d intermediate columns per rank (split over attn_tp)\n", p->intermediate / A,
                p->intermediate);
    fprintf(f, "  lmhead_tp_size   %-4d %d of %d vocab rows per rank\n", L, p->vocab / L, p->vocab);
    if (p->is_moe) fprintf(f, "  moe_ep_comm      %-9s (%s)\n", q3_ep_comm_name(p->ep_comm), p->ep_comm_reason);
    fprintf(f, "  comm_quant       %s", q3_comm_quant_name(p->comm_quant));
    if (p->comm_quant == Q3_COMM_QUANT_MXFP8)
        fprintf(f, " (%s)", (p->sp_prefill && A > 1) || (p->ep_comm == Q3_EP_COMM_ALLTOALL && E > 1)
                                ? "allgather/alltoall payloads of hidden states and attention outputs; "
                                  "allreduce, reduce_scatter and expert outputs stay fp32"
                                : "no effect here: this plan has no allgather/alltoall of activations");
    fputc('\n', f);
    fprintf(f, "  SP prefill       %s\n", !p->sp_prefill ? (A == 1 ? "no (attn_tp_size 1)" : "no")
                                       : p->is_moe ? "yes (attn_tp group == moe_ep group)"
                                                   : "yes (prompt rows sharded over attn_tp)");
    if (p->sp_note[0]) fprintf(f, "  %s\n", p->sp_note);
    fprintf(f, "  groups:\n");
    print_groups(f, p, Q3_GROUP_ATTN_TP, A);
    if (p->is_moe) {
        print_groups(f, p, Q3_GROUP_MOE_EP, E);
        print_groups(f, p, Q3_GROUP_MOE_TP, T);
    }
    print_groups(f, p, Q3_GROUP_LMHEAD, L);
    fprintf(f, "  %4s  %-9s %-10s %-14s %-12s %-14s %-16s\n", "rank", "attn g.r", "q heads", "kv heads",
            p->is_moe ? "experts" : "", p->is_moe ? "moe columns" : (p->has_dense ? "mlp columns" : ""), "vocab rows");
    for (int r = 0; r < W; r++) {
        q3_rank_assign a;
        q3_plan_rank(p, r, &a);
        char g[24], q[24], kv[32], ex[24], col[24], vo[32];
        snprintf(g, sizeof g, "%d.%d", a.attn_group, a.attn_rank);
        snprintf(q, sizeof q, "[%d,%d)", a.q_lo, a.q_hi);
        if (a.kv_replicas > 1) snprintf(kv, sizeof kv, "[%d,%d) x%d", a.kv_lo, a.kv_hi, a.kv_replicas);
        else snprintf(kv, sizeof kv, "[%d,%d)", a.kv_lo, a.kv_hi);
        ex[0] = col[0] = 0;
        if (p->is_moe) {
            snprintf(ex, sizeof ex, "[%d,%d)", a.expert_lo, a.expert_hi);
            snprintf(col, sizeof col, "[%d,%d)", a.inter_lo, a.inter_hi);
        } else if (p->has_dense) {
            snprintf(col, sizeof col, "[%d,%d)", a.dense_lo, a.dense_hi);
        }
        snprintf(vo, sizeof vo, "[%d,%d)", a.vocab_lo, a.vocab_hi);
        fprintf(f, "  %4d  %-9s %-10s %-14s %-12s %-14s %-16s\n", r, g, q, kv, ex, col, vo);
    }
}

void q3_plan_note_once(FILE *f, const q3_plan *p) {
    static int printed = 0;
    if (printed || !p->sp_note[0]) return;
    printed = 1;
    fprintf(f, "q3moe: %s\n", p->sp_note);
}
