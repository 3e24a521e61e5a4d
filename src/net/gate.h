/*
 * gate.h -- the door every listening socket of a run keeps: checking a
 * peer's HELLO, and holding the peers that have not sent one yet.
 *
 * Every server of a run (the master's service thread, each object server
 * and manager, each blob server, a ring member while it links) admits a
 * connection only once its first frame is a HELLO with the run's token
 * (compared in constant time) and the program's build id:
 * fb_hello_check() is that check, and the only one.
 *
 * Until then the connection waits in the server's gate (struct fb_gate):
 *   - at most `cap` wait at once; a newcomer closes the one that has
 *     waited longest (a real child sends HELLO within milliseconds of
 *     connecting, so under a flood of silent strangers a stranger goes;
 *     refusing the newcomer instead would lock every new child out for as
 *     long as the strangers' deadline), logged once per burst and once
 *     more when the burst is over;
 *   - each waits at most `timeout_ms` (fb_gate_tick drops the late);
 *   - each may send frames of at most FB_GATE_HELLO_MAX bytes (the caller
 *     makes its conn with that limit: a header announcing more ends the
 *     connection before anything is allocated);
 *   - one that fails is closed with its reason in the log: a well-formed
 *     HELLO that fails a check is first told why (REJECT); anything else
 *     (garbage, another first message) gets no answer.
 *
 * The gate links the peers it holds through a struct fb_gate_peer that
 * the caller embeds in its own connection record, and closes one through
 * the caller's close function (which frees the record).  A peer that
 * passes leaves the gate (fb_gate_admit) and its connection stays the
 * caller's.
 *
 * Threading: a gate is used by one thread at a time, the server's.  The
 * close function is called from fb_gate_add, _drop, _reject,
 * _drop_oldest, _serve, _tick and _clear only (each closes only the peer
 * it names, except _add, which may close the oldest, and _tick and
 * _clear), so a server that must not free a record named by the events
 * it is still handling calls _add between event batches: it accepts
 * after the batch.
 */
#ifndef FB_NET_GATE_H
#define FB_NET_GATE_H

#include <stddef.h>
#include <stdint.h>

#include "net/net.h"
#include "wire/wire.h"

/* The largest frame a peer may send before it is admitted: HELLO is
 * under 200 bytes. */
#define FB_GATE_HELLO_MAX 1024u

/* The job id a watcher's HELLO carries (no job has it). */
#define FB_GATE_WATCHER_JOB 0u

/* What is wrong with a first frame (fb_hello_check). */
enum fb_hello_fault {
    FB_HELLO_OK = 0,
    FB_HELLO_NOT_HELLO, /* another type of message came first */
    FB_HELLO_MALFORMED, /* a HELLO whose payload does not decode */
    FB_HELLO_TOKEN,     /* not the run's token */
    FB_HELLO_BUILD,     /* another program's build id */
};

/* Checks that the frame (h, p) is a well-formed HELLO carrying token
 * (FB_WIRE_TOKEN_LEN bytes, compared in constant time) and build_id.
 * Returns FB_HELLO_OK, or the first fault with why (a phrase: "first
 * message was PING, not HELLO", "authentication failed: wrong token",
 * "built from a different program (build id X; this one's is Y)") in
 * why[size].  *m is the decoded HELLO (views into p) whenever it decoded:
 * for FB_HELLO_OK, _TOKEN and _BUILD. */
int fb_hello_check(const struct fb_wire_hdr *h, const uint8_t *p,
                   const uint8_t *token, const char *build_id,
                   struct fb_msg_hello *m, char *why, size_t size);

/* What a gate holds of one waiting peer; embedded in the caller's
 * connection record. */
struct fb_gate_peer {
    struct fb_conn *conn; /* the peer's connection (the caller's) */
    uint64_t deadline_ms; /* dropped when it passes */
    struct fb_gate_peer *newer, *older;
    int in_gate; /* 1 from fb_gate_add until it is admitted or closed */
};

struct fb_gate {
    const char *who;   /* names the server in the log ("object server") */
    int cap;        /* 0: max_pending_connections (fb_net_config), read
                       at each add */
    int timeout_ms; /* 0: connect_timeout_ms (fb_net_config), read at each
                       add */
    /* Closes p's connection and frees the record that holds it; p is
     * already out of the gate. */
    void (*close)(struct fb_gate_peer *p, void *arg);
    /* May be NULL.  Called by fb_gate_serve with a HELLO that decoded but
     * failed a check (fault, why), just before it rejects the peer: the
     * master notes why on the job the HELLO names. */
    void (*on_refused)(const struct fb_msg_hello *m, int fault, const char *why,
                    void *arg);
    void *arg;
    /* 1: a HELLO that names job 0 (FB_GATE_WATCHER_JOB) is held to the
     * token alone, not to the build id: the master's watchers (`fiber
     * top`, runtime/stats_srv.c) are another program than the run's.  The
     * caller tells a watcher from a job by that job id. */
    int watchers;
    struct fb_gate_peer *newest, *oldest;
    int n;                  /* peers waiting */
    uint64_t dropped;       /* peers closed for failing, late or for room */
    uint64_t refused;       /* of those, closed to make room */
    uint64_t burst_refused; /* closed to make room in the current burst */
    uint64_t burst_last_ms; /* when the last of them was */
};

/* Sets up an empty gate. */
void fb_gate_init(struct fb_gate *g, const char *who, int cap,
                  int timeout_ms,
                  void (*close)(struct fb_gate_peer *p, void *arg),
                  void *arg);

/* How many connections the server should accept now: the room left
 * under the cap, at most FB_GATE_ACCEPT_BATCH, or 1 when there is none
 * (that one makes room by closing the oldest stranger, so that a flood of
 * silent connections cannot keep newcomers out).  A server accepts at most this many between two
 * batches of events, so that peers whose HELLO is already in their
 * socket are admitted before newer ones push them out: a burst of a
 * thousand real children connecting at once closes none of them. */
#define FB_GATE_ACCEPT_BATCH 64
int fb_gate_room(const struct fb_gate *g);

/* Makes room for one more peer (closing the oldest while cap wait) and
 * adds p, whose connection is conn, with its deadline. */
void fb_gate_add(struct fb_gate *g, struct fb_gate_peer *p,
                 struct fb_conn *conn);

/* p proved itself: it leaves the gate; its connection stays open. */
void fb_gate_admit(struct fb_gate *g, struct fb_gate_peer *p);

/* Drops p: logs why ("WHO: dropping peer on fd N: why"), counts it and
 * closes it.  fb_gate_reject first sends REJECT with why (best effort:
 * one non-blocking write). */
void fb_gate_drop(struct fb_gate *g, struct fb_gate_peer *p,
                  const char *why);
void fb_gate_reject(struct fb_gate *g, struct fb_gate_peer *p,
                    const char *why);
/* Drops the peer that has waited longest, if any (the server is out of
 * descriptors: room for the next). */
void fb_gate_drop_oldest(struct fb_gate *g, const char *why);

/* Reads what p sent and judges its first frame against token and
 * build_id.  Returns 1 when it is the right HELLO (in *m; p is still in
 * the gate, for the caller's own checks: then fb_gate_admit or
 * fb_gate_reject), 0 while p has not sent a whole frame, or -1 after
 * dropping p (it closed, its stream broke, or its first frame was wrong:
 * rejected as fb_hello_check says). */
int fb_gate_serve(struct fb_gate *g, struct fb_gate_peer *p,
                  const uint8_t *token, const char *build_id,
                  struct fb_msg_hello *m);

/* Drops the peers whose deadline has passed by now, and logs the end of
 * a burst of evictions that is over.  Returns the time of the next
 * deadline or burst end (UINT64_MAX: none). */
uint64_t fb_gate_tick(struct fb_gate *g, uint64_t now);

/* Closes every waiting peer without counting or logging it (the server
 * stops). */
void fb_gate_clear(struct fb_gate *g);

#endif /* FB_NET_GATE_H */
