/* The per-process runtime: config, launch environment, bootstrap store,
 * plugin cache, and the host tables handed to plugins. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/compute.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/config.h"
#include "runtime/crc32c.h"
#include "runtime/flight.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "runtime/tier.h"
#include "runtime/trace.h"

/* One host table per plugin instance; the table is the first member so the
 * core finds its slot from the pointer a plugin passes back. */
typedef struct host_slot {
    loom_host host;
    loom_runtime *rt;
    const loom_plugin *plugin;
    char settings[128]; /* where its settings live in the config, "comm.ucx" */
    char prefix[96];  /* bootstrap-store key prefix, "comm-ucx/" */
    /* the comm backend this plugin opened with comm_open (a wrapper's
     * inner), and the host table it got for it; NULL if none */
    const loom_plugin *opened;
    const loom_host *opened_host;
    struct host_slot *next;
} host_slot;

typedef struct plugin_entry {
    loom_plugin *plugin;
    char name[64];
    struct plugin_entry *next;
} plugin_entry;

/* For a world of one there is no store server; plugins still get a working
 * key-value store, kept in this process. */
typedef struct local_kv {
    char *key;
    void *value;
    size_t len;
    struct local_kv *next;
} local_kv;

struct loom_runtime {
    loom_config *cfg;
    loom_launch_env env;
    loom_store *store;
    loom_search_path search_path;
    double timeout_s;
    host_slot *hosts;
    plugin_entry *plugins;
    local_kv *local;
    loom_tiers *tiers; /* created at the first need */
    const loom_compute_api *compute; /* every host's compute; NULL until set */
};

static host_slot *slot_of(const loom_host *host) { return (host_slot *)(uintptr_t)host; }

static void host_log(const loom_host *host, loom_log_level level, const char *fmt, ...)
{
    host_slot *s = slot_of(host);
    char who[80];
    snprintf(who, sizeof who, "%s-%s", loom_plugin_kind_name(s->plugin->kind),
             s->plugin->header->name);
    va_list ap;
    va_start(ap, fmt);
    loom_vlog(level, who, fmt, ap);
    va_end(ap);
}

static int host_error(const loom_host *host, int status, const char *fmt, ...)
{
    (void)host;
    va_list ap;
    va_start(ap, fmt);
    loom_vfail(status, fmt, ap);
    va_end(ap);
    return status;
}

static void setting_path(const host_slot *s, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", s->settings, name);
}

static int host_config_int(const loom_host *host, const char *name, int64_t *out)
{
    char path[256];
    setting_path(slot_of(host), name, path, sizeof path);
    return loom_config_int(slot_of(host)->rt->cfg, path, out);
}

static int host_config_float(const loom_host *host, const char *name, double *out)
{
    char path[256];
    setting_path(slot_of(host), name, path, sizeof path);
    return loom_config_float(slot_of(host)->rt->cfg, path, out);
}

static int host_config_bool(const loom_host *host, const char *name, int *out)
{
    char path[256];
    setting_path(slot_of(host), name, path, sizeof path);
    return loom_config_bool(slot_of(host)->rt->cfg, path, out);
}

static int host_config_string(const loom_host *host, const char *name, const char **out)
{
    char path[256];
    setting_path(slot_of(host), name, path, sizeof path);
    return loom_config_string(slot_of(host)->rt->cfg, path, out);
}

static void prefixed(const host_slot *s, const char *key, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", s->prefix, key);
}

static local_kv *local_find(loom_runtime *rt, const char *key)
{
    for (local_kv *e = rt->local; e; e = e->next)
        if (!strcmp(e->key, key))
            return e;
    return NULL;
}

static int local_put(loom_runtime *rt, const char *key, const void *value, size_t len)
{
    local_kv *e = local_find(rt, key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e || !(e->key = strdup(key))) {
            free(e);
            return loom_fail(LOOM_ERR_NO_MEMORY, "bootstrap: out of memory");
        }
        e->next = rt->local;
        rt->local = e;
    }
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return loom_fail(LOOM_ERR_NO_MEMORY, "bootstrap: out of memory");
    memcpy(copy, value, len);
    free(e->value);
    e->value = copy;
    e->len = len;
    return LOOM_OK;
}

static int host_kv_put(const loom_host *host, const char *key, const void *value, size_t len)
{
    host_slot *s = slot_of(host);
    char k[384];
    prefixed(s, key, k, sizeof k);
    if (!s->rt->store)
        return local_put(s->rt, k, value, len);
    return loom_store_put(s->rt->store, k, value, len);
}

static int host_kv_get(const loom_host *host, const char *key, void *buf, size_t cap,
                       size_t *len, double timeout_s)
{
    host_slot *s = slot_of(host);
    char k[384];
    prefixed(s, key, k, sizeof k);
    if (s->rt->store)
        return loom_store_get(s->rt->store, k, buf, cap, len, timeout_s);
    /* Alone, nobody else can ever put it: a missing key is final. */
    local_kv *e = local_find(s->rt, k);
    if (!e)
        return loom_fail(LOOM_ERR_TIMEOUT, "bootstrap: key '%s' never appeared (world of one)", k);
    memcpy(buf, e->value, e->len < cap ? e->len : cap);
    if (len)
        *len = e->len;
    return LOOM_OK;
}

static int host_kv_add(const loom_host *host, const char *key, int64_t delta, int64_t *result)
{
    host_slot *s = slot_of(host);
    char k[384];
    prefixed(s, key, k, sizeof k);
    if (s->rt->store)
        return loom_store_add(s->rt->store, k, delta, result);
    local_kv *e = local_find(s->rt, k);
    int64_t v = delta;
    if (e && e->len == sizeof v) {
        memcpy(&v, e->value, sizeof v);
        v += delta;
    }
    if (result)
        *result = v;
    return local_put(s->rt, k, &v, sizeof v);
}

static int host_kv_barrier(const loom_host *host, const char *name, double timeout_s)
{
    host_slot *s = slot_of(host);
    if (!s->rt->store)
        return LOOM_OK;
    char k[384];
    prefixed(s, name, k, sizeof k);
    return loom_store_barrier(s->rt->store, k, timeout_s);
}

static int host_mem_alloc(const loom_host *host, loom_tier tier, loom_purpose purpose,
                          size_t bytes, void **out)
{
    (void)host;
    return loom_mem_alloc(tier, purpose, bytes, out);
}

static void host_mem_free(const loom_host *host, void *ptr)
{
    (void)host;
    loom_mem_free(ptr);
}

static int host_tiered_alloc(const loom_host *host, loom_purpose purpose, const char *name,
                             int nsegments, const size_t *segment_bytes, loom_tiered **out)
{
    loom_tiers *tiers = NULL;
    int rc = loom_runtime_tiers(slot_of(host)->rt, &tiers);
    return rc == LOOM_OK ? loom_tiers_alloc(tiers, purpose, name, nsegments, segment_bytes, out)
                         : rc;
}

static void host_tiered_free(const loom_host *host, loom_tiered *t)
{
    (void)host;
    loom_tiers_free(t);
}

static int host_tiered_fetch(const loom_host *host, loom_tiered *t, int segment)
{
    (void)host;
    return loom_tiers_fetch(t, segment);
}

static int host_tiered_acquire(const loom_host *host, loom_tiered *t, int segment, unsigned mode,
                               void **ptr)
{
    (void)host;
    return loom_tiers_acquire(t, segment, mode, ptr);
}

static int host_tiered_release(const loom_host *host, loom_tiered *t, int segment, int dirty)
{
    (void)host;
    return loom_tiers_release(t, segment, dirty);
}

static void host_trace(const loom_host *host, loom_trace_lane lane, const char *name,
                       uint64_t start_ns, uint64_t end_ns, uint64_t bytes)
{
    (void)host;
    loom_trace_span(lane, name, start_ns, end_ns, bytes);
}

int loom_runtime_create(loom_config *cfg, loom_runtime **out)
{
    loom_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return loom_fail(LOOM_ERR_NO_MEMORY, "runtime: out of memory");
    rt->cfg = cfg;
    int rc = loom_bootstrap_detect(&rt->env);
    if (rc != LOOM_OK)
        goto fail;
    /* under loom launch every output line already starts with the rank */
    int prefixed = getenv("LOOM_OUTPUT_PREFIXED") != NULL;
    loom_log_set_rank(rt->env.world_size > 1 && !prefixed ? rt->env.rank : -1);
    rt->timeout_s = 60.0;
    if (cfg)
        loom_config_float(cfg, "comm.timeout_s", &rt->timeout_s);
    loom_log(LOOM_LOG_DEBUG,
             "rank %d of %d, local rank %d of %d (launch environment: %s); comm.timeout_s = %g",
             rt->env.rank, rt->env.world_size, rt->env.local_rank,
             rt->env.local_size, rt->env.source, rt->timeout_s);
    /* every rank of the job usually sees the same leftovers: one line */
    if (rt->env.conflict[0] && rt->env.rank == 0)
        loom_log(LOOM_LOG_WARN, "%s", rt->env.conflict);
    loom_flight_open(rt->env.rank, rt->env.world_size);
    rc = loom_search_path_init(&rt->search_path, cfg);
    if (rc != LOOM_OK)
        goto fail;
    if (rt->env.world_size > 1) {
        rc = loom_store_open(&rt->env, rt->timeout_s, &rt->store);
        if (rc != LOOM_OK)
            goto fail;
    }
    *out = rt;
    return LOOM_OK;
fail:
    loom_search_path_free(&rt->search_path);
    free(rt);
    return rc;
}

void loom_runtime_destroy(loom_runtime *rt)
{
    if (!rt)
        return;
    loom_tiers_destroy(rt->tiers); /* before the tier's plugin unloads */
    if (rt->store)
        loom_store_close(rt->store);
    for (host_slot *s = rt->hosts, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    for (plugin_entry *p = rt->plugins, *next; p; p = next) {
        next = p->next;
        loom_plugin_unload(p->plugin);
        free(p);
    }
    for (local_kv *e = rt->local, *next; e; e = next) {
        next = e->next;
        free(e->key);
        free(e->value);
        free(e);
    }
    loom_search_path_free(&rt->search_path);
    free(rt);
}

const loom_launch_env *loom_runtime_env(const loom_runtime *rt) { return &rt->env; }
loom_config *loom_runtime_config(loom_runtime *rt) { return rt->cfg; }
loom_store *loom_runtime_store(loom_runtime *rt) { return rt->store; }
double loom_runtime_timeout(const loom_runtime *rt) { return rt->timeout_s; }

int loom_runtime_tiers(loom_runtime *rt, loom_tiers **out)
{
    int rc = rt->tiers ? LOOM_OK : loom_tiers_create(rt, &rt->tiers);
    *out = rt->tiers;
    return rc;
}

int loom_runtime_plugin(loom_runtime *rt, loom_plugin_kind kind, const char *name,
                        const loom_plugin **out)
{
    for (plugin_entry *p = rt->plugins; p; p = p->next) {
        if (p->plugin->kind == kind && !strcmp(p->name, name)) {
            *out = p->plugin;
            return LOOM_OK;
        }
    }
    plugin_entry *e = calloc(1, sizeof *e);
    if (!e)
        return loom_fail(LOOM_ERR_NO_MEMORY, "runtime: out of memory");
    int rc = loom_plugin_load(&rt->search_path, kind, name, &e->plugin);
    if (rc != LOOM_OK) {
        free(e);
        return rc;
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    loom_log(LOOM_LOG_DEBUG, "loaded %s plugin %s (ABI %s%s) from %s",
             loom_plugin_kind_name(kind), e->plugin->header->name, e->plugin->built_for,
             e->plugin->built_as != kind ? ", built as a strategy, adapted" : "", e->plugin->path);
    e->next = rt->plugins;
    rt->plugins = e;
    *out = e->plugin;
    return LOOM_OK;
}

static int host_comm_open(const loom_host *host, const char *name,
                          const loom_comm_ops **ops, const loom_host **inner_host)
{
    host_slot *s = slot_of(host);
    const char *self = s->plugin->header->name;
    if (!name || !name[0] || !strcmp(name, "self") || !strcmp(name, "auto"))
        return loom_fail(LOOM_ERR_INVALID,
                         "comm-%s: comm_open(\"%s\"): name a comm backend to forward to, such "
                         "as \"ucx\" or \"mpi\" (\"self\" and \"auto\" are the core's)",
                         self, name ? name : "");
    const loom_plugin *inner = NULL;
    int rc = loom_runtime_plugin(s->rt, LOOM_PLUGIN_COMM, name, &inner);
    if (rc != LOOM_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_last_error());
        return loom_fail(rc, "comm-%s: comm_open(\"%s\"): %s", self, name, why);
    }
    /* a wrapper that reaches itself would forward each op forever (the
     * same file loaded by path and by name is two plugins of one name) */
    for (const loom_plugin *p = inner; p; p = loom_runtime_comm_opened(s->rt, p, NULL))
        if (p == s->plugin || !strcmp(p->header->name, self))
            return loom_fail(LOOM_ERR_INVALID,
                             "comm-%s: comm_open(\"%s\"): that is comm-%s itself%s; name "
                             "another backend to forward to",
                             self, name, self, p == inner ? "" : " (through the backends it opens)");
    if (s->opened && s->opened != inner)
        return loom_fail(LOOM_ERR_INVALID,
                         "comm-%s: comm_open(\"%s\"): it has opened comm-%s already; a wrapper "
                         "forwards to one backend",
                         self, name, s->opened->header->name);
    char group[128];
    snprintf(group, sizeof group, "comm.%s", inner->header->name);
    rc = loom_runtime_host(s->rt, inner, group, inner_host); /* says where itself */
    if (rc != LOOM_OK)
        return rc;
    s->opened = inner;
    s->opened_host = *inner_host;
    *ops = &inner->ops.comm;
    return LOOM_OK;
}

const loom_plugin *loom_runtime_comm_opened(loom_runtime *rt, const loom_plugin *plugin,
                                            const loom_host **inner_host)
{
    for (host_slot *s = rt->hosts; s; s = s->next) {
        if (s->plugin == plugin && s->opened) {
            if (inner_host)
                *inner_host = s->opened_host;
            return s->opened;
        }
    }
    return NULL;
}

int loom_runtime_comm_mem_kinds(loom_runtime *rt, const loom_plugin *plugin, uint32_t *kinds)
{
    const loom_plugin *p = plugin;
    while (p && p->ops.comm.mem_kinds == LOOM_MEM_KINDS_INNER)
        p = loom_runtime_comm_opened(rt, p, NULL);
    if (!p)
        return loom_fail(LOOM_ERR_INVALID,
                         "comm-%s: mem_kinds is LOOM_MEM_KINDS_INNER, the kinds of the backend it "
                         "opens, but it opened none with host->comm_open in create_world; a "
                         "wrapper opens its inner backend there",
                         plugin->header->name);
    *kinds = p->ops.comm.mem_kinds;
    return LOOM_OK;
}

int loom_runtime_comm_forwards_to(loom_runtime *rt, const loom_plugin *plugin, loom_comm *comm,
                                  const loom_comm *target)
{
    for (const loom_plugin *p = plugin; p && comm; p = loom_runtime_comm_opened(rt, p, NULL)) {
        if (comm == target)
            return 1;
        if (!(p->provided & ((uint64_t)1 << LOOM_OPTIONAL_COMM_INNER)))
            return 0;
        comm = p->ops.comm.inner(comm);
    }
    return comm && comm == target;
}

const loom_compute_api *loom_runtime_compute(const loom_runtime *rt) { return rt->compute; }

int loom_runtime_set_compute(loom_runtime *rt, const loom_compute_api *api)
{
    rt->compute = api;
    for (host_slot *s = rt->hosts; s; s = s->next)
        s->host.compute = api;
    return LOOM_OK;
}

int loom_runtime_host(loom_runtime *rt, const loom_plugin *plugin, const char *settings_path,
                      const loom_host **out)
{
    for (host_slot *s = rt->hosts; s; s = s->next) {
        if (s->plugin == plugin && !strcmp(s->settings, settings_path)) {
            *out = &s->host;
            return LOOM_OK;
        }
    }
    if (rt->cfg) {
        static const char *const no_skip[] = {NULL};
        int rc = loom_config_check_group(rt->cfg, settings_path, plugin->header->settings,
                                         no_skip);
        if (rc != LOOM_OK)
            return rc;
    }
    host_slot *s = calloc(1, sizeof *s);
    if (!s)
        return loom_fail(LOOM_ERR_NO_MEMORY, "runtime: out of memory");
    s->rt = rt;
    s->plugin = plugin;
    snprintf(s->settings, sizeof s->settings, "%s", settings_path);
    snprintf(s->prefix, sizeof s->prefix, "%s-%s/", loom_plugin_kind_name(plugin->kind),
             plugin->header->name);
    loom_host *h = &s->host;
    h->struct_size = sizeof *h;
    h->version = LOOM_HOST_VERSION;
    h->rank = rt->env.rank;
    h->world_size = rt->env.world_size;
    h->local_rank = rt->env.local_rank;
    h->local_size = rt->env.local_size;
    h->timeout_s = rt->timeout_s;
    h->log = host_log;
    h->error = host_error;
    h->config_int = host_config_int;
    h->config_float = host_config_float;
    h->config_bool = host_config_bool;
    h->config_string = host_config_string;
    h->kv_put = host_kv_put;
    h->kv_get = host_kv_get;
    h->kv_add = host_kv_add;
    h->kv_barrier = host_kv_barrier;
    h->mem_alloc = host_mem_alloc;
    h->mem_free = host_mem_free;
    h->now_ns = loom_now_ns;
    h->trace = host_trace;
    h->comm = plugin->header->abi_version >= LOOM_ABI_VERSION(1, 10) ? &loom_core_comm_api
                                                                       : &loom_core_comm_api_v1_9;
    h->comm_waiting = loom_group_comm_waiting;
    h->tiered_alloc = host_tiered_alloc;
    h->tiered_free = host_tiered_free;
    h->tiered_fetch = host_tiered_fetch;
    h->tiered_acquire = host_tiered_acquire;
    h->tiered_release = host_tiered_release;
    h->crc32c = loom_crc32c_extend;
    h->copy_crc32c = loom_copy_crc32c;
    h->compute = rt->compute;
    if (plugin->kind == LOOM_PLUGIN_COMM)
        h->comm_open = host_comm_open;
    s->next = rt->hosts;
    rt->hosts = s;
    *out = h;
    return LOOM_OK;
}
