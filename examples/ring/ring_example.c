/*
 * ring_example.c -- data-parallel training with fiber_ring (docs/ring.md
 * explains it).
 *
 * A linear model y = w.x is fitted by gradient descent on data split
 * between N worker processes.  Each worker holds its own shard, which the
 * others never see; every step, each computes the gradient of the mean
 * squared error on its shard and the workers average their gradients with
 * fiber_ring_allreduce(FIBER_MEAN), so every worker takes the same step
 * and the weights stay identical everywhere without being sent around.
 * Rank 0 draws the starting weights and fiber_ring_broadcast gives them to
 * the others.  Rank 0 reports progress to the master through a queue.
 *
 *     ring-example [workers]      (default 4)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fiber/fiber.h>

#define DIM 8          /* features */
#define SHARD 20000    /* samples per worker */
#define STEPS 40
#define RATE 0.5f
#define HANDLE_MAX 320
#define TIMEOUT_MS 60000

/* The weights the data was made from, which training should find. */
static const float w_true[DIM] = {1.5f, -2, 0.5f, 3, -1, 0.25f, 2, -0.75f};

/* A worker's argument: its rank and the serialised ring and queue. */
struct worker_arg {
    int32_t rank;
    uint32_t ring_len, queue_len;
    unsigned char ring[HANDLE_MAX], queue[HANDLE_MAX];
};

/* A small deterministic generator, so each worker's shard depends only on
 * its rank. */
static float uniform(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*state >> 40) * 0x1p-24f * 2 - 1; /* [-1, 1) */
}

static void make_shard(int rank, float *x, float *y)
{
    uint64_t state = 12345 + (uint64_t)rank;
    for (int i = 0; i < SHARD; i++) {
        y[i] = 0.01f * uniform(&state); /* noise */
        for (int d = 0; d < DIM; d++) {
            x[i * DIM + d] = uniform(&state);
            y[i] += w_true[d] * x[i * DIM + d];
        }
    }
}

/* The gradient of the mean squared error on the shard, into grad[0..DIM),
 * and the loss into grad[DIM], so that one allreduce averages both. */
static void gradient(const float *w, const float *x, const float *y,
                     float *grad)
{
    memset(grad, 0, (DIM + 1) * sizeof *grad);
    for (int i = 0; i < SHARD; i++) {
        float err = -y[i];
        for (int d = 0; d < DIM; d++)
            err += w[d] * x[i * DIM + d];
        for (int d = 0; d < DIM; d++)
            grad[d] += 2 * err * x[i * DIM + d] / SHARD;
        grad[DIM] += err * err / SHARD;
    }
}

static int train(fiber_ring *ring, fiber_queue *q, int rank)
{
    float *x = malloc(sizeof(float) * SHARD * DIM);
    float *y = malloc(sizeof(float) * SHARD);
    float w[DIM] = {0}, grad[DIM + 1];
    char line[256];
    if (!x || !y)
        return fiber_task_fail("out of memory");
    make_shard(rank, x, y);
    uint64_t state = 777; /* only rank 0's draw counts: it is broadcast */
    for (int d = 0; d < DIM; d++)
        w[d] = uniform(&state);
    int rc = fiber_ring_broadcast(ring, w, sizeof w, 0, TIMEOUT_MS);
    for (int step = 0; step < STEPS && rc == 0; step++) {
        gradient(w, x, y, grad);
        rc = fiber_ring_allreduce(ring, grad, DIM + 1, FIBER_FLOAT32,
                                  FIBER_MEAN, TIMEOUT_MS);
        for (int d = 0; d < DIM && rc == 0; d++)
            w[d] -= RATE * grad[d];
        if (rc == 0 && rank == 0 && step % 5 == 0) {
            snprintf(line, sizeof line, "step %2d  loss %.6f", step,
                     grad[DIM]);
            rc = fiber_queue_put(q, line, strlen(line) + 1, TIMEOUT_MS);
        }
    }
    if (rc == 0 && rank == 0)
        rc = fiber_queue_put(q, w, sizeof w, TIMEOUT_MS); /* the result */
    free(x);
    free(y);
    return rc ? fiber_task_fail("rank %d: %s", rank, fiber_last_error()) : 0;
}

FIBER_TASK(ring_worker)
{
    struct worker_arg a;
    if (len != sizeof a)
        return fiber_task_fail("want a struct worker_arg");
    memcpy(&a, arg, sizeof a);
    fiber_ring *ring;
    fiber_queue *q;
    if (fiber_queue_open(&q, a.queue, a.queue_len) != 0)
        return fiber_task_fail("queue: %s", fiber_last_error());
    if (fiber_ring_join(&ring, a.ring, a.ring_len, a.rank, TIMEOUT_MS) != 0)
        return fiber_task_fail("join: %s", fiber_last_error());
    int rc = train(ring, q, a.rank);
    fiber_ring_free(ring);
    fiber_queue_free(q);
    return rc;
}

/* ---- the master ------------------------------------------------------- */

static int copy_handle(int rc, fiber_buf *b, unsigned char *dst,
                       uint32_t *len)
{
    if (rc == 0 && b->len > HANDLE_MAX)
        rc = FIBER_ETOOBIG;
    if (rc == 0) {
        memcpy(dst, b->data, b->len);
        *len = (uint32_t)b->len;
    }
    b->len = 0;
    return rc;
}

/* Prints rank 0's progress lines; the last message is the weights. */
static int report(fiber_queue *q)
{
    fiber_buf msg = {0};
    int rc;
    while ((rc = fiber_queue_get(q, &msg, TIMEOUT_MS)) == 0 &&
           msg.len != sizeof(float) * DIM) {
        printf("%s\n", (const char *)msg.data);
        msg.len = 0;
    }
    if (rc == 0) {
        const float *w = (const float *)msg.data;
        printf("\n%9s %9s\n", "learned", "true");
        for (int d = 0; d < DIM; d++)
            printf("%9.4f %9.4f\n", w[d], w_true[d]);
    }
    fiber_buf_free(&msg);
    return rc;
}

static int run(int n)
{
    fiber_ring *ring;
    fiber_queue *q;
    fiber_buf b = {0};
    struct worker_arg a = {0};
    fiber_process *p[64];
    int rc = fiber_ring_create(&ring, n);
    if (rc || (rc = fiber_queue_create(&q, 0)) != 0)
        return rc;
    rc = copy_handle(fiber_ring_serialize(ring, &b), &b, a.ring, &a.ring_len);
    if (rc == 0)
        rc = copy_handle(fiber_queue_serialize(q, &b), &b, a.queue,
                         &a.queue_len);
    int started = 0;
    for (; rc == 0 && started < n; started++) {
        a.rank = started;
        rc = fiber_process_start(&p[started], "ring_worker", &a, sizeof a,
                                 NULL);
        if (rc)
            break;
    }
    if (rc == 0)
        rc = report(q);
    for (int i = 0; i < started; i++) {
        int code = -1;
        fiber_process_join(p[i], TIMEOUT_MS);
        fiber_process_exitcode(p[i], &code);
        if (code != 0 && rc == 0)
            rc = FIBER_ETASK;
        fiber_process_free(p[i]);
    }
    fiber_buf_free(&b);
    fiber_queue_free(q);
    fiber_ring_free(ring);
    return rc;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) { /* workers never return */
        fprintf(stderr, "fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (n < 1 || n > 64) {
        fprintf(stderr, "usage: ring-example [workers, 1..64]\n");
        return 2;
    }
    printf("fitting %d weights on %d x %d samples with %d workers\n", DIM,
           n, SHARD, n);
    int rc = run(n);
    if (rc) {
        fprintf(stderr, "ring-example: %s: %s\n", fiber_errname(rc),
                fiber_last_error());
        return 1;
    }
    return 0;
}
