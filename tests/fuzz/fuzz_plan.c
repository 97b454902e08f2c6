/* A parallel plan YAML file of any content: q3_plan_load_yaml must read
 * it or refuse it with a message naming the key or line; a plan it reads
 * is then validated against the micro model for 1-8 ranks. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "model/config.h"
#include "parallel/plan.h"

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"head_dim\": 32,"
    " \"hidden_size\": 64, \"intermediate_size\": 512, \"moe_intermediate_size\": 64, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 4, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 1,"
    " \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"vocab_size\": 64}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static q3_config c;
    static int have_config;
    if (!have_config) {
        if (q3_config_parse(&c, CONFIG, "config.json") != 0) abort();
        have_config = 1;
    }
    const char *path = fuzz_write("plan.yaml", data, n);
    int rc = 0;
    for (int world = 1; world <= 8 && rc == 0; world *= 2) {
        q3_plan p;
        q3_plan_init(&p);
        if ((rc = q3_plan_load_yaml(&p, path)) == 0) rc = q3_plan_validate(&p, world, &c, 0);
    }
    fuzz_done(rc);
    return 0;
}
