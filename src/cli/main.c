/* q3moe entry point: dispatches to the sub-commands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "parallel/comm.h"
#include "util/error.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "stream a completion (or one chat turn) for a prompt"},
    {"chat", cmd_chat, "interactive multi-turn chat in the Qwen3 chat format"},
    {"tokenize", cmd_tokenize, "print the token ids of a text as a JSON array"},
    {"logits", cmd_logits, "write float32 logits for a list of token ids (testing hook)"},
    {"synth", cmd_synth, "write a random-weight Hugging Face checkpoint of a given geometry"},
    {"convert", cmd_convert, "pack a checkpoint into one MX-quantized .q3m file (W4A8 by default)"},
    {"perplexity", cmd_perplexity, "perplexity of a text, and divergence from a --base model"},
    {"bench", cmd_bench, "measure prefill/decode speed, memory traffic, TTFT and peak RSS"},
    {"plan", cmd_plan, "show how a model splits over N ranks; predict memory, communication, latency"},
};

static void usage(FILE *f) {
    fprintf(f, "q3moe: low-latency inference for Qwen3-MoE and Qwen3 models\n\n"
               "usage: q3moe COMMAND [options]   (q3moe COMMAND --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

/* Started by an MPI launcher (mpirun / mpiexec / srun with PMI)? A plain
 * run does not initialise MPI at all: a singleton MPI_Init costs ~0.5 s and
 * leaves allocations that LeakSanitizer reports. Q3MOE_MPI=1 forces it. */
static int launched_by_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"};
    const char *force = getenv("Q3MOE_MPI");
    if (force && *force) return atoi(force) != 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* Commands that run on several ranks (the others refuse a world > 1). */
static int multi_rank_command(const char *name) {
    return !strcmp(name, "logits") || !strcmp(name, "generate") || !strcmp(name, "bench");
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    const q3_group *w = q3_comm_world();
    const int world = w ? q3_group_size(w) : 1, rank = w ? q3_group_rank(w) : 0;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            if (world > 1 && !multi_rank_command(argv[1])) {
                if (rank == 0)
                    fprintf(stderr, "q3moe: error: '%s' runs on one rank; launched as %d ranks (only logits, generate "
                                    "and bench run on several)\n", argv[1], world);
                return 2;
            }
            return commands[i].fn(argc - 1, argv + 1);
        }
    if (rank == 0) {
        fprintf(stderr, "q3moe: error: unknown command '%s'\n\n", argv[1]);
        usage(stderr);
    }
    return 2;
}

int main(int argc, char **argv) {
    /* MPI (or the single-rank stand-in of a build without it) comes up before
     * any command runs and goes down after it returns. */
    int comm = !q3_comm_have_mpi() || launched_by_mpi();
    if (comm && q3_comm_init(&argc, &argv)) {
        fprintf(stderr, "q3moe: error: %s\n", q3_errmsg());
        return 1;
    }
    int rc = dispatch(argc, argv);
    /* Output that did not reach its destination (a full disk, a closed pipe) is a failure. */
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == 0) {
        fprintf(stderr, "q3moe: error: writing the output failed: %s\n", strerror(errno));
        rc = 1;
    }
    if (comm) q3_comm_finalize();
    return rc;
}
