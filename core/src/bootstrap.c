/* PLACEHOLDER — replaced by the bootstrap module (issue 2, item 6). */
#include "loom_internal.h"
int loom_bootstrap_detect(loom_launch_env *out) { out->rank = 0; out->world_size = 1; out->local_rank = 0; out->local_size = 1; out->source = "none"; return LOOM_OK; }
int loom_store_open(const loom_launch_env *env, double timeout_s, loom_store **out) { (void)env; (void)timeout_s; (void)out; return LOOM_ERR_NOT_SUPPORTED; }
void loom_store_close(loom_store *store) { (void)store; }
int loom_store_put(loom_store *s, const char *key, const void *value, size_t len) { (void)s; (void)key; (void)value; (void)len; return LOOM_ERR_NOT_SUPPORTED; }
int loom_store_get(loom_store *s, const char *key, void *buf, size_t cap, size_t *len, double timeout_s) { (void)s; (void)key; (void)buf; (void)cap; (void)len; (void)timeout_s; return LOOM_ERR_NOT_SUPPORTED; }
int loom_store_add(loom_store *s, const char *key, int64_t delta, int64_t *result) { (void)s; (void)key; (void)delta; (void)result; return LOOM_ERR_NOT_SUPPORTED; }
int loom_store_barrier(loom_store *s, const char *name, double timeout_s) { (void)s; (void)name; (void)timeout_s; return LOOM_ERR_NOT_SUPPORTED; }
