/*
 * conn.c -- framed connections over non-blocking stream sockets.
 *
 * Input is read into one growing buffer and frames are handed out as views
 * into it, so a frame costs no copy.  Memory per connection is bounded by
 * the largest frame the peer may send (max_payload): bytes are only stored
 * as they arrive, and a header that claims more than the limit ends the
 * stream before anything is allocated for it.
 *
 * The conn's fields are private to net/ (conn_int.h); the accessors below
 * are what the rest of the tree may know of one.
 *
 * An encrypted conn (c->sec, secure.c) keeps the same buffers: `in` holds
 * decrypted bytes and `out` plaintext frames; secure.c seals on flush and
 * opens on read, so everything here above the socket works unchanged.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/common.h"
#include "net/conn_int.h"
#include "net/secure.h"

#define READ_CHUNK 65536u

void fb_conn_init(struct fb_conn *conn, int fd, uint32_t max_payload)
{
    struct fb_conn_impl *c = conn_impl(conn);
    memset(conn, 0, sizeof *conn);
    c->fd = fd;
    c->live = 1;
    c->max_payload = max_payload;
}

void fb_conn_move(struct fb_conn *to, struct fb_conn *from)
{
    *to = *from;
    memset(from, 0, sizeof *from);
}

void fb_conn_close(struct fb_conn *conn)
{
    struct fb_conn_impl *c = conn_impl(conn);
    if (c->live && c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    fb_sec_free(c->sec);
    c->sec = NULL;
    fiber_buf_free(&c->in);
    fiber_buf_free(&c->out);
    c->in_off = c->out_off = 0;
    c->out_moved = 0;
}

/* ---- what callers outside net/ may know of a conn ------------------------ */

int fb_conn_fd(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return c->live ? c->fd : -1;
}

int fb_conn_release_fd(struct fb_conn *conn)
{
    int fd = fb_conn_fd(conn);
    conn_impl(conn)->fd = -1;
    return fd;
}

const char *fb_conn_err(const struct fb_conn *conn)
{
    return conn_cimpl(conn)->err;
}

const char *fb_conn_err_or(const struct fb_conn *conn, const char *otherwise)
{
    const char *err = conn_cimpl(conn)->err;
    return err[0] ? err : otherwise;
}

void fb_conn_set_max_payload(struct fb_conn *conn, uint32_t max_payload)
{
    conn_impl(conn)->max_payload = max_payload;
}

fiber_buf *fb_conn_out(struct fb_conn *conn)
{
    return &conn_impl(conn)->out;
}

size_t fb_conn_unsent(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return c->out.len - c->out_off;
}

int fb_conn_partly_sent(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return (c->out_off != 0 || c->out_moved) && c->out_off < c->out.len;
}

void fb_conn_set_err(struct fb_conn *conn, const char *fmt, ...)
{
    struct fb_conn_impl *c = conn_impl(conn);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

int fb_conn_encrypted(const struct fb_conn *conn)
{
    return conn_cimpl(conn)->sec != NULL;
}

size_t fb_conn_swap_out(struct fb_conn *conn, fiber_buf *spare)
{
    struct fb_conn_impl *c = conn_impl(conn);
    fiber_buf batch = c->out;
    size_t off = c->out_off;
    c->out = *spare;
    c->out.len = 0;
    c->out_off = 0;
    c->out_moved = 0;
    *spare = batch;
    return off;
}

uint8_t *fb_conn_in_tail(struct fb_conn *conn)
{
    struct fb_conn_impl *c = conn_impl(conn);
    return c->in.data + c->in.len;
}

void fb_conn_in_grew(struct fb_conn *conn, size_t n)
{
    conn_impl(conn)->in.len += n;
}

size_t fb_conn_in_capacity(const struct fb_conn *conn)
{
    return conn_cimpl(conn)->in.cap;
}

/* ---- reading and writing frames ------------------------------------------ */

/* Moves unparsed input to the front once the parsed part dominates, so the
 * buffer does not grow without bound on a long-lived connection. */
static void compact_input(struct fb_conn_impl *c)
{
    if (c->in_off == 0)
        return;
    size_t rest = c->in.len - c->in_off;
    if (rest)
        memmove(c->in.data, c->in.data + c->in_off, rest);
    c->in.len = rest;
    c->in_off = 0;
}

size_t fb_conn_in_room(struct fb_conn *conn)
{
    struct fb_conn_impl *c = conn_impl(conn);
    compact_input(c);
    size_t chunk = READ_CHUNK;
    if (chunk > (size_t)c->max_payload + FB_WIRE_HDR_LEN)
        chunk = (size_t)c->max_payload + FB_WIRE_HDR_LEN;
    if (fiber_buf_reserve(&c->in, chunk) != 0)
        return 0;
    return c->in.cap - c->in.len;
}

int fb_conn_read(struct fb_conn *conn)
{
    struct fb_conn_impl *c = conn_impl(conn);
    /* One recv per call: the caller takes the frames out before reading
     * again, so unparsed input never exceeds one frame plus one chunk, and
     * a peer that floods us cannot make the buffer grow past that. */
    if (c->sec) {
        compact_input(c);
        return fb_sec_read(c);
    }
    if (fb_conn_in_room(conn) == 0)
        return FIBER_ENOMEM;
    for (;;) {
        ssize_t n = recv(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len,
                         0);
        if (n > 0) {
            c->in.len += (size_t)n;
            return 0;
        }
        if (n == 0) {
            snprintf(c->err, sizeof c->err, "peer closed the connection");
            return FIBER_ECLOSED;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == ECONNRESET || errno == EPIPE) {
            snprintf(c->err, sizeof c->err, "connection reset by peer");
            return FIBER_ECLOSED;
        }
        snprintf(c->err, sizeof c->err, "recv: %s", strerror(errno));
        return FIBER_ESYS;
    }
}

int fb_conn_next(struct fb_conn *conn, struct fb_wire_hdr *h,
                 const uint8_t **payload)
{
    struct fb_conn_impl *c = conn_impl(conn);
    /* Nothing read yet: no buffer, and NULL + 0 is undefined. */
    const uint8_t *p = c->in.data ? c->in.data + c->in_off : NULL;
    size_t avail = c->in.len - c->in_off;
    int rc = fb_wire_hdr_decode(p, avail, c->max_payload, h, c->err,
                                sizeof c->err);
    if (rc == 1)
        return c->sec && fb_sec_failed(c) ? FIBER_EPROTO : 0;
    if (rc != 0) {
        if (!c->sec && avail >= FB_SEC_MAGIC_LEN &&
            memcmp(p, FB_SEC_MAGIC, FB_SEC_MAGIC_LEN) == 0)
            snprintf(c->err, sizeof c->err,
                     "the peer encrypts its traffic and this end does not "
                     "(every process of a run must use the same "
                     "encryption setting)");
        return FIBER_EPROTO;
    }
    if (avail - FB_WIRE_HDR_LEN < h->len)
        return c->sec && fb_sec_failed(c) ? FIBER_EPROTO : 0;
    rc = fb_wire_check_payload(h, p + FB_WIRE_HDR_LEN, c->err, sizeof c->err);
    if (rc != 0)
        return FIBER_EPROTO;
    *payload = p + FB_WIRE_HDR_LEN;
    c->in_off += FB_WIRE_HDR_LEN + h->len;
    return 1;
}

/* The bytes sent before a move cost at least as much as the move, so
 * compaction costs at most one copy of the stream. */
#define COMPACT_MIN (64u << 10)

void fb_conn_compact_output(struct fb_conn_impl *c, size_t *also)
{
    size_t unsent = c->out.len - c->out_off;
    if (c->out_off < COMPACT_MIN || c->out_off < unsent)
        return;
    memmove(c->out.data, c->out.data + c->out_off, unsent);
    if (also)
        *also -= c->out_off;
    c->out.len = unsent;
    c->out_off = 0;
    c->out_moved = 1;
}

int fb_conn_flush(struct fb_conn *conn)
{
    struct fb_conn_impl *c = conn_impl(conn);
    if (c->sec)
        return fb_sec_flush(c);
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_off,
                         c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            fb_conn_compact_output(c, NULL);
            return 1;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            snprintf(c->err, sizeof c->err, "peer closed the connection");
            return FIBER_ECLOSED;
        }
        snprintf(c->err, sizeof c->err, "send: %s", strerror(errno));
        return FIBER_ESYS;
    }
    c->out.len = c->out_off = 0;
    c->out_moved = 0;
    return 0;
}

/* Waits for events on the connection until deadline; 0 on readiness,
 * FIBER_ETIMEDOUT, or FIBER_ESYS. */
static int wait_fd(struct fb_conn_impl *c, short events, uint64_t deadline_ms)
{
    struct pollfd p = {.fd = c->fd, .events = events};
    for (;;) {
        int n = poll(&p, 1, fb_ms_left(deadline_ms));
        if (n > 0)
            return 0;
        if (n == 0) {
            snprintf(c->err, sizeof c->err, "timed out");
            return FIBER_ETIMEDOUT;
        }
        if (errno != EINTR) {
            snprintf(c->err, sizeof c->err, "poll: %s", strerror(errno));
            return FIBER_ESYS;
        }
    }
}

short fb_conn_wait_events(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    if (c->sec && fb_sec_needs_key(c))
        return POLLIN;
    return fb_conn_pending(conn) ? POLLOUT : 0;
}

int fb_conn_pending(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return c->out_off < c->out.len || (c->sec && fb_sec_unsent(c));
}

int fb_conn_flush_wait(struct fb_conn *conn, uint64_t deadline_ms)
{
    struct fb_conn_impl *c = conn_impl(conn);
    for (;;) {
        int rc = fb_conn_flush(conn);
        if (rc != 1)
            return rc;
        rc = wait_fd(c, fb_conn_wait_events(conn), deadline_ms);
        if (rc)
            return rc;
    }
}

int fb_conn_recv_wait(struct fb_conn *conn, struct fb_wire_hdr *h,
                      const uint8_t **payload, uint64_t deadline_ms)
{
    struct fb_conn_impl *c = conn_impl(conn);
    for (;;) {
        int rc = fb_conn_next(conn, h, payload);
        if (rc != 0)
            return rc;
        rc = fb_conn_read(conn);
        if (rc)
            return rc;
        rc = fb_conn_next(conn, h, payload);
        if (rc != 0)
            return rc;
        rc = wait_fd(c, POLLIN, deadline_ms);
        if (rc)
            return rc;
    }
}

/* ---- raw byte streams ---------------------------------------------------- */

ssize_t fb_conn_sendv(struct fb_conn *conn, const struct iovec *iov, int iovcnt)
{
    struct fb_conn_impl *c = conn_impl(conn);
    if (c->sec)
        return fb_sec_sendv(c, iov, iovcnt);
    struct msghdr mh = {.msg_iov = (struct iovec *)iov,
                        .msg_iovlen = (size_t)iovcnt};
    return sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

size_t fb_conn_buffered(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return c->in.len - c->in_off;
}

ssize_t fb_conn_recv_bytes(struct fb_conn *conn, void *dst, size_t n)
{
    struct fb_conn_impl *c = conn_impl(conn);
    for (;;) {
        size_t have = c->in.len - c->in_off;
        if (have > 0) {
            size_t k = have < n ? have : n;
            memcpy(dst, c->in.data + c->in_off, k);
            c->in_off += k;
            if (c->in_off == c->in.len)
                c->in.len = c->in_off = 0;
            return (ssize_t)k;
        }
        if (!c->sec)
            return recv(c->fd, dst, n, MSG_DONTWAIT);
        int rc = fb_conn_read(conn);
        if (c->in.len > c->in_off)
            continue;
        switch (rc) {
        case 0:
            errno = EAGAIN;
            return -1;
        case FIBER_ECLOSED:
            return 0;
        case FIBER_EPROTO:
            errno = EBADMSG;
            return -1;
        case FIBER_ENOMEM:
            errno = ENOMEM;
            return -1;
        default:
            return -1; /* FIBER_ESYS: recv's errno */
        }
    }
}

/* ---- the fatal-signal path ----------------------------------------------- */

/* write() until done, waiting on poll() when the socket is full; both are
 * async-signal-safe. */
static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            if (poll(&pf, 1, 1000) <= 0)
                return;
        } else {
            return;
        }
    }
}

void fb_conn_write_now(struct fb_conn *conn, uint8_t *data, size_t len)
{
    struct fb_conn_impl *c = conn_impl(conn);
    if (c->sec) {
        fb_sec_write_now(c, data, len, write_all);
        return;
    }
    write_all(c->fd, c->out.data + c->out_off, c->out.len - c->out_off);
    c->out_off = c->out.len;
    write_all(c->fd, data, len);
}
