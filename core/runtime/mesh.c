/* The process mesh: world = tp × sp × pp × dp, tp innermost (docs/architecture.md).
 * Each axis gets its own group, over the backend named for that axis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/compute.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"

int loom_mesh_rank_of(const int sizes[LOOM_AXIS_COUNT], const int coords[LOOM_AXIS_COUNT])
{
    int rank = 0;
    for (int a = LOOM_AXIS_COUNT - 1; a >= 0; a--)
        rank = rank * sizes[a] + coords[a];
    return rank;
}

void loom_mesh_coords_of(const int sizes[LOOM_AXIS_COUNT], int rank, int coords[LOOM_AXIS_COUNT])
{
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        coords[a] = rank % sizes[a];
        rank /= sizes[a];
    }
}

/* The name of an axis's backend as the config gives it: comm.<axis> if
 * set, else comm.default (whose default the config schema holds); *path
 * says which. May be "auto". */
static const char *axis_setting(const loom_config *cfg, loom_axis axis, const char **path)
{
    static char axis_path[LOOM_AXIS_COUNT][32];
    const char *name = NULL;
    snprintf(axis_path[axis], sizeof axis_path[axis], "comm.%s", loom_axis_name(axis));
    *path = axis_path[axis];
    if (loom_config_string(cfg, axis_path[axis], &name) == LOOM_OK && name && name[0])
        return name;
    *path = "comm.default";
    loom_config_string(cfg, "comm.default", &name);
    return name;
}

/* NCCL drives one GPU per rank: where the ranks on this machine outnumber
 * its CUDA devices (they share one), refused says so. */
static void gpus_per_rank(loom_runtime *rt, char *refused, size_t cap)
{
    int ranks = loom_runtime_env(rt)->local_size, gpus = 0;
#ifdef LOOM_HAVE_CUDA
    gpus = loom_device_count();
#endif
    if (ranks > gpus)
        snprintf(refused, cap, ": %d rank%s on this machine, %d CUDA device%s (NCCL needs one per rank)",
                 ranks, ranks > 1 ? "s" : "", gpus, gpus == 1 ? "" : "s");
}

int loom_comm_auto(loom_runtime *rt, loom_mem_kind memory, const char **name, char *why,
                   size_t cap)
{
    /* Every rank resolves in the same order, so the n-th call of each
     * agrees under keys of its own. */
    static int rounds;
    int round = rounds++, device = memory == LOOM_MEM_DEVICE;
    const char *want = device ? "nccl" : "ucx", *kind = device ? "device" : "host";
    char refused[768] = "";
    const loom_plugin *plugin = NULL;
    /* refused: why not, as ": <reason>", then " on rank N: <reason>" */
    if (loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, want, &plugin) != LOOM_OK)
        snprintf(refused, sizeof refused, ": %.700s", loom_last_error());
    else if (!(plugin->ops.comm.mem_kinds & LOOM_MEM_BIT(memory)))
        snprintf(refused, sizeof refused, ": it does not take %s memory", kind);
    else if (device)
        gpus_per_rank(rt, refused, sizeof refused);
    /* A plugin that loads on some ranks only (a node without UCX) must not
     * split the job: any rank that cannot use it makes every rank fall
     * back, and says why. */
    loom_store *store = loom_runtime_store(rt);
    if (store) {
        int rank = loom_runtime_env(rt)->rank;
        char count_key[64], why_key[64], barrier[64];
        snprintf(count_key, sizeof count_key, "comm.auto/%d/refused", round);
        snprintf(why_key, sizeof why_key, "comm.auto/%d/why", round);
        snprintf(barrier, sizeof barrier, "comm.auto/%d", round);
        int64_t refusals = 0;
        int rc = LOOM_OK;
        if (refused[0]) {
            char mine[sizeof refused];
            snprintf(mine, sizeof mine, " on rank %d%.700s", rank, refused);
            rc = loom_store_put(store, why_key, mine, strlen(mine) + 1);
            if (rc == LOOM_OK)
                rc = loom_store_add(store, count_key, 1, NULL);
        }
        if (rc == LOOM_OK)
            rc = loom_store_barrier(store, barrier, loom_runtime_timeout(rt));
        if (rc == LOOM_OK)
            rc = loom_store_add(store, count_key, 0, &refusals);
        size_t len = 0;
        if (rc == LOOM_OK && refusals > 0 &&
            (rc = loom_store_get(store, why_key, refused, sizeof refused - 1, &len,
                                 loom_runtime_timeout(rt))) == LOOM_OK)
            refused[len < sizeof refused - 1 ? len : sizeof refused - 1] = '\0';
        if (rc != LOOM_OK) {
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", loom_last_error());
            return loom_fail(rc, "comm \"auto\": the ranks could not agree on a backend: %s",
                             detail);
        }
    }
    if (!refused[0]) {
        *name = want;
        snprintf(why, cap, "auto: %s memory, comm-%s loads", kind, want);
        return LOOM_OK;
    }
    if (!device) {
        *name = "mpi";
        snprintf(why, cap, "auto: %s memory, comm-%s does not load%s", kind, want, refused);
        return LOOM_OK;
    }
    /* Device buffers then go through host memory (group.c stages them), so
     * the host's choice applies. */
    char host_why[1024];
    int rc = loom_comm_auto(rt, LOOM_MEM_HOST, name, host_why, sizeof host_why);
    if (rc == LOOM_OK)
        snprintf(why, cap, "auto: device memory, comm-nccl cannot be used%.500s; staged through "
                 "host memory: %.400s", refused, host_why + strlen("auto: "));
    return rc;
}

/* A comm plugin the config names: it must exist and its group
 * (comm.<name>) must hold its settings, whether or not this mesh uses it,
 * so that a job fails the same way at one rank as at many. checked (may
 * be NULL) gets the plugin's own name: a file path's group is checked
 * here, under the name the file declares. */
static int check_backend(loom_runtime *rt, const char *name, const char *path,
                         const char **checked)
{
    const loom_config *cfg = loom_runtime_config(rt);
    if (!strcmp(name, "self") || !strcmp(name, "auto")) /* auto: loom_comm_auto says */
        return LOOM_OK;
    const loom_plugin *plugin = NULL;
    const loom_host *host = NULL;
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, name, &plugin);
    if (rc == LOOM_OK) {
        char group[96];
        snprintf(group, sizeof group, "comm.%s", plugin->header->name);
        if (checked)
            *checked = plugin->header->name;
        return loom_runtime_host(rt, plugin, group, &host); /* says where itself */
    }
    char why[1024];
    snprintf(why, sizeof why, "%s", loom_last_error());
    return loom_fail(rc, "%s: %s: %s", loom_config_where(cfg, path), path, why);
}

/* Every comm plugin the config names: comm.default and comm.<axis> where
 * set, and every comm.<plugin> = { ... } group. */
static int check_named_backends(loom_runtime *rt)
{
    const loom_config *cfg = loom_runtime_config(rt);
    const char *name = NULL, *checked[1 + LOOM_AXIS_COUNT] = {NULL};
    int rc = LOOM_OK;
    if (loom_config_is_set(cfg, "comm.default") &&
        loom_config_string(cfg, "comm.default", &name) == LOOM_OK)
        rc = check_backend(rt, name, "comm.default", &checked[0]);
    for (int a = 0; a < LOOM_AXIS_COUNT && rc == LOOM_OK; a++) {
        char path[32];
        snprintf(path, sizeof path, "comm.%s", loom_axis_name((loom_axis)a));
        if (loom_config_is_set(cfg, path) && loom_config_string(cfg, path, &name) == LOOM_OK &&
            name[0])
            rc = check_backend(rt, name, path, &checked[1 + a]);
    }
    for (int i = 0; rc == LOOM_OK && (name = loom_config_child_name(cfg, "comm", i)); i++) {
        char path[96];
        snprintf(path, sizeof path, "comm.%s", name);
        int done = 0; /* the group of a backend named by its file above */
        for (size_t k = 0; k < LOOM_ARRAY_LEN(checked); k++)
            done |= checked[k] && !strcmp(checked[k], name);
        if (!done && !loom_config_core_owns(path))
            rc = check_backend(rt, name, path, NULL);
    }
    return rc;
}

/* mesh->comm_choice, why each axis uses its backend: "ucx (auto: host
 * memory, comm-ucx loads)" or "mpi (comm.default)" when every axis that
 * communicates agrees, else per axis: "tp mpi (comm.tp); dp ucx (auto: ...)".
 * whys[a]: the auto reason, or the setting that named the backend. */
static void describe_choice(loom_mesh *mesh, const char *const backends[LOOM_AXIS_COUNT],
                            const char *const whys[LOOM_AXIS_COUNT])
{
    const char *first = NULL, *first_why = NULL;
    int mixed = 0;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        if (!backends[a])
            continue;
        if (first)
            mixed |= strcmp(first, backends[a]) != 0 || strcmp(first_why, whys[a]) != 0;
        else
            first = backends[a], first_why = whys[a];
    }
    size_t n = 0, cap = sizeof mesh->comm_choice;
    mesh->comm_choice[0] = '\0';
    if (first && !mixed) {
        snprintf(mesh->comm_choice, cap, "%s (%s)", first, first_why);
        return;
    }
    for (int a = 0; a < LOOM_AXIS_COUNT && n < cap; a++)
        if (backends[a])
            n += (size_t)snprintf(mesh->comm_choice + n, cap - n, "%s%s %s (%s)", n ? "; " : "",
                                  loom_axis_name((loom_axis)a), backends[a], whys[a]);
}

typedef struct backend_world {
    const char *name;
    loom_group *group;
} backend_world;

int loom_mesh_create(loom_runtime *rt, loom_mesh **out)
{
    const loom_config *cfg = loom_runtime_config(rt);
    int world = loom_runtime_env(rt)->world_size;
    int rank = loom_runtime_env(rt)->rank;
    loom_mesh *mesh = calloc(1, sizeof *mesh);
    if (!mesh)
        return loom_fail(LOOM_ERR_NO_MEMORY, "mesh: out of memory");
    int product = 1;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        char path[32];
        int64_t size = 1;
        snprintf(path, sizeof path, "parallel.%s.size", loom_axis_name((loom_axis)a));
        if (cfg)
            loom_config_int(cfg, path, &size);
        mesh->sizes[a] = (int)size;
        product *= (int)size;
    }
    if (product != world) {
        loom_fail(LOOM_ERR_INVALID,
                  "mesh: tp × sp × pp × dp = %d × %d × %d × %d = %d, but the job has %d ranks; "
                  "set parallel.<axis>.size so the product is %d",
                  mesh->sizes[LOOM_AXIS_TP], mesh->sizes[LOOM_AXIS_SP], mesh->sizes[LOOM_AXIS_PP],
                  mesh->sizes[LOOM_AXIS_DP], product, world, world);
        free(mesh);
        return LOOM_ERR_INVALID;
    }
    loom_mesh_coords_of(mesh->sizes, rank, mesh->coords);
    if (cfg && check_named_backends(rt) != LOOM_OK) {
        free(mesh);
        return LOOM_ERR_INVALID;
    }

    /* Each axis's backend; "auto" resolved once, for the memory of the
     * run's buffers: device memory where the compute backend runs on a CUDA
     * stream, host memory otherwise (the cpu backend, and sim, whose
     * buffers communicators get staged through the host). */
    const loom_compute_api *compute = loom_runtime_compute(rt);
    loom_mem_kind memory = compute && compute->struct_size >= sizeof *compute &&
                                   compute->native_queue && compute->mem_kind == LOOM_MEM_DEVICE
                               ? LOOM_MEM_DEVICE
                               : LOOM_MEM_HOST;
    const char *backends[LOOM_AXIS_COUNT] = {0}, *whys[LOOM_AXIS_COUNT] = {0};
    const char *auto_name = NULL;
    char auto_why[1024] = "";
    int rc = LOOM_OK;
    for (int a = 0; a < LOOM_AXIS_COUNT && rc == LOOM_OK; a++) {
        if (mesh->sizes[a] == 1)
            continue;
        backends[a] = axis_setting(cfg, (loom_axis)a, &whys[a]);
        if (strcmp(backends[a], "auto") != 0)
            continue;
        if (!auto_name)
            rc = loom_comm_auto(rt, memory, &auto_name, auto_why, sizeof auto_why);
        backends[a] = auto_name;
        whys[a] = auto_why;
    }
    if (rc != LOOM_OK) {
        free(mesh);
        return rc;
    }
    describe_choice(mesh, backends, whys);

    /* One world group per backend in use; axes of size one get self. */
    backend_world worlds[LOOM_AXIS_COUNT] = {{0}};
    int nworlds = 0;
    for (int a = 0; a < LOOM_AXIS_COUNT && rc == LOOM_OK; a++) {
        if (mesh->sizes[a] == 1) {
            rc = loom_group_self(rt, &mesh->groups[a]);
            continue;
        }
        const char *backend = backends[a];
        backend_world *bw = NULL;
        for (int i = 0; i < nworlds; i++)
            if (!strcmp(worlds[i].name, backend))
                bw = &worlds[i];
        if (!bw) {
            bw = &worlds[nworlds++];
            bw->name = backend;
            rc = loom_group_world(rt, backend, &bw->group);
            if (rc != LOOM_OK)
                break;
        }
        int members[4096];
        if (mesh->sizes[a] > (int)LOOM_ARRAY_LEN(members)) {
            rc = loom_fail(LOOM_ERR_INVALID, "mesh: axis %s of %d ranks is too large",
                           loom_axis_name((loom_axis)a), mesh->sizes[a]);
            break;
        }
        int c[LOOM_AXIS_COUNT];
        memcpy(c, mesh->coords, sizeof c);
        for (int i = 0; i < mesh->sizes[a]; i++) {
            c[a] = i;
            members[i] = loom_mesh_rank_of(mesh->sizes, c);
        }
        rc = loom_group_subgroup(bw->group, members, mesh->sizes[a], &mesh->groups[a]);
        if (rc == LOOM_OK)
            loom_group_set_name(mesh->groups[a], loom_axis_name((loom_axis)a));
    }
    /* The world group: the dp backend's world if one was made, else any. */
    for (int i = 0; i < nworlds; i++) {
        if (!mesh->world)
            mesh->world = worlds[i].group;
        else
            loom_group_destroy(worlds[i].group);
    }
    if (rc == LOOM_OK && !mesh->world)
        rc = loom_group_self(rt, &mesh->world); /* a world of one */
    if (rc != LOOM_OK) {
        loom_mesh_destroy(mesh);
        return rc;
    }
    *out = mesh;
    return LOOM_OK;
}

void loom_mesh_destroy(loom_mesh *mesh)
{
    if (!mesh)
        return;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        loom_group_destroy(mesh->groups[a]);
    loom_group_destroy(mesh->world);
    free(mesh);
}
