/*
 * queue.c -- fiber_queue and fiber_pipe, the client side (the server side
 * is queue_srv.c; the operations are in queue_ops.h).
 *
 * Producer: a put with timeout -1 is pipelined.  It returns once its
 * frame is queued to the server, with at most PUT_WINDOW of this handle's
 * puts unanswered (the credit window); puts that follow each other
 * closely are coalesced into one call and written by the connection's
 * flusher thread in batches, and a lone put is written at once.  A put
 * with a timeout (0 or more) is one synchronous call, as before.
 *
 * Consumer: a get lends this handle up to `window` items at a time
 * (prefetch); each get returns the next one and tells the server it was
 * taken before it returns (a posted TAKEN), so an item is gone from the
 * queue only when an application's get returned it, and what a dying
 * consumer still held goes back to the queue.  While the handle still
 * holds items and the last batch came full (demand is steady), it asks
 * for the next batch ahead of time; the window it asks for grows for a
 * consumer that takes items fast and shrinks back for a slow one
 * (adapt_window), unless fiber_queue_set_prefetch fixed it.  On the same
 * host the "taken" is a byte in a page shared with the server (see
 * queue_srv.c), so a get that finds its item prefetched makes no system
 * call at all.
 *
 * A pipe (pipe.c) has one queue per direction, for its relayed path.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/common.h"
#include "objsrv/objsrv.h"
#include "queue/queue_ops.h"
#include "runtime/runtime.h"

#define PUT_WINDOW 8192     /* pipelined puts unanswered, per handle */
#define STEADY_PUT_NS 20000 /* puts closer than this are batched */
#define DEFAULT_WINDOW 64   /* items a consumer handle prefetches */
/* An adaptive window (no fiber_queue_set_prefetch) doubles up to
 * MAX_WINDOW while the handle would take its whole window in less than
 * GROW_NS at its recent rate, and halves back towards DEFAULT_WINDOW when
 * the window would last more than SHRINK_NS: only a fast consumer holds
 * more than DEFAULT_WINDOW items. */
#define MAX_WINDOW 512
#define GROW_NS 1000000u   /* 1 ms */
#define SHRINK_NS 4000000u /* 4 ms */

/* ---- handles ------------------------------------------------------------- */

#define QUEUE_MAGIC 0x51554555u /* "QUEU" */

struct fiber_queue {
    uint32_t magic;
    struct fb_ohandle h;
    int creator;                /* fiber_queue_free destroys the queue */
    /* producer */
    struct fb_ocredit credit;   /* under the connection's lock */
    uint64_t last_put_ns;
    /* consumer, under mu */
    pthread_mutex_t mu;
    uint32_t cid;               /* this handle's consumer id */
    uint32_t window;            /* the next ask's size */
    int adaptive;               /* window follows the rate (see above) */
    uint64_t rate_ns;           /* when the last batch was asked for */
    uint32_t rate_taken;        /* items taken since */
    int consumed;               /* has asked for items: RELEASE on free */
    struct fb_owait *pending;   /* a GET in flight */
    int pending_refill;
    struct fb_oresult batch;    /* lent items not yet taken */
    const uint8_t *cursor;      /* the next of them in batch.raw */
    uint32_t batch_left;
    int batch_full;             /* the last batch filled its window */
    uint64_t next_seq;
    uint8_t *marks;             /* the page shared with the server */
    char marks_name[64];        /* its name while the server may map it */
    uint64_t *leases;           /* held, not acknowledged */
    size_t n_leases, leases_size;
};

static unsigned long object_seq;
static uint32_t consumer_seq;

static int check_queue(const fiber_queue *q)
{
    if (!q || q->magic != QUEUE_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_queue handle");
    return 0;
}

/* A call's status, naming the queue when the server says it was freed
 * (its creator's fiber_queue_free). */
static int named(const fiber_queue *q, int rc)
{
    if (rc != FIBER_ECLOSED) /* the common case, without a look at the text */
        return rc;
    return fb_ohandle_freed(&q->h, rc, "queue",
                            "by its creator (fiber_queue_free)");
}

static int queue_attach(fiber_queue **out, const char *addr,
                        const uint8_t *token, uint32_t obj)
{
    fiber_queue *q = calloc(1, sizeof *q);
    if (!q)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = fb_ohandle_open(&q->h, addr, token, obj);
    if (rc) {
        free(q);
        return rc;
    }
    pthread_mutex_init(&q->mu, NULL);
    q->cid = __atomic_add_fetch(&consumer_seq, 1, __ATOMIC_RELAXED);
    q->window = DEFAULT_WINDOW;
    q->adaptive = 1;
    q->magic = QUEUE_MAGIC;
    *out = q;
    return 0;
}

/* Creates a queue object named name (NULL: a fresh name) on the server at
 * addr. */
int fb_queue_create_on(fiber_queue **out, const char *addr,
                       const uint8_t *token, const char *name,
                       size_t capacity)
{
    struct fb_oclient *c;
    int rc = fb_oclient_get(addr, token, &c);
    if (rc)
        return rc;
    char fresh[64];
    if (!name) {
        snprintf(fresh, sizeof fresh, "queue-%lu",
                 __atomic_add_fetch(&object_seq, 1, __ATOMIC_RELAXED));
        name = fresh;
    }
    uint64_t cap = capacity;
    fiber_iov param = {&cap, 8};
    uint32_t id;
    rc = fb_oopen(c, "queue", name, &param, 1, &id);
    if (rc == 0)
        rc = queue_attach(out, addr, token, id);
    fb_oclient_release(c);
    return rc;
}

FIBER_API int fiber_queue_create(fiber_queue **out, size_t capacity)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_queue_create: out is NULL");
    struct fb_objsrv *s;
    int rc = fb_master_objsrv(&s);
    if (rc)
        return rc;
    rc = fb_queue_create_on(out, fb_objsrv_address(s), fb_rt_token(), NULL,
                            capacity);
    if (rc == 0)
        (*out)->creator = 1;
    return rc;
}

/* ---- putting ------------------------------------------------------------- */

int fb_message_check(const void *data, size_t len)
{
    if (len && !data)
        return fb_err(FIBER_EINVAL, "data is NULL with a length");
    uint32_t max = fb_rt_config()->max_message_bytes;
    if (len > max - 64)
        return fb_err(FIBER_ETOOBIG,
                      "a message of %zu bytes exceeds max_message_bytes (%u)",
                      len, max);
    return 0;
}

FIBER_API int fiber_queue_put(fiber_queue *q, const void *data, size_t len,
                              int timeout_ms)
{
    int rc = check_queue(q);
    if (rc == 0)
        rc = fb_message_check(data, len);
    if (rc)
        return rc;
    fiber_iov item = {data, len};
    if (timeout_ms >= 0)
        return named(q, fb_ocall(q->h.c, q->h.obj, FB_QOP_PUT, timeout_ms,
                                 &item, 1, NULL));
    /* Pipelined: a failure of an earlier put is reported here. */
    rc = fb_ocredit_wait(q->h.c, &q->credit, PUT_WINDOW - 1, UINT64_MAX);
    if (rc)
        return named(q, rc);
    uint64_t now = fb_now_ns();
    int steady = now - q->last_put_ns < STEADY_PUT_NS;
    q->last_put_ns = now;
    return fb_ocall_putn(q->h.c, q->h.obj, FB_QOP_PUT, &item, 1, &q->credit,
                         steady);
}

FIBER_API int fiber_queue_put_batch(fiber_queue *q, const fiber_iov *msgs,
                                    size_t count)
{
    int rc = check_queue(q);
    if (rc == 0 && count && !msgs)
        rc = fb_err(FIBER_EINVAL, "fiber_queue_put_batch: msgs is NULL");
    for (size_t i = 0; rc == 0 && i < count; i++)
        rc = fb_message_check(msgs[i].data, msgs[i].len);
    /* In parts that fit the credit window with room to spare. */
    while (rc == 0 && count) {
        size_t n = count < PUT_WINDOW / 4 ? count : PUT_WINDOW / 4;
        rc = fb_ocredit_wait(q->h.c, &q->credit, PUT_WINDOW - n, UINT64_MAX);
        if (rc == 0)
            rc = fb_ocall_putn(q->h.c, q->h.obj, FB_QOP_PUT, msgs, n,
                               &q->credit, 0);
        msgs += n;
        count -= n;
    }
    if (rc == 0)
        q->last_put_ns = fb_now_ns();
    return rc ? named(q, rc) : 0;
}

FIBER_API int fiber_queue_flush(fiber_queue *q, int timeout_ms)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    rc = fb_ocredit_wait(q->h.c, &q->credit, 0, fb_deadline_ms(timeout_ms));
    if (rc == FIBER_ETIMEDOUT)
        return fb_err(rc, timeout_ms == 0 ? "puts are still on their way"
                                          : "puts still unanswered after "
                                            "%d ms",
                      timeout_ms);
    return named(q, rc);
}

/* ---- getting ------------------------------------------------------------- */

/* Makes the page of take marks in the server's socket directory (same
 * host only: a unix address); its name goes with the first get.  On any
 * failure the handle sends TAKEN messages instead. */
static void make_marks(fiber_queue *q)
{
    const char *slash = strrchr(q->h.addr, '/');
    if (strncmp(q->h.addr, "unix:", 5) != 0 || !slash)
        return;
    char path[700];
    snprintf(q->marks_name, sizeof q->marks_name, "qack-%ld-%u-%u",
             (long)getpid(), q->cid, (unsigned)(fb_now_ns() & 0xffffff));
    snprintf(path, sizeof path, "%.*s/%s", (int)(slash - (q->h.addr + 5)),
             q->h.addr + 5, q->marks_name);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        q->marks_name[0] = '\0';
        return;
    }
    void *p = MAP_FAILED;
    if (ftruncate(fd, FB_QACK_SLOTS) == 0)
        p = mmap(NULL, FB_QACK_SLOTS, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 0);
    close(fd);
    if (p == MAP_FAILED) {
        unlink(path);
        q->marks_name[0] = '\0';
        return;
    }
    q->marks = p;
}

/* The server did not map the page: forget it (and its file). */
static void drop_marks(fiber_queue *q)
{
    if (q->marks_name[0]) {
        const char *slash = strrchr(q->h.addr, '/');
        char path[700];
        snprintf(path, sizeof path, "%.*s/%s", (int)(slash - (q->h.addr + 5)),
                 q->h.addr + 5, q->marks_name);
        unlink(path); /* ENOENT when the server took it */
        q->marks_name[0] = '\0';
    }
    if (q->marks)
        munmap(q->marks, FB_QACK_SLOTS);
    q->marks = NULL;
}

/* Asks for up to n items; mu held. */
static int ask(fiber_queue *q, uint32_t n, int refill, int timeout_ms)
{
    uint32_t args[3] = {q->cid, n, refill ? FB_QGET_REFILL : 0};
    fiber_iov items[4] = {{&args[0], 4}, {&args[1], 4}, {&args[2], 4}};
    size_t count = 3;
    if (!q->consumed) {
        make_marks(q);
        if (q->marks) {
            items[3] = (fiber_iov){q->marks_name, strlen(q->marks_name)};
            count = 4;
        }
    }
    q->consumed = 1;
    q->pending_refill = refill;
    return fb_ocall_begin(q->h.c, q->h.obj, FB_QOP_GET, refill ? -1 : timeout_ms,
                          items, count, &q->pending);
}

/* The pending GET was answered: its items become the batch, or its
 * failure is returned; mu held. */
static int install(fiber_queue *q)
{
    const char *text;
    const struct fb_oresult *r = fb_owait_result(q->pending, &text);
    int rc = r->status;
    const void *d;
    size_t len;
    if (rc == 0 && (r->count < 1 || fb_oresult_item(r, 0, &d, &len) != 0 ||
                    len != 16))
        rc = fb_err(FIBER_EPROTO, "a queue's get answered without a "
                                  "sequence number");
    else if (rc)
        fb_err(rc, "%s", text);
    if (rc == 0) {
        uint64_t flags;
        memcpy(&q->next_seq, d, 8);
        memcpy(&flags, (const uint8_t *)d + 8, 8);
        if (q->marks_name[0] && !(flags & FB_QREPLY_MARKS))
            drop_marks(q); /* the server does not read it */
        q->marks_name[0] = '\0'; /* the server took it (or never will) */
        fb_oresult_free(&q->batch);
        q->batch = *r; /* take the reply's buffer */
        memset((void *)r, 0, sizeof *r);
        q->cursor = (const uint8_t *)d + 16;
        q->batch_left = q->batch.count - 1;
        /* Demand is steady while batches come back full. */
        q->batch_full = q->batch_left > 0 &&
                        (q->pending_refill || q->batch_left >= q->window);
    }
    fb_owait_free(q->pending);
    q->pending = NULL;
    return rc;
}

/* Before an ask: sizes an adaptive window to the rate at which the
 * application took items since the last ask (see MAX_WINDOW); mu held.  The window grows only while the handle would empty it in under
 * GROW_NS, so what a consumer holds beyond DEFAULT_WINDOW it was taking
 * within about 2 ms. */
static void adapt_window(fiber_queue *q)
{
    uint64_t now = fb_now_ns();
    uint64_t took = q->rate_taken, span = now - q->rate_ns;
    if (q->rate_ns) {
        /* window / rate = window * span / took; growing wants a sample
         * of a quarter window at least, shrinking none (an idle handle) */
        uint64_t lasts = (uint64_t)q->window * span;
        if (took >= q->window / 4 && lasts < (uint64_t)GROW_NS * took &&
            q->window < MAX_WINDOW)
            q->window *= 2;
        else if (lasts > (uint64_t)SHRINK_NS * took &&
                 q->window > DEFAULT_WINDOW)
            q->window /= 2;
    }
    q->rate_ns = now;
    q->rate_taken = 0;
}

/* Takes the next lent item: tells the server (how 1: as a lease), then
 * appends it to out; mu held. */
static int take(fiber_queue *q, fiber_buf *out, uint32_t how, uint64_t *seq)
{
    uint32_t len;
    memcpy(&len, q->cursor, 4);
    const uint8_t *data = q->cursor + 4;
    q->cursor = data + len;
    q->batch_left--;
    *seq = q->next_seq++;
    int rc = 0;
    if (q->marks) {
        __atomic_store_n(&q->marks[*seq % FB_QACK_SLOTS],
                         (uint8_t)(how == 1 ? 2 : 1), __ATOMIC_RELEASE);
    } else {
        uint32_t cid = q->cid;
        fiber_iov items[3] = {{&cid, 4}, {seq, 8}, {&how, 4}};
        rc = fb_ocall_post(q->h.c, q->h.obj, FB_QOP_TAKEN, items, 3);
    }
    if (rc == 0 && out)
        rc = fiber_buf_append(out, data, len);
    q->rate_taken++;
    /* Steady demand: ask for the next batch before this one runs out. */
    if (rc == 0 && !q->pending && q->batch_full &&
        q->batch_left < q->window / 2) {
        if (q->adaptive)
            adapt_window(q);
        ask(q, q->window - q->batch_left, 1, -1);
    }
    return rc;
}

/* Waits for the pending GET (the server keeps the time: a refill is
 * answered at once, the caller's own get at its deadline); mu held. */
static int await_pending(fiber_queue *q)
{
    int rc = fb_owait_wait(q->pending, -1);
    return rc ? rc : install(q);
}

static int get_item(fiber_queue *q, fiber_buf *out, uint32_t how,
                    uint64_t *seq, int timeout_ms)
{
    pthread_mutex_lock(&q->mu);
    int rc = 0;
    while (rc == 0 && q->batch_left == 0) {
        if (!q->pending && q->adaptive)
            adapt_window(q); /* after a wait it shrinks */
        if (!q->pending)
            rc = ask(q, q->window, 0, timeout_ms);
        if (rc == 0)
            rc = await_pending(q);
    }
    if (rc == 0)
        rc = take(q, out, how, seq);
    pthread_mutex_unlock(&q->mu);
    return named(q, rc);
}

FIBER_API int fiber_queue_get(fiber_queue *q, fiber_buf *out, int timeout_ms)
{
    int rc = check_queue(q);
    uint64_t seq;
    return rc ? rc : get_item(q, out, 0, &seq, timeout_ms);
}

FIBER_API int fiber_queue_try_get(fiber_queue *q, fiber_buf *out)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    if (pthread_mutex_trylock(&q->mu) != 0) /* another thread's get */
        return fb_err(FIBER_EAGAIN, "the handle is in use by another "
                                    "thread's get");
    /* A refill asked for ahead of time may have come (a look, no wait). */
    if (q->batch_left == 0 && q->pending && fb_owait_ready(q->pending))
        rc = install(q);
    uint64_t seq;
    if (rc == 0 && q->batch_left == 0)
        rc = fb_err(FIBER_EAGAIN, "this handle holds no prefetched message");
    else if (rc == 0)
        rc = take(q, out, 0, &seq);
    pthread_mutex_unlock(&q->mu);
    return named(q, rc);
}

FIBER_API int fiber_queue_get_lease(fiber_queue *q, fiber_buf *out,
                                    uint64_t *lease, int timeout_ms)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    if (!lease)
        return fb_err(FIBER_EINVAL, "fiber_queue_get_lease: lease is NULL");
    pthread_mutex_lock(&q->mu);
    if (q->n_leases == q->leases_size) {
        size_t n = q->leases_size ? 2 * q->leases_size : 16;
        uint64_t *v = realloc(q->leases, n * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&q->mu);
            return fb_err(FIBER_ENOMEM, "out of memory");
        }
        q->leases = v;
        q->leases_size = n;
    }
    pthread_mutex_unlock(&q->mu);
    uint64_t seq;
    rc = get_item(q, out, 1, &seq, timeout_ms);
    if (rc == 0) {
        pthread_mutex_lock(&q->mu);
        q->leases[q->n_leases++] = seq;
        pthread_mutex_unlock(&q->mu);
        *lease = seq;
    }
    return rc;
}

FIBER_API int fiber_queue_ack(fiber_queue *q, uint64_t lease)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    pthread_mutex_lock(&q->mu);
    size_t i = 0;
    while (i < q->n_leases && q->leases[i] != lease)
        i++;
    if (i == q->n_leases) {
        pthread_mutex_unlock(&q->mu);
        return fb_err(FIBER_EINVAL, "lease %llu is not held by this handle "
                                    "(acknowledged already, or never given)",
                      (unsigned long long)lease);
    }
    q->leases[i] = q->leases[--q->n_leases];
    pthread_mutex_unlock(&q->mu);
    uint32_t cid = q->cid;
    fiber_iov items[2] = {{&cid, 4}, {&lease, 8}};
    return fb_ocall_post(q->h.c, q->h.obj, FB_QOP_ACK, items, 2);
}

FIBER_API int fiber_queue_set_prefetch(fiber_queue *q, unsigned window)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    if (window < 1 || window > FB_QGET_MAX)
        return fb_err(FIBER_EINVAL, "a prefetch window is 1..%u items, not "
                                    "%u",
                      FB_QGET_MAX, window);
    pthread_mutex_lock(&q->mu);
    q->window = window;
    q->adaptive = 0; /* the application's choice stays */
    pthread_mutex_unlock(&q->mu);
    return 0;
}

/* ---- the rest ------------------------------------------------------------ */

FIBER_API int fiber_queue_size(fiber_queue *q, size_t *n)
{
    int rc = check_queue(q);
    if (rc)
        return rc;
    struct fb_oresult r = {0};
    rc = fb_ocall(q->h.c, q->h.obj, FB_QOP_SIZE, 0, NULL, 0, &r);
    const void *d;
    size_t len;
    if (rc == 0 && fb_oresult_item(&r, 0, &d, &len) == 0 && len == 8) {
        uint64_t v;
        memcpy(&v, d, 8);
        *n = (size_t)v;
    }
    fb_oresult_free(&r);
    return named(q, rc);
}

FIBER_API int fiber_queue_close(fiber_queue *q)
{
    int rc = check_queue(q);
    return rc ? rc
              : named(q, fb_ocall(q->h.c, q->h.obj, FB_QOP_CLOSE, 0, NULL, 0,
                                  NULL));
}

FIBER_API int fiber_queue_serialize(fiber_queue *q, fiber_buf *out)
{
    int rc = check_queue(q);
    return rc ? rc
              : fb_handle_encode(out, FB_HANDLE_QUEUE, q->h.addr, q->h.token,
                                 q->h.obj, 0);
}

FIBER_API int fiber_queue_open(fiber_queue **out, const void *data, size_t len)
{
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj, extra;
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_queue_open: out is NULL");
    int rc = fb_handle_decode(data, len, FB_HANDLE_QUEUE, addr, sizeof addr,
                              token, &obj, &extra);
    return rc ? rc : queue_attach(out, addr, token, obj);
}

/* Frees the handle: its pipelined puts are answered first, what it holds
 * as a consumer goes back to the queue, and with destroy the queue goes
 * too. */
static void queue_drop(fiber_queue *q, int destroy)
{
    q->magic = 0;
    fb_ocredit_wait(q->h.c, &q->credit, 0, UINT64_MAX);
    if (q->pending)
        fb_owait_free(q->pending); /* its reply is dropped on arrival */
    if (q->consumed) {
        uint32_t cid = q->cid;
        fiber_iov item = {&cid, 4};
        fb_ocall_post(q->h.c, q->h.obj, FB_QOP_RELEASE, &item, 1);
    }
    if (destroy)
        fb_ocall(q->h.c, q->h.obj, FB_QOP_FREE, -1, NULL, 0, NULL);
    fb_oresult_free(&q->batch);
    free(q->leases);
    drop_marks(q); /* the server has its own mapping */
    fb_ohandle_close(&q->h);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

FIBER_API void fiber_queue_free(fiber_queue *q)
{
    if (!q || check_queue(q))
        return;
    queue_drop(q, q->creator);
}

FIBER_API void fiber_queue_detach(fiber_queue *q)
{
    if (!q || check_queue(q))
        return;
    queue_drop(q, 0);
}

/* ---- for pipes (pipe.c) ------------------------------------------------ */

int fb_queue_attach(fiber_queue **out, const char *addr, const uint8_t *token,
                    uint32_t obj)
{
    return queue_attach(out, addr, token, obj);
}

uint32_t fb_queue_obj(const fiber_queue *q)
{
    return q->h.obj;
}

void fb_queue_disown(fiber_queue *q)
{
    if (q)
        q->creator = 0;
}
