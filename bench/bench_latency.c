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
#include <stddef.h>
#include <stdio.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-latency"
/* One side's figures: the 1-worker pool and the 2-worker pool. */
struct figures {
    struct bench_latency w1, w2;
};

/* In the JSON line and the peer's, in this order. */
static const struct bench_figure figure_keys[] = {
    {"median_us", offsetof(struct figures, w1.median_us), 2, 0},
    {"p99_us", offsetof(struct figures, w1.p99_us), 2, 0},
    {"median_us_2w", offsetof(struct figures, w2.median_us), 2, 0},
    {"p99_us_2w", offsetof(struct figures, w2.p99_us), 2, 0},
};
#define N_FIGURES (sizeof figure_keys / sizeof figure_keys[0])

FIBER_TASK(bench_noop)
{
    return 0;
}

/* ---- fiber side ---------------------------------------------------------- */

static int apply_noop(void *pool)
{
    return fiber_pool_apply(pool, "bench_noop", NULL, 0, NULL);
}

static int measure(int workers, const struct bench_calls_options *o,
                   struct bench_latency *l)
{
    fiber_pool *pool;
    fiber_pool_opts po = {.workers = workers};
    if (fiber_pool_create(&pool, &po) != 0) {
        fprintf(stderr, PROG ": fiber_pool_create: %s\n", fiber_last_error());
        return -1;
    }
    char what[64];
    snprintf(what, sizeof what, "fiber_pool_apply (%d workers)", workers);
    /* The first (warm-up) call waits for the worker to start and connect. */
    int rc = bench_time_calls(PROG, what, apply_noop, pool, o->warmup,
                              o->calls, l);
    fiber_pool_free(pool);
    if (rc == 0) {
        printf("fiber  %d worker%s  median %8.1f us  p99 %8.1f us  "
               "(min %.1f, max %.1f, %ld calls)\n", workers,
               workers > 1 ? "s" : " ", l->median_us, l->p99_us, l->min_us,
               l->max_us, o->calls);
        fflush(stdout);
    }
    return rc;
}

/* ---- output ------------------------------------------------------------ */

static void print_row(const char *what, const struct bench_latency *f,
                      const struct bench_latency *p)
{
    printf("%-10s %12.1f %12.1f", what, f->median_us, f->p99_us);
    if (p)
        printf(" %12.1f %12.1f %10.1fx %10.1fx\n", p->median_us, p->p99_us,
               p->median_us / f->median_us, p->p99_us / f->p99_us);
    else
        printf(" %12s %12s %11s %11s\n", "-", "-", "-", "-");
}

static void print_table(const struct figures *f, const struct figures *p)
{
    printf("\n%-10s %12s %12s %12s %12s %11s %11s\n", "pool", "fiber med us",
           "fiber p99 us", "mp med us", "mp p99 us", "med x", "p99 x");
    print_row("1 worker", &f->w1, p ? &p->w1 : NULL);
    print_row("2 workers", &f->w2, p ? &p->w2 : NULL);
    printf("(x = mp / fiber: how many times faster fiber is; mp = Python "
           "multiprocessing.Pool.apply)\n\n");
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
            BENCH_DEFAULT_CALLS, BENCH_DEFAULT_WARMUP);
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct bench_calls_options o;
    int rc = bench_parse_calls_args(PROG, argc, argv, 1, &o);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, no-op task, %ld calls after "
           "%ld warm-up\n", fiber_version(), o.calls, o.warmup);
    struct figures f, p, *pp = NULL;
    if (measure(1, &o, &f.w1) != 0 || measure(2, &o, &f.w2) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    if (bench_peer_calls(PROG, "latency_peer.py", &o, figure_keys, N_FIGURES,
                         &p))
        pp = &p;
    print_table(&f, pp);
    bench_json_calls_line(figure_keys, N_FIGURES, &f, o.calls, pp);
    return 0;
}
