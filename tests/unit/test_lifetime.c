/*
 * test_lifetime.c -- freeing queues and releasing manager objects: the
 * server's state goes, the calls waiting in other processes wake with
 * FIBER_ECLOSED, a freed object's id gives a clear error, and loops that
 * create, use and free many of them keep the serving process's memory
 * and descriptors flat.
 *
 * Children report through their exit code: 0 when every check held, else
 * the number of the check that failed (each says on stderr what it saw).
 *
 * The loops' length is TEST_LIFETIME_N (default 20,000); set it to
 * 1000000 to run the full count by hand.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"
#include "harness.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static long loop_count(void)
{
    const char *v = getenv("TEST_LIFETIME_N");
    long n = v ? strtol(v, NULL, 10) : 0;
    return n >= 1000 ? n : 20000;
}

/* ---- a process's memory and descriptors ---------------------------------- */

/* Resident memory of process pid (0: this one) in KiB, from
 * /proc/<pid>/statm (its second field, in pages). */
static long rss_kib(long pid)
{
    char path[64];
    if (pid)
        snprintf(path, sizeof path, "/proc/%ld/statm", pid);
    else
        snprintf(path, sizeof path, "/proc/self/statm");
    FILE *f = fopen(path, "r");
    long size = -1, pages = -1;
    if (f && fscanf(f, "%ld %ld", &size, &pages) != 2)
        pages = -1;
    if (f)
        fclose(f);
    return pages < 0 ? -1 : pages * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Open descriptors of process pid (0: this one), counting the entries of
 * /proc/<pid>/fd (for this process, less the one reading it). */
static long fd_count(long pid)
{
    char path[64];
    if (pid)
        snprintf(path, sizeof path, "/proc/%ld/fd", pid);
    else
        snprintf(path, sizeof path, "/proc/self/fd");
    DIR *d = opendir(path);
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return pid ? n : n - 1;
}

/* Samples taken every tenth of a loop. */
#define SAMPLES 10
struct trend {
    long rss[SAMPLES], fds[SAMPLES];
};

static void sample(struct trend *t, int i, long pid, const char *who,
                   long done)
{
    t->rss[i] = rss_kib(pid);
    t->fds[i] = fd_count(pid);
    CHECK(t->rss[i] > 0 && t->fds[i] > 0);
    printf("%s after %ld: RSS %ld KiB, %ld descriptors\n", who, done,
           t->rss[i], t->fds[i]);
    fflush(stdout);
}

/* The bound on growth, in KiB, from the first sample (after a tenth of
 * the loop: allocator arenas and connections have reached their size) to
 * the highest one after it.  256 KiB is 64 pages: room for the
 * allocator's noise.  A loop of n objects that leaked even 100 bytes of
 * state each would grow by 0.9 * n * 100 bytes between those samples:
 * 1.7 MiB at n = 20,000, seven times the bound (and each object's real
 * state is several hundred bytes, see the positive controls). */
#define FLAT_KIB 256

/* Under AddressSanitizer or valgrind freed memory waits in a quarantine
 * instead of being reused, so RSS grows whatever the code does: the loops
 * still run (and the tool checks that nothing is lost), but only
 * descriptors are bounded. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int rss_meaningful(void)
{
    const char *pre = getenv("LD_PRELOAD"); /* valgrind preloads vgpreload */
    return !UNDER_ASAN && !(pre && strstr(pre, "vgpreload"));
}
#define RSS_MEANINGFUL rss_meaningful()

static void check_flat(const struct trend *t, const char *who)
{
    long top = t->rss[1], top_fds = t->fds[1];
    for (int i = 1; i < SAMPLES; i++) {
        if (t->rss[i] > top)
            top = t->rss[i];
        if (t->fds[i] > top_fds)
            top_fds = t->fds[i];
    }
    printf("%s: RSS grew %ld KiB (bound %d), descriptors %ld -> at most "
           "%ld\n",
           who, top - t->rss[0], FLAT_KIB, t->fds[0], top_fds);
    if (RSS_MEANINGFUL)
        CHECK(top - t->rss[0] < FLAT_KIB);
    else
        printf("%s: RSS not bounded under AddressSanitizer or valgrind\n",
               who);
    /* A descriptor per object would be thousands more; one may be open
     * for a moment (a consumer's page of take marks). */
    CHECK(top_fds <= t->fds[0] + 1);
}

/* The object id a serialised handle carries. */
static uint32_t handle_obj(const fiber_buf *h, int kind)
{
    char addr[600];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj = 0, extra;
    CHECK_OK(fb_handle_decode(h->data, h->len, kind, addr, sizeof addr,
                              token, &obj, &extra));
    return obj;
}

/* ---- queues: the children's side ----------------------------------------- */

/* A child's argument: up to three serialised queue handles. */
struct qjob {
    uint32_t len[3];
    unsigned char h[3][200];
};

static struct qjob qjob_of(fiber_queue *const *qs, int n)
{
    struct qjob j;
    memset(&j, 0, sizeof j);
    for (int i = 0; i < n; i++) {
        fiber_buf b = {0};
        CHECK_OK(fiber_queue_serialize(qs[i], &b));
        CHECK(b.len <= sizeof j.h[i]);
        memcpy(j.h[i], b.data, b.len);
        j.len[i] = (uint32_t)b.len;
        fiber_buf_free(&b);
    }
    return j;
}

/* Opens handle i of a child's argument. */
static fiber_queue *job_queue(const void *arg, size_t len, int i)
{
    struct qjob j;
    memset(&j, 0, sizeof j);
    memcpy(&j, arg, len < sizeof j ? len : sizeof j);
    fiber_queue *q;
    if (j.len[i] > sizeof j.h[i] || fiber_queue_open(&q, j.h[i], j.len[i])) {
        fprintf(stderr, "child: cannot open queue %d: %s\n", i,
                fiber_last_error());
        exit(90 + i);
    }
    return q;
}

/* Fails with check number `no` unless rc is FIBER_ECLOSED with a message
 * that contains want. */
static int closed_with(int rc, const char *want, int no)
{
    if (rc == FIBER_ECLOSED && strstr(fiber_last_error(), want))
        return 0;
    fprintf(stderr, "child check %d: %s (%d), \"%s\"; want FIBER_ECLOSED "
            "with \"%s\"\n", no, fiber_errname(rc), rc, fiber_last_error(),
            want);
    return no;
}

/* Blocks in a get on queue 0 until the queue is freed; then the next call
 * names the freed queue. */
FIBER_TASK(life_blocked_get)
{
    fiber_queue *q = job_queue(arg, len, 0);
    int bad = closed_with(fiber_queue_get(q, NULL, -1), "was freed", 1);
    size_t n;
    if (!bad)
        bad = closed_with(fiber_queue_size(q, &n),
                          "was freed by its creator", 2);
    fiber_queue_free(q);
    return bad;
}

/* Blocks in a synchronous put on the full queue 0 until it is freed. */
FIBER_TASK(life_blocked_put)
{
    fiber_queue *q = job_queue(arg, len, 0);
    int bad = closed_with(fiber_queue_put(q, "late", 4, 60000), "was freed",
                          3);
    if (!bad)
        bad = closed_with(fiber_queue_put(q, "later", 5, 0),
                          "was freed by its creator", 4);
    fiber_queue_free(q);
    return bad;
}

/* Takes a lease on queue 0 (which prefetches the rest of its messages),
 * says so on queue 1 and waits there for "go": by then queue 0 is freed.
 * What it prefetched it may still return (at most its window: the rest
 * of the 5), then gets fail naming the queue; the lease's ack is
 * harmless. */
FIBER_TASK(life_prefetcher)
{
    fiber_queue *q = job_queue(arg, len, 0), *ctl = job_queue(arg, len, 1);
    uint64_t lease;
    if (fiber_queue_get_lease(q, NULL, &lease, 30000) != 0)
        return 5;
    if (fiber_queue_put(ctl, "ready", 5, 30000) != 0)
        return 6;
    fiber_buf go = {0};
    if (fiber_queue_get(ctl, &go, 60000) != 0)
        return 7;
    fiber_buf_free(&go);
    int rc, got = 0;
    while ((rc = fiber_queue_get(q, NULL, 5000)) == 0)
        got++;
    int bad = got <= 4 ? 0 : 8;
    if (!bad)
        bad = closed_with(rc, "was freed by its creator", 9);
    rc = fiber_queue_ack(q, lease);
    if (!bad && rc != 0 && rc != FIBER_ECLOSED)
        bad = 10;
    fprintf(stderr, "prefetcher: %d prefetched messages after the free\n",
            got);
    fiber_queue_free(q);
    fiber_queue_free(ctl);
    return bad;
}

static fiber_process *start(const char *task, const struct qjob *j)
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

/* Waits (up to 30 s) until the master's server has `n` calls waiting. */
static void wait_parked(uint64_t n)
{
    struct fb_objsrv *s;
    CHECK_OK(fb_master_objsrv(&s));
    for (int i = 0; i < 30000 && fb_objsrv_parked(s) != n; i++)
        sleep_ms(1);
    CHECK_EQ(fb_objsrv_parked(s), n);
}

/* ---- queues: the tests --------------------------------------------------- */

/* The creator's free wakes the calls waiting in other processes with
 * FIBER_ECLOSED: getters on an empty queue, a putter on a full one; a
 * consumer holding a lease and prefetched messages returns at most those,
 * then fails naming the queue. */
TEST(free_wakes_waiters_in_other_processes)
{
    fiber_queue *empty, *full, *held, *ctl;
    CHECK_OK(fiber_queue_create(&empty, 0));
    CHECK_OK(fiber_queue_create(&full, 1));
    CHECK_OK(fiber_queue_create(&held, 0));
    CHECK_OK(fiber_queue_create(&ctl, 0));
    CHECK_OK(fiber_queue_put(full, "x", 1, 1000));
    for (int i = 0; i < 5; i++)
        CHECK_OK(fiber_queue_put(held, &i, sizeof i, 1000));
    struct qjob je = qjob_of(&empty, 1), jf = qjob_of(&full, 1);
    fiber_queue *hc[2] = {held, ctl};
    struct qjob jh = qjob_of(hc, 2);
    fiber_process *g1 = start("life_blocked_get", &je);
    fiber_process *g2 = start("life_blocked_get", &je);
    fiber_process *u = start("life_blocked_put", &jf);
    fiber_process *p = start("life_prefetcher", &jh);
    fiber_buf ready = {0};
    CHECK_OK(fiber_queue_get(ctl, &ready, 30000));
    fiber_buf_free(&ready);
    /* Two gets, a put, and the prefetcher's get on ctl. */
    wait_parked(4);
    fiber_queue_free(empty);
    fiber_queue_free(full);
    fiber_queue_free(held);
    wait_parked(1);
    CHECK_OK(fiber_queue_put(ctl, "go", 2, 1000));
    CHECK_EQ(finish(g1), 0);
    CHECK_EQ(finish(g2), 0);
    CHECK_EQ(finish(u), 0);
    CHECK_EQ(finish(p), 0);
    fiber_queue_free(ctl);
    wait_parked(0);
}

/* Every call on a handle of a freed queue fails with FIBER_ECLOSED and a
 * message naming the queue (its id and server); an id the server never
 * gave out is FIBER_EINVAL. */
TEST(a_freed_queue_id_gives_a_clear_error)
{
    fiber_queue *q, *other, *late;
    CHECK_OK(fiber_queue_create(&q, 0));
    fiber_buf h = {0};
    CHECK_OK(fiber_queue_serialize(q, &h));
    uint32_t id = handle_obj(&h, FB_HANDLE_QUEUE);
    CHECK_OK(fiber_queue_open(&other, h.data, h.len));
    CHECK_OK(fiber_queue_put(q, "in it", 5, 1000));
    fiber_queue_free(q);

    char want[128];
    snprintf(want, sizeof want, "queue %u on ", id);
    CHECK_ERR(fiber_queue_put(other, "x", 1, 1000), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    CHECK_CONTAINS(fiber_last_error(), "was freed by its creator "
                                       "(fiber_queue_free)");
    CHECK_ERR(fiber_queue_get(other, NULL, 0), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    CHECK_ERR(fiber_queue_get(other, NULL, -1), FIBER_ECLOSED); /* no hang */
    size_t n;
    CHECK_ERR(fiber_queue_size(other, &n), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    CHECK_ERR(fiber_queue_close(other), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    /* A pipelined put is on its way when it returns; its failure comes
     * with the next call that waits for it. */
    CHECK_OK(fiber_queue_put(other, "y", 1, -1));
    CHECK_ERR(fiber_queue_flush(other, 5000), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    fiber_queue_free(other);

    /* The serialised handle still opens (a handle is local), and its
     * first call says the queue is gone. */
    CHECK_OK(fiber_queue_open(&late, h.data, h.len));
    CHECK_ERR(fiber_queue_get(late, NULL, 1000), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    fiber_queue_free(late);
    fiber_buf_free(&h);

    /* An id never given out is another error. */
    struct fb_objsrv *s;
    CHECK_OK(fb_master_objsrv(&s));
    fiber_buf forged = {0};
    CHECK_OK(fb_handle_encode(&forged, FB_HANDLE_QUEUE, fb_objsrv_address(s),
                              fb_rt_token(), 0x7fffff00u, 0));
    CHECK_OK(fiber_queue_open(&late, forged.data, forged.len));
    CHECK_ERR(fiber_queue_put(late, "x", 1, 1000), FIBER_EINVAL);
    CHECK_CONTAINS(fiber_last_error(), "no object 2147483392");
    fiber_queue_free(late);
    fiber_buf_free(&forged);
}

/* One queue's life: created, used as producer and consumer (a message
 * left in it, a consumer's page of take marks), freed by its creator. */
static void queue_life(const char *msg, size_t len, int detach)
{
    fiber_queue *q;
    CHECK_OK(fiber_queue_create(&q, 0));
    CHECK_OK(fiber_queue_put(q, msg, len, -1));
    CHECK_OK(fiber_queue_put(q, msg, len, -1));
    CHECK_OK(fiber_queue_get(q, NULL, 5000));
    if (detach)
        fiber_queue_detach(q);
    else
        fiber_queue_free(q);
}

/* Creates, uses and frees N queues: the master (whose server thread
 * holds the queues) stays flat in memory and descriptors.  The positive
 * control: 2,000 queues detached instead (the queue stays until the
 * server stops) must show up, so the measure can see a leak. */
TEST(freeing_queues_keeps_the_master_flat)
{
    long n = loop_count(), step = n / SAMPLES;
    char msg[256];
    memset(msg, 'q', sizeof msg);
    struct trend t;
    for (int s = 0; s < SAMPLES; s++) {
        for (long i = 0; i < step; i++)
            queue_life(msg, sizeof msg, 0);
        sample(&t, s, 0, "master", (s + 1) * step);
    }
    check_flat(&t, "master, queues freed");

    enum { CONTROL = 2000 };
    long before = rss_kib(0);
    for (int i = 0; i < CONTROL; i++)
        queue_life(msg, sizeof msg, 1);
    long grew = rss_kib(0) - before;
    printf("master, %d queues detached: RSS grew %ld KiB (%ld bytes a "
           "queue)\n", CONTROL, grew, grew * 1024 / CONTROL);
    /* Each detached queue keeps its state, a 256-byte message and its
     * consumer's ring: far more than 100 bytes. */
    CHECK(!RSS_MEANINGFUL || grew * 1024 > (long)CONTROL * 100);
}

/* ---- manager objects ----------------------------------------------------- */

struct mjob {
    uint32_t len[7];
    unsigned char h[7][320];
};

static void mjob_put(struct mjob *j, int i, fiber_mobj *o)
{
    fiber_buf b = {0};
    CHECK_OK(fiber_mobj_serialize(o, &b));
    CHECK(b.len <= sizeof j->h[i]);
    memcpy(j->h[i], b.data, b.len);
    j->len[i] = (uint32_t)b.len;
    fiber_buf_free(&b);
}

static fiber_mobj *mjob_open(const void *arg, size_t len, int i)
{
    struct mjob j;
    memset(&j, 0, sizeof j);
    memcpy(&j, arg, len < sizeof j ? len : sizeof j);
    fiber_mobj *o;
    if (fiber_mobj_open(&o, j.h[i], j.len[i]) != 0) {
        fprintf(stderr, "child: open handle %d: %s\n", i, fiber_last_error());
        exit(90 + i);
    }
    return o;
}

/* Objects 0..4: a lock (held by the master), an event, a semaphore at 0,
 * a barrier of 3 parties, a condition; 5: the "ready" value.  Makes one
 * waiting call on each (asynchronous, so all wait at once), then adds 1
 * to ready: its calls travel on one connection, in order, so when ready
 * is 1 the manager has every wait parked.  Each must fail with
 * FIBER_ECLOSED once the master releases the objects. */
FIBER_TASK(life_manager_waiter)
{
    fiber_mobj *o[6];
    for (int i = 0; i < 6; i++)
        o[i] = mjob_open(arg, len, i);
    fiber_future *f[5];
    if (fiber_cond_acquire(o[4], 10000, NULL) != 0)
        return 20;
    if (fiber_lock_acquire(o[0], -1, &f[0]) || fiber_event_wait(o[1], -1, &f[1]) ||
        fiber_sem_acquire(o[2], -1, &f[2]) ||
        fiber_barrier_wait(o[3], -1, NULL, &f[3]) ||
        fiber_cond_wait(o[4], -1, &f[4]))
        return 21;
    if (fiber_value_add(o[5], 1, NULL, NULL) != 0)
        return 22;
    int bad = 0;
    for (int i = 0; i < 5 && !bad; i++)
        bad = closed_with(fiber_future_get(f[i], NULL, 30000), "was freed",
                          30 + i);
    if (!bad)
        bad = closed_with(fiber_lock_release(o[0], NULL),
                          "was freed (fiber_mobj_release)", 40);
    for (int i = 0; i < 5; i++)
        fiber_future_free(f[i]);
    for (int i = 0; i < 6; i++)
        fiber_mobj_free(o[i]);
    return bad;
}

static void wait_value(fiber_mobj *v, int64_t want)
{
    int64_t now = -1;
    for (int i = 0; i < 30000; i++) {
        CHECK_OK(fiber_value_get(v, &now, NULL));
        if (now == want)
            return;
        sleep_ms(1);
    }
    CHECK_EQ(now, want);
}

/* Releasing a manager object wakes the calls waiting on it in another
 * process with FIBER_ECLOSED, makes every other handle's calls fail
 * naming it, frees its state (a new object of that name starts empty),
 * and a second release fails plainly. */
TEST(release_wakes_manager_waiters)
{
    fiber_manager *m;
    CHECK_OK(fiber_manager_start(&m, NULL));
    fiber_mobj *o[6], *d, *d_again, *l2;
    CHECK_OK(fiber_manager_lock(m, "L", &o[0]));
    CHECK_OK(fiber_manager_event(m, "E", &o[1]));
    CHECK_OK(fiber_manager_semaphore(m, "S", 0, &o[2]));
    CHECK_OK(fiber_manager_barrier(m, "B", 3, &o[3]));
    CHECK_OK(fiber_manager_condition(m, "C", &o[4]));
    CHECK_OK(fiber_manager_value(m, "ready", 0, &o[5]));
    CHECK_OK(fiber_lock_acquire(o[0], 1000, NULL));
    struct mjob j;
    memset(&j, 0, sizeof j);
    for (int i = 0; i < 6; i++)
        mjob_put(&j, i, o[i]);
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "life_manager_waiter", &j, sizeof j,
                                 NULL));
    wait_value(o[5], 1);
    fiber_buf h = {0};
    CHECK_OK(fiber_mobj_serialize(o[0], &h));
    uint32_t lock_id = handle_obj(&h, FB_HANDLE_MOBJ);
    fiber_mobj *lock_again;
    CHECK_OK(fiber_mobj_open(&lock_again, h.data, h.len));
    fiber_buf_free(&h);
    for (int i = 0; i < 5; i++)
        CHECK_OK(fiber_mobj_release(o[i])); /* frees the handles too */
    int code = -1;
    CHECK_OK(fiber_process_join(p, 60000));
    CHECK_OK(fiber_process_exitcode(p, &code));
    CHECK_EQ(code, 0);
    fiber_process_free(p);

    /* Another handle of the released lock. */
    char want[96];
    snprintf(want, sizeof want, "lock %u on ", lock_id);
    CHECK_ERR(fiber_lock_acquire(lock_again, 0, NULL), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    CHECK_CONTAINS(fiber_last_error(), "was freed (fiber_mobj_release)");
    CHECK_ERR(fiber_mobj_release(lock_again), FIBER_ECLOSED);
    CHECK_CONTAINS(fiber_last_error(), want);
    /* The name is free again: a new, unheld lock. */
    CHECK_OK(fiber_manager_lock(m, "L", &l2));
    CHECK_OK(fiber_lock_acquire(l2, 0, NULL));
    CHECK_OK(fiber_mobj_release(l2));

    /* A released dict's state is gone: the new one of that name is
     * empty. */
    CHECK_OK(fiber_manager_dict(m, "D", &d));
    CHECK_OK(fiber_dict_set(d, "k", 1, "v", 1, NULL));
    CHECK_OK(fiber_mobj_release(d));
    CHECK_OK(fiber_manager_dict(m, "D", &d_again));
    size_t n = 9;
    CHECK_OK(fiber_dict_len(d_again, &n, NULL));
    CHECK_EQ(n, 0);
    CHECK_ERR(fiber_mobj_release(NULL), FIBER_EINVAL);
    fiber_mobj_free(d_again);
    fiber_mobj_free(o[5]);
    fiber_manager_free(m);
}

/* A custom object's method: counts its calls in the object's state. */
FIBER_TASK(life_bump)
{
    (void)arg;
    (void)len;
    (void)out;
    fiber_buf *st;
    if (fiber_manager_state(&st) != 0)
        return fiber_task_fail("no state");
    if (st->len > 0)
        st->data[0]++;
    return 0;
}

/* One object's life on the manager: opened (a fresh name), used,
 * released (or, for the control, only its handle freed).  Cycles through
 * every kind. */
static void mobj_life(fiber_manager *m, long i, int keep)
{
    static const char value[100] = "a value of a hundred bytes";
    fiber_mobj *o;
    int64_t v;
    switch (keep ? 0 : i % 10) {
    case 0:
        CHECK_OK(fiber_manager_dict(m, NULL, &o));
        CHECK_OK(fiber_dict_set(o, "key", 3, value, sizeof value, NULL));
        CHECK_OK(fiber_dict_get(o, "key", 3, NULL, NULL));
        break;
    case 1:
        CHECK_OK(fiber_manager_list(m, NULL, &o));
        CHECK_OK(fiber_list_append(o, value, sizeof value, NULL));
        break;
    case 2:
        CHECK_OK(fiber_manager_value(m, NULL, 5, &o));
        CHECK_OK(fiber_value_add(o, 1, &v, NULL));
        break;
    case 3:
        CHECK_OK(fiber_manager_lock(m, NULL, &o));
        CHECK_OK(fiber_lock_acquire(o, 1000, NULL));
        CHECK_OK(fiber_lock_release(o, NULL));
        break;
    case 4:
        CHECK_OK(fiber_manager_rlock(m, NULL, &o));
        CHECK_OK(fiber_lock_acquire(o, 1000, NULL)); /* held when freed */
        break;
    case 5:
        CHECK_OK(fiber_manager_event(m, NULL, &o));
        CHECK_OK(fiber_event_set(o, NULL));
        break;
    case 6:
        CHECK_OK(fiber_manager_semaphore(m, NULL, 1, &o));
        CHECK_OK(fiber_sem_acquire(o, 1000, NULL));
        break;
    case 7:
        CHECK_OK(fiber_manager_barrier(m, NULL, 1, &o));
        CHECK_OK(fiber_barrier_wait(o, 1000, NULL, NULL));
        break;
    case 8:
        CHECK_OK(fiber_manager_condition(m, NULL, &o));
        CHECK_OK(fiber_cond_acquire(o, 1000, NULL));
        CHECK_OK(fiber_cond_notify_all(o, NULL));
        break;
    default:
        CHECK_OK(fiber_manager_custom(m, NULL, "\0", 1, &o));
        CHECK_OK(fiber_custom_call(o, "life_bump", NULL, 0, NULL, NULL));
        break;
    }
    if (keep)
        fiber_mobj_free(o);
    else
        CHECK_OK(fiber_mobj_release(o));
}

/* Creates, uses and releases N manager objects of every kind: the
 * manager (which holds them) and the master (which holds the handles)
 * stay flat.  The positive control: 2,000 dicts whose handles are freed
 * but which are not released must show up in the manager's memory. */
TEST(releasing_manager_objects_keeps_the_manager_flat)
{
    fiber_manager *m;
    CHECK_OK(fiber_manager_start(&m, NULL));
    long pid = fiber_process_pid(fb_manager_process(m));
    if (pid <= 0)
        TH_SKIP("the manager is not a local process: no /proc of it here");
    long n = loop_count(), step = n / SAMPLES;
    struct trend mgr, master;
    for (int s = 0; s < SAMPLES; s++) {
        for (long i = 0; i < step; i++)
            mobj_life(m, s * step + i, 0);
        sample(&mgr, s, pid, "manager", (s + 1) * step);
        sample(&master, s, 0, "master", (s + 1) * step);
    }
    check_flat(&mgr, "manager, objects released");
    check_flat(&master, "master, objects released");

    enum { CONTROL = 2000 };
    long before = rss_kib(pid);
    for (int i = 0; i < CONTROL; i++)
        mobj_life(m, i, 1);
    long grew = rss_kib(pid) - before;
    printf("manager, %d dicts not released: RSS grew %ld KiB (%ld bytes an "
           "object)\n", CONTROL, grew, grew * 1024 / CONTROL);
    CHECK(!RSS_MEANINGFUL || grew * 1024 > (long)CONTROL * 100);
    fiber_manager_free(m);
}

TH_MAIN()
