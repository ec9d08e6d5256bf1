/* plugins/common — which ranks did not arrive (arrival.h). */
#include "common/arrival.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

static void late_key(const comm_group *g, int rank, char *key, size_t cap)
{
    snprintf(key, cap, "late/%s/%d", g->id, g->world_ranks[rank]);
}

int arrival_report(comm_group *g)
{
    const loom_host *h = g->host;
    if (!h->kv_add)
        return LOOM_ERR_NOT_SUPPORTED;
    if (g->lock)
        pthread_mutex_lock(g->lock);
    int64_t mine = (int64_t)g->seq + 1, cur = 0;
    if (g->lock)
        pthread_mutex_unlock(g->lock);
    char key[160];
    late_key(g, g->rank, key, sizeof key);
    if (h->kv_add(h, key, 0, &cur) != LOOM_OK ||
        (cur < mine && h->kv_add(h, key, mine - cur, &cur) != LOOM_OK))
        return LOOM_ERR_REMOTE;
    return LOOM_OK;
}

/* One round of reading the reports of the ranks not yet known to have
 * reached collective #seq into got[]. Returns how many are still short, or
 * -1 if the store could not be read. */
static int read_reports(const comm_group *g, uint64_t seq, int64_t *got)
{
    const loom_host *h = g->host;
    int missing = 0;
    for (int m = 0; m < g->size; m++) {
        if (m == g->rank || got[m] >= (int64_t)seq + 1)
            continue;
        char key[160];
        late_key(g, m, key, sizeof key);
        int64_t v = 0;
        if (h->kv_add(h, key, 0, &v) != LOOM_OK)
            return -1;
        if ((got[m] = v) < (int64_t)seq + 1)
            missing++;
    }
    return missing;
}

/* "rank 1 did not arrive; ranks 2, 3 (at #4) are still in earlier
 * operations of this group": silent ranks are the suspects; ranks that
 * reported an earlier op are alive but stuck behind (often waiting on the
 * silent ones). */
static void name_missing(const comm_group *g, uint64_t seq, const int64_t *got, char *why,
                         size_t cap)
{
    size_t len = 0;
    int silent = 0, behind = 0;
    for (int m = 0; m < g->size; m++)
        if (m != g->rank && got[m] < (int64_t)seq + 1) {
            if (got[m] > 0)
                behind++;
            else
                silent++;
        }
    for (int pass = 0; pass < 2 && len < cap; pass++) {
        int count = pass == 0 ? silent : behind, k = 0;
        if (count == 0)
            continue;
        if (len > 0 && len < cap)
            len += (size_t)snprintf(why + len, cap - len, "; ");
        if (len < cap)
            len += (size_t)snprintf(why + len, cap - len, "rank%s ", count > 1 ? "s" : "");
        for (int m = 0; m < g->size && len < cap; m++) {
            if (m == g->rank || got[m] >= (int64_t)seq + 1 || (got[m] > 0) != pass)
                continue;
            char nm[64];
            group_name_rank(g, m, nm, sizeof nm);
            len += (size_t)snprintf(why + len, cap - len, "%s%s", k++ ? ", " : "", nm);
            if (pass == 1 && len < cap)
                len += (size_t)snprintf(why + len, cap - len, " (at #%lld)", (long long)got[m] - 1);
        }
        if (len < cap)
            len += (size_t)snprintf(why + len, cap - len, "%s",
                                    pass == 0   ? " did not arrive"
                                    : count > 1 ? " are still in earlier operations of this group"
                                                : " is still in an earlier operation of this group");
    }
}

void arrival_diagnose(comm_group *g, uint64_t seq, double grace_s, char *why, size_t cap)
{
    int st = arrival_report(g);
    if (st == LOOM_ERR_NOT_SUPPORTED) {
        snprintf(why, cap, "no bootstrap store to ask which ranks arrived");
        return;
    }
    if (st != LOOM_OK) {
        snprintf(why, cap, "rank 0 (bootstrap store) unreachable, so the ranks that did not "
                           "arrive are unknown");
        return;
    }
    int64_t *got = calloc((size_t)g->size, sizeof *got);
    if (!got) {
        snprintf(why, cap, "out of memory while asking which ranks arrived");
        return;
    }
    double deadline = clock_now_s() + grace_s;
    int missing = 0, rounds = 0, lost = 0;
    for (;; rounds++) {
        int now_missing = read_reports(g, seq, got);
        lost = now_missing < 0;
        if (lost) /* keep what the earlier rounds found */
            break;
        missing = now_missing;
        if (missing == 0 || clock_now_s() >= deadline)
            break;
        clock_sleep_s(0.05);
    }
    if (lost && rounds == 0) {
        snprintf(why, cap, "rank 0 (bootstrap store) unreachable");
    } else if (missing == 0) {
        snprintf(why, cap, "every rank reached it and is waiting too: the ranks called different "
                           "operations, counts, dtypes or roots at this point");
    } else {
        name_missing(g, seq, got, why, cap);
        size_t len = strnlen(why, cap);
        if (lost && len < cap)
            snprintf(why + len, cap - len,
                     " (rank 0, the bootstrap store, went away while the ranks reported)");
    }
    free(got);
}

void arrival_diagnose_p2p(comm_group *g, int peer, int is_send, char *why, size_t cap)
{
    const loom_host *h = g->host;
    char key[160], nm[64];
    int64_t theirs = 0;
    int st = arrival_report(g);
    if (st == LOOM_OK) {
        late_key(g, peer, key, sizeof key);
        if (h->kv_add(h, key, 0, &theirs) != LOOM_OK)
            st = LOOM_ERR_REMOTE;
    }
    if (st == LOOM_ERR_REMOTE) {
        snprintf(why, cap, "rank 0 (bootstrap store) unreachable");
        return;
    }
    group_name_rank(g, peer, nm, sizeof nm);
    snprintf(why, cap, "rank %s %s%s", nm,
             is_send ? "did not post the matching recv" : "did not send the matching message",
             theirs > 0 ? " (it timed out on this group too: mismatched sends and recvs?)" : "");
}
