/*
 * bench_common.c -- helpers shared by the pool benchmarks; see
 * bench_common.h.
 */
#include "bench_common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double bench_now_s(void) { return (double)bench_now_ns() / 1e9; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_percentile(const double *v, size_t n, double p)
{
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

int bench_parse_long(const char *prog, const char *what, const char *text,
                     long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants %ld..%ld, not '%s'\n", prog, what, lo,
                hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* Appends s to buf in single quotes, so that any path survives sh: inside
 * them only ' itself is special, and it is written as '\''. */
static int shell_quote(char *buf, size_t size, const char *s)
{
    size_t k = strlen(buf);
    if (k + 1 >= size)
        return -1;
    buf[k++] = '\'';
    for (; *s; s++) {
        if (k + 6 > size)
            return -1;
        if (*s == '\'') {
            memcpy(buf + k, "'\\''", 4);
            k += 4;
        } else {
            buf[k++] = *s;
        }
    }
    buf[k++] = '\'';
    buf[k] = '\0';
    return 0;
}

static void report_status(const char *prog, const char *script, int status)
{
    if (status == -1)
        fprintf(stderr, "%s: peer: waiting for python3: %s\n", prog,
                strerror(errno));
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        fprintf(stderr, "%s: peer: python3 not found on PATH\n", prog);
    else if (WIFEXITED(status))
        fprintf(stderr, "%s: peer: %s exited with %d\n", prog, script,
                WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        fprintf(stderr, "%s: peer: %s killed by signal %d\n", prog, script,
                WTERMSIG(status));
}

int bench_run_peer(const char *prog, const char *script, const char *args,
                   char *last, size_t size)
{
    char cmd[PATH_MAX + 512], path[PATH_MAX];
    if (strspn(args, "0123456789abcdefghijklmnopqrstuvwxyz"
                     "ABCDEFGHIJKLMNOPQRSTUVWXYZ-,. ") != strlen(args)) {
        fprintf(stderr, "%s: peer: refusing arguments '%s'\n", prog, args);
        return -1;
    }
    snprintf(cmd, sizeof cmd, "python3 ");
    snprintf(path, sizeof path, "%s/%s", FIBER_BENCH_PEER_DIR, script);
    if (shell_quote(cmd, sizeof cmd, path) != 0 ||
        strlen(cmd) + strlen(args) + 2 >= sizeof cmd) {
        fprintf(stderr, "%s: peer: path too long\n", prog);
        return -1;
    }
    if (args[0]) {
        strcat(cmd, " ");
        strcat(cmd, args);
    }
    fflush(stdout); /* keep our progress ahead of the peer's */
    fflush(stderr);
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "%s: peer: popen(%s): %s\n", prog, cmd,
                strerror(errno));
        return -1;
    }
    char line[8192];
    last[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        if (line[strspn(line, " \t\r\n")] != '\0')
            snprintf(last, size, "%s", line);
    }
    int status = pclose(f);
    if (status != 0) {
        report_status(prog, script, status);
        return -1;
    }
    if (last[0] != '{') {
        fprintf(stderr, "%s: peer: %s did not end with a JSON object: %s",
                prog, script, last[0] ? last : "(no output)\n");
        return -1;
    }
    return 0;
}

int bench_json_number(const char *json, const char *key, double *out)
{
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    p += strspn(p, " \t");
    if (*p++ != ':')
        return -1;
    p += strspn(p, " \t");
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Reads the value of the line starting with kind in file, in kB. */
static int read_kib(const char *file, const char *kind, double *kib)
{
    FILE *f = fopen(file, "r");
    if (!f)
        return -1;
    char line[256];
    size_t klen = strlen(kind);
    int rc = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, kind, klen) == 0) {
            *kib = strtod(line + klen, NULL);
            rc = 0;
            break;
        }
    }
    fclose(f);
    return rc;
}

int bench_sum_memory_kib(const long *pids, size_t n, const char *kind,
                         double *kib)
{
    int read = 0;
    *kib = 0;
    for (size_t i = 0; i < n; i++) {
        char file[64];
        snprintf(file, sizeof file, "/proc/%ld/%s", pids[i],
                 strcmp(kind, "VmRSS:") == 0 ? "status" : "smaps_rollup");
        double v;
        if (read_kib(file, kind, &v) == 0) {
            *kib += v;
            read++;
        }
    }
    return read;
}
