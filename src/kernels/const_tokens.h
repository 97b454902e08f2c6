/* Token counts as compile-time constants: kernels written for a constant
 * count (accumulators in registers, loops unrolled) are called through
 * Q3_CONST_TOKENS, which runs CALL(n) with n = T, 1 <= T <= 8. */
#ifndef Q3_CONST_TOKENS_H
#define Q3_CONST_TOKENS_H

enum { Q3_CONST_TOKENS_MAX = 8 };

#define Q3_CONST_TOKENS(T, CALL) \
    do {                         \
        switch (T) {             \
        case 1: CALL(1); break;  \
        case 2: CALL(2); break;  \
        case 3: CALL(3); break;  \
        case 4: CALL(4); break;  \
        case 5: CALL(5); break;  \
        case 6: CALL(6); break;  \
        case 7: CALL(7); break;  \
        default: CALL(8); break; \
        }                        \
    } while (0)

#endif
