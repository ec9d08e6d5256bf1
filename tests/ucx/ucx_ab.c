/* ucx_ab — one op at one size on comm-mpi and comm-ucx, interleaved.
 *
 *   mpirun -np 4 build/bin/ucx_ab OP BYTES ITERS ROUNDS [--set path=value ...]
 *   loom launch -n 4 -- build/bin/ucx_ab ...
 *
 * OP is allreduce, broadcast, reduce, allgather, reducescatter, alltoall or
 * sendrecv; BYTES the size as loom bench counts it (f32 sum). Each round
 * times ITERS ops on one backend, then on the other (alternating which goes
 * first); rank 0 prints the median round of each and the busbw ratio. On a
 * shared machine whose speed drifts by 2x in minutes, this is how the two
 * backends (or two settings, run one after the other) compare fairly. Not a
 * test: a tool for tuning comm-ucx's thresholds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/runtime.h"

static const loom_comm_api *C = &loom_core_comm_api;

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run(loom_group *g, const char *op, void *s, void *r, size_t bytes)
{
    int n = C->size(g), me = C->rank(g), rc;
    size_t count = bytes / 4;
    loom_request *q = NULL, *q2 = NULL;
    if (!strcmp(op, "allreduce"))
        rc = C->allreduce(g, s, r, count, LOOM_F32, LOOM_SUM, &q);
    else if (!strcmp(op, "broadcast"))
        rc = C->broadcast(g, me == 0 ? s : r, count, LOOM_F32, 0, &q);
    else if (!strcmp(op, "reduce"))
        rc = C->reduce(g, s, r, count, LOOM_F32, LOOM_SUM, 0, &q);
    else if (!strcmp(op, "allgather"))
        rc = C->allgather(g, s, r, count / (size_t)n, LOOM_F32, &q);
    else if (!strcmp(op, "reducescatter"))
        rc = C->reducescatter(g, s, r, count / (size_t)n, LOOM_F32, LOOM_SUM, &q);
    else if (!strcmp(op, "alltoall"))
        rc = C->alltoall(g, s, r, count / (size_t)n, LOOM_F32, &q);
    else if (!strcmp(op, "sendrecv")) {
        rc = C->recv(g, r, count, LOOM_F32, (me + n - 1) % n, 0, &q2);
        if (rc == LOOM_OK)
            rc = C->send(g, s, count, LOOM_F32, (me + 1) % n, 0, &q);
    } else {
        fprintf(stderr, "ucx_ab: unknown op '%s'\n", op);
        exit(2);
    }
    if (rc == LOOM_OK)
        rc = C->wait(q);
    if (rc == LOOM_OK)
        rc = C->wait(q2);
    if (rc != LOOM_OK) {
        fprintf(stderr, "ucx_ab: %s on %s failed: %s\n", op, C->backend(g), loom_last_error());
        exit(1);
    }
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: ucx_ab OP BYTES ITERS ROUNDS [--set path=value ...]\n");
        return 2;
    }
    const char *op = argv[1];
    size_t bytes = strtoull(argv[2], NULL, 0);
    int iters = atoi(argv[3]), rounds = atoi(argv[4]);
    if (bytes < 4 || iters < 1 || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "ucx_ab: need BYTES >= 4, ITERS >= 1, 1 <= ROUNDS <= 1000\n");
        return 2;
    }
    const char *overrides[32] = {"comm.timeout_s=60"};
    int noverrides = 1;
    for (int i = 5; i + 1 < argc && noverrides < 32; i += 2)
        if (!strcmp(argv[i], "--set"))
            overrides[noverrides++] = argv[i + 1];
    loom_config *cfg;
    loom_runtime *rt;
    loom_group *g[2];
    static const char *names[2] = {"mpi", "ucx"};
    if (loom_config_load(NULL, overrides, noverrides, &cfg) != LOOM_OK ||
        loom_runtime_create(cfg, &rt) != LOOM_OK || loom_group_world(rt, names[0], &g[0]) != LOOM_OK ||
        loom_group_world(rt, names[1], &g[1]) != LOOM_OK) {
        fprintf(stderr, "ucx_ab: %s\n", loom_last_error());
        return 1;
    }
    int n = C->size(g[0]), me = C->rank(g[0]);
    char *s = malloc(bytes + 64), *r = malloc(bytes + 64);
    double *t = malloc(sizeof(double) * 2 * (size_t)rounds);
    if (!s || !r || !t)
        return 1;
    memset(s, 1, bytes + 64);
    memset(r, 2, bytes + 64);
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < 2; i++) {
            int b = k % 2 ? 1 - i : i;
            loom_request *q;
            run(g[b], op, s, r, bytes); /* warm-up */
            if (C->barrier(g[b], &q) != LOOM_OK || C->wait(q) != LOOM_OK)
                return 1;
            uint64_t t0 = loom_now_ns();
            for (int it = 0; it < iters; it++)
                run(g[b], op, s, r, bytes);
            double us = (double)(loom_now_ns() - t0) / 1e3 / iters, worst = us;
            if (C->allreduce(g[b], &us, &worst, 1, LOOM_F64, LOOM_MAX, &q) != LOOM_OK ||
                C->wait(q) != LOOM_OK)
                return 1;
            t[b * rounds + k] = worst;
        }
    if (me == 0) {
        double factor = !strcmp(op, "allreduce") ? 2.0 * (n - 1) / n
                        : !strcmp(op, "allgather") || !strcmp(op, "reducescatter") ||
                                  !strcmp(op, "alltoall")
                            ? (double)(n - 1) / n
                            : 1.0;
        double med[2];
        for (int b = 0; b < 2; b++) {
            qsort(t + b * rounds, (size_t)rounds, sizeof(double), by_value);
            med[b] = t[b * rounds + rounds / 2];
        }
        printf("%-13s %10zu B  %d ranks  mpi %9.1f us %6.2f GB/s  ucx %9.1f us %6.2f GB/s  "
               "ucx/mpi busbw %.2f\n",
               op, bytes, n, med[0], (double)bytes / med[0] / 1e3 * factor, med[1],
               (double)bytes / med[1] / 1e3 * factor, med[0] / med[1]);
    }
    loom_group_destroy(g[1]);
    loom_group_destroy(g[0]);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    free(s);
    free(r);
    free(t);
    return 0;
}
