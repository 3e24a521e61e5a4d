/*
 * train.h -- the ES training loop on a fiber pool, its state, and the
 * checkpoints of that state.
 */
#ifndef ES_TRAIN_H
#define ES_TRAIN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "env.h"
#include "es.h"
#include "policy.h"

/* Everything a run needs to continue where it stopped: what a checkpoint
 * holds. */
struct es_state {
    const struct env_def *env;
    struct policy_shape shape;
    size_t nparams;
    float *theta;
    struct adam adam;
    struct obstat obs;
    uint64_t iteration;  /* iterations completed (updates applied) */
    uint64_t rng;        /* the master's generator: offsets and seeds */
    uint64_t noise_seed; /* the shared table's seed and size */
    unsigned noise_log2;
};

/* A fresh state: policy drawn from seed, Adam and statistics zeroed.
 * Returns 0 or -1 (out of memory). */
int es_state_init(struct es_state *st, const struct env_def *env, int hidden,
                  uint64_t seed, unsigned noise_log2);
/* Allocates a zeroed state of this shape (for loading into). */
int es_state_alloc(struct es_state *st, const struct env_def *env,
                   int hidden);
void es_state_free(struct es_state *st);

/* Checkpoints: a small versioned header, then the parameters, Adam's
 * moments and the observation statistics (format in checkpoint.c).
 * save writes path.tmp and renames it over path, so a crash never leaves
 * a half-written checkpoint behind.  load fills a state it allocates.
 * Both return 0, or -1 with a message in err. */
int es_checkpoint_save(const struct es_state *st, const char *path,
                       char *err, size_t errlen);
int es_checkpoint_load(struct es_state *st, const char *path, char *err,
                       size_t errlen);

/* What one iteration did and how long its parts took (for --log and for
 * bench-es). */
struct es_iter_info {
    uint64_t iteration;
    double mean, best, center; /* returns */
    double seconds;            /* the whole iteration, in the master */
    double map_seconds;        /* inside fiber_pool_map */
    double master_seconds;     /* the rest: packing records, ranks,
                                  gradient, Adam, statistics */
    double env_seconds;        /* the workers' time in episodes, summed */
    uint64_t episodes, steps;
};

struct es_opts {
    int workers;       /* 0: one per CPU */
    int pop;           /* antithetic pairs per iteration */
    int episodes;      /* episodes per perturbation (mean return) */
    int eval_episodes; /* episodes of the unperturbed policy per iteration */
    int iters;         /* stop after this many iterations in all */
    double sigma, lr, l2, target;
    const char *checkpoint; /* may be NULL */
    int checkpoint_every;   /* 0: only at the end */
    /* Held while the state changes (an update) and while it is saved,
     * so that a stop callback on another thread may save it too; may be
     * NULL. */
    pthread_mutex_t *state_mu;
    /* Stop between iterations once fiber_stop_requested() says so (the
     * run is then saved, and out->stopped set). */
    int stop_aware;
    const char *log;        /* may be NULL */
    int quiet;              /* no per-iteration lines */
    /* For benchmarks: another task over the same records (NULL:
     * "es_eval"), and a function called after every iteration. */
    const char *task;
    void (*on_iter)(void *ud, const struct es_iter_info *info);
    void *on_iter_ud;
};

struct es_outcome {
    int solved;
    int stopped;        /* a stop was requested: ended between iterations */
    double center;      /* the last center return */
    double best_center; /* the best center return seen */
    double seconds;
    uint64_t episodes, steps;
    int test_episodes;          /* after a solve: fresh start states */
    double test_mean, test_min; /* and the returns there */
};

/* Trains st until the target or opts->iters iterations.  Returns 0 (see
 * out->solved) or -1 after printing what failed. */
int es_train(const struct es_opts *o, struct es_state *st,
             struct es_outcome *out);

#endif
