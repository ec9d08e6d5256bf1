/* PLACEHOLDER — replaced by the loader (issue 2, item 4). */
#include "loom_internal.h"
int loom_search_path_init(loom_search_path *sp, const loom_config *cfg) { (void)cfg; sp->count = 0; sp->dirs = NULL; return LOOM_OK; }
void loom_search_path_free(loom_search_path *sp) { (void)sp; }
int loom_plugin_load(const loom_search_path *sp, loom_plugin_kind kind, const char *name, loom_plugin **out) { (void)sp; (void)kind; (void)name; (void)out; return LOOM_ERR_NOT_SUPPORTED; }
void loom_plugin_unload(loom_plugin *p) { (void)p; }
int loom_plugin_has_op(const loom_plugin *p, size_t offset) { (void)p; (void)offset; return 0; }
int loom_cmd_plugins(int argc, char **argv) { (void)argc; (void)argv; return 2; }
