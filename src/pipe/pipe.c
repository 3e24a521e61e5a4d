/*
 * pipe.c -- fiber_pipe: two ends that carry byte messages, connected
 * directly when they live in two processes (docs/pipe.md).
 *
 * A pipe is made of two relayed queues on the master's object server (one
 * per direction, as queue.c has them) and a rendezvous object (pipe_rdv.c,
 * operations in pipe_ops.h).  An end's first send or recv JOINs the
 * rendezvous with the address of a socket it listens on.  The first end
 * is told to WAIT; the second, if it is in another process, to DIAL the
 * first.  The dialer sends a HELLO (the run's token, the build id, the
 * pipe's nonce, its side as "pipe-a"/"pipe-b") and a PIPE_LINK saying how
 * many messages it put on its relayed queue before; the listener checks
 * the HELLO (fb_hello_check and the nonce) and answers the same way.
 * Strangers on the listening socket wait in an fb_gate and are dropped;
 * the listener is closed once the link is up.  Across hosts the link is
 * an encrypted fb_conn (secure.c), on the same host a unix socket.
 *
 * Exactness across the switch: an end's sends go to its relayed queue
 * until it has sent its PIPE_LINK, and on the link after it; a receiver
 * takes from the relayed queue until it has taken as many as the peer's
 * PIPE_LINK says, then reads the link.  Nothing is lost or reordered,
 * whichever end is used first.
 *
 * The pipe stays relayed for good when both ends are first used in one
 * process, when an end is opened twice, serialised twice by one handle
 * (handed to several processes: SHARED) or handed on before the link, or
 * when the dialer cannot reach the listener (the rendezvous decides, once).
 * A linked end cannot be serialised again (FIBER_ESTATE): the link is its
 * handle's.  When the process at the other end of a link dies, or frees
 * its handle, the kernel ends the stream and this end's recv (after the
 * messages already received) and send fail with FIBER_ECLOSED.
 *
 * Sending on a link: a frame is appended to the link's output and written
 * at once, unless sends follow each other closely (a stream): then the
 * end's flusher thread writes them in batches (plaintext links only).  A
 * send waits while more than OUT_HIGH bytes are unwritten.
 *
 * Threads: mu guards the state and the link's buffers; nothing waits
 * while holding it (poll and the queue calls run with it released), so a
 * thread blocked in recv does not stop another from sending.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "base/log.h"
#include "base/spin.h"
#include "base/thread.h"
#include "net/gate.h"
#include "objsrv/objsrv.h"
#include "pipe/pipe_ops.h"
#include "runtime/runtime.h"

#define PIPE_MAGIC 0x50495045u /* "PIPE" */
#define PIPE_CAPACITY 1024     /* messages per relayed direction */
#define SLICE_MS 5             /* relayed waits, while a link may come */
#define REJOIN_MS 50           /* a waiting end asks the rendezvous again */
#define RELAYED_SLICE_MS 250   /* a relayed recv asks whether the other
                                  end is gone this often */
#define GONE_GRACE_MS 200      /* the last relayed get of a gone peer */
#define MAX_CANDIDATES 8       /* unproven connections held at once */
#define STEADY_NS 20000        /* sends closer than this are batched */
#define OUT_HIGH (1u << 20)    /* unwritten bytes before a send waits */
#define SPIN_US 50             /* the longest spin of a recv on the link */

/* S_DIALING: connected to the waiting end over an encrypted link whose
 * handshake needs that end's key, which it sends only when its process
 * next uses the pipe: until then this end sends on its relayed queue, and
 * its HELLO and PIPE_LINK wait, so a send never waits for the other
 * process to call in. */
enum { S_FRESH, S_WAITING, S_DIALING, S_LINKING, S_LINKED, S_RELAYED };

struct cand {
    struct fb_conn conn;
    struct fb_gate_peer peer;
};

struct fiber_pipe {
    uint32_t magic;
    int side;                      /* 0: end a, 1: end b */
    fiber_queue *send, *recv;      /* relayed; NULL for a missing direction */
    char srv[FB_PIPE_ADDR_MAX];    /* the object server */
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t rdv;
    uint64_t hid;                  /* this handle, for the rendezvous */
    pthread_mutex_t mu;
    pthread_cond_t cond;           /* flusher work, room, writes done */
    int state;
    int listen_fd;
    char bound[FB_PIPE_ADDR_MAX];
    char dialed[FB_PIPE_ADDR_MAX]; /* the waiting end's address */
    struct fb_gate gate;
    uint64_t rejoin_ms;
    uint64_t nonce;
    struct fb_conn link;
    int hello_in;                  /* the peer's HELLO was checked */
    int refused;                   /* the peer's set-up frames were wrong */
    int peer_gone;                 /* the rendezvous said the other end's
                                      only holder ended (GONE) */
    int drained;                   /* ... and its relayed queue is empty */
    uint32_t peer_pid;             /* who held it, for the message */
    int held;                      /* the rendezvous knows this handle as
                                      its side's holder (HOLD or JOIN) */
    unsigned serialized;           /* times this handle was serialised */
    uint64_t sent_relayed, got_relayed;
    int64_t peer_relayed;          /* -1 until the peer's PIPE_LINK */
    int closed;                    /* this end's sending direction */
    int eof;                       /* the peer's PIPE_CLOSE arrived */
    int broken;                    /* the link failed: why says how */
    char why[1024];
    pthread_t flusher;
    int has_flusher, fl_stop, writing;
    fiber_buf spare;               /* the flusher's batch buffer */
    fiber_pipe *next_live;         /* the process's ends (fb_pipes_drain) */
    uint64_t last_send_ns;
    int recv_since_send;
    struct fb_spin spin;           /* a recv's wait on the link */
};

static const char *side_name(int side) { return side ? "pipe-b" : "pipe-a"; }

/* Every end of this process, so that a child's exit can write what its
 * ends' sends left unwritten (fb_pipes_drain).  live_mu is never taken
 * while an end's mu is held. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static fiber_pipe *live;

/* A process that never called fiber_init (a multiprocessing child handed
 * an end) has no drain hook: its ends are drained at exit.  Registered
 * after the object client's own exit drain (the end's queues connected
 * first), so it runs before it. */
static void drain_at_exit(void)
{
    fb_pipes_drain(fb_deadline_ms(30000));
}

static void register_drain(void)
{
    if (fiber_is_master() < 0)
        atexit(drain_at_exit);
}

static pthread_once_t drain_once = PTHREAD_ONCE_INIT;

static void live_add(fiber_pipe *p)
{
    pthread_once(&drain_once, register_drain);
    pthread_mutex_lock(&live_mu);
    p->next_live = live;
    live = p;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(fiber_pipe *p)
{
    pthread_mutex_lock(&live_mu);
    fiber_pipe **pp = &live;
    while (*pp && *pp != p)
        pp = &(*pp)->next_live;
    if (*pp)
        *pp = p->next_live;
    pthread_mutex_unlock(&live_mu);
}

static int check_pipe(const fiber_pipe *p)
{
    if (!p || p->magic != PIPE_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_pipe handle");
    return 0;
}

/* ==== handles ============================================================ */

static int pipe_end(fiber_pipe **out, int side, const char *srv,
                    const uint8_t *token, uint32_t rdv, fiber_queue *send,
                    fiber_queue *recv)
{
    fiber_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return fb_err(FIBER_ENOMEM, "out of memory");
    p->magic = PIPE_MAGIC;
    p->side = side;
    p->send = send;
    p->recv = recv;
    fb_strlcpy(p->srv, srv, sizeof p->srv);
    memcpy(p->token, token, sizeof p->token);
    p->rdv = rdv;
    randombytes_buf(&p->hid, sizeof p->hid);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->listen_fd = -1;
    p->peer_relayed = -1;
    fb_conn_init(&p->link, -1, FB_GATE_HELLO_MAX);
    fb_spin_init(&p->spin, sysconf(_SC_NPROCESSORS_ONLN) > 1 ? SPIN_US : 0);
    live_add(p);
    *out = p;
    return 0;
}

/* Records that the link failed (the first reason is kept). */
static void link_break(fiber_pipe *p, const char *fmt, const char *detail)
{
    if (p->broken)
        return;
    p->broken = 1;
    snprintf(p->why, sizeof p->why, fmt, side_name(1 - p->side), detail);
    pthread_cond_broadcast(&p->cond);
}

static int link_error(const fiber_pipe *p)
{
    return fb_err(FIBER_ECLOSED, "%s", p->why);
}

static int gone_error(const fiber_pipe *p)
{
    return fb_err(FIBER_ECLOSED, "the process holding %s (pid %u) went away "
                  "(it ended, or freed its end of the pipe)",
                  side_name(1 - p->side), p->peer_pid);
}

/* ==== listening and the rendezvous ======================================= */

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void cand_close(struct fb_gate_peer *peer, void *arg)
{
    (void)arg;
    struct cand *c = (struct cand *)((char *)peer -
                                     offsetof(struct cand, peer));
    fb_conn_close(&c->conn);
    free(c);
}

/* Beside the object server's unix socket (the run directory), or on
 * listen_host when the run uses TCP. */
static int start_listening(fiber_pipe *p)
{
    char want[FB_PIPE_ADDR_MAX];
    const char *slash = strrchr(p->srv, '/');
    int k;
    if (strncmp(p->srv, "tcp:", 4) == 0)
        k = snprintf(want, sizeof want, "tcp:%s:0",
                     fb_rt_config()->listen_host);
    else if (strncmp(p->srv, "unix:", 5) == 0 && slash)
        k = snprintf(want, sizeof want, "%.*s/pipe%u%c.%ld",
                     (int)(slash - p->srv), p->srv, p->rdv,
                     p->side ? 'b' : 'a', (long)getpid());
    else
        return fb_err(FIBER_EINVAL, "cannot place a pipe socket beside %s",
                      p->srv);
    if (k < 0 || (size_t)k >= sizeof want)
        return fb_err(FIBER_EINVAL, "pipe socket path is too long");
    fb_gate_init(&p->gate, "pipe", MAX_CANDIDATES, 0, cand_close, NULL);
    return fb_sock_listen(want, MAX_CANDIDATES, &p->listen_fd, p->bound,
                          sizeof p->bound);
}

static void stop_listening(fiber_pipe *p)
{
    if (p->listen_fd < 0)
        return;
    fb_gate_clear(&p->gate);
    close_fd(&p->listen_fd);
    if (strncmp(p->bound, "unix:", 5) == 0)
        unlink(p->bound + 5);
}

/* One call on the rendezvous; mu is released meanwhile. */
static int rdv_call(fiber_pipe *p, int32_t op, const fiber_iov *items,
                    size_t n, struct fb_oresult *res)
{
    struct fb_oclient *c;
    pthread_mutex_unlock(&p->mu);
    int rc = fb_oclient_get(p->srv, p->token, &c);
    if (rc == 0) {
        rc = fb_ocall(c, p->rdv, op, 10000, items, n, res);
        fb_oclient_release(c);
    }
    pthread_mutex_lock(&p->mu);
    return rc;
}

static int put_hello(fiber_pipe *p)
{
    const char *bid = fb_rt_build_id(), *name = side_name(p->side);
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .job_id = p->nonce,
                             .pid = (uint32_t)getpid(),
                             .name = name,
                             .name_len = (uint8_t)strlen(name)};
    memcpy(h.token, p->token, sizeof h.token);
    return fb_wire_put_hello(fb_conn_out(&p->link), &h);
}

/* Our HELLO and PIPE_LINK (and PIPE_CLOSE when this end was closed while
 * relayed): from here on this end sends on the link. */
static int greet(fiber_pipe *p)
{
    int rc = put_hello(p);
    if (rc == 0)
        rc = fb_wire_put_pipe_link(fb_conn_out(&p->link), p->sent_relayed);
    if (rc == 0 && p->closed)
        rc = fb_wire_put_empty(fb_conn_out(&p->link), FB_MSG_PIPE_CLOSE, 0);
    if (rc == 0 && fb_conn_flush(&p->link) < 0)
        link_break(p, "the process holding %s went away while the pipe was "
                      "being linked: %s", fb_conn_err(&p->link));
    p->state = S_LINKING;
    return rc;
}

/* Says in why what is wrong with a HELLO that passed fb_hello_check. */
static int pipe_hello_problem(const fiber_pipe *p,
                              const struct fb_msg_hello *m, char *why,
                              size_t size)
{
    const char *want = side_name(1 - p->side);
    if (m->job_id != p->nonce)
        snprintf(why, size, "it belongs to another pipe");
    else if (m->name_len != strlen(want) ||
             memcmp(m->name, want, m->name_len) != 0)
        snprintf(why, size, "it is %.*s, not %s", (int)m->name_len, m->name,
                 want);
    else
        return 0;
    return -1;
}

/* Tells the rendezvous the dial failed: the pipe stays relayed. */
static void fall_back(fiber_pipe *p, const char *addr, const char *why)
{
    fb_log_info("pipe: cannot dial the other end at %s (%s): the pipe stays "
                "on the master's queues",
                addr, why);
    fb_conn_close(&p->link);
    uint32_t side = (uint32_t)p->side;
    fiber_iov it = {&side, 4};
    rdv_call(p, FB_PRDV_FALLBACK, &it, 1, NULL);
    p->state = S_RELAYED;
}

static int dial(fiber_pipe *p, const char *addr)
{
    int fd;
    uint64_t deadline = fb_deadline_ms(fb_rt_config()->connect_timeout_ms);
    if (fb_sock_dial(addr, deadline, &fd) != 0) {
        char text[300];
        fb_strlcpy(text, fiber_last_error(), sizeof text);
        fall_back(p, addr, text);
        return 0;
    }
    fb_conn_init(&p->link, fd, fb_rt_config()->max_message_bytes);
    if (fb_conn_secure_for(&p->link, addr, FB_SEC_CLIENT, p->token) != 0) {
        char text[300];
        fb_strlcpy(text, fiber_last_error(), sizeof text);
        fall_back(p, addr, text);
        return 0;
    }
    if (!fb_conn_handshake_done(&p->link)) {
        fb_strlcpy(p->dialed, addr, sizeof p->dialed);
        p->state = S_DIALING;
        return 0;
    }
    return greet(p);
}

/* An encrypted dial's handshake: greets once the waiting end's key has
 * come; falls back to the relayed queues if the link failed. */
static int dial_progress(fiber_pipe *p)
{
    int r = fb_conn_read(&p->link);
    int failed = fb_conn_stream_failed(&p->link);
    if (fb_conn_handshake_done(&p->link) && !failed)
        return greet(p);
    if (r != 0 || failed) {
        fall_back(p, p->dialed, fb_conn_err_or(&p->link, "the link failed"));
    }
    return 0;
}

static struct cand *listen_round(fiber_pipe *p, int wait_ms);
static int adopt(fiber_pipe *p, struct cand *c);

/* GONE: the other end's only handle went away.  A waiting end first
 * takes a connection the other end may have dialled before it went (its
 * HELLO, PIPE_LINK and messages are in the socket: the link is set up
 * and read to its end); otherwise the pipe is relayed for good, and recv
 * takes what is left on the relayed queue, then fails with FIBER_ECLOSED
 * (send fails at once). */
static int other_end_gone(fiber_pipe *p, const struct fb_oresult *res)
{
    const void *d;
    size_t len;
    if (res->count == 4 && fb_oresult_item(res, 3, &d, &len) == 0 &&
        len == 4)
        memcpy(&p->peer_pid, d, 4);
    for (int i = 0; i < 2 * MAX_CANDIDATES && p->state == S_WAITING &&
                    p->listen_fd >= 0;
         i++) {
        struct cand *c = listen_round(p, 0);
        if (c)
            return adopt(p, c);
    }
    if (p->state == S_LINKING || p->state == S_LINKED)
        return 0;
    fb_log_debug("pipe %u %s: the other end is gone (pid %u)", p->rdv,
                 side_name(p->side), p->peer_pid);
    stop_listening(p);
    p->peer_gone = 1;
    p->state = S_RELAYED;
    return 0;
}

/* Reads JOIN's answer and acts on it. */
static int joined(fiber_pipe *p, const struct fb_oresult *res)
{
    const void *d;
    size_t len;
    uint32_t verdict;
    char addr[FB_PIPE_ADDR_MAX];
    if (res->count < 3 || res->count > 4 ||
        fb_oresult_item(res, 0, &d, &len) != 0 || len != 4)
        return fb_err(FIBER_EPROTO, "the pipe's rendezvous answered badly");
    memcpy(&verdict, d, 4);
    fb_log_debug("pipe %u %s: JOIN answered %u in state %d", p->rdv,
                 side_name(p->side), verdict, p->state);
    if (verdict == FB_PRDV_GONE)
        return other_end_gone(p, res);
    if (p->state == S_RELAYED)
        return 0; /* relayed for good; the other end is still there */
    fb_oresult_item(res, 1, &d, &len);
    if (len == 8)
        memcpy(&p->nonce, d, 8);
    fb_oresult_item(res, 2, &d, &len);
    if (len >= sizeof addr)
        return fb_err(FIBER_EPROTO, "the pipe's rendezvous sent a bad "
                                    "address");
    memcpy(addr, d, len);
    addr[len] = '\0';
    if (verdict == FB_PRDV_WAIT || verdict == FB_PRDV_DIALED) {
        p->state = S_WAITING;
        return 0;
    }
    stop_listening(p);
    if (verdict == FB_PRDV_DIAL)
        return dial(p, addr);
    p->state = S_RELAYED;
    return 0;
}

/* JOINs the rendezvous (again, while waiting, to learn whether the wait
 * is over). */
static int join(fiber_pipe *p)
{
    if (p->state == S_FRESH && start_listening(p) != 0) {
        fb_log_debug("pipe: no socket to listen on (%s): this end will "
                     "not be dialled", fiber_last_error());
        p->bound[0] = '\0';
    }
    uint32_t side = (uint32_t)p->side, pid = (uint32_t)getpid();
    fiber_iov items[4] = {{&side, 4}, {&pid, 4}, {&p->hid, 8},
                          {p->bound, p->listen_fd >= 0 ? strlen(p->bound)
                                                       : 0}};
    struct fb_oresult res = {0};
    int rc = rdv_call(p, FB_PRDV_JOIN, items, 4, &res);
    if (rc == 0)
        p->held = 1;
    if (rc == 0 && (p->state <= S_WAITING || p->state == S_RELAYED))
        rc = joined(p, &res);
    p->rejoin_ms = fb_now_ms() +
                   (p->state == S_RELAYED ? RELAYED_SLICE_MS : REJOIN_MS);
    fb_oresult_free(&res);
    if (rc && p->state == S_FRESH)
        stop_listening(p);
    return rc;
}

/* ==== the listener's side: accepting the other end ======================= */

/* Reads what candidate c sent: 1 when it is the other end (admitted), 0
 * while it has said too little, -1 after dropping it. */
static int cand_serve(fiber_pipe *p, struct cand *c)
{
    struct fb_msg_hello m;
    int rc = fb_gate_serve(&p->gate, &c->peer, p->token, fb_rt_build_id(),
                           &m);
    if (rc != 1)
        return rc;
    char why[200];
    if (pipe_hello_problem(p, &m, why, sizeof why) != 0) {
        fb_gate_reject(&p->gate, &c->peer, why);
        return -1;
    }
    fb_gate_admit(&p->gate, &c->peer);
    return 1;
}

static struct cand *cand_accept(fiber_pipe *p)
{
    int fd;
    while (fb_sock_accept(p->listen_fd, &fd) == 0) {
        struct cand *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        fb_conn_init(&c->conn, fd, FB_GATE_HELLO_MAX);
        if (fb_conn_secure_for(&c->conn, p->bound, FB_SEC_SERVER,
                               p->token) != 0) {
            fb_log_warn("pipe: dropping peer on fd %d: %s", fd,
                        fiber_last_error());
            cand_close(&c->peer, NULL);
            continue;
        }
        fb_gate_add(&p->gate, &c->peer, &c->conn);
        if (cand_serve(p, c) == 1)
            return c;
    }
    return NULL;
}

/* Serves the listening socket and the candidates once, waiting up to
 * wait_ms (mu released meanwhile); returns the other end, or NULL. */
static struct cand *listen_round(fiber_pipe *p, int wait_ms)
{
    uint64_t now = fb_now_ms();
    uint64_t next = fb_gate_tick(&p->gate, now); /* drops the late */
    struct pollfd pf[1 + MAX_CANDIDATES];
    struct cand *cs[MAX_CANDIDATES];
    int n = 0;
    pf[0] = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
    for (struct fb_gate_peer *g = p->gate.oldest; g && n < MAX_CANDIDATES;
         g = g->newer, n++) {
        cs[n] = (struct cand *)((char *)g - offsetof(struct cand, peer));
        pf[1 + n] = (struct pollfd){.fd = fb_conn_fd(&cs[n]->conn),
                                    .events = POLLIN};
    }
    if (next != UINT64_MAX && next - now < (uint64_t)wait_ms)
        wait_ms = (int)(next - now);
    pthread_mutex_unlock(&p->mu);
    int k = poll(pf, (nfds_t)(1 + n), wait_ms);
    pthread_mutex_lock(&p->mu);
    if (k <= 0 || p->state != S_WAITING)
        return NULL;
    for (int i = 0; i < n; i++)
        if (pf[1 + i].revents && cand_serve(p, cs[i]) == 1)
            return cs[i];
    return pf[0].revents ? cand_accept(p) : NULL;
}

/* The other end is in: its conn becomes the link (what followed its
 * HELLO stays buffered), and this end answers. */
static int adopt(fiber_pipe *p, struct cand *c)
{
    fb_conn_close(&p->link);
    p->link = c->conn;
    fb_conn_set_max_payload(&p->link, fb_rt_config()->max_message_bytes);
    fb_conn_init(&c->conn, -1, FB_GATE_HELLO_MAX);
    free(c);
    p->hello_in = 1;
    stop_listening(p); /* the strangers still waiting are dropped */
    return greet(p);
}

/* ==== the dialer's side, and both: the peer's HELLO and PIPE_LINK ======== */

static int control_frame(fiber_pipe *p, const struct fb_wire_hdr *h,
                         const uint8_t *pl)
{
    char why[512];
    struct fb_msg_hello m;
    if (!p->hello_in) {
        if (h->type == FB_MSG_REJECT)
            snprintf(why, sizeof why, "it refused us: %.*s", (int)h->len,
                     (const char *)pl);
        else if (fb_hello_check(h, pl, p->token, fb_rt_build_id(), &m, why,
                                sizeof why) == FB_HELLO_OK &&
                 pipe_hello_problem(p, &m, why, sizeof why) == 0) {
            p->hello_in = 1;
            return 0;
        }
        link_break(p, "the peer dialled as %s is not it: %s", why);
        p->refused = 1;
        return FIBER_EAUTH;
    }
    uint64_t n;
    if (h->type != FB_MSG_PIPE_LINK ||
        fb_wire_get_pipe_link(pl, h->len, &n, why, sizeof why) != 0) {
        link_break(p, "%s sent no PIPE_LINK after its HELLO: %s",
                   h->type == FB_MSG_PIPE_LINK ? why : "another message");
        p->refused = 1;
        return FIBER_EPROTO;
    }
    p->peer_relayed = (int64_t)n;
    p->state = S_LINKED;
    fb_log_debug("pipe %u %s: linked directly", p->rdv, side_name(p->side));
    return 0;
}

/* Reads the link's handshake frames as far as they have come.  A link
 * that broke (our HELLO could not be written: the other end sent its
 * HELLO, PIPE_LINK and messages, and exited before we answered) is still
 * read: what the other end sent before it went is received, then
 * FIBER_ECLOSED.  Only a peer whose frames were wrong is not read on. */
static void read_control(fiber_pipe *p)
{
    /* (Never while the flusher writes: one writer at a time.) */
    if (!p->writing && fb_conn_pending(&p->link) &&
        fb_conn_flush(&p->link) < 0)
        link_break(p, "the process holding %s went away while the pipe was "
                      "being linked: %s", fb_conn_err(&p->link));
    int rc = fb_conn_read(&p->link);
    struct fb_wire_hdr h;
    const uint8_t *pl;
    while (!p->refused && p->state == S_LINKING) {
        int got = fb_conn_next(&p->link, &h, &pl);
        if (got < 0) {
            link_break(p, "%s sent a bad frame while linking: %s",
                       fb_conn_err(&p->link));
            p->refused = 1;
        }
        if (got != 1 || control_frame(p, &h, pl) != 0)
            break;
    }
    if (p->state == S_LINKING && rc != 0 && !p->broken)
        link_break(p, "the process holding %s went away while the pipe was "
                      "being linked: %s",
                   fb_conn_err_or(&p->link, "end of stream"));
}

/* Moves the link's set-up on without waiting (or, while listening, up to
 * wait_ms).  Returns 0 or an error a call must report. */
static int progress(fiber_pipe *p, int wait_ms)
{
    if (p->state == S_FRESH)
        return join(p);
    if (p->state == S_WAITING) {
        struct cand *c = p->listen_fd >= 0 ? listen_round(p, wait_ms) : NULL;
        if (!c) {
            if (p->state == S_WAITING && fb_now_ms() >= p->rejoin_ms)
                return join(p);
            return 0;
        }
        int rc = adopt(p, c);
        if (rc)
            return rc;
        /* What the other end sent after its HELLO is read now: if it has
         * already gone, our answer failed to write (the link is broken)
         * and its PIPE_LINK and messages are all there is. */
    }
    if (p->state == S_DIALING)
        return dial_progress(p);
    if (p->state == S_LINKING)
        read_control(p);
    return 0;
}

/* ==== sending ============================================================ */

static size_t unwritten(const fiber_pipe *p)
{
    return fb_conn_unsent(&p->link);
}

/* The flusher: writes batches of what sends left in the link's output,
 * outside mu (senders append to the other buffer meanwhile). */
static void flusher_write(fiber_pipe *p)
{
    fiber_buf batch = p->spare;
    size_t off = fb_conn_swap_out(&p->link, &batch);
    p->writing = 1;
    int fd = fb_conn_fd(&p->link);
    pthread_mutex_unlock(&p->mu);
    int err = 0;
    while (off < batch.len && !err) {
        ssize_t n = send(fd, batch.data + off, batch.len - off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            off += (size_t)n;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 100);
        } else if (!(n < 0 && errno == EINTR))
            err = n < 0 ? errno : EPIPE;
    }
    pthread_mutex_lock(&p->mu);
    batch.len = 0;
    p->spare = batch;
    p->writing = 0;
    if (err)
        link_break(p, "the process holding %s went away: %s",
                   strerror(err));
    pthread_cond_broadcast(&p->cond);
}

static void *flusher_main(void *arg)
{
    fiber_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->fl_stop) {
        if (unwritten(p) && !p->broken)
            flusher_write(p);
        else
            pthread_cond_wait(&p->cond, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Leaves the output to the flusher (started the first time); 0, or a
 * code when no thread can be started. */
static int hand_to_flusher(fiber_pipe *p)
{
    if (fb_conn_encrypted(&p->link))
        return FIBER_ENOTSUP;
    if (!p->has_flusher) {
        int rc = fb_thread_start(&p->flusher, flusher_main, p,
                                 "a pipe's flusher");
        if (rc)
            return rc;
        p->has_flusher = 1;
    }
    pthread_cond_broadcast(&p->cond);
    return 0;
}

/* Waits until the link's output is below limit bytes (everything, with
 * 0), writing it when no flusher does.  FIBER_EAGAIN / FIBER_ETIMEDOUT by
 * deadline (timeout_ms 0: never waits). */
static int drain_to(fiber_pipe *p, size_t limit, int timeout_ms,
                    uint64_t deadline)
{
    while (!p->broken && (unwritten(p) > limit ||
                          (limit == 0 && (p->writing ||
                                          fb_conn_pending(&p->link))))) {
        if (!p->writing && fb_conn_flush(&p->link) < 0) {
            link_break(p, "the process holding %s went away: %s",
                       fb_conn_err(&p->link));
            break;
        }
        if (unwritten(p) <= limit && !(limit == 0 && p->writing) &&
            !(limit == 0 && fb_conn_pending(&p->link)))
            break;
        if (timeout_ms == 0)
            return fb_err(FIBER_EAGAIN, "the pipe is full");
        int left = fb_ms_left(deadline);
        if (left == 0)
            return fb_err(FIBER_ETIMEDOUT, "the pipe stayed full");
        if (p->writing) {
            pthread_cond_wait(&p->cond, &p->mu); /* woken when it writes */
            continue;
        }
        struct pollfd pf = {.fd = fb_conn_fd(&p->link),
                            .events = fb_conn_wait_events(&p->link)};
        pthread_mutex_unlock(&p->mu);
        poll(&pf, 1, left < 0 || left > 100 ? 100 : left);
        pthread_mutex_lock(&p->mu);
    }
    return p->broken ? link_error(p) : 0;
}

static int send_direct(fiber_pipe *p, const void *data, size_t len,
                       int timeout_ms)
{
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    int rc = drain_to(p, OUT_HIGH, timeout_ms, deadline);
    if (rc == 0)
        rc = fb_wire_put_pipe_data(fb_conn_out(&p->link), data, (uint32_t)len);
    if (rc)
        return rc;
    uint64_t now = fb_now_ns();
    int steady = now - p->last_send_ns < STEADY_NS && !p->recv_since_send;
    p->last_send_ns = now;
    p->recv_since_send = 0;
    if (p->writing || (steady && hand_to_flusher(p) == 0))
        return 0;
    int w = fb_conn_flush(&p->link);
    if (w < 0)
        link_break(p, "the process holding %s went away: %s",
                   fb_conn_err(&p->link));
    else if (w == 1 && hand_to_flusher(p) != 0)
        return drain_to(p, 0, -1, UINT64_MAX);
    return p->broken ? link_error(p) : 0;
}

FIBER_API int fiber_pipe_send(fiber_pipe *p, const void *data, size_t len,
                              int timeout_ms)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    if (!p->send)
        return fb_err(FIBER_ENOTSUP, "this end of a one-way pipe only "
                                     "receives");
    rc = fb_message_check(data, len);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    rc = progress(p, 0);
    if (rc == 0 && p->closed)
        rc = fb_err(FIBER_ECLOSED, "this end of the pipe was closed");
    if (rc == 0 && p->peer_gone)
        rc = gone_error(p);
    if (rc == 0 && p->state >= S_LINKING && p->state != S_RELAYED) {
        rc = p->broken ? link_error(p)
                       : send_direct(p, data, len, timeout_ms);
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    if (rc == 0)
        p->sent_relayed++; /* counted before the put: the link says so */
    pthread_mutex_unlock(&p->mu);
    if (rc)
        return rc;
    rc = fiber_queue_put(p->send, data, len, timeout_ms);
    if (rc) {
        pthread_mutex_lock(&p->mu);
        p->sent_relayed--;
        pthread_mutex_unlock(&p->mu);
    }
    return rc;
}

/* ==== receiving ========================================================== */

/* Takes a message from the link; 1 when none is buffered. */
static int take_frame(fiber_pipe *p, fiber_buf *out)
{
    struct fb_wire_hdr h;
    const uint8_t *pl;
    int got = fb_conn_next(&p->link, &h, &pl);
    if (got == 1 && h.type == FB_MSG_PIPE_DATA)
        return fiber_buf_append(out, pl, h.len);
    if (got == 1 && h.type == FB_MSG_PIPE_CLOSE)
        p->eof = 1;
    else if (got == 1)
        link_break(p, "%s sent %s on the link", fb_msg_type_name(h.type));
    else if (got < 0)
        link_break(p, "%s sent a bad frame: %s", fb_conn_err(&p->link));
    if (p->eof)
        return fb_err(FIBER_ECLOSED, "the other end of the pipe was closed");
    return p->broken ? link_error(p) : 1;
}

/* Spins (polling without blocking) for as long as the adaptive budget
 * allows, before a recv blocks: a message that comes within the spin
 * saves the wake-up of a sleeping thread, tens of microseconds on these
 * machines (base/spin.h).  1 when pf became ready. */
static int spin_wait(struct fb_spin *spin, struct pollfd *pf)
{
    unsigned spin_us = fb_spin_budget(spin);
    if (spin_us == 0)
        return 0;
    uint64_t until = fb_now_ns() + (uint64_t)spin_us * 1000u;
    int n = 0;
    while (n == 0 && fb_now_ns() < until)
        n = poll(pf, 1, 0);
    fb_spin_result(spin, n > 0);
    return n > 0;
}

static int recv_direct(fiber_pipe *p, fiber_buf *out, int timeout_ms,
                       uint64_t deadline)
{
    for (;;) {
        int rc = take_frame(p, out);
        if (rc != 1)
            return rc;
        /* (The input buffer may be compacted by a read: whether a frame
         * came is for fb_conn_next to say.) */
        int r = fb_conn_read(&p->link);
        if ((rc = take_frame(p, out)) != 1)
            return rc;
        if (r != 0) {
            link_break(p, "the process holding %s went away (the "
                          "connection ended: %s)",
                       fb_conn_err_or(&p->link, "end of stream"));
            return link_error(p);
        }
        if (timeout_ms == 0)
            return fb_err(FIBER_EAGAIN, "nothing to receive");
        int left = fb_ms_left(deadline);
        if (left == 0)
            return fb_err(FIBER_ETIMEDOUT, "nothing was received in time");
        struct pollfd pf = {.fd = fb_conn_fd(&p->link), .events = POLLIN};
        pthread_mutex_unlock(&p->mu);
        if (!spin_wait(&p->spin, &pf))
            poll(&pf, 1, left);
        pthread_mutex_lock(&p->mu);
    }
}

/* Whether the next message comes from the link. */
static int from_link(const fiber_pipe *p)
{
    return p->state == S_LINKED &&
           p->got_relayed >= (uint64_t)p->peer_relayed;
}

/* One relayed get, at most a slice long: SLICE_MS while a link may still
 * come, RELAYED_SLICE_MS on a relayed pipe (between two slices recv asks
 * whether the other end is gone); mu held on entry and return. */
static int recv_relayed(fiber_pipe *p, fiber_buf *out, int timeout_ms,
                        uint64_t deadline)
{
    int slice = p->state == S_RELAYED ? RELAYED_SLICE_MS : SLICE_MS;
    int left = fb_ms_left(deadline);
    if (timeout_ms == 0)
        slice = 0;
    else if (left >= 0 && left < slice)
        slice = left;
    pthread_mutex_unlock(&p->mu);
    int rc = fiber_queue_get(p->recv, out, slice);
    pthread_mutex_lock(&p->mu);
    if (rc == 0)
        p->got_relayed++;
    return rc;
}

/* The other end will send no more (it is gone, or its link broke before
 * it said how many messages it had relayed): what it put on the relayed
 * queue is still taken, then FIBER_ECLOSED.  The last get waits a little
 * (GONE_GRACE_MS), for puts still on their way to the server. */
static int recv_after_peer(fiber_pipe *p, fiber_buf *out)
{
    int rc = FIBER_EAGAIN;
    if (!p->drained) {
        pthread_mutex_unlock(&p->mu);
        rc = fiber_queue_get(p->recv, out, GONE_GRACE_MS);
        pthread_mutex_lock(&p->mu);
    }
    if (rc == 0) {
        p->got_relayed++;
        return 0;
    }
    if (rc != FIBER_EAGAIN && rc != FIBER_ETIMEDOUT && rc != FIBER_ECLOSED)
        return rc;
    if (rc == FIBER_ECLOSED) /* closed by the other end: that says why */
        return rc;
    fb_log_debug("pipe %u %s: end of stream after %llu relayed messages "
                 "(state %d, gone %d, broken %d)", p->rdv, side_name(p->side),
                 (unsigned long long)p->got_relayed, p->state, p->peer_gone,
                 p->broken);
    p->drained = 1;
    return p->peer_gone ? gone_error(p) : link_error(p);
}

FIBER_API int fiber_pipe_recv(fiber_pipe *p, fiber_buf *out, int timeout_ms)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    if (!p->recv)
        return fb_err(FIBER_ENOTSUP, "this end of a one-way pipe only sends");
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_pipe_recv: out is NULL");
    uint64_t deadline = fb_deadline_ms(timeout_ms);
    pthread_mutex_lock(&p->mu);
    p->recv_since_send = 1;
    for (;;) {
        rc = progress(p, 0);
        if (rc)
            break;
        if (from_link(p)) {
            rc = recv_direct(p, out, timeout_ms, deadline);
            break;
        }
        if (p->state == S_LINKING && p->broken)
            read_control(p); /* what came before the break */
        if (from_link(p))
            continue;
        if (p->peer_gone || (p->state == S_LINKING && p->broken)) {
            rc = recv_after_peer(p, out);
            break;
        }
        if (p->state == S_RELAYED && fb_now_ms() >= p->rejoin_ms &&
            (rc = join(p)) != 0)
            break;
        if (p->peer_gone)
            continue;
        rc = recv_relayed(p, out, timeout_ms, deadline);
        if (rc != FIBER_ETIMEDOUT && rc != FIBER_EAGAIN)
            break;
        if (fb_ms_left(deadline) == 0 && !from_link(p)) {
            /* The last slice may have been cut to 0 ms. */
            if (timeout_ms != 0 && rc == FIBER_EAGAIN)
                rc = fb_err(FIBER_ETIMEDOUT, "nothing was received in time");
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* ==== closing, handing on, freeing ======================================= */

FIBER_API int fiber_pipe_close(fiber_pipe *p)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    if (!p->send)
        return 0;
    pthread_mutex_lock(&p->mu);
    int direct = p->state == S_LINKING || p->state == S_LINKED;
    int was = p->closed;
    p->closed = 1;
    if (direct && !was && !p->broken) {
        rc = fb_wire_put_empty(fb_conn_out(&p->link), FB_MSG_PIPE_CLOSE, 0);
        if (rc == 0)
            rc = drain_to(p, 0, -1, UINT64_MAX);
    }
    pthread_mutex_unlock(&p->mu);
    if (direct)
        return rc == FIBER_ECLOSED ? 0 : rc;
    /* What this end sent before the close is received before the EOF: a
     * pipelined send still waiting for room in a full direction would
     * otherwise be failed by the close (a queue's close fails waiting
     * puts).  So first wait until every pipelined send is in.  If a link
     * comes later, greet() sends PIPE_CLOSE on it. */
    rc = fiber_queue_flush(p->send, -1);
    return rc ? rc : fiber_queue_close(p->send);
}

/* "FBH1" handle (objsrv.h) with the relayed queues as obj and extra, then
 * u32 rendezvous | u8 side. */
FIBER_API int fiber_pipe_serialize(fiber_pipe *p, fiber_buf *out)
{
    int rc = check_pipe(p);
    if (rc)
        return rc;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_pipe_serialize: out is NULL");
    pthread_mutex_lock(&p->mu);
    int linked = p->state >= S_DIALING && p->state <= S_LINKED;
    if (!linked && ++p->serialized == 2) {
        /* Handed to a second process (workers sharing one end, as
         * multiprocessing allows): no direct link, which one process
         * would hold, but the relayed queues, which serve them all. */
        uint32_t side = (uint32_t)p->side;
        fiber_iov it = {&side, 4};
        if (rdv_call(p, FB_PRDV_SHARED, &it, 1, NULL) != 0)
            fb_log_debug("pipe: SHARED failed: %s", fiber_last_error());
    }
    if (!linked && p->held) {
        /* The holder hands its side on: the side must not be declared
         * gone when this process ends before the next holder opens it. */
        uint32_t side = (uint32_t)p->side;
        fiber_iov it = {&side, 4};
        if (rdv_call(p, FB_PRDV_HANDED, &it, 1, NULL) != 0)
            fb_log_debug("pipe: HANDED failed: %s", fiber_last_error());
    }
    pthread_mutex_unlock(&p->mu);
    if (linked)
        return fb_err(FIBER_ESTATE,
                      "this end of the pipe is connected directly to the "
                      "other end: an end that has been used over a direct "
                      "connection cannot be handed on");
    rc = fb_handle_encode(out, FB_HANDLE_PIPE, p->srv, p->token,
                          p->send ? fb_queue_obj(p->send) : 0,
                          p->recv ? fb_queue_obj(p->recv) : 0);
    uint8_t tail[5] = {0};
    memcpy(tail, &p->rdv, 4);
    tail[4] = (uint8_t)p->side;
    return rc ? rc : fiber_buf_append(out, tail, sizeof tail);
}

/* Tells the rendezvous that this process holds p's side (HOLD), so that
 * the side is gone if the process ends before using it.  A failure only
 * costs that. */
static void hold(fiber_pipe *p)
{
    uint32_t side = (uint32_t)p->side, pid = (uint32_t)getpid();
    fiber_iov items[3] = {{&side, 4}, {&pid, 4}, {&p->hid, 8}};
    pthread_mutex_lock(&p->mu);
    if (rdv_call(p, FB_PRDV_HOLD, items, 3, NULL) != 0)
        fb_log_debug("pipe: HOLD failed: %s", fiber_last_error());
    else
        p->held = 1;
    pthread_mutex_unlock(&p->mu);
}

FIBER_API int fiber_pipe_open(fiber_pipe **out, const void *data, size_t len)
{
    char addr[FB_PIPE_ADDR_MAX];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t send_obj, recv_obj, rdv;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_pipe_open: out is NULL");
    if (!data || len < 5)
        return fb_err(FIBER_EINVAL, "not a serialised fiber_pipe end");
    const uint8_t *tail = (const uint8_t *)data + len - 5;
    int rc = fb_handle_decode(data, len - 5, FB_HANDLE_PIPE, addr,
                              sizeof addr, token, &send_obj, &recv_obj);
    memcpy(&rdv, tail, 4);
    if (rc == 0 && (tail[4] > 1 || !rdv || (!send_obj && !recv_obj)))
        rc = fb_err(FIBER_EINVAL, "serialised pipe end names no pipe");
    fiber_queue *s = NULL, *r = NULL;
    if (rc == 0 && send_obj)
        rc = fb_queue_attach(&s, addr, token, send_obj);
    if (rc == 0 && recv_obj)
        rc = fb_queue_attach(&r, addr, token, recv_obj);
    if (rc == 0)
        rc = pipe_end(out, tail[4], addr, token, rdv, s, r);
    if (rc) {
        fiber_queue_free(s);
        fiber_queue_free(r);
        return rc;
    }
    hold(*out);
    return 0;
}

static unsigned long pipe_seq;

/* The pipe's rendezvous on the master's server. */
static int rdv_create(struct fb_objsrv *s, uint32_t *rdv)
{
    struct fb_oclient *c;
    int rc = fb_oclient_get(fb_objsrv_address(s), fb_rt_token(), &c);
    if (rc)
        return rc;
    char name[64];
    snprintf(name, sizeof name, "pipe-%lu",
             __atomic_add_fetch(&pipe_seq, 1, __ATOMIC_RELAXED));
    rc = fb_oopen(c, "pipe_rdv", name, NULL, 0, rdv);
    fb_oclient_release(c);
    return rc;
}

/* A relayed direction: the sender's handle and the receiver's. */
static int direction(const char *addr, fiber_queue **tx, fiber_queue **rx)
{
    int rc = fiber_queue_create(tx, PIPE_CAPACITY);
    if (rc == 0)
        rc = fb_queue_attach(rx, addr, fb_rt_token(), fb_queue_obj(*tx));
    /* No end is a creator's handle: freeing an end (say in the master,
     * after handing it to a child) must not destroy a direction the other
     * end still uses.  The queues live until the server stops. */
    if (*tx)
        fb_queue_disown(*tx);
    return rc;
}

FIBER_API int fiber_pipe_create(fiber_pipe **a, fiber_pipe **b, int duplex)
{
    if (!a || !b)
        return fb_err(FIBER_EINVAL, "fiber_pipe_create: a or b is NULL");
    fiber_queue *ab = NULL, *ab2 = NULL, *ba = NULL, *ba2 = NULL;
    fiber_pipe *pa = NULL, *pb = NULL;
    struct fb_objsrv *s;
    uint32_t rdv = 0;
    int rc = fb_master_objsrv(&s);
    if (rc == 0)
        rc = rdv_create(s, &rdv);
    if (rc == 0)
        rc = direction(fb_objsrv_address(s), &ab, &ab2);
    if (rc == 0 && duplex)
        rc = direction(fb_objsrv_address(s), &ba, &ba2);
    if (rc == 0)
        rc = pipe_end(&pa, 0, fb_objsrv_address(s), fb_rt_token(), rdv, ab,
                      ba2);
    if (rc == 0)
        rc = pipe_end(&pb, 1, fb_objsrv_address(s), fb_rt_token(), rdv, ba,
                      ab2);
    if (rc) {
        if (pa)
            fiber_pipe_free(pa);
        else {
            fiber_queue_free(ab);
            fiber_queue_free(ba2);
        }
        fiber_queue_free(ba);
        fiber_queue_free(ab2);
        return rc;
    }
    *a = pa;
    *b = pb;
    return 0;
}

FIBER_API void fiber_pipe_free(fiber_pipe *p)
{
    if (!p || check_pipe(p))
        return;
    live_remove(p);
    pthread_mutex_lock(&p->mu);
    p->magic = 0;
    if (fb_conn_fd(&p->link) >= 0 && !p->broken)
        drain_to(p, 0, 10000, fb_deadline_ms(10000)); /* sends go out */
    p->fl_stop = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    if (p->has_flusher)
        pthread_join(p->flusher, NULL);
    stop_listening(p);
    fb_conn_close(&p->link);
    fiber_buf_free(&p->spare);
    fiber_queue_free(p->send);
    fiber_queue_free(p->recv);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cond);
    free(p);
}

void fb_pipes_drain(uint64_t deadline_ms)
{
    pthread_mutex_lock(&live_mu);
    for (fiber_pipe *p = live; p; p = p->next_live) {
        pthread_mutex_lock(&p->mu);
        if (fb_conn_fd(&p->link) >= 0 && !p->broken &&
            (p->state == S_LINKING || p->state == S_LINKED))
            drain_to(p, 0, fb_ms_left(deadline_ms), deadline_ms);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

/* For tests: whether p is linked directly (1), and where it listens while
 * it waits for the other end ("" when it does not). */
int fb_pipe_peek(fiber_pipe *p, char *listening, size_t size)
{
    if (check_pipe(p))
        return -1;
    pthread_mutex_lock(&p->mu);
    int linked = p->state == S_LINKED;
    fb_strlcpy(listening, p->listen_fd >= 0 ? p->bound : "", size);
    pthread_mutex_unlock(&p->mu);
    return linked;
}
