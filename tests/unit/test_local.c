/*
 * test_local.c -- the local backend through its ops table, with ordinary
 * programs (/bin/sh) as jobs.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/common.h"
#include "harness.h"

static struct fb_backend *open_local(struct fb_config *cfg)
{
    fb_config_defaults(cfg);
    struct fb_backend *be = NULL;
    CHECK_OK(fb_backend_open(&be, "local", cfg, fiber_run_id()));
    return be;
}

/* Polls until the job ends (10 s at most) and returns its exit status. */
static int wait_exit(struct fb_backend *be, struct fb_job *job)
{
    uint64_t deadline = fb_deadline_ms(10000);
    while (job->state != FB_JOB_EXITED && fb_ms_left(deadline) > 0) {
        CHECK_OK(fb_backend_poll_job(be, job));
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    CHECK_EQ(job->state, FB_JOB_EXITED);
    return job->exit_status;
}

static struct fb_job *start_sh(struct fb_backend *be, const char *script,
                               const char *secret)
{
    char *argv[] = {"sh", "-c", (char *)script, NULL};
    struct fb_job_spec spec = {.program = "/bin/sh",
                               .argv = argv,
                               .secret = secret,
                               .secret_len = secret ? strlen(secret) : 0,
                               .name = "sh",
                               .job_id = 1};
    struct fb_job *job = NULL;
    CHECK_OK(fb_backend_create_job(be, &spec, &job));
    CHECK(job->pid > 0);
    CHECK(fb_backend_event_fd(be, job) >= 0); /* a pidfd on this kernel */
    return job;
}

TEST(unknown_backend_names_the_ones_that_exist)
{
    struct fb_config cfg;
    fb_config_defaults(&cfg);
    struct fb_backend *be = NULL;
    CHECK_ERR(fb_backend_open(&be, "mesos", &cfg, fiber_run_id()), FIBER_ECONFIG);
    CHECK_CONTAINS(fiber_last_error(), "'mesos'");
    CHECK_CONTAINS(fiber_last_error(), "local");
}

TEST(exec_failure_is_an_error_not_a_silent_exit)
{
    struct fb_config cfg;
    struct fb_backend *be = open_local(&cfg);
    char *argv[] = {"nope", NULL};
    struct fb_job_spec spec = {.program = "/nonexistent/fiber-program",
                               .argv = argv,
                               .name = "nope",
                               .job_id = 1};
    struct fb_job *job = NULL;
    CHECK_ERR(fb_backend_create_job(be, &spec, &job), FIBER_ESPAWN);
    CHECK(job == NULL);
    CHECK_CONTAINS(fiber_last_error(), "/nonexistent/fiber-program");
    CHECK_CONTAINS(fiber_last_error(), "No such file");
    fb_backend_close(be);
}

TEST(exit_status_is_collected_without_zombies)
{
    struct fb_config cfg;
    struct fb_backend *be = open_local(&cfg);
    struct fb_job *job = start_sh(be, "exit 3", NULL);
    pid_t pid = (pid_t)job->pid;
    CHECK_EQ(wait_exit(be, job), 3);
    int status;
    CHECK(waitpid(pid, &status, WNOHANG) == -1 && errno == ECHILD);
    CHECK_EQ(fb_backend_release_job(be, job), 3);
    fb_backend_close(be);
}

TEST(secret_arrives_on_its_descriptor)
{
    struct fb_config cfg;
    struct fb_backend *be = open_local(&cfg);
    /* The secret is on fd 3, and FIBER_BOOT_SECRET_FD says so. */
    struct fb_job *job = start_sh(
        be,
        "read -r s <&\"$FIBER_BOOT_SECRET_FD\"; test \"$s\" = open-sesame",
        "open-sesame\n");
    CHECK_EQ(wait_exit(be, job), 0);
    fb_backend_release_job(be, job);
    fb_backend_close(be);
}

TEST(polite_then_forced_stop)
{
    struct fb_config cfg;
    struct fb_backend *be = open_local(&cfg);
    struct fb_job *job = start_sh(be, "exec sleep 30", NULL);
    CHECK_OK(fb_backend_signal_job(be, job, 0));
    CHECK_EQ(wait_exit(be, job), -SIGTERM);
    CHECK_OK(fb_backend_signal_job(be, job, 1)); /* ended: not an error */
    fb_backend_release_job(be, job);

    job = start_sh(be, "trap '' TERM; exec sleep 30", NULL);
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL); /* let the shell install its trap */
    CHECK_OK(fb_backend_signal_job(be, job, 0));
    nanosleep(&ts, NULL);
    CHECK_OK(fb_backend_poll_job(be, job));
    CHECK_EQ(job->state, FB_JOB_RUNNING); /* it ignored SIGTERM */
    CHECK_OK(fb_backend_signal_job(be, job, 1));
    CHECK_EQ(wait_exit(be, job), -SIGKILL);
    fb_backend_release_job(be, job);
    fb_backend_close(be);
}

TEST(release_kills_a_running_job)
{
    struct fb_config cfg;
    struct fb_backend *be = open_local(&cfg);
    struct fb_job *job = start_sh(be, "exec sleep 30", NULL);
    pid_t pid = (pid_t)job->pid;
    CHECK_EQ(fb_backend_release_job(be, job), -SIGKILL);
    CHECK(kill(pid, 0) == -1 && errno == ESRCH);
    fb_backend_close(be);
}

TEST(working_directory_option)
{
    struct fb_config cfg;
    struct fb_backend *be = open_local(&cfg);
    fiber_job_opts o = {.workdir = "/tmp"};
    char *argv[] = {"sh", "-c", "test \"$(pwd)\" = /tmp", NULL};
    struct fb_job_spec spec = {.program = "/bin/sh", .argv = argv,
                               .name = "wd", .opts = &o, .job_id = 2};
    struct fb_job *job = NULL;
    CHECK_OK(fb_backend_create_job(be, &spec, &job));
    CHECK_EQ(wait_exit(be, job), 0);
    fb_backend_release_job(be, job);
    o.workdir = "/nonexistent-dir";
    CHECK_ERR(fb_backend_create_job(be, &spec, &job), FIBER_ESPAWN);
    CHECK_CONTAINS(fiber_last_error(), "working directory /nonexistent-dir");
    fb_backend_close(be);
}

TH_MAIN()
