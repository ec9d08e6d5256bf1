/* The nvme memory tier (plugins/offload-nvme), loaded with dlopen and given
 * a host of our own: its settings, a log and an error line we can read, and
 * memory we count.
 *
 *   nvme_test CASE BASE_DIR
 *
 * Each case makes its own directory under BASE_DIR. Cases that mount a file
 * system (we run as root) exit 77, skipped, when mount is refused. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/crc32c.h"
#include "loom/memtier.h"
#include "check.h"

#define MIB (1024 * 1024)
#define SKIP 77

static const loom_memtier_plugin_v1_t *vt;

/* ------------------------------------------------------------ the host */

static struct {
    const char *path;
    int64_t queue_depth, block_bytes;
    char log[16384];
    int warnings;
    char error[1024];
    long long mem_current;
} H = {.queue_depth = 8, .block_bytes = MIB};

static void host_log(const loom_host *h, loom_log_level level, const char *fmt, ...)
{
    (void)h;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (level == LOOM_LOG_WARN)
        H.warnings++;
    size_t n = strlen(H.log);
    snprintf(H.log + n, sizeof H.log - n, "%s\n", line);
    fprintf(stderr, "log %d: %s\n", (int)level, line);
}

static int host_error(const loom_host *h, int status, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(H.error, sizeof H.error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: %s\n", H.error);
    return status;
}

static int config_int(const loom_host *h, const char *name, int64_t *out)
{
    (void)h;
    if (!strcmp(name, "queue_depth"))
        *out = H.queue_depth;
    else if (!strcmp(name, "block_bytes"))
        *out = H.block_bytes;
    else
        return LOOM_ERR_NOT_FOUND;
    return LOOM_OK;
}

static int config_string(const loom_host *h, const char *name, const char **out)
{
    (void)h;
    if (strcmp(name, "path"))
        return LOOM_ERR_NOT_FOUND;
    *out = H.path;
    return LOOM_OK;
}

/* Counted memory: a 64-byte header holds the size. */
static int mem_alloc(const loom_host *h, loom_tier tier, loom_purpose purpose, size_t bytes,
                     void **out)
{
    (void)h;
    if (tier != LOOM_TIER_HOST || purpose != LOOM_PURPOSE_OTHER)
        return LOOM_ERR_INVALID;
    char *p = aligned_alloc(64, 64 + ((bytes + 63) & ~(size_t)63));
    if (!p)
        return LOOM_ERR_NO_MEMORY;
    memcpy(p, &bytes, sizeof bytes);
    H.mem_current += (long long)bytes;
    *out = p + 64;
    return LOOM_OK;
}

static void mem_free(const loom_host *h, void *ptr)
{
    (void)h;
    size_t bytes;
    memcpy(&bytes, (char *)ptr - 64, sizeof bytes);
    H.mem_current -= (long long)bytes;
    free((char *)ptr - 64);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const loom_host host = {
    .struct_size = sizeof(loom_host), .version = LOOM_HOST_VERSION, .rank = 0, .world_size = 1,
    .local_rank = 0, .local_size = 1, .timeout_s = 20, .log = host_log, .error = host_error,
    .config_int = config_int, .config_string = config_string, .mem_alloc = mem_alloc,
    .mem_free = mem_free, .now_ns = now_ns, .crc32c = loom_crc32c_extend,
    .copy_crc32c = loom_copy_crc32c,
};

/* ------------------------------------------------------------ helpers */

static int has(const char *text, const char *part)
{
    return strstr(text, part) != NULL;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void fill_random(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)next_random();
}

static char *make_dir(const char *base, const char *name)
{
    static char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s-XXXXXX", base, name);
    REQUIRE(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
    return dir;
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    REQUIRE(d, "opendir %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static int mount_fs(const char *type, const char *dir, unsigned long flags, const char *opts)
{
    if (mount(type, dir, type, flags, opts) == 0)
        return 1;
    printf("skip: mount -t %s %s: %s\n", type, dir, strerror(errno));
    rmdir(dir);
    return 0;
}

static void unmount_fs(const char *dir)
{
    umount2(dir, MNT_DETACH);
    rmdir(dir);
}

static loom_memtier *open_tier(const char *path)
{
    H.path = path;
    loom_memtier *t = NULL;
    int rc = vt->create(&host, &t);
    REQUIRE(rc == LOOM_OK && t, "create in %s: %d: %s", path, rc, H.error);
    return t;
}

/* create fails; its one line is in H.error. */
static void refuse_create(const char *path, const char *want)
{
    H.path = path;
    H.error[0] = 0;
    loom_memtier *t = NULL;
    int rc = vt->create(&host, &t);
    CHECK(rc != LOOM_OK && !t, "create in %s succeeded", path);
    CHECK(has(H.error, want), "create in %s: '%s', want '%s'", path, H.error, want);
    CHECK(!strchr(H.error, '\n'), "more than one line: '%s'", H.error);
}

static int finish(int rc, loom_tier_request *req)
{
    if (rc == LOOM_OK && req && (rc = vt->test(req)) == LOOM_IN_PROGRESS)
        rc = vt->wait(req);
    return rc;
}

static int move(loom_memtier *t, loom_tier_block *b, size_t off, void *buf, size_t n, int writing)
{
    loom_tier_request *req = NULL;
    int rc = writing ? vt->write(t, b, off, buf, n, &req) : vt->read(t, b, off, buf, n, &req);
    return finish(rc, req);
}

/* Where the caller's memory is 4096-aligned, whole chunks move straight
 * between it and the disk (zero copy); elsewhere through bounce buffers. */
static unsigned char *buffer(size_t n, int aligned)
{
    unsigned char *p = aligned_alloc(4096, (n + 16 + 4095) & ~(size_t)4095);
    REQUIRE(p, "out of memory");
    return aligned ? p : p + 16;
}

static void free_buffer(unsigned char *p)
{
    free(p - (uintptr_t)p % 4096);
}

static int is_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* ------------------------------------------------------------ cases */

static void case_crc32c(void)
{
    const char *v = "123456789";
    CHECK(loom_crc32c(v, 9) == 0xE3069283u, "crc32c = %08x", loom_crc32c(v, 9));
    CHECK(loom_crc32c_portable(v, 9) == 0xE3069283u, "portable = %08x",
          loom_crc32c_portable(v, 9));
    CHECK(loom_crc32c("", 0) == 0, "crc32c of nothing");
    CHECK(loom_crc32c_extend(loom_crc32c(v, 4), v + 4, 5) == 0xE3069283u, "crc32c in two pieces");
    unsigned char src[3000], dst[3000];
    fill_random(src, sizeof src);
    for (size_t start = 0; start < 9; start++)
        for (size_t n = 0; n < 300; n += 7) {
            uint32_t want = loom_crc32c_portable(src + start, n);
            CHECK(loom_crc32c(src + start, n) == want, "start %zu len %zu", start, n);
            CHECK(loom_copy_crc32c(dst, src + start, n) == want && !memcmp(dst, src + start, n),
                  "copy: start %zu len %zu", start, n);
        }
    uint32_t whole = loom_crc32c_portable(src, sizeof src);
    CHECK(loom_copy_crc32c(dst, src, sizeof src) == whole, "copy of 3000 bytes");

    /* lengths that take the three-chain path (rounds of 3 x 4096 bytes), its
     * joins and its remainders, at random alignments */
    enum { BIG = 200 * 1024 };
    unsigned char *big = malloc(BIG + 64), *copy = malloc(BIG + 64);
    REQUIRE(big && copy, "out of memory");
    fill_random(big, BIG + 64);
    for (int k = 0; k < 200; k++) {
        size_t start = next_random() % 64, n = next_random() % (BIG + 1);
        if (k < 8) /* exactly whole rounds, and one byte either side */
            n = (size_t)(k / 3 + 1) * 3 * 4096 + (size_t)(k % 3) - 1;
        uint32_t want = loom_crc32c_portable(big + start, n);
        CHECK(loom_crc32c(big + start, n) == want, "start %zu len %zu", start, n);
        size_t to = next_random() % 64;
        CHECK(loom_copy_crc32c(copy + to, big + start, n) == want &&
                  !memcmp(copy + to, big + start, n),
              "copy: start %zu to %zu len %zu", start, to, n);
    }
    free(big);
    free(copy);
}

/* Random writes and reads against a model, several in flight at once, over
 * ranges of every kind: whole chunks, partial ones, across borders. */
static void exercise(loom_memtier *t, size_t size, size_t block_bytes, int aligned)
{
    loom_tier_block *b = NULL;
    REQUIRE(vt->alloc(t, size, 64, &b) == LOOM_OK && b, "alloc %zu: %s", size, H.error);
    unsigned char *model = calloc(1, size), *data = buffer(size, aligned);
    unsigned char *got = buffer(size, aligned), *over = buffer(size, aligned);
    REQUIRE(model, "out of memory");

    memset(got, 0xAA, size);
    CHECK(move(t, b, 0, got, size, 0) == LOOM_OK, "read fresh: %s", H.error);
    CHECK(is_zero(got, size), "a fresh block of %zu bytes does not read as zeros", size);

    /* the whole block in random pieces, all in flight, then overlapping ones */
    enum { PIECES = 12 };
    loom_tier_request *reqs[2 * PIECES] = {0};
    int nreq = 0;
    fill_random(over, size); /* first the whole block in one request */
    CHECK(move(t, b, 0, over, size, 1) == LOOM_OK, "write whole: %s", H.error);
    CHECK(move(t, b, 0, got, size, 0) == LOOM_OK && !memcmp(got, over, size),
          "size %zu: the whole block read back differs: %s", size, H.error);
    fill_random(data, size);
    for (size_t at = 0; at < size;) {
        size_t n = 1 + next_random() % (size / 3 + 1);
        if (n > size - at || nreq == PIECES - 1)
            n = size - at;
        CHECK(vt->write(t, b, at, data + at, n, &reqs[nreq++]) == LOOM_OK, "write: %s", H.error);
        memcpy(model + at, data + at, n);
        at += n;
    }
    fill_random(over, size);
    for (int k = 0; k < PIECES; k++) {
        size_t at = next_random() % size, n = 1 + next_random() % (size - at);
        if (k % 3 == 0 && size > block_bytes) { /* chunk-aligned, whole chunks */
            at = (next_random() % (size / block_bytes)) * block_bytes;
            n = block_bytes;
        }
        CHECK(vt->write(t, b, at, over + at, n, &reqs[nreq++]) == LOOM_OK, "write: %s", H.error);
        memcpy(model + at, over + at, n);
    }
    for (int k = 0; k < nreq; k++)
        CHECK(finish(LOOM_OK, reqs[k]) == LOOM_OK, "write %d: %s", k, H.error);

    /* read back in other pieces, in flight together */
    memset(got, 0x55, size);
    nreq = 0;
    for (size_t at = 0; at < size;) {
        size_t n = 1 + next_random() % (size / 4 + 1);
        if (n > size - at || nreq == PIECES - 1)
            n = size - at;
        CHECK(vt->read(t, b, at, got + at, n, &reqs[nreq++]) == LOOM_OK, "read: %s", H.error);
        at += n;
    }
    for (int k = 0; k < nreq; k++)
        CHECK(finish(LOOM_OK, reqs[k]) == LOOM_OK, "read %d: %s", k, H.error);
    size_t bad = 0;
    while (bad < size && got[bad] == model[bad])
        bad++;
    CHECK(bad == size, "size %zu: byte %zu reads %u, the model says %u", size, bad, got[bad],
          model[bad]);
    memset(got, 0x66, size);
    CHECK(move(t, b, 0, got, size, 0) == LOOM_OK && !memcmp(got, model, size),
          "size %zu: the whole block read in one request differs: %s", size, H.error);

    /* read-ahead: the next read is served from it, and a write in between wins */
    if (vt->prefetch) {
        CHECK(vt->prefetch(t, b, 0, size) == LOOM_OK, "prefetch: %s", H.error);
        size_t n = size < 100 ? size : 100;
        memset(data, 0x33, n);
        CHECK(move(t, b, 0, data, n, 1) == LOOM_OK, "write after prefetch: %s", H.error);
        memcpy(model, data, n);
        CHECK(move(t, b, 0, got, size, 0) == LOOM_OK, "read after prefetch: %s", H.error);
        CHECK(!memcmp(got, model, size), "size %zu: read after prefetch differs", size);
    }

    /* free, alloc again (the same range, first fit): zeros */
    CHECK(vt->free(t, b) == LOOM_OK, "free: %s", H.error);
    REQUIRE(vt->alloc(t, size, 64, &b) == LOOM_OK, "realloc: %s", H.error);
    CHECK(move(t, b, 0, got, size, 0) == LOOM_OK, "read realloc'd: %s", H.error);
    CHECK(is_zero(got, size), "size %zu: a freed and allocated again block is not zeros", size);
    CHECK(vt->free(t, b) == LOOM_OK, "free: %s", H.error);
    free(model);
    free_buffer(data);
    free_buffer(got);
    free_buffer(over);
}

static void roundtrip(const char *dir, int64_t depth, int64_t block_bytes, int big)
{
    H.queue_depth = depth;
    H.block_bytes = block_bytes;
    loom_memtier *t = open_tier(dir);
    CHECK(H.mem_current >= depth * block_bytes, "bounce buffers not accounted: %lld bytes",
          H.mem_current);
    size_t bb = (size_t)block_bytes;
    size_t sizes[] = {1, 4096 + 33, 3 * bb + 777, big ? 10 * MIB : 2 * bb};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int aligned = 0; aligned < 2; aligned++)
            exercise(t, sizes[i], bb, aligned);

    /* a block the others stay out of */
    loom_tier_block *a = NULL, *b = NULL;
    unsigned char one = 7, two = 9, got = 0;
    REQUIRE(vt->alloc(t, 1, 64, &a) == LOOM_OK && vt->alloc(t, 1, 64, &b) == LOOM_OK, "alloc");
    CHECK(move(t, a, 0, &one, 1, 1) == LOOM_OK && move(t, b, 0, &two, 1, 1) == LOOM_OK, "write");
    CHECK(move(t, a, 0, &got, 1, 0) == LOOM_OK && got == 7, "block a reads %u", got);
    H.error[0] = 0;
    loom_tier_request *req = NULL;
    CHECK(vt->read(t, a, 1, &got, 1, &req) != LOOM_OK && has(H.error, "outside a block of 1"),
          "read past the end: '%s'", H.error);
    CHECK(vt->free(t, a) == LOOM_OK && vt->free(t, b) == LOOM_OK, "free");

    uint64_t total = 0, avail = 0;
    CHECK(vt->capacity(t, &total, &avail) == LOOM_OK && total > 0 && avail <= total,
          "capacity %llu of %llu", (unsigned long long)avail, (unsigned long long)total);
    CHECK(entries(dir) == 0, "the tier's file has a name in %s", dir);
    CHECK(vt->destroy(t) == LOOM_OK, "destroy");
    CHECK(H.mem_current == 0, "%lld bytes not given back", H.mem_current);
    CHECK(entries(dir) == 0, "a file is left in %s", dir);
}

static void case_roundtrip(const char *base)
{
    char *dir = make_dir(base, "roundtrip");
    roundtrip(dir, 8, MIB, 1);
    CHECK(has(H.log, "unnamed file") && has(H.log, "direct I/O") && has(H.log, "queue depth 8"),
          "the INFO line: %s", H.log);
    roundtrip(dir, 2, 4096, 0); /* many chunks, a queue that fills */
    rmdir(dir);
}

/* The fd of the tier's file: a link to "<dir>/... (deleted)". */
static int find_tier_fd(const char *proc_fd_dir, const char *dir)
{
    DIR *d = opendir(proc_fd_dir);
    REQUIRE(d, "opendir %s", proc_fd_dir);
    int found = -1;
    struct dirent *e;
    char link[PATH_MAX + 32], target[PATH_MAX];
    while ((e = readdir(d))) {
        snprintf(link, sizeof link, "%s/%s", proc_fd_dir, e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        if (!strncmp(target, dir, strlen(dir)) && target[strlen(dir)] == '/' &&
            has(target, "(deleted)"))
            found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}

static void corrupt(const char *base, int aligned)
{
    char *dir = make_dir(base, "corrupt");
    loom_memtier *t = open_tier(dir);
    size_t size = 3 * MIB;
    unsigned char *data = buffer(size, aligned), *got = buffer(size, aligned);
    fill_random(data, size);
    loom_tier_block *b = NULL;
    REQUIRE(vt->alloc(t, size, 64, &b) == LOOM_OK, "alloc: %s", H.error);
    REQUIRE(move(t, b, 0, data, size, 1) == LOOM_OK, "write: %s", H.error);

    int fd = find_tier_fd("/proc/self/fd", dir);
    REQUIRE(fd >= 0, "no descriptor of a deleted file in %s", dir);
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int other = open(link, O_RDWR);
    REQUIRE(other >= 0, "open %s: %s", link, strerror(errno));
    size_t at = MIB + 12345; /* in chunk 1 */
    unsigned char flipped = data[at] ^ 0x10;
    REQUIRE(pwrite(other, &flipped, 1, (off_t)at) == 1, "pwrite: %s", strerror(errno));
    fdatasync(other);

    /* a read-ahead of chunk 2 serves reads from memory: the disk may change under it */
    CHECK(vt->prefetch(t, b, 2 * MIB, MIB) == LOOM_OK, "prefetch: %s", H.error);
    CHECK(move(t, b, 2 * MIB, got, 10, 0) == LOOM_OK, "read after prefetch: %s", H.error);
    unsigned char flipped2 = data[2 * MIB + 7] ^ 0x01;
    REQUIRE(pwrite(other, &flipped2, 1, 2 * MIB + 7) == 1, "pwrite: %s", strerror(errno));
    fdatasync(other);
    CHECK(move(t, b, 2 * MIB, got, MIB, 0) == LOOM_OK && !memcmp(got, data + 2 * MIB, MIB),
          "a prefetched chunk was read from the disk again: %s", H.error);

    close(other);
    char expected[64], found[64];
    snprintf(expected, sizeof expected, "expected CRC32C 0x%08x", loom_crc32c(data + MIB, MIB));
    data[at] = flipped;
    snprintf(found, sizeof found, "found 0x%08x", loom_crc32c(data + MIB, MIB));
    data[at] ^= 0x10;

    H.error[0] = 0;
    int rc = move(t, b, 0, got, size, 0);
    CHECK(rc != LOOM_OK, "a changed chunk read back without complaint");
    CHECK(has(H.error, "chunk 1 at file offset 1048576") && has(H.error, expected) &&
              has(H.error, found) && has(H.error, "the file was changed under the job") &&
              has(H.error, dir),
          "the mismatch line: '%s' (want %s, %s)", H.error, expected, found);
    /* zero copy: the disk's bytes landed in the caller's memory, and were checked there */
    CHECK(!aligned || got[at] == flipped, "an aligned read of a whole chunk was not zero copy");
    /* the other chunks still read; a partial write into the bad one is refused */
    CHECK(move(t, b, 0, got, MIB, 0) == LOOM_OK && !memcmp(got, data, MIB), "chunk 0: %s",
          H.error);
    H.error[0] = 0;
    CHECK(move(t, b, MIB + 10, data, 10, 1) != LOOM_OK && has(H.error, "chunk 1"),
          "a patch of the changed chunk: '%s'", H.error);
    /* whole new chunks heal them */
    CHECK(move(t, b, MIB, data + MIB, 2 * MIB, 1) == LOOM_OK, "rewrite: %s", H.error);
    CHECK(move(t, b, 0, got, size, 0) == LOOM_OK && !memcmp(got, data, size), "after rewrite: %s",
          H.error);
    CHECK(vt->free(t, b) == LOOM_OK, "free");
    CHECK(vt->destroy(t) == LOOM_OK, "destroy");
    free_buffer(data);
    free_buffer(got);
    rmdir(dir);
}

static void case_corrupt(const char *base)
{
    corrupt(base, 0);
    corrupt(base, 1);
}

static int case_nospace(const char *base)
{
    char *dir = make_dir(base, "nospace");
    if (!mount_fs("tmpfs", dir, 0, "size=4m"))
        return SKIP;
    loom_memtier *t = open_tier(dir);
    loom_tier_block *b = NULL;
    H.error[0] = 0;
    CHECK(vt->alloc(t, 16 * MIB, 64, &b) != LOOM_OK && !b, "16 MiB fit in a 4 MiB tmpfs");
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want,
             "memory.offload.path = '%s': no space for 16 MiB more (this rank's file holds 0 MiB "
             "already; ",
             dir);
    CHECK(has(H.error, want) && has(H.error, "MiB available on the file system); free space or "
                                             "name a larger disk"),
          "the no-space line: '%s'", H.error);
    /* what fits still works, in the space the failed one gave back */
    unsigned char data[5000], got[5000];
    fill_random(data, sizeof data);
    REQUIRE(vt->alloc(t, 3 * MIB, 64, &b) == LOOM_OK, "3 MiB in 4: %s", H.error);
    CHECK(move(t, b, 3 * MIB - 5000, data, 5000, 1) == LOOM_OK, "write: %s", H.error);
    CHECK(move(t, b, 3 * MIB - 5000, got, 5000, 0) == LOOM_OK && !memcmp(data, got, 5000),
          "read back on tmpfs: %s", H.error);
    CHECK(vt->free(t, b) == LOOM_OK && vt->destroy(t) == LOOM_OK, "free, destroy");
    unmount_fs(dir);
    return 0;
}

static int case_missing(const char *base)
{
    refuse_create("/nonexistent/loom-nvme",
                  "memory.offload.path = '/nonexistent/loom-nvme': no such directory; create it "
                  "or name another");
    char *dir = make_dir(base, "missing");
    char file[PATH_MAX + 8];
    snprintf(file, sizeof file, "%s/file", dir);
    close(open(file, O_CREAT | O_WRONLY, 0600));
    refuse_create(file, "not a directory");
    unlink(file);
    H.block_bytes = 5000;
    refuse_create(dir, "block_bytes = 5000");
    H.block_bytes = MIB;
    rmdir(dir);
    CHECK(H.mem_current == 0, "a refused create kept %lld bytes", H.mem_current);
    return 0;
}

static int case_readonly(const char *base)
{
    char *dir = make_dir(base, "readonly");
    if (!mount_fs("tmpfs", dir, MS_RDONLY, "size=1m"))
        return SKIP;
    refuse_create(dir, "read-only file system");
    unmount_fs(dir);
    return 0;
}

/* As another user, a directory only root may write. */
static int case_permission(const char *base)
{
    if (geteuid() != 0) {
        printf("skip: needs root to become another user\n");
        return SKIP;
    }
    (void)base; /* the other user must reach it: /tmp, not the build tree */
    char *dir = make_dir("/tmp", "loom-nvme-permission"); /* 0700, root's */
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) || setuid(65534))
            _exit(SKIP);
        refuse_create(dir, "permission denied");
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* Where the caller's memory cannot be registered with the ring (a locked-
 * memory limit that the bounce buffers fit and the caller's range does not),
 * zero-copy chunks move unregistered, said once, and nothing else changes.
 * As another user: root's CAP_IPC_LOCK passes any limit. */
static int case_memlock(const char *base)
{
    if (geteuid() != 0) {
        printf("skip: needs root to become another user\n");
        return SKIP;
    }
    (void)base; /* the other user must reach it: /tmp, not the build tree */
    char *dir = make_dir("/tmp", "loom-nvme-memlock");
    chmod(dir, 0777);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit lock = {1 * MIB, 1 * MIB};
        if (setrlimit(RLIMIT_MEMLOCK, &lock) || setgid(65534) || setuid(65534))
            _exit(SKIP);
        H.queue_depth = 2;
        H.block_bytes = 64 * 1024;
        H.log[0] = 0;
        H.warnings = 0;
        loom_memtier *t = open_tier(dir);
        size_t size = 4 * MIB + 100; /* whole chunks, and a short one at the end */
        unsigned char *data = buffer(size, 1), *got = buffer(size, 1);
        fill_random(data, size);
        loom_tier_block *b = NULL;
        REQUIRE(vt->alloc(t, size, 64, &b) == LOOM_OK, "alloc: %s", H.error);
        for (int pass = 0; pass < 2; pass++) {
            memset(got, 0, size);
            CHECK(move(t, b, 0, data, size, 1) == LOOM_OK, "write: %s", H.error);
            CHECK(move(t, b, 0, got, size, 0) == LOOM_OK && !memcmp(got, data, size),
                  "read back unregistered: %s", H.error);
        }
        CHECK(H.warnings == 1 && has(H.log, "cannot register the caller's memory with io_uring "
                                            "(Cannot allocate memory: raise ulimit -l); moving it "
                                            "unregistered") && has(H.log, dir),
              "want one warning: %s", H.log);
        CHECK(vt->free(t, b) == LOOM_OK && vt->destroy(t) == LOOM_OK, "free, destroy");
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static int case_ramfs(const char *base)
{
    char *dir = make_dir(base, "ramfs");
    if (!mount_fs("ramfs", dir, 0, NULL))
        return SKIP;
    H.log[0] = 0;
    H.warnings = 0;
    roundtrip(dir, 4, 64 * 1024, 0);
    CHECK(H.warnings == 1 && has(H.log, dir) && has(H.log, "O_DIRECT") &&
              has(H.log, "buffered I/O"),
          "want one warning naming %s: %s", dir, H.log);
    unmount_fs(dir);
    return 0;
}

/* Nothing is left: not after destroy (roundtrip checks that), not after a
 * kill -9 of a process that had the tier open with data in it. */
static int case_nofile(const char *base)
{
    char *dir = make_dir(base, "nofile");
    int ready[2];
    REQUIRE(pipe(ready) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        loom_memtier *t = open_tier(dir);
        loom_tier_block *b = NULL;
        static unsigned char data[2 * MIB];
        fill_random(data, sizeof data);
        if (vt->alloc(t, sizeof data, 64, &b) || move(t, b, 0, data, sizeof data, 1))
            _exit(1);
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    close(ready[1]);
    char c;
    REQUIRE(read(ready[0], &c, 1) == 1, "the child did not get its tier ready");
    char fds[64];
    snprintf(fds, sizeof fds, "/proc/%d/fd", (int)pid);
    CHECK(find_tier_fd(fds, dir) >= 0, "the child holds no deleted file in %s", dir);
    CHECK(entries(dir) == 0, "the child's file has a name in %s", dir);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK(entries(dir) == 0, "a kill -9 left a file in %s", dir);
    rmdir(dir);
    return 0;
}

/* A core older than the host's crc32c: the tier says what it needs in one
 * line instead of calling past the end of the table. */
static int case_oldhost(const char *base)
{
    loom_host old = host;
    old.version = 5;
    old.struct_size = (uint32_t)offsetof(loom_host, crc32c);
    old.crc32c = NULL;
    old.copy_crc32c = NULL;
    H.path = base;
    H.error[0] = 0;
    loom_memtier *t = NULL;
    int rc = vt->create(&old, &t);
    CHECK(rc == LOOM_ERR_NOT_SUPPORTED && !t, "create with host version 5: %d", rc);
    CHECK(has(H.error, "needs the host's crc32c (host table version 6, loom ABI 1.8), and this "
                       "loom gives version 5"), "create: '%s'", H.error);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: nvme_test CASE BASE_DIR\n");
        return 2;
    }
    const char *which = argv[1], *base = argv[2];
    mkdir(base, 0755);
    if (strcmp(which, "crc32c")) {
        void *so = dlopen(NVME_PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
        REQUIRE(so, "dlopen: %s", dlerror());
        vt = dlsym(so, "loom_memtier_plugin_v1");
        REQUIRE(vt && vt->header.kind == LOOM_PLUGIN_MEMTIER, "no memtier symbol");
    }
    int rc = 0;
    if (!strcmp(which, "crc32c"))
        case_crc32c();
    else if (!strcmp(which, "roundtrip"))
        case_roundtrip(base);
    else if (!strcmp(which, "corrupt"))
        case_corrupt(base);
    else if (!strcmp(which, "nospace"))
        rc = case_nospace(base);
    else if (!strcmp(which, "missing"))
        rc = case_missing(base);
    else if (!strcmp(which, "readonly"))
        rc = case_readonly(base);
    else if (!strcmp(which, "permission"))
        rc = case_permission(base);
    else if (!strcmp(which, "ramfs"))
        rc = case_ramfs(base);
    else if (!strcmp(which, "memlock"))
        rc = case_memlock(base);
    else if (!strcmp(which, "nofile"))
        rc = case_nofile(base);
    else if (!strcmp(which, "oldhost"))
        rc = case_oldhost(base);
    else {
        fprintf(stderr, "nvme_test: unknown case '%s'\n", which);
        return 2;
    }
    if (rc == SKIP)
        return SKIP;
    if (failures || rc) {
        fprintf(stderr, "%d check%s failed\n", failures, failures == 1 ? "" : "s");
        return 1;
    }
    printf("ok\n");
    return 0;
}
