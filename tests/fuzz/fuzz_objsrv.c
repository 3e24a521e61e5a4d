/*
 * fuzz_objsrv.c -- libFuzzer target for the object server
 * (src/objsrv/objsrv.c) and every kind of object it hosts: queues and pipes
 * (queue.c), the manager's dict, list, value, lock, rlock, event,
 * semaphore, barrier, condition and custom objects (mobj_srv.c), and the
 * ring's rendezvous (ring_rdv.c).
 *
 * Each input runs a real server (fb_objsrv_start without a thread, driven
 * one round at a time with fb_objsrv_step) on a unix socket, with three
 * clients that are plain sockets the script writes to.  Clients 0 and 1
 * start authenticated (a valid HELLO), and client 0 opens one object of
 * every kind, so that calls reach the objects at once.  The script is a
 * sequence of commands:
 *
 *   CALL   a well-formed OCALL: client, object, operation, timeout and
 *          items chosen by the input (items raw, int64, u32 or a known
 *          name: kinds, objects, methods); the operation may be the
 *          generic FREE (FB_OP_FREE), which destroys any object but a
 *          rendezvous
 *   RAW    raw bytes on a client's stream
 *   FRAME  a valid header of any type around raw payload bytes
 *   CLOSE  a client goes (and comes back, authenticated)
 *   HELLO  a fresh connection greeting with a valid or a bad HELLO, or
 *          something else
 *   STEP   one more round of the server, which may wait 2 ms for a
 *          deadline to pass
 *   CHECK  asks every queue its size
 *   SHUT   a client half-closes
 *
 * After each command the server runs until it has nothing left to read,
 * and every client's replies are read.  A shadow decoder parses each
 * client's outgoing stream exactly as the server must, which gives the
 * invariants checked (abort() on a violation):
 *   - every reply is a well-formed OREPLY answering a request the client
 *     made and that was not answered yet: no request is answered twice,
 *     none that was never made, none that followed a malformed frame;
 *   - a client whose stream breaks the protocol (bad frame, no HELLO
 *     first, wrong token, a frame other than OCALL) is dropped, and one
 *     that does not is never dropped;
 *   - a call on an object that does not exist fails with FIBER_EINVAL;
 *     answers have the shape their operation promises;
 *   - once a FREE (FB_OP_FREE, or a queue's own) was answered 0, every
 *     call on that object sent afterwards fails with FIBER_ECLOSED;
 *   - a queue's size is never above its capacity, and equals the puts
 *     answered 0 minus the gets answered 0; a semaphore never gives out
 *     more units than it had;
 *   - no crash, no sanitizer report, and no leak once the server stops.
 */
#define FZ_NAME "fuzz_objsrv"
#include "fuzz_util.h"

#include "base/common.h"
#include "net/net.h"
#include "objsrv/objsrv.h"
#include "queue/queue_ops.h"
#include "runtime/runtime.h"

/* Operation numbers: protocol (queue_ops.h, mobj_ops.h, ring_ops.h), never
 * renumbered. */
enum { Q_PUT = FB_OP_KIND, Q_GET, Q_SIZE, Q_CLOSE, Q_TAKEN, Q_ACK, Q_RELEASE,
       Q_FREE };
enum {
    MD_SET = FB_OP_KIND, MD_GET, MD_DEL, MD_LEN, MD_KEYS, ML_APPEND, ML_GET, ML_SET,
    ML_LEN, ML_POP, MV_GET, MV_SET, MV_ADD, MV_CAS, MK_ACQUIRE, MK_RELEASE, MC_WAIT,
    MC_NOTIFY, ME_SET, ME_CLEAR, ME_IS_SET, ME_WAIT, MS_ACQUIRE, MS_RELEASE, MB_WAIT,
    MB_RESET, MU_CALL, MM_SHARE, MK_WAKE, OP_END
};
enum { RDV_JOIN = FB_OP_KIND, RDV_MEMBERS };

#define N_CLIENTS 3
#define MAX_SETTLE 256

/* Custom objects' methods: registered tasks. */
FIBER_TASK(fz_count)
{
    fiber_buf *st;
    if (fiber_manager_state(&st) != 0)
        return fiber_task_fail("no state");
    uint64_t n = 0;
    if (st->len >= 8)
        memcpy(&n, st->data, 8);
    n++;
    st->len = 0;
    if (fiber_buf_append(st, &n, 8) != 0)
        return FIBER_ENOMEM;
    return fiber_buf_append(out, &n, 8);
}

FIBER_TASK(fz_fail) { return fiber_task_fail("method failed (%zu bytes)", len); }

FIBER_TASK(fz_echo) { return fiber_buf_append(out, arg, len); }

/* The objects client 0 opens at the start: ids 1.. in this order. */
struct pre_obj {
    const char *kind, *name;
    uint64_t param; /* 0: none */
    size_t param_len;
};
static const struct pre_obj pre_objs[] = {
    {"queue", "q", 2, 8},       {"queue", "qu", 0, 8},
    {"dict", "d", 0, 0},        {"list", "l", 0, 0},
    {"value", "v", 5, 8},       {"lock", "k", 0, 0},
    {"rlock", "rk", 0, 0},      {"event", "e", 0, 0},
    {"semaphore", "s", 1, 8},   {"barrier", "b", 2, 4},
    {"condition", "c", 0, 0},   {"custom", "u", 0, 8},
    {"rendezvous", "r", 2, 4},
};
#define N_PRE ((int)FB_ARRAY_LEN(pre_objs))
#define OBJ_Q 1
#define OBJ_QU 2
#define OBJ_SEM 9

static const char *const names[] = {
    "queue",  "dict",      "list",    "value",     "lock",   "rlock",
    "event",  "semaphore", "barrier", "condition", "custom", "rendezvous",
    "q",      "d",         "k",       "fz_count",  "fz_fail", "fz_echo",
    "nope",   "",          "unix:/nonexistent/ring0", "tcp:127.0.0.1:1",
};

/* A request the server must answer once. */
struct pend {
    uint64_t id;
    uint32_t obj;
    int32_t op;
    int check; /* a CHECK's size query */
    uint32_t n_items;
    int after_free; /* sent once its object's FREE was answered */
};

struct client {
    struct fb_conn rd;  /* our end: replies are read through it */
    int live;           /* connected (our end open) */
    int shut;           /* we closed our sending side */
    /* The shadow of what the server parses from us. */
    fiber_buf sent;
    size_t parsed;
    int authed; /* the server accepted our HELLO */
    int dead;   /* our stream broke the protocol: the server must drop us */
    int welcomed;
    uint64_t next_id;
    struct pend *pend;
    size_t n_pend, cap_pend;
};

struct state {
    struct fb_objsrv *srv;
    char addr[600];
    struct client cl[N_CLIENTS];
    uint32_t max_payload;
    uint32_t n_objs;       /* the highest object id an OPEN answered */
    uint32_t max_possible; /* objects that may exist: N_PRE + OPENs sent */
    /* models */
    int64_t q_count[3]; /* by object id 1, 2 */
    int64_t sem_value;
    uint8_t freed[256]; /* by object id: a FREE of it was answered 0 */
};

/* ---- the shadow decoder -------------------------------------------------- */

static void pend_add(struct state *st, struct client *c, uint64_t id,
                     uint32_t obj, int32_t op, int check, uint32_t n_items)
{
    if (c->n_pend == c->cap_pend) {
        c->cap_pend = c->cap_pend ? 2 * c->cap_pend : 16;
        c->pend = realloc(c->pend, c->cap_pend * sizeof *c->pend);
        FZ_REQUIRE(c->pend, "out of memory");
    }
    int after_free = obj < sizeof st->freed && st->freed[obj];
    c->pend[c->n_pend++] =
        (struct pend){id, obj, op, check, n_items, after_free};
}

/* Parses what the server has been sent and not yet parsed, as the server
 * does (fb_conn_next, then check_hello or serve); notes each OCALL. */
static void shadow_parse(struct state *st, struct client *c)
{
    while (!c->dead && c->sent.data) {
        const uint8_t *p = c->sent.data + c->parsed;
        size_t avail = c->sent.len - c->parsed;
        struct fb_wire_hdr h;
        uint32_t max = c->authed ? st->max_payload : 1024u;
        int rc = fb_wire_hdr_decode(p, avail, max, &h, NULL, 0);
        if (rc == 1)
            return;
        if (rc == 0 && avail - FB_WIRE_HDR_LEN < h.len)
            return;
        if (rc == 0)
            rc = fb_wire_check_payload(&h, p + FB_WIRE_HDR_LEN, NULL, 0);
        if (rc != 0) {
            c->dead = 1;
            return;
        }
        const uint8_t *pl = p + FB_WIRE_HDR_LEN;
        c->parsed += FB_WIRE_HDR_LEN + h.len;
        if (!c->authed) {
            struct fb_msg_hello m;
            const char *bid = fb_rt_build_id();
            if (h.type != FB_MSG_HELLO ||
                fb_wire_get_hello(pl, h.len, &m, NULL, 0) != 0 ||
                memcmp(m.token, fb_rt_token(), FB_WIRE_TOKEN_LEN) != 0 ||
                m.build_id_len != strlen(bid) ||
                memcmp(m.build_id, bid, m.build_id_len) != 0)
                c->dead = 1;
            else
                c->authed = 1;
            continue;
        }
        if (h.type != FB_MSG_OCALL) {
            c->dead = 1;
            return;
        }
        struct fb_msg_ocall m;
        fb_wire_get_ocall(pl, h.len, &m, NULL, 0);
        pend_add(st, c, h.id, m.obj, h.code, 0, m.count);
        if ((m.obj == OBJ_Q || m.obj == OBJ_QU) && h.code == Q_PUT)
            st->q_count[m.obj] += m.count;
        if (m.obj == 0 && h.code == FB_OP_OPEN)
            st->max_possible++; /* a failed create uses up an id too */
    }
}

/* Sends bytes on client i's stream and tells the shadow. */
static void client_send(struct state *st, int i, const void *p, size_t n)
{
    struct client *c = &st->cl[i];
    if (!c->live || c->shut || n == 0)
        return;
    size_t sent = fz_send(fb_conn_fd(&c->rd), p, n);
    fz_w_bytes(&c->sent, p, sent);
    shadow_parse(st, c);
}

/* ---- connecting -------------------------------------------------------- */

static void client_close(struct client *c)
{
    fb_conn_close(&c->rd);
    c->live = c->shut = c->authed = c->dead = c->welcomed = 0;
    c->sent.len = c->parsed = 0;
    c->n_pend = 0;
}

enum hello_kind { H_VALID, H_TOKEN, H_BUILD, H_OTHER, H_SILENT, H_COUNT };

static void put_hello(fiber_buf *b, enum hello_kind kind)
{
    const char *bid = kind == H_BUILD ? "0123abcd" : fb_rt_build_id();
    char name[] = "fuzz";
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .pid = 1,
                             .name = name,
                             .name_len = 4};
    memcpy(h.token, fb_rt_token(), FB_WIRE_TOKEN_LEN);
    if (kind == H_TOKEN)
        h.token[7] ^= 1;
    if (kind == H_OTHER)
        fb_wire_put_ping(b, 1);
    else
        fb_wire_put_hello(b, &h);
}

static void settle(struct state *st);
static void drain(struct state *st);

/* (Re)connects client i and greets with a HELLO of the given kind. */
static void client_open(struct state *st, int i, enum hello_kind kind)
{
    struct client *c = &st->cl[i];
    if (c->live)
        client_close(c);
    int fd;
    if (fb_sock_dial(st->addr, fb_deadline_ms(1000), &fd) != 0)
        FZ_REQUIRE(0, "cannot dial the server: %s", fiber_last_error());
    fb_conn_init(&c->rd, fd, 1u << 30);
    c->live = 1;
    c->next_id = 1;
    if (kind != H_SILENT) {
        fiber_buf b = {0};
        put_hello(&b, kind);
        client_send(st, i, b.data, b.len);
        fiber_buf_free(&b);
    }
}

/* A live, authenticated client i (reconnected if it is not). */
static void client_ready(struct state *st, int i)
{
    struct client *c = &st->cl[i];
    if (c->live && !c->shut && c->authed && !c->dead)
        return;
    client_open(st, i, H_VALID);
    settle(st);
    drain(st);
}

/* ---- running the server and reading replies --------------------------- */

static void settle(struct state *st)
{
    for (int k = 0; k < MAX_SETTLE; k++)
        if (fb_objsrv_step(st->srv, 0) == 0)
            return;
    FZ_REQUIRE(0, "the server is still busy after %d rounds", MAX_SETTLE);
}

static int is_queue(uint32_t obj) { return obj == OBJ_Q || obj == OBJ_QU; }

/* Checks one reply to request r of client c. */
static void check_reply(struct state *st, const struct pend *r,
                        const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fb_msg_oreply m;
    FZ_REQUIRE(fb_wire_get_oreply(p, h->len, h->code, &m, NULL, 0) == 0,
               "undecodable OREPLY");
    int status = h->code;
    FZ_REQUIRE(status <= 0 && status >= FIBER_ENOKEY,
               "status %d is not a fiber code", status);
    const uint8_t *cur = m.items;
    const void *item0 = NULL;
    uint32_t len0 = 0;
    if (m.count > 0)
        fb_wire_task_next(&cur, &item0, &len0);
    int cannot_exist = r->obj == 0 || r->obj > st->max_possible;
    if (cannot_exist && !(r->obj == 0 && r->op == FB_OP_OPEN))
        FZ_REQUIRE(status == FIBER_EINVAL,
                   "a call on missing object %u answered %d", r->obj, status);
    if (r->after_free)
        FZ_REQUIRE(status == FIBER_ECLOSED,
                   "a call on freed object %u answered %d", r->obj, status);
    if (status == 0 && r->obj < sizeof st->freed &&
        (r->op == FB_OP_FREE || (is_queue(r->obj) && r->op == Q_FREE)))
        st->freed[r->obj] = 1;
    if (r->obj == 0 && r->op == FB_OP_OPEN && status == 0) {
        uint32_t id;
        FZ_REQUIRE(m.count == 1 && len0 == 4, "OPEN answered without an id");
        memcpy(&id, item0, 4);
        FZ_REQUIRE(id >= 1 && id <= st->max_possible, "OPEN gave id %u",
                   id);
        if (id > st->n_objs)
            st->n_objs = id;
    }
    if (is_queue(r->obj) && status == 0) {
        /* Items leave a queue only when a consumer marks them taken
         * (TAKEN, ACK: posted, never answered), so the model counts the
         * items sent in puts (a put may be partly in while it waits for
         * room): the size can never be above it. */
        if (r->op == Q_GET)
            FZ_REQUIRE(m.count >= 1 && len0 == 16 &&
                           m.count - 1 <= FB_QGET_MAX,
                       "a get answered %u items", m.count);
        if (r->op == Q_SIZE) {
            uint64_t n;
            FZ_REQUIRE(m.count == 1 && len0 == 8, "size without a size");
            memcpy(&n, item0, 8);
            FZ_REQUIRE(r->obj != OBJ_Q || n <= 2, "queue holds %llu > 2",
                       (unsigned long long)n);
            if (r->check)
                FZ_REQUIRE((int64_t)n <= st->q_count[r->obj],
                           "queue %u: size %llu, but only %lld items were "
                           "sent in puts",
                           r->obj, (unsigned long long)n,
                           (long long)st->q_count[r->obj]);
        }
    }
    if (r->obj == OBJ_SEM && status == 0) {
        if (r->op == MS_ACQUIRE)
            st->sem_value--;
        if (r->op == MS_RELEASE)
            st->sem_value++;
    }
    int one_i64 = r->obj > 2 && r->obj <= (uint32_t)N_PRE &&
                  (r->op == MD_LEN || r->op == ML_LEN || r->op == MV_GET ||
                   r->op == MV_ADD || r->op == MV_CAS || r->op == ME_IS_SET ||
                   r->op == MB_WAIT);
    if (one_i64 && status == 0) {
        const char *kind = pre_objs[r->obj - 1].kind;
        int match = (r->op == MD_LEN && !strcmp(kind, "dict")) ||
                    (r->op == ML_LEN && !strcmp(kind, "list")) ||
                    (r->op >= MV_GET && r->op <= MV_CAS && !strcmp(kind, "value")) ||
                    (r->op == ME_IS_SET && !strcmp(kind, "event")) ||
                    (r->op == MB_WAIT && !strcmp(kind, "barrier"));
        if (match && r->op != MV_SET)
            FZ_REQUIRE(m.count == 1 && len0 == 8,
                       "op %d answered without an int64", r->op);
    }
}

static void take_reply(struct state *st, struct client *c,
                       const struct fb_wire_hdr *h, const uint8_t *p)
{
    FZ_REQUIRE(h->type == FB_MSG_OREPLY, "server sent %s to a client",
               fb_msg_type_name(h->type));
    for (size_t k = 0; k < c->n_pend; k++) {
        if (c->pend[k].id != h->id)
            continue;
        struct pend r = c->pend[k];
        c->pend[k] = c->pend[--c->n_pend];
        if (fz_trace())
            fprintf(stderr, "client %d: reply %llu obj %u op %d: %s\n",
                    (int)(c - st->cl), (unsigned long long)h->id, r.obj, r.op,
                    fiber_errname(h->code));
        check_reply(st, &r, h, p);
        return;
    }
    FZ_REQUIRE(0, "reply %llu answers no pending request",
               (unsigned long long)h->id);
}

/* Reads every client's replies; checks who was dropped. */
static void drain(struct state *st)
{
    for (int i = 0; i < N_CLIENTS; i++) {
        struct client *c = &st->cl[i];
        if (!c->live)
            continue;
        int closed = 0;
        for (;;) {
            size_t had = fb_conn_buffered(&c->rd);
            int rc = fb_conn_read(&c->rd);
            int read_some = fb_conn_buffered(&c->rd) != had;
            struct fb_wire_hdr h;
            const uint8_t *p;
            int got;
            while ((got = fb_conn_next(&c->rd, &h, &p)) == 1) {
                if (!c->welcomed) {
                    FZ_REQUIRE(h.type == FB_MSG_WELCOME ||
                                   h.type == FB_MSG_REJECT,
                               "first answer was %s",
                               fb_msg_type_name(h.type));
                    FZ_REQUIRE(h.type == FB_MSG_REJECT || c->authed,
                               "WELCOME for a bad HELLO");
                    c->welcomed = h.type == FB_MSG_WELCOME;
                    if (h.type == FB_MSG_REJECT)
                        FZ_REQUIRE(c->dead, "REJECT for a valid HELLO");
                    continue;
                }
                take_reply(st, c, &h, p);
            }
            FZ_REQUIRE(got == 0, "server sent a malformed frame: %s",
                       fb_conn_err(&c->rd));
            if (rc == FIBER_ECLOSED || rc == FIBER_ESYS) {
                closed = 1;
                break;
            }
            if (!read_some)
                break; /* the socket is empty */
        }
        if (closed) {
            /* (an unauthenticated one may have outstayed its
             * connect_timeout_ms on a slow machine) */
            FZ_REQUIRE(c->dead || c->shut || !c->authed,
                       "server dropped client %d, which kept the protocol",
                       i);
            client_close(c);
        } else {
            FZ_REQUIRE(!c->dead,
                       "client %d broke the protocol and was not dropped",
                       i);
        }
    }
    FZ_REQUIRE(st->sem_value >= 0, "semaphore gave out more than it had");
}

/* ---- commands ----------------------------------------------------------- */

/* Appends one item of the kind the input picks. */
static void read_item(struct fz_in *in, fiber_iov *it, uint8_t *scratch,
                      size_t *used)
{
    uint8_t sel = fz_u8(in);
    uint8_t *p = scratch + *used;
    size_t n = 0;
    switch (sel % 4) {
    case 0: {
        const uint8_t *b = fz_bytes(in, fz_u8(in), &n);
        memcpy(p, b, n);
        break;
    }
    case 1: {
        int64_t v = (int8_t)fz_u8(in);
        memcpy(p, &v, 8);
        n = 8;
        break;
    }
    case 2: {
        uint32_t v = fz_u8(in);
        memcpy(p, &v, 4);
        n = 4;
        break;
    }
    case 3: {
        const char *s = names[fz_u8(in) % FB_ARRAY_LEN(names)];
        n = strlen(s);
        memcpy(p, s, n);
        break;
    }
    }
    *it = (fiber_iov){p, n};
    *used += n;
}

static int timeout_of(uint8_t sel)
{
    switch (sel % 4) {
    case 0: return -1;
    case 1: return 0;
    case 2: return 0;
    default: return 2;
    }
}

/* Sends a well-formed OCALL on client i. */
static void send_call(struct state *st, int i, uint32_t obj, int32_t op,
                      int timeout, const fiber_iov *items, size_t n)
{
    struct client *c = &st->cl[i];
    fiber_buf b = {0};
    uint64_t id = c->next_id++;
    FZ_REQUIRE(fb_wire_put_ocall(&b, id, op, obj, timeout, items, n) == 0,
               "OCALL encode");
    client_send(st, i, b.data, b.len);
    fiber_buf_free(&b);
}

static void cmd_call(struct state *st, struct fz_in *in)
{
    int i = fz_u8(in) % N_CLIENTS;
    uint8_t target = fz_u8(in), opsel = fz_u8(in), tsel = fz_u8(in);
    uint32_t n = fz_u8(in) % 5;
    uint32_t obj = target < 0xf0 ? target % (st->n_objs + 1) : target;
    int32_t op;
    if (opsel >= 0xe0)
        op = (int8_t)opsel; /* unknown, negative, or OPEN (-1 + 2) */
    else if (obj == 0)
        op = FB_OP_OPEN;
    else
        op = FB_OP_KIND + opsel % (OP_END - FB_OP_KIND + 1);
    if (opsel == 0xff)
        op = FB_OP_OPEN;
    if (opsel == 0xdf && obj != 0)
        op = FB_OP_FREE;
    fiber_iov items[4];
    uint8_t scratch[4 * 256];
    size_t used = 0;
    for (uint32_t k = 0; k < n; k++)
        read_item(in, &items[k], scratch, &used);
    client_ready(st, i);
    send_call(st, i, obj, op, timeout_of(tsel), items, n);
}

static void cmd_raw(struct state *st, struct fz_in *in)
{
    int i = fz_u8(in) % N_CLIENTS;
    size_t n;
    const uint8_t *b = fz_bytes(in, fz_u16(in) % 2048, &n);
    if (!st->cl[i].live)
        client_ready(st, i);
    client_send(st, i, b, n);
}

static void cmd_frame(struct state *st, struct fz_in *in)
{
    int i = fz_u8(in) % N_CLIENTS;
    struct fb_wire_hdr h = {0};
    h.type = fz_u8(in) % (FB_MSG_NOTE + 2);
    h.code = (int32_t)fz_u32(in);
    h.id = fz_u8(in);
    size_t n;
    const uint8_t *b = fz_bytes(in, fz_u16(in) % 2048, &n);
    h.len = (uint32_t)n;
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    fiber_buf f = {0};
    fz_w_bytes(&f, hdr, sizeof hdr);
    fz_w_bytes(&f, b, n);
    if (!st->cl[i].live)
        client_ready(st, i);
    client_send(st, i, f.data, f.len);
    fiber_buf_free(&f);
}

/* A CHECK: every queue's size, alone, at a quiet moment. */
static void cmd_check(struct state *st)
{
    struct client *c = &st->cl[0];
    if (c->parsed != c->sent.len)
        client_close(c); /* half a frame sent: the query would extend it */
    client_ready(st, 0);
    for (uint32_t obj = OBJ_Q; obj <= OBJ_QU; obj++) {
        fiber_buf b = {0};
        uint64_t id = c->next_id++;
        fb_wire_put_ocall(&b, id, Q_SIZE, obj, 0, NULL, 0);
        /* Registered by hand, marked as a check, not by the shadow. */
        size_t sent = fz_send(fb_conn_fd(&c->rd), b.data, b.len);
        FZ_REQUIRE(sent == b.len, "socket full");
        fz_w_bytes(&c->sent, b.data, b.len);
        c->parsed += b.len;
        pend_add(st, c, id, obj, Q_SIZE, 1, 0);
        fiber_buf_free(&b);
    }
}

static void run_command(struct state *st, struct fz_in *in)
{
    uint8_t cmd = fz_u8(in);
    int i;
    switch (cmd % 8) {
    case 0:
        cmd_call(st, in);
        break;
    case 1:
        cmd_raw(st, in);
        break;
    case 2:
        cmd_frame(st, in);
        break;
    case 3:
        i = fz_u8(in) % N_CLIENTS;
        if (st->cl[i].live)
            client_close(&st->cl[i]);
        settle(st);
        client_open(st, i, H_VALID);
        break;
    case 4:
        i = fz_u8(in) % N_CLIENTS;
        client_open(st, i, (enum hello_kind)(fz_u8(in) % H_COUNT));
        break;
    case 5: /* lets short deadlines pass, now and then */
        fb_objsrv_step(st->srv, fz_u8(in) % 4 == 0 ? 2 : 0);
        break;
    case 6:
        cmd_check(st);
        break;
    case 7:
        i = fz_u8(in) % N_CLIENTS;
        if (st->cl[i].live && !st->cl[i].shut) {
            shutdown(fb_conn_fd(&st->cl[i].rd), SHUT_WR);
            st->cl[i].shut = 1;
        }
        break;
    }
    settle(st);
    drain(st);
}

/* ---- one input -------------------------------------------------------- */

static void open_pre_objects(struct state *st)
{
    for (int k = 0; k < N_PRE; k++) {
        const struct pre_obj *o = &pre_objs[k];
        fiber_iov items[3] = {{o->kind, strlen(o->kind)},
                              {o->name, strlen(o->name)},
                              {&o->param, o->param_len}};
        send_call(st, 0, 0, FB_OP_OPEN, -1, items, 3);
    }
    settle(st);
    drain(st);
    FZ_REQUIRE(st->n_objs == (uint32_t)N_PRE, "opened %u objects, want %d",
               st->n_objs, N_PRE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fz_setup();
    struct state st = {.max_payload = fb_rt_config()->max_message_bytes,
                       .sem_value = 1};
    char want[600];
    snprintf(want, sizeof want, "unix:%s/objsrv.sock", dir);
    FZ_REQUIRE(fb_objsrv_start(&st.srv, want, fb_rt_token(),
                               fb_rt_build_id(), 0) == 0,
               "cannot start a server: %s", fiber_last_error());
    fb_strlcpy(st.addr, fb_objsrv_address(st.srv), sizeof st.addr);
    client_open(&st, 0, H_VALID);
    client_open(&st, 1, H_VALID);
    settle(&st);
    drain(&st);
    open_pre_objects(&st);

    struct fz_in in = {data, size};
    while (fz_more(&in))
        run_command(&st, &in);

    /* Every client goes; the objects hear of it; then the server stops. */
    for (int i = 0; i < N_CLIENTS; i++)
        if (st.cl[i].live)
            client_close(&st.cl[i]);
    settle(&st);
    fb_objsrv_stop(st.srv);
    for (int i = 0; i < N_CLIENTS; i++) {
        fiber_buf_free(&st.cl[i].sent);
        free(st.cl[i].pend);
    }
    return 0;
}

/* ---- seeds ------------------------------------------------------------ */

/* Writers for the commands above. */
struct seed_item {
    int sel;         /* 0 raw, 1 int64, 2 u32, 3 name */
    const char *raw; /* sel 0 */
    int v;           /* sel 1, 2: the value; sel 3: the index in names */
};

static void w_call(fiber_buf *b, int client, int obj, int op, int tsel,
                   int n, const struct seed_item *items)
{
    fz_w_u8(b, 0);
    fz_w_u8(b, client);
    fz_w_u8(b, obj);
    fz_w_u8(b, obj == 0        ? 0
               : op == FB_OP_FREE ? 0xdf
               : op < 0           ? 0xe0 + (op & 0x1f)
                                  : op - FB_OP_KIND);
    fz_w_u8(b, tsel);
    fz_w_u8(b, n);
    for (int k = 0; k < n; k++) {
        fz_w_u8(b, items[k].sel);
        if (items[k].sel == 0) {
            fz_w_u8(b, strlen(items[k].raw));
            fz_w_bytes(b, items[k].raw, strlen(items[k].raw));
        } else {
            fz_w_u8(b, items[k].v);
        }
    }
}

static int name_index(const char *s)
{
    for (size_t k = 0; k < FB_ARRAY_LEN(names); k++)
        if (!strcmp(names[k], s))
            return (int)k;
    abort();
}

#define RAW(s) {0, s, 0}
#define I64(x) {1, NULL, x}
#define U32(x) {2, NULL, x}
#define NAME(s) {3, NULL, name_index(s)}
#define ITEMS(...) (sizeof((struct seed_item[]){__VA_ARGS__}) /               \
                    sizeof(struct seed_item)), (struct seed_item[]){__VA_ARGS__}
#define NONE 0, NULL
#define FOREVER 0
#define NOW 1
#define SHORT 3

static void w_close(fiber_buf *b, int client)
{
    fz_w_u8(b, 3);
    fz_w_u8(b, client);
}

static void w_check(fiber_buf *b) { fz_w_u8(b, 6); }
static void w_step(fiber_buf *b)
{
    fz_w_u8(b, 5);
    fz_w_u8(b, 0); /* waits */
}

void fuzz_write_seeds(const char *dir)
{
    fiber_buf b = {0};

    w_call(&b, 0, 1, Q_PUT, NOW, ITEMS(RAW("hello")));
    w_call(&b, 0, 1, Q_PUT, NOW, ITEMS(RAW("world")));
    w_call(&b, 0, 1, Q_PUT, NOW, ITEMS(RAW("full")));
    w_call(&b, 1, 1, Q_GET, NOW, NONE);
    w_call(&b, 1, 1, Q_SIZE, NOW, NONE);
    w_check(&b);
    fz_seed(dir, "queue_put_get", &b);

    w_call(&b, 0, 1, Q_PUT, FOREVER, ITEMS(RAW("a")));
    w_call(&b, 0, 1, Q_PUT, FOREVER, ITEMS(RAW("b")));
    w_call(&b, 0, 1, Q_PUT, FOREVER, ITEMS(RAW("c")));
    w_call(&b, 1, 1, Q_PUT, SHORT, ITEMS(RAW("d")));
    w_call(&b, 1, 1, Q_GET, FOREVER, NONE);
    w_call(&b, 2, 2, Q_GET, FOREVER, NONE);
    w_call(&b, 0, 2, Q_PUT, FOREVER, ITEMS(RAW("to the getter")));
    w_close(&b, 0);
    w_check(&b);
    w_call(&b, 1, 1, Q_CLOSE, FOREVER, NONE);
    w_call(&b, 1, 1, Q_GET, FOREVER, NONE);
    w_call(&b, 1, 1, Q_GET, FOREVER, NONE);
    w_call(&b, 1, 1, Q_PUT, FOREVER, ITEMS(RAW("closed")));
    w_call(&b, 1, 1, Q_PUT, FOREVER, ITEMS(RAW("x"), RAW("y")));
    w_call(&b, 1, 1, OP_END, NOW, NONE); /* no such operation */
    w_check(&b);
    fz_seed(dir, "queue_parked_close", &b);

    /* Lending and taking (queue_srv.c): gets with a window, a refill, a
     * lease, takes and acks right and wrong, a mark page name that is
     * not one, a release, and the queue freed under a parked getter. */
    w_call(&b, 0, 1, Q_PUT, FOREVER, ITEMS(RAW("a"), RAW("b"), RAW("c")));
    w_call(&b, 1, 1, Q_GET, NOW, ITEMS(U32(7), U32(2), U32(0)));
    w_call(&b, 1, 1, Q_TAKEN, NOW, ITEMS(U32(7), I64(0), U32(0)));
    w_call(&b, 1, 1, Q_TAKEN, NOW, ITEMS(U32(7), I64(1), U32(1)));
    w_call(&b, 1, 1, Q_TAKEN, NOW, ITEMS(U32(7), I64(9), U32(0)));
    w_call(&b, 1, 1, Q_ACK, NOW, ITEMS(U32(7), I64(1)));
    w_call(&b, 1, 1, Q_ACK, NOW, ITEMS(U32(7), I64(1)));
    w_call(&b, 1, 1, Q_GET, NOW, ITEMS(U32(7), U32(5), U32(1)));
    w_call(&b, 2, 1, Q_GET, SHORT,
           ITEMS(U32(8), U32(1), U32(0), RAW("qack-../../x")));
    w_call(&b, 2, 1, Q_GET, NOW, ITEMS(U32(9), U32(0), U32(0)));
    w_check(&b);
    w_call(&b, 1, 1, Q_RELEASE, NOW, ITEMS(U32(7)));
    w_check(&b);
    w_call(&b, 2, 2, Q_GET, FOREVER, ITEMS(U32(1), U32(64), U32(0)));
    w_call(&b, 0, 2, Q_FREE, NOW, NONE);
    w_call(&b, 0, 2, Q_PUT, NOW, ITEMS(RAW("after free")));
    w_step(&b);
    fz_seed(dir, "queue_lend_take", &b);

    w_call(&b, 0, 3, MD_SET, NOW, ITEMS(RAW("k1"), RAW("v1")));
    w_call(&b, 0, 3, MD_SET, NOW, ITEMS(RAW("k2"), RAW("v2")));
    w_call(&b, 0, 3, MD_SET, NOW, ITEMS(RAW("k1"), RAW("v3")));
    w_call(&b, 1, 3, MD_GET, NOW, ITEMS(RAW("k1")));
    w_call(&b, 1, 3, MD_GET, NOW, ITEMS(RAW("missing")));
    w_call(&b, 1, 3, MD_DEL, NOW, ITEMS(RAW("k2")));
    w_call(&b, 1, 3, MD_DEL, NOW, ITEMS(RAW("k2")));
    w_call(&b, 1, 3, MD_LEN, NOW, NONE);
    w_call(&b, 1, 3, MD_KEYS, NOW, NONE);
    w_call(&b, 1, 3, MD_SET, NOW, ITEMS(RAW("only a key")));
    w_call(&b, 1, 3, ML_APPEND, NOW, ITEMS(RAW("not a list")));
    fz_seed(dir, "dict", &b);

    w_call(&b, 0, 4, ML_APPEND, NOW, ITEMS(RAW("a")));
    w_call(&b, 0, 4, ML_APPEND, NOW, ITEMS(RAW("b")));
    w_call(&b, 0, 4, ML_GET, NOW, ITEMS(I64(-1)));
    w_call(&b, 0, 4, ML_SET, NOW, ITEMS(I64(0), RAW("z")));
    w_call(&b, 0, 4, ML_POP, NOW, ITEMS(I64(0)));
    w_call(&b, 0, 4, ML_GET, NOW, ITEMS(I64(7)));
    w_call(&b, 0, 4, ML_GET, NOW, ITEMS(U32(0)));
    w_call(&b, 0, 4, ML_LEN, NOW, NONE);
    fz_seed(dir, "list", &b);

    w_call(&b, 0, 5, MV_GET, NOW, NONE);
    w_call(&b, 0, 5, MV_SET, NOW, ITEMS(I64(-3)));
    w_call(&b, 0, 5, MV_ADD, NOW, ITEMS(I64(10)));
    w_call(&b, 0, 5, MV_CAS, NOW, ITEMS(I64(7), I64(1)));
    w_call(&b, 0, 5, MV_CAS, NOW, ITEMS(I64(5), I64(1)));
    w_call(&b, 0, 5, MV_ADD, NOW, ITEMS(U32(1)));
    fz_seed(dir, "value", &b);

    w_call(&b, 0, 6, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 1, 6, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 2, 6, MK_ACQUIRE, NOW, ITEMS(I64(2)));
    w_call(&b, 2, 6, MK_ACQUIRE, SHORT, ITEMS(I64(2)));
    w_step(&b);
    w_close(&b, 0);
    w_call(&b, 1, 6, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 1, 6, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 1, 6, MC_WAIT, NOW, ITEMS(I64(1)));
    fz_seed(dir, "lock_passes_on", &b);

    w_call(&b, 0, 7, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 0, 7, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 0, 7, MK_ACQUIRE, FOREVER, ITEMS(I64(2)));
    w_call(&b, 1, 7, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 0, 7, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 0, 7, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 0, 7, MK_RELEASE, NOW, ITEMS(I64(2)));
    fz_seed(dir, "rlock", &b);

    /* Shared memory (mshm.h): the segments asked for, with and without
     * arguments, of kinds that have none; a posted wake with nothing
     * parked, and one with an acquire parked. */
    w_call(&b, 0, 3, MM_SHARE, NOW, NONE);
    w_call(&b, 0, 5, MM_SHARE, NOW, ITEMS(I64(1)));
    w_call(&b, 1, 6, MM_SHARE, NOW, NONE);
    w_call(&b, 1, 1, MM_SHARE, NOW, NONE);
    w_call(&b, 1, 6, MK_WAKE, NOW, NONE);
    w_call(&b, 0, 6, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 1, 6, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 2, 6, MK_WAKE, NOW, ITEMS(RAW("junk")));
    w_call(&b, 2, 3, MK_WAKE, NOW, NONE);
    w_call(&b, 0, 6, MK_RELEASE, NOW, ITEMS(I64(1)));
    fz_seed(dir, "shared_memory", &b);

    w_call(&b, 0, 8, ME_WAIT, FOREVER, NONE);
    w_call(&b, 1, 8, ME_WAIT, NOW, NONE);
    w_call(&b, 1, 8, ME_IS_SET, NOW, NONE);
    w_call(&b, 1, 8, ME_SET, NOW, NONE);
    w_call(&b, 1, 8, ME_WAIT, NOW, NONE);
    w_call(&b, 1, 8, ME_CLEAR, NOW, NONE);
    w_call(&b, 2, 8, ME_WAIT, SHORT, NONE);
    w_step(&b);
    fz_seed(dir, "event", &b);

    w_call(&b, 0, 9, MS_ACQUIRE, FOREVER, NONE);
    w_call(&b, 1, 9, MS_ACQUIRE, FOREVER, NONE);
    w_call(&b, 2, 9, MS_ACQUIRE, NOW, NONE);
    w_call(&b, 0, 9, MS_RELEASE, NOW, NONE);
    w_call(&b, 0, 9, MS_RELEASE, NOW, NONE);
    w_call(&b, 0, 9, MS_ACQUIRE, NOW, NONE);
    fz_seed(dir, "semaphore", &b);

    w_call(&b, 0, 10, MB_WAIT, FOREVER, NONE);
    w_call(&b, 1, 10, MB_WAIT, FOREVER, NONE);
    w_call(&b, 0, 10, MB_WAIT, FOREVER, NONE);
    w_call(&b, 1, 10, MB_WAIT, NOW, NONE);
    w_call(&b, 1, 10, MB_WAIT, NOW, NONE);
    w_call(&b, 1, 10, MB_RESET, NOW, NONE);
    w_call(&b, 2, 10, MB_WAIT, SHORT, NONE);
    w_step(&b);
    fz_seed(dir, "barrier", &b);

    w_call(&b, 0, 11, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 0, 11, MC_WAIT, FOREVER, ITEMS(I64(1)));
    w_call(&b, 1, 11, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 1, 11, MC_NOTIFY, NOW, ITEMS(I64(1), I64(-1)));
    w_call(&b, 1, 11, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 0, 11, MC_WAIT, SHORT, ITEMS(I64(1)));
    w_step(&b);
    w_call(&b, 0, 11, MC_WAIT, NOW, ITEMS(I64(1)));
    w_call(&b, 2, 11, MC_NOTIFY, NOW, ITEMS(I64(1), I64(1)));
    w_close(&b, 0);
    fz_seed(dir, "condition", &b);

    w_call(&b, 0, 12, MU_CALL, NOW, ITEMS(NAME("fz_count"), RAW("")));
    w_call(&b, 0, 12, MU_CALL, NOW, ITEMS(NAME("fz_count"), RAW("")));
    w_call(&b, 0, 12, MU_CALL, NOW, ITEMS(NAME("fz_fail"), RAW("why")));
    w_call(&b, 0, 12, MU_CALL, NOW, ITEMS(NAME("fz_echo"), RAW("echo")));
    w_call(&b, 0, 12, MU_CALL, NOW, ITEMS(NAME("nope"), RAW("")));
    w_call(&b, 0, 12, MU_CALL, NOW, ITEMS(NAME(""), RAW("")));
    fz_seed(dir, "custom", &b);

    w_call(&b, 0, 13, RDV_JOIN, FOREVER,
           ITEMS(U32(0), NAME("unix:/nonexistent/ring0")));
    w_call(&b, 1, 13, RDV_MEMBERS, NOW, NONE);
    w_call(&b, 1, 13, RDV_JOIN, FOREVER, ITEMS(U32(0), NAME("tcp:127.0.0.1:1")));
    w_call(&b, 1, 13, RDV_JOIN, FOREVER, ITEMS(U32(5), NAME("tcp:127.0.0.1:1")));
    w_call(&b, 1, 13, RDV_JOIN, FOREVER, ITEMS(U32(1), NAME("tcp:127.0.0.1:1")));
    w_call(&b, 1, 13, RDV_JOIN, FOREVER, ITEMS(U32(1), NAME("tcp:127.0.0.1:1")));
    w_call(&b, 1, 13, RDV_MEMBERS, NOW, NONE);
    fz_seed(dir, "rendezvous", &b);

    w_call(&b, 0, 13, RDV_JOIN, FOREVER,
           ITEMS(U32(1), NAME("unix:/nonexistent/ring0")));
    w_close(&b, 0);
    w_call(&b, 1, 13, RDV_JOIN, NOW, ITEMS(U32(0), NAME("tcp:127.0.0.1:1")));
    fz_seed(dir, "rendezvous_member_leaves", &b);

    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("queue"), RAW("new"), I64(4)));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("dict"), NAME("q")));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("nope"), RAW("n")));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("queue")));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("barrier"), RAW("b0"), U32(0)));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("semaphore"), RAW("s0"), I64(-1)));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("rendezvous"), RAW("r0"), U32(0)));
    w_call(&b, 0, 14, Q_PUT, NOW, ITEMS(RAW("in the new queue")));
    w_call(&b, 0, 0xf5, Q_GET, NOW, NONE);
    fz_seed(dir, "open", &b);

    /* Freeing objects (FB_OP_FREE, objsrv.c): the calls parked on them
     * fail with FIBER_ECLOSED, later calls too, a rendezvous refuses,
     * and a name freed opens a new object. */
    w_call(&b, 0, 6, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 1, 6, MK_ACQUIRE, FOREVER, ITEMS(I64(2)));
    w_call(&b, 0, 11, MK_ACQUIRE, FOREVER, ITEMS(I64(1)));
    w_call(&b, 0, 11, MC_WAIT, FOREVER, ITEMS(I64(1)));
    w_call(&b, 1, 10, MB_WAIT, FOREVER, NONE);
    w_call(&b, 2, 8, ME_WAIT, SHORT, NONE);
    w_call(&b, 2, 1, Q_GET, FOREVER, ITEMS(U32(3), U32(8), U32(0)));
    w_call(&b, 2, 6, FB_OP_FREE, NOW, ITEMS(RAW("no arguments")));
    w_check(&b);
    w_call(&b, 2, 6, FB_OP_FREE, NOW, NONE);
    w_call(&b, 2, 11, FB_OP_FREE, NOW, NONE);
    w_call(&b, 2, 10, FB_OP_FREE, NOW, NONE);
    w_call(&b, 0, 8, FB_OP_FREE, NOW, NONE);
    w_call(&b, 0, 1, FB_OP_FREE, NOW, NONE);
    w_call(&b, 0, 13, FB_OP_FREE, NOW, NONE);
    w_check(&b);
    w_call(&b, 0, 6, MK_RELEASE, NOW, ITEMS(I64(1)));
    w_call(&b, 1, 6, FB_OP_FREE, NOW, NONE);
    w_call(&b, 1, 1, Q_PUT, NOW, ITEMS(RAW("after free")));
    w_call(&b, 1, 3, MD_SET, NOW, ITEMS(RAW("k"), RAW("v")));
    w_call(&b, 1, 3, FB_OP_FREE, NOW, NONE);
    w_call(&b, 1, 3, MD_GET, NOW, ITEMS(RAW("k")));
    w_call(&b, 0, 0, FB_OP_OPEN, NOW, ITEMS(NAME("dict"), NAME("d")));
    w_call(&b, 0, 14, MD_GET, NOW, ITEMS(RAW("k")));
    w_call(&b, 0, 14, FB_OP_FREE, NOW, NONE);
    w_step(&b);
    fz_seed(dir, "free", &b);

    /* Hostile clients. */
    fz_w_u8(&b, 4); fz_w_u8(&b, 2); fz_w_u8(&b, H_TOKEN);
    fz_w_u8(&b, 4); fz_w_u8(&b, 2); fz_w_u8(&b, H_BUILD);
    fz_w_u8(&b, 4); fz_w_u8(&b, 2); fz_w_u8(&b, H_OTHER);
    fz_w_u8(&b, 4); fz_w_u8(&b, 2); fz_w_u8(&b, H_SILENT);
    fz_w_u8(&b, 1); fz_w_u8(&b, 2); fz_w_u16(&b, 8);
    fz_w_bytes(&b, "GET / HT", 8);
    fz_w_u8(&b, 2); fz_w_u8(&b, 1); fz_w_u8(&b, FB_MSG_PING); fz_w_u32(&b, 0);
    fz_w_u8(&b, 1); fz_w_u16(&b, 0);
    fz_w_u8(&b, 2); fz_w_u8(&b, 0); fz_w_u8(&b, FB_MSG_OCALL);
    fz_w_u32(&b, Q_SIZE); fz_w_u8(&b, 9); fz_w_u16(&b, 3);
    fz_w_bytes(&b, "\1\0\0", 3);
    w_call(&b, 0, 1, Q_PUT, NOW, ITEMS(RAW("after")));
    fz_w_u8(&b, 7); fz_w_u8(&b, 0);
    w_call(&b, 1, 1, Q_SIZE, NOW, NONE);
    fz_seed(dir, "hostile", &b);
    fiber_buf_free(&b);
}
