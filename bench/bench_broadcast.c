/*
 * bench_broadcast.c -- one object to every worker: a shared object
 * (fiber_object_put, relayed between workers) against the master sending
 * it to each worker in turn, and against Python's multiprocessing.Pool
 * with the object in each task's argument.
 *
 * For each N of --workers (default 8,64,512) a pool of N local workers is
 * created and waited for (fiber_pool_wait_ready); then for each size
 * (1 MiB, 64 MiB), with bytes no worker has seen:
 *
 *   time_s_<size>_w<N>   from fiber_object_put until a map of N tasks
 *                        (chunksize 1: one per worker, checked by pid)
 *                        that each resolve the ref and hash the bytes has
 *                        returned: every worker has it, verified.
 *   master_bytes_<size>_w<N>
 *                        blob bytes the master's blob server sent in that
 *                        time (fiber_object_stats.bytes_served); the task
 *                        messages, 40-byte refs, are left out.
 *   "direct": the same N tasks with the bytes in each task's argument
 *   (fiber_pool_map_bufs): the master sends N copies itself, as it did
 *   before shared objects.  master_bytes there is N * size.
 *   single_transfer_s_64mib: 64 MiB written by one process into a unix
 *   socket and read by another (fork + socketpair), the median of 5: the
 *   floor of moving the bytes once on this machine.
 *
 * --no-shm sets object_shm off: workers then receive the bytes, from the
 * master and from each other (the relay tree), as workers on other hosts
 * would.
 *
 * A case whose N copies would not fit in half of MemAvailable is skipped
 * and reported null (512 x 64 MiB = 32 GiB on a 24 GiB machine), except
 * the shared case when workers map one copy; the
 * direct baseline also needs max_message_bytes above twice the size, so
 * the benchmark sets it to 256 MiB.
 *
 * The peer (peer/broadcast_peer.py) does the same N tasks with
 * multiprocessing.Pool, the blob pickled into each task's argument.
 * Output: a table, then as the LAST line one JSON object.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-broadcast"
#define MAX_N 8

/* What a task reports: a checksum that reads one 8-byte word of every
 * 4 KiB page (so every page must be there), the length, and its pid.
 * The bytes' integrity is the shared objects' own business (hashed on
 * arrival; a mapped copy is the master's file); the task only proves it
 * has them, as cheaply as that can be proved. */
struct digest {
    uint64_t sum, len;
    int64_t pid;
};

static void digest_of(const void *data, size_t len, struct digest *d)
{
    const unsigned char *p = data;
    uint64_t sum = 0, w;
    for (size_t i = 0; i + 8 <= len; i += 4096) {
        memcpy(&w, p + i, 8);
        sum = sum * 31 + w;
    }
    d->sum = sum;
    d->len = len;
    d->pid = getpid();
}

FIBER_TASK(bb_resolve)
{
    fiber_ref ref;
    if (len != sizeof ref)
        return fiber_task_fail("bb_resolve wants a ref, got %zu bytes", len);
    memcpy(&ref, arg, sizeof ref);
    const void *data;
    size_t n;
    if (fiber_object_get(&ref, &data, &n) != 0)
        return fiber_task_fail("%s", fiber_last_error());
    struct digest d;
    digest_of(data, n, &d);
    return fiber_buf_append(out, &d, sizeof d);
}

FIBER_TASK(bb_bytes)
{
    struct digest d;
    digest_of(arg, len, &d);
    return fiber_buf_append(out, &d, sizeof d);
}

struct sizes {
    const char *name;
    size_t bytes;
};
static const struct sizes SIZES[] = {{"1mib", 1u << 20}, {"64mib", 64u << 20}};
#define N_SIZES 2

struct options {
    long workers[MAX_N];
    int n_workers;
    int no_peer, no_direct, no_shm;
};

struct cell {
    double time_s, master_bytes; /* < 0: not run */
    double put_s;                /* shared: of time_s, fiber_object_put */
};

struct result {
    struct cell fiber[MAX_N][N_SIZES], direct[MAX_N][N_SIZES];
    double single_s;
};

static long mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %ld", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024;
}

static unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; p && i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, n - i < 8 ? n - i : 8);
    }
    return p;
}

/* ---- the floor: one transfer between two processes ----------------------- */

static double one_transfer(size_t n, const unsigned char *buf)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        unsigned char *in = malloc(1 << 20);
        size_t got = 0;
        while (got < n) {
            ssize_t r = read(sv[1], in, 1 << 20);
            if (r <= 0)
                _exit(1);
            got += (size_t)r;
        }
        char one = 1;
        _exit(write(sv[1], &one, 1) == 1 ? 0 : 1);
    }
    close(sv[1]);
    double t0 = bench_now_s();
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = write(sv[0], buf + sent, n - sent);
        if (w <= 0)
            break;
        sent += (size_t)w;
    }
    char one;
    ssize_t r = read(sv[0], &one, 1);
    double dt = bench_now_s() - t0;
    close(sv[0]);
    int st;
    waitpid(pid, &st, 0);
    return r == 1 ? dt : -1;
}

static double single_transfer_s(void)
{
    size_t n = 64u << 20;
    unsigned char *buf = pattern(n, 99);
    double v[5];
    for (int i = 0; i < 5; i++)
        v[i] = one_transfer(n, buf);
    free(buf);
    return bench_median(v, 5);
}

/* ---- the fiber side ---------------------------------------------------------- */

/* Checks N digests: all equal to want, from N different workers. */
static int check(const struct digest *got, long n, const struct digest *want,
                 const char *what)
{
    long distinct = 0;
    for (long i = 0; i < n; i++) {
        if (got[i].sum != want->sum || got[i].len != want->len) {
            fprintf(stderr, PROG ": %s: task %ld got different bytes\n", what,
                    i);
            return -1;
        }
        int seen = 0;
        for (long k = 0; k < i && !seen; k++)
            seen = got[k].pid == got[i].pid;
        distinct += !seen;
    }
    if (distinct != n)
        printf("  (%s: the %ld tasks ran on %ld workers)\n", what, n, distinct);
    return 0;
}

static int run_shared(fiber_pool *p, long n, const unsigned char *blob,
                      size_t size, struct cell *c)
{
    struct digest want, *got = calloc((size_t)n, sizeof *got);
    fiber_ref *refs = calloc((size_t)n, sizeof *refs);
    digest_of(blob, size, &want);
    fiber_object_stats s0, s1;
    fiber_object_stats_get(&s0);
    double t0 = bench_now_s();
    fiber_ref ref;
    int rc = fiber_object_put(blob, size, &ref);
    double t_put = bench_now_s() - t0;
    for (long i = 0; rc == 0 && i < n; i++)
        refs[i] = ref;
    if (rc == 0)
        rc = fiber_pool_map(p, "bb_resolve", refs, sizeof *refs, (size_t)n,
                            got, sizeof *got, 1);
    c->time_s = bench_now_s() - t0;
    c->put_s = t_put;
    fiber_object_stats_get(&s1);
    /* What it sent over sockets, and the one copy it wrote for same-host
     * workers to map. */
    c->master_bytes = (double)(s1.bytes_served - s0.bytes_served) +
                      (double)(s1.shm_bytes - s0.shm_bytes);
    if (rc)
        fprintf(stderr, PROG ": shared: %s\n", fiber_last_error());
    else
        rc = check(got, n, &want, "shared");
    fiber_object_release(&ref);
    free(got);
    free(refs);
    return rc;
}

static int run_direct(fiber_pool *p, long n, const unsigned char *blob,
                      size_t size, struct cell *c)
{
    struct digest want;
    digest_of(blob, size, &want);
    fiber_iov *in = calloc((size_t)n, sizeof *in);
    fiber_buf *outs = calloc((size_t)n, sizeof *outs);
    int *codes = calloc((size_t)n, sizeof *codes);
    for (long i = 0; i < n; i++)
        in[i] = (fiber_iov){blob, size};
    double t0 = bench_now_s();
    int rc = fiber_pool_map_bufs(p, "bb_bytes", in, (size_t)n, outs, codes, 1);
    c->time_s = bench_now_s() - t0;
    c->master_bytes = (double)n * (double)size;
    struct digest *got = calloc((size_t)n, sizeof *got);
    for (long i = 0; rc == 0 && i < n; i++) {
        if (outs[i].len != sizeof *got)
            rc = -1;
        else
            memcpy(&got[i], outs[i].data, sizeof *got);
    }
    if (rc)
        fprintf(stderr, PROG ": direct: %s\n", fiber_last_error());
    else
        rc = check(got, n, &want, "direct");
    for (long i = 0; i < n; i++)
        fiber_buf_free(&outs[i]);
    free(in);
    free(outs);
    free(codes);
    free(got);
    return rc;
}

static int run_workers(const struct options *o, int wi, struct result *r,
                       unsigned *seed)
{
    long n = o->workers[wi];
    fiber_pool *p;
    fiber_pool_opts po = {.workers = (int)n};
    if (fiber_pool_create(&p, &po) != 0 ||
        fiber_pool_wait_ready(p, (int)n, 600000) != 0) {
        fprintf(stderr, PROG ": a pool of %ld: %s\n", n, fiber_last_error());
        return -1;
    }
    int rc = 0;
    char shm[16] = "true";
    fiber_config_get("object_shm", shm, sizeof shm);
    int mapping = strcmp(shm, "false") != 0 && strcmp(shm, "0") != 0;
    for (int si = 0; si < N_SIZES && rc == 0; si++) {
        size_t size = SIZES[si].bytes;
        /* N copies: every worker's own, unless they map one. */
        int too_big = (double)n * (double)size > (double)mem_available() / 2;
        if (too_big)
            printf("%-6s w%-4ld %s: %ld copies of %zu bytes exceed half of "
                   "MemAvailable\n", SIZES[si].name, n,
                   mapping ? "direct skipped" : "skipped", n, size);
        if (too_big && !mapping)
            continue;
        unsigned char *blob = pattern(size, ++*seed);
        struct cell *c = &r->fiber[wi][si], *d = &r->direct[wi][si];
        rc = run_shared(p, n, blob, size, c);
        if (rc == 0 && !o->no_direct && !too_big)
            rc = run_direct(p, n, blob, size, d);
        printf("%-6s w%-4ld shared %8.3f s (put %.3f s), master sent %7.2f "
               "copies | direct %8.3f s\n", SIZES[si].name, n, c->time_s,
               c->put_s, c->master_bytes / (double)size, d->time_s);
        fflush(stdout);
        free(blob);
    }
    fiber_pool_free(p);
    return rc;
}

/* ---- output ------------------------------------------------------------------ */

static void json_cells(const struct options *o,
                       struct cell (*cells)[N_SIZES])
{
    for (int wi = 0; wi < o->n_workers; wi++)
        for (int si = 0; si < N_SIZES; si++) {
            const char *k = bench_key("time_s_%s_w%ld", SIZES[si].name,
                                      o->workers[wi]);
            if (cells[wi][si].time_s < 0)
                bench_json_null(k);
            else
                bench_json_num(k, 4, cells[wi][si].time_s);
            k = bench_key("master_bytes_%s_w%ld", SIZES[si].name,
                          o->workers[wi]);
            if (cells[wi][si].time_s < 0)
                bench_json_null(k);
            else
                bench_json_num(k, 0, cells[wi][si].master_bytes);
        }
}

static void print_peer(const struct options *o, const char *peer)
{
    bench_json_open("peer");
    for (int wi = 0; wi < o->n_workers; wi++)
        for (int si = 0; si < N_SIZES; si++)
            for (int k = 0; k < 2; k++) {
                const char *key = bench_key(k ? "master_bytes_%s_w%ld"
                                              : "time_s_%s_w%ld",
                                            SIZES[si].name, o->workers[wi]);
                double v;
                char name[64];
                snprintf(name, sizeof name, "%s", key);
                if (bench_json_number(peer, name, &v) == 0)
                    bench_json_num(name, k ? 0 : 4, v);
                else
                    bench_json_null(name);
            }
    bench_json_close();
}

static int parse_workers(const char *prog, const char *text, void *ctx)
{
    struct options *o = ctx;
    o->n_workers = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", text);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        if (o->n_workers == MAX_N ||
            bench_parse_long(prog, "--workers", tok, 1, 4096,
                             &o->workers[o->n_workers]) != 0)
            return -1;
        o->n_workers++;
    }
    return o->n_workers ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--workers N,N,...] [--no-direct] "
               "[--no-shm] [--no-peer]\n"
               "  --no-shm  same-host workers receive the blob (from the "
               "master and relays)\n            instead of mapping the "
               "master's copy\n"
               "A 1 MiB and a 64 MiB object to every worker of pools of N "
               "(default 8,64,512):\n"
               "shared objects against the master sending each worker a "
               "copy, and multiprocessing.Pool.\n");
}

int main(int argc, char **argv)
{
    /* The direct baseline sends 64 MiB task arguments. */
    fiber_config_set("max_message_bytes", "268435456");
    if (bench_init(PROG, &argc, &argv) != 0)
        return 1;
    struct options o = {{8, 64, 512}, 3, 0, 0};
    const struct bench_flag flags[] = {
        {"--workers", .parse = parse_workers, .ctx = &o},
        {"--no-peer", .on = &o.no_peer},
        {"--no-direct", .on = &o.no_direct},
        {"--no-shm", .on = &o.no_shm},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    /* Send blobs to every worker (relays) instead of mapping the
     * master's copy. */
    if (o.no_shm && fiber_config_set("object_shm", "false") != 0)
        return 1;
    static struct result r;
    for (int wi = 0; wi < MAX_N; wi++)
        for (int si = 0; si < N_SIZES; si++)
            r.fiber[wi][si] = r.direct[wi][si] = (struct cell){-1, -1, -1};
    r.single_s = single_transfer_s();
    printf(PROG ": fiber %s; one 64 MiB transfer between two processes: "
           "%.4f s (median of 5)\n", fiber_version(), r.single_s);
    unsigned seed = 0;
    for (int wi = 0; wi < o.n_workers; wi++)
        if (run_workers(&o, wi, &r, &seed) != 0) {
            fprintf(stderr, PROG ": FAILED\n");
            return 1;
        }
    char peer[4096] = "";
    int have_peer = 0;
    if (!o.no_peer) {
        char args[128] = "--workers ";
        for (int wi = 0; wi < o.n_workers; wi++)
            snprintf(args + strlen(args), sizeof args - strlen(args), "%s%ld",
                     wi ? "," : "", o.workers[wi]);
        have_peer = bench_peer_done(
            PROG, bench_run_peer(PROG, "broadcast_peer.py", args, peer,
                                 sizeof peer));
    }
    printf("\n%-14s %10s %14s %10s %10s\n", "", "shared (s)", "master copies",
           "direct (s)", "mp (s)");
    for (int wi = 0; wi < o.n_workers; wi++)
        for (int si = 0; si < N_SIZES; si++) {
            double mp = -1;
            if (have_peer)
                bench_json_number(peer,
                                  bench_key("time_s_%s_w%ld", SIZES[si].name,
                                            o.workers[wi]),
                                  &mp);
            struct cell *c = &r.fiber[wi][si];
            printf("%-6s w%-6ld %10.3f %14.2f %10.3f %10.3f\n",
                   SIZES[si].name, o.workers[wi], c->time_s,
                   c->master_bytes / (double)SIZES[si].bytes,
                   r.direct[wi][si].time_s, mp);
        }
    printf("(-1: not run; time at 64 workers against one 64 MiB transfer: "
           "see time_s_64mib_w64 / single_transfer_s_64mib)\n\n");
    bench_json_open(NULL);
    json_cells(&o, r.fiber);
    bench_json_num("single_transfer_s_64mib", 4, r.single_s);
    bench_json_open("direct");
    json_cells(&o, r.direct);
    bench_json_close();
    if (have_peer)
        print_peer(&o, peer);
    else
        bench_json_null("peer");
    bench_json_close();
    return 0;
}
