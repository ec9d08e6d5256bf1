/* The sequence strategies (ulysses, ring) on their own, against causal
 * attention over the whole sequence on one rank:
 *
 *   attention_test [path=value ...]      e.g. parallel.sp.size=3 parallel.sp.strategy=ring
 *
 * Every rank makes the same random q, k, v and dout of the whole sequence
 * for two layers, keeps the rows of the positions the strategy gives it,
 * and runs forward for both layers, then backward in reverse order (so a
 * strategy that keeps state per layer must key it right). out, dq, dk, dv
 * (and lse, which ring attention fills) must match the single-rank kernel
 * at those positions, and the sp group's counters must show exactly the
 * communication of the formulas: Ulysses four all-to-alls of B·T·C/p
 * elements per layer each way; ring p-1 K/V block transfers forward, p-1
 * K/V and p dK/dV transfers backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/kernels.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"
#include "rank_check.h"

enum { B = 2, T = 24, NH = 4, HS = 8, C = NH * HS, LAYERS = 2 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0) - 0.5f;
}

/* The whole sequence of one layer, and the single-rank answer. */
typedef struct layer {
    float q[B * T * C], k[B * T * C], v[B * T * C], dout[B * T * C];
    float out[B * T * C], lse[B * NH * T], dq[B * T * C], dk[B * T * C], dv[B * T * C];
} layer;

/* This rank's rows of a layer. */
typedef struct local {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} local;

static void take_rows(float *dst, const float *src, const int *pos, int n)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++)
            memcpy(dst + ((size_t)b * n + i) * C, src + ((size_t)b * T + pos[i]) * C,
                   C * sizeof(float));
}

static float *rows_of(const float *src, const int *pos, int n)
{
    float *dst = calloc((size_t)B * n * C, sizeof(float));
    take_rows(dst, src, pos, n);
    return dst;
}

static void compare(const char *what, int l, const float *got, const float *whole,
                    const int *pos, int n)
{
    float *want = rows_of(whole, pos, n);
    double worst = 0, scale = 1e-3;
    for (size_t i = 0; i < (size_t)B * n * C; i++) {
        scale = fmax(scale, fabs(want[i]));
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    }
    CHECK(worst <= 1e-5 * scale, "layer %d %s: worst difference %.3g (scale %.3g)", l, what,
          worst, scale);
    free(want);
}

static uint64_t sent(const loom_comm_counters *c) { return c->bytes[LOOM_OP_SEND]; }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    loom_config *cfg;
    loom_runtime *rt;
    loom_mesh *mesh;
    if (loom_config_load(NULL, (const char *const *)argv + 1, argc - 1, &cfg) != LOOM_OK ||
        loom_runtime_create(cfg, &rt) != LOOM_OK) {
        fprintf(stderr, "attention_test: %s\n", loom_last_error());
        return 1;
    }
    my_rank = loom_runtime_env(rt)->rank;
    OK(loom_mesh_create(rt, &mesh));
    const char *name = "ulysses";
    loom_config_string(cfg, "parallel.sp.strategy", &name);
    int ring = !strcmp(name, "ring");
    const loom_plugin *plugin;
    OK(loom_runtime_plugin(rt, LOOM_PLUGIN_STRATEGY, name, &plugin));
    const loom_strategy_plugin_v1_t *P = (const loom_strategy_plugin_v1_t *)plugin->header;
    const loom_host *host;
    OK(loom_runtime_host(rt, plugin, "parallel.sp", &host));
    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_SP};
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        setup.sizes[a] = mesh->sizes[a];
        setup.coords[a] = mesh->coords[a];
        setup.groups[a] = mesh->groups[a];
    }
    setup.heads = NH;
    setup.channels = C;
    setup.seq = T;
    setup.max_seq = T;
    setup.micro_batch = B;
    setup.compute_dtype = LOOM_F32;
    loom_strategy *s;
    OK(P->create(host, &setup, &s));
    loom_group *sp = mesh->groups[LOOM_AXIS_SP];
    const int p = mesh->sizes[LOOM_AXIS_SP];

    int pos[T], n = 0;
    OK(P->sequence_positions(s, T, pos, &n));
    CHECK(n == T / p, "%d positions, want %d", n, T / p);

    /* the whole sequence and its single-rank attention, the same on every rank */
    static layer L[LAYERS];
    local loc[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        layer *x = &L[l];
        for (int i = 0; i < B * T * C; i++) {
            x->q[i] = uniform() * 2;
            x->k[i] = uniform() * 2;
            x->v[i] = uniform();
            x->dout[i] = uniform();
        }
        loom_attention_forward(x->out, x->lse, x->q, x->k, x->v, B, T, NH, HS);
        loom_attention_backward(x->dq, x->dk, x->dv, x->q, x->k, x->v, x->out, x->dout, x->lse,
                                B, T, NH, HS);
        local *y = &loc[l];
        y->q = rows_of(x->q, pos, n);
        y->k = rows_of(x->k, pos, n);
        y->v = rows_of(x->v, pos, n);
        y->dout = rows_of(x->dout, pos, n);
        y->out = calloc((size_t)B * n * C, sizeof(float));
        y->lse = calloc((size_t)B * NH * n, sizeof(float));
        y->dq = calloc((size_t)B * n * C, sizeof(float));
        y->dk = calloc((size_t)B * n * C, sizeof(float));
        y->dv = calloc((size_t)B * n * C, sizeof(float));
    }

    loom_comm_counters c0, c1, c2;
    loom_group_counters(sp, &c0);
    for (int l = 0; l < LAYERS; l++) {
        local *y = &loc[l];
        loom_attention a = {B, n, NH, HS, LOOM_F32, pos, y->q, y->k, y->v, y->out, y->lse,
                            NULL, NULL, NULL, NULL, &loom_attention_kernels_cpu};
        OK(P->attention_forward(s, &a));
    }
    loom_group_counters(sp, &c1);
    for (int l = LAYERS - 1; l >= 0; l--) {
        local *y = &loc[l];
        loom_attention a = {B, n, NH, HS, LOOM_F32, pos, y->q, y->k, y->v, y->out, y->lse,
                            y->dout, y->dq, y->dk, y->dv, &loom_attention_kernels_cpu};
        OK(P->attention_backward(s, &a));
    }
    loom_group_counters(sp, &c2);

    for (int l = 0; l < LAYERS; l++) {
        compare("out", l, loc[l].out, L[l].out, pos, n);
        compare("dq", l, loc[l].dq, L[l].dq, pos, n);
        compare("dk", l, loc[l].dk, L[l].dk, pos, n);
        compare("dv", l, loc[l].dv, L[l].dv, pos, n);
        if (ring) /* (B, NH, T) */
            for (int b = 0; b < B; b++)
                for (int h = 0; h < NH; h++)
                    for (int i = 0; i < n; i++) {
                        float got = loc[l].lse[((size_t)b * NH + h) * n + i];
                        float want = L[l].lse[((size_t)b * NH + h) * T + pos[i]];
                        CHECK(fabsf(got - want) <= 1e-5f * fmaxf(1.0f, fabsf(want)),
                              "layer %d lse[%d,%d,%d]: %g, want %g", l, b, h, pos[i], got, want);
                    }
    }

    /* the formulas, per layer, in bytes */
    const uint64_t block = (uint64_t)B * n * C * sizeof(float);
    if (ring) {
        uint64_t fwd = sent(&c1) - sent(&c0), bwd = sent(&c2) - sent(&c1);
        uint64_t fwd_calls = c1.calls[LOOM_OP_SEND] - c0.calls[LOOM_OP_SEND];
        uint64_t bwd_calls = c2.calls[LOOM_OP_SEND] - c1.calls[LOOM_OP_SEND];
        CHECK(fwd == LAYERS * (uint64_t)(p - 1) * 2 * block,
              "forward sent %llu bytes, want %d layers x %d K/V blocks of %llu", (unsigned long long)fwd,
              LAYERS, p - 1, (unsigned long long)(2 * block));
        CHECK(fwd_calls == LAYERS * (uint64_t)(p - 1), "forward: %llu sends, want %d",
              (unsigned long long)fwd_calls, LAYERS * (p - 1));
        CHECK(bwd == LAYERS * (uint64_t)(2 * p - 1) * 2 * block,
              "backward sent %llu bytes, want %d layers x (%d K/V + %d dK/dV) blocks of %llu",
              (unsigned long long)bwd, LAYERS, p - 1, p, (unsigned long long)(2 * block));
        CHECK(bwd_calls == LAYERS * (uint64_t)(2 * p - 1), "backward: %llu sends, want %d",
              (unsigned long long)bwd_calls, LAYERS * (2 * p - 1));
        CHECK(c2.bytes[LOOM_OP_RECV] - c0.bytes[LOOM_OP_RECV] == sent(&c2) - sent(&c0),
              "received %llu bytes, sent %llu", (unsigned long long)(c2.bytes[LOOM_OP_RECV] - c0.bytes[LOOM_OP_RECV]),
              (unsigned long long)(sent(&c2) - sent(&c0)));
        printf("rank %d: ring over %d, positions %d..: %llu bytes forward, %llu backward\n",
               my_rank, p, pos[0], (unsigned long long)fwd, (unsigned long long)bwd);
    } else {
        uint64_t fwd = c1.bytes[LOOM_OP_ALLTOALL] - c0.bytes[LOOM_OP_ALLTOALL];
        uint64_t bwd = c2.bytes[LOOM_OP_ALLTOALL] - c1.bytes[LOOM_OP_ALLTOALL];
        uint64_t calls = c2.calls[LOOM_OP_ALLTOALL] - c0.calls[LOOM_OP_ALLTOALL];
        CHECK(fwd == LAYERS * 4 * block && bwd == LAYERS * 4 * block,
              "all-to-all bytes %llu forward, %llu backward; want %d layers x 4 x %llu each",
              (unsigned long long)fwd, (unsigned long long)bwd, LAYERS, (unsigned long long)block);
        CHECK(calls == LAYERS * 8, "%llu all-to-alls, want %d", (unsigned long long)calls,
              LAYERS * 8);
        printf("rank %d: ulysses over %d: %llu bytes forward, %llu backward\n", my_rank, p,
               (unsigned long long)fwd, (unsigned long long)bwd);
    }
    /* nothing else but the one all-gather of the positions at the first call */
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        uint64_t calls = c2.calls[op] - c0.calls[op];
        if (op == LOOM_OP_ALLGATHER)
            CHECK(calls <= 1, "%llu all-gathers during attention", (unsigned long long)calls);
        else if (op != LOOM_OP_ALLTOALL && op != LOOM_OP_SEND && op != LOOM_OP_RECV)
            CHECK(calls == 0, "%llu %s calls during attention", (unsigned long long)calls,
                  loom_comm_op_name((loom_comm_op)op));
    }

    for (int l = 0; l < LAYERS; l++) {
        local *y = &loc[l];
        free(y->q), free(y->k), free(y->v), free(y->dout), free(y->out), free(y->lse);
        free(y->dq), free(y->dk), free(y->dv);
    }
    P->destroy(s);
    loom_mesh_destroy(mesh);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    printf("rank %d: %s\n", my_rank, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
