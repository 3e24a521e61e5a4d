/*
 * fuzz_wire.c -- libFuzzer target for the wire decoder (src/wire/wire.c).
 *
 * The input is a byte stream as a connection would deliver it: frames one
 * after another.  Each header is decoded; when its payload is present in
 * full it is decoded too, and then the next frame follows.  The target
 * stops at the first error or at incomplete data.
 *
 * Beyond "never crashes", two properties are checked, and a violation
 * calls abort() so that libFuzzer (or replay_main.c) reports it:
 *   - every failure is FIBER_EPROTO with a message;
 *   - round trip: a frame that decodes is re-encoded with the matching
 *     encoder (fb_wire_put_*; for TASK and RESULT _begin, one _add per
 *     item walked with fb_wire_*_next, and _end; fb_wire_fault_encode for
 *     FAULT) and must give back the same fields and the very same bytes,
 *     since the format leaves no choice in how a message is encoded.
 *     Walking the items of the fuzzed frame itself also checks the
 *     decoder's promise that the unchecked iterators stay inside the
 *     payload (ASan sees any read past it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

#define FUZZ_MAX_PAYLOAD (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_wire: %s\n", what);
        abort();
    }
}

static int same_bytes(const void *a, size_t alen, const void *b, size_t blen)
{
    return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* Checks that the frame the encoder wrote into b has the original's type,
 * the id and code the encoder was given, and the original payload bytes;
 * returns its payload. */
static const uint8_t *reparse(const fiber_buf *b, const struct fb_wire_hdr *h,
                              const uint8_t *payload, int32_t code,
                              uint64_t id)
{
    struct fb_wire_hdr again;
    require(fb_wire_hdr_decode(b->data, b->len, FUZZ_MAX_PAYLOAD, &again, NULL,
                               0) == 0,
            "re-encoded header does not decode");
    require(b->len == FB_WIRE_HDR_LEN + (size_t)h->len, "frame size differs");
    require(again.type == h->type && again.flags == 0 && again.len == h->len &&
                again.code == code && again.id == id,
            "re-encoded header fields differ");
    const uint8_t *p = b->data + FB_WIRE_HDR_LEN;
    require(same_bytes(p, h->len, payload, h->len), "payload bytes differ");
    require(fb_wire_check_payload(&again, p, NULL, 0) == 0,
            "re-encoded payload does not decode");
    return p;
}

static void round_trip_hello(const struct fb_wire_hdr *h, const uint8_t *p,
                             fiber_buf *b)
{
    struct fb_msg_hello a, z;
    require(fb_wire_get_hello(p, h->len, &a, NULL, 0) == 0, "HELLO decode");
    require(fb_wire_put_hello(b, &a) == 0, "HELLO encode");
    const uint8_t *q = reparse(b, h, p, 0, 0);
    require(fb_wire_get_hello(q, h->len, &z, NULL, 0) == 0, "HELLO redecode");
    require(memcmp(a.token, z.token, FB_WIRE_TOKEN_LEN) == 0 &&
                same_bytes(a.build_id, a.build_id_len, z.build_id,
                           z.build_id_len) &&
                a.job_id == z.job_id && a.pid == z.pid &&
                same_bytes(a.name, a.name_len, z.name, z.name_len),
            "HELLO fields differ after a round trip");
}

static void round_trip_welcome(const struct fb_wire_hdr *h, const uint8_t *p,
                               fiber_buf *b)
{
    struct fb_msg_welcome a, z;
    require(fb_wire_get_welcome(p, h->len, &a, NULL, 0) == 0, "WELCOME decode");
    require(fb_wire_put_welcome(b, &a) == 0, "WELCOME encode");
    const uint8_t *q = reparse(b, h, p, 0, 0);
    require(fb_wire_get_welcome(q, h->len, &z, NULL, 0) == 0,
            "WELCOME redecode");
    require(a.heartbeat_ms == z.heartbeat_ms,
            "WELCOME fields differ after a round trip");
}

static void round_trip_run(const struct fb_wire_hdr *h, const uint8_t *p,
                           fiber_buf *b)
{
    struct fb_msg_run a, z;
    require(fb_wire_get_run(p, h->len, &a, NULL, 0) == 0, "RUN decode");
    require(fb_wire_put_run(b, h->id, &a) == 0, "RUN encode");
    const uint8_t *q = reparse(b, h, p, 0, h->id);
    require(fb_wire_get_run(q, h->len, &z, NULL, 0) == 0, "RUN redecode");
    require(same_bytes(a.task, a.task_len, z.task, z.task_len) &&
                same_bytes(a.arg, a.arg_len, z.arg, z.arg_len),
            "RUN fields differ after a round trip");
}

static void round_trip_text(const struct fb_wire_hdr *h, const uint8_t *p,
                            fiber_buf *b)
{
    struct fb_msg_text a, z;
    int32_t code = h->type == FB_MSG_REJECT ? 0 : h->code;
    require(fb_wire_get_text(p, h->len, &a, NULL, 0) == 0, "text decode");
    int rc = h->type == FB_MSG_EXIT   ? fb_wire_put_exit(b, code, a.text, a.len)
             : h->type == FB_MSG_NOTE ? fb_wire_put_note(b, code, a.text, a.len)
                                      : fb_wire_put_reject(b, a.text, a.len);
    require(rc == 0, "text encode");
    const uint8_t *q = reparse(b, h, p, code, 0);
    require(fb_wire_get_text(q, h->len, &z, NULL, 0) == 0, "text redecode");
    require(same_bytes(a.text, a.len, z.text, z.len),
            "text differs after a round trip");
}

/* PING and PONG have encoders of their own, which must agree with
 * fb_wire_put_empty. */
static void round_trip_empty(const struct fb_wire_hdr *h, const uint8_t *p,
                             fiber_buf *b)
{
    require(fb_wire_put_empty(b, h->type, h->id) == 0, "empty encode");
    reparse(b, h, p, 0, h->id);
    if (h->type == FB_MSG_PING || h->type == FB_MSG_PONG) {
        fiber_buf c = {0};
        int rc = h->type == FB_MSG_PING ? fb_wire_put_ping(&c, h->id)
                                        : fb_wire_put_pong(&c, h->id);
        require(rc == 0, "PING/PONG encode");
        require(same_bytes(b->data, b->len, c.data, c.len),
                "PING/PONG encoders disagree with fb_wire_put_empty");
        fiber_buf_free(&c);
    }
}

static void round_trip_pool(const struct fb_wire_hdr *h, const uint8_t *p,
                            fiber_buf *b)
{
    struct fb_msg_pool a, z;
    require(fb_wire_get_pool(p, h->len, &a, NULL, 0) == 0, "POOL decode");
    require(fb_wire_put_pool(b, &a) == 0, "POOL encode");
    const uint8_t *q = reparse(b, h, p, 0, 0);
    require(fb_wire_get_pool(q, h->len, &z, NULL, 0) == 0, "POOL redecode");
    require(a.spin_us == z.spin_us &&
                same_bytes(a.init_task, a.init_task_len, z.init_task,
                           z.init_task_len) &&
                same_bytes(a.init_arg, a.init_arg_len, z.init_arg,
                           z.init_arg_len),
            "POOL fields differ after a round trip");
}

static void round_trip_task(const struct fb_wire_hdr *h, const uint8_t *p,
                            fiber_buf *b)
{
    struct fb_msg_task a, z;
    size_t mark = 1;
    require(fb_wire_get_task(p, h->len, h->code, &a, NULL, 0) == 0,
            "TASK decode");
    require(a.count == (uint32_t)h->code, "TASK count is not the code");
    require(fb_wire_task_begin(b, h->id, a.task, a.task_len, &mark) == 0,
            "TASK begin");
    require(mark == 0, "TASK mark is not where the frame starts");
    const uint8_t *cur = a.items, *end = p + h->len;
    for (uint32_t i = 0; i < a.count; i++) {
        const void *arg;
        uint32_t n;
        fb_wire_task_next(&cur, &arg, &n);
        require(cur <= end, "TASK item runs past the payload");
        require(fb_wire_task_add(b, arg, n) == 0, "TASK add");
    }
    require(cur == end, "TASK items do not end where the payload does");
    fb_wire_task_end(b, mark, a.count);
    const uint8_t *q = reparse(b, h, p, h->code, h->id);
    require(fb_wire_get_task(q, h->len, h->code, &z, NULL, 0) == 0,
            "TASK redecode");
    require(same_bytes(a.task, a.task_len, z.task, z.task_len) &&
                a.count == z.count,
            "TASK fields differ after a round trip");
    const uint8_t *ca = a.items, *cz = z.items;
    for (uint32_t i = 0; i < a.count; i++) {
        const void *xa, *xz;
        uint32_t na, nz;
        fb_wire_task_next(&ca, &xa, &na);
        fb_wire_task_next(&cz, &xz, &nz);
        require(same_bytes(xa, na, xz, nz),
                "TASK item differs after a round trip");
    }
}

static void round_trip_result(const struct fb_wire_hdr *h, const uint8_t *p,
                              fiber_buf *b)
{
    struct fb_msg_result a, z;
    size_t mark = 1;
    require(fb_wire_get_result(p, h->len, h->code, &a, NULL, 0) == 0,
            "RESULT decode");
    require(a.count == (uint32_t)h->code, "RESULT count is not the code");
    require(fb_wire_result_begin(b, h->id, a.offset, &mark) == 0,
            "RESULT begin");
    require(mark == 0, "RESULT mark is not where the frame starts");
    const uint8_t *cur = a.items, *end = p + h->len;
    for (uint32_t i = 0; i < a.count; i++) {
        int32_t rc;
        const void *data;
        uint32_t n;
        fb_wire_result_next(&cur, &rc, &data, &n);
        require(cur <= end, "RESULT item runs past the payload");
        require(fb_wire_result_add(b, rc, data, n) == 0, "RESULT add");
    }
    require(cur == end, "RESULT items do not end where the payload does");
    fb_wire_result_end(b, mark, a.count, a.elapsed_ns);
    const uint8_t *q = reparse(b, h, p, h->code, h->id);
    require(fb_wire_get_result(q, h->len, h->code, &z, NULL, 0) == 0,
            "RESULT redecode");
    require(a.offset == z.offset && a.elapsed_ns == z.elapsed_ns &&
                a.count == z.count,
            "RESULT fields differ after a round trip");
    const uint8_t *ca = a.items, *cz = z.items;
    for (uint32_t i = 0; i < a.count; i++) {
        int32_t ra, rz;
        const void *xa, *xz;
        uint32_t na, nz;
        fb_wire_result_next(&ca, &ra, &xa, &na);
        fb_wire_result_next(&cz, &rz, &xz, &nz);
        require(ra == rz && same_bytes(xa, na, xz, nz),
                "RESULT item differs after a round trip");
    }
}

/* FAULT has no fiber_buf encoder: it is written into a fixed array, the
 * whole frame at once, so that a signal handler can send it. */
static void round_trip_fault(const struct fb_wire_hdr *h, const uint8_t *p,
                             fiber_buf *b)
{
    uint32_t a, z;
    uint8_t frame[FB_WIRE_FAULT_LEN];
    require(fb_wire_get_fault(p, h->len, &a, NULL, 0) == 0, "FAULT decode");
    fb_wire_fault_encode(frame, h->id, h->code, a);
    require(fiber_buf_append(b, frame, sizeof frame) == 0, "FAULT append");
    const uint8_t *q = reparse(b, h, p, h->code, h->id);
    require(fb_wire_get_fault(q, h->len, &z, NULL, 0) == 0, "FAULT redecode");
    require(a == z, "FAULT offset differs after a round trip");
}

/* The pipe link's frames (src/pipe/pipe.c): the encoders write id and code
 * 0, which the receiver ignores. */
static void round_trip_pipe(const struct fb_wire_hdr *h, const uint8_t *p,
                            fiber_buf *b)
{
    uint64_t n = 0, again = 0;
    int rc;
    if (h->type == FB_MSG_PIPE_LINK) {
        require(fb_wire_get_pipe_link(p, h->len, &n, NULL, 0) == 0,
                "PIPE_LINK decode");
        rc = fb_wire_put_pipe_link(b, n);
    } else if (h->type == FB_MSG_PIPE_DATA)
        rc = fb_wire_put_pipe_data(b, p, h->len);
    else
        rc = fb_wire_put_empty(b, h->type, 0);
    require(rc == 0, "pipe frame encode");
    const uint8_t *q = reparse(b, h, p, 0, 0);
    if (h->type == FB_MSG_PIPE_LINK) {
        require(fb_wire_get_pipe_link(q, h->len, &again, NULL, 0) == 0,
                "PIPE_LINK redecode");
        require(n == again, "PIPE_LINK count differs after a round trip");
    }
}

/* Collects the items of a decoded list into iovs (allocated). */
static fiber_iov *list_items(const uint8_t *cur, uint32_t count)
{
    fiber_iov *v = calloc(count ? count : 1, sizeof *v);
    require(v != NULL, "out of memory");
    for (uint32_t i = 0; i < count; i++) {
        const void *data;
        uint32_t len;
        fb_wire_task_next(&cur, &data, &len);
        v[i] = (fiber_iov){data, len};
    }
    return v;
}

static void round_trip_ocall(const struct fb_wire_hdr *h, const uint8_t *p,
                             fiber_buf *b)
{
    struct fb_msg_ocall a, z;
    require(fb_wire_get_ocall(p, h->len, &a, NULL, 0) == 0, "OCALL decode");
    fiber_iov *v = list_items(a.items, a.count);
    require(fb_wire_put_ocall(b, h->id, h->code, a.obj, a.timeout_ms, v,
                              a.count) == 0,
            "OCALL encode");
    free(v);
    const uint8_t *q = reparse(b, h, p, h->code, h->id);
    require(fb_wire_get_ocall(q, h->len, &z, NULL, 0) == 0, "OCALL redecode");
    require(a.obj == z.obj && a.timeout_ms == z.timeout_ms &&
                a.count == z.count,
            "OCALL fields differ after a round trip");
}

static void round_trip_oreply(const struct fb_wire_hdr *h, const uint8_t *p,
                              fiber_buf *b)
{
    struct fb_msg_oreply a, z;
    require(fb_wire_get_oreply(p, h->len, h->code, &a, NULL, 0) == 0,
            "OREPLY decode");
    fiber_iov *v = list_items(a.items, a.count);
    require(fb_wire_put_oreply(b, h->id, h->code, v, a.count) == 0,
            "OREPLY encode");
    free(v);
    const uint8_t *q = reparse(b, h, p, h->code, h->id);
    require(fb_wire_get_oreply(q, h->len, h->code, &z, NULL, 0) == 0,
            "OREPLY redecode");
    require(a.count == z.count, "OREPLY count differs after a round trip");
}

/* The shared-blob messages (wire_obj.c): re-encoded from what decoded,
 * they must give the same bytes. */
static void round_trip_obj(const struct fb_wire_hdr *h, const uint8_t *p,
                           fiber_buf *b)
{
    const uint8_t *ref;
    const char *s;
    uint32_t n;
    char a[5000], f[FB_WIRE_ADDR_MAX + 1];
    struct fb_msg_obj_data d;
    struct fb_msg_text t;
    struct fb_msg_obj_have hv;
    int rc = -1, code = 0;
    uint64_t id = h->id;
    switch (h->type) {
    case FB_MSG_OBJ_GET:
        fb_wire_get_obj_get(p, h->len, &ref, NULL, 0);
        rc = fb_wire_put_obj_get(b, h->id, ref);
        break;
    case FB_MSG_OBJ_DATA:
        fb_wire_get_obj_data(p, h->len, &d, NULL, 0);
        rc = fb_wire_put_obj_data_hdr(b, h->id, d.offset, d.len);
        if (rc == 0 && d.len)
            rc = fiber_buf_append(b, d.bytes, d.len);
        break;
    case FB_MSG_OBJ_FROM:
    case FB_MSG_OBJ_FILE:
        if (h->type == FB_MSG_OBJ_FROM)
            fb_wire_get_obj_from(p, h->len, &s, &n, NULL, 0);
        else
            fb_wire_get_obj_file(p, h->len, &s, &n, NULL, 0);
        memcpy(a, s, n);
        a[n] = '\0';
        rc = h->type == FB_MSG_OBJ_FROM ? fb_wire_put_obj_from(b, h->id, a)
                                        : fb_wire_put_obj_file(b, h->id, a);
        break;
    case FB_MSG_OBJ_NONE:
        fb_wire_get_obj_none(h->code, p, h->len, &t, NULL, 0);
        memcpy(a, t.text, t.len);
        a[t.len] = '\0';
        rc = fb_wire_put_obj_none(b, h->id, h->code, a);
        code = h->code;
        break;
    case FB_MSG_OBJ_HAVE:
    case FB_MSG_OBJ_BAD:
        if (h->type == FB_MSG_OBJ_HAVE)
            fb_wire_get_obj_have(p, h->len, &hv, NULL, 0);
        else
            fb_wire_get_obj_bad(p, h->len, &hv, NULL, 0);
        memcpy(a, hv.addr, hv.addr_len);
        a[hv.addr_len] = '\0';
        if (hv.from_len) /* OBJ_BAD has none: from is NULL */
            memcpy(f, hv.from, hv.from_len);
        f[hv.from_len] = '\0';
        rc = h->type == FB_MSG_OBJ_HAVE ? fb_wire_put_obj_have(b, hv.ref, a, f)
                                        : fb_wire_put_obj_bad(b, hv.ref, a);
        id = 0;
        break;
    case FB_MSG_OBJ_AT: {
        uint64_t off;
        fb_wire_get_obj_at(p, h->len, &off, &s, &n, NULL, 0);
        memcpy(a, s, n);
        a[n] = '\0';
        rc = fb_wire_put_obj_at(b, h->id, off, a);
        break;
    }
    case FB_MSG_OBJ_DROP:
        fb_wire_get_obj_drop(p, h->len, &ref, NULL, 0);
        rc = fb_wire_put_obj_drop(b, ref);
        id = 0;
        break;
    case FB_MSG_OBJ_CALL:
        fb_wire_get_obj_call(p, h->len, &ref, NULL, 0);
        rc = fb_wire_put_obj_call(b, ref);
        id = 0;
        break;
    }
    require(rc == 0, "a blob message does not encode again");
    /* The encoders write id 0 (HAVE, BAD, CALL, DROP) and code 0 (all but
     * NONE): compare the frames where the input did too. */
    if (id == h->id && code == h->code)
        reparse(b, h, p, h->code, h->id);
}

/* SNAPSHOT: every pool walked with fb_wire_snapshot_next, then encoded
 * again from the fields alone. */
static void round_trip_snapshot(const struct fb_wire_hdr *h, const uint8_t *p,
                                fiber_buf *b)
{
    struct fb_msg_snapshot m;
    require(fb_wire_get_snapshot(p, h->len, &m, NULL, 0) == 0,
            "SNAPSHOT redecode");
    struct fb_msg_snapshot_pool *pools =
        calloc(m.n_pools ? m.n_pools : 1, sizeof *pools);
    require(pools != NULL, "out of memory");
    const uint8_t *cur = m.pools;
    for (uint32_t i = 0; i < m.n_pools; i++)
        fb_wire_snapshot_next(&cur, &pools[i]);
    require(cur == p + h->len, "SNAPSHOT pools do not end the payload");
    require(fb_wire_put_snapshot(b, h->id, &m, pools, m.n_pools) == 0,
            "SNAPSHOT encode");
    reparse(b, h, p, 0, h->id);
    free(pools);
}

static void round_trip(const struct fb_wire_hdr *h, const uint8_t *p)
{
    fiber_buf b = {0};
    switch (h->type) {
    case FB_MSG_HELLO:
        round_trip_hello(h, p, &b);
        break;
    case FB_MSG_WELCOME:
        round_trip_welcome(h, p, &b);
        break;
    case FB_MSG_RUN:
        round_trip_run(h, p, &b);
        break;
    case FB_MSG_REJECT:
    case FB_MSG_EXIT:
    case FB_MSG_NOTE:
        round_trip_text(h, p, &b);
        break;
    case FB_MSG_PING:
    case FB_MSG_PONG:
    case FB_MSG_READY:
    case FB_MSG_STOP:
    case FB_MSG_HEARTBEAT:
    case FB_MSG_STATS:
        round_trip_empty(h, p, &b);
        break;
    case FB_MSG_SNAPSHOT:
        round_trip_snapshot(h, p, &b);
        break;
    case FB_MSG_POOL:
        round_trip_pool(h, p, &b);
        break;
    case FB_MSG_TASK:
        round_trip_task(h, p, &b);
        break;
    case FB_MSG_RESULT:
        round_trip_result(h, p, &b);
        break;
    case FB_MSG_FAULT:
        round_trip_fault(h, p, &b);
        break;
    case FB_MSG_OCALL:
        round_trip_ocall(h, p, &b);
        break;
    case FB_MSG_OREPLY:
        round_trip_oreply(h, p, &b);
        break;
    case FB_MSG_OBJ_GET:
    case FB_MSG_OBJ_DATA:
    case FB_MSG_OBJ_FROM:
    case FB_MSG_OBJ_NONE:
    case FB_MSG_OBJ_HAVE:
    case FB_MSG_OBJ_BAD:
    case FB_MSG_OBJ_CALL:
    case FB_MSG_OBJ_FILE:
    case FB_MSG_OBJ_AT:
    case FB_MSG_OBJ_DROP:
        round_trip_obj(h, p, &b);
        break;
    case FB_MSG_PIPE_LINK:
    case FB_MSG_PIPE_DATA:
    case FB_MSG_PIPE_CLOSE:
        round_trip_pipe(h, p, &b);
        break;
    default:
        require(0, "a frame of unknown type decoded");
    }
    fiber_buf_free(&b);
}

/* A refusal must be FIBER_EPROTO with a NUL-terminated message. */
static void require_refusal(int rc, const char *err, size_t errlen)
{
    require(rc == FIBER_EPROTO, "decoder returned neither 0 nor FIBER_EPROTO");
    require(err[0] != '\0' && memchr(err, '\0', errlen) != NULL,
            "refusal without a message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!data) /* pointer arithmetic on NULL, even + 0, is undefined */
        return 0;
    size_t off = 0;
    for (;;) {
        struct fb_wire_hdr h;
        char err[256] = "";
        size_t left = size - off;
        int rc = fb_wire_hdr_decode(data + off, left, FUZZ_MAX_PAYLOAD, &h,
                                    err, sizeof err);
        if (rc == 1) {
            require(left < FB_WIRE_HDR_LEN, "complete header reported short");
            break;
        }
        if (rc != 0) {
            require_refusal(rc, err, sizeof err);
            break;
        }
        if (h.len > left - FB_WIRE_HDR_LEN)
            break; /* incomplete payload: a reader would wait for more */
        const uint8_t *p = data + off + FB_WIRE_HDR_LEN;
        rc = fb_wire_check_payload(&h, p, err, sizeof err);
        if (rc != 0) {
            require_refusal(rc, err, sizeof err);
            break;
        }
        round_trip(&h, p);
        off += FB_WIRE_HDR_LEN + (size_t)h.len;
    }
    return 0;
}
