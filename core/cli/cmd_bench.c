/* loom bench: every collective of every backend named in bench.comms, at
 * every size from bench.min_bytes to bench.max_bytes (doubling), on the same
 * ranks and buffers, with each result checked against a closed form. The
 * table follows nccl-tests: size, count, type, redop, time, algbw, busbw,
 * #wrong. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "cli/args.h"
#include "cli/bench_tiers.h"
#include "cli/commands.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"

typedef enum bench_op {
    BENCH_ALLREDUCE,
    BENCH_BROADCAST,
    BENCH_REDUCE,
    BENCH_ALLGATHER,
    BENCH_REDUCESCATTER,
    BENCH_ALLTOALL,
    BENCH_SENDRECV,
    BENCH_OP_COUNT
} bench_op;
/* bench's ops are the comm ops of the same number (sendrecv: send) */
_Static_assert(BENCH_ALLTOALL == (int)LOOM_OP_ALLTOALL && BENCH_SENDRECV == (int)LOOM_OP_SEND,
               "bench_op follows loom_comm_op");

static const char *bench_op_names[BENCH_OP_COUNT] = {
    "allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "sendrecv"};

typedef struct bench_settings {
    int64_t min_bytes, max_bytes, iters, warmup;
    int barrier;      /* bench.barrier: each iteration (warm-up too) after a barrier */
    loom_dtype dtype;
    loom_redop redop;
    const char *memory;
} bench_settings;

typedef struct bench_row {
    const char *backend;
    bench_op op;
    size_t bytes;      /* nccl-tests' size: the whole buffer the op defines */
    size_t count;      /* elements of that buffer */
    double time_us;    /* per op, the slowest rank */
    double algbw, busbw;
    uint64_t wrong;    /* over all ranks */
} bench_row;

static int parse_dtype(const char *s, loom_dtype *out)
{
    for (int t = 0; t < LOOM_DTYPE_COUNT; t++)
        if (!strcmp(s, loom_dtype_name((loom_dtype)t))) {
            *out = (loom_dtype)t;
            return LOOM_OK;
        }
    return loom_fail(LOOM_ERR_INVALID, "bench.dtype: unknown type '%s'", s);
}

static int parse_redop(const char *s, loom_redop *out)
{
    for (int r = 0; r < LOOM_REDOP_COUNT; r++)
        if (!strcmp(s, loom_redop_name((loom_redop)r))) {
            *out = (loom_redop)r;
            return LOOM_OK;
        }
    return loom_fail(LOOM_ERR_INVALID, "bench.redop: unknown reduction '%s'", s);
}

/* Inputs are small integers, exact in every dtype, so each result has a
 * closed form: rank r holds r + 1 + (i % 7) at element i. */
static double input_value(int rank, size_t i) { return (double)(rank + 1) + (double)(i % 7); }

static double reduced_value(loom_redop op, loom_dtype dtype, int n, size_t i)
{
    double m = (double)(i % 7);
    switch (op) {
    case LOOM_SUM: return n * (n + 1) / 2.0 + n * m;
    case LOOM_MAX: return n + m;
    case LOOM_MIN: return 1 + m;
    case LOOM_AVG: {
        double sum = n * (n + 1) / 2.0 + n * m;
        return loom_dtype_is_float(dtype) ? sum / n : floor(sum / n);
    }
    default: return NAN;
    }
}

static void store_value(void *buf, loom_dtype t, size_t i, double v)
{
    switch (t) {
    case LOOM_F32: ((float *)buf)[i] = (float)v; break;
    case LOOM_BF16: ((uint16_t *)buf)[i] = loom_f32_to_bf16((float)v); break;
    case LOOM_F16: ((uint16_t *)buf)[i] = loom_f32_to_f16((float)v); break;
    case LOOM_F64: ((double *)buf)[i] = v; break;
    case LOOM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LOOM_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

/* The expected value rounds through the dtype exactly like the result. */
static int matches(const void *buf, loom_dtype t, size_t i, double expected)
{
    uint64_t want = 0, got = 0;
    size_t es = loom_dtype_size(t);
    store_value(&want, t, 0, expected);
    memcpy(&got, (const char *)buf + i * es, es);
    return want == got;
}

static void fill_input(void *buf, loom_dtype t, int rank, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        store_value(buf, t, i, input_value(rank, first + i));
}

/* Elements per rank for an op whose nccl-tests size is `bytes`. */
static size_t per_rank_count(bench_op op, size_t bytes, size_t es, int n)
{
    size_t count = bytes / es;
    if (op == BENCH_ALLGATHER || op == BENCH_REDUCESCATTER || op == BENCH_ALLTOALL)
        return count / (size_t)n;
    return count;
}

/* send/recv are the op's buffers, of bench.memory's kind. With device
 * memory, inputs are written and results read through the host copies
 * host_send/host_recv; with host memory those are send/recv themselves. */
typedef struct bench_buffers {
    void *send, *recv;
    void *host_send, *host_recv;
    int device;
    void *scratch;    /* device: two 8-byte words for the per-size agreement */
    double timeout_s; /* device copies are bounded like collectives */
} bench_buffers;

/* Host -> op buffer (device: a copy; host: the same memory, nothing to do). */
static int to_op(const bench_buffers *b, void *dst, const void *src, size_t bytes)
{
    if (!b->device)
        return LOOM_OK;
#ifdef LOOM_HAVE_CUDA
    return loom_device_copy(dst, src, bytes, b->timeout_s);
#else
    (void)dst, (void)src, (void)bytes;
    return LOOM_ERR_NOT_SUPPORTED;
#endif
}

/* An allreduce of one 8-byte value that every rank must agree on (the
 * slowest time, the wrong count), through device memory when the backend
 * takes device memory only. */
static int agree(loom_group *g, const bench_buffers *b, void *value, loom_dtype dtype,
                 loom_redop op)
{
    const loom_comm_api *c = &loom_core_comm_api;
    loom_request *req = NULL;
    int64_t in;
    memcpy(&in, value, sizeof in);
    if (!b->device) {
        int rc = c->allreduce(g, &in, value, 1, dtype, op, &req);
        return rc == LOOM_OK ? c->wait(req) : rc;
    }
    char *dev = b->scratch;
    int rc = to_op(b, dev, &in, sizeof in);
    if (rc == LOOM_OK && (rc = c->allreduce(g, dev, dev + 8, 1, dtype, op, &req)) == LOOM_OK)
        rc = c->wait(req);
#ifdef LOOM_HAVE_CUDA
    if (rc == LOOM_OK)
        rc = loom_device_copy(value, dev + 8, sizeof in, b->timeout_s);
#endif
    return rc;
}

static int issue(loom_group *g, bench_op op, const bench_settings *st, bench_buffers *b,
                 size_t count)
{
    const loom_comm_api *c = &loom_core_comm_api;
    int rank = c->rank(g), n = c->size(g), rc;
    loom_request *req = NULL, *req2 = NULL;
    switch (op) {
    case BENCH_ALLREDUCE:
        rc = c->allreduce(g, b->send, b->recv, count, st->dtype, st->redop, &req);
        break;
    case BENCH_BROADCAST:
        rc = c->broadcast(g, rank == 0 ? b->send : b->recv, count, st->dtype, 0, &req);
        break;
    case BENCH_REDUCE:
        rc = c->reduce(g, b->send, b->recv, count, st->dtype, st->redop, 0, &req);
        break;
    case BENCH_ALLGATHER:
        rc = c->allgather(g, b->send, b->recv, count, st->dtype, &req);
        break;
    case BENCH_REDUCESCATTER:
        rc = c->reducescatter(g, b->send, b->recv, count, st->dtype, st->redop, &req);
        break;
    case BENCH_ALLTOALL:
        rc = c->alltoall(g, b->send, b->recv, count, st->dtype, &req);
        break;
    case BENCH_SENDRECV:
        rc = c->group_start(g);
        if (rc == LOOM_OK)
            rc = c->recv(g, b->recv, count, st->dtype, (rank + n - 1) % n, 0, &req2);
        if (rc == LOOM_OK)
            rc = c->send(g, b->send, count, st->dtype, (rank + 1) % n, 0, &req);
        if (rc == LOOM_OK)
            rc = c->group_end(g);
        break;
    default:
        rc = LOOM_ERR_INVALID;
    }
    if (rc != LOOM_OK)
        return rc;
    rc = c->wait(req);
    int rc2 = op == BENCH_SENDRECV ? c->wait(req2) : LOOM_OK;
    return rc != LOOM_OK ? rc : rc2;
}

/* Elements of the op's send and receive buffers on this rank. */
static void buffer_counts(bench_op op, size_t count, int n, size_t *send_count, size_t *recv_count)
{
    *send_count = *recv_count = count;
    if (op == BENCH_ALLGATHER || op == BENCH_ALLTOALL)
        *recv_count = count * (size_t)n;
    if (op == BENCH_REDUCESCATTER || op == BENCH_ALLTOALL)
        *send_count = count * (size_t)n;
}

/* Write the inputs and poison the outputs, before the first untimed
 * iteration: a send buffer never written maps the kernel's zero page, and
 * reading it is faster than reading memory, so timing it would flatter
 * every backend at large sizes. */
static int write_inputs(loom_group *g, bench_op op, const bench_settings *st, bench_buffers *b,
                        size_t count)
{
    const loom_comm_api *c = &loom_core_comm_api;
    int rank = c->rank(g), n = c->size(g);
    size_t es = loom_dtype_size(st->dtype), send_count, recv_count;
    buffer_counts(op, count, n, &send_count, &recv_count);
    if (op == BENCH_ALLTOALL) {
        /* block j of rank r's send: the values rank r addresses to rank j */
        for (int j = 0; j < n; j++)
            fill_input((char *)b->host_send + (size_t)j * count * es, st->dtype, rank,
                       (size_t)j * count, count);
    } else {
        fill_input(b->host_send, st->dtype, rank, 0, send_count);
    }
    memset(b->host_recv, 0xff, recv_count * es); /* no stale right answers */
    int rc = to_op(b, b->send, b->host_send, send_count * es);
    return rc == LOOM_OK ? to_op(b, b->recv, b->host_recv, recv_count * es) : rc;
}

/* Count the wrong elements of the result the timed iterations left on this
 * rank. Every op here reads only its inputs, so the last iteration's result
 * is the one of the inputs write_inputs wrote: a timed op that read
 * anything else shows up here. */
static int check(loom_group *g, bench_op op, const bench_settings *st, bench_buffers *b,
                 size_t count, uint64_t *wrong)
{
    const loom_comm_api *c = &loom_core_comm_api;
    int rank = c->rank(g), n = c->size(g);
    size_t send_count, recv_count;
    buffer_counts(op, count, n, &send_count, &recv_count);
    void *hsend = b->host_send, *hrecv = b->host_recv;
    int rc = LOOM_OK;
#ifdef LOOM_HAVE_CUDA
    /* the broadcast root's buffer is its send buffer */
    size_t es = loom_dtype_size(st->dtype);
    if (b->device) {
        if (op == BENCH_BROADCAST && rank == 0)
            rc = loom_device_copy(hsend, b->send, count * es, b->timeout_s);
        else
            rc = loom_device_copy(hrecv, b->recv, recv_count * es, b->timeout_s);
    }
#endif
    if (rc != LOOM_OK)
        return rc;
    uint64_t bad = 0;
    switch (op) {
    case BENCH_ALLREDUCE:
        for (size_t i = 0; i < count; i++)
            bad += !matches(hrecv, st->dtype, i, reduced_value(st->redop, st->dtype, n, i));
        break;
    case BENCH_REDUCE:
        if (rank == 0)
            for (size_t i = 0; i < count; i++)
                bad += !matches(hrecv, st->dtype, i, reduced_value(st->redop, st->dtype, n, i));
        break;
    case BENCH_BROADCAST: {
        const void *out = rank == 0 ? hsend : hrecv;
        for (size_t i = 0; i < count; i++)
            bad += !matches(out, st->dtype, i, input_value(0, i));
        break;
    }
    case BENCH_ALLGATHER:
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                bad += !matches(hrecv, st->dtype, (size_t)r * count + i, input_value(r, i));
        break;
    case BENCH_REDUCESCATTER:
        for (size_t i = 0; i < count; i++)
            bad += !matches(hrecv, st->dtype, i,
                            reduced_value(st->redop, st->dtype, n, (size_t)rank * count + i));
        break;
    case BENCH_ALLTOALL:
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < count; i++)
                bad += !matches(hrecv, st->dtype, (size_t)j * count + i,
                                input_value(j, (size_t)rank * count + i));
        break;
    case BENCH_SENDRECV:
        for (size_t i = 0; i < count; i++)
            bad += !matches(hrecv, st->dtype, i, input_value((rank + n - 1) % n, i));
        break;
    default:
        break;
    }
    *wrong = bad;
    return LOOM_OK;
}

static int run_size(loom_group *g, bench_op op, const bench_settings *st, bench_buffers *b,
                    size_t bytes, bench_row *row)
{
    const loom_comm_api *c = &loom_core_comm_api;
    int n = c->size(g);
    size_t es = loom_dtype_size(st->dtype);
    size_t count = per_rank_count(op, bytes, es, n);
    size_t total = (op == BENCH_ALLGATHER || op == BENCH_REDUCESCATTER || op == BENCH_ALLTOALL)
                       ? count * (size_t)n
                       : count;
    row->op = op;
    row->bytes = total * es;
    row->count = total;
    int rc = write_inputs(g, op, st, b, count);
    loom_request *req = NULL;
    /* Warm-up runs as the timed loop does (ucc_perftest too): iterations
     * issued back to back, with no barrier between them, left the first
     * size timed while a rank was still slow from sleeping in the kernel
     * through the bootstrap store's exchange (its first row up to 2x
     * slower than the next on a virtual machine). */
    for (int64_t i = 0; i < st->warmup && rc == LOOM_OK; i++) {
        if (st->barrier && (rc = c->barrier(g, &req)) == LOOM_OK)
            rc = c->wait(req);
        if (rc == LOOM_OK)
            rc = issue(g, op, st, b, count);
    }
    if (rc == LOOM_OK && (rc = c->barrier(g, &req)) == LOOM_OK)
        rc = c->wait(req);
    double us;
    if (st->barrier) {
        /* each iteration alone, from a common start: the time of one op,
         * without the overlap of back-to-back ones */
        uint64_t busy = 0;
        for (int64_t i = 0; i < st->iters && rc == LOOM_OK; i++) {
            if ((rc = c->barrier(g, &req)) == LOOM_OK && (rc = c->wait(req)) == LOOM_OK) {
                uint64_t t0 = loom_now_ns();
                rc = issue(g, op, st, b, count);
                busy += loom_now_ns() - t0;
            }
        }
        us = (double)busy / 1e3 / (double)st->iters;
    } else {
        uint64_t t0 = loom_now_ns();
        for (int64_t i = 0; i < st->iters && rc == LOOM_OK; i++)
            rc = issue(g, op, st, b, count);
        us = (double)(loom_now_ns() - t0) / 1e3 / (double)st->iters;
    }
    /* No rank starts its check (a pass over the whole result on the CPU)
     * while another still times: where ranks share cores it would slow
     * their last iterations, by milliseconds at 4 ranks on 2 cores. */
    if (rc == LOOM_OK && (rc = c->barrier(g, &req)) == LOOM_OK)
        rc = c->wait(req);
    uint64_t wrong = 0;
    if (rc == LOOM_OK)
        rc = check(g, op, st, b, count, &wrong);
    if (rc != LOOM_OK)
        return rc;
    /* The slowest rank's time, and every rank's wrong count. */
    double worst = us;
    uint64_t all_wrong = wrong;
    rc = agree(g, b, &worst, LOOM_F64, LOOM_MAX);
    if (rc == LOOM_OK)
        rc = agree(g, b, &all_wrong, LOOM_I64, LOOM_SUM);
    if (rc != LOOM_OK)
        return rc;
    row->time_us = worst;
    row->algbw = worst > 0 ? (double)row->bytes / worst / 1e3 : 0;
    row->busbw = row->algbw * loom_comm_bus_factor((loom_comm_op)op, n);
    row->wrong = all_wrong;
    return LOOM_OK;
}

/* why: how "auto" chose the backend, or "" when the config named it. */
static void print_header(const char *backend, const char *why, int n, const bench_settings *st)
{
    printf("#\n# loom bench: backend %s%s%s%s, %d ranks, %s memory, %lld warm-up + %lld timed "
           "iterations%s\n", backend, why[0] ? " (" : "", why, why[0] ? ")" : "", n, st->memory,
           (long long)st->warmup, (long long)st->iters,
           st->barrier ? ", each after a barrier" : " back to back");
    if (loom_launch_binding())
        printf("# launch: %s\n", loom_launch_binding());
    printf("# %-13s %12s %12s %6s %6s %10s %9s %9s %7s\n", "op", "size", "count", "type",
           "redop", "time", "algbw", "busbw", "#wrong");
    printf("# %-13s %12s %12s %6s %6s %10s %9s %9s %7s\n", "", "(B)", "(elements)", "", "",
           "(us)", "(GB/s)", "(GB/s)", "");
    /* seen at once, not with the first row: a row may take minutes */
    fflush(stdout);
}

static int reduces(bench_op op)
{
    return op == BENCH_ALLREDUCE || op == BENCH_REDUCE || op == BENCH_REDUCESCATTER;
}

static void print_row(const bench_row *r, const bench_settings *st)
{
    printf("  %-13s %12zu %12zu %6s %6s %10.2f %9.3f %9.3f %7llu\n", bench_op_names[r->op],
           r->bytes, r->count, loom_dtype_name(st->dtype),
           reduces(r->op) ? loom_redop_name(st->redop) : "none", r->time_us, r->algbw, r->busbw,
           (unsigned long long)r->wrong);
}

static void json_row(FILE *f, const bench_row *r, const bench_settings *st, int n, int *first)
{
    fprintf(f,
            "%s  {\"backend\": \"%s\", \"ranks\": %d, \"op\": \"%s\", \"size\": %zu, "
            "\"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"time_us\": %.3f, "
            "\"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, \"wrong\": %llu}",
            *first ? "" : ",\n", r->backend, n, bench_op_names[r->op], r->bytes, r->count,
            loom_dtype_name(st->dtype), reduces(r->op) ? loom_redop_name(st->redop) : "none",
            r->time_us, r->algbw, r->busbw, (unsigned long long)r->wrong);
    *first = 0;
}

static int read_settings(const loom_config *cfg, bench_settings *st)
{
    const char *s;
    loom_config_int(cfg, "bench.min_bytes", &st->min_bytes);
    loom_config_int(cfg, "bench.max_bytes", &st->max_bytes);
    loom_config_int(cfg, "bench.iters", &st->iters);
    loom_config_int(cfg, "bench.warmup", &st->warmup);
    loom_config_bool(cfg, "bench.barrier", &st->barrier);
    st->memory = "host";
    loom_config_string(cfg, "bench.memory", &st->memory);
    s = "f32";
    loom_config_string(cfg, "bench.dtype", &s);
    int rc = parse_dtype(s, &st->dtype);
    if (rc != LOOM_OK)
        return rc;
    s = "sum";
    loom_config_string(cfg, "bench.redop", &s);
    if ((rc = parse_redop(s, &st->redop)) != LOOM_OK)
        return rc;
    if (st->iters < 1)
        st->iters = 1;
#ifdef LOOM_HAVE_CUDA
    if (!strcmp(st->memory, "device") && loom_device_available() != LOOM_OK) {
        char why[512]; /* loom_fail writes the buffer loom_last_error reads */
        snprintf(why, sizeof why, "%s", loom_last_error());
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "%s: bench.memory = \"device\": %s; use \"host\"",
                         loom_config_where(cfg, "bench.memory"), why);
    }
#else
    if (strcmp(st->memory, "host") != 0)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: bench.memory = \"%s\" needs the device memory tier, which this "
                         "loom was built without (no CUDA toolkit found); use \"host\"",
                         loom_config_where(cfg, "bench.memory"), st->memory);
#endif
    return LOOM_OK;
}

/* Bench one backend; returns LOOM_OK even with wrong rows (they are counted),
 * an error only when the backend failed mid-way. *ran is set when it
 * started; an unavailable one is reported and skipped, and why kept in
 * unavailable (the last one's). */
static int bench_backend(loom_runtime *rt, const char *backend, const char *why,
                         const bench_settings *st,
                         const int *ops, int nops, FILE *json, int *json_first,
                         uint64_t *wrong_total, int *ran, char *unavailable, size_t why_cap)
{
    int rank = loom_runtime_env(rt)->rank;
    loom_group *g = NULL;
    int rc = loom_group_world(rt, backend, &g);
    if (rc != LOOM_OK) {
        snprintf(unavailable, why_cap, "%s", loom_last_error());
        if (rank == 0)
            printf("#\n# loom bench: backend %s unavailable: %s\n", backend, unavailable);
        return LOOM_OK;
    }
    /* A backend takes the memory kinds it declares (comm.h), a wrapper those
     * of the backend it opened; the built-in self group copies with memcpy,
     * so host only. */
    int device = !strcmp(st->memory, "device");
    uint32_t kinds = loom_group_mem_kinds(g);
    if (!(kinds & LOOM_MEM_BIT(device ? LOOM_MEM_DEVICE : LOOM_MEM_HOST))) {
        snprintf(unavailable, why_cap, "comm %s does not take %s memory (bench.memory = \"%s\"; set "
                 "\"%s\" for it)", backend, st->memory, st->memory, device ? "host" : "device");
        if (rank == 0)
            printf("#\n# loom bench: backend %s unavailable: %s\n", backend, unavailable);
        loom_group_destroy(g);
        return LOOM_OK;
    }
    *ran = 1;
    int n = loom_core_comm_api.size(g);
    size_t es = loom_dtype_size(st->dtype);
    /* Largest buffer any op needs: alltoall/allgather hold n blocks. */
    size_t cap = (size_t)st->max_bytes + (size_t)n * es + es;
    loom_tier tier = device ? LOOM_TIER_DEVICE : LOOM_TIER_HOST;
    bench_buffers b = {0};
    b.device = device;
    b.timeout_s = loom_runtime_timeout(rt);
    if ((rc = loom_mem_alloc(tier, LOOM_PURPOSE_COMM, cap, &b.send)) != LOOM_OK ||
        (rc = loom_mem_alloc(tier, LOOM_PURPOSE_COMM, cap, &b.recv)) != LOOM_OK)
        goto done;
    if (device) {
        if ((rc = loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, cap, &b.host_send)) != LOOM_OK ||
            (rc = loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, cap, &b.host_recv)) != LOOM_OK ||
            (rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, 16, &b.scratch)) != LOOM_OK)
            goto done;
    } else {
        b.host_send = b.send;
        b.host_recv = b.recv;
    }
    if (rank == 0)
        print_header(backend, why, n, st);
    for (int k = 0; k < nops && rc == LOOM_OK; k++) {
        bench_op op = (bench_op)ops[k];
        for (int64_t bytes = st->min_bytes; bytes <= st->max_bytes; bytes = bytes ? bytes * 2 : 1) {
            if ((size_t)bytes < es || per_rank_count(op, (size_t)bytes, es, n) == 0)
                continue; /* too small for one element per rank */
            bench_row row = {.backend = backend};
            rc = run_size(g, op, st, &b, (size_t)bytes, &row);
            if (rc != LOOM_OK) {
                loom_log(LOOM_LOG_ERROR, "bench: %s %s of %lld bytes failed: %s", backend,
                         bench_op_names[op], (long long)bytes, loom_last_error());
                break;
            }
            *wrong_total += row.wrong;
            if (rank == 0) {
                print_row(&row, st);
                fflush(stdout);
                if (json)
                    json_row(json, &row, st, n, json_first);
            }
        }
    }
done:
    if (device) {
        loom_mem_free(b.host_send);
        loom_mem_free(b.host_recv);
        loom_mem_free(b.scratch);
    }
    loom_mem_free(b.send);
    loom_mem_free(b.recv);
    loom_group_destroy(g);
    return rc;
}

int loom_cmd_bench(int argc, char **argv)
{
    const char *json_path = NULL;
    const loom_cli_option options[] = {{"--json", NULL, &json_path, NULL}, {NULL, NULL, NULL, NULL}};
    loom_cli_config_args args;
    int bad = loom_cli_config_args_parse(
        "loom bench", "usage: loom bench CONFIG [--json FILE] [--set path=value ...]\n", argc,
        argv, options, &args);
    if (bad)
        return bad;
    loom_config *cfg = NULL;
    if (loom_config_load(args.config, args.overrides, args.noverrides, &cfg) != LOOM_OK) {
        fprintf(stderr, "loom bench: %s\n", loom_last_error());
        return 1;
    }
    bench_settings st = {0};
    loom_runtime *rt = NULL;
    int rc = read_settings(cfg, &st);
    if (rc == LOOM_OK)
        rc = loom_runtime_create(cfg, &rt);
    if (rc != LOOM_OK) {
        fprintf(stderr, "loom bench: %s\n", loom_last_error());
        loom_config_free(cfg);
        return 1;
    }
    /* Both lists always exist: the schema's defaults stand in for unset ones. */
    int ops[BENCH_OP_COUNT], nops = 0;
    int nlisted = loom_config_list_len(cfg, "bench.ops");
    for (int i = 0; i < nlisted && nops < BENCH_OP_COUNT; i++) {
        const char *name = loom_config_list_string(cfg, "bench.ops", i);
        for (int o = 0; o < BENCH_OP_COUNT; o++)
            if (name && !strcmp(name, bench_op_names[o]))
                ops[nops++] = o;
    }
    int rank = loom_runtime_env(rt)->rank;
    FILE *json = NULL;
    int json_first = 1;
    if (json_path && rank == 0) {
        json = fopen(json_path, "w");
        if (!json) {
            fprintf(stderr, "loom bench: cannot write '%s': %s\n", json_path, strerror(errno));
            loom_runtime_destroy(rt);
            loom_config_free(cfg);
            return 1;
        }
        fprintf(json, "[\n");
    }
    uint64_t wrong = 0;
    /* With tiers to time, the collectives run only when asked for too. */
    int tiers = loom_config_list_len(cfg, "bench.tiers") > 0;
    int nbackends = !tiers || loom_config_is_set(cfg, "bench.comms")
                        ? loom_config_list_len(cfg, "bench.comms") : 0;
    if (tiers && loom_runtime_env(rt)->world_size > 1)
        rc = loom_fail(LOOM_ERR_INVALID, "%s: bench.tiers times this machine's memory and disk "
                       "from one process; run loom bench without loom launch",
                       loom_config_where(cfg, "bench.tiers"));
    else if (tiers)
        rc = loom_bench_tiers(&args, cfg, json, &json_first);
    int ran = 0;
    char unavailable[1024] = "";
    for (int i = 0; i < nbackends && rc == LOOM_OK; i++) {
        const char *backend = loom_config_list_string(cfg, "bench.comms", i);
        char why[1024] = "";
        if (!strcmp(backend, "auto") &&
            (rc = loom_comm_auto(rt, strcmp(st.memory, "device") ? LOOM_MEM_HOST : LOOM_MEM_DEVICE,
                                 &backend, why, sizeof why)) != LOOM_OK)
            break;
        int started = 0;
        rc = bench_backend(rt, backend, why, &st, ops, nops, json, &json_first, &wrong, &started,
                           unavailable, sizeof unavailable);
        ran += started;
    }
    /* An empty table is no result: with one backend asked for, its failure
     * to start is the error; with several, some that ran is enough. */
    if (rc == LOOM_OK && nbackends > 0 && ran == 0)
        rc = loom_fail(LOOM_ERR_NOT_FOUND, "%s: bench.comms: no backend ran (%s%s)",
                       loom_config_where(cfg, "bench.comms"),
                       nbackends == 1 ? "" : "none was available; the last: ", unavailable);
    if (json) {
        fprintf(json, "\n]\n");
        fclose(json);
    }
    if (rank == 0 && rc == LOOM_OK && nbackends)
        printf("#\n# %s: %llu wrong\n", wrong ? "FAILED" : "ok", (unsigned long long)wrong);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    if (rc != LOOM_OK) {
        fprintf(stderr, "loom bench: %s\n", loom_last_error());
        return 1;
    }
    return wrong ? 1 : 0;
}
