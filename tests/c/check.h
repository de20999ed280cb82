/*
 * check.h: the check macros of the C test programs under tests/c/. Every check prints
 * "ok <what>" or "FAIL <what>" (counted in failures) and scenario values are "val <key> <value>"
 * lines, which tests/c/conftest.py reads (Result.values, Result.failures).
 */
#ifndef FLEXNPU_TESTS_CHECK_H_
#define FLEXNPU_TESTS_CHECK_H_

#include <acl/acl.h>

#include <stdio.h>

static int failures;
static int rc;

#define CHECK(cond, ...)                                                                                         \
    do {                                                                                                         \
        if (cond) {                                                                                              \
            printf("ok ");                                                                                       \
        } else {                                                                                                 \
            printf("FAIL ");                                                                                     \
            failures++;                                                                                          \
        }                                                                                                        \
        printf(__VA_ARGS__);                                                                                     \
        printf("\n");                                                                                            \
        fflush(stdout);                                                                                          \
    } while (0)

static inline const char *msg(void)
{
    const char *m = aclGetRecentErrMsg();
    return m ? m : "(no message)";
}

#define CALL(expr) CHECK((rc = (expr)) == ACL_SUCCESS, "%s -> %d %s", #expr, rc, rc ? msg() : "")

static inline int expect(int got, int want, const char *what)
{
    const char *m = aclGetRecentErrMsg();
    CHECK(got == want, "%s -> %d (want %d) msg=%s", what, got, want, m ? m : "(none)");
    return got == want;
}

/* The exit status of a test program: its failures, capped. */
static inline int finish(void)
{
    printf("failures %d\n", failures + 0 * rc);
    return failures > 100 ? 100 : failures;
}

#endif /* FLEXNPU_TESTS_CHECK_H_ */
