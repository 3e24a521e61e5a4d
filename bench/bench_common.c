/*
 * bench_common.c -- helpers shared by the benchmarks; see bench_common.h.
 */
#include "bench_common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fiber/fiber.h>

/* ---- start-up and the command line ------------------------------------- */

int bench_init(const char *prog, int *argc, char ***argv)
{
    if (fiber_init(argc, argv) != 0) {
        fprintf(stderr, "%s: fiber_init: %s\n", prog, fiber_last_error());
        return -1;
    }
    return 0;
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

int bench_parse_args(const char *prog, int argc, char **argv,
                     const struct bench_flag *flags)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        const struct bench_flag *f = flags;
        while (f->name && strcmp(f->name, a) != 0)
            f++;
        if (!f->name) {
            fprintf(stderr, "%s: unknown argument '%s'\n", prog, a);
            return -1;
        }
        if (f->on) {
            *f->on = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s wants a value\n", prog, a);
            return -1;
        }
        const char *text = argv[++i];
        if (f->value ? bench_parse_long(prog, a, text, f->lo, f->hi, f->value)
                     : f->parse(prog, text, f->ctx))
            return -1;
    }
    return 0;
}

int bench_usage_exit(int rc, void (*usage)(FILE *))
{
    usage(rc > 0 ? stdout : stderr);
    return rc > 0 ? 0 : 2;
}

/* ---- clocks and statistics --------------------------------------------- */

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

struct bench_stats bench_summarize(double *v, size_t n)
{
    struct bench_stats s;
    s.median = bench_median(v, n);
    s.min = v[0];
    s.max = v[n - 1];
    return s;
}

int bench_time_calls(const char *prog, const char *what,
                     int (*call)(void *ctx), void *ctx, long warmup,
                     long calls, struct bench_latency *out)
{
    double *us = malloc((size_t)calls * sizeof *us);
    int rc = us ? 0 : -1;
    for (long i = 0; i < warmup && rc == 0; i++)
        rc = call(ctx);
    for (long i = 0; i < calls && rc == 0; i++) {
        uint64_t t0 = bench_now_ns();
        rc = call(ctx);
        us[i] = (double)(bench_now_ns() - t0) / 1e3;
    }
    if (rc == 0) {
        struct bench_stats s = bench_summarize(us, (size_t)calls);
        out->median_us = s.median;
        out->p99_us = bench_percentile(us, (size_t)calls, 99);
        out->min_us = s.min;
        out->max_us = s.max;
    } else {
        fprintf(stderr, "%s: %s: %s\n", prog, what,
                us ? fiber_last_error() : "out of memory");
    }
    free(us);
    return rc ? -1 : 0;
}

/* ---- the peer ---------------------------------------------------------- */

/* Appends s to buf in single quotes, so that any path survives sh: inside
 * them only ' itself is special, and it is written as '\''. */
static int shell_quote(char *buf, size_t size, const char *s)
{
    size_t k = strlen(buf);
    if (k + 1 >= size)
        return -1;
    buf[k++] = '\'';
    for (; *s; s++) {
        if (k + 6 > size) /* room for '\'' plus the closing quote and NUL */
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

int bench_peer_done(const char *prog, int rc)
{
    if (rc == 0)
        return 1;
    fprintf(stderr, "%s: no peer figures; reporting \"peer\": null\n", prog);
    return 0;
}

const char *bench_key(const char *fmt, ...)
{
    static char key[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    return key;
}

/* Where the value of "key": starts in json, or NULL.  The closing quote in
 * the pattern keeps "ms_per_proc_1" from matching "ms_per_proc_16". */
static const char *json_value(const char *json, const char *key)
{
    char pat[160];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    p += strspn(p, " \t");
    if (*p++ != ':')
        return NULL;
    return p + strspn(p, " \t");
}

int bench_json_number(const char *json, const char *key, double *out)
{
    const char *p = json_value(json, key);
    if (!p)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int bench_json_object(const char *json, const char *key, char *buf,
                      size_t size)
{
    const char *open = json_value(json, key);
    const char *close = open && *open == '{' ? strchr(open, '}') : NULL;
    if (!close || (size_t)(close - open) + 2 > size)
        return -1;
    memcpy(buf, open, (size_t)(close - open) + 1);
    buf[close - open + 1] = '\0';
    return 0;
}

int bench_json_read(const char *prog, const char *json,
                    const struct bench_figure *figs, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        double *dst = (double *)((char *)base + figs[i].offset);
        if (bench_json_number(json, figs[i].key, dst) != 0 &&
            !figs[i].optional) {
            fprintf(stderr, "%s: peer: no number for \"%s\" in: %s", prog,
                    figs[i].key, json);
            return -1;
        }
    }
    return 0;
}

int bench_peer_figures(const char *prog, const char *script, const char *args,
                       const struct bench_figure *figs, size_t n, void *base)
{
    char last[8192];
    if (bench_run_peer(prog, script, args, last, sizeof last) != 0)
        return -1;
    return bench_json_read(prog, last, figs, n, base);
}

/* ---- the JSON line ----------------------------------------------------- */

static int json_depth, json_first;

/* Starts a member: the comma before it (unless it is the first of its
 * object) and its key. */
static void json_member(const char *key)
{
    if (!json_first)
        putchar(',');
    json_first = 0;
    if (key)
        printf("\"%s\":", key);
}

void bench_json_open(const char *key)
{
    if (json_depth > 0)
        json_member(key);
    putchar('{');
    json_depth++;
    json_first = 1;
}

void bench_json_close(void)
{
    putchar('}');
    json_first = 0;
    if (--json_depth == 0)
        putchar('\n');
}

void bench_json_num(const char *key, int decimals, double v)
{
    json_member(key);
    printf("%.*f", decimals, v);
}

void bench_json_long(const char *key, long v)
{
    json_member(key);
    printf("%ld", v);
}

void bench_json_null(const char *key)
{
    json_member(key);
    printf("null");
}

void bench_json_string(const char *key, const char *s)
{
    json_member(key);
    printf("\"%s\"", s);
}

void bench_json_write(const struct bench_figure *figs, size_t n,
                      const void *base)
{
    for (size_t i = 0; i < n; i++)
        bench_json_num(figs[i].key, figs[i].decimals,
                       *(const double *)((const char *)base +
                                         figs[i].offset));
}

int bench_json_open_peer(const void *peer)
{
    if (!peer) {
        bench_json_null("peer");
        return 0;
    }
    bench_json_open("peer");
    return 1;
}

void bench_json_peer(const struct bench_figure *figs, size_t n,
                     const void *peer)
{
    if (bench_json_open_peer(peer)) {
        bench_json_write(figs, n, peer);
        bench_json_close();
    }
}

/* ---- the call-latency benchmarks ------------------------------------- */

int bench_parse_calls_args(const char *prog, int argc, char **argv,
                           long min_warmup, struct bench_calls_options *o)
{
    o->calls = BENCH_DEFAULT_CALLS;
    o->warmup = BENCH_DEFAULT_WARMUP;
    o->no_peer = 0;
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o->no_peer},
        {"--calls", .value = &o->calls, .lo = 1, .hi = 10000000},
        {"--warmup", .value = &o->warmup, .lo = min_warmup, .hi = 10000000},
        {NULL},
    };
    return bench_parse_args(prog, argc, argv, flags);
}

int bench_peer_calls(const char *prog, const char *script,
                     const struct bench_calls_options *o,
                     const struct bench_figure *figs, size_t n, void *base)
{
    if (o->no_peer)
        return 0;
    char args[128];
    snprintf(args, sizeof args, "--calls %ld --warmup %ld", o->calls,
             o->warmup);
    return bench_peer_done(prog,
                           bench_peer_figures(prog, script, args, figs, n,
                                              base));
}

void bench_json_calls_line(const struct bench_figure *figs, size_t n,
                           const void *own, long calls, const void *peer)
{
    bench_json_open(NULL);
    bench_json_write(figs, n, own);
    bench_json_long("calls", calls);
    bench_json_peer(figs, n, peer);
    bench_json_close();
}

/* ---- /proc and the like ------------------------------------------------ */

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

long bench_read_long_file(const char *path)
{
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

long bench_count_open_fds(void)
{
    char path[64];
    long n = 0;
    for (int fd = 0; fd < 65536; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (access(path, F_OK) == 0)
            n++;
    }
    return n;
}
