/* Sub-commands of the q3moe binary. Each takes argv with argv[0] = the
 * command name, prints its own --help, and returns the process exit code. */
#ifndef Q3_COMMANDS_H
#define Q3_COMMANDS_H

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#endif
