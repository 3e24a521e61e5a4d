/*
 * queue.c -- fiber_queue and fiber_pipe.
 *
 * A queue is an object on an object server (the master's, or a manager's):
 * a bounded FIFO of byte messages.  Delivery is pull-based: a consumer's
 * get asks for one item and receives one, so a slow consumer never holds
 * items others could take.  A get on an empty queue (and a put on a full
 * one) waits on the server until it can be answered, the timeout passes,
 * or the queue is closed.
 *
 * A pipe is two queues (one per direction), so either end can be handed
 * to any process of the run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/objsrv.h"
#include "core/common.h"
#include "core/runtime.h"

#define Q_PUT (FB_OP_KIND + 0)
#define Q_GET (FB_OP_KIND + 1)
#define Q_SIZE (FB_OP_KIND + 2)
#define Q_CLOSE (FB_OP_KIND + 3)
#define PIPE_CAPACITY 1024

/* ---- the server side ------------------------------------------------------ */

struct qstate {
    fiber_buf *items; /* ring of cap (or grown when unbounded) */
    size_t head, len, ring;
    size_t cap;       /* 0 = unbounded */
    int closed;
    struct fb_waitq getters, putters;
};

static int expired(const struct fb_oreq *r) { return r->deadline_ms <= fb_now_ms(); }

static int ring_grow(struct qstate *q)
{
    size_t n = q->ring ? 2 * q->ring : 16;
    fiber_buf *v = calloc(n, sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < q->len; i++)
        v[i] = q->items[(q->head + i) % q->ring];
    free(q->items);
    q->items = v;
    q->ring = n;
    q->head = 0;
    return 0;
}

static int push_item(struct qstate *q, const fiber_iov *item)
{
    if (q->len == q->ring && ring_grow(q) != 0)
        return -1;
    fiber_buf *b = &q->items[(q->head + q->len) % q->ring];
    b->len = 0;
    if (fiber_buf_append(b, item->data, item->len) != 0)
        return -1;
    q->len++;
    return 0;
}

/* Moves parked puts into the queue while there is room. */
static void admit_putters(struct qstate *q)
{
    while (q->putters.head && (q->cap == 0 || q->len < q->cap)) {
        struct fb_oreq *r = fb_waitq_pop(&q->putters);
        if (push_item(q, &r->items[0]) != 0)
            fb_oreq_fail(r, FIBER_ENOMEM, "out of memory");
        else
            fb_oreq_reply(r, 0, NULL, 0);
    }
}

static void do_get(struct qstate *q, struct fb_oreq *req)
{
    if (q->len > 0) {
        fiber_buf *b = &q->items[q->head];
        fiber_iov item = {b->data, b->len};
        fb_oreq_reply(req, 0, &item, 1);
        q->head = (q->head + 1) % q->ring;
        q->len--;
        admit_putters(q);
        return;
    }
    if (q->closed)
        fb_oreq_fail(req, FIBER_ECLOSED, "the queue is closed and empty");
    else if (expired(req))
        fb_oreq_fail(req, FIBER_EAGAIN, "the queue is empty");
    else
        fb_oreq_park(req, &q->getters);
}

static void do_put(struct qstate *q, struct fb_oreq *req)
{
    if (req->count != 1) {
        fb_oreq_fail(req, FIBER_EINVAL, "put wants one item");
        return;
    }
    if (q->closed) {
        fb_oreq_fail(req, FIBER_ECLOSED, "the queue is closed");
        return;
    }
    struct fb_oreq *getter = fb_waitq_pop(&q->getters);
    if (getter) { /* hand it straight over */
        fb_oreq_reply(getter, 0, &req->items[0], 1);
        fb_oreq_reply(req, 0, NULL, 0);
    } else if (q->cap == 0 || q->len < q->cap) {
        if (push_item(q, &req->items[0]) != 0)
            fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        else
            fb_oreq_reply(req, 0, NULL, 0);
    } else if (expired(req)) {
        fb_oreq_fail(req, FIBER_EAGAIN, "the queue is full (%zu items)",
                     q->cap);
    } else {
        fb_oreq_park(req, &q->putters);
    }
}

static void do_close(struct qstate *q, struct fb_oreq *req)
{
    q->closed = 1;
    struct fb_oreq *r;
    while ((r = fb_waitq_pop(&q->getters)))
        fb_oreq_fail(r, FIBER_ECLOSED, "the queue was closed");
    while ((r = fb_waitq_pop(&q->putters)))
        fb_oreq_fail(r, FIBER_ECLOSED, "the queue was closed");
    fb_oreq_reply(req, 0, NULL, 0);
}

static int q_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct qstate *q = o->state;
    switch (req->op) {
    case Q_PUT:
        do_put(q, req);
        break;
    case Q_GET:
        do_get(q, req);
        break;
    case Q_SIZE: {
        uint64_t n = q->len;
        fiber_iov item = {&n, 8};
        fb_oreq_reply(req, 0, &item, 1);
        break;
    }
    case Q_CLOSE:
        do_close(q, req);
        break;
    default:
        fb_oreq_fail(req, FIBER_EINVAL, "queue has no operation %d", req->op);
    }
    return 1;
}

static void q_destroy(struct fb_obj *o)
{
    struct qstate *q = o->state;
    for (size_t i = 0; i < q->ring; i++)
        fiber_buf_free(&q->items[i]);
    free(q->items);
    free(q);
}

static const struct fb_obj_ops queue_ops = {
    .call = q_call,
    .destroy = q_destroy,
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
    o->state = q;
    o->ops = &queue_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_queue = {"queue", q_create};

/* ---- handles ------------------------------------------------------------- */

#define QUEUE_MAGIC 0x51554555u /* "QUEU" */
#define PIPE_MAGIC 0x50495045u  /* "PIPE" */

struct fiber_queue {
    uint32_t magic;
    struct fb_ohandle h;
};

static unsigned long object_seq;

static int check_queue(const fiber_queue *q)
{
    if (!q || q->magic != QUEUE_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_queue handle");
    return 0;
}

static int queue_attach(fiber_queue **out, const char *addr,
                        const uint8_t *token, uint32_t obj)
{
    fiber_queue *q = calloc(1, sizeof *q);
    if (!q)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = fb_ohandle_open(&q->h, addr, token, obj);
    if (rc) {
        free(q);
        return rc;
    }
    q->magic = QUEUE_MAGIC;
    *out = q;
    return 0;
}

/* Creates a queue object named name (NULL: a fresh name) on the server at
 * addr. */
int fb_queue_create_on(fiber_queue **out, const char *addr,
                       const uint8_t *token, const char *name,
                       size_t capacity)
{
    struct fb_oclient *c;
    int rc = fb_oclient_get(addr, token, &c);
    if (rc)
        return rc;
    char fresh[64];
    if (!name) {
        snprintf(fresh, sizeof fresh, "queue-%lu",
                 __atomic_add_fetch(&object_seq, 1, __ATOMIC_RELAXED));
        name = fresh;
    }
    uint64_t cap = capacity;
    fiber_iov param = {&cap, 8};
    uint32_t id;
    rc = fb_oopen(c, "queue", name, &param, 1, &id);
    if (rc == 0)
        rc = queue_attach(out, addr, token, id);
    fb_oclient_release(c);
    return rc;
}

FIBER_API int fiber_queue_create(fiber_queue **out, size_t capacity)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_queue_create: out is NULL");
    struct fb_objsrv *s;
    int rc = fb_master_objsrv(&s);
    if (rc)
        return rc;
    return fb_queue_create_on(out, fb_objsrv_address(s), fb_rt_token(), NULL,
                              capacity);
}

FIBER_API int fiber_queue_put(fiber_queue *q, const void *data, size_t len,
                              int timeout_ms)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    if (len && !data)
        return fb_err(FIBER_EINVAL, "data is NULL with a length");
    uint32_t max = fb_rt_config()->max_message_bytes;
    if (len > max - 64)
        return fb_err(FIBER_ETOOBIG,
                      "a message of %zu bytes exceeds max_message_bytes (%u)",
                      len, max);
    fiber_iov item = {data, len};
    return fb_ocall(q->h.c, q->h.obj, Q_PUT, timeout_ms, &item, 1, NULL);
}

FIBER_API int fiber_queue_get(fiber_queue *q, fiber_buf *out, int timeout_ms)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    struct fb_oresult r = {0};
    rc = fb_ocall(q->h.c, q->h.obj, Q_GET, timeout_ms, NULL, 0, &r);
    const void *d;
    size_t len;
    if (rc == 0 && out && fb_oresult_item(&r, 0, &d, &len) == 0)
        rc = fiber_buf_append(out, d, len);
    fb_oresult_free(&r);
    return rc;
}

FIBER_API int fiber_queue_size(fiber_queue *q, size_t *n)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    struct fb_oresult r = {0};
    rc = fb_ocall(q->h.c, q->h.obj, Q_SIZE, 0, NULL, 0, &r);
    const void *d;
    size_t len;
    if (rc == 0 && fb_oresult_item(&r, 0, &d, &len) == 0 && len == 8) {
        uint64_t v;
        memcpy(&v, d, 8);
        *n = (size_t)v;
    }
    fb_oresult_free(&r);
    return rc;
}

FIBER_API int fiber_queue_close(fiber_queue *q)
{
    int rc = check_queue(q);
    return rc ? rc : fb_ocall(q->h.c, q->h.obj, Q_CLOSE, 0, NULL, 0, NULL);
}

FIBER_API int fiber_queue_serialize(fiber_queue *q, fiber_buf *out)
{
    int rc = check_queue(q);
    return rc ? rc
              : fb_handle_encode(out, FB_HANDLE_QUEUE, q->h.addr, q->h.token,
                                 q->h.obj, 0);
}

FIBER_API int fiber_queue_open(fiber_queue **out, const void *data, size_t len)
{
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj, extra;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_queue_open: out is NULL");
    int rc = fb_handle_decode(data, len, FB_HANDLE_QUEUE, addr, sizeof addr,
                              token, &obj, &extra);
    return rc ? rc : queue_attach(out, addr, token, obj);
}

FIBER_API void fiber_queue_free(fiber_queue *q)
{
    if (!q || check_queue(q))
        return;
    q->magic = 0;
    fb_ohandle_close(&q->h);
    free(q);
}

/* ---- pipes ------------------------------------------------------------ */

struct fiber_pipe {
    uint32_t magic;
    fiber_queue *send; /* NULL on a receive-only end */
    fiber_queue *recv; /* NULL on a send-only end */
};

static int check_pipe(const fiber_pipe *p)
{
    if (!p || p->magic != PIPE_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_pipe handle");
    return 0;
}

static int pipe_end(fiber_pipe **out, fiber_queue *send, fiber_queue *recv)
{
    fiber_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return fb_err(FIBER_ENOMEM, "out of memory");
    p->magic = PIPE_MAGIC;
    p->send = send;
    p->recv = recv;
    *out = p;
    return 0;
}

/* A second handle on the same queue object (each end owns its own). */
static int queue_dup(fiber_queue *q, fiber_queue **out)
{
    return queue_attach(out, q->h.addr, q->h.token, q->h.obj);
}

FIBER_API int fiber_pipe_create(fiber_pipe **a, fiber_pipe **b, int duplex)
{
    if (!a || !b)
        return fb_err(FIBER_EINVAL, "fiber_pipe_create: a or b is NULL");
    fiber_queue *ab = NULL, *ab2 = NULL, *ba = NULL, *ba2 = NULL;
    fiber_pipe *pa = NULL, *pb = NULL;
    int rc = fiber_queue_create(&ab, PIPE_CAPACITY);
    if (rc == 0)
        rc = queue_dup(ab, &ab2);
    if (rc == 0 && duplex)
        rc = fiber_queue_create(&ba, PIPE_CAPACITY);
    if (rc == 0 && duplex)
        rc = queue_dup(ba, &ba2);
    if (rc == 0)
        rc = pipe_end(&pa, ab, duplex ? ba2 : NULL);
    if (rc == 0)
        rc = pipe_end(&pb, duplex ? ba : NULL, ab2);
    if (rc) {
        free(pa);
        fiber_queue_free(ab);
        fiber_queue_free(ab2);
        fiber_queue_free(ba);
        fiber_queue_free(ba2);
        return rc;
    }
    *a = pa;
    *b = pb;
    return 0;
}

FIBER_API int fiber_pipe_send(fiber_pipe *p, const void *data, size_t len,
                              int timeout_ms)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    if (!p->send)
        return fb_err(FIBER_ENOTSUP, "this end of a one-way pipe only "
                                     "receives");
    return fiber_queue_put(p->send, data, len, timeout_ms);
}

FIBER_API int fiber_pipe_recv(fiber_pipe *p, fiber_buf *out, int timeout_ms)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    if (!p->recv)
        return fb_err(FIBER_ENOTSUP, "this end of a one-way pipe only sends");
    return fiber_queue_get(p->recv, out, timeout_ms);
}

FIBER_API int fiber_pipe_close(fiber_pipe *p)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    return p->send ? fiber_queue_close(p->send) : 0;
}

FIBER_API int fiber_pipe_serialize(fiber_pipe *p, fiber_buf *out)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    fiber_queue *any = p->send ? p->send : p->recv;
    return fb_handle_encode(out, FB_HANDLE_PIPE, any->h.addr, any->h.token,
                            p->send ? p->send->h.obj : 0,
                            p->recv ? p->recv->h.obj : 0);
}

FIBER_API int fiber_pipe_open(fiber_pipe **out, const void *data, size_t len)
{
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t send_obj, recv_obj;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_pipe_open: out is NULL");
    int rc = fb_handle_decode(data, len, FB_HANDLE_PIPE, addr, sizeof addr,
                              token, &send_obj, &recv_obj);
    fiber_queue *s = NULL, *r = NULL;
    if (rc == 0 && send_obj)
        rc = queue_attach(&s, addr, token, send_obj);
    if (rc == 0 && recv_obj)
        rc = queue_attach(&r, addr, token, recv_obj);
    if (rc == 0)
        rc = pipe_end(out, s, r);
    if (rc) {
        fiber_queue_free(s);
        fiber_queue_free(r);
    }
    return rc;
}

FIBER_API void fiber_pipe_free(fiber_pipe *p)
{
    if (!p || check_pipe(p))
        return;
    p->magic = 0;
    fiber_queue_free(p->send);
    fiber_queue_free(p->recv);
    free(p);
}
