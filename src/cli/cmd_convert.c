/* `q3moe convert`: Hugging Face checkpoint directory -> packed .q3m file. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "quant/convert.h"
#include "util/error.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe convert -m DIR -o MODEL.q3m [--ffn mxfp4|mxfp8|bf16] [--attn mxfp8|mxfp4|bf16]\n"
            "                     [--act mxfp8|none] [--force] [-q]\n\n"
            "Packs a Hugging Face checkpoint into one .q3m file that every -m option accepts: config.json\n"
            "and the tokenizer files embedded, weights quantized to OCP MX formats (32-element blocks\n"
            "along the input dimension, one E8M0 scale each). Embeddings, norms, the router and lm_head\n"
            "are copied as stored. The default is W4A8.\n\n"
            "  -m DIR        checkpoint directory (config.json, *.safetensors, tokenizer.json)\n"
            "  -o FILE       the .q3m to write (refuses to overwrite an existing file unless --force)\n"
            "  --ffn T       expert and dense MLP gate/up/down_proj: mxfp4 (default), mxfp8, bf16 (as stored)\n"
            "  --attn T      attention q/k/v/o_proj: mxfp8 (default), mxfp4, bf16 (as stored)\n"
            "  --act A       inputs of the MX linears at run time: mxfp8 (default) or none (fp32)\n"
            "  --force       replace an existing FILE\n"
            "  -q            no progress or summary on stderr\n");
}

int cmd_convert(int argc, char **argv) {
    q3_convert_opts o = {.scheme = {Q3_MXFP4, Q3_MXFP8, 1}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--force")) o.force = 1;
        else if (!strcmp(a, "-q")) o.quiet = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "-o") || !strcmp(a, "--ffn") || !strcmp(a, "--attn") || !strcmp(a, "--act")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "-m")) o.src = v;
            else if (!strcmp(a, "-o")) o.dst = v;
            else if (!strcmp(a, "--act")) {
                if (!strcmp(v, "mxfp8")) o.scheme.act_mxfp8 = 1;
                else if (!strcmp(v, "none")) o.scheme.act_mxfp8 = 0;
                else {
                    fprintf(stderr, "q3moe: error: --act: '%s' is not one of mxfp8, none\n", v);
                    return 2;
                }
            } else if (q3_scheme_parse_dtype(v, !strcmp(a, "--ffn") ? &o.scheme.ffn : &o.scheme.attn)) {
                fprintf(stderr, "q3moe: error: %s: '%s' is not one of mxfp4, mxfp8, bf16\n", a, v);
                return 2;
            }
        } else return arg_unknown("convert", a);
    }
    if (!o.src || !o.dst) {
        fprintf(stderr, "q3moe convert: error: -m DIR and -o FILE are required\n");
        usage(stderr);
        return 2;
    }
    q3_convert_stats st;
    if (q3_convert(&o, &st)) {
        q3_print_error();
        return 1;
    }
    return 0;
}
