/* The tokenizer's hash tables (src/tokenizer/tok_hash.c) from an initial
 * size of one entry, so that every insertion path, growth included, runs:
 * loading sizes them from the vocab and merge counts and never grows them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/tok_internal.h"
#include "unit.h"

enum { NSTR = 20000, NPAIR = 50000 };

static void test_str_map_grows(void) {
    char *arena = malloc((size_t)NSTR * 16);
    uint32_t off[NSTR], len[NSTR], at = 0;
    CHECK(arena != NULL);
    for (int i = 0; i < NSTR; i++) {
        /* short keys, some prefixes of others, one empty */
        len[i] = i == 0 ? 0 : (uint32_t)snprintf(arena + at, 16, "%x%s", i, i % 3 ? "" : "\xc4\xa0");
        off[i] = at;
        at += len[i];
    }
    tok_str_map m;
    tok_str_map_init(&m, 1);
    int fresh = 1, found = 1, dup = 1;
    for (int i = 0; i < NSTR; i++) fresh &= tok_str_map_put(&m, arena, off[i], len[i], i) == -1;
    CHECK(fresh);
    CHECK(m.cap >= (size_t)NSTR && m.n == (size_t)NSTR);
    for (int i = 0; i < NSTR; i++) found &= tok_str_map_get(&m, arena, arena + off[i], len[i]) == i;
    CHECK(found);
    /* a repeated key is not inserted again: put returns the id it has */
    for (int i = 0; i < NSTR; i += 97) dup &= tok_str_map_put(&m, arena, off[i], len[i], -5) == i;
    CHECK(dup);
    CHECK(m.n == (size_t)NSTR);
    CHECK_EQ_INT(tok_str_map_get(&m, arena, "zz", 2), -1);
    CHECK_EQ_INT(tok_str_map_get(&m, arena, "1\xc4", 2), -1); /* a prefix of a key */
    tok_str_map_free(&m);
    tok_str_map empty = {0};
    CHECK_EQ_INT(tok_str_map_get(&empty, arena, "1", 1), -1);
    free(arena);
}

static void test_pair_map_grows(void) {
    tok_pair_map m;
    tok_pair_map_init(&m, 1);
    /* pair i = (i * 7919 % 151936, i / 3): all distinct */
    for (int i = 0; i < NPAIR; i++) tok_pair_map_put(&m, i * 7919 % 151936, i / 3, (uint32_t)i, 151936 + i);
    /* a repeated merge keeps the later rank and result */
    for (int i = 0; i < NPAIR; i += 101) tok_pair_map_put(&m, i * 7919 % 151936, i / 3, (uint32_t)(NPAIR + i), -i);
    CHECK(m.n == (size_t)NPAIR);
    int ok = 1;
    for (int i = 0; i < NPAIR; i++) {
        uint32_t rank = 0;
        int32_t merged = 0;
        const int again = i % 101 == 0;
        ok &= tok_pair_map_get(&m, i * 7919 % 151936, i / 3, &rank, &merged) == 1;
        ok &= rank == (uint32_t)(again ? NPAIR + i : i) && merged == (again ? -i : 151936 + i);
    }
    CHECK(ok);
    uint32_t rank;
    int32_t merged;
    CHECK_EQ_INT(tok_pair_map_get(&m, 5, 151937, &rank, &merged), 0);
    CHECK_EQ_INT(tok_pair_map_get(&m, -1, -1, &rank, &merged), 0); /* the empty-slot pattern is no key */
    tok_pair_map_free(&m);
}

int main(void) {
    test_str_map_grows();
    test_pair_map_grows();
    UNIT_MAIN_END();
}
