/*
 * fuzz_objclient.c -- libFuzzer target for the client side of object
 * servers (src/objsrv/objclient.c): the handshake, matching OREPLY frames to
 * calls by id (deliver), the reader that pumps the socket for every
 * waiter, futures of asynchronous calls, abandoned calls, and what a
 * broken or hostile server does to them.
 *
 * The server is played by the script.  A helper thread accepts the
 * client's connection on a unix socket, checks its HELLO and answers as
 * the input's first byte says (mostly WELCOME; else REJECT, a PING,
 * garbage or a hang-up).  Then the script's commands:
 *
 *   ASYNC  fb_ocall_async with an object, operation, timeout and items
 *          from the input; the OCALL is read back and must say exactly
 *          that, with the next request id
 *   REPLY  a well-formed OREPLY: to one of the calls made (or any id),
 *          with a status (0, a FIBER_E* code, or any int32) and items
 *   RAW    raw bytes to the client
 *   FRAME  a valid header of any type around raw payload bytes
 *   POLL   fiber_future_ready, and fiber_future_get once it is
 *   FREE   fiber_future_free, ready or not (an abandoned call)
 *   SYNC   fb_ocall or fb_oopen, after writing what the input says; when
 *          that cannot answer it, the server's side hangs up first, so
 *          the call never waits forever
 *
 * A model decodes the byte stream the script sends exactly as the client
 * must, and gives the invariants (abort() on a violation):
 *   - a call's outcome is the first reply with its id, or FIBER_ECLOSED
 *     if the stream broke (a malformed frame, a frame other than OREPLY,
 *     the end) before it; a later reply with the same id changes
 *     nothing; a reply nobody asked for is dropped;
 *   - every call returns 0 or a negative FIBER_E* code, whatever status
 *     the server claims;
 *   - the client's OCALL frames carry what the caller gave;
 *   - no crash, no sanitizer report, no leak once the futures are freed
 *     and the client released.
 */
#define FZ_NAME "fuzz_objclient"
#include "fuzz_util.h"

#include <poll.h>
#include <pthread.h>

#include "base/common.h"
#include "net/net.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"

#define MAX_REQS 32

/* ---- the fake server's front door: a thread that answers HELLO -------- */

enum answer { A_WELCOME, A_REJECT, A_PING, A_GARBAGE, A_HANGUP };

static pthread_mutex_t door_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t door_cond = PTHREAD_COND_INITIALIZER;
static int door_listen = -1;
static enum answer door_answer;
static int door_fd = -1;   /* the accepted connection, after WELCOME */
static uint64_t door_done; /* handshakes answered */
static char door_addr[600];

static void *door_main(void *arg)
{
    FB_UNUSED(arg);
    for (;;) {
        int fd;
        while (fb_sock_accept(door_listen, &fd) != 0) {
            struct pollfd pf = {.fd = door_listen, .events = POLLIN};
            poll(&pf, 1, -1);
        }
        struct fb_conn c;
        fb_conn_init(&c, fd, 1024);
        struct fb_wire_hdr h;
        const uint8_t *p;
        int rc = fb_conn_recv_wait(&c, &h, &p, fb_deadline_ms(10000));
        struct fb_msg_hello m;
        FZ_REQUIRE(rc == 1 && h.type == FB_MSG_HELLO &&
                       fb_wire_get_hello(p, h.len, &m, NULL, 0) == 0 &&
                       memcmp(m.token, fb_rt_token(), FB_WIRE_TOKEN_LEN) == 0,
                   "the client's first message is not a valid HELLO");
        pthread_mutex_lock(&door_mu);
        enum answer a = door_answer;
        pthread_mutex_unlock(&door_mu);
        struct fb_msg_welcome w = {0};
        static const char garbage[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
        switch (a) {
        case A_WELCOME: fb_wire_put_welcome(fb_conn_out(&c), &w); break;
        case A_REJECT: fb_wire_put_reject(fb_conn_out(&c), "go away", 7); break;
        case A_PING: fb_wire_put_ping(fb_conn_out(&c), 3); break;
        case A_GARBAGE:
            fiber_buf_append(fb_conn_out(&c), garbage, sizeof garbage - 1);
            break;
        case A_HANGUP: break;
        }
        fb_conn_flush_wait(&c, fb_deadline_ms(10000));
        int keep = -1;
        if (a == A_WELCOME) {
            keep = fb_conn_release_fd(&c);
        }
        fb_conn_close(&c);
        pthread_mutex_lock(&door_mu);
        door_fd = keep;
        door_done++;
        pthread_cond_broadcast(&door_cond);
        pthread_mutex_unlock(&door_mu);
    }
    return NULL;
}

static void door_open(const char *dir)
{
    if (door_listen >= 0)
        return;
    char want[600];
    snprintf(want, sizeof want, "unix:%s/server.sock", dir);
    FZ_REQUIRE(fb_sock_listen(want, 16, &door_listen, door_addr,
                              sizeof door_addr) == 0,
               "listen: %s", fiber_last_error());
    pthread_t t;
    FZ_REQUIRE(pthread_create(&t, NULL, door_main, NULL) == 0, "thread");
    pthread_detach(t);
}

/* ---- the model ---------------------------------------------------------- */

struct req {
    uint64_t id;
    fiber_future *f; /* NULL: a synchronous call, or freed */
    int freed;
    int answered;    /* the model's outcome is known */
    int tainted;     /* a reply with its id was sent before the call: the
                        client may or may not have read it by then */
    int status;
    fiber_buf data;  /* item 0 of the reply (or the failure text) */
    int has_item;
};

struct state {
    struct fb_oclient *c;
    struct fb_conn srv; /* our end */
    int srv_shut;
    uint64_t seq;       /* the client's last request id */
    struct req reqs[MAX_REQS];
    int n_reqs;
    /* the stream we sent, as the client will decode it */
    fiber_buf sent;
    size_t parsed;
    int dead;
    uint64_t orphans[64]; /* ids replied to before any call had them */
    int n_orphans;
};

/* What the client makes of a status: a code it does not know is a
 * protocol error. */
static int known_status(int32_t status)
{
    return status == 0 ||
           (status < 0 && strcmp(fiber_errname(status), "FIBER_E?") != 0);
}

static void require_code(int rc, const char *what)
{
    FZ_REQUIRE(rc == 0 || (rc < 0 && known_status(rc)),
               "%s returned %d, not 0 or a FIBER_E* code", what, rc);
}

static struct req *find_req(struct state *st, uint64_t id)
{
    for (int k = 0; k < st->n_reqs; k++)
        if (st->reqs[k].id == id)
            return &st->reqs[k];
    return NULL;
}

static void model_dead(struct state *st)
{
    st->dead = 1;
    for (int k = 0; k < st->n_reqs; k++) {
        struct req *r = &st->reqs[k];
        if (!r->answered) {
            r->answered = 1;
            r->status = FIBER_ECLOSED;
            r->has_item = 0;
        }
    }
}

/* Decodes what was sent since last time, as the client's pump does. */
static void model_parse(struct state *st)
{
    while (!st->dead && st->sent.data) {
        const uint8_t *p = st->sent.data + st->parsed;
        size_t avail = st->sent.len - st->parsed;
        struct fb_wire_hdr h;
        int rc = fb_wire_hdr_decode(p, avail, 1u << 30, &h, NULL, 0);
        if (rc == 1 || (rc == 0 && avail - FB_WIRE_HDR_LEN < h.len))
            return;
        if (rc == 0)
            rc = fb_wire_check_payload(&h, p + FB_WIRE_HDR_LEN, NULL, 0);
        if (rc != 0 || h.type != FB_MSG_OREPLY) {
            model_dead(st);
            return;
        }
        st->parsed += FB_WIRE_HDR_LEN + h.len;
        struct req *r = find_req(st, h.id);
        if (!r && st->n_orphans < (int)FB_ARRAY_LEN(st->orphans))
            st->orphans[st->n_orphans++] = h.id;
        if (!r || r->answered)
            continue; /* nobody asked, or answered already: dropped */
        struct fb_msg_oreply m;
        fb_wire_get_oreply(p + FB_WIRE_HDR_LEN, h.len, h.code, &m, NULL, 0);
        r->answered = 1;
        r->status = known_status(h.code) ? h.code : FIBER_EPROTO;
        r->has_item = m.count > 0;
        if (m.count > 0) {
            const uint8_t *cur = m.items;
            const void *d;
            uint32_t n;
            fb_wire_task_next(&cur, &d, &n);
            fz_w_bytes(&r->data, d, n);
        }
    }
}

static void to_client(struct state *st, const void *p, size_t n)
{
    if (st->srv_shut || n == 0)
        return;
    size_t sent = fz_send(fb_conn_fd(&st->srv), p, n);
    fz_w_bytes(&st->sent, p, sent);
    model_parse(st);
}

static void hang_up(struct state *st)
{
    if (st->srv_shut)
        return;
    shutdown(fb_conn_fd(&st->srv), SHUT_WR);
    st->srv_shut = 1;
    /* What is buffered but incomplete never completes: the end. */
    model_dead(st);
}

/* Whether the client, reading everything sent so far, will have an
 * outcome for request r (so that waiting for it cannot hang). */
static int will_answer(const struct req *r) { return r->answered; }

/* Reads the OCALL the client just sent and checks it. */
static void expect_ocall(struct state *st, uint64_t id, uint32_t obj,
                         int32_t op, int timeout, const fiber_iov *items,
                         uint32_t n)
{
    struct fb_wire_hdr h;
    const uint8_t *p;
    int rc = fb_conn_recv_wait(&st->srv, &h, &p, fb_deadline_ms(5000));
    FZ_REQUIRE(rc == 1, "no OCALL from the client (%d)", rc);
    struct fb_msg_ocall m;
    FZ_REQUIRE(h.type == FB_MSG_OCALL &&
                   fb_wire_get_ocall(p, h.len, &m, NULL, 0) == 0,
               "the client sent a bad OCALL");
    FZ_REQUIRE(h.id == id && h.code == op && m.obj == obj &&
                   m.timeout_ms == (timeout < 0 ? -1 : timeout) &&
                   m.count == n,
               "the OCALL says id %llu op %d obj %u timeout %d count %u",
               (unsigned long long)h.id, h.code, m.obj, m.timeout_ms,
               m.count);
    const uint8_t *cur = m.items;
    for (uint32_t k = 0; k < n; k++) {
        const void *d;
        uint32_t len;
        fb_wire_task_next(&cur, &d, &len);
        FZ_REQUIRE(len == items[k].len &&
                       (len == 0 || memcmp(d, items[k].data, len) == 0),
                   "item %u of the OCALL differs", k);
    }
}

/* Checks a finished call against the model. */
static void check_outcome(const struct req *r, int rc, const fiber_buf *out,
                          const char *what)
{
    require_code(rc, what);
    if (r->tainted)
        return;
    FZ_REQUIRE(r->answered, "%s finished (%d) before any reply or end", what,
               rc);
    FZ_REQUIRE(rc == r->status, "%s returned %s; the first reply said %s",
               what, fiber_errname(rc), fiber_errname(r->status));
    if (rc == 0 && out) {
        size_t want = r->has_item ? r->data.len : 0;
        FZ_REQUIRE(out->len == want &&
                       (want == 0 || !memcmp(out->data, r->data.data, want)),
                   "%s gave %zu bytes, the reply %zu", what, out->len, want);
    }
}

/* ---- commands ------------------------------------------------------------ */

static uint32_t read_items(struct fz_in *in, fiber_iov *items, uint8_t *buf)
{
    uint32_t n = fz_u8(in) % 4;
    size_t used = 0;
    for (uint32_t k = 0; k < n; k++) {
        size_t len;
        const uint8_t *b = fz_bytes(in, fz_u8(in) % 64, &len);
        memcpy(buf + used, b, len);
        items[k] = (fiber_iov){buf + used, len};
        used += len;
    }
    return n;
}

static int timeout_of(uint8_t sel) { return sel % 3 == 0 ? -1 : sel % 3 == 1 ? 0 : 100; }

static struct req *new_req(struct state *st, uint64_t id)
{
    FZ_REQUIRE(st->n_reqs < MAX_REQS, "too many requests");
    struct req *r = &st->reqs[st->n_reqs++];
    memset(r, 0, sizeof *r);
    r->id = id;
    for (int k = 0; k < st->n_orphans; k++)
        r->tainted |= st->orphans[k] == id;
    if (st->n_orphans == (int)FB_ARRAY_LEN(st->orphans))
        r->tainted = 1;
    if (st->dead) { /* the client knows, or will know, it is gone */
        r->answered = 1;
        r->status = FIBER_ECLOSED;
    }
    return r;
}

static void cmd_async(struct state *st, struct fz_in *in)
{
    uint32_t obj = fz_u8(in);
    int32_t op = (int8_t)fz_u8(in);
    int timeout = timeout_of(fz_u8(in));
    fiber_iov items[4];
    uint8_t buf[4 * 64];
    uint32_t n = read_items(in, items, buf);
    if (st->n_reqs == MAX_REQS)
        return;
    fiber_future *f = NULL;
    int rc = fb_ocall_async(st->c, obj, op, timeout, items, n, &f);
    require_code(rc, "fb_ocall_async");
    if (rc != 0) {
        /* Only a client that knows the server is gone refuses a call. */
        FZ_REQUIRE(rc == FIBER_ECLOSED && st->dead, "a call failed: %s",
                   fiber_last_error());
        return;
    }
    struct req *r = new_req(st, ++st->seq);
    r->f = f;
    expect_ocall(st, r->id, obj, op, timeout, items, n);
}

static void cmd_reply(struct state *st, struct fz_in *in)
{
    uint8_t target = fz_u8(in), ssel = fz_u8(in);
    uint64_t id = target >= 0xf0 || st->n_reqs == 0
                      ? (uint64_t)target
                      : st->reqs[target % st->n_reqs].id;
    int32_t status = ssel % 4 == 1 ? -(int32_t)(fz_u8(in) % 22)
                     : ssel % 4 == 2 ? (int32_t)fz_u32(in)
                                     : 0;
    fiber_iov items[4];
    uint8_t buf[4 * 64];
    uint32_t n = read_items(in, items, buf);
    if (status != 0 && n == 0)
        items[0] = (fiber_iov){"", 0};
    if (status != 0)
        n = 1;
    fiber_buf f = {0};
    if (fb_wire_put_oreply(&f, id, status, items, n) == 0)
        to_client(st, f.data, f.len);
    fiber_buf_free(&f);
}

static void cmd_raw(struct state *st, struct fz_in *in)
{
    size_t n;
    const uint8_t *b = fz_bytes(in, fz_u16(in) % 1024, &n);
    to_client(st, b, n);
}

static void cmd_frame(struct state *st, struct fz_in *in)
{
    struct fb_wire_hdr h = {0};
    h.type = fz_u8(in) % (FB_MSG_NOTE + 2);
    h.code = (int32_t)fz_u32(in);
    uint8_t target = fz_u8(in);
    h.id = st->n_reqs && target < 0xf0 ? st->reqs[target % st->n_reqs].id
                                       : target;
    size_t n;
    const uint8_t *b = fz_bytes(in, fz_u16(in) % 1024, &n);
    h.len = (uint32_t)n;
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    fiber_buf f = {0};
    fz_w_bytes(&f, hdr, sizeof hdr);
    fz_w_bytes(&f, b, n);
    to_client(st, f.data, f.len);
    fiber_buf_free(&f);
}

/* Polls future k; takes its outcome once it is ready. */
static void poll_req(struct state *st, struct req *r)
{
    FB_UNUSED(st);
    if (!r->f)
        return;
    int ready = fiber_future_ready(r->f);
    FZ_REQUIRE(ready == 0 || ready == 1, "fiber_future_ready: %d", ready);
    if (!ready)
        return;
    fiber_buf out = {0};
    int rc = fiber_future_get(r->f, &out, 0);
    check_outcome(r, rc, &out, "fiber_future_get");
    fiber_buf_free(&out);
}

static void cmd_poll(struct state *st, struct fz_in *in)
{
    uint8_t k = fz_u8(in);
    if (st->n_reqs)
        poll_req(st, &st->reqs[k % st->n_reqs]);
}

static void cmd_free(struct state *st, struct fz_in *in)
{
    uint8_t k = fz_u8(in);
    if (!st->n_reqs)
        return;
    struct req *r = &st->reqs[k % st->n_reqs];
    if (r->f) {
        fiber_future_free(r->f);
        r->f = NULL;
        r->freed = 1;
    }
}

/* A synchronous call (fb_ocall, or fb_oopen), after the replies the
 * input writes for it. */
static void cmd_sync(struct state *st, struct fz_in *in)
{
    int open = fz_u8(in) & 1;
    uint32_t obj = fz_u8(in);
    int32_t op = (int8_t)fz_u8(in);
    fiber_iov items[4];
    uint8_t buf[4 * 64];
    uint32_t n = read_items(in, items, buf);
    uint8_t pre = fz_u8(in) % 3;
    if (st->n_reqs == MAX_REQS)
        return;
    struct req *r = new_req(st, st->seq + 1);
    uint32_t rid = 0;
    /* What the server says before the call is read (pre == 0: nothing):
     * a well-formed answer for it, or raw bytes. */
    if (pre == 1 && !st->dead) {
        uint32_t id4 = fz_u32(in);
        int32_t status = (int8_t)fz_u8(in) < -100 ? -(int32_t)(fz_u8(in) % 22)
                                                   : 0;
        fiber_iov it = {&id4, fz_u8(in) % 2 ? 4 : 3};
        fiber_buf f = {0};
        if (status != 0)
            it = (fiber_iov){"no", 2};
        if (fb_wire_put_oreply(&f, r->id, status, &it, 1) == 0)
            to_client(st, f.data, f.len);
        fiber_buf_free(&f);
    } else if (pre == 2) {
        cmd_raw(st, in);
    }
    if (!will_answer(r))
        hang_up(st); /* else the call would wait forever */
    int rc;
    fiber_buf out = {0};
    if (open) {
        rc = fb_oopen(st->c, "kind", "name", items, n > 2 ? 2 : n, &rid);
        require_code(rc, "fb_oopen");
    } else {
        struct fb_oresult res = {0};
        rc = fb_ocall(st->c, obj, op, -1, items, n, &res);
        const void *d;
        size_t len;
        if (rc == 0 && fb_oresult_item(&res, 0, &d, &len) == 0)
            fz_w_bytes(&out, d, len);
        fb_oresult_free(&res);
    }
    /* Was the call sent?  A client that knows its server is gone sends
     * nothing. */
    struct fb_wire_hdr h;
    const uint8_t *p;
    fb_conn_read(&st->srv);
    if (fb_conn_next(&st->srv, &h, &p) == 1) {
        FZ_REQUIRE(h.type == FB_MSG_OCALL && h.id == r->id,
                   "the synchronous call's OCALL is not the next one");
        st->seq++;
    } else {
        FZ_REQUIRE(rc == FIBER_ECLOSED && st->dead,
                   "a synchronous call was not sent: %s",
                   fiber_last_error());
    }
    if (open && !r->tainted) {
        /* OPEN's answer must carry a 4-byte id. */
        int want = r->status;
        if (want == 0 && (!r->has_item || r->data.len != 4))
            want = FIBER_EPROTO;
        FZ_REQUIRE(rc == want, "fb_oopen returned %s, want %s",
                   fiber_errname(rc), fiber_errname(want));
        if (rc == 0)
            FZ_REQUIRE(!memcmp(&rid, r->data.data, 4), "OPEN's id differs");
    } else if (!open) {
        check_outcome(r, rc, &out, "fb_ocall");
    }
    fiber_buf_free(&out);
}

static void run_command(struct state *st, struct fz_in *in)
{
    switch (fz_u8(in) % 8) {
    case 0: cmd_async(st, in); break;
    case 1: cmd_reply(st, in); break;
    case 2: cmd_raw(st, in); break;
    case 3: cmd_frame(st, in); break;
    case 4: cmd_poll(st, in); break;
    case 5: cmd_free(st, in); break;
    case 6: cmd_sync(st, in); break;
    case 7: hang_up(st); break;
    }
}

/* ---- one input ------------------------------------------------------------ */

static enum answer answer_of(uint8_t b)
{
    switch (b % 16) {
    case 12: return A_REJECT;
    case 13: return A_PING;
    case 14: return A_GARBAGE;
    case 15: return A_HANGUP;
    default: return A_WELCOME;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    door_open(fz_setup());
    struct fz_in in = {data, size};
    struct state st = {0};
    enum answer a = answer_of(fz_u8(&in));
    pthread_mutex_lock(&door_mu);
    door_answer = a;
    uint64_t before = door_done;
    pthread_mutex_unlock(&door_mu);

    int rc = fb_oclient_get(door_addr, fb_rt_token(), &st.c);
    require_code(rc, "fb_oclient_get");
    pthread_mutex_lock(&door_mu);
    while (door_done == before)
        pthread_cond_wait(&door_cond, &door_mu);
    int fd = door_fd;
    door_fd = -1;
    pthread_mutex_unlock(&door_mu);
    if (a != A_WELCOME) {
        FZ_REQUIRE(rc == (a == A_REJECT || a == A_PING ? FIBER_EAUTH
                                                       : FIBER_ECLOSED),
                   "a handshake answered %d gave %s", (int)a,
                   fiber_errname(rc));
        return 0;
    }
    FZ_REQUIRE(rc == 0 && fd >= 0, "handshake failed: %s",
               fiber_last_error());
    fb_conn_init(&st.srv, fd, 1u << 30);

    while (fz_more(&in))
        run_command(&st, &in);

    /* The end: every call still out fails with FIBER_ECLOSED. */
    hang_up(&st);
    for (int k = 0; k < st.n_reqs; k++) {
        struct req *r = &st.reqs[k];
        if (!r->f)
            continue;
        int w = fiber_future_wait(r->f, 5000);
        FZ_REQUIRE(w == 0, "a call is still out after the server left");
        poll_req(&st, r);
        fiber_future_free(r->f);
    }
    for (int k = 0; k < st.n_reqs; k++)
        fiber_buf_free(&st.reqs[k].data);
    fb_oclient_release(st.c);
    fb_conn_close(&st.srv);
    fiber_buf_free(&st.sent);
    return 0;
}

/* ---- seeds ---------------------------------------------------------------- */

static void w_async(fiber_buf *b, int obj, int op, int tsel, const char *item)
{
    fz_w_u8(b, 0);
    fz_w_u8(b, obj);
    fz_w_u8(b, op);
    fz_w_u8(b, tsel);
    fz_w_u8(b, item ? 1 : 0);
    if (item) {
        fz_w_u8(b, strlen(item));
        fz_w_bytes(b, item, strlen(item));
    }
}

/* A reply to request k (0-based) with status sel 0 (ok) or 1 (a code). */
static void w_reply(fiber_buf *b, int k, int code, const char *item)
{
    fz_w_u8(b, 1);
    fz_w_u8(b, k);
    fz_w_u8(b, code ? 1 : 0);
    if (code)
        fz_w_u8(b, -code);
    fz_w_u8(b, 1);
    fz_w_u8(b, strlen(item));
    fz_w_bytes(b, item, strlen(item));
}

static void w_poll(fiber_buf *b, int k)
{
    fz_w_u8(b, 4);
    fz_w_u8(b, k);
}

void fuzz_write_seeds(const char *dir)
{
    fiber_buf b = {0};

    fz_w_u8(&b, 0); /* WELCOME */
    w_async(&b, 1, 16, 0, "put me");
    w_async(&b, 1, 17, 1, NULL);
    w_async(&b, 2, 18, 2, NULL);
    w_reply(&b, 1, 0, "got");
    w_poll(&b, 1);
    w_poll(&b, 0);
    w_reply(&b, 0, FIBER_EAGAIN, "the queue is full");
    w_reply(&b, 0, 0, "a second answer");
    w_poll(&b, 0);
    w_poll(&b, 2);
    fz_w_u8(&b, 5); fz_w_u8(&b, 2); /* abandon call 2 */
    w_reply(&b, 2, 0, "to nobody");
    fz_seed(dir, "async_out_of_order", &b);

    fz_w_u8(&b, 0);
    w_async(&b, 1, 16, 0, "x");
    fz_w_u8(&b, 1); fz_w_u8(&b, 0); fz_w_u8(&b, 2); fz_w_u32(&b, 7);
    fz_w_u8(&b, 1); fz_w_u8(&b, 1); fz_w_bytes(&b, "?", 1);
    w_poll(&b, 0);
    fz_seed(dir, "unknown_status", &b);

    fz_w_u8(&b, 0);
    w_async(&b, 3, 20, 0, NULL);
    w_async(&b, 3, 21, 0, NULL);
    fz_w_u8(&b, 3); fz_w_u8(&b, FB_MSG_PING); fz_w_u32(&b, 0);
    fz_w_u8(&b, 0); fz_w_u16(&b, 0);
    w_poll(&b, 0);
    w_async(&b, 3, 22, 0, NULL);
    w_poll(&b, 1);
    fz_seed(dir, "server_sends_ping", &b);

    fz_w_u8(&b, 0);
    w_async(&b, 4, 16, 0, "a");
    fz_w_u8(&b, 2); fz_w_u16(&b, 10); fz_w_bytes(&b, "\xbe\xf1\x01\x10\0\0\0\0\0\0", 10);
    w_poll(&b, 0);
    fz_w_u8(&b, 7);
    w_poll(&b, 0);
    fz_seed(dir, "partial_frame_then_end", &b);

    fz_w_u8(&b, 0);
    fz_w_u8(&b, 6); fz_w_u8(&b, 1); fz_w_u8(&b, 0); fz_w_u8(&b, 1);
    fz_w_u8(&b, 0); fz_w_u8(&b, 1); /* open, pre = a reply */
    fz_w_u32(&b, 42); fz_w_u8(&b, 0); fz_w_u8(&b, 1);
    fz_w_u8(&b, 6); fz_w_u8(&b, 0); fz_w_u8(&b, 5); fz_w_u8(&b, 17);
    fz_w_u8(&b, 0); fz_w_u8(&b, 0); /* call, nothing first: hang-up */
    fz_seed(dir, "sync_calls", &b);

    fz_w_u8(&b, 12);
    fz_seed(dir, "handshake_reject", &b);
    fz_w_u8(&b, 13);
    fz_seed(dir, "handshake_ping", &b);
    fz_w_u8(&b, 14);
    fz_seed(dir, "handshake_garbage", &b);
    fz_w_u8(&b, 15);
    fz_seed(dir, "handshake_hangup", &b);
    fiber_buf_free(&b);
}
