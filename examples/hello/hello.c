/*
 * hello.c -- fiber end to end: count the primes below 4,000,000 by
 * splitting the range over one process per CPU.
 *
 * Every process is a job of the configured backend (local processes by
 * default).  Each runs the task `count_primes` on its slice and returns
 * the count, which the master reads back as the process's exit code.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <fiber/fiber.h>

struct range {
    uint32_t lo, hi;
};

static int is_prime(uint32_t n)
{
    if (n < 2)
        return 0;
    for (uint32_t d = 2; d * d <= n; d++)
        if (n % d == 0)
            return 0;
    return 1;
}

FIBER_TASK(count_primes)
{
    struct range r;
    if (len != sizeof r)
        return fiber_task_fail("count_primes wants a struct range");
    memcpy(&r, arg, sizeof r);
    int count = 0;
    for (uint32_t n = r.lo; n < r.hi; n++)
        count += is_prime(n);
    return count;
}

int main(int argc, char **argv)
{
    int rc = fiber_init(&argc, &argv); /* children never return from here */
    if (rc) {
        fprintf(stderr, "fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    const uint32_t limit = 4000000;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nproc = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu;
    fiber_process *procs[64];

    printf("fiber %s, run %s: counting primes below %u with %d processes\n",
           fiber_version(), fiber_run_id(), limit, nproc);
    for (int i = 0; i < nproc; i++) {
        /* Interleaved slices would balance better; contiguous ones show
         * the per-process counts more plainly. */
        struct range r = {limit / (uint32_t)nproc * (uint32_t)i,
                          limit / (uint32_t)nproc * (uint32_t)(i + 1)};
        if (i == nproc - 1)
            r.hi = limit;
        rc = fiber_process_start(&procs[i], "count_primes", &r, sizeof r,
                                 NULL);
        if (rc) {
            fprintf(stderr, "start: %s\n", fiber_last_error());
            return 1;
        }
    }
    int total = 0;
    for (int i = 0; i < nproc; i++) {
        int count = 0;
        if (fiber_process_join(procs[i], -1) != 0 ||
            fiber_process_exitcode(procs[i], &count) != 0) {
            fprintf(stderr, "join: %s\n", fiber_last_error());
            return 1;
        }
        printf("  %-10s pid %-7ld found %d primes\n",
               fiber_process_name(procs[i]), fiber_process_pid(procs[i]),
               count);
        total += count;
        fiber_process_free(procs[i]);
    }
    printf("%d primes below %u (expected 283146): %s\n", total, limit,
           total == 283146 ? "correct" : "WRONG");
    return total == 283146 ? 0 : 1;
}
