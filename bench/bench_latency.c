/*
 * bench_latency.c -- round trip of one fiber_pool_apply of a no-op task,
 * fiber against Python's multiprocessing.Pool.apply.
 *
 * The main figure uses a 1-worker pool: master and worker then fit this
 * machine's 2 cores, so fiber lets both ends spin briefly instead of
 * sleeping in the kernel (a cross-core wakeup costs ~40 us here; see
 * DESIGN.md, "Transport").  After a warm-up (which also waits for the
 * worker to connect), --calls calls are timed one by one (clock_gettime
 * around fiber_pool_apply) and the median and 99th percentile reported.
 *
 * As extra information the same is measured on a 2-worker pool, where
 * three processes share two cores, fiber does not spin, and every hop is a
 * kernel wakeup: the figure a pool with more workers than spare cores sees.
 *
 * The peer (peer/latency_peer.py) times multiprocessing.Pool(1).apply and
 * Pool(2).apply of a no-op the same way.  Output: a table on stdout, then
 * as the LAST line one JSON object: median_us, p99_us (1 worker) and the
 * extras median_us_2w, p99_us_2w, the peer's under "peer".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-latency"
#define DEFAULT_CALLS 20000
#define DEFAULT_WARMUP 2000

struct options {
    long calls, warmup;
    int no_peer;
};

struct lat {
    double median_us, p99_us, min_us, max_us;
};

FIBER_TASK(bench_noop)
{
    return 0;
}

/* ---- fiber side ---------------------------------------------------------- */

static int measure(int workers, const struct options *o, struct lat *l)
{
    fiber_pool *pool;
    fiber_pool_opts po = {.workers = workers};
    if (fiber_pool_create(&pool, &po) != 0) {
        fprintf(stderr, PROG ": fiber_pool_create: %s\n", fiber_last_error());
        return -1;
    }
    double *us = malloc((size_t)o->calls * sizeof *us);
    int rc = us ? 0 : -1;
    /* The first call waits for the worker to start and connect. */
    for (long i = 0; i < o->warmup && rc == 0; i++)
        rc = fiber_pool_apply(pool, "bench_noop", NULL, 0, NULL);
    for (long i = 0; i < o->calls && rc == 0; i++) {
        uint64_t t0 = bench_now_ns();
        rc = fiber_pool_apply(pool, "bench_noop", NULL, 0, NULL);
        us[i] = (double)(bench_now_ns() - t0) / 1e3;
    }
    if (rc != 0)
        fprintf(stderr, PROG ": fiber_pool_apply (%d workers): %s\n", workers,
                us ? fiber_last_error() : "out of memory");
    fiber_pool_free(pool);
    if (rc == 0) {
        size_t n = (size_t)o->calls;
        l->median_us = bench_median(us, n);
        l->p99_us = bench_percentile(us, n, 99);
        l->min_us = us[0];
        l->max_us = us[n - 1];
        printf("fiber  %d worker%s  median %8.1f us  p99 %8.1f us  "
               "(min %.1f, max %.1f, %ld calls)\n", workers,
               workers > 1 ? "s" : " ", l->median_us, l->p99_us, l->min_us,
               l->max_us, o->calls);
        fflush(stdout);
    }
    free(us);
    return rc ? -1 : 0;
}

/* ---- the peer ------------------------------------------------------------ */

static int run_peer(const struct options *o, struct lat *p1, struct lat *p2)
{
    char args[128], last[4096];
    snprintf(args, sizeof args, "--calls %ld --warmup %ld", o->calls,
             o->warmup);
    if (bench_run_peer(PROG, "latency_peer.py", args, last, sizeof last))
        return -1;
    if (bench_json_number(last, "median_us", &p1->median_us) ||
        bench_json_number(last, "p99_us", &p1->p99_us) ||
        bench_json_number(last, "median_us_2w", &p2->median_us) ||
        bench_json_number(last, "p99_us_2w", &p2->p99_us)) {
        fprintf(stderr, PROG ": peer: missing figures in: %s", last);
        return -1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------ */

static void print_row(const char *what, const struct lat *f,
                      const struct lat *p)
{
    printf("%-10s %12.1f %12.1f", what, f->median_us, f->p99_us);
    if (p)
        printf(" %12.1f %12.1f %10.1fx %10.1fx\n", p->median_us, p->p99_us,
               p->median_us / f->median_us, p->p99_us / f->p99_us);
    else
        printf(" %12s %12s %11s %11s\n", "-", "-", "-", "-");
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--calls N] [--warmup N] [--no-peer] [--help]\n"
            "Round trip of fiber_pool_apply of a no-op task on a 1-worker "
            "pool (and,\nas extra information, a 2-worker pool): median and "
            "99th percentile in us.\n"
            "  --calls N   timed calls per pool (default %d)\n"
            "  --warmup N  untimed calls first (default %d)\n"
            "  --no-peer   skip Python multiprocessing "
            "(peer/latency_peer.py)\n"
            "The last line of output is one JSON object.\n",
            DEFAULT_CALLS, DEFAULT_WARMUP);
}

static int parse_args(int argc, char **argv, struct options *o)
{
    o->calls = DEFAULT_CALLS;
    o->warmup = DEFAULT_WARMUP;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        if (strcmp(argv[i], "--no-peer") == 0) {
            o->no_peer = 1;
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            if (bench_parse_long(PROG, "--calls", argv[++i], 1, 10000000,
                                 &o->calls))
                return -1;
        } else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc) {
            if (bench_parse_long(PROG, "--warmup", argv[++i], 1, 10000000,
                                 &o->warmup))
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
    printf(PROG ": fiber %s, local backend, no-op task, %ld calls after "
           "%ld warm-up\n", fiber_version(), o.calls, o.warmup);
    struct lat f1, f2, p1, p2;
    if (measure(1, &o, &f1) != 0 || measure(2, &o, &f2) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    int have_peer = 0;
    if (!o.no_peer && run_peer(&o, &p1, &p2) == 0)
        have_peer = 1;
    else if (!o.no_peer)
        fprintf(stderr, PROG ": no peer figures; reporting \"peer\": null\n");
    printf("\n%-10s %12s %12s %12s %12s %11s %11s\n", "pool", "fiber med us",
           "fiber p99 us", "mp med us", "mp p99 us", "med x", "p99 x");
    print_row("1 worker", &f1, have_peer ? &p1 : NULL);
    print_row("2 workers", &f2, have_peer ? &p2 : NULL);
    printf("(x = mp / fiber: how many times faster fiber is; mp = Python "
           "multiprocessing.Pool.apply)\n\n");
    printf("{\"median_us\":%.2f,\"p99_us\":%.2f,\"median_us_2w\":%.2f,"
           "\"p99_us_2w\":%.2f,\"calls\":%ld,", f1.median_us, f1.p99_us,
           f2.median_us, f2.p99_us, o.calls);
    if (have_peer)
        printf("\"peer\":{\"median_us\":%.2f,\"p99_us\":%.2f,"
               "\"median_us_2w\":%.2f,\"p99_us_2w\":%.2f}}\n", p1.median_us,
               p1.p99_us, p2.median_us, p2.p99_us);
    else
        printf("\"peer\":null}\n");
    return 0;
}
