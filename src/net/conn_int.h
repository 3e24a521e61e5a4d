/*
 * conn_int.h -- the inside of a fb_conn.  Private to src/net/.
 *
 * Everything outside src/net/ holds a struct fb_conn (net.h): storage of
 * the right size and alignment, so an owner can still embed its conn,
 * whose fields it cannot see; it works through net.h's functions.  Only
 * the files in src/net/ include this header, and scripts/check-layers.py fails
 * (in ctest) if any other file does.
 */
#ifndef FB_NET_CONN_INT_H
#define FB_NET_CONN_INT_H

#include <stdalign.h>

#include "net/net.h"

struct fb_conn_impl {
    int fd;
    int live;             /* set by fb_conn_init: zeroed storage is a
                             closed conn, not descriptor 0 */
    uint32_t max_payload; /* frames claiming more are a protocol error */
    uint32_t out_moved;   /* sent bytes were dropped from out's head since
                             it last drained (fb_conn_flush compacts) */
    fiber_buf in;         /* received bytes; [in_off, in.len) unparsed */
    size_t in_off;
    fiber_buf out;        /* frames to send; [out_off, out.len) unsent */
    size_t out_off;
    struct fb_secure *sec; /* NULL: plaintext.  Owned; a struct copy of
                              the conn moves it (the old copy is dropped,
                              not closed) */
    char err[256];        /* why the last call failed */
};

_Static_assert(sizeof(struct fb_conn_impl) <= sizeof(struct fb_conn),
               "FB_CONN_STORAGE in net.h is too small for a conn");
_Static_assert(alignof(struct fb_conn_impl) <= alignof(struct fb_conn),
               "struct fb_conn is less aligned than the conn it stores");

/* The conn stored in c. */
static inline struct fb_conn_impl *conn_impl(struct fb_conn *c)
{
    return (struct fb_conn_impl *)(void *)c->storage.bytes;
}

static inline const struct fb_conn_impl *conn_cimpl(const struct fb_conn *c)
{
    return (const struct fb_conn_impl *)(const void *)c->storage.bytes;
}

/* Drops out's sent head [0, out_off) once it is at least 64 KiB and
 * outweighs the unsent tail, moving the tail to the front (also, if not
 * NULL, is an offset into out that moves with it: secure.c's sealed).
 * Called when the socket would block: a connection that never drains
 * completely then reuses its buffer instead of growing it. */
void fb_conn_compact_output(struct fb_conn_impl *c, size_t *also);

#endif /* FB_NET_CONN_INT_H */
