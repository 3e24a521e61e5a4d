/*
 * objsrv.h -- object servers and their clients: how queues, pipes, rings
 * and manager objects are shared between processes.
 *
 * An object server listens on its own socket (a unix socket in the run
 * directory, or TCP), admits clients that send HELLO with the run's token
 * and the program's build id, and serves OCALL requests on named objects,
 * answering each with an OREPLY (in any order: a request may wait, e.g. a
 * get on an empty queue, while others are answered).  The master runs one
 * in a thread of its own, started with the first queue, pipe or ring; a
 * manager is a job whose main thread runs one.
 *
 * Objects are kinds registered in a table (fb_obj_kinds): each supplies a
 * create function and ops.  A request an object cannot answer yet is
 * parked on one of its wait queues; the server answers it with
 * FIBER_ETIMEDOUT at its deadline, or drops it when its client goes, and
 * tells every object about a client that went (so a lock it held is
 * released).
 *
 * Threading: a server's state is touched only by its own thread.
 */
#ifndef FB_OBJSRV_H
#define FB_OBJSRV_H

#include <stdint.h>

#include "fiber/fiber.h"
#include "net/net.h"
#include "wire/wire.h"

/* Generic operations; kinds number theirs from FB_OP_KIND. */
#define FB_OP_OPEN 1 /* obj 0; items: kind, name, params... -> u32 id */
/* obj N, no items: destroys the object (fb_obj_destroy) if its kind is
 * `freeable`; FIBER_EINVAL if it is not.  A manager object's release
 * (fiber_mobj_release). */
#define FB_OP_FREE 2
#define FB_OP_KIND 16

struct fb_objsrv;
struct fb_oconn;
struct fb_obj;
struct fb_waitq;
struct fb_owait;

/* A request being served, or parked until it can be. */
struct fb_oreq {
    struct fb_objsrv *srv;
    struct fb_oconn *conn;
    uint64_t id;
    int32_t op;
    uint32_t obj;
    uint64_t deadline_ms; /* UINT64_MAX: none */
    uint32_t count;       /* argument items */
    fiber_iov *items;     /* point into `raw`, owned by the request */
    uint8_t *raw;
    uint64_t aux, aux2;   /* for the object's use while parked */
    struct fb_waitq *wq;  /* the wait queue it is parked on */
    struct fb_oreq *wprev, *wnext;
    struct fb_oreq *pprev, *pnext; /* the server's list of parked */
};

struct fb_waitq {
    struct fb_oreq *head, *tail;
    size_t len;
};

struct fb_obj_ops {
    /* Serves req.  Returns 1 after answering it (fb_oreq_reply), or 0
     * after parking it on one of the object's wait queues
     * (fb_oreq_park). */
    int (*call)(struct fb_obj *o, struct fb_oreq *req);
    /* A client went away: its parked requests are already gone; release
     * what it held.  May answer other parked requests.  May be NULL. */
    void (*conn_gone)(struct fb_obj *o, struct fb_oconn *c);
    /* Frees the state.  The requests parked on the object have been
     * answered already (FIBER_ECLOSED, see fb_obj_destroy).  May be
     * NULL. */
    void (*destroy)(struct fb_obj *o);
    /* A parked request's deadline passed.  The server has already taken
     * it off its wait queue; the object answers it, or parks it again
     * after moving its deadline past now (a condition waiter that must
     * re-acquire its lock first).  May answer other parked requests (a
     * barrier breaks).  May be NULL: the server answers FIBER_ETIMEDOUT. */
    void (*expire)(struct fb_obj *o, struct fb_oreq *req);
    /* Any client may destroy an object of this kind with FB_OP_FREE (the
     * manager's objects).  0: only the kind's own operations or the
     * server's stop end it (a ring's rendezvous). */
    int freeable;
};

struct fb_obj {
    uint32_t id;
    char kind[32];
    char name[FB_WIRE_NAME_MAX + 1];
    const struct fb_obj_ops *ops;
    void *state;
    struct fb_objsrv *srv;
    struct fb_obj *next;
};

/* A kind of object: creates the state from the OPEN request's parameter
 * items (items after kind and name).  Returns 0 or a FIBER_E* code with
 * fiber_last_error() set (the client gets both). */
struct fb_obj_kind {
    const char *name;
    int (*create)(struct fb_obj *o, const fiber_iov *params, uint32_t n);
};

/* ---- the server side ---- */

/* Starts a server listening on addr ("unix:PATH" or "tcp:HOST:0").  With
 * own_thread it serves in a new thread (returns at once); else the caller
 * runs fb_objsrv_run().  The bound address is in fb_objsrv_address(). */
int fb_objsrv_start(struct fb_objsrv **out, const char *addr,
                    const uint8_t token[FB_WIRE_TOKEN_LEN],
                    const char *build_id, int own_thread);
const char *fb_objsrv_address(const struct fb_objsrv *srv);
/* Serves until fb_objsrv_stop() or, when stop_fd >= 0, until that
 * descriptor becomes readable or hangs up (a manager's control
 * connection). */
void fb_objsrv_run(struct fb_objsrv *srv, int stop_fd);
/* One round of that loop: answers the requests whose deadline passed,
 * waits for events at most max_wait_ms (-1: until the next deadline) and
 * handles them.  Returns how many events it handled.  Only for a server
 * without its own thread (also the fuzz targets' entry point). */
int fb_objsrv_step(struct fb_objsrv *srv, int max_wait_ms);
/* Stops and frees the server (joining its thread, if it has one). */
void fb_objsrv_stop(struct fb_objsrv *srv);
/* 1 once the server is stopping (an object's destroy: stopped, not
 * freed). */
int fb_objsrv_stopping(const struct fb_objsrv *srv);
/* A client connection's id: unique for the server's life, never 0 (the
 * owner of a lock in shared memory, mshm.h). */
uint32_t fb_oconn_id(const struct fb_oconn *c);
/* Peers dropped for failing authentication or protocol (tests). */
uint64_t fb_objsrv_dropped(struct fb_objsrv *srv);
/* Requests waiting on the server's objects now (tests: wait until a
 * child's call is parked).  Safe from any thread. */
uint64_t fb_objsrv_parked(struct fb_objsrv *srv);

/* Answers req with status and items, and frees it. */
void fb_oreq_reply(struct fb_oreq *req, int status, const fiber_iov *items,
                   size_t count);
/* Frees req without answering it: for operations the client posts
 * without waiting for a reply (a queue's TAKEN). */
void fb_oreq_done(struct fb_oreq *req);
/* Removes o from its server and frees it: every request parked on o (of
 * any client) is answered FIBER_ECLOSED ("<kind> '<name>' was freed")
 * first, then ops->destroy frees the state and o goes.  Nothing of o
 * stays behind.  Later calls on its id fail with FIBER_ECLOSED ("object N
 * was freed", recognised by fb_ohandle_freed): ids are never reused, so
 * the server tells a freed id from one it never gave out by the count
 * alone.  Safe to call from o's own call op (which must not touch o
 * after it). */
void fb_obj_destroy(struct fb_obj *o);
/* Answers req with a failure: status and a printf-style text. */
void fb_oreq_fail(struct fb_oreq *req, int status, const char *fmt, ...)
    FIBER_PRINTF(3, 4);
/* Parks req on q until the object answers it (or it times out). */
void fb_oreq_park(struct fb_oreq *req, struct fb_waitq *q);
/* Parks req at the head of q (it keeps its place: an expired request
 * that waits on). */
void fb_oreq_park_front(struct fb_oreq *req, struct fb_waitq *q);
/* Takes the oldest request off q (NULL if empty), still alive. */
struct fb_oreq *fb_waitq_pop(struct fb_waitq *q);
/* Reads item i as a u32/u64/i64/double (exact size) into *v; 0 or -1. */
int fb_item_u32(const struct fb_oreq *req, uint32_t i, uint32_t *v);
int fb_item_i64(const struct fb_oreq *req, uint32_t i, int64_t *v);

/* ---- the client side ---- */

struct fb_oclient;

/* A reply: status, and its items (a private copy of the list). */
struct fb_oresult {
    int status;
    uint32_t count;
    fiber_buf raw; /* "u32 len | bytes" x count */
};

/* Returns the item i of a result (0 or -1 if there is none). */
int fb_oresult_item(const struct fb_oresult *r, uint32_t i, const void **data,
                    size_t *len);
void fb_oresult_free(struct fb_oresult *r);

/* Connects (or reuses this process's connection) to the server at addr,
 * proving itself with token.  Reference counted: fb_oclient_release. */
int fb_oclient_get(const char *addr, const uint8_t token[FB_WIRE_TOKEN_LEN],
                   struct fb_oclient **out);
void fb_oclient_release(struct fb_oclient *c);

/* Calls op on obj and waits for the answer.  Returns the status (0 or a
 * FIBER_E* code, with the server's text in fiber_last_error()); the
 * result's items are in *res (may be NULL).  FIBER_ECLOSED if the server
 * is gone. */
int fb_ocall(struct fb_oclient *c, uint32_t obj, int32_t op, int timeout_ms,
             const fiber_iov *items, size_t count, struct fb_oresult *res);

/* The same without waiting: on success *f is a future whose
 * fiber_future_get() returns the status and appends item 0 of the reply
 * (if any) to its out buffer. */
int fb_ocall_async(struct fb_oclient *c, uint32_t obj, int32_t op,
                   int timeout_ms, const fiber_iov *items, size_t count,
                   fiber_future **f);

/* A future that is already resolved: with status (its text
 * fiber_last_error()'s) and, with has_item, the item (item, len).  For
 * calls made in shared memory (mobj.c). */
int fb_ocall_resolved(int status, const void *item, size_t len, int has_item,
                      fiber_future **f);

/* Posts a call whose operation sends no reply (the object frees it with
 * fb_oreq_done); returns once it is written.  FIBER_ECLOSED if the
 * server is gone. */
int fb_ocall_post(struct fb_oclient *c, uint32_t obj, int32_t op,
                  const fiber_iov *items, size_t count);

/* Starts a call and returns its waiter at once; fb_owait_wait/_ready
 * follow it, fb_owait_result reads the reply (status, items; text: the
 * failure's text), fb_owait_free drops it (also before the reply). */
int fb_ocall_begin(struct fb_oclient *c, uint32_t obj, int32_t op,
                   int timeout_ms, const fiber_iov *items, size_t count,
                   struct fb_owait **w);
const struct fb_oresult *fb_owait_result(struct fb_owait *w,
                                         const char **text);

/* The credit window of a producer's pipelined puts: how many items were
 * sent and not yet answered, and the first failure among the answers
 * (kept until the producer reads and clears it).  Guarded by the
 * connection's lock: read it only through fb_ocredit_wait. */
struct fb_ocredit {
    uint64_t outstanding;
    int err;
    char text[FB_WIRE_TEXT_MAX + 1];
};

/* Sends each of the count items as one more put (op, with timeout -1)
 * on obj without waiting for the answer, counting them in cr.
 * Consecutive puts of the same credit that are still unsent travel in one
 * call (op must take any number of items), up to a size.  With defer, the
 * connection's flusher thread writes the frames (puts then batch);
 * without, they are written now.  FIBER_ECLOSED if the server is gone;
 * FIBER_ENOMEM when an item could not be added (those before it are
 * sent). */
int fb_ocall_putn(struct fb_oclient *c, uint32_t obj, int32_t op,
                  const fiber_iov *items, size_t count, struct fb_ocredit *cr,
                  int defer);
/* Waits until at most limit of cr's puts are unanswered, the server is
 * gone (FIBER_ECLOSED) or the deadline passes (FIBER_ETIMEDOUT).  When it
 * has to wait, it waits until at most limit / 2 are (hysteresis: a
 * producer at the end of its window resumes with a run of puts). */
int fb_ocredit_wait(struct fb_oclient *c, struct fb_ocredit *cr,
                    uint64_t limit, uint64_t deadline_ms);

/* Waits until every pipelined put of this process (on any connection)
 * is answered, or the deadline passes: a child calls it when its target
 * returns, so puts on handles it never freed are not lost at exit. */
void fb_oclients_drain(uint64_t deadline_ms);

/* What every handle on a server object holds: the connection, the object
 * id, and the address and token that a serialised handle carries. */
struct fb_ohandle {
    struct fb_oclient *c;
    uint32_t obj;
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
};

/* Connects h to object obj on the server at addr.  Returns 0 or a code
 * (h unusable). */
int fb_ohandle_open(struct fb_ohandle *h, const char *addr,
                    const uint8_t token[FB_WIRE_TOKEN_LEN], uint32_t obj);
/* Releases h's connection. */
void fb_ohandle_close(struct fb_ohandle *h);
/* For a call on h that returned rc: when the server said the object was
 * freed ("object N was freed"), rewrites fiber_last_error() to name it
 * ("<what> N on <address> was freed <how>", e.g. what "queue", how "by
 * its creator (fiber_queue_free)").  Returns rc. */
int fb_ohandle_freed(const struct fb_ohandle *h, int rc, const char *what,
                     const char *how);

/* Opens (creating it if needed) the object named name of kind on the
 * server; its id goes to *id. */
int fb_oopen(struct fb_oclient *c, const char *kind, const char *name,
             const fiber_iov *params, size_t n, uint32_t *id);

/* ---- the master's own server ---- */

/* Returns the master's object server, starting it on first use; its
 * address is what handles carry.  Only in the master. */
int fb_master_objsrv(struct fb_objsrv **out);
/* Stops it (fiber_shutdown does). */
void fb_master_objsrv_stop(void);

/* ---- waiters behind object calls' futures (future/future.h) ---- */
struct fb_owait;
int fb_owait_wait(struct fb_owait *w, int timeout_ms);
int fb_owait_ready(struct fb_owait *w);
int fb_owait_take(struct fb_owait *w, fiber_buf *out);
void fb_owait_free(struct fb_owait *w);

/* ---- managers (manager.c, with mobj.c, mobj_srv.c and queue.c) ---- */

/* Creates a queue object named name (NULL: a fresh name) on the server at
 * addr (queue.c). */
int fb_queue_create_on(fiber_queue **out, const char *addr,
                       const uint8_t *token, const char *name,
                       size_t capacity);
/* For pipe.c: a second handle on queue object obj; a handle's object id;
 * and making a creator's handle an ordinary one (freeing it then leaves
 * the queue). */
int fb_queue_attach(fiber_queue **out, const char *addr, const uint8_t *token,
                    uint32_t obj);
uint32_t fb_queue_obj(const fiber_queue *q);
/* The checks of a message about to be put on a queue or sent on a pipe:
 * data given with its length, and room for it within max_message_bytes.
 * 0, or FIBER_EINVAL / FIBER_ETOOBIG with the reason. */
int fb_message_check(const void *data, size_t len);
void fb_queue_disown(fiber_queue *q);
/* For tests (pipe.c): 1 when p is linked directly, 0 if not; where it
 * listens while it waits for the other end ("" when it does not). */
int fb_pipe_peek(fiber_pipe *p, char *listening, size_t size);
/* Opens (creating it if new) the object called name, of kind ("dict",
 * "lock", ...: a kind of mobj_srv.c), over c, the connection to the server
 * at addr; params are the kind's creation parameters (mobj_srv.c). */
int fb_mobj_create(fiber_mobj **out, struct fb_oclient *c, const char *addr,
                   const uint8_t *token, const char *kind, const char *name,
                   const fiber_iov *params, size_t n);
/* The manager's job and its server's address (for tests: kill it, dial
 * it). */
fiber_process *fb_manager_process(fiber_manager *m);
/* 1 when o's calls are made in shared memory (mshm.h), else 0 (tests). */
int fb_mobj_shared(const fiber_mobj *o);
const char *fb_manager_address(fiber_manager *m);

/* Serialised handles: "FBH1" | kind u8 | u8 n | addr[n] | token[32] |
 * u32 obj | u32 extra.  The kinds: */
#define FB_HANDLE_QUEUE 1
#define FB_HANDLE_PIPE 2
#define FB_HANDLE_RING 3
#define FB_HANDLE_MOBJ 4
int fb_handle_encode(fiber_buf *out, int kind, const char *addr,
                     const uint8_t *token, uint32_t obj, uint32_t extra);
int fb_handle_decode(const void *data, size_t len, int want_kind,
                     char *addr, size_t addr_size, uint8_t *token,
                     uint32_t *obj, uint32_t *extra);

#endif /* FB_OBJSRV_H */
