/*
 * ring_rdv.c -- the rendezvous of a fiber_ring (ring.c): a kind of object
 * on the master's object server where the ring's N members meet.
 *
 * Each member JOINs with its rank and the address it listens on (the
 * operations are ring_ops.h).  A JOIN is parked on the server until all N
 * ranks are in; then every member is answered with every member's
 * address and the ring's random nonce, and the ring has formed: later
 * JOINs fail with FIBER_ESTATE.  A member that leaves before that frees
 * its rank for a replacement.
 *
 * Threads: it runs in the object server's thread, as every kind does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "base/log.h"
#include "objsrv/objsrv.h"
#include "ring/ring_ops.h"

/* ==== the rendezvous: a kind of object on an object server ============== */

/* Where a joining member listens, and on which connection it joined. */
struct rdv_sock {
    const struct fb_oconn *conn;
    char *addr; /* NULL when unknown */
};

struct rdv {
    uint32_t n;
    int formed;
    uint64_t nonce;
    /* The parked JOINs are the members so far.  Keeping no other table of
     * members is what frees the rank of one that leaves before the ring
     * forms: the server frees the parked requests of a client that went
     * (and of those whose deadline passed), which takes them off this
     * queue, so the rank is free again for a replacement. */
    struct fb_waitq joiners;
    /* By rank, until the ring forms: a member killed while it waits
     * cannot remove its own socket, which would keep the run directory
     * from being removed; conn_gone removes it instead. */
    struct rdv_sock *socks;
};

static uint32_t req_rank(const struct fb_oreq *r)
{
    uint32_t rank = 0;
    fb_item_u32(r, 0, &rank);
    return rank;
}

static int rank_taken(const struct rdv *d, uint32_t rank)
{
    for (const struct fb_oreq *q = d->joiners.head; q; q = q->wnext)
        if (req_rank(q) == rank)
            return 1;
    return 0;
}

/* Returns 0 if req is a JOIN the rendezvous can take; otherwise answers
 * it with the reason and returns -1. */
static int join_valid(const struct rdv *d, struct fb_oreq *req)
{
    uint32_t rank;
    if (d->formed) {
        fb_oreq_fail(req, FIBER_ESTATE,
                     "this ring has already formed; create a new ring");
        return -1;
    }
    if (req->count != 2 || fb_item_u32(req, 0, &rank) != 0 ||
        req->items[1].len >= FB_RING_ADDR_MAX ||
        (d->n > 1 && req->items[1].len == 0)) {
        fb_oreq_fail(req, FIBER_EINVAL, "JOIN wants a rank and an address");
        return -1;
    }
    if (rank >= d->n) {
        fb_oreq_fail(req, FIBER_EINVAL,
                     "rank %u is out of range for a ring of %u", rank, d->n);
        return -1;
    }
    if (rank_taken(d, rank)) {
        fb_oreq_fail(req, FIBER_EINVAL, "rank %u has already joined", rank);
        return -1;
    }
    return 0;
}

/* Copies q's address into copy (whose capacity was reserved, so its data
 * does not move) and points the item for q's rank at it. */
static void add_address(fiber_iov *items, fiber_buf *copy,
                        const struct fb_oreq *q)
{
    const fiber_iov *a = &q->items[1];
    items[1 + req_rank(q)] = (fiber_iov){copy->data + copy->len, a->len};
    fiber_buf_append(copy, a->data, a->len);
}

/* The last member is in: answers every JOIN with the nonce and every
 * address by rank.  The addresses are copied first because answering a
 * request frees the request's own bytes. */
static void rdv_form(struct rdv *d, struct fb_oreq *last)
{
    size_t total = last->items[1].len;
    for (const struct fb_oreq *q = d->joiners.head; q; q = q->wnext)
        total += q->items[1].len;
    fiber_iov *items = calloc(d->n + 1, sizeof *items);
    fiber_buf copy = {0};
    if (!items || fiber_buf_reserve(&copy, total + 1) != 0) {
        free(items);
        fb_oreq_fail(last, FIBER_ENOMEM, "out of memory forming the ring");
        return;
    }
    items[0] = (fiber_iov){&d->nonce, sizeof d->nonce};
    add_address(items, &copy, last);
    for (const struct fb_oreq *q = d->joiners.head; q; q = q->wnext)
        add_address(items, &copy, q);
    d->formed = 1;
    struct fb_oreq *q;
    while ((q = fb_waitq_pop(&d->joiners)))
        fb_oreq_reply(q, 0, items, d->n + 1);
    fb_oreq_reply(last, 0, items, d->n + 1);
    free(items);
    fiber_buf_free(&copy);
}

static void sock_forget(struct rdv_sock *k)
{
    free(k->addr);
    k->addr = NULL;
    k->conn = NULL;
}

/* Remembers where a parked member listens (best effort: without memory,
 * only the clean-up after a killed member is lost). */
static void sock_note(struct rdv *d, const struct fb_oreq *req)
{
    struct rdv_sock *k = &d->socks[req_rank(req)];
    sock_forget(k);
    k->conn = req->conn;
    k->addr = strndup(req->items[1].data, req->items[1].len);
}

/* Removes a unix socket left by a process that went, but only if it is
 * one of ours: named prefix* in the directory of this server's own
 * socket (ring_ops.h). */
void fb_rdv_unlink_sock(const struct fb_objsrv *srv, const char *addr,
                        const char *prefix)
{
    const char *mine = fb_objsrv_address(srv);
    const char *slash = strrchr(addr, '/'), *my_slash = strrchr(mine, '/');
    size_t dir = slash ? (size_t)(slash - addr) : 0;
    if (strncmp(addr, "unix:", 5) != 0 || !slash || !my_slash ||
        dir != (size_t)(my_slash - mine) || memcmp(addr, mine, dir) != 0 ||
        strncmp(slash + 1, prefix, strlen(prefix)) != 0)
        return;
    if (unlink(addr + 5) == 0)
        fb_log_debug("%s: removed %s, left by a process that went", prefix,
                     addr);
}

static void rdv_conn_gone(struct fb_obj *o, struct fb_oconn *c)
{
    struct rdv *d = o->state;
    for (uint32_t i = 0; i < d->n; i++) {
        if (d->socks[i].conn != c)
            continue;
        if (d->socks[i].addr)
            fb_rdv_unlink_sock(o->srv, d->socks[i].addr, "ring");
        sock_forget(&d->socks[i]);
    }
}

static void rdv_join(struct rdv *d, struct fb_oreq *req)
{
    if (join_valid(d, req) != 0)
        return;
    if (d->joiners.len + 1 == d->n) {
        rdv_form(d, req);
        for (uint32_t i = 0; d->formed && i < d->n; i++)
            sock_forget(&d->socks[i]); /* the members own them now */
    } else if (req->deadline_ms <= fb_now_ms()) {
        fb_oreq_fail(req, FIBER_ETIMEDOUT,
                     "only %zu of the ring's %u members have joined",
                     d->joiners.len + 1, d->n);
    } else {
        sock_note(d, req);
        fb_oreq_park(req, &d->joiners);
    }
}

/* Who is waiting so far (for tests and diagnostics). */
static void rdv_members(struct rdv *d, struct fb_oreq *req)
{
    size_t k = d->joiners.len;
    fiber_iov *items = calloc(1 + 2 * k, sizeof *items);
    uint32_t *ranks = calloc(k + 1, sizeof *ranks);
    uint32_t formed = (uint32_t)d->formed;
    if (!items || !ranks) {
        free(items);
        free(ranks);
        fb_oreq_fail(req, FIBER_ENOMEM, "out of memory");
        return;
    }
    items[0] = (fiber_iov){&formed, 4};
    size_t i = 0;
    for (const struct fb_oreq *q = d->joiners.head; q; q = q->wnext, i++) {
        ranks[i] = req_rank(q);
        items[1 + 2 * i] = (fiber_iov){&ranks[i], 4};
        items[2 + 2 * i] = q->items[1];
    }
    fb_oreq_reply(req, 0, items, 1 + 2 * k);
    free(items);
    free(ranks);
}

static int rdv_call(struct fb_obj *o, struct fb_oreq *req)
{
    struct rdv *d = o->state;
    if (req->op == FB_RDV_JOIN)
        rdv_join(d, req);
    else if (req->op == FB_RDV_MEMBERS)
        rdv_members(d, req);
    else
        fb_oreq_fail(req, FIBER_EINVAL, "rendezvous has no operation %d",
                     req->op);
    return 1;
}

static void rdv_destroy(struct fb_obj *o)
{
    struct rdv *d = o->state;
    for (uint32_t i = 0; i < d->n; i++)
        sock_forget(&d->socks[i]);
    free(d->socks);
    free(d);
}

static const struct fb_obj_ops rdv_ops = {
    .call = rdv_call,
    .conn_gone = rdv_conn_gone,
    .destroy = rdv_destroy,
};

static int rdv_create(struct fb_obj *o, const fiber_iov *params, uint32_t n)
{
    uint32_t members = 0;
    if (n >= 1 && params[0].len == 4)
        memcpy(&members, params[0].data, 4);
    if (members < 1 || members > FIBER_RING_MAX_MEMBERS)
        return fb_err(FIBER_EINVAL, "a ring has 1 to %d members, not %u",
                      FIBER_RING_MAX_MEMBERS, members);
    struct rdv *d = calloc(1, sizeof *d);
    if (d && !(d->socks = calloc(members, sizeof *d->socks))) {
        free(d);
        d = NULL;
    }
    if (!d)
        return fb_err(FIBER_ENOMEM, "out of memory");
    d->n = members;
    randombytes_buf(&d->nonce, sizeof d->nonce);
    o->state = d;
    o->ops = &rdv_ops;
    return 0;
}

const struct fb_obj_kind fb_kind_rendezvous = {"rendezvous", rdv_create};
