/*
 * bench_overhead.c -- the Fiber paper's framework-overhead test: how much
 * time a pool adds on top of the work it runs, fiber against Python's
 * multiprocessing.Pool.
 *
 * Five workers run tasks that sleep for a fixed duration D (1 s, 100 ms,
 * 10 ms, 1 ms by default), 5 / D of them, so that a perfect pool finishes
 * in 1.0 s.  Two ways of using the pool:
 *
 *   seq  rounds of 5 fiber_pool_apply_async calls, then wait for all 5,
 *        1 / D rounds: how a reinforcement-learning loop uses a pool (the
 *        master updates its model between rounds);
 *   map  one fiber_pool_map over all 5 / D tasks with chunksize 1.
 *
 * Each task measures its own sleep (clock_gettime around nanosleep) and
 * returns it, so that the floor -- the time the tasks themselves needed --
 * is measured rather than assumed: for seq, the sum over rounds of each
 * round's longest task; for map, the total measured sleep / 5.  The
 * framework overhead per round (seq) is (total - floor) / rounds.
 *
 * Each duration and mode is repeated (--repeat) and the MEDIAN reported:
 * this 2-core machine is shared, and single runs wander.
 *
 * The peer (peer/overhead_peer.py) does the same with multiprocessing.Pool(5):
 * apply_async rounds and pool.map(chunksize=1).  Output: progress and a
 * table on stdout, then as the LAST line one JSON object with the keys
 * seq_<D>ms_s, map_<D>ms_s, floor_<D>ms_s, overhead_us_per_round_<D>ms (and,
 * as extra information, map_floor_<D>ms_s), the peer's under "peer".
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-overhead"
#define WORKERS 5
#define MAX_DURATIONS 16
#define DEFAULT_REPEAT 5

struct options {
    long durations_ms[MAX_DURATIONS];
    int n_durations;
    long repeat;
    int quick;
    int no_peer;
};

/* Medians over the repetitions of one duration. */
struct result {
    double seq_s, seq_floor_s, overhead_us; /* seq: total, floor, per round */
    double map_s, map_floor_s;
};

/* The figures of one duration in the JSON line and the peer's, in this
 * order; each key is a format for the duration in ms. */
#define N_KEYS 5
static const struct bench_figure key_formats[N_KEYS] = {
    {"seq_%ldms_s", offsetof(struct result, seq_s), 6, 0},
    {"map_%ldms_s", offsetof(struct result, map_s), 6, 0},
    {"floor_%ldms_s", offsetof(struct result, seq_floor_s), 6, 0},
    {"map_floor_%ldms_s", offsetof(struct result, map_floor_s), 6, 0},
    {"overhead_us_per_round_%ldms", offsetof(struct result, overhead_us), 2,
     0},
};

/* key_formats with the duration ms filled in (the keys in names). */
static void keys_for(long ms, char names[N_KEYS][48],
                     struct bench_figure figs[N_KEYS])
{
    for (int i = 0; i < N_KEYS; i++) {
        figs[i] = key_formats[i];
        snprintf(names[i], sizeof names[i], key_formats[i].key, ms);
        figs[i].key = names[i];
    }
}

/* Sleeps for the nanoseconds in arg and returns how long it slept, as a
 * uint64_t of nanoseconds, measured around the sleep itself. */
FIBER_TASK(bench_sleep)
{
    uint64_t ns;
    if (len != sizeof ns)
        return fiber_task_fail("bench_sleep wants 8 bytes, got %zu", len);
    memcpy(&ns, arg, sizeof ns);
    struct timespec req = {(time_t)(ns / 1000000000u),
                           (long)(ns % 1000000000u)};
    uint64_t t0 = bench_now_ns();
    while (nanosleep(&req, &req) != 0 && errno == EINTR)
        continue;
    uint64_t slept = bench_now_ns() - t0;
    return fiber_buf_append(out, &slept, sizeof slept);
}

/* Sleeps 20 ms and returns the worker's pid: the warm-up's probe. */
FIBER_TASK(bench_pid_probe)
{
    struct timespec req = {0, 20 * 1000000L};
    nanosleep(&req, NULL);
    int64_t pid = getpid();
    return fiber_buf_append(out, &pid, sizeof pid);
}

/* ---- fiber side ---------------------------------------------------------- */

/* Waits until every worker has run a task (so that no measurement pays for
 * a worker still starting): rounds of 5 probes until 5 distinct pids have
 * answered.  Returns 0, or -1 after saying what failed. */
static int warm_up(fiber_pool *pool)
{
    int64_t seen[WORKERS];
    int n_seen = 0;
    double deadline = bench_now_s() + 60;
    while (n_seen < WORKERS && bench_now_s() < deadline) {
        fiber_future *f[WORKERS];
        for (int i = 0; i < WORKERS; i++) {
            if (fiber_pool_apply_async(pool, "bench_pid_probe", NULL, 0, NULL,
                                       NULL, &f[i]) != 0) {
                fprintf(stderr, PROG ": warm-up: %s\n", fiber_last_error());
                return -1;
            }
        }
        for (int i = 0; i < WORKERS; i++) {
            fiber_buf b = {0};
            int64_t pid;
            int rc = fiber_future_get(f[i], &b, -1);
            fiber_future_free(f[i]);
            if (rc != 0 || b.len != sizeof pid) {
                fprintf(stderr, PROG ": warm-up probe: %s\n",
                        rc ? fiber_last_error() : "wrong result size");
                fiber_buf_free(&b);
                return -1;
            }
            memcpy(&pid, b.data, sizeof pid);
            fiber_buf_free(&b);
            int known = 0;
            for (int k = 0; k < n_seen; k++)
                known |= seen[k] == pid;
            if (!known)
                seen[n_seen++] = pid;
        }
    }
    if (n_seen < WORKERS)
        fprintf(stderr, PROG ": warning: only %d of %d workers answered "
                "within 60 s of warm-up\n", n_seen, WORKERS);
    return 0;
}

static long rounds_for(long d_ms)
{
    long r = (1000 + d_ms / 2) / d_ms;
    return r < 1 ? 1 : r;
}

/* seq mode: rounds of 5 apply_async, waiting for all 5 each round.
 * Returns 0 with the wall time and the floor, or -1. */
static int run_seq(fiber_pool *pool, long d_ms, double *total_s,
                   double *floor_s)
{
    long rounds = rounds_for(d_ms);
    uint64_t ns = (uint64_t)d_ms * 1000000u, floor_ns = 0;
    double t0 = bench_now_s();
    for (long r = 0; r < rounds; r++) {
        fiber_future *f[WORKERS];
        for (int i = 0; i < WORKERS; i++) {
            if (fiber_pool_apply_async(pool, "bench_sleep", &ns, sizeof ns,
                                       NULL, NULL, &f[i]) != 0) {
                fprintf(stderr, PROG ": apply_async: %s\n",
                        fiber_last_error());
                for (int k = 0; k < i; k++)
                    fiber_future_free(f[k]);
                return -1;
            }
        }
        uint64_t longest = 0;
        int bad = 0;
        for (int i = 0; i < WORKERS; i++) {
            fiber_buf b = {0};
            uint64_t slept;
            int rc = fiber_future_get(f[i], &b, -1);
            if (rc != 0 || b.len != sizeof slept) {
                fprintf(stderr, PROG ": seq task: %s\n",
                        rc ? fiber_last_error() : "wrong result size");
                bad = 1;
            } else {
                memcpy(&slept, b.data, sizeof slept);
                if (slept > longest)
                    longest = slept;
            }
            fiber_buf_free(&b);
            fiber_future_free(f[i]);
        }
        if (bad)
            return -1;
        floor_ns += longest;
    }
    *total_s = bench_now_s() - t0;
    *floor_s = (double)floor_ns / 1e9;
    return 0;
}

/* map mode: one map of 5 * rounds tasks, chunksize 1. */
static int run_map(fiber_pool *pool, long d_ms, double *total_s,
                   double *floor_s)
{
    size_t n = (size_t)rounds_for(d_ms) * WORKERS;
    uint64_t *in = malloc(n * sizeof *in), *out = calloc(n, sizeof *out);
    if (!in || !out) {
        fprintf(stderr, PROG ": out of memory\n");
        free(in);
        free(out);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        in[i] = (uint64_t)d_ms * 1000000u;
    double t0 = bench_now_s();
    int rc = fiber_pool_map(pool, "bench_sleep", in, sizeof *in, n, out,
                            sizeof *out, 1);
    *total_s = bench_now_s() - t0;
    if (rc != 0)
        fprintf(stderr, PROG ": map: %s\n", fiber_last_error());
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += out[i];
    *floor_s = (double)sum / 1e9 / WORKERS;
    free(in);
    free(out);
    return rc ? -1 : 0;
}

static int run_fiber(const struct options *o, struct result *res)
{
    fiber_pool *pool;
    fiber_pool_opts po = {.workers = WORKERS};
    if (fiber_pool_create(&pool, &po) != 0) {
        fprintf(stderr, PROG ": fiber_pool_create: %s\n", fiber_last_error());
        return -1;
    }
    int rc = warm_up(pool);
    for (int d = 0; d < o->n_durations && rc == 0; d++) {
        long ms = o->durations_ms[d];
        double seq[64], fl[64], ovh[64], map[64], mfl[64];
        for (int r = 0; r < o->repeat && rc == 0; r++) {
            rc = run_seq(pool, ms, &seq[r], &fl[r]);
            if (rc == 0)
                rc = run_map(pool, ms, &map[r], &mfl[r]);
            if (rc == 0)
                ovh[r] = (seq[r] - fl[r]) / (double)rounds_for(ms) * 1e6;
        }
        if (rc)
            break;
        struct result *x = &res[d];
        size_t n = (size_t)o->repeat;
        struct bench_stats sq = bench_summarize(seq, n),
                           mp = bench_summarize(map, n);
        x->seq_s = sq.median;
        x->seq_floor_s = bench_median(fl, n);
        x->overhead_us = bench_median(ovh, n);
        x->map_s = mp.median;
        x->map_floor_s = bench_median(mfl, n);
        printf("fiber  %5ld ms x %-5ld  seq %.4f s (floor %.4f, %.1f us/round, "
               "%.4f..%.4f)  map %.4f s (floor %.4f, %.4f..%.4f)\n",
               ms, rounds_for(ms) * WORKERS, x->seq_s, x->seq_floor_s,
               x->overhead_us, sq.min, sq.max, x->map_s, x->map_floor_s,
               mp.min, mp.max);
        fflush(stdout);
    }
    fiber_pool_free(pool);
    return rc;
}

/* ---- the peer ------------------------------------------------------------ */

static int run_peer(const struct options *o, struct result *pr)
{
    char args[512], last[8192];
    int k = snprintf(args, sizeof args, "--repeat %ld --durations ",
                     o->repeat);
    for (int d = 0; d < o->n_durations; d++)
        k += snprintf(args + k, sizeof args - (size_t)k, "%s%ld", d ? "," : "",
                      o->durations_ms[d]);
    if (bench_run_peer(PROG, "overhead_peer.py", args, last, sizeof last))
        return -1;
    for (int d = 0; d < o->n_durations; d++) {
        char names[N_KEYS][48];
        struct bench_figure figs[N_KEYS];
        keys_for(o->durations_ms[d], names, figs);
        if (bench_json_read(PROG, last, figs, N_KEYS, &pr[d]) != 0)
            return -1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------ */

static void print_table(const struct options *o, const struct result *res,
                        const struct result *pr)
{
    printf("\n%7s %6s | %8s %8s %9s %8s %8s | %8s %9s %8s | %8s %8s\n",
           "task", "tasks", "seq s", "floor s", "us/round", "map s",
           "mfloor s", "mp seq s", "mp us/rnd", "mp map s", "seq x",
           "map x");
    for (int d = 0; d < o->n_durations; d++) {
        const struct result *x = &res[d];
        char task[16];
        snprintf(task, sizeof task, "%ld ms", o->durations_ms[d]);
        printf("%7s %6ld | %8.4f %8.4f %9.1f %8.4f %8.4f |", task,
               rounds_for(o->durations_ms[d]) * WORKERS, x->seq_s,
               x->seq_floor_s, x->overhead_us, x->map_s, x->map_floor_s);
        if (pr)
            printf(" %8.4f %9.1f %8.4f | %7.2fx %7.2fx\n", pr[d].seq_s,
                   pr[d].overhead_us, pr[d].map_s, pr[d].seq_s / x->seq_s,
                   pr[d].map_s / x->map_s);
        else
            printf(" %8s %9s %8s | %8s %8s\n", "-", "-", "-", "-", "-");
    }
    printf("(medians of %ld runs; ideal total 1.0 s; floor = measured sleep; "
           "us/round = (seq - floor) / rounds;\n x = mp / fiber, above 1: "
           "fiber faster; mp = Python multiprocessing.Pool(5))\n\n",
           o->repeat);
}

static void print_keys(const struct options *o, const struct result *res)
{
    for (int d = 0; d < o->n_durations; d++) {
        char names[N_KEYS][48];
        struct bench_figure figs[N_KEYS];
        keys_for(o->durations_ms[d], names, figs);
        bench_json_write(figs, N_KEYS, &res[d]);
    }
}

static void print_json(const struct options *o, const struct result *res,
                       const struct result *pr)
{
    bench_json_open(NULL);
    bench_json_long("workers", WORKERS);
    bench_json_long("repeat", o->repeat);
    print_keys(o, res);
    if (bench_json_open_peer(pr)) {
        print_keys(o, pr);
        bench_json_close();
    }
    bench_json_close();
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--quick] [--durations MS,MS,...] [--repeat R] "
            "[--no-peer] [--help]\n"
            "Framework overhead of a 5-worker pool: tasks that sleep D ms, "
            "5000/D of\nthem (ideal total 1.0 s), run as rounds of 5 "
            "apply_async (seq) and as one\nmap with chunksize 1 (map).  "
            "Reports medians over R runs.\n"
            "  --durations L  task durations in ms (default 1000,100,10,1)\n"
            "  --quick        skip the 1000 ms case\n"
            "  --repeat R     runs per duration and mode (default %d)\n"
            "  --no-peer      skip Python multiprocessing "
            "(peer/overhead_peer.py)\n"
            "The last line of output is one JSON object.\n",
            DEFAULT_REPEAT);
}

static int parse_durations(const char *prog, const char *text, void *ctx)
{
    struct options *o = ctx;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    o->n_durations = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (o->n_durations == MAX_DURATIONS ||
            bench_parse_long(prog, "--durations (ms)", tok, 1, 10000, &v))
            return -1;
        o->durations_ms[o->n_durations++] = v;
    }
    return o->n_durations > 0 ? 0 : -1;
}

/* Returns 0, 1 for --help, or -1 for a bad command line. */
static int parse_args(int argc, char **argv, struct options *o)
{
    static const long defaults[] = {1000, 100, 10, 1};
    for (int i = 0; i < 4; i++)
        o->durations_ms[i] = defaults[i];
    o->n_durations = 4;
    o->repeat = DEFAULT_REPEAT;
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o->no_peer},
        {"--quick", .on = &o->quick},
        {"--durations", .parse = parse_durations, .ctx = o},
        {"--repeat", .value = &o->repeat, .lo = 1, .hi = 64},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return rc;
    if (o->quick) {
        int k = 0;
        for (int i = 0; i < o->n_durations; i++)
            if (o->durations_ms[i] < 1000)
                o->durations_ms[k++] = o->durations_ms[i];
        o->n_durations = k;
        if (k == 0) {
            fprintf(stderr, PROG ": --quick leaves no duration below "
                    "1000 ms\n");
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, %d workers, %ld runs each\n",
           fiber_version(), WORKERS, o.repeat);
    struct result res[MAX_DURATIONS], peer[MAX_DURATIONS], *pr = NULL;
    if (run_fiber(&o, res) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    if (!o.no_peer && bench_peer_done(PROG, run_peer(&o, peer)))
        pr = peer;
    print_table(&o, res, pr);
    print_json(&o, res, pr);
    return 0;
}
