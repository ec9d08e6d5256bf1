/* loom launch's supervisor (supervisor.h): the job from the checks before
 * any rank starts to the removal of its TMPDIR.
 *
 * Ranks are pinned to cores by default, one core each when they fit, as
 * mpirun's --bind-to core: a rank that migrates between cores pays for it
 * in every small message (2.4-3.3 us per small allreduce unpinned against
 * 0.8-1.0 us pinned over comm-ucx here).
 *
 * What can be refused is refused before any rank starts (launch_checks.c),
 * and a failure that a restart would repeat (its exit status says so) is
 * not restarted. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/launch_checks.h"
#include "cli/supervisor.h"
#include "cli/supervisor_run.h"
#include "runtime/log.h"

/* ------------------------------------------------------ the job's TMPDIR */

#define TMPDIR_PREFIX "loom-launch-"

static unsigned long long pid_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

/* The mkdtemp template of this launcher's TMPDIR under base:
 * base/loom-launch-NS-PID-START-XXXXXX, where NS, PID and START (its pid
 * namespace, pid and start time) tell a later launcher whether this one
 * still runs. */
static void tmpdir_template(char *buf, size_t cap, const char *base)
{
    unsigned long long start;
    if (loom_launch_proc_stat((long)getpid(), 22, &start, NULL) == 0)
        snprintf(buf, cap, "%s/" TMPDIR_PREFIX "%llu-%ld-%llu-XXXXXX", base, pid_namespace(),
                 (long)getpid(), start);
    else /* without /proc no launcher could tell whether this one runs */
        snprintf(buf, cap, "%s/" TMPDIR_PREFIX "XXXXXX", base);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Remove the loom-launch-* folders under base that belong to this user and
 * to a launcher of this pid namespace that no longer runs (killed with
 * SIGKILL, or before a reboot). */
static void remove_stale_tmpdirs(const char *base)
{
    unsigned long long ns = pid_namespace(), mine;
    DIR *d = loom_launch_proc_stat((long)getpid(), 22, &mine, NULL) == 0 ? opendir(base) : NULL;
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long their_ns, start, now_start;
        long pid;
        int used = 0;
        struct stat st;
        if (strncmp(e->d_name, TMPDIR_PREFIX, strlen(TMPDIR_PREFIX)) ||
            sscanf(e->d_name + strlen(TMPDIR_PREFIX), "%llu-%ld-%llu-%n", &their_ns, &pid, &start,
                   &used) != 3 || !used)
            continue; /* not one of ours, or of a launcher that did not sign it */
        /* Another pid namespace's pids mean nothing here: a container
         * sharing this folder may be running it. */
        if (their_ns != ns || pid <= 0 || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW))
            continue;
        if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
            continue;
        char state = 0;
        if (loom_launch_proc_stat(pid, 22, &now_start, &state) == 0 && now_start == start &&
            state != 'Z')
            continue; /* that launcher still runs (a zombie is gone) */
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

/* The ranks' TMPDIR: a directory of the job's own under the caller's
 * TMPDIR, removed when the launch ends, so nothing a rank leaves there
 * (Open MPI's session directories, a rank killed mid-write) outlives the
 * job. Named so that the next launcher removes it if this one is killed
 * before it can (SIGKILL), along with any such folder left. "" when it
 * could not be made (the ranks keep the caller's). */
static void make_job_tmpdir(char *job_tmpdir, size_t cap)
{
    const char *base = getenv("TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    remove_stale_tmpdirs(base);
    tmpdir_template(job_tmpdir, cap, base);
    if (!mkdtemp(job_tmpdir))
        job_tmpdir[0] = '\0';
}

/* Open MPI's helpers (ompi-server, a singleton's orted) outlive a killed
 * rank for a moment and write their session folders here while they shut
 * down: a folder that is not empty yet is tried again for up to 2 s. */
static void remove_job_tmpdir(char *job_tmpdir)
{
    for (int attempt = 0; job_tmpdir[0] && attempt < 40; attempt++) {
        nftw(job_tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (access(job_tmpdir, F_OK) != 0)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    job_tmpdir[0] = '\0';
}

/* ------------------------------------------------------- the ranks' cpus */

/* The cpus the launcher may use (its own affinity: a cgroup, taskset or an
 * outer launcher's binding) and, by --bind, the one each rank gets: the
 * ranks of every launcher on this machine that may use these cpus take
 * them in turn (place), so two launchers on one machine do not both pin
 * their first rank to the first cpu. */
static void plan_binding(const loom_launch_options *a, const loom_launch_placement *place,
                         launch_binding *b)
{
    cpu_set_t allowed;
    b->on = 0;
    b->ncpus = 0;
    b->first = place->cpu_first;
    /* the ranks that take these cpus in turn, and how many are another launcher's */
    int sharing = place->cpu_ranks, others = place->cpu_ranks - a->n;
    int got = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
    for (int c = 0; got && c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed))
            b->cpus[b->ncpus++] = c;
    if (a->bind == LOOM_BIND_NONE) {
        snprintf(b->text, sizeof b->text, "not bound (--bind none)");
        return;
    }
    if (b->ncpus == 0) {
        snprintf(b->text, sizeof b->text, "not bound: sched_getaffinity: %s", strerror(errno));
        return;
    }
    if (a->bind == LOOM_BIND_FIT && sharing > b->ncpus) {
        char whose[128] = "";
        if (others > 0)
            snprintf(whose, sizeof whose, ", %d of them started by other launchers on this "
                     "machine", others);
        snprintf(b->text, sizeof b->text,
                 "not bound: %d ranks on %d cpu%s%s (--bind core would pin them, sharing cpus)",
                 sharing, b->ncpus, b->ncpus == 1 ? "" : "s", whose);
        return;
    }
    b->on = 1;
    enum { SHOWN = 8 };
    size_t len = (size_t)snprintf(b->text, sizeof b->text, "bound");
    int first = a->node_rank * a->n;
    for (int r = 0; r < a->n && r < SHOWN; r++)
        len += (size_t)snprintf(b->text + len, sizeof b->text - len, "%s rank %d to cpu %d",
                                r ? "," : "", first + r, b->cpus[(b->first + r) % b->ncpus]);
    /* at most 8 of ~30 characters above: room for the rest */
    if (a->n > SHOWN)
        len += (size_t)snprintf(b->text + len, sizeof b->text - len, ", ... (%d ranks, one cpu "
                                "each in turn)", a->n);
    if (sharing > b->ncpus && others > 0)
        snprintf(b->text + len, sizeof b->text - len, " (%d ranks, %d of them other launchers' "
                 "on this machine, share %d cpu%s)", sharing, others, b->ncpus,
                 b->ncpus == 1 ? "" : "s");
    else if (sharing > b->ncpus)
        snprintf(b->text + len, sizeof b->text - len, " (%d ranks share %d cpu%s)", sharing,
                 b->ncpus, b->ncpus == 1 ? "" : "s");
}

/* ------------------------------------------------------------ restarts */

/* What an exit status says when a restart cannot help, NULL otherwise. */
static const char *failure_that_repeats(int status)
{
    switch (status) {
    case 2: return "a command line it cannot use";
    case LOOM_EXIT_CONFIG: return "a configuration error";
    case 126: return "a command that cannot be executed";
    case 127: return "a command that was not found";
    default: return NULL;
    }
}

/* Every rank, and again as --max-restarts allows: the last run's status. */
static int run_with_restarts(const loom_launch_options *a, const loom_launch_placement *place,
                             const char *job_tmpdir)
{
    static launch_binding bind; /* CPU_SETSIZE cpus: not on the stack */
    plan_binding(a, place, &bind);
    if (a->verbose)
        fprintf(stderr, "loom launch: %s\n", bind.text);
    /* the --timeout covers the whole job, restarts included */
    uint64_t end_deadline = a->timeout_s > 0 ? loom_now_ns() + (uint64_t)(a->timeout_s * 1e9) : 0;
    for (int restart = 0;; restart++) {
        int stop = 0, rank;
        int rc = loom_run_ranks(a, &bind, place, job_tmpdir, restart, end_deadline, &stop,
                                &rank);
        if (rc == 0 || stop || restart == a->max_restarts)
            return rc;
        const char *repeats = failure_that_repeats(rc);
        if (repeats && rank >= 0) {
            fprintf(stderr, "loom launch: not restarting: rank %d exited with status %d (%s, "
                            "which a restart would repeat)\n", rank, rc, repeats);
            return rc;
        }
        /* as torchrun: every rank again, the job resuming from its latest
         * complete checkpoint (loom train does, seeing LOOM_RESTART) */
        fprintf(stderr, "loom launch: restart %d of %d: every rank again (the last run ended with "
                        "status %d)\n", restart + 1, a->max_restarts, rc);
    }
}

int loom_supervise(const loom_launch_options *opts)
{
    int rc;
    if ((opts->flight_out && (rc = loom_launch_check_flight(opts->flight_out))) ||
        (rc = loom_launch_check_limits(opts->n)))
        return rc;
    /* alone on its machine unless the nodes' launchers find otherwise */
    loom_launch_placement place = {.cpu_first = 0, .cpu_ranks = opts->n, .local_first = 0,
                                   .local_ranks = opts->n};
    if (opts->nnodes > 1 &&
        (rc = loom_launch_nodes_agree(opts->master, opts->master_port, opts->nnodes,
                                      opts->node_rank, opts->n, opts->cmd, opts->timeout_s,
                                      &place)))
        return rc;
    char job_tmpdir[4096];
    make_job_tmpdir(job_tmpdir, sizeof job_tmpdir);
    rc = run_with_restarts(opts, &place, job_tmpdir);
    remove_job_tmpdir(job_tmpdir);
    return rc;
}
