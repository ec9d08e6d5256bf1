/* plugins/common — which ranks did not arrive.
 *
 * No transport can tell which ranks never reached a collective, so every
 * rank that waits long on one says in the bootstrap store how far it got on
 * the group: key late/<group id>/<world rank> holds the number of
 * collectives it posted there plus one (0: it never reported). The rank
 * whose wait times out reads the others' and names the ranks that did not
 * arrive; the message says the same whatever the backend. */
#ifndef LOOM_PLUGIN_COMMON_ARRIVAL_H
#define LOOM_PLUGIN_COMMON_ARRIVAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/group.h"

/* Say in the store how many collectives this rank posted on g (g->seq,
 * read under g->lock; the store is used outside it). LOOM_OK,
 * LOOM_ERR_NOT_SUPPORTED without a store, or LOOM_ERR_REMOTE when it is
 * unreachable; nothing is reported. */
int arrival_report(comm_group *g);

/* Why collective #seq of g timed out, for its message: "rank 1 did not
 * arrive", "rank 2 (at #3) is still in an earlier operation of this group",
 * or that every rank reached it (they called different operations). Reports
 * this rank's arrival first, then gives the others grace_s to report too:
 * a rank that posted the op but started waiting on it more than grace_s
 * later is named although it arrived. */
void arrival_diagnose(comm_group *g, uint64_t seq, double grace_s, char *why, size_t cap);

/* Why a send (is_send) or a receive to or from peer on g timed out: the
 * peer did not post its side. Reports this rank's arrival first, so a peer
 * stuck in a collective of g can tell. */
void arrival_diagnose_p2p(comm_group *g, int peer, int is_send, char *why, size_t cap);

#endif
