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
 * holds each until it proves itself with HELLO (the run's token, compared
 * in constant time, and the program's build id) or drops it, logging why;
 * hands authenticated connections to their job's owner; notices ended jobs
 * (the backend's event descriptor, or polling) and reaps them; turns
 * SIGTERM into SIGKILL when a terminated job outlives its grace period.
 *
 * It holds the runtime lock except while it waits in epoll_wait.  Events
 * name jobs by id, not by pointer, so a job forgotten while the thread
 * waited is simply not found.
 */
#include <errno.h>
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

#include <sodium.h>

#include "core/addr.h"
#include "core/common.h"
#include "core/log.h"
#include "core/runtime.h"
#include "core/stats_srv.h"

#define EV_LISTEN 1u
#define EV_WAKE 2u
#define EV_PENDING 3u
#define EV_CONN 4u
#define EV_JOBEV 5u
#define EV_KIND(d) ((unsigned)((d)&7u))
#define EV_JOB(id, kind) (((uint64_t)(id) << 3) | (kind))

/* A connection that has not yet proved itself.  Its frames may be at most
 * this big: HELLO is under 200 bytes. */
#define PENDING_MAX_PAYLOAD 1024u
/* A burst of connections over max_pending_connections ends after this
 * long without one. */
#define BURST_QUIET_MS 1000
#define POLL_INTERVAL_MS 100

struct fb_pending {
    struct fb_conn conn;
    uint64_t deadline_ms;
    struct fb_pending *prev, *next;
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
        ep_del(j->conn.fd);
}

/* ---- unauthenticated peers -------------------------------------------- */

static void pending_unlink(struct fb_pending *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        R->pending = p->next;
    if (p->next)
        p->next->prev = p->prev;
    R->n_pending--;
}

/* Drops a peer that failed to prove itself; why goes to the log. */
static void drop_pending(struct fb_pending *p, const char *why)
{
    fb_log_warn("dropping peer on fd %d: %s", p->conn.fd, why);
    R->dropped_peers++;
    ep_del(p->conn.fd);
    pending_unlink(p);
    fb_conn_close(&p->conn);
    free(p);
}

/* Tells the peer why it is refused (best effort: one non-blocking write of
 * a small frame), then drops it. */
static void reject_pending(struct fb_pending *p, const char *why)
{
    if (fb_wire_put_reject(&p->conn.out, why, strlen(why)) == 0)
        fb_conn_flush(&p->conn);
    drop_pending(p, why);
}

/* Makes room for a new connection when max_pending_connections others
 * wait to prove themselves: the one that has waited longest is closed.
 * (A child sends HELLO within milliseconds of connecting, so under a
 * flood of silent or slow strangers it is a stranger that goes; refusing
 * the newcomer instead would lock every new child out for as long as the
 * strangers' connect_timeout_ms.)  Logged once per burst, and once more
 * when the burst is over (end_refusal_burst): BURST_QUIET_MS without
 * another. */
static void evict_oldest_pending(void)
{
    struct fb_pending *old = R->pending;
    while (old && old->next)
        old = old->next;
    if (!old)
        return;
    if (R->burst_refused++ == 0)
        fb_log_warn("%d connections are waiting to authenticate "
                    "(max_pending_connections): closing the oldest to make "
                    "room for new ones",
                    R->n_pending);
    R->refused_peers++;
    R->dropped_peers++;
    R->burst_last_ms = fb_now_ms();
    ep_del(old->conn.fd);
    pending_unlink(old);
    fb_conn_close(&old->conn);
    free(old);
}

/* Returns when the current burst ends (UINT64_MAX: none), logging its
 * end if that is now. */
static uint64_t end_refusal_burst(uint64_t now)
{
    if (R->burst_refused == 0)
        return UINT64_MAX;
    if (now < R->burst_last_ms + BURST_QUIET_MS)
        return R->burst_last_ms + BURST_QUIET_MS;
    fb_log_warn("no longer over max_pending_connections; closed %llu "
                "waiting connections to make room",
                (unsigned long long)R->burst_refused);
    R->burst_refused = 0;
    return UINT64_MAX;
}

uint64_t fb_rt_refused_peers(void)
{
    R = fb_rt();
    fb_rt_lock();
    uint64_t n = R->refused_peers;
    fb_rt_unlock();
    return n;
}

static void accept_peers(void)
{
    for (int i = 0; i < 64; i++) {
        int fd;
        int rc = fb_sock_accept(R->listen_fd, &fd);
        if (rc == 1)
            return;
        if (rc != 0) {
            /* Out of descriptors: make room by dropping the oldest
             * stranger rather than spinning on a readable listener. */
            fb_log_error("accept failed: %s", fiber_last_error());
            struct fb_pending *old = R->pending;
            while (old && old->next)
                old = old->next;
            if (old)
                drop_pending(old, "descriptor limit reached");
            return;
        }
        while (R->pending &&
               R->n_pending >= R->cfg.max_pending_connections)
            evict_oldest_pending();
        struct fb_pending *p = calloc(1, sizeof *p);
        if (!p) {
            close(fd);
            return;
        }
        fb_conn_init(&p->conn, fd, PENDING_MAX_PAYLOAD);
        p->deadline_ms = fb_now_ms() + (uint64_t)R->cfg.connect_timeout_ms;
        if (fb_conn_secure_for(&p->conn, R->address, FB_SEC_SERVER,
                               R->token) != 0 ||
            ep_add(fd, EPOLLIN, (uint64_t)(uintptr_t)p | EV_PENDING) != 0) {
            fb_conn_close(&p->conn);
            free(p);
            continue;
        }
        p->next = R->pending;
        if (R->pending)
            R->pending->prev = p;
        R->pending = p;
        R->n_pending++;
    }
}

/* The peer proved itself: its connection becomes the job's. */
static void adopt(struct fb_pending *p, struct fb_jobrec *j)
{
    pending_unlink(p);
    j->conn = p->conn;
    j->conn.max_payload = R->cfg.max_message_bytes;
    free(p);
    j->connected = j->ever_connected = 1;
    struct fb_msg_welcome w = {
        .heartbeat_ms = (uint32_t)R->cfg.heartbeat_ms};
    fb_wire_put_welcome(&j->conn.out, &w);
    if (j->ops->takes_conn) {
        ep_del(j->conn.fd);
        j->ops->connected(j); /* the owner now has the connection */
        j->connected = 0;
        memset(&j->conn, 0, sizeof j->conn);
        j->conn.fd = -1;
    } else {
        ep_mod(j->conn.fd, EPOLLIN, EV_JOB(j->id, EV_CONN));
        j->ops->connected(j);
        fb_rt_kick(j);
    }
    fb_log_debug("job %llu '%s' connected", (unsigned long long)j->id,
                 j->name);
    pthread_cond_broadcast(&R->changed);
}

static void check_hello(struct fb_pending *p, const struct fb_wire_hdr *h,
                        const uint8_t *payload)
{
    char why[512];
    struct fb_msg_hello m;
    if (h->type != FB_MSG_HELLO) {
        snprintf(why, sizeof why, "first message was %s, not HELLO",
                 fb_msg_type_name(h->type));
        drop_pending(p, why);
        return;
    }
    fb_wire_get_hello(payload, h->len, &m, NULL, 0);
    if (sodium_memcmp(m.token, R->token, sizeof R->token) != 0) {
        reject_pending(p, "authentication failed: wrong token");
        return;
    }
    if (m.job_id == FB_MONITOR_JOB_ID) { /* fiber top: core/stats_srv.c */
        pending_unlink(p);
        fb_stats_adopt(&p->conn);
        free(p);
        return;
    }
    struct fb_jobrec *j = fb_rt_find_job(m.job_id);
    if (!j || j->ever_connected || j->ended) {
        snprintf(why, sizeof why, "job %llu is unknown or already connected",
                 (unsigned long long)m.job_id);
        reject_pending(p, why);
        return;
    }
    if (m.build_id_len != strlen(R->build_id) ||
        memcmp(m.build_id, R->build_id, m.build_id_len) != 0) {
        snprintf(why, sizeof why,
                 "job '%s' runs a different program (build id %.*s; the "
                 "master's is %s): every job must run the master's binary",
                 j->name, (int)m.build_id_len, m.build_id, R->build_id);
        fb_strlcpy(j->failure, why, sizeof j->failure);
        reject_pending(p, why);
        return;
    }
    adopt(p, j);
}

static void on_pending(struct fb_pending *p)
{
    int rc = fb_conn_read(&p->conn);
    if (rc == FIBER_ECLOSED && p->conn.in.len == 0) {
        /* Closed before saying anything: a job that was being stopped as
         * it dialed, most likely; not worth a warning. */
        fb_log_info("peer on fd %d closed before HELLO", p->conn.fd);
        R->dropped_peers++;
        ep_del(p->conn.fd);
        pending_unlink(p);
        fb_conn_close(&p->conn);
        free(p);
        return;
    }
    if (rc != 0) {
        drop_pending(p, p->conn.err);
        return;
    }
    struct fb_wire_hdr h;
    const uint8_t *payload;
    rc = fb_conn_next(&p->conn, &h, &payload);
    if (rc < 0)
        drop_pending(p, p->conn.err);
    else if (rc == 1)
        check_hello(p, &h, payload);
}

static void expire_pending(uint64_t now)
{
    struct fb_pending *p = R->pending, *next;
    for (; p; p = next) {
        next = p->next;
        if (now >= p->deadline_ms)
            drop_pending(p, "said nothing valid before connect_timeout_ms");
    }
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
    ep_del(j->conn.fd);
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
            conn_lost(j, j->conn.err);
            return;
        }
        if (rc == 0)
            ep_mod(j->conn.fd, EPOLLIN, EV_JOB(j->id, EV_CONN));
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
                     (unsigned long long)j->id, j->name, j->conn.err);
        conn_lost(j, j->conn.err);
        fb_rt_terminate(j);
        return;
    }
    if (rc != 0)
        conn_lost(j, j->conn.err);
    else if (j->conn.out_off < j->conn.out.len)
        ep_mod(j->conn.fd, EPOLLIN | EPOLLOUT, EV_JOB(j->id, EV_CONN));
}

/* Deadlines and polling; returns the epoll timeout until the next one. */
static int run_timers(void)
{
    uint64_t now = fb_now_ms();
    expire_pending(now);
    uint64_t next = end_refusal_burst(now);
    for (struct fb_pending *p = R->pending; p; p = p->next)
        if (p->deadline_ms < next)
            next = p->deadline_ms;
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
        if (j->connected && j->conn.out_off < j->conn.out.len)
            ep_mod(j->conn.fd, EPOLLIN | EPOLLOUT, EV_JOB(j->id, EV_CONN));
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
    snprintf(path, sizeof path, "%s/master.lock", R->run_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0)
        fb_log_warn("cannot lock %s: fiber ps may misreport this run", path);
    snprintf(path, sizeof path, "%s/master.pid", R->run_dir);
    FILE *f = fopen(path, "we");
    if (f) {
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
    }
}

static int make_run_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60)
        tmp = "/tmp"; /* unix socket paths must stay under 108 bytes */
    char base[256];
    snprintf(base, sizeof base, "%s/fiber-%u", tmp, (unsigned)geteuid());
    int rc = fb_private_dir(base);
    if (rc)
        return rc;
    int n = snprintf(R->run_dir, sizeof R->run_dir, "%s/%s", base, R->run_id);
    if (n < 0 || (size_t)n >= sizeof R->run_dir)
        return fb_err(FIBER_ESYS, "run directory path is too long");
    rc = fb_private_dir(R->run_dir);
    if (rc) {
        R->run_dir[0] = '\0';
        return rc;
    }
    mark_alive();
    if (R->cfg.log_dir[0])
        n = snprintf(R->log_dir, sizeof R->log_dir, "%s/%s", R->cfg.log_dir,
                     R->run_id);
    else
        n = snprintf(R->log_dir, sizeof R->log_dir, "%s/logs", R->run_dir);
    if (n < 0 || (size_t)n >= sizeof R->log_dir)
        return fb_err(FIBER_ECONFIG, "log_dir '%s' is too long",
                      R->cfg.log_dir);
    return 0;
}

static int open_listener(void)
{
    char want[600];
    if (R->cfg.transport == FB_TRANSPORT_TCP)
        snprintf(want, sizeof want, "tcp:%s:0", R->cfg.listen_host);
    else
        snprintf(want, sizeof want, "unix:%s/master.sock", R->run_dir);
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

static int start_thread(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&R->service_thread, NULL, service_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        errno = err;
        return fb_err_errno(FIBER_ESYS, "cannot start the service thread");
    }
    return 0;
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
        rc = fb_backend_open(&R->backend, R->cfg.backend, &R->cfg);
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
    if (rc == 0)
        rc = start_thread();
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
    while (R->pending) {
        struct fb_pending *p = R->pending;
        pending_unlink(p);
        fb_conn_close(&p->conn);
        free(p);
    }
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
