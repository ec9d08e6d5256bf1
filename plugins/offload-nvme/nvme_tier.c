/* offload-nvme: the memory tier on a fast local disk (docs/offload.md).
 *
 * Each rank keeps one unnamed file (O_TMPFILE: nothing outlives the
 * process, not even after kill -9) and moves it in chunks of block_bytes
 * through io_uring, with O_DIRECT and registered buffers, keeping a CRC32C
 * per chunk (the host's, the core's own) that every read checks.
 *
 * A whole chunk at a 4096-aligned address of the caller moves straight
 * between the disk and the caller's memory (zero copy), which is registered
 * with the ring for as long as its request runs; anything else goes through
 * a bounce buffer of the tier's. A zero-copy chunk's CRC is computed after
 * its I/O is submitted, with the lock free: a write's while the disk takes
 * the bytes (they are the caller's and stay put until the request is done),
 * a read's once the next I/Os are on their way, so the queue stays full.
 *
 * Callers only queue requests. One I/O thread owns the ring, the bounce
 * buffers and the copies: it works the queue in order, a chunk at a time,
 * and stops at a chunk that still has a transfer in flight, so transfers
 * touching one chunk never overlap and a partial chunk's read-modify-write
 * is never torn. It sleeps in the ring only: completions and a poll on an
 * eventfd the callers write to wake it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "loom/memtier.h"

#define DIRECT_ALIGN 4096 /* what O_DIRECT asks of offsets, lengths and buffers */
#define WAKE_TAG UINT64_MAX
#define MIB (1024.0 * 1024.0)

enum chunk_state { CHUNK_UNWRITTEN = 0, CHUNK_WRITTEN, CHUNK_LOST };

typedef struct chunk_info {
    uint32_t crc;  /* of the whole chunk as last written */
    uint8_t state; /* chunk_state */
    uint8_t busy;  /* a transfer of it is in flight */
} chunk_info;

typedef enum op_kind { OP_WRITE, OP_READ, OP_PREFETCH } op_kind;
static const char *const op_names[] = {"write", "read", "prefetch"};

/* What a bounce buffer's I/O is for. */
enum slot_phase { PHASE_READ, PHASE_PREFETCH, PHASE_PATCH_READ, PHASE_WRITE };

typedef struct io_slot {
    unsigned char *buf; /* block_bytes, registered with the ring */
    loom_tier_request *req;
    size_t chunk, within, len; /* the file chunk, and the request's part of it */
    unsigned char *user;       /* the request's bytes of that part */
    int phase;
    int zero_copy; /* the I/O moves user, a whole chunk, not buf */
    uint32_t crc;  /* of what is being written */
} io_slot;

/* A zero-copy chunk's CRC, computed by the I/O thread outside the lock. */
typedef struct deferred_crc {
    io_slot *write;         /* a write in flight: its crc goes here */
    loom_tier_request *req; /* or a read done: the caller's bytes to check */
    size_t chunk;
    const unsigned char *bytes;
    uint32_t expected, found;
} deferred_crc;

typedef struct extent {
    size_t first, count; /* in chunks */
} extent;

typedef struct cache_entry {
    size_t chunk;
    int valid;
} cache_entry;

struct loom_tier_block {
    size_t first_chunk, nchunks, bytes;
    unsigned in_flight; /* requests on it not finished */
};

struct loom_tier_request {
    loom_memtier *tier;
    loom_tier_request *next; /* in the queue */
    loom_tier_block *block;
    op_kind kind;
    size_t offset, bytes, cursor; /* the range in the block; the next byte to start */
    unsigned char *user;
    size_t pending; /* chunks not finished */
    int registered; /* the ring's buffer index of [user, +bytes), or -1 */
    uint64_t start_ns;
    int done, status, abandoned;
    char error[512];
};

struct loom_memtier {
    const loom_host *host;
    char path[PATH_MAX];
    int fd, direct, fixed;
    size_t block_bytes;
    unsigned queue_depth;

    struct io_uring ring;
    int ring_ready, wake_fd, thread_started, stopping;
    pthread_t thread;
    pthread_mutex_t lock; /* everything below, and the requests */
    pthread_cond_t done_cv;

    void *bounce_mem, *cache_mem; /* from host->mem_alloc, aligned inside */
    io_slot *slots;
    unsigned *free_slots, nfree;
    /* the ring's buffer table: queue_depth bounce buffers, then caller ranges */
    int register_callers; /* 0 once the locked-memory limit refused a caller's range */
    int told_unregistered;
    unsigned caller_slots;
    unsigned char *caller_slot_used;
    deferred_crc *deferred; /* 2 * queue_depth: the reads reaped, the writes started */
    unsigned ndeferred;
    cache_entry *cache; /* queue_depth chunks read ahead */
    unsigned char *cache_buf;
    unsigned cache_next;

    chunk_info *chunks;
    size_t file_chunks, chunks_cap;
    extent *holes; /* free ranges of the file, by offset */
    size_t nholes, holes_cap;

    loom_tier_request *queue_head, *queue_tail;
};

/* ------------------------------------------------------------ messages */

static int fail(loom_memtier *t, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(loom_memtier *t, int status, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return t->host->error(t->host, status, "memory.offload.path = '%s': %s", t->path, what);
}

/* The first error of a request, said when its owner tests or waits. */
static void req_fail(loom_tier_request *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void req_fail(loom_tier_request *r, int status, const char *fmt, ...)
{
    if (r->status)
        return;
    r->status = status;
    int n = snprintf(r->error, sizeof r->error, "memory.offload.path = '%s': ", r->tier->path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error + n, sizeof r->error - (size_t)n, fmt, ap);
    va_end(ap);
}

/* "16 MiB", "3.9 MiB" */
static const char *mib(double bytes, char *buf, size_t cap)
{
    double m = bytes / MIB;
    if (m == (double)(uint64_t)m)
        snprintf(buf, cap, "%llu MiB", (unsigned long long)m);
    else
        snprintf(buf, cap, "%.1f MiB", m);
    return buf;
}

static unsigned long long file_offset(const loom_memtier *t, size_t chunk)
{
    return (unsigned long long)chunk * t->block_bytes;
}

/* ------------------------------------------------------------ the file */

static const loom_setting_spec nvme_settings[] = {
    {.name = "path", .type = LOOM_SETTING_STRING, .default_value = NULL,
     .help = "an existing directory on a fast local disk; each rank keeps one unnamed file there"},
    {.name = "queue_depth", .type = LOOM_SETTING_INT, .default_value = "8",
     .help = "I/Os in flight per rank (and chunks read ahead)",
     .bounds = LOOM_SETTING_MIN | LOOM_SETTING_MAX, .min = 1, .max = 1024},
    {.name = "block_bytes", .type = LOOM_SETTING_INT, .default_value = "1048576",
     .help = "the unit of I/O and of the checksum: a multiple of 4096, at most 1 GiB",
     .bounds = LOOM_SETTING_MIN, .min = 4096},
    {0},
};

/* A file of ours in the directory that no path reaches, so it vanishes with
 * the process: O_TMPFILE, or where the file system lacks it a name no other
 * process can pick, unlinked at once. -1 and errno on failure. */
static int open_unnamed(loom_memtier *t, int direct, int *named)
{
    int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
    *named = 0;
    int fd = open(t->path, O_TMPFILE | flags, 0600);
    if (fd >= 0 || (errno != EISDIR && errno != EOPNOTSUPP))
        return fd;
    char host[64] = "host", name[PATH_MAX + 160];
    gethostname(host, sizeof host - 1);
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t nonce = 0;
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            nonce = (uint64_t)time(NULL) * 2654435761u + (uint64_t)attempt;
        snprintf(name, sizeof name, "%s/.loom-nvme-%s-%ld-%d-%016llx", t->path, host,
                 (long)getpid(), t->host->rank, (unsigned long long)nonce);
        fd = open(name, O_CREAT | O_EXCL | flags, 0600);
        int err = errno;
        if (fd >= 0 || err != EEXIST)
            unlink(name); /* ours: a refused O_DIRECT may leave it created */
        if (fd >= 0)
            *named = 1;
        if (fd >= 0 || err != EEXIST) {
            errno = err;
            return fd;
        }
    }
    return -1;
}

static int open_file(loom_memtier *t)
{
    struct stat st;
    if (stat(t->path, &st) != 0) {
        if (errno == ENOENT)
            return fail(t, LOOM_ERR_NOT_FOUND, "no such directory; create it or name another");
        if (errno == EACCES)
            return fail(t, LOOM_ERR_INVALID, "permission denied on the way to it; name a "
                        "directory this user can reach and write");
        return fail(t, LOOM_ERR_INVALID, "cannot look at it: %s", strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return fail(t, LOOM_ERR_INVALID, "not a directory; name a directory on a fast local disk");
    int named = 0;
    t->direct = 1;
    t->fd = open_unnamed(t, 1, &named);
    if (t->fd < 0 && errno == EINVAL) {
        t->direct = 0;
        t->fd = open_unnamed(t, 0, &named);
        if (t->fd >= 0)
            t->host->log(t->host, LOOM_LOG_WARN,
                         "memory.offload.path = '%s': the file system refuses O_DIRECT; using "
                         "buffered I/O (slower, and the page cache keeps a copy)", t->path);
    }
    if (t->fd >= 0)
        return LOOM_OK;
    if (errno == EACCES || errno == EPERM)
        return fail(t, LOOM_ERR_INVALID, "permission denied; name a directory this user can write");
    if (errno == EROFS)
        return fail(t, LOOM_ERR_INVALID, "read-only file system; name a writable directory");
    return fail(t, LOOM_ERR_INVALID, "cannot create a file there: %s", strerror(errno));
}

/* ------------------------------------------------------------ read-ahead cache */

static int cache_find(loom_memtier *t, size_t chunk)
{
    for (unsigned i = 0; t->cache && i < t->queue_depth; i++)
        if (t->cache[i].valid && t->cache[i].chunk == chunk)
            return (int)i;
    return -1;
}

static void cache_drop(loom_memtier *t, size_t chunk)
{
    int i = cache_find(t, chunk);
    if (i >= 0)
        t->cache[i].valid = 0;
}

static void cache_store(loom_memtier *t, size_t chunk, const unsigned char *data)
{
    unsigned i = t->cache_next;
    t->cache_next = (i + 1) % t->queue_depth;
    memcpy(t->cache_buf + (size_t)i * t->block_bytes, data, t->block_bytes);
    t->cache[i].chunk = chunk;
    t->cache[i].valid = 1;
}

/* ------------------------------------------------------------ the I/O thread */

static void wake(loom_memtier *t)
{
    uint64_t one = 1;
    ssize_t n = write(t->wake_fd, &one, sizeof one);
    (void)n; /* a full counter already wakes it */
}

static struct io_uring_sqe *next_sqe(loom_memtier *t)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
    if (!sqe) { /* cannot happen with queue_depth + 1 entries; submit and retry all the same */
        io_uring_submit(&t->ring);
        sqe = io_uring_get_sqe(&t->ring);
    }
    return sqe;
}

static void arm_wake(loom_memtier *t)
{
    struct io_uring_sqe *sqe = next_sqe(t);
    io_uring_prep_poll_add(sqe, t->wake_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
}

static void start_io(loom_memtier *t, io_slot *s, int writing)
{
    struct io_uring_sqe *sqe = next_sqe(t);
    unsigned idx = (unsigned)(s - t->slots), len = (unsigned)t->block_bytes;
    off_t off = (off_t)file_offset(t, s->chunk);
    unsigned char *buf = s->zero_copy ? s->user : s->buf;
    int index = s->zero_copy ? s->req->registered : t->fixed ? (int)idx : -1;
    if (writing && index >= 0)
        io_uring_prep_write_fixed(sqe, t->fd, buf, len, off, index);
    else if (writing)
        io_uring_prep_write(sqe, t->fd, buf, len, off);
    else if (index >= 0)
        io_uring_prep_read_fixed(sqe, t->fd, buf, len, off, index);
    else
        io_uring_prep_read(sqe, t->fd, buf, len, off);
    io_uring_sqe_set_data64(sqe, idx);
}

/* Registers a request's range of the caller's memory with the ring, for its
 * zero-copy chunks; where that fails they move unregistered, said once.
 * Past 1 GiB (the kernel's limit for one buffer) they move unregistered. */
static void register_caller(loom_memtier *t, loom_tier_request *r)
{
    if (r->registered >= 0 || !t->register_callers || r->bytes > ((size_t)1 << 30))
        return;
    unsigned i = 0;
    while (i < t->caller_slots && t->caller_slot_used[i])
        i++;
    if (i == t->caller_slots)
        return; /* many one-chunk requests at once: this one moves unregistered */
    struct iovec iov = {r->user, r->bytes};
    int rc = io_uring_register_buffers_update_tag(&t->ring, t->queue_depth + i, &iov, NULL, 1);
    if (rc < 0) {
        if (!t->told_unregistered++)
            t->host->log(t->host, LOOM_LOG_WARN, "memory.offload.path = '%s': cannot register "
                         "the caller's memory with io_uring (%s%s); moving it unregistered",
                         t->path, strerror(-rc), rc == -ENOMEM ? ": raise ulimit -l" : "");
        if (rc == -ENOMEM) /* the locked-memory limit: every later range would fail too */
            t->register_callers = 0;
        return;
    }
    t->caller_slot_used[i] = 1;
    r->registered = (int)(t->queue_depth + i);
}

static void unregister_caller(loom_memtier *t, loom_tier_request *r)
{
    if (r->registered < 0)
        return;
    struct iovec none = {NULL, 0};
    io_uring_register_buffers_update_tag(&t->ring, (unsigned)r->registered, &none, NULL, 1);
    t->caller_slot_used[(unsigned)r->registered - t->queue_depth] = 0;
    r->registered = -1;
}

static void request_finished(loom_memtier *t, loom_tier_request *r)
{
    unregister_caller(t, r);
    if (t->host->trace && t->host->now_ns)
        t->host->trace(t->host, LOOM_LANE_MEMORY, r->kind == OP_WRITE ? "nvme write"
                                                  : r->kind == OP_READ ? "nvme read"
                                                                       : "nvme prefetch",
                       r->start_ns, t->host->now_ns(), r->bytes);
    r->done = 1;
    r->block->in_flight--;
    if (r->kind == OP_PREFETCH || r->abandoned)
        free(r);
    pthread_cond_broadcast(&t->done_cv);
}

static void chunk_finished(loom_memtier *t, loom_tier_request *r)
{
    if (--r->pending == 0)
        request_finished(t, r);
}

static loom_tier_request *slot_free(loom_memtier *t, io_slot *s)
{
    t->chunks[s->chunk].busy = 0;
    t->free_slots[t->nfree++] = (unsigned)(s - t->slots);
    loom_tier_request *r = s->req;
    s->req = NULL;
    return r;
}

static void slot_release(loom_memtier *t, io_slot *s)
{
    chunk_finished(t, slot_free(t, s));
}

static void check_crc(loom_memtier *t, loom_tier_request *r, size_t chunk, uint32_t expected,
                      uint32_t found)
{
    if (found != expected)
        req_fail(r, LOOM_ERR_INTERNAL, "checksum mismatch in chunk %zu at file offset %llu: "
                 "expected CRC32C 0x%08x, found 0x%08x; the file was changed under the job",
                 chunk, file_offset(t, chunk), expected, found);
}

/* Does this part of a request need a bounce buffer (an I/O)? */
static int needs_io(loom_memtier *t, const loom_tier_request *r, size_t chunk)
{
    if (r->kind == OP_WRITE)
        return 1;
    return t->chunks[chunk].state == CHUNK_WRITTEN && cache_find(t, chunk) < 0;
}

/* Start one chunk's part of a request; the request may finish (and be
 * freed) here. */
static void run_part(loom_memtier *t, loom_tier_request *r, size_t chunk, size_t within,
                     size_t len, unsigned char *user)
{
    chunk_info *ci = &t->chunks[chunk];
    size_t bb = t->block_bytes;
    if (r->kind == OP_WRITE)
        cache_drop(t, chunk);
    if (!needs_io(t, r, chunk)) { /* a read or prefetch the disk need not see */
        int hit = cache_find(t, chunk);
        if (r->kind == OP_READ && hit >= 0)
            memcpy(user, t->cache_buf + (size_t)hit * bb + within, len);
        else if (r->kind == OP_READ && ci->state == CHUNK_UNWRITTEN)
            memset(user, 0, len);
        else if (r->kind == OP_READ)
            req_fail(r, LOOM_ERR_INTERNAL, "chunk %zu (file offset %llu) holds nothing valid: "
                     "writing it failed earlier", chunk, file_offset(t, chunk));
        chunk_finished(t, r);
        return;
    }
    if (r->kind == OP_WRITE && len < bb && ci->state == CHUNK_LOST) {
        req_fail(r, LOOM_ERR_INTERNAL, "chunk %zu (file offset %llu) holds nothing valid to "
                 "patch: writing it failed earlier", chunk, file_offset(t, chunk));
        chunk_finished(t, r);
        return;
    }
    io_slot *s = &t->slots[t->free_slots[--t->nfree]];
    *s = (io_slot){.buf = s->buf, .req = r, .chunk = chunk, .within = within, .len = len,
                   .user = user};
    ci->busy = 1;
    if (r->kind != OP_PREFETCH && len == bb && (uintptr_t)user % DIRECT_ALIGN == 0) {
        s->zero_copy = 1;
        s->phase = r->kind == OP_WRITE ? PHASE_WRITE : PHASE_READ;
        register_caller(t, r);
        start_io(t, s, r->kind == OP_WRITE);
        if (r->kind == OP_WRITE)
            t->deferred[t->ndeferred++] = (deferred_crc){.write = s, .bytes = user};
    } else if (r->kind == OP_READ || r->kind == OP_PREFETCH) {
        s->phase = r->kind == OP_READ ? PHASE_READ : PHASE_PREFETCH;
        start_io(t, s, 0);
    } else if (len == bb) {
        s->phase = PHASE_WRITE;
        s->crc = t->host->copy_crc32c(s->buf, user, bb);
        start_io(t, s, 1);
    } else if (ci->state == CHUNK_WRITTEN) {
        s->phase = PHASE_PATCH_READ; /* read, check, patch, then write */
        start_io(t, s, 0);
    } else {
        s->phase = PHASE_WRITE;
        memset(s->buf, 0, bb);
        memcpy(s->buf + within, user, len);
        s->crc = t->host->crc32c(0, s->buf, bb);
        start_io(t, s, 1);
    }
}

/* Start what the queue holds, in order, as far as bounce buffers allow. */
static void dispatch(loom_memtier *t)
{
    size_t bb = t->block_bytes;
    while (t->queue_head) {
        loom_tier_request *r = t->queue_head;
        size_t end = r->offset + r->bytes, within = r->cursor % bb;
        size_t chunk = r->block->first_chunk + r->cursor / bb;
        size_t len = bb - within < end - r->cursor ? bb - within : end - r->cursor;
        unsigned char *user = r->user ? r->user + (r->cursor - r->offset) : NULL;
        if (t->chunks[chunk].busy || (needs_io(t, r, chunk) && t->nfree == 0))
            return; /* never overtake: transfers of one chunk keep their order */
        r->cursor += len;
        if (r->cursor == end && !(t->queue_head = r->next))
            t->queue_tail = NULL;
        run_part(t, r, chunk, within, len, user);
    }
}

static void io_done(loom_memtier *t, io_slot *s, int res)
{
    chunk_info *ci = &t->chunks[s->chunk];
    loom_tier_request *r = s->req;
    size_t bb = t->block_bytes;
    int writing = s->phase == PHASE_WRITE;
    if (res != (int)bb) {
        if (writing)
            ci->state = CHUNK_LOST;
        if (res < 0)
            req_fail(r, LOOM_ERR_INTERNAL, "%s of chunk %zu (file offset %llu) failed: %s",
                     writing ? "write" : "read", s->chunk, file_offset(t, s->chunk),
                     strerror(-res));
        else
            req_fail(r, LOOM_ERR_INTERNAL, "%s of chunk %zu (file offset %llu) moved %d of %zu "
                     "bytes", writing ? "write" : "read", s->chunk, file_offset(t, s->chunk),
                     res, bb);
        slot_release(t, s);
        return;
    }
    if (writing) {
        ci->crc = s->crc;
        ci->state = CHUNK_WRITTEN;
        slot_release(t, s);
        return;
    }
    if (s->zero_copy) { /* checked once the next I/Os are submitted */
        t->deferred[t->ndeferred++] = (deferred_crc){.req = r, .chunk = s->chunk,
                                                     .bytes = s->user, .expected = ci->crc};
        slot_free(t, s);
        return;
    }
    uint32_t found = t->host->crc32c(0, s->buf, bb);
    if (found != ci->crc) {
        check_crc(t, r, s->chunk, ci->crc, found);
    } else if (s->phase == PHASE_READ) {
        memcpy(s->user, s->buf + s->within, s->len);
    } else if (s->phase == PHASE_PREFETCH) {
        cache_store(t, s->chunk, s->buf);
    } else {
        memcpy(s->buf + s->within, s->user, s->len);
        s->crc = t->host->crc32c(0, s->buf, bb);
        s->phase = PHASE_WRITE;
        start_io(t, s, 1);
        return;
    }
    slot_release(t, s);
}

static void reap(loom_memtier *t)
{
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&t->ring, &cqe) == 0) {
        uint64_t tag = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&t->ring, cqe);
        if (tag == WAKE_TAG) {
            uint64_t count;
            ssize_t n = read(t->wake_fd, &count, sizeof count);
            (void)n; /* EAGAIN: already drained */
            arm_wake(t);
        } else {
            io_done(t, &t->slots[tag], res);
        }
    }
}

/* Without the lock: only the I/O thread touches the deferred list, the
 * slots of writes in flight, and requests not finished. */
static void compute_deferred(loom_memtier *t)
{
    for (unsigned i = 0; i < t->ndeferred; i++) {
        deferred_crc *d = &t->deferred[i];
        uint32_t crc = t->host->crc32c(0, d->bytes, t->block_bytes);
        if (d->write)
            d->write->crc = crc;
        else
            d->found = crc;
    }
}

static void finish_deferred(loom_memtier *t)
{
    for (unsigned i = 0; i < t->ndeferred; i++) {
        deferred_crc *d = &t->deferred[i];
        if (d->req) {
            check_crc(t, d->req, d->chunk, d->expected, d->found);
            chunk_finished(t, d->req);
        }
    }
    t->ndeferred = 0;
}

static void *io_thread(void *arg)
{
    loom_memtier *t = arg;
    int complained = 0;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        dispatch(t);
        if (t->stopping && !t->queue_head && t->nfree == t->queue_depth && !t->ndeferred)
            break;
        int deferred = t->ndeferred > 0; /* then the ring is not waited on: reap after */
        pthread_mutex_unlock(&t->lock);
        int rc = deferred ? io_uring_submit(&t->ring) : io_uring_submit_and_wait(&t->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            if (!complained++)
                t->host->log(t->host, LOOM_LOG_ERROR, "memory.offload.path = '%s': io_uring: %s",
                             t->path, strerror(-rc));
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL); /* waits time out */
        }
        compute_deferred(t);
        pthread_mutex_lock(&t->lock);
        finish_deferred(t);
        reap(t);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* ------------------------------------------------------------ create, destroy */

static unsigned char *align_up(void *p)
{
    return (unsigned char *)(((uintptr_t)p + DIRECT_ALIGN - 1) & ~(uintptr_t)(DIRECT_ALIGN - 1));
}

static int start_ring(loom_memtier *t)
{
    const loom_host *h = t->host;
    size_t bytes = (size_t)t->queue_depth * t->block_bytes;
    int rc = h->mem_alloc(h, LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, bytes + DIRECT_ALIGN,
                          &t->bounce_mem);
    if (rc != LOOM_OK)
        return rc;
    /* requests with a chunk in flight or being checked, and the one dispatching */
    t->caller_slots = 2 * t->queue_depth + 1;
    t->slots = calloc(t->queue_depth, sizeof *t->slots);
    t->free_slots = calloc(t->queue_depth, sizeof *t->free_slots);
    t->caller_slot_used = calloc(t->caller_slots, 1);
    t->deferred = calloc(2 * (size_t)t->queue_depth, sizeof *t->deferred);
    struct iovec *iov = calloc(t->queue_depth, sizeof *iov);
    if (!t->slots || !t->free_slots || !t->caller_slot_used || !t->deferred || !iov) {
        free(iov);
        return fail(t, LOOM_ERR_NO_MEMORY, "out of memory for %u I/O slots", t->queue_depth);
    }
    for (unsigned i = 0; i < t->queue_depth; i++) {
        t->slots[i].buf = align_up(t->bounce_mem) + (size_t)i * t->block_bytes;
        t->free_slots[t->nfree++] = t->queue_depth - 1 - i;
        iov[i] = (struct iovec){t->slots[i].buf, t->block_bytes};
    }
    rc = io_uring_queue_init(t->queue_depth + 1, &t->ring, 0);
    if (rc < 0) {
        free(iov);
        return fail(t, LOOM_ERR_NOT_SUPPORTED, "io_uring is not available: %s (is it disabled by "
                    "the kernel.io_uring_disabled sysctl or a container's seccomp profile?)",
                    strerror(-rc));
    }
    t->ring_ready = 1;
    /* a sparse table: the bounce buffers, then room for callers' ranges */
    rc = io_uring_register_buffers_sparse(&t->ring, t->queue_depth + t->caller_slots);
    if (rc == 0) {
        rc = io_uring_register_buffers_update_tag(&t->ring, 0, iov, NULL, t->queue_depth);
        rc = rc == (int)t->queue_depth ? 0 : rc < 0 ? rc : -ENOMEM;
        t->register_callers = rc == 0;
    } else { /* a kernel before 5.19: the bounce buffers only */
        rc = io_uring_register_buffers(&t->ring, iov, t->queue_depth);
    }
    free(iov);
    t->fixed = rc == 0;
    if (!t->fixed)
        h->log(h, LOOM_LOG_WARN, "memory.offload.path = '%s': cannot register the bounce buffers "
               "with io_uring (%s); using unregistered ones", t->path, strerror(-rc));
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wake_fd < 0)
        return fail(t, LOOM_ERR_INTERNAL, "eventfd: %s", strerror(errno));
    arm_wake(t);
    if (pthread_create(&t->thread, NULL, io_thread, t) != 0)
        return fail(t, LOOM_ERR_INTERNAL, "cannot start the I/O thread");
    t->thread_started = 1;
    return LOOM_OK;
}

/* Everything create made, whatever it got to; waits for the queue first. */
static void release(loom_memtier *t)
{
    if (t->thread_started) {
        pthread_mutex_lock(&t->lock);
        t->stopping = 1;
        pthread_mutex_unlock(&t->lock);
        wake(t);
        pthread_join(t->thread, NULL);
    }
    if (t->ring_ready)
        io_uring_queue_exit(&t->ring);
    if (t->wake_fd >= 0)
        close(t->wake_fd);
    if (t->fd >= 0)
        close(t->fd); /* the unnamed file goes with its last descriptor */
    if (t->bounce_mem)
        t->host->mem_free(t->host, t->bounce_mem);
    if (t->cache_mem)
        t->host->mem_free(t->host, t->cache_mem);
    free(t->slots);
    free(t->free_slots);
    free(t->caller_slot_used);
    free(t->deferred);
    free(t->cache);
    free(t->chunks);
    free(t->holes);
    pthread_cond_destroy(&t->done_cv);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static int tier_create(const loom_host *host, loom_memtier **out)
{
    *out = NULL;
    const char *path = NULL;
    int64_t depth = 0, block = 0;
    /* Every chunk's checksum is the core's CRC32C, so one implementation
     * writes and checks them all. */
    if (host->version < 6 || host->struct_size < offsetof(loom_host, copy_crc32c) +
                                                     sizeof host->copy_crc32c)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED, "memory.offload: the nvme tier needs "
                           "the host's crc32c (host table version 6, loom ABI 1.8), and this "
                           "loom gives version %u; use the loom this plugin was built with",
                           host->version);
    if (host->config_string(host, "path", &path) != LOOM_OK || !path || !*path)
        return host->error(host, LOOM_ERR_INVALID, "memory.offload.path is not set; name an "
                           "existing directory on a fast local disk");
    int rc = host->config_int(host, "queue_depth", &depth);
    if (rc == LOOM_OK)
        rc = host->config_int(host, "block_bytes", &block);
    if (rc != LOOM_OK)
        return host->error(host, rc, "memory.offload: cannot read queue_depth and block_bytes");
    if (strlen(path) >= PATH_MAX - 64)
        return host->error(host, LOOM_ERR_INVALID, "memory.offload.path is %zu characters long; "
                           "name a shorter one", strlen(path));
    if (depth < 1 || depth > 1024 || block < DIRECT_ALIGN || block > (1 << 30) ||
        block % DIRECT_ALIGN)
        return host->error(host, LOOM_ERR_INVALID, "memory.offload: block_bytes = %lld, "
                           "queue_depth = %lld: want block_bytes a multiple of 4096 (the "
                           "O_DIRECT alignment) up to 1 GiB, say 1048576, and queue_depth 1..1024",
                           (long long)block, (long long)depth);
    loom_memtier *t = calloc(1, sizeof *t);
    if (!t)
        return host->error(host, LOOM_ERR_NO_MEMORY, "memory.offload: out of memory");
    t->host = host;
    t->fd = t->wake_fd = -1;
    snprintf(t->path, sizeof t->path, "%s", path);
    t->queue_depth = (unsigned)depth;
    t->block_bytes = (size_t)block;
    pthread_mutex_init(&t->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->done_cv, &attr);
    pthread_condattr_destroy(&attr);
    rc = open_file(t);
    if (rc == LOOM_OK)
        rc = start_ring(t);
    if (rc != LOOM_OK) {
        release(t);
        return rc;
    }
    host->log(host, LOOM_LOG_INFO, "memory.offload.path = '%s': unnamed file, fd %d, %s I/O, "
              "queue depth %u, blocks of %zu bytes", t->path, t->fd,
              t->direct ? "direct" : "buffered", t->queue_depth, t->block_bytes);
    *out = t;
    return LOOM_OK;
}

static int tier_destroy(loom_memtier *tier)
{
    release(tier);
    return LOOM_OK;
}

static int tier_capacity(loom_memtier *t, uint64_t *total, uint64_t *available)
{
    struct statvfs sv;
    if (statvfs(t->path, &sv) != 0)
        return fail(t, LOOM_ERR_INTERNAL, "statvfs: %s", strerror(errno));
    *total = (uint64_t)sv.f_blocks * sv.f_frsize;
    *available = (uint64_t)sv.f_bavail * sv.f_frsize;
    struct sysinfo si;
    if (*total == 0 && sysinfo(&si) == 0) { /* ramfs has no size: it is the machine's memory */
        *total = (uint64_t)si.totalram * si.mem_unit;
        *available = (uint64_t)si.freeram * si.mem_unit;
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------ space */

static int grow_chunks(loom_memtier *t, size_t need)
{
    if (need <= t->chunks_cap)
        return 0;
    size_t cap = t->chunks_cap ? t->chunks_cap : 64;
    while (cap < need)
        cap *= 2;
    chunk_info *grown = realloc(t->chunks, cap * sizeof *grown);
    if (!grown)
        return -1;
    memset(grown + t->chunks_cap, 0, (cap - t->chunks_cap) * sizeof *grown);
    t->chunks = grown;
    t->chunks_cap = cap;
    return 0;
}

/* Give a range back to the free list, merged with its neighbours. */
static int add_hole(loom_memtier *t, size_t first, size_t count)
{
    size_t i = 0;
    while (i < t->nholes && t->holes[i].first < first)
        i++;
    int after_prev = i > 0 && t->holes[i - 1].first + t->holes[i - 1].count == first;
    int before_next = i < t->nholes && first + count == t->holes[i].first;
    if (after_prev && before_next) {
        t->holes[i - 1].count += count + t->holes[i].count;
        memmove(&t->holes[i], &t->holes[i + 1], (t->nholes - i - 1) * sizeof *t->holes);
        t->nholes--;
    } else if (after_prev) {
        t->holes[i - 1].count += count;
    } else if (before_next) {
        t->holes[i].first = first;
        t->holes[i].count += count;
    } else {
        if (t->nholes == t->holes_cap) {
            size_t cap = t->holes_cap ? 2 * t->holes_cap : 16;
            extent *grown = realloc(t->holes, cap * sizeof *grown);
            if (!grown)
                return -1;
            t->holes = grown;
            t->holes_cap = cap;
        }
        memmove(&t->holes[i + 1], &t->holes[i], (t->nholes - i) * sizeof *t->holes);
        t->holes[i] = (extent){first, count};
        t->nholes++;
    }
    return 0;
}

/* n chunks of the file, first fit, else at its end; reserved on disk so
 * that a full disk fails here and not in the middle of training. */
static int reserve(loom_memtier *t, size_t n, size_t *first)
{
    size_t bb = t->block_bytes, i = 0;
    while (i < t->nholes && t->holes[i].count < n)
        i++;
    int at_end = i == t->nholes;
    if (at_end) {
        *first = t->file_chunks;
        if (grow_chunks(t, t->file_chunks + n))
            return fail(t, LOOM_ERR_NO_MEMORY, "out of memory for the chunk table");
    } else {
        *first = t->holes[i].first;
    }
    off_t off = (off_t)(*first * bb), len = (off_t)(n * bb);
    if (fallocate(t->fd, 0, off, len) != 0) {
        int err = errno;
        if (err == EOPNOTSUPP) { /* ramfs: nothing to reserve, it takes pages as written */
            if (at_end && ftruncate(t->fd, off + len) != 0)
                return fail(t, LOOM_ERR_NO_MEMORY, "cannot grow the file: %s", strerror(errno));
        } else {
            /* give back what a failed fallocate may have taken */
            if (at_end)
                (void)!ftruncate(t->fd, off);
            else
                fallocate(t->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len);
            char want[32], have[32];
            uint64_t total = 0, avail = 0;
            if (err != ENOSPC || tier_capacity(t, &total, &avail) != LOOM_OK)
                return fail(t, LOOM_ERR_NO_MEMORY, "cannot reserve %s: %s",
                            mib((double)len, want, sizeof want), strerror(err));
            /* what the rank holds already: the whole need, not only this block */
            size_t held = t->file_chunks;
            for (size_t h = 0; h < t->nholes; h++)
                held -= t->holes[h].count;
            char holds[32];
            return fail(t, LOOM_ERR_NO_MEMORY, "no space for %s more (this rank's file holds %s "
                        "already; %s available on the file system); free space or name a "
                        "larger disk",
                        mib((double)len, want, sizeof want),
                        mib((double)held * (double)bb, holds, sizeof holds),
                        mib((double)avail, have, sizeof have));
        }
    }
    if (at_end) {
        t->file_chunks += n;
    } else if ((t->holes[i].count -= n) == 0) {
        memmove(&t->holes[i], &t->holes[i + 1], (t->nholes - i - 1) * sizeof *t->holes);
        t->nholes--;
    } else {
        t->holes[i].first += n;
    }
    return LOOM_OK;
}

static int tier_alloc(loom_memtier *t, size_t bytes, size_t alignment, loom_tier_block **out)
{
    (void)alignment; /* a block starts on a chunk; offsets inside it are the caller's */
    *out = NULL;
    loom_tier_block *b = calloc(1, sizeof *b);
    if (!b)
        return fail(t, LOOM_ERR_NO_MEMORY, "out of memory");
    b->bytes = bytes;
    b->nchunks = bytes / t->block_bytes + (bytes % t->block_bytes != 0);
    int rc = LOOM_OK;
    if (b->nchunks) {
        pthread_mutex_lock(&t->lock);
        rc = reserve(t, b->nchunks, &b->first_chunk);
        pthread_mutex_unlock(&t->lock);
    }
    if (rc != LOOM_OK) {
        free(b);
        return rc;
    }
    *out = b;
    return LOOM_OK;
}

static int deadline_passed(pthread_cond_t *cv, pthread_mutex_t *lock, const struct timespec *at)
{
    return pthread_cond_timedwait(cv, lock, at) == ETIMEDOUT;
}

static double timeout_s(const loom_memtier *t)
{
    return t->host->timeout_s > 0 ? t->host->timeout_s : 300;
}

static struct timespec deadline(const loom_memtier *t)
{
    double s = timeout_s(t);
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    at.tv_sec += (time_t)s;
    at.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (at.tv_nsec >= 1000000000L) {
        at.tv_sec++;
        at.tv_nsec -= 1000000000L;
    }
    return at;
}

static int tier_free(loom_memtier *t, loom_tier_block *b)
{
    struct timespec at = deadline(t);
    pthread_mutex_lock(&t->lock);
    while (b->in_flight) { /* a read-ahead, or a transfer never waited for */
        if (deadline_passed(&t->done_cv, &t->lock, &at)) {
            pthread_mutex_unlock(&t->lock);
            return fail(t, LOOM_ERR_TIMEOUT, "freeing a block of %zu bytes: %u transfers of it "
                        "did not finish in %g s", b->bytes, b->in_flight, timeout_s(t));
        }
    }
    for (size_t c = b->first_chunk; c < b->first_chunk + b->nchunks; c++) {
        t->chunks[c] = (chunk_info){0};
        cache_drop(t, c);
    }
    int rc = b->nchunks ? add_hole(t, b->first_chunk, b->nchunks) : 0;
    if (b->nchunks) /* hand the space back to the disk; ramfs cannot, and need not */
        fallocate(t->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  (off_t)file_offset(t, b->first_chunk), (off_t)(b->nchunks * t->block_bytes));
    pthread_mutex_unlock(&t->lock);
    free(b);
    return rc ? fail(t, LOOM_ERR_NO_MEMORY, "out of memory for the free list") : LOOM_OK;
}

/* ------------------------------------------------------------ transfers */

static int submit(loom_memtier *t, op_kind kind, loom_tier_block *b, size_t offset, void *user,
                  size_t bytes, loom_tier_request **out)
{
    if (out)
        *out = NULL;
    if (offset > b->bytes || bytes > b->bytes - offset)
        return fail(t, LOOM_ERR_INVALID, "%s of [%zu, +%zu) is outside a block of %zu bytes",
                    op_names[kind], offset, bytes, b->bytes);
    if (!bytes)
        return LOOM_OK;
    loom_tier_request *r = calloc(1, sizeof *r);
    if (!r)
        return fail(t, LOOM_ERR_NO_MEMORY, "out of memory for a request");
    size_t bb = t->block_bytes;
    *r = (loom_tier_request){.tier = t, .block = b, .kind = kind, .offset = offset,
                             .bytes = bytes, .cursor = offset, .user = user, .registered = -1,
                             .pending = (offset + bytes - 1) / bb - offset / bb + 1,
                             .start_ns = t->host->now_ns ? t->host->now_ns() : 0};
    pthread_mutex_lock(&t->lock);
    if (t->queue_tail)
        t->queue_tail->next = r;
    else
        t->queue_head = r;
    t->queue_tail = r;
    b->in_flight++;
    pthread_mutex_unlock(&t->lock);
    wake(t);
    if (out)
        *out = r;
    return LOOM_OK;
}

static int tier_write(loom_memtier *t, loom_tier_block *dst, size_t offset, const void *src,
                      size_t bytes, loom_tier_request **req)
{
    return submit(t, OP_WRITE, dst, offset, (void *)src, bytes, req);
}

static int tier_read(loom_memtier *t, loom_tier_block *src, size_t offset, void *dst,
                     size_t bytes, loom_tier_request **req)
{
    return submit(t, OP_READ, src, offset, dst, bytes, req);
}

/* Reads ahead at most queue_depth chunks, into memory set aside at the
 * first prefetch. */
static int tier_prefetch(loom_memtier *t, loom_tier_block *b, size_t offset, size_t bytes)
{
    size_t bb = t->block_bytes, limit = (size_t)t->queue_depth * bb - offset % bb;
    if (!t->cache_buf) {
        void *mem = NULL;
        cache_entry *entries = calloc(t->queue_depth, sizeof *entries);
        int rc = entries ? t->host->mem_alloc(t->host, LOOM_TIER_HOST, LOOM_PURPOSE_OTHER,
                                              (size_t)t->queue_depth * bb + DIRECT_ALIGN, &mem)
                         : fail(t, LOOM_ERR_NO_MEMORY, "out of memory for the read-ahead");
        if (rc != LOOM_OK) {
            free(entries);
            return rc;
        }
        pthread_mutex_lock(&t->lock);
        t->cache_mem = mem;
        t->cache = entries;
        t->cache_buf = align_up(mem);
        pthread_mutex_unlock(&t->lock);
    }
    return submit(t, OP_PREFETCH, b, offset, NULL, bytes < limit ? bytes : limit, NULL);
}

/* A finished request's result, said on the caller's thread; frees it. */
static int take_result(loom_memtier *t, loom_tier_request *r)
{
    int status = r->status;
    char error[sizeof r->error];
    memcpy(error, r->error, sizeof error);
    pthread_mutex_unlock(&t->lock);
    free(r);
    return status ? t->host->error(t->host, status, "%s", error) : LOOM_OK;
}

static int tier_test(loom_tier_request *r)
{
    loom_memtier *t = r->tier;
    pthread_mutex_lock(&t->lock);
    if (!r->done) {
        pthread_mutex_unlock(&t->lock);
        return LOOM_IN_PROGRESS;
    }
    return take_result(t, r);
}

static int tier_wait(loom_tier_request *r)
{
    loom_memtier *t = r->tier;
    struct timespec at = deadline(t);
    pthread_mutex_lock(&t->lock);
    while (!r->done) {
        if (deadline_passed(&t->done_cv, &t->lock, &at)) {
            r->abandoned = 1; /* the I/O thread frees it when the disk answers */
            unsigned long long at_file = file_offset(t, r->block->first_chunk) + r->offset;
            pthread_mutex_unlock(&t->lock);
            return fail(t, LOOM_ERR_TIMEOUT, "a %s of %zu bytes at offset %zu of a block (file "
                        "offset %llu) did not finish in %g s; the disk is slow or stuck",
                        op_names[r->kind], r->bytes, r->offset, at_file, timeout_s(t));
        }
    }
    return take_result(t, r);
}

LOOM_PLUGIN_EXPORT const loom_memtier_plugin_v1_t loom_memtier_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_MEMTIER, loom_memtier_plugin_v1_t, "nvme",
                                 "files on a fast local disk: io_uring, O_DIRECT, a CRC32C per "
                                 "block", nvme_settings),
    .tier = LOOM_TIER_NVME,
    .flags = 0,
    .create = tier_create,
    .destroy = tier_destroy,
    .capacity = tier_capacity,
    .alloc = tier_alloc,
    .free = tier_free,
    .write = tier_write,
    .read = tier_read,
    .test = tier_test,
    .wait = tier_wait,
    .prefetch = tier_prefetch,
};
