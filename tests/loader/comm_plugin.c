/* A communicator for a world of one, with real single-rank semantics so
 * `loom plugins --check` can run its functional checks on it, and the
 * deliberately broken variants the loader must refuse (one -DVARIANT_* each;
 * see CMakeLists.txt). Collectives copy send to recv; send/recv to self
 * match by tag in posting order. */
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "good"
#endif

struct loom_comm {
    const loom_host *host;
    loom_comm_request *pending; /* unmatched sends and recvs to self, oldest first */
};

struct loom_comm_request {
    loom_comm *comm;
    int done;
    int is_send;
    const void *send_buf;
    void *recv_buf;
    size_t bytes;
    int tag;
    loom_comm_request *next;
};

#if defined(VARIANT_UNDEFINED)
/* Defined nowhere: with RTLD_NOW, dlopen fails naming it. */
extern int loom_test_symbol_nobody_defines(void);
#endif

#if defined(VARIANT_NEEDSLIB)
/* In libloom-test-needed.so, which the dynamic loader cannot find. */
extern int loader_test_needed(void);
#endif

#if defined(VARIANT_PLANTED)
#include <stdio.h>
/* Code that runs the moment the file is loaded: it leaves a file where
 * LOOM_TEST_PLANTED_MARKER says, so a test can tell whether any command
 * loaded the plugin (listing must only read it). */
__attribute__((constructor)) static void planted(void)
{
    const char *marker = getenv("LOOM_TEST_PLANTED_MARKER");
    FILE *f = marker ? fopen(marker, "w") : NULL;
    if (f)
        fclose(f);
}
#endif

static int comm_new(const loom_host *host, loom_comm **out)
{
    loom_comm *c = calloc(1, sizeof *c);
    if (!c)
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-%s: out of memory", PLUGIN_NAME);
    c->host = host;
    *out = c;
    return LOOM_OK;
}

static int create_world(const loom_host *host, loom_comm **out)
{
#if defined(VARIANT_UNDEFINED)
    if (loom_test_symbol_nobody_defines())
        return LOOM_ERR_INTERNAL;
#endif
#if defined(VARIANT_NEEDSLIB)
    if (loader_test_needed() != 42)
        return LOOM_ERR_INTERNAL;
#endif
    if (host->world_size != 1)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "comm-%s serves a world of one, not %d ranks", PLUGIN_NAME,
                           host->world_size);
    return comm_new(host, out);
}

static int create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out)
{
    if (nranks != 1 || ranks[0] != 0)
        return parent->host->error(parent->host, LOOM_ERR_INVALID,
                                   "comm-%s: a subgroup of a world of one is rank 0 alone",
                                   PLUGIN_NAME);
    return comm_new(parent->host, out);
}

static int destroy(loom_comm *comm)
{
    while (comm->pending) {
        loom_comm_request *r = comm->pending;
        comm->pending = r->next;
        free(r);
    }
    free(comm);
    return LOOM_OK;
}

static int rank(const loom_comm *comm)
{
    (void)comm;
    return 0;
}

static int size(const loom_comm *comm)
{
    (void)comm;
    return 1;
}

/* A request that is already complete, so test/wait have something to do. */
static int done_request(loom_comm *comm, loom_comm_request **req)
{
    loom_comm_request *r = calloc(1, sizeof *r);
    if (!r)
        return comm->host->error(comm->host, LOOM_ERR_NO_MEMORY, "comm-%s: out of memory",
                                 PLUGIN_NAME);
    r->comm = comm;
    r->done = 1;
    *req = r;
    return LOOM_OK;
}

/* Every collective of one rank: recv gets send (memmove: in place is legal). */
static int copy_op(loom_comm *comm, const void *send, void *recv, size_t count,
                   loom_dtype dtype, loom_comm_request **req)
{
    if ((unsigned)dtype >= LOOM_DTYPE_COUNT)
        return comm->host->error(comm->host, LOOM_ERR_INVALID, "comm-%s: bad dtype %d",
                                 PLUGIN_NAME, (int)dtype);
    if (count == 0) {
        *req = NULL; /* complete at issue */
        return LOOM_OK;
    }
    memmove(recv, send, count * loom_dtype_size(dtype));
#if defined(VARIANT_BADMATH)
    if (dtype == LOOM_F32)
        ((float *)recv)[0] *= 2.0f; /* a wrong answer --check must catch */
#endif
    return done_request(comm, req);
}

#if defined(VARIANT_NULLOP)
__attribute__((unused))
#endif
static int allreduce(loom_comm *comm, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_redop op, loom_comm_request **req)
{
    (void)op; /* sum, max, min and avg of one value are that value */
    return copy_op(comm, send, recv, count, dtype, req);
}

static int broadcast(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int root,
                     loom_comm_request **req)
{
    if (root != 0)
        return comm->host->error(comm->host, LOOM_ERR_INVALID, "comm-%s: root %d of 1 rank",
                                 PLUGIN_NAME, root);
    return copy_op(comm, buf, buf, count, dtype, req);
}

static int reduce(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                  loom_redop op, int root, loom_comm_request **req)
{
    (void)op;
    if (root != 0)
        return comm->host->error(comm->host, LOOM_ERR_INVALID, "comm-%s: root %d of 1 rank",
                                 PLUGIN_NAME, root);
    return copy_op(comm, send, recv, count, dtype, req);
}

static int allgather(loom_comm *comm, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_comm_request **req)
{
    return copy_op(comm, send, recv, count, dtype, req);
}

static int reducescatter(loom_comm *comm, const void *send, void *recv, size_t count,
                         loom_dtype dtype, loom_redop op, loom_comm_request **req)
{
    (void)op;
    return copy_op(comm, send, recv, count, dtype, req);
}

static int alltoall(loom_comm *comm, const void *send, void *recv, size_t count,
                    loom_dtype dtype, loom_comm_request **req)
{
    return copy_op(comm, send, recv, count, dtype, req);
}

/* Post one side of a self message: match the oldest opposite side with the
 * same tag, or wait in the pending list for it. */
static int post_p2p(loom_comm *comm, int is_send, const void *sbuf, void *rbuf, size_t count,
                    loom_dtype dtype, int peer, int tag, loom_comm_request **req)
{
#if defined(VARIANT_NOP2P)
    (void)is_send, (void)sbuf, (void)rbuf, (void)count, (void)dtype, (void)peer, (void)tag,
        (void)req;
    return comm->host->error(comm->host, LOOM_ERR_NOT_SUPPORTED,
                             "comm-%s does not do point-to-point", PLUGIN_NAME);
#else
    if (peer != 0 || tag < 0)
        return comm->host->error(comm->host, LOOM_ERR_INVALID, "comm-%s: peer %d tag %d",
                                 PLUGIN_NAME, peer, tag);
    loom_comm_request *r = calloc(1, sizeof *r);
    if (!r)
        return comm->host->error(comm->host, LOOM_ERR_NO_MEMORY, "comm-%s: out of memory",
                                 PLUGIN_NAME);
    r->comm = comm;
    r->is_send = is_send;
    r->send_buf = sbuf;
    r->recv_buf = rbuf;
    r->bytes = count * loom_dtype_size(dtype);
    r->tag = tag;
    loom_comm_request **link = &comm->pending;
    for (; *link; link = &(*link)->next) {
        loom_comm_request *o = *link;
        if (o->is_send != is_send && o->tag == tag) {
            loom_comm_request *s = is_send ? r : o, *d = is_send ? o : r;
            memcpy(d->recv_buf, s->send_buf, s->bytes < d->bytes ? s->bytes : d->bytes);
            o->done = r->done = 1;
            *link = o->next;
            *req = r;
            return LOOM_OK;
        }
    }
    *link = r;
    *req = r;
    return LOOM_OK;
#endif
}

static int p2p_send(loom_comm *comm, const void *buf, size_t count, loom_dtype dtype, int peer,
                int tag, loom_comm_request **req)
{
    return post_p2p(comm, 1, buf, NULL, count, dtype, peer, tag, req);
}

static int p2p_recv(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                loom_comm_request **req)
{
    return post_p2p(comm, 0, NULL, buf, count, dtype, peer, tag, req);
}

static int barrier(loom_comm *comm, loom_comm_request **req)
{
    return done_request(comm, req);
}

static int req_test(loom_comm_request *req)
{
    if (!req->done)
        return LOOM_IN_PROGRESS;
    free(req);
    return LOOM_OK;
}

/* Alone, nothing can complete a pending request later: fail at once. */
static int req_wait(loom_comm_request *req)
{
    if (req->done) {
        free(req);
        return LOOM_OK;
    }
    loom_comm *comm = req->comm;
    for (loom_comm_request **link = &comm->pending; *link; link = &(*link)->next) {
        if (*link == req) {
            *link = req->next;
            break;
        }
    }
    int tag = req->tag, is_send = req->is_send;
    free(req);
    return comm->host->error(comm->host, LOOM_ERR_TIMEOUT,
                             "comm-%s: %s to self with tag %d never matched", PLUGIN_NAME,
                             is_send ? "send" : "recv", tag);
}

#if !defined(VARIANT_OLDMINOR)
static int group_start(loom_comm *comm)
{
    (void)comm;
    return LOOM_OK;
}

static int group_end(loom_comm *comm)
{
    (void)comm;
    return LOOM_OK;
}
#endif

#if defined(VARIANT_SETTINGS_DUP)
static const loom_setting_spec settings[] = {
    {.name = "eager_limit", .type = LOOM_SETTING_INT, .default_value = "4096",
     .help = "bytes sent eagerly"},
    {.name = "eager_limit", .type = LOOM_SETTING_INT, .default_value = "8192",
     .help = "the same name again"},
    {0},
};
#elif defined(VARIANT_SETTINGS_DEFAULT)
static const loom_setting_spec settings[] = {
    {.name = "eager_limit", .type = LOOM_SETTING_INT, .default_value = "4096",
     .help = "bytes sent eagerly"},
    {.name = "factor", .type = LOOM_SETTING_FLOAT, .default_value = "fast", .help = "not a float"},
    {0},
};
#elif defined(VARIANT_SETTINGS_TYPE)
static const loom_setting_spec settings[] = {
    {.name = "eager_limit", .type = (loom_setting_type)9, .default_value = "4096",
     .help = "no such type"},
    {0},
};
#elif defined(VARIANT_SETTINGS_EMPTY)
static const loom_setting_spec settings[] = {
    {.name = "", .type = LOOM_SETTING_BOOL, .default_value = "true", .help = "no name"},
    {0},
};
#elif defined(VARIANT_SETTINGS_UNENDED)
/* A list that lost its {0}: what follows it in memory is not a setting
 * (here a pointer to an unmapped page where the next name would be). */
static const struct {
    loom_setting_spec first;
    const char *after;
} unended = {{.name = "eager_limit", .type = LOOM_SETTING_INT, .default_value = "4096",
              .help = "bytes sent eagerly"},
             (const char *)16};
#define settings (&unended.first)
#elif defined(VARIANT_SETTINGS_RULES)
static const loom_setting_spec settings[] = {
    {.name = "mode", .type = LOOM_SETTING_STRING, .default_value = "slow", .help = "a mode",
     .allowed = (const char *const[]){"fast", "safe", NULL}},
    {0},
};
#elif defined(VARIANT_SETTINGS_BOUNDS)
static const loom_setting_spec settings[] = {
    {.name = "eager_limit", .type = LOOM_SETTING_INT, .default_value = "4096",
     .help = "bytes sent eagerly", .bounds = LOOM_SETTING_MIN | LOOM_SETTING_MAX, .min = 64,
     .max = 1024},
    {0},
};
#elif defined(VARIANT_OLDMINOR)
/* Built before ABI 1.3: the 4-member spec, header.settings_stride 0. */
typedef struct setting_spec_v1_2 {
    const char *name;
    loom_setting_type type;
    const char *default_value, *help;
} setting_spec_v1_2;
static const setting_spec_v1_2 old_settings[] = {
    {"eager_limit", LOOM_SETTING_INT, "4096", "bytes sent eagerly"},
    {"mode", LOOM_SETTING_STRING, "fast", "a string"},
    {NULL, 0, NULL, NULL},
};
#define settings ((const loom_setting_spec *)old_settings)
#define SETTINGS_STRIDE 0
#else
static const loom_setting_spec settings[] = {
    {.name = "eager_limit", .type = LOOM_SETTING_INT, .default_value = "4096",
     .help = "bytes sent eagerly", .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "factor", .type = LOOM_SETTING_FLOAT, .default_value = "1.5", .help = "a float",
     .bounds = LOOM_SETTING_ABOVE_MIN | LOOM_SETTING_MAX, .min = 0, .max = 8},
    {.name = "verbose", .type = LOOM_SETTING_BOOL, .default_value = "false", .help = "a bool"},
    {.name = "mode", .type = LOOM_SETTING_STRING, .default_value = "fast", .help = "a string",
     .allowed = (const char *const[]){"fast", "safe", NULL}},
    {0},
};
#endif
#ifndef SETTINGS_STRIDE
#define SETTINGS_STRIDE sizeof(loom_setting_spec)
#endif

#if defined(VARIANT_NODESC)
#define DESCRIPTION ""
#else
#define DESCRIPTION "a communicator for a world of one (loader tests)"
#endif

#if defined(VARIANT_ABI2SYM) || defined(VARIANT_ABI2HDR)
#define ABI LOOM_ABI_VERSION(2, 0)
#elif defined(VARIANT_NEWMINOR)
#define ABI LOOM_ABI_VERSION(LOOM_ABI_MAJOR, LOOM_ABI_MINOR + 1)
#elif defined(VARIANT_OLDMINOR)
#define ABI LOOM_ABI_VERSION(LOOM_ABI_MAJOR, 0)
#elif defined(VARIANT_NOKINDS)
#define ABI LOOM_ABI_VERSION(1, 9) /* before mem_kinds 0 meant a wrapper's inner kinds */
#else
#define ABI LOOM_ABI_VERSION(LOOM_ABI_MAJOR, LOOM_ABI_MINOR)
#endif

#if defined(VARIANT_KINDFIELD)
#define KIND LOOM_PLUGIN_STRATEGY
#else
#define KIND LOOM_PLUGIN_COMM
#endif

#if defined(VARIANT_MISNAMED)
#define HEADER_NAME "ucx"
#else
#define HEADER_NAME PLUGIN_NAME
#endif

#if defined(VARIANT_NULLOP)
#define ALLREDUCE NULL
#else
#define ALLREDUCE allreduce
#endif

#define REQUIRED_OPS                                                                     \
    .create_world = create_world, .create_subgroup = create_subgroup, .destroy = destroy, \
    .rank = rank, .size = size, .allreduce = ALLREDUCE, .broadcast = broadcast,          \
    .reduce = reduce, .allgather = allgather, .reducescatter = reducescatter,            \
    .alltoall = alltoall, .send = p2p_send, .recv = p2p_recv, .barrier = barrier,        \
    .test = req_test, .wait = req_wait

/* One source builds every variant, each exporting a symbol chosen by a
 * macro (right, wrong kind, v2): the object gets a C name and an assembler
 * label gives the symbol the variant's name. */
#define SYMBOL_NAME(sym) SYMBOL_NAME_(sym)
#define SYMBOL_NAME_(sym) __asm__(#sym)

#define HEADER(size_)                                                                   \
    {ABI, (uint32_t)(size_), KIND, (uint32_t)SETTINGS_STRIDE, HEADER_NAME, DESCRIPTION, settings}

#if defined(VARIANT_OLDMINOR)
/* The v1 comm struct as an older minor would have had it, ending at wait:
 * the loader must load it and never look past struct_size. */
typedef struct comm_plugin_v1_short {
    loom_plugin_header header;
    uint32_t mem_kinds;
    uint32_t reserved;
    int (*create_world)(const loom_host *host, loom_comm **out);
    int (*create_subgroup)(loom_comm *parent, const int *ranks, int nranks, loom_comm **out);
    int (*destroy)(loom_comm *comm);
    int (*rank)(const loom_comm *comm);
    int (*size)(const loom_comm *comm);
    int (*allreduce)(loom_comm *comm, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_redop op, loom_comm_request **req);
    int (*broadcast)(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int root,
                     loom_comm_request **req);
    int (*reduce)(loom_comm *comm, const void *send, void *recv, size_t count,
                  loom_dtype dtype, loom_redop op, int root, loom_comm_request **req);
    int (*allgather)(loom_comm *comm, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_comm_request **req);
    int (*reducescatter)(loom_comm *comm, const void *send, void *recv, size_t count,
                         loom_dtype dtype, loom_redop op, loom_comm_request **req);
    int (*alltoall)(loom_comm *comm, const void *send, void *recv, size_t count,
                    loom_dtype dtype, loom_comm_request **req);
    int (*send)(loom_comm *comm, const void *buf, size_t count, loom_dtype dtype, int peer,
                int tag, loom_comm_request **req);
    int (*recv)(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int peer,
                int tag, loom_comm_request **req);
    int (*barrier)(loom_comm *comm, loom_comm_request **req);
    int (*test)(loom_comm_request *req);
    int (*wait)(loom_comm_request *req);
} comm_plugin_v1_short;
_Static_assert(sizeof(comm_plugin_v1_short) == offsetof(loom_comm_plugin_v1_t, group_start),
               "the short struct must be the v1 struct cut right after wait");

LOOM_PLUGIN_EXPORT const comm_plugin_v1_short plugin SYMBOL_NAME(loom_comm_plugin_v1) = {
    .header = HEADER(sizeof(comm_plugin_v1_short)),
    .mem_kinds = LOOM_MEM_BIT(LOOM_MEM_HOST),
    REQUIRED_OPS,
};

#elif defined(VARIANT_NEWMINOR)
/* A later minor appended an op; this loom must load it and ignore the tail. */
static int future_op(loom_comm *comm)
{
    (void)comm;
    return LOOM_OK;
}

typedef struct comm_plugin_v1_newer {
    loom_comm_plugin_v1_t v1;
    int (*future_op)(loom_comm *comm);
} comm_plugin_v1_newer;

LOOM_PLUGIN_EXPORT const comm_plugin_v1_newer plugin SYMBOL_NAME(loom_comm_plugin_v1) = {
    .v1 = {
        .header = HEADER(sizeof(comm_plugin_v1_newer)),
        .mem_kinds = LOOM_MEM_BIT(LOOM_MEM_HOST),
        REQUIRED_OPS,
        .group_start = group_start,
        .group_end = group_end,
    },
    .future_op = future_op,
};

#else

#if defined(VARIANT_SHORT)
/* Cut before wait: too short to hold every REQUIRED op. */
#define STRUCT_SIZE offsetof(loom_comm_plugin_v1_t, wait)
#else
#define STRUCT_SIZE sizeof(loom_comm_plugin_v1_t)
#endif

#if defined(VARIANT_ABI2SYM)
/* What a plugin built against a future major exports: only its own symbol. */
#define SYMBOL loom_comm_plugin_v2
#else
#define SYMBOL loom_comm_plugin_v1
#endif

#if defined(VARIANT_NOSYM)
/* Forgot LOOM_PLUGIN_EXPORT: with hidden visibility nothing is exported. */
#define EXPORT
#else
#define EXPORT LOOM_PLUGIN_EXPORT
#endif

#if defined(VARIANT_DEVICE_ONLY)
/* Declares device memory only, as comm-nccl does (its buffers are host
 * memory all the same): the core must hand even a group of one to it. */
#define MEM_KINDS LOOM_MEM_BIT(LOOM_MEM_DEVICE)
#elif defined(VARIANT_NOKINDS)
#define MEM_KINDS 0u
#else
#define MEM_KINDS LOOM_MEM_BIT(LOOM_MEM_HOST)
#endif

EXPORT const loom_comm_plugin_v1_t plugin SYMBOL_NAME(SYMBOL) = {
    .header = HEADER(STRUCT_SIZE),
    .mem_kinds = MEM_KINDS,
    REQUIRED_OPS,
    .group_start = group_start,
    .group_end = group_end,
};

#endif
