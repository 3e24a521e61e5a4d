/*
 * test_manager.c -- fiber_manager and its objects across real child
 * processes: dicts, lists and values under concurrent use, locks that
 * exclude and that pass on when their holder dies, rlock ownership,
 * events, semaphores, barriers, conditions, custom methods, asynchronous
 * calls answered out of order, timeouts, a manager killed under its
 * clients, and hostile bytes on its socket.
 *
 * Children get their objects as serialised handles in their argument and
 * report through their exit code: 0..99 their result, or minus a FIBER_E*
 * code (FIBER_EAGAIN -> 20, FIBER_ECLOSED -> 5, ...).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
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

/* A child's argument: two integers and up to four serialised handles. */
struct job {
    int32_t a, b;
    uint32_t len[4];
    unsigned char h[4][320];
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the children's side ------------------------------------------------- */

static struct job job_from(const void *arg, size_t len)
{
    struct job j;
    memset(&j, 0, sizeof j);
    memcpy(&j, arg, len < sizeof j ? len : sizeof j);
    return j;
}

/* Opens handle i of the job; a child that cannot exits with 90 + i. */
static fiber_mobj *child_open(const struct job *j, int i)
{
    fiber_mobj *o;
    if (fiber_mobj_open(&o, j->h[i], j->len[i]) != 0) {
        fprintf(stderr, "child: open handle %d: %s\n", i, fiber_last_error());
        exit(90 + i);
    }
    return o;
}

/* value += 1 a times; b dict keys and b list items of its own. */
FIBER_TASK(add_many)
{
    struct job j = job_from(arg, len);
    fiber_mobj *v = child_open(&j, 0), *d = child_open(&j, 1),
               *l = child_open(&j, 2);
    int pid = (int)getpid();
    for (int i = 0; i < j.a; i++)
        if (fiber_value_add(v, 1, NULL, NULL) != 0)
            return 80;
    for (int i = 0; i < j.b; i++) {
        char key[32];
        int n = snprintf(key, sizeof key, "p%d-%d", pid, i);
        if (fiber_dict_set(d, key, (size_t)n, &i, sizeof i, NULL) != 0 ||
            fiber_list_append(l, &pid, sizeof pid, NULL) != 0)
            return 81;
    }
    fiber_mobj_free(v);
    fiber_mobj_free(d);
    fiber_mobj_free(l);
    return 0;
}

/* value += 1 a times, by compare-and-swap only. */
FIBER_TASK(cas_many)
{
    struct job j = job_from(arg, len);
    fiber_mobj *v = child_open(&j, 0);
    for (int i = 0; i < j.a; i++) {
        int64_t seen = 0, old = 1;
        while (old != seen) {
            if (fiber_value_get(v, &seen, NULL) != 0 ||
                fiber_value_cas(v, seen, seen + 1, &old, NULL) != 0)
                return 80;
        }
    }
    fiber_mobj_free(v);
    return 0;
}

/* a times: under the lock, read the value, dawdle, write it + 1.  Without
 * the lock the read-modify-write pairs of several children would race. */
FIBER_TASK(locked_increment)
{
    struct job j = job_from(arg, len);
    fiber_mobj *lock = child_open(&j, 0), *v = child_open(&j, 1);
    for (int i = 0; i < j.a; i++) {
        int64_t x;
        if (j.b && fiber_lock_acquire(lock, -1, NULL) != 0)
            return 80;
        if (fiber_value_get(v, &x, NULL) != 0)
            return 81;
        usleep(200);
        if (fiber_value_set(v, x + 1, NULL) != 0)
            return 82;
        if (j.b && fiber_lock_release(lock, NULL) != 0)
            return 83;
    }
    fiber_mobj_free(lock);
    fiber_mobj_free(v);
    return 0;
}

/* a times under the lock: read a dict's counter, dawdle, write it + 1;
 * then b += 1 on value 2 if this child's handles are in shared memory.
 * Run by children of both kinds at once (FIBER_MANAGER_SHM=false keeps
 * some on the socket): the lock must exclude across the two paths. */
FIBER_TASK(mixed_increment)
{
    struct job j = job_from(arg, len);
    fiber_mobj *lock = child_open(&j, 0), *d = child_open(&j, 1),
               *shared = child_open(&j, 2);
    for (int i = 0; i < j.a; i++) {
        fiber_buf b = {0};
        int64_t x = 0;
        if (fiber_lock_acquire(lock, -1, NULL) != 0)
            return 80;
        int rc = fiber_dict_get(d, "n", 1, &b, NULL);
        if (rc == 0 && b.len == sizeof x)
            memcpy(&x, b.data, sizeof x);
        else if (rc != FIBER_ENOKEY)
            return 81;
        fiber_buf_free(&b);
        usleep(100);
        x++;
        if (fiber_dict_set(d, "n", 1, &x, sizeof x, NULL) != 0)
            return 82;
        if (fiber_lock_release(lock, NULL) != 0)
            return 83;
    }
    if (fb_mobj_shared(lock) && fb_mobj_shared(d) &&
        fiber_value_add(shared, 1, NULL, NULL) != 0)
        return 84;
    fiber_mobj_free(lock);
    fiber_mobj_free(d);
    fiber_mobj_free(shared);
    return 0;
}

/* Takes the lock, says so through the event, and dies holding it: by
 * SIGKILL (a == 1) or by a plain exit (a == 0). */
FIBER_TASK(hold_and_die)
{
    struct job j = job_from(arg, len);
    fiber_mobj *lock = child_open(&j, 0), *ev = child_open(&j, 1);
    if (fiber_lock_acquire(lock, 10000, NULL) != 0 ||
        fiber_event_set(ev, NULL) != 0)
        return 80;
    sleep_ms(200);
    if (j.a)
        raise(SIGKILL);
    exit(7);
}

/* Acquires the lock or rlock with timeout a; returns minus the status.
 * Exits still holding it on success. */
FIBER_TASK(try_acquire)
{
    struct job j = job_from(arg, len);
    fiber_mobj *l = child_open(&j, 0);
    int rc = fiber_lock_acquire(l, j.a, NULL);
    fiber_mobj_free(l);
    return -rc;
}

/* Waits for the event with timeout a; returns minus the status. */
FIBER_TASK(wait_event)
{
    struct job j = job_from(arg, len);
    fiber_mobj *e = child_open(&j, 0);
    int rc = fiber_event_wait(e, j.a, NULL);
    fiber_mobj_free(e);
    return -rc;
}

/* Inside the semaphore, counts itself in `inside` and records the most
 * seen at once in `most`. */
FIBER_TASK(sem_worker)
{
    struct job j = job_from(arg, len);
    fiber_mobj *s = child_open(&j, 0), *inside = child_open(&j, 1),
               *most = child_open(&j, 2);
    if (fiber_sem_acquire(s, 20000, NULL) != 0)
        return 80;
    int64_t now, seen = 0;
    if (fiber_value_add(inside, 1, &now, NULL) != 0)
        return 81;
    while (seen < now) /* most = max(most, now) */
        if (fiber_value_cas(most, seen, now, &seen, NULL) != 0)
            return 82;
    sleep_ms(60);
    if (fiber_value_add(inside, -1, NULL, NULL) != 0 ||
        fiber_sem_release(s, NULL) != 0)
        return 83;
    fiber_mobj_free(s);
    fiber_mobj_free(inside);
    fiber_mobj_free(most);
    return 0;
}

/* Waits at the barrier (timeout a): its index, or 100 minus the status. */
FIBER_TASK(barrier_child)
{
    struct job j = job_from(arg, len);
    fiber_mobj *b = child_open(&j, 0);
    int index = -1;
    int rc = fiber_barrier_wait(b, j.a, &index, NULL);
    fiber_mobj_free(b);
    return rc ? 100 - rc : index;
}

/* Waits on the condition until the value is nonzero. */
FIBER_TASK(cond_waiter)
{
    struct job j = job_from(arg, len);
    fiber_mobj *c = child_open(&j, 0), *flag = child_open(&j, 1);
    int64_t v = 0;
    if (fiber_cond_acquire(c, 10000, NULL) != 0)
        return 80;
    while (fiber_value_get(flag, &v, NULL) == 0 && v == 0) {
        int rc = fiber_cond_wait(c, 10000, NULL);
        if (rc)
            return 50 - rc;
    }
    int rc = fiber_cond_release(c, NULL);
    fiber_mobj_free(c);
    fiber_mobj_free(flag);
    return rc == 0 ? 0 : 81;
}

/* A custom object's method: counts its calls in an int64 state. */
FIBER_TASK(count_call)
{
    fiber_buf *st;
    int64_t n = 0;
    if (fiber_manager_state(&st) != 0)
        return fiber_task_fail("no state: %s", fiber_last_error());
    if (st->len == sizeof n)
        memcpy(&n, st->data, sizeof n);
    n++;
    st->len = 0;
    if (fiber_buf_append(st, &n, sizeof n) != 0)
        return fiber_task_fail("out of memory");
    return fiber_buf_append(out, &n, sizeof n);
}

FIBER_TASK(read_state)
{
    fiber_buf *st;
    if (fiber_manager_state(&st) != 0)
        return fiber_task_fail("no state");
    return fiber_buf_append(out, st->data, st->len);
}

FIBER_TASK(failing_method)
{
    return fiber_task_fail("no luck with %zu bytes", len);
}

/* Calls count_call a times. */
FIBER_TASK(custom_caller)
{
    struct job j = job_from(arg, len);
    fiber_mobj *o = child_open(&j, 0);
    for (int i = 0; i < j.a; i++)
        if (fiber_custom_call(o, "count_call", NULL, 0, NULL, NULL) != 0)
            return 80;
    fiber_mobj_free(o);
    return 0;
}

/* Says it is ready through the event, then blocks acquiring the lock;
 * returns minus the status. */
FIBER_TASK(block_on_lock)
{
    struct job j = job_from(arg, len);
    fiber_mobj *l = child_open(&j, 0), *ready = child_open(&j, 1);
    if (fiber_event_set(ready, NULL) != 0)
        return 80;
    int rc = fiber_lock_acquire(l, -1, NULL);
    fiber_mobj_free(l);
    fiber_mobj_free(ready);
    return -rc;
}

/* Puts a integers from b on the queue in handle 0. */
FIBER_TASK(queue_put_ints)
{
    struct job j = job_from(arg, len);
    fiber_queue *q;
    if (fiber_queue_open(&q, j.h[0], j.len[0]) != 0)
        return 90;
    for (int32_t i = j.b; i < j.b + j.a; i++)
        if (fiber_queue_put(q, &i, sizeof i, -1) != 0)
            return 80;
    fiber_queue_free(q);
    return 0;
}

/* ---- the master's side --------------------------------------------------- */

static fiber_manager *manager(void)
{
    fiber_manager *m;
    CHECK_OK(fiber_manager_start(&m, NULL));
    return m;
}

static void put_handle(struct job *j, int i, fiber_mobj *o)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_mobj_serialize(o, &b));
    CHECK(b.len <= sizeof j->h[i]);
    memcpy(j->h[i], b.data, b.len);
    j->len[i] = (uint32_t)b.len;
    fiber_buf_free(&b);
}

/* A job with a, b and up to three handles (NULL: none). */
static struct job job_of(int a, int b, fiber_mobj *h0, fiber_mobj *h1,
                         fiber_mobj *h2)
{
    struct job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.b = b;
    fiber_mobj *hs[3] = {h0, h1, h2};
    for (int i = 0; i < 3; i++)
        if (hs[i])
            put_handle(&j, i, hs[i]);
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

static int64_t value_of(fiber_mobj *v)
{
    int64_t x = -1;
    CHECK_OK(fiber_value_get(v, &x, NULL));
    return x;
}

/* Reads a future's int64 result. */
static int64_t future_i64(fiber_future *f)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_future_get(f, &b, 10000));
    CHECK_EQ(b.len, 8);
    int64_t v;
    memcpy(&v, b.data, 8);
    fiber_buf_free(&b);
    fiber_future_free(f);
    return v;
}

TEST(dict_list_value_in_one_process)
{
    fiber_manager *m = manager();
    CHECK(fiber_process_pid(fb_manager_process(m)) != getpid());
    fiber_mobj *d, *l, *v;
    CHECK_OK(fiber_manager_dict(m, "d", &d));
    CHECK_OK(fiber_manager_list(m, "l", &l));
    CHECK_OK(fiber_manager_value(m, "v", 40, &v));
    fiber_buf b = {0};
    CHECK_OK(fiber_dict_set(d, "a", 1, "one", 3, NULL));
    CHECK_OK(fiber_dict_set(d, "b", 1, "two", 3, NULL));
    CHECK_OK(fiber_dict_set(d, "a", 1, "uno", 3, NULL)); /* replaces */
    CHECK_OK(fiber_dict_set(d, "", 0, NULL, 0, NULL));   /* empty is a key */
    CHECK_OK(fiber_dict_get(d, "a", 1, &b, NULL));
    CHECK(b.len == 3 && memcmp(b.data, "uno", 3) == 0);
    CHECK_ERR(fiber_dict_get(d, "zz", 2, &b, NULL), FIBER_ENOKEY);
    size_t n;
    CHECK_OK(fiber_dict_len(d, &n, NULL));
    CHECK_EQ(n, 3);
    CHECK_OK(fiber_dict_del(d, "b", 1, NULL));
    CHECK_ERR(fiber_dict_del(d, "b", 1, NULL), FIBER_ENOKEY);
    b.len = 0;
    CHECK_OK(fiber_dict_keys(d, &b, NULL)); /* "a" then "", in order */
    uint32_t k0, k1;
    CHECK_EQ(b.len, 4 + 1 + 4);
    memcpy(&k0, b.data, 4);
    memcpy(&k1, b.data + 5, 4);
    CHECK(k0 == 1 && b.data[4] == 'a' && k1 == 0);
    /* Many keys: the table grows and keeps them all. */
    for (int i = 0; i < 3000; i++)
        CHECK_OK(fiber_dict_set(d, &i, sizeof i, &i, sizeof i, NULL));
    CHECK_OK(fiber_dict_len(d, &n, NULL));
    CHECK_EQ(n, 3002);
    b.len = 0;
    int k = 1234;
    CHECK_OK(fiber_dict_get(d, &k, sizeof k, &b, NULL));
    CHECK(b.len == sizeof k && memcmp(b.data, &k, sizeof k) == 0);

    for (int i = 0; i < 5; i++)
        CHECK_OK(fiber_list_append(l, &i, sizeof i, NULL));
    b.len = 0;
    CHECK_OK(fiber_list_get(l, -1, &b, NULL));
    CHECK_EQ(*(int *)b.data, 4);
    CHECK_OK(fiber_list_set(l, 0, "x", 1, NULL));
    b.len = 0;
    CHECK_OK(fiber_list_pop(l, 0, &b, NULL));
    CHECK(b.len == 1 && b.data[0] == 'x');
    CHECK_ERR(fiber_list_get(l, 4, &b, NULL), FIBER_ENOKEY);
    CHECK_ERR(fiber_list_get(l, -5, &b, NULL), FIBER_ENOKEY);
    CHECK_ERR(fiber_list_set(l, 9, "y", 1, NULL), FIBER_ENOKEY);
    CHECK_OK(fiber_list_len(l, &n, NULL));
    CHECK_EQ(n, 4);

    int64_t r, old;
    CHECK_EQ(value_of(v), 40);
    CHECK_OK(fiber_value_add(v, 2, &r, NULL));
    CHECK_EQ(r, 42);
    CHECK_OK(fiber_value_cas(v, 41, 0, &old, NULL)); /* no swap */
    CHECK_EQ(old, 42);
    CHECK_OK(fiber_value_cas(v, 42, 7, &old, NULL)); /* swap */
    CHECK_EQ(old, 42);
    CHECK_EQ(value_of(v), 7);
    CHECK_OK(fiber_value_set(v, INT64_MAX, NULL));
    CHECK_OK(fiber_value_add(v, 1, &r, NULL)); /* wraps, no UB */
    CHECK_EQ(r, INT64_MIN);
    fiber_buf_free(&b);
    fiber_mobj_free(d);
    fiber_mobj_free(l);
    fiber_mobj_free(v);
    fiber_manager_free(m);
}

TEST(dict_list_value_from_children)
{
    enum { KIDS = 4, ADDS = 500, KEYS = 50 };
    fiber_manager *m = manager();
    fiber_mobj *v, *d, *l;
    CHECK_OK(fiber_manager_value(m, NULL, 0, &v));
    CHECK_OK(fiber_manager_dict(m, NULL, &d));
    CHECK_OK(fiber_manager_list(m, NULL, &l));
    struct job j = job_of(ADDS, KEYS, v, d, l);
    fiber_process *p[KIDS];
    for (int i = 0; i < KIDS; i++)
        p[i] = start("add_many", &j);
    long pid0 = fiber_process_pid(p[0]);
    for (int i = 0; i < KIDS; i++)
        CHECK_EQ(finish(p[i]), 0);
    CHECK_EQ(value_of(v), KIDS * ADDS);
    size_t n;
    CHECK_OK(fiber_dict_len(d, &n, NULL));
    CHECK_EQ(n, KIDS * KEYS);
    CHECK_OK(fiber_list_len(l, &n, NULL));
    CHECK_EQ(n, KIDS * KEYS);
    char key[32];
    int kn = snprintf(key, sizeof key, "p%ld-%d", pid0, 7);
    fiber_buf b = {0};
    CHECK_OK(fiber_dict_get(d, key, (size_t)kn, &b, NULL));
    CHECK(b.len == sizeof(int) && *(int *)b.data == 7);
    fiber_buf_free(&b);
    fiber_mobj_free(v);
    fiber_mobj_free(d);
    fiber_mobj_free(l);
    fiber_manager_free(m);
}

TEST(value_cas_from_children)
{
    enum { KIDS = 4, EACH = 200 };
    fiber_manager *m = manager();
    fiber_mobj *v;
    CHECK_OK(fiber_manager_value(m, "counter", 0, &v));
    struct job j = job_of(EACH, 0, v, NULL, NULL);
    fiber_process *p[KIDS];
    for (int i = 0; i < KIDS; i++)
        p[i] = start("cas_many", &j);
    for (int i = 0; i < KIDS; i++)
        CHECK_EQ(finish(p[i]), 0);
    CHECK_EQ(value_of(v), KIDS * EACH);
    fiber_mobj_free(v);
    fiber_manager_free(m);
}

static int64_t run_increments(fiber_manager *m, int use_lock)
{
    enum { KIDS = 4, EACH = 60 };
    fiber_mobj *lock, *v;
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    CHECK_OK(fiber_manager_value(m, NULL, 0, &v));
    struct job j = job_of(EACH, use_lock, lock, v, NULL);
    fiber_process *p[KIDS];
    for (int i = 0; i < KIDS; i++)
        p[i] = start("locked_increment", &j);
    for (int i = 0; i < KIDS; i++)
        CHECK_EQ(finish(p[i]), 0);
    int64_t total = value_of(v);
    fiber_mobj_free(lock);
    fiber_mobj_free(v);
    return total;
}

TEST(lock_mutual_exclusion)
{
    fiber_manager *m = manager();
    int64_t racy = run_increments(m, 0);
    /* Not asserted (a scheduler could serialise them), only shown: the
     * section really races without the lock. */
    fprintf(stderr, "without the lock: %lld of 240 increments survived\n",
            (long long)racy);
    CHECK_EQ(run_increments(m, 1), 240);
    fiber_manager_free(m);
}

/* Local children make their calls in shared memory, children with
 * manager_shm off over the socket, all on one lock and one dict. */
TEST(shared_memory_and_socket_clients_share_a_lock)
{
    enum { KIDS = 4, EACH = 100 };
    fiber_manager *m = manager();
    fiber_mobj *lock, *d, *shared;
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    CHECK_OK(fiber_manager_dict(m, NULL, &d));
    CHECK_OK(fiber_manager_value(m, NULL, 0, &shared));
    CHECK(fb_mobj_shared(lock) && fb_mobj_shared(d));
    struct job j = job_of(EACH, 0, lock, d, shared);
    fiber_process *p[KIDS];
    const char *const socket_only[] = {"FIBER_MANAGER_SHM=false", NULL};
    fiber_job_opts opts = {.env = socket_only};
    for (int i = 0; i < KIDS; i++)
        CHECK_OK(fiber_process_start(&p[i], "mixed_increment", &j, sizeof j,
                                     i % 2 ? &opts : NULL));
    /* The parent takes part too, in shared memory. */
    for (int i = 0; i < EACH; i++) {
        fiber_buf b = {0};
        int64_t x = 0;
        CHECK_OK(fiber_lock_acquire(lock, -1, NULL));
        if (fiber_dict_get(d, "n", 1, &b, NULL) == 0)
            memcpy(&x, b.data, sizeof x);
        fiber_buf_free(&b);
        x++;
        CHECK_OK(fiber_dict_set(d, "n", 1, &x, sizeof x, NULL));
        CHECK_OK(fiber_lock_release(lock, NULL));
    }
    for (int i = 0; i < KIDS; i++)
        CHECK_EQ(finish(p[i]), 0);
    fiber_buf b = {0};
    int64_t n = 0;
    CHECK_OK(fiber_dict_get(d, "n", 1, &b, NULL));
    CHECK_EQ(b.len, sizeof n);
    memcpy(&n, b.data, sizeof n);
    fiber_buf_free(&b);
    CHECK_EQ(n, (KIDS + 1) * EACH);
    CHECK_EQ(value_of(shared), KIDS / 2); /* the others on the socket */
    fiber_mobj_free(lock);
    fiber_mobj_free(d);
    fiber_mobj_free(shared);
    fiber_manager_free(m);
}

/* The calls of a local client are its own: with the manager's process
 * stopped (SIGSTOP), a dict, a value and a lock still answer, with the
 * manager's errors and texts, and a future is resolved at once. */
TEST(local_calls_need_no_round_trip)
{
    fiber_manager *m = manager();
    fiber_mobj *d, *v, *lock;
    CHECK_OK(fiber_manager_dict(m, NULL, &d));
    CHECK_OK(fiber_manager_value(m, NULL, 1, &v));
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    /* Mapped at a handle's first call, which asks the manager. */
    CHECK(fb_mobj_shared(d) && fb_mobj_shared(v) && fb_mobj_shared(lock));
    long pid = fiber_process_pid(fb_manager_process(m));
    CHECK(pid > 0);
    CHECK(kill((pid_t)pid, SIGSTOP) == 0);
    int64_t x = 0;
    fiber_buf b = {0};
    CHECK_OK(fiber_dict_set(d, "k", 1, "val", 3, NULL));
    CHECK_OK(fiber_dict_get(d, "k", 1, &b, NULL));
    CHECK_EQ(b.len, 3);
    CHECK_OK(fiber_value_add(v, 41, &x, NULL));
    CHECK_EQ(x, 42);
    CHECK_OK(fiber_lock_acquire(lock, 0, NULL));
    CHECK_ERR(fiber_lock_acquire(lock, 0, NULL), FIBER_EAGAIN);
    CHECK_CONTAINS(fiber_last_error(), "is held");
    CHECK_OK(fiber_lock_release(lock, NULL));
    CHECK_ERR(fiber_lock_release(lock, NULL), FIBER_ESTATE);
    CHECK_CONTAINS(fiber_last_error(), "is not held");
    CHECK_ERR(fiber_dict_get(d, "nope", 4, &b, NULL), FIBER_ENOKEY);
    /* A future of a local call is resolved at once. */
    fiber_future *f;
    CHECK_OK(fiber_value_get(v, NULL, &f));
    CHECK(fiber_future_ready(f) == 1);
    fiber_buf out = {0};
    CHECK_OK(fiber_future_get(f, &out, 0));
    CHECK_EQ(out.len, 8);
    memcpy(&x, out.data, 8);
    CHECK_EQ(x, 42);
    fiber_future_free(f);
    fiber_buf_free(&out);
    CHECK(kill((pid_t)pid, SIGCONT) == 0);
    fiber_buf_free(&b);
    fiber_mobj_free(d);
    fiber_mobj_free(v);
    fiber_mobj_free(lock);
    fiber_manager_free(m);
}

static void holder_dies(fiber_manager *m, int by_sigkill)
{
    fiber_mobj *lock, *ev;
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    CHECK_OK(fiber_manager_event(m, NULL, &ev));
    struct job j = job_of(by_sigkill, 0, lock, ev, NULL);
    fiber_process *p = start("hold_and_die", &j);
    CHECK_OK(fiber_event_wait(ev, 20000, NULL)); /* it holds the lock */
    CHECK_ERR(fiber_lock_acquire(lock, 0, NULL), FIBER_EAGAIN);
    uint64_t t0 = fb_now_ms();
    CHECK_OK(fiber_lock_acquire(lock, 10000, NULL)); /* waits for its death */
    CHECK(fb_now_ms() - t0 < 5000);
    CHECK_EQ(finish(p), by_sigkill ? -SIGKILL : 7);
    CHECK_OK(fiber_lock_release(lock, NULL));
    fiber_mobj_free(lock);
    fiber_mobj_free(ev);
}

TEST(lock_released_when_holder_dies)
{
    fiber_manager *m = manager();
    holder_dies(m, 1);
    holder_dies(m, 0);
    /* And the manager serves on. */
    fiber_mobj *v;
    CHECK_OK(fiber_manager_value(m, NULL, 5, &v));
    CHECK_EQ(value_of(v), 5);
    fiber_mobj_free(v);
    fiber_manager_free(m);
}

struct thread_try {
    fiber_mobj *l;
    int acquire_rc, release_rc;
};

static void *other_thread(void *arg)
{
    struct thread_try *t = arg;
    t->acquire_rc = fiber_lock_acquire(t->l, 0, NULL);
    t->release_rc = fiber_lock_release(t->l, NULL);
    return NULL;
}

TEST(rlock_recursion_and_owners)
{
    fiber_manager *m = manager();
    fiber_mobj *r;
    CHECK_OK(fiber_manager_rlock(m, "r", &r));
    for (int i = 0; i < 3; i++)
        CHECK_OK(fiber_lock_acquire(r, 0, NULL));
    /* Another process and another thread of this one are other owners. */
    struct job j = job_of(0, 0, r, NULL, NULL);
    CHECK_EQ(finish(start("try_acquire", &j)), -FIBER_EAGAIN);
    struct thread_try t = {r, 0, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, other_thread, &t) == 0);
    pthread_join(th, NULL);
    CHECK_ERR(t.acquire_rc, FIBER_EAGAIN);
    CHECK_ERR(t.release_rc, FIBER_ESTATE);
    for (int i = 0; i < 3; i++)
        CHECK_OK(fiber_lock_release(r, NULL));
    CHECK_ERR(fiber_lock_release(r, NULL), FIBER_ESTATE);
    /* A child takes it and exits holding it: it comes back. */
    CHECK_EQ(finish(start("try_acquire", &j)), 0);
    CHECK_OK(fiber_lock_acquire(r, 10000, NULL));
    CHECK_OK(fiber_lock_release(r, NULL));
    fiber_mobj_free(r);
    fiber_manager_free(m);
}

/* The manager's side of an rlock (remote clients, manager_shm off):
 * its holder goes one level deeper at once even while another client's
 * acquire is parked behind it, and the parked one gets it when the
 * holder lets go entirely. */
TEST(rlock_reentry_over_the_socket_while_another_waits)
{
    fiber_manager *m = manager();
    fiber_mobj *r;
    CHECK_OK(fiber_config_set("manager_shm", "false"));
    CHECK_OK(fiber_manager_rlock(m, "r", &r));
    CHECK(!fb_mobj_shared(r)); /* decided at its first call */
    CHECK_OK(fiber_config_set("manager_shm", "true"));
    CHECK_OK(fiber_lock_acquire(r, 0, NULL));
    const char *const socket_only[] = {"FIBER_MANAGER_SHM=false", NULL};
    fiber_job_opts opts = {.env = socket_only};
    struct job j = job_of(20000, 0, r, NULL, NULL);
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "try_acquire", &j, sizeof j, &opts));
    sleep_ms(500); /* its acquire is parked in the manager by now */
    CHECK_OK(fiber_lock_acquire(r, 0, NULL)); /* depth 2, not queued */
    CHECK_OK(fiber_lock_release(r, NULL));
    CHECK_OK(fiber_lock_release(r, NULL)); /* free: the child's turn */
    CHECK_EQ(finish(p), 0);
    fiber_mobj_free(r);
    fiber_manager_free(m);
}

TEST(event_across_processes)
{
    fiber_manager *m = manager();
    fiber_mobj *e;
    CHECK_OK(fiber_manager_event(m, NULL, &e));
    int set = -1;
    CHECK_OK(fiber_event_is_set(e, &set, NULL));
    CHECK_EQ(set, 0);
    struct job quick = job_of(100, 0, e, NULL, NULL);
    CHECK_EQ(finish(start("wait_event", &quick)), -FIBER_ETIMEDOUT);
    struct job slow = job_of(20000, 0, e, NULL, NULL);
    fiber_process *p1 = start("wait_event", &slow);
    fiber_process *p2 = start("wait_event", &slow);
    sleep_ms(300);
    CHECK_EQ(fiber_process_is_alive(p1), 1);
    CHECK_OK(fiber_event_set(e, NULL));
    CHECK_EQ(finish(p1), 0);
    CHECK_EQ(finish(p2), 0);
    CHECK_OK(fiber_event_is_set(e, &set, NULL));
    CHECK_EQ(set, 1);
    CHECK_OK(fiber_event_wait(e, 0, NULL)); /* set: no wait */
    CHECK_OK(fiber_event_clear(e, NULL));
    CHECK_ERR(fiber_event_wait(e, 0, NULL), FIBER_EAGAIN);
    fiber_mobj_free(e);
    fiber_manager_free(m);
}

TEST(semaphore_counting)
{
    enum { KIDS = 5 };
    fiber_manager *m = manager();
    fiber_mobj *s, *inside, *most, *one;
    CHECK_OK(fiber_manager_semaphore(m, NULL, 2, &s));
    CHECK_OK(fiber_manager_value(m, NULL, 0, &inside));
    CHECK_OK(fiber_manager_value(m, NULL, 0, &most));
    struct job j = job_of(0, 0, s, inside, most);
    fiber_process *p[KIDS];
    for (int i = 0; i < KIDS; i++)
        p[i] = start("sem_worker", &j);
    for (int i = 0; i < KIDS; i++)
        CHECK_EQ(finish(p[i]), 0);
    CHECK_EQ(value_of(inside), 0);
    int64_t peak = value_of(most);
    CHECK(peak >= 1 && peak <= 2);
    /* Counting in one process. */
    CHECK_OK(fiber_manager_semaphore(m, NULL, 1, &one));
    CHECK_OK(fiber_sem_acquire(one, 0, NULL));
    CHECK_ERR(fiber_sem_acquire(one, 0, NULL), FIBER_EAGAIN);
    CHECK_OK(fiber_sem_release(one, NULL));
    CHECK_OK(fiber_sem_release(one, NULL)); /* no upper bound */
    CHECK_OK(fiber_sem_acquire(one, 0, NULL));
    CHECK_OK(fiber_sem_acquire(one, 0, NULL));
    CHECK_ERR(fiber_sem_acquire(one, 0, NULL), FIBER_EAGAIN);
    CHECK_ERR(fiber_manager_semaphore(m, NULL, -1, &one), FIBER_EINVAL);
    fiber_mobj_free(s);
    fiber_mobj_free(inside);
    fiber_mobj_free(most);
    fiber_mobj_free(one);
    fiber_manager_free(m);
}

TEST(barrier_of_three_children)
{
    fiber_manager *m = manager();
    fiber_mobj *b;
    CHECK_OK(fiber_manager_barrier(m, NULL, 3, &b));
    struct job j = job_of(20000, 0, b, NULL, NULL);
    fiber_process *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = start("barrier_child", &j);
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        int index = finish(p[i]);
        CHECK(index >= 0 && index < 3);
        seen |= 1 << index;
    }
    CHECK_EQ(seen, 7); /* 0, 1 and 2, each once */
    /* Used again: a barrier resets itself after each round. */
    for (int i = 0; i < 2; i++)
        p[i] = start("barrier_child", &j);
    int index = -1;
    CHECK_OK(fiber_barrier_wait(b, 20000, &index, NULL));
    CHECK(index >= 0 && index < 3);
    CHECK_EQ(finish(p[0]) + finish(p[1]) + index, 0 + 1 + 2);
    fiber_mobj_free(b);
    fiber_manager_free(m);
}

TEST(barrier_timeout_breaks_it)
{
    fiber_manager *m = manager();
    fiber_mobj *b;
    CHECK_OK(fiber_manager_barrier(m, NULL, 3, &b));
    struct job j = job_of(-1, 0, b, NULL, NULL);
    fiber_process *p = start("barrier_child", &j);
    sleep_ms(300); /* let it wait */
    CHECK_ERR(fiber_barrier_wait(b, 200, NULL, NULL), FIBER_ETIMEDOUT);
    CHECK_EQ(finish(p), 100 - FIBER_ESTATE); /* broken under it */
    CHECK_ERR(fiber_barrier_wait(b, 1000, NULL, NULL), FIBER_ESTATE);
    CHECK_OK(fiber_barrier_reset(b, NULL));
    CHECK_ERR(fiber_barrier_wait(b, 0, NULL, NULL), FIBER_EAGAIN);
    CHECK_OK(fiber_barrier_reset(b, NULL));
    fiber_mobj *one;
    CHECK_OK(fiber_manager_barrier(m, NULL, 1, &one));
    int index = -1;
    CHECK_OK(fiber_barrier_wait(one, 0, &index, NULL));
    CHECK_EQ(index, 0);
    fiber_mobj_free(b);
    fiber_mobj_free(one);
    fiber_manager_free(m);
}

TEST(condition_notify)
{
    fiber_manager *m = manager();
    fiber_mobj *c, *flag;
    CHECK_OK(fiber_manager_condition(m, NULL, &c));
    CHECK_OK(fiber_manager_value(m, NULL, 0, &flag));
    CHECK_ERR(fiber_cond_wait(c, 0, NULL), FIBER_ESTATE);
    CHECK_ERR(fiber_cond_notify(c, 1, NULL), FIBER_ESTATE);
    struct job j = job_of(0, 0, c, flag, NULL);
    fiber_process *p1 = start("cond_waiter", &j);
    fiber_process *p2 = start("cond_waiter", &j);
    sleep_ms(400);
    CHECK_OK(fiber_cond_acquire(c, 10000, NULL));
    CHECK_OK(fiber_cond_acquire(c, 0, NULL)); /* its lock is recursive */
    CHECK_OK(fiber_value_set(flag, 1, NULL));
    CHECK_OK(fiber_cond_notify_all(c, NULL));
    CHECK_OK(fiber_cond_release(c, NULL));
    CHECK_OK(fiber_cond_release(c, NULL));
    CHECK_EQ(finish(p1), 0);
    CHECK_EQ(finish(p2), 0);
    fiber_mobj_free(c);
    fiber_mobj_free(flag);
    fiber_manager_free(m);
}

TEST(condition_wait_returns_holding_the_lock)
{
    fiber_manager *m = manager();
    fiber_mobj *c;
    CHECK_OK(fiber_manager_condition(m, NULL, &c));
    CHECK_OK(fiber_cond_acquire(c, 0, NULL));
    CHECK_OK(fiber_cond_acquire(c, 0, NULL));
    uint64_t t0 = fb_now_ms();
    CHECK_ERR(fiber_cond_wait(c, 150, NULL), FIBER_ETIMEDOUT);
    CHECK(fb_now_ms() - t0 >= 140);
    CHECK_ERR(fiber_cond_wait(c, 0, NULL), FIBER_EAGAIN);
    /* Held again, at its former depth of 2. */
    CHECK_OK(fiber_cond_release(c, NULL));
    CHECK_OK(fiber_cond_release(c, NULL));
    CHECK_ERR(fiber_cond_release(c, NULL), FIBER_ESTATE);
    /* notify(1) wakes one waiter, which returns after the release. */
    fiber_future *w1, *w2;
    CHECK_OK(fiber_cond_acquire(c, 0, NULL));
    CHECK_OK(fiber_cond_wait(c, 10000, &w1));
    sleep_ms(100);
    /* The same thread again: its lock was released by the wait. */
    CHECK_OK(fiber_cond_acquire(c, 1000, NULL));
    CHECK_OK(fiber_cond_notify(c, 1, NULL));
    sleep_ms(100);
    CHECK_EQ(fiber_future_ready(w1), 0); /* notified, the lock still ours */
    CHECK_OK(fiber_cond_release(c, NULL));
    CHECK_OK(fiber_future_get(w1, NULL, 5000));
    fiber_future_free(w1);
    CHECK_OK(fiber_cond_wait(c, 300, &w2));
    CHECK_OK(fiber_cond_acquire(c, 1000, NULL));
    CHECK_OK(fiber_cond_notify(c, 0, NULL)); /* wakes none */
    CHECK_OK(fiber_cond_release(c, NULL));
    CHECK_ERR(fiber_future_get(w2, NULL, 5000), FIBER_ETIMEDOUT);
    fiber_future_free(w2);
    CHECK_OK(fiber_cond_release(c, NULL)); /* held again after the wait */
    fiber_mobj_free(c);
    fiber_manager_free(m);
}

TEST(custom_method_counts_calls)
{
    enum { KIDS = 3, EACH = 100 };
    fiber_manager *m = manager();
    fiber_mobj *o;
    int64_t zero = 0;
    CHECK_OK(fiber_manager_custom(m, "counter", &zero, sizeof zero, &o));
    struct job j = job_of(EACH, 0, o, NULL, NULL);
    fiber_process *p[KIDS];
    for (int i = 0; i < KIDS; i++)
        p[i] = start("custom_caller", &j);
    for (int i = 0; i < KIDS; i++)
        CHECK_EQ(finish(p[i]), 0);
    fiber_buf b = {0};
    CHECK_OK(fiber_custom_call(o, "read_state", NULL, 0, &b, NULL));
    CHECK_EQ(b.len, 8);
    int64_t n;
    memcpy(&n, b.data, 8);
    CHECK_EQ(n, KIDS * EACH);
    b.len = 0;
    CHECK_OK(fiber_custom_call(o, "count_call", NULL, 0, &b, NULL));
    memcpy(&n, b.data, 8);
    CHECK_EQ(n, KIDS * EACH + 1);
    CHECK_ERR(fiber_custom_call(o, "failing_method", "abc", 3, &b, NULL),
              FIBER_ETASK);
    CHECK_CONTAINS(fiber_last_error(), "no luck with 3 bytes");
    CHECK_ERR(fiber_custom_call(o, "no_such_task", NULL, 0, &b, NULL),
              FIBER_ENOTASK);
    fiber_buf *st;
    CHECK_ERR(fiber_manager_state(&st), FIBER_ESTATE); /* not a method */
    /* Opening it again by name keeps its state. */
    fiber_mobj *again;
    CHECK_OK(fiber_manager_custom(m, "counter", NULL, 0, &again));
    fiber_future *f;
    CHECK_OK(fiber_custom_call(again, "count_call", NULL, 0, NULL, &f));
    CHECK_EQ(future_i64(f), KIDS * EACH + 2);
    fiber_buf_free(&b);
    fiber_mobj_free(o);
    fiber_mobj_free(again);
    fiber_manager_free(m);
}

TEST(async_calls_answered_out_of_order)
{
    fiber_manager *m = manager();
    fiber_mobj *lock, *v, *d, *e;
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    CHECK_OK(fiber_manager_value(m, NULL, 10, &v));
    CHECK_OK(fiber_manager_dict(m, NULL, &d));
    CHECK_OK(fiber_manager_event(m, NULL, &e));
    CHECK_OK(fiber_lock_acquire(lock, 0, NULL));
    /* Sent first, answered last: it waits for the release below. */
    fiber_future *acq, *adds[5], *set, *get, *len, *ev;
    CHECK_OK(fiber_lock_acquire(lock, -1, &acq));
    CHECK_OK(fiber_event_wait(e, 150, &ev));
    for (int i = 0; i < 5; i++)
        CHECK_OK(fiber_value_add(v, 1, NULL, &adds[i]));
    CHECK_OK(fiber_dict_set(d, "k", 1, "v", 1, &set));
    CHECK_OK(fiber_dict_get(d, "k", 1, NULL, &get));
    CHECK_OK(fiber_dict_len(d, NULL, &len));
    /* Taken in reverse order of sending. */
    CHECK_EQ(future_i64(len), 1);
    fiber_buf b = {0};
    CHECK_OK(fiber_future_get(get, &b, 10000));
    CHECK(b.len == 1 && b.data[0] == 'v');
    fiber_future_free(get);
    CHECK_OK(fiber_future_get(set, &b, 10000));
    fiber_future_free(set);
    int64_t sum = 0;
    for (int i = 4; i >= 0; i--)
        sum += future_i64(adds[i]);
    CHECK_EQ(sum, 11 + 12 + 13 + 14 + 15);
    CHECK_ERR(fiber_future_get(ev, NULL, 10000), FIBER_ETIMEDOUT);
    fiber_future_free(ev);
    CHECK_EQ(fiber_future_ready(acq), 0);
    CHECK_ERR(fiber_future_get(acq, NULL, 0), FIBER_ETIMEDOUT);
    CHECK_OK(fiber_lock_release(lock, NULL));
    CHECK_OK(fiber_future_get(acq, NULL, 10000));
    CHECK_EQ(fiber_future_successful(acq), 1);
    fiber_future_free(acq);
    CHECK_ERR(fiber_lock_acquire(lock, 0, NULL), FIBER_EAGAIN); /* taken */
    CHECK_OK(fiber_lock_release(lock, NULL));
    /* A failure travels through the future too. */
    fiber_future *miss;
    CHECK_OK(fiber_dict_get(d, "nope", 4, NULL, &miss));
    CHECK_ERR(fiber_future_get(miss, &b, 10000), FIBER_ENOKEY);
    fiber_future_free(miss);
    fiber_buf_free(&b);
    fiber_mobj_free(lock);
    fiber_mobj_free(v);
    fiber_mobj_free(d);
    fiber_mobj_free(e);
    fiber_manager_free(m);
}

static void check_timed_out(int rc, uint64_t t0)
{
    uint64_t waited = fb_now_ms() - t0;
    CHECK_ERR(rc, FIBER_ETIMEDOUT);
    CHECK(waited >= 140 && waited < 3000);
}

TEST(timeouts)
{
    fiber_manager *m = manager();
    fiber_mobj *lock, *e, *s;
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    CHECK_OK(fiber_manager_event(m, NULL, &e));
    CHECK_OK(fiber_manager_semaphore(m, NULL, 0, &s));
    CHECK_OK(fiber_lock_acquire(lock, 0, NULL));
    CHECK_ERR(fiber_lock_acquire(lock, 0, NULL), FIBER_EAGAIN);
    uint64_t t0 = fb_now_ms();
    check_timed_out(fiber_lock_acquire(lock, 150, NULL), t0);
    t0 = fb_now_ms();
    check_timed_out(fiber_event_wait(e, 150, NULL), t0);
    t0 = fb_now_ms();
    check_timed_out(fiber_sem_acquire(s, 150, NULL), t0);
    CHECK_ERR(fiber_sem_acquire(s, 0, NULL), FIBER_EAGAIN);
    /* A timed-out acquire left no trace: the lock is still ours alone. */
    CHECK_OK(fiber_lock_release(lock, NULL));
    CHECK_ERR(fiber_lock_release(lock, NULL), FIBER_ESTATE);
    CHECK_OK(fiber_lock_acquire(lock, 0, NULL));
    fiber_mobj_free(lock);
    fiber_mobj_free(e);
    fiber_mobj_free(s);
    fiber_manager_free(m);
}

struct blocked_call {
    fiber_mobj *e;
    int rc;
    uint64_t returned_ms;
};

static void *wait_forever(void *arg)
{
    struct blocked_call *b = arg;
    b->rc = fiber_event_wait(b->e, -1, NULL);
    b->returned_ms = fb_now_ms();
    return NULL;
}

TEST(manager_killed_fails_every_call)
{
    fiber_manager *m = manager();
    fiber_mobj *lock, *ready, *e, *v;
    CHECK_OK(fiber_manager_lock(m, NULL, &lock));
    CHECK_OK(fiber_manager_event(m, NULL, &ready));
    CHECK_OK(fiber_manager_event(m, NULL, &e));
    CHECK_OK(fiber_manager_value(m, NULL, 0, &v));
    CHECK_OK(fiber_lock_acquire(lock, 0, NULL));
    /* Blocked when the manager dies: a child, a thread, and a future. */
    struct job j = job_of(0, 0, lock, ready, NULL);
    fiber_process *child = start("block_on_lock", &j);
    CHECK_OK(fiber_event_wait(ready, 20000, NULL));
    struct blocked_call bc = {e, 0, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, wait_forever, &bc) == 0);
    fiber_future *f;
    CHECK_OK(fiber_lock_acquire(lock, -1, &f));
    sleep_ms(300);
    fiber_process *mp = fb_manager_process(m);
    uint64_t t0 = fb_now_ms();
    long pid = fiber_process_pid(mp);
    CHECK(pid > 0); /* kill(-1) would signal every process we may reach */
    CHECK(kill((pid_t)pid, SIGKILL) == 0);
    pthread_join(th, NULL);
    CHECK_ERR(bc.rc, FIBER_ECLOSED);
    CHECK(bc.returned_ms - t0 < 3000);
    CHECK_ERR(fiber_future_get(f, NULL, 5000), FIBER_ECLOSED);
    fiber_future_free(f);
    CHECK_EQ(finish(child), -FIBER_ECLOSED);
    CHECK_ERR(fiber_value_add(v, 1, NULL, NULL), FIBER_ECLOSED);
    /* Known gone: an asynchronous call fails at once, with no future. */
    f = NULL;
    CHECK_ERR(fiber_value_get(v, NULL, &f), FIBER_ECLOSED);
    CHECK(f == NULL);
    CHECK(fb_now_ms() - t0 < 5000);
    CHECK_OK(fiber_process_join(mp, 10000));
    fiber_mobj *late;
    CHECK_ERR(fiber_manager_dict(m, NULL, &late), FIBER_ECLOSED);
    fiber_mobj_free(lock);
    fiber_mobj_free(ready);
    fiber_mobj_free(e);
    fiber_mobj_free(v);
    fiber_manager_free(m);
}

/* Reads until the peer closes (1) or 3 s pass (0). */
static int dropped(int fd)
{
    char buf[256];
    for (int k = 0; k < 300; k++) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN))
            return 1;
        sleep_ms(10);
    }
    return 0;
}

TEST(hostile_bytes_on_the_manager_socket)
{
    fiber_manager *m = manager();
    const char *addr = fb_manager_address(m);
    int junk;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &junk));
    const char http[] = "GET / HTTP/1.1\r\nHost: fiber\r\n\r\n";
    send(junk, http, sizeof http - 1, MSG_NOSIGNAL);
    CHECK(dropped(junk));
    close(junk);
    /* A well-formed HELLO with the wrong token gets REJECT. */
    int fd;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fd));
    struct fb_conn c;
    fb_conn_init(&c, fd, 1 << 20);
    /* Over encrypted TCP (docker) the link itself uses the run's key: the
     * token inside HELLO is what is wrong. */
    CHECK_OK(fb_conn_secure_for(&c, addr, FB_SEC_CLIENT, fb_rt_token()));
    const char *bid = fb_rt_build_id();
    struct fb_msg_hello h = {.build_id = bid,
                             .build_id_len = (uint8_t)strlen(bid),
                             .name = "intruder",
                             .name_len = 8};
    memset(h.token, 0x5a, sizeof h.token);
    CHECK_OK(fb_wire_put_hello(fb_conn_out(&c), &h));
    CHECK_OK(fb_conn_flush_wait(&c, fb_deadline_ms(5000)));
    struct fb_wire_hdr hdr;
    const uint8_t *p;
    CHECK_EQ(fb_conn_recv_wait(&c, &hdr, &p, fb_deadline_ms(5000)), 1);
    CHECK_EQ(hdr.type, FB_MSG_REJECT);
    CHECK(dropped(fb_conn_fd(&c)));
    fb_conn_close(&c);
    /* The manager still serves, here and in a child. */
    fiber_mobj *v, *d, *l;
    CHECK_OK(fiber_manager_value(m, NULL, 0, &v));
    CHECK_OK(fiber_manager_dict(m, NULL, &d));
    CHECK_OK(fiber_manager_list(m, NULL, &l));
    struct job j = job_of(10, 2, v, d, l);
    CHECK_EQ(finish(start("add_many", &j)), 0);
    CHECK_EQ(value_of(v), 10);
    fiber_mobj_free(v);
    fiber_mobj_free(d);
    fiber_mobj_free(l);
    fiber_manager_free(m);
}

TEST(queue_in_a_manager)
{
    fiber_manager *m = manager();
    fiber_queue *q;
    CHECK_OK(fiber_manager_queue(m, "jobs", 8, &q));
    struct job j;
    memset(&j, 0, sizeof j);
    j.a = 300;
    j.b = 1000;
    fiber_buf b = {0};
    CHECK_OK(fiber_queue_serialize(q, &b));
    memcpy(j.h[0], b.data, b.len);
    j.len[0] = (uint32_t)b.len;
    fiber_process *p = start("queue_put_ints", &j);
    for (int i = 0; i < 300; i++) {
        b.len = 0;
        CHECK_OK(fiber_queue_get(q, &b, 20000));
        CHECK_EQ(*(int32_t *)b.data, 1000 + i);
    }
    CHECK_EQ(finish(p), 0);
    fiber_buf_free(&b);
    fiber_queue_free(q);
    fiber_manager_free(m);
}

TEST(handles_and_kinds)
{
    fiber_manager *m = manager();
    fiber_mobj *d, *l, *again, *opened;
    CHECK_OK(fiber_manager_dict(m, "shared", &d));
    CHECK_ERR(fiber_manager_lock(m, "shared", &l), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "is a dict");
    CHECK_OK(fiber_manager_dict(m, "shared", &again)); /* the same object */
    CHECK_OK(fiber_dict_set(d, "k", 1, "v", 1, NULL));
    size_t n = 0;
    CHECK_OK(fiber_dict_len(again, &n, NULL));
    CHECK_EQ(n, 1);
    CHECK_ERR(fiber_lock_acquire(d, 0, NULL), FIBER_EINVAL);
    CHECK_ERR(fiber_value_add(d, 1, NULL, NULL), FIBER_EINVAL);
    fiber_buf b = {0};
    CHECK_OK(fiber_mobj_serialize(d, &b));
    CHECK_OK(fiber_mobj_open(&opened, b.data, b.len));
    CHECK_OK(fiber_dict_len(opened, &n, NULL));
    CHECK_EQ(n, 1);
    b.data[4] = FB_HANDLE_QUEUE; /* another kind of handle */
    CHECK_ERR(fiber_mobj_open(&l, b.data, b.len), FIBER_EINVAL);
    b.data[4] = FB_HANDLE_MOBJ;
    b.data[b.len - 1] = 0x7f; /* no such object kind */
    CHECK_ERR(fiber_mobj_open(&l, b.data, b.len), FIBER_EINVAL);
    CHECK_ERR(fiber_mobj_open(&l, "junk", 4), FIBER_EINVAL);
    char fake[64] = {0};
    CHECK_ERR(fiber_dict_len((fiber_mobj *)fake, &n, NULL), FIBER_EINVAL);
    CHECK_ERR(fiber_manager_dict((fiber_manager *)fake, NULL, &l),
              FIBER_EINVAL);
    CHECK_ERR(fiber_manager_barrier(m, NULL, 0, &l), FIBER_EINVAL);
    fiber_mobj_free(NULL);
    fiber_manager_free(NULL);
    fiber_buf_free(&b);
    fiber_mobj_free(d);
    fiber_mobj_free(again);
    fiber_mobj_free(opened);
    fiber_manager_free(m);
    /* Freed with its manager: the handles say so. */
}

/* The kinds also run on the master's own object server, which (unlike a
 * manager, killed at the end) stops and frees every object at shutdown:
 * under the sanitizers this checks that each kind frees what it holds,
 * parked requests included. */
TEST(kinds_free_their_state_at_shutdown)
{
    struct fb_objsrv *s;
    struct fb_oclient *c;
    CHECK_OK(fb_master_objsrv(&s));
    const char *addr = fb_objsrv_address(s);
    CHECK_OK(fb_oclient_get(addr, fb_rt_token(), &c));
    static const char *const kinds[] = {"dict", "list", "value",
                                        "lock", "rlock", "event",
                                        "semaphore", "condition", "custom"};
    fiber_mobj *o[9];
    int64_t zero = 0;
    uint32_t parties = 2;
    for (int i = 0; i < 9; i++) {
        fiber_iov p = {&zero, 8};
        CHECK_OK(fb_mobj_create(&o[i], c, addr, fb_rt_token(), kinds[i],
                                kinds[i], &p, 1));
    }
    fiber_mobj *b;
    fiber_iov bp = {&parties, 4};
    CHECK_OK(fb_mobj_create(&b, c, addr, fb_rt_token(), "barrier", "b", &bp,
                            1));
    CHECK_ERR(fb_mobj_create(&b, c, addr, fb_rt_token(), "nonesuch", "n",
                             NULL, 0), FIBER_EINVAL);
    CHECK_OK(fiber_dict_set(o[0], "k", 1, "v", 1, NULL));
    CHECK_OK(fiber_list_append(o[1], "x", 1, NULL));
    CHECK_OK(fiber_lock_acquire(o[3], 0, NULL));
    CHECK_OK(fiber_lock_acquire(o[4], 0, NULL));
    CHECK_OK(fiber_cond_acquire(o[7], 0, NULL));
    /* Requests left parked when the server stops. */
    fiber_future *f[5];
    CHECK_OK(fiber_lock_acquire(o[3], -1, &f[0]));
    CHECK_OK(fiber_event_wait(o[5], -1, &f[1]));
    CHECK_OK(fiber_sem_acquire(o[6], -1, &f[2]));
    CHECK_OK(fiber_cond_wait(o[7], -1, &f[3]));
    CHECK_OK(fiber_barrier_wait(b, -1, NULL, &f[4]));
    CHECK_OK(fiber_value_add(o[2], 1, NULL, NULL)); /* all sent and seen */
    for (int i = 0; i < 5; i++)
        fiber_future_free(f[i]);
    for (int i = 0; i < 9; i++)
        fiber_mobj_free(o[i]);
    fiber_mobj_free(b);
    fb_oclient_release(c);
    fiber_shutdown(); /* stops the master's server: every object freed */
}

TEST(start_failure_is_clear)
{
    fiber_manager *m = NULL;
    fiber_job_opts o = {.workdir = "/nonexistent/fiber-manager-dir"};
    int rc = fiber_manager_start(&m, &o);
    CHECK(rc != 0);
    CHECK(m == NULL);
    fprintf(stderr, "start failed as expected: %s: %s\n", fiber_errname(rc),
            fiber_last_error());
    CHECK_CONTAINS(fiber_last_error(), "nonexistent");
    CHECK_ERR(fiber_manager_start(NULL, NULL), FIBER_EINVAL);
}

TH_MAIN()
