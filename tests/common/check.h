/* Checks for the tests' C programs, one header for all of them:
 *
 *   CHECK(cond) or CHECK(cond, "format", ...)
 *       counts a failure and prints file:line, the condition and the
 *       message; the first CHECK_SHOWN failures are printed, all counted;
 *   CHECK_EQ(got, want)         exact, as doubles (integers below 2^53 too);
 *   CHECK_NEAR(got, want, tol)  |got - want| <= tol;
 *   CHECK_REL(got, want, rel)   |got - want| <= rel * |want|;
 *   CHECK_STR(got, want)        equal strings (got NULL fails);
 *   CHECK_ERROR(part)           the last loom error contains part;
 *       each prints the expression, what it is and what it should be;
 *   REQUIRE(cond) or REQUIRE(cond, "format", ...)
 *       a CHECK the test cannot go on without: on failure, exit 1;
 *   OK(call)  a loom call that must succeed: on failure prints the call,
 *       its status and the error's detail line, and exits 1;
 *   return check_done("name");  the end of main: 0, or 1 after
 *       "name: N check(s) failed".
 *
 * A multi-rank test includes rank_check.h instead, which names the rank
 * in every line. */
#ifndef LOOM_TEST_CHECK_H
#define LOOM_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"

const char *loom_last_error(void);

/* Who fails, in front of every line: rank_check.h sets the rank. */
#ifndef CHECK_WHO
#define CHECK_WHO_FORMAT "%s"
#define CHECK_WHO ""
#endif

enum { CHECK_SHOWN = 20 };

static int failures;

/* Count a failure; 1 when it is still to be printed (its head is). */
static inline int check_failed(const char *file, int line)
{
    if (failures++ >= CHECK_SHOWN)
        return 0;
    fprintf(stderr, CHECK_WHO_FORMAT "FAIL %s:%d: ", CHECK_WHO, file, line);
    return 1;
}

static inline double check_abs(double x) { return x < 0 ? -x : x; }

/* CHECK with one argument or more: the message is optional, and the
 * count of arguments picks the form (up to 16 message arguments). */
#define CHECK(...)                                                                                 \
    CHECK_PICK_(__VA_ARGS__, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_,           \
                CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_,            \
                CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_, CHECK_SAY_,            \
                CHECK_BARE_, none)                                                                 \
    (__VA_ARGS__)
#define CHECK_PICK_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,   \
                    a18, form, ...)                                                                \
    form

#define CHECK_BARE_(cond)                                                                          \
    do {                                                                                           \
        if (!(cond) && check_failed(__FILE__, __LINE__))                                           \
            fprintf(stderr, "%s\n", #cond);                                                        \
    } while (0)

#define CHECK_SAY_(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond) && check_failed(__FILE__, __LINE__)) {                                         \
            fprintf(stderr, "%s: ", #cond);                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define REQUIRE(...)                                                                               \
    do {                                                                                           \
        int before_ = failures;                                                                    \
        CHECK(__VA_ARGS__);                                                                        \
        if (failures != before_)                                                                   \
            exit(1);                                                                               \
    } while (0)

#define CHECK_EQ(got, want)                                                                        \
    do {                                                                                           \
        double g_ = (double)(got), w_ = (double)(want);                                            \
        if (!(g_ == w_) && check_failed(__FILE__, __LINE__))                                       \
            fprintf(stderr, "%s = %.17g, want %.17g\n", #got, g_, w_);                             \
    } while (0)

#define CHECK_NEAR(got, want, tol)                                                                 \
    do {                                                                                           \
        double g_ = (got), w_ = (want), t_ = (tol);                                                \
        if (!(check_abs(g_ - w_) <= t_) && check_failed(__FILE__, __LINE__))                       \
            fprintf(stderr, "%s = %.17g, want %.17g within %.3g\n", #got, g_, w_, t_);             \
    } while (0)

#define CHECK_REL(got, want, rel)                                                                  \
    do {                                                                                           \
        double g_ = (got), w_ = (want), r_ = (rel);                                                \
        if (!(check_abs(g_ - w_) <= r_ * check_abs(w_)) && check_failed(__FILE__, __LINE__))       \
            fprintf(stderr, "%s = %.17g, want %.17g within %.3g of it\n", #got, g_, w_, r_);       \
    } while (0)

#define CHECK_STR(got, want)                                                                       \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        if ((!g_ || strcmp(g_, w_)) && check_failed(__FILE__, __LINE__))                           \
            fprintf(stderr, "%s = \"%s\"\n  want \"%s\"\n", #got, g_ ? g_ : "(null)", w_);         \
    } while (0)

#define CHECK_ERROR(part)                                                                          \
    do {                                                                                           \
        const char *e_ = loom_last_error(), *p_ = (part);                                          \
        if (!strstr(e_, p_) && check_failed(__FILE__, __LINE__))                                   \
            fprintf(stderr, "the last error \"%s\"\n  lacks \"%s\"\n", e_, p_);                    \
    } while (0)

#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != LOOM_OK) {                                                                      \
            fprintf(stderr, CHECK_WHO_FORMAT "FAIL %s:%d: %s -> %s: %s\n", CHECK_WHO, __FILE__,   \
                    __LINE__, #call, loom_status_string(rc_), loom_last_error());                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline int check_done(const char *name)
{
    if (failures)
        fprintf(stderr, CHECK_WHO_FORMAT "%s: %d check(s) failed\n", CHECK_WHO, name, failures);
    return failures ? 1 : 0;
}

#endif
