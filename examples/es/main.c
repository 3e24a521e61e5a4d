/*
 * main.c -- `es`: evolution strategies (Salimans et al. 2017) on a fiber
 * pool.  The command line, then es_train (train.c).  docs/examples/es.md
 * explains the method and the code.
 *
 * Exit status: 0 when the unperturbed policy reached the target (or the
 * self-test passed), 1 when the iterations ran out first or a run failed,
 * 2 for a bad command line, 3 when the cluster asked the run to stop
 * (fiber_on_stop_requested) and its checkpoint was saved.
 *
 * Stop and resume.  With --checkpoint FILE the run saves after every
 * iteration (--checkpoint-every, 1 by default; write then rename), and on
 * a stop request (SIGTERM, or Slurm's SIGUSR1 before the time limit) its
 * stop callback saves the last completed iteration at once; the loop then
 * ends between iterations.  A restarted run (fiber_resumed() > 0, as
 * `fiber run --requeue` sets it) or one given --resume without a file
 * continues from FILE when it exists.  A run is a function of --seed and
 * the iteration, so the resumed run ends exactly as an uninterrupted one.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "env.h"
#include "train.h"

#define DEFAULT_SEED 1
#define DEFAULT_NOISE_LOG2 22 /* 4M floats, 16 MiB per process */
#define DEFAULT_EVAL 5
#define DEFAULT_CKPT_EVERY 1
#define EXIT_STOPPED 3

int es_selftest(void); /* selftest.c */

struct cli {
    const struct env_def *env;
    struct es_opts o;
    long long seed;
    int hidden, noise_log2, selftest, have_target, have_env;
    const char *resume;
    int resume_own; /* --resume without a file: --checkpoint's, if any */
    /* --after-resumes R:M: --iters is ignored until the run has been
     * resumed R times; the R-th (or a later) resume then ends M iterations
     * after the iteration it resumed from.  0:0 when not given. */
    int after_resumes, after_iters;
};

/* What the stop callback saves: the state es_train updates, under mu. */
static struct {
    pthread_mutex_t mu;
    struct es_state *st;
    const char *path;
    uint64_t saved_iteration;
    int saved;
} stop_ctx = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* On fiber's stop thread: saves the last completed iteration now, so the
 * checkpoint is there even if the cluster's SIGKILL comes before the
 * current iteration ends. */
static void save_on_stop(void *user, int sig)
{
    (void)user;
    char err[512];
    pthread_mutex_lock(&stop_ctx.mu);
    if (stop_ctx.st) {
        if (es_checkpoint_save(stop_ctx.st, stop_ctx.path, err,
                               sizeof err) == 0) {
            stop_ctx.saved = 1;
            stop_ctx.saved_iteration = stop_ctx.st->iteration;
            fprintf(stderr, "es: stop requested (signal %d): saved "
                    "iteration %llu to %s\n", sig,
                    (unsigned long long)stop_ctx.st->iteration,
                    stop_ctx.path);
        } else {
            fprintf(stderr, "es: stop requested (signal %d): %s\n", sig,
                    err);
        }
    }
    pthread_mutex_unlock(&stop_ctx.mu);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: es [--env cartpole|pendulum|humanoid] [--workers N] "
        "[--pop PAIRS]\n"
        "          [--sigma S] [--lr L] [--iters N] [--seed S] "
        "[--target R]\n"
        "          [--checkpoint FILE] [--checkpoint-every K] "
        "[--resume [FILE]]\n"
        "          [--after-resumes R:M] [--log FILE] [--selftest] "
        "[--help]\n"
        "Evolution strategies (Salimans et al. 2017) on a fiber pool: "
        "mirrored\nperturbations from a shared noise table, centered "
        "ranks, Adam with L2\nweight decay, an MLP policy with observation "
        "normalisation.\n"
        "  --env NAME           cartpole (default), pendulum, humanoid\n"
        "  --workers N          pool workers (default: one per CPU)\n"
        "  --pop PAIRS          antithetic pairs per iteration\n"
        "  --episodes K         episodes per perturbation (mean return)\n"
        "  --sigma S, --lr L    noise scale and Adam step size\n"
        "  --l2 C               weight decay\n"
        "  --iters N            give up after N iterations (exit 1)\n"
        "  --seed S             one seed for everything (default 1)\n"
        "  --target R           solved once the unperturbed policy's mean\n"
        "                       return over --eval episodes reaches R\n"
        "  --eval N             evaluation episodes per iteration (5)\n"
        "  --hidden H           hidden units of the policy\n"
        "  --noise-log2 K       noise table of 2^K floats (22)\n"
        "  --checkpoint FILE    save the run there every K iterations, "
        "at the end\n"
        "                       and when the cluster asks it to stop "
        "(exit 3)\n"
        "  --checkpoint-every K (default 1)\n"
        "  --after-resumes R:M  ignore --iters until the run has been "
        "resumed R\n"
        "                       times, then end M iterations after the "
        "resumed one\n"
        "                       (how the requeue tests end at the same "
        "point on a\n"
        "                       fast and a slow machine)\n"
        "  --resume FILE        continue a saved run\n"
        "  --resume             continue from --checkpoint's FILE if it "
        "exists\n"
        "                       (so does a restarted run: FIBER_RESUMED)"
        "\n"
        "  --log FILE           rows of 'iteration mean best center "
        "elapsed'\n"
        "  --selftest           check the pieces and exit\n"
        "Defaults per environment (pop/episodes/sigma/lr/l2/iters/target):"
        "\n");
    for (int i = 0; es_env_get(i); i++) {
        const struct env_def *e = es_env_get(i);
        fprintf(f, "  %-9s %d/%d/%g/%g/%g/%d/%g\n            %s\n", e->name,
                e->pop, e->episodes, e->sigma, e->lr, e->l2, e->iters,
                e->target, e->summary);
    }
    fprintf(f, "The backend comes from the configuration (FIBER_BACKEND or "
            ".fiberconfig).\n");
}

static int parse_ll(const char *flag, const char *text, long long lo,
                    long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "es: %s wants an integer in %lld..%lld, not '%s'\n",
                flag, lo, hi, text);
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

static int parse_double(const char *flag, const char *text, double lo,
                        double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "es: %s wants a number in [%g, %g], not '%s'\n",
                flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* --after-resumes R:M, R >= 1 and M >= 0. */
static int parse_after_resumes(const char *v, struct cli *c)
{
    int r, m, used = 0;
    if (sscanf(v, "%d:%d%n", &r, &m, &used) != 2 || v[used] != '\0' ||
        r < 1 || r > 1000 || m < 0 || m > (1 << 30)) {
        fprintf(stderr, "es: --after-resumes wants R:M with R in 1..1000 "
                "and M >= 0, not '%s'\n", v);
        return -1;
    }
    c->after_resumes = r;
    c->after_iters = m;
    return 0;
}

/* Parses one option with a value.  Returns 0, or -1 for a bad value or
 * an unknown option. */
static int parse_value(struct cli *c, const char *f, const char *v)
{
    struct es_opts *o = &c->o;
    if (strcmp(f, "--env") == 0) {
        c->env = es_env_find(v);
        c->have_env = 1;
        if (!c->env)
            fprintf(stderr, "es: unknown environment '%s'; known: %s\n", v,
                    es_env_names());
        return c->env ? 0 : -1;
    }
    if (strcmp(f, "--workers") == 0)
        return parse_int(f, v, 1, 4096, &o->workers);
    if (strcmp(f, "--pop") == 0)
        return parse_int(f, v, 1, 1 << 20, &o->pop);
    if (strcmp(f, "--episodes") == 0)
        return parse_int(f, v, 1, 1000, &o->episodes);
    if (strcmp(f, "--sigma") == 0)
        return parse_double(f, v, 1e-9, 1e3, &o->sigma);
    if (strcmp(f, "--lr") == 0)
        return parse_double(f, v, 0, 1e3, &o->lr);
    if (strcmp(f, "--l2") == 0)
        return parse_double(f, v, 0, 1e3, &o->l2);
    if (strcmp(f, "--iters") == 0)
        return parse_int(f, v, 0, 1 << 30, &o->iters);
    if (strcmp(f, "--seed") == 0)
        return parse_ll(f, v, 0, (1ll << 62), &c->seed);
    if (strcmp(f, "--target") == 0) {
        c->have_target = 1;
        return parse_double(f, v, -1e300, 1e300, &o->target);
    }
    if (strcmp(f, "--eval") == 0)
        return parse_int(f, v, 0, 1 << 16, &o->eval_episodes);
    if (strcmp(f, "--hidden") == 0)
        return parse_int(f, v, 1, 256, &c->hidden);
    if (strcmp(f, "--noise-log2") == 0)
        return parse_int(f, v, 10, 28, &c->noise_log2);
    if (strcmp(f, "--checkpoint-every") == 0)
        return parse_int(f, v, 1, 1 << 30, &o->checkpoint_every);
    if (strcmp(f, "--after-resumes") == 0)
        return parse_after_resumes(v, c);
    if (strcmp(f, "--checkpoint") == 0)
        o->checkpoint = v;
    else if (strcmp(f, "--resume") == 0)
        c->resume = v;
    else if (strcmp(f, "--log") == 0)
        o->log = v;
    else {
        fprintf(stderr, "es: unknown option '%s' (try --help)\n", f);
        return -1;
    }
    return 0;
}

/* Returns 0, 1 for --help, or -1 for a bad command line. */
static int parse_args(int argc, char **argv, struct cli *c)
{
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0)
            return 1;
        if (strcmp(f, "--selftest") == 0) {
            c->selftest = 1;
            continue;
        }
        if (strcmp(f, "--resume") == 0 &&
            (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            c->resume_own = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "es: %s needs a value (try --help)\n", f);
            return -1;
        }
        if (parse_value(c, f, argv[++i]) != 0)
            return -1;
    }
    return 0;
}

/* Fills what the command line left unset from the environment's
 * defaults.  Negative means "not given" for the numeric options. */
static void apply_defaults(struct cli *c)
{
    const struct env_def *e = c->env;
    struct es_opts *o = &c->o;
    if (o->pop < 0)
        o->pop = e->pop;
    if (o->episodes < 0)
        o->episodes = e->episodes;
    if (o->sigma < 0)
        o->sigma = e->sigma;
    if (o->lr < 0)
        o->lr = e->lr;
    if (o->l2 < 0)
        o->l2 = e->l2;
    if (o->iters < 0)
        o->iters = e->iters;
    if (o->eval_episodes < 0)
        o->eval_episodes = DEFAULT_EVAL;
    if (!c->have_target)
        o->target = e->target;
    if (o->checkpoint_every < 0)
        o->checkpoint_every = DEFAULT_CKPT_EVERY;
    if (c->hidden < 0)
        c->hidden = e->hidden;
}

/* A fresh state, or the one in --resume (which must fit the options). */
static int make_state(struct cli *c, struct es_state *st)
{
    char err[512];
    const char *own = c->o.checkpoint;
    if (!c->resume && own && (c->resume_own || fiber_resumed() > 0)) {
        if (access(own, F_OK) == 0)
            c->resume = own;
        else
            printf("no checkpoint at %s yet: starting afresh\n", own);
    }
    if (!c->resume) {
        apply_defaults(c);
        if (es_state_init(st, c->env, c->hidden, (uint64_t)c->seed,
                          (unsigned)c->noise_log2) == 0)
            return 0;
        fprintf(stderr, "es: out of memory\n");
        return -1;
    }
    if (es_checkpoint_load(st, c->resume, err, sizeof err) != 0) {
        fprintf(stderr, "es: %s\n", err);
        return -1;
    }
    if (c->have_env && st->env != c->env) {
        fprintf(stderr, "es: %s holds a %s run, not %s\n", c->resume,
                st->env->name, c->env->name);
        es_state_free(st);
        return -1;
    }
    /* The checkpoint fixes the environment and the policy's shape; the
     * hyperparameters come from this command line. */
    c->env = st->env;
    c->hidden = st->shape.hidden;
    apply_defaults(c);
    printf("resumed %s from %s after iteration %llu\n", st->env->name,
           c->resume, (unsigned long long)st->iteration);
    return 0;
}

/* --after-resumes: no bound before the R-th resume, then M iterations
 * past the resumed one.  A run that resumed without a checkpoint (none
 * saved yet) counts from 0. */
static void apply_after_resumes(struct cli *c, const struct es_state *st)
{
    if (c->after_resumes <= 0)
        return;
    if (fiber_resumed() < c->after_resumes) {
        c->o.iters = 1 << 30;
        return;
    }
    uint64_t end = st->iteration + (uint64_t)c->after_iters;
    c->o.iters = end > (1u << 30) ? 1 << 30 : (int)end;
    printf("resume %d of %d: ending after iteration %d\n", fiber_resumed(),
           c->after_resumes, c->o.iters);
}

static int workers_shown(int w)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return w > 0 ? w : n > 0 ? (int)n : 1;
}

static void print_plan(const struct cli *c, const struct es_state *st)
{
    const struct es_opts *o = &c->o;
    char backend[64] = "?";
    fiber_config_get("backend", backend, sizeof backend);
    printf("es: %s (%s)\n", st->env->name, st->env->summary);
    printf("policy %d-%d-%d (%zu parameters); %d workers on the '%s' "
           "backend\n%d mirrored pairs x %d episode(s) + %d evaluation "
           "episodes per iteration; sigma %g, lr %g, l2 %g; target %g\n",
           st->shape.obs_dim, st->shape.hidden, st->shape.act_dim,
           st->nparams, workers_shown(o->workers), backend, o->pop,
           o->episodes, o->eval_episodes, o->sigma, o->lr, o->l2, o->target);
}

static int train(struct cli *c)
{
    struct es_state st;
    char err[512];
    if (make_state(c, &st) != 0)
        return 1;
    apply_after_resumes(c, &st);
    if (!es_env_context(es_env_id(st.env), err, sizeof err)) {
        fprintf(stderr, "es: %s\n", err);
        es_state_free(&st);
        return 1;
    }
    print_plan(c, &st);
    fflush(stdout);
    if (c->o.checkpoint) {
        pthread_mutex_lock(&stop_ctx.mu);
        stop_ctx.st = &st;
        stop_ctx.path = c->o.checkpoint;
        pthread_mutex_unlock(&stop_ctx.mu);
        c->o.state_mu = &stop_ctx.mu;
        c->o.stop_aware = 1;
        if (fiber_on_stop_requested(save_on_stop, NULL) != 0) {
            fprintf(stderr, "es: %s\n", fiber_last_error());
            es_state_free(&st);
            return 1;
        }
    }
    struct es_outcome out;
    int rc = es_train(&c->o, &st, &out);
    pthread_mutex_lock(&stop_ctx.mu);
    stop_ctx.st = NULL; /* a late stop callback saves nothing */
    pthread_mutex_unlock(&stop_ctx.mu);
    uint64_t it = st.iteration + (out.solved ? 1 : 0);
    if (rc == 0 && out.stopped) {
        printf("stopped by signal %d after iteration %llu, %.2f s; "
               "checkpoint %s (continue with --resume, or as a restarted "
               "run)\n", fiber_stop_requested(),
               (unsigned long long)st.iteration, out.seconds,
               c->o.checkpoint);
        es_state_free(&st);
        return EXIT_STOPPED;
    }
    if (rc == 0 && out.solved) {
        printf("solved: return %g at iteration %llu after %.2f s\n",
               out.center, (unsigned long long)it, out.seconds);
        printf("test: %d new start states, mean return %g, lowest %g\n",
               out.test_episodes, out.test_mean, out.test_min);
    }
    else if (rc == 0)
        printf("not solved: the unperturbed policy's best mean return was "
               "%g (target %g) after %llu iterations, %.2f s\n",
               out.best_center, c->o.target, (unsigned long long)it,
               out.seconds);
    if (rc == 0)
        printf("%llu episodes, %llu environment steps, %.0f episodes/s "
               "overall\n", (unsigned long long)out.episodes,
               (unsigned long long)out.steps,
               (double)out.episodes / out.seconds);
    es_state_free(&st);
    return rc == 0 && out.solved ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* children never return */
        fprintf(stderr, "es: fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    struct cli c;
    memset(&c, 0, sizeof c);
    c.env = &es_env_cartpole;
    c.seed = DEFAULT_SEED;
    c.noise_log2 = DEFAULT_NOISE_LOG2;
    c.hidden = -1;
    /* Negative: not given, filled from the environment's defaults. */
    c.o = (struct es_opts){.workers = 0, .pop = -1, .episodes = -1,
                           .eval_episodes = -1,
                           .iters = -1, .sigma = -1, .lr = -1, .l2 = -1,
                           .checkpoint_every = -1};
    int rc = parse_args(argc, argv, &c);
    if (rc > 0)
        usage(stdout);
    if (rc < 0)
        fprintf(stderr, "usage: es [options]; 'es --help' lists them\n");
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (c.selftest)
        return es_selftest();
    if (c.after_resumes > 0 && !c.o.checkpoint) {
        fprintf(stderr, "es: --after-resumes needs --checkpoint (a run "
                "resumes from it)\n");
        return 2;
    }
    return train(&c);
}
