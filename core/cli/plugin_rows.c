/* The plugins on a search path, one row each (cli/plugin_rows.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "cli/plugin_rows.h"
#include "runtime/log.h"

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static plugin_row *add_row(row_list *l)
{
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        plugin_row *rows = realloc(l->rows, (size_t)cap * sizeof *rows);
        if (!rows)
            return NULL;
        l->rows = rows;
        l->cap = cap;
    }
    plugin_row *r = &l->rows[l->count++];
    memset(r, 0, sizeof *r);
    return r;
}

/* Check one file the way the core would, reading it without running any of
 * its code, and keep what happened. */
static int list_file(row_list *l, const char *dir, const char *file)
{
    plugin_row *r = add_row(l);
    if (!r)
        return loom_fail(LOOM_ERR_NO_MEMORY, "loom plugins: out of memory");
    loom_plugin_parse_file_name(file, r->kind, sizeof r->kind, r->name, sizeof r->name);
    size_t plen = strlen(dir) + strlen(file) + 2;
    r->path = malloc(plen);
    if (!r->path)
        return loom_fail(LOOM_ERR_NO_MEMORY, "loom plugins: out of memory");
    snprintf(r->path, plen, "%s/%s", dir, file);
    snprintf(r->abi, sizeof r->abi, "-");

    char status[1024];
    uint32_t kind = loom_plugin_kind_of(r->kind);
    if (!kind) {
        snprintf(status, sizeof status, "refused: unknown kind '%s' (loom knows comm, strategy, "
                 "schedule, memtier and compute)", r->kind);
    } else {
        loom_plugin_checks checks = {0};
        loom_plugin *p = NULL;
        if (loom_plugin_read_file(r->path, (loom_plugin_kind)kind, NULL, &checks, &p) == LOOM_OK) {
            snprintf(r->abi, sizeof r->abi, "%s", p->built_for);
            snprintf(status, sizeof status, "ok");
            /* where a backend's memory is, and what it is */
            if (p->kind == LOOM_PLUGIN_COMPUTE) {
                char note[1200];
                snprintf(note, sizeof note, "%s tier: %s",
                         loom_tier_name((loom_tier)p->ops.compute.tier), p->header->description);
                r->note = strdup(note); /* out of memory: the row without it */
            }
            /* a pipeline schedule built before schedules had a kind */
            if (p->kind == LOOM_PLUGIN_STRATEGY && p->ops.strategy.axis == LOOM_AXIS_PP) {
                snprintf(r->kind, sizeof r->kind, "%s",
                         loom_plugin_kind_name(LOOM_PLUGIN_SCHEDULE));
                snprintf(status, sizeof status, "ok (strategy-kind schedule, adapted)");
            }
            loom_plugin_unload(p);
        } else {
            loom_plugin_abi_text(checks.abi_version, r->abi, sizeof r->abi);
            snprintf(status, sizeof status, "refused: %s", checks.reason);
        }
        loom_clear_error();
        /* The loader takes the first file of a name; later ones never load. */
        for (int i = 0; i < l->count - 1; i++) {
            if (!strcmp(l->rows[i].kind, r->kind) && !strcmp(l->rows[i].name, r->name)) {
                size_t used = strlen(status);
                snprintf(status + used, sizeof status - used, " (shadowed by %s)",
                         l->rows[i].path);
                break;
            }
        }
    }
    r->status = strdup(status);
    return r->status ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "loom plugins: out of memory");
}

static int list_dir(row_list *l, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return LOOM_OK;
    char **files = NULL;
    int n = 0, cap = 0, rc = LOOM_OK;
    for (struct dirent *e; (e = readdir(d));) {
        char kind[32], name[128];
        if (!loom_plugin_parse_file_name(e->d_name, kind, sizeof kind, name, sizeof name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **more = realloc(files, (size_t)cap * sizeof *more);
            if (!more) {
                rc = loom_fail(LOOM_ERR_NO_MEMORY, "loom plugins: out of memory");
                break;
            }
            files = more;
        }
        if (!(files[n] = strdup(e->d_name))) {
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "loom plugins: out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (files)
        qsort(files, (size_t)n, sizeof *files, cmp_names);
    for (int i = 0; i < n; i++) {
        if (rc == LOOM_OK)
            rc = list_file(l, dir, files[i]);
        free(files[i]);
    }
    free(files);
    return rc;
}

void plugin_rows_print(const row_list *l)
{
    int wk = 4, wn = 4, wa = 3, wp = 4;
    for (int i = 0; i < l->count; i++) {
        const plugin_row *r = &l->rows[i];
        if ((int)strlen(r->kind) > wk) wk = (int)strlen(r->kind);
        if ((int)strlen(r->name) > wn) wn = (int)strlen(r->name);
        if ((int)strlen(r->abi) > wa) wa = (int)strlen(r->abi);
        if ((int)strlen(r->path) > wp) wp = (int)strlen(r->path);
    }
    printf("%-*s  %-*s  %-*s  %-*s  %s\n", wk, "kind", wn, "name", wa, "abi", wp, "path",
           "status");
    for (int i = 0; i < l->count; i++) {
        const plugin_row *r = &l->rows[i];
        printf("%-*s  %-*s  %-*s  %-*s  %s%s%s%s\n", wk, r->kind, wn, r->name, wa, r->abi, wp,
               r->path, r->status, r->note ? " (" : "", r->note ? r->note : "",
               r->note ? ")" : "");
    }
}

void plugin_rows_free(row_list *l)
{
    for (int i = 0; i < l->count; i++) {
        free(l->rows[i].path);
        free(l->rows[i].status);
        free(l->rows[i].note);
    }
    free(l->rows);
}

int plugin_rows_list(const loom_search_path *sp, row_list *l)
{
    int rc = LOOM_OK;
    for (int i = 0; i < sp->count && rc == LOOM_OK; i++)
        rc = list_dir(l, sp->dirs[i]);
    return rc;
}

void plugin_rows_print_search_path(const loom_search_path *sp)
{
    printf("search path (first match wins):\n");
    for (int i = 0; i < sp->count; i++) {
        struct stat st;
        int exists = stat(sp->dirs[i], &st) == 0 && S_ISDIR(st.st_mode);
        printf("  %s%s%s\n", sp->dirs[i],
               sp->dirs[i][0] == '/' ? "" : "  (relative to the current directory)",
               exists ? "" : "  (no such directory)");
    }
    printf("\n");
}

