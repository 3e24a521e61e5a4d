/*
 * pipe_rdv.c -- the rendezvous of a fiber_pipe (pipe.c): a kind of object
 * on the master's object server that decides, once, whether the pipe's two
 * ends connect directly, and tells the second end where the first listens
 * (the operations are pipe_ops.h).
 *
 * The first end to be used JOINs and is told to WAIT (it listens); when
 * the other end JOINs from another process, it is told to DIAL the first,
 * and the pipe is direct for good: any later JOIN of either side (a second
 * handle on an end) fails with FIBER_ESTATE, since the linked handles
 * carry the pipe's messages.  The pipe stays on its relayed queues, for
 * good, when both ends are first used in one process, when a second
 * handle of a side JOINs while the first still waits (two openers, or an
 * end handed on before the link), or when the dialer cannot reach the
 * listener (FALLBACK).
 *
 * The end of a side: a side's holder is the handle that JOINed it or
 * opened it (HOLD; the master's handles from fiber_pipe_create hold
 * nothing until used).  When the holder's connection goes away (its
 * process ended, or it freed the handle and held nothing else on this
 * server) and no other handle of that side was seen (nor a holder
 * serialised it: HANDED), the side is gone, and
 * the other end's next JOIN is answered GONE: it takes what is left on
 * its relayed queue, then reports the end of the stream, instead of
 * waiting for an end that no process holds.
 *
 * Threads: it runs in the object server's thread, as every kind does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "base/common.h"
#include "base/log.h"
#include "objsrv/objsrv.h"
#include "pipe/pipe_ops.h"
#include "ring/ring_ops.h"

enum { M_OPEN, M_DIRECT, M_RELAYED };

struct prdv_side {
    int joined;
    const struct fb_oconn *conn; /* the connection it joined on */
    uint32_t pid;
    uint64_t hid;
    uint64_t holder; /* the handle that holds the side (JOIN or HOLD) */
    const struct fb_oconn *holder_conn;
    uint32_t holder_pid;
    int several;     /* another handle of this side was seen too */
    int shared;      /* SHARED: handed to several processes: no link */
    int gone;        /* its only holder's connection went away */
    char addr[FB_PIPE_ADDR_MAX];
};

struct prdv {
    int mode;
    uint64_t nonce;
    struct prdv_side side[2];
};

static void answer(struct prdv *d, struct fb_oreq *req, uint32_t verdict,
                   const char *addr)
{
    fiber_iov items[3] = {{&verdict, 4},
                          {&d->nonce, 8},
                          {addr, addr ? strlen(addr) : 0}};
    fb_oreq_reply(req, 0, items, 3);
}

/* The other end is gone: the pipe is relayed for good, and this end is
 * told so with the pid that held the other end. */
static void answer_gone(struct prdv *d, struct fb_oreq *req,
                        const struct prdv_side *other)
{
    uint32_t verdict = FB_PRDV_GONE, pid = other->holder_pid;
    fiber_iov items[4] = {{&verdict, 4}, {&d->nonce, 8}, {"", 0}, {&pid, 4}};
    d->mode = M_RELAYED;
    fb_oreq_reply(req, 0, items, 4);
}

/* A second handle of a side that has already joined. */
static void join_again(struct prdv *d, struct fb_oreq *req, uint32_t s,
                       uint64_t hid)
{
    struct prdv_side *me = &d->side[s];
    if (me->hid == hid) {
        answer(d, req, d->mode == M_DIRECT ? FB_PRDV_DIALED : FB_PRDV_WAIT,
               NULL);
        return;
    }
    if (d->mode == M_DIRECT) {
        fb_oreq_fail(req, FIBER_ESTATE,
                     "end %c of this pipe is already connected directly to "
                     "process %u: an end used over a direct connection "
                     "cannot be opened again (give each end to one process)",
                     s ? 'b' : 'a', me->pid);
        return;
    }
    d->mode = M_RELAYED; /* two handles on one end: only the queues serve */
    answer(d, req, FB_PRDV_RELAYED, NULL);
}

/* Notes that handle hid of side me is held by the process on conn. */
static void note_holder(struct prdv_side *me, uint64_t hid, uint32_t pid,
                        const struct fb_oconn *conn)
{
    if (me->holder && me->holder != hid) {
        me->several = 1; /* the side is no longer one handle's */
        me->gone = 0;
        return;
    }
    me->holder = hid;
    me->holder_pid = pid;
    me->holder_conn = conn;
}

static void prdv_join(struct prdv *d, struct fb_oreq *req)
{
    uint32_t s = 2, pid = 0;
    uint64_t hid;
    if (req->count != 4 || fb_item_u32(req, 0, &s) != 0 || s > 1 ||
        fb_item_u32(req, 1, &pid) != 0 || req->items[2].len != 8 ||
        req->items[3].len >= FB_PIPE_ADDR_MAX) {
        fb_oreq_fail(req, FIBER_EINVAL, "JOIN wants a side (0 or 1), a pid, "
                                        "a handle id and an address");
        return;
    }
    memcpy(&hid, req->items[2].data, 8);
    struct prdv_side *me = &d->side[s], *other = &d->side[1 - s];
    note_holder(me, hid, pid, req->conn);
    if (other->gone || d->mode == M_RELAYED) {
        if (!me->joined) {
            me->joined = 1;
            me->pid = pid;
            me->hid = hid;
            me->conn = req->conn;
        }
        if (other->gone)
            answer_gone(d, req, other);
        else
            answer(d, req, FB_PRDV_RELAYED, NULL);
        return;
    }
    if (me->joined) {
        join_again(d, req, s, hid);
        return;
    }
    me->joined = 1;
    me->pid = pid;
    me->hid = hid;
    me->conn = req->conn;
    memcpy(me->addr, req->items[3].data, req->items[3].len);
    me->addr[req->items[3].len] = '\0';
    if (me->shared || other->shared) {
        d->mode = M_RELAYED; /* several processes use a side */
        answer(d, req, FB_PRDV_RELAYED, NULL);
    } else if (!other->joined)
        answer(d, req, FB_PRDV_WAIT, NULL);
    else if (other->pid == pid || !other->addr[0] || d->mode != M_OPEN) {
        d->mode = M_RELAYED;
        answer(d, req, FB_PRDV_RELAYED, NULL);
    } else {
        d->mode = M_DIRECT;
        answer(d, req, FB_PRDV_DIAL, other->addr);
    }
}

static void prdv_hold(struct prdv *d, struct fb_oreq *req)
{
    uint32_t s = 2, pid = 0;
    uint64_t hid;
    if (req->count != 3 || fb_item_u32(req, 0, &s) != 0 || s > 1 ||
        fb_item_u32(req, 1, &pid) != 0 || req->items[2].len != 8) {
        fb_oreq_fail(req, FIBER_EINVAL, "HOLD wants a side (0 or 1), a pid "
                                        "and a handle id");
        return;
    }
    memcpy(&hid, req->items[2].data, 8);
    note_holder(&d->side[s], hid, pid, req->conn);
    fb_oreq_reply(req, 0, NULL, 0);
}

static int prdv_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct prdv *d = o->state;
    if (req->op == FB_PRDV_JOIN)
        prdv_join(d, req);
    else if (req->op == FB_PRDV_HOLD)
        prdv_hold(d, req);
    else if (req->op == FB_PRDV_HANDED || req->op == FB_PRDV_SHARED) {
        int shared = req->op == FB_PRDV_SHARED;
        uint32_t s = 2;
        if (req->count != 1 || fb_item_u32(req, 0, &s) != 0 || s > 1) {
            fb_oreq_fail(req, FIBER_EINVAL, "%s wants a side (0 or 1)",
                         shared ? "SHARED" : "HANDED");
            return 1;
        }
        d->side[s].shared |= shared;
        d->side[s].several = 1; /* a holder may come later: never gone */
        d->side[s].gone = 0;
        fb_oreq_reply(req, 0, NULL, 0);
    }
    else if (req->op == FB_PRDV_FALLBACK) {
        if (d->mode != M_RELAYED)
            fb_log_info("pipe: the ends could not connect directly; the "
                        "pipe stays on the master's queues");
        d->mode = M_RELAYED;
        fb_oreq_reply(req, 0, NULL, 0);
    } else
        fb_oreq_fail(req, FIBER_EINVAL, "a pipe's rendezvous has no "
                                        "operation %d", req->op);
    return 1;
}

/* A process that joined and was killed while it waited cannot remove its
 * socket (which would keep the run directory from being removed).  A
 * side whose only handle this was is gone. */
static void prdv_conn_gone(struct fb_obj *o, struct fb_oconn *c)
{
    struct prdv *d = o->state;
    for (int s = 0; s < 2; s++)
        if (d->side[s].conn == c) {
            if (d->side[s].addr[0])
                fb_rdv_unlink_sock(o->srv, d->side[s].addr, "pipe");
            d->side[s].addr[0] = '\0';
            d->side[s].conn = NULL;
        }
    for (int s = 0; s < 2; s++)
        if (d->side[s].holder_conn == c) {
            d->side[s].holder_conn = NULL;
            if (!d->side[s].several)
                d->side[s].gone = 1;
        }
}

static void prdv_destroy(struct fb_obj *o)
{
    free(o->state);
}

static const struct fb_obj_ops prdv_ops = {
    .call = prdv_call,
    .conn_gone = prdv_conn_gone,
    .destroy = prdv_destroy,
};

static int prdv_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    (void)params;
    (void)n;
    struct prdv *d = calloc(1, sizeof *d);
    if (!d)
        return fb_err(FIBER_ENOMEM, "out of memory");
    randombytes_buf(&d->nonce, sizeof d->nonce);
    o->state = d;
    o->ops = &prdv_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_pipe_rdv = {"pipe_rdv", prdv_create};
