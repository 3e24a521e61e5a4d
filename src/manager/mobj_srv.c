/*
 * mobj_srv.c -- the shared objects a manager hosts, the server's side: the
 * kinds its object server runs in its own memory (list, event, semaphore,
 * barrier, condition, custom).  Dict, value, lock and rlock keep their
 * state in shared memory, so that local clients make their calls
 * themselves: mobj_shm.c.  Their handles and operations are mobj.c's;
 * the operations between the two are mobj_ops.h.
 *
 * Every object lives in the manager's one server thread, so an operation
 * is atomic with respect to every other: a value's add or compare-and-swap
 * needs no lock of its own, and a custom method sees its state alone.
 *
 * Owners.  A lock, rlock or condition remembers who holds it: the client's
 * connection (one per process and server) and a thread id the client
 * sends with each call, so two threads of one process are two owners.
 * When a client's connection goes (the process exited or was killed), the
 * server tells every object (conn_gone) and the locks it held pass to
 * their next waiter.  Semaphores are not released, as in Python: a
 * semaphore has no owner.
 *
 * Lifetime.  An object lives until a client releases it (FB_OP_FREE, sent
 * by fiber_mobj_release: objsrv.c answers its parked calls FIBER_ECLOSED,
 * then the kind's destroy frees its state) or the manager stops.
 *
 * Waiting.  A call that cannot be answered yet (an acquire of a held lock,
 * a wait on an unset event) is parked on the object's wait queue until it
 * can, or until its deadline: a timeout of 0 that would wait fails at once
 * with FIBER_EAGAIN, a positive one with FIBER_ETIMEDOUT when it passes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "manager/mobj_ops.h"
#include "objsrv/objsrv.h"
#include "runtime/task.h"

static int expired(const struct fb_oreq *r)
{
    return r->deadline_ms <= fb_now_ms();
}

/* Answers every request parked on q with status and text. */
static void fail_all(struct fb_waitq *q, int status, const char *text)
{
    struct fb_oreq *r;
    while ((r = fb_waitq_pop(q)))
        fb_oreq_fail(r, status, "%s", text);
}

/* ---- list: a vector of byte strings ------------------------------------ */

struct list {
    fiber_buf *items;
    size_t len, cap;
};

/* Resolves item i of req as a Python-style index (negative counts from
 * the end).  Returns 0, or -1 after failing req. */
static int list_index(const struct list *l, struct fb_oreq *req, uint32_t i,
                      size_t *at)
{
    int64_t v;
    if (fb_item_i64(req, i, &v) != 0) {
        fb_oreq_fail(req, FIBER_EINVAL, "a list index is an int64");
        return -1;
    }
    int64_t len = (int64_t)l->len;
    if (v < 0)
        v += len;
    if (v < 0 || v >= len) {
        fb_oreq_fail(req, FIBER_ENOKEY, "list index out of range (%zu "
                                        "items)", l->len);
        return -1;
    }
    *at = (size_t)v;
    return 0;
}

static void list_append(struct list *l, struct fb_oreq *req)
{
    if (l->len == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        fiber_buf *v = realloc(l->items, cap * sizeof *v);
        if (!v) {
            fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
            return;
        }
        l->items = v;
        l->cap = cap;
    }
    fiber_buf b = {0};
    if (fiber_buf_append(&b, req->items[0].data, req->items[0].len) != 0) {
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        return;
    }
    l->items[l->len++] = b;
    reply_ok(req);
}

static void list_set(struct list *l, struct fb_oreq *req)
{
    size_t at;
    if (list_index(l, req, 0, &at) != 0)
        return;
    fiber_buf b = {0};
    if (fiber_buf_append(&b, req->items[1].data, req->items[1].len) != 0) {
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        return;
    }
    fiber_buf_free(&l->items[at]);
    l->items[at] = b;
    reply_ok(req);
}

static void list_get_or_pop(struct list *l, struct fb_oreq *req, int pop)
{
    size_t at;
    if (list_index(l, req, 0, &at) != 0)
        return;
    fiber_iov item = {l->items[at].data, l->items[at].len};
    fb_oreq_reply(req, 0, &item, 1); /* copies the bytes */
    if (!pop)
        return;
    fiber_buf_free(&l->items[at]);
    memmove(&l->items[at], &l->items[at + 1],
            (l->len - at - 1) * sizeof *l->items);
    l->len--;
}

static int list_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct list *l = o->state;
    if (req->op < L_APPEND || req->op > L_POP) {
        no_such_op(o, req);
        return 1;
    }
    uint32_t want = req->op == L_SET ? 2 : req->op == L_LEN ? 0 : 1;
    if (req->count != want) {
        bad_args(o, req);
        return 1;
    }
    switch (req->op) {
    case L_APPEND: list_append(l, req); break;
    case L_GET: list_get_or_pop(l, req, 0); break;
    case L_SET: list_set(l, req); break;
    case L_LEN: reply_i64(req, (int64_t)l->len); break;
    case L_POP: list_get_or_pop(l, req, 1); break;
    default: no_such_op(o, req);
    }
    return 1;
}

static void list_destroy(struct fb_obj *o)
{
    struct list *l = o->state;
    for (size_t i = 0; i < l->len; i++)
        fiber_buf_free(&l->items[i]);
    free(l->items);
    free(l);
}

static const struct fb_obj_ops list_ops = {.call = list_call,
                                           .destroy = list_destroy,
                                           .freeable = 1};

static int list_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    struct list *l = calloc(1, sizeof *l);
    if (!l)
        return fb_err(FIBER_ENOMEM, "out of memory");
    o->state = l;
    o->ops = &list_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_list = {"list", list_create};

/* ---- owned locks: lock, rlock and a condition's lock ------------------- */

struct owner {
    const struct fb_oconn *conn;
    uint64_t thread;
};

struct olock {
    int recursive;
    uint32_t depth;          /* 0: free; >1 only when recursive */
    struct owner holder;     /* valid while depth > 0 */
    struct fb_waitq waiters; /* acquires, and condition waiters that must
                                get the lock back before they return */
};

/* A parked acquire keeps in aux the depth it takes the lock with and the
 * status it is answered with once it has it: 0 for an acquire or a
 * notified condition wait, FIBER_ETIMEDOUT (or FIBER_EAGAIN) for a
 * condition wait whose time ran out, which still returns holding the lock
 * (as Python's Condition.wait does). */
static uint64_t aux_make(uint32_t depth, int status)
{
    return (uint64_t)depth | (uint64_t)(uint32_t)status << 32;
}
static uint32_t aux_depth(uint64_t aux) { return (uint32_t)aux; }
static int aux_status(uint64_t aux) { return (int32_t)(uint32_t)(aux >> 32); }

/* The caller's identity: its connection and the thread id in item 0. */
static int req_owner(const struct fb_oreq *req, struct owner *o)
{
    uint64_t t;
    if (req->count < 1 || req->items[0].len != 8)
        return -1;
    memcpy(&t, req->items[0].data, 8);
    o->conn = req->conn;
    o->thread = t;
    return 0;
}

static int holds(const struct olock *l, const struct owner *o)
{
    return l->depth > 0 && l->holder.conn == o->conn &&
           l->holder.thread == o->thread;
}

/* Gives the free lock l to req and answers it. */
static void olock_grant(struct olock *l, struct fb_oreq *req)
{
    req_owner(req, &l->holder); /* checked when the request arrived */
    l->depth = aux_depth(req->aux);
    int status = aux_status(req->aux);
    if (status == 0)
        reply_ok(req);
    else
        fb_oreq_fail(req, status, "%s; the lock is held again",
                     status == FIBER_EAGAIN ? "not notified (timeout 0)"
                                            : "timed out waiting for a "
                                              "notify");
}

/* The holder let go entirely: the oldest waiter gets the lock. */
static void olock_handoff(struct olock *l)
{
    l->depth = 0;
    memset(&l->holder, 0, sizeof l->holder);
    struct fb_oreq *next = fb_waitq_pop(&l->waiters);
    if (next)
        olock_grant(l, next);
}

/* Queues req (its aux set) for l with no deadline: a condition waiter must
 * get its lock back however long that takes. */
static void olock_enqueue(struct olock *l, struct fb_oreq *req)
{
    req->deadline_ms = UINT64_MAX;
    if (l->depth == 0)
        olock_grant(l, req);
    else
        fb_oreq_park(req, &l->waiters);
}

static void olock_acquire(struct olock *l, struct fb_obj *o,
                          struct fb_oreq *req)
{
    struct owner me;
    if (req->count != 1 || req_owner(req, &me) != 0) {
        bad_args(o, req);
        return;
    }
    req->aux = aux_make(1, 0);
    if (l->depth == 0) {
        olock_grant(l, req);
    } else if (l->recursive && holds(l, &me)) {
        l->depth++;
        reply_ok(req);
    } else if (expired(req)) {
        fb_oreq_fail(req, FIBER_EAGAIN, "%s '%s' is held", o->kind, o->name);
    } else {
        fb_oreq_park(req, &l->waiters);
    }
}

/* A plain lock may be released by anyone, as Python's Lock; an rlock or a
 * condition's lock only by its holder. */
static void olock_release(struct olock *l, struct fb_obj *o,
                          struct fb_oreq *req)
{
    struct owner me;
    if (req->count != 1 || req_owner(req, &me) != 0) {
        bad_args(o, req);
        return;
    }
    if (l->depth == 0) {
        fb_oreq_fail(req, FIBER_ESTATE, "%s '%s' is not held", o->kind,
                     o->name);
        return;
    }
    if (l->recursive && !holds(l, &me)) {
        fb_oreq_fail(req, FIBER_ESTATE, "%s '%s' is held by another thread "
                     "or process", o->kind, o->name);
        return;
    }
    reply_ok(req);
    if (!l->recursive || --l->depth == 0)
        olock_handoff(l);
}

/* A client went: a lock it held passes on. */
static void olock_conn_gone(struct olock *l, const struct fb_oconn *c)
{
    if (l->depth > 0 && l->holder.conn == c)
        olock_handoff(l);
}


/* ---- condition: a recursive lock and the waiters for a notify ---------- */

struct cond {
    struct olock lock;
    struct fb_waitq waiters; /* in wait(), lock released */
};

/* Checks that req comes from the lock's holder; fails it if not. */
static int cond_holder(struct cond *cv, struct fb_obj *o, struct fb_oreq *req)
{
    struct owner me;
    if (req->count < 1 || req_owner(req, &me) != 0) {
        bad_args(o, req);
        return -1;
    }
    if (!holds(&cv->lock, &me)) {
        fb_oreq_fail(req, FIBER_ESTATE, "condition '%s': wait and notify "
                     "need its lock held by the caller", o->name);
        return -1;
    }
    return 0;
}

/* Releases the lock entirely (remembering its depth) and waits for a
 * notify; with timeout 0, takes the lock straight back. */
static void cond_wait(struct cond *cv, struct fb_obj *o, struct fb_oreq *req)
{
    if (req->count != 1) {
        bad_args(o, req); /* answered: a request left unanswered leaks */
        return;
    }
    if (cond_holder(cv, o, req) != 0)
        return;
    uint32_t depth = cv->lock.depth;
    olock_handoff(&cv->lock);
    if (expired(req)) {
        req->aux = aux_make(depth, FIBER_EAGAIN);
        olock_enqueue(&cv->lock, req);
    } else {
        req->aux = aux_make(depth, 0);
        fb_oreq_park(req, &cv->waiters);
    }
}

/* Wakes up to n waiters (n < 0: all); each returns once it has the lock
 * back, after the notifier releases it. */
static void cond_notify(struct cond *cv, struct fb_obj *o,
                        struct fb_oreq *req)
{
    int64_t n;
    if (req->count != 2 || fb_item_i64(req, 1, &n) != 0) {
        bad_args(o, req);
        return;
    }
    if (cond_holder(cv, o, req) != 0)
        return;
    struct fb_oreq *w;
    for (; n != 0 && (w = fb_waitq_pop(&cv->waiters)); n--)
        olock_enqueue(&cv->lock, w);
    reply_ok(req);
}

static int cond_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct cond *cv = o->state;
    switch (req->op) {
    case K_ACQUIRE: olock_acquire(&cv->lock, o, req); break;
    case K_RELEASE: olock_release(&cv->lock, o, req); break;
    case C_WAIT: cond_wait(cv, o, req); break;
    case C_NOTIFY: cond_notify(cv, o, req); break;
    default: no_such_op(o, req);
    }
    return 1;
}

/* A waiter whose time ran out still returns holding the lock. */
static void cond_expire(struct fb_obj *o, struct fb_oreq *req)
{
    struct cond *cv = o->state;
    if (req->op != C_WAIT) {
        fb_oreq_fail(req, FIBER_ETIMEDOUT, "timed out waiting for the lock "
                     "of condition '%s'", o->name);
        return;
    }
    req->aux = aux_make(aux_depth(req->aux), FIBER_ETIMEDOUT);
    olock_enqueue(&cv->lock, req);
}

static void cond_conn_gone(struct fb_obj *o, struct fb_oconn *c)
{
    struct cond *cv = o->state;
    olock_conn_gone(&cv->lock, c);
}

static void cond_destroy(struct fb_obj *o) { free(o->state); }

static const struct fb_obj_ops cond_ops = {.call = cond_call,
                                           .conn_gone = cond_conn_gone,
                                           .destroy = cond_destroy,
                                           .expire = cond_expire,
                                           .freeable = 1};

static int cond_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    struct cond *cv = calloc(1, sizeof *cv);
    if (!cv)
        return fb_err(FIBER_ENOMEM, "out of memory");
    cv->lock.recursive = 1; /* Python's Condition() uses an RLock */
    o->state = cv;
    o->ops = &cond_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_condition = {"condition", cond_create};

/* ---- event ------------------------------------------------------------- */

struct event {
    int set;
    struct fb_waitq waiters;
};

static void event_wait(struct event *e, struct fb_obj *o, struct fb_oreq *req)
{
    if (e->set)
        reply_ok(req);
    else if (expired(req))
        fb_oreq_fail(req, FIBER_EAGAIN, "event '%s' is not set", o->name);
    else
        fb_oreq_park(req, &e->waiters);
}

static int event_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct event *e = o->state;
    struct fb_oreq *w;
    switch (req->op) {
    case E_SET:
        e->set = 1;
        while ((w = fb_waitq_pop(&e->waiters)))
            reply_ok(w);
        reply_ok(req);
        break;
    case E_CLEAR: e->set = 0; reply_ok(req); break;
    case E_IS_SET: reply_i64(req, e->set); break;
    case E_WAIT: event_wait(e, o, req); break;
    default: no_such_op(o, req);
    }
    return 1;
}

static void event_destroy(struct fb_obj *o) { free(o->state); }

static const struct fb_obj_ops event_ops = {.call = event_call,
                                            .destroy = event_destroy,
                                            .freeable = 1};

static int event_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    struct event *e = calloc(1, sizeof *e);
    if (!e)
        return fb_err(FIBER_ENOMEM, "out of memory");
    o->state = e;
    o->ops = &event_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_event = {"event", event_create};

/* ---- semaphore --------------------------------------------------------- */

struct sem {
    int64_t value;
    struct fb_waitq waiters;
};

static int sem_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct sem *s = o->state;
    struct fb_oreq *w;
    switch (req->op) {
    case S_ACQUIRE:
        if (s->value > 0) {
            s->value--;
            reply_ok(req);
        } else if (expired(req)) {
            fb_oreq_fail(req, FIBER_EAGAIN, "semaphore '%s' is at 0",
                         o->name);
        } else {
            fb_oreq_park(req, &s->waiters);
        }
        break;
    case S_RELEASE: /* the oldest waiter takes the unit at once */
        if ((w = fb_waitq_pop(&s->waiters)))
            reply_ok(w);
        else
            s->value++;
        reply_ok(req);
        break;
    default: no_such_op(o, req);
    }
    return 1;
}

static void sem_destroy(struct fb_obj *o) { free(o->state); }

static const struct fb_obj_ops sem_ops = {.call = sem_call,
                                          .destroy = sem_destroy,
                                          .freeable = 1};

static int sem_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    int64_t initial = 1;
    if (n >= 1 && params[0].len == 8)
        memcpy(&initial, params[0].data, 8);
    if (initial < 0)
        return fb_err(FIBER_EINVAL, "a semaphore's initial value must be "
                                    ">= 0, not %lld", (long long)initial);
    struct sem *s = calloc(1, sizeof *s);
    if (!s)
        return fb_err(FIBER_ENOMEM, "out of memory");
    s->value = initial;
    o->state = s;
    o->ops = &sem_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_semaphore = {"semaphore", sem_create};

/* ---- barrier ----------------------------------------------------------- */

struct barrier {
    uint32_t parties;
    int broken;
    struct fb_waitq waiters; /* arrived, in order */
};

/* The last party arrived: everyone goes, each with its arrival index. */
static void barrier_release(struct barrier *b, struct fb_oreq *last)
{
    int64_t index = 0;
    struct fb_oreq *w;
    while ((w = fb_waitq_pop(&b->waiters)))
        reply_i64(w, index++);
    reply_i64(last, index);
}

static void barrier_break(struct barrier *b, const char *why)
{
    b->broken = 1;
    fail_all(&b->waiters, FIBER_ESTATE, why);
}

static void barrier_wait(struct barrier *b, struct fb_obj *o,
                         struct fb_oreq *req)
{
    if (b->broken) {
        fb_oreq_fail(req, FIBER_ESTATE, "barrier '%s' is broken (a waiter "
                     "timed out); reset it", o->name);
    } else if (b->waiters.len + 1 >= b->parties) {
        barrier_release(b, req);
    } else if (expired(req)) {
        /* As Python's: a wait that gives up breaks the barrier for all. */
        barrier_break(b, "the barrier broke: a waiter gave up");
        fb_oreq_fail(req, FIBER_EAGAIN, "barrier '%s': not all %u parties "
                     "are waiting; the barrier is now broken", o->name,
                     b->parties);
    } else {
        fb_oreq_park(req, &b->waiters);
    }
}

static int barrier_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct barrier *b = o->state;
    switch (req->op) {
    case B_WAIT: barrier_wait(b, o, req); break;
    case B_RESET:
        barrier_break(b, "the barrier was reset while waiting");
        b->broken = 0;
        reply_ok(req);
        break;
    default: no_such_op(o, req);
    }
    return 1;
}

static void barrier_expire(struct fb_obj *o, struct fb_oreq *req)
{
    barrier_break(o->state, "the barrier broke: a waiter timed out");
    fb_oreq_fail(req, FIBER_ETIMEDOUT, "timed out at barrier '%s'; it is "
                 "now broken", o->name);
}

static void barrier_destroy(struct fb_obj *o) { free(o->state); }

static const struct fb_obj_ops barrier_ops = {.call = barrier_call,
                                              .destroy = barrier_destroy,
                                              .expire = barrier_expire,
                                              .freeable = 1};

static int barrier_create(struct fb_obj *o, const fiber_iov *params,
                          uint32_t n)
{
    uint32_t parties = 0;
    if (n >= 1 && params[0].len == 4)
        memcpy(&parties, params[0].data, 4);
    if (parties == 0)
        return fb_err(FIBER_EINVAL, "a barrier needs at least one party");
    struct barrier *b = calloc(1, sizeof *b);
    if (!b)
        return fb_err(FIBER_ENOMEM, "out of memory");
    b->parties = parties;
    o->state = b;
    o->ops = &barrier_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_barrier = {"barrier", barrier_create};

/* ---- custom: user state and registered tasks as its methods ------------ */

/* The state of the custom object whose method runs on this thread (the
 * server's), for fiber_manager_state(); NULL between calls.  A hook by
 * design: the task signature has no room for it. */
static _Thread_local fiber_buf *method_state;

FIBER_API int fiber_manager_state(fiber_buf **state)
{
    if (!state)
        return fb_err(FIBER_EINVAL, "fiber_manager_state: state is NULL");
    if (!method_state)
        return fb_err(FIBER_ESTATE, "fiber_manager_state: not inside a "
                                    "custom object's method");
    *state = method_state;
    return 0;
}

/* Runs the task named in item 0 with the argument in item 1, its state
 * reachable through fiber_manager_state(). */
static void custom_run(fiber_buf *state, struct fb_oreq *req)
{
    char name[FB_WIRE_NAME_MAX + 1];
    const fiber_iov *task = &req->items[0], *arg = &req->items[1];
    fiber_task_fn fn;
    if (task->len == 0 || task->len >= sizeof name) {
        fb_oreq_fail(req, FIBER_EINVAL, "a method is a task name");
        return;
    }
    memcpy(name, task->data, task->len);
    name[task->len] = '\0';
    if (fiber_task_lookup(name, &fn) != 0) {
        fb_oreq_fail(req, FIBER_ENOTASK, "%s", fiber_last_error());
        return;
    }
    /* A copy, aligned, as a process's task gets: items are packed. */
    void *copy = malloc(arg->len ? arg->len : 1);
    if (!copy) {
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        return;
    }
    memcpy(copy, arg->data, arg->len);
    fiber_buf out = {0};
    fb_task_failure_clear();
    method_state = state;
    int rc = fn(copy, arg->len, &out);
    method_state = NULL;
    const char *why = fb_task_failure();
    fiber_iov result = {out.data, out.len};
    if (rc == 0)
        fb_oreq_reply(req, 0, &result, 1);
    else if (why[0])
        fb_oreq_fail(req, FIBER_ETASK, "%s", why);
    else
        fb_oreq_fail(req, FIBER_ETASK, "method '%s' returned %d", name, rc);
    fiber_buf_free(&out);
    free(copy);
}

static int custom_call(struct fb_obj *o, struct fb_oreq *req)
{
    if (req->op != U_CALL)
        no_such_op(o, req);
    else if (req->count != 2)
        bad_args(o, req);
    else
        custom_run(o->state, req);
    return 1;
}

static void custom_destroy(struct fb_obj *o)
{
    fiber_buf_free(o->state);
    free(o->state);
}

static const struct fb_obj_ops custom_ops = {.call = custom_call,
                                             .destroy = custom_destroy,
                                             .freeable = 1};

static int custom_create(struct fb_obj *o, const fiber_iov *params,
                         uint32_t n)
{
    fiber_buf *state = calloc(1, sizeof *state);
    if (!state || (n >= 1 && fiber_buf_append(state, params[0].data,
                                              params[0].len) != 0)) {
        free(state);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    o->state = state;
    o->ops = &custom_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_custom = {"custom", custom_create};
