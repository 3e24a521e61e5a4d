/*
 * secure.h -- what conn.c calls in secure.c for an encrypted conn
 * (c->sec != NULL).  Private to src/net; net.h has the public side.
 */
#ifndef FB_NET_SECURE_H
#define FB_NET_SECURE_H

#include "net/conn_int.h"

/* The first bytes an encrypting end sends; a plaintext conn that receives
 * them says so instead of "bad magic". */
#define FB_SEC_MAGIC "FBX1"
#define FB_SEC_MAGIC_LEN 4u

/* fb_conn_read, fb_conn_flush and fb_conn_sendv on an encrypted conn. */
int fb_sec_read(struct fb_conn_impl *c);
int fb_sec_flush(struct fb_conn_impl *c);
ssize_t fb_sec_sendv(struct fb_conn_impl *c, const struct iovec *iov,
                     int iovcnt);

/* fb_conn_write_now's work after the plaintext case: async-signal-safe. */
void fb_sec_write_now(struct fb_conn_impl *c, uint8_t *data, size_t len,
                      void (*write_all)(int fd, const uint8_t *p, size_t n));

/* 1 once the stream has failed (c->err says why): no more frames. */
int fb_sec_failed(const struct fb_conn_impl *c);

/* 1 while output cannot be sealed because the peer's key has not come. */
int fb_sec_needs_key(const struct fb_conn_impl *c);
/* Whether the handshake is done: the peer's key arrived and the session
 * keys are derived (what is sent from here on is sealed and goes out). */
int fb_sec_established(const struct fb_conn_impl *c);

/* 1 while sealed records wait to be written. */
int fb_sec_unsent(const struct fb_conn_impl *c);

/* Wipes the keys and frees the state (fb_conn_close). */
void fb_sec_free(struct fb_secure *s);

#endif /* FB_NET_SECURE_H */
