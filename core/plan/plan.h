/* loom plan — a job's memory, traffic and step time on a
 * cluster, predicted before it runs.
 *
 * Three parts, each usable alone:
 *   - the job (loom_plan_job): a model by shape, the global batch, the
 *     mesh and its strategies, read from the same config `loom train`
 *     reads (plan_job.c);
 *   - the cluster (loom_plan_cluster): ranks per node, memory, peak rates,
 *     links, read from a libconfig cluster file (plan_cluster.c);
 *   - the plan (loom_plan): per pipeline rank, the bytes by tier and purpose
 *     at their peaks, the bytes each axis moves per step by collective, the
 *     compute, and from those the step time (plan.c, plan_time.c).
 *
 * For GPT-2 (model.kind = "gpt2", what loom trains) the memory is loom's
 * own layout, to the byte: the model's buffers as the model lays them out
 * (loom_model_plan), the shipped strategies' buffers as they allocate
 * them (ZeRO's padding included). For the shapes loom plans but does not
 * train (model.kind = "llama") it is the published accounting: ZeRO's
 * model states and Korthikanti et al.'s activation table. */
#ifndef LOOM_PLAN_PLAN_H
#define LOOM_PLAN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/tensor.h"
#include "runtime/config.h"
#include "runtime/mesh.h"
#include "runtime/tier.h"

/* ---- the model and the job ---- */

typedef enum loom_plan_kind {
    LOOM_PLAN_GPT2 = 0,  /* pre-LayerNorm, GELU MLP of 4C, biases, wte tied to the head */
    LOOM_PLAN_LLAMA = 1, /* RMSNorm, grouped-query attention, SwiGLU MLP of `ffn`, no
                            biases, an untied output matrix */
} loom_plan_kind;

typedef struct loom_plan_shape {
    loom_plan_kind kind;
    int layers, heads, kv_heads; /* kv_heads = heads without grouped-query attention */
    int channels;                /* hidden size h */
    int ffn;                     /* MLP width (GPT-2: 4C) */
    int vocab, padded_vocab, max_seq;
} loom_plan_shape;

typedef struct loom_plan_job {
    loom_plan_shape shape;
    int batch;        /* global batch, in sequences */
    int seq;          /* tokens per sequence */
    int grad_accum;   /* micro-batches per step per dp rank (pp: parallel.pp.microbatches) */
    int micro_batch;  /* sequences per micro-batch per dp rank */
    loom_dtype dtype; /* f32, bf16, f16 */
    int recompute;    /* 1: train.recompute = "block", each block keeps only its input */
    int sizes[LOOM_AXIS_COUNT]; /* tp, sp, pp, dp */
    char dp_strategy[32];       /* ddp, zero1, zero2, zero3, diloco */
    int prefetch;               /* zero3: units gathered ahead */
    double bucket_mb;           /* ddp: gradient bytes per all-reduce bucket, MiB */
    int sync_every;             /* diloco: steps between two syncs of the weights */
    int shard_size;             /* zero3 HSDP: ranks a shard group; 0 = dp */
    int sequence_parallel;      /* Megatron's, on the tp axis */
    char sp_strategy[32];       /* ulysses, ring */
    char schedule[32];          /* gpipe, 1f1b, interleaved, zb-h1 */
    int virtual_stages;
    int microbatches;           /* pp: micro-batches per step */
    int *stage_first, *stage_last; /* [pp × virtual_stages] units of each stage (0..L+1) */
    loom_offload offload[LOOM_PURPOSE_COUNT]; /* memory.offload: where each purpose is kept */
    int nvme_queue_depth;       /* memory.offload.queue_depth (offload-nvme's) */
    uint64_t nvme_block_bytes;  /* memory.offload.block_bytes */
    char device[32];            /* model.device as set: "cpu", "auto", a compute plugin */
    /* The model's buffers live in the device tier (model.device names a
     * backend of its own memory): set by whoever resolves device, as
     * loom_backend_tier does; 0: host memory. */
    int device_resident;
} loom_plan_job;

/* The job a config describes (the settings `loom train` reads, checked the
 * same way), or a one-line refusal naming the setting. */
int loom_plan_job_read(loom_config *cfg, loom_plan_job *out);
void loom_plan_job_free(loom_plan_job *job);

/* ---- the cluster ---- */

/* A link class: latency per message and bandwidth per rank (each
 * direction), the alpha and 1/beta of the alpha-beta model. */
typedef struct loom_plan_link {
    double latency_s;
    double bytes_per_s;
} loom_plan_link;

/* A collective measured on this cluster (`loom plan --calibrate`):
 * seconds = latency_s + bytes / bytes_per_s at `ranks` ranks inside a
 * node, bytes being the payload as the comm counters count it. Measured
 * figures replace the link model for that op inside a node. */
typedef struct loom_plan_measured {
    int ranks;
    double latency_s, bytes_per_s;
} loom_plan_measured;

enum { LOOM_PLAN_MEASURED_MAX = 8 };

typedef struct loom_plan_cluster {
    char name[128];
    char path[512];            /* the file it came from ("" built in) */
    int nodes;                 /* 0: as many as the mesh needs */
    int ranks_per_node;        /* GPUs, or CPU ranks */
    int device;                /* 1: ranks compute on devices (GPUs); 0: on host cores */
    double device_bytes;       /* memory per device (0 when device = 0) */
    double host_bytes;         /* host memory per node */
    double flops[LOOM_DTYPE_COUNT]; /* peak FLOP/s per rank by compute dtype (GEMMs) */
    double memory_bytes_per_s; /* per rank: the roof of the non-GEMM kernels */
    loom_plan_link intra;      /* inside a node: NVLink, PCIe, shared memory */
    loom_plan_link inter;      /* across nodes: InfiniBand, Ethernet (per rank) */
    double nvme_bytes_per_s;   /* per node; 0: no NVMe tier */
    loom_plan_measured measured[LOOM_OP_COUNT][LOOM_PLAN_MEASURED_MAX];
    int nmeasured[LOOM_OP_COUNT];
} loom_plan_cluster;

/* A cluster file (examples/clusters/), refused with file:line and what to
 * do when a field is missing or out of range. */
int loom_plan_cluster_read(const char *path, loom_plan_cluster *out);
/* Write it back (what --calibrate produces), with a comment per field. */
int loom_plan_cluster_write(const loom_plan_cluster *c, const char *path);

/* ---- the plan ---- */

/* One collective kind a rank issues per step on one axis. */
typedef struct loom_plan_comm {
    uint64_t bytes;  /* payload as the comm counters count it, all calls */
    uint64_t calls;
    double seconds;  /* predicted time of all calls on the cluster */
    double exposed_s; /* of which the step waits for (not hidden behind compute) */
} loom_plan_comm;

/* One pipeline rank (every tp, sp and dp rank of a stage plans alike). */
typedef struct loom_plan_rank {
    int units_first, units_last; /* its first stage's units (virtual stages: see job) */
    /* peak bytes by tier and purpose over a step, as the accounting's
     * peak_bytes reports them */
    uint64_t peak[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t total[LOOM_TIER_COUNT]; /* sum of the peaks: the bound the fit is judged on */
    uint64_t nvme_file; /* the nvme tier's file: each segment in whole memory.offload.block_bytes */
    /* where the activations go */
    uint64_t slot_bytes;       /* one micro-batch's saved activations on this rank */
    int live_microbatches;     /* most alive at once (the pipeline stash; 1 without pp) */
    uint64_t activation_shared; /* scratch every micro-batch shares */
    /* per step */
    loom_plan_comm comm[LOOM_AXIS_COUNT][LOOM_OP_COUNT];
    double gemm_flops;         /* matrix products, attention's included */
    double other_bytes;        /* bytes the non-GEMM kernels and the optimizer stream */
    double compute_s;          /* gemm_flops / rate + other_bytes / memory roof */
    double step_s;             /* compute, bubble and exposed communication */
} loom_plan_rank;

enum { LOOM_PLAN_WARNINGS_MAX = 16 };

typedef struct loom_plan {
    loom_plan_job job;          /* the job planned (owns its stage arrays) */
    loom_plan_cluster cluster;
    int nranks;                 /* pp ranks planned: job.sizes[PP] */
    loom_plan_rank *ranks;
    double params;              /* Ψ: parameters of the whole model */
    double flops_per_token;     /* forward + backward, the whole model */
    double bubble;              /* idle fraction of the pipeline (0 without pp) */
    int timed;                  /* the cluster has rates: the times below are set */
    double step_s;              /* the slowest rank's */
    double tokens_per_s;
    double mfu;                 /* flops_per_token × tokens/s / (ranks × peak) */
    int fits;                   /* every rank's total fits its memory */
    char why[512];              /* what dominates the step time, one line */
    int nwarnings;
    char warnings[LOOM_PLAN_WARNINGS_MAX][256];
} loom_plan;

/* Plan the job on the cluster; schedule: the pipeline's (pp > 1), built
 * from the job's settings, else NULL. On failure, one line (loom_fail) says what
 * cannot be planned (a strategy or schedule loom has no model of, a mesh
 * the cluster cannot hold). */
struct loom_schedule;
int loom_plan_make(const loom_plan_job *job, const loom_plan_cluster *cluster,
                   const struct loom_schedule *schedule, loom_plan *out);
void loom_plan_free(loom_plan *p);

/* ---- the time model (plan_time.c) ---- */

/* Seconds for `calls` calls of op moving `bytes` of payload in all (as the
 * comm counters count it) over a group of `ranks`, of which `across`
 * nodes (1: inside one node). */
double loom_plan_comm_seconds(const loom_plan_cluster *c, loom_comm_op op, uint64_t bytes,
                              uint64_t calls, int ranks, int across);

/* ---- additions of the cluster and time-model parts (plan_cluster.c, plan_time.c) ---- */

/* Seconds of compute for one rank: gemm_flops at the cluster's peak for
 * dtype, plus other_bytes (what the non-GEMM kernels read and write) at
 * its memory_bytes_per_s. A dtype without a peak of its own runs at f32's. */
double loom_plan_compute_seconds(const loom_plan_cluster *c, loom_dtype dtype, double gemm_flops,
                                 double other_bytes);

/* A comment written above one field of a cluster file: why its value is
 * what it is (how --calibrate measured it). field is a dotted name under
 * cluster ("peak", "intra", "measured.allreduce") or "cluster" for the
 * file's head; text may hold several lines. */
typedef struct loom_plan_cluster_note {
    const char *field;
    const char *text;
} loom_plan_cluster_note;

/* loom_plan_cluster_write with notes (nnotes of them; NULL, 0: none). */
int loom_plan_cluster_write_notes(const loom_plan_cluster *c, const char *path,
                                  const loom_plan_cluster_note *notes, int nnotes);

/* ---- the machine check before a run (plan_machine.c) ---- */

/* What `loom train` passes the trainer as its check_machine: the plan's
 * peak host memory of this machine's ranks against what the machine and
 * the process's cgroups let it take (refused with the settings that would
 * fit), and the nvme tier's files against memory.offload.path's free
 * space. A job the plan cannot model passes (the allocations' own checks
 * still hold). */
struct loom_train_machine;
int loom_plan_check_machine(const struct loom_train_machine *m);

#endif
