/*
 * population.h -- what the master and the learner processes of the
 * population example share: the manager's objects, the messages on the
 * queues, the leaderboard's entries and the weight snapshots
 * (docs/examples/population.md).
 *
 * Processes:
 *   master      owns the pool and the manager; evaluates every learner's
 *               records on the pool (only the master may use a pool), prints
 *               one line per round, decides when to stop;
 *   learner i   a fiber_process holding one ES learner's state (weights,
 *               Adam, observation statistics, hyperparameters); it sends
 *               its records to the master and does its own ES update and
 *               its own exploit/explore against the leaderboard;
 *   manager     hosts the leaderboard, the weights, the lock, the exploit
 *               counter, the stop event, the round barrier and the queues;
 *   pool        workers running the ES example's es_eval task.
 */
#ifndef POPULATION_H
#define POPULATION_H

#include <stddef.h>
#include <stdint.h>

#include <fiber/fiber.h>

#include "train.h" /* struct es_state, and through it env.h, es.h */

#define POP_MAX_LEARNERS 16
#define POP_HANDLE_MAX 320    /* a serialised handle is tens of bytes */
#define POP_MAGIC 0x31504250u /* "PBP1": every message and record */
#define POP_EVAL_EPISODES 20  /* a round's score: mean over this many */

/* Objects on the manager that the learners open. */
enum {
    H_BOARD,    /* dict "leaderboard": "L<i>" -> struct board_entry, and
                   "best" -> struct best_entry */
    H_WEIGHTS,  /* dict "weights": "L<i>" -> a snapshot (below) */
    H_LOCK,     /* lock "board": held to read-modify-write "best" */
    H_EXPLOITS, /* value "exploits": exploit steps taken, all learners */
    H_STOP,     /* event "stop": set by the master to end the run */
    H_BARRIER,  /* barrier "round": the learners and the master */
    N_MOBJ
};

/* Queues on the manager: the master's inbox and the learner's replies. */
enum { Q_INBOX, Q_REPLY, N_QUEUES };

enum msg_kind {
    MSG_EVAL = 1, /* learner -> master: n es_task records to evaluate */
    MSG_RESULTS,  /* master -> learner: n es_result records, or an error */
    MSG_ROUND,    /* learner -> master: a struct round_report */
    MSG_FAIL,     /* learner -> master: why it is giving up (text) */
};

struct msg_hdr {
    uint32_t magic;
    uint16_t kind;
    uint16_t learner;
    uint32_t n;  /* MSG_EVAL, MSG_RESULTS: records; MSG_ROUND: the round */
    int32_t rc;  /* MSG_RESULTS: 0, or the map's failure (payload: text) */
};

/* "Learner i finished round r with score s". */
struct round_report {
    double score;        /* mean return over the round's evaluation */
    double sigma, lr;    /* the hyperparameters it trained with */
    int32_t parent;      /* whose weights it started the round from (an
                            exploit after the previous round), or -1 */
    uint32_t iterations; /* ES updates made so far */
    double pop_mean;     /* mean return of the last iteration's
                            perturbed policies */
};

/* The leaderboard's entry "L<i>".  A learner writes it after scoring a
 * round, and again after its exploit/explore step. */
struct board_entry {
    uint32_t round;        /* the round `score` belongs to */
    int32_t parent;        /* the learner it last copied, -1: never */
    uint32_t copied_round; /* after which round */
    uint32_t exploits;     /* how many times it copied another learner */
    double score;
    double sigma, lr;      /* what it trains with next */
    double returns[POP_EVAL_EPISODES]; /* the round's episodes, in the
                                          order of their start states */
};

/* The leaderboard's entry "best": the best score seen, kept by
 * read-modify-write under the lock. */
struct best_entry {
    uint32_t learner, round;
    double score, sigma, lr;
};

/* A learner's argument: its settings and the serialised handles. */
struct learner_arg {
    uint32_t magic;
    uint32_t id, learners, rounds, iters, pop, episodes;
    uint32_t env_id, hidden, noise_log2, pbt;
    uint32_t ready; /* rounds a learner trains before it may be replaced */
    uint64_t seed;      /* this learner's: policy, perturbations, explore */
    uint64_t eval_seed; /* the run's: every learner is scored on the same
                           start states in a round */
    uint64_t noise_seed, noise_hash;
    double sigma, lr, l2;
    double sigma_lo, sigma_hi, lr_lo, lr_hi; /* explore stays inside */
    uint32_t mobj_len[N_MOBJ];
    uint32_t queue_len[N_QUEUES];
    unsigned char mobj[N_MOBJ][POP_HANDLE_MAX];
    unsigned char queue[N_QUEUES][POP_HANDLE_MAX];
};

/* A weight snapshot ("weights" dict): this header, then float
 * theta[nparams], double adam_m[nparams], double adam_v[nparams], double
 * obs_sum[obs_dim], double obs_sumsq[obs_dim].  Everything an exploit
 * copies: the policy, its optimizer state and its input normalisation. */
struct snap_hdr {
    uint32_t magic, nparams, obs_dim, round;
    double score, sigma, lr;
    uint64_t adam_t;
    double obs_count;
};

/* Appends st's snapshot, with h's fields, to out.  Returns 0 or a
 * FIBER_E* code. */
int pop_snap_pack(const struct es_state *st, const struct snap_hdr *h,
                  fiber_buf *out);

/* Loads a snapshot into st (which has the same shape) and h.  Returns 0,
 * or -1 if data is not a snapshot of this shape. */
int pop_snap_unpack(struct es_state *st, struct snap_hdr *h,
                    const void *data, size_t len);

/* The start state of evaluation episode k of round r (round 0: the
 * master's final test): the same for every learner. */
uint64_t pop_eval_seed(uint64_t eval_seed, uint32_t round, uint32_t k);

/* Writes an es_eval record (es_task_size bytes) that runs st's policy,
 * unperturbed, for one episode from seed. */
void pop_pack_eval(void *rec, const struct es_state *st, int env_id,
                   uint64_t seed, const float *mean, const float *std);

/* "L<i>" into buf (at least 8 bytes); returns its length. */
size_t pop_key(char *buf, size_t size, unsigned learner);

#endif
