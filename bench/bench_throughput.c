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
#include <stddef.h>
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

/* The peer's medians, tasks per second. */
struct peer_rates {
    double chunk1, automatic;
};

/* In the JSON line and the peer's, in this order. */
static const struct bench_figure peer_keys[] = {
    {"chunk1_tasks_per_s", offsetof(struct peer_rates, chunk1), 0, 0},
    {"auto_tasks_per_s", offsetof(struct peer_rates, automatic), 0, 0},
};
#define N_PEER_KEYS (sizeof peer_keys / sizeof peer_keys[0])

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

/* Tasks per second of o->runs maps. */
static int measure(fiber_pool *pool, const uint64_t *in, uint64_t *out,
                   const struct options *o, size_t chunksize,
                   struct bench_stats *r)
{
    double v[MAX_RUNS];
    for (long k = 0; k < o->runs; k++) {
        v[k] = one_map(pool, in, out, (size_t)o->tasks, chunksize);
        if (v[k] < 0)
            return -1;
    }
    *r = bench_summarize(v, (size_t)o->runs);
    printf("fiber  chunksize %-5s %12.0f tasks/s  (min %.0f, max %.0f, %ld "
           "runs of %ld)\n", chunksize ? "1" : "auto", r->median, r->min,
           r->max, o->runs, o->tasks);
    fflush(stdout);
    return 0;
}

static int run_fiber(const struct options *o, struct bench_stats *c1,
                     struct bench_stats *au)
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

static int run_peer(const struct options *o, struct peer_rates *p)
{
    char args[128];
    snprintf(args, sizeof args, "--tasks %ld --chunk1-tasks %ld --runs %ld",
             o->tasks, o->peer_tasks, o->runs);
    return bench_peer_figures(PROG, "throughput_peer.py", args, peer_keys,
                              N_PEER_KEYS, p);
}

/* ---- output ------------------------------------------------------------ */

static void print_row(const char *what, double f, const double *p)
{
    if (p)
        printf("%-10s %14.0f %14.0f %9.1fx\n", what, f, *p, f / *p);
    else
        printf("%-10s %14.0f %14s %10s\n", what, f, "-", "-");
}

static void print_table(const struct options *o, const struct bench_stats *c1,
                        const struct bench_stats *au,
                        const struct peer_rates *p)
{
    printf("\n%-10s %14s %14s %10s\n", "chunksize", "fiber tasks/s",
           "mp tasks/s", "fiber/mp");
    print_row("1", c1->median, p ? &p->chunk1 : NULL);
    print_row("auto", au->median, p ? &p->automatic : NULL);
    printf("(medians of %ld runs; mp = Python multiprocessing.Pool(2).map: "
           "chunksize=1 over %ld tasks,\n 'auto' = its default chunking "
           "over %ld tasks; fiber/mp above 1: fiber faster)\n\n", o->runs,
           o->peer_tasks, o->tasks);
}

static void print_json(const struct options *o, const struct bench_stats *c1,
                       const struct bench_stats *au,
                       const struct peer_rates *p)
{
    bench_json_open(NULL);
    bench_json_num("chunk1_tasks_per_s", 0, c1->median);
    bench_json_num("auto_tasks_per_s", 0, au->median);
    bench_json_long("tasks", o->tasks);
    bench_json_long("runs", o->runs);
    if (bench_json_open_peer(p)) {
        bench_json_write(peer_keys, N_PEER_KEYS, p);
        bench_json_long("chunk1_tasks", o->peer_tasks);
        bench_json_close();
    }
    bench_json_close();
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

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o = {DEFAULT_TASKS, DEFAULT_PEER_TASKS, DEFAULT_RUNS, 0};
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o.no_peer},
        {"--tasks", .value = &o.tasks, .lo = 1, .hi = 100000000},
        {"--peer-tasks", .value = &o.peer_tasks, .lo = 1, .hi = 100000000},
        {"--runs", .value = &o.runs, .lo = 1, .hi = MAX_RUNS},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, %d workers, %ld no-op tasks "
           "of 8 bytes\n", fiber_version(), WORKERS, o.tasks);
    struct bench_stats c1, au;
    if (run_fiber(&o, &c1, &au) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    struct peer_rates p, *pp = NULL;
    if (!o.no_peer && bench_peer_done(PROG, run_peer(&o, &p)))
        pp = &p;
    print_table(&o, &c1, &au, pp);
    print_json(&o, &c1, &au, pp);
    return 0;
}
