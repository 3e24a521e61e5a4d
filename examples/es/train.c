/*
 * train.c -- the ES loop on a fiber pool (see train.h).
 *
 * One iteration is one fiber_pool_map over `pop` pair records (each runs
 * theta + sigma*eps and theta - sigma*eps on the same start state) and
 * `eval_episodes` records that run theta itself.  The policy and the
 * observation statistics are put once per iteration as the map's shared
 * argument (fiber_pool_shared): each record is only its 40-byte header,
 * and each worker fetches the arrays once per iteration, not once per
 * record.  (With es_opts.task, a benchmark's own task, records carry the
 * arrays as before.)  The master then ranks
 * the 2*pop returns, estimates the gradient from the noise offsets, takes
 * an Adam step and merges the workers' observation sums.  A run is
 * deterministic for a seed whatever the number of workers: every record
 * carries its own seeds and results are combined in record order.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fiber/fiber.h>

#include "noise.h"
#include "rollout.h"
#include "train.h"

struct run {
    const struct es_opts *o;
    struct es_state *st;
    fiber_pool *pool;
    int env_id;
    size_t ntasks, rec_size, res_size;
    size_t full_size;          /* a record with its arrays (final_test) */
    int shared;                /* records are headers; arrays are shared */
    unsigned char *blob;       /* the iteration's shared arrays */
    size_t blob_size;
    unsigned char *recs, *res;
    uint32_t *offsets;         /* pop noise offsets */
    double *returns, *ranks;   /* 2*pop: [2i] is +eps, [2i+1] is -eps */
    uint64_t rng_next;         /* the generator after build_tasks */
    size_t *idx;               /* 2*pop, ranking scratch */
    double *weights, *grad;    /* pop, nparams */
    float *mean, *std;         /* obs_dim: what this iteration sends */
    double *sum, *sumsq, count; /* obs_dim: this iteration's observations */
    const float *noise;
    size_t noise_n;
    FILE *log;
    double t0;
};


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- state ----------------------------------------------------------- */

int es_state_alloc(struct es_state *st, const struct env_def *env, int hidden)
{
    memset(st, 0, sizeof *st);
    st->env = env;
    st->shape = (struct policy_shape){env->obs_dim, hidden, env->act_dim};
    st->nparams = policy_nparams(&st->shape);
    st->theta = calloc(st->nparams, sizeof *st->theta);
    if (!st->theta || adam_init(&st->adam, st->nparams) != 0 ||
        obstat_init(&st->obs, env->obs_dim) != 0) {
        es_state_free(st);
        return -1;
    }
    return 0;
}

int es_state_init(struct es_state *st, const struct env_def *env, int hidden,
                  uint64_t seed, unsigned noise_log2)
{
    if (es_state_alloc(st, env, hidden) != 0)
        return -1;
    /* Independent streams for the policy's initial weights, the run's
     * offsets and seeds, and the noise table, all from the one seed. */
    uint64_t s = seed;
    uint64_t init_rng = es_rand64(&s);
    st->rng = es_rand64(&s);
    st->noise_seed = es_rand64(&s);
    st->noise_log2 = noise_log2;
    policy_init(st->theta, &st->shape, &init_rng);
    return 0;
}

void es_state_free(struct es_state *st)
{
    free(st->theta);
    st->theta = NULL;
    adam_free(&st->adam);
    obstat_free(&st->obs);
}

/* ---- setup ------------------------------------------------------------ */

static int alloc_run(struct run *r)
{
    size_t pop = (size_t)r->o->pop, d = (size_t)r->st->shape.obs_dim;
    r->ntasks = pop + (size_t)r->o->eval_episodes;
    r->full_size = es_task_size(r->st->nparams, (int)d);
    r->shared = r->o->task == NULL;
    r->rec_size = r->shared ? es_task_head_size() : r->full_size;
    r->blob_size = es_shared_size(r->st->nparams, (int)d);
    r->blob = calloc(1, r->blob_size);
    r->res_size = es_result_size((int)d);
    r->recs = calloc(r->ntasks, r->rec_size);
    r->res = calloc(r->ntasks, r->res_size);
    r->offsets = calloc(pop, sizeof *r->offsets);
    r->returns = calloc(2 * pop, sizeof *r->returns);
    r->ranks = calloc(2 * pop, sizeof *r->ranks);
    r->idx = calloc(2 * pop, sizeof *r->idx);
    r->weights = calloc(pop, sizeof *r->weights);
    r->grad = calloc(r->st->nparams, sizeof *r->grad);
    r->mean = calloc(d, sizeof *r->mean);
    r->std = calloc(d, sizeof *r->std);
    r->sum = calloc(d, sizeof *r->sum);
    r->sumsq = calloc(d, sizeof *r->sumsq);
    return r->blob && r->recs && r->res && r->offsets && r->returns && r->ranks &&
                   r->idx && r->weights && r->grad && r->mean && r->std &&
                   r->sum && r->sumsq
               ? 0
               : -1;
}

static void free_run(struct run *r)
{
    fiber_pool_free(r->pool);
    if (r->log)
        fclose(r->log);
    void *bufs[] = {r->recs,    r->res,     r->offsets, r->returns,
                    r->ranks,   r->idx,     r->weights, r->grad,
                    r->mean,    r->std,     r->sum,     r->sumsq,
                    r->blob};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* The master builds the same table as the workers: it needs the noise to
 * turn offsets back into a gradient. */
static int build_noise(struct run *r)
{
    double t0 = now_s();
    if (es_noise_init(r->st->noise_seed, r->st->noise_log2) != 0) {
        fprintf(stderr, "es: cannot build a noise table of 2^%u floats\n",
                r->st->noise_log2);
        return -1;
    }
    r->noise = es_noise_table(&r->noise_n);
    if (r->noise_n < r->st->nparams + 1) {
        fprintf(stderr, "es: the noise table (%zu floats) is smaller than "
                "the policy (%zu parameters)\n", r->noise_n, r->st->nparams);
        return -1;
    }
    if (!r->o->quiet)
        printf("noise table: 2^%u floats (%zu MiB), built in %.0f ms; "
               "every worker builds the same one\n", r->st->noise_log2,
               r->noise_n * sizeof(float) >> 20, (now_s() - t0) * 1e3);
    return 0;
}

static int start_pool(struct run *r)
{
    struct es_init_arg ia = {r->st->noise_seed, r->st->noise_log2, 0,
                             es_noise_table_hash()};
    fiber_pool_opts po = {0};
    po.workers = r->o->workers;
    po.initializer = "es_init";
    po.initarg = &ia;
    po.initarg_len = sizeof ia;
    if (fiber_pool_create(&r->pool, &po) != 0) {
        fprintf(stderr, "es: cannot start the pool: %s\n", fiber_last_error());
        return -1;
    }
    return 0;
}

static int open_log(struct run *r)
{
    if (!r->o->log)
        return 0;
    r->log = fopen(r->o->log, "w");
    if (!r->log) {
        perror(r->o->log);
        return -1;
    }
    fprintf(r->log, "# iteration mean best center elapsed\n");
    return 0;
}

/* ---- one iteration ------------------------------------------------------ */

static void build_tasks(struct run *r)
{
    struct es_state *st = r->st;
    obstat_get(&st->obs, r->mean, r->std);
    struct es_task t = {ES_TASK_MAGIC, (uint16_t)r->env_id, ES_KIND_PAIR,
                        (uint32_t)st->nparams, (uint32_t)st->shape.obs_dim,
                        (uint32_t)st->shape.hidden, 0, (float)r->o->sigma,
                        (uint32_t)r->o->episodes, 0};
    uint64_t span = r->noise_n - st->nparams + 1;
    /* The generator advances in a copy, committed with the update, so
     * that the state a stop callback saves mid-iteration is the last
     * completed iteration's, whole. */
    uint64_t rng = st->rng;
    for (size_t i = 0; i < r->ntasks; i++) {
        if (i == (size_t)r->o->pop) {
            t.kind = ES_KIND_EVAL;
            t.sigma = 0;
            t.episodes = 1; /* each evaluation record is one episode */
            t.noise_offset = 0;
        }
        if (t.kind == ES_KIND_PAIR)
            t.noise_offset = r->offsets[i] = (uint32_t)(es_rand64(&rng) %
                                                        span);
        t.seed = es_rand64(&rng);
        if (r->shared)
            memcpy(r->recs + i * r->rec_size, &t, sizeof t);
        else
            es_task_pack(r->recs + i * r->rec_size, &t, st->theta, r->mean,
                         r->std);
    }
    if (r->shared)
        es_shared_pack(r->blob, st->nparams, st->shape.obs_dim, st->theta,
                       r->mean, r->std);
    r->rng_next = rng;
}

/* The iteration's map: with the arrays as the shared argument, put once
 * and released when the map is over. */
static int run_map(struct run *r)
{
    if (!r->shared)
        return fiber_pool_map(r->pool, r->o->task, r->recs, r->rec_size,
                              r->ntasks, r->res, r->res_size, 0);
    fiber_ref ref;
    int rc = fiber_object_put(r->blob, r->blob_size, &ref);
    if (rc)
        return rc;
    fiber_pool_shared(&ref);
    rc = fiber_pool_map(r->pool, "es_eval_shared", r->recs, r->rec_size,
                        r->ntasks, r->res, r->res_size, 0);
    fiber_pool_shared(NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fiber_last_error());
    fiber_object_release(&ref);
    if (rc)
        fprintf(stderr, "es: %s\n", msg);
    return rc;
}

/* Reads the results in record order (so sums do not depend on which
 * worker finished first) into r and s. */
static void collect(struct run *r, struct es_iter_info *s)
{
    int d = r->st->shape.obs_dim;
    double sum[ES_MAX_OBS], sumsq[ES_MAX_OBS], total = 0, center = 0;
    memset(r->sum, 0, (size_t)d * sizeof *r->sum);
    memset(r->sumsq, 0, (size_t)d * sizeof *r->sumsq);
    r->count = 0;
    uint64_t env_ns = 0;
    s->best = -HUGE_VAL;
    s->steps = 0;
    for (size_t i = 0; i < r->ntasks; i++) {
        struct es_result res;
        es_result_unpack(r->res + i * r->res_size, d, &res, sum, sumsq);
        for (int k = 0; k < d; k++) {
            r->sum[k] += sum[k];
            r->sumsq[k] += sumsq[k];
        }
        r->count += res.obs_count;
        env_ns += res.env_ns;
        s->steps += res.steps[0] + res.steps[1];
        if (i >= (size_t)r->o->pop) {
            center += res.ret[0];
            continue;
        }
        r->returns[2 * i] = res.ret[0];
        r->returns[2 * i + 1] = res.ret[1];
        total += res.ret[0] + res.ret[1];
        s->best = fmax(s->best, fmax(res.ret[0], res.ret[1]));
    }
    s->mean = total / (2.0 * r->o->pop);
    s->center = r->o->eval_episodes ? center / r->o->eval_episodes : NAN;
    s->episodes = 2 * (uint64_t)r->o->pop * (uint64_t)r->o->episodes +
                  (uint64_t)r->o->eval_episodes;
    s->env_seconds = (double)env_ns / 1e9;
}

static void update(struct run *r)
{
    struct es_state *st = r->st;
    size_t pop = (size_t)r->o->pop;
    es_centered_ranks(r->returns, 2 * pop, r->ranks, r->idx);
    for (size_t i = 0; i < pop; i++)
        r->weights[i] = r->ranks[2 * i] - r->ranks[2 * i + 1];
    es_gradient(r->weights, r->offsets, pop, r->noise, st->nparams, r->grad);
    es_descent_grad(r->grad, st->theta, st->nparams, r->o->l2);
    adam_step(&st->adam, st->theta, r->grad, r->o->lr);
    /* Only now: the statistics that evaluated this iteration's policies
     * stay those a solved policy is saved with. */
    obstat_add(&st->obs, r->sum, r->sumsq, r->count);
    st->iteration++;
}

static void report(struct run *r, uint64_t it, const struct es_iter_info *s)
{
    double elapsed = now_s() - r->t0;
    if (!r->o->quiet)
        printf("iter %5llu  mean %9.2f  best %9.2f  center %9.2f  "
               "evals/s %8.0f  elapsed %7.2f s\n", (unsigned long long)it,
               s->mean, s->best, s->center, (double)s->episodes / s->seconds,
               elapsed);
    fflush(stdout); /* live progress through a pipe or into a file */
    if (r->log) {
        fprintf(r->log, "%llu %.4f %.4f %.4f %.4f\n", (unsigned long long)it,
                s->mean, s->best, s->center, elapsed);
        fflush(r->log); /* plottable while the run goes on */
    }
}

static int save(struct run *r)
{
    char err[512];
    if (!r->o->checkpoint)
        return 0;
    if (r->o->state_mu)
        pthread_mutex_lock(r->o->state_mu);
    int rc = es_checkpoint_save(r->st, r->o->checkpoint, err, sizeof err);
    if (r->o->state_mu)
        pthread_mutex_unlock(r->o->state_mu);
    if (rc != 0) {
        fprintf(stderr, "es: %s\n", err);
        return -1;
    }
    return 0;
}

/* When the evaluation episodes reach the target: the unperturbed policy
 * on TEST_EPISODES start states it has never seen must reach it too, so
 * that "solved" does not rest on a few lucky episodes. */
#define TEST_EPISODES 20

static int final_test(struct run *r, struct es_outcome *out)
{
    struct es_state *st = r->st;
    unsigned char *recs = calloc(TEST_EPISODES, r->full_size);
    unsigned char *res = calloc(TEST_EPISODES, r->res_size);
    int rc = recs && res ? 0 : -1;
    struct es_task t = {ES_TASK_MAGIC, (uint16_t)r->env_id, ES_KIND_EVAL,
                        (uint32_t)st->nparams, (uint32_t)st->shape.obs_dim,
                        (uint32_t)st->shape.hidden, 0, 0, 1, 0};
    uint64_t rng = st->rng ^ 0x7465737445534553ull; /* "TESTESES" */
    for (int i = 0; rc == 0 && i < TEST_EPISODES; i++) {
        t.seed = es_rand64(&rng);
        es_task_pack(recs + (size_t)i * r->full_size, &t, st->theta, r->mean,
                     r->std);
    }
    if (rc == 0 && fiber_pool_map(r->pool, r->o->task ? r->o->task : "es_eval",
                                  recs, r->full_size, TEST_EPISODES, res,
                                  r->res_size, 0) != 0) {
        fprintf(stderr, "es: test episodes: %s\n", fiber_last_error());
        rc = -1;
    }
    out->test_mean = 0;
    out->test_min = HUGE_VAL;
    for (int i = 0; rc == 0 && i < TEST_EPISODES; i++) {
        struct es_result e;
        es_result_unpack(res + (size_t)i * r->res_size, st->shape.obs_dim,
                         &e, NULL, NULL);
        out->test_mean += e.ret[0] / TEST_EPISODES;
        out->test_min = fmin(out->test_min, e.ret[0]);
    }
    out->test_episodes = rc == 0 ? TEST_EPISODES : 0;
    free(recs);
    free(res);
    return rc;
}

/* Runs iteration st->iteration + 1.  Returns 1 when solved, 0 to go on,
 * -1 on failure. */
static int iterate(struct run *r, struct es_outcome *out)
{
    uint64_t it = r->st->iteration + 1;
    struct es_iter_info s = {.iteration = it};
    double t0 = now_s();
    build_tasks(r);
    double t1 = now_s();
    if (run_map(r) != 0) {
        fprintf(stderr, "es: iteration %llu: %s\n", (unsigned long long)it,
                fiber_last_error());
        return -1;
    }
    double t2 = now_s();
    collect(r, &s);
    int candidate = s.center >= r->o->target, solved = 0;
    if (candidate && final_test(r, out) != 0)
        return -1;
    solved = candidate && out->test_mean >= r->o->target;
    if (r->o->state_mu)
        pthread_mutex_lock(r->o->state_mu);
    r->st->rng = r->rng_next;
    if (!solved)
        update(r);
    if (r->o->state_mu)
        pthread_mutex_unlock(r->o->state_mu);
    s.seconds = now_s() - t0;
    s.map_seconds = t2 - t1;
    s.master_seconds = s.seconds - s.map_seconds;
    report(r, it, &s);
    if (candidate && !solved && !r->o->quiet)
        printf("  the evaluation episodes reached %g, but %d new ones "
               "average %g: training on\n", r->o->target, out->test_episodes,
               out->test_mean);
    if (r->o->on_iter)
        r->o->on_iter(r->o->on_iter_ud, &s);
    out->episodes += s.episodes;
    out->steps += s.steps;
    out->center = s.center;
    if (!isnan(s.center) && s.center > out->best_center)
        out->best_center = s.center;
    if (solved)
        return 1;
    int every = r->o->checkpoint_every;
    if (every > 0 && r->st->iteration % (uint64_t)every == 0 && save(r) != 0)
        return -1;
    return 0;
}

int es_train(const struct es_opts *o, struct es_state *st,
             struct es_outcome *out)
{
    struct run r;
    memset(&r, 0, sizeof r);
    memset(out, 0, sizeof *out);
    out->best_center = -HUGE_VAL;
    r.o = o;
    r.st = st;
    r.env_id = es_env_id(st->env);
    r.t0 = now_s();
    int rc = alloc_run(&r) == 0 ? 0 : -1;
    if (rc)
        fprintf(stderr, "es: out of memory\n");
    if (rc == 0)
        rc = build_noise(&r) || start_pool(&r) || open_log(&r) ? -1 : 0;
    while (rc == 0 && st->iteration < (uint64_t)o->iters) {
        if (o->stop_aware && fiber_stop_requested()) {
            out->stopped = 1;
            break;
        }
        rc = iterate(&r, out);
        if (rc == 1) {
            out->solved = 1;
            rc = 0;
            break;
        }
    }
    out->seconds = now_s() - r.t0;
    if (rc == 0)
        rc = save(&r);
    free_run(&r);
    return rc;
}
