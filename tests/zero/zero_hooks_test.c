/* The zero1/zero2/zero3 strategy plugins (and ddp, as the baseline of the
 * formulas) driven through their hooks exactly as the trainer drives them,
 * on fake units, against a serial reference:
 *
 *   zero_hooks_test [path=value ...] [--expect-error TEXT] [--straggler R]
 *
 * The arguments are config overrides (parallel.dp.size=3,
 * parallel.dp.strategy=zero3, parallel.dp.prefetch=2, comm.default=mpi;
 * zero3's parallel.dp.shard_size=S: hybrid sharding, where the formulas
 * take S for N and add the replica all-reduce).
 * With --expect-error, creating the strategy must fail with a message
 * containing TEXT. With --straggler R (zero3), rank R never gets to the
 * forward: the others' first all-gather must time out naming it.
 *
 * Every step checks, per rank:
 *  - the parameters the model sees in forward and backward, and the master
 *    weights and Adam moments after the step, against AdamW run serially on
 *    the average of every rank's gradients;
 *  - the global gradient norm;
 *  - model-state bytes (PARAMS + GRADS + OPTIMIZER, and COMM), the peaks
 *    over the step exactly: the ZeRO formula with the padding, plus what
 *    is in flight (zero2/3 gradients, zero3 gathered units);
 *  - bytes moved on the dp group from the comm layer's counters:
 *    2Ψ(N-1)/N (ddp, zero1, zero2) and 3Ψ(N-1)/N (zero3) per micro-batch;
 *    HSDP 3Ψ(S-1)/S + 2(Ψ/S)(R-1)/R over R = N/S replicas;
 *  - one comm-lane trace span per collective.
 *
 * Fake gradients are small multiples of 1/64, so sums over ranks are exact
 * in every dtype and an average is one rounding of an exact value. */
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

/* Unit 0 is the embedding, the last the head (tied to the embedding).
 * Awkward sizes, so the padding shows at every dp size. */
#define NUNITS 6
static const size_t NUMEL[NUNITS] = {300, 1000, 100, 700, 37, 200};
#define HEAD (NUNITS - 1)
#define ALIGN 32 /* the plugins' shard alignment, in elements */

typedef enum { DDP, ZERO1, ZERO2, ZERO3 } kind;

typedef struct fixture {
    loom_runtime *rt;
    loom_mesh *mesh;
    const loom_strategy_plugin_v1_t *P;
    const loom_host *host;
    loom_group *dp;
    int dp_rank, dp_size;
    int shard_size; /* zero3 under HSDP: the shard groups' size; else dp_size */
    kind kind;
    const char *name;
    int prefetch;
} fixture;

typedef struct scenario {
    loom_dtype dtype;
    int grad_accum;
    int steps;
    int skip_last;   /* the last step is skipped (fp16 overflow): data_zero_grads */
    float grad_scale;
} scenario;

/* ------------------------------------------------------- expectations */

static size_t padded(size_t n, int N) { size_t q = (size_t)ALIGN * (size_t)N; return (n + q - 1) / q * q; }
static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* The trainer's hook steps: forward 0, 1, ..., head (+ the tied
 * embedding); backward head (+ embedding), ..., 1, 0. */
static int fstep_units(int i, int out[2])
{
    out[0] = i;
    out[1] = i == HEAD ? 0 : -1;
    return i == HEAD ? 2 : 1;
}
static int bstep_units(int i, int out[2])
{
    out[0] = HEAD - i;
    out[1] = i == 0 ? 0 : -1;
    return i == 0 ? 2 : 1;
}

/* Elements of the distinct units in steps [i, i + prefetch], plus `also`. */
static size_t window(int (*step_units)(int, int[2]), int i, int prefetch, int also, int N)
{
    int in[NUNITS] = {0};
    if (also >= 0)
        in[also] = 1;
    for (int j = i; j <= i + prefetch && j < NUNITS; j++) {
        int us[2];
        int n = step_units(j, us);
        for (int k = 0; k < n; k++)
            in[us[k]] = 1;
    }
    size_t sum = 0;
    for (int u = 0; u < NUNITS; u++)
        sum += in[u] ? padded(NUMEL[u], N) : 0;
    return sum;
}

/* zero3: the most elements gathered at once. In forward a step and the
 * next `prefetch`; in backward those and the embedding, held from the
 * head's forward until its own gradients go. */
static size_t gathered_peak(int prefetch, int N)
{
    size_t peak = 0;
    for (int i = 0; i < NUNITS; i++) {
        peak = max_z(peak, window(fstep_units, i, prefetch, -1, N));
        peak = max_z(peak, window(bstep_units, i, prefetch, 0, N));
    }
    return peak;
}

/* zero2/3: the most full-gradient elements at once: the embedding's, open
 * from the head's backward on, the unit in backward and the one whose
 * reduce-scatter is in flight. */
static size_t grads_in_flight_peak(int N)
{
    size_t e = padded(NUMEL[0], N);
    size_t peak = e + padded(NUMEL[HEAD], N);
    for (int u = HEAD; u > 1; u--)
        peak = max_z(peak, e + padded(NUMEL[u], N) + padded(NUMEL[u - 1], N));
    return peak;
}

/* ----------------------------------------------------------- scenario */

static uint64_t span_count;

static void counters(loom_group *g, loom_comm_counters *c) { loom_group_counters(g, c); }

static uint64_t diff(const loom_comm_counters *a, const loom_comm_counters *b, int op, int calls)
{
    return calls ? b->calls[op] - a->calls[op] : b->bytes[op] - a->bytes[op];
}

static void run(fixture *fx, const scenario *sc)
{
    const loom_strategy_plugin_v1_t *P = fx->P;
    loom_dtype dt = sc->dtype;
    size_t e = loom_dtype_size(dt);
    const char *dname = loom_dtype_name(dt);
    /* S: the ranks a unit is sharded over; R: the replicas of each shard */
    int N = fx->dp_size, S = fx->shard_size, R = N / S, K = sc->grad_accum;
    kind kd = fx->kind;

    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_DP};
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        setup.sizes[a] = fx->mesh->sizes[a];
        setup.coords[a] = fx->mesh->coords[a];
        setup.groups[a] = fx->mesh->groups[a];
    }
    setup.layers = NUNITS - 2;
    setup.micro_batch = 2;
    setup.seq = 8;
    setup.micro_batches = K;
    setup.compute_dtype = dt;

    loom_strategy *s;
    OK(P->create(fx->host, &setup, &s));

    loom_unit units[NUNITS];
    float *init[NUNITS], *ref_master[NUNITS], *ref_m[NUNITS], *ref_v[NUNITS], *ref_grad[NUNITS];
    size_t psi = 0, psi_pad = 0, shard = 0, max_shard = 0;
    memset(units, 0, sizeof units);
    for (int u = 0; u < NUNITS; u++) {
        units[u].index = u;
        units[u].kind = u == 0 ? LOOM_UNIT_EMBEDDING : u == HEAD ? LOOM_UNIT_HEAD : LOOM_UNIT_BLOCK;
        units[u].name = u == 0 ? "embedding" : u == HEAD ? "head" : "block";
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
        psi_pad += padded(NUMEL[u], S);
        shard += padded(NUMEL[u], S) / (size_t)S;
        max_shard = max_z(max_shard, padded(NUMEL[u], S) / (size_t)S);
    }

    /* Model-state bytes by purpose: at rest, and the peaks of a step. w: the
     * fp32 master weights' 4 bytes of a 16-bit run (fp32 runs step the
     * parameters themselves). */
    uint64_t w = dt == LOOM_F32 ? 0 : 4;
    uint64_t rest[LOOM_PURPOSE_COUNT] = {0}, peak[LOOM_PURPOSE_COUNT] = {0};
    const char *formula = "";
    switch (kd) {
    case DDP:
        rest[LOOM_PURPOSE_PARAMS] = e * psi;
        rest[LOOM_PURPOSE_GRADS] = e * psi;
        rest[LOOM_PURPOSE_OPTIMIZER] = (w + 8) * psi;
        formula = "16Ψ";
        break;
    case ZERO1:
        rest[LOOM_PURPOSE_PARAMS] = e * psi_pad;
        rest[LOOM_PURPOSE_GRADS] = e * psi_pad;
        rest[LOOM_PURPOSE_OPTIMIZER] = (w + 8) * shard;
        rest[LOOM_PURPOSE_COMM] = e * shard;
        formula = dt == LOOM_F32 ? "8Ψ + 8Ψ/N" : "4Ψ + 12Ψ/N";
        break;
    case ZERO2:
        rest[LOOM_PURPOSE_PARAMS] = e * psi_pad;
        rest[LOOM_PURPOSE_GRADS] = e * shard;
        rest[LOOM_PURPOSE_OPTIMIZER] = (w + 8) * shard;
        rest[LOOM_PURPOSE_COMM] = e * max_shard;
        formula = dt == LOOM_F32 ? "4Ψ + 12Ψ/N" : "2Ψ + 14Ψ/N";
        break;
    case ZERO3:
        rest[LOOM_PURPOSE_PARAMS] = e * shard;
        rest[LOOM_PURPOSE_GRADS] = e * shard;
        rest[LOOM_PURPOSE_OPTIMIZER] = (w + 8) * shard;
        rest[LOOM_PURPOSE_COMM] = e * max_shard;
        formula = "16Ψ/N";
        break;
    }
    memcpy(peak, rest, sizeof peak);
    if (kd == ZERO2 || kd == ZERO3)
        peak[LOOM_PURPOSE_GRADS] += e * grads_in_flight_peak(S);
    if (kd == ZERO3)
        peak[LOOM_PURPOSE_PARAMS] += e * gathered_peak(fx->prefetch, S);
    uint64_t model_state = rest[0] + rest[1] + rest[2];
    /* The formula itself, per padded parameter (ddp does not pad). */
    double per_param = (double)model_state / (double)(kd == DDP ? psi : psi_pad);
    double want_per_param = kd == DDP     ? 16.0
                            : kd == ZERO1 ? 2.0 * e + (w + 8.0) / S
                            : kd == ZERO2 ? e + (e + w + 8.0) / S
                                          : (2.0 * e + w + 8.0) / S;
    CHECK(fabs(per_param - want_per_param) < 1e-9, "%s: %.4f bytes per parameter, want %.4f", dname,
          per_param, want_per_param);

    loom_mem_usage before, after;
    loom_mem_usage_get(&before);
    OK(P->data_setup(s, units, NUNITS, init));
    loom_mem_usage_get(&after);
    for (int p = LOOM_PURPOSE_PARAMS; p <= LOOM_PURPOSE_COMM; p++) {
        uint64_t got = after.current[LOOM_TIER_HOST][p] - before.current[LOOM_TIER_HOST][p];
        CHECK(got == rest[p], "%s %s: %llu %s bytes after data_setup, want %llu", fx->name, dname,
              (unsigned long long)got, loom_purpose_name((loom_purpose)p),
              (unsigned long long)rest[p]);
    }
    if (fx->dp_rank == 0 && my_rank == 0)
        printf("%s %s N=%d S=%d: Ψ %zu padded to %zu; model state %s = %llu bytes per rank "
               "(params %llu, grads %llu, optimizer %llu); step peaks params %llu grads %llu comm %llu\n",
               fx->name, dname, N, S, psi, psi_pad, formula, (unsigned long long)model_state,
               (unsigned long long)rest[0], (unsigned long long)rest[1], (unsigned long long)rest[2],
               (unsigned long long)peak[0], (unsigned long long)peak[1],
               (unsigned long long)peak[LOOM_PURPOSE_COMM]);

    /* Placement at rest: zero3 keeps no full parameters; the others do. */
    for (int u = 0; u < NUNITS; u++) {
        if (kd == ZERO3) {
            CHECK(!units[u].params, "%s: unit %d has full parameters at rest", dname, u);
            continue;
        }
        CHECK(units[u].params, "%s: unit %d has no parameters", dname, u);
        for (size_t j = 0; units[u].params && j < NUMEL[u]; j++)
            CHECK(loom_load_f32(units[u].params, dt, j) == round_to(dt, init[u][j]),
                  "%s: unit %d param %zu = %g, want %g", dname, u, j, loom_load_f32(units[u].params, dt, j),
                  round_to(dt, init[u][j]));
        if (kd == ZERO2)
            CHECK(!units[u].grads, "%s: zero2 unit %d has full gradients at rest", dname, u);
    }

    char desc[256];
    OK(P->describe(s, desc, sizeof desc));
    char want_desc[64];
    snprintf(want_desc, sizeof want_desc, "%s over %d rank", fx->name, N);
    CHECK(strstr(desc, want_desc), "describe says \"%s\", want \"%s...\"", desc, want_desc);
    snprintf(want_desc, sizeof want_desc, "shard groups of %d (HSDP: %d replicas)", S, R);
    CHECK((R > 1) == (strstr(desc, want_desc) != NULL), "describe says \"%s\" at %d replicas",
          desc, R);

    loom_optimizer_step opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .weight_decay = 0.01f, .grad_scale = sc->grad_scale, .update = adamw,
                               .update_range = adamw_range};
    for (int step = 1; step <= sc->steps; step++) {
        loom_comm_counters c0, c1, c2, c3;
        counters(fx->dp, &c0);
        loom_mem_usage_reset_peak();
        for (int micro = 0; micro < K; micro++) {
            int last = micro == K - 1;
            /* Forward, as the trainer: the head brackets the embedding too. */
            for (int u = 0; u < NUNITS; u++) {
                int both[2] = {u, 0}, nb = u == HEAD ? 2 : 1;
                for (int k = 0; k < nb; k++)
                    if (P->data_before_forward)
                        OK(P->data_before_forward(s, &units[both[k]]));
                for (int k = 0; k < nb; k++) {
                    int v = both[k], bad = 0;
                    CHECK(units[v].params, "%s step %d: unit %d has no parameters in forward", dname, step, v);
                    for (size_t j = 0; units[v].params && j < NUMEL[v]; j++)
                        if (loom_load_f32(units[v].params, dt, j) != round_to(dt, ref_master[v][j]) && bad++ < 3)
                            CHECK(0, "%s step %d forward: unit %d param %zu = %.9g, want %.9g", dname,
                                  step, v, j, loom_load_f32(units[v].params, dt, j), round_to(dt, ref_master[v][j]));
                }
                for (int k = 0; k < nb; k++)
                    if (P->data_after_forward)
                        OK(P->data_after_forward(s, &units[both[k]]));
                if (kd == ZERO3 && u != 0 && u != HEAD)
                    CHECK(!units[u].params, "%s: zero3 kept block %d gathered after its forward", dname, u);
            }
            /* Backward, last unit first; the head also writes the tied
             * embedding's gradient, so the embedding reports last. */
            for (int u = HEAD; u >= 0; u--) {
                int was_open = u == 0 && units[0].grads != NULL;
                OK(P->data_before_backward(s, &units[u]));
                if (u == HEAD)
                    OK(P->data_before_backward(s, &units[0]));
                int both[2] = {u, 0}, nb = u == HEAD ? 2 : 1;
                for (int k = 0; k < nb; k++) {
                    int v = both[k], bad = 0;
                    CHECK(units[v].params && units[v].grads, "%s step %d: unit %d not materialised for backward",
                          dname, step, v);
                    if (!units[v].params || !units[v].grads)
                        exit(1);
                    for (size_t j = 0; j < NUMEL[v]; j++) {
                        int ok = loom_load_f32(units[v].params, dt, j) == round_to(dt, ref_master[v][j]);
                        /* zero2/3 open a zeroed buffer per micro-batch */
                        if ((kd == ZERO2 || kd == ZERO3) && !(v == 0 && (u == 0 || was_open)))
                            ok = ok && loom_load_f32(units[v].grads, dt, j) == 0.0f;
                        if (!ok && bad++ < 3)
                            CHECK(0, "%s step %d backward: unit %d elem %zu param %.9g grad %g", dname,
                                  step, v, j, loom_load_f32(units[v].params, dt, j), loom_load_f32(units[v].grads, dt, j));
                    }
                }
                for (size_t j = 0; j < NUMEL[u]; j++) {
                    float g = (float)(kval(fx->dp_rank, step, micro, u, j, 1) +
                                      (u ? kval(fx->dp_rank, step, micro, u, j, 0) : 0)) / 64.0f;
                    loom_store_f32(units[u].grads, dt, j, loom_load_f32(units[u].grads, dt, j) + g);
                }
                if (u == HEAD)
                    for (size_t j = 0; j < NUMEL[0]; j++) {
                        float g = (float)kval(fx->dp_rank, step, micro, 0, j, 0) / 64.0f;
                        loom_store_f32(units[0].grads, dt, j, loom_load_f32(units[0].grads, dt, j) + g);
                    }
                OK(P->data_grads_ready(s, &units[u], last));
                if (kd == ZERO3 && u != 0)
                    CHECK(!units[u].params, "%s: zero3 kept unit %d gathered after its backward", dname, u);
            }
            if (!last) /* a trainer may tell the strategy after every micro-batch */
                OK(P->data_finish_backward(s));
        }
        double early;
        CHECK(P->data_grad_norm_sq(s, &early) == LOOM_ERR_INVALID &&
                  strstr(loom_last_error(), "data_finish_backward"),
              "%s: data_grad_norm_sq before data_finish_backward must fail (got \"%s\")", dname,
              loom_last_error());
        loom_clear_error();
        OK(P->data_finish_backward(s));
        counters(fx->dp, &c1);

        /* The serial reference: zero2/3 reduce every micro-batch and add the
         * averages into the shard in the compute dtype; the others average
         * the accumulated gradient once. */
        double norm_ref = 0.0;
        for (int u = 0; u < NUNITS; u++)
            for (size_t j = 0; j < NUMEL[u]; j++) {
                float acc = 0.0f;
                int total = 0;
                for (int micro = 0; micro < K; micro++) {
                    int sum = 0;
                    for (int r = 0; r < N; r++)
                        sum += kval(r, step, micro, u, j, 0) + kval(r, step, micro, u, j, 1);
                    total += sum;
                    acc = round_to(dt, acc + round_to(dt, ((float)sum / 64.0f) / (float)N));
                }
                ref_grad[u][j] = kd == ZERO2 || kd == ZERO3 ? acc
                                                           : round_to(dt, ((float)total / 64.0f) / (float)N);
                norm_ref += (double)ref_grad[u][j] * ref_grad[u][j];
            }
        double norm;
        OK(P->data_grad_norm_sq(s, &norm));
        counters(fx->dp, &c2);
        CHECK(fabs(norm - norm_ref) <= 2.5 * ulp_of(dt) * norm_ref, "%s step %d: grad_norm_sq %.12g, want %.12g",
              dname, step, norm, norm_ref);

        int skipped = sc->skip_last && step == sc->steps;
        size_t stepped_elems = 0;
        if (skipped) {
            OK(P->data_zero_grads(s));
        } else {
            opt.step++;
            update_calls = 0;
            update_elems = 0;
            OK(P->data_optimizer_step(s, &opt));
            stepped_elems = update_elems;
            CHECK(update_ranges_outside == 0, "%s: %d update ranges outside their unit", dname,
                  update_ranges_outside);
            for (int u = 0; u < NUNITS; u++)
                adamw(&opt, ref_master[u], ref_grad[u], LOOM_F32, ref_m[u], ref_v[u], NUMEL[u]);
        }
        counters(fx->dp, &c3);

        /* Memory: the step's peaks, exactly. */
        loom_mem_usage u;
        loom_mem_usage_get(&u);
        for (int p = LOOM_PURPOSE_PARAMS; p <= LOOM_PURPOSE_COMM; p++) {
            uint64_t got = u.peak[LOOM_TIER_HOST][p] - before.current[LOOM_TIER_HOST][p];
            CHECK(got == peak[p], "%s %s step %d: peak %s %llu bytes, want %llu", fx->name, dname,
                  step, loom_purpose_name((loom_purpose)p), (unsigned long long)got,
                  (unsigned long long)peak[p]);
        }

        /* Communication: the step's collectives (the norm's one f64
         * all-reduce aside), in payload bytes as the counters keep them,
         * then as a ring moves them. HSDP's shard and replica groups count
         * on the dp group; its all-reduces are the replicas'. */
        uint64_t ar = diff(&c0, &c1, LOOM_OP_ALLREDUCE, 0) + diff(&c2, &c3, LOOM_OP_ALLREDUCE, 0);
        uint64_t ag = diff(&c0, &c1, LOOM_OP_ALLGATHER, 0) + diff(&c2, &c3, LOOM_OP_ALLGATHER, 0);
        uint64_t rs = diff(&c0, &c1, LOOM_OP_REDUCESCATTER, 0) + diff(&c2, &c3, LOOM_OP_REDUCESCATTER, 0);
        uint64_t norm_calls = diff(&c1, &c2, LOOM_OP_ALLREDUCE, 1);
        uint64_t want_ar = 0, want_ag = 0, want_rs = 0;
        int ag_per_step = skipped ? 0 : 1;
        switch (kd) {
        case DDP: want_ar = e * psi; break;
        case ZERO1: want_rs = e * psi_pad; want_ag = (uint64_t)ag_per_step * e * psi_pad; break;
        case ZERO2: want_rs = (uint64_t)K * e * psi_pad; want_ag = (uint64_t)ag_per_step * e * psi_pad; break;
        case ZERO3:
            want_rs = (uint64_t)K * e * psi_pad;
            want_ag = 2u * (uint64_t)K * e * psi_pad;
            want_ar = R > 1 ? (uint64_t)K * e * shard : 0;
            break;
        }
        CHECK(ar == want_ar && ag == want_ag && rs == want_rs,
              "%s %s step %d: allreduce %llu allgather %llu reducescatter %llu payload bytes, want %llu %llu %llu",
              fx->name, dname, step, (unsigned long long)ar, (unsigned long long)ag,
              (unsigned long long)rs, (unsigned long long)want_ar, (unsigned long long)want_ag,
              (unsigned long long)want_rs);
        CHECK(norm_calls == (kd == DDP ? 0u : 1u), "%s: %llu all-reduces for the norm", fx->name,
              (unsigned long long)norm_calls);
        double moved = kd == DDP ? 2.0 * (double)ar * (N - 1) / N
                                 : ((double)ag + (double)rs) * (S - 1) / S + 2.0 * (double)ar * (R - 1) / R;
        double times = kd == ZERO3 ? 3.0 * K : kd == DDP || kd == ZERO1 ? 2.0 : K + 1.0;
        double want_moved = times * (double)e * (double)(kd == DDP ? psi : psi_pad) * (S - 1) / S +
                            2.0 * K * (double)e * (double)shard * (R - 1) / R;
        if (!skipped)
            CHECK(fabs(moved - want_moved) < 1e-6, "%s: moved %.1f bytes, want %.1f", fx->name, moved,
                  want_moved);
        if (!skipped && step == 1 && fx->dp_rank == 0 && my_rank == 0)
            printf("%s %s N=%d, %d micro-batch%s: %.0f bytes moved per rank = %g x Ψ(N-1)/N%s x %zu "
                   "bytes\n",
                   fx->name, dname, N, K, K == 1 ? "" : "es", moved, times,
                   R > 1 ? " with N = S, + 2K x (Ψ/S)(R-1)/R" : "", e);
        span_count += kd == DDP ? 0 : (uint64_t)(want_ag + want_rs) / (e * psi_pad) * NUNITS;

        /* The shards' updates cover the model once over the dp group. */
        if (!skipped) {
            int64_t elems = (int64_t)stepped_elems, sum = 0;
            loom_request *req = NULL;
            OK(loom_core_comm_api.allreduce(fx->dp, &elems, &sum, 1, LOOM_I64, LOOM_SUM, &req));
            OK(loom_core_comm_api.wait(req));
            /* ddp steps the whole model on every rank, HSDP in every replica */
            int64_t want = (int64_t)psi * (kd == DDP ? N : R);
            CHECK(sum == want, "%s: updates over the dp group cover %lld elements, want %lld", dname,
                  (long long)sum, (long long)want);
        }

        /* Master weights and moments as the reference; parameters their
         * rounding (zero3: sharded at rest, nothing full). */
        int bad = 0;
        for (int v = 0; v < NUNITS; v++) {
            float *mp = malloc(NUMEL[v] * sizeof(float)), *mm = malloc(NUMEL[v] * sizeof(float)),
                  *mv = malloc(NUMEL[v] * sizeof(float));
            OK(P->data_get_state(s, &units[v], mp, mm, mv));
            if (kd == ZERO3)
                CHECK(!units[v].params && !units[v].grads, "%s: zero3 unit %d full after the step", dname, v);
            if (kd == ZERO2)
                CHECK(!units[v].grads, "%s: zero2 unit %d has full gradients after the step", dname, v);
            for (size_t j = 0; j < NUMEL[v]; j++) {
                int ok = fabsf(mp[j] - ref_master[v][j]) <= 1e-6f * fabsf(ref_master[v][j]) + 1e-9f &&
                         fabsf(mm[j] - ref_m[v][j]) <= 1e-6f * fabsf(ref_m[v][j]) + 1e-12f &&
                         fabsf(mv[j] - ref_v[v][j]) <= 1e-6f * fabsf(ref_v[v][j]) + 1e-15f;
                if (kd != ZERO3)
                    ok = ok && loom_load_f32(units[v].params, dt, j) == round_to(dt, mp[j]);
                if (kd == DDP || kd == ZERO1)
                    ok = ok && loom_load_f32(units[v].grads, dt, j) == 0.0f;
                if (!ok && bad++ < 5)
                    CHECK(0, "%s %s after step %d: unit %d elem %zu master %.9g m %.6g v %.6g; want %.9g %.6g %.6g",
                          fx->name, dname, step, v, j, mp[j], mm[j], mv[j], ref_master[v][j], ref_m[v][j],
                          ref_v[v][j]);
            }
            free(mp);
            free(mm);
            free(mv);
        }
    }

    /* Checkpoint restore: set_state then get_state gives it back, and the
     * parameters the model sees follow. */
    {
        int v = 2;
        float *p = malloc(NUMEL[v] * sizeof(float)), *m = malloc(NUMEL[v] * sizeof(float)),
              *vv = malloc(NUMEL[v] * sizeof(float)), *back = malloc(3 * NUMEL[v] * sizeof(float));
        for (size_t j = 0; j < NUMEL[v]; j++) {
            p[j] = 0.001f * (float)j + 0.1234567f;
            m[j] = -0.5f * (float)j;
            vv[j] = 0.25f * (float)j;
        }
        OK(P->data_set_state(s, &units[v], p, m, vv));
        OK(P->data_get_state(s, &units[v], back, back + NUMEL[v], back + 2 * NUMEL[v]));
        CHECK(!memcmp(back, p, NUMEL[v] * 4) && !memcmp(back + NUMEL[v], m, NUMEL[v] * 4) &&
                  !memcmp(back + 2 * NUMEL[v], vv, NUMEL[v] * 4),
              "%s: data_get_state does not give back what data_set_state put", dname);
        if (P->data_before_forward)
            OK(P->data_before_forward(s, &units[v]));
        for (size_t j = 0; j < NUMEL[v]; j++)
            CHECK(loom_load_f32(units[v].params, dt, j) == round_to(dt, p[j]),
                  "%s: data_set_state did not re-materialise param %zu", dname, j);
        if (P->data_after_forward)
            OK(P->data_after_forward(s, &units[v]));
        OK(P->data_zero_grads(s));
        if (kd == ZERO3) { /* that forward's gather, and its prefetches */
            int in[NUNITS] = {0};
            for (int j = v; j <= v + fx->prefetch && j < NUNITS; j++) {
                int us[2];
                for (int k = 0, nu = fstep_units(j, us); k < nu; k++)
                    in[us[k]] = 1;
            }
            for (int k = 0; k < NUNITS; k++)
                span_count += (uint64_t)in[k];
        }
        free(p);
        free(m);
        free(vv);
        free(back);
    }

    OK(P->destroy(s));
    loom_mem_usage_get(&after);
    for (int p = LOOM_PURPOSE_PARAMS; p <= LOOM_PURPOSE_COMM; p++)
        CHECK(after.current[LOOM_TIER_HOST][p] == before.current[LOOM_TIER_HOST][p],
              "%s: %s bytes not freed by destroy", dname, loom_purpose_name((loom_purpose)p));
    for (int v = 0; v < NUNITS; v++) {
        free(init[v]);
        free(ref_master[v]);
        free(ref_m[v]);
        free(ref_v[v]);
        free(ref_grad[v]);
    }
}

/* zero3: rank `straggler` never gets to the forward. */
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
        units[u].kind = u == 0 ? LOOM_UNIT_EMBEDDING : u == HEAD ? LOOM_UNIT_HEAD : LOOM_UNIT_BLOCK;
        units[u].name = "unit";
        units[u].numel = NUMEL[u];
        units[u].compute_dtype = LOOM_F32;
        init[u] = calloc(NUMEL[u], sizeof(float));
    }
    OK(P->data_setup(s, units, NUNITS, init));
    uint64_t t0 = loom_now_ns();
    int rc = P->data_before_forward(s, &units[0]);
    double waited = (double)(loom_now_ns() - t0) / 1e9;
    char msg[1024], want[32];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    snprintf(want, sizeof want, "rank %d", straggler);
    printf("[rank %d] data_before_forward after %.1f s: %s: %s\n", my_rank, waited,
           loom_status_string(rc), msg);
    CHECK(rc == LOOM_ERR_TIMEOUT && strstr(msg, "allgather") && strstr(msg, want),
          "before_forward returned %s (%s), want a timeout naming %s", loom_status_string(rc), msg,
          want);
    CHECK(waited < fx->host->timeout_s + 3.5, "before_forward took %.1f s for a %.1f s timeout",
          waited, fx->host->timeout_s);
    /* Every later hook refuses at once instead of waiting again. */
    rc = P->data_before_forward(s, &units[1]);
    CHECK(rc != LOOM_OK && strstr(loom_last_error(), "earlier collective"),
          "a hook after the failure returned %s: %s", loom_status_string(rc), loom_last_error());
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
        fprintf(stderr, "zero_hooks_test: %s\n", loom_last_error());
        return 1;
    }
    my_rank = loom_runtime_env(fx.rt)->rank;
    OK(loom_mesh_create(fx.rt, &fx.mesh));
    const loom_plugin *plugin;
    fx.name = "zero3";
    loom_config_string(cfg, "parallel.dp.strategy", &fx.name);
    fx.kind = !strcmp(fx.name, "ddp") ? DDP : !strcmp(fx.name, "zero1") ? ZERO1
              : !strcmp(fx.name, "zero2") ? ZERO2 : ZERO3;
    OK(loom_runtime_plugin(fx.rt, LOOM_PLUGIN_STRATEGY, fx.name, &plugin));
    fx.P = (const loom_strategy_plugin_v1_t *)plugin->header;
    CHECK(fx.P->axis == LOOM_AXIS_DP, "the %s plugin serves axis %u", fx.name, fx.P->axis);

    int rc = loom_runtime_host(fx.rt, plugin, "parallel.dp", &fx.host);
    if (expect_error) {
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
        printf("zero_hooks_test: %s\n", rc != LOOM_OK ? loom_last_error() : "(no error)");
        loom_mesh_destroy(fx.mesh);
        loom_runtime_destroy(fx.rt);
        loom_config_free(cfg);
        return right ? 0 : 1;
    }
    OK(rc);
    if (fx.kind == ZERO3) {
        int64_t prefetch = 0;
        OK(loom_config_int(cfg, "parallel.dp.prefetch", &prefetch));
        fx.prefetch = (int)prefetch;
    }
    fx.dp = fx.mesh->groups[LOOM_AXIS_DP];
    fx.dp_rank = fx.mesh->coords[LOOM_AXIS_DP];
    fx.dp_size = fx.shard_size = fx.mesh->sizes[LOOM_AXIS_DP];
    if (fx.kind == ZERO3) {
        int64_t shard_size = 0;
        OK(loom_config_int(cfg, "parallel.dp.shard_size", &shard_size));
        if (shard_size > 0)
            fx.shard_size = (int)shard_size;
    }
    if (straggler >= 0)
        return straggle(&fx, straggler);

    loom_trace_enable(my_rank);
    static const scenario scenarios[] = {
        {LOOM_F32, 1, 2, 0, 1.0f},
        {LOOM_F32, 2, 2, 0, 0.5f},
        {LOOM_BF16, 2, 2, 0, 1.0f},
        {LOOM_F16, 1, 2, 1, 1.0f},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(scenarios); i++)
        run(&fx, &scenarios[i]);

    /* One comm-lane span per collective the strategy posted. */
    if (fx.kind != DDP) {
        char trace[128], ag[32], rs[32];
        snprintf(trace, sizeof trace, "zero_trace.%d.%d.json", my_rank, (int)getpid());
        snprintf(ag, sizeof ag, "\"%s allgather ", fx.name);
        snprintf(rs, sizeof rs, "\"%s reducescatter ", fx.name);
        OK(loom_trace_write_part(trace));
        int spans = count_occurrences(trace, ag) + count_occurrences(trace, rs);
        int blocks = count_occurrences(trace, "allgather block 3\"");
        CHECK(spans == (int)span_count, "%d \"%s allgather/reducescatter\" spans in the trace, want %llu",
              spans, fx.name, (unsigned long long)span_count);
        CHECK(blocks > 0, "no span names block 3");
        unlink(trace);
    }

    printf("rank %d (dp %d of %d, %s%s): %s\n", my_rank, fx.dp_rank, fx.dp_size, fx.name,
           fx.kind == ZERO3 ? (fx.prefetch ? ", prefetch on" : ", prefetch 0") : "",
           failures ? "FAILED" : "ok");
    loom_mesh_destroy(fx.mesh);
    loom_runtime_destroy(fx.rt);
    loom_config_free(cfg);
    return failures ? 1 : 0;
}
