/*
 * manager_example.c -- processes sharing state through a fiber_manager
 * (docs/manager.md explains it step by step).
 *
 * Four worker processes estimate pi by throwing random points at a unit
 * square.  They share, through one manager:
 *   - an event `go`, so that they all start together once the master says
 *     so;
 *   - a value `hits`, to which each adds its count (atomically: nothing is
 *     lost however the adds interleave);
 *   - a dict `reports`, where each files a line under its own name;
 *   - a lock `console`, held while printing so that lines do not mix;
 *   - a custom object `best` whose method `keep_max`, a task of this
 *     program that runs inside the manager, keeps the largest count seen.
 * The master then reads everything back, one call asynchronously.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fiber/fiber.h>

#define N_WORKERS 4
#define SAMPLES 200000
#define HANDLE_MAX 320 /* a serialised handle is tens of bytes */

enum { H_GO, H_HITS, H_REPORTS, H_CONSOLE, H_BEST, N_HANDLES };

/* A worker's argument: its number and the serialised handles. */
struct worker_arg {
    uint32_t id;
    uint32_t len[N_HANDLES];
    unsigned char handle[N_HANDLES][HANDLE_MAX];
};

/* A method of `best`, run inside the manager: its state is an int64, the
 * largest argument seen so far, which it also returns. */
FIBER_TASK(keep_max)
{
    fiber_buf *state;
    int64_t best = 0, x;
    if (len != sizeof x || fiber_manager_state(&state) != 0)
        return fiber_task_fail("keep_max wants an int64, as a method");
    memcpy(&x, arg, sizeof x);
    if (state->len == sizeof best)
        memcpy(&best, state->data, sizeof best);
    if (x > best) {
        best = x;
        state->len = 0;
        if (fiber_buf_append(state, &best, sizeof best) != 0)
            return fiber_task_fail("out of memory");
    }
    return fiber_buf_append(out, &best, sizeof best);
}

/* Counts the points of SAMPLES random ones that fall in the quarter
 * circle. */
static int64_t throw_points(unsigned seed)
{
    int64_t hits = 0;
    for (int i = 0; i < SAMPLES; i++) {
        double x = rand_r(&seed) / (double)RAND_MAX;
        double y = rand_r(&seed) / (double)RAND_MAX;
        hits += x * x + y * y <= 1.0;
    }
    return hits;
}

/* Files the worker's results in the shared objects. */
static int report(fiber_mobj **h, uint32_t id, int64_t hits)
{
    char name[32], line[96];
    snprintf(name, sizeof name, "worker-%u", id);
    int n = snprintf(line, sizeof line, "%lld of %d points inside",
                     (long long)hits, SAMPLES);
    int rc = fiber_value_add(h[H_HITS], hits, NULL, NULL);
    if (rc == 0)
        rc = fiber_dict_set(h[H_REPORTS], name, strlen(name), line,
                            (size_t)n, NULL);
    if (rc == 0)
        rc = fiber_custom_call(h[H_BEST], "keep_max", &hits, sizeof hits,
                               NULL, NULL);
    if (rc == 0)
        rc = fiber_lock_acquire(h[H_CONSOLE], -1, NULL);
    if (rc == 0) {
        printf("  %s (pid %d): %s\n", name, (int)getpid(), line);
        fflush(stdout);
        rc = fiber_lock_release(h[H_CONSOLE], NULL);
    }
    return rc;
}

FIBER_TASK(estimate)
{
    struct worker_arg a;
    fiber_mobj *h[N_HANDLES] = {NULL};
    if (len != sizeof a)
        return fiber_task_fail("estimate wants a struct worker_arg");
    memcpy(&a, arg, sizeof a);
    int rc = 0;
    for (int i = 0; i < N_HANDLES && rc == 0; i++)
        rc = fiber_mobj_open(&h[i], a.handle[i], a.len[i]);
    if (rc == 0) /* everyone starts together */
        rc = fiber_event_wait(h[H_GO], 30000, NULL);
    if (rc == 0)
        rc = report(h, a.id, throw_points(1234u + a.id));
    if (rc)
        fiber_task_fail("worker %u: %s", a.id, fiber_last_error());
    for (int i = 0; i < N_HANDLES; i++)
        fiber_mobj_free(h[i]);
    return rc ? FIBER_ETASK : 0;
}

/* Opens the five shared objects on m. */
static int open_objects(fiber_manager *m, fiber_mobj **h)
{
    int64_t zero = 0;
    int rc = fiber_manager_event(m, "go", &h[H_GO]);
    if (rc == 0)
        rc = fiber_manager_value(m, "hits", 0, &h[H_HITS]);
    if (rc == 0)
        rc = fiber_manager_dict(m, "reports", &h[H_REPORTS]);
    if (rc == 0)
        rc = fiber_manager_lock(m, "console", &h[H_CONSOLE]);
    if (rc == 0)
        rc = fiber_manager_custom(m, "best", &zero, sizeof zero,
                                  &h[H_BEST]);
    return rc;
}

static int start_workers(fiber_mobj **h, fiber_process **procs)
{
    struct worker_arg a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < N_HANDLES; i++) {
        fiber_buf b = {0};
        int rc = fiber_mobj_serialize(h[i], &b);
        if (rc == 0 && b.len > HANDLE_MAX)
            rc = FIBER_ETOOBIG;
        if (rc == 0)
            memcpy(a.handle[i], b.data, b.len);
        a.len[i] = (uint32_t)b.len;
        fiber_buf_free(&b);
        if (rc)
            return rc;
    }
    for (uint32_t id = 0; id < N_WORKERS; id++) {
        a.id = id;
        int rc = fiber_process_start(&procs[id], "estimate", &a, sizeof a,
                                     NULL);
        if (rc)
            return rc;
    }
    return 0;
}

/* Reads back what the workers shared. */
static int summarise(fiber_mobj **h)
{
    int64_t hits = 0, best = 0, zero = 0;
    size_t n = 0;
    fiber_future *f;
    fiber_buf b = {0};
    /* Asynchronous: the call is on its way while the next ones run. */
    int rc = fiber_custom_call(h[H_BEST], "keep_max", &zero, sizeof zero,
                               NULL, &f);
    if (rc == 0)
        rc = fiber_value_get(h[H_HITS], &hits, NULL);
    if (rc == 0)
        rc = fiber_dict_len(h[H_REPORTS], &n, NULL);
    if (rc == 0) {
        rc = fiber_future_get(f, &b, 10000); /* 8 bytes: an int64 */
        if (rc == 0)
            memcpy(&best, b.data, sizeof best);
        fiber_future_free(f);
    }
    fiber_buf_free(&b);
    if (rc == 0)
        printf("%zu reports; best worker: %lld hits; pi ~ %.4f\n", n,
               (long long)best, 4.0 * hits / (N_WORKERS * (double)SAMPLES));
    return rc;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* children never return here */
        fprintf(stderr, "fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    fiber_manager *m = NULL;
    fiber_mobj *h[N_HANDLES] = {NULL};
    fiber_process *procs[N_WORKERS] = {NULL};
    int rc = fiber_manager_start(&m, NULL);
    if (rc == 0)
        rc = open_objects(m, h);
    if (rc == 0)
        rc = start_workers(h, procs);
    if (rc == 0) {
        printf("%d workers started; go!\n", N_WORKERS);
        fflush(stdout);
        rc = fiber_event_set(h[H_GO], NULL);
    }
    for (int i = 0; i < N_WORKERS && procs[i]; i++) {
        int code = -1;
        if (fiber_process_join(procs[i], 60000) != 0 ||
            fiber_process_exitcode(procs[i], &code) != 0 || code != 0)
            rc = rc ? rc : FIBER_ETASK;
    }
    if (rc == 0)
        rc = summarise(h);
    if (rc)
        fprintf(stderr, "manager example: %s: %s\n", fiber_errname(rc),
                fiber_last_error());
    for (int i = 0; i < N_WORKERS; i++)
        fiber_process_free(procs[i]);
    for (int i = 0; i < N_HANDLES; i++)
        fiber_mobj_free(h[i]);
    fiber_manager_free(m);
    return rc ? 1 : 0;
}
