/*
 * stop.c -- the stop event: the cluster's warning that the master is about
 * to be ended (a Slurm time limit or pre-emption, a Kubernetes pod's
 * termination), turned into one callback and a flag (fiber.h: "Stop
 * requests and resumption").
 *
 * Until the program calls fiber_on_stop_requested(), nothing here runs and
 * SIGTERM and SIGUSR1 keep their default actions.  The first call arms it:
 * a pipe, handlers for SIGTERM and SIGUSR1, and the stop thread.
 *
 * The handler does only async-signal-safe things: on the first stop signal
 * it records the signal, puts SIGTERM back to its default action (so that
 * a second SIGTERM ends the program, as it always did) and writes the
 * signal's number to the pipe.  Later signals do nothing more (a later
 * SIGTERM never reaches it: its default action ends the program).
 *
 * With FIBER_BOOT_REQUEUE=1 (`fiber run --requeue`) the stop thread ends
 * the master after the callbacks, with FIBER_EXIT_REQUEUE.
 *
 * Who owns the stop thread: this file.  It starts when the program arms
 * the event, with every signal blocked (so signals go to the program's own
 * threads), and waits on the pipe.  When a signal's byte arrives it calls
 * the callbacks in the order they were registered, without any lock held,
 * so they may call any fiber function, and ends.  fiber_shutdown() stops
 * it (a zero byte) and joins it, unless fiber_shutdown() runs on the stop
 * thread itself (a callback that exits), which then detaches it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"
#include "runtime/runtime.h"

#define MAX_STOP_CALLBACKS 16

struct stop_cb {
    fiber_stop_fn fn;
    void *user;
};

static struct {
    pthread_mutex_t mu;
    int armed;
    int pipe_rd, pipe_wr;
    pthread_t thread;
    int thread_running;
    int delivered; /* the callbacks have run (or are running) */
    struct stop_cb cbs[MAX_STOP_CALLBACKS];
    int n_cbs;
} st = {.mu = PTHREAD_MUTEX_INITIALIZER, .pipe_rd = -1, .pipe_wr = -1};

static volatile sig_atomic_t stop_signal; /* 0, or the first stop signal */
static volatile sig_atomic_t stop_pipe_wr = -1;

static void on_stop_signal(int sig)
{
    int saved = errno;
    if (!stop_signal) {
        stop_signal = sig;
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGTERM, &dfl, NULL);
        unsigned char b = (unsigned char)sig;
        if (stop_pipe_wr >= 0 && write(stop_pipe_wr, &b, 1) < 0) {
            /* The pipe holds at most one byte of ours: cannot be full. */
        }
    }
    errno = saved;
}

static int requeue_mode(void)
{
    const char *requeue = getenv("FIBER_BOOT_REQUEUE");
    return requeue && strcmp(requeue, "1") == 0;
}

static void run_callbacks(int sig)
{
    pthread_mutex_lock(&st.mu);
    st.delivered = 1;
    struct stop_cb cbs[MAX_STOP_CALLBACKS];
    int n = st.n_cbs;
    memcpy(cbs, st.cbs, sizeof cbs);
    pthread_mutex_unlock(&st.mu);
    fb_log_info("stop requested by signal %d (%s): running %d stop "
                "callback%s",
                sig, sig == SIGTERM ? "SIGTERM" : "SIGUSR1", n,
                n == 1 ? "" : "s");
    for (int i = 0; i < n; i++)
        if (cbs[i].fn)
            cbs[i].fn(cbs[i].user, sig);
    if (requeue_mode()) {
        /* The run goes on in a requeued master: end this one now, with
         * the status the backend's script requeues on. */
        fb_log_info("stop callbacks done: ending the master to be "
                    "requeued (exit status %d)", FIBER_EXIT_REQUEUE);
        fflush(NULL);
        fiber_shutdown();
        fflush(NULL);
        _exit(FIBER_EXIT_REQUEUE);
    }
}

static void *stop_main(void *arg)
{
    FB_UNUSED(arg);
    unsigned char b = 0;
    for (;;) {
        ssize_t n = read(st.pipe_rd, &b, 1);
        if (n == 1)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        return NULL; /* the pipe broke: nothing will arrive */
    }
    if (b != 0)
        run_callbacks((int)b);
    return NULL;
}

/* Creates the pipe, the thread and the handlers; st.mu held. */
static int arm(void)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return fb_err_errno(FIBER_ESYS, "cannot arm the stop event: pipe");
    st.pipe_rd = fds[0];
    st.pipe_wr = fds[1];
    stop_pipe_wr = fds[1];
    int rc = fb_thread_start(&st.thread, stop_main, NULL, "the stop thread");
    if (rc) {
        stop_pipe_wr = -1;
        close(fds[0]);
        close(fds[1]);
        st.pipe_rd = st.pipe_wr = -1;
        return rc;
    }
    st.thread_running = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    st.armed = 1;
    return 0;
}

FIBER_API int fiber_on_stop_requested(fiber_stop_fn fn, void *user)
{
    if (fiber_is_master() != 1)
        return fb_err(fiber_is_master() < 0 ? FIBER_ENOTINIT : FIBER_ENOTSUP,
                      "fiber_on_stop_requested: %s",
                      fiber_is_master() < 0
                          ? "call fiber_init() first"
                          : "only the master has a stop event");
    pthread_mutex_lock(&st.mu);
    int rc = 0;
    int late = fn && st.delivered;
    if (fn && !late && st.n_cbs == MAX_STOP_CALLBACKS)
        rc = fb_err(FIBER_EINVAL,
                    "fiber_on_stop_requested: at most %d callbacks",
                    MAX_STOP_CALLBACKS);
    if (rc == 0 && !st.armed)
        rc = arm();
    late = late && rc == 0;
    if (rc == 0 && fn && !late) {
        st.cbs[st.n_cbs].fn = fn;
        st.cbs[st.n_cbs++].user = user;
    }
    pthread_mutex_unlock(&st.mu);
    if (late)
        fn(user, (int)stop_signal); /* the event has passed: now, here */
    return rc;
}

FIBER_API int fiber_stop_requested(void) { return (int)stop_signal; }

void fb_stop_shutdown(void)
{
    pthread_mutex_lock(&st.mu);
    int running = st.thread_running;
    st.thread_running = 0;
    pthread_t t = st.thread;
    if (running && !stop_signal && st.pipe_wr >= 0) {
        unsigned char zero = 0;
        if (write(st.pipe_wr, &zero, 1) < 0) {
            /* cannot be full */
        }
    }
    pthread_mutex_unlock(&st.mu);
    if (!running)
        return;
    if (pthread_equal(t, pthread_self()))
        pthread_detach(t); /* a callback ended the program */
    else
        pthread_join(t, NULL);
    /* From here on the signals end the program again, as they did before
     * it armed the event.  The pipe stays open: a handler may be running
     * on another thread right now. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGUSR1, &dfl, NULL);
}

/* fiber_shutdown() found another thread shutting down.  In a requeueable
 * master whose stop callbacks run (or ran) on the stop thread, that
 * thread ends the process with FIBER_EXIT_REQUEUE once they return; the
 * program's own exit (its loop saw fiber_stop_requested() and returned)
 * must not end it first with another status, which would not be
 * requeued.  So any other thread waits here for that end. */
void fb_stop_await_requeue_exit(void)
{
    pthread_mutex_lock(&st.mu);
    int wait = st.delivered && requeue_mode() &&
               !pthread_equal(st.thread, pthread_self());
    pthread_mutex_unlock(&st.mu);
    if (!wait)
        return;
    fflush(NULL);
    for (;;)
        pause(); /* the stop thread calls _exit(FIBER_EXIT_REQUEUE) */
}

FIBER_API int fiber_resumed(void)
{
    if (fiber_is_master() != 1)
        return 0;
    int n = fb_rt_config()->resumed;
    return n ? n : fb_backend_restarts();
}
