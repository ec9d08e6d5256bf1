/* `loom plan --calibrate`: this machine measured into a cluster file.
 *
 * Each figure is measured the way loom uses it: the GEMM rate with
 * the matrix products on one thread (a rank runs train.threads = 1 here),
 * the memory roof with one thread's memcpy, and the links with `loom bench`
 * itself, run through `loom launch` as a job would be, its rows fitted to
 * seconds = latency + bytes / bandwidth per op and rank count.
 *
 * With a compute backend (--device NAME: "cuda", "sim") the ranks compute
 * there, so the compute figures come from it: the backend is opened as
 * `loom train` opens it (the reference config's compute.<name> settings
 * apply), its memory is the device's (cuda: cudaMemGetInfo's total through
 * the core's CUDA runtime; sim: its arena, compute.sim.size_gib), its own
 * products give the peaks and its own copies the roof, and the reference
 * run trains on it. The collectives stay the host's (ucx, mpi): one GPU
 * gives no two ranks a GPU each, and ranks sharing the GPU talk through
 * host memory with those backends. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/plan_calibrate.h"
#include "loom/status.h"
#include "model/compute.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "runtime/config.h"
#include "runtime/cpu.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#ifdef LOOM_HAVE_CUDA
#include "runtime/device.h"
#endif

/* ---- notes ---- */

static void set_note(loom_plan_calibration *cal, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_note(loom_plan_calibration *cal, const char *field, const char *fmt, ...)
{
    int i = 0;
    while (i < cal->nnotes && strcmp(cal->note_field[i], field))
        i++;
    if (i == LOOM_PLAN_CALIBRATION_NOTES)
        return;
    if (i == cal->nnotes)
        cal->nnotes++;
    snprintf(cal->note_field[i], sizeof cal->note_field[i], "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cal->note_text[i], sizeof cal->note_text[i], fmt, ap);
    va_end(ap);
}

/* Measured figures keep 4 significant digits: run to run they move more
 * than that. */
static double round4(double x)
{
    char text[32];
    snprintf(text, sizeof text, "%.4g", x);
    return strtod(text, NULL);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double seconds_since(uint64_t t0) { return (double)(loom_now_ns() - t0) / 1e9; }

/* ---- compute and memory ---- */

/* A linear layer of the models loom trains here (2048 tokens of C = 256
 * into an MLP of 1024) as training runs it: forward, backward to the
 * input, backward to the weight, through loom_matmul_* on the library
 * model.gemm = "auto" picks, multiplied as a run of dtype multiplies (a
 * bf16 run's weights in bf16, as it stores them). */
enum { GEMM_N = 2048, GEMM_C = 256, GEMM_OC = 1024, GEMM_ROUNDS = 5 };

static int measure_products(loom_dtype dtype, double *flops_per_s)
{
    int rc = loom_gemm_select(LOOM_GEMM_AUTO, dtype);
    if (rc != LOOM_OK)
        return rc;
    float *x = calloc((size_t)GEMM_N * GEMM_C, sizeof(float));
    float *w = calloc((size_t)GEMM_OC * GEMM_C, sizeof(float));
    uint16_t *w16 = calloc((size_t)GEMM_OC * GEMM_C, sizeof(uint16_t));
    float *y = calloc((size_t)GEMM_N * GEMM_OC, sizeof(float));
    float *dx = calloc((size_t)GEMM_N * GEMM_C, sizeof(float));
    float *dw = calloc((size_t)GEMM_OC * GEMM_C, sizeof(float));
    if (!x || !w || !w16 || !y || !dx || !dw) {
        free(x), free(w), free(w16), free(y), free(dx), free(dw);
        return loom_fail(LOOM_ERR_NO_MEMORY, "calibrate: out of memory for the products' buffers");
    }
    for (size_t i = 0; i < (size_t)GEMM_N * GEMM_C; i++)
        x[i] = (float)(i % 7) * 0.125f;
    for (size_t i = 0; i < (size_t)GEMM_OC * GEMM_C; i++)
        w[i] = (float)(i % 5) * 0.0625f;
    loom_convert(w16, LOOM_BF16, w, LOOM_F32, (size_t)GEMM_OC * GEMM_C);
    loom_weight weight = loom_gemm_multiply_dtype() == LOOM_BF16
                             ? (loom_weight){w16, LOOM_BF16}
                             : loom_weight_f32(w);
    loom_kernels_set_threads(1);
    double rates[GEMM_ROUNDS];
    for (int r = -1; r < GEMM_ROUNDS; r++) { /* round -1: first touch, untimed */
        uint64_t t0 = loom_now_ns();
        loom_matmul_forward(y, x, weight, NULL, GEMM_N, GEMM_C, GEMM_OC);
        loom_matmul_backward_input(dx, y, weight, GEMM_N, GEMM_C, GEMM_OC);
        loom_matmul_backward_weight(dw, NULL, y, x, GEMM_N, GEMM_C, GEMM_OC);
        double s = seconds_since(t0);
        if (r >= 0)
            rates[r] = 3.0 * 2.0 * GEMM_N * GEMM_C * GEMM_OC / s;
    }
    *flops_per_s = median(rates, GEMM_ROUNDS);
    int ok = isfinite(dw[1]); /* the products are used, so none is skipped */
    free(x), free(w), free(w16), free(y), free(dx), free(dw);
    if ((rc = loom_gemm_take_error()) != LOOM_OK)
        return rc;
    return ok ? LOOM_OK
              : loom_fail(LOOM_ERR_INTERNAL, "calibrate: a product gave a non-finite value");
}

/* scripts/memcpy_bw.c's measure: 64 MiB, far past the caches, pages
 * touched first, median of 11. Returns bytes copied a second. */
enum { MEMCPY_BYTES = 64 << 20, MEMCPY_RUNS = 11 };

static int measure_memcpy(double *copied_per_s)
{
    char *src = malloc(MEMCPY_BYTES), *dst = malloc(MEMCPY_BYTES);
    if (!src || !dst) {
        free(src), free(dst);
        return loom_fail(LOOM_ERR_NO_MEMORY, "calibrate: out of memory for the memcpy buffers");
    }
    memset(src, 1, MEMCPY_BYTES);
    memset(dst, 2, MEMCPY_BYTES);
    double rates[MEMCPY_RUNS];
    for (int i = 0; i < MEMCPY_RUNS; i++) {
        uint64_t t0 = loom_now_ns();
        memcpy(dst, src, MEMCPY_BYTES);
        rates[i] = MEMCPY_BYTES / seconds_since(t0);
        src[i] = dst[(size_t)i * 4099]; /* keep the copies observable */
    }
    *copied_per_s = median(rates, MEMCPY_RUNS);
    free(src);
    free(dst);
    return LOOM_OK;
}

/* ---- running loom ---- */

/* The last non-empty line of a file, for a failure's detail. */
static void last_line(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "(no output)");
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\r\n");
        if (n) {
            n = n < cap - 1 ? n : cap - 1;
            memcpy(buf, line, n);
            buf[n] = '\0';
        }
    }
    fclose(f);
}

/* Run argv (argv[0] a path) with its output in log; LOOM_OK when it
 * exits 0. */
static int run(char *const argv[], const char *log, const char *what)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return loom_fail(LOOM_ERR_INTERNAL, "calibrate: cannot start %s: %s", what,
                         strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return loom_fail(LOOM_ERR_INTERNAL, "calibrate: waiting for %s: %s", what,
                             strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return LOOM_OK;
    char last[512];
    last_line(log, last, sizeof last);
    if (WIFEXITED(status))
        return loom_fail(LOOM_ERR_INTERNAL, "calibrate: %s exited with %d: %s (all of its "
                         "output: %s)", what, WEXITSTATUS(status), last, log);
    return loom_fail(LOOM_ERR_INTERNAL, "calibrate: %s was killed by signal %d (its output: %s)",
                     what, WTERMSIG(status), log);
}

/* ---- collectives ---- */

/* bench's op names and the comm ops whose fits each gives: a sendrecv
 * row times a send and a recv posted together, each of the row's size,
 * which is what the send and recv counters each count. */
static const struct {
    const char *bench;
    loom_comm_op ops[2];
    int nops;
} bench_ops[] = {
    {"allreduce", {LOOM_OP_ALLREDUCE}, 1},
    {"broadcast", {LOOM_OP_BROADCAST}, 1},
    {"reduce", {LOOM_OP_REDUCE}, 1},
    {"allgather", {LOOM_OP_ALLGATHER}, 1},
    {"reducescatter", {LOOM_OP_REDUCESCATTER}, 1},
    {"alltoall", {LOOM_OP_ALLTOALL}, 1},
    {"sendrecv", {LOOM_OP_SEND, LOOM_OP_RECV}, 2},
};
/* Sizes from 4 KiB, past the caches to 16 MiB (a gradient allreduce of
 * the models trained here reaches 13 MB); each rank count benched
 * REPEATS times, each size's median of them fitted: on a shared machine
 * one run's row may catch another job's moment. */
enum { BENCH_OPS = 7, MAX_SIZES = 16, MIN_BYTES = 4096, MAX_BYTES = 16 << 20, REPEATS = 3 };

typedef struct bench_rows {
    int n[BENCH_OPS]; /* sizes of each op */
    double bytes[BENCH_OPS][MAX_SIZES];
    double seconds[BENCH_OPS][MAX_SIZES][REPEATS];
    int runs[BENCH_OPS][MAX_SIZES];
} bench_rows;

/* A number after "key": in one JSON row of loom bench. */
static int json_number(const char *row, const char *key, double *out)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *at = strstr(row, pattern);
    if (!at)
        return -1;
    char *end;
    *out = strtod(at + strlen(pattern), &end);
    return end == at + strlen(pattern) ? -1 : 0;
}

static int json_string(const char *row, const char *key, char *buf, size_t cap)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": \"", key);
    const char *at = strstr(row, pattern);
    if (!at)
        return -1;
    at += strlen(pattern);
    size_t n = strcspn(at, "\"");
    if (n >= cap)
        return -1;
    memcpy(buf, at, n);
    buf[n] = '\0';
    return 0;
}

/* loom bench --json's rows (one object a line): each op's (size, time)
 * added to rows. LOOM_ERR_NOT_FOUND when there is none. */
static int read_bench_json(const char *path, int ranks, bench_rows *rows)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return LOOM_ERR_NOT_FOUND;
    char line[1024];
    int count = 0;
    while (fgets(line, sizeof line, f)) {
        char op[32];
        double size, time_us, n, wrong;
        if (json_string(line, "op", op, sizeof op) || json_number(line, "size", &size) ||
            json_number(line, "time_us", &time_us) || json_number(line, "ranks", &n) ||
            json_number(line, "wrong", &wrong))
            continue;
        if (wrong != 0 || (int)n != ranks) {
            fclose(f);
            return loom_fail(LOOM_ERR_INTERNAL, "calibrate: %s: loom bench's %s of %.0f bytes "
                             "on %.0f ranks %s; fix the backend before timing it", path, op,
                             size, n, wrong ? "gave wrong results" : "ran on the wrong ranks");
        }
        for (int k = 0; k < BENCH_OPS; k++) {
            if (strcmp(op, bench_ops[k].bench) || !(time_us > 0))
                continue;
            int i = 0;
            while (i < rows->n[k] && rows->bytes[k][i] != size)
                i++;
            if (i == MAX_SIZES || (i < rows->n[k] && rows->runs[k][i] == REPEATS))
                continue;
            if (i == rows->n[k]) {
                rows->bytes[k][i] = size;
                rows->n[k]++;
            }
            rows->seconds[k][i][rows->runs[k][i]++] = time_us * 1e-6;
            count++;
        }
    }
    fclose(f);
    return count ? LOOM_OK : LOOM_ERR_NOT_FOUND;
}

/* seconds = latency + bytes / bandwidth by least squares of the relative
 * error, Σ ((latency + b·bytes - t) / t)²: weights 1/t² keep the 4 KiB
 * rows, microseconds each, from counting for nothing next to the 4 MiB
 * ones. A negative latency (noise at the small sizes) is refitted as 0.
 * worst: the largest |fit - t| / t of the rows. */
static int fit_rows(const double *bytes, const double *seconds, int n, double *latency,
                    double *bandwidth, double *worst)
{
    double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
    for (int i = 0; i < n; i++) {
        double w = 1.0 / (seconds[i] * seconds[i]);
        s += w;
        sx += w * bytes[i];
        sxx += w * bytes[i] * bytes[i];
        st += w * seconds[i];
        sxt += w * bytes[i] * seconds[i];
    }
    double det = s * sxx - sx * sx;
    if (n < 2 || det <= 0)
        return -1;
    double a = (sxx * st - sx * sxt) / det, b = (s * sxt - sx * st) / det;
    if (a < 0) {
        a = 0;
        b = sxt / sxx;
    }
    if (!(b > 0))
        return -1;
    *latency = a;
    *bandwidth = 1.0 / b;
    *worst = 0;
    for (int i = 0; i < n; i++)
        *worst = fmax(*worst, fabs(a + b * bytes[i] - seconds[i]) / seconds[i]);
    return 0;
}

typedef struct scratch {
    char dir[64];
    char path[40][128];
    int npaths;
} scratch;

static const char *scratch_file(scratch *s, const char *name)
{
    if (s->npaths == (int)LOOM_ARRAY_LEN(s->path))
        return "/dev/null";
    char full[sizeof s->path[0]];
    snprintf(full, sizeof full, "%s/%s", s->dir, name);
    memcpy(s->path[s->npaths], full, sizeof full);
    return s->path[s->npaths++];
}

static void scratch_remove(scratch *s)
{
    for (int i = 0; i < s->npaths; i++)
        unlink(s->path[i]);
    if (s->dir[0])
        rmdir(s->dir);
}

static int make_scratch(scratch *s)
{
    memset(s, 0, sizeof *s);
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/loom-calibrate-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(s->dir)) {
        int e = errno;
        s->dir[0] = '\0';
        return loom_fail(LOOM_ERR_INTERNAL, "calibrate: cannot make a scratch directory: %s",
                         strerror(e));
    }
    return LOOM_OK;
}

/* One `loom launch -n R -- loom bench` of every op over the backend comm;
 * LOOM_ERR_NOT_FOUND when the backend gave no row (not built, or it
 * would not start). */
static int bench_at(const char *loom_exe, scratch *s, const char *comm, int ranks,
                    bench_rows *rows)
{
    char name[64];
    snprintf(name, sizeof name, "bench-%s.cfg", comm);
    const char *cfg = scratch_file(s, name);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return loom_fail(LOOM_ERR_INTERNAL, "calibrate: cannot write %s: %s", cfg,
                         strerror(errno));
    fprintf(f, "comm = { timeout_s = 120.0; };\n"
               "bench = { comms = [ \"%s\" ];\n"
               "          ops = [ \"allreduce\", \"broadcast\", \"reduce\", \"allgather\",\n"
               "                  \"reducescatter\", \"alltoall\", \"sendrecv\" ];\n"
               "          min_bytes = %d; max_bytes = %d; iters = 50; warmup = 10; };\n",
            comm, MIN_BYTES, MAX_BYTES);
    fclose(f);
    memset(rows, 0, sizeof *rows);
    for (int rep = 0; rep < REPEATS; rep++) {
        snprintf(name, sizeof name, "bench-%s-%d-%d.json", comm, ranks, rep);
        const char *json = scratch_file(s, name);
        snprintf(name, sizeof name, "bench-%s-%d-%d.log", comm, ranks, rep);
        const char *log = scratch_file(s, name);
        char n[16];
        snprintf(n, sizeof n, "%d", ranks);
        char *argv[] = {(char *)loom_exe, "launch", "-n", n, "--timeout", "900", "--",
                        (char *)loom_exe, "bench", (char *)cfg, "--json", (char *)json, NULL};
        char what[96];
        snprintf(what, sizeof what, "loom bench of comm %s on %d ranks", comm, ranks);
        unlink(json);
        int rc = run(argv, log, what);
        int got = read_bench_json(json, ranks, rows);
        if (got == LOOM_ERR_NOT_FOUND && rep == 0)
            return LOOM_ERR_NOT_FOUND; /* unavailable: bench says so and times nothing */
        if (rc || got)
            return rc ? rc : got == LOOM_ERR_NOT_FOUND ? loom_fail(LOOM_ERR_INTERNAL,
                             "calibrate: %s gave no rows this time (%s)", what, log) : got;
    }
    return LOOM_OK;
}

/* Fit every op of rows into the cluster's measured table at `ranks`. */
static int fit_all(loom_plan_calibration *cal, const bench_rows *rows, int ranks,
                   double worst[BENCH_OPS])
{
    loom_plan_cluster *c = &cal->cluster;
    for (int k = 0; k < BENCH_OPS; k++) {
        double latency, bandwidth, seconds[MAX_SIZES];
        for (int i = 0; i < rows->n[k]; i++) {
            double runs[REPEATS];
            memcpy(runs, rows->seconds[k][i], sizeof runs);
            seconds[i] = median(runs, rows->runs[k][i]);
        }
        if (fit_rows(rows->bytes[k], seconds, rows->n[k], &latency, &bandwidth, &worst[k]))
            return loom_fail(LOOM_ERR_INTERNAL, "calibrate: loom bench's %s on %d ranks (%d "
                             "sizes) does not fit latency + bytes / bandwidth: its times do not "
                             "grow with the size; re-run on a quieter machine",
                             bench_ops[k].bench, ranks, rows->n[k]);
        for (int j = 0; j < bench_ops[k].nops; j++) {
            loom_comm_op op = bench_ops[k].ops[j];
            if (c->nmeasured[op] < LOOM_PLAN_MEASURED_MAX)
                c->measured[op][c->nmeasured[op]++] =
                    (loom_plan_measured){ranks, round4(latency), round4(bandwidth)};
        }
    }
    return LOOM_OK;
}

static void cpu_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "this machine");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            char *v = strchr(line, ':') + 1;
            v += strspn(v, " \t");
            v[strcspn(v, "\r\n")] = '\0';
            snprintf(buf, cap, "%s", v);
            break;
        }
    fclose(f);
}

static void say(FILE *progress, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(FILE *progress, const char *fmt, ...)
{
    if (!progress)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(progress, fmt, ap);
    va_end(ap);
    fflush(progress);
}

static int calibrate_links(const char *loom_exe, int max_ranks, FILE *progress,
                           loom_plan_calibration *cal, scratch *s)
{
    static const char *const comms[] = {"ucx", "mpi"};
    static const int rank_counts[] = {2, 4};
    loom_plan_cluster *c = &cal->cluster;
    char worst_text[BENCH_OPS][256] = {{0}};
    int rc = LOOM_OK;
    for (size_t r = 0; r < LOOM_ARRAY_LEN(rank_counts) && rank_counts[r] <= max_ranks; r++) {
        int ranks = rank_counts[r];
        bench_rows rows;
        rc = LOOM_ERR_NOT_FOUND;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(comms) && rc == LOOM_ERR_NOT_FOUND; k++) {
            if (cal->comm[0] && strcmp(cal->comm, comms[k]))
                continue; /* every rank count on the backend the first one found */
            say(progress, "calibrate: loom bench, comm %s, %d ranks, 4 KiB to 16 MiB, %d runs ...\n",
                comms[k], ranks, REPEATS);
            rc = bench_at(loom_exe, s, comms[k], ranks, &rows);
            if (rc == LOOM_OK)
                snprintf(cal->comm, sizeof cal->comm, "%s", comms[k]);
            else if (rc == LOOM_ERR_NOT_FOUND)
                say(progress, "calibrate: comm %s gave no rows here\n", comms[k]);
        }
        if (rc == LOOM_ERR_NOT_FOUND)
            return loom_fail(LOOM_ERR_NOT_FOUND, "calibrate: neither comm ucx nor comm mpi ran "
                             "loom bench on %d ranks; check `loom plugins` lists one", ranks);
        double worst[BENCH_OPS];
        if (rc || (rc = fit_all(cal, &rows, ranks, worst)))
            return rc;
        for (int k = 0; k < BENCH_OPS; k++) {
            size_t n = strlen(worst_text[k]);
            snprintf(worst_text[k] + n, sizeof worst_text[k] - n, "%s%d ranks %.0f%%",
                     n ? ", " : "", ranks, 100 * worst[k]);
            const loom_plan_measured *m =
                &c->measured[bench_ops[k].ops[0]][c->nmeasured[bench_ops[k].ops[0]] - 1];
            say(progress, "calibrate:   %-13s %d ranks: %7.2f us + bytes / %6.3f GB/s (rows "
                "within %.0f%% of it)\n", bench_ops[k].bench, ranks, m->latency_s * 1e6,
                m->bytes_per_s / 1e9, 100 * worst[k]);
        }
    }
    /* The 2-rank allreduce as a link: 2 messages of the whole buffer each
     * way (steps 2, moved 1 in plan_time.c), so the link model gives the
     * fit back exactly at 2 ranks. */
    const loom_plan_measured *ar = &c->measured[LOOM_OP_ALLREDUCE][0];
    c->intra = (loom_plan_link){ar->latency_s / 2, ar->bytes_per_s};
    c->inter = c->intra;
    set_note(cal, "intra",
             "The allreduce fit at 2 ranks (below) as a link: a 2-rank allreduce is 2 messages "
             "of the\nwhole buffer (plan_time.c), so latency = %.4g us / 2 and bandwidth = the "
             "fit's. comm %s,\nbetween processes of this machine (shared memory).",
             ar->latency_s * 1e6, cal->comm);
    set_note(cal, "inter", "One node: the same as intra.");
    set_note(cal, "measured",
             "loom bench, comm %s, under loom launch: 4 KiB to 16 MiB doubling, 10 warm-up and "
             "50 timed\ncalls a size, the slowest rank's mean; each size's median of %d runs, "
             "fitted by least squares\nof the relative error. send and recv are bench's sendrecv "
             "(a send and a recv posted\ntogether). Runs of more ranks than cores share the "
             "cores, as loom launch runs them here.",
             cal->comm, REPEATS);
    for (int k = 0; k < BENCH_OPS; k++)
        for (int j = 0; j < bench_ops[k].nops; j++) {
            char field[64];
            snprintf(field, sizeof field, "measured.%s", loom_comm_op_name(bench_ops[k].ops[j]));
            set_note(cal, field, "rows off the fit at most: %s", worst_text[k]);
        }
    return LOOM_OK;
}

/* This machine's name, cores (one rank a core) and memory, from sysconf. */
static int describe_machine(loom_plan_calibration *out, FILE *progress)
{
    loom_plan_cluster *c = &out->cluster;
    char cpu[80];
    cpu_name(cpu, sizeof cpu);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (cores < 1 || pages < 1 || page < 1)
        return loom_fail(LOOM_ERR_INTERNAL, "calibrate: sysconf does not tell this machine's "
                         "cores and memory");
    snprintf(c->name, sizeof c->name, "this machine: %ld x %s", cores, cpu);
    c->nodes = 1;
    c->ranks_per_node = (int)cores;
    c->device = 0;
    c->host_bytes = (double)pages * (double)page;
    set_note(out, "ranks_per_node", "The cores online (sysconf): one rank a core, as loom "
                                    "launch runs ranks here.");
    set_note(out, "host_memory", "Physical pages times the page size (sysconf).");
    say(progress, "calibrate: %ld cores, %.2f GiB of memory; vector instructions %s\n", cores,
        c->host_bytes / (1u << 30), loom_cpu_describe());
    return LOOM_OK;
}

/* The peak of the matrix products in each precision and the memory roof,
 * on one thread. */
static int measure_compute(loom_plan_calibration *out, FILE *progress)
{
    loom_plan_cluster *c = &out->cluster;
    double bf16_flops = 0;
    int rc = measure_products(LOOM_BF16, &bf16_flops);
    char bf16_library[384];
    const char *bf16_note = loom_gemm_products_note();
    snprintf(bf16_library, sizeof bf16_library, "%s%s%s", loom_gemm_describe(),
             bf16_note[0] ? "; " : "", bf16_note);
    if (rc == LOOM_OK)
        rc = measure_products(LOOM_F32, &out->gemm_flops);
    if (rc)
        return rc;
    /* f16 runs multiply in f32 on a CPU (gemm.h) */
    c->flops[LOOM_F32] = c->flops[LOOM_F16] = round4(out->gemm_flops);
    c->flops[LOOM_BF16] = round4(bf16_flops);
    say(progress, "calibrate: matrix products, one thread: f32 %.1f GFLOP/s (%s), bf16 %.1f (%s)\n",
        out->gemm_flops / 1e9, loom_gemm_describe(), bf16_flops / 1e9, bf16_library);
    set_note(out, "peak",
             "The matrix products on one thread (train.threads = 1), a linear layer's three as "
             "training\nruns them (%d x %d by %d x %d: forward, backward to the input, to the "
             "weight), median of %d,\non the library model.gemm = \"auto\" picks: fp32 and fp16 "
             "on %s, bf16 on %s.\n(fp16 runs multiply in fp32 on a CPU.) Vector instructions: "
             "%s.",
             GEMM_N, GEMM_C, GEMM_C, GEMM_OC, GEMM_ROUNDS, loom_gemm_describe(), bf16_library,
             loom_cpu_describe());
    double copied = 0;
    if ((rc = measure_memcpy(&copied)))
        return rc;
    /* a copy reads every byte once and writes it once */
    out->memcpy_bytes_per_s = 2 * copied;
    c->memory_bytes_per_s = round4(out->memcpy_bytes_per_s);
    say(progress, "calibrate: memcpy, one thread: %.2f GB/s copied, %.2f GB/s read + written\n",
        copied / 1e9, out->memcpy_bytes_per_s / 1e9);
    set_note(out, "memory_bandwidth",
             "memcpy of 64 MiB on one thread, pages touched first, median of %d "
             "(scripts/memcpy_bw.c's\nmeasure): %.4g GB/s copied, each byte read once and "
             "written once, so %.4g GB/s read + written.\nA pure roofline: loom's non-GEMM "
             "kernels may run below it (exp, tanh, divisions).",
             MEMCPY_RUNS, copied / 1e9, out->memcpy_bytes_per_s / 1e9);
    return LOOM_OK;
}

int loom_plan_calibrate(const char *loom_exe, int max_ranks, FILE *progress,
                        loom_plan_calibration *out)
{
    memset(out, 0, sizeof *out);
    if (max_ranks < 2)
        return loom_fail(LOOM_ERR_INVALID, "calibrate: %d ranks at most leaves no collective to "
                         "time; allow 2 or more", max_ranks);
    if (access(loom_exe, X_OK))
        return loom_fail(LOOM_ERR_NOT_FOUND, "calibrate: cannot run '%s': %s", loom_exe,
                         strerror(errno));
    uint64_t t0 = loom_now_ns();
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    int rc = describe_machine(out, progress);
    if (rc == LOOM_OK)
        rc = measure_compute(out, progress);
    if (rc)
        return rc;
    scratch s;
    if ((rc = make_scratch(&s)))
        return rc;
    rc = calibrate_links(loom_exe, max_ranks, progress, out, &s);
    scratch_remove(&s);
    if (rc)
        return rc;
    out->seconds = seconds_since(t0);
    set_note(out, "cluster",
             "Measured by loom plan --calibrate on %s in %.0f s: re-run it rather than edit the "
             "figures.\nEach figure's comment says how it was measured.", date, out->seconds);
    say(progress, "calibrate: done in %.1f s\n", out->seconds);
    return LOOM_OK;
}

/* ---- a compute backend (--device) ---- */

/* The backend's figures, measured before the host's: a backend that
 * cannot run here fails at once, not after minutes of loom bench. */
typedef struct device_figures {
    char describe[256];
    int devices; /* GPUs a node has (ranks_per_node); 0: keep the cores */
    double memory_bytes;
    char memory_how[192];
    double flops[LOOM_DTYPE_COUNT];
    loom_dtype multiply[LOOM_DTYPE_COUNT]; /* what a run of each precision multiplies in */
    int M, N, K;
    double copied_per_s;
    int copy_mib;
} device_figures;

/* cuda: the GPU's own total (cudaMemGetInfo through the core's CUDA
 * runtime, the one the backend shares); another device backend: the arena
 * its size_gib setting reserves (sim's compute.sim.size_gib). */
static int device_memory(loom_runtime *rt, const loom_backend *b, device_figures *out)
{
    if (!strcmp(b->name, "cuda")) {
#ifdef LOOM_HAVE_CUDA
        uint64_t bytes = 0;
        int rc = loom_device_memory_total(0, &bytes);
        if (rc != LOOM_OK)
            return rc;
        out->memory_bytes = (double)bytes;
        out->devices = loom_device_count();
        snprintf(out->memory_how, sizeof out->memory_how,
                 "the total cudaMemGetInfo gives for device 0 (of %d visible)", out->devices);
        return LOOM_OK;
#else
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "calibrate: this loom was built without the "
                         "CUDA toolkit and cannot ask the GPU its memory; build it where CMake "
                         "finds CUDA");
#endif
    }
    char path[64];
    snprintf(path, sizeof path, "compute.%s", b->name);
    const loom_plugin *plugin = NULL;
    const loom_host *host = NULL;
    int64_t gib = 0;
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMPUTE, b->name, &plugin);
    if (rc == LOOM_OK)
        rc = loom_runtime_host(rt, plugin, path, &host);
    if (rc == LOOM_OK)
        rc = host->config_int ? host->config_int(host, "size_gib", &gib) : LOOM_ERR_NOT_FOUND;
    if (rc != LOOM_OK || gib < 1)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "calibrate: the %s backend's memory is not "
                         "known here (neither cuda nor a %s.size_gib arena); calibrate on cuda "
                         "or sim", b->name, path);
    out->memory_bytes = (double)gib * (double)(1u << 30);
    snprintf(out->memory_how, sizeof out->memory_how, "the arena %s.size_gib = %lld reserves",
             path, (long long)gib);
    return LOOM_OK;
}

/* Plain copies within the backend's memory, synchronized: the roof its
 * non-GEMM kernels stream under. Bytes copied a second, median of 11. */
static int measure_device_copy(const loom_backend *b, size_t bytes, double *copied_per_s)
{
    void *src = NULL, *dst = NULL;
    loom_tier tier = (loom_tier)b->ops->tier;
    int rc = loom_mem_alloc(tier, LOOM_PURPOSE_OTHER, bytes, &src);
    if (rc == LOOM_OK)
        rc = loom_mem_alloc(tier, LOOM_PURPOSE_OTHER, bytes, &dst);
    double rates[MEMCPY_RUNS];
    for (int i = -1; rc == LOOM_OK && i < MEMCPY_RUNS; i++) { /* -1: first touch, untimed */
        uint64_t t0 = loom_now_ns();
        rc = b->ops->copy(b->self, dst, src, bytes);
        if (rc == LOOM_OK)
            rc = b->ops->synchronize(b->self);
        if (i >= 0)
            rates[i] = (double)bytes / seconds_since(t0);
    }
    loom_mem_free(src);
    loom_mem_free(dst);
    if (rc != LOOM_OK)
        return rc;
    *copied_per_s = median(rates, MEMCPY_RUNS);
    return LOOM_OK;
}

/* The products each precision multiplies in, each product dtype timed
 * once: a run's MLP-up product of one micro-batch (rows = micro-batch x
 * seq, by 4C x C), as `loom train` measures its MFU peak. */
static int measure_device_products(const loom_backend *b, const loom_plan_job *job,
                                   device_figures *out)
{
    static const loom_dtype precisions[] = {LOOM_F32, LOOM_BF16, LOOM_F16};
    out->M = job->micro_batch * job->seq;
    out->N = 4 * job->shape.channels;
    out->K = job->shape.channels;
    double seconds = strcmp(b->name, "cuda") ? 0.3 : 1.0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(precisions); i++) {
        loom_dtype p = precisions[i], m = b->ops->multiply_dtype(b->self, p);
        out->multiply[p] = m;
        if (out->flops[m] > 0) {
            out->flops[p] = out->flops[m];
            continue;
        }
        double rate = loom_backend_measure_gemm(b, out->M, out->N, out->K, m, seconds);
        if (!(rate > 0)) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_last_error());
            return loom_fail(LOOM_ERR_INTERNAL, "calibrate: the %s backend's %s products of "
                             "%d x %d x %d did not run: %s", b->name, loom_dtype_name(m),
                             out->M, out->N, out->K, why);
        }
        out->flops[m] = out->flops[p] = rate;
    }
    return LOOM_OK;
}

static int measure_device(loom_runtime *rt, const loom_backend *b, const loom_plan_job *job,
                          FILE *progress, device_figures *out)
{
    if (b->ops->describe)
        b->ops->describe(b->self, out->describe, sizeof out->describe);
    if (!out->describe[0])
        snprintf(out->describe, sizeof out->describe, "%s", b->name);
    say(progress, "calibrate: compute backend %s\n", out->describe);
    int rc = device_memory(rt, b, out);
    if (rc != LOOM_OK)
        return rc;
    say(progress, "calibrate: device memory %.2f GiB (%s)\n", out->memory_bytes / (1u << 30),
        out->memory_how);
    if ((rc = measure_device_products(b, job, out)) != LOOM_OK)
        return rc;
    say(progress, "calibrate: the backend's products of %d x %d x %d: f32 %.1f GFLOP/s, bf16 "
        "%.1f (multiplied in %s), f16 %.1f (multiplied in %s)\n", out->M, out->N, out->K,
        out->flops[LOOM_F32] / 1e9, out->flops[LOOM_BF16] / 1e9,
        loom_dtype_name(out->multiply[LOOM_BF16]), out->flops[LOOM_F16] / 1e9,
        loom_dtype_name(out->multiply[LOOM_F16]));
    /* past the GPU's caches (50 MB of L2 on an H100); a CPU's arena needs less */
    out->copy_mib = strcmp(b->name, "cuda") ? 64 : 256;
    if ((rc = measure_device_copy(b, (size_t)out->copy_mib << 20, &out->copied_per_s)))
        return rc;
    say(progress, "calibrate: the backend's copies of %d MiB: %.2f GB/s copied, %.2f GB/s read "
        "+ written\n", out->copy_mib, out->copied_per_s / 1e9, 2 * out->copied_per_s / 1e9);
    return LOOM_OK;
}

/* Open device as `loom train` would for the reference config (its
 * compute.<name> settings apply) and measure it; *opened: the backend's
 * name ("cpu" when device is "auto" and no GPU answered, nothing
 * measured). The backend is closed on return: the reference run needs the
 * device to itself. */
static int open_and_measure(const char *device, const char *config, const char *const *sets,
                            int nsets, FILE *progress, device_figures *out, char *opened,
                            size_t cap)
{
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    loom_backend *b = NULL;
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    char why[512] = "";
    int rc = loom_config_load(config, sets, nsets, &cfg);
    if (rc == LOOM_OK)
        rc = loom_plan_job_read(cfg, &job);
    if (rc == LOOM_OK)
        rc = loom_runtime_create(cfg, &rt);
    if (rc == LOOM_OK) {
        loom_compute_setup setup = {.struct_size = sizeof setup,
                                    .device = 0,
                                    .threads = loom_kernels_threads(),
                                    .precision = job.dtype,
                                    .deterministic = 1};
        rc = loom_backend_open(rt, device, &setup, &b, why, sizeof why);
        if (rc != LOOM_OK) {
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", loom_last_error());
            rc = loom_fail(rc, "--device %s: %s", device, detail);
        }
    }
    if (rc == LOOM_OK) {
        snprintf(opened, cap, "%s", b->name);
        if (!strcmp(device, "auto"))
            say(progress, "calibrate: %s\n", why);
        if (strcmp(b->name, "cpu") && b->ops->tier != LOOM_TIER_DEVICE)
            rc = loom_fail(LOOM_ERR_INVALID, "--device %s: the backend keeps its "
                           "memory on the host; name a device backend (cuda, sim), or leave "
                           "--device out for the CPU", device);
        else if (strcmp(b->name, "cpu"))
            rc = measure_device(rt, b, &job, progress, out);
    }
    loom_backend_close(b);
    loom_plan_job_free(&job);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return rc;
}

/* The backend's figures over the host's: device = true, its memory, its
 * peaks, its copy roof (until the reference run fits the real rate). */
static void apply_device(loom_plan_calibration *cal, const char *device,
                         const device_figures *d)
{
    loom_plan_cluster *c = &cal->cluster;
    static const char prefix[] = "this machine: ";
    char host[128];
    snprintf(host, sizeof host, "%s",
             strncmp(c->name, prefix, strlen(prefix)) ? c->name : c->name + strlen(prefix));
    char name[512];
    snprintf(name, sizeof name, "this machine: %s; host %s", d->describe, host);
    name[sizeof c->name - 1] = '\0'; /* the file's name field holds 127 characters */
    memcpy(c->name, name, sizeof c->name);
    c->device = 1;
    c->device_bytes = d->memory_bytes; /* exact: a count, not a measure */
    if (d->devices > 0) {
        c->ranks_per_node = d->devices;
        set_note(cal, "ranks_per_node", "The GPUs the CUDA runtime sees: one rank a GPU.");
    } else {
        set_note(cal, "ranks_per_node", "The cores online (sysconf): the %s backend is a "
                 "simulated device per rank, on the host's cores.", device);
    }
    set_note(cal, "device", "model.device = \"%s\": %s.", device, d->describe);
    set_note(cal, "device_memory", "From %s.", d->memory_how);
    for (int t = 0; t < LOOM_DTYPE_COUNT; t++)
        if (d->flops[t] > 0)
            c->flops[t] = round4(d->flops[t]);
    cal->gemm_flops = d->flops[LOOM_F32];
    set_note(cal, "peak",
             "The %s backend's own matrix products (loom_backend_measure_gemm), %d x %d by %d x %d "
             "(a run's\nMLP-up product of one micro-batch of the reference), best of 5 repeats: "
             "fp32 multiplied in %s,\nbf16 in %s, fp16 in %s, as runs of each precision "
             "multiply on this backend.",
             device, d->M, d->K, d->K, d->N, loom_dtype_name(d->multiply[LOOM_F32]),
             loom_dtype_name(d->multiply[LOOM_BF16]), loom_dtype_name(d->multiply[LOOM_F16]));
    cal->memcpy_bytes_per_s = 2 * d->copied_per_s;
    c->memory_bytes_per_s = round4(cal->memcpy_bytes_per_s);
    set_note(cal, "memory_bandwidth",
             "The %s backend's copies of %d MiB within its memory, synchronized, median of %d: "
             "%.4g GB/s\ncopied, each byte read once and written once, so %.4g GB/s read + "
             "written. A pure roofline.",
             device, d->copy_mib, MEMCPY_RUNS, d->copied_per_s / 1e9,
             cal->memcpy_bytes_per_s / 1e9);
}

int loom_plan_calibrate_device(const char *loom_exe, int max_ranks, const char *device,
                               const char *config, const char *const *sets, int nsets,
                               FILE *progress, loom_plan_calibration *out, char *opened,
                               size_t cap)
{
    device_figures *d = calloc(1, sizeof *d);
    if (!d)
        return loom_fail(LOOM_ERR_NO_MEMORY, "calibrate: out of memory");
    int rc = open_and_measure(device, config, sets, nsets, progress, d, opened, cap);
    if (rc == LOOM_OK)
        rc = loom_plan_calibrate(loom_exe, max_ranks, progress, out);
    if (rc == LOOM_OK && strcmp(opened, "cpu"))
        apply_device(out, opened, d);
    free(d);
    return rc;
}

/* ---- the reference run ---- */

int loom_plan_calibrate_reference(const char *loom_exe, const char *config,
                                  const char *const *sets, int nsets, double *step_s)
{
    enum { STEPS = 30, FIRST_TIMED = 3, MAX_ARGS = 64 };
    scratch s;
    int rc = make_scratch(&s);
    if (rc)
        return rc;
    const char *metrics = scratch_file(&s, "metrics.jsonl");
    const char *log = scratch_file(&s, "train.log");
    char *argv[MAX_ARGS];
    int n = 0;
    char steps[32];
    snprintf(steps, sizeof steps, "train.steps=%d", STEPS);
    argv[n++] = (char *)loom_exe;
    argv[n++] = "train";
    argv[n++] = (char *)config;
    for (int i = 0; i < nsets && n < MAX_ARGS - 8; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n++] = "--set";
    argv[n++] = steps;
    argv[n++] = "--metrics";
    argv[n++] = (char *)metrics;
    argv[n] = NULL;
    char what[600];
    snprintf(what, sizeof what, "one rank of loom train %s", config);
    rc = run(argv, log, what);
    double times[STEPS];
    int ntimes = 0;
    FILE *f = rc ? NULL : fopen(metrics, "r");
    char line[4096];
    while (f && ntimes < STEPS && fgets(line, sizeof line, f)) {
        double step, ms;
        if (!json_number(line, "step", &step) && !json_number(line, "step_ms", &ms) &&
            step >= FIRST_TIMED && ms > 0)
            times[ntimes++] = ms * 1e-3;
    }
    if (f)
        fclose(f);
    scratch_remove(&s);
    if (rc)
        return rc;
    if (ntimes < 3)
        return loom_fail(LOOM_ERR_INTERNAL, "calibrate: %s wrote %d step times from step %d "
                         "on; expected %d", what, ntimes, FIRST_TIMED, STEPS - FIRST_TIMED + 1);
    *step_s = median(times, ntimes);
    return LOOM_OK;
}

int loom_plan_calibrate_effective_memory(loom_plan_calibration *cal, const char *config,
                                         double step_s, double gemm_flops, double other_bytes)
{
    loom_plan_cluster *c = &cal->cluster;
    /* the rate plan_time.c times the reference's products at */
    loom_dtype dtype = cal->reference_dtype;
    double peak = c->flops[dtype] > 0 ? c->flops[dtype] : c->flops[LOOM_F32];
    double gemm_s = gemm_flops / peak;
    double rest_s = step_s - gemm_s;
    if (!(other_bytes > 0) || !(rest_s > 0.05 * step_s))
        return loom_fail(LOOM_ERR_INVALID, "calibrate: %s's step of %.3f ms is %.3f ms of GEMMs "
                         "at %.4g GFLOP/s, leaving %.3f ms for %.4g MB of other bytes: too "
                         "little to fit a rate to; keep the memcpy roof",
                         config, step_s * 1e3, gemm_s * 1e3, peak / 1e9,
                         rest_s * 1e3, other_bytes / 1e6);
    double rate = other_bytes / rest_s;
    c->memory_bytes_per_s = round4(rate);
    set_note(cal, "memory_bandwidth",
             "Effective, not a copy's: one rank of loom train %s\ntook %.4g ms a step (median "
             "of steps 3 on); its GEMMs, %.4g GFLOP at the %s peak above, take\n%.4g ms; the "
             "rest, %.4g MB the non-GEMM kernels read and write (the planner's count),\ntook "
             "%.4g ms: %.4g GB/s. A plain copy's roof here is %.4g GB/s read + written; loom's "
             "non-GEMM\nkernels run below it (exp, tanh, divisions, reductions).",
             config, step_s * 1e3, gemm_flops / 1e9, loom_dtype_name(dtype), gemm_s * 1e3,
             other_bytes / 1e6, rest_s * 1e3, rate / 1e9, cal->memcpy_bytes_per_s / 1e9);
    return LOOM_OK;
}

/* The planner's count of the reference's step; *dtype: its precision. A
 * CPU reference must be fp32 (its products' rate is the fp32 peak); a
 * device's may be any precision the cluster has a peak for. */
static int count_reference(const char *config, const char *const *sets, int nsets,
                           const loom_plan_cluster *cluster, double *gemm_flops,
                           double *other_bytes, loom_dtype *dtype)
{
    loom_config *cfg = NULL;
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    loom_plan plan;
    memset(&plan, 0, sizeof plan);
    int rc = loom_config_load(config, sets, nsets, &cfg);
    if (rc == LOOM_OK)
        rc = loom_plan_job_read(cfg, &job);
    int ranks = 1;
    for (int a = 0; rc == LOOM_OK && a < LOOM_AXIS_COUNT; a++)
        ranks *= job.sizes[a];
    if (rc == LOOM_OK && (ranks != 1 || (job.dtype != LOOM_F32 && !cluster->device)))
        rc = loom_fail(LOOM_ERR_INVALID, "calibrate: the reference %s runs on %d ranks in %s; "
                       "a reference is one rank%s, so that its step is compute alone at "
                       "the %s peak", config, ranks, loom_dtype_name(job.dtype),
                       cluster->device ? "" : " in fp32", cluster->device ? "run's" : "fp32");
    /* the device the reference trains on keeps the model in its tier */
    job.device_resident = cluster->device;
    if (rc == LOOM_OK)
        rc = loom_plan_make(&job, cluster, NULL, &plan);
    if (rc == LOOM_OK) {
        *gemm_flops = plan.ranks[0].gemm_flops;
        *other_bytes = plan.ranks[0].other_bytes;
        *dtype = job.dtype;
    }
    loom_plan_free(&plan);
    loom_plan_job_free(&job);
    loom_config_free(cfg);
    return rc;
}

int loom_plan_calibrate_count(const char *config, const char *const *sets, int nsets,
                              const loom_plan_cluster *cluster, double *gemm_flops,
                              double *other_bytes)
{
    loom_dtype dtype;
    return count_reference(config, sets, nsets, cluster, gemm_flops, other_bytes, &dtype);
}

int loom_plan_calibrate_compute(loom_plan_calibration *cal, const char *loom_exe,
                                const char *config, const char *const *sets, int nsets,
                                FILE *progress)
{
    double step_s, gemm_flops, other_bytes;
    int rc = count_reference(config, sets, nsets, &cal->cluster, &gemm_flops, &other_bytes,
                             &cal->reference_dtype);
    if (rc)
        return rc;
    loom_dtype dtype = cal->reference_dtype;
    double peak = cal->cluster.flops[dtype] > 0 ? cal->cluster.flops[dtype]
                                                : cal->cluster.flops[LOOM_F32];
    say(progress, "calibrate: one rank of loom train %s ...\n", config);
    if ((rc = loom_plan_calibrate_reference(loom_exe, config, sets, nsets, &step_s)))
        return rc;
    say(progress, "calibrate: %.3f ms a step; the planner counts %.4g GFLOP of GEMMs (%.3f ms "
        "at the %s peak) and %.4g MB for the other kernels\n", step_s * 1e3, gemm_flops / 1e9,
        gemm_flops / peak * 1e3, loom_dtype_name(dtype), other_bytes / 1e6);
    if ((rc = loom_plan_calibrate_effective_memory(cal, config, step_s, gemm_flops, other_bytes)))
        return rc;
    say(progress, "calibrate: the other kernels run at %.4g GB/s (a plain copy's roof: %.4g "
        "GB/s)\n", cal->cluster.memory_bytes_per_s / 1e9, cal->memcpy_bytes_per_s / 1e9);
    return LOOM_OK;
}

int loom_plan_calibration_write(const loom_plan_calibration *cal, const char *path)
{
    loom_plan_cluster_note notes[LOOM_PLAN_CALIBRATION_NOTES];
    for (int i = 0; i < cal->nnotes; i++)
        notes[i] = (loom_plan_cluster_note){cal->note_field[i], cal->note_text[i]};
    return loom_plan_cluster_write_notes(&cal->cluster, path, notes, cal->nnotes);
}
