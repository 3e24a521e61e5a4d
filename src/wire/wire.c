/*
 * wire.c -- encoding and strict decoding of fiber's frames.  The format is
 * documented in wire.h; this file does no I/O.
 *
 * Integers are assembled byte by byte, so the code is the same on every
 * host and never makes an unaligned access.  Decoders treat their input as
 * hostile: every read first checks that its bytes are present, and every
 * failure names the message, the field and the value that was wrong.
 * Encoders apply the decoders' own rules (the same str_rule tables), so
 * fiber never sends a frame that it would itself refuse.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/endian.h"
#include "wire/wire.h"
#include "wire/wire_int.h"

/* Converting an out-of-range unsigned value to a signed type is
 * implementation-defined in C, so the two's-complement reading is spelled
 * out. */
static int32_t to_int32(uint32_t v)
{
    if (v <= INT32_MAX)
        return (int32_t)v;
    return (int32_t)(v - 0x80000000u) + INT32_MIN;
}

/* ---- message types ------------------------------------------------------ */

const char *fb_msg_type_name(unsigned type)
{
    switch (type) {
#define FB_X(name, value)                                                      \
    case value:                                                                \
        return #name;
        FB_MSG_TYPE_MAP(FB_X)
#undef FB_X
    }
    return "?";
}

static bool type_known(unsigned type)
{
    switch (type) {
#define FB_X(name, value) case value:
        FB_MSG_TYPE_MAP(FB_X)
#undef FB_X
        return true;
    }
    return false;
}

/* ---- string rules ------------------------------------------------------- */

/* What a string field may hold: its length range and its byte set.  The
 * decoders and the encoders both check against these, so they agree. */
struct str_rule {
    size_t min, max;
    const char *set; /* the byte set in words, for messages */
    bool (*allowed)(uint8_t c);
};

static bool is_alnum_ascii(uint8_t c)
{
    /* Not isalnum(): that depends on the locale, the protocol does not. */
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
           (c >= 'a' && c <= 'z');
}

static bool is_hex_lower(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static bool is_name_char(uint8_t c)
{
    return is_alnum_ascii(c) || c == '_' || c == '.' || c == '-';
}

static bool is_task_char(uint8_t c) { return is_alnum_ascii(c) || c == '_'; }

static bool is_text_char(uint8_t c) { return c != '\0'; }

static const struct str_rule rule_build_id = {1, FB_WIRE_BUILD_ID_MAX,
                                              "[0-9a-f]", is_hex_lower};
static const struct str_rule rule_name = {1, FB_WIRE_NAME_MAX,
                                          "[A-Za-z0-9_.-]", is_name_char};
static const struct str_rule rule_task = {1, FB_WIRE_NAME_MAX, "[A-Za-z0-9_]",
                                          is_task_char};
static const struct str_rule rule_task_opt = {0, FB_WIRE_NAME_MAX,
                                              "[A-Za-z0-9_]", is_task_char};
static const struct str_rule rule_text = {0, FB_WIRE_TEXT_MAX,
                                          "any byte but NUL", is_text_char};

/* Checks a string's length against rule.  Returns 0, or -1 with the
 * reason in why. */
static int len_check(const struct str_rule *rule, size_t n, char *why,
                     size_t whylen)
{
    if (n < rule->min) {
        snprintf(why, whylen, "empty (length 0, want %zu..%zu)", rule->min,
                 rule->max);
        return -1;
    }
    if (n > rule->max) {
        snprintf(why, whylen, "length %zu exceeds %zu", n, rule->max);
        return -1;
    }
    return 0;
}

/* Checks s[0..n) against rule.  Returns 0, or -1 with the reason in why.
 * s may be NULL when n is 0. */
static int str_check(const struct str_rule *rule, const uint8_t *s, size_t n,
                     char *why, size_t whylen)
{
    if (len_check(rule, n, why, whylen))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!rule->allowed(s[i])) {
            snprintf(why, whylen, "invalid byte 0x%02x at offset %zu (want %s)",
                     s[i], i, rule->set);
            return -1;
        }
    }
    return 0;
}

/* ---- decoding ------------------------------------------------------------ */

/* Writes a decoding failure into err (when the caller gave room for it) and
 * into the thread's last error, and returns FIBER_EPROTO (wire_int.h). */
int fb_wire_fail(char *err, size_t errlen, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
    return fb_err(FIBER_EPROTO, "%s", msg);
}

int fb_wire_hdr_decode(const uint8_t *in, size_t avail, uint32_t max_payload,
                       struct fb_wire_hdr *h, char *err, size_t errlen)
{
    if (avail < FB_WIRE_HDR_LEN)
        return 1;
    uint32_t limit = max_payload < FB_WIRE_PAYLOAD_HARD_MAX
                         ? max_payload
                         : FB_WIRE_PAYLOAD_HARD_MAX;
    unsigned magic = fb_get_le16(in), version = in[2], type = in[3];
    unsigned flags = fb_get_le16(in + 4), reserved = fb_get_le16(in + 6);
    uint32_t len = fb_get_le32(in + 20);
    if (magic != FB_WIRE_MAGIC)
        return fb_wire_fail(err, errlen, "header magic: 0x%04x, want 0x%04x",
                          magic, FB_WIRE_MAGIC);
    if (version != FB_WIRE_VERSION)
        return fb_wire_fail(err, errlen, "header version: %u, want %u", version,
                          FB_WIRE_VERSION);
    if (!type_known(type))
        return fb_wire_fail(err, errlen, "header type: unknown value %u", type);
    if (flags != 0)
        return fb_wire_fail(err, errlen,
                          "header flags: 0x%04x, want 0 (none are defined)",
                          flags);
    if (reserved != 0)
        return fb_wire_fail(err, errlen, "header reserved: 0x%04x, want 0",
                          reserved);
    if (len > limit)
        return fb_wire_fail(err, errlen,
                          "header len: %" PRIu32 " bytes exceeds the limit of "
                          "%" PRIu32,
                          len, limit);
    *h = (struct fb_wire_hdr){.type = (uint8_t)type,
                              .code = to_int32(fb_get_le32(in + 8)),
                              .id = fb_get_le64(in + 12),
                              .len = len};
    return 0;
}

/* A payload being decoded: the bytes not yet consumed, the message's name
 * for error texts, and where those texts go. */
struct reader {
    const uint8_t *pos;
    size_t left;
    const char *msg;
    char *err;
    size_t errlen;
};

static int rd_fail(struct reader *r, const char *field, const char *fmt, ...)
    FIBER_PRINTF(3, 4);
static int rd_fail(struct reader *r, const char *field, const char *fmt, ...)
{
    char why[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return fb_wire_fail(r->err, r->errlen, "%s %s: %s", r->msg, field, why);
}

/* Takes the next n bytes, or fails naming field when fewer are left.
 * *out is set either way (NULL on failure): the compiler cannot see that
 * rd_fail never returns 0, and would warn of uninitialised reads. */
static int rd_take(struct reader *r, const char *field, size_t n,
                   const uint8_t **out)
{
    *out = NULL;
    if (n > r->left)
        return rd_fail(r, field, "truncated: needs %zu bytes, %zu left", n,
                       r->left);
    *out = r->pos;
    if (n) { /* NULL + 0 is undefined behaviour, and pos may be NULL */
        r->pos += n;
        r->left -= n;
    }
    return 0;
}

static int rd_u32(struct reader *r, const char *field, uint32_t *v)
{
    const uint8_t *p;
    int rc = rd_take(r, field, 4, &p);
    if (rc == 0)
        *v = fb_get_le32(p);
    return rc;
}

static int rd_u64(struct reader *r, const char *field, uint64_t *v)
{
    const uint8_t *p;
    int rc = rd_take(r, field, 8, &p);
    if (rc == 0)
        *v = fb_get_le64(p);
    return rc;
}

/* Reads a u8 length and that many bytes, and checks them against rule.
 * The length is judged before the bytes are looked for, so that a length
 * the rule forbids is reported as such rather than as a truncation. */
static int rd_string(struct reader *r, const char *field,
                     const struct str_rule *rule, const char **s, uint8_t *len)
{
    const uint8_t *n, *bytes;
    char why[128];
    int rc = rd_take(r, field, 1, &n);
    if (rc)
        return rc;
    if (len_check(rule, n[0], why, sizeof why))
        return rd_fail(r, field, "%s", why);
    rc = rd_take(r, field, n[0], &bytes);
    if (rc)
        return rc;
    if (str_check(rule, bytes, n[0], why, sizeof why))
        return rd_fail(r, field, "%s", why);
    *s = (const char *)bytes;
    *len = n[0];
    return 0;
}

/* A payload is consumed exactly: bytes after the last field are an error,
 * not something to skip, so that every frame has one encoding. */
static int rd_end(struct reader *r, const char *last_field)
{
    if (r->left == 0)
        return 0;
    return rd_fail(r, "payload", "%zu trailing byte%s after %s", r->left,
                   r->left == 1 ? "" : "s", last_field);
}

int fb_wire_get_hello(const uint8_t *p, size_t len, struct fb_msg_hello *m,
                      char *err, size_t errlen)
{
    struct reader r = {p, len, "HELLO", err, errlen};
    struct fb_msg_hello hello;
    const uint8_t *token;
    int rc = rd_take(&r, "token", FB_WIRE_TOKEN_LEN, &token);
    if (rc == 0)
        rc = rd_string(&r, "build_id", &rule_build_id, &hello.build_id,
                       &hello.build_id_len);
    if (rc == 0)
        rc = rd_u64(&r, "job_id", &hello.job_id);
    if (rc == 0)
        rc = rd_u32(&r, "pid", &hello.pid);
    if (rc == 0)
        rc = rd_string(&r, "proc_name", &rule_name, &hello.name,
                       &hello.name_len);
    if (rc == 0)
        rc = rd_end(&r, "proc_name");
    if (rc)
        return rc;
    memcpy(hello.token, token, FB_WIRE_TOKEN_LEN);
    *m = hello;
    return 0;
}

int fb_wire_get_welcome(const uint8_t *p, size_t len,
                        struct fb_msg_welcome *m, char *err, size_t errlen)
{
    struct reader r = {p, len, "WELCOME", err, errlen};
    uint32_t heartbeat_ms;
    int rc = rd_u32(&r, "heartbeat_ms", &heartbeat_ms);
    if (rc == 0)
        rc = rd_end(&r, "heartbeat_ms");
    if (rc == 0)
        m->heartbeat_ms = heartbeat_ms;
    return rc;
}

int fb_wire_get_run(const uint8_t *p, size_t len, struct fb_msg_run *m,
                    char *err, size_t errlen)
{
    struct reader r = {p, len, "RUN", err, errlen};
    struct fb_msg_run run;
    /* The argument is the rest of the payload, so only the payload limit
     * bounds it; callers that skip fb_wire_hdr_decode get it checked too. */
    if (len > FB_WIRE_PAYLOAD_HARD_MAX)
        return rd_fail(&r, "payload", "length %zu exceeds the limit of %u",
                       len, FB_WIRE_PAYLOAD_HARD_MAX);
    int rc = rd_string(&r, "task", &rule_task, &run.task, &run.task_len);
    if (rc)
        return rc;
    run.arg = r.pos;
    run.arg_len = (uint32_t)r.left;
    *m = run;
    return 0;
}

int fb_wire_get_text(const uint8_t *p, size_t len, struct fb_msg_text *m,
                     char *err, size_t errlen)
{
    char why[128];
    if (str_check(&rule_text, p, len, why, sizeof why))
        return fb_wire_fail(err, errlen, "text: %s", why);
    m->text = (const char *)p;
    m->len = (uint32_t)len;
    return 0;
}

int fb_wire_get_empty(size_t len, char *err, size_t errlen)
{
    if (len == 0)
        return 0;
    return fb_wire_fail(err, errlen,
                      "payload: length %zu, want 0 (this message carries none)",
                      len);
}

int fb_wire_get_pool(const uint8_t *p, size_t len, struct fb_msg_pool *m,
                     char *err, size_t errlen)
{
    struct reader r = {p, len, "POOL", err, errlen};
    struct fb_msg_pool pool;
    if (len > FB_WIRE_PAYLOAD_HARD_MAX)
        return rd_fail(&r, "payload", "length %zu exceeds the limit of %u",
                       len, FB_WIRE_PAYLOAD_HARD_MAX);
    int rc = rd_u32(&r, "spin_us", &pool.spin_us);
    if (rc == 0)
        rc = rd_string(&r, "init_task", &rule_task_opt, &pool.init_task,
                       &pool.init_task_len);
    if (rc)
        return rc;
    pool.init_arg = r.pos;
    pool.init_arg_len = (uint32_t)r.left;
    *m = pool;
    return 0;
}

/* Checks the item count a TASK or RESULT header carries. */
static int count_check(struct reader *r, int32_t count)
{
    if (count < 1 || (uint32_t)count > FB_WIRE_CHUNK_MAX)
        return rd_fail(r, "count", "%" PRId32 " is outside 1..%u", count,
                       FB_WIRE_CHUNK_MAX);
    return 0;
}

int fb_wire_get_task(const uint8_t *p, size_t len, int32_t count,
                     struct fb_msg_task *m, char *err, size_t errlen)
{
    struct reader r = {p, len, "TASK", err, errlen};
    struct fb_msg_task task;
    int rc = count_check(&r, count);
    if (rc == 0)
        rc = rd_string(&r, "task", &rule_task, &task.task, &task.task_len);
    if (rc)
        return rc;
    task.count = (uint32_t)count;
    task.items = r.pos;
    for (int32_t i = 0; i < count && rc == 0; i++) {
        uint32_t n;
        const uint8_t *arg;
        rc = rd_u32(&r, "item len", &n);
        if (rc == 0)
            rc = rd_take(&r, "item arg", n, &arg);
    }
    if (rc == 0)
        rc = rd_end(&r, "the last item");
    if (rc == 0)
        *m = task;
    return rc;
}

int fb_wire_get_result(const uint8_t *p, size_t len, int32_t count,
                       struct fb_msg_result *m, char *err, size_t errlen)
{
    struct reader r = {p, len, "RESULT", err, errlen};
    struct fb_msg_result res;
    int rc = count_check(&r, count);
    if (rc == 0)
        rc = rd_u32(&r, "offset", &res.offset);
    if (rc == 0)
        rc = rd_u64(&r, "elapsed_ns", &res.elapsed_ns);
    if (rc)
        return rc;
    res.count = (uint32_t)count;
    res.items = r.pos;
    for (int32_t i = 0; i < count && rc == 0; i++) {
        uint32_t code, n;
        const uint8_t *bytes;
        char why[128];
        rc = rd_u32(&r, "item rc", &code);
        if (rc == 0)
            rc = rd_u32(&r, "item len", &n);
        if (rc == 0)
            rc = rd_take(&r, "item bytes", n, &bytes);
        if (rc == 0 && code != 0 &&
            str_check(&rule_text, bytes, n, why, sizeof why))
            rc = rd_fail(&r, "item failure text", "%s", why);
    }
    if (rc == 0)
        rc = rd_end(&r, "the last item");
    if (rc == 0)
        *m = res;
    return rc;
}

FB_HOT void fb_wire_task_next(const uint8_t **cursor, const void **arg,
                       uint32_t *len)
{
    *len = fb_get_le32(*cursor);
    *arg = *cursor + 4;
    *cursor += 4 + (size_t)*len;
}

void fb_wire_result_next(const uint8_t **cursor, int32_t *rc,
                         const void **data, uint32_t *len)
{
    *rc = to_int32(fb_get_le32(*cursor));
    *len = fb_get_le32(*cursor + 4);
    *data = *cursor + 8;
    *cursor += 8 + (size_t)*len;
}

/* Reads "u32 count | count x (u32 len | bytes)" to the end of r. */
static int rd_list(struct reader *r, uint32_t *count, const uint8_t **items)
{
    uint32_t n;
    int rc = rd_u32(r, "count", &n);
    if (rc)
        return rc;
    if (n > FB_WIRE_LIST_MAX)
        return rd_fail(r, "count", "%" PRIu32 " exceeds %u", n,
                       FB_WIRE_LIST_MAX);
    *items = r->pos;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint32_t len;
        const uint8_t *bytes;
        rc = rd_u32(r, "item len", &len);
        if (rc == 0)
            rc = rd_take(r, "item bytes", len, &bytes);
    }
    if (rc == 0)
        rc = rd_end(r, "the last item");
    if (rc == 0)
        *count = n;
    return rc;
}

int fb_wire_get_ocall(const uint8_t *p, size_t len, struct fb_msg_ocall *m,
                      char *err, size_t errlen)
{
    struct reader r = {p, len, "OCALL", err, errlen};
    struct fb_msg_ocall call;
    uint32_t timeout;
    int rc = rd_u32(&r, "object", &call.obj);
    if (rc == 0)
        rc = rd_u32(&r, "timeout_ms", &timeout);
    if (rc == 0)
        rc = rd_list(&r, &call.count, &call.items);
    if (rc)
        return rc;
    call.timeout_ms = to_int32(timeout);
    *m = call;
    return 0;
}

int fb_wire_get_oreply(const uint8_t *p, size_t len, int32_t status,
                       struct fb_msg_oreply *m, char *err, size_t errlen)
{
    struct reader r = {p, len, "OREPLY", err, errlen};
    struct fb_msg_oreply reply;
    int rc = rd_list(&r, &reply.count, &reply.items);
    if (rc == 0 && status != 0 && reply.count != 1)
        rc = rd_fail(&r, "count", "%" PRIu32 " items with status %" PRId32
                     ", want 1 (the failure text)", reply.count, status);
    if (rc == 0)
        *m = reply;
    return rc;
}

int fb_wire_get_fault(const uint8_t *p, size_t len, uint32_t *offset,
                      char *err, size_t errlen)
{
    struct reader r = {p, len, "FAULT", err, errlen};
    uint32_t off;
    int rc = rd_u32(&r, "offset", &off);
    if (rc == 0)
        rc = rd_end(&r, "offset");
    if (rc == 0)
        *offset = off;
    return rc;
}

int fb_wire_get_pipe_link(const uint8_t *p, size_t len, uint64_t *relayed,
                          char *err, size_t errlen)
{
    struct reader r = {p, len, "PIPE_LINK", err, errlen};
    uint64_t n;
    int rc = rd_u64(&r, "relayed", &n);
    if (rc == 0)
        rc = rd_end(&r, "relayed");
    if (rc == 0)
        *relayed = n;
    return rc;
}

int fb_wire_check_payload(const struct fb_wire_hdr *h, const uint8_t *p,
                          char *err, size_t errlen)
{
    union {
        struct fb_msg_hello hello;
        struct fb_msg_welcome welcome;
        struct fb_msg_run run;
        struct fb_msg_text text;
        struct fb_msg_pool pool;
        struct fb_msg_task task;
        struct fb_msg_result result;
        uint32_t offset;
        struct fb_msg_ocall ocall;
        struct fb_msg_oreply oreply;
        uint64_t count;
    } m;
    switch (h->type) {
    case FB_MSG_HELLO:
        return fb_wire_get_hello(p, h->len, &m.hello, err, errlen);
    case FB_MSG_WELCOME:
        return fb_wire_get_welcome(p, h->len, &m.welcome, err, errlen);
    case FB_MSG_RUN:
        return fb_wire_get_run(p, h->len, &m.run, err, errlen);
    case FB_MSG_REJECT:
    case FB_MSG_EXIT:
    case FB_MSG_NOTE:
        return fb_wire_get_text(p, h->len, &m.text, err, errlen);
    case FB_MSG_POOL:
        return fb_wire_get_pool(p, h->len, &m.pool, err, errlen);
    case FB_MSG_TASK:
        return fb_wire_get_task(p, h->len, h->code, &m.task, err, errlen);
    case FB_MSG_RESULT:
        return fb_wire_get_result(p, h->len, h->code, &m.result, err, errlen);
    case FB_MSG_FAULT:
        return fb_wire_get_fault(p, h->len, &m.offset, err, errlen);
    case FB_MSG_OCALL:
        return fb_wire_get_ocall(p, h->len, &m.ocall, err, errlen);
    case FB_MSG_OREPLY:
        return fb_wire_get_oreply(p, h->len, h->code, &m.oreply, err, errlen);
    case FB_MSG_PIPE_LINK:
        return fb_wire_get_pipe_link(p, h->len, &m.count, err, errlen);
    case FB_MSG_PIPE_DATA:
        return 0; /* any bytes: the application's message */
    case FB_MSG_PING:
    case FB_MSG_PIPE_CLOSE:
    case FB_MSG_PONG:
    case FB_MSG_READY:
    case FB_MSG_STOP:
    case FB_MSG_HEARTBEAT:
        return fb_wire_get_empty(h->len, err, errlen);
    }
    int obj = fb_wire_check_obj(h, p, err, errlen);
    if (obj != 1)
        return obj;
    int stats = fb_wire_check_stats(h, p, err, errlen);
    if (stats != 1)
        return stats;
    return fb_wire_fail(err, errlen, "header type: unknown value %u", h->type);
}

/* ---- encoding ------------------------------------------------------------ */

void fb_wire_hdr_encode(uint8_t out[FB_WIRE_HDR_LEN],
                        const struct fb_wire_hdr *h)
{
    fb_put_le16(out, FB_WIRE_MAGIC);
    out[2] = FB_WIRE_VERSION;
    out[3] = h->type;
    fb_put_le16(out + 4, h->flags);
    fb_put_le16(out + 6, 0);
    fb_put_le32(out + 8, (uint32_t)h->code);
    fb_put_le64(out + 12, h->id);
    fb_put_le32(out + 20, h->len);
}

/* One contiguous piece of a payload; p may be NULL when n is 0. */
struct piece {
    const void *p;
    size_t n;
};

/* Appends a frame whose payload is the pieces in order.  Callers bound
 * every piece, so the payload fits FB_WIRE_PAYLOAD_HARD_MAX.  Room for the
 * whole frame is reserved first; should an append fail anyway, out->len is
 * put back so that no partial frame is ever left behind. */
static int put_frame(fiber_buf *out, unsigned type, int32_t code, uint64_t id,
                     const struct piece *pieces, size_t count)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "%s: output buffer is NULL",
                      fb_msg_type_name(type));
    size_t len = 0;
    for (size_t i = 0; i < count; i++)
        len += pieces[i].n;
    struct fb_wire_hdr h = {.type = (uint8_t)type, .code = code, .id = id,
                            .len = (uint32_t)len};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    size_t start = out->len;
    int rc = fiber_buf_reserve(out, FB_WIRE_HDR_LEN + len);
    if (rc == 0)
        rc = fiber_buf_append(out, hdr, sizeof hdr);
    for (size_t i = 0; i < count && rc == 0; i++)
        rc = fiber_buf_append(out, pieces[i].p, pieces[i].n);
    if (rc)
        out->len = start;
    return rc;
}

/* Checks a string an encoder was given by the rule its decoder applies. */
static int check_field(const char *msg, const char *field,
                       const struct str_rule *rule, const char *s, size_t n)
{
    char why[128];
    if (!s && n)
        return fb_err(FIBER_EINVAL, "%s %s: NULL with length %zu", msg, field,
                      n);
    if (str_check(rule, (const uint8_t *)s, n, why, sizeof why))
        return fb_err(FIBER_EINVAL, "%s %s: %s", msg, field, why);
    return 0;
}

int fb_wire_put_hello(fiber_buf *out, const struct fb_msg_hello *m)
{
    if (!m)
        return fb_err(FIBER_EINVAL, "HELLO: message is NULL");
    int rc = check_field("HELLO", "build_id", &rule_build_id, m->build_id,
                         m->build_id_len);
    if (rc == 0)
        rc = check_field("HELLO", "proc_name", &rule_name, m->name,
                         m->name_len);
    if (rc)
        return rc;
    uint8_t build_id_len = m->build_id_len, name_len = m->name_len;
    uint8_t ids[12];
    fb_put_le64(ids, m->job_id);
    fb_put_le32(ids + 8, m->pid);
    const struct piece pieces[] = {
        {m->token, FB_WIRE_TOKEN_LEN}, {&build_id_len, 1},
        {m->build_id, build_id_len},   {ids, sizeof ids},
        {&name_len, 1},                {m->name, name_len}};
    return put_frame(out, FB_MSG_HELLO, 0, 0, pieces, FB_ARRAY_LEN(pieces));
}

int fb_wire_put_welcome(fiber_buf *out, const struct fb_msg_welcome *m)
{
    if (!m)
        return fb_err(FIBER_EINVAL, "WELCOME: message is NULL");
    uint8_t heartbeat_ms[4];
    fb_put_le32(heartbeat_ms, m->heartbeat_ms);
    const struct piece pieces[] = {{heartbeat_ms, sizeof heartbeat_ms}};
    return put_frame(out, FB_MSG_WELCOME, 0, 0, pieces, 1);
}

int fb_wire_put_reject(fiber_buf *out, const char *text, size_t len)
{
    int rc = check_field("REJECT", "text", &rule_text, text, len);
    if (rc)
        return rc;
    const struct piece pieces[] = {{text, len}};
    return put_frame(out, FB_MSG_REJECT, 0, 0, pieces, 1);
}

int fb_wire_put_run(fiber_buf *out, uint64_t id, const struct fb_msg_run *m)
{
    if (!m)
        return fb_err(FIBER_EINVAL, "RUN: message is NULL");
    int rc = check_field("RUN", "task", &rule_task, m->task, m->task_len);
    if (rc)
        return rc;
    if (!m->arg && m->arg_len)
        return fb_err(FIBER_EINVAL, "RUN arg: NULL with length %" PRIu32,
                      m->arg_len);
    uint8_t task_len = m->task_len;
    if (m->arg_len > FB_WIRE_PAYLOAD_HARD_MAX - 1u - task_len)
        return fb_err(FIBER_EINVAL,
                      "RUN arg: length %" PRIu32 " exceeds the limit of %u",
                      m->arg_len, FB_WIRE_PAYLOAD_HARD_MAX - 1u - task_len);
    const struct piece pieces[] = {
        {&task_len, 1}, {m->task, task_len}, {m->arg, m->arg_len}};
    return put_frame(out, FB_MSG_RUN, 0, id, pieces, FB_ARRAY_LEN(pieces));
}

int fb_wire_put_exit(fiber_buf *out, int32_t code, const char *text,
                     size_t len)
{
    int rc = check_field("EXIT", "text", &rule_text, text, len);
    if (rc)
        return rc;
    const struct piece pieces[] = {{text, len}};
    return put_frame(out, FB_MSG_EXIT, code, 0, pieces, 1);
}

int fb_wire_put_ping(fiber_buf *out, uint64_t id)
{
    return put_frame(out, FB_MSG_PING, 0, id, NULL, 0);
}

int fb_wire_put_pong(fiber_buf *out, uint64_t id)
{
    return put_frame(out, FB_MSG_PONG, 0, id, NULL, 0);
}

int fb_wire_put_pipe_link(fiber_buf *out, uint64_t relayed)
{
    uint8_t b[8];
    fb_put_le64(b, relayed);
    struct piece pc = {b, sizeof b};
    return put_frame(out, FB_MSG_PIPE_LINK, 0, 0, &pc, 1);
}

int fb_wire_put_pipe_data(fiber_buf *out, const void *data, uint32_t len)
{
    struct piece pc = {data, len};
    return put_frame(out, FB_MSG_PIPE_DATA, 0, 0, &pc, 1);
}

int fb_wire_put_empty(fiber_buf *out, unsigned type, uint64_t id)
{
    if (type != FB_MSG_PING && type != FB_MSG_PONG && type != FB_MSG_READY &&
        type != FB_MSG_STOP && type != FB_MSG_HEARTBEAT &&
        type != FB_MSG_STATS && type != FB_MSG_PIPE_CLOSE)
        return fb_err(FIBER_EINVAL, "%s is not an empty message",
                      fb_msg_type_name(type));
    return put_frame(out, type, 0, id, NULL, 0);
}

int fb_wire_put_pool(fiber_buf *out, const struct fb_msg_pool *m)
{
    if (!m)
        return fb_err(FIBER_EINVAL, "POOL: message is NULL");
    int rc = check_field("POOL", "init_task", &rule_task_opt, m->init_task,
                         m->init_task_len);
    if (rc)
        return rc;
    if (!m->init_arg && m->init_arg_len)
        return fb_err(FIBER_EINVAL, "POOL init_arg: NULL with length %" PRIu32,
                      m->init_arg_len);
    if (m->init_arg_len > FB_WIRE_PAYLOAD_HARD_MAX - 5u - m->init_task_len)
        return fb_err(FIBER_EINVAL, "POOL init_arg: too long");
    uint8_t spin[4], task_len = m->init_task_len;
    fb_put_le32(spin, m->spin_us);
    const struct piece pieces[] = {{spin, 4},
                                   {&task_len, 1},
                                   {m->init_task, task_len},
                                   {m->init_arg, m->init_arg_len}};
    return put_frame(out, FB_MSG_POOL, 0, 0, pieces, FB_ARRAY_LEN(pieces));
}

/* Appends a header for a frame whose len and code _end fills in. */
static int begin_frame(fiber_buf *out, unsigned type, uint64_t id,
                       size_t *mark)
{
    struct fb_wire_hdr h = {.type = (uint8_t)type, .id = id};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    *mark = out->len;
    return fiber_buf_append(out, hdr, sizeof hdr);
}

static void end_frame(fiber_buf *out, size_t mark, uint32_t count)
{
    uint8_t *hdr = out->data + mark;
    fb_put_le32(hdr + 8, count);
    fb_put_le32(hdr + 20, (uint32_t)(out->len - mark - FB_WIRE_HDR_LEN));
}

int fb_wire_task_begin(fiber_buf *out, uint64_t id, const char *task,
                       size_t task_len, size_t *mark)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "TASK: output buffer is NULL");
    int rc = check_field("TASK", "task", &rule_task, task, task_len);
    if (rc)
        return rc;
    size_t start = out->len;
    uint8_t n = (uint8_t)task_len;
    rc = fiber_buf_reserve(out, FB_WIRE_HDR_LEN + 1 + task_len);
    if (rc == 0)
        rc = begin_frame(out, FB_MSG_TASK, id, mark);
    if (rc == 0)
        rc = fiber_buf_append(out, &n, 1);
    if (rc == 0)
        rc = fiber_buf_append(out, task, task_len);
    if (rc)
        out->len = start;
    return rc;
}

int fb_wire_task_add(fiber_buf *out, const void *arg, uint32_t len)
{
    if (!arg && len)
        return fb_err(FIBER_EINVAL, "TASK item: NULL with length %" PRIu32,
                      len);
    int rc = fiber_buf_reserve(out, 4 + (size_t)len);
    if (rc)
        return rc;
    fb_put_le32(out->data + out->len, len);
    if (len)
        memcpy(out->data + out->len + 4, arg, len);
    out->len += 4 + (size_t)len;
    return 0;
}

int fb_wire_task_add_parts(fiber_buf *out, const fiber_iov *parts,
                           size_t count)
{
    size_t len = 0;
    for (size_t i = 0; i < count; i++) {
        if (!parts[i].data && parts[i].len)
            return fb_err(FIBER_EINVAL, "TASK item: part %zu is NULL with "
                          "length %zu", i, parts[i].len);
        if (parts[i].len > UINT32_MAX - len)
            return fb_err(FIBER_ETOOBIG, "TASK item: more than %" PRIu32
                          " bytes", UINT32_MAX);
        len += parts[i].len;
    }
    int rc = fiber_buf_reserve(out, 4 + len);
    if (rc)
        return rc;
    unsigned char *at = out->data + out->len;
    fb_put_le32(at, (uint32_t)len);
    at += 4;
    for (size_t i = 0; i < count; i++) {
        if (parts[i].len)
            memcpy(at, parts[i].data, parts[i].len);
        at += parts[i].len;
    }
    out->len += 4 + len;
    return 0;
}

void fb_wire_task_end(fiber_buf *out, size_t mark, uint32_t count)
{
    end_frame(out, mark, count);
}

FB_HOT int fb_wire_result_begin(fiber_buf *out, uint64_t id, uint32_t offset,
                         size_t *mark)
{
    if (!out)
        return fb_err(FIBER_EINVAL, "RESULT: output buffer is NULL");
    size_t start = out->len;
    int rc = fiber_buf_reserve(out, FB_WIRE_HDR_LEN + 12);
    if (rc == 0)
        rc = begin_frame(out, FB_MSG_RESULT, id, mark);
    if (rc) {
        out->len = start;
        return rc;
    }
    fb_put_le32(out->data + out->len, offset);
    fb_put_le64(out->data + out->len + 4, 0);
    out->len += 12;
    return 0;
}

FB_HOT int fb_wire_result_add(fiber_buf *out, int32_t rc, const void *data,
                       uint32_t len)
{
    if (!data && len)
        return fb_err(FIBER_EINVAL, "RESULT item: NULL with length %" PRIu32,
                      len);
    if (rc != 0) {
        int err = check_field("RESULT", "failure text", &rule_text, data, len);
        if (err)
            return err;
    }
    int err = fiber_buf_reserve(out, 8 + (size_t)len);
    if (err)
        return err;
    fb_put_le32(out->data + out->len, (uint32_t)rc);
    fb_put_le32(out->data + out->len + 4, len);
    if (len)
        memcpy(out->data + out->len + 8, data, len);
    out->len += 8 + (size_t)len;
    return 0;
}

FB_HOT void fb_wire_result_end(fiber_buf *out, size_t mark, uint32_t count,
                        uint64_t elapsed_ns)
{
    fb_put_le64(out->data + mark + FB_WIRE_HDR_LEN + 4, elapsed_ns);
    end_frame(out, mark, count);
}

void fb_wire_fault_encode(uint8_t out[FB_WIRE_FAULT_LEN], uint64_t chunk_id,
                          int32_t sig, uint32_t offset)
{
    struct fb_wire_hdr h = {.type = FB_MSG_FAULT, .code = sig,
                            .id = chunk_id, .len = 4};
    fb_wire_hdr_encode(out, &h);
    fb_put_le32(out + FB_WIRE_HDR_LEN, offset);
}

/* Appends a frame whose payload is `head` then the item list. */
static int put_list_frame(fiber_buf *out, unsigned type, uint64_t id,
                          int32_t code, const uint8_t *head, size_t head_len,
                          const fiber_iov *items, size_t count)
{
    if (count > FB_WIRE_LIST_MAX || (count && !items))
        return fb_err(FIBER_EINVAL, "%s: bad item list (%zu items)",
                      fb_msg_type_name(type), count);
    size_t total = head_len + 4;
    for (size_t i = 0; i < count; i++) {
        if (items[i].len && !items[i].data)
            return fb_err(FIBER_EINVAL, "%s item %zu: NULL with a length",
                          fb_msg_type_name(type), i);
        if (items[i].len > FB_WIRE_PAYLOAD_HARD_MAX ||
            total > FB_WIRE_PAYLOAD_HARD_MAX - 4 - items[i].len)
            return fb_err(FIBER_EINVAL, "%s: payload too long",
                          fb_msg_type_name(type));
        total += 4 + items[i].len;
    }
    size_t mark, start = out->len;
    int rc = fiber_buf_reserve(out, FB_WIRE_HDR_LEN + total);
    if (rc == 0)
        rc = begin_frame(out, type, id, &mark);
    if (rc) {
        out->len = start;
        return rc;
    }
    if (head_len)
        memcpy(out->data + out->len, head, head_len);
    out->len += head_len;
    fb_put_le32(out->data + out->len, (uint32_t)count);
    out->len += 4;
    for (size_t i = 0; i < count; i++) {
        fb_put_le32(out->data + out->len, (uint32_t)items[i].len);
        if (items[i].len)
            memcpy(out->data + out->len + 4, items[i].data, items[i].len);
        out->len += 4 + items[i].len;
    }
    end_frame(out, mark, (uint32_t)code);
    return 0;
}

int fb_wire_put_ocall(fiber_buf *out, uint64_t id, int32_t op, uint32_t obj,
                      int32_t timeout_ms, const fiber_iov *items,
                      size_t count)
{
    uint8_t head[8];
    fb_put_le32(head, obj);
    fb_put_le32(head + 4, (uint32_t)timeout_ms);
    return put_list_frame(out, FB_MSG_OCALL, id, op, head, sizeof head, items,
                          count);
}

int fb_wire_put_oreply(fiber_buf *out, uint64_t id, int32_t status,
                       const fiber_iov *items, size_t count)
{
    if (status != 0 && count != 1)
        return fb_err(FIBER_EINVAL, "OREPLY: a failure carries one text");
    return put_list_frame(out, FB_MSG_OREPLY, id, status, NULL, 0, items,
                          count);
}

int fb_wire_put_note(fiber_buf *out, int32_t kind, const char *text,
                     size_t len)
{
    int rc = check_field("NOTE", "text", &rule_text, text, len);
    if (rc)
        return rc;
    const struct piece pieces[] = {{text, len}};
    return put_frame(out, FB_MSG_NOTE, kind, 0, pieces, 1);
}
