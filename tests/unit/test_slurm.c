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
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/runops.h"
#include "backend/slurm/slurm.h"
#include "base/common.h"
#include "runtime/addr.h"
#include "runtime/config.h"
#include "runtime/runtime.h"
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
    char *buf = th_read_all(f, NULL);
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

/* ---- fiber run on slurm: the run-level ops (backend/slurm/runs.c) -------- */

/* A run started as `fiber run` starts one: fb_run_ops_slurm.start with
 * the run's variables, in a scratch slurm_dir (the master gets it too). */
struct trun {
    struct fiber_run r;
    char folder[PATH_MAX];
    char base[256];
    char flag[400];
};

static void new_run_id(char *out, size_t size)
{
    unsigned char b[4];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0 && read(fd, b, 4) == 4);
    close(fd);
    snprintf(out, size, "fiber-%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
}

/* A scratch slurm_dir for this case, set in our config. */
static void scratch_slurm_dir(struct trun *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->base, sizeof t->base, "/tmp/fiber-slurm-runs-XXXXXX");
    CHECK(mkdtemp(t->base) != NULL);
    CHECK_OK(fiber_config_set("slurm_dir", t->base));
}

static int start_trun(struct trun *t, const char *role,
                      const fiber_run_opts *opts)
{
    static char self[PATH_MAX];
    CHECK(realpath("/proc/self/exe", self) != NULL);
    memset(&t->r, 0, sizeof t->r);
    new_run_id(t->r.name, sizeof t->r.name);
    t->r.ops = &fb_run_ops_slurm;
    snprintf(t->folder, sizeof t->folder, "%s/%s", t->base, t->r.name);
    snprintf(t->flag, sizeof t->flag, "%s/flag-%s", t->base, t->r.name);
    char v_run[96], v_dir[300], v_flag[440];
    snprintf(v_run, sizeof v_run, "FIBER_BOOT_RUN=%s", t->r.name);
    snprintf(v_dir, sizeof v_dir, "FIBER_SLURM_DIR=%s", t->base);
    snprintf(v_flag, sizeof v_flag, "SLURMRUN_TEST_FLAG=%s", t->flag);
    const char *vars[] = {v_run, "FIBER_BACKEND=slurm", v_dir, v_flag,
                          "SLURMRUN_TEST_QUOTE=it's \"quoted\" $HOME"};
    const char *argv[] = {self, role, NULL};
    fiber_run_opts none = {0};
    struct fb_run_start s = {.run = t->r.name,
                             .argv = argv,
                             .opts = opts ? opts : &none,
                             .vars = vars,
                             .n_vars = FB_ARRAY_LEN(vars)};
    return fb_run_ops_slurm.start(&s, &t->r);
}

/* The run directory the run's jobs made on this host (the test cluster's
 * nodes are this host; their fiber logs go there). */
static void forget_local_dir(const char *run)
{
    CHECK(strncmp(run, "fiber-", 6) == 0 && !strchr(run, '/') &&
          !strchr(run, '\''));
    const char *tmp = getenv("TMPDIR");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/fiber-%u/%s'",
             tmp && *tmp && strlen(tmp) <= 60 ? tmp : "/tmp",
             (unsigned)geteuid(), run);
    CHECK_EQ(system(cmd), 0);
}

static void remove_scratch(struct trun *t)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->base);
    CHECK_EQ(system(cmd), 0);
    if (t->r.name[0])
        forget_local_dir(t->r.name);
}

static const fiber_job_info *find_job(const fiber_run_info *r,
                                      const char *role, int nth)
{
    for (size_t i = 0; i < r->n_jobs; i++)
        if (strcmp(r->jobs[i].role, role) == 0 && nth-- == 0)
            return &r->jobs[i];
    return NULL;
}

static int count_jobs(const fiber_run_info *r, const char *role,
                      const char *state)
{
    int n = 0;
    for (size_t i = 0; i < r->n_jobs; i++)
        n += strcmp(r->jobs[i].role, role) == 0 &&
             strcmp(r->jobs[i].state, state) == 0;
    return n;
}

static void print_list(const fiber_run_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        const fiber_run_info *r = &l->runs[i];
        fprintf(stderr, "  %s %s alive %d\n", r->run, r->backend, r->alive);
        for (size_t k = 0; k < r->n_jobs; k++)
            fprintf(stderr, "    %-20s %-7s %-8s %-10s %s\n",
                    r->jobs[k].name, r->jobs[k].role, r->jobs[k].state,
                    r->jobs[k].engine_id, r->jobs[k].status);
    }
    if (l->warning[0])
        fprintf(stderr, "  warning: %s\n", l->warning);
}

/* Lists run until want(run info) holds (30 s at most); the list stays in
 * *l.  Returns the run's entry. */
static const fiber_run_info *list_until(fiber_run_list *l, const char *run,
                                        int (*want)(const fiber_run_info *))
{
    uint64_t t0 = fb_now_ms();
    for (;;) {
        fiber_run_list_free(l);
        CHECK_OK(fb_run_ops_slurm.list(l, run));
        const fiber_run_info *r = NULL;
        for (size_t i = 0; i < l->n; i++)
            if (strcmp(l->runs[i].run, run) == 0)
                r = &l->runs[i];
        if (r && want(r))
            return r;
        if (fb_now_ms() - t0 > 30000) {
            print_list(l);
            TH_FAIL("run %s never got to the state the case waits for",
                    run);
        }
        sleep_ms(200);
    }
}

static int master_and_two_workers_run(const fiber_run_info *r)
{
    return count_jobs(r, "master", "running") == 1 &&
           count_jobs(r, "job", "running") == 2;
}

static int nothing_runs(const fiber_run_info *r)
{
    return r->alive == 0;
}

/* Waits (60 s at most) for the flag file of a trun. */
static int wait_flag(void)
{
    const char *flag = getenv("SLURMRUN_TEST_FLAG");
    struct stat st;
    for (int i = 0; flag && i < 600; i++) {
        if (stat(flag, &st) == 0)
            return 1;
        sleep_ms(100);
    }
    return 0;
}

/* The master of a run on slurm: maps over a pool of 2 workers (Slurm
 * jobs too), says so on both streams, waits for the test's flag and
 * exits with 7. */
TEST(helper_run_master)
{
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 2};
    CHECK_OK(fiber_pool_create(&p, &o));
    CHECK_OK(fiber_pool_wait_ready(p, 2, 60000));
    int32_t in[10], out[10], sum = 0;
    for (int i = 0; i < 10; i++)
        in[i] = i;
    CHECK_OK(fiber_pool_map(p, "square", in, 4, 10, out, 4, 0));
    for (int i = 0; i < 10; i++)
        sum += out[i];
    printf("run %s: sum of squares %d\n", fiber_run_id(), (int)sum);
    printf("quoted: %s\n", getenv("SLURMRUN_TEST_QUOTE"));
    fflush(stdout);
    fprintf(stderr, "master says this on stderr\n");
    int flagged = wait_flag();
    fiber_pool_close(p);
    fiber_pool_join(p, 30000);
    fiber_pool_free(p);
    fiber_shutdown();
    exit(flagged ? 7 : 9);
}

/* A master that maps for ever over 2 workers. */
TEST(helper_long_master)
{
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 2};
    CHECK_OK(fiber_pool_create(&p, &o));
    int32_t x = 3, y;
    for (int i = 0;; i++) {
        CHECK_OK(fiber_pool_map(p, "slow_square", &x, 4, 1, &y, 4, 1));
        if (i == 0) {
            printf("mapping\n");
            fflush(stdout);
        }
    }
}

/* The same, deaf to SIGTERM. */
TEST(helper_stubborn_master)
{
    signal(SIGTERM, SIG_IGN);
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 2};
    CHECK_OK(fiber_pool_create(&p, &o));
    int32_t x = 3, y;
    for (;;)
        CHECK_OK(fiber_pool_map(p, "slow_square", &x, 4, 1, &y, 4, 1));
}

TEST(master_sbatch_arguments_carry_the_options)
{
    CHECK_OK(fiber_config_set("slurm_partition", "other"));
    CHECK_OK(fiber_config_set("slurm_time_limit", "5:00"));
    CHECK_OK(fiber_config_set("slurm_sbatch_args", "--qos=low --nice=5"));
    fiber_run_opts o = {.cpu = 2, .memory_mb = 100, .gpu = 1};
    const char *argv[] = {"/bin/true", NULL};
    struct fb_run_start s = {.run = "fiber-0a0b0c0d", .argv = argv,
                             .opts = &o};
    struct fb_slurm_args a = {0};
    CHECK_OK(fb_slurm_master_args(&s, "/usr/bin/sbatch", "/shared/r",
                                  "/home/u", "/shared/r/master.sh", &a));
    fiber_buf all = {0};
    for (size_t i = 0; i < a.n; i++) {
        fiber_buf_append(&all, a.v[i], strlen(a.v[i]));
        fiber_buf_append(&all, "\n", 1);
    }
    fiber_buf_append(&all, "", 1);
    const char *text = (const char *)all.data;
    fprintf(stderr, "%s", text);
    CHECK_STR(a.v[0], "/usr/bin/sbatch");
    CHECK_STR(a.v[a.n - 1], "/shared/r/master.sh");
    CHECK(a.v[a.n] == NULL);
    static const char *const want[] = {
        "--parsable\n", "--job-name=fiber-0a0b0c0d-master\n",
        "--comment=fiber:master\n", "--output=/shared/r/master.out\n",
        "--error=/shared/r/master.err\n", "--chdir=/home/u\n",
        "--no-requeue\n", "--cpus-per-task=2\n", "--mem=100M\n",
        "--gres=gpu:1\n", "--partition=other\n", "--time=5:00\n",
        "--qos=low\n", "--nice=5\n"};
    for (size_t i = 0; i < FB_ARRAY_LEN(want); i++)
        CHECK_CONTAINS(text, want[i]);
    CHECK(strstr(text, "--account") == NULL);
    fiber_buf_free(&all);
    fb_slurm_args_free(&a);
}

TEST(job_output_names_and_list_helpers)
{
    CHECK(fb_slurm_is_job_output("12.out"));
    CHECK(fb_slurm_is_job_output("12_3.out"));
    CHECK(!fb_slurm_is_job_output("master.out"));
    CHECK(!fb_slurm_is_job_output("12_.out"));
    CHECK(!fb_slurm_is_job_output("_3.out"));
    CHECK(!fb_slurm_is_job_output("12.err"));
    CHECK(!fb_slurm_is_job_output("12x.out"));
    fiber_run_list l = {0};
    fiber_run_info *r = fb_runs_add_run(&l, "fiber-1", "slurm");
    CHECK(r != NULL);
    CHECK_EQ(r->master_pid, -1);
    CHECK(fb_runs_add_run(&l, "fiber-1", "local") == r);
    CHECK_STR(r->backend, "slurm");
    CHECK(fb_runs_add_job(r, "master", "master", "running", NULL, -1,
                          "12") != NULL);
    CHECK_STR(r->jobs[0].status, "");
    CHECK_STR(r->jobs[0].engine_id, "12");
    fb_runs_warn(&l, "slurm: %s", "one");
    fb_runs_warn(&l, "docker: %d", 2);
    CHECK_STR(l.warning, "slurm: one; docker: 2");
    fiber_run_list_free(&l);
}

TEST(run_on_slurm_maps_lists_follows_logs_waits_and_cleans)
{
    need_cluster();
    struct trun t;
    scratch_slurm_dir(&t);
    CHECK_OK(fiber_config_set("slurm_partition", "other"));
    fiber_run_opts o = {.cpu = 2, .memory_mb = 100};
    uint64_t submitted = fb_now_ms();
    CHECK_OK(start_trun(&t, "helper_run_master", &o));
    fprintf(stderr, "run %s: master job %s\n", t.r.name, t.r.engine_id);
    CHECK(t.r.engine_id[0] >= '1' && t.r.engine_id[0] <= '9');
    CHECK_EQ(t.r.pid, -1);
    /* The options reached the master's job. */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "scontrol -o show job %s", t.r.engine_id);
    char *info = sh_out(cmd);
    CHECK_CONTAINS(info, "NumCPUs=2");
    CHECK_CONTAINS(info, "MinMemoryNode=100M");
    CHECK_CONTAINS(info, "Partition=other");
    CHECK_CONTAINS(info, "Comment=fiber:master");
    char want[128];
    snprintf(want, sizeof want, "JobName=%s-master", t.r.name);
    CHECK_CONTAINS(info, want);
    free(info);

    /* ps: the master and its two workers, running, by their names. */
    fiber_run_list l = {0};
    const fiber_run_info *r =
        list_until(&l, t.r.name, master_and_two_workers_run);
    fprintf(stderr, "master and 2 workers running %llu ms after start\n",
            (unsigned long long)(fb_now_ms() - submitted));
    print_list(&l);
    CHECK_STR(r->backend, "slurm");
    CHECK_EQ(r->alive, 1);
    CHECK_STR(find_job(r, "master", 0)->name, "master");
    CHECK_STR(find_job(r, "master", 0)->engine_id, t.r.engine_id);
    CHECK_CONTAINS(find_job(r, "job", 0)->name, "Worker");
    CHECK_CONTAINS(find_job(r, "job", 1)->name, "Worker");
    CHECK_CONTAINS(find_job(r, "job", 0)->status, "running");
    fiber_run_list_free(&l);
    /* All runs: this one is among them. */
    CHECK_OK(fb_run_ops_slurm.list(&l, NULL));
    int seen = 0;
    for (size_t i = 0; i < l.n; i++)
        seen += strcmp(l.runs[i].run, t.r.name) == 0;
    CHECK_EQ(seen, 1);
    fiber_run_list_free(&l);

    /* follow: the master's output, until it ends; wait: its status. */
    int fd = open(t.flag, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0);
    close(fd);
    FILE *out = tmpfile(), *err = tmpfile();
    CHECK(out && err);
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fb_run_ops_slurm.follow(&t.r, fileno(out), fileno(err)));
    fprintf(stderr, "followed for %llu ms\n",
            (unsigned long long)(fb_now_ms() - t0));
    int code = 0;
    CHECK_OK(fb_run_ops_slurm.wait(&t.r, 30000, &code));
    CHECK_EQ(code, 7);
    char text[4096];
    rewind(out);
    text[fread(text, 1, sizeof text - 1, out)] = '\0';
    fprintf(stderr, "stdout:\n%s", text);
    snprintf(want, sizeof want, "run %s: sum of squares 285\n", t.r.name);
    CHECK_CONTAINS(text, want);
    CHECK_CONTAINS(text, "quoted: it's \"quoted\" $HOME\n");
    rewind(err);
    text[fread(text, 1, sizeof text - 1, err)] = '\0';
    CHECK_CONTAINS(text, "master says this on stderr\n");
    CHECK(strstr(text, "sum of squares") == NULL);
    fclose(out);
    fclose(err);

    /* logs: the master's output and errors, by heading; one job alone. */
    r = list_until(&l, t.r.name, nothing_runs);
    print_list(&l);
    CHECK_EQ(count_jobs(r, "master", "exited"), 1);
    CHECK_EQ(count_jobs(r, "job", "exited"), 2);
    CHECK_CONTAINS(find_job(r, "job", 0)->name, "Worker"); /* still */
    CHECK_CONTAINS(find_job(r, "master", 0)->status, "(7)");
    fiber_buf logs = {0};
    CHECK_OK(fb_run_ops_slurm.logs(r, NULL, 1, &logs));
    fiber_buf_append(&logs, "", 1);
    fprintf(stderr, "logs:\n%s", (char *)logs.data);
    CHECK_CONTAINS((char *)logs.data, "==> master <==\nrun ");
    CHECK_CONTAINS((char *)logs.data, "sum of squares 285");
    CHECK_CONTAINS((char *)logs.data, "==> master (stderr) <==\n");
    CHECK_CONTAINS(strstr((char *)logs.data, "(stderr)"),
                   "master says this on stderr\n");
    fiber_buf_free(&logs);
    CHECK_OK(fb_run_ops_slurm.logs(r, "master", 0, &logs));
    fiber_buf_append(&logs, "", 1);
    CHECK((char *)logs.data == strstr((char *)logs.data, "run "));
    CHECK(strstr((char *)logs.data, "==>") == NULL);
    fiber_buf_free(&logs);
    CHECK_ERR(fb_run_ops_slurm.logs(r, "Nobody-7", 0, &logs),
              FIBER_ENOKEY);
    CHECK_CONTAINS(fiber_last_error(), "no job Nobody-7");
    CHECK_EQ(logs.len, 0);

    /* clean: the run folder goes; the logs with it. */
    fiber_buf rep = {0};
    CHECK_OK(fb_run_ops_slurm.clean(r, 1, &rep));
    fiber_buf_append(&rep, "", 1);
    fprintf(stderr, "clean: %s", (char *)rep.data);
    CHECK_CONTAINS((char *)rep.data, "removed ");
    CHECK_CONTAINS((char *)rep.data, t.folder);
    fiber_buf_free(&rep);
    struct stat st;
    CHECK(stat(t.folder, &st) != 0 && errno == ENOENT);
    CHECK_ERR(fb_run_ops_slurm.logs(r, NULL, 1, &logs), FIBER_ENOKEY);
    fiber_run_list_free(&l);
    fb_run_ops_slurm.release(&t.r);
    CHECK(t.r.priv == NULL);
    remove_scratch(&t);
}

TEST(run_on_slurm_kill_stops_every_job_of_the_run)
{
    need_cluster();
    CHECK_OK(fiber_config_set("terminate_grace_ms", "3000"));
    struct trun t;
    scratch_slurm_dir(&t);
    CHECK_OK(start_trun(&t, "helper_long_master", NULL));
    fiber_run_list l = {0};
    const fiber_run_info *r =
        list_until(&l, t.r.name, master_and_two_workers_run);
    print_list(&l);
    fiber_buf rep = {0};
    int stopped = 0;
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fb_run_ops_slurm.kill(r, &rep, &stopped));
    fiber_buf_append(&rep, "", 1);
    fprintf(stderr, "kill took %llu ms, stopped %d:\n%s",
            (unsigned long long)(fb_now_ms() - t0), stopped,
            (char *)rep.data);
    char want[320];
    snprintf(want, sizeof want, "master (job %s)", t.r.engine_id);
    CHECK_CONTAINS((char *)rep.data, want);
    CHECK(stopped >= 1);
    fiber_buf_free(&rep);
    /* Nothing of the run is left in the queue once kill returns. */
    char *jobs = run_jobs(t.r.name);
    char names[160];
    snprintf(names, sizeof names, "%s-master", t.r.name);
    char *master = run_jobs(names);
    fprintf(stderr, "queue after kill: [%s] [%s]\n", jobs, master);
    CHECK_EQ(count_lines(jobs, NULL), 0);
    CHECK_EQ(count_lines(master, NULL), 0);
    free(jobs);
    free(master);
    int code = 0;
    CHECK_OK(fb_run_ops_slurm.wait(&t.r, 30000, &code));
    fprintf(stderr, "master ended with %d\n", code);
    CHECK(code != 0);
    /* A second kill finds nothing to stop. */
    CHECK_OK(fb_run_ops_slurm.kill(r, NULL, &stopped));
    CHECK_EQ(stopped, 0);
    fiber_run_list_free(&l);
    r = list_until(&l, t.r.name, nothing_runs);
    CHECK_OK(fb_run_ops_slurm.clean(r, 1, NULL));
    struct stat st;
    CHECK(stat(t.folder, &st) != 0);
    fiber_run_list_free(&l);
    fb_run_ops_slurm.release(&t.r);
    remove_scratch(&t);
}

TEST(run_on_slurm_kill_escalates_to_sigkill_after_the_grace_period)
{
    need_cluster();
    CHECK_OK(fiber_config_set("terminate_grace_ms", "1500"));
    struct trun t;
    scratch_slurm_dir(&t);
    CHECK_OK(start_trun(&t, "helper_stubborn_master", NULL));
    fiber_run_list l = {0};
    const fiber_run_info *r =
        list_until(&l, t.r.name, master_and_two_workers_run);
    fiber_buf rep = {0};
    int stopped = 0;
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fb_run_ops_slurm.kill(r, &rep, &stopped));
    uint64_t took = fb_now_ms() - t0;
    fiber_buf_append(&rep, "", 1);
    fprintf(stderr, "kill took %llu ms, stopped %d:\n%s",
            (unsigned long long)took, stopped, (char *)rep.data);
    char want[320];
    snprintf(want, sizeof want,
             "killed master (job %s) with SIGKILL after the grace period",
             t.r.engine_id);
    CHECK_CONTAINS((char *)rep.data, want);
    CHECK(took >= 1500);
    fiber_buf_free(&rep);
    char *jobs = run_jobs(t.r.name);
    CHECK_EQ(count_lines(jobs, NULL), 0);
    free(jobs);
    int code = 0;
    CHECK_OK(fb_run_ops_slurm.wait(&t.r, 30000, &code));
    CHECK_EQ(code, -SIGKILL);
    fiber_run_list_free(&l);
    r = list_until(&l, t.r.name, nothing_runs);
    CHECK_OK(fb_run_ops_slurm.clean(r, 0, NULL));
    struct stat st;
    CHECK(stat(t.folder, &st) != 0);
    fiber_run_list_free(&l);
    fb_run_ops_slurm.release(&t.r);
    remove_scratch(&t);
}

/* ---- the fiber command on slurm (needs the runs/ dispatch to runops) ---- */

/* Runs a shell command line with the fiber command as $FIBER; its
 * standard output is returned (caller frees), its standard error goes to
 * err (caller frees), its exit status to *status. */
static char *fiber_cmd(const char *args, char **err, int *status)
{
    char errfile[] = "/tmp/fiber-slurm-tool-err-XXXXXX";
    int fd = mkstemp(errfile);
    CHECK(fd >= 0);
    close(fd);
    size_t size = strlen(FIBER_TOOL_PATH) + strlen(args) + 64;
    char *cmd = malloc(size);
    CHECK(cmd != NULL);
    snprintf(cmd, size, "%s %s 2>%s", FIBER_TOOL_PATH, args, errfile);
    fprintf(stderr, "$ fiber %s\n", args);
    FILE *f = popen(cmd, "r");
    free(cmd);
    CHECK(f != NULL);
    char *out = th_read_all(f, NULL);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    FILE *e = fopen(errfile, "r");
    CHECK(e != NULL);
    *err = th_read_all(e, NULL);
    fclose(e);
    unlink(errfile);
    fprintf(stderr, "%s%s[exit %d]\n", out, *err, *status);
    return out;
}

/* Runs the command and checks its status (-1: any but 0) and that its
 * standard output and error hold out_has and err_has (each may be NULL). */
static void expect(const char *args, int want, const char *out_has,
                   const char *err_has)
{
    char *err = NULL;
    int status = 0;
    char *out = fiber_cmd(args, &err, &status);
    if (want < 0)
        CHECK(status != 0);
    else
        CHECK_EQ(status, want);
    if (out_has)
        CHECK_CONTAINS(out, out_has);
    if (err_has)
        CHECK_CONTAINS(err, err_has);
    free(out);
    free(err);
}

/* The first run id ("fiber-" and 8 hex digits) in text. */
static void find_run_id(const char *text, char *out, size_t size)
{
    out[0] = '\0';
    for (const char *p = text; (p = strstr(p, "fiber-")); p++) {
        size_t n = strspn(p + 6, "0123456789abcdef");
        if (n == 8) {
            snprintf(out, size, "%.14s", p);
            return;
        }
    }
}

TEST(fiber_command_runs_a_master_on_slurm_and_finds_it_again)
{
    need_cluster();
    struct trun t;
    scratch_slurm_dir(&t);
    CHECK_OK(setenv("FIBER_SLURM_DIR", t.base, 1)); /* for the command */
    char self[PATH_MAX], flag[400], args[PATH_MAX + 1024];
    CHECK(realpath("/proc/self/exe", self) != NULL);
    snprintf(flag, sizeof flag, "%s/flag", t.base);
    int fd = open(flag, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0);
    close(fd);
    /* Attached: the output is followed here, the status is the master's. */
    snprintf(args, sizeof args,
             "run --backend slurm -e SLURMRUN_TEST_FLAG=%s -- %s "
             "helper_run_master",
             flag, self);
    char *err = NULL;
    int status = 0;
    char *out = fiber_cmd(args, &err, &status);
    CHECK_EQ(status, 7);
    CHECK_CONTAINS(out, "sum of squares 285");
    CHECK_CONTAINS(err, "master says this on stderr");
    char run[32];
    find_run_id(err, run, sizeof run);
    CHECK(run[0]);
    free(out);
    free(err);
    /* ps, logs and clean find it by its id. */
    snprintf(args, sizeof args, "ps %s", run);
    expect(args, 0, "slurm", NULL);
    expect(args, 0, "Pool1-Worker-1", NULL);
    snprintf(args, sizeof args, "logs %s", run);
    expect(args, 0, "sum of squares 285", NULL);
    snprintf(args, sizeof args, "clean %s", run);
    expect(args, 0, "removed", NULL);
    snprintf(args, sizeof args, "logs %s", run);
    expect(args, -1, NULL, run);
    forget_local_dir(run);

    /* Detached, long: ps shows it running, kill stops all of it. */
    snprintf(args, sizeof args,
             "run --detach --backend slurm -- %s helper_long_master", self);
    out = fiber_cmd(args, &err, &status);
    CHECK_EQ(status, 0);
    find_run_id(out, run, sizeof run);
    CHECK(run[0]);
    free(out);
    free(err);
    snprintf(args, sizeof args, "ps %s", run);
    uint64_t t0 = fb_now_ms();
    for (;;) {
        out = fiber_cmd(args, &err, &status);
        int ready = status == 0 && strstr(out, "Pool1-Worker-2") &&
                    strstr(out, "alive");
        free(out);
        free(err);
        if (ready)
            break;
        CHECK(fb_now_ms() - t0 < 30000);
        sleep_ms(500);
    }
    snprintf(args, sizeof args, "kill %s", run);
    expect(args, 0, "master (job ", NULL);
    char *jobs = run_jobs(run);
    CHECK_EQ(count_lines(jobs, NULL), 0);
    free(jobs);
    snprintf(args, sizeof args, "clean %s", run);
    uint64_t t1 = fb_now_ms();
    for (;;) { /* dead once squeue no longer lists it as running */
        out = fiber_cmd(args, &err, &status);
        free(out);
        free(err);
        if (status == 0)
            break;
        CHECK(fb_now_ms() - t1 < 30000);
        sleep_ms(500);
    }
    forget_local_dir(run);
    remove_scratch(&t);
}

/* Bad input through the command: an unknown run, and no controller. */
TEST(fiber_command_on_slurm_names_bad_input)
{
    need_cluster();
    struct trun t;
    scratch_slurm_dir(&t);
    CHECK_OK(setenv("FIBER_SLURM_DIR", t.base, 1)); /* for the command */
    expect("logs fiber-00000000", 1, NULL, "fiber-00000000");
    expect("run --backend slurm -- /nonexistent/program", 1, NULL,
           "/nonexistent/program");
    char *good_path = strdup(getenv("PATH"));
    CHECK_OK(setenv("PATH", "/nonexistent", 1));
    expect("run --backend slurm -- /bin/true", 1, NULL,
           "'sbatch' is not on PATH");
    expect("ps", 0, NULL, "'squeue' is not on PATH");
    CHECK_OK(setenv("PATH", good_path, 1));
    free(good_path);
    remove_scratch(&t);
}

TEST(run_on_slurm_bad_input_is_named)
{
    need_cluster();
    struct trun t;
    scratch_slurm_dir(&t);
    /* An unknown run: nothing listed, nothing to stop or clean, no logs. */
    fiber_run_list l = {0};
    CHECK_OK(fb_run_ops_slurm.list(&l, "fiber-00000000"));
    CHECK_EQ(l.n, 0);
    CHECK_STR(l.warning, "");
    fiber_run_info unknown = {.run = "fiber-00000000", .backend = "slurm"};
    fiber_buf b = {0};
    CHECK_ERR(fb_run_ops_slurm.logs(&unknown, NULL, 1, &b), FIBER_ENOKEY);
    CHECK_CONTAINS(fiber_last_error(), "fiber-00000000");
    int stopped = -1;
    CHECK_OK(fb_run_ops_slurm.kill(&unknown, &b, &stopped));
    CHECK_EQ(stopped, 0);
    CHECK_OK(fb_run_ops_slurm.clean(&unknown, 1, &b));
    CHECK_EQ(b.len, 0);
    /* No such program; an image; a partition the cluster lacks. */
    const char *argv[] = {"/nonexistent/program", NULL};
    fiber_run_opts none = {0}, img = {.image = "x:1"};
    struct fiber_run r = {0};
    snprintf(r.name, sizeof r.name, "fiber-0badc0de");
    struct fb_run_start s = {.run = r.name, .argv = argv, .opts = &none};
    CHECK_ERR(fb_run_ops_slurm.start(&s, &r), FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "/nonexistent/program");
    s.opts = &img;
    CHECK_ERR(fb_run_ops_slurm.start(&s, &r), FIBER_ENOTSUP);
    CHECK_CONTAINS(fiber_last_error(), "not an image");
    CHECK_OK(fiber_config_set("slurm_partition", "nosuchpart"));
    CHECK_ERR(start_trun(&t, "helper_run_master", NULL), FIBER_ESPAWN);
    fprintf(stderr, "%s\n", fiber_last_error());
    CHECK_CONTAINS(fiber_last_error(), "sbatch refused the master");
    CHECK_CONTAINS(fiber_last_error(), "nosuchpart");
    struct stat st;
    CHECK(stat(t.folder, &st) != 0); /* nothing left behind */
    CHECK_OK(fiber_config_set("slurm_partition", ""));

    /* A controller that does not answer. */
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
    char *good_conf = strdup(getenv("SLURM_CONF"));
    CHECK_OK(setenv("SLURM_CONF", conf, 1));
    uint64_t t0 = fb_now_ms();
    CHECK_ERR(start_trun(&t, "helper_run_master", NULL), FIBER_EUNREACHABLE);
    fprintf(stderr, "start: %llu ms: %s\n",
            (unsigned long long)(fb_now_ms() - t0), fiber_last_error());
    CHECK_CONTAINS(fiber_last_error(), "Slurm controller does not answer");
    CHECK_CONTAINS(fiber_last_error(), "SLURM_CONF");
    CHECK_OK(fb_run_ops_slurm.list(&l, NULL));
    fprintf(stderr, "list warning: %s\n", l.warning);
    CHECK_CONTAINS(l.warning, "slurm jobs not listed");
    CHECK_CONTAINS(l.warning, "does not answer");
    fiber_run_list_free(&l);
    CHECK_ERR(fb_run_ops_slurm.kill(&unknown, NULL, &stopped),
              FIBER_EUNREACHABLE);
    /* A run another backend found is not Slurm's to fail. */
    fiber_run_info local = {.run = "fiber-00000000", .backend = "local"};
    CHECK_OK(fb_run_ops_slurm.kill(&local, NULL, &stopped));
    CHECK_EQ(stopped, 0);
    CHECK_OK(setenv("SLURM_CONF", good_conf, 1));
    free(good_conf);
    unlink(conf);

    /* No Slurm tools at all. */
    char *good_path = strdup(getenv("PATH"));
    CHECK_OK(setenv("PATH", "/nonexistent", 1));
    CHECK_ERR(start_trun(&t, "helper_run_master", NULL), FIBER_EUNREACHABLE);
    CHECK_CONTAINS(fiber_last_error(), "'sbatch' is not on PATH");
    CHECK_OK(fb_run_ops_slurm.list(&l, NULL));
    CHECK_CONTAINS(l.warning, "'squeue' is not on PATH");
    fiber_run_list_free(&l);
    CHECK_ERR(fb_run_ops_slurm.kill(&unknown, NULL, &stopped),
              FIBER_EUNREACHABLE);
    CHECK_OK(fb_run_ops_slurm.kill(&local, NULL, &stopped));
    CHECK_OK(setenv("PATH", good_path, 1));
    free(good_path);
    fiber_buf_free(&b);
    remove_scratch(&t);
}

TH_MAIN()
