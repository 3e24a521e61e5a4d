/*
 * net.h -- sockets and framed connections.
 *
 * Addresses are strings: "unix:/path/to/socket" or "tcp:HOST:PORT".
 * Every descriptor is created close-on-exec and non-blocking.
 *
 * A fb_conn is one framed stream: bytes in are buffered until a whole frame
 * (wire.h) is there; frames out are buffered and written with as few
 * system calls as possible.  A conn does no locking: one thread at a time.
 */
#ifndef FB_NET_H
#define FB_NET_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"
#include "wire/wire.h"

/* Listens on addr ("unix:/path" or "tcp:HOST:PORT"; port 0 picks one).
 * Writes the address actually bound (with the real port) to bound.
 * Returns 0 with *fd, or FIBER_ESYS / FIBER_EINVAL. */
int fb_sock_listen(const char *addr, int backlog, int *fd, char *bound,
                   size_t bound_size);

/* Connects to addr, waiting until deadline_ms (fb_deadline_ms).  Returns 0
 * with a connected non-blocking *fd, FIBER_EUNREACHABLE (refused, no such
 * socket, timed out) or FIBER_EINVAL (bad address). */
int fb_sock_dial(const char *addr, uint64_t deadline_ms, int *fd);

/* Accepts one pending connection: 0 with *fd, 1 when none is pending, or
 * FIBER_ESYS. */
int fb_sock_accept(int listen_fd, int *fd);

struct fb_conn {
    int fd;
    uint32_t max_payload; /* frames claiming more are a protocol error */
    fiber_buf in;         /* received bytes; [in_off, in.len) unparsed */
    size_t in_off;
    fiber_buf out;        /* frames to send; [out_off, out.len) unsent */
    size_t out_off;
    char err[256];        /* why the last call failed */
};

/* Makes c a connection over fd (taking ownership of fd). */
void fb_conn_init(struct fb_conn *c, int fd, uint32_t max_payload);

/* Closes the descriptor and frees the buffers.  Idempotent. */
void fb_conn_close(struct fb_conn *c);

/* Reads whatever the socket has without blocking.  Returns 0 (possibly
 * having read nothing), FIBER_ECLOSED at end of stream, or FIBER_ESYS. */
int fb_conn_read(struct fb_conn *c);

/* Takes the next complete frame from the input buffer.  Returns 1 with *h
 * and *payload (a view valid until the next read or next call), 0 when no
 * whole frame is buffered yet, or FIBER_EPROTO (c->err says why; the
 * stream cannot be trusted any further).  The payload is checked with
 * fb_wire_check_payload before it is returned. */
int fb_conn_next(struct fb_conn *c, struct fb_wire_hdr *h,
                 const uint8_t **payload);

/* Writes buffered output without blocking.  Returns 0 when all is sent, 1
 * when some remains (wait for POLLOUT), FIBER_ECLOSED or FIBER_ESYS. */
int fb_conn_flush(struct fb_conn *c);

/* Writes all buffered output, waiting up to deadline_ms.  Returns 0,
 * FIBER_ETIMEDOUT, FIBER_ECLOSED or FIBER_ESYS. */
int fb_conn_flush_wait(struct fb_conn *c, uint64_t deadline_ms);

/* Waits up to deadline_ms for the next frame (reading as needed).  Returns
 * 1 with a frame as fb_conn_next does, FIBER_ETIMEDOUT, FIBER_ECLOSED,
 * FIBER_EPROTO or FIBER_ESYS. */
int fb_conn_recv_wait(struct fb_conn *c, struct fb_wire_hdr *h,
                      const uint8_t **payload, uint64_t deadline_ms);

#endif /* FB_NET_H */
