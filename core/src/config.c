/* PLACEHOLDER — replaced by the config module (issue 2, item 5). */
#include "loom_internal.h"
int loom_config_load(const char *path, const char *const *overrides, int noverrides, loom_config **out)
{ (void)path; (void)overrides; (void)noverrides; (void)out; return loom_fail(LOOM_ERR_NOT_SUPPORTED, "config: not built yet"); }
int loom_config_parse(const char *text, const char *name, const char *const *overrides, int noverrides, loom_config **out)
{ (void)text; (void)name; (void)overrides; (void)noverrides; (void)out; return LOOM_ERR_NOT_SUPPORTED; }
void loom_config_free(loom_config *cfg) { (void)cfg; }
int loom_config_int(const loom_config *cfg, const char *path, int64_t *out) { (void)cfg; (void)path; (void)out; return LOOM_ERR_NOT_FOUND; }
int loom_config_float(const loom_config *cfg, const char *path, double *out) { (void)cfg; (void)path; (void)out; return LOOM_ERR_NOT_FOUND; }
int loom_config_bool(const loom_config *cfg, const char *path, int *out) { (void)cfg; (void)path; (void)out; return LOOM_ERR_NOT_FOUND; }
int loom_config_string(const loom_config *cfg, const char *path, const char **out) { (void)cfg; (void)path; (void)out; return LOOM_ERR_NOT_FOUND; }
int loom_config_list_len(const loom_config *cfg, const char *path) { (void)cfg; (void)path; return -1; }
const char *loom_config_list_string(const loom_config *cfg, const char *path, int index) { (void)cfg; (void)path; (void)index; return NULL; }
int loom_config_is_set(const loom_config *cfg, const char *path) { (void)cfg; (void)path; return 0; }
const char *loom_config_where(const loom_config *cfg, const char *path) { (void)cfg; (void)path; return "default"; }
const char *loom_config_file(const loom_config *cfg) { (void)cfg; return NULL; }
int loom_config_check_group(loom_config *cfg, const char *group_path, const loom_setting_spec *specs, const char *const *skip)
{ (void)cfg; (void)group_path; (void)specs; (void)skip; return LOOM_OK; }
