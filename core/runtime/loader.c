/* The plugin loader (docs/plugin-guide.md): where plugins are looked for, and the
 * checks a plugin file must pass before the core calls into it.
 *
 * A plugin is refused, never trusted: every field the core will rely on is
 * checked against the frozen v1 structs, and a refusal says which file, what
 * it found and what it wanted, in one line. A refused file is dlclose'd. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/compute.h"
#include "loom/memtier.h"
#include "loom/plugin.h"
#include "loom/schedule.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "runtime/config.h"
#include "runtime/loader.h"
#include "runtime/log.h"

#ifndef LOOM_PLUGIN_INSTALL_DIR
#define LOOM_PLUGIN_INSTALL_DIR "/usr/local/lib/loom"
#endif

/* Highest major we probe for, only to say "built for ABI N" instead of
 * "not a loom plugin". */
#define PROBE_MAX_MAJOR 9
/* A settings list longer than this has lost its NULL terminator. */
#define MAX_SETTINGS 256
/* The kinds are numbered from LOOM_PLUGIN_COMM to this one. */
#define LAST_KIND LOOM_PLUGIN_COMPUTE

/* ------------------------------------------------------------ search path */

/* Two spellings of one directory ("a/", "./a", a symlink) count once. */
static int same_dir(const char *a, const char *b)
{
    if (!strcmp(a, b))
        return 1;
    char *ra = realpath(a, NULL);
    char *rb = realpath(b, NULL);
    int same = ra && rb && !strcmp(ra, rb);
    free(ra);
    free(rb);
    return same;
}

/* note (nullable): where a relative entry was taken from, for messages. */
static int search_path_add(loom_search_path *sp, const char *dir, size_t len, const char *note)
{
    while (len > 1 && dir[len - 1] == '/')
        len--;
    if (len == 0)
        return LOOM_OK;
    char *copy = strndup(dir, len);
    if (!copy)
        return loom_fail(LOOM_ERR_NO_MEMORY, "plugin search path: out of memory");
    for (int i = 0; i < sp->count; i++) {
        if (same_dir(sp->dirs[i], copy)) {
            free(copy);
            return LOOM_OK;
        }
    }
    char *note_copy = note ? strdup(note) : NULL;
    char **dirs = realloc(sp->dirs, (size_t)(sp->count + 1) * sizeof *dirs);
    if (dirs)
        sp->dirs = dirs;
    char **notes = dirs ? realloc(sp->notes, (size_t)(sp->count + 1) * sizeof *notes) : NULL;
    if (notes)
        sp->notes = notes;
    if (!dirs || !notes || (note && !note_copy)) {
        free(copy);
        free(note_copy);
        return loom_fail(LOOM_ERR_NO_MEMORY, "plugin search path: out of memory");
    }
    dirs[sp->count] = copy;
    notes[sp->count++] = note_copy;
    return LOOM_OK;
}

/* The folder part of a file's path: "." for a bare name. */
static void folder_of(const char *file, char *buf, size_t cap)
{
    const char *slash = strrchr(file, '/');
    if (!slash)
        snprintf(buf, cap, ".");
    else
        snprintf(buf, cap, "%.*s", slash == file ? 1 : (int)(slash - file), file);
}

/* A relative plugins.path entry is taken from the folder of the config file
 * that sets it, as @include is, never from the current directory: a job
 * started from a folder someone else can write to must not pick up the
 * plugins planted there. An entry given with --set (or a config parsed from
 * text) has no file and is taken from the current directory. */
static int add_config_dir(loom_search_path *sp, const loom_config *cfg, const char *entry)
{
    if (entry[0] == '/')
        return search_path_add(sp, entry, strlen(entry), NULL);
    char where[PATH_MAX + 64];
    snprintf(where, sizeof where, "%s", loom_config_where(cfg, "plugins.path"));
    char *colon = strrchr(where, ':');
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
        *colon = '\0'; /* file:line -> file */
    char note[2 * PATH_MAX + 128], top[PATH_MAX];
    if (!loom_config_file(cfg) || !strncmp(where, "--set", 5) || !strcmp(where, "default")) {
        char cwd[PATH_MAX] = "?";
        if (!getcwd(cwd, sizeof cwd))
            snprintf(cwd, sizeof cwd, "?");
        snprintf(note, sizeof note, "plugins.path entry \"%s\" (%s) is taken from the current "
                 "directory %s", entry, loom_config_where(cfg, "plugins.path"), cwd);
        return search_path_add(sp, entry, strlen(entry), note);
    }
    char file[2 * PATH_MAX + 128];
    folder_of(loom_config_file(cfg), top, sizeof top);
    /* libconfig names an @included file from the top file's folder */
    if (where[0] != '/' && strcmp(where, loom_config_file(cfg)))
        snprintf(file, sizeof file, "%s/%s", top, where);
    else
        snprintf(file, sizeof file, "%s", where);
    folder_of(file, where, sizeof where);
    char *folder = realpath(where, NULL);
    char dir[2 * PATH_MAX + 2];
    snprintf(dir, sizeof dir, "%s/%s", folder ? folder : where, entry);
    char *plain = realpath(dir, NULL); /* "../build/lib/loom" without the ".." */
    if (plain)
        snprintf(dir, sizeof dir, "%s", plain);
    free(plain);
    snprintf(note, sizeof note, "plugins.path entry \"%s\" (%s) is taken from the folder of "
             "that config file, %s", entry, loom_config_where(cfg, "plugins.path"),
             folder ? folder : where);
    free(folder);
    return search_path_add(sp, dir, strlen(dir), note);
}

/* build/lib/loom in the build tree, <prefix>/lib/loom once installed: the
 * plugin folder at the same place relative to the running program (loom,
 * or a test) as the build puts it (LOOM_PLUGIN_DIR_FROM_BIN), so a moved
 * build or install still finds its own plugins first. */
static int add_dir_next_to_program(loom_search_path *sp)
{
    char *exe = realpath("/proc/self/exe", NULL);
    if (!exe)
        return LOOM_OK;
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/%s", dirname(exe), LOOM_PLUGIN_DIR_FROM_BIN);
    free(exe);
    char *plain = realpath(dir, NULL); /* without the "bin/.." in messages */
    int rc = search_path_add(sp, plain ? plain : dir, strlen(plain ? plain : dir), NULL);
    free(plain);
    return rc;
}

int loom_search_path_init(loom_search_path *sp, const loom_config *cfg)
{
    sp->count = 0;
    sp->dirs = NULL;
    sp->notes = NULL;
    int rc = LOOM_OK;
    int n = cfg ? loom_config_list_len(cfg, "plugins.path") : -1;
    for (int i = 0; i < n && rc == LOOM_OK; i++) {
        const char *dir = loom_config_list_string(cfg, "plugins.path", i);
        if (dir && dir[0])
            rc = add_config_dir(sp, cfg, dir);
    }
    /* An environment variable is the user's own, taken from where they are. */
    const char *env = getenv("LOOM_PLUGIN_PATH");
    char cwd[PATH_MAX] = "?";
    if (env && !getcwd(cwd, sizeof cwd))
        snprintf(cwd, sizeof cwd, "?");
    while (env && *env && rc == LOOM_OK) {
        const char *colon = strchr(env, ':');
        size_t len = colon ? (size_t)(colon - env) : strlen(env);
        char note[PATH_MAX + 96];
        snprintf(note, sizeof note, "relative LOOM_PLUGIN_PATH entries are taken from the "
                 "current directory %s", cwd);
        rc = search_path_add(sp, env, len, env[0] == '/' ? NULL : note);
        env = colon ? colon + 1 : NULL;
    }
    if (rc == LOOM_OK)
        rc = add_dir_next_to_program(sp);
    if (rc == LOOM_OK)
        rc = search_path_add(sp, LOOM_PLUGIN_INSTALL_DIR, strlen(LOOM_PLUGIN_INSTALL_DIR), NULL);
    if (rc != LOOM_OK)
        loom_search_path_free(sp);
    return rc;
}

void loom_search_path_free(loom_search_path *sp)
{
    for (int i = 0; i < sp->count; i++) {
        free(sp->dirs[i]);
        free(sp->notes[i]);
    }
    free(sp->dirs);
    free(sp->notes);
    sp->dirs = NULL;
    sp->notes = NULL;
    sp->count = 0;
}

/* ------------------------------------------------------------- file names */

uint32_t loom_plugin_kind_of(const char *kind_name)
{
    for (uint32_t k = LOOM_PLUGIN_COMM; k <= LAST_KIND; k++)
        if (!strcmp(kind_name, loom_plugin_kind_name(k)))
            return k;
    return 0;
}

int loom_plugin_parse_file_name(const char *path, char *kind, size_t kind_cap, char *name,
                                size_t name_cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    static const char prefix[] = "libloom-", suffix[] = ".so";
    size_t plen = sizeof prefix - 1, slen = sizeof suffix - 1;
    if (len <= plen + slen || strncmp(base, prefix, plen) || strcmp(base + len - slen, suffix))
        return 0;
    const char *k = base + plen;
    const char *end = base + len - slen;
    const char *dash = memchr(k, '-', (size_t)(end - k));
    /* kind and name both non-empty: "libloom-comm-.so" is not a plugin name */
    if (!dash || dash == k || dash + 1 >= end)
        return 0;
    size_t klen = (size_t)(dash - k), nlen = (size_t)(end - dash - 1);
    if (klen >= kind_cap || nlen >= name_cap)
        return 0;
    memcpy(kind, k, klen);
    kind[klen] = '\0';
    memcpy(name, dash + 1, nlen);
    name[nlen] = '\0';
    return 1;
}

/* ------------------------------------------------------- required ops */

typedef struct op_slot {
    const char *name;
    size_t offset;
} op_slot;

#define OP(type, member) {#member, offsetof(type, member)}

static const op_slot comm_required[] = {
    OP(loom_comm_plugin_v1_t, create_world), OP(loom_comm_plugin_v1_t, create_subgroup),
    OP(loom_comm_plugin_v1_t, destroy),      OP(loom_comm_plugin_v1_t, rank),
    OP(loom_comm_plugin_v1_t, size),         OP(loom_comm_plugin_v1_t, allreduce),
    OP(loom_comm_plugin_v1_t, broadcast),    OP(loom_comm_plugin_v1_t, reduce),
    OP(loom_comm_plugin_v1_t, allgather),    OP(loom_comm_plugin_v1_t, reducescatter),
    OP(loom_comm_plugin_v1_t, alltoall),     OP(loom_comm_plugin_v1_t, send),
    OP(loom_comm_plugin_v1_t, recv),         OP(loom_comm_plugin_v1_t, barrier),
    OP(loom_comm_plugin_v1_t, test),         OP(loom_comm_plugin_v1_t, wait),
};

static const op_slot memtier_required[] = {
    OP(loom_memtier_plugin_v1_t, create),   OP(loom_memtier_plugin_v1_t, destroy),
    OP(loom_memtier_plugin_v1_t, capacity), OP(loom_memtier_plugin_v1_t, alloc),
    OP(loom_memtier_plugin_v1_t, free),     OP(loom_memtier_plugin_v1_t, write),
    OP(loom_memtier_plugin_v1_t, read),     OP(loom_memtier_plugin_v1_t, test),
    OP(loom_memtier_plugin_v1_t, wait),
};

static const op_slot strategy_common_required[] = {
    OP(loom_strategy_plugin_v1_t, create),
    OP(loom_strategy_plugin_v1_t, destroy),
    OP(loom_strategy_plugin_v1_t, describe),
};

static const op_slot strategy_tp_required[] = {
    OP(loom_strategy_plugin_v1_t, tensor_shard),
    OP(loom_strategy_plugin_v1_t, tensor_enter),
    OP(loom_strategy_plugin_v1_t, tensor_exit),
    OP(loom_strategy_plugin_v1_t, tensor_exit_backward),
    OP(loom_strategy_plugin_v1_t, tensor_enter_backward),
};
static const op_slot strategy_sp_required[] = {
    OP(loom_strategy_plugin_v1_t, attention_forward),
    OP(loom_strategy_plugin_v1_t, attention_backward),
};
static const op_slot strategy_pp_required[] = {
    OP(loom_strategy_plugin_v1_t, pipeline_schedule),
};
static const op_slot strategy_dp_required[] = {
    OP(loom_strategy_plugin_v1_t, data_setup),
    OP(loom_strategy_plugin_v1_t, data_optimizer_step),
};

static const op_slot schedule_required[] = {
    OP(loom_schedule_plugin_v1_t, build),
};

/* Every op but probe and native_queue, and alloc and free, which a backend
 * of the host tier may leave to the core (see compute_memory_ops). A
 * missing kernel would be a refusal in the middle of a step, or worse a
 * silent fallback to memory the backend cannot read. */
#define CO(member) OP(loom_compute_plugin_v1_t, member)
static const op_slot compute_required[] = {
    CO(create),
    CO(destroy),
    CO(describe),
    CO(to_device),
    CO(to_host),
    CO(copy),
    CO(copy_rows),
    CO(zero),
    CO(synchronize),
    CO(event_record),
    CO(event_wait),
    CO(event_free),
    CO(status),
    CO(gemm),
    CO(multiply_dtype),
    CO(matmul_forward),
    CO(matmul_backward_input),
    CO(matmul_backward_weight),
    CO(encoder_forward),
    CO(encoder_backward),
    CO(embedding_rows_forward),
    CO(embedding_rows_backward),
    CO(position_forward),
    CO(position_backward),
    CO(layernorm_forward),
    CO(residual_layernorm_forward),
    CO(layernorm_backward_input),
    CO(layernorm_backward_weight),
    CO(residual_forward),
    CO(bias_forward),
    CO(bias_backward),
    CO(bias_gelu_forward),
    CO(gelu_backward),
    CO(attention_forward),
    CO(attention_backward),
    CO(crossentropy_forward),
    CO(crossentropy_backward),
    CO(crossentropy_slice_max),
    CO(crossentropy_slice_sums),
    CO(crossentropy_slice_finish),
    CO(crossentropy_slice_backward),
    CO(mean),
    CO(adamw),
    CO(sum_squares),
    CO(count_nonfinite),
    CO(scale),
    CO(convert),
    CO(accumulate),
};
/* Required of a backend whose memory is not the host's. */
static const op_slot compute_memory_ops[] = {
    CO(alloc),
    CO(free),
};

typedef struct op_list {
    const op_slot *ops;
    size_t count;
} op_list;

#define OP_LIST(a) {(a), LOOM_ARRAY_LEN(a)}

/* The REQUIRED ops of a kind: the common part, plus for a strategy the
 * hooks of its axis (axis < 0: not known yet). At most two lists. */
static int required_ops(uint32_t kind, int axis, op_list lists[2])
{
    switch (kind) {
    case LOOM_PLUGIN_COMM: lists[0] = (op_list)OP_LIST(comm_required); return 1;
    case LOOM_PLUGIN_MEMTIER: lists[0] = (op_list)OP_LIST(memtier_required); return 1;
    case LOOM_PLUGIN_SCHEDULE: lists[0] = (op_list)OP_LIST(schedule_required); return 1;
    case LOOM_PLUGIN_COMPUTE: lists[0] = (op_list)OP_LIST(compute_required); return 1;
    case LOOM_PLUGIN_STRATEGY:
        lists[0] = (op_list)OP_LIST(strategy_common_required);
        switch (axis) {
        case LOOM_AXIS_TP: lists[1] = (op_list)OP_LIST(strategy_tp_required); return 2;
        case LOOM_AXIS_SP: lists[1] = (op_list)OP_LIST(strategy_sp_required); return 2;
        case LOOM_AXIS_PP: lists[1] = (op_list)OP_LIST(strategy_pp_required); return 2;
        case LOOM_AXIS_DP: lists[1] = (op_list)OP_LIST(strategy_dp_required); return 2;
        default: return 1;
        }
    default: return 0;
    }
}

/* The bytes a v1 struct of this kind must span: its fixed members and every
 * REQUIRED op. Older minors may stop right there; nothing may stop short. */
static size_t required_size(uint32_t kind, int axis)
{
    op_list lists[2];
    int n = required_ops(kind, axis, lists);
    size_t end = sizeof(loom_plugin_header);
    if (kind != LOOM_PLUGIN_SCHEDULE)
        end += 2 * sizeof(uint32_t); /* the kind's fixed fields */
    for (int l = 0; l < n; l++)
        for (size_t i = 0; i < lists[l].count; i++)
            if (lists[l].ops[i].offset + sizeof(void *) > end)
                end = lists[l].ops[i].offset + sizeof(void *);
    return end;
}

static int op_present(const loom_plugin_header *h, size_t offset)
{
    if (offset + sizeof(void (*)(void)) > h->struct_size)
        return 0;
    void (*fn)(void);
    memcpy(&fn, (const char *)h + offset, sizeof fn);
    return fn != NULL;
}

/* Every optional op: the kind whose struct has it, where, and its name. */
static const struct {
    loom_plugin_kind kind;
    op_slot slot;
} optional_ops[LOOM_OPTIONAL_COUNT] = {
    [LOOM_OPTIONAL_COMM_GROUP_START] = {LOOM_PLUGIN_COMM, OP(loom_comm_plugin_v1_t, group_start)},
    [LOOM_OPTIONAL_COMM_GROUP_END] = {LOOM_PLUGIN_COMM, OP(loom_comm_plugin_v1_t, group_end)},
    [LOOM_OPTIONAL_COMM_MEM_REGISTER] = {LOOM_PLUGIN_COMM,
                                         OP(loom_comm_plugin_v1_t, mem_register)},
    [LOOM_OPTIONAL_COMM_MEM_DEREGISTER] = {LOOM_PLUGIN_COMM,
                                           OP(loom_comm_plugin_v1_t, mem_deregister)},
    [LOOM_OPTIONAL_COMM_ABORT] = {LOOM_PLUGIN_COMM, OP(loom_comm_plugin_v1_t, abort)},
    [LOOM_OPTIONAL_COMM_INNER] = {LOOM_PLUGIN_COMM, OP(loom_comm_plugin_v1_t, inner)},
    [LOOM_OPTIONAL_DATA_BEFORE_FORWARD] = {LOOM_PLUGIN_STRATEGY,
                                           OP(loom_strategy_plugin_v1_t, data_before_forward)},
    [LOOM_OPTIONAL_DATA_AFTER_FORWARD] = {LOOM_PLUGIN_STRATEGY,
                                          OP(loom_strategy_plugin_v1_t, data_after_forward)},
    [LOOM_OPTIONAL_DATA_BEFORE_BACKWARD] = {LOOM_PLUGIN_STRATEGY,
                                            OP(loom_strategy_plugin_v1_t, data_before_backward)},
    [LOOM_OPTIONAL_DATA_GRADS_READY] = {LOOM_PLUGIN_STRATEGY,
                                        OP(loom_strategy_plugin_v1_t, data_grads_ready)},
    [LOOM_OPTIONAL_DATA_FINISH_BACKWARD] = {LOOM_PLUGIN_STRATEGY,
                                            OP(loom_strategy_plugin_v1_t, data_finish_backward)},
    [LOOM_OPTIONAL_DATA_GRAD_NORM_SQ] = {LOOM_PLUGIN_STRATEGY,
                                         OP(loom_strategy_plugin_v1_t, data_grad_norm_sq)},
    [LOOM_OPTIONAL_DATA_ZERO_GRADS] = {LOOM_PLUGIN_STRATEGY,
                                       OP(loom_strategy_plugin_v1_t, data_zero_grads)},
    [LOOM_OPTIONAL_DATA_GET_STATE] = {LOOM_PLUGIN_STRATEGY,
                                      OP(loom_strategy_plugin_v1_t, data_get_state)},
    [LOOM_OPTIONAL_DATA_SET_STATE] = {LOOM_PLUGIN_STRATEGY,
                                      OP(loom_strategy_plugin_v1_t, data_set_state)},
    [LOOM_OPTIONAL_DATA_GET_SHARD] = {LOOM_PLUGIN_STRATEGY,
                                      OP(loom_strategy_plugin_v1_t, data_get_shard)},
    [LOOM_OPTIONAL_DATA_EVAL] = {LOOM_PLUGIN_STRATEGY, OP(loom_strategy_plugin_v1_t, data_eval)},
    [LOOM_OPTIONAL_DATA_REPLICA_STATE] = {LOOM_PLUGIN_STRATEGY,
                                          OP(loom_strategy_plugin_v1_t, data_replica_state)},
    [LOOM_OPTIONAL_SEQUENCE_POSITIONS] = {LOOM_PLUGIN_STRATEGY,
                                          OP(loom_strategy_plugin_v1_t, sequence_positions)},
    [LOOM_OPTIONAL_PIPELINE_BUBBLE] = {LOOM_PLUGIN_STRATEGY,
                                       OP(loom_strategy_plugin_v1_t, pipeline_bubble)},
    [LOOM_OPTIONAL_MEMTIER_ADDRESS] = {LOOM_PLUGIN_MEMTIER,
                                       OP(loom_memtier_plugin_v1_t, address)},
    [LOOM_OPTIONAL_MEMTIER_PREFETCH] = {LOOM_PLUGIN_MEMTIER,
                                        OP(loom_memtier_plugin_v1_t, prefetch)},
    [LOOM_OPTIONAL_SCHEDULE_BUBBLE] = {LOOM_PLUGIN_SCHEDULE,
                                       OP(loom_schedule_plugin_v1_t, bubble)},
    [LOOM_OPTIONAL_SCHEDULE_BUBBLE_WITH_SETTINGS] = {
        LOOM_PLUGIN_SCHEDULE, OP(loom_schedule_plugin_v1_t, bubble_with_settings)},
    [LOOM_OPTIONAL_COMPUTE_PROBE] = {LOOM_PLUGIN_COMPUTE, CO(probe)},
    [LOOM_OPTIONAL_COMPUTE_NATIVE_QUEUE] = {LOOM_PLUGIN_COMPUTE, CO(native_queue)},
};

const char *loom_optional_op_name(loom_optional_op op)
{
    return (unsigned)op < LOOM_OPTIONAL_COUNT ? optional_ops[op].slot.name : "?";
}

/* The optional ops a struct of kind has non-NULL, as loom_plugin.provided. */
static uint64_t provided_ops(loom_plugin_kind kind, const loom_plugin_header *h)
{
    uint64_t provided = 0;
    for (int op = 0; op < LOOM_OPTIONAL_COUNT; op++)
        if (optional_ops[op].kind == kind && op_present(h, optional_ops[op].slot.offset))
            provided |= (uint64_t)1 << op;
    return provided;
}

void loom_plugin_abi_text(uint32_t abi_version, char *buf, size_t cap)
{
    if (!abi_version)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%u.%u", LOOM_ABI_VERSION_MAJOR(abi_version),
                 LOOM_ABI_VERSION_MINOR(abi_version));
}

/* What the minor a struct of kind was built for promises, as
 * loom_plugin.features. */
static uint32_t features_of(loom_plugin_kind kind, uint32_t abi_version)
{
    uint32_t minor = LOOM_ABI_VERSION_MINOR(abi_version), features = 0;
    if (minor >= 3)
        features |= LOOM_FEATURE_SETTING_RULES;
    if (kind == LOOM_PLUGIN_STRATEGY && minor >= 6)
        features |= LOOM_FEATURE_UPDATE_RANGE;
    if (kind == LOOM_PLUGIN_STRATEGY && minor >= 9)
        features |= LOOM_FEATURE_DEVICE_BUFFERS;
    return features;
}

/* ------------------------------------------------------------ ops table */

static int no_unit_hook(loom_strategy *s, loom_unit *unit) { (void)s; (void)unit; return LOOM_OK; }
static int no_grads_hook(loom_strategy *s, loom_unit *unit, int last_micro)
{
    (void)s, (void)unit, (void)last_micro;
    return LOOM_OK;
}
static int no_step_hook(loom_strategy *s) { (void)s; return LOOM_OK; }
static int no_bracket(loom_comm *comm) { (void)comm; return LOOM_OK; }

#define DEFAULT_OP(ops, member, fn) ((ops)->member ? (void)0 : (void)((ops)->member = (fn)))

/* Copy what a struct of kind has of the newest one into ops (the rest
 * stays zero) and put the core's no-ops where an absent op means nothing
 * to do. */
static void normalise(loom_plugin *p, loom_plugin_kind kind, const loom_plugin_header *exported,
                      void *ops)
{
    size_t size = 0;
    switch (kind) {
    case LOOM_PLUGIN_COMM: size = sizeof p->ops.comm; break;
    case LOOM_PLUGIN_STRATEGY: size = sizeof p->ops.strategy; break;
    case LOOM_PLUGIN_MEMTIER: size = sizeof p->ops.memtier; break;
    case LOOM_PLUGIN_SCHEDULE: size = sizeof p->ops.schedule; break;
    case LOOM_PLUGIN_COMPUTE: size = sizeof p->ops.compute; break;
    }
    memcpy(ops, exported, exported->struct_size < size ? exported->struct_size : size);
    /* Readers of the settings see this loom's spec, whatever the plugin's. */
    loom_plugin_header *normalised = ops;
    normalised->settings = p->settings;
    normalised->settings_stride = sizeof(loom_setting_spec);
    if (kind == LOOM_PLUGIN_COMM) {
        loom_comm_ops *c = ops;
        DEFAULT_OP(c, group_start, no_bracket);
        DEFAULT_OP(c, group_end, no_bracket);
    } else if (kind == LOOM_PLUGIN_STRATEGY) {
        loom_strategy_ops *s = ops;
        DEFAULT_OP(s, data_before_forward, no_unit_hook);
        DEFAULT_OP(s, data_after_forward, no_unit_hook);
        DEFAULT_OP(s, data_before_backward, no_unit_hook);
        DEFAULT_OP(s, data_grads_ready, no_grads_hook);
        DEFAULT_OP(s, data_finish_backward, no_step_hook);
    }
}

/* The core's view of the plugin and what it provides. A schedule built as
 * a strategy keeps that struct in adapted; its schedule view has the
 * header (kind schedule) and the bubble, and runs through
 * loom_plugin_schedule_build. */
static void fill_ops(loom_plugin *p, loom_plugin_kind built_as, const loom_plugin_header *exported)
{
    p->built_as = built_as;
    p->exported = exported;
    p->header = (const loom_plugin_header *)&p->ops;
    p->features = features_of(built_as, exported->abi_version);
    loom_plugin_abi_text(exported->abi_version, p->built_for, sizeof p->built_for);
    if (built_as == p->kind) {
        normalise(p, p->kind, exported, &p->ops);
        p->provided = provided_ops(p->kind, exported);
        return;
    }
    normalise(p, built_as, exported, &p->adapted);
    p->ops.schedule.header = p->adapted.header;
    p->ops.schedule.header.kind = LOOM_PLUGIN_SCHEDULE;
    p->ops.schedule.bubble = p->adapted.pipeline_bubble;
    if (provided_ops(built_as, exported) & ((uint64_t)1 << LOOM_OPTIONAL_PIPELINE_BUBBLE))
        p->provided = (uint64_t)1 << LOOM_OPTIONAL_SCHEDULE_BUBBLE;
}

/* ------------------------------------------------------------ settings */

/* Reading a plugin's settings list must not crash the core when the list
 * has lost its {0} end or holds a wild pointer: every byte is first handed
 * to the kernel (a write into a pipe), which answers EFAULT where a direct
 * read would fault. */
typedef struct probe {
    int fds[2];
} probe;

static int probe_open(probe *pr)
{
    return pipe(pr->fds) == 0 ? 0 : -1;
}

static void probe_close(probe *pr)
{
    close(pr->fds[0]);
    close(pr->fds[1]);
}

/* The n bytes at p into dst (NULL: only whether they can be read). The
 * write is the raw system call and the copy comes back through the pipe:
 * the process itself never touches the plugin's bytes, so a sanitizer
 * (whose write() checks the buffer) does not report the bytes past a
 * broken list that this exists to survive. */
static int probe_copy(probe *pr, void *dst, const void *p, size_t n)
{
    const char *c = p;
    char sink[512], *to = dst;
    while (n) {
        long w = syscall(SYS_write, pr->fds[1], c, n < sizeof sink ? n : sizeof sink);
        if (w <= 0 || read(pr->fds[0], to ? to : sink, (size_t)w) != w)
            return 0;
        c += w;
        n -= (size_t)w;
        if (to)
            to += w;
    }
    return 1;
}

static int readable(probe *pr, const void *p, size_t n) { return probe_copy(pr, NULL, p, n); }

/* A readable NUL-ended string of at most max bytes. */
static int readable_string(probe *pr, const char *s, size_t max)
{
    for (size_t i = 0; i <= max; i++) {
        if (!readable(pr, s + i, 1))
            return 0;
        if (!s[i])
            return 1;
    }
    return 0;
}

/* A name the config file can spell: libconfig's [A-Za-z*][-A-Za-z0-9_*]*. */
static int valid_setting_name(const char *s)
{
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '*'))
        return 0;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == '*'))
            return 0;
    return 1;
}

/* Whether text is a value of type as the config file would write it; the
 * number it says in *value. */
static int default_parses(loom_setting_type type, const char *text, double *value)
{
    char *end;
    *value = 0;
    switch (type) {
    case LOOM_SETTING_INT:
        errno = 0;
        *value = (double)strtoll(text, &end, 0);
        if (end == text || errno)
            return 0;
        if (*end == 'L') /* libconfig's 64-bit suffix */
            end += end[1] == 'L' ? 2 : 1;
        return *end == '\0';
    case LOOM_SETTING_FLOAT:
        errno = 0;
        *value = strtod(text, &end);
        return end != text && *end == '\0' && !errno;
    case LOOM_SETTING_BOOL: return !strcasecmp(text, "true") || !strcasecmp(text, "false");
    case LOOM_SETTING_STRING: return 1;
    default: return 0;
    }
}

static const char *setting_type_name(loom_setting_type type)
{
    switch (type) {
    case LOOM_SETTING_INT: return "int";
    case LOOM_SETTING_FLOAT: return "float";
    case LOOM_SETTING_BOOL: return "bool";
    case LOOM_SETTING_STRING: return "string";
    default: return "?";
    }
}

#define SETTING_TEXT_MAX 1024 /* longest default or help text */
#define ALLOWED_MAX 64        /* values in one allowed list */

/* Whether a default as written in the config ("zigzag" or "\"zigzag\"")
 * says value. */
static int same_unquoted(const char *written, const char *value)
{
    size_t n = strlen(written);
    if (n >= 2 && written[0] == '"' && written[n - 1] == '"')
        return n - 2 == strlen(value) && !strncmp(written + 1, value, n - 2);
    return !strcmp(written, value);
}

/* The allowed list of a string setting: readable, NULL-ended, names a
 * config file can hold, the default among them. */
static int check_allowed(probe *pr, const loom_setting_spec *s, int i, char *why, size_t cap)
{
    const char *const *a = s->allowed;
    int has_default = !s->default_value;
    for (int k = 0;; k++) {
        const char *ak = NULL;
        if (k > ALLOWED_MAX || !probe_copy(pr, &ak, &a[k], sizeof ak)) {
            snprintf(why, cap, "settings[%d] '%s': the allowed list has no NULL end; end it "
                     "with NULL", i, s->name);
            return -1;
        }
        if (!ak)
            break;
        if (!readable_string(pr, ak, SETTING_TEXT_MAX) || !ak[0]) {
            snprintf(why, cap, "settings[%d] '%s': allowed[%d] is not a non-empty string", i,
                     s->name, k);
            return -1;
        }
        has_default |= same_unquoted(s->default_value, ak);
    }
    if (a[0] == NULL) {
        snprintf(why, cap, "settings[%d] '%s': the allowed list is empty; leave .allowed NULL "
                 "for any value", i, s->name);
        return -1;
    }
    if (!has_default) {
        size_t n = strlen(s->default_value);
        int quoted = n >= 2 && s->default_value[0] == '"' && s->default_value[n - 1] == '"';
        snprintf(why, cap, "settings[%d] '%s': the default \"%.*s\" is not among its allowed "
                 "values", i, s->name, (int)(quoted ? n - 2 : n), s->default_value + quoted);
        return -1;
    }
    return 0;
}

static int within_bounds(const loom_setting_spec *s, double v)
{
    return !(((s->bounds & LOOM_SETTING_MIN) && !(v >= s->min)) ||
             ((s->bounds & LOOM_SETTING_ABOVE_MIN) && !(v > s->min)) ||
             ((s->bounds & LOOM_SETTING_MAX) && !(v <= s->max)) ||
             ((s->bounds & LOOM_SETTING_BELOW_MAX) && !(v < s->max)));
}

/* The rules of ABI 1.3 on one entry: allowed values for strings, bounds for
 * numbers, each consistent and satisfied by the default. */
static int check_rules(probe *pr, const loom_setting_spec *s, int i, double def, char *why,
                       size_t cap)
{
    const uint32_t all = LOOM_SETTING_MIN | LOOM_SETTING_ABOVE_MIN | LOOM_SETTING_MAX |
                         LOOM_SETTING_BELOW_MAX;
    int number = s->type == LOOM_SETTING_INT || s->type == LOOM_SETTING_FLOAT;
    if (s->allowed && s->type != LOOM_SETTING_STRING) {
        snprintf(why, cap, "settings[%d] '%s': an allowed list is for string settings; a %s "
                 "takes bounds", i, s->name, setting_type_name(s->type));
        return -1;
    }
    if (s->allowed && check_allowed(pr, s, i, why, cap))
        return -1;
    if (!s->bounds)
        return 0;
    if (!number || (s->bounds & ~all) ||
        ((s->bounds & LOOM_SETTING_MIN) && (s->bounds & LOOM_SETTING_ABOVE_MIN)) ||
        ((s->bounds & LOOM_SETTING_MAX) && (s->bounds & LOOM_SETTING_BELOW_MAX))) {
        snprintf(why, cap, "settings[%d] '%s': bounds 0x%x are not valid for a %s (at most one "
                 "of LOOM_SETTING_MIN/_ABOVE_MIN and one of _MAX/_BELOW_MAX, on int or float)",
                 i, s->name, s->bounds, setting_type_name(s->type));
        return -1;
    }
    int has_min = s->bounds & (LOOM_SETTING_MIN | LOOM_SETTING_ABOVE_MIN);
    int has_max = s->bounds & (LOOM_SETTING_MAX | LOOM_SETTING_BELOW_MAX);
    if ((has_min && !isfinite(s->min)) || (has_max && !isfinite(s->max)) ||
        (has_min && has_max && s->min > s->max)) {
        snprintf(why, cap, "settings[%d] '%s': bounds min %g, max %g are not a range", i,
                 s->name, s->min, s->max);
        return -1;
    }
    if (s->default_value && !within_bounds(s, def)) {
        snprintf(why, cap, "settings[%d] '%s': the default %s is outside its bounds", i, s->name,
                 s->default_value);
        return -1;
    }
    return 0;
}

/* One entry, already copied out of the plugin: its name, type, texts and
 * rules. */
static int check_setting(probe *pr, const loom_setting_spec *s, int i, char *why, size_t cap)
{
    if (!readable_string(pr, s->name, 64)) {
        snprintf(why, cap, "settings[%d] has no readable name: the list is not ended by {0}, "
                 "or the entry is corrupt", i);
        return -1;
    }
    if (!s->name[0]) {
        snprintf(why, cap, "settings[%d] has an empty name", i);
        return -1;
    }
    if (!valid_setting_name(s->name)) {
        snprintf(why, cap, "settings[%d] '%s' is not a name a config file can spell "
                 "(letters, digits, '-' and '_', starting with a letter); if the list should "
                 "have ended before it, end it with {0}", i, s->name);
        return -1;
    }
    if (s->type < LOOM_SETTING_INT || s->type > LOOM_SETTING_STRING) {
        snprintf(why, cap, "settings[%d] '%s' has unknown type %d (want LOOM_SETTING_INT, "
                 "_FLOAT, _BOOL or _STRING)", i, s->name, (int)s->type);
        return -1;
    }
    if ((s->default_value && !readable_string(pr, s->default_value, SETTING_TEXT_MAX)) ||
        (s->help && !readable_string(pr, s->help, SETTING_TEXT_MAX))) {
        snprintf(why, cap, "settings[%d] '%s': its default or help is not a readable string",
                 i, s->name);
        return -1;
    }
    double def = 0;
    if (s->default_value && !default_parses(s->type, s->default_value, &def)) {
        snprintf(why, cap, "settings[%d] '%s': default \"%s\" is not a valid %s", i, s->name,
                 s->default_value, setting_type_name(s->type));
        return -1;
    }
    return check_rules(pr, s, i, def, why, cap);
}

/* The stride of the plugin's settings list: the spec as its ABI minor had
 * it. */
static int settings_stride(const loom_plugin_header *h, size_t *stride, char *why, size_t cap)
{
    const size_t v12 = offsetof(loom_setting_spec, allowed);
    if (LOOM_ABI_VERSION_MINOR(h->abi_version) < 3) {
        *stride = v12;
        return 0;
    }
    if (h->settings_stride < v12 || h->settings_stride % sizeof(void *)) {
        snprintf(why, cap, "header.settings_stride is %u, not the size of a loom_setting_spec; "
                 "initialise the header with LOOM_PLUGIN_HEADER", h->settings_stride);
        return -1;
    }
    *stride = h->settings_stride;
    return 0;
}

/* Check the plugin's settings list and copy it into *out as this loom's
 * loom_setting_spec array (members past an older plugin's stride zero),
 * ended by {0}. group is the config group the settings live in: a name the
 * core owns there is refused. 0, or -1 with the problem in why. */
static int load_settings(const loom_plugin_header *h, const char *group,
                         loom_setting_spec **out, char *why, size_t cap)
{
    *out = NULL;
    size_t stride;
    probe pr;
    if (settings_stride(h, &stride, why, cap))
        return -1;
    if (probe_open(&pr)) {
        snprintf(why, cap, "cannot check the settings list: pipe: %s", strerror(errno));
        return -1;
    }
    loom_setting_spec *list = calloc(MAX_SETTINGS + 1, sizeof *list);
    int rc = list ? 0 : -1;
    if (!list)
        snprintf(why, cap, "out of memory");
    const char *at = (const char *)h->settings;
    for (int i = 0; rc == 0 && at; i++, at += stride) {
        if (i == MAX_SETTINGS) {
            snprintf(why, cap, "settings list has no end: more than %d entries without the {0} "
                     "that must close it", MAX_SETTINGS);
            rc = -1;
        } else if (!readable(&pr, at, stride) ||
                   !probe_copy(&pr, &list[i], at, stride < sizeof *list ? stride : sizeof *list)) {
            snprintf(why, cap, "settings[%d] cannot be read: the list is not ended by {0}", i);
            rc = -1;
        } else {
            if (!list[i].name)
                break;
            rc = check_setting(&pr, &list[i], i, why, cap);
            for (int j = 0; rc == 0 && j < i; j++)
                if (!strcmp(list[j].name, list[i].name)) {
                    snprintf(why, cap, "settings[%d] '%s' repeats settings[%d]", i,
                             list[i].name, j);
                    rc = -1;
                }
            char path[256];
            if (rc == 0 && snprintf(path, sizeof path, "%s.%s", group, list[i].name) > 0 &&
                loom_config_core_owns(path)) {
                snprintf(why, cap, "settings[%d] '%s' collides with the core's own %s; give "
                         "the plugin's setting another name", i, list[i].name, path);
                rc = -1;
            }
        }
    }
    probe_close(&pr);
    if (rc) {
        free(list);
        return -1;
    }
    *out = list;
    return 0;
}

/* A readable NUL-ended string of at most max bytes, the kernel reading it
 * first: a wild pointer in a plugin's header is refused, not followed. */
static int readable_text(const char *s, size_t max)
{
    probe pr;
    if (probe_open(&pr))
        return 0;
    int ok = readable_string(&pr, s, max);
    probe_close(&pr);
    return ok;
}

static int check_description(const loom_plugin_header *h, char *why, size_t cap)
{
    probe pr;
    if (probe_open(&pr)) {
        snprintf(why, cap, "cannot check the description: pipe: %s", strerror(errno));
        return -1;
    }
    int ok = h->description && readable_string(&pr, h->description, SETTING_TEXT_MAX);
    probe_close(&pr);
    if (!ok || !h->description[0])
        snprintf(why, cap, "header.description is %s; give it one line saying what the plugin "
                 "does", !h->description ? "NULL" : ok ? "empty" : "not a readable string");
    else if (strchr(h->description, '\n'))
        snprintf(why, cap, "header.description has a newline; keep it one line");
    else
        return 0;
    return -1;
}

/* --------------------------------------------------------------- loading */

/* The config group of a plugin's settings: comm.<name>, parallel.<axis>,
 * memory.offload, compute.<name>. */
static void settings_group(uint32_t kind, const loom_plugin_header *h, char *buf, size_t cap);

/* One load in progress: the file, what we know of it so far, and where its
 * checks are reported. */
typedef struct load_run {
    const char *path;
    loom_plugin_kind kind; /* the kind of struct checked: LOOM_PLUGIN_STRATEGY when adapting */
    const char *kind_name;
    /* A schedule asked for, found built as a strategy (before ABI 1.8). */
    int adapting;
    const char *expect_name; /* NULL: no name to check against */
    loom_plugin_checks *checks;
    /* Reading the file instead of loading it: its image (then no dlopen). */
    struct plugin_image *image;
} load_run;

static void passed(load_run *r, const char *check)
{
    if (r->checks->report)
        r->checks->report(r->checks->ctx, check, NULL);
}

static int refuse(load_run *r, int status, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(load_run *r, int status, const char *check, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->checks->reason, sizeof r->checks->reason, fmt, ap);
    va_end(ap);
    if (r->checks->report)
        r->checks->report(r->checks->ctx, check, r->checks->reason);
    return status;
}

/* The exported struct of the symbol in a file read, NULL when none. */
static const void *image_struct(const struct plugin_image *im, const char *name);

static const void *find_symbol(const load_run *r, void *dl, const char *kind_name, int major)
{
    char sym[64];
    snprintf(sym, sizeof sym, "loom_%s_plugin_v%d", kind_name, major);
    if (r->image)
        return image_struct(r->image, sym);
    dlerror();
    return dlsym(dl, sym);
}

/* No loom_<kind>_plugin_v1: say what the file is instead. */
static int refuse_no_symbol(load_run *r, void *dl)
{
    for (int major = PROBE_MAX_MAJOR; major >= 2; major--) {
        const loom_plugin_header *h = find_symbol(r, dl, r->kind_name, major);
        if (!h)
            continue;
        /* the ABI keeps abi_version first in every major's struct */
        char built[32];
        if ((int)LOOM_ABI_VERSION_MAJOR(h->abi_version) == major)
            snprintf(built, sizeof built, "%d.%u", major, LOOM_ABI_VERSION_MINOR(h->abi_version));
        else
            snprintf(built, sizeof built, "%d.x", major);
        r->checks->abi_version = LOOM_ABI_VERSION(major, 0);
        return refuse(r, LOOM_ERR_NOT_SUPPORTED, "symbol",
                      "built for loom plugin ABI %s (exports loom_%s_plugin_v%d, not "
                      "loom_%s_plugin_v%d), this loom speaks %d.x; rebuild the plugin against "
                      "this loom's headers", built, r->kind_name, major, r->kind_name,
                      LOOM_ABI_MAJOR, LOOM_ABI_MAJOR);
    }
    for (uint32_t k = LOOM_PLUGIN_COMM; k <= LAST_KIND; k++) {
        if (k == r->kind)
            continue;
        for (int major = 1; major <= PROBE_MAX_MAJOR; major++) {
            if (find_symbol(r, dl, loom_plugin_kind_name(k), major))
                return refuse(r, LOOM_ERR_INVALID, "symbol",
                              "wrong kind: it is a %s plugin (exports loom_%s_plugin_v%d), "
                              "not a %s plugin", loom_plugin_kind_name(k),
                              loom_plugin_kind_name(k), major, r->kind_name);
        }
    }
    return refuse(r, LOOM_ERR_INVALID, "symbol",
                  "not a loom plugin: it exports no loom_%s_plugin_v%d symbol (nor any other "
                  "loom_<kind>_plugin_v<N>); export the plugin struct with LOOM_PLUGIN_EXPORT",
                  r->kind_name, LOOM_ABI_MAJOR);
}

/* dlerror() starts with the path we already name; keep only the cause. */
static const char *dl_cause(const char *err, const char *path)
{
    if (!err)
        return "unknown dlopen error";
    size_t n = strlen(path);
    if (!strncmp(err, path, n) && err[n] == ':' && err[n + 1] == ' ')
        return err + n + 2;
    return err;
}

/* ------------------------------------------------------------ the ELF file */

#if UINTPTR_MAX == UINT64_MAX
#define NATIVE_CLASS ELFCLASS64
typedef Elf64_Ehdr elf_header;
typedef Elf64_Phdr elf_segment;
#else
#define NATIVE_CLASS ELFCLASS32
typedef Elf32_Ehdr elf_header;
typedef Elf32_Phdr elf_segment;
#endif

/* dlopen maps a shared object's segments without comparing them with the
 * file's size, and the first touch of a page past the end of a truncated
 * file is a SIGBUS that kills the command with no word. So the program
 * headers are read first: every segment dlopen maps must lie within the
 * file. A file of another class or machine is left to dlopen, which says
 * so without touching it. 0, or -1 with why filled in. */
static int check_elf(const char *path, char *why, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, cap, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    elf_header eh;
    elf_segment *segments = NULL;
    int bad = -1;
    if (fstat(fd, &st) != 0) {
        snprintf(why, cap, "cannot stat: %s", strerror(errno));
        goto done;
    }
    uint64_t size = (uint64_t)st.st_size;
    ssize_t got = pread(fd, &eh, sizeof eh, 0);
    if (got >= SELFMAG && memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
        snprintf(why, cap, "not a shared library: the file does not start with the ELF magic "
                           "bytes; rebuild the plugin");
        goto done;
    }
    if (got < (ssize_t)sizeof eh) {
        snprintf(why, cap, "truncated: the file is %llu bytes, shorter than an ELF header; copy "
                           "or rebuild the plugin again", (unsigned long long)size);
        goto done;
    }
    if (eh.e_ident[EI_CLASS] != NATIVE_CLASS || eh.e_phentsize != sizeof(elf_segment)) {
        bad = 0;
        goto done;
    }
    uint64_t table_end = (uint64_t)eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(elf_segment);
    if (eh.e_phnum == 0 || table_end > size) {
        snprintf(why, cap, "truncated: the file is %llu bytes, but its ELF program headers %s; "
                           "copy or rebuild the plugin again", (unsigned long long)size,
                 eh.e_phnum == 0 ? "are missing" : "end past it");
        goto done;
    }
    segments = malloc((size_t)eh.e_phnum * sizeof *segments);
    size_t table_bytes = (size_t)eh.e_phnum * sizeof *segments;
    if (!segments || pread(fd, segments, table_bytes, (off_t)eh.e_phoff) != (ssize_t)table_bytes) {
        snprintf(why, cap, "cannot read its ELF program headers: %s",
                 segments ? strerror(errno) : "out of memory");
        goto done;
    }
    for (int i = 0; i < eh.e_phnum; i++) {
        const elf_segment *seg = &segments[i];
        uint64_t end = (uint64_t)seg->p_offset + (uint64_t)seg->p_filesz;
        if (seg->p_type == PT_LOAD && (end > size || end < (uint64_t)seg->p_offset)) {
            snprintf(why, cap, "truncated: the file is %llu bytes, but its ELF segment %d ends at "
                               "byte %llu; copy or rebuild the plugin again",
                     (unsigned long long)size, i, (unsigned long long)end);
            goto done;
        }
    }
    bad = 0;
done:
    free(segments);
    close(fd);
    return bad;
}

/* ------------------------------------------------------------ permissions */

/* Whether the group of st is its owner's alone: no other user has it as
 * primary group or is listed in it (a private group, as ssh asks of a
 * group-writable file). */
static int group_is_owners_alone(const struct stat *st)
{
    struct group *gr = getgrgid(st->st_gid);
    if (!gr)
        return 0;
    gid_t gid = gr->gr_gid;
    int alone = 1;
    struct passwd *owner = getpwuid(st->st_uid);
    char name[256] = "";
    if (owner)
        snprintf(name, sizeof name, "%s", owner->pw_name);
    for (char **m = gr->gr_mem; alone && *m; m++)
        alone = name[0] && !strcmp(*m, name);
    setpwent();
    for (struct passwd *pw; alone && (pw = getpwent());)
        if (pw->pw_gid == gid && pw->pw_uid != st->st_uid)
            alone = 0;
    endpwent();
    return alone;
}

static void owner_name(uid_t uid, char *buf, size_t cap)
{
    struct passwd *pw = getpwuid(uid);
    if (pw)
        snprintf(buf, cap, "%s", pw->pw_name);
    else
        snprintf(buf, cap, "uid %u", (unsigned)uid);
}

/* The rule is ssh's for the files it trusts: whoever can write the file or
 * any folder on the way to it can replace the code loom runs, so each must
 * belong to root or to the user running loom, and be writable by its owner
 * alone (group-writable is fine for a group that is the owner's alone). A
 * sticky folder writable by all, owned by root or the user (/tmp, mode
 * 1777), is fine too: others may add entries but not rename or remove ours,
 * and an entry they add is theirs, which the check of that entry refuses. */
static int check_one_path(const char *path, int is_file, char *why, size_t cap)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0; /* what is missing is reported by the checks that need it */
    const char *what = S_ISDIR(st.st_mode) ? "the folder" : is_file ? "the file" : "the path";
    uid_t me = geteuid();
    char owner[64], user[64];
    owner_name(st.st_uid, owner, sizeof owner);
    if (st.st_uid != 0 && st.st_uid != me) {
        owner_name(me, user, sizeof user);
        snprintf(why, cap, "insecure: %s %s (mode %04o, owner %s) belongs to neither you (%s) "
                 "nor root, and its owner could replace the plugin; install it where only you "
                 "or root can write, or set LOOM_ALLOW_INSECURE_PLUGINS=1 to load it anyway",
                 what, path, (unsigned)(st.st_mode & 07777), owner, user);
        return -1;
    }
    int sticky_ok = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX);
    if (!(st.st_mode & (S_IWGRP | S_IWOTH)) || sticky_ok ||
        (!(st.st_mode & S_IWOTH) && group_is_owners_alone(&st)))
        return 0;
    snprintf(why, cap, "insecure: %s %s (mode %04o, owner %s) is writable by %s, who could "
             "replace the plugin; run chmod go-w %s, or set LOOM_ALLOW_INSECURE_PLUGINS=1 to "
             "load it anyway", what, path, (unsigned)(st.st_mode & 07777), owner,
             (st.st_mode & S_IWOTH) ? "everyone" : "its group", path);
    return -1;
}

/* The file at abs (an absolute path) and every folder above it. */
static int check_path_chain(const char *abs, char *why, size_t cap)
{
    char path[2 * PATH_MAX + 2];
    snprintf(path, sizeof path, "%s", abs);
    for (int is_file = 1;; is_file = 0) {
        if (check_one_path(path, is_file, why, cap))
            return -1;
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) {
            if (strcmp(path, "/") == 0)
                return 0;
            return check_one_path("/", 0, why, cap);
        }
        *slash = '\0';
    }
}

int loom_plugin_check_permissions(const char *path, char *why, size_t cap)
{
    /* The path as given (where its names can be changed) and the file it
     * leads to (where its bytes can be). */
    char abs[2 * PATH_MAX + 2];
    char cwd[PATH_MAX];
    if (path[0] == '/')
        snprintf(abs, sizeof abs, "%s", path);
    else if (getcwd(cwd, sizeof cwd))
        snprintf(abs, sizeof abs, "%s/%s", cwd, path);
    else
        abs[0] = '\0';
    if (abs[0] && check_path_chain(abs, why, cap))
        return -1;
    char *real = realpath(path, NULL);
    int rc = real && strcmp(real, abs) ? check_path_chain(real, why, cap) : 0;
    free(real);
    return rc;
}

static int insecure_allowed(void)
{
    const char *allow = getenv("LOOM_ALLOW_INSECURE_PLUGINS");
    return allow && !strcmp(allow, "1");
}

/* ------------------------------------------------- reading a plugin's file */

#if UINTPTR_MAX == UINT64_MAX
typedef Elf64_Dyn elf_dyn;
typedef Elf64_Sym elf_sym;
typedef Elf64_Rela elf_rela;
#define ELF_R_SYM ELF64_R_SYM
#define ELF_R_TYPE ELF64_R_TYPE
#define ELF_ST_BIND ELF64_ST_BIND
#else
typedef Elf32_Dyn elf_dyn;
typedef Elf32_Sym elf_sym;
typedef Elf32_Rela elf_rela;
#define ELF_R_SYM ELF32_R_SYM
#define ELF_R_TYPE ELF32_R_TYPE
#define ELF_ST_BIND ELF32_ST_BIND
#endif

/* The relocations that fill the pointers of a plugin's data: to its own
 * addresses (RELATIVE, IRELATIVE: the resolver's address stands for the
 * function, never called) and to symbols (ABS, GLOB_DAT). */
#if defined(__x86_64__)
#define NATIVE_MACHINE EM_X86_64
#define RELOC_RELATIVE R_X86_64_RELATIVE
#define RELOC_IRELATIVE R_X86_64_IRELATIVE
#define RELOC_ABS R_X86_64_64
#define RELOC_GLOB_DAT R_X86_64_GLOB_DAT
#define R_NONE_NATIVE R_X86_64_NONE
#elif defined(__aarch64__)
#define NATIVE_MACHINE EM_AARCH64
#define RELOC_RELATIVE R_AARCH64_RELATIVE
#define RELOC_IRELATIVE R_AARCH64_IRELATIVE
#define RELOC_ABS R_AARCH64_ABS64
#define RELOC_GLOB_DAT R_AARCH64_GLOB_DAT
#define R_NONE_NATIVE R_AARCH64_NONE
#endif

#ifndef DT_RELR
#define DT_RELRSZ 35
#define DT_RELR 36
#endif

/* The largest span of segments read: far above any plugin's. */
#define IMAGE_MAX_BYTES ((uint64_t)2 << 30)

/* A plugin file's loadable segments at their addresses in one private,
 * never executable mapping, with the relocations of its data applied: what
 * dlopen would map, but without running a byte of it. */
typedef struct plugin_image {
    unsigned char *base; /* the lowest segment's first page */
    size_t size;
    uint64_t first;      /* that page's address in the file's terms */
    uintptr_t load;      /* where address 0 would be: what relocations add */
    const elf_sym *syms;
    size_t nsyms;
    const char *strtab;
    size_t strsz;
    const elf_dyn *dyn;
    size_t ndyn;
} plugin_image;

static void image_free(plugin_image *im)
{
    if (im->base)
        munmap(im->base, im->size);
    memset(im, 0, sizeof *im);
}

/* n bytes at address addr of the image, or NULL when they are not all in it. */
static void *image_at(const plugin_image *im, uint64_t addr, uint64_t n)
{
    if (addr < im->first || addr - im->first > im->size || n > im->size - (addr - im->first))
        return NULL;
    return im->base + (addr - im->first);
}

/* Whether the n bytes at p lie in the image. */
static int image_holds(const plugin_image *im, const void *p, size_t n)
{
    const unsigned char *c = p;
    return c >= im->base && image_at(im, im->first + (uint64_t)(c - im->base), n) != NULL;
}

static const char *image_string(const plugin_image *im, size_t offset)
{
    if (offset >= im->strsz || !memchr(im->strtab + offset, '\0', im->strsz - offset))
        return NULL;
    return im->strtab + offset;
}

static uint64_t dyn_value(const plugin_image *im, long long tag)
{
    for (size_t i = 0; i < im->ndyn && im->dyn[i].d_tag != DT_NULL; i++)
        if ((long long)im->dyn[i].d_tag == tag)
            return (uint64_t)im->dyn[i].d_un.d_val;
    return 0;
}

/* How many symbols the dynamic symbol table holds: the ELF hash table says
 * it, a GNU hash table by its last chain. */
static size_t symbol_count(const plugin_image *im)
{
    uint64_t at = dyn_value(im, DT_HASH);
    const uint32_t *w;
    if (at && (w = image_at(im, at, 2 * sizeof *w)))
        return w[1];
    at = dyn_value(im, DT_GNU_HASH);
    if (!at || !(w = image_at(im, at, 4 * sizeof *w)))
        return 0;
    uint64_t nbuckets = w[0], symoffset = w[1], bloom_words = w[2];
    uint64_t buckets_at = at + 16 + bloom_words * sizeof(uintptr_t);
    const uint32_t *buckets = image_at(im, buckets_at, nbuckets * 4);
    if (!buckets)
        return 0;
    uint64_t last = 0;
    for (uint64_t i = 0; i < nbuckets; i++)
        if (buckets[i] > last)
            last = buckets[i];
    if (last < symoffset)
        return (size_t)symoffset;
    uint64_t chains_at = buckets_at + nbuckets * 4;
    for (;; last++) {
        const uint32_t *chain = image_at(im, chains_at + (last - symoffset) * 4, 4);
        if (!chain)
            return 0;
        if (*chain & 1)
            return (size_t)last + 1;
    }
}

static const elf_sym *image_symbol(const plugin_image *im, const char *name)
{
    for (size_t i = 1; i < im->nsyms; i++) {
        const elf_sym *s = &im->syms[i];
        const char *n = image_string(im, s->st_name);
        if (s->st_shndx != SHN_UNDEF && n && !strcmp(n, name))
            return s;
    }
    return NULL;
}

static const void *image_struct(const struct plugin_image *im, const char *name)
{
    const elf_sym *s = image_symbol(im, name);
    return s ? image_at(im, s->st_value, sizeof(loom_plugin_header)) : NULL;
}

/* The address a symbol relocation puts in a slot: the plugin's own
 * symbol's place in the image, else what this process would resolve it to
 * (a weak one absent is NULL, a strong one absent a non-NULL stand-in: the
 * symbol check reports it where it can). */
static uintptr_t symbol_address(const plugin_image *im, size_t index)
{
    if (index == 0 || index >= im->nsyms)
        return 0;
    const elf_sym *s = &im->syms[index];
    if (s->st_shndx != SHN_UNDEF)
        return im->load + (uintptr_t)s->st_value;
    const char *name = image_string(im, s->st_name);
    void *found = name ? dlsym(RTLD_DEFAULT, name) : NULL;
    if (found || ELF_ST_BIND(s->st_info) == STB_WEAK)
        return (uintptr_t)found;
    return (uintptr_t)-1;
}

#ifdef NATIVE_MACHINE
/* The dynamic loader writes where a relocation says, unchecked: one that
 * points outside the library's segments crashes it (SIGSEGV) with no word
 * of which file it was. */
static int relocation_outside(char *why, size_t cap, size_t index, uint64_t address)
{
    snprintf(why, cap, "its relocation %zu writes at address 0x%llx, outside its segments; the "
             "file is corrupt: copy or rebuild the plugin again", index,
             (unsigned long long)address);
    return -1;
}

static int image_relocate(plugin_image *im, char *why, size_t cap)
{
    uint64_t at = dyn_value(im, DT_RELA), bytes = dyn_value(im, DT_RELASZ);
    const elf_rela *rela = at ? image_at(im, at, bytes) : NULL;
    if (at && !rela) {
        snprintf(why, cap, "its relocations (DT_RELA) lie outside its segments; the file is "
                 "corrupt: rebuild the plugin");
        return -1;
    }
    for (size_t i = 0; rela && i < bytes / sizeof *rela; i++) {
        uintptr_t *slot = image_at(im, rela[i].r_offset, sizeof *slot);
        uint32_t type = (uint32_t)ELF_R_TYPE(rela[i].r_info);
        if (!slot && type != R_NONE_NATIVE)
            return relocation_outside(why, cap, i, (uint64_t)rela[i].r_offset);
        if (!slot)
            continue;
        if (type == RELOC_RELATIVE || type == RELOC_IRELATIVE)
            *slot = im->load + (uintptr_t)rela[i].r_addend;
        else if (type == RELOC_ABS || type == RELOC_GLOB_DAT)
            *slot = symbol_address(im, ELF_R_SYM(rela[i].r_info)) + (uintptr_t)rela[i].r_addend;
    }
    /* Packed relative relocations: an address, then bitmaps of the words
     * after it that move with the image. */
    at = dyn_value(im, DT_RELR);
    bytes = dyn_value(im, DT_RELRSZ);
    const uintptr_t *relr = at ? image_at(im, at, bytes) : NULL;
    uint64_t where = 0;
    for (size_t i = 0; relr && i < bytes / sizeof *relr; i++) {
        uintptr_t entry = relr[i];
        if (!(entry & 1)) {
            uintptr_t *slot = image_at(im, entry, sizeof *slot);
            if (!slot)
                return relocation_outside(why, cap, i, entry);
            *slot += im->load;
            where = entry + sizeof *slot;
            continue;
        }
        for (unsigned bit = 1; bit < 8 * sizeof entry; bit++) {
            if (!((entry >> bit) & 1))
                continue;
            uint64_t at_slot = where + (bit - 1) * sizeof(uintptr_t);
            uintptr_t *slot = image_at(im, at_slot, sizeof *slot);
            if (!slot)
                return relocation_outside(why, cap, i, at_slot);
            *slot += im->load;
        }
        where += (8 * sizeof entry - 1) * sizeof entry;
    }
    return 0;
}
#endif

/* Read the file's segments into *im, relocated. 0, or -1 with why. */
static int image_open(const char *path, plugin_image *im, char *why, size_t cap)
{
    memset(im, 0, sizeof *im);
#ifndef NATIVE_MACHINE
    (void)path;
    snprintf(why, cap, "loom cannot read a plugin's header from its file on this machine");
    return -1;
#else
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, cap, "cannot open: %s", strerror(errno));
        return -1;
    }
    elf_header eh = {0};
    elf_segment *seg = NULL;
    int rc = -1;
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh ||
        eh.e_ident[EI_CLASS] != NATIVE_CLASS || eh.e_machine != NATIVE_MACHINE ||
        eh.e_type != ET_DYN || eh.e_phentsize != sizeof(elf_segment) || eh.e_phnum == 0) {
        snprintf(why, cap, "not a shared library for this machine (ELF class %d, machine %d, "
                 "type %d); build the plugin for this machine", eh.e_ident[EI_CLASS],
                 eh.e_machine, eh.e_type);
        goto done;
    }
    size_t table = (size_t)eh.e_phnum * sizeof *seg;
    seg = malloc(table);
    if (!seg || pread(fd, seg, table, (off_t)eh.e_phoff) != (ssize_t)table) {
        snprintf(why, cap, "cannot read its ELF program headers: %s",
                 seg ? strerror(errno) : "out of memory");
        goto done;
    }
    uint64_t first = UINT64_MAX, span = 0;
    const elf_segment *dynamic = NULL;
    for (int i = 0; i < eh.e_phnum; i++) {
        if (seg[i].p_type == PT_DYNAMIC)
            dynamic = &seg[i];
        if (seg[i].p_type != PT_LOAD)
            continue;
        uint64_t end = (uint64_t)seg[i].p_vaddr + seg[i].p_memsz;
        if (end < seg[i].p_vaddr || seg[i].p_filesz > seg[i].p_memsz) {
            snprintf(why, cap, "its ELF segment %d (address 0x%llx, %llu bytes) is not one a "
                     "library can have; the file is corrupt: rebuild the plugin", i,
                     (unsigned long long)seg[i].p_vaddr, (unsigned long long)seg[i].p_memsz);
            goto done;
        }
        if (end > span)
            span = end;
        if (seg[i].p_vaddr < first)
            first = seg[i].p_vaddr & ~(uint64_t)(sysconf(_SC_PAGESIZE) - 1);
    }
    if (!dynamic || first == UINT64_MAX) {
        snprintf(why, cap, "not a shared library: it has no %s; rebuild the plugin",
                 dynamic ? "loadable segment" : "dynamic section");
        goto done;
    }
    if (span - first > IMAGE_MAX_BYTES) {
        snprintf(why, cap, "its ELF segments span %llu bytes, more than a plugin can; the file is "
                 "corrupt: rebuild the plugin", (unsigned long long)(span - first));
        goto done;
    }
    im->first = first;
    im->size = (size_t)(span - first);
    im->base = mmap(NULL, im->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (im->base == MAP_FAILED) {
        im->base = NULL;
        snprintf(why, cap, "cannot map %zu bytes to read it: %s", im->size, strerror(errno));
        goto done;
    }
    im->load = (uintptr_t)im->base - (uintptr_t)first;
    for (int i = 0; i < eh.e_phnum; i++) {
        if (seg[i].p_type != PT_LOAD || !seg[i].p_filesz)
            continue;
        errno = 0;
        if (pread(fd, im->base + (seg[i].p_vaddr - first), seg[i].p_filesz, (off_t)seg[i].p_offset) !=
            (ssize_t)seg[i].p_filesz) {
            snprintf(why, cap, "cannot read its ELF segment %d: %s", i,
                     errno ? strerror(errno) : "the file is shorter than its headers say");
            goto done;
        }
    }
    im->dyn = image_at(im, dynamic->p_vaddr, dynamic->p_memsz);
    im->ndyn = im->dyn ? dynamic->p_memsz / sizeof(elf_dyn) : 0;
    uint64_t symtab = dyn_value(im, DT_SYMTAB), strtab = dyn_value(im, DT_STRTAB);
    im->strsz = dyn_value(im, DT_STRSZ);
    im->strtab = image_at(im, strtab, im->strsz);
    im->nsyms = symbol_count(im);
    im->syms = image_at(im, symtab, (uint64_t)im->nsyms * sizeof(elf_sym));
    if (!im->dyn || !im->strtab || !im->syms || im->nsyms == 0) {
        snprintf(why, cap, "its dynamic symbol table cannot be read from its segments; the "
                 "file is corrupt: rebuild the plugin");
        goto done;
    }
    rc = image_relocate(im, why, cap);
done:
    free(seg);
    close(fd);
    if (rc)
        image_free(im);
    else
        mprotect(im->base, im->size, PROT_READ);
    return rc;
#endif
}

/* Whether the image's dynamic section has an entry of tag; its value in *value. */
static int dyn_has(const plugin_image *im, long long tag, uint64_t *value)
{
    for (size_t i = 0; i < im->ndyn && im->dyn[i].d_tag != DT_NULL; i++) {
        if ((long long)im->dyn[i].d_tag == tag) {
            *value = (uint64_t)im->dyn[i].d_un.d_val;
            return 1;
        }
    }
    return 0;
}

/* Whether lib is a file in one of the colon-separated folders of list, an
 * empty one being the current directory (as the dynamic loader has it) and
 * $ORIGIN the plugin's folder. -1 when an entry has a dynamic string token
 * this cannot expand ($LIB, $PLATFORM): then nothing can be said. */
static int in_folders(const char *list, const char *origin, const char *lib)
{
    int unknown = 0;
    while (list) {
        const char *colon = strchr(list, ':');
        size_t len = colon ? (size_t)(colon - list) : strlen(list);
        char dir[PATH_MAX], path[2 * PATH_MAX + 2];
        const char *rest = NULL;
        if (len >= 7 && !strncmp(list, "$ORIGIN", 7))
            rest = list + 7;
        else if (len >= 9 && !strncmp(list, "${ORIGIN}", 9))
            rest = list + 9;
        if (rest)
            snprintf(dir, sizeof dir, "%s%.*s", origin, (int)(len - (size_t)(rest - list)), rest);
        else
            snprintf(dir, sizeof dir, "%.*s", len ? (int)len : 1, len ? list : ".");
        if (strchr(dir, '$'))
            unknown = 1;
        else if (snprintf(path, sizeof path, "%s/%s", dir, lib) > 0 && access(path, F_OK) == 0)
            return 1;
        list = colon ? colon + 1 : NULL;
    }
    return unknown ? -1 : 0;
}

void loom_folder_list_add(char *folders, size_t cap, const char *dir)
{
    size_t used = strlen(folders), n = strlen(dir);
    /* a whole entry, not a part of one: /lib/x86_64-linux-gnu is inside
     * /usr/lib/x86_64-linux-gnu and is still a folder of its own */
    for (const char *at = folders; (at = strstr(at, dir)) != NULL; at += n)
        if ((at == folders || at[-1] == ':') && (at[n] == ':' || at[n] == '\0'))
            return;
    if (used + n + 2 < cap)
        snprintf(folders + used, cap - used, "%s%s", used ? ":" : "", dir);
}

/* The folders of the libraries this process has loaded: the system's
 * library folders, whatever the distribution calls them. */
static int add_loaded_folder(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    if (!slash || slash == info->dlpi_name)
        return 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - info->dlpi_name), info->dlpi_name);
    loom_folder_list_add(data, 4096, dir);
    return 0;
}

int loom_ld_cache_names(const char *cache_path, const char *lib)
{
    int fd = open(cache_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    void *cache = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (cache == MAP_FAILED)
        return 0;
    /* the names it knows are NUL-ended strings in its string table, where
     * ldconfig may keep a name only as the end of its library's path */
    char key[NAME_MAX + 3];
    int n = snprintf(key, sizeof key, "%c%s", '\0', lib), found = 0;
    if (n > 0 && (size_t)n < sizeof key) {
        found = memmem(cache, (size_t)st.st_size, key, (size_t)n + 1) != NULL;
        key[0] = '/';
        found = found || memmem(cache, (size_t)st.st_size, key, (size_t)n + 1) != NULL;
    }
    munmap(cache, (size_t)st.st_size);
    return found;
}

/* Every library the plugin needs that is not loaded yet must be where the
 * dynamic loader looks for it (the plugin's RPATH or RUNPATH,
 * LD_LIBRARY_PATH, the system's cache and library folders): otherwise dlopen
 * would fail. 0, or -1 with why. */
static int image_check_needed(const plugin_image *im, const char *path, char *why, size_t cap)
{
    char origin[PATH_MAX];
    folder_of(path, origin, sizeof origin);
    uint64_t at;
    const char *runpath = dyn_has(im, DT_RUNPATH, &at) ? image_string(im, at) : NULL;
    const char *rpath = !runpath && dyn_has(im, DT_RPATH, &at) ? image_string(im, at) : NULL;
    const char *env = getenv("LD_LIBRARY_PATH");
    char folders[4096] = "/lib:/usr/lib:/lib64:/usr/lib64";
    dl_iterate_phdr(add_loaded_folder, folders);
    for (size_t i = 0; i < im->ndyn && im->dyn[i].d_tag != DT_NULL; i++) {
        if (im->dyn[i].d_tag != DT_NEEDED)
            continue;
        const char *lib = image_string(im, im->dyn[i].d_un.d_val);
        if (!lib || !lib[0])
            continue;
        void *loaded = strchr(lib, '/') ? NULL : dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
        if (loaded) {
            dlclose(loaded);
            continue;
        }
        if (strchr(lib, '/') ? access(lib, F_OK) == 0
                             : (rpath && in_folders(rpath, origin, lib)) ||
                                   (env && env[0] && in_folders(env, origin, lib)) ||
                                   (runpath && in_folders(runpath, origin, lib)) ||
                                   loom_ld_cache_names("/etc/ld.so.cache", lib) || in_folders(folders, origin, lib))
            continue;
        snprintf(why, cap, "it needs %s, which is nowhere the dynamic loader looks (%s%s"
                 "LD_LIBRARY_PATH, /etc/ld.so.cache, the system's library folders); install it "
                 "or add its folder to LD_LIBRARY_PATH", lib, runpath ? "its RUNPATH, " : "",
                 rpath ? "its RPATH, " : "");
        return -1;
    }
    return 0;
}

/* What the dynamic loader would say of the symbols the plugin uses, as far
 * as this process can tell without loading anything: when every library it
 * needs is already loaded, a strong symbol none of them defines makes
 * dlopen fail. 0, or -1 with why. */
static int image_check_symbols(const plugin_image *im, char *why, size_t cap)
{
    void *needed[64];
    size_t nneeded = 0;
    int all_loaded = 1;
    for (size_t i = 0; i < im->ndyn && all_loaded; i++) {
        if (im->dyn[i].d_tag != DT_NEEDED)
            continue;
        const char *lib = image_string(im, im->dyn[i].d_un.d_val);
        void *h = lib && nneeded < LOOM_ARRAY_LEN(needed) ? dlopen(lib, RTLD_LAZY | RTLD_NOLOAD)
                                                          : NULL;
        if (h)
            needed[nneeded++] = h;
        else
            all_loaded = 0;
    }
    int rc = 0;
    for (size_t i = 1; all_loaded && !rc && i < im->nsyms; i++) {
        const elf_sym *s = &im->syms[i];
        const char *name = image_string(im, s->st_name);
        if (s->st_shndx != SHN_UNDEF || ELF_ST_BIND(s->st_info) != STB_GLOBAL || !name ||
            !name[0] || dlsym(RTLD_DEFAULT, name))
            continue;
        int found = 0;
        for (size_t k = 0; k < nneeded && !found; k++)
            found = dlsym(needed[k], name) != NULL;
        if (!found) {
            snprintf(why, cap, "undefined symbol: %s (none of the libraries it needs defines "
                     "it); rebuild the plugin against them", name);
            rc = -1;
        }
    }
    for (size_t k = 0; k < nneeded; k++)
        dlclose(needed[k]);
    return rc;
}

uint32_t loom_plugin_kind_in_file(const char *path)
{
    plugin_image im;
    char why[256];
    if (image_open(path, &im, why, sizeof why))
        return 0;
    uint32_t found = 0;
    for (uint32_t k = LOOM_PLUGIN_COMM; k <= LAST_KIND && !found; k++) {
        char sym[64];
        snprintf(sym, sizeof sym, "loom_%s_plugin_v%d", loom_plugin_kind_name(k), LOOM_ABI_MAJOR);
        if (image_symbol(&im, sym))
            found = k;
    }
    image_free(&im);
    return found;
}

/* dlopen runs the dynamic loader on the file's bytes, then the library's
 * constructors, and a corrupt file can crash either with no word of which
 * file it was. While it runs, a fatal signal first says so, in one write
 * (all a signal handler may do), then takes its default course: the handler
 * resets itself, and the faulting instruction faults again. A thread that
 * crashes meanwhile for its own reasons is blamed on the plugin, but dies
 * the same. */
static const int load_crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static char load_crash_line[PATH_MAX + 160];
static size_t load_crash_len;
static int load_crash_quiet;

void loom_plugin_quiet_load_crashes(void)
{
    load_crash_quiet = 1;
}

static void on_load_crash(int sig)
{
    (void)sig;
    ssize_t written = write(STDERR_FILENO, load_crash_line, load_crash_len);
    (void)written;
}

static void *dlopen_saying_crashes(const char *path)
{
    if (load_crash_quiet)
        return dlopen(path, RTLD_NOW | RTLD_LOCAL);
    int n = snprintf(load_crash_line, sizeof load_crash_line,
                     "loom: error: plugin %s crashed while loading (its file is corrupt, or its "
                     "constructor crashed); check it with loom plugins --check %s\n", path, path);
    load_crash_len = n < 0 ? 0 : (size_t)n < sizeof load_crash_line ? (size_t)n
                                                                     : sizeof load_crash_line - 1;
    struct sigaction crash = {.sa_handler = on_load_crash, .sa_flags = SA_RESETHAND | SA_NODEFER};
    struct sigaction saved[LOOM_ARRAY_LEN(load_crash_signals)];
    sigemptyset(&crash.sa_mask);
    for (size_t i = 0; i < LOOM_ARRAY_LEN(load_crash_signals); i++)
        sigaction(load_crash_signals[i], &crash, &saved[i]);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; i < LOOM_ARRAY_LEN(load_crash_signals); i++)
        sigaction(load_crash_signals[i], &saved[i], NULL);
    return dl;
}

/* The "tier" check of a compute backend: where its memory is accounted and
 * what communicators see it as, each one the core knows. */
static int check_compute_fields(load_run *r, const loom_compute_plugin_v1_t *c)
{
    if (c->tier != LOOM_TIER_HOST && c->tier != LOOM_TIER_DEVICE)
        return refuse(r, LOOM_ERR_INVALID, "tier",
                      "compute backend %s has tier %u; want LOOM_TIER_DEVICE (%d) for memory of "
                      "its own or LOOM_TIER_HOST (%d) for the host's", c->header.name, c->tier,
                      LOOM_TIER_DEVICE, LOOM_TIER_HOST);
    if (c->mem_kind >= LOOM_MEM_KIND_COUNT)
        return refuse(r, LOOM_ERR_INVALID, "tier",
                      "compute backend %s has mem_kind %u; want LOOM_MEM_HOST (%d) or "
                      "LOOM_MEM_DEVICE (%d), the kind of memory communicators see its buffers as",
                      c->header.name, c->mem_kind, LOOM_MEM_HOST, LOOM_MEM_DEVICE);
    passed(r, "tier");
    return LOOM_OK;
}

/* Every check in order; on success *dl and *header are the plugin's. */
static int check_file(load_run *r, void **dl_out, const loom_plugin_header **header_out,
                      loom_setting_spec **settings_out)
{
    struct stat st;
    if (stat(r->path, &st) != 0)
        return refuse(r, LOOM_ERR_NOT_FOUND, "file", "cannot open: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return refuse(r, LOOM_ERR_INVALID, "file", "not a regular file");
    passed(r, "file");

    char why[512];
    if (loom_plugin_check_permissions(r->path, why, sizeof why)) {
        if (!insecure_allowed())
            return refuse(r, LOOM_ERR_INVALID, "permissions", "%s", why);
        if (!r->image)
            loom_log(LOOM_LOG_WARN, "loading plugin %s although %s is set: %s", r->path,
                     "LOOM_ALLOW_INSECURE_PLUGINS=1", why);
    }
    passed(r, "permissions");

    if (check_elf(r->path, why, sizeof why) != 0)
        return refuse(r, LOOM_ERR_INVALID, "elf", "%s", why);
    passed(r, "elf");

    void *dl = NULL;
    if (r->image) {
        if (image_open(r->path, r->image, why, sizeof why))
            return refuse(r, LOOM_ERR_INVALID, "read", "%s", why);
        passed(r, "read");
        if (image_check_needed(r->image, r->path, why, sizeof why))
            return refuse(r, LOOM_ERR_INVALID, "libraries", "%s", why);
        passed(r, "libraries");
        if (image_check_symbols(r->image, why, sizeof why))
            return refuse(r, LOOM_ERR_INVALID, "symbols", "%s", why);
        passed(r, "symbols");
    } else {
#ifdef NATIVE_MACHINE
        /* What the dynamic loader would trust blindly (its tables, where its
         * relocations write) is read first, so a corrupt file is refused
         * by name instead of crashing the job inside dlopen. */
        plugin_image image;
        if (image_open(r->path, &image, why, sizeof why))
            return refuse(r, LOOM_ERR_INVALID, "read", "%s", why);
        image_free(&image);
        passed(r, "read");
#endif
        /* dlopen reads a bare name as a library to search for; we mean the file. */
        char local[PATH_MAX];
        const char *open_path = r->path;
        if (!strchr(r->path, '/')) {
            snprintf(local, sizeof local, "./%s", r->path);
            open_path = local;
        }
        dlerror();
        dl = dlopen_saying_crashes(open_path);
        if (!dl)
            return refuse(r, LOOM_ERR_INVALID, "dlopen", "dlopen failed: %s",
                          dl_cause(dlerror(), open_path));
        *dl_out = dl;
        passed(r, "dlopen");
    }

    const loom_plugin_header *h = find_symbol(r, dl, r->kind_name, LOOM_ABI_MAJOR);
    const char *strategy_name = loom_plugin_kind_name(LOOM_PLUGIN_STRATEGY);
    if (!h && r->kind == LOOM_PLUGIN_SCHEDULE &&
        (h = find_symbol(r, dl, strategy_name, LOOM_ABI_MAJOR))) {
        /* built before ABI 1.8: checked as the strategy it is, then adapted */
        r->adapting = 1;
        r->kind = LOOM_PLUGIN_STRATEGY;
        r->kind_name = strategy_name;
    }
    if (!h)
        return refuse_no_symbol(r, dl);
    char sym[64];
    snprintf(sym, sizeof sym, "loom_%s_plugin_v%d", r->kind_name, LOOM_ABI_MAJOR);
    r->checks->abi_version = h->abi_version;
    passed(r, "symbol");

    uint32_t major = LOOM_ABI_VERSION_MAJOR(h->abi_version);
    uint32_t minor = LOOM_ABI_VERSION_MINOR(h->abi_version);
    if (major != LOOM_ABI_MAJOR)
        return refuse(r, LOOM_ERR_NOT_SUPPORTED, "abi version",
                      "built for loom plugin ABI %u.%u (header.abi_version of %s), this loom "
                      "speaks %d.x; rebuild the plugin against this loom's headers", major,
                      minor, sym, LOOM_ABI_MAJOR);
    passed(r, "abi version");

    /* A strategy's required ops depend on its axis, which sits right after
     * the header; the axis is checked below, its size only once known. */
    int axis = -1;
    if (r->kind == LOOM_PLUGIN_STRATEGY &&
        h->struct_size >= offsetof(loom_strategy_plugin_v1_t, axis) + sizeof(uint32_t)) {
        uint32_t a = ((const loom_strategy_plugin_v1_t *)h)->axis;
        axis = a < LOOM_AXIS_COUNT ? (int)a : -1;
    }
    size_t need = required_size(r->kind, axis);
    if (h->struct_size < need)
        return refuse(r, LOOM_ERR_INVALID, "struct size",
                      "header.struct_size is %u bytes, smaller than the %zu bytes of a v1 %s "
                      "plugin's header and REQUIRED ops%s%s; the struct is corrupt or older than "
                      "ABI 1.0: rebuild the plugin", h->struct_size, need, r->kind_name,
                      axis >= 0 ? " for axis " : "",
                      axis >= 0 ? loom_axis_name((loom_axis)axis) : "");
    size_t ops_bytes = sizeof(((loom_plugin *)NULL)->ops);
    size_t spans = h->struct_size < ops_bytes ? h->struct_size : ops_bytes;
    if (r->image && !image_holds(r->image, h, spans))
        return refuse(r, LOOM_ERR_INVALID, "struct size",
                      "header.struct_size is %u bytes, past the end of the file's segments; the "
                      "struct is corrupt: rebuild the plugin", h->struct_size);
    passed(r, "struct size");

    if (h->kind != (uint32_t)r->kind)
        return refuse(r, LOOM_ERR_INVALID, "kind",
                      "wrong kind: header.kind says %s (%u) but the symbol is %s; fix the "
                      "LOOM_PLUGIN_HEADER of the plugin", loom_plugin_kind_name(h->kind),
                      h->kind, sym);
    passed(r, "kind");

    if (!h->name || !readable_text(h->name, 128))
        return refuse(r, LOOM_ERR_INVALID, "name", "header.name is %s; give it the name in the "
                      "file's name", h->name ? "not a readable string" : "NULL");
    if (!h->name[0])
        return refuse(r, LOOM_ERR_INVALID, "name", "header.name is empty");
    if (r->expect_name && strcmp(h->name, r->expect_name))
        return refuse(r, LOOM_ERR_INVALID, "name",
                      "name mismatch: header.name is '%s' but the file is named for '%s'; "
                      "rename the file to libloom-%s-%s.so or fix the name", h->name,
                      r->expect_name, r->kind_name, h->name);
    passed(r, "name");

    if (r->kind == LOOM_PLUGIN_STRATEGY) {
        uint32_t a = ((const loom_strategy_plugin_v1_t *)h)->axis;
        if (a >= LOOM_AXIS_COUNT)
            return refuse(r, LOOM_ERR_INVALID, "axis",
                          "axis %u is not one of LOOM_AXIS_TP, _SP, _PP, _DP (0..%d)", a,
                          LOOM_AXIS_COUNT - 1);
        if (r->adapting && a != LOOM_AXIS_PP)
            return refuse(r, LOOM_ERR_INVALID, "axis",
                          "wrong kind: it is a strategy of the %s axis (exports %s), not a "
                          "pipeline schedule; name a schedule in parallel.pp.schedule",
                          loom_axis_name((loom_axis)a), sym);
        passed(r, "axis");
    }

    /* mem_kinds 0 says "the kinds of the backend I opened" since 1.10; before, it said none */
    if (r->kind == LOOM_PLUGIN_COMM && ((const loom_comm_plugin_v1_t *)h)->mem_kinds == 0 &&
        h->abi_version < LOOM_ABI_VERSION(1, 10))
        return refuse(r, LOOM_ERR_INVALID, "mem_kinds",
                      "mem_kinds is 0: the backend takes no kind of memory; set "
                      "LOOM_MEM_BIT(LOOM_MEM_HOST) and/or LOOM_MEM_BIT(LOOM_MEM_DEVICE), or, for a "
                      "wrapper, rebuild against loom ABI 1.10 for LOOM_MEM_KINDS_INNER");

    if (r->kind == LOOM_PLUGIN_COMPUTE) {
        int rc = check_compute_fields(r, (const loom_compute_plugin_v1_t *)h);
        if (rc != LOOM_OK)
            return rc;
    }

    op_list lists[3];
    int nlists = required_ops(r->kind, axis, lists);
    if (r->kind == LOOM_PLUGIN_COMPUTE &&
        ((const loom_compute_plugin_v1_t *)h)->tier != LOOM_TIER_HOST)
        lists[nlists++] = (op_list)OP_LIST(compute_memory_ops);
    char missing[512] = "";
    int nmissing = 0, nkernels = 0, nmemory = 0;
    for (int l = 0; l < nlists; l++) {
        for (size_t i = 0; i < lists[l].count; i++) {
            if (op_present(h, lists[l].ops[i].offset))
                continue;
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", nmissing ? ", " : "",
                     lists[l].ops[i].name);
            nmissing++;
            nkernels += lists[l].ops[i].offset >= offsetof(loom_compute_plugin_v1_t, gemm);
            nmemory += lists[l].ops == compute_memory_ops;
        }
    }
    if (nmissing && r->kind == LOOM_PLUGIN_COMPUTE)
        return refuse(r, LOOM_ERR_INVALID, "required ops", "compute backend %s leaves %s NULL; %s",
                      h->name, missing,
                      nkernels == nmissing ? "every kernel of a training step is required (a "
                                             "missing kernel would run nowhere)"
                      : nmemory == nmissing ? "a backend of the device tier allocates its own "
                                              "memory (only one of the host tier may leave "
                                              "alloc and free to the core)"
                                            : "a compute backend must implement every op but "
                                              "probe and native_queue");
    if (nmissing)
        return refuse(r, LOOM_ERR_INVALID, "required ops",
                      "REQUIRED op%s %s %s NULL%s%s; a %s plugin must implement %s",
                      nmissing > 1 ? "s" : "", missing, nmissing > 1 ? "are" : "is",
                      axis >= 0 ? " for axis " : "",
                      axis >= 0 ? loom_axis_name((loom_axis)axis) : "", r->kind_name,
                      nmissing > 1 ? "them" : "it");
    passed(r, "required ops");

    if (r->kind == LOOM_PLUGIN_STRATEGY &&
        h->struct_size >= offsetof(loom_strategy_plugin_v1_t, capabilities) + sizeof(uint64_t)) {
        uint64_t unknown = ((const loom_strategy_plugin_v1_t *)h)->capabilities &
                           ~(uint64_t)LOOM_STRATEGY_KNOWN_CAPABILITIES;
        if (unknown)
            return refuse(r, LOOM_ERR_NOT_SUPPORTED, "capabilities",
                          "capabilities has bits 0x%llx this loom does not know, so it cannot "
                          "honour what they require; use a loom as new as the plugin's headers",
                          (unsigned long long)unknown);
        const loom_strategy_plugin_v1_t *strategy = (const loom_strategy_plugin_v1_t *)h;
        if ((strategy->capabilities & LOOM_STRATEGY_APPROXIMATE) && strategy->axis != LOOM_AXIS_DP)
            return refuse(r, LOOM_ERR_INVALID, "capabilities",
                          "capabilities has LOOM_STRATEGY_APPROXIMATE on a strategy of axis %s; "
                          "only a data strategy (axis dp) trains replicas that differ: remove "
                          "the bit",
                          loom_axis_name((loom_axis)strategy->axis));
        passed(r, "capabilities");
    }

    if (check_description(h, why, sizeof why))
        return refuse(r, LOOM_ERR_INVALID, "description", "%s", why);
    passed(r, "description");

    char group[192];
    settings_group(r->kind, h, group, sizeof group);
    if (load_settings(h, group, settings_out, why, sizeof why))
        return refuse(r, LOOM_ERR_INVALID, "settings", "bad settings spec: %s", why);
    passed(r, "settings");

    *header_out = h;
    return LOOM_OK;
}

/* "plugin comm 'mpi'" for messages: the name asked for, else the file's. */
static void describe_plugin(char *buf, size_t cap, const char *kind_name, const char *name,
                            const char *path)
{
    char fkind[32], fname[128];
    if (!name && loom_plugin_parse_file_name(path, fkind, sizeof fkind, fname, sizeof fname))
        name = fname;
    if (name)
        snprintf(buf, cap, "plugin %s '%s'", kind_name, name);
    else
        snprintf(buf, cap, "plugin %s", kind_name); /* the path follows */
}

/* read_only: read the file (loom_plugin_read_file), else dlopen it. */
static int open_plugin(const char *path, loom_plugin_kind kind, const char *expect_name,
                       loom_plugin_checks *checks, int read_only, loom_plugin **out)
{
    *out = NULL;
    loom_plugin_checks local = {0};
    if (!checks)
        checks = &local;
    checks->abi_version = 0;
    checks->reason[0] = '\0';
    const char *kind_name = loom_plugin_kind_name(kind);
    if (!strcmp(kind_name, "?"))
        return loom_fail(LOOM_ERR_INVALID, "plugin %s: unknown plugin kind %d", path, (int)kind);

    /* A file named for a plugin carries the name its header must have (a
     * schedule's may be named for the strategy it was built as). */
    char fkind[32], fname[128];
    uint32_t file_kind = 0;
    if (loom_plugin_parse_file_name(path, fkind, sizeof fkind, fname, sizeof fname))
        file_kind = loom_plugin_kind_of(fkind);
    if (!expect_name && (file_kind == (uint32_t)kind ||
                         (kind == LOOM_PLUGIN_SCHEDULE && file_kind == LOOM_PLUGIN_STRATEGY)))
        expect_name = fname;

    plugin_image image = {0};
    load_run run = {path, kind, kind_name, 0, expect_name, checks, read_only ? &image : NULL};
    void *dl = NULL;
    const loom_plugin_header *header = NULL;
    loom_setting_spec *settings = NULL;
    int rc = check_file(&run, &dl, &header, &settings);
    loom_plugin *p = NULL;
    if (rc == LOOM_OK) {
        p = calloc(1, sizeof *p);
        char *copy = strdup(path);
        if (!p || !copy) {
            free(p);
            free(copy);
            p = NULL;
            rc = LOOM_ERR_NO_MEMORY;
            snprintf(checks->reason, sizeof checks->reason, "out of memory");
        } else {
            p->dl = dl;
            p->image = image.base;
            p->image_size = image.size;
            image.base = NULL;
            p->path = copy;
            p->kind = kind;
            p->settings = settings;
            fill_ops(p, run.kind, header);
            settings = NULL;
        }
    }
    free(settings);
    image_free(&image);
    if (rc != LOOM_OK) {
        if (dl)
            dlclose(dl);
        char who[192];
        describe_plugin(who, sizeof who, kind_name, expect_name, path);
        return loom_fail(rc, "%s refused: %s: %s", who, path, checks->reason);
    }
    *out = p;
    return LOOM_OK;
}

int loom_plugin_load_file(const char *path, loom_plugin_kind kind, const char *expect_name,
                          loom_plugin_checks *checks, loom_plugin **out)
{
    return open_plugin(path, kind, expect_name, checks, 0, out);
}

int loom_plugin_read_file(const char *path, loom_plugin_kind kind, const char *expect_name,
                          loom_plugin_checks *checks, loom_plugin **out)
{
    return open_plugin(path, kind, expect_name, checks, 1, out);
}

int loom_plugin_load(const loom_search_path *sp, loom_plugin_kind kind, const char *name,
                     loom_plugin **out)
{
    *out = NULL;
    const char *kind_name = loom_plugin_kind_name(kind);
    int ndirs = sp ? sp->count : 0;
    if (!name || !name[0])
        return loom_fail(LOOM_ERR_INVALID, "plugin %s: empty plugin name", kind_name);
    if (strchr(name, '/'))
        return loom_plugin_load_file(name, kind, NULL, NULL, out);

    /* A schedule built before ABI 1.8 is a strategy's file. */
    char file[256], old_file[256] = "";
    if ((size_t)snprintf(file, sizeof file, "libloom-%s-%s.so", kind_name, name) >= sizeof file)
        return loom_fail(LOOM_ERR_INVALID, "plugin %s '%.40s...': name too long", kind_name,
                         name);
    if (kind == LOOM_PLUGIN_SCHEDULE)
        snprintf(old_file, sizeof old_file, "libloom-%s-%s.so",
                 loom_plugin_kind_name(LOOM_PLUGIN_STRATEGY), name);
    for (int i = 0; i < ndirs; i++) {
        const char *files[2] = {file, old_file};
        for (int f = 0; f < 2 && files[f][0]; f++) {
            char path[PATH_MAX];
            if ((size_t)snprintf(path, sizeof path, "%s/%s", sp->dirs[i], files[f]) >= sizeof path)
                continue;
            struct stat st;
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
                return loom_plugin_load_file(path, kind, name, NULL, out);
        }
    }

    /* Not found: name every directory tried, in order, and where the
     * relative ones were taken from. */
    char dirs[2048] = "", notes[2048] = "";
    for (int i = 0; i < ndirs; i++) {
        size_t used = strlen(dirs);
        snprintf(dirs + used, sizeof dirs - used, "%s%s", i ? ", " : "", sp->dirs[i]);
        if (!sp->notes[i] || strstr(notes, sp->notes[i]))
            continue;
        used = strlen(notes);
        snprintf(notes + used, sizeof notes - used, "; %s", sp->notes[i]);
    }
    char wanted[600];
    snprintf(wanted, sizeof wanted, "%s%s%s", file, old_file[0] ? " (nor " : "", old_file);
    if (old_file[0])
        snprintf(wanted + strlen(wanted), sizeof wanted - strlen(wanted), ")");
    return loom_fail(LOOM_ERR_NOT_FOUND,
                     "plugin %s '%s' not found: no %s in %s (set plugins.path or "
                     "LOOM_PLUGIN_PATH%s)", kind_name, name, wanted,
                     ndirs ? dirs : "(an empty search path)", notes);
}

/* The data hooks whose core default (no communication) is right only for a
 * dp group of one, as alternatives: one of each row must be implemented. */
static const struct {
    loom_optional_op ops[2]; /* one op: the second is LOOM_OPTIONAL_COUNT */
    const char *why;
} dp_group_hooks[] = {
    {{LOOM_OPTIONAL_DATA_GRADS_READY, LOOM_OPTIONAL_DATA_FINISH_BACKWARD},
     "nothing would average the gradients over the dp group"},
    {{LOOM_OPTIONAL_DATA_GRAD_NORM_SQ, LOOM_OPTIONAL_COUNT},
     "the core would sum this rank's unit gradients without communication, and clipping would "
     "see a wrong norm"},
    {{LOOM_OPTIONAL_DATA_ZERO_GRADS, LOOM_OPTIONAL_COUNT},
     "the core would clear the units' gradients only, not the strategy's own buffers"},
    {{LOOM_OPTIONAL_DATA_SET_STATE, LOOM_OPTIONAL_COUNT}, "checkpoints could not be restored"},
    {{LOOM_OPTIONAL_DATA_GET_STATE, LOOM_OPTIONAL_DATA_GET_SHARD},
     "checkpoints could not be written"},
};

int loom_plugin_check_dp_size(const loom_plugin *p, int dp_size)
{
    if (p->kind != LOOM_PLUGIN_STRATEGY || p->ops.strategy.axis != LOOM_AXIS_DP || dp_size <= 1)
        return LOOM_OK;
    /* Replicas that differ on purpose need no gradient average each step. */
    int approximate = (p->ops.strategy.capabilities & LOOM_STRATEGY_APPROXIMATE) != 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(dp_group_hooks); i++) {
        const loom_optional_op *ops = dp_group_hooks[i].ops;
        int two = ops[1] != LOOM_OPTIONAL_COUNT;
        if (approximate && ops[0] == LOOM_OPTIONAL_DATA_GRADS_READY)
            continue;
        if (loom_plugin_provides(p, ops[0]) || (two && loom_plugin_provides(p, ops[1])))
            continue;
        const char *first = loom_optional_op_name(ops[0]);
        const char *second = two ? loom_optional_op_name(ops[1]) : "";
        char hooks[96];
        if (two)
            snprintf(hooks, sizeof hooks, "%s and %s are NULL", first, second);
        else
            snprintf(hooks, sizeof hooks, "%s is NULL", first);
        return loom_fail(LOOM_ERR_INVALID,
                         "strategy '%s' cannot serve a dp group of %d ranks: %s, so %s; implement "
                         "%s%s%s (the core's defaults are right for a dp group of one only)",
                         p->header->name, dp_size, hooks, dp_group_hooks[i].why, first,
                         two ? " or " : "", second);
    }
    return LOOM_OK;
}

/* Under AddressSanitizer a plugin stays mapped: LeakSanitizer reports at
 * exit, and the frames of a library unloaded by then print as "<unknown
 * module>", so a leak could be neither read nor suppressed by library. */
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_KEEP_PLUGINS_MAPPED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_KEEP_PLUGINS_MAPPED 1
#endif
#endif

void loom_plugin_unload(loom_plugin *p)
{
    if (!p)
        return;
#ifndef LOOM_KEEP_PLUGINS_MAPPED
    if (p->dl)
        dlclose(p->dl);
#endif
    if (p->image)
        munmap(p->image, p->image_size);
    free(p->path);
    free(p->settings);
    free(p);
}

static void settings_group(uint32_t kind, const loom_plugin_header *h, char *buf, size_t cap)
{
    if (kind == LOOM_PLUGIN_COMM)
        snprintf(buf, cap, "comm.%s", h->name);
    else if (kind == LOOM_PLUGIN_SCHEDULE)
        snprintf(buf, cap, "parallel.pp");
    else if (kind == LOOM_PLUGIN_COMPUTE)
        snprintf(buf, cap, "compute.%s", h->name);
    else if (kind == LOOM_PLUGIN_STRATEGY)
        snprintf(buf, cap, "parallel.%s",
                 loom_axis_name((loom_axis)((const loom_strategy_plugin_v1_t *)h)->axis));
    else
        snprintf(buf, cap, "memory.offload");
}

void loom_plugin_settings_group(const loom_plugin *p, char *buf, size_t cap)
{
    settings_group(p->kind, p->header, buf, cap);
}

int loom_plugin_schedule_build(const loom_plugin *p, const loom_host *host,
                               const loom_pipeline_shape *shape)
{
    if (p->kind != LOOM_PLUGIN_SCHEDULE)
        return loom_fail(LOOM_ERR_INVALID, "plugin %s '%s' is not a pipeline schedule",
                         loom_plugin_kind_name(p->kind), p->header->name);
    if (p->built_as == LOOM_PLUGIN_SCHEDULE)
        return p->ops.schedule.build(host, shape);
    /* What the trainer gave a pp strategy's create that a schedule can use:
     * the pipeline's size and its micro-batches. */
    const loom_strategy_ops *old = &p->adapted;
    loom_strategy_setup setup;
    memset(&setup, 0, sizeof setup);
    setup.struct_size = sizeof setup;
    setup.axis = LOOM_AXIS_PP;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        setup.sizes[a] = 1;
    setup.sizes[LOOM_AXIS_PP] = shape->stages;
    setup.micro_batches = shape->microbatches;
    setup.compute_dtype = LOOM_F32;
    loom_strategy *instance = NULL;
    int rc = old->create(host, &setup, &instance);
    if (rc != LOOM_OK)
        return rc;
    rc = old->pipeline_schedule(instance, shape);
    int destroyed = old->destroy(instance);
    return rc != LOOM_OK ? rc : destroyed;
}
