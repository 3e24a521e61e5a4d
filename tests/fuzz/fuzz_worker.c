/*
 * fuzz_worker.c -- libFuzzer target for a pool worker's side
 * (src/runtime/worker.c): POOL (its initializer), TASK chunks, PING, STOP,
 * and whatever else a master could send.
 *
 * The worker loop proper never returns (it exits on STOP and dies on a
 * bad frame), so the target drives its parts (child.h: fb_wloop_start,
 * fb_wloop_frame, fb_wloop_idle) over a real fb_child whose connection
 * is one end of a socket pair; the test reads the worker's output at the
 * other.  Input bytes are appended to the connection's input buffer and
 * taken out with fb_conn_next, exactly as the loop does, so framing and
 * decoding are exercised too.
 *
 * The input: a configuration byte (the frame limit, and so the largest
 * result), the POOL message (initializer: none, one that succeeds, one
 * that fails, one that does not exist), then commands:
 *
 *   TASK   a well-formed chunk of one of the test's tasks (echo, fail,
 *          big, or an unknown one), its items from the input
 *   PING   a PING
 *   STOP   STOP (the last thing the worker takes)
 *   FRAME  a valid header of any type around raw payload bytes
 *   RAW    raw bytes
 *   IDLE   the loop runs out of input: staged results go out
 *
 * Invariants (abort() on a violation):
 *   - READY comes first, or EXIT when the initializer fails;
 *   - each chunk is answered by RESULT frames for exactly its items, in
 *     order, in contiguous pieces, and nothing else is answered; each
 *     result is what its task gives (echo: the argument; fail: its text;
 *     an unknown task or a result too large: a failure that says so);
 *   - a PING is answered with a PONG of the same id; after STOP every
 *     result has been sent;
 *   - a bad frame, or one a worker does not take, ends the loop (the real
 *     worker dies) and nothing is acted on after it;
 *   - no crash, no sanitizer report, no leak.
 */
#define FZ_NAME "fuzz_worker"
#include "fuzz_util.h"

#include "base/common.h"
#include "net/net.h"
#include "runtime/child.h"
#include "runtime/runtime.h"

#define MAX_CHUNKS 64
#define MAX_ITEMS 256

FIBER_TASK(fzw_echo) { return fiber_buf_append(out, arg, len); }

FIBER_TASK(fzw_fail) { return fiber_task_fail("failed on %zu bytes", len); }

/* Twice its argument: may outgrow the frame limit. */
FIBER_TASK(fzw_big)
{
    int rc = fiber_buf_append(out, arg, len);
    return rc ? rc : fiber_buf_append(out, arg, len);
}

FIBER_TASK(fzw_init_ok) { return 0; }

FIBER_TASK(fzw_init_fail) { return fiber_task_fail("cannot initialise"); }

static const char *const tasks[] = {"fzw_echo", "fzw_fail", "fzw_big",
                                    "fzw_none"};
static const char *const inits[] = {"", "fzw_init_ok", "fzw_init_fail",
                                    "fzw_nope"};

struct chunk {
    uint64_t id;
    int task; /* index in tasks */
    uint32_t count, answered;
    uint32_t len[MAX_ITEMS];
    uint8_t *arg[MAX_ITEMS];
};

struct state {
    struct fb_child ch;
    struct fb_config cfg;
    struct fb_conn peer; /* the master's end */
    struct fb_wloop *l;
    int over;            /* the loop ended (STOP, or it would die) */
    struct chunk chunks[MAX_CHUNKS];
    int n_chunks, first_open; /* chunks sent; the oldest not all answered */
    uint64_t pings[64];
    int n_pings, pongs;
    uint32_t max_result;
};

/* What item k of chunk c must come back as. */
static void check_item(struct state *st, const struct chunk *c, uint32_t k,
                       int32_t rc, const void *data, uint32_t len)
{
    const char *task = tasks[c->task];
    size_t want = c->len[k] * (c->task == 2 ? 2u : 1u);
    if (c->task == 0 || c->task == 2) {
        if (want > st->max_result) {
            FZ_REQUIRE(rc == FIBER_ETOOBIG, "%s of %zu bytes: rc %d", task,
                       want, rc);
            return;
        }
        FZ_REQUIRE(rc == 0 && len == want, "%s: rc %d, %u bytes, want %zu",
                   task, rc, len, want);
        FZ_REQUIRE(len == 0 || !memcmp(data, c->arg[k], c->len[k]),
                   "%s returned other bytes", task);
        return;
    }
    FZ_REQUIRE(rc != 0 && len > 0, "%s: rc %d", task, rc);
    if (c->task == 3)
        FZ_REQUIRE(memmem(data, len, "not registered", 14) != NULL,
                   "an unknown task's failure does not say so");
}

/* Reads what the worker sent. */
static void drain(struct state *st)
{
    for (;;) {
        /* The worker may have left output it could not write at once. */
        fb_conn_flush(&st->ch.conn);
        size_t had = fb_conn_buffered(&st->peer);
        int rc = fb_conn_read(&st->peer);
        FZ_REQUIRE(rc == 0, "the worker's socket: %s", fb_conn_err(&st->peer));
        int read_some = fb_conn_buffered(&st->peer) != had;
        struct fb_wire_hdr h;
        const uint8_t *p;
        int got;
        while ((got = fb_conn_next(&st->peer, &h, &p)) == 1) {
            if (h.type == FB_MSG_PONG) {
                FZ_REQUIRE(st->pongs < st->n_pings &&
                               h.id == st->pings[st->pongs],
                           "PONG %llu answers no PING",
                           (unsigned long long)h.id);
                st->pongs++;
                continue;
            }
            FZ_REQUIRE(h.type == FB_MSG_RESULT, "the worker sent %s",
                       fb_msg_type_name(h.type));
            struct fb_msg_result m;
            fb_wire_get_result(p, h.len, h.code, &m, NULL, 0);
            FZ_REQUIRE(st->first_open < st->n_chunks,
                       "RESULT with no chunk open");
            struct chunk *c = &st->chunks[st->first_open];
            FZ_REQUIRE(h.id == c->id && m.offset == c->answered &&
                           m.count <= c->count - c->answered,
                       "RESULT for chunk %llu at %u (+%u); want chunk %llu "
                       "at %u of %u",
                       (unsigned long long)h.id, m.offset, m.count,
                       (unsigned long long)c->id, c->answered, c->count);
            const uint8_t *cur = m.items;
            for (uint32_t k = 0; k < m.count; k++) {
                int32_t irc;
                const void *d;
                uint32_t len;
                fb_wire_result_next(&cur, &irc, &d, &len);
                if (c->answered + k < MAX_ITEMS)
                    check_item(st, c, c->answered + k, irc, d, len);
            }
            c->answered += m.count;
            while (st->first_open < st->n_chunks &&
                   st->chunks[st->first_open].answered ==
                       st->chunks[st->first_open].count)
                st->first_open++;
        }
        FZ_REQUIRE(got == 0, "the worker sent a malformed frame: %s",
                   fb_conn_err(&st->peer));
        if (!read_some && fb_conn_unsent(&st->ch.conn) == 0)
            return;
    }
}

/* Feeds bytes to the worker as if read from its socket, and runs the
 * loop's body over every whole frame. */
static void feed(struct state *st, const void *b, size_t n)
{
    if (st->over || n == 0)
        return;
    struct fb_conn *c = &st->ch.conn;
    while (n > 0) { /* into its input, as fb_conn_read would */
        size_t room = fb_conn_in_room(c), k = n < room ? n : room;
        if (k == 0)
            abort();
        memcpy(fb_conn_in_tail(c), b, k);
        fb_conn_in_grew(c, k);
        b = (const uint8_t *)b + k;
        n -= k;
    }
    for (;;) {
        struct fb_wire_hdr h;
        const uint8_t *p;
        int rc = fb_conn_next(c, &h, &p);
        if (rc < 0) { /* the real worker dies: "bad frame" */
            st->over = 1;
            return;
        }
        if (rc == 0)
            return;
        rc = fb_wloop_frame(st->l, &h, p);
        FZ_REQUIRE(rc == 0 || rc == 1 || rc == FIBER_EPROTO,
                   "fb_wloop_frame: %d", rc);
        if (rc != 0) {
            st->over = 1;
            FZ_REQUIRE(rc != FIBER_EPROTO ||
                           (h.type != FB_MSG_TASK && h.type != FB_MSG_PING &&
                            h.type != FB_MSG_STOP),
                       "the worker refused a %s", fb_msg_type_name(h.type));
            if (rc == 1) { /* STOP: everything was answered */
                drain(st);
                FZ_REQUIRE(st->first_open == st->n_chunks,
                           "STOP before every result was sent");
            }
            return;
        }
        drain(st);
    }
}

static void cmd_task(struct state *st, struct fz_in *in)
{
    int task = fz_u8(in) % 4;
    uint32_t count = 1 + fz_u8(in) % 16;
    uint64_t id = 1 + (uint64_t)st->n_chunks;
    fiber_buf f = {0};
    size_t mark;
    const char *name = tasks[task];
    fb_wire_task_begin(&f, id, name, strlen(name), &mark);
    struct chunk *c = st->n_chunks < MAX_CHUNKS && !st->over
                          ? &st->chunks[st->n_chunks]
                          : NULL;
    for (uint32_t k = 0; k < count; k++) {
        size_t n;
        uint8_t sel = fz_u8(in);
        const uint8_t *b = fz_bytes(in, sel < 0xf0 ? sel % 32 : 0, &n);
        static uint8_t big[3000];
        if (sel >= 0xf0) { /* large: past a small frame limit */
            n = 1000u * (sel - 0xef);
            if (n > sizeof big)
                n = sizeof big;
            memset(big, sel, n);
            b = big;
        }
        fb_wire_task_add(&f, b, (uint32_t)n);
        if (c) {
            c->len[k] = (uint32_t)n;
            c->arg[k] = malloc(n ? n : 1);
            memcpy(c->arg[k], b, n);
        }
    }
    fb_wire_task_end(&f, mark, count);
    if (c) {
        c->id = id;
        c->task = task;
        c->count = count;
        c->answered = 0;
        st->n_chunks++;
        feed(st, f.data, f.len);
    }
    fiber_buf_free(&f);
}

static void run_command(struct state *st, struct fz_in *in)
{
    fiber_buf f = {0};
    switch (fz_u8(in) % 7) {
    case 0:
    case 1:
        cmd_task(st, in);
        break;
    case 2: {
        uint64_t id = fz_u8(in);
        fb_wire_put_ping(&f, id);
        if (!st->over && st->n_pings < (int)FB_ARRAY_LEN(st->pings)) {
            st->pings[st->n_pings++] = id;
            feed(st, f.data, f.len);
        }
        break;
    }
    case 3:
        fb_wire_put_empty(&f, FB_MSG_STOP, 0);
        feed(st, f.data, f.len);
        break;
    case 4: {
        struct fb_wire_hdr h = {0};
        h.type = fz_u8(in) % (FB_MSG_NOTE + 2);
        h.code = (int8_t)fz_u8(in);
        h.id = fz_u8(in);
        size_t n;
        const uint8_t *b = fz_bytes(in, fz_u8(in), &n);
        h.len = (uint32_t)n;
        uint8_t raw[FB_WIRE_HDR_LEN];
        fb_wire_hdr_encode(raw, &h);
        fz_w_bytes(&f, raw, sizeof raw);
        fz_w_bytes(&f, b, n);
        /* A frame that names a chunk would confuse the books: only the
         * ones that cannot be run are fed as they are. */
        if (h.type == FB_MSG_TASK || h.type == FB_MSG_PING)
            f.data[3] = FB_MSG_READY;
        feed(st, f.data, f.len);
        break;
    }
    case 5: {
        size_t n;
        const uint8_t *b = fz_bytes(in, fz_u8(in), &n);
        /* Raw bytes could complete a frame the books do not know of, so
         * they go only where a frame starts and must be refused. */
        if (n >= 4 && !st->over && fb_conn_buffered(&st->ch.conn) == 0 &&
            (b[0] != 0xbe || b[1] != 0xf1))
            feed(st, b, n);
        break;
    }
    case 6:
        if (!st->over) {
            fb_wloop_idle(st->l);
            drain(st);
        }
        break;
    }
    fiber_buf_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_setup();
    struct fz_in in = {data, size};
    struct state st = {0};
    uint8_t conf = fz_u8(&in);
    st.cfg = *fb_rt_config();
    if (conf & 1)
        st.cfg.max_message_bytes = 4096; /* results above 2048 are too big */
    st.max_result = st.cfg.max_message_bytes / 2;
    int sv[2];
    fz_socketpair(sv);
    pthread_mutex_init(&st.ch.write_mu, NULL);
    st.ch.cfg = &st.cfg;
    fb_conn_init(&st.ch.conn, sv[0], st.cfg.max_message_bytes);
    fb_conn_init(&st.peer, sv[1], 1u << 30);

    /* POOL */
    const char *init = inits[fz_u8(&in) % 4];
    size_t alen;
    const uint8_t *iarg = fz_bytes(&in, fz_u8(&in) % 16, &alen);
    struct fb_msg_pool pm = {.spin_us = 0,
                             .init_task = init,
                             .init_task_len = (uint8_t)strlen(init),
                             .init_arg = iarg,
                             .init_arg_len = (uint32_t)alen};
    fiber_buf f = {0};
    FZ_REQUIRE(fb_wire_put_pool(&f, &pm) == 0, "POOL encode");
    struct fb_wire_hdr h;
    fb_wire_hdr_decode(f.data, f.len, 1u << 30, &h, NULL, 0);
    int rc = fb_wloop_start(&st.ch, &h, f.data + FB_WIRE_HDR_LEN, &st.l);
    fiber_buf_free(&f);
    const uint8_t *p;
    int got = fb_conn_recv_wait(&st.peer, &h, &p, fb_deadline_ms(5000));
    FZ_REQUIRE(got == 1, "no answer to POOL");
    if (!strcmp(init, "fzw_init_fail") || !strcmp(init, "fzw_nope")) {
        FZ_REQUIRE(rc == FIBER_ETASK && h.type == FB_MSG_EXIT,
                   "a failing initializer gave %d and %s", rc,
                   fb_msg_type_name(h.type));
    } else {
        FZ_REQUIRE(rc == 0 && h.type == FB_MSG_READY,
                   "POOL answered %s (%d)", fb_msg_type_name(h.type), rc);
        while (fz_more(&in) && !st.over)
            run_command(&st, &in);
        if (!st.over) { /* out of input: the loop would send and wait */
            fb_wloop_idle(st.l);
            drain(&st);
            if (fz_trace())
                for (int k = 0; k < st.n_chunks; k++)
                    fprintf(stderr, "worker: chunk %llu (%s): %u of %u "
                            "answered\n",
                            (unsigned long long)st.chunks[k].id,
                            tasks[st.chunks[k].task], st.chunks[k].answered,
                            st.chunks[k].count);
            FZ_REQUIRE(st.first_open == st.n_chunks,
                       "results still missing while the worker waits");
        }
        FZ_REQUIRE(st.pongs <= st.n_pings, "more PONGs than PINGs");
    }
    fb_wloop_free(st.l);
    fb_conn_close(&st.ch.conn);
    fb_conn_close(&st.peer);
    pthread_mutex_destroy(&st.ch.write_mu);
    for (int k = 0; k < st.n_chunks; k++)
        for (uint32_t i = 0; i < st.chunks[k].count; i++)
            free(st.chunks[k].arg[i]);
    return 0;
}

/* ---- seeds ------------------------------------------------------------- */

static void w_task(fiber_buf *b, int task, int count, const char *arg)
{
    fz_w_u8(b, 0);
    fz_w_u8(b, task);
    fz_w_u8(b, count - 1);
    for (int k = 0; k < count; k++) {
        fz_w_u8(b, strlen(arg));
        fz_w_bytes(b, arg, strlen(arg));
    }
}

void fuzz_write_seeds(const char *dir)
{
    fiber_buf b = {0};

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 0); fz_w_u8(&b, 0); /* no initializer */
    w_task(&b, 0, 3, "abc");
    w_task(&b, 1, 2, "x");
    fz_w_u8(&b, 2); fz_w_u8(&b, 7); /* PING */
    w_task(&b, 3, 1, "");
    fz_w_u8(&b, 6); /* idle */
    w_task(&b, 0, 1, "last");
    fz_w_u8(&b, 3); /* STOP */
    fz_seed(dir, "tasks_ping_stop", &b);

    fz_w_u8(&b, 1); /* small frames */
    fz_w_u8(&b, 1); fz_w_u8(&b, 3); fz_w_bytes(&b, "arg", 3);
    fz_w_u8(&b, 0); fz_w_u8(&b, 2); fz_w_u8(&b, 2);
    fz_w_u8(&b, 0xf1); fz_w_u8(&b, 0xf2); fz_w_u8(&b, 4);
    fz_w_bytes(&b, "tiny", 4);
    fz_w_u8(&b, 0); fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    fz_w_u8(&b, 0xf2);
    fz_w_u8(&b, 6);
    fz_seed(dir, "results_too_big", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 2); fz_w_u8(&b, 0);
    fz_seed(dir, "initializer_fails", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 3); fz_w_u8(&b, 0);
    fz_seed(dir, "initializer_missing", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    w_task(&b, 0, 2, "ok");
    fz_w_u8(&b, 4); fz_w_u8(&b, FB_MSG_RESULT); fz_w_u8(&b, 1);
    fz_w_u8(&b, 1); fz_w_u8(&b, 0);
    fz_seed(dir, "unexpected_result", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 0); fz_w_u8(&b, 0);
    w_task(&b, 0, 1, "ok");
    fz_w_u8(&b, 5); fz_w_u8(&b, 8); fz_w_bytes(&b, "GARBAGE!", 8);
    fz_seed(dir, "garbage", &b);
    fiber_buf_free(&b);
}
