/*
 * humanoid.c -- MuJoCo humanoid locomotion, built only when CMake found
 * MuJoCo (libmujoco-dev) at configure time; otherwise opening it fails
 * with a message that names the packages to install.
 *
 * Model: the humanoid that libmujoco-samples ships
 * (/usr/share/mujoco/model/humanoid/humanoid.xml: 21 actuators with
 * controls in [-1, 1], 27 degrees of freedom); ES_HUMANOID_XML in the
 * environment overrides the path.  Observation: qpos without the global
 * x and y, then qvel (26 + 27 = 53 values).  One step is 3 physics steps
 * of 5 ms.  Reward, the usual locomotion one: forward velocity of the
 * centre of mass + alive bonus 5 - 0.1 * sum(u^2).  The episode ends
 * when the torso's height leaves [1.0, 2.0] or after 1000 steps.
 */
#include <stdio.h>
#include <stdlib.h>

#include "env.h"

#define OBS_DIM 53
#define ACT_DIM 21

#ifdef ES_HAVE_MUJOCO
#include <mujoco/mujoco.h>
#include <string.h>

#include <fiber/fiber.h>

#include "noise.h"

#define FRAME_SKIP 3
#define ALIVE_BONUS 5.0
#define CTRL_COST 0.1
#define Z_MIN 1.0
#define Z_MAX 2.0
#define INIT_NOISE 0.01

struct humanoid {
    mjModel *m;
    mjData *d;
};

/* MuJoCo's default handler prints to stdout and appends to
 * MUJOCO_LOG.TXT in the working directory; fiber's log is the place. */
static void warn_to_log(const char *msg)
{
    fiber_log(FIBER_LOG_WARN, "mujoco: %s", msg);
}

static int hm_open(void **ctx, char *err, size_t errlen)
{
    const char *path = getenv("ES_HUMANOID_XML");
    if (!path || !*path)
        path = ES_HUMANOID_XML;
    if (!*path) {
        snprintf(err, errlen, "humanoid: no model file: install "
                 "libmujoco-samples (apt-get install libmujoco-samples) "
                 "and re-run cmake, or set ES_HUMANOID_XML to humanoid.xml");
        return -1;
    }
    mju_user_warning = warn_to_log;
    char why[512] = "";
    mjModel *m = mj_loadXML(path, NULL, why, sizeof why);
    if (!m) {
        snprintf(err, errlen, "humanoid: cannot load %s: %s", path, why);
        return -1;
    }
    if (m->nq - 2 + m->nv != OBS_DIM || m->nu != ACT_DIM) {
        snprintf(err, errlen, "humanoid: %s has nq %d, nv %d, nu %d; the "
                 "example expects MuJoCo's humanoid.xml (28, 27, 21)", path,
                 m->nq, m->nv, m->nu);
        mj_deleteModel(m);
        return -1;
    }
    struct humanoid *h = calloc(1, sizeof *h);
    if (!h || !(h->d = mj_makeData(m))) {
        free(h);
        mj_deleteModel(m);
        snprintf(err, errlen, "humanoid: out of memory");
        return -1;
    }
    h->m = m;
    *ctx = h;
    return 0;
}

static void observe(const struct humanoid *h, float *obs)
{
    int k = 0;
    for (int i = 2; i < h->m->nq; i++)
        obs[k++] = (float)h->d->qpos[i];
    for (int i = 0; i < h->m->nv; i++)
        obs[k++] = (float)h->d->qvel[i];
}

static void hm_reset(void *ctx, uint64_t seed, float *obs)
{
    struct humanoid *h = ctx;
    uint64_t rng = seed;
    mj_resetData(h->m, h->d);
    /* Small uniform noise on the initial pose and velocity, as gym adds. */
    for (int i = 0; i < h->m->nq; i++)
        h->d->qpos[i] += (es_uniform(&rng) * 2 - 1) * INIT_NOISE;
    for (int i = 0; i < h->m->nv; i++)
        h->d->qvel[i] = (es_uniform(&rng) * 2 - 1) * INIT_NOISE;
    mj_forward(h->m, h->d);
    observe(h, obs);
}

static int hm_step(void *ctx, const float *act, float *obs, double *reward)
{
    struct humanoid *h = ctx;
    double ctrl = 0;
    for (int i = 0; i < ACT_DIM; i++) {
        double u = act[i] < -1.0f ? -1.0 : act[i] > 1.0f ? 1.0 : act[i];
        h->d->ctrl[i] = u;
        ctrl += u * u;
    }
    /* Body 1 is the torso, whose subtree is the whole humanoid. */
    double x0 = h->d->subtree_com[3];
    for (int k = 0; k < FRAME_SKIP; k++)
        mj_step(h->m, h->d);
    double vx = (h->d->subtree_com[3] - x0) / (FRAME_SKIP * h->m->opt.timestep);
    *reward = vx + ALIVE_BONUS - CTRL_COST * ctrl;
    observe(h, obs);
    double z = h->d->qpos[2];
    /* A simulation that blew up is over too, not a source of huge returns. */
    return z < Z_MIN || z > Z_MAX || h->d->warning[mjWARN_BADQACC].number > 0;
}

#else /* !ES_HAVE_MUJOCO */

static int hm_open(void **ctx, char *err, size_t errlen)
{
    (void)ctx;
    snprintf(err, errlen,
             "the humanoid environment needs MuJoCo, which was not found "
             "when this program was configured: install it with "
             "'apt-get install libmujoco-dev libmujoco-samples', then "
             "re-run cmake (cmake -S . -B build) and rebuild");
    return -1;
}

static void hm_reset(void *ctx, uint64_t seed, float *obs)
{
    (void)ctx;
    (void)seed;
    (void)obs;
}

static int hm_step(void *ctx, const float *act, float *obs, double *reward)
{
    (void)ctx;
    (void)act;
    (void)obs;
    *reward = 0;
    return 1;
}

#endif

const struct env_def es_env_humanoid = {
    .name = "humanoid",
    .summary = "MuJoCo humanoid locomotion, 1000 steps (needs libmujoco-dev)",
    .obs_dim = OBS_DIM,
    .act_dim = ACT_DIM,
    .hidden = 32,
    .max_steps = 1000,
    .discrete = 0,
    .act_high = 1.0f,
    .pop = 128,
    .episodes = 1,
    .sigma = 0.02,
    .lr = 0.01,
    .l2 = 0.005,
    .iters = 1000,
    .target = 6000.0,
    .open = hm_open,
    .reset = hm_reset,
    .step = hm_step,
};
