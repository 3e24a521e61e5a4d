/*
 * test_security.c -- the master's port against peers that do not belong:
 * garbage, wrong tokens, silence, oversized frames, a different program.
 * Each is dropped (and logged), and real children keep being served.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"
#include "store/object_int.h"
#include "harness.h"
#include "net/net.h"
#include "wire/wire.h"

int fb_process_start_program(fiber_process **out, const char *task,
                             const void *arg, size_t len,
                             const fiber_job_opts *opts, const char *program);
const char *fb_process_failure(fiber_process *p);

FIBER_TASK(ret_arg)
{
    int v = 0;
    if (len == sizeof v)
        memcpy(&v, arg, sizeof v);
    return v;
}

/* A real child still gets its work done. */
static void check_real_child_works(int value)
{
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "ret_arg", &value, sizeof value, NULL));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, value);
    fiber_process_free(p);
}

static int dial_master(void)
{
    const char *addr = fb_rt_address();
    CHECK(addr[0] != '\0');
    int fd;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fd));
    return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
    CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n);
}

/* Reads until the master closes the connection (or 5 s pass); returns
 * what it sent and 1 if it closed. */
static int read_until_closed(int fd, fiber_buf *got)
{
    uint64_t deadline = fb_deadline_ms(5000);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, fb_ms_left(deadline)) <= 0)
            return 0;
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return 1;
        if (n > 0)
            fiber_buf_append(got, buf, (size_t)n);
    }
}

/* Decodes a REJECT frame from got and returns its text (static). */
static const char *reject_text(const fiber_buf *got)
{
    static char text[1100];
    struct fb_wire_hdr h;
    CHECK_EQ(fb_wire_hdr_decode(got->data, got->len, 4096, &h, NULL, 0), 0);
    CHECK_EQ(h.type, FB_MSG_REJECT);
    struct fb_msg_text t;
    CHECK_OK(fb_wire_get_text(got->data + FB_WIRE_HDR_LEN, h.len, &t, NULL,
                              0));
    snprintf(text, sizeof text, "%.*s", (int)t.len, t.text);
    return text;
}

static void wait_dropped(uint64_t want)
{
    uint64_t deadline = fb_deadline_ms(5000);
    while (fb_rt_dropped_peers() < want && fb_ms_left(deadline) > 0) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    CHECK(fb_rt_dropped_peers() >= want);
}

TEST(listens_only_on_a_private_ipc_path)
{
    const char *addr = fb_rt_address();
    CHECK(strncmp(addr, "unix:", 5) == 0);
    char dir[PATH_MAX];
    fb_strlcpy(dir, addr + 5, sizeof dir);
    struct stat st;
    CHECK(stat(dirname(dir), &st) == 0);
    CHECK_EQ(st.st_mode & 0777, 0700);
    CHECK_EQ(st.st_uid, geteuid());
}

TEST(tcp_transport_listens_on_loopback)
{
    CHECK_OK(fiber_config_set("transport", "tcp"));
    const char *addr = fb_rt_address();
    CHECK(strncmp(addr, "tcp:127.0.0.1:", 14) == 0);
    check_real_child_works(9);
}

TEST(garbage_is_dropped)
{
    int fd = dial_master();
    char junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(i * 37 + 11);
    send_all(fd, junk, sizeof junk);
    fiber_buf got = {0};
    CHECK(read_until_closed(fd, &got));
    CHECK_EQ(got.len, 0); /* garbage gets no answer */
    close(fd);
    fiber_buf_free(&got);
    wait_dropped(1);
    check_real_child_works(11);
}

TEST(wrong_token_is_rejected)
{
    int fd = dial_master();
    struct fb_msg_hello h = {.build_id = fb_rt_build_id(),
                             .build_id_len = (uint8_t)strlen(fb_rt_build_id()),
                             .job_id = 1,
                             .pid = 1,
                             .name = "intruder",
                             .name_len = 8};
    memcpy(h.token, fb_rt_token(), sizeof h.token);
    h.token[5] ^= 1; /* one bit off */
    fiber_buf msg = {0};
    CHECK_OK(fb_wire_put_hello(&msg, &h));
    send_all(fd, msg.data, msg.len);
    fiber_buf got = {0};
    CHECK(read_until_closed(fd, &got));
    CHECK_CONTAINS(reject_text(&got), "authentication failed");
    close(fd);
    fiber_buf_free(&msg);
    fiber_buf_free(&got);
    wait_dropped(1);
    check_real_child_works(12);
}

TEST(right_token_for_unknown_job_is_rejected)
{
    int fd = dial_master();
    struct fb_msg_hello h = {.build_id = fb_rt_build_id(),
                             .build_id_len = (uint8_t)strlen(fb_rt_build_id()),
                             .job_id = 999999,
                             .name = "ghost",
                             .name_len = 5};
    memcpy(h.token, fb_rt_token(), sizeof h.token);
    fiber_buf msg = {0}, got = {0};
    CHECK_OK(fb_wire_put_hello(&msg, &h));
    send_all(fd, msg.data, msg.len);
    CHECK(read_until_closed(fd, &got));
    CHECK_CONTAINS(reject_text(&got), "job 999999 is unknown");
    close(fd);
    fiber_buf_free(&msg);
    fiber_buf_free(&got);
}

TEST(first_message_must_be_hello)
{
    int fd = dial_master();
    fiber_buf msg = {0}, got = {0};
    CHECK_OK(fb_wire_put_ping(&msg, 1));
    send_all(fd, msg.data, msg.len);
    CHECK(read_until_closed(fd, &got));
    close(fd);
    fiber_buf_free(&msg);
    fiber_buf_free(&got);
    wait_dropped(1);
}

TEST(oversized_frame_is_dropped_at_once)
{
    int fd = dial_master();
    struct fb_wire_hdr h = {.type = FB_MSG_HELLO, .len = 100u << 20};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    send_all(fd, hdr, sizeof hdr);
    uint64_t t0 = fb_now_ms();
    fiber_buf got = {0};
    CHECK(read_until_closed(fd, &got));
    CHECK(fb_now_ms() - t0 < 2000); /* not waiting for 100 MiB */
    close(fd);
    fiber_buf_free(&got);
}

/* Says nothing on fd and checks that the server closes it, without a
 * word, once connect_timeout_ms (300 ms here) has passed. */
static void check_silent_peer_dropped(int fd)
{
    uint64_t t0 = fb_now_ms();
    fiber_buf got = {0};
    CHECK(read_until_closed(fd, &got));
    uint64_t waited = fb_now_ms() - t0;
    CHECK(waited >= 250);
    CHECK(waited < 3000);
    CHECK_EQ(got.len, 0);
    close(fd);
    fiber_buf_free(&got);
}

TEST(silent_peers_are_dropped_after_the_deadline)
{
    CHECK_OK(fiber_config_set("connect_timeout_ms", "300"));
    check_silent_peer_dropped(dial_master());
}

TEST(hundreds_of_hostile_peers_do_not_stop_real_children)
{
    enum { N = 300 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = dial_master();
        if (i % 3 == 1)
            send_all(fds[i], "GET / HTTP/1.0\r\n\r\n", 18);
        if (i % 3 == 2) /* a valid-looking header announcing a huge HELLO */
            send_all(fds[i], "\xbe\xf1\x01\x01\0\0\0\0", 8);
    }
    check_real_child_works(13);
    check_real_child_works(14);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    wait_dropped(N / 3);
}

/* 1 once the peer has closed fd (what it sent is read and discarded). */
static int peer_closed(int fd)
{
    for (;;) {
        char buf[256];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0)
            continue;
        return n == 0 || (errno != EAGAIN && errno != EINTR);
    }
}

/* Opens n silent connections to addr and waits until all but `keep` of
 * them are closed by the server (5 s at most); returns how many are. */
static int flood_silently(const char *addr, int *fds, int n, int keep)
{
    for (int i = 0; i < n; i++)
        CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fds[i]));
    int closed = 0;
    uint64_t deadline = fb_deadline_ms(5000);
    while (fb_ms_left(deadline) > 0) {
        closed = 0;
        for (int i = 0; i < n; i++)
            closed += peer_closed(fds[i]);
        if (closed >= n - keep)
            break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    return closed;
}

TEST(strangers_over_max_pending_connections_make_room)
{
    enum { N = 40, MAX = 8 };
    CHECK_OK(fiber_config_set("max_pending_connections", "8"));
    int fds[N];
    int closed = flood_silently(fb_rt_address(), fds, N, MAX);
    CHECK_EQ(closed, N - MAX); /* the oldest went; MAX still wait */
    CHECK(fb_rt_refused_peers() >= N - MAX);
    /* A child connecting now makes room for itself too. */
    check_real_child_works(16);
    for (int i = 0; i < N; i++)
        close(fds[i]);
}

FIBER_TASK(put_one)
{
    (void)out;
    fiber_queue *q;
    int rc = fiber_queue_open(&q, arg, len);
    if (rc == 0)
        rc = fiber_queue_put(q, "x", 1, 5000);
    fiber_queue_free(q);
    return rc ? 1 : 0;
}

TEST(object_server_keeps_at_most_max_pending_strangers)
{
    enum { N = 40, MAX = 8 };
    CHECK_OK(fiber_config_set("max_pending_connections", "8"));
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    struct fb_objsrv *s;
    CHECK_OK(fb_master_objsrv(&s));
    int fds[N];
    int closed = flood_silently(fb_objsrv_address(s), fds, N, MAX);
    CHECK_EQ(closed, N - MAX);
    CHECK(fb_objsrv_dropped(s) >= N - MAX);
    /* A child's client still gets in. */
    fiber_buf ser = {0};
    CHECK_OK(fiber_queue_serialize(q, &ser));
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "put_one", ser.data, ser.len, NULL));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_buf item = {0};
    CHECK_OK(fiber_queue_get(q, &item, 5000));
    CHECK_EQ(item.len, 1);
    fiber_buf_free(&item);
    fiber_buf_free(&ser);
    fiber_process_free(p);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    fiber_queue_free(q);
}

/* A child's task: the length of the shared object whose ref is arg. */
FIBER_TASK(object_len)
{
    (void)out;
    fiber_ref ref;
    const void *data;
    size_t n;
    if (len != sizeof ref)
        return fiber_task_fail("want a ref");
    memcpy(&ref, arg, sizeof ref);
    int rc = fiber_object_get(&ref, &data, &n);
    if (rc)
        return fiber_task_fail("fiber_object_get: %s", fiber_last_error());
    return (int)n;
}

/* The blob server (shared objects) keeps the same gate as every server:
 * at most max_pending_connections strangers wait, the oldest make room,
 * and a child still gets the object. */
TEST(blob_server_keeps_at_most_max_pending_strangers)
{
    enum { N = 40, MAX = 8 };
    CHECK_OK(fiber_config_set("max_pending_connections", "8"));
    fiber_ref r;
    CHECK_OK(fiber_object_put("seven b", 7, &r));
    const char *addr = fb_objects_master_address();
    CHECK(addr[0] != '\0');
    int fds[N];
    int closed = flood_silently(addr, fds, N, MAX);
    CHECK_EQ(closed, N - MAX);
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "object_len", &r, sizeof r, NULL));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 7);
    fiber_process_free(p);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    CHECK_OK(fiber_object_release(&r));
}

/* A burst of real children, many more than max_pending_connections,
 * dials the master and then the blob server at once: every one starts and
 * gets the object.  A server accepts no more than the gate has room for
 * between two batches of events, so HELLOs already sent are read before
 * newer connections push them out; a child cut anyway dials again
 * (fb_dial_again).  Before, children exited with status 122 (cut before
 * WELCOME) and a fetch failed with "closed the connection". */
TEST(a_burst_of_real_children_over_max_pending_connections_all_get_in)
{
    enum { N = 32 };
    CHECK_OK(fiber_config_set("max_pending_connections", "2"));
    static char blob[200007];
    memset(blob, 7, sizeof blob);
    fiber_ref r;
    CHECK_OK(fiber_object_put(blob, sizeof blob, &r));
    fiber_process *ps[N];
    for (int i = 0; i < N; i++)
        CHECK_OK(fiber_process_start(&ps[i], "object_len", &r, sizeof r,
                                     NULL));
    for (int i = 0; i < N; i++) {
        CHECK_OK(fiber_process_join(ps[i], 60000));
        int code;
        CHECK_OK(fiber_process_exitcode(ps[i], &code));
        CHECK_EQ(code, (int)sizeof blob);
        fiber_process_free(ps[i]);
    }
    CHECK_OK(fiber_object_release(&r));
}

/* The blob server drops a stranger that stays silent past
 * connect_timeout_ms, as the master does. */
TEST(blob_server_drops_silent_peers_after_the_deadline)
{
    CHECK_OK(fiber_config_set("connect_timeout_ms", "300"));
    fiber_ref r;
    CHECK_OK(fiber_object_put("x", 1, &r));
    const char *addr = fb_objects_master_address();
    CHECK(addr[0] != '\0');
    int fd;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fd));
    check_silent_peer_dropped(fd);
    CHECK_OK(fiber_object_release(&r));
}

/* A job that runs a different program (another test binary here) is told
 * so and never runs its assignment. */
TEST(different_program_is_refused)
{
    char self[PATH_MAX], other[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n] = '\0';
    snprintf(other, sizeof other, "%s/test_core", dirname(self));
    CHECK(access(other, X_OK) == 0);
    fiber_process *p;
    int v = 5;
    CHECK_OK(fb_process_start_program(&p, "ret_arg", &v, sizeof v, NULL,
                                      other));
    CHECK_OK(fiber_process_join(p, 20000));
    int code;
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, FB_EXIT_REJECTED);
    CHECK_CONTAINS(fb_process_failure(p), "different program");
    fiber_process_free(p);
    check_real_child_works(15);
}

TH_MAIN()
