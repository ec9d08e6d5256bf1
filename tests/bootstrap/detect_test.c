/* Single-process checks of the bootstrap: rank detection from each
 * launcher's environment and its errors, the store's address rules, and
 * the store's messages when it cannot be served or reached. */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"
#include "check.h"

static const char *const all_vars[] = {
    "LOOM_RANK",
    "LOOM_WORLD_SIZE",
    "LOOM_LOCAL_RANK",
    "LOOM_LOCAL_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_LOCAL_RANK",
    "PMI_LOCAL_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_STEP_NODELIST",
    "SLURMD_NODENAME",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOOM_STORE_ADDR",
    "LOOM_STORE_PORT",
    "PMIX_NAMESPACE",
    "OMPI_MCA_orte_ess_jobid",
};

static void clear_env(void)
{
    for (size_t i = 0; i < LOOM_ARRAY_LEN(all_vars); i++)
        unsetenv(all_vars[i]);
}

/* "NAME=value NAME=value" */
static void set_env(const char *pairs)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", pairs);
    for (char *save, *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
}

static void expect_env(const char *pairs, int rank, int size, int local_rank, int local_size,
                       const char *source)
{
    clear_env();
    set_env(pairs);
    loom_launch_env e;
    int rc = loom_bootstrap_detect(&e);
    CHECK(rc == LOOM_OK && e.rank == rank && e.world_size == size && e.local_rank == local_rank &&
              e.local_size == local_size && !strcmp(e.source, source),
          "%s: got rc %d, %d/%d local %d/%d from %s", pairs, rc, e.rank, e.world_size, e.local_rank,
          e.local_size, e.source);
}

static void expect_error(const char *pairs, const char *mention)
{
    clear_env();
    set_env(pairs);
    loom_launch_env e;
    int rc = loom_bootstrap_detect(&e);
    CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), mention), "%s: rc %d, want '%s'",
          pairs, rc, mention);
}

static int free_port(int keep_listening, int *fd_out)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    if (keep_listening) {
        listen(fd, 1);
        *fd_out = fd;
    } else {
        close(fd);
    }
    return ntohs(a.sin_port);
}

static void detect(void)
{
    expect_env("", 0, 1, 0, 1, "none");
    expect_env("LOOM_RANK=2 LOOM_WORLD_SIZE=4", 2, 4, 2, 4, "LOOM");
    expect_env("LOOM_RANK=3 LOOM_WORLD_SIZE=4 LOOM_LOCAL_RANK=1 LOOM_LOCAL_SIZE=2", 3, 4, 1, 2,
               "LOOM");
    expect_env("OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1 "
               "OMPI_COMM_WORLD_LOCAL_SIZE=4",
               5, 8, 1, 4, "OMPI");
    /* LOOM_* wins over an outer launcher's variables */
    expect_env("LOOM_RANK=1 LOOM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1", 1, 2,
               1, 2, "LOOM");
    expect_env("PMI_RANK=3 PMI_SIZE=6 MPI_LOCALRANKID=0 MPI_LOCALNRANKS=3", 3, 6, 0, 3, "PMI");
    expect_env("PMI_RANK=1 PMI_SIZE=2 PMI_LOCAL_RANK=1 PMI_LOCAL_SIZE=2", 1, 2, 1, 2, "PMI");
    expect_env("SLURM_STEP_ID=0 SLURM_PROCID=3 SLURM_NTASKS=8 SLURM_LOCALID=1 SLURM_NODEID=1 "
               "SLURM_STEP_NUM_NODES=4 SLURM_STEP_TASKS_PER_NODE=2(x4)",
               3, 8, 1, 2, "SLURM");
    expect_env("SLURM_STEPID=1 SLURM_PROCID=6 SLURM_NTASKS=7 SLURM_LOCALID=0 SLURM_NODEID=2 "
               "SLURM_STEP_NUM_NODES=3 SLURM_STEP_TASKS_PER_NODE=3(x2),1",
               6, 7, 0, 1, "SLURM");
    expect_env("SLURM_STEP_ID=2 SLURM_PROCID=2 SLURM_NTASKS=4 SLURM_LOCALID=2 SLURM_STEP_NUM_NODES=1 "
               "SLURM_STEP_TASKS_PER_NODE=4",
               2, 4, 2, 4, "SLURM");
    expect_env("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2", 1, 2, 1, 2, "torchrun");
    expect_env("RANK=3 WORLD_SIZE=4", 3, 4, 3, 4, "torchrun");

    expect_error("LOOM_RANK=abc LOOM_WORLD_SIZE=2", "LOOM_RANK='abc'");
    expect_error("LOOM_RANK=1 LOOM_WORLD_SIZE=2x", "LOOM_WORLD_SIZE='2x'");
    expect_error("LOOM_RANK=-1 LOOM_WORLD_SIZE=2", "LOOM_RANK");
    expect_error("LOOM_RANK=4 LOOM_WORLD_SIZE=4", "LOOM_RANK=4 is not below LOOM_WORLD_SIZE=4");
    expect_error("LOOM_RANK=0 LOOM_WORLD_SIZE=0", "LOOM_WORLD_SIZE");
    expect_error("LOOM_RANK=1", "LOOM_WORLD_SIZE");
    expect_error("OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=2 "
                 "OMPI_COMM_WORLD_LOCAL_SIZE=2",
                 "OMPI_COMM_WORLD_LOCAL_RANK=2");
    expect_error("LOOM_RANK=1 LOOM_WORLD_SIZE=4 LOOM_LOCAL_SIZE=0", "LOOM_LOCAL_SIZE=0");
    expect_error("LOOM_RANK=1 LOOM_WORLD_SIZE=4 LOOM_LOCAL_RANK=4",
                 "LOOM_LOCAL_RANK=4 is not below LOOM_WORLD_SIZE=4");
    expect_error("SLURM_PROCID=x SLURM_NTASKS=2", "SLURM_PROCID");
    expect_error("RANK=1", "WORLD_SIZE");
    expect_error("RANK=2 WORLD_SIZE=2", "RANK=2 is not below WORLD_SIZE=2");
}

/* The conflict line for pairs, "" when there is none. */
static const char *conflict(const char *pairs)
{
    static loom_launch_env e;
    clear_env();
    set_env(pairs);
    int rc = loom_bootstrap_detect(&e);
    CHECK(rc == LOOM_OK, "%s: rc %d (%s)", pairs, rc, loom_last_error());
    return e.conflict;
}

/* Where the rank came from, and the launchers that disagree with it. */
static void sources(void)
{
    /* the allocation's shell and the batch script are one process each */
    expect_error("SLURM_JOB_ID=7 SLURM_NTASKS=2", "Slurm job 7's allocation (SLURM_NTASKS=2)");
    expect_error("SLURM_JOB_ID=7 SLURM_NTASKS=2", "srun -n 2");
    expect_error("SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=3", "not a task of a job step");
    expect_error("SLURM_JOB_ID=7 SLURM_STEP_ID=4294967291 SLURM_PROCID=0 SLURM_NTASKS=3",
                 "not a task of a job step");
    expect_env("SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=1", 0, 1, 0, 1, "SLURM");
    expect_env("SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2", 1, 2, 1, 2,
               "SLURM");

    loom_launch_env e;
    char text[128];
    clear_env();
    set_env("SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2");
    CHECK(loom_bootstrap_detect(&e) == LOOM_OK, "slurm step");
    loom_launch_env_describe(&e, text, sizeof text);
    CHECK(!strcmp(text, "2 from Slurm (SLURM_PROCID)"), "'%s'", text);
    clear_env();
    CHECK(loom_bootstrap_detect(&e) == LOOM_OK, "no launcher");
    loom_launch_env_describe(&e, text, sizeof text);
    CHECK(!strcmp(text, "1 (no launcher)"), "'%s'", text);

    const char *c = conflict("SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=1 RANK=1 WORLD_SIZE=2");
    CHECK(strstr(c, "Slurm says rank 0 of 1 (SLURM_PROCID, SLURM_NTASKS)") &&
              strstr(c, "torchrun says RANK=1 WORLD_SIZE=2"),
          "'%s'", c);
    c = conflict("LOOM_RANK=1 LOOM_WORLD_SIZE=2 WORLD_SIZE=4");
    CHECK(strstr(c, "RANK=unset WORLD_SIZE=4"), "'%s'", c);
    /* agreeing launchers, and Slurm's variables under mpirun, are not one */
    c = conflict("SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 PMI_RANK=1 PMI_SIZE=2");
    CHECK(!strcmp(c, "") && !strcmp(conflict("OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 "
                                             "SLURM_PROCID=0 SLURM_NTASKS=1"), ""),
          "'%s'", c);
}

static void first_host(void)
{
    static const char *const cases[][2] = {
        {"node[07-09,12],gpu3", "node07"}, {"n1,n2", "n1"},       {"solo", "solo"},
        {"rack[1-2]-n[01-04]", "rack1-n01"}, {"a-[3,5]-b", "a-3-b"}, {"[", ""},
        {"", ""},
    };
    char host[64];
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++) {
        int ok = loom_slurm_first_host(cases[i][0], host, sizeof host);
        CHECK(ok == (cases[i][1][0] != 0) && (!ok || !strcmp(host, cases[i][1])),
              "'%s' gave %d '%s'", cases[i][0], ok, host);
    }
}

static void format_ranks(void)
{
    char buf[256];
    int three[] = {0, 1, 3}, one[] = {2}, many[40];
    loom_format_ranks(buf, sizeof buf, three, 3);
    CHECK(!strcmp(buf, "ranks 0, 1, 3"), "'%s'", buf);
    loom_format_ranks(buf, sizeof buf, one, 1);
    CHECK(!strcmp(buf, "rank 2"), "'%s'", buf);
    for (int i = 0; i < 40; i++)
        many[i] = i;
    loom_format_ranks(buf, sizeof buf, many, 40);
    CHECK(strstr(buf, ", 31, ... (8 more)") != NULL, "'%s'", buf);
    loom_format_ranks(buf, 12, many, 40); /* truncated, still terminated */
    CHECK(strlen(buf) == 11, "'%s'", buf);
}

/* A world of one serves itself on any free port. */
static void world_of_one(void)
{
    clear_env();
    loom_launch_env e;
    loom_bootstrap_detect(&e);
    loom_store *s;
    int rc = loom_store_open(&e, 5.0, &s);
    CHECK(rc == LOOM_OK, "open a world of one");
    if (rc)
        return;
    char got[16];
    size_t len;
    int64_t v;
    CHECK(loom_store_put(s, "a", "xyz", 3) == LOOM_OK, "put");
    CHECK(loom_store_get(s, "a", got, sizeof got, &len, 1.0) == LOOM_OK && len == 3, "get");
    CHECK(loom_store_put(s, "empty", NULL, 0) == LOOM_OK, "put empty");
    CHECK(loom_store_get(s, "empty", got, sizeof got, &len, 1.0) == LOOM_OK && len == 0,
          "get empty");
    CHECK(loom_store_add(s, "n", 5, &v) == LOOM_OK && v == 5, "add");
    CHECK(loom_store_add(s, "n", -7, &v) == LOOM_OK && v == -2, "add negative");
    CHECK(loom_store_barrier(s, "b", 1.0) == LOOM_OK, "barrier");
    CHECK(loom_store_get(s, "none", got, sizeof got, &len, 0.0) == LOOM_ERR_TIMEOUT, "get now");
    loom_store_close(s);
}

/* The port from the job identity, read back from the unreachable-store
 * message. */
static int derived_port(const char *pairs)
{
    clear_env();
    set_env(pairs);
    loom_launch_env e = {.rank = 1, .world_size = 2, .local_rank = 1, .local_size = 2, .source = "test"};
    loom_store *s;
    int rc = loom_store_open(&e, 0.1, &s);
    CHECK(rc == LOOM_ERR_TIMEOUT, "%s: open gave %d", pairs, rc);
    const char *at = strstr(loom_last_error(), "127.0.0.1:");
    return at ? atoi(at + 10) : -1;
}

static void store_errors(void)
{
    loom_launch_env rank1 = {.rank = 1, .world_size = 2, .local_rank = 1, .local_size = 2,
                           .source = "test"};
    loom_launch_env rank0 = {.world_size = 2, .local_size = 2, .source = "test"};
    loom_store *s;
    char want[256];

    /* Nobody serves: the message names the address and what to do. */
    int port = free_port(0, NULL);
    clear_env();
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(want, sizeof want, "%d", port);
    setenv("MASTER_PORT", want, 1);
    uint64_t t0 = loom_now_ns();
    int rc = loom_store_open(&rank1, 0.5, &s);
    double took = (double)(loom_now_ns() - t0) / 1e9;
    snprintf(want, sizeof want,
             "bootstrap: could not reach the store at 127.0.0.1:%d served by rank 0 after 0.5 s "
             "(is rank 0 running? set MASTER_ADDR/MASTER_PORT)",
             port);
    CHECK(rc == LOOM_ERR_TIMEOUT && !strcmp(loom_last_error(), want), "rc %d, want '%s'", rc, want);
    CHECK(took >= 0.45 && took < 2.0, "giving up took %.2f s", took);

    /* The port is taken: rank 0 says which and what to set. */
    int busy_fd;
    port = free_port(1, &busy_fd);
    snprintf(want, sizeof want, "%d", port);
    setenv("MASTER_PORT", want, 1);
    rc = loom_store_open(&rank0, 0.5, &s);
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), want) &&
              strstr(loom_last_error(), "MASTER_PORT"),
          "bind failure: rc %d", rc);
    close(busy_fd);

    /* LOOM_STORE_* is the fallback; MASTER_* wins. */
    clear_env();
    setenv("LOOM_STORE_PORT", "1", 1);
    setenv("LOOM_STORE_ADDR", "127.0.0.1", 1);
    rc = loom_store_open(&rank1, 0.1, &s);
    CHECK(rc == LOOM_ERR_TIMEOUT && strstr(loom_last_error(), "127.0.0.1:1 "), "LOOM_STORE_PORT");
    setenv("MASTER_PORT", "2", 1);
    rc = loom_store_open(&rank1, 0.1, &s);
    CHECK(rc == LOOM_ERR_TIMEOUT && strstr(loom_last_error(), "127.0.0.1:2 "), "MASTER_PORT wins");
    setenv("MASTER_PORT", "http", 1);
    rc = loom_store_open(&rank1, 0.1, &s);
    CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), "MASTER_PORT='http'"), "bad port");

    /* Several machines and no address: said at once, not after a timeout. */
    clear_env();
    loom_launch_env spread = {.rank = 1, .world_size = 4, .local_rank = 1, .local_size = 2, .source = "test"};
    rc = loom_store_open(&spread, 10.0, &s);
    CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), "MASTER_ADDR"), "spread: rc %d", rc);

    /* A Slurm step over several nodes: the store is on the step's first
     * node (unresolvable here, so the message names it), and a rank 0
     * elsewhere says so. */
    loom_launch_env slurm1 = spread, slurm0 = spread;
    slurm1.source = slurm0.source = "SLURM";
    slurm0.rank = slurm0.local_rank = 0;
    clear_env();
    set_env("SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_STEP_NODELIST=nosuch-n[07-09],gpu3 "
            "SLURMD_NODENAME=nosuch-n08");
    rc = loom_store_open(&slurm1, 0.2, &s);
    CHECK(rc != LOOM_OK && strstr(loom_last_error(), "'nosuch-n07'"), "slurm host: rc %d: %s", rc,
          loom_last_error());
    /* and what looks for rank 0's node later finds it as MASTER_ADDR */
    CHECK(getenv("MASTER_ADDR") && !strcmp(getenv("MASTER_ADDR"), "nosuch-n07"), "MASTER_ADDR");
    unsetenv("MASTER_ADDR");
    rc = loom_store_open(&slurm0, 0.2, &s);
    CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), "rank 0 runs on nosuch-n08, not on "
                                                              "the step's first node nosuch-n07"),
          "slurm rank 0: rc %d: %s", rc, loom_last_error());

    /* The port follows the job identity. */
    int a = derived_port("PMIX_NAMESPACE=job-a");
    int a2 = derived_port("PMIX_NAMESPACE=job-a OMPI_MCA_orte_ess_jobid=9");
    int b = derived_port("PMIX_NAMESPACE=job-b");
    int c = derived_port("OMPI_MCA_orte_ess_jobid=12345");
    int d = derived_port("SLURM_JOB_ID=77 SLURM_STEP_ID=0");
    int d2 = derived_port("SLURM_JOB_ID=77 SLURM_STEP_ID=1");
    int none = derived_port("");
    CHECK(a >= 20000 && a < 32000 && a == a2, "pmix port %d %d", a, a2);
    CHECK(b >= 20000 && b < 32000 && b != a, "another namespace: %d", b);
    CHECK(c >= 20000 && c < 32000 && d >= 20000 && d < 32000 && d != d2, "ports %d %d %d", c, d,
          d2);
    CHECK(none == 29500, "no job identity: %d", none);

    /* A store of another job on that port is refused, not joined. */
    clear_env();
    setenv("PMIX_NAMESPACE", "job-a", 1);
    port = free_port(0, NULL);
    snprintf(want, sizeof want, "%d", port);
    setenv("MASTER_PORT", want, 1);
    loom_store *server;
    rc = loom_store_open(&rank0, 0.5, &server);
    CHECK(rc == LOOM_OK, "serve job-a");
    if (rc == LOOM_OK) {
        setenv("PMIX_NAMESPACE", "job-b", 1);
        rc = loom_store_open(&rank1, 2.0, &s);
        CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), "belongs to another job"),
              "other job: rc %d", rc);
        loom_store_close(server); /* waits 0.5 s for the rank 1 that never came */
    }
}

int main(void)
{
    detect();
    sources();
    first_host();
    format_ranks();
    world_of_one();
    store_errors();
    clear_env();
    if (failures) {
        fprintf(stderr, "detect_test: %d checks failed\n", failures);
        return 1;
    }
    printf("detect_test: ok\n");
    return 0;
}
