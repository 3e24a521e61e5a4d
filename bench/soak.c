/*
 * soak.c -- a long-running reliability check, not a benchmark and not part
 * of `make test` (a short smoke run of it is): docs/reliability.md#soak.
 *
 * For --minutes (default 10) a pool of --workers (default 4) and a manager
 * run under continuous load while two hostile threads do their worst:
 *
 *   load     rounds of fiber_pool_map_async, fiber_pool_imap (unordered)
 *            and fiber_pool_apply_async (futures, callbacks, both) over
 *            tasks of about --task-us (default 1000) microseconds.  Each
 *            task returns a 64-bit hash of (round, index, kind), so the
 *            master checks every result exactly: a result that never came
 *            is lost, one that came twice is duplicated, one with the wrong
 *            bytes is wrong, a task that failed is failed.  A quarter of
 *            the asynchronous tasks also add 1 to a value on the manager
 *            from inside the worker, holding a manager lock that the
 *            master takes too (so a worker killed holding it must not
 *            keep it).
 *   manager  a thread of the master calls the manager all the time (a
 *            value it alone adds to, a dict, a queue it alone fills and
 *            drains, a list, a lock, bursts of asynchronous calls), and
 *            checks every answer; the main thread adds each round's count
 *            of results to another value, checked at the end.
 *   chaos    every --kill-every-ms (default 3000) a random ready worker is
 *            killed at once through the backend (SIGKILL for local
 *            processes), so that its tasks are retried on a replacement.
 *   hostile  a thread connects to the master's listening address (and
 *            nothing else), pausing --hostile-every-ms (default 250)
 *            between connections, and sends garbage: random bytes,
 *            partial headers, headers claiming huge payloads, HELLOs with
 *            a wrong token, frames out of turn, nothing at all; then it
 *            hangs up.
 *
 * Every --report-every-s (default 60) and at the end it prints a line of
 * counts, the master's resident memory and open descriptors; the last line
 * is one JSON object (tasks_done, tasks_retried, lost, duplicated,
 * rss_start_kib, rss_end_kib, fds_start, fds_end, and more).  Memory and
 * descriptors are compared between two quiet moments, after a warm-up and
 * after the load has stopped, each with every worker connected and ready
 * and no hostile connection open.  The exit status is 0 when nothing was
 * lost, duplicated, wrong or failed, every manager check held, and neither
 * the master nor the manager grew beyond the tolerances
 * (--rss-tolerance-kib, default 4096; --fd-tolerance, default 2); 1
 * otherwise, after saying why; 2 for a bad command line.
 *
 * It runs on whatever backend the configuration names (FIBER_BACKEND).  It
 * reaches into the pool and the runtime (pool_int.h, runtime.h) to find
 * the workers to kill and the address to attack: it is built in-tree.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "pool/pool_int.h"
#include "bench_common.h"
#include "base/common.h"
#include "net/net.h"
#include "runtime/runtime.h"
#include "wire/wire.h"

#define PROG "soak"

/* Tasks per round: about a second of work for 4 workers. */
#define N_MAP 2000
#define N_IMAP 1000
#define N_ASYNC 400
#define MAX_CRASHES 100 /* chaos kills are not the tasks' fault */
#define SETTLE_MS 30000 /* for every worker to be ready again */
#define MAX_FAILURES 16 /* reasons kept for the verdict */

/* AddressSanitizer keeps freed memory in quarantine (256 MiB by default),
 * so resident memory grows under it whatever the program does: the memory
 * checks are skipped there, and its own leak check stands in for them. */
#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

enum kind { K_MAP = 1, K_IMAP = 2, K_ASYNC = 3, K_ASYNC_MGR = 4 };

/* A task's argument. */
struct soak_in {
    uint64_t round, index;
    uint32_t spin_us, sleep_us;
    uint32_t kind, pad;
};

struct options {
    long minutes, seconds, workers, kill_every_ms, hostile_every_ms;
    long task_us, report_every_s, stall_timeout_s;
    long rss_tolerance_kib, fd_tolerance, seed;
};

/* ---- what every thread counts -------------------------------------------- */

static struct {
    atomic_ullong done, lost, duplicated, wrong, failed;
    atomic_ullong kills, kill_skips, hostile_conns, hostile_dial_failures;
    atomic_ullong mgr_ops, mgr_errors, mgr_lost, mgr_duplicated, mgr_wrong;
    atomic_int stop_side; /* the chaos, hostile and manager threads stop */
} g;

static volatile sig_atomic_t interrupted;

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char failures[MAX_FAILURES][256];
static int n_failures;

/* Records why the run fails (the first MAX_FAILURES reasons are kept). */
static void failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failure(const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s\n", line);
    pthread_mutex_lock(&fail_mu);
    if (n_failures < MAX_FAILURES)
        snprintf(failures[n_failures], sizeof failures[0], "%s", line);
    n_failures++;
    pthread_mutex_unlock(&fail_mu);
}

static uint64_t expected(uint64_t round, uint64_t index, uint32_t kind)
{
    uint64_t x = round * 0x9E3779B97F4A7C15ull ^ (index << 8) ^ kind;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void sleep_ms(long ms) { sleep_us(ms * 1000); }

/* Sleeps up to ms, returning early once the side threads are told to
 * stop. */
static void side_sleep(long ms)
{
    while (ms > 0 && !atomic_load(&g.stop_side)) {
        long step = ms < 50 ? ms : 50;
        sleep_ms(step);
        ms -= step;
    }
}

/* ---- tasks (they run in the workers and in the manager) ------------------ */

/* In a worker: the manager's value the K_ASYNC_MGR tasks add to, and the
 * lock they hold meanwhile (the manager thread of the master takes it too,
 * so a worker killed while holding it must not keep it). */
static fiber_mobj *worker_adds, *worker_lock;

/* Takes the next handle from a list of (u32 length, serialised handle). */
static int open_next(const uint8_t **p, const uint8_t *end, fiber_mobj **out)
{
    uint32_t n;
    if ((size_t)(end - *p) < sizeof n)
        return FIBER_EINVAL;
    memcpy(&n, *p, sizeof n);
    *p += sizeof n;
    if ((size_t)(end - *p) < n)
        return FIBER_EINVAL;
    int rc = fiber_mobj_open(out, *p, n);
    *p += n;
    return rc;
}

/* The pool's initializer: opens the two handles of its argument. */
FIBER_TASK(soak_init)
{
    const uint8_t *p = arg, *end = p + len;
    if (open_next(&p, end, &worker_adds) != 0 ||
        open_next(&p, end, &worker_lock) != 0)
        return fiber_task_fail("soak_init: %s", fiber_last_error());
    return 0;
}

/* What a K_ASYNC_MGR task does on the manager: adds 1 under the lock. */
static int worker_manager_calls(void)
{
    if (!worker_adds || !worker_lock)
        return fiber_task_fail("soak_work: no manager handles");
    if (fiber_lock_acquire(worker_lock, 10000, NULL) != 0)
        return fiber_task_fail("soak_work: lock: %s", fiber_last_error());
    int rc = fiber_value_add(worker_adds, 1, NULL, NULL);
    if (fiber_lock_release(worker_lock, NULL) != 0 || rc != 0)
        return fiber_task_fail("soak_work: add or release: %s",
                               fiber_last_error());
    return 0;
}

/* Spins, sleeps, and returns expected(round, index, kind); a K_ASYNC_MGR
 * task first adds 1 to the manager's value. */
FIBER_TASK(soak_work)
{
    struct soak_in in;
    if (len != sizeof in)
        return fiber_task_fail("soak_work wants %zu bytes, got %zu",
                               sizeof in, len);
    memcpy(&in, arg, sizeof in);
    uint64_t until = bench_now_ns() + (uint64_t)in.spin_us * 1000u;
    while (bench_now_ns() < until)
        ;
    if (in.sleep_us)
        sleep_us(in.sleep_us);
    int rc = in.kind == K_ASYNC_MGR ? worker_manager_calls() : 0;
    if (rc != 0)
        return rc;
    uint64_t v = expected(in.round, in.index, in.kind);
    return fiber_buf_append(out, &v, sizeof v);
}

/* /proc/self/status's VmRSS in KiB, or -1. */
static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kib;
}

/* Open descriptors of this process (not counting the one that reads the
 * directory), or -1. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

/* A method of the custom object "probe", run inside the manager: its
 * resident memory (KiB) and open descriptors, two int64s. */
FIBER_TASK(soak_mgr_probe)
{
    int64_t v[2] = {rss_kib(), open_fds()};
    return fiber_buf_append(out, v, sizeof v);
}

/* ---- the manager and its objects ----------------------------------------- */

struct mgr {
    fiber_manager *m;
    fiber_mobj *counter;     /* the manager thread's adds */
    fiber_mobj *results;     /* the main thread's adds, a round at a time */
    fiber_mobj *worker_adds; /* the workers' */
    fiber_mobj *dict, *list, *lock, *probe;
    fiber_queue *queue;
    int64_t counter_expected; /* manager thread only */
};

static int mgr_open(struct mgr *s)
{
    int rc = fiber_manager_start(&s->m, NULL);
    if (rc == 0)
        rc = fiber_manager_value(s->m, "counter", 0, &s->counter);
    if (rc == 0)
        rc = fiber_manager_value(s->m, "results", 0, &s->results);
    if (rc == 0)
        rc = fiber_manager_value(s->m, "worker_adds", 0, &s->worker_adds);
    if (rc == 0)
        rc = fiber_manager_dict(s->m, "dict", &s->dict);
    if (rc == 0)
        rc = fiber_manager_list(s->m, "list", &s->list);
    if (rc == 0)
        rc = fiber_manager_lock(s->m, "lock", &s->lock);
    if (rc == 0)
        rc = fiber_manager_custom(s->m, "probe", NULL, 0, &s->probe);
    if (rc == 0)
        rc = fiber_manager_queue(s->m, "queue", 0, &s->queue);
    if (rc)
        fprintf(stderr, PROG ": starting the manager: %s\n",
                fiber_last_error());
    return rc;
}

static void mgr_close(struct mgr *s)
{
    fiber_mobj *objs[] = {s->counter, s->results, s->worker_adds, s->dict,
                          s->list,    s->lock,    s->probe};
    for (size_t i = 0; i < FB_ARRAY_LEN(objs); i++)
        fiber_mobj_free(objs[i]);
    fiber_queue_free(s->queue);
    fiber_manager_free(s->m);
}

/* The manager's resident memory and descriptors, or -1s. */
static void mgr_probe(struct mgr *s, long *rss, long *fds)
{
    fiber_buf out = {0};
    int64_t v[2] = {-1, -1};
    if (fiber_custom_call(s->probe, "soak_mgr_probe", NULL, 0, &out, NULL) ==
            0 &&
        out.len == sizeof v)
        memcpy(v, out.data, sizeof v);
    fiber_buf_free(&out);
    *rss = (long)v[0];
    *fds = (long)v[1];
}

static void mgr_error(const char *what)
{
    if (atomic_fetch_add(&g.mgr_errors, 1) < 10)
        fprintf(stderr, PROG ": manager: %s: %s\n", what, fiber_last_error());
}

/* One synchronous add to the counter, whose value must follow. */
static void mgr_step_value(struct mgr *s)
{
    int64_t now;
    if (fiber_value_add(s->counter, 1, &now, NULL) != 0)
        return mgr_error("value_add");
    s->counter_expected++;
    if (now != s->counter_expected) {
        atomic_fetch_add(&g.mgr_wrong, 1);
        failure("manager value is %" PRId64 " after an add, expected %" PRId64,
                now, s->counter_expected);
        s->counter_expected = now;
    }
}

/* Sets a key of the dict and reads it back. */
static void mgr_step_dict(struct mgr *s, uint64_t i)
{
    char key[16];
    uint64_t val[2] = {i, expected(i, 0, 77)};
    int klen = snprintf(key, sizeof key, "k%u", (unsigned)(i % 64));
    fiber_buf got = {0};
    if (fiber_dict_set(s->dict, key, (size_t)klen, val, sizeof val, NULL) != 0)
        mgr_error("dict_set");
    else if (fiber_dict_get(s->dict, key, (size_t)klen, &got, NULL) != 0)
        mgr_error("dict_get");
    else if (got.len != sizeof val || memcmp(got.data, val, sizeof val) != 0)
        atomic_fetch_add(&g.mgr_wrong, 1);
    fiber_buf_free(&got);
}

/* Puts i on the queue (which only this thread uses) and takes it back:
 * anything else came twice (an older number) or skipped one (newer). */
static void mgr_step_queue(struct mgr *s, uint64_t i)
{
    fiber_buf got = {0};
    uint64_t v;
    if (fiber_queue_put(s->queue, &i, sizeof i, 5000) != 0) {
        mgr_error("queue_put");
    } else if (fiber_queue_get(s->queue, &got, 5000) != 0) {
        mgr_error("queue_get");
    } else if (got.len != sizeof v) {
        atomic_fetch_add(&g.mgr_wrong, 1);
    } else {
        memcpy(&v, got.data, sizeof v);
        if (v < i)
            atomic_fetch_add(&g.mgr_duplicated, 1);
        else if (v > i)
            atomic_fetch_add(&g.mgr_lost, 1);
    }
    fiber_buf_free(&got);
}

/* Appends to the list, pops the first item: a list of one, item i. */
static void mgr_step_list(struct mgr *s, uint64_t i)
{
    fiber_buf got = {0};
    if (fiber_list_append(s->list, &i, sizeof i, NULL) != 0)
        mgr_error("list_append");
    else if (fiber_list_pop(s->list, 0, &got, NULL) != 0)
        mgr_error("list_pop");
    else if (got.len != sizeof i || memcmp(got.data, &i, sizeof i) != 0)
        atomic_fetch_add(&g.mgr_wrong, 1);
    fiber_buf_free(&got);
}

static void mgr_step_lock(struct mgr *s)
{
    if (fiber_lock_acquire(s->lock, 5000, NULL) != 0)
        mgr_error("lock_acquire");
    else if (fiber_lock_release(s->lock, NULL) != 0)
        mgr_error("lock_release");
}

/* 16 asynchronous adds at once: their answers must be the 16 values that
 * follow, each once, in whatever order. */
static void mgr_step_burst(struct mgr *s)
{
    enum { BURST = 16 };
    fiber_future *f[BURST];
    int sent = 0;
    for (; sent < BURST; sent++)
        if (fiber_value_add(s->counter, 1, NULL, &f[sent]) != 0) {
            mgr_error("value_add (async)");
            break;
        }
    uint32_t seen = 0;
    for (int k = 0; k < sent; k++) {
        fiber_buf got = {0};
        int64_t v;
        if (fiber_future_get(f[k], &got, 10000) != 0 || got.len != sizeof v) {
            mgr_error("future_get (async add)");
        } else {
            memcpy(&v, got.data, sizeof v);
            int64_t off = v - s->counter_expected - 1;
            if (off < 0 || off >= sent)
                atomic_fetch_add(&g.mgr_wrong, 1);
            else if (seen & (1u << off))
                atomic_fetch_add(&g.mgr_duplicated, 1);
            else
                seen |= 1u << off;
        }
        fiber_buf_free(&got);
        fiber_future_free(f[k]);
    }
    s->counter_expected += sent;
}

/* The manager thread: 9 calls (25 every 16th time) about every
 * millisecond and a half, every answer checked, until stop_side. */
static void *mgr_main(void *arg)
{
    struct mgr *s = arg;
    for (uint64_t i = 0; !atomic_load(&g.stop_side); i++) {
        mgr_step_value(s);
        mgr_step_dict(s, i);
        mgr_step_queue(s, i);
        mgr_step_list(s, i);
        mgr_step_lock(s);
        atomic_fetch_add(&g.mgr_ops, 9); /* the calls just made */
        if (i % 16 == 0) {
            mgr_step_burst(s);
            atomic_fetch_add(&g.mgr_ops, 16);
        }
        sleep_ms(1);
    }
    return NULL;
}

/* ---- chaos: killing workers ---------------------------------------------- */

struct chaos {
    fiber_pool *pool;
    long every_ms;
    unsigned seed;
};

/* Kills one random ready worker at once through the backend (force = 1:
 * SIGKILL for a local process).  Both locks are held, so the worker's
 * record cannot be freed meanwhile, and a local pid cannot have been
 * reused: the runtime reaps it under the same lock.  Returns 1 if a kill
 * was sent. */
static int kill_one(struct chaos *c)
{
    struct fiber_pool *p = c->pool;
    int sent = 0;
    pthread_mutex_lock(&p->mu);
    int ready = 0;
    for (int i = 0; i < p->n_workers; i++)
        ready += p->workers[i]->state == W_READY && !p->workers[i]->retire;
    if (ready > 0) {
        int pick = (int)(rand_r(&c->seed) % (unsigned)ready);
        struct fb_worker *w = NULL;
        for (int i = 0; i < p->n_workers && !w; i++)
            if (p->workers[i]->state == W_READY && !p->workers[i]->retire &&
                pick-- == 0)
                w = p->workers[i];
        fb_rt_lock();
        struct fb_runtime *rt = fb_rt();
        struct fb_jobrec *j = w->job;
        int local = strcmp(rt->backend->ops->name, "local") == 0;
        if (!j->job || j->ended) {
            /* ended meanwhile: nothing to kill */
        } else if (local && j->job->pid <= 1) {
            /* Never: kill(-1) or kill(0) would hit far more than a worker. */
            atomic_fetch_add(&g.kill_skips, 1);
        } else if (fb_backend_signal_job(rt->backend, j->job, 1) == 0) {
            sent = 1;
        } else {
            fprintf(stderr, PROG ": chaos: cannot kill %s: %s\n", j->name,
                    fiber_last_error());
        }
        fb_rt_unlock();
    }
    pthread_mutex_unlock(&p->mu);
    return sent;
}

static void *chaos_main(void *arg)
{
    struct chaos *c = arg;
    while (!atomic_load(&g.stop_side)) {
        side_sleep(c->every_ms);
        if (!atomic_load(&g.stop_side) && kill_one(c))
            atomic_fetch_add(&g.kills, 1);
    }
    return NULL;
}

/* ---- the hostile client -------------------------------------------------- */

struct hostile {
    char addr[600]; /* the master's listening address: the only target */
    long every_ms;
    unsigned seed;
};

enum hostile_mode {
    H_EMPTY,       /* connect, hang up */
    H_RANDOM,      /* 1..4096 random bytes */
    H_HUGE,        /* a valid header claiming a huge payload, some bytes */
    H_PARTIAL,     /* the first 1..23 bytes of a header, then wait */
    H_BAD_TOKEN,   /* a well-formed HELLO with a random token */
    H_OUT_OF_TURN, /* a valid frame of another type before any HELLO */
    H_SILENT,      /* connect and say nothing for a second or two */
    H_FLOOD,       /* 64 KiB of random bytes as fast as they go */
    H_TRUNCATED,   /* a header promising 200 bytes, 50 of them */
    H_MODES
};

static void random_bytes(unsigned *seed, uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rand_r(seed);
}

/* Sends n bytes, waiting at most 200 ms for room; stops quietly when the
 * master hangs up (MSG_NOSIGNAL: no SIGPIPE). */
static void send_all(int fd, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
            poll(&pfd, 1, 200) == 1)
            continue;
        return;
    }
}

/* Reads and discards what the master says (a REJECT) for up to ms, or
 * until it hangs up. */
static void drain(int fd, int ms)
{
    uint64_t end = bench_now_ns() + (uint64_t)ms * 1000000u;
    uint8_t buf[4096];
    for (;;) {
        uint64_t now = bench_now_ns();
        if (now >= end)
            return;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)((end - now) / 1000000u) + 1) <= 0)
            return;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
            return;
    }
}

static void header(uint8_t out[FB_WIRE_HDR_LEN], unsigned type, uint32_t len)
{
    struct fb_wire_hdr h = {.type = (uint8_t)type, .len = len};
    fb_wire_hdr_encode(out, &h);
}

static void attack(struct hostile *h, int fd, int mode)
{
    static const uint32_t huge[] = {0xFFFFFFFFu, 1u << 30, 64u << 20,
                                    (64u << 20) + 1};
    uint8_t buf[4096], hdr[FB_WIRE_HDR_LEN];
    size_t n;
    switch (mode) {
    case H_EMPTY:
        return;
    case H_RANDOM:
        n = 1 + (size_t)rand_r(&h->seed) % sizeof buf;
        random_bytes(&h->seed, buf, n);
        send_all(fd, buf, n);
        break;
    case H_HUGE:
        header(hdr, FB_MSG_HELLO, huge[rand_r(&h->seed) % FB_ARRAY_LEN(huge)]);
        send_all(fd, hdr, sizeof hdr);
        n = (size_t)rand_r(&h->seed) % 512;
        random_bytes(&h->seed, buf, n);
        send_all(fd, buf, n);
        break;
    case H_PARTIAL:
        header(hdr, FB_MSG_HELLO, 100);
        send_all(fd, hdr, 1 + (size_t)rand_r(&h->seed) % (sizeof hdr - 1));
        drain(fd, 300);
        break;
    case H_BAD_TOKEN: {
        fiber_buf out = {0};
        struct fb_msg_hello m = {.build_id = fb_rt_build_id(),
                                 .job_id = (uint64_t)rand_r(&h->seed),
                                 .pid = 1,
                                 .name = "intruder"};
        m.build_id_len = (uint8_t)strlen(m.build_id);
        m.name_len = (uint8_t)strlen(m.name);
        random_bytes(&h->seed, m.token, sizeof m.token);
        if (fb_wire_put_hello(&out, &m) == 0)
            send_all(fd, out.data, out.len);
        fiber_buf_free(&out);
        break;
    }
    case H_OUT_OF_TURN: {
        static const unsigned types[] = {FB_MSG_RESULT, FB_MSG_TASK,
                                         FB_MSG_OCALL,  FB_MSG_READY,
                                         FB_MSG_EXIT,   FB_MSG_WELCOME};
        n = (size_t)rand_r(&h->seed) % 64;
        header(buf, types[rand_r(&h->seed) % FB_ARRAY_LEN(types)],
               (uint32_t)n);
        random_bytes(&h->seed, buf + FB_WIRE_HDR_LEN, n);
        send_all(fd, buf, FB_WIRE_HDR_LEN + n);
        break;
    }
    case H_SILENT:
        drain(fd, 1000 + rand_r(&h->seed) % 1000);
        return;
    case H_FLOOD:
        for (int k = 0; k < 16; k++) {
            random_bytes(&h->seed, buf, sizeof buf);
            send_all(fd, buf, sizeof buf);
        }
        break;
    case H_TRUNCATED:
        header(buf, FB_MSG_HELLO, 200);
        random_bytes(&h->seed, buf + FB_WIRE_HDR_LEN, 50);
        send_all(fd, buf, FB_WIRE_HDR_LEN + 50);
        break;
    }
    drain(fd, 100);
}

static void *hostile_main(void *arg)
{
    struct hostile *h = arg;
    while (!atomic_load(&g.stop_side)) {
        side_sleep(h->every_ms);
        if (atomic_load(&g.stop_side))
            break;
        int fd;
        if (fb_sock_dial(h->addr, fb_deadline_ms(1000), &fd) != 0) {
            atomic_fetch_add(&g.hostile_dial_failures, 1);
            continue;
        }
        atomic_fetch_add(&g.hostile_conns, 1);
        attack(h, fd, (int)(rand_r(&h->seed) % H_MODES));
        close(fd);
    }
    return NULL;
}

/* ---- the load ------------------------------------------------------------ */

/* The async callbacks' bookkeeping: a bit per task of the current round. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t round;
    uint64_t bits[(N_ASYNC + 63) / 64];
    size_t seen, counted; /* callbacks seen; results counted from them */
} cb = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

/* ud encodes the round and the index: a callback that arrives after its
 * round was settled is a second delivery. */
static void on_async(void *ud, int rc, const void *data, size_t len)
{
    uint64_t round = (uintptr_t)ud >> 16, index = (uintptr_t)ud & 0xFFFF;
    uint64_t v = 0;
    if (rc == 0 && len == sizeof v)
        memcpy(&v, data, sizeof v);
    pthread_mutex_lock(&cb.mu);
    if (round != cb.round || index >= N_ASYNC ||
        (cb.bits[index / 64] & (1ull << (index % 64)))) {
        atomic_fetch_add(&g.duplicated, 1);
    } else {
        cb.bits[index / 64] |= 1ull << (index % 64);
        cb.seen++;
        /* A task with a future too is checked through the future. */
        int only_cb = index % 4 == 2;
        if (only_cb && rc != 0)
            atomic_fetch_add(&g.failed, 1);
        else if (only_cb && (len != sizeof v ||
                             v != expected(round, index, K_ASYNC)))
            atomic_fetch_add(&g.wrong, 1);
        else if (only_cb)
            cb.counted++;
    }
    pthread_cond_broadcast(&cb.cv);
    pthread_mutex_unlock(&cb.mu);
}

struct load {
    fiber_pool *pool;
    struct mgr *mgr;
    const struct options *o;
    struct soak_in map_in[N_MAP], imap_in[N_IMAP], async_in[N_ASYNC];
    uint64_t map_out[N_MAP];
    uint64_t imap_bits[(N_IMAP + 63) / 64];
    fiber_future *futs[N_ASYNC];
    size_t n_cb;  /* callbacks asked for this round */
    uint64_t round;
    int stalled;  /* a result never came: the pool cannot be freed */
    int halt;     /* a submission failed: no more rounds */
};

static void fill(struct load *l, struct soak_in *in, size_t n, uint32_t kind)
{
    uint32_t spin = (uint32_t)l->o->task_us / 4;
    for (size_t i = 0; i < n; i++)
        in[i] = (struct soak_in){l->round, i, spin,
                                 (uint32_t)l->o->task_us - spin, kind, 0};
}

static int left_ms(uint64_t deadline_ns)
{
    uint64_t now = bench_now_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000u) + 1;
}

static int submit_async(struct load *l)
{
    pthread_mutex_lock(&cb.mu);
    cb.round = l->round;
    memset(cb.bits, 0, sizeof cb.bits);
    cb.seen = cb.counted = 0;
    pthread_mutex_unlock(&cb.mu);
    fill(l, l->async_in, N_ASYNC, K_ASYNC);
    memset(l->futs, 0, sizeof l->futs);
    l->n_cb = 0;
    for (size_t i = 0; i < N_ASYNC; i++) {
        /* index % 4: 0 a future; 1 a future and a callback; 2 a callback
         * only; 3 a future, and the task adds to the manager. */
        int use_cb = i % 4 == 1 || i % 4 == 2;
        if (i % 4 == 3)
            l->async_in[i].kind = K_ASYNC_MGR;
        void *ud = (void *)(uintptr_t)(l->round << 16 | i);
        if (fiber_pool_apply_async(l->pool, "soak_work", &l->async_in[i],
                                   sizeof l->async_in[i],
                                   use_cb ? on_async : NULL, ud,
                                   i % 4 == 2 ? NULL : &l->futs[i]) != 0) {
            failure("round %" PRIu64 ": apply_async: %s", l->round,
                    fiber_last_error());
            l->halt = 1;
            return -1;
        }
        l->n_cb += use_cb;
    }
    return 0;
}

/* Reads the whole imap, unordered, checking each index arrives once. */
static void run_imap(struct load *l, uint64_t deadline_ns)
{
    fill(l, l->imap_in, N_IMAP, K_IMAP);
    memset(l->imap_bits, 0, sizeof l->imap_bits);
    fiber_imap *it;
    if (fiber_pool_imap(l->pool, "soak_work", l->imap_in, sizeof l->imap_in[0],
                        N_IMAP, 0, 0, &it) != 0) {
        failure("round %" PRIu64 ": imap: %s", l->round, fiber_last_error());
        l->halt = 1;
        return;
    }
    fiber_buf res = {0};
    size_t got = 0, idx;
    for (;;) {
        int ms = left_ms(deadline_ns);
        if (ms == 0)
            break;
        res.len = 0;
        int rc = fiber_imap_next(it, &idx, &res, ms < 1000 ? ms : 1000);
        if (rc == FIBER_ETIMEDOUT)
            continue;
        if (rc == FIBER_ECLOSED)
            break;
        uint64_t v = 0;
        if (res.len == sizeof v)
            memcpy(&v, res.data, sizeof v);
        if (idx >= N_IMAP || (l->imap_bits[idx / 64] & (1ull << (idx % 64)))) {
            atomic_fetch_add(&g.duplicated, 1);
            continue;
        }
        l->imap_bits[idx / 64] |= 1ull << (idx % 64);
        got++;
        if (rc != 0)
            atomic_fetch_add(&g.failed, 1);
        else if (res.len != sizeof v || v != expected(l->round, idx, K_IMAP))
            atomic_fetch_add(&g.wrong, 1);
        else
            atomic_fetch_add(&g.done, 1);
    }
    fiber_buf_free(&res);
    if (got < N_IMAP) {
        atomic_fetch_add(&g.lost, N_IMAP - got);
        failure("round %" PRIu64 ": imap: %zu of %d results never came",
                l->round, N_IMAP - got, N_IMAP);
        l->stalled = 1;
        return; /* freeing it would be safe, but the pool is stuck anyway */
    }
    fiber_imap_free(it);
}

/* Waits for the map and checks every output. */
static void check_map(struct load *l, fiber_future *f, uint64_t deadline_ns)
{
    int rc = fiber_future_get(f, NULL, left_ms(deadline_ns));
    if (rc == FIBER_ETIMEDOUT) {
        size_t missing = 0;
        for (size_t i = 0; i < N_MAP; i++)
            missing += l->map_out[i] == 0;
        atomic_fetch_add(&g.lost, missing);
        failure("round %" PRIu64 ": map: %zu of %d results never came",
                l->round, missing, N_MAP);
        l->stalled = 1;
        return; /* a map future cannot be freed before it is ready */
    }
    if (rc != 0)
        fprintf(stderr, PROG ": round %" PRIu64 ": map: %s\n", l->round,
                fiber_last_error());
    for (size_t i = 0; i < N_MAP; i++) {
        if (l->map_out[i] == expected(l->round, i, K_MAP))
            atomic_fetch_add(&g.done, 1);
        else if (rc != 0)
            atomic_fetch_add(&g.failed, 1); /* left as it was */
        else
            atomic_fetch_add(&g.wrong, 1);
    }
    fiber_future_free(f);
}

static void check_async(struct load *l, uint64_t deadline_ns)
{
    fiber_buf res = {0};
    for (size_t i = 0; i < N_ASYNC; i++) {
        if (!l->futs[i])
            continue;
        res.len = 0;
        int rc = fiber_future_get(l->futs[i], &res, left_ms(deadline_ns));
        uint64_t v = 0;
        if (res.len == sizeof v)
            memcpy(&v, res.data, sizeof v);
        if (rc == FIBER_ETIMEDOUT) {
            atomic_fetch_add(&g.lost, 1);
            failure("round %" PRIu64 ": apply_async %zu: no result", l->round,
                    i);
            l->stalled = 1;
        } else if (rc != 0) {
            atomic_fetch_add(&g.failed, 1);
            fprintf(stderr, PROG ": round %" PRIu64 ": task %zu: %s\n",
                    l->round, i, fiber_last_error());
        } else if (res.len != sizeof v ||
                   v != expected(l->round, i, l->async_in[i].kind)) {
            atomic_fetch_add(&g.wrong, 1);
        } else {
            atomic_fetch_add(&g.done, 1);
        }
        fiber_future_free(l->futs[i]);
        l->futs[i] = NULL;
    }
    fiber_buf_free(&res);
    /* The callbacks: every one that was asked for, once. */
    size_t want = l->n_cb;
    pthread_mutex_lock(&cb.mu);
    while (cb.seen < want && left_ms(deadline_ns) > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&cb.cv, &cb.mu, &ts);
    }
    if (cb.seen < want) {
        atomic_fetch_add(&g.lost, want - cb.seen);
        failure("round %" PRIu64 ": %zu of %zu callbacks never came",
                l->round, want - cb.seen, want);
        l->stalled = 1;
    }
    atomic_fetch_add(&g.done, cb.counted);
    cb.round = 0; /* a late callback of this round is a duplicate */
    pthread_mutex_unlock(&cb.mu);
}

/* One round; returns the results it counted. */
static uint64_t run_round(struct load *l)
{
    uint64_t before = atomic_load(&g.done);
    uint64_t deadline =
        bench_now_ns() + (uint64_t)l->o->stall_timeout_s * 1000000000u;
    l->round++;
    fill(l, l->map_in, N_MAP, K_MAP);
    memset(l->map_out, 0, sizeof l->map_out);
    fiber_future *fmap;
    if (fiber_pool_map_async(l->pool, "soak_work", l->map_in,
                             sizeof l->map_in[0], N_MAP, l->map_out,
                             sizeof l->map_out[0], 0, &fmap) != 0) {
        failure("round %" PRIu64 ": map_async: %s", l->round,
                fiber_last_error());
        l->halt = 1;
        return 0;
    }
    if (submit_async(l) == 0)
        run_imap(l, deadline);
    if (!l->stalled)
        check_map(l, fmap, deadline);
    if (!l->stalled)
        check_async(l, deadline);
    uint64_t counted = atomic_load(&g.done) - before;
    if (!l->stalled &&
        fiber_value_add(l->mgr->results, (int64_t)counted, NULL, NULL) != 0)
        mgr_error("value_add (results)");
    return counted;
}

/* ---- quiet moments and reports ------------------------------------------- */

/* Waits until every worker of the pool is connected and ready, and the
 * master holds no connection that has not authenticated (a hostile one):
 * the moments whose memory and descriptors are compared.  Returns 0, or -1
 * if that did not happen within SETTLE_MS. */
static int settle(fiber_pool *p, int workers)
{
    uint64_t end = bench_now_ns() + (uint64_t)SETTLE_MS * 1000000u;
    while (bench_now_ns() < end) {
        pthread_mutex_lock(&p->mu);
        int ready = 0;
        for (int i = 0; i < p->n_workers; i++)
            ready += p->workers[i]->state == W_READY &&
                     p->workers[i]->has_conn;
        int all = ready == workers && p->n_workers == workers;
        pthread_mutex_unlock(&p->mu);
        fb_rt_lock();
        int pending = fb_rt()->gate.n;
        fb_rt_unlock();
        if (all && pending == 0)
            return 0;
        sleep_ms(50);
    }
    return -1;
}

struct figures {
    long rss_start, rss_end, fds_start, fds_end;
    long mgr_rss_start, mgr_rss_end, mgr_fds_start, mgr_fds_end;
    fiber_pool_stats st;
    double elapsed_s;
    uint64_t warm_done; /* results of the warm-up round, before the clock */
    int compare;        /* the end was a quiet moment: compare it */
};

static void report(const char *tag, double elapsed_s, uint64_t warm_done,
                   fiber_pool *pool, struct mgr *s)
{
    fiber_pool_stats st;
    fiber_pool_stats_get(pool, &st);
    long mgr_rss, mgr_fds;
    mgr_probe(s, &mgr_rss, &mgr_fds);
    uint64_t done = atomic_load(&g.done);
    printf("%s %3ld:%02ld  tasks_done %" PRIu64 "  tasks_retried %" PRIu64
           "  lost %llu  duplicated %llu  wrong %llu  failed %llu  rss_kib %ld"
           "  fds %ld  kills %llu  hostile_conns %llu  mgr_ops %llu"
           "  mgr_rss_kib %ld  mgr_fds %ld  (%.0f tasks/s)\n",
           tag, (long)elapsed_s / 60, (long)elapsed_s % 60, done,
           st.tasks_retried, atomic_load(&g.lost), atomic_load(&g.duplicated),
           atomic_load(&g.wrong), atomic_load(&g.failed), rss_kib(),
           open_fds(), atomic_load(&g.kills), atomic_load(&g.hostile_conns),
           atomic_load(&g.mgr_ops), mgr_rss, mgr_fds,
           elapsed_s > 0 ? (done - warm_done) / elapsed_s : 0.0);
    fflush(stdout);
}

/* The end-of-run checks on the manager's values and queue. */
static void verify_manager(struct mgr *s)
{
    int64_t v;
    if (fiber_value_get(s->counter, &v, NULL) != 0)
        mgr_error("value_get (counter)");
    else if (v != s->counter_expected)
        failure("manager counter is %" PRId64 ", expected %" PRId64, v,
                s->counter_expected);
    if (fiber_value_get(s->results, &v, NULL) != 0)
        mgr_error("value_get (results)");
    else if ((uint64_t)v != atomic_load(&g.done))
        failure("manager results value is %" PRId64 ", the master counted %llu",
                v, atomic_load(&g.done));
    size_t queued = 0;
    if (fiber_queue_size(s->queue, &queued) != 0)
        mgr_error("queue_size");
    else if (queued != 0)
        failure("manager queue holds %zu messages at the end, expected 0",
                queued);
}

/* The workers' adds: at least one per task that made one and succeeded,
 * and at most one more per task retried (a worker killed after its add,
 * before its result left). */
static void verify_worker_adds(struct mgr *s, uint64_t mgr_tasks,
                               uint64_t retried)
{
    int64_t v;
    if (fiber_value_get(s->worker_adds, &v, NULL) != 0) {
        mgr_error("value_get (worker_adds)");
        return;
    }
    if ((uint64_t)v < mgr_tasks || (uint64_t)v > mgr_tasks + retried)
        failure("workers added %" PRId64 " to the manager for %" PRIu64
                " tasks (%" PRIu64 " retried)",
                v, mgr_tasks, retried);
}

static void verdict_checks(const struct options *o, const struct figures *f)
{
    unsigned long long lost = atomic_load(&g.lost) + atomic_load(&g.mgr_lost);
    unsigned long long dup =
        atomic_load(&g.duplicated) + atomic_load(&g.mgr_duplicated);
    if (lost)
        failure("%llu results lost", lost);
    if (dup)
        failure("%llu results duplicated", dup);
    if (atomic_load(&g.wrong) + atomic_load(&g.mgr_wrong))
        failure("%llu results wrong",
                atomic_load(&g.wrong) + atomic_load(&g.mgr_wrong));
    if (atomic_load(&g.failed))
        failure("%llu tasks failed", atomic_load(&g.failed));
    if (atomic_load(&g.mgr_errors))
        failure("%llu manager calls failed", atomic_load(&g.mgr_errors));
    if (atomic_load(&g.hostile_dial_failures))
        failure("the master's address refused %llu connections: its "
                "listener stopped answering",
                atomic_load(&g.hostile_dial_failures));
    if (!f->compare)
        return; /* a failure above says why there is no quiet end */
    if (SOAK_ASAN)
        printf("memory not checked: built with AddressSanitizer, whose "
               "quarantine holds freed memory\n");
    if (!SOAK_ASAN && f->rss_end - f->rss_start > o->rss_tolerance_kib)
        failure("master's resident memory grew by %ld KiB (%ld -> %ld), "
                "over the tolerance of %ld KiB",
                f->rss_end - f->rss_start, f->rss_start, f->rss_end,
                o->rss_tolerance_kib);
    if (f->fds_end - f->fds_start > o->fd_tolerance)
        failure("master's open descriptors grew by %ld (%ld -> %ld), over "
                "the tolerance of %ld",
                f->fds_end - f->fds_start, f->fds_start, f->fds_end,
                o->fd_tolerance);
    if (!SOAK_ASAN && f->mgr_rss_end - f->mgr_rss_start > o->rss_tolerance_kib)
        failure("manager's resident memory grew by %ld KiB (%ld -> %ld)",
                f->mgr_rss_end - f->mgr_rss_start, f->mgr_rss_start,
                f->mgr_rss_end);
    if (f->mgr_fds_end - f->mgr_fds_start > o->fd_tolerance)
        failure("manager's open descriptors grew by %ld (%ld -> %ld)",
                f->mgr_fds_end - f->mgr_fds_start, f->mgr_fds_start,
                f->mgr_fds_end);
}

static void json_line(const struct options *o, const struct figures *f,
                      const char *backend)
{
    const fiber_pool_stats *st = &f->st;
    uint64_t done = atomic_load(&g.done);
    bench_json_open(NULL);
    bench_json_long("tasks_done", (long)done);
    bench_json_long("tasks_retried", (long)st->tasks_retried);
    bench_json_long("lost", (long)(atomic_load(&g.lost) +
                                   atomic_load(&g.mgr_lost)));
    bench_json_long("duplicated", (long)(atomic_load(&g.duplicated) +
                                         atomic_load(&g.mgr_duplicated)));
    bench_json_long("rss_start_kib", f->rss_start);
    bench_json_long("rss_end_kib", f->rss_end);
    bench_json_long("fds_start", f->fds_start);
    bench_json_long("fds_end", f->fds_end);
    bench_json_num("minutes", 2, f->elapsed_s / 60);
    bench_json_long("workers", o->workers);
    bench_json_string("backend", backend);
    bench_json_long("wrong", (long)(atomic_load(&g.wrong) +
                                    atomic_load(&g.mgr_wrong)));
    bench_json_long("failed", (long)atomic_load(&g.failed));
    bench_json_long("kills", (long)atomic_load(&g.kills));
    bench_json_long("kill_skips", (long)atomic_load(&g.kill_skips));
    bench_json_long("workers_lost", (long)st->workers_lost);
    bench_json_long("workers_started", (long)st->workers_started);
    bench_json_long("pool_duplicates_dropped", (long)st->duplicates_dropped);
    bench_json_long("hostile_conns", (long)atomic_load(&g.hostile_conns));
    bench_json_long("hostile_dial_failures",
                    (long)atomic_load(&g.hostile_dial_failures));
    bench_json_long("master_dropped_peers", (long)fb_rt_dropped_peers());
    bench_json_long("mgr_ops", (long)atomic_load(&g.mgr_ops));
    bench_json_long("mgr_errors", (long)atomic_load(&g.mgr_errors));
    bench_json_long("mgr_rss_start_kib", f->mgr_rss_start);
    bench_json_long("mgr_rss_end_kib", f->mgr_rss_end);
    bench_json_long("mgr_fds_start", f->mgr_fds_start);
    bench_json_long("mgr_fds_end", f->mgr_fds_end);
    bench_json_num("tasks_per_s", 0,
                   f->elapsed_s > 0 ? (done - f->warm_done) / f->elapsed_s
                                    : 0.0);
    bench_json_long("ok", n_failures == 0);
    bench_json_close();
    fflush(stdout);
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " [options]\n"
            "A pool and a manager under load for a while, with workers\n"
            "killed and garbage sent to the master's port; see\n"
            "docs/reliability.md.  The backend is the configured one\n"
            "(FIBER_BACKEND=...).\n"
            "  --minutes N            run for N minutes (default 10)\n"
            "  --seconds N            run for N seconds instead\n"
            "  --workers N            pool workers (default 4)\n"
            "  --kill-every-ms N      kill a random worker this often\n"
            "                         (default 3000; 0: never)\n"
            "  --hostile-every-ms N   pause between hostile connections\n"
            "                         (default 250; 0: none)\n"
            "  --task-us N            each task's duration, a quarter of it\n"
            "                         spinning (default 1000)\n"
            "  --report-every-s N     a line of figures this often "
            "(default 60)\n"
            "  --stall-timeout-s N    a round's results must all come within\n"
            "                         this (default 120)\n"
            "  --rss-tolerance-kib N  growth of resident memory allowed\n"
            "                         (default 4096)\n"
            "  --fd-tolerance N       growth of open descriptors allowed\n"
            "                         (default 2)\n"
            "  --seed N               random seed of the chaos and the hostile\n"
            "                         client (default: the time)\n"
            "Exit status: 0 when every check held, 1 when one did not (the\n"
            "reasons are printed), 2 for a bad command line.  The last line\n"
            "of output is one JSON object.\n");
}

static void on_sigint(int sig)
{
    FB_UNUSED(sig);
    interrupted = 1;
}

static int parse(int argc, char **argv, struct options *o)
{
    *o = (struct options){.minutes = 10,
                          .workers = 4,
                          .kill_every_ms = 3000,
                          .hostile_every_ms = 250,
                          .task_us = 1000,
                          .report_every_s = 60,
                          .stall_timeout_s = 120,
                          .rss_tolerance_kib = 4096,
                          .fd_tolerance = 2};
    const struct bench_flag flags[] = {
        {"--minutes", .value = &o->minutes, .lo = 0, .hi = 100000},
        {"--seconds", .value = &o->seconds, .lo = 1, .hi = 6000000},
        {"--workers", .value = &o->workers, .lo = 1, .hi = 256},
        {"--kill-every-ms", .value = &o->kill_every_ms, .lo = 0,
         .hi = 3600000},
        {"--hostile-every-ms", .value = &o->hostile_every_ms, .lo = 0,
         .hi = 3600000},
        {"--task-us", .value = &o->task_us, .lo = 4, .hi = 1000000},
        {"--report-every-s", .value = &o->report_every_s, .lo = 1,
         .hi = 86400},
        {"--stall-timeout-s", .value = &o->stall_timeout_s, .lo = 5,
         .hi = 86400},
        {"--rss-tolerance-kib", .value = &o->rss_tolerance_kib, .lo = 0,
         .hi = 1L << 30},
        {"--fd-tolerance", .value = &o->fd_tolerance, .lo = 0, .hi = 1 << 20},
        {"--seed", .value = &o->seed, .lo = 0, .hi = 0x7FFFFFFF},
        {NULL},
    };
    return bench_parse_args(PROG, argc, argv, flags);
}

/* Appends o's serialised handle to out, after its u32 length. */
static int put_handle(fiber_buf *out, fiber_mobj *o)
{
    size_t at = out->len;
    uint32_t n = 0;
    int rc = fiber_buf_append(out, &n, sizeof n);
    if (rc == 0)
        rc = fiber_mobj_serialize(o, out);
    if (rc == 0) {
        n = (uint32_t)(out->len - at - sizeof n);
        memcpy(out->data + at, &n, sizeof n);
    }
    return rc;
}

static int start_pool(fiber_pool **pool, struct mgr *s, long workers)
{
    fiber_buf handles = {0};
    int rc = put_handle(&handles, s->worker_adds);
    if (rc == 0)
        rc = put_handle(&handles, s->lock);
    fiber_pool_opts po = {.workers = (int)workers,
                          .initializer = "soak_init",
                          .initarg = handles.data,
                          .initarg_len = handles.len,
                          .max_task_crashes = MAX_CRASHES};
    if (rc == 0)
        rc = fiber_pool_create(pool, &po);
    if (rc)
        fprintf(stderr, PROG ": creating the pool: %s\n", fiber_last_error());
    fiber_buf_free(&handles);
    return rc;
}

/* The quiet moment before the load starts, or after it ended: the
 * figures are taken once the pool has settled, or anyway, after a failure
 * that says it did not.  Returns 0, or -1 if it did not settle. */
static int measure(fiber_pool *pool, const struct options *o, struct mgr *s,
                   long *rss, long *fds, long *mgr_rss, long *mgr_fds)
{
    int rc = settle(pool, (int)o->workers);
    if (rc != 0)
        failure("the pool did not have %ld ready workers within %d ms",
                o->workers, SETTLE_MS);
    *rss = rss_kib();
    *fds = open_fds();
    mgr_probe(s, mgr_rss, mgr_fds);
    return rc;
}

static void start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    int rc = pthread_create(t, NULL, fn, arg);
    if (rc != 0) {
        fprintf(stderr, PROG ": pthread_create: %s\n", strerror(rc));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o;
    int prc = parse(argc, argv, &o);
    if (prc != 0)
        return bench_usage_exit(prc, usage);
    long duration_s = o.seconds ? o.seconds : o.minutes * 60;
    unsigned seed = o.seed ? (unsigned)o.seed : (unsigned)time(NULL);
    char backend[32] = "?";
    fiber_config_get("backend", backend, sizeof backend);
    printf(PROG ": fiber %s, backend %s, %ld workers, %ld s, tasks of %ld us,"
           " a worker killed every %ld ms, %ld ms between hostile connections,"
           " seed %u\n",
           fiber_version(), backend, o.workers, duration_s, o.task_us,
           o.kill_every_ms, o.hostile_every_ms, seed);
    fflush(stdout);

    static struct mgr s;
    static struct load l;
    fiber_pool *pool = NULL;
    if (mgr_open(&s) != 0 || start_pool(&pool, &s, o.workers) != 0)
        return 1;
    l.pool = pool;
    l.mgr = &s;
    l.o = &o;

    /* Warm-up: one round, then the first quiet moment. */
    struct figures f = {0};
    run_round(&l);
    if (!l.stalled &&
        measure(pool, &o, &s, &f.rss_start, &f.fds_start, &f.mgr_rss_start,
                &f.mgr_fds_start) != 0)
        return 1; /* said why */
    f.warm_done = atomic_load(&g.done);

    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    struct chaos chaos = {pool, o.kill_every_ms, seed};
    struct hostile hostile = {.every_ms = o.hostile_every_ms,
                              .seed = seed * 7 + 1};
    snprintf(hostile.addr, sizeof hostile.addr, "%s", fb_rt_address());
    if (o.hostile_every_ms && !hostile.addr[0])
        failure("no listening address to send garbage to: %s",
                fiber_last_error());
    pthread_t t_mgr, t_chaos, t_hostile;
    start_thread(&t_mgr, mgr_main, &s);
    if (o.kill_every_ms)
        start_thread(&t_chaos, chaos_main, &chaos);
    if (o.hostile_every_ms && hostile.addr[0])
        start_thread(&t_hostile, hostile_main, &hostile);

    double t0 = bench_now_s(), next_report = t0 + (double)o.report_every_s;
    while (!interrupted && !l.stalled && !l.halt &&
           bench_now_s() - t0 < duration_s) {
        run_round(&l);
        if (bench_now_s() >= next_report) {
            report("  ", bench_now_s() - t0, f.warm_done, pool, &s);
            next_report += (double)o.report_every_s;
        }
    }
    f.elapsed_s = bench_now_s() - t0;
    atomic_store(&g.stop_side, 1);
    pthread_join(t_mgr, NULL);
    if (o.kill_every_ms)
        pthread_join(t_chaos, NULL);
    if (o.hostile_every_ms && hostile.addr[0])
        pthread_join(t_hostile, NULL);

    if (!l.stalled) {
        f.compare = measure(pool, &o, &s, &f.rss_end, &f.fds_end,
                            &f.mgr_rss_end, &f.mgr_fds_end) == 0;
    } else {
        /* Not a quiet moment: for the record, not compared. */
        f.rss_end = rss_kib();
        f.fds_end = open_fds();
        f.mgr_rss_end = f.mgr_rss_start;
        f.mgr_fds_end = f.mgr_fds_start;
    }
    fiber_pool_stats_get(pool, &f.st);
    report("end", f.elapsed_s, f.warm_done, pool, &s);
    if (!l.stalled) {
        verify_manager(&s);
        verify_worker_adds(&s, l.round * (N_ASYNC / 4), f.st.tasks_retried);
    }
    verdict_checks(&o, &f);
    if (n_failures == 0) {
        printf("PASS: nothing lost, duplicated, wrong or failed; %s within "
               "tolerance\n",
               SOAK_ASAN ? "descriptors" : "memory and descriptors");
    } else {
        for (int i = 0; i < n_failures && i < MAX_FAILURES; i++)
            printf("FAIL: %s\n", failures[i]);
    }
    json_line(&o, &f, backend);
    if (l.stalled) {
        /* A result that never came: the pool cannot be freed (a map future
         * waits for its tasks).  Leave; the workers follow their master. */
        fflush(NULL);
        _exit(1);
    }
    fiber_pool_free(pool);
    mgr_close(&s);
    return n_failures == 0 ? 0 : 1;
}
