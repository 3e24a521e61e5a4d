/*
 * test_slurm_limits.c -- Slurm time limits: a pool whose worker jobs have
 * a 1-minute limit replaces each worker ahead of it and loses nothing
 * (fiber.h, "Time limits"), on the cluster scripts/slurm-local.sh runs on
 * this host (through tests/slurm/run.sh; skipped without it, a failure
 * under CI).  Its own program: the map takes about three minutes, more
 * than test_slurm's cases may.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/slurm/slurm.h"
#include "base/common.h"
#include "harness.h"

#define TASK_MS 2500

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sleeps TASK_MS, then returns its argument squared and the Slurm job
 * that ran it. */
struct answer {
    int32_t square;
    char job[28];
};

FIBER_TASK(slow_square_where)
{
    int32_t x;
    if (len != sizeof x)
        return fiber_task_fail("slow_square_where wants 4 bytes");
    memcpy(&x, arg, sizeof x);
    sleep_ms(TASK_MS);
    struct answer a = {.square = x * x};
    const char *id = getenv("SLURM_JOB_ID");
    snprintf(a.job, sizeof a.job, "%s", id ? id : "?");
    return fiber_buf_append(out, &a, sizeof a);
}

static void need_cluster(void)
{
    const char *b = getenv("FIBER_BACKEND");
    if (!b || strcmp(b, "slurm") != 0 || !getenv("SLURM_CONF"))
        TH_SKIP_ENGINE("no Slurm cluster (run through tests/slurm/run.sh)");
}

TEST(parse_durations)
{
    struct {
        const char *text;
        int rc;
        long long s;
    } cases[] = {
        {"5", 1, 300},           {"0:59", 1, 59},
        {"1:00", 1, 60},         {"1:02:03", 1, 3723},
        {"2-0", 1, 172800},      {"2-03", 1, 183600},
        {"1-02:03", 1, 93780},   {"1-02:03:04", 1, 93784},
        {"0:59 Resources", 1, 59}, {"UNLIMITED", 0, 0},
        {"INFINITE", 0, 0},      {"NOT_SET", 0, 0},
        {"INVALID", 0, 0},       {"", -1, 0},
        {"a:b", -1, 0},          {"1:", -1, 0},
        {"1:2:3:4", -1, 0},      {"-5", -1, 0},
        {"1-", -1, 0},           {"1--2", -1, 0},
        {"99999999999", -1, 0},
    };
    for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
        long long s = -7;
        int rc = fb_slurm_parse_duration(cases[i].text, &s);
        if (rc != cases[i].rc || (rc == 1 && s != cases[i].s))
            TH_FAIL("'%s': rc %d, %lld s; want %d, %lld s", cases[i].text,
                    rc, s, cases[i].rc, cases[i].s);
    }
}

/* Workers with a 1-minute limit, a map of about three minutes: each
 * worker is drained and replaced before Slurm ends it, so no task is
 * retried, no worker is lost, every result is right, and more jobs than
 * workers ran the map. */
TEST(workers_with_a_one_minute_limit_run_a_three_minute_map)
{
    need_cluster();
    CHECK_OK(fiber_config_set("slurm_time_limit", "1"));
    enum { WORKERS = 2, N = 144 }; /* 144 x 2.5 s / 2 = 180 s */
    fiber_pool *p;
    fiber_pool_opts o = {.workers = WORKERS};
    CHECK_OK(fiber_pool_create(&p, &o));
    static int32_t in[N];
    static struct answer out[N];
    for (int i = 0; i < N; i++)
        in[i] = i;
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_pool_map(p, "slow_square_where", in, sizeof in[0], N, out,
                            sizeof out[0], 1));
    double secs = (double)(fb_now_ms() - t0) / 1000.0;
    char jobs[64][28];
    int n_jobs = 0;
    for (int i = 0; i < N; i++) {
        CHECK_EQ(out[i].square, i * i);
        int known = 0;
        for (int k = 0; k < n_jobs && !known; k++)
            known = strcmp(jobs[k], out[i].job) == 0;
        if (!known && n_jobs < 64)
            snprintf(jobs[n_jobs++], sizeof jobs[0], "%s", out[i].job);
    }
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(p, &st));
    fprintf(stderr,
            "map of %d x %d ms on %d workers with a 1-minute limit: %.1f s; "
            "%d Slurm jobs ran tasks; workers started %llu, retired at the "
            "limit %llu, lost %llu; tasks retried %llu\n",
            N, TASK_MS, WORKERS, secs, n_jobs,
            (unsigned long long)st.workers_started,
            (unsigned long long)st.workers_retired_at_limit,
            (unsigned long long)st.workers_lost,
            (unsigned long long)st.tasks_retried);
    CHECK(secs > 150); /* the map outlived every worker's limit */
    CHECK_EQ(st.tasks_retried, 0);
    CHECK_EQ(st.workers_lost, 0);
    CHECK(st.workers_retired_at_limit >= 2 * WORKERS);
    CHECK(n_jobs >= 3 * WORKERS); /* each worker job ran < 1 minute */
    fiber_pool_terminate(p);
    fiber_pool_free(p);
}

TH_MAIN()
