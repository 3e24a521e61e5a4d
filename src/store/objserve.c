/*
 * objserve.c -- the blob server: sends shared objects to the processes
 * that ask for them.
 *
 * One thread per server, started by fb_oserve_start and stopped by
 * fb_oserve_stop (which joins it).  It owns a listening socket and its
 * connections; a client waits in the server's gate (net/gate.h) until it
 * proves itself with HELLO (the run's token, the build id), then sends
 * OBJ_GET for a ref and gets OBJ_DATA pieces, an OBJ_NONE, or (from the
 * master) an OBJ_FROM naming a holder to ask.
 *
 * The master's server keeps the directory: which workers hold each blob
 * (OBJ_HAVE), how many askers each is serving (load, settled by the
 * asker's next OBJ_HAVE / OBJ_BAD or its going away), and who waits.  Its
 * rule for an asker, per blob:
 *   1. a holder with fewer than FB_BLOB_FANOUT askers: send it there;
 *   2. else a master slot (fewer than FB_BLOB_MASTER_SLOTS copies being
 *      sent, and fewer than FB_BLOB_MASTER_COPIES sent, or no holder at
 *      all): the master sends it;
 *   3. else wait, until a holder finishes serving someone, a copy lands
 *      (its receiver becomes a holder), or a holder goes.
 * So a broadcast grows as a tree whose nodes each feed two more at a
 * time (each asker gets a whole link's speed, and becomes a holder
 * soon), and the master's bytes stay near a few copies of the blob
 * however many ask.
 * A child's server (a relay) serves only blobs it holds in full.
 *
 * On the master's host the answer is instead the blob's place: OBJ_AT
 * (its region in the arena, arena.c) or OBJ_FILE (a file of its own).
 * The directory counts, per connection, the arena blobs it placed (until
 * OBJ_DROP or the connection goes, or in limbo until its process goes:
 * see release_holds), so that no region is reused while a process may
 * read it.
 *
 * Sending never copies a whole blob into a buffer: pieces of PIECE bytes
 * are queued while less than QUEUE_MAX bytes wait on the connection.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"
#include "net/gate.h"
#include "net/listener.h"
#include "net/net.h"
#include "runtime/runtime.h"
#include "store/object_int.h"

#define PIECE (256u << 10)
#define QUEUE_MAX (1u << 20)
#define MAX_CONNS 65536

static char EV_LISTEN_TAG, EV_STOP_TAG;
#define EV_LISTEN ((void *)&EV_LISTEN_TAG)
#define EV_STOP ((void *)&EV_STOP_TAG)

/* A blob being sent on a connection. */
struct xfer {
    struct fb_blob *b; /* pinned */
    uint64_t id;
    size_t off;
    struct xfer *next;
};

/* An arena blob a connection's process may read (see arena.c). */
struct hold {
    struct fb_blob *b;
    pid_t pid;         /* in limbo: the process that may still read it */
    struct hold *next;
};

/* Holds of connections that closed while their process still lived (it
 * may reconnect, but its views of the arena stay): freed once that
 * process is gone, checked when the arena is full (fb_oserve_reap) and
 * at shutdown.  Guarded by the blobs lock. */
static struct hold *limbo;

struct fb_sconn {
    struct fb_conn conn;
    int authed;
    int doomed;
    int want_out;
    struct fb_gate_peer peer; /* until authed: in the server's gate */
    struct xfer *xq, *xq_tail;
    /* master: the holder this asker was last sent to, until settled */
    struct fb_blob *redir_blob;
    /* master: the blob it was sent a copy of, holding a master slot
     * until it says it has it (or fails, or goes) */
    struct fb_blob *copy_blob;
    char redir_addr[FB_WIRE_ADDR_MAX + 1];
    /* master: the arena blobs it was told to read there (OBJ_AT) and has
     * not dropped (OBJ_DROP); a blob at most once */
    struct hold *holds;
    pid_t peer_pid; /* SO_PEERCRED on a unix socket, else 0 */
    struct fb_sconn *prev, *next;
    int kicked;                /* on the server's kick list */
    struct fb_sconn *kick_next;
};

struct fb_oserve {
    int directory;
    struct fb_listener l; /* socket, epoll set, stop eventfd, thread */
    int stopping;
    struct fb_sconn *conns;
    int n_conns;
    struct fb_gate gate; /* the conns not yet through HELLO */
    /* Connections given work by someone else's event (a waiter placed
     * when a copy finished): the loop pumps them after the events. */
    struct fb_sconn *kick;
};

static void kick(struct fb_oserve *s, struct fb_sconn *c)
{
    if (c->kicked)
        return;
    c->kicked = 1;
    c->kick_next = s->kick;
    s->kick = c;
}

static void unkick(struct fb_oserve *s, struct fb_sconn *c)
{
    if (!c->kicked)
        return;
    for (struct fb_sconn **pp = &s->kick; *pp; pp = &(*pp)->kick_next)
        if (*pp == c) {
            *pp = c->kick_next;
            break;
        }
    c->kicked = 0;
}

static void pump(struct fb_oserve *s, struct fb_sconn *c);

/* ---- connections ---------------------------------------------------------- */

/* Admits a new connection into the gate (which closes the oldest stranger
 * when max_pending_connections wait).  Called only between event
 * batches, since making room closes connections the batch may name. */
static void conn_add(struct fb_oserve *s, int fd)
{
    struct fb_sconn *c = s->n_conns < MAX_CONNS ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        close(fd);
        return;
    }
    if (fb_listener_adopt(&s->l, &c->conn, fd, c, fb_rt_token()) != 0) {
        free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 &&
        clen == sizeof cred && cred.pid > 0 && cred.pid != getpid())
        c->peer_pid = cred.pid;
    fb_gate_add(&s->gate, &c->peer, &c->conn);
}

/* Lock held.  The asker c's last redirect is over: its holder is free
 * for another. */
static void serve_waiters(struct fb_oserve *s, struct fb_blob *b);

static void settle(struct fb_oserve *s, struct fb_sconn *c)
{
    struct fb_blob *copy = c->copy_blob;
    if (copy) {
        c->copy_blob = NULL;
        copy->master_active--;
        serve_waiters(s, copy);
        fb_blob_unpin(copy);
    }
    struct fb_blob *b = c->redir_blob;
    if (!b)
        return;
    c->redir_blob = NULL;
    for (struct fb_holder *h = b->holders; h; h = h->next)
        if (strcmp(h->addr, c->redir_addr) == 0 && h->load > 0) {
            h->load--;
            break;
        }
    serve_waiters(s, b); /* that holder may take the next */
    fb_blob_unpin(b);
}

static void serve_waiters_of(struct fb_blob *b, void *arg)
{
    serve_waiters(arg, b);
}

static void drop_holders_of(struct fb_blob *b, void *arg)
{
    struct fb_holder **pp = &b->holders;
    while (*pp) {
        struct fb_holder *h = *pp;
        if (h->owner == arg) {
            *pp = h->next;
            free(h);
        } else {
            pp = &h->next;
        }
    }
    struct fb_waiter **wp = &b->waiters;
    while (*wp) {
        struct fb_waiter *w = *wp;
        if (w->conn == arg) {
            *wp = w->next;
            free(w);
            fb_blob_unpin(b);
        } else {
            wp = &w->next;
        }
    }
}

/* Lock held.  c's process goes on reading what c held in the arena
 * while it lives: a live one's holds wait in limbo. */
static void release_holds(struct fb_sconn *c)
{
    int alive = c->peer_pid > 0 &&
                (kill(c->peer_pid, 0) == 0 || errno == EPERM);
    while (c->holds) {
        struct hold *h = c->holds;
        c->holds = h->next;
        if (alive) {
            h->pid = c->peer_pid;
            h->next = limbo;
            limbo = h;
        } else {
            fb_blob_unhold(h->b);
            free(h);
        }
    }
}

void fb_oserve_reap(int all)
{
    for (struct hold **pp = &limbo; *pp;) {
        struct hold *h = *pp;
        if (all || (kill(h->pid, 0) != 0 && errno == ESRCH)) {
            *pp = h->next;
            fb_blob_unhold(h->b);
            free(h);
        } else {
            pp = &h->next;
        }
    }
}

/* Closes c and frees it, with what it held (a stranger holds nothing). */
static void conn_drop(struct fb_oserve *s, struct fb_sconn *c)
{
    if (c->authed) {
        fb_blobs_lock();
        release_holds(c);
        if (s->directory)
            fb_blobs_each(drop_holders_of, c);
        settle(s, c); /* a master slot it held goes to someone waiting */
        if (s->directory) /* its holdings are gone: the master may serve */
            fb_blobs_each(serve_waiters_of, s);
        while (c->xq) {
            struct xfer *x = c->xq;
            c->xq = x->next;
            fb_blob_unpin(x->b);
            free(x);
        }
        fb_blobs_unlock();
    }
    fb_gate_admit(&s->gate, &c->peer); /* out of it, if still in */
    unkick(s, c);
    fb_listener_drop(&s->l, &c->conn);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    free(c);
}

static void send_now(struct fb_oserve *s, struct fb_sconn *c)
{
    if (c->doomed)
        return;
    if (fb_listener_flush(&s->l, &c->conn, c, &c->want_out) < 0)
        c->doomed = 1;
}

/* ---- answering ------------------------------------------------------------ */

/* Lock held.  Queues b for c (pinning it). */
static int queue_xfer(struct fb_sconn *c, struct fb_blob *b, uint64_t id,
                      int by_master)
{
    struct xfer *x = calloc(1, sizeof *x);
    if (!x)
        return -1;
    x->b = b;
    x->id = id;
    fb_blob_pin(b);
    if (by_master) {
        /* The slot is held until the asker says it has the blob. */
        b->master_active++;
        b->master_sent++;
        c->copy_blob = b;
        fb_blob_pin(b);
    }
    if (c->xq_tail)
        c->xq_tail->next = x;
    else
        c->xq = x;
    c->xq_tail = x;
    return 0;
}

/* Lock held.  Sends asker c to holder h. */
static void redirect(struct fb_sconn *c, struct fb_blob *b,
                     struct fb_holder *h, uint64_t id)
{
    h->load++;
    c->redir_blob = b;
    fb_blob_pin(b);
    fb_strlcpy(c->redir_addr, h->addr, sizeof c->redir_addr);
    if (fb_wire_put_obj_from(fb_conn_out(&c->conn), id, h->addr) != 0)
        c->doomed = 1;
    fb_blobs_note_sent(0, 0, 1);
}

/* Lock held.  The holder with the lowest load that is not c itself. */
static struct fb_holder *least_loaded(struct fb_blob *b, struct fb_sconn *c)
{
    struct fb_holder *best = NULL;
    for (struct fb_holder *h = b->holders; h; h = h->next)
        if (h->owner != c && (!best || h->load < best->load))
            best = h;
    return best;
}

/* Lock held.  The directory's rule (see the top of the file).  Returns 1
 * when c was answered or queued, 0 when it must wait. */
static int place_asker(struct fb_sconn *c, struct fb_blob *b, uint64_t id)
{
    struct fb_holder *h = least_loaded(b, c);
    if (h && h->load < FB_BLOB_FANOUT) {
        redirect(c, b, h, id);
        return 1;
    }
    if (b->master_active < FB_BLOB_MASTER_SLOTS &&
        (!h || b->master_sent < FB_BLOB_MASTER_COPIES)) {
        if (queue_xfer(c, b, id, 1) != 0)
            c->doomed = 1;
        return 1;
    }
    return 0;
}

/* Lock held.  Places the askers waiting on b while it has room. */
static void serve_waiters(struct fb_oserve *s, struct fb_blob *b)
{
    if (!b->waiters)
        return;
    fb_blob_pin(b); /* the last waiter's unpin must not free it here */
    while (b->waiters) {
        struct fb_waiter *w = b->waiters;
        if (w->conn->doomed || !place_asker(w->conn, b, w->id)) {
            if (!w->conn->doomed)
                break;
        }
        b->waiters = w->next;
        kick(s, w->conn);
        free(w);
        fb_blob_unpin(b);
    }
    fb_blob_unpin(b);
}

/* Lock held.  c's process may read b in the arena until it drops it. */
static int hold_add(struct fb_sconn *c, struct fb_blob *b)
{
    for (struct hold *h = c->holds; h; h = h->next)
        if (h->b == b)
            return 0;
    struct hold *h = calloc(1, sizeof *h);
    if (!h)
        return -1;
    h->b = b;
    h->next = c->holds;
    c->holds = h;
    fb_blob_hold(b);
    return 0;
}

/* OBJ_DROP: c's process no longer reads that blob in the arena.  A ref it
 * does not hold is ignored: a drop can cross the master's own release,
 * and a process dropping what it never held harms nobody else. */
static int on_drop(struct fb_sconn *c, const struct fb_wire_hdr *h,
                   const uint8_t *p)
{
    const uint8_t *ref;
    fb_wire_get_obj_drop(p, h->len, &ref, NULL, 0);
    fb_blobs_lock();
    for (struct hold **pp = &c->holds; *pp; pp = &(*pp)->next) {
        struct hold *hd = *pp;
        if (memcmp(hd->b->ref, ref, FB_WIRE_REF_LEN) == 0) {
            *pp = hd->next;
            fb_blob_unhold(hd->b);
            free(hd);
            break;
        }
    }
    fb_blobs_unlock();
    return 0;
}

static int on_get(struct fb_oserve *s, struct fb_sconn *c,
                  const struct fb_wire_hdr *h, const uint8_t *p)
{
    const uint8_t *ref;
    fb_wire_get_obj_get(p, h->len, &ref, NULL, 0);
    fb_blobs_lock();
    settle(s, c); /* a new ask ends the last one */
    struct fb_blob *b = fb_blob_find(ref);
    int rc = 0;
    if (!b || !b->data) {
        rc = fb_wire_put_obj_none(fb_conn_out(&c->conn), h->id, FIBER_ENOKEY,
                                  s->directory
                                      ? "no shared object has this ref (it "
                                        "was never put, or was released)"
                                      : "this holder does not have it");
    } else if (!s->directory) {
        rc = queue_xfer(c, b, h->id, 0);
    } else if (b->in_arena && strncmp(s->l.address, "unix:", 5) == 0) {
        /* Same host: read it in the arena, which keeps its place while c
         * holds it. */
        rc = fb_wire_put_obj_at(fb_conn_out(&c->conn), h->id, b->arena_off,
                                fb_arena_path(b->arena_seg));
        if (rc == 0 && hold_add(c, b) != 0)
            rc = -1;
        fb_blobs_note_map();
    } else if (b->shm_path[0] && strncmp(s->l.address, "unix:", 5) == 0) {
        /* Same host: map the master's own copy. */
        rc = fb_wire_put_obj_file(fb_conn_out(&c->conn), h->id, b->shm_path);
        fb_blobs_note_map();
    } else if (!place_asker(c, b, h->id)) {
        struct fb_waiter *w = calloc(1, sizeof *w);
        if (w) {
            w->conn = c;
            w->id = h->id;
            w->next = b->waiters;
            b->waiters = w;
            fb_blob_pin(b);
        } else {
            rc = -1;
        }
    }
    fb_blobs_unlock();
    return rc ? -1 : 0;
}

/* OBJ_HAVE: the sender now holds the blob and serves it at addr. */
static int on_have(struct fb_oserve *s, struct fb_sconn *c,
                   const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fb_msg_obj_have m;
    fb_wire_get_obj_have(p, h->len, &m, NULL, 0);
    fb_blobs_lock();
    struct fb_blob *b = fb_blob_find(m.ref);
    int rc = 0;
    if (b && b->data) {
        struct fb_holder *hd = calloc(1, sizeof *hd);
        if (hd) {
            memcpy(hd->addr, m.addr, m.addr_len);
            hd->owner = c;
            hd->next = b->holders;
            b->holders = hd;
        } else {
            rc = -1;
        }
    }
    /* settle may drop the last pin of b (this connection's copy of it,
     * after the master freed the object): b is pinned until it is used. */
    if (b)
        fb_blob_pin(b);
    settle(s, c); /* after adding it: waiters may go to the new holder */
    if (b && b->data)
        serve_waiters(s, b);
    if (b)
        fb_blob_unpin(b);
    fb_blobs_unlock();
    return rc;
}

/* OBJ_BAD: the holder at addr failed to give the blob: forget it there. */
static int on_bad(struct fb_oserve *s, struct fb_sconn *c,
                  const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fb_msg_obj_have m;
    fb_wire_get_obj_bad(p, h->len, &m, NULL, 0);
    fb_blobs_lock();
    settle(s, c);
    struct fb_blob *b = fb_blob_find(m.ref);
    for (struct fb_holder **pp = b ? &b->holders : NULL; pp && *pp;) {
        struct fb_holder *hd = *pp;
        if (strlen(hd->addr) == m.addr_len &&
            memcmp(hd->addr, m.addr, m.addr_len) == 0) {
            *pp = hd->next;
            free(hd);
        } else {
            pp = &hd->next;
        }
    }
    fb_blobs_unlock();
    return 0;
}

int fb_oserve_frame(struct fb_oserve *s, struct fb_sconn *c,
                    const struct fb_wire_hdr *h, const uint8_t *p)
{
    switch (h->type) {
    case FB_MSG_OBJ_GET:
        return on_get(s, c, h, p);
    case FB_MSG_OBJ_HAVE:
        return s->directory ? on_have(s, c, h, p) : -1;
    case FB_MSG_OBJ_BAD:
        return s->directory ? on_bad(s, c, h, p) : -1;
    case FB_MSG_OBJ_DROP:
        return s->directory ? on_drop(c, h, p) : -1;
    case FB_MSG_PING:
        return fb_wire_put_pong(fb_conn_out(&c->conn), h->id) == 0 ? 0 : -1;
    }
    return -1;
}

/* ---- sending -------------------------------------------------------------- */

/* Queues pieces of c's transfers while little waits on the socket. */
static void pump_some(struct fb_sconn *c)
{
    while (c->xq && !c->doomed &&
           fb_conn_unsent(&c->conn) < QUEUE_MAX) {
        struct xfer *x = c->xq;
        size_t n = x->b->len - x->off;
        if (n > PIECE)
            n = PIECE;
        if (fb_wire_put_obj_data_hdr(fb_conn_out(&c->conn), x->id, x->off,
                                     (uint32_t)n) != 0 ||
            fiber_buf_append(fb_conn_out(&c->conn), x->b->data + x->off,
                             n) != 0) {
            c->doomed = 1;
            break;
        }
        x->off += n;
        fb_blobs_lock();
        fb_blobs_note_sent(n, x->off == x->b->len, 0);
        if (x->off == x->b->len) {
            c->xq = x->next;
            if (!c->xq)
                c->xq_tail = NULL;
            fb_blob_unpin(x->b);
            free(x);
        }
        fb_blobs_unlock();
    }
}

/* Until the socket is full (EPOLLOUT then calls again) or nothing is
 * left to send. */
static void pump(struct fb_oserve *s, struct fb_sconn *c)
{
    do {
        pump_some(c);
        send_now(s, c);
    } while (c->xq && !c->doomed && !c->want_out);
}

/* ---- the loop ------------------------------------------------------------- */

/* The gate's close function: a peer that never authenticated goes. */
static void gate_close(struct fb_gate_peer *p, void *arg)
{
    conn_drop(arg, (struct fb_sconn *)((char *)p -
                                       offsetof(struct fb_sconn, peer)));
}

/* Reads what c sent while it is in the gate.  Returns 0 once it proved
 * itself (HELLO with the run's token and build id: WELCOME is queued),
 * else -1: it has not said enough yet, or it was dropped. */
static int admit(struct fb_oserve *s, struct fb_sconn *c)
{
    struct fb_msg_hello m;
    if (fb_gate_serve(&s->gate, &c->peer, fb_rt_token(), fb_rt_build_id(),
                      &m) != 1)
        return -1;
    fb_gate_admit(&s->gate, &c->peer);
    c->authed = 1;
    fb_conn_set_max_payload(&c->conn, 1u << 16); /* requests are small */
    struct fb_msg_welcome w = {0};
    fb_wire_put_welcome(fb_conn_out(&c->conn), &w);
    return 0;
}

static void on_conn(struct fb_oserve *s, struct fb_sconn *c, uint32_t events)
{
    if (events & EPOLLOUT) {
        pump(s, c);
        if (c->doomed)
            conn_drop(s, c);
        return;
    }
    if (!c->authed && admit(s, c) != 0)
        return;
    int rc = fb_conn_read(&c->conn);
    struct fb_wire_hdr h;
    const uint8_t *p;
    int got = 0;
    while (!c->doomed && (got = fb_conn_next(&c->conn, &h, &p)) == 1) {
        if (fb_oserve_frame(s, c, &h, p) != 0) {
            c->doomed = 1;
            break;
        }
    }
    if (!c->doomed && (got < 0 || rc != 0))
        c->doomed = 1;
    if (!c->doomed)
        pump(s, c);
    if (c->doomed)
        conn_drop(s, c);
}

/* Accepts what the gate has room for, after a batch of events (see
 * conn_add, fb_gate_room); the rest wait in the listen backlog for the
 * next batch (the listener stays readable). */
static void accept_all(struct fb_oserve *s)
{
    int fd;
    int room = fb_gate_room(&s->gate);
    for (int i = 0; i < room; i++) {
        if (fb_sock_accept(s->l.listen_fd, &fd) != 0)
            return;
        conn_add(s, fd);
    }
}

static void *serve_main(void *arg)
{
    struct fb_oserve *s = arg;
    struct epoll_event evs[64];
    while (!s->stopping) {
        uint64_t now = fb_now_ms();
        uint64_t next = fb_gate_tick(&s->gate, now);
        int timeout = next - now < 1000 ? (int)(next - now) : 1000;
        int n = epoll_wait(s->l.epfd, evs, 64, timeout);
        int listener = 0;
        for (int i = 0; i < n && !s->stopping; i++) {
            void *d = evs[i].data.ptr;
            if (d == EV_STOP)
                s->stopping = 1;
            else if (d == EV_LISTEN)
                listener = 1;
            else
                on_conn(s, d, evs[i].events);
        }
        while (s->kick && !s->stopping) {
            struct fb_sconn *c = s->kick;
            s->kick = c->kick_next;
            c->kicked = 0;
            pump(s, c);
            if (c->doomed)
                conn_drop(s, c);
        }
        if (listener && !s->stopping)
            accept_all(s);
    }
    return NULL;
}

int fb_oserve_start(struct fb_oserve **out, const char *addr, int directory)
{
    struct fb_oserve *s = calloc(1, sizeof *s);
    if (!s)
        return fb_err(FIBER_ENOMEM, "out of memory");
    s->directory = directory;
    int rc = fb_listener_serve(&s->l, &s->gate, addr, "blob server",
                               EV_LISTEN, EV_STOP, gate_close, serve_main, s,
                               "the blob server thread");
    if (rc) {
        fb_oserve_stop(s);
        return rc;
    }
    *out = s;
    return 0;
}

const char *fb_oserve_address(const struct fb_oserve *s)
{
    return s->l.address;
}

void fb_oserve_stop(struct fb_oserve *s)
{
    if (!s)
        return;
    fb_listener_halt(&s->l, &s->gate);
    while (s->conns)
        conn_drop(s, s->conns);
    fb_listener_close(&s->l);
    free(s);
}

/* ---- for the fuzz target (tests/fuzz/fuzz_blobs.c) ------------------------ */

struct fb_oserve *fb_oserve_detached(int directory)
{
    struct fb_oserve *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->directory = directory;
    fb_listener_init(&s->l);
    fb_gate_init(&s->gate, "blob server", 0, 0, gate_close, s);
    s->l.epfd = epoll_create1(EPOLL_CLOEXEC);
    snprintf(s->l.address, sizeof s->l.address, "unix:/nonexistent/fuzz.sock");
    return s;
}

struct fb_sconn *fb_oserve_adopt(struct fb_oserve *s, int fd)
{
    struct fb_sconn *before = s->conns;
    conn_add(s, fd);
    if (s->conns == before)
        return NULL;
    s->conns->peer_pid = 0; /* its holds go with it: nothing in limbo */
    fb_gate_admit(&s->gate, &s->conns->peer);
    s->conns->authed = 1;
    fb_conn_set_max_payload(&s->conns->conn, 1u << 16);
    return s->conns;
}

int fb_oserve_step(struct fb_oserve *s, struct fb_sconn *c)
{
    if (!c->doomed)
        pump(s, c);
    while (s->kick) {
        struct fb_sconn *k = s->kick;
        s->kick = k->kick_next;
        k->kicked = 0;
        pump(s, k);
        if (k->doomed && k != c)
            conn_drop(s, k);
    }
    if (c->doomed) {
        conn_drop(s, c);
        return -1;
    }
    return 0;
}

void fb_oserve_drop(struct fb_oserve *s, struct fb_sconn *c)
{
    conn_drop(s, c);
}

/* Lock held by the caller.  The directory's books: every blob's
 * master_active equals the conns holding one of its master slots, no
 * load is negative.  Returns 0, or -1 with why. */
static int check_blob(struct fb_oserve *s, struct fb_blob *b, char *why,
                      size_t size)
{
    int slots = 0;
    for (struct fb_sconn *c = s->conns; c; c = c->next)
        slots += c->copy_blob == b;
    if (slots != b->master_active) {
        snprintf(why, size, "master_active %d, %d conns hold a slot",
                 b->master_active, slots);
        return -1;
    }
    for (struct fb_holder *h = b->holders; h; h = h->next)
        if (h->load < 0) {
            snprintf(why, size, "holder load %d", h->load);
            return -1;
        }
    if (b->pins < 0) {
        snprintf(why, size, "pins %d", b->pins);
        return -1;
    }
    int holds = 0;
    for (struct fb_sconn *c = s->conns; c; c = c->next)
        for (struct hold *h = c->holds; h; h = h->next)
            holds += h->b == b;
    for (struct hold *h = limbo; h; h = h->next)
        holds += h->b == b;
    if (holds != b->child_holds) {
        snprintf(why, size, "child_holds %d, %d holds name it",
                 b->child_holds, holds);
        return -1;
    }
    return 0;
}

struct check_ctx {
    struct fb_oserve *s;
    char *why;
    size_t size;
    int bad;
};

static void check_one(struct fb_blob *b, void *arg)
{
    struct check_ctx *k = arg;
    if (!k->bad && check_blob(k->s, b, k->why, k->size) != 0)
        k->bad = 1;
}

int fb_oserve_check(struct fb_oserve *s, char *why, size_t size)
{
    struct check_ctx k = {s, why, size, 0};
    fb_blobs_lock();
    fb_blobs_each(check_one, &k);
    fb_blobs_unlock();
    return k.bad ? -1 : 0;
}
