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
    case B_MAP:
    case B_IMAP:
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
    b->done_bits = calloc((n + 63) / 64 + 1, sizeof *b->done_bits);
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

void fb_batch_submit(struct fiber_pool *p, struct fb_batch *b)
{
    b->all_next = p->all;
    if (p->all)
        p->all->all_prev = b;
    p->all = b;
    if (b->n == 0) {
        b->complete = 1;
        return;
    }
    if (p->q_tail)
        p->q_tail->q_next = b;
    else
        p->q_head = b;
    p->q_tail = b;
    p->queued += b->n;
    p->st.tasks_submitted += b->n;
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
    if (b->done == b->n) {
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
