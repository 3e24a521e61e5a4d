/*
 * queue_srv.c -- the server side of fiber_queue: a bounded FIFO of byte
 * messages on an object server (objsrv.h), with prefetching consumers
 * whose unfinished items go back to the queue when they die.
 *
 * Items move queue -> lent -> gone.  A get (Q_GET) lends a consumer up to
 * `max` items at once (its prefetch window); the consumer's application
 * takes them one by one and tells the server each time (Q_TAKEN, posted
 * without a reply, written before the application's get returns), or
 * takes one as a lease, which stays lent until Q_ACK.  An item is gone
 * only once taken or acknowledged.  When a consumer's connection goes
 * (its process died) or it releases its handle (Q_RELEASE), the items it
 * still holds go back to the front of the queue in their order, for the
 * others.  Lent items count against the capacity, so a full queue stays
 * full until the items are really taken.
 *
 * Same-host consumers (a unix-socket connection) tell the server what
 * they took through shared memory instead of Q_TAKEN: the handle makes a
 * page of FB_QACK_SLOTS bytes in the server's socket directory, names it
 * in its first get, and marks slot seq % FB_QACK_SLOTS (1 taken, 2
 * leased) before its get returns; the server reads the marks whenever it
 * needs to know (a get, a size, a put that finds no room, a consumer
 * that goes), so taking costs no system call, and the marks survive the
 * consumer's death.  A consumer holds at most FB_QGET_MAX untaken items,
 * so a slot is always read before it is used again.  Producers waiting
 * for room poll the marks every POLL_MS.
 *
 * A put (Q_PUT) carries any number of items (a producer's pipelined puts
 * travel together); those that do not fit wait on the server, in order,
 * and the put is answered when the last is in.
 *
 * Waiting getters are served oldest first.  A refill (a consumer asking
 * for its next batch while it still holds items) never waits: it is
 * answered at once, with what the queue has (maybe nothing), so items
 * go to consumers that wait with nothing in hand first.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "objsrv/objsrv.h"
#include "queue/queue_ops.h"

#define POLL_MS 2 /* how often a waiting put re-reads the consumers' marks */

enum lent_state { LENT = 0, LEASED = 1, DONE = 2 };

struct lent {
    fiber_buf buf;
    int state;
};

/* One consumer handle (a connection and the handle's id on it). */
struct consumer {
    struct fb_oconn *conn;
    uint32_t cid;
    uint64_t base_seq; /* the sequence number of ring[head] */
    struct lent *ring;
    size_t head, len, size;
    size_t held;  /* entries not DONE */
    size_t untaken; /* entries LENT */
    uint8_t *marks; /* the shared page (NULL: marks come as Q_TAKEN) */
    struct consumer *next;
};

/* Both rings (the queue's and a consumer's lent entries) have a power of
 * two of slots (they start at 16 and 64 and double), so an index wraps
 * with a mask. */
struct qstate {
    fiber_buf *items; /* ring of `ring` slots, `len` used from `head` */
    size_t head, len, ring;
    size_t cap;  /* 0 = unbounded */
    size_t held; /* lent to consumers, not yet taken */
    int closed;
    struct fb_waitq hungry, putters; /* getters wait with nothing in hand */
    struct consumer *consumers;
    struct fb_obj *obj;
};

static int expired(const struct fb_oreq *r) { return r->deadline_ms <= fb_now_ms(); }

/* A parked request's own deadline (see arm_poll). */
static uint64_t own_deadline(const struct fb_oreq *r)
{
    if (r->aux2 == 0)
        return r->deadline_ms;
    return r->aux2 == UINT64_MAX ? UINT64_MAX : r->aux2 - 1;
}

static int has_room(const struct qstate *q)
{
    return q->cap == 0 || q->len + q->held < q->cap;
}

/* ---- the queue's ring ------------------------------------------------- */

static int ring_grow(struct qstate *q)
{
    size_t n = q->ring ? 2 * q->ring : 16;
    fiber_buf *v = calloc(n, sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < q->ring; i++)
        v[i] = q->items[(q->head + i) & (q->ring - 1)];
    free(q->items);
    q->items = v;
    q->ring = n;
    q->head = 0;
    return 0;
}

static int push_back(struct qstate *q, const void *data, size_t len)
{
    if (q->len == q->ring && ring_grow(q) != 0)
        return -1;
    fiber_buf *b = &q->items[(q->head + q->len) & (q->ring - 1)];
    b->len = 0;
    if (fiber_buf_append(b, data, len) != 0)
        return -1;
    q->len++;
    return 0;
}

/* Puts buf (moved, not copied) before the oldest item. */
static int push_front(struct qstate *q, fiber_buf *buf)
{
    if (q->len == q->ring && ring_grow(q) != 0)
        return -1;
    q->head = (q->head + q->ring - 1) & (q->ring - 1);
    fiber_buf old = q->items[q->head];
    q->items[q->head] = *buf;
    *buf = old; /* the slot's spare buffer, to reuse */
    buf->len = 0;
    q->len++;
    return 0;
}

/* ---- consumers ---------------------------------------------------------- */

static struct consumer *find_consumer(struct qstate *q, struct fb_oconn *c,
                                      uint32_t cid, int create)
{
    struct consumer *k = q->consumers;
    while (k && !(k->conn == c && k->cid == cid))
        k = k->next;
    if (k || !create)
        return k;
    k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->conn = c;
    k->cid = cid;
    k->next = q->consumers;
    q->consumers = k;
    return k;
}

static struct lent *lent_at(struct consumer *k, size_t i)
{
    return &k->ring[(k->head + i) & (k->size - 1)];
}

static int lent_grow(struct consumer *k)
{
    size_t n = k->size ? 2 * k->size : 64;
    struct lent *v = calloc(n, sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < k->size; i++)
        v[i] = *lent_at(k, i);
    free(k->ring);
    k->ring = v;
    k->size = n;
    k->head = 0;
    return 0;
}

/* Moves the oldest queued item to k's ring (swapping buffers, no copy). */
static int lend_one(struct qstate *q, struct consumer *k)
{
    if (k->len == k->size && lent_grow(k) != 0)
        return -1;
    struct lent *e = lent_at(k, k->len);
    fiber_buf spare = e->buf;
    e->buf = q->items[q->head];
    e->state = LENT;
    spare.len = 0;
    q->items[q->head] = spare;
    q->head = (q->head + 1) & (q->ring - 1);
    q->len--;
    k->len++;
    k->held++;
    k->untaken++;
    q->held++;
    return 0;
}

/* Applies a take (state DONE) or a lease (LEASED) to lent entry e. */
static void settle(struct qstate *q, struct consumer *k, struct lent *e,
                   int state)
{
    e->state = state;
    k->untaken--;
    if (state == DONE) {
        k->held--;
        q->held--;
    }
}

/* Reads k's shared marks: the entries its application took since the
 * last read.  Takes are in order, so the first unmarked entry ends it. */
static void read_marks(struct qstate *q, struct consumer *k)
{
    if (!k->marks)
        return;
    for (size_t i = 0; i < k->len; i++) {
        struct lent *e = lent_at(k, i);
        if (e->state != LENT)
            continue;
        uint8_t *slot = &k->marks[(k->base_seq + i) % FB_QACK_SLOTS];
        uint8_t mark = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (mark == 0)
            break;
        __atomic_store_n(slot, 0, __ATOMIC_RELAXED);
        settle(q, k, e, mark == 2 ? LEASED : DONE);
    }
}

static void lent_trim(struct consumer *k);

static void read_all_marks(struct qstate *q)
{
    for (struct consumer *k = q->consumers; k; k = k->next) {
        read_marks(q, k);
        lent_trim(k);
    }
}

static int any_marks(const struct qstate *q)
{
    for (const struct consumer *k = q->consumers; k; k = k->next)
        if (k->marks)
            return 1;
    return 0;
}

/* Maps the page a consumer named in its first get: a regular file of
 * ours, FB_QACK_SLOTS bytes, called qack-* in the server's own socket
 * directory (nothing else: the name comes from a client).  Unlinks it
 * once mapped. */
static void map_marks(struct fb_obj *o, struct consumer *k,
                      const fiber_iov *name)
{
    const char *addr = fb_objsrv_address(o->srv);
    const char *slash = strrchr(addr, '/');
    char path[700];
    if (strncmp(addr, "unix:", 5) != 0 || !slash || name->len < 6 ||
        name->len > 64 || memcmp(name->data, "qack-", 5) != 0 ||
        memchr(name->data, '/', name->len) || memchr(name->data, 0, name->len))
        return;
    snprintf(path, sizeof path, "%.*s/%.*s", (int)(slash - (addr + 5)),
             addr + 5, (int)name->len, (const char *)name->data);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_uid == geteuid() && st.st_size == FB_QACK_SLOTS) {
        void *p = mmap(NULL, FB_QACK_SLOTS, PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
            k->marks = p;
            unlink(path);
        }
    }
    close(fd);
}

/* Drops the finished entries at the front of k's ring. */
static void lent_trim(struct consumer *k)
{
    while (k->len > 0 && lent_at(k, 0)->state == DONE) {
        lent_at(k, 0)->buf.len = 0;
        k->head = (k->head + 1) & (k->size - 1);
        k->len--;
        k->base_seq++;
    }
}

/* Gives back (to the queue's front, in order) what k still holds, and
 * frees k. */
static void consumer_drop(struct qstate *q, struct consumer *k)
{
    read_marks(q, k); /* what it took is gone, not back */
    size_t back = 0;
    for (size_t i = k->len; i-- > 0;) {
        struct lent *e = lent_at(k, i);
        if (e->state == DONE)
            continue;
        if (push_front(q, &e->buf) != 0)
            fb_log_warn("queue: out of memory giving back an item");
        back++;
    }
    q->held -= k->held;
    if (back)
        fb_log_debug("queue: %zu items of a consumer that went are back "
                     "in the queue", back);
    for (size_t i = 0; i < k->size; i++)
        fiber_buf_free(&k->ring[i].buf);
    free(k->ring);
    if (k->marks)
        munmap(k->marks, FB_QACK_SLOTS);
    struct consumer **pp = &q->consumers;
    while (*pp && *pp != k)
        pp = &(*pp)->next;
    if (*pp)
        *pp = k->next;
    free(k);
}

/* ---- serving ------------------------------------------------------------ */

static void admit_putters(struct qstate *q);
static void serve_getters(struct qstate *q);
static void arm_poll(struct qstate *q);

/* The get's arguments: consumer id, window, flags. */
struct get_args {
    uint32_t cid, max, flags;
};

static int get_args(const struct fb_oreq *r, struct get_args *a)
{
    if (r->count < 3 || r->count > 4 || fb_item_u32(r, 0, &a->cid) || fb_item_u32(r, 1, &a->max) ||
        fb_item_u32(r, 2, &a->flags) || a->max == 0 ||
        (a->flags & ~(uint32_t)FB_QGET_REFILL))
        return -1;
    if (a->max > FB_QGET_MAX)
        a->max = FB_QGET_MAX;
    return 0;
}

/* Lends up to the get's window and answers it: u64 first sequence
 * number | u64 flags (FB_QREPLY_MARKS: the server reads this consumer's
 * shared marks), then the items. */
static void answer_get(struct fb_obj *o, struct qstate *q, struct fb_oreq *req,
                       const struct get_args *a)
{
    struct consumer *k = find_consumer(q, req->conn, a->cid, 0);
    if (!k && (k = find_consumer(q, req->conn, a->cid, 1)) &&
        req->count == 4)
        map_marks(o, k, &req->items[3]);
    if (k) {
        read_marks(q, k);
        lent_trim(k);
    }
    size_t n = q->len < a->max ? q->len : a->max;
    if (q->hungry.head && (a->flags & FB_QGET_REFILL))
        n = 0; /* others wait with nothing in hand */
    if (k && n > FB_QGET_MAX - k->untaken)
        n = FB_QGET_MAX - k->untaken; /* see read_marks */
    fiber_iov *items = k ? malloc((n + 1) * sizeof *items) : NULL;
    if (!items) {
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        return;
    }
    uint64_t head[2] = {k->base_seq + k->len, k->marks ? FB_QREPLY_MARKS : 0};
    size_t lent = 0;
    while (lent < n && lend_one(q, k) == 0)
        lent++;
    items[0] = (fiber_iov){head, sizeof head};
    for (size_t i = 0; i < lent; i++) {
        struct lent *e = lent_at(k, k->len - lent + i);
        items[1 + i] = (fiber_iov){e->buf.data, e->buf.len};
    }
    fb_oreq_reply(req, 0, items, lent + 1);
    free(items);
}

static void do_get(struct fb_obj *o, struct qstate *q, struct fb_oreq *req)
{
    struct get_args a;
    if (get_args(req, &a) != 0) {
        fb_oreq_fail(req, FIBER_EINVAL,
                     "get wants a consumer id, a window of 1 or more and "
                     "known flags");
        return;
    }
    /* What this consumer took since it last asked frees room: let
     * waiting puts in first (and have them poll, now that marks exist). */
    struct consumer *k = find_consumer(q, req->conn, a.cid, 0);
    if (k) {
        read_marks(q, k);
        lent_trim(k);
    }
    if (q->putters.head)
        admit_putters(q);
    if ((q->len > 0 && !q->hungry.head) || (a.flags & FB_QGET_REFILL)) {
        answer_get(o, q, req, &a); /* a refill never waits: maybe 0 */
    } else if (q->closed) {
        fb_oreq_fail(req, FIBER_ECLOSED, "the queue is closed and empty");
    } else if (expired(req)) {
        fb_oreq_fail(req, FIBER_EAGAIN, "the queue is empty");
    } else {
        fb_oreq_park(req, &q->hungry);
    }
}

/* Hands queued items to parked getters, oldest first. */
static void serve_getters(struct qstate *q)
{
    while (q->len > 0) {
        struct fb_oreq *r = fb_waitq_pop(&q->hungry);
        if (!r)
            return;
        struct get_args a;
        get_args(r, &a); /* checked when it was parked */
        answer_get(q->obj, q, r, &a);
    }
}

/* Adds a put's items from index aux on while there is room; returns 1 if
 * all are in. */
static int put_some(struct qstate *q, struct fb_oreq *r)
{
    while (r->aux < r->count && has_room(q)) {
        const fiber_iov *it = &r->items[r->aux];
        if (push_back(q, it->data, it->len) != 0)
            return -1;
        r->aux++;
    }
    return r->aux == r->count;
}

/* Moves parked puts into the queue while there is room. */
static void admit_putters(struct qstate *q)
{
    while (q->putters.head && has_room(q)) {
        int in = put_some(q, q->putters.head);
        if (in == 0)
            break;
        struct fb_oreq *r = fb_waitq_pop(&q->putters);
        if (in < 0)
            fb_oreq_fail(r, FIBER_ENOMEM, "out of memory");
        else
            fb_oreq_reply(r, 0, NULL, 0);
    }
    serve_getters(q);
    arm_poll(q);
}

/* While puts wait for room and consumers mark takes in shared memory
 * (which sends no message), the oldest waiting put wakes every POLL_MS
 * to read the marks (q_expire); its own deadline is kept in aux2 + 1. */
static void arm_poll(struct qstate *q)
{
    struct fb_oreq *r = q->putters.head;
    if (!r || !any_marks(q))
        return;
    if (r->aux2 == 0)
        r->aux2 = r->deadline_ms == UINT64_MAX ? UINT64_MAX
                                               : r->deadline_ms + 1;
    uint64_t poll_at = fb_now_ms() + POLL_MS;
    uint64_t own = own_deadline(r);
    r->deadline_ms = poll_at < own ? poll_at : own;
}

static void do_put(struct qstate *q, struct fb_oreq *req)
{
    if (req->count < 1) {
        fb_oreq_fail(req, FIBER_EINVAL, "put wants at least one item");
        return;
    }
    if (q->closed) {
        fb_oreq_fail(req, FIBER_ECLOSED, "the queue is closed");
        return;
    }
    req->aux = 0;
    req->aux2 = 0;
    int in = q->putters.head ? 0 : put_some(q, req); /* keep the order */
    if (in == 0 && !q->putters.head && any_marks(q)) {
        read_all_marks(q); /* takes not heard of yet free room */
        in = put_some(q, req);
    }
    if (in < 0)
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
    else if (in == 1)
        fb_oreq_reply(req, 0, NULL, 0);
    else if (expired(req) && req->aux == 0)
        fb_oreq_fail(req, FIBER_EAGAIN, "the queue is full (%zu items)",
                     q->cap);
    else
        fb_oreq_park(req, &q->putters);
    serve_getters(q);
    arm_poll(q);
}

/* A waiting put's poll (arm_poll) or deadline came; other requests time
 * out as the server would answer them. */
static void q_expire(struct fb_obj *o, struct fb_oreq *r)
{
    struct qstate *q = o->state;
    uint64_t own = own_deadline(r);
    if (r->op != FB_QOP_PUT || fb_now_ms() >= own) {
        fb_oreq_fail(r, FIBER_ETIMEDOUT, "timed out");
        return;
    }
    r->deadline_ms = own;
    r->aux2 = 0;
    fb_oreq_park_front(r, &q->putters); /* it keeps its place */
    read_all_marks(q);
    admit_putters(q);
}

/* TAKEN (cid, seq, how) and ACK (cid, seq): posted, never answered. */
static void do_taken(struct qstate *q, struct fb_oreq *req, int ack)
{
    uint32_t cid, how = 0;
    int64_t seq;
    struct consumer *k = NULL;
    if (ack)
        read_all_marks(q); /* the lease may be known only from a mark */
    int ok = fb_item_u32(req, 0, &cid) == 0 &&
             fb_item_i64(req, 1, &seq) == 0 &&
             (ack ? req->count == 2
                  : req->count == 3 && fb_item_u32(req, 2, &how) == 0 &&
                        how <= 1) &&
             (k = find_consumer(q, req->conn, cid, 0)) != NULL &&
             (uint64_t)seq >= k->base_seq &&
             (uint64_t)seq - k->base_seq < k->len;
    struct lent *e = ok ? lent_at(k, (size_t)((uint64_t)seq - k->base_seq))
                        : NULL;
    if (!e || e->state != (ack ? LEASED : LENT)) {
        fb_log_warn("queue: ignoring a %s that names no item the client "
                    "holds", ack ? "lease acknowledgement" : "take");
        fb_oreq_done(req);
        return;
    }
    if (ack) {
        e->state = DONE;
        k->held--;
        q->held--;
    } else {
        settle(q, k, e, how == 1 ? LEASED : DONE);
    }
    lent_trim(k);
    admit_putters(q);
    fb_oreq_done(req);
}

static void do_release(struct qstate *q, struct fb_oreq *req)
{
    uint32_t cid;
    struct consumer *k = NULL;
    if (fb_item_u32(req, 0, &cid) == 0)
        k = find_consumer(q, req->conn, cid, 0);
    if (k) {
        consumer_drop(q, k);
        serve_getters(q);
        admit_putters(q);
    }
    fb_oreq_done(req);
}

static void fail_all(struct fb_waitq *wq, const char *why)
{
    struct fb_oreq *r;
    while ((r = fb_waitq_pop(wq)))
        fb_oreq_fail(r, FIBER_ECLOSED, "%s", why);
}

static void do_close(struct qstate *q, struct fb_oreq *req)
{
    q->closed = 1;
    fail_all(&q->hungry, "the queue was closed");
    fail_all(&q->putters, "the queue was closed");
    fb_oreq_reply(req, 0, NULL, 0);
}

static int q_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct qstate *q = o->state;
    switch (req->op) {
    case FB_QOP_PUT:
        do_put(q, req);
        break;
    case FB_QOP_GET:
        do_get(o, q, req);
        break;
    case FB_QOP_SIZE: {
        read_all_marks(q);
        uint64_t n = q->len + q->held;
        fiber_iov item = {&n, 8};
        fb_oreq_reply(req, 0, &item, 1);
        break;
    }
    case FB_QOP_CLOSE:
        do_close(q, req);
        break;
    case FB_QOP_TAKEN:
    case FB_QOP_ACK:
        do_taken(q, req, req->op == FB_QOP_ACK);
        break;
    case FB_QOP_RELEASE:
        do_release(q, req);
        break;
    case FB_QOP_FREE: /* the creator's fiber_queue_free */
        fb_oreq_reply(req, 0, NULL, 0);
        fb_obj_destroy(o); /* its waiters fail with FIBER_ECLOSED */
        break;
    default:
        fb_oreq_fail(req, FIBER_EINVAL, "queue has no operation %d", req->op);
    }
    return 1;
}

/* A client went: the items its consumers held go back to the queue. */
static void q_conn_gone(struct fb_obj *o, struct fb_oconn *c)
{
    struct qstate *q = o->state;
    struct consumer *k = q->consumers, *next;
    int any = 0;
    for (; k; k = next) {
        next = k->next;
        if (k->conn == c) {
            consumer_drop(q, k);
            any = 1;
        }
    }
    if (any) {
        serve_getters(q);
        admit_putters(q);
    }
}

/* Frees everything the queue holds: its messages, what consumers hold
 * (lent and leased messages go with the queue: an ack that comes later
 * names no item and is dropped), the consumers' mark pages.  Its waiting
 * gets and puts were answered FIBER_ECLOSED before (fb_obj_destroy). */
static void q_destroy(struct fb_obj *o)
{
    struct qstate *q = o->state;
    while (q->consumers) {
        struct consumer *k = q->consumers;
        q->consumers = k->next;
        for (size_t i = 0; i < k->size; i++)
            fiber_buf_free(&k->ring[i].buf);
        free(k->ring);
        if (k->marks)
            munmap(k->marks, FB_QACK_SLOTS);
        free(k);
    }
    for (size_t i = 0; i < q->ring; i++)
        fiber_buf_free(&q->items[i]);
    free(q->items);
    free(q);
}

static const struct fb_obj_ops queue_ops = {
    .call = q_call,
    .conn_gone = q_conn_gone,
    .destroy = q_destroy,
    .expire = q_expire,
    .freeable = 1,
};

static int q_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    uint64_t cap = 0;
    if (n >= 1 && params[0].len == 8)
        memcpy(&cap, params[0].data, 8);
    struct qstate *q = calloc(1, sizeof *q);
    if (!q)
        return fb_err(FIBER_ENOMEM, "out of memory");
    q->cap = (size_t)cap;
    q->obj = o;
    o->state = q;
    o->ops = &queue_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_queue = {"queue", q_create};
