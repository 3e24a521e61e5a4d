/*
 * main.c -- `population`: population-based training (PBT, Jaderberg et
 * al. 2017) of evolution-strategies learners, on a fiber_manager, fiber
 * queues and a fiber_pool (docs/examples/population.md).
 *
 * The master starts a manager, a pool and one fiber_process per learner
 * (learner.c).  The learners hold their own ES state and take their own
 * exploit/explore steps against the leaderboard in the manager; the master
 * runs every learner's episodes on the pool (a child cannot use a pool),
 * collects the "finished round r with score s" reports from its inbox,
 * prints one line per round, and ends the run through the manager's stop
 * event when a learner's policy reaches the target and passes a test on
 * new start states, or after the last round.
 *
 * Exit status: 0 when a learner reached the target, 1 when the rounds ran
 * out first or the run failed, 2 for a bad command line.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "noise.h"
#include "population.h"
#include "rollout.h"

#define NOISE_LOG2 20          /* 1M floats (4 MiB) in every process */
#define TEST_EPISODES 100      /* the winner's test on new start states */
#define POLL_MS 1000           /* inbox wait before checking the learners */
#define MASTER_BARRIER_MS 120000
#define JOIN_MS 30000
#define READY_DEFAULT 1        /* rounds before a learner may be replaced */

/* Per-environment defaults: the ES settings of one learner, and the
 * ranges its initial hyperparameters are drawn from (log-uniformly) and
 * explore keeps them in. */
struct pbt_defaults {
    const char *env;
    int pop, episodes, iters, rounds;
    double sigma_lo, sigma_hi, lr_lo, lr_hi;
};

static const struct pbt_defaults defaults[] = {
    {"pendulum", 32, 2, 10, 30, 0.01, 0.5, 0.002, 0.3},
    {"cartpole", 16, 1, 2, 30, 0.01, 1.0, 0.001, 0.1},
};

struct cli {
    const struct env_def *env;
    const struct pbt_defaults *def;
    int learners, rounds, iters, pop, workers, pbt, ready;
    long long seed;
    double target;
    int have_target;
};

struct master {
    struct cli c;
    int env_id;
    size_t nparams, rec_size, res_size;
    uint64_t eval_seed, noise_seed, noise_hash;
    fiber_manager *m;
    fiber_mobj *h[N_MOBJ];
    fiber_queue *inbox, *reply[POP_MAX_LEARNERS];
    fiber_pool *pool;
    fiber_process *proc[POP_MAX_LEARNERS];
    double init_sigma[POP_MAX_LEARNERS], init_lr[POP_MAX_LEARNERS];
    /* the batch of evaluation requests being served */
    fiber_buf in;
    unsigned char *out;
    size_t out_cap;
    uint16_t req_learner[POP_MAX_LEARNERS];
    uint32_t req_n[POP_MAX_LEARNERS];
    int nreq;
    fiber_buf deferred[POP_MAX_LEARNERS]; /* other messages met meanwhile */
    int ndeferred;
    /* the round being played */
    uint32_t round;
    struct round_report rep[POP_MAX_LEARNERS];
    int have[POP_MAX_LEARNERS], nrep;
    /* the outcome */
    int solved, stopping;
    uint32_t solved_round;
    unsigned winner;
    double test_mean, test_min;
    uint64_t episodes, maps;
    double map_seconds; /* inside fiber_pool_map */
    double t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A fiber call failed: says what it was doing and fiber's message. */
static int fail(const char *what)
{
    fprintf(stderr, "population: %s: %s\n", what, fiber_last_error());
    return -1;
}

/* Anything else failed. */
static int complain(const char *what)
{
    fprintf(stderr, "population: %s\n", what);
    return -1;
}

/* ---- the command line ------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: population [--learners K] [--rounds N] [--env pendulum|cartpole]\n"
        "                  [--seed S] [--iters I] [--pop P] [--workers W]\n"
        "                  [--target R] [--ready R] [--no-pbt] [--help]\n"
        "Population-based training of K evolution-strategies learners: each\n"
        "learner is a process; the leaderboard, the weights and the run's\n"
        "synchronisation live in a fiber_manager; every episode runs on a\n"
        "fiber_pool.  After each round of I ES iterations, a learner in the\n"
        "bottom 20%% copies the weights and hyperparameters of one in the top\n"
        "20%% if that one did significantly better on the same start states\n"
        "(exploit), then scales its sigma and lr by 0.8 or 1.2, or with\n"
        "probability 1/4 draws them afresh (explore).\n"
        "  --learners K   learners (2..%d; default 6)\n"
        "  --rounds N     rounds at most (default 30)\n"
        "  --env NAME     pendulum (default) or cartpole\n"
        "  --seed S       one seed for everything (default 1)\n"
        "  --iters I      ES iterations per round (pendulum 10, cartpole 2)\n"
        "  --pop P        mirrored pairs per iteration (pendulum 32, cartpole 16)\n"
        "  --workers W    pool workers (default: one per CPU)\n"
        "  --target R     a round's score (mean return over %d start states,\n"
        "                 the same for every learner) that ends the run, once\n"
        "                 %d new start states confirm it (pendulum -200,\n"
        "                 cartpole 500)\n"
        "  --ready R      rounds a learner trains, from its start or its last\n"
        "                 copy, before it may be replaced (default 1)\n"
        "  --no-pbt       no exploit/explore: K independent ES runs (to compare)\n"
        "Initial sigma and lr are drawn log-uniformly from: pendulum\n"
        "[0.01, 0.5] x [0.002, 0.3], cartpole [0.01, 1] x [0.001, 0.1].\n"
        "Exit status: 0 when the target is reached, 1 when not or on failure,\n"
        "2 for a bad command line.\n",
        POP_MAX_LEARNERS, POP_EVAL_EPISODES, TEST_EPISODES);
}

static int parse_ll(const char *flag, const char *text, long long lo,
                    long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "population: %s wants an integer in %lld..%lld, "
                "not '%s'\n", flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_int(const char *flag, const char *text, int lo, int hi,
                     int *out)
{
    long long v;
    if (parse_ll(flag, text, lo, hi, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_value(struct cli *c, const char *f, const char *v)
{
    if (strcmp(f, "--env") == 0) {
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            if (strcmp(v, defaults[i].env) == 0) {
                c->def = &defaults[i];
                c->env = es_env_find(v);
                return 0;
            }
        fprintf(stderr, "population: unknown environment '%s'; this example "
                "runs pendulum and cartpole\n", v);
        return -1;
    }
    if (strcmp(f, "--learners") == 0)
        return parse_int(f, v, 2, POP_MAX_LEARNERS, &c->learners);
    if (strcmp(f, "--rounds") == 0)
        return parse_int(f, v, 1, 100000, &c->rounds);
    if (strcmp(f, "--iters") == 0)
        return parse_int(f, v, 1, 100000, &c->iters);
    if (strcmp(f, "--pop") == 0)
        return parse_int(f, v, 2, 1 << 16, &c->pop);
    if (strcmp(f, "--ready") == 0)
        return parse_int(f, v, 1, 100000, &c->ready);
    if (strcmp(f, "--workers") == 0)
        return parse_int(f, v, 1, 1024, &c->workers);
    if (strcmp(f, "--seed") == 0)
        return parse_ll(f, v, 0, 1ll << 62, &c->seed);
    if (strcmp(f, "--target") == 0) {
        char *end;
        errno = 0;
        c->target = strtod(v, &end);
        c->have_target = 1;
        if (errno || end == v || *end || !isfinite(c->target)) {
            fprintf(stderr, "population: --target wants a number, not '%s'\n",
                    v);
            return -1;
        }
        return 0;
    }
    fprintf(stderr, "population: unknown option '%s' (try --help)\n", f);
    return -1;
}

/* Returns 0, 1 for --help, -1 for a bad command line. */
static int parse_args(int argc, char **argv, struct cli *c)
{
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0)
            return 1;
        if (strcmp(f, "--no-pbt") == 0) {
            c->pbt = 0;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "population: %s needs a value (try --help)\n", f);
            return -1;
        }
        if (parse_value(c, f, argv[++i]) != 0)
            return -1;
    }
    if (c->rounds < 0)
        c->rounds = c->def->rounds;
    if (c->iters < 0)
        c->iters = c->def->iters;
    if (c->pop < 0)
        c->pop = c->def->pop;
    if (!c->have_target)
        c->target = c->env->target;
    return 0;
}

/* ---- starting the run ------------------------------------------------------ */

static double log_uniform(uint64_t *rng, double lo, double hi)
{
    return lo * exp(es_uniform(rng) * log(hi / lo));
}

/* The manager and the objects of population.h. */
static int start_manager(struct master *M)
{
    fiber_job_opts jo = {.name = "pbt-manager"};
    if (fiber_manager_start(&M->m, &jo) != 0)
        return fail("starting the manager");
    int rc = fiber_manager_dict(M->m, "leaderboard", &M->h[H_BOARD]);
    if (rc == 0)
        rc = fiber_manager_dict(M->m, "weights", &M->h[H_WEIGHTS]);
    if (rc == 0)
        rc = fiber_manager_lock(M->m, "board", &M->h[H_LOCK]);
    if (rc == 0)
        rc = fiber_manager_value(M->m, "exploits", 0, &M->h[H_EXPLOITS]);
    if (rc == 0)
        rc = fiber_manager_event(M->m, "stop", &M->h[H_STOP]);
    if (rc == 0) /* the learners and the master */
        rc = fiber_manager_barrier(M->m, "round",
                                   (unsigned)M->c.learners + 1,
                                   &M->h[H_BARRIER]);
    if (rc == 0)
        rc = fiber_manager_queue(M->m, "inbox", 0, &M->inbox);
    for (int i = 0; rc == 0 && i < M->c.learners; i++) {
        char name[32];
        snprintf(name, sizeof name, "reply-L%d", i);
        rc = fiber_manager_queue(M->m, name, 0, &M->reply[i]);
    }
    return rc ? fail("opening the manager's objects") : 0;
}

/* The pool: the ES example's workers, which build the noise table in
 * their initializer. */
static int start_pool(struct master *M)
{
    struct es_init_arg ia = {M->noise_seed, NOISE_LOG2, 0, M->noise_hash};
    fiber_job_opts jo = {.name = "pbt-worker"};
    fiber_pool_opts po = {.workers = M->c.workers, .job = &jo,
                          .initializer = "es_init", .initarg = &ia,
                          .initarg_len = sizeof ia};
    return fiber_pool_create(&M->pool, &po) ? fail("starting the pool") : 0;
}

static int serialize_into(int rc, fiber_buf *b, unsigned char *dst,
                          uint32_t *len)
{
    if (rc == 0 && b->len > POP_HANDLE_MAX)
        rc = FIBER_ETOOBIG;
    if (rc == 0) {
        memcpy(dst, b->data, b->len);
        *len = (uint32_t)b->len;
    }
    b->len = 0;
    return rc;
}

static int start_learners(struct master *M)
{
    struct learner_arg *a = calloc(1, sizeof *a);
    fiber_buf b = {0};
    int rc = a ? 0 : FIBER_ENOMEM;
    for (int i = 0; rc == 0 && i < N_MOBJ; i++)
        rc = serialize_into(fiber_mobj_serialize(M->h[i], &b), &b,
                            a->mobj[i], &a->mobj_len[i]);
    if (rc == 0)
        rc = serialize_into(fiber_queue_serialize(M->inbox, &b), &b,
                            a->queue[Q_INBOX], &a->queue_len[Q_INBOX]);
    uint64_t rng = (uint64_t)M->c.seed ^ 0x706f70756c617465ull;
    for (int i = 0; rc == 0 && i < M->c.learners; i++) {
        rc = serialize_into(fiber_queue_serialize(M->reply[i], &b), &b,
                            a->queue[Q_REPLY], &a->queue_len[Q_REPLY]);
        if (rc)
            break;
        a->magic = POP_MAGIC;
        a->id = (uint32_t)i;
        a->learners = (uint32_t)M->c.learners;
        a->rounds = (uint32_t)M->c.rounds;
        a->iters = (uint32_t)M->c.iters;
        a->pop = (uint32_t)M->c.pop;
        a->episodes = (uint32_t)M->c.def->episodes;
        a->env_id = (uint32_t)M->env_id;
        a->hidden = (uint32_t)M->c.env->hidden;
        a->noise_log2 = NOISE_LOG2;
        a->pbt = (uint32_t)M->c.pbt;
        a->ready = (uint32_t)M->c.ready;
        a->seed = es_rand64(&rng);
        a->eval_seed = M->eval_seed;
        a->noise_seed = M->noise_seed;
        a->noise_hash = M->noise_hash;
        a->sigma = M->init_sigma[i] =
            log_uniform(&rng, M->c.def->sigma_lo, M->c.def->sigma_hi);
        a->lr = M->init_lr[i] =
            log_uniform(&rng, M->c.def->lr_lo, M->c.def->lr_hi);
        a->l2 = M->c.env->l2;
        a->sigma_lo = M->c.def->sigma_lo;
        a->sigma_hi = M->c.def->sigma_hi;
        a->lr_lo = M->c.def->lr_lo;
        a->lr_hi = M->c.def->lr_hi;
        char name[32];
        snprintf(name, sizeof name, "learner-L%d", i);
        fiber_job_opts jo = {.name = name};
        rc = fiber_process_start(&M->proc[i], "pbt_learner", a, sizeof *a,
                                 &jo);
    }
    if (rc)
        fail("starting the learners"); /* before another fiber call */
    fiber_buf_free(&b);
    free(a);
    return rc ? -1 : 0;
}

/* ---- serving evaluations ----------------------------------------------------- */

static int put_reply(struct master *M, unsigned learner, uint32_t n, int code,
                     const void *body, size_t len, fiber_buf *tmp)
{
    struct msg_hdr h = {POP_MAGIC, MSG_RESULTS, (uint16_t)learner, n, code};
    tmp->len = 0;
    int rc = fiber_buf_append(tmp, &h, sizeof h);
    if (rc == 0)
        rc = fiber_buf_append(tmp, body, len);
    if (rc == 0)
        rc = fiber_queue_put(M->reply[learner], tmp->data, tmp->len, -1);
    return rc ? fail("replying to a learner") : 0;
}

/* Adds an EVAL message's records to the batch. */
static int add_request(struct master *M, const struct msg_hdr *h,
                       const unsigned char *body, size_t len)
{
    if (len != (size_t)h->n * M->rec_size || M->nreq >= M->c.learners) {
        fprintf(stderr, "population: a malformed request from L%u\n",
                h->learner);
        return -1;
    }
    if (fiber_buf_append(&M->in, body, len) != 0)
        return complain("out of memory");
    M->req_learner[M->nreq] = h->learner;
    M->req_n[M->nreq] = h->n;
    M->nreq++;
    return 0;
}

/* The batch's map.  A learner's records all carry its policy and
 * observation statistics: those are put once per request (a shared
 * object), and the map's records are a header and that object's ref
 * (es_eval_ref), so each worker fetches a policy once however many of its
 * records it runs.  Returns 0 or the map's code. */
static int map_by_ref(struct master *M, size_t n)
{
    size_t rs = es_ref_record_size(), hs = sizeof(struct es_task);
    size_t blob = M->rec_size - hs;
    fiber_ref refs[POP_MAX_LEARNERS];
    unsigned char *recs = calloc(n ? n : 1, rs);
    int code = recs ? 0 : complain("out of memory"), nput = 0;
    size_t at = 0;
    for (int i = 0; code == 0 && i < M->nreq; i++) {
        const unsigned char *first = M->in.data + at * M->rec_size;
        /* es_task_pack's arrays, without the rounding padding. */
        size_t arrays = es_shared_size(M->nparams, M->c.env->obs_dim);
        code = arrays <= blob ? fiber_object_put(first + hs, arrays, &refs[i])
                              : FIBER_EINVAL;
        nput += code == 0;
        for (uint32_t k = 0; code == 0 && k < M->req_n[i]; k++, at++) {
            memcpy(recs + at * rs, M->in.data + at * M->rec_size, hs);
            memcpy(recs + at * rs + hs, &refs[i], sizeof refs[i]);
        }
    }
    if (code == 0)
        code = fiber_pool_map(M->pool, "es_eval_ref", recs, rs, n, M->out,
                              M->res_size, 0);
    /* (A release that succeeds leaves fiber_last_error() as the map set
     * it, for run_batch's message.) */
    for (int i = 0; i < nput; i++)
        fiber_object_release(&refs[i]);
    free(recs);
    return code;
}

/* One fiber_pool_map over every request of the batch, then a reply to
 * each learner with its share of the results. */
static int run_batch(struct master *M)
{
    size_t n = M->in.len / M->rec_size;
    if (n * M->res_size > M->out_cap) {
        unsigned char *p = realloc(M->out, n * M->res_size);
        if (!p)
            return complain("out of memory");
        M->out = p;
        M->out_cap = n * M->res_size;
    }
    double started = now_s();
    int code = map_by_ref(M, n);
    M->map_seconds += now_s() - started;
    /* Copied: the text is valid only until this thread's next fiber
     * call, and the replies below are fiber calls. */
    char why[512] = "";
    if (code) {
        snprintf(why, sizeof why, "%s", fiber_last_error());
        fprintf(stderr, "population: evaluating %zu records: %s\n", n, why);
    }
    fiber_buf tmp = {0};
    int rc = 0;
    size_t at = 0;
    for (int i = 0; rc == 0 && i < M->nreq; i++) {
        rc = code ? put_reply(M, M->req_learner[i], 0, code, why,
                              strlen(why), &tmp)
                  : put_reply(M, M->req_learner[i], M->req_n[i], 0,
                              M->out + at * M->res_size,
                              (size_t)M->req_n[i] * M->res_size, &tmp);
        at += M->req_n[i];
    }
    fiber_buf_free(&tmp);
    for (size_t i = 0; i < n; i++) { /* a pair runs 2 x its episodes */
        struct es_task t;
        memcpy(&t, M->in.data + i * M->rec_size, sizeof t);
        M->episodes += (t.kind == ES_KIND_PAIR ? 2u : 1u) *
                       (t.episodes ? t.episodes : 1u);
    }
    M->maps++;
    M->in.len = 0;
    M->nreq = 0;
    return code || rc ? -1 : 0;
}

/* ---- the rounds ------------------------------------------------------------ */

/* Tests learner w's weights, read back from the manager, on
 * TEST_EPISODES start states no learner was scored on. */
static int test_winner(struct master *M, unsigned w, struct snap_hdr *sh)
{
    struct es_state st;
    char key[16];
    fiber_buf b = {0};
    if (es_state_alloc(&st, M->c.env, M->c.env->hidden) != 0)
        return complain("out of memory");
    size_t kl = pop_key(key, sizeof key, w);
    int rc = fiber_dict_get(M->h[H_WEIGHTS], key, kl, &b, NULL);
    if (rc)
        rc = fail("reading the winner's weights");
    else if (pop_snap_unpack(&st, sh, b.data, b.len) != 0)
        rc = complain("the winner's weights in the manager are not a "
                      "snapshot of this policy");
    unsigned char *recs = calloc(TEST_EPISODES, M->rec_size);
    unsigned char *res = calloc(TEST_EPISODES, M->res_size);
    if (rc == 0 && (!recs || !res))
        rc = complain("out of memory");
    float mean[ES_MAX_OBS], std[ES_MAX_OBS];
    if (rc == 0) {
        obstat_get(&st.obs, mean, std);
        for (uint32_t k = 0; k < TEST_EPISODES; k++)
            pop_pack_eval(recs + k * M->rec_size, &st, M->env_id,
                          pop_eval_seed(M->eval_seed, 0, k), mean, std);
        if (fiber_pool_map(M->pool, "es_eval", recs, M->rec_size,
                           TEST_EPISODES, res, M->res_size, 0) != 0)
            rc = fail("testing the winner");
        M->episodes += TEST_EPISODES;
    }
    M->test_mean = 0;
    M->test_min = HUGE_VAL;
    for (uint32_t k = 0; rc == 0 && k < TEST_EPISODES; k++) {
        struct es_result r;
        es_result_unpack(res + k * M->res_size, st.shape.obs_dim, &r, NULL,
                         NULL);
        M->test_mean += r.ret[0] / TEST_EPISODES;
        M->test_min = fmin(M->test_min, r.ret[0]);
    }
    free(recs);
    free(res);
    fiber_buf_free(&b);
    es_state_free(&st);
    return rc;
}

static void print_round(struct master *M, double best, double mean)
{
    printf("round %3u  best %8.1f  mean %8.1f  %6.2f s  sigma/lr", M->round,
           best, mean, now_s() - M->t0);
    for (int i = 0; i < M->c.learners; i++)
        printf(" %5.3f/%5.3f%c", M->rep[i].sigma, M->rep[i].lr,
               M->rep[i].parent >= 0 ? '*' : ' ');
    printf("\n");
    fflush(stdout);
}

/* All the learners have reported the round: print it, decide whether the
 * run is over, and let the learners on through the barrier. */
static int end_round(struct master *M)
{
    double best = -HUGE_VAL, mean = 0;
    unsigned w = 0;
    for (int i = 0; i < M->c.learners; i++) {
        mean += M->rep[i].score / M->c.learners;
        if (M->rep[i].score > best) {
            best = M->rep[i].score;
            w = (unsigned)i;
        }
    }
    print_round(M, best, mean);
    if (best >= M->c.target) {
        struct snap_hdr sh;
        if (test_winner(M, w, &sh) != 0)
            return -1;
        if (M->test_mean >= M->c.target) {
            M->solved = 1;
            M->solved_round = M->round;
            M->winner = w;
        } else {
            printf("  L%u scored %.1f, but %d new start states average "
                   "%.1f: training on\n", w, best, TEST_EPISODES,
                   M->test_mean);
        }
    }
    M->stopping = M->solved || M->round >= (uint32_t)M->c.rounds;
    if (M->stopping && fiber_event_set(M->h[H_STOP], NULL) != 0)
        return fail("setting the stop event");
    /* Once past this wait every learner sees the stop event, or goes on
     * to its exploit/explore step... */
    if (fiber_barrier_wait(M->h[H_BARRIER], MASTER_BARRIER_MS, NULL, NULL))
        return fail("waiting at the round barrier");
    if (M->stopping)
        return 0;
    /* ... and past this one, every learner has done it. */
    if (fiber_barrier_wait(M->h[H_BARRIER], MASTER_BARRIER_MS, NULL, NULL))
        return fail("waiting at the round barrier (exploit)");
    M->round++;
    M->nrep = 0;
    memset(M->have, 0, sizeof M->have);
    return 0;
}

/* Handles one message of the inbox.  Returns 0, or -1 to abort. */
static int handle(struct master *M, const fiber_buf *msg)
{
    struct msg_hdr h;
    if (msg->len < sizeof h)
        return -1;
    memcpy(&h, msg->data, sizeof h);
    const unsigned char *body = msg->data + sizeof h;
    size_t len = msg->len - sizeof h;
    if (h.magic != POP_MAGIC || h.learner >= M->c.learners) {
        fprintf(stderr, "population: a stray message in the inbox\n");
        return -1;
    }
    if (h.kind == MSG_EVAL)
        return add_request(M, &h, body, len) == 0 ? run_batch(M) : -1;
    if (h.kind == MSG_FAIL) {
        fprintf(stderr, "population: learner L%u failed: %.*s\n", h.learner,
                (int)len, (const char *)body);
        return -1;
    }
    if (h.kind != MSG_ROUND || len != sizeof(struct round_report) ||
        h.n != M->round || M->have[h.learner]) {
        fprintf(stderr, "population: an unexpected report from L%u (round "
                "%u, expected %u)\n", h.learner, h.n, M->round);
        return -1;
    }
    memcpy(&M->rep[h.learner], body, sizeof M->rep[0]);
    M->have[h.learner] = 1;
    if (++M->nrep == M->c.learners)
        return end_round(M);
    return 0;
}

/* Takes every evaluation request already waiting, so that the learners'
 * requests share one map; other messages are kept for after it. */
static int drain(struct master *M, fiber_buf *tmp)
{
    while (M->nreq < M->c.learners && M->ndeferred < POP_MAX_LEARNERS) {
        tmp->len = 0;
        int rc = fiber_queue_get(M->inbox, tmp, 0);
        if (rc == FIBER_EAGAIN)
            return 0;
        if (rc)
            return fail("reading the inbox");
        struct msg_hdr h;
        if (tmp->len < sizeof h)
            return -1;
        memcpy(&h, tmp->data, sizeof h);
        if (h.magic == POP_MAGIC && h.kind == MSG_EVAL &&
            h.learner < M->c.learners) {
            if (add_request(M, &h, tmp->data + sizeof h,
                            tmp->len - sizeof h) != 0)
                return -1;
        } else {
            fiber_buf *d = &M->deferred[M->ndeferred++];
            d->len = 0;
            if (fiber_buf_append(d, tmp->data, tmp->len) != 0)
                return complain("out of memory");
        }
    }
    return 0;
}

/* A learner that ended before the run did has failed. */
static int check_learners(struct master *M)
{
    for (int i = 0; i < M->c.learners; i++)
        if (fiber_process_is_alive(M->proc[i]) == 0) {
            int code = -1;
            fiber_process_exitcode(M->proc[i], &code);
            fprintf(stderr, "population: learner L%d ended (exit code %d) "
                    "before the run did\n", i, code);
            return -1;
        }
    return 0;
}

/* The master's loop: serve and collect until the run is over. */
static int serve(struct master *M)
{
    fiber_buf msg = {0};
    int rc = 0;
    while (rc == 0 && !M->stopping) {
        msg.len = 0;
        int g = fiber_queue_get(M->inbox, &msg, POLL_MS);
        if (g == FIBER_ETIMEDOUT) {
            rc = check_learners(M);
            continue;
        }
        if (g) {
            rc = fail("reading the inbox");
            break;
        }
        struct msg_hdr h;
        if (msg.len >= sizeof h) {
            memcpy(&h, msg.data, sizeof h);
            if (h.magic == POP_MAGIC && h.kind == MSG_EVAL &&
                h.learner < M->c.learners) {
                /* Batch: this request and any others already waiting. */
                rc = add_request(M, &h, msg.data + sizeof h,
                                 msg.len - sizeof h);
                if (rc == 0)
                    rc = drain(M, &msg);
                if (rc == 0)
                    rc = run_batch(M);
                for (int i = 0; i < M->ndeferred; i++)
                    if (rc == 0 && !M->stopping)
                        rc = handle(M, &M->deferred[i]);
                M->ndeferred = 0;
                continue;
            }
        }
        rc = handle(M, &msg);
    }
    fiber_buf_free(&msg);
    return rc;
}

/* ---- the end ------------------------------------------------------------- */

/* Reads the leaderboard back from the manager and prints it. */
static int print_board(struct master *M)
{
    fiber_buf b = {0};
    int64_t exploits = 0;
    int rc = fiber_value_get(M->h[H_EXPLOITS], &exploits, NULL);
    printf("leaderboard, read back from the manager:\n");
    for (int i = 0; rc == 0 && i < M->c.learners; i++) {
        char key[16];
        struct board_entry e;
        size_t kl = pop_key(key, sizeof key, (unsigned)i);
        b.len = 0;
        rc = fiber_dict_get(M->h[H_BOARD], key, kl, &b, NULL);
        if (rc || b.len != sizeof e)
            break;
        memcpy(&e, b.data, sizeof e);
        printf("  L%d  round %3u  score %8.1f  sigma %5.3f  lr %5.3f  "
               "(started at %5.3f/%5.3f)", i, e.round, e.score, e.sigma, e.lr,
               M->init_sigma[i], M->init_lr[i]);
        if (e.exploits)
            printf("  copied %u time%s, last L%d after round %u", e.exploits,
                   e.exploits == 1 ? "" : "s", e.parent, e.copied_round);
        printf("\n");
    }
    struct best_entry best;
    b.len = 0;
    if (rc == 0)
        rc = fiber_dict_get(M->h[H_BOARD], "best", 4, &b, NULL);
    if (rc == 0 && b.len == sizeof best) {
        memcpy(&best, b.data, sizeof best);
        printf("best score of the run: %.1f, L%u in round %u (sigma %.3f, "
               "lr %.3f)\n", best.score, best.learner, best.round, best.sigma,
               best.lr);
    }
    if (rc == 0)
        printf("%lld exploit steps; %llu episodes in %llu pool maps for "
               "%d learners, %.2f s inside the maps\n", (long long)exploits,
               (unsigned long long)M->episodes, (unsigned long long)M->maps,
               M->c.learners, M->map_seconds);
    fiber_buf_free(&b);
    return rc ? fail("reading the leaderboard") : 0;
}

static int join_learners(struct master *M)
{
    int rc = 0;
    for (int i = 0; i < M->c.learners; i++) {
        int code = -1;
        if (fiber_process_join(M->proc[i], JOIN_MS) != 0 ||
            fiber_process_exitcode(M->proc[i], &code) != 0 || code != 0) {
            fprintf(stderr, "population: learner L%d exited with %d\n", i,
                    code);
            rc = -1;
        }
    }
    return rc;
}

/* After a failure: stop the learners without waiting for a round. */
static void abort_run(struct master *M)
{
    if (M->h[H_STOP])
        fiber_event_set(M->h[H_STOP], NULL);
    if (M->h[H_BARRIER])
        fiber_barrier_reset(M->h[H_BARRIER], NULL);
    for (int i = 0; i < M->c.learners; i++)
        if (M->proc[i])
            fiber_process_terminate(M->proc[i]);
}

static void cleanup(struct master *M)
{
    for (int i = 0; i < M->c.learners; i++)
        fiber_process_free(M->proc[i]);
    if (M->pool) {
        fiber_pool_close(M->pool);
        fiber_pool_join(M->pool, JOIN_MS);
        fiber_pool_free(M->pool);
    }
    for (int i = 0; i < POP_MAX_LEARNERS; i++) {
        fiber_queue_free(M->reply[i]);
        fiber_buf_free(&M->deferred[i]);
    }
    fiber_queue_free(M->inbox);
    for (int i = 0; i < N_MOBJ; i++)
        fiber_mobj_free(M->h[i]);
    fiber_manager_free(M->m);
    fiber_buf_free(&M->in);
    free(M->out);
}

static void print_plan(const struct master *M)
{
    const struct cli *c = &M->c;
    char backend[64] = "?";
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    fiber_config_get("backend", backend, sizeof backend);
    printf("population: %d ES learners on %s (%s)\n", c->learners,
           c->env->name, c->env->summary);
    printf("each: policy %d-%d-%d (%zu parameters), %d mirrored pairs x %d "
           "episode(s) per iteration, %d iterations per round; %s\n",
           c->env->obs_dim, c->env->hidden, c->env->act_dim, M->nparams,
           c->pop, c->def->episodes, c->iters,
           c->pbt ? "exploit/explore between rounds"
                  : "no exploit/explore (--no-pbt)");
    printf("score: mean return over the round's %d start states; target %g, "
           "confirmed on %d new ones; at most %d rounds\n",
           POP_EVAL_EPISODES, c->target, TEST_EPISODES, c->rounds);
    printf("pool: %d workers on the '%s' backend; manager: leaderboard, "
           "weights, lock, counter, event, barrier, %d queues\n",
           c->workers ? c->workers : (int)(cpus > 0 ? cpus : 1), backend,
           c->learners + 1);
    printf("sigma/lr below: what each learner L0..L%d trained with in the "
           "round; * = it started the round from a top learner's weights\n",
           c->learners - 1);
    fflush(stdout);
}

static int run(struct master *M)
{
    M->t0 = now_s();
    M->env_id = es_env_id(M->c.env);
    struct policy_shape shape = {M->c.env->obs_dim, M->c.env->hidden,
                                 M->c.env->act_dim};
    M->nparams = policy_nparams(&shape);
    M->rec_size = es_task_size(M->nparams, M->c.env->obs_dim);
    M->res_size = es_result_size(M->c.env->obs_dim);
    uint64_t s = (uint64_t)M->c.seed;
    M->noise_seed = es_rand64(&s);
    M->eval_seed = es_rand64(&s);
    /* The master only needs the table's hash, which the workers and the
     * learners check theirs against. */
    if (es_noise_init(M->noise_seed, NOISE_LOG2) != 0) {
        fprintf(stderr, "population: cannot build the noise table\n");
        return -1;
    }
    M->noise_hash = es_noise_table_hash();
    es_noise_free();
    M->round = 1;
    print_plan(M);
    int rc = start_manager(M);
    if (rc == 0)
        rc = start_pool(M);
    if (rc == 0)
        rc = start_learners(M);
    if (rc == 0)
        rc = serve(M);
    if (rc != 0) {
        abort_run(M);
        return -1;
    }
    rc = join_learners(M);
    double elapsed = now_s() - M->t0;
    if (M->solved)
        printf("solved in round %u after %.2f s: L%u's policy averages %.1f "
               "on %d new start states (lowest %.1f)\n", M->solved_round,
               elapsed, M->winner, M->test_mean, TEST_EPISODES, M->test_min);
    else
        printf("not solved: %d rounds ran out after %.2f s (target %g)\n",
               M->c.rounds, elapsed, M->c.target);
    if (print_board(M) != 0)
        rc = -1;
    return rc;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* children never return */
        fprintf(stderr, "population: fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    struct master *M = calloc(1, sizeof *M);
    if (!M) {
        fprintf(stderr, "population: out of memory\n");
        return 1;
    }
    M->c = (struct cli){.env = es_env_find("pendulum"), .def = &defaults[0],
                        .learners = 6, .rounds = -1, .iters = -1, .pop = -1,
                        .workers = 0, .pbt = 1, .ready = READY_DEFAULT,
                        .seed = 1};
    int rc = parse_args(argc, argv, &M->c);
    if (rc > 0)
        usage(stdout);
    if (rc < 0)
        fprintf(stderr, "usage: population [options]; 'population --help' "
                "lists them\n");
    if (rc != 0) {
        free(M);
        return rc > 0 ? 0 : 2;
    }
    rc = run(M);
    int solved = M->solved;
    cleanup(M);
    free(M);
    return rc == 0 && solved ? 0 : 1;
}
