/*
 * objclient.c -- the client side of object servers: one connection per
 * server per process, shared by every handle and thread; calls matched to
 * replies by id; futures for asynchronous calls; serialised handles; and
 * the master's own object server.
 *
 * Threads: a connection's lock guards its buffers and waiters.  The thread
 * that waits for a reply reads the socket itself (no helper thread) and
 * hands other threads' replies to them through the condition variable.
 * Waits spin adaptively (base/spin.h) before they block in poll(); on a
 * plaintext connection the spin is a loop of non-blocking recv()s into
 * the input buffer, so a reply caught while spinning costs one system
 * call.
 *
 * Writing: frames are appended to conn.out under the lock; one thread at a
 * time (`writing`) sends them, taking the whole buffer and writing it with
 * the lock released, so others keep appending meanwhile and their frames
 * go out in the writer's next round: one system call carries all the
 * frames that piled up.  Pipelined queue puts (fb_ocall_putn) may leave
 * their frame for the connection's flusher thread, started with the first
 * such put and stopped when the connection is released; it sends what is
 * pending as soon as it wakes, so nothing waits for a later call.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/spin.h"
#include "base/thread.h"
#include "future/future.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"

#define DIAL_TIMEOUT_MS 10000
#define SPIN_US 50          /* the longest spin before a wait blocks */
#define PUTN_MAX_ITEMS 4096 /* items coalesced into one pipelined put */
#define PUTN_MAX_BYTES (256u << 10)
#define STEADY_NS 20000 /* async calls closer than this are batched */

struct fb_owait {
    uint64_t id;
    int done;
    int abandoned; /* its future was freed before the reply came */
    struct fb_oresult res;
    char text[FB_WIRE_TEXT_MAX + 1]; /* failure text */
    struct fb_oclient *c;
    struct fb_owait *next;
    struct fb_ocredit *credit; /* a pipelined put: settles, then is freed */
    uint32_t n;                /* ... carrying this many items */
};

struct fb_oclient {
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    int refs;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct fb_conn conn;
    int dead;
    char dead_why[256];
    int reading;
    uint64_t seq;
    struct fb_owait *waits, *waits_tail; /* oldest first */
    struct fb_spin spin;
    int writing;        /* a thread is sending conn.out (see above) */
    fiber_buf spare;    /* the writer's buffer, swapped with conn.out */
    /* The pipelined put still in conn.out that later puts of the same
     * credit join (NULL: none): frame offset and waiter. */
    struct fb_owait *co_wait;
    size_t co_off;
    /* The flusher thread (pipelined puts). */
    pthread_t flusher;
    int has_flusher, fl_idle, fl_stop;
    pthread_cond_t fl_cond;
    uint64_t last_async_ns;
    struct fb_owait *hint; /* the waiter the last reply went to */
    struct fb_oclient *next;
};

static pthread_mutex_t clients_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fb_oclient *clients;

/* ---- results -------------------------------------------------------------- */

int fb_oresult_item(const struct fb_oresult *r, uint32_t i, const void **data,
                    size_t *len)
{
    if (i >= r->count)
        return -1;
    const uint8_t *cur = r->raw.data;
    const void *d = NULL;
    uint32_t n = 0;
    for (uint32_t k = 0; k <= i; k++)
        fb_wire_task_next(&cur, &d, &n);
    *data = d;
    *len = n;
    return 0;
}

void fb_oresult_free(struct fb_oresult *r)
{
    if (r)
        fiber_buf_free(&r->raw);
}

/* ---- connecting ----------------------------------------------------------- */

/* A plaintext connection's socket blocks once it is through the
 * handshake, so that a wait without a deadline sleeps in recv() (see
 * block_recv); the reads that must not block wait for poll() first. */
static int make_blocking(struct fb_oclient *c)
{
    int fl = fcntl(fb_conn_fd(&c->conn), F_GETFL);
    if (fl < 0 || fcntl(fb_conn_fd(&c->conn), F_SETFL, fl & ~O_NONBLOCK) < 0)
        return fb_err(FIBER_ESYS, "cannot set up the connection to %s: %s",
                      c->addr, strerror(errno));
    return 0;
}

/* One try of handshake: FIBER_ECLOSED when the server cut the
 * connection before it answered. */
static int handshake_once(struct fb_oclient *c, uint64_t deadline)
{
    int fd;
    int rc = fb_sock_dial(c->addr, deadline, &fd);
    if (rc)
        return rc;
    fb_conn_init(&c->conn, fd, 1u << 30);
    rc = fb_conn_secure_for(&c->conn, c->addr, FB_SEC_CLIENT, c->token);
    if (rc) {
        fb_conn_close(&c->conn);
        return rc;
    }
    const char *bid = fb_rt_build_id();
    char name[] = "client";
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .pid = (uint32_t)getpid(),
                             .name = name,
                             .name_len = (uint8_t)strlen(name)};
    memcpy(h.token, c->token, sizeof h.token);
    struct fb_wire_hdr hdr;
    const uint8_t *p;
    rc = fb_wire_put_hello(fb_conn_out(&c->conn), &h);
    if (rc == 0)
        rc = fb_conn_flush_wait(&c->conn, deadline);
    if (rc == 0) {
        int got = fb_conn_recv_wait(&c->conn, &hdr, &p, deadline);
        rc = got == 1 ? 0 : got == FIBER_ETIMEDOUT ? got : FIBER_ECLOSED;
    }
    if (rc == 0 && hdr.type != FB_MSG_WELCOME) {
        struct fb_msg_text t = {"", 0};
        if (hdr.type == FB_MSG_REJECT)
            fb_wire_get_text(p, hdr.len, &t, NULL, 0);
        rc = fb_err(FIBER_EAUTH, "object server %s refused us: %.*s", c->addr,
                    (int)t.len, t.text);
    } else if (rc) {
        rc = fb_err(rc, "cannot reach object server %s: %s", c->addr,
                    fb_conn_err_or(&c->conn, fiber_last_error()));
    }
    if (rc == 0 && !fb_conn_encrypted(&c->conn))
        rc = make_blocking(c);
    if (rc)
        fb_conn_close(&c->conn);
    return rc;
}

/* Dials the object server and proves who we are; dials again while the
 * server cuts us before answering and DIAL_TIMEOUT_MS allows (see
 * fb_dial_again). */
static int handshake(struct fb_oclient *c)
{
    uint64_t deadline = fb_deadline_ms(DIAL_TIMEOUT_MS);
    unsigned attempt = 0;
    int rc;
    while ((rc = handshake_once(c, deadline)) == FIBER_ECLOSED &&
           fb_dial_again(&attempt, deadline))
        fb_log_info("%s; dialing again", fiber_last_error());
    return rc;
}

/* A process that is not a job of the run (fb_rt_client_setup): its
 * pipelined puts are written before it exits, as a child's are after its
 * target. */
static void drain_at_exit(void)
{
    fb_oclients_drain(fb_deadline_ms(30000));
}

int fb_oclient_get(const char *addr, const uint8_t token[FB_WIRE_TOKEN_LEN],
                   struct fb_oclient **out)
{
    int set = fb_rt_client_setup();
    if (set < 0) {
        char why[300];
        fb_strlcpy(why, fiber_last_error(), sizeof why);
        return fb_err(set, "cannot use a handle on %s in this process: %s",
                      addr, why);
    }
    if (set == 1)
        atexit(drain_at_exit);
    pthread_mutex_lock(&clients_mu);
    for (struct fb_oclient *c = clients; c; c = c->next) {
        if (!c->dead && strcmp(c->addr, addr) == 0 &&
            memcmp(c->token, token, FB_WIRE_TOKEN_LEN) == 0) {
            c->refs++;
            *out = c;
            pthread_mutex_unlock(&clients_mu);
            return 0;
        }
    }
    struct fb_oclient *c = calloc(1, sizeof *c);
    int rc = c ? 0 : fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0) {
        fb_strlcpy(c->addr, addr, sizeof c->addr);
        memcpy(c->token, token, FB_WIRE_TOKEN_LEN);
        rc = handshake(c);
    }
    if (rc) {
        free(c);
        pthread_mutex_unlock(&clients_mu);
        return rc;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cond, &ca);
    pthread_cond_init(&c->fl_cond, &ca);
    pthread_condattr_destroy(&ca);
    fb_spin_init(&c->spin, sysconf(_SC_NPROCESSORS_ONLN) > 1 ? SPIN_US : 0);
    c->refs = 1;
    c->next = clients;
    clients = c;
    *out = c;
    pthread_mutex_unlock(&clients_mu);
    return 0;
}

static void free_waits(struct fb_oclient *c)
{
    while (c->waits) {
        struct fb_owait *w = c->waits;
        c->waits = w->next;
        fb_oresult_free(&w->res);
        free(w);
    }
}

static void stop_flusher(struct fb_oclient *c)
{
    if (!c->has_flusher)
        return;
    pthread_mutex_lock(&c->mu);
    c->fl_stop = 1;
    pthread_cond_signal(&c->fl_cond);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->flusher, NULL);
    c->has_flusher = 0;
}

void fb_oclient_release(struct fb_oclient *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&clients_mu);
    if (--c->refs > 0) {
        pthread_mutex_unlock(&clients_mu);
        return;
    }
    struct fb_oclient **pp = &clients;
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    pthread_mutex_unlock(&clients_mu);
    stop_flusher(c);
    fb_conn_close(&c->conn);
    fiber_buf_free(&c->spare);
    free_waits(c);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    pthread_cond_destroy(&c->fl_cond);
    free(c);
}

/* ---- replies -------------------------------------------------------------- */

static void unlink_wait(struct fb_oclient *c, struct fb_owait *w)
{
    struct fb_owait **pp = &c->waits, *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = w->next;
    if (c->hint == w)
        c->hint = prev;
    if (c->waits_tail == w)
        c->waits_tail = prev;
    w->next = NULL;
}

static void link_wait(struct fb_oclient *c, struct fb_owait *w)
{
    w->next = NULL;
    if (c->waits_tail)
        c->waits_tail->next = w;
    else
        c->waits = w;
    c->waits_tail = w;
}

/* A pipelined put was answered (or its server is gone): its items leave
 * the credit window, and a failure is kept for the producer's next call. */
static void settle_credit(struct fb_oclient *c, struct fb_owait *w)
{
    struct fb_ocredit *cr = w->credit;
    __atomic_sub_fetch(&cr->outstanding, w->n, __ATOMIC_RELAXED);
    if (w->res.status != 0 && cr->err == 0) {
        __atomic_store_n(&cr->err, w->res.status, __ATOMIC_RELAXED);
        snprintf(cr->text, sizeof cr->text, "%s", w->text);
    }
    if (c->co_wait == w)
        c->co_wait = NULL;
    unlink_wait(c, w);
    fb_oresult_free(&w->res);
    free(w);
}

/* The server (or its connection) is gone: every waiter fails. */
static void mark_dead(struct fb_oclient *c, const char *why)
{
    c->dead = 1;
    snprintf(c->dead_why, sizeof c->dead_why, "%s", why);
    struct fb_owait *w = c->waits, *next;
    for (; w; w = next) {
        next = w->next;
        if (w->done)
            continue;
        w->done = 1;
        w->res.status = FIBER_ECLOSED;
        snprintf(w->text, sizeof w->text,
                 "the object server at %s is gone: %s", c->addr, why);
        if (w->credit)
            settle_credit(c, w);
    }
}

static void deliver(struct fb_oclient *c, const struct fb_wire_hdr *h,
                    const uint8_t *p)
{
    /* Replies mostly come in the order of the calls: look after the last
     * one matched first (many futures in flight stay in the list until
     * they are freed). */
    struct fb_owait *w = c->hint ? c->hint->next : NULL;
    while (w && w->id != h->id)
        w = w->next;
    if (!w)
        for (w = c->waits; w && w->id != h->id;)
            w = w->next;
    c->hint = w;
    if (!w || w->done)
        return; /* nobody asked, or it was answered already: drop it */
    struct fb_msg_oreply m;
    fb_wire_get_oreply(p, h->len, h->code, &m, NULL, 0);
    /* A status that is no fiber code would reach the caller as one (a
     * positive value passes `rc < 0` checks as a success). */
    w->res.status = h->code;
    if (h->code > 0 || strcmp(fiber_errname(h->code), "FIBER_E?") == 0)
        w->res.status = FIBER_EPROTO;
    w->res.count = m.count;
    w->res.raw.len = 0;
    fiber_buf_append(&w->res.raw, m.items, h->len - 4);
    if (w->res.status != 0) {
        const void *text = "";
        size_t len = 0;
        fb_oresult_item(&w->res, 0, &text, &len);
        snprintf(w->text, sizeof w->text, "%.*s", (int)len,
                 (const char *)text);
    }
    w->done = 1;
    if (w->credit) {
        settle_credit(c, w);
    } else if (w->abandoned) {
        unlink_wait(c, w);
        fb_oresult_free(&w->res);
        free(w);
    }
}

/* Delivers the frames in conn.in; read_rc is how the read that brought
 * them ended (fb_conn_read's code).  mu held. */
static void pump_input(struct fb_oclient *c, int read_rc)
{
    struct fb_wire_hdr h;
    const uint8_t *p;
    int got;
    while ((got = fb_conn_next(&c->conn, &h, &p)) == 1) {
        if (h.type != FB_MSG_OREPLY) {
            mark_dead(c, "the server sent something other than OREPLY");
            return;
        }
        deliver(c, &h, p);
    }
    if (got < 0 || read_rc != 0)
        mark_dead(c, fb_conn_err(&c->conn));
}

/* Reads what has arrived and delivers it; mu held. */
static void pump(struct fb_oclient *c)
{
    pump_input(c, fb_conn_read(&c->conn));
}

/* The reader's spin on a plaintext connection: recv without blocking into
 * conn.in's free space (made by the caller, which holds `reading`: nobody
 * else touches conn.in) until bytes come or spin_us pass.  Reading while
 * spinning, rather than polling and then reading, saves a system call per
 * reply.  Returns the bytes read (added to conn.in), -1 when the socket
 * ended or failed (the caller reads again under the lock to learn how),
 * 0 when nothing came. */
static ssize_t spin_recv(struct fb_oclient *c, size_t room, unsigned spin_us)
{
    uint8_t *at = fb_conn_in_tail(&c->conn);
    uint64_t until = fb_now_ns() + (uint64_t)spin_us * 1000u;
    for (;;) {
        ssize_t n = recv(fb_conn_fd(&c->conn), at, room, MSG_DONTWAIT);
        if (n > 0) {
            fb_conn_in_grew(&c->conn, (size_t)n);
            return n;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK &&
                       errno != EINTR))
            return -1;
        if (fb_now_ns() >= until)
            return 0;
    }
}

/* A wait without a deadline on a plaintext connection blocks in recv()
 * itself, rather than in poll() and then recv(): its socket was made
 * blocking after the handshake (every other read here follows a poll
 * that saw it readable, and writes loop until all is sent either way).
 * Returns as spin_recv does, never 0. */
static ssize_t block_recv(struct fb_oclient *c, size_t room)
{
    ssize_t n;
    do
        n = recv(fb_conn_fd(&c->conn), fb_conn_in_tail(&c->conn), room, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    fb_conn_in_grew(&c->conn, (size_t)n);
    return n;
}

/* The same for an encrypted connection, whose records are opened under
 * the lock (secure.c): polls until the socket is readable.  1 or 0. */
static ssize_t spin_poll(int fd, unsigned spin_us)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    uint64_t until = fb_now_ns() + (uint64_t)spin_us * 1000u;
    int n = 0;
    while (n == 0 && fb_now_ns() < until)
        n = poll(&pf, 1, 0);
    return n != 0 ? -1 : 0; /* -1: read it under the lock */
}

/* The reader's turn: spins (as fb_spin allows), then blocks in poll()
 * until the socket is readable or the deadline passes, and delivers what
 * came.  mu held on entry and exit, released meanwhile. */
static void read_turn(struct fb_oclient *c, uint64_t deadline_ms)
{
    c->reading = 1;
    int fd = fb_conn_fd(&c->conn);
    size_t room = fb_conn_encrypted(&c->conn) ? 0 : fb_conn_in_room(&c->conn);
    pthread_mutex_unlock(&c->mu);
    unsigned spin_us = fb_spin_budget(&c->spin);
    ssize_t got = 0;
    if (spin_us) {
        got = room ? spin_recv(c, room, spin_us) : spin_poll(fd, spin_us);
        fb_spin_result(&c->spin, got != 0);
    }
    if (got == 0 && room && deadline_ms == UINT64_MAX) {
        got = block_recv(c, room); /* made blocking after the handshake */
    } else if (got == 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        got = poll(&pf, 1, fb_ms_left(deadline_ms)) > 0 ? -1 : 0;
    }
    pthread_mutex_lock(&c->mu);
    if (got > 0)
        pump_input(c, 0);
    else if (got < 0)
        pump(c);
    c->reading = 0;
    pthread_cond_broadcast(&c->cond);
}

/* Waits until done(arg) holds, the server is gone, or the deadline
 * passes; mu held.  Whoever waits reads: one reader at a time, the others
 * sleep on the condition. */
static int wait_until(struct fb_oclient *c, int (*done)(void *), void *arg,
                      uint64_t deadline_ms)
{
    while (!done(arg)) {
        if (c->dead)
            return FIBER_ECLOSED;
        if (!c->reading) {
            read_turn(c, deadline_ms);
        } else if (deadline_ms == UINT64_MAX) {
            pthread_cond_wait(&c->cond, &c->mu);
        } else {
            struct timespec ts = {.tv_sec = (time_t)(deadline_ms / 1000),
                                  .tv_nsec =
                                      (long)(deadline_ms % 1000) * 1000000L};
            pthread_cond_timedwait(&c->cond, &c->mu, &ts);
        }
        if (!done(arg) && fb_ms_left(deadline_ms) == 0)
            return FIBER_ETIMEDOUT;
    }
    return 0;
}

static int owait_done(void *arg) { return ((struct fb_owait *)arg)->done; }

static int wait_done(struct fb_oclient *c, struct fb_owait *w,
                     uint64_t deadline_ms)
{
    return wait_until(c, owait_done, w, deadline_ms);
}

/* Sends all of buf with the lock released; mu held on entry and exit.
 * Returns 0 or a code with why in fb_conn_err(&c->conn). */
static int send_unlocked(struct fb_oclient *c, const uint8_t *p, size_t len)
{
    int fd = fb_conn_fd(&c->conn), rc = 0;
    pthread_mutex_unlock(&c->mu);
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
        } else {
            rc = errno == EPIPE || errno == ECONNRESET ? FIBER_ECLOSED
                                                       : FIBER_ESYS;
            break;
        }
    }
    pthread_mutex_lock(&c->mu);
    if (rc)
        fb_conn_set_err(&c->conn, "send: %s",
                        rc == FIBER_ECLOSED ? "peer closed the connection"
                                            : strerror(errno));
    return rc;
}

/* Sends what conn.out holds, unless another thread is already sending
 * (it sends ours too before it stops); mu held.  An encrypted connection
 * is written with the lock held (its records are sealed in conn). */
static int oc_write(struct fb_oclient *c)
{
    if (c->writing || c->dead)
        return c->dead ? FIBER_ECLOSED : 0;
    c->writing = 1;
    int rc = 0;
    while (rc == 0 && fb_conn_pending(&c->conn)) {
        c->co_wait = NULL; /* its frame leaves conn.out */
        if (fb_conn_encrypted(&c->conn)) {
            rc = fb_conn_flush_wait(&c->conn, UINT64_MAX);
            break;
        }
        fiber_buf batch = c->spare;
        size_t off = fb_conn_swap_out(&c->conn, &batch);
        rc = send_unlocked(c, batch.data + off, batch.len - off);
        batch.len = 0;
        c->spare = batch;
    }
    c->writing = 0;
    if (rc)
        mark_dead(c, fb_conn_err(&c->conn));
    pthread_cond_broadcast(&c->cond); /* send_call may wait for us */
    return rc;
}

/* Registers w for the reply to a call appended to conn.out; mu held. */
static int append_call(struct fb_oclient *c, struct fb_owait *w, uint32_t obj,
                       int32_t op, int timeout_ms, const fiber_iov *items,
                       size_t count)
{
    if (c->dead)
        return fb_err(FIBER_ECLOSED, "the object server at %s is gone: %s",
                      c->addr, c->dead_why);
    uint64_t id = ++c->seq;
    int rc = fb_wire_put_ocall(fb_conn_out(&c->conn), id, op, obj,
                               timeout_ms < 0 ? -1 : timeout_ms, items, count);
    if (rc)
        return rc;
    c->co_wait = NULL; /* a pipelined put can no longer grow */
    if (w) {
        w->id = id;
        w->c = c;
        link_wait(c, w);
    }
    return 0;
}

/* Sends a call and registers w for its reply; mu held. */
static int send_call(struct fb_oclient *c, struct fb_owait *w, uint32_t obj,
                     int32_t op, int timeout_ms, const fiber_iov *items,
                     size_t count)
{
    int rc = append_call(c, w, obj, op, timeout_ms, items, count);
    /* Another thread (the flusher) may be writing: wait for it, so that
     * the frame has left when this returns (a TAKEN must be out before
     * its get returns, and a caller may count on it). */
    while (rc == 0 && c->writing && !c->dead)
        pthread_cond_wait(&c->cond, &c->mu);
    if (rc == 0 && oc_write(c) != 0) {
        if (w)
            unlink_wait(c, w);
        return fb_err(FIBER_ECLOSED, "the object server at %s is gone: %s",
                      c->addr, c->dead_why);
    }
    return rc;
}

int fb_ocall(struct fb_oclient *c, uint32_t obj, int32_t op, int timeout_ms,
             const fiber_iov *items, size_t count, struct fb_oresult *res)
{
    struct fb_owait w = {0};
    pthread_mutex_lock(&c->mu);
    int rc = send_call(c, &w, obj, op, timeout_ms, items, count);
    if (rc == 0) {
        wait_done(c, &w, UINT64_MAX); /* the server keeps the time */
        unlink_wait(c, &w);
        rc = w.res.status;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc && w.text[0])
        fb_err(rc, "%s", w.text);
    if (res)
        *res = w.res;
    else
        fb_oresult_free(&w.res);
    return rc;
}

static int hand_to_flusher(struct fb_oclient *c);
static int future_from_owait(struct fb_owait *w, fiber_future **f);

int fb_ocall_async(struct fb_oclient *c, uint32_t obj, int32_t op,
                   int timeout_ms, const fiber_iov *items, size_t count,
                   fiber_future **f)
{
    struct fb_owait *w = calloc(1, sizeof *w);
    if (!w)
        return fb_err(FIBER_ENOMEM, "out of memory");
    pthread_mutex_lock(&clients_mu);
    c->refs++; /* the future keeps the connection */
    pthread_mutex_unlock(&clients_mu);
    pthread_mutex_lock(&c->mu);
    int rc = append_call(c, w, obj, op, timeout_ms, items, count);
    /* Calls in quick succession (many futures in flight) go out in
     * batches through the flusher; a lone one is written now. */
    uint64_t now = fb_now_ns();
    int steady = now - c->last_async_ns < STEADY_NS;
    c->last_async_ns = now;
    if (rc == 0 &&
        (!steady || fb_conn_encrypted(&c->conn) || hand_to_flusher(c) != 0) &&
        oc_write(c) != 0) {
        unlink_wait(c, w);
        rc = fb_err(FIBER_ECLOSED, "the object server at %s is gone: %s",
                    c->addr, c->dead_why);
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == 0)
        rc = future_from_owait(w, f);
    if (rc) {
        pthread_mutex_lock(&c->mu);
        unlink_wait(c, w);
        pthread_mutex_unlock(&c->mu);
        free(w);
        fb_oclient_release(c);
    }
    return rc;
}

int fb_ocall_resolved(int status, const void *item, size_t len, int has_item,
                      fiber_future **f)
{
    struct fb_owait *w = calloc(1, sizeof *w);
    if (!w)
        return fb_err(FIBER_ENOMEM, "out of memory");
    w->done = 1;
    w->res.status = status;
    if (status != 0)
        fb_strlcpy(w->text, fiber_last_error(), sizeof w->text);
    uint32_t n = (uint32_t)len;
    if (has_item && (fiber_buf_append(&w->res.raw, &n, 4) != 0 ||
                     fiber_buf_append(&w->res.raw, item, len) != 0)) {
        fb_oresult_free(&w->res);
        free(w);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    w->res.count = has_item ? 1 : 0;
    /* w->c stays NULL: done already, it needs no connection */
    int rc = future_from_owait(w, f);
    if (rc) {
        fb_oresult_free(&w->res);
        free(w);
    }
    return rc;
}

int fb_ocall_post(struct fb_oclient *c, uint32_t obj, int32_t op,
                  const fiber_iov *items, size_t count)
{
    pthread_mutex_lock(&c->mu);
    int rc = send_call(c, NULL, obj, op, -1, items, count);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int fb_ocall_begin(struct fb_oclient *c, uint32_t obj, int32_t op,
                   int timeout_ms, const fiber_iov *items, size_t count,
                   struct fb_owait **out)
{
    struct fb_owait *w = calloc(1, sizeof *w);
    if (!w)
        return fb_err(FIBER_ENOMEM, "out of memory");
    pthread_mutex_lock(&clients_mu);
    c->refs++; /* the waiter keeps the connection, as a future does */
    pthread_mutex_unlock(&clients_mu);
    pthread_mutex_lock(&c->mu);
    int rc = send_call(c, w, obj, op, timeout_ms, items, count);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        free(w);
        fb_oclient_release(c);
        return rc;
    }
    *out = w;
    return 0;
}

const struct fb_oresult *fb_owait_result(struct fb_owait *w, const char **text)
{
    if (text)
        *text = w->text;
    return &w->res;
}

/* ---- pipelined puts ---------------------------------------------------- */

/* The flusher: sends what pipelined puts left in conn.out. */
static void *flusher_main(void *arg)
{
    struct fb_oclient *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->fl_stop) {
        if (fb_conn_pending(&c->conn) && !c->writing && !c->dead) {
            oc_write(c);
            pthread_cond_broadcast(&c->cond); /* a death wakes waiters */
            continue;
        }
        c->fl_idle = 1;
        pthread_cond_wait(&c->fl_cond, &c->mu);
        c->fl_idle = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Leaves conn.out to the flusher (starting it the first time); mu held.
 * Returns 0, or a code when no thread can be started (the caller then
 * writes itself). */
static int hand_to_flusher(struct fb_oclient *c)
{
    if (!c->has_flusher) {
        int rc = fb_thread_start(&c->flusher, flusher_main, c,
                                 "an object client's flusher");
        if (rc)
            return rc;
        c->has_flusher = 1;
    }
    if (c->fl_idle && !c->writing) {
        c->fl_idle = 0; /* one signal per wake-up, not one per put */
        pthread_cond_signal(&c->fl_cond);
    }
    return 0;
}

/* Adds item to the pipelined put still in conn.out (same object, op and
 * credit), patching its frame's length and count; 1 if it did, 0 if a
 * new frame is needed. */
static int join_putn(struct fb_oclient *c, uint32_t obj, int32_t op,
                     struct fb_ocredit *cr, const fiber_iov *item)
{
    struct fb_owait *w = c->co_wait;
    if (!w || w->credit != cr || w->n >= PUTN_MAX_ITEMS)
        return 0;
    uint8_t *f = fb_conn_out(&c->conn)->data + c->co_off;
    uint32_t len, fobj;
    int32_t fop;
    memcpy(&len, f + 20, 4);
    memcpy(&fop, f + 8, 4);
    memcpy(&fobj, f + FB_WIRE_HDR_LEN, 4);
    if (fop != op || fobj != obj || len + 4 + item->len > PUTN_MAX_BYTES)
        return 0;
    uint32_t n = (uint32_t)item->len;
    if (fiber_buf_append(fb_conn_out(&c->conn), &n, 4) != 0 ||
        fiber_buf_append(fb_conn_out(&c->conn), item->data, item->len) != 0)
        return 0; /* the frame is unchanged: len still covers it */
    f = fb_conn_out(&c->conn)->data + c->co_off; /* the buffer may have moved */
    len += 4 + n;
    memcpy(f + 20, &len, 4);
    w->n++;
    uint32_t count = w->n;
    memcpy(f + FB_WIRE_HDR_LEN + 8, &count, 4);
    return 1;
}

/* Starts a new pipelined put frame carrying item, which later puts of
 * the same credit may join; mu held. */
static int new_putn(struct fb_oclient *c, uint32_t obj, int32_t op,
                    struct fb_ocredit *cr, const fiber_iov *item)
{
    struct fb_owait *w = calloc(1, sizeof *w);
    if (!w)
        return fb_err(FIBER_ENOMEM, "out of memory");
    size_t off = fb_conn_out(&c->conn)->len;
    int rc = append_call(c, w, obj, op, -1, item, 1);
    if (rc) {
        free(w);
        return rc;
    }
    w->credit = cr;
    w->n = 1;
    c->co_wait = w;
    c->co_off = off;
    return 0;
}

int fb_ocall_putn(struct fb_oclient *c, uint32_t obj, int32_t op,
                  const fiber_iov *items, size_t count, struct fb_ocredit *cr,
                  int defer)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        if (!join_putn(c, obj, op, cr, &items[i]))
            rc = new_putn(c, obj, op, cr, &items[i]);
        if (rc == 0)
            __atomic_add_fetch(&cr->outstanding, 1, __ATOMIC_RELAXED);
    }
    /* On a failure (out of memory) the items before it are on their way
     * all the same; they are written with the next write. */
    if (rc == 0 && (!defer || fb_conn_encrypted(&c->conn) || hand_to_flusher(c) != 0) &&
        oc_write(c) != 0)
        rc = fb_err(FIBER_ECLOSED, "the object server at %s is gone: %s",
                    c->addr, c->dead_why);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

struct credit_limit {
    struct fb_ocredit *cr;
    uint64_t limit;
};

static int credit_below(void *arg)
{
    struct credit_limit *l = arg;
    return __atomic_load_n(&l->cr->outstanding, __ATOMIC_RELAXED) <= l->limit;
}

int fb_ocredit_wait(struct fb_oclient *c, struct fb_ocredit *cr,
                    uint64_t limit, uint64_t deadline_ms)
{
    /* The common case, a producer well inside its window, takes no lock:
     * the counters are written under the lock but read atomically here
     * (a failure noted meanwhile is reported by the next call). */
    if (__atomic_load_n(&cr->outstanding, __ATOMIC_RELAXED) <= limit &&
        __atomic_load_n(&cr->err, __ATOMIC_RELAXED) == 0)
        return 0;
    /* A full window waits until half of it is answered: the producer
     * then resumes with a run of puts that travel in large calls, rather
     * than with one put per answer. */
    struct credit_limit l = {cr, limit};
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (!credit_below(&l)) {
        l.limit = limit / 2;
        if (fb_conn_pending(&c->conn))
            oc_write(c); /* what we wait for may not have left yet */
        rc = wait_until(c, credit_below, &l, deadline_ms);
    }
    char text[sizeof cr->text];
    if (rc == 0 && cr->err) { /* a failed put: reported once */
        rc = cr->err;
        __atomic_store_n(&cr->err, 0, __ATOMIC_RELAXED);
        memcpy(text, cr->text, sizeof text);
    } else if (rc == FIBER_ECLOSED) {
        snprintf(text, sizeof text, "the object server at %s is gone: %s",
                 c->addr, c->dead_why);
    }
    pthread_mutex_unlock(&c->mu);
    if (rc && rc != FIBER_ETIMEDOUT)
        fb_err(rc, "%s", text);
    return rc;
}

static int no_puts_in_flight(void *arg)
{
    for (struct fb_owait *w = ((struct fb_oclient *)arg)->waits; w; w = w->next)
        if (w->credit)
            return 0;
    return 1;
}

void fb_oclients_drain(uint64_t deadline_ms)
{
    pthread_mutex_lock(&clients_mu);
    for (struct fb_oclient *c = clients; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        oc_write(c);
        wait_until(c, no_puts_in_flight, c, deadline_ms);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&clients_mu);
}

int fb_oopen(struct fb_oclient *c, const char *kind, const char *name,
             const fiber_iov *params, size_t n, uint32_t *id)
{
    fiber_iov items[18];
    if (n > 16)
        return fb_err(FIBER_EINVAL, "too many parameters");
    items[0] = (fiber_iov){kind, strlen(kind)};
    items[1] = (fiber_iov){name, strlen(name)};
    for (size_t i = 0; i < n; i++)
        items[2 + i] = params[i];
    struct fb_oresult r = {0};
    int rc = fb_ocall(c, 0, FB_OP_OPEN, -1, items, n + 2, &r);
    const void *d = NULL;
    size_t len = 0;
    if (rc == 0 && (fb_oresult_item(&r, 0, &d, &len) != 0 || len != 4))
        rc = fb_err(FIBER_EPROTO, "OPEN answered without an object id");
    if (rc == 0)
        memcpy(id, d, 4);
    fb_oresult_free(&r);
    return rc;
}

/* ---- waiters behind futures ----------------------------------------------- */

int fb_owait_wait(struct fb_owait *w, int timeout_ms)
{
    struct fb_oclient *c = w->c;
    if (!c) /* resolved when it was made (fb_ocall_resolved) */
        return 0;
    pthread_mutex_lock(&c->mu);
    if (!w->done && fb_conn_pending(&c->conn))
        oc_write(c); /* the call may still be waiting for the flusher */
    int rc = wait_done(c, w, fb_deadline_ms(timeout_ms));
    if (rc == FIBER_ECLOSED && !w->done) {
        w->done = 1;
        w->res.status = FIBER_ECLOSED;
        snprintf(w->text, sizeof w->text, "the object server is gone: %s",
                 c->dead_why);
    }
    int done = w->done;
    pthread_mutex_unlock(&c->mu);
    if (!done)
        return fb_err(FIBER_ETIMEDOUT, "no reply after %d ms", timeout_ms);
    return 0;
}

int fb_owait_ready(struct fb_owait *w)
{
    struct fb_oclient *c = w->c;
    if (!c)
        return 1;
    pthread_mutex_lock(&c->mu);
    if (!w->done && !c->reading && !c->dead) {
        struct pollfd pf = {.fd = fb_conn_fd(&c->conn), .events = POLLIN};
        if (poll(&pf, 1, 0) > 0)
            pump(c);
    }
    int done = w->done || c->dead;
    pthread_mutex_unlock(&c->mu);
    return done;
}

int fb_owait_take(struct fb_owait *w, fiber_buf *out)
{
    if (w->res.status != 0)
        return fb_err(w->res.status, "%s", w->text);
    const void *d;
    size_t len;
    if (out && fb_oresult_item(&w->res, 0, &d, &len) == 0)
        return fiber_buf_append(out, d, len);
    return 0;
}

void fb_owait_free(struct fb_owait *w)
{
    struct fb_oclient *c = w->c;
    if (!c) {
        fb_oresult_free(&w->res);
        free(w);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (w->done || c->dead) {
        unlink_wait(c, w);
        fb_oresult_free(&w->res);
        free(w);
    } else {
        w->abandoned = 1; /* freed when its reply comes */
    }
    pthread_mutex_unlock(&c->mu);
    fb_oclient_release(c);
}

/* The future of a call: a waiter behind future/future.h's handle. */
static int owait_wait(void *w, int timeout_ms) { return fb_owait_wait(w, timeout_ms); }
static int owait_take(void *w, fiber_buf *out) { return fb_owait_take(w, out); }
static int owait_ready(void *w) { return fb_owait_ready(w); }
static int owait_succeeded(void *w) { return fb_owait_take(w, NULL) == 0; }
static void owait_drop(void *w) { fb_owait_free(w); }

static const struct fb_future_ops owait_future_ops = {
    .wait = owait_wait,
    .take = owait_take,
    .ready = owait_ready,
    .succeeded = owait_succeeded,
    .free = owait_drop,
};

static int future_from_owait(struct fb_owait *w, fiber_future **f)
{
    return fb_future_new(&owait_future_ops, w, f);
}

/* ---- handles ------------------------------------------------------------- */

int fb_handle_encode(fiber_buf *out, int kind, const char *addr,
                     const uint8_t *token, uint32_t obj, uint32_t extra)
{
    size_t n = strlen(addr);
    if (n > 255)
        return fb_err(FIBER_EINVAL, "address too long to serialise");
    uint8_t head[6] = {'F', 'B', 'H', '1', (uint8_t)kind, (uint8_t)n};
    uint8_t ids[8];
    memcpy(ids, &obj, 4);
    memcpy(ids + 4, &extra, 4);
    int rc = fiber_buf_reserve(out, sizeof head + n + FB_WIRE_TOKEN_LEN + 8);
    if (rc == 0) {
        fiber_buf_append(out, head, sizeof head);
        fiber_buf_append(out, addr, n);
        fiber_buf_append(out, token, FB_WIRE_TOKEN_LEN);
        fiber_buf_append(out, ids, sizeof ids);
    }
    return rc;
}

int fb_handle_decode(const void *data, size_t len, int want_kind, char *addr,
                     size_t addr_size, uint8_t *token, uint32_t *obj,
                     uint32_t *extra)
{
    const uint8_t *p = data;
    if (!p || len < 6 || memcmp(p, "FBH1", 4) != 0)
        return fb_err(FIBER_EINVAL, "not a serialised fiber handle");
    if (p[4] != want_kind)
        return fb_err(FIBER_EINVAL, "serialised handle is of another kind "
                                    "(%u, want %d)",
                      p[4], want_kind);
    size_t n = p[5];
    if (len != 6 + n + FB_WIRE_TOKEN_LEN + 8 || n + 1 > addr_size || n == 0)
        return fb_err(FIBER_EINVAL, "serialised handle has a bad length");
    memcpy(addr, p + 6, n);
    addr[n] = '\0';
    memcpy(token, p + 6 + n, FB_WIRE_TOKEN_LEN);
    memcpy(obj, p + 6 + n + FB_WIRE_TOKEN_LEN, 4);
    memcpy(extra, p + 10 + n + FB_WIRE_TOKEN_LEN, 4);
    return 0;
}

/* ---- the master's object server -------------------------------------- */

static pthread_mutex_t master_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fb_objsrv *master_srv;

int fb_master_objsrv(struct fb_objsrv **out)
{
    if (!fb_rt_is_master())
        return fb_err(FIBER_ENOTSUP,
                      "queues, pipes and rings are created by the master; "
                      "pass a serialised handle to a child instead");
    pthread_mutex_lock(&master_mu);
    int rc = 0;
    if (!master_srv) {
        const char *run_addr = fb_rt_address(); /* makes the run directory */
        char addr[700];
        if (!run_addr[0])
            rc = fb_err(FIBER_ESYS, "cannot set up the run's directory");
        else if (fb_rt_config()->transport == FB_TRANSPORT_TCP)
            snprintf(addr, sizeof addr, "tcp:%s:0",
                     fb_rt_config()->listen_host);
        else
            snprintf(addr, sizeof addr, "unix:%s/objects.sock",
                     fb_rt()->run_dir);
        if (rc == 0)
            rc = fb_objsrv_start(&master_srv, addr, fb_rt_token(),
                                 fb_rt_build_id(), 1);
    }
    *out = master_srv;
    pthread_mutex_unlock(&master_mu);
    return rc;
}

void fb_master_objsrv_stop(void)
{
    pthread_mutex_lock(&master_mu);
    struct fb_objsrv *s = master_srv;
    master_srv = NULL;
    pthread_mutex_unlock(&master_mu);
    fb_objsrv_stop(s);
}

int fb_ohandle_open(struct fb_ohandle *h, const char *addr,
                    const uint8_t token[FB_WIRE_TOKEN_LEN], uint32_t obj)
{
    int rc = fb_oclient_get(addr, token, &h->c);
    if (rc)
        return rc;
    h->obj = obj;
    fb_strlcpy(h->addr, addr, sizeof h->addr);
    memcpy(h->token, token, FB_WIRE_TOKEN_LEN);
    return 0;
}

void fb_ohandle_close(struct fb_ohandle *h)
{
    fb_oclient_release(h->c);
    h->c = NULL;
}

int fb_ohandle_freed(const struct fb_ohandle *h, int rc, const char *what,
                     const char *how)
{
    unsigned id = 0;
    int end = -1;
    const char *text = fiber_last_error();
    if (rc != FIBER_ECLOSED)
        return rc;
    sscanf(text, "object %u was freed%n", &id, &end);
    if (end < 0 || text[end] != '\0' || id != h->obj)
        return rc;
    return fb_err(rc, "%s %u on %s was freed %s; this handle is stale", what,
                  id, h->addr, how);
}
