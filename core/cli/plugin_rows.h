/* loom CLI — the plugins on a search path, one row each (kind, name, ABI,
 * path, whether it loads), shared by `loom plugins` and `loom settings`. */
#ifndef LOOM_CLI_PLUGIN_ROWS_H
#define LOOM_CLI_PLUGIN_ROWS_H

#include <stddef.h>

#include "runtime/loader.h"

typedef struct plugin_row {
    char kind[32];
    char name[128];
    char abi[16];
    char *path;
    char *status; /* "ok", or "refused: why" */
    char *note;   /* NULL, or what follows the status in brackets */
} plugin_row;

/* Sorted by kind, then name. */
typedef struct row_list {
    plugin_row *rows;
    int count, cap;
} row_list;

/* Every libloom-*.so in the search path's folders, checked from its file:
 * none is loaded, so none of their code runs. */
int plugin_rows_list(const loom_search_path *sp, row_list *l);
void plugin_rows_print_search_path(const loom_search_path *sp);
void plugin_rows_print(const row_list *l);
void plugin_rows_free(row_list *l);

#endif
