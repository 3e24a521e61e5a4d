/*
 * ring_ops.h -- the operations of a ring's rendezvous (ring_rdv.c), the
 * object on the master's object server where the members of a fiber_ring
 * (ring.c) meet.  Items are in the OCALL's list; u32 and u64 are
 * little-endian.
 *
 *   JOIN     items: u32 rank | the member's listening address.  Parked
 *            until every rank is in; then each member is answered u64
 *            nonce | the N members' addresses, by rank.
 *   MEMBERS  no items; answers u32 formed | (u32 rank | address) for each
 *            member waiting so far (for tests: fb_ring_peek).
 */
#ifndef FB_RING_OPS_H
#define FB_RING_OPS_H

#include "objsrv/objsrv.h"

#define FB_RDV_JOIN (FB_OP_KIND + 0)
#define FB_RDV_MEMBERS (FB_OP_KIND + 1)

/* A member's address, with its NUL, is shorter than this. */
#define FB_RING_ADDR_MAX 600

/* Removes the unix socket at addr when it is named prefix* ("ring",
 * "pipe") beside srv's own socket: what a member killed while it waited
 * left behind (ring_rdv.c; pipe_rdv.c uses it too). */
void fb_rdv_unlink_sock(const struct fb_objsrv *srv, const char *addr,
                        const char *prefix);

#endif /* FB_RING_OPS_H */
