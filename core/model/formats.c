/* llm.c's file formats: the GPT-2 checkpoint and the token shard, plus the
 * random initialisation of a GPT-2 when there is no checkpoint.
 *
 * Both formats are little-endian, like every machine llm.c runs on; loom
 * reads them with plain fread into host memory and so assumes a
 * little-endian host too.
 *
 * A bad file fails with one line: the path, what is wrong, and (where the
 * user can do something about it) which setting or what file to use. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/status.h"
#include "loom/tensor.h"
#include "model/formats.h"
#include "runtime/files.h"
#include "runtime/log.h"

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * (long long)sizeof(int32_t))

#define CHECKPOINT_MAGIC 20240326
#define CHECKPOINT_VERSION_FP32 3 /* llm.c's train_gpt2.c, and train_gpt2.cu in fp32 */
#define CHECKPOINT_VERSION_BF16 5 /* train_gpt2.cu in bf16: the same order, 2 bytes each */
#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1

const char *const loom_gpt2_tensor_names[LOOM_GPT2_TENSORS] = {
    "wte",  "wpe",      "ln1w",     "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b",     "fcw",      "fcb",  "fcprojw", "fcprojb", "lnfw", "lnfb",
};

void loom_gpt2_tensor_sizes(const loom_gpt2_shape *s, size_t sizes[LOOM_GPT2_TENSORS])
{
    size_t Vp = (size_t)s->padded_vocab, T = (size_t)s->max_seq, L = (size_t)s->layers;
    size_t C = (size_t)s->channels;
    sizes[0] = Vp * C;         /* wte */
    sizes[1] = T * C;          /* wpe */
    sizes[2] = L * C;          /* ln1w */
    sizes[3] = L * C;          /* ln1b */
    sizes[4] = L * 3 * C * C;  /* qkvw */
    sizes[5] = L * 3 * C;      /* qkvb */
    sizes[6] = L * C * C;      /* attprojw */
    sizes[7] = L * C;          /* attprojb */
    sizes[8] = L * C;          /* ln2w */
    sizes[9] = L * C;          /* ln2b */
    sizes[10] = L * 4 * C * C; /* fcw */
    sizes[11] = L * 4 * C;     /* fcb */
    sizes[12] = L * C * 4 * C; /* fcprojw */
    sizes[13] = L * C;         /* fcprojb */
    sizes[14] = C;             /* lnfw */
    sizes[15] = C;             /* lnfb */
}

size_t loom_gpt2_param_count(const loom_gpt2_shape *s)
{
    size_t sizes[LOOM_GPT2_TENSORS], n = 0;
    loom_gpt2_tensor_sizes(s, sizes);
    for (int i = 0; i < LOOM_GPT2_TENSORS; i++)
        n += sizes[i];
    return n;
}

/* ------------------------------------------------------------ helpers */

/* "L=2 C=64 NH=4 V=256 Vp=256 maxT=64": llm.c's own letters, as its header
 * and its code name them. */
static void shape_string(const loom_gpt2_shape *s, char *buf, size_t len)
{
    snprintf(buf, len, "L=%d C=%d NH=%d V=%d Vp=%d maxT=%d", s->layers, s->channels, s->heads,
             s->vocab, s->padded_vocab, s->max_seq);
}

/* Bytes of parameters of a shape whose fields are all positive; 0 when the
 * count would not fit in 63 bits (a header of nonsense). Checked because the
 * header comes from a file, and a wrapped product would pass the size test. */
static unsigned long long param_bytes_checked(const loom_gpt2_shape *s)
{
    unsigned long long Vp = (unsigned)s->padded_vocab, T = (unsigned)s->max_seq;
    unsigned long long L = (unsigned)s->layers, C = (unsigned)s->channels, CC, LCC, n;
    /* per layer: 12*C*C weights + 13*C biases and LayerNorm; plus (Vp+T)*C and 2*C. */
    if (__builtin_mul_overflow(C, C, &CC) || __builtin_mul_overflow(CC, 12ull, &LCC) ||
        __builtin_add_overflow(LCC, 13ull * C, &LCC) || __builtin_mul_overflow(LCC, L, &n))
        return 0;
    unsigned long long emb;
    if (__builtin_mul_overflow(Vp + T, C, &emb) || __builtin_add_overflow(n, emb, &n) ||
        __builtin_add_overflow(n, 2ull * C, &n) || __builtin_mul_overflow(n, 4ull, &n) ||
        n > (unsigned long long)INT64_MAX)
        return 0;
    return n;
}

uint64_t loom_gpt2_param_bytes(const loom_gpt2_shape *s) { return param_bytes_checked(s); }

/* Write to path atomically: into a temp file beside it, then rename, so a
 * crash (or a full disk) never leaves a half-written file under the name. */
typedef struct atomic_file {
    FILE *f;
    const char *path;
    char tmp[4096];
} atomic_file;

static int atomic_open(atomic_file *af, const char *path)
{
    af->path = path;
    int n = snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof af->tmp)
        return loom_fail(LOOM_ERR_INVALID, "%s: path too long to write", path);
    af->f = fopen(af->tmp, "wb");
    if (!af->f)
        return loom_fail(LOOM_ERR_INVALID, "%s: cannot create %s: %s", path, af->tmp,
                         strerror(errno));
    return LOOM_OK;
}

static int atomic_write(atomic_file *af, const void *data, size_t bytes)
{
    if (bytes && fwrite(data, 1, bytes, af->f) != bytes) {
        int err = errno;
        fclose(af->f);
        unlink(af->tmp);
        return loom_fail(LOOM_ERR_INVALID, "%s: cannot write: %s", af->path, strerror(err));
    }
    return LOOM_OK;
}

static int atomic_commit(atomic_file *af)
{
    /* fflush and fsync before the rename: otherwise the rename can reach the
     * disk before the data, and a crash leaves an empty file under the name. */
    int failed = fflush(af->f) != 0 || fsync(fileno(af->f)) != 0;
    int err = errno;
    if (fclose(af->f) != 0 && !failed) {
        failed = 1;
        err = errno;
    }
    if (!failed && rename(af->tmp, af->path) != 0) {
        failed = 1;
        err = errno;
    }
    if (failed) {
        unlink(af->tmp);
        return loom_fail(LOOM_ERR_INVALID, "%s: cannot write: %s", af->path, strerror(err));
    }
    return LOOM_OK;
}

/* An llm.c file, open past its 256-int header. */
typedef struct llmc_file {
    FILE *f;
    int32_t header[HEADER_INTS];
    long long body; /* bytes after the header */
} llmc_file;

/* Open path and read its header. kind is "GPT-2 checkpoint" or "token
 * shard", for the messages. */
static int llmc_open(llmc_file *file, const char *path, const char *kind, int32_t want_magic)
{
    const char *why = NULL;
    FILE *f = loom_fopen_regular(path, &why);
    if (!f) {
        int not_regular = errno == EISDIR || errno == EINVAL;
        return loom_fail(not_regular ? LOOM_ERR_INVALID : LOOM_ERR_NOT_FOUND,
                         "%s: cannot open: %s", path, why);
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int err = errno;
        fclose(f);
        return loom_fail(LOOM_ERR_INVALID, "%s: cannot stat: %s", path, strerror(err));
    }
    int32_t *header = file->header;
    memset(header, 0, HEADER_BYTES);
    size_t got = fread(header, 1, HEADER_BYTES, f);
    if (got < HEADER_BYTES && ferror(f)) {
        int err = errno;
        fclose(f);
        return loom_fail(LOOM_ERR_INVALID, "%s: cannot read: %s", path, strerror(err));
    }
    /* The magic first, even in a short file: "not a checkpoint" says more
     * than "truncated" about a text file that happens to be small. */
    if (got >= sizeof(int32_t) && header[0] != want_magic) {
        fclose(f);
        const char *hint = "";
        if (header[0] == CHECKPOINT_MAGIC)
            hint = "; it is a GPT-2 checkpoint";
        else if (header[0] == SHARD_MAGIC)
            hint = "; it is a token shard";
        return loom_fail(LOOM_ERR_INVALID, "%s: not an llm.c %s (magic %d, want %d%s)", path,
                         kind, (int)header[0], (int)want_magic, hint);
    }
    if (got < HEADER_BYTES) {
        fclose(f);
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: truncated: %zu bytes, shorter than the %lld-byte header of an llm.c "
                         "%s",
                         path, got, HEADER_BYTES, kind);
    }
    file->f = f;
    file->body = (long long)st.st_size - HEADER_BYTES;
    return LOOM_OK;
}

/* The body after the header, count elements of size bytes (what: the
 * parameters, the tokens), into dst. */
static int read_body(llmc_file *file, const char *path, const char *what, void *dst, size_t size,
                     size_t count)
{
    size_t got = fread(dst, size, count, file->f);
    int err = errno;
    if (got == count)
        return LOOM_OK;
    /* The size was right a moment ago: a read error or a file shrinking under us. */
    return loom_fail(LOOM_ERR_INVALID, "%s: cannot read the %s: %s", path, what,
                     err ? strerror(err) : "the file changed while reading");
}

/* --------------------------------------------------------- checkpoint */

/* A header that no llm.c ever wrote: say which value and why. */
static int check_shape(const char *path, const loom_gpt2_shape *s)
{
    const struct {
        const char *name;
        int value;
    } fields[] = {{"maxT", s->max_seq}, {"V", s->vocab},  {"L", s->layers},
                  {"NH", s->heads},     {"C", s->channels}, {"Vp", s->padded_vocab}};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(fields); i++)
        if (fields[i].value <= 0)
            return loom_fail(LOOM_ERR_INVALID, "%s: bad header: %s=%d, must be positive", path,
                             fields[i].name, fields[i].value);
    if (s->channels % s->heads != 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: bad header: C=%d does not divide by NH=%d",
                         path, s->channels, s->heads);
    if (s->padded_vocab < s->vocab)
        return loom_fail(LOOM_ERR_INVALID, "%s: bad header: Vp=%d is smaller than V=%d", path,
                         s->padded_vocab, s->vocab);
    if (param_bytes_checked(s) == 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: bad header: %s", path,
                         "the shape holds more than 2^63 bytes of parameters");
    return LOOM_OK;
}

static int check_expected(const char *path, const loom_gpt2_shape *got,
                          const loom_gpt2_shape *want)
{
    const struct {
        const char *name;
        int file, config;
    } fields[] = {
        {"max_seq", got->max_seq, want->max_seq},
        {"vocab", got->vocab, want->vocab},
        {"layers", got->layers, want->layers},
        {"heads", got->heads, want->heads},
        {"channels", got->channels, want->channels},
        {"padded_vocab", got->padded_vocab, want->padded_vocab},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(fields); i++)
        if (fields[i].file != fields[i].config)
            return loom_fail(LOOM_ERR_INVALID, "%s: %s %d in the file, %d in the config (model.%s)",
                             path, fields[i].name, fields[i].file, fields[i].config,
                             fields[i].name);
    return LOOM_OK;
}

/* The version's element type, and its name as messages give it. */
static int version_dtype(int32_t version, loom_dtype *dtype)
{
    if (version == CHECKPOINT_VERSION_FP32)
        *dtype = LOOM_F32;
    else if (version == CHECKPOINT_VERSION_BF16)
        *dtype = LOOM_BF16;
    else
        return 0;
    return 1;
}

static const char *version_text(loom_dtype dtype)
{
    return dtype == LOOM_BF16 ? "version 5 (bf16)" : "version 3 (fp32)";
}

/* A checkpoint past its magic: the version, the shape (matching expect,
 * when given) and the body's size against the shape. */
static int check_checkpoint_header(const llmc_file *file, const char *path,
                                   const loom_gpt2_shape *expect, loom_gpt2_shape *s,
                                   loom_dtype *dtype)
{
    const int32_t *header = file->header;
    if (!version_dtype(header[1], dtype))
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: checkpoint version %d; loom reads llm.c's version 3 (fp32) and "
                         "version 5 (bf16)",
                         path, (int)header[1]);
    *s = (loom_gpt2_shape){.max_seq = header[2], .vocab = header[3], .layers = header[4],
                           .heads = header[5], .channels = header[6], .padded_vocab = header[7]};
    int rc;
    if ((rc = check_shape(path, s)) || (expect && (rc = check_expected(path, s, expect))))
        return rc;
    long long want = (long long)(param_bytes_checked(s) / sizeof(float) * loom_dtype_size(*dtype));
    long long have = file->body;
    if (have == want)
        return LOOM_OK;
    char shape_text[128];
    shape_string(s, shape_text, sizeof shape_text);
    return loom_fail(LOOM_ERR_INVALID,
                     "%s: %s: a %s file holds %lld bytes after the header, the header's shape %s "
                     "needs %lld",
                     path, have < want ? "truncated" : "trailing garbage", version_text(*dtype),
                     have, shape_text, want);
}

/* The body into a malloc'd fp32 *params: bf16 widens exactly. */
static int read_checkpoint_body(llmc_file *file, const char *path, const loom_gpt2_shape *s,
                                loom_dtype dtype, float **params)
{
    size_t count = loom_gpt2_param_count(s);
    if (!(*params = malloc(count * sizeof(float))))
        return loom_fail(LOOM_ERR_NO_MEMORY, "%s: no memory for %zu parameters", path, count);
    if (dtype == LOOM_F32)
        return read_body(file, path, "parameters", *params, sizeof(float), count);
    /* Read into the upper half of the buffer and widen upwards from the
     * start: writing float i (bytes 4i..4i+3) never reaches bf16 value j > i
     * (at 2count + 2j), so one buffer serves both. */
    uint16_t *half = (uint16_t *)(void *)(*params) + count;
    int rc = read_body(file, path, "parameters", half, sizeof(uint16_t), count);
    if (rc)
        return rc;
    for (size_t i = 0; i < count; i++)
        (*params)[i] = loom_bf16_to_f32(half[i]);
    return LOOM_OK;
}

/* Weights that are NaN or infinite make every logit NaN: a sample of one
 * token over and over, a run that trains nothing. Refused at load, naming
 * the first such value by tensor, layer and element, and how many there
 * are. */
static int check_finite(const char *path, const loom_gpt2_shape *s, const float *params)
{
    size_t count = loom_gpt2_param_count(s), bad = 0, first = 0;
    for (size_t i = 0; i < count; i++)
        if (!isfinite(params[i]) && bad++ == 0)
            first = i;
    if (bad == 0)
        return LOOM_OK;
    size_t sizes[LOOM_GPT2_TENSORS], at = first;
    int t = 0;
    loom_gpt2_tensor_sizes(s, sizes);
    while (at >= sizes[t])
        at -= sizes[t++];
    char where[96];
    /* the tensors between wpe and lnfw hold one slice per layer */
    if (t >= 2 && t < LOOM_GPT2_TENSORS - 2) {
        size_t per_layer = sizes[t] / (size_t)s->layers;
        snprintf(where, sizeof where, "%s of layer %zu, element %zu", loom_gpt2_tensor_names[t],
                 at / per_layer, at % per_layer);
    } else {
        snprintf(where, sizeof where, "%s, element %zu", loom_gpt2_tensor_names[t], at);
    }
    float v = params[first];
    return loom_fail(LOOM_ERR_INVALID,
                     "%s: %s is %s, and %zu of the %zu parameters are not finite (NaN or "
                     "infinite): the file is damaged or its run diverged; use an earlier "
                     "checkpoint",
                     path, where, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", bad, count);
}

int loom_checkpoint_read_header(const char *path, loom_gpt2_shape *shape, loom_dtype *dtype)
{
    llmc_file file;
    int rc = llmc_open(&file, path, "GPT-2 checkpoint", CHECKPOINT_MAGIC);
    if (rc)
        return rc;
    loom_gpt2_shape s;
    loom_dtype d;
    rc = check_checkpoint_header(&file, path, NULL, &s, &d);
    fclose(file.f);
    if (rc == LOOM_OK) {
        *shape = s;
        if (dtype)
            *dtype = d;
    }
    return rc;
}

int loom_checkpoint_read(const char *path, const loom_gpt2_shape *expect, loom_gpt2_shape *shape,
                         float **params)
{
    *params = NULL;
    llmc_file file;
    int rc = llmc_open(&file, path, "GPT-2 checkpoint", CHECKPOINT_MAGIC);
    if (rc)
        return rc;
    loom_gpt2_shape s;
    loom_dtype dtype;
    float *p = NULL;
    rc = check_checkpoint_header(&file, path, expect, &s, &dtype);
    if (rc == LOOM_OK)
        rc = read_checkpoint_body(&file, path, &s, dtype, &p);
    fclose(file.f);
    if (rc == LOOM_OK)
        rc = check_finite(path, &s, p);
    if (rc) {
        free(p);
        return rc;
    }
    if (shape)
        *shape = s;
    *params = p;
    return LOOM_OK;
}

/* bf16 parameters a piece at a time, rounded to nearest even: no second
 * copy of the whole model. */
enum { BF16_PIECE = 1 << 16 };

static int write_bf16(atomic_file *af, const float *params, size_t count, uint16_t *piece)
{
    for (size_t done = 0; done < count;) {
        size_t n = count - done < BF16_PIECE ? count - done : BF16_PIECE;
        for (size_t i = 0; i < n; i++)
            piece[i] = loom_f32_to_bf16(params[done + i]);
        int rc = atomic_write(af, piece, n * sizeof(uint16_t));
        if (rc)
            return rc;
        done += n;
    }
    return LOOM_OK;
}

int loom_checkpoint_write(const char *path, const loom_gpt2_shape *shape, const float *params,
                          loom_dtype dtype)
{
    if (dtype != LOOM_F32 && dtype != LOOM_BF16)
        return loom_fail(LOOM_ERR_INVALID, "%s: llm.c checkpoints hold fp32 or bf16, not %s", path,
                         loom_dtype_name(dtype));
    int rc = check_shape(path, shape);
    if (rc)
        return rc;
    int32_t header[HEADER_INTS] = {0};
    header[0] = CHECKPOINT_MAGIC;
    header[1] = dtype == LOOM_BF16 ? CHECKPOINT_VERSION_BF16 : CHECKPOINT_VERSION_FP32;
    header[2] = shape->max_seq;
    header[3] = shape->vocab;
    header[4] = shape->layers;
    header[5] = shape->heads;
    header[6] = shape->channels;
    header[7] = shape->padded_vocab;
    size_t count = loom_gpt2_param_count(shape);
    uint16_t *piece = NULL;
    if (dtype == LOOM_BF16 && !(piece = malloc(BF16_PIECE * sizeof(uint16_t))))
        return loom_fail(LOOM_ERR_NO_MEMORY, "%s: no memory to convert to bf16", path);
    atomic_file af;
    if ((rc = atomic_open(&af, path)) == LOOM_OK &&
        (rc = atomic_write(&af, header, sizeof header)) == LOOM_OK)
        rc = piece ? write_bf16(&af, params, count, piece)
                   : atomic_write(&af, params, count * sizeof(float));
    free(piece);
    return rc ? rc : atomic_commit(&af);
}

/* ------------------------------------------------------- random init */

/* The initialisation must be the same bits on every machine, so nothing
 * here comes from libc's rand or libm's transcendental functions (whose last
 * bit differs between libms): splitmix64 for the bits, Marsaglia's polar
 * method for the normals, and a logarithm of our own made of + - * / only,
 * which IEEE 754 rounds identically everywhere.
 *
 * The normal of element i (its index in the flat parameter vector, llm.c's
 * order) depends only on (seed, i): a rank that holds a slice could fill it
 * alone and get the same values as the full fill. */

/* A fused multiply-add rounds once where the source says twice: allowed to
 * contract, a compiler could change the bits on machines with FMA. GCC does
 * not contract in ISO C mode (-std=c11); clang needs telling. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ln(x) for x in (0, 1]: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), and
 * ln(m) = 2 atanh(t), t = (m-1)/(m+1), |t| < 0.172: the odd series of
 * atanh, t + t^3/3 + t^5/5 + ..., has converged to double precision after
 * 12 terms. Horner's rule with fixed coefficients: the same operations in
 * the same order on every machine. */
static double portable_log(double x)
{
    int e;
    double m = frexp(x, &e); /* exact: m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double t = (m - 1.0) / (m + 1.0), t2 = t * t;
    double p = 1.0 / 23;
    p = 1.0 / 21 + t2 * p;
    p = 1.0 / 19 + t2 * p;
    p = 1.0 / 17 + t2 * p;
    p = 1.0 / 15 + t2 * p;
    p = 1.0 / 13 + t2 * p;
    p = 1.0 / 11 + t2 * p;
    p = 1.0 / 9 + t2 * p;
    p = 1.0 / 7 + t2 * p;
    p = 1.0 / 5 + t2 * p;
    p = 1.0 / 3 + t2 * p;
    p = 1.0 + t2 * p;
    return 2.0 * t * p + e * 0.69314718055994530942;
}

/* Uniform in [-1, 1) from 53 random bits: exact in double. */
static double uniform_pm1(uint64_t bits) { return (double)(bits >> 11) * 0x1p-52 - 1.0; }

/* The two normals of pair p = i / 2. Each pair draws from its own
 * splitmix64 stream, seeded by (key, p), retrying until the point falls
 * inside the unit disc (4 times in 5). */
static void normal_pair(uint64_t key, uint64_t pair, double z[2])
{
    const uint64_t golden = 0x9e3779b97f4a7c15ull;
    uint64_t state = key ^ splitmix64(pair);
    for (;;) {
        double u = uniform_pm1(splitmix64(state));
        double v = uniform_pm1(splitmix64(state + golden));
        state += 2 * golden;
        double s = u * u + v * v;
        if (s > 0.0 && s < 1.0) {
            double f = sqrt(-2.0 * portable_log(s) / s); /* IEEE rounds sqrt correctly */
            z[0] = u * f;
            z[1] = v * f;
            return;
        }
    }
}

void loom_gpt2_init_random(const loom_gpt2_shape *s, uint64_t seed, float *params)
{
    size_t sizes[LOOM_GPT2_TENSORS];
    loom_gpt2_tensor_sizes(s, sizes);
    const double std = 0.02;
    /* GPT-2's scaling of the layers that add into the residual stream, so
     * that its variance does not grow with depth. */
    const double residual_std = std / sqrt(2.0 * s->layers);
    const uint64_t key = splitmix64(seed ^ 0x6c6f6f6d696e6974ull); /* "loominit" */
    const size_t C = (size_t)s->channels, V = (size_t)s->vocab;

    size_t base = 0; /* flat index of the tensor's first element */
    uint64_t cached_pair = UINT64_MAX;
    double z[2] = {0, 0};
    for (int t = 0; t < LOOM_GPT2_TENSORS; t++) {
        const char *name = loom_gpt2_tensor_names[t];
        float *p = params + base;
        size_t n = sizes[t];
        double scale = 0.0;
        if (!strcmp(name, "attprojw") || !strcmp(name, "fcprojw"))
            scale = residual_std;
        else if (!strcmp(name, "wte") || !strcmp(name, "wpe") || !strcmp(name, "qkvw") ||
                 !strcmp(name, "fcw"))
            scale = std;
        if (scale == 0.0) {
            /* LayerNorm weights 1; LayerNorm biases and all other biases 0. */
            float value = (!strcmp(name, "ln1w") || !strcmp(name, "ln2w") || !strcmp(name, "lnfw"))
                              ? 1.0f : 0.0f;
            for (size_t i = 0; i < n; i++)
                p[i] = value;
        } else {
            /* The padded vocabulary rows of wte stay zero: no token selects
             * them and their logits are ignored, so they never train. */
            size_t limit = t == 0 ? V * C : n;
            for (size_t i = 0; i < n; i++) {
                if (i >= limit) {
                    p[i] = 0.0f;
                    continue;
                }
                uint64_t flat = base + i;
                if (flat / 2 != cached_pair) {
                    cached_pair = flat / 2;
                    normal_pair(key, cached_pair, z);
                }
                p[i] = (float)(scale * z[flat & 1]);
            }
        }
        base += n;
    }
}

/* -------------------------------------------------------- token shard */

/* A token shard's header past its magic, against its size: *count tokens. */
static int check_shard_header(const llmc_file *file, const char *path, size_t *count)
{
    const int32_t *header = file->header;
    if (header[1] != SHARD_VERSION)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: token shard version %d; loom reads only llm.c's version 1 (uint16 "
                         "tokens)",
                         path, (int)header[1]);
    if (header[2] < 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: bad header: token count %d", path,
                         (int)header[2]);
    *count = (size_t)header[2];
    long long want = (long long)*count * 2, have = file->body;
    if (have < want)
        return loom_fail(LOOM_ERR_INVALID, "%s: truncated: %lld bytes of tokens, want %lld for the "
                         "%zu tokens of the header", path, have, want, *count);
    if (have > want)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: %lld bytes of trailing garbage after the %zu tokens of the header",
                         path, have - want, *count);
    return LOOM_OK;
}

/* A token shard past its magic: the header, and the tokens into out (its
 * buffers to free, whatever the outcome). */
static int read_shard_body(llmc_file *file, const char *path, loom_token_shard *out)
{
    size_t count = 0;
    int rc = check_shard_header(file, path, &count);
    if (rc)
        return rc;
    out->tokens = malloc(count ? count * sizeof(uint16_t) : 1);
    out->path = strdup(path);
    out->count = count;
    if (!out->tokens || !out->path)
        return loom_fail(LOOM_ERR_NO_MEMORY, "%s: no memory for %zu tokens", path, count);
    return read_body(file, path, "tokens", out->tokens, sizeof(uint16_t), count);
}

/* Every token is < vocab. */
static int check_tokens(const loom_token_shard *shard, const char *path, int vocab)
{
    for (size_t i = 0; i < shard->count; i++)
        if (shard->tokens[i] >= vocab)
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: token %u at position %zu is >= the vocabulary size %d "
                             "(model.vocab)",
                             path, (unsigned)shard->tokens[i], i, vocab);
    return LOOM_OK;
}

int loom_shard_open(const char *path, int vocab, loom_token_shard *out)
{
    memset(out, 0, sizeof *out);
    llmc_file file;
    int rc = llmc_open(&file, path, "token shard", SHARD_MAGIC);
    if (rc)
        return rc;
    rc = read_shard_body(&file, path, out);
    fclose(file.f);
    if (rc == LOOM_OK && vocab > 0)
        rc = check_tokens(out, path, vocab);
    if (rc)
        loom_shard_close(out);
    return rc;
}

int loom_shard_inspect(const char *path, size_t *count)
{
    llmc_file file;
    int rc = llmc_open(&file, path, "token shard", SHARD_MAGIC);
    if (rc)
        return rc;
    rc = check_shard_header(&file, path, count);
    fclose(file.f);
    return rc;
}

void loom_shard_close(loom_token_shard *shard)
{
    free(shard->tokens);
    free(shard->path);
    memset(shard, 0, sizeof *shard);
}

int loom_shard_write(const char *path, const uint16_t *tokens, size_t count)
{
    if (count > INT32_MAX)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: %zu tokens do not fit one llm.c shard (at most %d); split the text",
                         path, count, INT32_MAX);
    int32_t header[HEADER_INTS] = {0};
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)count;
    atomic_file af;
    int rc;
    if ((rc = atomic_open(&af, path)) || (rc = atomic_write(&af, header, sizeof header)) ||
        (rc = atomic_write(&af, tokens, count * sizeof(uint16_t))))
        return rc;
    return atomic_commit(&af);
}
