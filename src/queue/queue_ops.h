/*
 * queue_ops.h -- the operations of a queue object (queue_srv.c), as
 * clients (queue.c) call them.  Items are in the OCALL's list; u32 and
 * u64 are little-endian.
 *
 *   PUT      items: the messages (1 or more).  Answered once all are in
 *            the queue (those that do not fit wait, in order); FIBER_EAGAIN
 *            at once when the queue is full and the timeout is 0.
 *   GET      items: u32 consumer id | u32 window (>= 1) | u32 flags
 *            [| the name of the consumer's mark page, in its first get].
 *            Lends up to `window` items (at most FB_QGET_MAX untaken) to
 *            the consumer and answers u64 first sequence number | u64
 *            flags (FB_QREPLY_MARKS: the page is read), then the items; waits while the queue is empty, except with
 *            FB_QGET_REFILL (a prefetch: answered at once, with no items
 *            when the queue is empty or other getters wait).
 *   SIZE     no items; answers u64: items queued or lent, not yet taken.
 *   CLOSE    no items.
 *   TAKEN    posted, no answer.  u32 consumer id | u64 seq | u32 how: the
 *            application took lent item seq (how 0: it is gone; how 1: as
 *            a lease, it stays lent until ACK).  Items are taken in order.
 *   ACK      posted.  u32 consumer id | u64 seq: lease seq is done.
 *   RELEASE  posted.  u32 consumer id: the handle goes; what it holds goes
 *            back to the queue.
 *   FREE     no items: the queue is destroyed; its waiters fail with
 *            FIBER_ECLOSED, later calls too ("object N was freed").
 */
#ifndef FB_QUEUE_OPS_H
#define FB_QUEUE_OPS_H

#include "objsrv/objsrv.h"

#define FB_QOP_PUT (FB_OP_KIND + 0)
#define FB_QOP_GET (FB_OP_KIND + 1)
#define FB_QOP_SIZE (FB_OP_KIND + 2)
#define FB_QOP_CLOSE (FB_OP_KIND + 3)
#define FB_QOP_TAKEN (FB_OP_KIND + 4)
#define FB_QOP_ACK (FB_OP_KIND + 5)
#define FB_QOP_RELEASE (FB_OP_KIND + 6)
#define FB_QOP_FREE (FB_OP_KIND + 7)

#define FB_QGET_REFILL 1u
#define FB_QGET_MAX 1024u
#define FB_QREPLY_MARKS 1u
#define FB_QACK_SLOTS 4096u /* bytes in a mark page: > FB_QGET_MAX */

#endif /* FB_QUEUE_OPS_H */
