/*
 * common.c -- snapshots, evaluation seeds and records, shared by the
 * master and the learners (see population.h).
 */
#include <stdio.h>
#include <string.h>

#include "noise.h"
#include "population.h"
#include "rollout.h"

int pop_snap_pack(const struct es_state *st, const struct snap_hdr *h,
                  fiber_buf *out)
{
    size_t n = st->nparams, d = (size_t)st->shape.obs_dim;
    struct snap_hdr hh = *h;
    hh.magic = POP_MAGIC;
    hh.nparams = (uint32_t)n;
    hh.obs_dim = (uint32_t)d;
    hh.adam_t = st->adam.t;
    hh.obs_count = st->obs.count;
    int rc = fiber_buf_reserve(out, sizeof hh + n * sizeof(float) +
                                        (2 * n + 2 * d) * sizeof(double));
    if (rc == 0)
        rc = fiber_buf_append(out, &hh, sizeof hh);
    if (rc == 0)
        rc = fiber_buf_append(out, st->theta, n * sizeof(float));
    if (rc == 0)
        rc = fiber_buf_append(out, st->adam.m, n * sizeof(double));
    if (rc == 0)
        rc = fiber_buf_append(out, st->adam.v, n * sizeof(double));
    if (rc == 0)
        rc = fiber_buf_append(out, st->obs.sum, d * sizeof(double));
    if (rc == 0)
        rc = fiber_buf_append(out, st->obs.sumsq, d * sizeof(double));
    return rc;
}

int pop_snap_unpack(struct es_state *st, struct snap_hdr *h,
                    const void *data, size_t len)
{
    size_t n = st->nparams, d = (size_t)st->shape.obs_dim;
    if (len != sizeof *h + n * sizeof(float) +
                   (2 * n + 2 * d) * sizeof(double))
        return -1;
    const unsigned char *p = data;
    memcpy(h, p, sizeof *h);
    if (h->magic != POP_MAGIC || h->nparams != n || h->obs_dim != d)
        return -1;
    p += sizeof *h;
    memcpy(st->theta, p, n * sizeof(float));
    p += n * sizeof(float);
    memcpy(st->adam.m, p, n * sizeof(double));
    p += n * sizeof(double);
    memcpy(st->adam.v, p, n * sizeof(double));
    p += n * sizeof(double);
    memcpy(st->obs.sum, p, d * sizeof(double));
    p += d * sizeof(double);
    memcpy(st->obs.sumsq, p, d * sizeof(double));
    st->adam.t = h->adam_t;
    st->obs.count = h->obs_count;
    return 0;
}

uint64_t pop_eval_seed(uint64_t eval_seed, uint32_t round, uint32_t k)
{
    uint64_t s = eval_seed ^ ((uint64_t)round << 32 | k);
    es_rand64(&s); /* one step decorrelates neighbouring (round, k) */
    return es_rand64(&s);
}

void pop_pack_eval(void *rec, const struct es_state *st, int env_id,
                   uint64_t seed, const float *mean, const float *std)
{
    struct es_task t = {ES_TASK_MAGIC, (uint16_t)env_id, ES_KIND_EVAL,
                        (uint32_t)st->nparams, (uint32_t)st->shape.obs_dim,
                        (uint32_t)st->shape.hidden, 0, 0.0f, 1, seed};
    es_task_pack(rec, &t, st->theta, mean, std);
}

size_t pop_key(char *buf, size_t size, unsigned learner)
{
    int n = snprintf(buf, size, "L%u", learner);
    return n > 0 ? (size_t)n : 0;
}
