/* loom runtime — Rank detection from the launcher and the TCP bootstrap store (store.c). */
#ifndef LOOM_RUNTIME_BOOTSTRAP_H
#define LOOM_RUNTIME_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

/* Rank and size from the launcher's environment: LOOM_RANK/LOOM_WORLD_SIZE,
 * OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS,
 * RANK/WORLD_SIZE; a lone process is rank 0 of 1. */
typedef struct loom_launch_env {
    int rank, world_size, local_rank, local_size;
    const char *source;   /* "LOOM", "OMPI", "PMI", "SLURM", "torchrun", "none" */
    const char *launcher; /* for people: "loom launch", "Open MPI", "Slurm", ... */
    const char *rank_var; /* the variable the rank came from; NULL for "none" */
    /* Another launcher's variables that say a different rank or size,
     * as one warning line; "" when there are none. */
    char conflict[384];
} loom_launch_env;
int loom_bootstrap_detect(loom_launch_env *out);
/* "2 from Slurm (SLURM_PROCID)", or "1 (no launcher)": where the run's
 * ranks came from, for its header. */
void loom_launch_env_describe(const loom_launch_env *env, char *buf, size_t cap);
/* Whether this process is a task of a Slurm job step (started by srun),
 * rather than the allocation's shell or its batch script. */
int loom_slurm_step(void);
/* The first host of a Slurm node list ("node[07-09],gpu3" gives "node07")
 * into host; 0 when the list is empty or malformed. */
int loom_slurm_first_host(const char *nodelist, char *host, size_t cap);

/* What `loom launch` pinned this job's ranks to, for the run's header
 * ("bound rank 0 to cpu 0, rank 1 to cpu 1", "not bound (--bind none)");
 * NULL when another launcher started it. */
const char *loom_launch_binding(void);

/* The TCP key-value store rank 0 serves (a thread in rank 0). The address is
 * MASTER_ADDR/MASTER_PORT, else LOOM_STORE_ADDR/LOOM_STORE_PORT, else
 * 127.0.0.1 (the first node of a Slurm step that spans several) and a
 * port derived from the launcher's job id (20000-31999, below the
 * ephemeral range). Every blocking call takes a timeout and, on
 * expiry, says what it waited for and which ranks did not arrive. */
typedef struct loom_store loom_store;
int loom_store_open(const loom_launch_env *env, double timeout_s, loom_store **out);
void loom_store_close(loom_store *store);
/* The job failed here (an op failed, a peer stopped or died): from now on
 * replies are waited for only briefly, and rank 0's close waits only a
 * moment for the ranks still open, and does not warn about them. */
void loom_store_job_failed(loom_store *store);
/* The store port derived from the launcher's job identity (as above); 0
 * outside a launcher's job. */
int loom_store_job_port(void);
int loom_store_put(loom_store *s, const char *key, const void *value, size_t len);
/* Waits until key exists. *len gets the stored length (even if > cap). */
int loom_store_get(loom_store *s, const char *key, void *buf, size_t cap, size_t *len,
                   double timeout_s);
int loom_store_add(loom_store *s, const char *key, int64_t delta, int64_t *result);
/* All world ranks; a timeout names the ranks that did not arrive. */
int loom_store_barrier(loom_store *s, const char *name, double timeout_s);
/* "rank 2" or "ranks 0, 1, 3" (long lists end in "... (N more)"), the one
 * way every message names a set of ranks. Returns n. */
int loom_format_ranks(char *buf, size_t cap, const int *ranks, int n);

#endif
