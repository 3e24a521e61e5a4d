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
#include <stdio.h>
#include <stdlib.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-spawn"
#define N_SIZES 3
#define MAX_ROUNDS 1000
/* Long enough for 128 children on a loaded 2-core box, short enough that
 * a hung child fails the benchmark instead of hanging it. */
#define JOIN_TIMEOUT_MS 60000

static const int sizes[N_SIZES] = {1, 16, 128};
/* Fewer rounds for 128: each one already averages over many processes. */
static const int default_rounds[N_SIZES] = {7, 7, 5};

/* The peer's medians in ms per process, indexed like sizes[]. */
struct peer_result {
    double spawn[N_SIZES];
    double fork[N_SIZES];
};

struct options {
    long rounds; /* 0: the per-N defaults */
    int no_peer;
};

FIBER_TASK(bench_noop)
{
    return 0;
}

/* ---- fiber side ---------------------------------------------------------- */

/* Starts n no-op processes into procs[].  Returns how many started; fewer
 * than n means a start failed (already reported). */
static int start_all(fiber_process **procs, int n)
{
    for (int i = 0; i < n; i++) {
        if (fiber_process_start(&procs[i], "bench_noop", NULL, 0, NULL) != 0) {
            fprintf(stderr, PROG ": starting process %d of %d: %s\n",
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
            fprintf(stderr, PROG ": joining %s: %s\n",
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
            fprintf(stderr, PROG ": exit code of %s: %s\n",
                    fiber_process_name(procs[i]), fiber_last_error());
            bad++;
        } else if (code != 0) {
            fprintf(stderr, PROG ": %s (pid %ld) exited with %d, "
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
    uint64_t t0 = bench_now_ns();
    int started = start_all(procs, n);
    int rc = started == n ? join_all(procs, n) : -1;
    uint64_t t1 = bench_now_ns();
    if (rc == 0)
        rc = check_exits(procs, n);
    free_all(procs, started);
    *ms = (double)(t1 - t0) / 1e6 / n;
    return rc;
}

/* Runs `rounds` rounds of n processes.  Returns 0 and their statistics in
 * *s, or -1. */
static int measure(int n, int rounds, struct bench_stats *s)
{
    fiber_process **procs = calloc((size_t)n, sizeof *procs);
    double *ms = calloc((size_t)rounds, sizeof *ms);
    int rc = procs && ms ? 0 : -1;
    if (rc)
        fprintf(stderr, PROG ": out of memory\n");
    for (int r = 0; r < rounds && rc == 0; r++)
        rc = run_round(procs, n, &ms[r]);
    if (rc == 0)
        *s = bench_summarize(ms, (size_t)rounds);
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
    return o->rounds > 0 ? (int)o->rounds : default_rounds[i];
}

static int run_fiber(const struct options *o, struct bench_stats st[N_SIZES])
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

/* The peer's medians of one start method, from its object under
 * "method". */
static int parse_method(const char *json, const char *method,
                        double out[N_SIZES])
{
    char obj[512];
    if (bench_json_object(json, method, obj, sizeof obj) != 0)
        return -1;
    for (int i = 0; i < N_SIZES; i++) {
        if (bench_json_number(obj, bench_key("ms_per_proc_%d", sizes[i]),
                              &out[i]) != 0 ||
            out[i] <= 0)
            return -1;
    }
    return 0;
}

/* Runs the peer and parses its figures.  Returns 0, or -1 after saying on
 * stderr why there are none. */
static int run_peer(long rounds, struct peer_result *pr)
{
    char args[64] = "", last[4096];
    /* Without --rounds the peer uses the same per-N defaults as we do. */
    if (rounds > 0)
        snprintf(args, sizeof args, "--rounds %ld", rounds);
    if (bench_run_peer(PROG, "spawn_peer.py", args, last, sizeof last))
        return -1;
    if (parse_method(last, "spawn", pr->spawn) != 0 ||
        parse_method(last, "fork", pr->fork) != 0) {
        fprintf(stderr, PROG ": peer: cannot parse its last line: %s", last);
        return -1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------ */

/* The ratios are peer / fiber: how many times faster fiber is (below 1:
 * slower). */
static void print_table(const struct bench_stats st[N_SIZES],
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

/* The medians v as "ms_per_proc_<N>" members. */
static void print_keys(const double v[N_SIZES])
{
    for (int i = 0; i < N_SIZES; i++)
        bench_json_num(bench_key("ms_per_proc_%d", sizes[i]), 4, v[i]);
}

static void print_json(const struct bench_stats st[N_SIZES],
                       const struct peer_result *pr)
{
    double medians[N_SIZES];
    for (int i = 0; i < N_SIZES; i++)
        medians[i] = st[i].median;
    bench_json_open(NULL);
    print_keys(medians);
    if (bench_json_open_peer(pr)) {
        bench_json_open("spawn");
        print_keys(pr->spawn);
        bench_json_close();
        bench_json_open("fork");
        print_keys(pr->fork);
        bench_json_close();
        bench_json_close();
    }
    bench_json_close();
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--rounds R] [--no-peer] [--help]\n"
            "Time to start and join N no-op local processes (N = 1, 16, "
            "128),\nin ms per process: the median over rounds, with min "
            "and max.\n"
            "  --rounds R  rounds per N (default 7, 7 and 5)\n"
            "  --no-peer   skip Python multiprocessing (peer/spawn_peer.py)\n"
            "The last line of output is one JSON object.\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o = {0, 0};
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o.no_peer},
        {"--rounds", .value = &o.rounds, .lo = 1, .hi = MAX_ROUNDS},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, no-op task\n", fiber_version());
    struct bench_stats st[N_SIZES];
    if (run_fiber(&o, st) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    struct peer_result peer, *pr = NULL;
    if (!o.no_peer && bench_peer_done(PROG, run_peer(o.rounds, &peer)))
        pr = &peer;
    print_table(st, pr);
    print_json(st, pr);
    return 0;
}
