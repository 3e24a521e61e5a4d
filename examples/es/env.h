/*
 * env.h -- the environments of the ES example and their common interface.
 *
 * An environment is a table of functions plus a per-process context that
 * is opened once (a MuJoCo model is loaded once per worker, not once per
 * episode).  Its default hyperparameters live here too, so that
 * `es --env NAME` works without tuning flags.
 */
#ifndef ES_ENV_H
#define ES_ENV_H

#include <stddef.h>
#include <stdint.h>

struct env_def {
    const char *name;
    const char *summary;
    int obs_dim, act_dim;
    int hidden;       /* policy width */
    int max_steps;    /* an episode is cut here (a time limit) */
    int discrete;     /* 1: the sign of the single output picks one of two
                         actions; 0: outputs are squashed to +-act_high */
    float act_high;
    /* Defaults for the command line. */
    int pop;          /* antithetic pairs per iteration */
    int episodes;     /* episodes per perturbation */
    double sigma, lr, l2;
    int iters;
    double target;    /* "solved" once the unperturbed policy's mean
                         return over the evaluation episodes reaches it */
    /* Opens the per-process context.  Returns 0, or -1 with a message in
     * err that says how to fix it. */
    int (*open)(void **ctx, char *err, size_t errlen);
    /* Starts an episode whose initial state is drawn from seed. */
    void (*reset)(void *ctx, uint64_t seed, float *obs);
    /* Applies one action; writes the next observation and the reward.
     * Returns 1 when the episode has ended (failure or goal), else 0. */
    int (*step)(void *ctx, const float *act, float *obs, double *reward);
};

extern const struct env_def es_env_cartpole;
extern const struct env_def es_env_pendulum;
extern const struct env_def es_env_humanoid;

/* The environment called name, or NULL. */
const struct env_def *es_env_find(const char *name);

/* Environments by id (the id travels in task records); NULL if unknown. */
const struct env_def *es_env_get(int id);
int es_env_id(const struct env_def *e);

/* A comma-separated list of the names, for messages. */
const char *es_env_names(void);

/* The process's context for environment id, opened on first use and kept.
 * Returns NULL with a message in err on failure. */
void *es_env_context(int id, char *err, size_t errlen);

/* The dynamics alone, for the self-test's hand-computed steps. */
struct cartpole_state {
    double x, x_dot, theta, theta_dot;
};
/* One 0.02 s Euler step pushing right (action 1) or left (0).  Returns 1
 * when the pole has fallen past 12 degrees or the cart left [-2.4, 2.4]. */
int cartpole_dynamics(struct cartpole_state *s, int action);

struct pendulum_state {
    double theta, theta_dot;
};
/* One 0.05 s step with torque u (clipped to [-2, 2]); returns the reward
 * -(theta^2 + 0.1 thetadot^2 + 0.001 u^2), theta taken in [-pi, pi). */
double pendulum_dynamics(struct pendulum_state *s, double u);

#endif
