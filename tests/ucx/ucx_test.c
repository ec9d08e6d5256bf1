/* comm-ucx beyond the collective suite:
 *
 *   ucx_test concurrency   collectives outstanding on two communicators at
 *                          once (the world and the world in reverse order),
 *                          several on one completed out of order, and
 *                          send/recv with the same tag on both
 *   ucx_test progress      with comm.ucx.progress_thread = true a collective
 *                          completes while every rank sleeps
 *   ucx_test kill          rank 2 of 3 dies mid-collective; the others fail
 *                          fast with an error naming it (rank 0 prints
 *                          "kill test: passed" when both did)
 *   ucx_test giveup        rank 1 of 3 never comes; rank 2 times out and
 *                          exits while rank 0, which came late and waits
 *                          for rank 2, still waits: rank 0 must blame rank
 *                          1, not the rank that gave up
 *
 * Extra arguments are --set overrides. Exit 0 when right. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/bootstrap.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "rank_check.h"

static const loom_comm_api *C = &loom_core_comm_api;

static float value(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 13)) % 11); }

static float *floats(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p)
        abort();
    for (size_t i = 0; i < n; i++)
        p[i] = -1;
    return p;
}

/* ------------------------------------------------------- concurrency */

static void test_concurrency(loom_group *world)
{
    int n = C->size(world), me = C->rank(world);
    int rev[64];
    for (int i = 0; i < n; i++)
        rev[i] = n - 1 - i;
    loom_group *sub;
    OK(loom_group_subgroup(world, rev, n, &sub));
    int sme = C->rank(sub);
    CHECK(sme == n - 1 - me, "reversed subgroup rank %d, want %d", sme, n - 1 - me);

    /* Collectives in flight on both groups at once, waited for in an
     * order unlike the order they were posted in. Sizes pick different
     * algorithms: ring and Rabenseifner on the world, recursive doubling
     * on the subgroup. */
    enum { BIG = 300001, MID = 20000, SMALL = 7 };
    float *wbig_in = floats(BIG), *wbig = floats(BIG), *wmid_in = floats(MID), *wmid = floats(MID);
    float *ssmall_in = floats(SMALL), *ssmall = floats(SMALL);
    float *wgath = floats((size_t)SMALL * n), *sbc = floats(MID);
    float *srs_in = floats((size_t)MID * n), *srs = floats(MID);
    for (size_t i = 0; i < BIG; i++)
        wbig_in[i] = value(me, i);
    for (size_t i = 0; i < MID; i++) {
        wmid_in[i] = value(me, i + 5);
        sbc[i] = sme == 0 ? value(99, i) : 0;
    }
    for (size_t i = 0; i < SMALL; i++)
        ssmall_in[i] = value(sme, i + 3);
    for (size_t i = 0; i < (size_t)MID * n; i++)
        srs_in[i] = value(sme, i);
    loom_request *req[8];
    OK(C->allreduce(world, wbig_in, wbig, BIG, LOOM_F32, LOOM_SUM, &req[0]));
    OK(C->allreduce(sub, ssmall_in, ssmall, SMALL, LOOM_F32, LOOM_MAX, &req[1]));
    OK(C->allreduce(world, wmid_in, wmid, MID, LOOM_F32, LOOM_SUM, &req[2]));
    OK(C->broadcast(sub, sbc, MID, LOOM_F32, 0, &req[3]));
    OK(C->allgather(world, ssmall_in, wgath, SMALL, LOOM_F32, &req[4]));
    OK(C->reducescatter(sub, srs_in, srs, MID, LOOM_F32, LOOM_SUM, &req[5]));
    OK(C->barrier(world, &req[6]));
    OK(C->barrier(sub, &req[7]));
    static const int order[8] = {5, 3, 7, 0, 6, 1, 4, 2};
    for (int k = 0; k < 8; k++)
        OK(C->wait(req[order[k]]));
    for (size_t i = 0; i < BIG; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += value(r, i);
        if (wbig[i] != want) {
            CHECK(0, "world allreduce at %zu: %g, want %g", i, wbig[i], want);
            break;
        }
    }
    for (size_t i = 0; i < MID; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += value(r, i + 5);
        if (wmid[i] != want) {
            CHECK(0, "world allreduce (mid) at %zu: %g, want %g", i, wmid[i], want);
            break;
        }
        if (sbc[i] != value(99, i)) {
            CHECK(0, "subgroup broadcast at %zu: %g", i, sbc[i]);
            break;
        }
        float rs = 0;
        for (int r = 0; r < n; r++)
            rs += value(r, (size_t)sme * MID + i);
        if (srs[i] != rs) {
            CHECK(0, "subgroup reducescatter at %zu: %g, want %g", i, srs[i], rs);
            break;
        }
    }
    for (size_t i = 0; i < SMALL; i++) {
        float want = value(0, i + 3);
        for (int r = 1; r < n; r++)
            want = value(r, i + 3) > want ? value(r, i + 3) : want;
        CHECK(ssmall[i] == want, "subgroup allreduce max at %zu: %g, want %g", i, ssmall[i], want);
        for (int r = 0; r < n; r++) /* block r came from world rank r = subgroup rank n-1-r */
            CHECK(wgath[(size_t)r * SMALL + i] == value(n - 1 - r, i + 3),
                  "world allgather block %d at %zu: %g", r, i, wgath[(size_t)r * SMALL + i]);
    }

    /* Several outstanding on one group, completed out of order, some by
     * polling test(). */
    enum { K = 6 };
    static const size_t sizes[K] = {1, 1000, 70000, 5, 262145, 33};
    float *in[K], *out[K];
    for (int k = 0; k < K; k++) {
        in[k] = floats(sizes[k]);
        out[k] = floats(sizes[k]);
        for (size_t i = 0; i < sizes[k]; i++)
            in[k][i] = value(me, i) * (float)(k + 1);
        OK(C->allreduce(world, in[k], out[k], sizes[k], LOOM_F32, LOOM_SUM, &req[k]));
    }
    for (int k = K - 1; k >= 0; k -= 2)
        OK(C->wait(req[k]));
    for (int k = 0; k < K; k += 2) {
        int rc, polls = 0;
        while ((rc = C->test(req[k])) == LOOM_IN_PROGRESS && polls++ < 2000000)
            usleep(10);
        CHECK(rc == LOOM_OK, "test on outstanding allreduce %d: %s: %s", k, loom_status_string(rc),
              loom_last_error());
    }
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < sizes[k]; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += value(r, i) * (float)(k + 1);
            if (out[k][i] != want) {
                CHECK(0, "outstanding allreduce %d at %zu: %g, want %g", k, i, out[k][i], want);
                break;
            }
        }
        free(in[k]);
        free(out[k]);
    }

    /* In-place reduce to a root other than 0, on the binomial tree (small)
     * and on the chain (large), and broadcast from that root. */
    static const size_t rcounts[2] = {1000, 300001};
    for (int k = 0; k < 2; k++) {
        size_t cnt = rcounts[k];
        int root = 1 % n;
        float *buf = floats(cnt);
        for (size_t i = 0; i < cnt; i++)
            buf[i] = value(me, i);
        OK(C->reduce(world, buf, buf, cnt, LOOM_F32, LOOM_SUM, root, &req[0]));
        OK(C->wait(req[0]));
        OK(C->broadcast(world, buf, cnt, LOOM_F32, root, &req[0]));
        OK(C->wait(req[0]));
        for (size_t i = 0; i < cnt; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += value(r, i);
            if (buf[i] != want) {
                CHECK(0, "in-place reduce of %zu to rank %d, broadcast back, at %zu: %g, want %g",
                      cnt, root, i, buf[i], want);
                break;
            }
        }
        free(buf);
    }

    /* The same tag on both groups, between the same two processes: each
     * message must land on its own group. Receives are posted in the
     * opposite order, and two messages share (peer, tag) on the world to
     * check they match in posting order. */
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    int snext = n - 1 - next, sprev = n - 1 - prev; /* the same processes in sub */
    float a1 = 1000.0f + (float)me, a2 = 2000.0f + (float)me, b = 3000.0f + (float)me;
    float ra1 = -1, ra2 = -1, rb = -1;
    loom_request *p[6];
    OK(C->recv(sub, &rb, 1, LOOM_F32, sprev, 5, &p[0]));
    OK(C->recv(world, &ra1, 1, LOOM_F32, prev, 5, &p[1]));
    OK(C->recv(world, &ra2, 1, LOOM_F32, prev, 5, &p[2]));
    OK(C->send(world, &a1, 1, LOOM_F32, next, 5, &p[3]));
    OK(C->send(world, &a2, 1, LOOM_F32, next, 5, &p[4]));
    OK(C->send(sub, &b, 1, LOOM_F32, snext, 5, &p[5]));
    for (int k = 5; k >= 0; k--)
        OK(C->wait(p[k]));
    CHECK(ra1 == 1000.0f + (float)prev && ra2 == 2000.0f + (float)prev && rb == 3000.0f + (float)prev,
          "same tag on two groups: world got %g then %g, subgroup got %g (from rank %d)", ra1, ra2,
          rb, prev);

    free(wbig_in);
    free(wbig);
    free(wmid_in);
    free(wmid);
    free(ssmall_in);
    free(ssmall);
    free(wgath);
    free(sbc);
    free(srs_in);
    free(srs);
    loom_group_destroy(sub);
}

/* ---------------------------------------------------------- progress */

/* Every rank posts a multi-step allreduce and sleeps. Without a progress
 * thread nobody moves it; with one, the first test() after the sleep finds
 * it done. */
static void test_progress(loom_group *world)
{
    int n = C->size(world), me = C->rank(world);
    const size_t count = 1 << 20;
    float *in = floats(count), *out = floats(count);
    for (size_t i = 0; i < count; i++)
        in[i] = value(me, i);
    for (int round = 0; round < 3; round++) {
        loom_request *b, *req;
        OK(C->barrier(world, &b));
        OK(C->wait(b));
        OK(C->allreduce(world, in, out, count, LOOM_F32, LOOM_SUM, &req));
        usleep(500 * 1000);
        int rc = C->test(req);
        CHECK(rc == LOOM_OK, "round %d: after 0.5 s of sleep the allreduce is %s (%s): the progress "
                             "thread did not complete it", round, loom_status_string(rc),
              rc == LOOM_IN_PROGRESS ? "" : loom_last_error());
        if (rc == LOOM_IN_PROGRESS)
            OK(C->wait(req));
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += value(r, i);
            if (out[i] != want) {
                CHECK(0, "allreduce at %zu: %g, want %g", i, out[i], want);
                break;
            }
        }
    }
    free(in);
    free(out);
}

/* -------------------------------------------------------------- kill */

static int test_kill(loom_runtime *rt, loom_group *world)
{
    int n = C->size(world), me = C->rank(world), victim = 2;
    if (n != 3) {
        fprintf(stderr, "ucx_test kill: run it on 3 ranks\n");
        return 1;
    }
    /* loom launch stops the others with SIGTERM once a rank dies; stay to
     * report (it sends SIGKILL 5 s later). */
    signal(SIGTERM, SIG_IGN);
    const size_t count = 4 << 20; /* 16 MiB: rendezvous transfers in flight */
    float *in = floats(count), *out = floats(count);
    for (size_t i = 0; i < count; i++)
        in[i] = value(me, i);
    double timeout = loom_runtime_timeout(rt);
    for (int round = 0;; round++) {
        loom_request *req;
        OK(C->allreduce(world, in, out, count, LOOM_F32, LOOM_SUM, &req));
        if (me == victim && round == 2) {
            usleep(2000); /* let the transfers get going */
            kill(getpid(), SIGKILL);
        }
        uint64_t t0 = loom_now_ns();
        int rc = C->wait(req);
        if (rc == LOOM_OK)
            continue;
        double took = (double)(loom_now_ns() - t0) / 1e9;
        const char *msg = loom_last_error();
        printf("[rank %d] after %.2f s: %s: %s\n", me, took, loom_status_string(rc), msg);
        fflush(stdout);
        int right = (rc == LOOM_ERR_REMOTE || rc == LOOM_ERR_TIMEOUT) && strstr(msg, "allreduce") &&
                    strstr(msg, "rank 2") && took < timeout;
        loom_store *s = loom_runtime_store(rt);
        if (me == 1) {
            loom_store_put(s, "kill/1", right ? "y" : "n", 1);
        } else {
            char got = 'n';
            size_t len = 0;
            loom_store_get(s, "kill/1", &got, 1, &len, 4.0);
            printf("kill test: %s\n", right && got == 'y' ? "passed" : "FAILED");
            fflush(stdout);
        }
        _exit(right ? 0 : 1);
    }
}

/* ------------------------------------------------------------ giveup */

static int test_giveup(loom_group *world)
{
    int n = C->size(world), me = C->rank(world);
    if (n != 3) {
        fprintf(stderr, "ucx_test giveup: run it on 3 ranks\n");
        return 1;
    }
    if (me == 1) { /* never comes */
        sleep(8);
        _exit(0);
    }
    if (me == 0) /* comes late, so rank 2 gives up first */
        usleep(1500 * 1000);
    float x = 1, y = 0;
    loom_request *req;
    OK(C->allreduce(world, &x, &y, 1, LOOM_F32, LOOM_SUM, &req));
    int rc = C->wait(req);
    const char *msg = loom_last_error();
    printf("[rank %d] wait: %s: %s\n", me, loom_status_string(rc), msg);
    fflush(stdout);
    if (me == 2)
        _exit(0); /* gives up and goes, as a failing job's rank would */
    int right = rc == LOOM_ERR_TIMEOUT && strstr(msg, "rank 1 did not arrive");
    printf("giveup test: %s\n", right ? "passed" : "FAILED");
    fflush(stdout);
    _exit(right ? 0 : 1);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ucx_test concurrency|progress|kill|giveup [--set path=value ...]\n");
        return 2;
    }
    const char *mode = argv[1];
    const char *overrides[32] = {"comm.timeout_s=60"};
    int noverrides = 1;
    if (!strcmp(mode, "progress"))
        overrides[noverrides++] = "comm.ucx.progress_thread=true";
    if (!strcmp(mode, "kill"))
        overrides[0] = "comm.timeout_s=30";
    if (!strcmp(mode, "giveup")) {
        overrides[0] = "comm.timeout_s=3";
        overrides[noverrides++] = "comm.ucx.allreduce=ring"; /* rank 0 waits for rank 2 */
    }
    for (int i = 2; i + 1 < argc && noverrides < 32; i += 2)
        if (!strcmp(argv[i], "--set"))
            overrides[noverrides++] = argv[i + 1];
    loom_config *cfg;
    loom_runtime *rt;
    OK(loom_config_load(NULL, overrides, noverrides, &cfg));
    OK(loom_runtime_create(cfg, &rt));
    loom_group *world;
    OK(loom_group_world(rt, "ucx", &world));
    my_rank = C->rank(world);

    if (!strcmp(mode, "concurrency"))
        test_concurrency(world);
    else if (!strcmp(mode, "progress"))
        test_progress(world);
    else if (!strcmp(mode, "kill"))
        return test_kill(rt, world);
    else if (!strcmp(mode, "giveup"))
        return test_giveup(world);
    else {
        fprintf(stderr, "ucx_test: unknown mode '%s'\n", mode);
        return 2;
    }

    int local = failures, total = 0;
    loom_request *req;
    OK(C->allreduce(world, &local, &total, 1, LOOM_I32, LOOM_SUM, &req));
    OK(C->wait(req));
    loom_group_destroy(world);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    if (my_rank == 0)
        printf("ucx %s: %s (%d failures)\n", mode, total ? "FAILED" : "passed", total);
    return total ? 1 : 0;
}
