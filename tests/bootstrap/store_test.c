/* The bootstrap store across real ranks: run under `loom launch -n 3` or
 * `mpirun -np 3`. Usage: store_test MODE, where MODE is
 *   basic     put/get/add/barrier between all ranks, threads sharing a client,
 *             a get that times out, and rank 0 closing first while the
 *             others still use the store;
 *   missing   rank 2 skips a barrier: the others must be told "rank 2";
 *   lost      rank 0 exits without closing: the others must hear that the
 *             store is lost, fast;
 *   failed_close  the job failed and rank 2 keeps its store open: rank 0's
 *             close waits a moment for it, not the store's timeout;
 *   clean_close   the same without a failure: rank 0 waits the timeout (the
 *             others may still read) and then says which rank it leaves;
 *   failed_reply  the job failed and rank 0 is stopped (SIGSTOP): a call
 *             gives up after a moment, not the store's timeout. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"
#include "rank_check.h"

static loom_launch_env env;

static double seconds(void) { return (double)loom_now_ns() / 1e9; }

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Values carry a zero byte in the middle: the store is binary-clean. */
static size_t value_of(int rank, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "value of rank %d", rank);
    buf[5] = '\0';
    return (size_t)n;
}

typedef struct adder {
    loom_store *store;
    int status;
} adder;

enum { THREADS = 4, ADDS = 25 };

static void *add_many(void *arg)
{
    adder *a = arg;
    for (int i = 0; i < ADDS && !a->status; i++) {
        int64_t v;
        a->status = loom_store_add(a->store, "threads", 1, &v);
    }
    return NULL;
}

static void basic(loom_store *s)
{
    int n = env.world_size, r = env.rank;
    char key[32], value[64], got[64];
    size_t len;

    snprintf(key, sizeof key, "k%d", r);
    size_t vlen = value_of(r, value, sizeof value);
    CHECK(loom_store_put(s, key, value, vlen) == LOOM_OK, "put %s", key);
    for (int q = 0; q < n; q++) {
        snprintf(key, sizeof key, "k%d", q);
        vlen = value_of(q, value, sizeof value);
        memset(got, 0, sizeof got);
        int rc = loom_store_get(s, key, got, sizeof got, &len, 10.0);
        CHECK(rc == LOOM_OK, "get %s: %s", key, loom_status_string(rc));
        CHECK(len == vlen && !memcmp(got, value, vlen), "get %s: wrong value (%zu bytes)", key,
              len);
    }

    /* A buffer too small still reports the whole length. */
    CHECK(loom_store_get(s, "k0", got, 3, &len, 10.0) == LOOM_OK &&
              len == value_of(0, value, sizeof value),
          "short get reports %zu", len);

    int64_t v = -1;
    CHECK(loom_store_add(s, "count", 1, &v) == LOOM_OK && v >= 1 && v <= n, "add gave %lld",
          (long long)v);
    CHECK(loom_store_barrier(s, "after-add", 10.0) == LOOM_OK, "barrier after-add");
    CHECK(loom_store_add(s, "count", 0, &v) == LOOM_OK && v == n, "count is %lld, want %d",
          (long long)v, n);
    /* An integer key reads as decimal text. */
    CHECK(loom_store_get(s, "count", got, sizeof got, &len, 1.0) == LOOM_OK && len == 1 &&
              got[0] == '0' + n,
          "count reads as '%.*s'", (int)len, got);

    /* Overwrite: the last put wins, seen by everyone after a barrier. */
    if (r == 0)
        CHECK(loom_store_put(s, "ow", "a", 1) == LOOM_OK, "put ow");
    CHECK(loom_store_barrier(s, "ow1", 10.0) == LOOM_OK, "barrier ow1");
    if (r == n - 1)
        CHECK(loom_store_put(s, "ow", "bb", 2) == LOOM_OK, "put ow again");
    CHECK(loom_store_barrier(s, "ow2", 10.0) == LOOM_OK, "barrier ow2");
    CHECK(loom_store_get(s, "ow", got, sizeof got, &len, 1.0) == LOOM_OK && len == 2 &&
              !memcmp(got, "bb", 2),
          "ow is '%.*s'", (int)len, got);

    /* The same barrier name, many times over. */
    for (int i = 0; i < 20; i++)
        CHECK(loom_store_barrier(s, "again", 10.0) == LOOM_OK, "barrier again #%d", i);

    /* Threads share the client. */
    adder adders[THREADS];
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
        adders[t] = (adder){s, 0};
        pthread_create(&threads[t], NULL, add_many, &adders[t]);
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        CHECK(adders[t].status == LOOM_OK, "thread %d: %s", t,
              loom_status_string(adders[t].status));
    }
    CHECK(loom_store_barrier(s, "threads", 10.0) == LOOM_OK, "barrier threads");
    CHECK(loom_store_add(s, "threads", 0, &v) == LOOM_OK && v == (int64_t)n * THREADS * ADDS,
          "threads count is %lld, want %d", (long long)v, n * THREADS * ADDS);

    /* A get of a key nobody puts times out on time, with the key named. */
    double t0 = seconds();
    int rc = loom_store_get(s, "nobody-puts-this", got, sizeof got, &len, 0.5);
    double took = seconds() - t0;
    CHECK(rc == LOOM_ERR_TIMEOUT, "missing key gave %s", loom_status_string(rc));
    CHECK(took >= 0.45 && took < 2.0, "missing key took %.2f s, want ~0.5", took);
    CHECK(strstr(loom_last_error(), "nobody-puts-this") != NULL, "error: %s", loom_last_error());

    /* Bad arguments are refused before anything is sent. */
    CHECK(loom_store_put(s, "", "x", 1) == LOOM_ERR_INVALID, "empty key");
    char long_key[300];
    memset(long_key, 'x', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    CHECK(loom_store_put(s, long_key, "x", 1) == LOOM_ERR_INVALID, "long key");
    CHECK(loom_store_add(s, "k0", 1, &v) == LOOM_ERR_INVALID, "add to a non-integer");
    CHECK(loom_store_barrier(s, "before-close", 10.0) == LOOM_OK, "barrier before-close");

    /* A get that waits while the value is put later, by another rank. */
    if (r == 1) {
        sleep_s(0.3);
        CHECK(loom_store_put(s, "late", "L", 1) == LOOM_OK, "put late");
    }
    if (r == 0) {
        CHECK(loom_store_get(s, "late", got, sizeof got, &len, 10.0) == LOOM_OK && len == 1 &&
                  got[0] == 'L',
              "late get");
    }
}

/* After rank 0 closed: the store must still serve the others. */
static void after_rank0_closed(loom_store *s)
{
    char got[8];
    size_t len;
    sleep_s(0.3);
    CHECK(loom_store_put(s, "after", "A", 1) == LOOM_OK, "put after rank 0 closed");
    CHECK(loom_store_get(s, "after", got, sizeof got, &len, 5.0) == LOOM_OK, "get after");
    /* Rank 0 has left for good: a barrier fails at once and says so. */
    double t0 = seconds();
    int rc = loom_store_barrier(s, "others", 10.0);
    CHECK(rc == LOOM_ERR_REMOTE, "barrier without rank 0 gave %s", loom_status_string(rc));
    CHECK(seconds() - t0 < 2.0, "barrier without rank 0 took %.2f s", seconds() - t0);
    CHECK(strstr(loom_last_error(), "rank 0 left without arriving (it finished or died)") != NULL,
          "error: %s", loom_last_error());
}

static void missing(loom_store *s)
{
    if (env.rank == 2) {
        sleep_s(2.0); /* never arrives at the barrier */
        return;
    }
    double t0 = seconds();
    int rc = loom_store_barrier(s, "x", 1.0);
    double took = seconds() - t0;
    CHECK(rc == LOOM_ERR_TIMEOUT, "barrier gave %s", loom_status_string(rc));
    CHECK(took >= 0.95 && took < 3.0, "barrier took %.2f s, want ~1", took);
    const char *want = "bootstrap: barrier 'x' timed out after 1.0 s: rank 2 did not arrive";
    CHECK(!strcmp(loom_last_error(), want), "error is '%s', want '%s'", loom_last_error(), want);
}

static void lost(loom_store *s)
{
    CHECK(loom_store_barrier(s, "up", 10.0) == LOOM_OK, "barrier up");
    if (env.rank == 0) {
        sleep_s(0.2);
        _exit(failures ? 1 : 0); /* no close: the server goes with the process */
    }
    char got[8];
    size_t len;
    double t0 = seconds();
    int rc = loom_store_get(s, "never", got, sizeof got, &len, 10.0);
    double took = seconds() - t0;
    CHECK(rc == LOOM_ERR_REMOTE, "get gave %s", loom_status_string(rc));
    CHECK(took < 3.0, "noticing took %.2f s", took);
    CHECK(strstr(loom_last_error(), "bootstrap: lost the store served by rank 0") ==
              loom_last_error(),
          "error: %s", loom_last_error());
    /* and every later call says the same at once */
    rc = loom_store_put(s, "k", "v", 1);
    CHECK(rc == LOOM_ERR_REMOTE, "put after loss gave %s", loom_status_string(rc));
}

/* Rank 2 holds its store open past rank 0's close, as a stopped rank would. */
static void held_open(loom_store **s, int failed)
{
    CHECK(loom_store_barrier(*s, "up", 10.0) == LOOM_OK, "barrier up");
    if (env.rank == 2) {
        sleep_s(failed ? 6.0 : 11.0);
    } else if (env.rank == 0) {
        if (failed)
            loom_store_job_failed(*s);
        double t0 = seconds();
        loom_store_close(*s);
        *s = NULL;
        double took = seconds() - t0;
        if (failed)
            CHECK(took < 3.5, "rank 0's close after a failure took %.2f s, want ~2", took);
        else
            CHECK(took > 9.5, "rank 0's clean close took %.2f s, want the timeout (10 s)", took);
    }
}

/* Whether process pid is stopped, within 2 s: a signal lands a little after
 * kill returns. */
static int wait_stopped(int pid)
{
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
        if (f)
            fclose(f);
        stat[len] = '\0';
        const char *close = strrchr(stat, ')');
        if (close && close[1] == ' ' && close[2] == 'T')
            return 1;
        sleep_s(0.01);
    }
    return 0;
}

static void failed_reply(loom_store *s)
{
    int pid = (int)getpid();
    if (env.rank == 0)
        CHECK(loom_store_put(s, "pid0", &pid, sizeof pid) == LOOM_OK, "put pid0");
    CHECK(loom_store_barrier(s, "up", 10.0) == LOOM_OK, "barrier up");
    if (env.rank == 0) {
        sleep_s(5.0); /* stopped for a while in here */
        return;
    }
    if (env.rank != 1)
        return;
    size_t len = 0;
    CHECK(loom_store_get(s, "pid0", &pid, sizeof pid, &len, 10.0) == LOOM_OK, "get pid0");
    kill(pid, SIGSTOP);
    CHECK(wait_stopped(pid), "rank 0 (pid %d) did not stop", pid);
    loom_store_job_failed(s);
    double t0 = seconds();
    int64_t v;
    int rc = loom_store_add(s, "count", 1, &v);
    double took = seconds() - t0;
    kill(pid, SIGCONT);
    CHECK(rc == LOOM_ERR_TIMEOUT, "add to a stopped rank 0 gave %s", loom_status_string(rc));
    CHECK(took < 3.5, "add to a stopped rank 0 after a failure took %.2f s, want ~2", took);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr,
                "usage: store_test basic|missing|lost|failed_close|clean_close|failed_reply\n");
        return 2;
    }
    const char *mode = argv[1];
    if (loom_bootstrap_detect(&env) != LOOM_OK) {
        fprintf(stderr, "store_test: %s\n", loom_last_error());
        return 1;
    }
    my_rank = env.rank;
    if (env.world_size != 3) {
        fprintf(stderr, "store_test: wants 3 ranks, got %d (source %s)\n", env.world_size,
                env.source);
        return 1;
    }
    loom_store *s;
    int rc = loom_store_open(&env, 10.0, &s);
    if (rc) {
        fprintf(stderr, "store_test: rank %d: %s\n", env.rank, loom_last_error());
        return 1;
    }
    if (!strcmp(mode, "basic")) {
        basic(s);
        if (env.rank == 0) {
            double t0 = seconds();
            loom_store_close(s);
            /* Rank 0 waited for the others' close, not for its timeout. */
            CHECK(seconds() - t0 < 5.0, "rank 0's close took %.2f s", seconds() - t0);
            s = NULL;
        } else {
            after_rank0_closed(s);
        }
    } else if (!strcmp(mode, "missing")) {
        missing(s);
    } else if (!strcmp(mode, "lost")) {
        lost(s);
    } else if (!strcmp(mode, "failed_close") || !strcmp(mode, "clean_close")) {
        held_open(&s, !strcmp(mode, "failed_close"));
    } else if (!strcmp(mode, "failed_reply")) {
        failed_reply(s);
    } else {
        fprintf(stderr, "store_test: unknown mode %s\n", mode);
        return 2;
    }
    loom_store_close(s);
    printf("store_test %s: rank %d of %d (%s): %s\n", mode, env.rank, env.world_size, env.source,
           failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
