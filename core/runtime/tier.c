/* Tiered model state (ZeRO-Offload, ZeRO-Infinity): each purpose lives
 * where memory.offload says. Not offloaded, it lives where the model
 * computes (host memory, or the device tier on a device backend); offloaded
 * to "host", in host memory. There a segment is used in place. In
 * the nvme tier a segment is at home in a block of the tier and comes into
 * a host staging buffer for use: fetch reads it ahead, release writes it
 * behind. Staging memory changes hands only at the caller's calls (a write
 * keeps its staging until the buffer's next write-back or a flush), never
 * when a transfer happens to finish, so host bytes are the same on every
 * run and can be asserted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/memtier.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "runtime/tier.h"
#include "runtime/trace.h"

/* Segments a streamed buffer holds in host memory at most, in the estimate
 * the budget's advice gives: one read ahead, one in use, one written behind. */
#define STAGED_SEGMENTS 3

typedef enum seg_state {
    SEG_HOME,     /* in the tier only */
    SEG_READING,  /* staging allocated, read in flight or landed */
    SEG_RESIDENT, /* staging holds it */
    SEG_WRITING,  /* staging holds it and is being (or was) written back */
} seg_state;

typedef struct seg_slot {
    size_t bytes;
    loom_tier_block *block;
    void *staging;
    loom_tier_request *req; /* the transfer in flight; NULL once seen complete */
    uint64_t start_ns;
    seg_state state;
    int refs, dirty;
} seg_slot;

struct loom_tiered {
    loom_tiers *tiers;
    loom_purpose purpose;
    loom_offload where; /* NONE and HOST: in memory the caller uses in place */
    int on_device;      /* that memory is the device tier's: the model computes there */
    char name[48];
    int nsegments;
    seg_slot *seg;
    char *base;     /* in host memory: every segment, one after the other */
    size_t *offset; /* of each segment in base */
    size_t max_segment;
    int writing; /* the segment whose write-back holds its staging, or -1 */
    loom_tiered *prev, *next;
};

struct loom_tiers {
    loom_runtime *rt;
    loom_offload where[LOOM_PURPOSE_COUNT];
    const loom_memtier_ops *ops;
    loom_memtier *tier;
    loom_tiered *buffers;
    loom_tier_counters counters;
    int used[LOOM_PURPOSE_COUNT]; /* a buffer of this purpose was ever allocated */
    int device; /* the model computes in device memory: what memory.offload keeps stays there */
};

static const char *const offload_names[] = {"none", "host", "nvme"};

const char *loom_offload_name(loom_offload o)
{
    return (unsigned)o < LOOM_ARRAY_LEN(offload_names) ? offload_names[o] : "?";
}

static loom_offload parse_offload(const char *text)
{
    for (unsigned i = 0; i < LOOM_ARRAY_LEN(offload_names); i++)
        if (!strcmp(text, offload_names[i]))
            return (loom_offload)i;
    return LOOM_OFFLOAD_NONE; /* the schema allows no other */
}

/* The setting that places a purpose. */
static const char *setting_of(loom_purpose p)
{
    if (p == LOOM_PURPOSE_OPTIMIZER)
        return "memory.offload.optimizer";
    if (p == LOOM_PURPOSE_PARAMS || p == LOOM_PURPOSE_GRADS)
        return "memory.offload.params";
    return NULL;
}

loom_offload loom_tiers_offload(const loom_tiers *t, loom_purpose purpose)
{
    return t && (unsigned)purpose < LOOM_PURPOSE_COUNT ? t->where[purpose] : LOOM_OFFLOAD_NONE;
}

/* ------------------------------------------------------------ budget */

/* Host bytes the purposes' buffers hold in place, and what streaming them
 * instead would keep in staging. */
static void movable(const loom_tiers *t, loom_purpose p, uint64_t *held, uint64_t *staged)
{
    for (const loom_tiered *b = t->buffers; b; b = b->next) {
        if (b->purpose != p || b->where == LOOM_OFFLOAD_NVME || b->on_device)
            continue;
        for (int i = 0; i < b->nsegments; i++)
            *held += b->seg[i].bytes;
        int n = b->nsegments < STAGED_SEGMENTS ? b->nsegments : STAGED_SEGMENTS;
        *staged += (uint64_t)n * b->max_segment;
    }
}

/* Host bytes the nvme tier itself would take if it were loaded now: its
 * registered buffers, queue_depth x block_bytes at the defaults it declares
 * (its settings are refused while no purpose goes to nvme). */
static uint64_t tier_buffers(const loom_tiers *t)
{
    const loom_plugin *plugin = NULL;
    if (t->tier || loom_runtime_plugin(t->rt, LOOM_PLUGIN_MEMTIER, "nvme", &plugin) != LOOM_OK)
        return 0; /* loaded: already in the accounting */
    uint64_t depth = 0, block = 0;
    for (const loom_setting_spec *sp = plugin->header->settings; sp && sp->name; sp++) {
        if (!strcmp(sp->name, "queue_depth") && sp->default_value)
            depth = strtoull(sp->default_value, NULL, 10);
        if (!strcmp(sp->name, "block_bytes") && sp->default_value)
            block = strtoull(sp->default_value, NULL, 10);
    }
    return depth * block + 4096;
}

/* Appends to buf the smallest offload that would bring the host's bytes
 * (plus extra more) under the limit, as this accounting estimates it. */
static void advise(void *ctx, loom_purpose purpose, uint64_t extra, char *buf, size_t cap)
{
    (void)purpose;
    const loom_tiers *t = ctx;
    uint64_t limit = loom_mem_host_limit(), need = loom_mem_host_bytes() + extra;
    typedef struct choice {
        const char *text;
        loom_purpose moves[2];
        int n;
    } choice;
    const choice choices[] = {
        {"memory.offload.optimizer = \"nvme\"", {LOOM_PURPOSE_OPTIMIZER}, 1},
        {"memory.offload.params = \"nvme\"", {LOOM_PURPOSE_PARAMS, LOOM_PURPOSE_GRADS}, 2},
    };
    uint64_t after = need + tier_buffers(t);
    char tried[160] = "";
    int any = 0;
    for (size_t c = 0; c < LOOM_ARRAY_LEN(choices); c++) {
        uint64_t held = 0, staged = 0;
        for (int k = 0; k < choices[c].n; k++)
            movable(t, choices[c].moves[k], &held, &staged);
        if (held <= staged)
            continue; /* nothing to gain, or already offloaded */
        after -= held - staged;
        size_t n = strlen(tried);
        snprintf(tried + n, sizeof tried - n, "%s%s", any ? " and " : "", choices[c].text);
        any = 1;
        char est[32];
        loom_mem_format(after, est, sizeof est);
        if (after <= limit) {
            snprintf(buf, cap, "; %s would hold about %s (what moves leaves the host; up to %d "
                     "units of it at a time pass through staging, and the tier's buffers come in)",
                     tried, est, STAGED_SEGMENTS);
            return;
        }
    }
    char est[32];
    loom_mem_format(after, est, sizeof est);
    if (any)
        snprintf(buf, cap, "; even %s would leave about %s: raise memory.host_limit or shard "
                 "the model over more ranks (zero3)", tried, est);
    else
        snprintf(buf, cap, "; the dp strategy places no state the offload tiers could move: "
                 "raise memory.host_limit or shard the model over more ranks (zero3)");
}

int loom_tiers_settle_budget(const loom_tiers *t)
{
    loom_mem_overrun o;
    if (!loom_mem_overrun_get(&o))
        return LOOM_OK;
    char limit[32], held[32], asked[32], parts[256], advice[384] = "";
    loom_mem_format(loom_mem_host_limit(), limit, sizeof limit);
    loom_mem_format(loom_mem_host_bytes(), held, sizeof held);
    loom_mem_format(o.bytes, asked, sizeof asked);
    loom_mem_host_parts(parts, sizeof parts);
    advise((void *)t, o.purpose, 0, advice, sizeof advice);
    return loom_fail(LOOM_ERR_NO_MEMORY,
                     "memory.host_limit = %s: activations and model state take %s of host memory on this "
                     "rank (%s); %s passed the limit asking %s more%s",
                     limit, held, parts, loom_purpose_name(o.purpose), asked, advice);
}

void loom_tiers_set_device(loom_tiers *t, const char *backend)
{
    t->device = backend != NULL;
    loom_config *cfg = loom_runtime_config(t->rt);
    const char *const settings[] = {"memory.offload.optimizer", "memory.offload.params"};
    for (size_t k = 0; k < LOOM_ARRAY_LEN(settings); k++) {
        const char *value = NULL;
        if (!cfg || loom_runtime_env(t->rt)->rank != 0 ||
            loom_config_string(cfg, settings[k], &value) != LOOM_OK || strcmp(value, "host") != 0)
            continue;
        if (backend)
            loom_log(LOOM_LOG_INFO,
                     "%s = \"host\": this state lives in host memory, off the %s backend's "
                     "device memory", settings[k], backend);
        else
            loom_log(LOOM_LOG_INFO,
                     "%s = \"host\": loom computes in host memory, so this state stays where "
                     "it is (with compute on a device it would move from device to host memory)",
                     settings[k]);
    }
}

/* ------------------------------------------------------------ create */

int loom_tiers_create(loom_runtime *rt, loom_tiers **out)
{
    loom_config *cfg = loom_runtime_config(rt);
    loom_tiers *t = calloc(1, sizeof *t);
    if (!t)
        return loom_fail(LOOM_ERR_NO_MEMORY, "memory: out of memory");
    t->rt = rt;
    int nvme = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++) {
        const char *setting = setting_of((loom_purpose)p), *value = NULL;
        if (setting && cfg && loom_config_string(cfg, setting, &value) == LOOM_OK)
            t->where[p] = parse_offload(value);
        nvme |= t->where[p] == LOOM_OFFLOAD_NVME;
    }
    int64_t limit = 0;
    if (cfg)
        loom_config_int(cfg, "memory.host_limit", &limit);
    loom_mem_set_host_limit((uint64_t)limit);
    loom_mem_set_advisor(advise, t);
    int rc = LOOM_OK;
    if (!nvme && cfg) {
        rc = loom_config_refuse_unused_group(
            cfg, "memory.offload",
            "only the nvme tier reads it, and nothing is offloaded to nvme "
            "(memory.offload.optimizer and .params are not \"nvme\")");
    } else if (nvme) {
        const loom_plugin *plugin = NULL;
        const loom_host *host = NULL;
        rc = loom_runtime_plugin(rt, LOOM_PLUGIN_MEMTIER, "nvme", &plugin);
        if (rc == LOOM_OK)
            rc = loom_runtime_host(rt, plugin, "memory.offload", &host);
        if (rc == LOOM_OK) {
            t->ops = &plugin->ops.memtier;
            rc = t->ops->create(host, &t->tier);
        }
    }
    if (rc != LOOM_OK) {
        loom_tiers_destroy(t);
        return rc;
    }
    *out = t;
    return LOOM_OK;
}

void loom_tiers_destroy(loom_tiers *t)
{
    if (!t)
        return;
    while (t->buffers)
        loom_tiers_free(t->buffers);
    if (t->tier)
        t->ops->destroy(t->tier);
    loom_mem_set_advisor(NULL, NULL);
    loom_mem_set_host_limit(0);
    loom_mem_defer_limit(0);
    free(t);
}

/* ---------------------------------------------------------- transfers */

static void label(const loom_tiered *b, int i, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %s %s #%d", loom_offload_name(b->where), what, b->name, i);
}

/* Wait (or only look, when !block) for segment i's transfer; the span on
 * the memory lane ends when it is seen complete. */
static int finish(loom_tiered *b, int i, int block)
{
    seg_slot *s = &b->seg[i];
    if (!s->req)
        return LOOM_OK;
    loom_tiers *t = b->tiers;
    int rc = t->ops->test(s->req);
    if (rc == LOOM_IN_PROGRESS && !block)
        return LOOM_IN_PROGRESS;
    char name[96], waited[104];
    label(b, i, s->state == SEG_WRITING ? "write" : "read", name, sizeof name);
    if (rc == LOOM_IN_PROGRESS) {
        /* Exposed I/O: the compute lane shows how long the caller sat. */
        uint64_t t0 = loom_now_ns();
        rc = t->ops->wait(s->req);
        uint64_t t1 = loom_now_ns();
        t->counters.wait_ns += t1 - t0;
        snprintf(waited, sizeof waited, "wait %s", name);
        loom_trace_span(LOOM_LANE_COMPUTE, waited, t0, t1, 0);
    }
    s->req = NULL; /* released either way */
    loom_trace_span(LOOM_LANE_MEMORY, name, s->start_ns, loom_now_ns(), s->bytes);
    return rc;
}

static void drop_staging(loom_tiered *b, int i)
{
    seg_slot *s = &b->seg[i];
    loom_mem_free(s->staging);
    s->staging = NULL;
    s->state = SEG_HOME;
}

static int start_read(loom_tiered *b, int i)
{
    seg_slot *s = &b->seg[i];
    loom_tiers *t = b->tiers;
    int rc = loom_mem_alloc(LOOM_TIER_HOST, b->purpose, s->bytes, &s->staging);
    if (rc != LOOM_OK)
        return rc;
    s->start_ns = loom_now_ns();
    s->state = SEG_READING;
    rc = t->ops->read(t->tier, s->block, 0, s->staging, s->bytes, &s->req);
    if (rc != LOOM_OK) {
        s->req = NULL;
        drop_staging(b, i);
        return rc;
    }
    t->counters.read[b->purpose] += s->bytes;
    return LOOM_OK;
}

/* The buffer's write-back in flight completes and gives its staging back. */
static int retire_write(loom_tiered *b)
{
    if (b->writing < 0)
        return LOOM_OK;
    int i = b->writing;
    b->writing = -1;
    int rc = finish(b, i, 1);
    if (b->seg[i].refs == 0)
        drop_staging(b, i);
    else
        b->seg[i].state = SEG_RESIDENT; /* acquired again while it was written */
    return rc;
}

static int start_write(loom_tiered *b, int i)
{
    seg_slot *s = &b->seg[i];
    loom_tiers *t = b->tiers;
    int rc = retire_write(b);
    if (rc != LOOM_OK)
        return rc;
    s->start_ns = loom_now_ns();
    s->state = SEG_WRITING;
    s->dirty = 0;
    rc = t->ops->write(t->tier, s->block, 0, s->staging, s->bytes, &s->req);
    if (rc != LOOM_OK) {
        s->req = NULL;
        drop_staging(b, i);
        return rc;
    }
    t->counters.written[b->purpose] += s->bytes;
    b->writing = i;
    return LOOM_OK;
}

/* ------------------------------------------------------------ service */

static int check_segment(const loom_tiered *b, int segment, const char *op)
{
    if (!b)
        return loom_fail(LOOM_ERR_INVALID, "memory: tiered %s of a NULL buffer", op);
    if (segment < 0 || segment >= b->nsegments)
        return loom_fail(LOOM_ERR_INVALID, "memory: tiered %s of segment %d of '%s', which has %d",
                         op, segment, b->name, b->nsegments);
    return LOOM_OK;
}

int loom_tiers_alloc(loom_tiers *t, loom_purpose purpose, const char *name, int nsegments,
                     const size_t *segment_bytes, loom_tiered **out)
{
    if ((unsigned)purpose >= LOOM_PURPOSE_COUNT || nsegments <= 0 || !segment_bytes || !out)
        return loom_fail(LOOM_ERR_INVALID, "memory: tiered_alloc needs a purpose, segments and "
                         "their sizes");
    loom_tiered *b = calloc(1, sizeof *b);
    seg_slot *seg = calloc((size_t)nsegments, sizeof *seg);
    size_t *offset = calloc((size_t)nsegments, sizeof *offset);
    if (!b || !seg || !offset) {
        free(b);
        free(seg);
        free(offset);
        return loom_fail(LOOM_ERR_NO_MEMORY, "memory: out of memory");
    }
    *b = (loom_tiered){.tiers = t, .purpose = purpose, .where = t->where[purpose],
                       .on_device = t->device && t->where[purpose] == LOOM_OFFLOAD_NONE,
                       .nsegments = nsegments, .seg = seg, .offset = offset, .writing = -1};
    snprintf(b->name, sizeof b->name, "%s", name ? name : loom_purpose_name(purpose));
    size_t total = 0;
    for (int i = 0; i < nsegments; i++) {
        seg[i].bytes = segment_bytes[i];
        offset[i] = total;
        total += segment_bytes[i];
        if (segment_bytes[i] > b->max_segment)
            b->max_segment = segment_bytes[i];
    }
    b->next = t->buffers;
    if (t->buffers)
        t->buffers->prev = b;
    t->buffers = b;
    t->used[purpose] = 1;
    int rc = LOOM_OK;
    if (b->on_device) {
        /* The device memory provider's blocks come zeroed (memory.h). */
        rc = loom_mem_alloc(LOOM_TIER_DEVICE, purpose, total ? total : 1, (void **)&b->base);
    } else if (b->where != LOOM_OFFLOAD_NVME) {
        rc = loom_mem_alloc(LOOM_TIER_HOST, purpose, total ? total : 1, (void **)&b->base);
        if (rc == LOOM_OK)
            memset(b->base, 0, total);
    } else {
        /* A new block reads as zeros (memtier.h). */
        for (int i = 0; i < nsegments && rc == LOOM_OK; i++) {
            rc = t->ops->alloc(t->tier, seg[i].bytes ? seg[i].bytes : 1, 64, &seg[i].block);
            if (rc == LOOM_OK)
                loom_mem_account(LOOM_TIER_NVME, purpose, (int64_t)seg[i].bytes);
        }
    }
    if (rc != LOOM_OK) {
        loom_tiers_free(b);
        return rc;
    }
    *out = b;
    return LOOM_OK;
}

void loom_tiers_free(loom_tiered *b)
{
    if (!b)
        return;
    loom_tiers *t = b->tiers;
    for (int i = 0; i < b->nsegments; i++) {
        seg_slot *s = &b->seg[i];
        if (s->req && finish(b, i, 1) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "memory: %s", loom_last_error());
        if (s->staging)
            drop_staging(b, i);
        if (s->block) {
            t->ops->free(t->tier, s->block);
            loom_mem_account(LOOM_TIER_NVME, b->purpose, -(int64_t)s->bytes);
        }
    }
    loom_mem_free(b->base);
    if (b->prev)
        b->prev->next = b->next;
    else
        t->buffers = b->next;
    if (b->next)
        b->next->prev = b->prev;
    free(b->seg);
    free(b->offset);
    free(b);
}

int loom_tiers_fetch(loom_tiered *b, int segment)
{
    int rc = check_segment(b, segment, "fetch");
    if (rc != LOOM_OK || b->where != LOOM_OFFLOAD_NVME || b->seg[segment].state != SEG_HOME)
        return rc;
    return start_read(b, segment);
}

int loom_tiers_acquire(loom_tiered *b, int segment, unsigned mode, void **ptr)
{
    int rc = check_segment(b, segment, "acquire");
    if (rc != LOOM_OK)
        return rc;
    seg_slot *s = &b->seg[segment];
    if (b->where != LOOM_OFFLOAD_NVME) {
        s->refs++;
        *ptr = b->base + b->offset[segment];
        return LOOM_OK;
    }
    switch (s->state) {
    case SEG_HOME:
        if (mode == LOOM_TIERED_OVERWRITE) {
            rc = loom_mem_alloc(LOOM_TIER_HOST, b->purpose, s->bytes, &s->staging);
            break;
        }
        rc = start_read(b, segment);
        if (rc == LOOM_OK)
            rc = finish(b, segment, 1);
        break;
    case SEG_READING:
        rc = finish(b, segment, 1);
        break;
    case SEG_WRITING: /* its staging holds the data: only the write must land */
        s->refs++; /* so the retired write keeps the staging */
        rc = retire_write(b);
        s->refs--;
        break;
    case SEG_RESIDENT:
        break;
    }
    if (rc != LOOM_OK) {
        if (s->staging && s->refs == 0)
            drop_staging(b, segment);
        return rc;
    }
    s->state = SEG_RESIDENT;
    s->refs++;
    *ptr = s->staging;
    return LOOM_OK;
}

int loom_tiers_release(loom_tiered *b, int segment, int dirty)
{
    int rc = check_segment(b, segment, "release");
    if (rc != LOOM_OK)
        return rc;
    seg_slot *s = &b->seg[segment];
    if (s->refs <= 0)
        return loom_fail(LOOM_ERR_INVALID, "memory: release of segment %d of '%s', which is not "
                         "acquired", segment, b->name);
    s->refs--;
    if (b->where != LOOM_OFFLOAD_NVME)
        return LOOM_OK;
    s->dirty |= dirty != 0;
    if (s->refs > 0)
        return LOOM_OK;
    if (s->dirty)
        return start_write(b, segment);
    drop_staging(b, segment);
    return LOOM_OK;
}

int loom_tiers_progress(loom_tiers *t)
{
    if (!t || !t->tier)
        return LOOM_OK;
    for (loom_tiered *b = t->buffers; b; b = b->next)
        for (int i = 0; i < b->nsegments; i++) {
            if (!b->seg[i].req)
                continue;
            int rc = finish(b, i, 0);
            if (rc != LOOM_OK && rc != LOOM_IN_PROGRESS)
                return rc;
        }
    return LOOM_OK;
}

int loom_tiers_flush(loom_tiers *t)
{
    int rc = LOOM_OK;
    for (loom_tiered *b = t ? t->buffers : NULL; b; b = b->next) {
        int r = retire_write(b);
        if (rc == LOOM_OK)
            rc = r;
    }
    return rc;
}

void loom_tiers_counters(const loom_tiers *t, loom_tier_counters *out)
{
    if (t)
        *out = t->counters;
    else
        *out = (loom_tier_counters){0};
}

int loom_tiers_check_used(const loom_tiers *t, const char *strategy)
{
    const loom_purpose checked[] = {LOOM_PURPOSE_OPTIMIZER, LOOM_PURPOSE_PARAMS};
    loom_config *cfg = loom_runtime_config(t->rt);
    for (size_t k = 0; k < LOOM_ARRAY_LEN(checked); k++) {
        loom_purpose p = checked[k];
        if (t->where[p] == LOOM_OFFLOAD_NONE || t->used[p])
            continue;
        const char *setting = setting_of(p);
        const char *why =
            p == LOOM_PURPOSE_PARAMS
                ? "keeps its parameters whole in host memory (only a strategy that shards them "
                  "at rest, zero3, places them in a tier)"
                : "places no optimizer state through the core's tiered service (loom_host "
                  "tiered_alloc, ABI 1.4)";
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: %s = \"%s\": the dp strategy '%s' %s, so the setting would do "
                         "nothing; set it to \"none\"%s",
                         loom_config_where(cfg, setting), setting,
                         loom_offload_name(t->where[p]), strategy, why,
                         p == LOOM_PURPOSE_PARAMS ? " or use parallel.dp.strategy = \"zero3\"" : "");
    }
    return LOOM_OK;
}
