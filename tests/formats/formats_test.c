/* llm.c's formats and the random init: round trips
 * bit-exact, every bad file with its exact one-line message (the bad files
 * are written here), the init's determinism and statistics (the data
 * loader's own tests are tests/data).
 *
 *   formats_test CASE [EXAMPLES_DATA_DIR]    one case ("all" runs every case) */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/status.h"
#include "model/formats.h"
#include "runtime/log.h"
#include "check.h"

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
    static char paths[8][128];
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 128, "%s/%s", tmpdir, name);
    return path;
}

/* A file of a 256-int header (first ints given, rest 0) and extra bytes. */
static const char *write_file(const char *name, const int32_t *head, int nhead, const void *body,
                              size_t body_bytes)
{
    const char *path = tmp_path(name);
    int32_t header[256] = {0};
    memcpy(header, head, (size_t)nhead * sizeof(int32_t));
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(header, sizeof header, 1, f) != 1 ||
        (body_bytes && fwrite(body, 1, body_bytes, f) != body_bytes) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
    return path;
}

static const char *write_raw(const char *name, const void *bytes, size_t n)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
    return path;
}

static const loom_gpt2_shape tiny = {
    .max_seq = 16, .vocab = 250, .layers = 2, .heads = 4, .channels = 32, .padded_vocab = 256};

/* ------------------------------------------------------- checkpoint */

static void case_checkpoint_roundtrip(void)
{
    size_t n = loom_gpt2_param_count(&tiny);
    size_t sizes[LOOM_GPT2_TENSORS], sum = 0;
    loom_gpt2_tensor_sizes(&tiny, sizes);
    for (int i = 0; i < LOOM_GPT2_TENSORS; i++)
        sum += sizes[i];
    CHECK(sum == n);
    /* llm.c's count for this shape, by its own formula. */
    size_t C = 32, L = 2;
    CHECK(n == 256 * C + 16 * C + L * (12 * C * C + 13 * C) + 2 * C);
    CHECK_STR(loom_gpt2_tensor_names[0], "wte");
    CHECK_STR(loom_gpt2_tensor_names[6], "attprojw");
    CHECK_STR(loom_gpt2_tensor_names[12], "fcprojw");
    CHECK_STR(loom_gpt2_tensor_names[15], "lnfb");

    float *params = malloc(n * sizeof(float));
    loom_gpt2_init_random(&tiny, 42, params);
    params[7] = -0.0f; /* bit-exact means the sign of zero too */
    params[8] = 1e-42f; /* and denormals */
    const char *path = tmp_path("rt.bin");
    CHECK(loom_checkpoint_write(path, &tiny, params, LOOM_F32) == LOOM_OK);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (size_t)st.st_size == 1024 + n * 4);

    loom_gpt2_shape got;
    float *back = NULL;
    CHECK(loom_checkpoint_read(path, &tiny, &got, &back) == LOOM_OK);
    CHECK(!memcmp(&got, &tiny, sizeof got));
    CHECK(back && !memcmp(back, params, n * sizeof(float)));
    free(back);

    /* The header is llm.c's, int by int. */
    int32_t header[256];
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(header, sizeof header, 1, f) == 1);
    if (f)
        fclose(f);
    int32_t want[8] = {20240326, 3, 16, 250, 2, 4, 32, 256};
    CHECK(!memcmp(header, want, sizeof want));
    for (int i = 8; i < 256; i++)
        CHECK(header[i] == 0);

    /* Without an expected shape, and overwriting an existing file: the
     * rename replaces it and no temp file stays behind. */
    params[0] = 123.0f;
    CHECK(loom_checkpoint_write(path, &tiny, params, LOOM_F32) == LOOM_OK);
    CHECK(loom_checkpoint_read(path, NULL, &got, &back) == LOOM_OK);
    CHECK(back && back[0] == 123.0f && !memcmp(back, params, n * sizeof(float)));
    free(back);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);

    /* A write that cannot happen says so and leaves nothing behind. */
    const char *bad = tmp_path("no-such-dir/x.bin");
    CHECK(loom_checkpoint_write(bad, &tiny, params, LOOM_F32) == LOOM_ERR_INVALID);
    char want_msg[512];
    snprintf(want_msg, sizeof want_msg,
             "%s: cannot create %s.tmp.%ld: No such file or directory", bad, bad, (long)getpid());
    CHECK_STR(loom_last_error(), want_msg);
    loom_gpt2_shape nonsense = tiny;
    nonsense.heads = 5;
    CHECK(loom_checkpoint_write(path, &nonsense, params, LOOM_F32) == LOOM_ERR_INVALID);
    CHECK(loom_checkpoint_write(path, &tiny, params, LOOM_F16) == LOOM_ERR_INVALID);
    snprintf(want_msg, sizeof want_msg, "%s: llm.c checkpoints hold fp32 or bf16, not f16", path);
    CHECK_STR(loom_last_error(), want_msg);
    free(params);
}

/* bf16 bits -> float, written out here rather than through loom's own
 * conversion: sign, 8 exponent bits, 7 mantissa bits, the top half of an
 * fp32. */
static float bf16_bits(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* llm.c's version 5: bf16 parameters, written rounding to nearest even and
 * read back widened exactly. */
static void case_checkpoint_bf16(void)
{
    size_t n = loom_gpt2_param_count(&tiny);
    float *params = malloc(n * sizeof(float));
    loom_gpt2_init_random(&tiny, 7, params);
    /* Rounding, value by value (bf16 keeps 7 mantissa bits: 1 + k/128). */
    const struct {
        float in, out;
    } rounding[] = {
        {1.0f + 0x1p-8f, 1.0f},                       /* halfway, to even: down */
        {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},         /* halfway, to even: up */
        {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f}, /* above halfway: up */
        {1.0f + 0x1p-8f - 0x1p-20f, 1.0f},           /* below halfway: down */
        {-2.5f, -2.5f},                               /* exact */
        {-0.0f, -0.0f},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(rounding); i++)
        params[i] = rounding[i].in;
    const char *path = tmp_path("bf16-rt.bin");
    CHECK(loom_checkpoint_write(path, &tiny, params, LOOM_BF16) == LOOM_OK);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (size_t)st.st_size == 1024 + n * 2);
    int32_t header[256];
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(header, sizeof header, 1, f) == 1);
    if (f)
        fclose(f);
    int32_t want[8] = {20240326, 5, 16, 250, 2, 4, 32, 256};
    CHECK(!memcmp(header, want, sizeof want));

    loom_gpt2_shape got, header_shape;
    loom_dtype dtype = LOOM_F32;
    CHECK(loom_checkpoint_read_header(path, &header_shape, &dtype) == LOOM_OK);
    CHECK(dtype == LOOM_BF16 && !memcmp(&header_shape, &tiny, sizeof tiny));
    float *back = NULL;
    CHECK(loom_checkpoint_read(path, &tiny, &got, &back) == LOOM_OK);
    CHECK(!memcmp(&got, &tiny, sizeof got));
    for (size_t i = 0; back && i < LOOM_ARRAY_LEN(rounding); i++)
        if (memcmp(&back[i], &rounding[i].out, sizeof(float))) {
            fprintf(stderr, "bf16 of %a read back as %a, want %a\n", (double)rounding[i].in,
                    (double)back[i], (double)rounding[i].out);
            failures++;
        }
    /* Every other value: the nearest bf16, within half a unit in the last
     * place (2^-8 relative), and no more bits than bf16 holds. */
    size_t bad = 0;
    for (size_t i = LOOM_ARRAY_LEN(rounding); back && i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &back[i], sizeof bits);
        if ((bits & 0xffffu) || fabsf(back[i] - params[i]) > fabsf(params[i]) * 0x1p-8f)
            bad++;
    }
    CHECK(back && bad == 0);
    free(back);

    /* FLT_MAX rounds past bf16's top, to infinity: the file is written, and
     * refused when read like any other holding an infinity. */
    params[1] = 0x1.fffffep+127f;
    CHECK(loom_checkpoint_write(path, &tiny, params, LOOM_BF16) == LOOM_OK);
    CHECK(loom_checkpoint_read(path, &tiny, &got, &back) == LOOM_ERR_INVALID && !back);
    CHECK(strstr(loom_last_error(), ": wte, element 1 is +inf, and 1 of the ") != NULL);

    /* A version 5 file written by hand: each value exactly. */
    const uint16_t bits[] = {0x3f80, 0xc020, 0x3e80, 0x8000, 0x0001, 0x7f7f};
    const float values[] = {1.0f, -2.5f, 0.25f, -0.0f, 0x1p-133f, 0x1.fep+127f};
    uint16_t *body = calloc(n, sizeof(uint16_t));
    memcpy(body, bits, sizeof bits);
    for (size_t i = LOOM_ARRAY_LEN(bits); i < n; i++)
        body[i] = (uint16_t)(0x3c00 + i % 256); /* small positive numbers */
    const char *hand = write_file("bf16-hand.bin", want, 8, body, n * 2);
    CHECK(loom_checkpoint_read(hand, NULL, &got, &back) == LOOM_OK);
    for (size_t i = 0; back && i < LOOM_ARRAY_LEN(bits); i++)
        CHECK(!memcmp(&back[i], &values[i], sizeof(float)));
    size_t wrong = 0;
    for (size_t i = 0; back && i < n; i++)
        wrong += memcmp(&back[i], &(float){bf16_bits(body[i])}, sizeof(float)) != 0;
    CHECK(back && wrong == 0);
    free(back);
    free(body);
    free(params);
}

/* Read path expecting failure with exactly "<path>: <rest>". */
static void expect_ckpt_error(const char *path, const loom_gpt2_shape *expect, int status,
                              const char *rest)
{
    loom_clear_error();
    loom_gpt2_shape shape;
    float *params = (float *)0x1;
    int rc = loom_checkpoint_read(path, expect, &shape, &params);
    CHECK(rc == status);
    CHECK(params == NULL);
    char want[1024];
    snprintf(want, sizeof want, "%s: %s", path, rest);
    CHECK_STR(loom_last_error(), want);
}

static void case_checkpoint_errors(void)
{
    size_t n = loom_gpt2_param_count(&tiny);
    size_t bytes = n * 4;
    char *body = calloc(1, bytes + 64);
    int32_t good[8] = {20240326, 3, 16, 250, 2, 4, 32, 256};
    const char *shape = "L=2 C=32 NH=4 V=250 Vp=256 maxT=16";
    char rest[512];

    expect_ckpt_error(tmp_path("missing.bin"), NULL, LOOM_ERR_NOT_FOUND,
                      "cannot open: No such file or directory");
    expect_ckpt_error(tmpdir, NULL, LOOM_ERR_INVALID,
                      "cannot open: it is a directory, not a regular file");

    int32_t magic[8] = {1234, 3, 16, 250, 2, 4, 32, 256};
    expect_ckpt_error(write_file("magic.bin", magic, 8, body, bytes), NULL, LOOM_ERR_INVALID,
                      "not an llm.c GPT-2 checkpoint (magic 1234, want 20240326)");
    int32_t shard[3] = {20240520, 1, 10};
    expect_ckpt_error(write_file("shard.bin", shard, 3, body, 20), NULL, LOOM_ERR_INVALID,
                      "not an llm.c GPT-2 checkpoint (magic 20240520, want 20240326; it is a "
                      "token shard)");
    expect_ckpt_error(write_raw("text.bin", "hello world\n", 12), NULL, LOOM_ERR_INVALID,
                      "not an llm.c GPT-2 checkpoint (magic 1819043176, want 20240326)");
    expect_ckpt_error(write_raw("empty.bin", "", 0), NULL, LOOM_ERR_INVALID,
                      "truncated: 0 bytes, shorter than the 1024-byte header of an llm.c GPT-2 "
                      "checkpoint");
    expect_ckpt_error(write_raw("short.bin", good, sizeof good), NULL, LOOM_ERR_INVALID,
                      "truncated: 32 bytes, shorter than the 1024-byte header of an llm.c GPT-2 "
                      "checkpoint");

    int32_t v2[8] = {20240326, 2, 16, 250, 2, 4, 32, 256};
    expect_ckpt_error(write_file("v2.bin", v2, 8, body, bytes), NULL, LOOM_ERR_NOT_SUPPORTED,
                      "checkpoint version 2; loom reads llm.c's version 3 (fp32) and version 5 "
                      "(bf16)");
    int32_t v4[8] = {20240326, 4, 16, 250, 2, 4, 32, 256};
    expect_ckpt_error(write_file("v4.bin", v4, 8, body, n * 2), NULL, LOOM_ERR_NOT_SUPPORTED,
                      "checkpoint version 4; loom reads llm.c's version 3 (fp32) and version 5 "
                      "(bf16)");

    snprintf(rest, sizeof rest,
             "truncated: a version 3 (fp32) file holds 1000 bytes after the header, the header's "
             "shape %s needs %zu", shape, bytes);
    expect_ckpt_error(write_file("trunc.bin", good, 8, body, 1000), &tiny, LOOM_ERR_INVALID, rest);
    snprintf(rest, sizeof rest,
             "truncated: a version 3 (fp32) file holds %zu bytes after the header, the header's "
             "shape %s needs %zu", bytes - 1, shape, bytes);
    expect_ckpt_error(write_file("trunc1.bin", good, 8, body, bytes - 1), NULL, LOOM_ERR_INVALID,
                      rest);
    snprintf(rest, sizeof rest,
             "trailing garbage: a version 3 (fp32) file holds %zu bytes after the header, the "
             "header's shape %s needs %zu", bytes + 12, shape, bytes);
    expect_ckpt_error(write_file("trailing.bin", good, 8, body, bytes + 12), NULL, LOOM_ERR_INVALID,
                      rest);

    /* Version 5 holds 2 bytes a parameter: the fp32 size is wrong for it,
     * and a bad header field is named as in version 3. */
    int32_t bf16[8] = {20240326, 5, 16, 250, 2, 4, 32, 256};
    snprintf(rest, sizeof rest,
             "trailing garbage: a version 5 (bf16) file holds %zu bytes after the header, the "
             "header's shape %s needs %zu", bytes, shape, n * 2);
    expect_ckpt_error(write_file("bf16-fp32size.bin", bf16, 8, body, bytes), NULL,
                      LOOM_ERR_INVALID, rest);
    snprintf(rest, sizeof rest,
             "truncated: a version 5 (bf16) file holds %zu bytes after the header, the header's "
             "shape %s needs %zu", n * 2 - 2, shape, n * 2);
    expect_ckpt_error(write_file("bf16-short.bin", bf16, 8, body, n * 2 - 2), NULL,
                      LOOM_ERR_INVALID, rest);
    int32_t bf16_heads[8] = {20240326, 5, 16, 250, 2, 5, 32, 256};
    expect_ckpt_error(write_file("bf16-heads.bin", bf16_heads, 8, body, n * 2), NULL,
                      LOOM_ERR_INVALID, "bad header: C=32 does not divide by NH=5");
    int32_t bf16_vp[8] = {20240326, 5, 16, 250, 2, 4, 32, 0};
    expect_ckpt_error(write_file("bf16-vp.bin", bf16_vp, 8, body, n * 2), NULL,
                      LOOM_ERR_INVALID, "bad header: Vp=0, must be positive");
    loom_gpt2_shape header_shape;
    CHECK(loom_checkpoint_read_header(write_file("bf16-heads.bin", bf16_heads, 8, body, n * 2),
                                      &header_shape, NULL) == LOOM_ERR_INVALID);

    /* The shape against the config: each field by its setting's name. */
    const char *path = write_file("good.bin", good, 8, body, bytes);
    struct {
        int field;
        int value;
        const char *rest;
    } mismatches[] = {
        {2, 32, "max_seq 16 in the file, 32 in the config (model.max_seq)"},
        {3, 256, "vocab 250 in the file, 256 in the config (model.vocab)"},
        {4, 4, "layers 2 in the file, 4 in the config (model.layers)"},
        {5, 8, "heads 4 in the file, 8 in the config (model.heads)"},
        {6, 64, "channels 32 in the file, 64 in the config (model.channels)"},
        {7, 512, "padded_vocab 256 in the file, 512 in the config (model.padded_vocab)"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(mismatches); i++) {
        loom_gpt2_shape want = tiny;
        int *fields[] = {NULL, NULL, &want.max_seq, &want.vocab, &want.layers,
                         &want.heads, &want.channels, &want.padded_vocab};
        *fields[mismatches[i].field] = mismatches[i].value;
        expect_ckpt_error(path, &want, LOOM_ERR_INVALID, mismatches[i].rest);
    }

    /* Headers no llm.c ever wrote. */
    struct {
        int32_t header[8];
        const char *rest;
    } nonsense[] = {
        {{20240326, 3, 0, 250, 2, 4, 32, 256}, "bad header: maxT=0, must be positive"},
        {{20240326, 3, 16, -1, 2, 4, 32, 256}, "bad header: V=-1, must be positive"},
        {{20240326, 3, 16, 250, 0, 4, 32, 256}, "bad header: L=0, must be positive"},
        {{20240326, 3, 16, 250, 2, 0, 32, 256}, "bad header: NH=0, must be positive"},
        {{20240326, 3, 16, 250, 2, 4, 0, 256}, "bad header: C=0, must be positive"},
        {{20240326, 3, 16, 250, 2, 4, 32, 0}, "bad header: Vp=0, must be positive"},
        {{20240326, 3, 16, 250, 2, 5, 32, 256}, "bad header: C=32 does not divide by NH=5"},
        {{20240326, 3, 16, 250, 2, 4, 32, 200}, "bad header: Vp=200 is smaller than V=250"},
        {{20240326, 3, 2000000000, 250, 2000000000, 1, 2000000000, 256},
         "bad header: the shape holds more than 2^63 bytes of parameters"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(nonsense); i++)
        expect_ckpt_error(write_file("nonsense.bin", nonsense[i].header, 8, body, bytes), NULL,
                          LOOM_ERR_INVALID, nonsense[i].rest);
    /* A big but representable shape is a truncation, not an overflow. */
    int32_t big[8] = {20240326, 3, 1024, 50257, 48, 25, 1600, 50304};
    snprintf(rest, sizeof rest,
             "truncated: a version 3 (fp32) file holds %zu bytes after the header, the header's "
             "shape L=48 C=1600 NH=25 V=50257 Vp=50304 maxT=1024 needs 6230745600",
             bytes);
    expect_ckpt_error(write_file("big.bin", big, 8, body, bytes), NULL, LOOM_ERR_INVALID, rest);
    free(body);
}

/* Weights that are NaN or infinite: refused at load, naming the first by
 * tensor, layer and element, and counting them all; in either version. */
static void case_checkpoint_nonfinite(void)
{
    size_t n = loom_gpt2_param_count(&tiny);
    float *body = calloc(n, sizeof *body);
    int32_t fp32[8] = {20240326, 3, 16, 250, 2, 4, 32, 256};
    char rest[512];
    /* llm.c's order: wte 256x32, wpe 16x32, ln1w 2x32, ln1b 2x32, qkvw 2x96x32 */
    size_t qkvw_layer1 = 256 * 32 + 16 * 32 + 2 * 32 + 2 * 32 + 96 * 32;
    body[qkvw_layer1 + 7] = INFINITY;
    snprintf(rest, sizeof rest,
             "qkvw of layer 1, element 7 is +inf, and 1 of the %zu parameters are not finite "
             "(NaN or infinite): the file is damaged or its run diverged; use an earlier "
             "checkpoint", n);
    expect_ckpt_error(write_file("inf.bin", fp32, 8, body, n * 4), NULL, LOOM_ERR_INVALID, rest);
    /* the first in the file is named, every one counted */
    body[5] = NAN;
    body[n - 1] = -INFINITY;
    snprintf(rest, sizeof rest,
             "wte, element 5 is NaN, and 3 of the %zu parameters are not finite (NaN or "
             "infinite): the file is damaged or its run diverged; use an earlier checkpoint", n);
    expect_ckpt_error(write_file("nan.bin", fp32, 8, body, n * 4), NULL, LOOM_ERR_INVALID, rest);
    body[5] = 0;
    body[qkvw_layer1 + 7] = 0;
    snprintf(rest, sizeof rest,
             "lnfb, element 31 is -inf, and 1 of the %zu parameters are not finite (NaN or "
             "infinite): the file is damaged or its run diverged; use an earlier checkpoint", n);
    expect_ckpt_error(write_file("last.bin", fp32, 8, body, n * 4), NULL, LOOM_ERR_INVALID, rest);
    /* bf16 keeps a NaN a NaN */
    body[n - 1] = 0;
    body[256 * 32 + 3] = NAN;
    const char *bf16 = tmp_path("nan-bf16.bin");
    CHECK(loom_checkpoint_write(bf16, &tiny, body, LOOM_BF16) == LOOM_OK);
    snprintf(rest, sizeof rest,
             "wpe, element 3 is NaN, and 1 of the %zu parameters are not finite (NaN or "
             "infinite): the file is damaged or its run diverged; use an earlier checkpoint", n);
    expect_ckpt_error(bf16, NULL, LOOM_ERR_INVALID, rest);
    /* the header alone reads */
    loom_gpt2_shape shape;
    CHECK(loom_checkpoint_read_header(bf16, &shape, NULL) == LOOM_OK);
    /* the largest finite values are weights like any other */
    body[256 * 32 + 3] = FLT_MAX;
    body[0] = -FLT_MAX;
    float *params = NULL;
    CHECK(loom_checkpoint_read(write_file("max.bin", fp32, 8, body, n * 4), &tiny, &shape,
                               &params) == LOOM_OK);
    free(params);
    free(body);
}

/* ----------------------------------------------------------- init */

static double tensor_mean(const float *p, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s / (double)n;
}

static double tensor_std(const float *p, size_t n)
{
    double m = tensor_mean(p, n), s = 0;
    for (size_t i = 0; i < n; i++)
        s += (p[i] - m) * (p[i] - m);
    return sqrt(s / (double)n);
}

/* FNV-1a over the bytes: pins the init to the same bits on every machine. */
static uint64_t fnv1a(const void *data, size_t n)
{
    const unsigned char *b = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void case_init(void)
{
    const loom_gpt2_shape s = {
        .max_seq = 64, .vocab = 250, .layers = 4, .heads = 4, .channels = 64, .padded_vocab = 256};
    size_t n = loom_gpt2_param_count(&s), sizes[LOOM_GPT2_TENSORS];
    loom_gpt2_tensor_sizes(&s, sizes);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    memset(a, 0x7f, n * sizeof(float)); /* garbage: every element must be written */
    loom_gpt2_init_random(&s, 1337, a);
    loom_gpt2_init_random(&s, 1337, b);
    CHECK(!memcmp(a, b, n * sizeof(float)));
    uint64_t hash = fnv1a(a, n * sizeof(float));
    const uint64_t want_hash = 0xd93de6c06d93c232ull; /* gcc and clang, -O0 to -O3 -march=native */
    if (hash != want_hash) {
        fprintf(stderr, "init hash 0x%016llxull, want 0x%016llxull\n", (unsigned long long)hash,
                (unsigned long long)want_hash);
        failures++;
    }
    loom_gpt2_init_random(&s, 1338, b);
    CHECK(memcmp(a, b, n * sizeof(float)) != 0);

    const double residual = 0.02 / sqrt(2.0 * s.layers);
    size_t base = 0;
    for (int t = 0; t < LOOM_GPT2_TENSORS; t++) {
        const char *name = loom_gpt2_tensor_names[t];
        const float *p = a + base;
        size_t count = sizes[t];
        if (t == 0) {
            for (size_t i = (size_t)s.vocab * s.channels; i < count; i++)
                CHECK(p[i] == 0.0f);
            count = (size_t)s.vocab * s.channels;
        }
        double want_std = 0;
        if (!strcmp(name, "attprojw") || !strcmp(name, "fcprojw"))
            want_std = residual;
        else if (!strcmp(name, "wte") || !strcmp(name, "wpe") || !strcmp(name, "qkvw") ||
                 !strcmp(name, "fcw"))
            want_std = 0.02;
        if (want_std > 0) {
            double sd = tensor_std(p, count), m = tensor_mean(p, count);
            if (fabs(sd / want_std - 1) > 0.03 || fabs(m) > 4 * want_std / sqrt((double)count)) {
                fprintf(stderr, "%s: std %.5f (want %.5f), mean %.6f over %zu\n", name, sd,
                        want_std, m, count);
                failures++;
            }
            /* Normal, not uniform: about 4.55% of samples beyond 2 sigma. */
            size_t tail = 0;
            for (size_t i = 0; i < count; i++)
                tail += fabs(p[i]) > 2 * want_std;
            double share = (double)tail / (double)count;
            if (fabs(share - 0.0455) > 0.01) {
                fprintf(stderr, "%s: %.4f beyond 2 sigma, want 0.0455\n", name, share);
                failures++;
            }
        } else {
            float want = (!strcmp(name, "ln1w") || !strcmp(name, "ln2w") || !strcmp(name, "lnfw"))
                             ? 1.0f : 0.0f;
            for (size_t i = 0; i < count; i++)
                if (p[i] != want) {
                    fprintf(stderr, "%s[%zu] = %g, want %g\n", name, i, p[i], want);
                    failures++;
                    break;
                }
        }
        base += sizes[t];
    }
    free(a);
    free(b);
}

/* ----------------------------------------------------------- shards */

static void expect_shard_error(const char *path, int vocab, int status, const char *rest)
{
    loom_clear_error();
    loom_token_shard shard;
    CHECK(loom_shard_open(path, vocab, &shard) == status);
    CHECK(shard.tokens == NULL && shard.count == 0);
    char want[1024];
    snprintf(want, sizeof want, "%s: %s", path, rest);
    CHECK_STR(loom_last_error(), want);
}

static void case_shard(void)
{
    enum { N = 5000 };
    uint16_t *tokens = malloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++)
        tokens[i] = (uint16_t)((i * 7919) % 50257);
    tokens[10] = 65535;
    const char *path = tmp_path("shard.bin");
    CHECK(loom_shard_write(path, tokens, N) == LOOM_OK);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 1024 + 2 * N);
    loom_token_shard shard;
    CHECK(loom_shard_open(path, 0, &shard) == LOOM_OK);
    CHECK(shard.count == N && !memcmp(shard.tokens, tokens, N * sizeof(uint16_t)));
    CHECK_STR(shard.path, path);
    loom_shard_close(&shard);
    size_t count = 0;
    CHECK(loom_shard_inspect(path, &count) == LOOM_OK && count == N);
    CHECK(shard.tokens == NULL && shard.path == NULL);
    CHECK(loom_shard_open(path, 65536, &shard) == LOOM_OK);
    loom_shard_close(&shard);

    /* The header, int by int. */
    int32_t header[256];
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(header, sizeof header, 1, f) == 1);
    if (f)
        fclose(f);
    CHECK(header[0] == 20240520 && header[1] == 1 && header[2] == N);

    /* An empty shard is a valid file. */
    const char *empty = tmp_path("empty-shard.bin");
    CHECK(loom_shard_write(empty, tokens, 0) == LOOM_OK);
    CHECK(loom_shard_open(empty, 256, &shard) == LOOM_OK && shard.count == 0);
    loom_shard_close(&shard);
    free(tokens);
}

static void case_shard_errors(void)
{
    uint16_t body[2000];
    for (int i = 0; i < 2000; i++)
        body[i] = (uint16_t)(i % 256);
    body[1234] = 300;
    int32_t good[3] = {20240520, 1, 2000};

    expect_shard_error(tmp_path("missing.bin"), 256, LOOM_ERR_NOT_FOUND,
                       "cannot open: No such file or directory");
    expect_shard_error(write_file("s-vocab.bin", good, 3, body, sizeof body), 256,
                       LOOM_ERR_INVALID,
                       "token 300 at position 1234 is >= the vocabulary size 256 (model.vocab)");
    int32_t magic[3] = {1234, 1, 2000};
    expect_shard_error(write_file("s-magic.bin", magic, 3, body, sizeof body), 256,
                       LOOM_ERR_INVALID, "not an llm.c token shard (magic 1234, want 20240520)");
    int32_t ckpt[8] = {20240326, 3, 16, 250, 2, 4, 32, 256};
    expect_shard_error(write_file("s-ckpt.bin", ckpt, 8, body, sizeof body), 256,
                       LOOM_ERR_INVALID,
                       "not an llm.c token shard (magic 20240326, want 20240520; it is a GPT-2 "
                       "checkpoint)");
    int32_t v2[3] = {20240520, 2, 2000};
    expect_shard_error(write_file("s-v2.bin", v2, 3, body, sizeof body), 256,
                       LOOM_ERR_NOT_SUPPORTED,
                       "token shard version 2; loom reads only llm.c's version 1 (uint16 tokens)");
    int32_t negative[3] = {20240520, 1, -5};
    expect_shard_error(write_file("s-neg.bin", negative, 3, body, 0), 256, LOOM_ERR_INVALID,
                       "bad header: token count -5");
    expect_shard_error(write_file("s-trunc.bin", good, 3, body, 3000), 256, LOOM_ERR_INVALID,
                       "truncated: 3000 bytes of tokens, want 4000 for the 2000 tokens of the "
                       "header");
    expect_shard_error(write_file("s-odd.bin", good, 3, body, 3999), 256, LOOM_ERR_INVALID,
                       "truncated: 3999 bytes of tokens, want 4000 for the 2000 tokens of the "
                       "header");
    expect_shard_error(write_file("s-short2.bin", good, 3, body, sizeof body - 2), 0,
                       LOOM_ERR_INVALID,
                       "truncated: 3998 bytes of tokens, want 4000 for the 2000 tokens of the "
                       "header");
    int32_t fewer[3] = {20240520, 1, 1990};
    expect_shard_error(write_file("s-trail.bin", fewer, 3, body, sizeof body), 0,
                       LOOM_ERR_INVALID,
                       "20 bytes of trailing garbage after the 1990 tokens of the header");
    expect_shard_error(write_raw("s-short.bin", good, 12), 256, LOOM_ERR_INVALID,
                       "truncated: 12 bytes, shorter than the 1024-byte header of an llm.c token "
                       "shard");
    /* The first token past the vocabulary is already too big. */
    uint16_t edge[16] = {0};
    edge[7] = 256;
    int32_t sixteen[3] = {20240520, 1, 16};
    expect_shard_error(write_file("s-edge.bin", sixteen, 3, edge, sizeof edge), 256,
                       LOOM_ERR_INVALID,
                       "token 256 at position 7 is >= the vocabulary size 256 (model.vocab)");
    /* The same body with vocab 0 (no check) or a big vocabulary is fine. */
    loom_token_shard shard;
    CHECK(loom_shard_open(tmp_path("s-vocab.bin"), 301, &shard) == LOOM_OK);
    loom_shard_close(&shard);
}

/* A FIFO where a checkpoint or a shard is expected is refused at once:
 * opening it to read would wait for a writer. */
static void case_fifo(void)
{
    const char *fifo = tmp_path("fifo");
    if (mkfifo(fifo, 0600) != 0) {
        perror(fifo);
        failures++;
        return;
    }
    alarm(20); /* a regression hangs: let it fail instead */
    const char *why = "cannot open: it is a FIFO, not a regular file";
    expect_ckpt_error(fifo, NULL, LOOM_ERR_INVALID, why);
    expect_shard_error(fifo, 256, LOOM_ERR_INVALID, why);
    size_t count;
    CHECK(loom_shard_inspect(fifo, &count) == LOOM_ERR_INVALID);
    loom_gpt2_shape shape;
    CHECK(loom_checkpoint_read_header(fifo, &shape, NULL) == LOOM_ERR_INVALID);
    alarm(0);
}

/* ---------------------------------------------------- shipped corpus */

static void case_corpus(const char *dir)
{
    if (!dir) {
        fprintf(stderr, "corpus: give the examples/data directory\n");
        failures++;
        return;
    }
    char txt[1024], bin[1024];
    snprintf(txt, sizeof txt, "%s/corpus.txt", dir);
    snprintf(bin, sizeof bin, "%s/corpus.bin", dir);
    FILE *f = fopen(txt, "rb");
    if (!f) {
        perror(txt);
        failures++;
        return;
    }
    static unsigned char text[1 << 20];
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    CHECK(n >= 60 * 1024 && n < sizeof text);
    CHECK(!memcmp(text, "# ", 2) && strstr((char *)text, "public domain") != NULL);
    for (size_t i = 0; i < n; i++)
        if (text[i] != '\n' && (text[i] < 0x20 || text[i] > 0x7e)) {
            fprintf(stderr, "%s: byte 0x%02x at %zu is not printable ASCII\n", txt, text[i], i);
            failures++;
            break;
        }
    loom_token_shard shard;
    int rc = loom_shard_open(bin, 256, &shard);
    if (rc != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_last_error());
        failures++;
        return;
    }
    CHECK(shard.count == n);
    size_t diff = 0;
    for (size_t i = 0; i < n && i < shard.count; i++)
        diff += shard.tokens[i] != text[i];
    if (diff) {
        fprintf(stderr, "%s: %zu tokens differ from the bytes of %s; regenerate it with "
                        "loom-text2shard\n", bin, diff, txt);
        failures++;
    }
    /* The demo's shape (train.batch 8 x train.seq 64) gets many samples. */
    CHECK(shard.count > 100 * (8 * 64 + 1));
    loom_shard_close(&shard);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: formats_test CASE [EXAMPLES_DATA_DIR]\n");
        return 2;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loom-formats-XXXXXX");
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
    RUN("checkpoint_roundtrip", case_checkpoint_roundtrip());
    RUN("checkpoint_bf16", case_checkpoint_bf16());
    RUN("checkpoint_errors", case_checkpoint_errors());
    RUN("checkpoint_nonfinite", case_checkpoint_nonfinite());
    RUN("fifo", case_fifo());
    RUN("init", case_init());
    RUN("shard", case_shard());
    RUN("shard_errors", case_shard_errors());
    RUN("corpus", case_corpus(argc > 2 ? argv[2] : NULL));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    if (!known) {
        fprintf(stderr, "formats_test: unknown case %s\n", c);
        return 2;
    }
    return check_done("formats_test");
}
