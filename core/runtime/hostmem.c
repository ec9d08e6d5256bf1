/* loom runtime — The host memory this process may still take (hostmem.h). */
#include "runtime/hostmem.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/memory.h"

/* One number from a file holding it alone ("max" in cgroup v2 means no
 * limit: UINT64_MAX). 0 when the file cannot be read. */
static int read_number(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char text[64] = "";
    int got = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!got)
        return 0;
    if (!strncmp(text, "max", 3)) {
        *out = UINT64_MAX;
        return 1;
    }
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

/* A /proc/meminfo field, in bytes (the file says kB). */
static int meminfo_field(const char *proc_root, const char *name, uint64_t *out)
{
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/meminfo", proc_root);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = strlen(name);
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ':') {
            *out = (uint64_t)strtoull(line + n + 1, NULL, 10) * 1024;
            found = 1;
        }
    fclose(f);
    return found;
}

static void take_bound(loom_host_room *out, uint64_t bytes, const char *bound)
{
    if (bytes < out->bytes) {
        out->bytes = bytes;
        snprintf(out->bound, sizeof out->bound, "%s", bound);
    }
}

/* This process's cgroup path in the hierarchy that holds the memory
 * controller: v1's "N:...memory...:/path", or v2's "0::/path". */
static int cgroup_path(const char *proc_root, int v2, char *path, size_t cap)
{
    char file[512], line[4200];
    snprintf(file, sizeof file, "%s/self/cgroup", proc_root);
    FILE *f = fopen(file, "r");
    if (!f)
        return 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *controllers = c1 + 1;
        int match = 0;
        if (v2)
            match = !strncmp(line, "0", 1) && c1 == line + 1 && !controllers[0];
        else
            for (char *s = NULL, *tok = strtok_r(c1 + 1, ",", &s); tok && !match;
                 tok = strtok_r(NULL, ",", &s))
                match = !strcmp(tok, "memory");
        if (match) {
            snprintf(path, cap, "%s", c2 + 1);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* The limit less the usage at every level from dir up to the mount. */
static void walk_cgroup(loom_host_room *out, int v2, const char *mount, const char *rel)
{
    char dir[4200], file[4300], bound[512];
    snprintf(dir, sizeof dir, "%.2000s%.2000s", mount, strcmp(rel, "/") ? rel : "");
    size_t floor = strlen(mount);
    for (;;) {
        uint64_t limit, usage;
        snprintf(file, sizeof file, "%.4200s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
        int have = read_number(file, &limit);
        snprintf(file, sizeof file, "%.4200s/%s", dir,
                 v2 ? "memory.current" : "memory.usage_in_bytes");
        /* v1 says "no limit" with a page-rounded LONG_MAX */
        if (have && read_number(file, &usage) && limit < (UINT64_MAX >> 2)) {
            uint64_t left = limit > usage ? limit - usage : 0;
            char lb[32], ub[32];
            loom_mem_format(limit, lb, sizeof lb);
            loom_mem_format(usage, ub, sizeof ub);
            const char *name = dir + floor;
            snprintf(bound, sizeof bound, "the memory cgroup %s (%s): %s %s, %s in use",
                     name[0] ? name : "/", v2 ? "v2" : "v1",
                     v2 ? "memory.max" : "memory.limit_in_bytes", lb, ub);
            take_bound(out, left, bound);
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < floor)
            break;
        *slash = '\0';
    }
}

/* Each mount of a cgroup hierarchy with the memory controller. */
static void read_cgroups(const char *proc_root, const char *sys_root, loom_host_room *out)
{
    char file[512], line[8192];
    snprintf(file, sizeof file, "%s/self/mountinfo", proc_root);
    FILE *f = fopen(file, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        /* id parent dev root mountpoint options [optional...] - fstype source super */
        char *field[6] = {0}, *save = NULL, *tok = strtok_r(line, " ", &save);
        int n = 0;
        while (tok && n < 6) {
            field[n++] = tok;
            tok = strtok_r(NULL, " ", &save);
        }
        while (tok && strcmp(tok, "-"))
            tok = strtok_r(NULL, " ", &save);
        char *fstype = tok ? strtok_r(NULL, " ", &save) : NULL;
        char *source = fstype ? strtok_r(NULL, " ", &save) : NULL;
        char *super = source ? strtok_r(NULL, " ", &save) : NULL;
        if (n < 5 || !fstype)
            continue;
        int v2 = !strcmp(fstype, "cgroup2");
        if (!v2 && (strcmp(fstype, "cgroup") || !super || !strstr(super, "memory")))
            continue;
        char path[4200];
        if (!cgroup_path(proc_root, v2, path, sizeof path))
            continue;
        /* the path is relative to the hierarchy's root; the mount shows the
         * part below its own root (field 3: "/" unless a container's) */
        const char *root = field[3], *rel = path;
        size_t rn = strlen(root);
        if (strcmp(root, "/") && !strncmp(path, root, rn) && (path[rn] == '/' || !path[rn]))
            rel = path[rn] ? path + rn : "/";
        char mount[4200];
        snprintf(mount, sizeof mount, "%s%s", sys_root, field[4]);
        walk_cgroup(out, v2, mount, rel);
    }
    fclose(f);
}

void loom_host_room_read_at(const char *proc_root, const char *sys_root, loom_host_room *out)
{
    out->bytes = UINT64_MAX;
    snprintf(out->bound, sizeof out->bound, "no limit could be read");
    uint64_t avail, swap = 0;
    if (meminfo_field(proc_root, "MemAvailable", &avail)) {
        meminfo_field(proc_root, "SwapFree", &swap);
        char ab[32], sb[32], bound[128];
        loom_mem_format(avail, ab, sizeof ab);
        loom_mem_format(swap, sb, sizeof sb);
        snprintf(bound, sizeof bound, "this machine: MemAvailable %s + SwapFree %s", ab, sb);
        take_bound(out, avail + swap, bound);
    }
    read_cgroups(proc_root, sys_root, out);
}

void loom_host_room_read(loom_host_room *out) { loom_host_room_read_at("/proc", "", out); }
