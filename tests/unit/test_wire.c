/*
 * test_wire.c -- the wire format: exact byte layout, round trips of every
 * message, and rejection (never a crash) of malformed input.
 *
 * Malformed frames are built here byte by byte rather than with the
 * encoders, both because the encoders refuse to produce them and so that
 * the layout is checked by a second, independent implementation.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
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
    CHECK_STR(fb_msg_type_name(0), "?");
    CHECK_STR(fb_msg_type_name(8), "?");
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
    for (unsigned type = FB_MSG_HELLO; type <= FB_MSG_PONG; type++) {
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
    static const unsigned bad[] = {0, 8, 200, 255};
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
    static const unsigned bad[] = {0, 8, 200};
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

/* Fills b with n bytes: pure noise, noise behind a plausible header (so
 * that the payload decoders see it), or a valid frame with a few bytes
 * changed. */
static void garbage(uint8_t *b, size_t n, const fiber_buf *valid)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rnd();
    unsigned kind = (unsigned)(rnd() % 3);
    /* Each rnd() call is its own statement: the order in which function
     * arguments are evaluated is unspecified, and the inputs must be the
     * same whatever the compiler. */
    if (kind == 1 && n >= FB_WIRE_HDR_LEN) {
        unsigned type = (unsigned)(rnd() % 9);
        good_hdr(b, type, (uint32_t)(rnd() % 80));
    } else if (kind == 2) {
        /* Half start at the first frame, half anywhere inside one. */
        size_t start = rnd() % 2 ? 0 : (size_t)(rnd() % valid->len);
        size_t take = valid->len - start < n ? valid->len - start : n;
        memcpy(b, valid->data + start, take);
        for (unsigned flips = (unsigned)(rnd() % 3); flips > 0 && n; flips--) {
            size_t at = (size_t)(rnd() % n);
            b[at] ^= (uint8_t)(1u << (rnd() % 8));
        }
    }
}

TEST(garbage_never_crashes)
{
    fiber_buf valid = {0};
    struct fb_msg_hello hello = sample_hello();
    struct fb_msg_run run = {"sq", 2, "args", 4};
    CHECK_OK(fb_wire_put_hello(&valid, &hello));
    CHECK_OK(fb_wire_put_run(&valid, 3, &run));
    CHECK_OK(fb_wire_put_exit(&valid, 1, "no", 2));
    long decoded = 0, refused = 0;
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
        }
        refused += rc == FIBER_EPROTO;
        free(b);
    }
    /* Both outcomes must occur, or the inputs were not exercising much. */
    fprintf(stderr, "decoded %ld frames, refused %ld inputs\n", decoded,
            refused);
    CHECK(decoded > 1000);
    CHECK(refused > 1000);
    fiber_buf_free(&valid);
}

TH_MAIN()
