/* The ddp strategy plugin, driven through its hooks the way the trainer
 * drives them, on fake units, against a serial reference:
 *
 *   ddp_test [path=value ...] [--expect-error TEXT] [--straggler R]
 *
 * The arguments are config overrides (parallel.dp.size=3, comm.default=mpi,
 * parallel.dp.bucket_mb=0.001, ...). With --expect-error, creating the
 * strategy must fail with a message containing TEXT. With --straggler R,
 * rank R never reaches the backward: the others' data_finish_backward must
 * time out naming it, and destroy must still return promptly.
 *
 * Fake gradients are small multiples of 1/64, so every sum over ranks and
 * micro-batches is exact in f32, bf16 and f16 and the average is one
 * rounding of an exact value: the expected gradient is computed serially
 * and compared within one unit in the last place of the compute dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "rank_check.h"
#include "strategy_test.h"

/* Unit 0 is the embedding, the last the head (tied to the embedding). */
#define NUNITS 5
static const size_t NUMEL[NUNITS] = {300, 1000, 100, 700, 200};

typedef struct fixture {
    loom_runtime *rt;
    loom_mesh *mesh;
    const loom_strategy_plugin_v1_t *P;
    const loom_host *host;
    loom_group *dp;
    int dp_rank, dp_size;
    int overlap;
    double bucket_mb;
} fixture;

typedef struct scenario {
    loom_dtype dtype;
    int grad_accum;  /* micro-batches per step */
    int steps;
    int skip_last;   /* the last step is skipped (fp16 overflow): data_zero_grads */
    float grad_scale;
} scenario;

/* ----------------------------------------------------------- buckets */

/* The bucket each unit should land in: units walked last to first, a bucket
 * closing once it holds bucket_mb MiB. */
static int expected_buckets(double bucket_mb, size_t esize, int bucket_of[NUNITS])
{
    double limit = bucket_mb * 1024.0 * 1024.0;
    int nb = 0;
    size_t bytes = 0;
    for (int u = NUNITS - 1; u >= 0; u--) {
        bucket_of[u] = nb;
        bytes += NUMEL[u] * esize;
        if ((double)bytes >= limit || u == 0) {
            nb++;
            bytes = 0;
        }
    }
    return nb;
}

/* Buckets whose units have all been reported, counted in order (a bucket is
 * posted only after every earlier one). */
static int complete_prefix(const int bucket_of[NUNITS], int nbuckets, const int reported[NUNITS])
{
    int done = 0;
    for (int b = 0; b < nbuckets; b++) {
        int all = 1;
        for (int u = 0; u < NUNITS; u++)
            if (bucket_of[u] == b && !reported[u])
                all = 0;
        if (!all)
            break;
        done++;
    }
    return done;
}

static uint64_t allreduces(loom_group *g)
{
    loom_comm_counters c;
    loom_group_counters(g, &c);
    return c.calls[LOOM_OP_ALLREDUCE];
}

/* ----------------------------------------------------------- scenario */

static void run(fixture *fx, const scenario *sc)
{
    const loom_strategy_plugin_v1_t *P = fx->P;
    loom_dtype dt = sc->dtype;
    size_t esize = loom_dtype_size(dt);
    const char *dname = loom_dtype_name(dt);
    int N = fx->dp_size;

    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_DP};
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        setup.sizes[a] = fx->mesh->sizes[a];
        setup.coords[a] = fx->mesh->coords[a];
        setup.groups[a] = fx->mesh->groups[a];
    }
    setup.layers = NUNITS - 2;
    setup.micro_batch = 2;
    setup.seq = 8;
    setup.micro_batches = sc->grad_accum;
    setup.compute_dtype = dt;

    loom_strategy *s;
    OK(P->create(fx->host, &setup, &s));

    loom_unit units[NUNITS];
    float *init[NUNITS], *ref_master[NUNITS], *ref_m[NUNITS], *ref_v[NUNITS], *ref_grad[NUNITS];
    size_t psi = 0;
    memset(units, 0, sizeof units);
    for (int u = 0; u < NUNITS; u++) {
        units[u].index = u;
        units[u].kind = u == 0 ? LOOM_UNIT_EMBEDDING : u == NUNITS - 1 ? LOOM_UNIT_HEAD : LOOM_UNIT_BLOCK;
        units[u].name = u == 0 ? "embedding" : u == NUNITS - 1 ? "head" : "block";
        units[u].numel = NUMEL[u];
        units[u].compute_dtype = dt;
        init[u] = malloc(NUMEL[u] * sizeof(float));
        ref_master[u] = malloc(NUMEL[u] * sizeof(float));
        ref_m[u] = calloc(NUMEL[u], sizeof(float));
        ref_v[u] = calloc(NUMEL[u], sizeof(float));
        ref_grad[u] = malloc(NUMEL[u] * sizeof(float));
        for (size_t j = 0; j < NUMEL[u]; j++)
            init[u][j] = ref_master[u][j] = init_value(u, j);
        psi += NUMEL[u];
    }

    /* Model-state bytes: exactly 16 per parameter, by purpose. */
    loom_mem_usage before, after;
    loom_mem_usage_get(&before);
    OK(P->data_setup(s, units, NUNITS, init));
    loom_mem_usage_get(&after);
    uint64_t want_params = esize * psi, want_grads = esize * psi;
    uint64_t want_opt = (dt == LOOM_F32 ? 8 : 12) * psi;
    uint64_t got_params = after.current[LOOM_TIER_HOST][LOOM_PURPOSE_PARAMS] -
                          before.current[LOOM_TIER_HOST][LOOM_PURPOSE_PARAMS];
    uint64_t got_grads = after.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS] -
                         before.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS];
    uint64_t got_opt = after.current[LOOM_TIER_HOST][LOOM_PURPOSE_OPTIMIZER] -
                       before.current[LOOM_TIER_HOST][LOOM_PURPOSE_OPTIMIZER];
    CHECK(got_params == want_params && got_grads == want_grads && got_opt == want_opt,
          "%s: model state params %llu grads %llu optimizer %llu bytes, want %llu %llu %llu", dname,
          (unsigned long long)got_params, (unsigned long long)got_grads,
          (unsigned long long)got_opt, (unsigned long long)want_params,
          (unsigned long long)want_grads, (unsigned long long)want_opt);
    CHECK(got_params + got_grads + got_opt == 16 * psi, "%s: model state is not 16 bytes/param",
          dname);

    /* Placement: contiguous buffers, the last unit first, parameters = init. */
    for (int u = 0; u < NUNITS; u++) {
        CHECK(units[u].params && units[u].grads, "%s: unit %d has no buffers", dname, u);
        if (u + 1 < NUNITS)
            CHECK((char *)units[u + 1].grads + NUMEL[u + 1] * esize == (char *)units[u].grads,
                  "%s: unit %d's gradients do not follow unit %d's", dname, u, u + 1);
        for (size_t j = 0; j < NUMEL[u]; j++) {
            CHECK(loom_load_f32(units[u].params, dt, j) == round_to(dt, init[u][j]),
                  "%s: unit %d param %zu = %g, want %g", dname, u, j, loom_load_f32(units[u].params, dt, j),
                  round_to(dt, init[u][j]));
            CHECK(loom_load_f32(units[u].grads, dt, j) == 0.0f, "%s: unit %d grad %zu not zeroed", dname, u, j);
        }
    }

    int bucket_of[NUNITS];
    int nbuckets = expected_buckets(fx->bucket_mb, esize, bucket_of);
    char desc[256];
    OK(P->describe(s, desc, sizeof desc));
    char want_desc[64];
    snprintf(want_desc, sizeof want_desc, "ddp over %d ranks, %d bucket%s", N, nbuckets,
             nbuckets == 1 ? "" : "s");
    CHECK(strstr(desc, want_desc) && strstr(desc, fx->overlap ? "overlap on" : "overlap off"),
          "%s: describe says \"%s\", want \"%s ... overlap %s\"", dname, desc, want_desc,
          fx->overlap ? "on" : "off");
    if (fx->dp_rank == 0 && my_rank == 0)
        printf("%s, grad_accum %d: %s\n", dname, sc->grad_accum, desc);

    loom_optimizer_step opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .weight_decay = 0.01f, .grad_scale = sc->grad_scale, .update = adamw,
                               .update_range = adamw_range};
    for (int step = 1; step <= sc->steps; step++) {
        uint64_t calls0 = allreduces(fx->dp);
        int reported[NUNITS] = {0};
        for (int micro = 0; micro < sc->grad_accum; micro++) {
            int last = micro == sc->grad_accum - 1;
            /* Backward, last unit first; the head also writes the tied
             * embedding's gradient, so the embedding is reported last. */
            for (int u = NUNITS - 1; u >= 0; u--) {
                if (P->data_before_backward)
                    OK(P->data_before_backward(s, &units[u]));
                for (size_t j = 0; j < NUMEL[u]; j++) {
                    float g = (float)(kval(fx->dp_rank, step, micro, u, j, 1) +
                                      (u ? kval(fx->dp_rank, step, micro, u, j, 0) : 0)) / 64.0f;
                    loom_store_f32(units[u].grads, dt, j, loom_load_f32(units[u].grads, dt, j) + g);
                }
                if (u == NUNITS - 1)
                    for (size_t j = 0; j < NUMEL[0]; j++) {
                        float g = (float)kval(fx->dp_rank, step, micro, 0, j, 0) / 64.0f;
                        loom_store_f32(units[0].grads, dt, j, loom_load_f32(units[0].grads, dt, j) + g);
                    }
                OK(P->data_grads_ready(s, &units[u], last));
                if (last)
                    reported[u] = 1;
                uint64_t posted = allreduces(fx->dp) - calls0;
                uint64_t want = last && fx->overlap ? (uint64_t)complete_prefix(bucket_of, nbuckets, reported) : 0;
                CHECK(posted == want,
                      "%s step %d micro %d: %llu all-reduces posted after unit %d, want %llu", dname,
                      step, micro, (unsigned long long)posted, u, (unsigned long long)want);
            }
            if (!last) /* a trainer may tell the strategy after every micro-batch */
                OK(P->data_finish_backward(s));
        }
        /* Gradients are not the average until the reductions complete. */
        double early;
        CHECK(P->data_grad_norm_sq(s, &early) == LOOM_ERR_INVALID &&
                  strstr(loom_last_error(), "data_finish_backward"),
              "%s: data_grad_norm_sq before data_finish_backward must fail (got \"%s\")", dname,
              loom_last_error());
        loom_clear_error();
        OK(P->data_finish_backward(s));
        uint64_t calls = allreduces(fx->dp) - calls0;
        CHECK(calls == (uint64_t)nbuckets, "%s step %d: %llu all-reduces, want one per bucket (%d)",
              dname, step, (unsigned long long)calls, nbuckets);

        /* The serial reference: the average over every rank's inputs. */
        double norm_ref = 0.0;
        int bad = 0;
        for (int u = 0; u < NUNITS; u++)
            for (size_t j = 0; j < NUMEL[u]; j++) {
                int sum = 0;
                for (int r = 0; r < N; r++)
                    for (int micro = 0; micro < sc->grad_accum; micro++)
                        sum += kval(r, step, micro, u, j, 0) + kval(r, step, micro, u, j, 1);
                float want = round_to(dt, ((float)sum / 64.0f) / (float)N);
                float got = loom_load_f32(units[u].grads, dt, j);
                ref_grad[u][j] = want;
                norm_ref += (double)want * want;
                if (fabsf(got - want) > ulp_of(dt) * fabsf(want) && bad++ < 5)
                    CHECK(0, "%s step %d: unit %d grad %zu = %.9g, want the average %.9g", dname,
                          step, u, j, got, want);
            }
        double norm;
        OK(P->data_grad_norm_sq(s, &norm));
        CHECK(fabs(norm - norm_ref) <= 2.5 * ulp_of(dt) * norm_ref, "%s step %d: grad_norm_sq %.12g, want %.12g",
              dname, step, norm, norm_ref);

        if (sc->skip_last && step == sc->steps) {
            OK(P->data_zero_grads(s));
        } else {
            /* Step the reference from the expected gradient. */
            opt.step++;
            update_calls = 0;
            update_elems = 0;
            OK(P->data_optimizer_step(s, &opt));
            CHECK(update_calls == NUNITS && update_elems == psi,
                  "%s: update called %d times on %zu elements, want %d on %zu", dname,
                  update_calls, update_elems, NUNITS, psi);
            CHECK(update_ranges_outside == 0, "%s: %d update ranges outside their unit", dname,
                  update_ranges_outside);
            for (int u = 0; u < NUNITS; u++)
                adamw(&opt, ref_master[u], ref_grad[u], LOOM_F32, ref_m[u], ref_v[u], NUMEL[u]);
        }

        /* Master weights in fp32, parameters their rounding, gradients zero. */
        bad = 0;
        for (int u = 0; u < NUNITS; u++) {
            float *mp = malloc(NUMEL[u] * sizeof(float)), *mm = malloc(NUMEL[u] * sizeof(float)),
                  *mv = malloc(NUMEL[u] * sizeof(float));
            OK(P->data_get_state(s, &units[u], mp, mm, mv));
            for (size_t j = 0; j < NUMEL[u]; j++) {
                float tol = 1e-6f * fabsf(ref_master[u][j]) + 1e-9f;
                int ok = fabsf(mp[j] - ref_master[u][j]) <= tol &&
                         fabsf(mm[j] - ref_m[u][j]) <= 1e-6f * fabsf(ref_m[u][j]) + 1e-12f &&
                         fabsf(mv[j] - ref_v[u][j]) <= 1e-6f * fabsf(ref_v[u][j]) + 1e-15f &&
                         fabsf(loom_load_f32(units[u].params, dt, j) - round_to(dt, mp[j])) == 0.0f &&
                         loom_load_f32(units[u].grads, dt, j) == 0.0f;
                if (!ok && bad++ < 5)
                    CHECK(0, "%s after step %d: unit %d elem %zu master %.9g m %.6g v %.6g param %.9g grad %g; "
                          "want master %.9g m %.6g v %.6g param %.9g grad 0",
                          dname, step, u, j, mp[j], mm[j], mv[j], loom_load_f32(units[u].params, dt, j),
                          loom_load_f32(units[u].grads, dt, j), ref_master[u][j], ref_m[u][j], ref_v[u][j],
                          round_to(dt, ref_master[u][j]));
            }
            free(mp);
            free(mm);
            free(mv);
        }
    }

    /* Checkpoint restore: set_state then get_state gives it back, and the
     * compute-dtype parameters follow. */
    {
        int u = 2;
        float *p = malloc(NUMEL[u] * sizeof(float)), *m = malloc(NUMEL[u] * sizeof(float)),
              *v = malloc(NUMEL[u] * sizeof(float)), *back = malloc(3 * NUMEL[u] * sizeof(float));
        for (size_t j = 0; j < NUMEL[u]; j++) {
            p[j] = 0.001f * (float)j + 0.1234567f;
            m[j] = -0.5f * (float)j;
            v[j] = 0.25f * (float)j;
        }
        OK(P->data_set_state(s, &units[u], p, m, v));
        OK(P->data_get_state(s, &units[u], back, back + NUMEL[u], back + 2 * NUMEL[u]));
        CHECK(!memcmp(back, p, NUMEL[u] * 4) && !memcmp(back + NUMEL[u], m, NUMEL[u] * 4) &&
                  !memcmp(back + 2 * NUMEL[u], v, NUMEL[u] * 4),
              "%s: data_get_state does not give back what data_set_state put", dname);
        for (size_t j = 0; j < NUMEL[u]; j++)
            CHECK(loom_load_f32(units[u].params, dt, j) == round_to(dt, p[j]),
                  "%s: data_set_state did not re-materialise param %zu", dname, j);
        free(p);
        free(m);
        free(v);
        free(back);
    }

    OK(P->destroy(s));
    loom_mem_usage_get(&after);
    for (int p = LOOM_PURPOSE_PARAMS; p <= LOOM_PURPOSE_OPTIMIZER; p++)
        CHECK(after.current[LOOM_TIER_HOST][p] == before.current[LOOM_TIER_HOST][p],
              "%s: %s bytes not freed by destroy", dname, loom_purpose_name((loom_purpose)p));
    for (int u = 0; u < NUNITS; u++) {
        free(init[u]);
        free(ref_master[u]);
        free(ref_m[u]);
        free(ref_v[u]);
        free(ref_grad[u]);
    }
}

/* Rank `straggler` never reports its gradients. */
static int straggle(fixture *fx, int straggler)
{
    const loom_strategy_plugin_v1_t *P = fx->P;
    if (my_rank == straggler) {
        sleep((unsigned)(fx->host->timeout_s * 2 + 1)); /* past the others' timeout */
        _exit(0);
    }
    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_DP,
                                 .compute_dtype = LOOM_F32, .grad_accum = 1};
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        setup.groups[a] = fx->mesh->groups[a];
    loom_strategy *s;
    OK(P->create(fx->host, &setup, &s));
    loom_unit units[NUNITS];
    float *init[NUNITS];
    memset(units, 0, sizeof units);
    for (int u = 0; u < NUNITS; u++) {
        units[u].index = u;
        units[u].name = "unit";
        units[u].numel = NUMEL[u];
        units[u].compute_dtype = LOOM_F32;
        init[u] = calloc(NUMEL[u], sizeof(float));
    }
    OK(P->data_setup(s, units, NUNITS, init));
    for (int u = NUNITS - 1; u >= 0; u--)
        OK(P->data_grads_ready(s, &units[u], 1));
    uint64_t t0 = loom_now_ns();
    int rc = P->data_finish_backward(s);
    double waited = (double)(loom_now_ns() - t0) / 1e9;
    char msg[1024], want[32];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    snprintf(want, sizeof want, "rank %d", straggler);
    printf("[rank %d] data_finish_backward after %.1f s: %s: %s\n", my_rank, waited,
           loom_status_string(rc), msg);
    CHECK(rc == LOOM_ERR_TIMEOUT && strstr(msg, "allreduce") && strstr(msg, want),
          "finish_backward returned %s (%s), want a timeout naming %s", loom_status_string(rc),
          msg, want);
    /* the timeout, then comm-mpi's late_grace_s to name who is missing */
    CHECK(waited < fx->host->timeout_s + 3.5, "finish_backward took %.1f s for a %.1f s timeout",
          waited, fx->host->timeout_s);
    t0 = loom_now_ns();
    P->destroy(s);
    waited = (double)(loom_now_ns() - t0) / 1e9;
    CHECK(waited < 1.0, "destroy after the failure took %.1f s", waited);
    for (int u = 0; u < NUNITS; u++)
        free(init[u]);
    _exit(failures ? 1 : 0); /* the communicator is broken: no orderly shutdown */
}

int main(int argc, char **argv)
{
    const char *overrides[32];
    int n = 0;
    const char *expect_error = NULL;
    int straggler = -1;
    for (int i = 1; i < argc && n < 32; i++) {
        if (!strcmp(argv[i], "--expect-error") && i + 1 < argc)
            expect_error = argv[++i];
        else if (!strcmp(argv[i], "--straggler") && i + 1 < argc)
            straggler = atoi(argv[++i]);
        else
            overrides[n++] = argv[i];
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    fixture fx = {0};
    loom_config *cfg;
    if (loom_config_load(NULL, overrides, n, &cfg) != LOOM_OK ||
        loom_runtime_create(cfg, &fx.rt) != LOOM_OK) {
        fprintf(stderr, "ddp_test: %s\n", loom_last_error());
        return 1;
    }
    my_rank = loom_runtime_env(fx.rt)->rank;
    OK(loom_mesh_create(fx.rt, &fx.mesh));
    const loom_plugin *plugin;
    const char *strategy = "ddp";
    loom_config_string(cfg, "parallel.dp.strategy", &strategy);
    OK(loom_runtime_plugin(fx.rt, LOOM_PLUGIN_STRATEGY, strategy, &plugin));
    fx.P = (const loom_strategy_plugin_v1_t *)plugin->header;
    CHECK(fx.P->axis == LOOM_AXIS_DP, "the ddp plugin serves axis %u", fx.P->axis);

    int rc = loom_runtime_host(fx.rt, plugin, "parallel.dp", &fx.host);
    if (expect_error) {
        /* The error comes from validating the group or from create. */
        if (rc == LOOM_OK) {
            loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_DP};
            for (int a = 0; a < LOOM_AXIS_COUNT; a++)
                setup.groups[a] = fx.mesh->groups[a];
            loom_strategy *s = NULL;
            rc = fx.P->create(fx.host, &setup, &s);
            if (rc == LOOM_OK)
                fx.P->destroy(s);
        }
        int right = rc != LOOM_OK && strstr(loom_last_error(), expect_error);
        printf("ddp_test: %s\n", rc != LOOM_OK ? loom_last_error() : "(no error)");
        loom_mesh_destroy(fx.mesh);
        loom_runtime_destroy(fx.rt);
        loom_config_free(cfg);
        return right ? 0 : 1;
    }
    OK(rc);
    OK(loom_config_bool(cfg, "parallel.dp.overlap", &fx.overlap));
    OK(loom_config_float(cfg, "parallel.dp.bucket_mb", &fx.bucket_mb));
    fx.dp = fx.mesh->groups[LOOM_AXIS_DP];
    fx.dp_rank = fx.mesh->coords[LOOM_AXIS_DP];
    fx.dp_size = fx.mesh->sizes[LOOM_AXIS_DP];
    if (straggler >= 0)
        return straggle(&fx, straggler);

    loom_trace_enable(my_rank);
    static const scenario scenarios[] = {
        {LOOM_F32, 1, 2, 0, 1.0f},
        {LOOM_F32, 2, 2, 0, 0.5f},
        {LOOM_BF16, 2, 2, 0, 1.0f},
        {LOOM_F16, 1, 2, 1, 1.0f},
    };
    int total_buckets = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(scenarios); i++) {
        run(&fx, &scenarios[i]);
        int bucket_of[NUNITS];
        total_buckets += scenarios[i].steps *
                         expected_buckets(fx.bucket_mb, loom_dtype_size(scenarios[i].dtype), bucket_of);
    }

    /* One span per bucket per step on the comm lane. */
    char trace[128];
    snprintf(trace, sizeof trace, "ddp_trace.%d.%d.json", my_rank, (int)getpid());
    OK(loom_trace_write_part(trace));
    int spans = count_occurrences(trace, "\"ddp bucket ");
    CHECK(spans == total_buckets, "%d \"ddp bucket\" spans in the trace, want %d", spans, total_buckets);
    unlink(trace);

    printf("rank %d (dp %d of %d, overlap %s, bucket_mb %g): %s\n", my_rank, fx.dp_rank, fx.dp_size,
           fx.overlap ? "on" : "off", fx.bucket_mb, failures ? "FAILED" : "ok");
    loom_mesh_destroy(fx.mesh);
    loom_runtime_destroy(fx.rt);
    loom_config_free(cfg);
    return failures ? 1 : 0;
}
