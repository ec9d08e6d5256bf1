/* The tensor strategy claiming LOOM_STRATEGY_APPROXIMATE, which only a
 * data strategy may declare: the loader must refuse it. */
#include "loom/plugin.h"
#include "loom/strategy.h"

#include "../../plugins/common/strategy_common.h"

/* tp's plugin struct with the capability: the header is its first member,
 * so what follows the braces is the struct's next designated member. */
#undef LOOM_PLUGIN_HEADER
#define LOOM_PLUGIN_HEADER(kind_, struct_type, name_, description_, settings_)                    \
    {LOOM_ABI_VERSION(LOOM_ABI_MAJOR, LOOM_ABI_MINOR), (uint32_t)sizeof(struct_type),             \
     (uint32_t)(kind_), (uint32_t)sizeof(loom_setting_spec), "approximate-tp",                    \
     "tp declaring a capability of the data axis", (settings_)},                                  \
        .capabilities = LOOM_STRATEGY_APPROXIMATE
#include "../../plugins/strategy/tp.c"
