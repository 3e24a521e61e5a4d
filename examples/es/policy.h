/*
 * policy.h -- the policy: a one-hidden-layer MLP, obs -> tanh -> action.
 *
 * Parameters are one flat float vector, the thing ES perturbs:
 *   W1[hidden][obs_dim], b1[hidden], W2[act_dim][hidden], b2[act_dim].
 */
#ifndef ES_POLICY_H
#define ES_POLICY_H

#include <stddef.h>
#include <stdint.h>

struct policy_shape {
    int obs_dim, hidden, act_dim;
};

/* The number of parameters of a policy of this shape. */
size_t policy_nparams(const struct policy_shape *s);

/* Fresh parameters: each row of W1 normal with norm 1, each row of W2 with
 * norm 0.01 and zero biases (Salimans et al.'s "normc" initialisation: the
 * small output layer starts the policy near "do nothing", so early
 * perturbations decide the behaviour). */
void policy_init(float *theta, const struct policy_shape *s, uint64_t *rng);

/* Normalises an observation with the master's running statistics and
 * clips it to [-5, 5], so one huge reading cannot saturate every unit. */
void policy_normalize(const float *obs, const float *mean, const float *std,
                      int n, float *out);

/* Computes the raw outputs y (act_dim values, not squashed) for the
 * normalised observation x.  hbuf holds `hidden` floats of scratch. */
void policy_forward(const float *theta, const struct policy_shape *s,
                    const float *x, float *hbuf, float *y);

#endif
