/*
 * bench_spawn.c -- how long it takes to start and join a local process,
 * fiber against Python's multiprocessing ('spawn' and 'fork').
 *
 * For N = 1, 16 and 128, one round starts N processes running a no-op
 * task, joins them all, and divides the wall time from the first start to
 * the last join by N.  Each N is repeated for several rounds and the
 * median is reported, because a 2-core machine running other work makes
 * single rounds wander by tens of percent.
 *
 * The peer (peer/spawn_peer.py) makes the same measurement with
 * multiprocessing in the same run, so both sides see the same machine
 * load.  Output: progress and a table on stdout, then as the LAST line one
 * JSON object; diagnostics go to stderr.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <fiber/fiber.h>

#ifndef FIBER_BENCH_PEER_DIR
#error "FIBER_BENCH_PEER_DIR must name the directory holding spawn_peer.py"
#endif

#define N_SIZES 3
#define MAX_ROUNDS 1000
/* Long enough for 128 children on a loaded 2-core box, short enough that
 * a hung child fails the benchmark instead of hanging it. */
#define JOIN_TIMEOUT_MS 60000

static const int sizes[N_SIZES] = {1, 16, 128};
/* Fewer rounds for 128: each one already averages over many processes. */
static const int default_rounds[N_SIZES] = {7, 7, 5};

struct stats {
    double median, min, max;
};

/* The peer's medians in ms per process, indexed like sizes[]. */
struct peer_result {
    double spawn[N_SIZES];
    double fork[N_SIZES];
};

struct options {
    int rounds; /* 0: the per-N defaults */
    int no_peer;
};

FIBER_TASK(bench_noop)
{
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- fiber side ---------------------------------------------------------- */

/* Starts n no-op processes into procs[].  Returns how many started; fewer
 * than n means a start failed (already reported). */
static int start_all(fiber_process **procs, int n)
{
    for (int i = 0; i < n; i++) {
        if (fiber_process_start(&procs[i], "bench_noop", NULL, 0, NULL) != 0) {
            fprintf(stderr, "bench-spawn: starting process %d of %d: %s\n",
                    i + 1, n, fiber_last_error());
            return i;
        }
    }
    return n;
}

static int join_all(fiber_process **procs, int n)
{
    for (int i = 0; i < n; i++) {
        if (fiber_process_join(procs[i], JOIN_TIMEOUT_MS) != 0) {
            fprintf(stderr, "bench-spawn: joining %s: %s\n",
                    fiber_process_name(procs[i]), fiber_last_error());
            return -1;
        }
    }
    return 0;
}

/* A no-op task that does not exit 0 means the measurement timed something
 * other than a successful process, so every code is checked. */
static int check_exits(fiber_process **procs, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int code = -1;
        if (fiber_process_exitcode(procs[i], &code) != 0) {
            fprintf(stderr, "bench-spawn: exit code of %s: %s\n",
                    fiber_process_name(procs[i]), fiber_last_error());
            bad++;
        } else if (code != 0) {
            fprintf(stderr, "bench-spawn: %s (pid %ld) exited with %d, "
                    "want 0\n", fiber_process_name(procs[i]),
                    fiber_process_pid(procs[i]), code);
            bad++;
        }
    }
    return bad ? -1 : 0;
}

static void free_all(fiber_process **procs, int n)
{
    for (int i = 0; i < n; i++)
        fiber_process_free(procs[i]);
}

/* One round: start n, join n.  Freeing the handles is kept out of the
 * timed span, as the peer's Process.close() is.  Returns 0 and the wall
 * time per process in *ms, or -1 after saying what failed. */
static int run_round(fiber_process **procs, int n, double *ms)
{
    double t0 = now_ms();
    int started = start_all(procs, n);
    int rc = started == n ? join_all(procs, n) : -1;
    double t1 = now_ms();
    if (rc == 0)
        rc = check_exits(procs, n);
    free_all(procs, started);
    *ms = (t1 - t0) / n;
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place. */
static struct stats summarize(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    struct stats s = {v[n / 2], v[0], v[n - 1]};
    if (n % 2 == 0)
        s.median = (v[n / 2 - 1] + v[n / 2]) / 2;
    return s;
}

/* Runs `rounds` rounds of n processes.  Returns 0 and their statistics in
 * *s, or -1. */
static int measure(int n, int rounds, struct stats *s)
{
    fiber_process **procs = calloc((size_t)n, sizeof *procs);
    double *ms = calloc((size_t)rounds, sizeof *ms);
    int rc = procs && ms ? 0 : -1;
    if (rc)
        fprintf(stderr, "bench-spawn: out of memory\n");
    for (int r = 0; r < rounds && rc == 0; r++)
        rc = run_round(procs, n, &ms[r]);
    if (rc == 0)
        *s = summarize(ms, rounds);
    free(procs);
    free(ms);
    return rc;
}

/* One untimed process first: the first start also starts fiber's service
 * thread and faults the binary into the page cache, one-time costs that
 * would otherwise land on the N=1 figure. */
static int warm_up(void)
{
    fiber_process *p;
    double ms;
    return run_round(&p, 1, &ms);
}

static int rounds_for(const struct options *o, int i)
{
    return o->rounds > 0 ? o->rounds : default_rounds[i];
}

static int run_fiber(const struct options *o, struct stats st[N_SIZES])
{
    if (warm_up() != 0)
        return -1;
    for (int i = 0; i < N_SIZES; i++) {
        if (measure(sizes[i], rounds_for(o, i), &st[i]) != 0)
            return -1;
        printf("fiber  N=%-4d %8.3f ms/proc  (min %.3f, max %.3f, %d "
               "rounds)\n", sizes[i], st[i].median, st[i].min, st[i].max,
               rounds_for(o, i));
        fflush(stdout); /* progress, in case the peer takes a while */
    }
    return 0;
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

static int peer_command(char *buf, size_t size, int rounds)
{
    snprintf(buf, size, "python3 ");
    if (shell_quote(buf, size, FIBER_BENCH_PEER_DIR "/spawn_peer.py") != 0)
        return -1;
    size_t k = strlen(buf);
    /* Without --rounds the peer uses the same per-N defaults as we do. */
    if (rounds > 0 &&
        (size_t)snprintf(buf + k, size - k, " --rounds %d", rounds) >=
            size - k)
        return -1;
    return 0;
}

/* Copies the object that follows "key" in json into buf.  The peer's
 * objects hold numbers only, so the first '}' closes it. */
static int json_object(const char *json, const char *key, char *buf,
                       size_t size)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *k = strstr(json, pat);
    const char *open = k ? strchr(k + strlen(pat), '{') : NULL;
    const char *close = open ? strchr(open, '}') : NULL;
    if (!close || (size_t)(close - open) + 2 > size)
        return -1;
    memcpy(buf, open, (size_t)(close - open) + 1);
    buf[close - open + 1] = '\0';
    return 0;
}

/* Parses the number after "key": in obj.  The closing quote in the
 * pattern keeps "ms_per_proc_1" from matching "ms_per_proc_16". */
static int json_number(const char *obj, const char *key, double *out)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(obj, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    p += strspn(p, " \t");
    if (*p++ != ':')
        return -1;
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno || !isfinite(v) || v <= 0)
        return -1;
    *out = v;
    return 0;
}

static int parse_method(const char *json, const char *method,
                        double out[N_SIZES])
{
    char obj[512], key[32];
    if (json_object(json, method, obj, sizeof obj) != 0)
        return -1;
    for (int i = 0; i < N_SIZES; i++) {
        snprintf(key, sizeof key, "ms_per_proc_%d", sizes[i]);
        if (json_number(obj, key, &out[i]) != 0)
            return -1;
    }
    return 0;
}

/* Reads the peer's stdout, keeping its last non-empty line. */
static void read_last_line(FILE *f, char *last, size_t size)
{
    char line[4096];
    last[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        if (line[strspn(line, " \t\r\n")] != '\0')
            snprintf(last, size, "%s", line);
    }
}

static void report_status(int status)
{
    if (status == -1)
        fprintf(stderr, "bench-spawn: peer: waiting for python3: %s\n",
                strerror(errno));
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        fprintf(stderr, "bench-spawn: peer: python3 not found on PATH\n");
    else if (WIFEXITED(status))
        fprintf(stderr, "bench-spawn: peer: spawn_peer.py exited with %d\n",
                WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        fprintf(stderr, "bench-spawn: peer: spawn_peer.py killed by signal "
                "%d\n", WTERMSIG(status));
}

/* Runs the peer and parses its figures.  Returns 0, or -1 after saying on
 * stderr why there are none. */
static int run_peer(int rounds, struct peer_result *pr)
{
    char cmd[PATH_MAX + 64], last[4096];
    if (peer_command(cmd, sizeof cmd, rounds) != 0) {
        fprintf(stderr, "bench-spawn: peer: path too long\n");
        return -1;
    }
    fflush(stdout); /* keep our progress ahead of the peer's */
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "bench-spawn: peer: popen(%s): %s\n", cmd,
                strerror(errno));
        return -1;
    }
    read_last_line(f, last, sizeof last);
    int status = pclose(f);
    if (status != 0) {
        report_status(status);
        return -1;
    }
    if (parse_method(last, "spawn", pr->spawn) != 0 ||
        parse_method(last, "fork", pr->fork) != 0) {
        fprintf(stderr, "bench-spawn: peer: cannot parse its last line: %s",
                last[0] ? last : "(no output)\n");
        return -1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------ */

/* The ratios are peer / fiber: how many times faster fiber is (below 1:
 * slower). */
static void print_table(const struct stats st[N_SIZES],
                        const struct peer_result *pr)
{
    printf("\n%5s %14s %16s %10s %10s %12s %11s\n", "N", "fiber ms/proc",
           "fiber min..max", "mp spawn", "mp fork", "spawn/fiber",
           "fork/fiber");
    for (int i = 0; i < N_SIZES; i++) {
        char range[32];
        snprintf(range, sizeof range, "%.3f..%.3f", st[i].min, st[i].max);
        printf("%5d %14.3f %16s", sizes[i], st[i].median, range);
        if (pr)
            printf(" %10.3f %10.3f %11.1fx %10.2fx\n", pr->spawn[i],
                   pr->fork[i], pr->spawn[i] / st[i].median,
                   pr->fork[i] / st[i].median);
        else
            printf(" %10s %10s %12s %11s\n", "-", "-", "-", "-");
    }
    printf("(mp = Python multiprocessing; medians in ms per process)\n\n");
}

static void print_keys(const char *name, const double v[N_SIZES])
{
    printf("\"%s\":{", name);
    for (int i = 0; i < N_SIZES; i++)
        printf("%s\"ms_per_proc_%d\":%.4f", i ? "," : "", sizes[i], v[i]);
    printf("}");
}

static void print_json(const struct stats st[N_SIZES],
                       const struct peer_result *pr)
{
    printf("{");
    for (int i = 0; i < N_SIZES; i++)
        printf("\"ms_per_proc_%d\":%.4f,", sizes[i], st[i].median);
    if (pr) {
        printf("\"peer\":{");
        print_keys("spawn", pr->spawn);
        printf(",");
        print_keys("fork", pr->fork);
        printf("}}\n");
    } else {
        printf("\"peer\":null}\n");
    }
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench-spawn [--rounds R] [--no-peer] [--help]\n"
            "Time to start and join N no-op local processes (N = 1, 16, "
            "128),\nin ms per process: the median over rounds, with min "
            "and max.\n"
            "  --rounds R  rounds per N (default 7, 7 and 5)\n"
            "  --no-peer   skip Python multiprocessing (peer/spawn_peer.py)\n"
            "The last line of output is one JSON object.\n");
}

/* Returns 0, 1 for --help, or -1 for a bad command line. */
static int parse_args(int argc, char **argv, struct options *o)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        if (strcmp(argv[i], "--no-peer") == 0) {
            o->no_peer = 1;
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            char *end;
            long r = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || r < 1 || r > MAX_ROUNDS) {
                fprintf(stderr, "bench-spawn: --rounds wants 1..%d, not "
                        "'%s'\n", MAX_ROUNDS, argv[i]);
                return -1;
            }
            o->rounds = (int)r;
        } else {
            fprintf(stderr, "bench-spawn: unknown argument '%s'\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = fiber_init(&argc, &argv); /* children never return from here */
    if (rc) {
        fprintf(stderr, "bench-spawn: fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    struct options o = {0, 0};
    rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        usage(rc > 0 ? stdout : stderr);
        return rc > 0 ? 0 : 2;
    }
    printf("bench-spawn: fiber %s, local backend, no-op task\n",
           fiber_version());
    struct stats st[N_SIZES];
    if (run_fiber(&o, st) != 0) {
        fprintf(stderr, "bench-spawn: FAILED\n");
        return 1;
    }
    struct peer_result peer, *pr = NULL;
    if (!o.no_peer && run_peer(o.rounds, &peer) == 0)
        pr = &peer;
    else if (!o.no_peer)
        fprintf(stderr, "bench-spawn: no peer figures; reporting \"peer\": "
                "null\n");
    print_table(st, pr);
    print_json(st, pr);
    return 0;
}
