/* loom plan's cluster files and time model: units read exactly, the
 * shipped clusters against their public specifications, a write/read
 * round trip, every refusal with its one-line message, and the alpha-beta
 * and roofline times against figures worked out by hand.
 *
 *   plan_cluster_test CASE [CLUSTERS_DIR]    one case ("all" runs every case) */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "plan/plan.h"
#include "check.h"

static char tmpdir[64];
static const char *clusters_dir;
/* relative: the same sum done in another order */
static const double same_sum = 1e-12;

static const char *write_file(const char *name, const char *text)
{
    static char paths[8][128];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 128, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

/* A valid host cluster; `extra` lands inside the group, before its end. */
static const char base_head[] = "cluster = {\n"                                   /* 1 */
                                 "  name = \"test\";\n"                            /* 2 */
                                 "  nodes = 1;\n"                                  /* 3 */
                                 "  ranks_per_node = 4;\n"                         /* 4 */
                                 "  device = false;\n"                             /* 5 */
                                 "  host_memory = \"16 GiB\";\n"                   /* 6 */
                                 "  peak = { fp32 = \"100 GFLOP/s\"; };\n"         /* 7 */
                                 "  memory_bandwidth = \"20 GB/s\";\n"             /* 8 */
                                 "  intra = { latency = \"3 us\"; bandwidth = \"5 GB/s\"; };\n" /* 9 */
                                 "  inter = { latency = \"3 us\"; bandwidth = \"5 GB/s\"; };\n"; /* 10 */

static const char *with(const char *extra)
{
    static char text[4096];
    snprintf(text, sizeof text, "%s%s};\n", base_head, extra);
    return text;
}

/* The base with the line starting with `prefix` (after its indent) replaced
 * by `line` ("" drops it). */
static const char *replaced(const char *prefix, const char *line)
{
    static char text[4096];
    char copy[4096];
    snprintf(copy, sizeof copy, "%s};\n", base_head);
    text[0] = '\0';
    for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        const char *body = l + strspn(l, " ");
        const char *keep = strncmp(body, prefix, strlen(prefix)) ? l : line;
        if (*keep) {
            strcat(text, keep);
            strcat(text, "\n");
        }
    }
    return text;
}

static void expect_error(const char *text, int line, const char *rest)
{
    const char *path = write_file("bad.cfg", text);
    loom_plan_cluster c;
    loom_clear_error();
    int rc = loom_plan_cluster_read(path, &c);
    CHECK(rc == LOOM_ERR_INVALID);
    CHECK(c.ranks_per_node == 0 && c.path[0] == '\0'); /* nothing half-read */
    char want[1024];
    snprintf(want, sizeof want, "%s:%d: %s", path, line, rest);
    CHECK_STR(loom_last_error(), want);
}

static int read_ok(const char *text, loom_plan_cluster *c)
{
    const char *path = write_file("ok.cfg", text);
    int rc = loom_plan_cluster_read(path, c);
    if (rc != LOOM_OK)
        fprintf(stderr, "unexpected refusal: %s\n", loom_last_error());
    CHECK(rc == LOOM_OK);
    return rc;
}

/* ---- cases ---- */

/* Each unit by its definition: powers of 2 for KiB..TiB, of 10 for
 * kB..TB, 8 bits a byte. */
static void case_units(void)
{
    static const struct {
        const char *text;
        double bytes;
    } sizes[] = {
        {"80 GiB", 80.0 * 1073741824.0},  {"80 GB", 80e9},  {"2 TiB", 2.0 * 1099511627776.0},
        {"2TB", 2e12},                    {"512 MiB", 512.0 * 1048576.0}, {"1.5 KiB", 1536},
        {"  7 kB  ", 7000},               {"3 B", 3},     {"1.5e3 GB", 1.5e12},
        {"2.5E-3 TB", 2.5e9},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(sizes); i++) {
        char line[128];
        snprintf(line, sizeof line, "  host_memory = \"%s\";", sizes[i].text);
        loom_plan_cluster c;
        if (read_ok(replaced("host_memory", line), &c) == LOOM_OK)
            CHECK(c.host_bytes == sizes[i].bytes);
    }
    static const struct {
        const char *text;
        double bytes_per_s;
    } rates[] = {
        {"400 Gb/s", 50e9},     {"450 GB/s", 450e9},  {"3.35 TB/s", 3.35e12},
        {"25 Gb/s", 3.125e9},   {"100 Mb/s", 12.5e6}, {"2 GiB/s", 2.0 * 1073741824.0},
        {"800 MB/s", 800e6},    {"1 b/s", 0.125},     {"8.424 GB/s", 8.424e9},
        {"0.3 Gb/s", 0.3e9 / 8},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(rates); i++) {
        char line[256];
        snprintf(line, sizeof line, "  inter = { latency = \"3 us\"; bandwidth = \"%s\"; };",
                 rates[i].text);
        loom_plan_cluster c;
        if (read_ok(replaced("inter", line), &c) == LOOM_OK)
            CHECK(c.inter.bytes_per_s == rates[i].bytes_per_s);
    }
    static const struct {
        const char *text;
        double seconds;
    } times[] = {{"2.5 us", 2.5e-6}, {"2.5 µs", 2.5e-6}, {"800 ns", 800e-9}, {"1.5 ms", 1.5e-3},
                 {"0.25 s", 0.25},   {"0 us", 0},        {"9.162 us", 9.162e-6},
                 {"15.55 us", 15.55e-6}, {"1e3 ns", 1e-6}};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(times); i++) {
        char line[256];
        snprintf(line, sizeof line, "  intra = { latency = \"%s\"; bandwidth = \"5 GB/s\"; };",
                 times[i].text);
        loom_plan_cluster c;
        if (read_ok(replaced("intra", line), &c) == LOOM_OK)
            CHECK(c.intra.latency_s == times[i].seconds);
    }
    loom_plan_cluster c;
    if (read_ok(replaced("peak", "  peak = { fp32 = \"67 TFLOP/s\"; bf16 = \"989 TFLOP/s\"; "
                                 "fp16 = \"1.5 PFLOP/s\"; };"),
                &c) == LOOM_OK) {
        CHECK(c.flops[LOOM_F32] == 67e12);
        CHECK(c.flops[LOOM_BF16] == 989e12);
        CHECK(c.flops[LOOM_F16] == 1.5e15);
    }
    /* a memory size may be a bare number of bytes, 64-bit with L */
    if (read_ok(replaced("host_memory", "  host_memory = 85899345920L;"), &c) == LOOM_OK)
        CHECK(c.host_bytes == 85899345920.0);
    if (read_ok(replaced("host_memory", "  host_memory = 1048576;"), &c) == LOOM_OK)
        CHECK(c.host_bytes == 1048576.0);
    if (read_ok(replaced("host_memory", "  host_memory = 1.5e9;"), &c) == LOOM_OK)
        CHECK(c.host_bytes == 1.5e9);
}

/* The base file as read, and the optional parts. */
static void case_read(void)
{
    loom_plan_cluster c;
    const char *path = write_file("base.cfg", with(""));
    CHECK(loom_plan_cluster_read(path, &c) == LOOM_OK);
    CHECK_STR(c.name, "test");
    CHECK_STR(c.path, path);
    CHECK(c.nodes == 1 && c.ranks_per_node == 4 && c.device == 0);
    CHECK(c.device_bytes == 0);
    CHECK(c.host_bytes == 16.0 * 1073741824.0);
    CHECK(c.flops[LOOM_F32] == 100e9 && c.flops[LOOM_BF16] == 0 && c.flops[LOOM_F16] == 0);
    CHECK(c.memory_bytes_per_s == 20e9);
    CHECK(c.intra.latency_s == 3e-6 && c.intra.bytes_per_s == 5e9);
    CHECK(c.nvme_bytes_per_s == 0);
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        CHECK(c.nmeasured[op] == 0);

    if (read_ok(with("  nvme_bandwidth = \"6.5 GB/s\";\n"
                     "  measured = {\n"
                     "    allreduce = ( { ranks = 2; latency = \"12 us\"; bandwidth = \"3 GB/s\"; },\n"
                     "                  { ranks = 4; latency = \"30 us\"; bandwidth = \"2 GB/s\"; } );\n"
                     "    send = ( { ranks = 8; latency = \"4 us\"; bandwidth = \"20 GB/s\"; } );\n"
                     "  };\n"),
                &c) == LOOM_OK) {
        CHECK(c.nvme_bytes_per_s == 6.5e9);
        CHECK(c.nmeasured[LOOM_OP_ALLREDUCE] == 2 && c.nmeasured[LOOM_OP_SEND] == 1);
        CHECK(c.nmeasured[LOOM_OP_RECV] == 0);
        CHECK(c.measured[LOOM_OP_ALLREDUCE][1].ranks == 4);
        CHECK(c.measured[LOOM_OP_ALLREDUCE][1].latency_s == 30e-6);
        CHECK(c.measured[LOOM_OP_ALLREDUCE][1].bytes_per_s == 2e9);
        CHECK(c.measured[LOOM_OP_SEND][0].bytes_per_s == 20e9);
        CHECK(c.measured[LOOM_OP_SEND][0].ranks == 8); /* more than ranks_per_node: oversubscribed */
    }
    /* a device cluster names its memory per device */
    if (read_ok(replaced("device", "  device = true; device_memory = \"80 GiB\";"), &c) ==
        LOOM_OK)
        CHECK(c.device == 1 && c.device_bytes == 80.0 * 1073741824.0);
}

/* Every field, odd values included, written and read back bit for bit; a
 * second write is the same text. */
static void case_round_trip(void)
{
    loom_plan_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "odd \"quoted\" \\ name");
    c.nodes = 37;
    c.ranks_per_node = 6;
    c.device = 1;
    c.device_bytes = 81559.0 * 1048576.0;
    c.host_bytes = 25159041024.0; /* 23.43... GiB: exactly 24569376 KiB */
    c.flops[LOOM_F32] = 104.83e9;
    c.flops[LOOM_BF16] = 1.0 / 3.0 * 1e15;
    c.memory_bytes_per_s = 19.87654321e9;
    c.intra = (loom_plan_link){1.0 / 3.0 * 1e-6, 2.0 / 3.0 * 1e11};
    c.inter = (loom_plan_link){0, 12.5e9};
    c.nvme_bytes_per_s = 7.1e9;
    c.nmeasured[LOOM_OP_ALLREDUCE] = 2;
    c.measured[LOOM_OP_ALLREDUCE][0] = (loom_plan_measured){2, 12.34e-6, 3.109e9};
    c.measured[LOOM_OP_ALLREDUCE][1] = (loom_plan_measured){4, 0.1e-3, 0.1 * 1e9 / 7.0};
    c.nmeasured[LOOM_OP_RECV] = 1;
    c.measured[LOOM_OP_RECV][0] = (loom_plan_measured){6, 0, 21.6e9};

    char first[128], second[128];
    snprintf(first, sizeof first, "%s/first.cfg", tmpdir);
    snprintf(second, sizeof second, "%s/second.cfg", tmpdir);
    loom_plan_cluster_note notes[] = {{"cluster", "head line one\nhead line two"},
                                      {"peak", "measured somehow"},
                                      {"measured.allreduce", "fit of 11 sizes"}};
    CHECK(loom_plan_cluster_write_notes(&c, first, notes, 3) == LOOM_OK);
    loom_plan_cluster back;
    if (loom_plan_cluster_read(first, &back) != LOOM_OK) {
        fprintf(stderr, "round trip: %s\n", loom_last_error());
        failures++;
        return;
    }
    CHECK_STR(back.name, c.name);
    CHECK_STR(back.path, first);
    CHECK(back.nodes == c.nodes && back.ranks_per_node == c.ranks_per_node);
    CHECK(back.device == c.device && back.device_bytes == c.device_bytes);
    CHECK(back.host_bytes == c.host_bytes);
    for (int t = 0; t < LOOM_DTYPE_COUNT; t++)
        CHECK(back.flops[t] == c.flops[t]);
    CHECK(back.memory_bytes_per_s == c.memory_bytes_per_s);
    CHECK(back.intra.latency_s == c.intra.latency_s);
    CHECK(back.intra.bytes_per_s == c.intra.bytes_per_s);
    CHECK(back.inter.latency_s == c.inter.latency_s);
    CHECK(back.inter.bytes_per_s == c.inter.bytes_per_s);
    CHECK(back.nvme_bytes_per_s == c.nvme_bytes_per_s);
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        CHECK(back.nmeasured[op] == c.nmeasured[op]);
        for (int i = 0; i < c.nmeasured[op]; i++) {
            CHECK(back.measured[op][i].ranks == c.measured[op][i].ranks);
            CHECK(back.measured[op][i].latency_s == c.measured[op][i].latency_s);
            CHECK(back.measured[op][i].bytes_per_s == c.measured[op][i].bytes_per_s);
        }
    }
    CHECK(loom_plan_cluster_write_notes(&back, second, notes, 3) == LOOM_OK);
    char a[8192] = "", b[8192] = "";
    FILE *fa = fopen(first, "r"), *fb = fopen(second, "r");
    if (fa && fb) {
        a[fread(a, 1, sizeof a - 1, fa)] = '\0';
        b[fread(b, 1, sizeof b - 1, fb)] = '\0';
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    CHECK_STR(b, a);
    /* what a reader sees: the units chosen, the notes as comments */
    CHECK(strstr(a, "# head line two\ncluster = {\n") != NULL);
    CHECK(strstr(a, "  # measured somehow\n  peak = { fp32 = \"104.83 GFLOP/s\"; ") != NULL);
    CHECK(strstr(a, "  name = \"odd \\\"quoted\\\" \\\\ name\";\n") != NULL);
    CHECK(strstr(a, "device_memory = \"81559 MiB\";") != NULL);
    CHECK(strstr(a, "host_memory = \"24569376 KiB\";") != NULL);
    CHECK(strstr(a, "inter = { latency = \"0 us\"; bandwidth = \"12.5 GB/s\"; };") != NULL);
    CHECK(strstr(a, "{ ranks = 2; latency = \"12.34 us\"; bandwidth = \"3.109 GB/s\"; }") != NULL);
    CHECK(strstr(a, "    # fit of 11 sizes\n    allreduce = (") != NULL);
    CHECK(strstr(a, "{ ranks = 4; latency = \"100 us\"; ") != NULL);

    /* the plain writer: no notes, and no bf16 line when there is no bf16 */
    c.flops[LOOM_BF16] = 0;
    c.device = 0;
    c.nvme_bytes_per_s = 0;
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        c.nmeasured[op] = 0;
    CHECK(loom_plan_cluster_write(&c, second) == LOOM_OK);
    CHECK(loom_plan_cluster_read(second, &back) == LOOM_OK);
    CHECK(back.flops[LOOM_BF16] == 0 && back.device == 0 && back.device_bytes == 0);
    CHECK(back.nvme_bytes_per_s == 0 && back.nmeasured[LOOM_OP_ALLREDUCE] == 0);
}

/* Each refusal, its line and its words. */
static void case_refusals(void)
{
    expect_error("cluster = { name = \"x\"\n", 2, "syntax error (libconfig: syntax error)");
    expect_error("name = \"x\";\n", 1,
                 "(top level).name: unknown setting; (top level) takes cluster");
    expect_error("# nothing\n", 1, "cluster: missing; a cluster file is one group, cluster = { "
                                   "name = \"...\"; ... }; (see docs/plan.md)");
    expect_error("cluster = 3;\n", 1, "cluster: is not a group; a cluster file is one group, "
                                      "cluster = { name = \"...\"; ... }; (see docs/plan.md)");
    /* unknown settings, near and far */
    expect_error(with("  ranks_per_nod = 4;\n"), 11,
                 "cluster.ranks_per_nod: unknown setting (did you mean cluster.ranks_per_node?); "
                 "a setting loom does not read would change nothing, so remove or rename it");
    expect_error(with("  gpus = 8;\n"), 11,
                 "cluster.gpus: unknown setting; cluster takes name, nodes, ranks_per_node, "
                 "device, device_memory, host_memory, peak, memory_bandwidth, intra, inter, "
                 "nvme_bandwidth, measured");
    expect_error(replaced("peak", "  peak = { fp32 = \"1 TFLOP/s\"; fp64 = \"1 TFLOP/s\"; };"), 7,
                 "cluster.peak.fp64: unknown setting (did you mean cluster.peak.fp32?); a setting "
                 "loom does not read would change nothing, so remove or rename it");
    expect_error(replaced("intra", "  intra = { latency = \"3 us\"; bandwidth = \"5 GB/s\"; "
                                   "hops = 2; };"),
                 9, "cluster.intra.hops: unknown setting; cluster.intra takes latency, bandwidth");
    /* each required field missing: the line is the group's */
    static const struct {
        const char *prefix, *rest;
    } missing[] = {
        {"name", "cluster.name: missing; add name = \"what the cluster is\";"},
        {"nodes", "cluster.nodes: missing; add nodes = 1; (0: as many as the mesh needs)"},
        {"ranks_per_node",
         "cluster.ranks_per_node: missing; add ranks_per_node = 8; (GPUs per node, or CPU ranks)"},
        {"device", "cluster.device: missing; add device = true; (ranks compute on GPUs) or "
                   "device = false; (on host cores)"},
        {"host_memory", "cluster.host_memory: missing; add host_memory = \"2 TiB\"; (memory per "
                        "node)"},
        {"peak", "cluster.peak: missing; add each rank's dense peak by precision, e.g. peak = { "
                 "fp32 = \"67 TFLOP/s\"; bf16 = \"989 TFLOP/s\"; };"},
        {"memory_bandwidth", "cluster.memory_bandwidth: missing; add memory_bandwidth = "
                             "\"3.35 TB/s\"; (per rank, reads + writes)"},
        {"intra", "cluster.intra: missing; add intra = { latency = \"2 us\"; bandwidth = "
                  "\"450 GB/s\"; }; (inside a node)"},
        {"inter", "cluster.inter: missing; add inter = { latency = \"5 us\"; bandwidth = "
                  "\"50 GB/s\"; }; (across nodes, per rank; on one node, the same as intra)"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(missing); i++)
        expect_error(replaced(missing[i].prefix, ""), 1, missing[i].rest);
    expect_error(replaced("peak", "  peak = { bf16 = \"1 TFLOP/s\"; };"), 7,
                 "cluster.peak.fp32: missing; add fp32 = \"67 TFLOP/s\"; (every precision left "
                 "out runs at fp32's rate)");
    expect_error(replaced("intra", "  intra = { bandwidth = \"5 GB/s\"; };"), 9,
                 "cluster.intra.latency: missing; add latency = \"2 us\"; (per message)");
    expect_error(replaced("inter", "  inter = { latency = \"3 us\"; };"), 10,
                 "cluster.inter.bandwidth: missing; add bandwidth = \"450 GB/s\"; (per rank, each "
                 "direction)");
    /* device memory: needed with devices, refused without */
    expect_error(replaced("device", "  device = true;"), 1,
                 "cluster.device_memory: missing; add device_memory = \"80 GiB\"; (memory per GPU)");
    expect_error(with("  device_memory = \"80 GiB\";\n"), 11,
                 "cluster.device_memory: does nothing when cluster.device = false (ranks on host "
                 "cores keep everything in host_memory); remove it, or set device = true");
    /* types and ranges */
    expect_error(replaced("name", "  name = \"\";"), 2,
                 "cluster.name: expected a string of 1 to 127 characters; found an empty or "
                 "longer one");
    expect_error(replaced("name", "  name = 5;"), 2,
                 "cluster.name: expected a string of 1 to 127 characters; found an integer");
    expect_error(replaced("nodes", "  nodes = \"2\";"), 3,
                 "cluster.nodes: expected an integer; found a string");
    expect_error(replaced("nodes", "  nodes = -1;"), 3,
                 "cluster.nodes: -1 is out of range; it must be 0 or more (up to 10^9)");
    expect_error(replaced("nodes", "  nodes = 4294967297;"), 3,
                 "cluster.nodes: 4294967297 does not fit a 32-bit integer, and libconfig read "
                 "it as 1; write a number below 2^31");
    expect_error(replaced("ranks_per_node", "  ranks_per_node = 0;"), 4,
                 "cluster.ranks_per_node: 0 is out of range; it must be 1 or more (up to 10^9)");
    expect_error(replaced("device", "  device = 1;"), 5,
                 "cluster.device: expected true or false; found an integer");
    /* quantities: units, kinds, bare numbers, signs */
    expect_error(replaced("host_memory", "  host_memory = \"16 GiB/s\";"), 6,
                 "cluster.host_memory: cannot read \"16 GiB/s\"; write a number and its unit, "
                 "e.g. \"80 GiB\" (KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10)");
    expect_error(replaced("host_memory", "  host_memory = \"16 gib\";"), 6,
                 "cluster.host_memory: cannot read \"16 gib\"; write a number and its unit, "
                 "e.g. \"80 GiB\" (KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10)");
    expect_error(replaced("host_memory", "  host_memory = \"0x10 GB\";"), 6,
                 "cluster.host_memory: cannot read \"0x10 GB\"; write a number and its unit, "
                 "e.g. \"80 GiB\" (KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10)");
    expect_error(replaced("host_memory", "  host_memory = 17179869184;"), 6,
                 "cluster.host_memory: 17179869184 does not fit a 32-bit integer, and libconfig "
                 "read it as 0; write 17179869184L, or the size with its unit (\"80 GiB\" "
                 "(KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10))");
    expect_error(replaced("host_memory", "  host_memory = 0;"), 6,
                 "cluster.host_memory: must be more than 0; write e.g. \"80 GiB\" "
                 "(KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10)");
    expect_error(replaced("host_memory", "  host_memory = true;"), 6,
                 "cluster.host_memory: expected a string with a unit, e.g. \"80 GiB\" "
                 "(KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10); found a boolean");
    expect_error(replaced("memory_bandwidth", "  memory_bandwidth = 20.0;"), 8,
                 "cluster.memory_bandwidth: a bare number has no unit; write it as a string with "
                 "its unit, e.g. \"450 GB/s\" (bytes), \"400 Gb/s\" (bits) or \"3.5 GiB/s\"");
    expect_error(replaced("memory_bandwidth", "  memory_bandwidth = \"20 GB\";"), 8,
                 "cluster.memory_bandwidth: cannot read \"20 GB\"; write a number and its unit, "
                 "e.g. \"450 GB/s\" (bytes), \"400 Gb/s\" (bits) or \"3.5 GiB/s\"");
    expect_error(replaced("memory_bandwidth", "  memory_bandwidth = \"-20 GB/s\";"), 8,
                 "cluster.memory_bandwidth: cannot read \"-20 GB/s\"; write a number and its "
                 "unit, e.g. \"450 GB/s\" (bytes), \"400 Gb/s\" (bits) or \"3.5 GiB/s\"");
    expect_error(replaced("memory_bandwidth", "  memory_bandwidth = \"0 GB/s\";"), 8,
                 "cluster.memory_bandwidth: must be more than 0; write e.g. \"450 GB/s\" "
                 "(bytes), \"400 Gb/s\" (bits) or \"3.5 GiB/s\"");
    expect_error(replaced("peak", "  peak = { fp32 = \"100 GFLOPS\"; };"), 7,
                 "cluster.peak.fp32: cannot read \"100 GFLOPS\"; write a number and its unit, "
                 "e.g. \"989 TFLOP/s\" (or GFLOP/s, PFLOP/s)");
    expect_error(replaced("peak", "  peak = \"100 GFLOP/s\";"), 7,
                 "cluster.peak: expected a group, found a string; write each rank's dense peak by "
                 "precision, e.g. peak = { fp32 = \"67 TFLOP/s\"; bf16 = \"989 TFLOP/s\"; };");
    expect_error(replaced("intra", "  intra = { latency = 3.0; bandwidth = \"5 GB/s\"; };"), 9,
                 "cluster.intra.latency: a bare number has no unit; write it as a string with "
                 "its unit, e.g. \"2.5 us\" (or ns, ms, s)");
    expect_error(replaced("intra", "  intra = { latency = \"3 sec\"; bandwidth = \"5 GB/s\"; };"),
                 9, "cluster.intra.latency: cannot read \"3 sec\"; write a number and its unit, "
                    "e.g. \"2.5 us\" (or ns, ms, s)");
    expect_error(replaced("inter", "  inter = \"5 GB/s\";"), 10,
                 "cluster.inter: expected a group, found a string; write inter = { latency = "
                 "\"5 us\"; bandwidth = \"50 GB/s\"; }; (across nodes, per rank; on one node, "
                 "the same as intra)");
    expect_error(with("  nvme_bandwidth = \"0 GB/s\";\n"), 11,
                 "cluster.nvme_bandwidth: must be more than 0; write e.g. \"450 GB/s\" (bytes), "
                 "\"400 Gb/s\" (bits) or \"3.5 GiB/s\"");
    /* the measured table */
    expect_error(with("  measured = 1;\n"), 11,
                 "cluster.measured: expected a group of ops, measured = { allreduce = ( { ranks "
                 "= 2; latency = \"12 us\"; bandwidth = \"3 GB/s\"; } ); }; found an integer");
    expect_error(with("  measured = { allreduse = ( ); };\n"), 11,
                 "cluster.measured.allreduse: unknown setting (did you mean "
                 "cluster.measured.allreduce?); a setting loom does not read would change "
                 "nothing, so remove or rename it");
    expect_error(with("  measured = { barrier = ( ); };\n"), 11,
                 "cluster.measured.barrier: unknown setting; cluster.measured takes allreduce, "
                 "broadcast, reduce, allgather, reducescatter, alltoall, send, recv");
    expect_error(with("  measured = { allreduce = ( ); };\n"), 11,
                 "cluster.measured.allreduce: expected a list of fits, ( { ranks = 2; latency = "
                 "\"12 us\"; bandwidth = \"3 GB/s\"; }, ... ); found an empty list");
    expect_error(with("  measured = { allreduce = { ranks = 2; }; };\n"), 11,
                 "cluster.measured.allreduce: expected a list of fits, ( { ranks = 2; latency = "
                 "\"12 us\"; bandwidth = \"3 GB/s\"; }, ... ); found a group");
    expect_error(with("  measured = { allgather = ( 2 ); };\n"), 11,
                 "cluster.measured.allgather[0]: expected { ranks = 2; latency = \"12 us\"; "
                 "bandwidth = \"3 GB/s\"; }; found an integer");
    expect_error(with("  measured = {\n"
                      "    send = ( { latency = \"1 us\"; bandwidth = \"3 GB/s\"; } ); };\n"),
                 12, "cluster.measured.send[0].ranks: missing; add ranks = 2; (the ranks it was "
                     "measured on)");
    expect_error(with("  measured = {\n"
                      "    send = ( { ranks = 2; bandwidth = \"3 GB/s\"; } ); };\n"),
                 12, "cluster.measured.send[0].latency: missing; add latency = \"12 us\"; (the "
                     "fit's seconds at 0 bytes)");
    expect_error(with("  measured = {\n"
                      "    send = ( { ranks = 2; latency = \"1 us\"; } ); };\n"),
                 12, "cluster.measured.send[0].bandwidth: missing; add bandwidth = \"3 GB/s\"; "
                     "(payload bytes a second)");
    expect_error(with("  measured = {\n"
                      "    send = ( { ranks = 2; latency = \"1 us\"; bandwidth = \"3 GB/s\"; "
                      "peers = 1; } ); };\n"),
                 12, "cluster.measured.send[0].peers: unknown setting; cluster.measured.send[0] "
                     "takes ranks, latency, bandwidth");
    expect_error(with("  measured = {\n"
                      "    send = ( { ranks = 1; latency = \"1 us\"; bandwidth = \"3 GB/s\"; } ); "
                      "};\n"),
                 12, "cluster.measured.send[0].ranks: 1 is out of range; it must be 2 or more "
                     "(up to 10^9)");
    expect_error(with("  measured = {\n"
                      "    send = ( { ranks = 2; latency = \"1 us\"; bandwidth = \"3 GB/s\"; },\n"
                      "             { ranks = 2; latency = \"1 us\"; bandwidth = \"3 GB/s\"; } );\n"
                      "  };\n"),
                 13, "cluster.measured.send[1].ranks: cluster.measured.send[0] is of 2 ranks "
                     "already; keep one fit per rank count");
    expect_error(with("  measured = {\n"
                      "    send = ( { ranks = 2; latency = \"1 us\"; bandwidth = \"0 GB/s\"; } ); "
                      "};\n"),
                 12, "cluster.measured.send[0].bandwidth: must be more than 0; write e.g. "
                     "\"450 GB/s\" (bytes), \"400 Gb/s\" (bits) or \"3.5 GiB/s\"");
    char many[2048] = "  measured = {\n    recv = (";
    for (int i = 0; i < LOOM_PLAN_MEASURED_MAX + 1; i++) {
        size_t n = strlen(many);
        snprintf(many + n, sizeof many - n,
                 "%s{ ranks = %d; latency = \"1 us\"; bandwidth = \"3 GB/s\"; }", i ? ", " : " ",
                 i + 2);
    }
    strcat(many, " ); };\n");
    char big[4096];
    snprintf(big, sizeof big, "%s", replaced("ranks_per_node", "  ranks_per_node = 64;"));
    strcpy(big + strlen(big) - 3, many); /* in place of the final "};\n" */
    strcat(big, "};\n");
    expect_error(big, 12, "cluster.measured.recv: 9 fits; loom keeps at most 8 rank counts per op");

    /* a file that is not there */
    loom_plan_cluster c;
    char path[128];
    snprintf(path, sizeof path, "%s/none.cfg", tmpdir);
    CHECK(loom_plan_cluster_read(path, &c) == LOOM_ERR_NOT_FOUND);
    char want[512];
    snprintf(want, sizeof want, "cannot read cluster file '%s': No such file or directory; give a "
             "file like examples/clusters/dgx-h100.cfg", path);
    CHECK_STR(loom_last_error(), want);
}

/* The alpha-beta model against sums done by hand. */
static void case_comm_time(void)
{
    loom_plan_cluster c;
    memset(&c, 0, sizeof c);
    c.ranks_per_node = 8;
    c.intra = (loom_plan_link){2e-6, 100e9};
    c.inter = (loom_plan_link){5e-6, 50e9};

    /* allreduce of 1 MB on 4 ranks in a node: 2·3 steps of 2 us = 12 us;
     * each rank sends 2·3/4 of 1e6 bytes = 1.5e6 at 100 GB/s = 15 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 1000000, 1, 4, 1), 27e-6, same_sum);
    /* ten calls of 1 MB each: ten times that */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 10000000, 10, 4, 1), 270e-6, same_sum);
    /* reducescatter of an 8 MB buffer on 8 ranks: 7 steps of 2 us, 7/8 of
     * 8e6 = 7e6 bytes at 100 GB/s = 70 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_REDUCESCATTER, 8000000, 1, 8, 1), 84e-6, same_sum);
    /* the same allgather on 16 ranks over 2 nodes: the slower link, 15
     * steps of 5 us = 75 us, 15/16 of 8e6 = 7.5e6 bytes at 50 GB/s = 150 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLGATHER, 8000000, 1, 16, 2), 225e-6, same_sum);
    /* alltoall of 4 MB on 4 ranks: 3 steps, 3e6 bytes: 6 + 30 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLTOALL, 4000000, 1, 4, 1), 36e-6, same_sum);
    /* broadcast of 2 MB on 8 ranks, pipelined: 7 steps, all 2e6 bytes on
     * each link: 14 + 20 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_BROADCAST, 2000000, 1, 8, 1), 34e-6, same_sum);
    /* three sends of 1 MB across nodes: 3 · 5 us + 3e6 / 50e9 = 15 + 60 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_SEND, 3000000, 3, 2, 2), 75e-6, same_sum);
    /* a barrier of 8: log2 8 = 3 rounds of 2 us */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_BARRIER, 0, 1, 8, 1), 6e-6, same_sum);
    /* a group of one, or no call, takes no time */
    CHECK(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 1000000, 1, 1, 1) == 0);
    CHECK(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 0, 0, 4, 1) == 0);

    /* measured inside a node replaces the link: at its rank count, the
     * fit itself: 2 calls · 10 us + 8,388,608 B / 3 GB/s */
    c.nmeasured[LOOM_OP_ALLREDUCE] = 2;
    c.measured[LOOM_OP_ALLREDUCE][0] = (loom_plan_measured){2, 10e-6, 3e9};
    c.measured[LOOM_OP_ALLREDUCE][1] = (loom_plan_measured){4, 40e-6, 2e9};
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 8388608, 2, 2, 1),
              20e-6 + 8388608.0 / 3e9, same_sum);
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 1000000, 1, 4, 1),
              40e-6 + 1000000.0 / 2e9, same_sum);
    /* at 8 ranks, from the fit at 4 (nearest): α = 40 us / 6 steps, β =
     * 1.5 · 2 GB/s = 3 GB/s; at 8: 14 steps · 40/6 us + 1.75 · 1e6 / 3e9 */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 1000000, 1, 8, 1),
              14.0 * 40e-6 / 6.0 + 1.75e6 / 3e9, same_sum);
    /* at 3 ranks, 2 and 4 are as near: the larger, 4: 4 steps · 40/6 us +
     * 4/3 · 1e6 / 3e9 */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 1000000, 1, 3, 1),
              4.0 * 40e-6 / 6.0 + (4.0 / 3.0) * 1e6 / 3e9, same_sum);
    /* across nodes the measured fits do not apply: 2·7 steps of 5 us and
     * 2·7/8 of 1e6 at 50 GB/s */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_ALLREDUCE, 1000000, 1, 8, 2),
              70e-6 + 1.75e6 / 50e9, same_sum);
    /* another op keeps the link model */
    CHECK_REL(loom_plan_comm_seconds(&c, LOOM_OP_REDUCESCATTER, 8000000, 1, 8, 1), 84e-6, same_sum);
}

/* The roofline against sums done by hand. */
static void case_compute_time(void)
{
    loom_plan_cluster c;
    memset(&c, 0, sizeof c);
    c.flops[LOOM_F32] = 67e12;
    c.flops[LOOM_BF16] = 989e12;
    c.memory_bytes_per_s = 3.35e12;
    /* 989e12 FLOPs in bf16: 1 s; 3.35e11 bytes: 0.1 s */
    CHECK_REL(loom_plan_compute_seconds(&c, LOOM_BF16, 989e12, 3.35e11), 1.1, same_sum);
    /* fp32: 67e12 FLOPs, 1 s */
    CHECK_REL(loom_plan_compute_seconds(&c, LOOM_F32, 67e12, 0), 1.0, same_sum);
    /* fp16 has no peak here: fp32's rate */
    CHECK_REL(loom_plan_compute_seconds(&c, LOOM_F16, 134e12, 6.7e12), 4.0, same_sum);
    CHECK(loom_plan_compute_seconds(&c, LOOM_BF16, 0, 0) == 0);
}

/* The DGX H100 file says what NVIDIA's datasheets say, and holds the
 * 16,384 GPUs Llama 3 405B trained on; every shipped cluster reads. */
static void case_examples(void)
{
    if (!clusters_dir) {
        fprintf(stderr, "examples: give the clusters directory\n");
        failures++;
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/dgx-h100.cfg", clusters_dir);
    loom_plan_cluster c;
    if (loom_plan_cluster_read(path, &c) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_last_error());
        failures++;
    } else {
        CHECK(c.nodes * c.ranks_per_node == 16384);
        CHECK(c.ranks_per_node == 8 && c.device == 1);
        CHECK(c.device_bytes == 80.0 * (1u << 30));
        CHECK(c.host_bytes == 2.0 * 1024 * 1024 * 1024 * 1024);
        CHECK(c.flops[LOOM_BF16] == 989e12 && c.flops[LOOM_F16] == 989e12);
        CHECK(c.flops[LOOM_F32] == 67e12);
        CHECK(c.memory_bytes_per_s == 3.35e12);
        CHECK(c.intra.bytes_per_s == 900e9 / 2); /* NVLink 4: 900 GB/s both ways */
        CHECK(c.inter.bytes_per_s == 400e9 / 8); /* one 400 Gb/s ConnectX-7 per GPU */
        CHECK(c.inter.bytes_per_s < c.intra.bytes_per_s);
    }
    DIR *d = opendir(clusters_dir);
    int count = 0;
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        size_t n = strlen(ent->d_name);
        if (n < 5 || strcmp(ent->d_name + n - 4, ".cfg"))
            continue;
        snprintf(path, sizeof path, "%s/%s", clusters_dir, ent->d_name);
        if (loom_plan_cluster_read(path, &c) != LOOM_OK) {
            fprintf(stderr, "%s\n", loom_last_error());
            failures++;
        }
        count++;
    }
    if (d)
        closedir(d);
    CHECK(count >= 2);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"units", case_units},
    {"read", case_read},
    {"round_trip", case_round_trip},
    {"refusals", case_refusals},
    {"comm_time", case_comm_time},
    {"compute_time", case_compute_time},
    {"examples", case_examples},
};

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d)
        return;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", tmpdir, ent->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(tmpdir);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "all";
    clusters_dir = argc > 2 ? argv[2] : NULL;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loom-plan-cluster-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    int ran = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++)
        if (!strcmp(which, "all") || !strcmp(which, cases[i].name)) {
            cases[i].run();
            ran++;
        }
    remove_tmpdir();
    if (!ran) {
        fprintf(stderr, "plan_cluster_test: no case '%s'\n", which);
        return 2;
    }
    if (failures) {
        fprintf(stderr, "plan_cluster_test %s: %d check(s) failed\n", which, failures);
        return 1;
    }
    return 0;
}
