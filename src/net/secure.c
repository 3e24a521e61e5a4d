/*
 * secure.c -- encryption and mutual authentication of a TCP connection.
 *
 * Handshake.  Both ends send, as soon as the connection exists, the
 * 4 bytes "FBX1" and a fresh X25519 public key (crypto_kx_keypair), 36
 * bytes in all.  On receiving the peer's key each end computes the two
 * directional keys of crypto_kx (the dialer is the client) and mixes in
 * the run's token as a pre-shared key:
 *
 *     key = BLAKE2b-256(keyed with token,
 *                       "fiber record key v1" || kx key || client pk ||
 *                       server pk)
 *
 * This is the shape of Noise's NNpsk0: whoever lacks the token cannot
 * derive the keys, so cannot read a record nor make one the other end
 * accepts; the ephemeral keys give each connection fresh keys (forward
 * secrecy: a token stolen later does not open recorded traffic).  Nothing
 * is confirmed explicitly: the first record that opens proves the peer
 * holds the token, and a peer that does not is found out at its first
 * record.
 *
 * Records.  After the handshake every byte travels in records:
 *
 *     u32 n (little-endian) | ciphertext (n - 16 bytes) | 16-byte tag
 *
 * sealed with ChaCha20-Poly1305 (IETF) under the direction's key, the
 * nonce being the record's number in that direction (64 bits,
 * little-endian, then 4 zero bytes), and n authenticated as additional
 * data.  A record that is altered, cut, replayed, reordered or dropped
 * fails to open, and the stream fails for good (FIBER_EPROTO).  Records
 * do not follow frames: flush seals whatever `out` holds, many small
 * frames in one record or one large frame in many.  ChaCha20-Poly1305
 * rather than AES-GCM: it is constant-time in software on every CPU, so
 * no end depends on the other's hardware (and AES-GCM was not clearly
 * faster on the machines measured).
 *
 * Sizes.  A record carries at most RECORD_MAX plaintext bytes, and the
 * first record of each direction at most FIRST_MAX (one frame header plus
 * the 1 KiB that every fiber end accepts from a peer that has not yet
 * proved itself).  A receiver refuses a length above that as soon as the
 * 4 length bytes are in, before it stores the record, so a peer without
 * the token makes us hold at most HS_LEN + FIRST_MAX + 20 bytes: what the
 * unencrypted protocol allowed (1 KiB frames) plus the handshake.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "base/endian.h"
#include "net/conn_int.h"
#include "net/secure.h"

#define PK_LEN crypto_kx_PUBLICKEYBYTES
#define HS_LEN (FB_SEC_MAGIC_LEN + PK_LEN)
#define LEN_LEN 4u
#define TAG_LEN crypto_aead_chacha20poly1305_ietf_ABYTES
#define NONCE_LEN crypto_aead_chacha20poly1305_ietf_NPUBBYTES
#define FIRST_MAX (FB_WIRE_HDR_LEN + 1024u)
#define RECORD_MAX 16384u
#define SEAL_BATCH (256u * 1024u) /* plaintext sealed per send */
#define READ_CHUNK 65536u
#define KDF_LABEL "fiber record key v1"

enum { HS_WAIT, HS_DONE, HS_FAILED };

/* Threads: a child's conn is read by its main thread while its watchdog
 * may flush (under the child's write mutex).  Once the handshake is done,
 * reading touches only the rx_ fields, raw and c->in, and flushing only
 * the tx_ fields, wire, sealed and c->out; `state` no longer changes. */
struct fb_secure {
    int role;      /* FB_SEC_CLIENT or FB_SEC_SERVER */
    int state;     /* HS_*: the handshake */
    int rx_failed; /* a record failed: nothing more is read */
    uint8_t psk[FB_SEC_PSK_LEN];
    uint8_t pk[PK_LEN], sk[crypto_kx_SECRETKEYBYTES]; /* ephemeral */
    uint8_t rx_key[crypto_kx_SESSIONKEYBYTES];
    uint8_t tx_key[crypto_kx_SESSIONKEYBYTES];
    uint64_t rx_seq, tx_seq; /* records opened, records sealed */
    fiber_buf raw;           /* received; [raw_off, raw.len) not opened */
    size_t raw_off;
    fiber_buf wire;          /* sealed; [wire_off, wire.len) unsent */
    size_t wire_off;
    size_t sealed;           /* c->out up to here is in `wire` */
};

static void make_nonce(uint8_t n[NONCE_LEN], uint64_t seq)
{
    memset(n, 0, NONCE_LEN);
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)(seq >> (8 * i));
}

/* The handshake failed: says why.  Returns FIBER_EPROTO. */
static int fail_handshake(struct fb_conn_impl *c, const char *fmt, ...)
    FIBER_PRINTF(2, 3);
static int fail_handshake(struct fb_conn_impl *c, const char *fmt, ...)
{
    struct fb_secure *s = c->sec;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    s->state = HS_FAILED;
    sodium_memzero(s->sk, sizeof s->sk);
    sodium_memzero(s->psk, sizeof s->psk);
    return FIBER_EPROTO;
}

/* The incoming stream cannot be trusted any more: says why.  Returns
 * FIBER_EPROTO.  (The keys are wiped when the conn closes.) */
static int fail_record(struct fb_conn_impl *c, const char *fmt, ...)
    FIBER_PRINTF(2, 3);
static int fail_record(struct fb_conn_impl *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->sec->rx_failed = 1;
    return FIBER_EPROTO;
}

int fb_sec_failed(const struct fb_conn_impl *c)
{
    return c->sec->state == HS_FAILED || c->sec->rx_failed;
}

int fb_sec_needs_key(const struct fb_conn_impl *c)
{
    const struct fb_secure *s = c->sec;
    return s->state == HS_WAIT && s->wire_off == s->wire.len &&
           c->out_off < c->out.len;
}

int fb_sec_established(const struct fb_conn_impl *c)
{
    return c->sec->state == HS_DONE;
}

int fb_sec_unsent(const struct fb_conn_impl *c)
{
    return c->sec->wire_off < c->sec->wire.len;
}

void fb_sec_free(struct fb_secure *s)
{
    if (!s)
        return;
    fiber_buf_free(&s->raw);
    fiber_buf_free(&s->wire);
    sodium_memzero(s, sizeof *s);
    free(s);
}

/* ---- the handshake ------------------------------------------------------- */

int fb_conn_secure(struct fb_conn *conn, int role, const uint8_t *psk)
{
    struct fb_conn_impl *c = conn_impl(conn);
    if (c->sec)
        return fb_err(FIBER_ESTATE, "connection is already encrypted");
    if (c->in.len != c->in_off || c->out.len != c->out_off)
        return fb_err(FIBER_ESTATE, "encryption must start before the "
                                    "connection carries anything");
    struct fb_secure *s = calloc(1, sizeof *s);
    if (!s)
        return fb_err(FIBER_ENOMEM, "out of memory");
    s->role = role;
    memcpy(s->psk, psk, sizeof s->psk);
    crypto_kx_keypair(s->pk, s->sk);
    if (fiber_buf_append(&s->wire, FB_SEC_MAGIC, FB_SEC_MAGIC_LEN) != 0 ||
        fiber_buf_append(&s->wire, s->pk, sizeof s->pk) != 0) {
        fb_sec_free(s);
        return fb_err(FIBER_ENOMEM, "out of memory");
    }
    c->sec = s;
    c->out.len = c->out_off = 0;
    /* Our key goes out now; a failure shows at the next read or flush. */
    fb_sec_flush(c);
    return 0;
}

/* One directional key: the crypto_kx key bound to the token and to both
 * public keys. */
static void mix_key(uint8_t out[crypto_kx_SESSIONKEYBYTES],
                    const uint8_t *psk, const uint8_t *kx_key,
                    const uint8_t *client_pk, const uint8_t *server_pk)
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, psk, FB_SEC_PSK_LEN,
                            crypto_kx_SESSIONKEYBYTES);
    crypto_generichash_update(&st, (const uint8_t *)KDF_LABEL,
                              sizeof KDF_LABEL - 1);
    crypto_generichash_update(&st, kx_key, crypto_kx_SESSIONKEYBYTES);
    crypto_generichash_update(&st, client_pk, PK_LEN);
    crypto_generichash_update(&st, server_pk, PK_LEN);
    crypto_generichash_final(&st, out, crypto_kx_SESSIONKEYBYTES);
    sodium_memzero(&st, sizeof st);
}

static int derive_keys(struct fb_conn_impl *c, const uint8_t *peer_pk)
{
    struct fb_secure *s = c->sec;
    uint8_t rx[crypto_kx_SESSIONKEYBYTES], tx[crypto_kx_SESSIONKEYBYTES];
    int bad;
    const uint8_t *client_pk, *server_pk;
    if (s->role == FB_SEC_SERVER) {
        bad = crypto_kx_server_session_keys(rx, tx, s->pk, s->sk, peer_pk);
        client_pk = peer_pk;
        server_pk = s->pk;
    } else {
        bad = crypto_kx_client_session_keys(rx, tx, s->pk, s->sk, peer_pk);
        client_pk = s->pk;
        server_pk = peer_pk;
    }
    if (bad == 0) {
        mix_key(s->rx_key, s->psk, rx, client_pk, server_pk);
        mix_key(s->tx_key, s->psk, tx, client_pk, server_pk);
    }
    sodium_memzero(rx, sizeof rx);
    sodium_memzero(tx, sizeof tx);
    sodium_memzero(s->sk, sizeof s->sk);
    sodium_memzero(s->psk, sizeof s->psk);
    if (bad)
        return fail_handshake(c, "encryption handshake failed: the peer "
                                 "sent an unusable public key");
    s->state = HS_DONE;
    return 0;
}

/* Checks the peer's handshake as its bytes arrive, and derives the keys
 * once it is whole.  0 (done or not yet) or FIBER_EPROTO. */
static int take_handshake(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    const uint8_t *p = s->raw.data + s->raw_off;
    size_t have = s->raw.len - s->raw_off;
    if (have == 0)
        return 0;
    size_t k = have < FB_SEC_MAGIC_LEN ? have : FB_SEC_MAGIC_LEN;
    if (k >= 2 && p[0] == (FB_WIRE_MAGIC & 0xff) &&
        p[1] == (FB_WIRE_MAGIC >> 8))
        return fail_handshake(c, "the peer sent an unencrypted fiber frame: "
                                 "it has encryption off and this end has it "
                                 "on (every process of a run must use the "
                                 "same setting)");
    if (memcmp(p, FB_SEC_MAGIC, k) != 0)
        return fail_handshake(c, "the peer did not open fiber's encrypted "
                                 "handshake (its first bytes are "
                                 "0x%02x%02x%02x%02x...)",
                              p[0], k > 1 ? p[1] : 0, k > 2 ? p[2] : 0,
                              k > 3 ? p[3] : 0);
    if (have < HS_LEN)
        return 0;
    int rc = derive_keys(c, p + FB_SEC_MAGIC_LEN);
    s->raw_off += HS_LEN;
    return rc;
}

/* ---- receiving ----------------------------------------------------------- */

/* Says the peer went; during the handshake, what that usually means. */
static int peer_gone(struct fb_conn_impl *c, const char *what, int err)
{
    if (c->sec->state == HS_DONE)
        snprintf(c->err, sizeof c->err, "%s", what);
    else
        snprintf(c->err, sizeof c->err,
                 "%s during the encryption handshake (does it have "
                 "encryption on, and the run's token?)", what);
    errno = err;
    return FIBER_ECLOSED;
}

/* One recv of at most max bytes into raw.  0 (maybe nothing read),
 * FIBER_ECLOSED or FIBER_ESYS; errno is kept for the caller. */
static int recv_raw(struct fb_conn_impl *c, size_t max)
{
    struct fb_secure *s = c->sec;
    if (s->raw_off > 0 && s->raw.cap - s->raw.len < max) {
        size_t rest = s->raw.len - s->raw_off;
        memmove(s->raw.data, s->raw.data + s->raw_off, rest);
        s->raw.len = rest;
        s->raw_off = 0;
    }
    if (fiber_buf_reserve(&s->raw, max) != 0) {
        snprintf(c->err, sizeof c->err, "out of memory");
        return FIBER_ENOMEM;
    }
    for (;;) {
        ssize_t n = recv(c->fd, s->raw.data + s->raw.len, max, 0);
        if (n > 0) {
            s->raw.len += (size_t)n;
            return 0;
        }
        int err = errno;
        if (n == 0)
            return peer_gone(c, "peer closed the connection", 0);
        if (err == EAGAIN || err == EWOULDBLOCK)
            return 0;
        if (err == EINTR)
            continue;
        if (err == ECONNRESET || err == EPIPE)
            return peer_gone(c, "connection reset by peer", err);
        snprintf(c->err, sizeof c->err, "recv: %s", strerror(err));
        errno = err;
        return FIBER_ESYS;
    }
}

/* Opens every whole record in raw into c->in.  0 or FIBER_EPROTO /
 * FIBER_ENOMEM. */
static int open_records(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    if (s->state == HS_WAIT) {
        int rc = take_handshake(c);
        if (rc || s->state != HS_DONE)
            return rc;
    }
    for (;;) {
        const uint8_t *r = s->raw.data + s->raw_off;
        size_t have = s->raw.len - s->raw_off;
        if (have < LEN_LEN)
            return 0;
        uint32_t n = fb_get_le32(r);
        size_t limit = (s->rx_seq == 0 ? FIRST_MAX : RECORD_MAX) + TAG_LEN;
        if (n < TAG_LEN || n > limit)
            return fail_record(c, "encrypted record of %u bytes is outside "
                                  "the limits (%u to %zu)",
                               n, (unsigned)TAG_LEN, limit);
        if (have - LEN_LEN < n)
            return 0;
        size_t plain = n - TAG_LEN;
        if (fiber_buf_reserve(&c->in, plain) != 0) {
            snprintf(c->err, sizeof c->err, "out of memory");
            return FIBER_ENOMEM;
        }
        uint8_t nonce[NONCE_LEN];
        make_nonce(nonce, s->rx_seq);
        if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                c->in.data + c->in.len, NULL, r + LEN_LEN, plain,
                r + LEN_LEN + plain, r, LEN_LEN, nonce, s->rx_key) != 0)
            return fail_record(c, "decryption failed: the peer does not "
                                  "hold the run's key, or the stream was "
                                  "altered, replayed or reordered");
        s->rx_seq++;
        c->in.len += plain;
        s->raw_off += LEN_LEN + n;
    }
}

int fb_sec_read(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    if (fb_sec_failed(c))
        return FIBER_EPROTO;
    /* Until the peer's first record has opened, take no more than the
     * handshake and that record may fill: the memory a stranger costs. */
    size_t max = READ_CHUNK;
    if (s->rx_seq == 0) {
        size_t have = s->raw.len - s->raw_off;
        size_t first = (s->state == HS_DONE ? 0 : HS_LEN) + LEN_LEN +
                       FIRST_MAX + TAG_LEN;
        max = first > have ? first - have : 1;
    }
    int rc = recv_raw(c, max);
    if (rc == FIBER_ENOMEM || rc == FIBER_ESYS)
        return rc;
    /* What arrived before an end of stream still counts. */
    int orc = open_records(c);
    return orc ? orc : rc;
}

/* ---- sending ------------------------------------------------------------- */

/* Writes sealed bytes.  0 when all are sent, 1 when the socket is full,
 * FIBER_ECLOSED or FIBER_ESYS (errno kept). */
static int send_wire(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    while (s->wire_off < s->wire.len) {
        ssize_t n = send(c->fd, s->wire.data + s->wire_off,
                         s->wire.len - s->wire_off, MSG_NOSIGNAL);
        if (n > 0) {
            s->wire_off += (size_t)n;
            continue;
        }
        int err = errno;
        if (n < 0 && err == EINTR)
            continue;
        if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK))
            return 1;
        if (n < 0 && (err == EPIPE || err == ECONNRESET))
            return peer_gone(c, "peer closed the connection", err);
        snprintf(c->err, sizeof c->err, "send: %s", strerror(err));
        errno = err;
        return FIBER_ESYS;
    }
    s->wire.len = s->wire_off = 0;
    c->out_off = s->sealed; /* frames wholly sent */
    return 0;
}

static size_t record_cap(const struct fb_secure *s)
{
    return s->tx_seq == 0 ? FIRST_MAX : RECORD_MAX;
}

/* Seals p[0, n) (n <= record_cap) as one record at rec, which has room for
 * LEN_LEN + n + TAG_LEN bytes; p may be rec + LEN_LEN (in place). */
static void seal_record(struct fb_secure *s, uint8_t *rec, const uint8_t *p,
                        size_t n)
{
    uint8_t nonce[NONCE_LEN];
    fb_put_le32(rec, (uint32_t)(n + TAG_LEN));
    make_nonce(nonce, s->tx_seq++);
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        rec + LEN_LEN, rec + LEN_LEN + n, NULL, p, n, rec, LEN_LEN, NULL,
        nonce, s->tx_key);
}

/* Seals up to SEAL_BATCH bytes of c->out beyond `sealed` into wire. */
static int seal_out(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    size_t budget = SEAL_BATCH;
    while (s->sealed < c->out.len && budget > 0) {
        size_t n = c->out.len - s->sealed;
        if (n > record_cap(s))
            n = record_cap(s);
        if (fiber_buf_reserve(&s->wire, LEN_LEN + n + TAG_LEN) != 0) {
            snprintf(c->err, sizeof c->err, "out of memory");
            return FIBER_ENOMEM;
        }
        seal_record(s, s->wire.data + s->wire.len, c->out.data + s->sealed,
                    n);
        s->wire.len += LEN_LEN + n + TAG_LEN;
        s->sealed += n;
        budget -= n < budget ? n : budget;
    }
    return 0;
}

/* Reads the peer's handshake, and nothing beyond it (records stay in the
 * socket, where the caller's poll sees them).  0 or a code. */
static int pump_handshake(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    size_t have = s->raw.len - s->raw_off;
    if (have < HS_LEN) {
        int rc = recv_raw(c, HS_LEN - have);
        int hrc = take_handshake(c);
        return hrc ? hrc : rc;
    }
    return take_handshake(c);
}

int fb_sec_flush(struct fb_conn_impl *c)
{
    struct fb_secure *s = c->sec;
    if (s->state == HS_FAILED)
        return FIBER_EPROTO;
    for (;;) {
        int rc = send_wire(c);
        if (rc == 1)
            fb_conn_compact_output(c, &s->sealed);
        if (rc)
            return rc;
        if (c->out_off == c->out.len) {
            c->out.len = c->out_off = s->sealed = 0;
            c->out_moved = 0;
            return 0;
        }
        if (s->state == HS_WAIT) {
            rc = pump_handshake(c);
            if (rc)
                return rc;
            if (s->state != HS_DONE)
                return 1; /* wait for POLLIN: fb_conn_wait_events */
        }
        rc = seal_out(c);
        if (rc)
            return rc;
    }
}

static int errno_of(int rc)
{
    switch (rc) {
    case FIBER_ECLOSED:
        return errno == ECONNRESET ? ECONNRESET : EPIPE;
    case FIBER_EPROTO:
        return EPROTO;
    case FIBER_ENOMEM:
        return ENOMEM;
    default:
        return errno ? errno : EIO;
    }
}

ssize_t fb_sec_sendv(struct fb_conn_impl *c, const struct iovec *iov,
                     int iovcnt)
{
    struct fb_secure *s = c->sec;
    int rc = fb_sec_flush(c);
    if (rc == 0 && s->state != HS_DONE)
        rc = pump_handshake(c);
    if (rc == 0 && s->state != HS_DONE)
        rc = 1;
    if (rc) {
        errno = rc == 1 ? EAGAIN : errno_of(rc);
        return -1;
    }
    size_t taken = 0;
    int i = 0;
    size_t off = 0; /* into iov[i] */
    while (taken < SEAL_BATCH) {
        while (i < iovcnt && off == iov[i].iov_len) {
            i++;
            off = 0;
        }
        if (i == iovcnt)
            break;
        size_t n = record_cap(s);
        if (n > SEAL_BATCH - taken)
            n = SEAL_BATCH - taken;
        if (fiber_buf_reserve(&s->wire, LEN_LEN + n + TAG_LEN) != 0) {
            if (taken)
                break;
            errno = ENOMEM;
            return -1;
        }
        /* Gather up to n bytes behind the length, then seal in place. */
        uint8_t *rec = s->wire.data + s->wire.len;
        size_t got = 0;
        while (got < n && i < iovcnt) {
            size_t k = iov[i].iov_len - off;
            if (k > n - got)
                k = n - got;
            memcpy(rec + LEN_LEN + got, (const uint8_t *)iov[i].iov_base + off,
                   k);
            got += k;
            off += k;
            if (off == iov[i].iov_len) {
                i++;
                off = 0;
            }
        }
        seal_record(s, rec, rec + LEN_LEN, got);
        s->wire.len += LEN_LEN + got + TAG_LEN;
        taken += got;
    }
    if (taken == 0)
        return 0;
    rc = send_wire(c);
    if (rc < 0) {
        errno = errno_of(rc);
        return -1;
    }
    return (ssize_t)taken;
}

/* ---- the fatal-signal path ----------------------------------------------- */

/* Seals p[0, n) in place, record by record, and writes each. */
static void seal_write_in_place(struct fb_conn_impl *c, uint8_t *p, size_t n,
                                void (*write_all)(int, const uint8_t *,
                                                  size_t))
{
    struct fb_secure *s = c->sec;
    while (n > 0) {
        size_t k = n < record_cap(s) ? n : record_cap(s);
        uint8_t len[LEN_LEN], tag[TAG_LEN], nonce[NONCE_LEN];
        fb_put_le32(len, (uint32_t)(k + TAG_LEN));
        make_nonce(nonce, s->tx_seq++);
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(
            p, tag, NULL, p, k, len, LEN_LEN, NULL, nonce, s->tx_key);
        write_all(c->fd, len, sizeof len);
        write_all(c->fd, p, k);
        write_all(c->fd, tag, sizeof tag);
        p += k;
        n -= k;
    }
}

void fb_sec_write_now(struct fb_conn_impl *c, uint8_t *data, size_t len,
                      void (*write_all)(int fd, const uint8_t *p, size_t n))
{
    struct fb_secure *s = c->sec;
    if (s->state != HS_DONE)
        return;
    write_all(c->fd, s->wire.data + s->wire_off, s->wire.len - s->wire_off);
    s->wire_off = s->wire.len;
    c->out_off = s->sealed;
    seal_write_in_place(c, c->out.data + c->out_off, c->out.len - c->out_off,
                        write_all);
    c->out_off = s->sealed = c->out.len;
    seal_write_in_place(c, data, len, write_all);
}

int fb_conn_handshake_done(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return !c->sec || fb_sec_established(c);
}

int fb_conn_stream_failed(const struct fb_conn *conn)
{
    const struct fb_conn_impl *c = conn_cimpl(conn);
    return c->sec && fb_sec_failed(c);
}

/* ---- where encryption applies -------------------------------------------- */

int fb_net_encrypts(const char *addr)
{
    return addr && strncmp(addr, "tcp:", 4) == 0 &&
           fb_net_config()->encryption;
}

int fb_conn_secure_for(struct fb_conn *c, const char *addr, int role,
                       const uint8_t *psk)
{
    return fb_net_encrypts(addr) ? fb_conn_secure(c, role, psk) : 0;
}
