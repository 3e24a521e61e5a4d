/*
 * pipe_ops.h -- the operations of a pipe's rendezvous (pipe_rdv.c), the
 * object on the master's object server where the two ends of a fiber_pipe
 * (pipe.c) learn how to reach each other.  Items are in the OCALL's list;
 * u32 and u64 are little-endian.
 *
 *   JOIN      items: u32 side (0: end a, 1: end b) | u32 pid | u64 handle
 *             id | the handle's listening address.  Never parked:
 *             answers u32 verdict | u64 nonce | the address to dial
 *             (empty unless DIAL), and with GONE a fourth item: u32
 *             pid of the process that held the other end.  A handle
 *             JOINs again, with the same id, to learn whether its wait
 *             is over, or (a relayed end, while it waits in recv)
 *             whether the other end is gone.
 *   FALLBACK  items: u32 side.  The side told to DIAL could not: the pipe
 *             stays on its relayed queues.
 *   HOLD      items: u32 side | u32 pid | u64 handle id.  A handle opened
 *             from its serialised form says which process holds the side
 *             before it is used (so that the side is gone when that
 *             process ends without using it).  Answers nothing.
 *   HANDED    items: u32 side.  A handle that holds its side (it was
 *             opened or used in this process) was serialised: another
 *             process may open the side later, so the side is never
 *             declared gone.  Answers nothing.
 *   SHARED    items: u32 side.  One handle of the side was serialised a
 *             second time: several processes may use the side (workers
 *             writing to one end, as multiprocessing allows), which a
 *             direct link, one process's, cannot serve.  A JOIN after it
 *             is answered RELAYED; a pipe already DIRECT stays so (a
 *             second process that opens the linked side is refused, as
 *             before).  Answers nothing.
 */
#ifndef FB_PIPE_OPS_H
#define FB_PIPE_OPS_H

#include "objsrv/objsrv.h"

#define FB_PRDV_JOIN (FB_OP_KIND + 0)
#define FB_PRDV_FALLBACK (FB_OP_KIND + 1)
#define FB_PRDV_HOLD (FB_OP_KIND + 2)
#define FB_PRDV_HANDED (FB_OP_KIND + 3)
#define FB_PRDV_SHARED (FB_OP_KIND + 4)

/* JOIN's verdicts. */
#define FB_PRDV_WAIT 0    /* listen: the other end will dial this one */
#define FB_PRDV_DIAL 1    /* dial the address in the answer */
#define FB_PRDV_RELAYED 2 /* stay on the relayed queues (for good) */
#define FB_PRDV_DIALED 3  /* (to a waiting handle) the other end was told
                             to dial it */
#define FB_PRDV_GONE 4    /* the other end's only handle is gone (its
                             process ended, or freed it): take what it put
                             on the relayed queue, then end of stream */

/* An address, with its NUL, is shorter than this. */
#define FB_PIPE_ADDR_MAX 600

/* Waits until every pipe end of this process that is connected directly
 * has written what its sends left in its output (the flusher's batches
 * included), or the deadline passes: a child's target may return, and
 * the process exit, with a stream's last messages still unwritten
 * (pipe.c).  init.c's drain hook calls it before fb_oclients_drain; a
 * process that never called fiber_init runs it at exit. */
void fb_pipes_drain(uint64_t deadline_ms);

#endif /* FB_PIPE_OPS_H */
