/*
 * rollout.c -- records, episodes, and the two pool tasks: es_init (build
 * the noise table in a worker) and es_eval (run one record).
 */
#include "rollout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fiber/fiber.h>

#include "env.h"
#include "noise.h"
#include "policy.h"

/* What one episode needs besides the parameters. */
struct episode {
    const struct env_def *env;
    void *ctx;
    struct policy_shape shape;
    const float *mean, *std;
    uint64_t seed;
    double *obs_sum, *obs_sumsq; /* accumulated into */
    double obs_count;
};

/* Per-process scratch, grown on demand: a worker runs one task at a time,
 * and reusing the buffers keeps malloc out of the per-task path. */
static float *scratch;
static size_t scratch_cap;

static size_t round8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

size_t es_task_size(size_t nparams, int obs_dim)
{
    return round8(sizeof(struct es_task) +
                  (nparams + 2 * (size_t)obs_dim) * sizeof(float));
}

size_t es_result_size(int obs_dim)
{
    return round8(sizeof(struct es_result) +
                  2 * (size_t)obs_dim * sizeof(double));
}

size_t es_task_head_size(void) { return round8(sizeof(struct es_task)); }

size_t es_ref_record_size(void)
{
    return round8(sizeof(struct es_task) + sizeof(fiber_ref));
}

size_t es_shared_size(size_t nparams, int obs_dim)
{
    return (nparams + 2 * (size_t)obs_dim) * sizeof(float);
}

void es_shared_pack(void *blob, size_t nparams, int obs_dim,
                    const float *theta, const float *mean, const float *std)
{
    unsigned char *p = blob;
    memcpy(p, theta, nparams * sizeof(float));
    p += nparams * sizeof(float);
    memcpy(p, mean, (size_t)obs_dim * sizeof(float));
    memcpy(p + (size_t)obs_dim * sizeof(float), std,
           (size_t)obs_dim * sizeof(float));
}

void es_task_pack(void *rec, const struct es_task *t, const float *theta,
                  const float *mean, const float *std)
{
    unsigned char *p = rec;
    memcpy(p, t, sizeof *t);
    p += sizeof *t;
    memcpy(p, theta, t->nparams * sizeof(float));
    p += t->nparams * sizeof(float);
    memcpy(p, mean, t->obs_dim * sizeof(float));
    p += t->obs_dim * sizeof(float);
    memcpy(p, std, t->obs_dim * sizeof(float));
}

void es_result_unpack(const void *res, int obs_dim, struct es_result *r,
                      double *sum, double *sumsq)
{
    const unsigned char *p = res;
    memcpy(r, p, sizeof *r);
    p += sizeof *r;
    if (sum)
        memcpy(sum, p, (size_t)obs_dim * sizeof(double));
    if (sumsq)
        memcpy(sumsq, p + (size_t)obs_dim * sizeof(double),
               (size_t)obs_dim * sizeof(double));
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void squash(const struct env_def *e, const float *y, float *act)
{
    if (e->discrete) {
        act[0] = y[0]; /* the environment looks at the sign */
        return;
    }
    for (int k = 0; k < e->act_dim; k++)
        act[k] = e->act_high * tanhf(y[k]);
}

static void add_obs(struct episode *ep, const float *obs)
{
    for (int i = 0; i < ep->shape.obs_dim; i++) {
        ep->obs_sum[i] += obs[i];
        ep->obs_sumsq[i] += (double)obs[i] * obs[i];
    }
    ep->obs_count += 1;
}

/* Runs one episode of the policy theta; returns its return. */
static double run_episode(struct episode *ep, const float *theta,
                          uint32_t *steps)
{
    float obs[ES_MAX_OBS], x[ES_MAX_OBS], h[ES_MAX_HIDDEN];
    float y[ES_MAX_ACT], act[ES_MAX_ACT];
    const struct env_def *e = ep->env;
    double ret = 0;
    int t = 0;
    e->reset(ep->ctx, ep->seed, obs);
    while (t < e->max_steps) {
        add_obs(ep, obs);
        policy_normalize(obs, ep->mean, ep->std, e->obs_dim, x);
        policy_forward(theta, &ep->shape, x, h, y);
        squash(e, y, act);
        double r;
        int done = e->step(ep->ctx, act, obs, &r);
        ret += r;
        t++;
        if (done)
            break;
    }
    *steps = (uint32_t)t;
    return ret;
}

/* The mean return of k episodes from seeds seed, seed + 1, ...: where
 * start states differ a lot (the pendulum), one episode says more about
 * its start than about the policy. */
static double run_episodes(struct episode *ep, const float *theta,
                           uint32_t k, uint32_t *steps)
{
    uint64_t seed0 = ep->seed;
    double total = 0;
    *steps = 0;
    k = k ? k : 1;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t n;
        ep->seed = seed0 + i;
        total += run_episode(ep, theta, &n);
        *steps += n;
    }
    ep->seed = seed0;
    return total / k;
}

/* Checks a record against the environment it names.  Returns the
 * environment, or NULL with err set. */
static const struct env_def *check_task(const struct es_task *t, size_t len,
                                        int shared, char *err, size_t errlen)
{
    const struct env_def *e = es_env_get(t->env_id);
    if (t->magic != ES_TASK_MAGIC || !e) {
        snprintf(err, errlen, "not an es_eval record (magic %08x, env %u)",
                 t->magic, t->env_id);
        return NULL;
    }
    struct policy_shape s = {e->obs_dim, (int)t->hidden, e->act_dim};
    if ((int)t->obs_dim != e->obs_dim || t->hidden < 1 ||
        t->hidden > ES_MAX_HIDDEN || t->nparams != policy_nparams(&s) ||
        len != (shared ? es_shared_size(t->nparams, e->obs_dim)
                       : es_task_size(t->nparams, e->obs_dim))) {
        snprintf(err, errlen, "record of %zu bytes does not match %s with "
                 "%u hidden units", len, e->name, t->hidden);
        return NULL;
    }
    return e;
}

static float *scratch_get(size_t n)
{
    if (n > scratch_cap) {
        float *p = realloc(scratch, n * sizeof *p);
        if (!p)
            return NULL;
        scratch = p;
        scratch_cap = n;
    }
    return scratch;
}

/* theta + sign * sigma * eps into dst. */
static void perturb(float *dst, const float *theta, const float *eps,
                    float sigma, size_t n)
{
    for (size_t j = 0; j < n; j++)
        dst[j] = theta[j] + sigma * eps[j];
}

/* Runs the one or two episodes of record t with parameters data; work
 * holds nparams floats of scratch.  Fills r. */
static int run_task(const struct es_task *t, const float *data, float *work,
                    struct episode *ep, struct es_result *r, char *err,
                    size_t errlen)
{
    size_t n = t->nparams;
    if (t->kind == ES_KIND_EVAL) {
        r->ret[0] = run_episodes(ep, data, t->episodes, &r->steps[0]);
        return 0;
    }
    size_t noise_n;
    const float *noise = es_noise_table(&noise_n);
    if (!noise || (size_t)t->noise_offset + n > noise_n) {
        snprintf(err, errlen, "no noise at offset %u (table of %zu floats; "
                 "was the pool created with the es_init initializer?)",
                 t->noise_offset, noise_n);
        return -1;
    }
    /* The mirrors share the episode seed: the same start states make
     * the difference of their returns depend on eps, not on luck. */
    perturb(work, data, noise + t->noise_offset, t->sigma, n);
    r->ret[0] = run_episodes(ep, work, t->episodes, &r->steps[0]);
    perturb(work, data, noise + t->noise_offset, -t->sigma, n);
    r->ret[1] = run_episodes(ep, work, t->episodes, &r->steps[1]);
    return 0;
}

/* es_evaluate and es_evaluate_shared: the header t, its arrays at
 * arrays (len bytes of them, as check_task wants for the form). */
static int evaluate(const struct es_task *tp, const void *arrays, size_t len,
                    int shared, void *res, size_t res_len, char *err,
                    size_t errlen)
{
    struct es_task t = *tp;
    const struct env_def *e = check_task(&t, len, shared, err, errlen);
    if (!e)
        return -1;
    if (res_len != es_result_size(e->obs_dim) ||
        (t.kind != ES_KIND_PAIR && t.kind != ES_KIND_EVAL)) {
        snprintf(err, errlen, "bad result size %zu or kind %u", res_len,
                 t.kind);
        return -1;
    }
    void *ctx = es_env_context(t.env_id, err, errlen);
    if (!ctx)
        return -1;
    /* The record's floats may sit at any address inside a message, so
     * they are read through an aligned copy. */
    size_t nfloat = t.nparams + 2 * (size_t)e->obs_dim;
    float *data = scratch_get(nfloat + t.nparams);
    if (!data) {
        snprintf(err, errlen, "out of memory for %u parameters", t.nparams);
        return -1;
    }
    memcpy(data, arrays, nfloat * sizeof *data);
    double sum[ES_MAX_OBS] = {0}, sumsq[ES_MAX_OBS] = {0};
    struct episode ep = {e,   ctx,  {e->obs_dim, (int)t.hidden, e->act_dim},
                         data + t.nparams, data + t.nparams + e->obs_dim,
                         t.seed, sum, sumsq, 0};
    struct es_result r;
    memset(&r, 0, sizeof r);
    uint64_t t0 = now_ns();
    int rc = run_task(&t, data, data + nfloat, &ep, &r, err, errlen);
    r.env_ns = now_ns() - t0;
    r.obs_count = ep.obs_count;
    if (rc)
        return -1;
    unsigned char *o = res;
    memset(o, 0, res_len);
    memcpy(o, &r, sizeof r);
    memcpy(o + sizeof r, sum, (size_t)e->obs_dim * sizeof(double));
    memcpy(o + sizeof r + (size_t)e->obs_dim * sizeof(double), sumsq,
           (size_t)e->obs_dim * sizeof(double));
    return 0;
}

int es_evaluate(const void *rec, size_t len, void *res, size_t res_len,
                char *err, size_t errlen)
{
    struct es_task t;
    if (len < sizeof t) {
        snprintf(err, errlen, "record of %zu bytes is too short", len);
        return -1;
    }
    memcpy(&t, rec, sizeof t);
    return evaluate(&t, (const unsigned char *)rec + sizeof t, len, 0, res,
                    res_len, err, errlen);
}

/* A header-only record whose arrays are the call's shared object. */
static int evaluate_shared(const void *rec, size_t len, void *res,
                           size_t res_len, char *err, size_t errlen)
{
    struct es_task t;
    if (len != es_task_head_size()) {
        snprintf(err, errlen, "a shared-form record is %zu bytes, not %zu",
                 es_task_head_size(), len);
        return -1;
    }
    memcpy(&t, rec, sizeof t);
    const void *arrays;
    size_t n;
    if (fiber_task_shared(&arrays, &n) != 0) {
        snprintf(err, errlen, "%s", fiber_last_error());
        return -1;
    }
    return evaluate(&t, arrays, n, 1, res, res_len, err, errlen);
}

/* ---- the pool's tasks ---------------------------------------------------- */

FIBER_TASK(es_init)
{
    struct es_init_arg a;
    if (len != sizeof a)
        return fiber_task_fail("es_init wants a struct es_init_arg");
    memcpy(&a, arg, sizeof a);
    if (es_noise_init(a.noise_seed, a.noise_log2) != 0)
        return fiber_task_fail("cannot build a noise table of 2^%u floats",
                               a.noise_log2);
    if (es_noise_table_hash() != a.noise_hash)
        return fiber_task_fail(
            "noise table differs from the master's (hash %016llx, master "
            "%016llx): this host's libm computes other values",
            (unsigned long long)es_noise_table_hash(),
            (unsigned long long)a.noise_hash);
    return 0;
}

/* A header and a ref: the arrays are the ref's object. */
static int evaluate_ref(const void *rec, size_t len, void *res,
                        size_t res_len, char *err, size_t errlen)
{
    struct es_task t;
    fiber_ref ref;
    if (len != es_ref_record_size()) {
        snprintf(err, errlen, "a ref-form record is %zu bytes, not %zu",
                 es_ref_record_size(), len);
        return -1;
    }
    memcpy(&t, rec, sizeof t);
    memcpy(&ref, (const unsigned char *)rec + sizeof t, sizeof ref);
    const void *arrays;
    size_t n;
    if (fiber_object_get(&ref, &arrays, &n) != 0) {
        snprintf(err, errlen, "%s", fiber_last_error());
        return -1;
    }
    return evaluate(&t, arrays, n, 1, res, res_len, err, errlen);
}

typedef int (*eval_fn)(const void *rec, size_t len, void *res,
                       size_t res_len, char *err, size_t errlen);

/* Every record form: the result's size comes from the header. */
static int eval_task(const void *arg, size_t len, fiber_buf *out, eval_fn fn)
{
    char err[256];
    const struct env_def *e = NULL;
    struct es_task t;
    if (len >= sizeof t) {
        memcpy(&t, arg, sizeof t);
        e = es_env_get(t.env_id);
    }
    size_t res_len = es_result_size(e ? e->obs_dim : 0);
    int rc = fiber_buf_reserve(out, res_len);
    if (rc)
        return rc;
    if (fn(arg, len, out->data + out->len, res_len, err, sizeof err))
        return fiber_task_fail("%s", err);
    out->len += res_len;
    return 0;
}

FIBER_TASK(es_eval) { return eval_task(arg, len, out, es_evaluate); }

FIBER_TASK(es_eval_shared)
{
    return eval_task(arg, len, out, evaluate_shared);
}

FIBER_TASK(es_eval_ref) { return eval_task(arg, len, out, evaluate_ref); }
