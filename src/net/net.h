/*
 * net.h -- sockets and framed connections.
 *
 * Addresses are strings: "unix:/path/to/socket" or "tcp:HOST:PORT".
 * Every descriptor is created close-on-exec and non-blocking.
 *
 * A fb_conn is one framed stream: bytes in are buffered until a whole frame
 * (wire.h) is there; frames out are buffered and written with as few
 * system calls as possible.  A conn does no locking: one thread at a time.
 *
 * A conn over TCP may be encrypted (fb_conn_secure, secure.c): the peers
 * exchange ephemeral keys, mix in the run's token, and from then on every
 * byte travels in authenticated records.  Callers see no difference: what
 * they read is decrypted and what they append to fb_conn_out is plaintext.
 */
#ifndef FB_NET_H
#define FB_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

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

/* For a handshake the server cut before it answered (FIBER_ECLOSED): a
 * server over max_pending_connections closes the connection that has
 * waited longest, which under a burst of children on few cores may be a
 * real one.  Sleeps a short jittered time that doubles with *attempt
 * (1 ms, 2 ms, ... at most 256 ms) and returns 1 when there is still
 * time to dial again before deadline_ms, else 0 (without sleeping). */
int fb_dial_again(unsigned *attempt, uint64_t deadline_ms);

/* Accepts one pending connection: 0 with *fd, 1 when none is pending, or
 * FIBER_ESYS. */
int fb_sock_accept(int listen_fd, int *fd);

/* A connection.  Opaque: its fields are private to src/net/
 * (conn_int.h); this is storage of their size, so that an owner can embed
 * a conn in its own struct.  Storage that is all zero bytes (static, or
 * from calloc) is a closed conn: fb_conn_fd says -1 and fb_conn_close
 * does nothing.  A struct copy moves the conn (the encryption state is
 * owned, not shared): the old copy must then be dropped (zeroed), not
 * closed -- fb_conn_move does both. */
#define FB_CONN_STORAGE 352
struct fb_conn {
    union {
        unsigned char bytes[FB_CONN_STORAGE];
        void *align_ptr;
        uint64_t align_u64;
    } storage;
};

/* Makes c a connection over fd, taking ownership of fd (-1: a closed
 * conn).  Whatever c held before is forgotten, not closed. */
void fb_conn_init(struct fb_conn *c, int fd, uint32_t max_payload);

/* Moves *from into *to (which must be closed) and leaves *from closed. */
void fb_conn_move(struct fb_conn *to, struct fb_conn *from);

/* The descriptor, or -1 when closed. */
int fb_conn_fd(const struct fb_conn *c);

/* Takes the descriptor back without closing it: returns it (-1 when c
 * is closed) and leaves c without one, its buffers to fb_conn_close. */
int fb_conn_release_fd(struct fb_conn *c);

/* Why the last call failed ("" when none has). */
const char *fb_conn_err(const struct fb_conn *c);

/* The same, or otherwise when no call has said why. */
const char *fb_conn_err_or(const struct fb_conn *c, const char *otherwise);

/* The largest frame accepted from the peer from now on. */
void fb_conn_set_max_payload(struct fb_conn *c, uint32_t max_payload);

/* The output buffer: callers append whole frames to it (fb_wire_put_*)
 * and then flush.  The pointer holds while c stays where it is (its data
 * moves as the buffer grows). */
fiber_buf *fb_conn_out(struct fb_conn *c);

/* Bytes of plaintext frames in the output buffer not yet written (or,
 * on an encrypted conn, not yet sealed). */
size_t fb_conn_unsent(const struct fb_conn *c);

/* 1 when part of the output was written and the rest was not: a frame
 * may be cut in two, and nothing may be written around it.  Safe in a
 * signal handler. */
int fb_conn_partly_sent(const struct fb_conn *c);

/* Records why the caller's own I/O on c (fb_conn_swap_out) failed, for
 * fb_conn_err. */
void fb_conn_set_err(struct fb_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether c encrypts (fb_conn_secure was called on it). */
int fb_conn_encrypted(const struct fb_conn *c);

/* For a caller that writes a plaintext conn's output itself, outside the
 * lock that guards c: swaps the output buffer for *spare (whose bytes are
 * dropped; it keeps its allocation) and returns the offset in *spare, now
 * the old output, of the first byte still to write.  Frames appended to c
 * meanwhile go to the new buffer. */
size_t fb_conn_swap_out(struct fb_conn *c, fiber_buf *spare);

/* Closes the descriptor and frees the buffers.  Idempotent. */
void fb_conn_close(struct fb_conn *c);

/* Reads whatever the socket has without blocking.  Returns 0 (possibly
 * having read nothing), FIBER_ECLOSED at end of stream, FIBER_ESYS, or,
 * on an encrypted conn, FIBER_EPROTO (a record failed to authenticate, or
 * the handshake was wrong; fb_conn_err says which) or FIBER_ENOMEM.  Frames
 * that arrived whole before the failure stay available to fb_conn_next. */
int fb_conn_read(struct fb_conn *c);

/* Makes room in the input buffer for one read of a plaintext conn (as
 * fb_conn_read does, moving unparsed input to the front first): the bytes
 * from fb_conn_in_tail on.  Returns how many may be read there, 0 when
 * out of memory.  A caller that reads into it itself adds what it read
 * with fb_conn_in_grew; objclient.c does, so its spin catches a reply in
 * one recv. */
size_t fb_conn_in_room(struct fb_conn *c);

/* Where such a read puts its bytes (valid after fb_conn_in_room), and
 * the call that adds the n bytes it read to the input. */
uint8_t *fb_conn_in_tail(struct fb_conn *c);
void fb_conn_in_grew(struct fb_conn *c, size_t n);

/* Bytes allocated for input: what a peer has made this end hold. */
size_t fb_conn_in_capacity(const struct fb_conn *c);

/* Takes the next complete frame from the input buffer.  Returns 1 with *h
 * and *payload (a view valid until the next read or next call), 0 when no
 * whole frame is buffered yet, or FIBER_EPROTO (fb_conn_err says why; the
 * stream cannot be trusted any further).  The payload is checked with
 * fb_wire_check_payload before it is returned.  On an encrypted conn
 * whose stream failed (fb_conn_read), FIBER_EPROTO once the frames that
 * arrived before the failure have been taken. */
int fb_conn_next(struct fb_conn *c, struct fb_wire_hdr *h,
                 const uint8_t **payload);

/* Writes buffered output without blocking.  Returns 0 when all is sent, 1
 * when some remains (wait for fb_conn_wait_events: POLLOUT, or POLLIN on
 * an encrypted conn still waiting for the peer's key), FIBER_ECLOSED,
 * FIBER_ESYS, or on an encrypted conn FIBER_EPROTO / FIBER_ENOMEM. */
int fb_conn_flush(struct fb_conn *c);

/* What a caller holding unsent output must wait for before it calls
 * fb_conn_flush again: POLLOUT, or POLLIN when an encrypted conn cannot
 * seal anything before the peer's handshake arrives; 0 when nothing is
 * left to send. */
short fb_conn_wait_events(const struct fb_conn *c);

/* 1 while output is queued and not yet written (frames in `out`, or
 * records an encrypted conn has sealed but not sent). */
int fb_conn_pending(const struct fb_conn *c);

/* Writes all buffered output, waiting up to deadline_ms.  Returns 0,
 * FIBER_ETIMEDOUT, FIBER_ECLOSED or FIBER_ESYS. */
int fb_conn_flush_wait(struct fb_conn *c, uint64_t deadline_ms);

/* Waits up to deadline_ms for the next frame (reading as needed).  Returns
 * 1 with a frame as fb_conn_next does, FIBER_ETIMEDOUT, FIBER_ECLOSED,
 * FIBER_EPROTO or FIBER_ESYS. */
int fb_conn_recv_wait(struct fb_conn *c, struct fb_wire_hdr *h,
                      const uint8_t **payload, uint64_t deadline_ms);

/* ---- raw byte streams (the ring's data links) ---------------------------- *
 * A conn whose handshake frames are done may carry a byte stream of the
 * caller's own framing instead of frames.  These behave as sendmsg and recv
 * with MSG_DONTWAIT do, and encrypt when the conn does. */

/* Sends bytes from iov without blocking.  Returns how many were taken
 * (> 0), or -1 with errno (EAGAIN: the socket is full; EPIPE or
 * ECONNRESET: the peer is gone; EPROTO: the encrypted stream failed).
 * Encrypted bytes that were taken may still be queued: call fb_conn_flush
 * (or this again) until fb_conn_pending is 0. */
ssize_t fb_conn_sendv(struct fb_conn *c, const struct iovec *iov, int iovcnt);

/* Receives up to n bytes without blocking, from what is buffered first.
 * Returns how many (> 0), 0 at end of stream, or -1 with errno (EAGAIN:
 * nothing yet; EBADMSG: the encrypted stream failed to authenticate, and
 * fb_conn_err says why). */
ssize_t fb_conn_recv_bytes(struct fb_conn *c, void *dst, size_t n);

/* Bytes received and decrypted but not yet taken: while nonzero, a reader
 * must not wait for the socket. */
size_t fb_conn_buffered(const struct fb_conn *c);

/* For a fatal-signal handler: writes the conn's queued output, then
 * data[0, len) (whole frames), with write() and poll() only, never
 * allocating; waits at most a second whenever the socket is full.  On an
 * encrypted conn data is encrypted in place (it is overwritten). */
void fb_conn_write_now(struct fb_conn *c, uint8_t *data, size_t len);

/* ---- encryption (secure.c) ----------------------------------------------- */

#define FB_SEC_PSK_LEN 32u
#define FB_SEC_CLIENT 0 /* the end that dialed */
#define FB_SEC_SERVER 1 /* the end that accepted */

/* Encrypts and authenticates c from now on.  Call it right after dial or
 * accept, before anything is sent or read.  It queues this end's
 * handshake (a fresh X25519 public key) and sends it if the socket takes
 * it; the peer's arrives through fb_conn_read or fb_conn_flush.  psk is
 * the run's token: a peer without it can neither read nor forge a record.
 * role: FB_SEC_CLIENT or FB_SEC_SERVER.  Returns 0, or FIBER_ESTATE (c
 * already encrypted or already used) or FIBER_ENOMEM with a message. */
int fb_conn_secure(struct fb_conn *c, int role, const uint8_t *psk);

/* Whether c may carry frames: 1 on a plaintext conn, and on an encrypted
 * one once the peer's key has come and the session keys are derived. */
int fb_conn_handshake_done(const struct fb_conn *c);

/* 1 once an encrypted conn's stream has failed (fb_conn_err says why):
 * no more frames will come.  0 on a plaintext conn. */
int fb_conn_stream_failed(const struct fb_conn *c);

/* 1 if a connection to or from addr must be encrypted: addr is "tcp:..."
 * and the configuration's `encryption` is on (fb_net_configure).  Unix
 * sockets never are. */
int fb_net_encrypts(const char *addr);

/* fb_conn_secure(c, role, psk) when fb_net_encrypts(addr), else nothing:
 * the one line every dial and accept site calls.  addr is the address
 * dialed, or the listener's own address for an accepted conn. */
int fb_conn_secure_for(struct fb_conn *c, const char *addr, int role,
                       const uint8_t *psk);

/* ---- what net/ takes from the configuration (settings.c) ---------------- */

/* net/ sits below the runtime and never asks it: the runtime hands these
 * down (fb_net_configure) when it loads the configuration and whenever
 * fiber_config_set() changes it.  Until then every field is 0. */
struct fb_net_config {
    int encryption;              /* encrypt tcp: connections (secure.c) */
    int max_pending_connections; /* a gate's cap when it names none */
    int connect_timeout_ms;      /* a gate's deadline when it names none */
};

/* Replaces the settings (a copy is kept). */
void fb_net_configure(const struct fb_net_config *c);
/* The settings in force. */
const struct fb_net_config *fb_net_config(void);

#endif /* FB_NET_H */
