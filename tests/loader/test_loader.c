/* The loader against deliberately broken plugins: every refusal is one
 * line naming the file and the cause, the refused file is unloaded again,
 * and the plugins that fit (including an older and a newer minor) load,
 * with what they provide recorded. Schedules load as their own kind, and
 * as a strategy of the pp axis built before ABI 1.8, adapted.
 *
 * usage: test_loader CASE PLUGIN_DIR   (CASE "all" runs every case) */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/schedule.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "runtime/config.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "check.h"

#ifndef BUILD_PLUGIN_DIR
#error "BUILD_PLUGIN_DIR: the build tree's lib/loom"
#endif
#ifndef LOOM_PLUGIN_INSTALL_DIR
#error "LOOM_PLUGIN_INSTALL_DIR: the install dir libloom was built with"
#endif

#define SKIP 77

static const char *plugin_dir;

/* A search path of the test plugin folder only (plus what loom always adds). */
static void search_test_plugins(loom_search_path *sp)
{
    setenv("LOOM_PLUGIN_PATH", plugin_dir, 1);
    int rc = loom_search_path_init(sp, NULL);
    CHECK(rc == LOOM_OK, "search path: %s", loom_last_error());
}

static void plugin_path(char *buf, size_t cap, loom_plugin_kind kind, const char *name)
{
    snprintf(buf, cap, "%s/libloom-%s-%s.so", plugin_dir, loom_plugin_kind_name(kind), name);
}

/* ---- refusals ---- */

typedef struct refusal {
    const char *name; /* the case, and the plugin's file name */
    loom_plugin_kind kind;
    int status;
    const char *expect[3]; /* substrings of the one-line message */
} refusal;

static const refusal refusals[] = {
    {"nosym", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"not a loom plugin: it exports no loom_comm_plugin_v1 symbol", "LOOM_PLUGIN_EXPORT"}},
    {"wrongkind", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"wrong kind: it is a strategy plugin (exports loom_strategy_plugin_v1), not a comm plugin"}},
    {"kindfield", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"wrong kind: header.kind says strategy (2) but the symbol is loom_comm_plugin_v1"}},
    {"abi2", LOOM_PLUGIN_COMM, LOOM_ERR_NOT_SUPPORTED,
     {"built for loom plugin ABI 2.0 (exports loom_comm_plugin_v2, not loom_comm_plugin_v1)",
      "this loom speaks 1.x; rebuild the plugin against this loom's headers"}},
    {"abi2hdr", LOOM_PLUGIN_COMM, LOOM_ERR_NOT_SUPPORTED,
     {"built for loom plugin ABI 2.0 (header.abi_version of loom_comm_plugin_v1)",
      "this loom speaks 1.x; rebuild the plugin against this loom's headers"}},
    {"misnamed", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"name mismatch: header.name is 'ucx' but the file is named for 'misnamed'",
      "rename the file to libloom-comm-ucx.so"}},
    {"nokinds", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"mem_kinds is 0: the backend takes no kind of memory",
      "for a wrapper, rebuild against loom ABI 1.10 for LOOM_MEM_KINDS_INNER"}},
    {"nullop", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"REQUIRED op allreduce is NULL; a comm plugin must implement it"}},
    {"undefined", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"dlopen failed: ", "undefined symbol: loom_test_symbol_nobody_defines"}},
    {"short", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"header.struct_size is 168 bytes, smaller than the 176 bytes of a v1 comm plugin's "
      "header and REQUIRED ops"}},
    {"settings-dup", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[1] 'eager_limit' repeats settings[0]"}},
    {"settings-default", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[1] 'factor': default \"fast\" is not a valid float"}},
    {"settings-type", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[0] 'eager_limit' has unknown type 9"}},
    {"settings-empty", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[0] has an empty name"}},
    {"settings-unended", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[1] has no readable name: the list is not ended by {0}"}},
    {"settings-rules", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[0] 'mode': the default \"slow\" is not among its allowed "
      "values"}},
    {"settings-bounds", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"bad settings spec: settings[0] 'eager_limit': the default 4096 is outside its bounds"}},
    {"nodesc", LOOM_PLUGIN_COMM, LOOM_ERR_INVALID,
     {"header.description is empty; give it one line saying what the plugin does"}},
    {"collide", LOOM_PLUGIN_STRATEGY, LOOM_ERR_INVALID,
     {"bad settings spec: settings[0] 'size' collides with the core's own parallel.dp.size; "
      "give the plugin's setting another name"}},
    {"noread", LOOM_PLUGIN_MEMTIER, LOOM_ERR_INVALID,
     {"REQUIRED op read is NULL; a memtier plugin must implement it"}},
    {"badaxis", LOOM_PLUGIN_STRATEGY, LOOM_ERR_INVALID,
     {"axis 7 is not one of LOOM_AXIS_TP, _SP, _PP, _DP"}},
    {"tpmissing", LOOM_PLUGIN_STRATEGY, LOOM_ERR_INVALID,
     {"REQUIRED op tensor_exit is NULL for axis tp"}},
    {"schedkind", LOOM_PLUGIN_SCHEDULE, LOOM_ERR_INVALID,
     {"wrong kind: header.kind says strategy (2) but the symbol is loom_schedule_plugin_v1"}},
    {"nobuild", LOOM_PLUGIN_SCHEDULE, LOOM_ERR_INVALID,
     {"REQUIRED op build is NULL; a schedule plugin must implement it"}},
    {"nullkernel", LOOM_PLUGIN_COMPUTE, LOOM_ERR_INVALID,
     {"compute backend nullkernel leaves crossentropy_slice_sums NULL; every kernel of a "
      "training step is required (a missing kernel would run nowhere)"}},
    {"noalloc", LOOM_PLUGIN_COMPUTE, LOOM_ERR_INVALID,
     {"compute backend noalloc leaves alloc, free NULL; a backend of the device tier allocates "
      "its own memory (only one of the host tier may leave alloc and free to the core)"}},
    {"badtier", LOOM_PLUGIN_COMPUTE, LOOM_ERR_INVALID,
     {"compute backend badtier has tier 7; want LOOM_TIER_DEVICE (0) for memory of its own or "
      "LOOM_TIER_HOST (1) for the host's"}},
    {"badmemkind", LOOM_PLUGIN_COMPUTE, LOOM_ERR_INVALID,
     {"compute backend badmemkind has mem_kind 5; want LOOM_MEM_HOST (0) or LOOM_MEM_DEVICE (1)"}},
};

static void check_refusal(const refusal *r)
{
    loom_search_path sp;
    search_test_plugins(&sp);
    char path[PATH_MAX];
    plugin_path(path, sizeof path, r->kind, r->name);
    loom_plugin *p = (loom_plugin *)(uintptr_t)1;
    loom_clear_error();
    int rc = loom_plugin_load(&sp, r->kind, r->name, &p);
    const char *msg = loom_last_error();
    printf("%s: %s\n", r->name, msg);
    CHECK(rc == r->status, "%s: status %d, want %d", r->name, rc, r->status);
    CHECK(p == NULL, "%s: *out must be NULL after a refusal", r->name);
    CHECK(!strchr(msg, '\n'), "%s: the message must be one line", r->name);
    char head[PATH_MAX + 128];
    snprintf(head, sizeof head, "plugin %s '%s' refused: %s: ", loom_plugin_kind_name(r->kind),
             r->name, path);
    CHECK(!strncmp(msg, head, strlen(head)), "%s: message must start '%s'", r->name, head);
    for (int i = 0; i < 3 && r->expect[i]; i++)
        CHECK(strstr(msg, r->expect[i]), "%s: message lacks '%s'", r->name, r->expect[i]);
    /* Refused means unloaded: the file is no longer mapped. */
    void *still = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    CHECK(still == NULL, "%s: refused plugin is still loaded", r->name);
    if (still)
        dlclose(still);
    loom_search_path_free(&sp);
}

/* ---- loads ---- */

static loom_plugin *load_ok(loom_plugin_kind kind, const char *name)
{
    loom_search_path sp;
    search_test_plugins(&sp);
    loom_plugin *p = NULL;
    int rc = loom_plugin_load(&sp, kind, name, &p);
    CHECK(rc == LOOM_OK && p, "%s %s: %s", loom_plugin_kind_name(kind), name, loom_last_error());
    loom_search_path_free(&sp);
    if (p) {
        CHECK(p->kind == kind, "kind %d", p->kind);
        CHECK(!strcmp(p->header->name, name), "name %s", p->header->name);
        char path[PATH_MAX];
        plugin_path(path, sizeof path, kind, name);
        CHECK(!strcmp(p->path, path), "path %s, want %s", p->path, path);
    }
    return p;
}

static void case_good(void)
{
    loom_plugin *p = load_ok(LOOM_PLUGIN_COMM, "good");
    if (!p)
        return;
    const loom_comm_plugin_v1_t *own = dlsym(p->dl, "loom_comm_plugin_v1");
    CHECK(own && p->ops.comm.allreduce == own->allreduce, "allreduce is the plugin's");
    CHECK(own && p->ops.comm.group_start == own->group_start, "group_start is the plugin's");
    CHECK(!p->ops.comm.abort, "abort is NULL");
    CHECK(p->header == &p->ops.comm.header, "the header is the ops table's");
    CHECK(loom_plugin_provides(p, LOOM_OPTIONAL_COMM_GROUP_START) &&
          loom_plugin_provides(p, LOOM_OPTIONAL_COMM_GROUP_END), "it provides the brackets");
    CHECK(!loom_plugin_provides(p, LOOM_OPTIONAL_COMM_ABORT), "it provides no abort");
    CHECK(!loom_plugin_provides(p, LOOM_OPTIONAL_DATA_EVAL), "a strategy's op, not a comm's");
    char built_for[16];
    snprintf(built_for, sizeof built_for, "1.%d", LOOM_ABI_MINOR);
    CHECK(!strcmp(p->built_for, built_for), "built for %s, want %s", p->built_for, built_for);
    CHECK(loom_plugin_has_feature(p, LOOM_FEATURE_SETTING_RULES), "1.3's setting rules");
    loom_plugin_unload(p);
}

static void case_oldminor(void)
{
    loom_plugin *p = load_ok(LOOM_PLUGIN_COMM, "oldminor");
    if (!p)
        return;
    CHECK(p->header->struct_size == offsetof(loom_comm_plugin_v1_t, group_start),
          "struct_size %u", p->header->struct_size);
    CHECK(!strcmp(p->built_for, "1.0"), "built for %s", p->built_for);
    CHECK(!loom_plugin_has_feature(p, LOOM_FEATURE_SETTING_RULES), "no setting rules in 1.0");
    CHECK(p->ops.comm.wait, "wait present");
    /* defaulted, not provided: the loader says which */
    CHECK(!loom_plugin_provides(p, LOOM_OPTIONAL_COMM_GROUP_START),
          "group_start is past its struct: not provided");
    /* Past its struct_size lies whatever the linker put there: never an op.
     * group_start, absent, is the core's no-op bracket. */
    CHECK(p->ops.comm.group_start && p->ops.comm.group_start(NULL) == LOOM_OK,
          "group_start beyond the struct is the core's no-op");
    CHECK(!p->ops.comm.abort, "abort beyond the struct");
    loom_plugin_unload(p);
}

static void case_newminor(void)
{
    loom_plugin *p = load_ok(LOOM_PLUGIN_COMM, "newminor");
    if (!p)
        return;
    CHECK(p->header->abi_version == LOOM_ABI_VERSION(1, LOOM_ABI_MINOR + 1), "abi %x",
          p->header->abi_version);
    CHECK(p->header->struct_size == sizeof(loom_comm_plugin_v1_t) + sizeof(void *),
          "struct_size %u", p->header->struct_size);
    CHECK(p->ops.comm.group_start, "group_start present");
    CHECK(!p->ops.comm.abort, "abort is NULL");
    loom_plugin_unload(p);
}

static void case_kinds(void)
{
    loom_plugin *p = load_ok(LOOM_PLUGIN_MEMTIER, "good");
    loom_plugin_unload(p);
    p = load_ok(LOOM_PLUGIN_STRATEGY, "good");
    loom_plugin_unload(p);
}

/* Compute backends: "compute" names the kind; one of the device tier with
 * memory of its own, one of the host tier that leaves alloc and free to
 * the core; probe and native_queue are optional, and provided says which. */
static void case_compute(void)
{
    CHECK(loom_plugin_kind_of("compute") == LOOM_PLUGIN_COMPUTE, "kind of \"compute\"");
    loom_plugin *p = load_ok(LOOM_PLUGIN_COMPUTE, "good");
    if (p) {
        CHECK(p->kind == LOOM_PLUGIN_COMPUTE && p->header->kind == LOOM_PLUGIN_COMPUTE, "kind");
        CHECK(p->ops.compute.tier == LOOM_TIER_DEVICE, "tier %u", p->ops.compute.tier);
        CHECK(p->ops.compute.mem_kind == LOOM_MEM_DEVICE, "mem_kind %u", p->ops.compute.mem_kind);
        CHECK(p->ops.compute.alloc && p->ops.compute.crossentropy_slice_sums, "ops copied");
        CHECK(loom_plugin_provides(p, LOOM_OPTIONAL_COMPUTE_PROBE), "probe provided");
        CHECK(!loom_plugin_provides(p, LOOM_OPTIONAL_COMPUTE_NATIVE_QUEUE), "no native_queue");
        char group[64];
        loom_plugin_settings_group(p, group, sizeof group);
        CHECK(!strcmp(group, "compute.good"), "settings group %s", group);
        loom_plugin_unload(p);
    }
    p = load_ok(LOOM_PLUGIN_COMPUTE, "host");
    if (p) {
        CHECK(p->ops.compute.tier == LOOM_TIER_HOST, "tier %u", p->ops.compute.tier);
        CHECK(!p->ops.compute.alloc && !p->ops.compute.free, "alloc and free left to the core");
        loom_plugin_unload(p);
    }
}

/* The actions a schedule plugin emits, as text: "r0 4/0/1 ..." */
typedef struct lists {
    char text[4096];
} lists;

static int record(void *builder, int pp_rank, loom_action a)
{
    lists *l = builder;
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, " r%d:%u/%u/%d", pp_rank, a.kind, a.virtual_stage,
             (int)a.microbatch);
    return LOOM_OK;
}

static int build_lists(const loom_plugin *p, int stages, int micro, lists *out)
{
    static loom_host host; /* the test schedules call nothing of it */
    host.struct_size = sizeof host;
    host.version = LOOM_HOST_VERSION;
    out->text[0] = '\0';
    loom_pipeline_shape shape = {.stages = stages, .virtual_stages = 1, .microbatches = micro,
                                 .builder = out, .emit = record};
    return loom_plugin_schedule_build(p, &host, &shape);
}

/* A schedule of its own kind, and the same schedule built before ABI 1.8
 * as a strategy of the pp axis (libloom-strategy-oldsched.so), found by
 * the schedule's name and adapted: the same lists, the same bubble. */
static void case_schedule(void)
{
    loom_plugin *now = load_ok(LOOM_PLUGIN_SCHEDULE, "good");
    loom_search_path sp;
    search_test_plugins(&sp);
    loom_plugin *old = NULL;
    int rc = loom_plugin_load(&sp, LOOM_PLUGIN_SCHEDULE, "oldsched", &old);
    CHECK(rc == LOOM_OK && old, "oldsched: %s", loom_last_error());
    loom_search_path_free(&sp);
    if (!now || !old)
        return;
    CHECK(now->built_as == LOOM_PLUGIN_SCHEDULE, "good is built as a schedule");
    CHECK(old->kind == LOOM_PLUGIN_SCHEDULE && old->built_as == LOOM_PLUGIN_STRATEGY,
          "oldsched: kind %d built as %d", old->kind, old->built_as);
    CHECK(old->header->kind == LOOM_PLUGIN_SCHEDULE, "the adapted header says schedule");
    CHECK(!strcmp(old->built_for, "1.7"), "oldsched built for %s", old->built_for);
    CHECK(strstr(old->path, "/libloom-strategy-oldsched.so") != NULL, "path %s", old->path);
    CHECK(loom_plugin_provides(now, LOOM_OPTIONAL_SCHEDULE_BUBBLE) &&
          loom_plugin_provides(old, LOOM_OPTIONAL_SCHEDULE_BUBBLE), "both provide the bubble");
    char where[192];
    loom_plugin_settings_group(old, where, sizeof where);
    CHECK(!strcmp(where, "parallel.pp"), "settings in %s", where);
    static const int shapes[][2] = {{2, 2}, {3, 4}, {4, 8}};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(shapes); i++) {
        lists a, b;
        int p = shapes[i][0], m = shapes[i][1];
        CHECK(build_lists(now, p, m, &a) == LOOM_OK, "good p=%d m=%d: %s", p, m,
              loom_last_error());
        CHECK(build_lists(old, p, m, &b) == LOOM_OK, "oldsched p=%d m=%d: %s", p, m,
              loom_last_error());
        CHECK(a.text[0] && !strcmp(a.text, b.text), "p=%d m=%d:\n  good    %s\n  adapted %s", p,
              m, a.text, b.text);
        char want[32];
        snprintf(want, sizeof want, " r%d:", p - 1); /* the adapter told create the pp size */
        CHECK(strstr(b.text, want) != NULL, "p=%d: no action of the last rank", p);
        const char *fa = NULL, *fb = NULL;
        double ba = now->ops.schedule.bubble(p, 1, m, &fa);
        double bb = old->ops.schedule.bubble(p, 1, m, &fb);
        CHECK(ba == bb && fa && fb && !strcmp(fa, fb), "bubble %g %g", ba, bb);
    }
    loom_plugin_unload(now);
    loom_plugin_unload(old);

    /* a strategy of another axis is no schedule: one line saying so */
    char path[PATH_MAX];
    plugin_path(path, sizeof path, LOOM_PLUGIN_STRATEGY, "good");
    loom_search_path empty = {0};
    loom_plugin *dp = NULL;
    rc = loom_plugin_load(&empty, LOOM_PLUGIN_SCHEDULE, path, &dp);
    const char *msg = loom_last_error();
    printf("schedule: %s\n", msg);
    CHECK(rc == LOOM_ERR_INVALID && !dp, "a dp strategy as a schedule: %d", rc);
    CHECK(strstr(msg, "wrong kind: it is a strategy of the dp axis (exports "
                      "loom_strategy_plugin_v1), not a pipeline schedule") && !strchr(msg, '\n'),
          "%s", msg);
    /* and a schedule is no strategy */
    plugin_path(path, sizeof path, LOOM_PLUGIN_SCHEDULE, "good");
    rc = loom_plugin_load(&empty, LOOM_PLUGIN_STRATEGY, path, &dp);
    CHECK(rc == LOOM_ERR_INVALID && strstr(loom_last_error(), "wrong kind: it is a schedule "
                                                              "plugin (exports "
                                                              "loom_schedule_plugin_v1)"),
          "%s", loom_last_error());
}

/* What a data strategy provides and what its minor promises, as recorded
 * at load: the trainer asks these, never the plugin's own struct. */
static void case_provides(void)
{
    loom_plugin *p = load_ok(LOOM_PLUGIN_STRATEGY, "good");
    if (!p)
        return;
    CHECK(!loom_plugin_provides(p, LOOM_OPTIONAL_DATA_BEFORE_FORWARD),
          "data_before_forward is the core's no-op, not the plugin's");
    CHECK(p->ops.strategy.data_before_forward, "... and the table holds the no-op");
    CHECK(!loom_plugin_provides(p, LOOM_OPTIONAL_DATA_EVAL), "no data_eval");
    CHECK(loom_plugin_has_feature(p, LOOM_FEATURE_UPDATE_RANGE), "built for 1.6 or later");
    CHECK(!strcmp(loom_optional_op_name(LOOM_OPTIONAL_DATA_GET_SHARD), "data_get_shard"),
          "%s", loom_optional_op_name(LOOM_OPTIONAL_DATA_GET_SHARD));
    CHECK(loom_plugin_check_dp_size(p, 1) == LOOM_OK, "a dp group of one");
    CHECK(loom_plugin_check_dp_size(p, 2) == LOOM_ERR_INVALID &&
              strstr(loom_last_error(), "data_grads_ready and data_finish_backward are NULL"),
          "%s", loom_last_error());
    loom_plugin_unload(p);
}

/* A name with a '/' is a file, used as it is; its file name still carries
 * the name the header must have. */
static void case_by_path(void)
{
    char path[PATH_MAX];
    plugin_path(path, sizeof path, LOOM_PLUGIN_COMM, "good");
    loom_search_path empty = {0};
    loom_plugin *p = NULL;
    int rc = loom_plugin_load(&empty, LOOM_PLUGIN_COMM, path, &p);
    CHECK(rc == LOOM_OK && p, "by path: %s", loom_last_error());
    loom_plugin_unload(p);

    plugin_path(path, sizeof path, LOOM_PLUGIN_COMM, "misnamed");
    rc = loom_plugin_load(&empty, LOOM_PLUGIN_COMM, path, &p);
    CHECK(rc == LOOM_ERR_INVALID, "misnamed by path: %d", rc);
    CHECK(strstr(loom_last_error(), "name mismatch"), "%s", loom_last_error());

    snprintf(path, sizeof path, "%s/libloom-comm-absent.so", plugin_dir);
    rc = loom_plugin_load(&empty, LOOM_PLUGIN_COMM, path, &p);
    CHECK(rc == LOOM_ERR_NOT_FOUND, "absent file: %d", rc);
    CHECK(strstr(loom_last_error(), "cannot open: No such file"), "%s", loom_last_error());
}

/* ---- the search path ---- */

static void canonical(const char *dir, char *out, size_t cap)
{
    char *r = realpath(dir, NULL);
    snprintf(out, cap, "%s", r ? r : dir);
    free(r);
}

/* LOOM_PLUGIN_PATH in order, duplicates and empty entries dropped, then the
 * folder next to libloom, then the install dir. */
static void case_search_order(void)
{
    char a[PATH_MAX], b[64], env[3 * PATH_MAX + 256];
    snprintf(a, sizeof a, "%s", plugin_dir);
    snprintf(b, sizeof b, "/nonexistent-b");
    snprintf(env, sizeof env, "%s:%s::%s/:%s", a, b, a, b);
    setenv("LOOM_PLUGIN_PATH", env, 1);
    loom_search_path sp;
    int rc = loom_search_path_init(&sp, NULL);
    CHECK(rc == LOOM_OK, "%s", loom_last_error());
    char build[PATH_MAX];
    canonical(BUILD_PLUGIN_DIR, build, sizeof build);
    const char *want[] = {a, b, build, LOOM_PLUGIN_INSTALL_DIR};
    CHECK(sp.count == 4, "count %d, want 4", sp.count);
    for (int i = 0; i < sp.count && i < 4; i++) {
        char got[PATH_MAX];
        canonical(sp.dirs[i], got, sizeof got);
        char w[PATH_MAX];
        canonical(want[i], w, sizeof w);
        CHECK(!strcmp(got, w), "dirs[%d] = %s, want %s", i, sp.dirs[i], want[i]);
    }
    loom_search_path_free(&sp);
}

/* Not found: every directory searched, in order, and what to set. */
static void case_notfound(void)
{
    setenv("LOOM_PLUGIN_PATH", "/nonexistent-a:/nonexistent-b", 1);
    loom_search_path sp;
    int rc = loom_search_path_init(&sp, NULL);
    CHECK(rc == LOOM_OK, "%s", loom_last_error());
    loom_plugin *p = NULL;
    rc = loom_plugin_load(&sp, LOOM_PLUGIN_COMM, "ucz", &p);
    const char *msg = loom_last_error();
    printf("notfound: %s\n", msg);
    CHECK(rc == LOOM_ERR_NOT_FOUND, "status %d", rc);
    char want[4 * PATH_MAX];
    snprintf(want, sizeof want,
             "plugin comm 'ucz' not found: no libloom-comm-ucz.so in /nonexistent-a, "
             "/nonexistent-b, %s, %s (set plugins.path or LOOM_PLUGIN_PATH)",
             sp.count > 2 ? sp.dirs[2] : "?", LOOM_PLUGIN_INSTALL_DIR);
    CHECK(!strcmp(msg, want), "\n  got  %s\n  want %s", msg, want);
    char build[PATH_MAX], third[PATH_MAX];
    canonical(BUILD_PLUGIN_DIR, build, sizeof build);
    canonical(sp.count > 2 ? sp.dirs[2] : "?", third, sizeof third);
    CHECK(!strcmp(build, third), "third dir %s is not the build's lib/loom %s", third, build);
    loom_search_path_free(&sp);

    /* A relative entry is taken from the current directory: say which. */
    setenv("LOOM_PLUGIN_PATH", "relative/plugins", 1);
    rc = loom_search_path_init(&sp, NULL);
    CHECK(rc == LOOM_OK, "%s", loom_last_error());
    rc = loom_plugin_load(&sp, LOOM_PLUGIN_COMM, "ucz", &p);
    msg = loom_last_error();
    printf("notfound (relative): %s\n", msg);
    char cwd[PATH_MAX], note[PATH_MAX + 128];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    snprintf(note, sizeof note,
             "; relative LOOM_PLUGIN_PATH entries are taken from the current directory %s)", cwd);
    CHECK(rc == LOOM_ERR_NOT_FOUND && strstr(msg, "no libloom-comm-ucz.so in relative/plugins, "),
          "%s", msg);
    CHECK(strstr(msg, note), "lacks '%s': %s", note, msg);
    loom_search_path_free(&sp);
}

/* plugins.path comes first, before LOOM_PLUGIN_PATH. */
static int case_config_path(void)
{
    loom_config *cfg = NULL;
    const char *text = "plugins = { path = [ \"/from-config-a\", \"/from-config-b\" ]; };\n";
    int rc = loom_config_parse(text, "test.cfg", NULL, 0, &cfg);
    if (rc == LOOM_ERR_NOT_SUPPORTED) {
        printf("config module not built yet: skipped\n");
        return SKIP;
    }
    CHECK(rc == LOOM_OK, "config: %s", loom_last_error());
    if (rc != LOOM_OK)
        return 1;
    setenv("LOOM_PLUGIN_PATH", "/from-env", 1);
    loom_search_path sp;
    rc = loom_search_path_init(&sp, cfg);
    CHECK(rc == LOOM_OK, "%s", loom_last_error());
    CHECK(sp.count >= 3, "count %d", sp.count);
    if (sp.count >= 3) {
        CHECK(!strcmp(sp.dirs[0], "/from-config-a"), "dirs[0] %s", sp.dirs[0]);
        CHECK(!strcmp(sp.dirs[1], "/from-config-b"), "dirs[1] %s", sp.dirs[1]);
        CHECK(!strcmp(sp.dirs[2], "/from-env"), "dirs[2] %s", sp.dirs[2]);
    }
    loom_search_path_free(&sp);
    loom_config_free(cfg);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_loader CASE PLUGIN_DIR\n");
        return 2;
    }
    const char *which = argv[1];
    plugin_dir = argv[2];
    int all = !strcmp(which, "all"), ran = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(refusals); i++) {
        if (all || !strcmp(which, refusals[i].name)) {
            check_refusal(&refusals[i]);
            ran++;
        }
    }
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"good", case_good},       {"oldminor", case_oldminor},
        {"newminor", case_newminor}, {"kinds", case_kinds},
        {"by-path", case_by_path}, {"search-order", case_search_order},
        {"notfound", case_notfound}, {"schedule", case_schedule},
        {"provides", case_provides}, {"compute", case_compute},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++) {
        if (all || !strcmp(which, cases[i].name)) {
            cases[i].fn();
            ran++;
        }
    }
    if (all || !strcmp(which, "config-path")) {
        int rc = case_config_path();
        if (rc == SKIP && !all)
            return SKIP;
        ran++;
    }
    if (!ran) {
        fprintf(stderr, "test_loader: no case '%s'\n", which);
        return 2;
    }
    return check_done("test_loader");
}
