/* loom runtime — The flight recorder: each group's last operations, kept
 * where `loom launch` can read them even when the rank is stopped or dead.
 *
 * Every group over a backend records its ops in a ring of the last
 * LOOM_FLIGHT_OPS: number, op, bytes, peer, state, times, and the issuer
 * (the unit or pipeline action the trainer says it is working on). The
 * rings of a process live in one table. Under `loom launch` the table is a
 * file the launcher maps too (LOOM_FLIGHT_DIR/rank-<r>.flight), so when it
 * stops a job it reads every rank's last operations, the stopped and the
 * dead included, and says which rank the others wait on. Elsewhere the
 * table is private memory. SIGUSR1 writes the table to stderr (with no
 * lock or allocation, so a rank stuck in a wait still answers), and so
 * does a collective timeout outside `loom launch`. */
#ifndef LOOM_RUNTIME_FLIGHT_H
#define LOOM_RUNTIME_FLIGHT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "loom/comm.h"

#define LOOM_FLIGHT_OPS 64    /* per group; a power of two */
#define LOOM_FLIGHT_GROUPS 32 /* groups of one process recorded at once */
#define LOOM_FLIGHT_ISSUER 48
#define LOOM_FLIGHT_DIR_ENV "LOOM_FLIGHT_DIR"

typedef enum loom_flight_state {
    LOOM_FLIGHT_POSTED = 1,    /* issued; the rank does not wait on it (yet) */
    LOOM_FLIGHT_WAITING = 2,   /* the rank sits in its wait */
    LOOM_FLIGHT_COMPLETED = 3,
    LOOM_FLIGHT_FAILED = 4,    /* its wait or test failed: a timeout, mostly */
} loom_flight_state;

/* One op as a reader sees it. Times are loom_flight_now_ns(), the same
 * clock in every process of a machine; 0: not yet. */
typedef struct loom_flight_entry {
    uint64_t seq;              /* its number on the group: collectives, and sends with
                                * receives, are counted apart, as error messages count them */
    uint64_t bytes;
    uint64_t posted_ns, waited_ns, ended_ns;
    int64_t step;              /* the training step that issued it; 0: none */
    int32_t op;                /* loom_comm_op */
    int32_t state;             /* loom_flight_state */
    int32_t peer;              /* a send's or receive's peer as a world rank; -1 */
    char issuer[LOOM_FLIGHT_ISSUER]; /* "backward h.1", "action 7 (forward mb 2, ...)"; "" */
} loom_flight_entry;

/* The shared layout. A slot is rewritten under its version (odd while it
 * changes, as a seqlock); state and the wait times change alone. */
typedef struct loom_flight_slot {
    atomic_uint version;
    atomic_int state;
    atomic_uint_least64_t waited_ns, ended_ns;
    loom_flight_entry fixed; /* all but state and the wait times */
} loom_flight_slot;

typedef struct loom_flight_group {
    atomic_int in_use;         /* free, open, closed (kept for the record) or being filled */
    uint64_t closed_order;     /* closed rings are reused oldest first */
    int32_t rank, size;        /* this rank in the group */
    char id[96];               /* the same on every member */
    char name[24];             /* "dp", "world", "dp.split", ... */
    char backend[16];
    atomic_uint_least64_t recorded; /* ops so far; op k (from 0) sits in slot k % OPS */
    loom_flight_slot slots[LOOM_FLIGHT_OPS];
} loom_flight_group;

typedef struct loom_flight_table {
    char magic[8];             /* "LOOMFLT" */
    uint32_t layout;           /* sizeof (loom_flight_table): another build's is refused */
    int32_t rank, world_size, pid;
    loom_flight_group groups[LOOM_FLIGHT_GROUPS];
} loom_flight_table;

/* ---- the recording side (a rank) ---- */

/* This process's table, made once: LOOM_FLIGHT_DIR/rank-<rank>.flight when
 * that is set, else private memory; and SIGUSR1 set to write it to
 * stderr. A file that cannot be made costs a warning, not the job. */
void loom_flight_open(int rank, int world_size);
/* 1 when the table is the launcher's file, so the launcher reports. */
int loom_flight_shared(void);
/* A group's ring, NULL when there is no table or every ring is taken
 * (then the group is not recorded). */
loom_flight_group *loom_flight_join(const char *id, const char *name, const char *backend,
                                    int rank, int size);
void loom_flight_rename(loom_flight_group *fg, const char *name);
void loom_flight_leave(loom_flight_group *fg);
/* The recorder's clock: CLOCK_MONOTONIC as of the kernel's last tick, so
 * it steps by 1-4 ms and never runs ahead of loom_now_ns(). The recorder
 * diagnoses waits of seconds, and stamps every op three times: at ~5 ns a
 * reading instead of ~25 (a virtual machine's CLOCK_MONOTONIC) it stays
 * off the path of a small op, which takes a few hundred ns. */
uint64_t loom_flight_now_ns(void);
/* Record an op as posted; returns its ticket for loom_flight_mark (0: not
 * recorded). peer: a world rank, or -1. */
uint64_t loom_flight_post(loom_flight_group *fg, loom_comm_op op, uint64_t seq, uint64_t bytes,
                          int peer);
void loom_flight_mark(loom_flight_group *fg, uint64_t ticket, loom_flight_state state);
/* What the ops posted from now on say issued them (printf-like; cut to
 * LOOM_FLIGHT_ISSUER), and the training step (0: none). */
void loom_flight_issuer(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_flight_step(int64_t step);
/* Write this process's table to fd, headed by why ("SIGUSR1"); uses only
 * async-signal-safe calls. */
void loom_flight_write(int fd, const char *why);

/* ---- the reading side (the launcher, tests) ---- */

typedef struct loom_flight_group_view {
    char id[96], name[24], backend[16];
    int rank, size;
    uint64_t recorded;
    int count;                 /* entries[0..count), oldest first */
    loom_flight_entry entries[LOOM_FLIGHT_OPS];
} loom_flight_group_view;

typedef struct loom_flight_view {
    int rank, world_size, pid;
    int ngroups;
    loom_flight_group_view groups[LOOM_FLIGHT_GROUPS];
} loom_flight_view;

/* A consistent copy of a live table (a slot being rewritten is left out). */
void loom_flight_read(const loom_flight_table *t, loom_flight_view *out);
/* Read a rank's table file; LOOM_OK, or a failure with the detail (no such
 * file, another layout). */
int loom_flight_load(const char *path, loom_flight_view *out);

/* How a rank's process is, as the launcher knows it. */
typedef enum loom_rank_state {
    LOOM_RANK_RUNNING = 0,
    LOOM_RANK_STOPPED,         /* SIGSTOP, SIGTSTP, a debugger */
    LOOM_RANK_EXITED,          /* code: its exit status */
    LOOM_RANK_KILLED,          /* code: the signal */
} loom_rank_state;

typedef struct loom_flight_rank {
    const loom_flight_view *view; /* NULL: it left no record */
    loom_rank_state state;
    int code;
} loom_flight_rank;

/* One line on ranks[0..n) (index = world rank): which rank the others wait
 * on, where it is and what they wait in, "rank 2 (stopped) is after dp
 * allreduce #41 (step 5, loss); ranks 0, 1 wait in dp allreduce #42 for
 * 3.001 s" (waits timed against now_ns). Returns 1 when some rank waits,
 * else 0 with what was seen. */
int loom_flight_diagnose(const loom_flight_rank *ranks, int n, uint64_t now_ns, char *line,
                         size_t cap);
/* A rank's last `last` ops per group, one per line, ages against now_ns;
 * returns the length written (cut at cap). */
size_t loom_flight_format(const loom_flight_view *v, int world_rank, const loom_flight_rank *how,
                          uint64_t now_ns, int last, char *buf, size_t cap);

#endif
