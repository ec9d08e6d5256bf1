/* The sim compute backend (plugins/compute-sim), loaded with dlopen and
 * given a host of our own and the core's cpu backend to wrap.
 *
 *   sim_guard PLUGIN CASE
 *
 * guard      its buffers round-trip through to_device and to_host, and a
 *            host read or write of one outside the backend's calls (before,
 *            after a kernel, after a failed call) kills a forked child with
 *            SIGSEGV;
 * kernels    its kernels give the cpu backend's bits;
 * free_list  freed memory is reused first fit, neighbours merge, and a
 *            reused buffer is zeroed again;
 * no_memory  an allocation past the arena is refused with one line naming
 *            the bytes, those in use and the setting to raise;
 * misuse     host memory where its memory belongs (and the reverse), a
 *            free of what it never gave, a setup without the cpu backend. */
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/compute.h"
#include "model/compute.h"
#include "check.h"

#define MIB ((size_t)1 << 20)

static const loom_compute_plugin_v1_t *sim;

/* ------------------------------------------------------------ the host */

static struct {
    int64_t size_gib;
    char error[1024];
} H = {.size_gib = 16};

static void host_log(const loom_host *h, loom_log_level level, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "log %d: ", (int)level);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static int host_error(const loom_host *h, int status, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(H.error, sizeof H.error, fmt, ap);
    va_end(ap);
    return status;
}

static int config_int(const loom_host *h, const char *name, int64_t *out)
{
    (void)h;
    if (strcmp(name, "size_gib"))
        return LOOM_ERR_NOT_FOUND;
    *out = H.size_gib;
    return LOOM_OK;
}

static const loom_host host = {
    .struct_size = sizeof(loom_host), .version = LOOM_HOST_VERSION, .rank = 0, .world_size = 1,
    .local_rank = 0, .local_size = 1, .timeout_s = 20, .log = host_log, .error = host_error,
    .config_int = config_int,
};

static loom_compute_setup setup(void)
{
    return (loom_compute_setup){.struct_size = sizeof(loom_compute_setup), .threads = 1,
                                .precision = LOOM_F32, .deterministic = 1,
                                .cpu = &loom_compute_cpu};
}

static loom_compute *open_sim(void)
{
    loom_compute_setup s = setup();
    loom_compute *c = NULL;
    int rc = sim->create(&host, &s, &c);
    REQUIRE(rc == LOOM_OK && c, "create: %s: %s", loom_status_string(rc), H.error);
    return c;
}

static loom_compute *open_cpu(void)
{
    loom_compute_setup s = setup();
    loom_compute *c = NULL;
    OK(loom_compute_cpu.create(&host, &s, &c));
    return c;
}

static void *sim_alloc(loom_compute *c, size_t bytes)
{
    void *p = NULL;
    int rc = sim->alloc(c, bytes, &p);
    REQUIRE(rc == LOOM_OK && p, "alloc %zu: %s: %s", bytes, loom_status_string(rc), H.error);
    return p;
}

static int has(const char *text, const char *part)
{
    return strstr(text, part) != NULL;
}

/* 1 when touching p from the host kills a child process with SIGSEGV. */
static int host_access_faults(void *p, int write)
{
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would exit instead */
        volatile unsigned char *byte = p;
        if (write)
            *byte = 1;
        else
            (void)*byte;
        _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

static void check_guarded(void *p, size_t bytes, const char *when)
{
    unsigned char *at = p;
    CHECK(host_access_faults(at, 0), "a host read of a buffer's first byte %s did not fault", when);
    CHECK(host_access_faults(at + bytes - 1, 0), "a host read of a buffer's last byte %s did not "
          "fault", when);
    CHECK(host_access_faults(at, 1), "a host write into a buffer %s did not fault", when);
}

static void fill(float *x, size_t n, float seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = seed + (float)((i * 37) % 101) / 7.0f - 5.0f;
}

/* ------------------------------------------------------------ the cases */

static void test_guard(void)
{
    CHECK_EQ(sim->tier, LOOM_TIER_DEVICE);
    CHECK_EQ(sim->mem_kind, LOOM_MEM_DEVICE);
    CHECK(sim->probe == NULL);
    CHECK_STR(sim->header.name, "sim");

    loom_compute *c = open_sim();
    char line[256];
    OK(sim->describe(c, line, sizeof line));
    CHECK_STR(line, "sim: cpu kernels on guarded memory (arena 16 GiB)");

    enum { N = 1000 };
    size_t bytes = N * sizeof(float);
    float *a = sim_alloc(c, bytes), *b = sim_alloc(c, bytes), *out = sim_alloc(c, bytes);
    CHECK((uintptr_t)a % 256 == 0 && (uintptr_t)b % 256 == 0, "alloc is not 256-byte aligned");

    float host_in[N], host_out[N];
    memset(host_out, 0xff, sizeof host_out);
    OK(sim->to_host(c, host_out, a, bytes));
    int zeroed = 1;
    for (int i = 0; i < N; i++)
        zeroed &= host_out[i] == 0.0f;
    CHECK(zeroed, "a fresh buffer is not zeroed");

    fill(host_in, N, 1.0f);
    OK(sim->to_device(c, a, host_in, bytes));
    memset(host_out, 0, sizeof host_out);
    OK(sim->to_host(c, host_out, a, bytes));
    CHECK(!memcmp(host_in, host_out, bytes), "to_device then to_host does not give the bytes back");
    check_guarded(a, bytes, "after to_device and to_host");

    fill(host_in, N, 2.0f);
    OK(sim->to_device(c, b, host_in, bytes));
    OK(sim->residual_forward(c, out, a, b, N));
    check_guarded(out, bytes, "after a kernel");

    H.error[0] = 0;
    int rc = sim->residual_forward(c, out, a, NULL, N);
    CHECK(rc != LOOM_OK, "residual_forward with a NULL input succeeded");
    check_guarded(out, bytes, "after a kernel that failed");

    /* still usable: the guard opened again for the next call */
    OK(sim->to_host(c, host_out, a, bytes));
    fill(host_in, N, 1.0f);
    CHECK(!memcmp(host_in, host_out, bytes), "the buffer changed after a failed call");

    OK(sim->free(c, out));
    OK(sim->free(c, b));
    OK(sim->free(c, a));
    OK(sim->destroy(c));
}

/* The same kernel on sim and on cpu, from the same inputs: the same bits. */
static void test_kernels(void)
{
    loom_compute *c = open_sim(), *cpu = open_cpu();
    enum { ROWS = 8, C = 64, OC = 48 };
    size_t n = ROWS * C;
    float in_a[ROWS * C], in_b[ROWS * C], weight[OC * C], bias[OC], ln_w[C], ln_b[C];
    fill(in_a, n, 0.5f);
    fill(in_b, n, -0.25f);
    fill(weight, OC * C, 0.125f);
    fill(bias, OC, 1.5f);
    fill(ln_w, C, 1.0f);
    fill(ln_b, C, 0.0f);
    for (size_t i = 0; i < OC * C; i++)
        weight[i] *= 0.01f;

    float *a = sim_alloc(c, sizeof in_a), *b = sim_alloc(c, sizeof in_b);
    float *w = sim_alloc(c, sizeof weight), *bi = sim_alloc(c, sizeof bias);
    float *lw = sim_alloc(c, sizeof ln_w), *lb = sim_alloc(c, sizeof ln_b);
    float *res = sim_alloc(c, n * sizeof(float)), *mm = sim_alloc(c, ROWS * OC * sizeof(float));
    float *ln = sim_alloc(c, n * sizeof(float)), *mean = sim_alloc(c, ROWS * sizeof(float));
    float *rstd = sim_alloc(c, ROWS * sizeof(float));
    OK(sim->to_device(c, a, in_a, sizeof in_a));
    OK(sim->to_device(c, b, in_b, sizeof in_b));
    OK(sim->to_device(c, w, weight, sizeof weight));
    OK(sim->to_device(c, bi, bias, sizeof bias));
    OK(sim->to_device(c, lw, ln_w, sizeof ln_w));
    OK(sim->to_device(c, lb, ln_b, sizeof ln_b));

    OK(sim->residual_forward(c, res, a, b, n));
    OK(sim->matmul_forward(c, mm, res, (loom_compute_weight){w, LOOM_F32}, bi, ROWS, C, OC));
    OK(sim->layernorm_forward(c, ln, mean, rstd, res, lw, lb, ROWS, C));
    double sim_sq = 0, cpu_sq = 0;
    OK(sim->sum_squares(c, mm, LOOM_F32, ROWS * OC, &sim_sq));
    float sim_mean = 0, cpu_mean = 0;
    OK(sim->mean(c, ln, n, &sim_mean));

    float want_res[ROWS * C], want_mm[ROWS * OC], want_ln[ROWS * C], want_mean[ROWS],
        want_rstd[ROWS];
    OK(loom_compute_cpu.residual_forward(cpu, want_res, in_a, in_b, n));
    OK(loom_compute_cpu.matmul_forward(cpu, want_mm, want_res,
                                       (loom_compute_weight){weight, LOOM_F32}, bias, ROWS, C,
                                       OC));
    OK(loom_compute_cpu.layernorm_forward(cpu, want_ln, want_mean, want_rstd, want_res, ln_w,
                                          ln_b, ROWS, C));
    OK(loom_compute_cpu.sum_squares(cpu, want_mm, LOOM_F32, ROWS * OC, &cpu_sq));
    OK(loom_compute_cpu.mean(cpu, want_ln, n, &cpu_mean));

    float got_res[ROWS * C], got_mm[ROWS * OC], got_ln[ROWS * C], got_rstd[ROWS];
    OK(sim->to_host(c, got_res, res, sizeof got_res));
    OK(sim->to_host(c, got_mm, mm, sizeof got_mm));
    OK(sim->to_host(c, got_ln, ln, sizeof got_ln));
    OK(sim->to_host(c, got_rstd, rstd, sizeof got_rstd));
    CHECK(!memcmp(got_res, want_res, sizeof got_res), "residual_forward: not the cpu's bits");
    CHECK(!memcmp(got_mm, want_mm, sizeof got_mm), "matmul_forward: not the cpu's bits");
    CHECK(!memcmp(got_ln, want_ln, sizeof got_ln), "layernorm_forward: not the cpu's bits");
    CHECK(!memcmp(got_rstd, want_rstd, sizeof got_rstd), "layernorm_forward's rstd differs");
    CHECK(!memcmp(&sim_sq, &cpu_sq, sizeof sim_sq), "sum_squares %.17g, cpu %.17g", sim_sq,
          cpu_sq);
    CHECK(!memcmp(&sim_mean, &cpu_mean, sizeof sim_mean), "mean %.9g, cpu %.9g", sim_mean,
          cpu_mean);
    CHECK(got_res[0] != 0.0f && got_mm[0] != 0.0f, "the kernels wrote nothing");

    float *all[] = {a, b, w, bi, lw, lb, res, mm, ln, mean, rstd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        OK(sim->free(c, all[i]));
    OK(sim->destroy(c));
    OK(loom_compute_cpu.destroy(cpu));
}

static void test_free_list(void)
{
    loom_compute *c = open_sim();
    char *a = sim_alloc(c, MIB), *b = sim_alloc(c, MIB), *d = sim_alloc(c, MIB);
    CHECK(b == a + MIB && d == b + MIB, "buffers not placed one after the other");
    char *tiny1 = sim_alloc(c, 1), *tiny2 = sim_alloc(c, 1);
    CHECK(tiny2 == tiny1 + 256, "a 1-byte buffer takes %td bytes, want 256", tiny2 - tiny1);

    unsigned char ones[4096];
    memset(ones, 0xab, sizeof ones);
    OK(sim->to_device(c, b, ones, sizeof ones));
    OK(sim->free(c, b));

    /* first fit: the hole b left, in two halves */
    char *half1 = sim_alloc(c, MIB / 2), *half2 = sim_alloc(c, MIB / 2);
    CHECK(half1 == b && half2 == b + MIB / 2, "the freed piece was not reused first fit");
    unsigned char back[4096];
    OK(sim->to_host(c, back, half1, sizeof back));
    int zeroed = 1;
    for (size_t i = 0; i < sizeof back; i++)
        zeroed &= back[i] == 0;
    CHECK(zeroed, "a reused piece is not zeroed");

    /* a piece reused across page boundaries, neither end on one: zeroed throughout */
    enum { SPAN = 3 * 4096 };
    unsigned char pattern[SPAN], span_back[256 + SPAN];
    memset(pattern, 0xcd, sizeof pattern);
    char *span = sim_alloc(c, SPAN);
    CHECK(span == tiny2 + 256, "placed at +%td, want right after the 1-byte buffers", span - a);
    OK(sim->to_device(c, span, pattern, SPAN));
    OK(sim->to_device(c, tiny2, pattern, 256));
    OK(sim->free(c, span));
    OK(sim->free(c, tiny2));
    REQUIRE(sim_alloc(c, 1) == tiny2 && sim_alloc(c, SPAN) == span, "not reused in place");
    OK(sim->to_host(c, span_back, tiny2, 256));
    OK(sim->to_host(c, span_back + 256, span, SPAN));
    zeroed = 1;
    for (size_t i = 0; i < sizeof span_back; i++)
        zeroed &= span_back[i] == 0;
    CHECK(zeroed, "a reused piece that is not whole pages is not zeroed");
    OK(sim->free(c, span));

    /* freed neighbours merge: the three pieces and the halves make one */
    OK(sim->free(c, half2));
    OK(sim->free(c, a));
    OK(sim->free(c, half1));
    OK(sim->free(c, d));
    char *big = sim_alloc(c, 3 * MIB);
    CHECK(big == a, "freed neighbours did not merge: 3 MiB placed at +%td, want +0", big - a);

    /* the same pattern again stays in place: nothing leaks */
    OK(sim->free(c, big));
    for (int round = 0; round < 100; round++) {
        char *x = sim_alloc(c, MIB), *y = sim_alloc(c, 2 * MIB);
        CHECK(x == a && y == a + MIB, "round %d: placed at +%td and +%td", round, x - a, y - a);
        OK(sim->free(c, x));
        OK(sim->free(c, y));
    }
    OK(sim->free(c, tiny1));
    OK(sim->free(c, tiny2));
    OK(sim->destroy(c));
}

static void test_no_memory(void)
{
    H.size_gib = 1;
    loom_compute *c = open_sim();
    char line[256];
    OK(sim->describe(c, line, sizeof line));
    CHECK_STR(line, "sim: cpu kernels on guarded memory (arena 1 GiB)");
    void *p = sim_alloc(c, 768 * MIB), *q = NULL;
    H.error[0] = 0;
    CHECK_EQ(sim->alloc(c, 512 * MIB, &q), LOOM_ERR_NO_MEMORY);
    CHECK(q == NULL);
    CHECK_STR(H.error, "sim: cannot allocate 536870912 bytes: 805306368 bytes of the 1 GiB arena "
                       "are in use and no free piece is that large; raise compute.sim.size_gib");
    CHECK_EQ(sim->alloc(c, SIZE_MAX, &q), LOOM_ERR_NO_MEMORY);
    CHECK(has(H.error, "cannot allocate 18446744073709551615 bytes"), "%s", H.error);
    /* what is left still serves */
    q = sim_alloc(c, 256 * MIB);
    OK(sim->free(c, q));
    OK(sim->free(c, p));
    q = sim_alloc(c, 1024 * MIB);
    OK(sim->free(c, q));
    OK(sim->destroy(c));
}

static void test_misuse(void)
{
    loom_compute *c = open_sim();
    float *dev = sim_alloc(c, 1024);
    float host_buf[256] = {0};

    H.error[0] = 0;
    CHECK_EQ(sim->to_device(c, host_buf, host_buf, 1024), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: to_device's destination") && has(H.error, "is not the backend's "
          "memory"), "%s", H.error);
    CHECK_EQ(sim->to_device(c, dev, dev, 1024), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: to_device's source") && has(H.error, "is the backend's memory"), "%s",
          H.error);
    CHECK_EQ(sim->to_host(c, host_buf, host_buf, 1024), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: to_host's source"), "%s", H.error);
    CHECK_EQ(sim->to_host(c, dev, dev, 1024), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: to_host's destination"), "%s", H.error);
    CHECK_EQ(sim->copy(c, host_buf, dev, 1024), LOOM_ERR_INVALID);
    CHECK_EQ(sim->zero(c, host_buf, 1024), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: zero's destination"), "%s", H.error);
    CHECK_EQ(sim->copy_rows(c, dev, 16, dev + 64, 16, 32, 2), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: copy_rows of rows of 32 bytes between pitches of 16 and 16"), "%s",
          H.error);
    CHECK_EQ(sim->copy_rows(c, host_buf, 16, dev, 16, 16, 2), LOOM_ERR_INVALID);
    CHECK(has(H.error, "sim: copy_rows's destination"), "%s", H.error);
    /* nothing to move needs no buffer, as on the cpu backend */
    OK(sim->to_device(c, NULL, NULL, 0));
    OK(sim->to_host(c, NULL, NULL, 0));
    OK(sim->copy(c, NULL, NULL, 0));
    OK(sim->zero(c, NULL, 0));
    OK(sim->copy_rows(c, NULL, 0, NULL, 0, 0, 3));
    CHECK_EQ(sim->free(c, host_buf), LOOM_ERR_INVALID);
    CHECK(has(H.error, "is not a buffer the backend's alloc returned"), "%s", H.error);
    CHECK_EQ(sim->free(c, dev + 1), LOOM_ERR_INVALID);
    OK(sim->free(c, dev));
    CHECK_EQ(sim->free(c, dev), LOOM_ERR_INVALID);
    CHECK(!strchr(H.error, '\n'), "more than one line: %s", H.error);
    OK(sim->destroy(c));

    loom_compute_setup s = setup();
    s.cpu = NULL;
    loom_compute *none = NULL;
    CHECK_EQ(sim->create(&host, &s, &none), LOOM_ERR_NOT_SUPPORTED);
    CHECK(none == NULL);
    CHECK(has(H.error, "sim: the core gave no cpu backend"), "%s", H.error);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: sim_guard PLUGIN guard|kernels|free_list|no_memory|misuse\n");
        return 2;
    }
    void *dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    REQUIRE(dl, "dlopen %s: %s", argv[1], dlerror());
    sim = dlsym(dl, "loom_compute_plugin_v1");
    REQUIRE(sim, "dlsym loom_compute_plugin_v1 in %s: %s", argv[1], dlerror());
    REQUIRE(sim->header.kind == LOOM_PLUGIN_COMPUTE);

    const char *which = argv[2];
    if (!strcmp(which, "guard"))
        test_guard();
    else if (!strcmp(which, "kernels"))
        test_kernels();
    else if (!strcmp(which, "free_list"))
        test_free_list();
    else if (!strcmp(which, "no_memory"))
        test_no_memory();
    else if (!strcmp(which, "misuse"))
        test_misuse();
    else {
        fprintf(stderr, "sim_guard: no case '%s'\n", which);
        return 2;
    }
    return check_done(which);
}
