/*
 * test_stop.c -- the stop event (fiber_on_stop_requested,
 * fiber_stop_requested) and fiber_resumed.
 *
 * Most cases run a second master (this program again, a helper_ case)
 * and signal it as a cluster would, reading what it prints.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

FIBER_TASK(triple)
{
    int x;
    memcpy(&x, arg, sizeof x);
    x *= 3;
    return fiber_buf_append(out, &x, sizeof x);
}

FIBER_TASK(arm_in_child)
{
    FB_UNUSED(arg);
    FB_UNUSED(len);
    int rc = fiber_on_stop_requested(NULL, NULL);
    return fiber_buf_append(out, &rc, sizeof rc);
}

/* ---- a second master --------------------------------------------------- */

struct helper {
    pid_t pid;
    int out;        /* its stdout and stderr */
    char text[8192];
    size_t len;
};

static void helper_start(struct helper *h, const char *name,
                         const char *const *env)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    memset(h, 0, sizeof *h);
    h->pid = fork();
    CHECK(h->pid >= 0);
    if (h->pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execl("/proc/self/exe", "test_stop", name, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    h->out = fds[0];
}

/* Reads its output until it contains needle; fails after timeout_ms. */
static void helper_expect(struct helper *h, const char *needle,
                          int timeout_ms)
{
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    while (!strstr(h->text, needle)) {
        struct pollfd p = {.fd = h->out, .events = POLLIN};
        int left = fb_ms_left(deadline);
        if (left == 0)
            TH_FAIL("no \"%s\" in %d ms; the helper said: %s", needle,
                    timeout_ms, h->text);
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t n = read(h->out, h->text + h->len,
                         sizeof h->text - 1 - h->len);
        if (n <= 0)
            TH_FAIL("the helper ended without \"%s\"; it said: %s", needle,
                    h->text);
        h->len += (size_t)n;
        h->text[h->len] = '\0';
    }
}

/* Waits for it to end; returns its wait status, all its output read. */
static int helper_wait(struct helper *h)
{
    for (;;) {
        ssize_t n = read(h->out, h->text + h->len,
                         sizeof h->text - 1 - h->len);
        if (n <= 0)
            break;
        h->len += (size_t)n;
        h->text[h->len] = '\0';
    }
    close(h->out);
    int status = 0;
    CHECK(waitpid(h->pid, &status, 0) == h->pid);
    return status;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static pthread_t main_thread;
static atomic_int cb_calls, cb_done;

/* Says where it ran, proves that it may call fiber (a pool task), and
 * when asked blocks for good. */
static void say_stop(void *user, int sig)
{
    int block = user != NULL;
    atomic_fetch_add(&cb_calls, 1);
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 1};
    int x = 14, y = 0;
    fiber_buf out = {0};
    int rc = fiber_pool_create(&p, &o);
    if (rc == 0)
        rc = fiber_pool_apply(p, "triple", &x, sizeof x, &out);
    if (rc == 0 && out.len == sizeof y)
        memcpy(&y, out.data, sizeof y);
    fiber_buf_free(&out);
    if (rc == 0)
        fiber_pool_free(p);
    printf("cb sig=%d thread=%s pool=%d calls=%d\n", sig,
           pthread_equal(pthread_self(), main_thread) ? "main" : "other", y,
           atomic_load(&cb_calls));
    fflush(stdout);
    while (block)
        sleep_ms(1000);
    atomic_store(&cb_done, 1);
}

/* Arms the event, says ready, and reports the flag once it turns. */
static void armed_master(int block)
{
    main_thread = pthread_self();
    CHECK_OK(fiber_on_stop_requested(say_stop, block ? "block" : NULL));
    printf("ready flag=%d\n", fiber_stop_requested());
    fflush(stdout);
    for (int i = 0; i < 3000 && !fiber_stop_requested(); i++)
        sleep_ms(10);
    printf("flag=%d\n", fiber_stop_requested());
    fflush(stdout);
    for (int i = 0; i < 3000 && !atomic_load(&cb_done); i++)
        sleep_ms(10);
    sleep_ms(300); /* room for a second callback that must not come */
    printf("done calls=%d\n", atomic_load(&cb_calls));
    fflush(stdout);
}

TEST(helper_armed) { armed_master(0); }
TEST(helper_armed_blocking) { armed_master(1); }

TEST(helper_unarmed)
{
    printf("ready\n");
    fflush(stdout);
    sleep_ms(30000);
}

TEST(helper_resumed)
{
    printf("resumed=%d\n", fiber_resumed());
    fflush(stdout);
}

static void slow_stop(void *user, int sig)
{
    FB_UNUSED(user);
    FB_UNUSED(sig);
    sleep_ms(500);
    printf("slow callback finished\n");
    fflush(stdout);
}

/* Returns from main as soon as the flag turns: exit() must wait for the
 * callback that is still running. */
TEST(helper_exits_during_callback)
{
    CHECK_OK(fiber_on_stop_requested(slow_stop, NULL));
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 3000 && !fiber_stop_requested(); i++)
        sleep_ms(10);
    printf("main returns\n");
    fflush(stdout);
    exit(0);
}

/* A master of `fiber run --requeue`: it ends once its callback returns,
 * with its jobs stopped, while its main thread still works. */
static void saved_then_return(void *user, int sig)
{
    FB_UNUSED(user);
    printf("checkpoint saved (signal %d)\n", sig); /* no fflush: fiber's */
}

TEST(helper_requeued_master)
{
    CHECK_OK(fiber_on_stop_requested(saved_then_return, NULL));
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 1};
    CHECK_OK(fiber_pool_create(&p, &o));
    int x = 2;
    fiber_buf out = {0};
    CHECK_OK(fiber_pool_apply(p, "triple", &x, sizeof x, &out));
    fiber_buf_free(&out);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 3000; i++) {
        if (fiber_pool_apply(p, "triple", &x, sizeof x, NULL) != 0)
            break; /* the shutdown under way */
        sleep_ms(10);
    }
    printf("main loop ended\n");
}

/* ---- cases ------------------------------------------------------------- */

TEST(unarmed_signals_end_the_program_as_before)
{
    int sigs[] = {SIGTERM, SIGUSR1};
    for (int i = 0; i < 2; i++) {
        struct helper h;
        helper_start(&h, "helper_unarmed", NULL);
        helper_expect(&h, "ready", 10000);
        CHECK(kill(h.pid, sigs[i]) == 0);
        int status = helper_wait(&h);
        CHECK(WIFSIGNALED(status));
        CHECK_EQ(WTERMSIG(status), sigs[i]);
    }
}

TEST(sigterm_runs_the_callback_on_another_thread_once)
{
    struct helper h;
    helper_start(&h, "helper_armed", NULL);
    helper_expect(&h, "ready flag=0", 10000);
    CHECK(kill(h.pid, SIGTERM) == 0);
    helper_expect(&h, "flag=15", 10000);
    helper_expect(&h, "cb sig=15 thread=other pool=42 calls=1", 30000);
    int status = helper_wait(&h);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        TH_FAIL("helper status %d: %s", status, h.text);
    CHECK_EQ(count_of(h.text, "cb sig="), 1);
    CHECK_CONTAINS(h.text, "done calls=1");
}

TEST(usr1_requests_the_stop_and_later_usr1s_are_ignored)
{
    struct helper h;
    helper_start(&h, "helper_armed", NULL);
    helper_expect(&h, "ready flag=0", 10000);
    for (int i = 0; i < 3; i++)
        CHECK(kill(h.pid, SIGUSR1) == 0);
    helper_expect(&h, "cb sig=10 thread=other pool=42 calls=1", 30000);
    CHECK(kill(h.pid, SIGUSR1) == 0);
    int status = helper_wait(&h);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        TH_FAIL("helper status %d: %s", status, h.text);
    CHECK_EQ(count_of(h.text, "cb sig="), 1);
    CHECK_CONTAINS(h.text, "flag=10");
    CHECK_CONTAINS(h.text, "done calls=1");
}

TEST(a_second_sigterm_ends_the_program_during_the_callback)
{
    struct helper h;
    helper_start(&h, "helper_armed_blocking", NULL);
    helper_expect(&h, "ready flag=0", 10000);
    CHECK(kill(h.pid, SIGTERM) == 0);
    helper_expect(&h, "cb sig=15 thread=other", 30000); /* now blocked */
    CHECK(kill(h.pid, SIGTERM) == 0);
    int status = helper_wait(&h);
    CHECK(WIFSIGNALED(status));
    CHECK_EQ(WTERMSIG(status), SIGTERM);
    CHECK(!strstr(h.text, "done calls"));
}

TEST(usr1_then_sigterm_ends_the_program)
{
    struct helper h;
    helper_start(&h, "helper_armed_blocking", NULL);
    helper_expect(&h, "ready flag=0", 10000);
    CHECK(kill(h.pid, SIGUSR1) == 0);
    helper_expect(&h, "cb sig=10", 30000);
    CHECK(kill(h.pid, SIGTERM) == 0); /* Slurm's, at the time limit */
    int status = helper_wait(&h);
    CHECK(WIFSIGNALED(status));
    CHECK_EQ(WTERMSIG(status), SIGTERM);
}

TEST(exit_waits_for_a_running_callback)
{
    struct helper h;
    helper_start(&h, "helper_exits_during_callback", NULL);
    helper_expect(&h, "ready", 10000);
    CHECK(kill(h.pid, SIGTERM) == 0);
    int status = helper_wait(&h);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        TH_FAIL("helper status %d: %s", status, h.text);
    CHECK_CONTAINS(h.text, "main returns");
    CHECK_CONTAINS(h.text, "slow callback finished");
}

static void count_late(void *user, int sig)
{
    int *where = user;
    *where = pthread_equal(pthread_self(), main_thread) ? sig : -sig;
}

TEST(late_callback_runs_at_once_and_limits_hold)
{
    main_thread = pthread_self();
    CHECK_EQ(fiber_stop_requested(), 0);
    /* In a child job there is no stop event. */
    fiber_pool *p;
    fiber_pool_opts o = {.workers = 1};
    CHECK_OK(fiber_pool_create(&p, &o));
    fiber_buf out = {0};
    CHECK_OK(fiber_pool_apply(p, "arm_in_child", NULL, 0, &out));
    int child_rc;
    CHECK_EQ(out.len, sizeof child_rc);
    memcpy(&child_rc, out.data, sizeof child_rc);
    CHECK_EQ(child_rc, FIBER_ENOTSUP);
    fiber_buf_free(&out);
    fiber_pool_free(p);
    /* At most 16 callbacks. */
    static int seen[17];
    for (int i = 0; i < 16; i++)
        CHECK_OK(fiber_on_stop_requested(count_late, &seen[i]));
    CHECK_ERR(fiber_on_stop_requested(count_late, &seen[16]), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "at most 16");
    CHECK_OK(fiber_on_stop_requested(NULL, NULL)); /* arming only: fine */
    /* Once the event has passed, a new callback runs here and now. */
    CHECK(kill(getpid(), SIGUSR1) == 0);
    for (int i = 0; i < 500 && !fiber_stop_requested(); i++)
        sleep_ms(10);
    CHECK_EQ(fiber_stop_requested(), SIGUSR1);
    for (int i = 0; i < 500 && seen[15] == 0; i++)
        sleep_ms(10); /* the stop thread delivers to the 16, in order */
    for (int i = 0; i < 16; i++)
        CHECK_EQ(seen[i], -SIGUSR1); /* on the stop thread */
    CHECK_EQ(seen[16], 0);
    int where = 0;
    CHECK_ERR(fiber_on_stop_requested(count_late, &where), 0);
    CHECK_EQ(where, SIGUSR1);
}

TEST(resumed_count_comes_from_the_environment)
{
    struct {
        const char *env[3];
        const char *want;
    } cases[] = {
        {{NULL}, "resumed=0"},
        {{"FIBER_RESUMED=3", NULL}, "resumed=3"},
        {{"SLURM_RESTART_COUNT=2", NULL}, "resumed=2"},
        {{"FIBER_RESUMED=4", "SLURM_RESTART_COUNT=2", NULL}, "resumed=4"},
        {{"SLURM_RESTART_COUNT=junk", NULL}, "resumed=0"},
    };
    for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
        struct helper h;
        helper_start(&h, "helper_resumed", cases[i].env);
        int status = helper_wait(&h);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK_CONTAINS(h.text, cases[i].want);
    }
    /* A bad count is a configuration error naming the key. */
    struct helper h;
    const char *bad[] = {"FIBER_RESUMED=twice", NULL};
    helper_start(&h, "helper_resumed", bad);
    int status = helper_wait(&h);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    CHECK_CONTAINS(h.text, "FIBER_RESUMED");
    CHECK_EQ(fiber_resumed(), 0); /* this master was never restarted */
}

TEST(a_requeued_master_ends_with_75_once_its_callback_returns)
{
    struct helper h;
    const char *env[] = {"FIBER_BOOT_REQUEUE=1", NULL};
    helper_start(&h, "helper_requeued_master", env);
    helper_expect(&h, "ready", 30000);
    CHECK(kill(h.pid, SIGUSR1) == 0);
    int status = helper_wait(&h);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != FIBER_EXIT_REQUEUE)
        TH_FAIL("helper status %d, want exit %d: %s", status,
                FIBER_EXIT_REQUEUE, h.text);
    CHECK_CONTAINS(h.text, "checkpoint saved (signal 10)");
    CHECK(!strstr(h.text, "main loop ended"));
    /* Without the variable the same master just goes on. */
    helper_start(&h, "helper_armed", NULL);
    helper_expect(&h, "ready flag=0", 10000);
    CHECK(kill(h.pid, SIGUSR1) == 0);
    status = helper_wait(&h);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TH_MAIN()
