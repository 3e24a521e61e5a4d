/*
 * mobj_shm.c -- the manager's kinds whose state is in shared memory
 * (mshm.h): value, lock, rlock and dict.  The manager serves remote
 * clients' calls on the segment exactly as a local client makes them on
 * its own mapping (mobj.c), with the same operations of mshm.c and
 * shdict.c, so the two paths cannot drift apart; M_SHARE hands the
 * segment to a local client.
 *
 * A lock's remote acquires that must wait are parked here, as
 * mobj_srv.c's are, and flagged in the segment (srv_waiting) before the
 * manager tries the lock once more; a local release that sees the flag
 * posts K_WAKE, and every release, remote or local, hands the lock to the
 * oldest parked acquire first.  When a client's connection goes, a lock
 * it held (its connection id in the owner word) is cleared.
 */
#include <string.h>

#include <sodium.h>

#include "base/common.h"
#include "manager/mobj_ops.h"
#include "manager/mshm.h"
#include "manager/shdict.h"
#include "objsrv/objsrv.h"

#define PAGE 4096
/* A dict's address space: the most its keys, values and index may take. */
#define DICT_RESERVE ((size_t)1 << 30)

/* Answers an M_SHARE: the segment, for this client. */
static void share(struct fb_mshm *m, struct fb_oreq *req)
{
    fiber_buf b = {0};
    int rc = req->count == 0 ? fb_mshm_share(m, fb_oconn_id(req->conn), &b)
                             : fb_err(FIBER_EINVAL, "M_SHARE takes nothing");
    fiber_iov item = {b.data, b.len};
    if (rc)
        fb_oreq_fail(req, rc, "%s", fiber_last_error());
    else
        fb_oreq_reply(req, 0, &item, 1);
    fiber_buf_free(&b);
}

/* Every kind here is freeable, and destroy tells a stop from a release. */
static void segment_destroy(struct fb_obj *o, struct fb_mshm *m)
{
    fb_mshm_destroy(m, fb_objsrv_stopping(o->srv) ? FB_MSHM_STOPPED
                                                  : FB_MSHM_RELEASED);
}

/* ---- value -------------------------------------------------------------- */

static int value_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct fb_mshm *m = o->state;
    int64_t a = 0, b = 0;
    if (req->op == M_SHARE) {
        share(m, req);
        return 1;
    }
    if (req->op < V_GET || req->op > V_CAS) {
        no_such_op(o, req);
        return 1;
    }
    uint32_t want = req->op == V_CAS ? 2 : req->op == V_GET ? 0 : 1;
    if (req->count != want || (want >= 1 && fb_item_i64(req, 0, &a) != 0) ||
        (want == 2 && fb_item_i64(req, 1, &b) != 0)) {
        bad_args(o, req);
        return 1;
    }
    switch (req->op) {
    case V_GET: reply_i64(req, fb_mshm_value_get(m->h)); break;
    case V_SET: fb_mshm_value_set(m->h, a); reply_ok(req); break;
    case V_ADD: reply_i64(req, fb_mshm_value_add(m->h, a)); break;
    case V_CAS: reply_i64(req, fb_mshm_value_cas(m->h, a, b)); break;
    default: no_such_op(o, req);
    }
    return 1;
}

static void value_destroy(struct fb_obj *o)
{
    segment_destroy(o, o->state);
    free(o->state);
}

static const struct fb_obj_ops value_ops = {.call = value_call,
                                            .destroy = value_destroy,
                                            .freeable = 1};

static int value_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    struct fb_mshm *m = calloc(1, sizeof *m);
    if (!m)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = fb_mshm_create(m, FB_MSHM_VALUE, o->name, PAGE, PAGE);
    if (rc) {
        free(m);
        return rc;
    }
    int64_t v = 0;
    if (n >= 1 && params[0].len == 8)
        memcpy(&v, params[0].data, 8);
    fb_mshm_value_set(m->h, v);
    o->state = m;
    o->ops = &value_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_value = {"value", value_create};

/* ---- lock and rlock ------------------------------------------------------ */

struct slock {
    struct fb_mshm m;
    int recursive;
    struct fb_waitq waiters; /* remote acquires, oldest first */
};

/* The owner word of the caller of req (its connection and the thread in
 * item 0), or 0 if malformed. */
static uint64_t req_owner(const struct fb_oreq *req)
{
    uint64_t t;
    if (req->count != 1 || req->items[0].len != 8)
        return 0;
    memcpy(&t, req->items[0].data, 8);
    return (uint64_t)fb_oconn_id(req->conn) << 32 | (uint32_t)t;
}

/* Gives the lock to parked acquires for as long as it is free. */
static void slock_grant(struct slock *l)
{
    struct fb_mshm_hdr *h = l->m.h;
    while (l->waiters.head) {
        /* Flagged before the try: a release after a failed try sees it. */
        __atomic_store_n(&h->srv_waiting, 1, __ATOMIC_SEQ_CST);
        struct fb_oreq *req = l->waiters.head;
        if (!fb_mshm_lock_try(h, req_owner(req), l->recursive))
            return;
        reply_ok(fb_waitq_pop(&l->waiters));
    }
    __atomic_store_n(&h->srv_waiting, 0, __ATOMIC_SEQ_CST);
}

static void slock_acquire(struct slock *l, struct fb_obj *o,
                          struct fb_oreq *req)
{
    uint64_t me = req_owner(req);
    if (!me) {
        bad_args(o, req);
        return;
    }
    /* The holder of an rlock goes one level deeper at once; anyone else
     * queues behind the acquires already parked. */
    uint64_t owner = __atomic_load_n(&l->m.h->owner, __ATOMIC_SEQ_CST);
    if ((!l->waiters.head || (l->recursive && owner == me)) &&
        fb_mshm_lock_try(l->m.h, me, l->recursive)) {
        reply_ok(req);
        return;
    }
    if (req->deadline_ms <= fb_now_ms()) {
        fb_oreq_fail(req, FIBER_EAGAIN, "%s '%s' is held", o->kind, o->name);
        return;
    }
    fb_oreq_park(req, &l->waiters);
    slock_grant(l); /* flags the wait, then tries once more */
}

static void slock_release(struct slock *l, struct fb_obj *o,
                          struct fb_oreq *req)
{
    uint64_t me = req_owner(req);
    int why, wake;
    if (!me) {
        bad_args(o, req);
        return;
    }
    if (fb_mshm_lock_release(l->m.h, me, l->recursive, &why, &wake) != 0) {
        if (why == 0)
            fb_oreq_fail(req, FIBER_ESTATE, "%s '%s' is not held", o->kind,
                         o->name);
        else
            fb_oreq_fail(req, FIBER_ESTATE, "%s '%s' is held by another "
                         "thread or process", o->kind, o->name);
        return;
    }
    reply_ok(req);
    slock_grant(l);
}

static int slock_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct slock *l = o->state;
    switch (req->op) {
    case K_ACQUIRE: slock_acquire(l, o, req); break;
    case K_RELEASE: slock_release(l, o, req); break;
    case M_SHARE: share(&l->m, req); break;
    case K_WAKE: /* posted: no answer */
        fb_oreq_done(req);
        slock_grant(l);
        break;
    default: no_such_op(o, req);
    }
    return 1;
}

/* A client went: a lock it held (locally or through here) passes on. */
static void slock_conn_gone(struct fb_obj *o, struct fb_oconn *c)
{
    struct slock *l = o->state;
    uint64_t owner = __atomic_load_n(&l->m.h->owner, __ATOMIC_SEQ_CST);
    if (owner && owner >> 32 == fb_oconn_id(c)) {
        fb_mshm_lock_clear(l->m.h);
        slock_grant(l);
    }
}

static void slock_destroy(struct fb_obj *o)
{
    struct slock *l = o->state;
    segment_destroy(o, &l->m);
    free(l);
}

static const struct fb_obj_ops slock_ops = {.call = slock_call,
                                            .conn_gone = slock_conn_gone,
                                            .destroy = slock_destroy,
                                            .freeable = 1};

static int slock_make(struct fb_obj *o, int recursive)
{
    struct slock *l = calloc(1, sizeof *l);
    if (!l)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = fb_mshm_create(&l->m, recursive ? FB_MSHM_RLOCK : FB_MSHM_LOCK,
                            o->name, PAGE, PAGE);
    if (rc) {
        free(l);
        return rc;
    }
    l->recursive = recursive;
    o->state = l;
    o->ops = &slock_ops;
    return 0;
}

static int lock_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    return slock_make(o, 0);
}

static int rlock_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    return slock_make(o, 1);
}

const struct fb_obj_kind fb_kind_lock = {"lock", lock_create};
const struct fb_obj_kind fb_kind_rlock = {"rlock", rlock_create};

/* ---- dict ------------------------------------------------------------------ */

struct sdict {
    struct fb_mshm m;
    struct fb_shdict d;
};

/* Answers req with the status of a dict operation and, on success, out
 * (when given). */
static void dict_answer(struct fb_oreq *req, int rc, const fiber_buf *out)
{
    if (rc) {
        fb_oreq_fail(req, rc, "%s", fiber_last_error());
    } else if (out) {
        fiber_iov item = {out->data, out->len};
        fb_oreq_reply(req, 0, &item, 1);
    } else {
        reply_ok(req);
    }
}

static int dict_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct sdict *s = o->state;
    if (req->op == M_SHARE) {
        share(&s->m, req);
        return 1;
    }
    if (req->op < D_SET || req->op > D_KEYS) {
        no_such_op(o, req);
        return 1;
    }
    uint32_t want = req->op == D_SET ? 2
                    : req->op == D_GET || req->op == D_DEL ? 1 : 0;
    if (req->count != want) {
        bad_args(o, req);
        return 1;
    }
    const fiber_iov *it = req->items;
    fiber_buf out = {0};
    size_t n = 0;
    int rc;
    switch (req->op) {
    case D_SET:
        dict_answer(req, fb_shdict_set(&s->d, it[0].data, it[0].len,
                                       it[1].data, it[1].len), NULL);
        break;
    case D_GET:
        dict_answer(req, fb_shdict_get(&s->d, it[0].data, it[0].len, &out),
                    &out);
        break;
    case D_DEL:
        dict_answer(req, fb_shdict_del(&s->d, it[0].data, it[0].len), NULL);
        break;
    case D_LEN:
        rc = fb_shdict_len(&s->d, &n);
        if (rc)
            dict_answer(req, rc, NULL);
        else
            reply_i64(req, (int64_t)n);
        break;
    case D_KEYS:
        dict_answer(req, fb_shdict_keys(&s->d, &out), &out);
        break;
    default: no_such_op(o, req);
    }
    fiber_buf_free(&out);
    return 1;
}

static void dict_destroy(struct fb_obj *o)
{
    struct sdict *s = o->state;
    segment_destroy(o, &s->m);
    free(s);
}

static const struct fb_obj_ops dict_ops = {.call = dict_call,
                                           .destroy = dict_destroy,
                                           .freeable = 1};

static int dict_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    struct sdict *s = calloc(1, sizeof *s);
    if (!s)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = fb_mshm_create(&s->m, FB_MSHM_DICT, o->name, DICT_RESERVE,
                            FB_MSHM_HDR + FB_SHDICT_INITIAL);
    if (rc) {
        free(s);
        return rc;
    }
    s->d = (struct fb_shdict){(uint8_t *)s->m.h, s->m.map_len, s->m.fd,
                              FB_MSHM_HDR};
    unsigned char key[crypto_shorthash_KEYBYTES];
    crypto_shorthash_keygen(key);
    rc = fb_shdict_format(&s->d, key);
    if (rc) {
        fb_mshm_destroy(&s->m, FB_MSHM_RELEASED);
        free(s);
        return rc;
    }
    o->state = s;
    o->ops = &dict_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_dict = {"dict", dict_create};
