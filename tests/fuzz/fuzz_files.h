/* What the fuzz harnesses share: the readers take paths, so each harness
 * writes its input into files of a private temporary directory (under
 * TMPDIR, removed at exit) and opens them as the real commands do.
 *
 * Every harness defines LLVMFuzzerTestOneInput; libFuzzer drives it in the
 * clang build (scripts/fuzz.sh), replay_main.c in every other build. */
#ifndef LOOM_FUZZ_FILES_H
#define LOOM_FUZZ_FILES_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_path[512];

/* Every file of the directory (it holds only files the harness wrote). */
static inline void fuzz_dir_clear(void)
{
    DIR *d = opendir(fuzz_dir_path);
    if (!d)
        return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", fuzz_dir_path, e->d_name);
            unlink(path);
        }
    closedir(d);
}

static inline void fuzz_dir_remove(void)
{
    fuzz_dir_clear();
    rmdir(fuzz_dir_path);
}

/* The harness's directory, made on first use; empty it with fuzz_dir_clear. */
static inline const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0])
        return fuzz_dir_path;
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/loom-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir_path)) {
        perror(fuzz_dir_path);
        abort(); /* no place for the input: nothing this harness can test */
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir_path;
}

/* path = the directory + "/" + name. */
static inline void fuzz_path(char *path, size_t cap, const char *name)
{
    snprintf(path, cap, "%s/%s", fuzz_dir(), name);
}

static inline void fuzz_write(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* Output the readers print (`loom ckpt info`, config values) goes nowhere:
 * only what printing touches matters. */
static inline FILE *fuzz_null(void)
{
    static FILE *null;
    if (!null && !(null = fopen("/dev/null", "w")))
        abort();
    return null;
}

#endif
