/*
 * bench_ring.c -- fiber_ring_allreduce bandwidth between local processes.
 *
 * For N = 2, 4 and 8 the master creates a ring and starts N member
 * processes (fiber_process_start, the serialised ring and a result queue
 * in the argument).  Each member joins, then for each array size (1 MiB
 * and 64 MiB of floats) runs one untimed allreduce and then --rounds timed
 * ones.  Before each timed call the members line up with a one-element
 * allreduce, so that they start within a few microseconds of each other;
 * each member times its own call, and a round takes as long as its slowest
 * member.  The figure is the median round.
 *
 * Reported as bus bandwidth, the convention of NCCL's tests: 2(N-1)/N *
 * bytes / time, the bytes each member sends (and receives) over its links
 * per second, which for a perfect ring does not depend on N.  It is set
 * beside a memcpy of the same size in one process, the speed of the
 * memory the bytes cross: on one machine every byte a member sends is
 * copied into the kernel and out again, and added, so a fraction of
 * memcpy is the ceiling.  With more members than cores (4 and 8 on a
 * 2-core machine) the members share the cores, and busbw falls about as
 * cores/N: the figures then show what oversubscription costs.
 *
 * Python's multiprocessing has no allreduce, so there is no peer: "peer"
 * is null, with a note saying why.  Output: progress and a table on
 * stdout, then as the LAST line one JSON object; diagnostics on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#include "bench_common.h"

#define PROG "bench-ring"
#define N_RINGS 3
#define N_SIZES 2
#define MAX_ROUNDS 100
#define HANDLE_MAX 320
#define CALL_TIMEOUT_MS 600000 /* one call; 64 MiB on 8 members is slow */
#define MEMCPY_ROUNDS 9

static const int ring_sizes[N_RINGS] = {2, 4, 8};
static const size_t array_bytes[N_SIZES] = {1u << 20, 64u << 20};
static const char *const size_names[N_SIZES] = {"1mib", "64mib"};

/* A member's argument. */
struct member_arg {
    int32_t rank, rounds;
    uint32_t ring_len, queue_len;
    unsigned char ring[HANDLE_MAX], queue[HANDLE_MAX];
};

/* What a member reports per array size: its own time for each round. */
struct member_times {
    int32_t rank, size_index, rc, rounds;
    double seconds[MAX_ROUNDS];
};

/* ---- the member ------------------------------------------------------ */

/* One timed round: line up, then time the allreduce. */
static int timed_round(fiber_ring *r, float *data, size_t count, double *s)
{
    float one = 1;
    int rc = fiber_ring_allreduce(r, &one, 1, FIBER_FLOAT32, FIBER_SUM,
                                  CALL_TIMEOUT_MS);
    double t0 = bench_now_s();
    if (rc == 0)
        rc = fiber_ring_allreduce(r, data, count, FIBER_FLOAT32, FIBER_SUM,
                                  CALL_TIMEOUT_MS);
    *s = bench_now_s() - t0;
    return rc;
}

static int measure_size(fiber_ring *r, fiber_queue *q,
                        const struct member_arg *a, int index)
{
    size_t count = array_bytes[index] / sizeof(float);
    float *data = malloc(array_bytes[index]);
    struct member_times t = {a->rank, index, 0, a->rounds, {0}};
    if (!data)
        return 2;
    for (size_t i = 0; i < count; i++) /* small, so sums stay finite */
        data[i] = (float)(i % 97) * 1e-3f;
    double ignored;
    t.rc = timed_round(r, data, count, &ignored); /* warm-up */
    for (int k = 0; k < a->rounds && t.rc == 0; k++)
        t.rc = timed_round(r, data, count, &t.seconds[k]);
    if (t.rc)
        fprintf(stderr, PROG ": rank %d: %s\n", a->rank, fiber_last_error());
    free(data);
    int put = fiber_queue_put(q, &t, sizeof t, CALL_TIMEOUT_MS);
    return t.rc || put ? 3 : 0;
}

FIBER_TASK(bench_ring_member)
{
    struct member_arg a;
    if (len != sizeof a)
        return fiber_task_fail("bad argument");
    memcpy(&a, arg, sizeof a);
    fiber_queue *q;
    fiber_ring *r;
    if (fiber_queue_open(&q, a.queue, a.queue_len) != 0)
        return fiber_task_fail("queue: %s", fiber_last_error());
    if (fiber_ring_join(&r, a.ring, a.ring_len, a.rank, 120000) != 0)
        return fiber_task_fail("join: %s", fiber_last_error());
    int code = 0;
    for (int i = 0; i < N_SIZES && code == 0; i++)
        code = measure_size(r, q, &a, i);
    fiber_ring_free(r);
    fiber_queue_free(q);
    return code;
}

/* ---- the master ---------------------------------------------------------- */

struct result {
    double median_s[N_SIZES];
    double busbw[N_SIZES]; /* GB/s, 1e9 bytes */
};

static int serialize_into(unsigned char *dst, uint32_t *len, int rc,
                          fiber_buf *b)
{
    if (rc || b->len > HANDLE_MAX) {
        fprintf(stderr, PROG ": serialise: %s\n", fiber_last_error());
        return -1;
    }
    memcpy(dst, b->data, b->len);
    *len = (uint32_t)b->len;
    b->len = 0;
    return 0;
}

static int make_arg(fiber_ring *r, fiber_queue *q, int rounds,
                    struct member_arg *a)
{
    fiber_buf b = {0};
    memset(a, 0, sizeof *a);
    a->rounds = rounds;
    int rc = serialize_into(a->ring, &a->ring_len,
                            fiber_ring_serialize(r, &b), &b);
    if (rc == 0)
        rc = serialize_into(a->queue, &a->queue_len,
                            fiber_queue_serialize(q, &b), &b);
    fiber_buf_free(&b);
    return rc;
}

/* Takes the n members' reports of each size; a round's time is its
 * slowest member's. */
static int collect(fiber_queue *q, int n, int rounds, struct result *res)
{
    double worst[N_SIZES][MAX_ROUNDS] = {{0}};
    fiber_buf b = {0};
    int rc = 0;
    for (int k = 0; k < n * N_SIZES && rc == 0; k++) {
        b.len = 0;
        struct member_times t;
        rc = fiber_queue_get(q, &b, CALL_TIMEOUT_MS);
        if (rc == 0 && b.len != sizeof t)
            rc = -1;
        if (rc == 0)
            memcpy(&t, b.data, sizeof t);
        if (rc == 0 && (t.rc || t.size_index < 0 || t.size_index >= N_SIZES))
            rc = -1;
        for (int i = 0; rc == 0 && i < rounds; i++)
            if (t.seconds[i] > worst[t.size_index][i])
                worst[t.size_index][i] = t.seconds[i];
    }
    fiber_buf_free(&b);
    if (rc) {
        fprintf(stderr, PROG ": N=%d: a member failed: %s\n", n,
                fiber_last_error());
        return -1;
    }
    for (int s = 0; s < N_SIZES; s++) {
        res->median_s[s] = bench_median(worst[s], (size_t)rounds);
        res->busbw[s] = 2.0 * (n - 1) / n * (double)array_bytes[s] /
                        res->median_s[s] / 1e9;
    }
    return 0;
}

static int join_members(fiber_process **p, int started)
{
    int bad = 0;
    for (int i = 0; i < started; i++) {
        int code = -1;
        if (fiber_process_join(p[i], CALL_TIMEOUT_MS) != 0 ||
            fiber_process_exitcode(p[i], &code) != 0 || code != 0) {
            fprintf(stderr, PROG ": member %d ended with %d\n", i, code);
            bad = 1;
        }
        fiber_process_free(p[i]);
    }
    return bad ? -1 : 0;
}

/* Runs one ring of n members over both sizes. */
static int run_ring(int n, int rounds, struct result *res)
{
    fiber_ring *r = NULL;
    fiber_queue *q = NULL;
    fiber_process *procs[8];
    struct member_arg a;
    int started = 0;
    int rc = fiber_ring_create(&r, n) || fiber_queue_create(&q, 0) ? -1 : 0;
    if (rc == 0)
        rc = make_arg(r, q, rounds, &a);
    while (rc == 0 && started < n) {
        a.rank = started;
        if (fiber_process_start(&procs[started], "bench_ring_member", &a,
                                sizeof a, NULL) != 0)
            rc = -1;
        else
            started++;
    }
    if (rc)
        fprintf(stderr, PROG ": N=%d: %s\n", n, fiber_last_error());
    if (rc == 0)
        rc = collect(q, n, rounds, res);
    if (join_members(procs, started) != 0)
        rc = -1;
    fiber_ring_free(r);
    fiber_queue_free(q);
    return rc;
}

/* memcpy of bytes between two buffers that are already mapped; GB/s of
 * the median round. */
static double memcpy_gbps(size_t bytes)
{
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    double s[MEMCPY_ROUNDS];
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    for (int k = 0; k < MEMCPY_ROUNDS; k++) {
        double t0 = bench_now_s();
        memcpy(dst, src, bytes);
        s[k] = bench_now_s() - t0;
        src[k] = dst[bytes - 1 - (size_t)k]; /* keep the copies live */
    }
    free(src);
    free(dst);
    return (double)bytes / bench_median(s, MEMCPY_ROUNDS) / 1e9;
}

/* ---- output ------------------------------------------------------------ */

static void print_table(const struct result res[N_RINGS], double memcpy64,
                        double memcpy1)
{
    printf("\n%4s %8s %12s %14s %12s\n", "N", "array", "median ms",
           "busbw GB/s", "of memcpy");
    for (int i = 0; i < N_RINGS; i++)
        for (int s = 0; s < N_SIZES; s++)
            printf("%4d %8s %12.3f %14.3f %11.1f%%\n", ring_sizes[i],
                   s ? "64 MiB" : "1 MiB", res[i].median_s[s] * 1e3,
                   res[i].busbw[s],
                   100 * res[i].busbw[s] / (s ? memcpy64 : memcpy1));
    printf("memcpy in one process: %.3f GB/s (1 MiB), %.3f GB/s (64 MiB)\n",
           memcpy1, memcpy64);
    printf("(busbw = 2(N-1)/N * bytes / time, GB = 1e9 bytes; medians of the "
           "slowest member per round)\n\n");
}

static void print_json(const struct result res[N_RINGS], double memcpy64,
                       double memcpy1)
{
    bench_json_open(NULL);
    for (int s = 0; s < N_SIZES; s++)
        for (int i = 0; i < N_RINGS; i++)
            bench_json_num(bench_key("busbw_gbps_%s_n%d", size_names[s],
                                     ring_sizes[i]),
                           4, res[i].busbw[s]);
    for (int s = 0; s < N_SIZES; s++)
        for (int i = 0; i < N_RINGS; i++)
            bench_json_num(bench_key("ms_%s_n%d", size_names[s],
                                     ring_sizes[i]),
                           4, res[i].median_s[s] * 1e3);
    for (int i = 0; i < N_RINGS; i++)
        bench_json_num(bench_key("ratio_to_memcpy_64mib_n%d", ring_sizes[i]),
                       4, res[i].busbw[1] / memcpy64);
    bench_json_num("memcpy_gbps_1mib", 4, memcpy1);
    bench_json_num("memcpy_gbps_64mib", 4, memcpy64);
    bench_json_null("peer");
    bench_json_string("peer_note",
                      "Python multiprocessing has no allreduce; no peer is "
                      "run");
    bench_json_close();
}

/* ---- main -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--rounds R] [--help]\n"
               "Allreduce of 1 MiB and 64 MiB float arrays over rings of 2, "
               "4 and 8 local\nprocesses: bus bandwidth of the median round, "
               "beside memcpy.\n"
               "  --rounds R  timed rounds per size (default 9)\n"
               "The last line of output is one JSON object.\n");
}

int main(int argc, char **argv)
{
    if (bench_init(PROG, &argc, &argv) != 0) /* members never return */
        return 1;
    long rounds = 9;
    const struct bench_flag flags[] = {
        {"--rounds", .value = &rounds, .lo = 1, .hi = MAX_ROUNDS},
        {NULL},
    };
    int rc = bench_parse_args(PROG, argc, argv, flags);
    if (rc != 0)
        return bench_usage_exit(rc, usage);
    printf(PROG ": fiber %s, local processes, float32 sum, %ld rounds\n",
           fiber_version(), rounds);
    struct result res[N_RINGS];
    for (int i = 0; i < N_RINGS; i++) {
        if (run_ring(ring_sizes[i], (int)rounds, &res[i]) != 0) {
            fprintf(stderr, PROG ": FAILED\n");
            return 1;
        }
        printf("N=%d: %.3f GB/s (1 MiB), %.3f GB/s (64 MiB)\n", ring_sizes[i],
               res[i].busbw[0], res[i].busbw[1]);
        fflush(stdout);
    }
    double m64 = memcpy_gbps(array_bytes[1]), m1 = memcpy_gbps(array_bytes[0]);
    print_table(res, m64, m1);
    print_json(res, m64, m1);
    return 0;
}
