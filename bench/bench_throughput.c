/*
 * bench_throughput.c -- how many tiny tasks per second fiber_pool_map moves
 * through a 2-worker pool, fiber against Python's multiprocessing.Pool.map.
 *
 * The input is --tasks (default 1,000,000) fixed-size 8-byte records; the
 * task is a no-op that returns its 8-byte input, so the map's output must
 * equal its input, which is checked after every run (a map that loses or
 * misplaces a result fails the benchmark).  Two runs:
 *
 *   chunk1  chunksize 1: every task travels alone (the pool still batches
 *           frames per system call);
 *   auto    chunksize 0: the pool sizes chunks from the measured task time.
 *
 * Each is repeated --runs times (default 5) and the MEDIAN tasks/s
 * reported; a short untimed map first waits for both workers to connect.
 *
 * The peer (peer/throughput_peer.py) runs Pool(2).map over --peer-tasks
 * (default 200,000) ints with chunksize=1 (it is ~40x slower, so fewer
 * tasks keep the run short; the figure is a rate) and over --tasks ints
 * with its default chunking.  Output: a table on stdout, then as the LAST
 * line one JSON object: chunk1_tasks_per_s, auto_tasks_per_s, the peer's
 * under "peer".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-throughput"
#define WORKERS 2
#define DEFAULT_TASKS 1000000
#define DEFAULT_PEER_TASKS 200000
#define DEFAULT_RUNS 5
#define MAX_RUNS 64

struct options {
    long tasks, peer_tasks, runs;
    int no_peer;
};

struct rate {
    double median, min, max; /* tasks per second */
};

/* The no-op: returns its 8-byte record unchanged. */
FIBER_TASK(bench_echo8)
{
    if (len != 8)
        return fiber_task_fail("bench_echo8 wants 8 bytes, got %zu", len);
    return fiber_buf_append(out, arg, 8);
}

/* ---- fiber side ---------------------------------------------------------- */

/* One map; returns tasks/s, or -1 after saying what failed. */
static double one_map(fiber_pool *pool, const uint64_t *in, uint64_t *out,
                      size_t n, size_t chunksize)
{
    memset(out, 0, n * sizeof *out);
    double t0 = bench_now_s();
    int rc = fiber_pool_map(pool, "bench_echo8", in, sizeof *in, n, out,
                            sizeof *out, chunksize);
    double t = bench_now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, PROG ": map (chunksize %zu): %s\n", chunksize,
                fiber_last_error());
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (out[i] != in[i]) {
            fprintf(stderr, PROG ": WRONG RESULT: map (chunksize %zu) "
                    "gave %" PRIu64 " at index %zu, want %" PRIu64 "\n",
                    chunksize, out[i], i, in[i]);
            return -1;
        }
    }
    return (double)n / t;
}

static int measure(fiber_pool *pool, const uint64_t *in, uint64_t *out,
                   const struct options *o, size_t chunksize, struct rate *r)
{
    double v[MAX_RUNS];
    for (long k = 0; k < o->runs; k++) {
        v[k] = one_map(pool, in, out, (size_t)o->tasks, chunksize);
        if (v[k] < 0)
            return -1;
    }
    r->median = bench_median(v, (size_t)o->runs);
    r->min = v[0];
    r->max = v[o->runs - 1];
    printf("fiber  chunksize %-5s %12.0f tasks/s  (min %.0f, max %.0f, %ld "
           "runs of %ld)\n", chunksize ? "1" : "auto", r->median, r->min,
           r->max, o->runs, o->tasks);
    fflush(stdout);
    return 0;
}

static int run_fiber(const struct options *o, struct rate *c1,
                     struct rate *au)
{
    size_t n = (size_t)o->tasks;
    uint64_t *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
    if (!in || !out) {
        fprintf(stderr, PROG ": out of memory for %zu records\n", n);
        free(in);
        free(out);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        in[i] = (uint64_t)i * 2654435761u + 1; /* distinct, not 0 */
    fiber_pool *pool;
    fiber_pool_opts po = {.workers = WORKERS};
    int rc = fiber_pool_create(&pool, &po);
    if (rc != 0) {
        fprintf(stderr, PROG ": fiber_pool_create: %s\n", fiber_last_error());
    } else {
        /* Untimed: both workers connect, the pages of in/out are touched. */
        rc = one_map(pool, in, out, n < 20000 ? n : 20000, 1) < 0 ? -1 : 0;
        if (rc == 0)
            rc = measure(pool, in, out, o, 1, c1);
        if (rc == 0)
            rc = measure(pool, in, out, o, 0, au);
        fiber_pool_free(pool);
    }
    free(in);
    free(out);
    return rc ? -1 : 0;
}

/* ---- the peer ------------------------------------------------------------ */

static int run_peer(const struct options *o, double *c1, double *au)
{
    char args[128], last[4096];
    snprintf(args, sizeof args, "--tasks %ld --chunk1-tasks %ld --runs %ld",
             o->tasks, o->peer_tasks, o->runs);
    if (bench_run_peer(PROG, "throughput_peer.py", args, last, sizeof last))
        return -1;
    if (bench_json_number(last, "chunk1_tasks_per_s", c1) ||
        bench_json_number(last, "auto_tasks_per_s", au)) {
        fprintf(stderr, PROG ": peer: missing figures in: %s", last);
        return -1;
    }
    return 0;
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--tasks N] [--peer-tasks N] [--runs R] "
            "[--no-peer] [--help]\n"
            "No-op tasks per second through fiber_pool_map on a 2-worker "
            "pool, 8-byte\nrecords in and out, chunksize 1 and automatic; "
            "the median of R runs.\n"
            "  --tasks N       records per map (default %d)\n"
            "  --peer-tasks N  tasks of the peer's chunksize=1 map "
            "(default %d)\n"
            "  --runs R        runs of each (default %d)\n"
            "  --no-peer       skip Python multiprocessing "
            "(peer/throughput_peer.py)\n"
            "The last line of output is one JSON object.\n",
            DEFAULT_TASKS, DEFAULT_PEER_TASKS, DEFAULT_RUNS);
}

static int parse_args(int argc, char **argv, struct options *o)
{
    o->tasks = DEFAULT_TASKS;
    o->peer_tasks = DEFAULT_PEER_TASKS;
    o->runs = DEFAULT_RUNS;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        if (strcmp(argv[i], "--no-peer") == 0) {
            o->no_peer = 1;
        } else if (strcmp(argv[i], "--tasks") == 0 && i + 1 < argc) {
            if (bench_parse_long(PROG, "--tasks", argv[++i], 1, 100000000,
                                 &o->tasks))
                return -1;
        } else if (strcmp(argv[i], "--peer-tasks") == 0 && i + 1 < argc) {
            if (bench_parse_long(PROG, "--peer-tasks", argv[++i], 1,
                                 100000000, &o->peer_tasks))
                return -1;
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            if (bench_parse_long(PROG, "--runs", argv[++i], 1, MAX_RUNS,
                                 &o->runs))
                return -1;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s'\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* children never return here */
        fprintf(stderr, PROG ": fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    struct options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        usage(rc > 0 ? stdout : stderr);
        return rc > 0 ? 0 : 2;
    }
    printf(PROG ": fiber %s, local backend, %d workers, %ld no-op tasks "
           "of 8 bytes\n", fiber_version(), WORKERS, o.tasks);
    struct rate c1, au;
    if (run_fiber(&o, &c1, &au) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    double pc1 = 0, pau = 0;
    int have_peer = 0;
    if (!o.no_peer && run_peer(&o, &pc1, &pau) == 0)
        have_peer = 1;
    else if (!o.no_peer)
        fprintf(stderr, PROG ": no peer figures; reporting \"peer\": null\n");
    printf("\n%-10s %14s %14s %10s\n", "chunksize", "fiber tasks/s",
           "mp tasks/s", "fiber/mp");
    if (have_peer) {
        printf("%-10s %14.0f %14.0f %9.1fx\n", "1", c1.median, pc1,
               c1.median / pc1);
        printf("%-10s %14.0f %14.0f %9.1fx\n", "auto", au.median, pau,
               au.median / pau);
    } else {
        printf("%-10s %14.0f %14s %10s\n", "1", c1.median, "-", "-");
        printf("%-10s %14.0f %14s %10s\n", "auto", au.median, "-", "-");
    }
    printf("(medians of %ld runs; mp = Python multiprocessing.Pool(2).map: "
           "chunksize=1 over %ld tasks,\n 'auto' = its default chunking "
           "over %ld tasks; fiber/mp above 1: fiber faster)\n\n", o.runs,
           o.peer_tasks, o.tasks);
    printf("{\"chunk1_tasks_per_s\":%.0f,\"auto_tasks_per_s\":%.0f,"
           "\"tasks\":%ld,\"runs\":%ld,", c1.median, au.median, o.tasks,
           o.runs);
    if (have_peer)
        printf("\"peer\":{\"chunk1_tasks_per_s\":%.0f,"
               "\"auto_tasks_per_s\":%.0f,\"chunk1_tasks\":%ld}}\n", pc1, pau,
               o.peer_tasks);
    else
        printf("\"peer\":null}\n");
    return 0;
}
