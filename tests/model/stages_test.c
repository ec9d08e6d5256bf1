/* The model as pipeline stages (issue #7), in each storage mode (fp32 in
 * place, bf16, fp32 with recomputation), against the whole model run one
 * micro-batch at a time:
 *   stages  two stage models fed through the border stream and stream
 *           gradient give the whole model's loss and gradients, bit for bit
 *   slots   two micro-batches alive at once in two slots give the
 *           gradients of the same two run one after the other, bit for bit;
 *           ACTIVATIONS = shared + k slots, exactly
 *   split   backward_input then backward_weight (unit by unit, all inputs
 *           first, and interleaved over two slots) equals backward, bit
 *           for bit; each input part holds exactly its deferred bytes
 *   memory  a stage's ACTIVATIONS are exactly what its units need, from the
 *           tensor shapes, and less than the whole model's */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/formats.h"
#include "model/kernels.h"
#include "model/model.h"
#include "runtime/log.h"
#include "runtime/memory.h"

static int failures;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += !ok;
}

static const loom_gpt2_shape shape = {8, 30, 2, 2, 16, 32}; /* maxT V L NH C Vp */
enum { B = 2, T = 7, N = B * T, L = 2, NUNITS = L + 2, C = 16, NH = 2, VP = 32 };

typedef struct mode {
    const char *name;
    loom_dtype dtype;
    int recompute;
} mode;
static const mode modes[] = {{"fp32", LOOM_F32, 0}, {"bf16", LOOM_BF16, 0},
                             {"fp32-recompute", LOOM_F32, 1}};

typedef struct fixture {
    loom_model *m;
    loom_unit *units;
    int nunits;
    loom_dtype dtype;
} fixture;

static float *llmc;
static int tokens[2][N], targets[2][N];

static uint64_t activations(void)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    return u.current[LOOM_TIER_HOST][LOOM_PURPOSE_ACTIVATIONS];
}

static uint64_t activations_peak(void)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    return u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_ACTIVATIONS];
}

/* runs: the units this model computes (NULL: all); every unit gets its own
 * parameters (the same values) and zero gradients. */
static void setup(fixture *f, const mode *md, const unsigned char *runs)
{
    loom_model_setup s;
    memset(&s, 0, sizeof s);
    s.shape = shape;
    s.batch = B;
    s.seq = T;
    s.dtype = md->dtype;
    s.recompute = md->recompute;
    loom_model_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.tp_size = 1;
    lay.runs_unit = runs;
    if (loom_model_create_parallel(&s, &lay, &f->m) != LOOM_OK) {
        fprintf(stderr, "model: %s\n", loom_last_error());
        exit(1);
    }
    f->dtype = md->dtype;
    f->units = loom_model_units(f->m, &f->nunits);
    float *p32[NUNITS];
    for (int i = 0; i < f->nunits; i++) {
        size_t n = f->units[i].numel, es = loom_dtype_size(md->dtype);
        p32[i] = malloc(n * 4);
        f->units[i].params = malloc(n * es);
        f->units[i].grads = calloc(n, es);
    }
    loom_model_split_params(f->m, llmc, p32);
    for (int i = 0; i < f->nunits; i++) {
        loom_convert(f->units[i].params, md->dtype, p32[i], LOOM_F32, f->units[i].numel);
        free(p32[i]);
    }
}

static void teardown(fixture *f)
{
    for (int i = 0; i < f->nunits; i++) {
        free(f->units[i].params);
        free(f->units[i].grads);
    }
    loom_model_destroy(f->m);
}

static void must(int rc, const char *what)
{
    if (rc != LOOM_OK) {
        fprintf(stderr, "%s: %s\n", what, loom_last_error());
        exit(1);
    }
}

static float forward(fixture *f, int first, int last, int mb)
{
    float loss = 0;
    for (int u = first; u <= last; u++)
        must(loom_model_forward(f->m, u, tokens[mb], targets[mb], &loss), "forward");
    return loss;
}

static const float dloss = 1.0f / N;

static void backward(fixture *f, int last, int first)
{
    for (int u = last; u >= first; u--)
        must(loom_model_backward(f->m, u, dloss), "backward");
}

static size_t grad_bytes(const fixture *f, int u)
{
    return f->units[u].numel * loom_dtype_size(f->dtype);
}

static int same_grads(const fixture *a, const fixture *b, int first, int last)
{
    int same = 1;
    for (int u = first; u <= last; u++)
        same &= !memcmp(a->units[u].grads, b->units[u].grads, grad_bytes(a, u));
    return same;
}

/* ---- what the units need, from the tensor shapes (model.h's rules) ---- */

static size_t r64(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* One slot: the streams entering the units this model runs or feeds, then
 * each unit's saved tensors (every buffer rounded up to 64 bytes). */
static size_t expected_slot(const mode *md, const unsigned char *runs)
{
    size_t R = N, RC = R * C, NC = (size_t)N * C, NF = 4 * NC, lse = (size_t)B * NH * T;
    size_t es = loom_dtype_size(md->dtype);
    int inplace = md->dtype == LOOM_F32 && !md->recompute;
    size_t bytes = 0;
    for (int u = 1; u <= L + 1; u++)
        if (runs[u] || runs[u - 1])
            bytes += r64(RC * (inplace ? 4 : es));
    size_t stats = 4 * r64(R * 4) + r64(lse * 4);
    for (int u = 1; u <= L; u++) {
        if (!runs[u])
            continue;
        if (inplace) /* ln1 res2 ln2; q k v atty; fch fch_gelu; statistics */
            bytes += 3 * r64(RC * 4) + 4 * r64(NC * 4) + 2 * r64(NF * 4) + stats;
        else if (!md->recompute)
            bytes += 3 * r64(RC * es) + 4 * r64(NC * es) + 2 * r64(NF * es) + stats;
    }
    if (runs[0])
        bytes += r64(N * sizeof(int));
    if (runs[L + 1]) /* lnf, its statistics, logits (then their gradient), lse, losses, targets */
        bytes += r64(RC * 4) + 2 * r64(R * 4) + r64((size_t)N * VP * 4) + 2 * r64(N * 4) +
                 r64(N * sizeof(int));
    return bytes;
}

/* What all slots share (exact bytes, one allocation each). */
static size_t expected_shared(const mode *md, const unsigned char *runs)
{
    size_t R = N, RC = R * C, NC = (size_t)N * C, NF = 4 * NC, lse = (size_t)B * NH * T;
    int blocks = 0;
    for (int u = 1; u <= L; u++)
        blocks |= runs[u];
    size_t bytes = 4 * (RC + 2 * NC); /* dresid, dtmp_a, dtmp_b */
    if (blocks)
        bytes += 4 * (NF + NF); /* dwide_a (max of 3C and 4C wide), dwide_b */
    if (runs[L + 1])
        bytes += 4 * (size_t)N; /* dlosses (the logits live in the slot) */
    if (!(md->dtype == LOOM_F32 && !md->recompute)) {
        if (blocks) /* the fp32 scratch set a block borrows, with its input */
            bytes += 4 * (4 * RC + 4 * NC + 2 * NF + 4 * R + lse);
        if (blocks || runs[0])
            bytes += 4 * RC; /* its output */
    }
    return bytes;
}

static size_t expected_deferred(const mode *md, int unit)
{
    size_t R = N, RC = R * C, NC = (size_t)N * C, NF = 4 * NC;
    if (unit == 0 || unit == L + 1)
        return r64(RC * 4);
    size_t bytes = 2 * r64(NC * 4) + r64(NF * 4) + 2 * r64(RC * 4) + r64(3 * NC * 4);
    if (md->recompute)
        bytes += 3 * r64(RC * 4) + r64(NC * 4) + r64(NF * 4) + 4 * r64(R * 4);
    return bytes;
}

/* ---- stages ---- */

/* Whole model against stages 0..k and k+1..L+1. */
static void test_stages(const mode *md, int k)
{
    unsigned char all[NUNITS], first[NUNITS], second[NUNITS];
    for (int u = 0; u < NUNITS; u++) {
        all[u] = 1;
        first[u] = u <= k;
        second[u] = u > k;
    }
    fixture w, a, b;
    setup(&w, md, all);
    setup(&a, md, first);
    setup(&b, md, second);
    float lw = forward(&w, 0, L + 1, 0);
    backward(&w, L + 1, 0);

    forward(&a, 0, k, 0);
    size_t count, count_b;
    loom_dtype dtype, dtype_b;
    const void *out = loom_model_stream(a.m, k + 1, &count, &dtype);
    void *in = loom_model_stream(b.m, k + 1, &count_b, &dtype_b);
    int border_ok = out && in && count == (size_t)N * C && count_b == count && dtype == dtype_b &&
                    dtype == (md->dtype == LOOM_F32 && !md->recompute ? LOOM_F32 : md->dtype);
    memcpy(in, out, count * loom_dtype_size(dtype));
    float lb = forward(&b, k + 1, L + 1, 0);
    backward(&b, L + 1, k + 1);
    size_t gcount;
    float *dout = loom_model_stream_grad(a.m, &gcount);
    memcpy(dout, loom_model_stream_grad(b.m, NULL), gcount * sizeof(float));
    /* the head's wte share (b's copy of unit 0) reaches a's unit 0 before a's
     * own embedding backward, the order the whole model adds them in */
    memcpy(a.units[0].grads, b.units[0].grads, grad_bytes(&a, 0));
    backward(&a, k, 0);

    int same = lw == lb && same_grads(&w, &a, 1, k) && same_grads(&w, &b, k + 1, L + 1);
    /* unit 0: bitwise in fp32. bf16 rounds the head's share h to bf16 on
     * the last stage before the embedding's e is added: bf16(bf16(h) + e)
     * against the whole model's bf16(h + e), within those two roundings */
    if (md->dtype == LOOM_F32) {
        same &= same_grads(&w, &a, 0, 0);
    } else {
        const uint16_t *gw = w.units[0].grads, *ga = a.units[0].grads, *gh = b.units[0].grads;
        for (size_t i = 0; i < w.units[0].numel; i++) {
            float x = loom_bf16_to_f32(gw[i]), y = loom_bf16_to_f32(ga[i]);
            float h = loom_bf16_to_f32(gh[i]);
            float tol = (fabsf(h) + fabsf(x) + fabsf(y)) / 256 + 1e-7f;
            same &= fabsf(x - y) <= tol;
        }
    }
    char what[160];
    snprintf(what, sizeof what, "%s stages 0..%d + %d..%d: border %s, same loss and gradients",
             md->name, k, k + 1, L + 1, border_ok ? "ok" : "WRONG");
    check(same && border_ok, what);

    /* a stage's activations: exactly its units', less than the whole model's */
    teardown(&a);
    teardown(&b);
    uint64_t base = activations();
    setup(&a, md, first);
    uint64_t stage = activations() - base;
    size_t want = expected_shared(md, first) + expected_slot(md, first);
    teardown(&a);
    base = activations();
    setup(&b, md, second);
    uint64_t stage_b = activations() - base;
    size_t want_b = expected_shared(md, second) + expected_slot(md, second);
    teardown(&b);
    uint64_t whole = 0;
    base = activations();
    teardown(&w);
    whole = base - activations();
    snprintf(what, sizeof what,
             "%s stage memory: %llu and %llu bytes (expected %zu and %zu), whole %llu "
             "(expected %zu)",
             md->name, (unsigned long long)stage, (unsigned long long)stage_b, want, want_b,
             (unsigned long long)whole, expected_shared(md, all) + expected_slot(md, all));
    check(stage == want && stage_b == want_b && stage < whole && stage_b < whole &&
              whole == expected_shared(md, all) + expected_slot(md, all),
          what);
}

/* ---- slots ---- */

static void test_slots(const mode *md)
{
    uint64_t base = activations();
    fixture s, r;
    setup(&s, md, NULL);
    uint64_t created = activations() - base;
    size_t slot = loom_model_slot_bytes(s.m);
    unsigned char all[NUNITS] = {1, 1, 1, 1};
    size_t shared = created - slot;
    char what[200];
    snprintf(what, sizeof what, "%s slot bytes %zu (expected %zu), shared %zu (expected %zu)",
             md->name, slot, expected_slot(md, all), shared, expected_shared(md, all));
    check(slot == expected_slot(md, all) && shared == expected_shared(md, all), what);

    loom_mem_usage_reset_peak();
    must(loom_model_use_slot(s.m, 0), "slot 0");
    float la = forward(&s, 0, L + 1, 0);
    must(loom_model_use_slot(s.m, 1), "slot 1");
    float lb = forward(&s, 0, L + 1, 1);
    uint64_t two = activations() - base, peak = activations_peak() - base;
    backward(&s, L + 1, 0);
    must(loom_model_use_slot(s.m, 0), "slot 0");
    backward(&s, L + 1, 0);
    loom_model_release_slot(s.m, 1);
    uint64_t one = activations() - base;

    /* the reference: B then A, one at a time, the order the gradients add */
    setup(&r, md, NULL);
    float rb = forward(&r, 0, L + 1, 1);
    backward(&r, L + 1, 0);
    float ra = forward(&r, 0, L + 1, 0);
    backward(&r, L + 1, 0);
    snprintf(what, sizeof what, "%s two slots alive: same losses and gradients as one at a time",
             md->name);
    check(la == ra && lb == rb && la != lb && same_grads(&s, &r, 0, L + 1), what);
    snprintf(what, sizeof what,
             "%s slot accounting: two live %llu (peak %llu) = shared + 2 x %zu, after release "
             "%llu = shared + 1",
             md->name, (unsigned long long)two, (unsigned long long)peak, slot,
             (unsigned long long)one);
    check(two == shared + 2 * slot && peak == two && one == shared + slot, what);

    /* a released slot is refused until used again, then works afresh */
    must(loom_model_use_slot(s.m, 0), "slot 0");
    loom_model_release_slot(s.m, 0);
    int refused = loom_model_forward(s.m, 0, tokens[0], targets[0], NULL) != LOOM_OK &&
                  loom_model_stream(s.m, 1, NULL, NULL) == NULL;
    must(loom_model_use_slot(s.m, 0), "slot 0 again");
    forward(&s, 0, L + 1, 0);
    snprintf(what, sizeof what, "%s released slot refused, reallocated on use", md->name);
    check(refused && activations() - base == 2 * shared + 2 * slot, what);

    /* a slot of some units only (a pipeline's virtual stage): their bytes
     * alone, and the others refused in it */
    unsigned char first[NUNITS] = {1, 1, 0, 0};
    uint64_t before = activations();
    must(loom_model_use_slot_units(s.m, 2, first), "slot 2 of units 0 and 1");
    uint64_t part = activations() - before;
    forward(&s, 0, 1, 0);
    refused = loom_model_forward(s.m, 2, tokens[0], targets[0], NULL) != LOOM_OK &&
              loom_model_stream(s.m, 2, NULL, NULL) != NULL &&
              loom_model_stream(s.m, 3, NULL, NULL) == NULL;
    loom_model_release_slot(s.m, 2);
    snprintf(what, sizeof what,
             "%s slot of units 0-1: %llu bytes (expected %zu), unit 2 refused in it, full slots "
             "still %zu",
             md->name, (unsigned long long)part, expected_slot(md, first),
             loom_model_slot_bytes(s.m));
    check(part == expected_slot(md, first) && refused && loom_model_slot_bytes(s.m) == slot &&
              activations() == before,
          what);
    teardown(&s);
    teardown(&r);
}

/* ---- split backward ---- */

static void backward_split(fixture *f, int input_first, uint64_t *held)
{
    if (!input_first) {
        for (int u = L + 1; u >= 0; u--) {
            must(loom_model_backward_input(f->m, u, dloss), "backward_input");
            must(loom_model_backward_weight(f->m, u), "backward_weight");
        }
        return;
    }
    uint64_t before = activations();
    for (int u = L + 1; u >= 0; u--)
        must(loom_model_backward_input(f->m, u, dloss), "backward_input");
    if (held)
        *held = activations() - before;
    for (int u = L + 1; u >= 0; u--)
        must(loom_model_backward_weight(f->m, u), "backward_weight");
}

static void test_split(const mode *md)
{
    char what[200];
    for (int input_first = 0; input_first <= 1; input_first++) {
        fixture s, r;
        setup(&s, md, NULL);
        setup(&r, md, NULL);
        float ls = forward(&s, 0, L + 1, 0), lr = forward(&r, 0, L + 1, 0);
        size_t count;
        /* unit by unit, the stream gradient after each input part matches */
        int same_stream = 1;
        if (!input_first) {
            for (int u = L + 1; u >= 0; u--) {
                must(loom_model_backward_input(s.m, u, dloss), "backward_input");
                must(loom_model_backward(r.m, u, dloss), "backward");
                const float *ds = loom_model_stream_grad(s.m, &count);
                same_stream &= !memcmp(ds, loom_model_stream_grad(r.m, NULL),
                                       count * sizeof(float));
                must(loom_model_backward_weight(s.m, u), "backward_weight");
            }
        } else {
            uint64_t held = 0;
            backward_split(&s, 1, &held);
            backward(&r, L + 1, 0);
            size_t want = 0;
            for (int u = 0; u <= L + 1; u++)
                want += loom_model_deferred_bytes(s.m, u);
            size_t formula = 0;
            for (int u = 0; u <= L + 1; u++)
                formula += expected_deferred(md, u);
            snprintf(what, sizeof what, "%s input parts hold %llu bytes until the weight parts "
                     "(deferred bytes %zu, expected %zu)", md->name, (unsigned long long)held,
                     want, formula);
            check(held == want && want == formula, what);
        }
        snprintf(what, sizeof what, "%s %s: same gradients%s as backward", md->name,
                 input_first ? "all inputs, then all weights" : "input then weight per unit",
                 input_first ? "" : " and stream gradients");
        check(ls == lr && same_stream && same_grads(&s, &r, 0, L + 1), what);
        teardown(&s);
        teardown(&r);
    }

    /* two slots: inputs of A, inputs of B, weights of B, weights of A */
    fixture s, r;
    uint64_t base = activations();
    setup(&s, md, NULL);
    uint64_t created = activations() - base;
    setup(&r, md, NULL);
    must(loom_model_use_slot(s.m, 0), "slot 0");
    forward(&s, 0, L + 1, 0);
    must(loom_model_use_slot(s.m, 1), "slot 1");
    forward(&s, 0, L + 1, 1);
    must(loom_model_use_slot(s.m, 0), "slot 0");
    for (int u = L + 1; u >= 0; u--)
        must(loom_model_backward_input(s.m, u, dloss), "backward_input A");
    must(loom_model_use_slot(s.m, 1), "slot 1");
    for (int u = L + 1; u >= 0; u--)
        must(loom_model_backward_input(s.m, u, dloss), "backward_input B");
    for (int u = L + 1; u >= 0; u--)
        must(loom_model_backward_weight(s.m, u), "backward_weight B");
    must(loom_model_use_slot(s.m, 0), "slot 0");
    for (int u = L + 1; u >= 0; u--)
        must(loom_model_backward_weight(s.m, u), "backward_weight A");
    loom_model_release_slot(s.m, 1);
    forward(&r, 0, L + 1, 1);
    backward(&r, L + 1, 0);
    forward(&r, 0, L + 1, 0);
    backward(&r, L + 1, 0);
    snprintf(what, sizeof what, "%s split over two slots (I A, I B, W B, W A): same gradients",
             md->name);
    check(same_grads(&s, &r, 0, L + 1), what);
    teardown(&r);
    snprintf(what, sizeof what, "%s split backward frees what it deferred", md->name);
    check(activations() - base == created, what);

    /* misuse is refused with a message, not run */
    int refused = loom_model_backward_weight(s.m, 1) != LOOM_OK;
    must(loom_model_backward_input(s.m, L + 1, dloss), "backward_input");
    refused &= loom_model_backward_input(s.m, L + 1, dloss) != LOOM_OK;
    must(loom_model_backward_weight(s.m, L + 1), "backward_weight");
    teardown(&s);
    snprintf(what, sizeof what, "%s weight part without its input part, or the input part "
             "twice, refused", md->name);
    check(refused, what);
}

static void test_refusals(void)
{
    unsigned char none[NUNITS] = {0}, second[NUNITS] = {0, 0, 1, 1};
    loom_model_setup s;
    memset(&s, 0, sizeof s);
    s.shape = shape;
    s.batch = B;
    s.seq = T;
    s.dtype = LOOM_F32;
    loom_model_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.tp_size = 1;
    lay.runs_unit = none;
    loom_model *m = NULL;
    int refused = loom_model_create_parallel(&s, &lay, &m) != LOOM_OK;
    printf("     (%s)\n", loom_last_error());
    fixture f;
    setup(&f, &modes[0], second);
    refused &= loom_model_forward(f.m, 1, tokens[0], targets[0], NULL) != LOOM_OK;
    printf("     (%s)\n", loom_last_error());
    refused &= loom_model_stream(f.m, 1, NULL, NULL) == NULL &&
               loom_model_stream(f.m, 2, NULL, NULL) != NULL;
    teardown(&f);
    check(refused, "a model of no units, and a unit this rank does not run, refused");
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "all";
    size_t total = loom_gpt2_param_count(&shape);
    llmc = malloc(total * sizeof(float));
    loom_gpt2_init_random(&shape, 7, llmc);
    for (size_t i = 0; i < total; i++) /* larger than GPT-2's 0.02, so every path carries gradient */
        llmc[i] *= 4.0f;
    for (int i = 0; i < N; i++) {
        tokens[0][i] = (i * 7 + 3) % shape.vocab;
        targets[0][i] = (i * 11 + 5) % shape.vocab;
        tokens[1][i] = (i * 5 + 1) % shape.vocab;
        targets[1][i] = (i * 13 + 2) % shape.vocab;
    }
    int all = !strcmp(which, "all");
    for (size_t i = 0; i < LOOM_ARRAY_LEN(modes); i++) {
        if (all || !strcmp(which, "stages"))
            for (int k = 0; k <= L; k++)
                test_stages(&modes[i], k);
        if (all || !strcmp(which, "slots"))
            test_slots(&modes[i]);
        if (all || !strcmp(which, "split"))
            test_split(&modes[i]);
    }
    if (all || !strcmp(which, "stages"))
        test_refusals();
    free(llmc);
    printf("%s\n", failures ? "FAILED" : "model stages: ok");
    return failures ? 1 : 0;
}
