/* plugins/common — model state in segments, and the optimizer's. */
#include <stdio.h>
#include <stdlib.h>

#include "common/compute.h"
#include "common/opt_state.h"

/* Whether the host has the tiered service (ABI 1.4). */
static int opt_state_check_tiered(const loom_host *host)
{
    return host->struct_size >= offsetof(loom_host, tiered_release) + sizeof host->tiered_release &&
           host->tiered_release;
}

int opt_state_check_host(const loom_host *host, const char *name)
{
    if (!opt_state_check_tiered(host))
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "%s: needs the core's tiered service (loom_host version 3, ABI 1.4); "
                           "this core is older", name);
    return LOOM_OK;
}

/* ---- state buffers ---- */

int state_buffer_alloc(state_buffer *b, const loom_host *host, loom_purpose purpose,
                       const char *name, int nsegments, const size_t *bytes)
{
    *b = (state_buffer){.host = host, .nsegments = nsegments};
    /* The optimizer state goes where memory.offload says, on a device too
     * (ZeRO-Offload: the core gives it a home in the device tier, or host
     * memory); parameter and gradient shards on a device stay in its
     * memory, which memory.offload.params may not move. */
    if (strategy_model_on_host(host) ||
        (purpose == LOOM_PURPOSE_OPTIMIZER && opt_state_check_tiered(host)))
        return host->tiered_alloc(host, purpose, name, nsegments, bytes, &b->tiered);
    b->offset = malloc((size_t)(nsegments > 0 ? nsegments : 1) * sizeof *b->offset);
    if (!b->offset)
        return host->error(host, LOOM_ERR_NO_MEMORY, "%s: out of memory", name);
    size_t total = 0;
    for (int i = 0; i < nsegments; i++) {
        b->offset[i] = total;
        total += bytes[i];
    }
    void *base = NULL;
    int rc = strategy_alloc_model(host, purpose, total, &base);
    if (rc != LOOM_OK) {
        free(b->offset);
        b->offset = NULL;
        return rc;
    }
    b->base = base;
    return LOOM_OK;
}

void state_buffer_free(state_buffer *b)
{
    if (b->tiered)
        b->host->tiered_free(b->host, b->tiered);
    if (b->base)
        b->host->mem_free(b->host, b->base);
    free(b->offset);
    b->tiered = NULL;
    b->base = NULL;
    b->offset = NULL;
}

int state_buffer_fetch(state_buffer *b, int segment)
{
    return b->tiered ? b->host->tiered_fetch(b->host, b->tiered, segment) : LOOM_OK;
}

int state_buffer_acquire(state_buffer *b, int segment, unsigned mode, void **ptr)
{
    if (b->tiered)
        return b->host->tiered_acquire(b->host, b->tiered, segment, mode, ptr);
    if (segment < 0 || segment >= b->nsegments)
        return b->host->error(b->host, LOOM_ERR_INVALID,
                              "state segment %d of %d acquired (a strategy bug)", segment,
                              b->nsegments);
    *ptr = b->base + b->offset[segment];
    return LOOM_OK;
}

int state_buffer_release(state_buffer *b, int segment, int dirty)
{
    return b->tiered ? b->host->tiered_release(b->host, b->tiered, segment, dirty) : LOOM_OK;
}

/* ---- the optimizer's ---- */

static state_buffer *part(opt_state *o, int k)
{
    state_buffer *a[3] = {&o->master, &o->m, &o->v};
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
        rc = state_buffer_alloc(part(o, k), host, LOOM_PURPOSE_OPTIMIZER, label, nunits, bytes);
    }
    free(bytes);
    if (rc != LOOM_OK)
        opt_state_free(o);
    return rc;
}

void opt_state_free(opt_state *o)
{
    for (int k = 0; k < 3; k++)
        state_buffer_free(part(o, k));
}

int opt_state_fetch(opt_state *o, int unit)
{
    int rc = LOOM_OK;
    for (int k = 0; k < 3 && rc == LOOM_OK; k++)
        if (state_buffer_allocated(part(o, k)))
            rc = state_buffer_fetch(part(o, k), unit);
    return rc;
}

int opt_state_acquire(opt_state *o, int unit, opt_view *out)
{
    float **dst[3] = {&out->master, &out->m, &out->v};
    *out = (opt_view){0};
    int k = 0, rc = LOOM_OK;
    for (; k < 3 && rc == LOOM_OK; k++)
        if (state_buffer_allocated(part(o, k)))
            rc = state_buffer_acquire(part(o, k), unit, LOOM_TIERED_READ, (void **)dst[k]);
    if (rc != LOOM_OK) /* give back what was acquired, keeping the first error */
        for (int j = 0; j < k - 1; j++)
            if (state_buffer_allocated(part(o, j)))
                state_buffer_release(part(o, j), unit, 0);
    return rc;
}

int opt_state_release(opt_state *o, int unit, int dirty)
{
    int rc = LOOM_OK;
    for (int k = 0; k < 3; k++) {
        if (!state_buffer_allocated(part(o, k)))
            continue;
        int r = state_buffer_release(part(o, k), unit, dirty);
        if (rc == LOOM_OK)
            rc = r;
    }
    return rc;
}
