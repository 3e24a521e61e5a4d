/*
 * policy.c -- the MLP policy (see policy.h).
 */
#include "policy.h"

#include <math.h>

#include "noise.h"

#define OBS_CLIP 5.0f

size_t policy_nparams(const struct policy_shape *s)
{
    size_t d = (size_t)s->obs_dim, h = (size_t)s->hidden,
           a = (size_t)s->act_dim;
    return h * d + h + a * h + a;
}

/* Fills `rows` rows of `cols` normal values, each scaled to norm `norm`. */
static void normc_rows(float *w, int rows, int cols, double norm,
                       uint64_t *rng)
{
    for (int r = 0; r < rows; r++) {
        float *row = w + (size_t)r * (size_t)cols;
        double ss = 0;
        for (int c = 0; c < cols; c++) {
            double v = es_normal(rng);
            row[c] = (float)v;
            ss += v * v;
        }
        double k = norm / sqrt(ss > 0 ? ss : 1);
        for (int c = 0; c < cols; c++)
            row[c] = (float)(row[c] * k);
    }
}

void policy_init(float *theta, const struct policy_shape *s, uint64_t *rng)
{
    int d = s->obs_dim, h = s->hidden, a = s->act_dim;
    float *w1 = theta, *b1 = w1 + h * d, *w2 = b1 + h, *b2 = w2 + a * h;
    normc_rows(w1, h, d, 1.0, rng);
    normc_rows(w2, a, h, 0.01, rng);
    for (int i = 0; i < h; i++)
        b1[i] = 0;
    for (int i = 0; i < a; i++)
        b2[i] = 0;
}

void policy_normalize(const float *obs, const float *mean, const float *std,
                      int n, float *out)
{
    for (int i = 0; i < n; i++) {
        float v = (obs[i] - mean[i]) / std[i];
        out[i] = v > OBS_CLIP ? OBS_CLIP : v < -OBS_CLIP ? -OBS_CLIP : v;
    }
}

void policy_forward(const float *theta, const struct policy_shape *s,
                    const float *x, float *hbuf, float *y)
{
    int d = s->obs_dim, h = s->hidden, a = s->act_dim;
    const float *w1 = theta, *b1 = w1 + h * d, *w2 = b1 + h, *b2 = w2 + a * h;
    for (int j = 0; j < h; j++) {
        const float *row = w1 + j * d;
        float acc = b1[j];
        for (int i = 0; i < d; i++)
            acc += row[i] * x[i];
        hbuf[j] = tanhf(acc);
    }
    for (int k = 0; k < a; k++) {
        const float *row = w2 + k * h;
        float acc = b2[k];
        for (int j = 0; j < h; j++)
            acc += row[j] * hbuf[j];
        y[k] = acc;
    }
}
