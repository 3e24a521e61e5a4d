/*
 * mobj.c -- the shared objects a manager hosts, the client's side: the
 * fiber_mobj handles and the operations that call the kinds of
 * mobj_srv.c (the operations between the two are mobj_ops.h).  manager.c
 * starts managers and opens objects on them (fb_mobj_create); nothing
 * here depends on it, so a program that never starts a manager does not
 * link the manager's task.
 *
 * A call that the object cannot answer yet waits on the server (see
 * mobj_srv.c): a timeout of 0 that would wait fails at once with
 * FIBER_EAGAIN, a positive one with FIBER_ETIMEDOUT when it passes.
 *
 * In shared memory.  A handle on a dict, value, lock or rlock whose
 * manager is on this host (a unix socket) maps the object's segment at
 * its first call (M_SHARE, mshm.h) and makes its calls itself on it, with
 * the results, errors and texts the manager would give; a call with a
 * future gets one that is already resolved.  An asynchronous acquire
 * still goes to the manager, which parks it.  Where the segment cannot
 * be mapped (another pid namespace, the configuration's manager_shm off)
 * the handle stays on the socket.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"
#include "manager/mobj_ops.h"
#include "manager/mshm.h"
#include "manager/shdict.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"
#include "runtime/task.h"

#define MOBJ_MAGIC 0x4d4f424au /* "MOBJ" */

enum mkind {
    MK_DICT = 1,
    MK_LIST,
    MK_VALUE,
    MK_LOCK,
    MK_RLOCK,
    MK_EVENT,
    MK_SEM,
    MK_BARRIER,
    MK_COND,
    MK_CUSTOM,
    MK_COUNT
};

/* The server's kind for each, so the names cannot drift apart. */
static const struct fb_obj_kind *const mkinds[MK_COUNT] = {
    [MK_DICT] = &fb_kind_dict,         [MK_LIST] = &fb_kind_list,
    [MK_VALUE] = &fb_kind_value,       [MK_LOCK] = &fb_kind_lock,
    [MK_RLOCK] = &fb_kind_rlock,       [MK_EVENT] = &fb_kind_event,
    [MK_SEM] = &fb_kind_semaphore,     [MK_BARRIER] = &fb_kind_barrier,
    [MK_COND] = &fb_kind_condition,    [MK_CUSTOM] = &fb_kind_custom,
};

#define BIT(k) (1u << (k))

struct fiber_mobj {
    uint32_t magic;
    int kind; /* enum mkind */
    struct fb_ohandle h;
    int shm;          /* 1: calls are made in m (d for a dict); 0 not
                         tried yet; -1 on the socket.  Set once, under mu */
    pthread_mutex_t mu;
    struct fb_mshm m;
    struct fb_shdict d;
    uint32_t conn_id; /* this process's id on the manager: lock owner */
};

static int check(const fiber_mobj *o, unsigned kinds, const char *fn)
{
    if (!o || o->magic != MOBJ_MAGIC)
        return fb_err(FIBER_EINVAL, "%s: not a valid fiber_mobj handle", fn);
    if (!(kinds & BIT(o->kind)))
        return fb_err(FIBER_EINVAL, "%s: the handle is a %s", fn,
                      mkinds[o->kind]->name);
    return 0;
}

static int bytes_ok(const void *p, size_t len, const char *fn)
{
    if (len && !p)
        return fb_err(FIBER_EINVAL, "%s: NULL data with a length", fn);
    return 0;
}

/* A number for the calling thread, unique in this process for its whole
 * life (a kernel tid can be reused by a later thread, which would then
 * inherit an rlock it never took). */
static uint64_t thread_id(void)
{
    static uint64_t next;
    static _Thread_local uint64_t mine;
    if (!mine)
        mine = __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
    return mine;
}

/* The segment kind of a kind kept in shared memory, else 0. */
static int shm_kind(int kind)
{
    switch (kind) {
    case MK_DICT: return FB_MSHM_DICT;
    case MK_VALUE: return FB_MSHM_VALUE;
    case MK_LOCK: return FB_MSHM_LOCK;
    case MK_RLOCK: return FB_MSHM_RLOCK;
    default: return 0;
    }
}

/* Maps o's segment when its manager is on this host; on any failure o
 * stays on the socket (why is logged), which gives the same results. */
static void shm_attach(fiber_mobj *o)
{
    int sk = shm_kind(o->kind);
    if (!sk || strncmp(o->h.addr, "unix:", 5) != 0 ||
        !fb_rt_config()->manager_shm)
        return;
    struct fb_oresult r = {0};
    const void *d;
    size_t len;
    int rc = fb_ocall(o->h.c, o->h.obj, M_SHARE, -1, NULL, 0, &r);
    if (rc == 0 && fb_oresult_item(&r, 0, &d, &len) != 0)
        rc = fb_err(FIBER_EPROTO, "M_SHARE answered nothing");
    if (rc == 0)
        rc = fb_mshm_attach(&o->m, d, len, sk, &o->conn_id);
    fb_oresult_free(&r);
    if (rc) {
        fb_log_debug("manager: %s %u on %s stays on the socket: %s",
                     mkinds[o->kind]->name, o->h.obj, o->h.addr,
                     fiber_last_error());
        fb_err_clear();
        return;
    }
    o->d = (struct fb_shdict){(uint8_t *)o->m.h, o->m.map_len, o->m.fd,
                              FB_MSHM_HDR};
    __atomic_store_n(&o->shm, 1, __ATOMIC_RELEASE);
}

/* 1 when o's calls are made in shared memory: maps the segment at o's
 * first call (a handle opened and never used costs no round trip). */
static int local(fiber_mobj *o)
{
    int s = __atomic_load_n(&o->shm, __ATOMIC_ACQUIRE);
    if (s)
        return s > 0;
    pthread_mutex_lock(&o->mu);
    if (!o->shm) {
        shm_attach(o);
        if (o->shm != 1)
            __atomic_store_n(&o->shm, -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&o->mu);
    return o->shm > 0;
}

static int mobj_attach(fiber_mobj **out, int kind, const char *addr,
                       const uint8_t *token, uint32_t obj)
{
    fiber_mobj *o = calloc(1, sizeof *o);
    if (!o)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = fb_ohandle_open(&o->h, addr, token, obj);
    if (rc) {
        free(o);
        return rc;
    }
    o->magic = MOBJ_MAGIC;
    o->kind = kind;
    o->m.fd = -1;
    pthread_mutex_init(&o->mu, NULL);
    if (!shm_kind(kind))
        o->shm = -1;
    *out = o;
    return 0;
}

int fb_mobj_create(fiber_mobj **out, struct fb_oclient *c, const char *addr,
                   const uint8_t *token, const char *kind, const char *name,
                   const fiber_iov *params, size_t n)
{
    int k = MK_DICT;
    while (k < MK_COUNT && strcmp(mkinds[k]->name, kind) != 0)
        k++;
    if (k == MK_COUNT)
        return fb_err(FIBER_EINVAL, "no kind of manager object '%s'", kind);
    uint32_t id;
    int rc = fb_oopen(c, kind, name, params, n, &id);
    return rc ? rc : mobj_attach(out, k, addr, token, id);
}

int fb_mobj_shared(const fiber_mobj *o)
{
    return o && o->magic == MOBJ_MAGIC && local((fiber_mobj *)o);
}

FIBER_API int fiber_mobj_serialize(fiber_mobj *o, fiber_buf *out)
{
    int rc = check(o, ~0u, __func__);
    if (rc == 0 && !out)
        rc = fb_err(FIBER_EINVAL, "fiber_mobj_serialize: out is NULL");
    return rc ? rc
              : fb_handle_encode(out, FB_HANDLE_MOBJ, o->h.addr, o->h.token,
                                 o->h.obj, (uint32_t)o->kind);
}

FIBER_API int fiber_mobj_open(fiber_mobj **out, const void *data, size_t len)
{
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj, kind;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_mobj_open: out is NULL");
    int rc = fb_handle_decode(data, len, FB_HANDLE_MOBJ, addr, sizeof addr,
                              token, &obj, &kind);
    if (rc == 0 && (kind < MK_DICT || kind >= MK_COUNT))
        rc = fb_err(FIBER_EINVAL, "serialised handle names no kind of "
                                  "manager object (%u)", kind);
    return rc ? rc : mobj_attach(out, (int)kind, addr, token, obj);
}

FIBER_API void fiber_mobj_free(fiber_mobj *o)
{
    if (!o || o->magic != MOBJ_MAGIC)
        return;
    o->magic = 0;
    if (o->shm > 0)
        fb_mshm_detach(&o->m);
    pthread_mutex_destroy(&o->mu);
    fb_ohandle_close(&o->h);
    free(o);
}

/* A call's status, naming the object when the server says it was
 * released. */
static int named(const fiber_mobj *o, int rc)
{
    return fb_ohandle_freed(&o->h, rc, mkinds[o->kind]->name,
                            "(fiber_mobj_release)");
}

FIBER_API int fiber_mobj_release(fiber_mobj *o)
{
    int rc = check(o, ~0u, __func__);
    if (rc)
        return rc;
    rc = named(o, fb_ocall(o->h.c, o->h.obj, FB_OP_FREE, -1, NULL, 0, NULL));
    char why[FB_WIRE_TEXT_MAX + 1];
    fb_strlcpy(why, fiber_last_error(), sizeof why);
    fiber_mobj_free(o);
    return rc ? fb_err(rc, "%s", why) : 0;
}

/* ---- calls ------------------------------------------------------------- */

/* Calls op on o.  With f, returns at once with a future; without, waits
 * and appends the reply's first item (if any) to out (if given). */
static int mcall(fiber_mobj *o, int32_t op, int timeout_ms,
                 const fiber_iov *items, size_t n, fiber_buf *out,
                 fiber_future **f)
{
    if (f)
        return fb_ocall_async(o->h.c, o->h.obj, op, timeout_ms, items, n, f);
    struct fb_oresult r = {0};
    int rc = named(o, fb_ocall(o->h.c, o->h.obj, op, timeout_ms, items, n,
                               &r));
    const void *d;
    size_t len;
    if (rc == 0 && out && fb_oresult_item(&r, 0, &d, &len) == 0)
        rc = fiber_buf_append(out, d, len);
    fb_oresult_free(&r);
    return rc;
}

/* mcall for operations whose answer is an int64, stored in *v (may be
 * NULL) when synchronous. */
static int mcall_i64(fiber_mobj *o, int32_t op, int timeout_ms,
                     const fiber_iov *items, size_t n, int64_t *v,
                     fiber_future **f)
{
    if (f)
        return mcall(o, op, timeout_ms, items, n, NULL, f);
    struct fb_oresult r = {0};
    int rc = named(o, fb_ocall(o->h.c, o->h.obj, op, timeout_ms, items, n,
                               &r));
    const void *d = NULL;
    size_t len = 0;
    if (rc == 0 && (fb_oresult_item(&r, 0, &d, &len) != 0 || len != 8))
        rc = fb_err(FIBER_EPROTO, "the manager answered without an int64");
    if (rc == 0 && v)
        memcpy(v, d, 8);
    fb_oresult_free(&r);
    return rc;
}

/* An operation whose only argument is the calling thread. */
static int mcall_owned(fiber_mobj *o, int32_t op, int timeout_ms,
                       fiber_future **f)
{
    uint64_t t = thread_id();
    fiber_iov item = {&t, 8};
    return mcall(o, op, timeout_ms, &item, 1, NULL, f);
}

/* ---- calls in shared memory ---- */

/* The end of a call made in shared memory with status rc and, with
 * has_item, its answer (item, len): with f, a resolved future (and 0);
 * without, rc. */
static int local_done(fiber_mobj *o, int rc, const void *item, size_t len,
                      int has_item, fiber_future **f)
{
    /* A manager gone (or the object freed) fails the call itself, as a
     * call that cannot be sent does. */
    if (!f || rc == FIBER_ECLOSED)
        return rc;
    (void)o;
    return fb_ocall_resolved(rc, item, len, has_item && rc == 0, f);
}

/* The same for an int64 answer, stored in *v (may be NULL) without f. */
static int local_i64(fiber_mobj *o, int rc, int64_t x, int64_t *v,
                     fiber_future **f)
{
    if (rc == 0 && !f && v)
        *v = x;
    return local_done(o, rc, &x, sizeof x, 1, f);
}

/* A dict call's answer to out (sync) or a future (async). */
static int local_buf(fiber_mobj *o, int rc, fiber_buf *tmp, fiber_future **f)
{
    rc = local_done(o, rc, tmp->data, tmp->len, 1, f);
    fiber_buf_free(tmp);
    return rc;
}

/* 0 when o's segment may be used (else FIBER_ECLOSED, named). */
static int usable(const fiber_mobj *o)
{
    return fb_mshm_usable(&o->m, mkinds[o->kind]->name);
}

/* The owner word of the calling thread (mshm.h). */
static uint64_t local_owner(const fiber_mobj *o)
{
    return (uint64_t)o->conn_id << 32 | (uint32_t)thread_id();
}

/* ---- dict ---- */

FIBER_API int fiber_dict_set(fiber_mobj *d, const void *key, size_t klen,
                             const void *val, size_t vlen, fiber_future **f)
{
    int rc = check(d, BIT(MK_DICT), __func__);
    if (rc == 0)
        rc = bytes_ok(key, klen, __func__);
    if (rc == 0)
        rc = bytes_ok(val, vlen, __func__);
    if (rc == 0 && local(d)) {
        rc = usable(d);
        if (rc == 0)
            rc = fb_shdict_set(&d->d, key, klen, val, vlen);
        return local_done(d, rc, NULL, 0, 0, f);
    }
    fiber_iov items[2] = {{key, klen}, {val, vlen}};
    return rc ? rc : mcall(d, D_SET, -1, items, 2, NULL, f);
}

FIBER_API int fiber_dict_get(fiber_mobj *d, const void *key, size_t klen,
                             fiber_buf *out, fiber_future **f)
{
    int rc = check(d, BIT(MK_DICT), __func__);
    if (rc == 0)
        rc = bytes_ok(key, klen, __func__);
    if (rc == 0 && local(d)) {
        fiber_buf tmp = {0};
        rc = usable(d);
        if (rc == 0 && out && !f)
            return fb_shdict_get(&d->d, key, klen, out);
        if (rc == 0)
            rc = fb_shdict_get(&d->d, key, klen, &tmp);
        return local_buf(d, rc, &tmp, f);
    }
    fiber_iov item = {key, klen};
    return rc ? rc : mcall(d, D_GET, -1, &item, 1, out, f);
}

FIBER_API int fiber_dict_del(fiber_mobj *d, const void *key, size_t klen,
                             fiber_future **f)
{
    int rc = check(d, BIT(MK_DICT), __func__);
    if (rc == 0)
        rc = bytes_ok(key, klen, __func__);
    if (rc == 0 && local(d)) {
        rc = usable(d);
        if (rc == 0)
            rc = fb_shdict_del(&d->d, key, klen);
        return local_done(d, rc, NULL, 0, 0, f);
    }
    fiber_iov item = {key, klen};
    return rc ? rc : mcall(d, D_DEL, -1, &item, 1, NULL, f);
}

FIBER_API int fiber_dict_len(fiber_mobj *d, size_t *n, fiber_future **f)
{
    int64_t v = 0;
    int rc = check(d, BIT(MK_DICT), __func__);
    if (rc == 0 && local(d)) {
        size_t k = 0;
        rc = usable(d);
        if (rc == 0)
            rc = fb_shdict_len(&d->d, &k);
        rc = local_i64(d, rc, (int64_t)k, &v, f);
    } else if (rc == 0) {
        rc = mcall_i64(d, D_LEN, -1, NULL, 0, &v, f);
    }
    if (rc == 0 && !f && n)
        *n = (size_t)v;
    return rc;
}

FIBER_API int fiber_dict_keys(fiber_mobj *d, fiber_buf *out, fiber_future **f)
{
    int rc = check(d, BIT(MK_DICT), __func__);
    if (rc == 0 && local(d)) {
        fiber_buf tmp = {0};
        rc = usable(d);
        if (rc == 0 && out && !f)
            return fb_shdict_keys(&d->d, out);
        if (rc == 0)
            rc = fb_shdict_keys(&d->d, &tmp);
        return local_buf(d, rc, &tmp, f);
    }
    return rc ? rc : mcall(d, D_KEYS, -1, NULL, 0, out, f);
}

/* ---- list ---- */

FIBER_API int fiber_list_append(fiber_mobj *l, const void *val, size_t len,
                                fiber_future **f)
{
    int rc = check(l, BIT(MK_LIST), __func__);
    if (rc == 0)
        rc = bytes_ok(val, len, __func__);
    fiber_iov item = {val, len};
    return rc ? rc : mcall(l, L_APPEND, -1, &item, 1, NULL, f);
}

FIBER_API int fiber_list_get(fiber_mobj *l, int64_t index, fiber_buf *out,
                             fiber_future **f)
{
    int rc = check(l, BIT(MK_LIST), __func__);
    fiber_iov item = {&index, 8};
    return rc ? rc : mcall(l, L_GET, -1, &item, 1, out, f);
}

FIBER_API int fiber_list_set(fiber_mobj *l, int64_t index, const void *val,
                             size_t len, fiber_future **f)
{
    int rc = check(l, BIT(MK_LIST), __func__);
    if (rc == 0)
        rc = bytes_ok(val, len, __func__);
    fiber_iov items[2] = {{&index, 8}, {val, len}};
    return rc ? rc : mcall(l, L_SET, -1, items, 2, NULL, f);
}

FIBER_API int fiber_list_len(fiber_mobj *l, size_t *n, fiber_future **f)
{
    int64_t v = 0;
    int rc = check(l, BIT(MK_LIST), __func__);
    if (rc == 0)
        rc = mcall_i64(l, L_LEN, -1, NULL, 0, &v, f);
    if (rc == 0 && !f && n)
        *n = (size_t)v;
    return rc;
}

FIBER_API int fiber_list_pop(fiber_mobj *l, int64_t index, fiber_buf *out,
                             fiber_future **f)
{
    int rc = check(l, BIT(MK_LIST), __func__);
    fiber_iov item = {&index, 8};
    return rc ? rc : mcall(l, L_POP, -1, &item, 1, out, f);
}

/* ---- value ---- */

FIBER_API int fiber_value_get(fiber_mobj *v, int64_t *out, fiber_future **f)
{
    int rc = check(v, BIT(MK_VALUE), __func__);
    if (rc == 0 && local(v)) {
        rc = usable(v);
        return local_i64(v, rc, rc ? 0 : fb_mshm_value_get(v->m.h), out, f);
    }
    return rc ? rc : mcall_i64(v, V_GET, -1, NULL, 0, out, f);
}

FIBER_API int fiber_value_set(fiber_mobj *v, int64_t x, fiber_future **f)
{
    int rc = check(v, BIT(MK_VALUE), __func__);
    if (rc == 0 && local(v)) {
        rc = usable(v);
        if (rc == 0)
            fb_mshm_value_set(v->m.h, x);
        return local_done(v, rc, NULL, 0, 0, f);
    }
    fiber_iov item = {&x, 8};
    return rc ? rc : mcall(v, V_SET, -1, &item, 1, NULL, f);
}

FIBER_API int fiber_value_add(fiber_mobj *v, int64_t delta, int64_t *result,
                              fiber_future **f)
{
    int rc = check(v, BIT(MK_VALUE), __func__);
    if (rc == 0 && local(v)) {
        rc = usable(v);
        return local_i64(v, rc, rc ? 0 : fb_mshm_value_add(v->m.h, delta),
                         result, f);
    }
    fiber_iov item = {&delta, 8};
    return rc ? rc : mcall_i64(v, V_ADD, -1, &item, 1, result, f);
}

FIBER_API int fiber_value_cas(fiber_mobj *v, int64_t expected,
                              int64_t desired, int64_t *old,
                              fiber_future **f)
{
    int rc = check(v, BIT(MK_VALUE), __func__);
    if (rc == 0 && local(v)) {
        rc = usable(v);
        return local_i64(v, rc,
                         rc ? 0 : fb_mshm_value_cas(v->m.h, expected,
                                                    desired),
                         old, f);
    }
    fiber_iov items[2] = {{&expected, 8}, {&desired, 8}};
    return rc ? rc : mcall_i64(v, V_CAS, -1, items, 2, old, f);
}

/* ---- locks ---- */

FIBER_API int fiber_lock_acquire(fiber_mobj *l, int timeout_ms,
                                 fiber_future **f)
{
    int rc = check(l, BIT(MK_LOCK) | BIT(MK_RLOCK), __func__);
    /* An asynchronous acquire waits in the manager. */
    if (rc == 0 && !f && local(l))
        return fb_mshm_lock_wait(&l->m, local_owner(l), l->kind == MK_RLOCK,
                                 timeout_ms, mkinds[l->kind]->name);
    return rc ? rc : mcall_owned(l, K_ACQUIRE, timeout_ms, f);
}

FIBER_API int fiber_lock_release(fiber_mobj *l, fiber_future **f)
{
    int rc = check(l, BIT(MK_LOCK) | BIT(MK_RLOCK), __func__);
    if (rc == 0 && local(l)) {
        const char *kind = mkinds[l->kind]->name;
        int why, wake = 0;
        rc = usable(l);
        if (rc == 0 && fb_mshm_lock_release(l->m.h, local_owner(l),
                                            l->kind == MK_RLOCK, &why,
                                            &wake) != 0)
            rc = why == 0 ? fb_err(FIBER_ESTATE, "%s '%s' is not held", kind,
                                   l->m.h->name)
                          : fb_err(FIBER_ESTATE, "%s '%s' is held by another "
                                   "thread or process", kind, l->m.h->name);
        if (wake) /* remote acquires wait: the manager hands it on */
            fb_ocall_post(l->h.c, l->h.obj, K_WAKE, NULL, 0);
        return local_done(l, rc, NULL, 0, 0, f);
    }
    return rc ? rc : mcall_owned(l, K_RELEASE, -1, f);
}

/* ---- event ---- */

FIBER_API int fiber_event_set(fiber_mobj *e, fiber_future **f)
{
    int rc = check(e, BIT(MK_EVENT), __func__);
    return rc ? rc : mcall(e, E_SET, -1, NULL, 0, NULL, f);
}

FIBER_API int fiber_event_clear(fiber_mobj *e, fiber_future **f)
{
    int rc = check(e, BIT(MK_EVENT), __func__);
    return rc ? rc : mcall(e, E_CLEAR, -1, NULL, 0, NULL, f);
}

FIBER_API int fiber_event_is_set(fiber_mobj *e, int *set, fiber_future **f)
{
    int64_t v = 0;
    int rc = check(e, BIT(MK_EVENT), __func__);
    if (rc == 0)
        rc = mcall_i64(e, E_IS_SET, -1, NULL, 0, &v, f);
    if (rc == 0 && !f && set)
        *set = v != 0;
    return rc;
}

FIBER_API int fiber_event_wait(fiber_mobj *e, int timeout_ms,
                               fiber_future **f)
{
    int rc = check(e, BIT(MK_EVENT), __func__);
    return rc ? rc : mcall(e, E_WAIT, timeout_ms, NULL, 0, NULL, f);
}

/* ---- semaphore ---- */

FIBER_API int fiber_sem_acquire(fiber_mobj *s, int timeout_ms,
                                fiber_future **f)
{
    int rc = check(s, BIT(MK_SEM), __func__);
    return rc ? rc : mcall(s, S_ACQUIRE, timeout_ms, NULL, 0, NULL, f);
}

FIBER_API int fiber_sem_release(fiber_mobj *s, fiber_future **f)
{
    int rc = check(s, BIT(MK_SEM), __func__);
    return rc ? rc : mcall(s, S_RELEASE, -1, NULL, 0, NULL, f);
}

/* ---- barrier ---- */

FIBER_API int fiber_barrier_wait(fiber_mobj *b, int timeout_ms, int *index,
                                 fiber_future **f)
{
    int64_t v = 0;
    int rc = check(b, BIT(MK_BARRIER), __func__);
    if (rc == 0)
        rc = mcall_i64(b, B_WAIT, timeout_ms, NULL, 0, &v, f);
    if (rc == 0 && !f && index)
        *index = (int)v;
    return rc;
}

FIBER_API int fiber_barrier_reset(fiber_mobj *b, fiber_future **f)
{
    int rc = check(b, BIT(MK_BARRIER), __func__);
    return rc ? rc : mcall(b, B_RESET, -1, NULL, 0, NULL, f);
}

/* ---- condition ---- */

FIBER_API int fiber_cond_acquire(fiber_mobj *c, int timeout_ms,
                                 fiber_future **f)
{
    int rc = check(c, BIT(MK_COND), __func__);
    return rc ? rc : mcall_owned(c, K_ACQUIRE, timeout_ms, f);
}

FIBER_API int fiber_cond_release(fiber_mobj *c, fiber_future **f)
{
    int rc = check(c, BIT(MK_COND), __func__);
    return rc ? rc : mcall_owned(c, K_RELEASE, -1, f);
}

FIBER_API int fiber_cond_wait(fiber_mobj *c, int timeout_ms, fiber_future **f)
{
    int rc = check(c, BIT(MK_COND), __func__);
    return rc ? rc : mcall_owned(c, C_WAIT, timeout_ms, f);
}

static int cond_notify_n(fiber_mobj *c, int64_t n, fiber_future **f)
{
    uint64_t t = thread_id();
    fiber_iov items[2] = {{&t, 8}, {&n, 8}};
    return mcall(c, C_NOTIFY, -1, items, 2, NULL, f);
}

FIBER_API int fiber_cond_notify(fiber_mobj *c, int n, fiber_future **f)
{
    int rc = check(c, BIT(MK_COND), __func__);
    if (rc == 0 && n < 0)
        rc = fb_err(FIBER_EINVAL, "fiber_cond_notify: n = %d < 0", n);
    return rc ? rc : cond_notify_n(c, n, f);
}

FIBER_API int fiber_cond_notify_all(fiber_mobj *c, fiber_future **f)
{
    int rc = check(c, BIT(MK_COND), __func__);
    return rc ? rc : cond_notify_n(c, -1, f);
}

/* ---- custom ---- */

FIBER_API int fiber_custom_call(fiber_mobj *o, const char *task,
                                const void *arg, size_t len, fiber_buf *out,
                                fiber_future **f)
{
    int rc = check(o, BIT(MK_CUSTOM), __func__);
    if (rc == 0)
        rc = bytes_ok(arg, len, __func__);
    if (rc == 0 && !task)
        rc = fb_err(FIBER_EINVAL, "fiber_custom_call: task is NULL");
    if (rc)
        return rc;
    fiber_iov items[2] = {{task, strlen(task)}, {arg, len}};
    return mcall(o, U_CALL, -1, items, 2, out, f);
}
