/*
 * es.c -- fitness shaping, gradient estimate, Adam, observation
 * statistics (see es.h).
 */
#include "es.h"

#include <math.h>
#include <stdlib.h>

#define OBSTAT_EPS 1e-2
#define STD_FLOOR_VAR 1e-2

/* qsort has no context argument; the ranking is single-threaded, so the
 * array being ranked can live here during the sort. */
static const double *rank_keys;

static int cmp_index(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    double x = rank_keys[i], y = rank_keys[j];
    if (x != y)
        return x < y ? -1 : 1;
    return (i > j) - (i < j); /* ties by index: a stable order */
}

void es_centered_ranks(const double *x, size_t n, double *out, size_t *idx)
{
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    rank_keys = x;
    qsort(idx, n, sizeof *idx, cmp_index);
    rank_keys = NULL;
    /* Equal returns share the mean of their ranks: a mirrored pair that
     * scored the same (both 500 on cart-pole, say) then weighs exactly
     * zero instead of pushing along its noise by its index order. */
    for (size_t lo = 0, hi; lo < n; lo = hi) {
        for (hi = lo + 1; hi < n && x[idx[hi]] == x[idx[lo]]; hi++)
            ;
        double r = (double)(lo + hi - 1) / 2.0;
        for (size_t k = lo; k < hi; k++)
            out[idx[k]] = r / (double)(n - 1) - 0.5;
    }
}

void es_gradient(const double *w, const uint32_t *offsets, size_t npairs,
                 const float *noise, size_t nparams, double *g)
{
    for (size_t j = 0; j < nparams; j++)
        g[j] = 0;
    /* Pair by pair, so each noise slice is read once, sequentially. */
    for (size_t i = 0; i < npairs; i++) {
        const float *eps = noise + offsets[i];
        double wi = w[i];
        for (size_t j = 0; j < nparams; j++)
            g[j] += wi * eps[j];
    }
    double k = 1.0 / (2.0 * (double)npairs);
    for (size_t j = 0; j < nparams; j++)
        g[j] *= k;
}

int adam_init(struct adam *a, size_t n)
{
    a->n = n;
    a->m = calloc(n ? n : 1, sizeof *a->m);
    a->v = calloc(n ? n : 1, sizeof *a->v);
    a->t = 0;
    a->beta1 = 0.9;
    a->beta2 = 0.999;
    a->eps = 1e-8;
    if (!a->m || !a->v) {
        adam_free(a);
        return -1;
    }
    return 0;
}

void adam_free(struct adam *a)
{
    free(a->m);
    free(a->v);
    a->m = a->v = NULL;
}

void adam_step(struct adam *a, float *theta, const double *grad, double lr)
{
    a->t++;
    double t = (double)a->t;
    double lr_t = lr * sqrt(1 - pow(a->beta2, t)) / (1 - pow(a->beta1, t));
    for (size_t j = 0; j < a->n; j++) {
        a->m[j] = a->beta1 * a->m[j] + (1 - a->beta1) * grad[j];
        a->v[j] = a->beta2 * a->v[j] + (1 - a->beta2) * grad[j] * grad[j];
        theta[j] -= (float)(lr_t * a->m[j] / (sqrt(a->v[j]) + a->eps));
    }
}

void es_descent_grad(double *g, const float *theta, size_t n, double l2)
{
    for (size_t j = 0; j < n; j++)
        g[j] = -g[j] + l2 * theta[j];
}

int obstat_init(struct obstat *s, int dim)
{
    s->dim = dim;
    s->sum = calloc((size_t)dim, sizeof *s->sum);
    s->sumsq = calloc((size_t)dim, sizeof *s->sumsq);
    if (!s->sum || !s->sumsq) {
        obstat_free(s);
        return -1;
    }
    for (int i = 0; i < dim; i++)
        s->sumsq[i] = OBSTAT_EPS;
    s->count = OBSTAT_EPS;
    return 0;
}

void obstat_free(struct obstat *s)
{
    free(s->sum);
    free(s->sumsq);
    s->sum = s->sumsq = NULL;
}

void obstat_add(struct obstat *s, const double *sum, const double *sumsq,
                double count)
{
    for (int i = 0; i < s->dim; i++) {
        s->sum[i] += sum[i];
        s->sumsq[i] += sumsq[i];
    }
    s->count += count;
}

void obstat_get(const struct obstat *s, float *mean, float *std)
{
    for (int i = 0; i < s->dim; i++) {
        double m = s->sum[i] / s->count;
        double var = s->sumsq[i] / s->count - m * m;
        mean[i] = (float)m;
        std[i] = (float)sqrt(var > STD_FLOOR_VAR ? var : STD_FLOOR_VAR);
    }
}
