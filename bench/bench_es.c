/*
 * bench_es.c -- the evolution-strategies workload of examples/es on a
 * fiber pool: how much of the machine it uses, and what the master costs.
 *
 * (a) Parallel efficiency at one worker per core.  A cart-pole policy is
 *     trained until it balances (so episodes run their full 500 steps),
 *     then the same records -- mirrored perturbations of it -- are
 *     evaluated by calling the evaluation code directly in this process
 *     and by fiber_pool_map on W workers, in alternating rounds:
 *         efficiency = evals/s(pool) / (W * evals/s(one process)),
 *     from the fastest round of each kind (medians reported too).
 * (b) Master overhead per iteration for a population of 2,048 pairs at
 *     1, 2, 4, ... workers: the example's own training loop (packing
 *     records, one map, ranks, gradient, Adam), with a task that parses
 *     the record and returns a result without running an environment.
 *     The workers' environment time is then zero, so the whole iteration
 *     is overhead (the figure printed is iteration time minus the
 *     workers' reported environment time divided by W, which equals it).
 *     The peer (peer/es_peer.py) runs the same loop on Python's
 *     multiprocessing.Pool with a trivial function, in the same run.
 *
 * (c) The Fiber paper's scale (bench_es_paper.c): 2,048 evaluations of a
 *     100,000-parameter policy per iteration at 1 .. 512 workers, the
 *     policy in every record against put once as the map's shared
 *     argument: master ms, CPU seconds and bytes sent per iteration; the
 *     peer (peer/es_paper_peer.py) pickles the policy into every task.
 *
 * Output: progress and tables on stdout, then as the LAST line one JSON
 * object; diagnostics go to stderr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "bench_common.h"
#include "bench_es_paper.h"
#include "env.h"
#include "noise.h"
#include "rollout.h"
#include "train.h"

#define PROG "bench-es"

#define MAX_COUNTS 16     /* worker counts 1 .. 2^15 */
#define POP_B 2048        /* pairs per iteration in (b) */
#define HIDDEN 16         /* the cart-pole policy of the example */
#define EFF_SIGMA 0.02f   /* small: perturbed policies keep balancing */

struct options {
    long max_workers; /* (b) goes 1, 2, 4, ... up to this */
    int quick;
    int no_peer;
    long rounds;      /* (a) rounds; (b) measured iterations per count */
    long pairs;       /* (a) pairs per round */
    long paper_max_workers, paper_iters; /* (c) */
    int no_paper;
};

struct results {
    int eff_workers;
    double evals_serial, evals_pool, efficiency, efficiency_median;
    double efficiency_fork; /* the same work on bare fork()ed processes */
    double vs_fork;         /* pool throughput / bare processes' */
    int ncounts;
    struct paper_row paper[PAPER_MAX_ROWS];
    int npaper, have_paper_peer;
    int counts[MAX_COUNTS];
    double overhead_ms[MAX_COUNTS], map_ms[MAX_COUNTS], master_ms[MAX_COUNTS];
    double overhead_min_ms[MAX_COUNTS];
    int have_peer;
    double peer_ms[MAX_COUNTS], peer_min_ms[MAX_COUNTS];
};

static int cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The environment-free stand-in for es_eval: it checks the record as
 * es_eval does and answers with returns drawn from the record's seed, so
 * the master's ranking sees distinct values. */
FIBER_TASK(bench_es_trivial)
{
    struct es_task t;
    if (len < sizeof t)
        return fiber_task_fail("record too short");
    memcpy(&t, arg, sizeof t);
    if (t.magic != ES_TASK_MAGIC ||
        len != es_task_size(t.nparams, (int)t.obs_dim))
        return fiber_task_fail("not an es record");
    size_t n = es_result_size((int)t.obs_dim);
    int rc = fiber_buf_reserve(out, n);
    if (rc)
        return rc;
    struct es_result r = {{(double)(t.seed & 0xffff),
                           (double)((t.seed >> 16) & 0xffff)}, {0, 0}, 0, 0};
    memset(out->data + out->len, 0, n);
    memcpy(out->data + out->len, &r, sizeof r);
    out->len += n;
    return 0;
}

/* ---- (a) parallel efficiency ------------------------------------------- */

/* Trains the example's cart-pole policy until it balances. */
static int trained_policy(struct es_state *st, int workers)
{
    if (es_state_init(st, &es_env_cartpole, HIDDEN, 1, 20) != 0)
        return -1;
    struct es_opts o = {.workers = workers, .pop = 32, .episodes = 1,
                        .eval_episodes = 5, .iters = 200, .sigma = 0.1,
                        .lr = 0.05, .l2 = 0.005, .target = 500, .quiet = 1};
    struct es_outcome out;
    if (es_train(&o, st, &out) != 0 || !out.solved) {
        fprintf(stderr, PROG ": could not train the cart-pole policy\n");
        return -1;
    }
    return 0;
}

static void pack_pairs(const struct es_state *st, unsigned char *recs,
                       size_t rs, int pairs)
{
    float mean[ES_MAX_OBS], sd[ES_MAX_OBS];
    obstat_get(&st->obs, mean, sd);
    size_t nn;
    es_noise_table(&nn);
    uint64_t rng = 99;
    for (int i = 0; i < pairs; i++) {
        struct es_task t = {ES_TASK_MAGIC, 0, ES_KIND_PAIR,
                            (uint32_t)st->nparams, 4, HIDDEN,
                            (uint32_t)(es_rand64(&rng) %
                                       (nn - st->nparams + 1)),
                            EFF_SIGMA, 1, es_rand64(&rng)};
        es_task_pack(recs + (size_t)i * rs, &t, st->theta, mean, sd);
    }
}

/* One pass of the evaluation code over every record, in this process. */
static int serial_pass(const unsigned char *recs, size_t rs,
                       unsigned char *res, size_t os, int n, double *sec)
{
    char err[256];
    double t0 = bench_now_s();
    for (int i = 0; i < n; i++) {
        if (es_evaluate(recs + (size_t)i * rs, rs, res + (size_t)i * os, os,
                        err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s\n", err);
            return -1;
        }
    }
    *sec = bench_now_s() - t0;
    return 0;
}

/* The machine's own limit: W fork()ed children (no fiber involved) each
 * evaluate every W-th record.  A 2-vCPU virtual machine whose vCPUs share
 * a physical core scales below 2x whatever the library does. */
static int fork_pass(const unsigned char *recs, size_t rs, unsigned char *res,
                     size_t os, int n, int w, double *sec)
{
    double t0 = bench_now_s();
    for (int c = 0; c < w; c++) {
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            char err[256];
            for (int i = c; i < n; i += w)
                if (es_evaluate(recs + (size_t)i * rs, rs,
                                res + (size_t)i * os, os, err, sizeof err))
                    _exit(1);
            _exit(0);
        }
    }
    int bad = 0, status;
    for (int c = 0; c < w; c++)
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
            bad = 1;
    *sec = bench_now_s() - t0;
    return bad ? -1 : 0;
}

static int pool_pass(fiber_pool *p, const unsigned char *recs, size_t rs,
                     unsigned char *res, size_t os, int n, double *sec)
{
    double t0 = bench_now_s();
    if (fiber_pool_map(p, "es_eval", recs, rs, (size_t)n, res, os, 0) != 0) {
        fprintf(stderr, PROG ": map: %s\n", fiber_last_error());
        return -1;
    }
    *sec = bench_now_s() - t0;
    return 0;
}

static int steps_of(const unsigned char *res, size_t os, int n, double *steps)
{
    *steps = 0;
    for (int i = 0; i < n; i++) {
        struct es_result r;
        es_result_unpack(res + (size_t)i * os, 4, &r, NULL, NULL);
        *steps += r.steps[0] + r.steps[1];
    }
    return 0;
}

/* Alternates serial and pool rounds so that both see the same load. */
static int eff_rounds(fiber_pool *p, const unsigned char *recs, size_t rs,
                      unsigned char *res, size_t os, const struct options *o,
                      struct results *R)
{
    double ts[64], tp[64], tf[64], steps;
    int n = (int)o->pairs, rounds = o->rounds > 64 ? 64 : (int)o->rounds;
    if (pool_pass(p, recs, rs, res, os, n, &tp[0]) != 0) /* warm-up */
        return -1;
    for (int r = 0; r < rounds; r++) {
        if (serial_pass(recs, rs, res, os, n, &ts[r]) != 0 ||
            pool_pass(p, recs, rs, res, os, n, &tp[r]) != 0 ||
            fork_pass(recs, rs, res, os, n, R->eff_workers, &tf[r]) != 0)
            return -1;
        printf("  round %d: one process %.1f ms, pool %.1f ms, %d forked "
               "processes %.1f ms\n", r + 1, ts[r] * 1e3, tp[r] * 1e3,
               R->eff_workers, tf[r] * 1e3);
    }
    steps_of(res, os, n, &steps);
    /* The fastest round of each kind: on a shared machine other work only
     * ever adds time, so the minimum is the least disturbed measurement.
     * The medians are reported beside it. */
    struct bench_stats one = bench_summarize(ts, (size_t)rounds),
                       pool = bench_summarize(tp, (size_t)rounds),
                       forked = bench_summarize(tf, (size_t)rounds);
    R->efficiency_fork = one.min / (R->eff_workers * forked.min);
    R->vs_fork = forked.min / pool.min;
    R->evals_serial = 2.0 * n / one.min;
    R->evals_pool = 2.0 * n / pool.min;
    R->efficiency = R->evals_pool / (R->eff_workers * R->evals_serial);
    R->efficiency_median = one.median / (R->eff_workers * pool.median);
    printf("%d pairs (%d episodes, %.0f steps, %.0f per episode); "
           "efficiency %.3f from the fastest rounds, %.3f from the "
           "medians; bare fork()ed processes reach %.3f\n", n, 2 * n,
           steps, steps / (2 * n), R->efficiency, R->efficiency_median,
           R->efficiency_fork);
    return 0;
}

static int run_efficiency(const struct options *o, struct results *R)
{
    struct es_state st;
    R->eff_workers = cpus();
    printf("(a) parallel efficiency, cart-pole, %d workers (one per CPU)\n",
           R->eff_workers);
    fflush(stdout);
    if (trained_policy(&st, R->eff_workers) != 0)
        return -1;
    size_t rs = es_task_size(st.nparams, 4), os = es_result_size(4);
    unsigned char *recs = calloc((size_t)o->pairs, rs);
    unsigned char *res = calloc((size_t)o->pairs, os);
    struct es_init_arg ia = {st.noise_seed, st.noise_log2, 0,
                             es_noise_table_hash()};
    fiber_pool_opts po = {.workers = R->eff_workers, .initializer = "es_init",
                          .initarg = &ia, .initarg_len = sizeof ia};
    fiber_pool *p = NULL;
    int rc = recs && res ? 0 : -1;
    if (rc == 0 && fiber_pool_create(&p, &po) != 0) {
        fprintf(stderr, PROG ": pool: %s\n", fiber_last_error());
        rc = -1;
    }
    if (rc == 0) {
        pack_pairs(&st, recs, rs, (int)o->pairs);
        rc = eff_rounds(p, recs, rs, res, os, o, R);
    }
    fiber_pool_free(p);
    free(recs);
    free(res);
    es_state_free(&st);
    return rc;
}

/* ---- (b) master overhead ------------------------------------------------- */

struct iter_log {
    int warmup, n;
    double over[256], map[256], master[256];
    int workers;
};

static void on_iter(void *ud, const struct es_iter_info *info)
{
    struct iter_log *l = ud;
    if ((int)info->iteration <= l->warmup || l->n >= 256)
        return;
    /* Time not spent in environments: the workers report theirs (zero
     * for the trivial task), spread over the W workers that ran it. */
    l->over[l->n] = info->seconds - info->env_seconds / l->workers;
    l->map[l->n] = info->map_seconds;
    l->master[l->n] = info->master_seconds;
    l->n++;
}

static int overhead_at(int workers, int iters, int warmup, struct results *R,
                       int k)
{
    struct es_state st;
    struct iter_log log = {.warmup = warmup, .workers = workers};
    if (es_state_init(&st, &es_env_cartpole, HIDDEN, 2, 18) != 0)
        return -1;
    struct es_opts o = {.workers = workers, .pop = POP_B, .episodes = 1,
                        .eval_episodes = 0, .iters = warmup + iters,
                        .sigma = 0.1, .lr = 0.01, .l2 = 0.005,
                        .target = HUGE_VAL, .quiet = 1,
                        .task = "bench_es_trivial", .on_iter = on_iter,
                        .on_iter_ud = &log};
    struct es_outcome out;
    double t0 = bench_now_s();
    int rc = es_train(&o, &st, &out);
    es_state_free(&st);
    if (rc != 0 || log.n == 0)
        return -1;
    size_t n = (size_t)log.n;
    struct bench_stats over = bench_summarize(log.over, n);
    R->counts[k] = workers;
    R->overhead_min_ms[k] = over.min * 1e3;
    R->overhead_ms[k] = over.median * 1e3;
    R->map_ms[k] = bench_median(log.map, n) * 1e3;
    R->master_ms[k] = bench_median(log.master, n) * 1e3;
    printf("  %4d workers: %8.2f ms/iteration, fastest %.2f (map %.2f, rest "
           "%.2f; %d iterations, run %.1f s with start-up)\n", workers,
           R->overhead_ms[k], R->overhead_min_ms[k], R->map_ms[k],
           R->master_ms[k], log.n, bench_now_s() - t0);
    fflush(stdout);
    return 0;
}

static int run_overhead(const struct options *o, struct results *R)
{
    int iters = o->quick ? 5 : 20, warmup = 3;
    printf("\n(b) master overhead, %d pairs per iteration, environment-free "
           "task\n", POP_B);
    for (int w = 1, k = 0; w <= o->max_workers && k < MAX_COUNTS;
         w *= 2, k++) {
        if (overhead_at(w, iters, warmup, R, k) != 0) {
            fprintf(stderr, PROG ": the run with %d workers failed\n", w);
            return -1;
        }
        R->ncounts = k + 1;
    }
    return 0;
}

/* ---- the peer ---------------------------------------------------------- */

static int run_peer(const struct options *o, struct results *R)
{
    char args[128], last[8192];
    snprintf(args, sizeof args, "--max-workers %d --pop %d --iters %d",
             R->counts[R->ncounts - 1], POP_B, o->quick ? 5 : 20);
    printf("\npeer: Python multiprocessing.Pool, the same loop\n");
    if (bench_run_peer(PROG, "es_peer.py", args, last, sizeof last) != 0)
        return -1;
    for (int i = 0; i < R->ncounts; i++) {
        const char *key =
            bench_key("overhead_ms_per_iter_w%d", R->counts[i]);
        if (bench_json_number(last, key, &R->peer_ms[i]) != 0 ||
            R->peer_ms[i] <= 0) {
            fprintf(stderr, PROG ": peer: no %s in: %s", key, last);
            return -1;
        }
        if (bench_json_number(last,
                              bench_key("overhead_min_ms_per_iter_w%d",
                                        R->counts[i]),
                              &R->peer_min_ms[i]) != 0 ||
            R->peer_min_ms[i] <= 0)
            R->peer_min_ms[i] = NAN;
    }
    return 0;
}

static int run_paper_peer(const struct options *o, struct results *R)
{
    char args[160] = "--workers ", last[8192];
    for (int i = 0; i < R->npaper; i++)
        snprintf(args + strlen(args), sizeof args - strlen(args), "%s%d",
                 i ? "," : "", R->paper[i].workers);
    snprintf(args + strlen(args), sizeof args - strlen(args), " --iters %ld",
             o->paper_iters);
    printf("\npeer (c): Python multiprocessing.Pool, the policy pickled into "
           "every task\n");
    if (bench_run_peer(PROG, "es_paper_peer.py", args, last, sizeof last))
        return -1;
    for (int i = 0; i < R->npaper; i++) {
        struct paper_row *p = &R->paper[i];
        if (bench_json_number(last, bench_key("paper_ms_per_iter_w%d",
                                              p->workers), &p->peer_ms) ||
            bench_json_number(last,
                              bench_key("paper_master_bytes_per_iter_w%d",
                                        p->workers), &p->peer_bytes))
            return -1;
    }
    return 0;
}

static void paper_json(const struct results *R)
{
    static const char *const form[2] = {"", "shared_"};
    for (int i = 0; i < R->npaper; i++) {
        const struct paper_row *p = &R->paper[i];
        for (int k = 0; k < 2; k++) {
            bench_json_num(bench_key("paper_%sms_per_iter_w%d", form[k],
                                     p->workers), 2, p->ms[k]);
            bench_json_num(bench_key("paper_%smaster_cpu_s_per_iter_w%d",
                                     form[k], p->workers), 4, p->cpu_s[k]);
            bench_json_num(bench_key("paper_%smaster_bytes_per_iter_w%d",
                                     form[k], p->workers), 0, p->bytes[k]);
        }
    }
}

/* ---- output ------------------------------------------------------------ */

static void print_table(const struct results *R)
{
    printf("\nparallel efficiency: %.3f  (pool %.0f evals/s on %d workers; "
           "one process %.0f evals/s)\n", R->efficiency, R->evals_pool,
           R->eff_workers, R->evals_serial);
    printf("the machine's own limit (bare fork()ed processes): %.3f; the "
           "pool reaches %.3f of their throughput\n", R->efficiency_fork,
           R->vs_fork);
    printf("\n%8s %10s %9s %8s %8s %10s %9s %9s\n", "workers", "fiber ms",
           "fastest", "map", "rest", "mp.Pool ms", "fastest", "mp/fiber");
    for (int i = 0; i < R->ncounts; i++) {
        printf("%8d %10.2f %9.2f %8.2f %8.2f", R->counts[i], R->overhead_ms[i],
               R->overhead_min_ms[i], R->map_ms[i], R->master_ms[i]);
        if (R->have_peer)
            printf(" %10.2f %9.2f %8.1fx\n", R->peer_ms[i], R->peer_min_ms[i],
                   R->peer_ms[i] / R->overhead_ms[i]);
        else
            printf(" %10s %9s %9s\n", "-", "-", "-");
    }
    printf("(ms per iteration of %d pairs: median and fastest; map and rest "
           "(packing records,\nranks, gradient, Adam) are medians; mp/fiber "
           "compares the medians)\n\n", POP_B);
}

static void print_json(const struct results *R)
{
    bench_json_open(NULL);
    bench_json_num("parallel_efficiency", 4, R->efficiency);
    bench_json_num("parallel_efficiency_median", 4, R->efficiency_median);
    bench_json_num("parallel_efficiency_fork_baseline", 4,
                   R->efficiency_fork);
    bench_json_num("pool_vs_fork_baseline", 4, R->vs_fork);
    bench_json_long("efficiency_workers", R->eff_workers);
    bench_json_num("evals_per_s_pool", 1, R->evals_pool);
    bench_json_num("evals_per_s_one_process", 1, R->evals_serial);
    for (int i = 0; i < R->ncounts; i++)
        bench_json_num(bench_key("overhead_ms_per_iter_w%d", R->counts[i]),
                       4, R->overhead_ms[i]);
    for (int i = 0; i < R->ncounts; i++)
        bench_json_num(bench_key("overhead_min_ms_per_iter_w%d",
                                 R->counts[i]),
                       4, R->overhead_min_ms[i]);
    paper_json(R);
    if (bench_json_open_peer(R->have_peer || R->have_paper_peer ? R : NULL)) {
        for (int i = 0; R->have_paper_peer && i < R->npaper; i++) {
            bench_json_num(bench_key("paper_ms_per_iter_w%d",
                                     R->paper[i].workers),
                           2, R->paper[i].peer_ms);
            bench_json_num(bench_key("paper_master_bytes_per_iter_w%d",
                                     R->paper[i].workers),
                           0, R->paper[i].peer_bytes);
        }
        for (int i = 0; R->have_peer && i < R->ncounts; i++)
            bench_json_num(bench_key("overhead_ms_per_iter_w%d",
                                     R->counts[i]),
                           4, R->peer_ms[i]);
        for (int i = 0; R->have_peer && i < R->ncounts; i++)
            if (!isnan(R->peer_min_ms[i]))
                bench_json_num(bench_key("overhead_min_ms_per_iter_w%d",
                                         R->counts[i]),
                               4, R->peer_min_ms[i]);
        bench_json_close();
    }
    bench_json_close();
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--max-workers N] [--quick] [--rounds R] "
            "[--pairs P] [--no-peer] [--help]\n"
            "(a) ES parallel efficiency on cart-pole at one worker per "
            "CPU;\n(b) master overhead per iteration of 2048 pairs at 1, 2, "
            "4, ... workers,\n    next to Python multiprocessing.Pool "
            "(peer/es_peer.py).\n"
            "  --max-workers N  largest worker count in (b) (default 512)\n"
            "  --quick          (b) up to 64 workers, fewer iterations\n"
            "  --rounds R       rounds of (a) (default 11)\n"
            "  --pairs P        pairs per round of (a) (default 512)\n"
            "  --no-peer        skip the Python peers\n"
            "(c) the paper's scale: 2048 evaluations of a 100,000-parameter "
            "policy, per record\n    against shared, at 1 .. 512 workers "
            "(peer/es_paper_peer.py).\n"
            "  --paper-max-workers N  largest worker count in (c) (default "
            "512)\n"
            "  --paper-iters N  measured iterations per count in (c) "
            "(default 3)\n"
            "  --no-paper       skip (c)\n"
            "The last line of output is one JSON object.\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0) /* children never return */
        return 1;
    /* Many short rounds rather than a few long ones: on a shared machine
     * the fastest of many is more likely to be undisturbed. */
    struct options o = {.max_workers = 512, .rounds = 11, .pairs = 512,
                        .paper_max_workers = 512, .paper_iters = 3};
    const struct bench_flag flags[] = {
        {"--no-peer", .on = &o.no_peer},
        {"--quick", .on = &o.quick},
        {"--max-workers", .value = &o.max_workers, .lo = 1, .hi = 1 << 15},
        {"--rounds", .value = &o.rounds, .lo = 1, .hi = 64},
        {"--pairs", .value = &o.pairs, .lo = 1, .hi = 1 << 20},
        {"--paper-max-workers", .value = &o.paper_max_workers, .lo = 1,
         .hi = 512},
        {"--paper-iters", .value = &o.paper_iters, .lo = 1, .hi = 60},
        {"--no-paper", .on = &o.no_paper},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    if (o.quick && o.max_workers > 64)
        o.max_workers = 64;
    static struct results R;
    printf(PROG ": fiber %s, %d CPUs\n", fiber_version(), cpus());
    if (run_efficiency(&o, &R) != 0 || run_overhead(&o, &R) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    if (!o.no_paper && bench_es_paper((int)o.paper_max_workers,
                                      (int)o.paper_iters, R.paper,
                                      &R.npaper) != 0) {
        fprintf(stderr, PROG ": (c) FAILED\n");
        return 1;
    }
    if (!o.no_peer)
        R.have_peer = bench_peer_done(PROG, run_peer(&o, &R));
    if (!o.no_peer && R.npaper)
        R.have_paper_peer =
            bench_peer_done(PROG, run_paper_peer(&o, &R));
    print_table(&R);
    print_json(&R);
    return 0;
}
