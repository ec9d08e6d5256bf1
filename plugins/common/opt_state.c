/* plugins/common — optimizer state through the tiered service. */
#include <stdio.h>
#include <stdlib.h>

#include "common/opt_state.h"

int opt_state_check_host(const loom_host *host, const char *name)
{
    if (host->struct_size < offsetof(loom_host, tiered_release) + sizeof host->tiered_release ||
        !host->tiered_release)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "%s: needs the core's tiered service (loom_host version 3, ABI 1.4); "
                           "this core is older", name);
    return LOOM_OK;
}

static loom_tiered **arrays(opt_state *o, int k)
{
    loom_tiered **a[3] = {&o->master, &o->m, &o->v};
    return a[k];
}

int opt_state_alloc(opt_state *o, const loom_host *host, const char *name, int nunits,
                    const size_t *elems, int with_master)
{
    *o = (opt_state){.host = host, .nunits = nunits};
    int rc = opt_state_check_host(host, name);
    size_t *bytes = rc == LOOM_OK ? malloc((size_t)nunits * sizeof *bytes) : NULL;
    if (rc == LOOM_OK && !bytes)
        rc = host->error(host, LOOM_ERR_NO_MEMORY, "%s: out of memory", name);
    for (int i = 0; rc == LOOM_OK && i < nunits; i++)
        bytes[i] = elems[i] * sizeof(float);
    static const char *const what[3] = {"master", "m", "v"};
    for (int k = with_master ? 0 : 1; rc == LOOM_OK && k < 3; k++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", name, what[k]);
        rc = host->tiered_alloc(host, LOOM_PURPOSE_OPTIMIZER, label, nunits, bytes, arrays(o, k));
    }
    free(bytes);
    if (rc != LOOM_OK)
        opt_state_free(o);
    return rc;
}

void opt_state_free(opt_state *o)
{
    for (int k = 0; k < 3; k++) {
        loom_tiered **t = arrays(o, k);
        if (*t)
            o->host->tiered_free(o->host, *t);
        *t = NULL;
    }
}

int opt_state_fetch(opt_state *o, int unit)
{
    int rc = LOOM_OK;
    for (int k = 0; k < 3 && rc == LOOM_OK; k++)
        if (*arrays(o, k))
            rc = o->host->tiered_fetch(o->host, *arrays(o, k), unit);
    return rc;
}

int opt_state_acquire(opt_state *o, int unit, opt_view *out)
{
    float **dst[3] = {&out->master, &out->m, &out->v};
    *out = (opt_view){0};
    int k = 0, rc = LOOM_OK;
    for (; k < 3 && rc == LOOM_OK; k++)
        if (*arrays(o, k))
            rc = o->host->tiered_acquire(o->host, *arrays(o, k), unit, LOOM_TIERED_READ,
                                         (void **)dst[k]);
    if (rc != LOOM_OK) /* give back what was acquired, keeping the first error */
        for (int j = 0; j < k - 1; j++)
            if (*arrays(o, j))
                o->host->tiered_release(o->host, *arrays(o, j), unit, 0);
    return rc;
}

int opt_state_release(opt_state *o, int unit, int dirty)
{
    int rc = LOOM_OK;
    for (int k = 0; k < 3; k++) {
        if (!*arrays(o, k))
            continue;
        int r = o->host->tiered_release(o->host, *arrays(o, k), unit, dirty);
        if (rc == LOOM_OK)
            rc = r;
    }
    return rc;
}
