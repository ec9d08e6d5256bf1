/* `loom plugins [CONFIG]`: every plugin on the search path and whether it
 * loads. `loom plugins --check FILE`: the conformance checks for plugin
 * authors, one line per check, exit 1 on any failure; with --train CONFIG,
 * then the numerics harness (cli/plugin_harness.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/memtier.h"
#include "loom/plugin.h"
#include "loom/schedule.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "cli/commands.h"
#include "cli/plugin_harness.h"
#include "cli/plugin_rows.h"
#include "runtime/bootstrap.h"
#include "runtime/config.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "train/schedule.h"

static void plugins_usage(FILE *f)
{
    fprintf(f, "usage: loom plugins [CONFIG] [--set path=value ...]\n"
               "       loom plugins --check FILE [--set path=value ...] [--train CONFIG "
               "[--ranks 1,2,4]\n"
               "                                  [--keep DIR] [--timeout S]\n"
               "                                  [--tolerance REL] [--reference NAME]]\n"
               "  --timeout S  each training run of --train is stopped after S seconds "
               "(default 600)\n");
}

static int list_plugins(const char *config_path, const char *const *overrides, int noverrides)
{
    loom_config *cfg = NULL;
    if (config_path || noverrides) {
        if (loom_config_load(config_path, overrides, noverrides, &cfg) != LOOM_OK) {
            loom_log(LOOM_LOG_ERROR, "%s", loom_last_error());
            return 2;
        }
    }
    loom_search_path sp;
    if (loom_search_path_init(&sp, cfg) != LOOM_OK) {
        loom_log(LOOM_LOG_ERROR, "%s", loom_last_error());
        loom_config_free(cfg);
        return 2;
    }
    plugin_rows_print_search_path(&sp);
    row_list rows = {0};
    int rc = plugin_rows_list(&sp, &rows);
    if (rc != LOOM_OK)
        loom_log(LOOM_LOG_ERROR, "%s", loom_last_error());
    else if (rows.count == 0)
        printf("no plugin files (libloom-<kind>-<name>.so) in the search path\n");
    else
        plugin_rows_print(&rows);
    plugin_rows_free(&rows);
    loom_search_path_free(&sp);
    loom_config_free(cfg);
    return rc == LOOM_OK ? 0 : 2;
}

/* ------------------------------------------------------------- --check */

typedef struct checker {
    int failures;
} checker;

static void report_check(void *ctx, const char *check, const char *failure)
{
    checker *c = ctx;
    if (failure) {
        printf("FAIL %s: %s\n", check, failure);
        c->failures++;
    } else {
        printf("ok   %s\n", check);
    }
    fflush(stdout);
}

static void fail_check(checker *c, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_check(checker *c, const char *check, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    report_check(c, check, why);
}

/* A failed plugin call: its status and the detail it recorded. */
static void fail_status(checker *c, const char *check, const char *call, int rc)
{
    const char *detail = loom_last_error();
    fail_check(c, check, "%s returned %d (%s)%s%s", call, rc, loom_status_string(rc),
               detail[0] ? ": " : "", detail);
    loom_clear_error();
}

/* A call whose status is the whole check. */
static void check_status(checker *c, const char *check, const char *call, int rc)
{
    if (rc != LOOM_OK)
        fail_status(c, check, call, rc);
    else
        report_check(c, check, NULL);
}

/* A call that makes something (a communicator, a tier, a block): passed
 * only with status ok and the thing made. */
static int check_made(checker *c, const char *call, int rc, const void *made, const char *what)
{
    if (rc == LOOM_OK && !made)
        fail_check(c, call, "returned ok but no %s", what);
    else
        check_status(c, call, call, rc);
    return rc == LOOM_OK && made;
}

/* ---- functional checks, in a world of one ---- */

#define CHECK_COUNT 8

/* Complete a posted op: test once (it must not block), then wait. Call it
 * after the post, never around it: req is set by the post. */
static int finish(const loom_comm_ops *vt, int rc, loom_comm_request *req)
{
    if (rc == LOOM_OK && req && (rc = vt->test(req)) == LOOM_IN_PROGRESS)
        rc = vt->wait(req);
    return rc;
}

static int same_floats(const float *a, const float *b, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            *bad = i;
            return 0;
        }
    }
    return 1;
}

static void fill(float *x, size_t n, float base)
{
    for (size_t i = 0; i < n; i++)
        x[i] = base + 0.5f * (float)i;
}

/* A call that moves data: its status, then what landed in got (named
 * got_name in the message; note ends it). */
static void check_floats(checker *c, const char *check, const char *call, int rc,
                         const float *got, const float *want, const char *got_name,
                         const char *note)
{
    size_t bad = 0;
    if (rc != LOOM_OK)
        fail_status(c, check, call, rc);
    else if (!same_floats(got, want, CHECK_COUNT, &bad))
        fail_check(c, check, "%s[%zu] = %g, want %g%s", got_name, bad, (double)got[bad],
                   (double)want[bad], note);
    else
        report_check(c, check, NULL);
}

/* One collective whose size-1 answer is its input: run it on send/recv and
 * compare. which: 0 allreduce, 1 reduce, 2 allgather, 3 reducescatter,
 * 4 alltoall. */
static void check_copy_collective(checker *c, const loom_comm_ops *vt, loom_comm *comm,
                                  int which, loom_redop op, const char *check)
{
    float send[CHECK_COUNT], recv[CHECK_COUNT];
    fill(send, CHECK_COUNT, 1.0f + (float)which);
    for (int i = 0; i < CHECK_COUNT; i++)
        recv[i] = -1.0f;
    loom_comm_request *req = NULL;
    int rc;
    const char *call;
    switch (which) {
    case 0:
        call = "allreduce";
        rc = vt->allreduce(comm, send, recv, CHECK_COUNT, LOOM_F32, op, &req);
        break;
    case 1:
        call = "reduce";
        rc = vt->reduce(comm, send, recv, CHECK_COUNT, LOOM_F32, op, 0, &req);
        break;
    case 2:
        call = "allgather";
        rc = vt->allgather(comm, send, recv, CHECK_COUNT, LOOM_F32, &req);
        break;
    case 3:
        call = "reducescatter";
        rc = vt->reducescatter(comm, send, recv, CHECK_COUNT, LOOM_F32, op, &req);
        break;
    default:
        call = "alltoall";
        rc = vt->alltoall(comm, send, recv, CHECK_COUNT, LOOM_F32, &req);
        break;
    }
    check_floats(c, check, call, finish(vt, rc, req), recv, send, "recv",
                 " (a communicator of one rank gives back its input)");
}

static void check_comm_instance(checker *c, const loom_comm_ops *vt, loom_comm *comm,
                                const char *what)
{
    char check[96];
    int rank = vt->rank(comm), size = vt->size(comm);
    snprintf(check, sizeof check, "%s rank and size", what);
    if (rank != 0 || size != 1)
        fail_check(c, check, "rank() = %d, size() = %d; want 0 and 1 in a world of one", rank,
                   size);
    else
        report_check(c, check, NULL);
}

static void check_comm_functional(checker *c, loom_runtime *rt, const loom_plugin *p,
                                  const loom_host *host)
{
    const loom_comm_ops *vt = &p->ops.comm;
    loom_comm *comm = NULL;
    int rc = vt->create_world(host, &comm);
    if (!check_made(c, "create_world", rc, comm, "communicator"))
        return;
    /* a wrapper's kinds are those of the backend its create_world opened */
    uint32_t kinds = 0;
    if (vt->mem_kinds == LOOM_MEM_KINDS_INNER) {
        if (loom_runtime_comm_mem_kinds(rt, p, &kinds) != LOOM_OK) {
            fail_check(c, "mem_kinds", "%s", loom_last_error());
            vt->destroy(comm);
            return;
        }
        report_check(c, "mem_kinds", NULL);
        if (!(kinds & LOOM_MEM_BIT(LOOM_MEM_HOST))) {
            printf("note: functional checks skipped: they move host buffers, and the backend %s "
                   "opened takes device memory only\n", p->header->name);
            vt->destroy(comm);
            return;
        }
    }
    check_comm_instance(c, vt, comm, "world");

    for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
        char check[64];
        snprintf(check, sizeof check, "allreduce f32 %s", loom_redop_name((loom_redop)op));
        check_copy_collective(c, vt, comm, 0, (loom_redop)op, check);
    }

    /* in place: send == recv */
    float buf[CHECK_COUNT], want[CHECK_COUNT];
    fill(buf, CHECK_COUNT, 3.0f);
    memcpy(want, buf, sizeof buf);
    loom_comm_request *req = NULL;
    rc = vt->allreduce(comm, buf, buf, CHECK_COUNT, LOOM_F32, LOOM_SUM, &req);
    check_floats(c, "allreduce in place", "allreduce", finish(vt, rc, req), buf, want, "buf", "");

    req = NULL;
    rc = vt->allreduce(comm, buf, buf, 0, LOOM_F32, LOOM_SUM, &req);
    check_status(c, "allreduce of zero elements", "allreduce", finish(vt, rc, req));

    req = NULL;
    rc = vt->broadcast(comm, buf, CHECK_COUNT, LOOM_F32, 0, &req);
    check_floats(c, "broadcast", "broadcast", finish(vt, rc, req), buf, want, "buf",
                 " (root 0 keeps its data)");

    check_copy_collective(c, vt, comm, 1, LOOM_SUM, "reduce f32 sum");
    check_copy_collective(c, vt, comm, 2, LOOM_SUM, "allgather");
    check_copy_collective(c, vt, comm, 3, LOOM_SUM, "reducescatter f32 sum");
    check_copy_collective(c, vt, comm, 4, LOOM_SUM, "alltoall");

    /* Send to self is optional in a world of one: a backend may say
     * LOOM_ERR_NOT_SUPPORTED at post time, and --check notes it. */
    float out[CHECK_COUNT], in[CHECK_COUNT];
    fill(out, CHECK_COUNT, 7.0f);
    memset(in, 0, sizeof in);
    loom_comm_request *sreq = NULL, *rreq = NULL;
    rc = vt->send(comm, out, CHECK_COUNT, LOOM_F32, 0, 5, &sreq);
    if (rc == LOOM_ERR_NOT_SUPPORTED) {
        printf("skip send/recv to self: the backend does not support it (optional)\n");
        loom_clear_error();
    } else if (rc != LOOM_OK) {
        fail_status(c, "send/recv to self", "send", rc);
    } else {
        int rrc = vt->recv(comm, in, CHECK_COUNT, LOOM_F32, 0, 5, &rreq);
        rc = finish(vt, LOOM_OK, sreq);
        rrc = finish(vt, rrc, rreq);
        if (rc != LOOM_OK)
            fail_status(c, "send/recv to self", "send", rc);
        else
            check_floats(c, "send/recv to self", "recv", rrc, in, out, "received", "");
    }

    req = NULL;
    rc = vt->barrier(comm, &req);
    check_status(c, "barrier", "barrier", finish(vt, rc, req));

    /* A subgroup of the one rank there is. */
    loom_comm *sub = NULL;
    int ranks[1] = {0};
    rc = vt->create_subgroup(comm, ranks, 1, &sub);
    if (check_made(c, "create_subgroup", rc, sub, "communicator")) {
        check_comm_instance(c, vt, sub, "subgroup");
        check_copy_collective(c, vt, sub, 0, LOOM_SUM, "subgroup allreduce");
        check_status(c, "subgroup destroy", "destroy", vt->destroy(sub));
    }
    check_status(c, "destroy", "destroy", vt->destroy(comm));
}

static int finish_tier(const loom_memtier_ops *vt, int rc, loom_tier_request *req)
{
    if (rc == LOOM_OK && req && (rc = vt->test(req)) == LOOM_IN_PROGRESS)
        rc = vt->wait(req);
    return rc;
}

/* Big enough to cross a page and an odd offset, small enough to be quick;
 * it moves in two parts that meet at an unaligned offset. */
enum { TIER_CHECK_BYTES = 3 * 4096 + 100, TIER_CHECK_CUT = 4096 + 33 };

/* Write buf into block (writing), or read block into buf, in two parts. */
static int tier_move(const loom_memtier_ops *vt, loom_memtier *tier, loom_tier_block *block,
                     unsigned char *buf, int writing)
{
    int rc = LOOM_OK;
    for (int part = 0; part < 2 && rc == LOOM_OK; part++) {
        size_t offset = part ? TIER_CHECK_CUT : 0;
        size_t bytes = part ? TIER_CHECK_BYTES - TIER_CHECK_CUT : TIER_CHECK_CUT;
        loom_tier_request *req = NULL;
        rc = writing ? vt->write(tier, block, offset, buf + offset, bytes, &req)
                     : vt->read(tier, block, offset, buf + offset, bytes, &req);
        rc = finish_tier(vt, rc, req);
    }
    return rc;
}

static void check_memtier_functional(checker *c, const loom_memtier_ops *vt,
                                     const loom_host *host)
{
    loom_memtier *tier = NULL;
    int rc = vt->create(host, &tier);
    if (!check_made(c, "create", rc, tier, "tier"))
        return;

    uint64_t total = 0, avail = 0;
    rc = vt->capacity(tier, &total, &avail);
    if (rc != LOOM_OK)
        fail_status(c, "capacity", "capacity", rc);
    else if (total == 0 || avail > total)
        fail_check(c, "capacity", "total %llu, available %llu: want 0 < available <= total",
                   (unsigned long long)total, (unsigned long long)avail);
    else
        report_check(c, "capacity", NULL);

    unsigned char *src = malloc(TIER_CHECK_BYTES), *dst = malloc(TIER_CHECK_BYTES);
    loom_tier_block *block = NULL;
    if (!src || !dst) {
        fail_check(c, "alloc", "out of host memory for the check itself");
        goto out;
    }
    for (size_t i = 0; i < TIER_CHECK_BYTES; i++)
        src[i] = (unsigned char)(i * 131u + 7u);
    memset(dst, 0, TIER_CHECK_BYTES);
    rc = vt->alloc(tier, TIER_CHECK_BYTES, 64, &block);
    if (!check_made(c, "alloc", rc, block, "block"))
        goto out;

    rc = tier_move(vt, tier, block, src, 1);
    if (rc != LOOM_OK) {
        fail_status(c, "write", "write", rc);
    } else {
        report_check(c, "write", NULL);
        rc = tier_move(vt, tier, block, dst, 0);
        if (rc != LOOM_OK) {
            fail_status(c, "read back", "read", rc);
        } else {
            size_t i = 0;
            while (i < TIER_CHECK_BYTES && src[i] == dst[i])
                i++;
            if (i < TIER_CHECK_BYTES)
                fail_check(c, "read back", "byte %zu reads %u, %u was written", i, dst[i],
                           src[i]);
            else
                report_check(c, "read back", NULL);
        }
    }
    if ((vt->flags & LOOM_TIER_HOST_ADDRESSABLE) && vt->address) {
        const unsigned char *a = vt->address(block);
        if (!a)
            fail_check(c, "address", "NULL for a host-addressable tier");
        else if (memcmp(a, src, TIER_CHECK_BYTES))
            fail_check(c, "address", "the block's memory differs from what was written");
        else
            report_check(c, "address", NULL);
    }
    check_status(c, "free", "free", vt->free(tier, block));
out:
    free(src);
    free(dst);
    check_status(c, "destroy", "destroy", vt->destroy(tier));
}

static int append_action(void *builder, int pp_rank, loom_action action)
{
    return loom_schedule_append(builder, pp_rank, action);
}

/* A schedule's lists for a few shapes, each validated as the trainer
 * would before its first step. A shape the schedule refuses (one it does
 * not serve) is a note; lists the validator refuses are a failure. */
static void check_schedule_functional(checker *c, const loom_plugin *p, const loom_host *host)
{
    static const int shapes[][3] = {{2, 1, 2}, {2, 1, 4}, {3, 1, 3}, {4, 1, 8}, {2, 2, 4},
                                    {4, 2, 8}};
    int built = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(shapes); i++) {
        int stages = shapes[i][0], virtual_stages = shapes[i][1], micro = shapes[i][2];
        char check[96];
        snprintf(check, sizeof check, "lists for p = %d, v = %d, m = %d", stages, virtual_stages,
                 micro);
        loom_schedule s;
        if (loom_schedule_init(&s, p->header->name, stages, virtual_stages, micro) != LOOM_OK) {
            fail_status(c, check, "loom_schedule_init", LOOM_ERR_NO_MEMORY);
            continue;
        }
        loom_pipeline_shape shape = {.stages = stages, .virtual_stages = virtual_stages,
                                     .microbatches = micro, .builder = &s,
                                     .emit = append_action};
        loom_clear_error();
        int rc = loom_plugin_schedule_build(p, host, &shape);
        if (rc != LOOM_OK) {
            printf("note: %s: refused by the schedule: %s\n", check,
                   *loom_last_error() ? loom_last_error() : "(it said nothing)");
            loom_clear_error();
        } else if ((rc = loom_schedule_validate(&s)) != LOOM_OK) {
            fail_status(c, check, "the validator", rc);
        } else {
            report_check(c, check, NULL);
            built++;
        }
        loom_schedule_free(&s);
    }
    if (!built)
        fail_check(c, "lists", "the schedule refused every shape tried");
}

/* The runtime's host table for the plugin, in a world of one, then the
 * checks of its kind. Strategies need a mesh and a model to do anything;
 * they get the load checks only. */
static void check_functional(checker *c, const loom_plugin *p, const char *const *overrides,
                             int noverrides)
{
    if (p->kind == LOOM_PLUGIN_STRATEGY) {
        printf("note: a strategy's functional check needs a mesh and a model: --train CONFIG "
               "trains one with it at several rank counts\n");
        return;
    }
    if (p->kind == LOOM_PLUGIN_COMM && p->ops.comm.mem_kinds != LOOM_MEM_KINDS_INNER &&
        !(p->ops.comm.mem_kinds & LOOM_MEM_BIT(LOOM_MEM_HOST))) {
        printf("note: functional checks skipped: they move host buffers, and %s takes device "
               "memory only (its own tests run on a GPU)\n", p->header->name);
        return;
    }
    loom_launch_env env;
    if (loom_bootstrap_detect(&env) == LOOM_OK && env.world_size > 1) {
        printf("note: functional checks skipped: they run in a world of one, and the "
               "environment says rank %d of %d (%s); run --check outside a launcher\n",
               env.rank, env.world_size, env.source);
        return;
    }
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    const loom_host *host = NULL;
    char settings[192];
    loom_plugin_settings_group(p, settings, sizeof settings);
    if (loom_config_load(NULL, overrides, noverrides, &cfg) != LOOM_OK) {
        fail_check(c, "host", "cannot make a config: %s", loom_last_error());
        return;
    }
    if (loom_runtime_create(cfg, &rt) != LOOM_OK) {
        fail_check(c, "host", "cannot start a runtime: %s", loom_last_error());
        loom_config_free(cfg);
        return;
    }
    if (loom_runtime_host(rt, p, settings, &host) != LOOM_OK) {
        fail_check(c, "host", "settings of %s: %s", settings, loom_last_error());
    } else {
        report_check(c, "host", NULL);
        if (p->kind == LOOM_PLUGIN_COMM)
            check_comm_functional(c, rt, p, host);
        else if (p->kind == LOOM_PLUGIN_SCHEDULE)
            check_schedule_functional(c, p, host);
        else if (p->kind == LOOM_PLUGIN_COMPUTE)
            loom_compute_check(p, host, report_check, c);
        else
            check_memtier_functional(c, &p->ops.memtier, host);
    }
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
}

/* In the child of check_in_child: written once the plugin has loaded. */
static int loaded_fd = -1;

/* harness: NULL for the conformance checks alone. */
static int check_plugin_file(const char *file, const char *const *overrides, int noverrides,
                             const loom_harness_options *harness)
{
    /* dlopen reads a bare name as a library to search for; we mean the file. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s%s", strchr(file, '/') ? "" : "./", file);

    char kind_text[32], name[128];
    uint32_t kind = 0;
    if (loom_plugin_parse_file_name(path, kind_text, sizeof kind_text, name, sizeof name))
        kind = loom_plugin_kind_of(kind_text);
    if (!kind)
        kind = loom_plugin_kind_in_file(path);
    if (!kind)
        kind = LOOM_PLUGIN_COMM; /* any kind: the load says what the file lacks */
    printf("checking %s as a %s plugin\n", path, loom_plugin_kind_name(kind));

    checker c = {0};
    loom_plugin_checks checks = {report_check, &c, 0, ""};
    loom_plugin *p = NULL;
    if (loom_plugin_load_file(path, (loom_plugin_kind)kind, NULL, &checks, &p) != LOOM_OK) {
        printf("1 check failed: loom refuses to load this plugin\n");
        return 1;
    }
    if (loaded_fd >= 0 && write(loaded_fd, "L", 1) != 1)
        loaded_fd = -1;
    if (p->kind == LOOM_PLUGIN_STRATEGY && p->ops.strategy.axis == LOOM_AXIS_PP) {
        /* the same file again, as the trainer loads it: through the adapter */
        printf("note: a pipeline schedule built as a strategy (before loom ABI 1.8): loom loads "
               "it as a schedule through an adapter; rebuild it against loom/schedule.h\n");
        loom_plugin *schedule = NULL;
        if (loom_plugin_load_file(path, LOOM_PLUGIN_SCHEDULE, NULL, NULL, &schedule) != LOOM_OK) {
            fail_check(&c, "adapter", "%s", loom_last_error());
        } else {
            report_check(&c, "adapter", NULL);
            loom_plugin_unload(p);
            p = schedule;
        }
    }
    printf("optional ops provided:");
    int nprovided = 0;
    for (int op = 0; op < LOOM_OPTIONAL_COUNT; op++)
        if (loom_plugin_provides(p, (loom_optional_op)op))
            printf("%s %s", nprovided++ ? "," : "", loom_optional_op_name((loom_optional_op)op));
    printf("%s\n", nprovided ? "" : " none");
    check_functional(&c, p, overrides, noverrides);
    if (c.failures)
        printf("%d check%s failed\n", c.failures, c.failures > 1 ? "s" : "");
    else
        printf("all checks passed\n");
    int rc = c.failures ? 1 : 0;
    if (harness && c.failures)
        printf("numerics not checked: the plugin must pass the checks above first\n");
    else if (harness)
        rc = loom_plugin_harness(p, harness);
    loom_plugin_unload(p);
    return rc;
}

/* Loading a library runs the dynamic loader on its bytes and then its
 * constructors, and a corrupt one can crash either (SIGSEGV, or an ld.so
 * assertion that exits 127) with nothing said of which file it was. So the
 * checks run in a child, and this process, which never loads the plugin,
 * says what became of it. The child's stderr passes through here so the
 * dynamic loader's last word can be repeated in that line. */
static int check_in_child(const char *file, const char *const *overrides, int noverrides,
                          const loom_harness_options *harness)
{
    int err[2], state[2];
    if (pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "loom plugins: cannot check %s: pipe: %s\n", file, strerror(errno));
        return 2;
    }
    if (pipe2(state, O_CLOEXEC) != 0) {
        fprintf(stderr, "loom plugins: cannot check %s: pipe: %s\n", file, strerror(errno));
        close(err[0]);
        close(err[1]);
        return 2;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(err[0]);
        close(state[0]);
        dup2(err[1], STDERR_FILENO); /* dup2 clears close-on-exec: the runs inherit it */
        close(err[1]);
        setvbuf(stdout, NULL, _IOLBF, 0);
        loom_plugin_quiet_load_crashes();
        loaded_fd = state[1];
        int rc = check_plugin_file(file, overrides, noverrides, harness);
        fflush(NULL);
        _exit(rc);
    }
    close(err[1]);
    close(state[1]);
    if (pid < 0) {
        fprintf(stderr, "loom plugins: cannot check %s: fork: %s\n", file, strerror(errno));
        close(err[0]);
        close(state[0]);
        return 2;
    }
    char buf[4096], last[512] = "", line[512] = "";
    size_t used = 0;
    for (ssize_t n; (n = read(err[0], buf, sizeof buf)) != 0;) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        fwrite(buf, 1, (size_t)n, stderr);
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') {
                if (used + 1 < sizeof line)
                    line[used++] = buf[i];
                continue;
            }
            line[used] = '\0';
            if (used)
                snprintf(last, sizeof last, "%s", line);
            used = 0;
        }
    }
    line[used] = '\0';
    if (used)
        snprintf(last, sizeof last, "%s", line);
    close(err[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    char loaded = 0;
    if (read(state[0], &loaded, 1) != 1)
        loaded = 0;
    close(state[0]);
    fflush(stdout);
    const char *when = loaded ? "crashed in its checks, after loading" : "crashed while loading";
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "loom plugins: plugin %s %s: signal %d (%s)\n", file, when,
                WTERMSIG(status), strsignal(WTERMSIG(status)));
        return 1;
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (rc > 2) {
        fprintf(stderr, "loom plugins: plugin %s %s: exit status %d%s%s\n", file, when, rc,
                last[0] ? ": " : "", last);
        return 1;
    }
    return rc;
}

/* The value of an option that takes one, or NULL after a usage line. */
static const char *option_value(int argc, char **argv, int *i)
{
    if (*i + 1 < argc)
        return argv[++*i];
    fprintf(stderr, "loom plugins: %s needs a value\n", argv[*i]);
    plugins_usage(stderr);
    return NULL;
}

int loom_cmd_plugins(int argc, char **argv)
{
    const char *config_path = NULL, *check = NULL, *timeout = NULL, *tolerance = NULL;
    loom_harness_options harness = {0};
    const char **overrides = calloc((size_t)argc, sizeof *overrides);
    int noverrides = 0;
    if (!overrides)
        return 2;
    int rc = -1;
    for (int i = 1; i < argc && rc < 0; i++) {
        const char *a = argv[i], **value = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            plugins_usage(stdout);
            rc = 0;
        } else if (!strcmp(a, "--check")) {
            value = &check;
        } else if (!strcmp(a, "--train")) {
            value = &harness.config;
        } else if (!strcmp(a, "--ranks")) {
            value = &harness.ranks;
        } else if (!strcmp(a, "--keep")) {
            value = &harness.keep;
        } else if (!strcmp(a, "--timeout")) {
            value = &timeout;
        } else if (!strcmp(a, "--tolerance")) {
            value = &tolerance;
        } else if (!strcmp(a, "--reference")) {
            value = &harness.reference;
        } else if (!strcmp(a, "--set")) {
            value = &overrides[noverrides++];
        } else if (!strncmp(a, "--set=", 6)) {
            overrides[noverrides++] = a + 6;
        } else if (a[0] == '-' || config_path) {
            plugins_usage(stderr);
            rc = 2;
        } else {
            config_path = a;
        }
        if (value && !(*value = option_value(argc, argv, &i)))
            rc = 2;
    }
    if (rc < 0 && timeout) {
        char *end;
        harness.timeout_s = strtod(timeout, &end);
        if (end == timeout || *end || !(harness.timeout_s > 0)) {
            fprintf(stderr, "loom plugins: --timeout '%s': want seconds > 0 per run\n", timeout);
            rc = 2;
        }
    }
    if (rc < 0 && tolerance) {
        char *end;
        harness.tolerance = strtod(tolerance, &end);
        if (end == tolerance || *end || !(harness.tolerance > 0) || isinf(harness.tolerance)) {
            fprintf(stderr, "loom plugins: --tolerance '%s': want the relative drift of the "
                            "loss to allow at each step, a number > 0, e.g. 0.05\n", tolerance);
            rc = 2;
        }
    }
    int harness_only =
        harness.ranks || harness.keep || timeout || tolerance || harness.reference;
    if (rc < 0 && (config_path && check)) {
        fprintf(stderr, "loom plugins: --check FILE takes its config as --train CONFIG\n");
        rc = 2;
    } else if (rc < 0 && (harness.config || harness_only) && !check) {
        fprintf(stderr, "loom plugins: --train, --ranks, --keep, --timeout, --tolerance and "
                        "--reference go with --check FILE\n");
        rc = 2;
    } else if (rc < 0 && harness_only && !harness.config) {
        fprintf(stderr, "loom plugins: --ranks, --keep, --timeout, --tolerance and --reference "
                        "go with --train CONFIG\n");
        rc = 2;
    }
    if (rc < 0 && check) {
        harness.overrides = overrides;
        harness.noverrides = noverrides;
        rc = check_in_child(check, overrides, noverrides, harness.config ? &harness : NULL);
    }
    if (rc < 0)
        rc = list_plugins(config_path, overrides, noverrides);
    free(overrides);
    return rc;
}
