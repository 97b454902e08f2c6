/* The parallel plan (src/parallel/plan.h): YAML and flag parsing, every
 * validation rule (each rejected with the key and rule named), the head /
 * KV head / expert / column / vocab assignment (KV replication when there
 * are more attention ranks than KV heads), the automatic EP communication
 * choice, the group colors, and the comm layer's byte formulas. No MPI
 * calls: nothing here initialises the comm layer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "parallel/plan.h"
#include "unit.h"
#include "util/error.h"

/* A MoE config: all layers sparse unless dense_layer >= 0. */
static q3_config moe_config(int heads, int kv, int experts, int top_k, int moe_inter, int vocab) {
    q3_config c;
    memset(&c, 0, sizeof c);
    c.is_moe = 1;
    c.vocab_size = vocab;
    c.hidden_size = 64;
    c.intermediate_size = 256;
    c.moe_intermediate_size = moe_inter;
    c.num_layers = 4;
    for (int l = 0; l < c.num_layers; l++) c.layer_is_sparse[l] = 1;
    c.num_heads = heads;
    c.num_kv_heads = kv;
    c.head_dim = 32;
    c.num_experts = experts;
    c.num_experts_per_tok = top_k;
    c.decoder_sparse_step = 1;
    return c;
}

static const char *tmp_yaml(const char *text) {
    static char path[64];
    strcpy(path, "/tmp/q3moe-test-plan-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n) n = 0;
    close(fd);
    return path;
}

/* Load text as a plan file; returns load_yaml's result. */
static int load(q3_plan *p, const char *text) {
    q3_plan_init(p);
    const char *path = tmp_yaml(text);
    if (!path) return 99;
    int rc = q3_plan_load_yaml(p, path);
    unlink(path);
    return rc;
}

static int msg_has(const char *a, const char *b) {
    const char *m = q3_errmsg();
    int ok = m && strstr(m, a) && (!b || strstr(m, b));
    if (!ok) fprintf(stderr, "  message was: %s\n", m ? m : "(null)");
    return ok;
}

static void test_yaml_ok(void) {
    q3_plan p;
    CHECK_EQ_INT(load(&p, "model_path: /models/Qwen3-30B-A3B\n"
                          "parallel_config:\n"
                          "  attn_tp_size: 4\n"
                          "  moe_tp_size: 1\n"
                          "  moe_ep_size: 4\n"
                          "  lmhead_tp_size: 4\n"
                          "  moe_ep_comm: auto   # auto | allgather | alltoall\n"
                          "  comm_quant: mxfp8   # none | mxfp8\n"),
                 0);
    CHECK_EQ_STR(p.model_path, "/models/Qwen3-30B-A3B");
    CHECK_EQ_INT(p.attn_tp_size, 4);
    CHECK_EQ_INT(p.moe_tp_size, 1);
    CHECK_EQ_INT(p.moe_ep_size, 4);
    CHECK_EQ_INT(p.lmhead_tp_size, 4);
    CHECK_EQ_INT(p.moe_ep_comm, Q3_EP_COMM_AUTO);
    CHECK_EQ_INT(p.comm_quant, Q3_COMM_QUANT_MXFP8);

    CHECK_EQ_INT(load(&p, "parallel_config: {moe_ep_comm: alltoall, attn_tp_size: 2}\n"), 0);
    CHECK_EQ_INT(p.moe_ep_comm, Q3_EP_COMM_ALLTOALL);
    CHECK_EQ_INT(p.attn_tp_size, 2);
    CHECK_EQ_INT(p.moe_ep_size, 0);   /* unset: resolved by validate */
}

static void test_yaml_errors(void) {
    q3_plan p;
    /* unknown keys name the key and the line */
    CHECK(load(&p, "parallel_config:\n  attn_tp_size: 2\n  moe_dp_size: 2\n") != 0 &&
          msg_has("moe_dp_size", ":3"));
    CHECK(load(&p, "model_path: /m\nbatch: 4\n") != 0 && msg_has("unknown key 'batch'", ":2"));
    /* wrong types name the key and the line */
    CHECK(load(&p, "parallel_config:\n  attn_tp_size: four\n") != 0 && msg_has("parallel_config.attn_tp_size", ":2"));
    CHECK(load(&p, "parallel_config:\n\n  moe_ep_size: \"4\"\n") != 0 && msg_has("parallel_config.moe_ep_size", ":3"));
    CHECK(load(&p, "parallel_config:\n  lmhead_tp_size: [1, 2]\n") != 0 && msg_has("parallel_config.lmhead_tp_size", ":2"));
    CHECK(load(&p, "parallel_config:\n  attn_tp_size: 0\n") != 0 && msg_has("attn_tp_size", "positive integer"));
    CHECK(load(&p, "parallel_config:\n  attn_tp_size: -2\n") != 0 && msg_has("attn_tp_size", ":2"));
    CHECK(load(&p, "parallel_config:\n  moe_ep_comm: ring\n") != 0 && msg_has("moe_ep_comm", "ring"));
    CHECK(load(&p, "parallel_config:\n  comm_quant: fp4\n") != 0 && msg_has("comm_quant", "fp4"));
    CHECK(load(&p, "parallel_config: 4\n") != 0 && msg_has("parallel_config", ":1"));
    CHECK(load(&p, "model_path:\n  a: b\n") != 0 && msg_has("model_path", ":2"));
    CHECK(load(&p, "parallel_config:\n  attn_tp_size: 2\n  attn_tp_size: 4\n") != 0 && msg_has("attn_tp_size", "twice"));
    CHECK(load(&p, "- 1\n- 2\n") != 0 && msg_has("top level", NULL));
    CHECK(load(&p, "") != 0 && msg_has("empty", NULL));
    CHECK(load(&p, "parallel_config:\n  attn_tp_size: 2\n bad: [\n") != 0 && msg_has("YAML syntax error", NULL));
    CHECK(load(&p, "a: 1\n---\nb: 2\n") != 0);
    /* a failed load leaves the plan untouched */
    q3_plan_init(&p);
    p.attn_tp_size = 7;
    const char *path = tmp_yaml("parallel_config:\n  attn_tp_size: 2\n  bogus: 1\n");
    CHECK(q3_plan_load_yaml(&p, path) != 0);
    unlink(path);
    CHECK_EQ_INT(p.attn_tp_size, 7);
    CHECK(q3_plan_load_yaml(&p, "/nonexistent/plan.yaml") != 0 && msg_has("/nonexistent/plan.yaml", NULL));
}

static void test_flags(void) {
    q3_plan p;
    q3_plan_init(&p);
    char *argv[] = {"x", "--attn-tp", "2", "--moe-ep", "4", "--moe-tp", "1", "--lmhead-tp", "8",
                    "--moe-ep-comm", "allgather", "--comm-quant", "mxfp8", "--other"};
    int argc = (int)(sizeof argv / sizeof argv[0]), consumed = 0;
    for (int i = 1; i < argc; i++) {
        int r = q3_plan_parse_arg(&p, argc, argv, &i);
        CHECK(r >= 0);
        consumed += r;
        if (r == 0) CHECK_EQ_STR(argv[i], "--other");
    }
    CHECK_EQ_INT(consumed, 6);
    CHECK_EQ_INT(p.attn_tp_size, 2);
    CHECK_EQ_INT(p.moe_ep_size, 4);
    CHECK_EQ_INT(p.moe_tp_size, 1);
    CHECK_EQ_INT(p.lmhead_tp_size, 8);
    CHECK_EQ_INT(p.moe_ep_comm, Q3_EP_COMM_ALLGATHER);
    CHECK_EQ_INT(p.comm_quant, Q3_COMM_QUANT_MXFP8);
    char *bad[] = {"x", "--attn-tp", "two"};
    int i = 1;
    CHECK(q3_plan_parse_arg(&p, 3, bad, &i) < 0 && msg_has("--attn-tp", "attn_tp_size"));
    char *missing[] = {"x", "--moe-ep"};
    i = 1;
    CHECK(q3_plan_parse_arg(&p, 2, missing, &i) < 0 && msg_has("--moe-ep", "value"));
}

/* validate with sizes (0 = default) and expect failure naming key and rule */
static int reject(int W, int A, int E, int T, int L, const q3_config *c, int mx, const char *key, const char *rule) {
    q3_plan p;
    q3_plan_init(&p);
    p.attn_tp_size = A;
    p.moe_ep_size = E;
    p.moe_tp_size = T;
    p.lmhead_tp_size = L;
    if (q3_plan_validate(&p, W, c, mx) == 0) {
        fprintf(stderr, "  accepted: W=%d A=%d E=%d T=%d L=%d (expected %s)\n", W, A, E, T, L, rule);
        return 0;
    }
    return msg_has(key, rule);
}

static int accept(q3_plan *p, int W, int A, int E, int T, int L, const q3_config *c, int mx) {
    q3_plan_init(p);
    p->attn_tp_size = A;
    p->moe_ep_size = E;
    p->moe_tp_size = T;
    p->lmhead_tp_size = L;
    int rc = q3_plan_validate(p, W, c, mx);
    if (rc) fprintf(stderr, "  rejected: %s\n", q3_errmsg());
    return rc == 0;
}

static void test_validation_rules(void) {
    q3_config c = moe_config(16, 4, 16, 4, 128, 64);
    q3_plan p;
    CHECK(reject(4, 3, 0, 0, 0, &c, 0, "attn_tp_size", "world_size % attn_tp_size == 0"));
    CHECK(reject(4, 0, 3, 0, 0, &c, 0, "moe_ep_size", "world_size % moe_ep_size == 0"));
    CHECK(reject(4, 0, 4, 2, 0, &c, 0, "moe_tp_size", "moe_tp_size * moe_ep_size == world_size"));
    CHECK(reject(8, 0, 2, 2, 0, &c, 0, "moe_ep_size", "moe_tp_size * moe_ep_size == world_size"));
    CHECK(reject(4, 0, 0, 3, 0, &c, 0, "moe_tp_size", "moe_tp_size * moe_ep_size == world_size"));
    CHECK(reject(4, 0, 0, 0, 3, &c, 0, "lmhead_tp_size", "world_size % lmhead_tp_size == 0"));
    q3_config c12 = moe_config(12, 4, 16, 4, 128, 64);
    CHECK(reject(8, 8, 0, 0, 0, &c12, 0, "attn_tp_size", "num_attention_heads % attn_tp_size == 0"));
    CHECK(reject(3, 3, 1, 3, 1, &c12, 0, "attn_tp_size", "num_key_value_heads"));
    q3_config c96 = moe_config(16, 4, 16, 4, 96, 64);
    CHECK(accept(&p, 2, 2, 1, 2, 2, &c96, 0));   /* 48 columns: fine without MX */
    CHECK(reject(2, 2, 1, 2, 2, &c96, 1, "moe_tp_size", "(moe_intermediate_size / moe_tp_size) % 32 == 0"));
    CHECK(reject(2, 2, 1, 3, 2, &c96, 0, "moe_tp_size", "moe_tp_size * moe_ep_size"));
    q3_config c12e = moe_config(16, 4, 12, 4, 128, 64);
    CHECK(reject(8, 8, 8, 1, 8, &c12e, 0, "moe_ep_size", "num_experts % moe_ep_size == 0"));
    q3_config c100 = moe_config(16, 4, 16, 4, 128, 100);
    CHECK(reject(8, 8, 8, 1, 8, &c100, 0, "lmhead_tp_size", "vocab_size % lmhead_tp_size == 0"));
    CHECK(accept(&p, 8, 8, 8, 1, 4, &c100, 0));
    q3_config c48 = c;
    c48.hidden_size = 48;
    q3_plan_init(&p);
    p.comm_quant = Q3_COMM_QUANT_MXFP8;
    CHECK(q3_plan_validate(&p, 2, &c48, 0) != 0 && msg_has("comm_quant", "hidden_size % 32 == 0"));
    /* SP prefill sends each rank's attention output (heads x head_dim) in MXFP8 blocks of 32 */
    q3_config c16 = c;
    c16.head_dim = 16;
    q3_plan_init(&p);
    p.comm_quant = Q3_COMM_QUANT_MXFP8;
    p.attn_tp_size = 16;   /* one head of 16 per rank */
    CHECK(q3_plan_validate(&p, 16, &c16, 0) != 0 &&
          msg_has("comm_quant", "(num_attention_heads / attn_tp_size * head_dim) % 32 == 0"));
    q3_plan_init(&p);
    p.comm_quant = Q3_COMM_QUANT_MXFP8;
    p.attn_tp_size = 8;    /* two heads of 16: 32 columns */
    CHECK(q3_plan_validate(&p, 8, &c16, 0) == 0 && p.sp_prefill);
    /* dense layers split over attn_tp */
    q3_config cd = c;
    cd.layer_is_sparse[1] = 0;
    cd.intermediate_size = 96;
    CHECK(accept(&p, 2, 2, 2, 1, 2, &cd, 0));
    CHECK(p.has_dense);
    CHECK(reject(2, 2, 2, 1, 2, &cd, 1, "attn_tp_size", "(intermediate_size / attn_tp_size) % 32 == 0"));
    CHECK(reject(4, 4, 4, 1, 4, &(q3_config){0}, 0, "model config", NULL));   /* degenerate config */
    CHECK(reject(0, 0, 0, 0, 0, &c, 0, "world size", NULL));
}

static void test_defaults(void) {
    q3_config c = moe_config(16, 4, 16, 4, 128, 64);
    q3_plan p;
    CHECK(accept(&p, 4, 0, 0, 0, 0, &c, 0));
    CHECK_EQ_INT(p.attn_tp_size, 4);
    CHECK_EQ_INT(p.moe_ep_size, 4);
    CHECK_EQ_INT(p.moe_tp_size, 1);
    CHECK_EQ_INT(p.lmhead_tp_size, 4);
    CHECK(accept(&p, 4, 0, 0, 2, 0, &c, 0));
    CHECK_EQ_INT(p.moe_ep_size, 2);
    CHECK(accept(&p, 4, 0, 2, 0, 0, &c, 0));
    CHECK_EQ_INT(p.moe_tp_size, 2);
    CHECK(accept(&p, 1, 0, 0, 0, 0, &c, 1));
    CHECK_EQ_INT(p.attn_tp_size, 1);
    CHECK_EQ_INT(p.sp_prefill, 0);
    /* dense model: MoE keys do not apply */
    q3_config d = c;
    d.is_moe = 0;
    d.num_experts = d.num_experts_per_tok = d.moe_intermediate_size = 0;
    CHECK(accept(&p, 4, 4, 0, 0, 0, &d, 0));
    CHECK_EQ_INT(p.moe_ep_size, 1);
    CHECK_EQ_INT(p.moe_tp_size, 1);
    CHECK(p.sp_prefill);
    q3_rank_assign a;
    q3_plan_rank(&p, 3, &a);
    CHECK_EQ_INT(a.dense_lo, 192);
    CHECK_EQ_INT(a.dense_hi, 256);
    CHECK_EQ_INT(a.expert_hi - a.expert_lo, 0);
}

/* Every (query head) is held by exactly one rank of each attn group, and
 * each rank's KV heads are exactly the ones its query heads read. */
static int check_attention(const q3_plan *p) {
    int Q = p->num_heads, K = p->num_kv_heads, G = Q / K, ok = 1;
    int *q_owner = calloc((size_t)Q, sizeof *q_owner);
    int *kv_holders = calloc((size_t)K, sizeof *kv_holders);
    for (int r = 0; r < p->attn_tp_size; r++) {   /* group 0 */
        q3_rank_assign a;
        q3_plan_rank(p, r, &a);
        ok &= a.attn_group == 0 && a.attn_rank == r;
        ok &= a.q_hi - a.q_lo == Q / p->attn_tp_size;
        for (int h = a.q_lo; h < a.q_hi; h++) q_owner[h]++;
        ok &= a.kv_lo == a.q_lo / G && a.kv_hi == (a.q_hi - 1) / G + 1;
        int want_kv = K / p->attn_tp_size > 1 ? K / p->attn_tp_size : 1;
        ok &= a.kv_hi - a.kv_lo == want_kv;
        for (int h = a.kv_lo; h < a.kv_hi; h++) kv_holders[h]++;
    }
    for (int h = 0; h < Q; h++) ok &= q_owner[h] == 1;
    int rep = p->attn_tp_size > K ? p->attn_tp_size / K : 1;
    for (int h = 0; h < K; h++) ok &= kv_holders[h] == rep;
    for (int r = 0; r < p->attn_tp_size; r++) {
        q3_rank_assign a;
        q3_plan_rank(p, r, &a);
        ok &= a.kv_replicas == rep;
    }
    free(q_owner);
    free(kv_holders);
    return ok;
}

static void test_assignment(void) {
    q3_config c = moe_config(16, 4, 16, 4, 128, 64);
    q3_plan p;
    /* 8 attention ranks, 4 KV heads: each KV head replicated on 2 ranks */
    CHECK(accept(&p, 8, 8, 4, 2, 8, &c, 0));
    CHECK(check_attention(&p));
    q3_rank_assign a;
    q3_plan_rank(&p, 5, &a);
    CHECK_EQ_INT(a.q_lo, 10);
    CHECK_EQ_INT(a.q_hi, 12);
    CHECK_EQ_INT(a.kv_lo, 2);
    CHECK_EQ_INT(a.kv_hi, 3);
    CHECK_EQ_INT(a.kv_replicas, 2);
    /* EP 4 x TP 2: rank 5 is EP rank 1 (experts 4..7), TP rank 1 (columns 64..127) */
    CHECK_EQ_INT(a.ep_rank, 1);
    CHECK_EQ_INT(a.ep_group, 1);
    CHECK_EQ_INT(a.expert_lo, 4);
    CHECK_EQ_INT(a.expert_hi, 8);
    CHECK_EQ_INT(a.tp_rank, 1);
    CHECK_EQ_INT(a.tp_group, 1);
    CHECK_EQ_INT(a.inter_lo, 64);
    CHECK_EQ_INT(a.inter_hi, 128);
    CHECK_EQ_INT(a.vocab_lo, 40);
    CHECK_EQ_INT(a.vocab_hi, 48);
    /* every (expert, column) held exactly once; vocab rows once per lmhead group */
    int owner[16][128] = {{0}}, vocab[64] = {0}, all_once = 1;
    for (int r = 0; r < 8; r++) {
        q3_plan_rank(&p, r, &a);
        all_once &= a.expert_hi - a.expert_lo == 4 && a.inter_hi - a.inter_lo == 64;
        for (int e = a.expert_lo; e < a.expert_hi; e++)
            for (int j = a.inter_lo; j < a.inter_hi; j++) owner[e][j]++;
        for (int v = a.vocab_lo; v < a.vocab_hi; v++) vocab[v]++;
    }
    for (int e = 0; e < 16; e++)
        for (int j = 0; j < 128; j++) all_once &= owner[e][j] == 1;
    for (int v = 0; v < 64; v++) all_once &= vocab[v] == 1;
    CHECK(all_once);

    /* 2 attention ranks over 4 KV heads: 2 KV heads each, no replication;
     * 4 attn groups of 2 (replicas); lm_head in 2 groups of 4 */
    q3_plan_init(&p);
    CHECK(q3_plan_validate(&p, 8, &(q3_config){0}, 0) != 0 && msg_has("model config", NULL));
    q3_config c2 = moe_config(16, 4, 16, 4, 128, 64);
    CHECK(accept(&p, 8, 2, 8, 1, 4, &c2, 0));
    CHECK(check_attention(&p));
    q3_plan_rank(&p, 7, &a);
    CHECK_EQ_INT(a.attn_group, 3);
    CHECK_EQ_INT(a.attn_rank, 1);
    CHECK_EQ_INT(a.q_lo, 8);
    CHECK_EQ_INT(a.kv_lo, 2);
    CHECK_EQ_INT(a.kv_hi, 4);
    CHECK_EQ_INT(a.kv_replicas, 1);
    CHECK_EQ_INT(a.lmhead_group, 1);
    CHECK_EQ_INT(a.lmhead_rank, 3);
    CHECK_EQ_INT(a.vocab_lo, 48);
    CHECK_EQ_INT(a.expert_lo, 14);

    /* 16 attention ranks, 4 KV heads (Qwen3-style 64/4 shape scaled down) */
    q3_config c3 = moe_config(64, 4, 16, 8, 128, 64);
    CHECK(accept(&p, 16, 16, 16, 1, 16, &c3, 0));
    CHECK(check_attention(&p));
    q3_plan_rank(&p, 15, &a);
    CHECK_EQ_INT(a.kv_lo, 3);
    CHECK_EQ_INT(a.kv_replicas, 4);
    /* MHA-like: K == Q */
    q3_config c4 = moe_config(8, 8, 16, 4, 128, 64);
    CHECK(accept(&p, 4, 4, 4, 1, 4, &c4, 0));
    CHECK(check_attention(&p));
}

static void test_groups(void) {
    q3_config c = moe_config(16, 4, 16, 4, 128, 64);
    q3_plan p;
    CHECK(accept(&p, 8, 2, 4, 2, 4, &c, 0));
    int ok = 1;
    for (int r = 0; r < 8; r++) {
        q3_rank_assign a;
        q3_plan_rank(&p, r, &a);
        int color, key;
        q3_plan_group_color(&p, Q3_GROUP_ATTN_TP, r, &color, &key);
        ok &= color == a.attn_group && key == a.attn_rank;
        q3_plan_group_color(&p, Q3_GROUP_MOE_EP, r, &color, &key);
        ok &= color == a.ep_group && key == a.ep_rank;
        q3_plan_group_color(&p, Q3_GROUP_MOE_TP, r, &color, &key);
        ok &= color == a.tp_group && key == a.tp_rank;
        q3_plan_group_color(&p, Q3_GROUP_LMHEAD, r, &color, &key);
        ok &= color == a.lmhead_group && key == a.lmhead_rank;
    }
    CHECK(ok);
    /* the moe_tp group of rank 1 is {1, 5}: same experts, other columns */
    int color, key, n = 0, members[8];
    q3_plan_group_color(&p, Q3_GROUP_MOE_TP, 1, &color, &key);
    for (int r = 0; r < 8; r++) {
        int c2, k2;
        q3_plan_group_color(&p, Q3_GROUP_MOE_TP, r, &c2, &k2);
        if (c2 == color) members[n++] = r;
    }
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(members[0], 1);
    CHECK_EQ_INT(members[1], 5);
    CHECK_EQ_STR(q3_group_kind_name(Q3_GROUP_MOE_EP), "moe_ep");
    /* make_groups refuses before the comm layer is up */
    q3_plan_groups g;
    CHECK(q3_plan_make_groups(&p, &g) != 0 && msg_has("comm", NULL));
}

static void test_auto_comm(void) {
    q3_plan p;
    q3_config c8 = moe_config(16, 4, 16, 8, 128, 64);   /* top_k 8 */
    CHECK(accept(&p, 4, 4, 4, 1, 4, &c8, 0));
    CHECK_EQ_INT(p.ep_comm, Q3_EP_COMM_ALLGATHER);        /* top_k 8 > ep 4 */
    CHECK(strstr(p.ep_comm_reason, "auto") && strstr(p.ep_comm_reason, "top_k 8 > moe_ep_size 4"));
    q3_config c2 = moe_config(16, 4, 16, 2, 128, 64);   /* top_k 2 */
    CHECK(accept(&p, 4, 4, 4, 1, 4, &c2, 0));
    CHECK_EQ_INT(p.ep_comm, Q3_EP_COMM_ALLTOALL);         /* top_k 2 < ep 4 */
    CHECK(strstr(p.ep_comm_reason, "top_k 2 < moe_ep_size 4") != NULL);
    q3_config c4 = moe_config(16, 4, 16, 4, 128, 64);
    CHECK(accept(&p, 4, 4, 4, 1, 4, &c4, 0));
    CHECK_EQ_INT(p.ep_comm, Q3_EP_COMM_ALLGATHER);        /* tie: equal volume */
    CHECK(strstr(p.ep_comm_reason, "==") != NULL);
    /* an explicit choice wins, and the reason says so */
    q3_plan_init(&p);
    p.moe_ep_comm = Q3_EP_COMM_ALLTOALL;
    CHECK(q3_plan_validate(&p, 4, &c8, 0) == 0);
    CHECK_EQ_INT(p.ep_comm, Q3_EP_COMM_ALLTOALL);
    CHECK(strstr(p.ep_comm_reason, "set by moe_ep_comm") && strstr(p.ep_comm_reason, "allgather"));
    /* no EP: nothing to choose */
    CHECK(accept(&p, 4, 4, 1, 4, 4, &c8, 0));
    CHECK(strstr(p.ep_comm_reason, "moe_ep_size 1") != NULL);
}

static void test_sp(void) {
    q3_config c = moe_config(16, 4, 16, 4, 128, 64);
    q3_plan p;
    CHECK(accept(&p, 4, 4, 4, 1, 4, &c, 0));
    CHECK_EQ_INT(p.sp_prefill, 1);
    CHECK_EQ_STR(p.sp_note, "");
    CHECK(accept(&p, 4, 4, 2, 2, 4, &c, 0));
    CHECK_EQ_INT(p.sp_prefill, 0);
    CHECK(strstr(p.sp_note, "attn_tp_size == moe_ep_size") != NULL);
    CHECK(strchr(p.sp_note, '\n') == NULL);   /* one line */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    q3_plan_note_once(f, &p);
    q3_plan_note_once(f, &p);
    q3_plan_print(f, &p);
    fclose(f);
    const char *first = strstr(buf, "attn_tp_size == moe_ep_size");
    CHECK(first != NULL);
    /* printed once by note_once, once more by the full print */
    CHECK(first && strstr(first + 1, "attn_tp_size == moe_ep_size") && !strstr(strstr(first + 1, "attn_tp_size == moe_ep_size") + 1, "attn_tp_size == moe_ep_size"));
    CHECK(strstr(buf, "moe_tp   2 groups of 2: {0,2} {1,3}") != NULL);
    free(buf);
}

static void test_print_replication(void) {
    q3_config c = moe_config(16, 4, 16, 4, 128, 64);
    q3_plan p;
    CHECK(accept(&p, 8, 8, 8, 1, 8, &c, 0));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    q3_plan_print(f, &p);
    fclose(f);
    CHECK(strstr(buf, "replicated on 2 ranks") != NULL);
    CHECK(strstr(buf, "[2,3) x2") != NULL);
    CHECK(strstr(buf, "attn_tp  1 group of 8: {0,1,2,3,4,5,6,7}") != NULL);
    free(buf);
}

static void test_payload_formulas(void) {
    uint64_t s, r;
    q3_comm_payload(Q3_COLL_ALLREDUCE, 4, 28, 0, &s, &r);
    CHECK_EQ_INT(s, 42);   /* floor(2 * 3 * 28 / 4) */
    CHECK_EQ_INT(r, 42);
    q3_comm_payload(Q3_COLL_ALLREDUCE, 3, 10, 0, &s, &r);
    CHECK_EQ_INT(s, 13);   /* floor(40 / 3) */
    q3_comm_payload(Q3_COLL_ALLGATHER, 4, 20, 0, &s, &r);
    CHECK_EQ_INT(s, 60);
    CHECK_EQ_INT(r, 60);
    q3_comm_payload(Q3_COLL_REDUCE_SCATTER, 2, 12, 0, &s, &r);
    CHECK_EQ_INT(s, 12);
    q3_comm_payload(Q3_COLL_ALLTOALL, 8, 5, 0, &s, &r);
    CHECK_EQ_INT(s, 35);
    q3_comm_payload(Q3_COLL_BROADCAST, 4, 24, 1, &s, &r);
    CHECK_EQ_INT(s, 24);
    CHECK_EQ_INT(r, 0);
    q3_comm_payload(Q3_COLL_BROADCAST, 4, 24, 0, &s, &r);
    CHECK_EQ_INT(s, 0);
    CHECK_EQ_INT(r, 24);
    q3_comm_payload(Q3_COLL_ALLGATHER, 1, 1000, 0, &s, &r);
    CHECK_EQ_INT(s + r, 0);   /* nothing leaves a single rank */
    q3_comm_payload(Q3_COLL_BARRIER, 4, 1000, 0, &s, &r);
    CHECK_EQ_INT(s + r, 0);
    CHECK_EQ_STR(q3_coll_name(Q3_COLL_REDUCE_SCATTER), "reduce_scatter_sum");
    /* phases and counters without init: a fresh table */
    CHECK_EQ_STR(q3_comm_phase(), "other");
    CHECK(q3_comm_set_phase("decode") == 0);
    CHECK_EQ_STR(q3_comm_phase(), "decode");
    CHECK(q3_comm_set_phase("a-phase-name-that-is-too-long") != 0 && msg_has("longer", NULL));
    q3_comm_stat st = q3_comm_stats_get(Q3_COLL_ALLREDUCE, "decode");
    CHECK_EQ_INT(st.calls, 0);
}

int main(void) {
    test_yaml_ok();
    test_yaml_errors();
    test_flags();
    test_validation_rules();
    test_defaults();
    test_assignment();
    test_groups();
    test_auto_comm();
    test_sp();
    test_print_replication();
    test_payload_formulas();
    UNIT_MAIN_END();
}
