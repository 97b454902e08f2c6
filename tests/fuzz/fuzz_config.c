/* config.json text of any content: q3_config_parse must accept it or
 * refuse it with a message; an accepted config must also pass through the
 * parallel plan's checks for 1-4 ranks without crashing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "parallel/plan.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char *text = malloc(n + 1);
    if (!text) abort();
    memcpy(text, data, n);
    text[n] = 0;
    q3_config c;
    const int rc = q3_config_parse(&c, text, "config.json");
    if (rc == 0) {
        for (int world = 1; world <= 4; world++) {
            q3_plan p;
            q3_plan_init(&p);
            (void)q3_plan_validate(&p, world, &c, world & 1);
        }
    }
    free(text);
    fuzz_done(rc);
    return 0;
}
