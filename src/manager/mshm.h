/*
 * mshm.h -- a manager object's state in shared memory, so that a client on
 * the manager's host makes its calls itself, with no round trip.
 *
 * The dict, value, lock and rlock kinds of mobj_srv.c keep their state in
 * a segment of their own: a memfd, one page for a value or a lock, a
 * growing heap for a dict (shdict.c).  The manager maps it and serves the
 * calls of remote clients on it as before.  A client whose connection to
 * the manager is a unix socket (so it is on the same host) asks for the
 * segment (operation M_SHARE); the answer names the manager's pid, the
 * memfd's descriptor number there and a random nonce, and the client
 * opens /proc/<pid>/fd/<n>, maps it and checks the nonce in its header.
 * That works only in the manager's pid namespace and with the right to
 * read its descriptors (the same user); anywhere else (another
 * container, another host) the client stays on the socket, with the same
 * results.
 *
 * Liveness.  The thread serving the objects holds a robust mutex in a
 * page of its own (the "life" page, one per serving thread, also shared):
 * while pthread_mutex_trylock on it says EBUSY the manager lives; when
 * the manager dies the kernel marks it, and every local call fails with
 * FIBER_ECLOSED as a call over the dead socket would.  An object released
 * (fiber_mobj_release) or a manager stopped sets the segment's `freed`
 * word, which every call checks.
 *
 * Locks.  A lock's word `owner` is 0 when free, else the holder's
 * connection id (given by the manager, unique for its life) and thread in
 * one 64-bit CAS: a holder is never half-recorded, so when a client dies
 * the manager releases exactly what it held (conn_gone).  Local waiters
 * sleep on the futex `seq`, bumped at each release; the manager's parked
 * acquires (remote clients) are flagged in `srv_waiting`, and a local
 * releaser that sees it posts K_WAKE so the manager hands the lock on.
 */
#ifndef FB_MSHM_H
#define FB_MSHM_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

#define FB_MSHM_HDR 256 /* the header's size: a dict's region follows */

enum fb_mshm_kind { FB_MSHM_VALUE = 1, FB_MSHM_LOCK, FB_MSHM_RLOCK,
                    FB_MSHM_DICT };

struct fb_mshm_hdr {
    uint64_t magic;
    uint64_t nonce;
    uint32_t kind;  /* enum fb_mshm_kind */
    uint32_t freed; /* 0 live, FB_MSHM_RELEASED, FB_MSHM_STOPPED */
    uint64_t reserve;
    int64_t value;        /* a value */
    uint64_t owner;       /* a lock: 0 free, else conn id << 32 | thread */
    uint32_t seq;         /* a lock: futex, bumped at each release */
    uint32_t sleepers;    /* a lock: local waiters in futex_wait (a hint) */
    uint32_t depth;       /* an rlock: the holder's depth */
    uint32_t srv_waiting; /* a lock: the manager has parked acquires */
    char name[128];       /* the object's name, for error texts */
};

#define FB_MSHM_RELEASED 1u
#define FB_MSHM_STOPPED 2u

/* One process's mapping of a segment. */
struct fb_mshm {
    struct fb_mshm_hdr *h; /* NULL: none */
    size_t map_len;
    int fd; /* the memfd (kept for a dict's growth); -1: anonymous */
    void *life; /* the client's mapping of the manager's life page */
};

/* ---- the manager's side ---- */

/* Creates a segment of kind for the object `name`, mapped with `reserve`
 * bytes of address space, its file `initial` bytes long (both multiples
 * of the page size, initial <= reserve).  When no memfd can be made (out
 * of descriptors) the segment is private memory: it works, only no
 * client can map it (fb_mshm_share says so).  0 or FIBER_ENOMEM. */
int fb_mshm_create(struct fb_mshm *m, int kind, const char *name,
                   size_t reserve, size_t initial);
/* Marks it freed for good (why: FB_MSHM_RELEASED or FB_MSHM_STOPPED),
 * wakes its sleepers, unmaps and closes it. */
void fb_mshm_destroy(struct fb_mshm *m, uint32_t why);
/* The answer to M_SHARE for the client on connection conn_id, appended to
 * out.  FIBER_ENOTSUP when the segment cannot be shared. */
int fb_mshm_share(const struct fb_mshm *m, uint32_t conn_id,
                  fiber_buf *out);

/* ---- the client's side ---- */

/* Maps the segment that the M_SHARE answer (share, len) names, checking
 * it is of kind.  Fills *m and *conn_id (this client's id on the
 * manager).  0, or a code: the client then stays on the socket. */
int fb_mshm_attach(struct fb_mshm *m, const void *share, size_t len, int kind,
                   uint32_t *conn_id);
void fb_mshm_detach(struct fb_mshm *m);
/* 0 while the object can be used, else FIBER_ECLOSED with the reason
 * (released, manager stopped, manager gone) naming what. */
int fb_mshm_usable(const struct fb_mshm *m, const char *what);

/* ---- operations, for both sides ---- */

int64_t fb_mshm_value_get(struct fb_mshm_hdr *h);
void fb_mshm_value_set(struct fb_mshm_hdr *h, int64_t v);
int64_t fb_mshm_value_add(struct fb_mshm_hdr *h, int64_t d);
int64_t fb_mshm_value_cas(struct fb_mshm_hdr *h, int64_t expect,
                          int64_t desire);

/* Takes the lock for `me` if it is free (or, recursive, already held by
 * me: one level deeper).  1 taken, 0 held by another. */
int fb_mshm_lock_try(struct fb_mshm_hdr *h, uint64_t me, int recursive);
/* Releases a level of it for `me` (a plain lock: for anyone).  0,
 * FIBER_ESTATE not held (*why 0) or held by another (*why 1).  On a full
 * release *wake_srv says whether the manager waits for it (post K_WAKE). */
int fb_mshm_lock_release(struct fb_mshm_hdr *h, uint64_t me, int recursive,
                         int *why, int *wake_srv);
/* Frees the lock whoever holds it (the manager, for a client that went)
 * and wakes a sleeper. */
void fb_mshm_lock_clear(struct fb_mshm_hdr *h);
/* A client's wait: takes the lock within timeout_ms (-1: no limit; 0: try
 * once), sleeping on the futex; checks m stays usable.  0,
 * FIBER_EAGAIN (timeout 0), FIBER_ETIMEDOUT or FIBER_ECLOSED. */
int fb_mshm_lock_wait(const struct fb_mshm *m, uint64_t me, int recursive,
                      int timeout_ms, const char *what);

#endif /* FB_MSHM_H */
