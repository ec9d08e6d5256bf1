/* Runs a fuzz harness on given inputs without libFuzzer, so that every
 * build (gcc, the sanitizer build) replays the seed corpus and the inputs
 * that once crashed a reader:
 *
 *   replay_<harness> FILE|DIR...
 *
 * Each file is one input; a directory stands for the files in it. Each
 * input's name is printed before it runs, so the last name printed is the
 * one that crashed, and after it the last error a reader recorded (how
 * far the input got: a seed should pass, or fail only at the end). Exits
 * 0 when every input ran. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        perror(path);
        fclose(f);
        return 1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *data = malloc(size ? size : 1);
    int ok = data && fread(data, 1, size, f) == size;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(data);
        return 1;
    }
    printf("replay %s (%zu bytes)", path, size);
    fflush(stdout);
    loom_clear_error();
    LLVMFuzzerTestOneInput(data, size);
    const char *error = loom_last_error();
    printf(": %s\n", *error ? error : "read without an error");
    free(data);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's files in name order, so runs repeat exactly. */
static int run_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char **grown = realloc(names, (n + 1) * sizeof *names);
        if (!grown || !(grown[n] = malloc(strlen(dir) + strlen(e->d_name) + 2))) {
            fprintf(stderr, "replay: out of memory\n");
            exit(1);
        }
        names = grown;
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= run_file(names[i]);
        free(names[i]);
        (*count)++;
    }
    free(names);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    int bad = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (S_ISDIR(st.st_mode))
            bad |= run_dir(argv[i], &count);
        else {
            bad |= run_file(argv[i]);
            count++;
        }
    }
    printf("replay: %d inputs ran\n", count);
    return bad;
}
