/* The GPT-2 model of DESIGN §7 as units, on the kernels of kernels.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "loom_internal.h"
#include "model.h"

/* The tensors of one block, in llm.c's order within the unit. */
enum { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,
       BLOCK_TENSORS };

/* A block's activations as fp32 views. In fp32 runs these point into the
 * saved per-layer buffers; otherwise into one scratch set that each block
 * borrows while it computes. */
typedef struct block_acts {
    float *x;                      /* block input (N, C) */
    float *ln1, *mean1, *rstd1;    /* (N, C), (N), (N) */
    float *q, *k, *v, *atty;       /* (N, C) each */
    float *lse;                    /* (B, NH, T) */
    float *res2;                   /* x + attention projection */
    float *ln2, *mean2, *rstd2;
    float *fch, *fch_gelu;         /* (N, 4C) */
    float *out;                    /* res2 + MLP projection: the next block's input */
} block_acts;

/* What a layer keeps between forward and backward when not in fp32
 * in-place mode: 16-bit copies of the (N, C)/(N, 4C) tensors, fp32 for the
 * small per-row statistics. With recomputation only x. */
typedef struct block_saved {
    void *x, *ln1, *q, *k, *v, *atty, *res2, *ln2, *fch, *fch_gelu;
    float *mean1, *rstd1, *mean2, *rstd2, *lse;
} block_saved;

typedef struct head_acts {
    float *lnf, *meanf, *rstdf; /* (N, C), (N), (N) */
    float *probs;               /* (N, Vp), kept fp32 for the loss */
    float *losses;              /* (N) */
    float *dlogits;             /* (N, Vp) backward scratch */
} head_acts;

struct loom_model {
    loom_model_setup s;
    int N, C, L, NH, V, Vp, maxT;
    loom_unit *units;
    loom_param_desc *descs;       /* all units' tensor views */
    int inplace;                  /* fp32 without recomputation */

    block_saved *saved;           /* L (not inplace) */
    block_acts *acts;             /* L views (inplace) */
    block_acts scratch;           /* the borrowed fp32 set (not inplace) */
    void *head_input;             /* last block's output, in dtype (not inplace) */
    float **resid;                /* L+1 residual streams (inplace) */
    head_acts head;

    float *dresid, *dtmp_a, *dtmp_b, *dwide_a, *dwide_b; /* backward scratch */
    float *dlosses;
    int *tokens, *targets;        /* the current micro-batch */

    /* fp32 copies of 16-bit parameters/gradients while a unit computes */
    float *param32, *grad32, *emb_param32, *emb_grad32;
    loom_model_ops ops;
    int *positions;               /* the global position of each of the seq rows */
    int status;                   /* the first failure of a parallel op this pass */
    void **allocations;
    int nallocations, capallocations;
};

/* ---- buffers ---- */

static void *model_alloc(loom_model *m, loom_purpose purpose, size_t bytes)
{
    void *p = NULL;
    if (loom_mem_alloc(LOOM_TIER_HOST, purpose, bytes ? bytes : 1, &p) != LOOM_OK)
        return NULL;
    if (m->nallocations == m->capallocations) {
        int cap = m->capallocations ? 2 * m->capallocations : 64;
        void **grown = realloc(m->allocations, (size_t)cap * sizeof *grown);
        if (!grown) {
            loom_mem_free(p);
            return NULL;
        }
        m->allocations = grown;
        m->capallocations = cap;
    }
    m->allocations[m->nallocations++] = p;
    memset(p, 0, bytes);
    return p;
}

static float *f32(loom_model *m, size_t n) { return model_alloc(m, LOOM_PURPOSE_ACTIVATIONS, n * 4); }

static void *stored(loom_model *m, size_t n)
{
    return model_alloc(m, LOOM_PURPOSE_ACTIVATIONS, n * loom_dtype_size(m->s.dtype));
}

static int alloc_block_f32(loom_model *m, block_acts *a, int with_x)
{
    size_t N = (size_t)m->N, C = (size_t)m->C;
    if (with_x)
        a->x = f32(m, N * C);
    a->ln1 = f32(m, N * C);
    a->mean1 = f32(m, N);
    a->rstd1 = f32(m, N);
    a->q = f32(m, N * C);
    a->k = f32(m, N * C);
    a->v = f32(m, N * C);
    a->atty = f32(m, N * C);
    a->lse = f32(m, (size_t)m->s.batch * m->NH * m->s.seq);
    a->res2 = f32(m, N * C);
    a->ln2 = f32(m, N * C);
    a->mean2 = f32(m, N);
    a->rstd2 = f32(m, N);
    a->fch = f32(m, N * 4 * C);
    a->fch_gelu = f32(m, N * 4 * C);
    return a->ln1 && a->mean1 && a->rstd1 && a->q && a->k && a->v && a->atty && a->lse &&
           a->res2 && a->ln2 && a->mean2 && a->rstd2 && a->fch && a->fch_gelu &&
           (!with_x || a->x);
}

/* ---- units and their tensors ---- */

static void set_desc(loom_param_desc *d, const char *name, size_t *offset, int ndim, int64_t d0,
                     int64_t d1, loom_split split, int parts)
{
    d->name = name;
    d->offset = *offset;
    d->ndim = ndim;
    d->shape[0] = d->local_shape[0] = d0;
    d->shape[1] = d->local_shape[1] = ndim > 1 ? d1 : 0;
    d->count = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    d->split = split;
    d->split_parts = parts;
    *offset += d->count;
}

static const char *const block_names[BLOCK_TENSORS] = {
    "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};

static int build_units(loom_model *m)
{
    int L = m->L, C = m->C;
    int nunits = L + 2;
    m->units = calloc((size_t)nunits, sizeof *m->units);
    m->descs = calloc((size_t)(2 + L * BLOCK_TENSORS + 2), sizeof *m->descs);
    if (!m->units || !m->descs)
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
    loom_param_desc *d = m->descs;

    loom_unit *u = &m->units[0];
    size_t off = 0;
    u->index = 0;
    u->kind = LOOM_UNIT_EMBEDDING;
    u->name = "embedding";
    u->tensors = d;
    set_desc(d++, "wte", &off, 2, m->Vp, C, LOOM_SPLIT_ROWS, 1);
    set_desc(d++, "wpe", &off, 2, m->maxT, C, LOOM_SPLIT_REPLICATED, 1);
    u->ntensors = 2;
    u->numel = off;

    static const int rows[BLOCK_TENSORS][2] = {{1, 0}, {1, 0}, {3, 1}, {3, 0}, {1, 1}, {1, 0},
                                               {1, 0}, {1, 0}, {4, 1}, {4, 0}, {1, 4}, {1, 0}};
    static const loom_split splits[BLOCK_TENSORS] = {
        LOOM_SPLIT_REPLICATED, LOOM_SPLIT_REPLICATED, LOOM_SPLIT_ROWS,    LOOM_SPLIT_ROWS,
        LOOM_SPLIT_COLUMNS,    LOOM_SPLIT_REPLICATED, LOOM_SPLIT_REPLICATED, LOOM_SPLIT_REPLICATED,
        LOOM_SPLIT_ROWS,       LOOM_SPLIT_ROWS,       LOOM_SPLIT_COLUMNS, LOOM_SPLIT_REPLICATED};
    for (int l = 0; l < L; l++) {
        u = &m->units[1 + l];
        u->index = 1 + l;
        u->kind = LOOM_UNIT_BLOCK;
        u->name = "block";
        u->tensors = d;
        off = 0;
        for (int t = 0; t < BLOCK_TENSORS; t++) {
            int64_t d0 = (int64_t)rows[t][0] * C;
            int matrix = rows[t][1] != 0;
            set_desc(d++, block_names[t], &off, matrix ? 2 : 1, d0, (int64_t)rows[t][1] * C,
                     splits[t], t == QKVW || t == QKVB ? 3 : 1);
        }
        u->ntensors = BLOCK_TENSORS;
        u->numel = off;
    }
    u = &m->units[L + 1];
    u->index = L + 1;
    u->kind = LOOM_UNIT_HEAD;
    u->name = "head";
    u->tensors = d;
    off = 0;
    set_desc(d++, "lnfw", &off, 1, C, 0, LOOM_SPLIT_REPLICATED, 1);
    set_desc(d++, "lnfb", &off, 1, C, 0, LOOM_SPLIT_REPLICATED, 1);
    u->ntensors = 2;
    u->numel = off;
    for (int i = 0; i < nunits; i++)
        m->units[i].compute_dtype = m->s.dtype;
    return LOOM_OK;
}

int loom_model_create(const loom_model_setup *setup, loom_model **out)
{
    const loom_gpt2_shape *sh = &setup->shape;
    if (setup->dtype != LOOM_F32 && setup->dtype != LOOM_BF16 && setup->dtype != LOOM_F16)
        return loom_fail(LOOM_ERR_INVALID, "model: compute dtype must be f32, bf16 or f16");
    if (sh->channels % sh->heads != 0)
        return loom_fail(LOOM_ERR_INVALID, "model: channels %d do not divide by heads %d",
                         sh->channels, sh->heads);
    if (setup->seq > sh->max_seq)
        return loom_fail(LOOM_ERR_INVALID, "model: train.seq %d exceeds model.max_seq %d",
                         setup->seq, sh->max_seq);
    loom_model *m = calloc(1, sizeof *m);
    if (!m)
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
    m->s = *setup;
    m->N = setup->batch * setup->seq;
    m->C = sh->channels;
    m->L = sh->layers;
    m->NH = sh->heads;
    m->V = sh->vocab;
    m->Vp = sh->padded_vocab;
    m->maxT = sh->max_seq;
    m->inplace = setup->dtype == LOOM_F32 && !setup->recompute;
    int rc = build_units(m);
    if (rc != LOOM_OK) {
        loom_model_destroy(m);
        return rc;
    }

    size_t N = (size_t)m->N, C = (size_t)m->C, L = (size_t)m->L;
    int ok = 1;
    if (m->inplace) {
        m->resid = calloc(L + 1, sizeof *m->resid);
        m->acts = calloc(L, sizeof *m->acts);
        ok = m->resid && m->acts;
        for (size_t l = 0; ok && l <= L; l++)
            ok = (m->resid[l] = f32(m, N * C)) != NULL;
        for (size_t l = 0; ok && l < L; l++) {
            ok = alloc_block_f32(m, &m->acts[l], 0);
            m->acts[l].x = m->resid[l];
            m->acts[l].out = m->resid[l + 1];
        }
    } else {
        m->saved = calloc(L, sizeof *m->saved);
        ok = m->saved && alloc_block_f32(m, &m->scratch, 1) &&
             (m->scratch.out = f32(m, N * C)) != NULL && (m->head_input = stored(m, N * C));
        for (size_t l = 0; ok && l < L; l++) {
            block_saved *sv = &m->saved[l];
            ok = (sv->x = stored(m, N * C)) != NULL;
            if (!ok || setup->recompute)
                continue;
            sv->ln1 = stored(m, N * C);
            sv->q = stored(m, N * C);
            sv->k = stored(m, N * C);
            sv->v = stored(m, N * C);
            sv->atty = stored(m, N * C);
            sv->res2 = stored(m, N * C);
            sv->ln2 = stored(m, N * C);
            sv->fch = stored(m, N * 4 * C);
            sv->fch_gelu = stored(m, N * 4 * C);
            sv->mean1 = f32(m, N);
            sv->rstd1 = f32(m, N);
            sv->mean2 = f32(m, N);
            sv->rstd2 = f32(m, N);
            sv->lse = f32(m, (size_t)setup->batch * m->NH * setup->seq);
            ok = sv->ln1 && sv->q && sv->k && sv->v && sv->atty && sv->res2 && sv->ln2 &&
                 sv->fch && sv->fch_gelu && sv->mean1 && sv->rstd1 && sv->mean2 && sv->rstd2 &&
                 sv->lse;
        }
    }
    head_acts *h = &m->head;
    ok = ok && (h->lnf = f32(m, N * C)) && (h->meanf = f32(m, N)) && (h->rstdf = f32(m, N)) &&
         (h->probs = f32(m, N * (size_t)m->Vp)) && (h->losses = f32(m, N)) &&
         (h->dlogits = f32(m, N * (size_t)m->Vp)) && (m->dresid = f32(m, N * C)) &&
         (m->dtmp_a = f32(m, N * C)) && (m->dtmp_b = f32(m, N * C)) &&
         (m->dwide_a = f32(m, N * 4 * C)) && (m->dwide_b = f32(m, N * 4 * C)) &&
         (m->dlosses = f32(m, N));
    if (ok) {
        m->tokens = calloc(N, sizeof *m->tokens);
        m->targets = calloc(N, sizeof *m->targets);
        m->positions = calloc((size_t)setup->seq, sizeof *m->positions);
        ok = m->tokens && m->targets && m->positions;
        for (int t = 0; ok && t < setup->seq; t++)
            m->positions[t] = t;
    }
    if (ok && setup->dtype != LOOM_F32) {
        size_t biggest = m->units[1].numel > m->units[L + 1].numel ? m->units[1].numel
                                                                   : m->units[L + 1].numel;
        m->param32 = model_alloc(m, LOOM_PURPOSE_OTHER, biggest * 4);
        m->grad32 = model_alloc(m, LOOM_PURPOSE_OTHER, biggest * 4);
        m->emb_param32 = model_alloc(m, LOOM_PURPOSE_OTHER, m->units[0].numel * 4);
        m->emb_grad32 = model_alloc(m, LOOM_PURPOSE_OTHER, m->units[0].numel * 4);
        ok = m->param32 && m->grad32 && m->emb_param32 && m->emb_grad32;
    }
    if (!ok) {
        loom_model_destroy(m);
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: cannot allocate activations for B=%d T=%d",
                         setup->batch, setup->seq);
    }
    *out = m;
    return LOOM_OK;
}

void loom_model_destroy(loom_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nallocations; i++)
        loom_mem_free(m->allocations[i]);
    free(m->allocations);
    free(m->units);
    free(m->descs);
    free(m->resid);
    free(m->acts);
    free(m->saved);
    free(m->tokens);
    free(m->targets);
    free(m->positions);
    free(m);
}

loom_unit *loom_model_units(loom_model *m, int *count)
{
    *count = m->L + 2;
    return m->units;
}

/* ---- llm.c's order <-> units ---- */

/* Walk every tensor of llm.c's order with its place in the units. */
static void map_params(const loom_model *m, float *const *unit_params, float *llmc, int to_units)
{
    loom_gpt2_shape sh = m->s.shape;
    size_t sizes[LOOM_GPT2_TENSORS];
    loom_gpt2_tensor_sizes(&sh, sizes);
    size_t pos = 0;
    for (int t = 0; t < LOOM_GPT2_TENSORS; t++) {
        /* 0 wte, 1 wpe: unit 0; 2..13: per layer; 14, 15: head */
        int per_layer = t >= 2 && t < 14;
        int layers = per_layer ? m->L : 1;
        size_t n = sizes[t] / (size_t)layers;
        for (int l = 0; l < layers; l++) {
            int unit = t < 2 ? 0 : per_layer ? 1 + l : m->L + 1;
            int local = t < 2 ? t : per_layer ? t - 2 : t - 14;
            float *dst = unit_params[unit] + m->units[unit].tensors[local].offset;
            if (to_units)
                memcpy(dst, llmc + pos, n * sizeof(float));
            else
                memcpy(llmc + pos, dst, n * sizeof(float));
            pos += n;
        }
    }
}

void loom_model_split_params(const loom_model *m, const float *llmc, float *const *unit_params)
{
    map_params(m, unit_params, (float *)(uintptr_t)llmc, 1);
}

void loom_model_join_params(const loom_model *m, float *const *unit_params, float *llmc)
{
    map_params(m, unit_params, llmc, 0);
}

/* ---- precision plumbing ---- */

static const float *unit_params32(loom_model *m, int unit)
{
    loom_unit *u = &m->units[unit];
    if (m->s.dtype == LOOM_F32)
        return u->params;
    float *dst = unit == 0 ? m->emb_param32 : m->param32;
    loom_convert(dst, LOOM_F32, u->params, m->s.dtype, u->numel);
    return dst;
}

/* Where a unit's backward accumulates fp32 gradients: straight into its
 * buffer in fp32 runs, else a zeroed scratch added into the 16-bit buffer by
 * commit_grads. The embedding's scratch stays open from the head's backward
 * (tied wte) until its own. */
static float *unit_grads32(loom_model *m, int unit)
{
    loom_unit *u = &m->units[unit];
    if (m->s.dtype == LOOM_F32)
        return u->grads;
    return unit == 0 ? m->emb_grad32 : m->grad32;
}

static void commit_grads(loom_model *m, int unit)
{
    loom_unit *u = &m->units[unit];
    if (m->s.dtype == LOOM_F32)
        return;
    float *g32 = unit == 0 ? m->emb_grad32 : m->grad32;
    size_t n = u->numel;
    if (m->s.dtype == LOOM_BF16) {
        uint16_t *g = u->grads;
        for (size_t i = 0; i < n; i++)
            g[i] = loom_f32_to_bf16(loom_bf16_to_f32(g[i]) + g32[i]);
    } else {
        uint16_t *g = u->grads;
        for (size_t i = 0; i < n; i++)
            g[i] = loom_f32_to_f16(loom_f16_to_f32(g[i]) + g32[i]);
    }
    memset(g32, 0, n * sizeof(float));
}

static void to_stored(loom_model *m, void *dst, const float *src, size_t n)
{
    loom_convert(dst, m->s.dtype, src, LOOM_F32, n);
}

static void from_stored(loom_model *m, float *dst, const void *src, size_t n)
{
    loom_convert(dst, LOOM_F32, src, m->s.dtype, n);
}

/* ---- blocks ---- */

static const float *tensor(const loom_model *m, int unit, const float *base, int t)
{
    return base + m->units[unit].tensors[t].offset;
}

static float *gtensor(const loom_model *m, int unit, float *base, int t)
{
    return base + m->units[unit].tensors[t].offset;
}

void loom_model_set_ops(loom_model *m, const loom_model_ops *ops) { m->ops = *ops; }

static void record(loom_model *m, int rc)
{
    if (rc != LOOM_OK && m->status == LOOM_OK)
        m->status = rc;
}

/* The attention op: the sequence strategy's if installed, else the CPU
 * kernels over the whole sequence. Forward when dout is NULL. */
static void attention(loom_model *m, block_acts *a, const float *dout, float *dq, float *dk,
                      float *dv, int B, int T, int NH, int HS)
{
    loom_attention at = {B, T, NH, HS, LOOM_F32, m->positions, a->q, a->k, a->v, a->atty,
                         a->lse, dout, dq, dk, dv, &loom_attention_kernels_cpu};
    if (!dout && m->ops.attention_forward)
        record(m, m->ops.attention_forward(m->ops.ctx, &at));
    else if (dout && m->ops.attention_backward)
        record(m, m->ops.attention_backward(m->ops.ctx, &at));
    else if (!dout)
        loom_attention_kernels_cpu.block_forward(a->q, m->positions, T, a->k, a->v, m->positions,
                                                 T, B, NH, HS, LOOM_F32, a->atty, a->lse, 1);
    else
        loom_attention_kernels_cpu.block_backward(a->q, m->positions, T, a->k, a->v,
                                                  m->positions, T, B, NH, HS, LOOM_F32, a->atty,
                                                  dout, a->lse, dq, dk, dv);
}

/* A (rows, cols) fp32 view for the border hooks. */
static loom_tensor view(float *data, int rows, int cols)
{
    loom_tensor t = {data, LOOM_F32, LOOM_MEM_HOST, 2, {rows, cols}, {cols, 1}};
    return t;
}

/* Megatron's f and g and their conjugates, in place on the fp32 buffer. The
 * default is the identity, which a single tensor rank needs. */
typedef int (*border_fn)(void *, loom_region, const loom_tensor *, loom_tensor *);
static void border(loom_model *m, border_fn fn, loom_region region, float *data, int cols)
{
    if (!fn)
        return;
    loom_tensor t = view(data, m->N, cols), out = t;
    record(m, fn(m->ops.ctx, region, &t, &out));
}

/* a->x holds the input; fills every activation and a->out. */
static void block_forward(loom_model *m, int unit, const float *p, block_acts *a)
{
    int N = m->N, C = m->C, B = m->s.batch, T = m->s.seq, NH = m->NH;
    size_t CC = (size_t)C * C;
    const float *qkvw = tensor(m, unit, p, QKVW), *qkvb = tensor(m, unit, p, QKVB);
    loom_layernorm_forward(a->ln1, a->mean1, a->rstd1, a->x, tensor(m, unit, p, LN1W),
                           tensor(m, unit, p, LN1B), N, C);
    border(m, m->ops.region_enter, LOOM_REGION_ATTENTION, a->ln1, C);
    /* QKV as three products so q, k and v land contiguous, heads side by side */
    loom_matmul_forward(a->q, a->ln1, qkvw, qkvb, N, C, C);
    loom_matmul_forward(a->k, a->ln1, qkvw + CC, qkvb + C, N, C, C);
    loom_matmul_forward(a->v, a->ln1, qkvw + 2 * CC, qkvb + 2 * C, N, C, C);
    attention(m, a, NULL, NULL, NULL, NULL, B, T, NH, C / NH);
    float *proj = m->dtmp_a; /* free during forward */
    loom_matmul_forward(proj, a->atty, tensor(m, unit, p, ATTPROJW), tensor(m, unit, p, ATTPROJB),
                        N, C, C);
    border(m, m->ops.region_exit, LOOM_REGION_ATTENTION, proj, C);
    loom_residual_forward(a->res2, a->x, proj, N * C);
    loom_layernorm_forward(a->ln2, a->mean2, a->rstd2, a->res2, tensor(m, unit, p, LN2W),
                           tensor(m, unit, p, LN2B), N, C);
    border(m, m->ops.region_enter, LOOM_REGION_MLP, a->ln2, C);
    loom_matmul_forward(a->fch, a->ln2, tensor(m, unit, p, FCW), tensor(m, unit, p, FCB), N, C,
                        4 * C);
    loom_gelu_forward(a->fch_gelu, a->fch, N * 4 * C);
    loom_matmul_forward(proj, a->fch_gelu, tensor(m, unit, p, FCPROJW),
                        tensor(m, unit, p, FCPROJB), N, 4 * C, C);
    border(m, m->ops.region_exit, LOOM_REGION_MLP, proj, C);
    loom_residual_forward(a->out, a->res2, proj, N * C);
}

/* dresid: gradient of the block's output in, of its input out. */
static void block_backward(loom_model *m, int unit, const float *p, float *g, block_acts *a)
{
    int N = m->N, C = m->C, B = m->s.batch, T = m->s.seq, NH = m->NH;
    size_t NC = (size_t)N * C, CC = (size_t)C * C;
    float *dres2 = m->dtmp_a, *dtmp = m->dtmp_b;
    float *dfch_gelu = m->dwide_a, *dfch = m->dwide_b;
    /* out = res2 + fcproj(...): both get dresid */
    memcpy(dres2, m->dresid, NC * sizeof(float));
    border(m, m->ops.region_exit_backward, LOOM_REGION_MLP, m->dresid, C);
    memset(dfch_gelu, 0, NC * 4 * sizeof(float));
    loom_matmul_backward(dfch_gelu, gtensor(m, unit, g, FCPROJW), gtensor(m, unit, g, FCPROJB),
                         m->dresid, a->fch_gelu, tensor(m, unit, p, FCPROJW), N, 4 * C, C);
    memset(dfch, 0, NC * 4 * sizeof(float));
    loom_gelu_backward(dfch, a->fch, dfch_gelu, N * 4 * C);
    memset(dtmp, 0, NC * sizeof(float));
    loom_matmul_backward(dtmp, gtensor(m, unit, g, FCW), gtensor(m, unit, g, FCB), dfch, a->ln2,
                         tensor(m, unit, p, FCW), N, C, 4 * C);
    border(m, m->ops.region_enter_backward, LOOM_REGION_MLP, dtmp, C);
    loom_layernorm_backward(dres2, gtensor(m, unit, g, LN2W), gtensor(m, unit, g, LN2B), dtmp,
                            a->res2, tensor(m, unit, p, LN2W), a->mean2, a->rstd2, N, C);
    /* res2 = x + attproj(atty): x gets dres2, attention the rest */
    memcpy(m->dresid, dres2, NC * sizeof(float));
    border(m, m->ops.region_exit_backward, LOOM_REGION_ATTENTION, dres2, C);
    float *datty = dtmp;
    memset(datty, 0, NC * sizeof(float));
    loom_matmul_backward(datty, gtensor(m, unit, g, ATTPROJW), gtensor(m, unit, g, ATTPROJB),
                         dres2, a->atty, tensor(m, unit, p, ATTPROJW), N, C, C);
    float *dq = m->dwide_a, *dk = m->dwide_a + NC, *dv = m->dwide_a + 2 * NC;
    memset(m->dwide_a, 0, 3 * NC * sizeof(float));
    attention(m, a, datty, dq, dk, dv, B, T, NH, C / NH);
    float *dln1 = dres2;
    memset(dln1, 0, NC * sizeof(float));
    float *dqkvw = gtensor(m, unit, g, QKVW), *dqkvb = gtensor(m, unit, g, QKVB);
    const float *qkvw = tensor(m, unit, p, QKVW);
    loom_matmul_backward(dln1, dqkvw, dqkvb, dq, a->ln1, qkvw, N, C, C);
    loom_matmul_backward(dln1, dqkvw + CC, dqkvb + C, dk, a->ln1, qkvw + CC, N, C, C);
    loom_matmul_backward(dln1, dqkvw + 2 * CC, dqkvb + 2 * C, dv, a->ln1, qkvw + 2 * CC, N, C, C);
    border(m, m->ops.region_enter_backward, LOOM_REGION_ATTENTION, dln1, C);
    loom_layernorm_backward(m->dresid, gtensor(m, unit, g, LN1W), gtensor(m, unit, g, LN1B), dln1,
                            a->x, tensor(m, unit, p, LN1W), a->mean1, a->rstd1, N, C);
}

/* Saved 16-bit tensors of layer l <-> the fp32 scratch set. */
static void save_block(loom_model *m, int l)
{
    block_saved *sv = &m->saved[l];
    block_acts *a = &m->scratch;
    size_t NC = (size_t)m->N * m->C;
    to_stored(m, sv->ln1, a->ln1, NC);
    to_stored(m, sv->q, a->q, NC);
    to_stored(m, sv->k, a->k, NC);
    to_stored(m, sv->v, a->v, NC);
    to_stored(m, sv->atty, a->atty, NC);
    to_stored(m, sv->res2, a->res2, NC);
    to_stored(m, sv->ln2, a->ln2, NC);
    to_stored(m, sv->fch, a->fch, 4 * NC);
    to_stored(m, sv->fch_gelu, a->fch_gelu, 4 * NC);
    memcpy(sv->mean1, a->mean1, (size_t)m->N * 4);
    memcpy(sv->rstd1, a->rstd1, (size_t)m->N * 4);
    memcpy(sv->mean2, a->mean2, (size_t)m->N * 4);
    memcpy(sv->rstd2, a->rstd2, (size_t)m->N * 4);
    memcpy(sv->lse, a->lse, (size_t)m->s.batch * m->NH * m->s.seq * 4);
}

static void restore_block(loom_model *m, int l)
{
    block_saved *sv = &m->saved[l];
    block_acts *a = &m->scratch;
    size_t NC = (size_t)m->N * m->C;
    from_stored(m, a->ln1, sv->ln1, NC);
    from_stored(m, a->q, sv->q, NC);
    from_stored(m, a->k, sv->k, NC);
    from_stored(m, a->v, sv->v, NC);
    from_stored(m, a->atty, sv->atty, NC);
    from_stored(m, a->res2, sv->res2, NC);
    from_stored(m, a->ln2, sv->ln2, NC);
    from_stored(m, a->fch, sv->fch, 4 * NC);
    from_stored(m, a->fch_gelu, sv->fch_gelu, 4 * NC);
    memcpy(a->mean1, sv->mean1, (size_t)m->N * 4);
    memcpy(a->rstd1, sv->rstd1, (size_t)m->N * 4);
    memcpy(a->mean2, sv->mean2, (size_t)m->N * 4);
    memcpy(a->rstd2, sv->rstd2, (size_t)m->N * 4);
    memcpy(a->lse, sv->lse, (size_t)m->s.batch * m->NH * m->s.seq * 4);
}

/* The input of block l (l == L: the head's input), in fp32. */
static void block_input32(loom_model *m, int l, float *dst)
{
    size_t NC = (size_t)m->N * m->C;
    from_stored(m, dst, l == m->L ? m->head_input : m->saved[l].x, NC);
}

/* ---- units ---- */

static int model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                         float *loss);
static int model_backward(loom_model *m, int unit, float dloss);

int loom_model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                       float *loss)
{
    int rc = model_forward(m, unit, inputs, targets, loss);
    return rc != LOOM_OK ? rc : m->status;
}

static int model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                         float *loss)
{
    int N = m->N, C = m->C, L = m->L;
    size_t NC = (size_t)N * C;
    const float *p = unit_params32(m, unit);
    if (unit == 0) {
        memcpy(m->tokens, inputs, (size_t)N * sizeof(int));
        float *enc = m->inplace ? m->resid[0] : m->scratch.out;
        loom_encoder_forward(enc, m->tokens, NULL, tensor(m, 0, p, 0), tensor(m, 0, p, 1),
                             m->s.batch, m->s.seq, C);
        if (!m->inplace)
            to_stored(m, L > 0 ? m->saved[0].x : m->head_input, enc, NC);
        return LOOM_OK;
    }
    if (unit <= L) {
        int l = unit - 1;
        if (m->inplace) {
            block_forward(m, unit, p, &m->acts[l]);
            return LOOM_OK;
        }
        block_acts *a = &m->scratch;
        block_input32(m, l, a->x);
        block_forward(m, unit, p, a);
        to_stored(m, l + 1 < L ? m->saved[l + 1].x : m->head_input, a->out, NC);
        if (!m->s.recompute)
            save_block(m, l);
        return LOOM_OK;
    }
    /* head: final LayerNorm, tied LM head (wte of unit 0), loss */
    head_acts *h = &m->head;
    memcpy(m->targets, targets, (size_t)N * sizeof(int));
    const float *x;
    if (m->inplace) {
        x = m->resid[L];
    } else {
        block_input32(m, L, m->dtmp_b);
        x = m->dtmp_b;
    }
    loom_layernorm_forward(h->lnf, h->meanf, h->rstdf, x, tensor(m, unit, p, 0),
                           tensor(m, unit, p, 1), N, C);
    const float *wte = tensor(m, 0, unit_params32(m, 0), 0);
    float *logits = h->dlogits; /* free until backward */
    loom_matmul_forward(logits, h->lnf, wte, NULL, N, C, m->Vp);
    loom_softmax_forward(h->probs, logits, N, m->V, m->Vp);
    loom_crossentropy_forward(h->losses, h->probs, m->targets, N, m->Vp);
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += h->losses[i];
    if (loss)
        *loss = (float)(sum / N);
    return LOOM_OK;
}

int loom_model_backward(loom_model *m, int unit, float dloss)
{
    int rc = model_backward(m, unit, dloss);
    return rc != LOOM_OK ? rc : m->status;
}

static int model_backward(loom_model *m, int unit, float dloss)
{
    int N = m->N, C = m->C, L = m->L;
    size_t NC = (size_t)N * C;
    if (unit == L + 1) {
        head_acts *h = &m->head;
        for (int i = 0; i < N; i++)
            m->dlosses[i] = dloss;
        memset(h->dlogits, 0, (size_t)N * m->Vp * sizeof(float));
        loom_crossentropy_softmax_backward(h->dlogits, m->dlosses, h->probs, m->targets, N, m->V,
                                           m->Vp);
        const float *p = unit_params32(m, unit);
        const float *wte = tensor(m, 0, unit_params32(m, 0), 0);
        float *g = unit_grads32(m, unit);
        float *dwte = gtensor(m, 0, unit_grads32(m, 0), 0);
        float *dlnf = m->dtmp_a;
        memset(dlnf, 0, NC * sizeof(float));
        loom_matmul_backward(dlnf, dwte, NULL, h->dlogits, h->lnf, wte, N, C, m->Vp);
        const float *x;
        if (m->inplace) {
            x = m->resid[L];
        } else {
            block_input32(m, L, m->dtmp_b);
            x = m->dtmp_b;
        }
        memset(m->dresid, 0, NC * sizeof(float));
        loom_layernorm_backward(m->dresid, gtensor(m, unit, g, 0), gtensor(m, unit, g, 1), dlnf, x,
                                tensor(m, unit, p, 0), h->meanf, h->rstdf, N, C);
        commit_grads(m, unit);
        return LOOM_OK;
    }
    if (unit >= 1) {
        int l = unit - 1;
        const float *p = unit_params32(m, unit);
        float *g = unit_grads32(m, unit);
        block_acts *a;
        if (m->inplace) {
            a = &m->acts[l];
        } else {
            a = &m->scratch;
            block_input32(m, l, a->x);
            if (m->s.recompute)
                block_forward(m, unit, p, a);
            else
                restore_block(m, l);
        }
        block_backward(m, unit, p, g, a);
        commit_grads(m, unit);
        return LOOM_OK;
    }
    float *g = unit_grads32(m, 0);
    loom_encoder_backward(gtensor(m, 0, g, 0), gtensor(m, 0, g, 1), m->dresid, m->tokens, NULL,
                          m->s.batch, m->s.seq, C);
    commit_grads(m, 0);
    return LOOM_OK;
}

double loom_model_flops_per_token(const loom_model *m)
{
    double params = 0;
    for (int i = 0; i <= m->L + 1; i++)
        params += (double)m->units[i].numel;
    params -= (double)m->maxT * m->C; /* position embeddings do no multiply-adds */
    /* 6 per parameter (forward 2, backward 4) plus attention's QK^T and AV:
     * 6 * 2 * L * T * C per token, halved for the causal mask. */
    return 6.0 * params + 6.0 * m->L * m->s.seq * m->C;
}
