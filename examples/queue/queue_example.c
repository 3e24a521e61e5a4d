/*
 * queue_example.c -- a work queue between processes with fiber_queue
 * (docs/queue.md explains it line by line).
 *
 * The master creates two queues on its object server: `jobs`, bounded to
 * 4 messages, and `results`, unbounded.  It starts three worker processes
 * and gives each the serialised handles in its argument.  Every worker
 * takes numbers from `jobs` until the queue is closed and empty, and puts
 * "n squared" back on `results`.  The master feeds 20 numbers (its puts
 * wait while `jobs` is full: backpressure), closes `jobs`, collects the
 * 20 answers, and finally shows what the timeouts and a closed queue
 * return.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <fiber/fiber.h>

#define N_WORKERS 3
#define N_JOBS 20
#define HANDLE_MAX 256 /* a serialised handle is tens of bytes */

/* A worker's argument: the two serialised handles, back to back. */
struct worker_arg {
    uint32_t jobs_len, results_len;
    unsigned char jobs[HANDLE_MAX], results[HANDLE_MAX];
};

/* One answer on the results queue. */
struct answer {
    int32_t n, square;
};

/* Takes numbers until `jobs` is closed and drained; returns how many it
 * took (the process's exit code). */
FIBER_TASK(square_worker)
{
    struct worker_arg a;
    if (len != sizeof a)
        return fiber_task_fail("square_worker wants a struct worker_arg");
    memcpy(&a, arg, sizeof a);
    fiber_queue *jobs, *results;
    if (fiber_queue_open(&jobs, a.jobs, a.jobs_len) != 0 ||
        fiber_queue_open(&results, a.results, a.results_len) != 0)
        return fiber_task_fail("open: %s", fiber_last_error());
    fiber_buf msg = {0};
    int taken = 0, rc;
    /* -1: wait as long as it takes; FIBER_ECLOSED ends the loop once the
     * master has closed the queue and every job has been taken. */
    while ((rc = fiber_queue_get(jobs, &msg, -1)) == 0) {
        int32_t n;
        memcpy(&n, msg.data, sizeof n);
        msg.len = 0; /* reuse the buffer: get appends */
        struct timespec work = {0, 10 * 1000 * 1000}; /* 10 ms of "work" */
        nanosleep(&work, NULL);
        struct answer ans = {n, n * n};
        if (fiber_queue_put(results, &ans, sizeof ans, -1) != 0)
            break;
        taken++;
    }
    fiber_buf_free(&msg);
    fiber_queue_free(jobs);
    fiber_queue_free(results);
    if (rc != FIBER_ECLOSED)
        return fiber_task_fail("get: %s", fiber_last_error());
    return taken;
}

static int serialise(fiber_queue *q, unsigned char *dst, uint32_t *len)
{
    fiber_buf b = {0};
    int rc = fiber_queue_serialize(q, &b);
    if (rc == 0 && b.len > HANDLE_MAX)
        rc = FIBER_ETOOBIG;
    if (rc == 0) {
        memcpy(dst, b.data, b.len);
        *len = (uint32_t)b.len;
    }
    fiber_buf_free(&b);
    return rc;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* children never return here */
        fprintf(stderr, "fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    fiber_queue *jobs, *results;
    if (fiber_queue_create(&jobs, 4) != 0 ||   /* at most 4 waiting */
        fiber_queue_create(&results, 0) != 0) { /* 0: unbounded */
        fprintf(stderr, "create: %s\n", fiber_last_error());
        return 1;
    }

    /* Hand the queues to the workers in their argument. */
    struct worker_arg a;
    memset(&a, 0, sizeof a);
    if (serialise(jobs, a.jobs, &a.jobs_len) != 0 ||
        serialise(results, a.results, &a.results_len) != 0) {
        fprintf(stderr, "serialize: %s\n", fiber_last_error());
        return 1;
    }
    printf("a serialised handle is %u bytes\n", a.jobs_len);
    fiber_process *workers[N_WORKERS];
    for (int i = 0; i < N_WORKERS; i++) {
        if (fiber_process_start(&workers[i], "square_worker", &a, sizeof a,
                                NULL) != 0) {
            fprintf(stderr, "start: %s\n", fiber_last_error());
            return 1;
        }
    }

    /* Feed the jobs.  With room for 4, a put waits until a worker has
     * taken one: the producer cannot run ahead of the consumers. */
    for (int32_t n = 1; n <= N_JOBS; n++) {
        if (fiber_queue_put(jobs, &n, sizeof n, 10000) != 0) {
            fprintf(stderr, "put: %s\n", fiber_last_error());
            return 1;
        }
    }
    /* No more jobs: workers drain what is left, then get FIBER_ECLOSED. */
    fiber_queue_close(jobs);

    int64_t sum = 0;
    fiber_buf msg = {0};
    for (int i = 0; i < N_JOBS; i++) {
        msg.len = 0;
        if (fiber_queue_get(results, &msg, 10000) != 0) {
            fprintf(stderr, "get: %s\n", fiber_last_error());
            return 1;
        }
        struct answer ans;
        memcpy(&ans, msg.data, sizeof ans);
        sum += ans.square;
    }
    printf("sum of the squares of 1..%d: %lld (expected %d)\n", N_JOBS,
           (long long)sum, N_JOBS * (N_JOBS + 1) * (2 * N_JOBS + 1) / 6);

    int total = 0;
    for (int i = 0; i < N_WORKERS; i++) {
        int taken = -1;
        fiber_process_join(workers[i], -1);
        fiber_process_exitcode(workers[i], &taken);
        printf("  %s took %d jobs\n", fiber_process_name(workers[i]), taken);
        total += taken;
        fiber_process_free(workers[i]);
    }
    printf("jobs taken in all: %d\n", total);

    /* What an empty, a waited-on and a closed queue return. */
    int rc = fiber_queue_get(results, &msg, 0);
    printf("get, timeout 0, empty queue:   %s\n", fiber_errname(rc));
    rc = fiber_queue_get(results, &msg, 50);
    printf("get, timeout 50 ms, empty:     %s\n", fiber_errname(rc));
    int32_t late = 99;
    rc = fiber_queue_put(jobs, &late, sizeof late, 0);
    printf("put on the closed queue:       %s (%s)\n", fiber_errname(rc),
           fiber_last_error());
    rc = fiber_queue_get(jobs, &msg, -1);
    printf("get, closed and drained queue: %s\n", fiber_errname(rc));

    fiber_buf_free(&msg);
    fiber_queue_free(jobs);
    fiber_queue_free(results);
    return sum == N_JOBS * (N_JOBS + 1) * (2 * N_JOBS + 1) / 6 &&
                   total == N_JOBS
               ? 0
               : 1;
}
