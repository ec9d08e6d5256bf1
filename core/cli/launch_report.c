/* loom launch's report on a job it stops or is asked about (SIGUSR1):
 * each rank keeps its last operations per group in a table in the run's
 * flight_dir (runtime/flight.h), which stays readable whatever became of
 * the rank; from every rank's table and state one line says who holds the
 * job up, and -v or --flight FILE adds each rank's last operations. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli/launch_checks.h"
#include "cli/supervisor_run.h"
#include "runtime/flight.h"
#include "runtime/log.h"

/* /proc says the process is stopped: state T (a signal) or t (a tracer). */
static int process_stopped(pid_t pid)
{
    unsigned long long parent;
    char state = 0;
    loom_launch_proc_stat((long)pid, 4, &parent, &state);
    return state == 'T' || state == 't';
}

/* How rank r is: its end once reaped, else stopped or running. The rank
 * may be a wrapper (a shell) around the process whose table v is. */
static loom_flight_rank rank_state(const launcher *L, int r, const loom_flight_view *v)
{
    const rank_proc *p = &L->ranks[r];
    loom_flight_rank how = {.view = v, .state = LOOM_RANK_RUNNING};
    if (!p->running) {
        int killed = WIFSIGNALED(p->status);
        how.state = killed ? LOOM_RANK_KILLED : LOOM_RANK_EXITED;
        how.code = killed ? WTERMSIG(p->status) : WEXITSTATUS(p->status);
    } else if (process_stopped(p->pid) || (v && process_stopped((pid_t)v->pid))) {
        how.state = LOOM_RANK_STOPPED;
    }
    return how;
}

/* Each rank's last operations, as `loom launch -v` shows them. */
static void write_details(FILE *f, const loom_flight_rank *ranks, int n)
{
    enum { CAP = 1 << 16 };
    char *buf = malloc(CAP);
    uint64_t now = loom_now_ns();
    for (int r = 0; buf && r < n; r++) {
        loom_flight_format(ranks[r].view, r, &ranks[r], now, 8, buf, CAP);
        fputs(buf, f);
    }
    free(buf);
}

/* The diagnosis line and each rank's last operations into --flight FILE;
 * without one, the operations on stderr when -v or SIGUSR1 asks for them. */
static void show_details(const launcher *L, const char *line, const loom_flight_rank *ranks,
                         int n, int asked)
{
    if (L->flight_out) {
        FILE *f = fopen(L->flight_out, "w");
        if (f) {
            fprintf(f, "%s\n", line);
            write_details(f, ranks, n);
        }
        if (!f || fclose(f) != 0)
            fprintf(stderr, "loom launch: cannot write --flight %s: %s\n", L->flight_out,
                    strerror(errno));
        else
            fprintf(stderr, "loom launch: each rank's last operations are in %s\n",
                    L->flight_out);
    } else if (L->verbose || asked) {
        write_details(stderr, ranks, n);
    } else {
        fprintf(stderr, "loom launch: -v or --flight FILE shows each rank's last operations\n");
    }
}

void loom_launch_report(launcher *L, int asked)
{
    if (!L->flight_dir[0]) {
        if (asked)
            fprintf(stderr, "loom launch: SIGUSR1, but this job has no flight recorder\n");
        return;
    }
    if (L->world != L->n) {
        /* one node of several sees a part of the job: each rank says its own */
        if (asked)
            loom_signal_running(L, SIGUSR1);
        return;
    }
    int n = L->n, stopped = 0;
    loom_flight_view *views = calloc((size_t)n, sizeof *views);
    loom_flight_rank *ranks = calloc((size_t)n, sizeof *ranks);
    char line[4096];
    if (!views || !ranks) {
        fprintf(stderr, "loom launch: no memory to read the flight recorder\n");
        goto done;
    }
    for (int r = 0; r < n; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/rank-%d.flight", L->flight_dir, L->first_rank + r);
        int got = loom_flight_load(path, &views[r]) == LOOM_OK;
        ranks[r] = rank_state(L, r, got ? &views[r] : NULL);
        stopped |= ranks[r].state == LOOM_RANK_STOPPED;
    }
    int waits = loom_flight_diagnose(ranks, n, loom_now_ns(), line, sizeof line);
    if (!waits && !stopped && !asked)
        goto done;
    fprintf(stderr, "loom launch: %s\n", line);
    show_details(L, line, ranks, n, asked);
done:
    free(views);
    free(ranks);
}
