/* plugins/common — a comm backend's group bookkeeping (group.h). */
#include "common/group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct subgroup_count {
    uint64_t hash;
    int count;
    struct subgroup_count *next;
};

int group_check_world(const loom_host *host, const char *backend)
{
    if (!host)
        return LOOM_ERR_INVALID;
    if (host->world_size < 1 || host->rank < 0 || host->rank >= host->world_size)
        return host->error(host, LOOM_ERR_INVALID, "%s: bad rank %d of %d", backend, host->rank,
                           host->world_size);
    return LOOM_OK;
}

int group_init(comm_group *g, const loom_host *host, const char *backend, int rank, int size)
{
    memset(g, 0, sizeof *g);
    g->world_ranks = calloc((size_t)size, sizeof *g->world_ranks);
    if (!g->world_ranks)
        return LOOM_ERR_NO_MEMORY;
    g->host = host;
    g->backend = backend;
    g->rank = rank;
    g->size = size;
    return LOOM_OK;
}

void group_release(comm_group *g)
{
    for (struct subgroup_count *sc = g->subgroups, *next; sc; sc = next) {
        next = sc->next;
        free(sc);
    }
    g->subgroups = NULL;
    free(g->world_ranks);
    g->world_ranks = NULL;
}

void group_set_world(comm_group *g)
{
    g->is_world = 1;
    for (int i = 0; i < g->size; i++)
        g->world_ranks[i] = i;
    group_describe(g);
}

void group_describe(comm_group *g)
{
    char *d = g->desc;
    int cap = (int)sizeof g->desc;
    int n = snprintf(d, (size_t)cap, "group of %d (world ranks ", g->size);
    for (int i = 0; i < g->size && n < cap - 16; i++)
        n += snprintf(d + n, (size_t)(cap - n), "%s%d", i ? "," : "", g->world_ranks[i]);
    if (n >= cap - 16)
        snprintf(d + cap - 16, 16, ",...)");
    else
        snprintf(d + n, (size_t)(cap - n), ")");
}

void group_name_rank(const comm_group *g, int r, char *buf, size_t cap)
{
    if (!g || g->is_world || r < 0 || r >= g->size)
        snprintf(buf, cap, "%d", r);
    else
        snprintf(buf, cap, "%d (world rank %d)", r, g->world_ranks[r]);
}

void group_describe_op(const comm_group *g, const char *name, uint64_t seq, int peer, int tag,
                       char *buf, size_t cap)
{
    const char *desc = g ? g->desc : "a destroyed group";
    if (peer < 0) {
        snprintf(buf, cap, "%s #%llu on %s", name, (unsigned long long)seq, desc);
        return;
    }
    char nm[64];
    group_name_rank(g, peer, nm, sizeof nm);
    snprintf(buf, cap, "%s #%llu %s rank %s (tag %d) on %s", name, (unsigned long long)seq,
             strcmp(name, "send") ? "from" : "to", nm, tag, desc);
}

int group_failure(comm_group *g, char *why, size_t cap)
{
    if (g->lock)
        pthread_mutex_lock(g->lock);
    int status = g->failed ? (g->fail_status ? g->fail_status : LOOM_ERR_REMOTE) : 0;
    if (status)
        copy_text(why, cap, g->failure);
    if (g->lock)
        pthread_mutex_unlock(g->lock);
    return status;
}

int group_refuse_failed(comm_group *g, const char *what, int status)
{
    char why[sizeof g->failure];
    int failed = group_failure(g, why, sizeof why);
    if (!failed)
        return LOOM_OK;
    return g->host->error(g->host, status ? status : failed,
                          "%s: %s on %s: the group failed earlier: %s", g->backend, what, g->desc,
                          why);
}

int group_number(comm_group *g, int collective, uint64_t *seq)
{
    *seq = collective ? ++g->seq : ++g->p2p_seq;
    return g->failed;
}

int group_refuse_op(comm_group *g, const char *name, uint64_t seq)
{
    char what[96];
    snprintf(what, sizeof what, "%s #%llu", name, (unsigned long long)seq);
    return group_refuse_failed(g, what, 0);
}

int group_begin(comm_group *g, const char *name, int collective, uint64_t *seq)
{
    if (g->lock)
        pthread_mutex_lock(g->lock);
    int failed = group_number(g, collective, seq);
    if (g->lock)
        pthread_mutex_unlock(g->lock);
    /* every op passes here: words only for the refusal */
    return failed ? group_refuse_op(g, name, *seq) : LOOM_OK;
}

int group_fail(comm_group *g, int status, const char *why)
{
    if (g->failed)
        return 0;
    size_t n = strlen(g->backend);
    if (!strncmp(why, g->backend, n) && !strncmp(why + n, ": ", 2))
        why += n + 2;
    g->failed = 1;
    g->fail_status = status;
    copy_text(g->failure, sizeof g->failure, why);
    return 1;
}

int group_no_memory(const comm_group *g, const char *name, uint64_t seq)
{
    return g->host->error(g->host, LOOM_ERR_NO_MEMORY, "%s: %s #%llu on %s: out of memory",
                          g->backend, name, (unsigned long long)seq, g->desc);
}

void group_track(comm_group *g, comm_pending *p, loom_comm_request *r)
{
    p->request = r;
    p->prev = NULL;
    p->next = g->pending;
    if (g->pending)
        g->pending->prev = p;
    g->pending = p;
}

void group_untrack(comm_group *g, comm_pending *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else if (g->pending == p)
        g->pending = p->next;
    if (p->next)
        p->next->prev = p->prev;
    p->prev = p->next = NULL;
}

int group_count_subgroup(comm_group *parent, uint64_t list_hash)
{
    struct subgroup_count *sc = parent->subgroups;
    while (sc && sc->hash != list_hash)
        sc = sc->next;
    if (!sc) {
        if (!(sc = calloc(1, sizeof *sc)))
            return -1;
        sc->hash = list_hash;
        sc->next = parent->subgroups;
        parent->subgroups = sc;
    }
    return sc->count++;
}

uint64_t rank_list_hash(const int *ranks, int n) { return loom_rank_list_hash(ranks, n); }

void rank_list_text(const int *ranks, int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len + 16 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", ranks[i]);
    if (n > 0 && len + 16 >= cap)
        snprintf(buf + len, cap - len, ",...");
}

int rank_list_index(const int *ranks, int rank)
{
    int i = 0;
    while (ranks[i] != rank)
        i++;
    return i;
}

int buffers_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}
