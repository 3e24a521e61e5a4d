/*
 * bench_es_paper.c -- bench-es (c): the Fiber paper's scale.  A population
 * of 2,048 evaluations per iteration of a policy of 100,000 float
 * parameters (400,000 bytes), at 1 .. --paper-max-workers workers, with
 * the environment taken out (the task touches the policy and returns),
 * so what is measured is what the master costs per iteration:
 *
 *   per_record  each record is a 40-byte header and the whole policy, as
 *               examples/es sent it before shared objects: 820 MB leave
 *               the master per iteration;
 *   shared      the policy is put once per iteration and is the map's
 *               shared argument (fiber_pool_shared); records are headers.
 *
 * For each: wall ms per iteration (pack, put, map), the master's CPU
 * seconds per iteration (getrusage, all its threads), and the bytes
 * it sent per iteration (records, plus blob bytes served, plus the copy
 * it writes to /dev/shm for same-host workers).  The first iteration of
 * each pool is a warm-up; the median of the next --paper-iters is kept.
 * The peer (peer/es_paper_peer.py) does the per-record form with
 * multiprocessing.Pool, pickling each record.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fiber/fiber.h>

#include "bench_common.h"
#include "bench_es_paper.h"

#define HEAD 40

/* This process's user + system CPU seconds, all threads (getrusage:
 * microseconds, where /proc/self/stat counts 10 ms ticks). */
static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* Reads one float of every 1,024 of the policy, wherever it is. */
static double touch(const float *theta, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i += 1024)
        s += theta[i];
    return s;
}

FIBER_TASK(bench_es_paper_record)
{
    if (len != HEAD + PAPER_PARAMS * sizeof(float))
        return fiber_task_fail("a record of %zu bytes", len);
    float *theta = malloc(PAPER_PARAMS * sizeof *theta);
    if (!theta)
        return fiber_task_fail("out of memory");
    memcpy(theta, (const char *)arg + HEAD, PAPER_PARAMS * sizeof *theta);
    double r[2] = {touch(theta, PAPER_PARAMS), (double)len};
    free(theta);
    return fiber_buf_append(out, r, sizeof r);
}

FIBER_TASK(bench_es_paper_shared)
{
    const void *data;
    size_t n;
    if (len != HEAD || fiber_task_shared(&data, &n) != 0 ||
        n != PAPER_PARAMS * sizeof(float))
        return fiber_task_fail("bad record or no shared policy: %s",
                               fiber_last_error());
    double r[2] = {touch(data, PAPER_PARAMS), (double)len};
    return fiber_buf_append(out, r, sizeof r);
}

/* One iteration in either form; adds its figures to *ms, *cpu, *bytes. */
static int iteration(fiber_pool *p, int shared, float *theta,
                     unsigned char *recs, double *res, uint64_t it,
                     double *ms, double *cpu, double *bytes)
{
    size_t rs = shared ? HEAD : HEAD + PAPER_PARAMS * sizeof(float);
    fiber_object_stats s0, s1;
    fiber_object_stats_get(&s0);
    double c0 = self_cpu_s(), t0 = bench_now_s();
    theta[it % PAPER_PARAMS] += 1.0f; /* a new policy each iteration */
    for (size_t i = 0; i < PAPER_POP; i++) {
        memcpy(recs + i * rs, &it, sizeof it);
        if (!shared)
            memcpy(recs + i * rs + HEAD, theta, PAPER_PARAMS * sizeof *theta);
    }
    fiber_ref ref;
    int rc = 0;
    if (shared && (rc = fiber_object_put(theta, PAPER_PARAMS * sizeof *theta,
                                         &ref)) == 0)
        fiber_pool_shared(&ref);
    if (rc == 0)
        rc = fiber_pool_map(p, shared ? "bench_es_paper_shared"
                                      : "bench_es_paper_record",
                            recs, rs, PAPER_POP, res, 2 * sizeof *res, 0);
    if (shared) {
        fiber_pool_shared(NULL);
        fiber_object_release(&ref);
    }
    *ms = (bench_now_s() - t0) * 1e3;
    *cpu = self_cpu_s() - c0;
    fiber_object_stats_get(&s1);
    *bytes = (double)PAPER_POP * (double)rs +
             (double)(s1.bytes_served - s0.bytes_served) +
             (double)(s1.shm_bytes - s0.shm_bytes);
    if (rc)
        fprintf(stderr, "bench-es (c): %s\n", fiber_last_error());
    return rc;
}

static int measure(fiber_pool *p, int shared, int iters, struct paper_row *row)
{
    float *theta = calloc(PAPER_PARAMS, sizeof *theta);
    size_t rs = shared ? HEAD : HEAD + PAPER_PARAMS * sizeof(float);
    unsigned char *recs = calloc(PAPER_POP, rs);
    double *res = calloc(2 * PAPER_POP, sizeof *res);
    double ms[64], cpu[64], bytes[64];
    int rc = theta && recs && res ? 0 : -1;
    for (int i = 0; rc == 0 && i <= iters && i < 64; i++)
        rc = iteration(p, shared, theta, recs, res, (uint64_t)i + 1, &ms[i],
                       &cpu[i], &bytes[i]);
    if (rc == 0) {
        int k = shared ? 1 : 0;
        row->ms[k] = bench_median(ms + 1, (size_t)iters);
        row->cpu_s[k] = bench_median(cpu + 1, (size_t)iters);
        row->bytes[k] = bench_median(bytes + 1, (size_t)iters);
    }
    free(theta);
    free(recs);
    free(res);
    return rc;
}

int bench_es_paper(int max_workers, int iters, struct paper_row *rows,
                   int *nrows)
{
    printf("\n(c) the paper's scale: %d evaluations of a %d-parameter policy "
           "per iteration, no environment\n", PAPER_POP, PAPER_PARAMS);
    printf("%8s %12s %12s %14s %12s %12s %14s\n", "workers", "per-record",
           "CPU s", "MB sent", "shared", "CPU s", "MB sent");
    *nrows = 0;
    static const int counts[] = {1, 2, 4, 16, 64, 256, 512};
    for (int ci = 0; ci < 7 && counts[ci] <= max_workers; ci++) {
        int w = counts[ci];
        fiber_pool *p;
        fiber_pool_opts po = {.workers = w};
        if (fiber_pool_create(&p, &po) != 0 ||
            fiber_pool_wait_ready(p, w, 600000) != 0) {
            fprintf(stderr, "bench-es (c): %d workers: %s\n", w,
                    fiber_last_error());
            return -1;
        }
        struct paper_row *row = &rows[*nrows];
        row->workers = w;
        int rc = measure(p, 0, iters, row);
        if (rc == 0)
            rc = measure(p, 1, iters, row);
        fiber_pool_free(p);
        if (rc)
            return -1;
        printf("%8d %10.1f ms %12.3f %14.1f %10.1f ms %12.3f %14.2f\n", w,
               row->ms[0], row->cpu_s[0], row->bytes[0] / 1e6, row->ms[1],
               row->cpu_s[1], row->bytes[1] / 1e6);
        fflush(stdout);
        (*nrows)++;
    }
    return 0;
}
