/* loom bench, memory tiers (bench.tiers): write and read bandwidth of each
 * tier through the memtier ABI, per block size and queue depth, beside the
 * limit measured the same way — plain memcpy for host memory, and for the
 * nvme tier plain O_DIRECT pwrite/pread of the same blocks by as many
 * threads as the queue is deep, on a file in the same directory. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/memtier.h"
#include "loom/status.h"
#include "cli/bench_tiers.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"

typedef struct tier_point {
    double write_gbs, read_gbs;         /* through the tier */
    double raw_write_gbs, raw_read_gbs; /* the limit */
} tier_point;

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double gbs(size_t bytes, uint64_t t0, uint64_t t1)
{
    return t1 > t0 ? (double)bytes / (double)(t1 - t0) : 0.0; /* bytes per ns = GB/s */
}

/* ---------------------------------------------------------- host */

static void bench_host(size_t bytes, int repeats, tier_point *out)
{
    char *a = NULL, *b = NULL;
    if (loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, bytes, (void **)&a) != LOOM_OK ||
        loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, bytes, (void **)&b) != LOOM_OK) {
        loom_mem_free(a);
        *out = (tier_point){0};
        return;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double w[64], r[64];
    for (int i = 0; i < repeats; i++) {
        uint64_t t0 = loom_now_ns();
        memcpy(b, a, bytes);
        uint64_t t1 = loom_now_ns();
        memcpy(a, b, bytes);
        uint64_t t2 = loom_now_ns();
        w[i] = gbs(bytes, t0, t1);
        r[i] = gbs(bytes, t1, t2);
    }
    /* host memory is its own limit: the tier is a memcpy */
    out->write_gbs = out->raw_write_gbs = median(w, repeats);
    out->read_gbs = out->raw_read_gbs = median(r, repeats);
    loom_mem_free(a);
    loom_mem_free(b);
}

/* ---------------------------------------------------------- nvme */

/* The plain O_DIRECT limit: depth threads, each moving every depth-th block
 * between the file and the same place in one buffer of all the bytes, laid
 * out as the tier's callers' memory is (loom_mem_alloc: huge pages). */
typedef struct raw_job {
    int fd, writing, stride, first;
    char *buf;
    size_t block, bytes;
    int failed;
} raw_job;

static void *raw_worker(void *arg)
{
    raw_job *j = arg;
    for (size_t off = (size_t)j->first * j->block; off < j->bytes; off += (size_t)j->stride * j->block) {
        ssize_t n = j->writing ? pwrite(j->fd, j->buf + off, j->block, (off_t)off)
                               : pread(j->fd, j->buf + off, j->block, (off_t)off);
        if (n != (ssize_t)j->block) {
            j->failed = 1;
            break;
        }
    }
    return NULL;
}

static int raw_pass(int fd, int writing, size_t block, int depth, size_t bytes, char *buf,
                    double *out)
{
    raw_job jobs[256];
    pthread_t th[256];
    uint64_t t0 = loom_now_ns();
    for (int k = 0; k < depth; k++) {
        jobs[k] = (raw_job){fd, writing, depth, k, buf, block, bytes, 0};
        pthread_create(&th[k], NULL, raw_worker, &jobs[k]);
    }
    int failed = 0;
    for (int k = 0; k < depth; k++) {
        pthread_join(th[k], NULL);
        failed |= jobs[k].failed;
    }
    /* no fdatasync: the tier never syncs either (its file is scratch) */
    *out = gbs(bytes, t0, loom_now_ns());
    return failed ? loom_fail(LOOM_ERR_INTERNAL, "bench: plain O_DIRECT %s failed: %s",
                              writing ? "pwrite" : "pread", strerror(errno))
                  : LOOM_OK;
}

static int bench_raw(const char *dir, size_t block, int depth, size_t bytes, int repeats,
                     tier_point *out)
{
    if (depth > 256)
        depth = 256;
    int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT, 0600);
    if (fd < 0)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "bench: plain O_DIRECT in '%s': %s (the limit needs a file system "
                         "that takes O_DIRECT and unnamed files)", dir, strerror(errno));
    bytes = bytes / block * block; /* whole blocks only */
    char *buf = NULL;
    if (loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, bytes, (void **)&buf) != LOOM_OK) {
        close(fd);
        return LOOM_ERR_NO_MEMORY;
    }
    memset(buf, 3, bytes);
    double w[64], r[64];
    int rc = LOOM_OK;
    for (int i = 0; i < repeats && rc == LOOM_OK; i++) {
        rc = raw_pass(fd, 1, block, depth, bytes, buf, &w[i]);
        if (rc == LOOM_OK)
            rc = raw_pass(fd, 0, block, depth, bytes, buf, &r[i]);
    }
    if (rc == LOOM_OK) {
        out->raw_write_gbs = median(w, repeats);
        out->raw_read_gbs = median(r, repeats);
    }
    loom_mem_free(buf);
    close(fd);
    return rc;
}

/* Write (or read) the whole block and wait for it. */
static int move_all(const loom_memtier_ops *ops, loom_memtier *tier, loom_tier_block *blk,
                    char *buf, size_t bytes, int writing)
{
    loom_tier_request *req = NULL;
    int rc = writing ? ops->write(tier, blk, 0, buf, bytes, &req)
                     : ops->read(tier, blk, 0, buf, bytes, &req);
    return rc == LOOM_OK && req ? ops->wait(req) : rc;
}

/* One (block size, queue depth) point through the nvme tier: a config of
 * its own, so the tier is created with those settings. */
static int bench_nvme(const loom_cli_config_args *args, size_t block, int depth, size_t bytes,
                      int repeats, tier_point *out)
{
    const char *sets[LOOM_CLI_MAX_SETS + 2];
    char block_set[64], depth_set[64];
    int n = 0;
    for (int i = 0; i < args->noverrides; i++)
        sets[n++] = args->overrides[i];
    snprintf(block_set, sizeof block_set, "memory.offload.block_bytes=%zu", block);
    snprintf(depth_set, sizeof depth_set, "memory.offload.queue_depth=%d", depth);
    sets[n++] = block_set;
    sets[n++] = depth_set;
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    const loom_plugin *plugin = NULL;
    const loom_host *host = NULL;
    loom_memtier *tier = NULL;
    loom_tier_block *blk = NULL;
    char *buf = NULL;
    const char *dir = NULL;
    int rc = loom_config_load(args->config, sets, n, &cfg);
    if (rc == LOOM_OK)
        rc = loom_runtime_create(cfg, &rt);
    if (rc == LOOM_OK)
        rc = loom_runtime_plugin(rt, LOOM_PLUGIN_MEMTIER, "nvme", &plugin);
    if (rc == LOOM_OK)
        rc = loom_runtime_host(rt, plugin, "memory.offload", &host);
    const loom_memtier_ops *ops = plugin ? &plugin->ops.memtier : NULL;
    if (rc == LOOM_OK)
        rc = ops->create(host, &tier);
    if (rc == LOOM_OK)
        rc = ops->alloc(tier, bytes, 4096, &blk);
    if (rc == LOOM_OK)
        rc = loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, bytes, (void **)&buf);
    if (rc == LOOM_OK) {
        for (size_t i = 0; i < bytes; i++)
            buf[i] = (char)(i * 7u);
    }
    double w[64], r[64];
    for (int i = 0; i < repeats && rc == LOOM_OK; i++) {
        uint64_t t0 = loom_now_ns();
        rc = move_all(ops, tier, blk, buf, bytes, 1);
        uint64_t t1 = loom_now_ns();
        w[i] = gbs(bytes, t0, t1);
        memset(buf, 0, bytes);
        t1 = loom_now_ns();
        if (rc == LOOM_OK)
            rc = move_all(ops, tier, blk, buf, bytes, 0);
        r[i] = gbs(bytes, t1, loom_now_ns());
        for (size_t k = 0; rc == LOOM_OK && k < bytes; k++)
            if (buf[k] != (char)(k * 7u))
                rc = loom_fail(LOOM_ERR_INTERNAL, "bench: the nvme tier read back byte %zu "
                               "wrong", k);
    }
    if (rc == LOOM_OK) {
        out->write_gbs = median(w, repeats);
        out->read_gbs = median(r, repeats);
        loom_config_string(cfg, "memory.offload.path", &dir);
        rc = bench_raw(dir, block, depth, bytes, repeats, out);
    }
    char why[768] = "";
    if (rc != LOOM_OK)
        snprintf(why, sizeof why, "%s", loom_last_error());
    loom_mem_free(buf);
    if (blk)
        ops->free(tier, blk);
    if (tier)
        ops->destroy(tier);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return rc == LOOM_OK ? rc : loom_fail(rc, "%s", why);
}

/* ---------------------------------------------------------- driver */

static void print_point(const char *tier, size_t block, int depth, size_t bytes,
                        const tier_point *p)
{
    char blk[32] = "-", qd[16] = "-";
    if (strcmp(tier, "host") != 0) {
        snprintf(blk, sizeof blk, "%zu", block);
        snprintf(qd, sizeof qd, "%d", depth);
    }
    printf("  %-5s %10s %5s %12zu %9.2f %9.2f %9.2f %9.2f %6.0f%% %6.0f%%\n", tier, blk, qd, bytes,
           p->write_gbs, p->raw_write_gbs, p->read_gbs, p->raw_read_gbs,
           p->raw_write_gbs > 0 ? 100 * p->write_gbs / p->raw_write_gbs : 0,
           p->raw_read_gbs > 0 ? 100 * p->read_gbs / p->raw_read_gbs : 0);
    fflush(stdout);
}

static void json_point(FILE *f, const char *tier, size_t block, int depth, size_t bytes,
                       const tier_point *p, int *first)
{
    if (!f)
        return;
    fprintf(f,
            "%s  {\"tier\": \"%s\", \"block_bytes\": %zu, \"queue_depth\": %d, \"bytes\": %zu, "
            "\"write_gbs\": %.4f, \"raw_write_gbs\": %.4f, \"read_gbs\": %.4f, "
            "\"raw_read_gbs\": %.4f}",
            *first ? "" : ",\n", tier, block, depth, bytes, p->write_gbs, p->raw_write_gbs,
            p->read_gbs, p->raw_read_gbs);
    *first = 0;
}

static int int_list(const loom_config *cfg, const char *path, int64_t *out, int cap)
{
    int n = loom_config_list_len(cfg, path);
    for (int i = 0; i < n && i < cap; i++) {
        char item[96];
        snprintf(item, sizeof item, "%s[%d]", path, i);
        loom_config_int(cfg, item, &out[i]);
    }
    return n < cap ? n : cap;
}

int loom_bench_tiers(const loom_cli_config_args *args, const loom_config *cfg, FILE *json,
                     int *json_first)
{
    int64_t blocks[16], depths[16], bytes = 0, repeats = 3;
    int nblocks = int_list(cfg, "bench.tier_block_bytes", blocks, 16);
    int ndepths = int_list(cfg, "bench.tier_queue_depths", depths, 16);
    loom_config_int(cfg, "bench.tier_bytes", &bytes);
    loom_config_int(cfg, "bench.tier_repeats", &repeats);
    if (repeats > 64)
        repeats = 64;
    printf("#\n# loom bench: memory tiers, %lld bytes written then read back, median of %lld; "
           "the limit: memcpy (host), plain O_DIRECT pwrite/pread of the same memory by "
           "queue-depth threads "
           "(nvme)\n", (long long)bytes, (long long)repeats);
    printf("# %-5s %10s %5s %12s %9s %9s %9s %9s %7s %7s\n", "tier", "block", "depth", "bytes",
           "write", "limit", "read", "limit", "write", "read");
    printf("# %-5s %10s %5s %12s %9s %9s %9s %9s %7s %7s\n", "", "(B)", "", "(B)", "(GB/s)",
           "(GB/s)", "(GB/s)", "(GB/s)", "of lim", "of lim");
    int rc = LOOM_OK;
    int ntiers = loom_config_list_len(cfg, "bench.tiers");
    for (int t = 0; t < ntiers && rc == LOOM_OK; t++) {
        const char *tier = loom_config_list_string(cfg, "bench.tiers", t);
        if (!strcmp(tier, "host")) {
            tier_point p;
            bench_host((size_t)bytes, (int)repeats, &p);
            print_point(tier, 0, 0, (size_t)bytes, &p);
            json_point(json, tier, 0, 0, (size_t)bytes, &p, json_first);
            continue;
        }
        for (int b = 0; b < nblocks && rc == LOOM_OK; b++)
            for (int d = 0; d < ndepths && rc == LOOM_OK; d++) {
                tier_point p = {0};
                rc = bench_nvme(args, (size_t)blocks[b], (int)depths[d], (size_t)bytes,
                                (int)repeats, &p);
                if (rc == LOOM_OK) {
                    print_point(tier, (size_t)blocks[b], (int)depths[d], (size_t)bytes, &p);
                    json_point(json, tier, (size_t)blocks[b], (int)depths[d], (size_t)bytes, &p,
                               json_first);
                }
            }
    }
    return rc;
}
