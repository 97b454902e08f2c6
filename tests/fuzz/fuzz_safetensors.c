/* A checkpoint folder whose model.safetensors holds any bytes, beside a
 * valid config.json (the micro model of tests/fuzz/seeds.sh):
 * q3_model_load must load it or refuse it with a message, and a model it
 * loads must run (fuzz_run_model). */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static int have_config;
    if (!have_config) fuzz_write("config.json", fuzz_micro_config, strlen(fuzz_micro_config)), have_config = 1;
    fuzz_write("model.safetensors", data, n);
    q3_model m;
    const int rc = q3_model_load(&m, fuzz_dir());
    if (rc == 0) fuzz_run_model(&m), q3_model_free(&m);
    fuzz_done(rc);
    return 0;
}
