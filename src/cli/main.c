/* q3moe entry point: dispatches to the sub-commands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

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

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "q3moe: error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
