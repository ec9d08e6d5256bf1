/* The flight recorder in one process: a ring recorded through the API
 * into the table file `loom launch` reads, read back and formatted; and the
 * diagnosis over hand-made tables of several ranks, against fixed lines. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/flight.h"
#include "runtime/log.h"
#include "check.h"

/* ---- SIGUSR1 dumps the table even after a library took the signal ---- */

static void foreign_handler(int sig) { (void)sig; }

/* Called with the table open: a library's handler installed after the
 * recorder's, the next step takes SIGUSR1 back, and the signal dumps the
 * table to stderr. */
static void test_sigusr1_kept(const char *dir)
{
    struct sigaction sa = {.sa_handler = foreign_handler};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    loom_flight_step(99);
    char path[4200];
    snprintf(path, sizeof path, "%s/dump", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600), saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    raise(SIGUSR1);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[512] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    CHECK(strstr(text, "on SIGUSR1:") != NULL,
          "SIGUSR1 after a library's handler dumped nothing: \"%.200s\"", text);
}

/* ---- recording through the API, reading the file back ---- */

static void test_recording(const char *dir)
{
    setenv(LOOM_FLIGHT_DIR_ENV, dir, 1);
    loom_flight_open(1, 3);
    CHECK(loom_flight_shared(), "the table is not the launcher's file");
    loom_flight_group *dp = loom_flight_join("mpi.w0.abc.0", "sub", "mpi", 1, 3);
    CHECK(dp != NULL, "no ring for the group");
    loom_flight_rename(dp, "dp");
    loom_flight_group *pp = loom_flight_join("mpi.w0.def.0", "pp", "mpi", 0, 2);

    /* 70 collectives: the ring keeps the last 64 (#7..#70) */
    uint64_t first_ticket = 0, ticket = 0;
    for (int k = 1; k <= 70; k++) {
        loom_flight_step(k / 10 + 1);
        loom_flight_issuer("backward block %d", k % 4);
        ticket = loom_flight_post(dp, LOOM_OP_ALLREDUCE, (uint64_t)k, 400, -1);
        if (k == 1)
            first_ticket = ticket;
        if (k < 69) {
            loom_flight_mark(dp, ticket, LOOM_FLIGHT_WAITING);
            loom_flight_mark(dp, ticket, LOOM_FLIGHT_COMPLETED);
        }
    }
    /* #69 stays posted; #70 is waited on, fails, and a late "completed"
     * cannot undo that */
    loom_flight_mark(dp, ticket, LOOM_FLIGHT_WAITING);
    loom_flight_mark(dp, ticket, LOOM_FLIGHT_FAILED);
    loom_flight_mark(dp, ticket, LOOM_FLIGHT_COMPLETED);
    /* the ring went round: #1's ticket must not touch #65's slot */
    loom_flight_mark(dp, first_ticket, LOOM_FLIGHT_FAILED);
    loom_flight_issuer("recv activation mb %d vs %d", 2, 0);
    uint64_t r = loom_flight_post(pp, LOOM_OP_RECV, 1, 64, 0);
    loom_flight_mark(pp, r, LOOM_FLIGHT_WAITING);

    char path[4200];
    snprintf(path, sizeof path, "%s/rank-1.flight", dir);
    static loom_flight_view v;
    int rc = loom_flight_load(path, &v);
    CHECK(rc == LOOM_OK, "load: %s", loom_last_error());
    if (rc != LOOM_OK)
        return;
    CHECK(v.rank == 1 && v.world_size == 3 && v.pid == (int)getpid(), "header %d %d %d", v.rank,
          v.world_size, v.pid);
    CHECK(v.ngroups == 2, "%d groups", v.ngroups);
    const loom_flight_group_view *g = &v.groups[0];
    CHECK(!strcmp(g->name, "dp") && !strcmp(g->backend, "mpi") && g->rank == 1 && g->size == 3,
          "group %s %s %d/%d", g->name, g->backend, g->rank, g->size);
    CHECK(g->recorded == 70 && g->count == 64, "recorded %llu, kept %d",
          (unsigned long long)g->recorded, g->count);
    CHECK(g->entries[0].seq == 7 && g->entries[63].seq == 70, "kept #%llu..#%llu",
          (unsigned long long)g->entries[0].seq, (unsigned long long)g->entries[63].seq);
    CHECK(g->entries[58].state == LOOM_FLIGHT_COMPLETED, "#65 is %d", g->entries[58].state);
    CHECK(g->entries[62].state == LOOM_FLIGHT_POSTED, "#69 is %d", g->entries[62].state);
    CHECK(g->entries[63].state == LOOM_FLIGHT_FAILED, "#70 is %d", g->entries[63].state);
    CHECK(g->entries[63].step == 8 && !strcmp(g->entries[63].issuer, "backward block 2"),
          "#70 issued by step %lld %s", (long long)g->entries[63].step, g->entries[63].issuer);
    const loom_flight_entry *recv = &v.groups[1].entries[0];
    CHECK(recv->op == LOOM_OP_RECV && recv->peer == 0 && recv->state == LOOM_FLIGHT_WAITING,
          "the recv: op %d peer %d state %d", recv->op, recv->peer, recv->state);

    /* the text -v and SIGUSR1 show */
    static char text[1 << 16];
    loom_flight_rank how = {&v, LOOM_RANK_STOPPED, 0};
    loom_flight_format(&v, 1, &how, loom_now_ns(), 3, text, sizeof text);
    char head[64];
    snprintf(head, sizeof head, "rank 1 (pid %d, stopped):\n", (int)getpid());
    CHECK(!strncmp(text, head, strlen(head)), "format starts: %.80s", text);
    const char *want[] = {
        "  dp (mpi, rank 1 of 3): 70 operations, the last 3:\n",
        "    allreduce #68, 400 B: completed after ",
        "    allreduce #69, 400 B: posted ",
        " ago, not waited on; step 7, backward block 1\n",
        "    allreduce #70, 400 B: failed after ",
        "  pp (mpi, rank 0 of 2): 1 operation:\n",
        "    recv #1 from rank 0, 64 B: waiting for ",
        "; step 8, recv activation mb 2 vs 0\n",
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        CHECK(strstr(text, want[k]), "format lacks \"%s\":\n%s", want[k], text);

    /* a closed group keeps its ring for the record */
    loom_flight_leave(dp);
    rc = loom_flight_load(path, &v);
    CHECK(rc == LOOM_OK && v.ngroups == 2 && v.groups[0].recorded == 70,
          "a closed group's record is gone");
    unlink(path);
    test_sigusr1_kept(dir);
}

/* ---- the diagnosis over hand-made tables ---- */

static loom_flight_view views[6];

static void reset(int n)
{
    memset(views, 0, sizeof views);
    for (int r = 0; r < n; r++) {
        views[r].rank = r;
        views[r].world_size = n;
        views[r].pid = 1000 + r;
    }
}

static loom_flight_group_view *group(int rank, const char *id, const char *name, int grank,
                                    int size)
{
    loom_flight_view *v = &views[rank];
    for (int i = 0; i < v->ngroups; i++)
        if (!strcmp(v->groups[i].id, id))
            return &v->groups[i];
    loom_flight_group_view *g = &v->groups[v->ngroups++];
    snprintf(g->id, sizeof g->id, "%s", id);
    snprintf(g->name, sizeof g->name, "%s", name);
    snprintf(g->backend, sizeof g->backend, "mpi");
    g->rank = grank;
    g->size = size;
    return g;
}

/* ops seq first..last of op on g, all completed but the last, which is in
 * state last_state; waited at `at` */
static void ops(loom_flight_group_view *g, loom_comm_op op, int first, int last, int last_state,
                int peer, uint64_t at, const char *issuer)
{
    for (int s = first; s <= last; s++) {
        loom_flight_entry *e = &g->entries[g->count++];
        g->recorded++;
        memset(e, 0, sizeof *e);
        e->seq = (uint64_t)s;
        e->op = op;
        e->bytes = 64;
        e->peer = peer;
        e->step = 5;
        snprintf(e->issuer, sizeof e->issuer, "%s", issuer);
        e->posted_ns = at - 100;
        e->state = s == last ? last_state : LOOM_FLIGHT_COMPLETED;
        if (e->state != LOOM_FLIGHT_POSTED)
            e->waited_ns = at;
        if (e->state == LOOM_FLIGHT_COMPLETED || e->state == LOOM_FLIGHT_FAILED)
            e->ended_ns = at + 10;
    }
}

static void expect(const char *name, const loom_flight_rank *ranks, int n, int want_waits,
                   const char *want)
{
    char line[2048];
    int waits = loom_flight_diagnose(ranks, n, 5000 + 3000000000ull, line, sizeof line);
    CHECK(waits == want_waits && !strcmp(line, want),
          "%s:\n  got  (%d) \"%s\"\n  want (%d) \"%s\"", name, waits, line, want_waits, want);
}

static void test_diagnosis(void)
{
    loom_flight_rank ranks[6];
    const char *dp = "mpi.w0.1.0";

    /* a rank stopped between steps: the others wait in the next op */
    reset(3);
    ops(group(0, dp, "dp", 0, 3), LOOM_OP_ALLREDUCE, 1, 42, LOOM_FLIGHT_WAITING, -1, 5000, "loss");
    ops(group(1, dp, "dp", 1, 3), LOOM_OP_ALLREDUCE, 1, 42, LOOM_FLIGHT_WAITING, -1, 5000, "loss");
    ops(group(2, dp, "dp", 2, 3), LOOM_OP_ALLREDUCE, 1, 41, LOOM_FLIGHT_COMPLETED, -1, 4000,
        "backward block 0");
    for (int r = 0; r < 3; r++)
        ranks[r] = (loom_flight_rank){&views[r], r == 2 ? LOOM_RANK_STOPPED : LOOM_RANK_RUNNING, 0};
    expect("stopped between ops", ranks, 3, 1,
           "rank 2 (stopped) is after dp allreduce #41 (step 5, backward block 0); ranks 0, 1 "
           "wait in dp allreduce #42 for 3.000 s");

    /* rank 1 timed out and exited: still one of the waiting */
    views[1].groups[0].entries[41].state = LOOM_FLIGHT_FAILED;
    views[1].groups[0].entries[41].ended_ns = 6000;
    ranks[1] = (loom_flight_rank){&views[1], LOOM_RANK_EXITED, 1};
    expect("the rank that timed out", ranks, 3, 1,
           "rank 2 (stopped) is after dp allreduce #41 (step 5, backward block 0); ranks 0, 1 "
           "wait in dp allreduce #42 for 3.000 s");

    /* the example: stopped inside an earlier op */
    reset(4);
    for (int r = 0; r < 4; r++) {
        int last = r == 2 ? 41 : 42;
        ops(group(r, dp, "dp", r, 4), LOOM_OP_ALLREDUCE, 1, last, LOOM_FLIGHT_WAITING, -1, 5000,
            "");
        ranks[r] = (loom_flight_rank){&views[r], r == 2 ? LOOM_RANK_STOPPED : LOOM_RANK_RUNNING, 0};
    }
    expect("stopped in a wait", ranks, 4, 1,
           "rank 2 (stopped) is in dp allreduce #41 (step 5); ranks 0, 1, 3 wait in dp allreduce "
           "#42 for 3.000 s");

    /* ops posted ahead (ddp's buckets): a later number posted is not a
     * finished op; rank 0 stopped, the store's rank */
    reset(3);
    for (int r = 0; r < 3; r++) {
        loom_flight_group_view *g = group(r, dp, "dp", r, 3);
        ops(g, LOOM_OP_ALLREDUCE, 1, 10, r == 0 ? LOOM_FLIGHT_POSTED : LOOM_FLIGHT_WAITING, -1,
            5000, "backward block 1");
        ops(g, LOOM_OP_ALLREDUCE, 11, 12, LOOM_FLIGHT_POSTED, -1, 5000, "backward block 0");
        g->entries[10].state = LOOM_FLIGHT_POSTED;
        ranks[r] = (loom_flight_rank){&views[r], r == 0 ? LOOM_RANK_STOPPED : LOOM_RANK_RUNNING, 0};
    }
    expect("rank 0 behind with ops posted ahead", ranks, 3, 1,
           "rank 0 (stopped) posted dp allreduce #10 but does not wait on it (step 5, backward "
           "block 1); ranks 1, 2 wait in dp allreduce #10 for 3.000 s");

    /* a chain: 0 waits on 1 in the pipeline, 1 on 2 in dp, 2 was killed */
    reset(3);
    const char *pp = "mpi.w0.2.0", *dp12 = "mpi.w0.3.0";
    ops(group(0, pp, "pp", 0, 2), LOOM_OP_RECV, 1, 3, LOOM_FLIGHT_WAITING, 1, 5000,
        "recv activation mb 1 vs 0");
    group(1, pp, "pp", 1, 2);
    ops(group(1, dp12, "dp", 0, 2), LOOM_OP_ALLREDUCE, 1, 4, LOOM_FLIGHT_WAITING, -1, 5000, "");
    ops(group(2, dp12, "dp", 1, 2), LOOM_OP_ALLREDUCE, 1, 3, LOOM_FLIGHT_COMPLETED, -1, 4000, "");
    ranks[0] = (loom_flight_rank){&views[0], LOOM_RANK_RUNNING, 0};
    ranks[1] = (loom_flight_rank){&views[1], LOOM_RANK_RUNNING, 0};
    ranks[2] = (loom_flight_rank){&views[2], LOOM_RANK_KILLED, 9};
    expect("a chain of waits", ranks, 3, 1,
           "rank 2 (killed by signal 9) is after dp allreduce #3 (step 5); rank 0 waits in pp "
           "recv #3 from rank 1 for 3.000 s; rank 1 waits in dp allreduce #4 for 3.000 s");

    /* everyone in one op: nobody is behind */
    reset(3);
    for (int r = 0; r < 3; r++) {
        ops(group(r, dp, "dp", r, 3), LOOM_OP_ALLREDUCE, 1, 7, LOOM_FLIGHT_WAITING, -1, 5000, "");
        ranks[r] = (loom_flight_rank){&views[r], LOOM_RANK_RUNNING, 0};
    }
    expect("all in one op", ranks, 3, 1,
           "ranks 0, 1, 2 wait in dp allreduce #7 for 3.000 s, and none is behind: the ranks called different "
           "operations, counts, dtypes or roots there, or the transport failed");

    /* two receives waiting on each other */
    reset(2);
    ops(group(0, pp, "pp", 0, 2), LOOM_OP_RECV, 1, 1, LOOM_FLIGHT_WAITING, 1, 5000, "");
    ops(group(1, pp, "pp", 1, 2), LOOM_OP_RECV, 1, 1, LOOM_FLIGHT_WAITING, 0, 5000, "");
    ranks[0] = (loom_flight_rank){&views[0], LOOM_RANK_RUNNING, 0};
    ranks[1] = (loom_flight_rank){&views[1], LOOM_RANK_RUNNING, 0};
    expect("mutual receives", ranks, 2, 1,
           "rank 0 waits in pp recv #1 from rank 1 for 3.000 s; rank 1 waits in pp recv #1 from "
           "rank 0 for 3.000 s, and none is behind: they wait on each other (mismatched sends and receives, or operations "
           "called in a different order)");

    /* nobody waits; a rank without a record */
    reset(3);
    ops(group(0, dp, "dp", 0, 3), LOOM_OP_ALLREDUCE, 1, 3, LOOM_FLIGHT_COMPLETED, -1, 5000, "");
    ranks[0] = (loom_flight_rank){&views[0], LOOM_RANK_RUNNING, 0};
    ranks[1] = (loom_flight_rank){NULL, LOOM_RANK_STOPPED, 0};
    ranks[2] = (loom_flight_rank){&views[2], LOOM_RANK_EXITED, 0};
    expect("nobody waits", ranks, 3, 0, "no rank waits on another; rank 1 is stopped");

    /* a rank with no record the others wait on */
    ops(group(2, dp, "dp", 2, 3), LOOM_OP_ALLREDUCE, 1, 4, LOOM_FLIGHT_WAITING, -1, 5000, "");
    ranks[2] = (loom_flight_rank){&views[2], LOOM_RANK_RUNNING, 0};
    ops(group(0, dp, "dp", 0, 3), LOOM_OP_ALLREDUCE, 4, 4, LOOM_FLIGHT_COMPLETED, -1, 5000, "");
    expect("no record", ranks, 3, 1,
           "rank 2 waits in dp allreduce #4 for 3.000 s; rank 1 (stopped) left no flight record");
}

int main(void)
{
    char dir[] = "/tmp/loom-flight-test-XXXXXX";
    const char *tmp = getenv("TMPDIR");
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s/loom-flight-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    char *made = mkdtemp(dirbuf);
    if (!made) {
        perror(dir);
        return 1;
    }
    test_recording(made);
    rmdir(made);
    test_diagnosis();
    if (failures) {
        fprintf(stderr, "flight_test: %d failures\n", failures);
        return 1;
    }
    printf("flight_test: ok\n");
    return 0;
}
