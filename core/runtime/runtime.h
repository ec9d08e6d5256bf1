/* loom runtime — The per-process runtime: config, launch env, store, loaded plugins. */
#ifndef LOOM_RUNTIME_RUNTIME_H
#define LOOM_RUNTIME_RUNTIME_H

#include "loom/plugin.h"
#include "runtime/bootstrap.h"
#include "runtime/config.h"
#include "runtime/loader.h"

/* One per process: config, launch env, bootstrap store, search path, the
 * loaded plugins, memory accounting, trace. */
typedef struct loom_runtime loom_runtime;
int loom_runtime_create(loom_config *cfg, loom_runtime **out);
void loom_runtime_destroy(loom_runtime *rt);
const loom_launch_env *loom_runtime_env(const loom_runtime *rt);
loom_config *loom_runtime_config(loom_runtime *rt);
loom_store *loom_runtime_store(loom_runtime *rt); /* NULL for a world of one */
double loom_runtime_timeout(const loom_runtime *rt); /* comm.timeout_s */
/* Where memory.offload puts model state (runtime/tier.h): made at the
 * first call, which loads the nvme tier if a purpose goes there. */
struct loom_tiers;
int loom_runtime_tiers(loom_runtime *rt, struct loom_tiers **out);
/* A host table for a plugin instance, its settings read from the config
 * group at settings_path, "comm.ucx" (validated there against the plugin's
 * specs). Owned by rt. */
int loom_runtime_host(loom_runtime *rt, const loom_plugin *plugin, const char *settings_path,
                      const loom_host **out);
/* The run's compute backend, as strategies reach it (loom_host.compute):
 * set in every host table made so far and in every one made after; tables
 * made before the first call have NULL. api must outlive rt (or the next
 * call). */
int loom_runtime_set_compute(loom_runtime *rt, const loom_compute_api *api);
/* The api last set; NULL before the first loom_runtime_set_compute. */
const loom_compute_api *loom_runtime_compute(const loom_runtime *rt);
/* Load a plugin once per runtime (cached by kind and name; unloaded at
 * destroy). */
int loom_runtime_plugin(loom_runtime *rt, loom_plugin_kind kind, const char *name,
                        const loom_plugin **out);
/* The comm backend plugin opened with host->comm_open (a wrapper's inner),
 * and (inner_host, may be NULL) its host table; NULL if it opened none. */
const loom_plugin *loom_runtime_comm_opened(loom_runtime *rt, const loom_plugin *plugin,
                                            const loom_host **inner_host);
/* The memory kinds a comm plugin takes: its mem_kinds, or for
 * LOOM_MEM_KINDS_INNER those of the backend it opened (followed through
 * nested wrappers); an error if it opened none. */
int loom_runtime_comm_mem_kinds(loom_runtime *rt, const loom_plugin *plugin, uint32_t *kinds);
/* Whether comm, a communicator of plugin, is target or forwards to it
 * through the inner ops of the wrappers on the way. */
int loom_runtime_comm_forwards_to(loom_runtime *rt, const loom_plugin *plugin,
                                  struct loom_comm *comm, const struct loom_comm *target);

#endif
