/*
 * rollout.h -- what travels between the ES master and its workers, and
 * the evaluation the workers run.
 *
 * One fiber_pool_map per iteration runs the task "es_eval" over records
 * of one size (fixed for a run: it depends on the policy's size):
 *
 *   input   struct es_task, then float theta[nparams],
 *           float obs_mean[obs_dim], float obs_std[obs_dim]
 *   output  struct es_result, then double obs_sum[obs_dim],
 *           double obs_sumsq[obs_dim]
 *
 * A perturbation is only its offset into the shared noise table; the
 * worker rebuilds theta +- sigma * eps from its own copy of the table.
 * Each worker builds that copy once, in the pool initializer "es_init".
 */
#ifndef ES_ROLLOUT_H
#define ES_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>

#define ES_TASK_MAGIC 0x31545345u /* "EST1": catches mismatched records */
#define ES_MAX_OBS 64
#define ES_MAX_HIDDEN 256
#define ES_MAX_ACT 32

enum es_kind {
    ES_KIND_PAIR = 1, /* evaluate theta + sigma*eps and theta - sigma*eps */
    ES_KIND_EVAL = 2, /* evaluate theta itself (the "center" policy) */
};

struct es_task {
    uint32_t magic;
    uint16_t env_id;
    uint16_t kind;
    uint32_t nparams, obs_dim, hidden;
    uint32_t noise_offset; /* eps = noise[noise_offset .. + nparams) */
    float sigma;
    uint32_t episodes;     /* a perturbation's return is the mean over
                              this many episodes (0 counts as 1) */
    uint64_t seed;         /* initial state; both mirrors share it */
};

struct es_result {
    double ret[2];      /* returns of +eps and -eps; eval: ret[0] */
    uint32_t steps[2];  /* environment steps taken */
    uint64_t env_ns;    /* time spent running the episodes */
    double obs_count;   /* observations summed below */
};

/* The pool initializer's argument. */
struct es_init_arg {
    uint64_t noise_seed;
    uint32_t noise_log2;
    uint32_t reserved;
    uint64_t noise_hash; /* the master's table hash, to check against */
};

/* Record sizes, rounded up to 8 bytes so that every record of a map
 * starts aligned. */
size_t es_task_size(size_t nparams, int obs_dim);
size_t es_result_size(int obs_dim);

/* The shared form (fiber_pool_shared): a record is only its header
 * (es_task_head_size bytes) and the iteration's arrays -- theta, then
 * the observation mean and std -- are one shared object of
 * es_shared_size bytes, put once per iteration instead of once per
 * record.  The es_eval_shared task reads them with fiber_task_shared. */
size_t es_task_head_size(void);
size_t es_shared_size(size_t nparams, int obs_dim);
void es_shared_pack(void *blob, size_t nparams, int obs_dim,
                    const float *theta, const float *mean, const float *std);

/* The ref form: a header, then the fiber_ref of a shared object holding
 * the arrays (es_shared_size bytes); es_eval_ref resolves it.  For maps
 * whose records carry different policies (examples/population). */
size_t es_ref_record_size(void);

/* Writes a record's header and arrays into rec (es_task_size bytes). */
void es_task_pack(void *rec, const struct es_task *t, const float *theta,
                  const float *mean, const float *std);

/* Reads a result's header and, if sum/sumsq are not NULL, its arrays. */
void es_result_unpack(const void *res, int obs_dim, struct es_result *r,
                      double *sum, double *sumsq);

/* Runs the episodes a record asks for and writes the result (res_len ==
 * es_result_size).  This is the body of the es_eval task, callable in any
 * process that has built the noise table.  Returns 0, or -1 with err set. */
int es_evaluate(const void *rec, size_t len, void *res, size_t res_len,
                char *err, size_t errlen);

#endif
