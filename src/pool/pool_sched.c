/*
 * pool_sched.c -- the pool's engine: workers and their connections,
 * pull-based dispatch with credits and automatic chunking, results,
 * worker loss and replacement, autoscaling, and the progress loop.
 *
 * Everything here runs with pool->mu held, in whichever thread drives the
 * pool (see fiber.h: the waiting caller, or the background thread).
 * Only the driver reads sockets, handles the inbox and frees workers;
 * other threads may queue tasks and flush output (apply_async does, so a
 * task leaves at once), which is safe because every connection is only
 * touched under pool->mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "pool/pool_int.h"

#define SPIN_US 50
#define LONG_DRIVE_MS 10 /* a caller driving this long: see fb_pool_bg_main */
#define AUTO_CHUNK_NS 200000.0   /* aim for chunks of ~200 us of work */
#define CHUNKS_PER_S 5000.0     /* and at most ~5,000 chunks a second */
#define CREDIT_NS 1000000.0      /* and ~1 ms of work held per worker */
#define MAX_CREDIT 1024
/* A worker whose connection holds this many bytes not yet taken by its
 * socket gets no further task until it answers one: credits count tasks,
 * and a thousand 1 MiB tasks of a microsecond each would otherwise sit in
 * the master's buffer for one worker (a gigabyte, freshly faulted in). */
#define UNSENT_MAX (2u << 20)
#define LONG_TASK_NS 100000000.0 /* beyond this a worker holds one task */
#define MAX_AUTO_CHUNK 4096
#define HEARTBEAT_MISSES 10
#define STARTUP_FAILURES_MAX 3
#define TIMER_MS 100
#define MAINTAIN_MS 5
#define LIMIT_CHECK_MS 200
#define LIMIT_MARGIN_MIN_MS 10000

/* ---- the inbox: what the service thread tells us --------------------- */

static void inbox_push(struct fb_worker *w, int kind, struct fb_conn *conn)
{
    struct fiber_pool *p = w->pool;
    struct fb_inbox_ev *ev = calloc(1, sizeof *ev);
    if (!ev) {
        /* Nothing better to do than to drop the connection; the job's end
         * (or a heartbeat) will still be noticed. */
        if (conn)
            fb_conn_close(conn);
        return;
    }
    ev->kind = kind;
    ev->w = w;
    if (conn)
        ev->conn = *conn;
    pthread_mutex_lock(&p->inbox_mu);
    struct fb_inbox_ev **tail = &p->inbox;
    while (*tail)
        tail = &(*tail)->next;
    *tail = ev;
    pthread_mutex_unlock(&p->inbox_mu);
    uint64_t one = 1;
    if (write(p->evfd, &one, sizeof one) < 0) {
        /* saturated: the driver is awake anyway */
    }
    /* No mu held here (fb_pool_wake reads fields under it); worker events
     * are rare, so the background thread is always woken. */
    pthread_cond_broadcast(&p->cond);
}

static void w_connected(struct fb_jobrec *j)
{
    inbox_push(j->owner, IN_CONNECTED, &j->conn);
}

static void w_ended(struct fb_jobrec *j) { inbox_push(j->owner, IN_ENDED, NULL); }

static int w_message(struct fb_jobrec *j, const struct fb_wire_hdr *h,
                     const uint8_t *payload)
{
    FB_UNUSED(j);
    FB_UNUSED(h);
    FB_UNUSED(payload);
    return -1; /* never called: the pool takes its connections */
}

const struct fb_owner_ops fb_pool_worker_ops = {
    .kind = "pool",
    .takes_conn = 1,
    .connected = w_connected,
    .message = w_message,
    .ended = w_ended,
};

/* ---- workers ------------------------------------------------------------ */

int fb_pool_alive_workers(const struct fiber_pool *p)
{
    return p->count.alive;
}

/* Workers that count toward the target: alive and not being retired. */
static int live_workers(const struct fiber_pool *p) { return p->count.live; }

static void set_retire(struct fiber_pool *p, struct fb_worker *w)
{
    w->retire = 1;
    fb_pool_note(p, w);
}

static int launch_worker(struct fiber_pool *p)
{
    if (p->n_workers == p->cap_workers) {
        int cap = p->cap_workers ? 2 * p->cap_workers : 16;
        struct fb_worker **ws = realloc(p->workers, (size_t)cap * sizeof *ws);
        if (!ws)
            return fb_err(FIBER_ENOMEM, "out of memory for workers");
        p->workers = ws;
        p->cap_workers = cap;
    }
    struct fb_worker *w = calloc(1, sizeof *w);
    if (!w)
        return fb_err(FIBER_ENOMEM, "out of memory for a worker");
    w->pool = p;
    char name[64];
    if (p->job_strs[0])
        snprintf(name, sizeof name, "%.40s-%llu", p->job_strs[0],
                 (unsigned long long)++p->name_seq);
    else
        snprintf(name, sizeof name, "Pool%u-Worker-%llu", p->pool_no,
                 (unsigned long long)++p->name_seq);
    fiber_job_opts opts = p->job;
    opts.name = name;
    int rc = fb_rt_launch(&w->job, "PoolWorker", name, &opts,
                          &fb_pool_worker_ops, w, NULL);
    if (rc) {
        free(w);
        return rc;
    }
    w->state = W_STARTING;
    w->index = p->n_workers;
    p->workers[p->n_workers++] = w;
    fb_pool_note(p, w);
    p->st.workers_started++;
    return 0;
}

int fb_pool_grow(struct fiber_pool *p, int n)
{
    /* One batch: the slurm backend submits these workers as one array. */
    fb_rt_batch_begin();
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = launch_worker(p);
    int brc = fb_rt_batch_end();
    return rc ? rc : brc;
}

/* Puts r at the front of ring (retries are the oldest work).  Returns 0,
 * or -1 when out of memory. */
static int ring_push_front(struct fb_ring *ring, struct fb_retry r)
{
    if (ring->len == ring->cap) {
        size_t cap = ring->cap ? 2 * ring->cap : 64;
        struct fb_retry *v = malloc(cap * sizeof *v);
        if (!v)
            return -1;
        for (size_t i = 0; i < ring->len; i++)
            v[i] = ring->v[(ring->head + i) % ring->cap];
        free(ring->v);
        ring->v = v;
        ring->cap = cap;
        ring->head = 0;
    }
    ring->head = (ring->head + ring->cap - 1) % ring->cap;
    ring->v[ring->head] = r;
    ring->len++;
    return 0;
}

static int ring_pop(struct fb_ring *ring, struct fb_retry *r)
{
    if (ring->len == 0)
        return 0;
    *r = ring->v[ring->head];
    ring->head = (ring->head + 1) % ring->cap;
    ring->len--;
    return 1;
}

/* Sends task index of b again; a suspect runs alone on its worker. */
static void retry_push(struct fiber_pool *p, struct fb_batch *b, size_t index,
                       int attempts, int suspect)
{
    struct fb_retry r = {b, index, attempts};
    if (ring_push_front(suspect ? &p->suspect : &p->retry, r) != 0)
        fb_batch_finish(p, b, index, FIBER_ENOMEM, "out of memory requeueing",
                        25);
}

/* Charges task idx of b with one more dead worker: it fails with
 * FIBER_ECRASHED at max_crashes, else goes back to the queue. */
static void charge(struct fiber_pool *p, struct fb_batch *b, size_t idx,
                   int attempts, const char *worker, const char *why)
{
    if (attempts < p->max_crashes) {
        retry_push(p, b, idx, attempts, 1);
        p->st.tasks_retried++;
        return;
    }
    char msg[512];
    int n = snprintf(msg, sizeof msg,
                     "it was running when %d workers died; the last, '%s', "
                     "%s",
                     attempts, worker, why);
    fb_batch_finish(p, b, idx, FIBER_ECRASHED, msg, n > 0 ? (size_t)n : 0);
    p->st.tasks_crashed++;
}

/* Gives the tasks a lost worker held back to the queue, one by one.  A
 * task that crashed its worker said so (FAULT) and was charged then.  A
 * worker that vanished without a word (SIGKILL, the OOM killer) is
 * charged to its task only if it held just one: with several, none can be
 * blamed, and all are simply sent again. */
static void requeue(struct fiber_pool *p, struct fb_worker *w, int charge_lone,
                    const char *why)
{
    size_t undone = 0;
    for (struct fb_chunk *c = w->head; c; c = c->next)
        undone += c->count - c->done;
    int lone = charge_lone && !w->faulted && undone == 1;
    struct fb_chunk *c, *next;
    for (c = w->head; c; c = next) {
        next = c->next;
        for (uint32_t k = c->done; k < c->count; k++) {
            if (lone) {
                char how[300];
                snprintf(how, sizeof how, "ended: %.200s", why);
                charge(p, c->b, c->first + k, c->attempts + 1, w->job->name,
                       how);
            } else {
                /* After a death nobody explained, each task it held runs
                 * alone next time, so that a second death can be
                 * pinned on one task. */
                retry_push(p, c->b, c->first + k, c->attempts,
                           charge_lone && !w->faulted);
                p->st.tasks_retried++;
            }
        }
        free(c);
    }
    w->head = w->tail = NULL;
    w->inflight = 0;
    fb_pool_note(p, w);
}

/* The worker reports that the task at `offset` of its first chunk is
 * killing it. */
static int on_fault(struct fiber_pool *p, struct fb_worker *w,
                    const struct fb_wire_hdr *h, const uint8_t *payload)
{
    uint32_t off;
    fb_wire_get_fault(payload, h->len, &off, NULL, 0);
    struct fb_chunk *c = w->head;
    if (!c || c->id != h->id || off != c->done)
        return -1;
    char why[200];
    if (h->code > 0)
        snprintf(why, sizeof why, "died of signal %d (%s)", (int)h->code,
                 strsignal((int)h->code));
    else
        snprintf(why, sizeof why, "exited: the task called exit()");
    /* The worker is dying: count it lost now, so that the statistics
     * agree with the ECRASHED a caller may see before its socket closes. */
    w->faulted = 1;
    p->st.workers_lost++;
    charge(p, c->b, c->first + c->done, c->attempts + 1, w->job->name, why);
    c->done++;
    w->inflight--;
    if (c->done == c->count) {
        w->head = c->next;
        if (!w->head)
            w->tail = NULL;
        free(c);
    }
    fb_pool_note(p, w);
    return 0;
}

static void close_conn(struct fiber_pool *p, struct fb_worker *w)
{
    if (!w->has_conn)
        return;
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, fb_conn_fd(&w->conn), NULL);
    fb_conn_close(&w->conn);
    w->has_conn = 0;
    w->want_out = w->out_armed = 0;
    fb_pool_note(p, w);
}

/* The worker's connection ended or broke, or it stopped heart-beating. */
static void worker_lost(struct fiber_pool *p, struct fb_worker *w,
                        const char *why)
{
    if (w->state == W_GONE)
        return;
    int was_ready = w->state == W_READY;
    close_conn(p, w);
    w->state = W_GONE;
    fb_pool_note(p, w);
    if (!w->asked_to_stop) {
        fb_log_warn("pool worker '%s' lost: %s", w->job->name, why);
        if (!w->faulted)
            p->st.workers_lost++; /* a FAULT counted it already */
        if (!was_ready)
            p->startup_failures++;
        fb_rt_lock();
        fb_rt_terminate(w->job); /* make sure it ends */
        fb_rt_unlock();
    }
    requeue(p, w, !w->asked_to_stop && was_ready, why);
}

static void remove_worker(struct fiber_pool *p, struct fb_worker *w)
{
    w->state = W_GONE;
    w->inflight = 0;
    fb_pool_note(p, w);
    for (int k = 0; k < WL_N; k++)
        fb_wlist_drop(w, k);
    int i = w->index;
    p->workers[i] = p->workers[--p->n_workers];
    p->workers[i]->index = i;
    fb_rt_forget(w->job);
    free(w);
}

/* The worker's job has ended (the backend says so). */
static void worker_ended(struct fiber_pool *p, struct fb_worker *w)
{
    char why[400];
    int status = w->job->exit_status;
    char id[64], tail[240];
    if (w->exit_msg[0])
        snprintf(why, sizeof why, "%s", w->exit_msg);
    else if (status < 0)
        snprintf(why, sizeof why, "killed by signal %d", -status);
    else if (status > 0 && fb_rt_job_output_tail(w->job, id, sizeof id, tail,
                                                 sizeof tail, 3))
        snprintf(why, sizeof why, "worker job %s failed with status %d: %s",
                 id, status, tail);
    else
        snprintf(why, sizeof why, "exited with status %d", status);
    if (w->state != W_GONE)
        worker_lost(p, w, why);
    if (!w->asked_to_stop && w->state == W_GONE &&
        p->startup_failures >= STARTUP_FAILURES_MAX && !p->broken[0]) {
        int n = snprintf(p->broken, sizeof p->broken,
                         "%d pool workers in a row died before taking a "
                         "task; the last, '%s': %.300s",
                         p->startup_failures, w->job->name, why);
        FB_UNUSED(n);
    }
    remove_worker(p, w);
}

static void worker_connected(struct fiber_pool *p, struct fb_worker *w,
                             struct fb_conn *conn)
{
    w->conn = *conn;
    w->has_conn = 1;
    w->state = W_INIT;
    w->last_heard_ms = fb_now_ms();
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fb_conn_fd(&w->conn), &ev) != 0) {
        worker_lost(p, w, "cannot watch its connection");
        return;
    }
    struct fb_msg_pool m = {
        .spin_us = p->spin_allowed ? SPIN_US : 0,
        .init_task = p->init_task ? p->init_task : "",
        .init_task_len = (uint8_t)(p->init_task ? strlen(p->init_task) : 0),
        .init_arg = p->init_arg,
        .init_arg_len = (uint32_t)p->init_arg_len};
    fb_pool_note(p, w);
    if (fb_wire_put_pool(fb_conn_out(&w->conn), &m) != 0) {
        worker_lost(p, w, fiber_last_error());
        return;
    }
    /* Retired while it was starting, its job was terminated then; but a
     * job can outrun that (a pod the kubelet starts while its deletion
     * waits, a container created as it is stopped), and would then idle
     * until the engine's grace ran out.  It connected: tell it too. */
    if (w->asked_to_stop && w->stop_sent)
        fb_wire_put_empty(fb_conn_out(&w->conn), FB_MSG_STOP, 0);
    fb_pool_note(p, w);
}

/* Returns 1 if there was news. */
static int process_inbox(struct fiber_pool *p)
{
    pthread_mutex_lock(&p->inbox_mu);
    struct fb_inbox_ev *ev = p->inbox;
    p->inbox = NULL;
    pthread_mutex_unlock(&p->inbox_mu);
    int news = ev != NULL;
    while (ev) {
        struct fb_inbox_ev *next = ev->next;
        if (ev->kind == IN_CONNECTED) {
            if (p->terminated)
                fb_conn_close(&ev->conn);
            else
                worker_connected(p, ev->w, &ev->conn);
        } else {
            worker_ended(p, ev->w);
        }
        free(ev);
        ev = next;
    }
    return news;
}

/* ---- dispatch ----------------------------------------------------------- */

/* The work a chunk should hold: ~200 us, or more when the pool is so
 * large that chunks that small would make the master exchange more than
 * CHUNKS_PER_S messages a second each way (2,048 workers running 10 ms
 * tasks one at a time: 204,800).  Then each worker gets chunks of
 * n_live / CHUNKS_PER_S seconds of work, and its results come back
 * together, at the chunk's end (worker.c reports a chunk still running
 * after a second).  At 2,048 workers on two cores every message costs
 * both ends a cold wake-up, so 5,000 a second, not 20,000: bench-scale's
 * workers spent 23 us of CPU a task instead of the floor's 15 with the
 * smaller chunks (docs/performance.md). */
static double chunk_work_ns(const struct fiber_pool *p)
{
    double by_rate = (double)p->n_live * 1e9 / CHUNKS_PER_S;
    return by_rate > AUTO_CHUNK_NS ? by_rate : AUTO_CHUNK_NS;
}

/* Tasks a worker may hold: about CREDIT_NS of work, or two chunks.  A
 * task of unknown or long duration is held alone, so a busy worker never
 * sits on work that an idle one could start (the round trip is small next
 * to the task); short tasks are held two or more at a time to hide the
 * round trip. */
static uint32_t credit_limit(const struct fiber_pool *p)
{
    if (p->task_ns <= 0 || p->task_ns > LONG_TASK_NS)
        return 1;
    /* Enough for two chunks, so the next is there when one ends. */
    double hold = 2 * chunk_work_ns(p);
    double c = (hold > CREDIT_NS ? hold : CREDIT_NS) / p->task_ns;
    /* But no more than half a fair share of what is still to be sent, or
     * CREDIT_NS of work if that is more: what a worker holds when the
     * others run dry is the map's tail. */
    double fair = (double)p->queued / (2.0 * (p->n_live > 0 ? p->n_live : 1));
    double least = CREDIT_NS / p->task_ns;
    if (fair < least)
        fair = least;
    if (c > fair)
        c = fair;
    return c < 2 ? 2 : c > MAX_CREDIT ? MAX_CREDIT : (uint32_t)c;
}

static size_t chunk_size(const struct fiber_pool *p, const struct fb_batch *b,
                         uint32_t room)
{
    size_t remaining = b->n - b->next, c;
    if (b->chunksize) {
        c = b->chunksize;
    } else if (p->task_ns <= 0) {
        c = 1;
    } else {
        double want = chunk_work_ns(p) / p->task_ns;
        c = want < 1 ? 1 : want > MAX_AUTO_CHUNK ? MAX_AUTO_CHUNK : (size_t)want;
        int alive = p->n_live;
        size_t fair = remaining / (size_t)(2 * (alive > 0 ? alive : 1));
        if (c > fair)
            c = fair > 0 ? fair : 1;
        if (c > room)
            c = room > 0 ? room : 1;
    }
    if (c > remaining)
        c = remaining;
    if (b->kind == B_IMAP && !b->stream) {
        /* Never past the end of the iterator's window (a stream's is
         * kept by fiber_imap_put). */
        size_t room_in_window = b->ordered ? b->taken + b->window - b->next
                                           : b->window - (b->next - b->taken);
        if (c > room_in_window)
            c = room_in_window;
    }
    if (c > FB_WIRE_CHUNK_MAX)
        c = FB_WIRE_CHUNK_MAX;
    return c;
}

/* Sends up to `count` consecutive tasks of b from `first` as one chunk,
 * fewer if the frame would grow past half the frame limit.  Returns how
 * many were sent (0 on failure). */
static size_t send_chunk(struct fiber_pool *p, struct fb_worker *w,
                         struct fb_batch *b, size_t first, size_t count,
                         int attempts)
{
    struct fb_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return 0;
    if (b->has_shared != w->shared_told ||
        (b->has_shared && memcmp(&b->shared, &w->shared, sizeof w->shared))) {
        /* The chunks from here on belong to another call's shared
         * argument (or none). */
        if (fb_wire_put_obj_call(fb_conn_out(&w->conn),
                                 b->has_shared ? b->shared.bytes : NULL)) {
            free(c);
            return 0;
        }
        w->shared_told = b->has_shared;
        w->shared = b->shared;
    }
    /* The frame is built in place in the conn's output (one lookup of it
     * per chunk, not per task: nothing else touches the conn meanwhile). */
    fiber_buf *out = fb_conn_out(&w->conn);
    size_t mark, sent = 0, start_len = out->len;
    c->id = ++p->chunk_seq;
    if (fb_wire_task_begin(out, c->id, b->task, b->task_len, &mark) != 0)
        goto fail;
    while (sent < count) {
        fiber_iov one;
        const fiber_iov *parts;
        size_t k = fb_batch_parts(b, first + sent, &one, &parts), len = 0;
        for (size_t i = 0; i < k; i++)
            len += parts[i].len;
        if (sent > 0 && out->len - mark + len > p->max_frame / 2)
            break;
        if (fb_wire_task_add_parts(out, parts, k) != 0)
            goto fail;
        sent++;
    }
    fb_wire_task_end(out, mark, (uint32_t)sent);
    c->b = b;
    c->first = first;
    c->count = (uint32_t)sent;
    c->attempts = attempts;
    if (w->tail)
        w->tail->next = c;
    else
        w->head = c;
    w->tail = c;
    w->inflight += (uint32_t)sent;
    w->assigned += sent;
    fb_pool_note(p, w);
    return sent;
fail:
    out->len = start_len;
    free(c);
    return 0;
}

/* The first batch in the queue that may send now (an imap whose window is
 * full waits for its reader). */
static struct fb_batch *next_batch(struct fiber_pool *p)
{
    for (struct fb_batch *b = p->q_head; b; b = b->q_next)
        if (b->next < b->n && fb_batch_can_send(b))
            return b;
    return NULL;
}

void fb_pool_unqueue(struct fiber_pool *p, struct fb_batch *b)
{
    struct fb_batch **pp = &p->q_head, *prev = NULL;
    while (*pp && *pp != b) {
        prev = *pp;
        pp = &(*pp)->q_next;
    }
    if (!*pp)
        return;
    *pp = b->q_next;
    if (p->q_tail == b)
        p->q_tail = prev;
    b->q_next = NULL;
}

/* Sends the next piece of work to w: a suspect (only to an idle worker,
 * and then alone), a retry, or fresh tasks.  Returns 1 if it sent
 * something. */
static int feed_one(struct fiber_pool *p, struct fb_worker *w, uint32_t limit)
{
    struct fb_retry r;
    while (w->inflight == 0 && ring_pop(&p->suspect, &r)) {
        if (r.b->done_bits[r.index / 64] & (1ull << (r.index % 64)))
            continue; /* completed meanwhile (a late result) */
        if (send_chunk(p, w, r.b, r.index, 1, r.attempts) == 1) {
            w->tail->isolated = 1;
            fb_pool_note(p, w);
            return 1;
        }
        retry_push(p, r.b, r.index, r.attempts, 1);
        return 0;
    }
    while (ring_pop(&p->retry, &r)) {
        if (r.b->done_bits[r.index / 64] & (1ull << (r.index % 64)))
            continue;
        if (send_chunk(p, w, r.b, r.index, 1, r.attempts) == 1)
            return 1;
        retry_push(p, r.b, r.index, r.attempts, 0);
        return 0;
    }
    struct fb_batch *b = next_batch(p);
    if (!b)
        return 0;
    size_t want = chunk_size(p, b, limit - (w->inflight < limit ? w->inflight
                                                                 : limit));
    if (p->maxtasks > 0 && want > (uint64_t)p->maxtasks - w->assigned)
        want = (size_t)((uint64_t)p->maxtasks - w->assigned);
    if (want == 0)
        return 0;
    size_t sent = send_chunk(p, w, b, b->next, want, 0);
    b->next += sent;
    p->queued -= sent;
    if (b->next == b->n)
        fb_pool_unqueue(p, b);
    if (p->maxtasks > 0 && w->assigned >= (uint64_t)p->maxtasks)
        set_retire(p, w); /* STOP once it has answered */
    return sent > 0;
}

static void feed_worker(struct fiber_pool *p, struct fb_worker *w)
{
    uint32_t limit = credit_limit(p);
    while (w->inflight < limit || w->inflight == 0) {
        if (w->head && w->head->isolated)
            break; /* a suspect runs alone */
        if (w->inflight > 0 && fb_conn_unsent(&w->conn) >= UNSENT_MAX)
            break; /* fed again when it answers */
        if (!feed_one(p, w, limit) || w->retire)
            break;
    }
}

static int work_waiting(const struct fiber_pool *p)
{
    return !p->terminated && (RETRIES(p) > 0 || p->queued > 0);
}

/* Feeds the workers that want work, from the sets kept as they change:
 * the cost is in the tasks sent, not in the workers that exist. */
void fb_pool_dispatch(struct fiber_pool *p)
{
    /* The credit follows what is left to send (a new map raises it). */
    p->credit = credit_limit(p);
    uint32_t limit = p->credit;
    /* Breadth first: every idle worker gets work before any worker gets
     * more, so a batch smaller than the pool spreads over all of it.
     * feed_one takes a fed worker off the idle set (fb_pool_note). */
    while (work_waiting(p) && p->idle.head) {
        struct fb_worker *w = p->idle.head;
        if (!feed_one(p, w, limit) && w->inflight == 0)
            break; /* nothing left to give */
        fb_pool_note(p, w);
    }
    /* Then the others up to their credit, oldest first; feed_worker
     * takes each off the hungry set once it is full. */
    struct fb_worker *w = p->hungry.head;
    while (work_waiting(p) && w) {
        struct fb_worker *next = w->link[WL_FEED].next;
        uint32_t had = w->inflight;
        feed_worker(p, w);
        fb_pool_note(p, w);
        if (w->inflight == had)
            break; /* nothing it could take: nor can the rest */
        w = next;
    }
}

/* Writes the queued output of the workers on the dirty set; one whose
 * socket is full leaves the set until EPOLLOUT says it has room. */
void fb_pool_flush(struct fiber_pool *p)
{
    struct fb_worker *w;
    while ((w = p->dirty.head)) {
        int rc = fb_conn_flush(&w->conn);
        if (rc < 0) {
            worker_lost(p, w, fb_conn_err(&w->conn));
        } else {
            w->want_out = rc == 1;
            if (w->want_out != w->out_armed) {
                w->out_armed = w->want_out;
                struct epoll_event ev = {
                    .events = EPOLLIN | (w->out_armed ? EPOLLOUT : 0),
                    .data.ptr = w};
                epoll_ctl(p->epfd, EPOLL_CTL_MOD, fb_conn_fd(&w->conn), &ev);
            }
        }
        fb_pool_note(p, w);
        if (w->link[WL_DIRTY].on)
            fb_wlist_drop(w, WL_DIRTY); /* a frame added meanwhile waits */
    }
}

/* ---- results ------------------------------------------------------------ */

static void note_task_time(struct fiber_pool *p, uint64_t elapsed_ns,
                           uint32_t count)
{
    double t = (double)elapsed_ns / count;
    if (t < 50)
        t = 50; /* a floor: the clock's own cost */
    p->task_ns = p->task_ns <= 0 ? t : 0.8 * p->task_ns + 0.2 * t;
    p->credit = credit_limit(p);
}

static int on_result(struct fiber_pool *p, struct fb_worker *w,
                     const struct fb_wire_hdr *h, const uint8_t *payload)
{
    struct fb_msg_result m;
    fb_wire_get_result(payload, h->len, h->code, &m, NULL, 0);
    struct fb_chunk *c = w->head;
    if (!c || c->id != h->id || m.offset != c->done ||
        m.count > c->count - c->done)
        return -1; /* results for work it does not hold */
    const uint8_t *cur = m.items;
    for (uint32_t k = 0; k < m.count; k++) {
        int32_t rc;
        const void *data;
        uint32_t len;
        fb_wire_result_next(&cur, &rc, &data, &len);
        fb_batch_finish(p, c->b, c->first + c->done, rc ? FIBER_ETASK : 0,
                        data, len);
        c->done++;
    }
    w->inflight -= m.count;
    note_task_time(p, m.elapsed_ns, m.count);
    if (c->done == c->count) {
        w->head = c->next;
        if (!w->head)
            w->tail = NULL;
        free(c);
    }
    if (w->inflight == 0)
        w->idle_since_ms = fb_now_ms();
    fb_pool_note(p, w);
    return 0;
}

static int on_frame(struct fiber_pool *p, struct fb_worker *w,
                    const struct fb_wire_hdr *h, const uint8_t *payload)
{
    switch (h->type) {
    case FB_MSG_RESULT:
        return on_result(p, w, h, payload);
    case FB_MSG_READY:
        if (w->state != W_INIT)
            return -1;
        w->state = W_READY;
        w->idle_since_ms = fb_now_ms();
        p->startup_failures = 0;
        fb_pool_note(p, w);
        return 0;
    case FB_MSG_HEARTBEAT:
        return 0;
    case FB_MSG_FAULT:
        return on_fault(p, w, h, payload);
    case FB_MSG_EXIT: {
        struct fb_msg_text t;
        fb_wire_get_text(payload, h->len, &t, NULL, 0);
        snprintf(w->exit_msg, sizeof w->exit_msg, "%.*s", (int)t.len, t.text);
        return 0;
    }
    case FB_MSG_PING: {
        int rc = fb_wire_put_pong(fb_conn_out(&w->conn), h->id) == 0 ? 0 : -1;
        fb_pool_note(p, w);
        return rc;
    }
    }
    return -1;
}

static void on_readable(struct fiber_pool *p, struct fb_worker *w)
{
    size_t had = fb_conn_buffered(&w->conn);
    int rc = fb_conn_read(&w->conn);
    if (fb_conn_buffered(&w->conn) != had) {
        w->last_heard_ms = fb_now_ms();
        fb_wlist_push(&p->heard, w); /* now the most recently heard */
        w->want_out = 0; /* an encrypted conn may now have its peer's key */
    }
    struct fb_wire_hdr h;
    const uint8_t *payload;
    int got;
    while (w->has_conn && (got = fb_conn_next(&w->conn, &h, &payload)) == 1) {
        if (on_frame(p, w, &h, payload) != 0) {
            char why[128];
            snprintf(why, sizeof why, "sent an unexpected %s",
                     fb_msg_type_name(h.type));
            worker_lost(p, w, why);
            return;
        }
    }
    if (!w->has_conn)
        return;
    if (got < 0)
        worker_lost(p, w, fb_conn_err(&w->conn));
    else if (rc != 0)
        worker_lost(p, w, w->exit_msg[0] ? w->exit_msg : fb_conn_err(&w->conn));
}

/* ---- keeping the pool the right size ------------------------------------ */

static void check_heartbeats(struct fiber_pool *p, uint64_t now)
{
    if (p->heartbeat_ms <= 0)
        return;
    uint64_t limit = (uint64_t)p->heartbeat_ms * HEARTBEAT_MISSES;
    /* The heard set is ordered by last_heard_ms: only its head can be
     * overdue first.  Each worker looked at here is either heard from
     * now (moved to the tail) or lost (taken off), so this ends. */
    struct fb_worker *w;
    while ((w = p->heard.head)) {
        if (w->last_heard_ms >= now || now - w->last_heard_ms <= limit)
            break;
        /* Nobody may have read its socket for a while (an idle pool):
         * what it sent meanwhile is waiting there, and reading it updates
         * last_heard_ms (to a time after `now`: compare with a fresh
         * clock, or the unsigned difference wraps). */
        on_readable(p, w);
        if (w->has_conn && fb_now_ms() - w->last_heard_ms > limit)
            worker_lost(p, w, "stopped heart-beating");
        if (p->heard.head == w)
            fb_wlist_push(&p->heard, w); /* cannot happen; never loop */
    }
}

static void autoscale(struct fiber_pool *p, uint64_t now)
{
    if (p->max_workers <= 0)
        return;
    size_t backlog = p->queued + RETRIES(p);
    if (backlog > 0 && p->target < p->max_workers &&
        now - p->last_grow_ms >= TIMER_MS) {
        if (p->count.starting == 0) {
            p->target++;
            p->last_grow_ms = now;
        }
    }
    /* The idle set's head has been idle longest. */
    struct fb_worker *w = p->idle.head;
    if (backlog == 0 && p->target > p->min_workers && w &&
        now >= w->idle_since_ms &&
        now - w->idle_since_ms >= (uint64_t)p->idle_ms) {
        set_retire(p, w);
        p->target--;
    }
}

/* Retires workers beyond the target, idle ones first. */
static void trim(struct fiber_pool *p)
{
    int excess = live_workers(p) - p->target;
    for (int pass = 0; pass < 2 && excess > 0; pass++) {
        for (int i = 0; i < p->n_workers && excess > 0; i++) {
            struct fb_worker *w = p->workers[i];
            if (w->state == W_GONE || w->retire)
                continue;
            if (pass == 0 && w->inflight > 0)
                continue;
            set_retire(p, w);
            excess--;
        }
    }
}

static void send_stops(struct fiber_pool *p)
{
    struct fb_worker *w, *next;
    for (w = p->stopq.head; w; w = next) {
        next = w->link[WL_STOP].next;
        if (w->inflight == 0) {
            w->asked_to_stop = 1;
            if (w->has_conn && w->state != W_STARTING) {
                fb_wire_put_empty(fb_conn_out(&w->conn), FB_MSG_STOP, 0);
                w->stop_sent = 1;
            } else if (w->state == W_STARTING) {
                fb_rt_lock();
                fb_rt_terminate_unread(w->job);
                fb_rt_unlock();
                w->stop_sent = 1;
            }
            fb_pool_note(p, w);
        }
    }
}

/* Fails everything not yet done: the pool cannot run it. */
static void fail_all_pending(struct fiber_pool *p, int code, const char *msg)
{
    size_t len = strlen(msg);
    struct fb_retry r;
    while (ring_pop(&p->retry, &r) || ring_pop(&p->suspect, &r))
        fb_batch_finish(p, r.b, r.index, code, msg, len);
    while (p->q_head) {
        struct fb_batch *b = p->q_head;
        while (b->next < b->n) {
            fb_batch_finish(p, b, b->next++, code, msg, len);
            p->queued--;
        }
        fb_pool_unqueue(p, b);
    }
}

/* How long before its job's time limit a worker is retired: the
 * configuration's time_limit_margin_ms, else the larger of
 * LIMIT_MARGIN_MIN_MS (a replacement's start) and four times what a
 * worker holds at the measured task time (its tasks still to answer). */
static uint64_t limit_margin_ms(const struct fiber_pool *p)
{
    int given = fb_rt_config()->time_limit_margin_ms;
    if (given > 0)
        return (uint64_t)given;
    double held_ms = p->task_ns / 1e6 * (p->credit ? p->credit : 1);
    double m = 4 * held_ms;
    return m > LIMIT_MARGIN_MIN_MS ? (uint64_t)m : LIMIT_MARGIN_MIN_MS;
}

/* Retires the workers whose jobs reach their time limit within the margin
 * (the backend's estimate, fb_job.end_by_ms): no new task goes to them,
 * the target brings a replacement at once, and each gets STOP once its
 * tasks are answered.  Every LIMIT_CHECK_MS at most. */
static void retire_near_limit(struct fiber_pool *p, uint64_t now)
{
    if (now - p->last_limit_check_ms < LIMIT_CHECK_MS)
        return;
    p->last_limit_check_ms = now;
    uint64_t margin = limit_margin_ms(p);
    fb_rt_lock();
    for (int i = 0; i < p->n_workers; i++) {
        struct fb_worker *w = p->workers[i];
        if (w->state == W_GONE || w->retire || !w->job || !w->job->job)
            continue;
        uint64_t end_by = w->job->job->end_by_ms;
        if (end_by == 0 || now + margin < end_by)
            continue;
        w->at_limit = 1;
        fb_log_info("pool: worker %s (job %s) reaches its time limit in "
                    "%.1f s: draining it (%u task%s held) and starting a "
                    "replacement",
                    w->job->name, w->job->job->engine_id,
                    end_by > now ? (double)(end_by - now) / 1000.0 : 0.0,
                    w->inflight, w->inflight == 1 ? "" : "s");
    }
    fb_rt_unlock();
    for (int i = 0; i < p->n_workers; i++) {
        struct fb_worker *w = p->workers[i];
        if (w->at_limit && !w->retire) {
            p->st.workers_retired_at_limit++;
            set_retire(p, w);
        }
    }
}

/* Keeps the pool the right size.  It runs at most every MAINTAIN_MS
 * unless something changed (force: the inbox had news); it walks no set
 * of workers but the ones that need it (overdue, retiring, excess). */
static void maintain(struct fiber_pool *p, int force)
{
    if (p->terminated)
        return;
    uint64_t now = fb_now_ms();
    if (!force && now - p->last_maintain_ms < MAINTAIN_MS)
        return;
    p->last_maintain_ms = now;
    check_heartbeats(p, now);
    now = fb_now_ms(); /* reading sockets above may have stamped later times */
    if (p->broken[0]) {
        fail_all_pending(p, FIBER_ESPAWN, p->broken);
        return;
    }
    autoscale(p, now);
    retire_near_limit(p, now);
    trim(p);
    int missing = p->target - live_workers(p);
    int work_left = p->queued + RETRIES(p) > 0 || !p->closed;
    /* While fiber_pool_create launches the first workers, the missing
     * ones are its to start, not ours. */
    if (missing > 0 && work_left && !p->creating) {
        int rc = fb_pool_grow(p, missing);
        if (rc && !p->broken[0])
            snprintf(p->broken, sizeof p->broken,
                     "cannot start pool workers: %s", fiber_last_error());
    }
    send_stops(p);
    p->n_live = live_workers(p);
    p->credit = credit_limit(p);
    p->spin_allowed = (unsigned)fb_pool_alive_workers(p) + 1 <= p->ncpu;
}

void fb_pool_stop_workers(struct fiber_pool *p)
{
    for (int i = 0; i < p->n_workers; i++) {
        struct fb_worker *w = p->workers[i];
        w->asked_to_stop = 1;
        close_conn(p, w);
        if (w->state != W_GONE) {
            w->state = W_GONE;
            fb_rt_lock();
            fb_rt_terminate(w->job);
            fb_rt_unlock();
        }
        requeue(p, w, 0, "pool terminated");
    }
}

/* ---- the progress loop -------------------------------------------------- */

static void handle_events(struct fiber_pool *p, struct epoll_event *evs,
                          int n)
{
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == &p->evfd) {
            uint64_t v;
            if (read(p->evfd, &v, sizeof v) < 0) {
                /* already drained */
            }
            continue;
        }
        struct fb_worker *w = evs[i].data.ptr;
        if (!w->has_conn)
            continue;
        if (evs[i].events & EPOLLOUT) {
            w->want_out = 0; /* fb_pool_flush re-evaluates */
            fb_pool_note(p, w);
        }
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            on_readable(p, w);
    }
}

/* Waits for socket events with pool->mu released: spins briefly first
 * when the machine has a core to spare, then blocks. */
static void wait_events(struct fiber_pool *p, int timeout_ms)
{
    struct epoll_event evs[256];
    int n = 0;
    unsigned spin_us = p->spin_allowed ? fb_spin_budget(&p->spin) : 0;
    pthread_mutex_unlock(&p->mu);
    if (spin_us) {
        uint64_t until = fb_now_ns() + spin_us * 1000u;
        do
            n = epoll_wait(p->epfd, evs, (int)FB_ARRAY_LEN(evs), 0);
        while (n == 0 && fb_now_ns() < until);
    }
    int spun = n > 0;
    if (n == 0)
        n = epoll_wait(p->epfd, evs, (int)FB_ARRAY_LEN(evs), timeout_ms);
    pthread_mutex_lock(&p->mu);
    if (spin_us)
        fb_spin_result(&p->spin, spun);
    if (n > 0)
        handle_events(p, evs, n);
}

void fb_pool_run_callbacks(struct fiber_pool *p)
{
    while (p->cb_head) {
        struct fb_batch *b = p->cb_head;
        p->cb_head = b->cb_next;
        if (!p->cb_head)
            p->cb_tail = NULL;
        b->cb_next = NULL;
        /* cb_pending stays set while the callback runs without the lock,
         * so that a fiber_future_free on another thread leaves the batch
         * (and the result the callback reads) to this loop to free. */
        if (b->cb) {
            int rc = b->rc;
            p->callbacks_running++;
            pthread_mutex_unlock(&p->mu);
            const char *msg = fb_batch_msg(b);
            b->cb(b->ud, rc, rc ? (const void *)msg : b->result.data,
                  rc ? strlen(msg) : b->result.len);
            pthread_mutex_lock(&p->mu);
            p->callbacks_running--;
            fb_pool_wake(p);
        }
        b->cb_pending = 0;
        if (!b->has_handle)
            fb_batch_free(b);
    }
}

static int timer_needed(const struct fiber_pool *p)
{
    return p->heartbeat_ms > 0 || p->max_workers > 0 ||
           p->count.starting > 0;
}

int fb_pool_progress(struct fiber_pool *p, int (*done)(void *), void *arg,
                     uint64_t deadline_ms)
{
    for (;;) {
        int news = process_inbox(p);
        maintain(p, news);
        fb_pool_dispatch(p);
        fb_pool_flush(p);
        if (p->cb_head) {
            fb_pool_run_callbacks(p);
            continue;
        }
        if (done(arg))
            return 0;
        int timeout = fb_ms_left(deadline_ms);
        if (timeout == 0)
            return FIBER_ETIMEDOUT;
        if (timer_needed(p) && (timeout < 0 || timeout > TIMER_MS))
            timeout = TIMER_MS;
        wait_events(p, timeout);
        p->last_drive_ms = fb_now_ms();
    }
}

/* ---- the background thread ---------------------------------------------- */

static int outstanding(struct fiber_pool *p)
{
    pthread_mutex_lock(&p->inbox_mu);
    int inbox = p->inbox != NULL;
    pthread_mutex_unlock(&p->inbox_mu);
    if (inbox || p->queued || RETRIES(p) || p->cb_head)
        return 1;
    if (p->max_workers > 0 && p->target > p->min_workers)
        return 1;
    if (!p->terminated && live_workers(p) != p->target)
        return 1; /* a resize to carry out */
    return p->count.inflight || p->count.starting || p->count.stopping;
}

void fb_pool_drive_end(struct fiber_pool *p)
{
    p->driving = 0;
    p->last_drive_ms = fb_now_ms();
    /* Not fb_pool_wake, which, no one driving now, would wake the
     * background thread even with nothing left: a caller making one call
     * after another would wake it twice a call (here, then at its next
     * submission). */
    if (fb_pool_cond_watched(p) ||
        (p->bg_wait == BG_FOR_DRIVER && outstanding(p)))
        pthread_cond_broadcast(&p->cond);
}

static int bg_done(void *arg)
{
    struct fiber_pool *p = arg;
    return p->want_drive > 0 || p->bg_stop || !outstanding(p);
}

/* The background thread drives the pool while no caller does and work is
 * outstanding, so that asynchronous tasks progress and callbacks run.  It
 * steps aside (want_drive) as soon as a caller wants to wait itself, and
 * lets a caller that just stopped driving keep the socket for 2 ms before
 * taking over, so a caller issuing one call after another never pays a
 * thread hand-over.  While a caller has driven for LONG_DRIVE_MS it sleeps
 * until woken (a thread that looked every 2 ms cost a master waiting in a
 * long map ~500 wake-ups a second).  It stops when the pool is freed
 * (bg_stop). */
void *fb_pool_bg_main(void *arg)
{
    struct fiber_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->bg_stop) {
        int work = outstanding(p);
        uint64_t now = fb_now_ms();
        if (work && !p->driving && p->want_drive == 0 &&
            now - p->last_drive_ms >= 2) {
            p->driving = 1;
            fb_pool_progress(p, bg_done, p, UINT64_MAX);
            p->driving = 0;
            p->last_drive_ms = fb_now_ms();
            fb_pool_wake(p);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        /* While a caller has been driving a while (a long map) there is
         * nothing to look at every 2 ms: the caller wakes this thread
         * when it stops with work left (fb_pool_drive_end), and so does
         * the next submission made while no one drives (fb_pool_wake);
         * not the submissions and results while it drives.  Not for
         * short drives: a caller making one call after another submits
         * just before it drives, and that submission would wake this
         * thread once a call. */
        if (!work)
            p->bg_wait = BG_IDLE;
        else if (p->driving && p->drive_start_ms + LONG_DRIVE_MS <= now)
            p->bg_wait = BG_FOR_DRIVER;
        else
            p->bg_wait = BG_BRIEF;
        long add_ms = p->bg_wait == BG_BRIEF ? 2 : 200;
        ts.tv_nsec += add_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&p->cond, &p->mu, &ts);
        p->bg_wakes++;
        p->bg_wait = BG_AWAKE;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int fb_pool_sched_init(struct fiber_pool *p)
{
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd < 0)
        return fb_err_errno(FIBER_ESYS, "epoll_create1");
    p->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->evfd < 0)
        return fb_err_errno(FIBER_ESYS, "eventfd");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &p->evfd};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->evfd, &ev) != 0)
        return fb_err_errno(FIBER_ESYS, "epoll_ctl");
    fb_wlist_init(&p->idle, WL_FEED);
    fb_wlist_init(&p->hungry, WL_FEED);
    fb_wlist_init(&p->dirty, WL_DIRTY);
    fb_wlist_init(&p->heard, WL_HEARD);
    fb_wlist_init(&p->stopq, WL_STOP);
    p->credit = credit_limit(p);
    return 0;
}

void fb_pool_sched_fini(struct fiber_pool *p)
{
    /* Forget every job first: after that no callback can name a worker,
     * and the inbox can be emptied safely. */
    for (int i = 0; i < p->n_workers; i++) {
        close_conn(p, p->workers[i]);
        fb_rt_forget(p->workers[i]->job);
    }
    pthread_mutex_lock(&p->inbox_mu);
    struct fb_inbox_ev *ev = p->inbox;
    p->inbox = NULL;
    pthread_mutex_unlock(&p->inbox_mu);
    while (ev) {
        struct fb_inbox_ev *next = ev->next;
        if (ev->kind == IN_CONNECTED)
            fb_conn_close(&ev->conn);
        free(ev);
        ev = next;
    }
    for (int i = 0; i < p->n_workers; i++) {
        struct fb_chunk *c = p->workers[i]->head, *n;
        for (; c; c = n) {
            n = c->next;
            free(c);
        }
        free(p->workers[i]);
    }
    free(p->workers);
    p->workers = NULL;
    p->n_workers = 0;
    if (p->epfd >= 0)
        close(p->epfd);
    if (p->evfd >= 0)
        close(p->evfd);
    p->epfd = p->evfd = -1;
}
