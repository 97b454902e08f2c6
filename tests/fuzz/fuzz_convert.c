/* `q3moe convert` of a checkpoint whose model.safetensors holds any bytes
 * (beside the micro model's config.json), to the scheme the input's first
 * byte picks: the converter must write a .q3m or refuse with a message
 * (NaN or Inf weights among the refusals), and a .q3m it writes must load
 * and run. */
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "model/model.h"
#include "quant/convert.h"
#include "util/error.h"

static const char *const SCHEMES[] = {"w4a8", "w8a8", "w4a8i", "w8a8i", "w4", "w8", "bf16", "bf16p"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static char ckpt[128], out[128];
    if (!ckpt[0]) {
        snprintf(ckpt, sizeof ckpt, "%s/ckpt", fuzz_dir());
        snprintf(out, sizeof out, "%s/out.q3m", fuzz_dir());
        if (mkdir(ckpt, 0700) != 0) abort();
        fuzz_write("ckpt/config.json", fuzz_micro_config, strlen(fuzz_micro_config));
    }
    if (n < 1) return 0;
    fuzz_write("ckpt/model.safetensors", data + 1, n - 1);
    q3_convert_opts o = {.src = ckpt, .dst = out, .force = 1, .quiet = 1};
    if (q3_scheme_from_name(SCHEMES[data[0] % (sizeof SCHEMES / sizeof *SCHEMES)], &o.scheme)) abort();
    q3_convert_stats st;
    const int rc = q3_convert(&o, &st);
    if (rc == 0) {
        q3_model m;
        if (q3_model_load(&m, out) != 0) {
            fprintf(stderr, "fuzz_convert: the converted file does not load: %s\n", q3_errmsg());
            abort();
        }
        fuzz_run_model(&m);
        q3_model_free(&m);
        remove(out);
    }
    fuzz_done(rc);
    return 0;
}
