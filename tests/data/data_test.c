/* The data loader (model/dataloader.h): llm.c's generator and shuffle
 * against numbers from llm.c's own rand.h, the unshuffled order window by
 * window, the global batch on every dp x grad_accum layout, every bad input
 * with its exact message, the position saved and restored on another
 * layout, rewind, and a sequence rank's positions.
 *
 *   data_test CASE                        one case ("all" runs every case)
 *   data_test dump B T SHUFFLE READERS READ_BATCH DP K STEPS FILE...
 *       print each step's global batch as the dp x K loaders give it, in
 *       tests/data/llmc_loader.py's format (reference_test.sh compares) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/status.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "model/mt19937.h"
#include "runtime/log.h"
#include "check.h"

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
    static char paths[16][160];
    static int next;
    char *path = paths[next++ % 16];
    snprintf(path, 160, "%s/%s", tmpdir, name);
    return path;
}

/* A shard of n tokens, token i = base + i: every token says where it is. */
static const char *position_shard(const char *name, int n, int base)
{
    uint16_t *tokens = malloc((size_t)n * sizeof *tokens);
    for (int i = 0; i < n; i++)
        tokens[i] = (uint16_t)(base + i);
    const char *path = tmp_path(name);
    if (loom_shard_write(path, tokens, (size_t)n) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_last_error());
        exit(2);
    }
    free(tokens);
    return path;
}

static loom_dataset open_files(const char *const *paths, int n, int vocab)
{
    loom_dataset ds;
    if (loom_dataset_open(&ds, "data.train", "test.cfg:3", paths, n, vocab) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_last_error());
        exit(2);
    }
    return ds;
}

/* The next step's global batch from dp loaders of K micro-batches each:
 * sequence s's T inputs and last target at out[s*(T+1)]. Also checks that
 * every target is the next input. */
static int global_batch(loom_dataloader *dls, int dp, int K, int *out)
{
    const int B = dls[0].order.batch, T = dls[0].order.seq, per = B / (dp * K);
    int *in = malloc((size_t)per * T * sizeof *in), *tg = malloc((size_t)per * T * sizeof *tg);
    int rc = LOOM_OK;
    for (int k = 0; k < K && rc == LOOM_OK; k++)
        for (int d = 0; d < dp && rc == LOOM_OK; d++) {
            if ((rc = loom_dataloader_next(&dls[d], in, tg)) != LOOM_OK)
                break;
            int first = k * (B / K) + d * per; /* dataloader.h's slice */
            for (int b = 0; b < per; b++) {
                int *seq = out + (size_t)(first + b) * (T + 1);
                for (int t = 0; t < T; t++) {
                    seq[t] = in[b * T + t];
                    if (t + 1 < T && tg[b * T + t] != in[b * T + t + 1]) {
                        fprintf(stderr, "a target is not the next input\n");
                        failures++;
                    }
                }
                seq[T] = tg[b * T + T - 1];
            }
        }
    free(in);
    free(tg);
    return rc;
}

/* dp loaders of one order. */
static void init_layout(loom_dataloader *dls, const loom_dataset *ds, const loom_data_order *o,
                        int dp, int K)
{
    for (int d = 0; d < dp; d++)
        if (loom_dataloader_init(&dls[d], ds, o, d, dp, K) != LOOM_OK) {
            fprintf(stderr, "%s\n", loom_last_error());
            exit(2);
        }
}

static void free_layout(loom_dataloader *dls, int dp)
{
    for (int d = 0; d < dp; d++)
        loom_dataloader_free(&dls[d]);
}

/* ------------------------------------------------------------ mt19937 */

static void expect_order(const int *got, const int *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "%s: index %d is %d, want %d\n", what, i, got[i], want[i]);
            failures++;
            return;
        }
}

/* The numbers come from llm.c's llmc/rand.h compiled as it is (outside this
 * repository): manual_seed, randint32, init_identity_permutation and
 * random_permutation. */
static void case_mt19937(void)
{
    loom_mt19937 rng;
    loom_mt19937_seed(&rng, 137); /* rand.h's own example, torch's too */
    CHECK(loom_mt19937_draw(&rng) == 4053805790u);
    CHECK(loom_mt19937_draw(&rng) == 2173880614u);
    CHECK(loom_mt19937_draw(&rng) == 380293709u);
    /* past the first refill of 624 words */
    loom_mt19937_seed(&rng, 42);
    uint32_t x = 0;
    for (int i = 0; i < 700; i++)
        x = loom_mt19937_draw(&rng);
    CHECK(x == 4009078418u);

    /* llm.c's shuffle of process 0 and 1 (seeds 42, 43): 5 shards, then 7
     * samples of the first, then the next epoch's shards, which permute the
     * previous order, not the identity. */
    const struct {
        uint32_t seed;
        int shards[5], samples[7], again[5];
        uint32_t next;
    } want[] = {
        {42, {4, 0, 1, 3, 2}, {3, 2, 1, 6, 0, 5, 4}, {0, 4, 2, 1, 3}, 3720198231u},
        {43, {4, 1, 2, 0, 3}, {6, 5, 1, 3, 0, 2, 4}, {3, 0, 4, 2, 1}, 2324274007u},
    };
    for (int c = 0; c < 2; c++) {
        int shards[5], samples[7];
        loom_mt19937_seed(&rng, want[c].seed);
        loom_identity_permutation(shards, 5);
        loom_random_permutation(shards, 5, &rng);
        expect_order(shards, want[c].shards, 5, "shards");
        loom_identity_permutation(samples, 7);
        loom_random_permutation(samples, 7, &rng);
        expect_order(samples, want[c].samples, 7, "samples");
        loom_random_permutation(shards, 5, &rng);
        expect_order(shards, want[c].again, 5, "the next epoch's shards");
        CHECK(loom_mt19937_draw(&rng) == want[c].next);
    }
    /* a permutation of one draws nothing */
    loom_mt19937 a, b;
    loom_mt19937_seed(&a, 7);
    loom_mt19937_seed(&b, 7);
    int one = 0;
    loom_random_permutation(&one, 1, &a);
    CHECK(one == 0 && loom_mt19937_draw(&a) == loom_mt19937_draw(&b));
}

/* ---------------------------------------------------------- sequential */

static void case_sequential(void)
{
    enum { B = 8, T = 5, STEPS = 7 };
    /* Room for 3 windows of B*T+1 and 7 tokens more, too few for a 4th:
     * the windows start at 0, 40, 80, then wrap to 0 (llm.c's order,
     * unshuffled, one reader reading the whole batch). */
    const char *path = position_shard("seq.bin", 3 * B * T + 8, 0);
    loom_dataset ds = open_files(&path, 1, 65536);
    const int want_start[STEPS] = {0, 40, 80, 0, 40, 80, 0};
    const int dps[] = {1, 2, 4}, ks[] = {1, 2};
    loom_data_order o = {.batch = B, .seq = T, .shuffle = 0, .readers = 1, .read_batch = 0};
    static int batch[B * (T + 1)];
    for (int di = 0; di < 3; di++)
        for (int ki = 0; ki < 2; ki++) {
            loom_dataloader dls[4];
            init_layout(dls, &ds, &o, dps[di], ks[ki]);
            for (int step = 0; step < STEPS; step++) {
                CHECK(global_batch(dls, dps[di], ks[ki], batch) == LOOM_OK);
                int bad = 0;
                for (int s = 0; s < B; s++)
                    for (int t = 0; t <= T; t++)
                        bad += batch[s * (T + 1) + t] != want_start[step] + s * T + t;
                if (bad) {
                    fprintf(stderr, "dp %d K %d step %d: %d tokens wrong\n", dps[di], ks[ki],
                            step, bad);
                    failures++;
                }
            }
            free_layout(dls, dps[di]);
        }
    loom_dataset_close(&ds);

    /* The wrap is exact: a window needs B*T+1 tokens. With 2*B*T tokens
     * only the window at 0 fits; with one more, the one at B*T too. */
    const int sizes[2] = {2 * B * T, 2 * B * T + 1}, second[2] = {0, B * T};
    for (int si = 0; si < 2; si++) {
        const char *edge_path = position_shard("edge.bin", sizes[si], 0);
        loom_dataset edge = open_files(&edge_path, 1, 65536);
        loom_dataloader dl;
        init_layout(&dl, &edge, &o, 1, 1);
        for (int step = 0; step < 4; step++) {
            int want = step % 2 ? second[si] : 0;
            CHECK(global_batch(&dl, 1, 1, batch) == LOOM_OK);
            CHECK(batch[0] == want && batch[B * (T + 1) - 1] == want + B * T);
        }
        loom_dataloader_free(&dl);
        loom_dataset_close(&edge);
    }

    /* Two files in order: the first's 2 samples, the second's 1, then the
     * first again (a new epoch); token = 1000 * file + offset. */
    const char *two[2] = {position_shard("two-a.bin", 2 * B * T + 1, 0),
                          position_shard("two-b.bin", B * T + 1, 1000)};
    loom_dataset pair = open_files(two, 2, 65536);
    loom_dataloader dl;
    init_layout(&dl, &pair, &o, 1, 1);
    const int starts[5] = {0, 40, 1000, 0, 40};
    for (int step = 0; step < 5; step++) {
        CHECK(global_batch(&dl, 1, 1, batch) == LOOM_OK);
        CHECK(batch[0] == starts[step] && batch[B * (T + 1) - 1] == starts[step] + B * T);
    }
    loom_dataloader_free(&dl);

    /* Two readers unshuffled, 2 sequences a read: reader r's sample i is at
     * i*2*2*T + r*2*T, so a step of 8 sequences is 2 reads of both:
     * tokens 0.. of the first read, then 20.. (the next sample). */
    loom_data_order two_readers = {.batch = B, .seq = T, .shuffle = 0, .readers = 2,
                                   .read_batch = 2};
    init_layout(&dl, &pair, &two_readers, 1, 1);
    CHECK(global_batch(&dl, 1, 1, batch) == LOOM_OK);
    for (int s = 0; s < B; s++) /* read k = s/4, reader r = s/2 % 2, j = s % 2 */
        CHECK(batch[s * (T + 1)] == (s / 4) * 20 + ((s / 2) % 2) * 10 + (s % 2) * T);
    loom_dataloader_free(&dl);
    loom_dataset_close(&pair);
}

/* -------------------------------------------------------------- errors */

static void expect_dataset_error(const char *const *paths, int n, int status, const char *want)
{
    loom_clear_error();
    loom_dataset ds;
    CHECK(loom_dataset_open(&ds, "data.train", "test.cfg:3", paths, n, 256) == status);
    CHECK(ds.nfiles == 0 && ds.paths == NULL);
    CHECK_STR(loom_last_error(), want);
}

static void case_errors(void)
{
    char want[1024];
    /* a pattern that matches nothing, named */
    const char *none = tmp_path("nothing_*.bin");
    snprintf(want, sizeof want, "test.cfg:3: data.train: no file matches \"%s\"; check the "
             "pattern and the directory it names", none);
    expect_dataset_error(&none, 1, LOOM_ERR_NOT_FOUND, want);
    /* a plain path that does not exist: the open's own message */
    const char *missing = tmp_path("missing.bin");
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", missing);
    expect_dataset_error(&missing, 1, LOOM_ERR_NOT_FOUND, want);
    expect_dataset_error(NULL, 0, LOOM_ERR_INVALID,
                         "data.train: no token shard given; set data.train = "
                         "\"examples/data/corpus.bin\" (llm.c token shards: a path, a glob "
                         "pattern, or a list of them)");

    /* bad magic in the 2nd of 3 files matched by one pattern */
    position_shard("three_0.bin", 300, 0);
    const char *bad = position_shard("three_1.bin", 300, 0);
    position_shard("three_2.bin", 300, 0);
    FILE *f = fopen(bad, "r+b");
    int32_t magic = 1234;
    CHECK(f && fwrite(&magic, sizeof magic, 1, f) == 1 && fclose(f) == 0);
    const char *three = tmp_path("three_*.bin");
    snprintf(want, sizeof want, "%s: not an llm.c token shard (magic 1234, want 20240520)", bad);
    expect_dataset_error(&three, 1, LOOM_ERR_INVALID, want);

    /* a truncated file, in a list after a good one */
    const char *list[2] = {position_shard("good.bin", 300, 0), position_shard("cut.bin", 300, 0)};
    CHECK(truncate(list[1], 1024 + 2 * 300 - 3) == 0);
    snprintf(want, sizeof want, "%s: truncated: 597 bytes of tokens, want 600 for the 300 "
             "tokens of the header", list[1]);
    expect_dataset_error(list, 2, LOOM_ERR_INVALID, want);

    /* a token past the vocabulary: found when read, naming file and offset */
    uint16_t tokens[300];
    for (int i = 0; i < 300; i++)
        tokens[i] = (uint16_t)(i % 200);
    tokens[123] = 300;
    const char *big = tmp_path("vocab.bin");
    CHECK(loom_shard_write(big, tokens, 300) == LOOM_OK);
    loom_dataset ds;
    CHECK(loom_dataset_open(&ds, "data.train", "test.cfg:3", &big, 1, 256) == LOOM_OK);
    loom_data_order o = {.batch = 4, .seq = 10, .shuffle = 0, .readers = 1, .read_batch = 0};
    loom_dataloader dl;
    CHECK(loom_dataloader_init(&dl, &ds, &o, 0, 1, 1) == LOOM_OK);
    int in[40], tg[40];
    CHECK(loom_dataloader_next(&dl, in, tg) == LOOM_OK);                /* tokens 0..40 */
    CHECK(loom_dataloader_next(&dl, in, tg) == LOOM_OK);                /* 40..80 */
    CHECK(loom_dataloader_next(&dl, in, tg) == LOOM_OK);                /* 80..120 */
    CHECK(loom_dataloader_next(&dl, in, tg) == LOOM_ERR_INVALID);       /* 120..160 */
    snprintf(want, sizeof want, "%s: token 300 at position 123 is >= the vocabulary size 256 "
             "(model.vocab)", big);
    CHECK_STR(loom_last_error(), want);
    loom_dataloader_free(&dl);

    /* the batch against readers x read_batch, and dp x K */
    loom_data_order r3 = {.batch = 8, .seq = 10, .shuffle = 1, .readers = 3, .read_batch = 0};
    CHECK(loom_dataloader_init(&dl, &ds, &r3, 0, 1, 1) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "train.batch 8 does not divide by data.readers 3 (data.read_batch "
                                 "0 reads train.batch / data.readers sequences per reader); make "
                                 "train.batch a multiple of 3 or set data.read_batch");
    r3.read_batch = 2;
    CHECK(loom_dataloader_init(&dl, &ds, &r3, 0, 1, 1) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "train.batch 8 is not a multiple of data.readers 3 × "
                                 "data.read_batch 2 = 6; a step is whole reads of every reader");
    CHECK(loom_dataloader_init(&dl, &ds, &o, 0, 3, 1) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "train.batch 4 does not divide by parallel.dp.size 3 × "
                                 "train.grad_accum 1; make it a multiple of 3");
    CHECK(loom_dataloader_init(&dl, &ds, &o, 2, 2, 1) == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "data loader: dp rank 2 is outside 0..1");
    /* every file holds one sample of every reader */
    loom_data_order wide = {.batch = 6, .seq = 50, .shuffle = 1, .readers = 3, .read_batch = 2};
    CHECK(loom_dataloader_init(&dl, &ds, &wide, 0, 1, 1) == LOOM_ERR_INVALID);
    snprintf(want, sizeof want, "data.train: %s holds 300 tokens, fewer than one sample of 301 "
             "(data.readers 3 × data.read_batch 2 × train.seq 50 + 1); use fewer or smaller "
             "reads, or leave the file out", big);
    CHECK_STR(loom_last_error(), want);
    loom_dataset_close(&ds);
}

/* ------------------------------------------------------------ position */

/* Random tokens in files of different sizes. */
static loom_dataset random_files(int n)
{
    static const int sizes[] = {700, 333, 1210, 250, 480};
    const char *paths[5];
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        uint16_t *tokens = malloc((size_t)sizes[i] * sizeof *tokens);
        for (int t = 0; t < sizes[i]; t++) {
            x = x * 1664525u + 1013904223u;
            tokens[t] = (uint16_t)(x >> 24);
        }
        char name[32];
        snprintf(name, sizeof name, "rand_%d.bin", i);
        paths[i] = tmp_path(name);
        CHECK(loom_shard_write(paths[i], tokens, (size_t)sizes[i]) == LOOM_OK);
        free(tokens);
    }
    return open_files(paths, n, 256);
}

static void case_position(void)
{
    enum { B = 12, T = 8, MAX = B * (T + 1) };
    loom_dataset ds = random_files(5);
    loom_data_order o = {.batch = B, .seq = T, .shuffle = 1, .readers = 3, .read_batch = 2};
    /* the uninterrupted run: 40 steps on one rank, several epochs */
    static int whole[40][MAX], got[MAX];
    loom_dataloader one;
    init_layout(&one, &ds, &o, 1, 1);
    unsigned char *saved = NULL;
    size_t size = 0;
    for (int step = 0; step < 40; step++) {
        if (step == 13)
            CHECK(loom_dataloader_save(&one, &saved, &size) == LOOM_OK);
        CHECK(global_batch(&one, 1, 1, whole[step]) == LOOM_OK);
    }
    loom_dataloader_free(&one);
    /* Resumed at step 13 on dp 3 x K 2 and on dp 2: the same batches. */
    const int dps[] = {3, 2}, ks[] = {2, 1};
    for (int l = 0; l < 2; l++) {
        loom_dataloader dls[3];
        init_layout(dls, &ds, &o, dps[l], ks[l]);
        for (int d = 0; d < dps[l]; d++)
            CHECK(loom_dataloader_restore(&dls[d], saved, size, "ck") == LOOM_OK);
        int bad = 0;
        for (int step = 13; step < 40; step++) {
            CHECK(global_batch(dls, dps[l], ks[l], got) == LOOM_OK);
            bad += memcmp(got, whole[step], sizeof got) != 0;
        }
        if (bad) {
            fprintf(stderr, "resumed on dp %d K %d: %d steps differ\n", dps[l], ks[l], bad);
            failures++;
        }
        free_layout(dls, dps[l]);
    }
    /* Different settings are refused, naming the setting and both values. */
    const struct {
        loom_data_order o;
        const char *want;
    } other[] = {
        {{B, T, 0, 3, 2}, "--resume ck: data.shuffle is true in the checkpoint, false in the "
                          "config; the data order would differ: set it as the checkpoint has it, "
                          "or start afresh"},
        {{B, T, 1, 2, 2}, "--resume ck: data.readers is 3 in the checkpoint, 2 in the config; the "
                          "data order would differ: set it as the checkpoint has it, or start "
                          "afresh"},
        {{B, T, 1, 3, 4}, "--resume ck: data.read_batch is 2 in the checkpoint, 4 in the config; "
                          "the data order would differ: set it as the checkpoint has it, or start "
                          "afresh"},
        {{24, T, 1, 3, 2}, "--resume ck: train.batch is 12 in the checkpoint, 24 in the config; "
                           "the data order would differ: set it as the checkpoint has it, or start "
                           "afresh"},
        {{B, 4, 1, 3, 2}, "--resume ck: train.seq is 8 in the checkpoint, 4 in the config; the "
                          "data order would differ: set it as the checkpoint has it, or start "
                          "afresh"},
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        loom_dataloader dl;
        init_layout(&dl, &ds, &other[i].o, 1, 1);
        CHECK(loom_dataloader_restore(&dl, saved, size, "ck") == LOOM_ERR_INVALID);
        CHECK_STR(loom_last_error(), other[i].want);
        loom_dataloader_free(&dl);
    }
    /* other files: fewer, or another in a place */
    loom_dataset four = random_files(4);
    loom_dataloader dl;
    init_layout(&dl, &four, &o, 1, 1);
    CHECK(loom_dataloader_restore(&dl, saved, size, "ck") == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "--resume ck: data.train: the checkpoint read 5 files, the "
                                 "config names 4; the data order would differ: name the same "
                                 "files, or start afresh");
    loom_dataloader_free(&dl);
    loom_dataset_close(&four);
    const char *swapped[5] = {ds.paths[0], ds.paths[2], ds.paths[1], ds.paths[3], ds.paths[4]};
    loom_dataset moved = open_files(swapped, 5, 256);
    init_layout(&dl, &moved, &o, 1, 1);
    CHECK(loom_dataloader_restore(&dl, saved, size, "ck") == LOOM_ERR_INVALID);
    char want[1024];
    snprintf(want, sizeof want, "--resume ck: data.train: file 2 is %s (333 tokens) in the "
             "checkpoint, %s (1210 tokens) in the config; the data order would differ: name the "
             "same files, or start afresh", ds.paths[1], ds.paths[2]);
    CHECK_STR(loom_last_error(), want);
    loom_dataloader_free(&dl);
    loom_dataset_close(&moved);
    /* damaged: cut short, or a shard order that is no permutation */
    init_layout(&dl, &ds, &o, 1, 1);
    CHECK(loom_dataloader_restore(&dl, saved, size - 5, "ck") == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "--resume ck: the checkpoint's data position is damaged (it ends "
                                 "early)");
    int32_t *last_order = (int32_t *)(void *)(saved + size - 5 * sizeof(int32_t));
    int32_t kept = last_order[0];
    last_order[0] = last_order[1];
    CHECK(loom_dataloader_restore(&dl, saved, size, "ck") == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "--resume ck: the checkpoint's data position is damaged (a "
                                 "reader's shard order is not a permutation of the files)");
    last_order[0] = kept;
    /* and a failed restore leaves the loader at the start */
    CHECK(global_batch(&dl, 1, 1, got) == LOOM_OK && !memcmp(got, whole[0], sizeof got));
    loom_dataloader_free(&dl);

    /* `loom ckpt info`'s lines */
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    loom_data_position_print(saved, size, mem);
    fclose(mem);
    CHECK(strstr(text, "  data      shuffled as llm.c, 3 readers × 2 sequences of 8 tokens per "
                       "read, train.batch 12; 5 files, 2973 tokens\n") != NULL);
    CHECK(strstr(text, "  reader 0  epoch ") != NULL && strstr(text, "  reader 2  epoch ") != NULL);
    free(text);
    /* a damaged file count is said, not allocated (found by fuzzing: 32 GiB) */
    uint32_t files_at = 8 + 4 + 5 * 4, kept_files, damaged_files = 0xffffffffu;
    memcpy(&kept_files, saved + files_at, 4);
    memcpy(saved + files_at, &damaged_files, 4);
    mem = open_memstream(&text, &text_len);
    loom_data_position_print(saved, size, mem);
    fclose(mem);
    CHECK(!strncmp(text, "  data      (the position is damaged: 4294967295 files and 3 readers in ",
                   strlen("  data      (the position is damaged: 4294967295 files and 3 readers in ")));
    free(text);
    memcpy(saved + files_at, &kept_files, 4);
    free(saved);
    loom_dataset_close(&ds);
}

/* A format 1 checkpoint's offset: only where it means the same order. */
static void case_offset(void)
{
    enum { B = 4, T = 10 };
    const char *path = position_shard("offset.bin", 10 * B * T + 1, 0);
    loom_dataset ds = open_files(&path, 1, 65536);
    loom_data_order o = {.batch = B, .seq = T, .shuffle = 0, .readers = 1, .read_batch = 0};
    loom_dataloader dl;
    init_layout(&dl, &ds, &o, 1, 1);
    static int batch[B * (T + 1)];
    CHECK(loom_dataloader_restore_offset(&dl, 3 * B * T, "old") == LOOM_OK);
    CHECK(global_batch(&dl, 1, 1, batch) == LOOM_OK && batch[0] == 3 * B * T);
    CHECK(loom_dataloader_restore_offset(&dl, 3 * B * T + 1, "old") == LOOM_ERR_INVALID);
    char want[1024];
    snprintf(want, sizeof want, "--resume old: its data offset 121 is no step of train.batch 4 × "
             "train.seq 10 in %s (401 tokens): the checkpoint was saved with other settings or "
             "data", path);
    CHECK_STR(loom_last_error(), want);
    loom_dataloader_free(&dl);
    o.shuffle = 1;
    init_layout(&dl, &ds, &o, 1, 1);
    CHECK(loom_dataloader_restore_offset(&dl, 0, "old") == LOOM_ERR_INVALID);
    CHECK_STR(loom_last_error(), "--resume old: a checkpoint of loom's format 1 holds only a token "
                                 "offset into one unshuffled shard; resume it with data.shuffle = "
                                 "false, data.readers = 1, data.read_batch = 0 and one file in "
                                 "data.train, or start afresh");
    loom_dataloader_free(&dl);
    loom_dataset_close(&ds);
}

/* --------------------------------------------------- rewind, positions */

static void case_rewind(void)
{
    enum { B = 12, T = 8, MAX = B * (T + 1) };
    loom_dataset ds = random_files(3);
    loom_data_order o = {.batch = B, .seq = T, .shuffle = 1, .readers = 2, .read_batch = 3};
    loom_dataloader dls[2];
    init_layout(dls, &ds, &o, 2, 1);
    static int first[3][MAX], got[MAX];
    for (int step = 0; step < 3; step++)
        CHECK(global_batch(dls, 2, 1, first[step]) == LOOM_OK);
    CHECK(memcmp(first[0], first[1], sizeof got) != 0);
    for (int step = 3; step < 50; step++) /* well into the next epochs */
        CHECK(global_batch(dls, 2, 1, got) == LOOM_OK);
    for (int d = 0; d < 2; d++)
        loom_dataloader_rewind(&dls[d]);
    for (int step = 0; step < 3; step++) {
        CHECK(global_batch(dls, 2, 1, got) == LOOM_OK);
        CHECK(memcmp(got, first[step], sizeof got) == 0);
    }
    free_layout(dls, 2);

    /* a sequence rank keeps its positions of every sequence */
    loom_dataloader dl;
    init_layout(&dl, &ds, &o, 1, 1);
    loom_dataloader sp;
    init_layout(&sp, &ds, &o, 1, 1);
    const int positions[3] = {5, 0, 7};
    CHECK(loom_dataloader_set_positions(&sp, positions, 3) == LOOM_OK);
    int in[B * T], tg[B * T], pin[B * 3], ptg[B * 3];
    for (int step = 0; step < 4; step++) {
        CHECK(loom_dataloader_next(&dl, in, tg) == LOOM_OK);
        CHECK(loom_dataloader_next(&sp, pin, ptg) == LOOM_OK);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < 3; i++)
                CHECK(pin[b * 3 + i] == in[b * T + positions[i]] &&
                      ptg[b * 3 + i] == tg[b * T + positions[i]]);
    }
    CHECK(loom_dataloader_set_positions(&sp, positions, T + 1) == LOOM_ERR_INVALID);
    loom_dataloader_free(&sp);
    loom_dataloader_free(&dl);
    loom_dataset_close(&ds);
}

/* ------------------------------------------------------------- dump */

static int dump(int argc, char **argv)
{
    if (argc < 11) {
        fprintf(stderr, "usage: data_test dump B T SHUFFLE READERS READ_BATCH DP K STEPS FILE...\n");
        return 2;
    }
    loom_data_order o = {atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6])};
    int dp = atoi(argv[7]), K = atoi(argv[8]), steps = atoi(argv[9]);
    loom_dataset ds;
    if (loom_dataset_open(&ds, "data.train", "dump", (const char *const *)argv + 10, argc - 10,
                          256) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    loom_dataloader *dls = calloc((size_t)dp, sizeof *dls);
    init_layout(dls, &ds, &o, dp, K);
    int *batch = malloc((size_t)o.batch * (size_t)(o.seq + 1) * sizeof *batch);
    for (int step = 0; step < steps; step++) {
        if (global_batch(dls, dp, K, batch) != LOOM_OK) {
            fprintf(stderr, "%s\n", loom_last_error());
            return 1;
        }
        printf("step %d\n", step + 1);
        for (int s = 0; s < o.batch; s++)
            for (int t = 0; t <= o.seq; t++)
                printf("%d%c", batch[s * (o.seq + 1) + t], t == o.seq ? '\n' : ' ');
    }
    free(batch);
    free_layout(dls, dp);
    free(dls);
    loom_dataset_close(&ds);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: data_test CASE | data_test dump ...\n");
        return 2;
    }
    if (!strcmp(argv[1], "dump"))
        return dump(argc, argv);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loom-data-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    const char *c = argv[1];
    int all = !strcmp(c, "all"), known = 0;
#define RUN(name, call)                                                                            \
    if (all || !strcmp(c, name)) {                                                                 \
        known = 1;                                                                                 \
        call;                                                                                      \
    }
    RUN("mt19937", case_mt19937());
    RUN("sequential", case_sequential());
    RUN("errors", case_errors());
    RUN("position", case_position());
    RUN("offset", case_offset());
    RUN("rewind", case_rewind());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    if (!known) {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    return check_done("data_test");
}
