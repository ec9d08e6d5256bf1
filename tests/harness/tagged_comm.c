/* A communicator with a setting of its own, for the harness's reference
 * runs: the mpi backend named "tagged", whose one setting, comm.tagged.note,
 * it ignores. The reference, on the core's default backend, must go without
 * comm.tagged.* (a group no plugin of its run declares) and keep comm.mpi.*
 * (its own backend's). */
#include "loom/plugin.h"

static const loom_setting_spec tagged_settings[] = {
    {.name = "note", .type = LOOM_SETTING_STRING, .default_value = "\"\"",
     .help = "any text; the backend ignores it"},
    {0},
};

/* The backend's header, renamed and with these settings; mpi's own reads
 * fall back to their defaults. */
#undef LOOM_PLUGIN_HEADER
#define LOOM_PLUGIN_HEADER(kind_, struct_type, name_, description_, settings_)                    \
    {LOOM_ABI_VERSION(LOOM_ABI_MAJOR, LOOM_ABI_MINOR), (uint32_t)sizeof(struct_type),             \
     (uint32_t)(kind_), (uint32_t)sizeof(loom_setting_spec), "tagged",                            \
     "mpi under another name, with a setting of its own", tagged_settings}
#include "../../plugins/comm-mpi/comm_mpi.c"
