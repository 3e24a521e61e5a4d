/*
 * batch.c -- a pool's batches: a set of tasks submitted together (one
 * apply, one map, one map_bufs, one imap), what each task reads, and its
 * results recorded exactly once (a task a crashed worker had already
 * finished may come back twice: the second is dropped and counted).
 * pool.c makes and submits batches; pool_sched.c sends their tasks and
 * calls fb_batch_finish with each result.  Locking: the pool's mu, held
 * by every caller (pool_int.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "pool/pool_int.h"
#include "store/object_int.h"

size_t fb_batch_parts(const struct fb_batch *b, size_t i, fiber_iov *one,
                      const fiber_iov **parts)
{
    *parts = one;
    switch (b->kind) {
    case B_APPLY:
        one->data = b->arg;
        one->len = b->arg_len;
        break;
    case B_IMAP:
        if (b->stream) {
            const struct fb_stream_in *in = &b->ins[i & (b->ins_cap - 1)];
            one->data = in->data;
            one->len = in->len;
            break;
        }
        /* fall through */
    case B_MAP:
        one->data = b->in + i * b->in_size;
        one->len = b->in_size;
        break;
    case B_BUFS:
        if (b->first) {
            *parts = b->iov + b->first[i];
            return b->first[i + 1] - b->first[i];
        }
        *one = b->iov[i];
        break;
    }
    return 1;
}

int fb_batch_can_send(const struct fb_batch *b)
{
    if (b->kind != B_IMAP)
        return 1;
    if (b->stream) {
        /* Its window is kept by fiber_imap_put.  A reader that takes one
         * result and puts one input would make every message carry one
         * task: inputs wait until a quarter window is unsent, unless the
         * stream ended or few of its tasks are still out (then a worker
         * might go idle). */
        size_t quarter = b->window / 4;
        return b->ended || b->n - b->next >= (quarter ? quarter : 1) ||
               b->next - b->done <= quarter;
    }
    /* An imap holds at most `window` results not yet read: for ordered
     * reading, index next must fit the window after the reader's place. */
    /* Refill in batches of a quarter window, so that a reader taking one
     * result at a time does not make every message carry one task. */
    size_t room = b->ordered ? b->taken + b->window - b->next
                             : b->window - (b->next - b->taken);
    size_t want = b->window / 4;
    if (want > b->n - b->next)
        want = b->n - b->next;
    return room > 0 && room >= (want ? want : 1);
}

void fb_batch_free(struct fb_batch *b)
{
    if (!b)
        return;
    struct fiber_pool *p = b->pool;
    if (p) {
        if (b->all_prev)
            b->all_prev->all_next = b->all_next;
        else if (p->all == b)
            p->all = b->all_next;
        if (b->all_next)
            b->all_next->all_prev = b->all_prev;
    }
    if (b->slots) {
        for (size_t i = 0; i < b->window; i++)
            fiber_buf_free(&b->slots[i].data);
        free(b->slots);
    }
    for (size_t i = 0; b->ins && i < b->ins_cap; i++)
        free(b->ins[i].data);
    free(b->ins);
    fiber_buf_free(&b->result);
    if (b->has_shared)
        fb_objects_unpin_ref(&b->shared);
    free(b->msg);
    free(b->arg);
    free(b->done_bits);
    free(b);
}

struct fb_batch *fb_batch_new(struct fiber_pool *p, enum batch_kind kind,
                              const char *task, size_t n)
{
    struct fb_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->done_words = (n + 63) / 64 + 1;
    b->done_bits = calloc(b->done_words, sizeof *b->done_bits);
    if (!b->done_bits) {
        free(b);
        return NULL;
    }
    b->kind = kind;
    b->pool = p;
    b->n = n;
    b->task_len = (uint8_t)fb_strlcpy(b->task, task, sizeof b->task);
    b->err_index = SIZE_MAX;
    const fiber_ref *shared = fb_objects_call_shared();
    if (shared) {
        /* can_submit checked it is in the store; a release since is the
         * caller's race, and then tasks fail to resolve it (ENOKEY). */
        b->has_shared = fb_objects_pin_ref(shared) == 0;
        b->shared = *shared;
    }
    return b;
}

/* Puts b at the end of the pool's queue of batches with unsent tasks. */
static void enqueue(struct fiber_pool *p, struct fb_batch *b)
{
    if (p->q_tail)
        p->q_tail->q_next = b;
    else
        p->q_head = b;
    p->q_tail = b;
}

void fb_batch_submit(struct fiber_pool *p, struct fb_batch *b)
{
    b->all_next = p->all;
    if (p->all)
        p->all->all_prev = b;
    p->all = b;
    if (b->n == 0) {
        /* A stream joins the queue with its first input (it is on the
         * queue exactly while it has unsent inputs). */
        b->complete = !b->stream;
        return;
    }
    enqueue(p, b);
    p->queued += b->n;
    p->st.tasks_submitted += b->n;
}

/* Moves the stream's inputs into a ring twice as large. */
static int grow_ins(struct fb_batch *b)
{
    size_t cap = b->ins_cap ? 2 * b->ins_cap : 64;
    struct fb_stream_in *ins = calloc(cap, sizeof *ins);
    if (!ins)
        return FIBER_ENOMEM;
    for (size_t i = b->ins_base; i < b->n; i++)
        ins[i & (cap - 1)] = b->ins[i & (b->ins_cap - 1)];
    free(b->ins);
    b->ins = ins;
    b->ins_cap = cap;
    return 0;
}

int fb_batch_stream_put(struct fiber_pool *p, struct fb_batch *b,
                        const fiber_iov *parts, size_t k)
{
    if (b->n - b->ins_base == b->ins_cap && grow_ins(b) != 0)
        return fb_err(FIBER_ENOMEM, "out of memory");
    if (b->n / 64 + 1 >= b->done_words) {
        size_t words = 2 * b->done_words;
        uint64_t *bits = realloc(b->done_bits, words * sizeof *bits);
        if (!bits)
            return fb_err(FIBER_ENOMEM, "out of memory");
        memset(bits + b->done_words, 0,
               (words - b->done_words) * sizeof *bits);
        b->done_bits = bits;
        b->done_words = words;
    }
    size_t len = 0;
    for (size_t i = 0; i < k; i++)
        len += parts[i].len;
    unsigned char *data = NULL;
    if (len && !(data = malloc(len)))
        return fb_err(FIBER_ENOMEM, "out of memory");
    for (size_t i = 0, at = 0; i < k; at += parts[i].len, i++)
        if (parts[i].len)
            memcpy(data + at, parts[i].data, parts[i].len);
    struct fb_stream_in *in = &b->ins[b->n & (b->ins_cap - 1)];
    in->data = data;
    in->len = len;
    if (b->next == b->n)
        enqueue(p, b); /* it had nothing unsent: it was off the queue */
    b->n++;
    p->queued++;
    p->st.tasks_submitted++;
    return 0;
}

/* A streamed input whose result is in: its copy goes, and the ring's
 * base moves past the inputs done. */
static void stream_drop(struct fb_batch *b, size_t index)
{
    struct fb_stream_in *in = &b->ins[index & (b->ins_cap - 1)];
    free(in->data);
    in->data = NULL;
    in->len = 0;
    while (b->ins_base < b->n &&
           (b->done_bits[b->ins_base / 64] & (1ull << (b->ins_base % 64))))
        b->ins_base++;
}

const char *fb_batch_msg(const struct fb_batch *b)
{
    return b->msg ? b->msg : "";
}

/* Sets the batch's failure message.  Messages are only allocated for
 * failures, which keeps a queued task small. */
static void set_msg(struct fb_batch *b, const char *fmt, ...) FIBER_PRINTF(2, 3);
static void set_msg(struct fb_batch *b, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    free(b->msg);
    b->msg = strdup(text);
}

/* Records the lowest-index failure of a batch. */
static void note_failure(struct fb_batch *b, size_t index, int code,
                         const void *data, size_t len)
{
    if (index >= b->err_index)
        return;
    b->err_index = index;
    b->rc = code;
    if (b->kind == B_APPLY)
        set_msg(b, "%.*s", (int)len, (const char *)data);
    else
        set_msg(b, "task %zu of '%s' failed: %.*s", index, b->task, (int)len,
                (const char *)data);
}

static void store_imap(struct fb_batch *b, size_t index, int code,
                       const void *data, size_t len)
{
    struct fb_imap_slot *s;
    if (b->ordered) {
        s = &b->slots[index % b->window];
    } else {
        s = NULL;
        for (size_t i = 0; i < b->window && !s; i++)
            if (!b->slots[i].ready)
                s = &b->slots[i];
    }
    s->ready = 1;
    s->rc = code;
    s->index = index;
    s->data.len = 0;
    fiber_buf_append(&s->data, data, len);
    b->ready_count++;
}

static void store_result(struct fb_batch *b, size_t index, int code,
                         const void *data, size_t len)
{
    switch (b->kind) {
    case B_APPLY:
        b->rc = code;
        if (code)
            set_msg(b, "%.*s", (int)len, (const char *)data);
        else
            fiber_buf_append(&b->result, data, len);
        break;
    case B_MAP:
        if (code == 0 && len != b->out_size) {
            char why[128];
            int n = snprintf(why, sizeof why,
                             "returned %zu bytes; the map expects %zu", len,
                             b->out_size);
            note_failure(b, index, FIBER_ETASK, why, (size_t)n);
        } else if (code == 0) {
            memcpy(b->out + index * b->out_size, data, len);
        } else {
            note_failure(b, index, code, data, len);
        }
        break;
    case B_BUFS:
        b->bufs[index].len = 0;
        fiber_buf_append(&b->bufs[index], data, len);
        if (b->codes)
            b->codes[index] = code;
        if (code)
            note_failure(b, index, code, data, len);
        break;
    case B_IMAP:
        store_imap(b, index, code, data, len);
        break;
    }
}

void fb_batch_finish(struct fiber_pool *p, struct fb_batch *b, size_t index,
                     int code, const void *data, size_t len)
{
    uint64_t bit = 1ull << (index % 64);
    if (b->done_bits[index / 64] & bit) {
        p->st.duplicates_dropped++;
        return;
    }
    b->done_bits[index / 64] |= bit;
    b->done++;
    p->st.tasks_done++;
    if (code)
        p->st.tasks_failed++;
    if (code && len == 0) {
        data = "the task failed without a message";
        len = strlen(data);
    }
    store_result(b, index, code, data, len);
    if (b->stream)
        stream_drop(b, index);
    if (b->done == b->n && (!b->stream || b->ended)) {
        b->complete = 1;
        if (b->cb || !b->has_handle) {
            b->cb_pending = 1;
            if (p->cb_tail)
                p->cb_tail->cb_next = b;
            else
                p->cb_head = b;
            p->cb_tail = b;
        }
    }
    fb_pool_wake(p);
}
