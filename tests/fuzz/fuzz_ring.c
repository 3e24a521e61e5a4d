/*
 * fuzz_ring.c -- libFuzzer target for a ring member's message handling
 * (src/ring/ring.c): the HELLOs that link a member to its neighbours, the
 * hostile connections on its socket while it waits for the previous rank,
 * and the 32-byte-header pieces of every collective it receives.  The
 * rendezvous's own handling of JOIN is fuzz_objsrv's.
 *
 * Rank 0 is real: the test thread calls fiber_ring_join and then the
 * collectives.  Every other rank is played by a helper thread, over real
 * sockets: it JOINs the rendezvous (on a real object server) for ranks 1
 * to n-1, accepts rank 0's link as rank 1 and dials rank 0 as rank n-1,
 * each with a HELLO, then sends rank 0 every piece its collectives will
 * read and drains what rank 0 sends.  The input says:
 *
 *   the ring's size (2 to 4); the connections that come to rank 0's
 *   socket first (garbage, a wrong token, another ring's nonce, another
 *   rank's name, a silent one; up to 9, past the 8 it holds at once);
 *   whether each of the helper's two HELLOs is right or wrong (and how);
 *   then up to 6 collectives: allreduce (float or double; sum, mean or
 *   max) or broadcast (from any root), with their sizes, the values the
 *   other ranks contribute, and whether the helper breaks one of the
 *   call's headers, cuts the stream short or adds a stray byte.
 *
 * Invariants (abort() on a violation):
 *   - the join succeeds exactly when both HELLOs were right, whatever
 *     the other connections sent; a wrong one fails it with a FIBER_E*
 *     code;
 *   - a collective whose pieces were all right succeeds with exactly the
 *     values the ring algorithm gives (compared bit for bit: rank 0
 *     reduces in a fixed order); one with a broken header or missing data
 *     fails, and every later call fails with FIBER_ESTATE;
 *   - no crash, no sanitizer report, no leak.
 */
#define FZ_NAME "fuzz_ring"
#include "fuzz_util.h"

#include <math.h>
#include <poll.h>
#include <pthread.h>

#include "base/common.h"
#include "net/net.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"

#define RDV_JOIN (FB_OP_KIND + 0)
#define PIECE (1u << 20)
#define HDR_LEN 32u
#define HDR_MAGIC 0x47524246u
#define MAX_CALLS 6
#define MAX_COUNT 64
#define MAX_HOSTILE 9
#define TIMEOUT_MS 5000

enum { K_SCATTER = 1, K_GATHER = 2, K_BCAST = 3 };
enum hello_fault { HF_NONE, HF_TOKEN, HF_NONCE, HF_NAME, HF_TYPE, HF_COUNT };
enum hostile { X_GARBAGE, X_TOKEN, X_NONCE, X_NAME, X_SILENT, X_COUNT };

struct call {
    int bcast;
    int dtype, op, root;
    size_t count; /* elements (allreduce) or bytes (broadcast) */
    uint8_t seed;
    uint8_t fault;     /* 0: none; else which byte of which header breaks */
    int cut, stray;    /* the stream ends early; a byte too many */
};

struct plan {
    int n;
    int n_hostile;
    enum hostile hostile[MAX_HOSTILE];
    enum hello_fault prev_hello, next_hello;
    int n_calls;
    struct call calls[MAX_CALLS];
};

struct helper {
    const struct plan *pl;
    char r0_addr[600]; /* where rank 0 listens (ring.c's rule) */
    fiber_future *joins[4];
    char l1_addr[600]; /* where "rank 1" listens */
    int l1_fd;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int joined; /* rank 0's join returned */
    int done;   /* rank 0 made its calls */
    int calls_ok[MAX_CALLS]; /* the helper sent every piece of call k right */
};

/* ---- what the other ranks send ------------------------------------------- */

static double peer_value(const struct call *c, int kind, int step, size_t i)
{
    int v = (int)((c->seed + kind * 17 + step * 31 + (int)i * 7) % 23) - 11;
    if (c->seed == 0xff && i == 1)
        return NAN;
    return v / 4.0;
}

static double my_value(size_t i) { return (double)((int)(i % 9) - 4) / 2.0; }

/* Chunk k of count elements over n: as ring.c's chunk_span. */
static void chunk_span(int n, size_t count, int k, size_t *first, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n, i = (size_t)k;
    *first = i * base + (i < extra ? i : extra);
    *len = base + (i < extra ? 1 : 0);
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A piece's header, as ring.c's hdr_encode writes it. */
static void hdr(uint8_t *h, int kind, const struct call *c, uint32_t seq,
                uint32_t step, uint64_t total, uint32_t plen)
{
    put32(h, HDR_MAGIC);
    h[4] = (uint8_t)kind;
    h[5] = c->bcast ? 0 : (uint8_t)c->dtype;
    h[6] = c->bcast ? 0 : (uint8_t)c->op;
    h[7] = 0;
    put32(h + 8, seq);
    put32(h + 12, step);
    put64(h + 16, total);
    put32(h + 24, plen);
    put32(h + 28, 0); /* piece 0: every block here is under PIECE */
}

/* Appends the values of one block (elements of the call's type). */
static void put_values(fiber_buf *b, const struct call *c, int kind, int step,
                       size_t len)
{
    for (size_t i = 0; i < len; i++) {
        double v = peer_value(c, kind, step, i);
        if (c->dtype == FIBER_FLOAT32) {
            float f = (float)v;
            fz_w_bytes(b, &f, 4);
        } else {
            fz_w_bytes(b, &v, 8);
        }
    }
}

/* Everything rank 0 reads from its previous rank during call k (seq
 * k + 1): one header and block per step. */
static void stream_for(const struct plan *pl, int k, fiber_buf *b)
{
    const struct call *c = &pl->calls[k];
    uint32_t seq = (uint32_t)k + 1;
    int n = pl->n;
    uint8_t h[HDR_LEN];
    if (c->bcast) {
        if (mod(0 - c->root, n) == 0)
            return; /* rank 0 is the root: it only sends */
        hdr(h, K_BCAST, c, seq, (uint32_t)c->root, c->count,
            (uint32_t)c->count);
        fz_w_bytes(b, h, HDR_LEN);
        for (size_t i = 0; i < c->count; i++)
            fz_w_u8(b, (unsigned)(c->seed + i * 3));
        return;
    }
    size_t el = c->dtype == FIBER_FLOAT32 ? 4 : 8;
    uint64_t total = (uint64_t)c->count * el;
    for (int phase = 0; phase < 2; phase++) {
        int kind = phase ? K_GATHER : K_SCATTER;
        for (int s = 0; s < n - 1; s++) {
            size_t first, len;
            chunk_span(n, c->count, mod(phase - s - 1, n), &first, &len);
            hdr(h, kind, c, seq, (uint32_t)s, total, (uint32_t)(len * el));
            fz_w_bytes(b, h, HDR_LEN);
            put_values(b, c, kind, s, len);
        }
    }
}

/* What rank 0's array holds after call k, when every piece was right. */
static void expect_allreduce(const struct plan *pl, const struct call *c,
                             double *want)
{
    int n = pl->n;
    for (size_t i = 0; i < c->count; i++)
        want[i] = my_value(i);
    /* Reduce-scatter: chunk -s-1 at step s; only chunk 1 survives (the
     * others are overwritten by the gather). */
    for (int s = 0; s < n - 1; s++) {
        size_t first, len;
        chunk_span(n, c->count, mod(-s - 1, n), &first, &len);
        for (size_t i = 0; i < len; i++) {
            double in = peer_value(c, K_SCATTER, s, i);
            double *a = &want[first + i];
            if (c->dtype == FIBER_FLOAT32) {
                float acc = (float)*a, b = (float)in;
                if (c->op == FIBER_MAX)
                    acc = b > acc || isnan(b) ? b : acc;
                else
                    acc += b;
                *a = acc;
            } else if (c->op == FIBER_MAX) {
                *a = in > *a || isnan(in) ? in : *a;
            } else {
                *a += in;
            }
        }
    }
    if (c->op == FIBER_MEAN) {
        size_t first, len;
        chunk_span(n, c->count, 1 % n, &first, &len);
        for (size_t i = 0; i < len; i++) {
            if (c->dtype == FIBER_FLOAT32)
                want[first + i] = (float)want[first + i] / (float)n;
            else
                want[first + i] /= (double)n;
        }
    }
    for (int s = 0; s < n - 1; s++) {
        size_t first, len;
        chunk_span(n, c->count, mod(-s, n), &first, &len);
        for (size_t i = 0; i < len; i++)
            want[first + i] = peer_value(c, K_GATHER, s, i);
    }
}

/* ---- the helper: ranks 1 .. n-1 -------------------------------------------- */

static void put_hello_as(fiber_buf *b, int rank, uint64_t nonce,
                         enum hello_fault f)
{
    char name[32];
    snprintf(name, sizeof name, "ring-%d", f == HF_NAME ? rank + 1 : rank);
    const char *bid = fb_rt_build_id();
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .job_id = f == HF_NONCE ? nonce + 1 : nonce,
                             .pid = 1,
                             .name = name,
                             .name_len = (uint8_t)strlen(name)};
    memcpy(h.token, fb_rt_token(), FB_WIRE_TOKEN_LEN);
    if (f == HF_TOKEN)
        h.token[0] ^= 0x80;
    if (f == HF_TYPE)
        fb_wire_put_ping(b, nonce);
    else
        fb_wire_put_hello(b, &h);
}

static int dial(const char *addr)
{
    int fd = -1;
    if (fb_sock_dial(addr, fb_deadline_ms(TIMEOUT_MS), &fd) != 0)
        return -1;
    return fd;
}

static void send_all(int fd, const fiber_buf *b)
{
    size_t off = 0;
    while (off < b->len) {
        off += fz_send(fd, b->data + off, b->len - off);
        if (off < b->len) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            if (poll(&pf, 1, TIMEOUT_MS) <= 0)
                return;
        }
    }
}

/* Reads one frame from fd (a HELLO from rank 0), or returns 0. */
static int read_hello(int fd, uint64_t nonce)
{
    struct fb_conn c;
    fb_conn_init(&c, fd, 1024);
    struct fb_wire_hdr h;
    const uint8_t *p;
    int rc = fb_conn_recv_wait(&c, &h, &p, fb_deadline_ms(TIMEOUT_MS));
    struct fb_msg_hello m;
    int ok = rc == 1 && h.type == FB_MSG_HELLO &&
             fb_wire_get_hello(p, h.len, &m, NULL, 0) == 0 &&
             m.job_id == nonce && m.name_len == 6 &&
             !memcmp(m.name, "ring-0", 6) &&
             fb_conn_buffered(&c) == 0;
    fb_conn_release_fd(&c); /* the descriptor stays ours */
    fb_conn_close(&c);
    return ok;
}

static void wait_flag(struct helper *hp, int *flag)
{
    pthread_mutex_lock(&hp->mu);
    while (!*flag)
        pthread_cond_wait(&hp->cond, &hp->mu);
    pthread_mutex_unlock(&hp->mu);
}

static void *helper_main(void *arg)
{
    struct helper *hp = arg;
    const struct plan *pl = hp->pl;
    int hostile_fd[MAX_HOSTILE], n_hostile = 0, prev_fd = -1, next_fd = -1;

    /* The rendezvous answers every JOIN once rank 0 is in: the nonce and
     * every rank's address. */
    fiber_buf reply = {0};
    int rc = fiber_future_get(hp->joins[0], &reply, TIMEOUT_MS);
    uint64_t nonce = 0;
    if (rc == 0 && reply.len == 8)
        memcpy(&nonce, reply.data, 8);
    fiber_buf_free(&reply);
    const char *r0_addr = hp->r0_addr;
    if (rc != 0)
        goto out;
    /* Rank 1: accept rank 0's link and read its HELLO. */
    for (int waited = 0; waited < TIMEOUT_MS; waited++) {
        if (fb_sock_accept(hp->l1_fd, &next_fd) == 0)
            break;
        struct pollfd pf = {.fd = hp->l1_fd, .events = POLLIN};
        poll(&pf, 1, 1);
        next_fd = -1;
    }
    if (next_fd < 0 || !read_hello(next_fd, nonce))
        goto out;
    /* Strangers at rank 0's door first. */
    for (int i = 0; i < pl->n_hostile; i++) {
        int fd = dial(r0_addr);
        if (fd < 0)
            break;
        hostile_fd[n_hostile++] = fd;
        fiber_buf b = {0};
        switch (pl->hostile[i]) {
        case X_GARBAGE: fz_w_bytes(&b, "not a fiber frame, not at all!", 30); break;
        case X_TOKEN: put_hello_as(&b, pl->n - 1, nonce, HF_TOKEN); break;
        case X_NONCE: put_hello_as(&b, pl->n - 1, nonce, HF_NONCE); break;
        case X_NAME: put_hello_as(&b, pl->n - 1, nonce, HF_NAME); break;
        default: break;
        }
        send_all(fd, &b);
        fiber_buf_free(&b);
    }
    /* Rank n-1: dial rank 0 and greet it. */
    prev_fd = dial(r0_addr);
    if (prev_fd < 0)
        goto out;
    fiber_buf b = {0};
    put_hello_as(&b, pl->n - 1, nonce, pl->prev_hello);
    send_all(prev_fd, &b);
    fiber_buf_free(&b);
    if (pl->prev_hello != HF_NONE) {
        /* Rank 0 drops it and waits for another; leaving tells it rank 1
         * is gone, so it does not wait for its timeout. */
        close(next_fd);
        next_fd = -1;
        goto out;
    }
    put_hello_as(&b, 1, nonce, pl->next_hello);
    send_all(next_fd, &b);
    fiber_buf_free(&b);
    if (pl->next_hello != HF_NONE || !read_hello(prev_fd, nonce))
        goto out;
    wait_flag(hp, &hp->joined);
    /* Every piece of every call, then the end of the stream. */
    for (int k = 0; k < pl->n_calls; k++) {
        const struct call *c = &pl->calls[k];
        fiber_buf s = {0};
        stream_for(pl, k, &s);
        if (c->fault && s.len > 0) {
            size_t at = (c->fault * 7u) % (s.len < HDR_LEN ? s.len : HDR_LEN);
            s.data[at] ^= (uint8_t)(1u << (c->fault % 8));
        }
        if (c->cut && s.len > 0)
            s.len -= 1 + c->cut % s.len;
        if (c->stray)
            fz_w_u8(&s, 0x5a);
        pthread_mutex_lock(&hp->mu);
        hp->calls_ok[k] = !c->fault && !c->cut && !c->stray;
        pthread_mutex_unlock(&hp->mu);
        send_all(prev_fd, &s);
        fiber_buf_free(&s);
        if (!hp->calls_ok[k])
            break; /* rank 0 fails here: nothing more will be read */
    }
    shutdown(prev_fd, SHUT_WR);
    /* Drain what rank 0 sends to rank 1 until its calls are over. */
    for (;;) {
        pthread_mutex_lock(&hp->mu);
        int done = hp->done;
        pthread_mutex_unlock(&hp->mu);
        if (done)
            break;
        char buf[65536];
        struct pollfd pf = {.fd = next_fd, .events = POLLIN};
        if (poll(&pf, 1, 2) > 0 && recv(next_fd, buf, sizeof buf, 0) == 0)
            break;
    }
out:
    wait_flag(hp, &hp->done);
    for (int i = 0; i < n_hostile; i++)
        close(hostile_fd[i]);
    if (prev_fd >= 0)
        close(prev_fd);
    if (next_fd >= 0)
        close(next_fd);
    return NULL;
}

/* ---- reading the plan ------------------------------------------------------ */

static void read_plan(struct fz_in *in, struct plan *pl)
{
    memset(pl, 0, sizeof *pl);
    uint8_t conf = fz_u8(in);
    pl->n = 2 + conf % 3;
    pl->n_hostile = (conf >> 2) % 4 == 3 ? fz_u8(in) % (MAX_HOSTILE + 1) : 0;
    for (int i = 0; i < pl->n_hostile; i++)
        pl->hostile[i] = (enum hostile)(fz_u8(in) % X_COUNT);
    uint8_t hs = fz_u8(in);
    pl->prev_hello = hs % 16 < HF_COUNT - 1 ? (enum hello_fault)(hs % 16 + 1)
                                            : HF_NONE;
    pl->next_hello = (hs >> 4) < HF_COUNT - 1
                         ? (enum hello_fault)((hs >> 4) + 1)
                         : HF_NONE;
    while (fz_more(in) && pl->n_calls < MAX_CALLS) {
        struct call *c = &pl->calls[pl->n_calls++];
        uint8_t what = fz_u8(in);
        c->bcast = what & 1;
        c->dtype = what & 2 ? FIBER_FLOAT64 : FIBER_FLOAT32;
        c->op = 1 + (what >> 2) % 3;
        c->root = (what >> 4) % pl->n;
        c->count = fz_u8(in) % MAX_COUNT;
        c->seed = fz_u8(in);
        uint8_t f = fz_u8(in);
        c->fault = f >= 0xf0 ? (uint8_t)(f - 0xef) : 0;
        c->cut = f >= 0xe0 && f < 0xe8 ? f - 0xdf : 0;
        c->stray = f == 0xe8;
    }
}

/* ---- one input ---------------------------------------------------------------- */

static int run_call(fiber_ring *r, const struct plan *pl, int k)
{
    const struct call *c = &pl->calls[k];
    if (c->bcast) {
        uint8_t data[MAX_COUNT];
        for (size_t i = 0; i < c->count; i++)
            data[i] = (uint8_t)(0xa0 + i);
        int rc = fiber_ring_broadcast(r, data, c->count, c->root, TIMEOUT_MS);
        if (rc == 0)
            for (size_t i = 0; i < c->count; i++) {
                uint8_t want = mod(-c->root, pl->n) == 0
                                   ? (uint8_t)(0xa0 + i)
                                   : (uint8_t)(c->seed + i * 3);
                FZ_REQUIRE(data[i] == want, "broadcast byte %zu: %u, want %u",
                           i, data[i], want);
            }
        return rc;
    }
    double want[MAX_COUNT], got[MAX_COUNT];
    float f32[MAX_COUNT];
    for (size_t i = 0; i < c->count; i++) {
        got[i] = my_value(i);
        f32[i] = (float)my_value(i);
    }
    int rc = fiber_ring_allreduce(r, c->dtype == FIBER_FLOAT32 ? (void *)f32
                                                             : (void *)got,
                                  c->count, c->dtype, c->op, TIMEOUT_MS);
    if (rc != 0)
        return rc;
    expect_allreduce(pl, c, want);
    for (size_t i = 0; i < c->count; i++) {
        if (c->dtype == FIBER_FLOAT32) {
            float w = (float)want[i];
            FZ_REQUIRE(!memcmp(&w, &f32[i], 4) || (isnan(w) && isnan(f32[i])),
                       "allreduce element %zu: %g, want %g", i, f32[i], w);
        } else {
            FZ_REQUIRE(!memcmp(&want[i], &got[i], 8) ||
                           (isnan(want[i]) && isnan(got[i])),
                       "allreduce element %zu: %g, want %g", i, got[i],
                       want[i]);
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fz_setup();
    struct fz_in in = {data, size};
    struct plan pl;
    read_plan(&in, &pl);

    struct fb_objsrv *srv;
    char want[600];
    snprintf(want, sizeof want, "unix:%s/ringsrv.sock", dir);
    FZ_REQUIRE(fb_objsrv_start(&srv, want, fb_rt_token(), fb_rt_build_id(),
                               1) == 0,
               "object server: %s", fiber_last_error());
    const char *addr = fb_objsrv_address(srv);
    struct fb_oclient *c;
    FZ_REQUIRE(fb_oclient_get(addr, fb_rt_token(), &c) == 0, "client: %s",
               fiber_last_error());
    uint32_t members = (uint32_t)pl.n, obj;
    fiber_iov param = {&members, 4};
    FZ_REQUIRE(fb_oopen(c, "rendezvous", "ring", &param, 1, &obj) == 0,
               "rendezvous: %s", fiber_last_error());

    struct helper hp = {.pl = &pl, .l1_fd = -1};
    pthread_mutex_init(&hp.mu, NULL);
    pthread_cond_init(&hp.cond, NULL);
    char l1[600];
    snprintf(l1, sizeof l1, "unix:%s/peer1.sock", dir);
    FZ_REQUIRE(fb_sock_listen(l1, 16, &hp.l1_fd, hp.l1_addr,
                              sizeof hp.l1_addr) == 0,
               "listen: %s", fiber_last_error());
    /* Rank 0 listens beside the server's socket (ring.c's rule). */
    snprintf(hp.r0_addr, sizeof hp.r0_addr, "unix:%s/ring%u.0.%ld", dir, obj,
             (long)getpid());
    for (int r = 1; r < pl.n; r++) {
        char other[64];
        snprintf(other, sizeof other, "unix:/nonexistent/ring-%d", r);
        const char *a = r == 1 ? hp.l1_addr : other;
        uint32_t rank = (uint32_t)r;
        fiber_iov items[2] = {{&rank, 4}, {a, strlen(a)}};
        FZ_REQUIRE(fb_ocall_async(c, obj, RDV_JOIN, -1, items, 2,
                                  &hp.joins[r - 1]) == 0,
                   "JOIN: %s", fiber_last_error());
    }
    pthread_t t;
    FZ_REQUIRE(pthread_create(&t, NULL, helper_main, &hp) == 0, "thread");

    fiber_buf ser = {0};
    fb_handle_encode(&ser, FB_HANDLE_RING, addr, fb_rt_token(), obj,
                     (uint32_t)pl.n);
    fiber_ring *r = NULL;
    int rc = fiber_ring_join(&r, ser.data, ser.len, 0, TIMEOUT_MS);
    fiber_buf_free(&ser);
    int hellos_ok = pl.prev_hello == HF_NONE && pl.next_hello == HF_NONE;
    if (fz_trace())
        fprintf(stderr, "ring: %d members, join: %s %s\n", pl.n,
                fiber_errname(rc), rc ? fiber_last_error() : "");
    FZ_REQUIRE((rc == 0) == hellos_ok, "join: %s (%s), HELLOs %s",
               fiber_errname(rc), rc ? fiber_last_error() : "",
               hellos_ok ? "right" : "wrong");
    FZ_REQUIRE(rc == 0 || (rc < 0 && strcmp(fiber_errname(rc), "FIBER_E?")),
               "join returned %d", rc);
    pthread_mutex_lock(&hp.mu);
    hp.joined = 1;
    pthread_cond_broadcast(&hp.cond);
    pthread_mutex_unlock(&hp.mu);
    int broken = 0;
    for (int k = 0; rc == 0 && k < pl.n_calls; k++) {
        int crc = run_call(r, &pl, k);
        if (fz_trace())
            fprintf(stderr, "ring: call %d (%s, %zu): %s %s\n", k,
                    pl.calls[k].bcast ? "broadcast" : "allreduce",
                    pl.calls[k].count, fiber_errname(crc),
                    crc ? fiber_last_error() : "");
        if (broken) {
            FZ_REQUIRE(crc == FIBER_ESTATE, "a call on a broken ring: %s",
                       fiber_errname(crc));
            continue;
        }
        /* The helper wrote call k before rank 0 could read it: calls_ok
         * is set by then. */
        pthread_mutex_lock(&hp.mu);
        int ok = hp.calls_ok[k];
        pthread_mutex_unlock(&hp.mu);
        if (ok)
            FZ_REQUIRE(crc == 0, "call %d failed: %s", k, fiber_last_error());
        else
            FZ_REQUIRE(crc == FIBER_EPROTO || crc == FIBER_ECLOSED ||
                           crc == 0,
                       "call %d with broken pieces: %s", k,
                       fiber_errname(crc));
        broken = crc != 0;
    }
    pthread_mutex_lock(&hp.mu);
    hp.done = 1;
    pthread_cond_broadcast(&hp.cond);
    pthread_mutex_unlock(&hp.mu);
    pthread_join(t, NULL);

    fiber_ring_free(r);
    for (int i = 0; i < pl.n - 1; i++)
        fiber_future_free(hp.joins[i]);
    fb_oclient_release(c);
    fb_objsrv_stop(srv);
    close(hp.l1_fd);
    unlink(hp.l1_addr + 5);
    pthread_mutex_destroy(&hp.mu);
    pthread_cond_destroy(&hp.cond);
    return 0;
}

/* ---- seeds ---------------------------------------------------------------- */

static void w_call(fiber_buf *b, int bcast, int f64, int op, int root,
                   int count, int seed, int fault)
{
    fz_w_u8(b, bcast | f64 << 1 | (op - 1) << 2 | root << 4);
    fz_w_u8(b, count);
    fz_w_u8(b, seed);
    fz_w_u8(b, fault);
}

void fuzz_write_seeds(const char *dir)
{
    fiber_buf b = {0};
    fz_w_u8(&b, 0); /* two members */
    fz_w_u8(&b, 0xff); /* both HELLOs right */
    w_call(&b, 0, 0, FIBER_SUM, 0, 10, 1, 0);
    w_call(&b, 0, 1, FIBER_MEAN, 0, 7, 2, 0);
    w_call(&b, 0, 0, FIBER_MAX, 0, 5, 0xff, 0);
    w_call(&b, 1, 0, 1, 1, 9, 3, 0);
    w_call(&b, 1, 0, 1, 0, 4, 3, 0);
    w_call(&b, 0, 0, FIBER_SUM, 0, 0, 1, 0);
    fz_seed(dir, "two_members", &b);

    fz_w_u8(&b, 2); /* four members */
    fz_w_u8(&b, 0xff);
    w_call(&b, 0, 1, FIBER_SUM, 0, 13, 5, 0);
    w_call(&b, 0, 0, FIBER_MEAN, 0, 3, 6, 0);
    w_call(&b, 1, 0, 1, 2, 20, 7, 0);
    w_call(&b, 1, 0, 1, 3, 1, 7, 0);
    fz_seed(dir, "four_members", &b);

    fz_w_u8(&b, 1 | 3 << 2); /* three members, strangers first */
    fz_w_u8(&b, 9);
    for (int i = 0; i < 9; i++)
        fz_w_u8(&b, i);
    fz_w_u8(&b, 0xff);
    w_call(&b, 0, 0, FIBER_SUM, 0, 6, 9, 0);
    fz_seed(dir, "strangers_at_the_door", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 0xff);
    w_call(&b, 0, 0, FIBER_SUM, 0, 8, 1, 0xf3); /* a broken header */
    w_call(&b, 0, 0, FIBER_SUM, 0, 8, 1, 0);
    fz_seed(dir, "broken_header", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 0xff);
    w_call(&b, 1, 0, 1, 1, 30, 1, 0xe2); /* cut short */
    fz_seed(dir, "cut_short", &b);

    fz_w_u8(&b, 1);
    fz_w_u8(&b, 0xff);
    w_call(&b, 0, 1, FIBER_MAX, 0, 5, 4, 0xe8); /* a stray byte */
    w_call(&b, 0, 1, FIBER_MAX, 0, 5, 4, 0);
    fz_seed(dir, "stray_byte", &b);

    for (int f = 0; f < 4; f++) {
        char name[32];
        fz_w_u8(&b, 0);
        fz_w_u8(&b, 0xf0 | f); /* prev HELLO wrong */
        snprintf(name, sizeof name, "bad_prev_hello_%d", f);
        fz_seed(dir, name, &b);
        fz_w_u8(&b, 0);
        fz_w_u8(&b, f << 4 | 0xf); /* next HELLO wrong */
        snprintf(name, sizeof name, "bad_next_hello_%d", f);
        fz_seed(dir, name, &b);
    }
    fiber_buf_free(&b);
}
