/*
 * learner.c -- one ES learner of the population, run as a fiber_process
 * (the task pbt_learner).
 *
 * Each round it makes `iters` ES updates (Salimans et al. 2017, with the
 * ES example's pieces: noise table, records, centered ranks, gradient
 * estimate, Adam), scores its policy on the round's evaluation episodes,
 * files its score and weights in the manager, reports to the master, and
 * waits at the round barrier.  Then, unless the master has set the stop
 * event, it takes its exploit/explore step: if its score is in the bottom
 * 20% of the leaderboard and a learner drawn from the top 20% did
 * significantly better on the same start states, it copies that learner's
 * weights and hyperparameters (exploit) and multiplies each
 * hyperparameter by 0.8 or 1.2, or now and then draws it afresh
 * (explore).  A second wait at the barrier keeps every learner from
 * overwriting its weights before the others have copied what they chose.
 *
 * A learner cannot use a pool (only the master can), so its episodes go
 * to the master as one queue message per batch of records, and come back
 * on its own reply queue.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "noise.h"
#include "population.h"
#include "rollout.h"

#define REPLY_TIMEOUT_MS 300000   /* the master evaluates our records */
#define BARRIER_TIMEOUT_MS 600000 /* the slowest learner's round */

struct learner {
    struct learner_arg a;
    const struct env_def *env;
    fiber_mobj *h[N_MOBJ];
    fiber_queue *q[N_QUEUES];
    struct es_state st;
    double sigma, lr;
    int32_t parent;        /* whose weights this round started from */
    uint32_t trained;      /* rounds since it started or last copied */
    struct board_entry entry;
    uint64_t hrng;         /* explore's own generator */
    size_t rec_size, res_size;
    const float *noise;
    size_t noise_n;
    fiber_buf msg, reply, tmp;
    uint32_t *offsets;
    double *returns, *ranks, *weights, *grad;
    size_t *idx;
    float mean[ES_MAX_OBS], std[ES_MAX_OBS];
    double pop_mean;
    char err[512];
};

/* Records the first failure's message, for a fiber call that has just
 * failed with rc; returns -1. */
static int fail(struct learner *L, const char *what, int rc)
{
    if (!L->err[0])
        snprintf(L->err, sizeof L->err, "%s: %s (%s)", what,
                 fiber_last_error(), fiber_errname(rc));
    return -1;
}

/* The same for any other failure. */
static int fail_text(struct learner *L, const char *what)
{
    if (!L->err[0])
        snprintf(L->err, sizeof L->err, "%s", what);
    return -1;
}

/* ---- talking to the master ------------------------------------------- */

/* Empties L->msg and makes room for the header and n records after it;
 * returns where the records go. */
static unsigned char *msg_begin(struct learner *L, size_t n)
{
    size_t len = sizeof(struct msg_hdr) + n * L->rec_size;
    L->msg.len = 0;
    if (fiber_buf_reserve(&L->msg, len) != 0)
        return NULL;
    memset(L->msg.data, 0, len);
    L->msg.len = len;
    return L->msg.data + sizeof(struct msg_hdr);
}

static int send_msg(struct learner *L, uint16_t kind, uint32_t n)
{
    struct msg_hdr h = {POP_MAGIC, kind, (uint16_t)L->a.id, n, 0};
    memcpy(L->msg.data, &h, sizeof h);
    int rc = fiber_queue_put(L->q[Q_INBOX], L->msg.data, L->msg.len, -1);
    return rc ? fail(L, "sending to the master", rc) : 0;
}

/* Sends the n records in L->msg to the master and waits for their
 * results: *res points at n es_result records in L->reply. */
static int evaluate(struct learner *L, uint32_t n, const unsigned char **res)
{
    if (send_msg(L, MSG_EVAL, n) != 0)
        return -1;
    L->reply.len = 0;
    int rc = fiber_queue_get(L->q[Q_REPLY], &L->reply, REPLY_TIMEOUT_MS);
    if (rc)
        return fail(L, "waiting for results", rc);
    struct msg_hdr h;
    if (L->reply.len < sizeof h)
        return fail_text(L, "a short reply from the master");
    memcpy(&h, L->reply.data, sizeof h);
    size_t body = L->reply.len - sizeof h;
    if (h.magic != POP_MAGIC || h.kind != MSG_RESULTS) {
        snprintf(L->err, sizeof L->err, "unexpected reply (kind %u)",
                 h.kind);
        return -1;
    }
    if (h.rc != 0) {
        snprintf(L->err, sizeof L->err, "the master could not evaluate "
                 "our records: %.*s", (int)body,
                 (const char *)L->reply.data + sizeof h);
        return -1;
    }
    if (h.n != n || body != n * L->res_size) {
        snprintf(L->err, sizeof L->err, "reply of %zu bytes for %u "
                 "records", body, n);
        return -1;
    }
    *res = L->reply.data + sizeof h;
    return 0;
}

/* ---- ES ---------------------------------------------------------------- */

/* One ES update with the current sigma and lr, as train.c does it. */
static int es_iteration(struct learner *L)
{
    struct es_state *st = &L->st;
    size_t pop = L->a.pop, d = (size_t)st->shape.obs_dim;
    obstat_get(&st->obs, L->mean, L->std);
    unsigned char *recs = msg_begin(L, pop);
    if (!recs)
        return fail_text(L, "out of memory");
    struct es_task t = {ES_TASK_MAGIC, (uint16_t)L->a.env_id, ES_KIND_PAIR,
                        (uint32_t)st->nparams, (uint32_t)d,
                        (uint32_t)st->shape.hidden, 0, (float)L->sigma,
                        L->a.episodes, 0};
    uint64_t span = L->noise_n - st->nparams + 1;
    for (size_t i = 0; i < pop; i++) {
        t.noise_offset = L->offsets[i] =
            (uint32_t)(es_rand64(&st->rng) % span);
        t.seed = es_rand64(&st->rng);
        es_task_pack(recs + i * L->rec_size, &t, st->theta, L->mean, L->std);
    }
    const unsigned char *res;
    if (evaluate(L, (uint32_t)pop, &res) != 0)
        return -1;
    double sum[ES_MAX_OBS], sumsq[ES_MAX_OBS];
    double tsum[ES_MAX_OBS] = {0}, tsumsq[ES_MAX_OBS] = {0};
    double count = 0, total = 0;
    for (size_t i = 0; i < pop; i++) {
        struct es_result r;
        es_result_unpack(res + i * L->res_size, (int)d, &r, sum, sumsq);
        for (size_t k = 0; k < d; k++) {
            tsum[k] += sum[k];
            tsumsq[k] += sumsq[k];
        }
        count += r.obs_count;
        L->returns[2 * i] = r.ret[0];
        L->returns[2 * i + 1] = r.ret[1];
        total += r.ret[0] + r.ret[1];
    }
    L->pop_mean = total / (2.0 * (double)pop);
    es_centered_ranks(L->returns, 2 * pop, L->ranks, L->idx);
    for (size_t i = 0; i < pop; i++)
        L->weights[i] = L->ranks[2 * i] - L->ranks[2 * i + 1];
    es_gradient(L->weights, L->offsets, pop, L->noise, st->nparams, L->grad);
    es_descent_grad(L->grad, st->theta, st->nparams, L->a.l2);
    adam_step(&st->adam, st->theta, L->grad, L->lr);
    obstat_add(&st->obs, tsum, tsumsq, count);
    st->iteration++;
    return 0;
}

/* The round's score: the unperturbed policy's mean return over the
 * round's POP_EVAL_EPISODES start states, the same for every learner. */
static int score_round(struct learner *L, uint32_t round, double *score)
{
    struct es_state *st = &L->st;
    obstat_get(&st->obs, L->mean, L->std);
    unsigned char *recs = msg_begin(L, POP_EVAL_EPISODES);
    if (!recs)
        return fail_text(L, "out of memory");
    for (uint32_t k = 0; k < POP_EVAL_EPISODES; k++)
        pop_pack_eval(recs + k * L->rec_size, st, (int)L->a.env_id,
                      pop_eval_seed(L->a.eval_seed, round, k), L->mean,
                      L->std);
    const unsigned char *res;
    if (evaluate(L, POP_EVAL_EPISODES, &res) != 0)
        return -1;
    double total = 0;
    for (uint32_t k = 0; k < POP_EVAL_EPISODES; k++) {
        struct es_result r;
        es_result_unpack(res + k * L->res_size, st->shape.obs_dim, &r, NULL,
                         NULL);
        L->entry.returns[k] = r.ret[0];
        total += r.ret[0];
    }
    *score = total / POP_EVAL_EPISODES;
    return 0;
}

/* ---- the manager --------------------------------------------------------- */

static int put_entry(struct learner *L)
{
    char key[16];
    size_t kl = pop_key(key, sizeof key, L->a.id);
    int rc = fiber_dict_set(L->h[H_BOARD], key, kl, &L->entry,
                            sizeof L->entry, NULL);
    return rc ? fail(L, "writing the leaderboard", rc) : 0;
}

/* Files the round's score and weights, and the best score if it is one. */
static int post(struct learner *L, uint32_t round, double score)
{
    char key[16];
    size_t kl = pop_key(key, sizeof key, L->a.id);
    struct snap_hdr sh = {.round = round, .score = score, .sigma = L->sigma,
                          .lr = L->lr};
    L->tmp.len = 0;
    int rc = pop_snap_pack(&L->st, &sh, &L->tmp);
    if (rc == 0) /* the weights first: the entry says they are there */
        rc = fiber_dict_set(L->h[H_WEIGHTS], key, kl, L->tmp.data,
                            L->tmp.len, NULL);
    if (rc)
        return fail(L, "writing our weights", rc);
    L->entry.round = round;
    L->entry.score = score;
    L->entry.sigma = L->sigma;
    L->entry.lr = L->lr;
    if (put_entry(L) != 0)
        return -1;
    /* "best" is a read-modify-write of one key by every learner: without
     * the lock, two learners could both read the old best and the lower
     * score could be written last. */
    rc = fiber_lock_acquire(L->h[H_LOCK], BARRIER_TIMEOUT_MS, NULL);
    if (rc)
        return fail(L, "taking the leaderboard's lock", rc);
    struct best_entry best;
    L->tmp.len = 0;
    rc = fiber_dict_get(L->h[H_BOARD], "best", 4, &L->tmp, NULL);
    int better = rc == FIBER_ENOKEY;
    if (rc == 0 && L->tmp.len == sizeof best) {
        memcpy(&best, L->tmp.data, sizeof best);
        /* Ties go to the earlier round, then the lower index, so that
         * the outcome does not depend on who took the lock first. */
        better = score > best.score ||
                 (score == best.score &&
                  (round < best.round ||
                   (round == best.round && L->a.id < best.learner)));
    }
    if (rc == FIBER_ENOKEY)
        rc = 0;
    if (rc == 0 && better) {
        best = (struct best_entry){L->a.id, round, score, L->sigma, L->lr};
        rc = fiber_dict_set(L->h[H_BOARD], "best", 4, &best, sizeof best,
                            NULL);
    }
    int rrc = fiber_lock_release(L->h[H_LOCK], NULL);
    if (rc || rrc)
        return fail(L, "updating the best score", rc ? rc : rrc);
    return 0;
}

static int report(struct learner *L, uint32_t round, double score)
{
    struct round_report r = {score, L->sigma, L->lr, L->parent,
                             (uint32_t)L->st.iteration, L->pop_mean};
    size_t len = sizeof(struct msg_hdr) + sizeof r;
    L->msg.len = 0;
    if (fiber_buf_reserve(&L->msg, len) != 0)
        return fail_text(L, "out of memory");
    memcpy(L->msg.data + sizeof(struct msg_hdr), &r, sizeof r);
    L->msg.len = len;
    return send_msg(L, MSG_ROUND, round);
}

/* Waits at the round barrier.  Returns 1 when the run is over (the stop
 * event is set), 0 to go on, -1 on failure.  The master resets the
 * barrier when it aborts, which ends the wait with FIBER_ESTATE. */
static int barrier(struct learner *L)
{
    int rc = fiber_barrier_wait(L->h[H_BARRIER], BARRIER_TIMEOUT_MS, NULL,
                                NULL);
    char why[256] = ""; /* before the next fiber call replaces it */
    if (rc)
        snprintf(why, sizeof why, "%s", fiber_last_error());
    int stop = 0;
    int src = fiber_event_is_set(L->h[H_STOP], &stop, NULL);
    if (src)
        return fail(L, "reading the stop event", src);
    if (stop)
        return 1;
    if (rc && !L->err[0])
        snprintf(L->err, sizeof L->err, "waiting at the round barrier: %s "
                 "(%s)", why, fiber_errname(rc));
    return rc ? -1 : 0;
}

/* Orders learner indices by score, best first (ties: lower index). */
static const struct board_entry *rank_board;

static int by_score(const void *a, const void *b)
{
    unsigned i = *(const unsigned *)a, j = *(const unsigned *)b;
    double x = rank_board[i].score, y = rank_board[j].score;
    if (x != y)
        return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* Explore: usually scale by 0.8 or 1.2; with probability RESAMPLE draw
 * afresh from the initial range instead, which keeps the population from
 * collapsing onto one value (as Ray Tune's PBT does). */
#define RESAMPLE 0.25

static double explore(struct learner *L, double v, double lo, double hi)
{
    if (es_uniform(&L->hrng) < RESAMPLE)
        return lo * exp(es_uniform(&L->hrng) * log(hi / lo));
    v *= es_uniform(&L->hrng) < 0.5 ? 0.8 : 1.2;
    return v < lo ? lo : v > hi ? hi : v;
}

/* Is learner a's policy better than b's?  A paired t-test on the round's
 * evaluation episodes: both ran from the same start states, so the
 * differences of their returns carry little of the start states' own
 * spread.  Exploiting only a significant difference keeps early rounds,
 * where every score is mostly noise, from collapsing the population onto
 * whichever learners were lucky (the PBT paper's "t-test selection"). */
#define T_CRITICAL 1.729 /* one-sided 5% for 19 degrees of freedom */

static int significantly_better(const struct board_entry *a,
                                const struct board_entry *b)
{
    double d[POP_EVAL_EPISODES], mean = 0, var = 0;
    const int n = POP_EVAL_EPISODES;
    for (int k = 0; k < n; k++) {
        d[k] = a->returns[k] - b->returns[k];
        mean += d[k] / n;
    }
    for (int k = 0; k < n; k++)
        var += (d[k] - mean) * (d[k] - mean) / (n - 1);
    if (var == 0)
        return mean > 0;
    return mean / sqrt(var / n) > T_CRITICAL;
}

/* Exploit and explore: runs between rounds, after the barrier, so every
 * entry holds the same round.  Returns 0 or -1; L->parent is the learner
 * copied, or -1. */
static int exploit_explore(struct learner *L, uint32_t round)
{
    unsigned k = L->a.learners, order[POP_MAX_LEARNERS];
    struct board_entry board[POP_MAX_LEARNERS];
    L->parent = -1;
    for (unsigned i = 0; i < k; i++) {
        char key[16];
        size_t kl = pop_key(key, sizeof key, i);
        L->tmp.len = 0;
        int rc = fiber_dict_get(L->h[H_BOARD], key, kl, &L->tmp, NULL);
        if (rc)
            return fail(L, "reading the leaderboard", rc);
        if (L->tmp.len != sizeof board[i])
            return fail_text(L, "a leaderboard entry of the wrong size");
        memcpy(&board[i], L->tmp.data, sizeof board[i]);
        if (board[i].round != round) {
            snprintf(L->err, sizeof L->err, "leaderboard entry L%u is of "
                     "round %u, not %u", i, board[i].round, round);
            return -1;
        }
        order[i] = i;
    }
    rank_board = board;
    qsort(order, k, sizeof order[0], by_score);
    rank_board = NULL;
    /* Truncation selection: the bottom 20% copy the top 20%. */
    unsigned q = (k + 2) / 5, pos = 0;
    if (q < 1)
        q = 1;
    while (order[pos] != L->a.id)
        pos++;
    if (pos < k - q || L->trained < L->a.ready)
        return 0; /* not in the bottom 20%, or not ready: keep training */
    unsigned src = order[es_rand64(&L->hrng) % q];
    if (!significantly_better(&board[src], &board[L->a.id]))
        return 0;
    char key[16];
    size_t kl = pop_key(key, sizeof key, src);
    L->tmp.len = 0;
    int rc = fiber_dict_get(L->h[H_WEIGHTS], key, kl, &L->tmp, NULL);
    if (rc)
        return fail(L, "reading a top learner's weights", rc);
    struct snap_hdr sh;
    if (pop_snap_unpack(&L->st, &sh, L->tmp.data, L->tmp.len) != 0 ||
        sh.round != round) {
        snprintf(L->err, sizeof L->err, "L%u's weights are not a snapshot "
                 "of round %u", src, round);
        return -1;
    }
    L->sigma = explore(L, sh.sigma, L->a.sigma_lo, L->a.sigma_hi);
    L->lr = explore(L, sh.lr, L->a.lr_lo, L->a.lr_hi);
    L->parent = (int32_t)src;
    L->trained = 0;
    L->entry.parent = (int32_t)src;
    L->entry.copied_round = round;
    L->entry.exploits++;
    L->entry.sigma = L->sigma;
    L->entry.lr = L->lr;
    rc = fiber_value_add(L->h[H_EXPLOITS], 1, NULL, NULL);
    if (rc)
        return fail(L, "counting the exploit", rc);
    return put_entry(L);
}

/* ---- the task ------------------------------------------------------------- */

static int setup(struct learner *L)
{
    const struct learner_arg *a = &L->a;
    for (int i = 0; i < N_MOBJ; i++) {
        int rc = fiber_mobj_open(&L->h[i], a->mobj[i], a->mobj_len[i]);
        if (rc)
            return fail(L, "opening the manager's objects", rc);
    }
    for (int i = 0; i < N_QUEUES; i++) {
        int rc = fiber_queue_open(&L->q[i], a->queue[i], a->queue_len[i]);
        if (rc)
            return fail(L, "opening the queues", rc);
    }
    L->env = es_env_get((int)a->env_id);
    if (!L->env)
        return fail_text(L, "unknown environment");
    /* The learner needs the table to turn offsets back into a gradient;
     * the pool's workers build the same one in es_init. */
    if (es_noise_init(a->noise_seed, a->noise_log2) != 0 ||
        es_noise_table_hash() != a->noise_hash) {
        snprintf(L->err, sizeof L->err, "cannot build the master's noise "
                 "table (2^%u floats)", a->noise_log2);
        return -1;
    }
    L->noise = es_noise_table(&L->noise_n);
    if (es_state_init(&L->st, L->env, (int)a->hidden, a->seed,
                      a->noise_log2) != 0)
        return fail_text(L, "out of memory");
    L->st.noise_seed = a->noise_seed; /* the shared table, not our own */
    L->hrng = a->seed ^ 0x6578706c6f726521ull; /* "explore!" */
    L->sigma = a->sigma;
    L->lr = a->lr;
    L->parent = -1;
    L->entry = (struct board_entry){0, -1, 0, 0, 0, a->sigma, a->lr};
    L->rec_size = es_task_size(L->st.nparams, L->env->obs_dim);
    L->res_size = es_result_size(L->env->obs_dim);
    size_t pop = a->pop;
    L->offsets = calloc(pop, sizeof *L->offsets);
    L->returns = calloc(2 * pop, sizeof *L->returns);
    L->ranks = calloc(2 * pop, sizeof *L->ranks);
    L->idx = calloc(2 * pop, sizeof *L->idx);
    L->weights = calloc(pop, sizeof *L->weights);
    L->grad = calloc(L->st.nparams, sizeof *L->grad);
    if (!L->offsets || !L->returns || !L->ranks || !L->idx || !L->weights ||
        !L->grad)
        return fail_text(L, "out of memory");
    return 0;
}

static void teardown(struct learner *L)
{
    for (int i = 0; i < N_MOBJ; i++)
        fiber_mobj_free(L->h[i]);
    for (int i = 0; i < N_QUEUES; i++)
        fiber_queue_free(L->q[i]);
    es_state_free(&L->st);
    es_noise_free();
    fiber_buf_free(&L->msg);
    fiber_buf_free(&L->reply);
    fiber_buf_free(&L->tmp);
    free(L->offsets);
    free(L->returns);
    free(L->ranks);
    free(L->idx);
    free(L->weights);
    free(L->grad);
}

/* The rounds.  Returns 0 when the master ended the run, -1 on failure. */
static int run(struct learner *L)
{
    for (uint32_t round = 1; round <= L->a.rounds; round++) {
        for (uint32_t i = 0; i < L->a.iters; i++)
            if (es_iteration(L) != 0)
                return -1;
        double score;
        if (score_round(L, round, &score) != 0 || post(L, round, score) != 0 ||
            report(L, round, score) != 0)
            return -1;
        L->trained++;
        int rc = barrier(L); /* every learner has posted round `round` */
        if (rc != 0)
            return rc > 0 ? 0 : -1;
        L->parent = -1;
        if (L->a.pbt && exploit_explore(L, round) != 0)
            return -1;
        rc = barrier(L); /* every learner has copied what it chose */
        if (rc != 0)
            return rc > 0 ? 0 : -1;
    }
    return 0; /* not reached: the master stops the run after the last round */
}

FIBER_TASK(pbt_learner)
{
    struct learner *L = calloc(1, sizeof *L);
    if (!L)
        return fiber_task_fail("out of memory");
    if (len != sizeof L->a) {
        free(L);
        return fiber_task_fail("pbt_learner wants a struct learner_arg");
    }
    memcpy(&L->a, arg, sizeof L->a);
    int rc = L->a.magic == POP_MAGIC && L->a.learners <= POP_MAX_LEARNERS
                 ? 0
                 : -1;
    if (rc)
        snprintf(L->err, sizeof L->err, "not a learner's argument");
    if (rc == 0)
        rc = setup(L);
    if (rc == 0)
        rc = run(L);
    if (rc != 0 && L->q[Q_INBOX]) {
        /* Tell the master at once, rather than let it notice our exit. */
        size_t n = strlen(L->err);
        if (fiber_buf_reserve(&L->msg, sizeof(struct msg_hdr) + n) == 0) {
            memcpy(L->msg.data + sizeof(struct msg_hdr), L->err, n);
            L->msg.len = sizeof(struct msg_hdr) + n;
            send_msg(L, MSG_FAIL, (uint32_t)n);
        }
    }
    if (rc != 0)
        fiber_task_fail("learner L%u: %s", L->a.id, L->err);
    teardown(L);
    free(L);
    return rc ? FIBER_ETASK : 0;
}
