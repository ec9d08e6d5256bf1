/* The published accounting for `loom plan` (see plan_reference.h): each
 * function is one formula, with its source above it. The activation
 * formulas are sums over a table of the tensors a layer saves, so that
 * the papers' closed forms are something the tests check, not restate. */
#include "plan/plan_reference.h"

/* ------------------------------------------------------------ the shape */

static double vocab_rows(const loom_plan_shape *s)
{
    /* the rows the embedding actually holds: padded where the shape pads */
    return s->padded_vocab > 0 ? s->padded_vocab : s->vocab;
}

static double mlp_width(const loom_plan_shape *s)
{
    return s->ffn > 0 ? s->ffn : 4.0 * s->channels;
}

/* Width of K (and of V): the kv_heads heads of h/a channels each. */
static double kv_width(const loom_plan_shape *s)
{
    int kv = s->kv_heads > 0 ? s->kv_heads : s->heads;
    return (double)s->channels * kv / s->heads;
}

/* --------------------------------------------------- parameters, FLOPs */

/* GPT-2 (Radford et al. 2019; llm.c's layout): wte Vp×C (tied to the
 * output), wpe maxT×C, per block LayerNorm 2C, QKV 3C²+3C, projection
 * C²+C, LayerNorm 2C, MLP C·F+F and F·C+C (12C²+13C at F = 4C), final
 * LayerNorm 2C.
 * Llama (Touvron et al. 2023; Dubey et al. 2024, Table 3): embedding V×h
 * and an untied output h×V, per layer q h×h, k and v h×(h·kv/a) each,
 * o h×h, gate, up and down 3·h·F, two RMSNorm weights h; final norm h.
 * No biases. */
double loom_plan_ref_params(const loom_plan_shape *shape)
{
    double h = shape->channels, F = mlp_width(shape), V = vocab_rows(shape);
    double L = shape->layers;
    if (shape->kind == LOOM_PLAN_LLAMA) {
        double layer = 2.0 * h * h + 2.0 * h * kv_width(shape) + 3.0 * h * F + 2.0 * h;
        return 2.0 * V * h + L * layer + h;
    }
    double block = 4.0 * h * h + 2.0 * h * F + 9.0 * h + F;
    return V * h + (double)shape->max_seq * h + L * block + 2.0 * h;
}

/* A lookup is a copy, not a product: GPT-2's wpe and Llama's input
 * embedding do no multiply-adds (GPT-2's wte does, as the tied head). */
double loom_plan_ref_matmul_params(const loom_plan_shape *shape)
{
    double h = shape->channels;
    double lookup = shape->kind == LOOM_PLAN_LLAMA ? vocab_rows(shape) * h
                                                   : (double)shape->max_seq * h;
    return loom_plan_ref_params(shape) - lookup;
}

/* 6 FLOPs per multiplied parameter per token (forward 2, backward 4:
 * Kaplan et al. 2020, §2.1; the PaLM paper's 6N, Chowdhery et al. 2022,
 * App. B), plus attention's QKᵀ and AV: 2 products of s×h per token per
 * layer, 2 FLOPs each, ×3 for the backward, = 12·L·s·h per token (PaLM's
 * 12·L·H·Q·T). A causal mask needs only half the s×s entries, so loom
 * counts 6·L·s·h, as loom_model_flops_per_token does for what it trains
 * (llm.c's convention); the Llama variant is counted the same way. Grouped
 * queries change no product here: every query head scores all s keys. */
double loom_plan_ref_flops_per_token(const loom_plan_shape *shape, int seq)
{
    return 6.0 * loom_plan_ref_matmul_params(shape) +
           6.0 * shape->layers * (double)seq * shape->channels;
}

/* -------------------------------------------------------- model states */

/* Rajbhandari et al. 2020 (ZeRO), §5 and Figure 1: 16-bit parameters and
 * gradients (2Ψ each) and K·Ψ of optimizer state, of which each stage
 * partitions one more over the N ranks:
 *   0 (DDP)  (2 + 2 + K)Ψ
 *   1 (P_os) 2Ψ + 2Ψ + KΨ/N
 *   2 (+g)   2Ψ + (2 + K)Ψ/N
 *   3 (+p)   (2 + 2 + K)Ψ/N
 * -1 for a stage other than 0..3. */
double loom_plan_ref_model_state_bytes(int zero_stage, double params, int ranks,
                                       double optimizer_bytes)
{
    double N = ranks, K = optimizer_bytes, weights = 2.0 * params, grads = 2.0 * params,
           optimizer = K * params;
    switch (zero_stage) {
    case 0: return weights + grads + optimizer;
    case 1: return weights + grads + optimizer / N;
    case 2: return weights + (grads + optimizer) / N;
    case 3: return (weights + grads + optimizer) / N;
    default: return -1.0;
    }
}

/* ----------------------------------------------- activations, per layer */

/* What the backward needs of a saved tensor, which decides who keeps it. */
typedef enum saved_role {
    SAVED_LAYER_INPUT,    /* the layer's input: kept even by full recomputation */
    SAVED_LINEAR,         /* O(s) per sequence: kept by selective recomputation */
    SAVED_ATTENTION_CORE, /* O(s²): the part selective recomputation drops */
} saved_role;

typedef struct saved_tensor {
    const char *what;
    double bytes;       /* the whole layer's, on one rank without parallelism */
    double tp_shards;   /* ranks it is split over inside a tensor-parallel region;
                           0: outside them (replicated over tp, or split along
                           the sequence with sequence parallelism) */
    saved_role role;
} saved_tensor;

enum { SAVED_MAX = 16 };

/* Korthikanti et al. 2022, §4.1, 16-bit activations, 1-byte dropout
 * masks, MLP width F (4h in the paper):
 *   attention 11sbh + 5as²b: QKV input 2sbh, Q and K 4sbh, softmax
 *     output 2as²b, its dropout mask as²b, the dropout output 2as²b and
 *     V 2sbh for the weighted sum, the projection's input 2sbh, the
 *     dropout mask after it sbh;
 *   MLP 19sbh: its input 2sbh, the GeLU's input 8sbh, its output 8sbh,
 *     the dropout mask sbh;
 *   the two LayerNorms' inputs 4sbh.
 * Tensor parallelism (§4.2.1) splits what lies between the column- and
 * row-parallel products; the LayerNorms, the dropouts and the two block
 * inputs stay replicated (the 10sbh of sbh(10 + 24/t + 5as/(ht))).
 * LayerNorm statistics (O(sb)) are left out, as in the paper. */
static int gpt_saved(const loom_plan_shape *shape, double s, double b, int t,
                     saved_tensor out[SAVED_MAX])
{
    double h = shape->channels, a = shape->heads, F = mlp_width(shape);
    double sbh = s * b * h, as2b = a * s * s * b, T = t;
    saved_tensor table[] = {
        {"LayerNorm 1 input (the layer's input)", 2 * sbh, 0, SAVED_LAYER_INPUT},
        {"QKV projection input", 2 * sbh, 0, SAVED_LINEAR},
        {"Q and K", 4 * sbh, T, SAVED_LINEAR},
        {"softmax output", 2 * as2b, T, SAVED_ATTENTION_CORE},
        {"softmax dropout mask", as2b, T, SAVED_ATTENTION_CORE},
        {"softmax dropout output", 2 * as2b, T, SAVED_ATTENTION_CORE},
        {"V", 2 * sbh, T, SAVED_LINEAR},
        {"attention projection input", 2 * sbh, T, SAVED_LINEAR},
        {"attention dropout mask", sbh, 0, SAVED_LINEAR},
        {"LayerNorm 2 input", 2 * sbh, 0, SAVED_LINEAR},
        {"MLP input", 2 * sbh, 0, SAVED_LINEAR},
        {"GeLU input", 2 * s * b * F, T, SAVED_LINEAR},
        {"GeLU output", 2 * s * b * F, T, SAVED_LINEAR},
        {"MLP dropout mask", sbh, 0, SAVED_LINEAR},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    for (int i = 0; i < n; i++)
        out[i] = table[i];
    return n;
}

/* A Llama layer (16-bit, no dropout), by the same rules: each norm's input
 * and output (the next product's input), q h, k and v h·kv/a each, the
 * attention output (the o projection's input), and SwiGLU's gate and up
 * outputs, silu(gate) and their product (the down projection's input), F
 * each. With FlashAttention (Dao et al. 2022) the backward recomputes the
 * probabilities from the fp32 log-sum-exp of each row, 4·a·s·b bytes;
 * without it the 16-bit probabilities are kept, 2·a·s²·b. On t ranks the
 * kv heads split over min(t, kv) of them (Megatron replicates a kv head
 * when t exceeds kv). RMSNorm's per-token statistics are left out, as the
 * LayerNorms' are in the GPT table. */
static int llama_saved(const loom_plan_shape *shape, double s, double b, int t, int flash,
                       saved_tensor out[SAVED_MAX])
{
    double h = shape->channels, a = shape->heads, F = mlp_width(shape);
    int kv = shape->kv_heads > 0 ? shape->kv_heads : shape->heads;
    double sbh = s * b * h, T = t, kv_shards = t < kv ? t : kv;
    double kv_bytes = 2.0 * s * b * kv_width(shape);
    saved_tensor table[] = {
        {"RMSNorm 1 input (the layer's input)", 2 * sbh, 0, SAVED_LAYER_INPUT},
        {"QKV projection input", 2 * sbh, 0, SAVED_LINEAR},
        {"Q", 2 * sbh, T, SAVED_LINEAR},
        {"K", kv_bytes, kv_shards, SAVED_LINEAR},
        {"V", kv_bytes, kv_shards, SAVED_LINEAR},
        {"attention output", 2 * sbh, T, SAVED_LINEAR},
        {"RMSNorm 2 input", 2 * sbh, 0, SAVED_LINEAR},
        {"MLP input", 2 * sbh, 0, SAVED_LINEAR},
        {"gate output", 2 * s * b * F, T, SAVED_LINEAR},
        {"up output", 2 * s * b * F, T, SAVED_LINEAR},
        {"silu(gate)", 2 * s * b * F, T, SAVED_LINEAR},
        {"silu(gate) * up", 2 * s * b * F, T, SAVED_LINEAR},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    for (int i = 0; i < n; i++)
        out[i] = table[i];
    if (flash)
        out[n++] = (saved_tensor){"softmax log-sum-exp (fp32)", 4 * a * s * b, T, SAVED_LINEAR};
    else
        out[n++] = (saved_tensor){"softmax output", 2 * a * s * s * b, T, SAVED_ATTENTION_CORE};
    return n;
}

/* What one tp rank keeps of the table (Korthikanti et al. 2022, §4.2–§5):
 *   - a tensor inside a tensor-parallel region is split over its shards;
 *   - one outside is whole on every rank, unless sequence parallelism
 *     (§4.2.2) splits it along the sequence over the t ranks;
 *   - selective recomputation (§5) keeps all but the s×s tensors, which
 *     the backward recomputes from Q, K and V;
 *   - full recomputation keeps the layer's input alone (2sbh; with
 *     sequence parallelism that input is this rank's part of the
 *     sequence, 2sbh/t). */
static double kept_bytes(const saved_tensor *saved, int n, const loom_plan_ref_layout *layout)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        const saved_tensor *x = &saved[i];
        if (layout->recompute == LOOM_PLAN_REF_RECOMPUTE_BLOCK && x->role != SAVED_LAYER_INPUT)
            continue;
        if (layout->recompute == LOOM_PLAN_REF_RECOMPUTE_SELECTIVE &&
            x->role == SAVED_ATTENTION_CORE)
            continue;
        double shards = x->tp_shards > 0 ? x->tp_shards
                        : layout->sequence_parallel ? layout->tp
                                                    : 1.0;
        total += x->bytes / shards;
    }
    return total;
}

/* Korthikanti et al. 2022, Table 2, which these sums reproduce (with
 * F = 4h):
 *   no parallelism                   sbh(34 + 5as/h)
 *   tensor parallel                  sbh(10 + 24/t + 5as/(ht))
 *   tensor + sequence parallel       sbh/t · (34 + 5as/h)
 *   tensor parallel + selective      sbh(10 + 24/t)
 *   tensor + sequence + selective    sbh · 34/t
 *   full recomputation               2sbh */
double loom_plan_ref_gpt_layer_bytes(const loom_plan_shape *shape,
                                     const loom_plan_ref_layout *layout)
{
    saved_tensor saved[SAVED_MAX];
    int n = gpt_saved(shape, layout->seq, layout->micro_batch, layout->tp, saved);
    return kept_bytes(saved, n, layout);
}

/* Without parallelism and with FlashAttention:
 *   sb(12h + 4h·kv/a + 8F + 4a);
 * selective recomputation keeps the same (FlashAttention already stores
 * no s×s tensor: there is nothing left for it to drop). */
double loom_plan_ref_llama_layer_bytes(const loom_plan_shape *shape,
                                       const loom_plan_ref_layout *layout)
{
    saved_tensor saved[SAVED_MAX];
    int n = llama_saved(shape, layout->seq, layout->micro_batch, layout->tp,
                        layout->flash_attention, saved);
    return kept_bytes(saved, n, layout);
}

/* Korthikanti et al. 2022, §5: selective recomputation reruns QKᵀ and AV
 * in the backward, 2·2·b·s²·h FLOPs per layer (the paper counts the whole
 * s×s products), against a forward of 2·b·s FLOPs per weight
 * (4h² + 2hF, = 24bsh² at F = 4h) plus those 4bs²h:
 *   4s / (24h + 4s) at F = 4h  (GPT-3: 2.7%, MT-NLG: 1.6% in the paper). */
double loom_plan_ref_selective_recompute_overhead(const loom_plan_shape *shape, double seq)
{
    double h = shape->channels, F = mlp_width(shape), s = seq;
    double attention_core = 4.0 * s * s * h;
    double weights = 2.0 * s * (4.0 * h * h + 2.0 * h * F);
    return attention_core / (weights + attention_core);
}

/* ------------------------------------------------------ pipeline bubble */

/* GPipe (Huang et al. 2019, §2.3) and 1F1B (Narayanan et al. 2021, §2.2.1):
 * each rank idles (p−1) forward-and-backward times while the pipeline
 * fills and drains, against m of work; Narayanan's bubble time fraction
 * (p−1)/m is idle over work, so of the makespan it is (p−1)/(m + p − 1). */
double loom_plan_ref_bubble_1f1b(int p, int m)
{
    return (double)(p - 1) / (double)(m + p - 1);
}

/* Interleaved 1F1B (Narayanan et al. 2021, §2.2.2): v virtual stages per
 * rank cut each fill and drain step to 1/v, idle over work (p−1)/(v·m);
 * of the makespan (p−1)/(v·m + p − 1). */
double loom_plan_ref_bubble_interleaved(int p, int v, int m)
{
    return (double)(p - 1) / ((double)v * m + p - 1);
}

/* ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2.1):
 * splitting the backward into B (the input's gradient) and W (the
 * weights') and deferring W fills the drain, leaving each rank idle
 * (p−1)(T_F + T_B − T_W), against 1F1B's (p−1)(T_F + T_B + T_W); with equal
 * times the authors' bubble rate (p−1)/(3m) — a third of 1F1B's. Of the
 * makespan m(T_F + T_B + T_W) + idle. It holds while a W fits where the
 * drain would idle for a forward (T_W <= T_F): loom's zb-h1 idles longer
 * when T_W > T_F (F 0.5, B 2, W 1.5, p 2, m 2: 0.200, not 0.111). */
double loom_plan_ref_bubble_zb_h1(int p, int m, double forward, double backward_input,
                                  double backward_weight)
{
    double idle = (p - 1) * (forward + backward_input - backward_weight);
    double work = m * (forward + backward_input + backward_weight);
    return idle / (work + idle);
}
