/*
 * replay_main.c -- runs a libFuzzer target without libFuzzer: feeds every
 * file named on the command line, or found directly in a directory named
 * there, to LLVMFuzzerTestOneInput once.  Built with gcc into the ordinary
 * test suite (ctest fuzz_wire.replay), so the seed corpus and every crash
 * ever found are re-checked on each run.
 *
 *   fuzz_wire_replay DIR|FILE...
 *   fuzz_pool_replay --seeds DIR    (targets with a seed generator)
 *
 * Exits 0 after running at least one file; 1 when a path is missing or
 * unreadable or when there was nothing to run.  A failing input aborts,
 * as it would under libFuzzer.  --seeds writes the target's seed corpus
 * into DIR (fuzz_write_seeds(), defined by the targets whose inputs are
 * scripts of commands rather than wire bytes).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) void fuzz_write_seeds(const char *dir);

/* Reads the whole file into an allocation of exactly its size (at least
 * one byte), so that a sanitizer catches any read past the input. */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *data = malloc(size ? size : 1);
    int ok = data && fread(data, 1, size, f) == size;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "replay: %s: cannot read %zu bytes\n", path, size);
        free(data);
        return -1;
    }
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

/* Runs every regular file directly inside dir, in name order so that runs
 * are repeatable.  Returns the number run, or -1. */
static long run_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    long ran = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        int fits = snprintf(path, sizeof path, "%s/%s", dir,
                            names[i]->d_name) < (int)sizeof path;
        if (ran >= 0 && fits && stat(path, &st) == 0 && S_ISREG(st.st_mode))
            ran = run_file(path) == 0 ? ran + 1 : -1;
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    long ran = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR|FILE...\n", argv[0]);
        return 1;
    }
    if (strcmp(argv[1], "--seeds") == 0) {
        if (argc != 3 || !fuzz_write_seeds) {
            fprintf(stderr, "replay: --seeds DIR, for a target with a seed "
                            "generator\n");
            return 1;
        }
        fuzz_write_seeds(argv[2]);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        long n = -1;
        if (stat(argv[i], &st) != 0)
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
        else if (S_ISDIR(st.st_mode))
            n = run_dir(argv[i]);
        else
            n = run_file(argv[i]) == 0 ? 1 : -1;
        if (n < 0)
            return 1;
        ran += n;
    }
    printf("replay: ran %ld files\n", ran);
    if (ran == 0) {
        fprintf(stderr, "replay: no input files\n");
        return 1;
    }
    return 0;
}
