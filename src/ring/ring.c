/*
 * ring.c -- fiber_ring: N processes in a ring, for collectives over float
 * arrays (allreduce, broadcast), the building block of data-parallel
 * training.
 *
 * Forming a ring.  The master creates a rendezvous object on its object server
 * (ring_rdv.c; its operations are ring_ops.h).  Each member opens a listening
 * socket of its own, then JOINs the rendezvous with its rank and address.  A
 * JOIN is parked on the server until all N ranks are in; then every member is
 * answered with every member's address and the ring's random nonce.  A member
 * dials the next rank and accepts the previous one, and each end of each link
 * proves itself with a HELLO (wire.h) carrying the run's token, the program's
 * build id, the nonce (which ring) and the sender's rank ("ring-3").  A stray
 * or hostile peer on a member's socket waits in the join's gate (net/gate.h)
 * and is dropped without disturbing the ring, and the listener is closed once
 * both links are up.
 *
 * The links carry data one way: rank r writes only to its "next" link (to
 * r+1) and reads only from its "prev" link (from r-1).  Each step of a
 * collective sends one block to next while receiving one from prev, both
 * at once on non-blocking sockets under one poll(): with a blocking
 * send-then-receive, every member would wait in send once the socket
 * buffers fill, and the ring would deadlock on any array larger than them.
 * Blocks travel in pieces of at most PIECE bytes, each behind a 32-byte
 * header naming the collective, its sequence number, step, size and piece;
 * a receiver checks every header against what it expects, so members that
 * make different calls fail with FIBER_EPROTO instead of reducing garbage.
 * Pieces also bound the receive buffer of a reduction to PIECE bytes.
 *
 * Allreduce is the ring algorithm: the array is cut into N chunks; in N-1
 * reduce-scatter steps each member passes a chunk on and adds the chunk it
 * receives into its own, so that afterwards member r holds chunk r+1
 * reduced over all members; in N-1 all-gather steps those finished chunks
 * travel round the ring.  Each member sends and receives 2(N-1)/N times
 * the array, whatever N.  Each chunk is reduced along one path and then
 * copied, so every member ends with bitwise identical results.
 *
 * Failure.  A member that dies has both its links closed by the kernel; a
 * member whose call fails (a link ended, a timeout, a protocol error)
 * closes both of its own at once.  Its neighbours then fail in turn, so a
 * failure travels round the ring in both directions and every member's
 * current or next call returns an error instead of waiting forever.  A
 * link that ends while this member does not need it (a neighbour that did
 * its part of the last collective and left) fails nothing by itself: it is
 * remembered, and the first call that needs that link fails.  Breaking the
 * ring there instead would fail, say, the last member of a broadcast
 * whose root had already left, though that member needs only its prev.
 * A failed ring stays broken: later calls fail with FIBER_ESTATE.
 *
 * Threads: ring.c has none.  The rendezvous (ring_rdv.c) runs in the
 * object server's thread; a member's calls run in the caller's thread,
 * one at a time per handle.
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/common.h"
#include "base/endian.h"
#include "base/log.h"
#include "net/gate.h"
#include "objsrv/objsrv.h"
#include "ring/ring_ops.h"
#include "runtime/runtime.h"

#define RING_MAGIC 0x52494e47u /* "RING" */
#define PIECE (1u << 20)      /* payload bytes behind one header */
#define HDR_LEN 32u
#define HDR_MAGIC 0x47524246u /* "FBRG" as little-endian bytes */
#define MAX_CANDIDATES 8      /* unproven connections held while joining */
#define LISTEN_BACKLOG 16

enum { K_SCATTER = 1, K_GATHER = 2, K_BCAST = 3 };

/* ==== handles ============================================================ */

struct fiber_ring {
    uint32_t magic;
    int n;
    int rank;                 /* -1 on the creator's handle */
    char addr[FB_RING_ADDR_MAX]; /* the object server holding the
                                    rendezvous */
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj;
    struct fb_conn next, prev; /* our links (fd -1 when closed): conns,
                                  so that an encrypted link keeps its
                                  keys after the HELLOs */
    int next_gone, prev_gone; /* the neighbour closed its end (it left
                                 or died) while we did not need it */
    uint32_t seq;             /* collectives started, for the headers */
    int busy;                 /* a call is running */
    int failed;               /* the first failure's code; 0 while whole */
    char why[512];            /* and its message */
    unsigned char *scratch;   /* PIECE bytes: reduce-scatter's receipts */
};

static unsigned long ring_seq;

static int check_ring(const fiber_ring *r)
{
    if (!r || r->magic != RING_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_ring handle");
    return 0;
}

static int ring_alloc(fiber_ring **out, const char *addr,
                      const uint8_t *token, uint32_t obj, int n, int rank)
{
    fiber_ring *r = calloc(1, sizeof *r);
    if (!r)
        return fb_err(FIBER_ENOMEM, "out of memory");
    r->magic = RING_MAGIC;
    r->n = n;
    r->rank = rank;
    fb_strlcpy(r->addr, addr, sizeof r->addr);
    memcpy(r->token, token, FB_WIRE_TOKEN_LEN);
    r->obj = obj;
    fb_conn_init(&r->next, -1, FB_GATE_HELLO_MAX);
    fb_conn_init(&r->prev, -1, FB_GATE_HELLO_MAX);
    *out = r;
    return 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Breaks the ring: closing both links at once is what tells the
 * neighbours, and through them every member. */
static void ring_break(fiber_ring *r, int code, const char *why)
{
    if (!r->failed) {
        r->failed = code;
        fb_strlcpy(r->why, why, sizeof r->why);
    }
    fb_conn_close(&r->next);
    fb_conn_close(&r->prev);
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* ==== joining: listening, the rendezvous, and the two links ============== */

/* The state of one fiber_ring_join. */
struct joining {
    uint64_t deadline;
    int listen_fd;
    char bound[FB_RING_ADDR_MAX]; /* our listening address */
    uint64_t nonce;
    char next_addr[FB_RING_ADDR_MAX];
    struct fb_conn next; /* the link we dialed, during its handshake */
};

/* Picks where this member listens: beside the object server's unix socket
 * (the run directory, which only this user can enter; children do not know
 * the run directory, but the server's address names it), or on the
 * configured listen_host when the run uses TCP. */
static int listen_address(const fiber_ring *r, char *out, size_t size)
{
    if (strncmp(r->addr, "tcp:", 4) == 0) {
        snprintf(out, size, "tcp:%s:0", fb_rt_config()->listen_host);
        return 0;
    }
    const char *path = r->addr + 5;
    const char *slash = strrchr(path, '/');
    if (strncmp(r->addr, "unix:", 5) != 0 || !slash)
        return fb_err(FIBER_EINVAL, "cannot place a ring socket beside %s",
                      r->addr);
    int k = snprintf(out, size, "unix:%.*s/ring%u.%d.%ld",
                     (int)(slash - path), path, r->obj, r->rank,
                     (long)getpid());
    if (k < 0 || (size_t)k >= size)
        return fb_err(FIBER_EINVAL, "ring socket path is too long");
    return 0;
}

static int start_listening(const fiber_ring *r, struct joining *j)
{
    char want[FB_RING_ADDR_MAX];
    int rc = listen_address(r, want, sizeof want);
    if (rc == 0)
        rc = fb_sock_listen(want, LISTEN_BACKLOG, &j->listen_fd, j->bound,
                            sizeof j->bound);
    return rc;
}

static void stop_listening(struct joining *j)
{
    if (j->listen_fd < 0)
        return;
    close_fd(&j->listen_fd);
    if (strncmp(j->bound, "unix:", 5) == 0)
        unlink(j->bound + 5);
}

/* Takes the nonce and the next member's address out of the JOIN reply. */
static int read_reply(const fiber_ring *r, struct joining *j,
                      const struct fb_oresult *res)
{
    const void *d;
    size_t len;
    if (res->count != (uint32_t)r->n + 1 ||
        fb_oresult_item(res, 0, &d, &len) != 0 || len != 8)
        return fb_err(FIBER_EPROTO, "the rendezvous answered JOIN badly");
    memcpy(&j->nonce, d, 8);
    fb_oresult_item(res, 1 + (uint32_t)mod(r->rank + 1, r->n), &d, &len);
    if (len >= sizeof j->next_addr)
        return fb_err(FIBER_EPROTO, "the rendezvous sent a bad address");
    memcpy(j->next_addr, d, len);
    j->next_addr[len] = '\0';
    return 0;
}

/* JOINs the rendezvous: waits on the server until every rank is in. */
static int rendezvous(const fiber_ring *r, struct joining *j)
{
    struct fb_oclient *c;
    int rc = fb_oclient_get(r->addr, r->token, &c);
    if (rc)
        return rc;
    uint32_t rank = (uint32_t)r->rank;
    fiber_iov items[2] = {{&rank, 4}, {j->bound, strlen(j->bound)}};
    struct fb_oresult res = {0};
    rc = fb_ocall(c, r->obj, FB_RDV_JOIN, fb_ms_left(j->deadline), items, 2,
                  &res);
    fb_oclient_release(c);
    if (rc == 0)
        rc = read_reply(r, j, &res);
    else if (rc == FIBER_ETIMEDOUT) {
        char text[300];
        fb_strlcpy(text, fiber_last_error(), sizeof text);
        rc = fb_err(rc, "ring rank %d: the ring did not form in time: %s",
                    r->rank, text);
    }
    fb_oresult_free(&res);
    return rc;
}

static int put_hello(const fiber_ring *r, uint64_t nonce, fiber_buf *out)
{
    char name[32];
    snprintf(name, sizeof name, "ring-%d", r->rank);
    const char *bid = fb_rt_build_id();
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .job_id = nonce,
                             .pid = (uint32_t)getpid(),
                             .name = name,
                             .name_len = (uint8_t)strlen(name)};
    memcpy(h.token, r->token, sizeof h.token);
    return fb_wire_put_hello(out, &h);
}

/* Says in why what is wrong with m, a HELLO with the run's token and
 * build id, for rank want of this ring; returns 0 when nothing is. */
static int ring_hello_problem(uint64_t nonce, int want,
                              const struct fb_msg_hello *m, char *why,
                              size_t size)
{
    char name[32];
    snprintf(name, sizeof name, "ring-%d", want);
    if (m->job_id != nonce)
        snprintf(why, size, "it belongs to another ring");
    else if (m->name_len != strlen(name) ||
             memcmp(m->name, name, m->name_len) != 0)
        snprintf(why, size, "it is %.*s, not %s", (int)m->name_len, m->name,
                 name);
    else
        return 0;
    return -1;
}

/* Says in why what is wrong with a frame that should be rank want's HELLO
 * for this ring: the run's token and build id (fb_hello_check), then the
 * nonce (which ring) and the name ("ring-R").  Returns 0 when nothing
 * is. */
static int hello_problem(const fiber_ring *r, uint64_t nonce, int want,
                         const struct fb_wire_hdr *h, const uint8_t *p,
                         char *why, size_t size)
{
    struct fb_msg_hello m;
    if (fb_hello_check(h, p, r->token, fb_rt_build_id(), &m, why, size) !=
        FB_HELLO_OK)
        return -1;
    return ring_hello_problem(nonce, want, &m, why, size);
}

/* Moves a conn whose HELLOs are done to link, which from then on carries
 * the ring's own framing (fb_conn_sendv, fb_conn_recv_bytes).  A byte
 * beyond the HELLO would be data that framing never saw, so it is an
 * error (and a peer that sent it is confused). */
static int adopt_link(struct fb_conn *c, struct fb_conn *link)
{
    if (fb_conn_buffered(c) != 0)
        return fb_err(FIBER_EPROTO, "a ring peer sent data before it was "
                                    "answered");
    fb_conn_close(link);
    fb_conn_move(link, c);
    fb_conn_init(c, -1, FB_GATE_HELLO_MAX);
    return 0;
}

/* Dials the next rank and sends our HELLO; its answer is read later, in
 * await_next, so that no member waits on another before accepting.  On
 * an encrypted link the HELLO can only be sealed once the next rank has
 * accepted us and sent its key: find_prev and await_next send it then. */
static int dial_next(const fiber_ring *r, struct joining *j)
{
    int fd;
    int rc = fb_sock_dial(j->next_addr, j->deadline, &fd);
    if (rc == FIBER_EUNREACHABLE) {
        char text[300];
        fb_strlcpy(text, fiber_last_error(), sizeof text);
        return fb_err(FIBER_ECLOSED, "ring rank %d: rank %d left before the "
                      "ring was linked: %s", r->rank, mod(r->rank + 1, r->n),
                      text);
    }
    if (rc)
        return rc;
    fb_conn_init(&j->next, fd, FB_GATE_HELLO_MAX);
    rc = fb_conn_secure_for(&j->next, j->next_addr, FB_SEC_CLIENT, r->token);
    if (rc == 0)
        rc = put_hello(r, j->nonce, fb_conn_out(&j->next));
    if (rc == 0 && fb_conn_flush(&j->next) < 0)
        rc = fb_err(FIBER_ECLOSED, "ring rank %d: cannot greet rank %d: %s",
                    r->rank, mod(r->rank + 1, r->n), fb_conn_err(&j->next));
    return rc;
}

/* Reads the next rank's answering HELLO and keeps the link. */
static int await_next(fiber_ring *r, struct joining *j)
{
    struct fb_wire_hdr h;
    const uint8_t *p;
    int want = mod(r->rank + 1, r->n);
    int rc = fb_conn_flush_wait(&j->next, j->deadline);
    if (rc == FIBER_ETIMEDOUT)
        return fb_err(rc, "ring rank %d: rank %d did not answer in time",
                      r->rank, want);
    if (rc)
        return fb_err(rc == FIBER_EPROTO ? rc : FIBER_ECLOSED,
                      "ring rank %d: cannot greet rank %d: %s", r->rank,
                      want, fb_conn_err(&j->next));
    rc = fb_conn_recv_wait(&j->next, &h, &p, j->deadline);
    if (rc == FIBER_ETIMEDOUT)
        return fb_err(rc, "ring rank %d: rank %d did not answer in time",
                      r->rank, want);
    if (rc != 1)
        return fb_err(rc == FIBER_EPROTO ? rc : FIBER_ECLOSED,
                      "ring rank %d: rank %d did not answer: %s", r->rank,
                      want, fb_conn_err(&j->next));
    char why[512];
    if (hello_problem(r, j->nonce, want, &h, p, why, sizeof why) != 0)
        return fb_err(FIBER_EAUTH, "ring rank %d: the peer at %s is not "
                      "rank %d: %s", r->rank, j->next_addr, want, why);
    return adopt_link(&j->next, &r->next);
}

/* A connection on our socket that has not yet proved who it is: it waits
 * in the join's gate (net/gate.h): at most MAX_CANDIDATES at once, each
 * for connect_timeout_ms. */
struct cand {
    struct fb_conn conn;
    struct fb_gate_peer peer;
};

static struct cand *cand_of(struct fb_gate_peer *p)
{
    return (struct cand *)((char *)p - offsetof(struct cand, peer));
}

/* The gate's close function. */
static void cand_close(struct fb_gate_peer *p, void *arg)
{
    (void)arg;
    struct cand *c = cand_of(p);
    fb_conn_close(&c->conn);
    free(c);
}

/* Reads what candidate c sent.  Returns 1 when it is the previous rank, 0
 * while it has not said enough, -1 after dropping it. */
static int cand_serve(const fiber_ring *r, const struct joining *j,
                      struct fb_gate *g, struct cand *c)
{
    struct fb_msg_hello m;
    int rc = fb_gate_serve(g, &c->peer, r->token, fb_rt_build_id(), &m);
    if (rc != 1)
        return rc;
    char why[200];
    if (ring_hello_problem(j->nonce, mod(r->rank - 1, r->n), &m, why,
                           sizeof why) == 0)
        return 1;
    fb_gate_reject(g, &c->peer, why);
    return -1;
}

/* Accepts what is pending, reading each newcomer at once: the previous
 * rank sends its HELLO as soon as it connects, so it is recognised before
 * a flood of other connections could push it out. */
static struct cand *cand_accept(const fiber_ring *r, const struct joining *j,
                                struct fb_gate *g)
{
    int fd;
    while (fb_sock_accept(j->listen_fd, &fd) == 0) {
        struct cand *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        fb_conn_init(&c->conn, fd, FB_GATE_HELLO_MAX);
        if (fb_conn_secure_for(&c->conn, j->bound, FB_SEC_SERVER,
                               r->token) != 0) {
            fb_log_warn("ring: dropping peer on fd %d: %s", fd,
                        fiber_last_error());
            fb_conn_close(&c->conn);
            free(c);
            continue;
        }
        fb_gate_add(g, &c->peer, &c->conn);
        if (cand_serve(r, j, g, c) == 1)
            return c;
    }
    return NULL;
}

/* One round after poll: serves the n candidates cs that stirred and
 * accepts newcomers (last: making room closes candidates).  Returns the
 * previous rank's candidate, or NULL. */
static struct cand *cand_round(const fiber_ring *r, const struct joining *j,
                               struct fb_gate *g, struct cand **cs, int n,
                               const struct pollfd *pf)
{
    for (int i = 0; i < n; i++)
        if (pf[1 + i].revents && cand_serve(r, j, g, cs[i]) == 1)
            return cs[i];
    return pf[0].revents ? cand_accept(r, j, g) : NULL;
}

/* Waits for the previous rank among whatever connects to our socket.  The
 * link we dialed is watched too: if the next member fails its own join it
 * closes that link, and failing here as well passes the news on even when
 * the previous rank will never come and there is no timeout. */
static int find_prev(const fiber_ring *r, struct joining *j,
                     struct fb_gate *g, struct cand **won)
{
    *won = NULL;
    while (!*won) {
        uint64_t now = fb_now_ms();
        uint64_t next = fb_gate_tick(g, now); /* drops the late */
        struct pollfd pf[2 + MAX_CANDIDATES];
        struct cand *cs[MAX_CANDIDATES];
        int n = 0;
        pf[0] = (struct pollfd){.fd = j->listen_fd, .events = POLLIN};
        for (struct fb_gate_peer *p = g->oldest; p && n < MAX_CANDIDATES;
             p = p->newer, n++) {
            cs[n] = cand_of(p);
            pf[1 + n] = (struct pollfd){.fd = fb_conn_fd(&cs[n]->conn),
                                        .events = POLLIN};
        }
        /* Our HELLO to next may still wait for its key (encryption). */
        pf[1 + n] = (struct pollfd){
            .fd = fb_conn_fd(&j->next),
            .events = (short)(POLLRDHUP | fb_conn_wait_events(&j->next))};
        int wait = fb_ms_left(j->deadline);
        if (next != UINT64_MAX && (wait < 0 || next - now < (uint64_t)wait))
            wait = (int)(next - now);
        int k = poll(pf, (nfds_t)(2 + n), wait);
        if (k == 0 && fb_ms_left(j->deadline) == 0)
            return fb_err(FIBER_ETIMEDOUT, "ring rank %d: rank %d did not "
                          "connect in time", r->rank, mod(r->rank - 1, r->n));
        if (k < 0 && errno != EINTR)
            return fb_err_errno(FIBER_ESYS, "poll");
        short next_ev = k > 0 ? pf[1 + n].revents : 0;
        if ((next_ev & (POLLIN | POLLOUT)) && fb_conn_flush(&j->next) < 0)
            return fb_err(FIBER_ECLOSED, "ring rank %d: cannot greet rank "
                          "%d: %s", r->rank, mod(r->rank + 1, r->n),
                          fb_conn_err(&j->next));
        if (next_ev & (POLLRDHUP | POLLHUP | POLLERR))
            return fb_err(FIBER_ECLOSED, "ring rank %d: rank %d left while "
                          "the ring was being linked", r->rank,
                          mod(r->rank + 1, r->n));
        if (k > 0)
            *won = cand_round(r, j, g, cs, n, pf);
    }
    return 0;
}

/* Accepts the previous rank, answers its HELLO and keeps the link. */
static int accept_prev(fiber_ring *r, struct joining *j)
{
    struct fb_gate g;
    fb_gate_init(&g, "ring", MAX_CANDIDATES, 0, cand_close, NULL);
    struct cand *won;
    int rc = find_prev(r, j, &g, &won);
    if (rc == 0)
        rc = put_hello(r, j->nonce, fb_conn_out(&won->conn));
    if (rc == 0 && fb_conn_flush_wait(&won->conn, j->deadline) != 0)
        rc = fb_err(FIBER_ECLOSED, "ring rank %d: cannot answer rank %d: %s",
                    r->rank, mod(r->rank - 1, r->n), fb_conn_err(&won->conn));
    if (rc == 0) {
        fb_gate_admit(&g, &won->peer);
        rc = adopt_link(&won->conn, &r->prev);
        fb_conn_close(&won->conn); /* empty, unless adopting failed */
        free(won);
    }
    fb_gate_clear(&g);
    return rc;
}

static int link_up(fiber_ring *r, struct joining *j)
{
    int rc = dial_next(r, j);
    if (rc == 0)
        rc = accept_prev(r, j);
    if (rc == 0)
        rc = await_next(r, j);
    return rc;
}

/* ==== moving data ======================================================= */

typedef void (*reduce_fn)(void *acc, const void *in, size_t n);

/* What every header of one step carries besides its piece. */
struct call_id {
    uint8_t kind, dtype, op;
    uint32_t seq, step;
    uint64_t total; /* bytes of the caller's whole array */
};

/* One direction of one step: a block sent to next or received from prev,
 * in pieces of at most PIECE bytes (at least one piece, even when empty,
 * so that every step checks that both ends agree). */
struct xfer {
    unsigned char *buf;     /* payload source, or destination */
    size_t len;             /* payload bytes of the block */
    size_t moved;           /* payload bytes sent or received so far */
    uint32_t piece, pieces; /* the current piece; how many in all */
    size_t piece_off;       /* payload bytes of the current piece moved */
    uint8_t hdr[HDR_LEN];
    size_t hdr_off;         /* header bytes of the current piece moved */
    const size_t *limit;    /* send: bytes of buf ready (NULL: all) */
    reduce_fn reduce;       /* receive: NULL to store, else add into buf */
    unsigned char *scratch; /* where a piece to add is received */
    size_t elsize;
    int blocked;            /* send: the socket is full */
};

static void xfer_init(struct xfer *x, unsigned char *buf, size_t len,
                      size_t elsize)
{
    memset(x, 0, sizeof *x);
    x->buf = buf;
    x->len = len;
    x->pieces = len ? (uint32_t)((len + PIECE - 1) / PIECE) : 1;
    x->elsize = elsize;
}

static int xfer_done(const struct xfer *x)
{
    return !x || x->piece == x->pieces;
}

static size_t piece_len(const struct xfer *x)
{
    size_t start = (size_t)x->piece * PIECE;
    return x->len - start < PIECE ? x->len - start : PIECE;
}

static void hdr_encode(uint8_t *h, const struct call_id *id, uint32_t piece,
                       size_t plen)
{
    fb_put_le32(h, HDR_MAGIC);
    h[4] = id->kind;
    h[5] = id->dtype;
    h[6] = id->op;
    h[7] = 0;
    fb_put_le32(h + 8, id->seq);
    fb_put_le32(h + 12, id->step);
    fb_put_le64(h + 16, id->total);
    fb_put_le32(h + 24, (uint32_t)plen);
    fb_put_le32(h + 28, piece);
}

/* Explains a header that is not the one expected. */
static int hdr_mismatch(const fiber_ring *r, const uint8_t *got,
                        const uint8_t *want)
{
    int prev = mod(r->rank - 1, r->n);
    if (fb_get_le32(got) != HDR_MAGIC)
        return fb_err(FIBER_EPROTO, "ring rank %d: rank %d sent bytes that "
                      "are not ring data", r->rank, prev);
    if (memcmp(got + 4, want + 4, 3) != 0 || fb_get_le32(got + 8) != fb_get_le32(want + 8))
        return fb_err(FIBER_EPROTO, "ring rank %d: rank %d is in another "
                      "collective (kind %u, type %u, op %u, call %u; we are "
                      "in %u, %u, %u, %u): every member must make the same "
                      "calls in the same order", r->rank, prev, got[4],
                      got[5], got[6], fb_get_le32(got + 8), want[4], want[5],
                      want[6], fb_get_le32(want + 8));
    if (fb_get_le64(got + 16) != fb_get_le64(want + 16))
        return fb_err(FIBER_EPROTO, "ring rank %d: rank %d called with %llu "
                      "bytes, we with %llu", r->rank, prev,
                      (unsigned long long)fb_get_le64(got + 16),
                      (unsigned long long)fb_get_le64(want + 16));
    return fb_err(FIBER_EPROTO, "ring rank %d: rank %d is out of step "
                  "(step %u piece %u, want step %u piece %u; a different "
                  "root?)", r->rank, prev, fb_get_le32(got + 12), fb_get_le32(got + 28),
                  fb_get_le32(want + 12), fb_get_le32(want + 28));
}

/* A link failed in send or recv (to_next says which) with errno err. */
static int link_error(const fiber_ring *r, int to_next, int err)
{
    const char *dir = to_next ? "to" : "from";
    int peer = mod(r->rank + (to_next ? 1 : -1), r->n);
    if (err == EPIPE || err == ECONNRESET)
        return fb_err(FIBER_ECLOSED, "ring rank %d: the link %s rank %d "
                      "closed: a member died or failed", r->rank, dir, peer);
    if (err == EPROTO || err == EBADMSG) /* the encrypted stream failed */
        return fb_err(FIBER_EPROTO, "ring rank %d: the link %s rank %d: %s",
                      r->rank, dir, peer,
                      to_next ? fb_conn_err(&r->next) : fb_conn_err(&r->prev));
    errno = err;
    return fb_err_errno(FIBER_ESYS, "ring rank %d: the link %s rank %d",
                        r->rank, dir, peer);
}

static void tx_advance(struct xfer *x, size_t n, size_t plen)
{
    size_t h = HDR_LEN - x->hdr_off < n ? HDR_LEN - x->hdr_off : n;
    x->hdr_off += h;
    x->piece_off += n - h;
    x->moved += n - h;
    if (x->hdr_off == HDR_LEN && x->piece_off == plen) {
        x->piece++;
        x->hdr_off = x->piece_off = 0;
    }
}

/* Payload bytes of the current piece that are ready to send. */
static size_t tx_ready(const struct xfer *x, size_t plen)
{
    size_t have = x->limit ? *x->limit : x->len;
    size_t at = (size_t)x->piece * PIECE + x->piece_off;
    size_t left = plen - x->piece_off;
    return have <= at ? 0 : (have - at < left ? have - at : left);
}

/* Sends what it can without blocking: header and payload in one
 * fb_conn_sendv (a sendmsg, unless the link is encrypted).  Returns 0
 * (x->blocked says if the socket is full) or a code. */
static int tx_progress(fiber_ring *r, const struct call_id *id,
                       struct xfer *x)
{
    x->blocked = 0;
    /* Records an encrypted link sealed but could not send yet go first. */
    int fl = fb_conn_pending(&r->next) ? fb_conn_flush(&r->next) : 0;
    if (fl < 0)
        return link_error(r, 1, fl == FIBER_EPROTO ? EPROTO : EPIPE);
    if (fl == 1) {
        x->blocked = 1;
        return 0;
    }
    while (x->piece < x->pieces) {
        size_t plen = piece_len(x);
        if (x->hdr_off == 0 && x->piece_off == 0)
            hdr_encode(x->hdr, id, x->piece, plen);
        size_t ready = tx_ready(x, plen);
        struct iovec iov[2];
        int k = 0;
        if (x->hdr_off < HDR_LEN)
            iov[k++] = (struct iovec){x->hdr + x->hdr_off,
                                      HDR_LEN - x->hdr_off};
        if (ready)
            iov[k++] = (struct iovec){
                x->buf + (size_t)x->piece * PIECE + x->piece_off, ready};
        if (k == 0)
            break; /* forwarding: waiting for bytes from prev */
        ssize_t n = fb_conn_sendv(&r->next, iov, k);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            x->blocked = 1;
            return 0;
        }
        if (n < 0)
            return link_error(r, 1, errno);
        tx_advance(x, (size_t)n, plen);
    }
    x->blocked = fb_conn_pending(&r->next); /* sealed, not all sent */
    return 0;
}

/* Counts n received bytes; checks a header once it is whole; reduces a
 * piece once it is whole. */
static int rx_advance(const fiber_ring *r, const struct call_id *id,
                      struct xfer *x, size_t n, size_t plen)
{
    if (x->hdr_off < HDR_LEN) {
        x->hdr_off += n;
        uint8_t want[HDR_LEN];
        hdr_encode(want, id, x->piece, plen);
        if (x->hdr_off == HDR_LEN && memcmp(x->hdr, want, HDR_LEN) != 0)
            return hdr_mismatch(r, x->hdr, want);
    } else {
        x->piece_off += n;
        x->moved += n;
    }
    if (x->hdr_off == HDR_LEN && x->piece_off == plen) {
        if (x->reduce)
            x->reduce(x->buf + (size_t)x->piece * PIECE, x->scratch,
                      plen / x->elsize);
        x->piece++;
        x->hdr_off = x->piece_off = 0;
    }
    return 0;
}

/* Receives what has arrived without blocking, returning after each whole
 * piece: a prev on the other core can refill the socket as fast as it is
 * read, and our own sends, which the next member waits for, must not
 * wait for the whole block. */
static int rx_progress(fiber_ring *r, const struct call_id *id,
                       struct xfer *x)
{
    uint32_t first = x->piece;
    while (x->piece < x->pieces && x->piece == first) {
        size_t plen = piece_len(x);
        unsigned char *dst;
        size_t want;
        if (x->hdr_off < HDR_LEN) {
            dst = x->hdr + x->hdr_off;
            want = HDR_LEN - x->hdr_off;
        } else {
            dst = x->reduce ? x->scratch
                            : x->buf + (size_t)x->piece * PIECE;
            dst += x->piece_off;
            want = plen - x->piece_off;
        }
        ssize_t n = fb_conn_recv_bytes(&r->prev, dst, want);
        if (n == 0)
            return fb_err(FIBER_ECLOSED, "ring rank %d: the link from rank "
                          "%d closed: a member died or failed", r->rank,
                          mod(r->rank - 1, r->n));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0)
            return link_error(r, 0, errno);
        int rc = rx_advance(r, id, x, (size_t)n, plen);
        if (rc)
            return rc;
    }
    return 0;
}

/* Sleeps until a link can move data, ends, or the deadline passes (a
 * call whose data still trickles in at its deadline fails too: the
 * timeout bounds the call).  A link that ends while this step needs it
 * fails the call; one that ends while it is not needed is only
 * remembered, and no longer watched (it would wake every poll). */
static int wait_links(fiber_ring *r, const struct xfer *tx, int rx_pending,
                      uint64_t deadline)
{
    const short gone = POLLERR | POLLHUP | POLLRDHUP;
    if (rx_pending && fb_conn_buffered(&r->prev) > 0)
        return 0; /* decrypted bytes wait in the conn, not the socket */
    struct pollfd pf[2] = {
        {.fd = tx || !r->next_gone ? fb_conn_fd(&r->next) : -1,
         .events = POLLRDHUP | (tx && tx->blocked ? POLLOUT : 0)},
        {.fd = rx_pending || !r->prev_gone ? fb_conn_fd(&r->prev) : -1,
         .events = POLLRDHUP | (rx_pending ? POLLIN : 0)},
    };
    int left = fb_ms_left(deadline);
    int k = left == 0 ? 0 : poll(pf, 2, left);
    if (k == 0)
        return fb_err(FIBER_ETIMEDOUT, "ring rank %d: the collective did "
                      "not finish in time (a member is slow, stuck or not "
                      "taking part)", r->rank);
    if (k < 0)
        return errno == EINTR ? 0 : fb_err_errno(FIBER_ESYS, "poll");
    if (pf[0].revents & gone) {
        if (tx)
            return fb_err(FIBER_ECLOSED, "ring rank %d: the link to rank %d "
                          "closed: a member died or failed", r->rank,
                          mod(r->rank + 1, r->n));
        r->next_gone = 1;
    }
    if ((pf[1].revents & gone) && !rx_pending)
        r->prev_gone = 1; /* when pending, rx_progress reads to the end */
    return 0;
}

/* Runs one step: tx to next and rx from prev (either may be NULL) at once,
 * until both are done. */
static int run_step(fiber_ring *r, const struct call_id *id, struct xfer *tx,
                    struct xfer *rx, uint64_t deadline)
{
    for (;;) {
        int rc = tx ? tx_progress(r, id, tx) : 0;
        if (rc == 0 && rx)
            rc = rx_progress(r, id, rx);
        if (rc == 0 && tx && tx->limit) /* forward what just arrived */
            rc = tx_progress(r, id, tx);
        if (rc)
            return rc;
        /* An encrypted link may hold sealed bytes after the last piece. */
        int tx_busy = tx && (!xfer_done(tx) || fb_conn_pending(&r->next));
        if (!tx_busy && xfer_done(rx))
            return 0;
        rc = wait_links(r, tx_busy ? tx : NULL, !xfer_done(rx), deadline);
        if (rc)
            return rc;
    }
}

/* ==== reductions ======================================================== */

static void sum_f32(void *acc, const void *in, size_t n)
{
    float *restrict a = acc;
    const float *restrict b = in;
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

static void sum_f64(void *acc, const void *in, size_t n)
{
    double *restrict a = acc;
    const double *restrict b = in;
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

/* A NaN on either side wins, so that it is not lost to the order of the
 * ring. */
static void max_f32(void *acc, const void *in, size_t n)
{
    float *restrict a = acc;
    const float *restrict b = in;
    for (size_t i = 0; i < n; i++)
        if (b[i] > a[i] || isnan(b[i]))
            a[i] = b[i];
}

static void max_f64(void *acc, const void *in, size_t n)
{
    double *restrict a = acc;
    const double *restrict b = in;
    for (size_t i = 0; i < n; i++)
        if (b[i] > a[i] || isnan(b[i]))
            a[i] = b[i];
}

static void div_f32(void *acc, size_t n, int by)
{
    float *a = acc;
    for (size_t i = 0; i < n; i++)
        a[i] /= (float)by;
}

static void div_f64(void *acc, size_t n, int by)
{
    double *a = acc;
    for (size_t i = 0; i < n; i++)
        a[i] /= (double)by;
}

/* ==== collectives ======================================================== */

/* One allreduce in progress. */
struct coll {
    unsigned char *data;
    size_t count, elsize;
    struct call_id id;
    reduce_fn reduce;
};

/* Chunk k of the array: count/n elements, the first count%n chunks one
 * more, so that sizes not divisible by n (and smaller than n, which makes
 * empty chunks) need no special case. */
static void chunk_span(const fiber_ring *r, const struct coll *c, int k,
                       unsigned char **p, size_t *len)
{
    size_t n = (size_t)r->n, i = (size_t)k;
    size_t base = c->count / n, extra = c->count % n;
    size_t first = i * base + (i < extra ? i : extra);
    *p = c->data + first * c->elsize;
    *len = (base + (i < extra ? 1 : 0)) * c->elsize;
}

/* N-1 steps, each sending chunk rank+shift-step and receiving chunk
 * rank+shift-step-1: reduce-scatter (shift 0, reducing what arrives), then
 * all-gather (shift 1, storing it). */
static int ring_phase(fiber_ring *r, struct coll *c, uint8_t kind, int shift,
                      reduce_fn reduce, uint64_t deadline)
{
    for (int s = 0; s < r->n - 1; s++) {
        struct xfer tx, rx;
        unsigned char *p;
        size_t len;
        chunk_span(r, c, mod(r->rank + shift - s, r->n), &p, &len);
        xfer_init(&tx, p, len, c->elsize);
        chunk_span(r, c, mod(r->rank + shift - s - 1, r->n), &p, &len);
        xfer_init(&rx, p, len, c->elsize);
        rx.reduce = reduce;
        rx.scratch = r->scratch;
        c->id.kind = kind;
        c->id.step = (uint32_t)s;
        int rc = run_step(r, &c->id, &tx, &rx, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

/* Claims the handle for a collective.  Bad arguments were refused before
 * this, so they never break the ring. */
static int begin_call(fiber_ring *r)
{
    if (r->rank < 0)
        return fb_err(FIBER_ESTATE, "this is the ring's creator handle, "
                                    "not a member: call fiber_ring_join");
    if (r->failed)
        return fb_err(FIBER_ESTATE, "the ring is broken: %s", r->why);
    if (__atomic_exchange_n(&r->busy, 1, __ATOMIC_ACQUIRE))
        return fb_err(FIBER_ESTATE, "another call on this ring member is "
                                    "running");
    r->seq++;
    return 0;
}

/* Ends a collective: a failure breaks the ring, which tells the others. */
static int end_call(fiber_ring *r, int rc)
{
    if (rc)
        ring_break(r, rc, fiber_last_error());
    __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE);
    return rc;
}

static reduce_fn pick_reduce(int dtype, int op)
{
    if (op == FIBER_MAX)
        return dtype == FIBER_FLOAT32 ? max_f32 : max_f64;
    return dtype == FIBER_FLOAT32 ? sum_f32 : sum_f64;
}

static int allreduce_args(fiber_ring *r, const void *data, size_t count,
                          int dtype, int op)
{
    int rc = check_ring(r);
    if (rc)
        return rc;
    if (dtype != FIBER_FLOAT32 && dtype != FIBER_FLOAT64)
        return fb_err(FIBER_EINVAL, "dtype %d is neither FIBER_FLOAT32 nor "
                                    "FIBER_FLOAT64", dtype);
    if (op != FIBER_SUM && op != FIBER_MEAN && op != FIBER_MAX)
        return fb_err(FIBER_EINVAL, "op %d is not FIBER_SUM, FIBER_MEAN or "
                                    "FIBER_MAX", op);
    if (count && !data)
        return fb_err(FIBER_EINVAL, "data is NULL with a count");
    if (count > SIZE_MAX / 8)
        return fb_err(FIBER_EINVAL, "count %zu is too large", count);
    if (r->rank >= 0 && r->n > 1 && !r->scratch &&
        !(r->scratch = malloc(PIECE)))
        return fb_err(FIBER_ENOMEM, "out of memory");
    return 0;
}

static int allreduce(fiber_ring *r, struct coll *c, int op, uint64_t deadline)
{
    int rc = ring_phase(r, c, K_SCATTER, 0, c->reduce, deadline);
    if (rc == 0 && op == FIBER_MEAN) {
        /* Only our finished chunk: it is the one everybody copies. */
        unsigned char *p;
        size_t len;
        chunk_span(r, c, mod(r->rank + 1, r->n), &p, &len);
        if (c->elsize == 4)
            div_f32(p, len / 4, r->n);
        else
            div_f64(p, len / 8, r->n);
    }
    if (rc == 0)
        rc = ring_phase(r, c, K_GATHER, 1, NULL, deadline);
    return rc;
}

/* ==== the public API ===================================================== */

FIBER_API int fiber_ring_create(fiber_ring **out, int n)
{
    if (!out || n < 1 || n > FIBER_RING_MAX_MEMBERS)
        return fb_err(FIBER_EINVAL, "fiber_ring_create wants out and 1 to %d "
                      "members, not %d", FIBER_RING_MAX_MEMBERS, n);
    struct fb_objsrv *s;
    struct fb_oclient *c;
    int rc = fb_master_objsrv(&s);
    if (rc == 0)
        rc = fb_oclient_get(fb_objsrv_address(s), fb_rt_token(), &c);
    if (rc)
        return rc;
    char name[64];
    snprintf(name, sizeof name, "ring-%lu",
             __atomic_add_fetch(&ring_seq, 1, __ATOMIC_RELAXED));
    uint32_t members = (uint32_t)n, id;
    fiber_iov param = {&members, 4};
    rc = fb_oopen(c, "rendezvous", name, &param, 1, &id);
    fb_oclient_release(c);
    if (rc == 0)
        rc = ring_alloc(out, fb_objsrv_address(s), fb_rt_token(), id, n, -1);
    return rc;
}

FIBER_API int fiber_ring_serialize(fiber_ring *r, fiber_buf *out)
{
    int rc = check_ring(r);
    if (rc == 0 && !out)
        rc = fb_err(FIBER_EINVAL, "fiber_ring_serialize: out is NULL");
    return rc ? rc
              : fb_handle_encode(out, FB_HANDLE_RING, r->addr, r->token,
                                 r->obj, (uint32_t)r->n);
}

FIBER_API int fiber_ring_join(fiber_ring **out, const void *ser, size_t len,
                              int rank, int timeout_ms)
{
    char addr[FB_RING_ADDR_MAX];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj, n;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_ring_join: member is NULL");
    int rc = fb_handle_decode(ser, len, FB_HANDLE_RING, addr, sizeof addr,
                              token, &obj, &n);
    if (rc)
        return rc;
    if (n < 1 || n > FIBER_RING_MAX_MEMBERS || rank < 0 || rank >= (int)n)
        return fb_err(FIBER_EINVAL, "rank %d is out of range for a ring of "
                      "%u", rank, n);
    fiber_ring *r;
    if ((rc = ring_alloc(&r, addr, token, obj, (int)n, rank)) != 0)
        return rc;
    struct joining j = {.deadline = fb_deadline_ms(timeout_ms),
                        .listen_fd = -1};
    fb_conn_init(&j.next, -1, FB_GATE_HELLO_MAX);
    if (r->n > 1)
        rc = start_listening(r, &j);
    if (rc == 0)
        rc = rendezvous(r, &j);
    if (rc == 0 && r->n > 1)
        rc = link_up(r, &j);
    stop_listening(&j);
    fb_conn_close(&j.next);
    if (rc) {
        fiber_ring_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

FIBER_API int fiber_ring_allreduce(fiber_ring *r, void *data, size_t count,
                                   int dtype, int op, int timeout_ms)
{
    int rc = allreduce_args(r, data, count, dtype, op);
    if (rc == 0)
        rc = begin_call(r);
    if (rc || r->n == 1)
        return rc ? rc : end_call(r, 0);
    static unsigned char none;
    struct coll c = {.data = data ? data : &none,
                     .count = count,
                     .elsize = dtype == FIBER_FLOAT32 ? 4 : 8,
                     .id = {.dtype = (uint8_t)dtype,
                            .op = (uint8_t)op,
                            .seq = r->seq},
                     .reduce = pick_reduce(dtype, op)};
    c.id.total = (uint64_t)count * c.elsize;
    rc = allreduce(r, &c, op, fb_deadline_ms(timeout_ms));
    return end_call(r, rc);
}

FIBER_API int fiber_ring_broadcast(fiber_ring *r, void *data, size_t bytes,
                                   int root, int timeout_ms)
{
    int rc = check_ring(r);
    if (rc == 0 && (root < 0 || root >= r->n))
        rc = fb_err(FIBER_EINVAL, "root %d is out of range for a ring of %d",
                    root, r->n);
    if (rc == 0 && bytes && !data)
        rc = fb_err(FIBER_EINVAL, "data is NULL with a size");
    if (rc == 0)
        rc = begin_call(r);
    if (rc || r->n == 1)
        return rc ? rc : end_call(r, 0);
    static unsigned char none;
    struct call_id id = {.kind = K_BCAST,
                         .seq = r->seq,
                         .step = (uint32_t)root,
                         .total = bytes};
    /* Pipelined: a member forwards each byte as soon as it has it. */
    int pos = mod(r->rank - root, r->n); /* 0 = root, n-1 = the last */
    struct xfer tx, rx;
    xfer_init(&tx, data ? data : &none, bytes, 1);
    xfer_init(&rx, data ? data : &none, bytes, 1);
    if (pos > 0)
        tx.limit = &rx.moved;
    rc = run_step(r, &id, pos < r->n - 1 ? &tx : NULL, pos > 0 ? &rx : NULL,
                  fb_deadline_ms(timeout_ms));
    return end_call(r, rc);
}

FIBER_API int fiber_ring_rank(fiber_ring *r)
{
    int rc = check_ring(r);
    if (rc == 0 && r->rank < 0)
        rc = fb_err(FIBER_ESTATE, "the creator's handle has no rank");
    return rc ? rc : r->rank;
}

FIBER_API int fiber_ring_size(fiber_ring *r)
{
    int rc = check_ring(r);
    return rc ? rc : r->n;
}

FIBER_API void fiber_ring_free(fiber_ring *r)
{
    if (!r || check_ring(r))
        return;
    r->magic = 0;
    fb_conn_close(&r->next);
    fb_conn_close(&r->prev);
    free(r->scratch);
    free(r);
}

/* ---- for tests: who has joined so far ---------------------------------- */

/* Fills addrs[rank] (r's size entries) with the address of each member
 * waiting at the rendezvous, "" for the others; *joined with how many
 * wait and *formed with 1 once the ring has formed. */
int fb_ring_peek(fiber_ring *r, char (*addrs)[FB_RING_ADDR_MAX], int *joined,
                 int *formed)
{
    struct fb_oclient *c;
    int rc = check_ring(r);
    if (rc == 0)
        rc = fb_oclient_get(r->addr, r->token, &c);
    if (rc)
        return rc;
    struct fb_oresult res = {0};
    rc = fb_ocall(c, r->obj, FB_RDV_MEMBERS, 0, NULL, 0, &res);
    fb_oclient_release(c);
    const void *d, *a;
    size_t len, alen;
    uint32_t v;
    if (rc == 0 && (fb_oresult_item(&res, 0, &d, &len) != 0 || len != 4))
        rc = fb_err(FIBER_EPROTO, "the rendezvous answered MEMBERS badly");
    if (rc == 0) {
        memcpy(&v, d, 4);
        *formed = (int)v;
        *joined = (int)(res.count - 1) / 2;
        for (int i = 0; i < r->n; i++)
            addrs[i][0] = '\0';
    }
    for (uint32_t i = 1; rc == 0 && i + 1 < res.count; i += 2) {
        fb_oresult_item(&res, i, &d, &len);
        fb_oresult_item(&res, i + 1, &a, &alen);
        if (len != 4 || alen >= FB_RING_ADDR_MAX)
            continue;
        memcpy(&v, d, 4);
        if (v < (uint32_t)r->n) {
            memcpy(addrs[v], a, alen);
            addrs[v][alen] = '\0';
        }
    }
    fb_oresult_free(&res);
    return rc;
}
