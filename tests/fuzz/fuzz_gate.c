/*
 * fuzz_gate.c -- libFuzzer target for the gate every server of a run
 * keeps (src/net/gate.c): fb_hello_check, the one check of a peer's
 * HELLO, and the peers that wait in a gate until they send one (the
 * master's service thread, the object server, the blob server and a ring
 * member's join all use it; their own handling of what follows a HELLO is
 * fuzz_objsrv's, fuzz_blobs's and fuzz_ring's).
 *
 * Each input runs one gate whose cap (1 to 8) and per-peer timeout (1 to
 * 1000 ms) its first two bytes choose, over up to MAX_PEERS peers, each a
 * real connection (a socket pair: the gate holds one end in a fb_conn,
 * the script writes and reads the other).  Then a script of commands:
 *
 *   ADD    a new peer connects (the gate closes the oldest when cap wait)
 *   SEND   bytes on a peer's stream, then the gate serves it: a right
 *          HELLO, one with a wrong token or build id, a HELLO cut short or
 *          with bytes after it, another message, a header announcing more
 *          than FB_GATE_HELLO_MAX, raw bytes
 *   CLOSE  a peer's far end closes, then the gate serves it
 *   TICK   time passes: fb_gate_tick at a moment before or after deadlines
 *   DROP   the server drops, rejects, or drops the oldest waiting peer
 *   CHECK  fb_hello_check on a frame built from the input
 *
 * A peer that fb_gate_serve says proved itself is then admitted (and
 * closed by the script) or rejected, as the next input byte says: what a
 * server does after its own checks.  A model of the gate gives the
 * invariants checked (abort() on a violation):
 *   - the gate holds exactly the peers the model says wait, never more
 *     than cap; making room closes the oldest; its dropped and refused
 *     counters are the model's;
 *   - fb_gate_serve returns 1 exactly when the peer's first whole frame
 *     is a HELLO with the token and build id, 0 while no whole frame and
 *     no end has come, -1 otherwise, and then the peer is closed;
 *   - a peer closed for a well-formed HELLO with the wrong token or build
 *     id gets one REJECT frame and then the end of the stream; every
 *     other peer the gate closes gets nothing but the end;
 *   - a tick closes exactly the peers whose deadline has passed, and a
 *   - peer's deadline is its arrival plus the timeout;
 *   - fb_hello_check's verdict is the oracle's (type, decoding, token,
 *     build id, in that order), with a reason for every fault;
 *   - no crash, no sanitizer report, no leak once the gate is cleared.
 */
#define FZ_NAME "fuzz_gate"
#include "fuzz_util.h"

#include <stddef.h>

#include "base/common.h"
#include "net/gate.h"
#include "net/net.h"

#define MAX_PEERS 12
#define BUILD "0123456789abcdef0123456789abcdef01234567"
#define OTHER_BUILD "0123456789abcdef0123456789abcdef01234568"

static const uint8_t TOKEN[FB_WIRE_TOKEN_LEN] = {
    1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

enum { C_ADD, C_SEND, C_CLOSE, C_TICK, C_DROP, C_CHECK, C_COUNT };
enum { S_HELLO, S_TOKEN, S_BUILD, S_CUT, S_OTHER, S_HUGE, S_RAW, S_TRAIL,
       S_COUNT };

/* The gate's side of a peer. */
struct peer {
    struct fb_conn conn;
    struct fb_gate_peer gp;
    int slot;
};

/* The script's side, and the model of it. */
struct slot {
    struct peer *p;   /* NULL once the gate (or the script) closed it */
    int far;          /* our end, -1 when none */
    int waiting;      /* model: in the gate */
    int far_closed;   /* we closed our sending side */
    uint64_t seq;     /* arrival order */
    uint64_t added_lo, added_hi; /* fb_now_ms() around fb_gate_add */
    fiber_buf sent;   /* everything we sent */
};

struct state {
    struct fb_gate g;
    struct slot s[MAX_PEERS];
    int cap, timeout;
    uint64_t seq;
    uint64_t dropped, refused; /* the model's counters */
    int closed_now;            /* slots the gate closed in this command */
};

/* The gate's close function: notes which slot went. */
static void close_peer(struct fb_gate_peer *gp, void *arg)
{
    struct state *st = arg;
    struct peer *p = (struct peer *)((char *)gp - offsetof(struct peer, gp));
    FZ_REQUIRE(st->s[p->slot].p == p, "slot %d closed twice", p->slot);
    st->s[p->slot].p = NULL;
    st->closed_now++;
    fb_conn_close(&p->conn);
    free(p);
}

/* ---- the far end --------------------------------------------------------- */

/* Reads what the gate sent a peer it closed: nothing, or (want_reject)
 * exactly one REJECT frame; then the end of the stream.  Closes our end. */
static void expect_closed(struct slot *sl, int want_reject, int i)
{
    uint8_t buf[4096];
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(sl->far, buf + got, sizeof buf - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            FZ_REQUIRE(got < sizeof buf, "peer %d: too many bytes back", i);
            continue;
        }
        FZ_REQUIRE(n == 0, "peer %d: the gate did not close it (%s)", i,
                   n < 0 ? strerror(errno) : "");
        break;
    }
    if (!want_reject) {
        FZ_REQUIRE(got == 0, "peer %d: %zu bytes back, want none", i, got);
    } else {
        struct fb_wire_hdr h;
        FZ_REQUIRE(fb_wire_hdr_decode(buf, got, FB_WIRE_TEXT_MAX, &h, NULL,
                                      0) == 0 &&
                       h.type == FB_MSG_REJECT &&
                       got == FB_WIRE_HDR_LEN + h.len && h.len > 0,
                   "peer %d: want one REJECT, got %zu bytes", i, got);
    }
    close(sl->far);
    sl->far = -1;
    fiber_buf_free(&sl->sent);
}

/* ---- the model ----------------------------------------------------------- */

static int n_waiting(const struct state *st)
{
    int n = 0;
    for (int i = 0; i < MAX_PEERS; i++)
        n += st->s[i].waiting;
    return n;
}

static int oldest_waiting(const struct state *st)
{
    int best = -1;
    for (int i = 0; i < MAX_PEERS; i++)
        if (st->s[i].waiting &&
            (best < 0 || st->s[i].seq < st->s[best].seq))
            best = i;
    return best;
}

/* The model's verdict on what a peer sent: 1 the right HELLO, 0 not a
 * whole frame yet, -1 wrong and no answer, -2 wrong and REJECT. */
static int oracle_stream(const struct slot *sl)
{
    const uint8_t *p = sl->sent.data;
    size_t n = sl->sent.len;
    struct fb_wire_hdr h;
    if (n < FB_WIRE_HDR_LEN)
        return sl->far_closed ? -1 : 0;
    int rc = fb_wire_hdr_decode(p, n, FB_GATE_HELLO_MAX, &h, NULL, 0);
    if (rc == 1 || (rc == 0 && n - FB_WIRE_HDR_LEN < h.len))
        return sl->far_closed ? -1 : 0;
    if (rc != 0)
        return -1;
    const uint8_t *pl = p + FB_WIRE_HDR_LEN;
    if (fb_wire_check_payload(&h, pl, NULL, 0) != 0 ||
        h.type != FB_MSG_HELLO)
        return -1;
    struct fb_msg_hello m;
    FZ_REQUIRE(fb_wire_get_hello(pl, h.len, &m, NULL, 0) == 0,
               "a HELLO that passed the payload check does not decode");
    if (memcmp(m.token, TOKEN, sizeof TOKEN) != 0 ||
        m.build_id_len != strlen(BUILD) ||
        memcmp(m.build_id, BUILD, m.build_id_len) != 0)
        return -2;
    return 1;
}

/* The model's verdict on one frame (fb_hello_check). */
static int oracle_frame(const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fb_msg_hello m;
    if (h->type != FB_MSG_HELLO)
        return FB_HELLO_NOT_HELLO;
    if (fb_wire_get_hello(p, h->len, &m, NULL, 0) != 0)
        return FB_HELLO_MALFORMED;
    if (memcmp(m.token, TOKEN, sizeof TOKEN) != 0)
        return FB_HELLO_TOKEN;
    if (m.build_id_len != strlen(BUILD) ||
        memcmp(m.build_id, BUILD, m.build_id_len) != 0)
        return FB_HELLO_BUILD;
    return FB_HELLO_OK;
}

/* After each command: the gate holds what the model says. */
static void check_books(struct state *st)
{
    int n = 0;
    uint64_t last_seq = 0;
    for (struct fb_gate_peer *gp = st->g.oldest; gp; gp = gp->newer, n++) {
        struct peer *p = (struct peer *)((char *)gp -
                                         offsetof(struct peer, gp));
        struct slot *sl = &st->s[p->slot];
        FZ_REQUIRE(sl->waiting && sl->p == p, "peer %d is in the gate but "
                   "should not be", p->slot);
        FZ_REQUIRE(n == 0 || sl->seq > last_seq, "the gate's order is not "
                   "the arrival order");
        last_seq = sl->seq;
    }
    FZ_REQUIRE(n == st->g.n && n == n_waiting(st),
               "the gate holds %d (says %d), the model %d", n, st->g.n,
               n_waiting(st));
    FZ_REQUIRE(n <= st->cap, "%d wait, over the cap of %d", n, st->cap);
    FZ_REQUIRE(st->g.dropped == st->dropped && st->g.refused == st->refused,
               "counters: dropped %llu refused %llu, want %llu %llu",
               (unsigned long long)st->g.dropped,
               (unsigned long long)st->g.refused,
               (unsigned long long)st->dropped,
               (unsigned long long)st->refused);
}

/* ---- commands ------------------------------------------------------------ */

static void cmd_add(struct state *st)
{
    int i = 0;
    while (i < MAX_PEERS && (st->s[i].p || st->s[i].far >= 0))
        i++;
    if (i == MAX_PEERS)
        return;
    int sv[2];
    fz_socketpair(sv);
    struct peer *p = calloc(1, sizeof *p);
    FZ_REQUIRE(p, "out of memory");
    fb_conn_init(&p->conn, sv[0], FB_GATE_HELLO_MAX);
    p->slot = i;
    struct slot *sl = &st->s[i];
    int victim = n_waiting(st) >= st->cap ? oldest_waiting(st) : -1;
    sl->p = p;
    sl->far = sv[1];
    sl->far_closed = 0;
    sl->seq = ++st->seq;
    st->closed_now = 0;
    sl->added_lo = fb_now_ms();
    fb_gate_add(&st->g, &p->gp, &p->conn);
    sl->added_hi = fb_now_ms();
    sl->waiting = 1;
    FZ_REQUIRE(p->gp.deadline_ms >= sl->added_lo + (uint64_t)st->timeout &&
                   p->gp.deadline_ms <= sl->added_hi + (uint64_t)st->timeout,
               "deadline is not arrival + timeout");
    if (victim >= 0) {
        FZ_REQUIRE(!st->s[victim].p, "the oldest (%d) was not closed to "
                   "make room", victim);
        st->s[victim].waiting = 0;
        st->dropped++;
        st->refused++;
        expect_closed(&st->s[victim], 0, victim);
    }
    FZ_REQUIRE(st->closed_now == (victim >= 0), "ADD closed %d peers",
               st->closed_now);
}

/* A valid HELLO frame into b, with the fault asked for. */
static void put_hello(fiber_buf *b, int fault, uint8_t x)
{
    struct fb_msg_hello h = {.build_id = BUILD,
                             .build_id_len = (uint8_t)strlen(BUILD),
                             .job_id = x,
                             .pid = 1,
                             .name = "peer",
                             .name_len = 4};
    memcpy(h.token, TOKEN, sizeof h.token);
    if (fault == S_TOKEN)
        h.token[x % FB_WIRE_TOKEN_LEN] ^= (uint8_t)(1u << (x % 8));
    if (fault == S_BUILD) {
        h.build_id = OTHER_BUILD;
        h.build_id_len = (uint8_t)(x % 2 ? strlen(OTHER_BUILD) : 8);
    }
    FZ_REQUIRE(fb_wire_put_hello(b, &h) == 0, "put_hello");
}

/* Builds what SEND sends. */
static void build_send(struct fz_in *in, fiber_buf *b)
{
    int what = fz_u8(in) % S_COUNT;
    uint8_t x = fz_u8(in);
    size_t got;
    const uint8_t *raw;
    struct fb_wire_hdr h = {0};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    switch (what) {
    case S_HELLO:
    case S_TOKEN:
    case S_BUILD:
        put_hello(b, what, x);
        break;
    case S_CUT:
        put_hello(b, S_HELLO, x);
        b->len = x % b->len;
        break;
    case S_OTHER:
        FZ_REQUIRE(fb_wire_put_ping(b, x) == 0, "put_ping");
        break;
    case S_HUGE:
        h.type = FB_MSG_HELLO;
        h.len = FB_GATE_HELLO_MAX + 1 + x;
        fb_wire_hdr_encode(hdr, &h);
        fz_w_bytes(b, hdr, sizeof hdr);
        break;
    case S_RAW:
        raw = fz_bytes(in, x % 65, &got);
        fz_w_bytes(b, raw, got);
        break;
    case S_TRAIL:
        put_hello(b, S_HELLO, x);
        raw = fz_bytes(in, x % 17, &got);
        fz_w_bytes(b, raw, got);
        break;
    }
}

/* The gate serves peer i, and the result is the model's. */
static void serve(struct state *st, struct fz_in *in, int i)
{
    struct slot *sl = &st->s[i];
    int want = oracle_stream(sl);
    struct fb_msg_hello m;
    st->closed_now = 0;
    int got = fb_gate_serve(&st->g, &sl->p->gp, TOKEN, BUILD, &m);
    FZ_REQUIRE(got == (want < 0 ? -1 : want), "peer %d: serve gave %d, "
               "want %d", i, got, want);
    if (got == 0) {
        FZ_REQUIRE(sl->p && st->closed_now == 0, "peer %d closed too soon",
                   i);
        return;
    }
    if (got < 0) {
        FZ_REQUIRE(!sl->p && st->closed_now == 1, "peer %d not closed", i);
        sl->waiting = 0;
        st->dropped++;
        expect_closed(sl, want == -2, i);
        return;
    }
    FZ_REQUIRE(m.job_id < 256 && m.name_len == 4, "the HELLO read back is "
               "not the one sent");
    if (fz_u8(in) % 4 == 0) { /* the server's own check fails */
        fb_gate_reject(&st->g, &sl->p->gp, "job unknown");
        FZ_REQUIRE(!sl->p, "a rejected peer was not closed");
        sl->waiting = 0;
        st->dropped++;
        expect_closed(sl, 1, i);
        return;
    }
    fb_gate_admit(&st->g, &sl->p->gp);
    FZ_REQUIRE(sl->p && !sl->p->gp.in_gate, "an admitted peer is still in "
               "the gate");
    sl->waiting = 0;
    fb_conn_close(&sl->p->conn); /* the server's now: here, it leaves */
    free(sl->p);
    sl->p = NULL;
    close(sl->far);
    sl->far = -1;
    fiber_buf_free(&sl->sent);
}

/* Picks a waiting peer by the input, or -1. */
static int pick(struct state *st, struct fz_in *in)
{
    int k = fz_u8(in) % MAX_PEERS;
    for (int j = 0; j < MAX_PEERS; j++) {
        int i = (k + j) % MAX_PEERS;
        if (st->s[i].waiting)
            return i;
    }
    return -1;
}

static void cmd_send(struct state *st, struct fz_in *in)
{
    int i = pick(st, in);
    fiber_buf b = {0};
    build_send(in, &b);
    if (i < 0 || st->s[i].far_closed) {
        fiber_buf_free(&b);
        return;
    }
    struct slot *sl = &st->s[i];
    if (b.len) {
        FZ_REQUIRE(fz_send(sl->far, b.data, b.len) == b.len, "send");
        fz_w_bytes(&sl->sent, b.data, b.len);
    }
    fiber_buf_free(&b);
    serve(st, in, i);
}

static void cmd_close(struct state *st, struct fz_in *in)
{
    int i = pick(st, in);
    if (i < 0 || st->s[i].far_closed)
        return;
    shutdown(st->s[i].far, SHUT_WR);
    st->s[i].far_closed = 1;
    serve(st, in, i);
}

static void cmd_tick(struct state *st, struct fz_in *in)
{
    uint64_t now = fb_now_ms() + (fz_u16(in) % 2100);
    int want[MAX_PEERS];
    for (int i = 0; i < MAX_PEERS; i++)
        want[i] = st->s[i].waiting && st->s[i].p->gp.deadline_ms <= now;
    st->closed_now = 0;
    uint64_t next = fb_gate_tick(&st->g, now);
    int n = 0;
    uint64_t want_next = UINT64_MAX;
    for (int i = 0; i < MAX_PEERS; i++) {
        if (want[i]) {
            FZ_REQUIRE(!st->s[i].p, "peer %d outlived its deadline", i);
            st->s[i].waiting = 0;
            st->dropped++;
            n++;
            expect_closed(&st->s[i], 0, i);
        } else if (st->s[i].waiting) {
            FZ_REQUIRE(st->s[i].p, "peer %d closed before its deadline", i);
            if (st->s[i].p->gp.deadline_ms < want_next)
                want_next = st->s[i].p->gp.deadline_ms;
        }
    }
    FZ_REQUIRE(st->closed_now == n, "TICK closed %d, want %d",
               st->closed_now, n);
    FZ_REQUIRE(next <= want_next && (next > now || next == UINT64_MAX),
               "TICK's next moment is wrong");
}

static void cmd_drop(struct state *st, struct fz_in *in)
{
    int how = fz_u8(in) % 3;
    int i = how == 2 ? oldest_waiting(st) : pick(st, in);
    st->closed_now = 0;
    if (how == 2)
        fb_gate_drop_oldest(&st->g, "descriptor limit reached");
    if (i < 0) {
        FZ_REQUIRE(st->closed_now == 0, "dropped a peer from an empty gate");
        return;
    }
    if (how == 0)
        fb_gate_drop(&st->g, &st->s[i].p->gp, "dropped by the script");
    else if (how == 1)
        fb_gate_reject(&st->g, &st->s[i].p->gp, "rejected by the script");
    FZ_REQUIRE(!st->s[i].p && st->closed_now == 1, "peer %d not dropped", i);
    st->s[i].waiting = 0;
    st->dropped++;
    expect_closed(&st->s[i], how == 1, i);
}

static void cmd_check(struct fz_in *in)
{
    fiber_buf b = {0};
    build_send(in, &b);
    struct fb_wire_hdr h = {0};
    const uint8_t *payload = NULL;
    size_t len = 0;
    if (b.len >= FB_WIRE_HDR_LEN &&
        fb_wire_hdr_decode(b.data, b.len, FB_WIRE_PAYLOAD_HARD_MAX, &h, NULL,
                           0) == 0) {
        payload = b.data + FB_WIRE_HDR_LEN;
        len = b.len - FB_WIRE_HDR_LEN;
    } else {
        h.type = FB_MSG_HELLO; /* whatever came, as a HELLO's payload */
        payload = b.data;
        len = b.len;
    }
    if (len < h.len)
        h.len = (uint32_t)len; /* what arrived of it */
    if (fz_u8(in) % 4 == 0)
        h.type = (uint8_t)fz_u8(in);
    struct fb_msg_hello m;
    char why[512] = "";
    int want = oracle_frame(&h, payload);
    int got = fb_hello_check(&h, payload, TOKEN, BUILD, &m, why, sizeof why);
    FZ_REQUIRE(got == want, "fb_hello_check says %d, want %d", got, want);
    FZ_REQUIRE(got == FB_HELLO_OK || (why[0] && memchr(why, 0, sizeof why)),
               "fault %d without a reason", got);
    fiber_buf_free(&b);
}

/* ---- one input ----------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_setup();
    struct fz_in in = {data, size};
    struct state st;
    memset(&st, 0, sizeof st);
    st.cap = 1 + fz_u8(&in) % 8;
    st.timeout = 1 + fz_u16(&in) % 1000;
    fb_gate_init(&st.g, "fuzz", st.cap, st.timeout, close_peer, &st);
    for (int i = 0; i < MAX_PEERS; i++)
        st.s[i].far = -1;
    while (fz_more(&in)) {
        switch (fz_u8(&in) % C_COUNT) {
        case C_ADD:
            cmd_add(&st);
            break;
        case C_SEND:
            cmd_send(&st, &in);
            break;
        case C_CLOSE:
            cmd_close(&st, &in);
            break;
        case C_TICK:
            cmd_tick(&st, &in);
            break;
        case C_DROP:
            cmd_drop(&st, &in);
            break;
        case C_CHECK:
            cmd_check(&in);
            break;
        }
        check_books(&st);
    }
    /* The server stops: every waiting peer is closed, uncounted. */
    uint64_t dropped = st.g.dropped;
    fb_gate_clear(&st.g);
    FZ_REQUIRE(st.g.n == 0 && !st.g.oldest && st.g.dropped == dropped,
               "clear left peers or counted them");
    for (int i = 0; i < MAX_PEERS; i++) {
        FZ_REQUIRE(!st.s[i].p, "peer %d survived the clear", i);
        if (st.s[i].far >= 0)
            expect_closed(&st.s[i], 0, i);
    }
    return 0;
}

/* ---- seeds --------------------------------------------------------------- */

static void w_head(fiber_buf *b, int cap, int timeout)
{
    fz_w_u8(b, cap - 1);
    fz_w_u16(b, timeout - 1);
}

static void w_add(fiber_buf *b) { fz_w_u8(b, C_ADD); }

/* SEND to the k-th slot's peer (pick() starts there). */
static void w_send(fiber_buf *b, int k, int what, int x)
{
    fz_w_u8(b, C_SEND);
    fz_w_u8(b, k);
    fz_w_u8(b, what);
    fz_w_u8(b, x);
}

static void w_then(fiber_buf *b, int admit) { fz_w_u8(b, admit ? 1 : 0); }

void fuzz_write_seeds(const char *dir)
{
    fiber_buf b = {0};

    w_head(&b, 4, 1000);
    w_add(&b);
    w_send(&b, 0, S_HELLO, 7);
    w_then(&b, 1);
    fz_seed(dir, "hello_admitted", &b);

    w_head(&b, 4, 1000);
    w_add(&b);
    w_send(&b, 0, S_HELLO, 9);
    w_then(&b, 0); /* the server's own check fails: REJECT */
    fz_seed(dir, "hello_then_rejected", &b);

    w_head(&b, 8, 1000);
    for (int k = 0; k < 7; k++)
        w_add(&b);
    w_send(&b, 0, S_TOKEN, 5);
    w_send(&b, 1, S_BUILD, 1);
    w_send(&b, 2, S_BUILD, 2);
    w_send(&b, 3, S_OTHER, 0);
    w_send(&b, 4, S_HUGE, 3);
    w_send(&b, 5, S_RAW, 32);
    fz_w_bytes(&b, "GET / HTTP/1.1\r\nHost: fiber\r\n\r\n", 32);
    w_send(&b, 6, S_TRAIL, 5);
    fz_w_bytes(&b, "extra", 5);
    w_then(&b, 1);
    fz_seed(dir, "hostile_firsts", &b);

    /* A HELLO in pieces, and one whose sender goes half way. */
    w_head(&b, 4, 1000);
    w_add(&b);
    w_add(&b);
    w_send(&b, 0, S_CUT, 30);
    w_send(&b, 0, S_RAW, 0);
    w_send(&b, 1, S_CUT, 50);
    fz_w_u8(&b, C_CLOSE);
    fz_w_u8(&b, 1);
    fz_w_u8(&b, C_CLOSE);
    fz_w_u8(&b, 0);
    fz_seed(dir, "cut_short", &b);

    /* More than the cap arrive: the oldest make room. */
    w_head(&b, 3, 1000);
    for (int k = 0; k < 9; k++)
        w_add(&b);
    w_send(&b, 0, S_HELLO, 1);
    w_then(&b, 1);
    w_add(&b);
    fz_seed(dir, "over_the_cap", &b);

    /* Deadlines: a tick before them, one after. */
    w_head(&b, 8, 200);
    w_add(&b);
    w_add(&b);
    fz_w_u8(&b, C_TICK);
    fz_w_u16(&b, 10);
    w_send(&b, 0, S_CUT, 10);
    fz_w_u8(&b, C_TICK);
    fz_w_u16(&b, 1500);
    w_add(&b);
    fz_seed(dir, "deadlines", &b);

    /* The server drops, rejects, drops the oldest. */
    w_head(&b, 8, 1000);
    for (int k = 0; k < 4; k++)
        w_add(&b);
    fz_w_u8(&b, C_DROP);
    fz_w_u8(&b, 0);
    fz_w_u8(&b, 0);
    fz_w_u8(&b, C_DROP);
    fz_w_u8(&b, 1);
    fz_w_u8(&b, 1);
    fz_w_u8(&b, C_DROP);
    fz_w_u8(&b, 2);
    fz_w_u8(&b, C_DROP);
    fz_w_u8(&b, 2);
    fz_w_u8(&b, C_DROP);
    fz_w_u8(&b, 2);
    fz_seed(dir, "server_drops", &b);

    /* fb_hello_check on its own: every fault, and a changed type. */
    w_head(&b, 1, 1);
    for (int what = 0; what < S_COUNT; what++) {
        fz_w_u8(&b, C_CHECK);
        fz_w_u8(&b, what);
        fz_w_u8(&b, what == S_RAW ? 4 : what == S_TRAIL ? 8 : what * 7 + 1);
        if (what == S_RAW)
            fz_w_bytes(&b, "\xbe\xf1\x01\x01", 4);
        if (what == S_TRAIL)
            fz_w_bytes(&b, "abcdefgh", 8);
        fz_w_u8(&b, 1); /* keep the type */
    }
    fz_w_u8(&b, C_CHECK);
    fz_w_u8(&b, S_HELLO);
    fz_w_u8(&b, 3);
    fz_w_u8(&b, 0);
    fz_w_u8(&b, FB_MSG_PING);
    fz_seed(dir, "hello_check", &b);
    fiber_buf_free(&b);
}
