/*
 * cartpole.c -- cart-pole balancing, the classic Barto, Sutton & Anderson
 * (1983) system with gym's CartPole-v1 constants and Euler integration:
 * a pole hinged on a cart; push the cart left or right (10 N) to keep the
 * pole within 12 degrees of upright and the cart within 2.4 m of the
 * centre.  Reward 1 per step, episodes cut at 500 steps, so 500 is the
 * best return.
 */
#include <math.h>
#include <stdlib.h>

#include "env.h"
#include "noise.h"

#define GRAVITY 9.8
#define MASS_CART 1.0
#define MASS_POLE 0.1
#define TOTAL_MASS (MASS_CART + MASS_POLE)
#define HALF_LENGTH 0.5 /* "length" in gym: half the pole's length */
#define POLE_MASS_LENGTH (MASS_POLE * HALF_LENGTH)
#define FORCE 10.0
#define TAU 0.02
#define THETA_LIMIT (12.0 * 2.0 * M_PI / 360.0)
#define X_LIMIT 2.4

int cartpole_dynamics(struct cartpole_state *s, int action)
{
    double force = action ? FORCE : -FORCE;
    double c = cos(s->theta), sn = sin(s->theta);
    double temp =
        (force + POLE_MASS_LENGTH * s->theta_dot * s->theta_dot * sn) /
        TOTAL_MASS;
    double theta_acc =
        (GRAVITY * sn - c * temp) /
        (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * c * c / TOTAL_MASS));
    double x_acc = temp - POLE_MASS_LENGTH * theta_acc * c / TOTAL_MASS;
    /* gym's "euler" order: positions move with the old velocities. */
    s->x += TAU * s->x_dot;
    s->x_dot += TAU * x_acc;
    s->theta += TAU * s->theta_dot;
    s->theta_dot += TAU * theta_acc;
    return s->x < -X_LIMIT || s->x > X_LIMIT || s->theta < -THETA_LIMIT ||
           s->theta > THETA_LIMIT;
}

static void observe(const struct cartpole_state *s, float *obs)
{
    obs[0] = (float)s->x;
    obs[1] = (float)s->x_dot;
    obs[2] = (float)s->theta;
    obs[3] = (float)s->theta_dot;
}

static int cp_open(void **ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    *ctx = calloc(1, sizeof(struct cartpole_state));
    return *ctx ? 0 : -1;
}

static void cp_reset(void *ctx, uint64_t seed, float *obs)
{
    struct cartpole_state *s = ctx;
    uint64_t rng = seed;
    /* Every state variable uniform in [-0.05, 0.05], as gym does. */
    s->x = es_uniform(&rng) * 0.1 - 0.05;
    s->x_dot = es_uniform(&rng) * 0.1 - 0.05;
    s->theta = es_uniform(&rng) * 0.1 - 0.05;
    s->theta_dot = es_uniform(&rng) * 0.1 - 0.05;
    observe(s, obs);
}

static int cp_step(void *ctx, const float *act, float *obs, double *reward)
{
    struct cartpole_state *s = ctx;
    int done = cartpole_dynamics(s, act[0] > 0.0f);
    observe(s, obs);
    *reward = 1.0; /* also for the step that fails, as in gym */
    return done;
}

const struct env_def es_env_cartpole = {
    .name = "cartpole",
    .summary = "cart-pole balancing, 500 steps, return 500 is the maximum",
    .obs_dim = 4,
    .act_dim = 1,
    .hidden = 16,
    .max_steps = 500,
    .discrete = 1,
    .act_high = 1.0f,
    .pop = 32,
    .episodes = 1,
    .sigma = 0.1,
    .lr = 0.05,
    .l2 = 0.005,
    .iters = 200,
    .target = 500.0,
    .open = cp_open,
    .reset = cp_reset,
    .step = cp_step,
};
