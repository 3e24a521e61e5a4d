/*
 * pool.c -- fiber_pool's API: creating and destroying pools, submitting
 * batches of tasks (apply, map, map_bufs, imap), the futures over them
 * (future/future.h) and iterators.  A batch and its results, recorded
 * exactly once, are batch.c's; the engine that moves tasks to workers and
 * results back is pool_sched.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/thread.h"
#include "future/future.h"
#include "pool/pool_int.h"
#include "runtime/task.h"
#include "store/object_int.h"

#define IMAP_MAGIC 0x494d4150u   /* "IMAP" */
/* apply_async waits for room beyond this many unsent tasks. */
#define MAX_QUEUED 65536
#define DEFAULT_IDLE_MS 2000

struct fiber_imap {
    uint32_t magic;
    struct fb_batch *b;
};

static unsigned pool_count;

static int check_pool(const fiber_pool *p)
{
    if (!p || p->magic != POOL_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_pool handle");
    return 0;
}

/* ---- waiting ------------------------------------------------------------- */

/* Waits until done(arg), driving the pool when no other thread does.
 * mu held.  Returns 0 or FIBER_ETIMEDOUT. */
static int pool_wait(struct fiber_pool *p, int (*done)(void *), void *arg,
                     uint64_t deadline_ms)
{
    while (!done(arg)) {
        if (!p->driving) {
            p->driving = 1;
            p->drive_start_ms = fb_now_ms();
            int rc = fb_pool_progress(p, done, arg, deadline_ms);
            fb_pool_drive_end(p);
            return rc;
        }
        /* Someone drives: ask the background thread to step aside. */
        p->want_drive++;
        uint64_t one = 1;
        if (write(p->evfd, &one, sizeof one) < 0) {
            /* saturated: the driver will wake anyway */
        }
        int rc = 0;
        p->cond_waiters++;
        if (deadline_ms == UINT64_MAX) {
            pthread_cond_wait(&p->cond, &p->mu);
        } else {
            struct timespec ts = {.tv_sec = (time_t)(deadline_ms / 1000),
                                  .tv_nsec =
                                      (long)(deadline_ms % 1000) * 1000000L};
            rc = pthread_cond_timedwait(&p->cond, &p->mu, &ts);
        }
        p->cond_waiters--;
        p->want_drive--;
        if (rc != 0 && !done(arg))
            return FIBER_ETIMEDOUT;
    }
    return 0;
}

static int batch_complete(void *arg) { return ((struct fb_batch *)arg)->complete; }

static int room_to_queue(void *arg)
{
    struct fiber_pool *p = arg;
    return p->queued < MAX_QUEUED || p->terminated || p->broken[0];
}

/* ---- creation ------------------------------------------------------------ */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static int copy_job_opts(struct fiber_pool *p, const fiber_job_opts *o)
{
    if (!o)
        return 0;
    p->job = *o;
    p->job_strs[0] = dup_or_null(o->name);
    p->job_strs[1] = dup_or_null(o->backend);
    p->job_strs[2] = dup_or_null(o->image);
    p->job_strs[3] = dup_or_null(o->workdir);
    p->job.name = NULL;
    p->job.backend = p->job_strs[1];
    p->job.image = p->job_strs[2];
    p->job.workdir = p->job_strs[3];
    size_t n = 0;
    while (o->env && o->env[n])
        n++;
    if (n) {
        p->job_env = calloc(n + 1, sizeof *p->job_env);
        if (!p->job_env)
            return fb_err(FIBER_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            if (!(p->job_env[i] = strdup(o->env[i])))
                return fb_err(FIBER_ENOMEM, "out of memory");
    }
    p->job.env = (const char *const *)p->job_env;
    return 0;
}

static int check_opts(const fiber_pool_opts *o)
{
    if (!o)
        return 0;
    if (o->workers < 0 || o->min_workers < 0 || o->max_workers < 0 ||
        o->maxtasksperchild < 0 || o->max_task_crashes < 0 || o->idle_ms < 0)
        return fb_err(FIBER_EINVAL, "pool options may not be negative");
    if (o->max_workers > 0 && o->min_workers > o->max_workers)
        return fb_err(FIBER_EINVAL, "min_workers %d exceeds max_workers %d",
                      o->min_workers, o->max_workers);
    if (o->initarg_len && !o->initarg)
        return fb_err(FIBER_EINVAL, "initarg is NULL with a length");
    if (o->initializer)
        return fiber_task_lookup(o->initializer, NULL);
    return 0;
}

static int pool_configure(struct fiber_pool *p, const fiber_pool_opts *o)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    p->ncpu = ncpu > 0 ? (unsigned)ncpu : 1;
    p->target = o && o->workers ? o->workers : (int)p->ncpu;
    if (o && o->max_workers > 0) {
        p->min_workers = o->min_workers;
        p->max_workers = o->max_workers;
        if (p->target > p->max_workers)
            p->target = p->max_workers;
        if (p->target < p->min_workers)
            p->target = p->min_workers;
    }
    p->idle_ms = o && o->idle_ms ? o->idle_ms : DEFAULT_IDLE_MS;
    p->maxtasks = o ? o->maxtasksperchild : 0;
    p->max_crashes = o && o->max_task_crashes ? o->max_task_crashes : 3;
    const struct fb_config *cfg = fb_rt_config();
    p->heartbeat_ms = cfg->heartbeat_ms;
    p->max_frame = cfg->max_message_bytes;
    p->pool_no = ++pool_count;
    if (o && o->initializer) {
        p->init_task = strdup(o->initializer);
        if (!p->init_task)
            return fb_err(FIBER_ENOMEM, "out of memory");
    }
    if (o && o->initarg_len) {
        p->init_arg = malloc(o->initarg_len);
        if (!p->init_arg)
            return fb_err(FIBER_ENOMEM, "out of memory");
        memcpy(p->init_arg, o->initarg, o->initarg_len);
        p->init_arg_len = o->initarg_len;
    }
    return copy_job_opts(p, o ? o->job : NULL);
}

static void pool_release(struct fiber_pool *p)
{
    free(p->init_task);
    free(p->init_arg);
    for (int i = 0; i < 4; i++)
        free(p->job_strs[i]);
    for (size_t i = 0; p->job_env && p->job_env[i]; i++)
        free(p->job_env[i]);
    free(p->job_env);
    free(p->retry.v);
    free(p->suspect.v);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->inbox_mu);
    pthread_cond_destroy(&p->cond);
    free(p);
}

static int start_bg(struct fiber_pool *p)
{
    int rc = fb_thread_start(&p->bg, fb_pool_bg_main, p, "the pool's thread");
    if (rc)
        return rc;
    p->bg_running = 1;
    return 0;
}

FIBER_API int fiber_pool_create(fiber_pool **out, const fiber_pool_opts *opts)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "fiber_pool_create: out is NULL");
    if (!fb_rt_is_master())
        return fb_err(FIBER_ENOTINIT,
                      "call fiber_init() first (pools are created by the "
                      "master)");
    int rc = check_opts(opts);
    if (rc)
        return rc;
    struct fiber_pool *p = calloc(1, sizeof *p);
    if (!p)
        return fb_err(FIBER_ENOMEM, "out of memory");
    p->magic = POOL_MAGIC;
    p->epfd = p->evfd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->inbox_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    rc = pool_configure(p, opts);
    if (rc == 0)
        rc = fb_pool_sched_init(p);
    p->spin_allowed = (unsigned)p->target + 1 <= p->ncpu;
    p->n_live = p->target;
    p->creating = 1;
    fb_spin_init(&p->spin, 50);
    if (rc == 0)
        rc = start_bg(p);
    if (rc == 0)
        fb_pool_registry_add(p); /* fiber top shows its workers starting */
    /* Launch in small groups, letting go of the lock between them, so
     * that the first workers are admitted while the rest start. */
    for (int started = 0; rc == 0 && started < p->target;) {
        int n = p->target - started < 16 ? p->target - started : 16;
        pthread_mutex_lock(&p->mu);
        rc = fb_pool_grow(p, n);
        started += n;
        if (started >= p->target)
            p->creating = 0;
        fb_pool_wake(p);
        pthread_mutex_unlock(&p->mu);
    }
    if (rc) {
        pthread_mutex_lock(&p->mu);
        p->creating = 0;
        pthread_mutex_unlock(&p->mu);
    }
    if (rc) {
        if (p->bg_running) {
            pthread_mutex_lock(&p->mu);
            p->bg_stop = 1;
            pthread_cond_broadcast(&p->cond);
            pthread_mutex_unlock(&p->mu);
            pthread_join(p->bg, NULL);
        }
        fb_pool_registry_remove(p);
        fb_pool_sched_fini(p);
        pool_release(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* ---- submitting ----------------------------------------------------------- */

/* Checks what every submission needs; mu held. */
static int can_submit(struct fiber_pool *p, const char *task)
{
    if (p->terminated)
        return fb_err(FIBER_ECLOSED, "the pool was terminated");
    if (p->closed)
        return fb_err(FIBER_ECLOSED, "the pool is closed to new tasks");
    if (p->broken[0])
        return fb_err(FIBER_ESPAWN, "%s", p->broken);
    if (!task)
        return fb_err(FIBER_EINVAL, "task name is NULL");
    const fiber_ref *shared = fb_objects_call_shared();
    if (shared && fb_objects_pin_ref(shared) != 0)
        return fb_err(FIBER_ENOKEY, "the call's shared argument "
                      "(fiber_pool_shared) is not in the store: never put, "
                      "or released");
    if (shared)
        fb_objects_unpin_ref(shared);
    return fiber_task_lookup(task, NULL);
}

static int check_len(const struct fiber_pool *p, size_t len)
{
    if (len > p->max_frame / 2)
        return fb_err(FIBER_ETOOBIG,
                      "a task argument of %zu bytes exceeds half of "
                      "max_message_bytes (%u)",
                      len, p->max_frame);
    return 0;
}

/* Sends what can be sent right away, so a task leaves without waiting for
 * a driver; mu held. */
static void kick(struct fiber_pool *p)
{
    fb_pool_dispatch(p);
    fb_pool_flush(p);
    fb_pool_wake(p);
}

static const struct fb_future_ops batch_future_ops;

/* A future over b; mu held. */
static int new_future(struct fb_batch *b, fiber_future **out)
{
    int rc = fb_future_new(&batch_future_ops, b, out);
    if (rc == 0)
        b->has_handle = 1;
    return rc;
}

FIBER_API int fiber_pool_apply_async(fiber_pool *p, const char *task,
                                     const void *arg, size_t len,
                                     fiber_done_fn cb, void *ud,
                                     fiber_future **out)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (len && !arg)
        return fb_err(FIBER_EINVAL, "arg is NULL with a length");
    pthread_mutex_lock(&p->mu);
    rc = can_submit(p, task);
    if (rc == 0)
        rc = check_len(p, len);
    if (rc == 0 && !room_to_queue(p))
        pool_wait(p, room_to_queue, p, UINT64_MAX); /* backpressure */
    struct fb_batch *b = NULL;
    if (rc == 0 && !(b = fb_batch_new(p, B_APPLY, task, 1)))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0 && !(b->arg = malloc(len ? len : 1)))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0 && out)
        rc = new_future(b, out);
    if (rc) {
        fb_batch_free(b);
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    if (len)
        memcpy(b->arg, arg, len);
    b->arg_len = len;
    b->cb = cb;
    b->ud = ud;
    fb_batch_submit(p, b);
    kick(p);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* Takes a completed apply's result; mu held. */
static int take_apply(struct fb_batch *b, fiber_buf *out)
{
    if (b->rc)
        return fb_err(b->rc, "%s", fb_batch_msg(b));
    if (out && fiber_buf_append(out, b->result.data, b->result.len) != 0)
        return FIBER_ENOMEM;
    return 0;
}

FIBER_API int fiber_pool_apply(fiber_pool *p, const char *task,
                               const void *arg, size_t len, fiber_buf *out)
{
    fiber_future *f;
    int rc = fiber_pool_apply_async(p, task, arg, len, NULL, NULL, &f);
    if (rc)
        return rc;
    rc = fiber_future_get(f, out, -1);
    fiber_future_free(f);
    return rc;
}

static int submit_map(fiber_pool *p, struct fb_batch *b, fiber_future **f)
{
    int rc = new_future(b, f);
    if (rc) {
        fb_batch_free(b);
        return rc;
    }
    fb_batch_submit(p, b);
    kick(p);
    return 0;
}

FIBER_API int fiber_pool_map_async(fiber_pool *p, const char *task,
                                   const void *in, size_t in_size, size_t n,
                                   void *out, size_t out_size,
                                   size_t chunksize, fiber_future **f)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (!f || (n && ((!in && in_size) || (!out && out_size))))
        return fb_err(FIBER_EINVAL, "map: f, in or out is NULL");
    pthread_mutex_lock(&p->mu);
    rc = can_submit(p, task);
    if (rc == 0)
        rc = check_len(p, in_size);
    struct fb_batch *b = NULL;
    if (rc == 0 && !(b = fb_batch_new(p, B_MAP, task, n)))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0) {
        b->in = in;
        b->in_size = in_size;
        b->out = out;
        b->out_size = out_size;
        b->chunksize = chunksize;
        rc = submit_map(p, b, f);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

FIBER_API int fiber_pool_map(fiber_pool *p, const char *task, const void *in,
                             size_t in_size, size_t n, void *out,
                             size_t out_size, size_t chunksize)
{
    fiber_future *f;
    int rc = fiber_pool_map_async(p, task, in, in_size, n, out, out_size,
                                  chunksize, &f);
    if (rc)
        return rc;
    rc = fiber_future_get(f, NULL, -1);
    fiber_future_free(f);
    return rc;
}

/* Checks task i's parts (parts[i] alone when first is NULL): no NULL part
 * with a length, and at most half of max_message_bytes in all.  mu held. */
static int check_parts(const struct fiber_pool *p, const fiber_iov *parts,
                       const size_t *first, size_t i)
{
    size_t from = first ? first[i] : i, to = first ? first[i + 1] : i + 1;
    if (to < from)
        return fb_err(FIBER_EINVAL, "map_gather: first[%zu] (%zu) is less "
                      "than first[%zu] (%zu)", i + 1, to, i, from);
    size_t len = 0;
    for (size_t j = from; j < to; j++) {
        if (parts[j].len && !parts[j].data)
            return first ? fb_err(FIBER_EINVAL, "input %zu: part %zu is NULL "
                                  "with a length", i, j - from)
                         : fb_err(FIBER_EINVAL, "input %zu is NULL with a "
                                  "length", i);
        if (parts[j].len > SIZE_MAX / 2 - len)
            return fb_err(FIBER_ETOOBIG, "input %zu is too large", i);
        len += parts[j].len;
    }
    return check_len(p, len);
}

/* map_bufs_async (first NULL: one part per task) and map_gather_async. */
static int submit_bufs(fiber_pool *p, const char *task,
                       const fiber_iov *parts, const size_t *first, size_t n,
                       fiber_buf *out, int *codes, size_t chunksize,
                       fiber_future **f)
{
    pthread_mutex_lock(&p->mu);
    int rc = can_submit(p, task);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = check_parts(p, parts, first, i);
    struct fb_batch *b = NULL;
    if (rc == 0 && !(b = fb_batch_new(p, B_BUFS, task, n)))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc == 0) {
        b->iov = parts;
        b->first = first;
        b->bufs = out;
        b->codes = codes;
        b->chunksize = chunksize;
        rc = submit_map(p, b, f);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

FIBER_API int fiber_pool_map_bufs_async(fiber_pool *p, const char *task,
                                        const fiber_iov *in, size_t n,
                                        fiber_buf *out, int *codes,
                                        size_t chunksize, fiber_future **f)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (!f || (n && (!in || !out)))
        return fb_err(FIBER_EINVAL, "map_bufs: f, in or out is NULL");
    return submit_bufs(p, task, in, NULL, n, out, codes, chunksize, f);
}

FIBER_API int fiber_pool_map_gather_async(fiber_pool *p, const char *task,
                                          const fiber_iov *parts,
                                          const size_t *first, size_t n,
                                          fiber_buf *out, int *codes,
                                          size_t chunksize, fiber_future **f)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (!f || !first || (n && (!out || (first[n] && !parts))))
        return fb_err(FIBER_EINVAL, "map_gather: f, first, parts or out is "
                      "NULL");
    if (first[0] != 0)
        return fb_err(FIBER_EINVAL, "map_gather: first[0] is %zu, not 0",
                      first[0]);
    return submit_bufs(p, task, parts, first, n, out, codes, chunksize, f);
}

FIBER_API int fiber_pool_map_bufs(fiber_pool *p, const char *task,
                                  const fiber_iov *in, size_t n,
                                  fiber_buf *out, int *codes, size_t chunksize)
{
    fiber_future *f = NULL;
    int rc = fiber_pool_map_bufs_async(p, task, in, n, out, codes, chunksize,
                                       &f);
    if (rc)
        return rc;
    rc = fiber_future_get(f, NULL, -1);
    fiber_future_free(f);
    return rc;
}

/* ---- futures over batches (future/future.h) ------------------------------ */

/* Waits for b; works whether or not its pool still exists. */
static int wait_batch(void *impl, int timeout_ms)
{
    struct fb_batch *b = impl;
    struct fiber_pool *p = b->pool;
    if (!p)
        return 0; /* detached batches are complete */
    pthread_mutex_lock(&p->mu);
    int rc = pool_wait(p, batch_complete, b, fb_deadline_ms(timeout_ms));
    pthread_mutex_unlock(&p->mu);
    if (rc)
        return fb_err(FIBER_ETIMEDOUT, "not ready after %d ms", timeout_ms);
    return 0;
}

static int take_batch(void *impl, fiber_buf *out)
{
    struct fb_batch *b = impl;
    if (b->kind == B_APPLY)
        return take_apply(b, out);
    if (b->rc)
        return fb_err(b->rc, "%s", fb_batch_msg(b));
    return 0;
}

/* Reads a batch field under its pool's lock, if it still has one. */
static int batch_flag(struct fb_batch *b, int which)
{
    struct fiber_pool *p = b->pool;
    if (p)
        pthread_mutex_lock(&p->mu);
    int v = which == 0 ? b->complete : b->rc == 0;
    if (p)
        pthread_mutex_unlock(&p->mu);
    return v;
}

static int batch_ready(void *impl) { return batch_flag(impl, 0); }

static int batch_succeeded(void *impl) { return batch_flag(impl, 1); }

static void batch_drop(void *impl)
{
    struct fb_batch *b = impl;
    if (b->kind == B_MAP || b->kind == B_BUFS)
        wait_batch(b, -1); /* its tasks write into the caller's memory */
    struct fiber_pool *p = b->pool;
    if (!p) {
        fb_batch_free(b);
        return;
    }
    pthread_mutex_lock(&p->mu);
    b->has_handle = 0;
    if (b->complete && !b->cb_pending)
        fb_batch_free(b);
    pthread_mutex_unlock(&p->mu);
}

static const struct fb_future_ops batch_future_ops = {
    .wait = wait_batch,
    .take = take_batch,
    .ready = batch_ready,
    .succeeded = batch_succeeded,
    .free = batch_drop,
};

/* ---- imap ------------------------------------------------------------------ */

/* A new iterator over a batch of n tasks of in_size bytes (a stream: n
 * 0) holding at most window results, not yet submitted; mu held.  0, or
 * the error (nothing made). */
static int new_imap(struct fiber_pool *p, const char *task, size_t n,
                    size_t in_size, size_t window, size_t chunksize,
                    int ordered, fiber_imap **it)
{
    int rc = can_submit(p, task);
    if (rc == 0)
        rc = check_len(p, in_size);
    struct fb_batch *b = NULL;
    fiber_imap *m = NULL;
    if (rc == 0 && (!(b = fb_batch_new(p, B_IMAP, task, n)) ||
                    !(m = malloc(sizeof *m)) ||
                    !(b->slots = calloc(window, sizeof *b->slots))))
        rc = fb_err(FIBER_ENOMEM, "out of memory");
    if (rc) {
        fb_batch_free(b);
        free(m);
        return rc;
    }
    b->window = window;
    b->chunksize = chunksize;
    b->ordered = ordered;
    b->has_handle = 1;
    m->magic = IMAP_MAGIC;
    m->b = b;
    *it = m;
    return 0;
}

FIBER_API int fiber_pool_imap(fiber_pool *p, const char *task, const void *in,
                              size_t in_size, size_t n, size_t chunksize,
                              int ordered, fiber_imap **it)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (!it || (n && in_size && !in))
        return fb_err(FIBER_EINVAL, "imap: it or in is NULL");
    pthread_mutex_lock(&p->mu);
    size_t window = n < 4096 ? (n ? n : 1) : 4096;
    rc = new_imap(p, task, n, in_size, window, chunksize, ordered, it);
    if (rc == 0) {
        struct fb_batch *b = (*it)->b;
        b->in = in;
        b->in_size = in_size;
        fb_batch_submit(p, b);
        kick(p);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

FIBER_API int fiber_pool_imap_stream(fiber_pool *p, const char *task,
                                     size_t chunksize, int ordered,
                                     size_t window, fiber_imap **it)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (!it)
        return fb_err(FIBER_EINVAL, "imap_stream: it is NULL");
    if (window > ((size_t)1 << 24))
        return fb_err(FIBER_EINVAL, "imap_stream: a window of %zu inputs is "
                      "more than 16,777,216", window);
    pthread_mutex_lock(&p->mu);
    rc = new_imap(p, task, 0, 0, window ? window : 4096, chunksize, ordered,
                  it);
    if (rc == 0) {
        (*it)->b->stream = 1;
        fb_batch_submit(p, (*it)->b); /* queued once it has an input */
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The stream behind it, or an error naming why it takes no input; with
 * its pool's mu held on success. */
static int stream_lock(fiber_imap *it, struct fb_batch **out)
{
    if (!it || it->magic != IMAP_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_imap handle");
    struct fb_batch *b = it->b;
    if (!b->stream)
        return fb_err(FIBER_EINVAL, "this iterator was not opened with "
                      "fiber_pool_imap_stream: its inputs were all given");
    struct fiber_pool *p = b->pool;
    if (!p)
        return fb_err(FIBER_ECLOSED, "the pool is gone");
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    if (p->terminated || b->cut)
        rc = fb_err(FIBER_ECLOSED, "the pool was terminated");
    else if (p->broken[0])
        rc = fb_err(FIBER_ESPAWN, "%s", p->broken);
    else if (b->ended)
        rc = fb_err(FIBER_ESTATE, "fiber_imap_end was called: the iterator "
                    "takes no more inputs");
    if (rc) {
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    *out = b;
    return 0;
}

FIBER_API int fiber_imap_put_gather(fiber_imap *it, const fiber_iov *parts,
                                    const size_t *first, size_t n,
                                    size_t *accepted)
{
    if (accepted)
        *accepted = 0;
    if (!first || (n && first[n] && !parts))
        return fb_err(FIBER_EINVAL, "imap_put: first or parts is NULL");
    if (first[0] != 0)
        return fb_err(FIBER_EINVAL, "imap_put: first[0] is %zu, not 0",
                      first[0]);
    struct fb_batch *b;
    int rc = stream_lock(it, &b);
    if (rc)
        return rc;
    struct fiber_pool *p = b->pool;
    size_t room = b->window - (b->n - b->taken), put = 0;
    if (n > 0 && room == 0)
        rc = fb_err(FIBER_EAGAIN, "the iterator holds %zu inputs whose "
                    "results were not taken (its window): take one first",
                    b->window);
    for (size_t i = 0; rc == 0 && i < n && put < room; i++) {
        rc = check_parts(p, parts, first, i);
        if (rc == 0)
            rc = fb_batch_stream_put(p, b, parts + first[i],
                                     first[i + 1] - first[i]);
        if (rc == 0)
            put++;
    }
    if (put)
        kick(p);
    pthread_mutex_unlock(&p->mu);
    if (accepted)
        *accepted = put;
    return put ? 0 : rc;
}

FIBER_API int fiber_imap_put(fiber_imap *it, const void *data, size_t len)
{
    fiber_iov one = {data, len};
    size_t first[2] = {0, 1};
    return fiber_imap_put_gather(it, &one, first, 1, NULL);
}

FIBER_API int fiber_imap_end(fiber_imap *it)
{
    struct fb_batch *b;
    int rc = stream_lock(it, &b);
    if (rc)
        return rc == FIBER_ESTATE ? 0 : rc; /* ending twice is no error */
    struct fiber_pool *p = b->pool;
    b->ended = 1;
    if (b->done == b->n)
        b->complete = 1;
    fb_pool_wake(p);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* The slot the reader takes next, if ready. */
static struct fb_imap_slot *imap_ready_slot(struct fb_batch *b)
{
    if (b->ordered) {
        struct fb_imap_slot *s = &b->slots[b->taken % b->window];
        return s->ready ? s : NULL;
    }
    for (size_t i = 0; i < b->window; i++)
        if (b->slots[i].ready)
            return &b->slots[i];
    return NULL;
}

static int imap_has_next(void *arg)
{
    struct fb_batch *b = arg;
    /* A stream with nothing outstanding answers at once (see next). */
    return b->taken == b->n || b->cut || imap_ready_slot(b) != NULL;
}

FIBER_API int fiber_imap_next(fiber_imap *it, size_t *index, fiber_buf *out,
                              int timeout_ms)
{
    if (!it || it->magic != IMAP_MAGIC)
        return fb_err(FIBER_EINVAL, "not a valid fiber_imap handle");
    struct fb_batch *b = it->b;
    struct fiber_pool *p = b->pool;
    if (!p) {
        if (b->taken < b->n)
            return fb_err(FIBER_ECLOSED, "the pool is gone");
        return fb_err(FIBER_ECLOSED, "all %zu results were taken", b->n);
    }
    pthread_mutex_lock(&p->mu);
    int rc = pool_wait(p, imap_has_next, b, fb_deadline_ms(timeout_ms));
    struct fb_imap_slot *s = rc ? NULL : imap_ready_slot(b);
    if (rc) {
        rc = fb_err(FIBER_ETIMEDOUT, "no result after %d ms", timeout_ms);
    } else if (!s && b->cut) {
        rc = fb_err(FIBER_ECLOSED,
                    "the pool was closed or terminated after %zu of %zu "
                    "results",
                    b->taken, b->n);
    } else if (!s && b->stream && !b->ended) {
        rc = fb_err(FIBER_ESTATE, "every result put so far (%zu) was "
                    "taken: put more inputs, or end the iterator", b->n);
    } else if (!s) {
        rc = fb_err(FIBER_ECLOSED, "all %zu results were taken", b->n);
    } else {
        if (index)
            *index = s->index;
        if (out)
            fiber_buf_append(out, s->data.data, s->data.len);
        rc = s->rc ? fb_err(s->rc, "task %zu of '%s' failed: %.*s", s->index,
                            b->task, (int)s->data.len, (char *)s->data.data)
                   : 0;
        s->ready = 0;
        b->taken++;
        b->ready_count--;
        kick(p); /* the window moved */
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

FIBER_API void fiber_imap_free(fiber_imap *it)
{
    if (!it || it->magic != IMAP_MAGIC)
        return;
    struct fb_batch *b = it->b;
    it->magic = 0;
    free(it);
    struct fiber_pool *p = b->pool;
    if (!p) {
        fb_batch_free(b);
        return;
    }
    pthread_mutex_lock(&p->mu);
    /* Unsent tasks are dropped; the window stops holding results.  The
     * batch leaves the queue of unsent work, which must not point at it
     * once it is freed.  A cut iterator's unsent tasks were taken off the
     * books already (cut_imap): counting them again would wrap queued. */
    if (b->next < b->n) {
        if (!b->cut) {
            p->queued -= b->n - b->next;
            fb_pool_unqueue(p, b);
        }
        b->n = b->next;
    }
    b->ordered = 0;   /* results keep landing in free slots */
    b->ended = 1;
    b->has_handle = 0;
    for (size_t i = 0; i < b->window; i++)
        b->slots[i].ready = 0;
    b->taken = b->done;
    if (b->done >= b->n) {
        b->complete = 1;
        fb_batch_free(b);
    }
    pthread_mutex_unlock(&p->mu);
}

/* ---- lifecycle ---------------------------------------------------------- */

FIBER_API int fiber_pool_close(fiber_pool *p)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    fb_pool_wake(p);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* Ends an iterator whose tasks will not all run: the results already
 * there can still be read, then fiber_imap_next fails with ECLOSED. */
static void cut_imap(struct fiber_pool *p, struct fb_batch *b)
{
    if (b->next < b->n) {
        p->queued -= b->n - b->next;
        fb_pool_unqueue(p, b);
    }
    b->cut = 1;
    b->complete = 1;
    fb_pool_wake(p);
}

static int all_done(void *arg)
{
    struct fiber_pool *p = arg;
    for (struct fb_batch *b = p->all; b; b = b->all_next)
        if (!b->complete && b->kind != B_IMAP)
            return 0;
    if (p->cb_head || p->callbacks_running)
        return 0;
    if (!p->closed)
        return 1;
    /* Closed: an iterator nobody reads cannot finish; it is cut (its
     * reader gets what came, then FIBER_ECLOSED).  Then the workers
     * leave. */
    for (struct fb_batch *b = p->all; b; b = b->all_next)
        if (b->kind == B_IMAP && !b->complete) {
            if (p->count.inflight > 0)
                return 0;
            cut_imap(p, b);
        }
    fb_pool_retire_all(p);
    p->target = 0;
    return p->n_workers == 0;
}

FIBER_API int fiber_pool_join(fiber_pool *p, int timeout_ms)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    rc = pool_wait(p, all_done, p, fb_deadline_ms(timeout_ms));
    pthread_mutex_unlock(&p->mu);
    if (rc)
        return fb_err(FIBER_ETIMEDOUT, "the pool is still busy after %d ms",
                      timeout_ms);
    return 0;
}

/* Fails every unfinished task with FIBER_ECLOSED; mu held. */
static void fail_unfinished(struct fiber_pool *p)
{
    static const char msg[] = "the pool was terminated";
    for (struct fb_batch *b = p->all; b; b = b->all_next) {
        if (b->kind == B_IMAP && !b->complete) {
            cut_imap(p, b);
            continue;
        }
        for (size_t i = 0; i < b->n && !b->complete; i++)
            if (!(b->done_bits[i / 64] & (1ull << (i % 64))))
                fb_batch_finish(p, b, i, FIBER_ECLOSED, msg, sizeof msg - 1);
    }
    p->q_head = p->q_tail = NULL;
    p->queued = 0;
    p->retry.len = p->suspect.len = 0;
}

static int no_workers(void *arg) { return ((struct fiber_pool *)arg)->n_workers == 0; }

/* No workers and no callbacks left to run (the driver runs them). */
static int quiet(void *arg)
{
    struct fiber_pool *p = arg;
    return p->n_workers == 0 && !p->cb_head && !p->callbacks_running;
}

FIBER_API int fiber_pool_terminate(fiber_pool *p)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    if (!p->terminated) {
        p->terminated = 1;
        p->closed = 1;
        p->target = 0;
        fb_pool_stop_workers(p);
        fail_unfinished(p);
        /* Callbacks run and the workers' ends are collected here, so the
         * pool is quiet when this returns. */
        int grace = fb_rt_config()->terminate_grace_ms;
        pool_wait(p, quiet, p, fb_deadline_ms(grace + 1000));
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

FIBER_API int fiber_pool_resize(fiber_pool *p, int workers)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (workers < 1)
        return fb_err(FIBER_EINVAL, "a pool needs at least one worker, not %d",
                      workers);
    pthread_mutex_lock(&p->mu);
    if (p->terminated || p->closed)
        rc = fb_err(FIBER_ECLOSED, "the pool is closed");
    else
        p->target = workers;
    if (p->max_workers > 0 && workers > p->max_workers)
        p->max_workers = workers;
    if (p->max_workers > 0 && workers < p->min_workers)
        p->min_workers = workers;
    fb_pool_wake(p);
    uint64_t one = 1;
    if (write(p->evfd, &one, sizeof one) < 0) {
        /* saturated */
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

struct ready_wait {
    struct fiber_pool *p;
    int n;
};

static int enough_ready(void *arg)
{
    struct ready_wait *r = arg;
    return r->p->count.ready >= r->n || r->p->broken[0] || r->p->terminated;
}

FIBER_API int fiber_pool_wait_ready(fiber_pool *p, int n, int timeout_ms)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (n < 0)
        return fb_err(FIBER_EINVAL, "cannot wait for %d workers", n);
    pthread_mutex_lock(&p->mu);
    struct ready_wait r = {p, n};
    rc = pool_wait(p, enough_ready, &r, fb_deadline_ms(timeout_ms));
    int ready = p->count.ready;
    if (ready >= n)
        rc = 0;
    else if (p->terminated)
        rc = fb_err(FIBER_ECLOSED, "the pool was terminated");
    else if (p->broken[0])
        rc = fb_err(FIBER_ESPAWN, "%s", p->broken);
    else
        rc = fb_err(FIBER_ETIMEDOUT, "%d of %d workers ready after %d ms",
                    ready, n, timeout_ms);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

FIBER_API int fiber_pool_map_shared(fiber_pool *p, const char *task,
                                    const void *shared, size_t shared_len,
                                    const void *in, size_t in_size, size_t n,
                                    void *out, size_t out_size,
                                    size_t chunksize)
{
    fiber_ref ref;
    int rc = fiber_object_put(shared, shared_len, &ref);
    if (rc)
        return rc;
    const fiber_ref *before = fb_objects_call_shared();
    fiber_ref saved;
    if (before)
        saved = *before;
    fiber_pool_shared(&ref);
    rc = fiber_pool_map(p, task, in, in_size, n, out, out_size, chunksize);
    fiber_pool_shared(before ? &saved : NULL);
    char msg[1024];
    if (rc)
        fb_strlcpy(msg, fiber_last_error(), sizeof msg);
    fiber_object_release(&ref);
    return rc ? fb_err(rc, "%s", msg) : 0;
}

FIBER_API int fiber_pool_stats_get(fiber_pool *p, fiber_pool_stats *st)
{
    int rc = check_pool(p);
    if (rc)
        return rc;
    if (!st)
        return fb_err(FIBER_EINVAL, "st is NULL");
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    st->workers_alive = fb_pool_alive_workers(p);
    st->workers_target = p->target;
    st->tasks_queued = p->queued + RETRIES(p);
    st->tasks_in_flight = p->count.inflight;
    st->workers_starting = p->count.starting;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int idle_now(struct fiber_pool *p)
{
    return !p->queued && !RETRIES(p) && !p->count.inflight;
}

/* With nothing left to run, workers are asked to stop (STOP) rather than
 * cut off, so they leave quietly; the rest is terminate's job. */
static void stop_idle_workers(struct fiber_pool *p)
{
    pthread_mutex_lock(&p->mu);
    if (!p->terminated && idle_now(p)) {
        p->closed = 1;
        p->target = 0;
        p->max_workers = 0;
        fb_pool_retire_all(p);
        int grace = fb_rt_config()->terminate_grace_ms;
        pool_wait(p, no_workers, p, fb_deadline_ms(grace + 500));
    }
    pthread_mutex_unlock(&p->mu);
}

FIBER_API void fiber_pool_free(fiber_pool *p)
{
    if (!p || check_pool(p))
        return;
    fb_pool_registry_remove(p);
    stop_idle_workers(p);
    fiber_pool_terminate(p);
    pthread_mutex_lock(&p->mu);
    p->bg_stop = 1;
    pthread_cond_broadcast(&p->cond);
    uint64_t one = 1;
    if (write(p->evfd, &one, sizeof one) < 0) {
        /* saturated */
    }
    pthread_mutex_unlock(&p->mu);
    if (p->bg_running)
        pthread_join(p->bg, NULL);
    pthread_mutex_lock(&p->mu);
    fb_pool_sched_fini(p);
    /* Batches with a live handle outlive the pool; the rest go now. */
    struct fb_batch *b = p->all, *next;
    for (; b; b = next) {
        next = b->all_next;
        b->all_prev = b->all_next = NULL;
        b->complete = 1;
        if (b->has_handle)
            b->pool = NULL;
        else {
            b->pool = NULL;
            fb_batch_free(b);
        }
    }
    p->all = NULL;
    p->magic = 0;
    pthread_mutex_unlock(&p->mu);
    pool_release(p);
}
