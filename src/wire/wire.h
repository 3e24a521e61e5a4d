/*
 * wire.h -- fiber's message format: encoding and strict decoding, no I/O.
 *
 * Every message is a 24-byte header followed by `len` payload bytes.  All
 * integers are little-endian, whatever the host.
 *
 *   offset size field
 *        0    2 magic     0xF1BE
 *        2    1 version   FB_WIRE_VERSION (1)
 *        3    1 type      enum fb_msg_type
 *        4    2 flags     no bits defined yet: must be 0
 *        6    2 reserved  must be 0
 *        8    4 code      signed; meaning depends on type (EXIT: exit code)
 *       12    8 id        job id, task id or sequence; meaning by type
 *       20    4 len       payload length, at most the receiver's limit
 *
 * The decoder trusts nothing: every length is checked against what is
 * actually present and against the limits below, every enumerated value
 * against its set, and a payload must be consumed exactly (no trailing
 * bytes).  Any byte sequence either decodes or is rejected with
 * FIBER_EPROTO and a message naming the field; none crashes it.  The fuzz
 * target tests/fuzz/fuzz_wire.c holds it to that.
 *
 * Payloads by type (strings are length-prefixed, never NUL-terminated on
 * the wire; a "name" is 1..63 bytes of [A-Za-z0-9_.-]; "text" is 0..1023
 * bytes, none of them NUL):
 *
 *   HELLO    child->master, the first message of every connection.
 *            token[32] | u8 n | build_id[n] (1..64 bytes, [0-9a-f]) |
 *            u64 job_id | u32 pid | u8 m | proc_name[m] (a name)
 *   WELCOME  master->child: the child is accepted.
 *            u32 heartbeat_ms
 *   REJECT   master->child, then the master closes: text (why)
 *   RUN      master->child: run a task as a process's target.
 *            u8 n | task[n] (a name; the task charset is [A-Za-z0-9_]) |
 *            arg bytes (the rest of the payload, possibly empty)
 *   EXIT     child->master: the target returned; header code = its return
 *            value; payload: text (failure message, may be empty)
 *   NOTE     child->master: text the running target reports to its master
 *            (a manager's address); header code = what kind of note (1)
 *   PING     either way, empty payload; the peer answers PONG with the same id
 *   PONG     empty payload
 *
 *  Pool workers (after WELCOME the master sends POOL instead of RUN):
 *   POOL     master->worker: become a pool worker.
 *            u32 spin_us | u8 n | initializer task[n] (0..63 bytes of
 *            [A-Za-z0-9_]; empty = none) | initializer arg (the rest)
 *   READY    worker->master, empty: the initializer ran; send tasks.
 *   TASK     master->worker: a chunk of calls of one task.  header id =
 *            chunk id, header code = count (1..FB_WIRE_CHUNK_MAX).
 *            u8 n | task[n] | count x (u32 len | arg[len])
 *   RESULT   worker->master: results of items offset..offset+count-1 of
 *            a chunk, in order.  header id = chunk id, code = count.
 *            u32 offset | u64 elapsed_ns | count x (i32 rc | u32 len |
 *            bytes[len]); when rc != 0 the bytes are the failure text
 *            (text rules).
 *   STOP     master->worker, empty: exit once idle.
 *   HEARTBEAT worker->master, empty: still alive (sent every heartbeat_ms).
 *   FAULT    worker->master, sent from a fatal-signal handler (or exit())
 *            while a task runs: header id = chunk id, code = the signal
 *            number (or 0 for exit); payload u32 offset: the item that was
 *            running.  The results before it were sent first.
 *
 *  Shared objects (queues, pipes, manager objects), on an object server's
 *  own socket; the client first sends HELLO (job id 0) and gets WELCOME:
 *   OCALL    client->server: header id = request id, code = operation.
 *            u32 object | i32 timeout_ms (-1 = forever) | u32 count |
 *            count x (u32 len | bytes[len])   (count <= FB_WIRE_LIST_MAX)
 *   OREPLY   server->client: header id = the request's id, code = status
 *            (0 or a FIBER_E* code).  u32 count | count x (u32 len |
 *            bytes); when status != 0, one item: the failure text.
 *            Replies may come in any order.
 *
 *  Shared blobs (fiber_object_*; wire_obj.c), on the master's blob
 *  server's socket or a worker's relay socket; the client first sends
 *  HELLO (job id 0) and gets WELCOME.  A ref is 40 bytes: the BLAKE2b-256
 *  hash of the bytes, then their length as a u64.  An address is 5..600
 *  bytes of printable ASCII (0x21..0x7e) starting "unix:" or "tcp:".
 *   OBJ_GET  client->server: header id = request id.  ref[40]
 *   OBJ_DATA server->client: header id = the request's id.  u64 offset |
 *            bytes (the rest; pieces come in order, the last ends at the
 *            ref's length; an empty blob is one empty piece)
 *   OBJ_FROM master->client: fetch it from a worker that holds it
 *            instead: header id = the request's id.  address (the whole
 *            payload)
 *   OBJ_NONE server->client: header id = the request's id, code = a
 *            FIBER_E* code (negative).  text (why)
 *   OBJ_HAVE client->master: I now hold ref and serve it at addr; I got it
 *            from `from` (empty: from the master).  ref[40] | u16 n |
 *            addr[n] (an address) | u16 m | from[m] (empty or an address)
 *   OBJ_BAD  client->master: the holder at addr failed to give ref.
 *            ref[40] | u16 n | addr[n] (an address)
 *   OBJ_FILE master->client on the same host (unix transport): map the
 *            master's own copy instead of receiving it.  header id = the
 *            request's id.  path (the whole payload: 2..4095 bytes of
 *            printable ASCII, starting with '/')
 *   OBJ_AT   master->client on the same host (unix transport): the blob
 *            is in the master's arena file at offset: map that file
 *            (once) and read it there.  header id = the request's id.
 *            u64 offset | path (the rest, as OBJ_FILE's).  The master
 *            keeps that place for the blob until the client sends
 *            OBJ_DROP for the ref or goes (store/arena.c).
 *   OBJ_DROP client->master: I no longer read the blob the master placed
 *            for me with OBJ_AT.  ref[40]
 *   OBJ_CALL master->pool worker, on the pool connection: the TASK chunks
 *            that follow belong to calls whose shared argument is ref
 *            (fiber_task_shared).  ref[40], or empty: none.
 *
 *  Watching a run (`fiber top`; wire_stats.c), on the master's own
 *  socket: the monitor sends HELLO with the run's token and job id 0 (no
 *  job has id 0; its build id is not checked, since the monitor is the
 *  fiber command, not the program) and gets WELCOME, then asks:
 *   STATS    monitor->master, empty: header id = request id.
 *   SNAPSHOT master->monitor: header id = the request's id.
 *            u8 format (FB_WIRE_SNAPSHOT_FORMAT: a decoder refuses any
 *            other, so a later layout is a new format number, never a
 *            silent misreading) | u32 pid | u64 uptime_ms | u64 cpu_user_us
 *            | u64 cpu_sys_us | u64 rss_bytes | u8 n | backend[n] (a name)
 *            | u32 n_pools (0..FB_WIRE_SNAPSHOT_POOLS_MAX) | n_pools x
 *            (u8 m | pool name[m] (a name) | u32 workers_alive | u32
 *            workers_starting (<= workers_alive) | u32 workers_target |
 *            u64 workers_started | u64 workers_lost | u64 tasks_submitted
 *            | u64 tasks_done | u64 tasks_failed | u64 tasks_retried | u64
 *            tasks_crashed | u64 tasks_queued | u64 tasks_in_flight)
 *
 * TEXT payloads (REJECT, EXIT) are the whole payload: their length is the
 * header's len, with no prefix of their own.
 */
#ifndef FB_WIRE_H
#define FB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

#define FB_WIRE_MAGIC 0xF1BEu
#define FB_WIRE_VERSION 1u
#define FB_WIRE_HDR_LEN 24u
#define FB_WIRE_TOKEN_LEN 32u
#define FB_WIRE_BUILD_ID_MAX 64u
#define FB_WIRE_NAME_MAX 63u
#define FB_WIRE_TEXT_MAX 1023u
#define FB_WIRE_CHUNK_MAX 65536u
#define FB_WIRE_LIST_MAX 65536u
/* The largest payload any receiver accepts, whatever its configuration. */
#define FB_WIRE_PAYLOAD_HARD_MAX (1u << 30)

/* X(NAME, value) -- message types.  Values are part of the protocol: never
 * renumber, only append. */
#define FB_MSG_TYPE_MAP(X)                                                     \
    X(HELLO, 1)                                                                \
    X(WELCOME, 2)                                                              \
    X(REJECT, 3)                                                               \
    X(RUN, 4)                                                                  \
    X(EXIT, 5)                                                                 \
    X(PING, 6)                                                                 \
    X(PONG, 7)                                                                 \
    X(POOL, 8)                                                                 \
    X(READY, 9)                                                                \
    X(TASK, 10)                                                                \
    X(RESULT, 11)                                                              \
    X(STOP, 12)                                                                \
    X(HEARTBEAT, 13)                                                           \
    X(FAULT, 14)                                                               \
    X(OCALL, 15)                                                               \
    X(OREPLY, 16)                                                              \
    X(NOTE, 17)                                                                \
    X(OBJ_GET, 30)                                                             \
    X(OBJ_DATA, 31)                                                            \
    X(OBJ_FROM, 32)                                                            \
    X(OBJ_NONE, 33)                                                            \
    X(OBJ_HAVE, 34)                                                            \
    X(OBJ_BAD, 35)                                                             \
    X(OBJ_CALL, 36)                                                            \
    X(OBJ_FILE, 37)                                                            \
    X(OBJ_AT, 38)                                                              \
    X(OBJ_DROP, 39)                                                            \
    X(STATS, 40)                                                               \
    X(SNAPSHOT, 41)                                                            \
    X(PIPE_LINK, 50)                                                           \
    X(PIPE_DATA, 51)                                                           \
    X(PIPE_CLOSE, 52)

enum fb_msg_type {
#define FB_X(name, value) FB_MSG_##name = value,
    FB_MSG_TYPE_MAP(FB_X)
#undef FB_X
};

/* Returns "HELLO", "RUN", ... or "?" for an unknown value. */
const char *fb_msg_type_name(unsigned type);

struct fb_wire_hdr {
    uint8_t type;  /* enum fb_msg_type */
    uint16_t flags;
    int32_t code;
    uint64_t id;
    uint32_t len; /* payload bytes that follow the header */
};

/* Writes the 24-byte encoding of h into out.  Always succeeds. */
void fb_wire_hdr_encode(uint8_t out[FB_WIRE_HDR_LEN],
                        const struct fb_wire_hdr *h);

/* Decodes a header from the first `avail` bytes of in.
 * Returns 0 with *h filled in; 1 when fewer than FB_WIRE_HDR_LEN bytes are
 * available (nothing consumed; read more); or FIBER_EPROTO when the bytes
 * cannot be a header: bad magic, unknown version or type, nonzero flags or
 * reserved bits, or len above max_payload (which is clamped to
 * FB_WIRE_PAYLOAD_HARD_MAX).  On FIBER_EPROTO a message naming the field
 * and the value seen is written to err (err may be NULL). */
int fb_wire_hdr_decode(const uint8_t *in, size_t avail, uint32_t max_payload,
                       struct fb_wire_hdr *h, char *err, size_t errlen);

/* ---- payloads ----
 * Decoded payloads are views: their pointers point into the buffer that
 * was decoded and are valid as long as it is.  Strings are not
 * NUL-terminated; use the length. */
struct fb_msg_hello {
    uint8_t token[FB_WIRE_TOKEN_LEN];
    const char *build_id;
    uint8_t build_id_len;
    uint64_t job_id;
    uint32_t pid;
    const char *name;
    uint8_t name_len;
};

struct fb_msg_welcome {
    uint32_t heartbeat_ms;
};

struct fb_msg_run {
    const char *task;
    uint8_t task_len;
    const void *arg;
    uint32_t arg_len;
};

struct fb_msg_text { /* REJECT and EXIT */
    const char *text;
    uint32_t len;
};

struct fb_msg_pool {
    uint32_t spin_us;
    const char *init_task; /* may be empty (init_task_len 0) */
    uint8_t init_task_len;
    const void *init_arg;
    uint32_t init_arg_len;
};

/* A decoded TASK or RESULT: the items, already validated, are walked with
 * fb_wire_task_next / fb_wire_result_next. */
struct fb_msg_task {
    const char *task;
    uint8_t task_len;
    uint32_t count;
    const uint8_t *items; /* count x (u32 len | arg) */
};

struct fb_msg_result {
    uint32_t offset;
    uint64_t elapsed_ns;
    uint32_t count;
    const uint8_t *items; /* count x (i32 rc | u32 len | bytes) */
};

/* Each encoder appends one complete frame (header and payload) to out,
 * taking the header's id and code from its arguments.  It validates what
 * it is given by the same rules as the decoder, so fiber never sends what
 * it would refuse.  Returns 0, FIBER_EINVAL (a field breaks the rules; out
 * unchanged) or FIBER_ENOMEM (out unchanged). */
int fb_wire_put_hello(fiber_buf *out, const struct fb_msg_hello *m);
int fb_wire_put_welcome(fiber_buf *out, const struct fb_msg_welcome *m);
int fb_wire_put_reject(fiber_buf *out, const char *text, size_t len);
int fb_wire_put_run(fiber_buf *out, uint64_t id, const struct fb_msg_run *m);
int fb_wire_put_exit(fiber_buf *out, int32_t code, const char *text,
                     size_t len);
int fb_wire_put_note(fiber_buf *out, int32_t kind, const char *text,
                     size_t len);
int fb_wire_put_ping(fiber_buf *out, uint64_t id);
int fb_wire_put_pong(fiber_buf *out, uint64_t id);

int fb_wire_put_pool(fiber_buf *out, const struct fb_msg_pool *m);
/* FAULT is 28 bytes; written into a caller's array so that a signal
 * handler can send it without allocating. */
#define FB_WIRE_FAULT_LEN (FB_WIRE_HDR_LEN + 4u)
void fb_wire_fault_encode(uint8_t out[FB_WIRE_FAULT_LEN], uint64_t chunk_id,
                          int32_t sig, uint32_t offset);
/* READY, STOP, HEARTBEAT, PING, PONG and STATS: an empty frame of that
 * type. */
int fb_wire_put_empty(fiber_buf *out, unsigned type, uint64_t id);

/* TASK and RESULT frames are built in place, item by item, because they
 * are the hot path: _begin appends the header and fixed fields and gives a
 * mark; _add appends one item; _end patches the header's len and count.
 * Between _begin and _end nothing else may be appended to out.  On failure
 * (FIBER_EINVAL, FIBER_ENOMEM) out->len is as before the failed call;
 * a caller abandoning a frame sets out->len = mark. */
int fb_wire_task_begin(fiber_buf *out, uint64_t id, const char *task,
                       size_t task_len, size_t *mark);
int fb_wire_task_add(fiber_buf *out, const void *arg, uint32_t len);
/* Appends one item made of count parts back to back (their total at most
 * UINT32_MAX bytes): a header and a payload without joining them first. */
int fb_wire_task_add_parts(fiber_buf *out, const fiber_iov *parts,
                           size_t count);
void fb_wire_task_end(fiber_buf *out, size_t mark, uint32_t count);

int fb_wire_result_begin(fiber_buf *out, uint64_t id, uint32_t offset,
                         size_t *mark);
int fb_wire_result_add(fiber_buf *out, int32_t rc, const void *data,
                       uint32_t len);
void fb_wire_result_end(fiber_buf *out, size_t mark, uint32_t count,
                        uint64_t elapsed_ns);

/* Each decoder reads a payload of exactly len bytes (the header's len) and
 * fills in *m.  Returns 0, or FIBER_EPROTO with a message in err naming
 * the field (truncated, too long, bad characters, trailing bytes). */
int fb_wire_get_hello(const uint8_t *p, size_t len, struct fb_msg_hello *m,
                      char *err, size_t errlen);
int fb_wire_get_welcome(const uint8_t *p, size_t len,
                        struct fb_msg_welcome *m, char *err, size_t errlen);
int fb_wire_get_run(const uint8_t *p, size_t len, struct fb_msg_run *m,
                    char *err, size_t errlen);
int fb_wire_get_text(const uint8_t *p, size_t len, struct fb_msg_text *m,
                     char *err, size_t errlen);
int fb_wire_get_pool(const uint8_t *p, size_t len, struct fb_msg_pool *m,
                     char *err, size_t errlen);
/* count is the header's code; every item is checked here, so the
 * iterators below need no checks of their own. */
int fb_wire_get_task(const uint8_t *p, size_t len, int32_t count,
                     struct fb_msg_task *m, char *err, size_t errlen);
int fb_wire_get_result(const uint8_t *p, size_t len, int32_t count,
                       struct fb_msg_result *m, char *err, size_t errlen);

/* A direct pipe link (src/pipe/pipe.c), after the two HELLOs:
 *   PIPE_LINK   u64 relayed: how many messages the sender put on the
 *               pipe's relayed queue before the link (read those first);
 *   PIPE_DATA   one message, the payload as it was sent;
 *   PIPE_CLOSE  empty: the sender closed its sending direction. */
int fb_wire_put_pipe_link(fiber_buf *out, uint64_t relayed);
int fb_wire_get_pipe_link(const uint8_t *p, size_t len, uint64_t *relayed,
                          char *err, size_t errlen);
int fb_wire_put_pipe_data(fiber_buf *out, const void *data, uint32_t len);

/* Walks the items of a decoded TASK / RESULT: *cursor starts at
 * m->items; each call returns the next item and advances it. */
void fb_wire_task_next(const uint8_t **cursor, const void **arg,
                       uint32_t *len);
void fb_wire_result_next(const uint8_t **cursor, int32_t *rc,
                         const void **data, uint32_t *len);

/* A decoded OCALL / OREPLY: items walked with fb_wire_task_next (the same
 * u32 len | bytes layout). */
struct fb_msg_ocall {
    uint32_t obj;
    int32_t timeout_ms;
    uint32_t count;
    const uint8_t *items;
};

struct fb_msg_oreply {
    uint32_t count;
    const uint8_t *items;
};

int fb_wire_get_ocall(const uint8_t *p, size_t len, struct fb_msg_ocall *m,
                      char *err, size_t errlen);
int fb_wire_get_oreply(const uint8_t *p, size_t len, int32_t status,
                       struct fb_msg_oreply *m, char *err, size_t errlen);
int fb_wire_put_ocall(fiber_buf *out, uint64_t id, int32_t op, uint32_t obj,
                      int32_t timeout_ms, const fiber_iov *items,
                      size_t count);
int fb_wire_put_oreply(fiber_buf *out, uint64_t id, int32_t status,
                       const fiber_iov *items, size_t count);

/* ---- shared blobs (wire_obj.c) ---- */
#define FB_WIRE_REF_LEN 40u
#define FB_WIRE_ADDR_MAX 600u

struct fb_msg_obj_data {
    uint64_t offset;
    const uint8_t *bytes;
    uint32_t len;
};

struct fb_msg_obj_have {
    const uint8_t *ref; /* FB_WIRE_REF_LEN bytes */
    const char *addr;
    uint16_t addr_len;
    const char *from; /* may be empty */
    uint16_t from_len;
};

/* OBJ_GET: exactly a ref. */
int fb_wire_get_obj_get(const uint8_t *p, size_t len, const uint8_t **ref,
                        char *err, size_t errlen);
int fb_wire_get_obj_data(const uint8_t *p, size_t len,
                         struct fb_msg_obj_data *m, char *err, size_t errlen);
/* OBJ_FROM: an address. */
int fb_wire_get_obj_from(const uint8_t *p, size_t len, const char **addr,
                         uint32_t *addr_len, char *err, size_t errlen);
/* OBJ_NONE: code must be negative; the payload is text. */
int fb_wire_get_obj_none(int32_t code, const uint8_t *p, size_t len,
                         struct fb_msg_text *m, char *err, size_t errlen);
/* OBJ_FILE: a path. */
int fb_wire_get_obj_file(const uint8_t *p, size_t len, const char **path,
                         uint32_t *path_len, char *err, size_t errlen);
int fb_wire_put_obj_file(fiber_buf *out, uint64_t id, const char *path);
/* OBJ_AT: an offset and a path. */
int fb_wire_get_obj_at(const uint8_t *p, size_t len, uint64_t *offset,
                       const char **path, uint32_t *path_len, char *err,
                       size_t errlen);
int fb_wire_put_obj_at(fiber_buf *out, uint64_t id, uint64_t offset,
                       const char *path);
/* OBJ_DROP: exactly a ref. */
int fb_wire_get_obj_drop(const uint8_t *p, size_t len, const uint8_t **ref,
                         char *err, size_t errlen);
int fb_wire_put_obj_drop(fiber_buf *out, const uint8_t ref[FB_WIRE_REF_LEN]);
/* OBJ_CALL: *ref is NULL when the payload is empty. */
int fb_wire_get_obj_call(const uint8_t *p, size_t len, const uint8_t **ref,
                         char *err, size_t errlen);
int fb_wire_put_obj_call(fiber_buf *out, const uint8_t *ref);
/* OBJ_HAVE and OBJ_BAD (which has no `from`: from_len is 0). */
int fb_wire_get_obj_have(const uint8_t *p, size_t len,
                         struct fb_msg_obj_have *m, char *err, size_t errlen);
int fb_wire_get_obj_bad(const uint8_t *p, size_t len,
                        struct fb_msg_obj_have *m, char *err, size_t errlen);

int fb_wire_put_obj_get(fiber_buf *out, uint64_t id,
                        const uint8_t ref[FB_WIRE_REF_LEN]);
/* Appends only the header and the offset: the caller appends len bytes
 * right after (no copy through the encoder). */
int fb_wire_put_obj_data_hdr(fiber_buf *out, uint64_t id, uint64_t offset,
                             uint32_t len);
int fb_wire_put_obj_from(fiber_buf *out, uint64_t id, const char *addr);
int fb_wire_put_obj_none(fiber_buf *out, uint64_t id, int32_t code,
                         const char *text);
int fb_wire_put_obj_have(fiber_buf *out, const uint8_t ref[FB_WIRE_REF_LEN],
                         const char *addr, const char *from);
int fb_wire_put_obj_bad(fiber_buf *out, const uint8_t ref[FB_WIRE_REF_LEN],
                        const char *addr);
/* The payload check for the types above (fb_wire_check_payload calls it):
 * returns 0, FIBER_EPROTO, or 1 when h->type is not one of them. */
int fb_wire_check_obj(const struct fb_wire_hdr *h, const uint8_t *p,
                      char *err, size_t errlen);

/* ---- watching a run (wire_stats.c) ---- */
#define FB_WIRE_SNAPSHOT_FORMAT 1u
#define FB_WIRE_SNAPSHOT_POOLS_MAX 256u

struct fb_msg_snapshot_pool {
    const char *name;
    uint8_t name_len;
    uint32_t workers_alive, workers_starting, workers_target;
    uint64_t workers_started, workers_lost;
    uint64_t tasks_submitted, tasks_done, tasks_failed, tasks_retried;
    uint64_t tasks_crashed, tasks_queued, tasks_in_flight;
};

struct fb_msg_snapshot {
    uint32_t pid;
    uint64_t uptime_ms, cpu_user_us, cpu_sys_us, rss_bytes;
    const char *backend;
    uint8_t backend_len;
    uint32_t n_pools;
    const uint8_t *pools; /* decoded: walk with fb_wire_snapshot_next */
};

/* SNAPSHOT: checks every pool record, so the iterator needs no checks. */
int fb_wire_get_snapshot(const uint8_t *p, size_t len,
                         struct fb_msg_snapshot *m, char *err, size_t errlen);
/* Walks the pools of a decoded SNAPSHOT: *cursor starts at m->pools. */
void fb_wire_snapshot_next(const uint8_t **cursor,
                           struct fb_msg_snapshot_pool *pool);
/* Appends a SNAPSHOT of m (its pools field is ignored) and the n pools of
 * pools (n <= FB_WIRE_SNAPSHOT_POOLS_MAX). */
int fb_wire_put_snapshot(fiber_buf *out, uint64_t id,
                         const struct fb_msg_snapshot *m,
                         const struct fb_msg_snapshot_pool *pools, size_t n);
/* The payload check for STATS and SNAPSHOT (fb_wire_check_payload calls
 * it): returns 0, FIBER_EPROTO, or 1 when h->type is neither. */
int fb_wire_check_stats(const struct fb_wire_hdr *h, const uint8_t *p,
                        char *err, size_t errlen);

/* FAULT: exactly a u32 offset. */
int fb_wire_get_fault(const uint8_t *p, size_t len, uint32_t *offset,
                      char *err, size_t errlen);

/* PING, PONG, READY, STOP, HEARTBEAT, STATS: accepts only len == 0. */
int fb_wire_get_empty(size_t len, char *err, size_t errlen);

/* Decodes the payload of a frame whatever its type, by dispatching on
 * h->type to the decoders above.  Returns 0 or FIBER_EPROTO.  This is what
 * the fuzz target drives. */
int fb_wire_check_payload(const struct fb_wire_hdr *h, const uint8_t *p,
                          char *err, size_t errlen);

#endif /* FB_WIRE_H */
