/*
 * mobj_ops.h -- the shared objects a manager hosts, between the two sides:
 * the kinds its object server runs (mobj_srv.c: dict, list, value, lock,
 * rlock, event, semaphore, barrier, condition, custom) and the fiber_mobj
 * handles and operations that call them (mobj.c).
 */
#ifndef FB_MOBJ_OPS_H
#define FB_MOBJ_OPS_H

#include "objsrv/objsrv.h"

/* Operations.  One numbering for every kind, so that a call on an object
 * of another kind fails plainly.  They are protocol: only append. */
enum mobj_op {
    D_SET = FB_OP_KIND, /* key, value */
    D_GET,              /* key -> value */
    D_DEL,              /* key */
    D_LEN,              /* -> i64 */
    D_KEYS,             /* -> one item: (u32 len | key) x n */
    L_APPEND,           /* value */
    L_GET,              /* i64 index -> value */
    L_SET,              /* i64 index, value */
    L_LEN,              /* -> i64 */
    L_POP,              /* i64 index -> value */
    V_GET,              /* -> i64 */
    V_SET,              /* i64 */
    V_ADD,              /* i64 delta -> i64 new value */
    V_CAS,              /* i64 expected, i64 desired -> i64 old value */
    K_ACQUIRE,          /* u64 thread (lock, rlock, condition) */
    K_RELEASE,          /* u64 thread */
    C_WAIT,             /* u64 thread */
    C_NOTIFY,           /* u64 thread, i64 n (-1: all) */
    E_SET,
    E_CLEAR,
    E_IS_SET,           /* -> i64 0 or 1 */
    E_WAIT,
    S_ACQUIRE,
    S_RELEASE,
    B_WAIT,             /* -> i64 arrival index */
    B_RESET,
    U_CALL,             /* task name, argument -> the task's result */
    M_SHARE,            /* -> the segment to map (mshm.h: dict, value,
                           lock, rlock); FIBER_ENOTSUP if it cannot be */
    K_WAKE,             /* posted, no reply: a local client released a
                           lock in shared memory that remote acquires
                           wait for */
};

/* Answers shared by the kinds of mobj_srv.c and mobj_shm.c. */
static inline void reply_i64(struct fb_oreq *req, int64_t v)
{
    fiber_iov item = {&v, 8};
    fb_oreq_reply(req, 0, &item, 1);
}

static inline void reply_ok(struct fb_oreq *req)
{
    fb_oreq_reply(req, 0, NULL, 0);
}

static inline void no_such_op(struct fb_obj *o, struct fb_oreq *req)
{
    fb_oreq_fail(req, FIBER_EINVAL, "a %s has no operation %d", o->kind,
                 req->op);
}

static inline void bad_args(struct fb_obj *o, struct fb_oreq *req)
{
    fb_oreq_fail(req, FIBER_EINVAL, "malformed arguments for operation %d "
                                    "on %s '%s'", req->op, o->kind, o->name);
}

/* The kinds (mobj_srv.c and mobj_shm.c), listed in kinds.c. */
extern const struct fb_obj_kind fb_kind_dict, fb_kind_list, fb_kind_value,
    fb_kind_lock, fb_kind_rlock, fb_kind_event, fb_kind_semaphore,
    fb_kind_barrier, fb_kind_condition, fb_kind_custom;

#endif /* FB_MOBJ_OPS_H */
