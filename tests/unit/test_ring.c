/*
 * test_ring.c -- fiber_ring across real child processes: allreduce against
 * a serial reduction computed here for several array sizes and ring sizes,
 * mean and max, broadcast from a non-zero root, members that die before or
 * during a collective, a member missing at the rendezvous or leaving it,
 * mismatched calls, timeouts, and hostile bytes on a member's socket.
 *
 * Every member's input is a deterministic function of (rank, index, call),
 * so the master can compute what each result must be.  Members report
 * through a fiber_queue: each result's hash, and rank 0's whole array;
 * since the ring gives every member bitwise identical results, equal
 * hashes plus one checked array check them all.  Exit codes carry the
 * verdicts of the failure cases.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "objsrv/objsrv.h"
#include "runtime/runtime.h"
#include "harness.h"

/* ring.c, for tests: the members waiting at the rendezvous. */
int fb_ring_peek(fiber_ring *r, char (*addrs)[600], int *joined, int *formed);

#define MAX_SIZES 4
#define MAX_N 8
#define JOIN_MS 60000
#define CALL_MS 60000

enum mode {
    M_REDUCE,    /* allreduce each size, report each result */
    M_BCAST,     /* broadcast each size from root, report each hash */
    M_ONCE,      /* after sleeping param ms, one allreduce: exit -rc */
    M_DIE_EARLY, /* SIGKILL itself right after joining */
    M_DIE_LATER, /* SIGKILL itself param ms into a stream of allreduces */
    M_SURVIVE,   /* allreduce until a call fails; exit -rc of it */
};

/* A member's argument: the serialised ring and queue, and what to do. */
struct ring_job {
    int32_t rank, mode, dtype, op, root, n_sizes, timeout_ms, param;
    int32_t join_ms; /* the join's timeout; 0: timeout_ms */
    uint64_t sizes[MAX_SIZES]; /* elements (bytes for broadcast) */
    uint32_t ring_len, queue_len;
    unsigned char ring[256], queue[256];
};

/* What a member reports per call; rank 0 appends its result. */
struct report {
    int32_t rank, index, rc, pad;
    uint64_t hash;
};

/* ---- deterministic data ------------------------------------------------ */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t bits(int rank, size_t i, int call)
{
    return mix(((uint64_t)rank << 48) ^ ((uint64_t)call << 40) ^ i);
}

/* Values in [-1, 1) with every significant bit in use, so that sums round
 * and their order matters. */
static float in_f32(int rank, size_t i, int call)
{
    return (float)((double)(bits(rank, i, call) >> 40) * 0x1p-23 - 1.0);
}

static double in_f64(int rank, size_t i, int call)
{
    return (double)(bits(rank, i, call) >> 11) * 0x1p-52 - 1.0;
}

static size_t elsize(int dtype) { return dtype == FIBER_FLOAT32 ? 4 : 8; }

static void fill(void *data, int dtype, int rank, size_t count, int call)
{
    for (size_t i = 0; i < count; i++) {
        if (dtype == FIBER_FLOAT32)
            ((float *)data)[i] = in_f32(rank, i, call);
        else
            ((double *)data)[i] = in_f64(rank, i, call);
    }
}

/* What broadcast's root sends in call `call`. */
static void fill_bytes(unsigned char *data, size_t bytes, int rank, int call)
{
    for (size_t i = 0; i < bytes; i++)
        data[i] = (unsigned char)bits(rank, i, call);
}

static uint64_t fnv(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the member (a child process) ----------------------------------- */

static void job_from(const void *arg, size_t len, struct ring_job *j)
{
    memset(j, 0, sizeof *j);
    memcpy(j, arg, len < sizeof *j ? len : sizeof *j);
}

/* Sends a call's result hash, and the result itself when whole is set. */
static int report(fiber_queue *q, int rank, int index, int rc,
                  const void *data, size_t len, int whole)
{
    struct report rep = {rank, index, rc, 0, fnv(data, len)};
    fiber_buf b = {0};
    fiber_buf_append(&b, &rep, sizeof rep);
    if (whole)
        fiber_buf_append(&b, data, len);
    int put = fiber_queue_put(q, b.data, b.len, CALL_MS);
    fiber_buf_free(&b);
    return put;
}

static int member_reduce(fiber_ring *r, fiber_queue *q,
                         const struct ring_job *j)
{
    for (int i = 0; i < j->n_sizes; i++) {
        size_t count = (size_t)j->sizes[i], bytes = count * elsize(j->dtype);
        void *data = malloc(bytes ? bytes : 1);
        fill(data, j->dtype, j->rank, count, i);
        int rc = fiber_ring_allreduce(r, data, count, j->dtype, j->op,
                                      j->timeout_ms);
        if (rc)
            fprintf(stderr, "rank %d: %s\n", j->rank, fiber_last_error());
        int put = report(q, j->rank, i, rc, data, bytes, j->rank == 0);
        free(data);
        if (rc || put)
            return 10 + i;
    }
    return 0;
}

static int member_bcast(fiber_ring *r, fiber_queue *q,
                        const struct ring_job *j)
{
    for (int i = 0; i < j->n_sizes; i++) {
        size_t bytes = (size_t)j->sizes[i];
        unsigned char *data = malloc(bytes ? bytes : 1);
        fill_bytes(data, bytes, j->rank, i); /* only root's must survive */
        int rc = fiber_ring_broadcast(r, data, bytes, j->root, j->timeout_ms);
        if (rc)
            fprintf(stderr, "rank %d: %s\n", j->rank, fiber_last_error());
        int put = report(q, j->rank, i, rc, data, bytes, 0);
        free(data);
        if (rc || put)
            return 10 + i;
    }
    return 0;
}

static void *killer(void *arg)
{
    sleep_ms(*(int *)arg);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* Allreduces until a call fails.  Returns -rc of the failure, plus 100
 * if the ring then did not refuse a further call with FIBER_ESTATE; 99 if
 * nothing failed. */
static int member_until_failure(fiber_ring *r, const struct ring_job *j)
{
    size_t count = (size_t)j->sizes[0];
    float *data = calloc(count ? count : 1, sizeof *data);
    int rc = 0;
    for (int i = 0; i < 2000 && rc == 0; i++)
        rc = fiber_ring_allreduce(r, data, count, FIBER_FLOAT32, FIBER_SUM,
                                  j->timeout_ms);
    fprintf(stderr, "rank %d: %s: %s\n", j->rank, fiber_errname(rc),
            fiber_last_error());
    int again = fiber_ring_allreduce(r, data, count, FIBER_FLOAT32,
                                     FIBER_SUM, j->timeout_ms);
    free(data);
    if (rc == 0)
        return 99;
    return -rc + (again == FIBER_ESTATE ? 0 : 100);
}

static int member_once(fiber_ring *r, const struct ring_job *j)
{
    sleep_ms(j->param);
    size_t count = (size_t)j->sizes[0] + (size_t)j->rank * (size_t)j->root;
    float *data = calloc(count ? count : 1, sizeof *data);
    int rc = fiber_ring_allreduce(r, data, count, FIBER_FLOAT32, FIBER_SUM,
                                  j->timeout_ms);
    fprintf(stderr, "rank %d: %s: %s\n", j->rank, fiber_errname(rc),
            fiber_last_error());
    free(data);
    return -rc;
}

static int member_run(fiber_ring *r, fiber_queue *q, const struct ring_job *j)
{
    pthread_t t;
    switch (j->mode) {
    case M_REDUCE:
        return member_reduce(r, q, j);
    case M_BCAST:
        return member_bcast(r, q, j);
    case M_ONCE:
        return member_once(r, j);
    case M_DIE_EARLY:
        kill(getpid(), SIGKILL);
        return 98;
    case M_DIE_LATER:
        pthread_create(&t, NULL, killer, (void *)&j->param);
        return member_until_failure(r, j);
    default:
        return member_until_failure(r, j);
    }
}

/* Exit codes: the mode's verdict; 50 + -rc when the join failed. */
FIBER_TASK(ring_member)
{
    struct ring_job j;
    job_from(arg, len, &j);
    fiber_queue *q = NULL;
    if (j.queue_len && fiber_queue_open(&q, j.queue, j.queue_len) != 0)
        return 90;
    fiber_ring *r;
    int rc = fiber_ring_join(&r, j.ring, j.ring_len, j.rank,
                             j.join_ms ? j.join_ms : j.timeout_ms);
    if (rc) {
        fprintf(stderr, "rank %d: join: %s\n", j.rank, fiber_last_error());
        fiber_queue_free(q);
        return 50 - rc;
    }
    if (fiber_ring_rank(r) != j.rank)
        return 91;
    int code = member_run(r, q, &j);
    fiber_ring_free(r);
    fiber_queue_free(q);
    return code;
}

/* ---- the master's side ------------------------------------------------ */

struct ring_run {
    fiber_ring *ring;
    fiber_queue *q;
    struct ring_job job;
    int n;
    fiber_process *procs[MAX_N + 1];
};

static void run_setup(struct ring_run *rr, int n, const struct ring_job *tmpl)
{
    memset(rr, 0, sizeof *rr);
    rr->n = n;
    rr->job = *tmpl;
    CHECK_OK(fiber_ring_create(&rr->ring, n));
    CHECK_OK(fiber_queue_create(&rr->q, 0));
    fiber_buf b = {0};
    CHECK_OK(fiber_ring_serialize(rr->ring, &b));
    CHECK(b.len <= sizeof rr->job.ring);
    memcpy(rr->job.ring, b.data, b.len);
    rr->job.ring_len = (uint32_t)b.len;
    b.len = 0;
    CHECK_OK(fiber_queue_serialize(rr->q, &b));
    memcpy(rr->job.queue, b.data, b.len);
    rr->job.queue_len = (uint32_t)b.len;
    fiber_buf_free(&b);
}

static fiber_process *start_rank(struct ring_run *rr, int rank, int mode)
{
    struct ring_job j = rr->job;
    j.rank = rank;
    j.mode = mode;
    fiber_process *p;
    CHECK_OK(fiber_process_start(&p, "ring_member", &j, sizeof j, NULL));
    return p;
}

static void start_all(struct ring_run *rr, int mode)
{
    for (int rank = 0; rank < rr->n; rank++)
        rr->procs[rank] = start_rank(rr, rank, mode);
}

static int finish(fiber_process *p)
{
    int code = -999;
    CHECK_OK(fiber_process_join(p, 90000));
    CHECK_OK(fiber_process_exitcode(p, &code));
    fiber_process_free(p);
    return code;
}

static void run_free(struct ring_run *rr)
{
    fiber_ring_free(rr->ring);
    fiber_queue_free(rr->q);
}

/* Checks one element against the serial reduction over the n ranks, in
 * rank order and in the same precision.  Ring and serial sums add in
 * different orders; each is within (n-1)u * sum|x| of the exact sum, so
 * they differ by at most (n-1) * epsilon * sum|x|. */
static void check_element(int dtype, int op, int n, size_t i, int call,
                          double got)
{
    double want = 0, absum = 0;
    float want32 = 0;
    for (int r = 0; r < n; r++) {
        double x = dtype == FIBER_FLOAT32 ? in_f32(r, i, call)
                                          : in_f64(r, i, call);
        absum += fabs(x);
        if (op == FIBER_MAX)
            want = r == 0 || x > want ? x : want;
        else if (dtype == FIBER_FLOAT32)
            want32 += (float)x;
        else
            want += x;
    }
    if (op != FIBER_MAX && dtype == FIBER_FLOAT32)
        want = want32;
    double eps = dtype == FIBER_FLOAT32 ? FLT_EPSILON : DBL_EPSILON;
    double tol = (n - 1) * eps * absum;
    if (op == FIBER_MEAN) {
        want /= n;
        tol = tol / n + eps * fabs(want);
    }
    if (op == FIBER_MAX ? got != want : fabs(got - want) > tol)
        TH_FAIL("n=%d call %d element %zu: got %.17g, want %.17g (tol %g)",
                n, call, i, got, want, tol);
}

static void check_result(const struct ring_job *j, int n, int call,
                         const void *data)
{
    size_t count = (size_t)j->sizes[call];
    for (size_t i = 0; i < count; i++)
        check_element(j->dtype, j->op, n, i, call,
                      j->dtype == FIBER_FLOAT32 ? ((const float *)data)[i]
                                                : ((const double *)data)[i]);
}

/* Takes every member's report of every call; checks that each call
 * succeeded everywhere with one hash, and hands rank 0's data (or, for a
 * broadcast, checks the hash against the root's bytes). */
static void collect(struct ring_run *rr, int bcast)
{
    uint64_t hash[MAX_SIZES][MAX_N];
    fiber_buf got = {0};
    int total = rr->n * rr->job.n_sizes;
    for (int k = 0; k < total; k++) {
        got.len = 0;
        CHECK_OK(fiber_queue_get(rr->q, &got, CALL_MS));
        struct report rep;
        CHECK(got.len >= sizeof rep);
        memcpy(&rep, got.data, sizeof rep);
        int rank = rep.rank;
        CHECK(rank >= 0 && rank < rr->n);
        CHECK(rep.index >= 0 && rep.index < MAX_SIZES);
        CHECK_OK(rep.rc);
        hash[rep.index][rank] = rep.hash;
        if (rep.rank == 0 && !bcast)
            check_result(&rr->job, rr->n, rep.index, got.data + sizeof rep);
    }
    for (int i = 0; i < rr->job.n_sizes; i++) {
        uint64_t want = hash[i][0];
        if (bcast) {
            size_t bytes = (size_t)rr->job.sizes[i];
            unsigned char *root = malloc(bytes ? bytes : 1);
            fill_bytes(root, bytes, rr->job.root, i);
            want = fnv(root, bytes);
            free(root);
        }
        for (int rank = 0; rank < rr->n; rank++)
            CHECK(hash[i][rank] == want);
    }
    fiber_buf_free(&got);
}

static void run_reduce(int n, int dtype, int op, const uint64_t *sizes,
                       int n_sizes)
{
    struct ring_job t = {.dtype = dtype, .op = op, .n_sizes = n_sizes,
                         .timeout_ms = CALL_MS};
    memcpy(t.sizes, sizes, (size_t)n_sizes * sizeof *sizes);
    struct ring_run rr;
    run_setup(&rr, n, &t);
    start_all(&rr, M_REDUCE);
    collect(&rr, 0);
    for (int rank = 0; rank < n; rank++)
        CHECK_EQ(finish(rr.procs[rank]), 0);
    run_free(&rr);
}

static const uint64_t std_sizes[4] = {1, 7, 1000, 1u << 20};

TEST(allreduce_sum_float)
{
    static const int ns[] = {2, 3, 5, 8};
    for (int i = 0; i < 4; i++)
        run_reduce(ns[i], FIBER_FLOAT32, FIBER_SUM, std_sizes, 4);
}

TEST(allreduce_sum_double)
{
    static const int ns[] = {2, 3, 5, 8};
    for (int i = 0; i < 4; i++)
        run_reduce(ns[i], FIBER_FLOAT64, FIBER_SUM, std_sizes, 4);
}

TEST(allreduce_mean_and_max)
{
    static const uint64_t sizes[4] = {1, 7, 1000, 300007};
    run_reduce(3, FIBER_FLOAT32, FIBER_MEAN, sizes, 4);
    run_reduce(2, FIBER_FLOAT64, FIBER_MEAN, sizes, 4);
    run_reduce(5, FIBER_FLOAT64, FIBER_MAX, sizes, 4);
    run_reduce(8, FIBER_FLOAT32, FIBER_MAX, sizes, 4);
}

static void run_bcast(int n, int root)
{
    /* Empty, tiny, odd, and more than three pieces not ending on one. */
    struct ring_job t = {.root = root, .n_sizes = 4, .timeout_ms = CALL_MS,
                         .sizes = {0, 1, 1001, (3u << 20) + 5}};
    struct ring_run rr;
    run_setup(&rr, n, &t);
    start_all(&rr, M_BCAST);
    collect(&rr, 1);
    for (int rank = 0; rank < n; rank++)
        CHECK_EQ(finish(rr.procs[rank]), 0);
    run_free(&rr);
}

TEST(broadcast_from_a_nonzero_root)
{
    run_bcast(5, 3);
    run_bcast(2, 1);
    run_bcast(8, 7);
}

/* ---- members in threads of this process ----------------------------- */

struct thread_member {
    const fiber_buf *ser;
    int rank, n, rc;
    size_t count;
    float *data;
};

static void *thread_member_main(void *arg)
{
    struct thread_member *t = arg;
    fiber_ring *r;
    t->rc = fiber_ring_join(&r, t->ser->data, t->ser->len, t->rank, JOIN_MS);
    if (t->rc)
        return NULL;
    fill(t->data, FIBER_FLOAT32, t->rank, t->count, 0);
    t->rc = fiber_ring_allreduce(r, t->data, t->count, FIBER_FLOAT32,
                                 FIBER_SUM, CALL_MS);
    unsigned char word[8] = {0};
    if (t->rc == 0 && t->rank == 1)
        memcpy(word, "fiber!!", 8);
    if (t->rc == 0)
        t->rc = fiber_ring_broadcast(r, word, sizeof word, 1, CALL_MS);
    if (t->rc == 0 && memcmp(word, "fiber!!", 8) != 0)
        t->rc = -1000;
    fiber_ring_free(r);
    return NULL;
}

TEST(members_in_threads_of_the_master)
{
    enum { N = 3 };
    size_t count = 100003;
    fiber_ring *ring;
    CHECK_OK(fiber_ring_create(&ring, N));
    CHECK_EQ(fiber_ring_size(ring), N);
    CHECK_ERR(fiber_ring_rank(ring), FIBER_ESTATE);
    fiber_buf ser = {0};
    CHECK_OK(fiber_ring_serialize(ring, &ser));
    struct thread_member t[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        t[i] = (struct thread_member){&ser, i, N, -1, count,
                                      malloc(count * sizeof(float))};
        CHECK(pthread_create(&th[i], NULL, thread_member_main, &t[i]) == 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++)
        CHECK_OK(t[i].rc);
    struct ring_job j = {.dtype = FIBER_FLOAT32, .op = FIBER_SUM,
                         .sizes = {count}};
    check_result(&j, N, 0, t[0].data);
    for (int i = 1; i < N; i++)
        CHECK(memcmp(t[i].data, t[0].data, count * sizeof(float)) == 0);
    for (int i = 0; i < N; i++)
        free(t[i].data);
    fiber_buf_free(&ser);
    fiber_ring_free(ring);
}

TEST(a_ring_of_one)
{
    fiber_ring *ring, *m;
    CHECK_OK(fiber_ring_create(&ring, 1));
    fiber_buf ser = {0};
    CHECK_OK(fiber_ring_serialize(ring, &ser));
    CHECK_OK(fiber_ring_join(&m, ser.data, ser.len, 0, 5000));
    CHECK_EQ(fiber_ring_rank(m), 0);
    double v[3] = {1.5, -2, 3};
    CHECK_OK(fiber_ring_allreduce(m, v, 3, FIBER_FLOAT64, FIBER_MEAN, 0));
    CHECK(v[0] == 1.5 && v[1] == -2 && v[2] == 3);
    CHECK_OK(fiber_ring_broadcast(m, v, sizeof v, 0, 0));
    /* It has formed: nobody else may join it. */
    fiber_ring *again = NULL;
    CHECK_ERR(fiber_ring_join(&again, ser.data, ser.len, 0, 5000),
              FIBER_ESTATE);
    CHECK(again == NULL);
    fiber_ring_free(m);
    fiber_buf_free(&ser);
    fiber_ring_free(ring);
}

TEST(bad_arguments_are_refused)
{
    fiber_ring *ring = NULL, *m = NULL;
    CHECK_ERR(fiber_ring_create(&ring, 0), FIBER_EINVAL);
    CHECK_ERR(fiber_ring_create(&ring, FIBER_RING_MAX_MEMBERS + 1),
              FIBER_EINVAL);
    CHECK_ERR(fiber_ring_create(NULL, 2), FIBER_EINVAL);
    CHECK_OK(fiber_ring_create(&ring, 2));
    fiber_buf ser = {0};
    CHECK_OK(fiber_ring_serialize(ring, &ser));
    CHECK_ERR(fiber_ring_join(&m, ser.data, ser.len, 2, 100), FIBER_EINVAL);
    CHECK_ERR(fiber_ring_join(&m, ser.data, ser.len, -1, 100), FIBER_EINVAL);
    CHECK_ERR(fiber_ring_join(&m, "garbage", 7, 0, 100), FIBER_EINVAL);
    CHECK(m == NULL);
    /* Alone at the rendezvous: the join times out and leaves nothing. */
    uint64_t t0 = fb_now_ms();
    CHECK_ERR(fiber_ring_join(&m, ser.data, ser.len, 0, 300),
              FIBER_ETIMEDOUT);
    CHECK(fb_now_ms() - t0 < 5000);
    CHECK_CONTAINS(fiber_last_error(), "in time");
    float x = 1;
    CHECK_ERR(fiber_ring_allreduce(ring, &x, 1, FIBER_FLOAT32, FIBER_SUM, 0),
              FIBER_ESTATE);
    CHECK_ERR(fiber_ring_allreduce(ring, &x, 1, 7, FIBER_SUM, 0),
              FIBER_EINVAL);
    CHECK_ERR(fiber_ring_allreduce(ring, &x, 1, FIBER_FLOAT32, 0, 0),
              FIBER_EINVAL);
    CHECK_ERR(fiber_ring_allreduce(ring, NULL, 1, FIBER_FLOAT32, FIBER_SUM,
                                   0), FIBER_EINVAL);
    CHECK_ERR(fiber_ring_broadcast(ring, &x, 4, 2, 0), FIBER_EINVAL);
    char junk[64] = {0};
    CHECK_ERR(fiber_ring_size((fiber_ring *)junk), FIBER_EINVAL);
    fiber_ring_free(NULL);
    fiber_buf_free(&ser);
    fiber_ring_free(ring);
}

/* ---- failures --------------------------------------------------------- */

/* Runs a ring of n where `victim` plays victim_mode and everyone else
 * survive_mode; returns when all have exited, checking that every
 * survivor exited with want and within max_ms. */
static void run_failure(int n, int victim, int victim_mode, int survive_mode,
                        const struct ring_job *tmpl, int want, int max_ms)
{
    struct ring_run rr;
    run_setup(&rr, n, tmpl);
    uint64_t t0 = fb_now_ms();
    for (int rank = 0; rank < n; rank++)
        rr.procs[rank] = start_rank(&rr, rank,
                                    rank == victim ? victim_mode
                                                   : survive_mode);
    for (int rank = 0; rank < n; rank++) {
        int code = finish(rr.procs[rank]);
        if (rank == victim && victim_mode != M_SURVIVE) {
            CHECK_EQ(code, -SIGKILL);
            continue;
        }
        /* A survivor may learn of the death while its own join is still
         * linking (50 + code) rather than in the collective: either way
         * it failed with the error instead of hanging. */
        if (code != want && code != 50 + want)
            TH_FAIL("rank %d exited with %d, want %d (or %d from join)",
                    rank, code, want, 50 + want);
    }
    uint64_t took = fb_now_ms() - t0;
    if (took > (uint64_t)max_ms)
        TH_FAIL("the members took %llu ms to fail, want under %d",
                (unsigned long long)took, max_ms);
    run_free(&rr);
}

TEST(member_killed_before_the_collective)
{
    struct ring_job t = {.timeout_ms = CALL_MS, .sizes = {1000}};
    run_failure(4, 2, M_DIE_EARLY, M_SURVIVE, &t, -FIBER_ECLOSED, 30000);
}

TEST(member_killed_during_the_collective)
{
    /* 16 MiB arrays: a call takes long enough that the kill lands in one. */
    struct ring_job t = {.timeout_ms = CALL_MS, .sizes = {4u << 20},
                         .param = 400};
    run_failure(4, 1, M_DIE_LATER, M_SURVIVE, &t, -FIBER_ECLOSED, 30000);
    run_failure(3, 0, M_DIE_LATER, M_SURVIVE, &t, -FIBER_ECLOSED, 30000);
}

TEST(member_missing_at_the_rendezvous)
{
    /* Rank 2 never starts: the others' joins time out, nobody hangs. */
    struct ring_job t = {.timeout_ms = 1500, .sizes = {10}};
    struct ring_run rr;
    run_setup(&rr, 3, &t);
    rr.procs[0] = start_rank(&rr, 0, M_ONCE);
    rr.procs[1] = start_rank(&rr, 1, M_ONCE);
    CHECK_EQ(finish(rr.procs[0]), 50 - FIBER_ETIMEDOUT);
    CHECK_EQ(finish(rr.procs[1]), 50 - FIBER_ETIMEDOUT);
    run_free(&rr);
}

/* Waits until `want` members wait at the rendezvous; fills addrs. */
static void await_joined(fiber_ring *ring, int want, char (*addrs)[600])
{
    int joined = -1, formed = 0;
    for (int i = 0; i < 2000 && joined != want; i++) {
        CHECK_OK(fb_ring_peek(ring, addrs, &joined, &formed));
        if (joined != want)
            sleep_ms(10);
    }
    CHECK_EQ(joined, want);
    CHECK_EQ(formed, 0);
}

TEST(member_leaving_the_rendezvous_frees_its_rank)
{
    struct ring_job t = {.dtype = FIBER_FLOAT32, .op = FIBER_SUM,
                         .n_sizes = 1, .timeout_ms = CALL_MS,
                         .sizes = {1000}};
    struct ring_run rr;
    run_setup(&rr, 2, &t);
    char addrs[2][600];
    fiber_process *quitter = start_rank(&rr, 0, M_REDUCE);
    await_joined(rr.ring, 1, addrs);
    long qpid = fiber_process_pid(quitter);
    CHECK(qpid > 0); /* kill(-1) would signal every process we may reach */
    kill((pid_t)qpid, SIGKILL);
    CHECK_EQ(finish(quitter), -SIGKILL);
    char gone[600];
    memcpy(gone, addrs[0], sizeof gone);
    await_joined(rr.ring, 0, addrs);
    /* The rendezvous removed the socket the killed member left behind. */
    if (strncmp(gone, "unix:", 5) == 0)
        CHECK(access(gone + 5, F_OK) != 0 && errno == ENOENT);
    start_all(&rr, M_REDUCE); /* rank 0 again, and rank 1 */
    collect(&rr, 0);
    for (int rank = 0; rank < 2; rank++)
        CHECK_EQ(finish(rr.procs[rank]), 0);
    run_free(&rr);
}

/* Joins rank `rank` at the rendezvous as the master, giving a socket that
 * the test listens on but never answers: a member that is lost once the
 * ring has formed, while the others link.  The socket's descriptor goes to
 * *fd.  (RDV_JOIN is ring_ops.h's operation number.) */
static fiber_future *join_as_ghost(fiber_ring *ring, int rank, int *fd,
                                   char *ghost, size_t size)
{
    enum { RDV_JOIN = FB_OP_KIND + 0 };
    fiber_buf ser = {0};
    CHECK_OK(fiber_ring_serialize(ring, &ser));
    char addr[600], want[700];
    uint8_t token[FB_WIRE_TOKEN_LEN];
    uint32_t obj, n;
    CHECK_OK(fb_handle_decode(ser.data, ser.len, FB_HANDLE_RING, addr,
                              sizeof addr, token, &obj, &n));
    snprintf(want, sizeof want, "%s.ghost", addr);
    CHECK_OK(fb_sock_listen(want, 4, fd, ghost, size));
    struct fb_oclient *c;
    CHECK_OK(fb_oclient_get(addr, token, &c));
    uint32_t r = (uint32_t)rank;
    fiber_iov items[2] = {{&r, 4}, {ghost, strlen(ghost)}};
    fiber_future *f;
    CHECK_OK(fb_ocall_async(c, obj, RDV_JOIN, -1, items, 2, &f));
    fb_oclient_release(c);
    fiber_buf_free(&ser);
    return f;
}

TEST(a_member_lost_while_linking_fails_the_others_without_a_timeout)
{
    /* Ranks 0 and 1 join with no timeout; rank 2 is the ghost.  Rank 1
     * dials it and waits for its answer; rank 0 waits for it to connect.
     * When the ghost goes, rank 1 fails, and rank 0 must hear of it
     * through its link to rank 1 instead of waiting forever. */
    struct ring_job t = {.timeout_ms = -1, .sizes = {10}};
    struct ring_run rr;
    char addrs[3][600], ghost[600];
    int fd;
    run_setup(&rr, 3, &t);
    rr.procs[0] = start_rank(&rr, 0, M_ONCE);
    rr.procs[1] = start_rank(&rr, 1, M_ONCE);
    await_joined(rr.ring, 2, addrs);
    fiber_future *f = join_as_ghost(rr.ring, 2, &fd, ghost, sizeof ghost);
    CHECK_OK(fiber_future_get(f, NULL, 5000));
    fiber_future_free(f);
    sleep_ms(300); /* both are linking now */
    close(fd);
    unlink(ghost + 5);
    CHECK_EQ(finish(rr.procs[1]), 50 - FIBER_ECLOSED);
    CHECK_EQ(finish(rr.procs[0]), 50 - FIBER_ECLOSED);
    run_free(&rr);
}

TEST(a_member_that_does_not_call_times_the_others_out)
{
    /* Rank 1 calls 3 s late; rank 0 gives up after 400 ms and breaks the
     * ring, so rank 1's late call fails at once instead of waiting.  The
     * joins wait as long as the processes take to start (under valgrind
     * rank 0's 400 ms once ran out in its join, before the call). */
    struct ring_job t = {.timeout_ms = 400, .sizes = {1000},
                         .join_ms = 60000};
    struct ring_run rr;
    run_setup(&rr, 2, &t);
    rr.job.timeout_ms = 400;
    rr.procs[0] = start_rank(&rr, 0, M_ONCE);
    rr.job.param = 3000;
    rr.job.timeout_ms = 20000;
    rr.procs[1] = start_rank(&rr, 1, M_ONCE);
    CHECK_EQ(finish(rr.procs[0]), -FIBER_ETIMEDOUT);
    CHECK_EQ(finish(rr.procs[1]), -FIBER_ECLOSED);
    run_free(&rr);
}

TEST(mismatched_calls_fail_instead_of_mixing_data)
{
    /* Each rank adds rank * root elements: the counts differ. */
    struct ring_job t = {.timeout_ms = CALL_MS, .sizes = {1000}, .root = 1};
    struct ring_run rr;
    run_setup(&rr, 3, &t);
    start_all(&rr, M_ONCE);
    for (int rank = 0; rank < 3; rank++) {
        int code = finish(rr.procs[rank]);
        CHECK(code == -FIBER_EPROTO || code == -FIBER_ECLOSED);
    }
    run_free(&rr);
}

/* ---- hostile peers ---------------------------------------------------- */

static int dial(const char *addr)
{
    int fd;
    CHECK_OK(fb_sock_dial(addr, fb_deadline_ms(5000), &fd));
    return fd;
}

/* A well-formed HELLO with the run's token that claims to be `name` of
 * some other ring. */
static void send_fake_hello(int fd, const char *name)
{
    fiber_buf b = {0};
    struct fb_msg_hello h = {.build_id = fb_rt_build_id(),
                             .build_id_len =
                                 (uint8_t)strlen(fb_rt_build_id()),
                             .job_id = 12345,
                             .name = name,
                             .name_len = (uint8_t)strlen(name)};
    memcpy(h.token, fb_rt_token(), sizeof h.token);
    CHECK_OK(fb_wire_put_hello(&b, &h));
    send(fd, b.data, b.len, MSG_NOSIGNAL);
    fiber_buf_free(&b);
}

/* Opens five hostile connections to addr, prev being the rank it waits
 * for: HTTP, a header promising 50 MiB, a HELLO from another ring, one
 * that closes at once, one that stays silent.  Returns the silent one. */
static int attack(const char *addr, int prev)
{
    int fd = dial(addr);
    const char http[] = "GET / HTTP/1.1\r\nHost: fiber\r\n\r\n";
    send(fd, http, sizeof http - 1, MSG_NOSIGNAL);
    close(fd);
    fd = dial(addr);
    struct fb_wire_hdr h = {.type = FB_MSG_HELLO, .len = 50u << 20};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    send(fd, hdr, sizeof hdr, MSG_NOSIGNAL);
    close(fd);
    fd = dial(addr);
    char name[32];
    snprintf(name, sizeof name, "ring-%d", prev);
    send_fake_hello(fd, name);
    close(fd);
    close(dial(addr));
    return dial(addr);
}

TEST(hostile_bytes_on_a_member_socket_do_not_break_the_ring)
{
    struct ring_job t = {.dtype = FIBER_FLOAT32, .op = FIBER_SUM,
                         .n_sizes = 2, .timeout_ms = CALL_MS,
                         .sizes = {1000, 1u << 20}};
    struct ring_run rr;
    run_setup(&rr, 3, &t);
    char addrs[3][600];
    rr.procs[0] = start_rank(&rr, 0, M_REDUCE);
    rr.procs[1] = start_rank(&rr, 1, M_REDUCE);
    await_joined(rr.ring, 2, addrs);
    int silent0 = attack(addrs[0], 2);
    int silent1 = attack(addrs[1], 0);
    rr.procs[2] = start_rank(&rr, 2, M_REDUCE);
    collect(&rr, 0);
    for (int rank = 0; rank < 3; rank++)
        CHECK_EQ(finish(rr.procs[rank]), 0);
    /* Once linked, a member listens no more. */
    int fd;
    CHECK_ERR(fb_sock_dial(addrs[0], fb_deadline_ms(1000), &fd),
              FIBER_EUNREACHABLE);
    close(silent0);
    close(silent1);
    run_free(&rr);
}

TH_MAIN()
