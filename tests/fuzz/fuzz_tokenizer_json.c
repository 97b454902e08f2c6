/* tokenizer.json of any content (a checkpoint's own file): q3_tok_load must
 * load it or refuse it with a message; a tokenizer it loads must encode a
 * few fixed texts (ASCII, other scripts, special tokens, invalid UTF-8)
 * into ids it can decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

static const char *const TEXTS[] = {
    "Hello, world! It's 2026.", "  spaces\tand\nnew lines\r\n", "Grüße, 世界, мир, 🙂",
    "<|im_start|>user\nHi<|im_end|>", "\xff\xfe not UTF-8",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fuzz_write("tokenizer.json", data, n);
    q3_tokenizer *t = q3_tok_load(path);
    if (t) {
        const int n_ids = q3_tok_n_ids(t);
        for (size_t i = 0; i < sizeof TEXTS / sizeof *TEXTS; i++) {
            int32_t *ids = NULL;
            size_t nid = 0;
            if (q3_tok_encode(t, TEXTS[i], strlen(TEXTS[i]), &ids, &nid) == 0) {
                for (size_t k = 0; k < nid; k++)
                    if (ids[k] < 0 || ids[k] >= n_ids || !q3_tok_token_bytes(t, ids[k], &(size_t){0})) abort();
                free(q3_tok_decode(t, ids, nid, NULL));
            }
            free(ids);
        }
        q3_tok_free(t);
    }
    fuzz_done(t ? 0 : -1);
    return 0;
}
