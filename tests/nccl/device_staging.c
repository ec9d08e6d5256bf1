/* The collective suite (tests/collectives/collectives.c) on device memory,
 * unchanged: it is compiled a second time with loom_core_comm_api renamed to
 * loom_staged_comm_api, this table. Each call mirrors the suite's host
 * buffers into device buffers from the device tier (one device buffer for
 * host ranges that overlap, so in-place calls stay in place), runs the real
 * op on them, and copies the results back when the request completes. The
 * suite's own reference checks then judge a backend that only ever saw
 * device pointers. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_staging.h"
#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/device.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/memory.h"

#define COPY_TIMEOUT_S 60.0

/* One host range and its device mirror. */
typedef struct mirror {
    const char *host;
    size_t bytes;
    char *dev;   /* owned when own */
    int own;
} mirror;

typedef struct staged {
    loom_request *inner;
    mirror in, out;   /* out: copied back at completion (bytes 0: nothing) */
} staged;

static const loom_comm_api *real(void) { return &loom_core_comm_api; }

static int mirror_make(mirror *m, const void *host, size_t bytes)
{
    m->host = host;
    m->bytes = bytes;
    m->dev = NULL;
    m->own = 1;
    if (!host || !bytes)
        return LOOM_OK;
    int rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, bytes, (void **)&m->dev);
    if (rc == LOOM_OK)
        rc = loom_device_copy(m->dev, host, bytes, COPY_TIMEOUT_S);
    return rc;
}

static void mirror_free(mirror *m)
{
    if (m->own && m->dev)
        loom_mem_free(m->dev);
    m->dev = NULL;
}

/* Mirrors of the send and recv ranges. Overlapping ranges share one device
 * buffer over their union, so pointer relations (send == recv, send ==
 * recv + rank * block) hold on the device exactly as on the host. */
static int stage(const void *send, size_t sbytes, void *recv, size_t rbytes, staged *s,
                 const void **dsend, void **drecv)
{
    memset(s, 0, sizeof *s);
    const char *a = send, *b = recv;
    if (a && b && sbytes && rbytes && a < b + rbytes && b < a + sbytes) {
        const char *lo = a < b ? a : b;
        const char *hi = a + sbytes > b + rbytes ? a + sbytes : b + rbytes;
        int rc = mirror_make(&s->in, lo, (size_t)(hi - lo));
        if (rc != LOOM_OK)
            return rc;
        s->out = (mirror){b, rbytes, s->in.dev + (b - lo), 0};
        *dsend = s->in.dev + (a - lo);
        *drecv = s->out.dev;
        return LOOM_OK;
    }
    int rc = mirror_make(&s->in, send, sbytes);
    if (rc == LOOM_OK)
        rc = mirror_make(&s->out, recv, rbytes);
    *dsend = s->in.dev;
    *drecv = s->out.dev;
    return rc;
}

static void unstage(staged *s)
{
    mirror_free(&s->out);
    mirror_free(&s->in);
}

/* The results home, then free the mirrors. */
static int finish(staged *s, int rc)
{
    if (rc == LOOM_OK && s->out.bytes && s->out.dev)
        rc = loom_device_copy((void *)s->out.host, s->out.dev, s->out.bytes, COPY_TIMEOUT_S);
    unstage(s);
    free(s);
    return rc;
}

/* After the real post: hand out our request, or finish at once when the op
 * completed at issue. */
static int posted(staged *s, int rc, loom_request **req)
{
    if (rc != LOOM_OK) {
        unstage(s);
        free(s);
        return rc;
    }
    if (!s->inner) {
        *req = NULL;
        return finish(s, LOOM_OK);
    }
    *req = (loom_request *)s;
    return LOOM_OK;
}

static staged *new_staged(void)
{
    staged *s = calloc(1, sizeof *s);
    if (!s)
        abort();
    return s;
}

static int st_rank(const loom_group *g) { return real()->rank(g); }
static int st_size(const loom_group *g) { return real()->size(g); }
static const char *st_backend(const loom_group *g) { return real()->backend(g); }

static int st_allreduce(loom_group *g, const void *send, void *recv, size_t count, loom_dtype t,
                        loom_redop op, loom_request **req)
{
    size_t bytes = count * loom_dtype_size(t);
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(send, bytes, recv, bytes, s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->allreduce(g, ds, dr, count, t, op, &s->inner);
    return posted(s, rc, req);
}

static int st_broadcast(loom_group *g, void *buf, size_t count, loom_dtype t, int root,
                        loom_request **req)
{
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(NULL, 0, buf, count * loom_dtype_size(t), s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->broadcast(g, dr, count, t, root, &s->inner);
    return posted(s, rc, req);
}

static int st_reduce(loom_group *g, const void *send, void *recv, size_t count, loom_dtype t,
                     loom_redop op, int root, loom_request **req)
{
    size_t bytes = count * loom_dtype_size(t);
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(send, bytes, recv, bytes, s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->reduce(g, ds, dr, count, t, op, root, &s->inner);
    return posted(s, rc, req);
}

static int st_allgather(loom_group *g, const void *send, void *recv, size_t count, loom_dtype t,
                        loom_request **req)
{
    size_t bytes = count * loom_dtype_size(t);
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(send, bytes, recv, bytes * (size_t)st_size(g), s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->allgather(g, ds, dr, count, t, &s->inner);
    return posted(s, rc, req);
}

static int st_reducescatter(loom_group *g, const void *send, void *recv, size_t count,
                            loom_dtype t, loom_redop op, loom_request **req)
{
    size_t bytes = count * loom_dtype_size(t);
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(send, bytes * (size_t)st_size(g), recv, bytes, s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->reducescatter(g, ds, dr, count, t, op, &s->inner);
    return posted(s, rc, req);
}

static int st_alltoall(loom_group *g, const void *send, void *recv, size_t count, loom_dtype t,
                       loom_request **req)
{
    size_t bytes = count * loom_dtype_size(t) * (size_t)st_size(g);
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(send, bytes, recv, bytes, s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->alltoall(g, ds, dr, count, t, &s->inner);
    return posted(s, rc, req);
}

static int st_send(loom_group *g, const void *buf, size_t count, loom_dtype t, int peer, int tag,
                   loom_request **req)
{
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(buf, count * loom_dtype_size(t), NULL, 0, s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->send(g, ds, count, t, peer, tag, &s->inner);
    return posted(s, rc, req);
}

static int st_recv(loom_group *g, void *buf, size_t count, loom_dtype t, int peer, int tag,
                   loom_request **req)
{
    staged *s = new_staged();
    const void *ds;
    void *dr;
    int rc = stage(NULL, 0, buf, count * loom_dtype_size(t), s, &ds, &dr);
    if (rc == LOOM_OK)
        rc = real()->recv(g, dr, count, t, peer, tag, &s->inner);
    return posted(s, rc, req);
}

static int st_barrier(loom_group *g, loom_request **req)
{
    staged *s = new_staged();
    return posted(s, real()->barrier(g, &s->inner), req);
}

static int st_group_start(loom_group *g) { return real()->group_start(g); }
static int st_group_end(loom_group *g) { return real()->group_end(g); }

static int st_test(loom_request *r)
{
    if (!r)
        return LOOM_OK;
    staged *s = (staged *)r;
    int rc = real()->test(s->inner);
    if (rc == LOOM_IN_PROGRESS)
        return rc;
    return finish(s, rc);
}

static int st_wait(loom_request *r)
{
    if (!r)
        return LOOM_OK;
    staged *s = (staged *)r;
    return finish(s, real()->wait(s->inner));
}

/* A split moves no caller buffers (the core exchanges the colours itself),
 * so there is nothing to stage: the subgroup is the real one, and the suite
 * then reaches it through this table like any other group. */
static int st_split(loom_group *parent, int colour, int key, loom_group **out)
{
    return real()->split(parent, colour, key, out);
}

const loom_comm_api loom_staged_comm_api = {
    .struct_size = sizeof(loom_comm_api),
    .rank = st_rank,
    .size = st_size,
    .backend = st_backend,
    .allreduce = st_allreduce,
    .broadcast = st_broadcast,
    .reduce = st_reduce,
    .allgather = st_allgather,
    .reducescatter = st_reducescatter,
    .alltoall = st_alltoall,
    .send = st_send,
    .recv = st_recv,
    .barrier = st_barrier,
    .group_start = st_group_start,
    .group_end = st_group_end,
    .test = st_test,
    .wait = st_wait,
    .split = st_split,
};

/* Every member of loom_comm_api after struct_size is an op, in this order.
 * The suite calls any of them through this table, so a member the table
 * lacks is a call through NULL: the assert stops the build when the api
 * grows an op that is not listed here, and the check below finds a listed
 * op the table does not fill. */
static const char *const staged_ops[] = {
    "rank", "size", "backend", "allreduce", "broadcast", "reduce", "allgather",
    "reducescatter", "alltoall", "send", "recv", "barrier", "group_start", "group_end",
    "test", "wait", "split",
};
typedef void (*any_op)(void);
_Static_assert(offsetof(loom_comm_api, rank) + LOOM_ARRAY_LEN(staged_ops) * sizeof(any_op) ==
                   sizeof(loom_comm_api),
               "loom_comm_api has an op that tests/nccl/device_staging.c does not stage: add it "
               "to staged_ops and to loom_staged_comm_api");

int loom_staged_table_check(const loom_comm_api *api, char *why, size_t cap)
{
    if (api->struct_size != sizeof(loom_comm_api)) {
        snprintf(why, cap, "struct_size is %u, loom_comm_api has %zu bytes", api->struct_size,
                 sizeof(loom_comm_api));
        return LOOM_ERR_INTERNAL;
    }
    /* By slot, not by name: a member added to the api is walked too, even
     * before anyone lists it. */
    size_t index = 0;
    for (size_t at = offsetof(loom_comm_api, rank); at + sizeof(any_op) <= sizeof(loom_comm_api);
         at += sizeof(any_op), index++) {
        any_op op;
        memcpy(&op, (const char *)api + at, sizeof op);
        if (!op) {
            const char *name = index < LOOM_ARRAY_LEN(staged_ops) ? staged_ops[index]
                                                                   : "not listed in staged_ops";
            snprintf(why, cap, "op %zu (%s, at byte %zu of loom_comm_api) is NULL", index, name,
                     at);
            return LOOM_ERR_INTERNAL;
        }
    }
    return LOOM_OK;
}

/* Before the suite's main: a hole in the table would otherwise surface as
 * a crash deep inside the suite, far from its cause. */
__attribute__((constructor)) static void refuse_an_incomplete_table(void)
{
    char why[256];
    if (loom_staged_table_check(&loom_staged_comm_api, why, sizeof why) != LOOM_OK) {
        fprintf(stderr, "device staging: loom_staged_comm_api is incomplete: %s\n", why);
        exit(1);
    }
}
