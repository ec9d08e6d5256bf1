/* comm-ucx — schedules: how every operation runs.
 *
 * An operation (a collective, or one send or receive) is a list of ops —
 * send, receive, reduce, copy, divide — each waiting for the ops it depends
 * on. Builders (ucx_coll_*.c) lay the list out at issue time; advancing a
 * request posts every op whose dependencies are done and checks the posted
 * ones, so a collective is a state machine that moves whenever anybody
 * advances it: test, wait, or the progress thread. Every wait advances every
 * active request of the process, so operations on different groups, or
 * several outstanding on one group, complete in any order.
 *
 * Tags. UCX matches a receive by tag alone, so the 64-bit tag carries all
 * that must not collide:
 *   63..50  communicator (its job-unique id, 14 bits)
 *   49..34  sender's rank in the group (16 bits)
 *   33      1 = collective, 0 = send/recv
 *   collective: 32..21 sequence number (12 bits), 20..12 step (9 bits),
 *               11..0 chunk (12 bits)
 *   send/recv:  32..0 the user's tag
 * Fields wrap: two messages share a tag only when one group has 4096
 * collectives outstanding, or a ring has more than 512 steps, or a block
 * more than 4096 chunks — and then UCX's in-order matching between two
 * workers still pairs them right, because both sides post in the same
 * order. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/reduce.h"
#include "ucx_internal.h"

#define TAG_COMM_SHIFT 50
#define TAG_SRC_SHIFT 34
#define TAG_COLL_BIT (1ull << 33)
#define TAG_SEQ_SHIFT 21
#define TAG_STEP_SHIFT 12

static inline uint64_t tag_of(const loom_comm_request *r, int src, const sop *o)
{
    const loom_comm *c = r->comm;
    uint64_t t = (c->tag_id & 0x3fffull) << TAG_COMM_SHIFT;
    t |= ((uint64_t)src & 0xffffull) << TAG_SRC_SHIFT;
    if (!r->collective)
        return t | ((uint64_t)r->call.tag & 0x1ffffffffull);
    return t | TAG_COLL_BIT | ((r->seq & 0xfffull) << TAG_SEQ_SHIFT) |
           (((uint64_t)o->step & 0x1ffull) << TAG_STEP_SHIFT) | ((uint64_t)o->chunk & 0xfffull);
}

/* -------------------------------------------------------------- scratch */

/* Buffers for intermediate data, kept by the process after use: a fresh
 * 64 MiB allocation per collective would cost more in page faults than the
 * transfer itself. */
struct scratch_buf {
    struct scratch_buf *next;
    size_t size;
    char pad[48];
    char data[]; /* 64-byte aligned */
};

_Static_assert(offsetof(struct scratch_buf, data) % 64 == 0, "scratch data must be 64-byte aligned");

#define SCRATCH_CACHE_MAX ((size_t)1 << 30)

static struct scratch_buf *scratch_get(size_t bytes)
{
    struct scratch_buf **best = NULL;
    for (struct scratch_buf **p = &ucx.scratch_free; *p; p = &(*p)->next)
        if ((*p)->size >= bytes && (!best || (*p)->size < (*best)->size))
            best = p;
    if (best && (*best)->size <= 4 * bytes + 65536) {
        struct scratch_buf *b = *best;
        *best = b->next;
        ucx.scratch_cached -= b->size;
        return b;
    }
    void *mem = NULL;
    if (posix_memalign(&mem, 64, sizeof(struct scratch_buf) + bytes) != 0)
        return NULL;
    struct scratch_buf *b = mem;
    b->next = NULL;
    b->size = bytes;
    return b;
}

static void scratch_put(struct scratch_buf *b)
{
    if (ucx.scratch_cached + b->size > SCRATCH_CACHE_MAX) {
        free(b);
        return;
    }
    b->next = ucx.scratch_free;
    ucx.scratch_free = b;
    ucx.scratch_cached += b->size;
}

void scratch_release_all(void)
{
    for (struct scratch_buf *b = ucx.scratch_free, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    ucx.scratch_free = NULL;
    ucx.scratch_cached = 0;
}

void *sched_scratch(loom_comm_request *r, size_t bytes)
{
    if (r->build_failed)
        return NULL;
    size_t rounded = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    if (rounded <= REQ_INLINE_SCRATCH - r->inline_used) {
        void *p = r->inline_scratch + r->inline_used;
        r->inline_used += rounded;
        return p;
    }
    if (r->nscratch == REQ_SCRATCH_MAX) {
        r->build_failed = 1;
        return NULL;
    }
    struct scratch_buf *b = scratch_get(bytes ? bytes : 1);
    if (!b) {
        r->build_failed = 1;
        return NULL;
    }
    r->scratch[r->nscratch++] = b;
    return b->data;
}

/* ------------------------------------------------------------- building */

int sched_grow_ops(loom_comm_request *r)
{
    int cap = r->cap_ops ? 2 * r->cap_ops : 16;
    sop *ops = realloc(r->ops, (size_t)cap * sizeof *ops);
    if (!ops) {
        r->build_failed = 1;
        return -1;
    }
    r->ops = ops;
    r->cap_ops = cap;
    return 0;
}

int sched_grow_deps(loom_comm_request *r)
{
    int cap = r->cap_deps ? 2 * r->cap_deps : 32;
    struct sdep *d = realloc(r->deps, (size_t)cap * sizeof *d);
    if (!d) {
        r->build_failed = 1;
        return -1;
    }
    r->deps = d;
    r->cap_deps = cap;
    return 0;
}

int slots_init(loom_comm_request *r, slot_ring *s, size_t elems)
{
    return slots_init_depth(r, s, elems, r->comm->set.pipeline_depth);
}

int slots_init_depth(loom_comm_request *r, slot_ring *s, size_t elems, int depth)
{
    size_t slot_bytes = elems * loom_dtype_size(r->call.dtype);
    int count = depth;
    if (count < 1)
        count = 1;
    if (count > SLOTS_MAX)
        count = SLOTS_MAX;
    s->slot_bytes = slot_bytes;
    s->count = count;
    s->next = 0;
    s->taken = 0;
    for (int i = 0; i < SLOTS_MAX; i++)
        s->last_use[i] = -1;
    s->base = sched_scratch(r, slot_bytes * (size_t)count);
    return s->base ? LOOM_OK : LOOM_ERR_NO_MEMORY;
}

char *slots_take(slot_ring *s, int *dep)
{
    s->taken = s->next++ % s->count;
    *dep = s->last_use[s->taken];
    return s->base ? s->base + (size_t)s->taken * s->slot_bytes : NULL;
}

void slots_used(slot_ring *s, int op)
{
    if (op >= 0)
        s->last_use[s->taken] = op;
}

void slots_used_idx(slot_ring *s, int idx, int op)
{
    if (op >= 0 && idx >= 0 && idx < s->count)
        s->last_use[idx] = op;
}

void send_chunks(loom_comm_request *r, int peer, const void *buf, size_t es, size_t off,
                 size_t len, size_t ce, int step, int dep)
{
    for (int k = 0; k < nchunks(len, ce); k++) {
        size_t o = off + (size_t)k * ce, l = len - (size_t)k * ce < ce ? len - (size_t)k * ce : ce;
        int s = sched_send(r, peer, (const char *)buf + o * es, l * es, step, k);
        sched_after(r, s, dep);
    }
}

void recv_chunks(loom_comm_request *r, int peer, void *buf, size_t es, size_t off, size_t len,
                 size_t ce, int step, int dep)
{
    for (int k = 0; k < nchunks(len, ce); k++) {
        size_t o = off + (size_t)k * ce, l = len - (size_t)k * ce < ce ? len - (size_t)k * ce : ce;
        int v = sched_recv(r, peer, (char *)buf + o * es, l * es, step, k);
        sched_after(r, v, dep);
    }
}

void recv_reduce_chunks(loom_comm_request *r, int peer, slot_ring *sl, void *dst,
                        const void *src, size_t es, size_t off, size_t len, size_t ce, int step,
                        int dep)
{
    for (int k = 0; k < nchunks(len, ce); k++) {
        size_t o = off + (size_t)k * ce, l = len - (size_t)k * ce < ce ? len - (size_t)k * ce : ce;
        int free_dep;
        char *t = slots_take(sl, &free_dep);
        int v = sched_recv(r, peer, t, l * es, step, k);
        sched_after(r, v, free_dep);
        int d = sched_reduce(r, (char *)dst + o * es, t, (const char *)src + o * es, l);
        sched_after(r, d, v);
        sched_after(r, d, dep);
        slots_used(sl, d);
    }
}

int join_since(loom_comm_request *r, int first)
{
    int last = r->nops;
    if (last - first <= 1) /* nothing or one op to wait for: itself stands for the join */
        return last > first ? first : -1;
    int j = sched_join(r);
    for (int i = first; i < last; i++)
        sched_after(r, j, i);
    return j;
}

int peer_behind(const loom_comm_request *r, int s)
{
    return mod(r->comm->group.rank - s, r->comm->group.size);
}

void sum_from_peers(loom_comm_request *r, int (*peer)(const loom_comm_request *r, int s),
                    slot_ring *sl, char *sum, const char *own, size_t off, size_t len, size_t ce)
{
    int n = r->comm->group.size;
    size_t es = loom_dtype_size(r->call.dtype);
    for (int k = 0; k < nchunks(len, ce); k++) {
        size_t o = off + (size_t)k * ce, l = chunk_len(len, k, ce);
        int last = -1;
        for (int s = 1; s < n; s++) {
            int free_dep;
            char *t = slots_take(sl, &free_dep);
            int rv = sched_recv(r, peer(r, s), t, l * es, 0, k);
            sched_after(r, rv, free_dep);
            int rd = sched_reduce(r, sum + o * es, t, (s == 1 ? own : sum) + o * es, l);
            sched_after(r, rd, rv);
            sched_after(r, rd, last);
            slots_used(sl, rd);
            last = rd;
        }
        if (r->call.redop == LOOM_AVG) {
            int d = sched_divide(r, sum + o * es, l);
            sched_after(r, d, last);
        }
    }
}

/* ------------------------------------------------------------- messages */

void ucx_req_describe(const loom_comm_request *r, char *buf, size_t cap)
{
    group_describe_op(r->comm ? &r->comm->group : NULL, loom_comm_op_name(r->call.op), r->seq,
                      r->call.peer, r->call.tag, buf, cap);
}

static void active_unlink(loom_comm_request *r)
{
    if (!r->active)
        return;
    if (r->aprev)
        r->aprev->anext = r->anext;
    else
        ucx.active_head = r->anext;
    if (r->anext)
        r->anext->aprev = r->aprev;
    else
        ucx.active_tail = r->aprev;
    r->anext = r->aprev = NULL;
    r->active = 0;
    ucx.nactive--;
}

void sched_cancel(loom_comm_request *r)
{
    for (int i = r->low; i < r->nops; i++) {
        sop *o = &r->ops[i];
        if (o->state != SOP_POSTED || !o->ucx)
            continue;
        /* A receive can be taken back; a send cannot, and UCX finishes or
         * drops it on its own (its group is failed by then). */
        if (o->kind == SOP_RECV && ucx.worker)
            ucp_request_cancel(ucx.worker, o->ucx);
        ucp_request_free(o->ucx);
        o->ucx = NULL;
        o->state = SOP_DONE;
    }
}

void sched_fail(loom_comm_request *r, int status, const char *fmt, ...)
{
    if (r->status != LOOM_IN_PROGRESS)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    r->status = status;
    sched_cancel(r);
    active_unlink(r);
}

/* "step 1 of ring" or "" for a send or receive. */
static void step_text(const loom_comm_request *r, const sop *o, char *buf, size_t cap)
{
    if (r->collective && r->algo)
        snprintf(buf, cap, " (step %d of %s)", o->step, r->algo);
    else
        buf[0] = '\0';
}

static int ucx_to_loom(ucs_status_t s)
{
    switch (s) {
    case UCS_ERR_MESSAGE_TRUNCATED: return LOOM_ERR_INVALID;
    case UCS_ERR_NO_MEMORY: return LOOM_ERR_NO_MEMORY;
    default: return LOOM_ERR_REMOTE;
    }
}

static void op_failed(loom_comm_request *r, const sop *o, ucs_status_t s, size_t got)
{
    char what[400], nm[64], step[96];
    ucx_req_describe(r, what, sizeof what);
    group_name_rank(&r->comm->group, o->peer, nm, sizeof nm);
    step_text(r, o, step, sizeof step);
    int is_send = o->kind == SOP_SEND;
    if (s == UCS_ERR_MESSAGE_TRUNCATED || (s == UCS_OK && got != o->n)) {
        if (r->collective)
            sched_fail(r, LOOM_ERR_INVALID,
                       "comm-ucx: %s: rank %s sent %s bytes (%zu) where %zu were expected%s: the ranks "
                       "called this collective with different counts, dtypes or roots",
                       what, nm, s == UCS_OK ? "fewer" : "more", got, o->n, step);
        else
            sched_fail(r, LOOM_ERR_INVALID,
                       "comm-ucx: %s: expected %zu bytes, rank %s sent %s", what, o->n, nm,
                       s == UCS_OK ? "fewer" : "more");
    } else {
        r->dead_world = r->comm->group.world_ranks[o->peer];
        sched_fail(r, ucx_to_loom(s), "comm-ucx: %s: %s rank %s failed%s: %s", what,
                   is_send ? "sending to" : "receiving from", nm, step, ucs_status_string(s));
        ucx.failed = 1; /* the teardown must not wait to flush messages to it */
    }
    /* A collective that broke half way leaves the group out of step. */
    if (r->collective && r->comm)
        ucx_comm_fail(r->comm, r->status, r->error);
}

/* ------------------------------------------------------------- running */

static int deps_done(loom_comm_request *r, sop *o)
{
    while (o->dep_head >= 0) {
        if (r->ops[r->deps[o->dep_head].op].state != SOP_DONE)
            return 0;
        o->dep_head = r->deps[o->dep_head].next;
    }
    return 1;
}

static void op_check(loom_comm_request *r, sop *o);

/* UCX calls these inside ucp_worker_progress when one of our sends or
 * receives finishes, so sched_progress_all knows to stop draining events
 * and look at the requests. */
static void send_done(void *request, ucs_status_t status, void *arg)
{
    (void)request, (void)status, (void)arg;
    ucx.completions++;
}

static void recv_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                      void *arg)
{
    (void)request, (void)status, (void)info, (void)arg;
    ucx.completions++;
}

static void op_start(loom_comm_request *r, sop *o)
{
    loom_comm *c = r->comm;
    switch (o->kind) {
    case SOP_SEND: {
        static const ucp_request_param_t counted = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
                                                    .cb.send = send_done};
        ucx_peer *p = &ucx.peers[c->group.world_ranks[o->peer]];
        ucs_status_ptr_t st = ucp_tag_send_nbx(p->ep, o->a, o->n, tag_of(r, c->group.rank, o), &counted);
        if (st == NULL) {
            o->state = SOP_DONE;
        } else if (UCS_PTR_IS_ERR(st)) {
            op_failed(r, o, UCS_PTR_STATUS(st), 0);
        } else {
            o->ucx = st;
            o->state = SOP_POSTED;
        }
        break;
    }
    case SOP_RECV: {
        /* Always a request: UCX 1.13 leaves recv_info unfilled on some
         * immediate completions, and the received length must be checked. */
        static const ucp_request_param_t always_request = {
            .op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL | UCP_OP_ATTR_FIELD_CALLBACK,
            .cb.recv = recv_done};
        ucs_status_ptr_t st =
            ucp_tag_recv_nbx(ucx.worker, o->dst, o->n, tag_of(r, o->peer, o), ~0ull, &always_request);
        if (UCS_PTR_IS_ERR(st)) {
            op_failed(r, o, UCS_PTR_STATUS(st), 0);
        } else {
            o->ucx = st;
            o->state = SOP_POSTED;
            op_check(r, o);
        }
        break;
    }
    case SOP_REDUCE:
        reduce_elements(o->dst, o->a, o->b, o->n, r->call.dtype, r->call.redop);
        o->state = SOP_DONE;
        break;
    case SOP_COPY:
        if (o->dst != o->a && o->n)
            memmove(o->dst, o->a, o->n);
        o->state = SOP_DONE;
        break;
    case SOP_DIVIDE:
        divide_elements(o->dst, o->n, r->call.dtype, c->group.size);
        o->state = SOP_DONE;
        break;
    default:
        o->state = SOP_DONE;
        break;
    }
}

static void op_check(loom_comm_request *r, sop *o)
{
    ucs_status_t s;
    size_t got = o->n;
    if (o->kind == SOP_RECV) {
        ucp_tag_recv_info_t info = {0};
        s = ucp_tag_recv_request_test(o->ucx, &info);
        got = info.length;
    } else {
        s = ucp_request_check_status(o->ucx);
    }
    if (s == UCS_INPROGRESS)
        return;
    ucp_request_free(o->ucx);
    o->ucx = NULL;
    if (s == UCS_OK && got == o->n)
        o->state = SOP_DONE;
    else
        op_failed(r, o, s, got);
}

/* One pass over the request's ops; returns how many finished. */
static int advance(loom_comm_request *r)
{
    /* A pass can change something only after a send or receive of ours
     * finished (the callbacks count them) or after the last pass finished
     * an op, which may have freed others to start: a wait's empty polls
     * skip the walk over the ops. */
    if (!r->moved && r->completions_seen == ucx.completions)
        return 0;
    r->completions_seen = ucx.completions;
    int finished = 0;
    for (int i = r->low; i < r->nops && r->status == LOOM_IN_PROGRESS; i++) {
        sop *o = &r->ops[i];
        if (o->state == SOP_DONE)
            continue;
        if (o->state == SOP_POSTED)
            op_check(r, o);
        else if (deps_done(r, o))
            op_start(r, o);
        finished += o->state == SOP_DONE;
    }
    /* ops past low may be done while low waits: catch up */
    while (r->low < r->nops && r->ops[r->low].state == SOP_DONE)
        r->low++;
    if (r->status == LOOM_IN_PROGRESS && r->low == r->nops) {
        r->status = LOOM_OK;
        active_unlink(r);
    }
    r->moved = finished > 0;
    return finished;
}

void sched_activate(loom_comm_request *r)
{
    r->status = LOOM_IN_PROGRESS;
    r->active = 1;
    r->anext = NULL;
    r->aprev = ucx.active_tail;
    if (ucx.active_tail)
        ucx.active_tail->anext = r;
    else
        ucx.active_head = r;
    ucx.active_tail = r;
    ucx.nactive++;
    /* Post the first receives and sends now, so peers find them matched. */
    r->moved = 1;
    advance(r);
    if (r->active)
        ucx_wake_progress();
}

int sched_progress_all(void)
{
    /* Drain UCX's events, but stop at one that finished a send or receive
     * of ours: each further call costs ~250 instructions (every transport
     * polled) before the request that waits sees its message. */
    int events = 0;
    unsigned completions = ucx.completions;
    for (int k = 0; k < 16 && completions == ucx.completions; k++) {
        unsigned n = ucp_worker_progress(ucx.worker);
        if (n == 0)
            break;
        events += (int)n;
    }
    for (loom_comm_request *r = ucx.active_head, *next; r; r = next) {
        next = r->anext;
        events += advance(r);
    }
    return events;
}

void sched_check_peers(loom_comm_request *r)
{
    if (r->status != LOOM_IN_PROGRESS || !r->comm)
        return;
    for (int i = r->low; i < r->nops; i++) {
        sop *o = &r->ops[i];
        if ((o->kind != SOP_RECV && o->kind != SOP_SEND) || o->state != SOP_POSTED)
            continue;
        char why[160];
        if (!ucx_peer_dead(r->comm->group.world_ranks[o->peer], why, sizeof why))
            continue;
        char what[400], nm[64], step[96];
        ucx_req_describe(r, what, sizeof what);
        group_name_rank(&r->comm->group, o->peer, nm, sizeof nm);
        step_text(r, o, step, sizeof step);
        r->dead_world = r->comm->group.world_ranks[o->peer];
        sched_fail(r, LOOM_ERR_REMOTE, "comm-ucx: %s: rank %s failed while this rank was %s it%s: %s",
                   what, nm, o->kind == SOP_RECV ? "waiting for a message from" : "sending to",
                   step, why);
        ucx_comm_fail(r->comm, r->status, r->error);
        return;
    }
}

/* Requests are kept for reuse with their op and dependency arrays: a
 * small collective would otherwise spend as long in malloc and free as on
 * the wire. */
#define REQ_POOL_MAX 64
#define REQ_POOL_OPS_MAX 4096 /* larger arrays are freed, not kept */

void sched_free(loom_comm_request *r)
{
    sched_cancel(r);
    active_unlink(r);
    for (int i = 0; i < r->nscratch; i++)
        scratch_put(r->scratch[i]);
    r->nscratch = 0;
    if (ucx.worker && ucx.npool < REQ_POOL_MAX && r->cap_ops <= REQ_POOL_OPS_MAX &&
        r->cap_deps <= 2 * REQ_POOL_OPS_MAX) {
        r->anext = ucx.pool;
        ucx.pool = r;
        ucx.npool++;
        return;
    }
    free(r->ops);
    free(r->deps);
    free(r);
}

loom_comm_request *sched_request(void)
{
    loom_comm_request *r = ucx.pool;
    if (!r) {
        /* inline_scratch is 64-byte aligned, and so the request */
        r = aligned_alloc(_Alignof(loom_comm_request), sizeof *r);
        if (r)
            memset(r, 0, sizeof *r);
        return r;
    }
    ucx.pool = r->anext;
    ucx.npool--;
    sop *ops = r->ops;
    struct sdep *deps = r->deps;
    int cap_ops = r->cap_ops, cap_deps = r->cap_deps;
    memset(r, 0, offsetof(loom_comm_request, error));
    r->error[0] = '\0';
    memset(&r->active, 0, sizeof *r - offsetof(loom_comm_request, active));
    r->ops = ops;
    r->deps = deps;
    r->cap_ops = cap_ops;
    r->cap_deps = cap_deps;
    return r;
}

void sched_pool_release(void)
{
    for (loom_comm_request *r = ucx.pool, *next; r; r = next) {
        next = r->anext;
        free(r->ops);
        free(r->deps);
        free(r);
    }
    ucx.pool = NULL;
    ucx.npool = 0;
}
