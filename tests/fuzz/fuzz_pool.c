/*
 * fuzz_pool.c -- libFuzzer target for the master side of a pool: what
 * src/pool/pool_sched.c and pool.c do with the messages of their workers
 * (READY, RESULT, FAULT, HEARTBEAT, EXIT, PING, and anything else), with
 * the workers' connections and ends as the runtime reports them, and
 * with the API calls that submit tasks and take results.
 *
 * The pool is real (struct fiber_pool from pool_int.h, set up as
 * fiber_pool_create does) but its workers are fake: each is a job record
 * the script owns (no backend job behind it) whose connection is a socket
 * pair.  The script connects a worker through the pool's owner callbacks
 * (fb_pool_worker_ops.connected), plays the worker on the other end, and
 * reports the job's end (fb_pool_worker_ops.ended), just as the service
 * thread would.  The pool never launches a worker itself (`creating` stays
 * set).  The test drives the pool with fb_pool_progress, one round at a
 * time.  Commands:
 *
 *   APPLY, MAP, IMAP   submit tasks (apply_async with a future, a callback
 *                      or neither; map_async; imap, ordered or not)
 *   SEND               a worker sends READY, the results of the chunk it
 *                      holds first (each ok or failed, of the right size
 *                      or not), a FAULT naming its running task, a
 *                      HEARTBEAT, EXIT, PING, results that match nothing,
 *                      or any frame or bytes
 *   CONNECT, END, HANGUP   a worker's job connects; ends; its socket closes
 *   FUTURE, NEXT       poll or take a future's result (no waiting), free it;
 *                      take an iterator's next result, free it
 *   POOL               close, join(0), resize, stats, terminate
 *
 * Invariants checked after every command (abort() on a violation):
 *   - the pool's books balance: a worker's in-flight count is what its
 *     chunks still hold; the queued count is what the queued batches have
 *     not sent; a batch's done count is the number of its completion bits;
 *     a complete map or apply has every task done; a task completes once;
 *   - results are the ones the workers sent for that task: an apply's
 *     bytes, a map's records; failures carry a FIBER_E* code;
 *   - a callback runs exactly once;
 *   - what the pool sends a worker decodes: POOL first, then TASK chunks
 *     of tasks that were submitted, STOP, PONG;
 *   - no crash, no sanitizer report, no leak after fiber_pool_free.
 */
#define FZ_NAME "fuzz_pool"
#include "fuzz_util.h"

#include "base/common.h"
#include "pool/pool_int.h"
#include "runtime/runtime.h"

#define MAX_WORKERS 4
#define MAX_SUBS 16
#define MAX_CHUNKS 64
#define MAX_N 48

FIBER_TASK(fz_task) { return fiber_buf_append(out, arg, len); }

/* ---- what the script knows ---------------------------------------------- */

enum sub_kind { S_APPLY, S_APPLY_CB, S_APPLY_BARE, S_MAP, S_IMAP };

struct sub {
    enum sub_kind kind;
    size_t n, in_size, out_size;
    uint8_t *in, *out;
    fiber_future *f;
    fiber_imap *it;
    int cb_calls;
    int cb_rc;
};

/* A chunk a worker was sent, as read from its socket. */
struct hchunk {
    uint64_t id;
    uint32_t count, done;
    uint32_t sub[MAX_N], idx[MAX_N]; /* what each item is; UINT32_MAX: ? */
};

struct hworker {
    struct fb_worker *w; /* NULL once its end was reported */
    struct fb_jobrec *j;
    struct fb_conn conn; /* the worker's end */
    int connected, got_pool, closed;
    struct hchunk chunks[MAX_CHUNKS];
    int n_chunks;
};

struct state {
    struct fiber_pool *p;
    struct hworker hw[MAX_WORKERS];
    int n_hw;
    struct sub subs[MAX_SUBS];
    int n_subs;
    int poked; /* something to read: the next round may wait for it */
    int terminated;
};

static struct state *cur; /* for callbacks */

static void on_done(void *ud, int rc, const void *data, size_t len)
{
    struct sub *s = ud;
    FB_UNUSED(data);
    FB_UNUSED(len);
    s->cb_calls++;
    s->cb_rc = rc;
}

/* What a worker answers for item idx of submission s (echo-like, so that
 * the expected result is known): the argument itself for an apply, a
 * record of out_size bytes for a map. */
static void expected(const struct sub *s, uint32_t idx, fiber_buf *b)
{
    if (s->kind <= S_APPLY_BARE) {
        fz_w_bytes(b, s->in, s->in_size);
        return;
    }
    for (size_t k = 0; k < s->out_size; k++)
        fz_w_u8(b, (unsigned)(idx * 7 + k * 13 + (size_t)(s - cur->subs)));
}

/* Whether out is what a worker sent for item idx of s: the expected
 * bytes, or (SEND's "wrong size") all of them but the last. */
static int is_result(const struct sub *s, uint32_t idx, const fiber_buf *out)
{
    fiber_buf want = {0};
    expected(s, idx, &want);
    int ok = (out->len == want.len ||
              (want.len > 0 && out->len == want.len - 1)) &&
             (out->len == 0 || !memcmp(out->data, want.data, out->len));
    fiber_buf_free(&want);
    return ok;
}

/* ---- the pool's books ----------------------------------------------------- */

static size_t popcount_bits(const uint64_t *bits, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += (bits[i / 64] >> (i % 64)) & 1;
    return c;
}

/* The sets and totals the scheduler keeps as workers change agree with
 * the workers themselves. */
static void check_sets(struct fiber_pool *p)
{
    struct fb_wcount sum = {0};
    for (int i = 0; i < p->n_workers; i++) {
        struct fb_worker *w = p->workers[i];
        FZ_REQUIRE(w->index == i, "worker %d thinks it is %d", i, w->index);
        sum.alive += w->state != W_GONE;
        sum.live += w->state != W_GONE && !w->retire;
        sum.ready += w->state == W_READY;
        sum.inflight += w->inflight;
        /* (A worker below a credit that has just grown joins the hungry
         * set at its next result; an idle one is always on the idle set.) */
        int idle = w->state == W_READY && !w->retire && w->has_conn &&
                   !(w->head && w->head->isolated) && w->inflight == 0;
        FZ_REQUIRE(!idle || w->link[WL_FEED].on == &p->idle,
                   "an idle worker is not on the idle set");
        FZ_REQUIRE(!w->has_conn || w->link[WL_HEARD].on == &p->heard,
                   "a connected worker is not on the heard set");
    }
    FZ_REQUIRE(sum.alive == p->count.alive && sum.live == p->count.live &&
                   sum.ready == p->count.ready &&
                   sum.inflight == p->count.inflight,
               "pool totals drifted: alive %d/%d live %d/%d ready %d/%d "
               "inflight %llu/%llu", sum.alive, p->count.alive, sum.live,
               p->count.live, sum.ready, p->count.ready,
               (unsigned long long)sum.inflight,
               (unsigned long long)p->count.inflight);
    size_t on = p->idle.len + p->hungry.len, seen = 0;
    for (struct fb_worker *w = p->idle.head; w; w = w->link[WL_FEED].next)
        seen++;
    for (struct fb_worker *w = p->hungry.head; w; w = w->link[WL_FEED].next)
        seen++;
    FZ_REQUIRE(on == seen, "feed sets count %zu, hold %zu", on, seen);
}

static void check_books(struct state *st)
{
    struct fiber_pool *p = st->p;
    pthread_mutex_lock(&p->mu);
    check_sets(p);
    for (int i = 0; i < p->n_workers; i++) {
        struct fb_worker *w = p->workers[i];
        uint64_t held = 0;
        struct fb_chunk *last = NULL;
        for (struct fb_chunk *c = w->head; c; c = c->next) {
            FZ_REQUIRE(c->done <= c->count, "a chunk has %u of %u done",
                       c->done, c->count);
            held += c->count - c->done;
            last = c;
        }
        FZ_REQUIRE(w->tail == last, "a worker's chunk list lost its tail");
        FZ_REQUIRE(held == w->inflight,
                   "worker holds %llu tasks, counts %u in flight",
                   (unsigned long long)held, w->inflight);
        FZ_REQUIRE(w->state >= W_STARTING && w->state <= W_GONE,
                   "worker state %d", w->state);
        FZ_REQUIRE(w->state != W_GONE || !w->has_conn,
                   "a gone worker keeps its connection");
    }
    size_t queued = 0;
    for (struct fb_batch *b = p->q_head; b; b = b->q_next)
        queued += b->n - b->next;
    FZ_REQUIRE(queued == p->queued, "queued %zu, books say %zu", queued,
               p->queued);
    for (struct fb_batch *b = p->all; b; b = b->all_next) {
        FZ_REQUIRE(b->done <= b->n && b->next <= b->n,
                   "batch: done %zu next %zu of %zu", b->done, b->next, b->n);
        FZ_REQUIRE(popcount_bits(b->done_bits, b->n) == b->done,
                   "batch: %zu done, %zu completion bits", b->done,
                   popcount_bits(b->done_bits, b->n));
        if (b->kind != B_IMAP)
            FZ_REQUIRE(!b->complete || b->done == b->n,
                       "a complete batch has %zu of %zu done", b->done, b->n);
    }
    FZ_REQUIRE(p->st.tasks_done <= p->st.tasks_submitted,
               "%llu tasks done of %llu submitted",
               (unsigned long long)p->st.tasks_done,
               (unsigned long long)p->st.tasks_submitted);
    pthread_mutex_unlock(&p->mu);
    for (int k = 0; k < st->n_subs; k++)
        FZ_REQUIRE(st->subs[k].cb_calls <= 1, "a callback ran %d times",
                   st->subs[k].cb_calls);
}

/* ---- driving the pool ------------------------------------------------------ */

static int second_call(void *arg) { return (*(int *)arg)++ >= 1; }

/* One round of the progress loop; when something was sent to the pool,
 * it waits (at most 2 ms) for the sockets to say so. */
static void step(struct state *st)
{
    struct fiber_pool *p = st->p;
    int calls = 0;
    pthread_mutex_lock(&p->mu);
    if (!p->driving) {
        p->driving = 1;
        fb_pool_progress(p, second_call, &calls,
                         st->poked ? fb_deadline_ms(2) : fb_now_ms());
        p->driving = 0;
    }
    pthread_mutex_unlock(&p->mu);
    st->poked = 0;
}

/* Reads what the pool sent worker h. */
static void read_worker(struct state *st, struct hworker *h)
{
    if (!h->connected || h->closed)
        return;
    for (;;) {
        size_t had = fb_conn_buffered(&h->conn);
        int rc = fb_conn_read(&h->conn);
        int read_some = fb_conn_buffered(&h->conn) != had;
        struct fb_wire_hdr hd;
        const uint8_t *p;
        int got;
        while ((got = fb_conn_next(&h->conn, &hd, &p)) == 1) {
            if (!h->got_pool && hd.type == FB_MSG_WELCOME)
                continue; /* queued by the service thread, in a real run */
            if (!h->got_pool) {
                FZ_REQUIRE(hd.type == FB_MSG_POOL,
                           "a worker's first message is %s, not POOL",
                           fb_msg_type_name(hd.type));
                h->got_pool = 1;
                continue;
            }
            if (hd.type == FB_MSG_STOP)
                continue;
            if (hd.type == FB_MSG_PONG) /* (PINGs may hide in FRAMEs) */
                continue;
            FZ_REQUIRE(hd.type == FB_MSG_TASK, "the pool sent a worker %s",
                       fb_msg_type_name(hd.type));
            struct fb_msg_task m;
            fb_wire_get_task(p, hd.len, hd.code, &m, NULL, 0);
            FZ_REQUIRE(m.task_len == 7 && !memcmp(m.task, "fz_task", 7),
                       "a chunk of an unknown task");
            if (h->n_chunks == MAX_CHUNKS)
                continue; /* not tracked: results for it come from SEND */
            struct hchunk *c = &h->chunks[h->n_chunks++];
            memset(c, 0, sizeof *c);
            c->id = hd.id;
            c->count = m.count;
            const uint8_t *cur_item = m.items;
            for (uint32_t k = 0; k < m.count; k++) {
                const void *arg;
                uint32_t len;
                fb_wire_task_next(&cur_item, &arg, &len);
                uint32_t tag[2] = {UINT32_MAX, UINT32_MAX};
                memcpy(tag, arg, len < 8 ? len : 8);
                FZ_REQUIRE(len >= 4 && tag[0] < (uint32_t)st->n_subs,
                           "a task of no submission");
                const struct sub *s = &st->subs[tag[0]];
                FZ_REQUIRE(len == s->in_size, "an argument of %u bytes, "
                           "submitted %zu", len, s->in_size);
                if (k < MAX_N) {
                    c->sub[k] = tag[0];
                    c->idx[k] = s->kind <= S_APPLY_BARE ? 0 : tag[1];
                }
                FZ_REQUIRE(s->kind <= S_APPLY_BARE || tag[1] < s->n,
                           "a task index out of range");
            }
        }
        FZ_REQUIRE(got == 0, "the pool sent a malformed frame: %s",
                   fb_conn_err(&h->conn));
        if (rc != 0) { /* the pool dropped it */
            h->closed = 1;
            h->n_chunks = 0;
            return;
        }
        if (!read_some)
            return;
    }
}

static void settle(struct state *st)
{
    step(st);
    for (int i = 0; i < st->n_hw; i++)
        read_worker(st, &st->hw[i]);
    check_books(st);
}

/* ---- workers ------------------------------------------------------------- */

static void add_worker(struct state *st)
{
    struct fiber_pool *p = st->p;
    if (st->n_hw == MAX_WORKERS)
        return;
    struct hworker *h = &st->hw[st->n_hw++];
    memset(h, 0, sizeof *h); /* h->conn: zeroed, a closed conn */
    struct fb_worker *w = calloc(1, sizeof *w);
    struct fb_jobrec *j = calloc(1, sizeof *j);
    FZ_REQUIRE(w && j, "out of memory");
    j->id = 1000 + (uint64_t)st->n_hw;
    snprintf(j->name, sizeof j->name, "FuzzWorker-%d", st->n_hw);
    j->ops = &fb_pool_worker_ops;
    j->owner = w;
    j->pid = -1;
    j->event_fd = -1;
    w->pool = p;
    w->job = j;
    w->state = W_STARTING;
    pthread_mutex_lock(&p->mu);
    if (p->n_workers == p->cap_workers) {
        p->cap_workers = p->cap_workers ? 2 * p->cap_workers : 4;
        p->workers = realloc(p->workers,
                             (size_t)p->cap_workers * sizeof *p->workers);
        FZ_REQUIRE(p->workers, "out of memory");
    }
    w->index = p->n_workers;
    p->workers[p->n_workers++] = w;
    fb_pool_note(p, w);
    p->st.workers_started++;
    p->target++;
    pthread_mutex_unlock(&p->mu);
    h->w = w;
    h->j = j;
}

/* The worker's job authenticated: the service thread hands the
 * connection (WELCOME queued) to the pool. */
static void connect_worker(struct state *st, struct hworker *h)
{
    if (!h->w || h->connected)
        return;
    int sv[2];
    fz_socketpair(sv);
    fb_conn_init(&h->j->conn, sv[0], fb_rt_config()->max_message_bytes);
    struct fb_msg_welcome wm = {0};
    fb_wire_put_welcome(fb_conn_out(&h->j->conn), &wm);
    h->j->connected = 1;
    fb_pool_worker_ops.connected(h->j);
    h->j->connected = 0; /* the pool took the connection */
    memset(&h->j->conn, 0, sizeof h->j->conn); /* moved: closed */
    fb_conn_init(&h->conn, sv[1], 1u << 30);
    /* Our end reads WELCOME first, as a child's handshake does. */
    h->connected = 1;
    st->poked = 1;
    settle(st);
}

/* The job ended: the runtime reports it; the pool frees the worker. */
static void end_worker(struct state *st, struct hworker *h, int status)
{
    if (!h->w)
        return;
    h->j->exit_status = status;
    h->j->ended = 1;
    fb_pool_worker_ops.ended(h->j);
    h->w = NULL; /* the pool frees it (and the job record) */
    h->j = NULL;
    if (h->connected && !h->closed)
        fb_conn_close(&h->conn);
    h->closed = 1;
    st->poked = 1;
}

static void send_worker(struct state *st, struct hworker *h, const void *b,
                        size_t n)
{
    if (!h->connected || h->closed || n == 0)
        return;
    fz_send(fb_conn_fd(&h->conn), b, n);
    st->poked = 1;
}

/* The results of the next k items of the worker's oldest chunk. */
static void send_results(struct state *st, struct hworker *h,
                         struct fz_in *in)
{
    uint8_t ksel = fz_u8(in), mode = fz_u8(in);
    uint64_t elapsed = fz_u8(in) * 1000ull;
    if (h->n_chunks == 0)
        return;
    struct hchunk *c = &h->chunks[0];
    uint32_t left = c->count - c->done;
    uint32_t k = 1 + ksel % left;
    fiber_buf f = {0}, want = {0};
    size_t mark;
    fb_wire_result_begin(&f, c->id, c->done, &mark);
    for (uint32_t i = 0; i < k; i++) {
        uint32_t item = c->done + i;
        want.len = 0;
        if (item < MAX_N)
            expected(&st->subs[c->sub[item]], c->idx[item], &want);
        int fail = (mode >> (i % 8)) & 1 && (mode & 0x80);
        if (fail)
            fb_wire_result_add(&f, 1, "the task failed", 15);
        else if (mode == 0x7f && want.len) /* the wrong size */
            fb_wire_result_add(&f, 0, want.data, (uint32_t)want.len - 1);
        else
            fb_wire_result_add(&f, 0, want.data, (uint32_t)want.len);
    }
    fb_wire_result_end(&f, mark, k, elapsed);
    send_worker(st, h, f.data, f.len);
    fiber_buf_free(&f);
    fiber_buf_free(&want);
    c->done += k;
    if (c->done == c->count)
        memmove(&h->chunks[0], &h->chunks[1],
                (size_t)--h->n_chunks * sizeof *h->chunks);
}

static void send_fault(struct state *st, struct hworker *h, struct fz_in *in)
{
    int32_t sig = (int8_t)fz_u8(in);
    uint8_t f[FB_WIRE_FAULT_LEN];
    if (h->n_chunks == 0)
        return;
    struct hchunk *c = &h->chunks[0];
    fb_wire_fault_encode(f, c->id, sig, c->done);
    send_worker(st, h, f, sizeof f);
    c->done++;
    if (c->done == c->count)
        memmove(&h->chunks[0], &h->chunks[1],
                (size_t)--h->n_chunks * sizeof *h->chunks);
}

static void cmd_send(struct state *st, struct fz_in *in)
{
    struct hworker *h = st->n_hw ? &st->hw[fz_u8(in) % st->n_hw] : NULL;
    uint8_t what = fz_u8(in);
    fiber_buf f = {0};
    if (!h) {
        fz_u8(in);
        return;
    }
    switch (what % 10) {
    case 0: fb_wire_put_empty(&f, FB_MSG_READY, 0); break;
    case 1:
    case 2: send_results(st, h, in); break;
    case 3: send_fault(st, h, in); break;
    case 4: fb_wire_put_empty(&f, FB_MSG_HEARTBEAT, 0); break;
    case 5: {
        size_t n;
        const uint8_t *t = fz_bytes(in, fz_u8(in) % 40, &n);
        char text[40];
        for (size_t i = 0; i < n; i++)
            text[i] = t[i] ? (char)t[i] : '?';
        fb_wire_put_exit(&f, (int8_t)fz_u8(in), text, n);
        break;
    }
    case 6:
        fb_wire_put_ping(&f, fz_u8(in));
        break;
    case 7: { /* results that match nothing it holds: a chunk id never
               * given, or the right chunk at the wrong offset */
        size_t mark;
        uint64_t id = (uint64_t)1 << 40 | fz_u8(in);
        uint32_t off = fz_u8(in) % 4, count = 1 + fz_u8(in) % 3;
        if ((off & 1) && h->n_chunks) {
            id = h->chunks[0].id;
            off = h->chunks[0].done + 1 + off / 2;
        }
        fb_wire_result_begin(&f, id, off, &mark);
        for (uint32_t i = 0; i < count; i++)
            fb_wire_result_add(&f, 0, "x", 1);
        fb_wire_result_end(&f, mark, count, 5);
        break;
    }
    case 8: { /* any frame: a valid header around raw payload */
        struct fb_wire_hdr hd = {0};
        hd.type = fz_u8(in) % (FB_MSG_NOTE + 2);
        hd.code = (int8_t)fz_u8(in);
        hd.id = fz_u8(in);
        if (hd.type == FB_MSG_RESULT || hd.type == FB_MSG_FAULT)
            hd.id |= (uint64_t)1 << 40; /* results the books cannot expect */
        size_t n;
        const uint8_t *b = fz_bytes(in, fz_u8(in), &n);
        hd.len = (uint32_t)n;
        uint8_t raw[FB_WIRE_HDR_LEN];
        fb_wire_hdr_encode(raw, &hd);
        fz_w_bytes(&f, raw, sizeof raw);
        fz_w_bytes(&f, b, n);
        break;
    }
    case 9: { /* garbage: raw bytes, never a frame's start */
        size_t n;
        const uint8_t *b = fz_bytes(in, fz_u8(in), &n);
        fz_w_bytes(&f, b, n);
        if (n > 0 && f.data[0] == 0xbe)
            f.data[0] = 0;
        break;
    }
    }
    send_worker(st, h, f.data, f.len);
    fiber_buf_free(&f);
}

/* ---- submissions and their handles ------------------------------------- */

static struct sub *new_sub(struct state *st, enum sub_kind kind, size_t n,
                           size_t in_size)
{
    if (st->n_subs == MAX_SUBS)
        return NULL;
    struct sub *s = &st->subs[st->n_subs];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->n = n;
    s->in_size = in_size;
    s->in = calloc(n ? n : 1, in_size);
    FZ_REQUIRE(s->in, "out of memory");
    for (size_t i = 0; i < n; i++) {
        uint32_t tag[2] = {(uint32_t)st->n_subs, (uint32_t)i};
        memcpy(s->in + i * in_size, tag, in_size < 8 ? 4 : 8);
    }
    st->n_subs++;
    return s;
}

static void sub_failed(struct state *st, struct sub *s, int rc)
{
    FZ_REQUIRE(rc == FIBER_ECLOSED || rc == FIBER_ESPAWN,
               "a submission failed: %s", fiber_last_error());
    free(s->in);
    free(s->out);
    st->n_subs--;
}

static void cmd_apply(struct state *st, struct fz_in *in)
{
    uint8_t how = fz_u8(in) % 3;
    size_t extra = fz_u8(in) % 24;
    struct sub *s = new_sub(st, (enum sub_kind)how, 1, 4 + extra);
    if (!s)
        return;
    int rc = fiber_pool_apply_async(st->p, "fz_task", s->in, s->in_size,
                                    how == S_APPLY_CB ? on_done : NULL, s,
                                    how == S_APPLY ? &s->f : NULL);
    if (rc)
        sub_failed(st, s, rc);
}

static void cmd_map(struct state *st, struct fz_in *in)
{
    size_t n = fz_u8(in) % MAX_N, in_size = 8 + fz_u8(in) % 8;
    size_t out_size = 1 + fz_u8(in) % 8, chunk = fz_u8(in) % 5;
    struct sub *s = new_sub(st, S_MAP, n, in_size);
    if (!s)
        return;
    s->out_size = out_size;
    s->out = calloc(n ? n : 1, out_size);
    int rc = fiber_pool_map_async(st->p, "fz_task", s->in, in_size, n,
                                  s->out, out_size, chunk, &s->f);
    if (rc)
        sub_failed(st, s, rc);
}

static void cmd_imap(struct state *st, struct fz_in *in)
{
    size_t n = fz_u8(in) % MAX_N, in_size = 8 + fz_u8(in) % 8;
    int ordered = fz_u8(in) & 1;
    struct sub *s = new_sub(st, S_IMAP, n, in_size);
    if (!s)
        return;
    s->out_size = 4;
    int rc = fiber_pool_imap(st->p, "fz_task", s->in, in_size, n, 0, ordered,
                             &s->it);
    if (rc)
        sub_failed(st, s, rc);
}

/* Checks a finished future's outcome. */
static void check_future(struct state *st, struct sub *s, int rc,
                         const fiber_buf *out)
{
    FZ_REQUIRE(rc == 0 || rc == FIBER_ETASK || rc == FIBER_ECRASHED ||
                   rc == FIBER_ECLOSED || rc == FIBER_ESPAWN,
               "a future failed with %s", fiber_errname(rc));
    if (fz_trace())
        fprintf(stderr, "pool: submission %d: %s %s\n", (int)(s - st->subs),
                fiber_errname(rc), rc ? fiber_last_error() : "");
    if (rc != 0)
        return;
    fiber_buf want = {0};
    if (s->kind == S_APPLY) {
        FZ_REQUIRE(is_result(s, 0, out),
                   "an apply's result is not what its worker sent");
    } else {
        for (size_t i = 0; i < s->n; i++) {
            want.len = 0;
            expected(s, (uint32_t)i, &want);
            FZ_REQUIRE(!memcmp(s->out + i * s->out_size, want.data,
                               s->out_size),
                       "record %zu of a map is not what its worker sent", i);
        }
    }
    fiber_buf_free(&want);
    FB_UNUSED(st);
}

static void cmd_future(struct state *st, struct fz_in *in)
{
    uint8_t k = fz_u8(in), what = fz_u8(in);
    if (!st->n_subs)
        return;
    struct sub *s = &st->subs[k % st->n_subs];
    if (!s->f)
        return;
    int ready = fiber_future_ready(s->f);
    FZ_REQUIRE(ready == 0 || ready == 1, "fiber_future_ready: %d", ready);
    if (ready) {
        fiber_buf out = {0};
        int rc = fiber_future_get(s->f, &out, 0);
        check_future(st, s, rc, &out);
        fiber_buf_free(&out);
    }
    /* A map's future waits for its tasks when freed: only once ready. */
    if ((what & 1) && (ready || s->kind == S_APPLY)) {
        fiber_future_free(s->f);
        s->f = NULL;
    }
}

static void cmd_next(struct state *st, struct fz_in *in)
{
    uint8_t k = fz_u8(in), what = fz_u8(in);
    if (!st->n_subs)
        return;
    struct sub *s = &st->subs[k % st->n_subs];
    if (!s->it)
        return;
    if (what % 4 == 3) {
        fiber_imap_free(s->it);
        s->it = NULL;
        return;
    }
    size_t index;
    fiber_buf out = {0};
    int rc = fiber_imap_next(s->it, &index, &out, 0);
    FZ_REQUIRE(rc == 0 || rc == FIBER_ETASK || rc == FIBER_ECRASHED ||
                   rc == FIBER_ECLOSED || rc == FIBER_ETIMEDOUT ||
                   rc == FIBER_ESPAWN,
               "imap_next: %s", fiber_errname(rc));
    if (rc == 0) {
        FZ_REQUIRE(index < s->n, "imap gave index %zu of %zu", index, s->n);
        FZ_REQUIRE(is_result(s, (uint32_t)index, &out),
                   "imap result %zu is not what its worker sent", index);
    }
    fiber_buf_free(&out);
}

/* Every worker's job ends (as the pool's own terminate would cause). */
static void end_all(struct state *st)
{
    for (int i = 0; i < st->n_hw; i++)
        end_worker(st, &st->hw[i], -9);
}

static void cmd_pool(struct state *st, struct fz_in *in)
{
    uint8_t what = fz_u8(in), arg = fz_u8(in);
    fiber_pool_stats ps;
    switch (what % 6) {
    case 0: fiber_pool_close(st->p); break;
    case 1: {
        int rc = fiber_pool_join(st->p, 0);
        FZ_REQUIRE(rc == 0 || rc == FIBER_ETIMEDOUT, "join: %d", rc);
        break;
    }
    case 2: fiber_pool_resize(st->p, 1 + arg % MAX_WORKERS); break;
    case 3:
        FZ_REQUIRE(fiber_pool_stats_get(st->p, &ps) == 0, "stats");
        FZ_REQUIRE(ps.tasks_done <= ps.tasks_submitted &&
                       ps.workers_alive <= MAX_WORKERS,
                   "stats do not add up");
        break;
    case 4:
        if (arg == 0x7f) {
            end_all(st);
            fiber_pool_terminate(st->p);
            st->terminated = 1;
        }
        break;
    default:
        break;
    }
}

static void run_command(struct state *st, struct fz_in *in)
{
    uint8_t cmd = fz_u8(in);
    struct hworker *h = st->n_hw ? &st->hw[fz_u8(in) % st->n_hw] : NULL;
    switch (cmd % 12) {
    case 0: cmd_apply(st, in); break;
    case 1: cmd_map(st, in); break;
    case 2: cmd_imap(st, in); break;
    case 3:
    case 4:
    case 5: cmd_send(st, in); break;
    case 6:
        if (h && h->connected)
            add_worker(st);
        else if (h)
            connect_worker(st, h);
        break;
    case 7:
        if (h)
            end_worker(st, h, (int8_t)fz_u8(in));
        break;
    case 8:
        if (h && h->connected && !h->closed) {
            fb_conn_close(&h->conn);
            h->closed = 1;
            st->poked = 1;
        }
        break;
    case 9: cmd_future(st, in); break;
    case 10: cmd_next(st, in); break;
    case 11: cmd_pool(st, in); break;
    }
    settle(st);
}

/* ---- one input ------------------------------------------------------------ */

/* A pool as fiber_pool_create makes it, minus the workers it launches and
 * its background thread: this test drives it itself. */
static struct fiber_pool *pool_new(int max_crashes, int maxtasks)
{
    struct fiber_pool *p = calloc(1, sizeof *p);
    FZ_REQUIRE(p, "out of memory");
    p->magic = POOL_MAGIC;
    p->epfd = p->evfd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->inbox_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    p->ncpu = 1; /* no spinning */
    p->idle_ms = 2000;
    p->max_crashes = max_crashes;
    p->maxtasks = maxtasks;
    p->max_frame = fb_rt_config()->max_message_bytes;
    p->pool_no = 1;
    p->creating = 1; /* it never launches a worker of its own */
    FZ_REQUIRE(fb_pool_sched_init(p) == 0, "sched init");
    fb_spin_init(&p->spin, 50);
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_setup();
    struct fz_in in = {data, size};
    struct state st = {0};
    cur = &st;
    uint8_t conf = fz_u8(&in);
    st.p = pool_new(1 + conf % 3, (conf >> 2) % 4 == 3 ? 3 : 0);
    int n = 1 + (conf >> 4) % 3;
    for (int i = 0; i < n; i++)
        add_worker(&st);
    /* Worker 0 connects and is ready, so tasks flow at once. */
    connect_worker(&st, &st.hw[0]);
    fiber_buf ready = {0};
    fb_wire_put_empty(&ready, FB_MSG_READY, 0);
    send_worker(&st, &st.hw[0], ready.data, ready.len);
    fiber_buf_free(&ready);
    settle(&st);

    while (fz_more(&in))
        run_command(&st, &in);

    /* The end: every job ends, the pool goes, then the handles. */
    if (fz_trace()) {
        fiber_pool_stats ps;
        fiber_pool_stats_get(st.p, &ps);
        fprintf(stderr, "pool: %llu submitted, %llu done, %llu failed, "
                "%llu retried, %llu crashed, %llu workers lost, %llu "
                "duplicates\n",
                (unsigned long long)ps.tasks_submitted,
                (unsigned long long)ps.tasks_done,
                (unsigned long long)ps.tasks_failed,
                (unsigned long long)ps.tasks_retried,
                (unsigned long long)ps.tasks_crashed,
                (unsigned long long)ps.workers_lost,
                (unsigned long long)ps.duplicates_dropped);
    }
    end_all(&st);
    fiber_pool_free(st.p);
    for (int k = 0; k < st.n_subs; k++) {
        struct sub *s = &st.subs[k];
        if (s->f) {
            if (fiber_future_ready(s->f) == 1) {
                fiber_buf out = {0};
                check_future(&st, s, fiber_future_get(s->f, &out, 0), &out);
                fiber_buf_free(&out);
            }
            fiber_future_free(s->f);
        }
        if (s->it)
            fiber_imap_free(s->it);
        if (s->kind == S_APPLY_CB)
            FZ_REQUIRE(s->cb_calls == 1, "a callback ran %d times",
                       s->cb_calls);
        free(s->in);
        free(s->out);
    }
    for (int i = 0; i < st.n_hw; i++)
        fb_conn_close(&st.hw[i].conn);
    cur = NULL;
    return 0;
}

/* ---- seeds ------------------------------------------------------------------ */

/* Command writers: each starts with the command byte and the worker. */
static void w_cmd(fiber_buf *b, int cmd, int worker)
{
    fz_w_u8(b, cmd);
    fz_w_u8(b, worker);
}

static void w_results(fiber_buf *b, int worker, int k, int mode)
{
    w_cmd(b, 3, 0);
    fz_w_u8(b, worker);
    fz_w_u8(b, 1);
    fz_w_u8(b, k - 1);
    fz_w_u8(b, mode);
    fz_w_u8(b, 5);
}

static void w_send(fiber_buf *b, int worker, int what)
{
    w_cmd(b, 3, 0);
    fz_w_u8(b, worker);
    fz_w_u8(b, what);
}

void fuzz_write_seeds(const char *dir)
{
    fiber_buf b = {0};

    fz_w_u8(&b, 0x10); /* two workers, 1 crash allowed */
    w_cmd(&b, 0, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 5);  /* apply, future */
    w_cmd(&b, 0, 0); fz_w_u8(&b, 1); fz_w_u8(&b, 0);  /* apply, callback */
    w_results(&b, 0, 1, 0);
    w_results(&b, 0, 1, 0);
    w_cmd(&b, 9, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 1);  /* take, free */
    fz_seed(dir, "apply", &b);

    fz_w_u8(&b, 0x20);
    w_cmd(&b, 1, 0); fz_w_u8(&b, 20); fz_w_u8(&b, 0); fz_w_u8(&b, 4);
    fz_w_u8(&b, 0); /* map of 20, automatic chunks */
    w_cmd(&b, 6, 1);  /* worker 1 connects */
    w_send(&b, 1, 0); /* READY */
    for (int i = 0; i < 6; i++) {
        w_results(&b, 0, 3, 0);
        w_results(&b, 1, 2, 0);
    }
    w_cmd(&b, 9, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    fz_seed(dir, "map_two_workers", &b);

    fz_w_u8(&b, 0x11);
    w_cmd(&b, 1, 0); fz_w_u8(&b, 6); fz_w_u8(&b, 0); fz_w_u8(&b, 4);
    fz_w_u8(&b, 2);
    w_results(&b, 0, 1, 0x81); /* a failed task */
    w_send(&b, 0, 3); fz_w_u8(&b, 11); /* FAULT: SIGSEGV */
    w_cmd(&b, 8, 0); /* its socket closes */
    w_cmd(&b, 6, 1); w_send(&b, 1, 0);
    w_results(&b, 1, 1, 0);
    w_send(&b, 1, 3); fz_w_u8(&b, 9);
    w_cmd(&b, 7, 1); fz_w_u8(&b, 0xf7); /* ends */
    w_cmd(&b, 9, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    fz_seed(dir, "crashes_and_retries", &b);

    fz_w_u8(&b, 0x00);
    w_cmd(&b, 2, 0); fz_w_u8(&b, 10); fz_w_u8(&b, 0); fz_w_u8(&b, 1);
    w_results(&b, 0, 4, 0);
    w_cmd(&b, 10, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    w_cmd(&b, 10, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    w_results(&b, 0, 4, 0x7f); /* the wrong size: fine for an imap */
    w_cmd(&b, 10, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    w_cmd(&b, 10, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 3); /* free it */
    fz_seed(dir, "imap", &b);

    fz_w_u8(&b, 0x00);
    w_cmd(&b, 0, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 1);
    w_send(&b, 0, 4); /* HEARTBEAT */
    w_send(&b, 0, 6); fz_w_u8(&b, 9); /* PING */
    w_send(&b, 0, 5); fz_w_u8(&b, 3); fz_w_bytes(&b, "bye", 3); fz_w_u8(&b, 1);
    w_send(&b, 0, 7); fz_w_u8(&b, 99); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    w_cmd(&b, 7, 0); fz_w_u8(&b, 1);
    fz_seed(dir, "stray_results", &b);

    fz_w_u8(&b, 0x20);
    w_cmd(&b, 6, 1); w_cmd(&b, 7, 1); fz_w_u8(&b, 1); /* dies before READY */
    w_cmd(&b, 6, 2); w_cmd(&b, 8, 2);
    w_cmd(&b, 7, 2); fz_w_u8(&b, 2);
    w_cmd(&b, 1, 0); fz_w_u8(&b, 3); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    fz_w_u8(&b, 1);
    w_cmd(&b, 11, 0); fz_w_u8(&b, 2); fz_w_u8(&b, 0); /* resize */
    w_cmd(&b, 11, 0); fz_w_u8(&b, 3); fz_w_u8(&b, 0); /* stats */
    w_cmd(&b, 11, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0); /* close */
    w_cmd(&b, 11, 0); fz_w_u8(&b, 1); fz_w_u8(&b, 0); /* join(0) */
    w_cmd(&b, 11, 0); fz_w_u8(&b, 4); fz_w_u8(&b, 0x7f); /* terminate */
    w_cmd(&b, 0, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    fz_seed(dir, "lifecycle", &b);

    fz_w_u8(&b, 0x0c); /* maxtasksperchild 3 */
    w_cmd(&b, 1, 0); fz_w_u8(&b, 8); fz_w_u8(&b, 0); fz_w_u8(&b, 3);
    fz_w_u8(&b, 1);
    w_results(&b, 0, 1, 0); w_results(&b, 0, 1, 0); w_results(&b, 0, 1, 0);
    w_send(&b, 0, 8); fz_w_u8(&b, FB_MSG_TASK); fz_w_u8(&b, 1);
    fz_w_u8(&b, 1); fz_w_u8(&b, 2); fz_w_bytes(&b, "\0\0", 2);
    fz_seed(dir, "maxtasks_and_garbage", &b);
    fiber_buf_free(&b);
}
