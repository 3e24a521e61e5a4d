/*
 * future.h -- one fiber_future for every asynchronous call: a pool's
 * apply_async and map_async (pool/pool.c) and an object call's
 * (objsrv/objclient.c: queues, managers, dicts).
 *
 * A future is a checked handle over an implementation that says how to
 * wait for it, read it and free it (struct fb_future_ops).  future.c owns
 * the handle and the public fiber_future_* functions; the implementation
 * owns what it waits on, and names no other.
 */
#ifndef FB_FUTURE_H
#define FB_FUTURE_H

#include "fiber/fiber.h"

struct fb_future_ops {
    /* Waits until the call is done, at most timeout_ms (-1: no limit).
     * Returns 0, or FIBER_ETIMEDOUT (or another code) with the message. */
    int (*wait)(void *impl, int timeout_ms);
    /* After a wait that returned 0: the call's status (0 or its FIBER_E*
     * code with its message), its output appended to out (may be NULL). */
    int (*take)(void *impl, fiber_buf *out);
    /* 1 if done, 0 if not (or a FIBER_E* code); does not block. */
    int (*ready)(void *impl);
    /* Once ready: 1 if the call succeeded, else 0. */
    int (*succeeded)(void *impl);
    /* Drops the implementation (it may wait, when the call still writes
     * into the caller's memory). */
    void (*free)(void *impl);
};

/* Makes a future over impl.  Returns 0 or FIBER_ENOMEM (impl is then not
 * the future's: the caller frees it). */
int fb_future_new(const struct fb_future_ops *ops, void *impl,
                  fiber_future **out);

#endif /* FB_FUTURE_H */
