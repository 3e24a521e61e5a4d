/*
 * service.c -- the master's service thread.
 *
 * Who owns it: the runtime.  It starts with the master's first job
 * (fb_service_start) and stops in fiber_shutdown() (fb_service_stop), which
 * joins it.  It runs with every signal blocked, so the program's signal
 * handlers always run on the program's own threads.
 *
 * What it does: accepts connections on the run's listening socket (at
 * most max_pending_connections unauthenticated at once: the oldest makes
 * room; over TCP with `encryption` on, each is encrypted: net/secure.c);
 * holds each in its gate (net/gate.h) until it proves itself with HELLO
 * (the run's token, compared in constant time, and the program's build
 * id) for a job that has not connected yet, or drops it, logging why;
 * hands authenticated connections to their job's owner; notices ended jobs
 * (the backend's event descriptor, or polling) and reaps them; turns
 * SIGTERM into SIGKILL when a terminated job outlives its grace period.
 *
 * It holds the runtime lock except while it waits in epoll_wait.  Events
 * name jobs by id, not by pointer, so a job forgotten while the thread
 * waited is simply not found.
 */
#include <errno.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"
#include "runtime/addr.h"
#include "runtime/runtime.h"
#include "runtime/stats_srv.h"

#define EV_LISTEN 1u
#define EV_WAKE 2u
#define EV_PENDING 3u
#define EV_CONN 4u
#define EV_JOBEV 5u
#define EV_KIND(d) ((unsigned)((d)&7u))
#define EV_JOB(id, kind) (((uint64_t)(id) << 3) | (kind))

#define POLL_INTERVAL_MS 100

/* A connection that has not yet proved itself (net/gate.h). */
struct fb_pending {
    struct fb_conn conn;
    struct fb_gate_peer peer;
};

static struct fb_runtime *R;

/* ---- epoll helpers ---------------------------------------------------- */

static int ep_add(int fd, uint32_t events, uint64_t data)
{
    struct epoll_event ev = {.events = events, .data.u64 = data};
    if (epoll_ctl(R->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return fb_err_errno(FIBER_ESYS, "epoll_ctl(ADD)");
    return 0;
}

static void ep_mod(int fd, uint32_t events, uint64_t data)
{
    struct epoll_event ev = {.events = events, .data.u64 = data};
    epoll_ctl(R->epoll_fd, EPOLL_CTL_MOD, fd, &ev);
}

static void ep_del(int fd)
{
    if (fd >= 0 && R->epoll_fd >= 0)
        epoll_ctl(R->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
}

void fb_service_wake(void)
{
    uint64_t one = 1;
    if (R && R->wake_fd >= 0 && write(R->wake_fd, &one, sizeof one) < 0) {
        /* The counter is saturated, so the thread is already awake. */
    }
}

/* ---- job registration ------------------------------------------------- */

int fb_service_watch_job(struct fb_jobrec *j)
{
    int fd = fb_backend_event_fd(R->backend, j->job);
    if (fd < 0) {
        R->n_polled_jobs++;
        return 0;
    }
    int rc = ep_add(fd, EPOLLIN, EV_JOB(j->id, EV_JOBEV));
    if (rc == 0)
        j->event_fd = fd;
    return rc;
}

void fb_service_unwatch_job(struct fb_jobrec *j)
{
    if (j->event_fd >= 0) {
        ep_del(j->event_fd);
        j->event_fd = -1;
    } else if (j->job && !j->ended && R->n_polled_jobs > 0) {
        R->n_polled_jobs--;
    }
    if (j->connected)
        ep_del(fb_conn_fd(&j->conn));
}

/* ---- unauthenticated peers -------------------------------------------- */

static struct fb_pending *pending_of(struct fb_gate_peer *p)
{
    return (struct fb_pending *)((char *)p - offsetof(struct fb_pending, peer));
}

/* The gate's close function: the peer is out of the gate already. */
static void close_pending(struct fb_gate_peer *peer, void *arg)
{
    FB_UNUSED(arg);
    struct fb_pending *p = pending_of(peer);
    ep_del(fb_conn_fd(&p->conn));
    fb_conn_close(&p->conn);
    free(p);
}

/* Reads one of the gate's counters under the runtime lock. */
static uint64_t gate_count(const uint64_t *counter)
{
    fb_rt_lock();
    uint64_t n = *counter;
    fb_rt_unlock();
    return n;
}

uint64_t fb_rt_dropped_peers(void)
{
    return gate_count(&fb_rt()->gate.dropped);
}

uint64_t fb_rt_refused_peers(void)
{
    return gate_count(&fb_rt()->gate.refused);
}

static void accept_peers(void)
{
    int room = fb_gate_room(&R->gate);
    for (int i = 0; i < room; i++) {
        int fd;
        int rc = fb_sock_accept(R->listen_fd, &fd);
        if (rc == 1)
            return;
        if (rc != 0) {
            /* Out of descriptors: make room by dropping the oldest
             * stranger rather than spinning on a readable listener. */
            fb_log_error("accept failed: %s", fiber_last_error());
            fb_gate_drop_oldest(&R->gate, "descriptor limit reached");
            return;
        }
        struct fb_pending *p = calloc(1, sizeof *p);
        if (!p) {
            close(fd);
            return;
        }
        fb_conn_init(&p->conn, fd, FB_GATE_HELLO_MAX);
        if (fb_conn_secure_for(&p->conn, R->address, FB_SEC_SERVER,
                               R->token) != 0 ||
            ep_add(fd, EPOLLIN, (uint64_t)(uintptr_t)p | EV_PENDING) != 0) {
            fb_conn_close(&p->conn);
            free(p);
            continue;
        }
        fb_gate_add(&R->gate, &p->peer, &p->conn);
    }
}

/* The peer proved itself: its connection becomes the job's. */
static void adopt(struct fb_pending *p, struct fb_jobrec *j)
{
    fb_gate_admit(&R->gate, &p->peer);
    j->conn = p->conn;
    fb_conn_set_max_payload(&j->conn, R->cfg.max_message_bytes);
    free(p);
    j->connected = j->ever_connected = 1;
    struct fb_msg_welcome w = {
        .heartbeat_ms = (uint32_t)R->cfg.heartbeat_ms};
    fb_wire_put_welcome(fb_conn_out(&j->conn), &w);
    if (j->ops->takes_conn) {
        ep_del(fb_conn_fd(&j->conn));
        j->ops->connected(j); /* the owner now has the connection */
        j->connected = 0;
        memset(&j->conn, 0, sizeof j->conn); /* moved: closed, not ours */
    } else {
        ep_mod(fb_conn_fd(&j->conn), EPOLLIN, EV_JOB(j->id, EV_CONN));
        j->ops->connected(j);
        fb_rt_kick(j);
    }
    fb_log_debug("job %llu '%s' connected", (unsigned long long)j->id,
                 j->name);
    pthread_cond_broadcast(&R->changed);
}

/* The gate's refused hook: a job whose HELLO names it but runs another
 * program learns why it could not connect (fiber_process's failure). */
static void note_refused(const struct fb_msg_hello *m, int fault,
                         const char *why, void *arg)
{
    FB_UNUSED(arg);
    struct fb_jobrec *j = fb_rt_find_job(m->job_id);
    if (fault == FB_HELLO_BUILD && j && !j->ever_connected && !j->ended)
        snprintf(j->failure, sizeof j->failure,
                 "job '%s' was %s: every job must run the master's binary",
                 j->name, why);
}

/* Reads what a pending peer sent: a HELLO with the run's token and build
 * id (net/gate.c) from a job that has not connected yet is adopted. */
static void on_pending(struct fb_pending *p)
{
    struct fb_msg_hello m;
    if (fb_gate_serve(&R->gate, &p->peer, R->token, R->build_id, &m) != 1)
        return;
    if (m.job_id == FB_MONITOR_JOB_ID) { /* fiber top: runtime/stats_srv.c */
        fb_gate_admit(&R->gate, &p->peer);
        fb_stats_adopt(&p->conn);
        free(p);
        return;
    }
    char why[512];
    struct fb_jobrec *j = fb_rt_find_job(m.job_id);
    if (!j || j->ever_connected || j->ended) {
        snprintf(why, sizeof why, "job %llu is unknown or already connected",
                 (unsigned long long)m.job_id);
        fb_gate_reject(&R->gate, &p->peer, why);
        return;
    }
    adopt(p, j);
}

/* ---- jobs ------------------------------------------------------------- */

static void poll_one(struct fb_jobrec *j)
{
    if (!j->job || j->ended)
        return;
    fb_backend_poll_job(R->backend, j->job);
    if (j->job->state == FB_JOB_EXITED)
        fb_rt_job_ended(j);
}

/* The child's connection ended or broke: the job is gone or going. */
static void conn_lost(struct fb_jobrec *j, const char *why)
{
    fb_log_debug("job %llu '%s': connection closed: %s",
                 (unsigned long long)j->id, j->name, why);
    ep_del(fb_conn_fd(&j->conn));
    fb_conn_close(&j->conn);
    j->connected = 0;
    poll_one(j);
}

static void on_conn(struct fb_jobrec *j, uint32_t events)
{
    if (!j->connected)
        return;
    if (events & EPOLLOUT) {
        int rc = fb_conn_flush(&j->conn);
        if (rc < 0) {
            conn_lost(j, fb_conn_err(&j->conn));
            return;
        }
        if (rc == 0)
            ep_mod(fb_conn_fd(&j->conn), EPOLLIN, EV_JOB(j->id, EV_CONN));
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    int rc = fb_conn_read(&j->conn);
    struct fb_wire_hdr h;
    const uint8_t *payload;
    int got;
    while ((got = fb_conn_next(&j->conn, &h, &payload)) == 1) {
        if (j->ops->message(j, &h, payload) != 0) {
            fb_log_error("job %llu '%s' sent an unexpected %s; terminating it",
                         (unsigned long long)j->id, j->name,
                         fb_msg_type_name(h.type));
            conn_lost(j, "protocol violation");
            fb_rt_terminate(j);
            return;
        }
    }
    if (got < 0) {
        fb_log_error("job %llu '%s': %s; terminating it",
                     (unsigned long long)j->id, j->name, fb_conn_err(&j->conn));
        conn_lost(j, fb_conn_err(&j->conn));
        fb_rt_terminate(j);
        return;
    }
    if (rc != 0)
        conn_lost(j, fb_conn_err(&j->conn));
    else if (fb_conn_unsent(&j->conn) > 0)
        ep_mod(fb_conn_fd(&j->conn), EPOLLIN | EPOLLOUT,
               EV_JOB(j->id, EV_CONN));
}

/* Deadlines and polling; returns the epoll timeout until the next one. */
static int run_timers(void)
{
    uint64_t now = fb_now_ms();
    uint64_t next = fb_gate_tick(&R->gate, now);
    struct fb_jobrec *j, *jn;
    for (j = R->jobs; j; j = jn) {
        jn = j->next;
        if (j->kill_at_ms && !j->ended) {
            if (now >= j->kill_at_ms) {
                fb_backend_signal_job(R->backend, j->job, 1);
                j->kill_at_ms = 0;
            } else if (j->kill_at_ms < next) {
                next = j->kill_at_ms;
            }
        }
        if (j->event_fd < 0)
            poll_one(j);
    }
    if (R->n_polled_jobs > 0 && now + POLL_INTERVAL_MS < next)
        next = now + POLL_INTERVAL_MS;
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)(next - now);
}

static void dispatch(const struct epoll_event *ev)
{
    uint64_t d = ev->data.u64;
    struct fb_jobrec *j;
    switch (EV_KIND(d)) {
    case EV_LISTEN:
        accept_peers();
        break;
    case EV_WAKE: {
        uint64_t n;
        if (read(R->wake_fd, &n, sizeof n) < 0) {
            /* EAGAIN: another wake was already consumed. */
        }
        break;
    }
    case EV_PENDING:
        on_pending((struct fb_pending *)(uintptr_t)(d & ~(uint64_t)7));
        break;
    case EV_CONN:
        if ((j = fb_rt_find_job(d >> 3)))
            on_conn(j, ev->events);
        break;
    case EV_JOBEV:
        if ((j = fb_rt_find_job(d >> 3)))
            poll_one(j);
        break;
    case FB_EV_MONITOR:
        fb_stats_on_event((void *)(uintptr_t)(d & ~(uint64_t)7), ev->events);
        break;
    }
}

/* Arms EPOLLOUT for connections whose owners queued more than one write
 * could take (fb_rt_kick woke us). */
static void arm_writers(void)
{
    for (struct fb_jobrec *j = R->jobs; j; j = j->next)
        if (j->connected && fb_conn_unsent(&j->conn) > 0)
            ep_mod(fb_conn_fd(&j->conn), EPOLLIN | EPOLLOUT,
                   EV_JOB(j->id, EV_CONN));
}

static void *service_main(void *arg)
{
    FB_UNUSED(arg);
    struct epoll_event evs[64];
    fb_rt_lock();
    while (!R->service_stop) {
        int timeout = run_timers();
        arm_writers();
        fb_rt_unlock();
        int n = epoll_wait(R->epoll_fd, evs, (int)FB_ARRAY_LEN(evs), timeout);
        fb_rt_lock();
        int listener = 0;
        for (int i = 0; i < n && !R->service_stop; i++) {
            if (EV_KIND(evs[i].data.u64) == EV_LISTEN)
                listener = 1;
            else
                dispatch(&evs[i]);
        }
        /* Accepting may close pending connections to make room, so it
         * comes after the events, which may name them. */
        if (listener && !R->service_stop)
            accept_peers();
    }
    fb_rt_unlock();
    return NULL;
}

/* ---- start and stop --------------------------------------------------- */


/* Marks the run directory as the live master's: master.lock is held
 * (flock) for the master's life, which the kernel ends even on SIGKILL,
 * and master.pid names it.  `fiber ps`, `kill` and `clean` read both.
 * The lock's descriptor stays open until the process exits. */
static void mark_alive(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", R->run_dir, FB_RUN_LOCKFILE);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0)
        fb_log_warn("cannot lock %s: fiber ps may misreport this run", path);
    snprintf(path, sizeof path, "%s/%s", R->run_dir, FB_RUN_PIDFILE);
    FILE *f = fopen(path, "we");
    if (f) {
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
    }
}

static int make_run_dir(void)
{
    char base[256];
    int rc = fb_run_base(base, sizeof base);
    if (rc == 0)
        rc = fb_private_dir(base);
    if (rc == 0)
        rc = fb_run_dir(R->run_id, R->run_dir, sizeof R->run_dir);
    if (rc == 0)
        rc = fb_private_dir(R->run_dir);
    if (rc) {
        R->run_dir[0] = '\0';
        return rc;
    }
    mark_alive();
    return fb_run_log_dir_of(R->run_id, R->run_dir, R->cfg.log_dir,
                             R->log_dir, sizeof R->log_dir);
}

static int open_listener(void)
{
    char want[600];
    if (R->cfg.transport == FB_TRANSPORT_TCP)
        snprintf(want, sizeof want, "tcp:%s:0", R->cfg.listen_host);
    else
        snprintf(want, sizeof want, "unix:%s/%s", R->run_dir, FB_RUN_SOCKET);
    int rc = fb_sock_listen(want, SOMAXCONN, &R->listen_fd, R->address,
                            sizeof R->address);
    if (rc == 0)
        fb_log_info("run %s listening on %s", R->run_id, R->address);
    return rc;
}

static int open_poller(void)
{
    R->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (R->epoll_fd < 0)
        return fb_err_errno(FIBER_ESYS, "epoll_create1");
    R->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (R->wake_fd < 0)
        return fb_err_errno(FIBER_ESYS, "eventfd");
    int rc = ep_add(R->listen_fd, EPOLLIN, EV_LISTEN);
    if (rc == 0)
        rc = ep_add(R->wake_fd, EPOLLIN, EV_WAKE);
    return rc;
}

static void close_fds(void)
{
    if (R->listen_fd >= 0)
        close(R->listen_fd);
    if (R->epoll_fd >= 0)
        close(R->epoll_fd);
    if (R->wake_fd >= 0)
        close(R->wake_fd);
    R->listen_fd = R->epoll_fd = R->wake_fd = -1;
}

int fb_service_start(void)
{
    R = fb_rt();
    if (R->service_running)
        return 0;
    int rc = 0;
    if (!R->backend)
        rc = fb_backend_open(&R->backend, R->cfg.backend, &R->cfg,
                             R->run_id);
    if (rc == 0)
        rc = fb_listen_host_resolve(&R->cfg, (R->backend->ops->caps &
                                              FB_CAP_LOOPBACK) != 0);
    if (rc == 0 && !(R->backend->ops->caps & FB_CAP_SAME_HOST) &&
        R->cfg.transport != FB_TRANSPORT_TCP) {
        /* Its jobs may not see this host's unix sockets: listen on TCP,
         * and so do object servers and managers (children inherit the
         * setting with the rest of the configuration). */
        fb_log_info("the %s backend cannot share unix sockets: using "
                    "transport tcp on %s",
                    R->backend->ops->name, R->cfg.listen_host);
        R->cfg.transport = FB_TRANSPORT_TCP;
    }
    if (rc == 0 && !R->run_dir[0])
        rc = make_run_dir();
    if (rc == 0 && R->listen_fd < 0)
        rc = open_listener();
    if (rc == 0 && R->epoll_fd < 0)
        rc = open_poller();
    if (rc == 0 && !R->gate.close) { /* once: its counters are the run's */
        fb_gate_init(&R->gate, "master", 0, 0, close_pending, NULL);
        R->gate.watchers = 1; /* fiber top: runtime/stats_srv.c */
        R->gate.on_refused = note_refused;
    }
    if (rc == 0)
        rc = fb_thread_start(&R->service_thread, service_main, NULL,
                             "the service thread");
    if (rc == 0)
        fb_stats_publish();
    if (rc) {
        close_fds();
        return rc;
    }
    R->service_running = 1;
    return 0;
}

void fb_service_stop(void)
{
    R = fb_rt();
    fb_rt_lock();
    int running = R->service_running;
    R->service_stop = 1;
    fb_rt_unlock();
    if (running) {
        fb_service_wake();
        pthread_join(R->service_thread, NULL);
    }
    fb_rt_lock();
    R->service_running = 0;
    fb_stats_stop();
    fb_gate_clear(&R->gate);
    close_fds();
    fb_rt_unlock();
}

const char *fb_rt_address(void)
{
    R = fb_rt();
    fb_rt_lock();
    if (!R->service_running && fb_service_start() != 0)
        R->address[0] = '\0';
    fb_rt_unlock();
    return R->address;
}
