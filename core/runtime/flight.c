/* The flight recorder (see flight.h): rings of each group's last ops in a
 * table the launcher can map, their dump on SIGUSR1, and the diagnosis
 * `loom launch` prints from every rank's table. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/files.h"
#include "runtime/flight.h"
#include "runtime/log.h"

static const char table_magic[8] = "LOOMFLT";

/* loom_flight_group.in_use */
enum { GROUP_FREE = 0, GROUP_OPEN = 1, GROUP_CLOSED = 2, GROUP_FILLING = 3 };

static loom_flight_table *table;
static int table_is_shared;
/* The issuer and step the trainer set: read when an op is posted, on the
 * thread that posts collectives. */
static char current_issuer[LOOM_FLIGHT_ISSUER];
static int64_t current_step;

/* ------------------------------------------------------------ recording */

static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

static void on_sigusr1(int sig)
{
    (void)sig;
    int saved = errno;
    loom_flight_write(STDERR_FILENO, "SIGUSR1");
    errno = saved;
}

/* Our handler on SIGUSR1, unless it is there already. A library may
 * install its own after ours (one seen on a GPU machine took HUP to SYS
 * for itself once training had begun), and SIGUSR1 would then dump
 * nothing: each step takes it back. */
static void keep_sigusr1(int first)
{
    struct sigaction now;
    if (!table || sigaction(SIGUSR1, NULL, &now) != 0 || now.sa_handler == on_sigusr1)
        return;
    struct sigaction sa = {.sa_handler = on_sigusr1, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    if (!first)
        loom_log(LOOM_LOG_DEBUG, "flight recorder: SIGUSR1 taken back from a handler a library "
                                 "installed after it");
}

/* The launcher's file, mapped; NULL (with a warning) when it cannot be. */
static loom_flight_table *map_shared(const char *dir, int rank)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.flight", dir, rank);
    /* Not truncated: an earlier process of this rank (a script running loom
     * twice) may still have it mapped, and would fault past a new end. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)sizeof(loom_flight_table)) == 0)
        p = mmap(NULL, sizeof(loom_flight_table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        loom_log(LOOM_LOG_WARN,
                 "flight recorder: cannot keep its table in %s (%s); loom launch will not see "
                 "this rank's last operations",
                 path, strerror(err));
        return NULL;
    }
    memset(p, 0, sizeof(loom_flight_table));
    return p;
}

void loom_flight_open(int rank, int world_size)
{
    if (table)
        return;
    const char *dir = getenv(LOOM_FLIGHT_DIR_ENV);
    loom_flight_table *t = dir && dir[0] ? map_shared(dir, rank) : NULL;
    table_is_shared = t != NULL;
    if (!t) {
        void *p = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return; /* no recorder: the job itself does not need it */
        t = p;
    }
    /* layout and rank first, the magic last: a reader that sees the magic
     * sees the rest */
    t->layout = (uint32_t)sizeof *t;
    t->rank = rank;
    t->world_size = world_size;
    t->pid = (int32_t)getpid();
    atomic_thread_fence(memory_order_release);
    memcpy(t->magic, table_magic, sizeof t->magic);
    table = t;
    keep_sigusr1(1);
}

int loom_flight_shared(void) { return table_is_shared; }

/* Claim a ring: a free one, else the one closed longest ago. */
static loom_flight_group *claim(void)
{
    for (int i = 0; i < LOOM_FLIGHT_GROUPS; i++) {
        int expected = GROUP_FREE;
        if (atomic_compare_exchange_strong(&table->groups[i].in_use, &expected, GROUP_FILLING))
            return &table->groups[i];
    }
    for (;;) {
        loom_flight_group *oldest = NULL;
        for (int i = 0; i < LOOM_FLIGHT_GROUPS; i++) {
            loom_flight_group *fg = &table->groups[i];
            if (atomic_load(&fg->in_use) == GROUP_CLOSED &&
                (!oldest || fg->closed_order < oldest->closed_order))
                oldest = fg;
        }
        if (!oldest)
            return NULL;
        int expected = GROUP_CLOSED;
        if (atomic_compare_exchange_strong(&oldest->in_use, &expected, GROUP_FILLING))
            return oldest;
    }
}

loom_flight_group *loom_flight_join(const char *id, const char *name, const char *backend,
                                    int rank, int size)
{
    loom_flight_group *fg = table ? claim() : NULL;
    if (!fg)
        return NULL;
    copy_text(fg->id, sizeof fg->id, id);
    copy_text(fg->name, sizeof fg->name, name);
    copy_text(fg->backend, sizeof fg->backend, backend);
    fg->rank = rank;
    fg->size = size;
    atomic_store(&fg->recorded, 0);
    for (int k = 0; k < LOOM_FLIGHT_OPS; k++)
        atomic_store(&fg->slots[k].state, 0);
    atomic_store_explicit(&fg->in_use, GROUP_OPEN, memory_order_release);
    return fg;
}

void loom_flight_rename(loom_flight_group *fg, const char *name)
{
    if (fg)
        copy_text(fg->name, sizeof fg->name, name);
}

/* A group destroyed keeps its ring for the record (a rank that failed
 * tears its groups down before it exits) until a new group needs it. */
void loom_flight_leave(loom_flight_group *fg)
{
    static atomic_uint_least64_t closed;
    if (!fg)
        return;
    fg->closed_order = atomic_fetch_add(&closed, 1);
    atomic_store_explicit(&fg->in_use, GROUP_CLOSED, memory_order_release);
}

uint64_t loom_flight_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t loom_flight_post(loom_flight_group *fg, loom_comm_op op, uint64_t seq, uint64_t bytes,
                          int peer)
{
    if (!fg)
        return 0;
    uint64_t k = atomic_load_explicit(&fg->recorded, memory_order_relaxed);
    loom_flight_slot *s = &fg->slots[k % LOOM_FLIGHT_OPS];
    unsigned v = atomic_load_explicit(&s->version, memory_order_relaxed);
    atomic_store_explicit(&s->version, v + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    loom_flight_entry *e = &s->fixed;
    e->seq = seq;
    e->bytes = bytes;
    e->posted_ns = loom_flight_now_ns();
    e->step = current_step;
    e->op = (int32_t)op;
    e->peer = peer;
    memcpy(e->issuer, current_issuer, sizeof e->issuer);
    atomic_store_explicit(&s->waited_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&s->ended_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&s->state, LOOM_FLIGHT_POSTED, memory_order_relaxed);
    atomic_store_explicit(&s->version, v + 2, memory_order_release);
    atomic_store_explicit(&fg->recorded, k + 1, memory_order_release);
    return k + 1;
}

void loom_flight_mark(loom_flight_group *fg, uint64_t ticket, loom_flight_state state)
{
    if (!fg || !ticket)
        return;
    /* a ring that went round since holds another op in that slot now */
    if (atomic_load_explicit(&fg->recorded, memory_order_relaxed) - (ticket - 1) > LOOM_FLIGHT_OPS)
        return;
    loom_flight_slot *s = &fg->slots[(ticket - 1) % LOOM_FLIGHT_OPS];
    int was = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (was == LOOM_FLIGHT_COMPLETED || was == LOOM_FLIGHT_FAILED)
        return; /* a timeout marks its op failed before the wait returns */
    if (state == LOOM_FLIGHT_WAITING)
        atomic_store_explicit(&s->waited_ns, loom_flight_now_ns(), memory_order_relaxed);
    else if (state != LOOM_FLIGHT_POSTED)
        atomic_store_explicit(&s->ended_ns, loom_flight_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&s->state, (int)state, memory_order_release);
}

void loom_flight_issuer(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(current_issuer, sizeof current_issuer, fmt, ap);
    va_end(ap);
}

void loom_flight_step(int64_t step)
{
    current_step = step;
    keep_sigusr1(0);
}

/* -------------------------------------------------------------- reading */

/* One slot, consistently: 0 when it was being rewritten every time we
 * looked (or never held an op). */
static int read_slot(const loom_flight_slot *s, loom_flight_entry *out)
{
    loom_flight_slot *w = (loom_flight_slot *)(uintptr_t)s; /* atomics want non-const */
    for (int attempt = 0; attempt < 8; attempt++) {
        unsigned v1 = atomic_load_explicit(&w->version, memory_order_acquire);
        if (v1 & 1u)
            continue;
        memcpy(out, &s->fixed, sizeof *out);
        out->state = atomic_load_explicit(&w->state, memory_order_acquire);
        out->waited_ns = atomic_load_explicit(&w->waited_ns, memory_order_relaxed);
        out->ended_ns = atomic_load_explicit(&w->ended_ns, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&w->version, memory_order_relaxed) == v1) {
            out->issuer[sizeof out->issuer - 1] = '\0';
            return out->state != 0;
        }
    }
    return 0;
}

/* A live group into a view; 0 when the slot holds no group. */
static int read_group(const loom_flight_group *g, loom_flight_group_view *out)
{
    loom_flight_group *w = (loom_flight_group *)(uintptr_t)g;
    int in_use = atomic_load_explicit(&w->in_use, memory_order_acquire);
    if (in_use != GROUP_OPEN && in_use != GROUP_CLOSED)
        return 0;
    memcpy(out->id, g->id, sizeof out->id);
    memcpy(out->name, g->name, sizeof out->name);
    memcpy(out->backend, g->backend, sizeof out->backend);
    out->id[sizeof out->id - 1] = out->name[sizeof out->name - 1] = '\0';
    out->backend[sizeof out->backend - 1] = '\0';
    out->rank = g->rank;
    out->size = g->size;
    out->recorded = atomic_load_explicit(&w->recorded, memory_order_acquire);
    out->count = 0;
    uint64_t first = out->recorded > LOOM_FLIGHT_OPS ? out->recorded - LOOM_FLIGHT_OPS : 0;
    for (uint64_t k = first; k < out->recorded; k++)
        if (read_slot(&g->slots[k % LOOM_FLIGHT_OPS], &out->entries[out->count]))
            out->count++;
    return 1;
}

void loom_flight_read(const loom_flight_table *t, loom_flight_view *out)
{
    out->rank = t->rank;
    out->world_size = t->world_size;
    out->pid = t->pid;
    out->ngroups = 0;
    for (int i = 0; i < LOOM_FLIGHT_GROUPS; i++)
        if (read_group(&t->groups[i], &out->groups[out->ngroups]))
            out->ngroups++;
}

int loom_flight_load(const char *path, loom_flight_view *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return loom_fail(LOOM_ERR_NOT_FOUND, "flight recorder: %s: %s", path, strerror(errno));
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size == (off_t)sizeof(loom_flight_table))
        p = mmap(NULL, sizeof(loom_flight_table), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return loom_fail(LOOM_ERR_INVALID,
                         "flight recorder: %s is not a table of this loom build (%lld bytes, "
                         "want %zu)",
                         path, (long long)st.st_size, sizeof(loom_flight_table));
    const loom_flight_table *t = p;
    int rc = LOOM_OK;
    if (memcmp(t->magic, table_magic, sizeof t->magic) != 0 ||
        t->layout != (uint32_t)sizeof(loom_flight_table))
        rc = loom_fail(LOOM_ERR_INVALID,
                       "flight recorder: %s is not a table of this loom build (or not filled in)",
                       path);
    else
        loom_flight_read(t, out);
    munmap(p, sizeof(loom_flight_table));
    return rc;
}

/* ------------------------------------------------------------ formatting
 *
 * By hand, with no stdio: the same text is written from a signal handler. */

typedef struct text {
    char *buf;
    size_t len, cap; /* buf holds len bytes, NUL-terminated when cap > 0 */
} text;

static void put(text *t, const char *s)
{
    size_t n = strlen(s);
    if (t->cap == 0)
        return;
    if (n > t->cap - 1 - t->len)
        n = t->cap - 1 - t->len;
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void put_u64(text *t, uint64_t v)
{
    char digits[24];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    char s[24];
    for (int i = 0; i < n; i++)
        s[i] = digits[n - 1 - i];
    s[n] = '\0';
    put(t, s);
}

static void put_i64(text *t, int64_t v)
{
    if (v < 0) {
        put(t, "-");
        put_u64(t, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(t, (uint64_t)v);
    }
}

/* "3.012 s", or "0.412 ms" under a second */
static void put_duration(text *t, uint64_t ns)
{
    uint64_t unit = ns >= 1000000000ull ? 1000000000ull : 1000000ull;
    uint64_t thousandths = (ns % unit) / (unit / 1000);
    put_u64(t, ns / unit);
    put(t, ".");
    put(t, thousandths < 100 ? (thousandths < 10 ? "00" : "0") : "");
    put_u64(t, thousandths);
    put(t, unit == 1000000000ull ? " s" : " ms");
}

static uint64_t since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

static const char *state_name(int state)
{
    switch (state) {
    case LOOM_FLIGHT_POSTED: return "posted";
    case LOOM_FLIGHT_WAITING: return "waiting";
    case LOOM_FLIGHT_COMPLETED: return "completed";
    case LOOM_FLIGHT_FAILED: return "failed";
    default: return "?";
    }
}

static int entry_is_p2p(const loom_flight_entry *e)
{
    return e->op == LOOM_OP_SEND || e->op == LOOM_OP_RECV;
}

/* "dp allreduce #42", "pp recv #7 from rank 1" */
static void put_op(text *t, const char *group, const loom_flight_entry *e)
{
    if (group && group[0]) {
        put(t, group);
        put(t, " ");
    }
    put(t, loom_comm_op_name((loom_comm_op)e->op));
    put(t, " #");
    put_u64(t, e->seq);
    if (entry_is_p2p(e) && e->peer >= 0) {
        put(t, e->op == LOOM_OP_SEND ? " to rank " : " from rank ");
        put_u64(t, (uint64_t)e->peer);
    }
}

/* "step 12, backward h.1" */
static void put_issuer(text *t, const loom_flight_entry *e)
{
    if (e->step > 0) {
        put(t, "step ");
        put_i64(t, e->step);
        if (e->issuer[0])
            put(t, ", ");
    }
    put(t, e->issuer);
}

/* "    allreduce #42, 491520 B: waiting for 3.012 s, posted 3.020 s ago;
 * step 12, backward block 1" */
static void put_entry(text *t, const loom_flight_entry *e, uint64_t now)
{
    put(t, "    ");
    put_op(t, NULL, e);
    put(t, ", ");
    put_u64(t, e->bytes);
    put(t, " B: ");
    if (e->state == LOOM_FLIGHT_WAITING) {
        put(t, "waiting for ");
        put_duration(t, since(now, e->waited_ns));
        put(t, ", ");
    } else if (e->state != LOOM_FLIGHT_POSTED) {
        put(t, state_name(e->state));
        put(t, " after ");
        put_duration(t, since(e->ended_ns, e->posted_ns));
        put(t, ", ");
    }
    put(t, "posted ");
    put_duration(t, since(now, e->posted_ns));
    put(t, " ago");
    if (e->state == LOOM_FLIGHT_POSTED)
        put(t, ", not waited on");
    if (e->step > 0 || e->issuer[0]) {
        put(t, "; ");
        put_issuer(t, e);
    }
    put(t, "\n");
}

/* "  dp (mpi, rank 1 of 3): 1234 operations, the last 8:" and its ops */
static void put_group(text *t, const loom_flight_group_view *g, uint64_t now, int last)
{
    put(t, "  ");
    put(t, g->name[0] ? g->name : "group");
    put(t, " (");
    put(t, g->backend);
    put(t, ", rank ");
    put_u64(t, (uint64_t)g->rank);
    put(t, " of ");
    put_u64(t, (uint64_t)g->size);
    put(t, "): ");
    int from = g->count > last ? g->count - last : 0;
    if (g->recorded == 0) {
        put(t, "no operations\n");
        return;
    }
    put_u64(t, g->recorded);
    put(t, g->recorded == 1 ? " operation" : " operations");
    if (from > 0 || (uint64_t)g->count < g->recorded) {
        put(t, ", the last ");
        put_u64(t, (uint64_t)(g->count - from));
    }
    put(t, ":\n");
    for (int i = from; i < g->count; i++)
        put_entry(t, &g->entries[i], now);
}

static void put_how(text *t, const loom_flight_rank *how)
{
    switch (how->state) {
    case LOOM_RANK_RUNNING: put(t, "running"); break;
    case LOOM_RANK_STOPPED: put(t, "stopped"); break;
    case LOOM_RANK_EXITED:
        put(t, "exited with status ");
        put_i64(t, how->code);
        break;
    case LOOM_RANK_KILLED:
        put(t, "killed by signal ");
        put_i64(t, how->code);
        break;
    }
}

size_t loom_flight_format(const loom_flight_view *v, int world_rank, const loom_flight_rank *how,
                          uint64_t now_ns, int last, char *buf, size_t cap)
{
    text t = {buf, 0, cap};
    if (cap)
        buf[0] = '\0';
    put(&t, "rank ");
    put_u64(&t, (uint64_t)world_rank);
    put(&t, " (");
    if (v) {
        put(&t, "pid ");
        put_i64(&t, v->pid);
        put(&t, ", ");
    }
    put_how(&t, how);
    put(&t, v ? "):\n" : "): no flight record\n");
    for (int i = 0; v && i < v->ngroups; i++)
        put_group(&t, &v->groups[i], now_ns, last);
    if (v && v->ngroups == 0)
        put(&t, "  no communication yet\n");
    return t.len;
}

/* Static: a signal handler has little stack. One writer at a time; a dump
 * asked for while one runs is dropped. */
static atomic_flag writing = ATOMIC_FLAG_INIT;
static char dump_buf[1 << 16];
static loom_flight_group_view dump_group;

void loom_flight_write(int fd, const char *why)
{
    if (!table || atomic_flag_test_and_set(&writing))
        return;
    uint64_t now = loom_flight_now_ns();
    text t = {dump_buf, 0, sizeof dump_buf};
    dump_buf[0] = '\0';
    put(&t, "flight recorder of rank ");
    put_i64(&t, table->rank);
    put(&t, " (pid ");
    put_i64(&t, table->pid);
    put(&t, "), on ");
    put(&t, why);
    put(&t, ":\n");
    int groups = 0;
    for (int i = 0; i < LOOM_FLIGHT_GROUPS; i++) {
        if (!read_group(&table->groups[i], &dump_group))
            continue;
        groups++;
        put_group(&t, &dump_group, now, 8);
    }
    if (groups == 0)
        put(&t, "  no communication yet\n");
    loom_write_all(fd, dump_buf, t.len);
    atomic_flag_clear(&writing);
}

/* ------------------------------------------------------------- diagnosis */

static const loom_flight_group_view *group_of(const loom_flight_view *v, const char *id)
{
    for (int i = 0; v && i < v->ngroups; i++)
        if (!strcmp(v->groups[i].id, id))
            return &v->groups[i];
    return NULL;
}

/* Where a rank waits: the op it sits in (the latest begun), else the
 * latest that failed (it gave up waiting there). */
typedef struct wait_at {
    const loom_flight_group_view *group;
    const loom_flight_entry *entry; /* NULL: none */
} wait_at;

static wait_at wait_of(const loom_flight_view *v)
{
    wait_at best = {0}, failed = {0};
    for (int i = 0; v && i < v->ngroups; i++)
        for (int k = 0; k < v->groups[i].count; k++) {
            const loom_flight_entry *e = &v->groups[i].entries[k];
            /* >=: stamps a clock tick apart tie, and entries come oldest first */
            if (e->state == LOOM_FLIGHT_WAITING &&
                (!best.entry || e->waited_ns >= best.entry->waited_ns))
                best = (wait_at){&v->groups[i], e};
            if (e->state == LOOM_FLIGHT_FAILED &&
                (!failed.entry || e->ended_ns >= failed.entry->ended_ns))
                failed = (wait_at){&v->groups[i], e};
        }
    return best.entry ? best : failed;
}

/* What the diagnosis knows of every rank. */
typedef struct job {
    const loom_flight_rank *ranks;
    int n;
    uint64_t now_ns;
    wait_at *waits;  /* per rank */
    char *waiting;   /* per rank: it waits on others (see is_waiting) */
} job;

/* Stopped or dead ranks wait on nothing, whatever their table says; a rank
 * that exited after its wait failed still counts as waiting there. */
static int is_waiting(const loom_flight_rank *r, const wait_at *w)
{
    if (r->state == LOOM_RANK_STOPPED || r->state == LOOM_RANK_KILLED || !w->entry)
        return 0;
    return r->state == LOOM_RANK_RUNNING || w->entry->state == LOOM_FLIGHT_FAILED;
}

/* Did a member finish collective #seq of g? Or has it reached it and
 * waits there? Ops are posted ahead of their waits (ddp's buckets), so a
 * later number posted says nothing; only an op gone from the ring, with
 * later ones there, counts as finished without its record. */
static void collective_progress(const loom_flight_group_view *g, uint64_t seq, int *done,
                                int *arrived)
{
    uint64_t lowest = UINT64_MAX;
    *done = *arrived = 0;
    for (int k = 0; k < g->count; k++) {
        const loom_flight_entry *e = &g->entries[k];
        if (entry_is_p2p(e))
            continue;
        if (e->seq < lowest)
            lowest = e->seq;
        if (e->seq == seq) {
            *done = e->state == LOOM_FLIGHT_COMPLETED;
            *arrived = e->state == LOOM_FLIGHT_WAITING || e->state == LOOM_FLIGHT_FAILED;
            return;
        }
    }
    *done = lowest != UINT64_MAX && lowest > seq && g->recorded > LOOM_FLIGHT_OPS;
}

/* The ranks waiting rank w waits on, into blockers[]; returns how many.
 * A collective waits on the members that neither finished it nor wait in
 * it; a send or receive on its peer, unless the peer waits on w in turn. */
static int blockers_of(const job *j, int w, int *blockers)
{
    const wait_at *at = &j->waits[w];
    int count = 0;
    if (entry_is_p2p(at->entry)) {
        int p = at->entry->peer;
        if (p < 0 || p >= j->n || p == w)
            return 0;
        const wait_at *theirs = &j->waits[p];
        if (j->waiting[p] && entry_is_p2p(theirs->entry) && theirs->entry->peer == w &&
            !strcmp(theirs->group->id, at->group->id))
            return 0;
        blockers[count++] = p;
        return count;
    }
    for (int m = 0; m < j->n; m++) {
        const loom_flight_group_view *g = m == w ? NULL : group_of(j->ranks[m].view, at->group->id);
        if (!g)
            continue; /* not a member, or no record to tell */
        int done, arrived;
        collective_progress(g, at->entry->seq, &done, &arrived);
        if (done || (arrived && j->waiting[m]))
            continue;
        blockers[count++] = m;
    }
    return count;
}

typedef struct line {
    char *buf;
    size_t len, cap;
} line;

static void add(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(line *l, const char *fmt, ...)
{
    if (l->cap == 0 || l->len >= l->cap - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->len, l->cap - l->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->len += (size_t)n < l->cap - l->len ? (size_t)n : l->cap - l->len - 1;
}

static void add_op(line *l, const loom_flight_group_view *g, const loom_flight_entry *e)
{
    char buf[160];
    text t = {buf, 0, sizeof buf};
    buf[0] = '\0';
    put_op(&t, g->name[0] ? g->name : "group", e);
    add(l, "%s", buf);
}

static void add_issuer(line *l, const loom_flight_entry *e)
{
    if (e->step <= 0 && !e->issuer[0])
        return;
    char buf[96];
    text t = {buf, 0, sizeof buf};
    buf[0] = '\0';
    put_issuer(&t, e);
    add(l, " (%s)", buf);
}

/* The entry of collective #seq in g, NULL when g has none. */
static const loom_flight_entry *collective_entry(const loom_flight_group_view *g, uint64_t seq)
{
    for (int k = 0; g && k < g->count; k++)
        if (!entry_is_p2p(&g->entries[k]) && g->entries[k].seq == seq)
            return &g->entries[k];
    return NULL;
}

/* "rank 2 (stopped) is after dp allreduce #41 (step 5, backward block 0)":
 * where rank r is, seen from the op a rank waiting on it waits in. */
static void add_position(line *l, const job *j, int r, const wait_at *waiter)
{
    const loom_flight_rank *me = &j->ranks[r];
    char how[64];
    text t = {how, 0, sizeof how};
    how[0] = '\0';
    put_how(&t, me);
    add(l, "rank %d (%s", r, how);
    if (!me->view) {
        add(l, ", no flight record)");
        return;
    }
    add(l, ") ");
    const wait_at *at = &j->waits[r];
    if (at->entry) { /* stopped or killed inside a wait */
        add(l, "is in ");
        add_op(l, at->group, at->entry);
        add_issuer(l, at->entry);
        return;
    }
    const loom_flight_group_view *g = group_of(me->view, waiter->group->id);
    if (!g || g->count == 0) {
        add(l, "has no operation on %s yet", waiter->group->name);
        return;
    }
    const loom_flight_entry *e = entry_is_p2p(waiter->entry)
                                     ? NULL
                                     : collective_entry(g, waiter->entry->seq);
    if (!e)
        e = &g->entries[g->count - 1];
    add(l, e->state == LOOM_FLIGHT_POSTED ? "posted " : "is after ");
    add_op(l, g, e);
    if (e->state == LOOM_FLIGHT_POSTED)
        add(l, " but does not wait on it");
    add_issuer(l, e);
}

/* "3.012 s": the longest of the ranks' waits, up to now or to its failure. */
static void add_waited(line *l, const job *j, const int *list, int count)
{
    uint64_t longest = 0;
    for (int i = 0; i < count; i++) {
        const loom_flight_entry *e = j->waits[list[i]].entry;
        uint64_t end = e->state == LOOM_FLIGHT_FAILED && e->ended_ns ? e->ended_ns : j->now_ns;
        if (since(end, e->waited_ns) > longest)
            longest = since(end, e->waited_ns);
    }
    char buf[32];
    text t = {buf, 0, sizeof buf};
    buf[0] = '\0';
    put_duration(&t, longest);
    add(l, "%s", buf);
}

/* "ranks 0, 1 wait in dp allreduce #42; rank 3 waits in pp recv #7 from
 * rank 2": the waiting ranks, by what they wait in. */
static void add_waiters(line *l, const job *j, int *list)
{
    char *told = calloc((size_t)j->n, 1);
    if (!told)
        return;
    int groups = 0;
    for (int w = 0; w < j->n; w++) {
        if (!j->waiting[w] || told[w])
            continue;
        char what[192];
        line mine = {what, 0, sizeof what};
        what[0] = '\0';
        add_op(&mine, j->waits[w].group, j->waits[w].entry);
        int count = 0;
        for (int o = w; o < j->n; o++) {
            if (!j->waiting[o] || told[o] || strcmp(j->waits[o].group->id, j->waits[w].group->id))
                continue;
            char other[192];
            line theirs = {other, 0, sizeof other};
            other[0] = '\0';
            add_op(&theirs, j->waits[o].group, j->waits[o].entry);
            if (strcmp(what, other) != 0)
                continue;
            told[o] = 1;
            list[count++] = o;
        }
        char names[256];
        loom_format_ranks(names, sizeof names, list, count);
        add(l, "%s%s %s in %s for ", groups++ ? "; " : "", names, count == 1 ? "waits" : "wait",
            what);
        add_waited(l, j, list, count);
    }
    free(told);
}

/* Nobody is behind: the waiting ranks all sit in one collective, or they
 * wait on each other in a circle. */
static void add_no_root(line *l, const job *j, int *list)
{
    const wait_at *first = NULL;
    int same = 1;
    for (int r = 0; r < j->n; r++) {
        if (!j->waiting[r])
            continue;
        const wait_at *at = &j->waits[r];
        if (!first)
            first = at;
        else if (strcmp(at->group->id, first->group->id) != 0 || at->entry->op != first->entry->op ||
                 at->entry->seq != first->entry->seq)
            same = 0;
    }
    add_waiters(l, j, list);
    if (same && !entry_is_p2p(first->entry))
        add(l, ", and none is behind: the ranks called different operations, counts, dtypes or "
               "roots there, or the transport failed");
    else
        add(l, ", and none is behind: they wait on each other (mismatched sends and receives, "
               "or operations called in a different order)");
}

int loom_flight_diagnose(const loom_flight_rank *ranks, int n, uint64_t now_ns, char *out,
                         size_t cap)
{
    line l = {out, 0, cap};
    if (cap)
        out[0] = '\0';
    job j = {ranks, n, now_ns, calloc((size_t)n, sizeof *j.waits), calloc((size_t)n, 1)};
    char *root = calloc((size_t)n, 1);
    int *via = calloc((size_t)n, sizeof *via), *list = calloc((size_t)n, sizeof *list);
    int nwaiting = 0;
    if (!j.waits || !j.waiting || !root || !via || !list) {
        add(&l, "out of memory for the diagnosis");
        goto done;
    }
    int unrecorded = 0;
    for (int r = 0; r < n; r++) {
        unrecorded += !ranks[r].view;
        j.waits[r] = wait_of(ranks[r].view);
        nwaiting += j.waiting[r] = (char)is_waiting(&ranks[r], &j.waits[r]);
    }
    /* The ranks the waiting ones wait on that wait on nothing themselves
     * hold the others up (a chain of waits ends there too, as every rank
     * on it is a waiting one). */
    int nroots = 0;
    for (int w = 0; w < n; w++) {
        int count = j.waiting[w] ? blockers_of(&j, w, list) : 0;
        for (int i = 0; i < count; i++) {
            int b = list[i];
            if (!j.waiting[b] && !root[b]) {
                root[b] = 1;
                via[b] = w;
                nroots++;
            }
        }
    }
    if (nroots > 0) {
        int k = 0;
        for (int r = 0; r < n; r++)
            if (root[r]) {
                if (k++)
                    add(&l, "; ");
                add_position(&l, &j, r, &j.waits[via[r]]);
            }
        add(&l, "; ");
        add_waiters(&l, &j, list);
    } else if (nwaiting > 0 && unrecorded > 0) {
        /* the ranks without a record may be the ones missing */
        add_waiters(&l, &j, list);
        for (int r = 0; r < n; r++)
            if (!ranks[r].view) {
                char how[64];
                text t = {how, 0, sizeof how};
                how[0] = '\0';
                put_how(&t, &ranks[r]);
                add(&l, "; rank %d (%s) left no flight record", r, how);
            }
    } else if (nwaiting > 0) {
        add_no_root(&l, &j, list);
    } else {
        add(&l, "no rank waits on another");
        for (int r = 0; r < n; r++)
            if (ranks[r].state == LOOM_RANK_STOPPED)
                add(&l, "; rank %d is stopped", r);
    }
done:
    free(j.waits);
    free(j.waiting);
    free(root);
    free(via);
    free(list);
    return nwaiting > 0;
}
