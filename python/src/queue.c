/*
 * queue.c -- _fiber.Queue over fiber_queue and _fiber.Pipe over
 * fiber_pipe.
 *
 * Queue.put_mp and Queue.get_mp (fiber.Queue's put and get) encode and
 * decode here, one call a message (codec.c's encoding for the small
 * values it knows, a pickle for the rest); on an unbounded queue, put_mp
 * gathers pipelined puts in the handle's send buffer
 * and hands them to the C queue in batches ("the send buffer" below
 * says when).  put, get and Pipe's send and recv move byte messages
 * that the Python side pickled.
 *
 * A handle is created in the master (Queue.create, Pipe.create) or opened
 * from its serialised form in any process of the run (Queue.open,
 * Pipe.open), which is how the Python objects pickle.  Blocking calls
 * wait in slices (Ctrl-C is seen) with the GIL released.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "binding.h"

/* Set in a process fork() made from one that had loaded the extension
 * (multiprocessing's 'fork' start method): the handles it inherited are
 * copies of its parent's, whose connections they share, so they are
 * never freed here (freeing would write on the parent's connections);
 * fiber.queues refuses to use them with a clear error. */
static int forked;
/* Queue handles this process has made; a process that made none (the
 * fork server, fiber._forkserver) forks children that owe nothing to it:
 * they are not "forked" in the sense above. */
static int handles_made;

static void flusher_forget(void);

static void on_fork_child(void)
{
    if (handles_made)
        forked = 1;
    flusher_forget();
}

typedef struct FbpQueue FbpQueue;

struct FbpQueue {
    PyObject_HEAD
    fiber_queue *q;
    int shared; /* serialize() was called: copies may live elsewhere */
    int mp_pipelined; /* put_mp pipelines (fiber.Queue: unbounded) */
    /* The send buffer: pickled messages of pipelined puts (put_mp on
     * an unbounded queue) not yet handed to the C queue, back to back in
     * pending, their lengths in lens.  Under mu, which is taken with the
     * GIL held or without it, but never held while waiting for the GIL. */
    pthread_mutex_t mu;
    fiber_buf pending;
    size_t *lens;
    size_t n_pending;
    /* A hand-over swaps pending and lens with these under mu, then sends
     * them with only send_mu held, so puts gather meanwhile; send_mu
     * makes the batches go one at a time, in order.  Taken before mu,
     * with the GIL held or not, never held while waiting for the GIL. */
    pthread_mutex_t send_mu;
    fiber_buf sending;
    size_t *send_lens;
    size_t n_sending;   /* read by settle without a lock */
    fiber_iov *iov;     /* room for BATCH_MAX, built at each hand-over */
    fiber_buf rbuf; /* get_mp's, for a prefetched message; GIL held */
    uint64_t first_ns;    /* when the first of them was gathered */
    uint64_t last_put_ns;
    int err;         /* a hand-over by the flusher failed: the next call */
    char err_text[256]; /* on this handle reports it, once */
    /* On the flusher's list (under flusher_mu). */
    int listed;
    FbpQueue *next_listed;
};

typedef struct {
    PyObject_HEAD
    fiber_pipe *p;
} FbpPipe;

/* The Python result of a put/get-like code: None, or raise. */
static PyObject *status(int rc, const char *msg)
{
    if (rc == -2)
        return NULL;
    if (rc)
        return fbp_raise(rc, msg);
    Py_RETURN_NONE;
}

/* ---- the send buffer ------------------------------------------------------
 *
 * A Python put costs a pickle and a call into C; the C queue's own
 * coalescing (fiber_queue_put) then pays a lock and a wake-up of its
 * flusher for nearly every message at Python's pace.  So pipelined puts
 * gather here and cross into C as one fiber_queue_put_batch (one frame
 * on the wire) per batch:
 *
 *   - a put that follows the handle's previous put by more than
 *     STEADY_NS (a lone put, or the first after a pause) is handed over
 *     at once, with whatever is gathered: a lone put is on the wire when
 *     put returns, as fiber_queue_put's is;
 *   - puts closer than that gather, and a batch goes when it holds
 *     BATCH_MAX messages or BATCH_BYTES, or when its first message is
 *     HOLD_NS old (at the next put), all handed over by the putting
 *     thread; or, once the puts stop for STEADY_NS, by the flusher
 *     thread (below), which a put wakes as soon as something is
 *     gathered: the tail of a burst waits a thread wake-up and about
 *     STEADY_NS after the last put, tens of microseconds.  The flusher
 *     leaves a steady producer's batch alone, so the two do not meet on
 *     the handle's locks;
 *   - a get or a Pipe recv on any handle that is about to wait (nothing
 *     prefetched) hands over every handle's gathered puts first
 *     (hand_over_before_wait): it may wait for the answer to one;
 *   - any other call on the handle (get, size, flush, a put with a
 *     timeout, its end) hands over what is gathered first, so a process
 *     sees its own puts in order, and fbp_queue_flush_all (task.c, when a
 *     Process target or a pool task returns) hands over every handle's,
 *     before the C runtime waits for the pipelined puts at a job's exit.
 *
 * Order holds: a handle's messages are handed over in put order, by one
 * thread at a time (send_mu); the puts meanwhile gather in the other
 * buffer (mu).  A message is held here from the put that gathered it
 * until the flusher's hand-over (a wake-up and STEADY_NS later) or an
 * earlier one: a process killed in that window loses it, as it loses a
 * pipelined put still in the C queue's buffer (and multiprocessing one
 * in its feeder thread's).
 *
 * The flusher: one thread a process, started by the first put that
 * gathers, owned by this file.  It sleeps on flusher_cond while no
 * handle is listed and never takes the GIL.  It runs until the process
 * ends (a daemon: it holds nothing a process needs at its exit, which
 * flushes with fbp_queue_flush_all). */

#define STEADY_NS 20000        /* puts closer than this gather */
#define HOLD_NS 100000         /* a batch older than this goes */
#define BATCH_MAX 256          /* messages in one hand-over */
#define BATCH_BYTES (64u << 10)
#define RBUF_KEEP (1u << 20) /* get_mp keeps a buffer up to this */

static pthread_mutex_t flusher_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t flusher_cond = PTHREAD_COND_INITIALIZER;
static FbpQueue *flusher_list;  /* handles with something gathered */
static int flusher_started, flusher_idle;
/* flusher_list != NULL, for a look without flusher_mu (a get that is
 * about to wait); stored under flusher_mu at each change of the list. */
static int any_listed;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Hands what self gathered to the C queue: send_mu held (not mu), GIL
 * not needed.  A failure is returned and also kept for the handle's
 * next call when keep (the flusher: nobody waits for its answer).  The
 * gathered messages go whatever the outcome (those after a failure are
 * not in the queue, as for fiber_queue_put). */
static int hand_over(FbpQueue *self, int keep)
{
    pthread_mutex_lock(&self->mu);
    size_t n = self->n_pending;
    if (n) {
        fiber_buf b = self->sending;
        size_t *l = self->send_lens;
        self->sending = self->pending;
        self->send_lens = self->lens;
        self->pending = b;
        self->pending.len = 0;
        self->lens = l;
        __atomic_store_n(&self->n_sending, n, __ATOMIC_RELAXED);
        self->n_pending = 0;
    }
    pthread_mutex_unlock(&self->mu);
    if (n == 0)
        return 0;
    const char *d = (const char *)self->sending.data;
    for (size_t i = 0; i < n; i++) {
        self->iov[i] = (fiber_iov){d, self->send_lens[i]};
        d += self->send_lens[i];
    }
    int rc = fiber_queue_put_batch(self->q, self->iov, n);
    /* settle's look without a lock: 0 means the batch is in the C queue */
    __atomic_store_n(&self->n_sending, 0, __ATOMIC_RELEASE);
    if (rc && keep) {
        pthread_mutex_lock(&self->mu);
        if (!self->err) {
            snprintf(self->err_text, sizeof self->err_text, "%s",
                     fiber_last_error());
            __atomic_store_n(&self->err, rc, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&self->mu);
    }
    return rc;
}

/* Hands over what the listed handles gathered and takes them off the
 * list: every one when all (a flush), else only those whose producer has
 * paused (nothing put for STEADY_NS).  A handle still being put to stays
 * listed with its batch growing: its producer hands the batch over
 * itself (BATCH_MAX, BATCH_BYTES, HOLD_NS), so the flusher takes only
 * the tail of a burst and never contends with a steady producer for its
 * batch.  Returns how long until the first of those left listed will
 * have paused (0 when none is left).  flusher_mu held. */
static uint64_t hand_over_listed(int all)
{
    uint64_t now = now_ns(), soonest = 0;
    FbpQueue **pp = &flusher_list;
    while (*pp) {
        FbpQueue *self = *pp;
        uint64_t last = __atomic_load_n(&self->last_put_ns, __ATOMIC_RELAXED);
        /* signed: a put may have stamped a time after now was read */
        int64_t quiet = (int64_t)(now - last);
        if (!all && quiet < STEADY_NS) {
            uint64_t left = (uint64_t)(STEADY_NS - (quiet > 0 ? quiet : 0));
            if (soonest == 0 || left < soonest)
                soonest = left;
            pp = &self->next_listed;
            continue;
        }
        *pp = self->next_listed;
        self->listed = 0;
        self->next_listed = NULL;
        pthread_mutex_lock(&self->send_mu);
        hand_over(self, 1);
        pthread_mutex_unlock(&self->send_mu);
    }
    __atomic_store_n(&any_listed, flusher_list != NULL, __ATOMIC_RELAXED);
    return soonest;
}

/* Woken by the first gathered put of a batch, the flusher sleeps until
 * STEADY_NS after the listed handles' last puts and hands over the
 * batches of those that have paused (above), then sleeps again for the
 * others.  So a put held here waits at most a thread wake-up and
 * STEADY_NS after its producer's last put; longer would make bigger
 * batches but would also hold the put of a request-response exchange
 * quicker than STEADY_NS (a put, then a get on another queue) for as
 * long. */
static void *flusher_main(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&flusher_mu);
    for (;;) {
        while (!flusher_list) {
            flusher_idle = 1;
            pthread_cond_wait(&flusher_cond, &flusher_mu);
            flusher_idle = 0;
        }
        uint64_t wait_ns = hand_over_listed(0);
        if (wait_ns == 0)
            continue;
        struct timespec ts = {0, (long)wait_ns};
        pthread_mutex_unlock(&flusher_mu);
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&flusher_mu);
    }
    return NULL;
}

/* In a child fork() made: the flusher thread did not come along, and
 * the listed handles are the parent's; a put here starts a flusher of
 * its own (fiber.queues refuses the parent's handles before that). */
static void flusher_forget(void)
{
    pthread_mutex_init(&flusher_mu, NULL);
    pthread_cond_init(&flusher_cond, NULL);
    flusher_list = NULL;
    any_listed = 0;
    flusher_started = flusher_idle = 0;
}

/* Lists self for the flusher (starting it the first time); returns -1
 * when no thread can be started (the caller hands over itself). */
static int list_for_flusher(FbpQueue *self)
{
    int rc = 0;
    pthread_mutex_lock(&flusher_mu);
    if (!flusher_started) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        /* no signal is delivered to it: Python's handlers run on the main
         * thread, and the flusher never runs Python */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        flusher_started = pthread_create(&t, &a, flusher_main, NULL) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&a);
        if (!flusher_started)
            rc = -1;
    }
    if (rc == 0 && !self->listed) {
        self->listed = 1;
        self->next_listed = flusher_list;
        flusher_list = self;
        __atomic_store_n(&any_listed, 1, __ATOMIC_RELAXED);
        if (flusher_idle) {
            flusher_idle = 0; /* one signal a wake-up */
            pthread_cond_signal(&flusher_cond);
        }
    }
    pthread_mutex_unlock(&flusher_mu);
    return rc;
}

/* Takes self off the flusher's list (its end, or a hand-over of its
 * own made it needless); GIL held or not. */
static void unlist(FbpQueue *self)
{
    pthread_mutex_lock(&flusher_mu);
    if (self->listed) {
        FbpQueue **pp = &flusher_list;
        while (*pp != self)
            pp = &(*pp)->next_listed;
        *pp = self->next_listed;
        self->listed = 0;
        self->next_listed = NULL;
        __atomic_store_n(&any_listed, flusher_list != NULL,
                         __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&flusher_mu);
}

/* Hands over what self gathered, from a call with the GIL held; returns
 * 0 or a code (with its text in msg), which includes a failure of an
 * earlier hand-over by the flusher. */
static int settle(FbpQueue *self, char *msg, size_t msg_size)
{
    int rc;
    if (__atomic_load_n(&self->n_pending, __ATOMIC_ACQUIRE) == 0 &&
        __atomic_load_n(&self->n_sending, __ATOMIC_ACQUIRE) == 0 &&
        __atomic_load_n(&self->err, __ATOMIC_ACQUIRE) == 0)
        return 0;
    pthread_mutex_lock(&self->send_mu); /* its holders never wait for */
    Py_BEGIN_ALLOW_THREADS              /* the GIL */
    rc = hand_over(self, 0);
    if (rc)
        snprintf(msg, msg_size, "%s", fiber_last_error());
    pthread_mutex_lock(&self->mu);
    if (rc == 0 && self->err) {
        rc = self->err;
        snprintf(msg, msg_size, "%s", self->err_text);
    }
    self->err = 0;
    pthread_mutex_unlock(&self->mu);
    pthread_mutex_unlock(&self->send_mu);
    Py_END_ALLOW_THREADS
    return rc;
}

/* Hands over what self gathered, from a put: GIL held, released for the
 * send.  Returns 0 or a code with its text in msg. */
static int hand_over_now(FbpQueue *self, char *msg, size_t msg_size)
{
    int rc;
    pthread_mutex_lock(&self->send_mu);
    Py_BEGIN_ALLOW_THREADS
    rc = hand_over(self, 0);
    if (rc)
        snprintf(msg, msg_size, "%s", fiber_last_error());
    pthread_mutex_unlock(&self->send_mu);
    Py_END_ALLOW_THREADS
    return rc;
}

/* Gathers data (a message: a pickle or codec.c's encoding) for a
 * pipelined put: hands it over now (with what was gathered before it)
 * when it is a lone put or the batch is full, else leaves it to the
 * flusher.  GIL held.  Returns 0 or a code with its text in msg. */
static int gather(FbpQueue *self, const char *data, size_t len, char *msg,
                  size_t msg_size)
{
    uint64_t now = now_ns();
    pthread_mutex_lock(&self->mu);
    /* Other threads of the process may have filled the batch since its
     * last check (a hand-over is made without mu): it goes first. */
    while (self->n_pending >= BATCH_MAX) {
        pthread_mutex_unlock(&self->mu);
        int rc = hand_over_now(self, msg, msg_size);
        if (rc)
            return rc;
        pthread_mutex_lock(&self->mu);
    }
    int rc = self->err;
    if (rc) {
        snprintf(msg, msg_size, "%s", self->err_text);
        self->err = 0;
        pthread_mutex_unlock(&self->mu);
        return rc;
    }
    if (!self->lens) {
        self->lens = malloc(BATCH_MAX * sizeof *self->lens);
        self->send_lens = malloc(BATCH_MAX * sizeof *self->send_lens);
        self->iov = malloc(BATCH_MAX * sizeof *self->iov);
    }
    if (!self->lens || !self->send_lens || !self->iov ||
        fiber_buf_append(&self->pending, data, len)) {
        pthread_mutex_unlock(&self->mu);
        snprintf(msg, msg_size, "out of memory for a queue's send buffer");
        return FIBER_ENOMEM;
    }
    if (self->n_pending == 0)
        self->first_ns = now;
    self->lens[self->n_pending++] = len;
    int steady = now - self->last_put_ns < STEADY_NS;
    __atomic_store_n(&self->last_put_ns, now, __ATOMIC_RELAXED);
    int now_please = !steady || self->n_pending >= BATCH_MAX ||
                     self->pending.len >= BATCH_BYTES ||
                     now - self->first_ns >= HOLD_NS;
    int first = self->n_pending == 1;
    pthread_mutex_unlock(&self->mu);
    if (now_please)
        return hand_over_now(self, msg, msg_size);
    if (first && list_for_flusher(self) != 0) /* no thread: now */
        return settle(self, msg, msg_size);
    return 0;
}

void fbp_queue_flush_all(void)
{
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&flusher_mu);
    hand_over_listed(1);
    pthread_mutex_unlock(&flusher_mu);
    Py_END_ALLOW_THREADS
}

/* Before a get or a recv waits (nothing was there to take): hands over
 * what this process's puts gathered on every handle.  The wait may be
 * for an answer to one of them (a put, then a get on another queue: a
 * request and its reply), and the flusher would send it only a wake-up
 * and STEADY_NS later, with the sender idle meanwhile.  A get that finds
 * a message does not come here, so a busy worker's result puts still
 * gather.  GIL held (released for the hand-overs). */
static void hand_over_before_wait(void)
{
    if (__atomic_load_n(&any_listed, __ATOMIC_RELAXED))
        fbp_queue_flush_all();
}

/* ---- queue ---------------------------------------------------------------- */

static FbpQueue *queue_wrap(fiber_queue *q)
{
    FbpQueue *self = PyObject_New(FbpQueue, &FbpQueueType);
    if (!self) {
        fiber_queue_free(q);
        return NULL;
    }
    handles_made = 1;
    self->q = q;
    self->shared = 0;
    pthread_mutex_init(&self->mu, NULL);
    pthread_mutex_init(&self->send_mu, NULL);
    self->pending = (fiber_buf){0};
    self->sending = (fiber_buf){0};
    self->rbuf = (fiber_buf){0};
    self->lens = NULL;
    self->send_lens = NULL;
    self->iov = NULL;
    self->n_pending = 0;
    self->n_sending = 0;
    self->first_ns = 0;
    self->last_put_ns = 0;
    self->err = 0;
    self->err_text[0] = '\0';
    self->listed = 0;
    self->next_listed = NULL;
    return self;
}

PyObject *fbp_queue_wrap(fiber_queue *q) { return (PyObject *)queue_wrap(q); }

static PyObject *queue_create(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_ssize_t capacity = 0;
    if (!PyArg_ParseTuple(args, "|n", &capacity))
        return NULL;
    if (capacity < 0) {
        PyErr_SetString(PyExc_ValueError, "maxsize must be >= 0");
        return NULL;
    }
    fiber_queue *q;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_queue_create(&q, (size_t)capacity));
    if (rc)
        return fbp_raise(rc, msg);
    return (PyObject *)queue_wrap(q);
}

static PyObject *queue_open(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_buffer ser;
    if (!PyArg_ParseTuple(args, "y*", &ser))
        return NULL;
    fiber_queue *q;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_queue_open(&q, ser.buf, (size_t)ser.len));
    PyBuffer_Release(&ser);
    if (rc)
        return fbp_raise(rc, msg);
    return (PyObject *)queue_wrap(q);
}

/* A handle that was never serialised exists in this process only, so
 * when it goes nobody else can reach the queue: it is freed, and on the
 * creator's handle (Queue.create) the server frees the queue.  One that
 * was serialised (pickled into a child, a pool task, or anywhere) may
 * have copies that outlive this object: it is detached, and the queue
 * lives until the run ends.  On a handle that is not the creator's the
 * two are the same. */
static void queue_dealloc(FbpQueue *self)
{
    if (!forked) { /* what it gathered goes first */
        unlist(self);
        pthread_mutex_lock(&self->send_mu);
        Py_BEGIN_ALLOW_THREADS
        hand_over(self, 0);
        pthread_mutex_unlock(&self->send_mu);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_destroy(&self->mu);
    pthread_mutex_destroy(&self->send_mu);
    fiber_buf_free(&self->pending);
    fiber_buf_free(&self->sending);
    fiber_buf_free(&self->rbuf);
    free(self->lens);
    free(self->send_lens);
    free(self->iov);
    fiber_queue *q = self->q;
    self->q = NULL;
    if (forked)
        ; /* its parent's: left alone */
    else if (self->shared)
        FB_NOGIL(fiber_queue_detach(q));
    else
        FB_NOGIL(fiber_queue_free(q));
    PyObject_Free(self);
}

struct qput {
    fiber_queue *q;
    fiber_pipe *p;
    const void *data;
    size_t len;
};

static int put_step(void *ctx, int slice_ms)
{
    struct qput *c = ctx;
    return c->q ? fiber_queue_put(c->q, c->data, c->len, slice_ms)
                : fiber_pipe_send(c->p, c->data, c->len, slice_ms);
}

/* Puts with a timeout in ms (-1 forever, 0 no wait: one call, which fails
 * with FIBER_EAGAIN when it would wait). */
static PyObject *put_common(fiber_queue *q, fiber_pipe *p, PyObject *args)
{
    Py_buffer data;
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "y*|i", &data, &timeout_ms))
        return NULL;
    struct qput c = {q, p, data.buf, (size_t)data.len};
    char msg[1024] = "";
    int rc = fbp_wait_sliced(put_step, &c, timeout_ms, msg, sizeof msg);
    PyBuffer_Release(&data);
    return status(rc, msg);
}

struct qget {
    fiber_queue *q;
    fiber_pipe *p;
    fiber_buf *out;
};

static int get_step(void *ctx, int slice_ms)
{
    struct qget *c = ctx;
    return c->q ? fiber_queue_get(c->q, c->out, slice_ms)
                : fiber_pipe_recv(c->p, c->out, slice_ms);
}

static PyObject *get_common(fiber_queue *q, fiber_pipe *p, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    fiber_buf b = {0};
    struct qget c = {q, p, &b};
    char msg[1024] = "";
    int rc = FIBER_EAGAIN;
    if (__atomic_load_n(&any_listed, __ATOMIC_RELAXED) && timeout_ms != 0) {
        /* Puts are gathered: a look that does not wait first, and if
         * this get would wait, they go before it does. */
        if (q)
            rc = fiber_queue_try_get(q, &b);
        else
            FB_NOGIL(rc = fiber_pipe_recv(p, &b, 0));
        if (rc == FIBER_EAGAIN || rc == FIBER_ETIMEDOUT) {
            hand_over_before_wait();
            rc = FIBER_EAGAIN;
        } else if (rc) {
            snprintf(msg, sizeof msg, "%s", fiber_last_error());
        }
    }
    if (rc == FIBER_EAGAIN)
        rc = fbp_wait_sliced(get_step, &c, timeout_ms, msg, sizeof msg);
    PyObject *res = rc == 0 ? fbp_bytes_of(&b) : status(rc, msg);
    fiber_buf_free(&b);
    return res;
}

static PyObject *queue_put(FbpQueue *self, PyObject *args)
{
    char msg[1024] = "";
    int rc = settle(self, msg, sizeof msg);
    return rc ? status(rc, msg) : put_common(self->q, NULL, args);
}

static PyObject *queue_get(FbpQueue *self, PyObject *args)
{
    char msg[1024] = "";
    int rc = settle(self, msg, sizeof msg);
    return rc ? status(rc, msg) : get_common(self->q, NULL, args);
}

/* ---- objects: multiprocessing's put and get, in C --------------------------
 *
 * fiber.Queue binds put_mp and get_mp as its instance's put and get (on a
 * Queue whose class does not override them), so that a message costs one
 * C call and no frame of Python code (0.2 us of a put's 0.66 us went to a
 * Python wrapper); its Python put and get check that the queue is usable
 * and call them.  They take multiprocessing's arguments, pickle here and
 * raise queue.Full and queue.Empty. */

/* pickle.dumps, pickle.loads, the protocol number 5, queue.Full and
 * queue.Empty, set by fbp_queue_init. */
static PyObject *pickle_dumps, *pickle_loads, *protocol_5;
static PyObject *std_full, *std_empty;

/* Puts the message data[0..len): with timeout_ms < 0 and pipelined,
 * gathered in the send buffer (above); otherwise, after what was
 * gathered, as one synchronous put, waited for in slices (the GIL
 * released: data must be the caller's own, not shared by the handle). */
static int put_bytes(FbpQueue *self, const char *data, size_t len,
                     int timeout_ms, int pipelined, char *msg,
                     size_t msg_size)
{
    if (timeout_ms < 0 && pipelined)
        return gather(self, data, len, msg, msg_size);
    int rc = settle(self, msg, msg_size);
    if (rc)
        return rc;
    struct qput c = {self->q, NULL, data, len};
    return fbp_wait_sliced(put_step, &c, timeout_ms, msg, msg_size);
}

/* The result of a put or get: None (put), or the exception for rc; one
 * that would wait longer than it may raises would_wait (queue.Full or
 * queue.Empty). */
static PyObject *result(int rc, const char *msg, PyObject *would_wait)
{
    if (rc == FIBER_EAGAIN || rc == FIBER_ETIMEDOUT) {
        PyErr_SetNone(would_wait);
        return NULL;
    }
    return status(rc, msg);
}

/* Encodes obj (codec.c's encoding when it is one of its values, else a
 * pickle of protocol 5; a pickling error is raised here, by the put that
 * caused it) and puts it: pipelined on an unbounded queue (mp_mode) when
 * it may wait for ever, else answered, so that a put on a bounded queue
 * blocks while it is full, as multiprocessing's does.  The encoding is
 * in this call's own buffer (on the stack when small), as put_bytes
 * requires. */
static PyObject *put_obj(FbpQueue *self, PyObject *obj, int timeout_ms)
{
    fbp_wbuf w;
    fbp_wbuf_init(&w);
    PyObject *pickled = NULL;
    const char *data;
    size_t len;
    int simple = fbp_codec_encode(obj, &w);
    if (simple < 0)
        return NULL;
    if (simple) {
        data = w.p;
        len = w.len;
    } else {
        PyObject *call[2] = {obj, protocol_5};
        pickled = PyObject_Vectorcall(pickle_dumps, call, 2, NULL);
        if (!pickled)
            return NULL;
        data = PyBytes_AS_STRING(pickled);
        len = (size_t)PyBytes_GET_SIZE(pickled);
    }
    char msg[1024];
    msg[0] = '\0';
    int rc = put_bytes(self, data, len, timeout_ms, self->mp_pipelined, msg,
                       sizeof msg);
    Py_XDECREF(pickled);
    fbp_wbuf_free(&w);
    return result(rc, msg, std_full);
}

/* The value of a message put by put_obj: codec.c's encoding or a pickle,
 * told apart by the first byte; read where it lies (the unpickler and the
 * decoder copy what they keep, so no bytes object is made of it first). */
static PyObject *decode_message(const void *data, size_t len)
{
    if (len > 0 && *(const unsigned char *)data == FBP_CODEC_MAGIC)
        return fbp_codec_decode(data, len);
    PyObject *view = PyMemoryView_FromMemory(data ? (char *)data : "",
                                             (Py_ssize_t)len, PyBUF_READ);
    if (!view)
        return NULL;
    PyObject *res = PyObject_CallOneArg(pickle_loads, view);
    Py_DECREF(view);
    return res;
}

/* Takes a message and decodes it (decode_message).  A message
 * the handle prefetched is taken with the GIL held (fiber_queue_try_get
 * never waits), into the handle's reused buffer rbuf, which nothing else
 * touches while the GIL is held; only a get that may wait (nothing
 * prefetched) releases the GIL, with a buffer of its own. */
static PyObject *get_obj(FbpQueue *self, int timeout_ms)
{
    fiber_buf b = {0};
    fiber_buf *got = &self->rbuf;
    char msg[1024];
    msg[0] = '\0';
    int rc = settle(self, msg, sizeof msg);
    if (rc == 0) {
        self->rbuf.len = 0;
        rc = fiber_queue_try_get(self->q, &self->rbuf);
        if (rc == FIBER_EAGAIN) {
            hand_over_before_wait();
            struct qget c = {self->q, NULL, &b};
            got = &b;
            rc = fbp_wait_sliced(get_step, &c, timeout_ms, msg, sizeof msg);
        } else if (rc) {
            snprintf(msg, sizeof msg, "%s", fiber_last_error());
        }
    }
    PyObject *res = NULL;
    if (rc == 0) {
        res = decode_message(got->data, got->len);
        if (self->rbuf.cap > RBUF_KEEP)
            fiber_buf_free(&self->rbuf); /* a large one is not kept */
    } else {
        result(rc, msg, std_empty);
    }
    fiber_buf_free(&b);
    return res;
}

/* multiprocessing's (block, timeout) as ms: 0 not blocking, -1 forever;
 * -2 with an exception set. */
static int mp_timeout(PyObject *block, PyObject *timeout)
{
    int b = block ? PyObject_IsTrue(block) : 1;
    if (b < 0)
        return -2;
    if (!b)
        return 0;
    if (!timeout || timeout == Py_None)
        return -1;
    double t = PyFloat_AsDouble(timeout);
    if (t == -1.0 && PyErr_Occurred())
        return -2;
    if (t < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "'timeout' must be a non-negative number");
        return -2;
    }
    double ms = t * 1000.0;
    return ms >= INT_MAX ? INT_MAX : ms < 1.0 ? 1 : (int)ms;
}

/* Parses (first..., block=True, timeout=None) of a vectorcall: n_first
 * positional arguments first (put's obj), then block and timeout by
 * position or keyword.  0, or -1 with an exception set. */
static int mp_args(const char *name, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames, Py_ssize_t n_first, PyObject **out)
{
    static const char *const names[] = {"obj", "block", "timeout"};
    const char *const *kw = n_first ? names : names + 1;
    Py_ssize_t total = n_first + 2;
    for (Py_ssize_t i = 0; i < total; i++)
        out[i] = NULL;
    if (nargs > total) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments",
                     name, total);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        const char *key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        if (!key)
            return -1;
        Py_ssize_t at = -1;
        for (Py_ssize_t i = 0; i < total; i++)
            if (strcmp(key, kw[i]) == 0)
                at = i;
        if (at < 0 || out[at]) {
            PyErr_Format(PyExc_TypeError, "%s() got %s argument '%s'", name,
                         at < 0 ? "an unexpected keyword" : "multiple values "
                         "for", key);
            return -1;
        }
        out[at] = args[nargs + k];
    }
    if (n_first && !out[0]) {
        PyErr_Format(PyExc_TypeError, "%s() missing its argument 'obj'",
                     name);
        return -1;
    }
    return 0;
}

/* put_mp(obj, block=True, timeout=None): multiprocessing's Queue.put. */
static PyObject *queue_put_mp(FbpQueue *self, PyObject *const *args,
                              size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *a[3];
    if (nargs == 1 && !kwnames) /* put(obj): the common call */
        return put_obj(self, args[0], -1);
    if (mp_args("put", args, nargs, kwnames, 1, a) != 0)
        return NULL;
    int ms = mp_timeout(a[1], a[2]);
    if (ms == -2)
        return NULL;
    return put_obj(self, a[0], ms);
}

/* get_mp(block=True, timeout=None): multiprocessing's Queue.get. */
static PyObject *queue_get_mp(FbpQueue *self, PyObject *const *args,
                              size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *a[2];
    if (nargs == 0 && !kwnames)
        return get_obj(self, -1);
    if (mp_args("get", args, nargs, kwnames, 0, a) != 0)
        return NULL;
    int ms = mp_timeout(a[0], a[1]);
    if (ms == -2)
        return NULL;
    return get_obj(self, ms);
}

/* mp_mode(pipelined): put_mp pipelines its puts without a timeout (an
 * unbounded queue) or has each answered (a bounded one). */
static PyObject *queue_mp_mode(FbpQueue *self, PyObject *arg)
{
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    self->mp_pipelined = v;
    Py_RETURN_NONE;
}

/* flush(timeout_ms): waits until this handle's pipelined puts are in the
 * queue (in slices, so Ctrl-C is seen). */
static int flush_step(void *ctx, int slice_ms)
{
    return fiber_queue_flush(ctx, slice_ms);
}

static PyObject *queue_flush(FbpQueue *self, PyObject *args)
{
    int timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    char msg[1024] = "";
    int rc = settle(self, msg, sizeof msg);
    if (rc == 0)
        rc = fbp_wait_sliced(flush_step, self->q, timeout_ms, msg, sizeof msg);
    return status(rc, msg);
}

static PyObject *queue_size(FbpQueue *self, PyObject *unused)
{
    (void)unused;
    size_t n = 0;
    char msg[1024] = "";
    int rc = settle(self, msg, sizeof msg);
    if (rc)
        return status(rc, msg);
    FB_NOGIL(rc = fiber_queue_size(self->q, &n));
    if (rc)
        return fbp_raise_last(rc);
    return PyLong_FromSize_t(n);
}

static PyObject *queue_close(FbpQueue *self, PyObject *unused)
{
    (void)unused;
    char msg[1024] = "";
    int rc = settle(self, msg, sizeof msg);
    if (rc)
        return status(rc, msg);
    FB_NOGIL(rc = fiber_queue_close(self->q));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *queue_serialize(FbpQueue *self, PyObject *unused)
{
    (void)unused;
    fiber_buf b = {0};
    int rc = fiber_queue_serialize(self->q, &b);
    if (rc == 0)
        self->shared = 1; /* before the bytes exist anywhere */
    PyObject *res = rc ? fbp_raise_last(rc) : fbp_bytes_of(&b);
    fiber_buf_free(&b);
    return res;
}

/* pickle: a handle travels as what it serializes to and is opened again
 * there, so that a fiber.Queue's bound put or get (put_mp and get_mp of
 * this handle: Process(target=q.put)) pickles, as multiprocessing's
 * bound methods do.  The handle opened there answers each put (it does
 * not know whether the queue is bounded). */
static PyObject *queue_reduce(FbpQueue *self, PyObject *unused)
{
    PyObject *ser = queue_serialize(self, unused);
    if (!ser)
        return NULL;
    PyObject *open = PyObject_GetAttrString((PyObject *)Py_TYPE(self), "open");
    if (!open) {
        Py_DECREF(ser);
        return NULL;
    }
    return Py_BuildValue("(N(N))", open, ser);
}

static PyMethodDef queue_methods[] = {
    {"__reduce__", (PyCFunction)queue_reduce, METH_NOARGS, NULL},
    {"create", (PyCFunction)queue_create, METH_VARARGS | METH_CLASS, NULL},
    {"open", (PyCFunction)queue_open, METH_VARARGS | METH_CLASS, NULL},
    {"put", (PyCFunction)queue_put, METH_VARARGS, NULL},
    {"get", (PyCFunction)queue_get, METH_VARARGS, NULL},
    {"put_mp", (PyCFunction)(void (*)(void))queue_put_mp,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"get_mp", (PyCFunction)(void (*)(void))queue_get_mp,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"mp_mode", (PyCFunction)queue_mp_mode, METH_O, NULL},
    {"flush", (PyCFunction)queue_flush, METH_VARARGS, NULL},
    {"size", (PyCFunction)queue_size, METH_NOARGS, NULL},
    {"close", (PyCFunction)queue_close, METH_NOARGS, NULL},
    {"serialize", (PyCFunction)queue_serialize, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Queue",
    .tp_basicsize = sizeof(FbpQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_methods = queue_methods,
    .tp_doc = "A fiber_queue of byte messages.",
};

/* ---- pipe ------------------------------------------------------------------ */

static FbpPipe *pipe_wrap(fiber_pipe *p)
{
    FbpPipe *self = PyObject_New(FbpPipe, &FbpPipeType);
    if (!self) {
        fiber_pipe_free(p);
        return NULL;
    }
    self->p = p;
    return self;
}

static PyObject *pipe_create(PyObject *cls, PyObject *args)
{
    (void)cls;
    int duplex = 1;
    if (!PyArg_ParseTuple(args, "|p", &duplex))
        return NULL;
    fiber_pipe *a, *b;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pipe_create(&a, &b, duplex));
    if (rc)
        return fbp_raise(rc, msg);
    FbpPipe *pa = pipe_wrap(a);
    FbpPipe *pb = pipe_wrap(b);
    if (!pa || !pb) {
        Py_XDECREF(pa);
        Py_XDECREF(pb);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, pa, pb);
    Py_DECREF(pa);
    Py_DECREF(pb);
    return t;
}

static PyObject *pipe_open(PyObject *cls, PyObject *args)
{
    (void)cls;
    Py_buffer ser;
    if (!PyArg_ParseTuple(args, "y*", &ser))
        return NULL;
    fiber_pipe *p;
    int rc;
    char msg[1024] = "";
    FBP_CALL(rc, msg, fiber_pipe_open(&p, ser.buf, (size_t)ser.len));
    PyBuffer_Release(&ser);
    if (rc)
        return fbp_raise(rc, msg);
    return (PyObject *)pipe_wrap(p);
}

static void pipe_dealloc(FbpPipe *self)
{
    fiber_pipe *p = self->p;
    self->p = NULL;
    if (!forked) /* in a forked process, its parent's: left alone */
        FB_NOGIL(fiber_pipe_free(p));
    PyObject_Free(self);
}

static PyObject *pipe_send(FbpPipe *self, PyObject *args)
{
    return put_common(NULL, self->p, args);
}

static PyObject *pipe_recv(FbpPipe *self, PyObject *args)
{
    return get_common(NULL, self->p, args);
}

/* Pipe.exchange(pipes, msgs): sends msgs[i] (bytes-like) on pipes[i] for
 * every i, then receives one message from each pipe in turn: a list whose
 * item i is the answer's bytes, or None when pipes[i] failed (its other
 * end closed or its process went away: the send or the receive raised
 * ClosedError or another FiberError, whose text is dropped).  One call
 * for a round of requests to many peers (fiber.gym's step): all of the
 * round is sent before any answer is awaited, and no Python runs between
 * the messages.  The waits are sliced like recv's, so a signal's handler
 * runs (and its exception ends the call, the other answers unread). */
static PyObject *pipe_exchange(PyObject *cls, PyObject *args)
{
    (void)cls;
    PyObject *pipes, *msgs;
    if (!PyArg_ParseTuple(args, "OO:exchange", &pipes, &msgs))
        return NULL;
    /* Tuples of their own: a signal's handler, run between the waits,
     * cannot take a pipe or a message away from under the call. */
    PyObject *ps = PySequence_Tuple(pipes);
    if (!ps)
        return NULL;
    PyObject *ms = PySequence_Tuple(msgs);
    if (!ms) {
        Py_DECREF(ps);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(ps);
    PyObject *res = NULL;
    Py_buffer *bufs = NULL;
    char *ok = NULL;
    Py_ssize_t held = 0; /* bufs[0..held) are taken */
    if (PyTuple_GET_SIZE(ms) != n) {
        PyErr_Format(PyExc_ValueError, "Pipe.exchange: %zd pipes but %zd "
                     "messages", n, PyTuple_GET_SIZE(ms));
        goto done;
    }
    bufs = PyMem_Calloc((size_t)n + 1, sizeof *bufs);
    ok = PyMem_Calloc((size_t)n + 1, 1);
    if (!bufs || !ok) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(ps, i);
        if (!PyObject_TypeCheck(p, &FbpPipeType) || !((FbpPipe *)p)->p) {
            PyErr_Format(PyExc_TypeError, "Pipe.exchange: pipes[%zd] is "
                         "not an open Pipe", i);
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(ms, i), &bufs[i],
                               PyBUF_SIMPLE) != 0)
            goto done;
        held = i + 1;
    }
    char msg[1024];
    for (Py_ssize_t i = 0; i < n; i++) {
        struct qput c = {NULL, ((FbpPipe *)PyTuple_GET_ITEM(ps, i))->p,
                         bufs[i].buf, (size_t)bufs[i].len};
        int rc = fbp_wait_sliced(put_step, &c, -1, NULL, 0);
        if (rc == -2)
            goto done;
        ok[i] = rc == 0;
    }
    if (!(res = PyList_New(n)))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = Py_None;
        if (ok[i]) {
            fiber_buf b = {0};
            struct qget c = {NULL,
                             ((FbpPipe *)PyTuple_GET_ITEM(ps, i))->p,
                             &b};
            int rc = fbp_wait_sliced(get_step, &c, -1, msg, sizeof msg);
            item = rc == 0 ? fbp_bytes_of(&b) : rc == -2 ? NULL : Py_None;
            fiber_buf_free(&b);
            if (!item) {
                Py_CLEAR(res);
                goto done;
            }
            if (item == Py_None)
                Py_INCREF(item);
        } else {
            Py_INCREF(item);
        }
        PyList_SET_ITEM(res, i, item);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(ok);
    Py_DECREF(ps);
    Py_DECREF(ms);
    return res;
}

static PyObject *pipe_close(FbpPipe *self, PyObject *unused)
{
    (void)unused;
    int rc;
    FB_NOGIL(rc = fiber_pipe_close(self->p));
    if (rc)
        return fbp_raise_last(rc);
    Py_RETURN_NONE;
}

static PyObject *pipe_serialize(FbpPipe *self, PyObject *unused)
{
    (void)unused;
    fiber_buf b = {0};
    int rc = fiber_pipe_serialize(self->p, &b);
    PyObject *res = rc ? fbp_raise_last(rc) : fbp_bytes_of(&b);
    fiber_buf_free(&b);
    return res;
}

static PyMethodDef pipe_methods[] = {
    {"create", (PyCFunction)pipe_create, METH_VARARGS | METH_CLASS, NULL},
    {"open", (PyCFunction)pipe_open, METH_VARARGS | METH_CLASS, NULL},
    {"exchange", (PyCFunction)pipe_exchange, METH_VARARGS | METH_CLASS,
     NULL},
    {"send", (PyCFunction)pipe_send, METH_VARARGS, NULL},
    {"recv", (PyCFunction)pipe_recv, METH_VARARGS, NULL},
    {"close", (PyCFunction)pipe_close, METH_NOARGS, NULL},
    {"serialize", (PyCFunction)pipe_serialize, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject FbpPipeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fiber._fiber.Pipe",
    .tp_basicsize = sizeof(FbpPipe),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)pipe_dealloc,
    .tp_methods = pipe_methods,
    .tp_doc = "One end of a fiber_pipe.",
};

int fbp_queue_init(PyObject *m)
{
    if (PyType_Ready(&FbpQueueType) < 0 || PyType_Ready(&FbpPipeType) < 0)
        return -1;
    pthread_atfork(NULL, NULL, on_fork_child);
    PyObject *pickle = PyImport_ImportModule("pickle");
    if (!pickle)
        return -1;
    pickle_dumps = PyObject_GetAttrString(pickle, "dumps");
    pickle_loads = PyObject_GetAttrString(pickle, "loads");
    Py_DECREF(pickle);
    PyObject *stdq = PyImport_ImportModule("queue");
    if (!stdq)
        return -1;
    std_full = PyObject_GetAttrString(stdq, "Full");
    std_empty = PyObject_GetAttrString(stdq, "Empty");
    Py_DECREF(stdq);
    if (!std_full || !std_empty)
        return -1;
    protocol_5 = PyLong_FromLong(5);
    if (!pickle_dumps || !pickle_loads || !protocol_5)
        return -1;
    if (PyModule_AddObjectRef(m, "Queue", (PyObject *)&FbpQueueType) != 0)
        return -1;
    return PyModule_AddObjectRef(m, "Pipe", (PyObject *)&FbpPipeType);
}
