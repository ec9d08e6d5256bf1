/* tests/common/check.h (and rank_check.h, built with -DRANK_CHECK) checked
 * against itself: what holds passes silently; what does not is counted
 * and printed with file:line, the expression and the values, the first
 * CHECK_SHOWN only; REQUIRE and OK stop the program with 1; check_done
 * says how many failed. The macros under test run with stderr in a file;
 * the verdicts are this file's own, on stdout.
 *
 *   check_test   exit 0 when every verdict holds */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/log.h"
#ifdef RANK_CHECK
#include "rank_check.h"
#define WHO "[rank 3] "
#else
#include "check.h"
#define WHO ""
#endif

static int wrong;

static void verdict(int holds, const char *what)
{
    if (!holds) {
        printf("check_test: wrong: %s\n", what);
        wrong++;
    }
}

static char captured[16384];

/* Run the checks of `run` with stderr in a file; captured holds what they printed. */
static void capture(void (*run)(void))
{
    char path[] = "/tmp/loom-check-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        exit(2);
    }
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    run();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, captured, sizeof captured - 1, 0);
    captured[n > 0 ? n : 0] = '\0';
    close(fd);
}

/* Printed: "FAIL <this file>:<line>: <rest>" (after the rank, if any). */
static void printed(int line, const char *rest)
{
    char want[512];
    snprintf(want, sizeof want, WHO "FAIL %s:%d: %s", __FILE__, line, rest);
    if (!strstr(captured, want))
        printf("check_test: it printed:\n%s", captured);
    verdict(strstr(captured, want) != NULL, want);
}

static void holding(void)
{
    loom_fail(LOOM_ERR_INVALID, "the bad thing");
    CHECK(1 + 1 == 2);
    CHECK(1 + 1 == 2, "never printed %d", 2);
    CHECK_EQ(3, 3.0);
    CHECK_EQ((unsigned long long)1 << 52, 4503599627370496.0);
    CHECK_NEAR(1.0, 1.05, 0.1);
    CHECK_REL(100.0, 101.0, 0.02);
    CHECK_STR("same", "same");
    CHECK_ERROR("bad thing");
    REQUIRE(1);
    REQUIRE(2 > 1, "never printed");
    OK(LOOM_OK);
}

static int lines[8];

static void failing(void)
{
    loom_fail(LOOM_ERR_INVALID, "the bad thing");
    lines[0] = __LINE__ + 1;
    CHECK(1 + 1 == 3);
    lines[1] = __LINE__ + 1;
    CHECK(2 < 1, "two is %d, one %s", 2, "one");
    lines[2] = __LINE__ + 1;
    CHECK_EQ(1 + 1, 3);
    lines[3] = __LINE__ + 1;
    CHECK_NEAR(1.0, 2.0, 0.5);
    lines[4] = __LINE__ + 1;
    CHECK_REL(1.0, 2.0, 0.1);
    lines[5] = __LINE__ + 1;
    CHECK_STR(NULL, "x");
    lines[6] = __LINE__ + 1;
    CHECK_STR("a", "b");
    lines[7] = __LINE__ + 1;
    CHECK_ERROR("absent");
}

static void many(void)
{
    for (int i = 0; i < 3 * CHECK_SHOWN; i++)
        CHECK(i < 0, "i = %d", i);
}

/* The exit status of `stop` run in a child, its stderr captured. */
static int stop_status;
static void (*stop)(void);
static void run_child(void)
{
    fflush(stdout); /* the child's exit must not print the parent's lines again */
    pid_t pid = fork();
    if (pid == 0) {
        stop();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    stop_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A REQUIRE that fails, run or not: returns its line. */
static int require_fails(int run)
{
    if (run)
        REQUIRE(0 > 1, "cannot go on");
    return __LINE__ - 1;
}

static int ok_fails(int run)
{
    if (run)
        OK(loom_fail(LOOM_ERR_NOT_FOUND, "no such thing"));
    return __LINE__ - 1;
}

static void required(void)
{
    failures = 0; /* printed: not past CHECK_SHOWN */
    require_fails(1);
    printf("check_test: wrong: REQUIRE went on\n");
}

static void ok_failed(void)
{
    ok_fails(1);
    printf("check_test: wrong: OK went on\n");
}

static void done(void) { exit(check_done("the checks")); }

int main(void)
{
#ifdef RANK_CHECK
    my_rank = 3;
#endif
    capture(holding);
    verdict(failures == 0 && captured[0] == '\0', "what holds passes silently");

    capture(failing);
    verdict(failures == 8, "each failing check counts once");
    printed(lines[0], "1 + 1 == 3\n");
    printed(lines[1], "2 < 1: two is 2, one one\n");
    printed(lines[2], "1 + 1 = 2, want 3\n");
    printed(lines[3], "1.0 = 1, want 2 within 0.5\n");
    printed(lines[4], "1.0 = 1, want 2 within 0.1 of it\n");
    printed(lines[5], "NULL = \"(null)\"\n  want \"x\"\n");
    printed(lines[6], "\"a\" = \"a\"\n  want \"b\"\n");
    printed(lines[7], "the last error \"the bad thing\"\n  lacks \"absent\"\n");

    capture(many); /* 8 failures before: CHECK_SHOWN - 8 of these printed */
    int shown = 0;
    for (const char *p = captured; (p = strstr(p, "FAIL ")); p++)
        shown++;
    verdict(failures == 8 + 3 * CHECK_SHOWN, "every failure counts");
    verdict(shown == CHECK_SHOWN - 8, "only the first CHECK_SHOWN failures are printed");

    stop = required;
    capture(run_child);
    verdict(stop_status == 1, "REQUIRE exits 1");
    printed(require_fails(0), "0 > 1: cannot go on\n");
    stop = ok_failed;
    capture(run_child);
    verdict(stop_status == 1, "OK exits 1");
    char want[256];
    snprintf(want, sizeof want,
             "loom_fail(LOOM_ERR_NOT_FOUND, \"no such thing\") -> %s: no such thing\n",
             loom_status_string(LOOM_ERR_NOT_FOUND));
    printed(ok_fails(0), want);

    stop = done;
    capture(run_child);
    verdict(stop_status == 1, "check_done returns 1 after failures");
    snprintf(want, sizeof want, WHO "the checks: %d check(s) failed\n", failures);
    verdict(strstr(captured, want) != NULL, "check_done says how many failed");
    failures = 0;
    capture(run_child);
    verdict(stop_status == 0 && captured[0] == '\0', "check_done returns 0 silently");

    printf("check_test%s: %s\n", WHO[0] ? " (rank_check.h)" : "", wrong ? "FAILED" : "ok");
    return wrong ? 1 : 0;
}
