/*
 * objsrv.c -- the object server: listening, admitting clients, serving
 * OCALL requests, parking the ones that must wait, deadlines, and
 * cleaning up after clients that go.  See objsrv.h.  A client waits in
 * the server's gate (net/gate.h) until its HELLO has proved it.
 */
#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/spin.h"
#include "base/thread.h"
#include "net/gate.h"
#include "net/listener.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"

#define MAX_CONNS 4096
#define SPIN_US 50 /* the longest spin of an idle server before it blocks */

extern const struct fb_obj_kind *const fb_obj_kinds[];

struct fb_oconn {
    struct fb_conn conn;
    int authed;
    int want_out;
    int doomed; /* a send failed: dropped at the next safe point */
    int dirty;   /* replies queued in conn.out, flushed after the batch */
    struct fb_oconn *dirty_next;
    struct fb_gate_peer peer; /* until authed: in the server's gate */
    uint32_t id; /* unique for the server's life, never 0 */
    struct fb_oconn *prev, *next;
};

struct fb_objsrv {
    struct fb_listener l; /* socket, epoll set, stop eventfd, thread */
    uint8_t token[FB_WIRE_TOKEN_LEN];
    char build_id[FB_WIRE_BUILD_ID_MAX + 1];
    uint32_t max_payload;
    struct fb_oconn *conns;
    int n_conns;
    struct fb_gate gate;     /* the conns not yet through HELLO */
    struct fb_obj *objs;
    uint32_t next_id;
    uint32_t next_conn_id;
    struct fb_oreq *parked;
    uint64_t n_parked; /* on `parked`; atomic: read by other threads */
    uint64_t dropped; /* closed over MAX_CONNS (the gate counts its own) */
    int n_doomed;
    int stopping;
    struct fb_oconn *dirty; /* connections with replies to flush */
    struct fb_spin spin;    /* waits spin before blocking (base/spin.h) */
};

#define EV_LISTEN ((void *)1)
#define EV_STOP ((void *)2)
#define EV_CTRL ((void *)3)

/* ---- connections -------------------------------------------------------- */

static void conn_drop(struct fb_objsrv *s, struct fb_oconn *c, const char *why);
static void dirty_unlink(struct fb_objsrv *s, struct fb_oconn *c);

/* Closes c and frees it; what it held is released already. */
static void conn_free(struct fb_objsrv *s, struct fb_oconn *c)
{
    if (c->doomed)
        s->n_doomed--;
    dirty_unlink(s, c);
    fb_listener_drop(&s->l, &c->conn);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    free(c);
}

/* The gate's close function: a peer that never authenticated goes. */
static void gate_close(struct fb_gate_peer *p, void *arg)
{
    conn_free(arg, (struct fb_oconn *)((char *)p -
                                       offsetof(struct fb_oconn, peer)));
}

/* Admits a new connection into the gate (closing it at once when
 * MAX_CONNS are open; the gate closes the oldest stranger when
 * max_pending_connections are waiting to send HELLO).  Over TCP with
 * `encryption` on, its encryption starts here (net/secure.c).  Called
 * only between event batches, since making room closes connections the
 * batch may name. */
static void conn_add(struct fb_objsrv *s, int fd)
{
    if (s->n_conns >= MAX_CONNS) {
        close(fd);
        s->dropped++;
        return;
    }
    struct fb_oconn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    if (fb_listener_adopt(&s->l, &c->conn, fd, c, s->token) != 0) {
        free(c);
        return;
    }
    c->id = ++s->next_conn_id ? s->next_conn_id : ++s->next_conn_id;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    fb_gate_add(&s->gate, &c->peer, &c->conn);
}

/* A send to c failed.  Dropping it here would free it (and its parked
 * requests) under whoever is replying: an object in the middle of handing
 * a lock over, or the handler still holding c's current request.  So it
 * is only marked; the loop drops it between events (reap_doomed). */
static void conn_doom(struct fb_objsrv *s, struct fb_oconn *c)
{
    if (!c->doomed) {
        fb_log_debug("object server: send on fd %d failed (%s); dropping "
                     "the client", fb_conn_fd(&c->conn), fb_conn_err(&c->conn));
        c->doomed = 1;
        s->n_doomed++;
    }
}

static void send_now(struct fb_objsrv *s, struct fb_oconn *c)
{
    if (c->doomed)
        return;
    if (fb_listener_flush(&s->l, &c->conn, c, &c->want_out) < 0)
        conn_doom(s, c);
}

/* ---- requests ------------------------------------------------------------ */

static void parked_unlink(struct fb_oreq *r)
{
    struct fb_objsrv *s = r->srv;
    if (r->pprev || s->parked == r)
        __atomic_sub_fetch(&s->n_parked, 1, __ATOMIC_RELAXED);
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else if (s->parked == r)
        s->parked = r->pnext;
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    r->pprev = r->pnext = NULL;
}

static void waitq_unlink(struct fb_oreq *r)
{
    struct fb_waitq *q = r->wq;
    if (!q)
        return;
    if (r->wprev)
        r->wprev->wnext = r->wnext;
    else
        q->head = r->wnext;
    if (r->wnext)
        r->wnext->wprev = r->wprev;
    else
        q->tail = r->wprev;
    q->len--;
    r->wq = NULL;
    r->wprev = r->wnext = NULL;
}

static void req_free(struct fb_oreq *r)
{
    waitq_unlink(r);
    parked_unlink(r);
    free(r); /* items and raw live in the same block (req_new) */
}

void fb_oreq_park(struct fb_oreq *req, struct fb_waitq *q)
{
    req->wq = q;
    req->wprev = q->tail;
    req->wnext = NULL;
    if (q->tail)
        q->tail->wnext = req;
    else
        q->head = req;
    q->tail = req;
    q->len++;
    struct fb_objsrv *s = req->srv;
    __atomic_add_fetch(&s->n_parked, 1, __ATOMIC_RELAXED);
    req->pnext = s->parked;
    req->pprev = NULL;
    if (s->parked)
        s->parked->pprev = req;
    s->parked = req;
}

void fb_oreq_park_front(struct fb_oreq *req, struct fb_waitq *q)
{
    fb_oreq_park(req, q); /* at the tail, and on the server's list */
    waitq_unlink(req);
    req->wq = q;
    req->wprev = NULL;
    req->wnext = q->head;
    if (q->head)
        q->head->wprev = req;
    else
        q->tail = req;
    q->head = req;
    q->len++;
}

struct fb_oreq *fb_waitq_pop(struct fb_waitq *q)
{
    struct fb_oreq *r = q->head;
    if (r) {
        waitq_unlink(r);
        parked_unlink(r);
    }
    return r;
}

/* Queues c's output for the flush after the current batch of events:
 * the replies a batch produces go out in one write per client. */
static void mark_dirty(struct fb_objsrv *s, struct fb_oconn *c)
{
    if (c->dirty)
        return;
    c->dirty = 1;
    c->dirty_next = s->dirty;
    s->dirty = c;
}

/* Writes every connection's queued replies (see mark_dirty). */
static void flush_dirty(struct fb_objsrv *s)
{
    while (s->dirty) {
        struct fb_oconn *c = s->dirty;
        s->dirty = c->dirty_next;
        c->dirty = 0;
        c->dirty_next = NULL;
        send_now(s, c);
    }
}

static void dirty_unlink(struct fb_objsrv *s, struct fb_oconn *c)
{
    if (!c->dirty)
        return;
    struct fb_oconn **pp = &s->dirty;
    while (*pp && *pp != c)
        pp = &(*pp)->dirty_next;
    if (*pp)
        *pp = c->dirty_next;
    c->dirty = 0;
}

void fb_oreq_reply(struct fb_oreq *req, int status, const fiber_iov *items,
                   size_t count)
{
    struct fb_oconn *c = req->conn;
    if (c && !c->doomed &&
        fb_wire_put_oreply(fb_conn_out(&c->conn), req->id, status, items,
                           count) == 0)
        mark_dirty(req->srv, c);
    req_free(req);
}

void fb_oreq_done(struct fb_oreq *req) { req_free(req); }

void fb_oreq_fail(struct fb_oreq *req, int status, const char *fmt, ...)
{
    char text[FB_WIRE_TEXT_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fiber_iov item = {text, strlen(text)};
    fb_oreq_reply(req, status, &item, 1);
}

int fb_item_u32(const struct fb_oreq *req, uint32_t i, uint32_t *v)
{
    if (i >= req->count || req->items[i].len != 4)
        return -1;
    memcpy(v, req->items[i].data, 4);
    return 0;
}

int fb_item_i64(const struct fb_oreq *req, uint32_t i, int64_t *v)
{
    if (i >= req->count || req->items[i].len != 8)
        return -1;
    memcpy(v, req->items[i].data, 8);
    return 0;
}

/* ---- objects -------------------------------------------------------------- */

static struct fb_obj *find_obj(struct fb_objsrv *s, uint32_t id)
{
    for (struct fb_obj *o = s->objs; o; o = o->next)
        if (o->id == id)
            return o;
    return NULL;
}

static const struct fb_obj_kind *find_kind(const char *name, size_t len)
{
    for (size_t i = 0; fb_obj_kinds[i]; i++)
        if (strlen(fb_obj_kinds[i]->name) == len &&
            memcmp(fb_obj_kinds[i]->name, name, len) == 0)
            return fb_obj_kinds[i];
    return NULL;
}

/* OPEN: items kind, name, params...; returns the existing object of that
 * name (which must be of that kind) or creates it. */
static void do_open(struct fb_objsrv *s, struct fb_oreq *req)
{
    if (req->count < 2 || req->items[1].len == 0 ||
        req->items[1].len > FB_WIRE_NAME_MAX) {
        fb_oreq_fail(req, FIBER_EINVAL, "OPEN wants a kind and a name");
        return;
    }
    const fiber_iov *kind = &req->items[0], *name = &req->items[1];
    const struct fb_obj_kind *k = find_kind(kind->data, kind->len);
    if (!k) {
        fb_oreq_fail(req, FIBER_EINVAL, "no object kind '%.*s'",
                     (int)(kind->len > 40 ? 40 : kind->len),
                     (const char *)kind->data);
        return;
    }
    for (struct fb_obj *o = s->objs; o; o = o->next) {
        if (strlen(o->name) == name->len &&
            memcmp(o->name, name->data, name->len) == 0) {
            if (strcmp(o->kind, k->name) != 0) {
                fb_oreq_fail(req, FIBER_EINVAL,
                             "object '%s' exists and is a %s, not a %s",
                             o->name, o->kind, k->name);
                return;
            }
            fiber_iov id = {&o->id, 4};
            fb_oreq_reply(req, 0, &id, 1);
            return;
        }
    }
    struct fb_obj *o = calloc(1, sizeof *o);
    if (!o) {
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        return;
    }
    o->id = ++s->next_id;
    o->srv = s;
    fb_strlcpy(o->kind, k->name, sizeof o->kind);
    memcpy(o->name, name->data, name->len);
    int rc = k->create(o, req->items + 2, req->count - 2);
    if (rc) {
        free(o);
        fb_oreq_fail(req, rc, "%s", fiber_last_error());
        return;
    }
    o->next = s->objs;
    s->objs = o;
    fiber_iov id = {&o->id, 4};
    fb_oreq_reply(req, 0, &id, 1);
}

/* Answers every request parked on o with FIBER_ECLOSED.  Its waiters are
 * on o's own wait queues, so this runs before ops->destroy frees them;
 * one pass over the server's parked list (the calls waiting now). */
static void fail_parked(struct fb_objsrv *s, struct fb_obj *o)
{
    struct fb_oreq *r = s->parked, *next;
    for (; r; r = next) {
        next = r->pnext;
        if (r->obj != o->id)
            continue;
        waitq_unlink(r);
        parked_unlink(r);
        fb_oreq_fail(r, FIBER_ECLOSED, "%s '%s' was freed", o->kind,
                     o->name); /* frees r alone: next stays valid */
    }
}

void fb_obj_destroy(struct fb_obj *o)
{
    struct fb_objsrv *s = o->srv;
    struct fb_obj **pp = &s->objs;
    while (*pp && *pp != o)
        pp = &(*pp)->next;
    if (*pp)
        *pp = o->next;
    fail_parked(s, o);
    if (o->ops->destroy)
        o->ops->destroy(o);
    free(o);
}

/* FB_OP_FREE: destroys o when its kind allows it. */
static void do_free(struct fb_obj *o, struct fb_oreq *req)
{
    if (!o->ops->freeable) {
        fb_oreq_fail(req, FIBER_EINVAL, "a %s is not freed this way",
                     o->kind);
        return;
    }
    if (req->count != 0) {
        fb_oreq_fail(req, FIBER_EINVAL, "FREE takes no arguments");
        return;
    }
    fb_oreq_reply(req, 0, NULL, 0);
    fb_obj_destroy(o);
}

/* Builds a request (owning a copy of its items) from an OCALL frame. */
static struct fb_oreq *req_new(struct fb_objsrv *s, struct fb_oconn *c,
                               const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fb_msg_ocall m;
    fb_wire_get_ocall(p, h->len, &m, NULL, 0);
    size_t items_len = h->len - 12; /* after obj, timeout and count */
    /* One block: the request, its item list, then the items' bytes. */
    struct fb_oreq *r =
        malloc(sizeof *r + (size_t)m.count * sizeof *r->items + items_len);
    if (!r)
        return NULL;
    memset(r, 0, sizeof *r);
    r->items = (fiber_iov *)(r + 1);
    r->raw = (uint8_t *)(r->items + m.count);
    memcpy(r->raw, m.items, items_len);
    const uint8_t *cur = r->raw;
    for (uint32_t i = 0; i < m.count; i++) {
        const void *data;
        uint32_t len;
        fb_wire_task_next(&cur, &data, &len);
        r->items[i] = (fiber_iov){data, len};
    }
    r->srv = s;
    r->conn = c;
    r->id = h->id;
    r->op = h->code;
    r->obj = m.obj;
    r->count = m.count;
    r->deadline_ms = m.timeout_ms < 0 ? UINT64_MAX
                                      : fb_now_ms() + (uint64_t)m.timeout_ms;
    return r;
}

static void serve(struct fb_objsrv *s, struct fb_oconn *c,
                  const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fb_oreq *req = req_new(s, c, h, p);
    if (!req) {
        conn_drop(s, c, "out of memory for a request");
        return;
    }
    if (req->obj == 0 && req->op == FB_OP_OPEN) {
        do_open(s, req);
        return;
    }
    struct fb_obj *o = find_obj(s, req->obj);
    if (!o && req->obj != 0 && req->obj <= s->next_id) {
        fb_oreq_fail(req, FIBER_ECLOSED, "object %u was freed", req->obj);
        return;
    }
    if (!o) {
        fb_oreq_fail(req, FIBER_EINVAL, "no object %u on this server",
                     req->obj);
        return;
    }
    if (req->op == FB_OP_FREE)
        do_free(o, req);
    else
        o->ops->call(o, req);
}

/* ---- admitting clients ----------------------------------------------- */

static void conn_drop(struct fb_objsrv *s, struct fb_oconn *c, const char *why)
{
    if (!c->authed) { /* in the gate, which logs and counts it */
        fb_gate_drop(&s->gate, &c->peer, why);
        return;
    }
    fb_log_debug("object server: client on fd %d gone: %s",
                 fb_conn_fd(&c->conn), why);
    /* Its parked requests go first, then every object hears of it. */
    struct fb_oreq *r = s->parked, *next;
    for (; r; r = next) {
        next = r->pnext;
        if (r->conn == c)
            req_free(r);
    }
    for (struct fb_obj *o = s->objs; o; o = o->next)
        if (o->ops->conn_gone)
            o->ops->conn_gone(o, c);
    conn_free(s, c);
}

/* Reads what c sent while it is in the gate.  Returns 0 once it proved
 * itself (HELLO with the run's token and build id: WELCOME is queued),
 * else -1: it has not said enough yet, or it was dropped. */
static int admit(struct fb_objsrv *s, struct fb_oconn *c)
{
    struct fb_msg_hello m;
    if (fb_gate_serve(&s->gate, &c->peer, s->token, s->build_id, &m) != 1)
        return -1;
    fb_gate_admit(&s->gate, &c->peer);
    c->authed = 1;
    fb_conn_set_max_payload(&c->conn, s->max_payload);
    struct fb_msg_welcome w = {0};
    fb_wire_put_welcome(fb_conn_out(&c->conn), &w);
    send_now(s, c);
    return 0;
}

static void on_conn(struct fb_objsrv *s, struct fb_oconn *c, uint32_t events)
{
    if (c->doomed)
        return;
    if (events & EPOLLOUT) {
        send_now(s, c);
        return; /* the connection may be gone; read on the next round */
    }
    if (!c->authed && admit(s, c) != 0)
        return;
    int rc = fb_conn_read(&c->conn);
    struct fb_wire_hdr h;
    const uint8_t *p;
    int got;
    while (!c->doomed && (got = fb_conn_next(&c->conn, &h, &p)) == 1) {
        if (h.type != FB_MSG_OCALL) {
            conn_drop(s, c, "expected OCALL");
            return;
        }
        serve(s, c, &h, p);
        if (c->doomed) /* a send failed: reap_doomed drops it */
            return;
    }
    if (got < 0)
        conn_drop(s, c, fb_conn_err(&c->conn));
    else if (rc != 0)
        conn_drop(s, c, fb_conn_err(&c->conn));
}

/* ---- the loop ------------------------------------------------------------ */

/* Serves what a doomed client sent and we have not read yet (its replies
 * are dropped): a client that died wrote its last posted calls, a queue
 * consumer's lease acknowledgements among them, before it went, and they
 * must count before what it held is given back.  A round that brings no
 * whole frame ends it. */
static void drain_doomed(struct fb_objsrv *s, struct fb_oconn *c)
{
    for (int round = 0; c->authed && round < 64; round++) {
        int rc = fb_conn_read(&c->conn), frames = 0;
        struct fb_wire_hdr h;
        const uint8_t *p;
        while (fb_conn_next(&c->conn, &h, &p) == 1 && h.type == FB_MSG_OCALL) {
            serve(s, c, &h, p);
            frames++;
        }
        if (rc != 0 || frames == 0)
            break;
    }
}

/* Drops the connections whose sends failed.  Dropping one tells every
 * object, whose replies may doom others: hence the loop. */
static void reap_doomed(struct fb_objsrv *s)
{
    while (s->n_doomed > 0) {
        struct fb_oconn *c = s->conns;
        while (c && !c->doomed)
            c = c->next;
        if (!c) { /* cannot happen: the count and the flags agree */
            s->n_doomed = 0;
            return;
        }
        drain_doomed(s, c);
        conn_drop(s, c, fb_conn_err_or(&c->conn, "send failed"));
    }
}

/* Takes r off its wait queue and lets its object answer it. */
static void expire_req(struct fb_objsrv *s, struct fb_oreq *r)
{
    waitq_unlink(r);
    parked_unlink(r);
    struct fb_obj *o = find_obj(s, r->obj);
    if (o && o->ops->expire)
        o->ops->expire(o, r);
    else
        fb_oreq_fail(r, FIBER_ETIMEDOUT, "timed out");
}

/* Answers the parked requests whose deadline passed.  An expiry may answer
 * or free other parked requests (a barrier that breaks fails every
 * waiter), so the scan starts again after each one. */
static uint64_t expire_due(struct fb_objsrv *s, uint64_t now)
{
    for (;;) {
        struct fb_oreq *r = s->parked;
        while (r && r->deadline_ms > now)
            r = r->pnext;
        if (!r)
            break;
        expire_req(s, r);
    }
    uint64_t next = UINT64_MAX;
    for (struct fb_oreq *r = s->parked; r; r = r->pnext)
        if (r->deadline_ms < next)
            next = r->deadline_ms;
    return next;
}

/* Answers expired requests and drops silent peers; returns the time to the
 * next deadline for epoll_wait. */
static int run_timers(struct fb_objsrv *s)
{
    uint64_t now = fb_now_ms();
    uint64_t next = expire_due(s, now);
    reap_doomed(s);
    uint64_t gate_next = fb_gate_tick(&s->gate, now);
    if (gate_next < next)
        next = gate_next;
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)(next - now > 1000 ? 1000 : next - now);
}

static void accept_all(struct fb_objsrv *s)
{
    int room = fb_gate_room(&s->gate);
    for (int i = 0; i < room; i++) {
        int fd;
        int rc = fb_sock_accept(s->l.listen_fd, &fd);
        if (rc != 0)
            return;
        conn_add(s, fd);
    }
}

/* Waits for events as epoll_wait does, spinning first (adaptively, see
 * base/spin.h) when the wait would block: a request that comes within
 * the spin is served without the cost of waking a sleeping thread.  With
 * no spin budget it goes straight to the blocking wait (which returns at
 * once when events are there): one system call per wait, not two. */
static int wait_events(struct fb_objsrv *s, struct epoll_event *evs, int max,
                       int timeout)
{
    unsigned spin_us = timeout == 0 ? 0 : fb_spin_budget(&s->spin);
    if (spin_us == 0)
        return epoll_wait(s->l.epfd, evs, max, timeout);
    int n = epoll_wait(s->l.epfd, evs, max, 0);
    if (n != 0)
        return n; /* no wait: the spin neither caught nor missed */
    uint64_t until = fb_now_ns() + (uint64_t)spin_us * 1000u;
    while (n == 0 && fb_now_ns() < until)
        n = epoll_wait(s->l.epfd, evs, max, 0);
    fb_spin_result(&s->spin, n != 0);
    if (n != 0)
        return n;
    return epoll_wait(s->l.epfd, evs, max, timeout);
}

int fb_objsrv_step(struct fb_objsrv *s, int max_wait_ms)
{
    struct epoll_event evs[64];
    int timeout = run_timers(s);
    flush_dirty(s); /* the answers to expired requests */
    if (max_wait_ms >= 0 && (timeout < 0 || timeout > max_wait_ms))
        timeout = max_wait_ms;
    int n = wait_events(s, evs, 64, timeout);
    int listener = 0;
    for (int i = 0; i < n && !s->stopping; i++) {
        void *d = evs[i].data.ptr;
        if (d == EV_LISTEN)
            listener = 1;
        else if (d == EV_STOP || d == EV_CTRL)
            s->stopping = 1;
        else
            on_conn(s, d, evs[i].events);
    }
    flush_dirty(s); /* the batch's replies, one write per client */
    reap_doomed(s); /* after the batch: its events may name them */
    if (listener && !s->stopping)
        accept_all(s); /* after it too: making room closes connections */
    return n > 0 ? n : 0;
}

void fb_objsrv_run(struct fb_objsrv *s, int stop_fd)
{
    if (stop_fd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP,
                                 .data.ptr = EV_CTRL};
        epoll_ctl(s->l.epfd, EPOLL_CTL_ADD, stop_fd, &ev);
    }
    while (!s->stopping)
        fb_objsrv_step(s, -1);
}

static void *server_main(void *arg)
{
    fb_objsrv_run(arg, -1);
    return NULL;
}

int fb_objsrv_start(struct fb_objsrv **out, const char *addr,
                    const uint8_t token[FB_WIRE_TOKEN_LEN],
                    const char *build_id, int own_thread)
{
    struct fb_objsrv *s = calloc(1, sizeof *s);
    if (!s)
        return fb_err(FIBER_ENOMEM, "out of memory");
    memcpy(s->token, token, sizeof s->token);
    fb_strlcpy(s->build_id, build_id, sizeof s->build_id);
    s->max_payload = fb_rt_config()->max_message_bytes;
    fb_spin_init(&s->spin, sysconf(_SC_NPROCESSORS_ONLN) > 1 ? SPIN_US : 0);
    int rc = fb_listener_serve(&s->l, &s->gate, addr, "object server",
                               EV_LISTEN, EV_STOP, gate_close,
                               own_thread ? server_main : NULL, s,
                               "the object server thread");
    if (rc) {
        fb_objsrv_stop(s);
        return rc;
    }
    *out = s;
    return 0;
}

const char *fb_objsrv_address(const struct fb_objsrv *s)
{
    return s->l.address;
}

int fb_objsrv_stopping(const struct fb_objsrv *s) { return s->stopping; }

uint32_t fb_oconn_id(const struct fb_oconn *c) { return c->id; }

uint64_t fb_objsrv_dropped(struct fb_objsrv *s)
{
    return s->dropped + s->gate.dropped;
}

uint64_t fb_objsrv_parked(struct fb_objsrv *s)
{
    return __atomic_load_n(&s->n_parked, __ATOMIC_RELAXED);
}

void fb_objsrv_stop(struct fb_objsrv *s)
{
    if (!s)
        return;
    fb_listener_halt(&s->l, &s->gate);
    s->stopping = 1; /* the objects' destroy can tell a stop from a free */
    while (s->conns)
        conn_drop(s, s->conns, "server stopping");
    while (s->objs) {
        struct fb_obj *o = s->objs;
        s->objs = o->next;
        if (o->ops->destroy)
            o->ops->destroy(o);
        free(o);
    }
    fb_listener_close(&s->l);
    free(s);
}
