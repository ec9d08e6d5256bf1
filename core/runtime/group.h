/* loom runtime — Communicator groups over a backend plugin, with counters. */
#ifndef LOOM_RUNTIME_GROUP_H
#define LOOM_RUNTIME_GROUP_H

#include <stdint.h>
#include "loom/comm.h"
#include "loom/plugin.h"
#include "runtime/runtime.h"

/* The world group over backend `name` ("mpi", "ucx", "nccl", "self"). */
int loom_group_world(loom_runtime *rt, const char *backend, loom_group **out);
/* Collective over parent: see the comm ops' create_subgroup. A list
 * of one rank gives a self group without calling the backend. */
int loom_group_subgroup(loom_group *parent, const int *ranks, int nranks, loom_group **out);
/* A group of this rank alone, over the built-in self communicator. */
int loom_group_self(loom_runtime *rt, loom_group **out);
void loom_group_destroy(loom_group *g);
extern const loom_comm_api loom_core_comm_api;
/* The same groups under the rule of plugins built before ABI 1.10: an op
 * complete at issue may hand back NULL, and wait and test take NULL as
 * complete (loom_core_comm_api refuses NULL, comm.h). */
extern const loom_comm_api loom_core_comm_api_v1_9;
/* 1 when req's op completed as it was posted (nothing of it is in flight
 * before its wait), for tests that account what an op in flight holds. */
int loom_request_completed_at_issue(const loom_request *req);
/* The host table's comm_waiting: the backend of comm waits long on an op,
 * so this rank's arrival on its group goes to the store now, for a rank
 * whose wait times out to read. */
void loom_group_comm_waiting(const loom_host *host, loom_comm *comm);

/* Bytes this rank sent per op since the group was made (payload bytes the
 * algorithm-independent way: what the op's definition moves). */
typedef struct loom_comm_counters {
    uint64_t calls[LOOM_OP_COUNT];
    uint64_t bytes[LOOM_OP_COUNT];
} loom_comm_counters;
void loom_group_counters(const loom_group *g, loom_comm_counters *out);

/* What the flight recorder and its diagnosis call a group: the mesh names
 * its axes ("tp", "sp", "pp", "dp"), a world group is "world", a split
 * "<parent>.split". */
void loom_group_set_name(loom_group *g, const char *name);
const char *loom_group_name(const loom_group *g);
/* The memory kinds the group's backend takes (LOOM_MEM_BIT(...)), a
 * wrapper's resolved to its inner backend's; host only for self. */
uint32_t loom_group_mem_kinds(const loom_group *g);

/* Bytes each rank sends over its link per byte of op's payload on n ranks,
 * by the ring and pipelined algorithms (nccl-tests' bus factor): all-reduce
 * 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n, broadcast,
 * reduce, send and recv 1, barrier 0. loom bench's bus bandwidth and loom
 * plan's time model both use it. */
double loom_comm_bus_factor(loom_comm_op op, int n);

#endif
