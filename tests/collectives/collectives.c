/* Every collective of one backend against a serial reference, for every
 * dtype and reduction, at whatever rank count it is launched with:
 *
 *   collectives BACKEND [--set path=value ...]
 *                                        the whole suite; exit 0 when right
 *                                        (--set forces e.g. an algorithm)
 *   collectives BACKEND --straggler R    rank R never joins an allreduce; the
 *                                        others must time out naming it, on
 *                                        time (comm.timeout_s = 3)
 *
 * Inputs are small integers, exact in every dtype, so each expected value
 * is computed in double and rounded through the dtype exactly as a correct
 * result is; results are compared bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "rank_check.h"

static const loom_comm_api *C = &loom_core_comm_api;

static double value(int rank, size_t i) { return (double)((rank * 3 + (int)(i % 97) * 5) % 9 + 1); }

static void put(void *buf, loom_dtype t, size_t i, double v)
{
    switch (t) {
    case LOOM_F32: ((float *)buf)[i] = (float)v; break;
    case LOOM_BF16: ((uint16_t *)buf)[i] = loom_f32_to_bf16((float)v); break;
    case LOOM_F16: ((uint16_t *)buf)[i] = loom_f32_to_f16((float)v); break;
    case LOOM_F64: ((double *)buf)[i] = v; break;
    case LOOM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LOOM_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: abort();
    }
}

static double reference(loom_redop op, loom_dtype t, int n, size_t i)
{
    double acc = value(0, i);
    for (int r = 1; r < n; r++) {
        double v = value(r, i);
        if (op == LOOM_MAX)
            acc = v > acc ? v : acc;
        else if (op == LOOM_MIN)
            acc = v < acc ? v : acc;
        else
            acc += v;
    }
    if (op == LOOM_AVG)
        acc = loom_dtype_is_float(t) ? (t == LOOM_F64 ? acc / n : (double)((float)acc / (float)n))
                                     : (double)((int64_t)acc / n);
    return acc;
}

static int same(const void *buf, loom_dtype t, size_t i, double expected)
{
    size_t es = loom_dtype_size(t);
    uint64_t want = 0, got = 0;
    put(&want, t, 0, expected);
    memcpy(&got, (const char *)buf + i * es, es);
    return want == got;
}

static void *alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        abort();
    memset(p, 0xee, bytes);
    return p;
}

static void run(loom_request *req) { OK(C->wait(req)); }

static void test_reductions(loom_group *g, loom_dtype t, loom_redop op, size_t count)
{
    int rank = C->rank(g), n = C->size(g);
    size_t es = loom_dtype_size(t);
    const char *what = loom_dtype_name(t), *how = loom_redop_name(op);
    unsigned char *send = alloc(count * n * es), *recv = alloc(count * n * es);
    loom_request *req;

    /* allreduce, out of place then in place */
    for (size_t i = 0; i < count; i++)
        put(send, t, i, value(rank, i));
    OK(C->allreduce(g, send, recv, count, t, op, &req));
    run(req);
    for (size_t i = 0; i < count; i++)
        CHECK(same(recv, t, i, reference(op, t, n, i)), "allreduce %s %s count %zu at %zu", what, how, count, i);
    OK(C->allreduce(g, send, send, count, t, op, &req));
    run(req);
    for (size_t i = 0; i < count; i++)
        CHECK(same(send, t, i, reference(op, t, n, i)), "in-place allreduce %s %s count %zu at %zu", what, how, count, i);

    /* reduce to the last rank (a root other than 0) */
    int root = n - 1;
    for (size_t i = 0; i < count; i++)
        put(send, t, i, value(rank, i));
    memset(recv, 0xee, count * es);
    OK(C->reduce(g, send, recv, count, t, op, root, &req));
    run(req);
    if (rank == root)
        for (size_t i = 0; i < count; i++)
            CHECK(same(recv, t, i, reference(op, t, n, i)), "reduce %s %s count %zu at %zu", what, how, count, i);

    /* reduce-scatter: rank r gets the reduction of block r */
    for (size_t i = 0; i < count * n; i++)
        put(send, t, i, value(rank, i));
    memset(recv, 0xee, count * es);
    OK(C->reducescatter(g, send, recv, count, t, op, &req));
    run(req);
    for (size_t i = 0; i < count; i++)
        CHECK(same(recv, t, i, reference(op, t, n, (size_t)rank * count + i)),
              "reducescatter %s %s count %zu at %zu", what, how, count, i);
    free(send);
    free(recv);
}

static void test_movement(loom_group *g, loom_dtype t, size_t count)
{
    int rank = C->rank(g), n = C->size(g);
    size_t es = loom_dtype_size(t);
    const char *what = loom_dtype_name(t);
    unsigned char *send = alloc(count * n * es), *recv = alloc(count * n * es);
    loom_request *req;

    /* broadcast from rank 1 % n */
    int root = 1 % n;
    for (size_t i = 0; i < count; i++)
        put(recv, t, i, rank == root ? value(root, i) : 0);
    OK(C->broadcast(g, recv, count, t, root, &req));
    run(req);
    for (size_t i = 0; i < count; i++)
        CHECK(same(recv, t, i, value(root, i)), "broadcast %s count %zu at %zu", what, count, i);

    /* allgather, out of place then in place */
    for (size_t i = 0; i < count; i++)
        put(send, t, i, value(rank, i));
    OK(C->allgather(g, send, recv, count, t, &req));
    run(req);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            CHECK(same(recv, t, r * count + i, value(r, i)), "allgather %s count %zu block %d at %zu", what, count, r, i);
    memset(recv, 0xee, count * n * es);
    for (size_t i = 0; i < count; i++)
        put(recv + (size_t)rank * count * es, t, i, value(rank, i));
    OK(C->allgather(g, recv + (size_t)rank * count * es, recv, count, t, &req));
    run(req);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            CHECK(same(recv, t, r * count + i, value(r, i)), "in-place allgather %s count %zu block %d at %zu", what, count, r, i);

    /* alltoall: block j of rank r's send carries value(r, j*count + i) */
    for (size_t i = 0; i < count * n; i++)
        put(send, t, i, value(rank, i));
    memset(recv, 0xee, count * n * es);
    OK(C->alltoall(g, send, recv, count, t, &req));
    run(req);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < count; i++)
            CHECK(same(recv, t, j * count + i, value(j, (size_t)rank * count + i)),
                  "alltoall %s count %zu from %d at %zu", what, count, j, i);

    /* send/recv around the ring, two tags in flight at once */
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    loom_request *r1, *r2, *s1, *s2;
    unsigned char *recv2 = alloc(count * es), *send2 = alloc(count * es);
    for (size_t i = 0; i < count; i++) {
        put(send, t, i, value(rank, i));
        put(send2, t, i, value(rank + 10, i));
    }
    OK(C->group_start(g));
    OK(C->recv(g, recv2, count, t, prev, 7, &r2));
    OK(C->recv(g, recv, count, t, prev, 3, &r1));
    OK(C->send(g, send, count, t, next, 3, &s1));
    OK(C->send(g, send2, count, t, next, 7, &s2));
    OK(C->group_end(g));
    run(s2);
    run(r1);
    run(s1);
    run(r2);
    for (size_t i = 0; i < count; i++) {
        CHECK(same(recv, t, i, value(prev, i)), "recv %s tag 3 count %zu at %zu", what, count, i);
        CHECK(same(recv2, t, i, value(prev + 10, i)), "recv %s tag 7 count %zu at %zu", what, count, i);
    }
    free(recv2);
    free(send2);
    free(send);
    free(recv);
}

/* Several collectives in flight, completed out of order, and polled with test. */
static void test_outstanding(loom_group *g)
{
    int rank = C->rank(g), n = C->size(g);
    enum { K = 4, COUNT = 333 };
    float in[K][COUNT], out[K][COUNT];
    loom_request *req[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < COUNT; i++)
            in[k][i] = (float)(value(rank, (size_t)i) * (k + 1));
        OK(C->allreduce(g, in[k], out[k], COUNT, LOOM_F32, LOOM_SUM, &req[k]));
    }
    for (int k = K - 1; k >= 1; k--)
        run(req[k]);
    int rc;
    uint64_t t0 = loom_now_ns();
    while ((rc = C->test(req[0])) == LOOM_IN_PROGRESS) {
        usleep(100);
        if (loom_now_ns() - t0 > 30000000000ull) {
            CHECK(0, "test() never completed an allreduce");
            break;
        }
    }
    CHECK(rc == LOOM_OK || rc == LOOM_IN_PROGRESS, "test returned %s: %s", loom_status_string(rc), loom_last_error());
    for (int k = 0; k < K; k++)
        for (int i = 0; i < COUNT; i++)
            CHECK(out[k][i] == (float)(reference(LOOM_SUM, LOOM_F32, n, (size_t)i) * (k + 1)),
                  "outstanding allreduce %d at %d", k, i);
    loom_request *b;
    OK(C->barrier(g, &b));
    run(b);
}

static void test_group(loom_group *g, const char *label)
{
    /* 64: comm-ucx's scratch of 512 bytes, the most a request holds inline,
     * is filled exactly (f32 at 2 ranks) and overflows into its cache */
    static const size_t counts[] = {0, 1, 5, 64, 1023};
    for (int t = 0; t < LOOM_DTYPE_COUNT; t++)
        for (size_t c = 0; c < LOOM_ARRAY_LEN(counts); c++) {
            for (int op = 0; op < LOOM_REDOP_COUNT; op++)
                test_reductions(g, (loom_dtype)t, (loom_redop)op, counts[c]);
            test_movement(g, (loom_dtype)t, counts[c]);
        }
    test_outstanding(g);
    if (my_rank == 0)
        printf("%s: %d ranks checked\n", label, C->size(g));
}

/* One split of parent against its serial reference: the members of my
 * colour ordered by (key, parent rank). The new group's all-gather of
 * parent ranks proves its order, an all-reduce that it works, and parent's
 * counters that its traffic counts there too. */
static loom_group *check_split(loom_group *parent, const int *colours, const int *keys,
                               const char *what)
{
    int n = C->size(parent), me = C->rank(parent), want[64], m = 0;
    for (int r = 0; r < n; r++) {
        if (colours[r] != colours[me])
            continue;
        int at = m++;
        while (at > 0 && keys[want[at - 1]] > keys[r]) {
            want[at] = want[at - 1];
            at--;
        }
        want[at] = r;
    }
    loom_group *g = NULL;
    OK(C->split(parent, colours[me], keys[me], &g));
    CHECK(C->size(g) == m, "%s: size %d, want %d", what, C->size(g), m);
    int got[64] = {0};
    loom_comm_counters before, after;
    loom_group_counters(parent, &before);
    loom_request *req;
    OK(C->allgather(g, &me, got, 1, LOOM_I32, &req));
    run(req);
    for (int i = 0; i < m; i++) {
        CHECK(got[i] == want[i], "%s: member %d is parent rank %d, want %d", what, i, got[i],
              want[i]);
        if (want[i] == me)
            CHECK(C->rank(g) == i, "%s: rank %d, want %d", what, C->rank(g), i);
    }
    loom_group_counters(parent, &after);
    CHECK(after.bytes[LOOM_OP_ALLGATHER] - before.bytes[LOOM_OP_ALLGATHER] == (uint64_t)m * 4,
          "%s: parent counted %llu all-gather bytes of the split's %d", what,
          (unsigned long long)(after.bytes[LOOM_OP_ALLGATHER] - before.bytes[LOOM_OP_ALLGATHER]),
          m * 4);
    int sum = 0, want_sum = 0;
    OK(C->allreduce(g, &me, &sum, 1, LOOM_I32, LOOM_SUM, &req));
    run(req);
    for (int i = 0; i < m; i++)
        want_sum += want[i];
    CHECK(sum == want_sum, "%s: all-reduce %d, want %d", what, sum, want_sum);
    return g;
}

/* split: colourings with odd sizes, keys that reorder, ties, groups of
 * one, a split of a split, and a negative colour refused on every rank.
 * The splits are the world's: destroyed with it. */
static void test_split(loom_group *world)
{
    int n = C->size(world), colours[64] = {0}, keys[64] = {0};
    for (int r = 0; r < n; r++) { /* halves, reversed */
        colours[r] = r % 2;
        keys[r] = -r;
    }
    check_split(world, colours, keys, "split by parity, reversed");
    for (int r = 0; r < n; r++) { /* pairs (the last alone at odd n), ties by rank */
        colours[r] = r / 2;
        keys[r] = 0;
    }
    loom_group *pair = check_split(world, colours, keys, "split in pairs");
    for (int r = 0; r < n; r++) { /* rank 0 alone, the rest rotated */
        colours[r] = r == 0 ? 5 : 9;
        keys[r] = (r + 1) % n;
    }
    check_split(world, colours, keys, "split 1 + rest, rotated");
    for (int r = 0; r < n; r++) { /* one group, the same twice: two distinct groups */
        colours[r] = 3;
        keys[r] = n - r;
    }
    loom_group *a = check_split(world, colours, keys, "one group, reversed");
    loom_group *b = check_split(world, colours, keys, "one group again");
    CHECK(a != b, "the same split twice gave one group");
    int pn = C->size(pair), pc[64] = {0}, pk[64] = {0};
    for (int r = 0; r < pn; r++) { /* a split of a split */
        pc[r] = r;
        pk[r] = 0;
    }
    check_split(pair, pc, pk, "split of a pair");
    loom_group *none = NULL;
    int rc = C->split(world, my_rank == n - 1 ? -1 : 0, 0, &none);
    CHECK(rc == LOOM_ERR_INVALID && none == NULL && strstr(loom_last_error(), "colour -1"),
          "a negative colour gave %s: %s", loom_status_string(rc), loom_last_error());
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: collectives BACKEND [--straggler RANK]\n");
        return 2;
    }
    const char *backend = argv[1];
    int straggler = -1;
    const char *overrides[32] = {"comm.timeout_s=60"};
    int noverrides = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--straggler")) {
            straggler = atoi(argv[i + 1]);
            overrides[0] = "comm.timeout_s=3";
        } else if (!strcmp(argv[i], "--set") && noverrides < 32) {
            overrides[noverrides++] = argv[i + 1];
        } else {
            fprintf(stderr, "collectives: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    loom_config *cfg;
    loom_runtime *rt;
    OK(loom_config_load(NULL, overrides, noverrides, &cfg));
    OK(loom_runtime_create(cfg, &rt));
    loom_group *world;
    OK(loom_group_world(rt, backend, &world));
    my_rank = C->rank(world);
    int n = C->size(world);

    if (straggler >= 0) {
        if (my_rank == straggler) {
            sleep(6); /* past the others' timeout; then leave quietly */
            loom_runtime_destroy(rt);
            return 0;
        }
        float x = 1, y;
        loom_request *req;
        OK(C->allreduce(world, &x, &y, 1, LOOM_F32, LOOM_SUM, &req));
        uint64_t t0 = loom_now_ns();
        int rc = C->wait(req);
        double took = (double)(loom_now_ns() - t0) / 1e9;
        const char *msg = loom_last_error();
        char want[32];
        snprintf(want, sizeof want, "rank %d", straggler);
        printf("[rank %d] wait: %s after %.2f s: %s\n", my_rank, loom_status_string(rc), took, msg);
        /* the 3 s timeout, plus the core's grace for the others' reports
         * (at most a quarter of it) and slack for a loaded machine; a wait
         * that stops reading the clock would run to the launcher's kill */
        int on_time = took >= 2.9 && took < 3 + 0.75 + 3;
        int right = rc == LOOM_ERR_TIMEOUT && strstr(msg, "allreduce") && strstr(msg, want) && on_time;
        fflush(stdout);
        _exit(right ? 0 : 1); /* the communicator is broken: no orderly shutdown */
    }

    test_group(world, backend);

    /* Subgroups: even and odd ranks, listed in reverse to check rank order. */
    if (n > 1) {
        int members[64], m = 0;
        for (int r = n - 1; r >= 0; r--)
            if (r % 2 == my_rank % 2)
                members[m++] = r;
        loom_group *sub;
        OK(loom_group_subgroup(world, members, m, &sub));
        CHECK(C->size(sub) == m, "subgroup size %d, want %d", C->size(sub), m);
        int want_rank = 0;
        while (members[want_rank] != my_rank)
            want_rank++;
        CHECK(C->rank(sub) == want_rank, "subgroup rank %d, want %d", C->rank(sub), want_rank);
        float x = (float)my_rank, y = -1;
        loom_request *req;
        OK(C->allreduce(sub, &x, &y, 1, LOOM_F32, LOOM_SUM, &req));
        run(req);
        float want = 0;
        for (int i = 0; i < m; i++)
            want += (float)members[i];
        CHECK(y == want, "subgroup allreduce %g, want %g", y, want);
        if (m > 1)
            test_group(sub, "subgroup");
        loom_group_destroy(sub);
    }
    test_split(world);

    loom_comm_counters counters;
    loom_group_counters(world, &counters);
    CHECK(counters.calls[LOOM_OP_ALLREDUCE] > 0, "allreduce calls were not counted");

    int local = failures, total = 0;
    loom_request *req;
    OK(C->allreduce(world, &local, &total, 1, LOOM_I32, LOOM_SUM, &req));
    run(req);
    loom_group_destroy(world);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    if (my_rank == 0)
        printf("%s: %s (%d failures over %d ranks)\n", backend, total ? "FAILED" : "passed", total, n);
    return total ? 1 : 0;
}
