/* The config module: schema defaults, typed reads, every kind of error with
 * its exact one-line message (file:line from real temp files), --set
 * overrides, plugin groups, and the example configs; every case but
 * "layers" against the whole schema the commands check (every layer's
 * settings), "layers" against what the runtime knows alone and what a layer
 * adds to it.
 *
 *   config_test CASE [EXAMPLES_DIR]    one case ("all" runs every case but
 *                                      examples and layers) */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/settings.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "check.h"

static char tmpdir[64];

/* Write a config into the temp dir; returns its path (static per call site
 * is not enough, so a small ring of buffers). */
static const char *write_cfg(const char *name, const char *text)
{
    static char paths[8][128];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 128, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

/* Load text from a temp file and expect failure with exactly
 * "<path>:<line>: <rest>" (line 0: "<path>: <rest>"; line -1: just rest). */
static void expect_error(const char *name, const char *text, const char *const *sets, int nsets,
                         int line, const char *rest)
{
    const char *path = write_cfg(name, text);
    loom_config *cfg = (loom_config *)0x1;
    loom_clear_error();
    int rc = loom_config_load(path, sets, nsets, &cfg);
    CHECK(rc == LOOM_ERR_INVALID);
    CHECK(cfg == NULL);
    char want[1024];
    if (line > 0)
        snprintf(want, sizeof want, "%s:%d: %s", path, line, rest);
    else if (line == 0)
        snprintf(want, sizeof want, "%s: %s", path, rest);
    else
        snprintf(want, sizeof want, "%s", rest);
    CHECK_STR(loom_last_error(), want);
    if (rc == LOOM_OK)
        loom_config_free(cfg);
}

static loom_config *load_ok(const char *name, const char *text, const char *const *sets, int nsets)
{
    const char *path = name ? write_cfg(name, text) : NULL;
    loom_config *cfg = NULL;
    int rc = loom_config_load(path, sets, nsets, &cfg);
    if (rc != LOOM_OK) {
        fprintf(stderr, "unexpected failure: %s\n", loom_last_error());
        failures++;
        exit(1);
    }
    return cfg;
}

static int64_t get_int(const loom_config *cfg, const char *path)
{
    int64_t v = -12345;
    CHECK(loom_config_int(cfg, path, &v) == LOOM_OK);
    return v;
}

static double get_float(const loom_config *cfg, const char *path)
{
    double v = -12345;
    CHECK(loom_config_float(cfg, path, &v) == LOOM_OK);
    return v;
}

static const char *get_str(const loom_config *cfg, const char *path)
{
    const char *v = NULL;
    CHECK(loom_config_string(cfg, path, &v) == LOOM_OK);
    return v ? v : "(null)";
}

/* ------------------------------------------------------------ cases */

static void case_defaults(void)
{
    loom_config *cfg = load_ok(NULL, NULL, NULL, 0);
    CHECK(loom_config_file(cfg) == NULL);
    CHECK_STR(get_str(cfg, "model.kind"), "gpt2");
    CHECK(get_int(cfg, "model.layers") == 4);
    CHECK(get_int(cfg, "model.heads") == 4);
    CHECK(get_int(cfg, "model.channels") == 128);
    CHECK(get_int(cfg, "model.vocab") == 256);
    CHECK(get_int(cfg, "model.padded_vocab") == 256);
    CHECK(get_int(cfg, "model.max_seq") == 256);
    CHECK_STR(get_str(cfg, "model.init"), "random");
    CHECK(get_int(cfg, "model.seed") == 1337);
    CHECK_STR(get_str(cfg, "model.checkpoint"), "");
    CHECK_STR(get_str(cfg, "data.train"), "");
    CHECK_STR(get_str(cfg, "data.val"), "");
    CHECK(get_int(cfg, "train.batch") == 8);
    CHECK(get_int(cfg, "train.seq") == 64);
    CHECK(get_int(cfg, "train.steps") == 100);
    CHECK(get_float(cfg, "train.lr") == 1e-3);
    CHECK(get_float(cfg, "train.weight_decay") == 0.0);
    CHECK(get_float(cfg, "train.beta1") == 0.9);
    CHECK(get_float(cfg, "train.beta2") == 0.999);
    CHECK(get_float(cfg, "train.eps") == 1e-8);
    CHECK(get_int(cfg, "train.warmup") == 0);
    CHECK_STR(get_str(cfg, "train.schedule"), "constant");
    CHECK(get_float(cfg, "train.clip") == 0.0);
    CHECK(get_int(cfg, "train.grad_accum") == 1);
    CHECK_STR(get_str(cfg, "train.precision"), "fp32");
    CHECK_STR(get_str(cfg, "train.recompute"), "none");
    const char *axes[] = {"dp", "tp", "sp", "pp"};
    for (int i = 0; i < 4; i++) {
        char p[64];
        snprintf(p, sizeof p, "parallel.%s.size", axes[i]);
        CHECK(get_int(cfg, p) == 1);
        snprintf(p, sizeof p, "comm.%s", axes[i]);
        CHECK_STR(get_str(cfg, p), "");
    }
    CHECK_STR(get_str(cfg, "parallel.dp.strategy"), "ddp");
    CHECK_STR(get_str(cfg, "parallel.tp.strategy"), "tp");
    CHECK_STR(get_str(cfg, "parallel.sp.strategy"), "ulysses");
    CHECK_STR(get_str(cfg, "parallel.pp.schedule"), "1f1b");
    CHECK(get_int(cfg, "parallel.pp.microbatches") == 1);
    CHECK(get_int(cfg, "parallel.pp.virtual_stages") == 1);
    CHECK(loom_config_list_len(cfg, "parallel.pp.stage_layers") == 0);
    CHECK_STR(get_str(cfg, "comm.default"), "auto");
    CHECK(get_float(cfg, "comm.timeout_s") == 60.0);
    CHECK_STR(get_str(cfg, "memory.offload.optimizer"), "none");
    CHECK_STR(get_str(cfg, "memory.offload.params"), "none");
    CHECK(get_int(cfg, "memory.host_limit") == 0);
    CHECK(loom_config_list_len(cfg, "plugins.path") == 0);
    CHECK(loom_config_list_len(cfg, "bench.comms") == 1);
    CHECK_STR(loom_config_list_string(cfg, "bench.comms", 0), "auto");
    const char *ops[] = {"allreduce",     "broadcast", "reduce",  "allgather",
                         "reducescatter", "alltoall",  "sendrecv"};
    CHECK(loom_config_list_len(cfg, "bench.ops") == 7);
    for (int i = 0; i < 7; i++)
        CHECK_STR(loom_config_list_string(cfg, "bench.ops", i), ops[i]);
    CHECK(loom_config_list_string(cfg, "bench.ops", 7) == NULL);
    CHECK(get_int(cfg, "bench.min_bytes") == 4);
    CHECK(get_int(cfg, "bench.max_bytes") == 67108864);
    CHECK(get_int(cfg, "bench.iters") == 20);
    CHECK(get_int(cfg, "bench.warmup") == 5);
    CHECK_STR(get_str(cfg, "bench.memory"), "host");
    CHECK_STR(get_str(cfg, "bench.dtype"), "f32");
    CHECK_STR(get_str(cfg, "bench.redop"), "sum");

    CHECK(!loom_config_is_set(cfg, "train.batch"));
    CHECK_STR(loom_config_where(cfg, "train.batch"), "default");

    /* Reads of unknown paths and of the wrong type. */
    int64_t v;
    CHECK(loom_config_int(cfg, "train.nope", &v) == LOOM_ERR_NOT_FOUND);
    CHECK(loom_config_list_len(cfg, "bench.nope") == -1);
    CHECK(loom_config_list_len(cfg, "bench.iters") == -1);
    CHECK(loom_config_int(cfg, "bench.dtype", &v) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(),
              "config: bench.dtype: expected an integer, found a string (\"f32\")");
    double d;
    CHECK(loom_config_float(cfg, "bench.iters", &d) == LOOM_OK &&
          d == 20.0); /* int reads as float */
    loom_config_free(cfg);

    /* An empty file is all defaults too, and knows its file. */
    cfg = load_ok("empty.cfg", "# nothing here\n", NULL, 0);
    CHECK(loom_config_file(cfg) && strstr(loom_config_file(cfg), "empty.cfg"));
    CHECK(get_int(cfg, "bench.iters") == 20);
    loom_config_free(cfg);
}

static void case_typo(void)
{
    expect_error("typo.cfg",
                 "# a bench config\n"
                 "bench = {\n"
                 "  comms = [ \"mpi\" ];\n"
                 "  itres = 5;\n"
                 "};\n",
                 NULL, 0, 4, "bench.itres: unknown setting; did you mean 'bench.iters'?");
    expect_error("typo2.cfg", "train = {\n  batch = 8;\n  warmpu = 3;\n};\n", NULL, 0, 3,
                 "train.warmpu: unknown setting; did you mean 'train.warmup'?");
    /* parallel.pp.micro lives in a plugin's place: no error at load. */
    loom_config *cfg = load_ok("typo3.cfg", "parallel = { pp = { micro = 4; }; };\n", NULL, 0);
    loom_config_free(cfg);
    expect_error("typo4.cfg", "model = {\n  Layers = 2;\n};\n", NULL, 0, 2,
                 "model.Layers: unknown setting; did you mean 'model.layers'?");
}

static void case_wrong_type(void)
{
    expect_error("type.cfg", "train = {\n  seq = 64;\n  batch = \"eight\";\n};\n", NULL, 0, 3,
                 "train.batch: expected an integer, found a string (\"eight\")");
    expect_error("type2.cfg", "train = { batch = 8.5; };\n", NULL, 0, 1,
                 "train.batch: expected an integer, found a float (8.5)");
    expect_error("type3.cfg", "train = { lr = \"fast\"; };\n", NULL, 0, 1,
                 "train.lr: expected a number, found a string (\"fast\")");
    expect_error(
        "type4.cfg", "bench = { comms = \"mpi\"; };\n", NULL, 0, 1,
        "bench.comms: expected a list of strings, found a string (\"mpi\"); write [\"mpi\"]");
    /* libconfig refuses a mixed array itself; a list ( ... ) may mix. */
    expect_error("type5.cfg", "bench = {\n  comms = [ \"mpi\",\n    3 ];\n};\n", NULL, 0, 3,
                 "syntax error (libconfig: mismatched element type in array)");
    expect_error("type6.cfg", "bench = {\n  comms = ( \"mpi\",\n    3 );\n};\n", NULL, 0, 3,
                 "bench.comms[1]: expected a string, found an integer (3)");
    expect_error("type7.cfg", "parallel = { dp = 2; };\n", NULL, 0, 1,
                 "parallel.dp: expected a group ({ ... }), found an integer (2)");
    expect_error("type8.cfg", "comm = { tp = { x = 1; }; };\n", NULL, 0, 1,
                 "comm.tp: expected a string, found a group");

    /* An integer is a fine number: lr = 1 reads as 1.0. */
    loom_config *cfg = load_ok("int_for_float.cfg", "train = { lr = 1; clip = 2; };\n", NULL, 0);
    CHECK(get_float(cfg, "train.lr") == 1.0);
    CHECK(get_float(cfg, "train.clip") == 2.0);
    loom_config_free(cfg);
}

static void case_bad_enum(void)
{
    expect_error("enum.cfg", "train = {\n  batch = 8;\n\n\n  precision = \"fp8\";\n};\n", NULL, 0,
                 5, "train.precision: expected one of fp32, bf16, fp16; found \"fp8\"");
    expect_error("enum2.cfg", "bench = { ops = [ \"allreduce\", \"allredcue\" ]; };\n", NULL, 0, 1,
                 "bench.ops[1]: expected one of allreduce, broadcast, reduce, allgather, "
                 "reducescatter, alltoall, sendrecv; found \"allredcue\" (did you mean \"allreduce\"?)");
    expect_error("enum3.cfg", "bench = { dtype = \"f128\"; };\n", NULL, 0, 1,
                 "bench.dtype: expected one of f32, bf16, f16, f64, i32, i64, u8; found \"f128\" (did you mean \"f32\"?)");
    /* Strategies are plugin names: anything non-empty passes here. */
    loom_config *cfg =
        load_ok("strategy.cfg", "parallel = { dp = { strategy = \"my-zero\"; }; };\n", NULL, 0);
    CHECK_STR(get_str(cfg, "parallel.dp.strategy"), "my-zero");
    loom_config_free(cfg);
    expect_error("strategy2.cfg", "parallel = { dp = { strategy = \"\"; }; };\n", NULL, 0, 1,
                 "parallel.dp.strategy: expected a non-empty string, found \"\"");
}

static void case_unknown_group(void)
{
    expect_error("group.cfg", "trian = {\n  batch = 8;\n};\n", NULL, 0, 1,
                 "trian: unknown group; did you mean 'train'?");
    expect_error("group2.cfg", "\n\nfoo = { a = 1; };\n", NULL, 0, 3,
                 "foo: unknown group (valid here: plugins, model, data, train, parallel, comm, "
                 "memory, bench)");
    expect_error("group3.cfg", "train = {\n  dp = { size = 2; };\n};\n", NULL, 0, 2,
                 "train.dp: unknown group; did you mean 'parallel.dp'?");
    expect_error("group4.cfg", "steps = 10;\n", NULL, 0, 1,
                 "steps: unknown setting; did you mean 'train.steps'?");
    /* Two edits from "bench" here, exact in train: train wins. */
    expect_error("group4b.cfg", "batch = 10;\n", NULL, 0, 1,
                 "batch: unknown setting; did you mean 'train.batch'?");
    expect_error("group5.cfg", "train = { foo = 1; };\n", NULL, 0, 1,
                 "train.foo: unknown setting (valid here: batch, seq, steps, lr, weight_decay, "
                 "decay, beta1, beta2, eps, warmup, schedule, clip, grad_accum, precision, "
                 "recompute, lr_final_frac, threads, peak_gflops, loss_scale, loss_scale_window, "
                 "max_skipped, eval_every, eval_batches, checkpoint_every, checkpoint_dir, "
                 "checkpoint_overwrite, keep_checkpoints, checkpoint_async, sample_every, "
                 "sample_tokens)");
    expect_error("group6.cfg", "parallel = { xx = { size = 2; }; };\n", NULL, 0, 1,
                 "parallel.xx: unknown group (valid here: dp, tp, sp, pp)");
    expect_error("group7.cfg", "comm = { zzz = 3; };\n", NULL, 0, 1,
                 "comm.zzz: unknown setting (valid here: default, timeout_s, tp, sp, pp, dp; or a "
                 "group of a comm plugin's settings, e.g. ucx = { ... })");
    expect_error("group8.cfg", "memory = { offlaod = { params = \"nvme\"; }; };\n", NULL, 0, 1,
                 "memory.offlaod: unknown group; did you mean 'memory.offload'?");
}

static void case_ranges(void)
{
    expect_error("range.cfg", "parallel = { dp = { size = 0; }; };\n", NULL, 0, 1,
                 "parallel.dp.size: expected an integer >= 1, found 0");
    expect_error("range2.cfg", "comm = { timeout_s = 0; };\n", NULL, 0, 1,
                 "comm.timeout_s: expected a number > 0, found 0");
    expect_error("range3.cfg", "bench = { iters = 0; };\n", NULL, 0, 1,
                 "bench.iters: expected an integer >= 1, found 0");
    expect_error("range4.cfg", "bench = { warmup = -1; };\n", NULL, 0, 1,
                 "bench.warmup: expected an integer >= 0, found -1");
    expect_error("range5.cfg", "train = { beta2 = 1.0; };\n", NULL, 0, 1,
                 "train.beta2: expected a number in [0, 1), found 1");
    expect_error("range6.cfg", "bench = {\n  min_bytes = 1024;\n  max_bytes = 512;\n};\n", NULL, 0,
                 3, "bench.max_bytes: expected an integer >= bench.min_bytes (1024), found 512");
    expect_error("range7.cfg", "bench = {\n  min_bytes = 134217728;\n};\n", NULL, 0, 2,
                 "bench.min_bytes: expected an integer <= bench.max_bytes (67108864), found "
                 "134217728");
    expect_error("range8.cfg", "model = { vocab = 300; };\n", NULL, 0, 1,
                 "model.padded_vocab: expected an integer >= model.vocab (300), found 256");
    expect_error("range9.cfg", "model = { channels = 100; heads = 3; };\n", NULL, 0, 1,
                 "model.channels: expected a multiple of model.heads (3), found 100");
}

static void case_set(void)
{
    const char *text = "train = {\n"
                       "  batch = 8;\n"
                       "  lr = 1e-3;\n"
                       "};\n"
                       "bench = { comms = [ \"mpi\" ]; };\n";
    const char *sets[] = {
        "train.lr=3e-4",
        "comm.default=ucx",
        "bench.comms=[\"mpi\",\"ucx\"]",
        "train.batch = 16",
        "comm.ucx.progress_thread=true",
        "data.train=examples/data/corpus.bin",
        "bench.ops=allreduce, sendrecv",
        "parallel.pp.stage_layers=2,2",
        "bench.max_bytes=8589934592",
        "comm.timeout_s=5",
        "model.checkpoint=",
    };
    int n = (int)LOOM_ARRAY_LEN(sets);
    loom_config *cfg = load_ok("set.cfg", text, sets, n);
    CHECK(get_float(cfg, "train.lr") == 3e-4);
    CHECK_STR(get_str(cfg, "comm.default"), "ucx");
    CHECK(loom_config_list_len(cfg, "bench.comms") == 2);
    CHECK_STR(loom_config_list_string(cfg, "bench.comms", 1), "ucx");
    CHECK(get_int(cfg, "train.batch") == 16);
    int b = 0;
    CHECK(loom_config_bool(cfg, "comm.ucx.progress_thread", &b) == LOOM_OK && b == 1);
    CHECK_STR(get_str(cfg, "data.train"), "examples/data/corpus.bin");
    CHECK(loom_config_list_len(cfg, "bench.ops") == 2);
    CHECK_STR(loom_config_list_string(cfg, "bench.ops", 1), "sendrecv");
    CHECK(loom_config_list_len(cfg, "parallel.pp.stage_layers") == 2);
    CHECK(get_int(cfg, "parallel.pp.stage_layers[1]") == 2);
    CHECK(get_int(cfg, "bench.max_bytes") == 8589934592LL);
    CHECK(get_float(cfg, "comm.timeout_s") == 5.0);
    CHECK_STR(get_str(cfg, "model.checkpoint"), "");

    CHECK_STR(loom_config_where(cfg, "train.lr"), "--set train.lr=3e-4");
    CHECK_STR(loom_config_where(cfg, "comm.ucx.progress_thread"),
              "--set comm.ucx.progress_thread=true");
    CHECK_STR(loom_config_where(cfg, "comm.ucx"), "--set comm.ucx.progress_thread=true");
    char want[256];
    snprintf(want, sizeof want, "%s/set.cfg:1", tmpdir);
    CHECK_STR(loom_config_where(cfg, "train"), want);
    CHECK_STR(loom_config_where(cfg, "bench.iters"), "default");
    CHECK(loom_config_is_set(cfg, "comm.default"));
    CHECK(!loom_config_is_set(cfg, "bench.iters"));
    loom_config_free(cfg);

    /* The last of several overrides of one path wins; a type may change. */
    const char *twice[] = {"train.batch=4", "train.batch=32"};
    cfg = load_ok("set.cfg", text, twice, 2);
    CHECK(get_int(cfg, "train.batch") == 32);
    loom_config_free(cfg);

    /* Overrides on no file at all. */
    const char *only[] = {"parallel.dp.size=4", "parallel.dp.strategy=zero3"};
    cfg = load_ok(NULL, NULL, only, 2);
    CHECK(get_int(cfg, "parallel.dp.size") == 4);
    CHECK_STR(get_str(cfg, "parallel.dp.strategy"), "zero3");
    CHECK(loom_config_file(cfg) == NULL);
    loom_config_free(cfg);

    /* An override repairs a bad file value: it is applied before checking. */
    const char *fix[] = {"train.batch=8"};
    cfg = load_ok("set_fix.cfg", "train = { batch = \"eight\"; };\n", fix, 1);
    CHECK(get_int(cfg, "train.batch") == 8);
    loom_config_free(cfg);
}

static void case_set_errors(void)
{
    const char *text = "train = { batch = 8; };\n";
    const char *a[] = {"train.batch=x"};
    expect_error("seterr.cfg", text, a, 1, -1,
                 "--set train.batch=x: train.batch: expected an integer, found a string (\"x\")");
    const char *b[] = {"nonsense"};
    expect_error("seterr.cfg", text, b, 1, -1,
                 "--set nonsense: expected path=value, e.g. --set train.lr=3e-4");
    const char *c[] = {"train.bacth=8"};
    expect_error("seterr.cfg", text, c, 1, -1,
                 "--set train.bacth=8: train.bacth: unknown setting; did you mean 'train.batch'?");
    const char *d[] = {"train.batch.x=1"};
    expect_error("seterr.cfg", text, d, 1, -1,
                 "--set train.batch.x=1: train.batch is an integer (8), not a group");
    const char *e[] = {"bench.comms=[\"mpi\","};
    expect_error("seterr.cfg", text, e, 1, -1,
                 "--set bench.comms=[\"mpi\",: libconfig: syntax error");
    const char *f[] = {"train..lr=1"};
    expect_error("seterr.cfg", text, f, 1, -1,
                 "--set train..lr=1: 'train..lr' is not a setting path (names joined by dots, e.g. "
                 "parallel.dp.size)");
    const char *g[] = {"train.precision=fp8"};
    expect_error("seterr.cfg", text, g, 1, -1,
                 "--set train.precision=fp8: train.precision: expected one of fp32, bf16, fp16; "
                 "found \"fp8\"");
    const char *h[] = {"comm.timeout_s=soon"};
    expect_error("seterr.cfg", text, h, 1, -1,
                 "--set comm.timeout_s=soon: comm.timeout_s: expected a number, found a string "
                 "(\"soon\")");
    const char *i[] = {"bench.min_bytes=100", "bench.max_bytes=10"};
    expect_error("seterr.cfg", text, i, 2, -1,
                 "--set bench.max_bytes=10: bench.max_bytes: expected an integer >= "
                 "bench.min_bytes (100), found 10");
}

static void case_lists(void)
{
    loom_config *cfg = load_ok("lists.cfg",
                               "plugins = { path = [ \"build/lib/loom\", \"/opt/loom\" ]; };\n"
                               "bench = {\n"
                               "  ops = ( \"alltoall\" );\n"
                               "  max_bytes = 4294967296L;\n"
                               "  min_bytes = 8L;\n"
                               "};\n"
                               "parallel = { pp = { size = 2; stage_layers = [ 3, 1 ]; }; };\n",
                               NULL, 0);
    CHECK(loom_config_list_len(cfg, "plugins.path") == 2);
    CHECK_STR(loom_config_list_string(cfg, "plugins.path", 0), "build/lib/loom");
    CHECK_STR(loom_config_list_string(cfg, "plugins.path", 1), "/opt/loom");
    CHECK(loom_config_list_string(cfg, "plugins.path", 2) == NULL);
    CHECK(loom_config_list_string(cfg, "plugins.path", -1) == NULL);
    CHECK(loom_config_list_len(cfg, "bench.ops") == 1);
    CHECK_STR(loom_config_list_string(cfg, "bench.ops", 0), "alltoall");
    CHECK(get_int(cfg, "bench.max_bytes") == 4294967296LL);
    CHECK(get_int(cfg, "bench.min_bytes") == 8);
    CHECK(get_int(cfg, "parallel.pp.stage_layers[0]") == 3);
    CHECK(get_int(cfg, "parallel.pp.stage_layers[1]") == 1);
    int64_t v;
    /* Past the end of a list the user wrote is not found, not a default. */
    CHECK(loom_config_int(cfg, "parallel.pp.stage_layers[2]", &v) == LOOM_ERR_NOT_FOUND);
    CHECK_STR(loom_config_list_string(cfg, "bench.comms", 0), "auto"); /* default list */
    loom_config_free(cfg);

    /* libconfig wraps integers above 2^31 written without L; say so. */
    expect_error("wide.cfg", "bench = {\n  max_bytes = 4294967296;\n};\n", NULL, 0, 2,
                 "bench.max_bytes: integer 4294967296 does not fit; write 4294967296L (libconfig "
                 "reads numbers above 2^31 only with the L suffix)");
    expect_error("empty_ops.cfg", "bench = {\n  ops = [ ];\n};\n", NULL, 0, 2,
                 "bench.ops: expected a non-empty list, found []");
    expect_error("inf.cfg", "train = { lr = 1e400; };\n", NULL, 0, 1,
                 "train.lr: expected a finite number, found inf");
    expect_error("neg.cfg", "parallel = { pp = { stage_layers = [ 2, -1 ]; }; };\n", NULL, 0, 1,
                 "parallel.pp.stage_layers[1]: expected an integer >= 0, found -1");
}

/* data.train: one path or pattern, or a list of them; the data settings. */
static void case_files(void)
{
    loom_config *cfg = load_ok("files.cfg", "data = { train = [ \"a.bin\", \"b_*.bin\" ]; };\n",
                               NULL, 0);
    CHECK(loom_config_list_len(cfg, "data.train") == 2);
    CHECK_STR(loom_config_list_string(cfg, "data.train", 1), "b_*.bin");
    int shuffle = 0;
    CHECK(loom_config_bool(cfg, "data.shuffle", &shuffle) == LOOM_OK && shuffle == 1);
    CHECK(get_int(cfg, "data.readers") == 1 && get_int(cfg, "data.read_batch") == 0);
    loom_config_free(cfg);
    /* --set: a bare value is one pattern, commas and all; brackets make a list */
    const char *one[] = {"data.train=dir/a,b_*.bin"};
    cfg = load_ok(NULL, NULL, one, 1);
    CHECK(loom_config_list_len(cfg, "data.train") == -1);
    CHECK_STR(get_str(cfg, "data.train"), "dir/a,b_*.bin");
    loom_config_free(cfg);
    const char *list[] = {"data.train=[\"a.bin\", \"b.bin\"]", "data.readers=4"};
    cfg = load_ok(NULL, NULL, list, 2);
    CHECK(loom_config_list_len(cfg, "data.train") == 2);
    CHECK_STR(loom_config_list_string(cfg, "data.train", 0), "a.bin");
    CHECK(get_int(cfg, "data.readers") == 4);
    loom_config_free(cfg);
    expect_error("files2.cfg", "data = {\n  train = 5;\n};\n", NULL, 0, 2,
                 "data.train: expected a path or glob pattern (a string), or a list of them, "
                 "found an integer (5)");
    expect_error("files3.cfg", "data = { train = [ \"a.bin\", \"\" ]; };\n", NULL, 0, 1,
                 "data.train[1]: expected a non-empty string, found \"\"");
    expect_error("files4.cfg", "data = { train = [ ]; };\n", NULL, 0, 1,
                 "data.train: expected a non-empty list, found []");
    expect_error("files5.cfg", "data = { readers = 0; };\n", NULL, 0, 1,
                 "data.readers: expected an integer >= 1, found 0");
    expect_error("files6.cfg", "data = { read_batch = -2; };\n", NULL, 0, 1,
                 "data.read_batch: expected an integer >= 0, found -2");
}

static const loom_setting_spec ucx_specs[] = {
    {.name = "progress_thread", .type = LOOM_SETTING_BOOL, .default_value = "false",
     .help = "poll the worker from a thread"},
    {.name = "tls", .type = LOOM_SETTING_STRING, .default_value = "all", .help = "UCX_TLS"},
    {.name = "rndv_thresh", .type = LOOM_SETTING_INT, .default_value = "8192",
     .help = "rendezvous threshold, bytes"},
    {.name = "alpha", .type = LOOM_SETTING_FLOAT, .default_value = "0.5", .help = "a float"},
    {0},
};

/* A plugin's rules (ABI 1.3). */
static const loom_setting_spec ruled[] = {
    {.name = "servers", .type = LOOM_SETTING_STRING, .default_value = "one", .help = "",
     .allowed = (const char *const[]){"one", "sharded", NULL}},
    {.name = "buckets", .type = LOOM_SETTING_INT, .default_value = "4", .help = "",
     .bounds = LOOM_SETTING_MIN | LOOM_SETTING_MAX, .min = 1, .max = 64},
    {.name = "ratio", .type = LOOM_SETTING_FLOAT, .default_value = "0.5", .help = "",
     .bounds = LOOM_SETTING_ABOVE_MIN, .min = 0},
    {0},
};

static void case_plugin_group(void)
{
    /* Unknown name in a plugin's group: nothing at load, an error at check. */
    const char *path = write_cfg("ucx.cfg", "comm = {\n"
                                            "  default = \"ucx\";\n"
                                            "  ucx = {\n"
                                            "    progres_thread = true;\n"
                                            "  };\n"
                                            "};\n");
    loom_config *cfg = NULL;
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_ERR_INVALID);
    char want[512];
    snprintf(want, sizeof want,
             "%s:4: comm.ucx.progres_thread: unknown setting; did you mean "
             "'comm.ucx.progress_thread'?",
             path);
    CHECK_STR(loom_last_error(), want);
    loom_config_free(cfg);

    /* Nothing close: list what the plugin takes. */
    path = write_cfg("ucx2.cfg", "comm = { ucx = { zzzz = 1; }; };\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:1: comm.ucx.zzzz: unknown setting (valid here: progress_thread, tls, "
             "rndv_thresh, alpha)",
             path);
    CHECK_STR(loom_last_error(), want);
    loom_config_free(cfg);

    /* Wrong type. */
    path = write_cfg("ucx3.cfg", "comm = {\n  ucx = {\n    rndv_thresh = \"big\";\n  };\n};\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:3: comm.ucx.rndv_thresh: expected an integer, found a string (\"big\")", path);
    CHECK_STR(loom_last_error(), want);
    loom_config_free(cfg);

    /* Allowed values with a suggestion, bounds, both with the file and line. */
    path = write_cfg("rules.cfg", "parallel = {\n  dp = {\n    servers = \"shardid\";\n  };\n};\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "parallel.dp", ruled, NULL) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:3: parallel.dp.servers: expected one of one, sharded; found \"shardid\" (did "
             "you mean \"sharded\"?)", path);
    CHECK_STR(loom_last_error(), want);
    loom_config_free(cfg);
    path = write_cfg("rules2.cfg", "parallel = { dp = { buckets = 65; }; };\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "parallel.dp", ruled, NULL) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want, "%s:1: parallel.dp.buckets: expected an integer in [1, 64], found 65",
             path);
    CHECK_STR(loom_last_error(), want);
    loom_config_free(cfg);
    const char *zero_ratio[] = {"parallel.dp.ratio=0"};
    CHECK(loom_config_load(NULL, zero_ratio, 1, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "parallel.dp", ruled, NULL) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(),
              "--set parallel.dp.ratio=0: parallel.dp.ratio: expected a number > 0, found 0");
    loom_config_free(cfg);
    char rules[64];
    loom_config_spec_rules(&ruled[0], rules, sizeof rules);
    CHECK_STR(rules, "one | sharded");
    loom_config_spec_rules(&ruled[1], rules, sizeof rules);
    CHECK_STR(rules, "1 <= x <= 64");

    /* Set values and defaults; int for float is fine. */
    path = write_cfg("ucx4.cfg", "comm = { ucx = { progress_thread = true; alpha = 2; }; };\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_OK);
    int b = 0;
    CHECK(loom_config_bool(cfg, "comm.ucx.progress_thread", &b) == LOOM_OK && b == 1);
    CHECK_STR(get_str(cfg, "comm.ucx.tls"), "all");
    CHECK(get_int(cfg, "comm.ucx.rndv_thresh") == 8192);
    CHECK(get_float(cfg, "comm.ucx.alpha") == 2.0);
    CHECK_STR(loom_config_where(cfg, "comm.ucx.tls"), "default");
    loom_config_free(cfg);

    /* An absent group is all defaults; before the check, its reads fail. */
    cfg = load_ok(NULL, NULL, NULL, 0);
    int64_t v;
    CHECK(loom_config_int(cfg, "comm.ucx.rndv_thresh", &v) == LOOM_ERR_NOT_FOUND);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_OK);
    CHECK(get_int(cfg, "comm.ucx.rndv_thresh") == 8192);
    CHECK(loom_config_bool(cfg, "comm.ucx.progress_thread", &b) == LOOM_OK && b == 0);
    loom_config_free(cfg);

    /* --set into a plugin group before its types are known: re-read with
     * them (tls=0 is the string "0", not an integer). */
    const char *sets[] = {"comm.ucx.tls=0", "comm.ucx.rndv_thresh=65536"};
    cfg = load_ok(NULL, NULL, sets, 2);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_OK);
    CHECK_STR(get_str(cfg, "comm.ucx.tls"), "0");
    CHECK(get_int(cfg, "comm.ucx.rndv_thresh") == 65536);
    /* A second instance of the plugin checks the group again: strings read
     * before stay valid (same pointers), values stay. */
    const char *tls = get_str(cfg, "comm.ucx.tls");
    const char *saved_alpha_where = loom_config_where(cfg, "comm.ucx.tls");
    CHECK_STR(saved_alpha_where, "--set comm.ucx.tls=0");
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_OK);
    CHECK(get_str(cfg, "comm.ucx.tls") == tls);
    loom_config_free(cfg);
    const char *bad[] = {"comm.ucx.progress_thread=maybe"};
    cfg = load_ok(NULL, NULL, bad, 1);
    CHECK(loom_config_check_group(cfg, "comm.ucx", ucx_specs, NULL) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "--set comm.ucx.progress_thread=maybe: comm.ucx.progress_thread: "
                                 "expected a boolean (true or false), found a string (\"maybe\")");
    loom_config_free(cfg);

    /* A strategy's settings share parallel.dp with the core's. */
    static const loom_setting_spec zero_specs[] = {
        {.name = "prefetch", .type = LOOM_SETTING_INT, .default_value = "1",
         .help = "layers gathered ahead"},
        {0},
    };
    static const char *const skip[] = {"size", "strategy", NULL};
    path = write_cfg("zero.cfg",
                     "parallel = { dp = { size = 2; strategy = \"zero3\"; prefetch = 3; }; };\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "parallel.dp", zero_specs, skip) == LOOM_OK);
    CHECK(get_int(cfg, "parallel.dp.prefetch") == 3);
    loom_config_free(cfg);
    path = write_cfg("zero2.cfg", "parallel = { dp = { size = 2; prefech = 3; }; };\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "parallel.dp", zero_specs, skip) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s:1: parallel.dp.prefech: unknown setting; did you mean 'parallel.dp.prefetch'?",
             path);
    CHECK_STR(loom_last_error(), want);
    loom_config_free(cfg);

    /* A setting without a default is required; a bad default is the
     * plugin's bug and says so. */
    static const loom_setting_spec req_specs[] = {
        {.name = "device", .type = LOOM_SETTING_STRING, .default_value = NULL,
         .help = "the device to use"},
        {0},
    };
    path = write_cfg("req.cfg", "comm = { default = \"mpi\"; };\n");
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "comm.fab", req_specs, NULL) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s: comm.fab.device: required setting is missing (it has no default); set it in the "
             "config or with --set comm.fab.device=VALUE",
             path);
    CHECK_STR(loom_last_error(), want);
    static const loom_setting_spec bad_specs[] = {
        {.name = "n", .type = LOOM_SETTING_INT, .default_value = "lots", .help = "a count"},
        {0},
    };
    CHECK(loom_config_check_group(cfg, "comm.bad", bad_specs, NULL) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(),
              "comm.bad.n: the plugin's default \"lots\" is not an integer (a bug in the plugin)");
    loom_config_free(cfg);
}

static void case_syntax(void)
{
    expect_error("syntax.cfg",
                 "train = {\n"
                 "  batch = 8;\n"
                 "  seq = = 64;\n"
                 "};\n",
                 NULL, 0, 3, "syntax error (libconfig: syntax error)");
    expect_error("syntax2.cfg", "a = 1;\na = 2;\n", NULL, 0, 2,
                 "syntax error (libconfig: duplicate setting name)");

    const char *path = "/nonexistent-loom-dir/x.cfg";
    loom_config *cfg = NULL;
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(),
              "cannot read config '/nonexistent-loom-dir/x.cfg': No such file or directory");
    CHECK(loom_config_load(tmpdir, NULL, 0, &cfg) == LOOM_ERR_INVALID);
    char want[256];
    snprintf(want, sizeof want, "cannot read config '%s': it is a directory, not a regular file",
             tmpdir);
    CHECK_STR(loom_last_error(), want);
}

static void case_checkpoint(void)
{
    expect_error("ckpt.cfg", "model = {\n  kind = \"gpt2\";\n  init = \"checkpoint\";\n};\n", NULL,
                 0, 3,
                 "model.checkpoint: required when model.init = \"checkpoint\"; name the llm.c "
                 "checkpoint file, e.g. model.checkpoint = \"gpt2_124M.bin\"");
    /* With a checkpoint the model's shape is the checkpoint's: no shape checks. */
    loom_config *cfg = load_ok("ckpt2.cfg",
                               "model = { init = \"checkpoint\"; checkpoint = \"gpt2_124M.bin\"; "
                               "vocab = 50257; };\n",
                               NULL, 0);
    CHECK_STR(get_str(cfg, "model.checkpoint"), "gpt2_124M.bin");
    /* The shape the checkpoint gives (loom_train_model_shape) reads like a
     * default that says where it came from; one the config sets is not
     * replaced. */
    CHECK(loom_config_derive_int(cfg, "model.layers", 12, "gpt2_124M.bin's header") == LOOM_OK);
    CHECK(get_int(cfg, "model.layers") == 12);
    CHECK(!loom_config_is_set(cfg, "model.layers"));
    CHECK_STR(loom_config_where(cfg, "model.layers"), "gpt2_124M.bin's header");
    CHECK_STR(loom_config_where(cfg, "model.heads"), "default");
    CHECK(loom_config_derive_int(cfg, "model.vocab", 50304, "x") == LOOM_ERR_INTERNAL);
    CHECK(get_int(cfg, "model.vocab") == 50257);
    loom_config_free(cfg);

    /* Decay on the matrices of no decay at all does nothing: refused. */
    expect_error("decay.cfg", "train = {\n  decay = \"matrices\";\n};\n", NULL, 0, 2,
                 "train.decay: \"matrices\" picks the tensors train.weight_decay applies to, and "
                 "train.weight_decay is 0; set a weight decay or remove train.decay");

    /* A checkpoint named but never read is refused, naming both settings. */
    expect_error("ckpt3.cfg", "model = {\n  layers = 2;\n  checkpoint = \"gpt2_124M.bin\";\n};\n",
                 NULL, 0, 3,
                 "model.checkpoint: \"gpt2_124M.bin\" is not read: model.init is \"random\" "
                 "(the default); set model.init = \"checkpoint\" to start from the file, or "
                 "remove model.checkpoint");
    const char *sets[] = {"model.checkpoint=x.bin"};
    expect_error("ckpt4.cfg", "model = { init = \"random\"; };\n", sets, 1, -1,
                 "--set model.checkpoint=x.bin: model.checkpoint: \"x.bin\" is not read: "
                 "model.init is \"random\"; set model.init = \"checkpoint\" to start from the "
                 "file, or remove model.checkpoint");
}

/* Validation settings without a validation set would do nothing: refused
 * where they are set; data.val = "" switches validation off with them. */
static void case_validation(void)
{
    expect_error("eval.cfg",
                 "data = { train = \"train.bin\"; };\n"
                 "train = {\n"
                 "  eval_every = 10;\n"
                 "};\n",
                 NULL, 0, 3,
                 "train.eval_every: validation needs a validation set; set data.val (llm.c "
                 "token shards), or remove train.eval_every");
    const char *batches[] = {"train.eval_batches=4"};
    expect_error("eval2.cfg", "", batches, 1, -1,
                 "--set train.eval_batches=4: train.eval_batches: validation needs a validation "
                 "set; set data.val (llm.c token shards), or remove train.eval_batches");
    const char *off[] = {"data.val="};
    loom_config *cfg = load_ok("eval3.cfg",
                               "data = { val = \"val.bin\"; };\ntrain = { eval_every = 10; };\n",
                               off, 1);
    CHECK_STR(get_str(cfg, "data.val"), "");
    loom_config_free(cfg);
}

static void case_parse(void)
{
    loom_config *cfg = NULL;
    CHECK(loom_config_parse("train = {\n  batch = 2;\n};\n", "inline", NULL, 0, &cfg) == LOOM_OK);
    CHECK(get_int(cfg, "train.batch") == 2);
    CHECK_STR(loom_config_where(cfg, "train.batch"), "inline:2");
    CHECK(loom_config_file(cfg) == NULL);
    loom_config_free(cfg);
    CHECK(loom_config_parse("bench = {\n  iterz = 2;\n};\n", "inline", NULL, 0, &cfg) ==
          LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(),
              "inline:2: bench.iterz: unknown setting; did you mean 'bench.iters'?");
    CHECK(loom_config_parse("bench = {\n  iters = ;\n};\n", "inline", NULL, 0, &cfg) ==
          LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "inline:2: syntax error (libconfig: syntax error)");
}

/* Every .cfg in examples/ loads cleanly; bench.cfg says what the README says. */
static void case_examples(const char *dir)
{
    if (!dir) {
        fprintf(stderr, "examples: give the examples directory\n");
        failures++;
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        failures++;
        return;
    }
    int count = 0, saw_bench = 0, saw_train = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t n = strlen(ent->d_name);
        if (n < 5 || strcmp(ent->d_name + n - 4, ".cfg"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        loom_config *cfg = NULL;
        if (loom_config_load(path, NULL, 0, &cfg) != LOOM_OK) {
            fprintf(stderr, "example %s: %s\n", path, loom_last_error());
            failures++;
            continue;
        }
        count++;
        if (!strcmp(ent->d_name, "bench.cfg")) {
            saw_bench = 1;
            CHECK(loom_config_list_len(cfg, "bench.comms") == 1);
            CHECK_STR(loom_config_list_string(cfg, "bench.comms", 0), "auto");
            CHECK(loom_config_list_len(cfg, "bench.ops") == 7);
            CHECK(get_int(cfg, "bench.min_bytes") == 4);
            CHECK(get_int(cfg, "bench.max_bytes") == 4194304);
            CHECK(get_int(cfg, "bench.iters") == 20);
            CHECK(get_int(cfg, "bench.warmup") == 5);
            CHECK(get_float(cfg, "comm.timeout_s") == 30.0);
            CHECK(loom_config_list_len(cfg, "plugins.path") == 1);
            CHECK_STR(loom_config_list_string(cfg, "plugins.path", 0), "build/lib/loom");
        }
        if (!strcmp(ent->d_name, "train.cfg")) {
            saw_train = 1;
            CHECK(get_int(cfg, "parallel.dp.size") == 4);
            CHECK_STR(get_str(cfg, "parallel.dp.strategy"), "ddp");
            /* Its plugin groups pass their plugins' checks too. */
            static const loom_setting_spec ucx[] = {
                {.name = "progress_thread", .type = LOOM_SETTING_BOOL, .default_value = "false",
                 .help = ""}, {0}};
            static const loom_setting_spec ddp[] = {
                {.name = "bucket_mb", .type = LOOM_SETTING_FLOAT, .default_value = "25", .help = ""},
                {.name = "overlap", .type = LOOM_SETTING_BOOL, .default_value = "true", .help = ""},
                {0}};
            static const loom_setting_spec tp[] = {
                {.name = "sequence_parallel", .type = LOOM_SETTING_BOOL, .default_value = "false",
                 .help = ""}, {0}};
            static const char *const skip[] = {"size", "strategy", NULL};
            CHECK(loom_config_check_group(cfg, "comm.ucx", ucx, NULL) == LOOM_OK);
            CHECK(loom_config_check_group(cfg, "parallel.dp", ddp, skip) == LOOM_OK);
            CHECK(loom_config_check_group(cfg, "parallel.tp", tp, skip) == LOOM_OK);
        }
        loom_config_free(cfg);
    }
    closedir(d);
    CHECK(saw_bench && saw_train && count >= 2);
}

/* ------------------------------------------------------------ main */

/* An integer the code reads into an int must fit one: cut to 32 bits,
 * train.batch = 4294967304 would train with a batch of 8. Settings read
 * into 64 bits (train.steps, the byte counts) take the wide value. */
static void case_int_range(void)
{
    const char *text = "train = { seq = 32; };\n";
    const char *batch[] = {"train.batch=4294967304"};
    expect_error("int.cfg", text, batch, 1, -1,
                 "--set train.batch=4294967304: train.batch: expected an integer <= 2147483647 "
                 "(the limit of the C int it is read into), found 4294967304");
    const char *layers[] = {"model.layers=2147483648"};
    expect_error("int.cfg", text, layers, 1, -1,
                 "--set model.layers=2147483648: model.layers: expected an integer <= "
                 "2147483647 (the limit of the C int it is read into), found 2147483648");
    /* the schema's own bound is the one to name when both are broken */
    const char *negative[] = {"train.batch=-4294967304"};
    expect_error("int.cfg", text, negative, 1, -1,
                 "--set train.batch=-4294967304: train.batch: expected an integer >= 1, found "
                 "-4294967304");
    expect_error("int_file.cfg", "train = {\n  batch = 4294967304L;\n};\n", NULL, 0, 2,
                 "train.batch: expected an integer <= 2147483647 (the limit of the C int it is "
                 "read into), found 4294967304");
    expect_error("int_list.cfg", "parallel = { pp = { stage_layers = ( 1, 4294967297L ); }; };\n",
                 NULL, 0, 1,
                 "parallel.pp.stage_layers[1]: expected an integer <= 2147483647 (the limit of "
                 "the C int it is read into), found 4294967297");
    const char *fits[] = {"train.batch=2147483647", "train.steps=4294967304",
                          "memory.host_limit=8589934592", "model.seed=-9000000000"};
    loom_config *cfg = load_ok("int.cfg", text, fits, 4);
    CHECK(get_int(cfg, "train.batch") == 2147483647);
    CHECK(get_int(cfg, "train.steps") == 4294967304LL);
    CHECK(get_int(cfg, "memory.host_limit") == 8589934592LL);
    CHECK(get_int(cfg, "model.seed") == -9000000000LL);
    loom_config_free(cfg);
}

/* A layer's settings as a test adds them: extra.low <= extra.high. */
static int check_extra(const loom_config *cfg)
{
    int64_t low = 0, high = 0;
    loom_config_int(cfg, "extra.low", &low);
    loom_config_int(cfg, "extra.high", &high);
    if (low > high)
        return loom_config_fail_relation(cfg, "extra.high", "extra.low",
                                         "expected an integer >= extra.low (%lld), found %lld",
                                         (long long)low, (long long)high);
    return LOOM_OK;
}

static const loom_config_setting extra_settings[] = {
    LOOM_CFG_SETTING("extra.low", LOOM_CFG_INT, "1", .lo = 0, .flags = LOOM_CFG_GE,
                     .help = "the lower one"),
    LOOM_CFG_SETTING("extra.high", LOOM_CFG_INT, "2", .help = "the higher one"),
};

static const loom_config_settings extra = {
    .settings = extra_settings,
    .count = LOOM_ARRAY_LEN(extra_settings),
    .check = check_extra,
};

/* The runtime alone knows its own settings, none of the layers above it;
 * what a layer adds is checked like them, its relations included, and
 * listed in the order added, the runtime's own last unless added. */
static void case_layers(void)
{
    expect_error("alone.cfg", "train = { batch = 8; };\n", NULL, 0, 1,
                 "train: unknown group (valid here: plugins, parallel, comm, memory)");
    expect_error("alone2.cfg", "model = { layers = 2; };\n", NULL, 0, 1,
                 "model: unknown group (valid here: plugins, parallel, comm, memory)");
    expect_error("alone3.cfg", "bench = { iters = 2; };\n", NULL, 0, 1,
                 "bench: unknown group (valid here: plugins, parallel, comm, memory)");
    loom_config *cfg = load_ok(NULL, NULL, NULL, 0);
    int64_t v;
    CHECK(loom_config_int(cfg, "train.batch", &v) == LOOM_ERR_NOT_FOUND);
    CHECK(get_int(cfg, "parallel.dp.size") == 1);
    CHECK(!loom_config_core_owns("train") && loom_config_core_owns("parallel.dp.size"));
    loom_config_free(cfg);

    CHECK(loom_config_add_settings(&extra) == LOOM_OK);
    CHECK(loom_config_add_settings(&extra) == LOOM_OK); /* once is enough */
    cfg = load_ok(NULL, NULL, NULL, 0);
    CHECK(get_int(cfg, "extra.low") == 1 && get_int(cfg, "extra.high") == 2);
    loom_config_free(cfg);
    expect_error("extra.cfg", "\nextra = {\n  low = 5;\n};\n", NULL, 0, 3,
                 "extra.high: expected an integer >= extra.low (5), found 2");
    const char *high[] = {"extra.high=3"};
    expect_error("extra2.cfg", "extra = {\n  low = 5;\n};\n", high, 1, -1,
                 "--set extra.high=3: extra.high: expected an integer >= extra.low (5), found 3");
    expect_error("extra3.cfg", "extra = { low = -1; };\n", NULL, 0, 1,
                 "extra.low: expected an integer >= 0, found -1");
    expect_error("extra4.cfg", "extra = { hihg = 1; };\n", NULL, 0, 1,
                 "extra.hihg: unknown setting; did you mean 'extra.high'?");
    expect_error("extra5.cfg", "foo = 1;\n", NULL, 0, 1,
                 "foo: unknown setting (valid here: extra, plugins, parallel, comm, memory)");

    CHECK(loom_cli_add_settings() == LOOM_OK);
    expect_error("all.cfg", "foo = 1;\n", NULL, 0, 1,
                 "foo: unknown setting (valid here: extra, plugins, model, data, train, "
                 "parallel, comm, memory, bench)");
    cfg = load_ok("all2.cfg", "train = { batch = 8; };\nextra = { high = 7; };\n", NULL, 0);
    CHECK(get_int(cfg, "train.batch") == 8 && get_int(cfg, "extra.high") == 7);
    loom_config_free(cfg);
}

typedef struct test_case {
    const char *name;
    void (*run)(void);
} test_case;

/* A string setting's default, written bare ("one", as in the plugin
 * guide) or quoted as in a config ("\"one\"", as older plugins did), is
 * the same value; an empty one either way is "". */
static const loom_setting_spec quoting[] = {
    {.name = "bare", .type = LOOM_SETTING_STRING, .default_value = "one", .help = "",
     .allowed = (const char *const[]){"one", "two", NULL}},
    {.name = "quoted", .type = LOOM_SETTING_STRING, .default_value = "\"one\"", .help = "",
     .allowed = (const char *const[]){"one", "two", NULL}},
    {.name = "empty", .type = LOOM_SETTING_STRING, .default_value = "", .help = ""},
    {.name = "empty_quoted", .type = LOOM_SETTING_STRING, .default_value = "\"\"",
     .help = ""},
    {0},
};

static void case_quoted_default(void)
{
    const char *path = write_cfg("quoted.cfg", "comm = { quoting = { }; };\n");
    loom_config *cfg = NULL;
    CHECK(loom_config_load(path, NULL, 0, &cfg) == LOOM_OK);
    CHECK(loom_config_check_group(cfg, "comm.quoting", quoting, NULL) == LOOM_OK);
    CHECK_STR(get_str(cfg, "comm.quoting.bare"), "one");
    CHECK_STR(get_str(cfg, "comm.quoting.quoted"), "one");
    CHECK_STR(get_str(cfg, "comm.quoting.empty"), "");
    CHECK_STR(get_str(cfg, "comm.quoting.empty_quoted"), "");
    loom_config_free(cfg);
}

static const test_case cases[] = {
    {"defaults", case_defaults},
    {"typo", case_typo},
    {"wrong_type", case_wrong_type},
    {"bad_enum", case_bad_enum},
    {"unknown_group", case_unknown_group},
    {"ranges", case_ranges},
    {"set", case_set},
    {"set_errors", case_set_errors},
    {"lists", case_lists},
    {"files", case_files},
    {"plugin_group", case_plugin_group},
    {"quoted_default", case_quoted_default},
    {"syntax", case_syntax},
    {"checkpoint", case_checkpoint},
    {"parse", case_parse},
    {"validation", case_validation},
    {"int_range", case_int_range},
};

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d)
        return;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", tmpdir, ent->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(tmpdir);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "all";
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loom-config-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    int ran = 0;
    if (!strcmp(which, "layers")) {
        case_layers();
        ran = 1;
    } else if (loom_cli_add_settings() != LOOM_OK) {
        fprintf(stderr, "config_test: %s\n", loom_last_error());
        return 2;
    }
    if (!strcmp(which, "examples")) {
        case_examples(argc > 2 ? argv[2] : NULL);
        ran = 1;
    }
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++)
        if (!strcmp(which, "all") || !strcmp(which, cases[i].name)) {
            cases[i].run();
            ran++;
        }
    remove_tmpdir();
    if (!ran) {
        fprintf(stderr, "config_test: no case '%s'\n", which);
        return 2;
    }
    if (failures) {
        fprintf(stderr, "config_test %s: %d check(s) failed\n", which, failures);
        return 1;
    }
    printf("config_test %s: ok\n", which);
    return 0;
}
