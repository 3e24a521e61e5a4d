/*
 * selftest.c -- `es --selftest`: checks each piece of the example against
 * values worked out by hand, then the parts that need a pool: workers
 * compute bit for bit what the master computes, and a resumed run ends
 * exactly where an uninterrupted one does.  Prints "selftest passed" and
 * returns 0, or names each failed check and returns 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "env.h"
#include "es.h"
#include "noise.h"
#include "policy.h"
#include "rollout.h"
#include "train.h"

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                        \
            printf(__VA_ARGS__);                                               \
            printf("\n");                                                      \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static int near(double a, double b, double tol)
{
    return fabs(a - b) <= tol;
}

static void test_noise(void)
{
    enum { N = 1 << 16 };
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    if (!a || !b) {
        CHECK(0, "out of memory");
        free(a);
        free(b);
        return;
    }
    es_noise_fill(a, N, 42);
    es_noise_fill(b, N, 42);
    CHECK(memcmp(a, b, N * sizeof *a) == 0, "two tables from seed 42 differ");
    CHECK(es_noise_hash(a, N) == es_noise_hash(b, N), "hashes differ");
    double m = 0, v = 0;
    for (int i = 0; i < N; i++)
        m += a[i];
    m /= N;
    for (int i = 0; i < N; i++)
        v += (a[i] - m) * (a[i] - m);
    v /= N;
    CHECK(near(m, 0, 0.02) && near(v, 1, 0.03),
          "noise mean %g, variance %g; want 0 and 1", m, v);
    es_noise_fill(b, N, 43);
    CHECK(memcmp(a, b, N * sizeof *a) != 0, "seeds 42 and 43 agree");
    CHECK(es_noise_init(42, 16) == 0 && es_noise_table_hash() ==
          es_noise_hash(a, N), "the process table differs from a fill");
    free(a);
    free(b);
}

static void test_ranks(void)
{
    double x[4] = {3, -1, 10, 2}, r[4];
    size_t idx[4];
    /* Sorted: -1, 2, 3, 10 -> ranks 2, 0, 3, 1 -> rank/3 - 0.5. */
    double want[4] = {1.0 / 6, -0.5, 0.5, -1.0 / 6};
    es_centered_ranks(x, 4, r, idx);
    for (int i = 0; i < 4; i++)
        CHECK(near(r[i], want[i], 1e-12), "rank[%d] = %g, want %g", i, r[i],
              want[i]);
    double t[3] = {5, 5, 1}, tr[3];
    es_centered_ranks(t, 3, tr, idx); /* the 5s share ranks 1 and 2 */
    CHECK(tr[2] == -0.5 && tr[0] == 0.25 && tr[1] == 0.25,
          "tied ranks %g %g %g, want 0.25 0.25 -0.5", tr[0], tr[1], tr[2]);
}

static void test_gradient(void)
{
    const float noise[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint32_t off[2] = {0, 4};
    const double w[2] = {1, -0.5};
    double g[3];
    /* (1*[1 2 3] - 0.5*[5 6 7]) / (2 pairs * 2) */
    const double want[3] = {-0.375, -0.25, -0.125};
    es_gradient(w, off, 2, noise, 3, g);
    for (int j = 0; j < 3; j++)
        CHECK(near(g[j], want[j], 1e-12), "g[%d] = %g, want %g", j, g[j],
              want[j]);
    /* Descent direction with weight decay: -g + l2 * theta. */
    double d[2] = {0.5, -0.25};
    const float theta[2] = {1, -2};
    es_descent_grad(d, theta, 2, 0.1);
    CHECK(near(d[0], -0.4, 1e-12) && near(d[1], 0.05, 1e-12),
          "descent grad %g %g, want -0.4 0.05", d[0], d[1]);
}

static void test_adam(void)
{
    struct adam a;
    float theta[2] = {1, -2};
    const double g[2] = {0.5, -0.25};
    if (adam_init(&a, 2) != 0) {
        CHECK(0, "out of memory");
        return;
    }
    /* Step 1: m = 0.1 g, v = 0.001 g^2, lr_t = 0.1 sqrt(0.001) / 0.1, so
     * the step is lr * sign(g) up to eps: theta = (0.9, -1.9). */
    adam_step(&a, theta, g, 0.1);
    CHECK(near(theta[0], 0.9, 1e-5) && near(theta[1], -1.9, 1e-5),
          "after one Adam step theta = (%g, %g), want (0.9, -1.9)",
          theta[0], theta[1]);
    CHECK(a.t == 1 && near(a.m[0], 0.05, 1e-12) &&
          near(a.v[0], 0.00025, 1e-12), "moments m %g v %g", a.m[0], a.v[0]);
    /* A constant gradient keeps steps of exactly lr: (0.8, -1.8). */
    adam_step(&a, theta, g, 0.1);
    CHECK(near(theta[0], 0.8, 1e-5) && near(theta[1], -1.8, 1e-5),
          "after two steps theta = (%g, %g), want (0.8, -1.8)", theta[0],
          theta[1]);
    adam_free(&a);
}

static void test_cartpole(void)
{
    /* From rest, pushing right: temp = 10/1.1, theta_acc = -600/41,
     * x_acc = 400/41, so x_dot = 0.02 * 400/41 = 8/41 and theta_dot =
     * -0.02 * 600/41 = -12/41; positions move with the old (zero)
     * velocities. */
    struct cartpole_state s = {0, 0, 0, 0};
    int done = cartpole_dynamics(&s, 1);
    CHECK(!done && s.x == 0 && near(s.x_dot, 8.0 / 41, 1e-12) &&
          s.theta == 0 && near(s.theta_dot, -12.0 / 41, 1e-12),
          "cart-pole step from rest: (%g %g %g %g)", s.x, s.x_dot, s.theta,
          s.theta_dot);
    /* Tilted 0.1 rad, pushing left (values computed separately from the
     * same equations). */
    struct cartpole_state t = {0, 0, 0.1, 0};
    cartpole_dynamics(&t, 0);
    CHECK(near(t.x_dot, -0.1964033243338476, 1e-12) &&
          near(t.theta_dot, 0.3224842131741116, 1e-12) && t.theta == 0.1,
          "tilted step: x_dot %.16g theta_dot %.16g", t.x_dot, t.theta_dot);
    struct cartpole_state fall = {0, 0, 0.2, 1.0}; /* 0.22 rad > 12 deg */
    struct cartpole_state out = {2.39, 1.0, 0, 0}; /* x passes 2.4 */
    CHECK(cartpole_dynamics(&fall, 1) == 1, "a pole at 12.6 deg must fail");
    CHECK(cartpole_dynamics(&out, 1) == 1, "a cart at 2.41 m must fail");
}

static void test_pendulum(void)
{
    /* Hanging down (theta = pi), torque 2: cost pi^2 + 0.001 * 4; the new
     * speed is (15 sin(pi) + 3 * 2) * 0.05 = 0.3. */
    struct pendulum_state s = {M_PI, 0};
    double r = pendulum_dynamics(&s, 2.0);
    CHECK(near(r, -(M_PI * M_PI + 0.004), 1e-9), "reward %g", r);
    CHECK(near(s.theta_dot, 0.3, 1e-12) && near(s.theta, M_PI + 0.015, 1e-12),
          "pendulum step: theta %.12g theta_dot %.12g", s.theta, s.theta_dot);
    struct pendulum_state c = {0, 0};
    pendulum_dynamics(&c, 5.0); /* clipped to 2 */
    CHECK(near(c.theta_dot, 0.3, 1e-12), "torque not clipped: %g",
          c.theta_dot);
}

static void test_policy(void)
{
    struct policy_shape sh = {2, 2, 1};
    /* W1 = I, b1 = 0, W2 = (1 1), b2 = 0.5. */
    const float theta[9] = {1, 0, 0, 1, 0, 0, 1, 1, 0.5f};
    const float x[2] = {0.5f, -0.25f};
    float h[2], y[1];
    CHECK(policy_nparams(&sh) == 9, "nparams %zu", policy_nparams(&sh));
    policy_forward(theta, &sh, x, h, y);
    double want = 0.5 + tanh(0.5) + tanh(-0.25);
    CHECK(near(y[0], want, 1e-6), "policy output %g, want %g", y[0], want);
    const float obs[2] = {100, -3}, mean[2] = {0, -1}, sd[2] = {1, 2};
    float n[2];
    policy_normalize(obs, mean, sd, 2, n);
    CHECK(n[0] == 5.0f && n[1] == -1.0f, "normalised %g %g, want 5 -1", n[0],
          n[1]);
}

static int same_state(const struct es_state *a, const struct es_state *b)
{
    size_t n = a->nparams, d = (size_t)a->obs.dim;
    return a->env == b->env && n == b->nparams &&
           a->iteration == b->iteration && a->rng == b->rng &&
           a->noise_seed == b->noise_seed && a->noise_log2 == b->noise_log2 &&
           a->adam.t == b->adam.t &&
           memcmp(a->theta, b->theta, n * sizeof *a->theta) == 0 &&
           memcmp(a->adam.m, b->adam.m, n * sizeof *a->adam.m) == 0 &&
           memcmp(a->adam.v, b->adam.v, n * sizeof *a->adam.v) == 0 &&
           memcmp(a->obs.sum, b->obs.sum, d * sizeof *a->obs.sum) == 0 &&
           memcmp(a->obs.sumsq, b->obs.sumsq, d * sizeof *a->obs.sum) == 0 &&
           a->obs.count == b->obs.count;
}

/* Rewrites one byte of a file. */
static void poke(const char *path, long at, unsigned char v)
{
    FILE *f = fopen(path, "r+b");
    if (f && fseek(f, at, SEEK_SET) == 0)
        fputc(v, f);
    if (f)
        fclose(f);
}

static void expect_load_error(const char *path, const char *words)
{
    struct es_state st;
    char err[512] = "";
    int rc = es_checkpoint_load(&st, path, err, sizeof err);
    CHECK(rc != 0 && strstr(err, words), "loading a bad checkpoint: rc %d, "
          "message '%s', want one with '%s'", rc, err, words);
    if (rc == 0)
        es_state_free(&st);
}

static void test_checkpoint(const char *dir)
{
    struct es_state a, b;
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    if (es_state_init(&a, &es_env_cartpole, 16, 7, 20) != 0) {
        CHECK(0, "out of memory");
        return;
    }
    a.iteration = 12;
    a.adam.t = 12;
    for (size_t j = 0; j < a.nparams; j++) {
        a.adam.m[j] = 0.001 * (double)j;
        a.adam.v[j] = 1e-6 * (double)(j * j);
    }
    double sum[4] = {1, 2, 3, 4}, sq[4] = {5, 6, 7, 8};
    obstat_add(&a.obs, sum, sq, 100);
    int rc = es_checkpoint_save(&a, path, err, sizeof err);
    CHECK(rc == 0, "save: %s", err);
    rc = rc ? rc : es_checkpoint_load(&b, path, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc == 0) {
        CHECK(same_state(&a, &b), "the loaded state differs from the saved");
        es_state_free(&b);
    }
    poke(path, 200, 0x5a); /* inside the payload */
    expect_load_error(path, "damaged");
    poke(path, 8, 2); /* the version */
    expect_load_error(path, "format 2");
    poke(path, 0, 'X');
    expect_load_error(path, "not an ES checkpoint");
    unlink(path);
    es_state_free(&a);
}

/* Records evaluated by pool workers must equal the master's evaluation
 * of the same records, bit for bit (the time field aside). */
static void test_workers_match(void)
{
    struct es_state st;
    if (es_state_init(&st, &es_env_cartpole, 16, 5, 16) != 0 ||
        es_noise_init(st.noise_seed, st.noise_log2) != 0) {
        CHECK(0, "out of memory");
        return;
    }
    enum { N = 6 };
    size_t rs = es_task_size(st.nparams, 4), os = es_result_size(4);
    unsigned char *rec = calloc(N, rs), *got = calloc(N, os), *want =
                                                              calloc(N, os);
    float mean[4] = {0, 0, 0, 0}, sd[4] = {1, 1, 1, 1};
    struct es_init_arg ia = {st.noise_seed, st.noise_log2, 0,
                             es_noise_table_hash()};
    fiber_pool_opts po = {.workers = 2, .initializer = "es_init",
                          .initarg = &ia, .initarg_len = sizeof ia};
    fiber_pool *pool = NULL;
    char err[256];
    int ok = rec && got && want && fiber_pool_create(&pool, &po) == 0;
    CHECK(ok, "pool: %s", fiber_last_error());
    for (int i = 0; ok && i < N; i++) {
        struct es_task t = {ES_TASK_MAGIC, 0, i < 4 ? ES_KIND_PAIR
                                                    : ES_KIND_EVAL,
                            (uint32_t)st.nparams, 4, 16, 1000u * (uint32_t)i,
                            0.5f, 0, 100u + (uint64_t)i};
        es_task_pack(rec + i * rs, &t, st.theta, mean, sd);
        ok = es_evaluate(rec + i * rs, rs, want + i * os, os, err,
                         sizeof err) == 0;
        CHECK(ok, "local evaluation: %s", err);
    }
    if (ok && fiber_pool_map(pool, "es_eval", rec, rs, N, got, os, 0) != 0)
        CHECK(0, "map: %s", fiber_last_error());
    for (int i = 0; ok && i < N; i++) {
        struct es_result g, w;
        memcpy(&g, got + i * os, sizeof g);
        memcpy(&w, want + i * os, sizeof w);
        g.env_ns = w.env_ns = 0;
        CHECK(memcmp(&g, &w, sizeof g) == 0 &&
              memcmp(got + i * os + sizeof g, want + i * os + sizeof w,
                     os - sizeof g) == 0,
              "record %d: worker returns %g/%g, master %g/%g", i, g.ret[0],
              g.ret[1], w.ret[0], w.ret[1]);
    }
    fiber_pool_free(pool);
    free(rec);
    free(got);
    free(want);
    es_state_free(&st);
}

static int train_quiet(struct es_state *st, int iters, int workers,
                       const char *ckpt)
{
    struct es_opts o = {.workers = workers, .pop = 8, .episodes = 2,
                        .eval_episodes = 1,
                        .iters = iters, .sigma = 0.1, .lr = 0.05, .l2 = 0.005,
                        .target = 1e9, .checkpoint = ckpt, .quiet = 1};
    struct es_outcome out;
    return es_train(&o, st, &out);
}

/* 3 iterations, checkpoint, resume for 3 more (on 1 worker) must equal 6
 * uninterrupted iterations (on 2 workers). */
static void test_resume(const char *dir)
{
    struct es_state a, b, c;
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/resume", dir);
    if (es_state_init(&a, &es_env_cartpole, 16, 11, 16) != 0 ||
        es_state_init(&c, &es_env_cartpole, 16, 11, 16) != 0) {
        CHECK(0, "out of memory");
        return;
    }
    int rc = train_quiet(&a, 3, 2, path);
    CHECK(rc == 0 && a.iteration == 3, "first leg: rc %d, iteration %llu",
          rc, (unsigned long long)a.iteration);
    rc = rc ? rc : es_checkpoint_load(&b, path, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc == 0) {
        CHECK(same_state(&a, &b), "checkpoint differs from the run's state");
        rc = train_quiet(&b, 6, 1, NULL);
        CHECK(rc == 0 && b.iteration == 6, "resumed leg failed");
    }
    int rc2 = train_quiet(&c, 6, 2, NULL);
    CHECK(rc2 == 0, "uninterrupted run failed");
    if (rc == 0 && rc2 == 0)
        CHECK(same_state(&b, &c), "resumed run differs from uninterrupted");
    if (rc == 0)
        es_state_free(&b);
    unlink(path);
    es_state_free(&a);
    es_state_free(&c);
}

int es_selftest(void)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/es-selftest-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("es: mkdtemp");
        return 1;
    }
    test_noise();
    test_ranks();
    test_gradient();
    test_adam();
    test_cartpole();
    test_pendulum();
    test_policy();
    test_checkpoint(dir);
    test_workers_match();
    test_resume(dir);
    rmdir(dir);
    if (failures) {
        printf("selftest FAILED: %d check(s)\n", failures);
        return 1;
    }
    printf("selftest passed\n");
    return 0;
}
