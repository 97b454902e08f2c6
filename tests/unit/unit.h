/* Tiny header-only unit-test harness.
 *
 * Usage, in tests/unit/test_NAME.c:
 *
 *     #include "unit.h"
 *     static void test_something(void) {
 *         CHECK(x != NULL);
 *         CHECK_EQ_INT(count, 3);
 *         CHECK_NEAR(mean, 0.5, 1e-6);
 *         CHECK_EQ_STR(name, "q_proj");
 *     }
 *     int main(void) {
 *         test_something();
 *         UNIT_MAIN_END();   // prints "N passed, N failed", returns 1 on failure
 *     }
 *
 * A failed check prints "file:line: ..." to stderr and the test carries on,
 * so one run reports every failure. The last line on stdout is always
 * "N passed, N failed": tools/run_tests.py parses it. Each check is one
 * count, so a loop of checks counts every iteration; use CHECK once on a
 * computed flag when that would swamp the totals. */
#ifndef Q3_UNIT_H
#define Q3_UNIT_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int unit_passed_, unit_failed_;

static inline int unit_check_(int ok, const char *file, int line, const char *expr) {
    if (ok) {
        unit_passed_++;
    } else {
        unit_failed_++;
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, expr);
    }
    return ok;
}

static inline int unit_check_int_(long long a, long long b, const char *file, int line, const char *ea,
                                  const char *eb) {
    if (a == b) {
        unit_passed_++;
        return 1;
    }
    unit_failed_++;
    fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s == %s (%lld != %lld)\n", file, line, ea, eb, a, b);
    return 0;
}

/* NaN on either side fails. */
static inline int unit_check_near_(double a, double b, double tol, const char *file, int line, const char *ea,
                                   const char *eb) {
    if (fabs(a - b) <= tol) {
        unit_passed_++;
        return 1;
    }
    unit_failed_++;
    fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s ~ %s (%.9g vs %.9g, |diff| %.3g > tol %.3g)\n", file, line, ea,
            eb, a, b, fabs(a - b), tol);
    return 0;
}

static inline int unit_check_str_(const char *a, const char *b, const char *file, int line, const char *ea,
                                  const char *eb) {
    if (a && b && strcmp(a, b) == 0) {
        unit_passed_++;
        return 1;
    }
    unit_failed_++;
    fprintf(stderr, "%s:%d: CHECK_EQ_STR failed: %s == %s (\"%s\" != \"%s\")\n", file, line, ea, eb,
            a ? a : "(null)", b ? b : "(null)");
    return 0;
}

/* Each macro evaluates its arguments once and yields 1 on pass, 0 on fail. */
#define CHECK(cond) unit_check_(!!(cond), __FILE__, __LINE__, #cond)
#define CHECK_EQ_INT(a, b) unit_check_int_((long long)(a), (long long)(b), __FILE__, __LINE__, #a, #b)
#define CHECK_NEAR(a, b, tol) unit_check_near_((double)(a), (double)(b), (double)(tol), __FILE__, __LINE__, #a, #b)
#define CHECK_EQ_STR(a, b) unit_check_str_((a), (b), __FILE__, __LINE__, #a, #b)

/* Print the summary line; returns the process exit code. */
static inline int unit_report(void) {
    fflush(stderr);
    printf("%d passed, %d failed\n", unit_passed_, unit_failed_);
    fflush(stdout);
    return unit_failed_ ? 1 : 0;
}

#define UNIT_MAIN_END() return unit_report()

#endif
