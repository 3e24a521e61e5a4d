/*
 * test_queue.c -- fiber_queue and fiber_pipe across real child processes:
 * ordering, many producers and consumers, capacity, timeouts, close while
 * blocked, handles passed in arguments, and hostile bytes on the server.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"
#include "harness.h"

/* A task argument: a serialised handle followed by two integers. */
struct job {
    int32_t first, count;
    uint32_t handle_len;
    unsigned char handle[200];
};

static void job_from(const void *arg, size_t len, struct job *j)
{
    memset(j, 0, sizeof *j);
    memcpy(j, arg, len < sizeof *j ? len : sizeof *j);
}

FIBER_TASK(produce)
{
    struct job j;
    job_from(arg, len, &j);
    fiber_queue *q;
    if (fiber_queue_open(&q, j.handle, j.handle_len) != 0)
        return 100;
    for (int32_t i = j.first; i < j.first + j.count; i++)
        if (fiber_queue_put(q, &i, sizeof i, -1) != 0)
            return 101;
    fiber_queue_free(q);
    return 0;
}

/* Gets until the queue is closed; returns how many it got, checking that
 * each producer's numbers arrive in order. */
FIBER_TASK(consume_until_closed)
{
    struct job j;
    job_from(arg, len, &j);
    fiber_queue *q;
    if (fiber_queue_open(&q, j.handle, j.handle_len) != 0)
        return -100;
    int got = 0, rc;
    fiber_buf b = {0};
    while ((rc = fiber_queue_get(q, &b, -1)) == 0) {
        got++;
        b.len = 0;
    }
    fiber_buf_free(&b);
    fiber_queue_free(q);
    return rc == FIBER_ECLOSED ? got : -101;
}

/* Blocks on get; returns 0 if woken by close with FIBER_ECLOSED. */
FIBER_TASK(blocked_get)
{
    struct job j;
    job_from(arg, len, &j);
    fiber_queue *q;
    if (fiber_queue_open(&q, j.handle, j.handle_len) != 0)
        return 100;
    int rc = fiber_queue_get(q, NULL, -1);
    fiber_queue_free(q);
    return rc == FIBER_ECLOSED ? 0 : 1;
}

/* Echoes every message back until the pipe closes. */
FIBER_TASK(echo_pipe)
{
    struct job j;
    job_from(arg, len, &j);
    fiber_pipe *p;
    if (fiber_pipe_open(&p, j.handle, j.handle_len) != 0)
        return 100;
    fiber_buf b = {0};
    int n = 0, rc;
    while ((rc = fiber_pipe_recv(p, &b, -1)) == 0) {
        if (fiber_pipe_send(p, b.data, b.len, -1) != 0)
            return 101;
        b.len = 0;
        n++;
    }
    fiber_pipe_close(p);
    fiber_pipe_free(p);
    fiber_buf_free(&b);
    return rc == FIBER_ECLOSED ? n : -1;
}

static struct job job_for_queue(fiber_queue *q, int first, int count)
{
    struct job j = {.first = first, .count = count};
    fiber_buf b = {0};
    CHECK_OK(fiber_queue_serialize(q, &b));
    CHECK(b.len <= sizeof j.handle);
    memcpy(j.handle, b.data, b.len);
    j.handle_len = (uint32_t)b.len;
    fiber_buf_free(&b);
    return j;
}

static fiber_process *start(const char *task, const struct job *j)
{
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, task, j, sizeof *j, NULL));
    return p;
}

static int finish(fiber_process *p)
{
    int code = -999;
    CHECK_OK(fiber_process_join(p, 30000));
    CHECK_OK(fiber_process_exitcode(p, &code));
    fiber_process_free(p);
    return code;
}

TEST(put_get_in_one_process)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    for (int i = 0; i < 100; i++)
        CHECK_OK(fiber_queue_put(q, &i, sizeof i, -1));
    size_t n;
    CHECK_OK(fiber_queue_size(q, &n));
    CHECK_EQ(n, 100);
    fiber_buf b = {0};
    for (int i = 0; i < 100; i++) {
        b.len = 0;
        CHECK_OK(fiber_queue_get(q, &b, 0));
        CHECK_EQ(b.len, sizeof(int));
        CHECK_EQ(*(int *)b.data, i);
    }
    CHECK_ERR(fiber_queue_get(q, &b, 0), FIBER_EAGAIN);
    fiber_buf_free(&b);
    fiber_queue_free(q);
}

TEST(put_batch_keeps_order_with_single_puts)
{
    enum { N = 5000 }; /* more than one frame of a batch (4096) */
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    static int vals[N];
    static fiber_iov msgs[N];
    for (int i = 0; i < N; i++) {
        vals[i] = i + 1;
        msgs[i] = (fiber_iov){&vals[i], sizeof vals[i]};
    }
    int zero = 0;
    CHECK_OK(fiber_queue_put(q, &zero, sizeof zero, -1));
    CHECK_OK(fiber_queue_put_batch(q, msgs, N));
    CHECK_OK(fiber_queue_put_batch(q, msgs, 0)); /* nothing: no error */
    int last = N + 1;
    CHECK_OK(fiber_queue_put(q, &last, sizeof last, -1));
    CHECK_ERR(fiber_queue_put_batch(q, NULL, 3), FIBER_EINVAL);
    fiber_iov big[2] = {{&zero, sizeof zero}, {&zero, (size_t)1 << 40}};
    CHECK_ERR(fiber_queue_put_batch(q, big, 2), FIBER_ETOOBIG);
    CHECK_ERR(fiber_queue_put_batch(NULL, msgs, 1), FIBER_EINVAL);
    CHECK_OK(fiber_queue_flush(q, 10000));
    size_t n;
    CHECK_OK(fiber_queue_size(q, &n));
    CHECK_EQ(n, N + 2); /* the refused batches put nothing */
    fiber_buf b = {0};
    for (int i = 0; i < N + 2; i++) {
        b.len = 0;
        CHECK_OK(fiber_queue_get(q, &b, 0));
        CHECK_EQ(b.len, sizeof(int));
        CHECK_EQ(*(int *)b.data, i);
    }
    CHECK_ERR(fiber_queue_get(q, &b, 0), FIBER_EAGAIN);
    fiber_buf_free(&b);
    fiber_queue_free(q);
}

TEST(try_get_takes_only_what_the_handle_prefetched)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf b = {0};
    /* nothing asked for yet: nothing held, whatever the queue has */
    int v = 7;
    CHECK_OK(fiber_queue_put(q, &v, sizeof v, 0));
    CHECK_ERR(fiber_queue_try_get(q, &b), FIBER_EAGAIN);
    CHECK_CONTAINS(fiber_last_error(), "prefetched");
    for (int i = 0; i < 10; i++)
        CHECK_OK(fiber_queue_put(q, &i, sizeof i, 0));
    /* a get lends the handle a window: the next ones need no server */
    CHECK_OK(fiber_queue_get(q, &b, 1000));
    CHECK_EQ(*(int *)b.data, 7);
    for (int i = 0; i < 10; i++) {
        b.len = 0;
        CHECK_OK(fiber_queue_try_get(q, &b));
        CHECK_EQ(b.len, sizeof(int));
        CHECK_EQ(*(int *)b.data, i);
    }
    CHECK_ERR(fiber_queue_try_get(q, &b), FIBER_EAGAIN);
    size_t n;
    CHECK_OK(fiber_queue_size(q, &n));
    CHECK_EQ(n, 0); /* what try_get returned was taken */
    CHECK_ERR(fiber_queue_try_get(NULL, &b), FIBER_EINVAL);
    fiber_buf_free(&b);
    fiber_queue_free(q);
}

TEST(child_producer_keeps_order)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 16)); /* small: the producer waits */
    struct job j = job_for_queue(q, 0, 2000);
    fiber_process *p = start("produce", &j);
    fiber_buf b = {0};
    for (int i = 0; i < 2000; i++) {
        b.len = 0;
        CHECK_OK(fiber_queue_get(q, &b, 20000));
        CHECK_EQ(*(int *)b.data, i);
    }
    CHECK_EQ(finish(p), 0);
    fiber_buf_free(&b);
    fiber_queue_free(q);
}

TEST(many_producers_many_consumers)
{
    enum { P = 3, C = 3, EACH = 1500 };
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 64));
    fiber_process *prod[P], *cons[C];
    for (int i = 0; i < C; i++) {
        struct job j = job_for_queue(q, 0, 0);
        cons[i] = start("consume_until_closed", &j);
    }
    for (int i = 0; i < P; i++) {
        struct job j = job_for_queue(q, i * EACH, EACH);
        prod[i] = start("produce", &j);
    }
    for (int i = 0; i < P; i++)
        CHECK_EQ(finish(prod[i]), 0);
    /* Everything produced is in or through the queue: wait until the
     * consumers drained it, then close to release them. */
    size_t left = 1;
    for (int i = 0; i < 2000 && left; i++) {
        CHECK_OK(fiber_queue_size(q, &left));
        if (left) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
    }
    CHECK_EQ(left, 0);
    CHECK_OK(fiber_queue_close(q));
    int total = 0;
    for (int i = 0; i < C; i++) {
        int got = finish(cons[i]);
        CHECK(got >= 0);
        total += got;
    }
    CHECK_EQ(total, P * EACH);
    fiber_queue_free(q);
}

TEST(capacity_and_timeouts)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 2));
    int v = 1;
    CHECK_OK(fiber_queue_put(q, &v, sizeof v, 0));
    CHECK_OK(fiber_queue_put(q, &v, sizeof v, 0));
    CHECK_ERR(fiber_queue_put(q, &v, sizeof v, 0), FIBER_EAGAIN);
    CHECK_CONTAINS(fiber_last_error(), "full");
    uint64_t t0 = fb_now_ms();
    CHECK_ERR(fiber_queue_put(q, &v, sizeof v, 150), FIBER_ETIMEDOUT);
    uint64_t waited = fb_now_ms() - t0;
    CHECK(waited >= 140 && waited < 2000);
    CHECK_OK(fiber_queue_get(q, NULL, 0));
    CHECK_OK(fiber_queue_get(q, NULL, 0));
    t0 = fb_now_ms();
    CHECK_ERR(fiber_queue_get(q, NULL, 150), FIBER_ETIMEDOUT);
    waited = fb_now_ms() - t0;
    CHECK(waited >= 140 && waited < 2000);
    fiber_queue_free(q);
}

TEST(close_wakes_a_blocked_child)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    struct job j = job_for_queue(q, 0, 0);
    fiber_process *p = start("blocked_get", &j);
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL); /* let it block */
    CHECK_EQ(fiber_process_is_alive(p), 1);
    CHECK_OK(fiber_queue_close(q));
    CHECK_EQ(finish(p), 0);
    int v = 3;
    CHECK_ERR(fiber_queue_put(q, &v, sizeof v, 0), FIBER_ECLOSED);
    fiber_queue_free(q);
}

TEST(close_drains_then_fails)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    int v = 7;
    CHECK_OK(fiber_queue_put(q, &v, sizeof v, 0));
    CHECK_OK(fiber_queue_close(q));
    fiber_buf b = {0};
    CHECK_OK(fiber_queue_get(q, &b, 0));
    CHECK_EQ(*(int *)b.data, 7);
    CHECK_ERR(fiber_queue_get(q, &b, -1), FIBER_ECLOSED);
    fiber_buf_free(&b);
    fiber_queue_free(q);
}

TEST(bad_handles_are_refused)
{
    fiber_queue *q = NULL;
    CHECK_ERR(fiber_queue_open(&q, "garbage", 7), FIBER_EINVAL);
    unsigned char fake[100] = "FBH1";
    CHECK_ERR(fiber_queue_open(&q, fake, sizeof fake), FIBER_EINVAL);
    CHECK(q == NULL);
    char junk[64] = {0};
    CHECK_ERR(fiber_queue_put((fiber_queue *)junk, "x", 1, 0), FIBER_EINVAL);
    fiber_queue_free(NULL);
    fiber_pipe_free(NULL);
}

TEST(hostile_bytes_on_the_server_socket)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    struct fb_objsrv *s;
    CHECK_OK(fb_master_objsrv(&s));
    int fds[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(fb_sock_dial(fb_objsrv_address(s), fb_deadline_ms(5000),
                              &fds[i]));
    const char http[] = "GET / HTTP/1.1\r\nHost: fiber\r\n\r\n";
    send(fds[0], http, sizeof http - 1, MSG_NOSIGNAL);
    /* A HELLO header that promises far too much. */
    struct fb_wire_hdr h = {.type = FB_MSG_HELLO, .len = 50u << 20};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    send(fds[1], hdr, sizeof hdr, MSG_NOSIGNAL);
    /* A well-formed OCALL without HELLO first. */
    fiber_buf call = {0};
    CHECK_OK(fb_wire_put_ocall(&call, 1, 17, 1, 0, NULL, 0));
    send(fds[2], call.data, call.len, MSG_NOSIGNAL);
    fiber_buf_free(&call);
    for (int i = 0; i < 3; i++) {
        char buf[64];
        ssize_t n;
        struct timespec ts = {0, 10000000};
        for (int k = 0; k < 300; k++) {
            n = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN))
                break;
            nanosleep(&ts, NULL);
        }
        CHECK(n == 0 || (n < 0 && errno != EAGAIN)); /* dropped */
        close(fds[i]);
    }
    /* And the queue still serves a real client, in a child too. */
    struct job j = job_for_queue(q, 5, 3);
    fiber_process *p = start("produce", &j);
    CHECK_EQ(finish(p), 0);
    size_t n;
    CHECK_OK(fiber_queue_size(q, &n));
    CHECK_EQ(n, 3);
    fiber_queue_free(q);
}

TEST(duplex_pipe_with_a_child)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    struct job j = {0};
    fiber_buf ser = {0};
    CHECK_OK(fiber_pipe_serialize(b, &ser));
    memcpy(j.handle, ser.data, ser.len);
    j.handle_len = (uint32_t)ser.len;
    fiber_buf_free(&ser);
    fiber_process *p = start("echo_pipe", &j);
    fiber_buf got = {0};
    for (int i = 0; i < 200; i++) {
        char msg[32];
        int n = snprintf(msg, sizeof msg, "message %d", i);
        CHECK_OK(fiber_pipe_send(a, msg, (size_t)n, -1));
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(a, &got, 20000));
        CHECK_EQ(got.len, (size_t)n);
        CHECK(memcmp(got.data, msg, (size_t)n) == 0);
    }
    CHECK_OK(fiber_pipe_close(a));
    CHECK_EQ(finish(p), 200);
    CHECK_ERR(fiber_pipe_recv(a, &got, 5000), FIBER_ECLOSED);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
    fiber_pipe_free(b);
}

TEST(one_way_pipe)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 0));
    CHECK_ERR(fiber_pipe_recv(a, NULL, 0), FIBER_ENOTSUP);
    CHECK_ERR(fiber_pipe_send(b, "x", 1, 0), FIBER_ENOTSUP);
    CHECK_OK(fiber_pipe_send(a, "hello", 5, 0));
    CHECK_OK(fiber_pipe_close(a));
    fiber_buf got = {0};
    CHECK_OK(fiber_pipe_recv(b, &got, 0));
    CHECK_EQ(got.len, 5);
    CHECK_ERR(fiber_pipe_recv(b, &got, 0), FIBER_ECLOSED);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
    fiber_pipe_free(b);
}

TH_MAIN()
