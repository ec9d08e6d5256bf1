/* The host tables' compute member: NULL in a table made before the run's
 * backend is known, then the backend's service in every table, those made
 * before loom_runtime_set_compute and those made after, and a second call
 * reaches them all again. */
#include <stddef.h>

#include "check.h"
#include "loom/compute.h"
#include "runtime/runtime.h"

/* A plugin as the runtime sees one: a kind and a header with a name. */
static loom_plugin plugin_named(loom_plugin_header *header, const char *name)
{
    header->name = name;
    header->kind = LOOM_PLUGIN_COMM;
    loom_plugin p = {0};
    p.kind = LOOM_PLUGIN_COMM;
    p.header = header;
    return p;
}

int main(void)
{
    loom_runtime *rt = NULL;
    OK(loom_runtime_create(NULL, &rt));
    loom_plugin_header ha = {0}, hb = {0};
    loom_plugin a = plugin_named(&ha, "a"), b = plugin_named(&hb, "b");
    static const loom_compute_api cpu = {.struct_size = sizeof cpu, .backend = "cpu"};
    static const loom_compute_api sim = {.struct_size = sizeof sim, .backend = "sim"};

    const loom_host *before = NULL, *after = NULL;
    OK(loom_runtime_host(rt, &a, "comm.a", &before));
    CHECK_EQ(before->version, LOOM_HOST_VERSION);
    CHECK_EQ(before->struct_size, sizeof(loom_host));
    CHECK(offsetof(loom_host, compute) < before->struct_size, "compute within the table");
    CHECK(before->compute == NULL, "no backend yet: compute is NULL");

    OK(loom_runtime_set_compute(rt, &cpu));
    CHECK(before->compute == &cpu, "a table made before the backend gets it");
    OK(loom_runtime_host(rt, &b, "comm.b", &after));
    CHECK(after->compute == &cpu, "a table made after the backend has it");

    OK(loom_runtime_set_compute(rt, &sim));
    CHECK(before->compute == &sim && after->compute == &sim, "a second call reaches every table");
    const loom_host *again = NULL;
    OK(loom_runtime_host(rt, &a, "comm.a", &again));
    CHECK(again == before, "the same plugin and group: the same table");

    loom_runtime_destroy(rt);
    return check_done("host_compute");
}
