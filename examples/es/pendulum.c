/*
 * pendulum.c -- pendulum swing-up with gym's Pendulum-v1 dynamics: a
 * pendulum starts at a random angle and must be swung up and held
 * upright with a torque in [-2, 2] too weak to lift it directly.  200
 * steps of 0.05 s; reward -(theta^2 + 0.1 thetadot^2 + 0.001 u^2), so 0
 * is the (unreachable) best return and good policies score about -150.
 */
#include <math.h>
#include <stdlib.h>

#include "env.h"
#include "noise.h"

#define G 10.0
#define MASS 1.0
#define LENGTH 1.0
#define DT 0.05
#define MAX_SPEED 8.0
#define MAX_TORQUE 2.0

static double clip(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* theta wrapped into [-pi, pi): the cost measures the shortest way up. */
static double angle_normalize(double th)
{
    return fmod(fmod(th + M_PI, 2 * M_PI) + 2 * M_PI, 2 * M_PI) - M_PI;
}

double pendulum_dynamics(struct pendulum_state *s, double u)
{
    u = clip(u, -MAX_TORQUE, MAX_TORQUE);
    double th = angle_normalize(s->theta);
    double cost = th * th + 0.1 * s->theta_dot * s->theta_dot + 0.001 * u * u;
    double thdot = s->theta_dot + (3.0 * G / (2.0 * LENGTH) * sin(s->theta) +
                                   3.0 / (MASS * LENGTH * LENGTH) * u) *
                                      DT;
    thdot = clip(thdot, -MAX_SPEED, MAX_SPEED);
    s->theta += thdot * DT; /* semi-implicit: the new speed moves it */
    s->theta_dot = thdot;
    return -cost;
}

static void observe(const struct pendulum_state *s, float *obs)
{
    obs[0] = (float)cos(s->theta);
    obs[1] = (float)sin(s->theta);
    obs[2] = (float)s->theta_dot;
}

static int pd_open(void **ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    *ctx = calloc(1, sizeof(struct pendulum_state));
    return *ctx ? 0 : -1;
}

static void pd_reset(void *ctx, uint64_t seed, float *obs)
{
    struct pendulum_state *s = ctx;
    uint64_t rng = seed;
    s->theta = (es_uniform(&rng) * 2 - 1) * M_PI;
    s->theta_dot = es_uniform(&rng) * 2 - 1;
    observe(s, obs);
}

static int pd_step(void *ctx, const float *act, float *obs, double *reward)
{
    struct pendulum_state *s = ctx;
    *reward = pendulum_dynamics(s, act[0]);
    observe(s, obs);
    return 0; /* only the time limit ends an episode */
}

const struct env_def es_env_pendulum = {
    .name = "pendulum",
    .summary = "pendulum swing-up, 200 steps, good policies score about -150",
    .obs_dim = 3,
    .act_dim = 1,
    .hidden = 32,
    .max_steps = 200,
    .discrete = 0,
    .act_high = 2.0f,
    /* Start states differ so much that one episode says more about the
     * start than about the policy: two per perturbation.  A large step
     * with a modest population works best here: 32 pairs with lr 0.1
     * solved 6 of 6 seeds in 65-353 iterations (under 3.5 s on 2 cores),
     * where 128 pairs with lr 0.01 stalled near -670 for 1,000.  Weight
     * decay made it slower in our runs. */
    .pop = 32,
    .episodes = 2,
    .sigma = 0.1,
    .lr = 0.1,
    .l2 = 0.0,
    .iters = 1000,
    .target = -200.0,
    .open = pd_open,
    .reset = pd_reset,
    .step = pd_step,
};
