/* A checkpoint folder whose model.safetensors holds any bytes, beside a
 * valid config.json (the micro model of tests/fuzz/seeds.sh):
 * q3_model_load must load it or refuse it with a message, and a model it
 * loads must run (fuzz_run_model). */
#include <stdint.h>

#include "fuzz_util.h"
#include "model/model.h"

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"head_dim\": 32,"
    " \"hidden_size\": 64, \"intermediate_size\": 512, \"max_position_embeddings\": 40960,"
    " \"mlp_only_layers\": [], \"moe_intermediate_size\": 64, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 2, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 1,"
    " \"num_key_value_heads\": 1, \"decoder_sparse_step\": 1, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 64}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static int have_config;
    if (!have_config) fuzz_write("config.json", CONFIG, sizeof CONFIG - 1), have_config = 1;
    fuzz_write("model.safetensors", data, n);
    q3_model m;
    const int rc = q3_model_load(&m, fuzz_dir());
    if (rc == 0) fuzz_run_model(&m), q3_model_free(&m);
    fuzz_done(rc);
    return 0;
}
