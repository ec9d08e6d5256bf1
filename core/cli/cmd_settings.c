/* `loom settings [CONFIG] [--set path=value ...]`: the values CONFIG and
 * the --set options give every setting, then every core setting (type,
 * default, help, allowed values), then each plugin's own from the search
 * path. */
#include <stdio.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/plugin_rows.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "train/train.h"

static const char *setting_type_name(loom_setting_type t)
{
    switch (t) {
    case LOOM_SETTING_INT: return "int";
    case LOOM_SETTING_FLOAT: return "float";
    case LOOM_SETTING_BOOL: return "bool";
    case LOOM_SETTING_STRING: return "string";
    }
    return "?";
}

/* A default as the listing shows it: a string's without the quotes a
 * plugin may have written around it ("\"auto\"" and "auto" both show auto),
 * so every plugin's look alike; an empty string as "". */
static const char *default_text(const loom_setting_spec *spec, char *buf, size_t cap)
{
    const char *d = spec->default_value;
    if (!d)
        return "(required)";
    size_t n = strlen(d);
    if (spec->type == LOOM_SETTING_STRING && n >= 2 && d[0] == '"' && d[n - 1] == '"')
        snprintf(buf, cap, "%.*s", (int)(n - 2), d + 1);
    else
        snprintf(buf, cap, "%s", d);
    return buf[0] ? buf : "\"\"";
}

/* Each plugin that would load from the search path, with the settings it
 * takes, read from its file (no plugin's code runs for a listing). */
static void print_plugin_settings(const row_list *rows)
{
    for (int i = 0; i < rows->count; i++) {
        const plugin_row *r = &rows->rows[i];
        loom_plugin *p = NULL;
        if (strcmp(r->status, "ok") != 0 ||
            loom_plugin_read_file(r->path, (loom_plugin_kind)loom_plugin_kind_of(r->kind), NULL,
                                  NULL, &p) != LOOM_OK)
            continue;
        char settings[160];
        loom_plugin_settings_group(p, settings, sizeof settings);
        const loom_setting_spec *spec = p->header->settings;
        const char *later = loom_config_not_implemented(settings);
        printf("\n%s %s (%s): ", r->kind, r->name, p->header->description);
        if (!spec || !spec->name)
            printf("no settings of its own\n");
        else if (later)
            printf("settings in %s = { ... } (not implemented yet: %s)\n", settings, later);
        else
            printf("settings in %s = { ... }\n", settings);
        for (; spec && spec->name; spec++) {
            char path[256];
            snprintf(path, sizeof path, "%s.%s", settings, spec->name);
            char rules[256];
            loom_config_spec_rules(spec, rules, sizeof rules);
            char shown[256];
            printf("  %-34s %-8s %-12s %s%s%s%s\n", path, setting_type_name(spec->type),
                   default_text(spec, shown, sizeof shown), spec->help ? spec->help : "",
                   rules[0] ? " (" : "", rules, rules[0] ? ")" : "");
        }
        loom_plugin_unload(p);
    }
    loom_clear_error();
}

static const char settings_usage[] =
    "usage: loom settings [CONFIG] [--set path=value ...]   (CONFIG and --set: the values a job "
    "would use and where each comes from, and CONFIG's plugins.path)\n";

/* `loom settings [CONFIG] [--set path=value ...]`: the values, then the
 * core's settings, then each plugin's. */
int loom_cmd_settings(int argc, char **argv)
{
    const char *path = NULL, *overrides[LOOM_CLI_MAX_SETS];
    int noverrides = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(settings_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--set") && i + 1 < argc && noverrides < LOOM_CLI_MAX_SETS) {
            overrides[noverrides++] = argv[++i];
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            fprintf(stderr, "loom settings: too many --set options (at most %d)\n",
                    LOOM_CLI_MAX_SETS);
            return 2;
        } else if (argv[i][0] == '-' || path) {
            fputs(settings_usage, stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    loom_config *cfg = NULL;
    loom_gpt2_shape shape;
    if ((path || noverrides) && (loom_config_load(path, overrides, noverrides, &cfg) != LOOM_OK ||
                                 loom_train_model_shape(cfg, &shape) != LOOM_OK)) {
        fprintf(stderr, "loom settings: %s\n", loom_last_error());
        loom_config_free(cfg);
        return 2;
    }
    if (cfg) {
        if (path)
            printf("values of %s%s:\n\n", path, noverrides ? " with --set" : "");
        else
            printf("values with --set:\n\n");
        loom_config_print_values(cfg, stdout);
        printf("\n");
    }
    printf("core settings (any of them: --set path=value):\n\n");
    loom_config_print_schema(stdout);
    loom_search_path sp;
    row_list rows = {0};
    int rc = loom_search_path_init(&sp, cfg);
    if (rc == LOOM_OK)
        rc = plugin_rows_list(&sp, &rows);
    if (rc == LOOM_OK)
        print_plugin_settings(&rows);
    else
        fprintf(stderr, "loom settings: %s\n", loom_last_error());
    plugin_rows_free(&rows);
    loom_search_path_free(&sp);
    loom_config_free(cfg);
    return rc == LOOM_OK ? 0 : 2;
}

