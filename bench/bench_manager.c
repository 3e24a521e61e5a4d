/*
 * bench_manager.c -- round trips to a manager's shared objects, fiber
 * against Python's multiprocessing.Manager().
 *
 * Two figures, each the median (and 99th percentile) of --calls timed
 * pairs after --warmup untimed ones, every pair timed on its own with
 * CLOCK_MONOTONIC:
 *   - a dict pair: fiber_dict_set of a 16-byte key to a 64-byte value,
 *     then fiber_dict_get of it (Python: d[k] = v; d[k]);
 *   - a lock pair: fiber_lock_acquire then fiber_lock_release of an
 *     uncontended lock (Python: lock.acquire(); lock.release()).
 * Both are synchronous calls, two round trips to the manager per pair.
 *
 * The calls are made from the master.  A child makes the same calls over
 * the same kind of connection (each process dials the manager directly,
 * a unix socket locally), so the figures stand for any client process;
 * the peer, likewise, calls its Manager from its main process.
 *
 * The peer (peer/manager_peer.py) runs in the same invocation unless
 * --no-peer.  Output: a table on stdout, then as the LAST line one JSON
 * object: dict_set_get_median_us, lock_pair_median_us (and their p99s),
 * the peer's under "peer".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-manager"
#define DEFAULT_CALLS 20000
#define DEFAULT_WARMUP 2000

struct options {
    long calls, warmup;
    int no_peer;
};

struct lat {
    double median_us, p99_us;
};

struct figures {
    struct lat dict, lock;
};

/* ---- fiber side ---------------------------------------------------------- */

static int dict_pair(fiber_mobj *d, fiber_buf *got)
{
    static const char key[16] = "bench-key-00001";
    static const char val[64] = "a 64-byte value";
    got->len = 0;
    int rc = fiber_dict_set(d, key, sizeof key, val, sizeof val, NULL);
    return rc ? rc : fiber_dict_get(d, key, sizeof key, got, NULL);
}

static int lock_pair(fiber_mobj *l)
{
    int rc = fiber_lock_acquire(l, -1, NULL);
    return rc ? rc : fiber_lock_release(l, NULL);
}

/* Times o->calls pairs of `which` (0 dict, 1 lock) after the warm-up. */
static int time_pairs(int which, fiber_mobj *o, const struct options *opt,
                      struct lat *out)
{
    double *us = malloc((size_t)opt->calls * sizeof *us);
    fiber_buf got = {0};
    int rc = us ? 0 : FIBER_ENOMEM;
    for (long i = 0; i < opt->warmup && rc == 0; i++)
        rc = which ? lock_pair(o) : dict_pair(o, &got);
    for (long i = 0; i < opt->calls && rc == 0; i++) {
        uint64_t t0 = bench_now_ns();
        rc = which ? lock_pair(o) : dict_pair(o, &got);
        us[i] = (double)(bench_now_ns() - t0) / 1e3;
    }
    if (rc == 0) {
        out->median_us = bench_median(us, (size_t)opt->calls);
        out->p99_us = bench_percentile(us, (size_t)opt->calls, 99);
    } else {
        fprintf(stderr, PROG ": %s pair: %s\n", which ? "lock" : "dict",
                us ? fiber_last_error() : "out of memory");
    }
    fiber_buf_free(&got);
    free(us);
    return rc ? -1 : 0;
}

static int run_fiber(const struct options *o, struct figures *f)
{
    fiber_manager *m;
    fiber_mobj *d = NULL, *l = NULL;
    if (fiber_manager_start(&m, NULL) != 0) {
        fprintf(stderr, PROG ": fiber_manager_start: %s\n",
                fiber_last_error());
        return -1;
    }
    int rc = fiber_manager_dict(m, "bench-dict", &d) == 0 &&
                     fiber_manager_lock(m, "bench-lock", &l) == 0
                 ? 0
                 : -1;
    if (rc)
        fprintf(stderr, PROG ": opening objects: %s\n", fiber_last_error());
    if (rc == 0)
        rc = time_pairs(0, d, o, &f->dict);
    if (rc == 0)
        rc = time_pairs(1, l, o, &f->lock);
    fiber_mobj_free(d);
    fiber_mobj_free(l);
    fiber_manager_free(m);
    return rc;
}

/* ---- the peer ------------------------------------------------------------ */

static int run_peer(const struct options *o, struct figures *p)
{
    char args[128], last[4096];
    snprintf(args, sizeof args, "--calls %ld --warmup %ld", o->calls,
             o->warmup);
    if (bench_run_peer(PROG, "manager_peer.py", args, last, sizeof last))
        return -1;
    if (bench_json_number(last, "dict_set_get_median_us",
                          &p->dict.median_us) ||
        bench_json_number(last, "dict_set_get_p99_us", &p->dict.p99_us) ||
        bench_json_number(last, "lock_pair_median_us", &p->lock.median_us) ||
        bench_json_number(last, "lock_pair_p99_us", &p->lock.p99_us)) {
        fprintf(stderr, PROG ": peer: missing figures in: %s", last);
        return -1;
    }
    return 0;
}

/* ---- output ---------------------------------------------------------------- */

static void print_row(const char *what, const struct lat *f,
                      const struct lat *p)
{
    printf("%-18s %12.1f %12.1f", what, f->median_us, f->p99_us);
    if (p)
        printf(" %12.1f %12.1f %10.1fx\n", p->median_us, p->p99_us,
               p->median_us / f->median_us);
    else
        printf(" %12s %12s %11s\n", "-", "-", "-");
}

static void print_table(const struct figures *f, const struct figures *p)
{
    printf("\n%-18s %12s %12s %12s %12s %11s\n", "pair", "fiber med us",
           "fiber p99 us", "mp med us", "mp p99 us", "med x");
    print_row("dict set+get", &f->dict, p ? &p->dict : NULL);
    print_row("lock acquire+rel", &f->lock, p ? &p->lock : NULL);
    printf("(x = mp / fiber: how many times faster fiber is; mp = Python "
           "multiprocessing.Manager)\n\n");
}

static void print_json(const struct figures *f, const struct figures *p,
                       long calls)
{
    printf("{\"dict_set_get_median_us\":%.2f,\"dict_set_get_p99_us\":%.2f,"
           "\"lock_pair_median_us\":%.2f,\"lock_pair_p99_us\":%.2f,"
           "\"calls\":%ld,", f->dict.median_us, f->dict.p99_us,
           f->lock.median_us, f->lock.p99_us, calls);
    if (p)
        printf("\"peer\":{\"dict_set_get_median_us\":%.2f,"
               "\"dict_set_get_p99_us\":%.2f,\"lock_pair_median_us\":%.2f,"
               "\"lock_pair_p99_us\":%.2f}}\n", p->dict.median_us,
               p->dict.p99_us, p->lock.median_us, p->lock.p99_us);
    else
        printf("\"peer\":null}\n");
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--calls N] [--warmup N] [--no-peer] [--help]\n"
            "Round trips to a manager's objects from the master: a dict "
            "set+get pair and a\nlock acquire+release pair, median and 99th "
            "percentile in us.\n"
            "  --calls N   timed pairs of each kind (default %d)\n"
            "  --warmup N  untimed pairs first (default %d)\n"
            "  --no-peer   skip Python multiprocessing.Manager "
            "(peer/manager_peer.py)\n"
            "The last line of output is one JSON object.\n",
            DEFAULT_CALLS, DEFAULT_WARMUP);
}

/* Returns 0, 1 for --help, or -1 for a bad command line. */
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
            if (bench_parse_long(PROG, "--warmup", argv[++i], 0, 10000000,
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
    printf(PROG ": fiber %s, local backend, calls from the master, %ld "
           "pairs after %ld warm-up\n", fiber_version(), o.calls, o.warmup);
    fflush(stdout);
    struct figures f, p, *pp = NULL;
    if (run_fiber(&o, &f) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    if (!o.no_peer && run_peer(&o, &p) == 0)
        pp = &p;
    else if (!o.no_peer)
        fprintf(stderr, PROG ": no peer figures; reporting \"peer\": null\n");
    print_table(&f, pp);
    print_json(&f, pp, o.calls);
    return 0;
}
