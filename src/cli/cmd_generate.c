/* `q3moe generate`: stream a completion of a prompt (or one chat turn). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/chat_format.h"
#include "cli/commands.h"
#include "cli/common_opts.h"
#include "cli/par.h"
#include "cli/session.h"
#include "util/error.h"
#include "util/file.h"
#include "parallel/comm.h"

#define MAX_STOPS 16

static void usage(FILE *f) {
    fprintf(f, "usage: q3moe generate -m DIR (-p TEXT | -f FILE | --ids LIST) [options]\n\n"
               "Streams the continuation of a prompt to stdout, then prints timing to stderr.\n\n"
               "  -p TEXT              prompt text\n"
               "  -f FILE              read the prompt text from FILE\n"
               "  --ids LIST           prompt as comma-separated token ids (no tokenizer needed)\n"
               "  -n N                 tokens to generate at most (default 256)\n"
               "  --chat               wrap the prompt as one user turn in the Qwen3 chat format\n"
               "  --system S           system message (with --chat)\n"
               "  --no-think           with --chat: empty <think></think> block (no reasoning)\n"
               "  --stop STR           stop when STR is generated (repeatable, not printed)\n"
               "  --ignore-eos         keep going past end-of-turn tokens\n"
               "  --print-ids          print the generated ids as a JSON array instead of text\n"
               "  --comm-stats         print this rank's communication counters (rank 0, stderr) at the end\n");
    common_opts_help(f);
    fprintf(f, "\nUnder mpirun -np P the model is split over the P ranks as the plan says; rank 0 prints.\n"
               "Every rank samples the same token (same seed): with a vocab-split lm_head each rank\n"
               "sends only its candidates (its argmax when greedy, its top-k best with top-k on);\n"
               "with top-k off (--top-k 0) whole logits rows are gathered.\n");
    par_opts_help(f);
}

int cmd_generate(int argc, char **argv) {
    common_opts co;
    common_opts_init(&co);
    const char *prompt = NULL, *prompt_file = NULL, *ids_s = NULL, *system = NULL, *stops[MAX_STOPS];
    long n_new = 256;
    int chat = 0, no_think = 0, ignore_eos = 0, print_ids = 0, n_stops = 0, comm_stats = 0;
    par_opts po;
    par_opts_init(&po, argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = par_opts_parse(&po, "generate", &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        r = common_opts_parse(&co, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (po.rank == 0) usage(stdout);
            return 0;
        } else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--no-think")) no_think = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--print-ids")) print_ids = 1;
        else if (!strcmp(a, "--comm-stats")) comm_stats = 1;
        else if (!strcmp(a, "-p") || !strcmp(a, "-f") || !strcmp(a, "--ids") || !strcmp(a, "--system") ||
                 !strcmp(a, "--stop") || !strcmp(a, "-n")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "-p")) prompt = v;
            else if (!strcmp(a, "-f")) prompt_file = v;
            else if (!strcmp(a, "--ids")) ids_s = v;
            else if (!strcmp(a, "--system")) system = v;
            else if (!strcmp(a, "-n") && arg_int(a, v, 0, 1l << 24, &n_new)) return 2;
            else if (!strcmp(a, "--stop")) {
                if (!*v || n_stops == MAX_STOPS) {
                    if (po.rank == 0 && !*v) fprintf(stderr, "q3moe generate: error: --stop: the stop string is empty\n");
                    else if (po.rank == 0) fprintf(stderr, "q3moe generate: error: --stop: at most %d stop strings\n", MAX_STOPS);
                    return 2;
                }
                stops[n_stops++] = v;
            }
        } else return arg_unknown("generate", a);
    }
    if ((!co.model_dir && !po.config) || (!!prompt + !!prompt_file + !!ids_s) != 1) {
        if (po.rank == 0) {
            fprintf(stderr, "q3moe generate: error: need -m DIR and exactly one of -p TEXT, -f FILE, --ids LIST\n");
            usage(stderr);
        }
        return 2;
    }
    const char *misuse = ids_s && chat               ? "--chat needs a text prompt (-p or -f), not --ids"
                         : (system || no_think) && !chat ? "--system and --no-think apply only with --chat"
                         : n_stops && print_ids          ? "--stop matches generated text; it cannot be combined with --print-ids"
                                                         : NULL;
    if (misuse) {
        if (po.rank == 0) fprintf(stderr, "q3moe generate: error: %s\n", misuse);
        return 2;
    }
    int prc = par_setup(&po, "generate", &co.model_dir, &co.quant);
    if (prc) return prc;
    common_opts_finish(&co);
    /* Every rank samples the same token: they need the same seed. */
    if (po.world > 1) q3_comm_broadcast_bytes(q3_comm_world(), &co.sp.seed, sizeof co.sp.seed, 0);

    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *file_text = NULL, *text = NULL;
    size_t prompt_len = prompt ? strlen(prompt) : 0;
    if (ids_s && arg_id_list("--ids", ids_s, &ids, &n_ids)) return 2;
    if (prompt_file && !(prompt = file_text = q3_read_file(prompt_file, &prompt_len))) {
        q3_print_error();
        return 1;
    }
    /* A file's NUL bytes are text to the tokenizer, but the chat template is a C string. */
    const char *nul = chat && prompt_file ? memchr(prompt, 0, prompt_len) : NULL;
    if (nul) {
        if (po.rank == 0)
            fprintf(stderr, "q3moe generate: error: %s: byte %zu is NUL, which --chat cannot take\n", prompt_file,
                    (size_t)(nul - prompt));
        free(ids);
        free(file_text);
        return 1;
    }
    q3_session s;
    if (session_open_plan(&s, co.model_dir, (int)co.ctx, (int)co.threads, ids == NULL, par_plan(&po))) {
        par_fail(&po, "generate");
        free(ids);
        free(file_text);
        return 1;
    }
    int rc = 0;
    if (!ids) {
        if (chat) {
            text = chat_format_turn(system, prompt, chat_wants_think(prompt, !no_think));
            rc = session_encode(&s, text, &ids, &n_ids);
        } else rc = session_encode_n(&s, prompt, prompt_len, &ids, &n_ids);
        if (rc) q3_err_prefix("prompt");
    } else if (!s.tok && !print_ids) {
        /* Without a tokenizer there is no text to print: the ids are the output. */
        if (n_stops) rc = q3_err("--stop matches generated text, which needs a tokenizer: %s", s.tok_why);
        else if (po.rank == 0) fprintf(stderr, "[q3moe] %s: printing the generated ids\n", s.tok_why);
        print_ids = 1;
    }
    q3_sampler *smp = NULL;
    gen_stats st;
    if (rc == 0 && n_ids == 0) rc = q3_err("the prompt is empty");
    if (rc == 0) {
        smp = q3_sampler_new(&co.sp, s.model.cfg.vocab_size);
        if (!smp || session_sampling_setup(&s, &co.sp, 1)) rc = -1;
    }
    /* Only rank 0 writes stdout; the others stream into /dev/null. */
    FILE *sink = po.rank == 0 ? stdout : fopen("/dev/null", "w");
    if (rc == 0 && !sink) rc = q3_err("cannot open /dev/null");
    if (rc == 0) {
        gen_options o = {.max_new = (int)n_new, .ignore_eos = ignore_eos, .print_ids = print_ids, .stops = stops,
                         .n_stops = n_stops, .out = sink};
        rc = gen_run(&s, smp, ids, n_ids, &o, &st);
    }
    if (sink && sink != stdout) fclose(sink);
    if (rc) par_fail(&po, "generate");
    else if (po.rank == 0) gen_print_stats(&st);
    if (rc == 0 && comm_stats && po.rank == 0) q3_comm_stats_print(stderr);
    if (smp) q3_sampler_free(smp);
    free(ids);
    free(text);
    free(file_text);
    session_close(&s);
    return rc ? 1 : 0;
}
