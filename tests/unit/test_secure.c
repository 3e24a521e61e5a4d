/*
 * test_secure.c -- encrypted TCP (net/secure.c): the handshake, records
 * that are tampered with, replayed, reordered or oversized, peers without
 * the run's key or without encryption; the pool, queues and rings over
 * encrypted TCP; and a master that keeps serving while hundreds of
 * hostile connections beat on its port.
 *
 * The conn-level cases run both ends in one thread over a socketpair,
 * sometimes with the test in the middle (a relay) reading and rewriting
 * the raw bytes, as an attacker on the network would.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "runtime/runtime.h"
#include "harness.h"
#include "net/net.h"
#include "wire/wire.h"

#define MAX_FRAME (8u << 20)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void socket_pair(int sv[2])
{
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                     sv) == 0);
}

static void random_key(uint8_t key[FB_SEC_PSK_LEN])
{
    randombytes_buf(key, FB_SEC_PSK_LEN);
}

/* Two conns over a socketpair, a the dialer and b the acceptor, each
 * encrypted with its key (NULL: plaintext). */
static void conn_pair(struct fb_conn *a, struct fb_conn *b,
                      const uint8_t *key_a, const uint8_t *key_b)
{
    int sv[2];
    socket_pair(sv);
    fb_conn_init(a, sv[0], MAX_FRAME);
    fb_conn_init(b, sv[1], MAX_FRAME);
    if (key_a)
        CHECK_OK(fb_conn_secure(a, FB_SEC_CLIENT, key_a));
    if (key_b)
        CHECK_OK(fb_conn_secure(b, FB_SEC_SERVER, key_b));
}

/* Re-encodes a received frame, to compare with what was sent. */
static void append_frame(fiber_buf *got, const struct fb_wire_hdr *h,
                         const uint8_t *payload)
{
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, h);
    CHECK_OK(fiber_buf_append(got, hdr, sizeof hdr));
    CHECK_OK(fiber_buf_append(got, payload, h->len));
}

/* Flushes `from` and reads `to` until `to` has produced want bytes of
 * frames (collected in got) or 10 s pass. */
static void transfer(struct fb_conn *from, struct fb_conn *to, fiber_buf *got,
                     size_t want)
{
    uint64_t deadline = fb_deadline_ms(10000);
    while (got->len < want) {
        CHECK(fb_ms_left(deadline) > 0);
        CHECK(fb_conn_flush(from) >= 0);
        CHECK(fb_conn_flush(to) >= 0); /* the handshake goes both ways */
        CHECK(fb_conn_read(from) >= 0);
        int rc = fb_conn_read(to);
        if (rc != 0)
            TH_FAIL("read: %s: %s", fiber_errname(rc), fb_conn_err(to));
        struct fb_wire_hdr h;
        const uint8_t *p;
        int got_one;
        while ((got_one = fb_conn_next(to, &h, &p)) == 1)
            append_frame(got, &h, p);
        if (got_one < 0)
            TH_FAIL("next: %s", fb_conn_err(to));
    }
    CHECK_EQ(got->len, want);
}

/* Frames of many sizes: small PINGs, an OCALL of `big` random bytes. */
static void put_frames(fiber_buf *out, size_t big, const char *marker)
{
    for (uint64_t i = 0; i < 40; i++)
        CHECK_OK(fb_wire_put_ping(out, i));
    uint8_t *blob = malloc(big);
    randombytes_buf(blob, big);
    if (marker)
        memcpy(blob + big / 2, marker, strlen(marker));
    fiber_iov item = {blob, big};
    CHECK_OK(fb_wire_put_ocall(out, 7, 17, 1, -1, &item, 1));
    free(blob);
    for (uint64_t i = 0; i < 40; i++)
        CHECK_OK(fb_wire_put_pong(out, i));
}

TEST(handshake_and_frames_round_trip)
{
    uint8_t key[FB_SEC_PSK_LEN];
    random_key(key);
    struct fb_conn a, b;
    conn_pair(&a, &b, key, key);
    /* Both ways, several times, so that records keep counting. */
    for (int round = 0; round < 3; round++) {
        fiber_buf got = {0};
        put_frames(fb_conn_out(&a), (size_t)(3u << 20) + (size_t)round * 777,
                   NULL);
        fiber_buf want = {0};
        CHECK_OK(fiber_buf_append(&want, fb_conn_out(&a)->data,
                                  fb_conn_out(&a)->len));
        transfer(&a, &b, &got, want.len);
        CHECK(memcmp(got.data, want.data, want.len) == 0);
        fiber_buf_free(&got);
        fiber_buf_free(&want);
        put_frames(fb_conn_out(&b), 1000 + (size_t)round, NULL);
        CHECK_OK(fiber_buf_append(&want, fb_conn_out(&b)->data,
                                  fb_conn_out(&b)->len));
        transfer(&b, &a, &got, want.len);
        CHECK(memcmp(got.data, want.data, want.len) == 0);
        fiber_buf_free(&got);
        fiber_buf_free(&want);
    }
    CHECK_EQ(fb_conn_pending(&a), 0);
    CHECK_EQ(fb_conn_pending(&b), 0);
    fb_conn_close(&a);
    fb_conn_close(&b);
}

/* ---- the test in the middle ---------------------------------------------- */

/* a (dialer) <-> [m_a | m_b] <-> b (acceptor): the test moves the bytes
 * between m_a and m_b itself. */
struct relay {
    struct fb_conn a, b;
    int m_a, m_b;
};

static void relay_open(struct relay *r, const uint8_t *key_a,
                       const uint8_t *key_b)
{
    int s1[2], s2[2];
    socket_pair(s1);
    socket_pair(s2);
    fb_conn_init(&r->a, s1[0], MAX_FRAME);
    fb_conn_init(&r->b, s2[0], MAX_FRAME);
    r->m_a = s1[1];
    r->m_b = s2[1];
    if (key_a)
        CHECK_OK(fb_conn_secure(&r->a, FB_SEC_CLIENT, key_a));
    if (key_b)
        CHECK_OK(fb_conn_secure(&r->b, FB_SEC_SERVER, key_b));
}

static void relay_close(struct relay *r)
{
    fb_conn_close(&r->a);
    fb_conn_close(&r->b);
    close(r->m_a);
    close(r->m_b);
}

/* Reads everything waiting on fd (within 200 ms of the first byte). */
static void drain(int fd, fiber_buf *into)
{
    uint64_t deadline = fb_deadline_ms(2000);
    for (;;) {
        uint8_t buf[65536];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            CHECK_OK(fiber_buf_append(into, buf, (size_t)n));
            deadline = fb_deadline_ms(200);
            continue;
        }
        if (n == 0 || fb_ms_left(deadline) == 0)
            return;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, fb_ms_left(deadline));
        if (!(p.revents & POLLIN) && into->len)
            return;
    }
}

static void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *q = p;
    while (n > 0) {
        ssize_t k = send(fd, q, n, MSG_NOSIGNAL);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
            continue;
        }
        CHECK(k > 0);
        q += k;
        n -= (size_t)k;
    }
}

/* Passes both handshakes through unchanged. */
static void relay_handshakes(struct relay *r)
{
    fiber_buf hs = {0};
    drain(r->m_a, &hs);
    CHECK_EQ(hs.len, 36);
    send_all(r->m_b, hs.data, hs.len);
    hs.len = 0;
    drain(r->m_b, &hs);
    CHECK_EQ(hs.len, 36);
    send_all(r->m_a, hs.data, hs.len);
    fiber_buf_free(&hs);
}

/* a seals one PING per id as one record each; returns the records as they
 * left a, in order, in recs (offsets in offs[0..n]). */
static void seal_pings(struct relay *r, int n, fiber_buf *recs, size_t *offs)
{
    offs[0] = 0;
    for (int i = 0; i < n; i++) {
        CHECK_OK(fb_wire_put_ping(fb_conn_out(&r->a), (uint64_t)i + 1));
        CHECK_OK(fb_conn_flush_wait(&r->a, fb_deadline_ms(5000)));
        drain(r->m_a, recs);
        offs[i + 1] = recs->len;
    }
}

/* Feeds bytes to b and reads; returns b's fb_conn_read/next verdict:
 * the ids of the PINGs it took (in ids, count in *n) and its error code. */
static int feed_b(struct relay *r, const void *p, size_t len, uint64_t *ids,
                  int *n)
{
    send_all(r->m_b, p, len);
    sleep_ms(20);
    int rc = fb_conn_read(&r->b);
    struct fb_wire_hdr h;
    const uint8_t *payload;
    int got;
    while ((got = fb_conn_next(&r->b, &h, &payload)) == 1)
        ids[(*n)++] = h.id;
    return rc ? rc : got;
}

TEST(wire_bytes_are_not_plaintext)
{
    static const char marker[] = "FIBER-SECRET-MARKER-0123456789";
    for (int encrypted = 1; encrypted >= 0; encrypted--) {
        uint8_t key[FB_SEC_PSK_LEN];
        random_key(key);
        struct relay r;
        relay_open(&r, encrypted ? key : NULL, encrypted ? key : NULL);
        if (encrypted)
            relay_handshakes(&r);
        put_frames(fb_conn_out(&r.a), 5000, marker);
        fiber_buf want = {0}, wire = {0}, got = {0};
        CHECK_OK(fiber_buf_append(&want, fb_conn_out(&r.a)->data,
                                  fb_conn_out(&r.a)->len));
        CHECK_OK(fb_conn_flush_wait(&r.a, fb_deadline_ms(5000)));
        drain(r.m_a, &wire);
        int seen = memmem(wire.data, wire.len, marker, strlen(marker)) != NULL;
        CHECK_EQ(seen, !encrypted); /* the control run sees it */
        send_all(r.m_b, wire.data, wire.len);
        transfer(&r.a, &r.b, &got, want.len);
        CHECK(memcmp(got.data, want.data, want.len) == 0);
        fiber_buf_free(&want);
        fiber_buf_free(&wire);
        fiber_buf_free(&got);
        relay_close(&r);
    }
}

TEST(a_tampered_byte_fails_the_stream)
{
    uint8_t key[FB_SEC_PSK_LEN];
    random_key(key);
    struct relay r;
    relay_open(&r, key, key);
    relay_handshakes(&r);
    fiber_buf recs = {0};
    size_t offs[3];
    seal_pings(&r, 2, &recs, offs);
    uint64_t ids[4];
    int n = 0;
    CHECK_EQ(feed_b(&r, recs.data, offs[1], ids, &n), 0); /* intact */
    CHECK_EQ(n, 1);
    recs.data[offs[1] + 9] ^= 0x20; /* one bit of the second record */
    CHECK_ERR(feed_b(&r, recs.data + offs[1], offs[2] - offs[1], ids, &n),
              FIBER_EPROTO);
    CHECK_EQ(n, 1);
    CHECK_CONTAINS(fb_conn_err(&r.b), "decryption failed");
    /* The stream stays failed. */
    struct fb_wire_hdr h;
    const uint8_t *p;
    CHECK_ERR(fb_conn_next(&r.b, &h, &p), FIBER_EPROTO);
    CHECK_ERR(fb_conn_read(&r.b), FIBER_EPROTO);
    fiber_buf_free(&recs);
    relay_close(&r);
}

TEST(replayed_reordered_or_dropped_records_fail)
{
    for (int attack = 0; attack < 3; attack++) {
        uint8_t key[FB_SEC_PSK_LEN];
        random_key(key);
        struct relay r;
        relay_open(&r, key, key);
        relay_handshakes(&r);
        fiber_buf recs = {0};
        size_t offs[4];
        seal_pings(&r, 3, &recs, offs);
        uint64_t ids[8];
        int n = 0;
        const uint8_t *rec1 = recs.data, *rec2 = recs.data + offs[1],
                      *rec3 = recs.data + offs[2];
        size_t len1 = offs[1], len2 = offs[2] - offs[1],
               len3 = offs[3] - offs[2];
        CHECK_EQ(feed_b(&r, rec1, len1, ids, &n), 0);
        int rc;
        if (attack == 0) /* replay record 1 */
            rc = feed_b(&r, rec1, len1, ids, &n);
        else if (attack == 1) /* record 3 before record 2 */
            rc = feed_b(&r, rec3, len3, ids, &n);
        else { /* record 2 dropped, and record 3 comes */
            (void)rec2;
            (void)len2;
            rc = feed_b(&r, rec3, len3, ids, &n);
        }
        CHECK_ERR(rc, FIBER_EPROTO);
        CHECK_CONTAINS(fb_conn_err(&r.b), "decryption failed");
        CHECK_EQ(n, 1);
        CHECK_EQ(ids[0], 1);
        fiber_buf_free(&recs);
        relay_close(&r);
    }
}

TEST(a_peer_with_another_token_fails_cleanly)
{
    uint8_t key_a[FB_SEC_PSK_LEN], key_b[FB_SEC_PSK_LEN];
    random_key(key_a);
    random_key(key_b);
    struct fb_conn a, b;
    conn_pair(&a, &b, key_a, key_b);
    CHECK_OK(fb_wire_put_ping(fb_conn_out(&a), 1));
    CHECK_OK(fb_conn_flush(&b));
    CHECK_OK(fb_conn_flush_wait(&a, fb_deadline_ms(5000)));
    sleep_ms(20);
    CHECK_ERR(fb_conn_read(&b), FIBER_EPROTO);
    CHECK_CONTAINS(fb_conn_err(&b), "does not hold the run's key");
    struct fb_wire_hdr h;
    const uint8_t *p;
    CHECK_ERR(fb_conn_next(&b, &h, &p), FIBER_EPROTO);
    /* b drops the connection; a sees its end, it does not hang. */
    fb_conn_close(&b);
    CHECK_ERR(fb_conn_recv_wait(&a, &h, &p, fb_deadline_ms(5000)),
              FIBER_ECLOSED);
    fb_conn_close(&a);
}

TEST(plaintext_and_encrypted_ends_say_what_is_wrong)
{
    uint8_t key[FB_SEC_PSK_LEN];
    random_key(key);
    struct fb_conn a, b;
    conn_pair(&a, &b, NULL, key); /* a plaintext dialer, an encrypted server */
    CHECK_OK(fb_wire_put_ping(fb_conn_out(&a), 1));
    CHECK_OK(fb_conn_flush(&a));
    sleep_ms(20);
    CHECK_ERR(fb_conn_read(&b), FIBER_EPROTO);
    CHECK_CONTAINS(fb_conn_err(&b), "unencrypted fiber frame");
    struct fb_wire_hdr h;
    const uint8_t *p;
    CHECK_ERR(fb_conn_recv_wait(&a, &h, &p, fb_deadline_ms(5000)),
              FIBER_EPROTO);
    CHECK_CONTAINS(fb_conn_err(&a), "the peer encrypts its traffic");
    fb_conn_close(&a);
    fb_conn_close(&b);
    /* An encrypted dialer whose peer says nothing and closes. */
    conn_pair(&a, &b, key, NULL);
    CHECK_OK(fb_wire_put_ping(fb_conn_out(&a), 1));
    fb_conn_close(&b);
    CHECK_ERR(fb_conn_flush_wait(&a, fb_deadline_ms(5000)), FIBER_ECLOSED);
    CHECK_CONTAINS(fb_conn_err(&a), "during the encryption handshake");
    fb_conn_close(&a);
}

static long vm_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL);
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            v = atol(line + n + 1);
    fclose(f);
    CHECK(v >= 0);
    return v;
}

/* The handshake a stranger can always make: the magic and some key. */
static void fake_handshake(uint8_t hs[36])
{
    uint8_t sk[crypto_kx_SECRETKEYBYTES];
    memcpy(hs, "FBX1", 4);
    crypto_kx_keypair(hs + 4, sk);
}

TEST(record_length_claims_are_checked_before_anything_is_stored)
{
    uint8_t key[FB_SEC_PSK_LEN];
    random_key(key);
    /* 1 GiB: refused as soon as its 4 length bytes are in. */
    int sv[2];
    socket_pair(sv);
    struct fb_conn b;
    fb_conn_init(&b, sv[1], MAX_FRAME);
    CHECK_OK(fb_conn_secure(&b, FB_SEC_SERVER, key));
    uint8_t msg[40];
    fake_handshake(msg);
    uint32_t huge = 1u << 30;
    memcpy(msg + 36, &huge, 4); /* little-endian host */
    send_all(sv[0], msg, sizeof msg);
    long vm0 = vm_kib("VmSize");
    CHECK_ERR(fb_conn_read(&b), FIBER_EPROTO);
    long vm1 = vm_kib("VmSize");
    CHECK_CONTAINS(fb_conn_err(&b), "1073741824 bytes is outside the limits");
    CHECK(vm1 - vm0 < 64 * 1024); /* no 1 GiB buffer was reserved */
    CHECK(fb_conn_in_capacity(&b) <= 65536);
    fb_conn_close(&b);
    close(sv[0]);
    /* A first record may carry a HELLO, no more: 1 KiB and a header. */
    socket_pair(sv);
    fb_conn_init(&b, sv[1], MAX_FRAME);
    CHECK_OK(fb_conn_secure(&b, FB_SEC_SERVER, key));
    uint32_t over = FB_WIRE_HDR_LEN + 1024 + 16 + 1;
    memcpy(msg + 36, &over, 4);
    send_all(sv[0], msg, sizeof msg);
    CHECK_ERR(fb_conn_read(&b), FIBER_EPROTO);
    CHECK_CONTAINS(fb_conn_err(&b), "outside the limits");
    fb_conn_close(&b);
    close(sv[0]);
}

TEST(byte_streams_round_trip)
{
    /* The ring's links: fb_conn_sendv and fb_conn_recv_bytes, both ways
     * of a pair, encrypted and not. */
    for (int encrypted = 1; encrypted >= 0; encrypted--) {
        uint8_t key[FB_SEC_PSK_LEN];
        random_key(key);
        struct fb_conn a, b;
        conn_pair(&a, &b, encrypted ? key : NULL, encrypted ? key : NULL);
        /* HELLOs first, as the ring does. */
        CHECK_OK(fb_wire_put_ping(fb_conn_out(&a), 1));
        CHECK_OK(fb_wire_put_ping(fb_conn_out(&b), 2));
        fiber_buf got = {0};
        transfer(&a, &b, &got, FB_WIRE_HDR_LEN);
        got.len = 0;
        transfer(&b, &a, &got, FB_WIRE_HDR_LEN);
        fiber_buf_free(&got);
        size_t total = (5u << 20) + 13;
        uint8_t *src = malloc(total), *dst = malloc(total);
        randombytes_buf(src, total);
        size_t sent = 0, recvd = 0;
        uint64_t deadline = fb_deadline_ms(20000);
        while (recvd < total) {
            CHECK(fb_ms_left(deadline) > 0);
            if (sent < total) {
                size_t k = total - sent < 300000 ? total - sent : 300000;
                struct iovec iov[2] = {{src + sent, k / 2},
                                       {src + sent + k / 2, k - k / 2}};
                ssize_t n = fb_conn_sendv(&a, iov, 2);
                CHECK(n > 0 || errno == EAGAIN);
                if (n > 0)
                    sent += (size_t)n;
            } else {
                CHECK(fb_conn_flush(&a) >= 0);
            }
            ssize_t n = fb_conn_recv_bytes(&b, dst + recvd, total - recvd);
            CHECK(n > 0 || (n < 0 && errno == EAGAIN));
            if (n > 0)
                recvd += (size_t)n;
        }
        CHECK(memcmp(src, dst, total) == 0);
        CHECK_EQ(fb_conn_pending(&a), 0);
        fb_conn_close(&a);
        CHECK_EQ(fb_conn_recv_bytes(&b, dst, 10), 0); /* end of stream */
        fb_conn_close(&b);
        free(src);
        free(dst);
    }
}

TEST(write_now_sends_queued_output_then_more_frames)
{
    /* What a pool worker's fatal-signal handler does. */
    uint8_t key[FB_SEC_PSK_LEN];
    random_key(key);
    struct fb_conn a, b;
    conn_pair(&a, &b, key, key);
    fiber_buf got = {0}, want = {0}, extra = {0};
    /* The handshake is done by a PING. */
    CHECK_OK(fb_wire_put_ping(fb_conn_out(&a), 1));
    transfer(&a, &b, &got, FB_WIRE_HDR_LEN);
    got.len = 0;
    put_frames(fb_conn_out(&a), 70000, NULL); /* queued, never flushed */
    CHECK_OK(fiber_buf_append(&want, fb_conn_out(&a)->data,
                                  fb_conn_out(&a)->len));
    put_frames(&extra, 100, NULL);
    CHECK_OK(fiber_buf_append(&want, extra.data, extra.len));
    fb_conn_write_now(&a, extra.data, extra.len);
    transfer(&a, &b, &got, want.len);
    CHECK(memcmp(got.data, want.data, want.len) == 0);
    fiber_buf_free(&got);
    fiber_buf_free(&want);
    fiber_buf_free(&extra);
    fb_conn_close(&a);
    fb_conn_close(&b);
}

/* A plaintext conn whose socket never takes all of its output (a pool
 * refilling a busy worker with large tasks) drops the sent head of its
 * buffer instead of growing it by every byte sent, keeps every byte in
 * order, and still says that a frame may be half sent. */
TEST(a_conn_that_never_drains_reuses_its_output_buffer)
{
    int sv[2];
    socket_pair(sv);
    struct fb_conn a;
    fb_conn_init(&a, sv[0], MAX_FRAME);
    enum { STEP = 64 << 10, STEPS = 400 };
    uint8_t *chunk = malloc(STEP), *rx = malloc(4 << 20);
    fiber_buf want = {0}, got = {0};
    uint64_t seq = 0;
    /* A backlog of 1 MiB, then STEP bytes in and STEP bytes out a step. */
    for (int i = -16; i < STEPS; i++) {
        for (size_t k = 0; k < STEP; k++)
            chunk[k] = (uint8_t)(seq++ * 2654435761u >> 24);
        CHECK_OK(fiber_buf_append(fb_conn_out(&a), chunk, STEP));
        CHECK_OK(fiber_buf_append(&want, chunk, STEP));
        if (i < 0)
            continue;
        CHECK_EQ(fb_conn_flush(&a), 1); /* the backlog never fits */
        ssize_t n = recv(sv[1], rx, STEP, 0);
        CHECK(n > 0);
        CHECK_OK(fiber_buf_append(&got, rx, (size_t)n));
    }
    /* 26 MiB went through; the buffer held about the backlog. */
    CHECK(fb_conn_out(&a)->cap <= (8u << 20));
    CHECK(fb_conn_unsent(&a) > 0);
    CHECK_EQ(fb_conn_partly_sent(&a), 1);
    uint64_t deadline = fb_deadline_ms(10000);
    for (;;) {
        int rc = fb_conn_flush(&a);
        CHECK(rc >= 0);
        ssize_t n = recv(sv[1], rx, 4 << 20, 0);
        if (n > 0)
            CHECK_OK(fiber_buf_append(&got, rx, (size_t)n));
        if (rc == 0 && n <= 0)
            break;
        CHECK(fb_ms_left(deadline) > 0);
    }
    CHECK_EQ(fb_conn_partly_sent(&a), 0);
    CHECK_EQ(got.len, want.len);
    CHECK(memcmp(got.data, want.data, want.len) == 0);
    fiber_buf_free(&want);
    fiber_buf_free(&got);
    free(chunk);
    free(rx);
    fb_conn_close(&a);
    close(sv[1]);
}

/* The same for an encrypted conn: its plaintext buffer is compacted
 * behind the sealed records, and the peer reads every frame intact. */
TEST(an_encrypted_conn_that_never_drains_reuses_its_output_buffer)
{
    uint8_t key[FB_SEC_PSK_LEN];
    random_key(key);
    struct fb_conn a, b;
    conn_pair(&a, &b, key, key);
    fiber_buf got = {0}, want = {0};
    CHECK_OK(fb_wire_put_ping(fb_conn_out(&a), 1)); /* the handshake */
    transfer(&a, &b, &got, FB_WIRE_HDR_LEN);
    got.len = 0;
    enum { STEP = 64 << 10, STEPS = 400 };
    uint8_t *blob = malloc(STEP);
    size_t peak = 0;
    for (int i = -16; i < STEPS; i++) {
        randombytes_buf(blob, STEP);
        fiber_iov item = {blob, STEP};
        size_t at = fb_conn_out(&a)->len;
        CHECK_OK(fb_wire_put_ocall(fb_conn_out(&a), (uint64_t)i + 100, 17, 1,
                                   -1, &item, 1));
        CHECK_OK(fiber_buf_append(&want, fb_conn_out(&a)->data + at,
                                  fb_conn_out(&a)->len - at));
        if (i < 0)
            continue;
        CHECK(fb_conn_flush(&a) >= 0);
        CHECK(fb_conn_flush(&b) >= 0);
        CHECK_OK(fb_conn_read(&b)); /* one record's worth, or so */
        struct fb_wire_hdr h;
        const uint8_t *p;
        while (fb_conn_next(&b, &h, &p) == 1)
            append_frame(&got, &h, p);
        if (fb_conn_out(&a)->cap > peak)
            peak = fb_conn_out(&a)->cap;
    }
    CHECK(peak <= (8u << 20));
    transfer(&a, &b, &got, want.len);
    CHECK(memcmp(got.data, want.data, want.len) == 0);
    free(blob);
    fiber_buf_free(&got);
    fiber_buf_free(&want);
    fb_conn_close(&a);
    fb_conn_close(&b);
}

/* ---- the runtime over TCP ------------------------------------------------ */

FIBER_TASK(square)
{
    int64_t x = 0, y;
    if (len == sizeof x)
        memcpy(&x, arg, sizeof x);
    y = x * x;
    return fiber_buf_append(out, &y, sizeof y);
}

FIBER_TASK(segv_on_13)
{
    int64_t x = 0;
    if (len == sizeof x)
        memcpy(&x, arg, sizeof x);
    if (x == 13)
        raise(SIGSEGV);
    return fiber_buf_append(out, &x, sizeof x);
}

FIBER_TASK(ret_arg)
{
    int v = 0;
    if (len == sizeof v)
        memcpy(&v, arg, sizeof v);
    return v;
}

static void use_tcp(const char *encryption)
{
    CHECK_OK(fiber_config_set("transport", "tcp"));
    CHECK_OK(fiber_config_set("encryption", encryption));
    CHECK(strncmp(fb_rt_address(), "tcp:", 4) == 0);
}

static void map_squares(fiber_pool *p, size_t n)
{
    int64_t *in = malloc(n * sizeof *in), *out = calloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++)
        in[i] = (int64_t)i;
    CHECK_OK(fiber_pool_map(p, "square", in, 8, n, out, 8, 0));
    for (size_t i = 0; i < n; i++)
        if (out[i] != (int64_t)(i * i))
            TH_FAIL("square(%zu) = %lld", i, (long long)out[i]);
    free(in);
    free(out);
}

static fiber_pool *make_pool(int workers)
{
    fiber_pool_opts o = {.workers = workers};
    fiber_pool *p = NULL;
    CHECK_OK(fiber_pool_create(&p, &o));
    return p;
}

TEST(pool_map_over_encrypted_tcp)
{
    use_tcp("true");
    fiber_pool *p = make_pool(2);
    map_squares(p, 3000);
    map_squares(p, 5);
    fiber_pool_free(p);
}

TEST(pool_map_over_plaintext_tcp)
{
    use_tcp("false");
    fiber_pool *p = make_pool(2);
    map_squares(p, 3000);
    fiber_pool_free(p);
}

TEST(crash_report_crosses_encrypted_tcp)
{
    /* FAULT is written by the worker's signal handler, sealed in place. */
    use_tcp("true");
    enum { N = 100 };
    fiber_pool *p = make_pool(2);
    int64_t in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = i;
    CHECK_ERR(fiber_pool_map(p, "segv_on_13", in, 8, N, out, 8, 1),
              FIBER_ECRASHED);
    CHECK_CONTAINS(fiber_last_error(), "task 13 of 'segv_on_13'");
    for (int i = 0; i < N; i++)
        if (i != 13)
            CHECK_EQ(out[i], i);
    fiber_pool_stats st;
    CHECK_OK(fiber_pool_stats_get(p, &st));
    CHECK_EQ(st.tasks_crashed, 1);
    map_squares(p, 100);
    fiber_pool_free(p);
}

FIBER_TASK(put_three)
{
    (void)out;
    fiber_queue *q;
    int rc = fiber_queue_open(&q, arg, len);
    for (int i = 0; rc == 0 && i < 3; i++) {
        char item[32];
        snprintf(item, sizeof item, "item-%d", i);
        rc = fiber_queue_put(q, item, strlen(item), 5000);
    }
    fiber_queue_free(q);
    return rc ? 1 : 0;
}

TEST(queue_with_a_child_over_encrypted_tcp)
{
    use_tcp("true");
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf ser = {0};
    CHECK_OK(fiber_queue_serialize(q, &ser));
    fiber_process *pr;
    CHECK_OK(fiber_process_start(&pr, "put_three", ser.data, ser.len, NULL));
    for (int i = 0; i < 3; i++) {
        fiber_buf item = {0};
        CHECK_OK(fiber_queue_get(q, &item, 20000));
        char want[32];
        snprintf(want, sizeof want, "item-%d", i);
        CHECK_EQ(item.len, strlen(want));
        CHECK(memcmp(item.data, want, item.len) == 0);
        fiber_buf_free(&item);
    }
    CHECK_OK(fiber_process_join(pr, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(pr, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(pr);
    fiber_buf_free(&ser);
    fiber_queue_free(q);
}

struct member {
    const fiber_buf *ser;
    int rank, rc;
    size_t count;
    float *data;
};

static void *member_main(void *arg)
{
    struct member *m = arg;
    fiber_ring *r;
    m->rc = fiber_ring_join(&r, m->ser->data, m->ser->len, m->rank, 20000);
    if (m->rc)
        return NULL;
    for (size_t i = 0; i < m->count; i++)
        m->data[i] = (float)((i % 1000) * (size_t)(m->rank + 1));
    m->rc = fiber_ring_allreduce(r, m->data, m->count, FIBER_FLOAT32,
                                 FIBER_SUM, 20000);
    fiber_ring_free(r);
    return NULL;
}

TEST(ring_allreduce_over_encrypted_tcp)
{
    use_tcp("true");
    enum { N = 3 };
    size_t count = (1u << 20) + 3; /* several pieces of 1 MiB per link */
    fiber_ring *ring;
    CHECK_OK(fiber_ring_create(&ring, N));
    fiber_buf ser = {0};
    CHECK_OK(fiber_ring_serialize(ring, &ser));
    struct member m[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        m[i] = (struct member){&ser, i, -1, count,
                               malloc(count * sizeof(float))};
        CHECK(pthread_create(&th[i], NULL, member_main, &m[i]) == 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        CHECK_OK(m[i].rc);
        for (size_t k = 0; k < count; k++)
            if (m[i].data[k] != (float)((k % 1000) * 6))
                TH_FAIL("rank %d element %zu: %g", i, k, m[i].data[k]);
        free(m[i].data);
    }
    fiber_buf_free(&ser);
    fiber_ring_free(ring);
}

/* ---- strangers at the master's port -------------------------------------- */

/* Sends stderr (the master's log) to a file until log_end, which returns
 * what was written. */
static int saved_stderr = -1;
static char log_path[256];

static void log_begin(void)
{
    snprintf(log_path, sizeof log_path, "/tmp/test_secure.%d.log",
             (int)getpid());
    FILE *f = fopen(log_path, "w");
    CHECK(f != NULL);
    fflush(stderr);
    saved_stderr = dup(2);
    dup2(fileno(f), 2);
    fclose(f);
}

static char *log_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    FILE *f = fopen(log_path, "r");
    CHECK(f != NULL);
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(log_path);
    return text;
}

static int dial_master(void)
{
    int fd;
    CHECK_OK(fb_sock_dial(fb_rt_address(), fb_deadline_ms(5000), &fd));
    return fd;
}

static void wait_dropped(uint64_t want)
{
    uint64_t deadline = fb_deadline_ms(5000);
    while (fb_rt_dropped_peers() < want && fb_ms_left(deadline) > 0)
        sleep_ms(5);
    CHECK(fb_rt_dropped_peers() >= want);
}

static void check_real_child_works(int value)
{
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "ret_arg", &value, sizeof value, NULL));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, value);
    fiber_process_free(p);
}

TEST(plaintext_hello_to_an_encrypted_master_is_dropped)
{
    use_tcp("true");
    log_begin();
    int fd = dial_master();
    struct fb_msg_hello h = {.build_id = fb_rt_build_id(),
                             .build_id_len = (uint8_t)strlen(fb_rt_build_id()),
                             .job_id = 1,
                             .pid = (uint32_t)getpid(),
                             .name = "plain",
                             .name_len = 5};
    memcpy(h.token, fb_rt_token(), sizeof h.token); /* even the right one */
    fiber_buf msg = {0}, got = {0};
    CHECK_OK(fb_wire_put_hello(&msg, &h));
    send_all(fd, msg.data, msg.len);
    drain(fd, &got);
    wait_dropped(1);
    char *log = log_end();
    /* The master's handshake and nothing else: no WELCOME, no REJECT. */
    CHECK_EQ(got.len, 36);
    CHECK(memcmp(got.data, "FBX1", 4) == 0);
    CHECK_CONTAINS(log, "unencrypted fiber frame");
    close(fd);
    fiber_buf_free(&msg);
    fiber_buf_free(&got);
    check_real_child_works(21);
}

TEST(child_without_encryption_fails_cleanly)
{
    use_tcp("true");
    const char *env[] = {"FIBER_ENCRYPTION=false", NULL};
    fiber_job_opts o = {.env = env};
    int v = 3;
    fiber_process *p;
    uint64_t t0 = fb_now_ms();
    log_begin();
    CHECK_OK(fiber_process_start(&p, "ret_arg", &v, sizeof v, &o));
    CHECK_OK(fiber_process_join(p, 20000));
    wait_dropped(1);
    char *log = log_end();
    CHECK(fb_now_ms() - t0 < 10000); /* an answer, not a timeout */
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, FB_EXIT_REJECTED);
    CHECK_CONTAINS(log, "unencrypted fiber frame");
    fiber_process_free(p);
    check_real_child_works(22);
}

/* A thread that beats on the master's port with n connections: silent
 * ones, garbage, strangers that make the handshake and then send a
 * record they cannot have sealed, or claim a 1 GiB record.  It keeps
 * them open and returns them. */
struct attack {
    const char *addr;
    int n;
    int *fds;
    volatile int done;
};

static void *attacker(void *arg)
{
    struct attack *a = arg;
    for (int i = 0; i < a->n; i++) {
        int fd = -1;
        if (fb_sock_dial(a->addr, fb_deadline_ms(5000), &fd) != 0) {
            a->fds[i] = -1;
            continue;
        }
        a->fds[i] = fd;
        uint8_t buf[300];
        switch (i % 4) {
        case 0: /* silent */
            break;
        case 1:
            send(fd, "GET / HTTP/1.1\r\nHost: fiber\r\n\r\n", 31,
                 MSG_NOSIGNAL);
            break;
        case 2: { /* a forged record */
            fake_handshake(buf);
            uint32_t n = 200;
            memcpy(buf + 36, &n, 4);
            randombytes_buf(buf + 40, 200);
            send(fd, buf, 240, MSG_NOSIGNAL);
            break;
        }
        case 3: { /* a record of 1 GiB */
            fake_handshake(buf);
            uint32_t n = 1u << 30;
            memcpy(buf + 36, &n, 4);
            send(fd, buf, 40, MSG_NOSIGNAL);
            break;
        }
        }
        if (i % 16 == 0)
            sleep_ms(2);
    }
    a->done = 1;
    return NULL;
}

/* 1 if the master has closed fd (what it sent is read and discarded). */
static int closed_by_master(int fd)
{
    for (;;) {
        uint8_t buf[256];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0)
            continue;
        return n == 0 || (errno != EAGAIN && errno != EINTR);
    }
}

TEST(hostile_load_while_a_pool_maps_over_tcp)
{
    enum { N_CONNS = 400, MAX_PENDING = 64 };
    uint64_t t0 = fb_now_ms();
    use_tcp("true");
    CHECK_OK(fiber_config_set("max_pending_connections", "64"));
    fiber_pool *p = make_pool(2);
    map_squares(p, 200); /* the workers are in */
    long rss0 = vm_kib("VmRSS");
    uint64_t dropped0 = fb_rt_dropped_peers();
    int fds[N_CONNS];
    struct attack a = {fb_rt_address(), N_CONNS, fds, 0};
    pthread_t th;
    log_begin();
    CHECK(pthread_create(&th, NULL, attacker, &a) == 0);
    int rounds = 0;
    while (rounds < 3 || !a.done) {
        map_squares(p, 3000);
        rounds++;
    }
    pthread_join(th, NULL);
    map_squares(p, 1000);
    /* Every garbage or forged peer is dropped; of the silent ones, no
     * more than max_pending_connections are held. */
    int open = N_CONNS;
    uint64_t deadline = fb_deadline_ms(5000);
    while (fb_ms_left(deadline) > 0) {
        open = 0;
        for (int i = 0; i < N_CONNS; i++)
            if (fds[i] >= 0 && !closed_by_master(fds[i]))
                open++;
        if (open <= MAX_PENDING)
            break;
        sleep_ms(50);
    }
    long rss1 = vm_kib("VmRSS");
    char *log = log_end();
    fprintf(stderr, "hostile load: %d maps of 3000 tasks; %d connections "
            "still open, %llu dropped (%llu to make room), master RSS %ld -> "
            "%ld KiB, %llu ms\n", rounds,
            open, (unsigned long long)(fb_rt_dropped_peers() - dropped0),
            (unsigned long long)fb_rt_refused_peers(), rss0, rss1,
            (unsigned long long)(fb_now_ms() - t0));
    CHECK(open <= MAX_PENDING);
    CHECK(fb_rt_refused_peers() > 0);
    CHECK(fb_rt_dropped_peers() - dropped0 >= N_CONNS - MAX_PENDING);
    CHECK(rss1 - rss0 < 32 * 1024);
    CHECK_CONTAINS(log, "closing the oldest to make room");
    CHECK_CONTAINS(log, "decryption failed");
    CHECK_CONTAINS(log, "outside the limits");
    /* "Once per burst": not once per connection. */
    int burst_lines = 0;
    for (const char *s = log; (s = strstr(s, "closing the oldest")); s++)
        burst_lines++;
    CHECK(burst_lines >= 1 && burst_lines <= 3);
    for (int i = 0; i < N_CONNS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    check_real_child_works(23);
    fiber_pool_free(p);
    CHECK(fb_now_ms() - t0 < 20000);
}

TH_MAIN()
