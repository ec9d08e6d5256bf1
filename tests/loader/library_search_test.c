/* How the loader tells whether a library a plugin needs can be found
 * without loading it: every name `ldconfig -p` lists is in the system's
 * cache as the loader reads it (ldconfig keeps many names only as the end
 * of their paths), and a folder inside another's path is a folder of its
 * own. Exits 77 where there is no ldconfig or cache to compare with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/loader.h"
#include "check.h"

static int check_cache(void)
{
    const char *ldconfig = access("/sbin/ldconfig", X_OK) == 0 ? "/sbin/ldconfig" : "ldconfig";
    char cmd[64];
    snprintf(cmd, sizeof cmd, "%s -p 2>/dev/null", ldconfig);
    FILE *p = access("/etc/ld.so.cache", R_OK) == 0 ? popen(cmd, "r") : NULL;
    if (!p)
        return 0;
    char line[4096], name[512];
    int names = 0;
    while (fgets(line, sizeof line, p)) {
        /* "\tlibmpi.so.40 (libc6,x86-64) => /lib/x86_64-linux-gnu/libmpi.so.40" */
        if (line[0] != '\t' || sscanf(line + 1, "%511s (", name) != 1)
            continue;
        names++;
        CHECK(loom_ld_cache_names("/etc/ld.so.cache", name),
              "ldconfig -p lists %s, the loader does not find it in /etc/ld.so.cache", name);
    }
    pclose(p);
    CHECK(!loom_ld_cache_names("/etc/ld.so.cache", "libloom-nobody-has-this.so.7"),
          "a library nobody has is in the cache");
    CHECK(!loom_ld_cache_names("/nonexistent/ld.so.cache", "libc.so.6"), "a missing cache names libc");
    printf("library_search_test: %d names of ldconfig -p found in /etc/ld.so.cache\n", names);
    return names;
}

static void check_folders(void)
{
    char folders[4096] = "/lib:/usr/lib";
    loom_folder_list_add(folders, sizeof folders, "/tmp/deps/usr/lib/x86_64-linux-gnu");
    loom_folder_list_add(folders, sizeof folders, "/usr/lib/x86_64-linux-gnu");
    loom_folder_list_add(folders, sizeof folders, "/lib/x86_64-linux-gnu");
    loom_folder_list_add(folders, sizeof folders, "/usr/lib/x86_64-linux-gnu");
    loom_folder_list_add(folders, sizeof folders, "/lib");
    loom_folder_list_add(folders, sizeof folders, "/li");
    const char *want = "/lib:/usr/lib:/tmp/deps/usr/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:"
                       "/lib/x86_64-linux-gnu:/li";
    CHECK(!strcmp(folders, want), "folders %s, want %s", folders, want);
    char small[16] = "/lib";
    loom_folder_list_add(small, sizeof small, "/usr/lib/x86_64-linux-gnu");
    CHECK(!strcmp(small, "/lib"), "a folder past the list's room was added: %s", small);
}

int main(void)
{
    check_folders();
    int names = check_cache();
    if (failures)
        return 1;
    return names > 0 ? 0 : 77;
}
