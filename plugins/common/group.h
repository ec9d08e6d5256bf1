/* plugins/common — what every comm backend keeps about a group, and the
 * prologue and the messages of every op on it.
 *
 * A backend's loom_comm embeds a comm_group: its place in the world, its
 * id and description for messages, the sequence numbers the ops get, and
 * its failure. An op begins with group_begin (numbered, refused on a failed
 * group) and is named in messages by group_describe_op; the first failure
 * of a group is kept (group_fail) and every later op fails with it. */
#ifndef LOOM_PLUGIN_COMMON_GROUP_H
#define LOOM_PLUGIN_COMMON_GROUP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"

struct subgroup_count;

/* A request's place in its group's list of requests in flight, newest
 * first: destroy walks it to orphan the ones left behind. */
typedef struct comm_pending {
    struct comm_pending *prev, *next;
    loom_comm_request *request;
} comm_pending;

typedef struct comm_group {
    const loom_host *host;
    const char *backend;     /* "comm-mpi": how its messages start */
    pthread_mutex_t *lock;   /* guards seq, p2p_seq and the failure; NULL where the
                                backend uses a group from one thread at a time */
    int rank, size;
    int *world_ranks;        /* world rank of each rank of the group */
    int is_world;            /* rank r is world rank r: messages need not say so */
    char id[96];             /* the same on every member and unique in the job: names store keys */
    char desc[256];          /* "group of 4 (world ranks 0,1,2,3)" */
    uint64_t seq;            /* collectives posted here; the next one is seq + 1 */
    uint64_t p2p_seq;        /* sends and receives posted here */
    int failed, fail_status; /* after a timeout, a transport error or an abort */
    char failure[512];
    struct subgroup_count *subgroups; /* per rank list: subgroups made from this one */
    comm_pending *pending;   /* requests in flight; with lock held */
} comm_group;

/* create_world's first check: a host that places this rank in its world.
 * LOOM_OK, or the error (reported where there is a host to report it). */
int group_check_world(const loom_host *host, const char *backend);
/* A group of `size` ranks with this rank at `rank`; world_ranks is zeroed
 * for the caller to fill. LOOM_OK or LOOM_ERR_NO_MEMORY (not reported). */
int group_init(comm_group *g, const loom_host *host, const char *backend, int rank, int size);
void group_release(comm_group *g);
/* The world: rank r is world rank r. Describes it too. */
void group_set_world(comm_group *g);
/* desc from the size and the world ranks. */
void group_describe(comm_group *g);

/* "2" in the world, "1 (world rank 3)" in a subgroup. */
void group_name_rank(const comm_group *g, int r, char *buf, size_t cap);
/* "allreduce #17 on group of 4 (world ranks 0,1,2,3)", or for a send or
 * receive (peer >= 0) "send #3 to rank 2 (tag 7) on group of ...". g may be
 * NULL: the group was destroyed. */
void group_describe_op(const comm_group *g, const char *name, uint64_t seq, int peer, int tag,
                       char *buf, size_t cap);

/* The prologue of every op: number it (collectives and point-to-point
 * separately) and refuse it on a failed group. LOOM_OK, or the error,
 * reported. */
int group_begin(comm_group *g, const char *name, int collective, uint64_t *seq);
/* group_begin in two halves, for a backend that holds g->lock already
 * while it posts: number the op (with the lock held) and say whether the
 * group failed; then, without the lock, refuse it. */
int group_number(comm_group *g, int collective, uint64_t *seq);
int group_refuse_op(comm_group *g, const char *name, uint64_t seq);
/* LOOM_OK while the group works; else reports that `what` (e.g.
 * "create_subgroup") cannot run on it, with status (0: the failure's own). */
int group_refuse_failed(comm_group *g, const char *what, int status);
/* 0 while the group works; else the failure's status, its text in why. */
int group_failure(comm_group *g, char *why, size_t cap);
/* Keep the group's first failure (a leading "<backend>: " of why dropped);
 * returns whether this was it. With g->lock held, where there is one. */
int group_fail(comm_group *g, int status, const char *why);
/* Reports "<backend>: <name> #<seq> on <group>: out of memory". */
int group_no_memory(const comm_group *g, const char *name, uint64_t seq);

/* Put a request on the group's list of requests in flight, or take it
 * off. With g->lock held, where there is one. */
void group_track(comm_group *g, comm_pending *p, loom_comm_request *r);
void group_untrack(comm_group *g, comm_pending *p);

/* How many subgroups with this rank list (rank_list_hash) this rank made
 * from parent before: the same on every member, so it tells repeated
 * subgroups of the same ranks apart in their ids. -1: out of memory. */
int group_count_subgroup(comm_group *parent, uint64_t list_hash);

/* Rank lists as create_subgroup takes them. */
uint64_t rank_list_hash(const int *ranks, int n);
/* "0,2" for messages, cut short with ",..." */
void rank_list_text(const int *ranks, int n, char *buf, size_t cap);
/* Where rank stands in the list; the core checked that it does (comm.h). */
int rank_list_index(const int *ranks, int rank);

/* Whether [a, a + alen) and [b, b + blen) share a byte. */
int buffers_overlap(const void *a, size_t alen, const void *b, size_t blen);
/* snprintf("%s") without the compiler's truncation warning: cutting a long
 * message short is fine here. */
void copy_text(char *dst, size_t cap, const char *src);

#endif
