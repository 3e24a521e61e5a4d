/*
 * test_slurm.c -- the slurm backend against a real Slurm cluster: the one
 * scripts/slurm-local.sh starts on this host (slurmctld, four slurmd
 * nodes, munge).  ctest runs these cases through tests/slurm/run.sh, which
 * sets SLURM_CONF and FIBER_BACKEND=slurm; where there is no cluster they
 * are skipped (exit 77; a failure under CI).  The first cases need no cluster: they test the backend's
 * parsing, quoting and address choice.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/slurm/slurm.h"
#include "core/addr.h"
#include "core/common.h"
#include "core/config.h"
#include "core/runtime.h"
#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs a shell command and returns what it printed (caller frees). */
static char *sh_out(const char *cmd)
{
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    CHECK(buf != NULL);
    size_t n;
    while ((n = fread(buf + len, 1, cap - 1 - len, f)) > 0)
        len += n;
    buf[len] = '\0';
    pclose(f);
    return buf;
}

/* The cluster cases run only where run.sh found the cluster; elsewhere
 * they are skipped (a failure under CI). */
static void need_cluster(void)
{
    const char *b = getenv("FIBER_BACKEND");
    if (!b || strcmp(b, "slurm") != 0 || !getenv("SLURM_CONF"))
        TH_SKIP_ENGINE("no Slurm cluster (run through tests/slurm/run.sh)");
}

/* The run's jobs as squeue lists them: "<id> <state>" lines. */
static char *run_jobs(const char *run_id)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "squeue -h -r --name=%s -o '%%i %%T' 2>&1", run_id);
    return sh_out(cmd);
}

static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len && (!needle || memmem(p, len, needle, strlen(needle))))
            n++;
        p = nl ? nl + 1 : NULL;
    }
    return n;
}

FIBER_TASK(square)
{
    int32_t x;
    if (len != sizeof x)
        return fiber_task_fail("square wants 4 bytes");
    memcpy(&x, arg, sizeof x);
    x *= x;
    return fiber_buf_append(out, &x, sizeof x);
}

FIBER_TASK(slow_square)
{
    sleep_ms(20);
    int32_t x;
    memcpy(&x, arg, sizeof x);
    x *= x;
    return fiber_buf_append(out, &x, sizeof x);
}

FIBER_TASK(sleep_long)
{
    FB_UNUSED(arg);
    FB_UNUSED(len);
    FB_UNUSED(out);
    sleep(120);
    return 0;
}

/* Ignores SIGTERM, then creates the file named by its argument. */
FIBER_TASK(ignore_term_then_touch)
{
    FB_UNUSED(out);
    signal(SIGTERM, SIG_IGN);
    char path[256];
    snprintf(path, sizeof path, "%.*s", (int)len, (const char *)arg);
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    if (fd >= 0)
        close(fd);
    for (int i = 0; i < 600; i++)
        sleep(1);
    return 0;
}

FIBER_TASK(say_goodbye_and_exit)
{
    FB_UNUSED(arg);
    FB_UNUSED(len);
    FB_UNUSED(out);
    fprintf(stderr, "initializer says goodbye\n");
    fflush(stderr);
    _exit(3);
}

/* ---- no cluster needed --------------------------------------------------- */

TEST(parse_job_records)
{
    char state[32];
    int st = 12345;
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobName=x JobState=RUNNING "
                                "Reason=None ExitCode=0:0",
                                state, sizeof state, &st),
             0);
    CHECK_STR(state, "RUNNING");
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=COMPLETED ExitCode=0:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, 0);
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=FAILED ExitCode=3:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, 3);
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=CANCELLED ExitCode=0:9",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, -9);
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=CANCELLED ExitCode=0:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, -SIGTERM);
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=CANCELLED ExitCode=3:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, 3);
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=CANCELLED ExitCode=143:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, -15);
    CHECK_EQ(fb_slurm_parse_job("JobId=7 JobState=TIMEOUT ExitCode=0:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, 255);
    /* A field named like another's tail is not that field. */
    CHECK_EQ(fb_slurm_parse_job("JobId=7 OldJobState=RUNNING "
                                "JobState=COMPLETED DerivedExitCode=1:0 "
                                "ExitCode=0:0",
                                state, sizeof state, &st),
             1);
    CHECK_EQ(st, 0);
    CHECK_EQ(fb_slurm_parse_job("slurm_load_jobs error: Invalid job id",
                                state, sizeof state, &st),
             -1);
    CHECK_EQ(fb_slurm_parse_job("JobState=FAILED ExitCode=x", state,
                                sizeof state, &st),
             -1);
}

TEST(shell_quoting_survives_the_shell)
{
    static const char *const texts[] = {
        "plain", "with space", "it's", "'''", "$HOME `id` $(id) \\ \" ;|&",
        "", "FIBER_BOOT_NAME=a'b"};
    for (size_t i = 0; i < FB_ARRAY_LEN(texts); i++) {
        fiber_buf q = {0};
        fiber_buf_append(&q, "printf %s ", 10);
        CHECK_OK(fb_slurm_shell_quote(&q, texts[i]));
        fiber_buf_append(&q, "", 1);
        fiber_buf out = {0}, err = {0};
        char *argv[] = {"/bin/sh", "-c", (char *)q.data, NULL};
        CHECK_EQ(fb_slurm_run(argv, &out, &err, 5000), 0);
        fiber_buf_append(&out, "", 1);
        CHECK_STR((char *)out.data, texts[i]);
        fiber_buf_free(&q);
        fiber_buf_free(&out);
        fiber_buf_free(&err);
    }
}

TEST(tool_runner_reports_status_output_and_timeouts)
{
    fiber_buf out = {0}, err = {0};
    char *a1[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 7", NULL};
    CHECK_EQ(fb_slurm_run(a1, &out, &err, 5000), 7);
    char line[64];
    fb_slurm_last_line(&out, line, sizeof line);
    CHECK_STR(line, "out");
    fb_slurm_last_line(&err, line, sizeof line);
    CHECK_STR(line, "err");
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    char *a2[] = {"/bin/sh", "-c", "sleep 5", NULL};
    uint64_t t0 = fb_now_ms();
    CHECK_EQ(fb_slurm_run(a2, &out, &err, 200), -1);
    CHECK_EQ(errno, ETIMEDOUT);
    CHECK(fb_now_ms() - t0 < 3000);
    char *a3[] = {"/nonexistent/sbatch", NULL};
    CHECK_EQ(fb_slurm_run(a3, &out, &err, 1000), -1);
    fiber_buf_free(&out);
    fiber_buf_free(&err);
    char path[256];
    CHECK_EQ(fb_slurm_find_tool("sh", path, sizeof path), 0);
    CHECK(path[0] == '/');
    CHECK_EQ(fb_slurm_find_tool("no-such-tool-anywhere", path, sizeof path),
             -1);
}

TEST(listen_host_auto_never_loopback_for_other_hosts)
{
    struct fb_config c;
    fb_config_defaults(&c);
    CHECK_STR(c.listen_host, "auto");
    CHECK_OK(fb_listen_host_resolve(&c, 1));
    CHECK_STR(c.listen_host, "127.0.0.1");

    fb_config_defaults(&c);
    fb_strlcpy(c.listen_interface, "lo", sizeof c.listen_interface);
    CHECK_OK(fb_listen_host_resolve(&c, 0));
    CHECK_STR(c.listen_host, "127.0.0.1");

    fb_config_defaults(&c);
    fb_strlcpy(c.listen_interface, "nosuchif0", sizeof c.listen_interface);
    CHECK_ERR(fb_listen_host_resolve(&c, 0), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "listen_interface 'nosuchif0'");
    CHECK_CONTAINS(fiber_last_error(), "lo");

    /* Only the choice is checked: nothing is sent to the address. */
    fb_config_defaults(&c);
    fb_strlcpy(c.backend, "slurm", sizeof c.backend);
    int rc = fb_listen_host_resolve(&c, 0);
    if (rc == 0)
        CHECK(strncmp(c.listen_host, "127.", 4) != 0);
    else
        CHECK_CONTAINS(fiber_last_error(), "set listen_host");

    fb_config_defaults(&c);
    fb_strlcpy(c.listen_host, "10.1.2.3", sizeof c.listen_host);
    CHECK_OK(fb_listen_host_resolve(&c, 0));
    CHECK_STR(c.listen_host, "10.1.2.3");
}

TEST(missing_tools_are_named)
{
    CHECK_OK(setenv("PATH", "/nonexistent", 1));
    CHECK_OK(fiber_config_set("backend", "slurm"));
    fiber_process *p = NULL;
    CHECK_ERR(fiber_process_start(&p, "square", NULL, 0, NULL),
              FIBER_EUNREACHABLE);
    CHECK_CONTAINS(fiber_last_error(), "'sbatch' is not on PATH");
}

/* ---- against the cluster ------------------------------------------------- */

TEST(pool_workers_are_one_array_job)
{
    need_cluster();
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 6};
    CHECK_OK(fiber_pool_create(&p, &o));
    int32_t in[300], out[300];
    for (int i = 0; i < 300; i++)
        in[i] = i;
    CHECK_OK(fiber_pool_map(p, "square", in, 4, 300, out, 4, 0));
    for (int i = 0; i < 300; i++)
        CHECK_EQ(out[i], i * i);
    char *jobs = run_jobs(fiber_run_id());
    fprintf(stderr, "jobs of the run:\n%s", jobs);
    CHECK_EQ(count_lines(jobs, NULL), 6);
    /* One array: every id is <array id>_<index>, indices 0..5. */
    char first[32] = "";
    CHECK(sscanf(jobs, "%31[0-9]_", first) == 1);
    for (int i = 0; i < 6; i++) {
        char id[64];
        snprintf(id, sizeof id, "%s_%d ", first, i);
        CHECK(strstr(jobs, id) != NULL);
    }
    free(jobs);
    fiber_pool_close(p);
    CHECK_OK(fiber_pool_join(p, 30000));
    fiber_pool_free(p);
    /* They leave the queue once the pool is done with them. */
    uint64_t t0 = fb_now_ms();
    int left = 1;
    while (left && fb_now_ms() - t0 < 15000) {
        jobs = run_jobs(fiber_run_id());
        left = count_lines(jobs, NULL);
        free(jobs);
        if (left)
            sleep_ms(200);
    }
    CHECK_EQ(left, 0);
}

TEST(scancel_of_a_worker_during_a_map_loses_nothing)
{
    need_cluster();
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 4};
    CHECK_OK(fiber_pool_create(&p, &o));
    enum { N = 400 };
    static int32_t in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = i;
    fiber_future *f;
    CHECK_OK(fiber_pool_map_async(p, "slow_square", in, 4, N, out, 4, 1, &f));
    /* Wait until a worker runs a task, then cancel its job. */
    char victim[64] = "";
    uint64_t t0 = fb_now_ms();
    while (!victim[0] && fb_now_ms() - t0 < 30000) {
        fiber_pool_stats st;
        CHECK_OK(fiber_pool_stats_get(p, &st));
        char *jobs = run_jobs(fiber_run_id());
        if (st.tasks_done > 20)
            sscanf(jobs, "%63s RUNNING", victim);
        free(jobs);
        if (!victim[0])
            sleep_ms(100);
    }
    CHECK(victim[0]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "scancel %s", victim); /* as pre-emption */
    CHECK_EQ(system(cmd), 0);
    fprintf(stderr, "cancelled worker job %s\n", victim);
    CHECK_OK(fiber_future_get(f, NULL, 120000));
    fiber_future_free(f);
    for (int i = 0; i < N; i++)
        CHECK_EQ(out[i], i * i);
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(p, &st));
    fprintf(stderr, "workers lost %llu, tasks retried %llu\n",
            (unsigned long long)st.workers_lost,
            (unsigned long long)st.tasks_retried);
    CHECK(st.workers_lost >= 1);
    CHECK(st.workers_started >= 5); /* a replacement was started */
    fiber_pool_terminate(p);
    fiber_pool_free(p);
}

/* A master for the next case: a pool of 3, and two jobs that ask for a
 * whole node each so that at least one waits in the queue. */
TEST(helper_slurm_master)
{
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 3};
    CHECK_OK(fiber_pool_create(&p, &o));
    fiber_job_opts big = {.cpu = 16};
    fiber_process *procs[5];
    for (int i = 0; i < 5; i++)
        CHECK_OK(fiber_process_start(&procs[i], "sleep_long", NULL, 0, &big));
    printf("%s\n", fiber_run_id());
    fflush(stdout);
    int32_t x = 3, y;
    for (;;)
        CHECK_OK(fiber_pool_map(p, "slow_square", &x, 4, 1, &y, 4, 1));
}

TEST(master_sigkill_leaves_no_job_in_the_queue)
{
    need_cluster();
    int out[2];
    CHECK(pipe(out) == 0);
    pid_t master = fork();
    CHECK(master >= 0);
    if (master == 0) {
        dup2(out[1], 1);
        execl("/proc/self/exe", "test_slurm", "helper_slurm_master",
              (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char run[64] = "";
    CHECK(fscanf(f, "%63s", run) == 1);
    fclose(f);
    /* Until its jobs are there: some running, at least one pending. */
    uint64_t t0 = fb_now_ms();
    int running = 0, pending = 0;
    while ((running < 3 || pending < 1) && fb_now_ms() - t0 < 30000) {
        char *jobs = run_jobs(run);
        running = count_lines(jobs, " RUNNING");
        pending = count_lines(jobs, " PENDING");
        free(jobs);
        sleep_ms(200);
    }
    fprintf(stderr, "run %s: %d jobs running, %d pending\n", run, running,
            pending);
    CHECK(running >= 3);
    CHECK(pending >= 1);
    CHECK(master > 1);
    CHECK(kill(master, SIGKILL) == 0);
    waitpid(master, NULL, 0);
    t0 = fb_now_ms();
    int left = 1;
    char *jobs = NULL;
    while (left && fb_now_ms() - t0 < 15000) {
        free(jobs);
        jobs = run_jobs(run);
        left = count_lines(jobs, NULL);
        if (left)
            sleep_ms(100);
    }
    if (left)
        TH_FAIL("jobs of run %s still queued 15 s after its master was "
                "killed:\n%s",
                run, jobs);
    free(jobs);
    fprintf(stderr, "queue empty %llu ms after the master was killed\n",
            (unsigned long long)(fb_now_ms() - t0));
}

TEST(bad_partition_is_named)
{
    need_cluster();
    CHECK_OK(fiber_config_set("slurm_partition", "nosuchpart"));
    fiber_pool *p = NULL;
    fiber_pool_opts o = {.workers = 2};
    CHECK_ERR(fiber_pool_create(&p, &o), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "slurm_partition 'nosuchpart'");
    CHECK_CONTAINS(fiber_last_error(), "debug");
}

TEST(sbatch_refusal_is_reported_with_its_reason)
{
    need_cluster();
    CHECK_OK(fiber_config_set("slurm_sbatch_args", "--partition=nosuch2"));
    fiber_process *p = NULL;
    CHECK_ERR(fiber_process_start(&p, "square", NULL, 0, NULL),
              FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "sbatch refused job");
    CHECK_CONTAINS(fiber_last_error(), "nosuch2");
    /* A pool's array is refused as a whole, with the same reason. */
    fiber_pool *pool = NULL;
    fiber_pool_opts o = {.workers = 3};
    CHECK_ERR(fiber_pool_create(&pool, &o), FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "nosuch2");
    CHECK_CONTAINS(fiber_last_error(), "the rest of its array");
    /* GPUs the cluster does not have: Slurm's own words. */
    CHECK_OK(fiber_config_set("slurm_sbatch_args", ""));
    fiber_job_opts gpu = {.gpu = 1};
    CHECK_ERR(fiber_process_start(&p, "square", NULL, 0, &gpu),
              FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "sbatch refused job");
}

TEST(failed_worker_shows_its_output)
{
    need_cluster();
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 1, .initializer = "say_goodbye_and_exit"};
    CHECK_OK(fiber_pool_create(&p, &o));
    int32_t x = 2, y;
    int rc = fiber_pool_map(p, "square", &x, 4, 1, &y, 4, 1);
    CHECK(rc != 0);
    fprintf(stderr, "map failed as it should: %s\n", fiber_last_error());
    CHECK_CONTAINS(fiber_last_error(), "failed with status 3");
    CHECK_CONTAINS(fiber_last_error(), "initializer says goodbye");
    /* Named by its Slurm job id: the array's "<id>_0", or a replacement's
     * "<id>". */
    const char *w = strstr(fiber_last_error(), "worker job ");
    CHECK(w && w[11] >= '1' && w[11] <= '9');
    fiber_pool_terminate(p);
    fiber_pool_free(p);
}

TEST(job_options_reach_sbatch_and_the_secret_stays_private)
{
    need_cluster();
    char dir[] = "/tmp/fiber-slurm-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(fiber_config_set("slurm_dir", dir));
    fiber_job_opts jo = {.cpu = 2, .memory_mb = 64};
    fiber_process *proc;
    CHECK_OK(fiber_process_start(&proc, "sleep_long", NULL, 0, &jo));
    char *jobs = NULL;
    uint64_t t0 = fb_now_ms();
    while (fb_now_ms() - t0 < 30000) {
        free(jobs);
        jobs = run_jobs(fiber_run_id());
        if (count_lines(jobs, " RUNNING") == 1)
            break;
        sleep_ms(100);
    }
    char id[64];
    CHECK(sscanf(jobs, "%63s RUNNING", id) == 1);
    free(jobs);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "scontrol -o show job %s", id);
    char *info = sh_out(cmd);
    CHECK_CONTAINS(info, "NumCPUs=2");
    CHECK_CONTAINS(info, "MinMemoryNode=64M");
    CHECK_CONTAINS(info, "Requeue=0");
    /* The token is in a 0600 file of a 0700 folder, nowhere else. */
    char run_dir[512], secret[600];
    snprintf(run_dir, sizeof run_dir, "%s/%s", dir, fiber_run_id());
    snprintf(secret, sizeof secret, "%s/secret", run_dir);
    struct stat st;
    CHECK(stat(run_dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK(stat(secret, &st) == 0 && (st.st_mode & 0777) == 0600);
    const uint8_t *token = fb_rt_token();
    char hex[65];
    fb_hex(token, 32, hex, sizeof hex);
    CHECK(memmem(info, strlen(info), hex, 64) == NULL);
    free(info);
    snprintf(cmd, sizeof cmd, "cat %s/batch-*.sh", run_dir);
    char *script = sh_out(cmd);
    CHECK_CONTAINS(script, "FIBER_BOOT_SECRET_FILE");
    CHECK(memmem(script, strlen(script), token, 32) == NULL);
    CHECK(memmem(script, strlen(script), hex, 64) == NULL);
    free(script);
    CHECK_OK(fiber_process_terminate(proc));
    CHECK_OK(fiber_process_join(proc, 30000));
    int code = 0;
    CHECK_OK(fiber_process_exitcode(proc, &code));
    CHECK(code < 0); /* ended by a signal */
    fiber_process_free(proc);
    fiber_shutdown();
    /* The run's folder is gone with the run (no output worth keeping). */
    CHECK(stat(secret, &st) != 0);
    rmdir(run_dir);
    rmdir(dir);
}

TEST(terminate_escalates_to_sigkill_on_a_running_job)
{
    need_cluster();
    CHECK_OK(fiber_config_set("terminate_grace_ms", "500"));
    char flag[] = "/tmp/fiber-slurm-flag-XXXXXX";
    int fd = mkstemp(flag);
    CHECK(fd >= 0);
    close(fd);
    unlink(flag);
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "ignore_term_then_touch", flag,
                                 strlen(flag), NULL));
    struct stat st;
    uint64_t t0 = fb_now_ms();
    while (stat(flag, &st) != 0 && fb_now_ms() - t0 < 30000)
        sleep_ms(50);
    CHECK(stat(flag, &st) == 0);
    t0 = fb_now_ms();
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 30000));
    int code = 0;
    CHECK_OK(fiber_process_exitcode(p, &code));
    fprintf(stderr, "ended after %llu ms with %d\n",
            (unsigned long long)(fb_now_ms() - t0), code);
    CHECK_EQ(code, -SIGKILL);
    fiber_process_free(p);
    unlink(flag);
}

TEST(unreachable_controller_is_named)
{
    need_cluster();
    /* A copy of the cluster's config whose controller port is closed. */
    char conf[] = "/tmp/fiber-slurm-conf-XXXXXX";
    int fd = mkstemp(conf);
    CHECK(fd >= 0);
    close(fd);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "sed 's/^SlurmctldPort=.*/SlurmctldPort=1/' %s > %s "
             "&& echo MessageTimeout=2 >> %s",
             getenv("SLURM_CONF"), conf, conf);
    CHECK_EQ(system(cmd), 0);
    CHECK_OK(setenv("SLURM_CONF", conf, 1));
    fiber_process *p = NULL;
    uint64_t t0 = fb_now_ms();
    CHECK_ERR(fiber_process_start(&p, "square", NULL, 0, NULL),
              FIBER_EUNREACHABLE);
    fprintf(stderr, "took %llu ms: %s\n",
            (unsigned long long)(fb_now_ms() - t0), fiber_last_error());
    CHECK_CONTAINS(fiber_last_error(), "Slurm controller does not answer");
    unlink(conf);
}

TH_MAIN()
