/*
 * test_process.c -- fiber_process across real child processes (this test
 * program re-run by the local backend).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "runtime/runtime.h"
#include "harness.h"

const char *fb_process_failure(fiber_process *p);

static int arg_int(const void *arg, size_t len)
{
    int v = 0;
    if (len == sizeof v)
        memcpy(&v, arg, sizeof v);
    return v;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

FIBER_TASK(ret_arg) { return arg_int(arg, len); }

FIBER_TASK(sleeper)
{
    sleep_ms(arg_int(arg, len));
    return 0;
}

FIBER_TASK(ignore_term)
{
    signal(SIGTERM, SIG_IGN);
    sleep_ms(arg_int(arg, len));
    return 0;
}

FIBER_TASK(kill_self)
{
    raise(SIGKILL);
    return 0;
}

FIBER_TASK(exit_directly) { exit(arg_int(arg, len)); }

FIBER_TASK(fail_with_message) { return fiber_task_fail("bad input %d", 7); }

/* Returns 0 if the argument is bytes i*7 mod 251, else 1. */
FIBER_TASK(check_pattern)
{
    const unsigned char *p = arg;
    for (size_t i = 0; i < len; i++)
        if (p[i] != (unsigned char)(i * 7 % 251))
            return 1;
    return len == 100000 ? 0 : 2;
}

/* Returns 0 if descriptor `arg` is closed in this process. */
FIBER_TASK(fd_is_closed)
{
    return fcntl(arg_int(arg, len), F_GETFD) == -1 && errno == EBADF ? 0 : 1;
}

FIBER_TASK(check_env)
{
    const char *foo = getenv("FIBERTEST_FOO");
    if (!foo || strcmp(foo, "bar") != 0)
        return 1;
    if (getenv("FIBER_BOOT_ADDR") || getenv("FIBER_BOOT_SECRET_FD"))
        return 2; /* the bootstrap must not leak into the task */
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd) || strcmp(cwd, "/tmp") != 0)
        return 3;
    return 0;
}

FIBER_TASK(log_hello)
{
    fiber_log(FIBER_LOG_INFO, "hello from the child, pid %d", (int)getpid());
    return fiber_is_master() == 0 ? 0 : 1;
}

static fiber_process *start_int(const char *task, int v)
{
    fiber_process *p = NULL;
    CHECK_OK(fiber_process_start(&p, task, &v, sizeof v, NULL));
    CHECK(p != NULL);
    return p;
}

static int run_int(const char *task, int v)
{
    fiber_process *p = start_int(task, v);
    CHECK_OK(fiber_process_join(p, 20000));
    int code = -1000;
    CHECK_OK(fiber_process_exitcode(p, &code));
    fiber_process_free(p);
    return code;
}

TEST(exit_code_is_return_value)
{
    CHECK_EQ(run_int("ret_arg", 42), 42);
    CHECK_EQ(run_int("ret_arg", 0), 0);
    /* The child reports the whole int, not just the exit status byte. */
    CHECK_EQ(run_int("ret_arg", 123456), 123456);
}

TEST(exit_code_of_signal_is_negative)
{
    CHECK_EQ(run_int("kill_self", 0), -SIGKILL);
}

TEST(exit_code_of_direct_exit)
{
    CHECK_EQ(run_int("exit_directly", 7), 7);
}

TEST(failed_task_exits_1_with_message)
{
    fiber_process *p = start_int("fail_with_message", 0);
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 1);
    CHECK_STR(fb_process_failure(p), "bad input 7");
    fiber_process_free(p);
}

TEST(argument_bytes_arrive_intact)
{
    unsigned char *buf = malloc(100000);
    for (size_t i = 0; i < 100000; i++)
        buf[i] = (unsigned char)(i * 7 % 251);
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "check_pattern", buf, 100000, NULL));
    free(buf); /* the argument was copied */
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);
}

TEST(unknown_task_fails_before_any_job)
{
    uint64_t jobs_before = fb_rt()->next_job_id;
    fiber_process *p = NULL;
    CHECK_ERR(fiber_process_start(&p, "squre", NULL, 0, NULL), FIBER_ENOTASK);
    CHECK(p == NULL);
    CHECK_CONTAINS(fiber_last_error(), "'squre' is not registered");
    CHECK_CONTAINS(fiber_last_error(), "registered tasks: check_env");
    CHECK_CONTAINS(fiber_last_error(), "ret_arg");
    CHECK_EQ(fb_rt()->next_job_id, jobs_before);
}

TEST(bad_arguments_are_rejected)
{
    fiber_process *p = NULL;
    CHECK_ERR(fiber_process_start(NULL, "ret_arg", NULL, 0, NULL),
              FIBER_EINVAL);
    CHECK_ERR(fiber_process_start(&p, NULL, NULL, 0, NULL), FIBER_EINVAL);
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 4, NULL), FIBER_EINVAL);
    fiber_job_opts bad_name = {.name = "../escape"};
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, &bad_name),
              FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "../escape");
    fiber_job_opts gpu = {.gpu = 1};
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, &gpu),
              FIBER_ENOTSUP);
    CHECK_CONTAINS(fiber_last_error(), "GPU");
    fiber_job_opts other = {.backend = "slurm"};
    CHECK_ERR(fiber_process_start(&p, "ret_arg", NULL, 0, &other),
              FIBER_ENOTSUP);
    CHECK(p == NULL);
    /* A handle that is not one fails cleanly. */
    char junk[64] = {0};
    CHECK_ERR(fiber_process_join((fiber_process *)junk, 0), FIBER_EINVAL);
    fiber_process_free(NULL);
}

TEST(join_times_out_while_running)
{
    fiber_process *p = start_int("sleeper", 3000);
    CHECK_ERR(fiber_process_join(p, 50), FIBER_ETIMEDOUT);
    CHECK_EQ(fiber_process_is_alive(p), 1);
    int code;
    CHECK_ERR(fiber_process_exitcode(p, &code), FIBER_ESTATE);
    CHECK(fiber_process_pid(p) > 0);
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 10000));
    CHECK_EQ(fiber_process_is_alive(p), 0);
    fiber_process_free(p);
}

TEST(process_outlives_many_heartbeats)
{
    CHECK_OK(fiber_config_set("heartbeat_ms", "50"));
    fiber_process *p = start_int("sleeper", 1500);
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);
}

TEST(terminate_sends_sigterm)
{
    fiber_process *p = start_int("sleeper", 60000);
    CHECK_OK(fiber_process_terminate(p));
    /* On kubernetes the kubelet reports a container's end seconds after
     * the SIGTERM ended it (docs/backends/kubernetes.md). */
    CHECK_OK(fiber_process_join(p, 60000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, -SIGTERM);
    CHECK_OK(fiber_process_terminate(p)); /* ended: a no-op */
    fiber_process_free(p);
}

TEST(terminate_escalates_to_sigkill)
{
    CHECK_OK(fiber_config_set("terminate_grace_ms", "300"));
    fiber_process *p = start_int("ignore_term", 60000);
    sleep_ms(300); /* let it install its SIG_IGN */
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_process_terminate(p));
    CHECK_OK(fiber_process_join(p, 10000));
    uint64_t waited = fb_now_ms() - t0;
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, -SIGKILL);
    CHECK(waited >= 250);
    CHECK(waited < 5000);
    fiber_process_free(p);
}

TEST(free_of_running_process_kills_and_reaps)
{
    CHECK_OK(fiber_config_set("terminate_grace_ms", "200"));
    fiber_process *p = start_int("ignore_term", 60000);
    pid_t pid = (pid_t)fiber_process_pid(p);
    CHECK(pid > 0);
    fiber_process_free(p);
    CHECK(kill(pid, 0) == -1 && errno == ESRCH);
}

TEST(ended_jobs_leave_no_zombie)
{
    fiber_process *p = start_int("ret_arg", 3);
    pid_t pid = (pid_t)fiber_process_pid(p);
    CHECK(pid > 0);
    CHECK_OK(fiber_process_join(p, 20000));
    int status;
    CHECK(waitpid(pid, &status, WNOHANG) == -1 && errno == ECHILD);
    fiber_process_free(p);
}

TEST(many_processes)
{
    enum { N = 48 };
    fiber_process *ps[N];
    for (int i = 0; i < N; i++)
        ps[i] = start_int("ret_arg", i * 3);
    for (int i = 0; i < N; i++) {
        CHECK_OK(fiber_process_join(ps[i], 30000));
        int code;
        CHECK_OK(fiber_process_exitcode(ps[i], &code));
        CHECK_EQ(code, i * 3);
        fiber_process_free(ps[i]);
    }
}

TEST(descriptors_do_not_leak_into_children)
{
    int p[2];
    CHECK(pipe(p) == 0); /* deliberately not close-on-exec */
    CHECK(dup2(p[0], 200) == 200);
    CHECK_EQ(run_int("fd_is_closed", 200), 0);
    close(200);
    close(p[0]);
    close(p[1]);
}

TEST(job_options_env_and_workdir)
{
    const char *env[] = {"FIBERTEST_FOO=bar", NULL};
    fiber_job_opts o = {.name = "envcheck", .env = env, .workdir = "/tmp"};
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "check_env", NULL, 0, &o));
    CHECK_STR(fiber_process_name(p), "envcheck");
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);
}

TEST(child_logs_go_to_a_file_named_after_it)
{
    char dir[] = "/tmp/fiber-logtest-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(fiber_config_set("log_dir", dir));
    CHECK_OK(fiber_config_set("log_level", "info"));
    fiber_job_opts o = {.name = "logger-1"};
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "log_hello", NULL, 0, &o));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    char path[512], text[4096] = {0};
    snprintf(path, sizeof path, "%s/%s/logger-1.log", dir, fiber_run_id());
    FILE *f = fopen(path, "r");
    if (!f)
        TH_FAIL("no log file at %s", path);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    CHECK(n > 0);
    CHECK_CONTAINS(text, "hello from the child");
    CHECK_CONTAINS(text, "logger-1[");
    CHECK_CONTAINS(text, "INFO");
    fiber_process_free(p);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", dir, fiber_run_id());
    rmdir(path);
    rmdir(dir);
}

/* Uber Fiber's layout: log_file is a prefix, the master writes
 * <prefix>.MainProcess (opened when the key is set) and each job
 * <prefix>.<its name>; a relative prefix is the master's working
 * directory's, wherever the job starts. */
TEST(log_file_prefix_names_each_process)
{
    char dir[] = "/tmp/fiber-logfile-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cwd[512];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK_EQ(chdir(dir), 0);
    CHECK_OK(fiber_config_set("log_level", "info"));
    CHECK_OK(fiber_config_set("log_file", "logs/fiber.log"));
    char value[64];
    CHECK_OK(fiber_config_get("log_file", value, sizeof value));
    CHECK_STR(value, "logs/fiber.log");
    CHECK_EQ(chdir(cwd), 0); /* the prefix stays where it was set */

    char master_path[600], job_path[600], text[4096] = {0};
    snprintf(master_path, sizeof master_path,
             "%s/logs/fiber.log.MainProcess", dir);
    struct stat st;
    CHECK_EQ(stat(master_path, &st), 0); /* there before any line */
    CHECK_EQ(st.st_mode & 0777, 0600);

    fiber_job_opts o = {.name = "logger-2", .workdir = "/"};
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "log_hello", NULL, 0, &o));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);
    snprintf(job_path, sizeof job_path, "%s/logs/fiber.log.logger-2", dir);
    FILE *f = fopen(job_path, "r");
    if (!f)
        TH_FAIL("no log file at %s", job_path);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    CHECK(n > 0);
    CHECK_CONTAINS(text, "hello from the child");
    CHECK_CONTAINS(text, "logger-2[");

    /* The master's lines go to its own file; "" sends them back to
     * standard error and the file keeps what it had. */
    fiber_log(FIBER_LOG_WARN, "a line for the master's file");
    CHECK_OK(fiber_config_set("log_file", ""));
    fiber_log(FIBER_LOG_WARN, "a line for standard error");
    memset(text, 0, sizeof text);
    f = fopen(master_path, "r");
    CHECK(f != NULL);
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    CHECK_CONTAINS(text, "master[");
    CHECK_CONTAINS(text, "a line for the master's file");
    CHECK(strstr(text, "hello from the child") == NULL);
    CHECK(strstr(text, "a line for standard error") == NULL);

    /* Fiber's "stdout" and a folder that cannot be made are refused, and
     * change nothing. */
    CHECK_ERR(fiber_config_set("log_file", "stdout"), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "log_file = stdout");
    CHECK_ERR(fiber_config_set("log_file", "/proc/nonexistent/fiber.log"),
              FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "log_file /proc/nonexistent/fiber.log");
    CHECK_OK(fiber_config_get("log_file", value, sizeof value));
    CHECK_STR(value, "");

    unlink(job_path);
    unlink(master_path);
    snprintf(job_path, sizeof job_path, "%s/logs", dir);
    rmdir(job_path);
    CHECK_EQ(rmdir(dir), 0);
}

/* ---- children die with their master ---------------------------------- */

/* A second master: starts three long sleepers, prints their pids, waits. */
TEST(helper_master_with_sleepers)
{
    for (int i = 0; i < 3; i++) {
        fiber_process *p = start_int("sleeper", 120000);
        printf("%ld\n", fiber_process_pid(p));
    }
    fflush(stdout);
    sleep_ms(120000);
}

static int pid_alive(pid_t pid)
{
    /* Orphans are re-parented to us (a subreaper), so reap them here. */
    int status;
    waitpid(pid, &status, WNOHANG);
    return kill(pid, 0) == 0;
}

TEST(children_exit_when_master_is_killed)
{
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    int out[2];
    CHECK(pipe(out) == 0);
    pid_t master = fork();
    CHECK(master >= 0);
    if (master == 0) {
        dup2(out[1], 1);
        execl("/proc/self/exe", "test_process", "helper_master_with_sleepers",
              (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    pid_t kids[3];
    for (int i = 0; i < 3; i++) {
        long v;
        CHECK(fscanf(f, "%ld", &v) == 1);
        kids[i] = (pid_t)v;
        CHECK(pid_alive(kids[i]));
    }
    sleep_ms(200); /* let them connect and start their task */
    CHECK(kill(master, SIGKILL) == 0);
    waitpid(master, NULL, 0);
    uint64_t t0 = fb_now_ms();
    int left = 3;
    while (left > 0 && fb_now_ms() - t0 < 2000) {
        left = 0;
        for (int i = 0; i < 3; i++)
            left += pid_alive(kids[i]);
        sleep_ms(20);
    }
    fclose(f);
    if (left)
        TH_FAIL("%d children still alive 2 s after their master was killed",
                left);
    fprintf(stderr, "children gone %llu ms after the master\n",
            (unsigned long long)(fb_now_ms() - t0));
}

TH_MAIN()
