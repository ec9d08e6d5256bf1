/* loom plan --calibrate (core/cli/plan_calibrate.c):
 *   fake     against tests/plan/fake_loom.sh, whose bench rows are exact
 *            lines of known latency and bandwidth: the fits must give
 *            those back, on mpi after ucx gave nothing; the reference
 *            run's median and the effective rate by hand;
 *   machine  this machine, 2 ranks: cores and memory as /proc says, the
 *            written file read back;
 *   reference FAKE_LOOM TINY_CFG: the reference step counted by the
 *            planner, the effective rate from the stand-in's step time;
 *   write    LOOM OUT MAX_RANKS [CONFIG DATA]: calibrate and write OUT (how
 *            examples/clusters/this-machine.cfg was made, until `loom plan
 *            --calibrate` calls the same).
 *
 *   plan_calibrate_test CASE ARGS... */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/plan_calibrate.h"
#include "cli/settings.h"
#include "loom/status.h"
#include "runtime/log.h"
#include "check.h"

static void write_and_read_back(const loom_plan_calibration *cal, loom_plan_cluster *back)
{
    char path[] = "/tmp/loom-calibrated-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    CHECK(loom_plan_calibration_write(cal, path) == LOOM_OK);
    if (loom_plan_cluster_read(path, back) != LOOM_OK) {
        fprintf(stderr, "read back: %s\n", loom_last_error());
        failures++;
    }
    unlink(path);
}

/* fake_loom.sh's op k (1 = allreduce ... 7 = sendrecv) at r ranks:
 * latency k + r microseconds, bandwidth k / r GB/s. */
static void case_fake(const char *fake)
{
    loom_plan_calibration cal;
    if (loom_plan_calibrate(fake, 4, NULL, &cal) != LOOM_OK) {
        fprintf(stderr, "calibrate: %s\n", loom_last_error());
        failures++;
        return;
    }
    CHECK(!strcmp(cal.comm, "mpi")); /* ucx gave no rows */
    const loom_plan_cluster *c = &cal.cluster;
    /* bench's ops in fake_loom.sh's order; sendrecv gives send and recv */
    static const int ops[7][2] = {
        {LOOM_OP_ALLREDUCE, -1},     {LOOM_OP_BROADCAST, -1}, {LOOM_OP_REDUCE, -1},
        {LOOM_OP_ALLGATHER, -1},     {LOOM_OP_REDUCESCATTER, -1}, {LOOM_OP_ALLTOALL, -1},
        {LOOM_OP_SEND, LOOM_OP_RECV}};
    for (int k = 1; k <= 7; k++)
        for (int j = 0; j < 2; j++) {
            int op = ops[k - 1][j];
            if (op < 0)
                continue;
            CHECK(c->nmeasured[op] == 2);
            for (int i = 0; i < 2; i++) {
                int r = i ? 4 : 2;
                CHECK(c->measured[op][i].ranks == r);
                CHECK_EQ(c->measured[op][i].latency_s, (k + r) / 1e6);
                CHECK_EQ(c->measured[op][i].bytes_per_s, k / (double)r * 1e9);
            }
        }
    CHECK(c->nmeasured[LOOM_OP_BARRIER] == 0);
    /* intra: the 2-rank allreduce (3 us, 0.5 GB/s) as a link of 2 messages */
    CHECK_EQ(c->intra.latency_s, 1.5e-6);
    CHECK_EQ(c->intra.bytes_per_s, 0.5e9);
    CHECK(c->inter.latency_s == c->intra.latency_s && c->inter.bytes_per_s == c->intra.bytes_per_s);
    /* fp16 multiplies as fp32; bf16 at its own rate (the library's bf16 product) */
    CHECK(c->flops[LOOM_F32] > 0 && c->flops[LOOM_F16] == c->flops[LOOM_F32] &&
          c->flops[LOOM_BF16] > 0);
    CHECK(c->memory_bytes_per_s > 0 && c->nodes == 1 && !c->device);

    loom_plan_cluster back;
    write_and_read_back(&cal, &back);
    CHECK_EQ(back.measured[LOOM_OP_ALLTOALL][1].bytes_per_s, 1.5e9);
    CHECK_EQ(back.intra.latency_s, 1.5e-6);

    /* max 2 ranks: the 4-rank runs are not made */
    if (loom_plan_calibrate(fake, 3, NULL, &cal) == LOOM_OK)
        CHECK(cal.cluster.nmeasured[LOOM_OP_ALLREDUCE] == 1);
    else
        failures++;
    CHECK(loom_plan_calibrate(fake, 1, NULL, &cal) == LOOM_ERR_INVALID);
    CHECK(loom_plan_calibrate("/nonexistent/loom", 2, NULL, &cal) == LOOM_ERR_NOT_FOUND);

    /* the reference: steps 3..13 take 2..12 ms, median 7 ms */
    double step_s = 0;
    const char *sets[] = {"data.train=corpus.bin"};
    CHECK(loom_plan_calibrate_reference(fake, "ref.cfg", sets, 1, &step_s) == LOOM_OK);
    CHECK_EQ(step_s, 7e-3);
    /* at a peak of 100 GFLOP/s, 2e8 FLOP of GEMMs take 2 ms of the 7; the
     * other 5 ms move 1e8 bytes: 20 GB/s */
    cal.cluster.flops[LOOM_F32] = 1e11;
    CHECK(loom_plan_calibrate_effective_memory(&cal, "ref.cfg", 7e-3, 2e8, 1e8) == LOOM_OK);
    CHECK_EQ(cal.cluster.memory_bytes_per_s, 20e9);
    /* GEMMs explaining all but 2% of a step leave nothing to fit */
    CHECK(loom_plan_calibrate_effective_memory(&cal, "ref.cfg", 7e-3, 6.86e8, 1e8) ==
          LOOM_ERR_INVALID);
    CHECK_EQ(cal.cluster.memory_bytes_per_s, 20e9);
}

/* The reference counted by the planner: tests/zero/tiny.cfg's GEMMs are
 * loom's own FLOPs a token (loom_model_flops_per_token: 6 per parameter
 * but the position embeddings', and 6·L·T·C of causal attention) times
 * the 384 tokens of a step, to the planner's rounding of the small
 * parameters (biases, norms): within 2%. */
static void case_reference(const char *fake, const char *tiny)
{
    loom_plan_calibration cal;
    if (loom_plan_calibrate(fake, 2, NULL, &cal) != LOOM_OK) {
        fprintf(stderr, "calibrate: %s\n", loom_last_error());
        failures++;
        return;
    }
    cal.cluster.flops[LOOM_F32] = 1e11;
    const char *sets[] = {"data.train=corpus.bin"};
    double gemm = 0, other = 0;
    if (loom_plan_calibrate_count(tiny, sets, 1, &cal.cluster, &gemm, &other) != LOOM_OK) {
        fprintf(stderr, "count: %s\n", loom_last_error());
        failures++;
        return;
    }
    /* L 2, C 64, T 32, Vp 256, max_seq 64: 120,576 parameters, 4,096 of
     * them position embeddings */
    double model = 384.0 * (6.0 * (120576 - 4096) + 6.0 * 2 * 32 * 64);
    CHECK(fabs(gemm - model) <= 0.02 * model);
    /* the model's accounted state (params, grads, Adam: 482,304 + 482,304
     * + 964,608 bytes) is streamed at least once */
    CHECK(other >= 482304.0 + 482304 + 964608);
    /* the fake step is 7 ms; at 100 GFLOP/s the GEMMs take gemm / 1e11 */
    CHECK(loom_plan_calibrate_compute(&cal, fake, tiny, sets, 1, NULL) == LOOM_OK);
    char want[32];
    snprintf(want, sizeof want, "%.4g", other / (7e-3 - gemm / 1e11));
    CHECK_EQ(cal.cluster.memory_bytes_per_s, strtod(want, NULL));
    /* a reference of two ranks is refused */
    const char *two[] = {"data.train=corpus.bin", "parallel.dp.size=2"};
    CHECK(loom_plan_calibrate_count(tiny, two, 2, &cal.cluster, &gemm, &other) ==
          LOOM_ERR_INVALID);
}

static double proc_number(const char *file, const char *key, int count_lines)
{
    FILE *f = fopen(file, "r");
    double v = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)))
            v = count_lines ? v + 1 : strtod(strchr(line, ':') + 1, NULL);
    if (f)
        fclose(f);
    return v;
}

static void case_machine(const char *loom)
{
    loom_plan_calibration cal;
    if (loom_plan_calibrate(loom, 2, stderr, &cal) != LOOM_OK) {
        fprintf(stderr, "calibrate: %s\n", loom_last_error());
        failures++;
        return;
    }
    const loom_plan_cluster *c = &cal.cluster;
    CHECK(c->ranks_per_node == (int)proc_number("/proc/cpuinfo", "processor", 1));
    CHECK_EQ(c->host_bytes, proc_number("/proc/meminfo", "MemTotal:", 0) * 1024);
    CHECK(c->nmeasured[LOOM_OP_ALLREDUCE] == 1 && c->measured[LOOM_OP_ALLREDUCE][0].ranks == 2);
    for (int op = 0; op < LOOM_OP_BARRIER; op++)
        CHECK(c->nmeasured[op] == 1 && c->measured[op][0].bytes_per_s > 0);
    loom_plan_cluster back;
    write_and_read_back(&cal, &back);
    CHECK_EQ(back.flops[LOOM_F32], c->flops[LOOM_F32]);
    fprintf(stderr, "calibrated in %.1f s on comm %s\n", cal.seconds, cal.comm);
}

/* write LOOM OUT MAX_RANKS [CONFIG DATA]: with CONFIG, one rank of it is
 * the reference for the non-GEMM kernels' rate. */
static int write_calibration(int argc, char **argv)
{
    if (argc != 5 && argc != 7) {
        fprintf(stderr, "usage: plan_calibrate_test write LOOM OUT MAX_RANKS [CONFIG DATA]\n");
        return 2;
    }
    loom_plan_calibration cal;
    int rc = loom_plan_calibrate(argv[2], atoi(argv[4]), stdout, &cal);
    if (rc == LOOM_OK && argc == 7) {
        char data[512];
        snprintf(data, sizeof data, "data.train=%s", argv[6]);
        const char *sets[] = {data};
        rc = loom_plan_calibrate_compute(&cal, argv[2], argv[5], sets, 1, stdout);
    }
    if (rc == LOOM_OK)
        rc = loom_plan_calibration_write(&cal, argv[3]);
    if (rc != LOOM_OK)
        fprintf(stderr, "%s\n", loom_last_error());
    return rc == LOOM_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "";
    if (loom_cli_add_settings() != LOOM_OK)
        return 2;
    if (!strcmp(which, "write"))
        return write_calibration(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: plan_calibrate_test fake FAKE_LOOM | reference FAKE_LOOM TINY_CFG "
                        "| machine LOOM | write ...\n");
        return 2;
    }
    if (!strcmp(which, "fake"))
        case_fake(argv[2]);
    else if (!strcmp(which, "reference") && argc > 3)
        case_reference(argv[2], argv[3]);
    else if (!strcmp(which, "machine"))
        case_machine(argv[2]);
    else {
        fprintf(stderr, "plan_calibrate_test: no case '%s'\n", which);
        return 2;
    }
    if (failures) {
        fprintf(stderr, "plan_calibrate_test %s: %d check(s) failed\n", which, failures);
        return 1;
    }
    return 0;
}
