/*
 * gate.c -- checking a peer's HELLO, and the peers that have not sent one
 * yet.  See gate.h.
 */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "base/common.h"
#include "base/log.h"
#include "net/gate.h"
#include "net/net.h"

/* A burst of evictions ends after this long without one. */
#define BURST_QUIET_MS 1000

int fb_hello_check(const struct fb_wire_hdr *h, const uint8_t *p,
                   const uint8_t *token, const char *build_id,
                   struct fb_msg_hello *m, char *why, size_t size)
{
    char err[200];
    if (h->type != FB_MSG_HELLO) {
        snprintf(why, size, "first message was %s, not HELLO",
                 fb_msg_type_name(h->type));
        return FB_HELLO_NOT_HELLO;
    }
    if (fb_wire_get_hello(p, h->len, m, err, sizeof err) != 0) {
        snprintf(why, size, "a malformed HELLO: %s", err);
        return FB_HELLO_MALFORMED;
    }
    if (sodium_memcmp(m->token, token, FB_WIRE_TOKEN_LEN) != 0) {
        snprintf(why, size, "authentication failed: wrong token");
        return FB_HELLO_TOKEN;
    }
    if (m->build_id_len != strlen(build_id) ||
        memcmp(m->build_id, build_id, m->build_id_len) != 0) {
        snprintf(why, size,
                 "built from a different program (build id %.*s; this "
                 "one's is %s)",
                 (int)m->build_id_len, m->build_id, build_id);
        return FB_HELLO_BUILD;
    }
    return FB_HELLO_OK;
}

/* ---- the waiting peers ------------------------------------------------ */

void fb_gate_init(struct fb_gate *g, const char *who, int cap,
                  int timeout_ms,
                  void (*close)(struct fb_gate_peer *p, void *arg),
                  void *arg)
{
    memset(g, 0, sizeof *g);
    g->who = who;
    g->cap = cap;
    g->timeout_ms = timeout_ms;
    g->close = close;
    g->arg = arg;
}

static void unlink_peer(struct fb_gate *g, struct fb_gate_peer *p)
{
    if (!p->in_gate)
        return;
    if (p->newer)
        p->newer->older = p->older;
    else
        g->newest = p->older;
    if (p->older)
        p->older->newer = p->newer;
    else
        g->oldest = p->newer;
    p->newer = p->older = NULL;
    p->in_gate = 0;
    g->n--;
}

static void close_peer(struct fb_gate *g, struct fb_gate_peer *p)
{
    unlink_peer(g, p);
    g->dropped++;
    g->close(p, g->arg);
}

/* Closes the oldest peer to make room for a newcomer.  Logged once per
 * burst (fb_gate_tick logs its end). */
static void evict_oldest(struct fb_gate *g)
{
    struct fb_gate_peer *old = g->oldest;
    if (g->burst_refused++ == 0) {
        if (g->cap)
            fb_log_warn("%s: %d connections are waiting to authenticate "
                        "(at most %d): closing the oldest to make room for "
                        "new ones",
                        g->who, g->n, g->cap);
        else
            fb_log_warn("%s: %d connections are waiting to authenticate "
                        "(max_pending_connections): closing the oldest to "
                        "make room for new ones",
                        g->who, g->n);
    }
    g->refused++;
    g->burst_last_ms = fb_now_ms();
    close_peer(g, old);
}

int fb_gate_room(const struct fb_gate *g)
{
    int cap = g->cap ? g->cap : fb_net_config()->max_pending_connections;
    int room = g->n < cap ? cap - g->n : 1;
    return room < FB_GATE_ACCEPT_BATCH ? room : FB_GATE_ACCEPT_BATCH;
}

void fb_gate_add(struct fb_gate *g, struct fb_gate_peer *p,
                 struct fb_conn *conn)
{
    const struct fb_net_config *cfg = fb_net_config();
    int cap = g->cap ? g->cap : cfg->max_pending_connections;
    int timeout = g->timeout_ms ? g->timeout_ms : cfg->connect_timeout_ms;
    while (g->oldest && g->n >= cap)
        evict_oldest(g);
    p->conn = conn;
    p->deadline_ms = fb_now_ms() + (uint64_t)timeout;
    p->older = g->newest;
    p->newer = NULL;
    if (g->newest)
        g->newest->newer = p;
    else
        g->oldest = p;
    g->newest = p;
    p->in_gate = 1;
    g->n++;
}

void fb_gate_admit(struct fb_gate *g, struct fb_gate_peer *p)
{
    unlink_peer(g, p);
}

void fb_gate_drop(struct fb_gate *g, struct fb_gate_peer *p, const char *why)
{
    fb_log_warn("%s: dropping peer on fd %d: %s", g->who, fb_conn_fd(p->conn),
                why);
    close_peer(g, p);
}

void fb_gate_reject(struct fb_gate *g, struct fb_gate_peer *p,
                    const char *why)
{
    if (fb_wire_put_reject(fb_conn_out(p->conn), why, strlen(why)) == 0)
        fb_conn_flush(p->conn);
    fb_gate_drop(g, p, why);
}

void fb_gate_drop_oldest(struct fb_gate *g, const char *why)
{
    if (g->oldest)
        fb_gate_drop(g, g->oldest, why);
}

int fb_gate_serve(struct fb_gate *g, struct fb_gate_peer *p,
                  const uint8_t *token, const char *build_id,
                  struct fb_msg_hello *m)
{
    struct fb_conn *c = p->conn;
    int rc = fb_conn_read(c);
    struct fb_wire_hdr h;
    const uint8_t *payload;
    int got = fb_conn_next(c, &h, &payload);
    if (got == 1) {
        char why[512];
        int fault = fb_hello_check(&h, payload, token, build_id, m, why,
                                   sizeof why);
        if (fault == FB_HELLO_OK)
            return 1;
        /* The token was checked first: a watcher proved itself. */
        if (fault == FB_HELLO_BUILD && g->watchers &&
            m->job_id == FB_GATE_WATCHER_JOB)
            return 1;
        /* A HELLO that decoded is told why; anything else, nothing. */
        if (fault == FB_HELLO_TOKEN || fault == FB_HELLO_BUILD) {
            if (g->on_refused)
                g->on_refused(m, fault, why, g->arg);
            fb_gate_reject(g, p, why);
        }
        else
            fb_gate_drop(g, p, why);
        return -1;
    }
    if (got == 0 && rc == FIBER_ECLOSED && fb_conn_buffered(c) == 0) {
        /* Closed before saying anything: a job that was being stopped as
         * it dialed, most likely; not worth a warning. */
        fb_log_info("%s: peer on fd %d closed before HELLO", g->who,
                    fb_conn_fd(c));
        close_peer(g, p);
        return -1;
    }
    if (got < 0 || rc != 0) {
        fb_gate_drop(g, p, fb_conn_err_or(c, "closed before HELLO"));
        return -1;
    }
    return 0;
}

uint64_t fb_gate_tick(struct fb_gate *g, uint64_t now)
{
    /* Every peer is looked at: a change of connect_timeout_ms may give a
     * newer peer an earlier deadline than an older one. */
    uint64_t next = UINT64_MAX;
    for (struct fb_gate_peer *p = g->oldest, *newer; p; p = newer) {
        newer = p->newer;
        if (p->deadline_ms <= now)
            fb_gate_drop(g, p, "said nothing valid before "
                               "connect_timeout_ms");
        else if (p->deadline_ms < next)
            next = p->deadline_ms;
    }
    if (g->burst_refused == 0)
        return next;
    uint64_t end = g->burst_last_ms + BURST_QUIET_MS;
    if (now < end)
        return end < next ? end : next;
    fb_log_warn("%s: no longer over %s; closed %llu waiting connections to "
                "make room",
                g->who, g->cap ? "the limit" : "max_pending_connections",
                (unsigned long long)g->burst_refused);
    g->burst_refused = 0;
    return next;
}

void fb_gate_clear(struct fb_gate *g)
{
    while (g->oldest) {
        struct fb_gate_peer *p = g->oldest;
        unlink_peer(g, p);
        g->close(p, g->arg);
    }
}
