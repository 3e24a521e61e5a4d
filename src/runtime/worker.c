/*
 * worker.c -- a pool worker: the child role after POOL.
 *
 * The loop takes TASK chunks in order, runs each item, and sends RESULT
 * frames.  Results are batched: they go out when no more tasks are
 * buffered (so a stream of tiny tasks costs few system calls), after a
 * chunk that took more than FLUSH_NS, or every PARTIAL_NS while a long
 * chunk runs (so the master sees progress and a crash loses little; the
 * master sends chunks of many long tasks only to pools so large that a
 * message per task would be its bottleneck).  Waiting for work, it spins for spin_us (the master
 * allows it only when workers do not outnumber cores) before it blocks.
 *
 * When a task dies of a fatal signal (or calls exit()), a handler sends
 * the results finished so far and a FAULT frame naming the task that was
 * running, so that the master charges the crash to exactly that task.
 * It uses only write(), poll() and memory it already owns
 * (fb_conn_write_now, which encrypts in place on an encrypted conn).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/log.h"
#include "base/spin.h"
#include "runtime/child.h"
#include "runtime/hooks.h"
#include "runtime/runtime.h"
#include "runtime/task.h"

#define FLUSH_NS 2000000u
#define PARTIAL_NS 1000000000u /* a running chunk reports every second */
#define DRAIN_MS 30000 /* as the drain at a child's exit (child.c) */
#define FB_EXIT_INIT 126 /* the initializer failed */

struct worker {
    struct fb_child *ch;
    uint32_t spin_us;
    struct fb_spin spin;
    uint32_t max_result;
    fiber_buf arg;    /* aligned copy of the current argument */
    fiber_buf result; /* the current task's output */
    fiber_buf stage;  /* RESULT frames not yet handed to conn.out */
    uint64_t last_send_ns;
    char task_cache[FB_WIRE_NAME_MAX + 1];
    fiber_task_fn fn_cache;
    /* What the fault handler needs: the task running now. */
    volatile sig_atomic_t running;
    uint64_t chunk_id;
    uint32_t item;     /* its place in the chunk */
    size_t mark;       /* the RESULT frame being built in stage */
    uint32_t in_frame; /* items in that frame */
};

static struct worker *fault_worker;

static void report_fault(int sig)
{
    struct worker *w = fault_worker;
    if (!w || !w->running)
        return;
    w->running = 0;
    struct fb_conn *c = &w->ch->conn;
    if (fb_conn_partly_sent(c))
        return; /* a frame is half sent: adding one would garble both */
    if (w->in_frame > 0)
        fb_wire_result_end(&w->stage, w->mark, w->in_frame, 0);
    else
        w->stage.len = w->mark; /* drop the empty frame */
    fb_conn_write_now(c, w->stage.data, w->stage.len);
    uint8_t f[FB_WIRE_FAULT_LEN];
    fb_wire_fault_encode(f, w->chunk_id, sig, w->item);
    fb_conn_write_now(c, f, sizeof f);
}

static void on_fatal_signal(int sig)
{
    report_fault(sig);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_exit_during_task(int status, void *arg)
{
    FB_UNUSED(status);
    FB_UNUSED(arg);
    report_fault(0);
}

static void install_fault_handlers(struct worker *w)
{
    static char altstack[65536]; /* so a stack overflow is reported too */
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
    sigaltstack(&ss, NULL);
    struct sigaction sa = {.sa_handler = on_fatal_signal,
                           .sa_flags = SA_ONSTACK | SA_RESETHAND};
    sigemptyset(&sa.sa_mask);
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT,
                               SIGSYS, SIGTRAP};
    for (size_t i = 0; i < FB_ARRAY_LEN(sigs); i++)
        sigaction(sigs[i], &sa, NULL);
    fault_worker = w;
    on_exit(on_exit_during_task, NULL);
}

/* Hands staged frames to the connection and writes what it can.  First
 * the tasks' own output is drained (the pipelined queue puts answered,
 * the pipes' sends written: the api's drain hook), so that a result the
 * master sees comes after everything its task sent: a pool terminated
 * once its map returns loses none of the tasks' puts. */
static FB_HOT void send_staged(struct worker *w, int wait)
{
    struct fb_child *ch = w->ch;
    fb_rt_api()->drain(fb_deadline_ms(DRAIN_MS));
    pthread_mutex_lock(&ch->write_mu);
    int rc = fiber_buf_append(fb_conn_out(&ch->conn), w->stage.data,
                              w->stage.len);
    if (rc == 0)
        rc = wait ? fb_conn_flush_wait(&ch->conn, UINT64_MAX)
                  : fb_conn_flush(&ch->conn);
    pthread_mutex_unlock(&ch->write_mu);
    if (rc < 0)
        fb_child_die(FB_EXIT_MASTER_LOST, "cannot send results: %s",
                     fb_conn_err(&ch->conn));
    w->stage.len = 0;
    w->last_send_ns = fb_now_ns();
}

/* Pending output that could not be written at once. */
static int output_pending(struct worker *w)
{
    pthread_mutex_lock(&w->ch->write_mu);
    int pending = fb_conn_unsent(&w->ch->conn) > 0;
    pthread_mutex_unlock(&w->ch->write_mu);
    return pending;
}

static FB_HOT fiber_task_fn find_task(struct worker *w, const char *name,
                               uint8_t len)
{
    if (w->fn_cache && strlen(w->task_cache) == len &&
        memcmp(w->task_cache, name, len) == 0)
        return w->fn_cache;
    char task[FB_WIRE_NAME_MAX + 1];
    memcpy(task, name, len);
    task[len] = '\0';
    fiber_task_fn fn = NULL;
    if (fiber_task_lookup(task, &fn) != 0)
        return NULL;
    memcpy(w->task_cache, task, (size_t)len + 1);
    w->fn_cache = fn;
    return fn;
}

/* Runs one item and appends its result to the frame being built. */
static FB_HOT void run_item(struct worker *w, fiber_task_fn fn, const char *task,
                     const void *arg, uint32_t len)
{
    w->arg.len = 0;
    if (fiber_buf_append(&w->arg, arg, len) != 0)
        fb_child_die(FB_EXIT_BOOT, "out of memory for an argument");
    w->result.len = 0;
    fb_task_failure_clear();
    int rc;
    if (fn) {
        w->running = 1;
        fb_task_enter();
        rc = fn(w->arg.data, len, &w->result);
        if (fb_task_leave())
            fb_rt_api()->task_end(); /* what it resolved may be evicted */
        w->running = 0;
    } else {
        rc = fiber_task_fail("task '%s' is not registered in this worker",
                             task);
    }
    char msg[FB_WIRE_TEXT_MAX + 1];
    const void *data = w->result.data;
    size_t n = w->result.len;
    if (rc == 0 && n > w->max_result) {
        rc = FIBER_ETOOBIG;
        snprintf(msg, sizeof msg,
                 "result of %zu bytes exceeds what a message may carry (%u)",
                 n, w->max_result);
    } else if (rc != 0) {
        const char *why = fb_task_failure();
        if (why[0])
            snprintf(msg, sizeof msg, "%s", why);
        else
            snprintf(msg, sizeof msg, "task '%s' returned %d", task, rc);
    }
    if (rc != 0) {
        data = msg;
        n = strlen(msg);
    }
    if (fb_wire_result_add(&w->stage, rc, data, (uint32_t)n) != 0)
        fb_child_die(FB_EXIT_BOOT, "cannot encode a result: %s",
                     fiber_last_error());
}

static FB_HOT void run_chunk(struct worker *w, const struct fb_wire_hdr *h,
                      const uint8_t *payload)
{
    struct fb_msg_task m;
    fb_wire_get_task(payload, h->len, h->code, &m, NULL, 0);
    char task[FB_WIRE_NAME_MAX + 1];
    memcpy(task, m.task, m.task_len);
    task[m.task_len] = '\0';
    fiber_task_fn fn = find_task(w, m.task, m.task_len);
    const uint8_t *cur = m.items;
    uint32_t offset = 0;
    uint64_t t0 = fb_now_ns();
    w->chunk_id = h->id;
    w->in_frame = 0;
    fb_wire_result_begin(&w->stage, h->id, 0, &w->mark);
    for (uint32_t k = 0; k < m.count; k++) {
        const void *arg;
        uint32_t len;
        fb_wire_task_next(&cur, &arg, &len);
        w->item = k;
        run_item(w, fn, task, arg, len);
        w->in_frame++;
        /* A long chunk reports what is done so far; so does one whose
         * results would outgrow a message.  The clock is read after items
         * 1, 2, 4, 8, ... and then every 64th, not after each: a chunk's
         * items are alike, so a partial report is late by at most about
         * as long again, and a long task's end is not one more cold page
         * (the clock's) each time. */
        uint32_t done = k + 1;
        if (done == m.count)
            break;
        int big = w->stage.len - w->mark > w->max_result;
        if (!big && (done & (done - 1)) != 0 && done % 64 != 0)
            continue;
        uint64_t now = fb_now_ns();
        if (big || now - w->last_send_ns > PARTIAL_NS) {
            fb_wire_result_end(&w->stage, w->mark, w->in_frame, now - t0);
            send_staged(w, 0);
            offset += w->in_frame;
            w->in_frame = 0;
            t0 = now;
            fb_wire_result_begin(&w->stage, h->id, offset, &w->mark);
        }
    }
    fb_wire_result_end(&w->stage, w->mark, w->in_frame, fb_now_ns() - t0);
}

/* Returns 0, or FIBER_ETASK (message set) after sending EXIT: the
 * initializer failed or does not exist. */
static int run_initializer(struct worker *w, const uint8_t *payload,
                           size_t len, struct fb_msg_pool *m)
{
    fb_wire_get_pool(payload, len, m, NULL, 0);
    w->spin_us = m->spin_us;
    fb_spin_init(&w->spin, m->spin_us);
    if (m->init_task_len == 0)
        return 0;
    char task[FB_WIRE_NAME_MAX + 1];
    memcpy(task, m->init_task, m->init_task_len);
    task[m->init_task_len] = '\0';
    fiber_task_fn fn;
    char msg[FB_WIRE_TEXT_MAX + 1];
    int rc = fiber_task_lookup(task, &fn);
    if (rc == 0) {
        fiber_buf arg = {0}, out = {0};
        fiber_buf_append(&arg, m->init_arg, m->init_arg_len);
        fb_task_failure_clear();
        rc = fn(arg.data, m->init_arg_len, &out);
        fiber_buf_free(&arg);
        fiber_buf_free(&out);
        snprintf(msg, sizeof msg, "initializer '%s' failed: %s", task,
                 fb_task_failure()[0] ? fb_task_failure() : "nonzero return");
    } else {
        snprintf(msg, sizeof msg, "%s", fiber_last_error());
    }
    if (rc == 0)
        return 0;
    fb_wire_put_exit(&w->stage, rc, msg, strlen(msg));
    send_staged(w, 1);
    return fb_err(FIBER_ETASK, "%s", msg);
}

/* Waits for more input: spins for spin_us, then blocks. */
static FB_HOT void wait_input(struct worker *w)
{
    struct fb_conn *c = &w->ch->conn;
    size_t before = fb_conn_buffered(c);
    unsigned spin_us = w->spin_us ? fb_spin_budget(&w->spin) : 0;
    if (spin_us) {
        uint64_t until = fb_now_ns() + (uint64_t)spin_us * 1000u;
        do {
            if (fb_conn_read(c) != 0)
                fb_child_die(FB_EXIT_MASTER_LOST, "master gone: %s",
                             fb_conn_err(c));
            if (fb_conn_buffered(c) != before) {
                fb_spin_result(&w->spin, 1);
                return;
            }
        } while (fb_now_ns() < until);
        fb_spin_result(&w->spin, 0);
    } else {
        /* With credit the next task is often in the socket already: one
         * read finds it without a poll first. */
        if (fb_conn_read(c) != 0)
            fb_child_die(FB_EXIT_MASTER_LOST, "master gone: %s",
                         fb_conn_err(c));
        if (fb_conn_buffered(c) != before)
            return;
    }
    for (;;) {
        short events = POLLIN;
        if (output_pending(w))
            events |= POLLOUT;
        struct pollfd p = {.fd = fb_conn_fd(c), .events = events};
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            fb_child_die(FB_EXIT_MASTER_LOST, "poll: %s", strerror(errno));
        if (p.revents & POLLOUT)
            send_staged(w, 0);
        if (p.revents & (POLLIN | POLLHUP | POLLERR))
            break;
    }
    if (fb_conn_read(c) != 0)
        fb_child_die(FB_EXIT_MASTER_LOST, "master gone: %s", fb_conn_err(c));
}

/* POOL (h, payload): runs the initializer and says READY.  Returns 0, or
 * FIBER_ETASK after sending EXIT. */
static int worker_start(struct worker *w, struct fb_child *ch,
                        const struct fb_wire_hdr *h, const uint8_t *payload)
{
    w->ch = ch;
    w->max_result = ch->cfg->max_message_bytes / 2;
    struct fb_msg_pool m;
    int rc = run_initializer(w, payload, h->len, &m);
    if (rc)
        return rc;
    fb_wire_put_empty(&w->stage, FB_MSG_READY, 0);
    send_staged(w, 1);
    return 0;
}

/* Acts on one frame from the master.  Returns 0 to go on, 1 after STOP
 * (every result sent), or FIBER_EPROTO for a frame a worker does not
 * take. */
static FB_HOT int on_frame(struct worker *w, const struct fb_wire_hdr *h,
                    const uint8_t *p)
{
    switch (h->type) {
    case FB_MSG_TASK:
        run_chunk(w, h, p);
        /* Results of a slow chunk go out now rather than after the next
         * one; fast chunks stay batched. */
        if (fb_now_ns() - w->last_send_ns > FLUSH_NS ||
            w->stage.len > w->max_result)
            send_staged(w, 0);
        return 0;
    case FB_MSG_STOP:
        send_staged(w, 1);
        return 1;
    case FB_MSG_PING:
        fb_wire_put_pong(&w->stage, h->id);
        return 0;
    case FB_MSG_OBJ_CALL: {
        const uint8_t *ref;
        fb_wire_get_obj_call(p, h->len, &ref, NULL, 0);
        fb_rt_api()->task_shared(ref);
        return 0;
    }
    }
    return fb_err(FIBER_EPROTO, "unexpected %s from the master",
                  fb_msg_type_name(h->type));
}

/* Nothing more is buffered: the results go out before the loop waits. */
static FB_HOT void worker_idle(struct worker *w)
{
    if (w->stage.len)
        send_staged(w, 0);
}

FB_HOT void fb_worker_main(struct fb_child *ch, const struct fb_wire_hdr *h,
                    const uint8_t *payload)
{
    struct worker w = {0};
    if (worker_start(&w, ch, h, payload) != 0)
        fb_child_die(FB_EXIT_INIT, "%s", fiber_last_error());
    install_fault_handlers(&w);
    fb_log_debug("pool worker ready (spin %u us)", w.spin_us);
    for (;;) {
        struct fb_wire_hdr hdr;
        const uint8_t *p;
        int rc = fb_conn_next(&ch->conn, &hdr, &p);
        if (rc < 0)
            fb_child_die(FB_EXIT_PROTO, "bad frame from the master: %s",
                         fb_conn_err(&ch->conn));
        if (rc == 0) {
            worker_idle(&w);
            wait_input(&w);
            continue;
        }
        rc = on_frame(&w, &hdr, p);
        if (rc == 1) {
            fb_log_debug("pool worker stopping as asked");
            exit(0);
        }
        if (rc < 0)
            fb_child_die(FB_EXIT_PROTO, "%s", fiber_last_error());
    }
}

/* ---- the loop's parts, for the fuzz targets ---------------------------- */

struct fb_wloop {
    struct worker w;
};

int fb_wloop_start(struct fb_child *ch, const struct fb_wire_hdr *h,
                   const uint8_t *payload, struct fb_wloop **out)
{
    struct fb_wloop *l = calloc(1, sizeof *l);
    if (!l)
        return fb_err(FIBER_ENOMEM, "out of memory");
    int rc = worker_start(&l->w, ch, h, payload);
    if (rc) {
        fb_wloop_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int fb_wloop_frame(struct fb_wloop *l, const struct fb_wire_hdr *h,
                   const uint8_t *payload)
{
    return on_frame(&l->w, h, payload);
}

void fb_wloop_idle(struct fb_wloop *l) { worker_idle(&l->w); }

void fb_wloop_free(struct fb_wloop *l)
{
    if (!l)
        return;
    fiber_buf_free(&l->w.arg);
    fiber_buf_free(&l->w.result);
    fiber_buf_free(&l->w.stage);
    free(l);
}
