/* loom_host_room_read_at on fabricated /proc and cgroup trees: the machine's
 * MemAvailable + SwapFree; a cgroup v1 memory hierarchy and a v2 one, each
 * bounding at the tightest level up to its mount; a container's mount whose
 * root is a cgroup below the hierarchy's root; "max" and v1's page-rounded
 * LONG_MAX as no limit. Then the real machine, printed. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/hostmem.h"

static int failures;
static char root[256];

static void put(const char *rel, const char *fmt, ...)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++) /* mkdir -p of the folders */
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static void expect(const char *what, uint64_t want, const char *bound_has)
{
    char proc[300], sys[300];
    snprintf(proc, sizeof proc, "%s/proc", root);
    snprintf(sys, sizeof sys, "%s/sys", root);
    loom_host_room room;
    loom_host_room_read_at(proc, sys, &room);
    int ok = room.bytes == want && strstr(room.bound, bound_has);
    printf("%s %s: %llu bytes (%s)\n", ok ? "ok  " : "FAIL", what, (unsigned long long)room.bytes,
           room.bound);
    if (!ok) {
        printf("     want %llu bytes and a bound naming '%s'\n", (unsigned long long)want,
               bound_has);
        failures++;
    }
}

#define GIB (1024ull * 1024 * 1024)

int main(void)
{
    snprintf(root, sizeof root, "%s/loom-room-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    put("proc/meminfo", "MemTotal:       32000000 kB\nMemAvailable:    8388608 kB\n"
                        "SwapFree:        1048576 kB\n");
    put("proc/self/cgroup", "0::/\n");
    put("proc/self/mountinfo", "22 1 0:20 / /proc rw - proc proc rw\n");
    expect("no cgroup: the machine", 9 * GIB, "MemAvailable 8.00 GiB + SwapFree 1.00 GiB");

    /* v1: memory at /sys/fs/cgroup/memory, this process in /job/step; the
     * job's level is the tighter one */
    put("proc/self/cgroup", "5:cpu,cpuacct:/job/step\n4:memory:/job/step\n0::/\n");
    put("proc/self/mountinfo",
        "22 1 0:20 / /proc rw - proc proc rw\n"
        "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n");
    put("sys/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("sys/sys/fs/cgroup/memory/memory.usage_in_bytes", "5000000000\n");
    put("sys/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "%llu\n", 2 * GIB);
    put("sys/sys/fs/cgroup/memory/job/memory.usage_in_bytes", "%llu\n", GIB / 2);
    put("sys/sys/fs/cgroup/memory/job/step/memory.limit_in_bytes", "%llu\n", 4 * GIB);
    put("sys/sys/fs/cgroup/memory/job/step/memory.usage_in_bytes", "%llu\n", GIB / 4);
    expect("cgroup v1, the parent tighter", 2 * GIB - GIB / 2,
           "the memory cgroup /job (v1): memory.limit_in_bytes 2.00 GiB, 512.0 MiB in use");

    /* v2 beside it (a hybrid machine): its own limit, tighter still */
    put("proc/self/cgroup", "4:memory:/job/step\n0::/user/app\n");
    put("proc/self/mountinfo",
        "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n");
    put("sys/sys/fs/cgroup/unified/user/memory.max", "max\n");
    put("sys/sys/fs/cgroup/unified/user/memory.current", "100\n");
    put("sys/sys/fs/cgroup/unified/user/app/memory.max", "%llu\n", GIB);
    put("sys/sys/fs/cgroup/unified/user/app/memory.current", "%llu\n", GIB / 4);
    expect("cgroup v2 beside v1", GIB - GIB / 4,
           "the memory cgroup /user/app (v2): memory.max 1.00 GiB, 256.0 MiB in use");

    /* a container: v2 mounted with its root at /ctr/7, this process at
     * /ctr/7/inner; the levels above the mount are not visible */
    put("proc/self/cgroup", "0::/ctr/7/inner\n");
    put("proc/self/mountinfo", "40 30 0:29 /ctr/7 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/sys/fs/cgroup/memory.max", "%llu\n", 3 * GIB);
    put("sys/sys/fs/cgroup/memory.current", "0\n");
    put("sys/sys/fs/cgroup/inner/memory.max", "max\n");
    put("sys/sys/fs/cgroup/inner/memory.current", "7\n");
    expect("a container's cgroup v2 mount", 3 * GIB,
           "the memory cgroup / (v2): memory.max 3.00 GiB");

    /* usage above the limit (the kernel reclaims): no room, not a wrap */
    put("sys/sys/fs/cgroup/memory.current", "%llu\n", 4 * GIB);
    expect("usage over the limit", 0, "memory.max 3.00 GiB, 4.00 GiB in use");

    loom_host_room real;
    loom_host_room_read(&real);
    printf("note this machine: %llu bytes (%s)\n", (unsigned long long)real.bytes, real.bound);
    if (real.bytes == 0 || real.bytes == UINT64_MAX) {
        printf("FAIL the real machine's room\n");
        failures++;
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        printf("note could not remove %s\n", root);
    return failures ? 1 : 0;
}
