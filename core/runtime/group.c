/* Groups: the core's handle on a communicator. Every call goes through here
 * so bytes are counted per op and spans traced, whatever the backend. The
 * built-in `self` communicator serves groups of one rank. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/bootstrap.h"
#include "runtime/flight.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"

/* Point-to-point to oneself: sends are copied eagerly and matched to
 * receives by tag in posting order. */
typedef struct self_message {
    int tag;
    size_t bytes;
    void *data;     /* an eager copy (unmatched send) */
    void *dest;     /* a posted receive waiting for data */
    int *done;      /* the posted receive's completion flag */
    struct self_message *next;
} self_message;

/* How many subgroups of one rank list a group made: the same on every
 * member, so it tells repeated subgroups of the same ranks apart. */
typedef struct subgroup_count {
    uint64_t list_hash;
    int count;
    struct subgroup_count *next;
} subgroup_count;

struct loom_group {
    loom_runtime *rt;
    const char *backend;
    const loom_plugin *plugin;         /* NULL for self */
    const loom_comm_ops *ops;          /* NULL for self */
    uint32_t mem_kinds;                /* the backend's, a wrapper's resolved; 0 for self */
    loom_comm *comm;
    int rank, size;
    int *world_ranks;                  /* world rank of each member; NULL for self */
    int is_world;                      /* rank r is world rank r: messages need not say so */
    char id[96];                       /* the same on every member: names its store keys */
    char name[24];                     /* what messages call it: "dp", "world", "dp.split" */
    loom_flight_group *flight;         /* its ring in the flight recorder; NULL: not recorded */
    /* Ops posted here, numbered as the backends number them in messages;
     * a backend may report arrival from another thread (comm_waiting). */
    atomic_uint_least64_t collectives, sends_recvs;
    double grace_s;                    /* for the ranks that came to report, on a timeout */
    atomic_int reports_while_waiting;  /* the backend calls comm_waiting on long waits */
    char timeout_why[512];             /* the first collective timeout's diagnosis */
    subgroup_count *subgroups;
    loom_comm_counters counters;
    /* Groups made by split: g owns them (destroyed with it) and their
     * traffic counts in g's counters too, so an axis's totals hold it. */
    struct loom_group *split_children, *next_split_child, *split_parent;
    unsigned splits_made;              /* names a split's colours in the store */
    self_message *unmatched_sends, *pending_recvs;
    struct loom_group *next_backed;    /* backed_groups: loom_comm to group */
    struct loom_request *outstanding;  /* posted, not yet waited on (request_lock) */
    int destroyed;                     /* a tombstone: ops on it are refused */
};

/* Host copies of an op's device buffers, for a backend that does not take
 * device memory: what the backend is given, and what goes back to the
 * device when the op completes. */
typedef struct staging {
    const void *send; /* what the backend is given */
    void *recv;
    void *host_send, *host_recv; /* the staging blocks (purpose comm); NULL: none */
    void *device_recv;           /* where host_recv goes at completion; NULL: nowhere */
    size_t recv_bytes;
} staging;

/* A request's state, read on every wait and test: a released one keeps
 * its op, number and group name for the message (its group may be gone). */
typedef enum request_state {
    REQUEST_LIVE = 0x4c495645,     /* posted, not yet released */
    REQUEST_RELEASED = 0x52454c53, /* completed by a wait or a test */
    REQUEST_ORPHANED = 0x4f525048, /* its group was destroyed before a wait */
} request_state;

struct loom_request {
    request_state state;
    int complete;             /* complete at issue: nothing to ask the transport */
    loom_group *group;        /* NULL once released */
    char group_name[24];      /* its group's name, for messages after release */
    loom_comm_request *inner; /* NULL: complete at issue, or a self recv */
    loom_comm_op op;
    uint64_t start_ns, bytes; /* start_ns: for the trace (span_clock) */
    uint64_t seq;             /* its number among the collectives, or the sends and receives */
    int peer;                 /* sends and receives */
    uint64_t ticket;          /* in the flight recorder */
    int *self_done;           /* self recv: set when matched */
    staging stage;
    /* live: the group's outstanding list; released: the quarantine or the
     * free list (request_lock) */
    struct loom_request *prev, *next;
};

/* Released requests wait this many releases in a FIFO before their memory
 * is reused, so that a second wait or test on one within that window is
 * caught and named; the memory is never freed, only reused. A process
 * holds at most this many plus its outstanding requests. */
#define REQUEST_QUARANTINE 1024

static pthread_mutex_t request_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_request *quarantine_head, *quarantine_tail, *free_requests;
static int quarantined;

static loom_request *take_outstanding(loom_group *g);
static void orphan_requests(loom_request *left, const char *group_name);

/* Destroyed groups stay readable for this many more destroys, so that an
 * op posted on one is refused and named instead of reaching a backend
 * communicator that is gone. */
#define GROUP_TOMBSTONES 64

static loom_group *tombstones[GROUP_TOMBSTONES];
static unsigned groups_buried;

/* An op of this process failed: callers stop waiting on the rest then, so
 * requests left at a group's destroy are expected, not a misuse. */
static atomic_int an_op_failed;

/* An op failed: the job is going down, and a rank that stopped will never
 * answer, so from now on nothing waits long on the bootstrap store. */
static void note_op_failed(const loom_group *g)
{
    atomic_store(&an_op_failed, 1);
    loom_store_job_failed(loom_runtime_store(g->rt));
}

/* The groups over a backend, so the core finds the group of a loom_comm a
 * backend hands back (comm_waiting) from any thread. */
static pthread_mutex_t backed_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_group *backed_groups;
static int worlds_made; /* names world groups apart: every rank makes them in one order */

static int make_group(loom_runtime *rt, const char *backend, const loom_plugin *plugin,
                      loom_comm *comm, loom_group **out)
{
    loom_group *g = calloc(1, sizeof *g);
    if (!g)
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    g->rt = rt;
    g->backend = backend;
    g->plugin = plugin;
    g->ops = plugin ? &plugin->ops.comm : NULL;
    g->comm = comm;
    snprintf(g->name, sizeof g->name, "%s", plugin ? "world" : "self");
    g->rank = g->ops ? g->ops->rank(comm) : 0;
    g->size = g->ops ? g->ops->size(comm) : 1;
    if (g->ops && !(g->world_ranks = calloc((size_t)g->size, sizeof *g->world_ranks))) {
        free(g);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    *out = g;
    return LOOM_OK;
}

/* From here on comm_waiting finds g by its loom_comm. */
static void add_backed(loom_group *g)
{
    pthread_mutex_lock(&backed_lock);
    g->next_backed = backed_groups;
    backed_groups = g;
    pthread_mutex_unlock(&backed_lock);
}

static void remove_backed(loom_group *g)
{
    pthread_mutex_lock(&backed_lock);
    for (loom_group **p = &backed_groups; *p; p = &(*p)->next_backed)
        if (*p == g) {
            *p = g->next_backed;
            break;
        }
    pthread_mutex_unlock(&backed_lock);
}

/* The backend's late_grace_s setting, where it has one. */
static double grace_setting(const loom_host *host)
{
    double grace_s = 2.0;
    if (host->config_float && host->config_float(host, "late_grace_s", &grace_s) != LOOM_OK)
        grace_s = 2.0;
    return grace_s > 0 ? grace_s : 0;
}

/* How many subgroups of this rank list parent made before; -1: out of memory. */
static int count_subgroup(loom_group *parent, uint64_t list_hash)
{
    subgroup_count *sc = parent->subgroups;
    while (sc && sc->list_hash != list_hash)
        sc = sc->next;
    if (!sc) {
        if (!(sc = calloc(1, sizeof *sc)))
            return -1;
        sc->list_hash = list_hash;
        sc->next = parent->subgroups;
        parent->subgroups = sc;
    }
    return sc->count++;
}

int loom_group_world(loom_runtime *rt, const char *backend, loom_group **out)
{
    int world = loom_runtime_env(rt)->world_size;
    if (!strcmp(backend, "self")) {
        if (world != 1)
            return loom_fail(LOOM_ERR_INVALID,
                             "comm: 'self' serves groups of one rank, but the job has %d ranks; "
                             "name a backend such as \"mpi\"",
                             world);
        return make_group(rt, "self", NULL, NULL, out);
    }
    const loom_plugin *plugin;
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, backend, &plugin);
    if (rc != LOOM_OK)
        return rc;
    char group_path[96];
    snprintf(group_path, sizeof group_path, "comm.%s", plugin->header->name);
    const loom_host *host;
    rc = loom_runtime_host(rt, plugin, group_path, &host);
    if (rc != LOOM_OK)
        return rc;
    const loom_comm_ops *ops = &plugin->ops.comm;
    loom_comm *comm = NULL;
    rc = ops->create_world(host, &comm);
    if (rc != LOOM_OK)
        return rc;
    uint32_t mem_kinds = 0; /* a wrapper's are known once it has opened its inner */
    rc = loom_runtime_comm_mem_kinds(rt, plugin, &mem_kinds);
    if (rc != LOOM_OK) {
        ops->destroy(comm);
        return rc;
    }
    if (!(mem_kinds & LOOM_MEM_BIT(LOOM_MEM_HOST)))
        loom_log(LOOM_LOG_DEBUG, "comm-%s does not accept host memory", plugin->header->name);
    rc = make_group(rt, plugin->header->name, plugin, comm, out);
    if (rc != LOOM_OK) {
        ops->destroy(comm);
        return rc;
    }
    loom_group *g = *out;
    g->mem_kinds = mem_kinds;
    g->is_world = 1;
    for (int r = 0; r < g->size; r++)
        g->world_ranks[r] = r;
    snprintf(g->id, sizeof g->id, "%s.w%d", g->backend, worlds_made++);
    g->flight = loom_flight_join(g->id, "world", g->backend, g->rank, g->size);
    /* a wrapper's late_grace_s is the setting of the backend it forwards to */
    const loom_host *grace_host = host;
    for (const loom_plugin *p = plugin; p; p = loom_runtime_comm_opened(rt, p, &grace_host))
        continue;
    g->grace_s = grace_setting(grace_host);
    add_backed(g);
    return LOOM_OK;
}

int loom_group_self(loom_runtime *rt, loom_group **out)
{
    return make_group(rt, "self", NULL, NULL, out);
}

int loom_group_subgroup(loom_group *parent, const int *ranks, int nranks, loom_group **out)
{
    int found = 0;
    if (nranks < 1 || nranks > parent->size)
        return loom_fail(LOOM_ERR_INVALID, "comm: a subgroup of %d ranks from a group of %d",
                         nranks, parent->size);
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return loom_fail(LOOM_ERR_INVALID, "comm: subgroup rank %d outside a group of %d",
                             ranks[i], parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return loom_fail(LOOM_ERR_INVALID, "comm: subgroup lists rank %d twice", ranks[i]);
        found |= ranks[i] == parent->rank;
    }
    if (!found)
        return loom_fail(LOOM_ERR_INVALID, "comm: a subgroup must contain the calling rank %d",
                         parent->rank);
    /* A rank alone needs no backend, unless the buffers are the backend's
     * kind only (device memory: the core cannot copy them), and then every
     * rank of the parent calls create_subgroup, as NCCL's split needs. */
    if (!parent->ops || (nranks == 1 && (parent->mem_kinds & LOOM_MEM_BIT(LOOM_MEM_HOST))))
        return make_group(parent->rt, "self", NULL, NULL, out);
    uint64_t list_hash = loom_rank_list_hash(ranks, nranks);
    int made_before = count_subgroup(parent, list_hash);
    if (made_before < 0)
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    loom_comm *comm = NULL;
    int rc = parent->ops->create_subgroup(parent->comm, ranks, nranks, &comm);
    if (rc != LOOM_OK)
        return rc;
    rc = make_group(parent->rt, parent->backend, parent->plugin, comm, out);
    if (rc != LOOM_OK) {
        parent->ops->destroy(comm);
        return rc;
    }
    loom_group *g = *out;
    g->mem_kinds = parent->mem_kinds;
    for (int r = 0; r < nranks; r++)
        g->world_ranks[r] = parent->world_ranks[ranks[r]];
    snprintf(g->id, sizeof g->id, "%.60s.%llx.%d", parent->id, (unsigned long long)list_hash,
             made_before);
    g->flight = loom_flight_join(g->id, "sub", g->backend, g->rank, g->size);
    snprintf(g->name, sizeof g->name, "sub");
    g->grace_s = parent->grace_s;
    add_backed(g);
    return LOOM_OK;
}

/* g's backend and buffers are gone: it is kept as a tombstone, and the
 * oldest one goes. */
static void bury(loom_group *g)
{
    g->destroyed = 1;
    g->world_ranks = NULL;
    g->subgroups = NULL;
    g->unmatched_sends = g->pending_recvs = NULL;
    g->split_children = g->split_parent = NULL;
    pthread_mutex_lock(&request_lock);
    loom_group **slot = &tombstones[groups_buried++ % GROUP_TOMBSTONES];
    loom_group *oldest = *slot;
    *slot = g;
    pthread_mutex_unlock(&request_lock);
    free(oldest);
}

/* An op on a group already destroyed (while it is a tombstone). */
static int refuse_destroyed(const loom_group *g, const char *what)
{
    return loom_fail(LOOM_ERR_INVALID,
                     "comm: %s on group %s, which was destroyed: post ops only on a live group",
                     what, g->name);
}

void loom_group_destroy(loom_group *g)
{
    if (!g)
        return;
    for (loom_group *c = g->split_children, *next; c; c = next) {
        next = c->next_split_child;
        c->split_parent = NULL; /* nothing to unlink from */
        loom_group_destroy(c);
    }
    if (g->split_parent) {
        loom_group **p = &g->split_parent->split_children;
        while (*p && *p != g)
            p = &(*p)->next_split_child;
        if (*p)
            *p = g->next_split_child;
    }
    loom_request *left = take_outstanding(g);
    if (g->ops) {
        remove_backed(g);
        /* what is in flight is given up first, so that destroy cannot hang on it */
        if (left && loom_plugin_provides(g->plugin, LOOM_OPTIONAL_COMM_ABORT))
            g->ops->abort(g->comm);
        g->ops->destroy(g->comm);
    }
    orphan_requests(left, g->name);
    loom_flight_leave(g->flight);
    for (subgroup_count *sc = g->subgroups, *next; sc; sc = next) {
        next = sc->next;
        free(sc);
    }
    free(g->world_ranks);
    for (self_message *m = g->unmatched_sends, *next; m; m = next) {
        next = m->next;
        free(m->data);
        free(m);
    }
    for (self_message *m = g->pending_recvs, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    bury(g);
}

void loom_group_counters(const loom_group *g, loom_comm_counters *out) { *out = g->counters; }

void loom_group_set_name(loom_group *g, const char *name)
{
    snprintf(g->name, sizeof g->name, "%.*s", (int)sizeof g->name - 1, name);
    loom_flight_rename(g->flight, name);
}

const char *loom_group_name(const loom_group *g) { return g->name; }

uint32_t loom_group_mem_kinds(const loom_group *g)
{
    return g->ops ? g->mem_kinds : LOOM_MEM_BIT(LOOM_MEM_HOST);
}

int loom_request_completed_at_issue(const loom_request *req)
{
    return req->complete;
}

static int g_rank(const loom_group *g) { return g->rank; }
static int g_size(const loom_group *g) { return g->size; }
static const char *g_backend(const loom_group *g) { return g->backend; }

/* Wrap a backend request (or immediate completion) and count the op. */
static void count_op(loom_group *g, loom_comm_op op, uint64_t bytes)
{
    for (; g; g = g->split_parent) {
        g->counters.calls[op]++;
        g->counters.bytes[op] += bytes;
    }
}

/* An op between its checks and its request: its number on g and its
 * ticket in the flight recorder. */
typedef struct op_start {
    loom_comm_op op;
    uint64_t t0, bytes, seq, ticket; /* t0: for the trace (span_clock) */
    int peer; /* sends and receives; -1 */
    staging stage;
} op_start;

/* The trace's clock: a reading costs ~25 ns on a virtual machine, a tenth
 * of a small op, so it is read only for a trace (the flight recorder has
 * its own, cheaper one). */
static uint64_t span_clock(void) { return loom_trace_enabled() ? loom_now_ns() : 0; }

/* ------------------------------------------------ device buffers, staged
 *
 * A backend that does not declare device memory (comm-ucx, comm-mpi, the
 * self communicator) is given host copies of an op's device buffers: what
 * it sends is copied to the host before the op is posted, and what it
 * receives goes back to the device when a test or wait completes the op.
 * Each copy is a span "stage <op>" on the trace's memory lane. */

static int takes_device(const loom_group *g)
{
    return g->ops && (g->mem_kinds & LOOM_MEM_BIT(LOOM_MEM_DEVICE));
}

static int stage_copy(loom_comm_op op, void *dst, const void *src, size_t bytes, int to_host)
{
    uint64_t t0 = span_clock();
    int rc = to_host ? loom_mem_device_to_host(dst, src, bytes)
                     : loom_mem_host_to_device(dst, src, bytes);
    if (loom_trace_enabled()) {
        char name[32];
        snprintf(name, sizeof name, "stage %s", loom_comm_op_name(op));
        loom_trace_span(LOOM_LANE_MEMORY, name, t0, span_clock(), bytes);
    }
    return rc;
}

static void staging_free(staging *s)
{
    loom_mem_free(s->host_send);
    loom_mem_free(s->host_recv);
    s->host_send = s->host_recv = s->device_recv = NULL;
}

static int is_p2p(loom_comm_op op) { return op == LOOM_OP_SEND || op == LOOM_OP_RECV; }

/* Host copies of send (send_bytes of it are sent) and recv (recv_bytes,
 * copied back at completion when copy_back) where they are device memory
 * and g's backend does not take it; st->stage says what to post. A send
 * inside recv (an op in place) is staged inside recv's copy, so the
 * backend sees the op in place too. */
static int stage(loom_group *g, op_start *st, const void *send, size_t send_bytes, void *recv,
                 size_t recv_bytes, int copy_back)
{
    staging *s = &st->stage;
    s->send = send;
    s->recv = recv;
    if (takes_device(g))
        return LOOM_OK;
    /* self's collectives in place move nothing: no copy to stage */
    if (!g->ops && send == recv && !is_p2p(st->op))
        return LOOM_OK;
    int send_device = send && loom_mem_is_device(send);
    int recv_device = recv && loom_mem_is_device(recv);
    if (!send_device && !recv_device)
        return LOOM_OK;
    loom_tier tier = loom_mem_staging_tier();
    int rc = LOOM_OK;
    if (recv_device && (rc = loom_mem_alloc(tier, LOOM_PURPOSE_COMM, recv_bytes, &s->host_recv)) ==
                           LOOM_OK) {
        s->recv = s->host_recv;
        if (copy_back) {
            s->device_recv = recv;
            s->recv_bytes = recv_bytes;
        }
    }
    if (rc == LOOM_OK && send_device) {
        uintptr_t at = (uintptr_t)send, from = (uintptr_t)recv;
        if (recv_device && at >= from && at - from + send_bytes <= recv_bytes)
            s->send = (char *)s->host_recv + (at - from);
        else if ((rc = loom_mem_alloc(tier, LOOM_PURPOSE_COMM, send_bytes, &s->host_send)) ==
                 LOOM_OK)
            s->send = s->host_send;
        if (rc == LOOM_OK && send_bytes)
            rc = stage_copy(st->op, (void *)s->send, send, send_bytes, 1);
    }
    if (rc == LOOM_OK)
        return LOOM_OK;
    staging_free(s);
    char said[1024];
    snprintf(said, sizeof said, "%s", loom_last_error());
    return loom_fail(rc,
                     "comm: %s on group %s: staging its device buffers through host memory for "
                     "%s%s failed: %s",
                     loom_comm_op_name(st->op), g->name, g->ops ? "comm-" : "the communicator ",
                     g->backend, said);
}

/* The op completed: what it received goes back to the device. */
static int unstage(loom_comm_op op, staging *s)
{
    int rc = LOOM_OK;
    if (s->device_recv)
        rc = stage_copy(op, s->device_recv, s->host_recv, s->recv_bytes, 0);
    staging_free(s);
    return rc;
}

/* A request for the op st on g, on g's outstanding list: from the free
 * list (released requests past their quarantine), so a step's ops do not
 * allocate. NULL: out of memory. */
static loom_request *request_new(loom_group *g, const op_start *st)
{
    pthread_mutex_lock(&request_lock);
    loom_request *r = free_requests;
    if (r)
        free_requests = r->next;
    pthread_mutex_unlock(&request_lock);
    if (!r && !(r = malloc(sizeof *r)))
        return NULL;
    *r = (loom_request){.state = REQUEST_LIVE,
                        .group = g,
                        .op = st->op,
                        .start_ns = st->t0,
                        .bytes = st->bytes,
                        .seq = st->seq,
                        .peer = st->peer,
                        .ticket = st->ticket,
                        .stage = st->stage};
    pthread_mutex_lock(&request_lock);
    r->next = g->outstanding;
    if (r->next)
        r->next->prev = r;
    g->outstanding = r;
    pthread_mutex_unlock(&request_lock);
    return r;
}

/* Into the quarantine, as state; the oldest there goes to the free list. */
static void quarantine(loom_request *r, request_state state, const char *group_name)
{
    free(r->self_done);
    r->self_done = NULL;
    snprintf(r->group_name, sizeof r->group_name, "%s", group_name);
    r->group = NULL;
    r->inner = NULL;
    r->state = state;
    r->prev = r->next = NULL;
    if (quarantine_tail)
        quarantine_tail->next = r;
    else
        quarantine_head = r;
    quarantine_tail = r;
    if (++quarantined > REQUEST_QUARANTINE) {
        loom_request *oldest = quarantine_head;
        quarantine_head = oldest->next;
        quarantined--;
        oldest->next = free_requests;
        free_requests = oldest;
    }
}

/* Completed by a wait or a test: off its group's list, into the quarantine. */
static void request_release(loom_request *r)
{
    pthread_mutex_lock(&request_lock);
    loom_group *g = r->group;
    if (r->prev)
        r->prev->next = r->next;
    else
        g->outstanding = r->next;
    if (r->next)
        r->next->prev = r->prev;
    quarantine(r, REQUEST_RELEASED, g->name);
    pthread_mutex_unlock(&request_lock);
}

/* "allreduce #3 on group dp", "send #2 to rank 1 on group pp" */
static void describe_request(const loom_request *r, const char *group_name, char *buf, size_t cap)
{
    const char *op = loom_comm_op_name(r->op);
    unsigned long long seq = (unsigned long long)r->seq;
    if (is_p2p(r->op))
        snprintf(buf, cap, "%s #%llu %s rank %d on group %s", op, seq,
                 r->op == LOOM_OP_SEND ? "to" : "from", r->peer, group_name);
    else
        snprintf(buf, cap, "%s #%llu on group %s", op, seq, group_name);
}

/* wait or test (what) may go on with r: a request handed out and not yet
 * released. A pointer that never was a request cannot be told apart from
 * one; a released one can until its memory is reused (REQUEST_QUARANTINE). */
static int check_request(loom_request *r, const char *what)
{
    if (!r)
        return loom_fail(LOOM_ERR_INVALID,
                         "comm: %s on a NULL request: no op set it (every op that returns "
                         "LOOM_OK sets one, complete or not; one that fails sets none)",
                         what);
    char named[160] = "";
    pthread_mutex_lock(&request_lock);
    request_state state = r->state;
    if (state == REQUEST_RELEASED || state == REQUEST_ORPHANED)
        describe_request(r, r->group_name, named, sizeof named);
    pthread_mutex_unlock(&request_lock);
    switch (state) {
    case REQUEST_LIVE: return LOOM_OK;
    case REQUEST_RELEASED:
        return loom_fail(LOOM_ERR_INVALID,
                         "comm: %s on %s, a request already completed and released: wait on a "
                         "request once (a test that returns other than LOOM_IN_PROGRESS "
                         "releases it too)",
                         what, named);
    case REQUEST_ORPHANED:
        return loom_fail(LOOM_ERR_INVALID,
                         "comm: %s on %s, whose group was destroyed before the request was "
                         "waited on",
                         what, named);
    }
    return loom_fail(LOOM_ERR_INVALID,
                     "comm: %s on %p, which is not a request the comm api handed out", what,
                     (void *)r);
}

/* The group is going: its outstanding requests, named one line each; the
 * caller destroys the backend before orphan_requests lets their memory go. */
static loom_request *take_outstanding(loom_group *g)
{
    pthread_mutex_lock(&request_lock);
    loom_request *left = g->outstanding;
    g->outstanding = NULL;
    pthread_mutex_unlock(&request_lock);
    int after_failure = atomic_load(&an_op_failed);
    for (loom_request *r = left; r; r = r->next) {
        char named[160];
        describe_request(r, g->name, named, sizeof named);
        if (after_failure)
            loom_log(LOOM_LOG_INFO,
                     "comm: group %s destroyed with %s outstanding, left after an op failed",
                     g->name, named);
        else
            loom_log(LOOM_LOG_ERROR,
                     "comm: group %s destroyed with %s outstanding: wait or test each request "
                     "before destroying its group",
                     g->name, named);
    }
    return left;
}

static void orphan_requests(loom_request *left, const char *group_name)
{
    pthread_mutex_lock(&request_lock);
    for (loom_request *r = left, *next; r; r = next) {
        next = r->next;
        staging_free(&r->stage); /* the backend is gone: nothing writes them now */
        quarantine(r, REQUEST_ORPHANED, group_name);
    }
    pthread_mutex_unlock(&request_lock);
}

static int issued(loom_group *g, op_start *st, loom_comm_request *inner, loom_request **req)
{
    count_op(g, st->op, st->bytes);
    *req = NULL;
    if (!inner) {
        int rc = unstage(st->op, &st->stage);
        loom_flight_mark(g->flight, st->ticket,
                         rc == LOOM_OK ? LOOM_FLIGHT_COMPLETED : LOOM_FLIGHT_FAILED);
        loom_trace_span(LOOM_LANE_COMM, loom_comm_op_name(st->op), st->t0, span_clock(),
                        st->bytes);
        if (rc != LOOM_OK)
            return rc;
        st->stage = (staging){0};
        loom_request *r = request_new(g, st);
        if (!r)
            return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
        r->complete = 1;
        *req = r;
        return LOOM_OK;
    }
    loom_request *r = request_new(g, st);
    if (!r) {
        if (g->ops->wait(inner) == LOOM_OK)
            staging_free(&st->stage);
        loom_flight_mark(g->flight, st->ticket, LOOM_FLIGHT_FAILED);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    r->inner = inner;
    *req = r;
    return LOOM_OK;
}

/* The backend refused to post it (or its buffers could not be staged). */
static int post_failed(loom_group *g, op_start *st, int rc)
{
    note_op_failed(g);
    staging_free(&st->stage);
    loom_flight_mark(g->flight, st->ticket, LOOM_FLIGHT_FAILED);
    return rc;
}


/* The op's number on g, counted as every backend counts it (collectives
 * and sends and receives separately), so a timeout names the same op. */
static uint64_t number_op(loom_group *g, loom_comm_op op)
{
    return atomic_fetch_add(is_p2p(op) ? &g->sends_recvs : &g->collectives, 1) + 1;
}

/* Number the op and record it as posted, before the backend sees it. */
static void start_op(loom_group *g, loom_comm_op op, uint64_t bytes, int peer, op_start *st)
{
    *st = (op_start){.op = op, .t0 = span_clock(), .bytes = bytes, .peer = peer};
    st->seq = number_op(g, op);
    st->ticket = loom_flight_post(g->flight, op, st->seq, bytes,
                                  peer >= 0 && g->world_ranks ? g->world_ranks[peer] : -1);
}

/* The arguments every backend may rely on (comm.h), checked once here:
 * a known dtype and reduction, a root or peer inside the group, a tag >= 0;
 * then the op is started. bytes: what the op moves, as counted. */
static int begin_op(loom_group *g, loom_comm_op op, loom_dtype dtype, int reduces, loom_redop redop,
                    int rank, int tag, uint64_t bytes, op_start *st)
{
    const char *name = loom_comm_op_name(op);
    if (g->destroyed)
        return refuse_destroyed(g, name);
    if ((unsigned)dtype >= LOOM_DTYPE_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s: unknown dtype %d", name, (int)dtype);
    if (reduces && (unsigned)redop >= LOOM_REDOP_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s: unknown reduction %d", name, (int)redop);
    if (rank < 0 || rank >= g->size)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s %s %d outside a group of %d", name,
                         is_p2p(op) ? "peer" : "root", rank, g->size);
    if (tag < 0)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s tag %d is negative", name, tag);
    start_op(g, op, bytes, is_p2p(op) ? rank : -1, st);
    return LOOM_OK;
}

static void self_copy(const void *send, void *recv, size_t bytes)
{
    if (send != recv && bytes)
        memmove(recv, send, bytes);
}

static int g_allreduce(loom_group *g, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_redop op, loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_ALLREDUCE, dtype, 1, op, 0, 0, bytes, &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, send, bytes, recv, bytes, 1)) != LOOM_OK)
        return post_failed(g, &st, rc);
    send = st.stage.send;
    recv = st.stage.recv;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->allreduce(g->comm, send, recv, count, dtype, op, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    } else {
        self_copy(send, recv, bytes); /* sum, max, min and avg of one value */
    }
    return issued(g, &st, inner, req);
}

static int g_broadcast(loom_group *g, void *buf, size_t count, loom_dtype dtype, int root,
                       loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_BROADCAST, dtype, 0, LOOM_SUM, root, 0, bytes, &st);
    if (rc != LOOM_OK)
        return rc;
    int is_root = g->rank == root; /* the root sends buf, the others receive it */
    if ((rc = stage(g, &st, buf, is_root ? bytes : 0, buf, bytes, !is_root)) != LOOM_OK)
        return post_failed(g, &st, rc);
    buf = st.stage.recv;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->broadcast(g->comm, buf, count, dtype, root, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    }
    return issued(g, &st, inner, req);
}

static int g_reduce(loom_group *g, const void *send, void *recv, size_t count, loom_dtype dtype,
                    loom_redop op, int root, loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_REDUCE, dtype, 1, op, root, 0, bytes, &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, send, bytes, recv, bytes, g->rank == root)) != LOOM_OK)
        return post_failed(g, &st, rc);
    send = st.stage.send;
    recv = st.stage.recv;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->reduce(g->comm, send, recv, count, dtype, op, root, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, &st, inner, req);
}

static int g_allgather(loom_group *g, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_ALLGATHER, dtype, 0, LOOM_SUM, 0, 0, bytes * (uint64_t)g->size,
                      &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, send, bytes, recv, bytes * (size_t)g->size, 1)) != LOOM_OK)
        return post_failed(g, &st, rc);
    send = st.stage.send;
    recv = st.stage.recv;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->allgather(g->comm, send, recv, count, dtype, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, &st, inner, req);
}

static int g_reducescatter(loom_group *g, const void *send, void *recv, size_t count,
                           loom_dtype dtype, loom_redop op, loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_REDUCESCATTER, dtype, 1, op, 0, 0, bytes * (uint64_t)g->size,
                      &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, send, bytes * (size_t)g->size, recv, bytes, 1)) != LOOM_OK)
        return post_failed(g, &st, rc);
    send = st.stage.send;
    recv = st.stage.recv;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->reducescatter(g->comm, send, recv, count, dtype, op, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, &st, inner, req);
}

static int g_alltoall(loom_group *g, const void *send, void *recv, size_t count,
                      loom_dtype dtype, loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_ALLTOALL, dtype, 0, LOOM_SUM, 0, 0, bytes * (uint64_t)g->size,
                      &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, send, bytes * (size_t)g->size, recv, bytes * (size_t)g->size, 1)) !=
        LOOM_OK)
        return post_failed(g, &st, rc);
    send = st.stage.send;
    recv = st.stage.recv;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->alltoall(g->comm, send, recv, count, dtype, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, &st, inner, req);
}

/* Self: match a send with the first pending receive of its tag, else keep
 * an eager copy for a later receive. */
static int self_send(loom_group *g, const void *buf, size_t bytes, int tag)
{
    for (self_message **p = &g->pending_recvs; *p; p = &(*p)->next) {
        self_message *m = *p;
        if (m->tag != tag)
            continue;
        if (m->bytes != bytes)
            return loom_fail(LOOM_ERR_INVALID,
                             "comm: self send of %zu bytes matched a receive of %zu (tag %d)",
                             bytes, m->bytes, tag);
        memcpy(m->dest, buf, bytes);
        *m->done = 1;
        *p = m->next;
        free(m);
        return LOOM_OK;
    }
    self_message *m = calloc(1, sizeof *m);
    if (!m || !(m->data = malloc(bytes ? bytes : 1))) {
        free(m);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    memcpy(m->data, buf, bytes);
    m->tag = tag;
    m->bytes = bytes;
    self_message **tail = &g->unmatched_sends;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    return LOOM_OK;
}

static int g_send(loom_group *g, const void *buf, size_t count, loom_dtype dtype, int peer,
                  int tag, loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_SEND, dtype, 0, LOOM_SUM, peer, tag, bytes, &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, buf, bytes, NULL, 0, 0)) != LOOM_OK)
        return post_failed(g, &st, rc);
    buf = st.stage.send;
    loom_comm_request *inner = NULL;
    if (g->ops)
        rc = g->ops->send(g->comm, buf, count, dtype, peer, tag, &inner);
    else
        rc = self_send(g, buf, bytes, tag);
    if (rc != LOOM_OK)
        return post_failed(g, &st, rc);
    return issued(g, &st, inner, req);
}

static int g_recv(loom_group *g, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                  loom_request **req)
{
    uint64_t bytes = count * loom_dtype_size(dtype);
    op_start st;
    int rc = begin_op(g, LOOM_OP_RECV, dtype, 0, LOOM_SUM, peer, tag, bytes, &st);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = stage(g, &st, NULL, 0, buf, bytes, 1)) != LOOM_OK)
        return post_failed(g, &st, rc);
    buf = st.stage.recv;
    if (g->ops) {
        loom_comm_request *inner = NULL;
        rc = g->ops->recv(g->comm, buf, count, dtype, peer, tag, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
        return issued(g, &st, inner, req);
    }
    for (self_message **p = &g->unmatched_sends; *p; p = &(*p)->next) {
        self_message *m = *p;
        if (m->tag != tag)
            continue;
        if (m->bytes != bytes)
            return loom_fail(LOOM_ERR_INVALID,
                             "comm: self recv of %zu bytes matched a send of %zu (tag %d)", bytes,
                             m->bytes, tag);
        memcpy(buf, m->data, bytes);
        *p = m->next;
        free(m->data);
        free(m);
        return issued(g, &st, NULL, req);
    }
    /* No send yet: the request completes when one arrives. */
    self_message *m = calloc(1, sizeof *m);
    int *done = calloc(1, sizeof *done);
    loom_request *r = m && done ? request_new(g, &st) : NULL;
    if (!r) {
        free(m);
        free(done);
        return post_failed(g, &st, loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory"));
    }
    m->tag = tag;
    m->bytes = bytes;
    m->dest = buf;
    m->done = done;
    self_message **tail = &g->pending_recvs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    count_op(g, LOOM_OP_RECV, bytes);
    r->self_done = done;
    *req = r;
    return LOOM_OK;
}

static int g_barrier(loom_group *g, loom_request **req)
{
    if (g->destroyed)
        return refuse_destroyed(g, "barrier");
    op_start st;
    start_op(g, LOOM_OP_BARRIER, 0, -1, &st);
    loom_comm_request *inner = NULL;
    if (g->ops) {
        int rc = g->ops->barrier(g->comm, &inner);
        if (rc != LOOM_OK)
            return post_failed(g, &st, rc);
    }
    return issued(g, &st, inner, req);
}

static int g_group_start(loom_group *g)
{
    if (g->destroyed)
        return refuse_destroyed(g, "group_start");
    if (g->ops)
        return g->ops->group_start(g->comm);
    return LOOM_OK;
}

static int g_group_end(loom_group *g)
{
    if (g->destroyed)
        return refuse_destroyed(g, "group_end");
    if (g->ops)
        return g->ops->group_end(g->comm);
    return LOOM_OK;
}

/* ------------------------------------------- which ranks did not arrive
 *
 * No transport can tell which ranks never reached an op, so a rank that
 * waits long on one says in the bootstrap store how far it got on the
 * group: key late/<group id>/<world rank> holds how many collectives it
 * posted there plus one (0: it never reported). The rank whose wait times
 * out reads the others' and names the ranks that did not arrive, the same
 * way whatever the backend. */

static void late_key(const loom_group *g, int member, char *key, size_t cap)
{
    snprintf(key, cap, "late/%s/%d", g->id, g->world_ranks[member]);
}

/* LOOM_OK, LOOM_ERR_NOT_SUPPORTED without a store (a world of one), or
 * LOOM_ERR_REMOTE when it is unreachable. */
static int report_arrival(loom_group *g)
{
    loom_store *store = loom_runtime_store(g->rt);
    if (!store)
        return LOOM_ERR_NOT_SUPPORTED;
    int64_t mine = (int64_t)atomic_load(&g->collectives) + 1, cur = 0;
    char key[160];
    late_key(g, g->rank, key, sizeof key);
    if (loom_store_add(store, key, 0, &cur) != LOOM_OK ||
        (cur < mine && loom_store_add(store, key, mine - cur, &cur) != LOOM_OK))
        return LOOM_ERR_REMOTE;
    return LOOM_OK;
}

void loom_group_comm_waiting(const loom_host *host, loom_comm *comm)
{
    (void)host;
    pthread_mutex_lock(&backed_lock);
    /* comm is a group's backend communicator, or one a wrapper forwards to */
    loom_group *g = backed_groups;
    while (g && g->comm != comm)
        g = g->next_backed;
    if (!g)
        for (g = backed_groups; g; g = g->next_backed)
            if (loom_runtime_comm_forwards_to(g->rt, g->plugin, g->comm, comm))
                break;
    if (g)
        atomic_store(&g->reports_while_waiting, 1);
    pthread_mutex_unlock(&backed_lock);
    /* a group is destroyed only once no wait on it runs */
    if (g)
        report_arrival(g);
}

static void name_member(const loom_group *g, int member, char *buf, size_t cap)
{
    if (g->is_world)
        snprintf(buf, cap, "%d", member);
    else
        snprintf(buf, cap, "%d (world rank %d)", member, g->world_ranks[member]);
}

/* One round of reading the reports of the members not yet known to have
 * reached collective #seq into got[]. Returns how many are still short, or
 * -1 if the store could not be read. */
static int read_reports(const loom_group *g, uint64_t seq, int64_t *got)
{
    loom_store *store = loom_runtime_store(g->rt);
    int missing = 0;
    for (int m = 0; m < g->size; m++) {
        if (m == g->rank || got[m] >= (int64_t)seq + 1)
            continue;
        char key[160];
        late_key(g, m, key, sizeof key);
        int64_t v = 0;
        if (loom_store_add(store, key, 0, &v) != LOOM_OK)
            return -1;
        if ((got[m] = v) < (int64_t)seq + 1)
            missing++;
    }
    return missing;
}

/* "rank 1 did not arrive; ranks 2, 3 (at #4) are still in earlier
 * operations of this group": silent ranks are the suspects; ranks that
 * reported an earlier op are alive but stuck behind (often waiting on the
 * silent ones). */
static void name_missing(const loom_group *g, uint64_t seq, const int64_t *got, char *why,
                         size_t cap)
{
    size_t len = 0;
    int silent = 0, behind = 0;
    for (int m = 0; m < g->size; m++)
        if (m != g->rank && got[m] < (int64_t)seq + 1) {
            if (got[m] > 0)
                behind++;
            else
                silent++;
        }
    for (int pass = 0; pass < 2 && len < cap; pass++) {
        int count = pass == 0 ? silent : behind, k = 0;
        if (count == 0)
            continue;
        if (len > 0 && len < cap)
            len += (size_t)snprintf(why + len, cap - len, "; ");
        if (len < cap)
            len += (size_t)snprintf(why + len, cap - len, "rank%s ", count > 1 ? "s" : "");
        for (int m = 0; m < g->size && len < cap; m++) {
            if (m == g->rank || got[m] >= (int64_t)seq + 1 || (got[m] > 0) != pass)
                continue;
            char nm[64];
            name_member(g, m, nm, sizeof nm);
            len += (size_t)snprintf(why + len, cap - len, "%s%s", k++ ? ", " : "", nm);
            if (pass == 1 && len < cap)
                len += (size_t)snprintf(why + len, cap - len, " (at #%lld)", (long long)got[m] - 1);
        }
        if (len < cap)
            len += (size_t)snprintf(why + len, cap - len, "%s",
                                    pass == 0   ? " did not arrive"
                                    : count > 1 ? " are still in earlier operations of this group"
                                                : " is still in an earlier operation of this group");
    }
}

static double now_s(void) { return (double)loom_now_ns() / 1e9; }

/* The store runs on a thread of rank 0, so when it does not answer, rank 0
 * as a whole does not run: that rank is named, not "unknown". */
static const char rank0_silent[] =
    "rank 0 does not answer (the ranks report to it while they wait): it is stopped, hung or "
    "gone, and may be the rank that did not arrive; whether the others did is unknown";

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Why collective #seq of g timed out. Reports this rank's arrival first,
 * then gives the others the grace to report too: a rank that posted the op
 * but started waiting on it more than the grace later is named although it
 * arrived. A backend that reports while it waits has its ranks' reports in
 * long before anyone times out, so a quarter of the timeout is enough. */
static void diagnose_collective(loom_group *g, uint64_t seq, char *why, size_t cap)
{
    int st = report_arrival(g);
    if (st == LOOM_ERR_NOT_SUPPORTED) {
        snprintf(why, cap, "no bootstrap store to ask which ranks arrived");
        return;
    }
    if (st != LOOM_OK) {
        snprintf(why, cap, "%s", rank0_silent);
        return;
    }
    int64_t *got = calloc((size_t)g->size, sizeof *got);
    if (!got) {
        snprintf(why, cap, "out of memory while asking which ranks arrived");
        return;
    }
    double grace_s = g->grace_s, quarter = loom_runtime_timeout(g->rt) / 4;
    if (atomic_load(&g->reports_while_waiting) && grace_s > quarter)
        grace_s = quarter;
    double deadline = now_s() + grace_s;
    int missing = 0, rounds = 0, lost = 0;
    for (;; rounds++) {
        int now_missing = read_reports(g, seq, got);
        lost = now_missing < 0;
        if (lost) /* keep what the earlier rounds found */
            break;
        missing = now_missing;
        if (missing == 0 || now_s() >= deadline)
            break;
        sleep_s(0.05);
    }
    if (lost && rounds == 0) {
        snprintf(why, cap, "%s", rank0_silent);
    } else if (missing == 0) {
        snprintf(why, cap, "every rank reached it and is waiting too: the ranks called different "
                           "operations, counts, dtypes or roots at this point");
    } else {
        name_missing(g, seq, got, why, cap);
        size_t len = strnlen(why, cap);
        if (lost && len < cap)
            snprintf(why + len, cap - len,
                     " (rank 0 went away while the ranks reported)");
    }
    free(got);
}

/* Why a send or a receive to or from peer on g timed out: the peer did not
 * post its side. Reports this rank's arrival first, so a peer stuck in a
 * collective of g can tell. */
static void diagnose_p2p(loom_group *g, int peer, int is_send, char *why, size_t cap)
{
    char key[160], nm[64];
    int64_t theirs = 0;
    int st = report_arrival(g);
    if (st == LOOM_OK) {
        late_key(g, peer, key, sizeof key);
        if (loom_store_add(loom_runtime_store(g->rt), key, 0, &theirs) != LOOM_OK)
            st = LOOM_ERR_REMOTE;
    }
    if (st == LOOM_ERR_REMOTE) {
        snprintf(why, cap, "%s", rank0_silent);
        return;
    }
    name_member(g, peer, nm, sizeof nm);
    snprintf(why, cap, "rank %s %s%s", nm,
             is_send ? "did not post the matching recv" : "did not send the matching message",
             theirs > 0 ? " (it timed out on this group too: mismatched sends and recvs?)" : "");
}

/* The first timeout of a process shows its last operations, unless
 * `loom launch` reads them from its table and tells the whole story. */
static void dump_once(void)
{
    static atomic_flag dumped = ATOMIC_FLAG_INIT;
    if (!loom_flight_shared() && !atomic_flag_test_and_set(&dumped))
        loom_flight_write(STDERR_FILENO, "a timeout");
}

/* A backend's wait or test said the op timed out: add which ranks did not
 * arrive to its message. Once a collective timed out the group is failed
 * and the requests still in flight fail with it, for the same reason. */
static int timed_out(loom_request *r)
{
    loom_group *g = r->group;
    char said[2048], why[sizeof g->timeout_why];
    snprintf(said, sizeof said, "%s", loom_last_error());
    /* before the diagnosis: a stopped rank 0 must not hold it a timeout more */
    note_op_failed(g);
    loom_flight_mark(g->flight, r->ticket, LOOM_FLIGHT_FAILED);
    dump_once();
    pthread_mutex_lock(&backed_lock); /* requests of g may be waited on from several threads */
    snprintf(why, sizeof why, "%s", g->timeout_why);
    pthread_mutex_unlock(&backed_lock);
    if (!why[0] && is_p2p(r->op)) {
        diagnose_p2p(g, r->peer, r->op == LOOM_OP_SEND, why, sizeof why);
    } else if (!why[0]) {
        diagnose_collective(g, r->seq, why, sizeof why);
        pthread_mutex_lock(&backed_lock);
        snprintf(g->timeout_why, sizeof g->timeout_why, "%s", why);
        pthread_mutex_unlock(&backed_lock);
    }
    return loom_fail(LOOM_ERR_TIMEOUT, "%s: %s", said, why);
}

static void finished(loom_request *r)
{
    if (!r->complete) /* else traced at issue */
        loom_trace_span(LOOM_LANE_COMM, loom_comm_op_name(r->op), r->start_ns, span_clock(),
                        r->bytes);
    request_release(r);
}

static int g_test(loom_request *r)
{
    int rc = check_request(r, "test");
    if (rc != LOOM_OK)
        return rc;
    if (r->complete) {
        finished(r);
        return LOOM_OK;
    }
    if (r->self_done)
        rc = *r->self_done ? LOOM_OK : LOOM_IN_PROGRESS;
    else if ((rc = r->group->ops->test(r->inner)) == LOOM_ERR_TIMEOUT)
        rc = timed_out(r);
    /* After an error the transport may still write the staging blocks:
     * they are left to it, as the caller leaves its buffers. */
    if (rc == LOOM_OK)
        rc = unstage(r->op, &r->stage);
    if (rc != LOOM_IN_PROGRESS) {
        loom_flight_mark(r->group->flight, r->ticket,
                         rc == LOOM_OK ? LOOM_FLIGHT_COMPLETED : LOOM_FLIGHT_FAILED);
        if (rc != LOOM_OK)
            note_op_failed(r->group);
        finished(r);
    }
    return rc;
}

static int g_wait(loom_request *r)
{
    int rc = check_request(r, "wait");
    if (rc != LOOM_OK)
        return rc;
    if (r->complete) {
        finished(r);
        return LOOM_OK;
    }
    loom_flight_group *fg = r->group->flight;
    loom_flight_mark(fg, r->ticket, LOOM_FLIGHT_WAITING);
    if (r->self_done)
        rc = *r->self_done ? LOOM_OK
                           : loom_fail(LOOM_ERR_TIMEOUT,
                                       "comm: self recv waits for a send this rank never posted");
    else if ((rc = r->group->ops->wait(r->inner)) == LOOM_ERR_TIMEOUT)
        rc = timed_out(r);
    if (rc == LOOM_OK) /* after an error, as in g_test */
        rc = unstage(r->op, &r->stage);
    loom_flight_mark(fg, r->ticket, rc == LOOM_OK ? LOOM_FLIGHT_COMPLETED : LOOM_FLIGHT_FAILED);
    if (rc != LOOM_OK)
        note_op_failed(r->group);
    finished(r);
    return rc;
}

/* Split: every rank's (colour, key) over the parent, then each rank's own
 * list: its colour's members by key, ties by parent rank, so every member
 * computes the same list and the parent's subgroup creation does the rest
 * on any backend. The exchange is counted like any allgather of parent. */
/* Every member's (colour, key) into all. Through the group itself where its
 * backend takes host memory; else (NCCL reads device buffers only) through
 * the bootstrap store, under keys that name the parent and its split count,
 * which every member advances in the same order. */
static int exchange_colours(loom_group *parent, const int mine[2], int *all)
{
    int n = parent->size;
    if (n == 1) {
        all[0] = mine[0];
        all[1] = mine[1];
        return LOOM_OK;
    }
    if (parent->mem_kinds & LOOM_MEM_BIT(LOOM_MEM_HOST)) {
        loom_request *req = NULL;
        int rc = g_allgather(parent, mine, all, 2, LOOM_I32, &req);
        return rc == LOOM_OK ? g_wait(req) : rc;
    }
    loom_store *store = loom_runtime_store(parent->rt);
    if (!store)
        return loom_fail(LOOM_ERR_INTERNAL,
                         "comm: split of %s: no bootstrap store to exchange colours through",
                         parent->name);
    unsigned split = parent->splits_made++;
    char key[160];
    snprintf(key, sizeof key, "split/%s/%u/%d", parent->id, split, parent->rank);
    int rc = loom_store_put(store, key, mine, 2 * sizeof *mine);
    for (int r = 0; rc == LOOM_OK && r < n; r++) {
        size_t len = 0;
        snprintf(key, sizeof key, "split/%s/%u/%d", parent->id, split, r);
        rc = loom_store_get(store, key, all + 2 * r, 2 * sizeof *all, &len,
                            loom_runtime_timeout(parent->rt));
        if (rc == LOOM_OK && len != 2 * sizeof *all)
            rc = loom_fail(LOOM_ERR_INTERNAL, "comm: split of %s: rank %d's colour is %zu bytes",
                           parent->name, r, len);
    }
    return rc;
}

static int g_split(loom_group *parent, int colour, int key, loom_group **out)
{
    if (!parent || !out)
        return loom_fail(LOOM_ERR_INVALID, "comm: split needs a parent group and an out pointer");
    *out = NULL;
    if (parent->destroyed)
        return refuse_destroyed(parent, "split");
    int n = parent->size, mine[2] = {colour, key};
    int *all = malloc((size_t)n * 2 * sizeof *all), *list = malloc((size_t)n * sizeof *list);
    if (!all || !list) {
        free(all);
        free(list);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    int rc = exchange_colours(parent, mine, all);
    /* Every rank sees every colour, so all refuse a negative one alike. */
    for (int r = 0; rc == LOOM_OK && r < n; r++)
        if (all[2 * r] < 0)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "comm: split: rank %d of the group passed colour %d; colours must be "
                           ">= 0 (every rank joins one subgroup)",
                           r, all[2 * r]);
    int count = 0;
    for (int r = 0; rc == LOOM_OK && r < n; r++) {
        if (all[2 * r] != colour)
            continue;
        int at = count++; /* insertion sort by (key, parent rank): r only grows */
        while (at > 0 && all[2 * list[at - 1] + 1] > all[2 * r + 1]) {
            list[at] = list[at - 1];
            at--;
        }
        list[at] = r;
    }
    if (rc == LOOM_OK)
        rc = loom_group_subgroup(parent, list, count, out);
    free(all);
    free(list);
    if (rc != LOOM_OK)
        return rc;
    char name[32];
    snprintf(name, sizeof name, "%.16s.split", loom_group_name(parent));
    loom_group_set_name(*out, name);
    (*out)->split_parent = parent;
    (*out)->next_split_child = parent->split_children;
    parent->split_children = *out;
    return LOOM_OK;
}

const loom_comm_api loom_core_comm_api = {
    .struct_size = sizeof(loom_comm_api),
    .rank = g_rank,
    .size = g_size,
    .backend = g_backend,
    .allreduce = g_allreduce,
    .broadcast = g_broadcast,
    .reduce = g_reduce,
    .allgather = g_allgather,
    .reducescatter = g_reducescatter,
    .alltoall = g_alltoall,
    .send = g_send,
    .recv = g_recv,
    .barrier = g_barrier,
    .group_start = g_group_start,
    .group_end = g_group_end,
    .test = g_test,
    .wait = g_wait,
    .split = g_split,
};

/* The rule of plugins built before ABI 1.10: an op complete at issue
 * hands back NULL, and wait and test take NULL as complete. */
static int old_rule(int rc, loom_request **req)
{
    if (rc == LOOM_OK && (*req)->complete) {
        request_release(*req);
        *req = NULL;
    }
    return rc;
}

static int g_allreduce_v1_9(loom_group *g, const void *send, void *recv, size_t count,
                            loom_dtype dtype, loom_redop op, loom_request **req)
{
    return old_rule(g_allreduce(g, send, recv, count, dtype, op, req), req);
}

static int g_broadcast_v1_9(loom_group *g, void *buf, size_t count, loom_dtype dtype, int root,
                            loom_request **req)
{
    return old_rule(g_broadcast(g, buf, count, dtype, root, req), req);
}

static int g_reduce_v1_9(loom_group *g, const void *send, void *recv, size_t count,
                         loom_dtype dtype, loom_redop op, int root, loom_request **req)
{
    return old_rule(g_reduce(g, send, recv, count, dtype, op, root, req), req);
}

static int g_allgather_v1_9(loom_group *g, const void *send, void *recv, size_t count,
                            loom_dtype dtype, loom_request **req)
{
    return old_rule(g_allgather(g, send, recv, count, dtype, req), req);
}

static int g_reducescatter_v1_9(loom_group *g, const void *send, void *recv, size_t count,
                                loom_dtype dtype, loom_redop op, loom_request **req)
{
    return old_rule(g_reducescatter(g, send, recv, count, dtype, op, req), req);
}

static int g_alltoall_v1_9(loom_group *g, const void *send, void *recv, size_t count,
                           loom_dtype dtype, loom_request **req)
{
    return old_rule(g_alltoall(g, send, recv, count, dtype, req), req);
}

static int g_send_v1_9(loom_group *g, const void *buf, size_t count, loom_dtype dtype, int peer,
                       int tag, loom_request **req)
{
    return old_rule(g_send(g, buf, count, dtype, peer, tag, req), req);
}

static int g_recv_v1_9(loom_group *g, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                       loom_request **req)
{
    return old_rule(g_recv(g, buf, count, dtype, peer, tag, req), req);
}

static int g_barrier_v1_9(loom_group *g, loom_request **req)
{
    return old_rule(g_barrier(g, req), req);
}

static int g_test_v1_9(loom_request *r)
{
    return r ? g_test(r) : LOOM_OK;
}

static int g_wait_v1_9(loom_request *r)
{
    return r ? g_wait(r) : LOOM_OK;
}

const loom_comm_api loom_core_comm_api_v1_9 = {
    .struct_size = sizeof(loom_comm_api),
    .rank = g_rank,
    .size = g_size,
    .backend = g_backend,
    .allreduce = g_allreduce_v1_9,
    .broadcast = g_broadcast_v1_9,
    .reduce = g_reduce_v1_9,
    .allgather = g_allgather_v1_9,
    .reducescatter = g_reducescatter_v1_9,
    .alltoall = g_alltoall_v1_9,
    .send = g_send_v1_9,
    .recv = g_recv_v1_9,
    .barrier = g_barrier_v1_9,
    .group_start = g_group_start,
    .group_end = g_group_end,
    .test = g_test_v1_9,
    .wait = g_wait_v1_9,
    .split = g_split,
};

double loom_comm_bus_factor(loom_comm_op op, int n)
{
    switch (op) {
    case LOOM_OP_ALLREDUCE: return 2.0 * (n - 1) / n;
    case LOOM_OP_REDUCESCATTER:
    case LOOM_OP_ALLGATHER:
    case LOOM_OP_ALLTOALL: return (double)(n - 1) / n;
    case LOOM_OP_BROADCAST:
    case LOOM_OP_REDUCE:
    case LOOM_OP_SEND:
    case LOOM_OP_RECV: return 1;
    default: return 0;
    }
}
