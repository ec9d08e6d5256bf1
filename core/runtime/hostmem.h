/* loom runtime — How much host memory this process may still take: the
 * machine's (what the kernel could give without killing anyone) and its
 * control groups' (a container's or a Slurm job's limit), whichever is
 * smaller. The trainer compares it with the plan before it allocates, so
 * a job too big for its machine is refused with figures instead of being
 * OOM-killed in silence. */
#ifndef LOOM_RUNTIME_HOSTMEM_H
#define LOOM_RUNTIME_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

typedef struct loom_host_room {
    uint64_t bytes; /* the smallest bound found; UINT64_MAX: none could be read */
    /* that bound, as a user checks it: "MemAvailable 21.3 GiB + SwapFree 0
     * bytes" or "the memory cgroup /slurm/job_7 (v2): memory.max 2.00 GiB,
     * 10.5 MiB in use" */
    char bound[512];
} loom_host_room;

/* Reads /proc/meminfo and, for each memory cgroup of this process (v1 and
 * v2, found through /proc/self/cgroup and /proc/self/mountinfo), its limit
 * less its usage at every level up to the mount. proc_root: "/proc", or a
 * test's copy of the files it reads; sys_root prefixes the cgroup mount
 * points ("" for the real ones). */
void loom_host_room_read_at(const char *proc_root, const char *sys_root, loom_host_room *out);
void loom_host_room_read(loom_host_room *out);

#endif
