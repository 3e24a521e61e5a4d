/*
 * test_pipe.c -- the contract of fiber_pipe across real child processes,
 * whatever carries the messages: both ends in children, one end in the
 * master, an end handed on after its first use (nothing lost or
 * reordered), close and end of stream, hostile peers on the socket a
 * pipe's end listens on (garbage, a wrong token, silence) refused while
 * the pipe goes on working, a killed peer (FIBER_ECLOSED, not a hang), and
 * a linked end refused for hand-over (docs/pipe.md).
 */
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "objsrv/objsrv.h"
#include "pipe/pipe_ops.h"
#include "runtime/runtime.h"
#include "harness.h"

/* A task argument: a serialised end followed by a count. */
struct job {
    int32_t count;
    uint32_t handle_len;
    unsigned char handle[200];
};

static int open_job(const void *arg, size_t len, fiber_pipe **p,
                    struct job *j)
{
    memset(j, 0, sizeof *j);
    memcpy(j, arg, len < sizeof *j ? len : sizeof *j);
    return fiber_pipe_open(p, j->handle, j->handle_len);
}

/* Echoes every message back until the pipe closes; returns how many. */
FIBER_TASK(echo)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return -100;
    fiber_buf b = {0};
    int n = 0, rc;
    while ((rc = fiber_pipe_recv(p, &b, -1)) == 0) {
        if (fiber_pipe_send(p, b.data, b.len, -1) != 0)
            break;
        b.len = 0;
        n++;
    }
    fiber_pipe_close(p);
    fiber_pipe_free(p);
    fiber_buf_free(&b);
    return rc == FIBER_ECLOSED ? n : -101;
}

/* Sends count numbered messages, each waiting for its echo, then closes
 * and expects FIBER_ECLOSED once the echo closed too; 0 when all held. */
FIBER_TASK(ping)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return 100;
    fiber_buf b = {0};
    int bad = 0;
    for (int32_t i = 0; i < j.count && !bad; i++) {
        if (fiber_pipe_send(p, &i, sizeof i, -1) != 0)
            bad = 101;
        b.len = 0;
        if (!bad && fiber_pipe_recv(p, &b, 20000) != 0)
            bad = 102;
        if (!bad && (b.len != sizeof i || memcmp(b.data, &i, sizeof i)))
            bad = 103;
    }
    if (!bad && fiber_pipe_close(p) != 0)
        bad = 104;
    if (!bad && fiber_pipe_recv(p, &b, 20000) != FIBER_ECLOSED)
        bad = 105;
    fiber_pipe_free(p);
    fiber_buf_free(&b);
    return bad;
}

/* Sends count numbered messages pipelined (timeout -1), then closes. */
FIBER_TASK(stream)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return 100;
    for (int32_t i = 0; i < j.count; i++)
        if (fiber_pipe_send(p, &i, sizeof i, -1) != 0)
            return 101;
    int rc = fiber_pipe_close(p);
    /* After the close, this end's sends fail. */
    if (rc == 0 && fiber_pipe_send(p, "x", 1, 0) != FIBER_ECLOSED)
        rc = 102;
    fiber_pipe_free(p);
    return rc;
}

/* Sends count numbered messages and frees its end without closing it:
 * the process then exits (its end of a link ends with it). */
FIBER_TASK(send_and_go)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return 100;
    for (int32_t i = 0; i < j.count; i++)
        if (fiber_pipe_send(p, &i, sizeof i, -1) != 0)
            return 101;
    fiber_pipe_free(p);
    return 0;
}

/* Sends count numbered messages (each acknowledged by the server: not
 * pipelined) and kills itself without freeing anything. */
FIBER_TASK(send_and_die)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return 100;
    for (int32_t i = 0; i < j.count; i++)
        if (fiber_pipe_send(p, &i, sizeof i, 10000) != 0)
            return 101;
    kill(getpid(), SIGKILL);
    return 102;
}

/* Opens its end and exits without using it. */
FIBER_TASK(hold_and_go)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return 100;
    fiber_pipe_free(p);
    return 0;
}

/* Sends count numbered messages pipelined and returns without freeing
 * or closing its end, as a Python target does (its process then exits). */
FIBER_TASK(send_and_return)
{
    struct job j;
    fiber_pipe *p;
    if (open_job(arg, len, &p, &j) != 0)
        return 100;
    for (int32_t i = 0; i < j.count; i++)
        if (fiber_pipe_send(p, &i, sizeof i, -1) != 0)
            return 101;
    return 0;
}

static struct job job_for(fiber_pipe *end, int count)
{
    struct job j = {.count = count};
    fiber_buf b = {0};
    CHECK_OK(fiber_pipe_serialize(end, &b));
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
    CHECK_OK(fiber_process_join(p, 60000));
    CHECK_OK(fiber_process_exitcode(p, &code));
    fiber_process_free(p);
    return code;
}

TEST(both_ends_in_children)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    struct job ja = job_for(a, 500), jb = job_for(b, 0);
    fiber_pipe_free(a);
    fiber_pipe_free(b);
    /* The echo starts first, the pinger later: either may be first. */
    fiber_process *e = start("echo", &jb);
    fiber_process *p = start("ping", &ja);
    CHECK_EQ(finish(p), 0);
    CHECK_EQ(finish(e), 500);
}

TEST(one_end_in_the_master_receives_a_pipelined_stream)
{
    fiber_pipe *tx, *rx;
    CHECK_OK(fiber_pipe_create(&tx, &rx, 0));
    struct job j = job_for(tx, 20000);
    fiber_pipe_free(tx);
    fiber_process *p = start("stream", &j);
    fiber_buf got = {0};
    for (int32_t i = 0; i < 20000; i++) {
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(rx, &got, 20000));
        CHECK_EQ(got.len, sizeof i);
        int32_t v;
        memcpy(&v, got.data, sizeof v);
        CHECK_EQ(v, i);
    }
    CHECK_ERR(fiber_pipe_recv(rx, &got, 20000), FIBER_ECLOSED);
    /* And stays closed. */
    CHECK_ERR(fiber_pipe_recv(rx, &got, 0), FIBER_ECLOSED);
    CHECK_EQ(finish(p), 0);
    fiber_buf_free(&got);
    fiber_pipe_free(rx);
}

/* A long stream from a child that dials the master's waiting end: its
 * sends are batched by its flusher thread while the link is still being
 * set up; every message arrives once, in order (a race between the
 * flusher and the set-up once garbled the stream). */
TEST(a_long_stream_over_the_link_arrives_whole)
{
    fiber_pipe *tx, *rx;
    CHECK_OK(fiber_pipe_create(&tx, &rx, 0));
    fiber_buf got = {0};
    /* rx's first use: it waits for the child's end to dial it. */
    CHECK_ERR(fiber_pipe_recv(rx, &got, 0), FIBER_EAGAIN);
    struct job j = job_for(tx, 300000);
    fiber_pipe_free(tx);
    fiber_process *p = start("stream", &j);
    for (int32_t i = 0; i < 300000; i++) {
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(rx, &got, 20000));
        CHECK_EQ(got.len, sizeof i);
        int32_t v;
        memcpy(&v, got.data, sizeof v);
        CHECK_EQ(v, i);
    }
    CHECK_ERR(fiber_pipe_recv(rx, &got, 20000), FIBER_ECLOSED);
    char addr[600];
    CHECK_EQ(fb_pipe_peek(rx, addr, sizeof addr), 1);
    CHECK_EQ(finish(p), 0);
    fiber_buf_free(&got);
    fiber_pipe_free(rx);
}

/* The master uses end b itself, then hands it to a child: what was sent
 * to b and not yet received by the master reaches the child, in order. */
TEST(end_handed_on_after_first_use)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    for (int32_t i = 0; i < 3; i++)
        CHECK_OK(fiber_pipe_send(a, &i, sizeof i, -1));
    fiber_buf got = {0};
    CHECK_OK(fiber_pipe_recv(b, &got, 20000));
    int32_t v;
    memcpy(&v, got.data, sizeof v);
    CHECK_EQ(v, 0);
    CHECK_OK(fiber_pipe_send(b, "from the master", 15, -1));
    struct job j = job_for(b, 0);
    fiber_pipe_free(b); /* the child has its own */
    fiber_process *p = start("echo", &j);
    got.len = 0;
    CHECK_OK(fiber_pipe_recv(a, &got, 20000));
    CHECK_EQ(got.len, 15);
    CHECK(memcmp(got.data, "from the master", 15) == 0);
    /* 1 and 2 were sent before the hand-over: the child echoes them. */
    for (int32_t i = 1; i < 3; i++) {
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(a, &got, 20000));
        CHECK_EQ(got.len, sizeof i);
        memcpy(&v, got.data, sizeof v);
        CHECK_EQ(v, i);
    }
    CHECK_OK(fiber_pipe_send(a, "after", 5, -1));
    got.len = 0;
    CHECK_OK(fiber_pipe_recv(a, &got, 20000));
    CHECK_EQ(got.len, 5);
    CHECK_OK(fiber_pipe_close(a));
    CHECK_EQ(finish(p), 3);
    CHECK_ERR(fiber_pipe_recv(a, &got, 20000), FIBER_ECLOSED);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
}

/* A close half-closes: the closer can still receive. */
TEST(close_drains_then_eof_and_half_closes)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    for (int32_t i = 0; i < 100; i++)
        CHECK_OK(fiber_pipe_send(a, &i, sizeof i, -1));
    CHECK_OK(fiber_pipe_close(a));
    CHECK_ERR(fiber_pipe_send(a, "x", 1, 0), FIBER_ECLOSED);
    fiber_buf got = {0};
    for (int32_t i = 0; i < 100; i++) {
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(b, &got, 20000));
        int32_t v;
        memcpy(&v, got.data, sizeof v);
        CHECK_EQ(v, i);
    }
    CHECK_ERR(fiber_pipe_recv(b, &got, 0), FIBER_ECLOSED);
    /* The other direction still works. */
    CHECK_OK(fiber_pipe_send(b, "back", 4, -1));
    got.len = 0;
    CHECK_OK(fiber_pipe_recv(a, &got, 20000));
    CHECK_EQ(got.len, 4);
    CHECK_OK(fiber_pipe_close(b));
    CHECK_ERR(fiber_pipe_recv(a, &got, 20000), FIBER_ECLOSED);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
    fiber_pipe_free(b);
}

/* The master's end waits first (its first use is a recv), and the child
 * dials it, sends a few messages and exits before the master's end has
 * answered: the messages arrive all the same, then FIBER_ECLOSED (the
 * child went away).  The master's answer once failed to write to the
 * gone child, and the link's set-up stopped there with the child's
 * PIPE_LINK and messages unread: they never arrived. */
TEST(messages_of_a_peer_gone_before_the_link_was_answered_arrive)
{
    for (int round = 0; round < 5; round++) {
        fiber_pipe *tx, *rx;
        CHECK_OK(fiber_pipe_create(&tx, &rx, 0));
        fiber_buf got = {0};
        CHECK_ERR(fiber_pipe_recv(rx, &got, 0), FIBER_EAGAIN);
        struct job j = job_for(tx, 3);
        fiber_pipe_free(tx);
        CHECK_EQ(finish(start("send_and_go", &j)), 0);
        for (int32_t i = 0; i < 3; i++) {
            got.len = 0;
            CHECK_OK(fiber_pipe_recv(rx, &got, 20000));
            CHECK_EQ(got.len, sizeof i);
            int32_t v;
            memcpy(&v, got.data, sizeof v);
            CHECK_EQ(v, i);
        }
        CHECK_ERR(fiber_pipe_recv(rx, &got, 20000), FIBER_ECLOSED);
        fiber_buf_free(&got);
        fiber_pipe_free(rx);
    }
}

/* The child uses its end first (so it waits, and its messages go through
 * the relayed queue), then exits or is killed before the master's end is
 * used: the master receives what it sent, then FIBER_ECLOSED naming the
 * gone process, instead of waiting for an end no process holds (the
 * rendezvous saw the child's connection end: GONE); a send fails the
 * same way. */
TEST(a_peer_gone_before_the_other_end_was_used_ends_the_stream)
{
    const char *tasks[] = {"send_and_go", "send_and_die"};
    for (int t = 0; t < 2; t++) {
        fiber_pipe *a, *b;
        CHECK_OK(fiber_pipe_create(&a, &b, 1));
        struct job j = job_for(b, 3);
        fiber_pipe_free(b);
        int code = finish(start(tasks[t], &j));
        CHECK_EQ(code, t == 0 ? 0 : -SIGKILL);
        fiber_buf got = {0};
        for (int32_t i = 0; i < 3; i++) {
            got.len = 0;
            CHECK_OK(fiber_pipe_recv(a, &got, 20000));
            int32_t v;
            memcpy(&v, got.data, sizeof v);
            CHECK_EQ(v, i);
        }
        CHECK_ERR(fiber_pipe_recv(a, &got, 20000), FIBER_ECLOSED);
        CHECK_CONTAINS(fiber_last_error(), "went away");
        CHECK_ERR(fiber_pipe_recv(a, &got, 0), FIBER_ECLOSED);
        CHECK_ERR(fiber_pipe_send(a, "x", 1, -1), FIBER_ECLOSED);
        fiber_buf_free(&got);
        fiber_pipe_free(a);
    }
}

/* A child that opened its end and ended without using it: the master's
 * recv, already waiting, fails with FIBER_ECLOSED instead of waiting for
 * an end no process holds (the open said HOLD to the rendezvous). */
TEST(a_peer_that_never_used_its_end_ends_the_stream)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    fiber_buf got = {0};
    CHECK_ERR(fiber_pipe_recv(a, &got, 0), FIBER_EAGAIN); /* a waits */
    struct job j = job_for(b, 0);
    fiber_pipe_free(b);
    fiber_process *p = start("hold_and_go", &j);
    CHECK_ERR(fiber_pipe_recv(a, &got, 60000), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), "went away");
    CHECK_EQ(finish(p), 0);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
}

/* A child streams over the link and its target returns without freeing
 * its end: the messages its flusher had not yet written when the target
 * returned still arrive (the child drains its ends before it exits; the
 * last batch was lost before), then FIBER_ECLOSED. */
TEST(a_stream_whose_sender_returns_without_freeing_arrives_whole)
{
    for (int round = 0; round < 3; round++) {
        fiber_pipe *tx, *rx;
        CHECK_OK(fiber_pipe_create(&tx, &rx, 0));
        fiber_buf got = {0};
        CHECK_ERR(fiber_pipe_recv(rx, &got, 0), FIBER_EAGAIN);
        struct job j = job_for(tx, 20000);
        fiber_pipe_free(tx);
        fiber_process *p = start("send_and_return", &j);
        for (int32_t i = 0; i < 20000; i++) {
            got.len = 0;
            CHECK_OK(fiber_pipe_recv(rx, &got, 20000));
            int32_t v;
            memcpy(&v, got.data, sizeof v);
            CHECK_EQ(v, i);
        }
        CHECK_ERR(fiber_pipe_recv(rx, &got, 20000), FIBER_ECLOSED);
        CHECK_EQ(finish(p), 0);
        fiber_buf_free(&got);
        fiber_pipe_free(rx);
    }
}

/* Waits until the peer on fd closed its side; 1 when it did. */
static int dropped(int fd)
{
    char buf[256];
    struct timespec ts = {0, 10000000};
    for (int k = 0; k < 500; k++) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return 1;
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* A stranger who knows where an end listens but not the run's token: it
 * sends a HELLO with a wrong token (over the run's encryption, when the
 * link is TCP) and expects a REJECT naming the token, then the end of the
 * connection.  Runs in a thread: the end it talks to is served by the
 * master's own calls. */
struct intruder {
    char addr[600];
    int result; /* 0: refused as it should be; else which step failed */
    int done;
};

static void *intrude(void *arg)
{
    struct intruder *in = arg;
    int fd;
    in->result = 1;
    if (fb_sock_dial(in->addr, fb_deadline_ms(5000), &fd) != 0)
        goto out;
    struct fb_conn c;
    fb_conn_init(&c, fd, 1u << 20);
    in->result = 2;
    if (fb_conn_secure_for(&c, in->addr, FB_SEC_CLIENT, fb_rt_token()) != 0)
        goto close;
    const char *bid = fb_rt_build_id();
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .name = "pipe-b", .name_len = 6};
    memcpy(h.token, fb_rt_token(), sizeof h.token);
    h.token[0] ^= 1;
    in->result = 3;
    if (fb_wire_put_hello(fb_conn_out(&c), &h) != 0 ||
        fb_conn_flush_wait(&c, fb_deadline_ms(10000)) != 0)
        goto close;
    struct fb_wire_hdr hd;
    const uint8_t *pl;
    in->result = 4;
    if (fb_conn_recv_wait(&c, &hd, &pl, fb_deadline_ms(10000)) != 1 ||
        hd.type != FB_MSG_REJECT || !memmem(pl, hd.len, "wrong token", 11))
        goto close;
    in->result = 5;
    if (fb_conn_recv_wait(&c, &hd, &pl, fb_deadline_ms(10000)) >= 0)
        goto close;
    in->result = 0;
close:
    fb_conn_close(&c);
out:
    __atomic_store_n(&in->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Strangers on the socket an end listens on while it waits for the other
 * end: garbage, a HELLO with the wrong token, and one that never says
 * anything.  The first two are dropped (the second after a REJECT naming
 * the token) while the end is in use; the silent one cannot stop the
 * other end from linking, and is dropped when it does. */
TEST(hostile_peers_on_the_pipes_socket_are_refused)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    struct job j = job_for(b, 0);
    fiber_pipe_free(b);
    /* a's first use: it is the first end, so it listens. */
    CHECK_OK(fiber_pipe_send(a, "one", 3, -1));
    char addr[600];
    CHECK_EQ(fb_pipe_peek(a, addr, sizeof addr), 0);
    CHECK(addr[0] != '\0');

    int junk, silent;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &junk));
    const char http[] = "GET / HTTP/1.1\r\nHost: fiber\r\n\r\n";
    send(junk, http, sizeof http - 1, MSG_NOSIGNAL);
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &silent));
    struct intruder in = {.result = -1};
    fb_strlcpy(in.addr, addr, sizeof in.addr);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, intrude, &in) == 0);
    /* The master's calls on a serve its socket meanwhile. */
    fiber_buf got = {0};
    for (int k = 0; k < 200 && !__atomic_load_n(&in.done, __ATOMIC_ACQUIRE);
         k++)
        CHECK_ERR(fiber_pipe_recv(a, &got, 50), FIBER_ETIMEDOUT);
    pthread_join(t, NULL);
    CHECK_EQ(in.result, 0);
    CHECK(dropped(junk));
    close(junk);

    /* The other end links in spite of the silent stranger. */
    fiber_process *p = start("echo", &j);
    CHECK_OK(fiber_pipe_recv(a, &got, 20000));
    CHECK_EQ(got.len, 3);
    for (int i = 0; i < 50; i++) {
        CHECK_OK(fiber_pipe_send(a, &i, sizeof i, -1));
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(a, &got, 20000));
        CHECK_EQ(got.len, sizeof i);
    }
    CHECK_EQ(fb_pipe_peek(a, addr, sizeof addr), 1);
    CHECK_EQ(addr[0], '\0'); /* no longer listening */
    CHECK(dropped(silent));
    close(silent);
    CHECK_OK(fiber_pipe_close(a));
    CHECK_EQ(finish(p), 51);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
}

/* Ends in two processes are linked directly; when the process holding the
 * other end is killed, this end's recv and send fail with FIBER_ECLOSED
 * (saying the peer went away) instead of waiting. */
TEST(a_killed_peer_closes_the_pipe)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    struct job j = job_for(b, 0);
    fiber_pipe_free(b);
    fiber_process *p = start("echo", &j);
    fiber_buf got = {0};
    char addr[600];
    int i = 0;
    for (; i < 1000 && fb_pipe_peek(a, addr, sizeof addr) != 1; i++) {
        CHECK_OK(fiber_pipe_send(a, &i, sizeof i, -1));
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(a, &got, 20000));
        CHECK_EQ(got.len, sizeof i);
    }
    CHECK_EQ(fb_pipe_peek(a, addr, sizeof addr), 1);
    CHECK_OK(fiber_process_kill(p));
    CHECK_OK(fiber_process_join(p, 60000));
    fiber_process_free(p);
    uint64_t t0 = fb_now_ms();
    CHECK_ERR(fiber_pipe_recv(a, &got, 20000), FIBER_ECLOSED);
    CHECK(fb_now_ms() - t0 < 10000);
    CHECK(strstr(fiber_last_error(), "went away") != NULL);
    CHECK_ERR(fiber_pipe_send(a, "x", 1, -1), FIBER_ECLOSED);
    CHECK(strstr(fiber_last_error(), "went away") != NULL);
    fiber_buf_free(&got);
    fiber_pipe_free(a);
}

/* One end handed to three writers (the master serialises it three
 * times), as multiprocessing lets workers share a Connection, while the
 * master already waits on the other end: the pipe stays relayed (SHARED),
 * so that each writer's messages arrive, in order.  Before, the first
 * writer linked directly and the others' sends failed ("already
 * connected directly"). */
TEST(one_end_handed_to_several_writers_serves_them_all)
{
    enum { WRITERS = 3, EACH = 300 };
    fiber_pipe *tx, *rx;
    CHECK_OK(fiber_pipe_create(&tx, &rx, 0));
    fiber_buf got = {0};
    CHECK_ERR(fiber_pipe_recv(rx, &got, 0), FIBER_EAGAIN); /* rx joins */
    fiber_process *w[WRITERS];
    for (int k = 0; k < WRITERS; k++) {
        struct job j = job_for(tx, EACH);
        w[k] = start("send_and_go", &j);
    }
    fiber_pipe_free(tx);
    int seen[EACH] = {0};
    for (int n = 0; n < WRITERS * EACH; n++) {
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(rx, &got, 30000));
        CHECK_EQ(got.len, sizeof(int32_t));
        int32_t v;
        memcpy(&v, got.data, sizeof v);
        CHECK(v >= 0 && v < EACH);
        /* A writer's messages in order: v's count never passes v-1's. */
        CHECK(v == 0 || seen[v] < seen[v - 1]);
        seen[v]++;
    }
    for (int i = 0; i < EACH; i++)
        CHECK_EQ(seen[i], WRITERS);
    char addr[600];
    CHECK_EQ(fb_pipe_peek(rx, addr, sizeof addr), 0); /* relayed */
    for (int k = 0; k < WRITERS; k++)
        CHECK_EQ(finish(w[k]), 0);
    fiber_buf_free(&got);
    fiber_pipe_free(rx);
}

/* HANDED and SHARED from a hostile or broken client: a missing or wrong
 * side is refused with a message naming the operation, and the pipe
 * still works afterwards. */
TEST(malformed_handed_and_shared_are_refused)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    fiber_buf ser = {0};
    CHECK_OK(fiber_pipe_serialize(a, &ser));
    char addr[FB_PIPE_ADDR_MAX];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t send_obj, recv_obj, rdv;
    CHECK_OK(fb_handle_decode(ser.data, ser.len - 5, FB_HANDLE_PIPE, addr,
                              sizeof addr, token, &send_obj, &recv_obj));
    memcpy(&rdv, (const char *)ser.data + ser.len - 5, 4);
    struct fb_oclient *c;
    CHECK_OK(fb_oclient_get(addr, token, &c));
    uint32_t bad = 7, good = 0;
    fiber_iov bad_side = {&bad, 4}, two[2] = {{&good, 4}, {&good, 4}};
    CHECK_ERR(fb_ocall(c, rdv, FB_PRDV_SHARED, 10000, &bad_side, 1, NULL),
              FIBER_EINVAL);
    CHECK(strstr(fiber_last_error(), "SHARED wants a side") != NULL);
    CHECK_ERR(fb_ocall(c, rdv, FB_PRDV_SHARED, 10000, two, 2, NULL),
              FIBER_EINVAL);
    CHECK_ERR(fb_ocall(c, rdv, FB_PRDV_HANDED, 10000, NULL, 0, NULL),
              FIBER_EINVAL);
    CHECK(strstr(fiber_last_error(), "HANDED wants a side") != NULL);
    fb_oclient_release(c);
    /* Nothing was changed: the ends still talk. */
    fiber_buf got = {0};
    CHECK_OK(fiber_pipe_send(a, "hi", 2, -1));
    CHECK_OK(fiber_pipe_recv(b, &got, 20000));
    CHECK_EQ(got.len, 2);
    fiber_buf_free(&got);
    fiber_buf_free(&ser);
    fiber_pipe_free(a);
    fiber_pipe_free(b);
}

/* A linked end cannot be handed on: serialising it says why. */
TEST(a_linked_end_is_not_handed_on)
{
    fiber_pipe *a, *b;
    CHECK_OK(fiber_pipe_create(&a, &b, 1));
    struct job j = job_for(b, 0);
    fiber_pipe_free(b);
    fiber_process *p = start("echo", &j);
    fiber_buf got = {0};
    char addr[600];
    for (int i = 0; i < 1000 && fb_pipe_peek(a, addr, sizeof addr) != 1;
         i++) {
        CHECK_OK(fiber_pipe_send(a, &i, sizeof i, -1));
        got.len = 0;
        CHECK_OK(fiber_pipe_recv(a, &got, 20000));
    }
    fiber_buf ser = {0};
    CHECK_ERR(fiber_pipe_serialize(a, &ser), FIBER_ESTATE);
    CHECK(strstr(fiber_last_error(), "cannot be handed on") != NULL);
    CHECK_OK(fiber_pipe_close(a));
    CHECK(finish(p) > 0);
    fiber_buf_free(&got);
    fiber_buf_free(&ser);
    fiber_pipe_free(a);
}

TH_MAIN()
