/* The whole model's gradient against central finite differences, per
 * parameter tensor along a random direction, on a tiny GPT-2 with a padded
 * vocabulary; and recomputation and 16-bit storage against fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/formats.h"
#include "model/kernels.h"
#include "model/model.h"
#include "runtime/log.h"

static int failures;

typedef struct fixture {
    loom_model *m;
    loom_unit *units;
    int nunits, N;
    float **params, **grads;
    int *inputs, *targets;
} fixture;

static uint64_t rng = 88172645463325252ull;
static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static const loom_gpt2_shape shape = {8, 30, 2, 2, 16, 32}; /* maxT V L NH C Vp */
enum { B = 2, T = 7 };

static void setup(fixture *f, loom_dtype dtype, int recompute, const float *llmc)
{
    loom_model_setup s = {shape, B, T, dtype, recompute, NULL};
    if (loom_model_create(&s, &f->m) != LOOM_OK) {
        fprintf(stderr, "model: %s\n", loom_last_error());
        exit(1);
    }
    f->units = loom_model_units(f->m, &f->nunits);
    f->N = B * T;
    f->params = calloc((size_t)f->nunits, sizeof(float *));
    f->grads = calloc((size_t)f->nunits, sizeof(float *));
    float **p32 = calloc((size_t)f->nunits, sizeof(float *));
    for (int i = 0; i < f->nunits; i++) {
        size_t n = f->units[i].numel, es = loom_dtype_size(dtype);
        p32[i] = malloc(n * 4);
        f->params[i] = malloc(n * es);
        f->grads[i] = calloc(n, es);
        f->units[i].params = f->params[i];
        f->units[i].grads = f->grads[i];
    }
    loom_model_split_params(f->m, llmc, p32);
    for (int i = 0; i < f->nunits; i++) {
        loom_convert(f->params[i], dtype, p32[i], LOOM_F32, f->units[i].numel);
        free(p32[i]);
    }
    free(p32);
    f->inputs = malloc((size_t)f->N * sizeof(int));
    f->targets = malloc((size_t)f->N * sizeof(int));
    for (int i = 0; i < f->N; i++) {
        f->inputs[i] = (i * 7 + 3) % shape.vocab;
        f->targets[i] = (i * 11 + 5) % shape.vocab;
    }
}

static void teardown(fixture *f)
{
    for (int i = 0; i < f->nunits; i++) {
        free(f->params[i]);
        free(f->grads[i]);
    }
    free(f->params);
    free(f->grads);
    free(f->inputs);
    free(f->targets);
    loom_model_destroy(f->m);
}

static double loss_of(fixture *f)
{
    float loss = 0;
    for (int u = 0; u < f->nunits; u++)
        loom_model_forward(f->m, u, f->inputs, f->targets, &loss);
    return loss;
}

static void backward(fixture *f)
{
    for (int u = f->nunits - 1; u >= 0; u--)
        loom_model_backward(f->m, u, 1.0f / (float)f->N);
}

int main(void)
{
    size_t total = loom_gpt2_param_count(&shape);
    float *llmc = malloc(total * sizeof(float));
    loom_gpt2_init_random(&shape, 7, llmc);
    /* larger weights than GPT-2's 0.02, so every path carries gradient */
    for (size_t i = 0; i < total; i++)
        llmc[i] *= 4.0f;

    fixture f;
    setup(&f, LOOM_F32, 0, llmc);
    loss_of(&f);
    backward(&f);
    for (int u = 0; u < f.nunits; u++) {
        for (int t = 0; t < f.units[u].ntensors; t++) {
            const loom_param_desc *d = &f.units[u].tensors[t];
            float *p = f.params[u] + d->offset;
            const float *g = f.grads[u] + d->offset;
            /* direction: random over the tensor (padded wte rows excluded:
             * their logits are ignored, so their gradient is 0 by design) */
            size_t n = d->count;
            if (u == 0 && t == 0)
                n = (size_t)shape.vocab * shape.channels;
            double *dir = malloc(n * sizeof(double)), analytic = 0;
            for (size_t i = 0; i < n; i++) {
                dir[i] = uniform() - 0.5;
                analytic += dir[i] * g[i];
            }
            const double eps = 3e-3;
            float *saved = malloc(n * sizeof(float));
            memcpy(saved, p, n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                p[i] = (float)(saved[i] + eps * dir[i]);
            double up = loss_of(&f);
            for (size_t i = 0; i < n; i++)
                p[i] = (float)(saved[i] - eps * dir[i]);
            double down = loss_of(&f);
            memcpy(p, saved, n * sizeof(float));
            double numeric = (up - down) / (2 * eps);
            double rel = fabs(numeric - analytic) / fmax(fabs(numeric), 1e-4);
            int ok = rel < 2e-2;
            failures += !ok;
            printf("%-5s %-9s analytic %+.6e  numeric %+.6e  rel %.2e %s\n",
                   f.units[u].name, d->name, analytic, numeric, rel, ok ? "ok" : "FAIL");
            free(dir);
            free(saved);
        }
    }
    /* padded vocabulary rows get no gradient */
    for (size_t i = (size_t)shape.vocab * shape.channels; i < (size_t)shape.padded_vocab * shape.channels; i++)
        if (f.grads[0][i] != 0) {
            printf("FAIL: padded wte row has gradient\n");
            failures++;
            break;
        }

    /* recomputation gives the same loss and gradients, bit for bit */
    fixture r;
    setup(&r, LOOM_F32, 1, llmc);
    double lf = loss_of(&f), lr = loss_of(&r);
    for (int u = 0; u < f.nunits; u++)
        memset(f.grads[u], 0, f.units[u].numel * 4);
    backward(&f);
    backward(&r);
    int same = lf == lr;
    for (int u = 0; u < f.nunits; u++)
        same &= !memcmp(f.grads[u], r.grads[u], f.units[u].numel * 4);
    printf("recompute: %s\n", same ? "identical loss and gradients" : "FAIL: differs");
    failures += !same;
    teardown(&r);

    /* bf16 storage: the loss and gradient direction stay close to fp32 */
    fixture h;
    setup(&h, LOOM_BF16, 0, llmc);
    double lh = loss_of(&h);
    backward(&h);
    double dot = 0, n1 = 0, n2 = 0;
    for (int u = 0; u < f.nunits; u++)
        for (size_t i = 0; i < f.units[u].numel; i++) {
            double a = f.grads[u][i], b = loom_bf16_to_f32(((uint16_t *)h.grads[u])[i]);
            dot += a * b;
            n1 += a * a;
            n2 += b * b;
        }
    double cosine = dot / sqrt(n1 * n2);
    int close = fabs(lh - lf) / lf < 1e-2 && cosine > 0.99;
    printf("bf16: loss %.6f vs %.6f, gradient cosine %.5f %s\n", lh, lf, cosine, close ? "ok" : "FAIL");
    failures += !close;
    teardown(&h);
    teardown(&f);
    free(llmc);
    printf("%s\n", failures ? "FAILED" : "model gradients: ok");
    return failures ? 1 : 0;
}
