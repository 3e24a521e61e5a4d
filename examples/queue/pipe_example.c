/*
 * pipe_example.c -- fiber_pipe between the master and a child process
 * (docs/pipe.md explains it).
 *
 * 1. A duplex pipe: the master keeps one end and hands the other to a
 *    child that answers every line with the line in upper case, until the
 *    master closes its end.
 * 2. A one-way pipe: a child gets the sending end and streams a few
 *    progress reports to the master, which reads until FIBER_ECLOSED.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <fiber/fiber.h>

#define HANDLE_MAX 256

struct pipe_arg {
    uint32_t len;
    unsigned char handle[HANDLE_MAX];
};

static int open_arg(const void *arg, size_t len, fiber_pipe **p)
{
    struct pipe_arg a;
    if (len != sizeof a)
        return fiber_task_fail("want a struct pipe_arg");
    memcpy(&a, arg, sizeof a);
    if (fiber_pipe_open(p, a.handle, a.len) != 0)
        return fiber_task_fail("open: %s", fiber_last_error());
    return 0;
}

/* Answers each message with its upper-case copy; returns how many. */
FIBER_TASK(shout)
{
    fiber_pipe *p;
    int rc = open_arg(arg, len, &p);
    if (rc)
        return rc;
    fiber_buf line = {0};
    int n = 0;
    while ((rc = fiber_pipe_recv(p, &line, -1)) == 0) {
        for (size_t i = 0; i < line.len; i++)
            line.data[i] = (unsigned char)toupper(line.data[i]);
        if (fiber_pipe_send(p, line.data, line.len, -1) != 0)
            break;
        line.len = 0;
        n++;
    }
    /* The master closed its sending direction: close ours too, so that
     * its recv ends with FIBER_ECLOSED once it has read our answers. */
    fiber_pipe_close(p);
    fiber_pipe_free(p);
    fiber_buf_free(&line);
    return rc == FIBER_ECLOSED ? n : fiber_task_fail("recv: %s",
                                                     fiber_last_error());
}

/* Sends four progress reports, then closes. */
FIBER_TASK(report)
{
    fiber_pipe *p;
    int rc = open_arg(arg, len, &p);
    if (rc)
        return rc;
    for (int pct = 25; pct <= 100 && rc == 0; pct += 25) {
        char text[32];
        int n = snprintf(text, sizeof text, "%d%% done", pct);
        rc = fiber_pipe_send(p, text, (size_t)n, -1);
    }
    fiber_pipe_close(p);
    fiber_pipe_free(p);
    return rc;
}

static int start_with(const char *task, fiber_pipe *end, fiber_process **out)
{
    struct pipe_arg a;
    memset(&a, 0, sizeof a);
    fiber_buf b = {0};
    int rc = fiber_pipe_serialize(end, &b);
    if (rc == 0 && b.len > HANDLE_MAX)
        rc = FIBER_ETOOBIG;
    if (rc == 0) {
        memcpy(a.handle, b.data, b.len);
        a.len = (uint32_t)b.len;
        rc = fiber_process_start(out, task, &a, sizeof a, NULL);
    }
    fiber_buf_free(&b);
    return rc;
}

static int finish(fiber_process *p)
{
    int code = -1;
    fiber_process_join(p, -1);
    fiber_process_exitcode(p, &code);
    fiber_process_free(p);
    return code;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* children never return here */
        fprintf(stderr, "fiber_init: %s\n", fiber_last_error());
        return 1;
    }

    /* 1. Duplex: both ends send and receive. */
    fiber_pipe *mine, *theirs;
    fiber_process *child;
    if (fiber_pipe_create(&mine, &theirs, 1) != 0 ||
        start_with("shout", theirs, &child) != 0) {
        fprintf(stderr, "duplex: %s\n", fiber_last_error());
        return 1;
    }
    fiber_pipe_free(theirs); /* the child has its own handle now */
    const char *lines[] = {"hello", "pipes carry bytes", "in order"};
    fiber_buf got = {0};
    for (int i = 0; i < 3; i++) {
        fiber_pipe_send(mine, lines[i], strlen(lines[i]), -1);
        got.len = 0;
        if (fiber_pipe_recv(mine, &got, 10000) != 0) {
            fprintf(stderr, "recv: %s\n", fiber_last_error());
            return 1;
        }
        printf("sent \"%s\", got back \"%.*s\"\n", lines[i], (int)got.len,
               (const char *)got.data);
    }
    fiber_pipe_close(mine); /* the child's recv: FIBER_ECLOSED */
    printf("the child answered %d messages\n", finish(child));
    int rc = fiber_pipe_recv(mine, &got, 1000);
    printf("recv after both ends closed: %s\n", fiber_errname(rc));
    fiber_pipe_free(mine);

    /* 2. One-way: `tx` only sends, `rx` only receives. */
    fiber_pipe *tx, *rx;
    if (fiber_pipe_create(&tx, &rx, 0) != 0 ||
        start_with("report", tx, &child) != 0) {
        fprintf(stderr, "one-way: %s\n", fiber_last_error());
        return 1;
    }
    fiber_pipe_free(tx);
    for (;;) {
        got.len = 0;
        rc = fiber_pipe_recv(rx, &got, 10000);
        if (rc != 0)
            break;
        printf("child reports: %.*s\n", (int)got.len, (const char *)got.data);
    }
    printf("the stream ended with %s\n", fiber_errname(rc));
    printf("the child exited with %d\n", finish(child));
    rc = fiber_pipe_send(rx, "x", 1, 0);
    printf("send on the receiving end: %s\n", fiber_errname(rc));
    fiber_pipe_free(rx);
    fiber_buf_free(&got);
    return 0;
}
