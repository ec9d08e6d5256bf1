/* The GPT-2 model as units, on the run's compute backend (model/compute.h):
 * every buffer the model keeps is the backend's memory, and only the
 * backend's calls read or write it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/formats.h"
#include "model/compute.h"
#include "model/gemm.h"
#include "model/kernel_time.h"
#include "model/model.h"
#include "runtime/log.h"
#include "runtime/memory.h"

/* A kernel call, its time charged to its kind (model/kernel_time.h). */
#define TIMED(kind, ...)                                                                           \
    do {                                                                                           \
        loom_kernel_time_begin(LOOM_KERNEL_##kind);                                                \
        __VA_ARGS__;                                                                               \
        loom_kernel_time_end();                                                                    \
    } while (0)

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

/* The head's activations of one micro-batch. */
typedef struct head_acts {
    float *lnf, *meanf, *rstdf; /* (R, C), (R), (R) */
    float *logits;              /* (N, Vl) fp32; backward writes their gradient over them */
    float *lse;                 /* (N) their log-sum-exp (over the whole vocabulary) */
    float *losses;              /* (N) */
} head_acts;

/* What a unit's input half of backward leaves for its weight half. Blocks:
 * the gradient at the output of each weight, after the tensor-parallel
 * borders, the row-parallel biases' gradients (tp > 1: summed over the
 * rows before the border, which are gone by the weight half), and with
 * recomputation the recomputed activations the weight gradients read. The
 * head: the final LayerNorm's output gradient (its logits' gradient stays
 * in the slot, over the logits). The embedding: its output's gradient. A
 * split backward (zero-bubble schedules) keeps one in its slot, in one
 * allocation; the whole backward uses the model's own (whole), which
 * points into the shared scratch. */
typedef struct deferred {
    void *mem; /* a split backward's allocation; NULL: none in flight */
    float *dfcprojb, *dattprojb;
    float *dmlp, *dfch, *dln2, *datt, *dqkv, *dln1;
    float *ln1, *ln2, *res2, *atty, *fch_gelu, *mean1, *rstd1, *mean2, *rstd2;
    float *dlnf;
    float *dresid;
} deferred;

/* Everything one micro-batch keeps from its forward to its backward, in
 * one allocation of slot_bytes (ACTIVATIONS): the residual streams
 * entering the units (stream[u], for u = 1..L+1 where this rank computes u
 * or u-1; fp32 in place, else the storage dtype), the blocks' and the
 * head's saved tensors, the tokens and targets. */
typedef struct model_slot {
    void *mem; /* NULL: not allocated */
    unsigned char *cover; /* L+2: the units it holds of those the rank runs; NULL: all */
    void **stream;       /* L+2 */
    block_acts *acts;    /* L views (in place) */
    block_saved *saved;  /* L (not in place) */
    head_acts head;
    int *tokens, *targets;
    deferred *deferred;  /* L+2 */
} model_slot;

struct loom_model {
    loom_model_setup s;
    loom_model_layout lay;
    int N, C, L, NH, V, Vp, maxT;
    /* The parallel layout. T: positions held per sequence; R: rows of the
     * residual regions (N, or N/tp with sequence parallelism), the first
     * being row0 of the N; local widths: NHl heads of HS (Cq = NHl·HS of
     * q, k and v), F of the MLP; wte rows [v0, v0+Vl), of which Vreal are
     * real tokens (the rest padding). */
    int tp, tp_rank, seqpar, T, R, row0;
    int NHl, HS, Cq, F, Vl, v0, Vreal;
    int scratch_grads;            /* gradients pass through fp32 scratch (16-bit or parallel) */
    loom_unit *units;
    loom_param_desc *descs;       /* all units' tensor views */
    loom_param_shard *shards;     /* this rank's slice of each, parallel to descs */
    size_t *full_offsets;         /* each tensor's place in the whole unit, parallel to descs */
    size_t *full_numel;           /* per unit */
    int inplace;                  /* fp32 without recomputation */
    unsigned char *runs;          /* L+2: this rank computes the unit */

    model_slot *slots;            /* nslots; the current one is slots[slot] */
    int nslots, slot;
    size_t slot_bytes;

    /* shared by all slots */
    block_acts scratch;           /* the borrowed fp32 set (not inplace) */
    float *rowstat;               /* (3N) the parallel loss's max, sum and target logit */
    float *dresid, *dtmp_a, *dtmp_b, *dwide_a, *dwide_b; /* backward scratch */
    float *gathered, *dfull, *dsmall; /* sequence parallelism's row-gathered and -scattered */
    float *dlosses;
    deferred whole;               /* the whole backward's, in the scratch above */

    /* fp32 copies of 16-bit parameters/gradients while a unit computes */
    float *param32, *grad32, *emb_param32, *emb_grad32;
    void *gemm_scratch;           /* lent to loom_gemm for bf16 products */
    size_t gemm_scratch_bytes;
    loom_model_ops ops;
    const loom_backend *b;        /* where the buffers live and the kernels run */
    int *positions;               /* the global position of each of the T rows of a sequence */
    const int *positions_b;       /* the same in the backend's memory */
    int *row_positions;           /* each residual row's position, in the backend's memory */
    int *row_positions_host;      /* the host array, when the backend reads host memory */
    float *dlosses_host;          /* the head's seed before it goes to dlosses */
    block_acts scratch_own;       /* the scratch set as allocated (recomputation) */
    int status;                   /* the first failure of a parallel op this pass */
    int planning;                 /* loom_model_plan: count what create would allocate */
    uint64_t planned[LOOM_PURPOSE_COUNT];
    void **allocations;
    int nallocations, capallocations;
};

/* ---- buffers ---- */

/* A backend call; its failure becomes the pass's (record). */
#define K(op, ...) record(m, m->b->ops->op(m->b->self, __VA_ARGS__))

static void record(loom_model *m, int rc)
{
    if (rc != LOOM_OK && m->status == LOOM_OK)
        m->status = rc;
}

static loom_tier backend_tier(const loom_model *m) { return (loom_tier)m->b->ops->tier; }

static int bf16_weights(const loom_model *m);

static void *model_alloc(loom_model *m, loom_purpose purpose, size_t bytes)
{
    /* planning: a pointer that is never read, so the callers run unchanged */
    static char planned_buffer;
    if (m->planning) {
        m->planned[purpose] += bytes ? bytes : 1;
        return &planned_buffer;
    }
    void *p = NULL;
    if (loom_mem_alloc(backend_tier(m), purpose, bytes ? bytes : 1, &p) != LOOM_OK)
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
    if (m->b->ops->zero(m->b->self, p, bytes) != LOOM_OK) /* fresh memory: cannot fail but on a broken backend */
        return NULL;
    return p;
}

static float *f32(loom_model *m, size_t n) { return model_alloc(m, LOOM_PURPOSE_ACTIVATIONS, n * 4); }

/* A block's fp32 activations but its input and output, with their
 * lengths, in the order a slot lays them out. */
enum { BLOCK_F32 = 14 };
typedef struct f32_field {
    float **at;
    size_t n;
} f32_field;

static void block_f32_fields(const loom_model *m, block_acts *a, f32_field f[BLOCK_F32])
{
    size_t N = (size_t)m->N, R = (size_t)m->R, RC = R * m->C;
    size_t NCq = N * m->Cq, NF = N * m->F, lse = (size_t)m->s.batch * m->NHl * m->T;
    const f32_field fields[BLOCK_F32] = {
        {&a->ln1, RC},  {&a->mean1, R}, {&a->rstd1, R}, {&a->q, NCq},     {&a->k, NCq},
        {&a->v, NCq},   {&a->atty, NCq}, {&a->lse, lse}, {&a->res2, RC},  {&a->ln2, RC},
        {&a->mean2, R}, {&a->rstd2, R}, {&a->fch, NF},  {&a->fch_gelu, NF}};
    memcpy(f, fields, sizeof fields);
}

/* The scratch set 16-bit and recomputing blocks borrow, one allocation a
 * buffer; 0 when out of memory. */
static int alloc_block_f32(loom_model *m, block_acts *a)
{
    f32_field f[BLOCK_F32];
    block_f32_fields(m, a, f);
    int ok = (a->x = f32(m, (size_t)m->R * m->C)) != NULL;
    for (int i = 0; ok && i < BLOCK_F32; i++)
        ok = (*f[i].at = f32(m, f[i].n)) != NULL;
    return ok;
}

/* ---- slots: one allocation each, carved into buffers ---- */

/* Every buffer of a slot or a deferred set starts on a cache line: its
 * bytes are rounded up to BUFFER_ALIGN (model.h promises this rule). A
 * carver without a base only counts. */
enum { BUFFER_ALIGN = 64 };
typedef struct carver {
    char *base;
    size_t used;
} carver;

static void *carve(carver *c, size_t bytes)
{
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + BUFFER_ALIGN - 1) / BUFFER_ALIGN * BUFFER_ALIGN;
    return p;
}

static float *carve_f32(carver *c, size_t n) { return carve(c, n * sizeof(float)); }

static void *carve_stored(const loom_model *m, carver *c, size_t n)
{
    return carve(c, n * loom_dtype_size(m->s.dtype));
}

/* Whether a slot holds unit u's activations: the rank runs u and the slot
 * was made for it (a pipeline's virtual stages each take their own). */
static int covers(const loom_model *m, const model_slot *s, int u)
{
    return m->runs[u] && (!s->cover || s->cover[u]);
}

/* The residual stream entering unit u, held where the slot holds u or the
 * unit u-1 that produces it. */
static int holds_stream(const loom_model *m, const model_slot *s, int u)
{
    return u >= 1 && u <= m->L + 1 && (covers(m, s, u) || covers(m, s, u - 1));
}

static void layout_slot(const loom_model *m, carver *c, model_slot *s)
{
    size_t N = (size_t)m->N, R = (size_t)m->R, C = (size_t)m->C;
    size_t Cq = (size_t)m->Cq, F = (size_t)m->F, RC = R * C;
    size_t lse = (size_t)m->s.batch * m->NHl * m->T;
    int L = m->L;
    for (int u = 1; u <= L + 1; u++)
        s->stream[u] = !holds_stream(m, s, u) ? NULL : m->inplace ? (void *)carve_f32(c, RC)
                                                              : carve_stored(m, c, RC);
    for (int l = 0; l < L; l++) {
        if (!covers(m, s, 1 + l))
            continue;
        if (m->inplace) {
            block_acts *a = &s->acts[l];
            f32_field f[BLOCK_F32];
            block_f32_fields(m, a, f);
            a->x = s->stream[l + 1];
            a->out = s->stream[l + 2];
            for (int i = 0; i < BLOCK_F32; i++)
                *f[i].at = carve_f32(c, f[i].n);
            continue;
        }
        block_saved *sv = &s->saved[l];
        sv->x = s->stream[l + 1];
        if (m->s.recompute)
            continue;
        sv->ln1 = carve_stored(m, c, RC);
        sv->q = carve_stored(m, c, N * Cq);
        sv->k = carve_stored(m, c, N * Cq);
        sv->v = carve_stored(m, c, N * Cq);
        sv->atty = carve_stored(m, c, N * Cq);
        sv->res2 = carve_stored(m, c, RC);
        sv->ln2 = carve_stored(m, c, RC);
        sv->fch = carve_stored(m, c, N * F);
        sv->fch_gelu = carve_stored(m, c, N * F);
        sv->mean1 = carve_f32(c, R);
        sv->rstd1 = carve_f32(c, R);
        sv->mean2 = carve_f32(c, R);
        sv->rstd2 = carve_f32(c, R);
        sv->lse = carve_f32(c, lse);
    }
    if (covers(m, s, L + 1)) {
        head_acts *h = &s->head;
        h->lnf = carve_f32(c, RC);
        h->meanf = carve_f32(c, R);
        h->rstdf = carve_f32(c, R);
        h->logits = carve_f32(c, N * (size_t)m->Vl);
        h->lse = carve_f32(c, N);
        h->losses = carve_f32(c, N);
        s->targets = carve(c, N * sizeof(int));
    }
    if (covers(m, s, 0))
        s->tokens = carve(c, N * sizeof(int));
}

static void layout_deferred(const loom_model *m, carver *c, deferred *d, int unit)
{
    size_t N = (size_t)m->N, R = (size_t)m->R, C = (size_t)m->C, RC = R * C;
    size_t Cq = (size_t)m->Cq, F = (size_t)m->F;
    if (unit == 0) {
        d->dresid = carve_f32(c, RC);
        return;
    }
    if (unit == m->L + 1) {
        d->dlnf = carve_f32(c, RC);
        return;
    }
    if (m->tp > 1) {
        d->dfcprojb = carve_f32(c, C);
        d->dattprojb = carve_f32(c, C);
    }
    d->dmlp = carve_f32(c, N * C);
    d->dfch = carve_f32(c, N * F);
    d->dln2 = carve_f32(c, RC);
    d->datt = carve_f32(c, N * C);
    d->dqkv = carve_f32(c, 3 * N * Cq);
    d->dln1 = carve_f32(c, RC);
    if (!m->s.recompute)
        return;
    d->ln1 = carve_f32(c, RC);
    d->ln2 = carve_f32(c, RC);
    d->res2 = carve_f32(c, RC);
    d->atty = carve_f32(c, N * Cq);
    d->fch_gelu = carve_f32(c, N * F);
    d->mean1 = carve_f32(c, R);
    d->rstd1 = carve_f32(c, R);
    d->mean2 = carve_f32(c, R);
    d->rstd2 = carve_f32(c, R);
}

static void free_slot(loom_model *m, model_slot *s)
{
    for (int u = 0; s->deferred && u <= m->L + 1; u++)
        loom_mem_free(s->deferred[u].mem);
    loom_mem_free(s->mem);
    free(s->stream);
    free(s->acts);
    free(s->saved);
    free(s->deferred);
    free(s->cover);
    memset(s, 0, sizeof *s);
}

static int alloc_slot(loom_model *m, model_slot *s, const unsigned char *cover)
{
    size_t units = (size_t)m->L + 2;
    s->stream = calloc(units, sizeof *s->stream);
    s->acts = calloc(units, sizeof *s->acts);
    s->saved = calloc(units, sizeof *s->saved);
    s->deferred = calloc(units, sizeof *s->deferred);
    if (cover && (s->cover = malloc(units)) != NULL)
        memcpy(s->cover, cover, units);
    if (!s->stream || !s->acts || !s->saved || !s->deferred || (cover && !s->cover)) {
        free_slot(m, s);
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
    }
    carver c = {NULL, 0};
    layout_slot(m, &c, s);
    int rc = loom_mem_alloc(backend_tier(m), LOOM_PURPOSE_ACTIVATIONS, c.used ? c.used : 1, &s->mem);
    if (rc != LOOM_OK) {
        char cause[768];
        snprintf(cause, sizeof cause, "%s", loom_last_error());
        free_slot(m, s);
        return loom_fail(rc, "model: cannot allocate a micro-batch's activations (%zu bytes); "
                         "fewer micro-batches alive at once, or a smaller micro-batch, fit: %s",
                         c.used, cause);
    }
    if (!cover)
        m->slot_bytes = c.used;
    carver real = {s->mem, 0};
    layout_slot(m, &real, s);
    return LOOM_OK;
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

/* The length of a tensor's split dim, per part. */
static int64_t split_length(const loom_param_desc *d)
{
    if (d->split == LOOM_SPLIT_COLUMNS)
        return d->shape[d->ndim - 1];
    return d->shape[0] / (d->split_parts > 1 ? d->split_parts : 1);
}

/* This rank's slice of one tensor: the tensor strategy's, else even. */
static int shard_tensor(loom_model *m, const loom_param_desc *d, loom_param_shard *sh)
{
    int64_t len = split_length(d);
    sh->begin = 0;
    sh->count = len;
    if (m->tp == 1 || d->split == LOOM_SPLIT_REPLICATED)
        return LOOM_OK;
    if (m->lay.tensor_shard) {
        int rc = m->lay.tensor_shard(m->lay.shard_ctx, d, sh);
        if (rc != LOOM_OK)
            return rc;
    } else {
        if (len % m->tp != 0)
            return loom_fail(LOOM_ERR_INVALID, "model: %s's split dim of %lld does not divide by "
                             "%d tensor ranks", d->name, (long long)len, m->tp);
        sh->count = len / m->tp;
        sh->begin = sh->count * m->tp_rank;
    }
    if (sh->begin < 0 || sh->count <= 0 || sh->begin + sh->count > len)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: the tensor strategy gave %s the slice %lld+%lld of %lld; "
                         "a slice must be non-empty and inside the split dim",
                         d->name, (long long)sh->begin, (long long)sh->count, (long long)len);
    return LOOM_OK;
}

/* Local shapes and offsets from the shards; the whole unit's offsets kept. */
static int localise_unit(loom_model *m, loom_unit *u, loom_param_shard *shards,
                         size_t *full_offsets, size_t *full_numel)
{
    loom_param_desc *d = (loom_param_desc *)(uintptr_t)u->tensors;
    size_t off = 0;
    for (int i = 0; i < u->ntensors; i++) {
        full_offsets[i] = d[i].offset;
        int rc = shard_tensor(m, &d[i], &shards[i]);
        if (rc != LOOM_OK)
            return rc;
        int parts = d[i].split_parts > 1 ? d[i].split_parts : 1;
        if (d[i].split == LOOM_SPLIT_ROWS)
            d[i].local_shape[0] = shards[i].count * parts;
        else if (d[i].split == LOOM_SPLIT_COLUMNS)
            d[i].local_shape[d[i].ndim - 1] = shards[i].count;
        d[i].count = (size_t)d[i].local_shape[0] * (size_t)(d[i].ndim > 1 ? d[i].local_shape[1] : 1);
        d[i].offset = off;
        off += d[i].count;
    }
    *full_numel = u->numel;
    u->numel = off;
    return LOOM_OK;
}

static int same_shard(const loom_param_shard *a, const loom_param_shard *b)
{
    return a->begin == b->begin && a->count == b->count;
}

/* The model computes with the slices, so they must fit together: q, k and
 * v whole heads, the row-parallel inputs the column-parallel outputs. */
static int check_block_shards(const loom_model *m, const loom_param_shard *sh)
{
    const char *bad = NULL;
    if (!same_shard(&sh[QKVW], &sh[QKVB]) || !same_shard(&sh[QKVW], &sh[ATTPROJW]))
        bad = "qkvw, qkvb and attprojw's columns";
    else if (!same_shard(&sh[FCW], &sh[FCB]) || !same_shard(&sh[FCW], &sh[FCPROJW]))
        bad = "fcw, fcb and fcprojw's columns";
    if (bad)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: the tensor strategy split %s differently; they must match", bad);
    int HS = m->C / m->NH;
    if (sh[QKVW].begin % HS || sh[QKVW].count % HS)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: the tensor strategy split qkvw at %lld+%lld, not on whole heads "
                         "of %d channels", (long long)sh[QKVW].begin, (long long)sh[QKVW].count, HS);
    return LOOM_OK;
}

static int build_units(loom_model *m)
{
    int L = m->L, C = m->C;
    int nunits = L + 2;
    int ndescs = 2 + L * BLOCK_TENSORS + 2;
    m->units = calloc((size_t)nunits, sizeof *m->units);
    m->descs = calloc((size_t)ndescs, sizeof *m->descs);
    m->shards = calloc((size_t)ndescs, sizeof *m->shards);
    m->full_offsets = calloc((size_t)ndescs, sizeof *m->full_offsets);
    m->full_numel = calloc((size_t)nunits, sizeof *m->full_numel);
    if (!m->units || !m->descs || !m->shards || !m->full_offsets || !m->full_numel)
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

    size_t first = 0;
    for (int i = 0; i < nunits; i++) {
        m->units[i].compute_dtype = m->s.dtype;
        int rc = localise_unit(m, &m->units[i], m->shards + first, m->full_offsets + first,
                               &m->full_numel[i]);
        if (rc == LOOM_OK && m->units[i].kind == LOOM_UNIT_BLOCK)
            rc = check_block_shards(m, m->shards + first);
        if (rc != LOOM_OK)
            return rc;
        first += (size_t)m->units[i].ntensors;
    }
    /* the widths this rank computes with */
    const loom_param_shard *wte = &m->shards[0];
    m->v0 = (int)wte->begin;
    m->Vl = (int)wte->count;
    m->Vreal = m->V - m->v0 < 0 ? 0 : m->V - m->v0 > m->Vl ? m->Vl : m->V - m->v0;
    m->HS = C / m->NH;
    m->Cq = L > 0 ? (int)m->shards[2 + QKVW].count : C;
    m->F = L > 0 ? (int)m->shards[2 + FCW].count : 4 * C;
    m->NHl = m->Cq / m->HS;
    for (int l = 1; l < L; l++) {
        const loom_param_shard *sh = m->shards + 2 + (size_t)l * BLOCK_TENSORS;
        if (!same_shard(&sh[QKVW], &m->shards[2 + QKVW]) || !same_shard(&sh[FCW], &m->shards[2 + FCW]))
            return loom_fail(LOOM_ERR_INVALID,
                             "model: the tensor strategy split block %d unlike block 0; every "
                             "block must be split the same way", l);
    }
    return LOOM_OK;
}

int loom_model_create(const loom_model_setup *setup, loom_model **out)
{
    return loom_model_create_parallel(setup, NULL, out);
}

/* The model's dimensions, this rank's share of them, and how it keeps its
 * activations. */
static void set_dims(loom_model *m, const loom_model_setup *setup, const loom_model_layout *lay)
{
    const loom_gpt2_shape *sh = &setup->shape;
    int tp = lay->tp_size > 0 ? lay->tp_size : 1;
    m->s = *setup;
    m->lay = *lay;
    m->tp = tp;
    m->tp_rank = lay->tp_rank;
    m->seqpar = tp > 1 && lay->sequence_parallel;
    m->T = lay->positions ? lay->npositions : setup->seq;
    m->N = setup->batch * m->T;
    m->R = m->seqpar ? m->N / tp : m->N;
    m->row0 = m->seqpar ? m->tp_rank * m->R : 0;
    m->C = sh->channels;
    m->L = sh->layers;
    m->NH = sh->heads;
    m->V = sh->vocab;
    m->Vp = sh->padded_vocab;
    m->maxT = sh->max_seq;
    m->inplace = setup->dtype == LOOM_F32 && !setup->recompute;
    m->scratch_grads = setup->dtype != LOOM_F32 || tp > 1 || lay->sp_size > 1;
}

/* Why the setup and layout set_dims took cannot make a model, or LOOM_OK. */
static int check_setup(const loom_model *m)
{
    const loom_model_setup *setup = &m->s;
    const loom_model_layout *lay = &m->lay;
    const loom_gpt2_shape *sh = &setup->shape;
    int tp = m->tp, T = m->T;
    if (setup->dtype != LOOM_F32 && setup->dtype != LOOM_BF16 && setup->dtype != LOOM_F16)
        return loom_fail(LOOM_ERR_INVALID, "model: compute dtype must be f32, bf16 or f16");
    if (sh->channels % sh->heads != 0)
        return loom_fail(LOOM_ERR_INVALID, "model: channels %d do not divide by heads %d",
                         sh->channels, sh->heads);
    if (setup->seq > sh->max_seq)
        return loom_fail(LOOM_ERR_INVALID, "model: train.seq %d exceeds model.max_seq %d",
                         setup->seq, sh->max_seq);
    if (lay->tp_rank < 0 || lay->tp_rank >= tp)
        return loom_fail(LOOM_ERR_INVALID, "model: tp rank %d outside 0..%d", lay->tp_rank,
                         tp - 1);
    if (T <= 0 || T > setup->seq)
        return loom_fail(LOOM_ERR_INVALID, "model: %d positions per sequence of %d", T,
                         setup->seq);
    for (int i = 0; lay->positions && i < T; i++)
        if (lay->positions[i] < 0 || lay->positions[i] >= setup->seq)
            return loom_fail(LOOM_ERR_INVALID, "model: position %d outside the sequence of %d",
                             lay->positions[i], setup->seq);
    if (tp > 1 && lay->sequence_parallel && (setup->batch * T) % tp != 0)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: sequence parallelism splits the %d token rows of a micro-batch "
                         "(%d sequences x %d positions) %d ways, which does not divide",
                         setup->batch * T, setup->batch, T, tp);
    return LOOM_OK;
}

/* The units this rank computes (layout.runs_unit), and the global
 * position of each row of a sequence (layout.positions). */
static int set_runs(loom_model *m)
{
    int nunits = m->L + 2, nrun = 0;
    m->runs = malloc((size_t)nunits);
    m->positions = calloc((size_t)m->T, sizeof *m->positions);
    if (!m->runs || !m->positions)
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
    for (int u = 0; u < nunits; u++)
        nrun += m->runs[u] = !m->lay.runs_unit || m->lay.runs_unit[u];
    if (nrun == 0)
        return loom_fail(LOOM_ERR_INVALID, "model: layout.runs_unit names none of the %d units; "
                         "a rank computes at least one", nunits);
    for (int t = 0; t < m->T; t++)
        m->positions[t] = m->lay.positions ? m->lay.positions[t] : t;
    return LOOM_OK;
}

/* The positions the kernels read, in the backend's memory: those of a
 * sequence's rows, and those of this rank's residual rows (rows are (B, T)
 * flattened; sequence parallelism keeps rows row0 .. row0+R-1 of them).
 * A host-memory backend reads the host arrays themselves. */
static int place_positions(loom_model *m)
{
    int R = m->R;
    int *rows = malloc((size_t)R * sizeof *rows);
    if (!rows)
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
    for (int r = 0; r < R; r++)
        rows[r] = m->positions[(m->row0 + r) % m->T];
    if (backend_tier(m) == LOOM_TIER_HOST) {
        m->positions_b = m->positions;
        m->row_positions = m->row_positions_host = rows;
        return LOOM_OK;
    }
    int *seq = model_alloc(m, LOOM_PURPOSE_OTHER, (size_t)m->T * sizeof(int));
    int *row = model_alloc(m, LOOM_PURPOSE_OTHER, (size_t)R * sizeof(int));
    if (seq && row && !m->planning) {
        K(to_device, seq, m->positions, (size_t)m->T * sizeof(int));
        K(to_device, row, rows, (size_t)R * sizeof(int));
    }
    free(rows);
    if (!seq || !row)
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: cannot allocate the positions: %s",
                         loom_last_error());
    m->positions_b = seq;
    m->row_positions = row;
    return m->status;
}

/* What every slot shares, for the units this rank runs: the fp32 scratch
 * set that 16-bit and recomputing blocks borrow, the backward's scratch
 * (the whole backward's deferred set points into it), and the fp32 copies
 * of 16-bit or parallel parameters and gradients. */
static int alloc_shared(loom_model *m)
{
    size_t N = (size_t)m->N, R = (size_t)m->R, C = (size_t)m->C, L = (size_t)m->L;
    size_t F = (size_t)m->F, wide = 3 * (size_t)m->Cq > F ? 3 * (size_t)m->Cq : F;
    int blocks = 0, embedding = m->runs[0], head = m->runs[L + 1];
    for (size_t u = 1; u <= L; u++)
        blocks |= m->runs[u];
    int ok = 1;
    if (!m->inplace) {
        if (blocks)
            ok = alloc_block_f32(m, &m->scratch);
        if (ok && (blocks || embedding))
            ok = (m->scratch.out = f32(m, R * C)) != NULL;
        m->scratch_own = m->scratch;
    }
    ok = ok && (m->dresid = f32(m, R * C)) && (m->dtmp_a = f32(m, N * C)) &&
         (m->dtmp_b = f32(m, N * C));
    if (ok && blocks)
        ok = (m->dwide_a = f32(m, N * wide)) && (m->dwide_b = f32(m, N * F));
    if (ok && blocks && m->tp > 1)
        ok = (m->whole.dfcprojb = f32(m, C)) != NULL;
    if (ok && head)
        ok = (m->dlosses = f32(m, N)) && (m->dlosses_host = malloc(N * sizeof(float)));
    if (ok && head && m->tp > 1)
        ok = (m->rowstat = f32(m, 3 * N)) != NULL;
    if (ok && m->seqpar)
        ok = (m->gathered = f32(m, N * C)) && (m->dfull = f32(m, N * C)) &&
             (m->dsmall = f32(m, R * C));
    if (ok && bf16_weights(m)) {
        /* the bf16 copies of the f32 operands of the products */
        m->gemm_scratch_bytes = loom_gemm_scratch_bytes(N, wide > C ? wide : C);
        ok = (m->gemm_scratch = model_alloc(m, LOOM_PURPOSE_ACTIVATIONS, m->gemm_scratch_bytes)) != NULL;
        if (ok && !m->planning)
            loom_gemm_lend_scratch(m->gemm_scratch, m->gemm_scratch_bytes);
    }
    if (ok && m->scratch_grads) {
        /* the head reads unit 0's wte, so it needs the embedding's copies too */
        size_t biggest = m->units[1].numel > m->units[L + 1].numel ? m->units[1].numel
                                                                   : m->units[L + 1].numel;
        size_t emb = m->units[0].numel;
        if (m->s.dtype != LOOM_F32) {
            if (blocks || head)
                ok = (m->param32 = model_alloc(m, LOOM_PURPOSE_OTHER, biggest * 4)) != NULL;
            if (ok && (embedding || head))
                ok = (m->emb_param32 = model_alloc(m, LOOM_PURPOSE_OTHER, emb * 4)) != NULL;
        }
        if (ok && (blocks || head))
            ok = (m->grad32 = model_alloc(m, LOOM_PURPOSE_OTHER, biggest * 4)) != NULL;
        if (ok && (embedding || head))
            ok = (m->emb_grad32 = model_alloc(m, LOOM_PURPOSE_OTHER, emb * 4)) != NULL;
    }
    if (!ok) {
        char cause[768];
        snprintf(cause, sizeof cause, "%s", loom_last_error());
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: cannot allocate activations for B=%d T=%d: %s",
                         m->s.batch, m->s.seq, cause);
    }
    return LOOM_OK;
}

/* The whole backward's deferred set, in the shared scratch: a region's
 * gradients after the border in dtmp_a (or sequence parallelism's dfull),
 * its LayerNorm's output gradient in dtmp_b (dsmall), the MLP's and the
 * attention's inner gradients in the wide buffers. The two regions take
 * turns in them, as in the one bias sum. */
static void point_whole(loom_model *m)
{
    deferred *w = &m->whole;
    w->dmlp = w->datt = m->seqpar ? m->dfull : m->dtmp_a;
    w->dln2 = w->dln1 = m->seqpar ? m->dsmall : m->dtmp_b;
    w->dfch = m->dwide_b;
    w->dqkv = m->dwide_a;
    w->dattprojb = w->dfcprojb;
    w->dlnf = m->seqpar ? m->dsmall : m->dtmp_a;
}

static int create(const loom_model_setup *setup, const loom_model_layout *layout, int planning,
                  loom_model **out)
{
    loom_model_layout single;
    memset(&single, 0, sizeof single);
    const loom_model_layout *lay = layout ? layout : &single;
    loom_model *m = calloc(1, sizeof *m);
    if (!m)
        return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
    set_dims(m, setup, lay);
    m->planning = planning;
    m->b = setup->backend ? setup->backend : loom_backend_cpu();
    int rc = m->b ? LOOM_OK : LOOM_ERR_NO_MEMORY;
    if (rc == LOOM_OK && (rc = check_setup(m)) == LOOM_OK && (rc = build_units(m)) == LOOM_OK &&
        (rc = set_runs(m)) == LOOM_OK && (rc = place_positions(m)) == LOOM_OK &&
        (rc = alloc_shared(m)) == LOOM_OK && !planning) {
        point_whole(m);
        /* slot 0 from the start: callers that never name a slot use it */
        rc = loom_model_use_slot(m, 0);
    }
    if (rc != LOOM_OK) {
        loom_model_destroy(m);
        return rc;
    }
    *out = m;
    return LOOM_OK;
}

int loom_model_create_parallel(const loom_model_setup *setup, const loom_model_layout *layout,
                               loom_model **out)
{
    return create(setup, layout, 0, out);
}

int loom_model_plan(const loom_model_setup *setup, const loom_model_layout *layout,
                    loom_model **out)
{
    return create(setup, layout, 1, out);
}

uint64_t loom_model_planned_bytes(const loom_model *m, loom_purpose purpose)
{
    return (unsigned)purpose < LOOM_PURPOSE_COUNT ? m->planned[purpose] : 0;
}

size_t loom_model_slot_bytes_of(const loom_model *m, const unsigned char *units)
{
    model_slot s;
    memset(&s, 0, sizeof s);
    size_t n = (size_t)m->L + 2;
    void **stream = calloc(n, sizeof *stream);
    block_acts *acts = calloc(n, sizeof *acts);
    block_saved *saved = calloc(n, sizeof *saved);
    if (!stream || !acts || !saved) {
        free(stream);
        free(acts);
        free(saved);
        return 0;
    }
    s.cover = (unsigned char *)(uintptr_t)units;
    s.stream = stream;
    s.acts = acts;
    s.saved = saved;
    carver c = {NULL, 0};
    layout_slot(m, &c, &s);
    free(stream);
    free(acts);
    free(saved);
    return c.used ? c.used : 1;
}

void loom_model_destroy(loom_model *m)
{
    if (!m)
        return;
    if (m->gemm_scratch && !m->planning)
        loom_gemm_lend_scratch(NULL, 0);
    for (int i = 0; i < m->nallocations; i++)
        loom_mem_free(m->allocations[i]);
    m->nallocations = 0;
    free(m->allocations);
    free(m->units);
    free(m->descs);
    free(m->shards);
    free(m->full_offsets);
    free(m->full_numel);
    for (int i = 0; i < m->nslots; i++)
        free_slot(m, &m->slots[i]);
    free(m->slots);
    free(m->runs);
    free(m->positions);
    free(m->row_positions_host);
    free(m->dlosses_host);
    free(m);
}

loom_unit *loom_model_units(loom_model *m, int *count)
{
    *count = m->L + 2;
    return m->units;
}

/* ---- llm.c's order <-> units ---- */

/* The first desc of a unit, for the per-desc arrays. */
static size_t first_desc(const loom_model *m, int unit)
{
    return (size_t)(m->units[unit].tensors - m->descs);
}

size_t loom_model_full_numel(const loom_model *m, int unit) { return m->full_numel[unit]; }

const loom_param_shard *loom_model_shards(const loom_model *m, int unit)
{
    return m->shards + first_desc(m, unit);
}

/* One tensor's slice out of its whole layout. Rows of a part are
 * contiguous; columns are strided. */
static void slice_tensor(const loom_param_desc *d, const loom_param_shard *sh, const float *whole,
                         float *local)
{
    int64_t d0 = d->shape[0], d1 = d->ndim > 1 ? d->shape[1] : 1;
    if (d->split == LOOM_SPLIT_ROWS) {
        int parts = d->split_parts > 1 ? d->split_parts : 1;
        int64_t per = d0 / parts;
        for (int p = 0; p < parts; p++)
            memcpy(local + (size_t)(p * sh->count) * (size_t)d1,
                   whole + (size_t)(p * per + sh->begin) * (size_t)d1,
                   (size_t)(sh->count * d1) * sizeof(float));
    } else if (d->split == LOOM_SPLIT_COLUMNS) {
        for (int64_t r = 0; r < d0; r++)
            memcpy(local + (size_t)(r * sh->count), whole + (size_t)(r * d1 + sh->begin),
                   (size_t)sh->count * sizeof(float));
    } else {
        memcpy(local, whole, (size_t)(d0 * d1) * sizeof(float));
    }
}

void loom_model_slice(const loom_model *m, int unit, const float *full, float *local)
{
    const loom_unit *u = &m->units[unit];
    size_t first = first_desc(m, unit);
    for (int i = 0; i < u->ntensors; i++)
        slice_tensor(&u->tensors[i], &m->shards[first + i], full + m->full_offsets[first + i],
                     local + u->tensors[i].offset);
}

/* Walk every tensor of llm.c's order with its place in the whole units. */
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
            float *dst = unit_params[unit] + m->full_offsets[first_desc(m, unit) + (size_t)local];
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
    if (unit >= 1 && unit <= m->L && bf16_weights(m)) {
        /* The products read a block's four matrices as stored (weight());
         * only the LayerNorms and biases (0.2% of it) are wanted in f32. */
        for (int t = 0; t < u->ntensors; t++) {
            const loom_param_desc *d = &u->tensors[t];
            if (t != QKVW && t != ATTPROJW && t != FCW && t != FCPROJW)
                TIMED(CONVERT, K(convert, dst + d->offset, LOOM_F32,
                                 (const uint16_t *)u->params + d->offset, m->s.dtype, d->count));
        }
        return dst;
    }
    TIMED(CONVERT, K(convert, dst, LOOM_F32, u->params, m->s.dtype, u->numel));
    return dst;
}

/* The embedding's fp32 parameters as the encoder reads them: in a 16-bit
 * run only the rows of this micro-batch's tokens, and wpe (converting all
 * of wte, 38.6M elements on GPT-2 124M, took 1-2% of a bf16 step; the LM
 * head, where it multiplies in f32, converts its own). */
static const float *embedding_params32(loom_model *m, const int *tokens)
{
    if (m->s.dtype == LOOM_F32)
        return unit_params32(m, 0);
    const loom_unit *u = &m->units[0];
    const loom_param_desc *wte = &u->tensors[0], *wpe = &u->tensors[1];
    const uint16_t *src = u->params;
    float *dst = m->emb_param32;
    const size_t C = (size_t)m->C;
    loom_kernel_time_begin(LOOM_KERNEL_CONVERT);
    for (int n = 0; n < m->N; n++) {
        const int row = tokens[n] - m->v0;
        if (row >= 0 && row < m->Vl)
            K(convert, dst + wte->offset + (size_t)row * C, LOOM_F32,
              src + wte->offset + (size_t)row * C, m->s.dtype, C);
    }
    K(convert, dst + wpe->offset, LOOM_F32, src + wpe->offset, m->s.dtype, wpe->count);
    loom_kernel_time_end();
    return dst;
}

/* Where a unit's backward accumulates fp32 gradients: straight into its
 * buffer in single-rank fp32 runs, else a zeroed scratch that commit_grads
 * reduces over the parallel groups and adds into the unit's buffer. The
 * embedding's scratch stays open from the head's backward (tied wte)
 * until its own. */
static float *unit_grads32(loom_model *m, int unit)
{
    loom_unit *u = &m->units[unit];
    if (!m->scratch_grads)
        return u->grads;
    return unit == 0 ? m->emb_grad32 : m->grad32;
}

static void commit_grads(loom_model *m, int unit)
{
    loom_unit *u = &m->units[unit];
    if (!m->scratch_grads)
        return;
    float *g32 = unit == 0 ? m->emb_grad32 : m->grad32;
    size_t n = u->numel;
    if (m->ops.reduce_grads)
        TIMED(COMM, record(m, m->ops.reduce_grads(m->ops.ctx, u, g32)));
    if (m->s.dtype == LOOM_F32)
        K(accumulate, u->grads, LOOM_F32, g32, n);
    else /* through f32 and back: a conversion */
        TIMED(CONVERT, K(accumulate, u->grads, m->s.dtype, g32, n));
}

static void to_stored(loom_model *m, void *dst, const float *src, size_t n)
{
    TIMED(CONVERT, K(convert, dst, m->s.dtype, src, LOOM_F32, n));
}

static void from_stored(loom_model *m, float *dst, const void *src, size_t n)
{
    TIMED(CONVERT, K(convert, dst, LOOM_F32, src, m->s.dtype, n));
}

/* ---- blocks ---- */

/* Whether the products read the stored bf16 weights as they are. */
static int bf16_weights(const loom_model *m)
{
    return m->s.dtype == LOOM_BF16 &&
           m->b->ops->multiply_dtype(m->b->self, LOOM_BF16) == LOOM_BF16;
}

/* The weight at w, a tensor in unit's f32 parameters p, as the products
 * read it: the same elements of the stored bf16 parameters in a bf16 run
 * that multiplies in bf16, else w. */
static loom_compute_weight weight(const loom_model *m, int unit, const float *p, const float *w)
{
    if (bf16_weights(m))
        return (loom_compute_weight){(const uint16_t *)m->units[unit].params + (w - p), LOOM_BF16};
    return (loom_compute_weight){w, LOOM_F32};
}

static const float *tensor(const loom_model *m, int unit, const float *base, int t)
{
    return base + m->units[unit].tensors[t].offset;
}

static float *gtensor(const loom_model *m, int unit, float *base, int t)
{
    return base + m->units[unit].tensors[t].offset;
}

void loom_model_set_ops(loom_model *m, const loom_model_ops *ops) { m->ops = *ops; }

/* The attention op: the sequence strategy's if installed (the backend's
 * kernels in its hands), else the backend's over this rank's positions.
 * Forward when dout is NULL. */
static void attention(loom_model *m, block_acts *a, const float *dout, float *dq, float *dk,
                      float *dv)
{
    int B = m->s.batch, T = m->T, NH = m->NHl, HS = m->HS;
    const int *pos = m->positions_b;
    loom_attention at = {B, T, NH, HS, LOOM_F32, m->positions, a->q, a->k, a->v, a->atty,
                         a->lse, dout, dq, dk, dv, loom_backend_attention_kernels(m->b)};
    if (!dout && m->ops.attention_forward)
        record(m, m->ops.attention_forward(m->ops.ctx, &at));
    else if (dout && m->ops.attention_backward)
        record(m, m->ops.attention_backward(m->ops.ctx, &at));
    else if (!dout)
        K(attention_forward, a->q, pos, T, a->k, a->v, pos, T, B, NH, HS, LOOM_F32, a->atty,
          a->lse, 1);
    else
        K(attention_backward, a->q, pos, T, a->k, a->v, pos, T, B, NH, HS, LOOM_F32, a->atty,
          dout, a->lse, dq, dk, dv);
}

/* A (rows, cols) fp32 view for the border hooks. */
static loom_tensor view(const loom_model *m, float *data, int rows, int cols)
{
    loom_tensor t = {data, LOOM_F32, (loom_mem_kind)m->b->ops->mem_kind, 2, {rows, cols},
                     {cols, 1}};
    return t;
}

/* Megatron's f and g and their conjugates. Without sequence parallelism
 * both sides hold the same N rows and the hook works in place (the
 * default is the identity, which a single tensor rank needs); with it, one
 * side holds this rank's R rows and the other all N, in separate buffers.
 * Returns where the result is. */
typedef int (*border_fn)(void *, loom_region, const loom_tensor *, loom_tensor *);
static float *border(loom_model *m, border_fn fn, loom_region region, float *in, int in_rows,
                     float *out, int out_rows, int cols)
{
    if (!m->seqpar)
        out = in;
    if (!fn) {
        if (out != in) /* no tensor strategy: this rank's rows are all there are */
            K(copy, out, in, (size_t)(in_rows < out_rows ? in_rows : out_rows) * cols * sizeof(float));
        return out;
    }
    loom_tensor x = view(m, in, in_rows, cols);
    loom_tensor y = view(m, out, m->seqpar ? out_rows : in_rows, cols);
    TIMED(COMM, record(m, fn(m->ops.ctx, region, &x, &y)));
    return out;
}

/* f in forward (and again in backward, for the weight gradients, where
 * sequence parallelism keeps only this rank's rows): a region's input. */
static float *region_in(loom_model *m, loom_region region, float *x)
{
    return border(m, m->ops.region_enter, region, x, m->R, m->gathered, m->N, m->C);
}

/* g in forward: the partial sums (N, C) -> this rank's rows of the result. */
static float *region_out(loom_model *m, loom_region region, float *partial, float *out)
{
    return border(m, m->ops.region_exit, region, partial, m->N, out, m->R, m->C);
}

/* a->x holds the input; fills every activation and a->out. */
static void block_forward(loom_model *m, int unit, const float *p, block_acts *a)
{
    int N = m->N, R = m->R, C = m->C, Cq = m->Cq, F = m->F;
    size_t CqC = (size_t)Cq * C;
    int split = m->tp > 1; /* row-parallel biases go after the border */
    const float *qkvw = tensor(m, unit, p, QKVW), *qkvb = tensor(m, unit, p, QKVB);
    const float *attprojb = tensor(m, unit, p, ATTPROJB), *fcprojb = tensor(m, unit, p, FCPROJB);
    TIMED(LAYERNORM, K(layernorm_forward, a->ln1, a->mean1, a->rstd1, a->x,
                                            tensor(m, unit, p, LN1W), tensor(m, unit, p, LN1B),
                                            R, C));
    const float *in = region_in(m, LOOM_REGION_ATTENTION, a->ln1);
    /* QKV as three products so q, k and v land contiguous, heads side by side */
    TIMED(MATMUL_FWD, K(matmul_forward, a->q, in, weight(m, unit, p, qkvw), qkvb, N, C, Cq));
    TIMED(MATMUL_FWD,
          K(matmul_forward, a->k, in, weight(m, unit, p, qkvw + CqC), qkvb + Cq, N, C, Cq));
    TIMED(MATMUL_FWD, K(matmul_forward, a->v, in, weight(m, unit, p, qkvw + 2 * CqC),
                                          qkvb + 2 * Cq, N, C, Cq));
    TIMED(ATTENTION, attention(m, a, NULL, NULL, NULL, NULL));
    float *proj = m->dtmp_a; /* free during forward, as is dtmp_b */
    TIMED(MATMUL_FWD,
          K(matmul_forward, proj, a->atty, weight(m, unit, p, tensor(m, unit, p, ATTPROJW)),
                              split ? NULL : attprojb, N, Cq, C));
    float *y = region_out(m, LOOM_REGION_ATTENTION, proj, m->dtmp_b);
    if (split) /* row-parallel biases are added once, after g */
        K(bias_forward, y, attprojb, R, C);
    TIMED(LAYERNORM, K(residual_layernorm_forward, a->res2, a->ln2, a->mean2, a->rstd2, a->x, y,
                                                     tensor(m, unit, p, LN2W),
                                                     tensor(m, unit, p, LN2B), R, C));
    in = region_in(m, LOOM_REGION_MLP, a->ln2);
    TIMED(MATMUL_FWD, K(matmul_forward, a->fch, in, weight(m, unit, p, tensor(m, unit, p, FCW)),
                                          NULL, N, C, F));
    TIMED(GELU, K(bias_gelu_forward, a->fch_gelu, a->fch, tensor(m, unit, p, FCB), N, F));
    TIMED(MATMUL_FWD,
          K(matmul_forward, proj, a->fch_gelu, weight(m, unit, p, tensor(m, unit, p, FCPROJW)),
                              split ? NULL : fcprojb, N, F, C));
    y = region_out(m, LOOM_REGION_MLP, proj, m->dtmp_b);
    if (split)
        K(bias_forward, y, fcprojb, R, C);
    TIMED(RESIDUAL, K(residual_forward, a->out, a->res2, y, R * C));
}

/* ---- a block's backward, region by region ----
 *
 * Each region of a block (the MLP, then attention) goes back in two
 * halves. The input half takes m->dresid, the gradient of the region's
 * output (the residual stream's), to that of its input, and leaves in a
 * deferred set what the weight half reads; the weight half adds the
 * region's parameter gradients. The whole backward runs each region's
 * halves back to back through the shared scratch (m->whole): a whole
 * block's deferred gradients would need one (N, C) buffer more than the
 * scratch has. The split backward runs both input halves into the slot's
 * own set and both weight halves later. The same operations on the same
 * values either way, so the same bits. */

/* g's conjugate: the gradient of a region's output, m->dresid (left as it
 * is: the residual path needs it too), -> dy (N rows). With tp > 1 the
 * row-parallel bias was added after g: its gradient sums the rows before
 * the border, taken here into dbias while they are at hand. */
static void region_out_backward(loom_model *m, loom_region region, float *dbias, float *dy)
{
    int R = m->R, C = m->C;
    if (m->tp > 1) {
        K(zero, dbias, (size_t)C * sizeof(float));
        K(bias_backward, dbias, m->dresid, R, C);
    }
    if (!m->seqpar) /* the border works in place */
        K(copy, dy, m->dresid, (size_t)R * C * sizeof(float));
    border(m, m->ops.region_exit_backward, region, m->seqpar ? m->dresid : dy, R, dy, m->N, C);
}

/* f's conjugate: the gradient of a region's input (N rows in din, which is
 * dln without sequence parallelism) -> of the LayerNorm's output (this
 * rank's rows, dln), then through the LayerNorm added into m->dresid. */
static void layernorm_in_backward(loom_model *m, loom_region region, float *din, float *dln,
                                  const float *x, const float *weight, const float *mean,
                                  const float *rstd)
{
    border(m, m->ops.region_enter_backward, region, din, m->N, dln, m->R, m->C);
    TIMED(LAYERNORM, K(layernorm_backward_input, m->dresid, dln, x, weight, mean, rstd,
                                                   m->R, m->C));
}

/* A region's output projection (weight w, bias b, K inputs per row): its
 * weight gradient, and its bias's, which with tp > 1 the input half summed. */
static void projection_backward_weight(loom_model *m, int unit, float *g, int w, int b,
                                       const float *dbias, const float *dy, const float *in,
                                       int K)
{
    int split = m->tp > 1;
    if (split)
        K(bias_backward, gtensor(m, unit, g, b), dbias, 1, m->C);
    TIMED(MATMUL_DW, K(matmul_backward_weight, gtensor(m, unit, g, w),
                                                 split ? NULL : gtensor(m, unit, g, b), dy, in,
                                                 m->N, K, m->C));
}

/* out = res2 + fcproj(gelu(fc(ln2(res2)))): m->dresid gains the gradient
 * through the MLP. */
static void mlp_backward_input(loom_model *m, int unit, const float *p, const block_acts *a,
                               deferred *d)
{
    int N = m->N, C = m->C, F = m->F;
    size_t NF = (size_t)N * F;
    float *dfch_gelu = m->dwide_a;
    float *din = m->seqpar ? m->dtmp_b : d->dln2;
    region_out_backward(m, LOOM_REGION_MLP, d->dfcprojb, d->dmlp);
    K(zero, dfch_gelu, NF * sizeof(float));
    TIMED(MATMUL_DX, K(matmul_backward_input, dfch_gelu, d->dmlp,
                                                weight(m, unit, p, tensor(m, unit, p, FCPROJW)),
                                                N, F, C));
    K(zero, d->dfch, NF * sizeof(float));
    TIMED(GELU, K(gelu_backward, d->dfch, a->fch, dfch_gelu, N * F));
    K(zero, din, (size_t)N * C * sizeof(float));
    TIMED(MATMUL_DX, K(matmul_backward_input, din, d->dfch,
                                                weight(m, unit, p, tensor(m, unit, p, FCW)), N, C,
                                                F));
    layernorm_in_backward(m, LOOM_REGION_MLP, din, d->dln2, a->res2, tensor(m, unit, p, LN2W),
                          a->mean2, a->rstd2);
}

static void mlp_backward_weight(loom_model *m, int unit, float *g, const block_acts *a,
                                const deferred *d)
{
    projection_backward_weight(m, unit, g, FCPROJW, FCPROJB, d->dfcprojb, d->dmlp, a->fch_gelu,
                               m->F);
    const float *in = region_in(m, LOOM_REGION_MLP, a->ln2);
    TIMED(MATMUL_DW, K(matmul_backward_weight, gtensor(m, unit, g, FCW), gtensor(m, unit, g, FCB),
                                                 d->dfch, in, m->N, m->C, m->F));
    TIMED(LAYERNORM, K(layernorm_backward_weight, gtensor(m, unit, g, LN2W),
                                                    gtensor(m, unit, g, LN2B), d->dln2, a->res2,
                                                    a->mean2, a->rstd2, m->R, m->C));
}

/* res2 = x + attproj(attention(qkv(ln1(x)))): m->dresid gains the
 * gradient through attention. */
static void attention_backward_input(loom_model *m, int unit, const float *p, block_acts *a,
                                     deferred *d)
{
    int N = m->N, C = m->C, Cq = m->Cq;
    size_t NCq = (size_t)N * Cq, CqC = (size_t)Cq * C;
    float *datty = m->dtmp_b;
    float *dq = d->dqkv, *dk = dq + NCq, *dv = dk + NCq;
    region_out_backward(m, LOOM_REGION_ATTENTION, d->dattprojb, d->datt);
    K(zero, datty, NCq * sizeof(float));
    TIMED(MATMUL_DX, K(matmul_backward_input, datty, d->datt,
                                                weight(m, unit, p, tensor(m, unit, p, ATTPROJW)),
                                                N, Cq, C));
    K(zero, d->dqkv, 3 * NCq * sizeof(float));
    TIMED(ATTENTION, attention(m, a, datty, dq, dk, dv));
    const float *qkvw = tensor(m, unit, p, QKVW);
    float *din = m->seqpar ? m->dtmp_b : d->dln1; /* datty is spent */
    K(zero, din, (size_t)N * C * sizeof(float));
    TIMED(MATMUL_DX, K(matmul_backward_input, din, dq, weight(m, unit, p, qkvw), N, C, Cq));
    TIMED(MATMUL_DX,
          K(matmul_backward_input, din, dk, weight(m, unit, p, qkvw + CqC), N, C, Cq));
    TIMED(MATMUL_DX,
          K(matmul_backward_input, din, dv, weight(m, unit, p, qkvw + 2 * CqC), N, C, Cq));
    layernorm_in_backward(m, LOOM_REGION_ATTENTION, din, d->dln1, a->x,
                          tensor(m, unit, p, LN1W), a->mean1, a->rstd1);
}

static void attention_backward_weight(loom_model *m, int unit, float *g, const block_acts *a,
                                      const deferred *d)
{
    int N = m->N, C = m->C, Cq = m->Cq;
    size_t NCq = (size_t)N * Cq, CqC = (size_t)Cq * C;
    projection_backward_weight(m, unit, g, ATTPROJW, ATTPROJB, d->dattprojb, d->datt, a->atty,
                               Cq);
    const float *in = region_in(m, LOOM_REGION_ATTENTION, a->ln1);
    const float *dq = d->dqkv, *dk = dq + NCq, *dv = dk + NCq;
    float *dqkvw = gtensor(m, unit, g, QKVW), *dqkvb = gtensor(m, unit, g, QKVB);
    TIMED(MATMUL_DW, K(matmul_backward_weight, dqkvw, dqkvb, dq, in, N, C, Cq));
    TIMED(MATMUL_DW, K(matmul_backward_weight, dqkvw + CqC, dqkvb + Cq, dk, in, N, C, Cq));
    TIMED(MATMUL_DW, K(matmul_backward_weight, dqkvw + 2 * CqC, dqkvb + 2 * Cq, dv, in,
                                                 N, C, Cq));
    TIMED(LAYERNORM, K(layernorm_backward_weight, gtensor(m, unit, g, LN1W),
                                                    gtensor(m, unit, g, LN1B), d->dln1, a->x,
                                                    a->mean1, a->rstd1, m->R, C));
}

/* Saved 16-bit tensors of layer l <-> the fp32 scratch set (save: scratch
 * to saved). */
static void transfer_block(loom_model *m, int l, int save)
{
    block_saved *sv = &m->slots[m->slot].saved[l];
    block_acts *a = &m->scratch;
    size_t RC = (size_t)m->R * m->C, NCq = (size_t)m->N * m->Cq, NF = (size_t)m->N * m->F;
    struct {
        void *stored;
        float *f32;
        size_t n;
    } t[] = {{sv->ln1, a->ln1, RC},   {sv->q, a->q, NCq},        {sv->k, a->k, NCq},
             {sv->v, a->v, NCq},      {sv->atty, a->atty, NCq},  {sv->res2, a->res2, RC},
             {sv->ln2, a->ln2, RC},   {sv->fch, a->fch, NF},     {sv->fch_gelu, a->fch_gelu, NF}};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(t); i++) {
        if (save)
            to_stored(m, t[i].stored, t[i].f32, t[i].n);
        else
            from_stored(m, t[i].f32, t[i].stored, t[i].n);
    }
}

/* The scratch set computes layer l with that layer's own fp32 buffers for
 * the per-row statistics and lse, so they are never copied (attention also
 * keys what it keeps on the lse buffer); recomputation keeps none and uses
 * the scratch set's own. */
static void lend_saved(loom_model *m, int l)
{
    block_acts *a = &m->scratch;
    const block_acts *own = &m->scratch_own;
    if (m->s.recompute) {
        a->mean1 = own->mean1, a->rstd1 = own->rstd1, a->mean2 = own->mean2;
        a->rstd2 = own->rstd2, a->lse = own->lse;
    } else {
        const block_saved *sv = &m->slots[m->slot].saved[l];
        a->mean1 = sv->mean1, a->rstd1 = sv->rstd1, a->mean2 = sv->mean2;
        a->rstd2 = sv->rstd2, a->lse = sv->lse;
    }
}

/* The input of block l (l == L: the head's input), in fp32. */
static void block_input32(loom_model *m, int l, float *dst)
{
    size_t RC = (size_t)m->R * m->C;
    from_stored(m, dst, m->slots[m->slot].stream[l + 1], RC);
}

/* ---- units ---- */

/* Vocabulary-parallel embedding: this rank's rows of wte for the tokens in
 * its range (zero for the rest), summed over the tensor group by g, then
 * the position embeddings added once, each residual row's own
 * (row_positions: sequence parallelism keeps rows row0 .. row0+R-1). */
static void embed_parallel(loom_model *m, const float *wte, const float *wpe, float *enc)
{
    int N = m->N, C = m->C;
    float *part = m->seqpar ? m->dtmp_a : enc;
    K(embedding_rows_forward, part, m->slots[m->slot].tokens, m->v0, m->Vl, wte, N, C);
    float *x = border(m, m->ops.region_exit, LOOM_REGION_VOCAB, part, N, enc, m->R, C);
    K(position_forward, x, wpe, m->row_positions, m->R, C);
}

static void embed_parallel_backward(loom_model *m, float *dwte, float *dwpe, float *dresid)
{
    int N = m->N, C = m->C;
    K(position_backward, dwpe, dresid, m->row_positions, m->R, C);
    const float *d = border(m, m->ops.region_exit_backward, LOOM_REGION_VOCAB, dresid, m->R,
                            m->dfull, N, C);
    K(embedding_rows_backward, dwte, d, m->slots[m->slot].tokens, m->v0, m->Vl, N, C);
}

static void vocab_reduce(loom_model *m, float *data, size_t count, loom_redop op)
{
    if (m->ops.vocab_reduce)
        TIMED(COMM, record(m, m->ops.vocab_reduce(m->ops.ctx, data, count, op)));
}

/* The vocabulary-parallel cross-entropy: each rank has the logits of its
 * Vl rows of the vocabulary for every token. The softmax's row max and
 * sum of exponentials, and the target's logit, are reduced over the
 * tensor group (3 floats per token), never the logits; each row's
 * log-sum-exp over the whole vocabulary is kept for backward. */
static void parallel_loss(loom_model *m)
{
    const model_slot *slot = &m->slots[m->slot];
    const head_acts *h = &slot->head;
    int N = m->N, Vl = m->Vl, Vr = m->Vreal;
    float *mx = m->rowstat, *sum = mx + N, *tgt = sum + N;
    K(crossentropy_slice_max, mx, h->logits, N, Vl, Vr);
    vocab_reduce(m, mx, (size_t)N, LOOM_MAX);
    K(crossentropy_slice_sums, sum, tgt, h->logits, mx, slot->targets, m->v0, N, Vl, Vr);
    vocab_reduce(m, sum, 2 * (size_t)N, LOOM_SUM);
    K(crossentropy_slice_finish, h->lse, h->losses, mx, sum, tgt, N);
}

/* The logits' gradient over them, this rank's columns of (softmax -
 * one-hot)·dloss; the padding's 0. */
static void parallel_loss_backward(loom_model *m)
{
    const model_slot *s = &m->slots[m->slot];
    K(crossentropy_slice_backward, s->head.logits, m->dlosses, s->head.lse, s->targets, m->v0,
      m->N, m->Vl, m->Vreal);
}

/* The head's input, fp32: in place, or converted into dtmp_b. */
/* The LM head's weight, the tied wte of unit 0: its stored bf16 as it is
 * (no f32 copy of the whole embedding), or its f32 parameters. */
static loom_compute_weight head_weight(loom_model *m)
{
    if (bf16_weights(m))
        return (loom_compute_weight){m->units[0].params, LOOM_BF16};
    return (loom_compute_weight){tensor(m, 0, unit_params32(m, 0), 0), LOOM_F32};
}

static const float *head_input32(loom_model *m)
{
    if (m->inplace)
        return m->slots[m->slot].stream[m->L + 1];
    block_input32(m, m->L, m->dtmp_b);
    return m->dtmp_b;
}

static int model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                         float *loss)
{
    int N = m->N, R = m->R, C = m->C, L = m->L;
    size_t RC = (size_t)R * C;
    model_slot *s = &m->slots[m->slot];
    const float *p = unit == 0 ? embedding_params32(m, inputs) : unit_params32(m, unit);
    if (unit == 0) {
        K(to_device, s->tokens, inputs, (size_t)N * sizeof(int));
        float *enc = m->inplace ? s->stream[1] : m->scratch.out;
        if (m->tp > 1)
            TIMED(ENCODER, embed_parallel(m, tensor(m, 0, p, 0), tensor(m, 0, p, 1), enc));
        else
            TIMED(ENCODER, K(encoder_forward, enc, s->tokens,
                                                m->lay.positions ? m->positions_b : NULL,
                                                tensor(m, 0, p, 0), tensor(m, 0, p, 1), m->s.batch,
                                                m->T, C));
        if (!m->inplace)
            to_stored(m, s->stream[1], enc, RC);
        return LOOM_OK;
    }
    if (unit <= L) {
        int l = unit - 1;
        if (m->inplace) {
            block_forward(m, unit, p, &s->acts[l]);
            return LOOM_OK;
        }
        block_acts *a = &m->scratch;
        block_input32(m, l, a->x);
        lend_saved(m, l);
        block_forward(m, unit, p, a);
        to_stored(m, s->stream[l + 2], a->out, RC);
        if (!m->s.recompute)
            transfer_block(m, l, 1);
        return LOOM_OK;
    }
    /* head: final LayerNorm, tied LM head (wte of unit 0), loss */
    head_acts *h = &s->head;
    K(to_device, s->targets, targets, (size_t)N * sizeof(int));
    const float *x = head_input32(m);
    TIMED(LAYERNORM, K(layernorm_forward, h->lnf, h->meanf, h->rstdf, x, tensor(m, unit, p, 0),
                                            tensor(m, unit, p, 1), R, C));
    const float *in = region_in(m, LOOM_REGION_VOCAB, h->lnf);
    TIMED(LM_HEAD, K(matmul_forward, h->logits, in, head_weight(m), NULL, N, C, m->Vl));
    loom_kernel_time_begin(LOOM_KERNEL_CROSSENTROPY);
    if (m->tp > 1)
        parallel_loss(m);
    else
        K(crossentropy_forward, h->losses, h->lse, h->logits, s->targets, N, m->V,
                                          m->Vp);
    loom_kernel_time_end();
    if (loss)
        K(mean, h->losses, (size_t)N, loss);
    return LOOM_OK;
}

/* ---- backward, unit by unit ---- */

/* The logits' gradient, over the slot's logits, for a gradient of dloss
 * on each token's loss. */
static void loss_backward(loom_model *m, float dloss)
{
    const model_slot *s = &m->slots[m->slot];
    int N = m->N;
    for (int i = 0; i < N; i++)
        m->dlosses_host[i] = dloss;
    K(to_device, m->dlosses, m->dlosses_host, (size_t)N * sizeof(float));
    if (m->tp > 1)
        TIMED(CROSSENTROPY, parallel_loss_backward(m));
    else
        TIMED(CROSSENTROPY, K(crossentropy_backward, s->head.logits, m->dlosses,
                                                               s->head.lse, s->targets, N, m->V,
                                                               m->Vp));
}

/* The head's input half, x its input: through the tied LM head and the
 * final LayerNorm, which starts the stream gradient. */
static void head_backward_input(loom_model *m, const float *x, deferred *d)
{
    int N = m->N, C = m->C, unit = m->L + 1;
    const head_acts *h = &m->slots[m->slot].head;
    const float *p = unit_params32(m, unit);
    float *din = m->seqpar ? m->dtmp_a : d->dlnf;
    K(zero, din, (size_t)N * C * sizeof(float));
    TIMED(LM_HEAD, K(matmul_backward_input, din, h->logits, head_weight(m), N, C, m->Vl));
    K(zero, m->dresid, (size_t)m->R * C * sizeof(float));
    layernorm_in_backward(m, LOOM_REGION_VOCAB, din, d->dlnf, x, tensor(m, unit, p, 0), h->meanf,
                          h->rstdf);
}

/* The head's weight half: the tied wte's share of unit 0's gradient, and
 * the final LayerNorm's. */
static void head_backward_weight(loom_model *m, const float *x, const deferred *d)
{
    int N = m->N, C = m->C, unit = m->L + 1;
    const head_acts *h = &m->slots[m->slot].head;
    const float *in = region_in(m, LOOM_REGION_VOCAB, h->lnf);
    TIMED(LM_HEAD, K(matmul_backward_weight, gtensor(m, 0, unit_grads32(m, 0), 0), NULL,
                                               h->logits, in, N, C, m->Vl));
    float *g = unit_grads32(m, unit);
    TIMED(LAYERNORM, K(layernorm_backward_weight, gtensor(m, unit, g, 0), gtensor(m, unit, g, 1),
                                                    d->dlnf, x, h->meanf, h->rstdf, m->R, C));
    commit_grads(m, unit);
    /* wte's share goes to unit 0's grads now when this rank does not run
     * the embedding (the pipeline's copy of unit 0 on the last stage);
     * else the embedding's backward commits both shares */
    if (!m->runs[0])
        commit_grads(m, 0);
}

/* The embedding has only a weight half: wte and wpe from dout, the
 * gradient of its output. */
static void embedding_backward_weight(loom_model *m, float *dout)
{
    const model_slot *s = &m->slots[m->slot];
    float *g = unit_grads32(m, 0);
    if (m->tp > 1)
        TIMED(ENCODER, embed_parallel_backward(m, gtensor(m, 0, g, 0), gtensor(m, 0, g, 1), dout));
    else
        TIMED(ENCODER, K(encoder_backward, gtensor(m, 0, g, 0), gtensor(m, 0, g, 1), dout,
                                             s->tokens, m->lay.positions ? m->positions_b : NULL,
                                             m->s.batch, m->T, m->C));
    commit_grads(m, 0);
}

/* The activations a block's backward reads: in place, or in the borrowed
 * scratch set, recomputed (p: the block's parameters) or loaded from the
 * slot's saved copies. */
static block_acts *backward_acts(loom_model *m, int unit, const float *p)
{
    int l = unit - 1;
    if (m->inplace)
        return &m->slots[m->slot].acts[l];
    block_acts *a = &m->scratch;
    block_input32(m, l, a->x);
    lend_saved(m, l);
    if (m->s.recompute)
        block_forward(m, unit, p, a);
    else
        transfer_block(m, l, 0);
    return a;
}

/* With recomputation the scratch set is another unit's by the weight
 * half: the input half keeps what the weight half reads of it. */
static void keep_recomputed(loom_model *m, const block_acts *a, deferred *d)
{
    size_t R = (size_t)m->R, RC = R * m->C, NCq = (size_t)m->N * m->Cq;
    size_t NF = (size_t)m->N * m->F;
    K(copy, d->ln1, a->ln1, RC * sizeof(float));
    K(copy, d->ln2, a->ln2, RC * sizeof(float));
    K(copy, d->res2, a->res2, RC * sizeof(float));
    K(copy, d->atty, a->atty, NCq * sizeof(float));
    K(copy, d->fch_gelu, a->fch_gelu, NF * sizeof(float));
    K(copy, d->mean1, a->mean1, R * sizeof(float));
    K(copy, d->rstd1, a->rstd1, R * sizeof(float));
    K(copy, d->mean2, a->mean2, R * sizeof(float));
    K(copy, d->rstd2, a->rstd2, R * sizeof(float));
}

/* ... and the weight half reads those, and the block's input. */
static block_acts *kept_acts(loom_model *m, int unit, const deferred *d, block_acts *kept)
{
    memset(kept, 0, sizeof *kept);
    kept->x = m->scratch.x;
    block_input32(m, unit - 1, kept->x);
    kept->ln1 = d->ln1, kept->ln2 = d->ln2, kept->res2 = d->res2, kept->atty = d->atty;
    kept->fch_gelu = d->fch_gelu, kept->mean1 = d->mean1, kept->rstd1 = d->rstd1;
    kept->mean2 = d->mean2, kept->rstd2 = d->rstd2;
    return kept;
}

/* The whole backward of a unit: its halves back to back (a block's region
 * by region) through the model's own deferred set. */
static void unit_backward(loom_model *m, int unit, float dloss)
{
    deferred *w = &m->whole;
    if (unit == m->L + 1) {
        loss_backward(m, dloss);
        const float *x = head_input32(m);
        head_backward_input(m, x, w);
        head_backward_weight(m, x, w);
    } else if (unit >= 1) {
        const float *p = unit_params32(m, unit);
        block_acts *a = backward_acts(m, unit, p);
        float *g = unit_grads32(m, unit);
        mlp_backward_input(m, unit, p, a, w);
        mlp_backward_weight(m, unit, g, a, w);
        attention_backward_input(m, unit, p, a, w);
        attention_backward_weight(m, unit, g, a, w);
        commit_grads(m, unit);
    } else {
        embedding_backward_weight(m, m->dresid);
    }
}

/* The input half of a split backward, into the slot's deferred set d. */
static void unit_backward_input(loom_model *m, int unit, float dloss, deferred *d)
{
    if (unit == m->L + 1) {
        loss_backward(m, dloss);
        head_backward_input(m, head_input32(m), d);
    } else if (unit >= 1) {
        const float *p = unit_params32(m, unit);
        block_acts *a = backward_acts(m, unit, p);
        mlp_backward_input(m, unit, p, a, d);
        attention_backward_input(m, unit, p, a, d);
        if (m->s.recompute)
            keep_recomputed(m, a, d);
    } else { /* nothing flows further back: keep the gradient */
        K(copy, d->dresid, m->dresid, (size_t)m->R * m->C * sizeof(float));
    }
}

/* Its weight half. What other slots' units may have overwritten since is
 * got again: the head's input, a block's activations. */
static void unit_backward_weight(loom_model *m, int unit, const deferred *d)
{
    if (unit == m->L + 1) {
        head_backward_weight(m, head_input32(m), d);
    } else if (unit >= 1) {
        block_acts kept;
        block_acts *a = m->s.recompute ? kept_acts(m, unit, d, &kept)
                                       : backward_acts(m, unit, NULL);
        float *g = unit_grads32(m, unit);
        mlp_backward_weight(m, unit, g, a, d);
        attention_backward_weight(m, unit, g, a, d);
        commit_grads(m, unit);
    } else {
        embedding_backward_weight(m, d->dresid);
    }
}

/* Why a unit cannot run now, or LOOM_OK. */
static int check_unit(const loom_model *m, int unit, const char *what)
{
    if (unit < 0 || unit > m->L + 1)
        return loom_fail(LOOM_ERR_INVALID, "model: %s of unit %d, outside 0..%d", what, unit,
                         m->L + 1);
    if (!m->runs[unit])
        return loom_fail(LOOM_ERR_INVALID,
                         "model: %s of unit %d, which this rank does not compute "
                         "(loom_model_layout.runs_unit)", what, unit);
    if (m->slot < 0 || !m->slots[m->slot].mem)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: %s of unit %d with no slot in use; call loom_model_use_slot "
                         "first", what, unit);
    if (!covers(m, &m->slots[m->slot], unit))
        return loom_fail(LOOM_ERR_INVALID,
                         "model: %s of unit %d in slot %d, which was made for other units "
                         "(loom_model_use_slot_units)", what, unit, m->slot);
    return LOOM_OK;
}

/* The model's status after a unit's work: a product that failed inside it
 * (gemm.h) is the model's failure too. */
static int unit_status(loom_model *m)
{
    record(m, m->b->ops->status(m->b->self));
    return m->status;
}

int loom_model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                       float *loss)
{
    int rc = check_unit(m, unit, "forward");
    if (rc == LOOM_OK)
        TIMED(OTHER, rc = model_forward(m, unit, inputs, targets, loss));
    return rc != LOOM_OK ? rc : unit_status(m);
}

int loom_model_logits(loom_model *m, int row, float *out)
{
    if (m->tp > 1 || row < 0 || row >= m->N || m->slot < 0 || m->slot >= m->nslots ||
        !m->slots[m->slot].mem || !covers(m, &m->slots[m->slot], m->L + 1))
        return loom_fail(LOOM_ERR_INVALID,
                         "model: no logits of row %d here (a tensor axis of more than one rank, "
                         "a slot without the head, or a row outside 0..%d)", row, m->N - 1);
    const float *logits = m->slots[m->slot].head.logits + (size_t)row * m->Vp;
    int rc = m->b->ops->to_host(m->b->self, out, logits, (size_t)m->Vp * sizeof(float));
    return rc != LOOM_OK ? rc : m->b->ops->status(m->b->self);
}

int loom_model_backward(loom_model *m, int unit, float dloss)
{
    int rc = check_unit(m, unit, "backward");
    if (rc == LOOM_OK)
        TIMED(OTHER, unit_backward(m, unit, dloss));
    return rc != LOOM_OK ? rc : unit_status(m);
}

int loom_model_backward_input(loom_model *m, int unit, float dloss)
{
    int rc = check_unit(m, unit, "backward_input");
    if (rc != LOOM_OK)
        return rc;
    deferred *d = &m->slots[m->slot].deferred[unit];
    if (d->mem)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: backward_input of unit %d in slot %d twice without its "
                         "backward_weight", unit, m->slot);
    rc = loom_mem_alloc(backend_tier(m), LOOM_PURPOSE_ACTIVATIONS,
                        loom_model_deferred_bytes(m, unit), &d->mem);
    if (rc != LOOM_OK)
        return rc;
    carver c = {d->mem, 0};
    layout_deferred(m, &c, d, unit);
    TIMED(OTHER, unit_backward_input(m, unit, dloss, d));
    return unit_status(m);
}

int loom_model_backward_weight(loom_model *m, int unit)
{
    int rc = check_unit(m, unit, "backward_weight");
    if (rc != LOOM_OK)
        return rc;
    deferred *d = &m->slots[m->slot].deferred[unit];
    if (!d->mem)
        return loom_fail(LOOM_ERR_INVALID,
                         "model: backward_weight of unit %d in slot %d without its "
                         "backward_input first", unit, m->slot);
    TIMED(OTHER, unit_backward_weight(m, unit, d));
    loom_mem_free(d->mem);
    memset(d, 0, sizeof *d);
    return unit_status(m);
}

/* ---- micro-batch slots and stage borders ---- */

int loom_model_use_slot(loom_model *m, int slot) { return loom_model_use_slot_units(m, slot, NULL); }

int loom_model_use_slot_units(loom_model *m, int slot, const unsigned char *units)
{
    if (slot < 0)
        return loom_fail(LOOM_ERR_INVALID, "model: slot %d; slots are numbered from 0", slot);
    if (slot >= m->nslots) {
        int n = slot + 1 > 2 * m->nslots ? slot + 1 : 2 * m->nslots;
        model_slot *grown = realloc(m->slots, (size_t)n * sizeof *grown);
        if (!grown)
            return loom_fail(LOOM_ERR_NO_MEMORY, "model: out of memory");
        memset(grown + m->nslots, 0, (size_t)(n - m->nslots) * sizeof *grown);
        m->slots = grown;
        m->nslots = n;
    }
    int rc = m->slots[slot].mem ? LOOM_OK : alloc_slot(m, &m->slots[slot], units);
    if (rc == LOOM_OK)
        m->slot = slot;
    return rc;
}

void loom_model_release_slot(loom_model *m, int slot)
{
    if (slot >= 0 && slot < m->nslots)
        free_slot(m, &m->slots[slot]);
}

size_t loom_model_slot_bytes(const loom_model *m) { return m->slot_bytes; }

size_t loom_model_deferred_bytes(const loom_model *m, int unit)
{
    deferred d;
    carver c = {NULL, 0};
    layout_deferred(m, &c, &d, unit);
    return c.used;
}

void *loom_model_stream(loom_model *m, int unit, size_t *count, loom_dtype *dtype)
{
    if (count)
        *count = (size_t)m->R * m->C;
    if (dtype)
        *dtype = m->inplace ? LOOM_F32 : m->s.dtype;
    if (m->slot < 0 || m->slot >= m->nslots || !m->slots[m->slot].mem ||
        !holds_stream(m, &m->slots[m->slot], unit))
        return NULL;
    return m->slots[m->slot].stream[unit];
}

float *loom_model_stream_grad(loom_model *m, size_t *count)
{
    if (count)
        *count = (size_t)m->R * m->C;
    return m->dresid;
}

double loom_model_flops_per_token(const loom_model *m)
{
    double params = 0;
    for (int i = 0; i <= m->L + 1; i++)
        params += (double)m->full_numel[i];
    params -= (double)m->maxT * m->C; /* position embeddings do no multiply-adds */
    /* 6 per parameter (forward 2, backward 4) plus attention's QK^T and AV:
     * 6 * 2 * L * T * C per token, halved for the causal mask. */
    return 6.0 * params + 6.0 * m->L * m->s.seq * m->C;
}
