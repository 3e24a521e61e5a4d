/*
 * es.h -- the optimizer side of evolution strategies (Salimans et al.
 * 2017): fitness shaping by centered ranks, the gradient estimate from
 * mirrored perturbations, Adam with L2 weight decay, and the running
 * observation statistics that the policies normalise with.
 */
#ifndef ES_ES_H
#define ES_ES_H

#include <stddef.h>
#include <stdint.h>

/* Replaces returns by their ranks scaled to [-0.5, 0.5]: the update then
 * ignores the scale of returns and outliers (one lucky episode counts as
 * much as any other best one).  Equal returns share their mean rank.
 * idx is scratch for n indices.  n >= 2. */
void es_centered_ranks(const double *x, size_t n, double *out, size_t *idx);

/* The ES gradient estimate of the expected shaped return:
 *   g = sum_i w_i * eps_i / (2 * npairs),  eps_i = noise[offsets[i] ..]
 * where w_i = rank(+eps_i) - rank(-eps_i).  As in the paper's code, sigma
 * is left out (the learning rate absorbs it). */
void es_gradient(const double *w, const uint32_t *offsets, size_t npairs,
                 const float *noise, size_t nparams, double *g);

struct adam {
    size_t n;
    double *m, *v; /* first and second moment estimates */
    uint64_t t;    /* steps taken */
    double beta1, beta2, eps;
};

/* Allocates zeroed moments for n parameters.  Returns 0 or -1. */
int adam_init(struct adam *a, size_t n);
void adam_free(struct adam *a);

/* One Adam step that *descends* grad: theta -= lr_t * m / (sqrt(v) + eps)
 * with the bias-corrected rate lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t). */
void adam_step(struct adam *a, float *theta, const double *grad, double lr);

/* Turns the ES estimate (an ascent direction) into the gradient Adam
 * descends: -g + l2 * theta, the L2 term being the weight decay that keeps
 * parameters from drifting where returns do not care about them. */
void es_descent_grad(double *g, const float *theta, size_t n, double l2);

/* Running sums of observations, merged from every episode the workers
 * ran.  Starts from a small count and unit second moment, so the first
 * iteration normalises with mean 0 and std 1. */
struct obstat {
    int dim;
    double *sum, *sumsq, count;
};

int obstat_init(struct obstat *s, int dim);
void obstat_free(struct obstat *s);
void obstat_add(struct obstat *s, const double *sum, const double *sumsq,
                double count);
/* mean = sum / count; std = sqrt(max(sumsq / count - mean^2, 1e-2)): the
 * floor keeps a (nearly) constant input from being blown up. */
void obstat_get(const struct obstat *s, float *mean, float *std);

#endif
