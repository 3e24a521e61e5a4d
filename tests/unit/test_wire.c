/*
 * test_wire.c -- the wire format: exact byte layout, round trips of every
 * message, and rejection (never a crash) of malformed input.
 *
 * Malformed frames are built here byte by byte rather than with the
 * encoders, both because the encoders refuse to produce them and so that
 * the layout is checked by a second, independent implementation.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "harness.h"
#include "wire/wire.h"

#define ERRLEN 256

/* ---- helpers ------------------------------------------------------------ */

static void le16(uint8_t *p, unsigned v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void le32(uint8_t *p, uint32_t v)
{
    le16(p, v & 0xffff);
    le16(p + 2, v >> 16);
}

static void le64(uint8_t *p, uint64_t v)
{
    le32(p, (uint32_t)v);
    le32(p + 4, (uint32_t)(v >> 32));
}

/* Writes a header with every field chosen by the caller, valid or not. */
static void raw_hdr(uint8_t *b, unsigned magic, unsigned version,
                    unsigned type, unsigned flags, unsigned reserved,
                    uint32_t code, uint64_t id, uint32_t len)
{
    le16(b, magic);
    b[2] = (uint8_t)version;
    b[3] = (uint8_t)type;
    le16(b + 4, flags);
    le16(b + 6, reserved);
    le32(b + 8, code);
    le64(b + 12, id);
    le32(b + 20, len);
}

static void good_hdr(uint8_t *b, unsigned type, uint32_t len)
{
    raw_hdr(b, FB_WIRE_MAGIC, FB_WIRE_VERSION, type, 0, 0, 0, 0, len);
}

/* Decodes a header expected to be malformed and returns its message. */
static const char *hdr_error(const uint8_t *b, uint32_t max_payload)
{
    static char err[ERRLEN];
    struct fb_wire_hdr h;
    err[0] = '\0';
    CHECK_ERR(fb_wire_hdr_decode(b, FB_WIRE_HDR_LEN, max_payload, &h, err,
                                 sizeof err),
              FIBER_EPROTO);
    CHECK(err[0] != '\0');
    return err;
}

/* Builds a HELLO payload from its parts; returns its length. */
static size_t raw_hello(uint8_t *out, const char *build_id, size_t n,
                        const char *name, size_t m)
{
    size_t at = 0;
    for (unsigned i = 0; i < FB_WIRE_TOKEN_LEN; i++)
        out[at++] = (uint8_t)(0xa0 + i);
    out[at++] = (uint8_t)n;
    memcpy(out + at, build_id, n);
    at += n;
    le64(out + at, 0x0102030405060708u);
    at += 8;
    le32(out + at, 4242);
    at += 4;
    out[at++] = (uint8_t)m;
    memcpy(out + at, name, m);
    return at + m;
}

static struct fb_msg_hello sample_hello(void)
{
    struct fb_msg_hello m = {.build_id = "0123456789abcdef",
                             .build_id_len = 16,
                             .job_id = 0x0102030405060708u,
                             .pid = 4242,
                             .name = "Process-1",
                             .name_len = 9};
    for (unsigned i = 0; i < FB_WIRE_TOKEN_LEN; i++)
        m.token[i] = (uint8_t)(0xa0 + i);
    return m;
}

/* Decodes the frame at b->data + *off, checks its payload, and advances
 * *off past it; returns a pointer to the payload. */
static const uint8_t *next_frame(const fiber_buf *b, size_t *off,
                                 struct fb_wire_hdr *h)
{
    char err[ERRLEN] = "";
    CHECK_OK(fb_wire_hdr_decode(b->data + *off, b->len - *off, UINT32_MAX, h,
                                err, sizeof err));
    CHECK(b->len - *off >= FB_WIRE_HDR_LEN + h->len);
    const uint8_t *p = b->data + *off + FB_WIRE_HDR_LEN;
    CHECK_OK(fb_wire_check_payload(h, p, err, sizeof err));
    *off += FB_WIRE_HDR_LEN + h->len;
    return p;
}

static void check_field_error(const char *err, const char *field)
{
    CHECK(err[0] != '\0');
    CHECK_CONTAINS(err, field);
    CHECK_CONTAINS(fiber_last_error(), field);
}

/* ---- message types and headers ------------------------------------------ */

TEST(type_names)
{
    CHECK_STR(fb_msg_type_name(FB_MSG_HELLO), "HELLO");
    CHECK_STR(fb_msg_type_name(FB_MSG_WELCOME), "WELCOME");
    CHECK_STR(fb_msg_type_name(FB_MSG_REJECT), "REJECT");
    CHECK_STR(fb_msg_type_name(FB_MSG_RUN), "RUN");
    CHECK_STR(fb_msg_type_name(FB_MSG_EXIT), "EXIT");
    CHECK_STR(fb_msg_type_name(FB_MSG_PING), "PING");
    CHECK_STR(fb_msg_type_name(FB_MSG_PONG), "PONG");
    CHECK_STR(fb_msg_type_name(FB_MSG_POOL), "POOL");
    CHECK_STR(fb_msg_type_name(FB_MSG_READY), "READY");
    CHECK_STR(fb_msg_type_name(FB_MSG_TASK), "TASK");
    CHECK_STR(fb_msg_type_name(FB_MSG_RESULT), "RESULT");
    CHECK_STR(fb_msg_type_name(FB_MSG_STOP), "STOP");
    CHECK_STR(fb_msg_type_name(FB_MSG_HEARTBEAT), "HEARTBEAT");
    CHECK_STR(fb_msg_type_name(FB_MSG_FAULT), "FAULT");
    CHECK_STR(fb_msg_type_name(0), "?");
    CHECK_STR(fb_msg_type_name(FB_MSG_STATS), "STATS");
    CHECK_STR(fb_msg_type_name(FB_MSG_SNAPSHOT), "SNAPSHOT");
    CHECK_STR(fb_msg_type_name(20), "?");
    CHECK_STR(fb_msg_type_name(200), "?");
}

/* The exact bytes are the protocol; this pins them. */
TEST(hdr_golden_bytes)
{
    static const uint8_t want[FB_WIRE_HDR_LEN] = {
        0xbe, 0xf1, 0x01, 0x05, 0x00, 0x00, 0x00, 0x00,
        0xfe, 0xff, 0xff, 0xff, 0x08, 0x07, 0x06, 0x05,
        0x04, 0x03, 0x02, 0x01, 0x78, 0x56, 0x34, 0x12};
    struct fb_wire_hdr h = {.type = FB_MSG_EXIT, .code = -2,
                            .id = 0x0102030405060708u, .len = 0x12345678};
    uint8_t out[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(out, &h);
    CHECK(memcmp(out, want, sizeof want) == 0);
    struct fb_wire_hdr back;
    CHECK_OK(fb_wire_hdr_decode(want, sizeof want, UINT32_MAX, &back, NULL, 0));
    CHECK_EQ(back.type, FB_MSG_EXIT);
    CHECK_EQ(back.flags, 0);
    CHECK_EQ(back.code, -2);
    CHECK(back.id == 0x0102030405060708u);
    CHECK_EQ(back.len, 0x12345678);
}

TEST(hdr_round_trip)
{
    static const int32_t codes[] = {0, 1, -1, INT32_MIN, INT32_MAX};
    static const uint64_t ids[] = {0, 1, UINT64_MAX, 0x8000000000000000u};
    for (unsigned type = FB_MSG_HELLO; type <= FB_MSG_FAULT; type++) {
        for (size_t i = 0; i < FB_ARRAY_LEN(codes); i++) {
            struct fb_wire_hdr h = {.type = (uint8_t)type, .code = codes[i],
                                    .id = ids[i % FB_ARRAY_LEN(ids)],
                                    .len = (uint32_t)i * 1000};
            uint8_t b[FB_WIRE_HDR_LEN];
            struct fb_wire_hdr back;
            fb_wire_hdr_encode(b, &h);
            CHECK_OK(fb_wire_hdr_decode(b, sizeof b, 1u << 20, &back, NULL, 0));
            CHECK_EQ(back.type, type);
            CHECK_EQ(back.code, codes[i]);
            CHECK(back.id == h.id);
            CHECK_EQ(back.len, h.len);
        }
    }
}

TEST(hdr_short_returns_1)
{
    uint8_t good[FB_WIRE_HDR_LEN], junk[FB_WIRE_HDR_LEN];
    good_hdr(good, FB_MSG_PING, 0);
    memset(junk, 0xff, sizeof junk);
    for (size_t avail = 0; avail < FB_WIRE_HDR_LEN; avail++) {
        struct fb_wire_hdr h = {.type = 99, .len = 12345};
        char err[ERRLEN] = "untouched";
        CHECK_EQ(fb_wire_hdr_decode(good, avail, 100, &h, err, sizeof err), 1);
        CHECK_EQ(fb_wire_hdr_decode(junk, avail, 100, &h, err, sizeof err), 1);
        CHECK_EQ(h.type, 99);
        CHECK_EQ(h.len, 12345);
        CHECK_STR(err, "untouched");
    }
    struct fb_wire_hdr h;
    CHECK_EQ(fb_wire_hdr_decode(good, FB_WIRE_HDR_LEN, 100, &h, NULL, 0), 0);
}

TEST(hdr_bad_magic)
{
    uint8_t b[FB_WIRE_HDR_LEN];
    raw_hdr(b, 0x1234, FB_WIRE_VERSION, FB_MSG_PING, 0, 0, 0, 0, 0);
    const char *err = hdr_error(b, 100);
    check_field_error(err, "magic");
    CHECK_CONTAINS(err, "0x1234");
    /* Big-endian magic: the classic byte-order mistake. */
    raw_hdr(b, 0xBEF1, FB_WIRE_VERSION, FB_MSG_PING, 0, 0, 0, 0, 0);
    check_field_error(hdr_error(b, 100), "magic");
}

TEST(hdr_bad_version)
{
    uint8_t b[FB_WIRE_HDR_LEN];
    raw_hdr(b, FB_WIRE_MAGIC, 0, FB_MSG_PING, 0, 0, 0, 0, 0);
    check_field_error(hdr_error(b, 100), "version");
    raw_hdr(b, FB_WIRE_MAGIC, 2, FB_MSG_PING, 0, 0, 0, 0, 0);
    const char *err = hdr_error(b, 100);
    check_field_error(err, "version");
    CHECK_CONTAINS(err, "2");
}

TEST(hdr_unknown_type)
{
    static const unsigned bad[] = {0, 20, 200, 255};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        uint8_t b[FB_WIRE_HDR_LEN];
        char want[16];
        good_hdr(b, bad[i], 0);
        const char *err = hdr_error(b, 100);
        check_field_error(err, "type");
        snprintf(want, sizeof want, "%u", bad[i]);
        CHECK_CONTAINS(err, want);
    }
}

TEST(hdr_nonzero_flags)
{
    static const unsigned bad[] = {1, 0x100, 0x8000, 0xffff};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        uint8_t b[FB_WIRE_HDR_LEN];
        raw_hdr(b, FB_WIRE_MAGIC, FB_WIRE_VERSION, FB_MSG_PING, bad[i], 0, 0,
                0, 0);
        check_field_error(hdr_error(b, 100), "flags");
    }
    uint8_t b[FB_WIRE_HDR_LEN];
    raw_hdr(b, FB_WIRE_MAGIC, FB_WIRE_VERSION, FB_MSG_PING, 0x8000, 0, 0, 0, 0);
    CHECK_CONTAINS(hdr_error(b, 100), "0x8000");
}

TEST(hdr_nonzero_reserved)
{
    static const unsigned bad[] = {1, 0x100, 0xffff};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        uint8_t b[FB_WIRE_HDR_LEN];
        raw_hdr(b, FB_WIRE_MAGIC, FB_WIRE_VERSION, FB_MSG_PING, 0, bad[i], 0,
                0, 0);
        check_field_error(hdr_error(b, 100), "reserved");
    }
}

TEST(hdr_len_above_max_payload)
{
    uint8_t b[FB_WIRE_HDR_LEN];
    struct fb_wire_hdr h;
    good_hdr(b, FB_MSG_RUN, 100);
    CHECK_OK(fb_wire_hdr_decode(b, sizeof b, 100, &h, NULL, 0));
    CHECK_EQ(h.len, 100);
    good_hdr(b, FB_MSG_RUN, 101);
    const char *err = hdr_error(b, 100);
    check_field_error(err, "len");
    CHECK_CONTAINS(err, "101");
    good_hdr(b, FB_MSG_PING, 1);
    check_field_error(hdr_error(b, 0), "len");
}

TEST(hdr_len_above_hard_max)
{
    uint8_t b[FB_WIRE_HDR_LEN];
    struct fb_wire_hdr h;
    good_hdr(b, FB_MSG_RUN, FB_WIRE_PAYLOAD_HARD_MAX);
    CHECK_OK(fb_wire_hdr_decode(b, sizeof b, UINT32_MAX, &h, NULL, 0));
    CHECK_EQ(h.len, FB_WIRE_PAYLOAD_HARD_MAX);
    good_hdr(b, FB_MSG_RUN, FB_WIRE_PAYLOAD_HARD_MAX + 1);
    check_field_error(hdr_error(b, UINT32_MAX), "len");
    good_hdr(b, FB_MSG_RUN, UINT32_MAX);
    check_field_error(hdr_error(b, UINT32_MAX), "len");
}

TEST(hdr_error_buffer_handling)
{
    uint8_t b[FB_WIRE_HDR_LEN];
    struct fb_wire_hdr h;
    raw_hdr(b, 0x1234, FB_WIRE_VERSION, FB_MSG_PING, 0, 0, 0, 0, 0);
    /* err may be NULL; the thread's last error still says why. */
    CHECK_ERR(fb_wire_hdr_decode(b, sizeof b, 100, &h, NULL, 0), FIBER_EPROTO);
    CHECK_CONTAINS(fiber_last_error(), "magic");
    /* A short err is truncated and still NUL-terminated. */
    char small[8];
    memset(small, 'x', sizeof small);
    CHECK_ERR(fb_wire_hdr_decode(b, sizeof b, 100, &h, small, sizeof small),
              FIBER_EPROTO);
    CHECK_EQ(strlen(small), sizeof small - 1);
    /* errlen 0 means no room: err is not written at all. */
    char none[4] = "abc";
    CHECK_ERR(fb_wire_hdr_decode(b, sizeof b, 100, &h, none, 0), FIBER_EPROTO);
    CHECK_STR(none, "abc");
}

/* ---- round trips ---------------------------------------------------------- */

TEST(round_trip_hello)
{
    fiber_buf b = {0};
    struct fb_msg_hello in = sample_hello(), out;
    CHECK_OK(fb_wire_put_hello(&b, &in));
    size_t off = 0;
    struct fb_wire_hdr h;
    const uint8_t *p = next_frame(&b, &off, &h);
    CHECK_EQ(off, b.len);
    CHECK_EQ(h.type, FB_MSG_HELLO);
    CHECK_EQ(h.len, 32 + 1 + 16 + 8 + 4 + 1 + 9);
    CHECK_OK(fb_wire_get_hello(p, h.len, &out, NULL, 0));
    CHECK(memcmp(out.token, in.token, FB_WIRE_TOKEN_LEN) == 0);
    CHECK_EQ(out.build_id_len, 16);
    CHECK(memcmp(out.build_id, in.build_id, 16) == 0);
    CHECK(out.job_id == in.job_id);
    CHECK_EQ(out.pid, 4242);
    CHECK_EQ(out.name_len, 9);
    CHECK(memcmp(out.name, "Process-1", 9) == 0);
    /* Decoded strings are views into the buffer, not copies. */
    CHECK((const uint8_t *)out.name > p && (const uint8_t *)out.name < p + h.len);
    /* The encoding matches the independent builder byte for byte. */
    uint8_t raw[128];
    size_t n = raw_hello(raw, "0123456789abcdef", 16, "Process-1", 9);
    CHECK_EQ(n, h.len);
    CHECK(memcmp(raw, p, n) == 0);
    fiber_buf_free(&b);
}

TEST(round_trip_hello_limits)
{
    char build_id[FB_WIRE_BUILD_ID_MAX], name[FB_WIRE_NAME_MAX];
    memset(build_id, 'f', sizeof build_id);
    memset(name, 'Z', sizeof name);
    struct fb_msg_hello in = sample_hello(), out;
    in.build_id = build_id;
    in.build_id_len = sizeof build_id;
    in.name = name;
    in.name_len = sizeof name;
    in.job_id = UINT64_MAX;
    in.pid = UINT32_MAX;
    fiber_buf b = {0};
    CHECK_OK(fb_wire_put_hello(&b, &in));
    size_t off = 0;
    struct fb_wire_hdr h;
    const uint8_t *p = next_frame(&b, &off, &h);
    CHECK_OK(fb_wire_get_hello(p, h.len, &out, NULL, 0));
    CHECK_EQ(out.build_id_len, FB_WIRE_BUILD_ID_MAX);
    CHECK_EQ(out.name_len, FB_WIRE_NAME_MAX);
    CHECK(out.job_id == UINT64_MAX);
    CHECK(out.pid == UINT32_MAX);
    fiber_buf_free(&b);
}

TEST(round_trip_welcome)
{
    static const uint32_t beats[] = {0, 1000, UINT32_MAX};
    for (size_t i = 0; i < FB_ARRAY_LEN(beats); i++) {
        fiber_buf b = {0};
        struct fb_msg_welcome in = {beats[i]}, out;
        CHECK_OK(fb_wire_put_welcome(&b, &in));
        size_t off = 0;
        struct fb_wire_hdr h;
        const uint8_t *p = next_frame(&b, &off, &h);
        CHECK_EQ(h.type, FB_MSG_WELCOME);
        CHECK_EQ(h.len, 4);
        CHECK_OK(fb_wire_get_welcome(p, h.len, &out, NULL, 0));
        CHECK(out.heartbeat_ms == beats[i]);
        fiber_buf_free(&b);
    }
}

static void text_round_trip(unsigned type, int32_t code, const char *text,
                            size_t len)
{
    fiber_buf b = {0};
    if (type == FB_MSG_REJECT)
        CHECK_OK(fb_wire_put_reject(&b, text, len));
    else
        CHECK_OK(fb_wire_put_exit(&b, code, text, len));
    size_t off = 0;
    struct fb_wire_hdr h;
    const uint8_t *p = next_frame(&b, &off, &h);
    CHECK_EQ(h.type, type);
    CHECK_EQ(h.code, code);
    CHECK_EQ(h.len, len);
    struct fb_msg_text out;
    CHECK_OK(fb_wire_get_text(p, h.len, &out, NULL, 0));
    CHECK_EQ(out.len, len);
    CHECK(len == 0 || memcmp(out.text, text, len) == 0);
    fiber_buf_free(&b);
}

TEST(round_trip_reject)
{
    text_round_trip(FB_MSG_REJECT, 0, "bad token", 9);
    text_round_trip(FB_MSG_REJECT, 0, "", 0);
    text_round_trip(FB_MSG_REJECT, 0, NULL, 0);
    char longest[FB_WIRE_TEXT_MAX];
    memset(longest, '\xff', sizeof longest); /* any byte but NUL */
    text_round_trip(FB_MSG_REJECT, 0, longest, sizeof longest);
}

TEST(round_trip_exit)
{
    text_round_trip(FB_MSG_EXIT, 0, "", 0);
    text_round_trip(FB_MSG_EXIT, 3, "task failed: want an int", 24);
    text_round_trip(FB_MSG_EXIT, -9, "killed\n", 7);
    text_round_trip(FB_MSG_EXIT, INT32_MIN, "", 0);
    text_round_trip(FB_MSG_EXIT, INT32_MAX, "x", 1);
}

TEST(round_trip_run)
{
    static const uint8_t arg[] = {0, 1, 2, 0xff, 0};
    struct {
        const char *task;
        const void *arg;
        uint32_t arg_len;
        uint64_t id;
    } cases[] = {{"square", arg, sizeof arg, 7},
                 {"a", NULL, 0, 0},
                 {"Task_2", arg, 0, UINT64_MAX}};
    for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
        fiber_buf b = {0};
        struct fb_msg_run in = {cases[i].task, (uint8_t)strlen(cases[i].task),
                                cases[i].arg, cases[i].arg_len},
                          out;
        CHECK_OK(fb_wire_put_run(&b, cases[i].id, &in));
        size_t off = 0;
        struct fb_wire_hdr h;
        const uint8_t *p = next_frame(&b, &off, &h);
        CHECK_EQ(h.type, FB_MSG_RUN);
        CHECK(h.id == cases[i].id);
        CHECK_OK(fb_wire_get_run(p, h.len, &out, NULL, 0));
        CHECK_EQ(out.task_len, in.task_len);
        CHECK(memcmp(out.task, in.task, in.task_len) == 0);
        CHECK_EQ(out.arg_len, in.arg_len);
        CHECK(in.arg_len == 0 || memcmp(out.arg, in.arg, in.arg_len) == 0);
        fiber_buf_free(&b);
    }
}

TEST(run_golden_bytes)
{
    static const uint8_t want[] = {
        0xbe, 0xf1, 0x01, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, /* magic..code */
        0x07, 0, 0, 0, 0, 0, 0, 0,                        /* id 7 */
        0x05, 0, 0, 0,                                    /* len 5 */
        0x02, 's', 'q', 0x2a, 0x00};                      /* task, arg */
    static const uint8_t arg[] = {0x2a, 0x00};
    struct fb_msg_run m = {"sq", 2, arg, sizeof arg};
    fiber_buf b = {0};
    CHECK_OK(fb_wire_put_run(&b, 7, &m));
    CHECK_EQ(b.len, sizeof want);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    fiber_buf_free(&b);
}

TEST(round_trip_ping_pong)
{
    static const uint64_t ids[] = {0, 42, UINT64_MAX};
    for (size_t i = 0; i < FB_ARRAY_LEN(ids); i++) {
        fiber_buf b = {0};
        CHECK_OK(fb_wire_put_ping(&b, ids[i]));
        CHECK_OK(fb_wire_put_pong(&b, ids[i]));
        CHECK_EQ(b.len, 2 * FB_WIRE_HDR_LEN);
        size_t off = 0;
        struct fb_wire_hdr h;
        next_frame(&b, &off, &h);
        CHECK_EQ(h.type, FB_MSG_PING);
        CHECK(h.id == ids[i]);
        CHECK_EQ(h.len, 0);
        next_frame(&b, &off, &h);
        CHECK_EQ(h.type, FB_MSG_PONG);
        CHECK(h.id == ids[i]);
        CHECK_OK(fb_wire_get_empty(h.len, NULL, 0));
        fiber_buf_free(&b);
    }
}

/* Encoders append: several frames in one buffer decode one after another. */
TEST(frames_concatenate)
{
    fiber_buf b = {0};
    struct fb_msg_hello hello = sample_hello();
    struct fb_msg_welcome welcome = {500};
    struct fb_msg_run run = {"cube", 4, "abc", 3};
    CHECK_OK(fb_wire_put_hello(&b, &hello));
    CHECK_OK(fb_wire_put_welcome(&b, &welcome));
    CHECK_OK(fb_wire_put_run(&b, 9, &run));
    CHECK_OK(fb_wire_put_ping(&b, 1));
    CHECK_OK(fb_wire_put_pong(&b, 1));
    CHECK_OK(fb_wire_put_exit(&b, 0, "", 0));
    CHECK_OK(fb_wire_put_reject(&b, "bye", 3));
    static const unsigned want[] = {FB_MSG_HELLO, FB_MSG_WELCOME, FB_MSG_RUN,
                                    FB_MSG_PING,  FB_MSG_PONG,    FB_MSG_EXIT,
                                    FB_MSG_REJECT};
    size_t off = 0;
    for (size_t i = 0; i < FB_ARRAY_LEN(want); i++) {
        struct fb_wire_hdr h;
        next_frame(&b, &off, &h);
        CHECK_EQ(h.type, want[i]);
    }
    CHECK_EQ(off, b.len);
    fiber_buf_free(&b);
}

/* ---- truncation and trailing bytes ---------------------------------------- */

TEST(hello_truncated_at_every_length)
{
    fiber_buf b = {0};
    struct fb_msg_hello in = sample_hello();
    CHECK_OK(fb_wire_put_hello(&b, &in));
    const uint8_t *p = b.data + FB_WIRE_HDR_LEN;
    size_t len = b.len - FB_WIRE_HDR_LEN;
    for (size_t cut = 0; cut < len; cut++) {
        /* An exactly sized copy lets ASan see any read past the cut. */
        uint8_t *copy = malloc(cut ? cut : 1);
        CHECK(copy);
        memcpy(copy, p, cut);
        struct fb_msg_hello out = {.pid = 77};
        char err[ERRLEN] = "";
        CHECK_ERR(fb_wire_get_hello(copy, cut, &out, err, sizeof err),
                  FIBER_EPROTO);
        CHECK_CONTAINS(err, "HELLO");
        CHECK_CONTAINS(err, "truncated");
        CHECK_EQ(out.pid, 77); /* a failed decode leaves *m alone */
        struct fb_wire_hdr h = {.type = FB_MSG_HELLO, .len = (uint32_t)cut};
        CHECK_ERR(fb_wire_check_payload(&h, copy, NULL, 0), FIBER_EPROTO);
        free(copy);
    }
    fiber_buf_free(&b);
}

TEST(hello_truncation_names_field)
{
    uint8_t raw[128];
    size_t n = raw_hello(raw, "abc", 3, "w", 1);
    char err[ERRLEN];
    struct fb_msg_hello out;
    static const struct {
        size_t cut;
        const char *field;
    } cases[] = {{10, "token"},  {32, "build_id"}, {34, "build_id"},
                 {36, "job_id"}, {44, "pid"},      {48, "proc_name"},
                 {49, "proc_name"}};
    for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
        CHECK(cases[i].cut < n);
        CHECK_ERR(fb_wire_get_hello(raw, cases[i].cut, &out, err, sizeof err),
                  FIBER_EPROTO);
        check_field_error(err, cases[i].field);
    }
    CHECK_OK(fb_wire_get_hello(raw, n, &out, err, sizeof err));
}

TEST(welcome_truncated_at_every_length)
{
    uint8_t raw[4] = {1, 2, 3, 4};
    for (size_t cut = 0; cut < sizeof raw; cut++) {
        struct fb_msg_welcome out = {99};
        char err[ERRLEN] = "";
        CHECK_ERR(fb_wire_get_welcome(raw, cut, &out, err, sizeof err),
                  FIBER_EPROTO);
        check_field_error(err, "heartbeat_ms");
        CHECK_EQ(out.heartbeat_ms, 99);
    }
    struct fb_msg_welcome out;
    CHECK_OK(fb_wire_get_welcome(raw, 4, &out, NULL, 0));
    CHECK_EQ(out.heartbeat_ms, 0x04030201);
    CHECK_ERR(fb_wire_get_welcome(NULL, 0, &out, NULL, 0), FIBER_EPROTO);
}

/* RUN's argument is the rest of the payload, so a cut inside it is simply a
 * shorter argument; every cut before it must be refused. */
TEST(run_truncated_at_every_length)
{
    static const uint8_t raw[] = {5, 's', 'q', 'u', 'a', 'r', 'x', 'y'};
    for (size_t cut = 0; cut < sizeof raw; cut++) {
        struct fb_msg_run out = {.task_len = 99};
        char err[ERRLEN] = "";
        int rc = fb_wire_get_run(raw, cut, &out, err, sizeof err);
        if (cut < 6) {
            CHECK_ERR(rc, FIBER_EPROTO);
            check_field_error(err, "task");
            CHECK_EQ(out.task_len, 99);
        } else {
            CHECK_OK(rc);
            CHECK_EQ(out.task_len, 5);
            CHECK_EQ(out.arg_len, cut - 6);
        }
    }
}

/* Text is the whole payload, so any prefix of valid text is valid text. */
TEST(text_any_prefix_is_valid)
{
    static const char raw[] = "why it failed";
    for (size_t cut = 0; cut < sizeof raw - 1; cut++) {
        struct fb_msg_text out;
        CHECK_OK(fb_wire_get_text((const uint8_t *)raw, cut, &out, NULL, 0));
        CHECK_EQ(out.len, cut);
    }
}

TEST(hello_trailing_bytes)
{
    uint8_t raw[160];
    size_t n = raw_hello(raw, "abc", 3, "w", 1);
    struct fb_msg_hello out;
    for (size_t extra = 1; extra <= 5; extra++) {
        char err[ERRLEN] = "";
        raw[n + extra - 1] = 0;
        CHECK_ERR(fb_wire_get_hello(raw, n + extra, &out, err, sizeof err),
                  FIBER_EPROTO);
        check_field_error(err, "trailing");
    }
}

TEST(welcome_trailing_bytes)
{
    uint8_t raw[8] = {0};
    struct fb_msg_welcome out;
    for (size_t len = 5; len <= sizeof raw; len++) {
        char err[ERRLEN] = "";
        CHECK_ERR(fb_wire_get_welcome(raw, len, &out, err, sizeof err),
                  FIBER_EPROTO);
        check_field_error(err, "trailing");
    }
}

TEST(empty_payload_only)
{
    char err[ERRLEN] = "";
    CHECK_OK(fb_wire_get_empty(0, err, sizeof err));
    CHECK_ERR(fb_wire_get_empty(1, err, sizeof err), FIBER_EPROTO);
    check_field_error(err, "payload");
    uint8_t one = 0;
    struct fb_wire_hdr h = {.type = FB_MSG_PONG, .len = 1};
    CHECK_ERR(fb_wire_check_payload(&h, &one, NULL, 0), FIBER_EPROTO);
    h.type = FB_MSG_PING;
    CHECK_ERR(fb_wire_check_payload(&h, &one, NULL, 0), FIBER_EPROTO);
}

/* ---- field rules -------------------------------------------------------- */

static void hello_refused(const char *build_id, size_t n, const char *name,
                          size_t m, const char *field, const char *detail)
{
    uint8_t raw[512];
    size_t len = raw_hello(raw, build_id, n, name, m);
    struct fb_msg_hello out = {.pid = 5};
    char err[ERRLEN] = "";
    CHECK_ERR(fb_wire_get_hello(raw, len, &out, err, sizeof err), FIBER_EPROTO);
    check_field_error(err, field);
    CHECK_CONTAINS(err, detail);
    CHECK_EQ(out.pid, 5);
}

TEST(hello_build_id_bad_chars)
{
    hello_refused("abcG", 4, "w", 1, "build_id", "0x47");
    hello_refused("ABCD", 4, "w", 1, "build_id", "0x41"); /* lower case only */
    hello_refused("ab d", 4, "w", 1, "build_id", "0x20");
    hello_refused("ab\0d", 4, "w", 1, "build_id", "0x00");
    hello_refused("ab\xff", 3, "w", 1, "build_id", "0xff");
    hello_refused("ab-d", 4, "w", 1, "build_id", "offset 2");
}

TEST(hello_build_id_length)
{
    char id[256];
    memset(id, 'a', sizeof id);
    hello_refused(id, 0, "w", 1, "build_id", "empty");
    hello_refused(id, FB_WIRE_BUILD_ID_MAX + 1, "w", 1, "build_id", "65");
    hello_refused(id, 255, "w", 1, "build_id", "255");
}

TEST(hello_name_bad_chars)
{
    hello_refused("ab", 2, "a b", 3, "proc_name", "0x20");
    hello_refused("ab", 2, "a/b", 3, "proc_name", "0x2f");
    hello_refused("ab", 2, "a:b", 3, "proc_name", "0x3a");
    hello_refused("ab", 2, "a\0b", 3, "proc_name", "0x00");
    hello_refused("ab", 2, "\x80", 1, "proc_name", "0x80");
}

TEST(hello_name_length)
{
    char name[256];
    memset(name, 'n', sizeof name);
    hello_refused("ab", 2, name, 0, "proc_name", "empty");
    hello_refused("ab", 2, name, FB_WIRE_NAME_MAX + 1, "proc_name", "64");
    hello_refused("ab", 2, name, 255, "proc_name", "255");
}

static void run_refused(const char *task, size_t n, const char *detail)
{
    uint8_t raw[300];
    raw[0] = (uint8_t)n;
    memcpy(raw + 1, task, n);
    struct fb_msg_run out = {.task_len = 3};
    char err[ERRLEN] = "";
    CHECK_ERR(fb_wire_get_run(raw, 1 + n, &out, err, sizeof err), FIBER_EPROTO);
    check_field_error(err, "task");
    CHECK_CONTAINS(err, detail);
    CHECK_EQ(out.task_len, 3);
}

TEST(run_task_rules)
{
    char long_task[256];
    memset(long_task, 't', sizeof long_task);
    run_refused("a.b", 3, "0x2e"); /* names allow '.', tasks do not */
    run_refused("a-b", 3, "0x2d");
    run_refused("a b", 3, "0x20");
    run_refused("a\0b", 3, "0x00");
    run_refused("", 0, "empty");
    run_refused(long_task, FB_WIRE_NAME_MAX + 1, "64");
    run_refused(long_task, 255, "255");
    uint8_t ok[1 + FB_WIRE_NAME_MAX];
    ok[0] = FB_WIRE_NAME_MAX;
    memcpy(ok + 1, long_task, FB_WIRE_NAME_MAX);
    struct fb_msg_run out;
    CHECK_OK(fb_wire_get_run(ok, sizeof ok, &out, NULL, 0));
    CHECK_EQ(out.arg_len, 0);
    /* A payload over the hard limit is refused before any byte is read. */
    char err[ERRLEN] = "";
    CHECK_ERR(fb_wire_get_run(ok, (size_t)FB_WIRE_PAYLOAD_HARD_MAX + 1, &out,
                              err, sizeof err),
              FIBER_EPROTO);
    check_field_error(err, "payload");
}

TEST(text_rules)
{
    char err[ERRLEN] = "";
    struct fb_msg_text out = {NULL, 55};
    CHECK_ERR(fb_wire_get_text((const uint8_t *)"ab\0cd", 5, &out, err,
                               sizeof err),
              FIBER_EPROTO);
    check_field_error(err, "text");
    CHECK_CONTAINS(err, "0x00");
    CHECK_CONTAINS(err, "offset 2");
    CHECK_EQ(out.len, 55);
    uint8_t big[FB_WIRE_TEXT_MAX + 1];
    memset(big, 'x', sizeof big);
    CHECK_ERR(fb_wire_get_text(big, sizeof big, &out, err, sizeof err),
              FIBER_EPROTO);
    check_field_error(err, "text");
    CHECK_CONTAINS(err, "1024");
    CHECK_OK(fb_wire_get_text(big, FB_WIRE_TEXT_MAX, &out, NULL, 0));
    CHECK_OK(fb_wire_get_text(NULL, 0, &out, NULL, 0));
    CHECK_EQ(out.len, 0);
    struct fb_wire_hdr h = {.type = FB_MSG_EXIT, .len = 3};
    CHECK_ERR(fb_wire_check_payload(&h, (const uint8_t *)"a\0b", NULL, 0),
              FIBER_EPROTO);
}

TEST(check_payload_unknown_type)
{
    static const unsigned bad[] = {0, 20, 200};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        char err[ERRLEN] = "";
        struct fb_wire_hdr h = {.type = (uint8_t)bad[i], .len = 0};
        CHECK_ERR(fb_wire_check_payload(&h, NULL, err, sizeof err),
                  FIBER_EPROTO);
        check_field_error(err, "type");
    }
}

/* ---- encoders refuse what decoders would refuse ------------------------- */

/* Runs an encoder call on a buffer that already holds bytes and checks it
 * failed with FIBER_EINVAL, left the buffer as it was, and named field. */
#define CHECK_REFUSED(b, call, field)                                          \
    do {                                                                       \
        CHECK_ERR(call, FIBER_EINVAL);                                         \
        CHECK_EQ((b).len, 3);                                                  \
        CHECK(memcmp((b).data, "old", 3) == 0);                                \
        CHECK_CONTAINS(fiber_last_error(), field);                             \
    } while (0)

TEST(put_hello_refuses)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_buf_append(&b, "old", 3));
    struct fb_msg_hello m = sample_hello();
    m.build_id = "abcG";
    m.build_id_len = 4;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "build_id");
    m.build_id_len = 0;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "build_id");
    m.build_id = NULL;
    m.build_id_len = 3;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "build_id");
    char long_id[FB_WIRE_BUILD_ID_MAX + 1];
    memset(long_id, 'a', sizeof long_id);
    m.build_id = long_id;
    m.build_id_len = sizeof long_id;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "build_id");
    m = sample_hello();
    m.name = "a b";
    m.name_len = 3;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "proc_name");
    m.name_len = 0;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "proc_name");
    char long_name[FB_WIRE_NAME_MAX + 1];
    memset(long_name, 'n', sizeof long_name);
    m.name = long_name;
    m.name_len = sizeof long_name;
    CHECK_REFUSED(b, fb_wire_put_hello(&b, &m), "proc_name");
    CHECK_REFUSED(b, fb_wire_put_hello(&b, NULL), "HELLO");
    fiber_buf_free(&b);
}

TEST(put_run_refuses)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_buf_append(&b, "old", 3));
    char long_task[FB_WIRE_NAME_MAX + 1];
    memset(long_task, 't', sizeof long_task);
    struct fb_msg_run m = {"a.b", 3, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "task");
    m = (struct fb_msg_run){"", 0, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "task");
    m = (struct fb_msg_run){NULL, 2, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "task");
    m = (struct fb_msg_run){long_task, sizeof long_task, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "task");
    m = (struct fb_msg_run){"sq", 2, NULL, 5};
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "arg");
    /* Refused on its length alone: the bytes are never read. */
    m = (struct fb_msg_run){"sq", 2, "x", FB_WIRE_PAYLOAD_HARD_MAX - 2};
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "arg");
    m.arg_len = UINT32_MAX;
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, &m), "arg");
    CHECK_REFUSED(b, fb_wire_put_run(&b, 1, NULL), "RUN");
    fiber_buf_free(&b);
}

TEST(put_text_refuses)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_buf_append(&b, "old", 3));
    char big[FB_WIRE_TEXT_MAX + 1];
    memset(big, 'x', sizeof big);
    CHECK_REFUSED(b, fb_wire_put_reject(&b, "a\0b", 3), "text");
    CHECK_REFUSED(b, fb_wire_put_reject(&b, big, sizeof big), "text");
    CHECK_REFUSED(b, fb_wire_put_reject(&b, NULL, 1), "text");
    CHECK_REFUSED(b, fb_wire_put_exit(&b, 1, "a\0b", 3), "text");
    CHECK_REFUSED(b, fb_wire_put_exit(&b, 1, big, sizeof big), "text");
    CHECK_REFUSED(b, fb_wire_put_exit(&b, 1, NULL, 2), "text");
    CHECK_REFUSED(b, fb_wire_put_exit(&b, 1, big, SIZE_MAX), "text");
    CHECK_REFUSED(b, fb_wire_put_welcome(&b, NULL), "WELCOME");
    fiber_buf_free(&b);
}

TEST(put_null_buffer)
{
    struct fb_msg_hello hello = sample_hello();
    struct fb_msg_welcome welcome = {1};
    struct fb_msg_run run = {"sq", 2, NULL, 0};
    CHECK_ERR(fb_wire_put_hello(NULL, &hello), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_welcome(NULL, &welcome), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_run(NULL, 1, &run), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_reject(NULL, "x", 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_exit(NULL, 0, "x", 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_ping(NULL, 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_pong(NULL, 1), FIBER_EINVAL);
}

/* ---- pool messages -------------------------------------------------------- */

/* A payload built byte by byte by a second, independent implementation of
 * the layout, remembering which field each byte belongs to so that a
 * truncation test knows the field a cut must name. */
struct raw {
    uint8_t b[1024];
    size_t len;
    struct {
        size_t start, end;
        const char *field;
    } seg[64];
    size_t nseg;
};

static void raw_put(struct raw *r, const char *field, const void *p, size_t n)
{
    CHECK(r->len + n <= sizeof r->b);
    CHECK(r->nseg < FB_ARRAY_LEN(r->seg));
    if (n)
        memcpy(r->b + r->len, p, n);
    r->seg[r->nseg].start = r->len;
    r->len += n;
    r->seg[r->nseg].end = r->len;
    r->seg[r->nseg].field = field;
    r->nseg++;
}

static void raw_u8(struct raw *r, const char *field, unsigned v)
{
    uint8_t b = (uint8_t)v;
    raw_put(r, field, &b, 1);
}

static void raw_u32(struct raw *r, const char *field, uint32_t v)
{
    uint8_t b[4];
    le32(b, v);
    raw_put(r, field, b, 4);
}

static void raw_u64(struct raw *r, const char *field, uint64_t v)
{
    uint8_t b[8];
    le64(b, v);
    raw_put(r, field, b, 8);
}

/* The field a decoder must name when only the first `cut` bytes are there:
 * the first one that is not complete (empty fields never are). */
static const char *raw_field_at(const struct raw *r, size_t cut)
{
    for (size_t i = 0; i < r->nseg; i++)
        if (r->seg[i].end > cut)
            return r->seg[i].field;
    return NULL;
}

/* Where the nth segment named field starts (n from 0). */
static size_t raw_where(const struct raw *r, const char *field, unsigned n)
{
    for (size_t i = 0; i < r->nseg; i++)
        if (strcmp(r->seg[i].field, field) == 0 && n-- == 0)
            return r->seg[i].start;
    TH_FAIL("no segment %s", field);
}

/* A task name: u8 length and bytes, both belonging to field. */
static void raw_name(struct raw *r, const char *field, const char *task,
                     size_t n)
{
    raw_u8(r, field, (unsigned)n);
    raw_put(r, field, task, n);
}

/* TASK "sq" with items "abc", "" and "\0\xff": the small frame that the
 * truncation tests cut everywhere. */
static void raw_task3(struct raw *r)
{
    *r = (struct raw){.len = 0};
    raw_name(r, "task", "sq", 2);
    raw_u32(r, "item len", 3);
    raw_put(r, "item arg", "abc", 3);
    raw_u32(r, "item len", 0);
    raw_put(r, "item arg", NULL, 0);
    raw_u32(r, "item len", 2);
    raw_put(r, "item arg", "\0\xff", 2);
}

/* RESULT of 3 items at offset 7: a success with bytes, a failure with
 * text, a failure without. */
static void raw_result3(struct raw *r)
{
    *r = (struct raw){.len = 0};
    raw_u32(r, "offset", 7);
    raw_u64(r, "elapsed_ns", 123456789);
    raw_u32(r, "item rc", 0);
    raw_u32(r, "item len", 2);
    raw_put(r, "item bytes", "\0\1", 2);
    raw_u32(r, "item rc", (uint32_t)-3);
    raw_u32(r, "item len", 4);
    raw_put(r, "item bytes", "oops", 4);
    raw_u32(r, "item rc", 1);
    raw_u32(r, "item len", 0);
    raw_put(r, "item bytes", NULL, 0);
}

/* Decodes a payload expected to be malformed, checks that the error names
 * "MSG field" and that *m was left alone, and returns the message. */
static const char *task_error(const uint8_t *p, size_t len, int32_t count,
                              const char *field)
{
    static char err[ERRLEN];
    char want[64];
    struct fb_msg_task m = {.count = 4242};
    err[0] = '\0';
    CHECK_ERR(fb_wire_get_task(p, len, count, &m, err, sizeof err),
              FIBER_EPROTO);
    snprintf(want, sizeof want, "TASK %s:", field);
    check_field_error(err, want);
    CHECK_EQ(m.count, 4242);
    struct fb_wire_hdr h = {.type = FB_MSG_TASK, .code = count,
                            .len = (uint32_t)len};
    CHECK_ERR(fb_wire_check_payload(&h, p, NULL, 0), FIBER_EPROTO);
    return err;
}

static const char *result_error(const uint8_t *p, size_t len, int32_t count,
                                const char *field)
{
    static char err[ERRLEN];
    char want[64];
    struct fb_msg_result m = {.count = 4242};
    err[0] = '\0';
    CHECK_ERR(fb_wire_get_result(p, len, count, &m, err, sizeof err),
              FIBER_EPROTO);
    snprintf(want, sizeof want, "RESULT %s:", field);
    check_field_error(err, want);
    CHECK_EQ(m.count, 4242);
    struct fb_wire_hdr h = {.type = FB_MSG_RESULT, .code = count,
                            .len = (uint32_t)len};
    CHECK_ERR(fb_wire_check_payload(&h, p, NULL, 0), FIBER_EPROTO);
    return err;
}

static const char *pool_error(const uint8_t *p, size_t len, const char *field)
{
    static char err[ERRLEN];
    char want[64];
    struct fb_msg_pool m = {.spin_us = 4242};
    err[0] = '\0';
    CHECK_ERR(fb_wire_get_pool(p, len, &m, err, sizeof err), FIBER_EPROTO);
    snprintf(want, sizeof want, "POOL %s:", field);
    check_field_error(err, want);
    CHECK_EQ(m.spin_us, 4242);
    return err;
}

/* -- round trips -- */

TEST(pool_golden_bytes)
{
    static const uint8_t want[] = {
        0xbe, 0xf1, 0x01, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, /* magic..code */
        0, 0, 0, 0, 0, 0, 0, 0,                           /* id */
        0x0b, 0, 0, 0,                                    /* len 11 */
        0x64, 0, 0, 0,                                    /* spin_us 100 */
        0x04, 'i', 'n', 'i', 't', 'x', 0x00};             /* task, arg */
    struct fb_msg_pool m = {100, "init", 4, "x", 2};
    fiber_buf b = {0};
    CHECK_OK(fb_wire_put_pool(&b, &m));
    CHECK_EQ(b.len, sizeof want);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    fiber_buf_free(&b);
}

TEST(task_golden_bytes)
{
    static const uint8_t want[] = {
        0xbe, 0xf1, 0x01, 0x0a, 0, 0, 0, 0, /* magic, version, type, 0s */
        0x02, 0, 0, 0,                      /* code = count 2 */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* id */
        0x0c, 0, 0, 0,                                  /* len 12 */
        0x02, 's', 'q',                                 /* task */
        0x01, 0, 0, 0, 0x2a,                            /* item "\x2a" */
        0x00, 0, 0, 0};                                 /* item "" */
    fiber_buf b = {0};
    size_t mark = 99;
    CHECK_OK(fb_wire_task_begin(&b, 0x0102030405060708u, "sq", 2, &mark));
    CHECK_EQ(mark, 0);
    CHECK_OK(fb_wire_task_add(&b, "\x2a", 1));
    CHECK_OK(fb_wire_task_add(&b, NULL, 0));
    fb_wire_task_end(&b, mark, 2);
    CHECK_EQ(b.len, sizeof want);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    fiber_buf_free(&b);
}

TEST(result_golden_bytes)
{
    static const uint8_t want[] = {
        0xbe, 0xf1, 0x01, 0x0b, 0, 0, 0, 0, /* magic, version, type, 0s */
        0x02, 0, 0, 0,                      /* code = count 2 */
        0x05, 0, 0, 0, 0, 0, 0, 0,          /* id 5 */
        0x20, 0, 0, 0,                      /* len 32 */
        0x03, 0, 0, 0,                      /* offset 3 */
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* elapsed_ns */
        0, 0, 0, 0, 0x02, 0, 0, 0, 'o', 'k',            /* rc 0, "ok" */
        0xfe, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 'n', 'o'}; /* rc -2, "no" */
    fiber_buf b = {0};
    size_t mark = 99;
    CHECK_OK(fb_wire_result_begin(&b, 5, 3, &mark));
    CHECK_EQ(mark, 0);
    CHECK_OK(fb_wire_result_add(&b, 0, "ok", 2));
    CHECK_OK(fb_wire_result_add(&b, -2, "no", 2));
    fb_wire_result_end(&b, mark, 2, 0x1122334455667788u);
    CHECK_EQ(b.len, sizeof want);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    fiber_buf_free(&b);
}

TEST(empty_golden_bytes)
{
    static const uint8_t want[] = {0xbe, 0xf1, 0x01, 0x0d, 0, 0, 0, 0,
                                   0,    0,    0,    0,    9, 0, 0, 0,
                                   0,    0,    0,    0,    0, 0, 0, 0};
    fiber_buf b = {0};
    CHECK_OK(fb_wire_put_empty(&b, FB_MSG_HEARTBEAT, 9));
    CHECK_EQ(b.len, sizeof want);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    fiber_buf_free(&b);
}

TEST(round_trip_pool)
{
    static const uint8_t arg[] = {'c', 'f', 'g', 0, 0xff};
    char longest[FB_WIRE_NAME_MAX];
    memset(longest, 'I', sizeof longest);
    struct fb_msg_pool cases[] = {
        {0, NULL, 0, NULL, 0},              /* no initializer, no arg */
        {0, "", 0, arg, 0},                 /* empty but not NULL */
        {250, "setup", 5, arg, sizeof arg}, /* initializer with an arg */
        {1, "setup", 5, NULL, 0},           /* initializer, empty arg */
        {UINT32_MAX, longest, sizeof longest, arg, 1},
        {7, NULL, 0, arg, sizeof arg}, /* an arg with no initializer */
    };
    for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
        const struct fb_msg_pool *in = &cases[i];
        fiber_buf b = {0};
        CHECK_OK(fb_wire_put_pool(&b, in));
        size_t off = 0;
        struct fb_wire_hdr h;
        const uint8_t *p = next_frame(&b, &off, &h);
        CHECK_EQ(off, b.len);
        CHECK_EQ(h.type, FB_MSG_POOL);
        CHECK_EQ(h.code, 0);
        CHECK(h.id == 0);
        CHECK_EQ(h.len, 4 + 1 + in->init_task_len + in->init_arg_len);
        struct fb_msg_pool out;
        CHECK_OK(fb_wire_get_pool(p, h.len, &out, NULL, 0));
        CHECK(out.spin_us == in->spin_us);
        CHECK_EQ(out.init_task_len, in->init_task_len);
        CHECK(in->init_task_len == 0 ||
              memcmp(out.init_task, in->init_task, in->init_task_len) == 0);
        CHECK_EQ(out.init_arg_len, in->init_arg_len);
        CHECK(in->init_arg_len == 0 ||
              memcmp(out.init_arg, in->init_arg, in->init_arg_len) == 0);
        /* Views into the buffer, ending where the payload does. */
        CHECK((const uint8_t *)out.init_arg + out.init_arg_len == p + h.len);
        /* The layout matches the independent builder. */
        struct raw r = {.len = 0};
        raw_u32(&r, "spin_us", in->spin_us);
        raw_name(&r, "init_task", in->init_task, in->init_task_len);
        raw_put(&r, "init_arg", in->init_arg, in->init_arg_len);
        CHECK_EQ(r.len, h.len);
        CHECK(memcmp(r.b, p, r.len) == 0);
        fiber_buf_free(&b);
    }
}

TEST(round_trip_ready_stop_heartbeat)
{
    static const unsigned types[] = {FB_MSG_READY, FB_MSG_STOP,
                                     FB_MSG_HEARTBEAT, FB_MSG_PING,
                                     FB_MSG_PONG};
    static const uint64_t ids[] = {0, 42, UINT64_MAX};
    for (size_t t = 0; t < FB_ARRAY_LEN(types); t++) {
        fiber_buf b = {0};
        for (size_t i = 0; i < FB_ARRAY_LEN(ids); i++)
            CHECK_OK(fb_wire_put_empty(&b, types[t], ids[i]));
        CHECK_EQ(b.len, FB_ARRAY_LEN(ids) * FB_WIRE_HDR_LEN);
        size_t off = 0;
        for (size_t i = 0; i < FB_ARRAY_LEN(ids); i++) {
            struct fb_wire_hdr h;
            next_frame(&b, &off, &h);
            CHECK_EQ(h.type, types[t]);
            CHECK(h.id == ids[i]);
            CHECK_EQ(h.code, 0);
            CHECK_EQ(h.len, 0);
            CHECK_OK(fb_wire_get_empty(h.len, NULL, 0));
        }
        fiber_buf_free(&b);
    }
}

/* Item i of a test chunk: its length (0 for every tenth item, or for the
 * first when shift is 1) and its bytes, NULs included. */
static uint32_t item_len(size_t i, unsigned shift)
{
    return (uint32_t)(((i + shift) * 7 + 3) % 10);
}

static uint8_t item_byte(size_t i, size_t j)
{
    return (uint8_t)(i * 31 + j);
}

/* Encodes a TASK of count items behind a PING (so that the mark is not 0),
 * decodes it, and walks the items. */
static void task_round_trip(size_t count, unsigned shift, uint64_t id,
                            const char *task)
{
    fiber_buf b = {0};
    uint8_t arg[16];
    size_t mark = 0, want_len = 1 + strlen(task);
    CHECK_OK(fb_wire_put_ping(&b, 1));
    CHECK_OK(fb_wire_task_begin(&b, id, task, strlen(task), &mark));
    CHECK_EQ(mark, FB_WIRE_HDR_LEN);
    for (size_t i = 0; i < count; i++) {
        uint32_t n = item_len(i, shift);
        for (uint32_t j = 0; j < n; j++)
            arg[j] = item_byte(i, j);
        CHECK_OK(fb_wire_task_add(&b, n ? arg : NULL, n));
        want_len += 4 + n;
    }
    fb_wire_task_end(&b, mark, (uint32_t)count);
    size_t off = 0;
    struct fb_wire_hdr h;
    next_frame(&b, &off, &h);
    CHECK_EQ(h.type, FB_MSG_PING);
    const uint8_t *p = next_frame(&b, &off, &h);
    CHECK_EQ(off, b.len);
    CHECK_EQ(h.type, FB_MSG_TASK);
    CHECK(h.id == id);
    CHECK_EQ(h.code, count);
    CHECK_EQ(h.len, want_len);
    struct fb_msg_task m;
    CHECK_OK(fb_wire_get_task(p, h.len, h.code, &m, NULL, 0));
    CHECK_EQ(m.count, count);
    CHECK_EQ(m.task_len, strlen(task));
    CHECK(memcmp(m.task, task, m.task_len) == 0);
    const uint8_t *cur = m.items;
    for (size_t i = 0; i < count; i++) {
        const void *a;
        uint32_t n;
        fb_wire_task_next(&cur, &a, &n);
        CHECK_EQ(n, item_len(i, shift));
        for (uint32_t j = 0; j < n; j++)
            CHECK_EQ(((const uint8_t *)a)[j], item_byte(i, j));
        CHECK((const uint8_t *)a >= p && (const uint8_t *)a + n <= p + h.len);
    }
    CHECK(cur == p + h.len);
    fiber_buf_free(&b);
}

TEST(round_trip_task)
{
    task_round_trip(1, 0, 0, "square");
    task_round_trip(1, 1, 1, "square"); /* one empty item */
    task_round_trip(3, 0, 77, "a");
    task_round_trip(3, 1, UINT64_MAX, "Task_2");
    task_round_trip(1000, 0, 0x8000000000000000u, "cube");
    task_round_trip(1000, 1, 5, "cube");
}

TEST(round_trip_task_limits)
{
    /* The largest chunk, every item empty, and a 63-byte task name. */
    char name[FB_WIRE_NAME_MAX + 1];
    memset(name, 'T', FB_WIRE_NAME_MAX);
    name[FB_WIRE_NAME_MAX] = '\0';
    fiber_buf b = {0};
    size_t mark;
    CHECK_OK(fb_wire_task_begin(&b, 3, name, FB_WIRE_NAME_MAX, &mark));
    for (uint32_t i = 0; i < FB_WIRE_CHUNK_MAX; i++)
        CHECK_OK(fb_wire_task_add(&b, NULL, 0));
    fb_wire_task_end(&b, mark, FB_WIRE_CHUNK_MAX);
    size_t off = 0;
    struct fb_wire_hdr h;
    const uint8_t *p = next_frame(&b, &off, &h);
    CHECK_EQ(h.code, FB_WIRE_CHUNK_MAX);
    struct fb_msg_task m;
    CHECK_OK(fb_wire_get_task(p, h.len, h.code, &m, NULL, 0));
    CHECK_EQ(m.count, FB_WIRE_CHUNK_MAX);
    CHECK_EQ(m.task_len, FB_WIRE_NAME_MAX);
    fiber_buf_free(&b);

    /* A large item (beyond 16 bits of length) holding every byte value. */
    size_t big = 100000;
    uint8_t *arg = malloc(big);
    CHECK(arg);
    for (size_t i = 0; i < big; i++)
        arg[i] = (uint8_t)(i * 7);
    b = (fiber_buf){0};
    CHECK_OK(fb_wire_task_begin(&b, 4, "t", 1, &mark));
    CHECK_OK(fb_wire_task_add(&b, "x", 1));
    CHECK_OK(fb_wire_task_add(&b, arg, (uint32_t)big));
    fb_wire_task_end(&b, mark, 2);
    off = 0;
    p = next_frame(&b, &off, &h);
    CHECK_OK(fb_wire_get_task(p, h.len, h.code, &m, NULL, 0));
    const uint8_t *cur = m.items;
    const void *a;
    uint32_t n;
    fb_wire_task_next(&cur, &a, &n);
    CHECK_EQ(n, 1);
    fb_wire_task_next(&cur, &a, &n);
    CHECK_EQ(n, big);
    CHECK(memcmp(a, arg, big) == 0);
    CHECK(cur == p + h.len);
    free(arg);
    fiber_buf_free(&b);
}

/* Item i of a test RESULT: successes carry binary bytes, failures text of
 * varying length (sometimes none) and rc of either sign. */
static int32_t result_rc(size_t i)
{
    static const int32_t rcs[] = {0, 1, 0, -1, INT32_MIN, 0, INT32_MAX, 42};
    return rcs[i % FB_ARRAY_LEN(rcs)];
}

static uint32_t result_item(size_t i, uint8_t *out)
{
    if (result_rc(i) == 0) {
        uint32_t n = (uint32_t)(i % 13);
        for (uint32_t j = 0; j < n; j++)
            out[j] = item_byte(i, j); /* NULs included */
        return n;
    }
    if (i % 5 == 0)
        return 0; /* a failure with no message */
    return (uint32_t)snprintf((char *)out, 64, "item %zu failed: %s", i,
                              i % 2 ? "bad arg" : "ValueError\n");
}

static void result_round_trip(size_t count, uint64_t id, uint32_t offset,
                              uint64_t elapsed_ns)
{
    fiber_buf b = {0};
    uint8_t item[64];
    size_t mark = 0, want_len = 12;
    CHECK_OK(fb_wire_put_empty(&b, FB_MSG_HEARTBEAT, 1));
    CHECK_OK(fb_wire_result_begin(&b, id, offset, &mark));
    CHECK_EQ(mark, FB_WIRE_HDR_LEN);
    for (size_t i = 0; i < count; i++) {
        uint32_t n = result_item(i, item);
        CHECK_OK(fb_wire_result_add(&b, result_rc(i), n ? item : NULL, n));
        want_len += 8 + n;
    }
    fb_wire_result_end(&b, mark, (uint32_t)count, elapsed_ns);
    size_t off = 0;
    struct fb_wire_hdr h;
    next_frame(&b, &off, &h);
    CHECK_EQ(h.type, FB_MSG_HEARTBEAT);
    const uint8_t *p = next_frame(&b, &off, &h);
    CHECK_EQ(off, b.len);
    CHECK_EQ(h.type, FB_MSG_RESULT);
    CHECK(h.id == id);
    CHECK_EQ(h.code, count);
    CHECK_EQ(h.len, want_len);
    struct fb_msg_result m;
    CHECK_OK(fb_wire_get_result(p, h.len, h.code, &m, NULL, 0));
    CHECK_EQ(m.count, count);
    CHECK(m.offset == offset);
    CHECK(m.elapsed_ns == elapsed_ns);
    const uint8_t *cur = m.items;
    for (size_t i = 0; i < count; i++) {
        int32_t rc;
        const void *data;
        uint32_t n;
        fb_wire_result_next(&cur, &rc, &data, &n);
        CHECK_EQ(rc, result_rc(i));
        CHECK_EQ(n, result_item(i, item));
        CHECK(n == 0 || memcmp(data, item, n) == 0);
    }
    CHECK(cur == p + h.len);
    fiber_buf_free(&b);
}

TEST(round_trip_result)
{
    result_round_trip(1, 0, 0, 0);
    result_round_trip(3, 9, 1000, 1);
    result_round_trip(8, 10, 7, 123456789);
    result_round_trip(1000, UINT64_MAX, UINT32_MAX, UINT64_MAX);
    result_round_trip(1000, 11, 65535, 0x8000000000000000u);
}

TEST(round_trip_result_limits)
{
    /* The longest failure text, and a success far longer than any text
     * may be, NULs included. */
    char text[FB_WIRE_TEXT_MAX];
    memset(text, '\xfe', sizeof text);
    size_t big = 5000;
    uint8_t *data = calloc(1, big);
    CHECK(data);
    data[big - 1] = 1;
    fiber_buf b = {0};
    size_t mark;
    CHECK_OK(fb_wire_result_begin(&b, 1, 2, &mark));
    CHECK_OK(fb_wire_result_add(&b, -7, text, sizeof text));
    CHECK_OK(fb_wire_result_add(&b, 0, data, (uint32_t)big));
    fb_wire_result_end(&b, mark, 2, 3);
    size_t off = 0;
    struct fb_wire_hdr h;
    const uint8_t *p = next_frame(&b, &off, &h);
    struct fb_msg_result m;
    CHECK_OK(fb_wire_get_result(p, h.len, h.code, &m, NULL, 0));
    const uint8_t *cur = m.items;
    int32_t rc;
    const void *d;
    uint32_t n;
    fb_wire_result_next(&cur, &rc, &d, &n);
    CHECK_EQ(rc, -7);
    CHECK_EQ(n, sizeof text);
    CHECK(memcmp(d, text, n) == 0);
    fb_wire_result_next(&cur, &rc, &d, &n);
    CHECK_EQ(rc, 0);
    CHECK_EQ(n, big);
    CHECK(memcmp(d, data, n) == 0);
    CHECK(cur == p + h.len);
    free(data);
    fiber_buf_free(&b);

    /* The largest chunk of empty successes. */
    b = (fiber_buf){0};
    CHECK_OK(fb_wire_result_begin(&b, 1, 0, &mark));
    for (uint32_t i = 0; i < FB_WIRE_CHUNK_MAX; i++)
        CHECK_OK(fb_wire_result_add(&b, 0, NULL, 0));
    fb_wire_result_end(&b, mark, FB_WIRE_CHUNK_MAX, 1);
    off = 0;
    p = next_frame(&b, &off, &h);
    CHECK_OK(fb_wire_get_result(p, h.len, h.code, &m, NULL, 0));
    CHECK_EQ(m.count, FB_WIRE_CHUNK_MAX);
    fiber_buf_free(&b);
}

/* The result matches the independent builder byte for byte. */
TEST(result_layout_matches_builder)
{
    struct raw r;
    raw_result3(&r);
    fiber_buf b = {0};
    size_t mark;
    CHECK_OK(fb_wire_result_begin(&b, 1, 7, &mark));
    CHECK_OK(fb_wire_result_add(&b, 0, "\0\1", 2));
    CHECK_OK(fb_wire_result_add(&b, -3, "oops", 4));
    CHECK_OK(fb_wire_result_add(&b, 1, NULL, 0));
    fb_wire_result_end(&b, mark, 3, 123456789);
    CHECK_EQ(b.len - FB_WIRE_HDR_LEN, r.len);
    CHECK(memcmp(b.data + FB_WIRE_HDR_LEN, r.b, r.len) == 0);
    fiber_buf_free(&b);
    raw_task3(&r);
    b = (fiber_buf){0};
    CHECK_OK(fb_wire_task_begin(&b, 1, "sq", 2, &mark));
    CHECK_OK(fb_wire_task_add(&b, "abc", 3));
    CHECK_OK(fb_wire_task_add(&b, "", 0));
    CHECK_OK(fb_wire_task_add(&b, "\0\xff", 2));
    fb_wire_task_end(&b, mark, 3);
    CHECK_EQ(b.len - FB_WIRE_HDR_LEN, r.len);
    CHECK(memcmp(b.data + FB_WIRE_HDR_LEN, r.b, r.len) == 0);
    fiber_buf_free(&b);
}

/* A caller abandons a half-built frame by putting len back to the mark. */
TEST(task_abandoned_frame)
{
    fiber_buf b = {0};
    size_t mark;
    CHECK_OK(fb_wire_put_ping(&b, 1));
    CHECK_OK(fb_wire_task_begin(&b, 2, "sq", 2, &mark));
    CHECK_OK(fb_wire_task_add(&b, "abc", 3));
    b.len = mark;
    CHECK_OK(fb_wire_result_begin(&b, 3, 0, &mark));
    CHECK_OK(fb_wire_result_add(&b, 0, "x", 1));
    b.len = mark;
    CHECK_OK(fb_wire_put_pong(&b, 1));
    size_t off = 0;
    struct fb_wire_hdr h;
    next_frame(&b, &off, &h);
    CHECK_EQ(h.type, FB_MSG_PING);
    next_frame(&b, &off, &h);
    CHECK_EQ(h.type, FB_MSG_PONG);
    CHECK_EQ(off, b.len);
    fiber_buf_free(&b);
}

/* A worker session: frames of every pool type one after another. */
TEST(pool_frames_concatenate)
{
    fiber_buf b = {0};
    struct fb_msg_pool pool = {50, "init", 4, "cfg", 3};
    size_t mark;
    CHECK_OK(fb_wire_put_pool(&b, &pool));
    CHECK_OK(fb_wire_put_empty(&b, FB_MSG_READY, 0));
    CHECK_OK(fb_wire_task_begin(&b, 1, "sq", 2, &mark));
    CHECK_OK(fb_wire_task_add(&b, "2", 1));
    CHECK_OK(fb_wire_task_add(&b, "3", 1));
    fb_wire_task_end(&b, mark, 2);
    CHECK_OK(fb_wire_put_empty(&b, FB_MSG_HEARTBEAT, 0));
    CHECK_OK(fb_wire_result_begin(&b, 1, 0, &mark));
    CHECK_OK(fb_wire_result_add(&b, 0, "4", 1));
    fb_wire_result_end(&b, mark, 1, 10);
    CHECK_OK(fb_wire_result_begin(&b, 1, 1, &mark));
    CHECK_OK(fb_wire_result_add(&b, 1, "bad", 3));
    fb_wire_result_end(&b, mark, 1, 20);
    CHECK_OK(fb_wire_put_empty(&b, FB_MSG_STOP, 0));
    static const unsigned want[] = {FB_MSG_POOL,   FB_MSG_READY,
                                    FB_MSG_TASK,   FB_MSG_HEARTBEAT,
                                    FB_MSG_RESULT, FB_MSG_RESULT,
                                    FB_MSG_STOP};
    size_t off = 0;
    for (size_t i = 0; i < FB_ARRAY_LEN(want); i++) {
        struct fb_wire_hdr h;
        const uint8_t *p = next_frame(&b, &off, &h);
        CHECK_EQ(h.type, want[i]);
        if (h.type == FB_MSG_RESULT) {
            struct fb_msg_result m;
            CHECK_OK(fb_wire_get_result(p, h.len, h.code, &m, NULL, 0));
            CHECK_EQ(m.offset, i == 4 ? 0 : 1);
            CHECK_EQ(m.elapsed_ns, i == 4 ? 10 : 20);
        }
    }
    CHECK_EQ(off, b.len);
    fiber_buf_free(&b);
}

/* -- rejections -- */

TEST(task_count_rules)
{
    struct raw r;
    raw_task3(&r);
    struct fb_msg_task m;
    CHECK_OK(fb_wire_get_task(r.b, r.len, 3, &m, NULL, 0));
    static const int32_t bad[] = {0, -1, -3, INT32_MIN,
                                  (int32_t)FB_WIRE_CHUNK_MAX + 1, INT32_MAX};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        char want[32];
        const char *err = task_error(r.b, r.len, bad[i], "count");
        snprintf(want, sizeof want, "%" PRId32, bad[i]);
        CHECK_CONTAINS(err, want);
        /* The count is judged first, whatever the payload. */
        task_error(NULL, 0, bad[i], "count");
        result_error(NULL, 0, bad[i], "count");
    }
    /* More items announced than present; fewer leaves trailing bytes. */
    CHECK_CONTAINS(task_error(r.b, r.len, 4, "item len"), "truncated");
    CHECK_CONTAINS(task_error(r.b, r.len, 2, "payload"), "trailing");
    CHECK_CONTAINS(task_error(r.b, r.len, 1, "payload"), "trailing");
}

TEST(result_count_rules)
{
    struct raw r;
    raw_result3(&r);
    struct fb_msg_result m;
    CHECK_OK(fb_wire_get_result(r.b, r.len, 3, &m, NULL, 0));
    CHECK_EQ(m.offset, 7);
    CHECK_EQ(m.elapsed_ns, 123456789);
    static const int32_t bad[] = {0, -1, INT32_MIN,
                                  (int32_t)FB_WIRE_CHUNK_MAX + 1, INT32_MAX};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
        char want[32];
        const char *err = result_error(r.b, r.len, bad[i], "count");
        snprintf(want, sizeof want, "%" PRId32, bad[i]);
        CHECK_CONTAINS(err, want);
    }
    CHECK_CONTAINS(result_error(r.b, r.len, 4, "item rc"), "truncated");
    CHECK_CONTAINS(result_error(r.b, r.len, 2, "payload"), "trailing");
}

/* A cut anywhere in a TASK is refused, naming the field it fell in. */
TEST(task_truncated_at_every_length)
{
    struct raw r;
    raw_task3(&r);
    for (size_t cut = 0; cut < r.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size, for ASan */
        CHECK(copy);
        memcpy(copy, r.b, cut);
        const char *err = task_error(copy, cut, 3, raw_field_at(&r, cut));
        CHECK_CONTAINS(err, "truncated");
        free(copy);
    }
}

TEST(result_truncated_at_every_length)
{
    struct raw r;
    raw_result3(&r);
    for (size_t cut = 0; cut < r.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        CHECK(copy);
        memcpy(copy, r.b, cut);
        const char *err = result_error(copy, cut, 3, raw_field_at(&r, cut));
        CHECK_CONTAINS(err, "truncated");
        free(copy);
    }
}

TEST(task_result_trailing_bytes)
{
    struct raw t, r;
    raw_task3(&t);
    raw_result3(&r);
    for (size_t extra = 1; extra <= 9; extra++) {
        char want[32];
        raw_task3(&t);
        raw_result3(&r);
        for (size_t i = 0; i < extra; i++) {
            raw_u8(&t, "junk", 0);
            raw_u8(&r, "junk", 0);
        }
        snprintf(want, sizeof want, "%zu trailing", extra);
        CHECK_CONTAINS(task_error(t.b, t.len, 3, "payload"), want);
        CHECK_CONTAINS(result_error(r.b, r.len, 3, "payload"), want);
    }
}

/* An item length pointing past the end of the payload, by one byte or by
 * four gigabytes, is a truncation and never a read past the buffer. */
TEST(item_len_past_end)
{
    static const uint32_t lens[] = {3, 4, 100, 0x7fffffff, UINT32_MAX};
    for (size_t i = 0; i < FB_ARRAY_LEN(lens); i++) {
        struct raw r;
        raw_task3(&r);
        /* The last item holds 2 bytes; claim more. */
        le32(r.b + raw_where(&r, "item len", 2), lens[i]);
        uint8_t *copy = malloc(r.len);
        CHECK(copy);
        memcpy(copy, r.b, r.len);
        CHECK_CONTAINS(task_error(copy, r.len, 3, "item arg"), "truncated");
        /* The first item claiming more than the 13 bytes after its len.
         * UINT32_MAX + 14 wraps to 13: that item then takes exactly the
         * rest, and it is the second item's len that is missing. */
        raw_task3(&r);
        uint32_t first = lens[i] + 14;
        le32(r.b + raw_where(&r, "item len", 0), first);
        memcpy(copy, r.b, r.len);
        task_error(copy, r.len, 3, first == 13 ? "item len" : "item arg");
        free(copy);

        /* The last result is empty; claim it is not. */
        raw_result3(&r);
        le32(r.b + raw_where(&r, "item len", 2), lens[i]);
        copy = malloc(r.len);
        CHECK(copy);
        memcpy(copy, r.b, r.len);
        CHECK_CONTAINS(result_error(copy, r.len, 3, "item bytes"),
                       "truncated");
        free(copy);
    }
}

TEST(result_failure_text_rules)
{
    struct raw r = {.len = 0};
    raw_u32(&r, "offset", 0);
    raw_u64(&r, "elapsed_ns", 0);
    raw_u32(&r, "item rc", 0);
    raw_u32(&r, "item len", 4);
    raw_put(&r, "item bytes", "ab\0c", 4); /* success: any bytes */
    raw_u32(&r, "item rc", 2);
    raw_u32(&r, "item len", 4);
    raw_put(&r, "item bytes", "ab\0c", 4); /* failure: text, so no NUL */
    struct fb_msg_result m;
    CHECK_OK(fb_wire_get_result(r.b, r.len - 12, 1, &m, NULL, 0));
    const char *err = result_error(r.b, r.len, 2, "item failure text");
    CHECK_CONTAINS(err, "0x00");
    CHECK_CONTAINS(err, "offset 2");
    /* A NUL as the last byte, as a C string's terminator would be. */
    le32(r.b + raw_where(&r, "item rc", 1), (uint32_t)INT32_MIN);
    memcpy(r.b + raw_where(&r, "item bytes", 1), "abc\0", 4);
    CHECK_CONTAINS(result_error(r.b, r.len, 2, "item failure text"),
                   "offset 3");

    /* Failure text is at most FB_WIRE_TEXT_MAX bytes; success data is
     * bounded only by the payload. */
    size_t n = 12 + 8 + FB_WIRE_TEXT_MAX + 1;
    uint8_t *big = malloc(n);
    CHECK(big);
    memset(big, 'x', n);
    le32(big, 0);
    le64(big + 4, 0);
    le32(big + 12, 0);
    le32(big + 16, FB_WIRE_TEXT_MAX + 1);
    CHECK_OK(fb_wire_get_result(big, n, 1, &m, NULL, 0));
    le32(big + 12, 1);
    CHECK_CONTAINS(result_error(big, n, 1, "item failure text"), "1024");
    le32(big + 16, FB_WIRE_TEXT_MAX);
    CHECK_OK(fb_wire_get_result(big, n - 1, 1, &m, NULL, 0));
    free(big);
}

static void task_name_refused(const char *task, size_t n, const char *detail)
{
    struct raw r = {.len = 0};
    raw_name(&r, "task", task, n);
    raw_u32(&r, "item len", 0);
    CHECK_CONTAINS(task_error(r.b, r.len, 1, "task"), detail);
}

TEST(task_name_rules)
{
    char long_task[256];
    memset(long_task, 't', sizeof long_task);
    task_name_refused("a.b", 3, "0x2e");
    task_name_refused("a-b", 3, "0x2d");
    task_name_refused("a b", 3, "0x20");
    task_name_refused("ab\0", 3, "0x00");
    task_name_refused("\xc3\xa9", 2, "0xc3");
    task_name_refused("", 0, "empty");
    task_name_refused(long_task, FB_WIRE_NAME_MAX + 1, "64");
    task_name_refused(long_task, 255, "255");
    struct raw r = {.len = 0};
    raw_name(&r, "task", long_task, FB_WIRE_NAME_MAX);
    raw_u32(&r, "item len", 0);
    struct fb_msg_task m;
    CHECK_OK(fb_wire_get_task(r.b, r.len, 1, &m, NULL, 0));
    CHECK_EQ(m.task_len, FB_WIRE_NAME_MAX);
}

static void pool_refused(const char *task, size_t n, const char *detail)
{
    struct raw r = {.len = 0};
    raw_u32(&r, "spin_us", 10);
    raw_name(&r, "init_task", task, n);
    raw_put(&r, "init_arg", "arg", 3);
    CHECK_CONTAINS(pool_error(r.b, r.len, "init_task"), detail);
    struct fb_wire_hdr h = {.type = FB_MSG_POOL, .len = (uint32_t)r.len};
    CHECK_ERR(fb_wire_check_payload(&h, r.b, NULL, 0), FIBER_EPROTO);
}

TEST(pool_init_task_rules)
{
    char long_task[256];
    memset(long_task, 'i', sizeof long_task);
    pool_refused("a-b", 3, "0x2d");
    pool_refused("a.b", 3, "0x2e");
    pool_refused("in it", 5, "0x20");
    pool_refused("a\0", 2, "0x00");
    pool_refused("\xff", 1, "0xff");
    pool_refused(long_task, FB_WIRE_NAME_MAX + 1, "64");
    pool_refused(long_task, 255, "255");
    struct raw r = {.len = 0};
    raw_u32(&r, "spin_us", 10);
    raw_name(&r, "init_task", long_task, FB_WIRE_NAME_MAX);
    struct fb_msg_pool m;
    CHECK_OK(fb_wire_get_pool(r.b, r.len, &m, NULL, 0));
    CHECK_EQ(m.init_task_len, FB_WIRE_NAME_MAX);
    CHECK_EQ(m.init_arg_len, 0);
    /* A payload over the hard limit is refused before any byte is read. */
    pool_error(r.b, (size_t)FB_WIRE_PAYLOAD_HARD_MAX + 1, "payload");
}

/* POOL's init arg is the rest of the payload, so a cut inside it is a
 * shorter arg; every cut before it is refused. */
TEST(pool_truncated_at_every_length)
{
    struct raw r = {.len = 0};
    raw_u32(&r, "spin_us", 0x01020304);
    raw_name(&r, "init_task", "init", 4);
    raw_put(&r, "init_arg", "xyz", 3);
    size_t arg_at = raw_where(&r, "init_arg", 0);
    for (size_t cut = 0; cut <= r.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        CHECK(copy);
        memcpy(copy, r.b, cut);
        if (cut < arg_at) {
            CHECK_CONTAINS(pool_error(copy, cut, raw_field_at(&r, cut)),
                           "truncated");
        } else {
            struct fb_msg_pool m;
            CHECK_OK(fb_wire_get_pool(copy, cut, &m, NULL, 0));
            CHECK_EQ(m.spin_us, 0x01020304);
            CHECK_EQ(m.init_task_len, 4);
            CHECK_EQ(m.init_arg_len, cut - arg_at);
        }
        free(copy);
    }
}

TEST(pool_empty_messages_refuse_payload)
{
    static const unsigned types[] = {FB_MSG_READY, FB_MSG_STOP,
                                     FB_MSG_HEARTBEAT};
    static const uint8_t junk[8] = {0};
    for (size_t t = 0; t < FB_ARRAY_LEN(types); t++) {
        static const uint32_t lens[] = {1, 4, 8};
        for (size_t i = 0; i < FB_ARRAY_LEN(lens); i++) {
            char err[ERRLEN] = "";
            struct fb_wire_hdr h = {.type = (uint8_t)types[t],
                                    .len = lens[i]};
            CHECK_ERR(fb_wire_check_payload(&h, junk, err, sizeof err),
                      FIBER_EPROTO);
            check_field_error(err, "payload");
        }
        struct fb_wire_hdr h = {.type = (uint8_t)types[t], .len = 0};
        CHECK_OK(fb_wire_check_payload(&h, NULL, NULL, 0));
    }
}

/* -- FAULT -- */

TEST(fault_golden_bytes)
{
    static const uint8_t want[FB_WIRE_FAULT_LEN] = {
        0xbe, 0xf1, 0x01, 0x0e, 0, 0, 0, 0, /* magic, version, type, 0s */
        0x0b, 0, 0, 0,                      /* code = SIGSEGV (11) */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* chunk id */
        0x04, 0, 0, 0,                                  /* len 4 */
        0x2a, 0x01, 0, 0};                              /* offset 298 */
    uint8_t out[FB_WIRE_FAULT_LEN];
    memset(out, 0xee, sizeof out);
    fb_wire_fault_encode(out, 0x0102030405060708u, 11, 298);
    CHECK(memcmp(out, want, sizeof want) == 0);
}

TEST(round_trip_fault)
{
    static const struct {
        uint64_t id;
        int32_t sig;
        uint32_t offset;
    } cases[] = {{0, 0, 0}, {7, 6, 3}, {UINT64_MAX, INT32_MIN, UINT32_MAX},
                 {1, -1, FB_WIRE_CHUNK_MAX - 1}};
    for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
        uint8_t frame[FB_WIRE_FAULT_LEN];
        fb_wire_fault_encode(frame, cases[i].id, cases[i].sig,
                             cases[i].offset);
        fiber_buf b = {0};
        CHECK_OK(fiber_buf_append(&b, frame, sizeof frame));
        size_t off = 0;
        struct fb_wire_hdr h;
        const uint8_t *p = next_frame(&b, &off, &h);
        CHECK_EQ(off, b.len);
        CHECK_EQ(h.type, FB_MSG_FAULT);
        CHECK(h.id == cases[i].id);
        CHECK_EQ(h.code, cases[i].sig);
        CHECK_EQ(h.len, 4);
        uint32_t offset = 0;
        CHECK_OK(fb_wire_get_fault(p, h.len, &offset, NULL, 0));
        CHECK(offset == cases[i].offset);
        fiber_buf_free(&b);
    }
}

TEST(fault_payload_rules)
{
    static const uint8_t raw[9] = {1, 2, 3, 4, 0, 0, 0, 0, 0};
    for (size_t len = 0; len < sizeof raw; len++) {
        uint8_t *copy = malloc(len ? len : 1); /* exact size, for ASan */
        CHECK(copy);
        memcpy(copy, raw, len);
        uint32_t offset = 4242;
        char err[ERRLEN] = "";
        int rc = fb_wire_get_fault(copy, len, &offset, err, sizeof err);
        struct fb_wire_hdr h = {.type = FB_MSG_FAULT, .code = 11,
                                .len = (uint32_t)len};
        if (len == 4) {
            CHECK_OK(rc);
            CHECK_EQ(offset, 0x04030201);
            CHECK_OK(fb_wire_check_payload(&h, copy, NULL, 0));
        } else {
            CHECK_ERR(rc, FIBER_EPROTO);
            CHECK_EQ(offset, 4242);
            if (len < 4) {
                check_field_error(err, "FAULT offset:");
                CHECK_CONTAINS(err, "truncated");
            } else {
                check_field_error(err, "FAULT payload:");
                CHECK_CONTAINS(err, "trailing");
            }
            CHECK_ERR(fb_wire_check_payload(&h, copy, NULL, 0),
                      FIBER_EPROTO);
        }
        free(copy);
    }
}

/* -- encoders -- */

TEST(put_pool_refuses)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_buf_append(&b, "old", 3));
    char long_task[FB_WIRE_NAME_MAX + 1];
    memset(long_task, 'i', sizeof long_task);
    struct fb_msg_pool m = {1, "a-b", 3, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_task");
    m = (struct fb_msg_pool){1, "a\0", 2, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_task");
    m = (struct fb_msg_pool){1, long_task, sizeof long_task, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_task");
    m = (struct fb_msg_pool){1, long_task, 255, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_task");
    m = (struct fb_msg_pool){1, NULL, 3, NULL, 0};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_task");
    m = (struct fb_msg_pool){1, "init", 4, NULL, 2};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_arg");
    /* Refused on its length alone: the bytes are never read. */
    m = (struct fb_msg_pool){1, "init", 4, "x", FB_WIRE_PAYLOAD_HARD_MAX};
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_arg");
    m.init_arg_len = UINT32_MAX;
    CHECK_REFUSED(b, fb_wire_put_pool(&b, &m), "init_arg");
    CHECK_REFUSED(b, fb_wire_put_pool(&b, NULL), "POOL");
    fiber_buf_free(&b);
}

TEST(put_empty_refuses_other_types)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_buf_append(&b, "old", 3));
    /* 256 + READY would be READY if the type were truncated to a byte. */
    static const unsigned bad[] = {
        0,             FB_MSG_HELLO, FB_MSG_WELCOME, FB_MSG_REJECT,
        FB_MSG_RUN,    FB_MSG_EXIT,  FB_MSG_POOL,    FB_MSG_TASK,
        FB_MSG_RESULT, FB_MSG_FAULT, 15,             255,
        256 + FB_MSG_READY};
    for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++)
        CHECK_REFUSED(b, fb_wire_put_empty(&b, bad[i], 1), "not an empty");
    fiber_buf_free(&b);
}

TEST(task_begin_refuses)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_buf_append(&b, "old", 3));
    char long_task[FB_WIRE_NAME_MAX + 1];
    memset(long_task, 't', sizeof long_task);
    size_t mark = 12345;
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, "a.b", 3, &mark), "task");
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, "a b", 3, &mark), "task");
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, "", 0, &mark), "task");
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, NULL, 0, &mark), "task");
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, NULL, 2, &mark), "task");
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, long_task, sizeof long_task,
                                        &mark),
                  "task");
    CHECK_REFUSED(b, fb_wire_task_begin(&b, 1, long_task, SIZE_MAX, &mark),
                  "task");
    CHECK_EQ(mark, 12345);
    fiber_buf_free(&b);
}

/* A refused item leaves the frame being built as it was: the caller may
 * go on and finish it. */
TEST(item_add_refuses)
{
    fiber_buf b = {0};
    size_t mark, len;
    CHECK_OK(fb_wire_task_begin(&b, 1, "sq", 2, &mark));
    CHECK_OK(fb_wire_task_add(&b, "a", 1));
    len = b.len;
    CHECK_ERR(fb_wire_task_add(&b, NULL, 5), FIBER_EINVAL);
    CHECK_EQ(b.len, len);
    fb_wire_task_end(&b, mark, 1);
    size_t off = 0;
    struct fb_wire_hdr h;
    next_frame(&b, &off, &h);
    CHECK_EQ(h.code, 1);

    CHECK_OK(fb_wire_result_begin(&b, 1, 0, &mark));
    CHECK_OK(fb_wire_result_add(&b, 0, "a\0b", 3)); /* success: any bytes */
    len = b.len;
    char big[FB_WIRE_TEXT_MAX + 1];
    memset(big, 'x', sizeof big);
    CHECK_ERR(fb_wire_result_add(&b, 1, "a\0b", 3), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "failure text");
    CHECK_EQ(b.len, len);
    CHECK_ERR(fb_wire_result_add(&b, -1, "\0", 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_result_add(&b, INT32_MIN, big, sizeof big),
              FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "failure text");
    CHECK_ERR(fb_wire_result_add(&b, 1, NULL, 2), FIBER_EINVAL);
    CHECK_ERR(fb_wire_result_add(&b, 0, NULL, 2), FIBER_EINVAL);
    CHECK_EQ(b.len, len);
    CHECK_OK(fb_wire_result_add(&b, 1, big, FB_WIRE_TEXT_MAX));
    fb_wire_result_end(&b, mark, 2, 5);
    next_frame(&b, &off, &h);
    CHECK_EQ(h.type, FB_MSG_RESULT);
    CHECK_EQ(h.code, 2);
    CHECK_EQ(off, b.len);
    fiber_buf_free(&b);
}

TEST(pool_put_null_buffer)
{
    struct fb_msg_pool pool = {1, "", 0, NULL, 0};
    size_t mark;
    CHECK_ERR(fb_wire_put_pool(NULL, &pool), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_empty(NULL, FB_MSG_READY, 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_task_begin(NULL, 1, "sq", 2, &mark), FIBER_EINVAL);
    CHECK_ERR(fb_wire_task_add(NULL, "x", 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_result_begin(NULL, 1, 0, &mark), FIBER_EINVAL);
    CHECK_ERR(fb_wire_result_add(NULL, 0, "x", 1), FIBER_EINVAL);
}

/* ---- garbage -------------------------------------------------------------- */

/* xorshift64*: a fixed seed makes every run test the same inputs. */
static uint64_t rnd_state = 0x9e3779b97f4a7c15u;
static uint64_t rnd(void)
{
    rnd_state ^= rnd_state >> 12;
    rnd_state ^= rnd_state << 25;
    rnd_state ^= rnd_state >> 27;
    return rnd_state * 0x2545f4914f6cdd1du;
}

/* A stream holding one valid frame of every type, and where each starts. */
struct valid_frames {
    fiber_buf buf;
    size_t start[16];
    size_t count;
};

static void valid_mark(struct valid_frames *v)
{
    CHECK(v->count < FB_ARRAY_LEN(v->start));
    v->start[v->count++] = v->buf.len;
}

static void valid_build(struct valid_frames *v)
{
    fiber_buf *b = &v->buf;
    struct fb_msg_hello hello = sample_hello();
    struct fb_msg_welcome welcome = {250};
    struct fb_msg_run run = {"sq", 2, "args", 4};
    struct fb_msg_pool pool = {10, "init", 4, "cfg", 3};
    size_t mark;
    *v = (struct valid_frames){.count = 0};
    valid_mark(v);
    CHECK_OK(fb_wire_put_hello(b, &hello));
    valid_mark(v);
    CHECK_OK(fb_wire_put_welcome(b, &welcome));
    valid_mark(v);
    CHECK_OK(fb_wire_put_run(b, 3, &run));
    valid_mark(v);
    CHECK_OK(fb_wire_put_exit(b, 1, "no", 2));
    valid_mark(v);
    CHECK_OK(fb_wire_put_reject(b, "go away", 7));
    valid_mark(v);
    CHECK_OK(fb_wire_put_ping(b, 4));
    valid_mark(v);
    CHECK_OK(fb_wire_put_pong(b, 4));
    valid_mark(v);
    CHECK_OK(fb_wire_put_pool(b, &pool));
    valid_mark(v);
    CHECK_OK(fb_wire_put_empty(b, FB_MSG_READY, 0));
    valid_mark(v);
    CHECK_OK(fb_wire_task_begin(b, 5, "sq", 2, &mark));
    CHECK_OK(fb_wire_task_add(b, "abc", 3));
    CHECK_OK(fb_wire_task_add(b, NULL, 0));
    CHECK_OK(fb_wire_task_add(b, "\0\xff", 2));
    fb_wire_task_end(b, mark, 3);
    valid_mark(v);
    CHECK_OK(fb_wire_result_begin(b, 5, 1, &mark));
    CHECK_OK(fb_wire_result_add(b, 0, "\0\1", 2));
    CHECK_OK(fb_wire_result_add(b, -3, "oops", 4));
    CHECK_OK(fb_wire_result_add(b, 1, NULL, 0));
    fb_wire_result_end(b, mark, 3, 999);
    valid_mark(v);
    CHECK_OK(fb_wire_put_empty(b, FB_MSG_HEARTBEAT, 0));
    valid_mark(v);
    CHECK_OK(fb_wire_put_empty(b, FB_MSG_STOP, 0));
    valid_mark(v);
    uint8_t fault[FB_WIRE_FAULT_LEN];
    fb_wire_fault_encode(fault, 5, 11, 2);
    CHECK_OK(fiber_buf_append(b, fault, sizeof fault));
}

/* Fills b with n bytes: pure noise, noise behind a plausible header (so
 * that the payload decoders see it), or valid frames with a few bits
 * flipped, starting at a frame or anywhere inside one. */
static void garbage(uint8_t *b, size_t n, const struct valid_frames *valid)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rnd();
    unsigned kind = (unsigned)(rnd() % 3);
    /* Each rnd() call is its own statement: the order in which function
     * arguments are evaluated is unspecified, and the inputs must be the
     * same whatever the compiler. */
    if (kind == 1 && n >= FB_WIRE_HDR_LEN) {
        /* Every type, the unknown 0 and FB_MSG_FAULT + 1 included, and
         * a small code so that TASK and RESULT sometimes have a plausible
         * count. */
        unsigned type = (unsigned)(rnd() % (FB_MSG_NOTE + 2));
        uint32_t code = (uint32_t)(rnd() % 4);
        uint32_t len = (uint32_t)(rnd() % 80);
        raw_hdr(b, FB_WIRE_MAGIC, FB_WIRE_VERSION, type, 0, 0, code, 0, len);
    } else if (kind == 2) {
        const fiber_buf *v = &valid->buf;
        size_t start;
        if (rnd() % 2)
            start = valid->start[rnd() % valid->count];
        else
            start = (size_t)(rnd() % v->len);
        size_t take = v->len - start < n ? v->len - start : n;
        memcpy(b, v->data + start, take);
        for (unsigned flips = (unsigned)(rnd() % 3); flips > 0 && n; flips--) {
            size_t at = (size_t)(rnd() % n);
            b[at] ^= (uint8_t)(1u << (rnd() % 8));
        }
    }
}

TEST(garbage_never_crashes)
{
    struct valid_frames valid;
    valid_build(&valid);
    long decoded = 0, refused = 0, by_type[256] = {0};
    for (int i = 0; i < 100000; i++) {
        size_t n = (size_t)(rnd() % 160);
        uint8_t *b = malloc(n ? n : 1); /* exact size, for ASan */
        CHECK(b);
        garbage(b, n, &valid);
        struct fb_wire_hdr h;
        char err[ERRLEN] = "";
        int rc = fb_wire_hdr_decode(b, n, 1u << 20, &h, err, sizeof err);
        CHECK(rc == 0 || rc == 1 || rc == FIBER_EPROTO);
        CHECK(rc != 1 || n < FB_WIRE_HDR_LEN);
        CHECK(rc != FIBER_EPROTO || err[0] != '\0');
        if (rc == 0 && h.len <= n - FB_WIRE_HDR_LEN) {
            rc = fb_wire_check_payload(&h, b + FB_WIRE_HDR_LEN, err,
                                       sizeof err);
            CHECK(rc == 0 || rc == FIBER_EPROTO);
            CHECK(rc == 0 || err[0] != '\0');
            decoded += rc == 0;
            by_type[h.type] += rc == 0;
        }
        refused += rc == FIBER_EPROTO;
        free(b);
    }
    /* Both outcomes must occur, or the inputs were not exercising much. */
    fprintf(stderr, "decoded %ld frames, refused %ld inputs\n", decoded,
            refused);
    CHECK(decoded > 1000);
    CHECK(refused > 1000);
    /* And every type's decoder must have accepted some frames. */
    for (unsigned t = FB_MSG_HELLO; t <= FB_MSG_FAULT; t++) {
        fprintf(stderr, "  %-9s %ld\n", fb_msg_type_name(t), by_type[t]);
        CHECK(by_type[t] >= 20);
    }
    fiber_buf_free(&valid.buf);
}

/* ---- STATS and SNAPSHOT (fiber top) --------------------------------------- */

static struct fb_msg_snapshot sample_snapshot(void)
{
    return (struct fb_msg_snapshot){.pid = 4321,
                                    .uptime_ms = 61000,
                                    .cpu_user_us = 1500000,
                                    .cpu_sys_us = 200000,
                                    .rss_bytes = 14u << 20,
                                    .backend = "docker",
                                    .backend_len = 6};
}

static const struct fb_msg_snapshot_pool sample_pools[2] = {
    {.name = "Pool1", .name_len = 5, .workers_alive = 2,
     .workers_starting = 1, .workers_target = 3, .workers_started = 4,
     .workers_lost = 1, .tasks_submitted = 1000, .tasks_done = 900,
     .tasks_failed = 2, .tasks_retried = 5, .tasks_crashed = 1,
     .tasks_queued = 90, .tasks_in_flight = 10},
    {.name = "evals-2", .name_len = 7, .workers_alive = 0,
     .workers_target = 0, .tasks_done = UINT64_MAX}};

TEST(round_trip_snapshot)
{
    fiber_buf b = {0};
    struct fb_msg_snapshot m = sample_snapshot();
    CHECK_OK(fb_wire_put_snapshot(&b, 77, &m, sample_pools, 2));
    struct fb_wire_hdr h;
    CHECK_OK(fb_wire_hdr_decode(b.data, b.len, 1 << 20, &h, NULL, 0));
    CHECK_EQ(h.type, FB_MSG_SNAPSHOT);
    CHECK_EQ(h.id, 77);
    /* format, pid, 4 x u64, backend, n_pools, 2 x (name + 84) */
    CHECK_EQ(h.len, 1 + 4 + 32 + 1 + 6 + 4 + (1 + 5 + 84) + (1 + 7 + 84));
    CHECK_EQ(b.data[FB_WIRE_HDR_LEN], FB_WIRE_SNAPSHOT_FORMAT);
    struct fb_msg_snapshot z;
    char err[ERRLEN];
    CHECK_OK(fb_wire_get_snapshot(b.data + FB_WIRE_HDR_LEN, h.len, &z, err,
                                  sizeof err));
    CHECK_EQ(z.pid, 4321);
    CHECK_EQ(z.uptime_ms, 61000);
    CHECK_EQ(z.cpu_user_us, 1500000);
    CHECK_EQ(z.cpu_sys_us, 200000);
    CHECK_EQ(z.rss_bytes, 14u << 20);
    CHECK(z.backend_len == 6 && memcmp(z.backend, "docker", 6) == 0);
    CHECK_EQ(z.n_pools, 2);
    const uint8_t *cur = z.pools;
    struct fb_msg_snapshot_pool p;
    fb_wire_snapshot_next(&cur, &p);
    CHECK(p.name_len == 5 && memcmp(p.name, "Pool1", 5) == 0);
    CHECK_EQ(p.workers_alive, 2);
    CHECK_EQ(p.workers_starting, 1);
    CHECK_EQ(p.workers_target, 3);
    CHECK_EQ(p.workers_started, 4);
    CHECK_EQ(p.workers_lost, 1);
    CHECK_EQ(p.tasks_submitted, 1000);
    CHECK_EQ(p.tasks_done, 900);
    CHECK_EQ(p.tasks_failed, 2);
    CHECK_EQ(p.tasks_retried, 5);
    CHECK_EQ(p.tasks_crashed, 1);
    CHECK_EQ(p.tasks_queued, 90);
    CHECK_EQ(p.tasks_in_flight, 10);
    fb_wire_snapshot_next(&cur, &p);
    CHECK(p.name_len == 7 && memcmp(p.name, "evals-2", 7) == 0);
    CHECK(p.tasks_done == UINT64_MAX);
    CHECK(cur == b.data + b.len);
    CHECK_OK(fb_wire_check_payload(&h, b.data + FB_WIRE_HDR_LEN, err,
                                   sizeof err));
    fiber_buf_free(&b);

    /* No pools at all is a snapshot too; STATS is empty. */
    CHECK_OK(fb_wire_put_snapshot(&b, 1, &m, NULL, 0));
    CHECK_OK(fb_wire_put_empty(&b, FB_MSG_STATS, 9));
    size_t off = 0;
    const uint8_t *q = next_frame(&b, &off, &h);
    CHECK_OK(fb_wire_get_snapshot(q, h.len, &z, err, sizeof err));
    CHECK_EQ(z.n_pools, 0);
    next_frame(&b, &off, &h);
    CHECK_EQ(h.type, FB_MSG_STATS);
    CHECK_EQ(h.id, 9);
    CHECK_EQ(h.len, 0);
    fiber_buf_free(&b);
}

/* Encodes the sample and returns its payload (in b) and length. */
static uint8_t *sample_payload(fiber_buf *b, size_t *len)
{
    struct fb_msg_snapshot m = sample_snapshot();
    CHECK_OK(fb_wire_put_snapshot(b, 1, &m, sample_pools, 2));
    *len = b->len - FB_WIRE_HDR_LEN;
    return b->data + FB_WIRE_HDR_LEN;
}

static const char *snapshot_error(const uint8_t *p, size_t len)
{
    static char err[ERRLEN];
    struct fb_msg_snapshot z;
    err[0] = '\0';
    CHECK_ERR(fb_wire_get_snapshot(p, len, &z, err, sizeof err),
              FIBER_EPROTO);
    CHECK(err[0] != '\0');
    return err;
}

TEST(snapshot_truncated_at_every_length)
{
    fiber_buf b = {0};
    size_t len;
    uint8_t *p = sample_payload(&b, &len);
    for (size_t n = 0; n < len; n++)
        snapshot_error(p, n);
    fiber_buf_free(&b);
}

TEST(snapshot_malformed_fields_are_named)
{
    fiber_buf b = {0};
    size_t len;
    uint8_t *p = sample_payload(&b, &len);
    p[0] = 2; /* a format this fiber does not read */
    CHECK_CONTAINS(snapshot_error(p, len), "SNAPSHOT format: 2");
    p[0] = FB_WIRE_SNAPSHOT_FORMAT;
    size_t backend = 1 + 4 + 32 + 1, n_pools = backend + 6;
    p[backend] = ' ';
    CHECK_CONTAINS(snapshot_error(p, len), "SNAPSHOT backend");
    p[backend] = 'd';
    le32(p + n_pools, FB_WIRE_SNAPSHOT_POOLS_MAX + 1);
    CHECK_CONTAINS(snapshot_error(p, len), "SNAPSHOT n_pools");
    le32(p + n_pools, 3); /* more pools than there are */
    CHECK_CONTAINS(snapshot_error(p, len), "SNAPSHOT pool 2");
    le32(p + n_pools, 1); /* fewer: the second is trailing */
    CHECK_CONTAINS(snapshot_error(p, len), "trailing");
    le32(p + n_pools, 2);
    size_t pool0 = n_pools + 4;
    p[pool0 + 1] = '/';
    CHECK_CONTAINS(snapshot_error(p, len), "SNAPSHOT pool 0 name");
    p[pool0 + 1] = 'P';
    le32(p + pool0 + 6 + 4, 3); /* starting 3 > alive 2 */
    CHECK_CONTAINS(snapshot_error(p, len), "workers_starting");
    le32(p + pool0 + 6 + 4, 1);
    struct fb_msg_snapshot z;
    CHECK_OK(fb_wire_get_snapshot(p, len, &z, NULL, 0));
    /* And STATS takes no payload. */
    struct fb_wire_hdr h = {.type = FB_MSG_STATS, .len = 1};
    char err[ERRLEN] = "";
    CHECK_ERR(fb_wire_check_payload(&h, p, err, sizeof err), FIBER_EPROTO);
    fiber_buf_free(&b);
}

TEST(put_snapshot_refuses)
{
    fiber_buf b = {0};
    struct fb_msg_snapshot m = sample_snapshot();
    struct fb_msg_snapshot_pool bad = sample_pools[0];
    bad.workers_starting = 3;
    CHECK_ERR(fb_wire_put_snapshot(&b, 1, &m, &bad, 1), FIBER_EINVAL);
    bad = sample_pools[0];
    bad.name = "no spaces";
    bad.name_len = 9;
    CHECK_ERR(fb_wire_put_snapshot(&b, 1, &m, &bad, 1), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_snapshot(&b, 1, &m, sample_pools,
                                   FB_WIRE_SNAPSHOT_POOLS_MAX + 1),
              FIBER_EINVAL);
    m.backend_len = 0;
    CHECK_ERR(fb_wire_put_snapshot(&b, 1, &m, NULL, 0), FIBER_EINVAL);
    CHECK_ERR(fb_wire_put_snapshot(NULL, 1, &m, NULL, 0), FIBER_EINVAL);
    CHECK_EQ(b.len, 0);
    fiber_buf_free(&b);
}

TH_MAIN()
