/*
 * test_queue_loss.c -- what a queue guarantees when consumers die, and
 * what freeing or detaching a handle does (the loops that free many
 * queues are in test_lifetime.c).
 *
 * The kill cases: the master puts ITEMS numbered items on a queue while
 * three consumer processes take them (prefetching, as every consumer
 * does); every ITEMS/16 puts the master SIGKILLs a random consumer and
 * starts a replacement.  Each consumer appends the number of every item it got
 * to a file of its own, with one write() per item, so what it recorded
 * survives its death.  At the end the files are counted:
 *   - plain gets: no item recorded twice; an item may be missing only if
 *     its consumer was killed between the get returning it and the
 *     write() (at most one per kill); every other item, including all
 *     the items the dead consumers had prefetched, was delivered;
 *   - leases (get_lease, write, ack): every item recorded; an item
 *     recorded twice only when the first consumer was killed between the
 *     write() and the ack (at most one per kill).
 * ITEMS is 200,000 here (about ten seconds); TEST_KILL_ITEMS sets
 * another count (docs/queue.md: the long run uses 1,000,000).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define CONSUMERS 3
#define KILLS 16 /* a consumer is killed every ITEMS / KILLS puts */

struct consumer_arg {
    int lease;
    char path[200];
    uint32_t handle_len;
    unsigned char handle[200];
};

static int record(int fd, uint32_t n)
{
    return write(fd, &n, sizeof n) == (ssize_t)sizeof n ? 0 : -1;
}

/* Takes items until the queue is closed, recording each; returns 0. */
FIBER_TASK(loss_consumer)
{
    struct consumer_arg a;
    if (len != sizeof a)
        return 100;
    memcpy(&a, arg, sizeof a);
    fiber_queue *q;
    if (fiber_queue_open(&q, a.handle, a.handle_len) != 0)
        return 101;
    int fd = open(a.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return 102;
    fiber_buf b = {0};
    int rc;
    for (;;) {
        b.len = 0;
        uint64_t lease = 0;
        rc = a.lease ? fiber_queue_get_lease(q, &b, &lease, -1)
                     : fiber_queue_get(q, &b, -1);
        if (rc != 0)
            break;
        uint32_t n;
        if (b.len != sizeof n)
            return 103;
        memcpy(&n, b.data, sizeof n);
        if (record(fd, n) != 0)
            return 104;
        if (a.lease && fiber_queue_ack(q, lease) != 0)
            return 105;
    }
    close(fd);
    fiber_buf_free(&b);
    fiber_queue_free(q);
    return rc == FIBER_ECLOSED ? 0 : 106;
}

static long items_to_move(void)
{
    const char *e = getenv("TEST_KILL_ITEMS");
    long n = e ? strtol(e, NULL, 10) : 200000;
    return n > 0 ? n : 200000;
}

static fiber_process *start_consumer(const char *dir, int slot, int lease,
                                     const fiber_buf *handle)
{
    static int serial;
    struct consumer_arg a = {.lease = lease};
    snprintf(a.path, sizeof a.path, "%s/c%d-%d", dir, slot, serial++);
    CHECK(handle->len <= sizeof a.handle);
    memcpy(a.handle, handle->data, handle->len);
    a.handle_len = (uint32_t)handle->len;
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "loss_consumer", &a, sizeof a, NULL));
    return p;
}

static void kill_and_reap(fiber_process *p)
{
    long pid = fiber_process_pid(p);
    CHECK(pid > 0);
    CHECK_EQ(kill((pid_t)pid, SIGKILL), 0);
    CHECK_OK(fiber_process_join(p, 10000));
    fiber_process_free(p);
}

/* Adds every number recorded in dir's files to seen[]. */
static void count_records(const char *dir, int files, uint32_t *seen,
                          long items)
{
    for (int i = 0; i < files; i++) {
        for (int s = 0; s < CONSUMERS; s++) {
            char path[256];
            snprintf(path, sizeof path, "%s/c%d-%d", dir, s, i);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            uint32_t n;
            while (read(fd, &n, sizeof n) == (ssize_t)sizeof n) {
                CHECK(n < (uint32_t)items);
                seen[n]++;
            }
            close(fd);
            unlink(path);
        }
    }
}

static void transfer_with_kills(int lease)
{
    long items = items_to_move();
    char dir[] = "/tmp/fiber-loss-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 4096));
    fiber_buf h = {0};
    CHECK_OK(fiber_queue_serialize(q, &h));
    fiber_process *cons[CONSUMERS];
    for (int i = 0; i < CONSUMERS; i++)
        cons[i] = start_consumer(dir, i, lease, &h);
    unsigned seed = (unsigned)time(NULL);
    long kill_every = items / KILLS;
    int kills = 0;
    for (long i = 0; i < items; i++) {
        uint32_t n = (uint32_t)i;
        CHECK_OK(fiber_queue_put(q, &n, sizeof n, -1));
        if (i == 0 || i % kill_every != 0)
            continue;
        /* Let the consumers get going (a fresh one starts in a few ms),
         * then kill one at random, mid-stream. */
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
        int victim = (int)(rand_r(&seed) % CONSUMERS);
        kill_and_reap(cons[victim]);
        cons[victim] = start_consumer(dir, victim, lease, &h);
        kills++;
    }
    CHECK_OK(fiber_queue_flush(q, 60000));
    /* Wait until everything was taken, then close to end the consumers. */
    size_t left = 1;
    for (int i = 0; i < 6000 && left; i++) {
        CHECK_OK(fiber_queue_size(q, &left));
        if (left) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    CHECK_EQ(left, 0);
    CHECK_OK(fiber_queue_close(q));
    for (int i = 0; i < CONSUMERS; i++) {
        int code = -1;
        CHECK_OK(fiber_process_join(cons[i], 30000));
        CHECK_OK(fiber_process_exitcode(cons[i], &code));
        CHECK_EQ(code, 0);
        fiber_process_free(cons[i]);
    }
    uint32_t *seen = calloc((size_t)items, sizeof *seen);
    CHECK(seen != NULL);
    count_records(dir, kills + CONSUMERS, seen, items);
    long missing = 0, twice = 0;
    for (long i = 0; i < items; i++) {
        if (seen[i] == 0)
            missing++;
        else
            twice += seen[i] - 1; /* recordings beyond the first */
    }
    printf("%ld items, %d consumers killed: %ld missing, %ld twice "
           "(%s)\n",
           items, kills, missing, twice, lease ? "leases" : "plain gets");
    CHECK_EQ(kills, KILLS - 1); /* the case killed consumers */
    if (lease) {
        CHECK_EQ(missing, 0);
        CHECK(twice <= kills);
    } else {
        CHECK_EQ(twice, 0);
        CHECK(missing <= kills);
    }
    free(seen);
    rmdir(dir);
    fiber_buf_free(&h);
    fiber_queue_free(q);
}

TEST(killed_consumers_lose_nothing)
{
    transfer_with_kills(0);
}

TEST(killed_consumers_with_leases_lose_nothing)
{
    transfer_with_kills(1);
}

/* A consumer that frees its handle while it holds prefetched items and a
 * lease gives them back: another handle gets all of them, in order. */
TEST(freed_consumer_gives_back_what_it_held)
{
    fiber_queue *q, *a, *b;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf h = {0};
    CHECK_OK(fiber_queue_serialize(q, &h));
    CHECK_OK(fiber_queue_open(&a, h.data, h.len));
    CHECK_OK(fiber_queue_open(&b, h.data, h.len));
    for (int32_t i = 0; i < 10; i++)
        CHECK_OK(fiber_queue_put(q, &i, sizeof i, -1));
    CHECK_OK(fiber_queue_flush(q, 10000));
    fiber_buf m = {0};
    uint64_t lease;
    CHECK_OK(fiber_queue_get_lease(a, &m, &lease, 1000)); /* a holds 0..9 */
    CHECK_EQ(*(int32_t *)m.data, 0);
    size_t n = 0;
    CHECK_OK(fiber_queue_size(q, &n));
    CHECK_EQ(n, 10); /* lent and leased still count */
    CHECK_ERR(fiber_queue_ack(a, lease + 1), FIBER_EINVAL);
    fiber_queue_free(a); /* the lease and 1..9 go back */
    for (int32_t i = 0; i < 10; i++) {
        m.len = 0;
        CHECK_OK(fiber_queue_get(b, &m, 1000));
        CHECK_EQ(*(int32_t *)m.data, i);
    }
    CHECK_ERR(fiber_queue_get(b, &m, 0), FIBER_EAGAIN);
    fiber_buf_free(&m);
    fiber_buf_free(&h);
    fiber_queue_free(b);
    fiber_queue_free(q);
}

/* Counts the messages handle `other` can still get at once: what the
 * queue holds beyond what the other consumers were lent. */
static long available_to(fiber_queue *other)
{
    long n = 0;
    while (fiber_queue_get(other, NULL, 0) == 0)
        n++;
    return n;
}

/* Takes n messages through h, sleeping pause_ms before each. */
static void take_some(fiber_queue *h, int n, int pause_ms)
{
    for (int i = 0; i < n; i++) {
        if (pause_ms) {
            struct timespec ts = {0, pause_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        CHECK_OK(fiber_queue_get(h, NULL, 5000));
    }
}

/* The prefetch window: a slow consumer holds at most 64 messages, a fast
 * one at most 512, one whose window was set at most that window. */
TEST(prefetch_window_follows_the_consumer)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf h = {0};
    CHECK_OK(fiber_queue_serialize(q, &h));
    static const struct {
        const char *what;
        int take, pause_ms;
        unsigned set; /* 0: the default, adaptive */
        long bound;
    } cases[] = {
        {"slow consumer (500 a second)", 40, 2, 0, 64},
        {"fast consumer", 3000, 0, 0, 512},
        {"window set to 8", 3000, 0, 8, 8},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const long total = 5000;
        for (int32_t i = 0; i < total; i++)
            CHECK_OK(fiber_queue_put(q, &i, sizeof i, -1));
        CHECK_OK(fiber_queue_flush(q, 10000));
        fiber_queue *a, *b;
        CHECK_OK(fiber_queue_open(&a, h.data, h.len));
        CHECK_OK(fiber_queue_open(&b, h.data, h.len));
        if (cases[c].set)
            CHECK_OK(fiber_queue_set_prefetch(a, cases[c].set));
        take_some(a, cases[c].take, cases[c].pause_ms);
        long held = total - cases[c].take - available_to(b);
        printf("%s: holds %ld after %d gets (bound %ld)\n", cases[c].what,
               held, cases[c].take, cases[c].bound);
        CHECK(held >= 0 && held <= cases[c].bound);
        fiber_queue_free(a); /* what it held goes back */
        CHECK_EQ(available_to(b), held);
        fiber_queue_free(b);
    }
    fiber_buf_free(&h);
    fiber_queue_free(q);
}

/* A lease acknowledged is gone; an acknowledged lease cannot be acked
 * again. */
TEST(acknowledged_lease_is_gone)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    int32_t v = 7;
    CHECK_OK(fiber_queue_put(q, &v, sizeof v, -1));
    uint64_t lease;
    CHECK_OK(fiber_queue_get_lease(q, NULL, &lease, 1000));
    CHECK_OK(fiber_queue_ack(q, lease));
    CHECK_ERR(fiber_queue_ack(q, lease), FIBER_EINVAL);
    size_t n = 1;
    CHECK_OK(fiber_queue_size(q, &n));
    CHECK_EQ(n, 0);
    fiber_queue_free(q);
}

/* ---- lifetime ------------------------------------------------------------ */

/* Creating, using and freeing many queues, and the waiters and stale
 * handles of a freed queue: test_lifetime.c. */

FIBER_TASK(loss_blocked_get)
{
    fiber_queue *q;
    if (fiber_queue_open(&q, arg, len) != 0)
        return 100;
    int rc = fiber_queue_get(q, NULL, -1);
    fiber_queue_free(q);
    return rc == FIBER_ECLOSED ? 0 : 1;
}

/* Freeing the queue wakes a child blocked in get with FIBER_ECLOSED;
 * detaching the creator's handle leaves the queue to the others. */
TEST(free_wakes_waiters_and_detach_keeps_the_queue)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf h = {0};
    CHECK_OK(fiber_queue_serialize(q, &h));
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "loss_blocked_get", h.data, h.len, NULL));
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL); /* let it block */
    fiber_queue_free(q);
    int code = -1;
    CHECK_OK(fiber_process_join(p, 10000));
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);
    fiber_buf_free(&h);

    fiber_queue *d, *user;
    CHECK_OK(fiber_queue_create(&d, 0));
    CHECK_OK(fiber_queue_serialize(d, &h));
    CHECK_OK(fiber_queue_open(&user, h.data, h.len));
    fiber_queue_detach(d);
    CHECK_OK(fiber_queue_put(user, "y", 1, 1000));
    CHECK_OK(fiber_queue_get(user, NULL, 1000));
    fiber_queue_free(user);
    fiber_buf_free(&h);
}

/* Pipelined puts, then the target returns without freeing its handle:
 * the child still delivers every message before it exits. */
FIBER_TASK(loss_put_and_leave)
{
    fiber_queue *q;
    if (fiber_queue_open(&q, arg, len) != 0)
        return 100;
    for (int32_t i = 0; i < 50000; i++)
        if (fiber_queue_put(q, &i, sizeof i, -1) != 0)
            return 101;
    return 0; /* no fiber_queue_free */
}

TEST(pipelined_puts_survive_a_target_that_returns)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf h = {0};
    CHECK_OK(fiber_queue_serialize(q, &h));
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "loss_put_and_leave", h.data, h.len,
                                 NULL));
    int code = -1;
    CHECK_OK(fiber_process_join(p, 30000));
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);
    fiber_buf m = {0};
    for (int32_t i = 0; i < 50000; i++) {
        m.len = 0;
        CHECK_OK(fiber_queue_get(q, &m, 0));
        CHECK_EQ(*(int32_t *)m.data, i);
    }
    CHECK_ERR(fiber_queue_get(q, &m, 0), FIBER_EAGAIN);
    fiber_buf_free(&m);
    fiber_buf_free(&h);
    fiber_queue_free(q);
}

TH_MAIN()
