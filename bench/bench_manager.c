/*
 * bench_manager.c -- round trips to a manager's shared objects, fiber
 * against Python's multiprocessing.Manager().
 *
 * Two figures, each the median (and 99th percentile) of --calls timed
 * pairs after --warmup untimed ones, every pair timed on its own with
 * CLOCK_MONOTONIC:
 *   - a dict pair: fiber_dict_set of a 16-byte key to a 64-byte value,
 *     then fiber_dict_get of it (Python: d[k] = v; d[k]);
 *   - a lock pair: fiber_lock_acquire then fiber_lock_release of an
 *     uncontended lock (Python: lock.acquire(); lock.release()).
 * Both are synchronous calls, two round trips to the manager per pair.
 *
 * The calls are made from the master.  A child makes the same calls the
 * same way (each process dials the manager directly, a unix socket
 * locally, and maps the objects' shared memory, mshm.h), so the figures
 * stand for any local client process; the peer, likewise, calls its
 * Manager from its main process.  The fiber figures are measured twice:
 * as a local client makes them (in shared memory), and with
 * manager_shm off, over the socket, as a client in another container
 * or on another host (whose network this does not include) does.
 *
 * Then the kernel's floor: the same pairs of round trips made by a bare C
 * echo over a unix socketpair, both sides blocking in recv() (see
 * run_floor), reported as socket_floor_pair_median_us: what two
 * crossings of a local socket cost on this machine right now.
 *
 * The peer (peer/manager_peer.py) runs in the same invocation unless
 * --no-peer.  Output: a table on stdout, then as the LAST line one JSON
 * object: dict_set_get_median_us, lock_pair_median_us (and their p99s),
 * dict_async_ops_per_s, shared_memory (1 if the handles were), the same
 * figures over the socket under "socket", socket_floor_pair_median_us,
 * the peer's under "peer".
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "objsrv/objsrv.h" /* fb_mobj_shared */

#include "bench_common.h"

#define PROG "bench-manager"
struct figures {
    struct bench_latency dict, lock;
    double async_ops_per_s; /* fiber only: Manager has no async calls */
};

#define ASYNC_OPS 200000
#define ASYNC_WINDOW 1000 /* futures in flight */

/* In the JSON line and the peer's, in this order. */
static const struct bench_figure figure_keys[] = {
    {"dict_set_get_median_us", offsetof(struct figures, dict.median_us), 2,
     0},
    {"dict_set_get_p99_us", offsetof(struct figures, dict.p99_us), 2, 0},
    {"lock_pair_median_us", offsetof(struct figures, lock.median_us), 2, 0},
    {"lock_pair_p99_us", offsetof(struct figures, lock.p99_us), 2, 0},
    {"dict_async_ops_per_s", offsetof(struct figures, async_ops_per_s), 1, 1},
};
#define N_FIGURES (sizeof figure_keys / sizeof figure_keys[0])

/* ---- fiber side ---------------------------------------------------------- */

struct dict_ctx {
    fiber_mobj *d;
    fiber_buf got;
};

static int dict_pair(void *ctx)
{
    static const char key[16] = "bench-key-00001";
    static const char val[64] = "a 64-byte value";
    struct dict_ctx *c = ctx;
    c->got.len = 0;
    int rc = fiber_dict_set(c->d, key, sizeof key, val, sizeof val, NULL);
    return rc ? rc : fiber_dict_get(c->d, key, sizeof key, &c->got, NULL);
}

static int lock_pair(void *l)
{
    int rc = fiber_lock_acquire(l, -1, NULL);
    return rc ? rc : fiber_lock_release(l, NULL);
}

/* ASYNC_OPS dict sets, ASYNC_WINDOW futures in flight at a time (each
 * batch sent, then its answers collected): operations per second. */
static int async_rate(fiber_mobj *d, double *ops_per_s)
{
    static fiber_future *fs[ASYNC_WINDOW];
    char key[16] = "async-key-00000";
    uint64_t t0 = bench_now_ns();
    int rc = 0;
    for (long done = 0; rc == 0 && done < ASYNC_OPS; done += ASYNC_WINDOW) {
        int n = 0;
        for (; rc == 0 && n < ASYNC_WINDOW; n++) {
            key[14] = (char)('0' + n % 10);
            rc = fiber_dict_set(d, key, sizeof key, "v", 1, &fs[n]);
        }
        for (int i = 0; i < n; i++) {
            int frc = rc ? 0 : fiber_future_get(fs[i], NULL, -1);
            if (frc && rc == 0)
                rc = frc;
            fiber_future_free(fs[i]);
        }
        if (rc) /* the failed call made no future */
            break;
    }
    *ops_per_s = (double)ASYNC_OPS / ((double)(bench_now_ns() - t0) / 1e9);
    return rc;
}

/* The fiber figures, over the socket when !shared; *is_shared says
 * whether the handles were in shared memory. */
static int run_fiber(const struct bench_calls_options *o, struct figures *f,
                     int shared, int *is_shared)
{
    fiber_manager *m;
    fiber_mobj *d = NULL, *l = NULL;
    const char *path = shared ? "local" : "socket";
    if (fiber_manager_start(&m, NULL) != 0) {
        fprintf(stderr, PROG ": fiber_manager_start: %s\n",
                fiber_last_error());
        return -1;
    }
    /* Read at each handle's first call: kept until the run ends. */
    fiber_config_set("manager_shm", shared ? "true" : "false");
    int rc = fiber_manager_dict(m, "bench-dict", &d) == 0 &&
                     fiber_manager_lock(m, "bench-lock", &l) == 0
                 ? 0
                 : -1;
    if (rc)
        fprintf(stderr, PROG ": opening objects: %s\n", fiber_last_error());
    *is_shared = rc == 0 && fb_mobj_shared(d) && fb_mobj_shared(l);
    struct dict_ctx dc = {d, {0}};
    if (rc == 0)
        rc = bench_time_calls(PROG, "dict pair", dict_pair, &dc, o->warmup,
                              o->calls, &f->dict);
    if (rc == 0)
        rc = bench_time_calls(PROG, "lock pair", lock_pair, l, o->warmup,
                              o->calls, &f->lock);
    if (rc == 0)
        rc = async_rate(d, &f->async_ops_per_s);
    if (rc == 0)
        printf("fiber (%s, %s) dict set, %d async calls in flight: %.0f "
               "ops/s\n", path, *is_shared ? "shared memory" : "socket",
               ASYNC_WINDOW, f->async_ops_per_s);
    fiber_config_set("manager_shm", "true");
    fiber_buf_free(&dc.got);
    fiber_mobj_free(d);
    fiber_mobj_free(l);
    fiber_manager_free(m);
    return rc;
}

/* ---- the kernel's floor ------------------------------------------------- */

/* Two synchronous round trips with nothing but the kernel in them: a
 * forked child echoes 64-byte messages over a unix socketpair, and both
 * sides block in recv() (no spinning).  No client of a manager in
 * another process can do better than this while its every call crosses
 * the socket twice, so it tells the manager's own cost from the
 * machine's.  Not a peer: the ratio stays fiber against mp. */
#define FLOOR_MSG 64

static int full_io(int fd, char *b, int out)
{
    for (size_t done = 0; done < FLOOR_MSG;) {
        ssize_t n = out ? send(fd, b + done, FLOOR_MSG - done, MSG_NOSIGNAL)
                        : recv(fd, b + done, FLOOR_MSG - done, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            return -1;
        done += n > 0 ? (size_t)n : 0;
    }
    return 0;
}

static int floor_pair(void *fdp)
{
    int fd = *(int *)fdp;
    char b[FLOOR_MSG] = "floor";
    for (int i = 0; i < 2; i++)
        if (full_io(fd, b, 1) != 0 || full_io(fd, b, 0) != 0)
            return -1;
    return 0;
}

static int run_floor(const struct bench_calls_options *o,
                     struct bench_latency *out)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) { /* the echo: only calls safe after a fork */
        char b[FLOOR_MSG];
        close(sv[0]);
        while (full_io(sv[1], b, 0) == 0 && full_io(sv[1], b, 1) == 0) {
        }
        _exit(0);
    }
    close(sv[1]);
    int rc = pid < 0 ? -1
                     : bench_time_calls(PROG, "socket floor", floor_pair,
                                        &sv[0], o->warmup, o->calls, out);
    close(sv[0]); /* the echo sees the end and exits */
    if (pid > 0)
        waitpid(pid, NULL, 0);
    return rc;
}

/* ---- output ---------------------------------------------------------------- */

static void print_row(const char *what, const struct bench_latency *f,
                      const struct bench_latency *p)
{
    printf("%-18s %12.1f %12.1f", what, f->median_us, f->p99_us);
    if (p)
        printf(" %12.1f %12.1f %10.1fx\n", p->median_us, p->p99_us,
               p->median_us / f->median_us);
    else
        printf(" %12s %12s %11s\n", "-", "-", "-");
}

static void print_table(const struct figures *f, const struct figures *s,
                        const struct figures *p,
                        const struct bench_latency *floor)
{
    printf("\n%-18s %12s %12s %12s %12s %11s\n", "pair", "fiber med us",
           "fiber p99 us", "mp med us", "mp p99 us", "med x");
    print_row("dict set+get", &f->dict, p ? &p->dict : NULL);
    print_row("lock acquire+rel", &f->lock, p ? &p->lock : NULL);
    if (s) {
        print_row("dict, socket", &s->dict, p ? &p->dict : NULL);
        print_row("lock, socket", &s->lock, p ? &p->lock : NULL);
    }
    if (floor)
        printf("%-18s %12.1f %12.1f   (2 round trips of a bare C echo over "
               "a unix socketpair)\n", "socket floor", floor->median_us,
               floor->p99_us);
    printf("(x = mp / fiber: how many times faster fiber is; mp = Python "
           "multiprocessing.Manager)\n\n");
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--calls N] [--warmup N] [--no-peer] [--help]\n"
            "Round trips to a manager's objects from the master: a dict "
            "set+get pair and a\nlock acquire+release pair, median and 99th "
            "percentile in us, and the same pairs made by a bare C echo "
            "over a unix\nsocketpair (the kernel's floor).\n"
            "  --calls N   timed pairs of each kind (default %d)\n"
            "  --warmup N  untimed pairs first (default %d)\n"
            "  --no-peer   skip Python multiprocessing.Manager "
            "(peer/manager_peer.py)\n"
            "The last line of output is one JSON object.\n",
            BENCH_DEFAULT_CALLS, BENCH_DEFAULT_WARMUP);
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct bench_calls_options o;
    int rc = bench_parse_calls_args(PROG, argc, argv, 0, &o);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local backend, calls from the master, %ld "
           "pairs after %ld warm-up\n", fiber_version(), o.calls, o.warmup);
    fflush(stdout);
    struct figures f, s, p, *pp = NULL;
    int shared = 0, sock_shared = 1;
    if (run_fiber(&o, &f, 1, &shared) != 0 ||
        run_fiber(&o, &s, 0, &sock_shared) != 0) {
        fprintf(stderr, PROG ": FAILED\n");
        return 1;
    }
    printf("fiber's local handles %s in shared memory\n",
           shared ? "were" : "were NOT");
    struct bench_latency floor, *fl = NULL;
    if (run_floor(&o, &floor) == 0)
        fl = &floor;
    else
        fprintf(stderr, PROG ": the socket floor could not be measured\n");
    if (bench_peer_calls(PROG, "manager_peer.py", &o, figure_keys, N_FIGURES,
                         &p))
        pp = &p;
    print_table(&f, &s, pp, fl);
    /* The peer has no async figure (the last key): Manager calls block. */
    bench_json_open(NULL);
    bench_json_write(figure_keys, N_FIGURES, &f);
    bench_json_long("shared_memory", shared);
    bench_json_open("socket");
    bench_json_write(figure_keys, N_FIGURES, &s);
    bench_json_close();
    if (fl)
        bench_json_num("socket_floor_pair_median_us", 2, fl->median_us);
    else
        bench_json_null("socket_floor_pair_median_us");
    bench_json_long("calls", o.calls);
    bench_json_peer(figure_keys, N_FIGURES - 1, pp);
    bench_json_close();
    return 0;
}
