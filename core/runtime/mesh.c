/* The process mesh: world = tp × sp × pp × dp, tp innermost (DESIGN §4).
 * Each axis gets its own group, over the backend named for that axis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "runtime/config.h"
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

/* The backend of an axis: comm.<axis> if set, else comm.default (whose
 * default the config schema holds). */
static const char *axis_backend(const loom_config *cfg, loom_axis axis)
{
    char path[32];
    const char *name = NULL;
    snprintf(path, sizeof path, "comm.%s", loom_axis_name(axis));
    if (loom_config_string(cfg, path, &name) == LOOM_OK && name && name[0])
        return name;
    loom_config_string(cfg, "comm.default", &name);
    return name;
}

/* A comm plugin the config names: it must exist and its group
 * (comm.<name>) must hold its settings, whether or not this mesh uses it,
 * so that a job fails the same way at one rank as at many. */
static int check_backend(loom_runtime *rt, const char *name, const char *path)
{
    const loom_config *cfg = loom_runtime_config(rt);
    if (!strcmp(name, "self"))
        return LOOM_OK;
    const loom_plugin *plugin = NULL;
    const loom_host *host = NULL;
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, name, &plugin);
    if (rc == LOOM_OK) {
        char group[96];
        snprintf(group, sizeof group, "comm.%s", plugin->header->name);
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
    const char *name = NULL;
    int rc = LOOM_OK;
    if (loom_config_is_set(cfg, "comm.default") &&
        loom_config_string(cfg, "comm.default", &name) == LOOM_OK)
        rc = check_backend(rt, name, "comm.default");
    for (int a = 0; a < LOOM_AXIS_COUNT && rc == LOOM_OK; a++) {
        char path[32];
        snprintf(path, sizeof path, "comm.%s", loom_axis_name((loom_axis)a));
        if (loom_config_is_set(cfg, path) && loom_config_string(cfg, path, &name) == LOOM_OK &&
            name[0])
            rc = check_backend(rt, name, path);
    }
    for (int i = 0; rc == LOOM_OK && (name = loom_config_child_name(cfg, "comm", i)); i++) {
        char path[96];
        snprintf(path, sizeof path, "comm.%s", name);
        if (!loom_config_core_owns(path))
            rc = check_backend(rt, name, path);
    }
    return rc;
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

    /* One world group per backend in use; axes of size one get self. */
    backend_world worlds[LOOM_AXIS_COUNT] = {{0}};
    int nworlds = 0, rc = LOOM_OK;
    for (int a = 0; a < LOOM_AXIS_COUNT && rc == LOOM_OK; a++) {
        if (mesh->sizes[a] == 1) {
            rc = loom_group_self(rt, &mesh->groups[a]);
            continue;
        }
        const char *backend = axis_backend(cfg, (loom_axis)a);
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
