/* `q3moe convert`: Hugging Face checkpoint directory -> packed .q3m file. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "quant/convert.h"
#include "util/error.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: q3moe convert -m DIR -o MODEL.q3m [--quant S | --ffn T --attn T --act A --head T] [--force] [-q]\n\n"
            "Packs a Hugging Face checkpoint into one .q3m file that every -m option accepts: config.json\n"
            "and the tokenizer files embedded, weights quantized to OCP MX formats (32-element blocks\n"
            "along the input dimension, one E8M0 scale each). Embeddings, norms, the router and lm_head\n"
            "are copied as stored (lm_head unless --head). The default is W4A8. (`q3moe synth -o FILE.q3m` writes the same file\n"
            "for a random-weight checkpoint without the directory in between.)\n\n"
            "  -m DIR        checkpoint directory (config.json, *.safetensors, tokenizer.json)\n"
            "  -o FILE       the .q3m to write (refuses to overwrite an existing file unless --force)\n"
            Q3_SCHEME_FLAGS_HELP
            "  --force       replace an existing FILE\n"
            "  -q            no progress or summary on stderr\n");
}

int cmd_convert(int argc, char **argv) {
    q3_convert_opts o = {.scheme = {Q3_MXFP4, Q3_MXFP8, Q3_MXFP8, Q3_BF16}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--force")) o.force = 1;
        else if (!strcmp(a, "-q")) o.quiet = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "-o")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            *(!strcmp(a, "-m") ? &o.src : &o.dst) = v;
        } else if (q3_is_scheme_flag(a)) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (q3_scheme_flag(a, v, &o.scheme)) {
                fprintf(stderr, "q3moe convert: error: %s\n", q3_errmsg());
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
