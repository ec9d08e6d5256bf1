/* comm-ucx — shared types of the plugin's files (not installed).
 *
 * The plugin is loom's own collective engine over UCX's UCP tag matching:
 *  - ucx_wireup.c   one UCP context and worker per process, endpoints to every
 *                   rank of the world, communicators, the progress thread;
 *  - ucx_sched.c    a collective is a schedule: sends, receives and local
 *                   reductions with dependencies between them, advanced by
 *                   test/wait (and the progress thread) until all are done;
 *  - ucx_plugin.c   the vtable: argument checks, algorithm choice, test/wait,
 *                   timeouts and the messages that name the missing rank;
 *  - ucx_coll_*.c   one schedule builder per algorithm.
 * The reductions are plugins/common's (common/reduce.h).
 *
 * Locking: one process-wide mutex (ucx.lock) guards the worker, every
 * request and communicator field that changes after creation, and the
 * lists below; every UCX call is made under it, so UCX runs in serialized
 * mode (multi-threaded when the progress thread is on, as an extra guard).
 * Store I/O and sleeping happen outside it. */
#ifndef LOOM_UCX_INTERNAL_H
#define LOOM_UCX_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "common/call.h"
#include "common/group.h"
#include "loom/comm.h"

/* ------------------------------------------------------------- settings */

/* Algorithms, per op. 0 is "auto" for every op. */
enum {
    ALG_AUTO = 0,
    /* allreduce */
    AR_RECURSIVE_DOUBLING = 1,
    AR_RING,
    AR_RABENSEIFNER,
    AR_DIRECT,
    /* allgather */
    AG_RING = 1,
    AG_RECURSIVE_DOUBLING,
    AG_BRUCK,
    AG_DIRECT,
    /* reducescatter */
    RS_RING = 1,
    RS_RECURSIVE_HALVING,
    RS_DIRECT,
    /* broadcast */
    BC_BINOMIAL = 1,
    BC_CHAIN,
    BC_SCATTER_ALLGATHER,
    BC_DIRECT,
    /* reduce */
    RD_BINOMIAL = 1,
    RD_CHAIN,
    RD_DIRECT,
    RD_SCATTER_GATHER,
    /* alltoall */
    A2A_PAIRWISE = 1,
    A2A_BRUCK,
    A2A_POSTED,
    /* barrier */
    BAR_DISSEMINATION = 1,
};

/* Ops with a choice of algorithm, in the order of the settings. */
enum {
    UOP_ALLREDUCE,
    UOP_ALLGATHER,
    UOP_REDUCESCATTER,
    UOP_BROADCAST,
    UOP_REDUCE,
    UOP_ALLTOALL,
    UOP_BARRIER,
    UOP_COUNT
};

typedef struct ucx_settings {
    double timeout_s;
    int progress_thread;
    int peer_errors;
    const char *tls;
    int algo[UOP_COUNT];     /* forced algorithm, ALG_AUTO to choose by size */
    size_t small_bytes[UOP_COUNT]; /* below: the latency algorithm */
    size_t allreduce_ring_bytes;   /* at or above, for n not a power of two: ring */
    size_t allreduce_direct_bytes; /* at or above, on one host: direct */
    size_t reduce_direct_bytes;    /* at or above, on one host: direct */
    size_t reduce_scatter_gather_bytes; /* bytes x (n - 1) at or above, on one host, n > 2 */
    size_t broadcast_large_bytes;  /* at or above, across hosts: scatter+allgather */
    size_t chunk_bytes;      /* pipeline chunks of the ops that reduce */
    size_t forward_chunk_bytes; /* and of those that only pass data on */
    int pipeline_depth;      /* receive buffers in flight per transfer stream */
    double spin_us;          /* a wait yields this long before sleeping on UCX's event fd */
    double own_core_spin_us; /* the same for a rank with a core of its own */
} ucx_settings;

extern const loom_setting_spec ucx_settings_spec[];
int ucx_settings_read(const loom_host *host, ucx_settings *s);

/* -------------------------------------------------------------- process */

typedef struct ucx_peer {
    ucp_ep_h ep;
    int failed;            /* the endpoint reported an error */
    ucs_status_t status;
    int local;             /* same host and pid namespace: pid is meaningful */
    int pid;
    int gone;              /* the local process was seen to exit */
} ucx_peer;

typedef struct ucx_proc {
    pthread_mutex_t lock;
    pthread_cond_t work;   /* the progress thread sleeps on it when idle */
    int refs;              /* live communicators */
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;               /* the worker's event fd, -1 when UCX has none */
    double spin_us;        /* the progress thread's, from the first world */
    int own_core;          /* this rank has a core to itself: waits spin before yielding */
    int world_size, world_rank;
    ucx_peer *peers;       /* by world rank */
    int generation;        /* contexts made so far in this process: part of store keys */
    int nworlds;           /* world communicators made so far */
    int failed;            /* something timed out or died: tear down without flushing */
    double timeout_s;
    /* requests with ops still to do, oldest first */
    struct loom_comm_request *active_head, *active_tail;
    int nactive;
    unsigned completions;  /* sends and receives of ours UCX finished in its progress */
    /* progress thread */
    int thread_on, thread_stop;
    pthread_t thread;
    /* scratch buffers and requests kept for reuse */
    struct scratch_buf *scratch_free;
    size_t scratch_cached;
    struct loom_comm_request *pool; /* linked by anext */
    int npool;
} ucx_proc;

extern ucx_proc ucx;

/* --------------------------------------------------------- communicator */

struct loom_comm {
    comm_group group;      /* ranks, messages ("group of 4" for the world), sequence
                              numbers, failure; under ucx.lock */
    ucx_settings set;
    int local;             /* every member on this host: cma reaches all of them */
    int64_t uid;           /* unique in the job (the store's counter); group.id is its text */
    uint64_t tag_id;       /* uid in the tag's communicator field */
};
/* First: plugins/common reads the group there (comm_rank, comm_size). */
_Static_assert(offsetof(struct loom_comm, group) == 0, "comm_group first");

/* ------------------------------------------------------------- schedule */

typedef enum sop_kind {
    SOP_SEND,
    SOP_RECV,
    SOP_REDUCE, /* dst = a op b, n elements */
    SOP_COPY,   /* dst = a, n bytes */
    SOP_DIVIDE, /* dst /= group size, n elements (avg) */
    SOP_JOIN,   /* nothing: a point later ops depend on */
} sop_kind;

enum { SOP_WAITING, SOP_POSTED, SOP_DONE };

typedef struct sop {
    uint8_t kind, state;
    uint16_t step;       /* algorithm step, for the tag and for messages */
    uint32_t chunk;
    int peer;            /* group rank of a send or receive */
    int dep_head;        /* first not-yet-done dependency in deps, -1: none */
    void *dst;
    const void *a, *b;
    size_t n;            /* bytes (send, recv, copy) or elements (reduce, divide) */
    void *ucx;           /* the UCX request while posted */
} sop;

struct loom_comm_request {
    loom_comm *comm;     /* NULL once the group was destroyed under it */
    const loom_host *host;
    comm_call call;      /* as posted, but send set aside where it overlapped recv, and
                            recv NULL off the root of a reduce */
    const char *algo;    /* "ring", ... for messages; NULL for send/recv */
    uint64_t seq;
    int collective;
    int dead_world;      /* world rank of the peer whose failure failed it, or -1 */
    sop *ops;
    int nops, cap_ops, low;
    struct sdep {
        int op, next;
    } *deps;
    int ndeps, cap_deps;
    int build_failed;
#define REQ_SCRATCH_MAX 4
    struct scratch_buf *scratch[REQ_SCRATCH_MAX];
    int nscratch;
    size_t inline_used;  /* of inline_scratch */
    int status;          /* LOOM_IN_PROGRESS, LOOM_OK or an error */
    int moved;           /* the last pass over the ops finished one */
    unsigned completions_seen; /* ucx.completions at that pass */
    double next_check;   /* when a wait next checks that its peers live */
    char error[640];     /* the detail of a failure found while advancing */
    /* Small scratch buffers, carved out here: a small collective's
     * scratch costs no search of the process's cache of buffers. Not
     * zeroed when a pooled request is reused, like error. */
#define REQ_INLINE_SCRATCH 512
    _Alignas(64) char inline_scratch[REQ_INLINE_SCRATCH];
    int active;          /* on ucx.active_* */
    struct loom_comm_request *anext, *aprev; /* ucx.active_* */
    comm_pending pending; /* on the group's list until released */
};

/* ucx_sched.c: building (with ucx.lock held: an op is built and started
 * in one hold of the lock). The calls that add ops and dependencies are
 * inline: a small collective's whole schedule is a few of them, on the
 * path of every op. Each returns the new op's index, or -1 when memory ran
 * out (then or before: build_failed). */

/* Room for one more op or dependency; -1 (build_failed set) when there is
 * none. */
int sched_grow_ops(loom_comm_request *r);
int sched_grow_deps(loom_comm_request *r);

static inline int sched_op(loom_comm_request *r, sop op)
{
    if (r->build_failed || (r->nops == r->cap_ops && sched_grow_ops(r) != 0))
        return -1;
    r->ops[r->nops] = op;
    return r->nops++;
}
static inline int sched_send(loom_comm_request *r, int peer, const void *buf, size_t bytes,
                             int step, int chunk)
{
    return sched_op(r, (sop){.kind = SOP_SEND, .state = SOP_WAITING, .step = (uint16_t)step,
                             .chunk = (uint32_t)chunk, .peer = peer, .dep_head = -1, .a = buf,
                             .n = bytes});
}
static inline int sched_recv(loom_comm_request *r, int peer, void *buf, size_t bytes, int step,
                             int chunk)
{
    return sched_op(r, (sop){.kind = SOP_RECV, .state = SOP_WAITING, .step = (uint16_t)step,
                             .chunk = (uint32_t)chunk, .peer = peer, .dep_head = -1, .dst = buf,
                             .n = bytes});
}
static inline int sched_reduce(loom_comm_request *r, void *dst, const void *a, const void *b,
                               size_t count)
{
    return sched_op(r, (sop){.kind = SOP_REDUCE, .state = SOP_WAITING, .peer = -1,
                             .dep_head = -1, .dst = dst, .a = a, .b = b, .n = count});
}
static inline int sched_copy(loom_comm_request *r, void *dst, const void *src, size_t bytes)
{
    return sched_op(r, (sop){.kind = SOP_COPY, .state = SOP_WAITING, .peer = -1,
                             .dep_head = -1, .dst = dst, .a = src, .n = bytes});
}
static inline int sched_divide(loom_comm_request *r, void *buf, size_t count)
{
    return sched_op(r, (sop){.kind = SOP_DIVIDE, .state = SOP_WAITING, .peer = -1,
                             .dep_head = -1, .dst = buf, .n = count});
}
static inline int sched_join(loom_comm_request *r)
{
    return sched_op(r, (sop){.kind = SOP_JOIN, .state = SOP_WAITING, .peer = -1, .dep_head = -1});
}
/* Op `op` waits for op `dep`; either < 0 is ignored (a skipped op). */
static inline void sched_after(loom_comm_request *r, int op, int dep)
{
    if (op < 0 || dep < 0 || r->build_failed || (r->ndeps == r->cap_deps && sched_grow_deps(r)))
        return;
    r->deps[r->ndeps] = (struct sdep){.op = dep, .next = r->ops[op].dep_head};
    r->ops[op].dep_head = r->ndeps++;
}
/* A scratch buffer for the request, kept until it is released. */
void *sched_scratch(loom_comm_request *r, size_t bytes);

/* Receive buffers used in turn: a receive into a slot waits until the op
 * that consumed the slot's previous contents is done. */
#define SLOTS_MAX 16
typedef struct slot_ring {
    char *base;
    size_t slot_bytes;
    int count, next;
    int last_use[SLOTS_MAX];
    int taken;           /* index of the slot handed out last */
} slot_ring;
/* Slots of `elems` elements of the call's dtype, as many as the group's
 * pipeline_depth. */
int slots_init(loom_comm_request *r, slot_ring *s, size_t elems);
/* The same with `depth` slots (at most SLOTS_MAX). */
int slots_init_depth(loom_comm_request *r, slot_ring *s, size_t elems, int depth);
/* The next slot; *dep is the op to wait for before writing it. Its index
 * is s->taken until the next take. */
char *slots_take(slot_ring *s, int *dep);
/* The op that consumes the slot handed out last (or slot idx). */
void slots_used(slot_ring *s, int op);
void slots_used_idx(slot_ring *s, int idx, int op);

/* ucx_sched.c: running (with ucx.lock held) */
void sched_activate(loom_comm_request *r);
int sched_progress_all(void);   /* worker progress + advance every active request */
void sched_cancel(loom_comm_request *r); /* drop UCX requests still posted */
/* A request, zeroed but for the arrays a pooled one keeps (NULL when out
 * of memory). sched_free gives it back: its scratch, and itself to the
 * pool or to free. Both with ucx.lock held. */
loom_comm_request *sched_request(void);
void sched_free(loom_comm_request *r);
void sched_pool_release(void); /* at teardown, with ucx.lock held */
void scratch_release_all(void);
/* "allreduce #12 on group of 4" or "recv #3 from rank 2 (tag 7) on group of 4" */
void ucx_req_describe(const loom_comm_request *r, char *buf, size_t cap);
/* Fail the request with a detail (kept in r->error for the thread that waits). */
void sched_fail(loom_comm_request *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fail the request if a peer it waits for is known to be dead. */
void sched_check_peers(loom_comm_request *r);

/* ucx_wireup.c */
int ucx_create_world(const loom_host *host, loom_comm **out);
int ucx_create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out);
int ucx_destroy(loom_comm *c);
int ucx_abort(loom_comm *c);
void ucx_comm_fail(loom_comm *c, int status, const char *why);
void ucx_wake_progress(void);
/* Whether world rank w looks dead; fills why. Called with ucx.lock held. */
int ucx_peer_dead(int w, char *why, size_t cap);

/* ucx_plugin.c */
/* Waiting without hogging a core: poll a few microseconds (on a core of
 * its own), then yield for spin_us (ucx_spin_us), then sleep on UCX's
 * event fd until a message comes (4 ranks share 2 cores in the tests). */
typedef struct ucx_idle_state {
    double since;      /* when it became idle (clock_now_s); 0: not idle */
    int polls;         /* polls since the clock was last read */
    int beside_caller; /* the progress thread: the core is the caller's too, never spin */
} ucx_idle_state;
/* Whether this process has a core of its own (ucx.own_core), and the
 * spin_us of its waits by that. */
int ucx_own_core(const loom_host *host);
double ucx_spin_us(const ucx_settings *s);
/* One idle step after a poll that found `events`. Returns the time
 * (clock_now_s) when it read the clock, which it does before every pause
 * and every few polls, else 0. */
double ucx_idle(ucx_idle_state *s, int events, double spin_us);

/* ----------------------------------------------------------- algorithms */

/* Balanced split of count elements into n blocks: the first count % n get
 * one more. */
static inline size_t blk_off(size_t count, int n, int i)
{
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
}
static inline size_t blk_len(size_t count, int n, int i)
{
    return blk_off(count, n, i + 1) - blk_off(count, n, i);
}
static inline int pow2_floor(int n)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    return p;
}
static inline int mod(int a, int n)
{
    int m = a % n;
    return m < 0 ? m + n : m;
}
static inline int log2_ceil(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}
static inline int log2_floor(int n)
{
    int k = 0;
    while ((2 << k) <= n)
        k++;
    return k;
}
/* Power-of-two algorithms at other rank counts: of the first 2 * extra
 * ranks (extra = n - p, p the largest power of two <= n) each even one
 * hands its data to the odd one after it and sits out; the p ranks left
 * run the algorithm as virtual ranks 0..p-1. The real rank of virtual v: */
static inline int real_rank(int v, int extra) { return v < extra ? 2 * v + 1 : v + extra; }
/* The virtual rank of real rank me, or -1 for one that sits out. */
static inline int fold_virtual(int me, int extra)
{
    return me >= 2 * extra ? me - extra : me % 2 ? me / 2 : -1;
}
/* Recursive halving: at the step of `mask`, virtual rank v and its partner
 * v ^ mask split their range [lo, hi) of virtual blocks in two; v keeps
 * one half, [*keep_lo, *keep_hi), and sends the other, [*give_lo, *give_hi). */
static inline void halving_split(int v, int mask, int lo, int hi, int *keep_lo, int *keep_hi,
                                 int *give_lo, int *give_hi)
{
    int mid = lo + mask, low_half = v < (v ^ mask);
    *keep_lo = low_half ? lo : mid;
    *keep_hi = low_half ? mid : hi;
    *give_lo = low_half ? mid : lo;
    *give_hi = low_half ? hi : mid;
}
/* Recursive doubling: at the step of `mask`, virtual rank v holding [lo, hi)
 * gets its partner's range of the same size next to it; returns its start. */
static inline int doubling_partner_lo(int v, int mask, int lo, int hi)
{
    return v < (v ^ mask) ? hi : lo - mask;
}
/* Elements per pipeline chunk for the request's op over `count` elements:
 * chunk_bytes for ops that reduce, forward_chunk_bytes for ops that only
 * pass data on (forward = 1), grown so that no range has more chunks than
 * the tag's chunk field holds. */
size_t ucx_chunk_elems(const loom_comm_request *r, size_t count, int forward);
static inline int nchunks(size_t len, size_t ce) { return (int)((len + ce - 1) / ce); }
/* Elements in chunk k of a range of len elements cut into chunks of ce. */
static inline size_t chunk_len(size_t len, int k, size_t ce)
{
    size_t left = len - (size_t)k * ce;
    return left < ce ? left : ce;
}
/* Chunk k of block b of count elements split into n (blk_off): its offset,
 * and its length in *len, 0 past the block's last chunk. */
static inline size_t blk_chunk(size_t count, int n, int b, int k, size_t ce, size_t *len)
{
    size_t off = blk_off(count, n, b), blen = blk_len(count, n, b);
    *len = (size_t)k * ce < blen ? chunk_len(blen, k, ce) : 0;
    return off + (size_t)k * ce;
}

/* The call's blocks: count elements each, rank i's at i * block_bytes. */
static inline size_t block_bytes(const loom_comm_request *r)
{
    return r->call.count * loom_dtype_size(r->call.dtype);
}
static inline char *recv_block(const loom_comm_request *r, int i)
{
    return (char *)r->call.recv + (size_t)i * block_bytes(r);
}
/* The block this rank sends rank i: block i of send in an alltoall, its
 * one block in an allgather. */
static inline const char *send_block(const loom_comm_request *r, int i)
{
    const char *send = r->call.send;
    return r->call.op == LOOM_OP_ALLTOALL ? send + (size_t)i * block_bytes(r) : send;
}
/* Broadcast and reduce run on ranks renumbered so that the root is
 * virtual rank 0: this rank's virtual rank, and the group rank of virtual
 * rank v. */
static inline int root_virtual(const loom_comm_request *r)
{
    return mod(r->comm->group.rank - r->call.root, r->comm->group.size);
}
static inline int root_real(const loom_comm_request *r, int v)
{
    return mod(v + r->call.root, r->comm->group.size);
}

/* Chunked transfers of elements [off, off + len) of buf (element size es,
 * chunk ce elements), chunk k tagged (step, k); each op waits for dep. */
void send_chunks(loom_comm_request *r, int peer, const void *buf, size_t es, size_t off,
                 size_t len, size_t ce, int step, int dep);
void recv_chunks(loom_comm_request *r, int peer, void *buf, size_t es, size_t off, size_t len,
                 size_t ce, int step, int dep);
/* Receive chunks into slots and reduce each: dst[i] = received op src[i]
 * (dst and src indexed like the range); the reduces also wait for dep. */
void recv_reduce_chunks(loom_comm_request *r, int peer, slot_ring *sl, void *dst,
                        const void *src, size_t es, size_t off, size_t len, size_t ce, int step,
                        int dep);
/* An op that is done when every op created from index `first` on is: a
 * join op, or the one such op, or -1 for none (a dependency on nothing). */
int join_since(loom_comm_request *r, int first);
/* The direct algorithms' sum of elements [off, off + len), chunk by chunk
 * (ce elements) so the sum being made stays in cache while the peers'
 * parts come in: chunk k from peer(r, s) for s = 1 .. n-1, in that order
 * on every rank, received into a slot of sl and added onto own's chunk
 * (s = 1) or the sum so far, into sum; divided by n for LOOM_AVG. own and
 * sum are indexed like the range. */
void sum_from_peers(loom_comm_request *r, int (*peer)(const loom_comm_request *r, int s),
                    slot_ring *sl, char *sum, const char *own, size_t off, size_t len, size_t ce);
/* A peer for sum_from_peers: the rank s behind this one (a rooted op's
 * is root_real, virtual rank s). */
int peer_behind(const loom_comm_request *r, int s);

/* Where virtual block i of buf starts, in elements (i == p: the end). */
typedef size_t (*block_start_fn)(const loom_comm_request *r, int i);
/* The gathering half of recursive doubling (ucx_coll_gather.c): virtual
 * rank v, holding its block of buf, swaps all it holds with its partner,
 * in chunks of ce elements, at each step from `step` on until it holds
 * every block; the first step waits for join. Returns the last step's join. */
int doubling_gather(loom_comm_request *r, char *buf, block_start_fn start, size_t ce, int v,
                    int step, int join);

/* The schedule builders: each lays out the request's call (r->call) as its
 * algorithm runs it on this rank. */
void build_allreduce_rd(loom_comm_request *r);
void build_allreduce_ring(loom_comm_request *r);
void build_allreduce_rabenseifner(loom_comm_request *r);
void build_allreduce_direct(loom_comm_request *r);
void build_allgather_ring(loom_comm_request *r);
void build_allgather_rd(loom_comm_request *r);
void build_allgather_bruck(loom_comm_request *r);
void build_reducescatter_ring(loom_comm_request *r);
void build_reducescatter_rh(loom_comm_request *r);
void build_reducescatter_direct(loom_comm_request *r);
void build_broadcast_binomial(loom_comm_request *r);
void build_broadcast_direct(loom_comm_request *r);
void build_broadcast_chain(loom_comm_request *r);
void build_broadcast_scatter_allgather(loom_comm_request *r);
void build_reduce_binomial(loom_comm_request *r);
void build_reduce_chain(loom_comm_request *r);
void build_reduce_direct(loom_comm_request *r);
void build_reduce_scatter_gather(loom_comm_request *r);
void build_alltoall_pairwise(loom_comm_request *r);
void build_exchange_posted(loom_comm_request *r); /* alltoall posted, allgather direct */
void build_alltoall_bruck(loom_comm_request *r);
void build_barrier_dissemination(loom_comm_request *r);

#endif
